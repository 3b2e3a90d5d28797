"""fpsim.testing.identify_accumulator: the block-FMA models that reproduce measured rows.

The oracle is hardware: the published Tensor Core rows shipped in ``tests/data/tensorcore-hw/rows.npz`` (V100,
A100, Ada, H100; fp16, bf16, tf32, E4M3, E5M2; BSD-2-Clause, provenance in the README beside them). For every
set the identified models must reproduce every row, and the preset fpsim ships for the device must be among
them. The batched evaluator is checked against :func:`fpsim.mma.dot` (NumPy reference and compiled kernel)
on random hypotheses, and each reported rejection against the first row ``dot`` gets wrong.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pytest

import fpsim
from fpsim.mma import MMAModel, dot, get_model
from fpsim.testing import Identification, candidate_space, identify_accumulator
from fpsim.testing._identify import PARAMS, _canonical, mel_options, predict

ROOT = Path(__file__).resolve().parents[1]
PACKED = ROOT / "tests" / "data" / "tensorcore-hw" / "rows.npz"
FORMATS = {"fp16": "fp16", "bf16": "bf16", "tf32": "tf32", "E4M3": "fp8_e4m3", "E5M2": "fp8_e5m2"}
DEVICE = {"V100": "v100", "A100": "a100", "Ada": "ada", "H100": "h100"}


def _words() -> dict[str, np.ndarray]:
    with np.load(PACKED, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


WORDS = _words() if PACKED.is_file() else {}
SETS = sorted((g, f, o) for g, f, s in (k.split("/") for k in WORDS) for o in ("fp32", "fp16")
              if s == f"d_{g}_{o}")


def load(gpu: str, fmt: str, out: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    def w(stem: str) -> np.ndarray:
        return WORDS[f"{gpu}/{fmt}/{stem}"].view(np.float32)

    a, b, c, d = w(f"a_{gpu}_{fmt}"), w(f"b_{gpu}_{fmt}"), w(f"c_{gpu}_fp32"), w(f"d_{gpu}_{out}")
    if gpu == "H100" and fmt in ("E4M3", "E5M2") and out == "fp32":
        c = np.zeros_like(c)  # these runs used C = 0 although the c file holds values (data README)
    return a, b, c, d


def _bits(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).view(np.uint32)


# ---------------------------------------------------------------------------------------------------------
# The published hardware rows


def test_all_published_sets_present() -> None:
    assert PACKED.is_file(), f"{PACKED} is missing from the checkout"
    assert len(SETS) == 22


@pytest.mark.parametrize("gpu, fmt, out", SETS, ids=["-".join(s) for s in SETS])
def test_published_set_identified(gpu: str, fmt: str, out: str) -> None:
    a, b, c, d = load(gpu, fmt, out)
    a0, d0 = a.copy(), d.copy()
    found = identify_accumulator(a, b, c, d, input=FORMATS[fmt], output=out)
    assert np.array_equal(_bits(a), _bits(a0)) and np.array_equal(_bits(d), _bits(d0))  # inputs untouched
    assert found.rows == 1000 and found.models and not found.unexplained
    # Every identified model reproduces every hardware row under fpsim.mma.dot (not the batched evaluator).
    for key in {(m.k, m.neab, m.rounding, m.mb, m.c_entry, m.grouping) for m in found.models}:
        m = next(x for x in found.models if (x.k, x.neab, x.rounding, x.mb, x.c_entry, x.grouping) == key)
        got = dot(a, b, c, m, input_rounding="exact")
        assert np.array_equal(_bits(got), _bits(d)), f"{m.describe()} differs from the hardware"
    preset = get_model(DEVICE[gpu], FORMATS[fmt], out)
    assert DEVICE[gpu] in found.presets
    assert _canonical(preset, found.K) in {_canonical(m, found.K) for m in found.models}
    assert found.why_not(preset) is None
    # Candidates tried: the full cross product (times the mel options), and a budget of seconds.
    assert found.candidates == len(candidate_space(FORMATS[fmt], out, found.K)) * len(mel_options(out))
    assert found.seconds < 30


def test_published_rejections_name_the_first_wrong_row() -> None:
    """The reported row is the first one fpsim.mma.dot gets wrong, with dot's value (200 random rejections)."""
    a, b, c, d = load("H100", "fp16", "fp32")
    found = identify_accumulator(a, b, c, d, input="fp16", output="fp32")
    rej = found.rejected
    assert len(rej) == found.candidates - len(found.models)
    rng = np.random.default_rng(11)
    for i in rng.choice(len(rej), 200, replace=False):
        r = rej[int(i)]
        m = MMAModel(name="h", kind="bfma", input="fp16", output="fp32", **r.params)
        got = np.asarray(dot(a, b, c, m, input_rounding="exact"), dtype=np.float64)
        wrong = np.flatnonzero(_bits(got) != _bits(d))
        assert wrong.size and wrong[0] == r.row, str(r)
        assert got[r.row] == r.expected and d[r.row] == r.observed


