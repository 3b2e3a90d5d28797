"""Assertions for testing other code against fpsim: is this cast, quantizer or GEMM rounded exactly right?

Use these in your own test suite to check a kernel (a CUDA bf16 cast, an FP8 quantizer, a GEMM) against
fpsim's single, correctly rounded result. Inputs may be NumPy or ml_dtypes arrays, Python numbers, torch
tensors (any float dtype, any device), CuPy, JAX, or anything exposing ``__array__`` or DLPack; every
value is widened exactly to float64 before comparison, so nothing is rounded on the way. Device arrays
(CUDA tensors, CuPy, JAX on GPU) are copied to the host here, unlike fpsim's computing entry points, which
refuse them: an assertion returns no array, and checking a GPU kernel's output is what it is for.

Failures explain themselves: how many elements differ, and for the first few the index, the input in
decimal and hex, the expected and actual values with their bit fields and codes, the distance in ulps of
the format, and a hint when the mismatch matches a known defect (double rounding through float32, ties
away instead of to even, flush-to-zero, saturation instead of overflow, truncation, ...).

:func:`identify_accumulator` goes the other way: from rows measured on some matrix unit (random data will do)
to the block-FMA models (:class:`fpsim.mma.MMAModel`) that reproduce every one of them, and the first row
that rules out each other hypothesis.

This module never imports hypothesis; the strategies live in :mod:`fpsim.testing.strategies`.

>>> import numpy as np, fpsim.testing as ft
>>> x = np.array([1.0, 1 + 2**-8, 3.14159])
>>> ft.assert_rounded(np.array([1.0, 1.0, 3.140625]), x, "bf16")
>>> float(ft.ulp_distance(1.0078125, 1.0, "bf16"))
1.0
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .._fpenv import ieee_mode
from .._interop import returns_input_kind
from ..bits import bits_str, to_bits
from ..formats import Format, FormatLike, as_format, bf16, fp16, fp32
from ..rounding import Overflow, Rounding, RoundingLike, as_overflow, as_rounding
from ..rounding import round as _round
from ._convert import to_float64
from .reveal import reveal_dot_order, reveal_order
from .vectors import write_gemm_vectors, write_vectors

if TYPE_CHECKING:
    from ._identify import Identification, Rejection, candidate_space, identify_accumulator

# identify_accumulator needs the matrix units (fpsim.mma): loaded on first use, so the assertions stay light.
_IDENTIFY = frozenset({"Identification", "Rejection", "candidate_space", "identify_accumulator"})

__all__ = [
    "Identification",
    "Rejection",
    "assert_matmul_matches",
    "assert_rounded",
    "assert_same_bits",
    "assert_ulp_close",
    "candidate_space",
    "identify_accumulator",
    "reveal_dot_order",
    "reveal_order",
    "write_gemm_vectors",
    "write_vectors",
    "ulp_distance",
]

_SHOWN = 5  # mismatching elements described in full in a failure message


# --------------------------------------------------------------------------------------------------
# Codes and ordinals


def _bits(v: Any, f: Format) -> np.ndarray:
    # bits.to_bits evaluates both branches of a np.where; the unused one can overflow for fp64.
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(to_bits(v, f), dtype=np.uint64)


def _representable(v: np.ndarray, f: Format) -> np.ndarray:
    """Which float64 values are exactly values of ``f`` (NaN only if ``f`` has NaN, ±inf only if it has inf)."""
    with np.errstate(invalid="ignore", over="ignore"):
        r = np.asarray(_round(v, f, "rne"), dtype=np.float64)
    nan = np.isnan(v)
    ok = (r == v) & ~nan
    if f.has_nan:
        ok |= nan
    if not f.has_inf:
        ok &= ~np.isinf(v)
    return np.asarray(ok)


def _codes(v: np.ndarray, f: Format) -> tuple[np.ndarray, np.ndarray]:
    """(codes as uint64, representable mask); codes of unrepresentable values are 0."""
    rep = _representable(v, f)
    safe = np.where(rep, v, 0.0 if f.has_zero else f.min_normal)
    codes = _bits(safe, f).reshape(v.shape)
    return np.where(rep, codes, np.uint64(0)), rep


def _same(a: np.ndarray, b: np.ndarray, f: Format) -> np.ndarray:
    """Elementwise: do ``a`` and ``b`` encode the same value of ``f``? NaN equals NaN; −0 ≠ +0 where
    the format has −0; values the format cannot hold only match an identical float."""
    fast = ((a == b) & (np.signbit(a) == np.signbit(b))) | (np.isnan(a) & np.isnan(b))
    out: np.ndarray = np.array(fast, dtype=bool)
    rest = ~out
    if np.any(rest):
        ca, ra = _codes(a[rest], f)
        cb, rb = _codes(b[rest], f)
        out[rest] = ra & rb & (ca == cb)
    return out


def _magnitude_codes(lo: np.ndarray, f: Format) -> np.ndarray:
    """Codes (sign bit clear) of nonnegative finite values of ``f``, as int64.

    Codes of sign-magnitude formats grow by one from each value to the next, so they count grid steps.
    """
    return _bits(lo, f).reshape(np.shape(lo)).astype(np.int64)


def _ordinal(v: np.ndarray, f: Format) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Position of ``v`` on the format's grid, counted from zero: (integer part, fraction, extra).

    The integer part is the signed index of the largest-magnitude value of ``f`` not beyond ``|v|``
    (consecutive values differ by one, across zero and the subnormals); the fraction says how far
    ``v`` lies past it in units of the local spacing; ``extra`` is ±inf for infinities the format
    cannot hold (0 elsewhere).
    """
    nan = np.isnan(v)
    av = np.where(nan, 0.0, np.abs(v))
    inf = np.isinf(av)
    fin = np.where(inf, f.max, av)
    with np.errstate(invalid="ignore", over="ignore"):
        lo = np.asarray(_round(fin, f, "rtz", overflow="saturate"), dtype=np.float64)
    lo = np.where(np.isnan(lo), f.min_normal, lo)  # unsigned formats without zero: 0 -> NaN
    whole = _magnitude_codes(lo, f)
    frac = np.zeros(v.shape)
    off = fin != lo
    if np.any(off):
        lo_off = lo[off]
        # in units of the spacing above lo (the difference is exact below the format's maximum, by
        # Sterbenz); the quotient overflows to inf only for float64 values far beyond a narrow format
        with np.errstate(over="ignore"):
            frac[off] = (fin[off] - lo_off) / f.ulp(lo_off)
    extra = np.zeros(v.shape)
    if np.any(inf):
        if f.has_inf:
            whole = np.where(inf, whole + 1, whole)
        else:
            extra = np.where(inf, np.inf, 0.0)
    neg = np.signbit(v) & ~nan
    whole = np.where(neg, -whole, whole)
    frac = np.where(neg, -frac, frac)
    extra = np.where(neg, -extra, extra)
    return whole, frac, extra


