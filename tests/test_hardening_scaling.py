"""Hardening of the matrix and scaling layers (issue 12): empty GEMMs, non-finite addends, the margin range,
NaN in NVFP4, warnings that leaked, one scale convention (ScaledTensor) and a hostile-input pass.

Oracles: NumPy's shapes for empty products, exact rational arithmetic (fractions) for scaled products,
torch for fake quantization, the documented float32 formulas computed here with NumPy."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

import fpsim
import fpsim.quant as Q
import fpsim.scaling as S
from fpsim.mma import DEVICES, INPUTS, dot, get_model, matmul
from fpsim.mma.experiments import quantize_tiles
from fpsim.scaling import ScaledTensor

F32 = np.float32


def _presets() -> list[str]:
    out = []
    for d in DEVICES:
        for i in INPUTS:
            try:
                get_model(d, i)
            except ValueError:
                continue
            out.append(f"{d}:{i}")
    return out


MODELS = [None, "exact", "fma_chain", "pairwise", "wide"] + _presets()


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


# ------------------------------------------------------------------------------ item 8: empty GEMMs

EMPTY = [((0, 4), (4, 3)), ((2, 4), (4, 0)), ((2, 0), (0, 3)), ((0, 0), (0, 0)), ((2, 3, 0, 4), (4, 5)),
         ((3, 2, 4), (1, 4, 0)), ((0, 4), (4,)), ((4,), (4, 0)), ((0,), (0,)), ((2, 2, 0), (2, 0, 3))]


@pytest.mark.parametrize("model", MODELS, ids=str)
def test_matmul_empty_shapes_follow_numpy(model):
    # Before: ZeroDivisionError for M = 0 or N = 0 on every model, batched too.
    for sa, sb in EMPTY:
        for dt in (np.float64, np.float32):
            a, b = np.ones(sa, dt), np.ones(sb, dt)
            d = matmul(a, b, model=model)
            ref = a @ b
            assert np.shape(d) == ref.shape, (sa, sb)
            assert np.asarray(d).dtype == ref.dtype
            if ref.size:  # K = 0: the empty sum is +0
                assert np.all(np.asarray(d) == 0) and not np.signbit(d).any()


@pytest.mark.parametrize("model", MODELS, ids=str)
def test_matmul_k0_gives_c(model):
    c = np.array([[1.5, -0.0, np.inf], [np.nan, -2.0, 3.0]])
    d = matmul(np.ones((2, 0)), np.ones((0, 3)), c, model=model)
    m = fpsim.mma.as_model(model)
    expect = np.asarray(fpsim.round(c, m.output)) + 0.0  # C rounded to the output format, -0 + (+0) = +0
    np.testing.assert_array_equal(d, expect)
    assert not np.signbit(d[0, 1])
    # batched, and promotion to fp32 as well
    d3 = matmul(np.ones((4, 2, 0)), np.ones((0, 3)), c, model=model)
    assert d3.shape == (4, 2, 3)
    np.testing.assert_array_equal(d3[1], expect)


def test_dot_k0_and_empty_rows():
    assert dot(np.ones(0), np.ones(0), 1.5, "v100:fp16") == 1.5
    assert np.ndim(dot(np.ones(0), np.ones(0), 1.5, "v100:fp16")) == 0
    r = dot(np.ones((3, 0), F32), np.ones((3, 0), F32), -0.0, "h100:fp8_e4m3")
    assert r.shape == (3,) and r.dtype == F32 and not np.signbit(r).any()
    assert dot(np.ones((0, 4)), np.ones((0, 4)), model="h100:fp16").shape == (0,)


@pytest.mark.parametrize("model", [None, "exact", "fma_chain", "h100:fp8_e4m3", "v100:fp16"], ids=str)
@pytest.mark.parametrize("c", [np.nan, np.inf, -np.inf, 1e300])
def test_matmul_nonfinite_addend(model, c):
    # Before: the exact model (the default) summed a NaN/inf C through its integer kernel: -3.69e19.
    expect = np.nan if np.isnan(c) else math.copysign(np.inf, c)
    for a in (np.ones((2, 2)), np.full((2, 2), 1e-320)):
        d = matmul(a, a, c, model=model)
        np.testing.assert_array_equal(d, np.full((2, 2), expect))
    np.testing.assert_array_equal(dot(np.ones(2), np.ones(2), c, model), expect)


# ------------------------------------------------------------------------------- item 10: margin

@pytest.mark.parametrize("margin", [128, -128, 10**6, -(10**6), 2**64])
def test_compute_scale_margin_out_of_range(margin):
    # Before: margin=128 gave scale 0 (every value quantizes to 0, dequantizes to NaN); 10**6 OverflowError.
    with pytest.raises(ValueError, match=f"margin .*got {margin}"):
        S.compute_scale(1.0, "fp8_e4m3", margin=margin)
    with pytest.raises(ValueError, match="margin"):
        S.DelayedScaling("fp8_e4m3", margin=margin)
    with pytest.raises(ValueError, match="margin"):
        S.CurrentScaling("fp8_e4m3", margin=margin)
    with pytest.raises(TypeError, match="margin"):
        S.compute_scale(1.0, "fp8_e4m3", margin=1.5)


def test_compute_scale_margin_in_range():
    amax = np.float32([1.0, 3.0, 1e-3, 1e30, 0.0, np.inf, np.nan])
    base = S.compute_scale(amax, "fp8_e4m3")
    for m in (-127, -5, 0, 1, 7, 64, 127):
        s = S.compute_scale(amax, "fp8_e4m3", margin=m)
        assert s.dtype == F32 and np.all(s > 0) and np.all(np.isfinite(s))
        with np.errstate(over="ignore"):
            want = np.ldexp(base[:4].astype(np.float64), -m)  # TE: (fmax / amax) / 2**m, exact for normal results
        want = np.clip(want, 2.0**-126, float(np.finfo(F32).max)).astype(F32)
        np.testing.assert_array_equal(s[:4], want)
        np.testing.assert_array_equal(s[4:], F32(1.0))  # amax 0, inf, NaN: scale 1
        with np.errstate(over="raise", divide="raise"):
            assert np.all(np.isfinite(F32(1.0) / s))  # the reciprocal (scale_inv) stays finite


def test_compute_scale_other_arguments():
    with pytest.raises(ValueError, match="amax_epsilon"):
        S.compute_scale(1.0, "fp8_e4m3", amax_epsilon=float("nan"))
    with pytest.raises(ValueError, match="amax_epsilon"):
        S.compute_scale(1.0, "fp8_e4m3", amax_epsilon=-1.0)
    with pytest.raises(ValueError, match="value_for_inf"):
        S.compute_scale(0.0, "fp8_e4m3", value_for_inf=0.0)
    with pytest.raises(TypeError, match="amax_epsilon"):
        S.compute_scale(1.0, "fp8_e4m3", amax_epsilon="1")
    assert S.compute_scale(1e300, "fp8_e4m3") == 1.0  # float64 amax beyond float32: inf there: scale 1


# ---------------------------------------------------------------------------- item 10: NaN in NVFP4

@pytest.mark.parametrize("block", [16, (2, 16)], ids=str)
def test_nvfp4_nan_stays_in_its_block(block):
    # Before: one NaN made every element and every block scale of the tensor NaN.
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 64)).astype(F32)
    x[0, 3] = 0.0
    y = x.copy()
    y[0, 3] = np.nan
    q0, d0, g0 = S.nvfp4_quantize(x, block=block)
    q1, d1, g1 = S.nvfp4_quantize(y, block=block)
    assert g1 == g0  # the tensor scale ignores the NaN (fmaxf-style amax)
    assert np.isnan(d1[0, 0]) and np.isnan(d1).sum() == 1
    rows = 1 if block == 16 else 2
    nan_mask = np.zeros(x.shape, bool)
    nan_mask[:rows, :16] = True
    assert np.isnan(q1[nan_mask]).all() and not np.isnan(q1[~nan_mask]).any()
    assert _same_bits(q1[~nan_mask], q0[~nan_mask])
    deq = S.nvfp4_dequantize(q1, d1, g1, block=block)
    assert np.isnan(deq[nan_mask]).all()
    assert _same_bits(deq[~nan_mask], S.nvfp4_dequantize(q0, d0, g0, block=block)[~nan_mask])
    # MX confines it the same way
    e, s = S.mx_quantize(y, "fp8_e4m3", block=16)
    assert np.isnan(s).sum() == 1 and np.isnan(e).sum() == 16


def test_nvfp4_global_amax_validated_and_inf_saturates():
    x = np.float32(np.linspace(-3, 3, 16))
    with pytest.raises(ValueError, match="global_amax"):
        S.nvfp4_quantize(x, global_amax=float("nan"))
    with pytest.raises(ValueError, match="global_amax"):
        S.nvfp4_quantize(x, global_amax=-1.0)
    q, d, g = S.nvfp4_quantize(np.float32([np.inf, -np.inf] + [1.0] * 14))
    assert g == 1.0 and q[0] == 6.0 and q[1] == -6.0
    q, d, g = S.nvfp4_quantize(np.array([1e300] + [1.0] * 15))  # beyond float32: inf (no warning)
    assert q[0] == 6.0 and g == 1.0


# ------------------------------------------------------------------------------ item 13: warnings

@pytest.mark.parametrize("scale", [1e-45, 1e-39, 1e300, 0.0, np.inf, np.nan, -1.0])
def test_no_warnings_and_defined_results(scale):
    # Before: RuntimeWarning (overflow in divide / cast) from dequantize, fake_quantize, quant.fake_quantize,
    # quant.fp8_fake_quantize for tiny scales, and "overflow in cast" for scales beyond float32.
    x = np.float32([1.0, 2.0, -3.0, 0.0])
    s32 = F32(np.float64(scale)) if np.isfinite(scale) and abs(scale) < 1e39 else F32(math.copysign(np.inf, scale)) \
        if not np.isnan(scale) else F32(np.nan)
    with np.errstate(all="ignore"):
        inv = F32(F32(1.0) / s32)
        q_expect = np.asarray(fpsim.round(x * s32, "fp8_e4m3", overflow="saturate"))
        deq_expect = (q_expect * inv).astype(F32)
    assert _same_bits(S.quantize(x, "fp8_e4m3", scale), q_expect)
    assert _same_bits(S.dequantize(q_expect, scale), deq_expect)
    assert _same_bits(S.fake_quantize(x, "fp8_e4m3", scale), deq_expect)
    assert _same_bits(Q.fp8_fake_quantize(x, "fp8_e4m3", scale), deq_expect)
    S.fake_quantize(np.zeros(0, F32), "fp8_e4m3", scale)
    Q.fake_quantize(x, scale, 0, -128, 127)
    Q.fake_quantize(x[None], [scale], [0], -128, 127, axis=0)
    Q.fake_quantize_grad(np.ones(4, F32), x, scale, 0, -128, 127)
    Q.learnable_fake_quantize(x, scale, 0.0, -128, 127)


@pytest.mark.torch
@pytest.mark.parametrize("scale", [1e-45, 1e-39, np.inf, 0.0, np.nan, -1.0])
def test_int_fake_quantize_extreme_scales_match_torch(scale):
    torch = pytest.importorskip("torch")
    x = np.float32([1.0, 2.0, -3.0, 0.0, 0.5])
    t = torch.fake_quantize_per_tensor_affine(torch.tensor(x), float(scale), 0, -128, 127).numpy()
    assert _same_bits(Q.fake_quantize(x, scale, 0, -128, 127), t)
    tc = torch.fake_quantize_per_channel_affine(torch.tensor(x[None]), torch.tensor([float(scale)]),
                                                torch.tensor([0], dtype=torch.int32), 0, -128, 127).numpy()
    assert _same_bits(Q.fake_quantize(x[None], [scale], [0], -128, 127, axis=0), tc)


def test_no_warnings_from_huge_inputs():
    big = np.array([1e300, -1e300, 1.0] + [0.5] * 29)
    S.mx_quantize(big, "fp8_e4m3", scale_rounding="ceil")
    assert S.mx_scales([1e300], "fp8_e4m3", scale_rounding="ceil")[0] == F32(2.0**127)
    ds = S.DelayedScaling("fp8_e4m3", amax_history_len=2)
    ds.update(1.0)
    assert ds.update(1e300) == 448.0  # an amax beyond float32 is inf: the scale holds
    ds.record(big)
    Q.learnable_fake_quantize(big, 1.0, 0.0, -128, 127)
    Q.learnable_fake_quantize_grad(np.ones(32, F32), big, 1.0, 0.0, -128, 127)
    for scaling, fmt in (("current", "fp8_e4m3"), ("mx", "fp8_e4m3"), ("nvfp4", "fp4_e2m1")):
        S.quantize_scaled(big, fmt, scaling=scaling).dequantize()


# -------------------------------------------------------------------- section 3: one scale convention

def _exact_product(ta: ScaledTensor, tb: ScaledTensor) -> list[list[Fraction]]:
    """The exact product of the dequantized operands (decode factors as ScaledTensor documents them)."""
    a = ta.data.astype(np.float64) * _expand(ta)
    b = tb.data.astype(np.float64) * _expand(tb)
    return [[sum((Fraction(float(a[i, k])) * Fraction(float(b[k, j])) for k in range(a.shape[1])), Fraction(0))
             for j in range(b.shape[1])] for i in range(a.shape[0])]


def _expand(t: ScaledTensor) -> np.ndarray:
    f = (t.scale.astype(F32) * t.global_scale).astype(F32).astype(np.float64)
    return np.kron(f, np.ones(t.block))  # each factor over its block (independent of ScaledTensor.factors)


def _rn32(v: Fraction) -> float:
    """One correct rounding of an exact rational to float32 (MPFR, 24 bits, float32's exponent range)."""
    gmpy2 = pytest.importorskip("gmpy2")
    with gmpy2.context(precision=24, emin=-148, emax=128, subnormalize=True, round=gmpy2.RoundToNearest):
        return float(gmpy2.mpfr(gmpy2.mpq(v.numerator, v.denominator)))


def _small_values(shape, rng, lo=-8, hi=9):
    # small integers times one power of two: every partial sum of their products is exact in fp32
    return (rng.integers(lo, hi, size=shape) * 0.25).astype(F32)


LAYOUTS = [
    ("tensor_pow2", dict(power_of_two=True), dict(power_of_two=True)),
    ("rows_cols", dict(axis=0, power_of_two=True), dict(axis=1, power_of_two=True)),
    ("tiles_32", dict(block=(1, 32), power_of_two=True), dict(block=(32, 1), power_of_two=True)),
    ("mx", dict(scaling="mx"), dict(scaling="mx", axis=0)),
    ("mx_ceil", dict(scaling="mx", scale_rounding="ceil"), dict(scaling="mx", axis=0, scale_rounding="ceil")),
]


@pytest.mark.parametrize("model", [None, "h100:fp8_e4m3", "b200:fp8_e4m3", "fma_chain"], ids=str)
@pytest.mark.parametrize("name,ka,kb", LAYOUTS, ids=[x[0] for x in LAYOUTS])
def test_quantize_then_matmul_scaled_equals_exact_dequantized_product(model, name, ka, kb):
    rng = np.random.default_rng(11)
    x = _small_values((5, 64), rng)
    w = _small_values((64, 3), rng)
    ta = S.quantize_scaled(x, "fp8_e4m3", **ka)
    tb = S.quantize_scaled(w, "fp8_e4m3", **kb)
    d = matmul(ta, tb, model=model)
    assert d.dtype == F32 and d.shape == (5, 3)
    exact = _exact_product(ta, tb)
    want = np.array([[float(v) for v in row] for row in exact])
    assert np.all(want.astype(F32) == want)  # chosen so that the exact product is an fp32 value
    np.testing.assert_array_equal(d, want.astype(F32))


def test_matmul_scaled_general_scales_follow_the_epilogue_formula():
    # Non-power-of-two per-tensor / per-row scales: D = RN32(RN32(fa * fb) * acc + C), acc = RN32(exact sum).
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 48)).astype(F32)
    w = rng.standard_normal((48, 5)).astype(F32)
    c = rng.standard_normal((4, 5))
    for ka, kb in ((dict(), dict()), (dict(axis=0), dict(axis=1))):
        ta, tb = S.quantize_scaled(x, **ka), S.quantize_scaled(w, **kb)
        d = matmul(ta, tb, c)
        fa = _expand(ta)[:, :1]
        fb = _expand(tb)[:1, :]
        s = (fa * fb).astype(F32).astype(np.float64)  # exact product of two fp32 values, rounded once
        exact = ta.data.astype(np.float64) @ tb.data.astype(np.float64)  # exact: E4M3 products, K = 48
        acc = exact.astype(F32).astype(np.float64)
        c32 = c.astype(F32).astype(np.float64)
        want = np.array([[_rn32(Fraction(float(s[i, j] * acc[i, j])) + Fraction(float(c32[i, j])))
                          for j in range(5)] for i in range(4)], dtype=F32)
        np.testing.assert_array_equal(d, want)