def test_v100_model_ruled_out_on_a100_rows() -> None:
    a, b, c, d = load("A100", "fp16", "fp32")
    found = identify_accumulator(a, b, c, d, input="fp16", output="fp32")
    assert "v100" not in found.presets
    why = found.why_not(get_model("v100", "fp16"))
    assert why is not None and why.expected != why.observed and "row" in str(why)
    assert {(m.k, m.neab, m.rounding, m.mb) for m in found.models} == {(8, 1, "rz", 23)}


def test_corrupted_rows_are_reported_unexplained() -> None:
    a, b, c, d = load("A100", "bf16", "fp32")
    d = d.copy()
    d[[5, 17]] = -d[[5, 17]] * 4  # sign and exponent changed: no block-FMA model gives these
    found = identify_accumulator(a, b, c, d, input="bf16", output="fp32")
    assert found.models == () and found.presets == ()
    assert found.unexplained == (5, 17)
    assert "rows no hypothesis explains: 2" in found.summary()


def test_codes_and_values_agree() -> None:
    a, b, c, d = load("Ada", "E4M3", "fp16")
    by_value = identify_accumulator(a, b, c, d, input="fp8_e4m3", output="fp16")
    ca = fpsim.to_bits(a.astype(np.float64), "fp8_e4m3").astype(np.uint8)
    cb = fpsim.to_bits(b.astype(np.float64), "fp8_e4m3").astype(np.uint8)
    cd = fpsim.to_bits(d.astype(np.float64), "fp16").astype(np.uint16)
    by_code = identify_accumulator(ca, cb, c, cd, input="fp8_e4m3", output="fp16")
    assert by_code.parameter_sets() == by_value.parameter_sets() and by_code.presets == by_value.presets


# ---------------------------------------------------------------------------------------------------------
# The batched evaluator against fpsim.mma.dot


