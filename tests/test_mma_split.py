"""Split-precision GEMMs (BF16x3/x6/x9, TF32x3: fpsim.mma.xla) against references written from XLA's source.

No JAX CPU oracle exists for them (checked below, version-aware): XLA:CPU in JAX 0.10.2 ignores ``BF16_BF16_F32_X3``
and ``_X6`` (it returns the ``F32_F32_F32`` bits) and rejects ``_X9`` and ``TF32_TF32_F32_X3``. So every claim here
is against a hand-written reference that follows the compiler source step by step and never calls fpsim:

* the splits: ml_dtypes' float32 -> bfloat16 cast (RNE) and integer bit arithmetic for ``cvt.rna.tf32.f32``;
* each pass: MPFR (gmpy2), either rounded once from the exact dot plus the incoming partial, or a sequential fp32
  FMA chain; and MMA-Sim's H100 ``mma.sync`` (m16n8k16 bf16, m16n8k8 tf32) chained along K, for the H100 preset;
* the composition (Triton: per K tile a zero partial through every pass in the emitter's order, ``ZeroNaNs``
  before hi*hi, the tile's partial added to the fp32 accumulator; rewriter: passes summed outside) in Python.
"""

from __future__ import annotations

from typing import Callable

import gmpy2
import numpy as np
import pytest

import zlib

from fpsim.formats import bf16
from fpsim.mma import generic, presets
from fpsim.mma import xla

ml_dtypes = pytest.importorskip("ml_dtypes")

F32 = np.float32
# The emitters' pass orders (stablehlo_lower_to_triton.cc @0ffbfc8; F32DotTC.cpp @78ef52f), 0 = hi, 1 = mid, 2 = lo.
TRITON = {
    "bf16x3": (2, [(1, 0), (0, 1), (0, 0)], True),
    "bf16x6": (3, [(1, 1), (2, 0), (0, 2), (1, 0), (0, 1), (0, 0)], True),
    "bf16x9": (3, [(2, 2), (1, 2), (2, 1), (1, 1), (2, 0), (0, 2), (1, 0), (0, 1), (0, 0)], True),
    "tf32x3": (2, [(1, 0), (0, 1), (0, 0)], False),
}


# ----------------------------------------------------------------------------------- references

def _ref_bf16_split(x: np.ndarray, n: int) -> list[np.ndarray]:
    """SplitF32: c = bf16_RNE(rest); rest = rest - f32(c) (ml_dtypes cast, NumPy fp32 subtraction)."""
    parts, rest = [], x.astype(F32)
    with np.errstate(invalid="ignore", over="ignore"):
        for i in range(n):
            c = rest.astype(ml_dtypes.bfloat16).astype(F32)
            parts.append(c)
            if i < n - 1:
                rest = (rest - c).astype(F32)
    return parts


def _ref_tf32_split(x: np.ndarray) -> list[np.ndarray]:
    """cvt.rna.tf32.f32: add half a tf32 ulp to the magnitude bits and clear the low 13 (carries into the exponent,
    overflowing to inf as RNA does); NaN and inf pass through. small = x - big in fp32."""
    u = x.astype(F32).view(np.uint32)
    finite = (u & np.uint32(0x7F800000)) != np.uint32(0x7F800000)
    big = np.where(finite, (u + np.uint32(0x1000)) & np.uint32(0xFFFFE000), u).astype(np.uint32).view(F32)
    with np.errstate(invalid="ignore", over="ignore"):
        return [big, (x.astype(F32) - big).astype(F32)]


def _tf32_truncate(x: np.ndarray) -> np.ndarray:
    """What a tensor core reads from an fp32 register for a tf32 operand: the top 19 bits."""
    return (x.astype(F32).view(np.uint32) & np.uint32(0xFFFFE000)).view(F32)


def _ctx(p: int = 24) -> gmpy2.context:
    return gmpy2.context(precision=p, emin=-126 - (p - 1) + 1, emax=128, subnormalize=True,
                         round=gmpy2.RoundToNearest)


def _exact_pass(a: list[float], b: list[float], c: float) -> float:
    """One rounding to fp32 of the exact sum of the products and the incoming partial."""
    with gmpy2.context(precision=4000, emin=-20000, emax=20000):
        s = sum((gmpy2.mpfr(x) * gmpy2.mpfr(y) for x, y in zip(a, b)), gmpy2.mpfr(c))
    with _ctx():
        return float(gmpy2.mpfr(s))


