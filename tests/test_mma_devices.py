"""Every preset's provenance, the ``fpsim devices`` command, and the Trainium / Gaudi presets.

Oracles: exact rational probabilities (fractions) for Trainium's stochastic rounding, ml_dtypes casts for RNE
and for Gaudi's FP8 formats, gmpy2 (MPFR) for the Tensor Engine's fp32 accumulation chain.
"""

from __future__ import annotations

import json
import re
from fractions import Fraction
from pathlib import Path

import gmpy2
import ml_dtypes
import numpy as np
import pytest

import fpsim
from fpsim.cli import main
from fpsim.mma import DEVICES, MMAModel, Provenance, get_model, preset_provenance, preset_table, presets
from fpsim.mma import gaudi, trainium
from fpsim.mma.presets import (
    DOCUMENTATION,
    HARDWARE_ROWS,
    LEVELS,
    MMA_SIM,
    TABLE_KEYS,
    DeviceInfo,
    register_device,
    register_preset,
)

ROOT = Path(__file__).resolve().parents[1]
F32 = np.float32
DOC_ONLY_VENDORS = ("Google", "AWS", "Intel")


# ------------------------------------------------------------------------------------ the schema

def test_provenance_levels_parse_and_combine() -> None:
    p = Provenance(("mma-sim", "Hardware-Rows"), source="s")
    assert p.levels == (HARDWARE_ROWS, MMA_SIM) and p.validated and p.label == f"{HARDWARE_ROWS} + {MMA_SIM}"
    assert Provenance(DOCUMENTATION, "doc").levels == (DOCUMENTATION,)
    assert not Provenance("docs", "doc").validated
    m = Provenance(HARDWARE_ROWS, "a", "n1", ("t1",)).merged(Provenance(MMA_SIM, "b", "n2", ("t2",)))
    assert (m.levels, m.source, m.tests) == ((HARDWARE_ROWS, MMA_SIM), "a; b", ("t1", "t2"))


@pytest.mark.parametrize("levels, exc, match", [
    ((), ValueError, "at least one level"),
    (("documentation", "mma-sim"), ValueError, "cannot be combined"),
    (("validated",), ValueError, "valid: reproduces published hardware rows, agrees with MMA-Sim"),
    ((3,), TypeError, "provenance level"),
    (5, TypeError, "levels must be"),
])
def test_provenance_rejects(levels: object, exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        Provenance(levels, source="s")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="only validated"):
        Provenance(DOCUMENTATION, "a").merged(Provenance(MMA_SIM, "b"))


def test_every_preset_states_its_provenance() -> None:
    ps = presets()
    assert len(ps) >= 60
    for p in ps:
        assert p.provenance.levels and all(lv in LEVELS for lv in p.provenance.levels), p
        assert p.provenance.source.strip(), p
        if p.build is not None:
            m = get_model(p.device, p.input, p.output, path=p.path)
            assert isinstance(m, MMAModel) or hasattr(m, "describe"), p
        else:
            with pytest.raises(ValueError, match=re.escape(p.usage.split("(")[0])):
                get_model(p.device, p.input, p.output, path=p.path)


def test_documented_guesses_are_never_validated() -> None:
    """TPU, Trainium and Gaudi: no hardware rows and no simulator exist to compare with."""
    for p in presets():
        if DEVICES[p.device].vendor in DOC_ONLY_VENDORS:
            assert p.provenance.levels == (DOCUMENTATION,), p
            assert "only" in p.provenance.note, p
    # No hardware rows exist for B200 tcgen05 FP8: whatever else it gains (an MMA-Sim cross-check), not that.
    assert HARDWARE_ROWS not in preset_provenance("b200", "e4m3", path="tcgen05").levels


def test_cited_tests_exist() -> None:
    """A preset that cites tests names test functions (and published sets) that really exist here."""
    with np.load(ROOT / "tests" / "data" / "tensorcore-hw" / "rows.npz", allow_pickle=False) as z:
        sets = {"-".join((k.split("/")[0], k.split("/")[1], k.split("/")[2].split("_")[-1]))
                for k in z.files if k.split("/")[2].startswith("d_")}
    for p in presets():
        for t in p.provenance.tests:
            path, _, name = t.partition("::")
            assert (ROOT / path).is_file(), t
            func, _, param = name.partition("[")
            assert f"def {func}(" in (ROOT / path).read_text(), t
            if func == "test_published_set_bit_exact":
                assert param.rstrip("]") in sets, t


