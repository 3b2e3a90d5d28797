"""FlashAttention (fpsim.nn.flash) against the math: the naive path in float64, torch's
scaled_dot_product_attention, finite differences, and ml_dtypes casts for the rounded tiles."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from fpsim.nn import (
    GPTConfig,
    KernelPrecision,
    attention_backward,
    attention_forward,
    flash_attention,
    flash_attention_backward,
    flash_attention_forward,
    flash_attention_grads,
    fp8_attention,
    gpt_backward,
    gpt_forward,
    init_params,
    reference_attention,
)
from fpsim.nn.flash import _quant_blocks, hadamard, random_hadamard
from fpsim.formats import as_format
from fpsim.rounding import round as fround

ml_dtypes = pytest.importorskip("ml_dtypes")

TILES = [(1, 1), (4, 4), (5, 3), (3, 7), (16, 16), (64, 64), (2, 13)]


def _arrays(obj: Any) -> list[np.ndarray]:
    """Every NumPy array reachable from a cache (tuples, lists, dicts)."""
    if isinstance(obj, np.ndarray):
        return [obj]
    if isinstance(obj, dict):
        return [a for v in obj.values() for a in _arrays(v)]
    if isinstance(obj, (tuple, list)):
        return [a for v in obj for a in _arrays(v)]
    return []


def _layer_inputs(B: int = 2, T: int = 13, C: int = 16, seed: int = 0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((B, T, C)), rng.standard_normal((C, 3 * C)) * 0.3, rng.standard_normal(3 * C) * 0.1,
            rng.standard_normal((C, C)), rng.standard_normal(C), rng.standard_normal((B, T, C)))


@pytest.mark.parametrize("bq,bk", TILES, ids=[f"{a}x{b}" for a, b in TILES])
def test_layer_equals_standard_float64(bq: int, bk: int) -> None:
    x, w, b, wp, bp, do = _layer_inputs()
    ref, cr = attention_forward(x, w, b, wp, bp, 4)
    gr = attention_backward(do, cr)
    out, c = flash_attention_forward(x, w, b, wp, bp, 4, block_q=bq, block_k=bk)
    g = flash_attention_backward(do, c)
    assert np.abs(out - ref).max() <= 1e-12 * np.abs(ref).max()
    assert sorted(g) == sorted(gr)
    for name in gr:
        assert np.abs(g[name] - gr[name]).max() <= 1e-12 * np.abs(gr[name]).max(), name


@pytest.mark.parametrize("causal", [True, False])
def test_core_equals_reference_float64(causal: bool) -> None:
    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((3, 2, 3, 37, 8)) * 2
    ref = reference_attention(q, k, v, causal=causal)
    for bq, bk in TILES:
        o, lse = flash_attention(q, k, v, block_q=bq, block_k=bk, causal=causal)
        assert np.abs(o - ref).max() < 1e-12
    s = np.einsum("bhid,bhjd->bhij", q, k) / np.sqrt(8)
    if causal:
        s = np.where(np.tril(np.ones((37, 37), bool)), s, -np.inf)
    want = np.log(np.exp(s - s.max(-1, keepdims=True)).sum(-1)) + s.max(-1)
    assert np.abs(lse - want).max() < 1e-12


@pytest.mark.parametrize("causal", [True, False])
def test_against_torch_sdpa(causal: bool) -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    q, k, v, do = rng.standard_normal((4, 2, 3, 29, 16))
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    to = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
    to.backward(torch.tensor(do))
    o, lse = flash_attention(q, k, v, block_q=8, block_k=5, causal=causal)
    dq, dk, dv = flash_attention_grads(do, q, k, v, o, lse, block_q=8, block_k=5, causal=causal)
    assert np.abs(o - to.detach().numpy()).max() < 1e-12
    for mine, t in ((dq, tq), (dk, tk), (dv, tv)):
        assert t.grad is not None
        assert np.abs(mine - t.grad.numpy()).max() < 1e-12


def test_finite_differences() -> None:
    rng = np.random.default_rng(3)
    q, k, v, w = rng.standard_normal((4, 1, 2, 7, 4))
    o, lse = flash_attention(q, k, v, block_q=3, block_k=2)
    grads = flash_attention_grads(w, q, k, v, o, lse, block_q=3, block_k=2)
    h = 1e-6
    for which, g in enumerate(grads):
        for idx in [(0, 0, 0, 0), (0, 1, 3, 2), (0, 0, 6, 3), (0, 1, 5, 1)]:
            args_p = [a.copy() for a in (q, k, v)]
            args_m = [a.copy() for a in (q, k, v)]
            args_p[which][idx] += h
            args_m[which][idx] -= h
            fp = float((flash_attention(*args_p, block_q=3, block_k=2)[0] * w).sum())
            fm = float((flash_attention(*args_m, block_q=3, block_k=2)[0] * w).sum())
            assert abs((fp - fm) / (2 * h) - g[idx]) < 1e-7, (which, idx)


def test_gpt_flash_equals_standard_float64() -> None:
    kw: dict[str, Any] = {"vocab_size": 11, "block_size": 16, "n_layer": 2, "n_head": 2, "n_embd": 16}
    cf, cs = GPTConfig(**kw, attention="flash"), GPTConfig(**kw)
    p = init_params(cs, seed=1, dtype=np.float64)
    idx = np.random.default_rng(4).integers(0, 11, (2, 16))
    lf, Lf, c_f = gpt_forward(p, cf, idx, idx)
    ls, Ls, c_s = gpt_forward(p, cs, idx, idx)
    assert abs(float(Lf) - float(Ls)) < 1e-12 and np.abs(lf - ls).max() < 1e-12
    gf, gs = gpt_backward(1.0, c_f), gpt_backward(1.0, c_s)
    for name in gs:
        assert np.abs(gf[name] - gs[name]).max() <= 1e-12 * max(np.abs(gs[name]).max(), 1e-30), name


def test_gpt_flash_trains_under_bf16_policy() -> None:
    from fpsim.amp import get_policy

    kw: dict[str, Any] = {"vocab_size": 11, "block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 16}
    cf, cs = GPTConfig(**kw, attention="flash"), GPTConfig(**kw)
    p = init_params(cs, seed=2)
    idx = np.random.default_rng(5).integers(0, 11, (2, 16))
    pol = get_policy("bf16-mixed")
    _, Lf, c_f = gpt_forward(p, cf, idx, idx, prec=pol.runtime())
    _, Ls, c_s = gpt_forward(p, cs, idx, idx, prec=pol.runtime())
    gf, gs = gpt_backward(1.0, c_f), gpt_backward(1.0, c_s)
    assert abs(float(Lf) - float(Ls)) < 1e-2
    for name in gs:
        assert gf[name].dtype == np.float32 and np.isfinite(gf[name]).all()
        assert np.abs(gf[name] - gs[name]).max() <= 0.05 * np.abs(gs[name]).max() + 1e-6, name


def test_cache_holds_no_txt_array() -> None:
    T = 64
    x, w, b, wp, bp, _ = _layer_inputs(B=1, T=T, C=16)
    _, cs = attention_forward(x, w, b, wp, bp, 4)
    _, cf = flash_attention_forward(x, w, b, wp, bp, 4, block_q=16, block_k=16)
    assert any(a.shape[-2:] == (T, T) for a in _arrays(cs))
    assert not any(a.ndim >= 2 and a.shape[-1] == T and a.shape[-2] == T for a in _arrays(cf))
    nbytes = {id(a): a.nbytes for a in _arrays(cf)}
    assert sum(nbytes.values()) < sum({id(a): a.nbytes for a in _arrays(cs)}.values())
    for name in ("q", "k", "v", "o"):
        assert cf[name].shape == (1, 4, T, 4)
    assert cf["lse"].shape == (1, 4, T)


class _Counting:
    """FULL with a count of the GEMMs per site (checks which tiles run)."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    def matmul(self, a: np.ndarray, b: np.ndarray, site: str, kind: str,
               bias: np.ndarray | None = None) -> tuple[np.ndarray, Any]:
        self.calls[site] = self.calls.get(site, 0) + 1
        return a @ b, None

    def matmul_backward(self, dout: np.ndarray, cache: Any) -> Any:
        raise AssertionError("not used")

    def act(self, x: np.ndarray, site: str, op: str) -> np.ndarray:
        return x

    def grad(self, g: np.ndarray, site: str, op: str) -> np.ndarray:
        return g


