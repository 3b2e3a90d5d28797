"""Layers: finite-difference gradient checks in float64, and PyTorch autograd as an oracle."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from fpsim.nn import (
    GPTConfig,
    attention_backward,
    attention_forward,
    cross_entropy_backward,
    cross_entropy_forward,
    embedding_backward,
    embedding_forward,
    gelu_backward,
    gelu_forward,
    gpt_backward,
    gpt_forward,
    init_params,
    layernorm_backward,
    layernorm_forward,
    linear_backward,
    linear_forward,
    residual_backward,
    residual_forward,
    softmax_backward,
    softmax_forward,
)



def numgrad(f: Callable[[], float], x: np.ndarray, h: float = 1e-6) -> np.ndarray:
    """Central differences of scalar f() with respect to every element of x (modified in place, restored)."""
    g = np.zeros_like(x)
    it = np.nditer(x, flags=["multi_index"])
    for _ in it:
        i = it.multi_index
        old = x[i]
        x[i] = old + h
        fp = f()
        x[i] = old - h
        fm = f()
        x[i] = old
        g[i] = (fp - fm) / (2 * h)
    return g


def close(a: np.ndarray, b: np.ndarray, tol: float = 1e-6) -> None:
    scale = max(1.0, float(np.abs(b).max()))
    assert np.abs(a - b).max() <= tol * scale, (np.abs(a - b).max(), scale)


def test_linear(rng: np.random.Generator) -> None:
    x, w, b = rng.standard_normal((2, 3, 4)), rng.standard_normal((4, 5)), rng.standard_normal(5)
    dout = rng.standard_normal((2, 3, 5))
    out, cache = linear_forward(x, w, b)
    assert out.shape == (2, 3, 5)
    dx, dw, db = linear_backward(dout, cache)

    def f() -> float:
        return float((linear_forward(x, w, b)[0] * dout).sum())

    close(dx, numgrad(f, x))
    close(dw, numgrad(f, w))
    close(db, numgrad(f, b))


def test_layernorm(rng: np.random.Generator) -> None:
    x, g, b = rng.standard_normal((3, 4, 6)), rng.standard_normal(6), rng.standard_normal(6)
    dout = rng.standard_normal((3, 4, 6))
    dx, dg, db = layernorm_backward(dout, layernorm_forward(x, g, b)[1])

    def f() -> float:
        return float((layernorm_forward(x, g, b)[0] * dout).sum())

    close(dx, numgrad(f, x))
    close(dg, numgrad(f, g))
    close(db, numgrad(f, b))


def test_gelu_softmax_residual_embedding(rng: np.random.Generator) -> None:
    x = rng.standard_normal((3, 7)) * 2
    dout = rng.standard_normal((3, 7))
    close(gelu_backward(dout, gelu_forward(x)[1]), numgrad(lambda: float((gelu_forward(x)[0] * dout).sum()), x))
    close(softmax_backward(dout, softmax_forward(x)[1]),
          numgrad(lambda: float((softmax_forward(x)[0] * dout).sum()), x))
    y = rng.standard_normal((3, 7))
    out, c = residual_forward(x, y)
    assert np.array_equal(out, x + y)
    a, b = residual_backward(dout, c)
    assert a is dout and b is dout
    w = rng.standard_normal((5, 4))
    idx = np.array([[0, 3, 3], [4, 0, 1]])
    d = rng.standard_normal((2, 3, 4))
    dw = embedding_backward(d, embedding_forward(idx, w)[1])
    close(dw, numgrad(lambda: float((embedding_forward(idx, w)[0] * d).sum()), w))


def test_softmax_masked_entries() -> None:
    x = np.array([[0.0, -np.inf, 1.0]])
    y, _ = softmax_forward(x)
    assert y[0, 1] == 0 and abs(y.sum() - 1) < 1e-15


def test_cross_entropy(rng: np.random.Generator) -> None:
    z = rng.standard_normal((2, 3, 5))
    t = np.array([[1, -1, 4], [0, 2, -1]])
    loss, cache = cross_entropy_forward(z, t)
    p = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
    want = -np.mean([np.log(p[0, 0, 1]), np.log(p[0, 2, 4]), np.log(p[1, 0, 0]), np.log(p[1, 1, 2])])
    assert abs(float(loss) - want) < 1e-12
    close(cross_entropy_backward(1.0, cache), numgrad(lambda: float(cross_entropy_forward(z, t)[0]), z))
    loss8, c8 = cross_entropy_forward(z, t, normalizer=8)
    assert abs(float(loss8) - want / 2) < 1e-12
    close(cross_entropy_backward(1.0, c8), cross_entropy_backward(1.0, cache) / 2, 1e-14)


def test_attention(rng: np.random.Generator) -> None:
    B, T, C, H = 2, 5, 8, 2
    x = rng.standard_normal((B, T, C))
    wq, bq = rng.standard_normal((C, 3 * C)) * 0.5, rng.standard_normal(3 * C) * 0.1
    wp, bp = rng.standard_normal((C, C)) * 0.5, rng.standard_normal(C) * 0.1
    dout = rng.standard_normal((B, T, C))
    g = attention_backward(dout, attention_forward(x, wq, bq, wp, bp, H)[1])

    def f() -> float:
        return float((attention_forward(x, wq, bq, wp, bp, H)[0] * dout).sum())

    for name, arr in (("x", x), ("w_qkv", wq), ("b_qkv", bq), ("w_proj", wp), ("b_proj", bp)):
        close(g[name], numgrad(f, arr))


def test_attention_is_causal(rng: np.random.Generator) -> None:
    B, T, C = 1, 6, 8
    x = rng.standard_normal((B, T, C))
    args = (rng.standard_normal((C, 3 * C)), None, rng.standard_normal((C, C)), None, 2)
    out, _ = attention_forward(x, *args)
    x2 = x.copy()
    x2[:, 4:] += 10.0
    out2, _ = attention_forward(x2, *args)
    assert np.array_equal(out[:, :4], out2[:, :4])


def _tiny(rng: np.random.Generator) -> tuple[GPTConfig, dict[str, np.ndarray], np.ndarray, np.ndarray]:
    cfg = GPTConfig(vocab_size=7, block_size=6, n_layer=2, n_head=2, n_embd=8)
    p = {k: v + 0.2 * rng.standard_normal(v.shape) for k, v in init_params(cfg, seed=3, dtype=np.float64).items()}
    idx = rng.integers(0, 7, (2, 5))
    tgt = rng.integers(-1, 7, (2, 5))
    return cfg, p, idx, tgt


def test_gpt_gradcheck(rng: np.random.Generator) -> None:
    cfg, p, idx, tgt = _tiny(rng)
    _, _loss, cache = gpt_forward(p, cfg, idx, tgt)
    g = gpt_backward(1.0, cache)
    assert set(g) == set(p)
    for k in p:  # a few sampled coordinates per tensor keeps this fast
        flat = p[k].reshape(-1)
        for j in rng.choice(flat.size, size=min(4, flat.size), replace=False):
            old = flat[j]
            flat[j] = old + 1e-6
            lp = float(gpt_forward(p, cfg, idx, tgt)[1])
            flat[j] = old - 1e-6
            lm = float(gpt_forward(p, cfg, idx, tgt)[1])
            flat[j] = old
            num = (lp - lm) / 2e-6
            assert abs(num - g[k].reshape(-1)[j]) < 1e-7, (k, j)


def test_gpt_config_validation_and_tying() -> None:
    with pytest.raises(ValueError, match="divisible"):
        GPTConfig(n_embd=10, n_head=4)
    with pytest.raises(ValueError, match="positive int"):
        GPTConfig(n_layer=0)
    cfg = GPTConfig(vocab_size=5, block_size=4, n_layer=1, n_head=1, n_embd=4)
    p = init_params(cfg)
    assert "lm_head.w" not in p and p["wte"].dtype == np.float32
    with pytest.raises(ValueError, match="block_size"):
        gpt_forward(p, cfg, np.zeros((1, 5), dtype=int))
    untied = GPTConfig(vocab_size=5, block_size=4, n_layer=1, n_head=1, n_embd=4, tie_weights=False)
    assert init_params(untied)["lm_head.w"].shape == (4, 5)


@pytest.mark.torch
def test_gpt_against_torch_autograd(rng: np.random.Generator) -> None:
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    cfg, p, idx, tgt = _tiny(rng)
    _, loss, cache = gpt_forward(p, cfg, idx, tgt)
    g = gpt_backward(1.0, cache)
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in p.items()}
    B, T = idx.shape
    C, H = cfg.n_embd, cfg.n_head
    x = tp["wte"][torch.tensor(idx)] + tp["wpe"][:T]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for i in range(cfg.n_layer):
        h = f"h{i}"
        a = F.layer_norm(x, (C,), tp[f"{h}.ln1.g"], tp[f"{h}.ln1.b"], eps=cfg.ln_eps)
        qkv = a @ tp[f"{h}.attn.qkv.w"] + tp[f"{h}.attn.qkv.b"]
        q, k, v = qkv.split(C, dim=-1)
        q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / np.sqrt(C // H)
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ tp[f"{h}.attn.proj.w"] + tp[f"{h}.attn.proj.b"]
        m = F.layer_norm(x, (C,), tp[f"{h}.ln2.g"], tp[f"{h}.ln2.b"], eps=cfg.ln_eps)
        m = F.gelu(m @ tp[f"{h}.mlp.fc.w"] + tp[f"{h}.mlp.fc.b"], approximate="tanh")
        x = x + m @ tp[f"{h}.mlp.proj.w"] + tp[f"{h}.mlp.proj.b"]
    x = F.layer_norm(x, (C,), tp["lnf.g"], tp["lnf.b"], eps=cfg.ln_eps)
    logits = x @ tp["wte"].T
    tl = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), torch.tensor(tgt).reshape(-1), ignore_index=-1)
    tl.backward()
    assert abs(tl.item() - float(loss)) < 1e-12
    for k in p:
        assert tp[k].grad is not None
        np.testing.assert_allclose(g[k], tp[k].grad.numpy(), rtol=1e-9, atol=1e-12, err_msg=k)