def test_quantize_scaled_matches_the_old_functions_bit_for_bit():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 64)).astype(F32) * 100
    for kw in (dict(), dict(axis=0), dict(axis=1), dict(block=(2, 32)), dict(power_of_two=True, block=(1, 16))):
        q, s = S.scale_and_quantize(x, "fp8_e4m3", **kw)
        t = S.quantize_scaled(x, "fp8_e4m3", **kw)
        assert _same_bits(t.data, q)
        # one convention: the stored factor is the decode factor, the reciprocal of the encode scale
        np.testing.assert_array_equal(t.scale.ravel(), (F32(1.0) / np.asarray(s, F32)).ravel())
        deq = S.dequantize(q, s, axis=kw.get("axis"), block=kw.get("block"))
        assert _same_bits(t.dequantize(), deq)
    e, sc = S.mx_quantize(x, "fp8_e5m2", block=32)
    t = S.quantize_scaled(x, "fp8_e5m2", scaling="mx")
    assert _same_bits(t.data, e) and _same_bits(t.scale, sc) and t.block == (1, 32)
    assert _same_bits(t.dequantize(), S.mx_dequantize(e, sc))
    x2 = np.tile(x, (4, 1))  # (16, 64): 16x16 tiles
    q4, d, g = S.nvfp4_quantize(x2, block=(16, 16))
    t = S.quantize_scaled(x2, "fp4_e2m1", scaling="nvfp4", block=(16, 16))
    assert t.global_scale == g and _same_bits(t.scale, d)
    assert _same_bits(t.dequantize(), S.nvfp4_dequantize(q4, d, g, block=(16, 16))) and t.block == (16, 16)


