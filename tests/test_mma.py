"""fpsim.mma: presets, API errors, special values, the vectorized kernel against the literal integer model,
generic models against MPFR (gmpy2), and matmul (tiling, batching, promotion, scales)."""

from __future__ import annotations

import math
import zlib
from fractions import Fraction

import numpy as np
import pytest

import fpsim
from fpsim.mma import MMAModel, dot, generic, get_model, matmul
from fpsim.mma.naive import dot_naive

u = 2.0**-24

# Every (device, input, output) pair that get_model accepts, plus the B200 tcgen05 path.
VALID = [
    (d, i, o)
    for d in ("v100", "a100", "a2", "a30", "ada", "l40s", "h100", "h200", "b200")
    for i in ("fp16", "bf16", "tf32", "fp8_e4m3", "fp8_e5m2")
    for o in ("fp32", "fp16")
    if not (d == "v100" and i != "fp16")
    and not (d in ("a100", "a2", "a30") and i.startswith("fp8"))
    and not (o == "fp16" and i in ("bf16", "tf32"))
]


def bits(x: float | np.floating) -> int:
    return int(np.float32(x).view(np.uint32))


# ------------------------------------------------------------------------------------------- presets

def test_valid_pairs_count():
    assert len(VALID) == 2 + 3 * 4 + 5 * 8  # v100; a100, a2, a30; ada, l40s, h100, h200, b200


@pytest.mark.parametrize("dev, inp, out", VALID, ids=["-".join(v) for v in VALID])
def test_every_preset_has_source_and_confidence(dev, inp, out):
    m = get_model(dev, inp, out)
    assert m.kind == "bfma" and m.source and m.confidence
    assert m.input == fpsim.as_format(inp) and m.output == fpsim.as_format(out)
    assert dev in m.describe()
    assert "source:" in m.__doc__ and "confidence:" in m.__doc__  # each preset documents itself


@pytest.mark.parametrize("dev, inp, out, k, neab, mel, mb, rounding, c_entry, grouping", [
    ("v100", "fp16", "fp32", 4, 0, None, 23, "rz", "inside", "none"),
    ("v100", "fp16", "fp16", 4, 0, -19, 10, "rne", "inside", "none"),
    ("a2", "bf16", "fp32", 8, 1, -132, 23, "rz", "inside", "none"),
    ("a30", "fp16", "fp16", 8, 1, -20, 10, "rne", "inside", "none"),
    ("a100", "tf32", "fp32", 4, 1, -132, 23, "rz", "inside", "none"),
    ("l40s", "fp8_e4m3", "fp32", 16, -10, -132, 13, "rz", "inside", "none"),
    ("l40s", "fp8_e5m2", "fp16", 16, -10, None, 10, "rne", "inside", "none"),
    ("h200", "bf16", "fp32", 16, 2, -133, 23, "rz", "inside", "none"),
    ("h200", "fp16", "fp16", 16, 2, -21, 10, "rne", "inside", "none"),
    ("h200", "tf32", "fp32", 8, 2, -133, 23, "rz", "inside", "none"),
    ("h200", "fp8_e4m3", "fp32", 32, -10, -133, 13, "rz", "inside", "none"),
    ("h200", "fp8_e4m3", "fp16", 16, 2, -21, 10, "rne", "late", "mod4"),
    ("b200", "fp16", "fp32", 16, 2, -133, 23, "rz", "inside", "none"),
    ("b200", "fp8_e5m2", "fp32", 32, 2, -133, 23, "rz", "late", "none"),
    ("b200", "fp8_e5m2", "fp16", 16, 2, -21, 10, "rne", "late", "mod4"),
])
def test_parameter_table(dev, inp, out, k, neab, mel, mb, rounding, c_entry, grouping):
    m = get_model(dev, inp, out)
    assert (m.k, m.neab, m.mel, m.mb, m.rounding, m.c_entry, m.grouping) == (
        k, neab, mel, mb, rounding, c_entry, grouping)