def test_nvidia_rows_provenance() -> None:
    """Shipped sets reproduce here; derived fits and family inferences say so; the old table is kept."""
    p = preset_provenance("h100", "fp16", "fp32")
    assert HARDWARE_ROWS in p.levels
    assert p.tests[0] == "tests/test_mma_hw.py::test_published_set_bit_exact[H100-fp16-fp32]"
    assert "derived fit" in preset_provenance("h100", "e4m3", "fp16").note
    assert "not re-checked" in preset_provenance("b200", "fp16").note
    h200 = preset_provenance("h200", "tf32")
    assert "published H200 set exists, not shipped here, not re-checked by the tests" in h200.note
    assert "model_validation/H200/tf32/d_H200_fp32.txt" in h200.source and h200.levels == (HARDWARE_ROWS,)
    with pytest.raises(ValueError, match="valid: fp16->fp32"):
        preset_provenance("v100", "bf16")


def test_hardware_rows_level_cites_its_own_evidence() -> None:
    """Guard: "reproduces published hardware rows" only with that chip's own shipped-set test or an entry of the
    explicit evidence table; a family sibling's rows never earn the level."""
    from fpsim.mma.presets import _PUBLISHED_ELSEWHERE, _SHIPPED, _SHIPPED_FMT

    for p in presets():
        if HARDWARE_ROWS not in p.provenance.levels:
            continue
        own = (f"tests/test_mma_hw.py::test_published_set_bit_exact[{_SHIPPED[p.device]}-"
               f"{_SHIPPED_FMT[p.input]}-{p.output}]") if p.device in _SHIPPED else None
        where = _PUBLISHED_ELSEWHERE.get((p.device, p.input, p.output))
        assert (own is not None and own in p.provenance.tests) or where is not None, p
        if own is None:
            assert where is not None and where in p.provenance.source, p
            assert "not re-checked" in p.provenance.note or p.provenance.tests, p
        assert "sibling rows" not in p.provenance.note, p
    for dev, fin, fout in (("a30", "bf16", "fp32"), ("a30", "tf32", "fp32"), ("l40s", "e4m3", "fp32"),
                           ("l40s", "e4m3", "fp16"), ("l40s", "e5m2", "fp32"), ("l40s", "e5m2", "fp16")):
        q = preset_provenance(dev, fin, fout)
        assert q.levels == (DOCUMENTATION,) and "sibling rows only" in q.note, (dev, fin, fout)
        assert f"no {dev.upper()} data for this pair" in q.note
    for dev, fin, fout in (("a2", "fp16", "fp16"), ("a2", "tf32", "fp32"), ("h200", "e4m3", "fp32"),
                           ("h200", "e5m2", "fp16"), ("b200", "e4m3", "fp16"), ("b200", "e5m2", "fp16")):
        q = preset_provenance(dev, fin, fout)
        assert f"published {dev.upper()} set exists, not shipped here, not re-checked by the tests" in q.note


def test_a30_fp16_matches_hpec_output() -> None:
    """The A30 presets against HPEC's published A30 feature-test answers (reference tensorcore.md section 6:
    one extra alignment bit, block FMA size 8, RZ to fp32, RNE to fp16), not against fpsim's A100 model."""
    from fpsim.mma import dot, probe_features

    m = get_model("a30", "fp16")
    f = probe_features(m)
    assert (f["extra_bits"], f["fma_width"], f["rounding"], f["subnormal_inputs"]) == (1, 8, "rtz", True)
    u = 2.0**-24

    def d(a: list[float], b: list[float], c: float, out: str = "fp32") -> float:
        return float(dot(a, b, c, get_model("a30", "fp16", out), input_rounding="exact"))

    assert d([u, u], [1, 1], 1.0) == 1 + 2.0**-23                 # P18: one extra bit passes
    assert d([u, u, u], [1, 0.5, 0.5], 1.0) == 1.0                # P19: two extra bits fail
    for j in range(1, 16):                                         # P20: block FMA size 8
        a = [1.0] + [0.0] * 15
        a[j] = 2.0**-23
        assert d(a, [1.0] * 16, 1 + 2.0**-23) == (2 + 2.0**-22 if j < 8 else 2.0), j
    assert d([1, 1, 1], [1, 1, 1], 1 + 2.0**-10 + 2.0**-9, "fp16") == 4 + 2.0**-8  # P22: RNE to fp16
    for out in ("fp32", "fp16"):
        q = preset_provenance("a30", "fp16", out)
        assert q.levels == (HARDWARE_ROWS,) and "feature-test output only" in q.note
        assert q.tests == ("tests/test_mma_devices.py::test_a30_fp16_matches_hpec_output",)