@ieee_mode
@returns_input_kind(dtype_option=False)
def ulp_distance(a: Any, b: Any, fmt: FormatLike) -> Any:
    """Signed distance ``a - b`` in units of the spacing of ``fmt``, counted across zero and subnormals.

    Between two values of the format the result is an integer: the number of steps from ``b`` to
    ``a`` along the format's grid (so −0 and +0 are 0 apart, and the smallest subnormals of either
    sign are 2 apart). Values between grid points give a fractional part measured in the local spacing;
    values beyond the largest finite value continue the top binade's spacing. Infinity is one step past
    the largest finite value in formats with infinities (``inf`` otherwise). NaN gives NaN.

    Parameters
    ----------
    a, b : array_like
        Values (NumPy, ml_dtypes, torch, ...), broadcast against each other.
    fmt : Format or str
        The format whose grid counts the distance.

    Returns
    -------
    numpy.ndarray or numpy.float64
        ``a - b`` in ulps, as float64.

    Examples
    --------
    >>> import fpsim.testing as ft
    >>> float(ft.ulp_distance(1.0, 1.0078125, "bf16"))
    -1.0
    >>> float(ft.ulp_distance(2.0**-9, -(2.0**-9), "fp8_e4m3"))   # smallest subnormals of either sign
    2.0
    >>> float(ft.ulp_distance(1.0 + 2**-8, 1.0, "bf16"))        # half way to the next bf16
    0.5
    """
    f = as_format(fmt)
    va, _ = to_float64(a, "a")
    vb, _ = to_float64(b, "b")
    scalar = va.ndim == 0 and vb.ndim == 0
    va, vb = np.broadcast_arrays(va, vb)
    wa, fa, ea = _ordinal(va, f)
    wb, fb, eb = _ordinal(vb, f)
    with np.errstate(over="ignore"):
        d_int = wa - wb  # may wrap only for far-apart fp64 values of opposite sign
    approx = wa.astype(np.float64) - wb.astype(np.float64)
    d = np.where(np.abs(approx) > 2.0**62, approx, d_int.astype(np.float64)) + (fa - fb)
    if np.any(ea != 0) or np.any(eb != 0):
        with np.errstate(invalid="ignore"):
            d = np.where((ea != 0) | (eb != 0), np.where(ea == eb, 0.0, ea - eb), d)
    d = np.where(np.isnan(va) | np.isnan(vb), np.nan, d)
    return d[()] if scalar else d


