"""Plots and the Markdown report of ``fpsim demo`` (matplotlib imported only here, lazily).

Each plot function takes the demo's results (``{policy: History}`` plus metrics) and writes one PNG.
The histories are plain dicts of lists (see :class:`fpsim.train.History`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..formats import as_format

__all__ = ["write_plots"]

_COLORS = {
    "fp32": "#000000", "bf16-mixed": "#0072B2", "fp16-mixed": "#009E73", "fp16-static": "#56B4E9",
    "fp16-no-scaling": "#D55E00", "fp16-no-master": "#CC79A7", "fp16-fast-scaler": "#999933",
    "fp8-hybrid": "#E69F00",
    "int8-qat": "#7f7f7f", "int4-qat": "#8c564b", "int8-ptq": "#bcbd22", "int4-ptq": "#17becf",
}


def _color(name: str, i: int) -> str:
    return _COLORS.get(name, f"C{i % 10}")


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def _smooth(y: np.ndarray, k: int) -> np.ndarray:
    if k <= 1 or y.size < k:
        return y
    c = np.cumsum(np.insert(np.nan_to_num(y, nan=0.0), 0, 0.0))
    out = (c[k:] - c[:-k]) / k
    return np.concatenate([y[: k - 1], out])


def _save(fig: Any, path: str) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    return path


def plot_loss_curves(histories: Mapping[str, Any], path: str) -> str:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, (name, h) in enumerate(histories.items()):
        y = np.asarray(h["loss"], dtype=float)
        if y.size == 0:
            continue
        k = max(1, y.size // 40)
        ax.plot(h["step"], _smooth(y, k), color=_color(name, i), lw=1.5, label=name,
                ls="--" if "no-" in name else "-")
        if h["eval_step"]:
            ax.plot(h["eval_step"][-1], h["eval_loss"][-1], "o", color=_color(name, i), ms=5)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (nats/token, smoothed; dot = final held-out loss)")
    ax.set_title("Loss curves: the same model, data and seed under each policy")
    ax.legend(fontsize=8, ncol=2)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_gradient_histogram(h: Mapping[str, Any], path: str, *, loss_scale: float | None = None,
                            title_run: str = "fp32") -> str:
    """log2 |activation gradient| histogram of a run against fp16's and fp8's ranges."""
    plt = _plt()
    lo = int(h["hist_lo"])
    counts = np.asarray(h["hist"]["grad_act"][-1], dtype=float)
    zeros = int(h["hist_zeros"]["grad_act"][-1])
    step = h["hist_step"][-1]
    e = np.arange(lo, lo + counts.size)
    tot = counts.sum() + zeros
    frac = counts / max(tot, 1)
    fig, ax = plt.subplots(figsize=(9, 4.8))
    nz = np.nonzero(counts)[0]
    x0, x1 = (e[nz[0]] - 3, e[nz[-1]] + 4) if nz.size else (-40, 5)
    x0 = min(x0, -30)
    x1 = max(x1, 17 if loss_scale else 2)
    f16, e5, e4 = as_format("fp16"), as_format("fp8_e5m2"), as_format("fp8_e4m3")
    ymax = max(frac.max() if frac.size else 0.1, 0.01) * 1.35
    ax.axvspan(x0, np.log2(f16.min_subnormal) - 1, color="#D55E00", alpha=0.10, label="rounds to 0 in fp16")
    ax.axvspan(np.log2(f16.min_subnormal) - 1, np.log2(f16.min_normal), color="#E69F00", alpha=0.15,
               label="fp16 subnormal (precision lost)")
    ax.axvspan(np.log2(f16.min_normal), np.log2(f16.max), color="#009E73", alpha=0.10, label="fp16 normal")
    for f, yy, c in ((e5, 0.93, "#0072B2"), (e4, 0.85, "#CC79A7")):
        ax.plot([np.log2(f.min_subnormal), np.log2(f.min_normal)], [ymax * yy] * 2, color=c, lw=2, alpha=0.6,
                solid_capstyle="butt")
        ax.plot([np.log2(f.min_normal), np.log2(f.max)], [ymax * yy] * 2, color=c, lw=6, alpha=0.6,
                solid_capstyle="butt", label=f"{f.name} unscaled: subnormal (thin), normal up to max (thick)")
    ax.bar(e + 0.5, frac, width=0.9, color="#333333", alpha=0.8, label=f"{title_run} gradients, step {step}")
    if loss_scale and loss_scale != 1.0:
        sh = np.log2(loss_scale)
        ax.bar(e + 0.5 + sh, frac, width=0.9, color="#0072B2", alpha=0.35,
               label=f"same values x loss scale 2^{sh:g}")
    ax.set_xlim(x0, x1)
    ax.set_ylim(0, ymax)
    ax.set_xlabel("log2 |gradient|  (activation gradients entering the GEMMs of the backward pass)")
    ax.set_ylabel("fraction of values")
    ax.set_title(f"Where the gradients live (exact zeros: {100 * zeros / max(tot, 1):.1f}%, not shown)")
    ax.legend(fontsize=7, loc="upper left")
    return _save(fig, path)


def plot_underflow(histories: Mapping[str, Any], path: str) -> str:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, (name, h) in enumerate(histories.items()):
        y = np.asarray(h["grad_underflow_fraction"], dtype=float)
        if y.size == 0 or not np.isfinite(y).any():
            continue
        k = max(1, y.size // 50)
        ax.plot(h["step"], 100 * _smooth(y, k), color=_color(name, i), lw=1.5, label=name)
    ax.set_xlabel("step")
    ax.set_ylabel("nonzero gradient values that underflowed to 0 (%)")
    ax.set_title("Gradient underflow in the policy's gradient format")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_loss_scale(histories: Mapping[str, Any], path: str) -> str:
    """Top: the loss scale per step (skipped steps marked). Bottom: the largest scaled gradient against
    FP16's maximum, i.e. how much headroom the scale leaves before an overflow."""
    plt = _plt()
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(8, 6.2), sharex=True)
    f16 = as_format("fp16")
    for i, (name, h) in enumerate(histories.items()):
        s = np.asarray(h["loss_scale"], dtype=float)
        ax.step(h["step"], s, where="post", color=_color(name, i), lw=1.5, label=name)
        sk = np.asarray(h["skipped"], dtype=bool)
        if sk.any():
            st = np.asarray(h["step"])[sk]
            ax.plot(st, s[sk], "v", color=_color(name, i), ms=6, label=f"{name}: {int(sk.sum())} skipped steps")
        amax = np.asarray(h["grad_amax"], dtype=float)
        bx.plot(h["step"], amax, color=_color(name, i), lw=1.2, label=f"{name}: max |scaled gradient|")
    bx.axhline(f16.max, color="#D55E00", ls="--", lw=1.2, label=f"fp16 max {f16.max:g} (overflow above)")
    bx.axhline(f16.min_normal, color="#E69F00", ls=":", lw=1.2, label=f"fp16 min normal 2^{f16.emin}")
    ax.set_yscale("log", base=2)
    bx.set_yscale("log", base=2)
    ax.set_ylabel("loss scale")
    bx.set_ylabel("largest |gradient| x scale")
    bx.set_xlabel("step")
    ax.set_title("Loss-scale trajectory (triangles: overflow, step skipped) and headroom")
    ax.legend(fontsize=8)
    bx.legend(fontsize=7, loc="lower right")
    ax.grid(alpha=0.3)
    bx.grid(alpha=0.3)
    return _save(fig, path)


