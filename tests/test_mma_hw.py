"""Published Tensor Core measurements reproduced bit for bit (reference tensorcore.md section 9).

The rows ship with the tests (``tests/data/tensorcore-hw/rows.npz``, BSD-2-Clause, provenance in the README
beside it), so a plain clone runs every set. ``$FPSIM_TENSORCORE_DATA`` may point at a folder of the published
text files instead (e.g. the full sets). Each (GPU, input format, output) set is one test: every row must
match the hardware's D; naive baselines (exactRN, the fp32 FMA chain) must *fail* on the counts the
reference reports.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest

from fpsim.mma import dot, generic, get_model
from fpsim.mma.naive import dot_naive

ROOT = Path(__file__).resolve().parents[1]
PACKED = ROOT / "tests" / "data" / "tensorcore-hw" / "rows.npz"
TEXT = Path(os.environ["FPSIM_TENSORCORE_DATA"]) if os.environ.get("FPSIM_TENSORCORE_DATA") else None
_SHARED = ROOT.parent / "shared" / "data" / "tensorcore-hw"  # the project's copy of the published text


def _pack_tool():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("pack_tensorcore_data", ROOT / "tools" / "pack_tensorcore_data.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _load_words() -> dict[str, np.ndarray]:
    """Every published file as uint32 words, keyed '<GPU>/<fmt>/<stem>'."""
    if TEXT is not None:
        if not TEXT.is_dir():
            return {}
        read = _pack_tool().read_words
        return {str(f.relative_to(TEXT).with_suffix("")): read(f) for f in sorted(TEXT.glob("*/*/*.txt"))}
    with np.load(PACKED, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


WORDS = _load_words()
DATA = TEXT if TEXT is not None else PACKED

FORMATS = {"fp16": "fp16", "bf16": "bf16", "tf32": "tf32", "E4M3": "fp8_e4m3", "E5M2": "fp8_e5m2"}
DEVICES = {"V100": "v100", "A100": "a100", "Ada": "ada", "H100": "h100"}

# Wrong rows of 1000 for the naive baselines (reference section 9), as (low, high) per kind of set.
EXACT_RANGE = {"fp32": (287, 427), "fp8-fp32-ada": (1000, 1000), "fp8-fp32-h100": (360, 599),
               "fp8-fp16": (254, 378), "fp16-fp16": (0, 0)}
FMA_RANGE = (396, 650)


def _sets() -> list[tuple[str, str, str]]:
    found = []
    for key in sorted(WORDS):
        gpu, fmt, stem = key.split("/")
        for out in ("fp32", "fp16"):
            if stem == f"d_{gpu}_{out}":
                found.append((gpu, fmt, out))
    return found


SETS = _sets()
_SKIP = f"published Tensor Core data not found at {DATA} (FPSIM_TENSORCORE_DATA)"


def load(gpu: str, fmt: str, out: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    def w(stem: str) -> np.ndarray:
        return WORDS[f"{gpu}/{fmt}/{stem}"].view(np.float32)

    a, b, c, dd = w(f"a_{gpu}_{fmt}"), w(f"b_{gpu}_{fmt}"), w(f"c_{gpu}_fp32"), w(f"d_{gpu}_{out}")
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


def test_data_present():
    """The shipped rows are always there; a FPSIM_TENSORCORE_DATA folder that is missing skips."""
    if TEXT is None:
        assert PACKED.is_file(), f"{PACKED} is missing from the checkout"
    elif not SETS:
        pytest.skip(_SKIP)
    assert len(SETS) == 22, f"expected 22 published sets, found {len(SETS)}: {SETS}"


@pytest.mark.skipif(not _SHARED.is_dir(), reason=f"no published text folder at {_SHARED} to compare with")
def test_packed_rows_equal_the_published_text():
    """Provenance: rows.npz holds exactly the words of the published text files (and SOURCES.txt their hashes)."""
    import hashlib

    read = _pack_tool().read_words
    with np.load(PACKED, allow_pickle=False) as z:
        packed = {k: z[k] for k in z.files}
    files = sorted(_SHARED.glob("*/*/*.txt"))
    assert sorted(packed) == sorted(str(f.relative_to(_SHARED).with_suffix("")) for f in files)
    sums = dict(ln.split("  ")[::-1] for ln in (PACKED.parent / "SOURCES.txt").read_text().splitlines())
    for f in files:
        rel = f.relative_to(_SHARED)
        assert np.array_equal(packed[str(rel.with_suffix(""))], read(f)), rel
        assert sums[str(rel)] == hashlib.sha256(f.read_bytes()).hexdigest(), rel


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
