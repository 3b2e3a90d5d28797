"""sm_120a's block-scaled ``mma.sync`` (:data:`fpsim.gpu.fragments.BLOCK_SCALED_INSTRUCTIONS`):
``kind::mxf8f6f4 .block_scale.scale_vec::1X`` (m16n8k32) and ``kind::mxf4 / mxf4nvf4 .scale_vec::2X/4X`` (m16n8k64).

Without a GPU: the mnemonics against the models' own instruction strings, the operand and scale-register
layouts against the PTX ISA's tables (written out here independently of fpsim's formulas), and a fake warp
whose registers are decoded with those tables and multiplied by MMA-Sim (the independent oracle,
``mmasim.nv_ptx.sim.MMABlockScale``, version 2.1.1) against fpsim's pack -> model -> compare path. The
NVRTC compile checks of these kernels run in tests/test_gpu_compile.py (they are in the kernel catalogue).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import _fake_cupy
from fpsim.gpu.fragments import (
    BLOCK_SCALED_INSTRUCTIONS,
    fragment_coords,
    mma_kernel_source,
    pack_a,
    pack_scales,
    scale_lanes,
    unpack_scales,
)
from fpsim.gpu.mma_check import (
    block_scaled_model_for,
    crosscheck_block_scaled,
    emulate_block_scaled,
    random_scales,
    random_tiles,
)

LABELS = list(BLOCK_SCALED_INSTRUCTIONS)
PTX = {"fp8_e4m3": "e4m3", "fp8_e5m2": "e5m2", "fp6_e2m3": "e2m3", "fp6_e3m2": "e3m2", "fp4_e2m1": "e2m1"}


def test_table_mnemonics_and_models() -> None:
    got = {k: i.ptx for k, i in BLOCK_SCALED_INSTRUCTIONS.items()}
    assert got["sm_120a m16n8k32 mxf8f6f4 ue8m0/32 fp8_e4m3->fp32"] == (
        "mma.sync.aligned.m16n8k32.row.col.kind::mxf8f6f4.block_scale.scale_vec::1X.f32.e4m3.e4m3.f32.ue8m0")
    assert got["sm_120a m16n8k64 mxf4nvf4 ue4m3/16 fp4_e2m1->fp32"] == (
        "mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::4X.f32.e2m1.e2m1.f32.ue4m3")
    assert got["sm_120a m16n8k64 mxf4 ue8m0/32 fp4_e2m1->fp32"].endswith("kind::mxf4.block_scale.scale_vec::2X"
                                                                           ".f32.e2m1.e2m1.f32.ue8m0")
    assert len(got) == 9
    for ins in BLOCK_SCALED_INSTRUCTIONS.values():
        m = block_scaled_model_for(ins)
        assert m.device == "rtx5090" and m.instruction == ins.ptx  # the preset's own PTX string
        assert (ins.a_regs, ins.b_regs, ins.c_regs) == (4, 2, 4)  # PTX ISA: A 4, B 2, C/D 4 registers
        assert [ins.runs_on(cc) for cc in (90, 100, 120, 121)] == [False, False, True, False]
        assert ins.block * ins.scale_vec == ins.k
        src = mma_kernel_source(ins)
        assert "%14, {0, 0}, %15, {0, 0};" in src and '"r"(sa[tile * 32 + lane])' in src
    with pytest.raises(ValueError, match="takes no block scales"):
        from fpsim.gpu.fragments import instruction_for

        scale_lanes(instruction_for("fp16"), "a")


# ------------------------------------------------------------------------------------------------------
# The PTX ISA's tables, as written there (groupID = lane >> 2, threadID_in_group = lane % 4):
# "Matrix Fragments for mma.m16n8k32" (8-bit containers: fp8, and fp6/fp4 of kind::mxf8f6f4) and
# "for mma.m16n8k64" (.e2m1 packed two per byte), and "Warp-level MMA with block scaling" for the scales.


def _doc_a(k: int, lane: int, i: int) -> tuple[int, int]:
    g, t = lane >> 2, lane % 4
    if k == 32:  # a0..a15, four per register
        return (g if (i < 4 or 8 <= i < 12) else g + 8), t * 4 + (i & 3) + (16 if i >= 8 else 0)
    return (g if (i < 8 or 16 <= i < 24) else g + 8), t * 8 + (i & 7) + (32 if i >= 16 else 0)  # a0..a31


def _doc_b(k: int, lane: int, i: int) -> tuple[int, int]:
    g, t = lane >> 2, lane % 4
    if k == 32:
        return t * 4 + (i & 3) + (16 if i >= 4 else 0), g
    return t * 8 + (i & 7) + (32 if i >= 8 else 0), g


def _doc_c(lane: int, i: int) -> tuple[int, int]:
    g, t = lane >> 2, lane % 4
    return g + (8 if i >= 2 else 0), 2 * t + (i & 1)


def _doc_scale_owner(lane: int, operand: str) -> int | None:
    """The row of A (or column of B) whose scales this lane's register holds, with {byte-id, thread-id} = {0, 0}:
    thread-id-a 0 selects threadID_in_group 0 (row groupID) and 1 (row groupID + 8); thread-id-b 0 selects
    threadID_in_group 0 (column groupID)."""
    g, t = lane >> 2, lane % 4
    if operand == "a":
        return g if t == 0 else g + 8 if t == 1 else None
    return g if t == 0 else None


@pytest.mark.parametrize("label", LABELS)
def test_fragment_coords_follow_the_ptx_isa(label: str) -> None:
    ins = BLOCK_SCALED_INSTRUCTIONS[label]
    for op, doc, n in (("a", _doc_a, ins.m * ins.k // 32), ("b", _doc_b, ins.k * ins.n // 32)):
        rows, cols = fragment_coords(ins, op)
        want = np.array([[doc(ins.k, lane, i) for i in range(n)] for lane in range(32)])
        assert np.array_equal(rows, want[..., 0]) and np.array_equal(cols, want[..., 1]), op
    assert ins.bits == (4 if ins.k == 64 else 8)


@pytest.mark.parametrize("label", LABELS)
def test_scale_registers_follow_the_ptx_isa(label: str) -> None:
    ins = BLOCK_SCALED_INSTRUCTIONS[label]
    rng = np.random.default_rng(5)
    v = ins.scale_vec
    sa = rng.integers(1, 255, size=(3, 16, v)).astype(np.uint8)
    sb = rng.integers(1, 255, size=(3, v, 8)).astype(np.uint8)
    sa_in = sa.copy()
    wa, wb = pack_scales(sa, ins, "a"), pack_scales(sb, ins, "b")
    assert wa.shape == wb.shape == (3, 32) and wa.dtype == np.uint32
    assert np.array_equal(sa, sa_in)  # inputs never modified
    for lane in range(32):
        for op, w, s in (("a", wa, sa), ("b", wb, sb)):
            owner = _doc_scale_owner(lane, op)
            if owner is None:
                assert not w[:, lane].any()  # registers the instruction does not read stay 0
                continue
            for j in range(v):  # byte j = K-block j
                byte = (w[:, lane] >> (8 * j)) & 0xFF
                want = s[:, owner, j] if op == "a" else s[:, j, owner]
                assert np.array_equal(byte, want), (op, lane, j)
            assert not (w[:, lane] >> (8 * v)).any() if v < 4 else True
    assert np.array_equal(unpack_scales(wa, ins, "a"), sa) and np.array_equal(unpack_scales(wb, ins, "b"), sb)
    with pytest.raises(ValueError, match="0..255"):
        pack_scales(sa.astype(np.int32) + 200, ins, "a")
    with pytest.raises(ValueError, match="shape"):
        pack_scales(sb, ins, "a") if v != 8 else None


def test_fp4_packing_per_kind() -> None:
    """kind::mxf4nvf4 packs e2m1 two per byte (a0 in bits 3..0); kind::mxf8f6f4 gives it a byte, bits 5..2."""
    nv = BLOCK_SCALED_INSTRUCTIONS["sm_120a m16n8k64 mxf4nvf4 ue4m3/16 fp4_e2m1->fp32"]
    mx = BLOCK_SCALED_INSTRUCTIONS["sm_120a m16n8k32 mxf8f6f4 ue8m0/32 fp4_e2m1->fp32"]
    a = np.zeros((1, 16, 64))
    a[0, 0, 0], a[0, 0, 1] = 0.5, -6.0  # codes 0x1 and 0xF, lane 0 register 0
    assert int(pack_a(a, nv)[0, 0, 0]) == 0x1 | 0xF << 4
    assert int(pack_a(a[:, :, :32], mx)[0, 0, 0]) == 0x1 << 2 | (0xF << 2) << 8


# ------------------------------------------------------------------------------------------------------
# A warp emulated with the PTX ISA's tables above and MMA-Sim's sm_120 block-scaled instruction


def _gather(words: np.ndarray, bits: int, doc, shape: tuple[int, int], k: int) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Register words (T, 32, regs) -> raw element containers (T, *shape), placed by a PTX ISA table."""
    t, _, regs = words.shape
    per = 32 // bits
    out = np.zeros((t,) + shape, dtype=np.uint32)
    for lane in range(32):
        for i in range(regs * per):
            r, c = doc(k, lane, i) if k else doc(lane, i)
            out[:, r, c] = (words[:, lane, i // per] >> ((i % per) * bits)) & ((1 << bits) - 1)
    return out


def _mmasim_runner(swap_a_scales: bool = False):  # type: ignore[no-untyped-def]
    torch = pytest.importorskip("torch")
    sim = pytest.importorskip("mmasim.nv_ptx.sim")

    def run(aw, bw, cw, saw, sbw, ins):  # type: ignore[no-untyped-def]
        bits = ins.bits
        a = _gather(aw, bits, _doc_a, (16, ins.k), ins.k).astype(np.uint8)
        b = _gather(bw, bits, _doc_b, (ins.k, 8), ins.k).astype(np.uint8)
        c = _gather(cw, 32, _doc_c, (16, 8), 0).view(np.float32)
        v = ins.scale_vec
        sa = np.zeros((aw.shape[0], 16, v), dtype=np.uint8)
        sb = np.zeros((aw.shape[0], v, 8), dtype=np.uint8)
        for lane in range(32):
            for j in range(v):
                byte = ((saw[:, lane] >> (8 * j)) & 0xFF).astype(np.uint8)
                if (row := _doc_scale_owner(lane, "a")) is not None:
                    sa[:, (row + 8) % 16 if swap_a_scales else row, j] = byte
                if (col := _doc_scale_owner(lane, "b")) is not None:
                    sb[:, j, col] = ((sbw[:, lane] >> (8 * j)) & 0xFF).astype(np.uint8)
        t = PTX[ins.input.name]
        op = sim.MMABlockScale("RTX Blackwell", f"m16n8k{ins.k}.kind::{ins.kind}.block{ins.block}.f32.{t}.{t}.f32."
                                                f"{ins.scale}")
        sdt = torch.float8_e8m0fnu if ins.scale == "ue8m0" else torch.float8_e4m3fn
        d = np.zeros((aw.shape[0], 16, 8), dtype=np.float32)
        for tile in range(aw.shape[0]):  # one MMA-Sim call per instruction
            ta, tb = torch.from_numpy(a[tile].copy()), torch.from_numpy(b[tile].copy())
            if ins.k == 64:  # MMA-Sim takes e2m1 packed along K, element 2i in the high nibble
                ta = torch.from_numpy((a[tile, :, 0::2] << 4) | a[tile, :, 1::2])
                tb = torch.from_numpy(((b[tile, 0::2].T << 4) | b[tile, 1::2].T).copy()).T
            elif t == "e4m3":
                ta, tb = ta.view(torch.float8_e4m3fn), tb.view(torch.float8_e4m3fn)
            elif t == "e5m2":
                ta, tb = ta.view(torch.float8_e5m2), tb.view(torch.float8_e5m2)
            # (fp6 and fp4 of kind::mxf8f6f4 go as their 8-bit containers, which is how MMA-Sim takes them)
            acc = op(ta, tb, torch.from_numpy(c[tile].copy()), torch.from_numpy(sa[tile].copy()).view(sdt),
                     torch.from_numpy(sb[tile].copy()).view(sdt))
            d[tile] = acc.to(torch.float32).numpy()
        out = np.zeros_like(cw)
        for lane in range(32):
            for i in range(4):
                r, col = _doc_c(lane, i)
                out[:, lane, i] = d[:, r, col].view(np.uint32)
        return out

    return run


@pytest.mark.parametrize("label", LABELS)
def test_fake_warp_with_mmasim_gives_the_preset_result(label: str) -> None:
    """fpsim's packing + rtx5090 block-scaled model vs the PTX ISA tables + MMA-Sim: 0 mismatches."""
    ins = BLOCK_SCALED_INSTRUCTIONS[label]
    r = crosscheck_block_scaled(ins, 1024, runner=_mmasim_runner(), seed=3)
    assert r.n == 1024 and r.mismatches == 0, r.summary()
    assert r.instruction == ins.ptx


def test_a_wrong_scale_layout_is_caught() -> None:
    ins = BLOCK_SCALED_INSTRUCTIONS["sm_120a m16n8k64 mxf4nvf4 ue4m3/16 fp4_e2m1->fp32"]
    r = crosscheck_block_scaled(ins, 512, runner=_mmasim_runner(swap_a_scales=True), seed=4)
    assert r.mismatches > 100
    # and another kind's arithmetic (mxf4's block of 32 is not NVFP4's 16) by the fpsim emulation
    other = block_scaled_model_for(BLOCK_SCALED_INSTRUCTIONS["sm_120a m16n8k32 mxf8f6f4 ue8m0/32 fp4_e2m1->fp32"])
    wrong = block_scaled_model_for(ins).with_(F=25)
    r2 = crosscheck_block_scaled(ins, 2048, runner=lambda aw, bw, cw, sa, sb, i: emulate_block_scaled(
        aw, bw, cw, sa, sb, i, wrong), seed=5)
    assert r2.mismatches > 0
    with pytest.raises(ValueError, match="does not match"):
        crosscheck_block_scaled(ins, 1, runner=lambda *a: a[0], model=other)


def test_random_scales_are_values_of_the_scale_type() -> None:
    for ins in BLOCK_SCALED_INSTRUCTIONS.values():
        sa, sb = random_scales(ins, 4, seed=1)
        assert sa.shape == (4, 16, ins.scale_vec) and sb.shape == (4, ins.scale_vec, 8) and sa.dtype == np.uint8
        if ins.scale == "ue4m3":
            assert sa.max() < 0x7F and sa.min() > 0  # no NaN, no zero
        else:
            assert np.abs(sa.astype(int) - 127).max() <= 6
        a, _, _ = random_tiles(ins, 2, seed=1)
        assert a.shape == (2, 16, ins.k)


# ------------------------------------------------------------------------------------------------------
# run_all through the fake CuPy: skipped with the reason off sm_120, run and bit-exact on an RTX 5090


def test_run_all_skips_them_off_sm120_and_runs_them_on_an_rtx5090(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import fpsim.gpu.convert as conv
    import fpsim.gpu.probing as prb
    import fpsim.gpu.run_all as ra

    monkeypatch.setattr(ra, "PATHS", ())
    monkeypatch.setattr(ra, "WGMMA_PATHS", ())
    monkeypatch.setattr(ra, "GENERATION_INSTRUCTIONS", {})
    monkeypatch.setattr(conv, "CONVERSIONS", {})
    monkeypatch.setattr(prb, "PATHS", ())
    _fake_cupy.install(monkeypatch)  # an H200
    res = ra.run_all(rows=128, conv_random=16)
    assert [m["skipped"] for m in res["mma"]] == ["needs compute capability 120 exactly (sm_120a)"] * 9
    _fake_cupy.install(monkeypatch, name="NVIDIA GeForce RTX 5090", cc=(12, 0), preset="rtx5090")
    res = ra.run_all(rows=256, conv_random=16)
    got = {m["path"]: (m.get("n"), m.get("mismatches")) for m in res["mma"]}
    assert got == {label: (256, 0) for label in LABELS}, json.dumps(res["mma"])[:500]
    assert not res["errors"]
