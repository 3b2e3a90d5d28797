"""Volta's ``mma.sync.aligned.m8n8k4.row.col.{f32,f16}.f16.f16.{f32,f16}`` (sm_70): four quad-pair products per warp.

Without a GPU: the mnemonics, the fragment layouts against the PTX ISA's tables ("Matrix Fragments for
mma.m8n8k4 with .f16 floating point type", written out here independently of fpsim's formulas), and a fake warp
whose registers are decoded with those tables, quad pair by quad pair, and multiplied by MMA-Sim's Volta
``m8n8k4`` (``mmasim.nv_ptx.sim.MMA("Volta", ...)``, MMA-Sim 2.1.1: the independent oracle) against fpsim's
pack -> v100 preset -> compare path. The NVRTC compile checks run in tests/test_gpu_compile.py (sm_70 needs a
CUDA 12 NVRTC: ``FPSIM_NVRTC``).
"""

from __future__ import annotations

import numpy as np
import pytest

from fpsim.gpu.fragments import GENERATION_INSTRUCTIONS, fragment_coords, pack_a, pack_b, pack_c, unpack_operand
from fpsim.gpu.kernels import catalogue
from fpsim.gpu.mma_check import crosscheck_mma, emulate_words, random_tiles
from fpsim.mma import get_model

LABELS = [k for k, i in GENERATION_INSTRUCTIONS.items() if i.quad_pairs]


def test_table() -> None:
    assert LABELS == ["sm_70 m8n8k4 fp16->fp32", "sm_70 m8n8k4 fp16->fp16"]
    f32, f16 = (GENERATION_INSTRUCTIONS[k] for k in LABELS)
    assert f32.ptx == "mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32"
    assert f16.ptx == "mma.sync.aligned.m8n8k4.row.col.f16.f16.f16.f16"
    # PTX ISA: A two .f16x2, B two .f16x2, C/D eight .f32 or four .f16x2 registers per lane
    assert (f32.a_regs, f32.b_regs, f32.c_regs, f16.c_regs) == (2, 2, 8, 4)
    assert (f32.m, f32.n, f32.k, f32.preset, f32.arch) == (32, 8, 4, "v100", "sm_70")
    assert all(f32.runs_on(cc) for cc in (70, 75, 80, 90, 100, 120)) and not f32.runs_on(61)
    ks = [k for k in catalogue() if "m8n8k4" in k.label]
    assert len(ks) == 2 and all(k.claims[0] == "sm_70" and k.claims[-1] == "sm_120a" for k in ks)


# The PTX ISA's table: MMA computation q (0..3) is lanes 4q..4q+3 (low group) and 4q+16..4q+19 (high group).
def _doc(op: str, out: str, lane: int, i: int) -> tuple[int, int, int]:
    """(quad pair, row, col) of element i of `lane` in that quad pair's own 8x4 A, 4x8 B or 8x8 C."""
    q = (lane % 16) // 4
    hi = lane >= 16
    if op == "a":  # row-major A
        return q, lane % 4 + (4 if hi else 0), i
    if op == "b":  # column-major B
        return q, i, lane % 4 + (4 if hi else 0)
    if out == "fp16":
        return q, lane % 4 + (4 if hi else 0), i
    x = (lane & 0b1) + (i & 0b10)
    return q, x + (4 if hi else 0), (i & 0b100) + (lane & 0b10) + (i & 0b1)


@pytest.mark.parametrize("label", LABELS)
def test_fragment_coords_follow_the_ptx_isa(label: str) -> None:
    ins = GENERATION_INSTRUCTIONS[label]
    for op, n in (("a", 4), ("b", 4), ("c", 8)):
        rows, cols = fragment_coords(ins, op)
        assert rows.shape == (32, n)
        for lane in range(32):
            for i in range(n):
                q, r, c = _doc(op, ins.output.name, lane, i)
                # fpsim stacks quad pair q's A and C/D at rows 8q..8q+7 and shares one B among them
                assert (rows[lane, i], cols[lane, i]) == ((r, c) if op == "b" else (8 * q + r, c)), (op, lane, i)
        if op == "c":  # every element of the 32 x 8 tile is held exactly once
            assert len({(int(r), int(c)) for r, c in zip(rows.ravel(), cols.ravel())}) == 256


@pytest.mark.parametrize("label", LABELS)
def test_pack_unpack_roundtrip(label: str) -> None:
    ins = GENERATION_INSTRUCTIONS[label]
    a, b, c = random_tiles(ins, 3, seed=7)
    a_in = a.copy()
    for op, x, words in (("a", a, pack_a(a, ins)), ("b", b, pack_b(b, ins)), ("c", c, pack_c(c, ins))):
        assert unpack_operand(words, ins, op).shape == x.shape
    assert np.array_equal(a, a_in)
    assert pack_b(b, ins).shape == (3, 32, 2) and pack_c(c, ins).shape == (3, 32, ins.c_regs)


