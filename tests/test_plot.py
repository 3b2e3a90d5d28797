"""fpsim.plot: every plot renders with Agg, carries its labels, and annotates fpsim.analyze's fractions."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
import matplotlib.pyplot as plt

import fpsim
from fpsim import plot


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _render(obj) -> None:
    fig = obj if hasattr(obj, "savefig") else obj.get_figure()
    fig.canvas.draw()  # Agg: a real render, not just artist creation


def _gradients(n: int = 20_000, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    g = rng.standard_normal(n) * 2.0 ** rng.uniform(-40, 4, n)
    g[:50] = 0.0  # exact zeros count in the total but not on the log axis
    g[50:60] = 1e6  # overflow for fp16
    return g


def _annotated(ax, series: str) -> dict[str, str]:
    out = {}
    for t in ax.texts:
        gid = t.get_gid() or ""
        m = re.fullmatch(rf"fraction:{series}:(\w+)", gid)
        if m:
            pct = re.search(r"([0-9.]+)%", t.get_text())
            assert pct, t.get_text()
            out[m.group(1)] = pct.group(1)
    return out


def _expected(values: np.ndarray, fmt: str, **kw) -> dict[str, str]:
    r = fpsim.analyze(values, fmt, **kw)
    zeros = int(np.count_nonzero(values == 0))
    normal = r.total - r.underflow - r.subnormal - r.overflow - r.nan - zeros
    # Percentages with two decimals, as annotated (the zero line only when there are exact zeros).
    out = {"zero": f"{100 * zeros / r.total:.2f}"} if zeros else {}
    return out | {
        "underflow": f"{100 * r.fraction('underflow'):.2f}",
        "subnormal": f"{100 * r.fraction('subnormal'):.2f}",
        "normal": f"{100 * normal / r.total:.2f}",
        "overflow": f"{100 * r.fraction('overflow'):.2f}",
    }


@pytest.mark.parametrize("fmt", ["fp16", "bf16", "fp8_e4m3", "fp8_e5m2"])
def test_gradient_histogram_fractions_match_analyze(fmt):
    g = _gradients()
    ax = plot.gradient_histogram(g, fmt)
    _render(ax)
    assert _annotated(ax, "before") == _expected(g, fmt)
    assert "log2" in ax.get_xlabel() and "%" in ax.get_ylabel()
    assert fmt in ax.get_title()


def test_gradient_histogram_loss_scale_before_after():
    g = _gradients()
    ax = plot.gradient_histogram(g, "fp16", scale=2.0**14)
    _render(ax)
    assert _annotated(ax, "before") == _expected(g, "fp16")
    assert _annotated(ax, "after") == _expected(g * 2.0**14, "fp16")
    # The whole point of the figure: scaling moves values out of the underflow band.
    assert float(_annotated(ax, "after")["underflow"]) < float(_annotated(ax, "before")["underflow"])
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("2^14" in s for s in labels) and any("before" in s for s in labels)


def test_gradient_histogram_options_and_ax():
    g = _gradients(2000)
    _, ax = plt.subplots()
    out = plot.gradient_histogram(g, fpsim.fp16, rounding="rtz", subnormals=False, ax=ax, binwidth=0.5)
    assert out is ax
    _render(ax)
    assert _annotated(ax, "before") == _expected(g, "fp16", rounding="rtz", subnormals=False)
    assert _annotated(ax, "before")["subnormal"] == "0.00"


def test_gradient_histogram_fractions_add_up():
    g = _gradients()
    ax = plot.gradient_histogram(g, "fp16")
    fr = ax.fpsim_fractions["before"]
    assert set(fr) == {"zero", "underflow", "subnormal", "normal", "overflow"}
    assert abs(sum(fr.values()) - 1.0) < 1e-12
    assert fr["zero"] == 50 / g.size
    # Without exact zeros, no zero line is drawn.
    ax2 = plot.gradient_histogram(g[g != 0], "fp16")
    assert "zero" not in _annotated(ax2, "before")


@pytest.mark.parametrize("bad", [{"scale": -1.0}, {"scale": float("inf")}, {"binwidth": 0}])
def test_gradient_histogram_rejects_bad_options(bad):
    with pytest.raises(ValueError):
        plot.gradient_histogram([1.0, 2.0], "fp16", **bad)


def test_gradient_histogram_rejects_bad_input():
    with pytest.raises(TypeError):
        plot.gradient_histogram(["a"], "fp16")
    with pytest.raises(ValueError, match="fp99"):
        plot.gradient_histogram([1.0], "fp99")


def test_gradient_histogram_does_not_modify_input():
    g = _gradients(1000)
    before = g.copy()
    plot.gradient_histogram(g, "fp16", scale=1024.0)
    np.testing.assert_array_equal(g, before)


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_e5m2", "fp4_e2m1", "fp6_e3m2"])
def test_format_line_both_panels(fmt):
    f = fpsim.as_format(fmt)
    fig = plot.format_line(fmt)
    _render(fig)
    lin, log = fig.axes[:2]
    assert "linear" in lin.get_xlabel() and "log" in log.get_xlabel()
    assert log.get_xscale() == "log"
    # Every finite value is drawn, subnormals separately and counted in the legend.
    n_sub = int(np.count_nonzero((np.abs(f.values()) > 0) & (np.abs(f.values()) < f.min_normal)))
    legend = " ".join(t.get_text() for t in lin.get_legend().get_texts())
    assert f"subnormal ({n_sub})" in legend
    n_drawn = sum(len(c.get_segments()) for c in lin.collections)
    assert n_drawn == f.values().size


def test_format_line_single_panel_and_errors():
    _, ax = plt.subplots()
    assert plot.format_line("fp8_e4m3", scale="log", ax=ax) is ax
    with pytest.raises(ValueError, match="scale"):
        plot.format_line("fp8_e4m3", scale="loglog")
    with pytest.raises(ValueError, match="16 bits"):
        plot.format_line("fp32")
    with pytest.raises(TypeError):
        plot.format_line("fp8_e4m3", ax=ax)  # "both" needs two Axes


def test_format_compare():
    names = ["fp32", "bf16", "fp16", "fp8_e5m2", "fp8_e4m3"]
    ax = plot.format_compare(names)
    _render(ax)
    assert [t.get_text() for t in ax.get_yticklabels()] == list(reversed(names))
    texts = " ".join(t.get_text() for t in ax.texts)
    assert "p = 8 bits" in texts and "p = 11 bits" in texts
    assert "log2" in ax.get_xlabel()
    with pytest.raises(TypeError):
        plot.format_compare("fp16")
    with pytest.raises(ValueError):
        plot.format_compare([])


@pytest.mark.parametrize("mode", ["rne", "rtz", "sr"])
def test_rounding_error(mode):
    x = np.geomspace(1e-9, 1e6, 500)
    fig = plot.rounding_error(x, "fp16", mode, rng=np.random.default_rng(1))
    _render(fig)
    a, r = fig.axes[:2]
    assert "|round(x) − x|" in a.get_ylabel() and "/ |x|" in r.get_ylabel()
    assert a.get_xscale() == "log"
    rep = fpsim.analyze(x, "fp16", mode, rng=np.random.default_rng(1))
    assert f"{rep.overflow} overflowed" in a.get_title()
    # Observed relative errors of normal results respect the bound drawn.
    pts = r.collections[0].get_offsets()
    normal = pts[:, 0] >= fpsim.fp16.min_normal
    bound = 2.0**-11 if mode == "rne" else 2.0**-10
    assert np.all(pts[normal, 1] <= bound)


def test_rounding_error_single_kind():
    ax = plot.rounding_error([0.1, 0.2, 0.3], "bf16", kind="rel")
    assert "/ |x|" in ax.get_ylabel()
    with pytest.raises(ValueError, match="kind"):
        plot.rounding_error([0.1], "bf16", kind="ulp")


def test_import_fpsim_does_not_import_matplotlib():
    code = "import sys, fpsim, fpsim.plot; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_palette_is_okabe_ito():
    assert set(plot.OKABE_ITO.values()) == {
        "#000000", "#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7",
    }


def test_rounding_modes_arrows_match_fpsim_round():
    ax = plot.rounding_modes(2.3, "fp4_e2m1")
    _render(ax)
    rows = [t.get_text() for t in ax.get_yticklabels()]
    assert rows == ["sr", "rto", "rdn", "rup", "rtz", "rna", "rne"]
    # Each deterministic row's marker sits at fpsim.round's result (row y is labelled rows[y]).
    for line in ax.lines:
        xs, ys = line.get_data()
        if line.get_marker() == "o":
            mode = rows[int(ys[0])]
            assert xs[0] == float(fpsim.round(2.3, "fp4_e2m1", mode)), mode
    # Stochastic rounding: 30% up (2.3 is 0.3 of the way from 2 to 3), measured over 10,000 draws.
    pct = sorted(float(t.get_text().rstrip("%")) for t in ax.texts if t.get_text().endswith("%"))
    assert len(pct) == 2 and abs(pct[0] - 30.0) < 2.0 and abs(sum(pct) - 100.0) < 1e-9
    assert "rounding mode" in ax.get_ylabel()


def test_rounding_modes_rejects_bad_x():
    with pytest.raises(ValueError):
        plot.rounding_modes(float("nan"), "fp16")
    with pytest.raises(ValueError, match="max"):
        plot.rounding_modes(1e9, "fp16")


def test_accumulation_error():
    mma = pytest.importorskip("fpsim.mma")
    models = {"exact": "exact", "V100 fp16": mma.get_model("v100", "fp16"), "H100 fp8": mma.get_model("h100", "fp8_e4m3")}
    Ks = [16, 128, 1024]
    ax = plot.accumulation_error(models, Ks, trials=4, seed=3)
    _render(ax)
    assert [t.get_text() for t in ax.get_legend().get_texts()][:3] == list(models)
    assert "K" in ax.get_xlabel() and "relative error" in ax.get_ylabel()
    errs = ax.fpsim_errors
    # One correct rounding of the exact sum: relative error at most the fp32 unit roundoff.
    assert np.all(errs["exact"] <= 2.0**-24)
    # A 13-bit truncating accumulator loses far more than fp32 rounding, and more as K grows.
    assert errs["H100 fp8"][-1] > 1e3 * 2.0**-24
    assert errs["H100 fp8"][-1] > errs["H100 fp8"][0]
    # The plotted lines are those errors.
    for line, label in zip(ax.lines, models):
        np.testing.assert_array_equal(line.get_xdata(), Ks)
        y = np.asarray(line.get_ydata(), dtype=float)
        np.testing.assert_array_equal(np.nan_to_num(y), np.where(errs[label] > 0, errs[label], 0.0))


def test_accumulation_error_rejects_bad_input():
    pytest.importorskip("fpsim.mma")
    with pytest.raises(TypeError):
        plot.accumulation_error("exact", [4])
    with pytest.raises(ValueError, match="K"):
        plot.accumulation_error(["exact"], [0])
    with pytest.raises(ValueError, match="dist"):
        plot.accumulation_error(["exact"], [4], dist="cauchy")


# -- training histories: the plots read fpsim.train's History layout (a dict of per-step lists) --------


def _history(n=60, *, diverge_at=None, skip_every=0, seed=0):
    rng = np.random.default_rng(seed)
    loss = 2.5 * np.exp(-np.arange(n) / 30) + 0.1 * rng.random(n)
    if diverge_at is not None:
        loss[diverge_at:] = np.nan
    skipped = [(skip_every > 0 and s % skip_every == skip_every - 1) for s in range(n)]
    scale, sc = [], 2.0**16
    for sk in skipped:
        scale.append(sc)
        sc = sc / 2 if sk else sc
    under = rng.random(n) * 0.3
    under[::7] = np.nan  # telemetry off on some steps
    return {
        "step": list(range(n)), "loss": loss.tolist(), "loss_scale": scale, "skipped": skipped,
        "grad_underflow_fraction": under.tolist(), "grad_subnormal_fraction": (under / 3).tolist(),
        "lost_update_fraction": (rng.random(n) * 0.5).tolist(),
        "eval_step": [20, 40, n], "eval_loss": [1.5, 1.0, 0.8],
        "tensors": {"lm_head.dy": {"underflow_fraction": (under / 2).tolist(),
                                   "subnormal_fraction": (under / 4).tolist()}},
        "by_weight": {"wte": (rng.random(n) * 0.2).tolist()},
    }


def test_loss_curves():
    hs = {"fp32": _history(), "fp16 no scaling": _history(diverge_at=45, seed=1)}
    ax = plot.loss_curves(hs, smooth=5)
    _render(ax)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "fp32 (train)" in labels and "fp16 no scaling (held out)" in labels
    assert any("non-finite from step 45" in t.get_text() for t in ax.texts)
    assert "step" in ax.get_xlabel() and "nats" in ax.get_ylabel()
    # Smoothing is a trailing moving average over finite values.
    y = ax.lines[0].get_ydata()
    raw = np.asarray(hs["fp32"]["loss"])
    assert np.isnan(y[3]) and np.isclose(y[4], raw[:5].mean())


def test_loss_scale_marks_skipped_steps():
    h = _history(skip_every=10)
    ax = plot.loss_scale(h)
    _render(ax)
    assert ax.get_yscale() == "log"
    marks = [ln for ln in ax.lines if ln.get_marker() == "v"]
    assert len(marks) == 1 and len(marks[0].get_xdata()) == sum(h["skipped"])
    assert "skipped" in " ".join(t.get_text() for t in ax.get_legend().get_texts())


def test_underflow_over_time_runs_and_sites():
    h = _history()
    ax = plot.underflow_over_time({"a": h, "b": _history(seed=2)}, subnormal=True)
    _render(ax)
    y = np.asarray(ax.lines[0].get_ydata())
    expect = 100 * np.asarray(h["grad_underflow_fraction"])
    np.testing.assert_allclose(y, expect[np.isfinite(expect)])
    assert "%" in ax.get_ylabel()
    ax2 = plot.underflow_over_time(h, sites=["lm_head.dy"])
    assert "lm_head.dy" in ax2.get_legend().get_texts()[0].get_text()
    with pytest.raises(ValueError, match="no tensor site"):
        plot.underflow_over_time(h, sites=["nope"])


def test_lost_updates():
    h = _history()
    ax = plot.lost_updates({"fp16 no master": h})
    _render(ax)
    np.testing.assert_allclose(ax.lines[0].get_ydata(), 100 * np.asarray(h["lost_update_fraction"]))
    ax2 = plot.lost_updates(h, weights=["wte"])
    assert ax2.get_legend().get_texts()[0].get_text() == "wte"
    with pytest.raises(ValueError, match="no weight"):
        plot.lost_updates(h, weights=["nope"])


def test_history_plots_reject_bad_input():
    with pytest.raises(TypeError):
        plot.loss_curves(42)
    with pytest.raises(ValueError, match="loss_scale"):
        plot.loss_scale({"step": [0], "loss": [1.0]})


def test_history_plots_with_a_real_training_run():
    """The plots read what fpsim.train records (a short run of a very small model)."""
    train = pytest.importorskip("fpsim.train")
    from fpsim.nn import GPTConfig

    task = train.get_task("reverse")
    model = GPTConfig(vocab_size=task.vocab_size, block_size=task.seq_len, n_layer=1, n_head=2, n_embd=16)
    cfg = train.TrainConfig(task="reverse", model=model, steps=4, batch_size=4, eval_every=2, warmup=1)
    hist = train.Trainer("fp16-mixed", cfg).run(progress=False)
    for fn in (plot.loss_curves, plot.loss_scale, plot.underflow_over_time, plot.lost_updates):
        ax = fn({"fp16-mixed": hist})
        _render(ax)
        assert ax.get_xlabel() == "training step" and ax.get_ylabel()
    site = min(hist["tensors"])
    _render(plot.underflow_over_time(hist, sites=[site]))
    weight = min(hist["by_weight"])
    _render(plot.lost_updates(hist, weights=[weight]))


# --------------------------------------------------------------------------------------------------
# issue 18: band edges labelled, no legend for off-screen bands, one (colour, line style) per policy


def _edge_texts(ax) -> dict[str, str]:
    return {t.get_gid()[len("edge:"):]: t.get_text() for t in ax.texts if (t.get_gid() or "").startswith("edge:")}


@pytest.mark.parametrize(("fmt", "lo", "expected"), [
    ("fp16", -40, {"min_subnormal": "2^-24", "min_normal": "2^-14", "max": "65504"}),
    ("fp8_e4m3", -14, {"min_subnormal": "2^-9", "min_normal": "2^-6", "max": "448"}),
    ("fp8_e5m2", -20, {"min_subnormal": "2^-16", "min_normal": "2^-14", "max": "57344"}),
])
def test_gradient_histogram_band_edges_labelled_with_values(fmt, lo, expected):
    # Values spanning the whole range, so every edge is on screen.
    f = fpsim.as_format(fmt) if hasattr(fpsim, "as_format") else fpsim.formats.as_format(fmt)
    v = 2.0 ** np.linspace(lo, np.log2(f.max) + 2, 2000)
    ax = plot.gradient_histogram(v, fmt)
    _render(ax)
    got = _edge_texts(ax)
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert got[key].split(" ")[0] == value, (key, got[key])
    # Each label sits on its edge.
    for t in ax.texts:
        if (t.get_gid() or "") == "edge:max":
            assert t.get_position()[0] == pytest.approx(np.log2(f.max))


def _band_spans(ax):
    # The shaded bands: axvspan patches (Rectangles in matplotlib >= 3.9, Polygons before).
    out = []
    for p in ax.patches:
        ext = p.get_path().get_extents(p.get_patch_transform()) if hasattr(p, "get_patch_transform") else None
        if ext is not None and p.get_zorder() == 0:
            out.append((ext.x0, ext.x1))
    return out


@pytest.mark.parametrize(("fmt", "values", "absent"), [
    ("bf16", 2.0 ** np.linspace(-40, -2, 500), {"rounds to 0", "subnormal", "overflow"}),
    ("fp8_e4m3", 2.0 ** np.linspace(-40, -2, 500), {"overflow"}),
    ("fp16", 2.0 ** np.linspace(-10, 5, 500), {"rounds to 0", "overflow"}),
])
def test_gradient_histogram_no_legend_entry_for_offscreen_band(fmt, values, absent):
    ax = plot.gradient_histogram(values, fmt)
    _render(ax)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    bands = [s for s in labels if s.startswith(fmt + " ")]
    assert f"{fmt} normal" in bands
    for what in absent:
        assert f"{fmt} {what}" not in labels, labels
    # ... and every band that has an entry is (at least partly) on screen.
    x0, x1 = ax.get_xlim()
    f = fpsim.formats.as_format(fmt)
    lo_sub = np.log2(f.min_subnormal) - 1
    where = {"rounds to 0": (-np.inf, lo_sub), "subnormal": (lo_sub, f.emin), "normal": (f.emin, np.log2(f.max)),
             "overflow": (np.log2(f.max), np.inf)}
    for s in bands:
        a, b = where[s[len(fmt) + 1:]]
        assert a < x1 and b > x0, s


def _all_policy_names():
    from fpsim.train.demo import DEFAULT_POLICIES

    return sorted(set(fpsim.amp.policy_names()) | set(DEFAULT_POLICIES))


def test_policy_styles_distinct_pairs():
    from fpsim.train.report import POLICY_STYLES, policy_style

    from fpsim.train.demo import DEFAULT_POLICIES

    # Every policy the demo draws has its own entry; all entries are distinct (colour, line style) pairs.
    assert set(DEFAULT_POLICIES) <= set(POLICY_STYLES)
    pairs = [(c.lower(), ls) for c, ls in POLICY_STYLES.values()]
    assert len(set(pairs)) == len(pairs)
    # The pair students could not tell apart.
    assert POLICY_STYLES["fp8-hybrid"] != POLICY_STYLES["fp16-no-scaling"]
    assert POLICY_STYLES["fp8-hybrid"][0] != POLICY_STYLES["fp16-no-scaling"][0]
    assert policy_style("fp16-mixed") == POLICY_STYLES["fp16-mixed"]


def _hist(n=30, seed=0, **extra):
    rng = np.random.default_rng(seed)
    loss = list(2.5 * np.exp(-np.arange(n) / 20) + 0.01 * rng.standard_normal(n))
    return {"step": list(range(n)), "loss": loss, "loss_scale": [1024.0] * n, "skipped": [False] * n,
            "grad_underflow_fraction": list(rng.uniform(0, 0.1, n)), "lost_update_fraction": list(rng.uniform(0, 0.1, n)),
            "grad_amax": list(rng.uniform(1, 10, n)), "eval_step": [], "eval_loss": []} | extra


@pytest.mark.parametrize("fn", ["loss_curves", "loss_scale", "underflow_over_time", "lost_updates"])
def test_every_policy_gets_a_unique_colour_and_linestyle(fn):
    names = _all_policy_names() + ["my-own-policy", "another one"]
    runs = {n: _hist(seed=i) for i, n in enumerate(names)}
    ax = getattr(plot, fn)(runs)
    _render(ax)
    lines = [ln for ln in ax.get_lines() if not ln.get_label().startswith("_") and ln.get_linestyle() != "None"]
    by_run = {}
    for ln in lines:
        run = next(n for n in sorted(names, key=len, reverse=True) if ln.get_label().startswith(n))
        by_run.setdefault(run, (matplotlib.colors.to_hex(ln.get_color()), ln.get_linestyle()))
    assert set(by_run) == set(names)
    assert len(set(by_run.values())) == len(names), by_run


def test_demo_report_plots_use_the_policy_styles(tmp_path):
    from fpsim.train import report
    from fpsim.train.demo import DEFAULT_POLICIES

    runs = {n: _hist(seed=i) for i, n in enumerate(DEFAULT_POLICIES)}
    fig_lines = {}
    orig = plt.Figure.savefig

    def grab(self, *a, **k):
        for ax in self.axes:
            for ln in ax.get_lines():
                if ln.get_label() in runs:
                    fig_lines[ln.get_label()] = (matplotlib.colors.to_hex(ln.get_color()), ln.get_linestyle())
        return orig(self, *a, **k)

    plt.Figure.savefig = grab
    try:
        report.plot_loss_curves(runs, str(tmp_path / "loss.png"))
    finally:
        plt.Figure.savefig = orig
    assert set(fig_lines) == set(DEFAULT_POLICIES)
    assert len(set(fig_lines.values())) == len(fig_lines)
    for n, (c, ls) in fig_lines.items():
        assert (c.lower(), ls) == (report.POLICY_STYLES[n][0].lower(), report.POLICY_STYLES[n][1])


def test_scaler_dynamics_marks_growths_and_overflows():
    # A torch-style trace: grows x2 every 3 clean steps; the scaled max passes 65504 at step 7 and 11.
    scale = [2.0**14] * 3 + [2.0**15] * 3 + [2.0**16] + [2.0**17] + [2.0**16] * 3 + [2.0**17] + [2.0**16]
    skipped = [False] * 7 + [True] + [False] * 3 + [True] + [False]
    amax = [s * 0.6 for s in scale]
    h = {"step": list(range(13)), "loss_scale": scale, "skipped": skipped, "grad_amax": amax}
    fig = plot.scaler_dynamics(h, "fp16", label="test")
    _render(fig)
    assert fig.fpsim_events == {"growths": [3, 6, 7, 11], "overflows": [7, 11]}
    top, bottom = fig.axes[:2]
    assert any(np.allclose(ln.get_ydata(), 65504.0) for ln in bottom.get_lines())
    assert any("65504" in t.get_text() for t in bottom.get_legend().get_texts())
    assert "2 overflows" in top.get_title() and "4 growths" in top.get_title()
    with pytest.raises(ValueError, match="grad_amax"):
        plot.scaler_dynamics({"step": [0], "loss_scale": [1.0], "skipped": [False]})


def test_demo_gradient_histogram_labels_fp16_and_fp8_edges(tmp_path):
    from fpsim.train import report

    lo = -45
    e = np.arange(lo, 5)
    h = {"hist_lo": lo, "hist": {"grad_act": [list(np.exp(-0.5 * ((e + 22) / 6) ** 2) * 1000)]},
         "hist_zeros": {"grad_act": [10]}, "hist_step": [100]}
    seen = {}
    orig = plt.Figure.savefig

    def grab(self, *a, **k):
        seen.update({t.get_gid(): t.get_text() for ax in self.axes for t in ax.texts if t.get_gid()})
        return orig(self, *a, **k)

    plt.Figure.savefig = grab
    try:
        report.plot_gradient_histogram(h, str(tmp_path / "h.png"), loss_scale=1024.0)
    finally:
        plt.Figure.savefig = orig
    for gid in ["edge:fp16:2^-24", "edge:fp16:2^-14", "edge:fp16:65504", "edge:fp8_e5m2:2^-16", "edge:fp8_e5m2:2^-14",
                "edge:fp8_e5m2:57344", "edge:fp8_e4m3:2^-9", "edge:fp8_e4m3:2^-6", "edge:fp8_e4m3:448"]:
        assert gid in seen, (gid, sorted(seen))
        assert gid.split(":")[-1] in seen[gid]


# issue 25: the legend (upper right) and the fractions (upper left) never cover a histogram bar
def _bars_inside(ax, bbox) -> int:
    """How many vertices of the histogram outlines fall inside ``bbox`` (display coordinates)."""
    n = 0
    for patch in ax.patches:
        if type(patch).__name__ != "Polygon":
            continue  # the band shading (axvspan) lies behind everything on purpose
        pts = patch.get_transform().transform(patch.get_path().vertices)
        # a bar's top edge: points above the x axis (the outline also runs along y = 0)
        pts = pts[pts[:, 1] > ax.transData.transform((0, 0))[1] + 1]
        n += int(np.sum((pts[:, 0] > bbox.x0) & (pts[:, 0] < bbox.x1) & (pts[:, 1] > bbox.y0) & (pts[:, 1] < bbox.y1)))
    return n


@pytest.mark.parametrize("layout", [None, "constrained"])
def test_gradient_histogram_legend_and_fractions_clear_of_bars(layout):
    rng = np.random.default_rng(25)
    # peaked at the right end of their range, with a long left tail (like the gradients of notebook 5)
    g = 2.0 ** (-20 - 6 * rng.exponential(1.0, 50_000))
    fig, axes = plt.subplots(1, 2, figsize=(14, 4.2), layout=layout)
    plot.gradient_histogram(g, "fp16", scale=1024.0, ax=axes[0])          # the scaled copy peaks under the legend
    plot.gradient_histogram(2.0 ** (-1 + 3 * rng.exponential(1.0, 50_000)), "fp16", ax=axes[1])  # peak at the left
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    for ax in axes:
        assert _bars_inside(ax, ax.get_legend().get_window_extent(r)) == 0
        texts = [t.get_window_extent(r) for t in ax.texts if (t.get_gid() or "").startswith("fraction:")]
        for bb in texts:
            assert _bars_inside(ax, bb) == 0, ax.get_title()