def _random_rows(rng: np.random.Generator, fmt: str, rows: int, K: int, *, tiny: bool = False,
                 specials: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    scale = np.exp2(rng.integers(-30 if tiny else -6, 6, (rows, K)))
    a = np.asarray(fpsim.round(rng.standard_normal((rows, K)) * scale, fmt), dtype=np.float64)
    b = np.asarray(fpsim.round(rng.standard_normal((rows, K)), fmt), dtype=np.float64)
    a[rng.random((rows, K)) < 0.1] = 0.0
    c = rng.standard_normal(rows) * np.exp2(rng.integers(-40 if tiny else -4, 4, rows))
    if specials:
        big = np.inf if fpsim.as_format(fmt).has_inf else np.nan  # E4M3 has no infinity
        a[0, 0] = big
        c[1] = np.nan
        c[2] = -np.inf
        a[3, 1] = big
        b[3, 1] = 0.0  # inf * 0: NaN
    return a, b, c


@pytest.mark.parametrize("fin, fout, K", [("fp16", "fp32", 20), ("bf16", "fp32", 16), ("tf32", "fp32", 8),
                                          ("fp8_e4m3", "fp16", 32), ("fp8_e5m2", "fp32", 24),
                                          ("fp16", "fp16", 12)])
def test_predict_equals_dot(fin: str, fout: str, K: int) -> None:
    rng = np.random.default_rng(zlib.crc32(f"{fin}-{fout}-{K}".encode()))  # not hash(): salted per process
    a, b, c = _random_rows(rng, fin, 96, K, tiny=True, specials=True)
    cands = candidate_space(fin, fout, K)
    mels = mel_options(fout)
    cr = np.asarray(fpsim.round(c, fout, "rne"), dtype=np.float64) if fout != "fp32" else \
        c.astype(np.float32).astype(np.float64)
    for i in rng.choice(len(cands), 60, replace=False):
        cd = dict(cands[int(i)])
        cd["mel"] = mels[int(rng.integers(len(mels)))]
        m = MMAModel(name="h", kind="bfma", input=fin, output=fout, **cd)
        want = np.asarray(dot(a, b, c, m, input_rounding="exact"), dtype=np.float64)
        got = predict(a, b, cr, fin, fout, k=cd["k"], c_entry=cd["c_entry"], grouping=cd["grouping"],
                      neab=[cd["neab"]], mb=[cd["mb"]], rounding=[cd["rounding"]], mel=[cd["mel"]])[0]
        same = (got == want) | (np.isnan(got) & np.isnan(want))
        assert same.all(), f"{cd}: rows {np.flatnonzero(~same)[:5]} differ from fpsim.mma.dot"


def test_non_preset_model_with_floor_identified() -> None:
    """A model no preset uses (C late, k=4, neab=3, mel=-16 on fp16 out) is found from random rows alone.

    Tiny inputs put many rows below the floors tried, so the floor search runs on most rows here.
    """
    rng = np.random.default_rng(3)
    odd = MMAModel(name="odd", kind="bfma", input="fp16", output="fp16", k=4, neab=3, rounding="rne", mb=10,
                   mel=-16, c_entry="late")
    a, b, c = _random_rows(rng, "fp16", 3000, 8, tiny=True)
    c = np.asarray(fpsim.round(c, "fp16", "rne"), dtype=np.float64)
    d = np.asarray(dot(a, b, c, odd, input_rounding="exact"), dtype=np.float64)
    found = identify_accumulator(a, b, c, d, input="fp16", output="fp16")
    keys = {tuple(p[f] for f in PARAMS) for p in found.parameter_sets()}
    assert (4, 3, "rne", 10, "late", "none", -16) in keys
    assert found.presets == ()
    assert found.seconds < 30
    # Rejections where the floor matters: the reported row is the first one fpsim.mma.dot gets wrong.
    rej = [r for r in found.rejected if r.params["mel"] is not None]
    for i in rng.choice(len(rej), 100, replace=False):
        r = rej[int(i)]
        m = MMAModel(name="h", kind="bfma", input="fp16", output="fp16", **r.params)
        got = np.asarray(dot(a, b, c, m, input_rounding="exact"), dtype=np.float64)
        wrong = np.flatnonzero(got != d)
        assert wrong.size and wrong[0] == r.row and got[r.row] == r.expected, str(r)


def test_errors_name_the_bad_value() -> None:
    a = np.ones((3, 4))
    d = np.full(3, 4.0)
    with pytest.raises(ValueError, match=r"A\[0, 1\] = 0\.1 is not a value of fp16"):
        identify_accumulator(np.array([[1.0, 0.1], [1, 1], [1, 1]]), np.ones((3, 2)), 0.0, np.ones(3),
                             input="fp16")
    with pytest.raises(ValueError, match="one shape"):
        identify_accumulator(a, np.ones((3, 5)), 0.0, d, input="fp16")
    with pytest.raises(ValueError, match="one value per row"):
        identify_accumulator(a, a, 0.0, np.ones(4), input="fp16")
    with pytest.raises(TypeError, match="float values or integer codes"):
        identify_accumulator(a.astype(bool), a, 0.0, d, input="fp16")
    with pytest.raises(ValueError, match="lacks"):
        identify_accumulator(a, a, 0.0, d, input="fp16", candidates=[{"k": 4}])
    with pytest.raises(ValueError, match="unknown format|valid"):
        identify_accumulator(a, a, 0.0, d, input="fp17")
    found = identify_accumulator(a, a, 0.0, d, input="fp16")
    assert isinstance(found, Identification)
    with pytest.raises(ValueError, match="outside the searched space"):
        found.why_not({"k": 4, "neab": 40, "rounding": "rz", "mb": 23, "c_entry": "inside", "grouping": "none",
                       "mel": None})


def test_docs_page_examples_run() -> None:
    """Every Python block of docs/test-suite.md runs (in order, one namespace)."""
    import re

    text = (ROOT / "docs" / "test-suite.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    assert len(blocks) == 2
    ns: dict[str, object] = {}
    for block in blocks:
        exec(compile(block, "docs/test-suite.md", "exec"), ns)  # noqa: S102  # our own docs
