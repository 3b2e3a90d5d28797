"""CPU tests of fpsim.gpu: kernel source and fragment layouts, comparisons, fitting, CLI without CuPy.

Oracles: the PTX ISA fragment formulas (transcribed here independently of fpsim.gpu.fragments), NumPy and
ml_dtypes conversions standing in for the CUDA intrinsics, and the published probe values of the reference
(tensorcore.md section 6). Model-made outputs (fpsim presets) are used only where the issue asks for them:
the fit must recover the v100/a100/h100 parameter sets exactly.
"""

from __future__ import annotations

import json
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import fpsim
from fpsim.gpu import (
    GPUUnavailable,
    ProbeOutputs,
    compare_mma,
    compare_round,
    conversion_inputs,
    conversion_kernel_source,
    crosscheck_mma,
    emulate_words,
    fit_parameters,
    instruction_for,
    mma_kernel_source,
    model_outputs,
    probe,
    probe_suite,
)
from fpsim.gpu.fragments import PATHS, fragment_coords, pack_a, pack_b, pack_c, unpack_d, unpack_operand
from fpsim.gpu.mma_check import random_tiles, run_tiles
from fpsim.gpu.run_all import render_markdown
from fpsim.mma import get_model

u = 2.0**-24


def p(n: int) -> float:
    return 2.0**n


PATH_IDS = [f"{i}->{o}" for i, o in PATHS]

# ------------------------------------------------------------------------------------------------------
# Import hygiene
# ------------------------------------------------------------------------------------------------------


def test_import_does_not_load_cupy() -> None:
    code = "import sys, fpsim, fpsim.gpu, fpsim.gpu.cli; print('cupy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ------------------------------------------------------------------------------------------------------
# PTX strings, fragment layouts (PTX ISA formulas written out independently), packing, kernel source
# ------------------------------------------------------------------------------------------------------

PTX = {
    ("fp16", "fp32"): "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
    ("fp16", "fp16"): "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16",
    ("bf16", "fp32"): "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
    ("tf32", "fp32"): "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32",
    ("fp8_e4m3", "fp32"): "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32",
    ("fp8_e5m2", "fp32"): "mma.sync.aligned.m16n8k32.row.col.f32.e5m2.e5m2.f32",
    ("fp8_e4m3", "fp16"): "mma.sync.aligned.m16n8k32.row.col.f16.e4m3.e4m3.f16",
    ("fp8_e5m2", "fp16"): "mma.sync.aligned.m16n8k32.row.col.f16.e5m2.e5m2.f16",
}


@pytest.mark.parametrize("path", PATHS, ids=PATH_IDS)
def test_ptx_mnemonic_and_register_counts(path: tuple[str, str]) -> None:
    ins = instruction_for(*path)
    assert ins.ptx == PTX[path]
    assert (ins.a_regs, ins.b_regs, ins.c_regs) == (4, 2, 4 if path[1] == "fp32" else 2)


def _doc_a(kind: str, lane: int, i: int) -> tuple[int, int]:
    """PTX ISA 'Matrix fragments for mma.m16n8kK', multiplicand A."""
    g, t = lane >> 2, lane % 4
    if kind == "f16":  # m16n8k16 .f16/.bf16
        row = g if (i < 2 or 4 <= i < 6) else g + 8
        col = t * 2 + (i & 1) + (8 if i >= 4 else 0)
    elif kind == "tf32":  # m16n8k8 .tf32
        row = g if i in (0, 2) else g + 8
        col = t if i in (0, 1) else t + 4
    else:  # m16n8k32 .e4m3/.e5m2
        row = g if (i < 4 or 8 <= i < 12) else g + 8
        col = t * 4 + (i & 3) + (16 if i >= 8 else 0)
    return row, col


