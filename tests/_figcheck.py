"""Figures that fail at a glance, detected (issue 25, item 3): a test helper, not part of fpsim.

:func:`problems` draws a matplotlib Figure with the Agg renderer and returns one message per problem found:

* **one-colour image**: an ``imshow``/``matshow``/``pcolormesh`` whose colour-mapped pixels are effectively one
  colour: at least 98% of its finite pixels are drawn in one colour (RGBA as drawn, through the artist's norm
  and colormap, binned at 20 levels per channel) while the data of those pixels still varies (an outlier sets
  the colour scale and hides everything else), or the whole image is a single colour (a sparse mask on a uniform
  background is fine: every pixel that differs is visible);
* **legend over data**: a legend box (display coordinates) over a plotted marker or scatter point, or over more
  than 2% of the drawn length of a line or of an unfilled outline (a step histogram, ``stairs``); points clipped
  by their axes and the legend's own handles do not count, nor do ``axhline``/``axvline`` reference lines, spans,
  bars and filled areas;
* **stacked bars on a log axis**: bars of a bar container whose base is another bar's top (or whose bases
  differ from bar to bar) on a log- or symlog-scaled value axis: the lower segments swallow the upper ones;
* **curves hidden under another**: two labelled lines of one axes, with different labels, that never get further
  apart than 3/4 of the wider one's width (at least 1 pixel, at the figure's dpi) over their whole length, or two
  marker-only series whose every marker lies within half a marker of one of the other's;
* a figure that renders to one colour.

:func:`png_problems` checks PNG bytes (a saved figure) for a one-colour image. Each message names the axes (its
title, else its y label, else its number) and the artist (its label, else its kind and number).

:func:`install_ipython_hook` runs :func:`problems` inside a notebook's kernel on every figure it displays
(tests/test_notebooks.py injects the cells that call it).

Not detected: curves hidden behind a *filled* artist, legends over bars or text, images whose colour scale is
merely poor (not one colour), axis ranges that hide an effect, meaningless ticks; those still need an eye.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from typing import Any

import numpy as np

__all__ = ["png_problems", "problems"]

#: an image is "one colour" when at least this fraction of its finite pixels fall in one colour bin
ONE_COLOUR_FRACTION = 0.98
#: colour bins per channel (0..255 in steps of 256/N) used to call two pixels the same colour
COLOUR_BINS = 20
#: a legend is over a line when more than this fraction of the line's drawn length is under it
LEGEND_LINE_FRACTION = 0.02
#: two curves are one on screen when they are never further apart than this (pixels at the figure's dpi), or than
#: 3/4 of the wider line's width (half a marker for marker-only series) when that is more
OVERPLOT_PX = 1.0


# ----------------------------------------------------------------------------------------------------------
# naming
# ----------------------------------------------------------------------------------------------------------

def _axes_name(fig: Any, ax: Any) -> str:
    for loc in ("center", "left", "right"):
        t = ax.get_title(loc=loc)
        if t:
            return f"axes {t!r}"
    sup = getattr(fig, "_suptitle", None)
    where = f" of {sup.get_text()!r}" if sup is not None and sup.get_text() else ""
    if ax.get_ylabel():
        return f"axes with y label {ax.get_ylabel()!r}{where}"
    return f"axes #{fig.axes.index(ax)}{where}"


def _artist_name(artist: Any, kind: str, i: int) -> str:
    lab = artist.get_label()
    if isinstance(lab, str) and lab and not lab.startswith("_"):
        return f"{kind} {lab!r}"
    return f"{kind} #{i}"


def _data_axes(fig: Any) -> list[Any]:
    """The figure's axes, less colourbars (their solids are a ramp, not data)."""
    return [ax for ax in fig.axes if not hasattr(ax, "_colorbar") and ax.get_visible()]


