"""One rounding kernel for every format and mode, working on the bits of the float carrier.

The kernel rounds float32 or float64 values once, from their exact value, onto the grid of a target
`Format`. It never goes through an intermediate format, so it cannot double-round.

How: for a nonnegative float, the bit pattern read as an unsigned integer grows linearly with the value
inside a binade and carries correctly into the next one. Rounding onto a grid ``2**d`` carrier-ulps wide
is therefore integer arithmetic on the pattern: add an increment chosen by the mode, then clear the low
``d`` bits. ``d`` is constant for normal results and grows by one per binade in the target's subnormal
range; values below half the smallest subnormal go to 0 or the smallest subnormal by a comparison.
Overflow, infinities and NaN are fixed up afterwards on the (usually empty) subset that needs it.
Large arrays are processed in cache-sized chunks.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, TypeVar, Union

import numpy as np

from ._names import parse_name
from .formats import Format, FormatLike, as_format

__all__ = [
    "Overflow",
    "Rounding",
    "RoundingLike",
    "RoundingReport",
    "analyze",
    "as_overflow",
    "as_rounding",
    "parse_options",
    "round",
]

_CHUNK = 1 << 15  # elements per chunk: a few 256 KiB temporaries stay in L2


class Rounding(str, enum.Enum):
    """Rounding modes.

    ``RNE`` nearest, ties to even (IEEE default); ``RNA`` nearest, ties away from zero; ``RTZ`` toward
    zero (truncation); ``RUP`` toward +inf; ``RDN`` toward −inf; ``RTO`` to odd (truncate, then set the
    last bit when inexact — lets a later rounding to fewer bits be correct); ``SR`` stochastic (round up in
    magnitude with probability equal to the distance to the lower neighbour over the gap).

    For a precision of one bit (e8m0, or any format without mantissa bits) every significand is odd, so
    ties go away from zero under ``RNE`` (as MPFR and ml_dtypes do) and ``RTO`` equals ``RTZ``.
    """

    RNE = "rne"
    RNA = "rna"
    RTZ = "rtz"
    RUP = "rup"
    RDN = "rdn"
    RTO = "rto"
    SR = "sr"


class Overflow(str, enum.Enum):
    """Overflow policy. ``IEEE``: IEEE 754 §7.4 (per mode: infinity, or ±max for the modes that round
    toward it; NaN for a format without infinity; ±max for a format with neither). ``SATURATE``: clamp to ±max."""

    IEEE = "ieee"
    SATURATE = "saturate"


RoundingLike = Union[Rounding, str]


_E = TypeVar("_E", Rounding, Overflow)


def _parse_enum(cls: type[_E], value: object, what: str) -> _E:
    if isinstance(value, cls):
        return value
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a {cls.__name__} or a string, got {type(value).__name__}: {value!r}")
    return cls(parse_name(value, [m.value for m in cls], what))


def as_rounding(mode: RoundingLike) -> Rounding:
    """Parse a rounding mode name (case-insensitive) or `Rounding` member."""
    return _parse_enum(Rounding, mode, "rounding mode")


def as_overflow(policy: Overflow | str) -> Overflow:
    """Parse an overflow policy name or `Overflow` member."""
    return _parse_enum(Overflow, policy, "overflow policy")


def parse_options(fmt: FormatLike, rounding: RoundingLike, overflow: Overflow | str, subnormals: bool,
                  rng: np.random.Generator | None, sr_bits: int | None = None) -> tuple[Format, Rounding, Overflow]:
    """Validate the options every rounding entry point takes (once, at the API edge)."""
    f = as_format(fmt)
    mode = as_rounding(rounding)
    ov = as_overflow(overflow)
    if not isinstance(subnormals, (bool, np.bool_)):
        raise TypeError(f"subnormals must be a bool, got {subnormals!r}")
    if mode is Rounding.SR:
        if rng is None:
            raise ValueError("rounding='sr' needs rng=numpy.random.default_rng(seed)")
        if not isinstance(rng, np.random.Generator):
            raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
        if sr_bits is not None and (not isinstance(sr_bits, (int, np.integer)) or not 1 <= sr_bits <= 52):
            raise ValueError(f"sr_bits must be an int in 1..52 or None, got {sr_bits!r}")
    elif sr_bits is not None:
        raise ValueError(f"sr_bits applies only to rounding='sr', got rounding={mode.value!r}")
    return f, mode, ov


# --------------------------------------------------------------------------------------------------
# Carriers


@dataclass(frozen=True)
class _Carrier:
    ftype: type[np.floating[Any]]
    utype: type[np.unsignedinteger[Any]]
    M: int  # stored mantissa bits
    B: int  # exponent bias
    W: int  # width

    def bits_of(self, v: float) -> int:
        return int(np.array(v, dtype=self.ftype).view(self.utype))


_F32 = _Carrier(np.float32, np.uint32, 23, 127, 32)
_F64 = _Carrier(np.float64, np.uint64, 52, 1023, 64)


@dataclass(frozen=True)
class _Plan:
    """Constants of one (carrier, format, options) combination, computed once per call."""

    c: _Carrier
    fmt: Format
    mode: Rounding
    overflow: Overflow
    subnormals: bool
    sr_bits: int | None
    d0: int  # bits dropped for normal results (<= 0: exact there)
    tiny_bits: int  # magnitudes below this (target min normal) may need a larger d
    need_tiny: bool
    max_bits: int
    minsub_bits: int
    inf_bits: int
    nan_bits: int


def _plan(c: _Carrier, fmt: Format, mode: Rounding, overflow: Overflow, subnormals: bool, sr_bits: int | None) -> _Plan:
    d0 = c.M - fmt.p + 1
    # The grid is linear in the bits only down to the carrier's min normal; below the target's min
    # normal the grid is fixed, so those elements take the variable-d path.
    need_tiny = fmt.emin > 1 - c.B
    return _Plan(
        c=c,
        fmt=fmt,
        mode=mode,
        overflow=overflow,
        subnormals=subnormals and fmt.subnormals,
        sr_bits=sr_bits,
        d0=d0,
        tiny_bits=c.bits_of(fmt.min_normal),
        need_tiny=need_tiny,
        max_bits=c.bits_of(fmt.max),
        minsub_bits=c.bits_of(np.ldexp(1.0, fmt.emin - fmt.mbits)),
        inf_bits=c.bits_of(np.inf),
        nan_bits=c.bits_of(np.nan) & ~(1 << (c.W - 1)),
    )


def _kept_lsb(u: np.ndarray, d: Any, c: _Carrier) -> Any:
    """Lowest kept bit of the significand (hidden bit included) after dropping ``d`` bits.

    For ``d == M`` that is the hidden bit (1 for normal carrier values, 0 for subnormal ones), not the
    exponent field's low bit. This makes one-bit precisions (e8m0) round ties away, as MPFR does.
    """
    one = c.utype(1)
    if isinstance(d, (int, np.integer)):
        return (u >> d) & one if d < c.M else np.minimum(u >> d, one)
    return np.where(d == c.M, np.minimum(u >> d, one), (u >> d) & one)


def _round_mag(u: np.ndarray, neg: np.ndarray, d: Any, pl: _Plan, rand: np.ndarray | None) -> Any:
    """Round magnitudes ``u`` (carrier bits, sign cleared) by clearing ``d`` low bits, 1 <= d <= M.

    ``d`` is a scalar or an array like ``u``; ``neg`` flags negative inputs (directed modes).
    """
    ut = pl.c.utype
    one = ut(1)
    if isinstance(d, (int, np.integer)):
        d = ut(d)
    else:
        d = d.astype(ut, copy=False)
    mask = (one << d) - one
    keep = ~mask
    mode = pl.mode
    if mode is Rounding.RTZ:
        return u & keep
    if mode is Rounding.RNE:
        half_m1 = (one << (d - one)) - one
        return (u + half_m1 + _kept_lsb(u, d, pl.c)) & keep
    if mode is Rounding.RNA:
        return (u + (one << (d - one))) & keep
    if mode is Rounding.RUP:
        return (u + np.where(neg, ut(0), mask)) & keep
    if mode is Rounding.RDN:
        return (u + np.where(neg, mask, ut(0))) & keep
    if mode is Rounding.RTO:
        inexact = ((u & mask) != 0).astype(ut)
        return (u & keep) | ((inexact & (_kept_lsb(u, d, pl.c) ^ one)) << d)
    # SR: add d uniform random bits (or only the top sr_bits of the remainder plus sr_bits random bits).
    assert rand is not None
    W = ut(pl.c.W)
    if pl.sr_bits is None:
        return (u + (rand >> (W - d))) & keep
    k = np.maximum(d.astype(np.int64) - pl.sr_bits, 0).astype(ut)
    ut_trunc = (u >> k) << k
    return (ut_trunc + ((rand >> (W - d + k)) << k)) & keep


def _round_tiny(u: np.ndarray, neg: np.ndarray, pl: _Plan, rand: np.ndarray | None) -> Any:
    """Round magnitudes below the target's min normal (the fixed subnormal grid)."""
    c = pl.c
    ut = c.utype
    ef = (u >> ut(c.M)).astype(np.int64)
    eff = np.maximum(ef, 1)
    # target quantum for subnormal results is 2**(emin - mbits); carrier quantum is 2**(eff-B-M)
    d = (pl.fmt.emin - pl.fmt.mbits) - (eff - c.B - c.M)
    out = u.copy()
    mid = (d >= 1) & (d <= c.M)
    if np.any(mid):
        r = rand[mid] if rand is not None else None
        out[mid] = _round_mag(u[mid], neg[mid], d[mid], pl, r)
    deep = d > c.M
    if np.any(deep):
        # |x| < q (the smallest subnormal): the result is 0 or q.
        x = u[deep].view(c.ftype).astype(np.float64)
        q = float(np.ldexp(1.0, pl.fmt.emin - pl.fmt.mbits))
        nz = x > 0
        mode = pl.mode
        if mode is Rounding.RNE:
            up = x > q / 2
        elif mode is Rounding.RNA:
            up = x >= q / 2
        elif mode is Rounding.RTZ:
            up = np.zeros_like(nz)
        elif mode is Rounding.RUP:
            up = nz & ~neg[deep]
        elif mode is Rounding.RDN:
            up = nz & neg[deep]
        elif mode is Rounding.RTO:
            up = nz
        else:
            assert rand is not None
            r = rand[deep]
            bits = pl.sr_bits if pl.sr_bits is not None else min(c.W, 53)
            frac = np.floor(np.ldexp(x / q, bits))  # exact: x/q is a power-of-two scaling
            rr = (r >> ut(c.W - bits)).astype(np.float64)
            up = nz & (frac + rr >= 2.0**bits)
        out[deep] = np.where(up, ut(pl.minsub_bits), ut(0))
    return out