# --------------------------------------------------------------------------------------------------
# Describing values in failure messages


def _hexw(f: Format) -> int:
    return (f.width + 3) // 4


def _show_value(v: float, f: Format) -> str:
    """``1.0078125 = 0 01111111 0000001 (0x3f81)``, or a note when ``v`` is not a value of ``f``."""
    arr = np.array([v])
    if not bool(_representable(arr, f)[0]):
        extra = f"{v.hex()}, " if np.isfinite(v) else ""
        return f"{v!r} ({extra}not a {f.name} value)"
    if np.isnan(v):
        code = int(_bits(arr, f)[0])
        return f"nan ({f.name} NaN, canonical code 0x{code:0{_hexw(f)}x})"
    with np.errstate(over="ignore", invalid="ignore"):
        fields = str(bits_str(float(v), f))
    code = int(_bits(arr, f)[0])
    return f"{float(v)!r} = {fields} (0x{code:0{_hexw(f)}x})"


def _show_input(v: float, src: np.dtype) -> str:
    if np.isnan(v) or np.isinf(v):
        return repr(float(v))
    if src == np.float32:
        return f"{np.float32(v)} ({float(v).hex()}, float32)"  # shortest float32 decimal
    return f"{float(v)!r} ({float(v).hex()})"


def _index(flat_i: int, shape: tuple[int, ...]) -> str:
    if len(shape) <= 1:
        return f"[{flat_i}]"
    return str(tuple(int(i) for i in np.unravel_index(flat_i, shape)))


def _fmt_ulps(d: float) -> str:
    if np.isnan(d):
        return "n/a"
    if d == int(d) and abs(d) < 2**53:
        return f"{int(d):+d}"
    return f"{d:+.4g}"


# --------------------------------------------------------------------------------------------------
# Known defect classes


_Hint = tuple[str, Callable[[np.ndarray], np.ndarray]]


