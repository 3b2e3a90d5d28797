"""Bit patterns: encode rounded values into a format's codes and decode codes back to values.

Where it sits (the foundation is a line; each module imports only those before it)::

    _names, _checks, _fpenv  ->  formats  ->  _interop  ->  _carrier  ->  _exact  ->  rounding  ->  bits  ->  _grid

It rounds through `rounding`'s public functions and reads input by the shared rule of `_carrier`.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from . import rounding as _rounding
from ._carrier import BLOCK, as_float_array, exact_value, refuse_masked
from ._fpenv import ieee_mode
from ._interop import ML_NAMES as _ML_NAMES  # noqa: F401 - the formats that have a storage dtype (tests read it here)
from ._interop import host_array, ml_dtype, returns_input_kind
from .formats import Format, FormatLike, NaNEncoding, as_format
from .rounding import Overflow, RoundingLike, parse_options, round

__all__ = ["to_bits", "from_bits", "bits_str", "to_ml_dtypes", "ml_dtype", "code_dtype"]


def code_dtype(fmt: FormatLike) -> type:
    """The smallest unsigned integer dtype that holds the format's codes."""
    w = as_format(fmt).width
    return np.uint8 if w <= 8 else np.uint16 if w <= 16 else np.uint32 if w <= 32 else np.uint64


try:  # compiled encoder (fpsim/_carith.c); _encode below stays the reference and fallback
    from . import _carith  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - no compiler at install time
    _carith = None

use_c_bits = _carith is not None
"""Whether :func:`to_bits` encodes through the compiled loop of fpsim/_carith.c (set False to force the
NumPy reference `_encode`); the codes are the same."""


def _c_encodable(f: Format) -> bool:
    """Formats the compiled encoder handles: a zero, at most 32 bits, every value a normal float64."""
    return bool(f.has_zero and f.width <= 32 and f.emin - f.mbits >= -1022
                and f.width == int(f.signed) + f.ebits + f.mbits)


_TABLES: dict[Format, np.ndarray] = {}
_CPUS = min(os.cpu_count() or 1, 8)


def _threads() -> int:
    """Threads for the compiled encoder: ``fpsim.rounding.max_threads`` (None: one per CPU, at most 8)."""
    return int(_rounding.max_threads) if _rounding.max_threads is not None else _CPUS


def _code_table(f: Format) -> np.ndarray:
    """For a format of at most 8 bits that fits float32: the code of every float32 pattern's top
    ``9 + mbits`` bits (sign, exponent, top mantissa bits), made by the reference encoder; 0xFFFF where
    that pattern is not a value of the format (the canonical NaN is, where the format has a NaN)."""
    t = _TABLES.get(f)
    if t is None:
        sh = 23 - f.mbits
        v = (np.arange(1 << (32 - sh), dtype=np.uint32) << np.uint32(sh)).view(np.float32)
        with np.errstate(all="ignore"):
            r = np.asarray(round(v, f), dtype=np.float32)
        nan = np.isnan(v)
        ok = (r.view(np.uint32) == v.view(np.uint32)) & ~nan
        if f.nan_code is not None:
            ok |= v.view(np.uint32) == np.uint32(0x7FC00000)  # the carrier's canonical NaN
        t = np.full(v.size, 0xFFFF, dtype=np.uint32)
        t[ok] = _encode(v[ok].astype(np.float64), f)
        _TABLES[f] = t
    return t


def _encode_c(r: np.ndarray, f: Format, out: np.ndarray) -> bool:
    """Encode the rounded block ``r`` (float32/float64) into ``out`` in compiled code; False where some value
    needs the reference (NaN without a NaN code, a value not in the format, ...), which then raises."""
    assert _carith is not None
    if r.dtype not in (np.float32, np.float64) or not out.flags.c_contiguous:
        return False
    if r.dtype == np.float32 and f.width <= 8 and f.fits_float32 and f.mbits <= 7:  # a gather beats arithmetic
        src32 = np.ascontiguousarray(r).reshape(-1)
        return not _carith.encode_table(src32, out, _code_table(f), 23 - f.mbits, _threads())
    if not _c_encodable(f):
        return False
    src = np.ascontiguousarray(r).reshape(-1)
    nan_code = f.nan_code if f.nan_code is not None else 0
    bad = _carith.encode(src, out, int(src.dtype == np.float32), f.mbits, f.bias, f.emin, int(f.has_inf),
                         int(f.nan_code is not None), int(nan_code), int(f.signed), int(f.signed_zero), f.width,
                         float(f.min_normal), float(f.max), _threads())
    return not bad


