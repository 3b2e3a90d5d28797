"""NF4, QLoRA's 4-bit NormalFloat, as bitsandbytes 0.50.2 computes it: the code. Described, and re-exported, by
:mod:`fpsim.quant_nf4` (and its public names by :mod:`fpsim.quant`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from .._checks import check_bool, check_int
from .._fpenv import ieee_mode
from .._interop import as_array
from .._names import parse_name
from ..formats import FormatLike, as_format
from ..rounding import round as _round

__all__ = [
    "NF4",
    "NF4Absmax",
    "NF4Tensor",
    "dynamic_map",
    "nf4_bits_per_parameter",
    "nf4_dequantize",
    "nf4_pack",
    "nf4_quantize",
    "nf4_unpack",
    "torch_float32_sum",
]

_F = np.float32

#: The 16 NF4 levels, as published (QLoRA appendix E) and as bitsandbytes' source holds them, float32.
NF4: np.ndarray = np.array([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0], dtype=_F)
NF4.flags.writeable = False

_MID = ((NF4[:-1] + NF4[1:]) / _F(2)).astype(_F)        # (15,) float32 midpoints, as bitsandbytes builds them

#: Block sizes bitsandbytes' ``quantize_4bit`` accepts.
BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)


# --------------------------------------------------------------------------------------------------
# torch's float32 summation order (for the double-quantization offset)

def _row_sum(v: np.ndarray) -> np.ndarray:
    """torch's ``row_sum`` (SumKernel.cpp): 4 interleaved accumulators over axis 0 with a 4-level cascade
    (levels of ``2**max(4, ceil_log2(n/4) // 4)`` steps), then the leftovers and the 4 partials in order.
    ``v`` (n, ...) float32 -> (...) float32. Python loops run over chunks of >= 16 rows, not elements."""
    n = v.shape[0]
    size_ilp = n // 4
    clog2 = 0 if size_ilp <= 1 else int(size_ilp - 1).bit_length()
    power = max(4, clog2 // 4)
    step, mask = 1 << power, (1 << power) - 1
    g = v[: size_ilp * 4].reshape((size_ilp, 4) + v.shape[1:])         # (n/4, 4, ...)
    acc = np.zeros((4, 4) + v.shape[1:], _F)
    i = 0
    while i + step <= size_ilp:
        acc[0] += np.cumsum(g[i:i + step], axis=0, dtype=_F)[-1]     # sequential over the chunk
        i += step
        for j in range(1, 4):
            acc[j] += acc[j - 1]
            acc[j - 1] = 0
            if i & (mask << (j * power)):
                break
    for k in range(i, size_ilp):
        acc[0] += g[k]
    for j in range(1, 4):
        acc[0] += acc[j]
    ps = acc[0]
    for k in range(size_ilp * 4, n):
        ps[0] += v[k]
    for k in range(1, 4):
        ps[0] += ps[k]
    out: np.ndarray = ps[0]
    return out


@ieee_mode
def torch_float32_sum(x: Any, *, lanes: int = 8) -> np.float32:
    """The float32 sum of a contiguous 1-D float32 array in torch's CPU order (single thread).

    Vectors of ``lanes`` elements (``Vectorized<float>``: 8 in the kernels torch 2.13 dispatches here)
    summed with torch's 4-way cascade (``row_sum``), the scalar tail added in order, then the lanes in
    order; arrays shorter than ``lanes`` go through the scalar cascade. Bit-identical to
    ``torch.sum`` on float32 CPU tensors of up to 32768 elements (tests/test_nf4.py).

    >>> float(torch_float32_sum(np.float32([0.1, 0.2, 0.3])))
    0.6000000238418579
    """
    a = np.ascontiguousarray(as_array(x, "x"), dtype=_F).reshape(-1)
    lanes = check_int(lanes, "lanes", lo=1)
    n = a.size
    if n < lanes:
        small: np.float32 = np.float32(_row_sum(a).item())
        return small
    nv = n // lanes
    vec = _row_sum(a[: nv * lanes].reshape(nv, lanes))                # (lanes,)
    total = _F(0)
    for k in range(nv * lanes, n):                                     # < lanes scalar tail elements
        total = _F(total + a[k])
    for k in range(lanes):
        total = _F(total + vec[k])
    result: np.float32 = np.float32(total)
    return result


# --------------------------------------------------------------------------------------------------
# bitsandbytes' 8-bit dynamic map

def _torch_linspace_f32(start: float, end: float, steps: int) -> np.ndarray:
    """``torch.linspace(start, end, steps, dtype=torch.float32)`` on the CPU: float32 step, the first half
    ``start + step * i``, the second half ``end - step * (steps - 1 - i)``, each rounded once (the kernel's
    contracted multiply-add; the product of a float32 and a small integer is exact in float64)."""
    s, e = _F(start), _F(end)
    step = _F((e - s) / _F(steps - 1))
    idx = np.arange(steps)
    up = (np.float64(s) + np.float64(step) * idx).astype(_F)
    down = (np.float64(e) - np.float64(step) * (steps - idx - 1)).astype(_F)
    out: np.ndarray = np.where(idx < steps // 2, up, down).astype(_F)
    return out


@ieee_mode
def dynamic_map(signed: bool = True, max_exponent_bits: int = 7, total_bits: int = 8) -> np.ndarray:
    """bitsandbytes' ``create_dynamic_map`` (Dettmers, "8-bit approximations", arXiv 1511.04561), float32.

    The map double quantization uses for the absmax constants and stores beside them (entry 0 is
    -0.99296874 in float32; bitsandbytes 0.50.2's CPU kernel builds its lookup table from the map as is).

    >>> m = dynamic_map()
    >>> m.shape, float(m[0]), float(m[-1]), float(m[127])
    ((256,), -0.992968738079071, 1.0, 0.0)
    """
    signed = check_bool(signed, "signed")
    max_exponent_bits = check_int(max_exponent_bits, "max_exponent_bits", lo=1)
    total_bits = check_int(total_bits, "total_bits", lo=2)
    data: list[float] = []
    non_sign = total_bits - 1
    extra = 2 ** (non_sign - max_exponent_bits) - 1
    i = 0
    for i in range(max_exponent_bits):
        items = 2 ** (i + non_sign - max_exponent_bits) + 1 if signed else \
            2 ** (i + non_sign - max_exponent_bits + 1) + 1
        b = _torch_linspace_f32(0.1, 1.0, int(items))
        means = ((b[:-1] + b[1:]) / _F(2)).astype(_F)
        scale = _F(10 ** (-(max_exponent_bits - 1) + i))
        data += (scale * means).astype(_F).tolist()
        if signed:
            data += (-scale * means).astype(_F).tolist()
    if extra > 0:
        b = _torch_linspace_f32(0.1, 1.0, extra + 1)
        means = ((b[:-1] + b[1:]) / _F(2)).astype(_F)
        scale = _F(10 ** (-(max_exponent_bits - 1) + i))
        data += (scale * means).astype(_F).tolist()
        if signed:
            data += (-scale * means).astype(_F).tolist()
    data += [0.0, 1.0]
    if len(data) != 2 ** total_bits:
        raise ValueError(f"dynamic_map: {len(data)} entries for total_bits={total_bits}; need 2**total_bits")
    out: np.ndarray = np.sort(np.array(data, dtype=_F))
    return out


_DYN = dynamic_map()
_DYN.flags.writeable = False

#: Rules :func:`nf4_quantize` accepts for the 8-bit search of the absmax constants (``absmax_search``).
ABSMAX_SEARCHES = ("bitsandbytes", "nearest")

_LUT_SIZE = 65536                                # bitsandbytes' kLUTSize


def _quantize_lut(code: np.ndarray) -> np.ndarray:
    """bitsandbytes' ``build_quantize_lut`` (csrc/cpu_ops.cpp): 65536 bins over [-1, 1], bin ``i`` at
    ``val = (2f * i) / 65535f - 1f`` (float32), mapped to the number of float32 midpoints
    ``0.5f * (code[j] + code[j+1])`` strictly below ``val`` (``while (midpoints[code_idx] < val)``)."""
    mid = (_F(0.5) * (code[:-1] + code[1:]).astype(_F)).astype(_F)              # (255,)
    i = np.arange(_LUT_SIZE)
    val = ((_F(2) * i.astype(_F)).astype(_F) / _F(_LUT_SIZE - 1)).astype(_F) - _F(1)
    out: np.ndarray = np.searchsorted(mid, val.astype(_F), side="left").astype(np.uint8)
    return out


_DYN_LUT = _quantize_lut(_DYN)
_DYN_LUT.flags.writeable = False


def _lut_index(normed: np.ndarray) -> np.ndarray:
    """bitsandbytes' ``norm_to_lut_index``: clamp to [-1, 1], ``t = (v + 1f) * 0.5f`` in float32, then
    ``(uint16)(t * 65535 + 0.5f)`` with the multiply-add fused (``vfmadd213ss`` in 0.50.2's
    libbitsandbytes_cpu.so: one float32 rounding) and truncated. ``t`` is a multiple of 2**-25 in [0, 1],
    so ``t * 65535 + 0.5`` is exact in float64 and the one cast to float32 is the fused rounding. NaN
    gives index 0 (``cvttss2si`` returns 0x80000000, whose low 16 bits are 0)."""
    v = np.clip(normed, _F(-1), _F(1))
    t = ((v + _F(1)).astype(_F) * _F(0.5)).astype(_F)
    f = (t.astype(np.float64) * (_LUT_SIZE - 1) + 0.5).astype(_F)
    idx: np.ndarray = np.where(np.isnan(f), _F(0), f).astype(np.int64)                       # trunc toward 0, f >= 0.5
    return idx


def _quantize_blockwise8(v: np.ndarray, blocksize: int, search: str = "bitsandbytes"
                         ) -> tuple[np.ndarray, np.ndarray]:
    """bitsandbytes 0.50.2's CPU ``quantize_cpu_impl`` (``quantize_blockwise`` with the dynamic map): per
    block ``a = max(0, max|v|)``; a zero block gets codes 0; otherwise ``v * (1f / a)`` (reciprocal
    first, also for the last, partial block), then the code ``lut[norm_to_lut_index(.)]``
    (``search="bitsandbytes"``) or the nearest map entry, ties to the lower index (``"nearest"``).
    -> (uint8 codes, float32 absmax2)."""
    n = v.size
    nb = -(-n // blocksize)
    pad = nb * blocksize - n
    vp = np.concatenate([v, np.zeros(pad, _F)]).reshape(nb, blocksize)  # zero pads never raise a max
    a2 = np.maximum(np.abs(vp).max(axis=1), _F(0)).astype(_F)          # (nb,)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        inv = np.where(a2 == 0, _F(0), _F(1) / np.where(a2 == 0, _F(1), a2)).astype(_F)
        normed = (vp * inv[:, None]).astype(_F).reshape(-1)[:n]
    if search == "bitsandbytes":
        idx = _DYN_LUT[_lut_index(normed)].astype(np.int64)
    else:
        code = _DYN
        c64 = code.astype(np.float64)
        mid = (c64[:-1] + c64[1:]) / 2                                     # exact midpoints
        c = np.clip(normed, _F(-1), _F(1)).astype(np.float64)
        idx = np.searchsorted(mid, c, side="left")                         # on a midpoint: lower index
        idx = np.where(np.isnan(c), 0, idx)
    zero = np.repeat(a2 == 0, blocksize)[:n]
    return np.where(zero, 0, idx).astype(np.uint8), a2


@ieee_mode
class NF4Absmax(NamedTuple):
    """Double-quantized absmax constants (bitsandbytes' nested ``QuantState``).

    ``codes`` uint8 (n_blocks,) indices into ``code``; ``absmax2`` float32 (ceil(n_blocks / blocksize2),)
    the second-level constants; ``offset`` the float32 mean subtracted first; ``code`` the 8-bit
    :func:`dynamic_map`; ``blocksize2`` 256; ``nonfinite`` None, or ``(indices, values)`` of the
    first-level constants that are NaN or infinite (blocks holding a NaN or an infinity), kept exactly
    outside the 8-bit codes so that they stay local to their block (see :func:`nf4_quantize`).
    """

    codes: np.ndarray
    absmax2: np.ndarray
    offset: np.float32
    code: np.ndarray
    blocksize2: int = 256
    nonfinite: tuple[np.ndarray, np.ndarray] | None = None

    def dequantize(self) -> np.ndarray:
        """The first-level constants back: ``code[codes] * absmax2[block]`` then ``+ offset``, float32."""
        n = self.codes.size
        scale = np.repeat(self.absmax2, self.blocksize2)[:n]
        out: np.ndarray = ((self.code[self.codes] * scale).astype(_F) + self.offset).astype(_F)
        if self.nonfinite is not None:
            idx, vals = self.nonfinite
            out[idx] = vals
        return out

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays: the 8-bit codes, the float32 second-level constants and the offset (and
        the non-finite constants, where there are any)."""
        extra = 0 if self.nonfinite is None else int(self.nonfinite[0].nbytes + self.nonfinite[1].nbytes)
        return int(self.codes.nbytes + self.absmax2.nbytes + 4 + extra)


# --------------------------------------------------------------------------------------------------
# NF4

def _blocksize(blocksize: Any) -> int:
    bs = check_int(blocksize, "blocksize")
    if bs not in BLOCKSIZES:
        raise ValueError(f"blocksize={bs!r} is not one of the block sizes bitsandbytes supports: "
                         f"{', '.join(map(str, BLOCKSIZES))}")
    return bs


def _as_f32(x: Any, what: str) -> np.ndarray:
    a = as_array(x, what)
    if a.dtype.kind not in "fiu" and a.dtype.name not in ("bfloat16",):
        if not a.dtype.name.startswith("float"):
            raise TypeError(f"{what} must be a float array, got dtype {a.dtype}")
    if a.dtype.kind in "iub":
        raise TypeError(f"{what} must be a float array, got dtype {a.dtype}")
    with np.errstate(over="ignore"):  # float64 beyond float32's range: +-inf, as torch's .float()
        return np.asarray(a, dtype=_F)


@ieee_mode
def nf4_pack(codes: Any) -> np.ndarray:
    """Two 4-bit codes per byte, bitsandbytes' layout: element ``2i`` in the high nibble, ``2i+1`` in the
    low one; an odd count pads code 7 (0.0). -> uint8 (ceil(n/2),).

    >>> nf4_pack(np.uint8([1, 2, 15])).tolist()
    [18, 247]
    """
    c = np.asarray(codes)
    if c.dtype != np.uint8:
        raise TypeError(f"codes must be a uint8 array, got dtype {c.dtype}")
    if c.size and int(c.max()) > 15:
        raise ValueError(f"codes must be 4-bit values 0..15, got {int(c.max())}")
    flat = c.reshape(-1)
    if flat.size % 2:
        flat = np.concatenate([flat, np.full(1, 7, np.uint8)])
    out: np.ndarray = ((flat[0::2] << 4) | flat[1::2]).astype(np.uint8)
    return out


@ieee_mode
def nf4_unpack(packed: Any, n: int) -> np.ndarray:
    """The first ``n`` codes of a :func:`nf4_pack` array, one per uint8.

    >>> nf4_unpack(np.uint8([18, 247]), 3).tolist()
    [1, 2, 15]
    """
    p = np.asarray(packed)
    if p.dtype != np.uint8:
        raise TypeError(f"packed must be a uint8 array, got dtype {p.dtype}")
    n = check_int(n, "n", lo=0)
    p = p.reshape(-1)
    if n > 2 * p.size:
        raise ValueError(f"n={n} codes do not fit in {p.size} packed bytes (at most {2 * p.size})")
    out = np.empty(2 * p.size, np.uint8)
    out[0::2], out[1::2] = p >> 4, p & 0xF
    return out[:n]


@ieee_mode
def nf4_quantize(x: Any, blocksize: int = 64, double_quant: bool = False, *, packed: bool = False,
                 absmax_search: str = "bitsandbytes") -> tuple[np.ndarray, np.ndarray | NF4Absmax]:
    """Blockwise NF4 quantization, bit-identical to ``bitsandbytes.functional.quantize_4bit(quant_type="nf4")``.

    Parameters
    ----------
    x : array_like
        float32, float64 (rounded to float32 first), bf16/fp16 (ml_dtypes, NumPy or torch CPU tensors).
    blocksize : int
        Elements per absmax constant: one of 32, 64, 128, ..., 4096 (bitsandbytes' choices).
    double_quant : bool
        Quantize the absmax constants too (``compress_statistics=True``): ``absmax`` is then an
        :class:`NF4Absmax`. A block holding a NaN or an infinity has a non-finite constant: bitsandbytes
        then makes the mean, and so every block, NaN; here (the one departure from its bits) the mean and
        the 8-bit codes are those of the finite constants and the non-finite ones are kept exactly
        (``NF4Absmax.nonfinite``), so the block dequantizes as it would without double quantization
        and every other block is unaffected. Inputs without NaN or infinity give bitsandbytes' bits.
    packed : bool
        ``False`` (default): one code per uint8 in ``x``'s shape. ``True``: bitsandbytes' storage, two
        codes per byte, flat (ceil(n/2),) (see :func:`nf4_pack`).
    absmax_search : {"bitsandbytes", "nearest"}
        How double quantization picks each constant's 8-bit code. ``"bitsandbytes"`` (default): the
        bits bitsandbytes 0.50.2's CPU kernel stores, i.e. what QLoRA checkpoints hold: a 65536-bin
        lookup table over [-1, 1] (the bin's midpoint rule, not the value's), which for a value close to
        a midpoint of two map entries can return the farther entry. ``"nearest"``: the nearest map entry
        to the scaled value (ties to the lower index), the rule the paper's algorithm states (Dettmers
        et al., 1511.04561 / 2305.14314). Ignored unless ``double_quant``.

    Returns
    -------
    (codes, absmax)
        uint8 codes and the float32 (n_blocks,) constants (or an :class:`NF4Absmax`).

    Examples
    --------
    >>> c, a = nf4_quantize(np.float32([3.0, -1.5, 0.0]), blocksize=32, packed=True)
    >>> c.tolist(), a.tolist()
    ([242, 119], [3.0])
    """
    bs = _blocksize(blocksize)
    double_quant = check_bool(double_quant, "double_quant")
    packed = check_bool(packed, "packed")
    search = parse_name(absmax_search, ABSMAX_SEARCHES, "absmax_search")
    a = _as_f32(x, "x")
    shape = a.shape
    flat = a.reshape(-1)
    n = flat.size
    if n == 0:
        raise ValueError("nf4_quantize needs at least one element, got an empty array")
    rem = n % bs
    full = n - rem
    with np.errstate(over="ignore", invalid="ignore"):  # an infinite absmax: inf * 0 and inf / inf are NaN
        blocks = flat[:full].reshape(-1, bs)                                  # (nb, bs)
        absmax = np.abs(blocks).max(axis=1).astype(_F) if full else np.zeros(0, _F)
        inv = (_F(1) / np.maximum(absmax, _F(1e-38))).astype(_F)              # reciprocal, then multiply
        scaled = np.clip((blocks * inv[:, None]).astype(_F), _F(-1), _F(1)).reshape(-1)
        if rem:
            am = np.maximum(np.abs(flat[full:]).max(), _F(1e-38)).astype(_F)  # stored clamped
            tail = np.clip((flat[full:] / am).astype(_F), _F(-1), _F(1))      # divided
            absmax = np.concatenate([absmax, np.array([am], _F)])
            scaled = np.concatenate([scaled, tail])
    codes = np.searchsorted(_MID, scaled, side="left").astype(np.uint8)       # ties to the lower code
    out_codes = nf4_pack(codes) if packed else codes.reshape(shape)
    if not double_quant:
        return out_codes, absmax
    fin = np.isfinite(absmax)
    if fin.all():
        offset = _F(torch_float32_sum(absmax) / _F(absmax.size))
        q, a2 = _quantize_blockwise8((absmax - offset).astype(_F), 256, search)
        return out_codes, NF4Absmax(q, a2, offset, _DYN)
    # A NaN or infinite constant (its block holds one) would make the mean, and through it every constant,
    # NaN (as bitsandbytes does); here the statistics are those of the finite constants and the others are
    # kept exactly, so a non-finite value stays local to its block.
    nfin = int(fin.sum())
    offset = _F(torch_float32_sum(absmax[fin]) / _F(nfin)) if nfin else _F(0)
    q, a2 = _quantize_blockwise8(np.where(fin, absmax - offset, _F(0)).astype(_F), 256, search)
    bad = np.flatnonzero(~fin)
    return out_codes, NF4Absmax(q, a2, offset, _DYN, 256, (bad, absmax[bad].copy()))


@ieee_mode
def nf4_dequantize(codes: Any, absmax: Any, blocksize: int = 64, *, shape: Any = None,
                   out_format: FormatLike | None = None) -> np.ndarray:
    """Inverse of :func:`nf4_quantize`: ``NF4[code] * absmax`` per block, float32 (bitsandbytes'
    ``dequantize_4bit``).

    ``codes``: one per uint8 (any shape; the result has that shape) or packed (pass ``shape``, the
    original shape: packed codes are recognised by ``shape`` being given). ``absmax``: float32 constants
    or an :class:`NF4Absmax`. ``out_format``: ``"bf16"``/``"fp16"`` rounds the float32 product once more
    (ties to even), as bitsandbytes does for a bf16/fp16 ``quant_state.dtype``; float32 carriers come back.

    >>> c, a = nf4_quantize(np.float32([1.0, 0.3]), blocksize=32, double_quant=True)
    >>> nf4_dequantize(c, a, 32).tolist()
    [1.0, 0.33791524171829224]
    """
    bs = _blocksize(blocksize)
    c = np.asarray(codes)
    if c.dtype != np.uint8:
        raise TypeError(f"codes must be a uint8 array, got dtype {c.dtype}")
    if shape is not None:
        shp = tuple(check_int(s, "shape", lo=0) for s in (shape if np.iterable(shape) else (shape,)))
        flat = nf4_unpack(c, int(np.prod(shp, dtype=np.int64)))
    else:
        shp = c.shape
        flat = c.reshape(-1)
        if flat.size and int(flat.max()) > 15:
            raise ValueError("codes hold values above 15: packed codes need shape= (the original shape)")
    am = absmax.dequantize() if isinstance(absmax, NF4Absmax) else np.asarray(absmax, dtype=_F).reshape(-1)
    nb = -(-flat.size // bs)
    if am.size != nb:
        raise ValueError(f"absmax has {am.size} constants; {flat.size} codes at blocksize {bs} need {nb}")
    with np.errstate(invalid="ignore"):  # 0 * an infinite constant: NaN, as in bitsandbytes
        out: np.ndarray = (NF4[flat] * np.repeat(am, bs)[: flat.size]).astype(_F).reshape(shp)
    if out_format is not None:
        out = np.asarray(_round(out, as_format(out_format)), dtype=_F)
    return out


@ieee_mode
def nf4_bits_per_parameter(n: int, blocksize: int = 64, double_quant: bool = True,
                           blocksize2: int = 256) -> float:
    """Storage bits per parameter of NF4 for ``n`` parameters, counting every array (codes packed).

    >>> round(nf4_bits_per_parameter(64 * 256 * 1000), 3)
    4.127
    """
    n = check_int(n, "n", lo=1)
    bs = _blocksize(blocksize)
    nb = -(-n // bs)
    bits = 8 * (-(-n // 2))                         # packed codes
    if check_bool(double_quant, "double_quant"):
        bits += 8 * nb + 32 * (-(-nb // check_int(blocksize2, "blocksize2", lo=1))) + 32
    else:
        bits += 32 * nb
    return bits / n


@ieee_mode
@dataclass(frozen=True)
class NF4Tensor:
    """A weight stored in NF4, as QLoRA keeps its frozen base: packed codes, constants, shape.

    >>> w = np.random.default_rng(0).standard_normal((64, 128)).astype(np.float32)
    >>> t = NF4Tensor.quantize(w)
    >>> t.dequantize().shape, t.nbytes, round(8 * t.nbytes / w.size, 3)
    ((64, 128), 4232, 4.133)
    """

    codes: np.ndarray
    absmax: np.ndarray | NF4Absmax
    shape: tuple[int, ...]
    blocksize: int = 64

    @classmethod
    def quantize(cls, x: Any, blocksize: int = 64, double_quant: bool = True, *,
                 absmax_search: str = "bitsandbytes") -> NF4Tensor:
        a = _as_f32(x, "x")
        codes, absmax = nf4_quantize(a, blocksize, double_quant, packed=True, absmax_search=absmax_search)
        return cls(codes, absmax, a.shape, _blocksize(blocksize))

    def dequantize(self, out_format: FormatLike | None = None) -> np.ndarray:
        return nf4_dequantize(self.codes, self.absmax, self.blocksize, shape=self.shape, out_format=out_format)

    @property
    def nbytes(self) -> int:
        """Bytes of every array held: packed codes plus the constants (double-quantized or float32)."""
        am = self.absmax.nbytes if isinstance(self.absmax, NF4Absmax) else int(np.asarray(self.absmax).nbytes)
        return int(self.codes.nbytes + am)