def test_quantize_tiles_uses_the_scaled_tensor_convention():
    rng = np.random.default_rng(2)
    a = rng.standard_normal((3, 256))
    b = rng.standard_normal((256, 128))
    aq, bq, sa, sb = quantize_tiles(a, b)
    m = get_model("h100", "fp8_e4m3")
    old = matmul(aq, bq, model=m, promote_every=128, scales=(sa, sb), input_rounding="exact")
    ta = ScaledTensor(aq, sa, "fp8_e4m3", block=(1, 128))
    tb = ScaledTensor(bq, sb, "fp8_e4m3", block=(128, 128))
    assert _same_bits(matmul(ta, tb, model=m), old)
    # decode factors: data * factor approximates the input
    assert np.abs(ta.dequantize() - a).max() <= 0.07 * np.abs(a).max()


def test_pitfall_is_named_or_impossible():
    # Before: scale_and_quantize's encode scales passed to matmul(scales=) were silently wrong by ~1e8.
    doc = matmul.__doc__ or ""
    assert "**Decode**" in doc and "encode" in doc and "ScaledTensor" in doc
    assert "**encode** scale" in (S.scale_and_quantize.__doc__ or "")
    assert "**Decode** factors" in (ScaledTensor.__doc__ or "")
    ta = S.quantize_scaled(np.ones((2, 128)), power_of_two=True)
    tb = S.quantize_scaled(np.ones((128, 2)), power_of_two=True)
    with pytest.raises(ValueError, match="scales="):
        matmul(ta, tb, promote_every=128, scales=(np.ones((2, 1)), np.ones((1, 2))))
    with pytest.raises(TypeError, match="both"):
        matmul(ta, np.ones((128, 2)))
    with pytest.raises(TypeError, match="matmul"):
        dot(ta, tb)
    with pytest.raises(ValueError, match="input_rounding"):
        matmul(ta, tb, input_rounding="rne")
    np.testing.assert_array_equal(matmul(ta, tb), np.full((2, 2), 128.0))


