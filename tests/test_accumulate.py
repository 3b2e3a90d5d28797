"""fpsim.sum / fpsim.dot / accumulate.matmul: the classic accumulation effects, and every order against an
MPFR (gmpy2) evaluation of the same order, rounded per step, on small cases."""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

import fpsim
from fpsim.accumulate import ORDERS, matmul

gmpy2 = pytest.importorskip("gmpy2")  # the MPFR oracle

# --------------------------------------------------------------------------------------------------
# The effects a user must be able to reproduce in a few lines


def test_bf16_running_sum_of_ones_stops_at_256() -> None:
    x = np.ones(10_000)
    assert fpsim.sum(x, "bf16") == 256.0
    assert fpsim.sum(x, "bf16", accumulate="fp32") == 9984.0  # 10000 rounded once into bf16
    assert fpsim.sum(x, "bf16", order="pairwise") == 9984.0
    assert fpsim.sum(x, "bf16", order="exact") == 9984.0
    assert fpsim.sum(x, "bf16", order="kahan") == 9984.0


def test_fp16_sum_stagnates_below_half_an_ulp() -> None:
    # 0.1 in fp16 is below half an ulp of 256 (0.125): the running sum stops there
    x = np.full(5000, 0.1)
    assert fpsim.sum(x, "fp16") == 256.0
    assert fpsim.sum(x[:3000], "fp16") == 256.0
    assert abs(fpsim.sum(x, "fp16", order="pairwise") - 500) < 0.5


def test_pairwise_error_grows_like_log_n() -> None:
    rng = np.random.default_rng(0)
    errs: dict[str, list[float]] = {"sequential": [], "pairwise": []}
    sizes = [2**8, 2**12, 2**15]
    for n in sizes:
        x = np.asarray(fpsim.round(rng.uniform(0, 1, n), "fp16"), dtype=np.float64)
        exact = math.fsum(x)
        for order, lst in errs.items():
            lst.append(abs(float(fpsim.sum(x, "fp32", order=order)) - exact) / exact)
    u = 2.0**-24
    for n, e in zip(sizes, errs["pairwise"]):
        assert e <= math.log2(n) * u  # the worst-case bound (log2 n) u
    # sequential error grows roughly like n u (on this data: far more than pairwise at the largest n)
    assert errs["sequential"][-1] > 20 * errs["pairwise"][-1]
    assert errs["sequential"][-1] > errs["sequential"][0]


def test_kahan_is_nearly_exact() -> None:
    rng = np.random.default_rng(1)
    x = np.asarray(fpsim.round(rng.uniform(0, 1, 4000), "bf16"), dtype=np.float64)
    exact = float(fpsim.sum(x, "bf16", order="exact"))
    k = float(fpsim.sum(x, "bf16", order="kahan"))
    assert abs(k - exact) <= fpsim.bf16.ulp(exact)
    assert abs(float(fpsim.sum(x, "bf16")) - exact) > 100 * fpsim.bf16.ulp(exact)


# --------------------------------------------------------------------------------------------------
# MPFR reference: the same order, every partial result rounded by MPFR


def _ctx(fmt: fpsim.Format) -> Any:
    # IEEE formats with infinity only (fp16, bf16, fp32): MPFR's own overflow handling applies
    return gmpy2.context(precision=fmt.p, emin=fmt.emin - fmt.mbits + 1, emax=fmt.emax + 1, subnormalize=True,
                         round=gmpy2.RoundToNearest)


def _mp(v: float) -> Any:
    return gmpy2.mpfr(v, 53)


def ref_sequential(x: list[float], add: Callable[[Any, Any], Any]) -> Any:
    s = _mp(x[0])
    for v in x[1:]:
        s = add(s, _mp(v))
    return s


def ref_pairwise(x: list[float], add: Callable[[Any, Any], Any]) -> Any:
    t = [_mp(v) for v in x]
    while len(t) > 1:
        nxt = [add(t[i], t[i + 1]) for i in range(0, len(t) - 1, 2)]
        if len(t) % 2:
            nxt.append(t[-1])
        t = nxt
    return t[0]


def ref_blocked(x: list[float], add: Callable[[Any, Any], Any], block: int) -> Any:
    sums = [ref_sequential(x[i : i + block], add) for i in range(0, len(x), block)]
    s = sums[0]
    for v in sums[1:]:
        s = add(s, v)
    return s


