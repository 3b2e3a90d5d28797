"""fpsim.add/sub/mul/div/sqrt/fma: IEEE special cases, dtypes and shapes, errors, stochastic rounding
statistics, and the internal fast paths against the general ones (the MPFR oracle is in
test_arith_oracle.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import fpsim
from fpsim.arith import Context, supports

MODES = ["rne", "rna", "rtz", "rup", "rdn", "rto"]
FORMATS = [f for f in fpsim.all_formats() if supports(f) and f.name != "e8m0"]
ids = lambda f: f.name
INF = math.inf
NAN = math.nan


def same(a: object, b: object) -> bool:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return bool(np.all((np.isnan(a) & np.isnan(b)) | ((a == b) & (np.signbit(a) == np.signbit(b)))))


# --------------------------------------------------------------------------------------------------
# IEEE 754 special cases


@pytest.mark.parametrize("mode", MODES)
def test_invalid_operations_give_nan(mode: str) -> None:
    f = "fp16"
    assert math.isnan(fpsim.add(INF, -INF, f, rounding=mode))
    assert math.isnan(fpsim.sub(INF, INF, f, rounding=mode))
    assert math.isnan(fpsim.mul(0.0, INF, f, rounding=mode))
    assert math.isnan(fpsim.mul(-INF, 0.0, f, rounding=mode))
    assert math.isnan(fpsim.div(0.0, 0.0, f, rounding=mode))
    assert math.isnan(fpsim.div(INF, -INF, f, rounding=mode))
    assert math.isnan(fpsim.sqrt(-1.0, f, rounding=mode))
    assert math.isnan(fpsim.sqrt(-INF, f, rounding=mode))
    assert math.isnan(fpsim.fma(0.0, INF, 1.0, f, rounding=mode))
    assert math.isnan(fpsim.fma(INF, 1.0, -INF, f, rounding=mode))
    assert math.isnan(fpsim.add(NAN, 1.0, f, rounding=mode))


@pytest.mark.parametrize("mode", MODES)
def test_division_by_zero_gives_signed_infinity(mode: str) -> None:
    assert same(fpsim.div(1.0, 0.0, "bf16", rounding=mode), INF)
    assert same(fpsim.div(1.0, -0.0, "bf16", rounding=mode), -INF)
    assert same(fpsim.div(-3.0, 0.0, "bf16", rounding=mode), -INF)
    assert same(fpsim.div(0.0, -2.0, "bf16", rounding=mode), -0.0)
    assert same(fpsim.div(1.0, INF, "bf16", rounding=mode), 0.0)


@pytest.mark.parametrize("mode", MODES)
def test_exact_zero_sum_sign(mode: str) -> None:
    z = -0.0 if mode == "rdn" else 0.0
    assert same(fpsim.add(1.5, -1.5, "fp16", rounding=mode), z)
    assert same(fpsim.sub(2.0, 2.0, "fp16", rounding=mode), z)
    assert same(fpsim.add(0.0, -0.0, "fp16", rounding=mode), z)
    # x + x keeps the sign of x even when x is zero
    assert same(fpsim.add(-0.0, -0.0, "fp16", rounding=mode), -0.0)
    assert same(fpsim.add(0.0, 0.0, "fp16", rounding=mode), 0.0)
    assert same(fpsim.sub(-0.0, 0.0, "fp16", rounding=mode), -0.0)
    # fma: exact cancellation, and zero product plus zero
    assert same(fpsim.fma(2.0, 3.0, -6.0, "fp32", rounding=mode), z)
    assert same(fpsim.fma(-0.0, 1.0, -0.0, "fp32", rounding=mode), -0.0)
    assert same(fpsim.fma(0.0, 1.0, -0.0, "fp32", rounding=mode), z)
    assert same(fpsim.fma(-0.0, -1.0, 0.0, "fp32", rounding=mode), 0.0)


def test_sqrt_special_values() -> None:
    assert same(fpsim.sqrt(-0.0, "fp32"), -0.0)
    assert same(fpsim.sqrt(0.0, "fp32"), 0.0)
    assert same(fpsim.sqrt(INF, "fp32"), INF)
    assert fpsim.sqrt(4.0, "fp8_e4m3") == 2.0


def test_underflowed_result_keeps_its_sign() -> None:
    tiny = fpsim.fp16.min_subnormal
    assert same(fpsim.mul(-tiny, 0.25, "fp16"), -0.0)
    assert same(fpsim.mul(-tiny, 0.25, "fp16", rounding="rdn"), -tiny)
    assert same(fpsim.mul(tiny, 0.25, "fp16", rounding="rup"), tiny)


def test_formats_without_infinity() -> None:
    # OCP E4M3: no infinity. Overflow -> NaN (nearest modes), x/0 -> NaN; fp4: no NaN either -> max.
    assert math.isnan(fpsim.add(448.0, 32.0, "fp8_e4m3"))
    assert fpsim.add(448.0, 32.0, "fp8_e4m3", rounding="rtz") == 448.0
    assert fpsim.add(448.0, 32.0, "fp8_e4m3", overflow="saturate") == 448.0
    assert math.isnan(fpsim.div(1.0, 0.0, "fp8_e4m3"))
    assert fpsim.mul(4.0, 4.0, "fp4_e2m1") == 6.0
    # fnuz: no -0
    assert same(fpsim.sub(1.0, 1.0, "fp8_e4m3fnuz", rounding="rdn"), 0.0)


def test_subnormals_false_flushes() -> None:
    q = fpsim.fp16.min_subnormal
    assert fpsim.mul(q * 4, 0.5, "fp16") == 2 * q
    assert same(fpsim.mul(q * 4, 0.5, "fp16", subnormals=False), 0.0)
    assert same(fpsim.mul(-q * 4, 0.5, "fp16", subnormals=False), -0.0)


# --------------------------------------------------------------------------------------------------
# Types, shapes, inputs


def test_broadcasting_and_dtypes() -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.float32([1, 2, 3])
    r = fpsim.add(a, b, "bf16")
    assert r.shape == (2, 3) and r.dtype == np.float32
    assert fpsim.add(a, b.astype(np.float64), "bf16").dtype == np.float64
    assert fpsim.add(a, b, "fp32").dtype == np.float32
    r = fpsim.fma(a, b, np.float32(1), "fp16")
    assert r.shape == (2, 3) and r.dtype == np.float32
    assert isinstance(fpsim.add(1.0, 2.0, "fp16"), np.float64)
    assert fpsim.sqrt(np.zeros((0, 3)), "fp16").shape == (0, 3)
    assert np.array_equal(fpsim.mul([1, 2], [3, 4], "fp8_e5m2"), [3.0, 8.0])


def test_inputs_are_not_modified() -> None:
    a = np.array([1.0, 2.0, 3.0])
    b = np.array([1e-9, 0.1, -0.3])
    a0, b0 = a.copy(), b.copy()
    fpsim.add(a, b, "bf16", rounding="rup")
    fpsim.fma(a, b, a, "fp8_e4m3")
    assert np.array_equal(a, a0) and np.array_equal(b, b0)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="rounding mode"):
        fpsim.add(1, 2, "fp16", rounding="nearest")
    with pytest.raises(ValueError, match="unknown format|format"):
        fpsim.add(1, 2, "fp17")
    with pytest.raises(ValueError, match="rng"):
        fpsim.add(1, 2, "fp16", rounding="sr")
    with pytest.raises(TypeError):
        fpsim.add("1", 2, "fp16")
    with pytest.raises(TypeError):
        fpsim.mul(1 + 2j, 2, "fp16")
    with pytest.raises(ValueError, match="fp64"):
        fpsim.add(1, 2, "fp64", rounding="rtz")
    with pytest.raises(TypeError, match="fmt is required"):
        fpsim.add(1.0, 2.0)
    with pytest.raises(ValueError):
        fpsim.add([1.0, 2.0], [1.0, 2.0, 3.0], "fp16")


def test_fp64_native_rne() -> None:
    a = np.array([0.1, 1e300, 3.0])
    b = np.array([0.2, 1e-10, 7.0])
    assert np.array_equal(fpsim.add(a, b, "fp64"), a + b)
    assert np.array_equal(fpsim.mul(a, b, "fp64"), a * b)
    assert np.array_equal(fpsim.sqrt(a, "fp64"), np.sqrt(a))
    # fma: one rounding (the float64 expression rounds twice)
    x = 1 + 2.0**-30
    assert fpsim.fma(x, x, -1.0, "fp64") == 2.0**-29 + 2.0**-60


def test_fma_is_fused() -> None:
    a = np.float32(1 + 2.0**-12)
    exact = 2.0**-11 + 2.0**-24  # a*a - 1, a float32 value: one rounding keeps it
    assert fpsim.fma(a, a, np.float32(-1), "fp32") == exact
    assert fpsim.sub(fpsim.mul(a, a, "fp32"), np.float32(1), "fp32") == 2.0**-11  # a*a rounded: a tie


# --------------------------------------------------------------------------------------------------
# Stochastic rounding: one stochastic rounding of the exact result


def test_sr_probability_of_the_exact_result() -> None:
    rng = np.random.default_rng(123)
    n = 100_000
    # 1 + 2**-10 in bf16: lies 1/8 of the way from 1 to 1 + 2**-7
    r = fpsim.add(np.ones(n), np.full(n, 2.0**-10), "bf16", rounding="sr", rng=rng)
    up = np.mean(r == 1 + 2.0**-7)
    assert set(np.unique(r)) <= {1.0, 1 + 2.0**-7}
    assert abs(up - 0.125) < 4 * math.sqrt(0.125 * 0.875 / n)
    # a residual far below float64's last bit still counts (exact result 1 + 2**-8 + 2**-80)
    x = np.ones(n)
    r = fpsim.fma(np.full(n, 2.0**-40), np.full(n, 2.0**-40), x + 2.0**-8, "bf16", rounding="sr", rng=rng)
    up = np.mean(r == 1 + 2.0**-7)
    assert abs(up - 0.5) < 4 * math.sqrt(0.25 / n)
    # same seed, same result
    r1 = fpsim.div(np.ones(50), 3.0, "fp8_e4m3", rounding="sr", rng=np.random.default_rng(5))
    r2 = fpsim.div(np.ones(50), 3.0, "fp8_e4m3", rounding="sr", rng=np.random.default_rng(5))
    assert np.array_equal(r1, r2)


def test_sr_is_unbiased_for_division_and_sqrt() -> None:
    rng = np.random.default_rng(7)
    n = 200_000
    q = fpsim.div(np.ones(n), np.full(n, 3.0), "fp16", rounding="sr", rng=rng)
    assert abs(q.mean() - 1 / 3) < 5 * 2.0**-13 / math.sqrt(n)
    s = fpsim.sqrt(np.full(n, 2.0), "fp16", rounding="sr", rng=rng)
    assert abs(s.mean() - math.sqrt(2)) < 5 * 2.0**-10 / math.sqrt(n)


# --------------------------------------------------------------------------------------------------
# Fast paths (Context, the RNE shortcut for values of the format) against the general path


@pytest.mark.parametrize("fmt", FORMATS, ids=ids)
def test_context_matches_public_functions(fmt: fpsim.Format) -> None:
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 1 << min(fmt.width, 32), 3000, dtype=np.uint64)
    v = np.asarray(fpsim.from_bits(codes, fmt), dtype=np.float64)
    a, b, c = v[:1000], v[1000:2000], v[2000:]
    for mode in MODES:
        ctx = Context(fmt, mode)
        for name in ("add", "sub", "mul", "div"):
            want = getattr(fpsim, name)(a, b, fmt, rounding=mode)
            for exact in (False, True):
                assert same(getattr(ctx, name)(a, b, exact_inputs=exact), want), (fmt.name, mode, name)
        assert same(ctx.sqrt(a, exact_inputs=True), fpsim.sqrt(a, fmt, rounding=mode))
        # one-element operands take a Python-float path
        one = [ctx.add(a[i : i + 1], b[i : i + 1])[0] for i in range(60)]
        assert same(one, fpsim.add(a[:60], b[:60], fmt, rounding=mode))
        one = [ctx.sub(a[i : i + 1], a[i : i + 1])[0] for i in range(60)]
        assert same(one, fpsim.sub(a[:60], a[:60], fmt, rounding=mode))
        assert same(ctx.fma(a, b, c, exact_inputs=True), fpsim.fma(a, b, c, fmt, rounding=mode))


def test_e8m0_against_the_rounding_oracle() -> None:
    # e8m0 (powers of two, no zero, no sign): + - x / of its values are exact in float64, so the
    # foundation's MPFR rounding oracle applied to the float64 result is the specification.
    pytest.importorskip("gmpy2")
    from _mpfr_oracle import oracle_round

    v = np.ldexp(1.0, np.arange(-10, 11))
    a, b = (x.ravel() for x in np.meshgrid(v, v))
    with np.errstate(all="ignore"):
        exact = {"add": a + b, "sub": a - b, "mul": a * b, "div": a / b}
    for mode in MODES:
        for op, x in exact.items():
            got = np.asarray(getattr(fpsim, op)(a, b, "e8m0", rounding=mode))
            want = np.array([oracle_round(float(t), fpsim.e8m0, mode) for t in x])
            assert same(got, want), (op, mode)
