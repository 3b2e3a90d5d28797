"""fpsim.add/sub/mul/div/sqrt/fma against MPFR (gmpy2), every format up to fp32 x every deterministic mode.

The oracle is written from the specification, not from fpsim: MPFR computes each operation on the exact
float64 operands and rounds once to the format's precision with its subnormal range
(``subnormalize=True``) and an unbounded exponent above. Nearest-away and round-to-odd, which MPFR lacks,
are decided from MPFR's two directed neighbours (and, for ties, from a 3000-bit evaluation). Format quirks
(overflow per mode, no infinity, no -0) are applied afterwards by the rules of the spec.

Cases: every pair (and fp4 triple) of values of the smallest formats, including ±0, ±inf and NaN;
hypothesis-drawn operands that are values of the format; constructed hard cases (cancellation, exact ties
and ties nudged, the overflow threshold, the subnormal range); and arbitrary float64 operands (which are
not values of the format) to check "one rounding of the exact result" for any input.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fpsim
import fpsim.arith

gmpy2 = pytest.importorskip("gmpy2")  # the MPFR oracle

MODES = ["rne", "rna", "rtz", "rup", "rdn", "rto"]
FORMATS = [f for f in fpsim.all_formats() if f.name not in ("fp64", "e8m0") and f.table is None]  # tables: test_hif8.py
SMALL = [f for f in FORMATS if f.width <= 6]
FP8 = [f for f in FORMATS if f.width == 8]
OPS = ["add", "sub", "mul", "div", "sqrt", "fma"]
ARITY = {"add": 2, "sub": 2, "mul": 2, "div": 2, "sqrt": 1, "fma": 3}
ids = lambda f: f.name

_MP = {
    "rne": gmpy2.RoundToNearest,
    "rtz": gmpy2.RoundToZero,
    "rup": gmpy2.RoundUp,
    "rdn": gmpy2.RoundDown,
    "away": gmpy2.RoundAwayZero,
}
_CTX: dict[tuple[str, str], Any] = {}


def _ctx(fmt: fpsim.Format, mode: str) -> Any:
    key = (fmt.name, mode)
    if key not in _CTX:
        # MPFR writes x = m * 2**e with m in [0.5, 1): the smallest subnormal 2**(emin - mbits) has
        # MPFR exponent emin - mbits + 1. Unbounded above: overflow is judged afterwards.
        _CTX[key] = gmpy2.context(
            precision=fmt.p, emin=fmt.emin - fmt.mbits + 1, emax=1 << 20, subnormalize=True, round=_MP[mode]
        )
    return _CTX[key]


_HP = {m: gmpy2.context(precision=3000, emin=-(1 << 30), emax=1 << 30, round=_MP[m]) for m in ("rtz", "away")}


def _apply(ctx: Any, op: str, xs: list[Any]) -> Any:
    if op == "add":
        return ctx.add(xs[0], xs[1])
    if op == "sub":
        return ctx.sub(xs[0], xs[1])
    if op == "mul":
        return ctx.mul(xs[0], xs[1])
    if op == "div":
        return ctx.div(xs[0], xs[1])
    if op == "sqrt":
        return ctx.sqrt(xs[0])
    return ctx.fma(xs[0], xs[1], xs[2])


def _odd(v: float, fmt: fpsim.Format) -> bool:
    if v == 0 or not math.isfinite(v):
        return False
    e = max(math.frexp(abs(v))[1] - 1, fmt.emin)
    return int(Fraction(abs(v)) / Fraction(2) ** (e - fmt.mbits)) % 2 == 1


def _f(x: Any) -> float:
    """MPFR value to float; finite values beyond float64 become ±1e308 (still 'beyond max')."""
    if gmpy2.is_finite(x) and abs(x) > gmpy2.mpfr(1e308, 53):
        return math.copysign(1e308, float(gmpy2.sign(x)))
    return float(x)


def _unbounded(op: str, args: tuple[float, ...], fmt: fpsim.Format, mode: str) -> float:
    xs = [gmpy2.mpfr(a, 53) for a in args]
    if mode in ("rne", "rtz", "rup", "rdn"):
        return _f(_apply(_ctx(fmt, mode), op, xs))
    lo = _f(_apply(_ctx(fmt, "rtz"), op, xs))
    hi = _f(_apply(_ctx(fmt, "away"), op, xs))
    if lo == hi or math.isnan(lo) or math.isinf(lo) or math.isinf(hi):
        return lo
    if mode == "rto":
        return lo if _odd(lo, fmt) else hi
    # rna: nearest, ties away. The exact result lies in [xl, xh] (3000-bit directed roundings).
    xl = Fraction(*_apply(_HP["rtz"], op, xs).as_integer_ratio())
    xh = Fraction(*_apply(_HP["away"], op, xs).as_integer_ratio())
    mid = (Fraction(lo) + Fraction(hi)) / 2
    if xl == xh:  # exact at 3000 bits
        return hi if abs(xl) >= abs(mid) else lo
    return hi if abs(xl) >= abs(mid) else lo


def _overflow(mode: str, neg: bool, fmt: fpsim.Format) -> float:
    to_inf = {"rne": True, "rna": True, "rtz": False, "rto": False, "rup": not neg, "rdn": neg}[mode]
    if to_inf:
        v = math.inf if fmt.has_inf else (math.nan if fmt.has_nan else fmt.max)
    else:
        v = fmt.max
    return -v if neg else v


def oracle(op: str, args: tuple[float, ...], fmt: fpsim.Format, mode: str) -> float:
    """The IEEE 754 result of op(*args) rounded once into fmt (overflow policy 'ieee')."""
    if not fmt.signed and fmt.has_zero:  # ue5m3: the signed twin's result; negative nonzero is NaN, -0 is +0
        twin = dataclasses.replace(fmt, name=fmt.name + "_signed", signed=True, aliases=())
        t = oracle(op, args, twin, mode)
        return math.nan if (math.isnan(t) or t < 0) else (0.0 if t == 0 else t)
    r = _unbounded(op, args, fmt, mode)
    if math.isnan(r):
        return math.nan
    neg = math.copysign(1.0, r) < 0
    if math.isinf(r):  # an exact infinity (inf operand, x/0): the format's encoding of it
        v = math.inf if fmt.has_inf else (math.nan if fmt.has_nan else fmt.max)
        return -v if neg else v
    if abs(r) > fmt.max:
        return _overflow(mode, neg, fmt)
    if r == 0 and not fmt.signed_zero:
        return 0.0
    return r


def _fpsim(op: str, cols: list[np.ndarray], fmt: fpsim.Format, mode: str) -> np.ndarray:
    fn = getattr(fpsim.arith, op)
    return np.asarray(fn(*cols, fmt, rounding=mode), dtype=np.float64)


def _hex(v: float) -> str:
    return float(v).hex()


def check(op: str, cols: list[np.ndarray], fmt: fpsim.Format, modes: list[str] = MODES) -> None:
    """Compare fpsim with the oracle on every row of cols in every mode; fail listing the mismatches."""
    cols = [np.asarray(c, dtype=np.float64).reshape(-1) for c in cols]
    # float32 operands take other fast paths (exact products, chunk-wise widening): check them too
    with np.errstate(over="ignore"):
        as32 = fmt.fits_float32 and all(
            np.array_equal(c.astype(np.float32).astype(np.float64), c, equal_nan=True) for c in cols)
    for mode in modes:
        got = _fpsim(op, cols, fmt, mode)
        want = np.array([oracle(op, tuple(float(c[i]) for c in cols), fmt, mode) for i in range(cols[0].size)])
        if as32:
            got32 = _fpsim(op, [c.astype(np.float32) for c in cols], fmt, mode)
            ok32 = (np.isnan(got32) & np.isnan(want)) | ((got32 == want) & (np.signbit(got32) == np.signbit(want)))
            assert ok32.all(), f"{fmt.name} {mode} float32 operands: {int((~ok32).sum())} mismatches"
        ok = (np.isnan(got) & np.isnan(want)) | ((got == want) & (np.signbit(got) == np.signbit(want)))
        if not ok.all():
            bad = np.flatnonzero(~ok)[:8]
            rows = [
                f"{op}({', '.join(_hex(c[i]) for c in cols)}) -> {_hex(got[i])}, want {_hex(want[i])}" for i in bad
            ]
            raise AssertionError(f"{fmt.name} {mode}: {int((~ok).sum())} mismatches, e.g.\n  " + "\n  ".join(rows))


def all_values(fmt: fpsim.Format) -> np.ndarray:
    """Every encoding's value (±0, ±inf, NaN included) of a format of up to 8 bits."""
    return np.asarray(fpsim.from_bits(np.arange(1 << fmt.width, dtype=np.uint32), fmt), dtype=np.float64)