def test_b200_tcgen05_path():
    m = get_model("b200", "fp8_e4m3", path="tcgen05")
    assert (m.k, m.neab, m.c_entry) == (32, 2, "inside") and m.confidence.startswith("low")
    with pytest.raises(ValueError, match="path"):
        get_model("h100", "fp16", path="tcgen05")
    with pytest.raises(ValueError, match="valid"):
        get_model("b200", "fp8_e4m3", path="wgmma")


@pytest.mark.parametrize("spelling, dev", [("H100", "h100"), ("NVIDIA H100 SXM", "h100"), ("A100-SXM4-80GB", "a100"),
                                           ("Tesla V100", "v100"), ("rtx-1000", "ada"), ("RTX 1000 Ada", "ada"),
                                           ("L40S", "l40s"), ("hopper", "h100"), ("H800", "h100"),
                                           ("b200", "b200"), ("A2", "a2")])
def test_device_spellings(spelling, dev):
    assert get_model(spelling, "fp16").name.startswith(dev + " ")


@pytest.mark.parametrize("inp", ["E4M3", "e5m2", "float8_e4m3fn", "bfloat16", "float16"])
def test_input_spellings(inp):
    get_model("h100", inp)


@pytest.mark.parametrize("dev, inp, out, match", [
    ("t4", "tf32", "fp32", "Turing multiplies fp16"),
    ("t4", "bf16", "fp32", "Turing"),
    ("v100", "bf16", "fp32", "Volta multiplies fp16 only"),
    ("v100", "tf32", "fp32", "Volta"),
    ("a100", "fp8_e4m3", "fp32", "FP8"),
    ("h100", "bf16", "fp16", "accumulate in fp32 only"),
    ("ada", "tf32", "fp16", "accumulate in fp32 only"),
    ("h100", "fp32", "fp32", "valid: fp16, bf16"),
    ("h100", "fp4_e2m1", "fp32", "valid"),
    ("h100", "fp16", "bf16", "valid: fp32, fp16"),
    ("gtx1080", "fp16", "fp32", "unknown device"),
])
def test_unsupported_pairs_raise(dev, inp, out, match):
    with pytest.raises(ValueError, match=match):
        get_model(dev, inp, out)


def test_model_validation():
    with pytest.raises(ValueError, match="kind"):
        MMAModel(name="x", kind="magic")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rounding"):
        MMAModel(name="x", rounding="rd")
    with pytest.raises(ValueError, match="k must"):
        MMAModel(name="x", k=0)
    with pytest.raises(ValueError, match="generic"):
        generic("bfma")
    with pytest.raises(ValueError, match="unknown model"):
        dot([1.0], [1.0], 0.0, "nonsense")
    with pytest.raises(TypeError):
        dot([1.0], [1.0], 0.0, 3)  # type: ignore[arg-type]
    m = get_model("h100", "fp16")
    import dataclasses

    with pytest.raises(dataclasses.FrozenInstanceError):
        m.k = 3  # type: ignore[misc]


def test_model_strings():
    assert fpsim.mma.as_model("h100:fp16:fp16") == get_model("h100", "fp16", "fp16")
    assert fpsim.mma.as_model("fma_chain") is fpsim.mma.fma_chain


# ----------------------------------------------------------------------------------------- dot API

def test_dot_shapes_and_dtypes():
    m = get_model("a100", "fp16")
    a = np.ones((3, 2, 8), dtype=np.float32)
    b = np.ones((2, 8), dtype=np.float32)
    d = dot(a, b, np.float32(1.0), m)
    assert d.shape == (3, 2) and d.dtype == np.float32 and np.all(d == 9)
    d64 = dot(a.astype(np.float64), b, 1.0, m)
    assert d64.dtype == np.float64
    s = dot([1.0, 2.0], [3.0, 4.0], 0.5, m)
    assert isinstance(s, np.floating) and s == 11.5


