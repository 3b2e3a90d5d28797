"""An independent rounding oracle built on MPFR (gmpy2), written from the specification, not from fpsim.

MPFR rounds the exact float64 input to precision p with the format's exponent range
(``subnormalize=True``). Nearest-away and round-to-odd, which MPFR lacks, are decided from MPFR's two
directed neighbours and exact rational comparison. Format quirks that MPFR does not model (no infinity,
a reduced top binade as in OCP E4M3, no −0, no zero) are applied afterwards by the rules of the spec:
overflow is decided on the result rounded with an unbounded exponent range.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import gmpy2

import fpsim

_MODES = {
    "rne": gmpy2.RoundToNearest,
    "rtz": gmpy2.RoundToZero,
    "rup": gmpy2.RoundUp,
    "rdn": gmpy2.RoundDown,
    "away": gmpy2.RoundAwayZero,
}


def _ctx(fmt: fpsim.Format, mode: str, bounded: bool) -> gmpy2.context:
    # MPFR writes x = m * 2**e with m in [0.5, 1): IEEE exponent E is MPFR exponent E + 1.
    if bounded:
        return gmpy2.context(
            precision=fmt.p,
            emin=fmt.emin - fmt.mbits + 1,
            emax=fmt.emax + 1,
            subnormalize=True,
            round=_MODES[mode],
        )
    # Unbounded above (overflow is judged separately), IEEE-like gradual underflow below.
    return gmpy2.context(
        precision=fmt.p, emin=fmt.emin - fmt.mbits + 1, emax=4096, subnormalize=True, round=_MODES[mode]
    )


def _mpfr_round(x: float, fmt: fpsim.Format, mode: str) -> float:
    with _ctx(fmt, mode, bounded=False):
        return float(gmpy2.mpfr(x))


def _significand_is_odd(v: float, fmt: fpsim.Format) -> bool:
    if v == 0:
        return False
    a = abs(v)
    e = max(math.frexp(a)[1] - 1, fmt.emin)
    return int(Fraction(a) / Fraction(2) ** (e - fmt.mbits)) % 2 == 1


def round_unbounded(x: float, fmt: fpsim.Format, mode: str) -> float:
    """x rounded to p bits with the format's subnormal range but no upper exponent limit."""
    if mode in ("rne", "rtz", "rup", "rdn"):
        return _mpfr_round(x, fmt, mode)
    with _ctx(fmt, "rtz", bounded=False):
        lo_m = gmpy2.mpfr(x)
    with _ctx(fmt, "away", bounded=False):
        hi_m = gmpy2.mpfr(x)
    lo, hi = float(lo_m), float(hi_m)  # hi may exceed float64: it becomes inf, still "beyond max"
    if lo_m == x:
        return lo
    if mode == "rto":
        return lo if _significand_is_odd(lo, fmt) else hi
    if mode == "rna":
        dl = abs(Fraction(x) - Fraction(*lo_m.as_integer_ratio()))
        dh = abs(Fraction(*hi_m.as_integer_ratio()) - Fraction(x))
        return hi if dh <= dl else lo
    raise ValueError(mode)


def oracle_round(x: float, fmt: fpsim.Format, mode: str, overflow: str = "ieee", subnormals: bool = True) -> float:
    """The specified result of rounding float ``x`` into ``fmt``."""
    nan = float("nan")
    if math.isnan(x):
        return nan
    neg = math.copysign(1.0, x) < 0
    if not fmt.signed and fmt.has_zero:
        # ue5m3: the signed format's non-negative half; a negative nonzero result is out of range (IEEE 754
        # 5.8's rule for unsigned integers): NaN; -0 is +0.
        twin = dataclasses.replace(fmt, name=fmt.name + "_signed", signed=True, aliases=())
        r = oracle_round(x, twin, mode, overflow, subnormals)
        return nan if (math.isnan(r) or r < 0) else (0.0 if r == 0 else r)
    if not fmt.signed:
        # e8m0: positive values only, no zero; results below the smallest value clamp to it.
        if neg or x == 0:
            return nan
        if math.isinf(x):
            return nan if overflow == "ieee" else fmt.max
        r = round_unbounded(x, fmt, "rna" if mode == "rne" and fmt.p == 1 else mode)
        if r > fmt.max:
            return _overflow_result(mode, False, fmt, overflow)
        return max(r, fmt.min_normal)
    if math.isinf(x):
        if overflow == "saturate":
            return -fmt.max if neg else fmt.max
        v = math.inf if fmt.has_inf else (nan if fmt.has_nan else fmt.max)
        return -v if neg else v
    r = round_unbounded(x, fmt, mode)
    if abs(r) > fmt.max:
        return _overflow_result(mode, neg, fmt, overflow)
    if not subnormals or not fmt.subnormals:
        if 0 < abs(r) < fmt.min_normal:
            r = math.copysign(0.0, r)
    if r == 0 and not fmt.signed_zero:
        r = 0.0
    return r


def _overflow_result(mode: str, neg: bool, fmt: fpsim.Format, overflow: str) -> float:
    if overflow == "saturate":
        to_inf = False
    elif mode in ("rne", "rna", "sr"):
        to_inf = True
    elif mode in ("rtz", "rto"):
        to_inf = False
    elif mode == "rup":
        to_inf = not neg
    else:
        to_inf = neg
    if to_inf:
        if fmt.has_inf:
            v = math.inf
        elif fmt.has_nan:
            return float("nan")
        else:
            v = fmt.max
    else:
        v = fmt.max
    return -v if neg else v


def mpfr_bounded_ieee(x: float, fmt: fpsim.Format, mode: str) -> float:
    """MPFR with the format's full exponent range (overflow included): for IEEE formats with infinity."""
    with _ctx(fmt, mode, bounded=True):
        return float(gmpy2.mpfr(x))