def ref_kahan(x: list[float], ctx: Any) -> Any:
    s = _mp(x[0])
    c = _mp(0.0)
    for v in x[1:]:
        y = ctx.sub(_mp(v), c)
        t = ctx.add(s, y)
        c = ctx.sub(ctx.sub(t, s), y)
        s = t
    return s


def ref_exact(x: list[float], ctx: Any) -> Any:
    exact = sum((Fraction(v) for v in x), Fraction(0))
    return ctx.add(gmpy2.mpfr(gmpy2.mpq(exact.numerator, exact.denominator), 4000), _mp(0.0))


@pytest.mark.parametrize("fmt", [fpsim.fp16, fpsim.bf16, fpsim.fp32], ids=lambda f: f.name)
@pytest.mark.parametrize("order", ORDERS)
def test_sum_orders_against_mpfr(fmt: fpsim.Format, order: str) -> None:
    ctx = _ctx(fmt)
    rng = np.random.default_rng(hash((fmt.name, order)) % 2**32)
    for trial in range(12):
        n = int(rng.integers(1, 70))
        scale = 2.0 ** rng.integers(-3, 12, n)
        x = np.asarray(fpsim.round(rng.standard_normal(n) * scale, fmt), dtype=np.float64).tolist()
        if order == "sequential":
            want = ref_sequential(x, ctx.add)
        elif order == "pairwise":
            want = ref_pairwise(x, ctx.add)
        elif order == "blocked":
            want = ref_blocked(x, ctx.add, 8)
        elif order == "kahan":
            want = ref_kahan(x, ctx)
        else:
            want = ref_exact(x, ctx)
        got = fpsim.sum(x, fmt, order=order, block=8 if order == "blocked" else None)
        assert float(got) == float(want), (fmt.name, order, trial, x)


def test_sum_with_wider_accumulator_against_mpfr() -> None:
    rng = np.random.default_rng(3)
    c32, c16 = _ctx(fpsim.fp32), _ctx(fpsim.bf16)
    for _ in range(10):
        x = np.asarray(fpsim.round(rng.standard_normal(200) * 30, "bf16"), dtype=np.float64).tolist()
        want = c16.add(ref_sequential(x, c32.add), _mp(0.0))
        assert float(fpsim.sum(x, "bf16", accumulate="fp32")) == float(want)


@pytest.mark.parametrize("fmt", [fpsim.fp16, fpsim.bf16], ids=lambda f: f.name)
def test_dot_fused_sequential_against_mpfr(fmt: fpsim.Format) -> None:
    ctx = _ctx(fmt)
    rng = np.random.default_rng(4)
    for _ in range(10):
        n = int(rng.integers(1, 60))
        a = np.asarray(fpsim.round(rng.standard_normal(n), fmt), dtype=np.float64).tolist()
        b = np.asarray(fpsim.round(rng.standard_normal(n) * 8, fmt), dtype=np.float64).tolist()
        s = ctx.mul(_mp(a[0]), _mp(b[0]))
        for x, y in zip(a[1:], b[1:]):
            s = ctx.fma(_mp(x), _mp(y), s)
        assert float(fpsim.dot(a, b, fmt)) == float(s)
        # unfused: products rounded, then a sequential sum
        t = ctx.mul(_mp(a[0]), _mp(b[0]))
        for x, y in zip(a[1:], b[1:]):
            t = ctx.add(t, ctx.mul(_mp(x), _mp(y)))
        assert float(fpsim.dot(a, b, fmt, fused=False)) == float(t)
        # pairwise over rounded products; exact
        prods = [float(ctx.mul(_mp(x), _mp(y))) for x, y in zip(a, b)]
        assert float(fpsim.dot(a, b, fmt, order="pairwise")) == float(ref_pairwise(prods, ctx.add))
        exact = sum((Fraction(x) * Fraction(y) for x, y in zip(a, b)), Fraction(0))
        want = ctx.add(gmpy2.mpfr(gmpy2.mpq(exact.numerator, exact.denominator), 4000), _mp(0.0))
        assert float(fpsim.dot(a, b, fmt, order="exact")) == float(want)


# --------------------------------------------------------------------------------------------------
# Shapes, axes, orders agree with their 1-D versions


