"""Each generation's own ``mma.sync`` instructions (:data:`fpsim.gpu.fragments.GENERATION_INSTRUCTIONS`): Turing's
m16n8k8 fp16 and sm_120a's ``kind::f8f6f4`` m16n8k32 (FP8, fp6, fp4 in 8-bit containers).

Without a GPU: the PTX mnemonics, the fragment layouts against the PTX ISA's tables (written out here
independently of fpsim's formulas), the pack/unpack round trip, the fp4 container bits, the CPU emulation of the
warp giving the preset's result (and catching another device's), and, where NVIDIA's NVRTC library is installed,
that each kernel compiles for its architecture and is refused by the ones below.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys

import numpy as np
import pytest

from fpsim.gpu.fragments import (
    GENERATION_INSTRUCTIONS,
    fragment_coords,
    mma_kernel_source,
    pack_a,
    pack_b,
    pack_c,
    unpack_operand,
)
from fpsim.gpu.mma_check import crosscheck_mma, emulate_words, random_tiles
from fpsim.mma import get_model

# Volta's quad-pair m8n8k4 has its own layout tests (tests/test_gpu_volta.py)
LABELS = [k for k, i in GENERATION_INSTRUCTIONS.items() if not i.quad_pairs]
INS = [GENERATION_INSTRUCTIONS[k] for k in LABELS]


def test_table_mnemonics_and_presets() -> None:
    got = {k: (i.ptx, i.arch, i.preset) for k, i in GENERATION_INSTRUCTIONS.items()}
    assert got["sm_75 m16n8k8 fp16->fp32"] == ("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32", "sm_75", "t4")
    assert got["sm_75 m16n8k8 fp16->fp16"][0] == "mma.sync.aligned.m16n8k8.row.col.f16.f16.f16.f16"
    assert got["sm_120a m16n8k32 f8f6f4 fp4_e2m1->fp32"] == (
        "mma.sync.aligned.m16n8k32.row.col.kind::f8f6f4.f32.e2m1.e2m1.f32", "sm_120a", "rtx5090")
    assert got["sm_120a m16n8k32 f8f6f4 fp6_e3m2->fp16"][0] == \
        "mma.sync.aligned.m16n8k32.row.col.kind::f8f6f4.f16.e3m2.e3m2.f16"
    assert len(got) == 14  # with Volta's two m8n8k4
    t4, sm120 = GENERATION_INSTRUCTIONS[LABELS[0]], GENERATION_INSTRUCTIONS[LABELS[-1]]
    assert [t4.runs_on(cc) for cc in (70, 75, 80, 90, 120)] == [False, True, True, True, True]
    assert [sm120.runs_on(cc) for cc in (90, 100, 120, 121)] == [False, False, True, False]
    for ins in INS:  # every preset it maps to exists and has the instruction's formats (m16n8kK shapes)
        m = get_model(ins.preset, ins.input, ins.output)
        assert (m.input, m.output) == (ins.input, ins.output)
        # register counts from the PTX ISA: A 16xK, B Kx8 in 32-bit registers; C/D 4 fp32 or 2 packed fp16
        assert (ins.a_regs, ins.b_regs) == ((2, 1) if ins.k == 8 else (4, 2))
        assert ins.c_regs == (4 if ins.output.name == "fp32" else 2)


# The PTX ISA's fragment tables ("Matrix Fragments for mma.m16n8k8" (.f16) and "for mma.m16n8k32"), as written
# there: groupID = lane >> 2, threadID_in_group = lane % 4.
def _doc_a(k: int, lane: int, i: int) -> tuple[int, int]:
    g, t = lane >> 2, lane % 4
    if k == 8:  # a0..a3: row g for a0, a1, g + 8 for a2, a3; col t*2 + (i & 1)
        return (g if i < 2 else g + 8), t * 2 + (i & 1)
    row = g if (i < 4 or 8 <= i < 12) else g + 8  # k32: a0..a15
    return row, (t * 4 + (i & 3)) if i < 8 else (t * 4 + (i & 3) + 16)


def _doc_b(k: int, lane: int, i: int) -> tuple[int, int]:
    g, t = lane >> 2, lane % 4
    if k == 8:  # b0, b1: row t*2 + i, col g
        return t * 2 + i, g
    return ((t * 4 + (i & 3)) if i < 4 else (t * 4 + (i & 3) + 16)), g


@pytest.mark.parametrize("label", LABELS)
def test_fragment_coords_follow_the_ptx_isa(label: str) -> None:
    ins = GENERATION_INSTRUCTIONS[label]
    for op, doc, n in (("a", _doc_a, ins.m * ins.k // 32), ("b", _doc_b, ins.k * ins.n // 32)):
        rows, cols = fragment_coords(ins, op)
        want = np.array([[doc(ins.k, lane, i) for i in range(n)] for lane in range(32)])
        assert np.array_equal(rows, want[..., 0]) and np.array_equal(cols, want[..., 1]), op


@pytest.mark.parametrize("label", LABELS)
def test_pack_unpack_roundtrip(label: str) -> None:
    ins = GENERATION_INSTRUCTIONS[label]
    a, b, c = random_tiles(ins, 5, seed=11)
    a_in = a.copy()
    for op, x, words in (("a", a, pack_a(a, ins)), ("b", b, pack_b(b, ins)), ("c", c, pack_c(c, ins))):
        codes = unpack_operand(words, ins, op)
        assert codes.shape == x.shape
        assert np.array_equal(pack_a(a, ins) if op == "a" else pack_b(b, ins) if op == "b" else pack_c(c, ins), words)
    assert np.array_equal(a, a_in)  # inputs never modified
    # every register bit that is not an element's container stays zero, and the containers are all used
    assert pack_a(a, ins).shape == (5, 32, ins.a_regs) and pack_b(b, ins).shape == (5, 32, ins.b_regs)


def test_fp4_and_fp6_sit_in_8_bit_containers() -> None:
    """e2m1 codes in bits 5..2 and fp6 codes in bits 5..0 of each byte (PTX ISA kind::f8f6f4; MMA-Sim 2.1.1
    reads fp4 operands the same way, tests/test_mma_mmasim_nvidia.py::_torch_in)."""
    fp4 = GENERATION_INSTRUCTIONS["sm_120a m16n8k32 f8f6f4 fp4_e2m1->fp32"]
    fp6 = GENERATION_INSTRUCTIONS["sm_120a m16n8k32 f8f6f4 fp6_e2m3->fp32"]
    for ins, value, code in ((fp4, -6.0, 0xF << 2), (fp4, 0.5, 0x1 << 2), (fp6, 7.5, 0x1F), (fp6, -0.125, 0x21)):
        a = np.zeros((1, 16, 32))
        a[0, 0, 1] = value  # lane 0 holds a1 = A[0, 1] in bits 15..8 of register 0
        words = pack_a(a, ins)
        assert int(words[0, 0, 0]) == code << 8, (ins.input.name, value)
        assert int(words.sum()) == code << 8
        assert unpack_operand(words, ins, "a")[0, 0, 1] == code


def _emu(model):  # type: ignore[no-untyped-def]
    return lambda a, b, c, ins: emulate_words(a, b, c, ins, model)


@pytest.mark.parametrize("label", LABELS)
def test_emulated_warp_gives_the_preset_result(label: str) -> None:
    ins = GENERATION_INSTRUCTIONS[label]
    model = get_model(ins.preset, ins.input, ins.output)
    r = crosscheck_mma(model, n=300, runner=_emu(model), instruction=ins, probes=ins.input.width >= 8)
    assert r.ok and r.n >= 300 and r.instruction == ins.ptx
    if ins.input.width == 16:
        assert r.probes > 50  # the probes of <= 8 terms fit Turing's K = 8


def test_emulation_of_another_device_is_caught() -> None:
    t4 = GENERATION_INSTRUCTIONS["sm_75 m16n8k8 fp16->fp32"]
    r = crosscheck_mma(get_model("t4", "fp16"), n=600, runner=_emu(get_model("v100", "fp16")), instruction=t4)
    assert r.mismatches > 50  # Volta's 4-product blocks and 23-bit window are not Turing's
    fp4 = GENERATION_INSTRUCTIONS["sm_120a m16n8k32 f8f6f4 fp4_e2m1->fp16"]
    wrong = get_model("rtx5090", "fp4_e2m1", "fp16").with_(k=16)
    r = crosscheck_mma(get_model("rtx5090", "fp4_e2m1", "fp16"), n=2000, runner=_emu(wrong), instruction=fp4,
                       probes=False)
    assert r.mismatches > 0
    with pytest.raises(ValueError, match="multiplies fp16->fp32"):
        crosscheck_mma(get_model("t4", "fp16", "fp16"), n=1, runner=_emu(None), instruction=t4)


# ------------------------------------------------------------------------------------------------------
# NVRTC (CUDA 13's NVRTC library, from the nvidia-cuda-nvrtc wheel where installed)


def _nvrtc() -> ctypes.CDLL | None:
    names = []
    for root in sys.path:
        names += sorted(glob.glob(os.path.join(root, "nvidia", "cu*", "lib", "libnvrtc.so*")))
        names += sorted(glob.glob(os.path.join(root, "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so*")))
    for n in names + ["libnvrtc.so"]:
        try:
            return ctypes.CDLL(n)
        except OSError:
            continue
    return None


NVRTC = _nvrtc()


def _compile(src: str, arch: str) -> tuple[int, str]:
    """nvrtcCompileProgram's status (0 = success; 5 = invalid option, e.g. an unknown architecture) and log."""
    assert NVRTC is not None
    prog = ctypes.c_void_p()
    assert NVRTC.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"fpsim.cu", 0, None, None) == 0
    opts = [f"--gpu-architecture={arch}".encode(), b"-std=c++17", b"-ftz=true"]  # as CuPy passes them
    rc = NVRTC.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    NVRTC.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    NVRTC.nvrtcGetProgramLog(prog, log)
    NVRTC.nvrtcDestroyProgram(ctypes.byref(prog))
    return int(rc), log.value.decode(errors="replace")


@pytest.mark.skipif(NVRTC is None, reason="NVIDIA's NVRTC library is not installed")
@pytest.mark.parametrize("label", LABELS)
def test_kernel_compiles_for_its_arch_and_is_refused_below(label: str) -> None:
    ins = GENERATION_INSTRUCTIONS[label]
    src = mma_kernel_source(ins)
    rc, log = _compile(src, ins.arch)
    assert rc == 0, log
    below = ["sm_75", "sm_80", "sm_90"] + (["sm_120"] if ins.arch_suffix else [])
    for arch in below:
        if arch == ins.arch:
            continue
        if ins.arch == "sm_75":
            # CUDA 13's NVRTC has no target below sm_75 (sm_70 is refused as an option, status 5), so Turing's
            # instruction cannot be shown refused below its architecture with it; later targets accept it
            assert _compile(src, arch)[0] == 0
            continue
        rc, log = _compile(src, arch)
        assert rc != 0 and ("not supported" in log or "requires" in log), (arch, log)
    if ins.arch == "sm_75":
        assert _compile('extern "C" __global__ void f() {}', "sm_70")[0] == 5