def test_matmul_scaled_validation():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 96))
    with pytest.raises(ValueError, match="do not nest"):
        matmul(S.quantize_scaled(x, block=(1, 32)), S.quantize_scaled(x.T.copy(), block=(48, 1)))
    with pytest.raises(ValueError, match="promote_every"):
        matmul(S.quantize_scaled(x, block=(1, 32)), S.quantize_scaled(x.T.copy(), block=(32, 1)), promote_every=64)
    with pytest.raises(ValueError, match="instruction depth"):
        matmul(S.quantize_scaled(x, block=(1, 16)), S.quantize_scaled(x.T.copy(), block=(16, 1)), model="h100:fp8_e4m3")
    with pytest.raises(ValueError, match="not a value"):  # data must already be values of the format
        ScaledTensor([0.3], 1.0, "fp8_e4m3")
    with pytest.raises(ValueError, match="not exactly representable"):
        matmul(S.quantize_scaled(x, "fp8_e5m2"), S.quantize_scaled(x.T.copy(), "fp8_e5m2"), model="h100:fp8_e4m3")
    with pytest.raises(ValueError, match="at least 2 axes"):
        matmul(S.quantize_scaled(np.ones(4)), S.quantize_scaled(np.ones((4, 2))))
    with pytest.raises(ValueError, match="disagree on K"):
        matmul(S.quantize_scaled(np.ones((2, 4))), S.quantize_scaled(np.ones((3, 2))))
    # empty and K = 0 scaled operands
    assert matmul(S.quantize_scaled(np.ones((0, 32))), S.quantize_scaled(np.ones((32, 3)))).shape == (0, 3)
    d = matmul(S.quantize_scaled(np.ones((2, 0))), S.quantize_scaled(np.ones((0, 3))), 2.0)
    np.testing.assert_array_equal(d, np.full((2, 3), 2.0))
    # batched scaled operands: each batch entry with its own factors
    xb = rng.standard_normal((3, 2, 32)).astype(F32)
    wb = rng.standard_normal((32, 4)).astype(F32)
    ta, tb = S.quantize_scaled(xb, block=(1, 1, 32)), S.quantize_scaled(wb)
    d = matmul(ta, tb)
    for i in range(3):
        one = matmul(ScaledTensor(ta.data[i], ta.scale[i], ta.format, ta.block[1:]), tb)
        assert _same_bits(d[i], one)