def _draw(fig: Any) -> Any:
    """Draw ``fig`` with Agg (temporarily attaching an Agg canvas if it has another) and return the renderer."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = fig.canvas
    if isinstance(canvas, FigureCanvasAgg):
        canvas.draw()
        return canvas.get_renderer()
    old = canvas
    agg = FigureCanvasAgg(fig)
    try:
        agg.draw()
        return agg.get_renderer()
    finally:
        fig.set_canvas(old)


# ----------------------------------------------------------------------------------------------------------
# (a) one-colour images
# ----------------------------------------------------------------------------------------------------------

def _colour_keys(rgba: np.ndarray) -> np.ndarray:
    """An integer per pixel: its colour quantized to COLOUR_BINS levels per channel (alpha included)."""
    q = (np.asarray(rgba, dtype=np.float64).reshape(-1, 4) * (COLOUR_BINS - 1e-9)).astype(np.int64)
    q = np.clip(q, 0, COLOUR_BINS - 1)
    return ((q[:, 0] * COLOUR_BINS + q[:, 1]) * COLOUR_BINS + q[:, 2]) * COLOUR_BINS + q[:, 3]


def _one_colour(keys: np.ndarray) -> tuple[float, np.ndarray]:
    """(fraction of pixels in the most common colour bin, boolean mask of those pixels)."""
    vals, inv, counts = np.unique(keys, return_inverse=True, return_counts=True)
    top = int(np.argmax(counts))
    return counts[top] / keys.size, inv.reshape(-1) == top


def _image_artists(ax: Any) -> list[tuple[str, Any]]:
    from matplotlib.collections import PolyCollection, QuadMesh
    from matplotlib.image import AxesImage

    out: list[tuple[str, Any]] = [("image", im) for im in ax.images if isinstance(im, AxesImage)]
    for c in ax.collections:
        if isinstance(c, QuadMesh) or (type(c).__name__ == "PolyQuadMesh" and isinstance(c, PolyCollection)):
            out.append(("mesh", c))
    return [(k, a) for k, a in out if a.get_visible()]


def _image_problem(artist: Any) -> str | None:
    arr = artist.get_array()
    if arr is None:
        return None
    data = np.ma.asarray(arr)
    if data.ndim == 3 and data.shape[-1] in (3, 4):  # an RGB(A) image: its colours are its data
        px = np.ma.getdata(data).reshape(-1, data.shape[-1]).astype(np.float64)
        if px.size == 0:
            return None
        if data.dtype.kind in "ui":
            px = px / 255.0
        if px.shape[1] == 3:
            px = np.column_stack([px, np.ones(len(px))])
        frac, _ = _one_colour(_colour_keys(px))
        return f"is one colour: {100 * frac:.1f}% of its {len(px)} pixels" if frac >= 0.999 else None
    flat = np.ma.masked_invalid(data.reshape(-1).astype(np.float64))
    ok = ~np.ma.getmaskarray(flat)
    if not ok.any():
        return "has no finite pixel (all NaN/inf or masked)"
    vals = np.ma.getdata(flat)[ok]
    rgba = artist.to_rgba(vals.reshape(1, -1))  # the colours as drawn (norm, colormap, over/under colours)
    rgba = np.asarray(rgba, dtype=np.float64).reshape(-1, 4)
    drawn = rgba[:, 3] > 0  # a LogNorm masks values <= 0: they are not drawn in any colour
    if not drawn.any():
        return f"draws none of its {vals.size} finite pixels (the norm masks them all)"
    vals, rgba = vals[drawn], rgba[drawn]
    frac, top = _one_colour(_colour_keys(rgba))
    if frac < ONE_COLOUR_FRACTION:
        return None
    inside = vals[top]
    varies = inside.size > 1 and float(np.ptp(inside)) > 0
    if not varies and frac < 1.0:
        return None  # a uniform background with the few other pixels visible: the image shows all it has
    norm = artist.norm
    lo, hi = np.percentile(vals, [0.5, 99.5])
    what = (f"is effectively one colour: {100 * frac:.1f}% of its {vals.size} finite pixels fall in one of "
            f"~{COLOUR_BINS} colour bins")
    if varies:
        what += (f" though their values vary (data {vals.min():.4g} .. {vals.max():.4g}, 99% of it in "
                 f"{lo:.4g} .. {hi:.4g}; colour scale {norm.vmin:.4g} .. {norm.vmax:.4g}): set vmin/vmax from "
                 "percentiles or use a SymLogNorm/LogNorm")
    else:
        what += f" (every value is {inside[0]:.4g})"
    return what


# ----------------------------------------------------------------------------------------------------------
# (b) legend over data
# ----------------------------------------------------------------------------------------------------------

_NO_MARKER = (None, "None", "none", "", " ")
_NO_LINE = (None, "None", "none", "", " ")


def _is_data_transform(tr: Any, ax: Any) -> bool:
    try:
        return bool(tr.contains_branch(ax.transData))
    except Exception:  # pragma: no cover - exotic transforms
        return False


def _line_vertices(line: Any) -> np.ndarray:
    """The vertices of a Line2D as drawn (its draw style applied), in display coordinates, NaN-separated."""
    from matplotlib.cbook import STEP_LOOKUP_MAP

    xy = np.asarray(line.get_xydata(), dtype=np.float64)
    if xy.ndim != 2 or xy.shape[0] == 0:
        return np.empty((0, 2))
    ds = line.get_drawstyle() or "default"
    if ds != "default" and ds in STEP_LOOKUP_MAP and xy.shape[0] > 1:
        xs, ys = STEP_LOOKUP_MAP[ds](xy[:, 0], xy[:, 1])
        xy = np.column_stack([xs, ys])
    with np.errstate(all="ignore"):
        d = np.asarray(line.get_transform().transform(xy), dtype=np.float64)
    d[~np.isfinite(d).all(axis=1)] = np.nan
    return d


def _sample_polyline(v: np.ndarray, step: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Points every ``step`` pixels along a NaN-separated polyline, and the length each stands for."""
    pts: list[np.ndarray] = []
    w: list[np.ndarray] = []
    for a, b in zip(v[:-1], v[1:]):
        if not (np.isfinite(a).all() and np.isfinite(b).all()):
            continue
        L = float(np.hypot(*(b - a)))
        n = max(1, int(np.ceil(L / step)))
        t = (np.arange(n) + 0.5) / n
        pts.append(a + t[:, None] * (b - a))
        w.append(np.full(n, L / n))
    if not pts:
        return np.empty((0, 2)), np.empty(0)
    return np.concatenate(pts), np.concatenate(w)


