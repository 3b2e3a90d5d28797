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

The compiled kernel (``fpsim/_ckernel.c``; this module's NumPy kernel is the reference and the fallback,
``use_c_kernel = False``) does the same in one pass, with copies specialised for bf16, fp16 and fp8
e4m3/e5m2 in RNE, RTZ and SR, arrays of 1M+ elements split among ``max_threads`` threads inside one call
(the GIL released; a static split, so the bits never depend on it) and SR's random words drawn in C in
element order. ``round(..., out=)`` writes into an existing array (in place allowed).

An int, Fraction or Decimal that no float64 holds is rounded from its exact value by :func:`round_rational`
(here, since :func:`round` and it call each other; its exact integer steps are in ``fpsim._exact``).

Where it sits (the foundation is a line; each module imports only those before it)::

    _names, _checks, _fpenv  ->  formats  ->  _interop  ->  _carrier  ->  _exact  ->  rounding  ->  bits  ->  _grid

Input is read by the shared rule of ``fpsim._carrier`` (``_as_float_array`` here is that function).
"""

from __future__ import annotations

import copy
import decimal
import enum
import fractions
import math
import numbers
import os
from dataclasses import dataclass, replace
from typing import Any, TypeVar, Union

import numpy as np

from . import _exact
from .random import Philox
from ._carrier import BLOCK as _BLOCK
from ._carrier import as_float_array
from ._carrier import exact_float as _exact_float
from ._carrier import exact_value as _exact_value
from ._checks import check_out
from ._fpenv import ieee_mode
from ._interop import returns_input_kind
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

_as_float_array = as_float_array  # the input rule (fpsim._carrier), under the name the layers above import


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


_BY_VALUE: dict[type, dict[str, Any]] = {c: {m.value: m for m in c} for c in (Rounding, Overflow)}


def _parse_enum(cls: type[_E], value: object, what: str) -> _E:
    if isinstance(value, cls):
        return value
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a {cls.__name__} or a string, got {type(value).__name__}: {value!r}")
    known = _BY_VALUE[cls]
    hit = known.get(value)  # the canonical spelling: a dict lookup on every call's hot path
    if hit is not None:
        return hit  # type: ignore[no-any-return]
    return cls(parse_name(value, known, what))


def as_rounding(mode: RoundingLike) -> Rounding:
    """Parse a rounding mode name (case-insensitive) or `Rounding` member."""
    return _parse_enum(Rounding, mode, "rounding mode")


def as_overflow(policy: Overflow | str) -> Overflow:
    """Parse an overflow policy name or `Overflow` member."""
    return _parse_enum(Overflow, policy, "overflow policy")


def parse_options(fmt: FormatLike, rounding: RoundingLike, overflow: Overflow | str, subnormals: bool,
                  rng: np.random.Generator | Philox | None, sr_bits: int | None = None, *,
                  philox: bool = False) -> tuple[Format, Rounding, Overflow]:
    """Validate the options every rounding entry point takes (once, at the API edge). ``philox``: whether
    this entry point also takes a :class:`fpsim.random.Philox` stream as ``rng`` (``fpsim.round`` does)."""
    f = as_format(fmt)
    mode = as_rounding(rounding)
    ov = as_overflow(overflow)
    if not isinstance(subnormals, (bool, np.bool_)):
        raise TypeError(f"subnormals must be a bool, got {subnormals!r}")
    if mode is Rounding.SR:
        if rng is None:
            raise ValueError("rounding='sr' needs rng=numpy.random.default_rng(seed)")
        if isinstance(rng, Philox) and not philox:
            raise TypeError("rng=fpsim.random.Philox(...) is taken by fpsim.round (arrays); here pass a "
                            "numpy.random.Generator")
        if not isinstance(rng, (np.random.Generator, Philox)):
            raise TypeError(f"rng must be a numpy.random.Generator or an fpsim.random.Philox, got {type(rng).__name__}")
        if sr_bits is not None and (not isinstance(sr_bits, (int, np.integer)) or isinstance(sr_bits, (bool, np.bool_))
                                    or not 1 <= sr_bits <= 52):
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


# Plans (and their C parameter tuples) of the combinations in use: building one costs more than rounding a
# small array. Keyed by everything a plan is computed from; bounded.
_PLANS: dict[tuple[Any, ...], _Plan] = {}
_C_PARAMS: dict[_Plan, tuple[Any, ...]] = {}


def _plan_cached(c: _Carrier, fmt: Format, mode: Rounding, overflow: Overflow, subnormals: bool,
                 sr_bits: int | None) -> _Plan:
    key = (c, fmt, mode, overflow, subnormals, sr_bits)
    pl = _PLANS.get(key)
    if pl is None:
        if len(_PLANS) > 512:
            _PLANS.clear()
            _C_PARAMS.clear()
        pl = _PLANS[key] = _plan(c, fmt, mode, overflow, subnormals, sr_bits)
    return pl


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


def _kernel(bits: np.ndarray, pl: _Plan, rng: np.random.Generator | Philox | None, rand: np.ndarray | None = None) -> Any:
    """Round one chunk of carrier bit patterns; returns new bit patterns. SR draws its random words
    from ``rng`` unless they are given as ``rand``."""
    c = pl.c
    ut = c.utype
    sign_bit = ut(1 << (c.W - 1))
    sign = bits & sign_bit
    u = bits ^ sign
    neg = sign != 0
    if pl.mode is Rounding.SR and rand is None:
        assert rng is not None
        rand = _random_words(rng, u.size, c, pl)
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
    if not fmt.signed and fmt.has_zero:
        # Unsigned with zero: rounded as if signed; a negative nonzero result is out of range (IEEE 754
        # 5.8's rule for unsigned integers): NaN. -0 is +0.
        r[neg & (r != 0)] = ut(pl.nan_bits)
        return r
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


try:  # the C kernel (built at install time); the NumPy kernel above is the reference and fallback
    from . import _ckernel  # type: ignore[attr-defined]

    if not hasattr(_ckernel, "stream_min_bytes"):  # pragma: no cover - a stale build without threads in C
        _ckernel = None
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
        int(f.signed_zero), int(f.signed), int(f.has_zero), pl.sr_bits or 0,
        pl.tiny_bits, pl.max_bits, pl.minsub_bits, pl.inf_bits, pl.nan_bits, hq, q,
    )


def _philox_half(pl: _Plan) -> bool:
    """Whether SR under ``pl`` reads at most the top 16 bits of each element's float32-carrier word, so that a
    :class:`~fpsim.random.Philox` word serves two elements: ``sr_bits`` of at most 16, or exact SR into a format
    whose dropped bits never exceed 16 and that has no subnormal grid above the carrier's (bf16: always 16).
    Half the Philox work, which dominates SR's cost (benchmarks/README.md, issue 30)."""
    if pl.c.W != 32 or pl.mode is not Rounding.SR:
        return False
    if pl.sr_bits:
        return pl.sr_bits <= 16
    return not pl.need_tiny and pl.d0 <= 16


