"""The compiled block-FMA GEMM (fpsim/_cgemm.c) against the NumPy reference (fpsim.mma._bfma.bfma), bit for bit.

The NumPy path is the reference (itself checked against the published hardware rows, tests/test_mma_hw.py);
here every BFMA preset of fpsim.mma.presets runs through both paths on inputs that exercise the model's corners:
subnormal inputs, zeros, exponents spread across (and beyond) the alignment window, exact cancellation,
overflow to infinity, NaN/inf inputs and addends, C given or not, K not a multiple of the block, empty
dimensions, batches, promotion with and without scales, ScaledTensor operands, and thread counts 1, 2, 3, 7.
The published hardware rows are also rerun with the compiled path forced on. The generic "wide",
"fma_chain" and "pairwise" models (compiled too) are checked the same way.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

import fpsim
from fpsim import rounding
from fpsim.mma import gemm as G
from fpsim.mma import get_model, preset_table

pytestmark = pytest.mark.skipif(G._cgemm is None, reason="fpsim._cgemm (the compiled GEMM) is not built")


def _bfma_presets() -> list[tuple[str, str, str, str | None]]:
    keys = []
    for row in preset_table():
        if row["input"] is None or row["vendor"] != "NVIDIA":
            continue
        try:
            m = get_model(row["device"], row["input"], row["output"], path=row["path"])
        except ValueError:  # block-scaled paths are not single MMAModels (tests/test_mma_blackwell.py)
            continue
        if m.kind == "bfma":
            keys.append((row["device"], row["input"], row["output"], row["path"]))
    return keys


PRESETS = _bfma_presets()
IDS = ["-".join(str(x) for x in key if x) for key in PRESETS]


def _model(key: tuple[str, str, str, str | None]) -> Any:
    dev, fin, fout, path = key
    return get_model(dev, fin, fout, path=path)


def both(fn: Callable[[], Any]) -> tuple[np.ndarray, np.ndarray]:
    """fn() with the compiled path, then with the NumPy reference."""
    old = G.use_c_gemm
    try:
        G.use_c_gemm = True
        got = np.asarray(fn())
        G.use_c_gemm = False
        ref = np.asarray(fn())
    finally:
        G.use_c_gemm = old
    return got, ref


def assert_same_bits(got: np.ndarray, ref: np.ndarray) -> None:
    """Identical float64 bits everywhere except that any NaN matches any NaN (the payload is not modelled)."""
    assert got.shape == ref.shape and got.dtype == ref.dtype
    gn, rn = np.isnan(got), np.isnan(ref)
    assert np.array_equal(gn, rn), f"NaN positions differ: {np.argwhere(gn != rn)[:5].tolist()}"
    w = got.dtype.itemsize * 8
    gb = np.where(gn, 0, got).view(f"u{w // 8}")
    rb = np.where(rn, 0, ref).view(f"u{w // 8}")
    bad = np.argwhere(gb != rb)
    assert bad.size == 0, (f"{len(bad)} of {got.size} outputs differ; first at {bad[0].tolist()}: "
                           f"compiled {got[tuple(bad[0])]!r}, reference {ref[tuple(bad[0])]!r}")


def _values(rng: np.random.Generator, shape: tuple[int, ...], fmt: Any, spread: int) -> np.ndarray:
    """Mixed values of `fmt`: normal numbers over +-spread binades, subnormals, zeros, the largest values."""
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-spread, spread + 1, shape))
    u = rng.random(shape)
    sub = rng.integers(1, 2**fmt.mbits, shape) * 2.0 ** (fmt.emin - fmt.mbits) * rng.choice([-1, 1], shape)
    x = np.where(u < 0.1, sub, x)
    x = np.where((u >= 0.1) & (u < 0.2), 0.0, x)
    x = np.where((u >= 0.2) & (u < 0.23), rng.choice([-1, 1], shape) * fmt.max, x)
    return x


def _case(rng: np.random.Generator, m: Any, mm: int, kk: int, nn: int, *, spread: int = 12,
          cancel: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    a = _values(rng, (mm, kk), m.input, spread)
    b = _values(rng, (kk, nn), m.input, spread)
    if cancel and kk >= 2 and nn >= 2:
        b[1::2, 0] = -b[0:-1:2, 0]  # column 0: pairs that cancel exactly when a's two entries match
        a[0, 1::2] = a[0, 0:-1:2]
    c = rng.standard_normal((mm, nn)) * np.exp2(rng.integers(-spread, spread + 1, (mm, nn)))
    c[rng.random((mm, nn)) < 0.2] = 0.0
    return a, b, c


def _with_specials(rng: np.random.Generator, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> None:
    for x in (a, b, c):
        flat = x.reshape(-1)
        idx = rng.choice(flat.size, size=max(1, flat.size // 40), replace=False)
        flat[idx] = rng.choice([np.nan, np.inf, -np.inf], size=idx.size)


@pytest.mark.parametrize("key", PRESETS, ids=IDS)
def test_every_preset_bit_identical(key: tuple[str, str, str, str | None]) -> None:
    m = _model(key)
    rng = np.random.default_rng(abs(hash(IDS[PRESETS.index(key)])) % 2**32)
    ki = m.instruction_k
    for mm, kk, nn, with_c in ((5, 3 * ki + 5, 7, True), (4, 2 * ki, 9, False), (3, ki - 1, 5, True)):
        a, b, c = _case(rng, m, mm, kk, nn)
        got, ref = both(lambda: fpsim.matmul(a, b, c if with_c else None, model=m))
        assert_same_bits(got, ref)
    # wide exponent spread: terms far outside the alignment window, products near the input format's limits
    a, b, c = _case(rng, m, 4, 2 * ki + 3, 6, spread=40)
    assert_same_bits(*both(lambda: fpsim.matmul(a, b, c, model=m)))
    # special values in A, B and C
    a, b, c = _case(rng, m, 6, 2 * ki + 1, 8)
    _with_specials(rng, a, b, c)
    assert_same_bits(*both(lambda: fpsim.matmul(a, b, c, model=m)))
    # dot (row-wise chains) takes the compiled path too
    x, y, cd = _case(rng, m, 9, 2 * ki + 3, 9)
    assert_same_bits(*both(lambda: fpsim.mma.dot(x, y.T, cd[:, 0], m)))


@pytest.mark.parametrize("spec", ["h100:fp16", "h100:fp16:fp16", "h100:fp8_e4m3:fp16", "b200:fp8_e4m3",
                                  "h100:bf16", "v100:fp16:fp16", "ada:fp8_e5m2:fp16"])
def test_special_values_and_overflow(spec: str) -> None:
    m = fpsim.mma.as_model(spec)
    rng = np.random.default_rng(7)
    ki = m.instruction_k
    kk = 3 * ki
    top = m.input.max
    # every kind of special in one place each: NaN, +inf, -inf, inf * 0, +inf and -inf together
    a = np.ones((6, kk))
    b = np.ones((kk, 5))
    c = np.zeros((6, 5))
    a[0, 0] = np.nan
    a[1, ki] = np.inf
    b[ki, 1] = 0.0
    a[2, 1] = np.inf
    a[2, 2] = -np.inf
    b[:, 3] = -1.0
    c[3, 0] = np.inf
    c[4, 4] = -np.inf
    c[5, 2] = np.nan
    assert_same_bits(*both(lambda: fpsim.matmul(a, b, c, model=m)))
    # overflow of the block sum to inf (fp16 out, bf16 products), then an inf of the other sign later
    a = rng.choice([-1.0, 1.0], (4, kk)) * top
    b = np.abs(rng.choice([-1.0, 1.0], (kk, 4))) * top
    b[-1, 0] = -np.inf
    a[0, -1] = 1.0
    assert_same_bits(*both(lambda: fpsim.matmul(a, b, model=m)))
    # exact cancellation everywhere: zero sums (+0), a -0 addend
    a = rng.standard_normal((3, kk))
    b = np.repeat(rng.standard_normal((kk // 2, 4)), 2, axis=0)
    b[1::2] *= -1
    a[:, 1::2] = a[:, 0::2]
    cz = np.full((3, 4), -0.0)
    got, ref = both(lambda: fpsim.matmul(a, b, cz, model=m))
    assert_same_bits(got, ref)


@pytest.mark.parametrize("spec", ["h100:fp16", "h100:fp8_e4m3:fp16", "b200:fp8_e5m2"])
def test_shapes(spec: str) -> None:
    m = fpsim.mma.as_model(spec)
    rng = np.random.default_rng(3)
    for (mm, kk, nn) in ((0, 5, 3), (4, 0, 3), (4, 5, 0), (1, 1, 1), (2, 37, 1)):
        a, b, c = rng.standard_normal((mm, kk)), rng.standard_normal((kk, nn)), rng.standard_normal((mm, nn))
        assert_same_bits(*both(lambda: fpsim.matmul(a, b, c, model=m)))
        assert_same_bits(*both(lambda: fpsim.matmul(a, b, model=m)))
    a3 = rng.standard_normal((3, 4, 40))
    b2 = rng.standard_normal((40, 5))
    b3 = rng.standard_normal((3, 40, 5))
    c = rng.standard_normal((4, 5))
    assert_same_bits(*both(lambda: fpsim.matmul(a3, b2, c, model=m)))  # shared B: rows stacked
    assert_same_bits(*both(lambda: fpsim.matmul(a3, b3, model=m)))  # batched B: one compiled call
    assert_same_bits(*both(lambda: fpsim.matmul(a3, b3, c, model=m, promote_every=32)))
    assert_same_bits(*both(lambda: fpsim.matmul(a3[:, None], b3[None], model=m)))  # broadcast batch (3, 3)
    v = rng.standard_normal(40)
    assert_same_bits(*both(lambda: fpsim.matmul(v, b2, model=m)))
    assert_same_bits(*both(lambda: fpsim.matmul(a3[0], v, model=m)))
    # float32 in, float32 out
    a32, b32 = a3[0].astype(np.float32), b2.astype(np.float32)
    got, ref = both(lambda: fpsim.matmul(a32, b32, model=m))
    assert got.dtype == np.float32
    assert_same_bits(got, ref)
    # dot: broadcast rows, K = 0, empty
    assert_same_bits(*both(lambda: fpsim.mma.dot(a3, v, None, m)))
    assert_same_bits(*both(lambda: fpsim.mma.dot(np.zeros((3, 0)), np.zeros((3, 0)), 1.5, m)))
    assert_same_bits(*both(lambda: fpsim.mma.dot(np.zeros((0, 4)), np.zeros((0, 4)), None, m)))


@pytest.mark.parametrize("spec", ["h100:fp8_e4m3", "h100:fp16", "h100:fp8_e5m2:fp16"])
def test_promotion_and_scales(spec: str) -> None:
    m = fpsim.mma.as_model(spec)
    rng = np.random.default_rng(11)
    pe = 4 * m.instruction_k
    kk = 3 * pe + 5
    a, b, c = _case(rng, m, 5, kk, 130, spread=6)
    assert_same_bits(*both(lambda: fpsim.matmul(a, b, c, model=m, promote_every=pe)))
    groups = -(-kk // pe)
    sa = np.exp2(rng.integers(-8, 8, (5, groups))) * rng.uniform(1, 2, (5, groups))
    sb = np.exp2(rng.integers(-8, 8, (groups, 2))) * rng.uniform(1, 2, (groups, 2))
    assert_same_bits(*both(lambda: fpsim.matmul(a, b, c, model=m, promote_every=pe, scales=(sa, sb))))
    sb_full = np.exp2(rng.integers(-8, 8, (groups, 130)))
    assert_same_bits(*both(lambda: fpsim.matmul(a, b, model=m, promote_every=pe, scales=(sa, sb_full))))


def test_scaled_tensor_operands() -> None:
    rng = np.random.default_rng(5)
    m = get_model("h100", "fp8_e4m3")
    x = rng.standard_normal((6, 256)).astype(np.float32)
    w = rng.standard_normal((256, 128)).astype(np.float32)
    for kw_a, kw_b in (({}, {}), ({"block": (1, 128)}, {"block": (128, 128)})):
        qa = fpsim.scaling.quantize_scaled(x, "fp8_e4m3", **kw_a)  # type: ignore[arg-type]
        qb = fpsim.scaling.quantize_scaled(w, "fp8_e4m3", **kw_b)  # type: ignore[arg-type]
        assert_same_bits(*both(lambda: fpsim.matmul(qa, qb, model=m)))


@pytest.mark.parametrize("spec", ["h100:fp16", "h100:fp8_e4m3:fp16", "fma_chain", "pairwise"])
def test_thread_counts_give_the_same_bits(spec: str) -> None:
    m = fpsim.mma.as_model(spec)
    rng = np.random.default_rng(9)
    a, b, c = _case(rng, m, 70, 260, 150)  # above the compiled kernel's threading threshold
    _with_specials(rng, a, b, c)
    old, oldc = rounding.max_threads, G.use_c_gemm
    try:
        G.use_c_gemm = True
        outs = []
        for t in (1, 2, 3, 7):
            rounding.max_threads = t
            outs.append(fpsim.matmul(a, b, c, model=m))
        G.use_c_gemm = False
        ref = fpsim.matmul(a, b, c, model=m)
    finally:
        rounding.max_threads, G.use_c_gemm = old, oldc
    for o in outs:
        assert_same_bits(o, ref)


def test_inputs_not_modified_and_flag_forces_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    m = get_model("h100", "fp8_e4m3", "fp16")  # mod-4 grouping: the compiled path permutes K
    rng = np.random.default_rng(2)
    a, b, c = _case(rng, m, 5, 70, 6)
    _with_specials(rng, a, b, c)
    a0, b0, c0 = a.copy(), b.copy(), c.copy()
    both(lambda: fpsim.matmul(a, b, c, model=m, promote_every=32))
    both(lambda: fpsim.mma.dot(a[:, :6], b[:6].T[:5], c[:, 0], m))
    assert_same_bits(a, a0)
    assert_same_bits(b, b0)
    assert_same_bits(c, c0)

    def boom(*args: Any) -> None:
        raise AssertionError("the compiled GEMM ran although use_c_gemm is False")

    monkeypatch.setattr(G, "_cgemm", type("X", (), {"bfma_gemm": staticmethod(boom)}))
    monkeypatch.setattr(G, "use_c_gemm", False)
    fpsim.matmul(a, b, c, model=m)
    fpsim.mma.dot(a, a, None, m)


def test_models_outside_the_kernel_fall_back() -> None:
    """Parameters the integer kernel cannot hold (products over 31 bits) and non-BFMA kinds use NumPy."""
    assert G._c_params(get_model("h100", "fp16").with_(neab=7)) is None
    assert G._c_params(fpsim.mma.generic("fma_chain")) is None  # generic kinds: generic_gemm (below)
    m = get_model("h100", "fp16").with_(neab=7)
    rng = np.random.default_rng(1)
    a, b, c = _case(rng, m, 3, 40, 4)
    assert_same_bits(*both(lambda: fpsim.matmul(a, b, c, model=m)))


GENERIC = [(kind, out, inp, acc) for kind in ("wide", "fma_chain", "pairwise") for out in ("fp32", "fp16", "bf16")
           for inp in ("fp32", "tf32", "fp16", "bf16") for acc in (("fp32", "fp16", "bf16") if kind != "wide"
                                                                  else ("fp32",))]


@pytest.mark.parametrize("kind, out, inp, acc", GENERIC, ids=["-".join(g) for g in GENERIC])
def test_generic_models_bit_identical(kind: str, out: str, inp: str, acc: str) -> None:
    """The compiled 'wide', 'fma_chain' (TwoSum + one rounding per product) and 'pairwise' models against NumPy's."""
    m = fpsim.mma.generic(kind, out, input=inp, acc=acc)
    assert G._g_params(m) is not None
    rng = np.random.default_rng(sum(map(ord, kind + out + inp + acc)))
    for mm, kk, nn, spread, specials in ((6, 70, 9, 20, False), (4, 33, 5, 60, True), (3, 50, 4, 2, False)):
        a, b, c = _case(rng, m, mm, kk, nn, spread=spread)
        if specials:
            _with_specials(rng, a, b, c)
        assert_same_bits(*both(lambda: fpsim.matmul(a, b, c, model=m)))
    # ties of the accumulator: sums that land exactly on a midpoint, decided by the sticky part
    a = np.array([[1.0, 2.0**-24, 2.0**-60, -(2.0**-60)]])
    b = np.ones((4, 1))
    assert_same_bits(*both(lambda: fpsim.matmul(a, b, model=m)))


