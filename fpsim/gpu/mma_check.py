"""Cross-check fpsim's Tensor Core models against one ``mma.sync`` instruction on a real GPU, bit for bit.

Tiles of A (16 x K), B (K x 8) and C (16 x 8) are packed into per-lane register words
(:mod:`fpsim.gpu.fragments`), one warp per tile runs the instruction, and every element of D is compared
with :func:`fpsim.mma.dot` of the matching row of A and column of B under the model
(:func:`compare_mma`, pure). :func:`emulate_words` is the CPU stand-in for the GPU (unpack, model, pack),
used by the tests to exercise the whole pipeline without a device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._fpenv import ieee_mode
from ..bits import to_bits
from ..formats import Format, FormatLike, fp32, tf32
from ..mma import MMAModel, dot, get_model
from ..rounding import round as fround
from ._probes import probe_suite
from .fragments import (
    KERNEL_NAME,
    MMAInstruction,
    _out_codes,
    decode_d,
    instruction_for,
    mma_kernel_source,
    pack_a,
    pack_b,
    pack_c,
    pack_scales,
    unpack_d,
    unpack_operand,
    unpack_scales,
)

__all__ = [
    "MMAReport",
    "Runner",
    "ScaledRunner",
    "block_scaled_model_for",
    "compare_mma",
    "crosscheck_block_scaled",
    "crosscheck_mma",
    "emulate_block_scaled",
    "expected_block_scaled",
    "emulate_words",
    "expected_d",
    "gpu_runner",
    "gpu_scaled_runner",
    "random_scales",
    "random_tiles",
    "run_tiles",
]

#: ``runner(a_words, b_words, c_words, instruction) -> d_words``: the GPU, or :func:`emulate_words`.
Runner = Callable[[np.ndarray, np.ndarray, np.ndarray, MMAInstruction], np.ndarray]
#: ``runner(a_words, b_words, c_words, sa_words, sb_words, instruction) -> d_words`` for block-scaled instructions.
ScaledRunner = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, MMAInstruction], np.ndarray]

# Per-element exponent spread (+-) of the "wide" random tiles, kept inside each format's range.
_SPREAD = {"fp16": 6, "bf16": 12, "tf32": 12, "fp8_e4m3": 3, "fp8_e5m2": 6}


def _hex(v: float, fmt: Format) -> str:
    if fmt == fp32 or fmt == tf32:
        return f"{int(np.float32(v).view(np.uint32)):08x}"
    return f"{int(to_bits(v, fmt)):0{(fmt.width + 3) // 4}x}"


@ieee_mode
@dataclass(frozen=True)
class MMAReport:
    """Outcome of comparing GPU D values with an fpsim model, bit for bit.

    ``n`` outputs were compared; ``mismatches`` differ in their bits, except that two NaNs agree (counted in
    ``nan_pattern_diffs``) and +0 vs -0 is counted in ``zero_sign_diffs`` (the model does not model the
    sign of zero). ``probe_mismatches`` lists the ids of reference probes that disagree. ``examples`` are
    dicts with the row of A, column of B and C as hex words, and both D words.
    """

    model: str
    instruction: str
    n: int
    mismatches: int
    zero_sign_diffs: int = 0
    nan_pattern_diffs: int = 0
    probes: int = 0
    probe_mismatches: tuple[str, ...] = ()
    examples: tuple[dict[str, Any], ...] = ()
    device: str = ""

    @property
    def ok(self) -> bool:
        return self.mismatches == 0

    def summary(self) -> str:
        s = (f"{self.model} via {self.instruction}: {self.n} outputs ({self.probes} probe tiles), "
             f"{self.mismatches} mismatches")
        if self.probe_mismatches:
            s += f"; probes off: {', '.join(self.probe_mismatches)}"
        if self.zero_sign_diffs:
            s += f"; {self.zero_sign_diffs} signed-zero differences (not modelled)"
        return s

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "instruction": self.instruction, "n": self.n, "mismatches": self.mismatches,
                "zero_sign_diffs": self.zero_sign_diffs, "nan_pattern_diffs": self.nan_pattern_diffs,
                "probes": self.probes, "probe_mismatches": list(self.probe_mismatches), "ok": self.ok,
                "examples": list(self.examples), "device": self.device}

    def to_markdown(self) -> str:
        lines = [f"- {self.summary()}"]
        for e in self.examples[:3]:
            lines.append(f"  - a=[{' '.join(e['a'])}] b=[{' '.join(e['b'])}] c={e['c']}: "
                         f"fpsim {e['fpsim']}, GPU {e['gpu']}")
        return "\n".join(lines)


@ieee_mode
def random_tiles(ins: MMAInstruction, tiles: int, *, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random A (T,16,K), B (T,K,8), C (T,16,8) values exact in the instruction's formats.

    Half the tiles are N(0,1) rounded to the input format (the published validation protocol), half get an
    extra random power-of-two scale per element so that alignment shifts vary; C is U(0,1) in even tiles
    and U(-1,1) in odd ones, rounded to the output format.
    """
    if tiles < 0:
        raise ValueError(f"tiles must be >= 0, got {tiles!r}")
    rng = np.random.default_rng(seed)
    fin = ins.input
    w = _SPREAD.get(fin.name, 4)

    def draw(shape: tuple[int, ...]) -> np.ndarray:
        x = rng.standard_normal(shape)
        wide = (np.arange(shape[0]) % 2 == 1)[:, None, None]
        x = np.where(wide, np.ldexp(x, rng.integers(-w, w + 1, size=shape)), x)
        ov = "saturate" if fin.width <= 8 else "ieee"
        return np.asarray(fround(x, fin, "rne", overflow=ov), dtype=np.float64)

    a = draw((tiles, ins.m, ins.k))
    b = draw((tiles, ins.k, ins.n))
    c = rng.uniform(0.0, 1.0, size=(tiles, ins.m, ins.n))
    c[1::2] = rng.uniform(-1.0, 1.0, size=c[1::2].shape)
    c = np.asarray(fround(c, ins.output, "rne"), dtype=np.float64)
    return a, b, c