def test_dot_errors_and_no_mutation():
    m = get_model("a100", "fp16")
    a = np.array([1.0, 1.0 + 2**-20])
    a0 = a.copy()
    with pytest.raises(ValueError, match="not exactly representable in fp16"):
        dot(a, a, 0.0, m, input_rounding="exact")
    assert np.array_equal(a, a0)
    dot(a, a, 0.0, m)  # default RNE conversion
    assert np.array_equal(a, a0)
    with pytest.raises(ValueError, match="disagree on K"):
        dot([1.0, 2.0], [1.0], 0.0, m)
    with pytest.raises(ValueError, match="input_rounding"):
        dot([1.0], [1.0], 0.0, m, input_rounding="up")
    with pytest.raises(TypeError):
        dot(["a"], [1.0], 0.0, m)
    with pytest.raises(ValueError, match="broadcast"):
        dot(np.ones((2, 4)), np.ones((2, 4)), np.ones(3), m)


def test_input_rounding_fp8_saturates():
    m = get_model("h100", "fp8_e4m3")
    assert dot([1000.0], [1.0], 0.0, m) == 448.0  # satfinite conversion, as __nv_cvt_float_to_fp8
    assert dot([0.3], [1.0], 0.0, m) == float(fpsim.round(0.3, "fp8_e4m3"))


# ---------------------------------------------------------------------------------- special values

SPECIAL_MODELS = [get_model("v100", "fp16"), get_model("a100", "fp16", "fp16"), get_model("h100", "bf16"),
                  get_model("h100", "fp8_e5m2"), get_model("h100", "fp8_e5m2", "fp16"),
                  get_model("b200", "fp8_e5m2"), generic("exact"), generic("exact", "fp16", input="fp16")]


@pytest.mark.parametrize("m", SPECIAL_MODELS, ids=lambda m: m.name)
def test_special_values(m):
    inf, nan = math.inf, math.nan
    z = [0.0] * 7

    def d(a, b, c=0.0):
        return float(dot(a + z, b + z, c, m, input_rounding="exact"))

    assert math.isnan(d([nan], [1.0]))
    assert math.isnan(d([1.0], [1.0], nan))
    assert math.isnan(d([0.0], [inf]))  # 0 * inf
    assert d([inf], [2.0]) == inf and d([inf], [-2.0]) == -inf
    assert math.isnan(d([inf, inf], [1.0, -1.0]))  # inf - inf inside one block
    assert math.isnan(d([inf], [1.0], -inf))  # +inf product, -inf addend
    assert d([1.0], [1.0], inf) == inf and d([1.0], [1.0], -inf) == -inf
    # signed zeros: an empty or cancelling sum is +0
    for val in (d([0.0], [0.0], -0.0), d([-0.0], [1.0]), d([1.0, 1.0], [1.0, -1.0])):
        assert val == 0 and math.copysign(1, val) == 1
    # an infinity from a previous block propagates through the chain
    k = m.instruction_k if m.kind == "bfma" else 1
    a = [inf] + [0.0] * (2 * k + 7)
    assert float(dot(a, [1.0] * len(a), 0.0, m, input_rounding="exact")) == inf


@pytest.mark.parametrize("m", [get_model("h100", "fp16", "fp16"), get_model("ada", "fp8_e4m3", "fp16"),
                               get_model("h100", "fp8_e4m3", "fp16")], ids=lambda m: m.name)
def test_fp16_output_overflow(m):
    big = 448.0 if m.input.width == 8 else 60000.0
    a = [big] * 4 + [0.0] * 28
    assert float(dot(a, [big] * 4 + [0.0] * 28, 0.0, m)) == math.inf
    assert float(dot(a, [-big] * 4 + [0.0] * 28, 0.0, m)) == -math.inf


def test_fp32_output_overflow_is_infinity():
    m = get_model("h100", "bf16")
    big = float(fpsim.bf16.max)
    assert float(dot([big, big], [big, big], 0.0, m)) == math.inf  # the model's choice, also under RZ