def _chain_pass(a: list[float], b: list[float], c: float) -> float:
    """d = c; d = fma(a_i, b_i, d) rounded to fp32 each step."""
    with _ctx():
        d = gmpy2.mpfr(c)
        for x, y in zip(a, b):
            d = gmpy2.fma(gmpy2.mpfr(x), gmpy2.mpfr(y), d)
        return float(d)


def _f32_add(x: float, y: float) -> float:
    with _ctx():
        return float(gmpy2.mpfr(x) + gmpy2.mpfr(y))


def _zero_nans(v: float) -> float:
    return v if abs(v) < np.inf else 0.0  # select(inf > |r|, r, 0): NaN and +-inf become 0


def _ref_triton_dot(pa: list[np.ndarray], pb: list[np.ndarray], passes: list[tuple[int, int]], guard: bool,
                    block_k: int, pass_fn: Callable[[list[float], list[float], float], float]) -> float:
    k = pa[0].shape[0]
    acc = 0.0
    for k0 in range(0, k, block_k):
        part = 0.0
        for n, (i, j) in enumerate(passes):
            if guard and n == len(passes) - 1:
                part = _zero_nans(part)
            part = pass_fn([float(v) for v in pa[i][k0:k0 + block_k]], [float(v) for v in pb[j][k0:k0 + block_k]],
                           part)
        acc = _f32_add(acc, part)
    return acc


def _parts(x: np.ndarray, alg: str) -> list[np.ndarray]:
    n = TRITON[alg][0]
    return _ref_tf32_split(x) if alg == "tf32x3" else _ref_bf16_split(x, n)


def _ref_triton(A: np.ndarray, B: np.ndarray, alg: str, block_k: int, pass_fn) -> np.ndarray:  # type: ignore[no-untyped-def]
    _, passes, guard = TRITON[alg]
    pa, pb = _parts(A, alg), _parts(B, alg)
    if alg == "tf32x3":  # the pass reads the fp32 parts as tf32 (the big parts are tf32 already)
        pa, pb = [_tf32_truncate(p) for p in pa], [_tf32_truncate(p) for p in pb]
    m, n = A.shape[0], B.shape[1]
    out = np.empty((m, n), F32)
    for r in range(m):
        for c in range(n):
            out[r, c] = _ref_triton_dot([p[r] for p in pa], [p[:, c] for p in pb], passes, guard, block_k, pass_fn)
    return out


# ----------------------------------------------------------------------------------- test data