def test_scaled_tensor_value_semantics():
    src = np.float32([[448.0, -1.0], [2.0, 0.5]])
    t = ScaledTensor(src, [[0.25], [2.0]], "fp8_e4m3", block=(1, 2))
    src[0, 0] = 0.0  # the ScaledTensor holds its own copy
    assert t.data[0, 0] == 448.0
    with pytest.raises(ValueError):
        t.data[0, 0] = 1.0  # read-only
    with pytest.raises(AttributeError):
        t.scale = np.ones((2, 1))  # type: ignore[misc]  (frozen)
    assert t.block == (1, 2) and t.scale.dtype == F32 and t.shape == (2, 2)
    np.testing.assert_array_equal(t.dequantize(), [[112.0, -0.25], [4.0, 1.0]])
    with pytest.raises(ValueError, match="decode factor per block"):
        ScaledTensor(src, [1.0, 2.0, 3.0], "fp8_e4m3", block=(1, 2))
    with pytest.raises(ValueError, match="does not divide"):
        ScaledTensor(src, 1.0, "fp8_e4m3", block=(3,))
    with pytest.raises(ValueError, match=">= 1"):
        ScaledTensor(src, 1.0, "fp8_e4m3", block=(0,))
    with pytest.raises(TypeError):
        ScaledTensor(src, 1.0, "fp8_e4m3", block=1.5)
    with pytest.raises(TypeError):
        ScaledTensor("abc", 1.0, "fp8_e4m3")
    with pytest.raises(ValueError, match="unknown"):
        ScaledTensor(src, 1.0, "fp9")
    with pytest.raises(ValueError, match="scaling"):
        S.quantize_scaled(src, scaling="delayed")
    with pytest.raises(ValueError, match="fp4_e2m1"):
        S.quantize_scaled(np.ones(16), "fp8_e4m3", scaling="nvfp4")
    assert S.quantize_scaled(src, scaling=" MX ", block=2).block == (1, 2)
    assert "fp8_e4m3" in repr(t)