def test_added_level_keeps_documented_caveats() -> None:
    """A cross-check that lifts a documentation-only preset keeps its caveat; MMA-Sim-only says no hardware rows."""
    p = preset_provenance("b200", "e4m3", path="tcgen05")
    assert p.levels == (MMA_SIM,)
    assert "no hardware data for tcgen05 FP8; width from a third-party statement" in p.note
    assert "DeepGEMM#176" in p.source and "no hardware rows" in p.note
    for q in presets():
        if q.provenance.levels == (MMA_SIM,):
            assert "no hardware rows" in q.provenance.note, q
    nv = preset_provenance("b200", "fp4_e2m1", path="mxf4nvf4")
    assert "global-scale epilogue is an assumption" in nv.note


def test_caveats_are_visible(capsys: pytest.CaptureFixture[str]) -> None:
    """The qualifiers of the notes show in the text table, the JSON and docs/devices.md."""
    rows = {(r["device"], r["input"], r["output"], r["path"]): r for r in preset_table()}
    want = {("a30", "bf16", "fp32", None): "sibling rows", ("h100", "fp8_e4m3", "fp16", None): "derived fit",
            ("h100", "fp8_e4m3", "fp32", None): "rows C = 0 only", ("h200", "fp16", "fp32", None): "not re-checked",
            ("h100", "fp16", "fp16", None): "!= MMA-Sim: fp16-subnormal C at a tie",
            ("mi300x", "fp8_e5m2fnuz", "fp32", None): "!= MMA-Sim: inf/NaN C",
            ("b200", "fp4_e2m1", "fp32", "mxf4nvf4"): "epilogue assumed",
            ("rtx5090", "fp16", "fp32", None): "no hardware rows"}
    for key, cav in want.items():
        assert cav in rows[key]["caveats"], key
    assert rows[("v100", "fp16", "fp32", None)]["caveats"] == []
    assert main(["devices", "h100"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:7] == ["device", "arch", "inputs", "->", "outputs", "provenance", "caveats"]
    assert re.search(r"^h100 .*fp16 -> fp16\s+reproduces .*!= MMA-Sim: fp16-subnormal C at a tie", out, re.M)
    assert re.search(r"^h100 .*fp8_e4m3 -> fp32\s+reproduces .*rows C = 0 only", out, re.M)
    doc = (ROOT / "docs" / "devices.md").read_text()
    assert "| caveats |" in doc and "| sibling rows |" in doc and "not re-checked" in doc


def test_devices_positional_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices", "mi300x"]) == 0
    body = capsys.readouterr().out.splitlines()[2:-1]
    assert body and all(ln.startswith("mi300x") for ln in body)
    assert main(["devices", "MI300X", "--device", "mi300x", "--json"]) == 0
    assert {r["device"] for r in json.loads(capsys.readouterr().out)["presets"]} == {"mi300x"}
    assert main(["devices", "h100", "--device", "a100"]) == 2
    assert "give the device once" in capsys.readouterr().err
    assert main(["devices", "abacus"]) == 2
    assert "unknown device 'abacus'; valid: v100" in capsys.readouterr().err


def test_get_model_keeps_its_errors_and_lists_devices() -> None:
    with pytest.raises(ValueError, match="Volta multiplies fp16 only"):
        get_model("v100", "bf16")
    with pytest.raises(ValueError, match="unknown device 'gtx1080'; valid: .*tpu.*trn1.*") as e:
        get_model("gtx1080", "fp16")
    for name in ("gaudi2", "gaudi3", "trn1", "trn2", "tpu", "h100"):
        assert name in str(e.value)
    with pytest.raises(ValueError, match="valid: bf16->fp32, fp16->fp32, fp8_e4m3->fp32"):
        get_model("trn1", "tf32")
    with pytest.raises(ValueError, match="MME accumulates in FP32; valid"):
        get_model("gaudi3", "bf16", "fp16")
    with pytest.raises(TypeError):
        get_model(3, "fp16")  # type: ignore[arg-type]


def test_aliases() -> None:
    assert get_model("Trainium", "bf16").name.startswith("trn1")
    assert get_model("AWS Trainium2", "fp16").name.startswith("trn2")
    assert get_model("Habana Gaudi2", "bf16").name.startswith("gaudi2")
    assert get_model("Intel Gaudi 3", "bf16").name.startswith("gaudi3")
    assert get_model("Google TPU", "bf16").input.name == "bf16"


def test_registry_refuses_duplicates() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register_preset("tpu", "bf16", "fp32", provenance=Provenance(DOCUMENTATION, "x"), build=None)
    with pytest.raises(ValueError, match="already registered"):
        register_device(DeviceInfo("tpu", "other", "x", "y"))
    with pytest.raises(TypeError):
        register_preset("tpu", "fp16", "fp32", provenance="docs")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="lower-case"):
        register_device(DeviceInfo("My TPU", "x", "x", "x"))


