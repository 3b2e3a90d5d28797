"""fpsim.amp.detect_anomaly: the first inf/NaN of a run, by op, layer, phase and step."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fpsim.amp import Anomaly, AnomalyError, AnomalyLog, detect_anomaly, get_policy
from fpsim.nn import GPTConfig, gpt_backward, gpt_forward, init_params
from fpsim.train import TrainConfig, Trainer

CFG = GPTConfig(vocab_size=7, block_size=6, n_layer=2, n_head=2, n_embd=8)


def _batch(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.integers(0, CFG.vocab_size, size=(2, CFG.block_size))
    return x, np.roll(x, -1, axis=1)


def test_forward_overflow_in_fp16_names_the_first_op():
    # A huge MLP weight in block 1: its fc GEMM's output passes 65504 and is stored in fp16 as inf.
    params = init_params(CFG, seed=0)
    params["h1.mlp.fc.w"] = params["h1.mlp.fc.w"] * np.float32(1e6)
    x, y = _batch(1)
    rt = get_policy("fp16-mixed").runtime()
    with detect_anomaly() as log:
        _, loss, _ = gpt_forward(params, CFG, x, y, prec=rt)
    assert not np.isfinite(loss)
    a = log.first
    assert a is not None
    assert (a.site, a.op, a.layer, a.phase, a.fmt, a.cause) == ("h1.mlp.fc", "matmul", 1, "forward", "fp16", "overflow")
    assert a.amax > 65504 and a.n_overflow == a.n_inf > 0 and a.step is None and a.training
    assert "h1.mlp.fc" in str(a) and "overflowed fp16" in str(a)
    # the later events are its consequences, in the order the forward pass made them
    sites = [e.site for e in log.events]
    assert sites.index("h1.mlp.fc") == 0 and log.count == len(log.events) >= 2


def test_the_same_weights_in_bf16_and_fp32_report_nothing():
    params = init_params(CFG, seed=0)
    params["h1.mlp.fc.w"] = params["h1.mlp.fc.w"] * np.float32(1e6)
    x, y = _batch(1)
    for name in ("bf16-mixed", "fp32"):
        with detect_anomaly() as log:
            gpt_forward(params, CFG, x, y, prec=get_policy(name).runtime())
        # the GELU of 1e7-sized values is finite in bf16 and fp32: no event
        assert log.first is None, (name, log.first)


def test_backward_events_and_fp32_kept_ops():
    # A NaN in the final LayerNorm's gain: lnf is an FP32-kept op, its output is checked all the same.
    params = init_params(CFG, seed=2)
    params["lnf.g"] = params["lnf.g"].copy()
    params["lnf.g"][0] = np.nan
    x, y = _batch(3)
    rt = get_policy("bf16-mixed").runtime()
    with detect_anomaly() as log:
        _, _, cache = gpt_forward(params, CFG, x, y, prec=rt)
        gpt_backward(np.float32(1.0), cache)
    a = log.first
    assert a is not None and (a.site, a.op, a.fmt, a.cause, a.layer) == ("lnf", "layernorm", "fp32", "nan", None)
    assert any(e.phase == "backward" for e in log.events)


def test_off_outside_the_context_and_nested():
    params = init_params(CFG, seed=0)
    params["h0.attn.qkv.w"] = params["h0.attn.qkv.w"] * np.float32(1e5)
    x, y = _batch(4)
    rt = get_policy("fp16-mixed").runtime()
    outer = detect_anomaly()
    with outer:
        with detect_anomaly() as inner:
            gpt_forward(params, CFG, x, y, prec=rt)
        assert inner.first is not None and outer.first is None  # the innermost log records
    gpt_forward(params, CFG, x, y, prec=rt)                     # off again: nothing added anywhere
    assert outer.first is None and inner.count == len(inner)
    with pytest.raises(RuntimeError, match="already active"):
        with inner:
            with inner:
                pass


def test_raise_error_stops_at_the_first_event():
    params = init_params(CFG, seed=0)
    params["h1.mlp.fc.w"] = params["h1.mlp.fc.w"] * np.float32(1e6)
    x, y = _batch(1)
    with pytest.raises(AnomalyError) as ei, detect_anomaly(raise_error=True) as log:
        gpt_forward(params, CFG, x, y, prec=get_policy("fp16-mixed").runtime())
    assert isinstance(ei.value, FloatingPointError)
    assert ei.value.anomaly.site == "h1.mlp.fc" and log.count == 1


def test_max_events_keeps_the_first_and_counts_all():
    params = init_params(CFG, seed=0)
    params["h0.mlp.fc.w"] = params["h0.mlp.fc.w"] * np.float32(1e6)
    x, y = _batch(5)
    with detect_anomaly(max_events=1) as log:
        gpt_forward(params, CFG, x, y, prec=get_policy("fp16-mixed").runtime())
    assert len(log.events) == 1 and log.count > 1 and log.first is log.events[0]


def test_trainer_steps_are_reported_and_a_healthy_run_is_silent():
    cfg = TrainConfig(task="reverse", task_kwargs={"n_symbols": 5, "length": 3}, steps=3, batch_size=4,
                      model=GPTConfig(vocab_size=6, block_size=6, n_layer=1, n_head=2, n_embd=8), eval_every=0)
    with detect_anomaly() as log:
        Trainer("fp16-no-scaling", cfg).run(progress=False)
    assert log.first is None
    # weights that overflow fp16 from step 0 on: every step reports, with its step number
    tr = Trainer("fp16-no-scaling", cfg)
    tr.store.weights["h0.mlp.fc.w"] = tr.store.weights["h0.mlp.fc.w"] * np.float32(1e6)
    with detect_anomaly() as log:
        h = tr.run(progress=False)
    fwd = [e for e in log.events if e.phase == "forward" and e.training]
    assert [e.step for e in fwd if e.site == "h0.mlp.fc"] == [0, 1, 2]
    assert all(h["skipped"])                                     # the trainer skips the non-finite steps
    assert any(not e.training and e.step == 3 for e in log.events)  # the final evaluation, after step 3


def test_recomputed_forward_is_not_checked_twice():
    cfg = dataclasses.replace(CFG, checkpoint="blocks")
    params = init_params(cfg, seed=0)
    params["h1.mlp.fc.w"] = params["h1.mlp.fc.w"] * np.float32(1e6)
    x, y = _batch(1)
    with detect_anomaly() as log:
        _, _, cache = gpt_forward(params, cfg, x, y, prec=get_policy("fp16-mixed").runtime())
        gpt_backward(np.float32(1.0), cache)
    assert sum(e.site == "h1.mlp.fc" and e.phase == "forward" for e in log.events) == 1


def test_bad_arguments():
    with pytest.raises(TypeError, match="raise_error"):
        detect_anomaly(raise_error="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_events"):
        detect_anomaly(max_events=0)
    assert isinstance(detect_anomaly(), AnomalyLog)


def test_anomaly_text_for_a_nan_from_the_op_itself():
    a = Anomaly(step=None, phase="backward", training=True, site="h0.ln1.grad", op="layernorm", layer=0,
                fmt="bf16", n_inf=0, n_nan=3, n_overflow=0, size=8, amax=1.0)
    assert a.cause == "nan"
    assert str(a) == "outside a trainer, backward: h0.ln1.grad (layernorm, layer 0) is nan in 3 of 8 values (bf16)"