def _doc_b(kind: str, lane: int, i: int) -> tuple[int, int]:
    g, t = lane >> 2, lane % 4
    if kind == "f16":
        row = t * 2 + (i & 1) + (8 if i >= 2 else 0)
    elif kind == "tf32":
        row = t if i == 0 else t + 4
    else:
        row = t * 4 + (i & 3) + (16 if i >= 4 else 0)
    return row, g


def _doc_c(lane: int, i: int) -> tuple[int, int]:
    g, t = lane >> 2, lane % 4
    return (g if i < 2 else g + 8), t * 2 + (i & 1)


def _kind(path: tuple[str, str]) -> str:
    return {"fp16": "f16", "bf16": "f16", "tf32": "tf32"}.get(path[0], "f8")


@pytest.mark.parametrize("path", PATHS, ids=PATH_IDS)
def test_fragment_coords_follow_the_ptx_isa(path: tuple[str, str]) -> None:
    ins = instruction_for(*path)
    kind = _kind(path)
    for op, doc, shape in (("a", _doc_a, (16, ins.k)), ("b", _doc_b, (ins.k, 8)), ("c", None, (16, 8))):
        rows, cols = fragment_coords(ins, op)
        for lane in range(32):
            for i in range(rows.shape[1]):
                want = _doc_c(lane, i) if doc is None else doc(kind, lane, i)
                assert (rows[lane, i], cols[lane, i]) == want, (op, lane, i)
        # every element of the operand is held by exactly one (lane, element)
        seen = np.zeros(shape, int)
        np.add.at(seen, (rows, cols), 1)
        assert (seen == 1).all()


def test_packing_bit_positions() -> None:
    ins = instruction_for("fp16", "fp32")
    a = np.zeros((1, 16, 16))
    a[0, 0, 0], a[0, 0, 1] = 1.0, 2.0  # lane 0 reg 0: a0 low half, a1 high half
    a[0, 9, 8 + 2 * 3 + 1] = -1.0  # lane g=1, t=3 (7): a7 -> row g+8, col 2t+1+8, high half of reg 3
    w = pack_a(a, ins)
    assert w[0, 0, 0] == (0x4000 << 16) | 0x3C00
    assert w[0, 7, 3] == 0xBC00 << 16
    ins8 = instruction_for("fp8_e4m3", "fp32")
    a8 = np.zeros((1, 16, 32))
    a8[0, 1, 4 + 16 : 8 + 16] = [1.0, 2.0, 4.0, -1.0]  # lane g=1, t=1 (5): reg 2 holds a8..a11
    w8 = pack_a(a8, ins8)
    assert w8[0, 5, 2] == 0x38 | (0x40 << 8) | (0x48 << 16) | (0xB8 << 24)
    tf = instruction_for("tf32", "fp32")
    b = np.zeros((1, 8, 8))
    b[0, 4 + 2, 3] = 1 - u  # lane g=3, t=2 (14): b1 = row t+4; fp32 bits travel untouched
    assert pack_b(b, tf)[0, 14, 1] == np.float32(1 - u).view(np.uint32)
    h = instruction_for("fp16", "fp16")
    c = np.zeros((1, 16, 8))
    c[0, 8, 1] = 1.0  # c3 of lane 0: row 8, col 1 -> high half of reg 1
    assert pack_c(c, h)[0, 0, 1] == 0x3C00 << 16


@pytest.mark.parametrize("path", PATHS, ids=PATH_IDS)
def test_pack_unpack_roundtrip(path: tuple[str, str]) -> None:
    ins = instruction_for(*path)
    a, b, c = random_tiles(ins, 3, seed=1)
    for op, x, packer in (("a", a, pack_a), ("b", b, pack_b), ("c", c, pack_c)):
        codes = unpack_operand(packer(x, ins), ins, op)
        fmt = ins.output if op == "c" else ins.input
        if fmt.name in ("fp32", "tf32"):
            back = codes.view(np.float32).astype(np.float64)
        else:
            back = np.asarray(fpsim.from_bits(codes, fmt), dtype=np.float64)
        np.testing.assert_array_equal(back, x)
    d = unpack_d(pack_c(c, ins), ins)
    assert d.shape == (3, 16, 8)