# --------------------------------------------------------------------------------------------------
# Oracle sanity (the oracle itself against hand-checked values)


def test_oracle_known_values() -> None:
    assert oracle("add", (256.0, 1.0), fpsim.bf16, "rne") == 256.0
    assert oracle("add", (256.0, 1.0), fpsim.bf16, "rna") == 258.0
    assert oracle("add", (256.0, 1.0), fpsim.bf16, "rto") == 258.0
    assert oracle("add", (256.0, 1.0), fpsim.bf16, "rup") == 258.0
    assert math.copysign(1, oracle("sub", (1.0, 1.0), fpsim.fp16, "rdn")) < 0
    assert math.copysign(1, oracle("sub", (1.0, 1.0), fpsim.fp16, "rne")) > 0
    assert oracle("mul", (2.0**-14, 2.0**-10), fpsim.fp16, "rne") == 2.0**-24  # smallest subnormal
    assert oracle("mul", (2.0**-14, 2.0**-11), fpsim.fp16, "rne") == 0.0  # half of it: tie to even 0
    assert oracle("mul", (2.0**-14, 2.0**-11), fpsim.fp16, "rna") == 2.0**-24
    assert oracle("add", (65504.0, 16.0), fpsim.fp16, "rne") == math.inf  # overflow threshold (tie)
    assert oracle("add", (65504.0, 15.0), fpsim.fp16, "rne") == 65504.0
    assert oracle("add", (65504.0, 32.0), fpsim.fp16, "rtz") == 65504.0
    assert math.isnan(oracle("add", (448.0, 32.0), fpsim.fp8_e4m3, "rne"))
    assert oracle("add", (448.0, 16.0), fpsim.fp8_e4m3, "rne") == 448.0  # 464: tie, 448 is even
    assert oracle("div", (1.0, 3.0), fpsim.bf16, "rtz") == 0.33203125