def test_causal_skips_masked_tiles() -> None:
    q = k = v = np.ones((1, 1, 8, 2))
    pc = _Counting()
    o, lse = flash_attention(q, k, v, prec=pc, block_q=2, block_k=2)
    assert pc.calls == {"attn.qk": 10, "attn.pv": 10}          # 4 + 3 + 2 + 1 of the 16 tiles
    pn = _Counting()
    flash_attention(q, k, v, prec=pn, block_q=2, block_k=2, causal=False)
    assert pn.calls == {"attn.qk": 16, "attn.pv": 16}
    pb = _Counting()
    flash_attention_grads(v, q, k, v, o, lse, prec=pb, block_q=2, block_k=2)
    assert set(pb.calls.values()) == {10}


def _bf16(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def test_bf16_tiles_bit_exact_against_ml_dtypes_casts() -> None:
    """Two key tiles, one query tile, by hand with ml_dtypes casts: S FP32, P~ rounded to BF16 only as
    the P V operand, the row sum from the unrounded P~, the rescale, O stored in BF16."""
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((1, 1, 6, 4)).astype(np.float32) for _ in range(3))
    o, lse = flash_attention(q, k, v, prec=KernelPrecision("bf16"), block_q=6, block_k=3, causal=False)
    qb, kb, vb = _bf16(q[0, 0]), _bf16(k[0, 0]), _bf16(v[0, 0])
    sc = np.float32(0.5)
    m = np.full(6, -np.inf, np.float32)
    l = np.zeros(6, np.float32)
    acc = np.zeros((6, 4), np.float32)
    for j0 in (0, 3):
        s = (qb @ kb[j0:j0 + 3].T) * sc
        mn = np.maximum(m, s.max(-1))
        p = np.exp(s - mn[:, None])
        a = np.exp(m - mn)
        l = a * l + p.sum(-1)
        acc = a[:, None] * acc + _bf16(p) @ vb[j0:j0 + 3]
        m = mn
    want = _bf16(acc / l[:, None])
    assert o.dtype == np.float32
    assert np.array_equal(o[0, 0].view(np.uint32), want.view(np.uint32))
    assert np.array_equal(lse[0, 0], m + np.log(l))


