"""Issue 14 §2: ``TrainConfig(fused=True)``: the Trainer with torch's fused optimizer step.

Oracles: a hand-written torch-style loop (fpsim's GradScaler handing ``grad_scale``/``found_inf`` to the
fused optimizer, as torch.amp.GradScaler does) and torch.optim.AdamW/SGD(fused=True) on CPU fed the same
per-step gradients; both compared with the Trainer's master weights after every step, bit for bit.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import pytest

from fpsim.amp import SGD, AdamW, GradScaler, MasterWeights, get_policy
from fpsim.nn import GPTConfig, gpt_backward, gpt_forward, init_params
from fpsim.train import TrainConfig, Trainer, load_checkpoint, lr_at, save_checkpoint

TINY = GPTConfig(vocab_size=6, block_size=6, n_layer=1, n_head=2, n_embd=8)


def cfg(**kw: Any) -> TrainConfig:
    base: dict[str, Any] = {"task": "reverse", "task_kwargs": {"n_symbols": 5, "length": 3}, "steps": 6,
                            "batch_size": 4, "eval_every": 3, "eval_batches": 1, "model": TINY, "warmup": 2,
                            "fused": True, "weight_decay": 0.01}
    base.update(kw)
    return TrainConfig(**base)


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def hand_loop(policy: str, c: TrainConfig, init_scale: float | None = None,
              torch_opt: bool = False) -> tuple[list[dict[str, np.ndarray]], list[bool], list[int]]:
    """The torch-style loop: forward, backward of the scaled loss, ``scaler.step(opt, ...)`` (a fused
    optimizer gets grad_scale and found_inf), ``scaler.update()``. Returns the master weights after each
    step, which steps were skipped, and the mismatch count against torch's fused optimizer per step
    (fed the same scaled gradients) when ``torch_opt``."""
    pol = get_policy(policy)
    rt = pol.runtime(seed=c.seed)
    tr = Trainer(pol, c)                     # only for its task and batches (a pure function of seed, step)
    w = {k: v.copy() for k, v in MasterWeights(init_params(TINY, seed=c.seed), pol, rt).weights.items()}
    kw: dict[str, Any] = {"lr": c.lr, "weight_decay": c.weight_decay}
    if c.optimizer == "adamw":
        kw.update(betas=c.betas, eps=c.eps)
    else:
        kw.update(momentum=c.momentum)
    opt: AdamW | SGD = (AdamW if c.optimizer == "adamw" else SGD)(fused=True, **kw)
    scaler = GradScaler("cpu", init_scale=init_scale or 2.0 ** 16, enabled=pol.loss_scale is not None)
    if torch_opt:
        torch = pytest.importorskip("torch")
        tp = {k: torch.tensor(v.copy(), requires_grad=True) for k, v in w.items()}
        topt = (torch.optim.AdamW if c.optimizer == "adamw" else torch.optim.SGD)(list(tp.values()), fused=True,
                                                                                 **kw)
    out, skipped, mism = [], [], []
    for s in range(c.steps):
        rt.training = True
        rt.begin_step(recording=True, histograms=False)
        x, y = tr.batch(s)
        scale = np.float32(scaler.get_scale())
        scaler.scale(np.float32(0.0))        # (the loss is scaled inside the backward: gpt_backward(scale))
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            _, _, cache = gpt_forward(w, TINY, x, y, prec=rt)
            grads = {k: np.array(g, np.float32) for k, g in gpt_backward(scale, cache).items()}
        inf = not all(np.isfinite(g).all() for g in grads.values())
        lr = lr_at(c, s)
        if torch_opt:
            for k, p in tp.items():
                p.grad = torch.tensor(grads[k].copy())
            topt.param_groups[0]["lr"] = lr
            if pol.loss_scale is not None:       # what torch.amp.GradScaler.step hands a fused optimizer
                topt.grad_scale, topt.found_inf = torch.tensor(float(scale)), torch.tensor(1.0 if inf else 0.0)
            topt.step()
        scaler.step(opt, w, grads, lr=lr)
        if pol.loss_scale is None and inf:   # (never happens in FP32 here; kept for symmetry with the Trainer)
            raise AssertionError("non-finite FP32 gradient")
        scaler.update()
        rt.end_step()
        out.append({k: v.copy() for k, v in w.items()})
        skipped.append(bool(inf))
        if torch_opt:
            mism.append(sum(int(np.count_nonzero(bits(tp[k].detach().numpy()) != bits(w[k]))) for k in w))
    return out, skipped, mism


def trainer_steps(policy: Any, c: TrainConfig) -> tuple[list[dict[str, np.ndarray]], Trainer]:
    tr = Trainer(policy, c)
    out = []
    for _ in range(c.steps):
        tr.step()
        out.append({k: v.copy() for k, v in tr.store.weights.items()})
    return out, tr


@pytest.mark.parametrize("policy,optimizer", [("fp16-mixed", "adamw"), ("bf16-mixed", "adamw"),
                                              ("fp16-mixed", "sgd"), ("fp32", "adamw")])
def test_trainer_fused_equals_torch_style_loop_and_torch(policy: str, optimizer: str) -> None:
    c = cfg(optimizer=optimizer)
    want, skipped, mism = hand_loop(policy, c, torch_opt=True)
    got, tr = trainer_steps(policy, c)
    for s, (a, b) in enumerate(zip(got, want)):
        assert [k for k in a if not np.array_equal(bits(a[k]), bits(b[k]))] == [], f"step {s}"
    assert mism == [0] * c.steps                 # torch's own fused optimizer, same gradients: same bits
    assert tr.history["skipped"] == skipped
    assert tr.optimizer.fused and tr.optimizer.t == c.steps - sum(skipped)


def test_trainer_fused_skips_overflowing_steps_as_torch() -> None:
    # A loss scale of 2**22 overflows FP16 gradients: 5 skipped steps and the back-off, in all three.
    pol = get_policy("fp16-mixed").replace(name="t-fp16-huge-scale", scaler_kwargs={"init_scale": 2.0 ** 22})
    c = cfg(steps=8)
    want, skipped, mism = hand_loop("fp16-mixed", c, init_scale=2.0 ** 22, torch_opt=True)
    assert any(skipped) and not all(skipped)
    got, tr = trainer_steps(pol, c)
    assert tr.history["skipped"] == skipped
    for a, b in zip(got, want):
        assert all(np.array_equal(bits(a[k]), bits(b[k])) for k in a)
    assert mism == [0] * c.steps
    assert tr.optimizer.t == c.steps - sum(skipped)


def test_fused_micro_batches_sum_before_the_kernel() -> None:
    # micro_batches=2 (a power of two): the scaled gradient doubled before the kernel's division equals the
    # unscaled gradient doubled, so in FP32 the run equals micro_batches=1 bit for bit (as the unfused one).
    a, _ = trainer_steps("fp32", cfg(steps=3))
    b, _ = trainer_steps("fp32", cfg(steps=3, micro_batches=2))
    assert all(np.array_equal(bits(x[k]), bits(y[k])) for x, y in zip(a, b) for k in x)


def test_fused_and_unfused_trainer_runs_differ_only_by_rounding() -> None:
    # After one step (lr 1.5e-3) the two differ in many weights, each by at most about one float32 ulp of 1.
    a, ta = trainer_steps("fp16-mixed", cfg(steps=1))
    b, tb = trainer_steps("fp16-mixed", cfg(steps=1, fused=False))
    diff = sum(int(np.count_nonzero(bits(a[-1][k]) != bits(b[-1][k]))) for k in a[-1])
    gap = max(float(np.max(np.abs(a[-1][k] - b[-1][k]))) for k in a[-1])
    assert diff > 100 and gap <= 2.0 ** -22
    assert all(np.isnan(ta.history["lost_update_fraction"]))       # not measured by the fused pass
    assert not any(np.isnan(tb.history["lost_update_fraction"]))


@pytest.mark.parametrize("policy,optimizer", [("fp16-mixed", "adamw"), ("bf16-mixed", "sgd")])
def test_fused_checkpoint_resume_is_bit_identical(policy: str, optimizer: str, tmp_path: Any) -> None:
    c = cfg(optimizer=optimizer)
    full = Trainer(policy, c)
    full.run(progress=False)
    half = Trainer(policy, c)
    half.run(3, progress=False)
    path = save_checkpoint(half, os.path.join(str(tmp_path), "f.npz"))
    r = load_checkpoint(path, policy=policy)
    assert r.config.fused and r.optimizer.fused
    r.run(progress=False)
    assert all(np.array_equal(bits(full.store.weights[k]), bits(r.store.weights[k])) for k in full.store.weights)
    sa, sb = full.optimizer.state_dict(), r.optimizer.state_dict()
    assert set(sa) == set(sb) and all(np.array_equal(sa[k], sb[k]) for k in sa)
    ha, hb = dict(full.history.data), dict(r.history.data)
    ha.pop("wall_s"), hb.pop("wall_s")
    assert json.dumps(ha) == json.dumps(hb)
    with pytest.raises(Exception, match="fused"):   # a different configuration is refused, naming the field
        load_checkpoint(path, policy=policy, config=cfg(optimizer=optimizer, fused=False))


def test_old_config_without_fused_loads() -> None:
    d = cfg(fused=False).as_dict()
    assert d["fused"] is False
    del d["fused"]                              # a checkpoint written before the field existed
    assert TrainConfig.from_dict(d) == cfg(fused=False)
    assert TrainConfig.from_dict(cfg().as_dict()).fused is True


def test_old_checkpoint_without_fused_loads(tmp_path: Any) -> None:
    tr = Trainer("fp32", cfg(fused=False, steps=2))
    tr.run(1, progress=False)
    path = save_checkpoint(tr, os.path.join(str(tmp_path), "old.npz"))
    with np.load(path) as z:                     # rewrite its metadata as an older fpsim wrote it
        data = {k: z[k] for k in z.files}
    meta = json.loads(str(data["meta"]))
    assert meta["config"].pop("fused") is False
    data["meta"] = np.asarray(json.dumps(meta))
    old = os.path.join(str(tmp_path), "older.npz")
    np.savez(old, **data)
    r = load_checkpoint(old)
    assert r.config.fused is False and r.config == tr.config
    r.run(progress=False)


def test_fused_config_checks() -> None:
    with pytest.raises(TypeError, match="TrainConfig.fused must be a bool, got int: 1"):
        cfg(fused=1)
    assert cfg(fused=np.bool_(True)).fused is True
    for name, why in (("fp16-no-master", "weights fp16"), ("O3", "optimizer_state fp16"),
                      ("bf16-pure-sr", "update rule 'sr'")):
        with pytest.raises(ValueError, match=why):
            Trainer(name, cfg())


def test_fused_trainer_does_not_modify_init() -> None:
    init = init_params(TINY, seed=3)
    keep = {k: v.copy() for k, v in init.items()}
    tr = Trainer("fp32", cfg(steps=2), init=init)
    tr.run(progress=False)
    assert all(np.array_equal(init[k], keep[k]) for k in init)