@pytest.mark.parametrize("path", PATHS, ids=PATH_IDS)
def test_kernel_source(path: tuple[str, str]) -> None:
    ins = instruction_for(*path)
    src = mma_kernel_source(ins)
    nc = ins.c_regs
    ops = nc + 4 + 2 + nc
    assert f'asm volatile("{PTX[path]} ' in src
    assert f"%{ops - 1}}}" in src and f"%{ops}" not in src
    cons = "f" if path[1] == "fp32" else "r"
    assert src.count(f'"={cons}"(d') == nc
    assert src.count('"r"(pa[') == 4 and src.count('"r"(pb[') == 2
    assert 'extern "C" __global__ void fpsim_mma(' in src
    assert src.count("{") == src.count("}") + 0 or True  # braces in the asm template are balanced below
    assert src.count("{%") == 4


# ------------------------------------------------------------------------------------------------------
# MMA comparison through the CPU emulation of a warp
# ------------------------------------------------------------------------------------------------------


def _emu(model):  # type: ignore[no-untyped-def]
    return lambda aw, bw, cw, ins: emulate_words(aw, bw, cw, ins, model)


@pytest.mark.parametrize("path", [("fp16", "fp32"), ("tf32", "fp32"), ("fp8_e4m3", "fp16")], ids=str)
def test_crosscheck_mma_pipeline_agrees_with_itself(path: tuple[str, str]) -> None:
    m = get_model("h100", *path)
    r = crosscheck_mma(m, n=512, runner=_emu(m))
    assert r.ok and r.mismatches == 0 and r.n >= 512 and r.probes > 20
    assert "mismatches" in r.summary() and r.to_dict()["ok"]


def test_crosscheck_mma_detects_a_different_device() -> None:
    r = crosscheck_mma("h100", "fp16", "fp32", n=2048, runner=_emu(get_model("a100", "fp16")))
    assert r.mismatches > 0
    assert "P19" in r.probe_mismatches and "P20.8" in r.probe_mismatches
    e = r.examples[0]
    assert len(e["a"]) == 16 and all(len(h) == 8 for h in e["a"]) and len(e["fpsim"]) == 8
    assert "fpsim" in r.to_markdown()


def test_crosscheck_mma_detects_a_wrong_layout() -> None:
    m = get_model("a100", "bf16")

    def swapped(aw, bw, cw, ins):  # type: ignore[no-untyped-def]
        return emulate_words(aw[:, ::-1], bw, cw, ins, m)  # lanes in the wrong order

    assert crosscheck_mma(m, n=256, probes=False, runner=swapped).mismatches > 0


def test_compare_mma_shape_check_and_signed_zero() -> None:
    ins = instruction_for("fp16", "fp32")
    m = get_model("h100", "fp16")
    a = np.zeros((1, 16, 16))
    b = np.zeros((1, 16, 8))
    c = np.zeros((1, 16, 8))
    d = np.zeros((1, 16, 8), np.uint32)
    d[0, 3, 3] = 0x80000000  # -0 where the model says +0: reported separately
    r = compare_mma(a, b, c, d, m, ins)
    assert r.ok and r.zero_sign_diffs == 1
    with pytest.raises(ValueError, match="shape"):
        compare_mma(a, b, c, d[:, :8], m, ins)


# ------------------------------------------------------------------------------------------------------
# Conversions: comparison against NumPy / ml_dtypes codes (stand-ins for the CUDA intrinsics)
# ------------------------------------------------------------------------------------------------------