def _hints(x: np.ndarray, f: Format, mode: Rounding, ov: Overflow, subnormals: bool,
           expected: np.ndarray) -> list[_Hint]:
    """Alternative (wrong) results of known defect classes, as (description, x -> result) pairs."""

    def rnd(v: np.ndarray, g: Format = f, m: Rounding = mode, o: Overflow = ov, s: bool = subnormals) -> np.ndarray:
        with np.errstate(invalid="ignore", over="ignore"):
            return np.asarray(_round(v, g, m, overflow=o, subnormals=s), dtype=np.float64)

    def through(mid: Format) -> Callable[[np.ndarray], np.ndarray]:
        return lambda v: rnd(rnd(v, mid, Rounding.RNE, Overflow.IEEE, True))

    out: list[_Hint] = []
    nearest = mode in (Rounding.RNE, Rounding.RNA)
    # Double rounding: first to a wider intermediate (the default conversion of many libraries), then to f.
    for mid, label in ((fp32, "float32"), (bf16, "bfloat16"), (fp16, "float16")):
        if mid.p > f.p and (mid is fp32 or f.width <= 8):
            out.append((
                f"double rounding through {label} (actual == round(round(x, {label}), {f.name}))",
                through(mid),
            ))
    # Range-edge defects before the generic ones: they only ever fire at the edges, so they are the
    # more specific explanation when counts tie.
    if ov is Overflow.IEEE:
        out.append(("saturation to ±max instead of overflow", lambda v: rnd(v, o=Overflow.SATURATE)))
    else:
        out.append(("overflow (inf/NaN) instead of saturation to ±max", lambda v: rnd(v, o=Overflow.IEEE)))
    if subnormals and f.subnormals:
        out.append(("flush-to-zero: subnormal result flushed to zero", lambda v: rnd(v, s=False)))
    out.append(("sign of zero lost", lambda v: np.where(expected == 0, -expected, np.nan)))
    if mode is Rounding.RNE:
        out.append(("ties rounded away from zero instead of to even", lambda v: rnd(v, m=Rounding.RNA)))
    if mode is Rounding.RNA:
        out.append(("ties rounded to even instead of away from zero", lambda v: rnd(v, m=Rounding.RNE)))
    if mode is not Rounding.RTZ:
        out.append(("truncation (rounded toward zero)", lambda v: rnd(v, m=Rounding.RTZ)))
    if nearest:
        out.append(("rounded toward +inf (ceiling)", lambda v: rnd(v, m=Rounding.RUP)))
        out.append(("rounded toward -inf (floor)", lambda v: rnd(v, m=Rounding.RDN)))
    out.append(("not rounded at all (actual equals the input)", lambda v: v))
    return out


def _match_hints(actual: np.ndarray, x: np.ndarray, expected: np.ndarray, f: Format, mode: Rounding,
                 ov: Overflow, subnormals: bool) -> tuple[list[list[str]], list[str]]:
    """For each mismatching element, the known defect classes its actual value is explained by; and all
    the classes checked, most specific first."""
    found: list[list[str]] = [[] for _ in range(actual.size)]
    checked = _hints(x, f, mode, ov, subnormals, expected)
    for text, alt in checked:
        cand = alt(x)
        # Only a candidate that differs from the correct result explains anything.
        hit = _same(actual, cand, f) & ~_same(cand, expected, f)
        for i in np.flatnonzero(hit):
            found[int(i)].append(text)
    return found, [t for t, _ in checked]


# --------------------------------------------------------------------------------------------------
# Assertions


def _pair(a: Any, b: Any, na: str, nb: str) -> tuple[np.ndarray, np.ndarray, np.dtype, np.dtype]:
    va, sa = to_float64(a, na)
    vb, sb = to_float64(b, nb)
    if va.shape != vb.shape:
        if va.ndim == 0 or vb.ndim == 0:
            va, vb = np.broadcast_arrays(va, vb)
        else:
            raise AssertionError(f"shape mismatch: {na} has shape {va.shape}, {nb} has shape {vb.shape}")
    return va, vb, sa, sb