# --------------------------------------------------------------------------------- hostile inputs

def _variants(a: np.ndarray) -> dict[str, np.ndarray]:
    ro = a.copy()
    ro.setflags(write=False)
    return {"big_endian": a.astype(a.dtype.newbyteorder(">")), "fortran": np.asfortranarray(a),
            "strided": np.repeat(a, 2, axis=-1)[..., ::2], "read_only": ro}


@pytest.mark.parametrize("dt", [np.float32, np.float64], ids=["f32", "f64"])
def test_layout_and_byte_order_do_not_change_bits(dt):
    rng = np.random.default_rng(8)
    x = (rng.standard_normal((4, 32)) * 10).astype(dt)
    def results(v):
        return {
            "quantize": S.quantize(v, "fp8_e4m3", 3.0),
            "dequantize": S.dequantize(v, 3.0),
            "sq": S.scale_and_quantize(v, "fp8_e4m3", block=(1, 16))[0],
            "mx": S.mx_quantize(v, "fp4_e2m1")[0],
            "nvfp4": S.nvfp4_quantize(v)[0],
            "fq_int": Q.fake_quantize(v, 0.1, 0, -128, 127),
            "matmul": matmul(v, v.T, model="h100:fp16"),
            "qs": S.quantize_scaled(v).dequantize(),
        }

    ref = results(x)
    for name, v in _variants(x).items():
        before = v.copy()
        got = results(v)
        for k in ref:
            assert np.asarray(got[k]).dtype == np.asarray(ref[k]).dtype, (name, k)
            np.testing.assert_array_equal(got[k], ref[k], err_msg=f"{name} {k}")
        np.testing.assert_array_equal(v, before)  # inputs never modified


