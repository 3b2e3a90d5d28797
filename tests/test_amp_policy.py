"""Policies, the policy runtime (casts, GEMMs, FP8, fake quantization, telemetry), optimizers, master weights."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from fpsim.amp import (
    SGD,
    AdamW,
    FP8Recipe,
    MasterWeights,
    Policy,
    QuantConfig,
    get_policy,
    policy_names,
    register_policy,
)

NAMED = ["fp32", "bf16-mixed", "fp16-mixed", "fp16-static", "fp16-no-scaling", "fp16-no-master", "fp8-hybrid",
         "int8-qat", "int4-qat", "int8-ptq", "int4-ptq"]


def test_named_policies() -> None:
    assert all(n in policy_names() for n in NAMED)
    p = get_policy("fp16-mixed")
    assert (p.params.name, p.gradients.name, p.master.name, p.loss_scale) == ("fp16", "fp16", "fp32", "dynamic")
    assert get_policy("fp16-no-master").master is None and get_policy("fp16-no-master").weights.name == "fp16"
    assert get_policy("fp16-no-scaling").make_scaler().scale == 1.0
    assert get_policy("fp16-static").make_scaler().scale == 1024.0
    assert get_policy("fp16-mixed").make_scaler().dynamic
    f8 = get_policy("fp8-hybrid").fp8
    assert f8 is not None and (f8.forward.name, f8.backward.name) == ("fp8_e4m3", "fp8_e5m2")
    assert get_policy("int4-qat").quant == QuantConfig(bits=4, mode="qat", start=0.5)
    assert get_policy(p) is p


def test_custom_policy_and_errors() -> None:
    mine = get_policy("fp16-mixed").replace(name="test-mine-bf16-grads", gradients="bf16")
    assert mine.gradients.name == "bf16"
    register_policy(mine)
    assert get_policy("test-mine-bf16-grads") is mine
    with pytest.raises(ValueError, match="already registered"):
        register_policy(mine)
    with pytest.raises(ValueError, match="unknown policy 'nope'; valid: fp32"):
        get_policy("nope")
    with pytest.raises(ValueError, match="unknown ops"):
        Policy("x", fp32_ops={"softmax", "convolution"})
    with pytest.raises(ValueError, match="loss_scale"):
        Policy("x", loss_scale=-1.0)
    with pytest.raises(ValueError, match="float32"):
        Policy("x", params="fp64")
    with pytest.raises(ValueError, match="bits"):
        QuantConfig(bits=1)
    with pytest.raises(ValueError, match="amax_compute_algo"):
        FP8Recipe(amax_compute_algo="mean")
    with pytest.raises(TypeError):
        register_policy("fp32")  # type: ignore[arg-type]


def test_memory_ledger() -> None:
    assert get_policy("fp32").memory_ledger() == {"weights": 4, "grads": 4, "master": 0, "optimizer_state": 8,
                                                  "total": 16}
    assert get_policy("fp16-mixed").memory_ledger()["total"] == 16
    assert get_policy("fp16-no-master").memory_ledger() == {"weights": 2, "grads": 2, "master": 0,
                                                            "optimizer_state": 8, "total": 12}
    assert get_policy("fp16-mixed").memory_ledger("sgd")["optimizer_state"] == 4


@pytest.mark.parametrize("name,dtype", [("fp16-mixed", np.float16), ("bf16-mixed", ml_dtypes.bfloat16)])
def test_matmul_casts_against_ml_dtypes(name: str, dtype: type, rng: np.random.Generator) -> None:
    rt = get_policy(name).runtime()
    a = (rng.standard_normal((9, 7)) * 3).astype(np.float32)
    b = (rng.standard_normal((7, 5)) * 0.1).astype(np.float32)
    bias = rng.standard_normal(5).astype(np.float32)

    def c(x: np.ndarray) -> np.ndarray:  # ml_dtypes is a single-rounding oracle for float32 input
        return x.astype(dtype).astype(np.float32)

    out, cache = rt.matmul(a, b, "s", "linear", bias=bias)
    assert np.array_equal(out, c(c(a) @ c(b) + c(bias)))
    d = (rng.standard_normal((9, 5)) * 1e-3).astype(np.float32)
    da, db, dbias = rt.matmul_backward(d, cache)
    assert np.array_equal(da, c(c(d) @ c(b).T))
    assert np.array_equal(db, c(c(a).T @ c(d)))
    assert np.array_equal(dbias, c(c(d).sum(axis=0)))
    assert np.array_equal(a, (rng.standard_normal((1,)) * 0 + a))  # inputs untouched


def test_fp32_ops_and_grad_telemetry() -> None:
    rt = get_policy("fp16-no-scaling").runtime()
    x = np.float32([1e-3, 1 + 2 ** -12])
    assert rt.act(x, "s", "softmax") is x                      # FP32-listed op: kept
    assert rt.act(x, "s", "gelu").tolist() == [np.float16(1e-3).item(), 1.0]
    rt.begin_step(recording=True)
    g = np.float32([1e-9, 4e-8, 1e-6, 0.0, 1e5, -3.0])
    r = rt.grad(g, "s", "scale")
    with np.errstate(over="ignore"):
        assert r.tolist() == np.float32(g.astype(np.float16)).tolist()
    total, nz, under, sub, over, amax = rt.stats["s.grad"]
    assert (total, nz, under, sub, over) == (6, 5, 1, 2, 1) and amax == np.float32(1e5)


def test_fp8_delayed_scaling_matmul(rng: np.random.Generator) -> None:
    rt = get_policy("fp8-hybrid").runtime()
    a = (rng.standard_normal((8, 16)) * 4).astype(np.float32)
    w = (rng.standard_normal((16, 4)) * 0.05).astype(np.float32)

    def e4m3(x: np.ndarray) -> np.ndarray:  # saturating cast: clip, then ml_dtypes' cast of float32
        return np.clip(x, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)

    def bf(x: np.ndarray) -> np.ndarray:
        return x.astype(ml_dtypes.bfloat16).astype(np.float32)

    out, _ = rt.matmul(a, w, "l", "linear")                     # step 0: scales are 1
    assert np.array_equal(out, bf(e4m3(a) @ e4m3(w)))
    rt.end_step()
    sa = np.float32(448) / np.abs(a).max()
    sw = np.float32(448) / np.abs(w).max()
    out, _ = rt.matmul(a, w, "l", "linear")
    ia, iw = np.float32(1) / sa, np.float32(1) / sw
    assert np.array_equal(out, bf((e4m3(a * sa) @ e4m3(w * sw)) * (ia * iw)))
    # attention GEMMs are not FP8 in this recipe: plain BF16
    out, _ = rt.matmul(a, w, "attn", "attn")
    assert np.array_equal(out, bf(bf(a) @ bf(w)))


@pytest.mark.torch
def test_qat_fake_quant_against_torch(rng: np.random.Generator) -> None:
    torch = pytest.importorskip("torch")
    rt = get_policy("int4-qat").runtime()
    assert not rt.quant_active  # the named QAT policies fine-tune: quantization starts half-way
    rt.quant_active = True
    a = (rng.standard_normal((16, 8)) * 2).astype(np.float32)
    w = (rng.standard_normal((8, 6)) * 0.3).astype(np.float32)
    out, cache = rt.matmul(a, w, "q", "linear")
    # torch oracle: per-tensor affine activations [0, 15] from min/max, per-channel symmetric weights [-8, 7]
    mn, mx = min(a.min(), 0), max(a.max(), 0)
    s = max(np.float32((mx - mn) / np.float32(15)), np.float32(2 ** -23))
    zp = int(np.clip(0 - np.rint(mn / s), 0, 15))
    ta = torch.tensor(a, requires_grad=True)
    aq = torch.fake_quantize_per_tensor_affine(ta, float(s), zp, 0, 15)
    sw = np.maximum(np.abs(w).max(axis=0) / np.float32(7.5), np.float32(2 ** -23)).astype(np.float32)
    tw = torch.tensor(w, requires_grad=True)
    wq = torch.fake_quantize_per_channel_affine(tw, torch.tensor(sw), torch.zeros(6, dtype=torch.int32), 1, -8, 7)
    ref = aq @ wq
    np.testing.assert_allclose(out, ref.detach().numpy(), rtol=1e-6, atol=1e-6)
    assert np.array_equal(cache[1], aq.detach().numpy()) and np.array_equal(cache[3], wq.detach().numpy())
    d = rng.standard_normal((16, 6)).astype(np.float32)
    ref.backward(torch.tensor(d))
    da, dw, _ = rt.matmul_backward(d, cache)
    np.testing.assert_allclose(da, ta.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dw, tw.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_master_weights_and_lost_updates() -> None:
    pol = get_policy("fp16-no-master")
    store = MasterWeights({"w": np.float32([1.0, 1.0, 0.5])}, pol, pol.runtime())
    lost = store.apply({"w": np.float32([1e-4, -1e-3, 0.0])})
    assert store.weights["w"].tolist() == [1.0, float(np.float16(1 + 1e-3)), 0.5] and lost["w"] == 0.5
    pol = get_policy("fp16-mixed")
    store = MasterWeights({"w": np.float32([1.0])}, pol, pol.runtime())
    for _ in range(100):
        store.apply({"w": np.float32([-1e-4])})
    assert abs(store.weights["w"][0] - 1.01) < 1e-5 and store.weights["w"].dtype == np.float32


@pytest.mark.torch
def test_optimizers_against_torch(rng: np.random.Generator) -> None:
    torch = pytest.importorskip("torch")
    w0 = rng.standard_normal((4, 3)).astype(np.float32)
    grads = [rng.standard_normal((4, 3)).astype(np.float32) for _ in range(5)]
    for ours, make in ((AdamW(lr=1e-2, weight_decay=0.1), lambda p: torch.optim.AdamW([p], lr=1e-2,
                                                                                         weight_decay=0.1)),
                       (SGD(lr=0.1, momentum=0.9), lambda p: torch.optim.SGD([p], lr=0.1, momentum=0.9))):
        w = {"w": w0.copy()}
        p = torch.tensor(w0.copy(), requires_grad=True)
        opt = make(p)
        for g in grads:
            u = ours.updates(w, {"w": g})
            w["w"] = w["w"] - u["w"]
            p.grad = torch.tensor(g)
            opt.step()
        np.testing.assert_allclose(w["w"], p.detach().numpy(), rtol=2e-6, atol=2e-7)
    with pytest.raises(ValueError, match="AdamW needs"):
        AdamW(lr=-1)


def test_optimizer_state_format() -> None:
    pol = get_policy("fp32").replace(name="bf16-state", optimizer_state="bf16")
    rt = pol.runtime()
    from fpsim.amp import make_optimizer

    opt = make_optimizer("adamw", pol, rt, lr=1e-3)
    opt.updates({"w": np.float32([1.0])}, {"w": np.float32([0.1234567])})
    m = opt.state["m.w"]
    assert m.tolist() == np.float32(m.astype(ml_dtypes.bfloat16)).tolist()
    with pytest.raises(ValueError, match="unknown optimizer"):
        make_optimizer("lion", pol, rt)