@ieee_mode
def assert_rounded(
    actual: Any,
    x: Any,
    fmt: FormatLike,
    *,
    rounding: RoundingLike = "rne",
    overflow: Overflow | str = "ieee",
    subnormals: bool = True,
    err_msg: str = "",
) -> None:
    """Assert that ``actual`` is exactly ``x`` rounded once into ``fmt``.

    The expected result is :func:`fpsim.round` of the exact input (never through an intermediate
    format). Values are compared as codes of ``fmt``: NaN matches any NaN, −0 differs from +0 where
    the format has −0, and a value the format cannot hold never matches. For ``rounding="sr"`` each
    element must be one of the two neighbours of ``x`` (round down or round up).

    Parameters
    ----------
    actual : array_like
        What the code under test produced (any float dtype: float32 carriers, ml_dtypes arrays, torch
        tensors of bfloat16/float8, ...).
    x : array_like
        The inputs it was given (same shape, or a scalar).
    fmt : Format or str
        The target format.
    rounding, overflow, subnormals
        As in :func:`fpsim.round`.
    err_msg : str
        Extra text for the failure message.

    Raises
    ------
    AssertionError
        With the count of differing elements and, for the first few, the index, the input (decimal
        and hex), the expected and actual values with bit fields and codes, the ulp distance and a hint
        naming a known defect class the mismatch matches.

    Examples
    --------
    >>> import numpy as np, ml_dtypes, fpsim.testing as ft
    >>> x = np.array([1 + 2**-8 + 2**-30])            # just above a bf16 tie
    >>> ft.assert_rounded(x.astype(np.float32).astype(ml_dtypes.bfloat16), x, "bf16")
    Traceback (most recent call last):
    ...
    AssertionError: not correctly rounded to bf16 (rounding=rne, overflow=ieee, subnormals=True)
    Mismatched elements: 1 / 1 (100%)
    Likely cause: double rounding through float32 (actual == round(round(x, float32), bf16)) (1 of 1)
    Also consistent with: truncation (rounded toward zero) (1); rounded toward -inf (floor) (1)
    Mismatch:
      [0] x = 1.0039062509313226 (0x1.0100000400000p+0)
          expected 1.0078125 = 0 01111111 0000001 (0x3f81)
          actual   1.0 = 0 01111111 0000000 (0x3f80)
          ulp distance -1; hint: double rounding through float32 (actual == round(round(x, float32), bf16))
    """
    f = as_format(fmt)
    mode = as_rounding(rounding)
    ov = as_overflow(overflow)
    if not isinstance(subnormals, (bool, np.bool_)):
        raise TypeError(f"subnormals must be a bool, got {subnormals!r}")
    act, xv, _, xsrc = _pair(actual, x, "actual", "x")

    def rnd(m: Rounding) -> np.ndarray:
        with np.errstate(invalid="ignore", over="ignore"):
            r = _round(xv, f, m, overflow=ov, subnormals=bool(subnormals))
        return np.asarray(r, dtype=np.float64).reshape(xv.shape)

    if mode is Rounding.SR:
        lo, hi = rnd(Rounding.RDN), rnd(Rounding.RUP)
        ok = _same(act, lo, f) | _same(act, hi, f)
        expected = lo
    else:
        expected = rnd(mode)
        ok = _same(act, expected, f)
    if bool(np.all(ok)):
        return

    bad = np.flatnonzero(~ok.reshape(-1))
    n_bad, n = bad.size, ok.size
    a_bad = act.reshape(-1)[bad]
    x_bad = xv.reshape(-1)[bad]
    e_bad = expected.reshape(-1)[bad]
    hints: list[list[str]] = [[] for _ in range(n_bad)]
    priority: list[str] = []
    if mode is not Rounding.SR:
        hints, priority = _match_hints(a_bad, x_bad, e_bad, f, mode, ov, bool(subnormals))
    dist = np.atleast_1d(np.asarray(ulp_distance(a_bad, e_bad, f), dtype=np.float64))

    lines = [(f"not correctly rounded to {f.name} (rounding={mode.value}, overflow={ov.value}, "
              f"subnormals={bool(subnormals)})")]
    if err_msg:
        lines.append(err_msg)
    lines.append(f"Mismatched elements: {n_bad} / {n} ({100 * n_bad / n:.3g}%)")
    order = {h: i for i, h in enumerate(priority)}
    counts: dict[str, int] = {}
    for hs in hints:
        for h in hs:
            counts[h] = counts.get(h, 0) + 1
    ranked = [h for h, _ in sorted(counts.items(), key=lambda kv: (-kv[1], order[kv[0]]))]
    if ranked:
        lines.append(f"Likely cause: {ranked[0]} ({counts[ranked[0]]} of {n_bad})")
        if len(ranked) > 1:
            lines.append("Also consistent with: " + "; ".join(f"{h} ({counts[h]})" for h in ranked[1:]))
    lines.append("First mismatches:" if n_bad > 1 or n > 1 else "Mismatch:")
    for j in range(min(n_bad, _SHOWN)):
        lines.append(f"  {_index(int(bad[j]), act.shape)} x = {_show_input(float(x_bad[j]), xsrc)}")
        if mode is Rounding.SR:
            hi_j = float(hi.reshape(-1)[bad[j]])
            lines.append(f"      expected {_show_value(float(e_bad[j]), f)}  or  {_show_value(hi_j, f)}")
        else:
            lines.append(f"      expected {_show_value(float(e_bad[j]), f)}")
        lines.append(f"      actual   {_show_value(float(a_bad[j]), f)}")
        tail = f"ulp distance {_fmt_ulps(float(dist[j]))}"
        best = [h for h in ranked if h in hints[j]]
        if best:
            tail += f"; hint: {best[0]}"
        lines.append("      " + tail)
    if n_bad > _SHOWN:
        lines.append(f"  ... and {n_bad - _SHOWN} more")
    raise AssertionError("\n".join(lines))


