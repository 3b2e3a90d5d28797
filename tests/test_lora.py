"""LoRA: the layer pair against finite differences and torch autograd (float64), the GPT wrapper."""

from __future__ import annotations

import numpy as np
import pytest

from fpsim.nn import FULL, GPTConfig, gpt_backward, gpt_forward, init_params
from fpsim.nn.lora import LoRAPrecision, lora_init, lora_linear_backward, lora_linear_forward


def _setup(seed=0, r=3):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 5, 6))
    w, b = rng.standard_normal((6, 4)), rng.standard_normal(4)
    A, B = lora_init(6, 4, r, rng=rng, dtype=np.float64)
    B = rng.standard_normal(B.shape)                  # nonzero B so every gradient is exercised
    return x, w, b, A, B


def test_init_starts_at_base():
    rng = np.random.default_rng(1)
    A, B = lora_init(16, 8, 4, rng=rng)
    assert A.shape == (4, 16) and B.shape == (8, 4) and not B.any() and np.abs(A).max() <= 0.25
    x, w = rng.standard_normal((3, 16)).astype(np.float32), rng.standard_normal((16, 8)).astype(np.float32)
    out, _ = lora_linear_forward(x, w, None, A, B, 2.0)
    assert np.array_equal(out.view(np.uint32), (x @ w).view(np.uint32))


def test_finite_differences():
    x, w, b, A, B = _setup()
    s = 0.7
    dout = np.random.default_rng(9).standard_normal((2, 5, 4))

    def loss(A_, B_, x_):
        return float((lora_linear_forward(x_, w, b, A_, B_, s)[0] * dout).sum())

    _, cache = lora_linear_forward(x, w, b, A, B, s, prec=FULL)
    dx, dA, dB = lora_linear_backward(dout, cache)
    h = 1e-6
    for arr, grad, name in ((A, dA, "A"), (B, dB, "B"), (x, dx, "x")):
        num = np.zeros_like(arr)
        for i in np.ndindex(arr.shape):
            p, m = arr.copy(), arr.copy()
            p[i] += h
            m[i] -= h
            args = {"A": (p, B, x), "B": (A, p, x), "x": (A, B, p)}[name]
            argm = {"A": (m, B, x), "B": (A, m, x), "x": (A, B, m)}[name]
            num[i] = (loss(*args) - loss(*argm)) / (2 * h)
        np.testing.assert_allclose(grad, num, rtol=1e-6, atol=1e-8, err_msg=name)


def test_torch_autograd():
    torch = pytest.importorskip("torch")
    x, w, b, A, B = _setup(3)
    s = 1.5
    dout = np.random.default_rng(4).standard_normal((2, 5, 4))
    _, cache = lora_linear_forward(x, w, b, A, B, s)
    dx, dA, dB = lora_linear_backward(dout, cache)
    tx, tA, tB = (torch.tensor(v, requires_grad=True) for v in (x, A, B))
    out = tx @ torch.tensor(w) + torch.tensor(b) + s * (tx @ tA.T) @ tB.T
    out.backward(torch.tensor(dout))
    for mine, t in ((dx, tx), (dA, tA), (dB, tB)):
        np.testing.assert_allclose(mine, t.grad.numpy(), rtol=1e-12, atol=1e-12)


def _gpt():
    cfg = GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16)
    params = init_params(cfg, seed=0)
    rng = np.random.default_rng(0)
    idx = rng.integers(0, 11, size=(2, 8))
    return cfg, params, idx, rng


def _adapters(cfg, params, rng, r=2, zero_b=True, dtype=np.float32):
    ad = {}
    for i in range(cfg.n_layer):
        for s in ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj"):
            w = params[f"h{i}.{s}.w"]
            A, B = lora_init(w.shape[0], w.shape[1], r, rng=rng, dtype=dtype)
            if not zero_b:
                B = (rng.standard_normal(B.shape) * 0.1).astype(dtype)
            ad[f"h{i}.{s}"] = (A, B)
    return ad


def test_gpt_step0_bit_identical():
    cfg, params, idx, rng = _gpt()
    base, loss0, _ = gpt_forward(params, cfg, idx, idx)
    prec = LoRAPrecision(FULL, _adapters(cfg, params, rng), scale=4.0)
    lora, loss1, _ = gpt_forward(params, cfg, idx, idx, prec=prec)
    assert np.array_equal(base.view(np.uint32), lora.view(np.uint32)) and loss0 == loss1