def _encode(v: np.ndarray, f: Format) -> np.ndarray:
    """Codes of values ``v`` (float64, already representable in ``f``)."""
    ct = code_dtype(f)
    v = np.asarray(v, dtype=np.float64)
    if f.table is not None:
        return _encode_table(v, f).astype(ct)
    nan = np.isnan(v)
    if np.any(nan) and f.nan_code is None:
        raise ValueError(f"{f.name} has no NaN encoding; input holds NaN")
    neg = np.signbit(v) & ~nan
    a = np.abs(v)
    inf = np.isinf(a)
    if np.any(inf) and not f.has_inf:
        raise ValueError(f"{f.name} has no infinity; input holds ±inf")
    fin = ~(nan | inf)
    code = np.zeros(v.shape, dtype=np.uint64)
    m, e = np.frexp(a)  # a = m * 2**e, m in [0.5, 1)
    e = e.astype(np.int64) - 1  # a = (2m) * 2**e
    normal = fin & (a >= f.min_normal)
    ef = np.where(normal, e + f.bias - (0 if f.has_zero else 0), 0)
    with np.errstate(over="ignore"):  # both branches are evaluated; only the selected one is used
        frac = np.where(normal, np.ldexp(2 * m - 1, f.mbits), np.ldexp(a, f.mbits - f.emin))
    frac = np.where(fin, frac, 0)
    if np.any(fin & (frac != np.floor(frac))):
        bad = v[fin & (frac != np.floor(frac))].ravel()[0]
        raise ValueError(f"value {bad!r} is not representable in {f.name}; round it first")
    if not f.has_zero:
        ef = np.where(normal, e + f.bias, 0)
    code[fin] = (ef[fin].astype(np.uint64) << np.uint64(f.mbits)) | frac[fin].astype(np.uint64)
    top = np.uint64((1 << f.ebits) - 1)
    code[inf] = top << np.uint64(f.mbits)
    if f.signed:
        sbit = np.uint64(1) << np.uint64(f.width - 1)
        keep_sign = neg & (f.signed_zero | (a != 0))
        code = np.where(keep_sign, code | sbit, code)
    elif np.any(neg & (a != 0)):
        raise ValueError(f"{f.name} is unsigned; input holds a negative value")
    if f.nan_code is not None:
        code[nan] = f.nan_code
    return code.astype(ct)


def _encode_table(v: np.ndarray, f: Format) -> np.ndarray:
    """Codes of the values ``v`` of a table format: each magnitude looked up among the sorted values."""
    assert f.table is not None
    t = np.array(f.table, dtype=np.float64)
    order = np.argsort(t, kind="stable")  # inf sorts last
    ts, cs = t[order], order.astype(np.uint64)
    nan = np.isnan(v)
    if np.any(nan) and f.nan_code is None:
        raise ValueError(f"{f.name} has no NaN encoding; input holds NaN")
    a = np.where(nan, 0.0, np.abs(v))
    i = np.minimum(np.searchsorted(ts, a), ts.size - 1)
    bad = ts[i] != a
    if np.any(bad):
        raise ValueError(f"value {v[bad].ravel()[0]!r} is not representable in {f.name}; round it first")
    code = cs[i]
    code = np.where(np.signbit(v) & (a != 0) & ~nan, code | np.uint64(1 << (f.width - 1)), code)
    if f.nan_code is not None:
        code = np.where(nan, np.uint64(f.nan_code), code)
    return np.asarray(code, dtype=np.uint64)