def _special(u_in: np.ndarray, u_r: np.ndarray, neg: np.ndarray, pl: _Plan) -> Any:
    """Results for NaN and infinite inputs and for rounded magnitudes beyond the format's max."""
    fmt = pl.fmt
    ut = pl.c.utype
    if pl.overflow is Overflow.SATURATE:
        to_inf = np.zeros(u_in.shape, dtype=bool)
    else:
        mode = pl.mode
        if mode in (Rounding.RNE, Rounding.RNA, Rounding.SR):
            to_inf = np.ones(u_in.shape, dtype=bool)
        elif mode in (Rounding.RTZ, Rounding.RTO):
            to_inf = np.zeros(u_in.shape, dtype=bool)
        elif mode is Rounding.RUP:
            to_inf = ~neg
        else:
            to_inf = neg.copy()
        to_inf |= u_in == ut(pl.inf_bits)  # an infinite input is exact: it stays "infinite"
    if fmt.has_inf:
        inf_res = ut(pl.inf_bits)
    elif fmt.has_nan:
        inf_res = ut(pl.nan_bits)
    else:
        inf_res = ut(pl.max_bits)
    out = np.where(to_inf, inf_res, ut(pl.max_bits))
    return np.where(u_in > ut(pl.inf_bits), ut(pl.nan_bits), out).astype(ut)