# ------------------------------------------------------------------------------------ the command

def test_devices_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["device", "arch", "inputs", "->", "outputs", "provenance", "caveats", "source"]
    body = out[2:-1]
    assert len(body) == len(preset_table())
    text = "\n".join(out)
    for dev in DEVICES:
        assert re.search(rf"^{dev}\s", text, re.M), dev
    assert re.search(r"^tpu .*fp32 -> fp32 \[bf16_bf16_f32_x3\]\s+from documentation only", text, re.M)
    assert re.search(r"^t4 .*fp16 -> fp32\s+agrees with MMA-Sim", text, re.M)
    assert main(["DEVICES", "--device", "Gaudi2"]) == 0
    assert all(ln.startswith("gaudi2") for ln in capsys.readouterr().out.splitlines()[2:-1])


def test_devices_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["levels"] == list(LEVELS)
    rows = doc["presets"]
    assert len(rows) == len(presets()) + sum(1 for d in DEVICES if not presets(d))
    for r in rows:
        assert tuple(r) == TABLE_KEYS
        assert isinstance(r["levels"], list) and isinstance(r["tests"], list)
        assert r["validated"] == (r["levels"] != [] and DOCUMENTATION not in r["levels"])
    h100 = next(r for r in rows if (r["device"], r["input"], r["output"]) == ("h100", "fp16", "fp32"))
    assert h100["vendor"] == "NVIDIA" and HARDWARE_ROWS in h100["levels"] and h100["tests"]


def test_devices_bad_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices", "--device", "abacus"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fpsim devices: error: unknown device 'abacus'; valid: v100")
    assert "tpu" in err and "gaudi2" in err and "trn1" in err


# ------------------------------------------------------------------------------------- Trainium