def test_gpt_adapter_grads_finite_differences():
    cfg, params, idx, rng = _gpt()
    p64 = {k: v.astype(np.float64) for k, v in params.items()}
    ad = _adapters(cfg, p64, rng, zero_b=False, dtype=np.float64)
    prec = LoRAPrecision(FULL, ad, scale=2.0)
    _, loss, cache = gpt_forward(p64, cfg, idx, idx, prec=prec)
    g = gpt_backward(1.0, cache)
    assert not g["h0.mlp.fc.w"].any()                       # the frozen base gets no gradient
    h = 1e-6
    for site in ("h0.attn.qkv", "h0.mlp.proj"):
        dA, dB = prec.grads[site]
        for arr, grad in ((ad[site][0], dA), (ad[site][1], dB)):
            for i in [(0, 0), (1, 1), (arr.shape[0] - 1, arr.shape[1] - 1)]:
                old = arr[i]
                arr[i] = old + h
                lp = float(gpt_forward(p64, cfg, idx, idx, prec=LoRAPrecision(FULL, ad, 2.0))[1])
                arr[i] = old - h
                lm = float(gpt_forward(p64, cfg, idx, idx, prec=LoRAPrecision(FULL, ad, 2.0))[1])
                arr[i] = old
                assert grad[i] == pytest.approx((lp - lm) / (2 * h), rel=1e-5, abs=1e-9)


def test_bad_shapes():
    with pytest.raises(ValueError, match="LoRA shapes"):
        lora_linear_forward(np.ones((2, 4)), np.ones((4, 3)), None, np.ones((2, 5)), np.zeros((3, 2)), 1.0)
    with pytest.raises(TypeError):
        LoRAPrecision(object(), {}, 1.0)  # type: ignore[arg-type]


def test_finetune_comparison_small():
    from fpsim.train.finetune import FinetuneSettings, finetune_comparison

    s = FinetuneSettings(pretrain_steps=3, finetune_steps=3, n_embd=16, n_layer=1, batch_size=4, eval_batches=1)
    r = finetune_comparison(s, seeds=(0, 1), methods=("full", "lora_bf16", "lora_int8", "qlora_nf4"))
    m = r["methods"]
    cfg = s.model()
    n = sum(v.size for v in init_params(cfg).values())
    assert m["full"]["trainable"] == n and m["full"]["bytes"]["optimizer"] == 8 * n
    lin = [(16, 48), (16, 16), (16, 64), (64, 16)]
    n_ad = sum(s.r * (a + b) for a, b in lin)
    for k in ("lora_bf16", "lora_int8", "qlora_nf4"):
        assert m[k]["trainable"] == n_ad and m[k]["bytes"]["trainable"] == 4 * n_ad
        assert m[k]["bytes"]["optimizer"] == 8 * n_ad and m[k]["bytes"]["grads"] == 4 * n_ad
    assert m["qlora_nf4"]["bytes"]["base"] < m["lora_int8"]["bytes"]["base"] < m["lora_bf16"]["bytes"]["base"]
    assert all(np.isfinite(x["eval_after"]) for x in r["runs"])
    again = finetune_comparison(s, seeds=(0, 1), methods=("full", "lora_bf16", "lora_int8", "qlora_nf4"))
    assert [x["eval_after"] for x in again["runs"]] == [x["eval_after"] for x in r["runs"]]  # deterministic
    with pytest.raises(ValueError, match="method"):
        finetune_comparison(s, seeds=(0,), methods=("adalora",))


def test_shifted_task():
    from fpsim.train.data import get_task
    from fpsim.train.finetune import FinetuneSettings, ShiftedTask

    base = get_task("sort", n_symbols=8, length=6)
    x0, y0 = base.batch(np.random.default_rng(3), 16)
    x3, y3 = ShiftedTask(base, 3).batch(np.random.default_rng(3), 16)
    L = base.length
    assert np.array_equal(x3[:, : L + 1], x0[:, : L + 1])                # prompt and separator unchanged
    assert np.array_equal(y3[:, :L], y0[:, :L]) and (y3[:, :L] == -1).all()
    assert np.array_equal(y3[:, L:], (y0[:, L:] + 3) % 8)                  # the answer in the shifted alphabet
    assert np.array_equal(x3[:, L + 1:], y3[:, L:-1])                      # teacher forcing feeds the shifted answer
    x, y = ShiftedTask(base, 0).batch(np.random.default_rng(3), 16)
    assert np.array_equal(x, x0) and np.array_equal(y, y0)
    assert [t.name for t in FinetuneSettings().tasks()] == ["sort", "sort+3"]
    assert FinetuneSettings(finetune_task="reverse", finetune_shift=0).tasks()[1].name == "reverse"
    with pytest.raises(ValueError, match="shift"):
        ShiftedTask(base, 8)
    with pytest.raises(TypeError, match="shift"):
        ShiftedTask(base, 1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="SequenceTask"):
        ShiftedTask(get_task("modadd"), 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="finetune_shift"):
        FinetuneSettings(finetune_task="modadd", task_kwargs={}).tasks()


@pytest.mark.slow
def test_default_settings_learn_both_tasks():
    """Issue 25: the comparison must measure models that learned (held-out loss well below ln(vocab))."""
    from fpsim.train.finetune import FinetuneSettings, finetune_comparison

    s = FinetuneSettings()
    r = finetune_comparison(s, seeds=(0,), methods=("full", "qlora_nf4"))
    chance = np.log(s.model().vocab_size)
    assert r["pretrain_task_loss"][0] < chance / 3
    for run in r["runs"]:
        assert run["eval_before"] > chance and run["eval_after"] < chance / 3, run["method"]