def _inside(pts: np.ndarray, box: Any) -> np.ndarray:
    return ((pts[:, 0] > box.x0) & (pts[:, 0] < box.x1) & (pts[:, 1] > box.y0) & (pts[:, 1] < box.y1))


def _clip_box(artist: Any, ax: Any) -> Any:
    cb = artist.get_clip_box() if artist.get_clip_on() else None
    return cb if cb is not None else ax.bbox


def _patch_vertices(patch: Any) -> np.ndarray:
    """An unfilled patch's outline in display coordinates, its pieces NaN-separated."""
    with np.errstate(all="ignore"):
        tp = patch.get_transform().transform_path(patch.get_path())
    pieces = [np.asarray(q, dtype=np.float64) for q in tp.to_polygons(closed_only=False) if len(q)]
    if not pieces:
        return np.empty((0, 2))
    gap = np.full((1, 2), np.nan)
    return np.concatenate([x for q in pieces for x in (q, gap)][:-1])


def _legends(fig: Any) -> list[tuple[str, Any]]:
    out = []
    for ax in fig.axes:
        leg = ax.get_legend()
        if leg is not None and leg.get_visible():
            out.append((f"the legend of {_axes_name(fig, ax)}", leg))
    for leg in getattr(fig, "legends", []):
        if leg.get_visible():
            out.append(("the figure legend", leg))
    return out


