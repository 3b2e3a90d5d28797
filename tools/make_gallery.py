"""Regenerate the figures of docs/gallery.md: the key figure of each lesson, as a small PNG.

Run from the repository root:  python3 tools/make_gallery.py [--only 01,07,...] [--demo DIR]

For each notebook, the code cells are executed in order in one namespace up to the cell that draws the
key figure (found by a marker string, so edits elsewhere in the notebook do not move it); the figure that
cell draws is saved to docs/img/gallery/<notebook>.png. Nothing after that cell runs, so the training-free
notebooks take seconds. The cells are the notebooks' own code: the gallery shows what the notebook shows.
The demo's figures are copied from a demo output folder (``--demo DIR``; otherwise ``fpsim demo --quick``
is run into a temporary folder first, about a minute).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ROOT = Path(__file__).resolve().parent.parent
NB = ROOT / "notebooks"
OUT = ROOT / "docs" / "img" / "gallery"
DPI = 72

# notebook stem -> a string that occurs in the code cell drawing the lesson's key figure
KEY = {
    "01-formats-and-bits": "fpsim.plot.format_compare(",
    "02-rounding-modes": "fpsim.plot.rounding_modes(2.3",
    "03-arithmetic-pitfalls": "ax.loglog(lengths",
    "04-tensor-cores": "fpsim.plot.accumulation_error(",
    "05-seven-machines": "same = np.array([[int(np.sum(same_in[a]",
    "06-loss-scaling": "fpsim.plot.scaler_dynamics(dyn",
    "07-master-weights": "fig, axes = plt.subplots(2, 2, figsize=(14, 8)",
    "08-no-master-copy": "fig, (ax0, ax1, ax2) = plt.subplots(1, 3, figsize=(14, 3.9)",
    "09-fp8-scaling": "delayed = S.DelayedScaling(",
    "10-quantization-aware-training": "for bits in [8, 6, 4, 3]:",
    "11-attention-numerics": "FP8 attention on inputs with 0.1% outliers",
    "12-memory": "from fpsim.plan.memory import MEMORY_KEYS",
    "13-data-parallel": "runs = {(1, \"fp32\")",
    "14-pytorch-amp": "GradScaler: back-off on overflow",
    "15-finetuning-4bit": "fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 4.8)",
    "16-training-in-four-bits": 'fig, axes = plt.subplots(1, 2, figsize=(13, 5), layout="constrained")',
    "17-why-bf16-won": 'fig, axes = plt.subplots(1, 2, figsize=(14, 4.2), layout="constrained")',
}
DEMO = ("loss_curves", "grad_histogram", "loss_scale", "lost_updates", "qat_vs_ptq")


def _code(src: str) -> str:
    """A cell's source without IPython magics and shell lines (none of the key figures need them)."""
    return "\n".join(("pass  # " + ln) if ln.lstrip().startswith(("%", "!")) else ln for ln in src.splitlines())


def notebook_figure(stem: str, marker: str) -> Path | None:
    nb = json.loads((NB / f"{stem}.ipynb").read_text())
    cells = [c for c in nb["cells"] if c["cell_type"] == "code"]
    srcs = ["".join(c["source"]) for c in cells]
    hit = [i for i, s in enumerate(srcs) if marker in s]
    if not hit:
        print(f"{stem}: SKIPPED, no code cell contains the marker {marker!r}; update KEY in {__file__}")
        return None
    ns: dict[str, object] = {"__name__": "__main__", "display": print}
    cwd = os.getcwd()
    os.chdir(NB)  # the notebooks run in their own folder (tests/test_notebooks.py does the same)
    try:
        for i, src in enumerate(srcs[: hit[0] + 1]):
            plt.close("all")
            with contextlib.redirect_stdout(io.StringIO()):
                exec(compile(_code(src), f"{stem}[{i}]", "exec"), ns)
        nums = plt.get_fignums()
        if not nums:
            raise SystemExit(f"{stem}: the marked cell drew no figure")
        fig = plt.figure(nums[-1])
        path = OUT / f"{stem}.png"
        fig.savefig(path, dpi=DPI, bbox_inches="tight")
        plt.close("all")
        return path
    finally:
        os.chdir(cwd)


def demo_figures(demo: str | None) -> list[Path]:
    tmp = None
    if demo is None:
        from fpsim.train.demo import run_demo

        tmp = tempfile.mkdtemp(prefix="fpsim-gallery-")
        run_demo(tmp, quick=True, log=None)
        demo = tmp
    out = []
    try:
        from PIL import Image  # matplotlib depends on Pillow

        for key in DEMO:
            src = Path(demo) / f"{key}.png"
            if src.exists():
                im = Image.open(src)
                im.thumbnail((900, 900))  # the report's PNGs are large; the gallery needs a preview
                p = OUT / f"demo-{key}.png"
                # a 256-colour palette: line plots use a few dozen colours, and the page stays light
                im.convert("RGB").quantize(colors=256, method=Image.Quantize.FASTOCTREE).save(p, optimize=True)
                out.append(p)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=None, help="comma-separated notebook numbers (01,07) or 'demo'")
    ap.add_argument("--demo", default=None, help="an fpsim demo output folder to take the demo figures from")
    a = ap.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    only = None if a.only is None else {s.strip() for s in a.only.split(",")}
    for stem, marker in KEY.items():
        if only is not None and stem[:2] not in only:
            continue
        t0 = time.perf_counter()
        p = notebook_figure(stem, marker)
        if p is None:
            continue
        print(f"{p.relative_to(ROOT)}  {p.stat().st_size / 1024:.0f} KB  {time.perf_counter() - t0:.0f} s")
    if only is None or "demo" in only:
        for p in demo_figures(a.demo):
            print(f"{p.relative_to(ROOT)}  {p.stat().st_size / 1024:.0f} KB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