# --------------------------------------------------------------------------------------------------
# Exhaustive: all operand pairs of the smallest formats


@pytest.mark.parametrize("fmt", SMALL, ids=ids)
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_exhaustive_pairs_small(fmt: fpsim.Format, op: str) -> None:
    v = all_values(fmt)
    a, b = np.meshgrid(v, v, indexing="ij")
    check(op, [a, b], fmt)


@pytest.mark.parametrize("fmt", SMALL + FP8, ids=ids)
def test_exhaustive_sqrt(fmt: fpsim.Format) -> None:
    check("sqrt", [all_values(fmt)], fmt)


def test_exhaustive_fma_fp4() -> None:
    fmt = fpsim.fp4_e2m1
    v = all_values(fmt)
    a, b, c = np.meshgrid(v, v, v, indexing="ij")
    check("fma", [a, b, c], fmt)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", [fpsim.fp8_e4m3, fpsim.fp8_e5m2], ids=ids)
@pytest.mark.parametrize("op", ["add", "mul", "div"])
def test_exhaustive_pairs_fp8(fmt: fpsim.Format, op: str) -> None:
    v = all_values(fmt)
    v = v[~np.isnan(v)]  # one NaN is enough (kept below), and halves the work
    v = np.concatenate([v, [np.nan]])
    a, b = np.meshgrid(v, v, indexing="ij")
    # all pairs in rne; the other five modes on every 9th pair (keeps the test near 2 s)
    check(op, [a, b], fmt, ["rne"])
    check(op, [a.ravel()[::9], b.ravel()[::9]], fmt, ["rna", "rtz", "rup", "rdn", "rto"])


# --------------------------------------------------------------------------------------------------
# Hypothesis: operands that are values of the format, every format, op and mode


def _codes(fmt: fpsim.Format, n: int) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(0, (1 << fmt.width) - 1), min_size=n, max_size=n)


