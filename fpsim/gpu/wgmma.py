"""Hopper ``wgmma.mma_async`` for the FP8 paths: shared-memory images, descriptors, accumulator fragments,
kernel source and the comparison driver (ready for an H100/H200 run; everything but the launch is pure NumPy).

One warpgroup (4 warps, 128 threads, one CTA) executes one
``wgmma.mma_async.sync.aligned.m64nNk32.{f32|f16}.{e4m3|e5m2}.{e4m3|e5m2}``: ``D (64xN) = A (64x32) @ B (32xN) + D``,
with A and B read from shared memory through 64-bit *matrix descriptors* and D (holding C before the
instruction, ``scale-d = 1``) in registers. FP8 operands must be K-major (no transpose for 8-bit types).

Shared-memory layout (no swizzle, the PTX ISA's "interleaved" canonical K-major layout): the operand is cut into
*core matrices* of 8 rows x 16 bytes (16 FP8 elements along K) stored as 128 contiguous bytes, row ``r % 8`` at
byte ``16 * (r % 8)``. Core matrices adjacent along K are ``LBO`` bytes apart (leading dimension byte offset),
those adjacent along M (for A) or N (for B, stored as its transpose, N rows of K) ``SBO`` bytes apart. Here
``LBO = 128`` and ``SBO = 256`` (CUTLASS's canonical K-major ``INTERLEAVE`` layout,
``((8,n),2):((1,SBO),LBO)`` in 16-byte units, in ``make_gmma_desc``)::

    byte(r, k) = (r // 8) * SBO + (k // 16) * LBO + (r % 8) * 16 + (k % 16)

Descriptor (PTX ISA "Matrix Descriptor Format"): bits 0-13 start address >> 4, 16-29 ``LBO >> 4``, 32-45
``SBO >> 4``, 49-51 base offset (0), 62-63 swizzle mode (0: none).

Accumulator fragment (PTX ISA "Register Fragments for wgmma .m64nNk32", D): thread ``tid`` of the warpgroup is
lane ``l = tid % 32`` of warp ``w = tid // 32``; with ``g = l >> 2`` and ``t = l % 4``, its element ``i``
(``0 <= i < N/2``) is row ``16 w + g + 8 ((i // 2) % 2)``, column ``8 (i // 4) + 2 t + (i % 2)``. fp32
accumulators take one register per element, fp16 ones pack elements ``2j`` (low half) and ``2j+1``.

Not yet run on hardware: the layout tiles (:func:`layout_tiles`, one-hot A rows) make a wrong LBO/SBO
reading show up as whole misplaced rows/columns in the first run's report rather than as arithmetic
differences.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._fpenv import ieee_mode
from ..bits import from_bits, to_bits
from ..formats import FormatLike, as_format, fp8_e4m3, fp8_e5m2, fp16, fp32
from ..mma import MMAModel, get_model
from .fragments import MMAInstruction, _out_codes
from .mma_check import MMAReport, compare_mma, random_tiles

__all__ = [
    "LBO",
    "SBO",
    "WGMMA_KERNEL_NAME",
    "WGMMAInstruction",
    "WGMMARunner",
    "accumulator_coords",
    "crosscheck_wgmma",
    "descriptor",
    "emulate_wgmma",
    "layout_tiles",
    "pack_accumulator",
    "pack_smem",
    "run_wgmma_tiles",
    "smem_offsets",
    "unpack_accumulator",
    "unpack_smem",
    "wgmma_gpu_runner",
    "wgmma_instruction",
    "wgmma_kernel_source",
]

WGMMA_KERNEL_NAME = "fpsim_wgmma"
#: Byte distance between core matrices adjacent along K (leading dimension byte offset).
LBO = 128
#: Byte distance between core matrices adjacent along M (A) or N (B) (stride dimension byte offset).
SBO = 256
_PTX = {"fp8_e4m3": "e4m3", "fp8_e5m2": "e5m2", "fp32": "f32", "fp16": "f16"}


@ieee_mode
@dataclass(frozen=True)
class WGMMAInstruction(MMAInstruction):
    """One ``wgmma.mma_async`` FP8 instruction (m64nNk32); compatible with :func:`fpsim.gpu.compare_mma`.

    Attributes
    ----------
    input, output : Format
        FP8 type of A and B (fp8_e4m3 or fp8_e5m2), and fp32 or fp16 for C/D.
    n : int
        N of the instruction: a multiple of 8 in [8, 256].
    arch_suffix : str
        ``"a"``: it compiles for ``sm_90a`` only (:func:`fpsim.gpu._compile.device_arch`).
    """

    k: int = 32
    min_cc: int = 90
    ptx_isa: str = "8.0"
    m: int = 64
    n: int = 8
    #: wgmma exists on the architecture-specific target sm_90a only (not sm_90, not sm_100a)
    arch_suffix: str = "a"

    @property
    def ptx(self) -> str:
        """The mnemonic, e.g. ``wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3``."""
        t, d = _PTX[self.input.name], _PTX[self.output.name]
        return f"wgmma.mma_async.sync.aligned.m{self.m}n{self.n}k{self.k}.{d}.{t}.{t}"

    @property
    def d_regs(self) -> int:
        """Accumulator registers per thread: N/2 for fp32, N/4 for fp16."""
        return self.n // 2 if self.output == fp32 else self.n // 4

    @property
    def a_bytes(self) -> int:
        return self.m * self.k

    @property
    def b_bytes(self) -> int:
        return self.n * self.k


@ieee_mode
def wgmma_instruction(input: FormatLike = "fp8_e4m3", output: FormatLike = "fp32", n: int = 8) -> WGMMAInstruction:
    """The wgmma FP8 instruction for an input/output pair and N.

    Examples
    --------
    >>> wgmma_instruction("e5m2", "fp16", 16).ptx
    'wgmma.mma_async.sync.aligned.m64n16k32.f16.e5m2.e5m2'
    """
    fi, fo = as_format(input), as_format(output)
    if fi not in (fp8_e4m3, fp8_e5m2):
        raise ValueError(f"wgmma FP8 input must be fp8_e4m3 or fp8_e5m2, got {fi.name!r}")
    if fo not in (fp32, fp16):
        raise ValueError(f"wgmma FP8 output must be fp32 or fp16, got {fo.name!r}")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"n must be an int, got {type(n).__name__}: {n!r}")
    if n < 8 or n > 256 or n % 8:
        raise ValueError(f"wgmma N must be a multiple of 8 in [8, 256], got {n!r}")
    return WGMMAInstruction(input=fi, output=fo, n=int(n))


# ---------------------------------------------------------------------------------------------------------
# Shared-memory images and descriptors


@ieee_mode
def smem_offsets(rows: int, k: int = 32) -> np.ndarray:
    """Byte offset of element (r, k) of a K-major operand of `rows` rows: int array (rows, k)."""
    r = np.arange(rows)[:, None]
    kk = np.arange(k)[None, :]
    return (r // 8) * SBO + (kk // 16) * LBO + (r % 8) * 16 + (kk % 16)


def _tiles3(x: Any, shape: tuple[int, int], name: str) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim == 2:
        arr = arr[None]
    if arr.ndim != 3 or arr.shape[1:] != shape:
        raise ValueError(f"{name} must have shape (tiles, {shape[0]}, {shape[1]}), got {np.asarray(x).shape}")
    return arr


@ieee_mode
def pack_smem(x: Any, ins: WGMMAInstruction, operand: str) -> np.ndarray:
    """A tiles (T, 64, 32) or B tiles (T, 32, N) of FP8 values -> shared-memory images (T, bytes) uint8.

    B is stored transposed (N rows of K), as wgmma's K-major B operand.
    """
    if operand == "a":
        v = _tiles3(x, (ins.m, ins.k), "a")
    elif operand == "b":
        v = np.swapaxes(_tiles3(x, (ins.k, ins.n), "b"), 1, 2)  # (T, N, K)
    else:
        raise ValueError(f"operand must be 'a' or 'b', got {operand!r}")
    codes = np.asarray(to_bits(v, ins.input), dtype=np.uint8)
    off = smem_offsets(v.shape[1], ins.k)
    img = np.zeros((v.shape[0], v.shape[1] * ins.k), dtype=np.uint8)
    img[:, off.ravel()] = codes.reshape(v.shape[0], -1)
    return img


@ieee_mode
def unpack_smem(img: Any, ins: WGMMAInstruction, operand: str) -> np.ndarray:
    """Inverse of :func:`pack_smem`: images -> FP8 codes (T, 64, 32) for A, (T, 32, N) for B."""
    rows = ins.m if operand == "a" else ins.n
    if operand not in ("a", "b"):
        raise ValueError(f"operand must be 'a' or 'b', got {operand!r}")
    im = np.asarray(img, dtype=np.uint8)
    if im.ndim != 2 or im.shape[1] != rows * ins.k:
        raise ValueError(f"{operand} image must have shape (tiles, {rows * ins.k}), got {im.shape}")
    codes = im[:, smem_offsets(rows, ins.k)]  # (T, rows, K)
    return codes if operand == "a" else np.swapaxes(codes, 1, 2)


@ieee_mode
def descriptor(address: int, lbo: int = LBO, sbo: int = SBO, swizzle: int = 0) -> int:
    """The 64-bit wgmma matrix descriptor of a shared-memory operand at byte `address`.

    Examples
    --------
    >>> hex(descriptor(0x400))
    '0x1000080040'
    """
    for nm, v in (("address", address), ("lbo", lbo), ("sbo", sbo)):
        if v < 0 or v % 16 or (v >> 4) >= 1 << 14:
            raise ValueError(f"{nm} must be a multiple of 16 below 2**18, got {v!r}")
    if swizzle not in (0, 1, 2, 3):
        raise ValueError(f"swizzle must be 0 (none), 1 (128B), 2 (64B) or 3 (32B), got {swizzle!r}")
    return (address >> 4) | ((lbo >> 4) << 16) | ((sbo >> 4) << 32) | (swizzle << 62)


# ---------------------------------------------------------------------------------------------------------
# Accumulator fragments


@ieee_mode
def accumulator_coords(ins: WGMMAInstruction) -> tuple[np.ndarray, np.ndarray]:
    """(row, col) of every accumulator element each of the 128 threads holds: int arrays (128, N/2)."""
    tid = np.arange(128)[:, None]
    w, lane = tid // 32, tid % 32
    g, t = lane >> 2, lane % 4
    i = np.arange(ins.n // 2)[None, :]
    row = 16 * w + g + 8 * ((i // 2) % 2)
    col = 8 * (i // 4) + 2 * t + (i % 2)
    return np.broadcast_to(row, col.shape).copy(), col


@ieee_mode
def pack_accumulator(c: Any, ins: WGMMAInstruction) -> np.ndarray:
    """C tiles (T, 64, N) of output-format values -> accumulator words (T, 128, d_regs) uint32."""
    cv = _tiles3(c, (ins.m, ins.n), "c")
    rows, cols = accumulator_coords(ins)
    el = _out_codes(cv, ins.output)[:, rows, cols].astype(np.uint32)  # (T, 128, N/2)
    if ins.output == fp32:
        return np.ascontiguousarray(el)
    return np.ascontiguousarray(el[..., 0::2] | (el[..., 1::2] << np.uint32(16)))


@ieee_mode
def unpack_accumulator(words: Any, ins: WGMMAInstruction) -> np.ndarray:
    """Accumulator words (T, 128, d_regs) -> output codes (T, 64, N): uint32 fp32 bits or uint16 fp16 bits."""
    w = np.asarray(words, dtype=np.uint32)
    if w.ndim != 3 or w.shape[1:] != (128, ins.d_regs):
        raise ValueError(f"D words must have shape (tiles, 128, {ins.d_regs}), got {w.shape}")
    if ins.output == fp32:
        el, dt = w, np.uint32
    else:
        el = np.stack([w & 0xFFFF, w >> 16], axis=-1).reshape(w.shape[0], 128, -1)
        dt = np.uint16
    rows, cols = accumulator_coords(ins)
    out: np.ndarray = np.zeros((w.shape[0], ins.m, ins.n), dtype=dt)
    out[:, rows, cols] = el.astype(dt)
    return out


# ---------------------------------------------------------------------------------------------------------
# Kernel source


@ieee_mode
def wgmma_kernel_source(ins: WGMMAInstruction) -> str:
    """CUDA C source: one CTA of 128 threads (a warpgroup) runs one `ins` per tile; compile for sm_90a.

    Signature: ``fpsim_wgmma(const unsigned* a, const unsigned* b, const unsigned* c, unsigned* d, int tiles)``,
    ``a`` the A images (tiles, 2048 bytes), ``b`` the B images (tiles, 32*N bytes) (:func:`pack_smem`), ``c``
    and ``d`` accumulator words (tiles, 128, d_regs) (:func:`pack_accumulator`). Launch ``tiles`` blocks of 128.

    Examples
    --------
    >>> src = wgmma_kernel_source(wgmma_instruction("e4m3", "fp32", 8))
    >>> "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3" in src and "fence.proxy.async" in src
    True
    """
    nr = ins.d_regs
    f32 = ins.output == fp32
    cons, ctype = ("f", "float") if f32 else ("r", "unsigned")
    aw, bw = ins.a_bytes // 4, ins.b_bytes // 4
    regs = ", ".join(f"%{i}" for i in range(nr))
    outs = ", ".join(f'"+{cons}"(d{i})' for i in range(nr))
    load = "\n".join(f"    {ctype} d{i} = {f'__uint_as_float(pc[{i}])' if f32 else f'pc[{i}]'};" for i in range(nr))
    store = "\n".join(f"    pd[{i}] = {f'__float_as_uint(d{i})' if f32 else f'd{i}'};" for i in range(nr))
    return f"""// fpsim: one {ins.ptx} per warpgroup (generated by fpsim.gpu.wgmma); needs sm_90a