def _matrix(rng: np.random.Generator, kind: str, shape: tuple[int, int]) -> np.ndarray:
    """Random and adversarial fp32 operands (finite)."""
    if kind == "normal":
        return rng.standard_normal(shape).astype(F32)
    if kind == "spread":  # 40 binades: small parts of big terms meet big parts of small ones
        return (rng.standard_normal(shape) * 2.0 ** rng.integers(-20, 21, shape)).astype(F32)
    if kind == "ties":  # low halves on bf16 ties and tie +- 1: every split component rounds at a tie
        hi = rng.integers(0x3E00, 0x4100, shape).astype(np.uint32) << 16
        lo = rng.choice(np.array([0x8000, 0x7FFF, 0x8001, 0x0080, 0x8080, 0x4040, 0xFFFF, 0x1000], np.uint32), shape)
        sign = rng.integers(0, 2, shape).astype(np.uint32) << 31
        return (hi | lo | sign).view(F32)
    if kind == "cancel":  # neighbours along K whose products nearly cancel in hi*hi (A: x, -x(1 + 2**-12);
        h = rng.standard_normal((shape[0], shape[1] // 2)).astype(F32)  # B: |y|, |y|(1 + 2**-12))
        return np.stack([h, h], axis=-1).reshape(shape) * np.tile(np.array([1, -(1 + 2.0**-12)], F32), shape[1] // 2)
    if kind == "subnormal":  # components below bf16's normal range (bf16 keeps subnormals on NVIDIA)
        return (rng.standard_normal(shape) * 2.0 ** rng.integers(-140, -110, shape)).astype(F32)
    if kind == "huge":  # partial products overflow to inf in some rows
        return (rng.standard_normal(shape) * 2.0 ** rng.integers(40, 66, shape)).astype(F32)
    raise AssertionError(kind)


def _b(rng: np.random.Generator, kind: str, k: int, n: int) -> np.ndarray:
    """B (k, n) of a kind, made along K like A (the cancelling pairs then meet)."""
    b = _matrix(rng, kind, (n, k)).T.astype(F32)
    return b if kind != "cancel" else np.abs(b)


KINDS = ["normal", "spread", "ties", "cancel", "subnormal", "huge"]


def _same_bits(got: np.ndarray, want: np.ndarray) -> int:
    """Mismatches, NaN equal to NaN (any payload), +0 distinct from -0."""
    g, w = np.asarray(got, F32), np.asarray(want, F32)
    both_nan = np.isnan(g) & np.isnan(w)
    return int(np.count_nonzero((g.view(np.uint32) != w.view(np.uint32)) & ~both_nan))


# ----------------------------------------------------------------------------------- splits

def _split_inputs() -> np.ndarray:
    """All 2**16 low halves under 24 high halves (zero, subnormal, normal, near-max, inf/NaN, both signs),
    plus 2**18 random bit patterns."""
    highs = np.array([0x0000, 0x0001, 0x007F, 0x0080, 0x0100, 0x3F7F, 0x3F80, 0x3FFF, 0x4B00, 0x7F00, 0x7F7F,
                      0x7F80], np.uint32)
    highs = np.concatenate([highs, highs | 0x8000])
    lows = np.arange(2**16, dtype=np.uint32)
    grid = ((highs[:, None] << 16) | lows[None, :]).ravel()
    rnd = np.random.default_rng(11).integers(0, 2**32, 2**18, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([grid, rnd]).view(F32)


@pytest.mark.parametrize("n", [2, 3])
def test_rne_split_against_ml_dtypes(n: int) -> None:
    """Triton's SplitF32 (mode='rne') bit for bit against ml_dtypes' RNE casts, 1,835,008 inputs."""
    x = _split_inputs()
    got, want = xla.split(x, n, mode="rne"), _ref_bf16_split(x, n)
    bad = [_same_bits(g, w) for g, w in zip(got, want)]
    assert bad == [0] * n, f"mismatches per component over {x.size} inputs: {bad}"


def test_rna_tf32_split_against_bit_arithmetic() -> None:
    """TF32x3's split (cvt.rna.tf32.f32, then x - big) against integer bit arithmetic, 1,835,008 inputs."""
    x = _split_inputs()
    got, want = xla.split(x, 2, mode="rna_tf32"), _ref_tf32_split(x)
    bad = [_same_bits(g, w) for g, w in zip(got, want)]
    assert bad == [0, 0], f"mismatches per component over {x.size} inputs: {bad}"
    fin = np.isfinite(x) & np.isfinite(got[0])
    # Away from overflow the split is exact: big + small == x.
    assert np.array_equal(got[0][fin].astype(np.float64) + got[1][fin], x[fin].astype(np.float64))


def test_split_modes_differ_where_the_sources_do() -> None:
    x = np.array([1 - 2.0**-9, 1 + 2.0**-8 + 2.0**-9], F32)
    trunc, rne = xla.split(x, 2), xla.split(x, 2, mode="rne")
    assert trunc[0].tolist() == [1 - 2.0**-8, 1.0] and rne[0].tolist() == [1.0, 1 + 2.0**-7]
    with pytest.raises(ValueError, match="valid: truncate, rne, rna_tf32"):
        xla.split(x, 2, mode="rtz")
    with pytest.raises(ValueError, match="2 components"):
        xla.split(x, 3, mode="rna_tf32")


# ----------------------------------------------------------------------------------- compositions, MPFR

@pytest.mark.parametrize("alg", list(TRITON))
@pytest.mark.parametrize("pass_model", ["exact", "chain"])
def test_triton_lowering_against_mpfr(alg: str, pass_model: str) -> None:
    """Every kind of operand, K = 40 in tiles of 16 (the last one short), each pass exact-then-rounded or a
    sequential fp32 FMA chain, against the MPFR reference: 6 kinds x 4 x 3 = 72 outputs per case."""
    rng = np.random.default_rng(zlib.crc32(f"{alg}{pass_model}".encode()))
    part = "tf32" if alg == "tf32x3" else "bf16"
    if pass_model == "exact":
        pm, fn = generic("exact", "fp32", input=part), _exact_pass
    else:
        pm, fn = generic("fma_chain", "fp32", input=part, acc="fp32"), _chain_pass
    total = bad = 0
    for kind in KINDS:
        A, B = _matrix(rng, kind, (4, 40)), _b(rng, kind, 40, 3)
        got = xla.matmul(A, B, algorithm=alg, device="h100", lowering="triton", block_k=16, pass_model=pm)
        want = _ref_triton(A, B, alg, 16, fn)
        total += want.size
        bad += _same_bits(got, want)
    assert bad == 0, f"{bad} of {total} outputs differ"


# ----------------------------------------------------------------------------------- compositions, MMA-Sim

def _sim_ops():  # type: ignore[no-untyped-def]
    sim = pytest.importorskip("mmasim.nv_ptx.sim")
    torch = pytest.importorskip("torch")
    return torch, {"bf16": (sim.MMA("Hopper", "m16n8k16.f32.bf16.bf16.f32"), 16, torch.bfloat16),
                   "tf32": (sim.MMA("Hopper", "m16n8k8.f32.tf32.tf32.f32"), 8, torch.float32)}


def _sim_pass(torch, op, k: int, dt, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:  # type: ignore[no-untyped-def]
    """One tt.dot: mma.sync instructions along K, each taking the previous D as C (K padded with zeros)."""
    kk = -(-a.shape[1] // k) * k
    a = np.pad(a, ((0, 0), (0, kk - a.shape[1])))
    b = np.pad(b, ((0, kk - b.shape[0]), (0, 0)))
    d = torch.from_numpy(c.copy())
    for k0 in range(0, kk, k):
        d = op(torch.from_numpy(np.ascontiguousarray(a[:, k0:k0 + k])).to(dt),
               torch.from_numpy(np.ascontiguousarray(b[k0:k0 + k])).to(dt), d)
    return np.asarray(d.numpy(), F32)


def _sim_triton(torch, ops, A: np.ndarray, B: np.ndarray, alg: str, block_k: int) -> np.ndarray:  # type: ignore[no-untyped-def]
    _, passes, guard = TRITON[alg]
    op, k, dt = ops["tf32" if alg == "tf32x3" else "bf16"]
    pa, pb = _parts(A, alg), _parts(B, alg)
    acc = np.zeros((A.shape[0], B.shape[1]), F32)
    for k0 in range(0, A.shape[1], block_k):
        part = np.zeros_like(acc)
        for n, (i, j) in enumerate(passes):
            if guard and n == len(passes) - 1:
                part = np.where(np.abs(part) < np.inf, part, F32(0)).astype(F32)
            part = _sim_pass(torch, op, k, dt, pa[i][:, k0:k0 + block_k], pb[j][k0:k0 + block_k], part)
        with np.errstate(invalid="ignore", over="ignore"):
            acc = (acc + part).astype(F32)
    return acc


@pytest.mark.slow
@pytest.mark.parametrize("alg", list(TRITON))
def test_triton_lowering_on_h100_against_mmasim(alg: str) -> None:
    """The H100 preset's passes against MMA-Sim 'Hopper' mma.sync, composed as the emitter does: 6 kinds x
    block_k in (32, 64) x 16 x 8 outputs, K = 64."""
    torch, ops = _sim_ops()
    rng = np.random.default_rng(zlib.crc32(f"sim{alg}".encode()))
    total = bad = 0
    for kind in KINDS:
        A, B = _matrix(rng, kind, (16, 64)), _b(rng, kind, 64, 8)
        for bk in (32, 64):
            got = xla.matmul(A, B, algorithm=alg, device="h100", lowering="triton", block_k=bk)
            want = _sim_triton(torch, ops, A, B, alg, bk)
            total += want.size
            bad += _same_bits(got, want)
    assert bad == 0, f"{bad} of {total} outputs differ"


@pytest.mark.slow
@pytest.mark.parametrize("alg", ["BF16_BF16_F32_X3", "BF16_BF16_F32_X6"])
def test_rewriter_lowering_on_h100_against_mmasim(alg: str) -> None:
    """The rewriter's form on the H100 passes: truncation splits, whole-K passes from C = 0, summed outside."""
    torch, ops = _sim_ops()
    op, k, dt = ops["bf16"]
    n = 2 if alg.endswith("X3") else 3
    passes = {2: [(1, 0), (0, 1), (0, 0)], 3: [(1, 1), (0, 2), (2, 0), (0, 1), (1, 0), (0, 0)]}[n]
    rng = np.random.default_rng(21 + n)
    total = bad = 0
    for kind in KINDS:
        A, B = _matrix(rng, kind, (16, 48)), _b(rng, kind, 48, 8)

        def trunc_split(x: np.ndarray) -> list[np.ndarray]:
            out, rest = [], x
            with np.errstate(invalid="ignore"):
                for _ in range(n - 1):
                    t = (rest.view(np.uint32) & np.uint32(0xFFFF0000)).view(F32)
                    out.append(t)
                    rest = (rest - t).astype(F32)
            return [*out, rest.astype(ml_dtypes.bfloat16).astype(F32)]

        pa, pb = trunc_split(A), trunc_split(B)
        z = np.zeros((16, 8), F32)
        outs = [_sim_pass(torch, op, k, dt, pa[i], pb[j], z) for i, j in passes]
        with np.errstate(invalid="ignore", over="ignore"):
            r = outs[0]
            for p in outs[1:-1]:
                r = (r + p).astype(F32)
            r = np.where(np.abs(r) <= np.inf, r, F32(0)).astype(F32)  # select(inf >= |r|, r, 0)
            want = (r + outs[-1]).astype(F32)
        got = xla.matmul(A, B, algorithm=alg, device="h100", lowering="rewriter")
        total += want.size
        bad += _same_bits(got, want)
    assert bad == 0, f"{bad} of {total} outputs differ"


# ----------------------------------------------------------------------------------- behaviour

def test_infinities_follow_each_guard() -> None:
    """inf * 1: the bf16 guards remove the NaN of inf - inf; TF32x3 (F32DotTC @78ef52f) has no guard: NaN."""
    A = np.array([[np.inf, 1.0], [-np.inf, 2.0]], F32)
    B = np.ones((2, 1), F32)
    for alg in ("bf16x3", "bf16x6", "bf16x9"):
        got = xla.matmul(A, B, algorithm=alg, device="h100", lowering="triton")
        assert got[:, 0].tolist() == [np.inf, -np.inf], alg
    assert np.isnan(xla.matmul(A, B, algorithm="tf32x3", device="h100")).all()


def test_more_passes_are_closer_and_block_k_matters() -> None:
    rng = np.random.default_rng(31)
    A, B = _matrix(rng, "spread", (8, 256)), _matrix(rng, "spread", (256, 8))
    exact = A.astype(np.float64) @ B.astype(np.float64)
    pm = generic("exact", "fp32", input="bf16")
    err = {a: np.abs(xla.matmul(A, B, algorithm=a, device="h100", lowering="triton", pass_model=pm) - exact).max()
           for a in ("bf16x3", "bf16x6", "bf16x9")}
    assert err["bf16x3"] > err["bf16x6"] >= err["bf16x9"]
    d32 = xla.matmul(A, B, algorithm="bf16x9", device="h100", block_k=32)
    d256 = xla.matmul(A, B, algorithm="bf16x9", device="h100", block_k=256)
    assert np.array_equal(d256, xla.matmul(A, B, algorithm="bf16x9", device="h100"))  # one tile = whole K
    assert not np.array_equal(d32, d256)  # the tile's partial is rounded before it meets the accumulator


def test_dot_rows_and_batches_match_matmul() -> None:
    rng = np.random.default_rng(41)
    A, B = _matrix(rng, "normal", (2, 3, 40)), _matrix(rng, "normal", (2, 40, 5))
    for alg in ("bf16x9", "tf32x3"):
        d = xla.matmul(A, B, algorithm=alg, device="a100", block_k=16)
        assert d.shape == (2, 3, 5) and d.dtype == F32
        for b in range(2):
            assert np.array_equal(d[b], xla.matmul(A[b], B[b], algorithm=alg, device="a100", block_k=16))
        rows = xla.dot(A[:, :, None, :], np.swapaxes(B, 1, 2)[:, None, :, :], algorithm=alg, device="a100",
                       block_k=16)
        assert np.array_equal(rows, d)
    A0, B0 = A.copy(), B.copy()
    xla.matmul(A, B, np.ones((3, 5), F32), algorithm="bf16x9", device="h100")
    assert np.array_equal(A, A0) and np.array_equal(B, B0)  # inputs never modified


def test_names_lowerings_and_errors() -> None:
    assert xla.algorithm("bf16x9", "h100") is xla.TRITON_ALGORITHMS["bf16_bf16_f32_x9"]
    assert xla.algorithm("BF16_BF16_F32_X3", "h100").lowering == "rewriter"
    assert xla.algorithm("bf16x3", "h100", lowering="Triton").lowering == "triton"
    assert xla.algorithm("TF32_TF32_F32_X3", "h100").split == "rna"
    with pytest.raises(ValueError, match="no rewriter form"):
        xla.algorithm("bf16x9", "h100", lowering="rewriter")
    with pytest.raises(ValueError, match="valid: rewriter, triton"):
        xla.algorithm("bf16x9", "h100", lowering="cublas")
    with pytest.raises(ValueError, match="not a TPU algorithm"):
        xla.algorithm("bf16x9")
    with pytest.raises(ValueError, match="not a TPU algorithm"):
        xla.algorithm("bf16x3", lowering="triton")
    with pytest.raises(ValueError, match="block_k must be a positive int"):
        xla.matmul(np.ones((1, 4), F32), np.ones((4, 1), F32), algorithm="bf16x9", device="h100", block_k=0)
    with pytest.raises(TypeError, match="block_k must be a positive int"):
        xla.matmul(np.ones((1, 4), F32), np.ones((4, 1), F32), algorithm="bf16x9", device="h100", block_k=16.0)


def test_provenance_in_the_device_table() -> None:
    rows = {(p.device, p.path): p for p in presets("h100") if p.input == "fp32"}
    for path, src in (("bf16x9_triton", "stablehlo_lower_to_triton.cc @0ffbfc8"),
                      ("tf32x3_triton", "F32DotTC.cpp @78ef52f")):
        p = rows[("h100", path)]
        assert src in p.provenance.source and p.provenance.label == "from documentation only"
        assert "not validated on hardware" in p.provenance.note
    assert xla.algorithm("bf16x6", "h100").provenance.source.startswith("openxla/xla xla/service/gpu/transforms")


# ----------------------------------------------------------------------------------- JAX CPU, version-aware

def test_jax_cpu_runs_none_of_them() -> None:
    """Why JAX CPU is no oracle: it ignores X3/X6 (fp32 bits) and rejects X9/TF32x3 (JAX 0.10.2).

    If a later JAX runs one of them on CPU, this test skips and names it (then it can become an oracle).
    """
    jax = pytest.importorskip("jax")
    from jax import lax

    rng = np.random.default_rng(51)
    A, B = _matrix(rng, "spread", (8, 64)), _matrix(rng, "spread", (64, 8))
    P = lax.DotAlgorithmPreset
    with jax.default_device(jax.devices("cpu")[0]):
        ref = np.asarray(lax.dot(A, B, precision=P.F32_F32_F32))
        for name in ("BF16_BF16_F32_X3", "BF16_BF16_F32_X6", "BF16_BF16_F32_X9", "TF32_TF32_F32_X3"):
            try:
                got = np.asarray(lax.dot(A, B, precision=getattr(P, name)))
            except ValueError as e:
                assert "not supported" in str(e), str(e)
                continue
            if not np.array_equal(got, ref):
                pytest.skip(f"JAX {jax.__version__} CPU now runs {name}: use it as an oracle")
    assert not np.array_equal(xla.matmul(A, B, algorithm="bf16x3", device="h100"), ref)


def test_dot_algorithm_checks_its_fields() -> None:
    with pytest.raises(ValueError, match="split must be one of truncate, rne, rna"):
        xla.DotAlgorithm("X", bf16, 2, ((0, 0),), False, "rtz")
    with pytest.raises(ValueError, match="must name components 0..1"):
        xla.DotAlgorithm("X", bf16, 2, ((0, 2),), False)