def _legend_problems(fig: Any, renderer: Any) -> list[str]:
    from matplotlib.collections import PathCollection

    msgs = []
    for where, leg in _legends(fig):
        box = leg.get_window_extent(renderer)
        for ax in _data_axes(fig):
            for i, line in enumerate(ax.lines):
                if not line.get_visible() or line.get_alpha() == 0 or not _is_data_transform(line.get_transform(), ax):
                    continue
                v = _line_vertices(line)
                if v.size == 0:
                    continue
                clip = _clip_box(line, ax)
                name = _artist_name(line, "line", i)
                if line.get_marker() not in _NO_MARKER:
                    pts = v[np.isfinite(v).all(axis=1)]
                    pts = pts[_inside(pts, clip)]
                    n = int(_inside(pts, box).sum())
                    if n:
                        msgs.append(f"{where} covers {n} of the {len(pts)} markers of {name} in "
                                    f"{_axes_name(fig, ax)}: move it (loc=) to an empty corner or outside")
                        continue
                if line.get_linestyle() not in _NO_LINE and line.get_linewidth() > 0:
                    pts, w = _sample_polyline(v)
                    if w.sum() == 0:
                        continue
                    vis = _inside(pts, clip)
                    total = float(w[vis].sum())
                    under = float(w[vis & _inside(pts, box)].sum())
                    if total > 0 and under > LEGEND_LINE_FRACTION * total:
                        msgs.append(f"{where} covers {100 * under / total:.0f}% of the drawn length of {name} in "
                                    f"{_axes_name(fig, ax)}: move it (loc=) to an empty corner or outside")
            for i, patch in enumerate(ax.patches):  # outlines: hist(histtype="step"), stairs(), unfilled polygons
                if (patch.get_fill() or not patch.get_visible() or not patch.get_linewidth()
                        or patch.get_linestyle() in _NO_LINE or not _is_data_transform(patch.get_transform(), ax)):
                    continue
                v = _patch_vertices(patch)
                pts, w = _sample_polyline(v)
                vis = _inside(pts, _clip_box(patch, ax)) if len(pts) else np.zeros(0, dtype=bool)
                total = float(w[vis].sum()) if len(pts) else 0.0
                under = float(w[vis & _inside(pts, box)].sum()) if len(pts) else 0.0
                if total > 0 and under > LEGEND_LINE_FRACTION * total:
                    msgs.append(f"{where} covers {100 * under / total:.0f}% of the drawn length of "
                                f"{_artist_name(patch, 'outline', i)} in {_axes_name(fig, ax)}: move it (loc=) to "
                                "an empty corner or outside")
            for i, coll in enumerate(ax.collections):
                if not isinstance(coll, PathCollection) or not coll.get_visible():
                    continue
                if not _is_data_transform(coll.get_offset_transform(), ax):
                    continue
                off = np.asarray(coll.get_offsets(), dtype=np.float64)
                if off.size == 0:
                    continue
                with np.errstate(all="ignore"):
                    pts = np.asarray(coll.get_offset_transform().transform(off), dtype=np.float64)
                pts = pts[np.isfinite(pts).all(axis=1)]
                pts = pts[_inside(pts, _clip_box(coll, ax))]
                n = int(_inside(pts, box).sum())
                if n:
                    msgs.append(f"{where} covers {n} of the {len(pts)} points of "
                                f"{_artist_name(coll, 'scatter', i)} in {_axes_name(fig, ax)}: move it (loc=) to "
                                "an empty corner or outside")
    return msgs


# ----------------------------------------------------------------------------------------------------------
# (c) stacked bars on a log axis
# ----------------------------------------------------------------------------------------------------------

def _bar_problems(fig: Any, ax: Any) -> list[str]:
    from matplotlib.container import BarContainer

    msgs = []
    bars = [c for c in ax.containers if isinstance(c, BarContainer)]
    for orient, scale in (("vertical", ax.get_yscale()), ("horizontal", ax.get_xscale())):
        if scale not in ("log", "symlog"):
            continue
        rects = []  # (position lo, position hi, base, top, container index)
        for ci, c in enumerate(bars):
            if getattr(c, "orientation", "vertical") != orient:
                continue
            for r in c.patches:
                if orient == "vertical":
                    p0, p1, base, top = r.get_x(), r.get_x() + r.get_width(), r.get_y(), r.get_y() + r.get_height()
                else:
                    p0, p1, base, top = r.get_y(), r.get_y() + r.get_height(), r.get_x(), r.get_x() + r.get_width()
                rects.append((min(p0, p1), max(p0, p1), min(base, top), max(base, top), ci))
        stacked: set[int] = set()
        for a in rects:
            if a[2] == 0 or not np.isfinite(a[2]):
                continue
            for b in rects:
                if b is a or b[4] == a[4] or min(a[1], b[1]) <= max(a[0], b[0]):
                    continue  # same container, or not at the same position
                if np.isclose(b[3], a[2], rtol=1e-9, atol=0.0):
                    stacked.add(a[4])
        for ci, c in enumerate(bars):
            if getattr(c, "orientation", "vertical") != orient or ci in stacked:
                continue
            bases = [r.get_y() if orient == "vertical" else r.get_x() for r in c.patches]
            if len(set(bases)) > 1:
                stacked.add(ci)
        for ci in sorted(stacked):
            axis = "y" if orient == "vertical" else "x"
            msgs.append(f"{_axes_name(fig, ax)}: {_artist_name(bars[ci], 'bars', ci)} are stacked on a {scale} {axis} "
                        "axis (a segment's length no longer shows its value): use side-by-side bars or a linear axis")
    return msgs


