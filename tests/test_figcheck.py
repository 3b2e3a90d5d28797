"""tests/_figcheck.py, the figure check of issue 25: each detector flags a figure with its problem and passes an
ordinary one; the demo report's plots and the docs gallery's PNGs are checked (slow: a short real run)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg", force=True)
import matplotlib.pyplot as plt  # noqa: E402

from _figcheck import png_problems, problems  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def new_fig():
    """A figure factory that closes what it made."""
    made: list[Any] = []

    def make(*a: Any, **k: Any) -> tuple[Any, Any]:
        fig, ax = plt.subplots(*a, **k)
        made.append(fig)
        return fig, ax

    yield make
    for f in made:
        plt.close(f)


def _only(msgs: list[str], word: str) -> list[str]:
    return [m for m in msgs if word in m]


# --------------------------------------------------------------------------- (a) one-colour images

def test_image_with_one_outlier_is_one_colour(new_fig):
    rng = np.random.default_rng(1)
    ulps = rng.integers(-3, 4, size=(32, 32)).astype(float)
    ulps[5, 7] = -9243.0  # one outlier sets the symmetric colour scale: the rest is one grey
    lim = np.abs(ulps).max()
    fig, ax = new_fig()
    im = ax.imshow(ulps, cmap="RdBu_r", vmin=-lim, vmax=lim)
    fig.colorbar(im, ax=ax)
    ax.set_title("ulp error, fp16 machine")
    msgs = problems(fig)
    assert len(msgs) == 1 and "one colour" in msgs[0], msgs
    assert "'ulp error, fp16 machine'" in msgs[0] and "-9243" in msgs[0]


def test_image_clipped_to_its_bulk_is_fine(new_fig):
    rng = np.random.default_rng(2)
    ulps = rng.integers(-3, 4, size=(32, 32)).astype(float)
    ulps[5, 7] = -9243.0
    fig, ax = new_fig()
    im = ax.imshow(ulps, cmap="RdBu_r", vmin=-4, vmax=4)  # the outlier saturates, the rest is visible
    fig.colorbar(im, ax=ax, extend="both")
    assert problems(fig) == []


def test_healthy_colourbar_image_and_pcolormesh_are_fine(new_fig):
    rng = np.random.default_rng(3)
    fig, (a, b) = new_fig(1, 2)
    im = a.imshow(rng.normal(size=(20, 30)))
    fig.colorbar(im, ax=a)
    m = b.pcolormesh(np.add.outer(np.arange(10.0), np.arange(12.0)))
    fig.colorbar(m, ax=b)
    assert problems(fig) == []


def test_pcolormesh_and_matshow_one_colour_are_flagged(new_fig):
    z = np.zeros((10, 12))
    z[0, 0] = 1e6
    z[1:, :] += np.linspace(0, 1, 9 * 12).reshape(9, 12)
    fig, (a, b) = new_fig(1, 2)
    a.pcolormesh(z)
    b.matshow(z)
    assert len(_only(problems(fig), "one colour")) == 2


def test_constant_image_is_flagged_but_sparse_mask_is_not(new_fig):
    fig, (a, b) = new_fig(1, 2)
    a.imshow(np.full((8, 8), 3.0))
    mask = np.zeros((40, 40))
    np.fill_diagonal(mask, 1.0)  # 2.5% of the pixels: every one of them visible
    b.imshow(mask, cmap="Greys")
    msgs = problems(fig)
    assert len(msgs) == 1 and "every value is 3" in msgs[0], msgs


def test_lognorm_image_with_spread_is_fine(new_fig):
    from matplotlib.colors import LogNorm

    z = np.logspace(-6, 0, 400).reshape(20, 20)
    z[0, 0] = 1e6
    fig, ax = new_fig()
    ax.imshow(z, norm=LogNorm())
    assert problems(fig) == []


# --------------------------------------------------------------------------- (b) legend over data

def test_legend_over_markers_is_flagged(new_fig):
    x = np.linspace(0, 1, 30)
    fig, ax = new_fig()
    ax.plot(x, 0.5 + 0 * x, "o", label="flat")
    ax.legend(loc="center")
    ax.set_title("markers")
    msgs = problems(fig)
    assert len(msgs) == 1 and "legend of axes 'markers'" in msgs[0] and "'flat'" in msgs[0], msgs


def test_legend_over_a_line_is_flagged(new_fig):
    x = np.linspace(0, 10, 200)
    fig, ax = new_fig()
    ax.plot(x, x, label="diagonal")
    ax.plot(x, 10 - x, label="anti")
    ax.legend(loc="upper left")  # the anti-diagonal starts in the upper left corner
    msgs = problems(fig)
    assert any("'anti'" in m and "legend" in m for m in msgs), msgs
    assert not any("'diagonal'" in m for m in msgs), msgs


def test_legend_in_an_empty_corner_or_outside_is_fine(new_fig):
    x = np.linspace(0, 10, 200)
    fig, (a, b) = new_fig(1, 2, figsize=(10, 4))
    a.plot(x, x, "o-", ms=3, label="rising")
    a.plot(x, 0.5 * x, "s--", ms=3, label="slower")
    a.legend(loc="upper left")  # the curves start bottom left and end right: the corner is empty
    b.plot(x, np.sin(x), label="sin")
    b.plot(x, np.cos(x), label="cos")
    b.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    assert problems(fig) == []


def test_legend_over_scatter_and_on_a_twin_axes_is_flagged(new_fig):
    rng = np.random.default_rng(4)
    fig, ax = new_fig()
    ax.scatter(rng.uniform(size=400), rng.uniform(size=400), s=4, label="cloud")
    ax.legend(loc="upper right")
    assert _only(problems(fig), "points of scatter 'cloud'")
    fig2, a2 = new_fig()
    x = np.linspace(0, 1, 50)
    a2.plot(x, 0.1 + 0 * x, label="low")
    a2.legend(loc="upper right")
    t = a2.twinx()
    t.plot(x, x, "o", label="high on the twin")  # ends in the upper right, under the first axes' legend
    assert _only(problems(fig2), "'high on the twin'")


def test_legend_over_a_step_histogram_is_flagged(new_fig):
    rng = np.random.default_rng(6)
    fig, (a, b) = new_fig(1, 2)
    for ax in (a, b):
        ax.hist(rng.uniform(-10, 10, size=20000), bins=40, histtype="step", label="values")
    a.axvspan(-10, 0, alpha=0.2, label="rounds to 0")
    a.legend(loc="upper right")  # a flat-topped histogram fills the top of the axes
    b.legend(loc="lower center", bbox_to_anchor=(0.5, 1.02))  # above the axes
    msgs = problems(fig)
    assert len(msgs) == 1 and "of the drawn length of outline 'values'" in msgs[0], msgs
    assert "axes #0" in msgs[0]


def test_reference_lines_spans_and_clipped_points_do_not_count(new_fig):
    x = np.linspace(0, 1, 50)
    fig, ax = new_fig()
    ax.plot(x, x ** 2, label="data")
    ax.axhline(0.9, color="k", ls="--", label="limit")  # under the legend, but a reference line
    ax.axvspan(0.8, 1.0, alpha=0.2, label="zone")
    ax.plot(np.full(10, 5.0), np.linspace(0, 1, 10), "o", label="off screen")  # clipped, x in 5..5
    ax.set_xlim(0, 1)
    ax.legend(loc="upper left")
    assert problems(fig) == []


# --------------------------------------------------------------------------- (c) stacked bars on a log axis

def test_stacked_bars_on_log_axis_are_flagged(new_fig):
    kinds = {"weights": np.array([16.0, 4, 1]), "grads": np.array([16.0, 4, 1]), "optimizer": np.array([64.0, 16, 4])}
    fig, ax = new_fig()
    bottom = np.zeros(3)
    for k, v in kinds.items():
        ax.bar(["ZeRO-1", "ZeRO-2", "ZeRO-3"], v, bottom=bottom, label=k)
        bottom += v
    ax.set_yscale("log")
    ax.set_title("memory per GPU")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    msgs = problems(fig)
    assert len(msgs) == 2 and all("stacked on a log y axis" in m and "'memory per GPU'" in m for m in msgs), msgs
    assert "'grads'" in msgs[0] and "'optimizer'" in msgs[1]


def test_stacked_barh_on_log_x_is_flagged_linear_is_not(new_fig):
    fig, (a, b) = new_fig(1, 2)
    for ax in (a, b):
        ax.barh([0, 1], [3, 5], label="a")
        ax.barh([0, 1], [30, 2], left=[3, 5], label="b")
    a.set_xscale("log")
    msgs = problems(fig)
    assert len(msgs) == 1 and "stacked on a log x axis" in msgs[0], msgs


def test_unstacked_log_bars_are_fine(new_fig):
    fig, (a, b) = new_fig(1, 2)
    x = np.arange(4)
    a.bar(x - 0.2, [1, 10, 100, 1000], width=0.4, label="fp32")
    a.bar(x + 0.2, [2, 20, 200, 2000], width=0.4, label="bf16")
    a.set_yscale("log")
    b.bar(x, [1e-3, 1, 5, 50], bottom=1e-4)  # one common base, chosen for the log axis: not stacked
    b.set_yscale("log")
    assert problems(fig) == []


# --------------------------------------------------------------------------- (d) curves hidden under another

def test_identical_curves_are_flagged_distinct_ones_not(new_fig):
    x = np.linspace(0, 100, 400)
    y = np.exp(-x / 30)
    fig, (a, b) = new_fig(1, 2)
    a.plot(x, y, label="fp32")
    a.plot(x, y * (1 + 1e-6), ls="--", label="bf16-mixed")
    a.plot(x, y + 0.3, label="fp16-no-scaling")
    b.plot(x, y, label="fp32")
    b.plot(x, y * 0.8, label="bf16-mixed")
    msgs = problems(fig)
    assert len(msgs) == 1 and "line 'bf16-mixed' never more than" in msgs[0] and "from line 'fp32'" in msgs[0], msgs
    assert "hidden under another" in msgs[0]
    assert problems(fig, overplot=False) == []


def test_curves_within_a_line_width_and_coinciding_markers_are_flagged(new_fig):
    """06's loss panel: fp16-no-master's dotted curve 1.0 px from fp32's 1.6 pt line is hidden under it, and so
    are its held-out dots under fp32's; curves 6 px apart are not."""
    x = np.linspace(0, 1, 200)
    fig, (a, b) = new_fig(1, 2)
    for ax in (a, b):
        ax.set_ylim(0, 1)
    h = a.bbox.height
    a.plot(x, 0.2 + 0.5 * x, lw=1.6, label="fp32 (train)")
    a.plot(x, 0.2 + 0.5 * x + 1.0 / h, ":", lw=1.6, label="fp16-no-master (train)")
    a.plot(x[::50], 0.21 + 0.5 * x[::50], "o", ms=4, label="fp32 (held out)")
    a.plot(x[::50], 0.21 + 0.5 * x[::50] + 1.0 / h, "o", ms=4, label="fp16-no-master (held out)")
    b.plot(x, 0.2 + 0.5 * x, lw=1.6, label="fp32")
    b.plot(x, 0.2 + 0.5 * x + 6.0 / h, lw=1.6, label="seed 1")
    msgs = problems(fig)
    assert len(msgs) == 2, msgs
    assert "'fp16-no-master (train)' never more than" in msgs[0] and "'fp32 (train)'" in msgs[0]
    assert "'fp16-no-master (held out)' never more than" in msgs[1] and "'fp32 (held out)'" in msgs[1]