def test_subnormal_outputs():
    m = get_model("h100", "bf16")
    # 2^-140 is a subnormal fp32 result; 3 * 2^-150 truncates to 2^-149 (RZ)
    assert float(dot([2.0**-70], [2.0**-70], 0.0, m)) == 2.0**-140
    assert float(dot([3 * 2.0**-75], [2.0**-75], 0.0, m)) == 2.0**-149
    assert float(dot([2.0**-75], [2.0**-75], 0.0, m)) == 0.0  # 2^-150: RZ to 0 (below mel-limited grid too)


# ---------------------------------------------------------------- vectorized kernel vs literal model

def random_rows(rng: np.random.Generator, fmt: str, rows: int, k: int, cfmt: str) -> tuple[np.ndarray, ...]:
    f = fpsim.as_format(fmt)
    scale = np.ldexp(1.0, rng.integers(-8, 5, size=(rows, 1)))
    a = rng.standard_normal((rows, k)) * scale
    b = rng.standard_normal((rows, k)) * np.ldexp(1.0, rng.integers(-8, 5, size=(rows, 1)))
    # sprinkle zeros, subnormals and exact cancellations
    a[rng.random((rows, k)) < 0.1] = 0.0
    sub = rng.random((rows, k)) < 0.05
    a[sub] = rng.integers(-7, 8, size=sub.sum()) * float(f.min_subnormal)
    a = np.asarray(fpsim.round(a, f, overflow="saturate"), dtype=np.float64)
    b = np.asarray(fpsim.round(b, f, overflow="saturate"), dtype=np.float64)
    if k >= 2:
        b[::7, 1] = -b[::7, 0] * a[::7, 0] / np.where(a[::7, 1] == 0, 1, a[::7, 1]) * 0  # zero some
        a[::5, 1], b[::5, 1] = a[::5, 0], -b[::5, 0]
    c = rng.standard_normal(rows) * np.ldexp(1.0, rng.integers(-12, 12, size=rows))
    c[::9] = 0.0
    c = np.asarray(fpsim.round(c, cfmt), dtype=np.float64)
    return a, b, c


NAIVE_MODELS = [get_model(*v) for v in VALID if v[0] in ("v100", "a100", "ada", "h100", "b200")] + [
    get_model("b200", "fp8_e4m3", path="tcgen05")]


@pytest.mark.parametrize("m", NAIVE_MODELS, ids=lambda m: m.name + ("-" + m.c_entry))
def test_kernel_matches_literal_integer_model(m):
    rng = np.random.default_rng(zlib.crc32((m.name + m.c_entry).encode()))  # reproducible across processes
    for k in (1, m.instruction_k, 2 * m.instruction_k + 3):
        a, b, c = random_rows(rng, m.input.name, 25, k, m.output.name)
        got = dot(a, b, c, m, input_rounding="exact")
        for i in range(len(c)):
            want = dot_naive(a[i].tolist(), b[i].tolist(), float(c[i]), m)
            assert bits(got[i]) == bits(want), f"row {i}: {got[i]!r} != {want!r}\na={a[i]}\nb={b[i]}\nc={c[i]}"


@pytest.mark.parametrize("variant", [{"neab": 5}, {"neab": -4, "mb": 19}, {"mel": -20}, {"k": 3},
                                     {"rounding": "rne"}, {"c_entry": "late"}])
def test_kernel_matches_literal_model_custom_parameters(variant):
    m = get_model("a100", "fp16").with_(**variant)
    rng = np.random.default_rng(7)
    a, b, c = random_rows(rng, "fp16", 40, 11, "fp32")
    got = dot(a, b, c, m, input_rounding="exact")
    for i in range(len(c)):
        assert bits(got[i]) == bits(dot_naive(a[i].tolist(), b[i].tolist(), float(c[i]), m))


# ------------------------------------------------------------------- generic models vs MPFR (gmpy2)

gmpy2 = pytest.importorskip("gmpy2")


def _ctx(fmt: fpsim.Format) -> gmpy2.context:
    return gmpy2.context(precision=fmt.p, emin=fmt.emin - fmt.mbits + 1, emax=fmt.emax + 1, subnormalize=True,
                         round=gmpy2.RoundToNearest)