def _vals(fmt: fpsim.Format, codes: list[int]) -> np.ndarray:
    return np.asarray(fpsim.from_bits(np.array(codes, dtype=np.uint64), fmt), dtype=np.float64)


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f.width > 6], ids=ids)
@pytest.mark.parametrize("op", OPS)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_hypothesis_format_operands(fmt: fpsim.Format, op: str, data: st.DataObject) -> None:
    cols = [_vals(fmt, data.draw(_codes(fmt, 16))) for _ in range(ARITY[op])]
    if op in ("add", "sub", "fma"):
        # make cancellation likely: the last operand often the negated neighbour of a product/other operand
        flip = data.draw(st.lists(st.booleans(), min_size=16, max_size=16))
        near = np.asarray(fmt.next_up(np.abs(cols[0])), dtype=np.float64) * np.sign(cols[0])
        cols[-1] = np.where(flip, -near if op != "sub" else near, cols[-1])
        cols[-1] = np.asarray(fpsim.round(cols[-1], fmt, "rtz"), dtype=np.float64)
    check(op, cols, fmt)


# --------------------------------------------------------------------------------------------------
# Constructed hard cases


def _finite_samples(fmt: fpsim.Format, n: int, rng: np.random.Generator) -> np.ndarray:
    codes = rng.integers(0, 1 << fmt.width, n, dtype=np.uint64)
    v = np.asarray(fpsim.from_bits(codes, fmt), dtype=np.float64)
    return v[np.isfinite(v)]


@pytest.mark.parametrize("fmt", FORMATS, ids=ids)
def test_hard_cases_add(fmt: fpsim.Format) -> None:
    rng = np.random.default_rng(1)
    v = np.abs(_finite_samples(fmt, 60, rng))
    v = v[v > 0]
    ulp = np.asarray(fmt.ulp(v), dtype=np.float64)
    half = np.asarray(fpsim.round(ulp / 2, fmt, "rne"), dtype=np.float64)  # a tie partner when representable
    quarter = np.asarray(fpsim.round(ulp / 4, fmt, "rne"), dtype=np.float64)
    three_q = np.asarray(fpsim.round(3 * ulp / 4, fmt, "rne"), dtype=np.float64)
    up = np.asarray(fmt.next_up(v), dtype=np.float64)
    up = np.where(np.isfinite(up), up, v)
    top = np.array([fmt.max] * 6)
    topb = np.array([fmt.ulp(fmt.max) / 2, fmt.ulp(fmt.max), fmt.ulp(fmt.max) / 4, fmt.min_subnormal,
                     fmt.ulp(fmt.max) * 3 / 4, fmt.ulp(fmt.max) / 2 + fmt.ulp(fmt.ulp(fmt.max) / 2)])
    topb = np.asarray(fpsim.round(topb, fmt, "rne"), dtype=np.float64)
    q = fmt.min_subnormal
    sub_a = np.array([q, 3 * q, fmt.min_normal, fmt.min_normal - q, 5 * q, q])
    sub_b = -np.array([q / 2, q, q, 2 * q, 2 * q, q])
    sub_b = np.asarray(fpsim.round(sub_b, fmt, "rne"), dtype=np.float64)
    a = np.concatenate([v, v, v, v, -v, v, top, sub_a, v])
    b = np.concatenate([half, quarter, three_q, -up, up, -v, topb, sub_b, v])
    check("add", [a, b], fmt)
    check("add", [-a, -b], fmt)
    check("sub", [a, -b], fmt)


