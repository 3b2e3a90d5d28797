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
import re
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
from .report import _checkpoint_mode_label

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
        mode = str(r["mode"])
        mode = _checkpoint_mode_label(mode) if mode.isdigit() else mode  # an integer k: "every k-th block"
        say(f"  {mode:16s} peak {r['peak_device_bytes'] / 2**20:7.3f} MiB "
            f"({r['memory_ratio']:5.3f}x)  "
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
    _write_text(os.path.join(out, "report.md"), _report(result, plots, st, histories))
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


def _report(res: dict[str, Any], plots: dict[str, str], st: DemoSettings,
            histories: dict[str, Any] | None = None) -> str:
    P = res["policies"]
    H = {n: (h.to_dict() if hasattr(h, "to_dict") else h) for n, h in (histories or {}).items()}
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
        "global batch, estimated from this micro-batch)" + (
            "; the round trip is a power of two, exact in FP32, so the FP32 run is bit-identical to plain "
            "mean-loss training: only the narrow formats feel the small gradients.\n"
            if st.micro_batches & (st.micro_batches - 1) == 0 else
            f"; {st.micro_batches} is not a power of two, so the round trip itself rounds in FP32.\n"))
    spread = res.get("seed_spread")  # a multi-seed demo (fpsim.train.sweep): two more columns, one more section
    add(_why(st, P, spread, H))
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
    add(_findings(P, H))
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
            add(_caption(key, P, H, spread) + "\n")
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
        seen = (f" In this run: {d['skipped_steps']} skipped steps, final scale {_p2(d['final_loss_scale'])}."
                if p["loss_scale"] == "dynamic" else "")  # the description: what it is for; this: what it did
        add(f"- **{n}**: {p['description']} (params {p['params']}, activations {p['activations']}, gradients "
            f"{p['gradients']}, master {p['master']}, loss scale {p['loss_scale']}).{seen}")
    add(f"\nTotal wall time {res['total_wall_s']:.1f} s.")
    return "\n".join(L) + "\n"


def _p2(v: float) -> str:
    """A scale as 2^k when it is a power of two, else as a number."""
    if v > 0 and math.isfinite(v) and math.log2(v).is_integer():
        return f"2^{int(math.log2(v))}"
    return f"{v:g}"


