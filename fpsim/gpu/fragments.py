"""``mma.sync`` instructions: PTX strings, register fragment layouts, host-side packing and kernel source.

Everything here is pure NumPy/string work, so it is tested without a GPU. A warp of 32 lanes executes one
``mma.sync.aligned.m16n8kK.row.col`` instruction: ``D (16x8) = A (16xK) @ B (Kx8) + C (16x8)``. Each lane
holds a fixed set of elements of A, B, C and D in 32-bit registers; which elements is given by the PTX ISA
("Matrix fragments for mma.m16n8k16 / m16n8k8 / m16n8k32"), with ``groupID = laneid >> 2`` and
``threadID_in_group = laneid % 4``:

* A, 16-bit types (k16), elements a0..a7, two per register (a0 in the low half):
  row ``groupID`` for a0, a1, a4, a5 and ``groupID + 8`` otherwise; column ``2*tig + (i & 1)`` for i < 4,
  plus 8 for i >= 4.
* A, tf32 (k8), a0..a3, one per register: row ``groupID`` for a0, a2, ``groupID + 8`` for a1, a3; column
  ``tig`` for a0, a1 and ``tig + 4`` for a2, a3.
* A, 8-bit types (k32), a0..a15, four per register (a0 in the lowest byte): row ``groupID`` for
  0 <= i < 4 or 8 <= i < 12, else ``groupID + 8``; column ``4*tig + (i & 3)`` for i < 8, plus 16 for i >= 8.
* B (Kx8), column ``groupID``; row ``2*tig + (i & 1)`` (+8 for i >= 2) for 16-bit types, ``tig`` (+4 for b1)
  for tf32, ``4*tig + (i & 3)`` (+16 for i >= 4) for 8-bit types.
* C and D: row ``groupID`` for c0, c1 and ``groupID + 8`` for c2, c3; column ``2*tig + (i & 1)``. fp32
  accumulators use one register per element, fp16 accumulators pack c0, c1 (and c2, c3) into one register.

Two families differ: Volta's ``m8n8k4`` (four quad-pair products per warp, stacked here into a 32 x 8 x 4
tile: :func:`_quad_pair_coords`) and sm_120a's block-scaled ``m16n8k32`` / ``m16n8k64`` (e2m1 packed two per
byte for ``kind::mxf4*``; the scales travel in one more register per operand: :func:`scale_lanes`,
:func:`pack_scales`).

The host packs every tile's operands into per-lane register words (:func:`pack_a`, :func:`pack_b`,
:func:`pack_c`), the kernel only loads words, runs the instruction and stores the D words, and the host
unpacks them (:func:`unpack_d`). The layout logic therefore lives in one tested place.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._fpenv import ieee_mode
from ..bits import from_bits, to_bits
from ..formats import Format, FormatLike, as_format, bf16, fp8_e4m3, fp8_e5m2, fp16, fp32, tf32

__all__ = [
    "BLOCK_SCALED_INSTRUCTIONS",
    "GENERATION_INSTRUCTIONS",
    "KERNEL_NAME",
    "PATHS",
    "MMAInstruction",
    "decode_d",
    "fragment_coords",
    "input_words",
    "instruction_for",
    "mma_kernel_source",
    "pack_a",
    "pack_b",
    "pack_c",
    "pack_scales",
    "scale_lanes",
    "unpack_d",
    "unpack_operand",
    "unpack_scales",
]

KERNEL_NAME = "fpsim_mma"

_PTX_TYPE = {"fp16": "f16", "bf16": "bf16", "tf32": "tf32", "fp8_e4m3": "e4m3", "fp8_e5m2": "e5m2", "fp32": "f32",
             "fp6_e3m2": "e3m2", "fp6_e2m3": "e2m3", "fp4_e2m1": "e2m1"}


@ieee_mode
@dataclass(frozen=True)
class MMAInstruction:
    """One ``mma.sync`` instruction shape and its operand types.

    Attributes
    ----------
    input, output : Format
        Types of A, B and of C, D.
    k : int
        K of the instruction (16 for fp16/bf16, 8 for tf32, 32 for FP8).
    min_cc : int
        Lowest compute capability (10*major + minor) that has it: 80, or 89 for FP8.
    ptx_isa : str
        Lowest PTX ISA version that has it.
    kind : str
        ``"f8f6f4"`` for sm_120a's ``mma.sync ... kind::f8f6f4`` (FP8, fp6 and fp4 in 8-bit containers), else "".
    arch_suffix : str
        ``"a"`` where only the architecture-specific target has it (``sm_120a``): then it runs on compute
        capability `min_cc` exactly, not on later ones.
    preset : str
        The fpsim device whose presets this generation's own instruction checks ("" for the shared shapes).
    quad_pairs : bool
        Volta's ``mma.sync.aligned.m8n8k4``: the warp runs four independent 8x8x4 products, one per quad pair
        (lanes 4q..4q+3 and 4q+16..4q+19). fpsim stacks the four A and C/D matrices into one 32-row tile and gives
        every quad pair the same B, so a warp still computes one (m = 32) x 8 x 4 tile.
    scale, scale_vec : str, int
        For the block-scaled ``mma.sync ... kind::mxf8f6f4 / mxf4 / mxf4nvf4 .block_scale.scale_vec::{1,2,4}X``:
        the scale type (``"ue8m0"`` or ``"ue4m3"``) and scales per row of A / column of B per instruction;
        ``""`` and 0 otherwise.
    """

    input: Format
    output: Format
    k: int
    min_cc: int
    ptx_isa: str

    m: int = 16
    n: int = 8
    kind: str = ""
    arch_suffix: str = ""
    preset: str = ""
    scale: str = ""
    scale_vec: int = 0
    quad_pairs: bool = False

    @property
    def arch(self) -> str:
        """The lowest compile target, e.g. ``sm_80`` or ``sm_120a``."""
        return f"sm_{self.min_cc}{self.arch_suffix}"

    def runs_on(self, cc: int) -> bool:
        """Whether a device of compute capability `cc` (10*major + minor) executes it."""
        return cc == self.min_cc if self.arch_suffix else cc >= self.min_cc

    @property
    def bits(self) -> int:
        """Bits per A/B element in a register (16, 32 for tf32, or 8: fp6/fp4 sit in 8-bit containers)."""
        if self.input == tf32:
            return 32
        # kind::mxf4 / mxf4nvf4 pack fp4 two per byte; the f8f6f4 kinds give each element a byte
        return 4 if self.kind in ("mxf4", "mxf4nvf4") else max(8, self.input.width)

    @property
    def container_shift(self) -> int:
        """Where a code sits in its container: fp4 (e2m1) in bits 5..2 under ``kind::f8f6f4`` and
        ``kind::mxf8f6f4``, else bit 0."""
        return 2 if self.kind in ("f8f6f4", "mxf8f6f4") and self.input.width == 4 else 0

    @property
    def block(self) -> int:
        """K-elements per scale factor (32 or 16) of a block-scaled instruction; 0 otherwise."""
        return self.k // self.scale_vec if self.scale else 0

    @property
    def per_reg(self) -> int:
        """A/B elements per 32-bit register."""
        return 32 // self.bits

    @property
    def a_regs(self) -> int:
        return self.m * self.k // 32 // self.per_reg

    @property
    def b_regs(self) -> int:
        if self.quad_pairs:  # each quad pair holds the whole 4x8 B: 4 elements per lane
            return 4 // self.per_reg
        return self.k * self.n // 32 // self.per_reg

    @property
    def c_per_reg(self) -> int:
        """C/D elements per register: 1 for fp32, 2 for fp16."""
        return 1 if self.output == fp32 else 2

    @property
    def c_regs(self) -> int:
        return self.m * self.n // 32 // self.c_per_reg

    @property
    def ptx(self) -> str:
        """The instruction mnemonic, e.g. ``mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32``."""
        ti, to = _PTX_TYPE[self.input.name], _PTX_TYPE[self.output.name]
        kind = f".kind::{self.kind}" if self.kind else ""
        if self.quad_pairs:
            return f"mma.sync.aligned.m8n8k4.row.col.{to}.{ti}.{ti}.{to}"
        if self.scale:  # PTX ISA 8.7 order: ...row.col.kind.block_scale.scale_vec_size.f32.atype.btype.f32.stype
            kind += f".block_scale.scale_vec::{self.scale_vec}X"
            return f"mma.sync.aligned.m{self.m}n{self.n}k{self.k}.row.col{kind}.{to}.{ti}.{ti}.{to}.{self.scale}"
        return f"mma.sync.aligned.m{self.m}n{self.n}k{self.k}.row.col{kind}.{to}.{ti}.{ti}.{to}"

    @property
    def label(self) -> str:
        if self.scale:
            return f"{self.arch} m{self.m}n{self.n}k{self.k} {self.kind} {self.scale}/{self.block} " \
                   f"{self.input.name}->{self.output.name}"
        if self.quad_pairs:
            return f"{self.arch} m8n8k4 {self.input.name}->{self.output.name}"
        if self.preset:
            return f"{self.arch} m{self.m}n{self.n}k{self.k}{' ' + self.kind if self.kind else ''} " \
                   f"{self.input.name}->{self.output.name}"
        return f"{self.input.name}->{self.output.name}"


_INSTRUCTIONS: dict[tuple[str, str], MMAInstruction] = {
    ("fp16", "fp32"): MMAInstruction(fp16, fp32, 16, 80, "7.0"),
    ("fp16", "fp16"): MMAInstruction(fp16, fp16, 16, 80, "7.0"),
    ("bf16", "fp32"): MMAInstruction(bf16, fp32, 16, 80, "7.0"),
    ("tf32", "fp32"): MMAInstruction(tf32, fp32, 8, 80, "7.0"),
    ("fp8_e4m3", "fp32"): MMAInstruction(fp8_e4m3, fp32, 32, 89, "8.4"),
    ("fp8_e5m2", "fp32"): MMAInstruction(fp8_e5m2, fp32, 32, 89, "8.4"),
    ("fp8_e4m3", "fp16"): MMAInstruction(fp8_e4m3, fp16, 32, 89, "8.7"),
    ("fp8_e5m2", "fp16"): MMAInstruction(fp8_e5m2, fp16, 32, 89, "8.7"),
}

#: Every (input, output) path the cross-check and the probe know, in the order they run.
PATHS: tuple[tuple[str, str], ...] = tuple(_INSTRUCTIONS)

# Each generation's own instructions, beside the shared sm_80 shapes above: Turing's m16n8k8 (sm_75; later GPUs
# run it too) and sm_120a's kind::f8f6f4 (RTX Blackwell only: the "a" target). Keyed by their label.
_GENERATION: tuple[MMAInstruction, ...] = (
    # Volta's m8n8k4 (PTX ISA 6.4, sm_70+; "optimized for sm_70, may have substantially reduced performance on
    # other target architectures"): four quad-pair products per warp, stacked into a 32 x 8 x 4 tile
    MMAInstruction(fp16, fp32, 4, 70, "6.4", m=32, preset="v100", quad_pairs=True),
    MMAInstruction(fp16, fp16, 4, 70, "6.4", m=32, preset="v100", quad_pairs=True),
    MMAInstruction(fp16, fp32, 8, 75, "6.5", preset="t4"),
    MMAInstruction(fp16, fp16, 8, 75, "6.5", preset="t4"),
    *(MMAInstruction(as_format(f), as_format(o), 32, 120, "8.7", kind="f8f6f4", arch_suffix="a", preset="rtx5090")
      for f in ("fp8_e4m3", "fp8_e5m2", "fp6_e3m2", "fp6_e2m3", "fp4_e2m1") for o in ("fp32", "fp16")),
)
#: label -> instruction, e.g. ``"sm_75 m16n8k8 fp16->fp32"``, ``"sm_120a m16n8k32 f8f6f4 fp4_e2m1->fp32"``.
GENERATION_INSTRUCTIONS: dict[str, MMAInstruction] = {ins.label: ins for ins in _GENERATION}

# sm_120a's block-scaled mma.sync (PTX ISA 8.7, "Warp-level MMA with block scaling"): A and B of one element type
# here (the instructions also take mixed pairs), D fp32, one scale per row of A / column of B per `block` K.
_BLOCK_SCALED: tuple[MMAInstruction, ...] = (
    *(MMAInstruction(as_format(f), fp32, 32, 120, "8.7", kind="mxf8f6f4", arch_suffix="a", preset="rtx5090",
                     scale="ue8m0", scale_vec=1)
      for f in ("fp8_e4m3", "fp8_e5m2", "fp6_e3m2", "fp6_e2m3", "fp4_e2m1")),
    *(MMAInstruction(as_format("fp4_e2m1"), fp32, 64, 120, "8.7", kind=kd, arch_suffix="a", preset="rtx5090",
                     scale=sc, scale_vec=v)
      for kd, sc, v in (("mxf4", "ue8m0", 2), ("mxf4nvf4", "ue8m0", 2), ("mxf4nvf4", "ue4m3", 4),
                        ("mxf4nvf4", "ue8m0", 4))),
)
#: label -> block-scaled instruction, e.g. ``"sm_120a m16n8k64 mxf4nvf4 ue4m3/16 fp4_e2m1->fp32"``; each checks
#: ``fpsim.mma.block_scaled_model("rtx5090", kind, input, block=ins.block, scale=ins.scale)``.
BLOCK_SCALED_INSTRUCTIONS: dict[str, MMAInstruction] = {ins.label: ins for ins in _BLOCK_SCALED}


def _name(fmt: FormatLike) -> str:
    return as_format(fmt).name


@ieee_mode
def instruction_for(input: FormatLike, output: FormatLike = "fp32") -> MMAInstruction:
    """The ``mma.sync`` instruction for an input/output pair.

    Examples
    --------
    >>> instruction_for("bf16").ptx
    'mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32'
    >>> instruction_for("e4m3", "fp16").k
    32
    """
    key = (_name(input), _name(output))
    try:
        return _INSTRUCTIONS[key]
    except KeyError:
        valid = ", ".join(f"{i}->{o}" for i, o in _INSTRUCTIONS)
        raise ValueError(f"no mma.sync path for {key[0]}->{key[1]}; valid: {valid}") from None


@ieee_mode
def fragment_coords(ins: MMAInstruction, operand: str) -> tuple[np.ndarray, np.ndarray]:
    """(row, col) of every element each lane holds: two int arrays of shape (32, elements per lane).

    Element ``i`` of lane ``l`` sits in bits ``(i % per_reg) * bits`` of register ``i // per_reg``.
    `operand` is ``"a"`` (16 x K), ``"b"`` (K x 8) or ``"c"`` (16 x 8, also D).
    """
    lane = np.arange(32)[:, None]
    g, t = lane >> 2, lane % 4
    if ins.quad_pairs:
        return _quad_pair_coords(ins, operand)
    if operand == "a":
        e = ins.per_reg
        i = np.arange(ins.m * ins.k // 32)[None, :]
        row = g + 8 * ((i // e) % 2)
        col = e * t + (i % e) + (ins.k // 2) * (i // (2 * e))
    elif operand == "b":
        e = ins.per_reg
        i = np.arange(ins.k * ins.n // 32)[None, :]
        row = e * t + (i % e) + (ins.k // 2) * (i // e)
        col = g + 0 * i
    elif operand == "c":
        i = np.arange(4)[None, :]
        row = g + 8 * (i // 2)
        col = 2 * t + (i % 2)
    else:
        raise ValueError(f"operand must be 'a', 'b' or 'c', got {operand!r}")
    return np.broadcast_to(row, col.shape).copy(), col


def _quad_pair_coords(ins: MMAInstruction, operand: str) -> tuple[np.ndarray, np.ndarray]:
    """m8n8k4 (PTX ISA "Matrix Fragments for mma.m8n8k4 with .f16"), quad pair q = (lane >> 2) & 3 owning rows
    8q..8q+7 of the stacked tile; ``hi`` = lane >= 16 (the quad pair's high group)."""
    lane = np.arange(32)[:, None]
    q, hi, t = (lane >> 2) & 3, (lane >= 16).astype(np.int64), lane % 4
    if operand == "a":  # row-major A: row lane % 4 (+4 high), col i
        i = np.arange(4)[None, :]
        return np.broadcast_to(8 * q + t + 4 * hi, (32, 4)).copy(), np.broadcast_to(i, (32, 4)).copy()
    if operand == "b":  # column-major B: row i, col lane % 4 (+4 high)
        i = np.arange(4)[None, :]
        return np.broadcast_to(i, (32, 4)).copy(), np.broadcast_to(t + 4 * hi, (32, 4)).copy()
    if operand == "c":
        i = np.arange(8)[None, :]
        if ins.output == fp32:  # row X (+4 high), X = (lane & 1) + (i & 2); col (i & 4) + (lane & 2) + (i & 1)
            row = 8 * q + (lane & 1) + (i & 2) + 4 * hi
            col = (i & 4) + (lane & 2) + (i & 1)
        else:  # fp16: row lane % 4 (+4 high), col i
            row, col = 8 * q + t + 4 * hi + 0 * i, np.broadcast_to(i, (32, 8))
        return np.broadcast_to(row, (32, 8)).copy(), np.broadcast_to(col, (32, 8)).copy()
    raise ValueError(f"operand must be 'a', 'b' or 'c', got {operand!r}")


@ieee_mode
def input_words(x: np.ndarray, fmt: Format) -> np.ndarray:
    """Register codes of input values: the format's bit pattern (uint), fp32 bits for tf32.

    tf32 operands travel in fp32 registers; the Tensor Core ignores the low 13 fraction bits.
    """
    if fmt == tf32:
        return np.ascontiguousarray(np.asarray(x, dtype=np.float32)).view(np.uint32)
    return np.asarray(to_bits(np.asarray(x, dtype=np.float64), fmt), dtype=np.uint32)


def _operand_words(x: np.ndarray, ins: MMAInstruction) -> np.ndarray:
    return np.asarray(input_words(x, ins.input) << np.uint32(ins.container_shift), dtype=np.uint32)


def _pack(codes: np.ndarray, rows: np.ndarray, cols: np.ndarray, per_reg: int, bits: int) -> np.ndarray:
    """Gather (T, R, C) codes into (T, 32, regs) uint32 words, element j of a register at bit j*bits."""
    el = codes[:, rows, cols].astype(np.uint64)  # (T, 32, elements)
    t = el.shape[0]
    el = el.reshape(t, 32, -1, per_reg)
    shifts = (np.arange(per_reg, dtype=np.uint64) * np.uint64(bits))
    words = np.bitwise_or.reduce(el << shifts, axis=-1) if per_reg > 1 else el[..., 0]
    return np.ascontiguousarray(words.astype(np.uint32))


def _tiles(x: np.ndarray, shape: tuple[int, int], name: str) -> np.ndarray:
    arr = np.asarray(x)
    if arr.ndim == 2:
        arr = arr[None]
    if arr.ndim != 3 or arr.shape[1:] != shape:
        raise ValueError(f"{name} must have shape (tiles, {shape[0]}, {shape[1]}), got {np.asarray(x).shape}")
    return arr


@ieee_mode
def pack_a(a: np.ndarray, ins: MMAInstruction) -> np.ndarray:
    """A tiles (T, 16, K) of input values -> register words (T, 32, a_regs) uint32."""
    a = _tiles(a, (ins.m, ins.k), "a")
    rows, cols = fragment_coords(ins, "a")
    return _pack(_operand_words(a, ins), rows, cols, ins.per_reg, ins.bits)


@ieee_mode
def pack_b(b: np.ndarray, ins: MMAInstruction) -> np.ndarray:
    """B tiles (T, K, 8) of input values -> register words (T, 32, b_regs) uint32."""
    b = _tiles(b, (ins.k, ins.n), "b")
    rows, cols = fragment_coords(ins, "b")
    return _pack(_operand_words(b, ins), rows, cols, ins.per_reg, ins.bits)


def _out_codes(x: np.ndarray, out: Format) -> np.ndarray:
    """Register codes (uint32) of output-format values: fp32 bits, or the fp16 bit pattern."""
    if out == fp32:
        with np.errstate(over="ignore"):  # a float64 beyond float32 becomes inf on purpose
            return np.ascontiguousarray(np.asarray(x, dtype=np.float32)).view(np.uint32)
    return np.asarray(to_bits(np.asarray(x, dtype=np.float64), out), dtype=np.uint32)


@ieee_mode
def pack_c(c: np.ndarray, ins: MMAInstruction) -> np.ndarray:
    """C tiles (T, 16, 8) of output-format values -> register words (T, 32, c_regs) uint32."""
    c = _tiles(c, (ins.m, ins.n), "c")
    rows, cols = fragment_coords(ins, "c")
    return _pack(_out_codes(c, ins.output), rows, cols, ins.c_per_reg, 32 // ins.c_per_reg)


@ieee_mode
def unpack_d(words: np.ndarray, ins: MMAInstruction) -> np.ndarray:
    """D register words (T, 32, c_regs) -> output codes (T, 16, 8): uint32 fp32 bits or uint16 fp16 bits."""
    w = np.asarray(words, dtype=np.uint32)
    if w.ndim != 3 or w.shape[1:] != (32, ins.c_regs):
        raise ValueError(f"D words must have shape (tiles, 32, {ins.c_regs}), got {w.shape}")
    t = w.shape[0]
    if ins.c_per_reg == 1:
        el = w
        dt: type = np.uint32
    else:
        el = np.stack([w & 0xFFFF, w >> 16], axis=-1).reshape(t, 32, 2 * ins.c_regs)
        dt = np.uint16
    rows, cols = fragment_coords(ins, "c")
    out: np.ndarray = np.zeros((t, ins.m, ins.n), dtype=dt)
    out[:, rows, cols] = el.astype(dt)
    return out


@ieee_mode
def unpack_operand(words: np.ndarray, ins: MMAInstruction, operand: str) -> np.ndarray:
    """Inverse of :func:`pack_a`/:func:`pack_b`/:func:`pack_c`: register words -> codes per tile element.

    Returns (T, 16, K), (T, K, 8) or (T, 16, 8) codes (uint32; fp32 bits for tf32 inputs and fp32 C; the whole
    8-bit container, code << :attr:`MMAInstruction.container_shift`, for ``kind::f8f6f4`` fp4). Used by
    the CPU emulation of a warp (:func:`fpsim.gpu.mma_check.emulate_words`) and by the layout tests.
    """
    w = np.asarray(words, dtype=np.uint32)
    if operand == "c":
        per, bits, shape = ins.c_per_reg, 32 // ins.c_per_reg, (ins.m, ins.n)
    elif operand in ("a", "b"):
        per, bits = ins.per_reg, ins.bits
        shape = (ins.m, ins.k) if operand == "a" else (ins.k, ins.n)
    else:
        raise ValueError(f"operand must be 'a', 'b' or 'c', got {operand!r}")
    t = w.shape[0]
    mask = np.uint64((1 << bits) - 1)
    shifts = np.arange(per, dtype=np.uint64) * np.uint64(bits)
    el = ((w.astype(np.uint64)[..., None] >> shifts) & mask).reshape(t, 32, -1)
    rows, cols = fragment_coords(ins, operand)
    out = np.zeros((t,) + shape, dtype=np.uint32)
    out[:, rows, cols] = el.astype(np.uint32)
    return out


def _need_scales(ins: MMAInstruction) -> None:
    if not ins.scale:
        raise ValueError(f"{ins.ptx} takes no block scales (valid: {', '.join(BLOCK_SCALED_INSTRUCTIONS)})")


@ieee_mode
def scale_lanes(ins: MMAInstruction, operand: str) -> np.ndarray:
    """The lane whose scale register holds the scales of each row of A (16,) or each column of B (8,).

    With the selectors fpsim's kernels pass, ``{byte-id, thread-id} = {0, 0}``, the PTX ISA ("Warp-level MMA
    with block scaling") reads row ``groupID`` of A from the lane with ``threadID_in_group`` 0 and row
    ``groupID + 8`` from the one with ``threadID_in_group`` 1, column ``groupID`` of B from
    ``threadID_in_group`` 0; byte ``j`` of that register is the scale of K-block ``j``. The other lanes'
    scale registers are not read.

    Examples
    --------
    >>> ins = BLOCK_SCALED_INSTRUCTIONS["sm_120a m16n8k64 mxf4nvf4 ue4m3/16 fp4_e2m1->fp32"]
    >>> scale_lanes(ins, "a")[:4].tolist(), scale_lanes(ins, "a")[8:10].tolist(), scale_lanes(ins, "b")[:3].tolist()
    ([0, 4, 8, 12], [1, 5], [0, 4, 8])
    """
    _need_scales(ins)
    if operand == "a":
        r = np.arange(ins.m)
        return np.asarray(4 * (r % 8) + r // 8)
    if operand == "b":
        return np.asarray(4 * np.arange(ins.n))
    raise ValueError(f"operand must be 'a' or 'b', got {operand!r}")


@ieee_mode
def pack_scales(codes: np.ndarray, ins: MMAInstruction, operand: str) -> np.ndarray:
    """Scale codes -> per-lane scale registers (T, 32) uint32 of a block-scaled instruction.

    `codes` are uint8 codes (UE8M0 or UE4M3) of shape (T, 16, scale_vec) for A (one per row and K-block) or
    (T, scale_vec, 8) for B (one per K-block and column); see :func:`scale_lanes` for where they go.
    """
    _need_scales(ins)
    v = ins.scale_vec
    shape = (ins.m, v) if operand == "a" else (v, ins.n)
    if operand not in ("a", "b"):
        raise ValueError(f"operand must be 'a' or 'b', got {operand!r}")
    x = _tiles(codes, shape, f"scale codes of {operand}")
    if x.dtype.kind not in "ui" or (x.size and (int(x.min()) < 0 or int(x.max()) > 255)):
        raise ValueError(f"scale codes must be integers in 0..255 (uint8 {ins.scale} codes), got dtype {x.dtype}")
    per = (x if operand == "a" else np.swapaxes(x, 1, 2)).astype(np.uint32)  # (T, rows or cols, v)
    words = np.bitwise_or.reduce(per << (np.uint32(8) * np.arange(v, dtype=np.uint32)), axis=-1)
    out: np.ndarray = np.zeros((x.shape[0], 32), dtype=np.uint32)
    out[:, scale_lanes(ins, operand)] = words
    return out


@ieee_mode
def unpack_scales(words: np.ndarray, ins: MMAInstruction, operand: str) -> np.ndarray:
    """Inverse of :func:`pack_scales`: (T, 32) scale registers -> uint8 codes (T, 16, v) or (T, v, 8)."""
    _need_scales(ins)
    w = np.asarray(words, dtype=np.uint32)
    if w.ndim != 2 or w.shape[1] != 32:
        raise ValueError(f"scale words must have shape (tiles, 32), got {w.shape}")
    sel = w[:, scale_lanes(ins, operand)]  # (T, rows or cols)
    by = ((sel[..., None] >> (np.uint32(8) * np.arange(ins.scale_vec, dtype=np.uint32))) & 0xFF).astype(np.uint8)
    return by if operand == "a" else np.ascontiguousarray(np.swapaxes(by, 1, 2))


@ieee_mode
def decode_d(codes: np.ndarray, ins: MMAInstruction) -> np.ndarray:
    """Output codes -> float64 values."""
    if ins.output == fp32:
        return np.asarray(codes, dtype=np.uint32).view(np.float32).astype(np.float64)
    return np.asarray(from_bits(codes, ins.output), dtype=np.float64)


@ieee_mode
def mma_kernel_source(ins: MMAInstruction) -> str:
    """CUDA C source of a kernel running one `ins` per warp; each warp handles one tile.

    Signature: ``fpsim_mma(const unsigned* a, const unsigned* b, const unsigned* c, unsigned* d, int tiles)``
    with ``a`` of shape (tiles, 32, a_regs) and so on (as made by :func:`pack_a` ...). Launch with a block
    size that is a multiple of 32. A block-scaled instruction takes its scale registers before ``d``:
    ``fpsim_mma(a, b, c, sa, sb, d, tiles)``, ``sa`` and ``sb`` of shape (tiles, 32) (:func:`pack_scales`).

    Examples
    --------
    >>> src = mma_kernel_source(instruction_for("tf32"))
    >>> "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in src
    True
    """
    na, nb, nc = ins.a_regs, ins.b_regs, ins.c_regs
    f32 = ins.output == fp32
    cons = "f" if f32 else "r"
    ctype = "float" if f32 else "unsigned"
    d_ops = ", ".join(f"%{i}" for i in range(nc))
    a_ops = ", ".join(f"%{nc + i}" for i in range(na))
    b_ops = ", ".join(f"%{nc + na + i}" for i in range(nb))
    c_ops = ", ".join(f"%{nc + na + nb + i}" for i in range(nc))
    load_c = "\n".join(
        f"    {ctype} c{i} = {f'__uint_as_float(pc[{i}])' if f32 else f'pc[{i}]'};" for i in range(nc))
    decl_d = f"    {ctype} " + ", ".join(f"d{i}" for i in range(nc)) + ";"
    outs = ", ".join(f'"={cons}"(d{i})' for i in range(nc))
    ins_ = ", ".join([f'"r"(pa[{i}])' for i in range(na)] + [f'"r"(pb[{i}])' for i in range(nb)]
                     + [f'"{cons}"(c{i})' for i in range(nc)])
    store = "\n".join(f"    pd[{i}] = {f'__float_as_uint(d{i})' if f32 else f'd{i}'};" for i in range(nc))
    sc_params = sc_ops = sc_ins = ""
    if ins.scale:  # scale registers, then the {byte-id, thread-id} selectors: immediates {0, 0} (scale_lanes)
        ns = nc + na + nb + nc
        sc_params = "const unsigned* __restrict__ sa, const unsigned* __restrict__ sb, "
        sc_ops = f", %{ns}, {{0, 0}}, %{ns + 1}, {{0, 0}}"
        sc_ins = ', "r"(sa[tile * 32 + lane]), "r"(sb[tile * 32 + lane])'
    return f"""// fpsim: one {ins.ptx} per warp (generated by fpsim.gpu.fragments)
extern "C" __global__ void {KERNEL_NAME}(const unsigned* __restrict__ a, const unsigned* __restrict__ b,
                                  const unsigned* __restrict__ c, {sc_params}unsigned* __restrict__ d, int tiles)
{{
    const long long gtid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long tile = gtid >> 5;   // one warp per tile: all 32 lanes agree, so the exit is warp-uniform
    const int lane = (int)(gtid & 31);
    if (tile >= tiles) return;
    const unsigned* pa = a + (tile * 32 + lane) * {na};
    const unsigned* pb = b + (tile * 32 + lane) * {nb};
    const unsigned* pc = c + (tile * 32 + lane) * {nc};
    unsigned* pd = d + (tile * 32 + lane) * {nc};
{load_c}
{decl_d}
    asm volatile("{ins.ptx} {{{d_ops}}}, {{{a_ops}}}, {{{b_ops}}}, {{{c_ops}}}{sc_ops};\\n"
                 : {outs}
                 : {ins_}{sc_ins});
{store}
}}
"""