__device__ __forceinline__ unsigned long long fpsim_desc(const void* smem)
{{
    const unsigned addr = (unsigned)__cvta_generic_to_shared(smem);
    unsigned long long d = (unsigned long long)((addr >> 4) & 0x3FFF);
    d |= (unsigned long long)(({LBO} >> 4) & 0x3FFF) << 16;   // leading dimension byte offset (along K)
    d |= (unsigned long long)(({SBO} >> 4) & 0x3FFF) << 32;   // stride dimension byte offset (along M / N)
    return d;                                                   // base offset 0, no swizzle
}}

extern "C" __global__ void __launch_bounds__(128) {WGMMA_KERNEL_NAME}(
    const unsigned* __restrict__ a, const unsigned* __restrict__ b, const unsigned* __restrict__ c,
    unsigned* __restrict__ d, int tiles)
{{
    __shared__ __align__(1024) unsigned sa[{aw}];
    __shared__ __align__(1024) unsigned sb[{bw}];
    const long long tile = blockIdx.x;
    const int tid = threadIdx.x;
    if (tile >= tiles) return;   // the whole CTA leaves together
    for (int i = tid; i < {aw}; i += 128) sa[i] = a[tile * {aw} + i];
    for (int i = tid; i < {bw}; i += 128) sb[i] = b[tile * {bw} + i];
    __syncthreads();
    asm volatile("fence.proxy.async.shared::cta;\\n" ::: "memory");   // generic-proxy stores -> async proxy
    __syncthreads();
    const unsigned long long da = fpsim_desc(sa), db = fpsim_desc(sb);
    const unsigned* pc = c + (tile * 128 + tid) * {nr};
    unsigned* pd = d + (tile * 128 + tid) * {nr};
{load}
    asm volatile("wgmma.fence.sync.aligned;\\n" ::: "memory");
    asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{nr + 2}, 0;\\n"
                 "{ins.ptx} {{{regs}}}, %{nr}, %{nr + 1}, p, 1, 1;\\n}}\\n"
                 : {outs}
                 : "l"(da), "l"(db), "r"(1));
    asm volatile("wgmma.commit_group.sync.aligned;\\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\\n" ::: "memory");
{store}
}}
"""


# ---------------------------------------------------------------------------------------------------------
# Running and comparing

#: ``runner(a_images, b_images, c_words, instruction) -> d_words``: the GPU, or :func:`emulate_wgmma`.
WGMMARunner = Callable[[np.ndarray, np.ndarray, np.ndarray, WGMMAInstruction], np.ndarray]


@ieee_mode
def emulate_wgmma(a_img: np.ndarray, b_img: np.ndarray, c_words: np.ndarray, ins: WGMMAInstruction,
                  model: MMAModel) -> np.ndarray:
    """CPU stand-in for the GPU: decode the images and accumulator words, evaluate `model`, pack D."""
    from .mma_check import expected_d

    a = np.asarray(from_bits(unpack_smem(a_img, ins, "a"), ins.input), dtype=np.float64)
    b = np.asarray(from_bits(unpack_smem(b_img, ins, "b"), ins.input), dtype=np.float64)
    cc = unpack_accumulator(c_words, ins)
    c = cc.view(np.float32).astype(np.float64) if ins.output == fp32 else np.asarray(from_bits(cc, ins.output),
                                                                                       dtype=np.float64)
    return pack_accumulator(expected_d(a, b, c, model), ins)


@ieee_mode
def run_wgmma_tiles(a: Any, b: Any, c: Any, ins: WGMMAInstruction, runner: WGMMARunner) -> np.ndarray:
    """Pack the tiles, run them (GPU or emulation), return D codes (T, 64, N)."""
    words = runner(pack_smem(a, ins, "a"), pack_smem(b, ins, "b"), pack_accumulator(c, ins), ins)
    return unpack_accumulator(words, ins)


@ieee_mode
def wgmma_gpu_runner(device: int = 0) -> WGMMARunner:
    """A runner executing the instruction on CUDA device `device` (a Hopper GPU) through CuPy, compiled for sm_90a."""
    from ._compile import build_kernel, device_arch
    from ._device import GPUUnavailable, device_info, require_cupy

    cp = require_cupy(device)
    info = device_info(device)
    if info.cc != 90:
        raise GPUUnavailable(f"wgmma needs a Hopper GPU (compute capability 9.0, sm_90a); {info.name} is "
                             f"{info.cc // 10}.{info.cc % 10}")
    cache: dict[str, Any] = {}

    def run(aw: np.ndarray, bw: np.ndarray, cw: np.ndarray, ins: WGMMAInstruction) -> np.ndarray:
        if ins.ptx not in cache:
            cache[ins.ptx] = build_kernel(cp, wgmma_kernel_source(ins), WGMMA_KERNEL_NAME,
                                          arch=device_arch(ins, info.cc))
        kern = cache[ins.ptx]
        t = aw.shape[0]
        da = cp.asarray(np.ascontiguousarray(aw, dtype=np.uint8).view(np.uint32))
        db = cp.asarray(np.ascontiguousarray(bw, dtype=np.uint8).view(np.uint32))
        dc = cp.asarray(np.ascontiguousarray(cw, dtype=np.uint32))
        dd = cp.zeros((t, 128, ins.d_regs), dtype=cp.uint32)
        if t:
            kern((t,), (128,), (da, db, dc, dd, np.int32(t)))
            cp.cuda.runtime.deviceSynchronize()
        return np.asarray(cp.asnumpy(dd))

    return run


@ieee_mode
def layout_tiles(ins: WGMMAInstruction) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Two tiles whose D reveals the operand layouts: A one-hot (row r picks k = r % 32), C = 0.

    Tile 0: B[k, n] = 2**(k % 8 - 4) * (1 + (k // 8) / 4) (D[r, n] identifies k = r % 32); tile 1:
    B[k, n] = 2**((n % 8) - 4) * (1 + ((n // 8) % 4) / 4) (identifies the column).
    """
    a = np.zeros((2, ins.m, ins.k))
    a[:, np.arange(ins.m), np.arange(ins.m) % ins.k] = 1.0
    k = np.arange(ins.k)[:, None]
    n = np.arange(ins.n)[None, :]
    b0 = np.ldexp(1.0 + (k // 8) / 4, (k % 8) - 4) + 0 * n
    b1 = np.ldexp(1.0 + ((n // 8) % 4) / 4, (n % 8) - 4) + 0 * k
    b = np.stack([b0, b1]).astype(np.float64)
    return a, b, np.zeros((2, ins.m, ins.n))


@ieee_mode
def crosscheck_wgmma(model_or_device: MMAModel | str | None = None, input: FormatLike = "fp8_e4m3",
                     output: FormatLike = "fp32", n: int = 20000, *, nsize: int = 8, device: int = 0,
                     seed: int = 0, runner: WGMMARunner | None = None, max_examples: int = 10) -> MMAReport:
    """Run the layout tiles and random tiles through ``wgmma`` and compare D with fpsim, bit for bit.

    Parameters
    ----------
    model_or_device : MMAModel, device name, or None
        The model to check; a name (``"h200"``) selects ``get_model(name, input, output, path="wgmma")``;
        None uses the name CUDA reports for the device.
    input, output : formats
        fp8_e4m3 / fp8_e5m2 and fp32 / fp16 (ignored when a model is given).
    n : int
        At least this many random D elements (ceil(n / (64 N)) tiles), after the two layout tiles.
    nsize : int
        N of the instruction (8 .. 256).
    runner : callable, optional
        Default the GPU (:func:`wgmma_gpu_runner`); ``lambda a, b, c, ins: emulate_wgmma(a, b, c, ins, model)``
        emulates it.

    Examples
    --------
    >>> from fpsim.mma import get_model
    >>> m = get_model("h200", "e4m3", "fp32", path="wgmma")
    >>> rep = crosscheck_wgmma(m, n=512, runner=lambda a, b, c, ins: emulate_wgmma(a, b, c, ins, m))
    >>> (rep.mismatches, rep.n)
    (0, 1536)
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n!r}")
    dev_name = ""
    if isinstance(model_or_device, MMAModel):
        model = model_or_device
    else:
        name = model_or_device
        if name is None:
            from ._device import device_info

            name = dev_name = device_info(device).name
        if not isinstance(name, str):
            raise TypeError(f"model_or_device must be an MMAModel, a device name or None, got "
                            f"{type(model_or_device).__name__}")
        model = get_model(name, input, output, path="wgmma")
    ins = wgmma_instruction(model.input, model.output, nsize)
    if runner is None:
        runner = wgmma_gpu_runner(device)
    la, lb, lc = layout_tiles(ins)
    ra, rb, rc = random_tiles(ins, -(-n // (ins.m * ins.n)), seed=seed)
    a, b, c = (np.concatenate(p) for p in ((la, ra), (lb, rb), (lc, rc)))
    d = run_wgmma_tiles(a, b, c, ins, runner)
    return compare_mma(a, b, c, d, model, ins, max_examples=max_examples, device=dev_name)
