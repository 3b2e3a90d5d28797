"""The audit's outputs: JSON (:func:`to_json`), the text table (:func:`format_table`) and the figures
(:func:`plot_audit`). Public names are re-exported by :mod:`fpsim.audit`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from .._cliargs import json_text, printable
from .._fpenv import ieee_mode
from ._checkpoint import at_risk
from ._judge import THRESHOLDS, parse_target
from ._safetensors import DTYPES


# --------------------------------------------------------------------------------------------------
# Output


@ieee_mode
def to_json(report: Mapping[str, Any]) -> str:
    """The report as strict JSON: infinite SQNR (no error at all) is the string ``"inf"``."""
    return json_text(dict(report), indent=1)


def _f(v: float, kind: str) -> str:
    if kind == "db":
        return "inf" if v == math.inf else ("-inf" if v == -math.inf else f"{v:.1f}")
    if v == 0:
        return "0"
    return f"{v:.2e}" if v < 1e-2 else f"{v:.3f}"


@ieee_mode
def format_table(report: Mapping[str, Any], *, top: int | None = None) -> str:
    """The report as a text table: one line per tensor and target, then the summary and the tensors at risk.

    Names come from the file: every non-printable character in them is escaped
    (:func:`fpsim._cliargs.printable`), so a name cannot drive the terminal or break a line; :func:`to_json`
    keeps them exact.

    >>> print(format_table({"tensors": [], "targets": [], "at_risk": [], "summary": {}, "skipped": []}))
    tensor  dtype  shape  amax  target  underflow  subnormal  overflow  sqnr_db  max_rel  verdict
    ------  -----  -----  ----  ------  ---------  ---------  --------  -------  -------  -------
    """
    cols = ["tensor", "dtype", "shape", "amax", "target", "underflow", "subnormal", "overflow", "sqnr_db",
            "max_rel", "verdict"]
    rows = []
    for e in report["tensors"]:
        for i, (name, r) in enumerate(e["targets"].items()):
            head = [printable(e["name"]), printable(e["dtype"]), "x".join(map(str, e["shape"])) or "()",
                    f"{e['amax']:.3g}"] if i == 0 else ["", "", "", ""]
            rows.append(head + [name, _f(r["underflow"], "f"), _f(r["subnormal"], "f"), _f(r["overflow"], "f"),
                                _f(r["sqnr_db"], "db"), _f(r["max_rel_error"], "f"), r["verdict"]])
    w = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(x) for c, x in zip(cols, w)).rstrip(), "  ".join("-" * x for x in w)]
    lines += ["  ".join(v.ljust(x) for v, x in zip(r, w)).rstrip() for r in rows]
    if report["summary"]:
        lines.append("")
        lines.append("summary (tensors ok / warn / risk; worst SQNR; format's rounding floor):")
        for name, s in report["summary"].items():
            lines.append(f"  {name:<22} {s['ok']:>4} / {s['warn']:>4} / {s['risk']:>4}   worst "
                         f"{_f(s['worst_sqnr_db'], 'db')} dB   floor {s['floor_db']:.1f} dB")
    risk = list(report["at_risk"])[: top if top is not None else None]
    if risk:
        lines.append("")
        lines.append("most at risk:")
        for r in risk:
            lines.append(f"  {r['verdict']:<4}  {printable(r['tensor'])}  {r['target']}: {'; '.join(r['reasons'])}")
    for s in report.get("skipped", []):
        lines.append(f"skipped {printable(s['name'])} ({printable(s['dtype'])}): not audited "
                     f"(audited dtypes: {', '.join(DTYPES)})")
    return "\n".join(lines)


@ieee_mode
def plot_audit(report: Mapping[str, Any], out_dir: str | os.PathLike[str]) -> list[str]:
    """Write ``sqnr.png`` (SQNR per tensor and target, with each format's rounding floor) and
    ``fractions.png`` (underflow and overflow shares) into ``out_dir``; returns the paths.
    matplotlib is imported here only."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    from ..plot import colour

    d = os.fspath(out_dir)
    os.makedirs(d, exist_ok=True)
    tensors = list(report["tensors"])
    names = list(report["targets"])
    n = len(tensors)
    x = np.arange(n)
    paths = []
    fig, ax = plt.subplots(figsize=(max(6.0, min(0.25 * n + 3, 24.0)), 4.5))
    for i, tg in enumerate(names):
        y = np.array([e["targets"][tg]["sqnr_db"] for e in tensors], dtype=float)
        y = np.where(np.isposinf(y), np.nan, y)
        ax.plot(x, y, "o", ms=4, color=colour(i), label=tg)
        ax.axhline(parse_target(tg).floor_db, color=colour(i), lw=0.8, ls="--")
    ax.set_xlabel("tensor (checkpoint order)")
    ax.set_ylabel("SQNR (dB)")
    ax.set_title("SQNR per tensor (dashed: format's rounding floor)")
    if n <= 40:
        # names from the file: shown literally (a "$...$" name is not mathtext, whose parse errors killed the plot)
        ax.set_xticks(x, [printable(e["name"]) for e in tensors], rotation=90, fontsize=6, parse_math=False)
    ax.legend(fontsize=7)
    fig.tight_layout()
    p = os.path.join(d, "sqnr.png")
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)
    fig, axs = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for k, (key, ax) in enumerate(zip(("underflow", "overflow"), axs)):
        for i, tg in enumerate(names):
            y = np.array([e["targets"][tg][key] for e in tensors], dtype=float)
            ax.plot(x, np.where(y > 0, y, np.nan), "o", ms=4, color=colour(i), label=tg)
        ax.set_yscale("log")
        ax.set_xlabel("tensor (checkpoint order)")
        ax.set_title(f"share of nonzero values that {'underflow to 0' if k == 0 else 'saturate / overflow'}")
        ax.axhline(THRESHOLDS[f"risk_{key}"], color="k", lw=0.8, ls="--")
    axs[0].set_ylabel("share of nonzero values (log)")
    axs[1].legend(fontsize=7)
    fig.tight_layout()
    p = os.path.join(d, "fractions.png")
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)
    return paths


