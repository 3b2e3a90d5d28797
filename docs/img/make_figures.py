"""Regenerate the figures of docs/tensorcores.md (matplotlib is imported here only).

Run from the repository root:  python docs/img/make_figures.py
Writes docs/img/bfma.png (the block-FMA alignment) and docs/img/deepseek_fp8.png (the DeepSeek-V3 experiment).
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from fpsim.mma import deepseek_experiment, dot, get_model

HERE = Path(__file__).resolve().parent


def _save(fig: plt.Figure, name: str) -> None:
    """Write atomically (temp file + rename)."""
    fd, tmp = tempfile.mkstemp(suffix=".png", dir=HERE)
    os.close(fd)
    fig.savefig(tmp, dpi=110, bbox_inches="tight")
    os.chmod(tmp, 0o644)  # mkstemp creates 0600
    os.replace(tmp, HERE / name)
    plt.close(fig)


def _bit_span(v: float) -> tuple[int, int]:
    """(msb, lsb) exponents of the nonzero binary digits of v."""
    num, den = abs(v).as_integer_ratio()
    lsb = -(den.bit_length() - 1) + ((num & -num).bit_length() - 1)
    return math.frexp(abs(v))[1] - 1, lsb


def bfma_figure() -> None:
    """Bit spans of the terms of one H100 fp16 BFMA (k = 16, 6 nonzero products shown), with its 25-bit grid."""
    rng = np.random.default_rng(3)
    a = (rng.standard_normal(6) * np.array([1, 1, 2**-6, 2, 2**-9, 0.5])).astype(np.float16).astype(float).tolist()
    b = rng.standard_normal(6).astype(np.float16).astype(float).tolist()
    c = float(np.float32(0.7))
    m = get_model("h100", "fp16")
    terms = []
    for x, y in zip(a, b):
        e = (math.frexp(x)[1] - 1) + (math.frexp(y)[1] - 1)  # unnormalised product exponent E
        terms.append((f"{x:.5g} x {y:.5g}  (E={e})", e, x * y))
    terms.append((f"c = {c:.8g}  (E={math.frexp(c)[1] - 1})", math.frexp(c)[1] - 1, c))
    emax = max(t[1] for t in terms)
    grid = emax - 23 - m.neab
    fig, ax = plt.subplots(figsize=(9, 3.8))
    for row, (_label, _e, v) in enumerate(terms):
        top, lo = _bit_span(v)
        kept_lo = max(lo, grid)
        if top >= kept_lo:
            ax.barh(row, top - kept_lo + 1, left=kept_lo - 0.5, color="tab:blue", height=0.6)
        if lo < grid:
            ax.barh(row, min(grid, top + 1) - lo, left=lo - 0.5, color="lightgray", height=0.6, hatch="//")
        ax.text(top + 1.5, row, f"{v:+.7g}", va="center", ha="right", fontsize=8)
    ax.axvline(grid - 0.5, color="tab:red", ls="--")
    ax.axvline(emax + 0.5, color="tab:green", ls=":")
    ax.text(grid + 0.5, len(terms) - 0.4, f"grid 2^{grid}: bits right of it are dropped, term by term",
            color="tab:red", fontsize=8, ha="right")
    ax.text(emax + 0.3, -0.45, "2^E_max", color="tab:green", fontsize=8, ha="right")
    ax.set_yticks(range(len(terms)), [t[0] for t in terms], fontsize=8)
    ax.invert_xaxis()
    ax.invert_yaxis()
    ax.set_xlabel("bit position (exponent of 2); most significant on the left")
    d = float(dot(a, b, c, m))
    ax.set_title(f"H100 fp16 BFMA: E_max = {emax}, 23+neab = {23 + m.neab} fraction bits kept below it, "
                 f"exact integer sum, RZ to fp32: D = {d:.9g}", fontsize=9)
    ax.set_xlim(emax + 14, grid - 12)
    _save(fig, "bfma.png")


def deepseek_figure() -> None:
    uni = deepseek_experiment(distribution="uniform", seed=0)
    nor = deepseek_experiment(distribution="normal", seed=0)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharex=True)
    ks = [r["K"] for r in uni["rows"]]
    style = {"unpromoted": ("tab:red", "o", "no promotion (13-bit accumulator)"),
             "promoted": ("tab:blue", "s", "promotion every 128 (per-tensor scale)"),
             "tile_promoted": ("tab:purple", "^", "promotion + 1x128/128x128 scales"),
             "wide25": ("tab:gray", "x", "25-bit window (contrast)")}
    for arm, (col, mk, lab) in style.items():
        axes[0].loglog(ks, [r[f"{arm}_max"] for r in uni["rows"]], color=col, marker=mk, label=lab)
        axes[1].loglog(ks, [r[f"{arm}_norm"] for r in nor["rows"]], color=col, marker=mk, label=lab)
    axes[0].axhline(0.02, color="k", ls=":", lw=1)
    axes[0].text(ks[0], 0.023, "DeepSeek-V3: 'nearly 2%' at K = 4096", fontsize=8)
    axes[0].set_title("U[0,1) entries: max elementwise relative error", fontsize=9)
    axes[1].set_title("N(0,1) entries: normwise relative error", fontsize=9)
    for ax in axes:
        ax.set_xlabel("K")
        ax.minorticks_off()
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle("FP8 E4M3 GEMM (64x64 outputs) under the H100 FP8 model (fpsim), vs the exact product", fontsize=10)
    _save(fig, "deepseek_fp8.png")


if __name__ == "__main__":
    np.seterr(all="ignore")
    bfma_figure()
    deepseek_figure()
    print("wrote", HERE / "bfma.png", HERE / "deepseek_fp8.png")