def _bf16_neighbours(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lo = np.asarray(fpsim.round(x, "bf16", "rdn"), dtype=np.float64)
    hi = np.asarray(fpsim.round(x, "bf16", "rup"), dtype=np.float64)
    return lo, hi


def test_trainium_sr_is_unbiased_with_exact_probabilities() -> None:
    """P(round up) = (x - lo) / (hi - lo) exactly (fractions), checked by counting 20000 draws per value."""
    rng = np.random.default_rng(11)
    vals = np.array([1 + 2.0**-9, 1 + 3 * 2.0**-10, -3.0 - 2.0**-7 * 0.3, 1e-3, 12345.678], F32)
    n = 20000
    x = np.repeat(vals, n)
    r = np.asarray(trainium.convert(x, stochastic_rounding=True, rng=rng), dtype=np.float64).reshape(len(vals), n)
    lo, hi = _bf16_neighbours(vals)
    for i, v in enumerate(vals):
        p = Fraction(float(v)) - Fraction(lo[i])
        p = p / (Fraction(hi[i]) - Fraction(lo[i]))
        assert set(np.unique(r[i])) <= {lo[i], hi[i]}
        ups = int((r[i] == hi[i]).sum())
        sd = (n * float(p) * (1 - float(p))) ** 0.5
        assert abs(ups - n * float(p)) < 5 * sd + 1, (float(v), ups, float(p))


def test_trainium_sr_bits_equal_fpsim_round_sr() -> None:
    rng = np.random.default_rng(12)
    x = rng.standard_normal(5000).astype(F32)
    for bits in (None, 8):
        a = trainium.convert(x, stochastic_rounding=True, rng=np.random.default_rng(7), sr_bits=bits)
        b = fpsim.round(x, "bf16", "sr", rng=np.random.default_rng(7), sr_bits=bits)
        assert np.array_equal(np.asarray(a).view(np.uint32), np.asarray(b).view(np.uint32))
    # RNE (the default) against ml_dtypes' cast (one rounding from float32).
    want = x.astype(ml_dtypes.bfloat16).astype(F32)
    assert np.array_equal(np.asarray(trainium.convert(x)).view(np.uint32), want.view(np.uint32))
    with pytest.raises(ValueError, match="needs rng"):
        trainium.convert(x, stochastic_rounding=True)
    with pytest.raises(ValueError, match="valid: bf16, fp16"):
        trainium.convert(x, "tf32")


def test_neuron_rounding_env() -> None:
    assert trainium.neuron_rounding({}) == "rne"
    assert trainium.neuron_rounding({"NEURON_RT_STOCHASTIC_ROUNDING_EN": "1"}) == "sr"
    assert trainium.neuron_rounding({"XLA_DOWNCAST_BF16": "1"}) == "sr"
    assert trainium.neuron_rounding({"XLA_USE_BF16": "1", "NEURON_RT_STOCHASTIC_ROUNDING_EN": " 0 "}) == "rne"
    with pytest.raises(ValueError, match="valid: 1, 0, true, false"):
        trainium.neuron_rounding({"NEURON_RT_STOCHASTIC_ROUNDING_EN": "yes"})


def test_trainium_matmul_against_mpfr_chain() -> None:
    """RNE conversion, exact products, fp32 RNE accumulation in K order: MPFR's fma chain, bit for bit."""
    rng = np.random.default_rng(13)
    A = rng.standard_normal((5, 33)).astype(F32)
    B = rng.standard_normal((33, 4)).astype(F32)
    C = rng.standard_normal((5, 4)).astype(F32)
    got = trainium.matmul(A, B, C)
    qa, qb = A.astype(ml_dtypes.bfloat16).astype(float), B.astype(ml_dtypes.bfloat16).astype(float)
    ctx = gmpy2.context(precision=24, emin=-148, emax=128, subnormalize=True)
    want = np.empty((5, 4), F32)
    for i in range(5):
        for j in range(4):
            d = gmpy2.mpfr(float(C[i, j]))
            with ctx:
                for k in range(33):
                    d = gmpy2.fma(gmpy2.mpfr(qa[i, k]), gmpy2.mpfr(qb[k, j]), d)
            want[i, j] = float(d)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    # Stochastic rounding: the conversions draw A then B from rng, then the same accumulation.
    g = np.random.default_rng(5)
    sa = fpsim.round(A, "bf16", "sr", rng=g)
    sb = fpsim.round(B, "bf16", "sr", rng=g)
    want_sr = fpsim.matmul(sa, sb, C, model=get_model("trn1", "bf16"), input_rounding="exact")
    got_sr = trainium.matmul(A, B, C, stochastic_rounding=True, rng=np.random.default_rng(5))
    assert np.array_equal(got_sr, want_sr)
    assert not np.array_equal(got_sr, got)


# ---------------------------------------------------------------------------------------- Gaudi

def test_gaudi_fp8_variants() -> None:
    """Gaudi 2 E4M3 is fnuz (max 240), Gaudi 3 OCP E4M3 (max 448): conversions against ml_dtypes."""
    m2, m3 = get_model("gaudi2", "fp8_e4m3"), get_model("gaudi3", "e4m3")
    assert (m2.input.name, m2.input.max) == ("fp8_e4m3fnuz", 240.0)
    assert (m3.input.name, m3.input.max) == ("fp8_e4m3", 448.0)
    assert get_model("gaudi2", "fp8_e4m3fnuz") == m2
    x = np.array([[300.0, 100.0, -2.0**-9, 1.0 / 3]], F32)
    one = np.ones((4, 1), F32)
    for m, dt in ((m2, ml_dtypes.float8_e4m3fnuz), (m3, ml_dtypes.float8_e4m3fn)):
        sat = np.clip(x, -float(m.input.max), float(m.input.max))  # fpsim's FP8 input conversions saturate
        want = sat.astype(dt).astype(np.float64) @ one
        got = fpsim.matmul(x, one, model=m)
        assert got[0, 0] == np.float32(want[0, 0]), m.name
    assert gaudi.input_format("gaudi2", "e5m2") == "fp8_e5m2"


def test_gaudi_exponent_bias_scales() -> None:
    assert gaudi.hw_scales("gaudi2", "fp8_e4m3") == (16.0, 1.0, 2.0**-4, 2.0**-8)
    assert gaudi.hw_scales("gaudi2", "fp8_e5m2") == (1.0,)
    s3 = gaudi.hw_scales("gaudi3", "e4m3")
    assert (len(s3), s3[0], s3[-1]) == (63, 2.0**7, 2.0**-55)
    with pytest.raises(ValueError, match="FP8 inputs"):
        gaudi.hw_scales("gaudi3", "bf16")
    with pytest.raises(ValueError, match="not a Gaudi device"):
        gaudi.hw_scales("h100", "e4m3")


def test_docs_table_is_current() -> None:
    """docs/devices.md lists every registered preset (regenerate: python tools/update_devices_doc.py)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("update_devices_doc", ROOT / "tools" / "update_devices_doc.py")
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    text = (ROOT / "docs" / "devices.md").read_text()
    assert tool.render(text) == text, "docs/devices.md is stale: run python tools/update_devices_doc.py"