def test_pairwise_tree_for_every_k() -> None:
    """The streaming stack builds NumPy's level-by-level tree (odd elements carried) for every K."""
    m = fpsim.mma.generic("pairwise", input="fp32", acc="fp16")
    rng = np.random.default_rng(8)
    for kk in list(range(1, 70)) + [127, 128, 129, 255, 257, 1000]:
        a = rng.standard_normal((2, kk)) * np.exp2(rng.integers(-6, 6, (2, kk)))
        b = rng.standard_normal((kk, 3))
        assert_same_bits(*both(lambda: fpsim.matmul(a, b, model=m)))


def test_fma_chain_sticky_ties() -> None:
    """p + d whose double sum lands exactly on an fp32 midpoint while the exact sum lies just off it: a double
    rounding would pick the even neighbour; one correct rounding (the compiled TwoSum path) must not."""
    m = fpsim.mma.generic("fma_chain", input="fp32")
    a_ = 2.0**6 * (1 + 2.0**-15)
    b_ = 1 - 2.0**-15  # a_ * b_ = 2**6 - 2**-24 exactly
    d0 = 2.0**30 + 2.0**7  # exact sum d0 + a_ b_ = 2**30 + 2**7 + 2**6 - 2**-24: just below the midpoint
    A = np.array([[d0, a_], [-d0, -a_]])
    B = np.array([[1.0], [b_]])
    want = np.array([[d0], [-d0]])  # RNE: the neighbour below in magnitude (the odd one)
    got, ref = both(lambda: fpsim.matmul(A, B, model=m))
    assert_same_bits(got, want)
    assert_same_bits(ref, want)