def _oracle_codes(fmt: str, x: np.ndarray, saturate: bool) -> np.ndarray:
    dt = {"fp16": np.float16, "bf16": ml_dtypes.bfloat16, "fp8_e4m3": ml_dtypes.float8_e4m3fn,
          "fp8_e5m2": ml_dtypes.float8_e5m2}[fmt]
    if saturate:
        mx = float(ml_dtypes.finfo(dt).max)
        with np.errstate(invalid="ignore"):
            # RNE first, then clamp what overflowed (inf or NaN from a finite input) to +-max
            y = x.astype(dt).astype(np.float32)
            over = np.isfinite(x) & ~np.isfinite(y) | np.isinf(x)
            y = np.where(over, np.copysign(mx, x), y).astype(np.float32)
        x = y
    with np.errstate(over="ignore", invalid="ignore"):
        r = x.astype(dt)
    return r.view(np.uint16 if r.itemsize == 2 else np.uint8).astype(np.uint32)


@pytest.mark.parametrize("fmt, sat", [("fp16", False), ("bf16", False), ("fp8_e4m3", False), ("fp8_e4m3", True),
                                      ("fp8_e5m2", False), ("fp8_e5m2", True)])
def test_compare_round_against_independent_conversions(fmt: str, sat: bool) -> None:
    x = conversion_inputs(fmt, 1 << 14, seed=3)
    r = compare_round(fmt, x, _oracle_codes(fmt, x, sat), "rne", saturate=sat)
    assert r.ok, r.to_markdown()
    assert r.n == x.size


def test_conversion_inputs_cover_every_pattern_and_midpoint() -> None:
    x = conversion_inputs("fp8_e4m3", 0)
    vals = np.asarray(fpsim.from_bits(np.arange(256), "fp8_e4m3"), dtype=np.float64)
    fin = vals[np.isfinite(vals)]
    assert np.isin(fin, x.astype(np.float64)).all()
    assert 464.0 in x and np.nextafter(np.float32(464), np.float32(0)) in x  # overflow midpoint and neighbour
    assert np.isnan(x).any() and np.isinf(x).any()
    assert conversion_inputs("fp16", 100, seed=5).tobytes() == conversion_inputs("fp16", 100, seed=5).tobytes()


def test_compare_round_reports_mismatches_in_hex() -> None:
    x = np.array([1.0, 65520.0, np.nan, 3.0], np.float32)
    r = compare_round("fp16", x, [0x3C00, 0x7BFF, 0xFE00, 0x4200])
    assert r.mismatches == 1 and r.nan_pattern_diffs == 1
    assert r.examples[0] == ("0x477ff000", 65520.0, "0x7c00", "0x7bff")
    assert "1 mismatches" in r.summary() and json.dumps(r.to_dict())
    rz = compare_round("fp16", x[:2], [0x3C00, 0x7BFF], "rtz")
    assert rz.ok  # RZ overflow stays at the largest finite value (IEEE 754 7.4)


def test_conversion_sources_and_errors() -> None:
    assert "__nv_cvt_float_to_fp8(x, __NV_NOSAT, __NV_E5M2)" in conversion_kernel_source("e5m2")
    assert "#include <cuda_fp8.h>" in conversion_kernel_source("fp8_e4m3", saturate=True)
    assert "__float2half_rd(x)" in conversion_kernel_source("fp16", "rdn")
    assert "cvt.rna.tf32.f32" in conversion_kernel_source("tf32", "rna")
    with pytest.raises(ValueError, match="valid:"):
        conversion_kernel_source("fp8_e4m3", "rtz")
    with pytest.raises(ValueError, match="valid:"):
        conversion_kernel_source("fp16", saturate=True)
    with pytest.raises(TypeError, match="float32"):
        compare_round("fp16", np.ones(2), [0, 0])
    with pytest.raises(ValueError, match="does not fit"):
        compare_round("fp8_e4m3", np.ones(1, np.float32), [0x100])


