"""Published Tensor Core measurements reproduced bit for bit (reference tensorcore.md section 9).

The data folder is ``$FPSIM_TENSORCORE_DATA`` if set, else ``../shared/data/tensorcore-hw`` next to the
repository root. Each (GPU, input format, output) set is one test: every row must match the hardware's D;
naive baselines (exactRN, the fp32 FMA chain) must *fail* on the counts the reference reports.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from fpsim.mma import dot, generic, get_model
from fpsim.mma.naive import dot_naive

_DEFAULT = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "tensorcore-hw"
DATA = Path(os.environ.get("FPSIM_TENSORCORE_DATA", str(_DEFAULT)))

FORMATS = {"fp16": "fp16", "bf16": "bf16", "tf32": "tf32", "E4M3": "fp8_e4m3", "E5M2": "fp8_e5m2"}
DEVICES = {"V100": "v100", "A100": "a100", "Ada": "ada", "H100": "h100"}

# Wrong rows of 1000 for the naive baselines (reference section 9), as (low, high) per kind of set.
EXACT_RANGE = {"fp32": (287, 427), "fp8-fp32-ada": (1000, 1000), "fp8-fp32-h100": (360, 599),
               "fp8-fp16": (254, 378), "fp16-fp16": (0, 0)}
FMA_RANGE = (396, 650)


def _sets() -> list[tuple[str, str, str]]:
    if not DATA.is_dir():
        return []
    found = []
    for gdir in sorted(p for p in DATA.iterdir() if p.is_dir()):
        for fdir in sorted(p for p in gdir.iterdir() if p.is_dir()):
            for out in ("fp32", "fp16"):
                if (fdir / f"d_{gdir.name}_{out}.txt").exists():
                    found.append((gdir.name, fdir.name, out))
    return found


SETS = _sets()
_SKIP = f"published Tensor Core data not found at {DATA} (set FPSIM_TENSORCORE_DATA)"


def _hex_rows(path: Path) -> np.ndarray:
    rows = [[int(w, 16) for w in line.split()] for line in path.read_text().splitlines() if line.strip()]
    return np.array(rows, dtype=np.uint32).view(np.float32)


def _bin_rows(path: Path) -> np.ndarray:
    return np.array([int(line, 2) for line in path.read_text().splitlines() if line.strip()],
                    dtype=np.uint32).view(np.float32)


def load(gpu: str, fmt: str, out: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    d = DATA / gpu / fmt
    a = _hex_rows(d / f"a_{gpu}_{fmt}.txt")
    b = _hex_rows(d / f"b_{gpu}_{fmt}.txt")
    c = _bin_rows(d / f"c_{gpu}_fp32.txt")
    dd = _bin_rows(d / f"d_{gpu}_{out}.txt")
    if gpu == "H100" and fmt in ("E4M3", "E5M2") and out == "fp32":
        c = np.zeros_like(c)  # these runs used C = 0 although the c file holds values
    return a, b, c, dd


def _mismatches(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    return np.flatnonzero(got.astype(np.float32).view(np.uint32) != want.view(np.uint32))


def _kind(gpu: str, fmt: str, out: str) -> str:
    fp8 = fmt in ("E4M3", "E5M2")
    if out == "fp16":
        return "fp8-fp16" if fp8 else "fp16-fp16"
    if fp8:
        return "fp8-fp32-ada" if gpu == "Ada" else "fp8-fp32-h100"
    return "fp32"


def test_data_present_or_skip():
    if not SETS:
        pytest.skip(_SKIP)
    assert len(SETS) == 22, f"expected 22 published sets, found {len(SETS)}: {SETS}"


@pytest.mark.skipif(not SETS, reason=_SKIP)
@pytest.mark.parametrize("gpu, fmt, out", SETS, ids=["-".join(s) for s in SETS])
def test_published_set_bit_exact(gpu, fmt, out):
    a, b, c, want = load(gpu, fmt, out)
    model = get_model(DEVICES[gpu], FORMATS[fmt], out)
    got = dot(a, b, c, model, input_rounding="exact")
    bad = _mismatches(got, want)
    assert bad.size == 0, (
        f"{bad.size} of {len(want)} rows differ; first row {bad[0]}: got {got[bad[0]].view(np.uint32):08x}, "
        f"hardware {want[bad[0]].view(np.uint32):08x}")
    # The naive baselines must fail where the reference says they do.
    ex = dot(a, b, c, generic("exact", out, input=FORMATS[fmt]), input_rounding="exact")
    lo, hi = EXACT_RANGE[_kind(gpu, fmt, out)]
    assert lo <= _mismatches(ex, want).size <= hi
    if out == "fp32" and fmt not in ("E4M3", "E5M2"):
        fm = dot(a, b, c, generic("fma_chain", out, input=FORMATS[fmt]), input_rounding="exact")
        assert FMA_RANGE[0] <= _mismatches(fm, want).size <= FMA_RANGE[1]


@pytest.mark.skipif(not SETS, reason=_SKIP)
@pytest.mark.parametrize("gpu, fmt, out", SETS, ids=["-".join(s) for s in SETS])
def test_published_rows_naive_reference(gpu, fmt, out):
    """The literal integer transcription of the model agrees on the first rows too."""
    a, b, c, want = load(gpu, fmt, out)
    model = get_model(DEVICES[gpu], FORMATS[fmt], out)
    for i in range(40):
        got = np.float32(dot_naive(a[i].tolist(), b[i].tolist(), float(c[i]), model))
        assert got.view(np.uint32) == want[i].view(np.uint32), f"row {i}"


@pytest.mark.skipif(not SETS, reason=_SKIP)
def test_model_variants_are_load_bearing():
    """Changing one parameter breaks many rows (reference section 3, 'every detail is load-bearing')."""
    a, b, c, want = load("H100", "fp16", "fp32")
    m = get_model("h100", "fp16")
    for wrong in (m.with_(neab=1), m.with_(neab=3), m.with_(k=8)):
        assert _mismatches(dot(a, b, c, wrong, input_rounding="exact"), want).size > 50
    a, b, c, want = load("H100", "E4M3", "fp16")
    m = get_model("h100", "fp8_e4m3", "fp16")
    assert _mismatches(dot(a, b, c, m.with_(grouping="none", k=32), input_rounding="exact"), want).size > 50