def _report_pairs(title: str, err_msg: str, act: np.ndarray, exp: np.ndarray, ok: np.ndarray, f: Format,
                  dist: np.ndarray | None) -> str:
    bad = np.flatnonzero(~ok.reshape(-1))
    n_bad, n = bad.size, ok.size
    lines = [title]
    if err_msg:
        lines.append(err_msg)
    lines.append(f"Mismatched elements: {n_bad} / {n} ({100 * n_bad / n:.3g}%)")
    if dist is not None:
        d = np.abs(dist.reshape(-1)[bad])
        d = d[~np.isnan(d)]
        if d.size:
            lines.append(f"Max ulp distance: {_fmt_ulps(float(d.max())).lstrip('+')}")
    lines.append("First mismatches:")
    for j in bad[:_SHOWN]:
        lines.append(f"  {_index(int(j), act.shape)} actual   {_show_value(float(act.reshape(-1)[j]), f)}")
        lines.append(f"  {' ' * len(_index(int(j), act.shape))} expected {_show_value(float(exp.reshape(-1)[j]), f)}")
        if dist is not None:
            lines.append(f"  {' ' * len(_index(int(j), act.shape))} ulp distance {_fmt_ulps(float(dist.reshape(-1)[j]))}")
    if n_bad > _SHOWN:
        lines.append(f"  ... and {n_bad - _SHOWN} more")
    return "\n".join(lines)


@ieee_mode
def assert_ulp_close(actual: Any, expected: Any, fmt: FormatLike, *, max_ulp: float = 0, err_msg: str = "") -> None:
    """Assert ``|ulp_distance(actual, expected, fmt)| <= max_ulp`` elementwise (NaN matches NaN).

    The distance counts steps of the format's grid (see :func:`ulp_distance`), so it is meaningful
    across binades, zero and subnormals. ``max_ulp=0`` asks for equal values but, unlike
    :func:`assert_same_bits`, treats −0 and +0 as equal.

    >>> import fpsim.testing as ft
    >>> ft.assert_ulp_close([1.0, 2.0], [1.0078125, 2.0], "bf16", max_ulp=1)
    >>> ft.assert_ulp_close([1.0], [1.015625], "bf16", max_ulp=1)
    Traceback (most recent call last):
    ...
    AssertionError: values differ by more than 1 ulp of bf16
    Mismatched elements: 1 / 1 (100%)
    Max ulp distance: 2
    First mismatches:
      [0] actual   1.0 = 0 01111111 0000000 (0x3f80)
          expected 1.015625 = 0 01111111 0000010 (0x3f82)
          ulp distance -2
    """
    f = as_format(fmt)
    if isinstance(max_ulp, (bool, np.bool_)) or not isinstance(max_ulp, (int, float, np.integer, np.floating)):
        raise TypeError(f"max_ulp must be a number, got {max_ulp!r}")
    if not max_ulp >= 0:
        raise ValueError(f"max_ulp must be >= 0, got {max_ulp!r}")
    act, exp, _, _ = _pair(actual, expected, "actual", "expected")
    dist = np.asarray(ulp_distance(act, exp, f), dtype=np.float64).reshape(act.shape)
    with np.errstate(invalid="ignore"):
        ok = (np.abs(dist) <= max_ulp) | (np.isnan(act) & np.isnan(exp))
    if bool(np.all(ok)):
        return
    m = f"{max_ulp:g}"
    raise AssertionError(_report_pairs(f"values differ by more than {m} ulp of {f.name}", err_msg, act, exp, ok, f,
                                       dist))


