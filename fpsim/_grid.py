"""A format's grid of values: enumeration, spacing and neighbours (the work behind ``Format.values``,
``Format.ulp``, ``Format.next_up`` and ``Format.next_down``).

`Format` is data and derivations; these operations read input, round and decode codes, so they live here, at
the top of the foundation, and the `Format` methods call them (a convenience import inside each method body:
``formats`` imports nothing of fpsim at module level but ``_fpenv`` and ``_names``).

Where it sits (the foundation is a line; each module imports only those before it)::

    _names, _checks, _fpenv  ->  formats  ->  _interop  ->  _carrier  ->  _exact  ->  rounding  ->  bits  ->  _grid

>>> import fpsim
>>> values(fpsim.fp4_e2m1).tolist()[7:]
[0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
>>> float(neighbour(fpsim.bf16, 1.0, up=True))
1.0078125
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._carrier import as_float_array
from .bits import from_bits
from .formats import Format
from .rounding import round as _round
from .rounding import table_grid

__all__ = ["float_input", "values", "ulp", "lowest", "neighbour", "ulp_below"]


def float_input(x: Any) -> np.ndarray:
    """``x`` as float64 by the one input rule of the rounding layer (kinds, exactness, byte order)."""
    a, _ = as_float_array(x)
    with np.errstate(invalid="ignore"):  # widening a signalling NaN warns; it stays NaN
        return np.asarray(a, dtype=np.float64)


def values(fmt: Format, *, finite: bool = True) -> np.ndarray:
    """Every distinct value of ``fmt`` in ascending order (formats of up to 16 bits): `Format.values`."""
    if fmt.width > 16:
        raise ValueError(f"values() enumerates formats of up to 16 bits; {fmt.name} has {fmt.width}")
    v = from_bits(np.arange(1 << fmt.width, dtype=np.uint32), fmt)
    v = v[~np.isnan(v)]
    if finite:
        v = v[np.isfinite(v)]
    return np.unique(v + 0.0)  # +0.0 folds -0 into 0


def ulp(fmt: Format, x: Any) -> Any:
    """Spacing of ``fmt`` at ``x``: `Format.ulp`."""
    a = np.abs(float_input(x))
    fin = np.isfinite(a)
    a = np.where(fin, a, 1.0)  # frexp of inf/NaN is meaningless; replaced by NaN below
    if fmt.table is not None:  # tapered: the gap of the grid interval holding |x| (the last one beyond max)
        v, _ = table_grid(fmt)
        i = np.clip(np.searchsorted(v, a, side="right") - 1, 0, v.size - 2)
        t = np.where(fin, v[i + 1] - v[i], np.nan)
        return t[()] if t.ndim == 0 else t
    with np.errstate(divide="ignore"):
        e = np.where(a > 0, np.frexp(a)[1] - 1, fmt.emin)
    e = np.clip(e, fmt.emin, fmt.emax)
    out = np.ldexp(1.0, (e - fmt.mbits).astype(np.int32))
    if not fmt.subnormals:
        out = np.where(a < fmt.min_normal, fmt.min_normal, out)
    out = np.where(fin, out, np.nan)
    return out[()] if out.ndim == 0 else out


def lowest(fmt: Format) -> float:
    """The least value: ``-max``, or for an unsigned format 0 (or ``min_normal`` without zero)."""
    if fmt.signed:
        return -fmt.max
    return 0.0 if fmt.has_zero else fmt.min_normal


def neighbour(fmt: Format, x: Any, *, up: bool) -> Any:
    """nextUp (``up``) or nextDown of ``x`` in ``fmt``: one walk, the direction ``d`` = +1 or -1
    (`Format.next_up`, `Format.next_down`)."""
    xa = float_input(x)
    d = 1.0 if up else -1.0
    lo, hi = lowest(fmt), fmt.max
    if up:  # beyond max: +inf, or NaN where no value is greater
        mid = (xa >= lo) & (xa < hi)  # False for NaN
        r = np.where(xa < lo, lo, np.where(xa >= hi, np.inf if fmt.has_inf else np.nan, np.nan))
    else:  # below the least value: -inf, or NaN where no value is less
        mid = (xa > lo) & (xa <= hi)
        r = np.where(xa > hi, hi, np.where(xa <= lo, -np.inf if (fmt.has_inf and fmt.signed) else np.nan,
                                           np.nan))
    if np.any(mid) and fmt.table is not None:  # tapered: the next value in the sorted grid
        v, _ = table_grid(fmt)
        w = np.concatenate([-v[-2:0:-1], v[:-1]])  # every finite value, ascending (0 once)
        xm = xa[mid]
        r[mid] = w[np.searchsorted(w, xm, side="right")] if up else w[np.searchsorted(w, xm, side="left") - 1]
    elif np.any(mid):
        xm = xa[mid]
        rm = np.asarray(_round(xm, fmt, "rup" if up else "rdn", overflow="saturate"), dtype=np.float64)
        same = rm == xm
        if np.any(same):  # x is a value: one step in direction d (away from zero: ulp; toward: ulp below)
            rs = rm[same]
            away = (d * rs > 0) | (rs == 0)
            step = np.where(away, fmt.ulp(rs), ulp_below(fmt, np.abs(rs)))
            bumped = np.asarray(_round(rs + d * step, fmt, "rne"), dtype=np.float64)
            rm[same] = np.where(rs == 0, d * fmt.min_subnormal, bumped)
        if not fmt.subnormals:  # round() flushes after rounding; the format simply has no values there
            tiny = (xm != 0) & (np.abs(xm) < fmt.min_normal)
            rm[tiny] = np.where(d * xm[tiny] > 0, d * fmt.min_normal, 0.0)
        r[mid] = rm
    return r[()] if r.ndim == 0 else r


def ulp_below(fmt: Format, a: np.ndarray) -> np.ndarray:
    """Gap between positive representable ``a`` and its lower neighbour in ``fmt``."""
    m, e = np.frexp(a)
    is_pow2 = (m == 0.5) & (e - 1 > fmt.emin)
    u = np.asarray(fmt.ulp(a), dtype=np.float64)
    return np.where(is_pow2, u / 2, u)