def _series(h: Any, key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of a history series, NaN steps dropped."""
    y = np.asarray(h[key], dtype=float)
    st = np.asarray(h["step"], dtype=float)[: y.size]
    ok = np.isfinite(y)
    return st[ok], y[ok]


def _pct3(v: float) -> str:
    """A fraction as a percentage with 3 significant digits, never in e-notation (``<0.001%`` below that)."""
    p = 100 * v
    return "0%" if p == 0 else f"{p:.3g}%" if abs(p) >= 0.001 else ("<0.001%" if p > 0 else "> -0.001%")


def _trend(steps: Any, y: Any, fmt: Callable[[float], str] = _pct3) -> str:
    """How a per-step series moves, from its data: the means of its first and last tenth and its peak
    (a running mean over a tenth of the steps), as a phrase.

    >>> _trend(range(100), [0.1] * 100)
    'stays at about 10%'
    >>> _trend(range(100), [i / 100 for i in range(100)])
    'grows through the run, from 4.5% to 94.5%'
    >>> print(_trend(range(100), [min(i, 50 - i // 2) / 100 for i in range(100)]))
    rises from 4.5% to a peak of 31.8% around step 35, then falls to 3% by the end
    >>> print(_trend(range(100), [abs(i - 30) / 100 + 0.01 for i in range(100)]))
    falls from 26.5% to a low of 3.5% around step 30, then rises to 65.5% by the end
    """
    st = np.asarray(steps, dtype=float)
    v = np.asarray(y, dtype=float)
    ok = np.isfinite(v)
    st, v = st[: v.size][ok[: st.size]], v[ok]
    if v.size == 0:
        return "was not measured in this run"
    if not np.any(v):
        return "is 0 at every step"
    k = max(1, v.size // 10)
    sm = np.convolve(v, np.ones(k) / k, mode="valid")
    centre = st[k // 2: k // 2 + sm.size]
    first, last = float(sm[0]), float(sm[-1])
    i = int(np.argmax(sm))
    peak = float(sm[i])
    j = int(np.argmin(sm))
    low = float(sm[j])
    tol = 0.1 * max(abs(first), abs(last), abs(peak))
    up = min(peak - first, peak - last)  # a peak inside the run, above both ends
    down = min(first - low, last - low)  # a trough inside the run, below both ends
    if up > tol and up >= down:
        return (f"rises from {fmt(first)} to a peak of {fmt(peak)} around step {int(centre[i])}, then falls to "
                f"{fmt(last)} by the end")
    if down > tol:
        return (f"falls from {fmt(first)} to a low of {fmt(low)} around step {int(centre[j])}, then rises to "
                f"{fmt(last)} by the end")
    if last - first > tol:
        return f"grows through the run, from {fmt(first)} to {fmt(last)}"
    if first - last > tol:
        return f"falls through the run, from {fmt(first)} to {fmt(last)}"
    return f"stays at about {fmt(float(np.mean(v)))}"


def _scaler_facts(h: Any) -> dict[str, Any]:
    """What a run's loss scale did, from its history: initial, largest and final scale, skipped steps, the
    first skipped step, how often the scale was cut and grown, and the closest the largest scaled gradient
    came to FP16's maximum (log2 of the headroom, over the steps that did not overflow)."""
    s = np.asarray(h["loss_scale"], dtype=float)
    sk = np.asarray(h["skipped"], dtype=bool)
    amax = np.asarray(h["grad_amax"], dtype=float)
    steps = np.asarray(h["step"])
    d = np.diff(s)
    fin = np.isfinite(amax) & ~sk[: amax.size] & (amax > 0)
    head = float(np.log2(65504.0 / amax[fin].max())) if fin.any() else math.nan
    return {"init": float(s[0]), "peak": float(s.max()), "final": float(s[-1]), "skipped": int(sk.sum()),
            "first_skip": int(steps[sk][0]) if sk.any() else None, "cuts": int(np.sum(d < 0)),
            "growths": int(np.sum(d > 0)), "steps": int(s.size), "headroom_log2": head,
            "median_amax": float(np.median(amax[fin])) if fin.any() else math.nan}


def _scaler_sentence(name: str, h: Any, interval: Any) -> str:
    """One sentence, from the history, on what ``name``'s dynamic loss scale did in this run.

    >>> grow = {"step": [0, 1, 2, 3], "loss_scale": [2.0**16, 2.0**17, 2.0**18, 2.0**18],
    ...         "skipped": [False] * 4, "grad_amax": [1.0, 2.0, 4.0, 4.0]}
    >>> print(_scaler_sentence("s", grow, 1))  # doctest: +NORMALIZE_WHITESPACE
    s (growth interval 1) grew its scale from 2^16 to 2^18 and never overflowed: 0 skipped steps in 4 steps;
    its largest scaled gradient stayed 2^14.0 below FP16's maximum
    """
    f = _scaler_facts(h)
    gi = f"growth interval {interval}"
    if f["skipped"] == 0:
        moved = (f"grew its scale from {_p2(f['init'])} to {_p2(f['peak'])}" if f["peak"] > f["init"] else
                 f"kept its scale at {_p2(f['init'])}")
        room = ("" if not math.isfinite(f["headroom_log2"]) else
                f"; its largest scaled gradient stayed 2^{f['headroom_log2']:.1f} below FP16's maximum")
        return f"{name} ({gi}) {moved} and never overflowed: 0 skipped steps in {f['steps']} steps{room}"
    osc = ""
    if f["cuts"] >= 2 and f["growths"] >= 1:
        osc = (f"; after that it oscillated below the boundary (cut {f['cuts']} times, grown {f['growths']} "
               "times in all)")
    elif f["cuts"] == 1:
        osc = "; it was cut once"
    return (f"{name} ({gi}) went from {_p2(f['init'])} to a peak of {_p2(f['peak'])}, first overflowed at step "
            f"{f['first_skip']}, skipped {f['skipped']} steps in all and ended at {_p2(f['final'])}{osc}")


def _lesson_result(spread: Any, key: str) -> str:
    """A lesson's verdict over seeds from the sweep, or that this run did not measure it."""
    for r in (spread or {}).get("lessons", []):
        if r.get("key") == key and r.get("diff") is not None and r.get("ci") is not None:
            return (f"{r['diff']:+.4g} [{r['ci'][0]:+.4g}, {r['ci'][1]:+.4g}] over {r['n']} seeds: "
                    f"{r['verdict']}")
    return "not measured against seed noise in this run (one seed; `fpsim demo --seeds 3` measures it)"


def _why(st: DemoSettings, P: dict[str, Any] | None = None, spread: Any = None,
         histories: dict[str, Any] | None = None) -> str:
    """The report's *Why these settings* paragraph: every number in it comes from the settings or the run."""
    P = P or {}
    H = histories or {}
    kw = st.task_kwargs
    task = (f"sort {kw['length']} symbols out of {kw['n_symbols']}" if st.task == "sort" and
            {"length", "n_symbols"} <= set(kw) else f"{st.task} {kw}")
    L = [f"**Why these settings.** The task ({task}) needs content-based attention"]
    ref = H.get("fp32")
    if ref is not None and len(ref["loss"]) >= 20:
        y = np.asarray(ref["loss"], dtype=float)
        k = max(1, y.size // 10)
        L[-1] += (f"; in this run the fp32 training loss went from {y[:k].mean():.3f} (mean of the first {k} steps) "
                  f"to {y[-k:].mean():.3f} (last {k} steps).")
    else:
        L[-1] += "."
    half_ulp = 2.0 ** -12  # half an FP16 ulp of [0.5, 1)
    lr_series = ref["lr"] if ref is not None and len(ref["lr"]) else None
    if lr_series is not None:
        lr = np.asarray(lr_series, dtype=float)
        peak_i = int(np.argmax(lr))
        low = lr[peak_i:]
        below = np.nonzero(low < half_ulp)[0]
        L.append(f"AdamW's updates are at most about the learning rate in size; the schedule takes it from "
                 f"{lr.max():g} (step {peak_i}) down to {low.min():g} at the end, "
                 + (f"below half an FP16 ulp of 0.5..1 (2^-12 = {half_ulp:.6f}) from step {peak_i + int(below[0])} "
                    "on: without an FP32 master copy the LayerNorm gains, which sit near 1, and every weight above "
                    "0.5 in magnitude then cannot move by such an update."
                    if below.size else
                    f"never below half an FP16 ulp of 0.5..1 (2^-12 = {half_ulp:.6f})."))
    if "fp16-no-master" in P and "fp16-mixed" in P:
        a, b = P["fp16-no-master"], P["fp16-mixed"]
        L.append(f"In this run fp16-no-master lost {_pct(a['lost_update_fraction'])} of its weight updates (mean "
                 f"over steps) and ended at {a['final_loss']:.4f} against fp16-mixed's {b['final_loss']:.4f} "
                 f"({_rel(a['final_loss'], b['final_loss'])}); over seeds: {_lesson_result(spread, 'no-master-loss')}."
                 " Fine-tuning a pretrained model at a small learning rate is the regime where the missing master "
                 "copy is expected to cost more loss; notebook 7 measures that over seeds (not measured in this run).")
    qs = sorted({float(d["policy"]["quant"]["start"]) for d in P.values()
                 if (d.get("policy") or {}).get("quant") and d["policy"]["quant"].get("mode") == "qat"})
    if qs:
        L.append(f"The QAT policies train in FP32 for the first {', '.join(f'{100 * q:g}%' for q in qs)} of the "
                 "steps, then fine-tune with fake quantization; PTQ quantizes the FP32 model after all the steps, so "
                 "both see the same number of steps.")
    L.append("One seed." if not spread else
             f"The table's runs are those of seed {st.seed}; its last two columns and the section *Across seeds* "
             f"below cover all {spread['n_seeds']} seeds.")
    L.append("Runs whose rounding differs from FP32's follow slightly different trajectories, and on this task "
             "(whose loss falls in sudden drops that come a few steps earlier or later) their loss at a given step "
             "can differ from FP32's for that reason alone: read a single run's small differences as indications "
             "and the measured counts behind them (lost updates, underflow, skipped steps) as the robust part. "
             "Whether an effect holds beyond that noise is measured, not assumed: `fpsim demo --seeds N` trains N "
             "seeds, and the lesson table states, lesson by lesson, whether each difference is beyond seed noise"
             + (" (this run: one seed, so it cannot say)." if not spread else "."))
    L.append("QAT vs PTQ at 8 and 4 bits: " + "; ".join(
        f"int{b} {_lesson_result(spread, f'int{b}-qat-ptq')}" for b in (8, 4)
        if f"int{b}-qat" in P and f"int{b}-ptq" in P) + "." if any(f"int{b}-qat" in P for b in (8, 4)) else "")
    L.append("At 3 and 2 bits this demo trains nothing (notebook 10 does).")
    if "fp32" in P and any((d.get("policy") or {}).get("quant", {}) and d["policy"]["quant"].get("mode") == "ptq"
                           for d in P.values()) and not spread:
        L.append("The *wall s* of a PTQ row includes the FP32 training it reuses.")
    return " ".join(x for x in L if x) + "\n"


def _get(P: dict[str, Any], n: str, k: str) -> float | None:
    d = P.get(n)
    return None if d is None else d.get(k)


def _nan_if_none(v: float | None) -> float:
    """A missing figure prints as n/a; a measured 0.0 stays 0 (``v or nan`` turned 0.0 into n/a)."""
    return float("nan") if v is None else float(v)


def _findings(P: dict[str, Any], H: dict[str, Any] | None = None) -> str:
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
            ok = "within 5% of FP32" if abs(v - ref) <= 0.05 * ref else "NOT within 5% of FP32"
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
            slow += ": it trains slower on this seed." if s_ns is None or s_ns > s_32 else "."
        verdict = ("above fp32's on this seed" if d["final_loss"] > ref else "not above fp32's on this seed")
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
        gi = (d.get("policy") or {}).get("scaler_kwargs", {}).get("growth_interval", 2000)
        if H is not None and "fp16-fast-scaler" in H:  # what the scale did, from the run's history
            out.append(f"- **{_scaler_sentence('fp16-fast-scaler', H['fp16-fast-scaler'], gi)}**; it reaches "
                       f"{cmp('fp16-fast-scaler')}" + (": each skipped step is a lost update." if d["skipped_steps"]
                                                        else "."))
        elif d["skipped_steps"]:
            out.append(f"- **fp16-fast-scaler** (dynamic, growth interval {gi}) skipped {d['skipped_steps']} steps on "
                       f"overflow, ends with a scale of {fs_txt} and reaches {cmp('fp16-fast-scaler')}: each skipped "
                       "step is a lost update.")
        else:  # a short run can end before the scale reaches the overflow boundary: say so
            out.append(f"- **fp16-fast-scaler** (dynamic, growth interval {gi}) ends with a scale of {fs_txt} "
                       f"without meeting an overflow in {d['steps']} steps (no skipped step) and reaches "
                       f"{cmp('fp16-fast-scaler')}.")
    if "fp8-hybrid" in P:
        out.append(f"- **fp8-hybrid** (E4M3 forward, E5M2 gradients, delayed per-tensor scaling) trains to "
                   f"{cmp('fp8-hybrid')}.")
    for b in (8, 4):
        q, p = _get(P, f"int{b}-qat", "final_loss"), _get(P, f"int{b}-ptq", "final_loss")
        if q is not None and p is not None:
            out.append(f"- **int{b}**: QAT {q:.4f} vs PTQ {p:.4f} (fp32 {ref:.4f}): "
                       f"{'QAT below PTQ' if q < p else 'PTQ not above QAT'} on this seed (whether beyond seed "
                       "noise: the lesson table).")
    return "\n".join(out) + "\n"


def _caption(key: str, P: dict[str, Any], histories: dict[str, Any] | None = None,
             spread: Any = None) -> str:
    """The caption of figure ``key``: what the figure shows, and what this run's data say (every number and
    trend from ``P`` (the policies' metrics) and ``histories``; a claim the run has no data for says so)."""
    H = histories or {}
    if key == "loss_curves":
        same = [n for n in H if n != "fp32" and "fp32" in H and
                np.array_equal(np.asarray(H[n]["loss"], dtype=float), np.asarray(H["fp32"]["loss"], dtype=float))]
        txt = ("Top: training loss per policy (smoothed; dot: final held-out loss). Below: each policy's "
               "difference from fp32, each panel on its own scale, so runs that coincide in the top panel can be "
               "told apart. The runs share data and initial weights, so differences come from the formats alone.")
        if same:
            txt += (f" {', '.join(same)} trained exactly as fp32 did (identical training losses), so their panels "
                    "show only the held-out difference after quantization.")
        ref = _get(P, "fp32", "final_loss")
        if ref is not None:
            gaps = {n: d["final_loss"] - ref for n, d in P.items() if n != "fp32"}
            if gaps:
                w = max(gaps, key=lambda n: abs(gaps[n]))
                txt += f" Largest final held-out gap: {w}, {gaps[w]:+.4f} nats ({_rel(P[w]['final_loss'], ref)})."
        return txt
    if key == "grad_histogram":
        txt = ("log2 of the magnitudes of the activation gradients entering the backward GEMMs, from the FP32 "
               "run (true values). Everything left of the red band's edge rounds to zero in FP16; the orange band "
               "is FP16's subnormal range, where precision is lost bit by bit; the bars at the top are FP8's "
               "ranges before scaling.")
        h32, h16 = H.get("fp32"), H.get("fp16-mixed")
        if h32 is not None and h32["hist_step"] and h16 is not None and len(h16["loss_scale"]):
            ls = float(np.median(h16["loss_scale"]))
            c = np.asarray(h32["hist"]["grad_act"][-1], dtype=float)
            e = np.arange(int(h32["hist_lo"]), int(h32["hist_lo"]) + c.size)  # bin e holds |g| in [2^e, 2^(e+1))
            tot = max(c.sum(), 1.0)
            sh = math.log2(ls)

            def share(edge: float, shift: float) -> float:
                return float(c[e + shift < edge].sum() / tot)

            txt += (f" The blue copy is shifted by fp16-mixed's median loss scale ({_p2(ls)}). Of the nonzero "
                    f"values at step {h32['hist_step'][-1]}, {_pct(share(-14, 0))} lie below FP16's smallest "
                    f"normal (2^-14) and {_pct(share(-24, 0))} below its smallest subnormal (2^-24); after the "
                    f"scale, {_pct(share(-14, sh))} and {_pct(share(-24, sh))}: multiplying the loss moves the "
                    "distribution up, which is all that loss scaling does (Micikevicius et al. 2018).")
        return txt
    if key == "underflow":
        parts = ["Share of nonzero gradient values that became zero when cast into each policy's gradient format, "
               "per step (log axis; steps with none are not drawn)."]
        for n in H:
            if n.startswith(("fp16", "bf16")):
                st, y = _series(H[n], "grad_underflow_fraction")
                parts.append(f"{n}: the share {_trend(st, y)}.")
        if "fp8-hybrid" in H:
            st, y = _series(H["fp8-hybrid"], "grad_underflow_fraction")
            if y.size >= 2:
                later = float(np.mean(y[1:]))
                parts.append(f"fp8-hybrid's E5M2 gradients start with a scale of 1 (TransformerEngine's initial "
                           f"value: no amax history yet): it lost {_pct(float(y[0]))} at step {int(st[0])} and "
                           f"{_pct(later)} on average over the later steps"
                           + (", once the delayed per-tensor scales (57344/amax) were set." if later < y[0] else "."))
        return " ".join(parts)
    if key == "loss_scale":
        parts = ["The dynamic scaler is torch GradScaler's algorithm, bit for bit: it halves the scale and skips the "
               "step on an overflow, and doubles it after `growth_interval` clean steps."]
        for n in ("fp16-mixed", "fp16-fast-scaler"):
            if n in H and n in P:
                gi = (P[n].get("policy") or {}).get("scaler_kwargs", {}).get("growth_interval", 2000)
                parts.append(_scaler_sentence(n, H[n], gi) + ".")
        parts.append("The lower panel shows the largest scaled gradient of each step against FP16's maximum: the gap "
                   "to the dashed line is the headroom the scale leaves.")
        if "fp16-static" in H and "fp16-mixed" in H:
            fs, fm = _scaler_facts(H["fp16-static"]), _scaler_facts(H["fp16-mixed"])
            if math.isfinite(fs["median_amax"]) and math.isfinite(fm["median_amax"]):
                r = math.log2(fs["median_amax"] / fm["median_amax"])
                parts.append(f"fp16-static's fixed scale of {_p2(fs['init'])} puts its largest scaled gradient "
                           f"2^{abs(r):.1f} {'below' if r < 0 else 'above'} fp16-mixed's (medians over steps); it "
                           f"lost {_pct(P['fp16-static']['grad_underflow_fraction'])} of its gradient values to "
                           f"underflow, fp16-mixed {_pct(P['fp16-mixed']['grad_underflow_fraction'])}.")
        return " ".join(parts)
    if key == "lost_updates":
        parts = ["Without an FP32 master copy, an update smaller than half an ulp of its weight leaves the FP16 "
               "weight unchanged (1 + 1e-4 == 1 in FP16)."]
        h = H.get("fp16-no-master")
        if h is not None:
            st, y = _series(h, "lost_update_fraction")
            lr = np.asarray(h["lr"], dtype=float)
            parts.append(f"fp16-no-master's share {_trend(st, y)}, while the learning rate goes from its peak "
                       f"{lr.max():g} to {lr[-1]:g}.")
            bw = h.get("by_weight") or {}
            ln = [float(np.nanmean(v)) for k, v in bw.items() if re.search(r"ln\w*\.g$", k) and len(v)]
            rest = [float(np.nanmean(v)) for k, v in bw.items() if not re.search(r"ln\w*\.g$", k) and len(v)]
            if ln and rest:
                parts.append(f"By tensor (mean over steps): the LayerNorm gains, which sit near 1, lost "
                           f"{_pct(float(np.mean(ln)))} of their updates, the other tensors "
                           f"{_pct(float(np.mean(rest)))}.")
        for n in ("fp16-mixed", "bf16-mixed", "fp32"):
            if n in H:
                _, y = _series(H[n], "lost_update_fraction")
                who = "FP32 weights" if n == "fp32" else "FP32 master"
                parts.append(f"{n} ({who}): " + ("no update lost at any step." if y.size and not y.any() else
                                                 f"{100 * float(y.mean()):.2g}% lost (mean over steps)."
                                                 if y.size else "not measured."))
        return " ".join(parts)
    if key == "qat_ptq":
        txt = ("PTQ quantizes the trained FP32 model (weights per channel, activations per tensor after "
               "calibration on a few batches); QAT trains with the same fake quantization in the loop "
               "(straight-through gradients), so the weights adapt to the grid.")
        for b in (8, 4):
            q, p = _get(P, f"int{b}-qat", "final_loss"), _get(P, f"int{b}-ptq", "final_loss")
            if q is not None and p is not None:
                txt += (f" int{b}: QAT − PTQ {q - p:+.4f} on this seed; over seeds: "
                        f"{_lesson_result(spread, f'int{b}-qat-ptq')}.")
        return txt + " At 3 and 2 bits: not run by this demo (notebook 10 trains them)."
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
        "bit-identical in every mode (checked by tests/test_checkpointing.py, not by this run). An integer mode "
        "k recomputes every k-th block (blocks 0, k, 2k, ...).\n")
    add("| mode | peak (device) | vs none | carrier | GEMM MFLOP | vs none | recomputed MFLOP | ms / step | vs none "
        "| peak at |")
    add("|---|---|---|---|---|---|---|---|---|---|")
    for r in ck["rows"]:
        mode = str(r["mode"])  # the named modes as named; an integer k spelled out (every k-th block)
        add(f"| {_checkpoint_mode_label(mode, m.get('n_layer')) if mode.isdigit() else mode} | "
            f"{r['peak_device_bytes']:,} | "
            f"{r['memory_ratio']:.3f} | {r['peak_bytes']:,} | "
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
            "recomputed). " + (
                "The saving is smaller than 70% because the peak comes while one block's recomputed cache exists "
                "beside every block's kept input: peak / none is about 1/L + input/block (L layers; the kept input "
                f"is the FP32 residual stream), so this {m['n_layer']}-layer model keeps {b['memory_ratio']:.2f} of "
                "it, and by that formula deeper models save more. " if b["memory_ratio"] > 0.3 else "") +
            "Time ratios of a single run on a shared machine are noisy; "
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