def _kernel(bits: np.ndarray, pl: _Plan, rng: np.random.Generator | None) -> Any:
    """Round one chunk of carrier bit patterns; returns new bit patterns."""
    c = pl.c
    ut = c.utype
    sign_bit = ut(1 << (c.W - 1))
    sign = bits & sign_bit
    u = bits ^ sign
    neg = sign != 0
    rand = None
    if pl.mode is Rounding.SR:
        assert rng is not None
        rand = _random_words(rng, u.size, c)
    if pl.d0 >= 1:
        r = _round_mag(u, neg, pl.d0, pl, rand)
    else:
        r = u.copy()
    if pl.need_tiny:
        small = (u < ut(pl.tiny_bits)) & (u != 0)
        if np.any(small):
            r[small] = _round_tiny(u[small], neg[small], pl, None if rand is None else rand[small])
    big = r > ut(pl.max_bits)
    if np.any(big):
        r[big] = _special(u[big], r[big], neg[big], pl)
    fmt = pl.fmt
    if not pl.subnormals:
        r[(r < ut(pl.tiny_bits)) & (r != 0)] = 0
    if not fmt.signed:
        # e8m0: no sign, no zero. Negative values and zero have no representation: NaN (as ml_dtypes);
        # positive values that round to 0 go to the smallest value.
        r[(r == 0) & (u != 0)] = ut(pl.tiny_bits)
        r[(neg & (u != 0)) | (u == 0)] = ut(pl.nan_bits)
        return r
    is_nan = r > ut(pl.inf_bits)
    if np.any(is_nan):
        r[is_nan] = ut(pl.nan_bits)  # canonical NaN, sign cleared
        sign = np.where(is_nan, ut(0), sign)
    if not fmt.signed_zero:
        sign = np.where(r == 0, ut(0), sign)
    return r | sign


