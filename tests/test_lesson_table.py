"""The demo report's lesson table (issue 18 item 3): every lesson with its "beyond seed noise?" column."""

from __future__ import annotations

from typing import Any

import pytest

from fpsim.train.report import lesson_table
from fpsim.train.sweep import LESSONS, seed_spread

P = {"fp32": {"final_loss": 0.50}, "bf16-mixed": {"final_loss": 0.51}, "fp16-mixed": {"final_loss": 0.52,
     "grad_underflow_fraction": 0.001, "lost_update_fraction": 0.0},
     "fp16-no-master": {"final_loss": 0.55, "lost_update_fraction": 0.4}}


def _rows(text: str) -> dict[str, list[str]]:
    rows = [ln for ln in text.splitlines() if ln.startswith("| ") and not ln.startswith("| lesson")]
    return {r.split(" | ")[0][2:]: [c.strip() for c in r.strip("|").split("|")] for r in rows}


def test_one_seed_table_says_not_measured_and_how() -> None:
    t = lesson_table(P)
    rows = _rows(t)
    want = [les.title for les in LESSONS if les.a in P and les.b in P]
    assert list(rows) == want and len(want) == 4  # only lessons whose two policies ran, in LESSONS order
    for cells in rows.values():
        assert cells[-1] == "not measured: 1 seed (run `fpsim demo --seeds 3`)"
    r = rows["no FP32 master vs master: lost updates"]
    assert r[1] == "lost_update_fraction (points of %)" and r[4] == "+40"  # A - B in points of %


def _res(effect: float) -> list[dict[str, Any]]:
    out = []
    for s, noise in enumerate((0.01, -0.02, 0.015)):
        out.append({"policy": "fp32", "seed": s, "setting": "d", "metrics": {"final_loss": 0.5 + noise}})
        out.append({"policy": "bf16-mixed", "seed": s, "setting": "d",
                    "metrics": {"final_loss": 0.5 + noise + effect + 0.001 * s}})
    return out


@pytest.mark.parametrize("effect, verdict", [(0.05, "beyond seed noise"), (0.0, "within seed noise")])
def test_multi_seed_table_carries_the_sweep_verdict(effect: float, verdict: str) -> None:
    spread = seed_spread(_res(effect))
    P2 = {"fp32": {"final_loss": 0.51}, "bf16-mixed": {"final_loss": 0.51 + effect}}
    rows = _rows(lesson_table(P2, spread, seed=0))
    (cells,) = rows.values()
    les = spread["lessons"][0]
    assert cells[-1].endswith(f"over 3 seeds: **{verdict}**")
    assert cells[-1].startswith(f"{les['diff']:+.3g} [")
    assert les["n"] == 3


def test_inputs_not_modified() -> None:
    import copy
    spread = seed_spread(_res(0.05))
    p0, s0 = copy.deepcopy(P), copy.deepcopy(spread)
    lesson_table(P, spread)
    assert P == p0 and spread == s0


@pytest.mark.slow
def test_demo_report_has_the_lesson_table(tmp_path: Any) -> None:
    from fpsim.train.demo import DemoSettings, run_demo

    st = DemoSettings(steps=2, n_layer=2, n_embd=16, n_head=2, batch_size=4, histogram_every=1, eval_every=1,
                      task_kwargs={"n_symbols": 8, "length": 4})
    run_demo(str(tmp_path), policies=["fp32", "bf16-mixed"], settings=st, log=None)
    report = (tmp_path / "report.md").read_text()
    assert report.count("## Lessons: do they hold beyond seed noise?") == 1
    assert "| BF16 mixed precision (FP32 master) vs FP32: final loss |" in report
    assert "beyond seed noise? |" in report


def _seeds_passed(argv: list[str], tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> int:
    import fpsim.train.demo as demo
    from tests._cli import run_cli

    seen: dict[str, Any] = {}
    monkeypatch.setattr(demo, "run_demo", lambda out, **k: seen.update(k))
    rc, _, err = run_cli(["demo", *argv, "--out", str(tmp_path / "d")])
    assert rc == 0, err
    return int(seen["seeds"])


def test_full_demo_defaults_to_three_seeds_quick_to_one(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from fpsim.train.cli import DEFAULT_SEEDS, DEFAULT_SEEDS_QUICK

    assert (DEFAULT_SEEDS, DEFAULT_SEEDS_QUICK) == (3, 1)
    assert _seeds_passed([], tmp_path, monkeypatch) == 3          # the full report answers "beyond seed noise?"
    assert _seeds_passed(["--steps", "5"], tmp_path, monkeypatch) == 3
    assert _seeds_passed(["--quick"], tmp_path, monkeypatch) == 1  # a few minutes; its table says how to measure
    assert _seeds_passed(["--quick", "--seeds", "3"], tmp_path, monkeypatch) == 3
    assert _seeds_passed(["--seeds", "1"], tmp_path, monkeypatch) == 1


def test_gemm_demo_defaults_to_one_seed(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    if importlib.util.find_spec("fpsim.train.bitexact") is None:
        pytest.skip("no --gemm in this checkout")
    assert _seeds_passed(["--gemm", "h100"], tmp_path, monkeypatch) == 1  # one seed by design, not refused