def _hand_bf16_flash(q: np.ndarray, k: np.ndarray, v: np.ndarray, bk: int) -> tuple[np.ndarray, np.ndarray]:
    """One query tile over key tiles of ``bk``, by hand with ml_dtypes casts (see the test above)."""
    qb, kb, vb = _bf16(q), _bf16(k), _bf16(v)
    T = q.shape[0]
    sc = np.float32(1 / np.sqrt(q.shape[-1]))
    m = np.full(T, -np.inf, np.float32)
    l = np.zeros(T, np.float32)
    acc = np.zeros(q.shape, np.float32)
    for j0 in range(0, T, bk):
        s = (qb @ kb[j0:j0 + bk].T) * sc
        mn = np.maximum(m, s.max(-1))
        p = np.exp(s - mn[:, None])
        a = np.exp(m - mn)
        l = a * l + p.sum(-1)
        acc = a[:, None] * acc + _bf16(p) @ vb[j0:j0 + bk]
        m = mn
    return _bf16(acc / l[:, None]), m + np.log(l)


def test_policy_runtime_keeps_tiles_in_the_fp32_accumulator() -> None:
    """Under the bf16-mixed policy the flash tiles are what the kernel computes (S and each P~ V in FP32),
    not GEMM outputs rounded to BF16: bit for bit the hand loop with ml_dtypes casts."""
    from fpsim.amp import get_policy
    from fpsim.amp.runtime import PolicyRuntime

    rng = np.random.default_rng(16)
    q, k, v = (rng.standard_normal((1, 1, 6, 4)).astype(np.float32) for _ in range(3))
    rt = PolicyRuntime(get_policy("bf16-mixed"))
    o, lse = flash_attention(q, k, v, prec=rt, block_q=6, block_k=3, causal=False)
    want, wlse = _hand_bf16_flash(q[0, 0], k[0, 0], v[0, 0], 3)
    assert np.array_equal(o[0, 0].view(np.uint32), want.view(np.uint32))
    assert np.array_equal(lse[0, 0], wlse)