def _philox_words_needed(n: int, pl: _Plan) -> int:
    """Philox stream words SR of ``n`` elements under ``pl`` takes."""
    return (n + 1) // 2 if _philox_half(pl) else n if pl.c.W == 32 else 2 * n


def _random_words(rng: np.random.Generator | Philox, n: int, c: _Carrier, pl: _Plan | None = None) -> np.ndarray:
    """n uniform carrier-width random words (the same stream for the C and NumPy kernels).

    A :class:`~fpsim.random.Philox` stream gives its next words: one per element of a float32 carrier,
    two per element of a float64 one (the first the low half); where the rounding reads at most 16 bits
    of each (`_philox_half`: bf16, ``sr_bits <= 16``), half a word per element, the low half first, each
    half in the top 16 bits of the element's word.

    The generator's full 64-bit words (``next_uint64``: what ``random_raw`` gives for PCG64, Philox and
    SFC64, bit for bit). ``random_raw`` itself is not used: a 32-bit generator (MT19937) returns its words
    in the low half, so SR in the float64 carrier never rounded up and half the float32 words were zero.
    """
    if isinstance(rng, Philox):
        if pl is not None and _philox_half(pl):
            h = rng.words((n + 1) // 2)
            both = np.empty(2 * h.size, dtype=np.uint32)
            both[0::2] = h << np.uint32(16)
            both[1::2] = h & np.uint32(0xFFFF0000)
            return both[:n]
        w = rng.words(n if c.W == 32 else 2 * n)
        if c.W == 32:
            return w
        w64 = w.astype(np.uint64)
        pairs: np.ndarray = w64[0::2] | (w64[1::2] << np.uint64(32))
        return pairs
    m = n if c.W == 64 else (n + 1) // 2
    words = rng.integers(0, 2**64 - 1, size=m, dtype=np.uint64, endpoint=True)  # the full range: next_uint64
    return words if c.W == 64 else words.view(np.uint32)[:n]


use_c_kernel = _ckernel is not None
"""Whether `round` uses the compiled kernel (set False to force the NumPy reference kernel)."""

max_threads: int | None = None
"""Threads the compiled kernel may use on large arrays (None: one per CPU, at most 8; 1: no threads).
Results do not depend on it: each element is rounded on its own, and SR's random words are those of
element order whatever the split (see `_run_c_kernel`)."""

_PARALLEL_MIN = 1 << 20  # below this, starting threads costs more than it saves
_C_BLK = 2048  # the compiled kernel's block: a thread's share is a multiple of it (BLK in _ckernel.c)
# Bit generators whose stream a copy can skip ahead in (``advance``: one step per next_uint64 word), so
# that each thread draws its own elements' words, the same words one thread drawing in order would.
_ADVANCEABLE = tuple(t for t in (getattr(np.random, "PCG64", None), getattr(np.random, "PCG64DXSM", None))
                     if t is not None)


_PCG64: Any = getattr(np.random, "PCG64", None)
_M64 = (1 << 64) - 1
_M32 = (1 << 32) - 1


def _thread_chunk(n: int) -> int:
    """Elements per thread for an array of n (0: one thread): the static split of `_run_c_kernel`."""
    if n < _PARALLEL_MIN:
        return 0
    workers = max_threads if max_threads is not None else min(os.cpu_count() or 1, 8)
    workers = max(1, min(int(workers), 64))
    if workers <= 1:
        return 0
    per = -(-n // workers)
    return -(-per // _C_BLK) * _C_BLK


def _run_c_kernel(sb: np.ndarray, res: np.ndarray, pl: _Plan, rng: np.random.Generator | Philox | None,
                  sink: Any = None) -> None:
    """Round the carrier bit patterns ``sb`` into ``res`` (1-D, same size, C-contiguous; ``res`` may be
    ``sb`` itself) with the compiled kernel in one call: the GIL released, large arrays split among
    ``max_threads`` threads in C (a static split: the bits never depend on it).

    SR draws its random words in C straight from ``rng``'s bit generator (its ``capsule``, under its
    lock), in element order: exactly the words of `_random_words` (one ``next_uint64`` per element, or
    per two elements of a float32 carrier, low half first), so seeded results are those of the NumPy
    kernel, and the generator ends where drawing in order would leave it. PCG64 (``default_rng``) is
    stepped in C from its ``state`` (each thread jumping ahead to its first word); for PCG64DXSM each
    thread draws from a copy of the generator advanced to its first word; other bit generators draw in
    one thread.

    ``sink`` (a sink of fpsim/_carith.c, see fpsim/_csink.h): the rounded words go there block by block
    instead of into ``res`` (which is then not written), the same words with the same random words.
    """
    assert _ckernel is not None
    extra = () if sink is None else (sink,)
    params = _C_PARAMS.get(pl)
    if params is None:
        params = _C_PARAMS[pl] = _c_params(pl)
    chunk = _thread_chunk(sb.size)
    if pl.mode is not Rounding.SR:
        _ckernel.round_bits(sb, res, None, params, chunk, *extra)
        return
    assert rng is not None
    if isinstance(rng, Philox):  # counter-based: each thread computes its own elements' words
        half = _philox_half(pl)
        start = rng.take(_philox_words_needed(sb.size, pl))
        _ckernel.round_bits(sb, res, ("philox", rng.key & _M32, rng.key >> 32, start, int(half)), params, chunk,
                            *extra)
        return
    bg = rng.bit_generator
    with bg.lock:
        if type(bg) is _PCG64 and getattr(_ckernel, "HAVE_PCG64", False):
            # NumPy's default generator, stepped in C from its documented state (same words, faster than
            # a call per word; each thread jumps ahead to its first word)
            st = bg.state
            s, inc = int(st["state"]["state"]), int(st["state"]["inc"])
            hi, lo = _ckernel.round_bits(sb, res, ("pcg64", s >> 64, s & _M64, inc >> 64, inc & _M64), params, chunk,
                                         *extra)
            end = dict(st)
            end["state"] = {"state": (hi << 64) | lo, "inc": inc}
            bg.state = end  # has_uint32/uinteger as they were: next_uint64 does not touch them
        elif chunk and type(bg) in _ADVANCEABLE:
            n = sb.size
            half = pl.c.W == 32  # a float32 carrier takes one 64-bit word per two elements
            st = bg.state
            streams: list[Any] = []
            for lo in range(0, n, chunk):
                g: Any = type(bg)(0)
                g.state = st
                if lo:
                    g.advance(lo // 2 if half else lo)  # lo is even: a word boundary
                streams.append(g)
            _ckernel.round_bits(sb, res, tuple(g.capsule for g in streams), params, chunk, *extra)
            end = dict(streams[-1].state)  # the last stream stops after the last element's word
            for k in ("has_uint32", "uinteger"):  # advance() clears the 32-bit buffer the original keeps
                if k in st:
                    end[k] = st[k]
            bg.state = end
        else:
            _ckernel.round_bits(sb, res, bg.capsule, params, 0, *extra)


def sink_carrier(dtype: np.dtype, fmt: Format, mode: Rounding, sr_bits: int | None) -> _Carrier | None:
    """The carrier in which `round_sink` rounds an array of ``dtype`` into ``fmt``, or None where the
    compiled kernel does not serve it (no kernel, the NumPy kernel forced, a table format, other dtypes).
    Shared with `fpsim.bits` (hence no underscore); not in ``__all__``, not part of the API."""
    if not (use_sink and use_c_kernel) or _ckernel is None or fmt.table is not None \
            or dtype not in (np.float32, np.float64):
        return None
    return _carrier_for(dtype, fmt, mode, sr_bits)


def round_sink(src: np.ndarray, fmt: Format, mode: Rounding, overflow: Overflow, subnormals: bool,
                rng: np.random.Generator | None, sr_bits: int | None, sink: Any) -> None:
    """Round ``src`` (1-D, C-contiguous, of the dtype of `sink_carrier`'s carrier) with the compiled kernel
    as `round` does (same plan, same random words, threads as ``max_threads``), each rounded block handed to
    ``sink`` while it is in cache instead of stored: analyze and to_bits in one pass over the input. Shared
    with `fpsim.bits`; not in ``__all__``, not part of the API."""
    c = _carrier_for(src.dtype, fmt, mode, sr_bits)
    assert src.dtype == c.ftype and src.flags.c_contiguous and src.ndim == 1
    pl = _plan_cached(c, fmt, mode, overflow, subnormals, sr_bits)
    with np.errstate(invalid="ignore"):
        _run_c_kernel(src.view(c.utype), _NO_OUT[c.W], pl, rng, sink)


use_sink = True
"""Whether :func:`analyze` and :func:`fpsim.to_bits` count or encode each rounded block in the compiled kernel's
pass (one pass over the input); False: round a block into an array, then count or encode it (the way before
issue 30, kept for benchmarks). Same reports and codes either way."""

_NO_OUT: dict[int, np.ndarray] = {32: np.empty(1, np.uint32), 64: np.empty(1, np.uint64)}  # unused with a sink


def _carrier_for(dtype: np.dtype, fmt: Format, mode: Rounding, sr_bits: int | None) -> _Carrier:
    """The carrier a native float32/float64 array is rounded in.

    float32 stays in the float32 carrier when the format fits it, except for SR with more than 32
    random bits: a float32 carrier has 32-bit random words, so those go through float64 (exact there:
    the float32 remainder has its low 29 carrier bits clear), with the same float32 result dtype.
    """
    if dtype == np.float32 and fmt.fits_float32 and fmt.emin >= -126:
        if not (mode is Rounding.SR and sr_bits is not None and sr_bits > _F32.W):
            return _F32
    return _F64


def _round_array(a: np.ndarray, fmt: Format, mode: Rounding, overflow: Overflow, subnormals: bool,
                 rng: np.random.Generator | Philox | None, sr_bits: int | None, out: np.ndarray | None = None) -> np.ndarray:
    """Round a native float32/float64 array; result dtype float32 iff the input is float32 and the
    format fits in float32. With ``out`` (checked by `_checks.check_out`; it may be ``a`` itself) the
    result is written there and ``out`` returned."""
    with np.errstate(invalid="ignore"):  # casts of signalling-NaN payloads warn; they stay NaN
        return _round_array_impl(a, fmt, mode, overflow, subnormals, rng, sr_bits, out)


def _same_elements(x: np.ndarray, y: np.ndarray) -> bool:
    """x and y are C-contiguous views of the very same elements (in-place rounding is then safe: each
    element is read before it is written); False where they merely may overlap."""
    return bool(x.__array_interface__["data"][0] == y.__array_interface__["data"][0] and x.nbytes == y.nbytes
                and x.flags.c_contiguous and y.flags.c_contiguous)


def _round_array_impl(a: np.ndarray, fmt: Format, mode: Rounding, overflow: Overflow, subnormals: bool,
                      rng: np.random.Generator | Philox | None, sr_bits: int | None,
                      out: np.ndarray | None = None) -> np.ndarray:
    out_dtype = np.dtype(np.float32) if a.dtype == np.float32 and fmt.fits_float32 else np.dtype(np.float64)
    if out is not None:
        out = check_out(out, a.shape, out_dtype)
    if fmt.table is not None:
        t = _round_table(np.asarray(a, dtype=np.float64).reshape(-1), fmt, mode, overflow, subnormals, rng, sr_bits)
        if out is not None:
            np.copyto(out, t.reshape(a.shape))
            return out
        return t.astype(out_dtype, copy=False).reshape(a.shape)
    c = _carrier_for(a.dtype, fmt, mode, sr_bits)
    return _round_planned(a, c, _plan_cached(c, fmt, mode, overflow, subnormals, sr_bits), rng, out, out_dtype)


def _round_planned(a: np.ndarray, c: _Carrier, pl: _Plan, rng: np.random.Generator | Philox | None,
                   out: np.ndarray | None, out_dtype: np.dtype) -> np.ndarray:
    """`a` rounded by the bit kernel in carrier `c` on the plan `pl`: the rest of `_round_array_impl` once the
    plan is made (`out`, if given, already checked against `out_dtype` and `a`'s shape). Also the entry of the
    training runtime (fpsim.amp.runtime), which makes its plans once per format and so skips fpsim.round's
    per-call option parsing; the same bits and the same SR draws as fpsim.round."""
    src = np.ascontiguousarray(a).reshape(-1)
    if src.dtype != c.ftype:
        src = src.astype(c.ftype)
    # Straight into out where it is a C-contiguous carrier array that is either the input itself or
    # disjoint from it; otherwise (strided, another dtype, a partial overlap) through a temporary.
    direct = (out is not None and out.dtype == c.ftype and out.flags.c_contiguous
              and (not np.may_share_memory(out, src) or _same_elements(out, src)))
    res: np.ndarray
    if direct:
        assert out is not None
        res = out.reshape(-1).view(c.utype)
    else:
        res = np.empty(src.size, dtype=c.utype)
    sb: np.ndarray = src.view(c.utype)
    if use_c_kernel and _ckernel is not None:
        _run_c_kernel(sb, res, pl, rng)
    else:
        for i in range(0, src.size, _CHUNK):
            res[i : i + _CHUNK] = _kernel(sb[i : i + _CHUNK], pl, rng)
    if out is not None:
        if not direct:
            np.copyto(out, res.view(c.ftype).reshape(a.shape))  # float64 -> float32 only for float32 values
        return out
    r: np.ndarray = res.view(c.ftype)
    if r.dtype != out_dtype:
        r = r.astype(out_dtype)
    return r.reshape(a.shape)


# --------------------------------------------------------------------------------------------------
# Formats given by a table of values (tapered precision: HiF8)

_TABLE_GRIDS: dict[Format, tuple[np.ndarray, np.ndarray]] = {}


def table_grid(fmt: Format) -> tuple[np.ndarray, np.ndarray]:
    """A table format's finite magnitudes in ascending order, with ``table_above`` appended, and the code of
    each (the appended one gets the code after max's: only its parity is used, for ties to even)."""
    g = _TABLE_GRIDS.get(fmt)
    if g is None:
        assert fmt.table is not None and fmt.table_above is not None
        t = np.array(fmt.table, dtype=np.float64)
        codes = np.flatnonzero(np.isfinite(t))
        order = np.argsort(t[codes], kind="stable")
        v, cv = t[codes][order], codes[order]
        g = (np.append(v, fmt.table_above), np.append(cv, cv[-1] + 1).astype(np.int64))
        _TABLE_GRIDS[fmt] = g
    return g


def _round_table(x: np.ndarray, fmt: Format, mode: Rounding, overflow: Overflow, subnormals: bool,
                 rng: np.random.Generator | Philox | None, sr_bits: int | None, overflows: np.ndarray | None = None
                 ) -> np.ndarray:
    """The table path of the one rounding: float64 ``x`` onto the sorted values of a table format.

    The two neighbours of ``|x|`` come from a binary search; the mode picks one exactly as the bit kernel does
    (nearest by comparing ``2|x|`` with their sum, which is exact; ties to the even *code*, or away from zero;
    RTO to the odd code; SR up with probability distance / gap). Past ``max`` the grid goes on to
    ``table_above``; a result there is an overflow (IEEE 754 7.4, as `_overflow_result`), flagged in
    ``overflows`` (a bool array like ``x``) when given."""
    v, codes = table_grid(fmt)
    n = v.size - 1  # index of table_above
    out = np.empty(x.size, dtype=np.float64)
    rand_all = None
    if mode is Rounding.SR:
        assert rng is not None
        k = 32 if sr_bits is None else int(sr_bits)
        if isinstance(rng, Philox):  # its next 64-bit words (two stream words each), the top k bits
            rand_all = _random_words(rng, x.size, _F64) >> np.uint64(64 - k)
        else:
            rand_all = rng.integers(0, 1 << k, size=x.size, dtype=np.uint64)  # one word per element, in order
    for i in range(0, x.size, _CHUNK):
        xs = x[i : i + _CHUNK]
        neg = np.signbit(xs)
        mag = np.abs(xs)
        fin = np.isfinite(mag)
        m = np.where(fin, mag, 0.0)
        lo_i = np.clip(np.searchsorted(v, m, side="right") - 1, 0, n)
        beyond = lo_i == n  # |x| >= table_above: rounds past max in every mode but the ones toward zero
        hi_i = np.minimum(lo_i + 1, n)
        lo, hi = v[lo_i], v[hi_i]
        exact = lo == m
        with np.errstate(over="ignore", invalid="ignore"):
            twice, mid = 2.0 * m, lo + hi  # both exact: lo, hi have a few bits, and m < table_above here
        if mode is Rounding.RNE or mode is Rounding.RNA:
            tie = twice == mid
            up = (twice > mid) | (tie & ((codes[hi_i] % 2 == 0) if mode is Rounding.RNE else True))
        elif mode is Rounding.RTZ:
            up = np.zeros(m.shape, bool)
        elif mode is Rounding.RUP:
            up = ~neg
        elif mode is Rounding.RDN:
            up = neg.copy()
        elif mode is Rounding.RTO:
            up = codes[lo_i] % 2 == 0
        else:
            assert rand_all is not None
            k = 32 if sr_bits is None else int(sr_bits)
            with np.errstate(invalid="ignore", divide="ignore"):
                frac = np.where(hi > lo, (m - lo) / np.where(hi > lo, hi - lo, 1.0), 0.0)
            up = rand_all[i : i + _CHUNK].astype(np.float64) < np.floor(frac * float(1 << k))
        up = up & ~exact
        r_i = np.where(beyond, n, lo_i + up)
        r = v[r_i]
        over = fin & ((r_i == n) | (beyond & (mag > v[n - 1])))  # past max with an unbounded grid
        if overflows is not None:
            overflows[i : i + _CHUNK] = over
        if over.any():
            toward = np.zeros(m.shape, bool)  # modes that stop at max: RTZ, RTO, RDN (x > 0), RUP (x < 0)
            if mode in (Rounding.RTZ, Rounding.RTO) or overflow is Overflow.SATURATE:
                toward[:] = True
            elif mode is Rounding.RDN:
                toward = ~neg
            elif mode is Rounding.RUP:
                toward = neg.copy()
            big = (math.inf if fmt.has_inf else math.nan if fmt.has_nan else fmt.max)
            r = np.where(over, np.where(toward, fmt.max, big), r)
        inf_in = np.isinf(mag)
        if inf_in.any():
            r = np.where(inf_in, fmt.max if overflow is Overflow.SATURATE or not fmt.has_inf else math.inf, r)
            if not fmt.has_inf and overflow is Overflow.IEEE and fmt.has_nan:
                r = np.where(inf_in, math.nan, r)
        if not subnormals:
            r = np.where(r < fmt.min_normal, 0.0, r)  # flushed after rounding, as the bit kernel does
        r = np.where(neg & (r != 0), -r, r)  # no -0 in a table format: the NEG_ZERO pattern is NaN
        out[i : i + _CHUNK] = np.where(np.isnan(xs), math.nan, r)
    return out


# --------------------------------------------------------------------------------------------------
# Exact rationals


def _overflow_result(fmt: Format, mode: Rounding, overflow: Overflow, neg: bool) -> float:
    """IEEE 754 §7.4 as fpsim.round applies it to a finite value beyond the format's range (used only where no
    float64 lies beyond the format's range to hand to fpsim.round: formats with emax = 1023)."""
    if overflow is Overflow.SATURATE or mode in (Rounding.RTZ, Rounding.RTO):
        to_inf = False
    elif mode is Rounding.RUP:
        to_inf = not neg
    elif mode is Rounding.RDN:
        to_inf = neg
    else:
        to_inf = True
    v = (math.inf if fmt.has_inf else math.nan if fmt.has_nan else fmt.max) if to_inf else fmt.max
    return -v if neg and fmt.signed else (math.nan if neg else v)



def round_rational(q: _exact.RationalLike, fmt: FormatLike, mode: RoundingLike = "rne",
                   overflow: Overflow | str = "ieee", subnormals: bool = True, *,
                   rng: np.random.Generator | None = None) -> float:
    """``q`` rounded once, correctly, into ``fmt``: what :func:`fpsim.round` gives for a float, for any rational.

    Parameters
    ----------
    q : fractions.Fraction, int or float
        The exact value (a float is taken exactly; ``inf``/``nan``/``-0.0`` go to :func:`fpsim.round` as they
        are). A zero Fraction is +0. Never modified.
    fmt : Format or str
        Target format.
    mode : {"rne", "rna", "rtz", "rup", "rdn", "rto", "sr"}
        Rounding mode. ``"sr"`` needs ``rng`` and is exact stochastic rounding: up (in magnitude) with
        probability exactly (|q| - lo) / (hi - lo). A q that is a float64 goes to :func:`fpsim.round` (same
        seed, same bits as there); any other q compares its fraction with uniform random 64-bit words drawn
        from ``rng`` until they differ (a different stream from fpsim.round's: same seed, same result).
    overflow : {"ieee", "saturate"}
        As for :func:`fpsim.round`.
    subnormals : bool
        ``False`` flushes subnormal results to signed zero, as for :func:`fpsim.round`.
    rng : numpy.random.Generator, optional
        Random source for ``"sr"`` (required for it, refused for the other modes).

    Returns
    -------
    float
        A value of ``fmt`` (or inf/nan as the format's rules give).

    Examples
    --------
    >>> from fpsim._exact import parse_decimal
    >>> round_rational(parse_decimal("1.00048828125000000001"), "fp16")
    1.0009765625
    >>> round_rational(fractions.Fraction(1, 10**400), "fp16", "rup") == 2.0**-24
    True
    >>> round_rational(fractions.Fraction(10**400), "fp64", "rtz")
    1.7976931348623157e+308
    """
    if isinstance(q, (bool, np.bool_)) or not isinstance(q, (numbers.Rational, float, np.floating, decimal.Decimal)):
        raise TypeError(f"round_rational takes a Fraction, int, float or Decimal, got {type(q).__name__}: {q!r}")
    if isinstance(q, np.floating):  # exactly, longdouble included (float() would round it first)
        q = float(q) if not np.isfinite(q) else fractions.Fraction(*(int(v) for v in q.as_integer_ratio()))
    elif isinstance(q, np.integer):
        q = int(q)
    elif isinstance(q, decimal.Decimal) and not q.is_finite():
        if q.is_snan():
            raise ValueError(f"round_rational: a signaling NaN ({q!r}) is not a value to round")
        q = float(q)
    f, m, ov = parse_options(fmt, mode, overflow, subnormals, rng)
    if rng is not None and m is not Rounding.SR:
        raise ValueError(f"rng applies only to rounding='sr', got rounding={m.value!r}")
    if f.table is not None:  # the table path decides from the neighbours and the side: a float stands for q
        rep = q if isinstance(q, float) else _table_representative(fractions.Fraction(q), f, m)
        return float(round(rep, f, m, overflow=ov, subnormals=bool(subnormals), rng=rng))

    def fin(v: float) -> float:
        return float(round(v, f, m, overflow=ov, subnormals=bool(subnormals), rng=rng))

    if isinstance(q, float):
        if not math.isfinite(q) or q == 0:
            return fin(q)
    fq = fractions.Fraction(q)
    if fq == 0:
        return fin(0.0)
    neg = fq < 0
    num, den = abs(fq.numerator), fq.denominator
    sign = -1.0 if neg else 1.0
    E = _exact.floor_log2(num, den)
    if E > f.emax:  # |q| >= 2**(emax+1): beyond every rounding boundary, like any larger value
        if f.emax <= 1022:
            return fin(sign * math.ldexp(1.0, f.emax + 1))
        return _overflow_result(f, m, ov, neg)
    e = max(E, f.emin)  # exponent of q's binade, or of the subnormal grid below min normal
    if m is Rounding.SR and E >= -1074 and _exact.is_float64(num, den, E):
        return fin(sign * (num / den))  # a float64 (int / int is exact here): fpsim.round's own SR stream
    if f.p <= 51 and f.emin - f.mbits - 2 >= -1074 and m is not Rounding.SR:
        # Round to odd onto a grid two bits finer: a float64 (< 2**53 multiples of 2**s >= 2**-1074) in the
        # same open interval between format values, on the same side of each midpoint, exact iff q is.
        s = e - f.mbits - 2
        mi, rem, _ = _exact.div_pow2(num, den, s)
        return fin(sign * math.ldexp(float(mi | (rem != 0)), s))
    # Direct rounding on the format's own grid (p >= 52 or a grid reaching below float64's).
    s = e - f.mbits
    mi, rem, d = _exact.div_pow2(num, den, s)
    if rem:
        if m is Rounding.RTZ:
            up = False
        elif m is Rounding.RUP:
            up = not neg
        elif m is Rounding.RDN:
            up = neg
        elif m is Rounding.RTO:
            up = mi % 2 == 0
        elif m is Rounding.SR:
            assert rng is not None
            up = _exact.draw_below(rem, d, rng)
        else:
            c = 2 * rem - d
            up = c > 0 or (c == 0 and (m is Rounding.RNA or mi % 2 == 1))
        mi += up
    if mi == 0:
        # q rounded to zero: signed zero (fpsim.round applies fnuz); a format without zero clamps to its minimum
        return fin(sign * (0.0 if f.has_zero else f.min_normal))
    if fractions.Fraction(mi) * fractions.Fraction(2) ** s > fractions.Fraction(f.max):
        if f.emax <= 1022:
            return fin(sign * math.ldexp(1.0, f.emax + 1))
        return _overflow_result(f, m, ov, neg)
    return fin(sign * math.ldexp(float(mi), s))  # a value of the format, hence a float64: fin applies flush/fnuz


def _table_representative(q: fractions.Fraction, f: Format, m: Rounding) -> float:
    """A float64 that a table format's rounding sends where it sends the exact ``q``: ``q`` itself where it is a
    value, else the midpoint of its neighbours or a float strictly on ``q``'s side of it (the table path decides
    by the neighbours and the side alone)."""
    if m is Rounding.SR:
        raise ValueError(f"{f.name} (a table format) rounds an exact rational only in a deterministic mode, "
                         "not 'sr'; pass a float")
    v, _ = table_grid(f)
    a = abs(q)
    sign = -1.0 if q < 0 else 1.0
    if a >= fractions.Fraction(float(v[-1])):
        return sign * 2.0 * float(v[-1])  # beyond the grid, as q is
    i = int(np.searchsorted(v, float(a), side="right")) - 1  # float(a) is a float64 neighbour of a
    while i > 0 and fractions.Fraction(float(v[i])) > a:
        i -= 1
    while fractions.Fraction(float(v[i + 1])) <= a:
        i += 1
    lo, hi = float(v[i]), float(v[i + 1])
    if a == fractions.Fraction(lo):
        return sign * lo
    mid = fractions.Fraction(lo) + fractions.Fraction(hi)
    c = 2 * a - mid
    rep = (lo + hi) / 2 if c == 0 else ((3 * lo + hi) / 4 if c < 0 else (lo + 3 * hi) / 4)  # exact in float64
    return sign * rep


def _round_exact_scalar(x: object, q: fractions.Fraction | float, f: Format, mode: Rounding, ov: Overflow,
                        subnormals: bool) -> np.float64:
    """An int, Fraction or Decimal that no float64 holds, rounded once from its exact value."""
    if mode is Rounding.SR:
        # SR is defined by random bits added to a finite carrier, which an exact rational does not have.
        raise ValueError(f"x: {x!r} cannot be held exactly in float64, and rounding='sr' needs a float64 "
                         "carrier; round it with a deterministic mode or pass a float")
    r: np.float64 = np.float64(round_rational(q, f, mode, ov, subnormals))
    return r


@ieee_mode
@returns_input_kind
def round(
    x: Any,
    fmt: FormatLike,
    rounding: RoundingLike = "rne",
    *,
    overflow: Overflow | str = "ieee",
    subnormals: bool = True,
    rng: np.random.Generator | Philox | None = None,
    sr_bits: int | None = None, out: np.ndarray | None = None, as_dtype: bool = False,
) -> Any:
    """Round values into a format, once, from their exact value.

    Parameters
    ----------
    x : array_like or scalar
        float16/float32/float64 (either byte order), ml_dtypes or integer values. A scalar int,
        ``fractions.Fraction`` or ``decimal.Decimal`` is rounded from its exact value; in an array, an
        integer (or Fraction, Decimal) that no float64 holds exactly raises ``ValueError`` naming it.
        Masked arrays raise ``TypeError``. Never modified. torch CPU tensors (every float dtype, read
        through their bits), JAX CPU arrays, array-API arrays and DLPack objects are accepted too; device
        arrays raise ``TypeError`` naming how to move them (``fpsim._interop``).
    fmt : Format or str
        Target format (``"bf16"``, ``fpsim.fp8_e4m3``, ``"float8_e4m3fn"``, ...).
    rounding : {"rne", "rna", "rtz", "rup", "rdn", "rto", "sr"}
        Rounding mode (see :class:`Rounding`).
    overflow : {"ieee", "saturate"}
        Overflow policy (see :class:`Overflow`).
    subnormals : bool
        ``False`` flushes subnormal results to signed zero (after rounding).
    rng : numpy.random.Generator or fpsim.random.Philox, optional
        Source of random bits for ``"sr"``; required for it. Same seed, same result. A
        :class:`fpsim.random.Philox` stream is counter-based: faster, and the same bits on any number of
        threads (docs/rounding.md, "Stochastic rounding").
    sr_bits : int, optional
        For ``"sr"``: how many random bits the hardware adds (the remainder is first truncated to that
        many bits). ``None`` means exact stochastic rounding.
    out : numpy.ndarray, optional
        Where to write the result, as NumPy ufuncs take ``out=``: a writeable ndarray of exactly the
        result's shape and dtype (float32 or float64 as below; a 0-d array for a scalar ``x``),
        ``TypeError``/``ValueError`` naming it otherwise. It may be ``x`` itself (in place: the same bits
        as a new result). ``out`` is returned, unconverted (torch/JAX input included); it does not
        combine with ``as_dtype=True``. Saves allocating (and page-faulting) a new array.

    Returns
    -------
    numpy.ndarray or numpy scalar
        The rounded values, exactly representable in ``fmt``: float32 for float32 input (when every value
        of ``fmt`` is a float32), float64 otherwise. NaN results are the carrier's canonical NaN. A torch
        tensor, JAX array or array-API array in gives that library's array out (same carrier dtype). The
        keyword ``as_dtype=True`` (added by ``fpsim._interop.returns_input_kind``) gives the result in the
        input library's own dtype of ``fmt`` instead (ml_dtypes for NumPy input, ``torch.bfloat16``,
        ``torch.float8_e4m3fn``, ... for torch, ``jnp.bfloat16``, ... for JAX); ``ValueError`` naming
        the format where the library has none (tf32 anywhere; fp6 in torch).

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
    >>> y = fpsim.round(0.1, "fp16", "rtz")  # a Python scalar in, a NumPy scalar out
    >>> type(y).__name__, float(y)
    ('float64', 0.0999755859375)
    >>> x = np.float32([0.1, 0.2, 0.3])
    >>> r = fpsim.round(x, "bf16", out=x)  # in place
    >>> r is x, [float(v) for v in x]
    (True, [0.10009765625, 0.2001953125, 0.30078125])
    """
    f, mode, ov = parse_options(fmt, rounding, overflow, subnormals, rng, sr_bits, philox=True)
    is_scalar = np.isscalar(x) and not isinstance(x, (str, bytes))
    if is_scalar and not isinstance(x, (float, np.floating)):
        q = _exact_value(x)
        if q is not None and _exact_float(q) is None:  # no float64 holds it: round the exact value
            r = _round_exact_scalar(x, q, f, mode, ov, bool(subnormals))
            if out is None:
                return r
            check_out(out, (), np.float64)[()] = r
            return out
    a, _ = _as_float_array(x)
    res = _round_array(a, f, mode, ov, bool(subnormals), rng, None if sr_bits is None else int(sr_bits), out)
    if out is not None:
        return out
    if is_scalar or res.ndim == 0:
        return res[()]
    return res


# --------------------------------------------------------------------------------------------------
# Reports


_COUNT_FIELDS = ("exact", "inexact", "underflow", "subnormal", "overflow", "nan")


@ieee_mode
@dataclass(frozen=True)
class RoundingReport:
    """What rounding an array into a format did to it (see :func:`analyze`).

    Counts are over elements: ``underflow`` = nonzero finite inputs that became ±0; ``subnormal`` =
    nonzero results below the format's min normal; ``overflow`` = finite inputs that overflow in the
    IEEE 754 §7.4 sense (rounded as if the exponent range were unbounded, the result exceeds ``max``;
    they become ±inf, NaN or ±max by the overflow policy: 65505 → 65504 in fp16 is no overflow);
    ``nan`` = NaN results. Errors are over finite results of finite inputs.
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
        """A count as a fraction of ``total`` (0.0 for an empty input).

        ``field`` is one of ``exact, inexact, underflow, subnormal, overflow, nan`` (``ValueError``
        listing them otherwise).

        >>> import fpsim
        >>> fpsim.analyze([1.0, 1e-9], "fp16").fraction("underflow")
        0.5
        """
        name = parse_name(field, _COUNT_FIELDS, "report field")
        v = getattr(self, name)
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


@ieee_mode
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

    Works block by block: extra memory stays a few MiB, whatever the size of ``x``. Where fpsim/_carith.c and
    the compiled kernel are built, each block of a few thousand elements is counted as soon as it is rounded,
    while it is in cache: one pass over the input, threads as ``fpsim.rounding.max_threads``
    (``fpsim.rounding.use_c_analyze = False`` forces the NumPy reference; same report).

    >>> import fpsim, numpy as np
    >>> r = fpsim.analyze(np.array([1.0, 1e-9, 7e4, 0.1]), "fp16")
    >>> r.underflow, r.overflow, r.exact
    (1, 1, 1)
    >>> fpsim.analyze([65505.0], "fp16").overflow   # rounds to 65504: no overflow
    0
    """
    f, mode, ov = parse_options(fmt, rounding, overflow, subnormals, rng, sr_bits)
    srb = None if sr_bits is None else int(sr_bits)
    a, _ = _as_float_array(x)
    flat = a.reshape(-1)
    counts = dict.fromkeys(("exact", "underflow", "subnormal", "overflow", "nan"), 0)
    max_abs = max_rel = 0.0
    try:
        from . import _carith  # type: ignore[attr-defined]
    except ImportError:  # pragma: no cover - no compiler at install time
        _carith = None
    c = sink_carrier(flat.dtype, f, mode, srb) if use_c_analyze and _carith is not None else None
    if c is not None and hasattr(_carith, "analyze_sink"):
        return _analyze_fused(flat, f, mode, ov, bool(subnormals), rng, srb, c)
    # the compiled counts keep no temporaries: larger blocks (the NumPy reference keeps the small ones)
    step = _BLOCK * 4 if use_c_analyze and _carith is not None else _BLOCK
    threads = max_threads if max_threads is not None else min(os.cpu_count() or 1, 8)  # for the counts
    for i in range(0, flat.size, step):
        blk = flat[i : i + step]
        state = rng.bit_generator.state if mode is Rounding.SR and rng is not None else None
        r = _round_array(blk, f, mode, ov, bool(subnormals), rng, srb)
        ex, uf, sub, nan, beyond, err_abs, err_rel = _block_counts(blk, r, f, threads)
        counts["exact"] += ex
        counts["underflow"] += uf
        counts["subnormal"] += sub
        counts["nan"] += nan
        if beyond:  # finite inputs beyond max: only these can overflow (usually none)
            with np.errstate(invalid="ignore"):
                b = blk.astype(np.float64, copy=False)
            sel = np.isfinite(b) & (np.abs(b) > f.max)
            counts["overflow"] += int(np.count_nonzero(_overflows(blk, sel, f, mode, bool(subnormals), srb,
                                                                  rng, state)))
        max_abs = max(max_abs, err_abs)
        max_rel = max(max_rel, err_rel)
    return RoundingReport(
        format=f.name,
        rounding=mode.value,
        total=int(flat.size),
        exact=counts["exact"],
        inexact=int(flat.size) - counts["exact"],
        underflow=counts["underflow"],
        subnormal=counts["subnormal"],
        overflow=counts["overflow"],
        nan=counts["nan"],
        max_abs_error=max_abs,
        max_rel_error=max_rel,
    )


def _analyze_fused(flat: np.ndarray, f: Format, mode: Rounding, ov: Overflow, subnormals: bool,
                   rng: np.random.Generator | None, srb: int | None, c: _Carrier) -> RoundingReport:
    """`analyze` in one compiled pass: the kernel rounds block by block and hands each block to the counts of
    fpsim/_carith.c (``analyze_sink``) while it is in cache; no rounded array is stored. An input already in
    the carrier's dtype goes in one call (threads as ``max_threads``); another dtype a converted block at a
    time. Overflow needs the rounding with an unbounded exponent: only where some finite input lies beyond
    ``max`` (the counts say how many), a second pass over those blocks as the reference does."""
    from . import _carith  # type: ignore[attr-defined]

    state = rng.bit_generator.state if mode is Rounding.SR and rng is not None else None
    one_call = flat.dtype == c.ftype and flat.flags.c_contiguous
    step = max(flat.size, 1) if one_call else _BLOCK * 4
    ex = uf = sub = nan = beyond = 0
    max_abs = max_rel = 0.0
    for i in range(0, flat.size, step):
        blk = np.ascontiguousarray(flat[i : i + step], dtype=c.ftype)
        sink = _carith.analyze_sink(int(c.W == 32), float(f.min_normal), float(f.max))
        round_sink(blk, f, mode, ov, subnormals, rng, srb, sink)
        e1, u1, s1, n1, b1, ea, er = _carith.sink_result(sink)
        ex, uf, sub, nan, beyond = ex + e1, uf + u1, sub + s1, nan + n1, beyond + b1
        max_abs, max_rel = max(max_abs, ea), max(max_rel, er)
    overflow = 0
    if beyond:  # finite inputs beyond max (usually none): which of them overflow, block by block
        g = None
        if state is not None:  # a copy of the generator from the call's start, stepped past each block
            assert rng is not None
            g = np.random.Generator(copy.deepcopy(rng.bit_generator))
            g.bit_generator.state = state
        for i in range(0, flat.size, _BLOCK):  # _BLOCK is even: each block starts on a whole random word
            blk = flat[i : i + _BLOCK]
            with np.errstate(invalid="ignore"):
                b = blk.astype(np.float64, copy=False)
            sel = np.isfinite(b) & (np.abs(b) > f.max)
            st = g.bit_generator.state if g is not None else None
            if sel.any():
                overflow += int(np.count_nonzero(_overflows(blk, sel, f, mode, subnormals, srb, g, st)))
            if g is not None:
                _random_words(g, blk.size, c)
    n = int(flat.size)
    return RoundingReport(format=f.name, rounding=mode.value, total=n, exact=ex, inexact=n - ex, underflow=uf,
                          subnormal=sub, overflow=overflow, nan=nan, max_abs_error=max_abs, max_rel_error=max_rel)


use_c_analyze = True
"""Whether :func:`analyze` counts through the compiled loop of fpsim/_carith.c where it is built (set False
to force the NumPy reference in :func:`_block_counts`); the counts and maxima are the same."""


def _block_counts(blk: np.ndarray, r: np.ndarray, f: Format, threads: int = 1
                  ) -> tuple[int, int, int, int, int, float, float]:
    """For one block of inputs ``blk`` and their roundings ``r`` (float32 or float64): the exact, underflow,
    subnormal and NaN counts, how many finite inputs lie beyond ``f.max``, and the largest absolute and
    relative errors (in float64) over finite pairs. One compiled pass where fpsim/_carith.c is built; NumPy
    otherwise (the reference). ``threads``: how many threads the compiled pass may use (same results)."""
    try:
        from . import _carith  # type: ignore[attr-defined]
    except ImportError:  # pragma: no cover - no compiler at install time
        _carith = None
    if use_c_analyze and _carith is not None and blk.dtype in (np.float32, np.float64):
        dt = blk.dtype if r.dtype == blk.dtype else np.dtype(np.float64)  # both float32, or both float64
        src = np.ascontiguousarray(blk, dtype=dt).reshape(-1)
        rr = np.ascontiguousarray(r, dtype=dt).reshape(-1)
        res: tuple[int, int, int, int, int, float, float] = _carith.analyze_block(
            src, rr, int(dt == np.float32), float(f.min_normal), float(f.max), int(threads))
        return res
    r = r.astype(np.float64, copy=False)
    with np.errstate(invalid="ignore"):  # widening a signalling NaN warns; it stays NaN
        b = blk.astype(np.float64, copy=False)
    fin_in = np.isfinite(b)
    fin_out = np.isfinite(r)
    nz_in = fin_in & (b != 0)
    r_nan = np.isnan(r)
    ex = int(np.count_nonzero((r == b) | (r_nan & np.isnan(b))))
    uf = int(np.count_nonzero(nz_in & (r == 0)))
    sub = int(np.count_nonzero(fin_out & (r != 0) & (np.abs(r) < f.min_normal)))
    nan = int(np.count_nonzero(r_nan))
    beyond = int(np.count_nonzero(fin_in & (np.abs(b) > f.max)))
    max_abs = max_rel = 0.0
    ok = fin_in & fin_out
    if np.any(ok):
        err = np.abs(r[ok] - b[ok])
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # a subnormal b: rel may be inf
            rel = np.where(b[ok] != 0, err / np.abs(b[ok]), 0.0)
        max_abs = float(err.max())
        max_rel = float(rel.max())
    return ex, uf, sub, nan, beyond, max_abs, max_rel


def _overflows(blk: np.ndarray, sel: np.ndarray, f: Format, mode: Rounding, subnormals: bool,
               sr_bits: int | None, rng: np.random.Generator | None, state: Any) -> np.ndarray:
    """Which of ``blk[sel]`` overflow (IEEE 754 7.4): rounded as if the exponent range were unbounded,
    the result exceeds ``max``. The kernel's own rounding, with the overflow fix-up moved out to the
    carrier's limit; for SR the block's random words are drawn again from the saved generator state."""
    if f.table is not None:
        g = None
        if mode is Rounding.SR:
            assert rng is not None
            g = np.random.Generator(copy.deepcopy(rng.bit_generator))
            g.bit_generator.state = state
        over = np.zeros(blk.size, dtype=bool)
        with np.errstate(invalid="ignore", over="ignore"):
            _round_table(np.asarray(blk, dtype=np.float64).reshape(-1), f, mode, Overflow.IEEE, subnormals, g,
                         sr_bits, over)
        return np.asarray(over.reshape(blk.shape)[sel])
    c = _carrier_for(blk.dtype, f, mode, sr_bits)
    pl = replace(_plan(c, f, mode, Overflow.SATURATE, subnormals, sr_bits),
                 max_bits=c.bits_of(float(np.finfo(c.ftype).max)))
    rand = None
    if mode is Rounding.SR:
        assert rng is not None
        g = np.random.Generator(copy.deepcopy(rng.bit_generator))  # any BitGenerator type, no reseeding
        g.bit_generator.state = state
        rand = _random_words(g, blk.size, c)[sel]
    bits = np.ascontiguousarray(blk[sel], dtype=c.ftype).view(c.utype)
    with np.errstate(invalid="ignore", over="ignore"):
        v = np.asarray(_kernel(bits, pl, None, rand)).view(c.ftype).astype(np.float64)
    return np.asarray(np.abs(v) > f.max)


def _first_non_value(a: np.ndarray, fmt: Format) -> float | None:
    """The first element of ``a`` that is not a value of ``fmt`` (NaN counts as one), or None.

    The one check behind "these data must already be in the format" errors (GEMM inputs, scaled tensors).
    """
    r = np.asarray(round(a, fmt, "rne"), dtype=np.float64)
    with np.errstate(invalid="ignore"):
        bad = (r != a) & ~(np.isnan(r) & np.isnan(a))
    return float(a[bad].flat[0]) if bad.any() else None