@pytest.mark.parametrize("inp, out", [("fp16", "fp32"), ("bf16", "fp32"), ("fp32", "fp32"), ("fp16", "fp16"),
                                      ("fp8_e4m3", "fp32")])
def test_exact_model_matches_mpfr(inp, out):
    rng = np.random.default_rng(3)
    a, b, c = random_rows(rng, inp, 150, 37, out)
    if inp == "bf16":
        a[:5] = np.asarray(fpsim.round(a[:5] * 2.0**-60, "bf16"))  # tiny products far below the addend
    got = dot(a, b, c, generic("exact", out, input=inp), input_rounding="exact")
    fo = fpsim.as_format(out)
    for i in range(len(c)):
        q = sum((Fraction(x) * Fraction(y) for x, y in zip(a[i], b[i])), Fraction(c[i]))
        with _ctx(fo):
            want = float(gmpy2.mpfr(0) + gmpy2.mpq(q.numerator, q.denominator))
        assert bits(got[i]) == bits(want), f"row {i}"


@pytest.mark.parametrize("inp", ["fp16", "bf16", "fp32"])
def test_fma_chain_matches_mpfr(inp):
    rng = np.random.default_rng(4)
    a, b, c = random_rows(rng, inp, 60, 20, "fp32")
    got = dot(a, b, c, generic("fma_chain", input=inp), input_rounding="exact")
    for i in range(len(c)):
        with _ctx(fpsim.fp32):
            d = gmpy2.mpfr(float(c[i]))
            for x, y in zip(a[i], b[i]):
                d = gmpy2.fma(gmpy2.mpfr(float(x)), gmpy2.mpfr(float(y)), d)
        assert bits(got[i]) == bits(float(d)), f"row {i}"


def test_pairwise_and_wide_models():
    rng = np.random.default_rng(5)
    a, b, c = random_rows(rng, "fp16", 50, 13, "fp32")
    pw = dot(a, b, c, generic("pairwise", input="fp16"), input_rounding="exact")
    wd = dot(a, b, c, generic("wide", input="fp16"), input_rounding="exact")
    for i in range(len(c)):
        t = [np.float32(x * y) for x, y in zip(a[i], b[i])]
        while len(t) > 1:
            nxt = [np.float32(float(t[j]) + float(t[j + 1])) for j in range(0, len(t) - 1, 2)]
            t = nxt + ([t[-1]] if len(t) % 2 else [])
        assert bits(pw[i]) == bits(np.float32(float(t[0]) + float(c[i])))
        s = float(c[i])
        for x, y in zip(a[i], b[i]):
            s += x * y
        assert bits(wd[i]) == bits(np.float32(s))


# ---------------------------------------------------------------------------------------- matmul

MATMUL_MODELS = [get_model("v100", "fp16"), get_model("h100", "fp16", "fp16"), get_model("ada", "fp8_e4m3"),
                 get_model("h100", "fp8_e5m2", "fp16"), get_model("b200", "fp8_e4m3"), get_model("a100", "tf32"),
                 generic("exact", input="fp16"), generic("fma_chain", input="fp16"), generic("pairwise", input="fp16"),
                 generic("wide", input="fp16")]


@pytest.mark.parametrize("m", MATMUL_MODELS, ids=lambda m: m.name)
def test_matmul_equals_dot(m, monkeypatch):
    import fpsim.mma.gemm as g

    monkeypatch.setattr(g, "_BLOCK_ELEMS", 64 * m.instruction_k)  # force many small tiles
    monkeypatch.setattr(g, "_GENERIC_ELEMS", 64 * 50)
    rng = np.random.default_rng(11)
    A = rng.standard_normal((13, 50)).astype(np.float32)
    B = rng.standard_normal((50, 17)).astype(np.float32)
    C = rng.random((13, 17)).astype(np.float32)
    D = matmul(A, B, C, model=m)
    assert D.shape == (13, 17) and D.dtype == np.float32
    ref = dot(A[:, None, :], B.T[None, :, :], C, m)
    assert np.array_equal(D.view(np.uint32), ref.view(np.uint32))