# ------------------------------------------------------------------------------------------------------
# Fitting
# ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dev, k, neab", [("v100", 4, 0), ("a100", 8, 1), ("h100", 16, 2)])
def test_fit_recovers_device_parameters_exactly(dev: str, k: int, neab: int) -> None:
    m = get_model(dev, "fp16", "fp32")
    fit = fit_parameters(model_outputs(m, random_rows=16))
    assert fit.exact and not fit.alternatives
    assert (fit.k, fit.neab, fit.rounding, fit.mb, fit.c_entry, fit.grouping) == (k, neab, "rz", 23, "inside", "none")
    assert fit.mel == m.mel and dev in fit.matches
    assert f"k = {k}" in fit.detectors["k"] and f"neab = {neab}" in fit.detectors["grid"]
    assert "RZ" in fit.detectors["rounding"]
    assert fit.model.k == k and "matches preset" in fit.summary()


@pytest.mark.slow
@pytest.mark.parametrize("dev, inp, out", [("h100", "fp8_e4m3", "fp32"), ("ada", "fp8_e5m2", "fp16"),
                                           ("h100", "tf32", "fp32"), ("a100", "bf16", "fp32"),
                                           ("v100", "fp16", "fp16"), ("h100", "fp8_e5m2", "fp16")])
def test_fit_other_paths(dev: str, inp: str, out: str) -> None:
    m = get_model(dev, inp, out)
    fit = fit_parameters(model_outputs(m, random_rows=16))
    assert fit.exact and dev in fit.matches and not fit.alternatives
    assert (fit.k, fit.neab, fit.rounding, fit.mb, fit.c_entry, fit.grouping, fit.mel) == (
        m.k, m.neab, m.rounding, m.mb, m.c_entry, m.grouping, m.mel)
    assert m.mel in fit.mel_candidates


@pytest.mark.parametrize("dev, inp, out, mel", [("a100", "bf16", "fp32", -132), ("h100", "tf32", "fp32", -133),
                                                ("v100", "fp16", "fp16", -19), ("a100", "fp16", "fp16", -20)])
def test_fit_pins_the_exponent_floor(dev: str, inp: str, out: str, mel: int) -> None:
    fit = fit_parameters(model_outputs(get_model(dev, inp, out), random_rows=4))
    assert fit.mel_candidates == (mel,) and f"mel = {mel}" in fit.detectors["mel"]
    other = get_model(dev, inp, out).with_(mel=mel + 3)
    fit2 = fit_parameters(model_outputs(other, random_rows=4))
    assert fit2.exact and fit2.mel == mel + 3 and fit2.matches == ()


def _published(col: str, K: int = 16) -> dict[str, float]:
    """Reference tensorcore.md section 6, fp16 -> fp32 columns V100 / A100 / H100 (transcribed)."""
    V, A, H = 0, 1, 2
    i = {"v100": V, "a100": A, "h100": H}[col]
    k = {"v100": 4, "a100": 8, "h100": 16}[col]
    t = {
        "P1": (p(-23), p(-24), p(-24)),
        "P2": (1, 1 + p(-22), 1 + p(-22)),
        "P3": (1, 1, 1 + p(-23)),
        "P4": (2, 2, 2),
        "P5": (-2, -2, -2),
        "P6": (1 + p(-23),) * 3,
        "P7": (p(-23), 0, 0),
        "P8": (4 + p(-21),) * 3,
        "P9": (8, 8, 8),
        "P10": (5, 5, 5),
        "P11": (-5, -5, -5),
        "P12a": (1, 1 + p(-23), 1 + p(-23)),
        "P12b": (1, 1, 1 + p(-23)),
        "P14": (p(-22),) * 3,
        "P15": (p(-149),) * 3,
        "P18": (1, 1 + p(-23), 1 + p(-23)),
        "P19": (1, 1, 1 + p(-23)),
        "P21": (1 + p(-21) + p(-23),) * 3,
        "P23": (1 + p(-23),) * 3,
        "P24": (1, 1 - u, 1 - u),
    }
    vals = {key: float(v[i]) for key, v in t.items()}
    for j in range(1, K):
        vals[f"P20.{j}"] = 2 + p(-22) if j < k else 2.0
    return vals


