"""The demo's bit-exact GEMM option (``fpsim demo --gemm h100``): the lesson's low-precision policies trained
again with every GEMM through a device's Tensor Core model, and what that costs and changes.

For each policy of the demo that admits a device GEMM (one GEMM operand format, no FP8 recipe, no integer
fake quantization: :class:`fpsim.amp.Policy`, ``gemm``), a copy named ``"<policy>@<device>"`` with
``gemm=<device>`` trains with the same settings, data and initial weights. Every GEMM of the model then goes
through :func:`fpsim.mma.matmul` under ``fpsim.mma.get_model(device, activations, "fp32")``: the linear
layers, attention's ``q kᵀ`` and ``p v``, the lm_head, and both backward GEMMs of each (``dX = dY Wᵀ``,
``dW = Xᵀ dY``). The report gets, per policy, the wall time per step of both runs and their ratio (from the
same demo run), and the loss gap: the held-out loss of the bit-exact run minus that of the fast one, the first
step whose training loss differs and the largest difference of the training loss over the run.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._fpenv import ieee_mode
from .._names import norm_name
from ..amp import Policy, get_policy
from .loop import History, TrainConfig, Trainer

__all__ = ["bit_exact_plan", "bit_exact_policy", "bit_exact_section", "gemm_device", "run_bit_exact", "step_cost"]


@ieee_mode
def gemm_device(value: Any) -> str:
    """The canonical name of the device whose Tensor Core model ``--gemm`` asks for.

    ``ValueError`` names the value and lists the devices; ``TypeError`` for a non-string.

    >>> gemm_device(" H100-SXM5 ")
    'h100'
    >>> gemm_device("h1000")
    Traceback (most recent call last):
    ...
    ValueError: unknown device 'h1000'; valid: v100, t4, a100, a2, a30, ada, l40s, h100, h200, b200, ...
    """
    from .. import mma  # L2; imported only when a bit-exact run is asked for

    key = norm_name(value, "device")  # TypeError for a non-string, the one name rule otherwise
    try:
        return str(mma.device_info(key).name)
    except ValueError as e:
        msg = str(e)
        raise ValueError(msg.replace(repr(key), repr(value), 1) if isinstance(value, str) else msg) from None


@ieee_mode
def bit_exact_policy(policy: str | Policy, device: str) -> Policy:
    """``policy`` with every GEMM through ``device``'s Tensor Core model, named ``"<policy>@<device>"``.

    ``ValueError`` (from :class:`fpsim.amp.Policy`) when the policy cannot take a device GEMM: FP32
    activations (no such matrix-unit path), mixed GEMM operand formats, an FP8 recipe or fake quantization.

    >>> bit_exact_policy("fp16-mixed", "H100").gemm
    'h100'
    >>> bit_exact_policy("fp16-mixed", "h100").name
    'fp16-mixed@h100'
    """
    p = get_policy(policy)
    dev = gemm_device(device)
    return p.replace(name=f"{p.name}@{dev}", gemm=dev,
                     description=f"{p.description} (every GEMM bit-exact under the {dev} Tensor Core model)")


def _loss_gap(fast: History, exact: History) -> tuple[int | None, float]:
    """(first step whose training loss differs, largest |difference| of the training loss)."""
    a = np.asarray(fast["loss"], dtype=np.float64)
    b = np.asarray(exact["loss"], dtype=np.float64)
    n = min(a.size, b.size)
    if n == 0:
        return None, 0.0
    diff = a[:n] != b[:n]
    first = int(np.flatnonzero(diff)[0]) if diff.any() else None
    with np.errstate(invalid="ignore"):
        gap = np.abs(a[:n] - b[:n])
    return first, float(np.nanmax(gap)) if np.isfinite(gap).any() else math.nan


def _why_not(p: Policy, dev: str, e: ValueError) -> str:
    """One short reason a policy cannot take the device GEMM (the Policy's own message as the fallback)."""
    if p.fp8 is not None:
        return "an FP8 recipe: E4M3 x E5M2 device GEMMs are not modelled bit-exactly"
    if p.quant is not None:
        return "integer fake quantization: its operands are not values of a matrix-unit format"
    if len({p.params, p.activations, p.gradients}) > 1:
        return "GEMM operands in several formats (params, activations, gradients)"
    if "input format" in str(e):
        return f"{p.activations.name} GEMM operands: {dev} has no {p.activations.name} Tensor Core path"
    return str(e)


@ieee_mode
def bit_exact_plan(names: Sequence[str], device: str) -> tuple[list[tuple[str, Policy]], dict[str, str]]:
    """``([(policy, its bit-exact copy)], {policy: why it has none})`` for the demo's policies; ``ValueError``
    (before any training) when none admits a device GEMM.

    >>> todo, skipped = bit_exact_plan(["fp32", "fp16-mixed"], "h100")
    >>> [p.name for _, p in todo], skipped["fp32"]
    (['fp16-mixed@h100'], 'fp32 GEMM operands: h100 has no fp32 Tensor Core path')
    """
    dev = gemm_device(device)
    todo: list[tuple[str, Policy]] = []
    skipped: dict[str, str] = {}
    for n in names:
        try:
            todo.append((n, bit_exact_policy(n, dev)))
        except ValueError as e:
            skipped[n] = _why_not(get_policy(n), dev, e)
    if not todo:
        raise ValueError(f"--gemm {dev}: none of the policies {', '.join(names)} admits a device GEMM (it needs "
                         "fp16/bf16 GEMM operands in one format, no FP8 recipe, no fake quantization); add e.g. "
                         "fp16-mixed or bf16-mixed to --policies")
    return todo, skipped


@ieee_mode
def step_cost(fast: str | Policy, exact: str | Policy, cfg: TrainConfig, *, rounds: int = 3,
              steps: int = 2) -> tuple[float, float]:
    """Seconds per training step ``(fast, exact)`` of two policies, timed in interleaved rounds (best of
    ``rounds`` rounds of ``steps`` steps each, after one warm-up step), on fresh trainers from the same initial
    weights: the ratio is less exposed to a shared machine's load than two whole runs' walls.

    >>> from fpsim.train.demo import DemoSettings
    >>> cfg = DemoSettings(n_layer=1, n_embd=16, n_head=2, batch_size=4, task_kwargs={"n_symbols": 8,
    ...                    "length": 4}).train_config()
    >>> fast, exact = step_cost("fp16-mixed", bit_exact_policy("fp16-mixed", "h100"), cfg, rounds=1, steps=1)
    >>> fast > 0 and exact > 0
    True
    """
    trs = [Trainer(p, cfg) for p in (fast, exact)]
    for tr in trs:
        tr.step()
    best = [math.inf, math.inf]
    for _ in range(rounds):
        for i, tr in enumerate(trs):
            t0 = time.perf_counter()
            for _ in range(steps):
                tr.step()
            best[i] = min(best[i], (time.perf_counter() - t0) / steps)
    return best[0], best[1]


@ieee_mode
def run_bit_exact(names: Sequence[str], cfg: TrainConfig, device: str, fast: dict[str, dict[str, Any]],
                  histories: dict[str, History], *, progress: bool | None = None,
                  log: Any = None) -> dict[str, Any]:
    """Train the bit-exact copy of every policy of ``names`` that admits one; compare with the fast runs.

    ``fast`` and ``histories`` hold the fast runs' demo metrics (``ms_per_step``, ``final_loss``, ...) and
    histories, by policy name. Returns ``{"device", "rows": [...], "skipped": {policy: reason}}``; each row has
    ``policy``, ``step_ms`` / ``fast_step_ms`` (:func:`step_cost`, interleaved) and their ``time_ratio`` (the
    cost), ``ms_per_step`` / ``fast_ms_per_step`` (whole runs' walls per step, evaluation included) and their
    ``run_time_ratio``, ``final_loss`` /
    ``fast_final_loss`` and ``loss_gap`` (bit-exact minus fast), ``first_differing_step`` (None: identical),
    ``max_train_loss_gap``, and the lesson counts of both runs (underflow, lost updates, skipped steps).
    ``ValueError`` when no policy admits a device GEMM.
    """
    dev = gemm_device(device)
    say = log or (lambda s: None)
    rows: list[dict[str, Any]] = []
    todo, skipped = bit_exact_plan(names, dev)
    for n, pol in todo:
        t0 = time.perf_counter()
        tr = Trainer(pol, cfg)
        tr.run(progress=progress, label=pol.name)
        wall = time.perf_counter() - t0
        s = tr.history.summary()
        f = fast[n]
        ms = 1000.0 * wall / max(int(s["steps"]), 1)
        first, max_gap = _loss_gap(histories[n], tr.history)
        t_fast, t_exact = step_cost(n, pol, cfg)
        row = {
            "policy": n, "bit_exact_policy": pol.name, "device": dev,
            "step_ms": 1000.0 * t_exact, "fast_step_ms": 1000.0 * t_fast, "time_ratio": t_exact / t_fast,
            "ms_per_step": ms, "fast_ms_per_step": float(f["ms_per_step"]),
            "run_time_ratio": ms / float(f["ms_per_step"]) if f["ms_per_step"] else math.nan,
            "final_loss": float(s["final_loss"]), "fast_final_loss": float(f["final_loss"]),
            "loss_gap": float(s["final_loss"]) - float(f["final_loss"]),
            "first_differing_step": first, "max_train_loss_gap": max_gap,
            "grad_underflow_fraction": s["grad_underflow_fraction"],
            "fast_grad_underflow_fraction": f["grad_underflow_fraction"],
            "lost_update_fraction": s["lost_update_fraction"],
            "fast_lost_update_fraction": f["lost_update_fraction"],
            "skipped_steps": s["skipped_steps"], "fast_skipped_steps": f["skipped_steps"],
            "steps": s["steps"], "wall_s": wall, "gemm_calls": tr.runtime.mma_calls,
        }
        rows.append(row)
        say(f"  {pol.name:22s} loss {row['final_loss']:.4f} (fast {row['fast_final_loss']:.4f}, gap "
            f"{row['loss_gap']:+.4f})  step {row['step_ms']:6.1f} ms = {row['time_ratio']:.1f}x the fast step "
            f"(whole runs: {row['run_time_ratio']:.1f}x)")
    return {"device": dev, "rows": rows, "skipped": skipped}


@ieee_mode
def bit_exact_section(block: dict[str, Any]) -> str:
    """The report's section on the bit-exact GEMM runs (``run_bit_exact``'s result), in Markdown.

    >>> row = {"policy": "fp16-mixed", "fast_step_ms": 20.0, "step_ms": 100.0, "time_ratio": 5.0,
    ...        "run_time_ratio": 5.5, "fast_final_loss": 0.5, "final_loss": 0.501, "loss_gap": 0.001,
    ...        "first_differing_step": 0, "max_train_loss_gap": 0.002, "fast_skipped_steps": 0, "skipped_steps": 0}
    >>> text = bit_exact_section({"device": "h100", "rows": [row], "skipped": {"fp32": "no fp32 path"}})
    >>> print(text.splitlines()[6])
    | fp16-mixed | 20.0 | 100.0 | 5.0x | 5.5x | 0.5000 | 0.5010 | +0.0010 (+0.2%) | 0 | 0.0020 | 0 / 0 |
    """
    dev = block["device"]
    L = [f"## Bit-exact {dev} GEMMs (`--gemm {dev}`)\n",
         (f"Each policy below trained a second time with every GEMM of the model bit-exact under the {dev} Tensor "
         f"Core model (`fpsim.mma.get_model(\"{dev}\", activations, \"fp32\")`: the linear layers, attention's "
         "q·kᵀ and p·v, the lm_head, and both backward GEMMs of each, dX = dY·Wᵀ and dW = Xᵀ·dY), instead of "
         "the fast emulation (operands rounded, float32 BLAS, result rounded once). Same data, initial weights "
         "and settings. *step ms*: one training step of each, timed in interleaved rounds in this demo run (best "
         "of 3 rounds of 2 steps, fresh trainers); *cost*: their ratio; *runs*: the ratio of the two whole runs' "
         "wall time per step (evaluation and telemetry included; more exposed to the machine's load); *loss gap*: "
         "held-out loss bit-exact minus fast.\n"),
         ("| policy | step ms fast | step ms bit-exact | cost | runs | final loss fast | bit-exact | loss gap | "
          "first differing step | max train-loss gap | skipped steps fast / bit-exact |"),
         "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in block["rows"]:
        fd = r["first_differing_step"]
        L.append(f"| {r['policy']} | {r['fast_step_ms']:.1f} | {r['step_ms']:.1f} | "
                 f"{r['time_ratio']:.1f}x | {r['run_time_ratio']:.1f}x | {r['fast_final_loss']:.4f} | "
                 f"{r['final_loss']:.4f} | "
                 f"{r['loss_gap']:+.4f} ({_rel(r['final_loss'], r['fast_final_loss'])}) | "
                 f"{'none (identical)' if fd is None else fd} | {r['max_train_loss_gap']:.4f} | "
                 f"{r['fast_skipped_steps']} / {r['skipped_steps']} |")
    rows = block["rows"]
    if rows:
        ratios = [r["time_ratio"] for r in rows]
        gaps = [abs(r["loss_gap"]) for r in rows]
        span = f"{min(ratios):.1f}x" if f"{min(ratios):.1f}" == f"{max(ratios):.1f}" else \
            f"{min(ratios):.1f}x to {max(ratios):.1f}x"
        same = [r["policy"] for r in rows if r["first_differing_step"] is None]
        L.append(f"\n**Cost**: a bit-exact step took {span} the fast step. **What differed**: the {dev} matrix "
                 "unit's arithmetic (each block's products aligned to its largest exponent and truncated, a "
                 "fixed-width sum, the chain along K) is not float32 BLAS's, so GEMM outputs differ in their last "
                 "bits" + (f" (the runs of {', '.join(same)} stayed identical: every difference was rounded away "
                 "by the output casts)" if same else "") + "; once a step's loss differs the trajectories drift "
                 f"apart (largest final-loss gap here {max(gaps):.4f}): read the gaps against "
                 "the seed noise the main table's caveat describes, not as an effect of the hardware's arithmetic "
                 "unless a multi-seed run shows it beyond that noise.")
    skipped = block.get("skipped", {})
    if skipped:
        L.append("\nNot run bit-exact: " + "; ".join(f"{n} ({why})" for n, why in skipped.items()) + ".")
    return "\n".join(L) + "\n"


def _rel(a: float, b: float) -> str:
    return f"{100 * (a - b) / b:+.1f}%" if b else "-"
