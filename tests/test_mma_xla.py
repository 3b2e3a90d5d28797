"""XLA's dot algorithms on the TPU preset (fpsim.mma.xla) against independent oracles.

Oracles: MPFR (gmpy2) for the splits and for every pass and partial sum (written from XLA's rewriter,
not from fpsim); JAX's element-wise XLA:CPU ops (bitcast, mask, subtract, convert) for the split bits.
XLA:CPU itself ignores the dot algorithms (checked below), so no JAX dot can serve as an oracle.
"""

from __future__ import annotations

import gmpy2
import numpy as np
import pytest

import fpsim
from fpsim.mma import get_model, xla

F32 = np.float32


def _ctx(p: int, mode: int = gmpy2.RoundToNearest) -> gmpy2.context:
    # fp32's (or bf16's) exponent range with gradual underflow; MPFR's exponent = IEEE exponent + 1.
    return gmpy2.context(precision=p, emin=-126 - (p - 1) + 1, emax=128, subnormalize=True, round=mode)


def _oracle_split(x: float, n: int) -> list[float]:
    """hi = x truncated to 8 significant bits, lo = RNE_8(rest); 3 parts: hi, mid (both truncated), lo."""
    if n == 1:
        with _ctx(8):
            return [float(gmpy2.mpfr(x))]
    out = []
    rest = gmpy2.mpfr(x, 64)
    for _ in range(n - 1):
        with _ctx(8, gmpy2.RoundToZero):
            t = gmpy2.mpfr(rest)
        out.append(float(t))
        with gmpy2.context(precision=64):
            rest = rest - t
    with _ctx(8):
        out.append(float(gmpy2.mpfr(rest)))
    return out


def _f32_add(a: float, b: float) -> float:
    with _ctx(24):
        return float(gmpy2.mpfr(a) + gmpy2.mpfr(b))


def _exact_pass(a: list[float], b: list[float]) -> float:
    with gmpy2.context(precision=2000):
        s = sum((gmpy2.mpfr(x) * gmpy2.mpfr(y) for x, y in zip(a, b)), gmpy2.mpfr(0))
    with _ctx(24):
        return float(gmpy2.mpfr(s))


def _chain_pass(a: list[float], b: list[float]) -> float:
    d = gmpy2.mpfr(0)
    with _ctx(24):
        for x, y in zip(a, b):
            d = gmpy2.fma(gmpy2.mpfr(x), gmpy2.mpfr(y), d)  # one rounding to fp32 per step
    return float(d)


PASSES = {"BF16_BF16_F32": [(0, 0)], "BF16_BF16_F32_X3": [(1, 0), (0, 1), (0, 0)],
          "BF16_BF16_F32_X6": [(1, 1), (0, 2), (2, 0), (0, 1), (1, 0), (0, 0)]}  # from the XLA rewriter
NCOMP = {"BF16_BF16_F32": 1, "BF16_BF16_F32_X3": 2, "BF16_BF16_F32_X6": 3}


def _oracle_dot(a: np.ndarray, b: np.ndarray, alg: str, pass_fn) -> float:  # type: ignore[no-untyped-def]
    n = NCOMP[alg]
    sa = [_oracle_split(float(v), n) for v in a]
    sb = [_oracle_split(float(v), n) for v in b]
    parts = [pass_fn([s[i] for s in sa], [s[j] for s in sb]) for i, j in PASSES[alg]]
    r = parts[0]
    for p in parts[1:]:
        r = _f32_add(r, p)  # finite inputs: the NaN guard never fires
    return r


def _random(rng: np.random.Generator, shape: tuple[int, ...], spread: int = 6) -> np.ndarray:
    m = rng.standard_normal(shape)
    return np.ldexp(m, rng.integers(-spread, spread + 1, shape)).astype(F32)


# ------------------------------------------------------------------------------------------ splits

def test_split_against_mpfr() -> None:
    rng = np.random.default_rng(1)
    x = _random(rng, (3000,), spread=30)
    for n in (1, 2, 3):
        parts = xla.split(x, n)
        want = np.array([_oracle_split(float(v), n) for v in x], dtype=F32).T
        for k in range(n):
            assert np.array_equal(parts[k].view(np.uint32), want[k].view(np.uint32)), (n, k)
    hi, mid, lo = xla.split(x, 3)
    assert np.array_equal(hi.astype(np.float64) + mid + lo, x.astype(np.float64))  # three parts are exact


