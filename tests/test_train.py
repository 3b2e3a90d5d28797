"""Training: data tasks, the loop, telemetry, checkpoints and resume, the demo."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from fpsim.nn import GPTConfig
from fpsim.train import (
    CharText,
    CheckpointError,
    TrainConfig,
    Trainer,
    get_task,
    load_checkpoint,
    lr_at,
    save_checkpoint,
)


def tiny_config(**kw: object) -> TrainConfig:
    base = {"task": "reverse", "task_kwargs": {"n_symbols": 5, "length": 3}, "steps": 6, "batch_size": 4, "eval_every": 3,
                "eval_batches": 1, "model": GPTConfig(vocab_size=6, block_size=6, n_layer=1, n_head=2, n_embd=8)}
    base.update(kw)
    return TrainConfig(**base)  # type: ignore[arg-type]


def _read(path: str, mode: str = "rb") -> bytes | str:
    with open(path, mode) as f:
        return f.read()  # type: ignore[no-any-return]


def same_weights(a: Trainer, b: Trainer) -> bool:
    return all(np.array_equal(a.store.weights[k], b.store.weights[k]) for k in a.store.weights)


# ------------------------------------------------------------------ data

def test_tasks() -> None:
    for name in ("copy", "reverse", "sort"):
        t = get_task(name, n_symbols=7, length=5)
        x, y = t.batch(np.random.default_rng(0), 3)
        assert x.shape == y.shape == (3, 10) and t.vocab_size == 8
        src = x[:, :5]
        ans = y[:, 5:]
        want = {"copy": src, "reverse": src[:, ::-1], "sort": np.sort(src, axis=1)}[name]
        assert np.array_equal(ans, want) and (y[:, :4] == -1).all() and (x[:, 5] == 7).all()
        x2, _ = t.batch(np.random.default_rng(0), 3)
        assert np.array_equal(x, x2)
    m = get_task("modadd", p=7)
    x, y = m.batch(np.random.default_rng(1), 5)
    assert np.array_equal(y[:, 2], (x[:, 0] + x[:, 1]) % 7) and (y[:, :2] == -1).all()
    with pytest.raises(ValueError, match="unknown task 'nope'; valid: copy"):
        get_task("nope")


def test_char_text_from_file(tmp_path: object) -> None:
    p = os.path.join(str(tmp_path), "t.txt")
    with open(p, "w", encoding="utf-8") as f:
        f.write("hello world, hello fpsim. " * 4)
    t = get_task("text", path=p, seq_len=8)
    assert isinstance(t, CharText)
    x, y = t.batch(np.random.default_rng(0), 2)
    assert np.array_equal(x[:, 1:], y[:, :-1]) and t.decode(x[0]) in "hello world, hello fpsim. " * 4
    with pytest.raises(ValueError, match="at least"):
        CharText("abc", seq_len=8)


def test_lr_schedule_and_config_errors() -> None:
    c = tiny_config(steps=100, warmup=10, lr=1.0, min_lr_frac=0.1)
    assert lr_at(c, 0) == 0.1 and lr_at(c, 9) == 1.0 and abs(lr_at(c, 100) - 0.1) < 1e-12
    with pytest.raises(ValueError, match="steps"):
        tiny_config(steps=0)
    with pytest.raises(ValueError, match="optimizer"):
        tiny_config(optimizer="lion")
    with pytest.raises(ValueError, match="vocab_size"):
        Trainer("fp32", tiny_config(model=GPTConfig(vocab_size=9, block_size=6, n_layer=1, n_head=2, n_embd=8)))


# ------------------------------------------------------------------ loop and telemetry

@pytest.mark.parametrize("name", ["fp32", "bf16-mixed", "fp16-mixed", "fp16-static", "fp16-no-scaling",
                                  "fp16-no-master", "fp8-hybrid", "int8-qat", "int4-qat", "int8-ptq", "int4-ptq"])
def test_every_policy_trains_a_few_steps(name: str) -> None:
    tr = Trainer(name, tiny_config(steps=4, histogram_every=2))
    h = tr.run(progress=False)
    assert len(h) == 4 and all(np.isfinite(h["loss"]))
    assert h["eval_step"][-1] == 4 and np.isfinite(h["eval_loss"][-1])
    assert h["hist_step"] == [0, 2] and len(h["hist"]["grad_act"][0]) == h["hist_hi"] - h["hist_lo"]
    assert all(0 <= v <= 1 for v in h["grad_underflow_fraction"])
    assert any(k.endswith(".dw") for k in h["tensors"])
    if name.endswith("ptq"):
        assert "float_eval_loss" in h.data and tr.runtime.quant_active
    json.dumps(h.to_dict())  # plain data


def test_same_seed_same_bits() -> None:
    a = Trainer("fp16-mixed", tiny_config())
    b = Trainer("fp16-mixed", tiny_config())
    a.run(progress=False)
    b.run(progress=False)
    assert same_weights(a, b) and a.history["loss"] == b.history["loss"]
    c = Trainer("fp16-mixed", tiny_config(seed=1))
    c.run(progress=False)
    assert not same_weights(a, c)


def test_micro_batches_power_of_two_is_exact_in_fp32() -> None:
    a = Trainer("fp32", tiny_config())
    b = Trainer("fp32", tiny_config(micro_batches=1024))
    a.run(progress=False)
    b.run(progress=False)
    assert same_weights(a, b)
    c = Trainer("fp16-no-scaling", tiny_config(micro_batches=2 ** 20))
    c.run(progress=False)
    assert np.nanmean(c.history["grad_underflow_fraction"]) > 0.3  # tiny per-token gradients flush in fp16


def test_overflow_skips_step_and_backs_off() -> None:
    pol = "fp16-mixed"
    from fpsim.amp import get_policy

    big = get_policy(pol).replace(name="test-huge-scale", scaler_kwargs={"init_scale": 2.0 ** 40})
    tr = Trainer(big, tiny_config(steps=3))
    w0 = {k: v.copy() for k, v in tr.store.weights.items()}
    tr.step()
    assert tr.history["skipped"][0] and tr.history["loss_scale"][0] == 2.0 ** 40
    assert tr.scaler.scale == 2.0 ** 39 and all(np.array_equal(w0[k], tr.store.weights[k]) for k in w0)


def test_progress_is_quiet_when_not_a_tty(capsys: pytest.CaptureFixture[str]) -> None:
    Trainer("fp32", tiny_config(steps=2)).run()
    cap = capsys.readouterr()
    assert cap.err == "" and cap.out == ""


# ------------------------------------------------------------------ checkpoints

@pytest.mark.parametrize("name", ["fp16-mixed", "fp8-hybrid", "int4-qat", "fp16-no-master"])
def test_resume_is_bit_identical(name: str, tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "ck.npz")
    full = Trainer(name, tiny_config())
    full.run(progress=False)
    half = Trainer(name, tiny_config())
    half.run(3, progress=False, checkpoint=path)
    resumed = load_checkpoint(path)
    assert resumed.step_count == 3
    resumed.run(progress=False)
    assert same_weights(full, resumed)
    for k in ("loss", "loss_scale", "skipped", "grad_underflow_fraction", "lost_update_fraction"):
        assert np.array_equal(np.asarray(full.history[k]), np.asarray(resumed.history[k]), equal_nan=True), k
    assert full.history["eval_loss"] == resumed.history["eval_loss"]


def test_bad_checkpoints(tmp_path: object) -> None:
    d = str(tmp_path)
    path = os.path.join(d, "ck.npz")
    tr = Trainer("fp16-mixed", tiny_config())
    tr.run(2, progress=False)
    save_checkpoint(tr, path)
    good = _read(path)
    # truncated
    with open(os.path.join(d, "trunc.npz"), "wb") as f:
        f.write(good[: len(good) // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupted"):
        load_checkpoint(os.path.join(d, "trunc.npz"))
    # one flipped byte in the middle of the data
    bad = bytearray(good)
    bad[len(bad) // 3] ^= 0xFF
    with open(os.path.join(d, "flip.npz"), "wb") as f:
        f.write(bytes(bad))
    with pytest.raises(CheckpointError):
        load_checkpoint(os.path.join(d, "flip.npz"))
    # another policy / another config
    with pytest.raises(CheckpointError, match="different definition"):
        load_checkpoint(path, policy="bf16-mixed")
    with pytest.raises(CheckpointError, match="configuration"):
        load_checkpoint(path, config=tiny_config(lr=1.0))
    # not a checkpoint
    np.savez(os.path.join(d, "other.npz"), a=np.zeros(3))
    with pytest.raises(CheckpointError, match="meta"):
        load_checkpoint(os.path.join(d, "other.npz"))


def test_failed_save_leaves_previous_intact(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    d = str(tmp_path)
    path = os.path.join(d, "ck.npz")
    tr = Trainer("fp32", tiny_config())
    tr.run(2, progress=False)
    save_checkpoint(tr, path)
    before = _read(path)
    tr.run(4, progress=False)

    def boom(*a: object, **k: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", boom)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tr, path)
    assert _read(path) == before and os.listdir(d) == ["ck.npz"]
    assert load_checkpoint(path).step_count == 2


# ------------------------------------------------------------------ demo

def test_demo_quick_writes_report(tmp_path: object) -> None:
    pytest.importorskip("matplotlib")
    from fpsim.cli import main

    out = os.path.join(str(tmp_path), "demo")
    rc = main(["demo", "--quick", "--steps", "3", "--out", out, "--policies", "fp32,fp16-mixed",
               "fp16-no-master", "int4-ptq", "int4-qat"])
    assert rc == 0
    for f in ("report.md", "metrics.json", "loss_curves.png", "lost_updates.png", "qat_vs_ptq.png"):
        assert os.path.getsize(os.path.join(out, f)) > 0, f
    m = json.loads(_read(os.path.join(out, "metrics.json"), "r"))
    for n in ("fp32", "fp16-mixed", "fp16-no-master", "int4-ptq", "int4-qat"):
        for k in ("final_loss", "grad_underflow_fraction", "lost_update_fraction", "skipped_steps", "steps",
                  "wall_s"):
            assert k in m[n] and k in m["policies"][n]
        assert m[n]["steps"] == 3
    assert m["memory_ledger"]["fp16-mixed"]["total"] == 16
    assert "![Loss curves](loss_curves.png)" in _read(os.path.join(out, "report.md"), "r")
    with pytest.raises(SystemExit):
        main(["demo", "--bogus"])
    assert main(["demo", "--steps", "1", "--out", out, "--policies", "nope"]) == 2


def test_stochastic_rounding_policy_resumes_bit_identically(tmp_path: object) -> None:
    from fpsim.amp import get_policy, register_policy

    sr = get_policy("bf16-mixed").replace(name="test-bf16-sr-no-master", master=None, rounding="sr")
    register_policy(sr, overwrite=True)
    path = os.path.join(str(tmp_path), "sr.npz")
    full = Trainer(sr, tiny_config())
    full.run(progress=False)
    half = Trainer(sr, tiny_config())
    half.run(3, progress=False, checkpoint=path)
    resumed = load_checkpoint(path)
    resumed.run(progress=False)
    assert same_weights(full, resumed)
    other = Trainer(sr, tiny_config(seed=5))
    other.run(progress=False)
    assert not same_weights(full, other)