def test_a_line_and_its_unlabelled_markers_are_not_overplotting(new_fig):
    x = np.linspace(0, 1, 20)
    fig, ax = new_fig()
    ax.plot(x, x ** 2, label="curve")
    ax.plot(x, x ** 2, "o", ms=3)  # its own points, unlabelled
    ax.plot(x[-1:], x[-1:] ** 2, "o", label="final")  # one point on the curve
    assert problems(fig) == []


# --------------------------------------------------------------------------- whole figures and PNGs

def _png(fig: Any) -> bytes:
    b = io.BytesIO()
    fig.savefig(b, format="png", dpi=50)
    return b.getvalue()


def test_png_one_colour(new_fig):
    fig, ax = new_fig()
    ax.set_axis_off()
    assert png_problems(_png(fig))
    assert "renders to one colour" in " ".join(problems(fig))
    fig2, ax2 = new_fig()
    ax2.plot([0, 1], [0, 1])
    assert png_problems(_png(fig2)) == []


def test_checker_leaves_the_figure_as_it_was(new_fig):
    """problems() draws the figure but changes nothing in it: the PNG saved after is the PNG saved before."""
    rng = np.random.default_rng(5)
    fig, ax = new_fig()
    ax.plot(rng.normal(size=50), "o-", label="x")
    ax.legend(loc="center")
    before = _png(fig)
    assert problems(fig)
    assert _png(fig) == before