# --------------------------------------------------------------------------------------------------
# Input handling

_MAX_EXACT_INT = 2**53


def _as_float_array(x: Any, name: str = "x") -> tuple[np.ndarray, bool]:
    """Convert input to a native-order float32 or float64 array without rounding.

    Returns (array, was_scalar). The caller's object is never written to.
    """
    scalar = np.isscalar(x)
    if isinstance(x, (bool, np.bool_)):
        raise TypeError(f"{name} must be numeric, got a bool: {x!r}")
    if isinstance(x, (str, bytes)):
        raise TypeError(f"{name} must be numeric, got {type(x).__name__}: {x!r}")
    if isinstance(x, (complex, np.complexfloating)):
        raise TypeError(f"{name} must be real, got a complex value: {x!r}")
    if not isinstance(x, np.ndarray) and hasattr(x, "__array__") and not isinstance(x, (list, tuple)):
        x = np.asarray(x)
    a = np.asarray(x)
    k = a.dtype.kind
    if k == "f":
        if a.dtype.itemsize > 8:
            raise TypeError(f"{name}: {a.dtype} input is not supported (float16, float32, float64 are)")
        if a.dtype == np.float32 or a.dtype == np.float64:
            return a.astype(a.dtype.newbyteorder("="), copy=False), scalar
        return a.astype(np.float64), scalar  # float16: exact
    if k == "V":
        # ml_dtypes types (kind 'V' in NumPy): every one widens exactly to float64.
        try:
            return a.astype(np.float64), scalar
        except (TypeError, ValueError):
            raise TypeError(f"{name}: cannot convert dtype {a.dtype} to float") from None
    if k in "iu":
        if a.size and np.iinfo(a.dtype).max > _MAX_EXACT_INT:
            lim = a.dtype.type(_MAX_EXACT_INT)  # compare as integers: exact
            big = (a > lim) | (a < -lim) if k == "i" else a > lim
            if np.any(big):
                bad = a[big].ravel()[0]
                raise ValueError(f"{name}: integer {int(bad)} exceeds 2**53 in magnitude and cannot be held exactly")
        return a.astype(np.float64), scalar
    if k == "b":
        raise TypeError(f"{name} must be numeric, got a boolean array")
    if k == "c":
        raise TypeError(f"{name} must be real, got dtype {a.dtype}")
    raise TypeError(f"{name} must be a real number or array of them, got dtype {a.dtype}")