def test_split_bits_against_jax_elementwise_ops() -> None:
    """Every float32 bit class (subnormals, inf, NaN, signed zero): the same bits as XLA:CPU's ops."""
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    from jax import lax

    rng = np.random.default_rng(2)
    words = np.concatenate([rng.integers(0, 2**32, 20000, dtype=np.uint64).astype(np.uint32),
                            np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x00000001,
                                      0x007FFFFF, 0x7F7FFFFF, 0x3F808000, 0x3F818000], np.uint32)])
    x = words.view(F32)

    def jax_split(v, n):  # type: ignore[no-untyped-def]
        def trunc(t):  # type: ignore[no-untyped-def]
            return lax.bitcast_convert_type(lax.bitcast_convert_type(t, jnp.uint32) & jnp.uint32(0xFFFF0000),
                                            jnp.float32)
        if n == 1:
            return [v.astype(jnp.bfloat16)]
        hi = trunc(v)
        r = v - hi
        if n == 2:
            return [hi.astype(jnp.bfloat16), r.astype(jnp.bfloat16)]
        mid = trunc(r)
        return [hi.astype(jnp.bfloat16), mid.astype(jnp.bfloat16), (r - mid).astype(jnp.bfloat16)]

    # XLA:CPU runs with subnormals flushed (FTZ/DAZ), so inputs whose split reaches the fp32 subnormal range
    # are compared only for that fact; the rest bit for bit.
    with np.errstate(invalid="ignore"):
        keep = ~(np.abs(x) < 2.0**-100) | (x == 0)
    with jax.default_device(jax.devices("cpu")[0]):
        for n in (1, 2, 3):
            ours = xla.split(x, n)
            theirs = [np.asarray(t.astype(jnp.float32)) for t in jax_split(jnp.asarray(x), n)]
            for o, t in zip(ours, theirs):
                o, t = o[keep], t[keep]
                nan = np.isnan(o) & np.isnan(t)
                assert np.array_equal(o.view(np.uint32)[~nan], t.view(np.uint32)[~nan]), n
                assert np.array_equal(np.isnan(o), np.isnan(t))
        tiny = np.array([2.0**-120 + 2.0**-128], F32)  # x - hi = 2**-128, an fp32 subnormal
        assert float(np.asarray(jax_split(jnp.asarray(tiny), 2)[1].astype(jnp.float32))[0]) == 0.0  # flushed
        assert float(xla.split(tiny, 2)[1][0]) == 2.0**-128  # IEEE arithmetic (ftz=True is the TPU's conversion)


def test_tpu_conversion_flushes_subnormals() -> None:
    """Cloud TPU docs: f32 -> bf16 flushes subnormals; off-TPU (ftz=False) they survive as bf16 subnormals."""
    x = np.array([2.0**-130, -(2.0**-128), 2.0**-120 + 2.0**-128], F32)
    assert xla.split(x, 1, ftz=True)[0].tolist()[:2] == [0.0, -0.0]
    assert xla.split(x, 1)[0].tolist()[:2] == [2.0**-130, -(2.0**-128)]
    hi, lo = xla.split(x, 2, ftz=True)
    assert (hi[2], lo[2]) == (2.0**-120, 0.0)  # the low part 2**-128 is a bf16 subnormal: flushed
    assert xla.split(x, 2)[1][2] == 2.0**-128


def test_split_checks_arguments() -> None:
    with pytest.raises(ValueError, match="1, 2 or 3"):
        xla.split([1.0], 4)
    with pytest.raises(TypeError):
        xla.split([1.0], 2.0)  # type: ignore[arg-type]
    x = np.array([1.1, 2.2], F32)
    before = x.copy()
    xla.split(x, 3)
    assert np.array_equal(x, before)


# ----------------------------------------------------------------------------------- algorithms

@pytest.mark.parametrize("alg", list(PASSES))
@pytest.mark.parametrize("pass_model", ["exact", "tpu"])
def test_algorithm_against_mpfr(alg: str, pass_model: str) -> None:
    """Each pass (exact-then-rounded, or the TPU's sequential fp32 chain) and XLA's fp32 sums, bit for bit."""
    rng = np.random.default_rng(hash((alg, pass_model)) % 2**32)
    m, k, n = 6, 24, 5
    A, B = _random(rng, (m, k)), _random(rng, (k, n))
    pm = "exact" if pass_model == "exact" else None
    got = xla.matmul(A, B, algorithm=alg, pass_model=pm, ftz=False)
    fn = _exact_pass if pass_model == "exact" else _chain_pass
    want = np.array([[_oracle_dot(A[i], B[:, j], alg, fn) for j in range(n)] for i in range(m)], dtype=F32)
    assert got.dtype == F32
    bad = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    assert bad.size == 0, f"{bad.size} of {got.size} differ; first {got.flat[bad[0]]!r} vs {want.flat[bad[0]]!r}"