@pytest.mark.parametrize("fmt", FORMATS, ids=ids)
def test_hard_cases_mul_div_fma(fmt: fpsim.Format) -> None:
    rng = np.random.default_rng(2)
    v = _finite_samples(fmt, 80, rng)
    w = _finite_samples(fmt, 80, rng)[: v.size]
    v = v[: w.size]
    q = fmt.min_subnormal
    # products and quotients landing in the subnormal range and at the overflow threshold
    small = np.array([q, 3 * q, 5 * q, fmt.min_normal, fmt.min_normal * 1.5, fmt.max, fmt.max, 3 * q])
    small = np.asarray(fpsim.round(small, fmt, "rne"), dtype=np.float64)
    fac = np.asarray(fpsim.round(np.array([0.5, 0.5, 0.75, 0.25, 0.375, 1.0 + fmt.eps, 2.0, 0.75]), fmt, "rne"),
                     dtype=np.float64)
    a = np.concatenate([v, small, -small])
    b = np.concatenate([w, fac, fac])
    check("mul", [a, b], fmt)
    inv = np.asarray(fpsim.round(1.0 / np.where(fac == 0, 1, fac), fmt, "rne"), dtype=np.float64)
    check("div", [a, np.concatenate([w, inv, inv])], fmt)
    # fma: c = -round(a*b) exposes the product's rounding error; c = -(a*b's neighbour) cancels
    ab = np.asarray(fpsim.arith.mul(v, w, fmt), dtype=np.float64)
    ab = np.where(np.isfinite(ab), ab, 1.0)
    ab_up = np.asarray(fmt.next_up(np.abs(ab)), dtype=np.float64)
    ab_up = np.where(np.isfinite(ab_up), ab_up, 0.0) * np.sign(ab)
    check("fma", [np.concatenate([v, v, v]), np.concatenate([w, w, w]), np.concatenate([-ab, -ab_up, ab])], fmt)


# --------------------------------------------------------------------------------------------------
# Any float64 operands (not values of the format): still one rounding of the exact result


_any_float = st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True)
_wide = st.one_of(
    _any_float,
    st.floats(min_value=-1e4, max_value=1e4),
    st.builds(lambda m, e: math.ldexp(m, e), st.floats(min_value=0.5, max_value=1.0), st.integers(-160, 160)),
)


@pytest.mark.parametrize("fmt", [fpsim.fp32, fpsim.bf16, fpsim.fp16, fpsim.fp8_e4m3, fpsim.fp4_e2m1], ids=ids)
@pytest.mark.parametrize("op", OPS)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_hypothesis_any_float64(fmt: fpsim.Format, op: str, data: st.DataObject) -> None:
    cols = [np.array(data.draw(st.lists(_wide, min_size=8, max_size=8))) for _ in range(ARITY[op])]
    check(op, cols, fmt)


def test_extreme_float64_operands() -> None:
    big = [2.0**1023, 1.7976931348623157e308, -2.0**1000, 2.0**-1074, -2.0**-1074, 2.0**-1022, 1e-300, 3e-310,
           1.0, -1.5, 2.0**-150, 2.0**-149, 3.0 * 2.0**-151]
    a, b = np.meshgrid(np.array(big), np.array(big), indexing="ij")
    for fmt in (fpsim.fp32, fpsim.bf16, fpsim.fp8_e5m2):
        for op in ("add", "sub", "mul", "div"):
            check(op, [a, b], fmt)
        check("sqrt", [np.array(big)], fmt)
        c = np.resize(np.array(big), a.size)
        check("fma", [a, b, c.reshape(a.shape)], fmt)
        check("fma", [a, b, -c.reshape(a.shape)[::-1]], fmt)


# --------------------------------------------------------------------------------------------------
# fp64: native RNE arithmetic (fma emulated)


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_fp64_rne(data: st.DataObject) -> None:
    fin = st.one_of(st.just(0.0), st.floats(min_value=1e-100, max_value=1e100),
                    st.floats(min_value=-1e100, max_value=-1e-100))
    cols = [np.array(data.draw(st.lists(fin, min_size=8, max_size=8))) for _ in range(3)]
    ctx = gmpy2.context(precision=53, emin=-1073, emax=1024, subnormalize=True, round=gmpy2.RoundToNearest)
    got = np.asarray(fpsim.arith.fma(*cols, "fp64"))
    want = np.array([float(ctx.fma(gmpy2.mpfr(x, 53), gmpy2.mpfr(y, 53), gmpy2.mpfr(z, 53)))
                     for x, y, z in zip(*cols)])
    assert np.array_equal(got, want)
    got = np.asarray(fpsim.arith.div(cols[0], cols[1], "fp64"))
    with np.errstate(invalid="ignore", divide="ignore"):
        assert np.array_equal(got, cols[0] / cols[1], equal_nan=True)