try:  # the C kernel (built at install time); the NumPy kernel above is the reference and fallback
    from . import _ckernel  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - exercised where no compiler was available
    _ckernel = None

_MODE_CODE = {m: i for i, m in enumerate([Rounding.RNE, Rounding.RNA, Rounding.RTZ, Rounding.RUP, Rounding.RDN,
                                          Rounding.RTO, Rounding.SR])}


def _c_params(pl: _Plan) -> tuple[Any, ...]:
    f = pl.fmt
    q = float(np.ldexp(1.0, f.emin - f.mbits))
    with np.errstate(under="ignore", over="ignore"):
        hq = pl.c.bits_of(q / 2)
    return (
        pl.c.M, pl.c.B, pl.c.W, pl.d0, int(pl.need_tiny), f.emin - f.mbits, _MODE_CODE[pl.mode],
        int(pl.overflow is Overflow.SATURATE), int(not pl.subnormals), int(f.has_inf), int(f.has_nan),
        int(f.signed_zero), int(f.signed), pl.sr_bits or 0,
        pl.tiny_bits, pl.max_bits, pl.minsub_bits, pl.inf_bits, pl.nan_bits, hq, q,
    )


def _random_words(rng: np.random.Generator, n: int, c: _Carrier) -> np.ndarray:
    """n uniform carrier-width random words (the same stream for the C and NumPy kernels)."""
    if c.W == 64:
        return rng.bit_generator.random_raw(n).astype(np.uint64, copy=False)
    return rng.bit_generator.random_raw((n + 1) // 2).view(np.uint32)[:n]


use_c_kernel = _ckernel is not None
"""Whether `round` uses the compiled kernel (set False to force the NumPy reference kernel)."""

max_threads: int | None = None
"""Threads the compiled kernel may use on large arrays (None: one per CPU, at most 8; 1: no threads).
Results do not depend on it: each element is rounded on its own, and SR's random words are drawn in
element order before the work is shared out."""

_PARALLEL_MIN = 1 << 20  # below this, starting threads costs more than it saves
_POOL: Any = None


def _pool(workers: int) -> Any:
    global _POOL
    if _POOL is None or _POOL._max_workers != workers:
        from concurrent.futures import ThreadPoolExecutor

        _POOL = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fpsim-round")
    return _POOL


def _run_c_kernel(sb: np.ndarray, res: np.ndarray, pl: _Plan, rng: np.random.Generator | None) -> None:
    """The compiled kernel over blocks of 256K elements (it releases the GIL, so large arrays are shared
    among threads)."""
    import os

    assert _ckernel is not None
    params = _c_params(pl)
    step = _CHUNK * 8
    n = sb.size
    workers = max_threads if max_threads is not None else min(os.cpu_count() or 1, 8)
    if n < _PARALLEL_MIN or workers <= 1:
        for i in range(0, n, step):
            rand = None if pl.mode is not Rounding.SR else _random_words(rng, min(step, n - i), pl.c)  # type: ignore[arg-type]
            _ckernel.round_bits(sb[i : i + step], res[i : i + step], rand, params)
        return
    pool = _pool(workers)
    pending: list[Any] = []
    for i in range(0, n, step):
        rand = None if pl.mode is not Rounding.SR else _random_words(rng, min(step, n - i), pl.c)  # type: ignore[arg-type]
        pending.append(pool.submit(_ckernel.round_bits, sb[i : i + step], res[i : i + step], rand, params))
        if len(pending) >= 2 * workers:  # bounded: at most a few blocks of random words alive
            pending.pop(0).result()
    for fut in pending:
        fut.result()


def _round_array(a: np.ndarray, fmt: Format, mode: Rounding, overflow: Overflow, subnormals: bool,
                 rng: np.random.Generator | None, sr_bits: int | None) -> np.ndarray:
    """Round a native float32/float64 array; result dtype float32 iff the input is float32 and the
    format fits in float32."""
    with np.errstate(invalid="ignore"):  # casts of signalling-NaN payloads warn; they stay NaN
        return _round_array_impl(a, fmt, mode, overflow, subnormals, rng, sr_bits)


def _round_array_impl(a: np.ndarray, fmt: Format, mode: Rounding, overflow: Overflow, subnormals: bool,
                      rng: np.random.Generator | None, sr_bits: int | None) -> np.ndarray:
    if a.dtype == np.float32 and fmt.fits_float32 and fmt.emin >= -126:
        c = _F32
    else:
        c = _F64
        if a.dtype == np.float32 and not fmt.fits_float32:
            a = a.astype(np.float64)
    out_dtype = a.dtype
    pl = _plan(c, fmt, mode, overflow, subnormals, sr_bits)
    src = np.ascontiguousarray(a).reshape(-1)
    if src.dtype != c.ftype:
        src = src.astype(c.ftype)
    res: np.ndarray = np.empty(src.size, dtype=c.utype)
    sb: np.ndarray = src.view(c.utype)
    if use_c_kernel and _ckernel is not None:
        _run_c_kernel(sb, res, pl, rng)
    else:
        for i in range(0, src.size, _CHUNK):
            res[i : i + _CHUNK] = _kernel(sb[i : i + _CHUNK], pl, rng)
    out: np.ndarray = res.view(c.ftype)
    if out.dtype != out_dtype:
        out = out.astype(out_dtype)
    return out.reshape(a.shape)


def round(
    x: Any,
    fmt: FormatLike,
    rounding: RoundingLike = "rne",
    *,
    overflow: Overflow | str = "ieee",
    subnormals: bool = True,
    rng: np.random.Generator | None = None,
    sr_bits: int | None = None,
) -> Any:
    """Round values into a format, once, from their exact value.

    Parameters
    ----------
    x : array_like or scalar
        float16/float32/float64, ml_dtypes or integer values (integers must not exceed 2**53 in
        magnitude). Never modified.
    fmt : Format or str
        Target format (``"bf16"``, ``fpsim.fp8_e4m3``, ``"float8_e4m3fn"``, ...).
    rounding : {"rne", "rna", "rtz", "rup", "rdn", "rto", "sr"}
        Rounding mode (see :class:`Rounding`).
    overflow : {"ieee", "saturate"}
        Overflow policy (see :class:`Overflow`).
    subnormals : bool
        ``False`` flushes subnormal results to signed zero (after rounding).
    rng : numpy.random.Generator, optional
        Source of random bits for ``"sr"``; required for it. Same seed, same result.
    sr_bits : int, optional
        For ``"sr"``: how many random bits the hardware adds (the remainder is first truncated to that
        many bits). ``None`` means exact stochastic rounding.

    Returns
    -------
    numpy.ndarray or numpy scalar
        The rounded values, exactly representable in ``fmt``: float32 for float32 input (when every value
        of ``fmt`` is a float32), float64 otherwise. NaN results are the carrier's canonical NaN.

    Examples
    --------
    >>> import fpsim, numpy as np
    >>> float(fpsim.round(1 + 2**-8, "bf16"))           # a tie: to even
    1.0
    >>> float(fpsim.round(1 + 2**-8 + 2**-40, "bf16"))  # just past the tie: up
    1.0078125
    >>> fpsim.round(np.float32([464, 465, 1000]), "fp8_e4m3")
    array([448.,  nan,  nan], dtype=float32)
    >>> fpsim.round([464, 465, 1000], "fp8_e4m3", overflow="saturate")
    array([448., 448., 448.])
    >>> fpsim.round(0.1, "fp16", "rtz")
    np.float64(0.0999755859375)
    """
    f, mode, ov = parse_options(fmt, rounding, overflow, subnormals, rng, sr_bits)
    is_scalar = np.isscalar(x) and not isinstance(x, (str, bytes))
    a, _ = _as_float_array(x)
    out = _round_array(a, f, mode, ov, bool(subnormals), rng, None if sr_bits is None else int(sr_bits))
    if is_scalar or out.ndim == 0:
        return out[()]
    return out


# --------------------------------------------------------------------------------------------------
# Reports


@dataclass(frozen=True)
class RoundingReport:
    """What rounding an array into a format did to it (see :func:`analyze`).

    Counts are over elements: ``underflow`` = nonzero finite inputs that became ±0; ``subnormal`` =
    nonzero results below the format's min normal; ``overflow`` = finite inputs that became infinite,
    NaN or the saturated ±max from beyond it; ``nan`` = NaN results. Errors are over finite results of
    finite inputs.
    """

    format: str
    rounding: str
    total: int
    exact: int
    inexact: int
    underflow: int
    subnormal: int
    overflow: int
    nan: int
    max_abs_error: float
    max_rel_error: float

    def fraction(self, field: str) -> float:
        """A count as a fraction of ``total`` (0.0 for an empty input)."""
        v = getattr(self, field)
        return float(v) / self.total if self.total else 0.0

    def as_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)

    def __str__(self) -> str:
        t = self.total or 1
        return (
            f"RoundingReport({self.format}, {self.rounding}): {self.total} values, "
            f"{self.exact} exact, {self.inexact} inexact, "
            f"underflow {self.underflow} ({100 * self.underflow / t:.2f}%), "
            f"subnormal {self.subnormal} ({100 * self.subnormal / t:.2f}%), "
            f"overflow {self.overflow}, nan {self.nan}, "
            f"max abs err {self.max_abs_error:.3g}, max rel err {self.max_rel_error:.3g}"
        )


