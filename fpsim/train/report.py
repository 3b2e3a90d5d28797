"""Plots and the Markdown report of ``fpsim demo`` (matplotlib imported only here, lazily).

Each plot function takes the demo's results (``{policy: History}`` plus metrics) and writes one PNG.
The histories are plain dicts of lists (see :class:`fpsim.train.History`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from .._fpenv import ieee_mode
from ..formats import as_format

__all__ = ["POLICY_STYLES", "lesson_table", "plot_checkpointing", "policy_style", "seed_columns", "seed_section",
           "write_plots"]

#: Colour and line style of each built-in policy in every plot that draws policies (the demo's PNGs here and
#: ``fpsim.plot``'s training plots): Paul Tol's colour-blind-safe "muted" scheme plus black for the fp32
#: reference, and a dash pattern per policy, so every policy is a distinct (colour, line style) pair and
#: policies of one colour (the QAT/PTQ pairs) differ by their dashes.
POLICY_STYLES: dict[str, tuple[str, str]] = {
    "fp32": ("#000000", "-"),
    "bf16-mixed": ("#332288", "-"),          # indigo
    "fp16-mixed": ("#44AA99", "-"),          # teal
    "fp16-fast-scaler": ("#88CCEE", "-."),   # cyan
    "fp16-static": ("#117733", "--"),        # green
    "fp16-no-scaling": ("#CC6677", "--"),    # rose
    "fp16-no-master": ("#AA4499", ":"),      # purple
    "fp8-hybrid": ("#999933", "-."),         # olive
    "int8-qat": ("#882255", "-"),            # wine
    "int4-qat": ("#882255", "--"),
    "int8-ptq": ("#DDCC77", "-"),            # sand
    "int4-ptq": ("#DDCC77", "--"),
}
_OTHER_COLOURS = ("#332288", "#44AA99", "#CC6677", "#117733", "#AA4499", "#999933", "#882255", "#88CCEE")
_OTHER_STYLES = ("-", "--", "-.", ":")


@ieee_mode
def policy_style(name: str, i: int = 0) -> tuple[str, str]:
    """``(colour, linestyle)`` of a policy: :data:`POLICY_STYLES` for built-in names, else by index ``i``.

    >>> policy_style("fp16-no-scaling"), policy_style("fp8-hybrid")
    (('#CC6677', '--'), ('#999933', '-.'))
    """
    if name in POLICY_STYLES:
        return POLICY_STYLES[name]
    return _OTHER_COLOURS[i % len(_OTHER_COLOURS)], _OTHER_STYLES[(i // len(_OTHER_COLOURS)) % len(_OTHER_STYLES)]


def _color(name: str, i: int) -> str:
    return policy_style(name, i)[0]


def _ls(name: str, i: int) -> str:
    return policy_style(name, i)[1]


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
    """Top: every policy's smoothed training loss (log scale). Below: one small panel per policy with its
    difference from the reference run (``fp32``, else the first run), each on its own y-scale, so curves
    that coincide in the top panel are told apart; a run whose curve is the reference's bit for bit (PTQ
    reuses fp32's training) says so instead of drawing a flat line."""
    plt = _plt()
    from matplotlib.ticker import FormatStrFormatter

    runs = [(n, h) for n, h in histories.items() if np.asarray(h["loss"], dtype=float).size]
    ref = "fp32" if "fp32" in histories else (runs[0][0] if runs else None)
    others = [(n, h) for n, h in runs if n != ref]
    ncol = 4
    nrow = (len(others) + ncol - 1) // ncol
    fig = plt.figure(figsize=(11, 4.2 + 1.9 * nrow))
    gs = fig.add_gridspec(1 + nrow, ncol, height_ratios=[2.6] + [1.0] * nrow)
    ax = fig.add_subplot(gs[0, :])

    def smooth(h: Mapping[str, Any]) -> np.ndarray:
        y = np.asarray(h["loss"], dtype=float)
        return _smooth(y, max(1, y.size // 40))

    # A curve that stays within 1% of the log axis's range of the reference's is drawn, but shares the
    # reference's legend entry: a legend must not promise curves the eye cannot find (the panels below
    # separate them).
    on_ref: list[str] = []
    if ref is not None:
        ys = {n: smooth(h) for n, h in runs}
        pos = np.concatenate([y[np.isfinite(y) & (y > 0)] for y in ys.values()] + [np.ones(1)])
        span = max(float(np.log(pos.max() / pos.min())), 1e-12)
        yr0 = ys[ref]
        for n, _ in others:
            m = min(ys[n].size, yr0.size)
            a, b = ys[n][:m], yr0[:m]
            ok = np.isfinite(a) & np.isfinite(b) & (a > 0) & (b > 0)
            if m and ok.all() and float(np.max(np.abs(np.log(a / b)))) < 0.01 * span:
                on_ref.append(n)
    for i, (name, h) in enumerate(runs):
        label = name
        if name in on_ref:
            label = "_" + name
        elif name == ref and on_ref:
            label = f"{name} and {len(on_ref)} {'policy' if len(on_ref) == 1 else 'policies'} on it (see below)"
        ax.plot(h["step"], smooth(h), color=_color(name, i), lw=1.5, label=label, ls=_ls(name, i))
        if h["eval_step"]:
            ax.plot(h["eval_step"][-1], h["eval_loss"][-1], "o", color=_color(name, i), ms=5)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (nats/token)")
    ax.set_title("Loss curves: the same model, data and seed under each policy (smoothed; dot = final held-out "
                 "loss)", fontsize=10)
    ax.legend(fontsize=8, ncol=1, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: covers no curve
    ax.grid(alpha=0.3)
    if ref is not None:
        hr = histories[ref]
        yr = smooth(hr)
        for j, (name, h) in enumerate(others):
            bx = fig.add_subplot(gs[1 + j // ncol, j % ncol])
            i = [n for n, _ in runs].index(name)
            y = smooth(h)
            m = min(y.size, yr.size)
            d = y[:m] - yr[:m]
            bx.axhline(0.0, color="#000000", lw=0.8)
            if np.array_equal(np.asarray(h["loss"][:m], dtype=float), np.asarray(hr["loss"][:m], dtype=float)):
                bx.text(0.5, 0.5, f"training identical\nto {ref}", transform=bx.transAxes, ha="center",
                        va="center", fontsize=8)
            else:
                bx.plot(np.asarray(h["step"][:m]), d, color=_color(name, i), ls=_ls(name, i), lw=1.3,
                        label="_" + name)
            if h["eval_step"] and hr["eval_step"]:
                bx.plot(h["eval_step"][-1], h["eval_loss"][-1] - hr["eval_loss"][-1], "o", color=_color(name, i),
                        ms=4)
            bx.set_title(f"{name} − {ref}", fontsize=8, pad=2)
            bx.set_xlim(float(hr["step"][0]) - 2, float(hr["step"][-1]) + 4)
            bx.yaxis.set_major_formatter(FormatStrFormatter("%.2g"))  # no offset text over the panel's title
            bx.tick_params(labelsize=7)
            bx.grid(alpha=0.3)
            if j % ncol == 0:
                bx.set_ylabel("Δ loss (nats),\neach panel its own scale", fontsize=7)
            if j // ncol == nrow - 1:
                bx.set_xlabel("step", fontsize=7)
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
    fig, ax = plt.subplots(figsize=(12, 4.8))
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
    # Band edges labelled with their values (fp16 at the top, each fp8 format at the ends of its bar),
    # only where they are on screen.
    for v in (f16.min_subnormal, f16.min_normal, f16.max):
        if x0 <= np.log2(v) <= x1:
            ax.text(np.log2(v), 1.005, f"fp16 {_edge_text(v)}", ha="center", va="bottom", fontsize=7,
                    transform=ax.get_xaxis_transform(), gid=f"edge:fp16:{_edge_text(v)}")
    for f, yy, c in ((e5, 0.93, "#0072B2"), (e4, 0.85, "#CC79A7")):
        # min subnormal to the left of its end, min normal to the right: they are only 2-3 binades apart.
        for v, ha in ((f.min_subnormal, "right"), (f.min_normal, "left"), (f.max, "center")):
            if x0 <= np.log2(v) <= x1:
                ax.text(np.log2(v), ymax * (yy - 0.025), _edge_text(v), ha=ha, va="top", fontsize=6.5,
                        color=c, gid=f"edge:{f.name}:{_edge_text(v)}")
    ax.set_xlabel("log2 |gradient|  (activation gradients entering the GEMMs of the backward pass)")
    ax.set_ylabel("fraction of values")
    ax.set_title(f"Where the gradients live (exact zeros: {100 * zeros / max(tot, 1):.1f}%, not shown)", pad=14)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: the band labels stay visible
    return _save(fig, path)


def _edge_text(v: float) -> str:
    """A band edge as students read it: powers of two below 1 as ``2^-24``, the rest as a number (65504)."""
    m, e = np.frexp(v)
    return f"2^{int(e) - 1}" if m == 0.5 and v < 1 else f"{v:g}"


def _overlap_label(name: str, v: np.ndarray, drawn: Mapping[str, np.ndarray]) -> str:
    """``name``, or, when its series lies on top of one already drawn on a log axis (within 15% at every
    step where both are positive, and zero at the same steps), a label that says so and by how much (the
    largest relative difference).

    >>> a = np.array([0.1, 0.2, 0.0])
    >>> _overlap_label("b", a * 1.05, {"a": a}), _overlap_label("c", a * 3, {"a": a})
    ('b (over a, ±5%)', 'c')
    """
    for o, ov in drawn.items():
        if ov.shape != v.shape or not np.array_equal(ov > 0, v > 0) or not (v > 0).any():
            continue
        pos = v > 0
        rel = float(np.max(np.abs(v[pos] / ov[pos] - 1.0)))
        if rel <= 0.15:
            return f"{name} (over {o}, ±{max(1, int(np.ceil(100 * rel - 1e-9)))}%)"
    return name


def _plot_share(ax: Any, name: str, i: int, steps: Any, y: np.ndarray, drawn: dict[str, np.ndarray], *,
                lw: float) -> bool:
    """One run's share per step (in %, smoothed) on a log axis, labelled against the curves already drawn; a
    run that is 0 at every step cannot be drawn there and says so in the legend (returns False)."""
    v = 100 * _smooth(y, max(1, y.size // 50))
    if not (v > 0).any():
        ax.plot([], [], color=_color(name, i), lw=1.5, ls=_ls(name, i), label=f"{name}: 0 at every step")
        return False
    label = _overlap_label(name, v, drawn)
    drawn[name] = v
    ax.plot(steps, np.where(v > 0, v, np.nan), color=_color(name, i), lw=lw, ls=_ls(name, i), label=label)
    return True


def plot_underflow(histories: Mapping[str, Any], path: str) -> str:
    """Underflow share per step on a log axis (policies that lose 0.1% and 50% are both visible); a run that
    lost nothing at any step cannot be drawn on it and says so in the legend."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9.5, 4.5))
    zero: list[str] = []
    drawn: dict[str, np.ndarray] = {}
    for i, (name, h) in enumerate(histories.items()):
        y = np.asarray(h["grad_underflow_fraction"], dtype=float)
        if y.size == 0 or not np.isfinite(y).any():
            continue
        if not _plot_share(ax, name, i, h["step"], y, drawn, lw=1.8):
            zero.append(name)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("nonzero gradient values\nthat underflowed to 0 (%, log)")
    ax.set_title("Gradient underflow in the policy's gradient format (steps with 0 not drawn)", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3, which="both")
    return _save(fig, path)


def plot_loss_scale(histories: Mapping[str, Any], path: str) -> str:
    """Top: the loss scale per step (skipped steps marked). Bottom: the largest scaled gradient against
    FP16's maximum, i.e. how much headroom the scale leaves before an overflow."""
    plt = _plt()
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(11, 6.2), sharex=True)
    f16 = as_format("fp16")
    for i, (name, h) in enumerate(histories.items()):
        s = np.asarray(h["loss_scale"], dtype=float)
        sk = np.asarray(h["skipped"], dtype=bool)
        ax.step(h["step"], s, where="post", color=_color(name, i), lw=1.5, ls=_ls(name, i),
                label=f"{name}: {int(sk.sum())} skipped steps")
        if sk.any():
            st = np.asarray(h["step"])[sk]
            ax.plot(st, s[sk], "v", color=_color(name, i), ms=6, label="_skipped")
        amax = np.asarray(h["grad_amax"], dtype=float)
        bx.plot(h["step"], amax, color=_color(name, i), lw=1.2, ls=_ls(name, i), label=f"{name}: max |scaled gradient|")
    bx.axhline(f16.max, color="#D55E00", ls="--", lw=1.2, label=f"fp16 max {f16.max:g} (overflow above)")
    bx.axhline(f16.min_normal, color="#E69F00", ls=":", lw=1.2, label=f"fp16 min normal 2^{f16.emin}")
    ax.set_yscale("log", base=2)
    bx.set_yscale("log", base=2)
    ax.set_ylabel("loss scale")
    bx.set_ylabel("largest |gradient| x scale")
    bx.set_xlabel("step")
    any_skip = any(np.asarray(h["skipped"], dtype=bool).any() for h in histories.values())
    ax.set_title("Loss-scale trajectory " + ("(triangles: overflow, step skipped) " if any_skip else
                                             "(no overflow: no step skipped) ") + "and headroom")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: over no curve
    bx.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3)
    bx.grid(alpha=0.3)
    return _save(fig, path)


def plot_lost_updates(histories: Mapping[str, Any], path: str) -> str:
    """Lost-update share per step on a log axis: the runs without a master copy lose percents, those with
    one (FP32 weights included) a few in a million, and both must be visible; a run that lost nothing at
    any step says so in the legend."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9.5, 4.5))
    drawn: dict[str, np.ndarray] = {}
    for i, (name, h) in enumerate(histories.items()):
        y = np.asarray(h["lost_update_fraction"], dtype=float)
        if y.size == 0 or not np.isfinite(y).any():
            continue
        _plot_share(ax, name, i, h["step"], np.nan_to_num(y), drawn, lw=1.5)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("nonzero weight updates\nlost to rounding (%, log)")
    ax.set_title("Weight updates swallowed by rounding (w + dw == w; steps with 0 not drawn)", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3, which="both")
    return _save(fig, path)


def plot_qat_ptq(metrics: Mapping[str, Any], path: str, names: list[str]) -> str:
    """Final held-out loss per policy as points on an axis zoomed to the data (the differences are small
    against the loss itself, so bars from 0 would flatten them), with fp32 as a reference line and each bit
    width's QAT − PTQ difference written beside its pair."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.4))
    vals = np.array([float(metrics[n]["final_loss"]) for n in names])
    ref = float(metrics["fp32"]["final_loss"]) if "fp32" in names else None
    x = np.arange(len(names))
    for i, (n, v) in enumerate(zip(names, vals)):
        ax.plot(x[i], v, "o", ms=9, color=_color(n, i), mec="#000000", mew=0.6)
        d = "" if ref is None or n == "fp32" else f"\n({v - ref:+.4f} vs fp32)"
        ax.annotate(f"{v:.4f}{d}", (x[i], v), xytext=(0, 9), textcoords="offset points", ha="center",
                    va="bottom", fontsize=8)
    if ref is not None:
        ax.axhline(ref, color=_color("fp32", 0), lw=0.9, ls=":", label=f"fp32 {ref:.4f}")
    for b in sorted({n[3:-4] for n in names if n.startswith("int") and n.endswith(("-qat", "-ptq"))}):
        q, p = f"int{b}-qat", f"int{b}-ptq"
        if q in names and p in names:
            iq, ip = names.index(q), names.index(p)
            vq, vp = vals[iq], vals[ip]
            ax.annotate("", (x[ip], vp), (x[iq], vq), arrowprops=dict(arrowstyle="-", color="#777777", lw=0.8,
                                                                       ls="--"))
            ax.text((x[iq] + x[ip]) / 2, min(vq, vp), f"QAT − PTQ\n{vq - vp:+.4f}", ha="center", va="top",
                    fontsize=8, color="#444444")
    lo, hi = float(vals.min()), float(vals.max())
    pad = max(hi - lo, 1e-4 * max(abs(hi), 1.0))
    ax.set_ylim(lo - 0.45 * pad, hi + 0.45 * pad)  # zoomed to the data: the axis does not start at 0
    ax.set_xticks(x)
    ax.set_xticklabels(names, rotation=20)
    ax.set_xlim(-0.5, len(names) - 0.5)
    ax.set_ylabel("final held-out loss (nats/token)\n(axis zoomed to the data)")
    ax.set_title("Quantization-aware training vs post-training quantization", fontsize=10)
    if ref is not None:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3, axis="y")
    return _save(fig, path)


@ieee_mode
def write_plots(out: str, histories: Mapping[str, Any], metrics: Mapping[str, Any],
                checkpointing: Mapping[str, Any] | None = None) -> dict[str, str]:
    """Write every plot the available runs allow (and the checkpointing ledger's, when given); returns
    {plot name: file name}."""
    made: dict[str, str] = {}
    if checkpointing is not None:
        made["checkpointing"] = os.path.basename(
            plot_checkpointing(checkpointing, os.path.join(out, "checkpointing.png")))
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


# ------------------------------------------------------------------------------------------------------
# the multi-seed demo (fpsim demo --seeds N): spread columns and the "Across seeds" section
# ------------------------------------------------------------------------------------------------------

def _num(v: Any, fmt: str) -> str:
    return "-" if v is None or not np.isfinite(v) else format(v, fmt)


def _ci_text(r: Mapping[str, Any], fmt: str, scale: float = 1.0) -> str:
    ci = r.get("ci")
    if ci is None:
        return "-"
    return f"[{_num(scale * ci[0], fmt)}, {_num(scale * ci[1], fmt)}]"


@ieee_mode
def seed_columns(spread: Mapping[str, Any] | None, name: str | None) -> tuple[str, str]:
    """Extra cells of the demo's policy table for a multi-seed run: (header, separator) for ``name=None``,
    else (the row's cells, ""). Nothing for a one-seed demo (``spread`` None)."""
    if not spread:
        return "", ""
    n = spread["n_seeds"]
    if name is None:
        return (f" final loss, {n} seeds (mean ± sd) | vs fp32 over seeds: mean [95% CI] |", "---|---|")
    st = spread["policies"].get(name, {}).get("final_loss", {})
    cell = f"{_num(st.get('mean'), '.4f')} ± {_num(st.get('sd'), '.4f')}" if st else "-"
    r = spread["final_loss_vs_fp32"].get(name)
    if r is None or r.get("diff") is None:
        vs = "-"
    else:
        vs = f"{_num(r['diff'], '+.3g')} {_ci_text(r, '+.3g')}: {r['verdict']}"
    return f" {cell} | {vs} |", ""


def _metric_fmt(metric: str) -> tuple[str, str, float, str]:
    """(format of means, format of differences, scale, unit) of a lesson's metric."""
    if metric.endswith("_fraction"):
        return ".2f", ".3g", 100.0, " (points of %)"
    if metric == "skipped_steps":
        return ".1f", ".3g", 1.0, ""
    return ".4f", ".3g", 1.0, ""


@ieee_mode
def lesson_table(policies: Mapping[str, Any], spread: Mapping[str, Any] | None = None, *, seed: int = 0) -> str:
    """The demo's lesson table: each lesson (:data:`fpsim.train.sweep.LESSONS`) whose two policies ran, the
    effect A - B in its metric on the report's seed, and the column *beyond seed noise?*.

    With ``spread`` (a multi-seed demo, :func:`fpsim.train.sweep.seed_spread`) the column gives the mean
    effect, its 95% paired interval over the n seeds and the verdict; without (one seed) it says the effect was
    not measured against seed noise and how to measure it (``fpsim demo --seeds 3``): one run per policy
    cannot tell an effect from the seed.

    Examples
    --------
    >>> P = {"fp32": {"final_loss": 0.5}, "bf16-mixed": {"final_loss": 0.51}}
    >>> print(lesson_table(P).splitlines()[-1])
    | BF16 mixed precision (FP32 master) vs FP32: final loss | final_loss | bf16-mixed | fp32 | +0.01 | not measured: 1 seed (run `fpsim demo --seeds 3`) |
    """
    from ._settings import DEFAULT_SEEDS
    from .sweep import LESSONS

    by = {r["key"]: r for r in (spread or {}).get("lessons", [])}
    n = spread["n_seeds"] if spread else 1
    L = ["## Lessons: do they hold beyond seed noise?\n",
         ("The findings above are single runs; this table says which of them hold beyond seed noise. "
          f"Each lesson compares two policies A and B. *A − B (seed {seed})*: the effect in this report's runs; "
          + (f"*beyond seed noise?*: the mean of A − B over the {n} seeds, its 95% paired Student-t interval and "
             "the verdict (*beyond seed noise* when the interval excludes 0; details in *Across seeds*)."
             if spread else
             "*beyond seed noise?*: not measured, this demo ran one seed, and one run per policy cannot tell an "
             f"effect from the seed; the full `fpsim demo` trains {DEFAULT_SEEDS} seeds by default, and `--seeds 3` "
             "(or more) with `--quick` trains every policy over several seeds and fills this column.") + "\n"),
         f"| lesson | metric | A | B | A − B (seed {seed}) | beyond seed noise? |", "|---|---|---|---|---|---|"]
    for les in LESSONS:
        if les.a not in policies or les.b not in policies:
            continue
        _, dfmt, sc, unit = _metric_fmt(les.metric)
        va, vb = policies[les.a].get(les.metric), policies[les.b].get(les.metric)
        d = None if va is None or vb is None else sc * (float(va) - float(vb))
        r = by.get(les.key)
        if r is None:
            col = "not measured: 1 seed (run `fpsim demo --seeds 3`)" if not spread else "-"
        elif r.get("diff") is None:
            col = r["verdict"]
        else:
            col = (f"{_num(sc * r['diff'], '+' + dfmt)} {_ci_text(r, '+' + dfmt, sc)} over {r['n']} seeds: "
                   f"**{r['verdict']}**")
        L.append(f"| {les.title} | {les.metric}{unit} | {les.a} | {les.b} | {_num(d, '+' + dfmt)} | {col} |")
    return "\n".join(L) + "\n"


@ieee_mode
def seed_section(spread: Mapping[str, Any], sweep: Mapping[str, Any] | None = None) -> str:
    """The report's *Across seeds* section: each lesson's effect, mean and spread over seeds, and verdict."""
    L: list[str] = []
    add = L.append
    n = spread["n_seeds"]
    seeds = spread["seeds"]
    add(f"## Across seeds ({n} seeds: {', '.join(str(s) for s in seeds)})\n")
    where = (sweep or {}).get("where")
    add("Every policy was trained once per seed (the seed sets the initial weights, the batches and the "
        "held-out set); the cells ran as a sweep" + (f" ({where})" if where else "") + ", each seeded by its own "
        "seed only, so the results are the bits of a serial run. **Rule:** an effect is the per-seed difference "
        "of a metric between two policies (the runs of one seed share weights and data, so pairing removes "
        f"what the seed does to both); with n = {n} seeds its mean and the {100 * spread['level']:g}% paired "
        "Student-t interval mean ± t(n-1)·sd/√n are given, and the effect is *beyond seed noise* when the "
        "interval excludes 0, *within seed noise* when it contains 0. With so few seeds the interval is wide: "
        "\"within seed noise\" means this sweep cannot tell the effect from the seed, not that there is none.\n")
    add("| lesson | metric | A | B | mean A | mean B | A − B, mean [95% CI] | sd of A − B | verdict |")
    add("|---|---|---|---|---|---|---|---|---|")
    for r in spread["lessons"]:
        fmt, dfmt, sc, unit = _metric_fmt(r["metric"])
        ma = None if r["mean_a"] is None else sc * r["mean_a"]
        mb = None if r["mean_b"] is None else sc * r["mean_b"]
        d = None if r["diff"] is None else sc * r["diff"]
        sd = None if r["diff_sd"] is None else sc * r["diff_sd"]
        add(f"| {r['title']} | {r['metric']}{unit} | {r['a']} | {r['b']} | {_num(ma, fmt)} | {_num(mb, fmt)} | "
            f"{_num(d, '+' + dfmt)} {_ci_text(r, '+' + dfmt, sc)} | {_num(sd, dfmt)} | **{r['verdict']}** |")
    add("\nPer policy over the seeds (mean ± sd; min .. max of the final loss):\n")
    add("| policy | final loss | min .. max | grad underflow | lost updates | skipped steps |")
    add("|---|---|---|---|---|---|")
    for p, m in spread["policies"].items():
        fl, gu, lu, sk = (m[k] for k in ("final_loss", "grad_underflow_fraction", "lost_update_fraction",
                                          "skipped_steps"))

        def pm(s: Mapping[str, Any], fmt: str, sc: float = 1.0) -> str:
            if s.get("mean") is None:
                return "-"
            sd = s.get("sd")
            return f"{_num(sc * s['mean'], fmt)} ± {_num(None if sd is None else sc * sd, fmt)}"

        add(f"| {p} | {pm(fl, '.4f')} | {_num(fl.get('min'), '.4f')} .. {_num(fl.get('max'), '.4f')} | "
            f"{pm(gu, '.2f', 100.0)}% | {pm(lu, '.2f', 100.0)}% | {pm(sk, '.1f')} |")
    add("")
    return "\n".join(L) + "\n"


# ------------------------------------------------------------------------------------------------------
# the checkpointing ledger (fpsim.train.ledger.checkpoint_table)
# ------------------------------------------------------------------------------------------------------

_MODE_LABELS = {"none": "none", "blocks": "blocks (every block)", "selective": "selective (attention core)",
                "flash": "flash attention", "flash+blocks": "flash + blocks (every block)"}


def _ordinal(k: int) -> str:
    return f"{k}{'th' if 10 <= k % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(k % 10, 'th')}"


@ieee_mode
def _checkpoint_mode_label(mode: Any, n_layer: int | None = None) -> str:
    """A checkpointing mode as a reader reads it: an int k (``GPTConfig.checkpoint=k``) means every k-th
    block recomputed (blocks 0, k, 2k, ...); the named modes get what they recompute.

    >>> _checkpoint_mode_label("2", 2), _checkpoint_mode_label(3, 7), _checkpoint_mode_label("blocks")
    ('every 2nd block (block 0 of 2)', 'every 3rd block (blocks 0, 3, 6 of 7)', 'blocks (every block)')
    """
    m = str(mode)
    if not m.isdigit():
        return _MODE_LABELS.get(m, m)
    k = int(m)
    if n_layer is None:
        return f"every {_ordinal(k)} block"
    which = [str(i) for i in range(n_layer) if i % k == 0]
    return (f"every {_ordinal(k)} block ({'block' if len(which) == 1 else 'blocks'} {', '.join(which)} "
            f"of {n_layer})")


@ieee_mode
def plot_checkpointing(table: Mapping[str, Any], path: str) -> str:
    """Stacked bars: peak activation bytes (device) per checkpointing mode, by kind, with the FLOP ratio."""
    plt = _plt()
    rows = list(table["rows"])
    kinds = sorted({k for r in rows for k in r["by_kind_device"] if k != "weight_copy"},
                   key=lambda k: -max(r["by_kind_device"].get(k, 0) for r in rows))
    fig, ax = plt.subplots(figsize=(8, 0.55 * len(rows) + 1.8))
    y = np.arange(len(rows))
    left = np.zeros(len(rows))
    for i, k in enumerate(kinds):
        v = np.array([r["by_kind_device"].get(k, 0) / 2**20 for r in rows])
        ax.barh(y, v, left=left, color=f"C{i % 10}", label=k)
        left += v
    for j, r in enumerate(rows):
        ax.text(left[j], j, f"  {r['memory_ratio']:.2f}x mem, {r['flops_ratio']:.2f}x FLOPs", va="center", fontsize=8)
    n_layer = table.get("model", {}).get("n_layer")
    ax.set_yticks(y, [_checkpoint_mode_label(r["mode"], n_layer).replace(" (", "\n(") for r in rows])
    ax.invert_yaxis()
    ax.set_xlim(0, left.max() * 1.45)
    ax.set_xlabel(f"peak activation MiB held for the backward pass ({table['policy']}, batch {table['batch']} x "
                  f"{table['seq_len']})")
    ax.legend(fontsize=7, loc="lower right", ncol=2)
    return _save(fig, path)
