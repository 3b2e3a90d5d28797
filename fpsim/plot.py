"""Teaching plots: formats, rounding, gradients and training runs, drawn with matplotlib.

Every function takes fpsim objects (formats, arrays, training histories, Tensor Core models), draws into
``ax=`` when given (otherwise a new figure), and returns the matplotlib ``Axes`` (or the ``Figure`` for
multi-panel plots). Colours come from the Okabe–Ito palette, which stays distinguishable with the common
colour-vision deficiencies; a built-in policy is drawn in its own (colour, line style) pair from
``fpsim.train.report.POLICY_STYLES`` (Paul Tol's muted scheme plus dashes, shared with ``fpsim demo``'s
plots), so it looks the same in every plot; every axis carries a label with its unit.

matplotlib is imported inside the functions, so ``import fpsim`` (and ``import fpsim.plot``) never pays
for it.

>>> import numpy as np, fpsim
>>> from fpsim import plot
>>> ax = plot.gradient_histogram(np.logspace(-10, 0, 1000), "fp16")   # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ._fpenv import ieee_mode
from .formats import Format, as_format
from .rounding import Rounding, RoundingReport, _as_float_array, analyze, as_rounding
from .rounding import round as _round

if TYPE_CHECKING:  # pragma: no cover - typing only
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "OKABE_ITO",
    "accumulation_error",
    "format_compare",
    "format_line",
    "gradient_histogram",
    "loss_curves",
    "loss_scale",
    "lost_updates",
    "rounding_error",
    "rounding_modes",
    "scaler_dynamics",
    "underflow_over_time",
]

#: The Okabe–Ito colour-blind-safe palette (Okabe & Ito, 2008), by name.
OKABE_ITO: dict[str, str] = {
    "black": "#000000",
    "orange": "#E69F00",
    "sky_blue": "#56B4E9",
    "bluish_green": "#009E73",
    "yellow": "#F0E442",
    "blue": "#0072B2",
    "vermillion": "#D55E00",
    "reddish_purple": "#CC79A7",
}
# Cycle order for series (black and yellow last: black marks references, yellow is faint on white).
_SERIES = ["blue", "orange", "bluish_green", "vermillion", "reddish_purple", "sky_blue", "black", "yellow"]

# Band colours of the gradient histogram: zero/underflow, subnormal, normal, overflow.
_BAND_COLOURS = {
    "underflow": OKABE_ITO["vermillion"],
    "subnormal": OKABE_ITO["orange"],
    "normal": OKABE_ITO["bluish_green"],
    "overflow": OKABE_ITO["reddish_purple"],
}
_BANDS = ("zero", "underflow", "subnormal", "normal", "overflow")
_BAND_LABELS = {
    "zero": "exactly 0 already",
    "underflow": "rounds to 0",
    "subnormal": "subnormal",
    "normal": "normal",
    "overflow": "overflow",
}


def colour(i: int) -> str:
    """The ``i``-th series colour of the Okabe–Ito cycle used by these plots."""
    return OKABE_ITO[_SERIES[i % len(_SERIES)]]


def _styles(labels: Sequence[str], *, policies: bool = True) -> list[tuple[str, str]]:
    """``(colour, linestyle)`` per series: a built-in policy keeps its own pair (``fpsim.train.report.POLICY_STYLES``,
    shared with the demo's plots, so a policy looks the same everywhere, each pair distinct); other labels
    (or all, with ``policies=False``) take the Okabe–Ito cycle, numbered among themselves, with a dash pattern."""
    from .train.report import POLICY_STYLES

    out, k = [], 0
    for label in labels:
        if policies and label in POLICY_STYLES:
            out.append(POLICY_STYLES[label])
        else:
            # Colours repeat every 8 series; the dash pattern shifts then, so pairs stay distinct up to 32.
            out.append((colour(k), _LINESTYLES[(k + k // len(_SERIES)) % len(_LINESTYLES)]))
            k += 1
    return out


# --------------------------------------------------------------------------------------------------
# helpers


def _new_axes(ax: Axes | None, figsize: tuple[float, float] = (7.5, 4.0)) -> Axes:
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt

    _, new = plt.subplots(figsize=figsize, layout="constrained")
    return new


def _new_axes_pair(ax: Any, figsize: tuple[float, float]) -> tuple[Figure, Axes, Axes]:
    """Two stacked panels, either new or the two Axes the caller passed in ``ax``."""
    if ax is None:
        import matplotlib.pyplot as plt

        fig, (a, b) = plt.subplots(2, 1, figsize=figsize, layout="constrained")
        return fig, a, b
    try:
        a, b = ax
    except (TypeError, ValueError):
        raise TypeError("for a two-panel plot, ax must be a sequence of two matplotlib Axes") from None
    fig = a.get_figure()
    return fig, a, b


def _values(x: Any, name: str) -> np.ndarray:
    a, _ = _as_float_array(x, name)
    return np.asarray(a, dtype=np.float64).reshape(-1)


def _log2_abs(v: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        out: np.ndarray = np.log2(np.abs(v))
    return out


def _pct(f: float) -> str:
    return f"{100.0 * f:.2f}%"


def band_fractions(report: RoundingReport, zeros: int) -> dict[str, float]:
    """The fractions the gradient histogram annotates, from an :func:`fpsim.analyze` report.

    ``underflow``, ``subnormal`` and ``overflow`` are the report's own fractions; ``zero`` is the share
    of exact zeros in the input (``zeros`` of them: they cannot appear on a log axis and are not
    underflow); ``normal`` is the rest of the non-NaN values. Without NaNs the five add up to 1.
    """
    t = report.total
    if t == 0:
        return {k: 0.0 for k in _BANDS}
    normal = t - report.underflow - report.subnormal - report.overflow - report.nan - zeros
    return {
        "zero": zeros / t,
        "underflow": report.fraction("underflow"),
        "subnormal": report.fraction("subnormal"),
        "normal": max(normal, 0) / t,
        "overflow": report.fraction("overflow"),
    }


# --------------------------------------------------------------------------------------------------
# gradients against a format's range


@ieee_mode
def gradient_histogram(
    values: Any,
    fmt: Format | str,
    *,
    scale: float | None = None,
    rounding: str = "rne",
    subnormals: bool = True,
    binwidth: float = 1.0,
    title: str | None = None,
    ax: Axes | None = None,
) -> Axes:
    """Histogram of ``log2 |values|`` over the format's zero/subnormal/normal/overflow bands.

    The classic figure of the mixed-precision training paper (Micikevicius et al., 2018): most
    activation gradients of a network sit far below FP16's normal range, and a loss scale shifts
    them right into it. The shaded bands show where values round to zero, to a subnormal, to a
    normal number, or overflow; the annotated fractions are exactly those of :func:`fpsim.analyze`
    (which decides by actually rounding, so values at the band edges are counted correctly even
    where the shading, drawn at the nominal thresholds, is approximate). Exact zeros in the input
    cannot appear on the log axis; their share is annotated separately when there are any.

    Parameters
    ----------
    values : array_like
        The values (for example one step's gradients); exact zeros are counted in the total but
        cannot appear on a log axis.
    fmt : Format or str
        The format whose range is shaded.
    scale : float, optional
        A loss scale: when given, the histogram of ``values * scale`` is drawn too ("after"),
        with its own fractions.
    rounding, subnormals
        Passed to :func:`fpsim.analyze`.
    binwidth : float
        Bin width in binades (log2 units).
    title : str, optional
        Axes title; a default names the format.
    ax : matplotlib Axes, optional
        Where to draw.

    Returns
    -------
    matplotlib.axes.Axes
        With attribute ``fpsim_fractions``: ``{"before": {band: fraction}, "after": {...}}``.
    """
    f = as_format(fmt)
    v = _values(values, "values")
    if not (isinstance(binwidth, (int, float)) and binwidth > 0 and math.isfinite(binwidth)):
        raise ValueError(f"binwidth must be a positive number of binades, got {binwidth!r}")
    series: list[tuple[str, np.ndarray]] = [("before", v)]
    if scale is not None:
        if not (isinstance(scale, (int, float, np.floating)) and math.isfinite(scale) and scale > 0):
            raise ValueError(f"scale must be a positive finite number, got {scale!r}")
        with np.errstate(over="ignore"):
            series.append(("after", v * float(scale)))

    ax = _new_axes(ax)
    # Nominal band edges in log2 units: below half the smallest subnormal values round to zero (RNE).
    lo_sub = math.log2(f.min_subnormal) - (1 if f.subnormals and subnormals else 0)
    if not (f.subnormals and subnormals):
        lo_sub = float(f.emin) - 1.0
    e_min = float(f.emin)
    e_max = math.log2(f.max)

    logs = [(_log2_abs(s[np.isfinite(s) & (s != 0)])) for _, s in series]
    finite_logs = np.concatenate(logs) if logs else np.array([])
    if finite_logs.size:
        xmin = math.floor(float(finite_logs.min()) / binwidth) * binwidth - 2 * binwidth
        xmax = math.ceil(float(finite_logs.max()) / binwidth) * binwidth + 2 * binwidth
    else:
        xmin, xmax = lo_sub - 2, e_max + 2
    # Keep a band edge in view when it is near the data, so the eye sees the boundary that matters.
    for edge in (lo_sub, e_min, e_max):
        if xmin - 6 <= edge <= xmax + 6:
            xmin, xmax = min(xmin, edge - 1), max(xmax, edge + 1)

    from matplotlib.patches import Patch

    spans = [
        ("underflow", xmin - 1e3, lo_sub),
        ("subnormal", lo_sub, e_min),
        ("normal", e_min, e_max),
        ("overflow", e_max, xmax + 1e3),
    ]
    handles: list[Any] = []
    for band, a, b in spans:
        if b <= a:
            continue
        ax.axvspan(a, b, color=_BAND_COLOURS[band], alpha=0.18, lw=0, zorder=0)
        if a < xmax and b > xmin:  # a band entirely off-screen gets no legend entry
            handles.append(Patch(color=_BAND_COLOURS[band], alpha=0.35, label=f"{f.name} {_BAND_LABELS[band]}"))

    edges = np.arange(xmin, xmax + binwidth, binwidth)
    styles = {"before": (OKABE_ITO["blue"], "-"), "after": (OKABE_ITO["black"], "--")}
    fractions: dict[str, dict[str, float]] = {}
    all_heights: list[np.ndarray] = []
    for (label, s), lg in zip(series, logs):
        total = s.size
        weights = np.full(lg.size, 100.0 / total) if total else np.zeros(0)
        name = "values" if scale is None else (label if label == "before" else f"after ×{_fmt_scale(scale)}")
        col, ls = styles[label]
        heights, _, patches = ax.hist(lg, bins=list(edges), weights=weights, histtype="step", lw=2, color=col,
                                      ls=ls, label=name)
        all_heights.append(np.asarray(heights, dtype=np.float64))
        handles.append(patches[0] if isinstance(patches, list) else patches)
        rep = analyze(s, f, rounding, subnormals=subnormals)
        fractions[label] = band_fractions(rep, int(np.count_nonzero(s == 0)))

    # Annotations: one Text per (series, band), with a gid tests and readers can find.
    y0 = 0.97
    for label, fr in fractions.items():
        head = "values" if scale is None else ("before scaling" if label == "before" else f"after ×{_fmt_scale(scale)}")
        ax.text(0.01, y0, head, transform=ax.transAxes, va="top", ha="left", fontsize=9, fontweight="bold")
        y0 -= 0.065
        for band in _BANDS:
            if band == "zero" and fr["zero"] == 0:
                continue  # most value sets have no exact zeros: keep the legend short
            ax.text(
                0.01,
                y0,
                f"{_BAND_LABELS[band]}: {_pct(fr[band])}",
                transform=ax.transAxes,
                va="top",
                ha="left",
                fontsize=9,
                color=_dark(band),
                gid=f"fraction:{label}:{band}",
                bbox={"facecolor": "white", "alpha": 0.6, "lw": 0, "pad": 0.5},
            )
            y0 -= 0.06
        y0 -= 0.02
    ax.set_xlim(xmin, xmax)
    # The band edges, labelled with their values where they are on screen: the smallest subnormal (values
    # below half of it round to 0), the smallest normal, the largest finite value.
    edge_marks = [("min_subnormal", f.min_subnormal, "min subnormal")] if f.subnormals and subnormals else []
    edge_marks += [("min_normal", f.min_normal, "min normal"), ("max", f.max, "max")]
    last_x, row = -math.inf, 0
    for key, val, what in edge_marks:
        xe = math.log2(val)
        if xmin <= xe <= xmax:
            # Edges closer than 0.3 of the axis width take turns in two rows, so their labels do not overlap.
            row = 1 - row if xe - last_x < 0.3 * (xmax - xmin) else 0
            last_x = xe
            ax.axvline(xe, color=OKABE_ITO["black"], lw=0.7, ls=":", zorder=1)
            ax.text(xe, 1.005 + 0.055 * row, f"{_edge_value(val)} ({what})", transform=ax.get_xaxis_transform(),
                    ha="center", va="bottom", fontsize=7.5, gid=f"edge:{key}")
    ax.set_xlabel("log2 |value|  (binades; 0 means 1.0)")
    ax.set_ylabel("share of values per bin (%)")
    ax.set_title(title if title is not None else f"Values against the range of {f.name}", pad=30)
    ax.legend(handles=handles, loc="upper right", fontsize=8, framealpha=0.9)
    _clear_corners(ax, edges, all_heights, handles, text_bottom=y0)
    ax.fpsim_fractions = fractions  # type: ignore[attr-defined]
    return ax


def _clear_corners(ax: Axes, edges: np.ndarray, heights: list[np.ndarray], handles: list[Any],
                   text_bottom: float) -> None:
    """Raise the y limit so no histogram bar reaches into the legend (upper right) or the fractions (upper left).

    The boxes are estimated from their font size and the axes' size in points (before any layout engine
    shrinks the axes, so with a margin): an estimate that errs on the side of more headroom.
    """
    if not heights or not any(h.size for h in heights):
        return
    centres = (edges[:-1] + edges[1:]) / 2
    x0, x1 = float(edges[0]), float(edges[-1])
    frac_x = (centres - x0) / max(x1 - x0, 1e-12)
    top = np.max(np.vstack([h for h in heights if h.size]), axis=0)
    fig: Any = ax.get_figure()
    fig = fig.figure  # the root Figure (a SubFigure's sizes are its root's; a Figure's .figure is itself)
    box = ax.get_position()
    h_pt = max(box.height * fig.get_figheight() * 72.0 * 0.85, 1.0)  # assume layout takes up to 15% more room
    w_pt = max(box.width * fig.get_figwidth() * 72.0 * 0.85, 1.0)
    labels = [str(h.get_label()) for h in handles]
    legend_h = (len(labels) * 8 * 1.45 + 12) / h_pt  # rows of 8-point text, plus the frame's padding
    legend_w = (max((len(t) for t in labels), default=0) * 8 * 0.6 + 40) / w_pt
    text_w = 0.22  # the fractions block: about 30 characters of 9-point text at the left edge
    need = float(top.max()) * 1.05
    for in_box, free_below in ((frac_x >= 1 - legend_w, 1 - legend_h - 0.03),
                               (frac_x <= text_w, text_bottom - 0.02)):
        if np.any(in_box) and free_below > 0.2:
            need = max(need, float(top[in_box].max()) / free_below)
    ax.set_ylim(0, need)


def _dark(band: str) -> str:
    # Text in the band colour is hard to read for yellow-ish bands; use black for those.
    return {"zero": OKABE_ITO["black"], "underflow": OKABE_ITO["vermillion"], "subnormal": "#8a5c00",
            "normal": "#006e50", "overflow": OKABE_ITO["reddish_purple"]}[band]


def _edge_value(v: float) -> str:
    """A band edge as it is usually quoted: ``2^-24`` for a power of two below 1, else the number (``65504``)."""
    m, e = math.frexp(v)
    return f"2^{e - 1}" if m == 0.5 and v < 1 else f"{v:g}"


def _fmt_scale(s: float) -> str:
    m, e = math.frexp(s)
    if m == 0.5:
        return f"2^{e - 1}"
    return f"{s:g}"


# --------------------------------------------------------------------------------------------------
# formats


@ieee_mode
def format_line(
    fmt: Format | str,
    *,
    scale: str = "both",
    ax: Any = None,
) -> Any:
    """The representable values of a small format on a number line, subnormals marked.

    Parameters
    ----------
    fmt : Format or str
        A format of at most 16 bits (its values are enumerated with :meth:`Format.values`).
    scale : {"both", "linear", "log"}
        ``"linear"``: every finite value on a linear axis (the gaps double at each binade);
        ``"log"``: the positive values on a log2 axis (evenly spread binades, each holding
        ``2**mbits`` values); ``"both"``: two panels.
    ax : Axes, or a pair of Axes for ``scale="both"``, optional

    Returns
    -------
    Axes for ``"linear"``/``"log"``; the Figure for ``"both"``.
    """
    f = as_format(fmt)
    if scale not in ("both", "linear", "log"):
        raise ValueError(f"scale must be one of 'both', 'linear', 'log'; got {scale!r}")
    if f.width > 16:
        raise ValueError(f"format_line enumerates formats of up to 16 bits; {f.name} has {f.width}")
    vals = f.values()
    if scale == "both":
        fig, a, b = _new_axes_pair(ax, (9.0, 4.2))
        _format_line_one(f, vals, "linear", a)
        _format_line_one(f, vals, "log", b)
        return fig
    return _format_line_one(f, vals, scale, _new_axes(ax, (9.0, 2.2)))


def _format_line_one(f: Format, vals: np.ndarray, scale: str, ax: Axes) -> Axes:
    mag = np.abs(vals)
    sub = (mag > 0) & (mag < f.min_normal)
    zero = mag == 0
    norm = ~sub & ~zero
    if scale == "log":
        keep = vals > 0
        vals, sub, zero, norm = vals[keep], sub[keep], zero[keep], norm[keep]
    style = [
        (norm, OKABE_ITO["blue"], "normal", 0.9),
        (sub, OKABE_ITO["vermillion"], "subnormal", 0.65),
        (zero, OKABE_ITO["black"], "zero", 1.0),
    ]
    lw = 1.2 if vals.size <= 300 else 0.4
    for mask, col, lab, h in style:
        if np.any(mask):
            ax.vlines(vals[mask], 0.0, h, colors=col, lw=lw, label=f"{lab} ({int(np.count_nonzero(mask))})")
    ax.axhline(0.0, color=OKABE_ITO["black"], lw=0.8)
    ax.set_ylim(-0.05, 1.25)
    ax.set_yticks([])
    n_pos = int(np.count_nonzero(vals > 0))
    if scale == "log":
        ax.set_xscale("log", base=2)
        ax.set_xlabel("value (log scale, base 2; positive values only)")
        ax.set_title(f"{f.name}: {n_pos} positive values, evenly spread per binade on a log axis")
    else:
        ax.set_xlabel("value (linear scale)")
        ax.set_title(f"{f.name}: {vals.size} finite values (max {f.max:g}, min subnormal {f.min_subnormal:g})")
    ax.legend(loc="upper left", fontsize=8, ncol=3, framealpha=0.9)
    return ax


@ieee_mode
def format_compare(fmts: Sequence[Format | str], *, ax: Axes | None = None) -> Axes:
    """Dynamic range against precision for several formats.

    Each format is a horizontal bar over ``log2 |value|``: the subnormal range lighter, the normal
    range solid, annotated with its precision ``p`` (bits, counting the implicit one) and ``eps``.

    >>> ax = format_compare(["fp32", "bf16", "fp16", "fp8_e5m2", "fp8_e4m3"])   # doctest: +SKIP
    """
    if isinstance(fmts, (str, Format)):
        raise TypeError("format_compare takes a sequence of formats, e.g. ['fp16', 'bf16']")
    fs = [as_format(x) for x in fmts]
    if not fs:
        raise ValueError("format_compare needs at least one format")
    ax = _new_axes(ax, (8.5, 0.55 * len(fs) + 1.6))
    for i, f in enumerate(fs):
        y = len(fs) - 1 - i
        lo = math.log2(f.min_subnormal)
        e_min = float(f.emin)
        hi = math.log2(f.max)
        if lo < e_min:
            ax.barh(y, e_min - lo, left=lo, height=0.6, color=OKABE_ITO["vermillion"], alpha=0.45,
                    label="subnormal range" if i == 0 else None)
        ax.barh(y, hi - e_min, left=e_min, height=0.6, color=OKABE_ITO["blue"], alpha=0.85,
                label="normal range" if i == 0 else None)
        ax.text(hi + 1.5, y, f"p = {f.p} bits, eps = 2^{-f.mbits}", va="center", fontsize=8)
    ax.set_yticks(range(len(fs)), [f.name for f in reversed(fs)])
    ax.axvline(0.0, color=OKABE_ITO["black"], lw=0.8, ls=":")
    lo_all = min(math.log2(f.min_subnormal) for f in fs)
    hi_all = max(math.log2(f.max) for f in fs)
    ax.set_xlim(lo_all - 4, hi_all + 0.35 * (hi_all - lo_all) + 8)
    ax.set_xlabel("log2 |value|  (binades; dotted line = 1.0)")
    ax.set_ylabel("format")
    ax.set_title("Dynamic range (bar) and precision (p, eps) of each format")
    ax.legend(loc="lower right", fontsize=8)
    return ax


# --------------------------------------------------------------------------------------------------
# rounding modes


@ieee_mode
def rounding_modes(
    x: float,
    fmt: Format | str,
    *,
    modes: Sequence[str] = ("rne", "rna", "rtz", "rup", "rdn", "rto", "sr"),
    samples: int = 10_000,
    seed: int = 0,
    ax: Axes | None = None,
) -> Axes:
    """Where one value goes under each rounding mode, on the format's number line.

    One row per mode: the exact ``x`` (a black tick), the two neighbouring values of the format,
    and an arrow to the result. For stochastic rounding ``samples`` draws are made and the arrows
    to both neighbours are labelled with the observed frequencies (expected: the closer neighbour
    with probability one minus the relative distance).
    """
    f = as_format(fmt)
    xv = float(_values(x, "x")[0]) if np.ndim(x) == 0 else None
    if xv is None or not math.isfinite(xv):
        raise ValueError(f"x must be one finite number, got {x!r}")
    if abs(xv) > f.max:
        raise ValueError(f"x = {xv!r} is beyond the format's max ({f.max}); pick a value inside its range")
    mode_list = [as_rounding(m) for m in modes]
    lo = float(_round(xv, f, "rdn"))
    hi = float(_round(xv, f, "rup"))
    ax = _new_axes(ax, (8.0, 0.5 * len(mode_list) + 1.6))
    gap = hi - lo if hi > lo else max(float(f.ulp(xv)), f.min_subnormal)
    left, right = lo - 0.6 * gap, hi + 0.6 * gap
    for v in (lo, hi):
        ax.axvline(v, color=OKABE_ITO["blue"], lw=1.5, zorder=1)
    ax.axvline(xv, color=OKABE_ITO["black"], lw=1.0, ls=":", zorder=1)
    rng = np.random.default_rng(seed)
    n = len(mode_list)
    for i, m in enumerate(mode_list):
        y = n - 1 - i
        if m is Rounding.SR:
            r = np.asarray(_round(np.full(samples, xv), f, m, rng=rng), dtype=np.float64)
            for target in sorted({lo, hi}):
                share = float(np.mean(r == target))
                if share > 0:
                    ax.annotate("", xy=(target, y), xytext=(xv, y),
                                arrowprops={"arrowstyle": "->", "color": OKABE_ITO["vermillion"], "lw": 1.8})
                    ax.text(target, y + 0.18, f"{100 * share:.1f}%", ha="center", fontsize=8,
                            color=OKABE_ITO["vermillion"])
        else:
            r0 = float(_round(xv, f, m))
            ax.annotate("", xy=(r0, y), xytext=(xv, y),
                        arrowprops={"arrowstyle": "->", "color": OKABE_ITO["vermillion"], "lw": 1.8})
            ax.plot([r0], [y], "o", color=OKABE_ITO["vermillion"], ms=5)
        ax.plot([xv], [y], "|", color=OKABE_ITO["black"], ms=12, mew=2)
    ax.set_yticks(range(n), [m.value for m in reversed(mode_list)])
    ax.set_ylim(-0.7, n - 0.3)
    ax.set_xlim(left, right)
    ax.set_xticks([lo, xv, hi], [f"{lo:g}", f"x = {xv:g}", f"{hi:g}"])
    ax.set_xlabel(f"value (neighbouring {f.name} values in blue, x dotted)")
    ax.set_ylabel("rounding mode")
    sr_note = f" (stochastic: {samples} draws)" if Rounding.SR in mode_list else ""
    ax.set_title(f"Rounding {xv:g} to {f.name}{sr_note}")
    return ax


# --------------------------------------------------------------------------------------------------
# rounding error


@ieee_mode
def rounding_error(
    x: Any,
    fmt: Format | str,
    rounding: str = "rne",
    *,
    kind: str = "both",
    rng: np.random.Generator | None = None,
    ax: Any = None,
) -> Any:
    """Absolute and relative rounding error against magnitude, with the textbook bounds.

    Parameters
    ----------
    x : array_like
        The exact values (float64); zero errors (exact values) and overflows cannot sit on a log
        axis and are counted in the title instead.
    fmt, rounding, rng
        As for :func:`fpsim.round`.
    kind : {"both", "abs", "rel"}
    ax : Axes, or a pair of Axes for ``kind="both"``, optional

    Returns
    -------
    Axes for ``"abs"``/``"rel"``; the Figure for ``"both"``.

    Notes
    -----
    The reference lines are ``ulp(x)/2`` (absolute) and the unit roundoff ``u = 2**-p`` (relative)
    for round-to-nearest modes; directed, round-to-odd and stochastic modes can err by a full ulp, so
    their lines are ``ulp(x)`` and ``2**(1-p)``.
    """
    f = as_format(fmt)
    mode = as_rounding(rounding)
    if kind not in ("both", "abs", "rel"):
        raise ValueError(f"kind must be one of 'both', 'abs', 'rel'; got {kind!r}")
    a = _values(x, "x")
    r = np.asarray(_round(a, f, mode, rng=rng), dtype=np.float64).reshape(-1)
    # Overflow as fpsim.analyze counts it: a finite input that became non-finite or was clamped to ±max.
    over = np.isfinite(a) & (~np.isfinite(r) | ((np.abs(r) == f.max) & (np.abs(a) > f.max)))
    ok = np.isfinite(a) & ~over & (a != 0)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(r - a)
    nearest = mode in (Rounding.RNE, Rounding.RNA)
    stats = {
        "exact": int(np.count_nonzero(ok & (err == 0))),
        "not finite": int(np.count_nonzero(over)),
    }
    show = ok & (err > 0)
    mag, e = np.abs(a[show]), err[show]
    note = f"{f.name}, {mode.value}: {int(np.count_nonzero(show))} inexact shown, {stats['exact']} exact"
    if stats["not finite"]:
        note += f", {stats['not finite']} overflowed"
    if kind == "both":
        fig, p, q = _new_axes_pair(ax, (8.0, 6.5))
        _err_panel(f, mag, e, "abs", nearest, p, note)
        _err_panel(f, mag, e / mag, "rel", nearest, q, None)
        return fig
    axx = _new_axes(ax, (8.0, 3.6))
    return _err_panel(f, mag, e if kind == "abs" else e / mag, kind, nearest, axx, note)


def _err_panel(f: Format, mag: np.ndarray, y: np.ndarray, kind: str, nearest: bool, ax: Axes,
               title: str | None) -> Axes:
    ax.scatter(mag, y, s=6, color=OKABE_ITO["blue"], alpha=0.6, lw=0, label="observed error")
    if mag.size:
        grid = np.geomspace(mag.min(), mag.max(), 512)
        if kind == "abs":
            bound = np.asarray(f.ulp(grid), dtype=np.float64) * (0.5 if nearest else 1.0)
            ax.step(grid, bound, where="post", color=OKABE_ITO["vermillion"], lw=1.5,
                    label="ulp(x)/2" if nearest else "ulp(x)")
        else:
            u = f.eps / 2 if nearest else f.eps  # unit roundoff 2**-p, or a full 2**(1-p)
            ax.axhline(u, color=OKABE_ITO["vermillion"], lw=1.5,
                       label=f"u = 2^{-f.p}" if nearest else f"2^{1 - f.p}")
            ax.axvline(f.min_normal, color=OKABE_ITO["black"], lw=0.8, ls=":", label="min normal")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.legend(loc="best", fontsize=8)
    ax.set_xlabel("|x|  (log scale, base 2)")
    ax.set_ylabel("|round(x) − x|  (same unit as x)" if kind == "abs" else "|round(x) − x| / |x|  (dimensionless)")
    if title:
        ax.set_title(title)
    return ax


# --------------------------------------------------------------------------------------------------
# training histories (fpsim.train.History, or its plain dict of per-step lists)


def _as_mapping(history: Any) -> Mapping[str, Any]:
    if isinstance(history, Mapping):
        return history
    for attr in ("to_dict", "as_dict", "data"):
        obj = getattr(history, attr, None)
        if obj is not None:
            obj = obj() if callable(obj) else obj
            if isinstance(obj, Mapping):
                return obj
    raise TypeError(f"expected a training history (fpsim.train.History or a dict of per-step lists), "
                    f"got {type(history).__name__}")


def _is_history(obj: Any) -> bool:
    try:
        return "step" in _as_mapping(obj)
    except TypeError:
        return False


def _runs(histories: Any) -> list[tuple[str, Mapping[str, Any]]]:
    """``label -> history`` pairs from one history, a mapping of them, or a sequence of them."""
    if _is_history(histories):
        return [("run", _as_mapping(histories))]
    if isinstance(histories, Mapping):
        out = [(str(k), _as_mapping(v)) for k, v in histories.items()]
    elif isinstance(histories, Sequence) and not isinstance(histories, str):
        out = [(f"run {i}", _as_mapping(h)) for i, h in enumerate(histories)]
    else:
        raise TypeError(f"expected a training history or a mapping label -> history, got {type(histories).__name__}")
    if not out:
        raise ValueError("no training histories given")
    return out


def _series(h: Mapping[str, Any], key: str) -> np.ndarray:
    if key not in h or h[key] is None:
        have = ", ".join(sorted(str(k) for k in h))
        raise ValueError(f"the history has no {key!r} series; it has: {have}")
    return np.asarray(h[key], dtype=np.float64)


def _steps(h: Mapping[str, Any], n: int) -> np.ndarray:
    if "step" in h and len(h["step"]) == n:
        return np.asarray(h["step"], dtype=np.float64)
    return np.arange(n, dtype=np.float64)


def _moving_average(y: np.ndarray, window: int) -> np.ndarray:
    if window <= 1 or y.size < window:
        return y
    ok = np.isfinite(y)
    c = np.convolve(np.where(ok, y, 0.0), np.ones(window), mode="valid")
    n = np.convolve(ok.astype(np.float64), np.ones(window), mode="valid")
    with np.errstate(invalid="ignore", divide="ignore"):
        m = c / n
    m[n < window] = np.nan  # a window touching a non-finite value is not finite either
    return np.concatenate([np.full(window - 1, np.nan), m])


_LINESTYLES = ["-", "--", "-.", ":"]


@ieee_mode
def loss_curves(histories: Any, *, smooth: int = 1, eval: bool = True, logy: bool = False,
                ax: Axes | None = None) -> Axes:
    """Training loss against step for one or several runs (``{label: history}``).

    A run whose loss becomes non-finite (diverged) is marked with a cross at the first such step.

    Parameters
    ----------
    histories : History, or a mapping ``label -> History`` (or a sequence of them)
    smooth : int
        Moving-average window (steps) for the training loss; 1 = raw.
    eval : bool
        Also mark the held-out ``eval_loss`` points when the history has them.
    logy : bool
        Log-scale loss axis.
    ax : Axes, optional
    """
    runs = _runs(histories)
    ax = _new_axes(ax)
    styles = _styles([label for label, _ in runs])
    for i, (label, h) in enumerate(runs):
        y = _series(h, "loss")
        x = _steps(h, y.size)
        c, ls = styles[i]
        ax.plot(x, _moving_average(y, int(smooth)), color=c, lw=1.6, ls=ls, label=f"{label} (train)")
        if eval and h.get("eval_step"):
            ex = np.asarray(h["eval_step"], dtype=np.float64)
            ey = np.asarray(h["eval_loss"], dtype=np.float64)
            ax.plot(ex, ey, "o", color=c, ms=5, mec="white", mew=0.8, label=f"{label} (held out)")
        bad = ~np.isfinite(y)
        if np.any(bad):
            j = int(np.argmax(bad))
            fin = y[:j][np.isfinite(y[:j])]
            yv = float(fin[-1]) if fin.size else 0.0
            ax.plot([x[j]], [yv], marker="x", ms=10, mew=2.5, color=c, ls="none")
            ax.annotate(f"{label}: non-finite from step {int(x[j])}", (x[j], yv), textcoords="offset points",
                        xytext=(5, 8), fontsize=8, color=c)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel("training step")
    ax.set_ylabel("cross-entropy loss (nats per token)")
    ax.set_title("Training loss" + (f" (moving average over {smooth} steps)" if smooth > 1 else ""))
    ax.legend(fontsize=8)
    return ax


@ieee_mode
def loss_scale(histories: Any, *, ax: Axes | None = None) -> Axes:
    """The loss scale against step (log2 axis) for one or several runs, skipped (overflow) steps marked."""
    runs = _runs(histories)
    ax = _new_axes(ax)
    styles = _styles([label for label, _ in runs])
    for i, (label, h) in enumerate(runs):
        s = _series(h, "loss_scale")
        x = _steps(h, s.size)
        c, ls = styles[i]
        ax.step(x, s, where="post", color=c, lw=1.8, ls=ls, label=f"{label}: loss scale")
        if "skipped" in h:
            sk = np.asarray(h["skipped"], dtype=bool)
            if sk.size == s.size and np.any(sk):
                ax.plot(x[sk], s[sk], "v", color=c, mec=OKABE_ITO["black"], mew=0.5, ms=7, ls="none",
                        label=f"{label}: skipped step (overflow), {int(sk.sum())}×")
    ax.set_yscale("log", base=2)
    ax.set_xlabel("training step")
    ax.set_ylabel("loss scale (log scale, base 2)")
    ax.set_title("Loss scale and skipped steps")
    ax.legend(fontsize=8)
    return ax


@ieee_mode
def scaler_dynamics(history: Any, fmt: Format | str = "fp16", *, label: str | None = None, ax: Any = None) -> Any:
    """A dynamic loss scaler at work in one run: the scale per step (top) and the largest scaled gradient
    against the format's maximum on the same log2 axis (bottom), overflows (skipped steps) marked on both.

    Reads the history's ``loss_scale``, ``skipped`` and ``grad_amax`` (largest |gradient| of the step, loss
    scale included). Each growth (after ``growth_interval`` clean steps) is a step up of the top curve; each
    overflow is a gradient maximum above ``fmt.max`` in the bottom panel, a skipped step and a backoff.

    Parameters
    ----------
    history : History or dict of per-step lists
    fmt : Format or str
        The gradient format whose maximum is the overflow line (65504 for fp16).
    label : str, optional
        Names the run in the legends.
    ax : a pair of Axes, optional

    Returns
    -------
    matplotlib.figure.Figure
        With attribute ``fpsim_events``: ``{"growths": [steps], "overflows": [steps]}`` (a growth is a step
        whose scale is larger than the previous step's; an overflow a skipped step).
    """
    f = as_format(fmt)
    h = _as_mapping(history)
    s = _series(h, "loss_scale")
    amax = _series(h, "grad_amax")
    sk = np.asarray(h.get("skipped", np.zeros(s.size, dtype=bool)), dtype=bool)
    if not (amax.size == s.size == sk.size):
        raise ValueError(f"loss_scale, grad_amax and skipped must have one entry per step; got {s.size}, "
                         f"{amax.size}, {sk.size}")
    x = _steps(h, s.size)
    name = "run" if label is None else str(label)
    fig, a, b = _new_axes_pair(ax, (9.0, 6.0))
    growths = [int(x[j]) for j in range(1, s.size) if s[j] > s[j - 1]]
    over = [int(v) for v in x[sk]]
    a.step(x, s, where="post", color=OKABE_ITO["blue"], lw=1.8, label=f"{name}: loss scale")
    if growths:
        gi = np.isin(x, growths)
        a.plot(x[gi], s[gi], "^", color=OKABE_ITO["bluish_green"], ms=6, ls="none",
               label=f"growth ×{_ratio_text(s, gi)} after clean steps: {len(growths)}×")
    if over:
        a.plot(x[sk], s[sk], "v", color=OKABE_ITO["vermillion"], mec=OKABE_ITO["black"], mew=0.5, ms=7, ls="none",
               label=f"overflow: step skipped, scale backs off ({len(over)}×)")
    a.set_yscale("log", base=2)
    a.set_ylabel("loss scale (log2 axis)")
    a.set_title(f"Dynamic loss scaling: {len(growths)} growths, {len(over)} overflows (skipped steps)")
    a.legend(fontsize=8, loc="lower right")
    ok = np.isfinite(amax) & (amax > 0)
    b.plot(x[ok], amax[ok], color=OKABE_ITO["blue"], lw=1.4, label=f"{name}: max |gradient × scale| per step")
    if over:
        b.plot(x[sk & ok], amax[sk & ok], "v", color=OKABE_ITO["vermillion"], mec=OKABE_ITO["black"], mew=0.5,
               ms=7, ls="none", label="overflow (skipped step)")
    b.axhline(f.max, color=OKABE_ITO["vermillion"], lw=1.2, ls="--",
              label=f"{f.name} max {_edge_value(f.max)}: larger values overflow")
    b.set_yscale("log", base=2)
    b.set_xlabel("training step")
    b.set_ylabel("largest |scaled gradient| (log2 axis)")
    b.legend(fontsize=8, loc="lower right")
    if ax is None:
        b.sharex(a)
    fig.fpsim_events = {"growths": growths, "overflows": over}  # type: ignore[attr-defined]
    return fig


def _ratio_text(s: np.ndarray, grew: np.ndarray) -> str:
    idx = np.nonzero(grew)[0]
    r = {float(s[j] / s[j - 1]) for j in idx if j > 0}
    return f"{r.pop():g}" if len(r) == 1 else "factor"


@ieee_mode
def underflow_over_time(histories: Any, *, sites: Sequence[str] | None = None, subnormal: bool = False,
                        smooth: int = 1, ax: Axes | None = None) -> Axes:
    """Percentage of nonzero gradient values that underflow to zero in the gradient format, per step.

    Parameters
    ----------
    histories : History, or a mapping ``label -> History``
        Each run's ``grad_underflow_fraction`` (over all gradient casts of the step) is drawn.
    sites : sequence of str, optional
        For a single run: draw these tensors' own ``underflow_fraction`` instead (``history["tensors"]``
        keys such as ``"blocks.0.mlp.fc.dy"``).
    subnormal : bool
        Also draw the share that became subnormal (thin and faint, same colour and line style).
    smooth : int
        Moving-average window in steps.
    """
    runs = _runs(histories)
    ax = _new_axes(ax)
    curves: list[tuple[str, Mapping[str, Any], np.ndarray, np.ndarray | None]] = []
    if sites is not None:
        if len(runs) != 1:
            raise ValueError("sites= selects tensors of one run; pass a single history")
        h = runs[0][1]
        tensors = h.get("tensors", {})
        for site in sites:
            if site not in tensors:
                raise ValueError(f"no tensor site {site!r} in the history; it has: {', '.join(sorted(tensors))}")
            t = tensors[site]
            sub = np.asarray(t["subnormal_fraction"], dtype=np.float64) if subnormal else None
            curves.append((site, h, np.asarray(t["underflow_fraction"], dtype=np.float64), sub))
    else:
        for label, h in runs:
            sub = _series(h, "grad_subnormal_fraction") if subnormal else None
            curves.append((label, h, _series(h, "grad_underflow_fraction"), sub))
    styles = _styles([c[0] for c in curves], policies=sites is None)
    for i, (label, h, y, sub) in enumerate(curves):
        x = _steps(h, len(h["step"]))[: y.size]
        ok = np.isfinite(y)
        c, ls = styles[i]
        ax.plot(x[ok], 100.0 * _moving_average(y[ok], int(smooth)), color=c, lw=1.6, ls=ls,
                label=f"{label}: underflow to 0")
        if sub is not None:
            ok2 = np.isfinite(sub)
            ax.plot(x[: sub.size][ok2], 100.0 * _moving_average(sub[ok2], int(smooth)), color=c, lw=1.0, ls=ls,
                    alpha=0.55,
                    label=f"{label}: subnormal")
    ax.set_xlabel("training step")
    ax.set_ylabel("nonzero gradient values (%)")
    ax.set_title("Gradient values lost to underflow")
    ax.legend(fontsize=8)
    return ax


@ieee_mode
def lost_updates(histories: Any, *, weights: Sequence[str] | None = None, smooth: int = 1,
                 ax: Axes | None = None) -> Axes:
    """Percentage of nonzero weight updates that left the stored weight unchanged, per step.

    An update smaller than half an ulp of the weight is rounded away: the reason for FP32 master weights.
    ``weights`` selects per-parameter series (``history["by_weight"]`` keys) of a single run instead of
    the run totals (``lost_update_fraction``).
    """
    runs = _runs(histories)
    ax = _new_axes(ax)
    curves: list[tuple[str, Mapping[str, Any], np.ndarray]] = []
    if weights is not None:
        if len(runs) != 1:
            raise ValueError("weights= selects parameters of one run; pass a single history")
        h = runs[0][1]
        lost = h.get("by_weight", h.get("lost", {}))  # "lost" in early History versions
        for w in weights:
            if w not in lost:
                raise ValueError(f"no weight {w!r} in the history; it has: {', '.join(sorted(lost))}")
            curves.append((w, h, np.asarray(lost[w], dtype=np.float64)))
    else:
        curves = [(label, h, _series(h, "lost_update_fraction")) for label, h in runs]
    styles = _styles([c[0] for c in curves], policies=weights is None)
    for i, (label, h, y) in enumerate(curves):
        x = _steps(h, len(h["step"]))[: y.size]
        ok = np.isfinite(y)
        c, ls = styles[i]
        ax.plot(x[ok], 100.0 * _moving_average(y[ok], int(smooth)), color=c, lw=1.6, ls=ls, label=label)
    ax.set_xlabel("training step")
    ax.set_ylabel("nonzero weight updates lost to rounding (%)")
    ax.set_title("Weight updates swallowed by rounding")
    ax.legend(fontsize=8)
    return ax


# --------------------------------------------------------------------------------------------------
# Tensor Core accumulation


@ieee_mode
def accumulation_error(
    models: Sequence[Any] | Mapping[str, Any],
    K: Sequence[int],
    *,
    trials: int = 8,
    dist: str = "uniform",
    seed: int = 0,
    ax: Axes | None = None,
) -> Axes:
    """Relative error of a length-``K`` dot product against ``K`` for several :mod:`fpsim.mma` models.

    For each ``K``, ``trials`` random vector pairs are drawn once (seeded), rounded (RNE) to each model's
    input format, multiplied by :func:`fpsim.mma.dot` under that model, and compared with the exact dot
    product of the same rounded inputs (``math.fsum`` of the exact float64 products). The median relative
    error over trials is drawn against ``K`` on log–log axes, with the fp32 unit roundoff ``2^-24`` as a
    reference. Results with zero error cannot sit on a log axis and are left out of the median's plot.

    Parameters
    ----------
    models : sequence or mapping
        :class:`fpsim.mma.MMAModel` objects or model strings (``"exact"``, ``"h100:fp16"``); a mapping
        gives ``label -> model``.
    K : sequence of int
        Dot-product lengths.
    trials : int
        Random vector pairs per ``K``.
    dist : {"uniform", "normal"}
        ``"uniform"``: entries in [0, 1) (no cancellation: truncation errors accumulate with one sign);
        ``"normal"``: standard normal entries.
    seed : int
    ax : Axes, optional

    Returns
    -------
    Axes
        With attribute ``fpsim_errors``: ``{label: median relative error per K}``.
    """
    from . import mma

    if isinstance(models, Mapping):
        items = [(str(k), mma.as_model(v)) for k, v in models.items()]
    else:
        if isinstance(models, (str, mma.MMAModel)):
            raise TypeError("accumulation_error takes a sequence of models, e.g. ['exact', 'h100:fp16']")
        items = [(m.name, m) for m in (mma.as_model(x) for x in models)]
    if not items:
        raise ValueError("accumulation_error needs at least one model")
    ks = [int(k) for k in K]
    if not ks or any(k < 1 for k in ks):
        raise ValueError(f"K must be a non-empty sequence of positive lengths, got {list(K)!r}")
    if not (isinstance(trials, int) and trials >= 1):
        raise ValueError(f"trials must be a positive int, got {trials!r}")
    if dist not in ("uniform", "normal"):
        raise ValueError(f"dist must be 'uniform' or 'normal', got {dist!r}")
    rng = np.random.default_rng(seed)
    draws = {}
    for k in ks:
        if dist == "uniform":
            draws[k] = (rng.random((trials, k)), rng.random((trials, k)))
        else:
            draws[k] = (rng.standard_normal((trials, k)), rng.standard_normal((trials, k)))
    ax = _new_axes(ax)
    errors: dict[str, np.ndarray] = {}
    for i, (label, m) in enumerate(items):
        med = np.empty(len(ks))
        for j, k in enumerate(ks):
            a = np.asarray(_round(draws[k][0], m.input), dtype=np.float64)
            b = np.asarray(_round(draws[k][1], m.input), dtype=np.float64)
            d = np.asarray(mma.dot(a, b, 0.0, m), dtype=np.float64)
            exact = np.array([math.fsum(row) for row in a * b])  # products of <= 26-bit inputs are exact
            with np.errstate(divide="ignore", invalid="ignore"):
                rel = np.abs(d - exact) / np.abs(exact)
            med[j] = float(np.median(rel))
        errors[label] = med
        shown = np.where(med > 0, med, np.nan)
        ax.plot(ks, shown, marker="os^vDP*X"[i % 8], color=colour(i), lw=1.8, ms=5, label=label,
                ls=_LINESTYLES[i % 4])
    ax.axhline(2.0**-24, color=OKABE_ITO["black"], lw=0.8, ls=":", label="fp32 unit roundoff 2^-24")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("K (dot-product length, log scale)")
    ax.set_ylabel("median relative error |D − exact| / |exact|")
    ax.set_title(f"Dot-product error against K ({dist} inputs, {trials} trials per K)")
    ax.legend(fontsize=8)
    ax.fpsim_errors = errors  # type: ignore[attr-defined]
    return ax