@ieee_mode
@returns_input_kind(dtype_option=False)
def to_bits(x: Any, fmt: FormatLike, rounding: RoundingLike = "rne", *, overflow: Overflow | str = "ieee",
            subnormals: bool = True, rng: np.random.Generator | None = None, sr_bits: int | None = None) -> Any:
    """Round ``x`` into ``fmt`` and return the bit patterns (uint8/uint16/uint32/uint64).

    NaN results get the format's canonical NaN code (sign clear); a format without NaN raises
    ``ValueError`` for NaN input. Rounds and encodes block by block (extra memory a few MiB); where
    fpsim/_carith.c and the compiled kernel are built, each block of a few thousand elements is encoded as soon
    as it is rounded, while it is in cache (one pass over the input, threads as ``fpsim.rounding.max_threads``;
    ``fpsim.bits.use_c_bits = False`` forces the NumPy reference; same codes).

    >>> import fpsim
    >>> hex(fpsim.to_bits(1.0, "bf16")), hex(fpsim.to_bits(-2.0, "fp8_e4m3"))
    ('0x3f80', '0xc0')
    """
    f, mode, ov = parse_options(fmt, rounding, overflow, subnormals, rng, sr_bits)
    if np.isscalar(x) and not isinstance(x, (str, bytes, float, np.floating)) and exact_value(x) is not None:
        # an int, Fraction or Decimal scalar: round() takes it exactly
        r = round(x, f, mode, overflow=ov, subnormals=subnormals, rng=rng, sr_bits=sr_bits)
        return _encode(np.asarray(r, dtype=np.float64), f)[()]
    a, _ = as_float_array(x)
    flat = a.reshape(-1)
    out: np.ndarray = np.empty(flat.size, dtype=code_dtype(f))
    srb = None if sr_bits is None else int(sr_bits)
    if use_c_bits and _carith is not None and hasattr(_carith, "encode_sink") and flat.size \
            and _to_bits_fused(flat, f, mode, ov, bool(subnormals), rng, srb, out):
        codes = out.reshape(a.shape)
        return codes[()] if codes.ndim == 0 else codes
    # Block by block: the float64 temporaries of the encoding stay a few MiB (not ~20x the input);
    # SR draws the same random words as one round() call of the whole array.
    fast = (use_c_bits and _carith is not None and f.table is None
            and (_c_encodable(f) or (f.width <= 8 and f.fits_float32)))
    # compiled: larger blocks (one rounded block of at most 2 MiB is the only temporary), fewer calls
    step = BLOCK * 4 if fast else BLOCK
    for i in range(0, flat.size, step):
        r = round(flat[i : i + step], f, mode, overflow=ov, subnormals=bool(subnormals), rng=rng, sr_bits=srb)
        if not (fast and _encode_c(r, f, out[i : i + step])):
            out[i : i + step] = _encode(r, f)  # the reference (it raises for values it cannot encode)
    codes = out.reshape(a.shape)
    return codes[()] if codes.ndim == 0 else codes


def _to_bits_fused(flat: np.ndarray, f: Format, mode: _rounding.Rounding, ov: Overflow, subnormals: bool,
                   rng: np.random.Generator | None, srb: int | None, out: np.ndarray) -> bool:
    """`to_bits` in one compiled pass: the kernel rounds block by block and hands each block to the encoder of
    fpsim/_carith.c (a sink) while it is in cache, which writes the codes into ``out``; no rounded array is
    stored. False (and the generator as it was) where this path does not serve the format, or where some value
    needs the NumPy encoder (NaN without a NaN code, ...): the caller then takes the block-by-block path."""
    assert _carith is not None
    c = _rounding.sink_carrier(flat.dtype, f, mode, srb)
    if c is None:
        return False
    if c.W == 32 and f.width <= 8 and f.fits_float32 and f.mbits <= 7:  # a gather beats arithmetic
        def make(o: np.ndarray) -> Any:
            return _carith.encode_table_sink(o, _code_table(f), 23 - f.mbits)
    elif _c_encodable(f):
        nan_code = f.nan_code if f.nan_code is not None else 0

        def make(o: np.ndarray) -> Any:
            return _carith.encode_sink(o, int(c.W == 32), f.mbits, f.bias, f.emin, int(f.has_inf),
                                       int(f.nan_code is not None), int(nan_code), int(f.signed),
                                       int(f.signed_zero), f.width, float(f.min_normal), float(f.max))
    else:
        return False
    state = rng.bit_generator.state if mode is _rounding.Rounding.SR and rng is not None else None
    # an input in the carrier's dtype in one call (threads as max_threads); another a converted block at a time
    step = flat.size if flat.dtype == c.ftype and flat.flags.c_contiguous else BLOCK * 4
    for i in range(0, flat.size, step):
        blk = np.ascontiguousarray(flat[i : i + step], dtype=c.ftype)
        sink = make(out[i : i + step])
        _rounding.round_sink(blk, f, mode, ov, subnormals, rng, srb, sink)
        if _carith.sink_result(sink):
            if state is not None:
                assert rng is not None
                rng.bit_generator.state = state  # the reference path draws the same words again
            return False
    return True