def test_matmul_default_is_exact_and_shapes():
    rng = np.random.default_rng(12)
    A = rng.standard_normal((2, 3, 5, 7))
    B = rng.standard_normal((7, 4))
    D = fpsim.matmul(A, B)
    assert D.shape == (2, 3, 5, 4) and D.dtype == np.float64
    A32 = np.asarray(fpsim.round(A, "fp32"))
    B32 = np.asarray(fpsim.round(B, "fp32"))
    ref = np.asarray(fpsim.round(A32.astype(np.float64) @ B32, "fp32"))  # 7-term products: near-exact
    assert np.max(np.abs(D - ref) / np.abs(ref)) <= 2**-23
    assert fpsim.matmul(np.ones(3), np.ones(3)) == 3.0
    assert fpsim.matmul(np.ones((2, 3)), np.ones(3)).shape == (2,)
    with pytest.raises(ValueError, match="disagree on K"):
        fpsim.matmul(np.ones((2, 3)), np.ones((4, 2)))


def test_matmul_promotion_composes_partials():
    m = get_model("h100", "fp8_e4m3")
    rng = np.random.default_rng(13)
    A = rng.random((6, 300)) * 4
    B = rng.random((300, 5)) * 4
    C = rng.random((6, 5))
    D = matmul(A, B, C, model=m, promote_every=128)
    Aq = np.asarray(fpsim.round(A, "fp8_e4m3"))
    Bq = np.asarray(fpsim.round(B, "fp8_e4m3"))
    acc = np.asarray(fpsim.round(C, "fp32"), dtype=np.float64)
    for k0 in range(0, 300, 128):
        part = dot(Aq[:, None, k0:k0 + 128], Bq.T[None, :, k0:k0 + 128], 0.0, m)
        acc = np.asarray(fpsim.round(acc + part, "fp32"))  # two fp32 values: float64 sum is innocuous
    assert np.array_equal(D, acc)
    with pytest.raises(ValueError, match="multiple"):
        matmul(A, B, model=m, promote_every=48)
    with pytest.raises(ValueError, match="promote_every"):
        matmul(A, B, model=m, scales=(np.ones((6, 3)), np.ones((3, 1))))


def test_matmul_scales_at_promotion():
    m = get_model("h100", "fp8_e4m3")
    rng = np.random.default_rng(14)
    Aq = np.asarray(fpsim.round(rng.standard_normal((4, 256)) * 50, "fp8_e4m3", overflow="saturate"))
    Bq = np.asarray(fpsim.round(rng.standard_normal((256, 3)) * 50, "fp8_e4m3", overflow="saturate"))
    sa = np.ldexp(1.0, rng.integers(-6, 6, size=(4, 2))) * 1.5
    sb = np.array([[0.25], [3.0]])
    D = matmul(Aq, Bq, model=m, promote_every=128, scales=(sa, sb))
    acc = np.zeros((4, 3))
    for g, k0 in enumerate((0, 128)):
        part = dot(Aq[:, None, k0:k0 + 128], Bq.T[None, :, k0:k0 + 128], 0.0, m)
        s = np.broadcast_to(np.asarray(fpsim.round(sa[:, g:g + 1] * sb[g][None, :], "fp32")), (4, 3))
        for i in range(4):
            for j in range(3):
                with _ctx(fpsim.fp32):
                    acc[i, j] = float(gmpy2.fma(gmpy2.mpfr(s[i, j]), gmpy2.mpfr(part[i, j]), gmpy2.mpfr(acc[i, j])))
    assert np.array_equal(D, acc)
    with pytest.raises(ValueError, match="scale_a"):
        matmul(Aq, Bq, model=m, promote_every=128, scales=(np.ones((4, 3)), sb))
    with pytest.raises(TypeError):
        matmul(Aq, Bq, model=m, promote_every=128, scales=np.ones(3))