def test_dot_matches_matmul_and_precision_names() -> None:
    rng = np.random.default_rng(3)
    A, B = _random(rng, (4, 40)), _random(rng, (40, 3))
    for level, alg in (("DEFAULT", "BF16_BF16_F32"), ("high", "BF16_BF16_F32_X3"), ("Highest", "BF16_BF16_F32_X6")):
        d = xla.matmul(A, B, algorithm=level)
        assert np.array_equal(d, xla.matmul(A, B, algorithm=alg))
        rows = xla.dot(A[:, None, :], B.T[None, :, :], algorithm=alg)
        assert np.array_equal(rows, d)
    exact = A.astype(np.float64) @ B
    errs = [np.abs(xla.matmul(A, B, algorithm=a) - exact).max() for a in PASSES]
    assert errs[0] > errs[1] > errs[2]  # more passes, closer to the exact product


def test_infinite_input_kept_by_the_nan_guard() -> None:
    """inf = inf + NaN in the split: XLA's NaN -> 0 guard makes inf * 1 come out inf, not NaN."""
    A = np.array([[np.inf, 1.0], [-np.inf, 0.0]], F32)
    B = np.ones((2, 1), F32)
    for alg in ("BF16_BF16_F32_X3", "BF16_BF16_F32_X6"):
        assert xla.matmul(A, B, algorithm=alg)[:, 0].tolist() == [np.inf, -np.inf]
    hi, lo = xla.split(A[0], 2)
    assert hi[0] == np.inf and np.isnan(lo[0])  # the NaN the guard removes
    assert np.isnan(xla.matmul(np.array([[np.inf]], F32), np.array([[0.0]], F32), algorithm="high")[0, 0])


def test_addend_and_dtypes() -> None:
    A = np.array([[1.0, 2.0]], F32)
    B = np.array([[3.0], [4.0]], F32)
    assert xla.matmul(A, B, np.float32(0.5))[0, 0] == np.float32(11.5)
    d64 = xla.matmul(A.astype(np.float64) + 1e-12, B.astype(np.float64))  # rounded to f32 first
    assert d64.dtype == np.float64 and d64[0, 0] == 11.0


def test_nvidia_passes_and_precision_levels() -> None:
    assert xla.algorithm("highest", "h100").name == "F32_F32_F32"
    assert xla.algorithm("default", "a100").name == "TF32_TF32_F32"
    assert xla.algorithm("default", "v100").name == "F32_F32_F32"  # no tf32 on Volta
    assert xla.mxu_pass("h100", "bf16") == get_model("h100", "bf16")
    rng = np.random.default_rng(4)
    A, B = _random(rng, (3, 16)), _random(rng, (16, 2))
    # TF32_TF32_F32 on H100 = the H100 tf32 preset with the tensor cores' truncation of fp32 registers.
    want = fpsim.matmul(A, B, model=get_model("h100", "tf32"))
    assert np.array_equal(xla.matmul(A, B, algorithm="TF32_TF32_F32", device="h100"), want)


@pytest.mark.parametrize("bad, match", [
    ("TF32_TF32_F32", "not a TPU algorithm"), ("F32_F32_F32", "not a TPU algorithm"),
    ("bf16x9", "not a TPU algorithm"), ("bf16x12", "valid: bf16_bf16_f32"), ("", "valid"),
])
def test_bad_algorithm_names(bad: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        xla.matmul(np.ones((1, 1), F32), np.ones((1, 1), F32), algorithm=bad)


def test_get_model_for_tpu() -> None:
    m = get_model("TPU v5e", "bfloat16")
    assert (m.kind, m.input.name, m.acc.name) == ("fma_chain", "bf16", "fp32")
    with pytest.raises(ValueError, match="fpsim.mma.xla.matmul"):
        get_model("tpu", "fp32")
    with pytest.raises(ValueError, match="BF16_BF16_F32_X6"):
        get_model("tpu", "fp32", path="bf16_bf16_f32_x6")
    with pytest.raises(ValueError, match="valid: bf16->fp32"):
        get_model("tpu", "fp16")


def test_xla_cpu_ignores_the_dot_algorithm() -> None:
    """Why JAX CPU is no oracle here: XLA:CPU (JAX 0.10.2) accepts BF16_BF16_F32[_X3|_X6] and computes fp32.

    If a future JAX implements them on CPU, this test skips and says so (then it can become an oracle).
    """
    jax = pytest.importorskip("jax")
    from jax import lax

    rng = np.random.default_rng(5)
    A, B = _random(rng, (8, 64)), _random(rng, (64, 8))
    with jax.default_device(jax.devices("cpu")[0]):
        ref = np.asarray(lax.dot(A, B, precision=lax.DotAlgorithmPreset.F32_F32_F32))
        for name in ("BF16_BF16_F32", "BF16_BF16_F32_X3", "BF16_BF16_F32_X6"):
            got = np.asarray(lax.dot(A, B, precision=getattr(lax.DotAlgorithmPreset, name)))
            if not np.array_equal(got, ref):
                pytest.skip(f"JAX {jax.__version__} CPU now implements {name}: use it as an oracle")
    assert not np.array_equal(xla.matmul(A, B, algorithm="BF16_BF16_F32"), ref)