# --------------------------------------------------------------------------- the demo report and the gallery

@pytest.mark.slow
def test_demo_report_figures(tmp_path, monkeypatch):
    """Every plot of the demo report (fpsim/train/report.py: loss curves, gradient histogram, underflow, loss
    scale, lost updates, QAT vs PTQ, checkpointing), drawn from a 12-step run of every policy (about 20 s on an
    idle machine; 12 steps let the fast loss scaler grow once) and checked as a Figure just before report._save
    writes it, then as the PNG written."""
    from fpsim.train import report
    from fpsim.train.demo import run_demo

    seen: dict[str, list[str]] = {}
    real_save = report._save

    def checking_save(fig: Any, path: str) -> str:
        fig.tight_layout()
        seen[Path(path).stem] = problems(fig)
        return real_save(fig, path)

    monkeypatch.setattr(report, "_save", checking_save)
    run_demo(str(tmp_path), quick=True, steps=12, log=None, progress=False)
    expected = {"loss_curves", "grad_histogram", "underflow", "loss_scale", "lost_updates", "qat_vs_ptq",
                "checkpointing"}
    assert set(seen) == expected, sorted(seen)
    bad = {k: v for k, v in seen.items() if v}
    for png in sorted(tmp_path.glob("*.png")):
        if png_problems(png.read_bytes()):
            bad.setdefault(png.stem, []).extend(png_problems(png.read_bytes()))
    assert not bad, "\n".join(f"{k}: {m}" for k, v in bad.items() for m in v)


