"""Hypothesis strategies for values, bit patterns and hard rounding cases of any fpsim format.

Named and shaped like :func:`hypothesis.strategies.floats`. Every strategy validates its arguments
when called and raises :class:`hypothesis.errors.InvalidArgument` for bad ones. This is the only
fpsim module that imports hypothesis.

>>> from hypothesis import given
>>> import fpsim.testing.strategies as fst
>>> @given(fst.from_format("bf16", allow_nan=False))
... def test_bf16_roundtrip(v):
...     import numpy as np, ml_dtypes
...     w = float(np.float64(v).astype(ml_dtypes.bfloat16))
...     assert w == v or (v != v and w != w)
>>> test_bf16_roundtrip()
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.extra import numpy as hnp

from ..bits import from_bits, ml_dtype, to_bits
from ..formats import Format, FormatLike, as_format
from ..rounding import Rounding, RoundingLike, as_rounding
from ..rounding import round as _round

__all__ = ["arrays", "bit_patterns", "from_format", "hard_cases"]


def _format(fmt: FormatLike) -> Format:
    try:
        return as_format(fmt)
    except (TypeError, ValueError) as e:
        raise InvalidArgument(str(e)) from None


def _bound(v: Any, name: str) -> float | None:
    if v is None:
        return None
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise InvalidArgument(f"{name}={v!r} must be a real number or None")
    fv = float(v)
    if math.isnan(fv):
        raise InvalidArgument(f"{name} must not be NaN")
    return fv


def _r(v: float, f: Format, mode: str) -> float:
    with np.errstate(invalid="ignore", over="ignore"):
        return float(_round(v, f, mode, overflow="saturate"))


def _lowest(f: Format) -> float:
    if f.signed:
        return -f.max
    return 0.0 if f.has_zero else f.min_normal


def _is_subnormal(v: float, f: Format) -> bool:
    return v != 0 and abs(v) < f.min_normal


def _finite_interval(f: Format, lo_in: float | None, hi_in: float | None) -> tuple[float, float] | None:
    """The smallest and largest finite values of ``f`` inside [lo_in, hi_in], or None if there are none."""
    lo = _lowest(f)
    hi = f.max
    if lo_in is not None and lo_in > -math.inf:
        if lo_in > f.max:
            return None
        lo = max(lo, _r(lo_in, f, "rup"))
        if lo == 0 and math.copysign(1.0, lo_in) > 0:
            lo = 0.0  # min_value=0.0 excludes -0.0, as in st.floats
    if hi_in is not None and hi_in < math.inf:
        if hi_in < _lowest(f):
            return None
        hi = min(hi, _r(hi_in, f, "rdn"))
    if math.isnan(lo) or math.isnan(hi) or lo > hi:
        return None
    return lo, hi


def _code_to_value(f: Format, k: int) -> float:
    """Value at signed grid position ``k`` (0 is +0, -1 the negative smallest value, ...)."""
    code = k if k >= 0 else (1 << (f.width - 1)) | -k
    return float(from_bits(code, f))


def _position(f: Format, v: float) -> int:
    """Signed grid position of a finite value of ``f`` (inverse of :func:`_code_to_value`)."""
    with np.errstate(over="ignore", invalid="ignore"):  # bits.to_bits can overflow internally for fp64
        code = int(to_bits(abs(v), f))
    return -code if v < 0 else code


def from_format(
    fmt: FormatLike,
    *,
    min_value: float | None = None,
    max_value: float | None = None,
    allow_nan: bool | None = None,
    allow_infinity: bool | None = None,
    allow_subnormal: bool | None = None,
) -> st.SearchStrategy[float]:
    """Values of ``fmt``, as Python floats (exact), shrinking toward simple values such as 0 and 1.

    Mirrors :func:`hypothesis.strategies.floats`: bounds are inclusive and need not be values of the
    format; ``allow_nan`` defaults to "the format has NaN and no bound is given"; ``allow_infinity`` to
    "the format has infinities and a side is unbounded"; ``allow_subnormal`` to "the format has
    subnormals and the bounds admit some". Asking for NaN, infinity or subnormals a format lacks raises
    ``InvalidArgument``. Draws mix simple floats rounded into the format, codes drawn uniformly (every
    binade, subnormals included) and edge values (0, ±min subnormal, ±min normal, ±max).

    >>> from hypothesis import given
    >>> import fpsim.testing.strategies as fst
    >>> @given(fst.from_format("fp8_e4m3", min_value=-1, max_value=1))
    ... def test_in_range(v):
    ...     assert -1 <= v <= 1
    >>> test_in_range()
    """
    f = _format(fmt)
    lo_in = _bound(min_value, "min_value")
    hi_in = _bound(max_value, "max_value")
    if lo_in is not None and hi_in is not None and lo_in > hi_in:
        raise InvalidArgument(f"min_value={lo_in!r} is greater than max_value={hi_in!r}")
    below_open = lo_in is None or lo_in == -math.inf
    above_open = hi_in is None or hi_in == math.inf
    if allow_nan is None:
        allow_nan = f.has_nan and lo_in is None and hi_in is None
    elif allow_nan:
        if not f.has_nan:
            raise InvalidArgument(f"allow_nan=True, but {f.name} has no NaN")
        if lo_in is not None or hi_in is not None:
            raise InvalidArgument("cannot have allow_nan=True together with min_value or max_value")
    if allow_infinity is None:
        allow_infinity = f.has_inf and (below_open or above_open)
    elif allow_infinity:
        if not f.has_inf:
            raise InvalidArgument(f"allow_infinity=True, but {f.name} has no infinity")
        if not (below_open or above_open):
            raise InvalidArgument("cannot have allow_infinity=True with both min_value and max_value finite")
    interval = _finite_interval(f, lo_in, hi_in)
    if interval is not None:
        lo, hi = interval
        top_sub = f.min_normal - f.min_subnormal  # largest subnormal
        admits_sub = f.min_subnormal < f.min_normal and (
            (lo <= top_sub and hi >= f.min_subnormal) or (f.signed and lo <= -f.min_subnormal and hi >= -top_sub)
        )
    else:
        admits_sub = False
    if allow_subnormal is None:
        allow_subnormal = admits_sub
    elif allow_subnormal:
        if not f.subnormals or f.min_subnormal == f.min_normal:
            raise InvalidArgument(f"allow_subnormal=True, but {f.name} has no subnormals")
        if not admits_sub:
            raise InvalidArgument(f"allow_subnormal=True, but no {f.name} subnormal lies in [{lo_in}, {hi_in}]")

    specials: list[float] = []
    if allow_nan:
        specials.append(math.nan)
    if allow_infinity:
        if above_open:
            specials.append(math.inf)
        if below_open and f.signed:
            specials.append(-math.inf)
    if interval is None:
        if not specials:
            raise InvalidArgument(f"no {f.name} value lies in [{lo_in}, {hi_in}]")
        return st.sampled_from(specials)

    keep_sub = bool(allow_subnormal)

    def ok(v: float) -> bool:
        return lo <= v <= hi and (keep_sub or not _is_subnormal(v, f))

    def into(v: float) -> float:
        return _r(v, f, "rtz")

    simple = st.floats(min_value=lo, max_value=hi, allow_nan=False, allow_infinity=False).map(into).filter(ok)
    uniform = st.integers(_position(f, lo), _position(f, hi)).map(lambda k: _code_to_value(f, k)).filter(ok)
    edges = [0.0, -0.0, f.min_subnormal, f.min_normal - f.min_subnormal, f.min_normal, 1.0, f.max]
    cands = [s * e for e in edges for s in (1.0, -1.0)]
    finite_specials = sorted({v for v in cands if ok(v) and _r(v, f, "rne") == v
                              and (f.signed_zero or math.copysign(1.0, v) > 0 or v != 0)},
                             key=lambda v: (abs(v), v))
    if not f.has_zero:
        finite_specials = [v for v in finite_specials if v != 0]
    extra = finite_specials + specials
    if extra:
        return st.one_of(simple, uniform, st.sampled_from(extra))
    return st.one_of(simple, uniform)


def bit_patterns(fmt: FormatLike) -> st.SearchStrategy[int]:
    """Every code of ``fmt`` (``0 .. 2**width - 1``) as a Python int, shrinking toward 0.

    >>> from hypothesis import given
    >>> import fpsim, fpsim.testing.strategies as fst
    >>> @given(fst.bit_patterns("fp8_e5m2"))
    ... def test_decode(code):
    ...     fpsim.from_bits(code, "fp8_e5m2")
    >>> test_decode()
    """
    f = _format(fmt)
    return st.integers(0, (1 << f.width) - 1)


_NEAREST = (Rounding.RNE, Rounding.RNA)


def _boundary_edges(f: Format, mode: Rounding) -> list[float]:
    """Magnitudes on rounding boundaries at the edges of the range: around zero, the subnormal/normal
    seam and the overflow threshold."""
    sub = f.min_subnormal
    top_gap = float(f.ulp(f.max))
    out = [sub, f.min_normal, f.max, f.max + top_gap]
    nearest = mode in _NEAREST or mode is Rounding.SR
    if f.has_zero:
        out += [0.0, sub / 2] if nearest else [0.0]
    if nearest:
        out += [f.max + top_gap / 2, f.min_normal + float(f.ulp(f.min_normal)) / 2]
        if sub < f.min_normal:
            out.append(f.min_normal - sub / 2)
    return out


def hard_cases(fmt: FormatLike, rounding: RoundingLike = "rne", *, width: int = 64) -> st.SearchStrategy[float]:
    """Inputs on or next to the rounding boundaries of ``fmt`` under ``rounding``, as Python floats.

    For the nearest modes the boundaries are the ties (midpoints between neighbouring values); for the
    directed modes and round-to-odd they are the values themselves; stochastic rounding gets both.
    Each draw is a boundary or one carrier ulp either side of it (the carrier is float64, or float32
    with ``width=32``), taken either from anywhere in the range (both signs, subnormals included) or
    from the edges: the ties around zero and the smallest subnormal, the subnormal/normal seam and the
    overflow threshold (``max + ulp(max)/2`` for nearest modes).

    >>> from hypothesis import given
    >>> import numpy as np, fpsim.testing as ft, fpsim.testing.strategies as fst
    >>> @given(fst.hard_cases("fp16"))
    ... def test_numpy_half(x):
    ...     with np.errstate(over="ignore"):       # the overflow threshold is among the cases
    ...         y = np.float16(x)
    ...     ft.assert_rounded(y, x, "fp16")
    >>> test_numpy_half()
    """
    f = _format(fmt)
    try:
        mode = as_rounding(rounding)
    except (TypeError, ValueError) as e:
        raise InvalidArgument(str(e)) from None
    if isinstance(width, bool) or width not in (32, 64):
        raise InvalidArgument(f"width must be 32 or 64, got {width!r}")
    ctype: type[np.floating[Any]] = np.float32 if width == 32 else np.float64
    if width == 32 and not f.fits_float32:
        raise InvalidArgument(f"{f.name} values are not all float32; use width=64")

    def exact(v: float) -> bool:
        with np.errstate(over="ignore"):
            return bool(np.isfinite(v)) and float(ctype(v)) == v

    def nudge(v: float, k: int) -> float:
        c = ctype(v)
        if k:
            c = np.nextafter(c, ctype(math.copysign(math.inf, k)))
        return float(c)

    edge_set: set[float] = set()
    for m in _boundary_edges(f, mode):
        if not exact(m):
            continue
        for s in (1.0, -1.0) if f.signed else (1.0,):
            for k in (0, 1, -1):
                v = nudge(s * m, k)
                if math.isfinite(v):
                    edge_set.add(v)
    edges = sorted(edge_set, key=lambda v: (abs(v), v))

    def boundary(v: float, tie: bool, k: int) -> float:
        a = abs(v)
        nxt = a + float(f.ulp(a))
        b = (a + nxt) / 2 if tie else a
        if not exact(b):
            b = a
        b = math.copysign(b, v)
        return nudge(b, k)

    if mode in _NEAREST:
        ties = st.just(True)
    elif mode is Rounding.SR:
        ties = st.booleans()
    else:
        ties = st.just(False)
    anywhere = st.builds(
        boundary,
        from_format(f, allow_nan=False, allow_infinity=False),
        ties,
        st.sampled_from([0, 1, -1]),
    ).filter(math.isfinite)
    return st.one_of(anywhere, st.sampled_from(edges))


def arrays(
    fmt: FormatLike,
    shape: int | tuple[int, ...] | st.SearchStrategy[tuple[int, ...]],
    *,
    elements: st.SearchStrategy[float] | None = None,
    dtype: Any = None,
    unique: bool = False,
) -> st.SearchStrategy[np.ndarray]:
    """NumPy arrays of values of ``fmt``.

    ``dtype`` picks the container: float64 carriers by default, ``numpy.float32`` (formats whose values
    are all float32), or the format's own ml_dtypes type (e.g. ``ml_dtypes.bfloat16``). ``elements``
    defaults to :func:`from_format` of ``fmt``.

    >>> from hypothesis import given
    >>> import ml_dtypes, fpsim.testing.strategies as fst
    >>> @given(fst.arrays("bf16", (2, 3), dtype=ml_dtypes.bfloat16))
    ... def test_shape(a):
    ...     assert a.shape == (2, 3) and a.dtype == ml_dtypes.bfloat16
    >>> test_shape()
    """
    f = _format(fmt)
    elems = from_format(f) if elements is None else elements
    if dtype is None:
        return hnp.arrays(np.float64, shape, elements=elems, unique=unique)
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise InvalidArgument(f"dtype={dtype!r} is not a dtype") from None
    if dt == np.float64:
        return hnp.arrays(np.float64, shape, elements=elems, unique=unique)
    if dt == np.float32:
        if not f.fits_float32:
            raise InvalidArgument(f"{f.name} values are not all float32; use float64 or the ml_dtypes type")
        return hnp.arrays(np.float32, shape, elements=elems, unique=unique)
    try:
        own = ml_dtype(f)
    except ValueError:
        own = None
    if own is None or dt != own:
        raise InvalidArgument(f"dtype must be float64, float32 or {own if own is not None else 'none'} for "
                              f"{f.name}, got {dt}")
    return hnp.arrays(np.float64, shape, elements=elems, unique=unique).map(lambda a: a.astype(dt))