@pytest.mark.parametrize("order", ORDERS)
def test_sum_axes_match_one_dimensional_sums(order: str) -> None:
    rng = np.random.default_rng(5)
    x = np.asarray(fpsim.round(rng.standard_normal((6, 37, 5)), "bf16"), dtype=np.float64)
    blk = 4 if order == "blocked" else None
    r = fpsim.sum(x, "bf16", order=order, axis=1, block=blk)
    assert r.shape == (6, 5)
    for i in range(6):
        for j in range(5):
            assert r[i, j] == fpsim.sum(x[i, :, j], "bf16", order=order, block=blk)
    rk = fpsim.sum(x, "bf16", order=order, axis=(0, 2), keepdims=True, block=blk)
    assert rk.shape == (1, 37, 1)
    assert rk[0, 3, 0] == fpsim.sum(x[:, 3, :].ravel(), "bf16", order=order, block=blk)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("fused", [True, False])
def test_matmul_and_dot_match_one_dimensional_dots(order: str, fused: bool) -> None:
    rng = np.random.default_rng(6)
    a = rng.standard_normal((2, 3, 41))
    b = rng.standard_normal((41, 4))
    blk = 8 if order == "blocked" else None
    r = matmul(a, b, "fp16", order=order, fused=fused, block=blk)
    assert r.shape == (2, 3, 4)
    for i in range(2):
        for j in range(3):
            for k in range(4):
                want = fpsim.dot(a[i, j], b[:, k], "fp16", order=order, fused=fused, block=blk)
                assert r[i, j, k] == want
    d = fpsim.dot(a, b[:, 0], "fp16", order=order, fused=fused, block=blk)
    assert d.shape == (2, 3) and np.array_equal(d, r[..., 0])


def test_blocked_with_one_block_is_sequential() -> None:
    x = np.asarray(fpsim.round(np.random.default_rng(7).standard_normal(30), "bf16"), dtype=np.float64)
    assert fpsim.sum(x, "bf16", order="blocked", block=64) == fpsim.sum(x, "bf16")


def test_edge_cases() -> None:
    assert fpsim.sum([], "fp16") == 0.0
    assert fpsim.sum(np.zeros((0, 3)), "fp16", axis=0).shape == (3,)
    assert math.copysign(1, fpsim.sum([-0.0, -0.0], "fp16")) < 0
    assert math.copysign(1, fpsim.sum([-0.0, -0.0], "fp16", order="exact")) < 0
    assert math.isnan(fpsim.sum([1.0, np.inf, -np.inf], "fp16", order="exact"))
    assert fpsim.sum([np.inf, 1.0], "fp16", order="pairwise") == np.inf
    assert fpsim.sum([65504.0, 65504.0, -65504.0], "fp16") == np.inf  # overflow is sticky
    assert fpsim.sum([65504.0, 65504.0, -65504.0], "fp16", order="exact") == 65504.0
    assert fpsim.sum([1.0, 2.0**-30], "fp16", rounding="rup") == 1.0 + 2.0**-10
    r1 = fpsim.sum(np.full(100, 0.1), "bf16", rounding="sr", rng=np.random.default_rng(1))
    r2 = fpsim.sum(np.full(100, 0.1), "bf16", rounding="sr", rng=np.random.default_rng(1))
    assert r1 == r2


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="order"):
        fpsim.sum([1.0], "fp16", order="tree")
    with pytest.raises(ValueError, match="block"):
        fpsim.sum([1.0], "fp16", block=4)
    with pytest.raises(ValueError, match="block"):
        fpsim.sum([1.0], "fp16", order="blocked", block=0)
    with pytest.raises(ValueError, match="axis"):
        fpsim.sum(np.ones((2, 2)), "fp16", axis=2)
    with pytest.raises(ValueError, match="last axes"):
        fpsim.dot(np.ones(3), np.ones(4), "fp16")
    with pytest.raises(ValueError, match="aligned"):
        matmul(np.ones((2, 3)), np.ones((2, 3)), "fp16")
    with pytest.raises(TypeError):
        fpsim.sum(["a"], "fp16")


def test_fp64_orders() -> None:
    rng = np.random.default_rng(8)
    x = rng.standard_normal(1000) * np.exp2(rng.integers(-30, 30, 1000))
    assert fpsim.sum(x, "fp64", order="exact") == math.fsum(x)
    s = 0.0
    for v in x:
        s += v
    assert fpsim.sum(x, "fp64") == s
    y = rng.standard_normal(1000)
    exact = sum((Fraction(a) * Fraction(b) for a, b in zip(x.tolist(), y.tolist())), Fraction(0))
    assert fpsim.dot(x, y, "fp64", order="exact") == float(exact)  # float(Fraction) rounds to nearest