def plot_lost_updates(histories: Mapping[str, Any], path: str) -> str:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, (name, h) in enumerate(histories.items()):
        y = np.asarray(h["lost_update_fraction"], dtype=float)
        k = max(1, y.size // 50)
        ax.plot(h["step"], 100 * _smooth(y, k), color=_color(name, i), lw=1.5, label=name)
    ax.set_xlabel("step")
    ax.set_ylabel("nonzero weight updates lost to rounding (%)")
    ax.set_title("Weight updates swallowed by rounding (w + dw == w)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_qat_ptq(metrics: Mapping[str, Any], path: str, names: list[str]) -> str:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    vals = [metrics[n]["final_loss"] for n in names]
    bars = ax.bar(range(len(names)), vals, color=[_color(n, i) for i, n in enumerate(names)])
    for b, v in zip(bars, vals):
        ax.annotate(f"{v:.3f}", (b.get_x() + b.get_width() / 2, v), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=20)
    ax.set_ylabel("final held-out loss (nats/token)")
    ax.set_title("Quantization-aware training vs post-training quantization")
    ax.grid(alpha=0.3, axis="y")
    return _save(fig, path)


def write_plots(out: str, histories: Mapping[str, Any], metrics: Mapping[str, Any]) -> dict[str, str]:
    """Write every plot the available runs allow; returns {plot name: file name}."""
    made: dict[str, str] = {}
    hs = {k: (v.to_dict() if hasattr(v, "to_dict") else v) for k, v in histories.items()}
    made["loss_curves"] = os.path.basename(plot_loss_curves(hs, os.path.join(out, "loss_curves.png")))
    ref = next((n for n in ("fp32", "fp16-no-scaling", "bf16-mixed") if n in hs and hs[n]["hist_step"]), None)
    if ref is not None:
        ls = None
        if "fp16-mixed" in hs and hs["fp16-mixed"]["loss_scale"]:
            ls = float(np.median(hs["fp16-mixed"]["loss_scale"]))
        made["grad_histogram"] = os.path.basename(plot_gradient_histogram(
            hs[ref], os.path.join(out, "grad_histogram.png"), loss_scale=ls if ref == "fp32" else None,
            title_run=ref))
    und = {k: v for k, v in hs.items() if k.startswith(("fp16", "bf16", "fp8"))}
    if und:
        made["underflow"] = os.path.basename(plot_underflow(und, os.path.join(out, "underflow.png")))
    sc = {k: v for k, v in hs.items() if k in ("fp16-mixed", "fp16-fast-scaler", "fp16-static")}
    if sc:
        made["loss_scale"] = os.path.basename(plot_loss_scale(sc, os.path.join(out, "loss_scale.png")))
    lu = {k: v for k, v in hs.items() if k in ("fp32", "fp16-mixed", "fp16-no-master", "bf16-mixed")}
    if "fp16-no-master" in lu:
        made["lost_updates"] = os.path.basename(plot_lost_updates(lu, os.path.join(out, "lost_updates.png")))
    q = [n for n in ("fp32", "int8-qat", "int8-ptq", "int4-qat", "int4-ptq") if n in metrics]
    if any(n.endswith(("qat", "ptq")) for n in q):
        made["qat_ptq"] = os.path.basename(plot_qat_ptq(metrics, os.path.join(out, "qat_vs_ptq.png"), q))
    return made