@pytest.mark.parametrize("bad", ["abc", np.array([object()]), np.ones((2, 2), bool), np.ones((2, 2), np.complex64)],
                         ids=["str", "object", "bool", "complex"])
def test_wrong_kinds_raise_type_error(bad):
    for f in (lambda: S.amax(bad), lambda: S.quantize(bad, "fp8_e4m3", 1.0), lambda: S.dequantize(bad, 1.0),
              lambda: S.mx_quantize(bad, "fp8_e4m3"), lambda: S.nvfp4_quantize(bad),
              lambda: S.quantize_scaled(bad), lambda: Q.fake_quantize(bad, 1.0, 0, -128, 127),
              lambda: matmul(bad, np.ones((2, 2))), lambda: dot(bad, np.ones(2))):
        with pytest.raises(TypeError):
            f()


def test_zero_d_and_mismatched_shapes_raise_value_error():
    with pytest.raises(ValueError):
        matmul(np.float64(1.0), np.ones((1, 1)))
    with pytest.raises(ValueError):
        dot(np.float64(1.0), np.ones(1))
    with pytest.raises(ValueError, match="broadcast"):
        matmul(np.ones((2, 2)), np.ones((2, 2)), np.ones(3))
    with pytest.raises(ValueError):
        S.quantize(np.ones((2, 4)), "fp8_e4m3", np.ones(3), axis=1)
    with pytest.raises(ValueError, match="out of range"):
        S.amax(np.ones((2, 4)), axis=2)
    with pytest.raises(TypeError, match="axis"):
        S.amax(np.ones((2, 4)), axis=1.0)
    with pytest.raises(ValueError):
        S.mx_quantize(np.float64(1.0), "fp8_e4m3")
    with pytest.raises(ValueError):
        S.nvfp4_quantize(np.ones(15))
    # 0-d values where a scalar is fine
    assert S.quantize(np.float64(3.0), "fp8_e4m3", 1.0) == 3.0
    assert S.quantize_scaled(np.float64(3.0), power_of_two=True).dequantize() == 3.0
    assert S.quantize_scaled(np.float64(3.0)).dequantize() == S.dequantize(448.0, S.compute_scale(3.0, "fp8_e4m3"))


def test_all_zero_and_empty_tensors():
    for fn in (lambda x: S.scale_and_quantize(x, "fp8_e4m3")[0], lambda x: S.mx_quantize(x, "fp8_e4m3")[0],
               lambda x: S.nvfp4_quantize(x, block=32)[0], lambda x: S.quantize_scaled(x).dequantize(),
               lambda x: S.quantize_scaled(x, scaling="mx").dequantize(),
               lambda x: Q.fake_quantize(x, 1.0, 0, -128, 127)):
        z = fn(np.zeros((2, 32)))
        np.testing.assert_array_equal(z, 0.0)
        e = fn(np.zeros((0, 32)))
        assert np.shape(e) == (0, 32)