def test_generic_fallbacks() -> None:
    """exact, promotion and non-IEEE accumulators stay on the NumPy path."""
    assert G._g_params(fpsim.mma.generic("exact")) is None
    assert G._g_params(fpsim.mma.generic("fma_chain", acc="fp8_e4m3")) is None
    m = fpsim.mma.generic("fma_chain", "fp16", input="fp16")
    rng = np.random.default_rng(4)
    a, b, c = _case(rng, m, 3, 40, 5)
    assert_same_bits(*both(lambda: fpsim.matmul(a, b, c, model=m, promote_every=16)))


def test_kernel_rejects_bad_arguments() -> None:
    p = G._c_params(get_model("h100", "fp16"))
    assert p is not None
    a, b, d = np.zeros((2, 16)), np.zeros((16, 3)), np.zeros((2, 3))
    with pytest.raises(ValueError, match="buffer sizes"):
        G._cgemm.bfma_gemm(a, b, d, 2, 4, 16, 0, 16, p, 1, 1, 3, 0, 1)
    with pytest.raises(ValueError, match="K range"):
        G._cgemm.bfma_gemm(a, b, d, 2, 3, 16, 0, 8, p, 1, 1, 3, 0, 1)
    with pytest.raises(ValueError, match="tile"):
        G._cgemm.bfma_gemm(a, b, d, 2, 3, 16, 0, 16, p, 1, 1, 1000, 0, 1)
    gp = G._g_params(fpsim.mma.generic("fma_chain"))
    with pytest.raises(ValueError, match="buffer sizes"):
        G._cgemm.generic_gemm(a, b, d, 2, 3, 15, gp, 1, 1, 3)
    with pytest.raises(ValueError, match="model parameters"):
        G._cgemm.generic_gemm(a, b, d, 2, 3, 16, (3,) + gp[1:], 1, 1, 3)