@ieee_mode
def expected_d(a: np.ndarray, b: np.ndarray, c: np.ndarray, model: MMAModel) -> np.ndarray:
    """D (T,16,8) under `model`: element (t,i,j) = dot(a[t,i,:], b[t,:,j], c[t,i,j]) (float64)."""
    rows = np.asarray(a, dtype=np.float64)[:, :, None, :]  # (T, 16, 1, K)
    cols = np.swapaxes(np.asarray(b, dtype=np.float64), 1, 2)[:, None, :, :]  # (T, 1, 8, K)
    return np.asarray(dot(rows, cols, np.asarray(c, dtype=np.float64), model), dtype=np.float64)



def _mismatches(want_v: np.ndarray, d_codes: np.ndarray, ins: MMAInstruction
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Expected codes, the device's values, where the codes differ, where both are NaN, where both are zeros of
    other signs, and the mismatches: code differences that are neither (models carry no NaN payloads and no sign
    of an exact zero)."""
    want = _out_codes(want_v, ins.output).astype(np.uint64)
    got_v = decode_d(d_codes, ins)
    with np.errstate(invalid="ignore"):
        both_nan = np.isnan(want_v) & np.isnan(got_v)
        zero_sign = (want_v == 0) & (got_v == 0) & (want != d_codes)
    diff = want != d_codes
    return want, got_v, diff, both_nan, zero_sign, diff & ~both_nan & ~zero_sign


@ieee_mode
def compare_mma(a: np.ndarray, b: np.ndarray, c: np.ndarray, d_codes: np.ndarray, model: MMAModel,
                ins: MMAInstruction | None = None, *, probe_ids: Sequence[str] = (), max_examples: int = 10,
                device: str = "") -> MMAReport:
    """Compare GPU D codes (T,16,8) with :func:`fpsim.mma.dot` under `model`, bit for bit (pure).

    Tiles ``0 .. len(probe_ids)-1`` are probe tiles whose only meaningful output is D[t, 0, 0] (the rest of the
    tile is zero); the others are compared in full.
    """
    ins = ins if ins is not None else instruction_for(model.input, model.output)
    a = np.asarray(a, dtype=np.float64)
    d_codes = np.asarray(d_codes).astype(np.uint64)
    if d_codes.shape != (a.shape[0], ins.m, ins.n):
        raise ValueError(f"d_codes must have shape {(a.shape[0], ins.m, ins.n)}, got {d_codes.shape}")
    want_v = expected_d(a, b, c, model)
    want, got_v, diff, both_nan, zero_sign, bad = _mismatches(want_v, d_codes, ins)
    npr = len(probe_ids)
    mask = np.ones(bad.shape, dtype=bool)
    if npr:
        mask[:npr] = False
        mask[:npr, 0, 0] = True
    bad_m = bad & mask
    probe_bad = tuple(pid for t, pid in enumerate(probe_ids) if bad[t, 0, 0])
    ex: list[dict[str, Any]] = []
    for t, i, j in zip(*np.nonzero(bad_m)):
        if len(ex) >= max_examples:
            break
        ex.append({"tile": int(t), "row": int(i), "col": int(j),
                   "probe": probe_ids[t] if t < npr else None,
                   "a": [_hex(v, fp32) for v in a[t, i, :]], "b": [_hex(v, fp32) for v in np.asarray(b)[t, :, j]],
                   "c": _hex(float(np.asarray(c)[t, i, j]), fp32),
                   "fpsim": _hex(float(want_v[t, i, j]), ins.output), "gpu": _hex(float(got_v[t, i, j]), ins.output)})
    return MMAReport(model=model.name, instruction=ins.ptx, n=int(mask.sum()), mismatches=int(bad_m.sum()),
                     zero_sign_diffs=int((zero_sign & mask).sum()), nan_pattern_diffs=int((diff & both_nan & mask).sum()),
                     probes=npr, probe_mismatches=probe_bad, examples=tuple(ex), device=device)


def _decode_inputs(codes: np.ndarray, ins: MMAInstruction) -> np.ndarray:
    from ..bits import from_bits

    if ins.input == tf32:
        return codes.astype(np.uint32).view(np.float32).astype(np.float64)
    return np.asarray(from_bits(codes >> np.uint32(ins.container_shift), ins.input), dtype=np.float64)


@ieee_mode
def emulate_words(a_words: np.ndarray, b_words: np.ndarray, c_words: np.ndarray, ins: MMAInstruction,
                  model: MMAModel) -> np.ndarray:
    """CPU stand-in for the GPU: unpack the register words, evaluate `model`, pack D the way the GPU would."""
    a = _decode_inputs(unpack_operand(a_words, ins, "a"), ins)
    b = _decode_inputs(unpack_operand(b_words, ins, "b"), ins)
    cc = unpack_operand(c_words, ins, "c")
    c = cc.view(np.float32).astype(np.float64) if ins.output == fp32 else _decode_inputs_out(cc, ins)
    d = expected_d(a, b, c, model)
    return pack_c(d, ins)


def _decode_inputs_out(codes: np.ndarray, ins: MMAInstruction) -> np.ndarray:
    from ..bits import from_bits

    return np.asarray(from_bits(codes, ins.output), dtype=np.float64)


@ieee_mode
def gpu_runner(device: int = 0) -> Runner:
    """A runner that executes the instruction on CUDA device `device` through CuPy (compiled once per path)."""
    from ._compile import build_kernel, device_arch
    from ._device import device_info, require_cupy

    cp = require_cupy(device)
    cc = device_info(device).cc
    cache: dict[str, Any] = {}

    def run(aw: np.ndarray, bw: np.ndarray, cw: np.ndarray, ins: MMAInstruction) -> np.ndarray:
        if ins.ptx not in cache:
            cache[ins.ptx] = build_kernel(cp, mma_kernel_source(ins), KERNEL_NAME, arch=device_arch(ins, cc))
        return _launch(cp, cache[ins.ptx], ins, (aw, bw, cw))

    return run


def _launch(cp: Any, kern: Any, ins: MMAInstruction, words: Sequence[np.ndarray]) -> np.ndarray:
    """One warp per tile: kernel arguments are the input words (a, b, c[, sa, sb]), then d and the tile count."""
    t = words[0].shape[0]
    dev = [cp.asarray(np.ascontiguousarray(x, dtype=np.uint32)) for x in words]
    dd = cp.zeros((t, 32, ins.c_regs), dtype=cp.uint32)
    threads = 128
    blocks = (t * 32 + threads - 1) // threads
    if t:
        kern((blocks,), (threads,), (*dev, dd, np.int32(t)))
        cp.cuda.runtime.deviceSynchronize()
    return np.asarray(cp.asnumpy(dd))


@ieee_mode
def gpu_scaled_runner(device: int = 0) -> ScaledRunner:
    """:func:`gpu_runner` for the block-scaled instructions (their kernels also take the scale registers)."""
    from ._compile import build_kernel, device_arch
    from ._device import device_info, require_cupy

    cp = require_cupy(device)
    cc = device_info(device).cc
    cache: dict[str, Any] = {}

    def run(aw: np.ndarray, bw: np.ndarray, cw: np.ndarray, saw: np.ndarray, sbw: np.ndarray,
            ins: MMAInstruction) -> np.ndarray:
        if ins.ptx not in cache:
            cache[ins.ptx] = build_kernel(cp, mma_kernel_source(ins), KERNEL_NAME, arch=device_arch(ins, cc))
        return _launch(cp, cache[ins.ptx], ins, (aw, bw, cw, saw, sbw))

    return run


@ieee_mode
def run_tiles(a: np.ndarray, b: np.ndarray, c: np.ndarray, ins: MMAInstruction, runner: Runner) -> np.ndarray:
    """Pack the tiles, run them (GPU or emulation), return D codes (T,16,8)."""
    return unpack_d(runner(pack_a(a, ins), pack_b(b, ins), pack_c(c, ins), ins), ins)


def probe_tiles(ins: MMAInstruction, probes: Sequence[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One tile per probe: its a in row 0 of A, its b in column 0 of B, its c in C[0,0], zeros elsewhere."""
    t = len(probes)
    a = np.zeros((t, ins.m, ins.k))
    b = np.zeros((t, ins.k, ins.n))
    c = np.zeros((t, ins.m, ins.n))
    for i, p in enumerate(probes):
        if len(p.a) > ins.k:
            raise ValueError(f"probe {p.id} has {len(p.a)} terms, more than the instruction's K = {ins.k}")
        a[i, 0, : len(p.a)] = p.a
        b[i, : len(p.b), 0] = p.b
        c[i, 0, 0] = p.c
    return a, b, c


def _resolve_model(model_or_device: MMAModel | str | None, input: FormatLike, output: FormatLike,
                   device: int) -> tuple[MMAModel, str]:
    if isinstance(model_or_device, MMAModel):
        return model_or_device, ""
    if model_or_device is None:
        from ._device import device_info

        name = device_info(device).name
        return get_model(name, input, output), name
    if isinstance(model_or_device, str):
        return get_model(model_or_device, input, output), ""
    raise TypeError(f"model_or_device must be an MMAModel, a device name or None, got {type(model_or_device).__name__}")


@ieee_mode
def crosscheck_mma(model_or_device: MMAModel | str | None = None, input: FormatLike = "fp16",
                   output: FormatLike = "fp32", n: int = 10000, *, device: int = 0, seed: int = 0,
                   probes: bool = True, runner: Runner | None = None, max_examples: int = 10,
                   instruction: MMAInstruction | None = None) -> MMAReport:
    """Run random tiles and the reference probe vectors through ``mma.sync`` and compare D with fpsim.

    Parameters
    ----------
    model_or_device : MMAModel, device name, or None
        The model to check; a name such as ``"h200"`` selects ``fpsim.mma.get_model(name, input, output)``;
        None (default) uses the name CUDA reports for the device (e.g. "NVIDIA H200").
    input, output : formats
        Ignored when a model is given (the model's own formats are used).
    n : int
        At least this many random D elements are compared (ceil(n/128) tiles of 16x8; the 16 rows and 8
        columns of a tile are independent random vectors, so outputs share vectors within a tile).
    probes : bool
        Also run the probe suite of :mod:`fpsim.gpu.probing` for this path (one tile each).
    runner : callable, optional
        Where to run the tiles: default the GPU (:func:`gpu_runner`); pass
        ``lambda aw, bw, cw, ins: emulate_words(aw, bw, cw, ins, some_model)`` to emulate.
    instruction : MMAInstruction, optional
        The instruction to run (one of :data:`fpsim.gpu.fragments.GENERATION_INSTRUCTIONS`, say); default the
        sm_80 shape of the model's formats. Its formats must be the model's.

    Raises
    ------
    fpsim.gpu.GPUUnavailable
        Without CuPy or a CUDA device (when no `runner` is given).
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n!r}")
    dev_name = ""
    if runner is None:
        from ._device import device_info

        dev_name = device_info(device).name
    model, _ = _resolve_model(model_or_device, input, output, device)
    ins = instruction if instruction is not None else instruction_for(model.input, model.output)
    if (ins.input, ins.output) != (model.input, model.output):
        raise ValueError(f"instruction {ins.ptx} multiplies {ins.input.name}->{ins.output.name}, the model "
                         f"{model.name} {model.input.name}->{model.output.name}")
    if runner is None:
        runner = gpu_runner(device)
    ids: list[str] = []
    parts = []
    if probes:
        # probes longer than a short instruction's K (Turing's m16n8k8) do not fit one tile: left out
        suite = tuple(p for p in probe_suite(model.input, model.output) if len(p.a) <= ins.k)
        ids = [p.id for p in suite]
        parts.append(probe_tiles(ins, suite))
    parts.append(random_tiles(ins, -(-n // (ins.m * ins.n)), seed=seed))
    a = np.concatenate([p[0] for p in parts])
    b = np.concatenate([p[1] for p in parts])
    c = np.concatenate([p[2] for p in parts])
    d = run_tiles(a, b, c, ins, runner)
    return compare_mma(a, b, c, d, model, ins, probe_ids=ids, max_examples=max_examples, device=dev_name)


# ---------------------------------------------------------------------------------------------------------
# Block-scaled mma.sync (sm_120a): the scales travel in their own registers and the model is
# fpsim.mma.blockscaled's (checked bit for bit against MMA-Sim in tests/test_mma_blackwell.py).


@ieee_mode
def block_scaled_model_for(ins: MMAInstruction, device: str | None = None) -> Any:
    """The :class:`fpsim.mma.BlockScaledModel` a block-scaled instruction checks (device default its preset).

    Examples
    --------
    >>> from fpsim.gpu.fragments import BLOCK_SCALED_INSTRUCTIONS
    >>> ins = BLOCK_SCALED_INSTRUCTIONS["sm_120a m16n8k64 mxf4nvf4 ue4m3/16 fp4_e2m1->fp32"]
    >>> m = block_scaled_model_for(ins)
    >>> m.name, m.instruction == ins.ptx
    ('rtx5090 mxf4nvf4 e2m1 x e2m1 (ue4m3/16) -> fp32', True)
    """
    from ..mma.blockscaled import block_scaled_model

    if not ins.scale:
        raise ValueError(f"{ins.ptx} is not a block-scaled instruction")
    return block_scaled_model(device or ins.preset, ins.kind, ins.input, ins.input, ins.output,
                              block=ins.block, scale=ins.scale)


@ieee_mode
def random_scales(ins: MMAInstruction, tiles: int, *, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Random uint8 scale codes for A (T, 16, v) and B (T, v, 8): UE8M0 2**[-6, 6], or finite positive UE4M3
    (codes 0x01..0x7E, subnormals included), so that scaled products stay inside fp32's range."""
    if tiles < 0:
        raise ValueError(f"tiles must be >= 0, got {tiles!r}")
    rng = np.random.default_rng(seed)
    v = ins.scale_vec

    def draw(shape: tuple[int, ...]) -> np.ndarray:
        if ins.scale == "ue8m0":
            return np.asarray(127 + rng.integers(-6, 7, size=shape), dtype=np.uint8)
        return np.asarray(rng.integers(0x01, 0x7F, size=shape), dtype=np.uint8)

    return draw((tiles, ins.m, v)), draw((tiles, v, ins.n))


@ieee_mode
def emulate_block_scaled(a_words: np.ndarray, b_words: np.ndarray, c_words: np.ndarray, sa_words: np.ndarray,
                         sb_words: np.ndarray, ins: MMAInstruction, model: Any) -> np.ndarray:
    """CPU stand-in for a block-scaled warp: unpack operands and scales, run `model`, pack D as the GPU would."""
    a = _decode_inputs(unpack_operand(a_words, ins, "a"), ins)
    b = _decode_inputs(unpack_operand(b_words, ins, "b"), ins)
    c = unpack_operand(c_words, ins, "c").view(np.float32).astype(np.float64)
    d = expected_block_scaled(a, b, c, unpack_scales(sa_words, ins, "a"), unpack_scales(sb_words, ins, "b"), model)
    return pack_c(d, ins)


@ieee_mode
def expected_block_scaled(a: np.ndarray, b: np.ndarray, c: np.ndarray, sa: np.ndarray, sb: np.ndarray,
                          model: Any) -> np.ndarray:
    """D (T,16,8) of one block-scaled instruction per tile under `model`; `sa`, `sb` uint8 scale codes."""
    from ..mma.blockscaled import matmul_block_scaled

    cv = np.asarray(c, dtype=np.float64)
    out: np.ndarray = np.empty(cv.shape)
    # one matmul_block_scaled call per tile (an instruction each): tiles differ in every operand
    for t in range(int(cv.shape[0])):
        out[t] = matmul_block_scaled(a[t], b[t], cv[t], scale_a=sa[t], scale_b=sb[t], model=model,
                                     input_rounding="exact")
    return out


@ieee_mode
def crosscheck_block_scaled(ins: MMAInstruction, n: int = 10000, *, device: int = 0, seed: int = 0,
                            runner: ScaledRunner | None = None, model: Any = None,
                            max_examples: int = 10) -> MMAReport:
    """Run random tiles and scales through a block-scaled ``mma.sync`` (sm_120a) and compare D with fpsim.

    Parameters
    ----------
    ins : MMAInstruction
        One of :data:`fpsim.gpu.fragments.BLOCK_SCALED_INSTRUCTIONS`.
    n : int
        At least this many D elements are compared (ceil(n/128) tiles, each with its own scales).
    runner : callable, optional
        Default the GPU (:func:`gpu_scaled_runner`); ``lambda aw, bw, cw, sa, sb, ins:
        emulate_block_scaled(aw, bw, cw, sa, sb, ins, model)`` emulates.
    model : BlockScaledModel, optional
        Default :func:`block_scaled_model_for` `ins` (the rtx5090 preset).

    Examples
    --------
    >>> from fpsim.gpu.fragments import BLOCK_SCALED_INSTRUCTIONS
    >>> ins = BLOCK_SCALED_INSTRUCTIONS["sm_120a m16n8k32 mxf8f6f4 ue8m0/32 fp8_e4m3->fp32"]
    >>> m = block_scaled_model_for(ins)
    >>> emu = lambda aw, bw, cw, sa, sb, i: emulate_block_scaled(aw, bw, cw, sa, sb, i, m)
    >>> crosscheck_block_scaled(ins, 256, runner=emu).mismatches
    0
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n!r}")
    model = block_scaled_model_for(ins) if model is None else model
    if (model.kind, model.a, model.output, model.block, model.scale) != (ins.kind, ins.input, ins.output, ins.block,
                                                                         ins.scale):
        raise ValueError(f"model {model.name} does not match the instruction {ins.ptx}")
    dev_name = ""
    if runner is None:
        from ._device import device_info

        dev_name = device_info(device).name
        runner = gpu_scaled_runner(device)
    tiles = -(-n // (ins.m * ins.n))
    a, b, c = random_tiles(ins, tiles, seed=seed)
    sa, sb = random_scales(ins, tiles, seed=seed + 1)
    words = runner(pack_a(a, ins), pack_b(b, ins), pack_c(c, ins), pack_scales(sa, ins, "a"),
                   pack_scales(sb, ins, "b"), ins)
    d_codes = unpack_d(words, ins).astype(np.uint64)
    want_v = expected_block_scaled(a, b, c, sa, sb, model)
    want, got_v, diff, both_nan, zero_sign, bad = _mismatches(want_v, d_codes, ins)
    ex: list[dict[str, Any]] = []
    for t, i, j in list(zip(*np.nonzero(bad)))[:max_examples]:
        ex.append({"tile": int(t), "row": int(i), "col": int(j), "probe": None,
                   "a": [_hex(v, fp32) for v in a[t, i, :]], "b": [_hex(v, fp32) for v in b[t, :, j]],
                   "c": _hex(float(c[t, i, j]), fp32), "scale_a": [int(x) for x in sa[t, i]],
                   "scale_b": [int(x) for x in sb[t, :, j]],
                   "fpsim": _hex(float(want_v[t, i, j]), ins.output), "gpu": _hex(float(got_v[t, i, j]), ins.output)})
    return MMAReport(model=model.name, instruction=ins.ptx, n=int(bad.size), mismatches=int(bad.sum()),
                     zero_sign_diffs=int(zero_sign.sum()), nan_pattern_diffs=int((diff & both_nan).sum()),
                     examples=tuple(ex), device=dev_name)