def test_names_parse_by_the_one_rule_and_scales_are_validated():
    # Before: " MXFP8 ", "CEIL", "MAX", " Weight" were rejected; get_recipe(3) gave ValueError; a NaN or
    # zero initial / restored DelayedScaling scale was accepted (every later quantization NaN or 0).
    assert S.get_recipe(" MXFP8 ").name == "mxfp8"
    assert S.get_recipe("mxfp8").format_for(" Weight").name == "fp8_e4m3"
    assert S.get_recipe("mxfp8").block_for("GRADIENT") == 32
    assert S.DelayedScaling(amax_compute_algo="MAX", update_path=" Fused").update_path == "fused"
    e1, s1 = S.mx_quantize(np.arange(32.0), "fp8_e4m3", scale_rounding=" CEIL")
    e2, s2 = S.mx_quantize(np.arange(32.0), "fp8_e4m3", scale_rounding="ceil")
    assert _same_bits(s1, s2) and _same_bits(e1, e2)
    for bad in (S.get_recipe, S.fp8_format_pair):
        with pytest.raises(TypeError):
            bad(3)
    for v in (float("nan"), 0.0, -1.0, 1e300, float("inf")):
        with pytest.raises(ValueError, match="scale"):
            S.DelayedScaling(scale=v)
        ds = S.DelayedScaling(amax_history_len=2)
        st = ds.state_dict()
        st["scale"] = v
        with pytest.raises(ValueError, match="scale"):
            ds.load_state_dict(st)
    with pytest.raises(TypeError, match="scale"):
        S.DelayedScaling(scale="1")
    with pytest.raises(TypeError, match="amax_epsilon"):
        S.CurrentScaling(amax_epsilon="0")
    q, d, g = S.nvfp4_quantize(np.ones(32))
    with pytest.raises(ValueError, match="global_scale"):
        S.nvfp4_dequantize(q, d, np.ones(3))
    with pytest.raises(TypeError, match="global_scale"):
        S.nvfp4_dequantize(q, d, "x")


def test_matmul_option_kinds_and_names():
    # Before: promote_every=True ran as promote_every=1, 32.0 gave ValueError, " RNE" was rejected, and
    # scales near float64's top warned (overflow in the factor product).
    a, b = np.ones((2, 32)), np.ones((32, 2))
    with pytest.raises(TypeError, match="promote_every"):
        matmul(a, b, promote_every=True)
    with pytest.raises(TypeError, match="promote_every"):
        matmul(a, b, promote_every=32.0)
    with pytest.raises(ValueError, match="promote_every"):
        matmul(a, b, promote_every=0)
    np.testing.assert_array_equal(matmul(a, b, input_rounding=" RNE"), matmul(a, b, input_rounding="rne"))
    with pytest.raises(TypeError, match="input_rounding"):
        matmul(a, b, input_rounding=3)
    with pytest.raises(ValueError, match="valid: rne, rtz, exact"):
        matmul(a, b, input_rounding="rup")
    np.testing.assert_array_equal(matmul(a, b, promote_every=32, scales=(1e300, 1e300)), np.full((2, 2), np.inf))
    np.testing.assert_array_equal(matmul(a, b, promote_every=32, scales=(np.nan, 1.0)), np.full((2, 2), np.nan))


def test_quantize_tiles_and_experiment_hostile_inputs():
    # Before: lists/strings gave AttributeError, 1-D or mismatched K a NumPy unpack/broadcast error, an empty
    # matrix with per_tensor=True a reduction ValueError, an inf tile a RuntimeWarning; deepseek_experiment
    # accepted ks="128" as (1, 2, 8) and m=0 failed inside NumPy.
    aq, bq, sa, sb = quantize_tiles([[1.0] * 128], [[1.0]] * 128)
    assert sa.shape == (1, 1) and float(sa[0, 0]) == float(np.float32(1 / 448))
    with pytest.raises(TypeError):
        quantize_tiles("a", np.ones((128, 2)))
    with pytest.raises(ValueError, match="matrices"):
        quantize_tiles(np.ones(128), np.ones((128, 2)))
    with pytest.raises(ValueError, match="disagree on K"):
        quantize_tiles(np.ones((2, 128)), np.ones((64, 2)))
    assert quantize_tiles(np.ones((0, 128)), np.ones((128, 2)), per_tensor=True)[2].shape == (0, 1)
    aq, _, sa, _ = quantize_tiles(np.full((2, 128), np.inf), np.ones((128, 2)))
    assert np.isinf(sa).all() and np.isnan(aq).all()
    from fpsim.mma.experiments import deepseek_experiment
    with pytest.raises(TypeError, match="ks"):
        deepseek_experiment(m=2, n=2, ks="128")
    with pytest.raises(ValueError, match="m must be"):
        deepseek_experiment(m=0, n=2, ks=(128,))
    assert deepseek_experiment(m=2, n=2, ks=(128,), distribution=" Normal")["config"]["distribution"] == "normal"
