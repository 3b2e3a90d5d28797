"""``fpsim demo``: train the same tiny GPT under every named policy and write a report.

Writes ``DIR/report.md`` (with PNG plots beside it) and ``DIR/metrics.json``. Runs are honest: the same
model, data, seed and hyper-parameters for every policy; only the policy differs. The PTQ policies train
exactly as ``fp32`` does (quantization is off until training ends), so when ``fp32`` is part of the demo
its trained weights are reused for them instead of training the identical run again.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._fpenv import ieee_mode
from ..amp import get_policy
from ..nn import GPTConfig, count_params, init_params
from ._files import atomic_write
from ._settings import DEFAULT_POLICIES, DemoSettings, check_output_dir, demo_settings
from ._settings import TMP_PREFIX as _TMP_PREFIX
from .ledger import checkpoint_table, measure_step
from .loop import History, TrainConfig, Trainer

__all__ = [
    "DEFAULT_POLICIES",
    "DemoSettings",
    "activation_bytes_per_token",
    "check_output_dir",
    "demo_settings",
    "memory_ledger",
    "run_demo",
]

@ieee_mode
def memory_ledger(policy: Any, optimizer: str = "adamw") -> dict[str, float]:
    """Bytes per parameter under ``policy`` (see :meth:`fpsim.amp.Policy.memory_ledger`)."""
    return get_policy(policy).memory_ledger(optimizer)


@ieee_mode
def activation_bytes_per_token(policy: Any, cfg: GPTConfig) -> float:
    """An *estimate* of the bytes of activations kept for the backward pass, per token, under ``policy``.

    The measured figure is :func:`fpsim.train.measure_step` (``device_bytes_per_token``), which the demo
    reports beside this one: on the demo model the estimate is 24% (FP32) to 34% (BF16) below it, since
    it leaves out LayerNorm's x-hat and 1/std, GELU's tanh, q/k/v as separate GEMM operands, the causal
    mask and the loss's probabilities, and counts the LayerNorm outputs in FP32 where the GEMMs keep
    their low-precision copies (see docs/memory.md).

    Per block: two LayerNorm outputs (C each), qkv (3C), attention scores and probabilities (n_head x T
    each, the full T x T rows), attention output (C), MLP hidden before and after GELU (4C each); then the
    final LayerNorm output (C) and logits (V). Tensors produced by ops the policy keeps in FP32 count 4
    bytes, the others the width of the policy's activation format (FP8 GEMMs also keep their FP8 inputs:
    not counted separately here).
    """
    pol = get_policy(policy)
    a = pol.activations.width / 8
    f32 = 4.0
    C, H, T, V = cfg.n_embd, cfg.n_head, cfg.block_size, cfg.vocab_size
    ln = f32 if "layernorm" in pol.fp32_ops else a
    sm = f32 if "softmax" in pol.fp32_ops else a
    per_block = 2 * C * ln + 3 * C * a + H * T * a + H * T * sm + C * a + 4 * C * a + 4 * C * a
    return float(cfg.n_layer * per_block + C * ln + V * a)


def _metrics(h: History, wall: float, pol: Any, cfg: TrainConfig) -> dict[str, Any]:
    s = h.summary()
    assert cfg.model is not None  # DemoSettings.train_config always sizes the model itself
    return {
        "final_loss": s["final_loss"],
        "final_train_loss": s["final_train_loss"],
        "grad_underflow_fraction": s["grad_underflow_fraction"],
        "grad_subnormal_fraction": s["grad_subnormal_fraction"],
        "lost_update_fraction": s["lost_update_fraction"],
        "skipped_steps": s["skipped_steps"],
        "final_loss_scale": s["final_loss_scale"],
        "steps": s["steps"],
        "wall_s": wall,
        "ms_per_step": 1000.0 * wall / max(s["steps"], 1),
        "policy": pol.describe(),
        "memory_bytes_per_param": pol.memory_ledger(cfg.optimizer),
        "activation_bytes_per_token": activation_bytes_per_token(pol, cfg.model),
    }


@ieee_mode
def run_demo(out: str, *, quick: bool = False, steps: int | None = None, policies: Sequence[str] | None = None,
             seed: int = 0, progress: bool | None = None, log: Callable[[str], None] | None = print,
             settings: DemoSettings | None = None, seeds: int = 1, workers: int | None = None,
             scheduler: str | None = None, gemm: str | None = None) -> dict[str, Any]:
    """Run the demo into folder ``out``; returns the metrics dict written to ``out/metrics.json``.

    ``seeds > 1`` (or any ``workers``/``scheduler``): every policy is trained with seeds ``seed .. seed +
    seeds - 1`` as a sweep (:func:`fpsim.train.run_sweep`: on Dask workers, each cell's result in
    ``out/cells/``, resumable); seed ``seed``'s runs feed the report as in a one-seed demo, and the report
    gains the mean and spread over seeds of every lesson and whether each is beyond seed noise
    (``result["seed_spread"]``, see :func:`fpsim.train.sweep.seed_spread`).

    ``out`` is created and proven writable before any training (``ValueError`` otherwise, see
    :func:`check_output_dir`). ``metrics.json`` and ``histories.json`` are rewritten (atomically) as each
    policy finishes, with ``"complete": false`` until the last one, so an interrupted run keeps the policies it
    finished; the report and plots come at the end.

    ``gemm``: a device name (``"h100"``): every policy that admits it is trained a second time with every GEMM
    bit-exact under that device's Tensor Core model, and the report states the cost (time per step against
    the fast step, same run) and the loss gap (:mod:`fpsim.train.bitexact`; ``result["bit_exact_gemm"]``).
    One seed (``ValueError`` with a sweep). None (the default) runs nothing more.
    """
    t_start = time.perf_counter()
    st = settings if settings is not None else demo_settings(quick, steps, seed)
    # validate every name before spending time, and key results by the canonical name (the one name rule)
    names = list(dict.fromkeys(get_policy(n).name for n in (policies or DEFAULT_POLICIES)))
    if gemm is not None:
        from .bitexact import bit_exact_plan, gemm_device

        gemm = gemm_device(gemm)
        bit_exact_plan(names, gemm)  # some policy must admit it: refused before any training
        if seeds != 1 or workers is not None or scheduler is not None:
            raise ValueError(f"gemm={gemm!r}: the bit-exact GEMM comparison runs one seed in this process; "
                             "leave seeds=1 and workers/scheduler unset")
    out = check_output_dir(out)  # and the destination: minutes of training must not end in "cannot write"
    cfg = st.train_config()
    assert cfg.model is not None  # DemoSettings.train_config always sizes the model itself
    say = log or (lambda s: None)
    n_params = count_params(init_params(cfg.model, seed=cfg.seed))
    say(f"fpsim demo: task {st.task} {st.task_kwargs}, GPT {cfg.model.n_layer}x{cfg.model.n_embd} "
        f"({n_params} parameters), {cfg.steps} steps of {cfg.batch_size} sequences, policies: {', '.join(names)}")
    histories: dict[str, History] = {}
    metrics: dict[str, Any] = {}
    trained: dict[str, Trainer] = {}
    swept = None  # the multi-seed sweep (fpsim.train.sweep): every (policy, seed) cell, run before the report
    if seeds != 1 or workers is not None or scheduler is not None:
        from .sweep import demo_sweep

        swept = demo_sweep(out, st, names, seeds=seeds, workers=workers, scheduler=scheduler, progress=progress,
                           log=say)
    def is_ptq(n: str) -> bool:
        q = get_policy(n).quant
        return q is not None and q.mode == "ptq"

    order = sorted(names, key=is_ptq)
    for name in order:
        pol = get_policy(name)
        t0 = time.perf_counter()
        if swept is not None:  # trained by the sweep; this seed's run is the report's
            from .sweep import history_of

            h = history_of(swept["cells"][name][st.seed])
            wall = float(swept["cells"][name][st.seed]["run_info"]["wall_s"])
            note = f" (seed {st.seed}; {swept['n_seeds']} seeds swept)"
        elif pol.quant is not None and pol.quant.mode == "ptq" and "fp32" in trained:
            base = trained["fp32"]
            tr = Trainer(pol, cfg)
            tr.store.weights = {k: v.copy() for k, v in base.store.weights.items()}
            tr.history = History(json.loads(json.dumps(base.history.to_dict())))
            tr.history.data["eval_step"].pop()
            tr.history.data["eval_loss"].pop()
            tr.step_count = base.step_count
            tr.finish()
            wall = float(metrics["fp32"]["wall_s"]) + (time.perf_counter() - t0)
            note = " (training reused from fp32)"
            trained[name], h = tr, tr.history
        else:
            tr = Trainer(pol, cfg)
            tr.run(progress=progress, label=name)
            wall = time.perf_counter() - t0
            note = ""
            trained[name], h = tr, tr.history
        histories[name] = h
        metrics[name] = _metrics(h, wall, pol, cfg)
        if pol.quant is not None and pol.quant.mode == "ptq":
            metrics[name]["float_loss_before_quantization"] = h.data.get("float_eval_loss")
        _save_progress(out, st, quick, n_params, cfg, metrics, histories)  # a later crash keeps this policy
        m = metrics[name]
        say(f"  {name:16s} loss {m['final_loss']:.4f}  underflow {100 * m['grad_underflow_fraction']:6.2f}%  "
            f"lost updates {100 * _nz(m['lost_update_fraction']):6.2f}%  skipped {m['skipped_steps']:3d}  "
            f"{m['wall_s']:6.1f} s{note}")
    bit_exact = None
    if gemm is not None:  # the lesson's policies again, every GEMM through the device model
        from .bitexact import run_bit_exact

        say(f"bit-exact {gemm} GEMMs:")
        bit_exact = run_bit_exact(names, cfg, gemm, metrics, histories, progress=progress, log=say)
    ordered = {n: metrics[n] for n in names}
    _steps_to_target(histories, ordered)
    for n in names:  # measured: one real step from the initial weights (fpsim.train.measure_step)
        led = measure_step(n, cfg)
        ordered[n]["activation_bytes_per_token_measured"] = led.device_bytes_per_token
    ledger = {n: dict(ordered[n]["memory_bytes_per_param"],
                      activation_bytes_per_token=ordered[n]["activation_bytes_per_token"],
                      activation_bytes_per_token_measured=ordered[n]["activation_bytes_per_token_measured"])
              for n in names}
    ck_policy = "bf16-mixed" if "bf16-mixed" in names else names[0]
    checkpointing = checkpoint_table(ck_policy, cfg, repeat=3)
    result: dict[str, Any] = {
        "fpsim_demo_version": 1,
        "settings": {**{k: getattr(st, k) for k in st.__dataclass_fields__}, "quick": quick,
                     "n_params": n_params, "model": cfg.model.as_dict()},
        "policies": ordered,
        "memory_ledger": ledger,
        "checkpointing": checkpointing,
        "machine": {"python": platform.python_version(), "numpy": np.__version__, "cpus": os.cpu_count()},
    }
    if bit_exact is not None:
        result["bit_exact_gemm"] = bit_exact
    if swept is not None:
        result["seed_spread"] = swept["spread"]
        result["sweep"] = {k: swept[k] for k in ("seeds", "n_seeds", "cells_dir", "where")}
    for n in names:  # the top-level per-policy keys the issue names, for easy access
        result[n] = {k: ordered[n][k] for k in ("final_loss", "grad_underflow_fraction", "lost_update_fraction",
                                                 "skipped_steps", "steps", "wall_s")}
    say("memory ledger (bytes per parameter; activation bytes per token: estimate, measured):")
    say(f"  {'policy':16s} {'weights':>7s} {'grads':>6s} {'master':>6s} {'optim':>6s} {'total':>6s} {'act/token':>9s}"
        f" {'measured':>9s}")
    for n in names:
        d = ledger[n]
        say(f"  {n:16s} {d['weights']:7g} {d['grads']:6g} {d['master']:6g} {d['optimizer_state']:6g} "
            f"{d['total']:6g} {d['activation_bytes_per_token']:9g} {d['activation_bytes_per_token_measured']:9.1f}")
    say(f"checkpointing ledger ({checkpointing['policy']}, measured; one batch of "
        f"{checkpointing['batch']} x {checkpointing['seq_len']} tokens):")
    for r in checkpointing["rows"]:
        say(f"  {r['mode']:13s} peak {r['peak_device_bytes'] / 2**20:7.3f} MiB ({r['memory_ratio']:5.3f}x)  "
            f"GEMM {r['flops'] / 1e6:7.1f} MFLOP ({r['flops_ratio']:5.3f}x)  {1e3 * r['seconds']:6.1f} ms "
            f"({r['time_ratio']:4.2f}x)")
    result["complete"] = True
    result["total_wall_s"] = time.perf_counter() - t_start
    _write_json(os.path.join(out, "metrics.json"), result)  # before the plots: a plotting failure loses nothing
    _write_json(os.path.join(out, "histories.json"), {n: histories[n].to_dict() for n in names})
    plots: dict[str, str] = {}
    try:
        from .report import write_plots

        plots = write_plots(out, histories, ordered, checkpointing=checkpointing)
    except ImportError as e:  # matplotlib missing: the report says so
        say(f"  (no plots: {e})")
    result["total_wall_s"] = time.perf_counter() - t_start
    _write_json(os.path.join(out, "metrics.json"), result)
    _write_text(os.path.join(out, "report.md"), _report(result, plots, st))
    say(f"wrote {os.path.join(out, 'report.md')}, metrics.json, histories.json and {len(plots)} plots "
        f"in {result['total_wall_s']:.1f} s")
    return result


def _smoothed_loss(h: History, k: int = 10) -> np.ndarray:
    y = np.asarray(h["loss"], dtype=np.float64)
    if y.size < k:
        return y
    c = np.cumsum(np.insert(y, 0, 0.0))
    return np.concatenate([np.full(k - 1, np.inf), (c[k:] - c[:-k]) / k])


def _steps_to_target(histories: dict[str, History], metrics: dict[str, Any]) -> None:
    """Add ``steps_to_target``: the first step at which each run's training loss (mean of 10 steps) is at
    or below the loss the fp32 run had half-way (``target_loss``); None if never. A measure of speed."""
    if "fp32" not in histories or len(histories["fp32"]) < 20:
        return
    ref = _smoothed_loss(histories["fp32"])
    target = float(ref[len(ref) // 2])
    for n, h in histories.items():
        sm = _smoothed_loss(h)
        hit = np.nonzero(sm <= target)[0]
        metrics[n]["target_loss"] = target
        metrics[n]["steps_to_target"] = int(hit[0]) if hit.size else None


def _nz(v: float) -> float:
    return 0.0 if v is None or not math.isfinite(v) else v


def _save_progress(out: str, st: DemoSettings, quick: bool, n_params: int, cfg: TrainConfig,
                   metrics: dict[str, Any], histories: dict[str, History]) -> None:
    """metrics.json and histories.json for the policies finished so far (``"complete": false``)."""
    assert cfg.model is not None
    partial: dict[str, Any] = {
        "fpsim_demo_version": 1,
        "complete": False,
        "settings": {**{k: getattr(st, k) for k in st.__dataclass_fields__}, "quick": quick,
                     "n_params": n_params, "model": cfg.model.as_dict()},
        "policies": dict(metrics),
        "machine": {"python": platform.python_version(), "numpy": np.__version__, "cpus": os.cpu_count()},
    }
    _write_json(os.path.join(out, "metrics.json"), partial)
    _write_json(os.path.join(out, "histories.json"), {n: h.to_dict() for n, h in histories.items()})


def _atomic(path: str, data: str) -> None:
    """Write ``path`` whole or not at all (fpsim.train._files: locked temporary, fsync, rename)."""
    atomic_write(path, lambda f: f.write(data.encode("utf-8")), prefix=_TMP_PREFIX, mode=0o644)


def _clean(o: Any) -> Any:
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {str(k): _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    if isinstance(o, np.generic):
        return _clean(o.item())
    return o


def _write_json(path: str, obj: Any) -> None:
    _atomic(path, json.dumps(_clean(obj), indent=1))


def _write_text(path: str, s: str) -> None:
    _atomic(path, s)


def _pct(v: Any) -> str:
    return "n/a" if v is None or not math.isfinite(v) else f"{100 * v:.2f}%"


def _rel(a: float, b: float) -> str:
    return f"{100 * (a - b) / b:+.1f}%"


def _report(res: dict[str, Any], plots: dict[str, str], st: DemoSettings) -> str:
    P = res["policies"]
    s = res["settings"]
    m = s["model"]
    L: list[str] = []
    add = L.append
    add("# fpsim demo: mixed-precision training, emulated bit for bit\n")
    add(f"Task **{st.task}** ({st.task_kwargs}), a GPT with {m['n_layer']} layers, width {m['n_embd']}, "
        f"{m['n_head']} heads, {s['n_params']} parameters (tied embeddings); AdamW, peak learning rate {st.lr}, "
        f"{st.warmup} warm-up steps then cosine decay; {st.steps} steps of {st.batch_size} sequences; seed "
        f"{st.seed}. Every policy trains the same model on the same batches from the same initial weights.\n")
    n_glob = st.micro_batches * st.batch_size * int(st.task_kwargs.get("length", 1))
    add(f"**Loss reduction.** Each step's batch is one of {st.micro_batches} micro-batches of a global batch of "
        f"{n_glob:,} target tokens, as with data parallelism or gradient accumulation: its summed loss is divided "
        "by the *global* token count, so the gradients the backward pass produces (and casts into the gradient "
        f"format) are {st.micro_batches} times smaller than a per-micro-batch mean would give (as in gradient "
        "accumulation over the whole global batch; frameworks that average over data-parallel ranks in the "
        "all-reduce normalize each rank's gradient by its own tokens only). That is what makes per-token "
        "gradients tiny in real large-batch training, and where FP16 gradients underflow. After "
        f"unscaling, the optimizer receives the gradient multiplied back by {st.micro_batches} (the sum over the "
        "global batch, estimated from this micro-batch); the round trip is a power of two, exact in FP32, so "
        "the FP32 run is bit-identical to plain mean-loss training: only the narrow formats feel the small "
        "gradients.\n")
    spread = res.get("seed_spread")  # a multi-seed demo (fpsim.train.sweep): two more columns, one more section
    add(_why(st) if not spread else _why(st).replace(
        "One seed. ", f"The table's runs are those of seed {st.seed}; its last two columns and the section *Across "
        f"seeds* below cover all {spread['n_seeds']} seeds. "))
    from .report import seed_columns

    xh, xs = seed_columns(spread, None)
    add("| policy | final loss | vs fp32 | steps to target | grad underflow | lost updates | skipped steps | "
        f"steps | wall s |{xh}")
    add("|---|---|---|---|---|---|---|---|---|" + xs)
    ref = P.get("fp32", {}).get("final_loss")
    for n, d in P.items():
        stt = d.get("steps_to_target", "-")
        add(f"| {n} | {d['final_loss']:.4f} | {_rel(d['final_loss'], ref) if ref else '-'} | "
            f"{'never' if stt is None else stt} | "
            f"{_pct(d['grad_underflow_fraction'])} | {_pct(d['lost_update_fraction'])} | {d['skipped_steps']} | "
            f"{d['steps']} | {d['wall_s']:.1f} |{seed_columns(spread, n)[0]}")
    tl = next((d.get("target_loss") for d in P.values() if d.get("target_loss") is not None), None)
    if tl is not None:
        add(f"\n*steps to target*: first step at which the training loss (mean of 10 steps) reaches {tl:.4f}, the "
            "loss the fp32 run had half-way: how fast each policy trains (for PTQ, that of its FP32 training).")
    add("\n*final loss*: mean cross-entropy on a fixed held-out set after the last step, computed in the "
        "policy's own forward precision (quantized for QAT/PTQ). *grad underflow*: of the gradient values "
        "that were nonzero before a cast into the gradient format, the share that became 0 (mean over "
        "steps). *lost updates*: of the nonzero weight updates, the share that left the stored weight "
        "unchanged (mean over steps).\n")
    add(_findings(P))
    from .report import lesson_table

    add(lesson_table(P, spread, seed=st.seed))  # every lesson with its "beyond seed noise?" column
    if res.get("bit_exact_gemm"):
        from .bitexact import bit_exact_section

        add(bit_exact_section(res["bit_exact_gemm"]))
    if spread:
        from .report import seed_section

        add(seed_section(spread, res.get("sweep", {})))
    figs = [("loss_curves", "Loss curves"), ("grad_histogram", "Gradient magnitudes against the formats"),
            ("underflow", "Underflow over time"), ("loss_scale", "Loss scale"),
            ("lost_updates", "Lost updates without master weights"), ("qat_ptq", "QAT vs PTQ")]
    for key, title in figs:
        if key in plots:
            add(f"## {title}\n\n![{title}]({plots[key]})\n")
            add(_caption(key, P) + "\n")
    add("## Memory ledger\n")
    add("Bytes per parameter (AdamW: two moments) and activation bytes kept per token for the backward pass.\n")
    add("| policy | weights | grads | master | optimizer state | total / param | activations / token (estimate) "
        "| measured |")
    add("|---|---|---|---|---|---|---|---|")
    for n, d in res["memory_ledger"].items():
        meas = d.get("activation_bytes_per_token_measured")
        add(f"| {n} | {d['weights']:g} | {d['grads']:g} | {d['master']:g} | {d['optimizer_state']:g} | "
            f"{d['total']:g} | {d['activation_bytes_per_token']:g} | {'-' if meas is None else f'{meas:.1f}'} |")
    add("\n*activations / token*: the old estimate (`fpsim.train.demo.activation_bytes_per_token`); *measured*: "
        "the peak bytes of the arrays one real training step holds for its backward pass, each counted at the "
        "width of the format its values were rounded to (`fpsim.train.measure_step`, `device_bytes_per_token`).")
    add("\nWeights: the low-precision copy the GEMMs use; master: the FP32 copy the optimizer updates "
        "(none when the weights themselves are FP32 or when there is no master); fp8-hybrid keeps BF16 "
        "weights between steps and casts to FP8 per GEMM. QAT/PTQ count training memory (FP32); the "
        "deployed int8/int4 weights would take 1 or 0.5 bytes.\n")
    if res.get("checkpointing"):
        add(_checkpointing_section(res["checkpointing"], plots.get("checkpointing")))
    add("## Policies\n")
    for n, d in P.items():
        p = d["policy"]
        add(f"- **{n}**: {p['description']} (params {p['params']}, activations {p['activations']}, gradients "
            f"{p['gradients']}, master {p['master']}, loss scale {p['loss_scale']}).")
    add(f"\nTotal wall time {res['total_wall_s']:.1f} s.")
    return "\n".join(L) + "\n"


def _why(st: DemoSettings) -> str:
    return (
        "**Why these settings.** The task (sort 10 symbols out of 16) needs content-based attention, so the "
        "loss keeps falling for the whole run and the small late gradients still matter. AdamW's updates are "
        f"at most about the learning rate in size; the cosine schedule takes it from {st.lr:g} down to "
        f"{st.lr / 10:g}, below half an FP16 ulp of 0.5..1 (2^-12 = 0.00024): without an FP32 master copy the "
        "LayerNorm gains, which sit near 1, and every weight above 0.5 in magnitude then cannot move at all, "
        "and smaller weights lose the updates Adam makes smaller than the learning rate. Training from scratch at "
        "these learning rates, the surviving updates largely make up for the lost ones (a loss gap of about 1% "
        "at --quick settings); fine-tuning a pretrained model at a small learning rate (1e-4) is the regime where the "
        "missing master copy costs loss: notebook 6 measures +0.064 held-out loss for fp16-no-master vs "
        "fp16-mixed (95% paired interval [+0.052, +0.076], 3 seeds, every seed), with two thirds of the updates "
        "lost by the end. The QAT policies follow the usual recipe: FP32 training for the first half of the steps, then fine-tuning with fake "
        "quantization; PTQ quantizes the FP32 model after all the steps, so both see the same number of steps. "
        "One seed. Runs whose rounding differs from FP32's follow slightly different trajectories, and on this "
        "task (whose loss falls in sudden drops that come a few steps earlier or later) their loss at a given "
        "step can differ from FP32's by several percent for that reason alone: read differences of a few "
        "percent (fp16-no-master, fp8-hybrid, int8) as indications and the measured counts behind them (lost "
        "updates, underflow, skipped steps) as the robust part. Whether an effect holds beyond that noise is "
        "measured, not assumed: the full demo trains 3 seeds by default and `fpsim demo --seeds N` any number; "
        "the lesson table states, lesson by lesson, whether the difference is beyond seed noise (with 3 seeds at "
        "--quick settings, no loss scaling and no FP32 master were). QAT vs PTQ: at --quick settings INT8 and "
        "INT4 QAT vs PTQ are within seed noise (3 seeds; the lesson table gives this run's own verdict, and at "
        "the full demo's 400 steps INT4 QAT wins); QAT beats PTQ on every seed at 3 and 2 bits, "
        "beyond seed noise at 2 bits only (held-out loss QAT - PTQ -0.42, 95% paired interval [-0.49, -0.35]; "
        "at 3 bits -0.052, [-0.122, +0.019], within seed noise: seeds 0-2 at --quick settings, measured in "
        "notebook 8, which trains the 3- and 2-bit policies). The *wall s* of a PTQ row includes the "
        "FP32 training it reuses.\n")


def _get(P: dict[str, Any], n: str, k: str) -> float | None:
    d = P.get(n)
    return None if d is None else d.get(k)


def _nan_if_none(v: float | None) -> float:
    """A missing figure prints as n/a; a measured 0.0 stays 0 (``v or nan`` turned 0.0 into n/a)."""
    return float("nan") if v is None else float(v)


def _findings(P: dict[str, Any]) -> str:
    out = ["## What the runs show\n"]
    ref = _get(P, "fp32", "final_loss")
    if ref is None:
        return "\n".join(out + ["(fp32 was not run, so there is no reference loss.)\n"])

    def cmp(n: str) -> str:
        v = _get(P, n, "final_loss")
        return f"{v:.4f} ({_rel(v, ref)} vs fp32 {ref:.4f})" if v is not None else "n/a"

    for n in ("bf16-mixed", "fp16-mixed"):
        if n in P:
            v = P[n]["final_loss"]
            ok = "within a few percent of FP32" if abs(v - ref) <= 0.05 * ref else "NOT within 5% of FP32"
            how = "FP32 master weights" + ("" if n == "bf16-mixed" else " and dynamic loss scaling")
            out.append(f"- **{n}** reaches {cmp(n)}: {ok}, with {how}.")
    if "fp16-no-scaling" in P:
        d = P["fp16-no-scaling"]
        mixed = _pct(_nan_if_none(_get(P, "fp16-mixed", "grad_underflow_fraction")))
        s_ns, s_32 = d.get("steps_to_target"), P["fp32"].get("steps_to_target")
        slow = ""
        if s_32 is not None:
            slow = (f" It needs {'more than ' + str(d['steps']) if s_ns is None else s_ns} steps to reach the "
                    f"loss fp32 reaches in {s_32}")
            slow += ": underflow slows training." if s_ns is None or s_ns > s_32 else "."
        verdict = ("it trains worse" if d["final_loss"] > ref else
                   "the final loss did not suffer (in this small model the run catches up once the loss is low; "
                   "see the curves)")
        out.append(f"- **fp16-no-scaling** loses {_pct(d['grad_underflow_fraction'])} of its nonzero gradient values "
                   f"to underflow (fp16-mixed: {mixed}) and ends at {cmp('fp16-no-scaling')}: {verdict}.{slow}")
    if "fp16-no-master" in P:
        d = P["fp16-no-master"]
        out.append(f"- **fp16-no-master** loses {_pct(d['lost_update_fraction'])} of its weight updates to rounding "
                   f"(fp16-mixed with an FP32 master: {_pct(_nan_if_none(_get(P, 'fp16-mixed', 'lost_update_fraction')))}) "
                   f"and ends at {cmp('fp16-no-master')}.")
    if "fp16-static" in P:
        out.append(f"- **fp16-static** (a fixed scale of 1024) ends at {cmp('fp16-static')} with "
                   f"{_pct(P['fp16-static']['grad_underflow_fraction'])} underflow.")
    if "fp16-fast-scaler" in P:
        d = P["fp16-fast-scaler"]
        fs = d["final_loss_scale"]
        fs_txt = f"2^{math.log2(fs):g}" if fs > 0 and math.log2(fs).is_integer() else f"{fs:g}"
        if d["skipped_steps"]:
            out.append(f"- **fp16-fast-scaler** (dynamic, growth interval 8) climbs from 2^16 to the overflow boundary, "
                       f"skipped {d['skipped_steps']} steps on overflow, ends with a scale of {fs_txt} and reaches "
                       f"{cmp('fp16-fast-scaler')}: each skipped step is a lost update.")
        else:  # a short run can end before the scale reaches the overflow boundary: say so
            out.append(f"- **fp16-fast-scaler** (dynamic, growth interval 8) grows its scale from 2^16 to {fs_txt} "
                       f"without meeting an overflow in {d['steps']} steps (no skipped step; a longer run reaches "
                       f"the boundary and backs off) and reaches {cmp('fp16-fast-scaler')}.")
    if "fp8-hybrid" in P:
        out.append(f"- **fp8-hybrid** (E4M3 forward, E5M2 gradients, delayed per-tensor scaling) trains to "
                   f"{cmp('fp8-hybrid')}.")
    for b in (8, 4):
        q, p = _get(P, f"int{b}-qat", "final_loss"), _get(P, f"int{b}-ptq", "final_loss")
        if q is not None and p is not None:
            out.append(f"- **int{b}**: QAT {q:.4f} vs PTQ {p:.4f} (fp32 {ref:.4f}): "
                       f"{'QAT beats PTQ' if q < p else 'PTQ is not worse than QAT here'}.")
    return "\n".join(out) + "\n"


def _caption(key: str, P: dict[str, Any]) -> str:
    if key == "loss_curves":
        return ("Training loss per policy (smoothed). The runs share data and initial weights, so differences "
                "come from the formats alone.")
    if key == "grad_histogram":
        return ("log2 of the magnitudes of the activation gradients entering the backward GEMMs, from the FP32 "
                "run (true values). Everything left of the red band's edge rounds to zero in FP16; the orange band "
                "is FP16's subnormal range, where precision is lost bit by bit; the bars at the top are FP8's "
                "ranges before scaling. The blue copy is shifted by the typical dynamic loss scale of "
                "fp16-mixed: multiplying the loss moves the whole distribution into FP16's normal range, which "
                "is all that loss scaling does (Micikevicius et al. 2018).")
    if key == "underflow":
        return ("Share of nonzero gradient values that became zero when cast into each policy's gradient format. "
                "Without loss scaling a large share is lost from the start and it grows as training converges and "
                "gradients shrink; BF16 has FP32's exponent range and flushes almost nothing. FP8's E5M2 gradients "
                "start with a scale of 1 (TransformerEngine's initial value: no amax history yet), so the first "
                "steps lose most gradient values; from then on the delayed per-tensor scales (448/amax, 57344/amax) "
                "keep them in range.")
    if key == "loss_scale":
        sk = ", ".join(f"{n}: {P[n]['skipped_steps']}" for n in ("fp16-mixed", "fp16-fast-scaler") if n in P)
        return ("The dynamic scaler is torch GradScaler's algorithm, bit for bit: it halves the scale and skips "
                "the step on an overflow, and doubles it after `growth_interval` clean steps. With torch's default "
                "interval of 2000 (fp16-mixed) the scale stays at 2^16 for a run this short; fp16-fast-scaler "
                "(interval 8) climbs until the scaled gradients overflow FP16 and then oscillates just below the "
                f"boundary (skipped steps: {sk}). The lower panel shows the largest scaled gradient of each step "
                "against FP16's maximum: the gap to the dashed line is the headroom the scale leaves; the static "
                "scale of 1024 sits far lower, which is why it still loses some gradients to underflow.")

    if key == "lost_updates":
        return ("Without an FP32 master copy, an update smaller than half an ulp of its weight leaves the FP16 "
                "weight unchanged (1 + 1e-4 == 1 in FP16). LayerNorm gains near 1 and larger weights lose most as "
                "the learning rate decays. With a master copy the FP32 weights absorb every update.")
    if key == "qat_ptq":
        return ("PTQ quantizes the trained FP32 model (weights per channel, activations per tensor after "
                "calibration on a few batches); QAT trains with the same fake quantization in the loop "
                "(straight-through gradients), so the weights adapt to the grid. Whether the gap at 8 and 4 bits is "
                "beyond seed noise is in the lesson table above (at --quick settings, 3 seeds: within it at both); "
                "at 3 and 2 bits QAT wins on every seed, beyond seed noise at 2 bits (notebook 8 measures both over "
                "3 seeds).")
    return ""


def _checkpointing_section(ck: dict[str, Any], plot: str | None = None) -> str:
    """The report's checkpointing ledger: measured peak activation bytes, GEMM FLOPs and time per mode."""
    L: list[str] = []
    add = L.append
    m = ck["model"]
    add("## Checkpointing ledger (measured)\n")
    add(f"One real training step (forward, backward, AdamW update) of the demo model under **{ck['policy']}** "
        f"per mode, on a batch of {ck['batch']} x {ck['seq_len']} tokens, from the same initial weights. *peak*: "
        "the largest total, over the step, of the arrays held for the backward pass (each buffer once, "
        "parameters and weight copies excluded), counted at the width of the format their values were "
        "rounded to; *carrier*: the same arrays as NumPy holds them (fpsim carries 16-bit values in float32). "
        "GEMM FLOPs are counted as the GEMMs run (2·M·N·K each); time is the median of 3 steps. Gradients are "
        "bit-identical in every mode (tests/test_checkpointing.py).\n")
    add("| mode | peak (device) | vs none | carrier | GEMM MFLOP | vs none | recomputed MFLOP | ms / step | vs none "
        "| peak at |")
    add("|---|---|---|---|---|---|---|---|---|---|")
    for r in ck["rows"]:
        add(f"| {r['mode']} | {r['peak_device_bytes']:,} | {r['memory_ratio']:.3f} | {r['peak_bytes']:,} | "
            f"{r['flops'] / 1e6:.1f} | {r['flops_ratio']:.3f} | {r['flops_by_phase']['recompute'] / 1e6:.1f} | "
            f"{1e3 * r['seconds']:.1f} | {r['time_ratio']:.2f} | {r['peak_device_event']} |")
    if plot:
        add(f"\n![Checkpointing ledger]({plot})\n")
        add("Peak activation bytes per mode, by kind of saved tensor (at the device peak), with the GEMM FLOPs "
            "relative to no checkpointing. *recompute_input*: what checkpointing keeps instead (block inputs; "
            "q, k, v of the attention core for selective).")
    rows = {r["mode"]: r for r in ck["rows"]}
    if "blocks" in rows:
        b = rows["blocks"]
        add(f"\n**Against the rule of thumb** (\"~70% less activation memory for ~30% more compute\"): full "
            f"recomputation (`blocks`) saves {100 * (1 - b['memory_ratio']):.0f}% of the peak for "
            f"{100 * (b['flops_ratio'] - 1):.0f}% more GEMM FLOPs. The FLOP cost is one extra forward pass of the "
            "blocks (the backward pass costs two forwards, so about +33%, less the lm_head, which is not "
            "recomputed). The saving is smaller than 70% because the peak comes while one block's recomputed "
            "cache exists beside every block's kept input: peak / none is about 1/L + input/block (L layers; "
            "the kept input is the FP32 residual stream), so a 2-layer model keeps about half, and deeper "
            "models save more. Time ratios of a single run on a shared machine are noisy; "
            "benchmarks/bench_recompute.py measures them with repeated interleaved rounds.")
    k = ck["korthikanti"]
    kp = k["per_layer_16bit"]
    meas = k["measured_h0_device_at_forward_peak"]
    if "none" in meas:
        add(f"\n**Against Korthikanti et al.** (per layer, 16-bit, s={ck['seq_len']}, b={ck['batch']}, "
            f"h={m['n_embd']}, a={m['n_head']}): 34·s·b·h + 5·a·s²·b = {kp['none']:,} bytes; measured "
            f"{meas['none']:,} bytes for block 0 ({meas['none'] / kp['none']:.2f}x). Selective recomputation drops "
            f"the 5·a·s²·b term ({kp['none'] - kp['selective']:,} bytes per layer in the formula, "
            f"{100 * (kp['none'] - kp['selective']) / kp['none']:.0f}% of it at this short sequence: the s² term "
            "matters when 5·a·s exceeds 34·h, i.e. for long sequences). The tiny GPT "
            "also keeps GELU's tanh (4 bytes x 4h per token), LayerNorm's x-hat and 1/std in FP32 instead of a "
            "16-bit input, the softmax output in FP32 beside its BF16 copy, and has no dropout masks: "
            "docs/memory.md reconciles the two term by term.")
    add("")
    return "\n".join(L) + "\n"