@ieee_mode
@returns_input_kind
def from_bits(codes: Any, fmt: FormatLike, *, as_dtype: bool = False) -> Any:
    """Decode bit patterns of ``fmt`` into float64 values (exact).

    >>> import fpsim
    >>> float(fpsim.from_bits(0x7E, "fp8_e4m3")), float(fpsim.from_bits(0x7F, "fp8_e4m3"))
    (448.0, nan)
    """
    f = as_format(fmt)
    refuse_masked(codes, "codes")
    c = np.asarray(host_array(codes, "codes"))  # the one converter: torch/JAX codes, device arrays refused
    if c.dtype.kind == "O":  # Python ints too large for int64: name the first that does not fit
        for v in c.reshape(-1):
            if not isinstance(v, (int, np.integer)) or isinstance(v, (bool, np.bool_)):
                raise TypeError(f"codes must be integers, got {type(v).__name__}: {v!r}")
            if not 0 <= int(v) < 1 << f.width:
                raise ValueError(f"code {int(v)} does not fit in {f.name}'s {f.width} bits")
        c = c.astype(np.uint64)
    if c.dtype.kind not in "iu":
        raise TypeError(f"codes must be integers, got dtype {c.dtype}")
    if c.ndim == 0:
        return _decode_block(c.reshape(1), f)[0]
    # Block by block: the decoding's temporaries stay a few MiB (not ~7x the float64 result).
    flat = c.reshape(-1)
    out = np.empty(flat.size, dtype=np.float64)
    for i in range(0, flat.size, BLOCK):
        out[i : i + BLOCK] = _decode_block(flat[i : i + BLOCK], f)
    return out.reshape(c.shape)


def _decode_block(c: np.ndarray, f: Format) -> np.ndarray:
    """Values of the 1-d integer codes ``c`` (checked to fit the format's width)."""
    top = np.uint64((1 << f.width) - 1)  # as a Python int first: 1 << 64 does not fit in uint64
    if c.size and (np.any(c < 0) or np.any(c.astype(np.uint64) > top)):
        bad = c[(c < 0) | (c.astype(np.uint64) > top)].ravel()[0]
        raise ValueError(f"code {int(bad)} does not fit in {f.name}'s {f.width} bits")
    c = c.astype(np.uint64)
    if f.table is not None:  # a table format: the magnitude of the code without its sign bit
        sbit = np.uint64(1 << (f.width - 1))
        mag = np.array(f.table, dtype=np.float64)[(c & (sbit - np.uint64(1))).astype(np.intp)]
        v = np.where((c & sbit) != 0, -mag, mag)
        if f.nan_code is not None:
            v = np.where(c == np.uint64(f.nan_code), np.nan, v)
        return np.asarray(v, dtype=np.float64)
    mb = np.uint64(f.mbits)
    mant = (c & ((np.uint64(1) << mb) - np.uint64(1))).astype(np.float64)
    ef = ((c >> mb) & np.uint64((1 << f.ebits) - 1)).astype(np.int64)
    neg = ((c >> np.uint64(f.width - 1)) & np.uint64(1)).astype(bool) if f.signed else np.zeros(c.shape, bool)
    with np.errstate(over="ignore"):  # the all-ones exponent of inf/NaN codes, replaced below
        mag = _decode_magnitude(ef, mant, f)
    top_ef = (1 << f.ebits) - 1
    return np.asarray(_finish_decode(c, ef, mant, neg, mag, top_ef, f), dtype=np.float64)