def _mmasim_runner(label: str):  # type: ignore[no-untyped-def]
    torch = pytest.importorskip("torch")
    sim = pytest.importorskip("mmasim.nv_ptx.sim")
    ins = GENERATION_INSTRUCTIONS[label]
    d = "f32" if ins.output.name == "fp32" else "f16"
    op = sim.MMA("Volta", f"m8n8k4.{d}.f16.f16.{d}")

    def run(aw, bw, cw, ins_):  # type: ignore[no-untyped-def]
        t = aw.shape[0]
        a = np.zeros((t, 4, 8, 4), dtype=np.uint16)
        b = np.zeros((t, 4, 4, 8), dtype=np.uint16)
        c = np.zeros((t, 4, 8, 8), dtype=np.uint32)
        cper = 1 if d == "f32" else 2
        for lane in range(32):
            for i in range(4):
                q, r, col = _doc("a", ins.output.name, lane, i)
                a[:, q, r, col] = (aw[:, lane, i // 2] >> (16 * (i % 2))) & 0xFFFF
                q, r, col = _doc("b", ins.output.name, lane, i)
                b[:, q, r, col] = (bw[:, lane, i // 2] >> (16 * (i % 2))) & 0xFFFF
            for i in range(8):
                q, r, col = _doc("c", ins.output.name, lane, i)
                c[:, q, r, col] = (cw[:, lane, i // cper] >> (16 * (i % cper))) & (0xFFFFFFFF if cper == 1 else 0xFFFF)
        out = np.zeros_like(cw)
        for tile in range(t):  # each quad pair's 8x8x4 product with its own B, through MMA-Sim
            for q in range(4):
                ta = torch.from_numpy(a[tile, q].view(np.float16).copy())
                tb = torch.from_numpy(b[tile, q].view(np.float16).copy())
                if d == "f32":
                    tc = torch.from_numpy(c[tile, q].view(np.float32).copy())
                else:
                    tc = torch.from_numpy(c[tile, q].astype(np.uint16).view(np.float16).copy())
                dq = op(ta, tb, tc).numpy()
                codes = dq.view(np.uint32) if d == "f32" else dq.view(np.uint16).astype(np.uint32)
                for lane in [4 * q + j for j in range(4)] + [4 * q + 16 + j for j in range(4)]:
                    for i in range(8):
                        _, r, col = _doc("c", ins.output.name, lane, i)
                        out[tile, lane, i // cper] |= np.uint32(codes[r, col]) << np.uint32(16 * (i % cper))
        return out

    return run


@pytest.mark.parametrize("label", LABELS)
def test_fake_warp_with_mmasim_gives_the_v100_preset(label: str) -> None:
    """fpsim's packing + v100 preset vs the PTX ISA tables + MMA-Sim's Volta m8n8k4, probes included: 0 mismatches."""
    ins = GENERATION_INSTRUCTIONS[label]
    model = get_model("v100", ins.input, ins.output)
    r = crosscheck_mma(model, n=2048, runner=_mmasim_runner(label), instruction=ins, seed=2)
    assert r.mismatches == 0 and r.n >= 2048 and r.probes > 20, r.summary()
    # the fpsim emulation of the warp agrees as well, and another device's arithmetic is caught
    emu = crosscheck_mma(model, n=2048, runner=lambda aw, bw, cw, i: emulate_words(aw, bw, cw, i, model),
                         instruction=ins)
    assert emu.ok
    # A registers handed to the next quad pair (a layout bug) are caught
    shifted = crosscheck_mma(model, n=1024, instruction=ins, probes=False,
                             runner=lambda aw, bw, cw, i: emulate_words(np.roll(aw, 4, axis=1), bw, cw, i, model))
    assert shifted.mismatches > 500
    if ins.output.name == "fp32":  # Turing's 8-product block and wider window are not Volta's
        other = get_model("t4", ins.input, ins.output)
        wrong = crosscheck_mma(model, n=4096, runner=lambda aw, bw, cw, i: emulate_words(aw, bw, cw, i, other),
                               instruction=ins, probes=False)
        assert wrong.mismatches > 0


def test_run_all_runs_them_on_a_v100_only(monkeypatch: pytest.MonkeyPatch) -> None:
    import _fake_cupy

    import fpsim.gpu.convert as conv
    import fpsim.gpu.probing as prb
    import fpsim.gpu.run_all as ra

    monkeypatch.setattr(ra, "PATHS", ())
    monkeypatch.setattr(ra, "WGMMA_PATHS", ())
    monkeypatch.setattr(ra, "BLOCK_SCALED_INSTRUCTIONS", {})
    monkeypatch.setattr(ra, "GENERATION_INSTRUCTIONS", {k: GENERATION_INSTRUCTIONS[k] for k in LABELS})
    monkeypatch.setattr(conv, "CONVERSIONS", {})
    monkeypatch.setattr(prb, "PATHS", ())
    _fake_cupy.install(monkeypatch)  # an H200: accepts m8n8k4, but no preset models it there
    res = ra.run_all(rows=128, conv_random=16)
    assert [m["skipped"] for m in res["mma"]] == ["m8n8k4 is checked against the v100 preset on Volta only"] * 2
    _fake_cupy.install(monkeypatch, name="Tesla V100-SXM2-16GB", cc=(7, 0), preset="v100")
    res = ra.run_all(rows=256, conv_random=16)
    assert [(m["path"], m["n"] >= 256, m["mismatches"]) for m in res["mma"]] == [(k, True, 0) for k in LABELS]
    assert not res["errors"]