def test_kernel_precision_device_gemm() -> None:
    """gemm="h100": every tile GEMM through the Tensor Core model, the rescaled accumulator entering the
    P V chain as its C operand (FA-2's gemm_rs(acc_o, P, V)); bit for bit against a hand loop of
    fpsim.mma.matmul calls with ml_dtypes BF16 casts."""
    from fpsim import mma

    model = mma.get_model("h100", as_format("bf16"), "fp32")
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((1, 1, 8, 16)).astype(np.float32) for _ in range(3))
    # O stored in FP32 (out="fp32"), so the accumulator's bits are compared, not only their BF16 rounding
    o, lse = flash_attention(q, k, v, prec=KernelPrecision("bf16", out="fp32", gemm="h100"), block_q=8,
                             block_k=4, causal=False)
    qb, kb, vb = _bf16(q[0, 0]), _bf16(k[0, 0]), _bf16(v[0, 0])
    sc = np.float32(0.25)
    m = np.full(8, -np.inf, np.float32)
    l = np.zeros(8, np.float32)
    acc = np.zeros((8, 16), np.float32)
    with np.errstate(invalid="ignore"):
        for j0 in (0, 4):
            s = np.asarray(mma.matmul(qb, kb[j0:j0 + 4].T.copy(), None, model=model), np.float32) * sc
            mn = np.maximum(m, s.max(-1))
            p = np.exp(s - mn[:, None])
            a = np.exp(m - mn)
            l = a * l + p.sum(-1)
            acc = np.asarray(mma.matmul(_bf16(p), vb[j0:j0 + 4], a[:, None] * acc, model=model), np.float32)
            m = mn
    assert np.array_equal(o[0, 0].view(np.uint32), (acc / l[:, None]).view(np.uint32))
    assert np.array_equal(lse[0, 0], m + np.log(l))
    # adding C after the chain is not what the device does: it differs somewhere on these inputs
    pb, vv, cc = _bf16(p), vb[4:8], rng.standard_normal((8, 16)).astype(np.float32)
    inside = np.asarray(mma.matmul(pb, vv, cc, model=model), np.float32)
    after = np.asarray(mma.matmul(pb, vv, None, model=model), np.float32) + cc
    assert not np.array_equal(inside, after)

# ------------------------------------------------------------------------------------------------- FP8