# ----------------------------------------------------------------------------------------------------------
# (d) curves hidden under another
# ----------------------------------------------------------------------------------------------------------

def _dist_to_polyline(p: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Distance of each point of ``p`` to the polyline ``v`` (NaN-separated; NaN segments skipped)."""
    a, b = v[:-1], v[1:]
    ok = np.isfinite(a).all(axis=1) & np.isfinite(b).all(axis=1)
    a, b = a[ok], b[ok]
    single = v[np.isfinite(v).all(axis=1)]
    best = np.full(len(p), np.inf)
    if len(a) == 0:
        if len(single):
            for s in np.array_split(np.arange(len(p)), max(1, len(p) // 256)):
                best[s] = np.min(np.hypot(*(p[s, None, :] - single[None]).transpose(2, 0, 1)), axis=1)
        return best
    ab = b - a
    L2 = np.einsum("ij,ij->i", ab, ab)
    for s in np.array_split(np.arange(len(p)), max(1, len(p) // 128)):
        ap = p[s, None, :] - a[None]
        t = np.where(L2 > 0, np.einsum("kij,ij->ki", ap, ab) / np.where(L2 > 0, L2, 1), 0.0)
        t = np.clip(t, 0, 1)
        d = ap - t[..., None] * ab[None]
        best[s] = np.min(np.hypot(d[..., 0], d[..., 1]), axis=1)
    return best


def _visible_vertices(line: Any, ax: Any) -> np.ndarray:
    v = _line_vertices(line)
    clip = _clip_box(line, ax)
    fin = np.isfinite(v).all(axis=1)
    keep = np.zeros(len(v), dtype=bool)
    keep[fin] = _inside(v[fin], clip.expanded(1.0, 1.0) if hasattr(clip, "expanded") else clip)
    v = v.copy()
    v[~keep] = np.nan
    return v


def _overplot_problems(fig: Any, ax: Any) -> list[str]:
    lines = [(i, ln) for i, ln in enumerate(ax.lines)
             if ln.get_visible() and ln.get_alpha() != 0 and isinstance(ln.get_label(), str)
             and ln.get_label() and not ln.get_label().startswith("_") and _is_data_transform(ln.get_transform(), ax)]
    verts = {i: _visible_vertices(ln, ax) for i, ln in lines}
    px_per_pt = fig.dpi / 72.0

    def has_line(ln: Any) -> bool:
        return ln.get_linestyle() not in _NO_LINE and ln.get_linewidth() > 0

    samples = {}
    for i, ln in lines:
        fin = verts[i][np.isfinite(verts[i]).all(axis=1)]
        pts = _sample_polyline(verts[i], step=2.0)[0] if has_line(ln) else np.empty((0, 2))
        pts = np.concatenate([fin, pts]) if len(pts) else fin
        if len(pts) > 3000:
            pts = pts[np.linspace(0, len(pts) - 1, 3000).astype(int)]
        samples[i] = pts

    def tolerance(a: Any, b: Any) -> float | None:
        """How close two artists must stay to hide one another, in pixels; None: not comparable."""
        if has_line(a) and has_line(b):  # a line hides what stays within most of its width
            return max(OVERPLOT_PX, 0.75 * px_per_pt * max(a.get_linewidth(), b.get_linewidth()))
        markers = a.get_marker() not in _NO_MARKER and b.get_marker() not in _NO_MARKER
        if markers and not has_line(a) and not has_line(b):
            return max(OVERPLOT_PX, 0.5 * px_per_pt * min(a.get_markersize(), b.get_markersize()))
        return None  # a line and a marker series: the markers stay visible on the line

    def distance(a: int, pa: np.ndarray, la: Any, b: int, pb: np.ndarray) -> np.ndarray:
        if has_line(la):
            return _dist_to_polyline(pa, verts[b])
        only = np.full((len(verts[b]) * 2, 2), np.nan)  # markers: point to point (NaN rows break every segment)
        only[::2] = verts[b]
        return _dist_to_polyline(pa, only)

    msgs = []
    hidden: set[int] = set()  # lines already reported under an earlier one
    for k, (i, li) in enumerate(lines):
        if i in hidden:
            continue
        under: list[tuple[int, Any, float]] = []
        for j, lj in lines[k + 1:]:
            if li.get_label() == lj.get_label() or j in hidden:
                continue
            tol = tolerance(li, lj)
            pi, pj = samples[i], samples[j]
            if tol is None or len(pi) < 2 or len(pj) < 2:
                continue
            # cheap rejection on a few points first
            few = pi[np.linspace(0, len(pi) - 1, min(len(pi), 40)).astype(int)]
            if np.max(distance(i, few, li, j, pj)) >= tol:
                continue
            d = max(float(np.max(distance(i, pi, li, j, pj))), float(np.max(distance(j, pj, lj, i, pi))))
            if d < tol:
                hidden.add(j)
                under.append((j, lj, d))
        if under:
            names = ", ".join(_artist_name(lj, "line", j) for j, lj, _ in under)
            msgs.append(f"{_axes_name(fig, ax)}: {names} never more than {max(d for *_, d in under):.2f} px from "
                        f"{_artist_name(li, 'line', i)}: curves hidden under another (plot differences against a "
                        "reference, small multiples, markers or a zoomed inset)")
    return msgs


# ----------------------------------------------------------------------------------------------------------
# the public checks
# ----------------------------------------------------------------------------------------------------------

def problems(fig: Any, *, overplot: bool = True) -> list[str]:
    """Every detectable at-a-glance failure of matplotlib Figure ``fig`` (drawn here with Agg), one message each.

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> import matplotlib.pyplot as plt
    >>> fig, ax = plt.subplots()
    >>> _ = ax.bar([0, 1], [1, 10]); _ = ax.bar([0, 1], [100, 5], bottom=[1, 10]); ax.set_yscale("log")
    >>> [m.split(":")[0] for m in problems(fig)]
    ['axes #0']
    >>> plt.close(fig)
    """
    renderer = _draw(fig)
    msgs: list[str] = []
    for ax in _data_axes(fig):
        for i, (kind, art) in enumerate(_image_artists(ax)):
            p = _image_problem(art)
            if p:
                msgs.append(f"{_axes_name(fig, ax)}: {_artist_name(art, kind, i)} {p}")
        msgs += _bar_problems(fig, ax)
        if overplot:
            msgs += _overplot_problems(fig, ax)
    msgs += _legend_problems(fig, renderer)
    try:
        buf = np.asarray(fig.canvas.buffer_rgba())
    except Exception:  # a non-Agg canvas was restored after drawing
        buf = None
    if buf is not None and buf.size:
        frac, _ = _one_colour(_colour_keys(buf.reshape(-1, 4) / 255.0))
        if frac >= 0.9999:
            msgs.append("the figure renders to one colour")
    return msgs


def png_problems(data: bytes | bytearray | Iterable[int]) -> list[str]:
    """Problems of a PNG image given as bytes: one colour overall (a blank or failed figure).

    Examples
    --------
    >>> import io, matplotlib
    >>> matplotlib.use("Agg")
    >>> import matplotlib.pyplot as plt
    >>> fig = plt.figure(figsize=(1, 1)); b = io.BytesIO(); fig.savefig(b, format="png"); plt.close(fig)
    >>> png_problems(b.getvalue())
    ['the PNG is one colour (100.0% of its 10000 pixels)']
    """
    import matplotlib.image as mpimg

    img = np.asarray(mpimg.imread(io.BytesIO(bytes(data)), format="png"), dtype=np.float64)
    if img.ndim == 2:
        img = np.stack([img] * 3, axis=-1)
    if img.shape[-1] == 3:
        img = np.concatenate([img, np.ones(img.shape[:-1] + (1,))], axis=-1)
    if img.shape[-1] == 2:  # grey + alpha
        img = np.concatenate([img[..., :1]] * 3 + [img[..., 1:]], axis=-1)
    px = img.reshape(-1, 4)
    if px.size == 0:
        return ["the PNG has no pixel"]
    frac, _ = _one_colour(_colour_keys(px))
    return [f"the PNG is one colour ({100 * frac:.1f}% of its {len(px)} pixels)"] if frac >= 0.9999 else []


# ----------------------------------------------------------------------------------------------------------
# the notebook hook (tests/test_notebooks.py injects a cell that calls install_ipython_hook)
# ----------------------------------------------------------------------------------------------------------

#: what the hook found: [{"cell_id", "source_sha1", "execution_count", "figure", "problem"}]: the displaying cell's
#: id as the kernel got it (None when the client sends none) and the SHA-1 of its source, the shell's execution
#: count then (one ahead in some IPython versions), the figure's number in display order, the message
RECORDED: list[dict[str, Any]] = []
MARKER = "@@FIGCHECK@@"


def install_ipython_hook(shell: Any) -> None:
    """Check every matplotlib Figure the IPython ``shell`` displays, after its PNG is made, into RECORDED.

    The PNG formatter's printer for Figure is wrapped: ``plt.show()``, the inline backend's automatic display
    at the end of a cell and ``display(fig)`` all go through it. The printer's own output is returned unchanged,
    and the check runs after it, so the notebook's outputs are the same as without the hook. A figure that is
    closed without ever being displayed is not seen (nor is it seen by a student).
    """
    from matplotlib.figure import Figure

    fmts = shell.display_formatter.formatters
    fmt = fmts.get("image/png")
    try:
        printer = fmt.lookup_by_type(Figure) if fmt is not None else None
    except KeyError:
        printer = None
    if printer is None:  # another format was selected: wrap the first that prints figures
        for f in fmts.values():
            try:
                printer, fmt = f.lookup_by_type(Figure), f
                break
            except KeyError:
                continue
    if printer is None:  # nothing would be checked: say so rather than pass every notebook
        raise RuntimeError("the figure check found no figure printer to wrap: is the inline backend loaded?")
    if getattr(printer, "_figcheck", False):
        return
    import hashlib

    cell: dict[str, Any] = {"id": None, "source": None}
    numbers: dict[int, int] = {}  # id(figure) -> its number in the order first displayed

    def pre_run_cell(info: Any) -> None:
        cell["id"] = getattr(info, "cell_id", None)
        raw = getattr(info, "raw_cell", None)
        cell["source"] = hashlib.sha1(raw.encode()).hexdigest() if isinstance(raw, str) else None

    shell.events.register("pre_run_cell", pre_run_cell)

    def checked(fig: Any, *a: Any, **k: Any) -> Any:
        out = printer(fig, *a, **k)
        n = numbers.setdefault(id(fig), len(numbers) + 1)
        try:
            found = problems(fig)
        except Exception as e:  # the checker's own failure is reported, never raised into the notebook
            found = [f"the figure check itself failed: {type(e).__name__}: {e}"]
        for p in found:
            r = {"cell_id": cell["id"], "source_sha1": cell["source"], "execution_count": shell.execution_count,
                 "figure": n, "problem": p}
            if r not in RECORDED:  # the same figure displayed twice in one cell is reported once
                RECORDED.append(r)
        return out

    checked._figcheck = True  # type: ignore[attr-defined]
    fmt.for_type(Figure, checked)


def report_json() -> str:
    """The marker line the test finds in the last injected cell's output."""
    import json

    return MARKER + json.dumps(RECORDED)