def _decode_magnitude(ef: np.ndarray, mant: np.ndarray, f: Format) -> np.ndarray:
    if f.has_zero:
        sub = ef == 0
        mag = np.where(
            sub,
            np.ldexp(mant, f.emin - f.mbits) if f.subnormals else 0.0,
            np.ldexp(1.0 + np.ldexp(mant, -f.mbits), (ef - f.bias).astype(np.int32)),
        )
    else:
        mag = np.ldexp(1.0 + np.ldexp(mant, -f.mbits), (ef - f.bias).astype(np.int32))
    return np.asarray(mag)


def _finish_decode(c: np.ndarray, ef: np.ndarray, mant: np.ndarray, neg: np.ndarray, mag: np.ndarray, top: int,
                   f: Format) -> Any:
    if f.has_inf:
        mag = np.where((ef == top) & (mant == 0), np.inf, mag)
    if f.nan is NaNEncoding.IEEE:
        mag = np.where((ef == top) & (mant != 0), np.nan, mag)
    elif f.nan is NaNEncoding.ALL_ONES:
        mag = np.where((ef == top) & (mant == (1 << f.mbits) - 1), np.nan, mag)
    v = np.where(neg, -mag, mag)
    if f.nan is NaNEncoding.NEG_ZERO:
        v = np.where(c == np.uint64(f.nan_code), np.nan, v)  # type: ignore[arg-type]  # set for NEG_ZERO
    v = np.asarray(v, dtype=np.float64)
    return v[()] if v.ndim == 0 else v


@ieee_mode
def bits_str(x: Any, fmt: FormatLike, rounding: RoundingLike = "rne", *, sep: str = " ") -> Any:
    """The sign, exponent and mantissa fields of ``x`` rounded into ``fmt``, as strings (for a table format such
    as HiF8, whose fields vary code by code: the sign and the rest).

    >>> import fpsim
    >>> fpsim.bits_str(1.0, "bf16")
    '0 01111111 0000000'
    """
    if not isinstance(sep, str):
        raise TypeError(f"sep must be a string, got {type(sep).__name__}: {sep!r}")
    f = as_format(fmt)
    codes = np.asarray(to_bits(x, f, rounding))

    def one(c: int) -> str:
        s = format(int(c), f"0{f.width}b")
        parts = []
        i = 0
        if f.signed:
            parts.append(s[0])
            i = 1
        if f.table is not None:  # a table format has no fixed fields (HiF8's widths vary): sign, then the rest
            parts.append(s[i:])
            return sep.join(parts)
        parts.append(s[i : i + f.ebits])
        if f.mbits:
            parts.append(s[i + f.ebits :])
        return sep.join(parts)

    if codes.ndim == 0:
        return one(int(codes))
    return np.array([one(int(c)) for c in codes.ravel()], dtype=object).reshape(codes.shape)


@ieee_mode
def to_ml_dtypes(x: Any, fmt: FormatLike, rounding: RoundingLike = "rne", *, overflow: Overflow | str = "ieee",
                 subnormals: bool = True, rng: np.random.Generator | None = None, sr_bits: int | None = None) -> np.ndarray:
    """Round ``x`` with fpsim (once, from the exact value) and store it in the ml_dtypes/NumPy dtype of ``fmt``.

    >>> import fpsim
    >>> y = fpsim.to_ml_dtypes([1.0, 3.14159], "bf16")
    >>> y.dtype.name, y.astype(float).tolist()
    ('bfloat16', [1.0, 3.140625])
    """
    f = as_format(fmt)
    dt = ml_dtype(f)
    codes = np.asarray(to_bits(x, f, rounding, overflow=overflow, subnormals=subnormals, rng=rng, sr_bits=sr_bits))
    storage = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[dt.itemsize]
    return codes.astype(storage).view(dt)