def test_promotion_reduces_fp8_error():
    from fpsim.mma import deepseek_experiment

    r = deepseek_experiment(m=8, n=8, ks=(512, 1024), seed=0)
    for row in r["rows"]:
        assert row["promoted_max"] < row["unpromoted_max"]


@pytest.mark.parametrize("spread", [0, 40, 200])
def test_exact_matmul_split_and_limb_paths_agree(spread):
    """The BLAS slice path (few slices) and the int64-limb fallback (wide spread) both equal exact dot."""
    rng = np.random.default_rng(15 + spread)
    A = rng.standard_normal((9, 70)) * np.ldexp(1.0, rng.integers(-spread // 2 - 1, spread // 2 + 1, (9, 70)))
    B = rng.standard_normal((70, 6))
    C = rng.standard_normal((9, 6))
    A = np.asarray(fpsim.round(A, "fp32"))
    D = fpsim.matmul(A, B, C)
    ref = dot(A[:, None, :], B.T[None, :, :], C)
    assert np.array_equal(D, ref)


@pytest.mark.parametrize("model", [None, "h100:fp16", "fma_chain", "pairwise", "wide"])
def test_empty_k(model):
    assert np.array_equal(fpsim.matmul(np.ones((2, 0)), np.ones((0, 3)), 1.5, model=model), np.full((2, 3), 1.5))
    assert np.array_equal(dot(np.ones((2, 0)), np.ones((2, 0)), 1.5, model), np.full(2, 1.5))


def test_matmul_batched_shapes_match_per_matrix():
    m = get_model("a100", "bf16")
    rng = np.random.default_rng(21)
    A = rng.standard_normal((2, 3, 5, 19))
    B = rng.standard_normal((19, 4))
    B3 = rng.standard_normal((3, 19, 4))
    C = rng.standard_normal((5, 4))
    D = matmul(A, B, C, model=m)  # shared B: flattened into one GEMM
    D3 = matmul(A, B3, C, model=m)  # batched B: one GEMM per matrix
    for i in range(2):
        for j in range(3):
            assert np.array_equal(D[i, j], matmul(A[i, j], B, C, model=m))
            assert np.array_equal(D3[i, j], matmul(A[i, j], B3[j], C, model=m))


hyp = pytest.importorskip("hypothesis")
st = pytest.importorskip("hypothesis.strategies")

_fp16_bits = st.integers(0, 0x7BFF).flatmap(lambda m: st.sampled_from([m, m | 0x8000]))
_fp32_bits = st.integers(0, 0x7F7FFFFF).flatmap(lambda m: st.sampled_from([m, m | 0x80000000]))


@hyp.settings(max_examples=200, deadline=None)
@hyp.given(
    a=st.lists(_fp16_bits, min_size=1, max_size=40),
    b=st.lists(_fp16_bits, min_size=40, max_size=40),
    c=_fp32_bits,
    k=st.integers(1, 32),
    neab=st.integers(-12, 4),
    mel=st.one_of(st.none(), st.integers(-140, 0)),
    rne=st.booleans(),
    grouping=st.booleans(),
    late=st.booleans(),
)
def test_kernel_matches_literal_model_property(a, b, c, k, neab, mel, rne, grouping, late):
    """Any parameter combination: the vectorized kernel equals the literal integer model, bit for bit."""
    if grouping and k % 2:
        k += 1
    m = MMAModel(name="prop", input="fp16", output="fp32", k=k, neab=neab, mel=mel,
                 rounding="rne" if rne else "rz", mb=max(0, 23 + min(neab, 0)),
                 c_entry="late" if late else "inside", grouping="mod4" if grouping else "none")
    av = np.array(a, dtype=np.uint16).view(np.float16).astype(np.float64)
    bv = np.array(b[: len(a)], dtype=np.uint16).view(np.float16).astype(np.float64)
    cv = float(np.array([c], dtype=np.uint32).view(np.float32)[0])
    got = dot(av, bv, cv, m, input_rounding="exact")
    want = dot_naive(av.tolist(), bv.tolist(), cv, m)
    assert bits(got) == bits(want), f"{got!r} != {want!r}"