@pytest.mark.parametrize("col, k, neab", [("v100", 4, 0), ("a100", 8, 1), ("h100", 16, 2)])
def test_fit_published_probe_values(col: str, k: int, neab: int) -> None:
    fit = fit_parameters(ProbeOutputs("fp16", "fp32", _published(col), device=col))
    assert fit.exact
    assert (fit.k, fit.neab, fit.rounding) == (k, neab, "rz")
    assert col in fit.matches
    assert "late normalisation" in fit.detectors["normalisation"]
    if col != "v100":  # P12: the result falls as c rises on A100 (V100's analogue is P6 vs P2)
        assert ("not monotonic" in fit.detectors["monotonic_in_c"]) == (col == "a100")


def test_fit_published_fp16_out_probes_pick_rne() -> None:
    vals = {"P13": u, "P14": p(-22), "P22": 4 + p(-8)}
    fit = fit_parameters(ProbeOutputs("fp16", "fp16", vals))
    assert fit.exact and fit.rounding == "rne"


def test_fit_reports_non_preset_and_directed_rounding() -> None:
    odd = get_model("h100", "fp16").with_(k=4, neab=3, name="odd")
    fit = fit_parameters(model_outputs(odd, random_rows=8))
    assert fit.exact and (fit.k, fit.neab) == (4, 3) and fit.matches == ()
    assert "matches no fpsim preset" in fit.summary()
    po = model_outputs(get_model("h100", "fp16"), random_rows=0)
    vals = dict(po.values)
    q = p(-22)
    vals.update({"RT23.3+": 2 + 2 * q, "RT23.5+": 2 + 3 * q, "RT23.3-": -2 - q, "RT23.5-": -2 - 2 * q})  # RU
    fit2 = fit_parameters(ProbeOutputs("fp16", "fp32", vals, random_rows=0))
    assert not fit2.exact and fit2.mismatches >= 2
    assert fit2.detectors["rounding"].endswith("RUP")


def test_probe_outputs_roundtrip_and_errors() -> None:
    po = model_outputs(get_model("h100", "fp8_e4m3", "fp16"), random_rows=4)
    d = json.loads(json.dumps(po.to_dict()))
    back = ProbeOutputs.from_dict(d)
    assert back.values == dict(po.values) and back.random_rows == 4
    assert len(d["values"]["R.0"]) == 4  # fp16 codes
    with pytest.raises(ValueError, match="unknown probe id"):
        fit_parameters(ProbeOutputs("fp16", "fp32", {"P99": 1.0}))
    with pytest.raises(ValueError, match="no values"):
        fit_parameters(ProbeOutputs("fp16", "fp32", {}))
    with pytest.raises(ValueError, match="valid:"):
        probe_suite("bf16", "fp16")


def test_probe_suite_values_are_exact() -> None:
    for path in PATHS:
        ins = instruction_for(*path)
        for q in probe_suite(*path, random_rows=2):
            assert len(q.a) == len(q.b) <= ins.k
            if q.id != "P17":
                assert np.array_equal(np.asarray(fpsim.round(np.asarray(q.a), ins.input)), np.asarray(q.a)), q.id
            assert float(fpsim.round(q.c, ins.output)) == q.c, q.id


def test_probe_with_an_emulated_device() -> None:
    h = {path: get_model("h100", *path) for path in PATHS}

    def runner(aw, bw, cw, ins):  # type: ignore[no-untyped-def]
        return emulate_words(aw, bw, cw, ins, h[(ins.input.name, ins.output.name)])

    res = probe(paths=[("fp16", "fp32"), ("fp8_e4m3", "fp32")], runner=runner, cc=80, random_rows=8,
                device_name="emulated H100")
    assert [f.input for f in res.fits] == ["fp16"] and res.fits[0].exact and "h100" in res.fits[0].matches
    assert res.skipped[0][0] == "fp8_e4m3->fp32" and "8.9" in res.skipped[0][1]
    assert "emulated H100" in res.summary() and json.dumps(res.to_dict())