def test_gallery_pngs_are_not_one_colour():
    pngs = sorted((ROOT / "docs" / "img" / "gallery").glob("*.png"))
    assert pngs
    bad = [f"{p.name}: {m}" for p in pngs for m in png_problems(p.read_bytes())]
    assert not bad, bad


# --------------------------------------------------------------------------- the notebook wiring

@pytest.mark.slow
def test_notebook_hook_reports_each_figure_and_leaves_outputs_alone(tmp_path, monkeypatch):
    """tests/test_notebooks.py's injected cells: every displayed figure is checked (plt.show(), the inline
    backend's display at the end of a cell, display() of a closed figure, a figure as the cell's value), each
    problem is named by the committed cell that showed it, and the notebook's own outputs are the same as
    without the injected cells."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    pytest.importorskip("matplotlib_inline")
    from test_notebooks import _figcheck_problems, _with_figcheck

    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    code = [
        "import numpy as np\nimport matplotlib.pyplot as plt\nx = np.linspace(0, 1, 50)",
        "fig, ax = plt.subplots()\nz = np.zeros((20, 20)) + np.arange(20) * 1e-3\nz[0, 0] = 1e4\nax.imshow(z)\n"
        "ax.set_title('ulps')",
        "fig, ax = plt.subplots()\nax.plot(x, 0 * x + 0.5, 'o', label='a')\nax.legend(loc='center')\nplt.show()\n"
        "print('shown')",
        "fig, ax = plt.subplots()\nax.bar([0, 1], [1, 10]); ax.bar([0, 1], [5, 5], bottom=[1, 10])\n"
        "ax.set_yscale('log')\nplt.close(fig)\ndisplay(fig)",
        "fig, ax = plt.subplots()\nax.plot(x, x, label='a'); ax.plot(x, x, label='b')\nax.legend(loc='lower right')\nfig",
        "fig, ax = plt.subplots()\nax.plot(x, x, label='fine'); ax.legend(loc='upper left')",
    ]

    def notebook():
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_markdown_cell("# toy")] + [nbformat.v4.new_code_cell(c) for c in code]
        return nb

    def run(nb):
        nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                resources={"metadata": {"path": str(tmp_path)}}).execute()
        return nb

    plain = run(notebook())
    nb, first, last = _with_figcheck(notebook())
    run(nb)
    found = _figcheck_problems(nb, first, last)
    assert [f.split(":")[0] for f in found] == ["cell 2, figure 1", "cell 3, figure 2", "cell 4, figure 3",
                                                "cell 5, figure 4"], found
    assert "one colour" in found[0] and "legend" in found[1] and "stacked" in found[2] and "hidden" in found[3]

    def outputs(cells):  # execution counts and object addresses differ between any two runs
        import json
        import re

        return [re.sub(r" at 0x[0-9a-f]+", "", json.dumps(
            [{k: v for k, v in o.items() if k != "execution_count"} for o in c.outputs], sort_keys=True))
            for c in cells if c.cell_type == "code"]

    assert outputs(nb.cells[1:-1]) == outputs(plain.cells)