@ieee_mode
def assert_same_bits(a: Any, b: Any, fmt: FormatLike, *, err_msg: str = "") -> None:
    """Assert that ``a`` and ``b`` hold the same codes of ``fmt``, elementwise.

    NaN-aware (any NaN equals any NaN; payloads do not survive the float carriers), and −0 differs
    from +0 in formats that have −0. A value that ``fmt`` cannot represent fails.

    >>> import fpsim.testing as ft
    >>> ft.assert_same_bits([0.0, float("nan")], [0.0, float("nan")], "fp16")
    >>> ft.assert_same_bits([0.0], [-0.0], "fp16")
    Traceback (most recent call last):
    ...
    AssertionError: bit patterns differ in fp16
    Mismatched elements: 1 / 1 (100%)
    First mismatches:
      [0] actual   0.0 = 0 00000 0000000000 (0x0000)
          expected -0.0 = 1 00000 0000000000 (0x8000)
    """
    f = as_format(fmt)
    va, vb, _, _ = _pair(a, b, "a", "b")
    ok = _same(va, vb, f) & _representable(va, f) & _representable(vb, f)
    if bool(np.all(ok)):
        return
    raise AssertionError(_report_pairs(f"bit patterns differ in {f.name}", err_msg, va, vb, ok, f, None))


@ieee_mode
def assert_matmul_matches(
    actual: Any,
    A: Any,
    B: Any,
    C: Any = None,
    *,
    model: Any = None,
    max_ulp: float = 0,
    err_msg: str = "",
    **matmul_options: Any,
) -> None:
    """Assert that a GEMM result equals fpsim's model of it: ``fpsim.matmul(A, B, C, model=model)``.

    ``model`` is anything :func:`fpsim.matmul` accepts (an ``MMAModel``, a name such as
    ``"h100:fp8_e4m3"`` or ``"v100:fp16"``, or None for the exact product rounded once); further
    keywords (``promote_every``, ``scales``, ``input_rounding``) are passed on. Results are compared as
    codes of the model's output format (fp32 when promoting): exact by default (NaN equals NaN,
    −0 ≠ +0); ``max_ulp`` allows that many steps of the output format.

    >>> import numpy as np, fpsim.testing as ft
    >>> A = np.full((2, 4), 1.0); B = np.full((4, 3), 2.0**-24)
    >>> ft.assert_matmul_matches(np.full((2, 3), 1.0), A, B, np.ones((2, 3)), model="v100:fp16")
    """
    try:
        from ..mma import as_model, matmul
    except ImportError as e:  # pragma: no cover - the matrix layer ships with fpsim
        raise NotImplementedError(f"fpsim.matmul is not available: {e}") from None
    m = as_model(model)
    f = fp32 if matmul_options.get("promote_every") is not None else m.output
    a_in = to_float64(A, "A")[0]
    b_in = to_float64(B, "B")[0]
    c_in = None if C is None else to_float64(C, "C")[0]
    exp, _ = to_float64(matmul(a_in, b_in, c_in, model=m, **matmul_options), "expected")
    act, _ = to_float64(actual, "actual")
    if act.shape != exp.shape:
        raise AssertionError(f"shape mismatch: actual has shape {act.shape}, the model gives {exp.shape}")
    what = f"GEMM result differs from fpsim.matmul(model={m.name!r}) (compared in {f.name})"
    if max_ulp == 0:
        ok = _same(act, exp, f) & _representable(act, f)
        if not bool(np.all(ok)):
            dist = np.asarray(ulp_distance(act, exp, f), dtype=np.float64).reshape(act.shape)
            raise AssertionError(_report_pairs(what, err_msg, act, exp, ok, f, dist))
    else:
        assert_ulp_close(act, exp, f, max_ulp=max_ulp, err_msg=(err_msg + "\n" if err_msg else "") + what)


def __getattr__(name: str) -> Any:
    """``fpsim.testing.strategies`` (with hypothesis) and the accumulator identification (with fpsim.mma) are
    imported on first use."""
    if name == "strategies":
        import importlib

        return importlib.import_module(f"{__name__}.strategies")
    if name in _IDENTIFY:
        from . import _identify

        return getattr(_identify, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