def analyze(
    x: Any,
    fmt: FormatLike,
    rounding: RoundingLike = "rne",
    *,
    overflow: Overflow | str = "ieee",
    subnormals: bool = True,
    rng: np.random.Generator | None = None,
    sr_bits: int | None = None,
) -> RoundingReport:
    """Round ``x`` into ``fmt`` and count what happened (exact, underflow, subnormal, overflow, NaN).

    >>> import fpsim, numpy as np
    >>> r = fpsim.analyze(np.array([1.0, 1e-9, 7e4, 0.1]), "fp16")
    >>> r.underflow, r.overflow, r.exact
    (1, 1, 1)
    """
    f = as_format(fmt)
    a, _ = _as_float_array(x)
    a = a.astype(np.float64, copy=False).reshape(-1)
    r = np.asarray(
        round(a, f, rounding, overflow=overflow, subnormals=subnormals, rng=rng, sr_bits=sr_bits),
        dtype=np.float64,
    ).reshape(-1)
    fin_in = np.isfinite(a)
    fin_out = np.isfinite(r)
    nz_in = fin_in & (a != 0)
    exact = (r == a) | (np.isnan(r) & np.isnan(a))
    underflow = nz_in & (r == 0)
    absr = np.abs(r)
    subn = fin_out & (r != 0) & (absr < f.min_normal)
    over = fin_in & (~fin_out | ((absr == f.max) & (np.abs(a) > f.max)))
    ok = fin_in & fin_out
    err = np.abs(r[ok] - a[ok])
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(a[ok] != 0, err / np.abs(a[ok]), 0.0)
    return RoundingReport(
        format=f.name,
        rounding=as_rounding(rounding).value,
        total=int(a.size),
        exact=int(np.count_nonzero(exact)),
        inexact=int(a.size - np.count_nonzero(exact)),
        underflow=int(np.count_nonzero(underflow)),
        subnormal=int(np.count_nonzero(subn)),
        overflow=int(np.count_nonzero(over)),
        nan=int(np.count_nonzero(np.isnan(r))),
        max_abs_error=float(err.max()) if err.size else 0.0,
        max_rel_error=float(rel.max()) if rel.size else 0.0,
    )