# --- the published hardware rows, with the compiled path forced on ------------------------------------------

def _hw_module() -> Any:
    path = Path(__file__).with_name("test_mma_hw.py")
    spec = importlib.util.spec_from_file_location("_fpsim_test_mma_hw", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


HW = _hw_module()


@pytest.fixture
def c_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(G, "use_c_gemm", True)


@pytest.mark.skipif(not HW.SETS, reason="published Tensor Core rows not found")
@pytest.mark.parametrize("gpu, fmt, out", HW.SETS, ids=["-".join(s) for s in HW.SETS])
def test_published_rows_with_the_compiled_path(gpu: str, fmt: str, out: str, c_path: None) -> None:
    a, b, c, want = HW.load(gpu, fmt, out)
    model = get_model(HW.DEVICES[gpu], HW.FORMATS[fmt], out)
    got = fpsim.mma.dot(a, b, c, model, input_rounding="exact")
    assert HW._mismatches(got, want).size == 0
    # the same rows through the GEMM kernel: the diagonal of A @ B.T + c[:, None] holds c_i + a_i . b_i
    rows = slice(0, 64)
    d = fpsim.matmul(a[rows], b[rows].T, c[rows][:, None], model=model, input_rounding="exact")
    assert HW._mismatches(np.diagonal(d), want[rows]).size == 0


def test_hw_model_variants_with_the_compiled_path(c_path: None) -> None:
    if not HW.SETS:
        pytest.skip("published Tensor Core rows not found")
    HW.test_model_variants_are_load_bearing()


def test_a30_features_with_the_compiled_path(c_path: None) -> None:
    path = Path(__file__).with_name("test_mma_devices.py")
    spec = importlib.util.spec_from_file_location("_fpsim_test_mma_devices", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.test_a30_fp16_matches_hpec_output()


# ---------------------------------------------------------------------------------------------------------
# The training runtime's private entry (already-rounded float32 operands, batched in one call)
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", ["v100", "a100", "h100"])
@pytest.mark.parametrize("fmt", ["fp16", "bf16"])
@pytest.mark.parametrize("with_c", [False, True])
def test_matmul_values_equals_public_matmul(device: str, fmt: str, with_c: bool) -> None:
    from fpsim.mma import gemm as G
    from fpsim.mma import get_model

    try:
        m = get_model(device, fmt, "fp32")
    except ValueError:
        pytest.skip(f"{device} has no {fmt} model")
    rng = np.random.default_rng(7)

    def vals(shape: tuple[int, ...]) -> np.ndarray:
        x = rng.standard_normal(shape) * np.exp2(rng.integers(-12, 6, shape))
        return np.asarray(fpsim.round(x.astype(np.float32), fmt), dtype=np.float32)

    cases = [(vals((5, 37)), vals((37, 9))),             # plain 2-D
             (vals((3, 4, 20)), vals((20, 6))),          # batch with a shared B
             (vals((2, 3, 4, 20)), vals((2, 3, 20, 4)))]  # batched B (attention)
    for a, b in cases:
        shape = a.shape[:-1] + (b.shape[-1],)
        c = rng.standard_normal(shape).astype(np.float32) if with_c else None
        a0, b0 = a.copy(), b.copy()
        got = G._matmul_values(a, b, c, m)
        want = np.asarray(fpsim.matmul(a, b, c, model=m, input_rounding="exact"), dtype=np.float32)
        assert got.dtype == np.float32 and got.shape == want.shape
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
        assert np.array_equal(a, a0) and np.array_equal(b, b0)


def test_late_add_nan_is_positive_like_the_reference() -> None:
    """inf + -inf in a late addition: the compiled path gives the NumPy path's +NaN (review finding)."""
    from fpsim.mma import gemm as G
    from fpsim.mma import get_model

    m = get_model("h200", "fp8_e5m2", "fp16")
    a = np.full((1, 32), 60000.0)
    b = np.full((32, 1), 60000.0)
    c = np.array([[-np.inf]])
    bits = []
    for flag in (True, False):
        old = G.use_c_gemm
        G.use_c_gemm = flag
        try:
            bits.append(np.asarray(fpsim.matmul(a, b, c, model=m)).view(np.uint64).ravel()[0])
        finally:
            G.use_c_gemm = old
    assert bits[0] == bits[1] == 0x7FF8000000000000


def _pool_gemm() -> tuple[np.ndarray, np.ndarray, Any]:
    """Operands of a GEMM large enough to run on the kernel's worker threads (fpsim/_cpool.h)."""
    rng = np.random.default_rng(3051)
    m = get_model("h100", "fp16")
    a = np.asarray(G.convert_inputs(rng.standard_normal((96, 160)), m.input, None, "A"), np.float32)
    b = np.asarray(G.convert_inputs(rng.standard_normal((160, 128)), m.input, None, "B"), np.float32)
    assert a.shape[0] * a.shape[1] * b.shape[1] >= G._C_MIN_PARALLEL
    return a, b, m


def _pool_child(q: Any) -> None:
    a, b, m = _pool_gemm()
    q.put(np.asarray(G._matmul_values(a, b, None, m)).tobytes())


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
def test_gemm_threads_after_fork_in_a_child(monkeypatch: pytest.MonkeyPatch) -> None:
    """The parent's GEMM worker threads do not survive a fork: a forked child starts an empty pool and runs a
    threaded GEMM (it would wait forever on the parent's workers otherwise), the same bits as its parent."""
    from _fork import in_forked_child

    monkeypatch.setattr(rounding, "max_threads", 2)
    monkeypatch.setattr(G, "use_c_gemm", True)
    a, b, m = _pool_gemm()
    want = np.asarray(G._matmul_values(a, b, None, m)).tobytes()  # the parent's pool has run
    assert in_forked_child(_pool_child) == want


def test_gemm_concurrent_callers_share_or_bypass_the_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """Python threads running GEMMs at once (the GIL is released): one dispatch at a time uses the worker
    pool, the others start threads of their own; every result has the bits of a lone call."""
    import threading

    monkeypatch.setattr(rounding, "max_threads", 3)
    monkeypatch.setattr(G, "use_c_gemm", True)
    a, b, m = _pool_gemm()
    want = np.asarray(G._matmul_values(a, b, None, m))
    bad: list[int] = []

    def work(i: int) -> None:
        for _ in range(4):
            if not np.array_equal(np.asarray(G._matmul_values(a, b, None, m)).view(np.uint32), want.view(np.uint32)):
                bad.append(i)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not bad and not any(t.is_alive() for t in ts)
