"""The demo report's text follows the run's data (issue 25): captions and verdicts are computed, not written
by hand, so synthetic histories with opposite behaviour get opposite sentences."""

from __future__ import annotations

from typing import Any

import numpy as np

from fpsim.train.demo import _caption, _findings, _report, _trend, _why, demo_settings


def _hist(n: int = 60, *, scale: list[float] | None = None, skipped: list[bool] | None = None,
          under: list[float] | None = None, amax: list[float] | None = None, seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {"step": list(range(n)), "loss": list(2.0 * np.exp(-np.arange(n) / 30) + 0.01 * rng.random(n)),
            "loss_scale": scale or [2.0**16] * n, "skipped": skipped or [False] * n,
            "grad_amax": amax or [4.0] * n, "grad_underflow_fraction": under or [0.0] * n,
            "lost_update_fraction": [0.0] * n, "lr": [1e-3] * n, "eval_step": [], "eval_loss": [],
            "by_weight": {}, "hist_step": []}


def _policy(name: str, **kw: Any) -> dict[str, Any]:
    d = {"final_loss": 0.5, "grad_underflow_fraction": 0.0, "lost_update_fraction": 0.0, "skipped_steps": 0,
         "final_loss_scale": 2.0**16, "steps": 60,
         "policy": {"loss_scale": "dynamic", "scaler_kwargs": {"growth_interval": 8} if "fast" in name else {},
                    "quant": None}}
    d.update(kw)
    return d


def _overflowing(n: int = 60) -> dict[str, Any]:
    """A scaler that grows every 8 steps, overflows at step 20 and then oscillates: cut, grow, cut..."""
    scale, skipped, s = [], [], 2.0**16
    for i in range(n):
        scale.append(s)
        over = i >= 20 and i % 8 == 4
        skipped.append(over)
        s = s / 2 if over else (s * 2 if i % 8 == 7 and i < 20 else (s * 2 if i % 8 == 0 and i > 20 else s))
    return _hist(n, scale=scale, skipped=skipped, amax=[min(x * 1e-4, 7e4) for x in scale])


def test_loss_scale_caption_says_whether_the_fast_scaler_overflowed() -> None:
    n = 60
    calm = _hist(n, scale=[2.0**16 * 2 ** (i // 8) for i in range(n)])
    P = {"fp16-fast-scaler": _policy("fp16-fast-scaler")}
    text = _caption("loss_scale", P, {"fp16-fast-scaler": calm})
    assert "never overflowed" in text and "0 skipped steps" in text and "oscillat" not in text
    assert "2^16 to 2^23" in text

    over = _overflowing(n)
    k = int(np.sum(over["skipped"]))
    P = {"fp16-fast-scaler": _policy("fp16-fast-scaler", skipped_steps=k)}
    text = _caption("loss_scale", P, {"fp16-fast-scaler": over})
    assert "never overflowed" not in text
    assert "first overflowed at step 20" in text and f"skipped {k} steps" in text and "oscillated" in text


def test_underflow_caption_follows_the_trend_of_the_series() -> None:
    n = 100
    rising = [0.1 + 0.4 * i / n for i in range(n)]
    falling = rising[::-1]
    peak = [0.4 + 0.2 * min(i, 20) / 20 - 0.25 * max(0, i - 20) / 80 for i in range(n)]
    P: dict[str, Any] = {"fp16-no-scaling": _policy("fp16-no-scaling")}
    up = _caption("underflow", P, {"fp16-no-scaling": _hist(n, under=rising)})
    down = _caption("underflow", P, {"fp16-no-scaling": _hist(n, under=falling)})
    mid = _caption("underflow", P, {"fp16-no-scaling": _hist(n, under=peak)})
    assert "grows through the run" in up and "falls" not in up
    assert "falls through the run" in down and "grows" not in down
    assert "to a peak of" in mid and "around step 2" in mid and "then falls" in mid


def test_trend_is_flat_zero_or_missing_when_the_data_say_so() -> None:
    assert _trend(range(10), [0.0] * 10) == "is 0 at every step"
    assert _trend(range(10), [float("nan")] * 10) == "was not measured in this run"
    assert _trend(range(50), [0.2] * 50).startswith("stays at about")


def test_why_quotes_no_number_the_run_did_not_measure() -> None:
    st = demo_settings(quick=True)
    why = _why(st)
    for stale in ("+0.064", "0.052", "-0.42", "-0.49", "every seed", "about 1%", "3 seeds"):
        assert stale not in why
    assert "not measured" in why or "cannot say" in why
    # with the runs: the fp16-no-master sentence is computed from them
    P = {"fp16-no-master": _policy("fp16-no-master", final_loss=0.55, lost_update_fraction=0.25),
         "fp16-mixed": _policy("fp16-mixed", final_loss=0.5)}
    why = _why(st, P)
    assert "25.00%" in why and "0.5500" in why and "+10.0%" in why


def test_qat_ptq_verdicts_come_from_the_spread_when_there_is_one() -> None:
    P = {"int4-qat": _policy("int4-qat", final_loss=0.40), "int4-ptq": _policy("int4-ptq", final_loss=0.45)}
    one = _caption("qat_ptq", P)
    assert "-0.0500 on this seed" in one and "not measured against seed noise" in one
    spread = {"n_seeds": 3, "lessons": [{"key": "int4-qat-ptq", "diff": -0.04, "ci": [-0.07, -0.01], "n": 3,
                                         "verdict": "beyond seed noise"}]}
    many = _caption("qat_ptq", P, None, spread)
    assert "[-0.07, -0.01] over 3 seeds: beyond seed noise" in many


def test_findings_fast_scaler_sentence_follows_the_history() -> None:
    P = {"fp32": _policy("fp32", final_loss=0.5), "fp16-fast-scaler": _policy("fp16-fast-scaler", skipped_steps=3)}
    over = _overflowing()
    P["fp16-fast-scaler"]["skipped_steps"] = int(np.sum(over["skipped"]))
    assert "first overflowed" in _findings(P, {"fp16-fast-scaler": over})
    P["fp16-fast-scaler"]["skipped_steps"] = 0
    assert "never overflowed" in _findings(P, {"fp16-fast-scaler": _hist()})


def test_report_inputs_are_not_modified() -> None:
    import copy

    h = {"fp16-fast-scaler": _overflowing()}
    before = copy.deepcopy(h)
    _caption("loss_scale", {"fp16-fast-scaler": _policy("fp16-fast-scaler")}, h)
    assert h == before
    assert callable(_report)


# ------------------------------------------------------------------------------------------------------
# the figures: each policy told apart, axes that show the differences, legends off the data, labelled modes
# ------------------------------------------------------------------------------------------------------

def _capture(fn: Any, *args: Any) -> Any:
    """Run a report plot function and return its Figure (captured at savefig, before it is closed)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    got: list[Any] = []
    orig = plt.Figure.savefig

    def grab(self: Any, *a: Any, **k: Any) -> Any:
        self.canvas.draw()
        got.append(self)
        return orig(self, *a, **k)

    plt.Figure.savefig = grab  # type: ignore[method-assign]
    try:
        fn(*args)
    finally:
        plt.Figure.savefig = orig  # type: ignore[method-assign]
    return got[0]


def _legends_off_the_axes(fig: Any) -> None:
    for ax in fig.axes:
        leg = ax.get_legend()
        if leg is None:
            continue
        lb, ab = leg.get_window_extent(), ax.get_window_extent()
        assert lb.x0 >= ab.x1 - 1 or lb.y0 >= ab.y1 - 1 or lb.x1 <= ab.x0 + 1, "legend over the plotted area"


def test_loss_curves_give_each_policy_its_own_difference_panel(tmp_path: Any) -> None:
    from fpsim.train import report

    names = ["fp32", "bf16-mixed", "fp16-mixed", "int8-ptq"]
    hs = {n: _hist(seed=i) for i, n in enumerate(names)}
    hs["int8-ptq"] = dict(hs["fp32"])  # PTQ reuses fp32's training: its panel says so
    fig = _capture(report.plot_loss_curves, hs, str(tmp_path / "l.png"))
    titles = [ax.get_title() for ax in fig.axes]
    assert [t for t in titles if "−" in t] == [f"{n} − fp32" for n in names[1:]]
    ptq = fig.axes[titles.index("int8-ptq − fp32")]
    assert any("identical" in t.get_text() for t in ptq.texts)
    _legends_off_the_axes(fig)


def test_qat_ptq_axis_is_zoomed_to_the_data(tmp_path: Any) -> None:
    from fpsim.train import report

    m = {"fp32": {"final_loss": 0.422}, "int8-qat": {"final_loss": 0.423}, "int8-ptq": {"final_loss": 0.4223},
         "int4-qat": {"final_loss": 0.440}, "int4-ptq": {"final_loss": 0.445}}
    fig = _capture(report.plot_qat_ptq, m, str(tmp_path / "q.png"), list(m))
    lo, hi = fig.axes[0].get_ylim()
    assert 0.40 < lo < 0.422 and 0.445 < hi < 0.47  # not from 0: the differences fill the axis
    texts = " ".join(t.get_text() for t in fig.axes[0].texts)
    assert "QAT − PTQ\n-0.0050" in texts and "QAT − PTQ\n+0.0007" in texts
    _legends_off_the_axes(fig)


def test_checkpointing_labels_the_every_kth_block_mode(tmp_path: Any) -> None:
    from fpsim.train import report

    row = {"by_kind_device": {"gelu": 2**20}, "memory_ratio": 1.0, "flops_ratio": 1.0}
    table = {"rows": [dict(row, mode="none"), dict(row, mode="2")], "policy": "fp32", "batch": 2, "seq_len": 4,
             "model": {"n_layer": 4}}
    fig = _capture(report.plot_checkpointing, table, str(tmp_path / "c.png"))
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == ["none", "every 2nd block\n(blocks 0, 2 of 4)"]


def test_underflow_loss_scale_and_lost_updates_keep_legends_off_the_data(tmp_path: Any) -> None:
    from fpsim.train import report

    hs = {"fp16-mixed": _hist(under=[0.001] * 60), "fp16-no-scaling": _hist(under=[0.4] * 60),
          "bf16-mixed": _hist()}
    for n, h in hs.items():
        h["lost_update_fraction"] = [0.1 if n == "fp16-no-scaling" else 0.0] * 60
    fig = _capture(report.plot_underflow, hs, str(tmp_path / "u.png"))
    assert fig.axes[0].get_yscale() == "log"  # 0.1% and 40% both visible
    assert any("0 at every step" in t.get_text() for t in fig.axes[0].get_legend().get_texts())
    _legends_off_the_axes(fig)
    _legends_off_the_axes(_capture(report.plot_loss_scale, hs, str(tmp_path / "s.png")))
    _legends_off_the_axes(_capture(report.plot_lost_updates, hs, str(tmp_path / "l.png")))
