"""A training loop written like torch's AMP recipe reproduces fpsim's Trainer bit for bit.

    with autocast(...):                 # with torch.autocast(...):
        _, loss, cache = gpt_forward(params, model, x, y)
    grads = gpt_backward(scaler.scale(1.0), cache)   # scaler.scale(loss).backward()
    scaler.unscale_(opt, grads)         # scaler.unscale_(opt)
    clip_grad_norm_(grads, max_norm)    # torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(opt, params, grads, lr=...)   # scaler.step(opt)
    scaler.update()                     # scaler.update()
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from fpsim.amp import AdamW, GradScaler, autocast, clip_grad_norm_, get_policy
from fpsim.nn import GPTConfig, gpt_backward, gpt_forward, init_params
from fpsim.train import TrainConfig, Trainer
from fpsim.train.loop import lr_at

CFG = TrainConfig(task="reverse", task_kwargs={"n_symbols": 5, "length": 3}, steps=12, batch_size=8, warmup=3,
                  eval_every=0, telemetry_every=0,
                  model=GPTConfig(vocab_size=6, block_size=6, n_layer=1, n_head=2, n_embd=16))


def torch_style_run(cfg: TrainConfig, dtype: str, scaler: GradScaler, max_norm: float = float("inf"),
                    fused: bool = False) -> dict[str, Any]:
    """The torch AMP loop, line for line, on the Trainer's batches, initial weights and schedule."""
    tr = Trainer("fp32", cfg)                         # only for its task, batches and model shape
    model = tr.model
    params = init_params(model, seed=cfg.seed)        # the FP32 weights (torch: model.parameters())
    opt = AdamW(lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay, fused=fused)
    out: dict[str, Any] = {"loss": [], "loss_scale": [], "skipped": [], "norm": []}
    for step in range(cfg.steps):
        x, y = tr.batch(step)
        out["loss_scale"].append(scaler.get_scale())
        with autocast(dtype):
            _, loss, cache = gpt_forward(params, model, x, y)
        # an overflow (inf, then inf - inf = NaN) is an expected event under loss scaling: the step is skipped
        with np.errstate(over="ignore", invalid="ignore"):
            grads = gpt_backward(scaler.scale(1.0), cache)       # scaler.scale(loss).backward()
            scaler.unscale_(opt, grads)
            out["norm"].append(float(clip_grad_norm_(grads, max_norm)))
        t = opt.t
        scaler.step(opt, params, grads, lr=lr_at(cfg, step))
        out["skipped"].append(opt.t == t)
        scaler.update()
        out["loss"].append(float(loss))
    out["params"] = params
    return out


@pytest.mark.parametrize("policy, dtype, scaler_kw", [
    ("fp16-mixed", "fp16", {}),
    (get_policy("fp16-mixed").replace(name="big-scale", scaler_kwargs={"init_scale": 2.0 ** 26, "growth_interval": 3}),
     "fp16", {"init_scale": 2.0 ** 26, "growth_interval": 3}),   # overflows: skipped steps, back-off, growth
    ("fp16-fast-scaler", "fp16", {"growth_interval": 8}),   # growth, then overflow, back-off
    ("O1", "fp16", {}),
    ("bf16-mixed", "bf16", None),                     # bf16: no scaler (GradScaler(enabled=False))
])
def test_torch_style_loop_reproduces_trainer(policy: Any, dtype: str, scaler_kw: dict[str, Any] | None) -> None:
    tr = Trainer(policy, CFG)
    h = tr.run(progress=False)
    scaler = GradScaler(enabled=False) if scaler_kw is None else GradScaler(**scaler_kw)
    r = torch_style_run(CFG, dtype, scaler)
    assert r["loss"] == h["loss"]
    assert r["skipped"] == h["skipped"]
    if scaler_kw is not None:
        assert r["loss_scale"] == h["loss_scale"]
        assert tr.scaler.state_dict() == scaler.state_dict()
    for k, w in tr.store.weights.items():
        assert np.array_equal(w.view(np.uint32), r["params"][k].view(np.uint32)), k
    if scaler_kw and scaler_kw.get("init_scale"):
        assert any(h["skipped"]) and not all(h["skipped"])   # the skip path was exercised
        assert len(set(h["loss_scale"])) >= 3


def test_clipping_changes_the_run_and_skipped_steps_stay_skipped() -> None:
    kw = {"init_scale": 2.0 ** 26, "growth_interval": 3}
    base = torch_style_run(CFG, "fp16", GradScaler(**kw))
    clipped = torch_style_run(CFG, "fp16", GradScaler(**kw), max_norm=0.05)
    assert clipped["skipped"] == base["skipped"]
    n = [v for v, s in zip(base["norm"], base["skipped"]) if not s]
    assert max(n) > 0.05                              # the clip was active on some step
    assert clipped["loss"][:1] == base["loss"][:1] and clipped["loss"] != base["loss"]


def test_fused_adamw_under_the_scaler_runs_and_skips_the_same_steps() -> None:
    """GradScaler hands a fused AdamW grad_scale/found_inf, as torch; unscale_ was called first here, so
    grad_scale is None and only found_inf reaches the kernel."""
    kw = {"init_scale": 2.0 ** 26, "growth_interval": 3}
    a = torch_style_run(CFG, "fp16", GradScaler(**kw))
    b = torch_style_run(CFG, "fp16", GradScaler(**kw), fused=True)
    assert a["skipped"] == b["skipped"] and a["loss_scale"] == b["loss_scale"]
    assert a["loss"][0] == b["loss"][0]


def test_the_loop_in_docs_amp_md_runs() -> None:
    """The ``>>>`` examples of docs/amp.md (the torch-style loop reproducing Trainer) are doctests."""
    import doctest
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "amp.md").read_text(encoding="utf-8")
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL) if ">>>" in b]
    assert blocks
    parser, runner = doctest.DocTestParser(), doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    globs: dict[str, Any] = {}
    for i, block in enumerate(blocks):
        test = parser.get_doctest(block, globs, f"amp.md[{i}]", "amp.md", 0)
        runner.run(test, clear_globs=False)
        globs = test.globs
    assert runner.summarize(verbose=False).failed == 0