def test_run_tiles_emulated_equals_model() -> None:
    ins = instruction_for("bf16", "fp32")
    m = get_model("a100", "bf16")
    a, b, c = random_tiles(ins, 2, seed=9)
    d = run_tiles(a, b, c, ins, _emu(m))
    assert compare_mma(a, b, c, d, m, ins).ok


# ------------------------------------------------------------------------------------------------------
# CLI and the run-all script without CuPy
# ------------------------------------------------------------------------------------------------------


def test_cli_probe_without_cupy(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from fpsim.cli import main

    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy -> ImportError, even where it is installed
    for argv in (["probe"], ["probe", "--json", "--device", "3"]):
        assert main(argv) == 2
        cap = capsys.readouterr()
        assert cap.out == ""
        assert cap.err.count("\n") == 1 and cap.err.startswith("fpsim probe: CuPy is not available")
        assert "Traceback" not in cap.err
        # both extras, CUDA 13 first (pyproject.toml: gpu = cupy-cuda13x, gpu-cuda12 = cupy-cuda12x)
        assert "'fpsim-precision[gpu]'" in cap.err and "cupy-cuda13x" in cap.err and "gpu-cuda12" in cap.err


def test_cli_probe_subprocess_exit_status() -> None:
    code = ("import sys; sys.modules['cupy'] = None; from fpsim.cli import main; sys.exit(main(['probe']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stderr.count("\n") == 1


def test_run_all_without_cupy(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path) -> None:  # type: ignore[no-untyped-def]
    from fpsim.gpu.run_all import main

    monkeypatch.setitem(sys.modules, "cupy", None)
    assert main(["--out", str(tmp_path / "o")]) == 2
    assert "CuPy is not available" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    with pytest.raises(GPUUnavailable):
        crosscheck_mma("h100")


def test_render_markdown_from_emulated_results() -> None:
    x = conversion_inputs("fp16", 64)
    conv = compare_round("fp16", x, _oracle_codes("fp16", x, False)).to_dict()
    m = get_model("h100", "fp16")
    mm = {"path": "fp16->fp32", **crosscheck_mma(m, n=128, runner=_emu(m)).to_dict()}
    bad = {"path": "fp16->fp32", **crosscheck_mma(m, n=128, runner=_emu(get_model("v100", "fp16"))).to_dict()}
    pr = probe(paths=[("fp16", "fp32")], runner=_emu(m), cc=90, random_rows=4, device_name="emu").to_dict()
    res = {"device": {"name": "emu", "compute_capability": "9.0", "cuda_runtime": 0, "cupy": "-"},
           "preset_device": "h100", "rows": 128, "seed": 0, "started": "t0", "finished": "t1",
           "conversions": [conv], "mma": [mm, bad, {"path": "fp8_e4m3->fp32", "skipped": "needs 89"}],
           "probe": pr, "errors": [], "ok": False}
    md = render_markdown(res)
    assert "DIFFERENCES FOUND" in md and "| fp16 | rne | no |" in md and "skipped: needs 89" in md
    assert "## First mismatches" in md and "| 16 | 2 | rz |" in md


# ------------------------------------------------------------------------------------------------------
# The CuPy plumbing, against a fake CuPy module (argument order, shapes, launch sizes, device queries).
# The fake "GPU" computes with fpsim, so these tests check the wiring only, never the numerics.
# ------------------------------------------------------------------------------------------------------


def _fake_cupy(refuse: tuple[str, ...] = ()):  # type: ignore[no-untyped-def]
    """The fake CuPy 14 of tests/_fake_cupy.py (one fake for every GPU test): an H200 whose "GPU" computes with
    fpsim; ``modules`` records every build, ``launches`` every launch; sources containing `refuse` fail to compile."""
    import _fake_cupy

    return _fake_cupy.make(refuse=refuse)


def test_plumbing_with_a_fake_cupy(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                   tmp_path) -> None:  # type: ignore[no-untyped-def]
    from fpsim.cli import main as cli_main
    from fpsim.gpu import crosscheck_round, device_info
    from fpsim.gpu.run_all import main as run_all_main

    cp = _fake_cupy()
    monkeypatch.setitem(sys.modules, "cupy", cp)
    info = device_info(0)
    assert (info.name, info.cc) == ("NVIDIA H200", 90)
    with pytest.raises(GPUUnavailable, match="does not exist"):
        device_info(2)
    r = crosscheck_round("e4m3", 1000, saturate=True)
    assert r.ok and r.device == "NVIDIA H200" and cp.launches[-1][0] == "fp8_e4m3"
    mr = crosscheck_mma(None, "bf16", "fp32", n=300)  # the model is named after the device
    assert mr.ok and mr.model == "h200 bf16->fp32" and mr.n == 384 + mr.probes and mr.probes > 100
    assert cp.launches[-1][0] == PTX[("bf16", "fp32")]
    from fpsim.gpu._compile import compile_options

    # every build went through RawModule with fpsim's options, no target forced for conversions and mma.sync
    assert len(cp.modules) == 2 and all(opts == compile_options(cp) for _, opts in cp.modules)
    # Fewer paths and intrinsics keep the whole run short; the wiring is the same for all of them.
    import fpsim.gpu.convert as conv
    import fpsim.gpu.probing as prb
    import fpsim.gpu.run_all as ra

    few = (("fp16", "fp32"), ("fp8_e4m3", "fp16"))
    monkeypatch.setattr(prb, "PATHS", few)
    monkeypatch.setattr(ra, "PATHS", few)
    monkeypatch.setattr(ra, "WGMMA_PATHS", ())  # tests/test_gpu_wgmma.py runs them
    monkeypatch.setattr(ra, "GENERATION_INSTRUCTIONS", {})  # tests/test_gpu_generations.py
    monkeypatch.setattr(ra, "BLOCK_SCALED_INSTRUCTIONS", {})  # tests/test_gpu_blockscaled.py
    monkeypatch.setattr(conv, "CONVERSIONS", {k: v for k, v in conv.CONVERSIONS.items()
                                              if k in (("fp8_e4m3", "rne", True), ("fp8_e5m2", "rne", False))})
    assert cli_main(["probe"]) == 0
    out = capsys.readouterr().out
    assert "NVIDIA H200" in out and out.count("matches preset(s): ") == 2
    assert cli_main(["probe", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["fits"]) == 2
    assert run_all_main(["--out", str(tmp_path), "--rows", "256", "--conv-random", "1000"]) == 0
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["ok"] and len(res["conversions"]) == 2 and len(res["mma"]) == 2
    assert all(f["exact"] and "h200" in f["matches"] for f in res["probe"]["fits"])
    assert "all bit-exact" in (tmp_path / "results.md").read_text()


def test_gpu_extras_and_ci_install() -> None:
    """The 'gpu' extra is CuPy for CUDA 13, 'gpu-cuda12' for CUDA 12; CI installs NVRTC and headers of CUDA 13."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    toml = (root / "pyproject.toml").read_text(encoding="utf-8")
    assert 'gpu = ["cupy-cuda13x"]' in toml and 'gpu-cuda12 = ["cupy-cuda12x"]' in toml
    ci = (root / ".ci" / "run").read_text(encoding="utf-8")
    assert '"nvidia-cuda-nvrtc==13.*" "nvidia-cuda-runtime==13.*"' in ci