def _outliers(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """FA-3's test distribution: N(0, 1) plus, on 0.1% of the entries, an extra N(0, 10^2)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    return x + rng.standard_normal(shape) * 10 * (rng.random(shape) < 0.001)


def test_random_hadamard_is_orthogonal_and_keeps_scores() -> None:
    m = random_hadamard(16, seed=1)
    assert np.abs(m @ m.T - np.eye(16)).max() < 1e-15
    assert np.array_equal(hadamard(4) @ hadamard(4).T, 4 * np.eye(4))
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((2, 5, 16))
    assert np.abs((q @ m) @ (k @ m).T - q @ k.T).max() < 1e-13


def test_block_quantization_values_are_e4m3() -> None:
    x = _outliers((1, 2, 40, 16), 3)
    fmt = __import__("fpsim").as_format("fp8_e4m3")
    xq, dec = _quant_blocks(x, fmt, 16, "rne")
    assert dec.shape == (1, 2, 3)
    assert np.array_equal(xq, xq.astype(ml_dtypes.float8_e4m3fn).astype(np.float32))
    amax = np.abs(xq).reshape(1, 2, -1)[:, :, : 16 * 16].max(-1)
    assert np.array_equal(amax, np.full((1, 2), 448.0, np.float32))
    assert np.abs(xq * np.repeat(dec, 16, axis=2)[:, :, :40, None] - x).max() < 0.07 * np.abs(x).max()


def test_fp8_rotation_lowers_error_on_outliers() -> None:
    shape = (1, 2, 256, 64)
    q, k, v = _outliers(shape, 10), _outliers(shape, 11), _outliers(shape, 12)
    ref = reference_attention(q, k, v, causal=False)

    def rms(o: np.ndarray) -> float:
        return float(np.sqrt(np.mean((o - ref) ** 2)))

    base = rms(fp8_attention(q, k, v, block_scaling=False, tiled=False, causal=False))
    fa3 = rms(fp8_attention(q, k, v, rotate=True, causal=False))
    plain = rms(fp8_attention(q, k, v, causal=False))
    assert fa3 < plain < base
    assert 1e-3 < fa3 < 2e-2


def test_bad_inputs() -> None:
    q = np.ones((1, 1, 4, 2))
    with pytest.raises(ValueError, match="block_q"):
        flash_attention(q, q, q, block_q=0)
    with pytest.raises(TypeError, match="float"):
        flash_attention(q.astype(int), q, q)
    with pytest.raises(ValueError, match="shape"):
        flash_attention(q[0], q[0], q[0])
    with pytest.raises(ValueError, match="one shape"):
        flash_attention(q, np.ones((1, 1, 5, 2)), q)
    with pytest.raises(ValueError, match="power of two"):
        fp8_attention(np.ones((1, 1, 4, 6)), np.ones((1, 1, 4, 6)), np.ones((1, 1, 4, 6)), rotate=True)
    with pytest.raises(ValueError, match="block_scaling=False"):
        fp8_attention(q, q, q, tiled=False)
    with pytest.raises(ValueError, match="unknown"):
        KernelPrecision("bf17")
    with pytest.raises(TypeError, match="causal"):
        flash_attention(q, q, q, causal=1)


@pytest.mark.parametrize("checkpoint", ["blocks", "selective", 1])
def test_gpt_flash_with_checkpointing_is_bit_identical(checkpoint: Any) -> None:
    from fpsim.amp import get_policy

    kw: dict[str, Any] = {"vocab_size": 11, "block_size": 16, "n_layer": 2, "n_head": 2, "n_embd": 16,
                          "attention": "flash"}
    idx = np.random.default_rng(8).integers(0, 11, (2, 16))
    p = init_params(GPTConfig(**kw), seed=3)
    runs = []
    for ck in ("none", checkpoint):
        _, L, c = gpt_forward(p, GPTConfig(**kw, checkpoint=ck), idx, idx, prec=get_policy("bf16-mixed").runtime())
        runs.append((L, gpt_backward(1.0, c)))
    (l0, g0), (l1, g1) = runs
    assert l0 == l1
    for name in g0:
        assert np.array_equal(g0[name], g1[name]), name


# ------------------------------------------------------------ PolicyRuntime.matmul_accumulate directly

def test_policy_runtime_matmul_accumulate_branches() -> None:
    """The hook: operands cast to the activation format, FP32 result (no output cast), c added; under an
    FP8 policy whose kinds include "attn" it falls back to matmul (block/tensor scaled E4M3) plus c."""
    from dataclasses import replace

    from fpsim.amp import PolicyRuntime, get_policy

    rng = np.random.default_rng(5)
    a, b, c = (rng.standard_normal(s).astype(np.float32) for s in ((3, 5), (5, 4), (3, 4)))
    bf = ml_dtypes.bfloat16
    rt = PolicyRuntime(get_policy("bf16-mixed"))
    want = (a.astype(bf).astype(np.float32) @ b.astype(bf).astype(np.float32))
    got = rt.matmul_accumulate(a, b, "s", "attn")
    assert got.dtype == np.float32 and np.array_equal(got, want)
    assert np.array_equal(rt.matmul_accumulate(a, b, "s", "attn", c), c + want)
    assert not np.array_equal(got, got.astype(bf).astype(np.float32))   # not rounded to bf16 on output
    p8 = get_policy("fp8-hybrid")
    assert p8.fp8 is not None
    rt8 = PolicyRuntime(replace(p8, fp8=replace(p8.fp8, kinds=("linear", "attn"))))
    ref = PolicyRuntime(replace(p8, fp8=replace(p8.fp8, kinds=("linear", "attn"))))
    mm = np.asarray(ref.matmul(a, b, "s", "attn")[0], np.float32)
    got8 = rt8.matmul_accumulate(a, b, "s", "attn", c)
    assert np.array_equal(got8, c + mm) and not np.array_equal(got8, c + want)
    calls: list[str] = []
    orig = rt8.matmul

    def spy(*args: Any, **kw: Any) -> Any:
        calls.append("matmul")
        return orig(*args, **kw)

    rt8.matmul = spy  # type: ignore[method-assign]
    rt8.matmul_accumulate(a, b, "s", "attn")
    assert calls == []   # the class's matmul is called, not an instance wrapper (no double counting)
    pq = get_policy("int8-qat")
    assert pq.quant is not None
    pq = replace(pq, quant=replace(pq.quant, kinds=("linear", "attn")))
    rq, rq_ref = PolicyRuntime(pq), PolicyRuntime(pq)
    rq.quant_active = rq_ref.quant_active = True
    mq = np.asarray(rq_ref.matmul(a, b, "s", "attn")[0], np.float32)
    gq = rq.matmul_accumulate(a, b, "s", "attn", c)
    assert np.array_equal(gq, c + mq) and not np.array_equal(gq, c + a @ b)


@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_fp8_nan_poisons_its_block_not_hidden(which: str) -> None:
    """A NaN in one element makes its block's amax, and so its scale, NaN: the NaN reaches the output
    (it used to be replaced by a scale of 1, the block's other values silently quantized wrongly)."""
    rng = np.random.default_rng(3)
    qkv = {n: rng.standard_normal((1, 1, 16, 8)) for n in "qkv"}
    x8, d = _quant_blocks(np.where(np.arange(16)[:, None] == 5, np.nan, qkv["q"][0, 0])[None, None],
                          as_format("fp8_e4m3"), 8, "rne")
    assert np.isnan(x8[0, 0, :8]).all() and np.isnan(d[0, 0, 0]) and np.isfinite(x8[0, 0, 8:]).all()
    qkv[which][0, 0, 5, 2] = np.nan
    o = fp8_attention(qkv["q"], qkv["k"], qkv["v"], block_q=8, block_k=8, causal=False)
    bad = np.isnan(o[0, 0]).any(-1)
    if which == "q":
        assert bad[:8].all() and not bad[8:].any()     # only the query block holding the NaN
    else:
        assert bad.all()                                # every query sees key/value block 0


# ------------------------------------------------------------------------- the published anchors, small

def _rms(o: np.ndarray, ref: np.ndarray) -> float:
    return float(np.sqrt(np.mean((np.asarray(o, np.float64) - ref) ** 2)))


def test_fa3_anchor_rotation_ratio_on_fa3_outliers() -> None:
    """FA-3 (arXiv 2407.08608): baseline FP8 attention RMSE 2.4e-2 vs 9.1e-3 with block scales + incoherent
    processing (2.6x) on N(0,1) + 0.1% N(0,10^2) inputs. At T = 512 (FP16 inputs, 2 heads of 128, not
    causal) the emulation's ratio must stay above 2 (the docs' T = 1024..4096 runs give 2.8-3.3x)."""
    shape = (1, 2, 512, 128)
    q, k, v = (np.asarray(fround(_outliers(shape, s), "fp16"), np.float64) for s in (20, 21, 22))
    ref = reference_attention(q, k, v, causal=False)
    base = _rms(fp8_attention(q, k, v, block_scaling=False, tiled=False, causal=False, out_format="fp16"), ref)
    fa3 = _rms(fp8_attention(q, k, v, rotate=True, causal=False, out_format="fp16"), ref)
    assert base / fa3 > 2.0, (base, fa3)
    assert 5e-3 < fa3 < 2e-2 and 1e-2 < base < 5e-2    # the anchors' orders of magnitude


def test_golden_anchor_direction_bf16() -> None:
    """Golden et al. (arXiv 2405.02803) see BF16 flash deviate more than standard attention. The
    kernel-faithful loop (FP32 S, m, l, accumulator) is *more* accurate than standard BF16 attention; with
    its statistics rounded to BF16 every tile (stats_format="bf16") it is less accurate, the paper's
    direction (docs/attention.md explains why)."""
    rng = np.random.default_rng(1024)
    q, k, v = (np.asarray(fround(rng.random((1, 2, 512, 64)), "bf16"), np.float64) for _ in range(3))
    ref = reference_attention(q, k, v)
    kp = KernelPrecision("bf16")
    std = _rms(reference_attention(q, k, v, prec=kp), ref)
    fl = _rms(flash_attention(q, k, v, prec=kp)[0], ref)
    st = _rms(flash_attention(q, k, v, prec=kp, stats_format="bf16")[0], ref)
    assert fl < std < st, (fl, std, st)


def _channel_outliers(shape: tuple[int, ...], seed: int, qk: bool) -> np.ndarray:
    """benchmarks/bench_attention.py's "channels" distribution: channels 3, 17, 42, 99 of Q and K times
    20, 40, 60, 100, Q and K rescaled to unit mean square; V plain N(0, 1)."""
    x = np.random.default_rng(seed).standard_normal(shape)
    if qk:
        f = np.ones(shape[-1])
        f[[3, 17, 42, 99]] = (20.0, 40.0, 60.0, 100.0)
        x = x * f / np.sqrt(np.mean(f ** 2))
    return np.asarray(fround(x, "bf16"), np.float64)


def test_channel_outliers_direction() -> None:
    """On channel outliers the rotation is what helps FP8 (block scales alone do not: every block holds the
    outlier channels), and BF16 flash with FP32 statistics beats standard BF16 attention by far (S is large
    and the standard path rounds it)."""
    shape = (1, 2, 256, 128)
    q, k, v = (_channel_outliers(shape, s, i < 2) for i, s in enumerate((30, 31, 32)))
    ref = reference_attention(q, k, v)
    base = _rms(fp8_attention(q, k, v, block_scaling=False, tiled=False), ref)
    block = _rms(fp8_attention(q, k, v), ref)
    fa3 = _rms(fp8_attention(q, k, v, rotate=True), ref)
    # (block scales alone against the per-tensor baseline: 1.5x better at T >= 1024 in the docs' runs, not
    # at this size; not held here)
    assert base / fa3 > 3 and block / fa3 > 2, (base, block, fa3)
    kp = KernelPrecision("bf16")
    std = _rms(reference_attention(q, k, v, prec=kp), ref)
    fl = _rms(flash_attention(q, k, v, prec=kp)[0], ref)
    assert fl * 4 < std, (fl, std)


def test_more_bad_inputs() -> None:
    q = np.ones((1, 1, 4, 4))
    with pytest.raises(TypeError, match="Precision"):
        flash_attention(q, q, q, prec="bf16")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Precision"):
        reference_attention(q, q, q, prec=None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Precision"):
        flash_attention_forward(np.ones((1, 4, 4)), np.ones((4, 12)), None, np.ones((4, 4)), None, 1,
                                prec=3)  # type: ignore[arg-type]
    z = np.ones((1, 1, 4, 0))
    with pytest.raises(ValueError, match="head_dim"):
        flash_attention(z, z, z)
    with pytest.raises(ValueError, match="head_dim"):
        flash_attention_forward(np.ones((1, 4, 0)), np.ones((0, 0)), None, np.ones((0, 0)), None, 1)
    with pytest.raises(TypeError, match="fp32_ops"):
        KernelPrecision("bf16", fp32_ops="softmax")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="seed"):
        fp8_attention(q, q, q, seed=-1)
    out, cache = flash_attention_forward(np.ones((1, 4, 4)), np.ones((4, 12)), None, np.ones((4, 4)), None, 1)
    with pytest.raises(ValueError, match="dout"):
        flash_attention_backward(np.ones((1, 5, 4)), cache)
    assert KernelPrecision("bf16", fp32_ops=["softmax"]).fp32_ops == ("softmax",)


@pytest.mark.parametrize("attention", ["standard", "flash"])
def test_qat_on_attention_gemms(attention: str) -> None:
    """QAT whose kinds include "attn": both attention operands are activations, so the second one gets one
    symmetric scale for the tensor (before: per-channel weight scales crashed on the 4-D batch)."""
    from dataclasses import replace

    from fpsim.amp import get_policy
    from fpsim.amp.runtime import PolicyRuntime
    from fpsim.quant import fake_quantize

    pq = get_policy("int8-qat")
    assert pq.quant is not None
    pq = replace(pq, quant=replace(pq.quant, kinds=("linear", "attn")))
    cfg = GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16, attention=attention)
    params = init_params(cfg, 0)
    idx = np.arange(16).reshape(2, 8) % 11
    rt = PolicyRuntime(pq)
    rt.quant_active = True
    _, loss, cache = gpt_forward(params, cfg, idx, idx, prec=rt)
    g = gpt_backward(1.0, cache)
    assert np.isfinite(float(loss)) and all(np.isfinite(v).all() for v in g.values())
    rng = np.random.default_rng(0)
    a = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    b = rng.standard_normal((2, 3, 5, 6)).astype(np.float32)
    _, c = rt.matmul(a, b, "probe", "attn")
    s = max(np.float32(np.float32(np.abs(b).max()) / np.float32(127.5)), np.finfo(np.float32).eps)
    assert np.array_equal(c[3], fake_quantize(b, s, 0, -128, 127))
    da, db, _ = rt.matmul_backward(np.ones((2, 3, 4, 6), np.float32), c)
    assert da.shape == a.shape and db.shape == b.shape
