"""Blackwell narrow-input and block-scaled MMA: ``kind::f8f6f4``, ``mxf8f6f4``, ``mxf4`` and ``mxf4nvf4``.

Blackwell's ``tcgen05.mma`` (B200, sm_100a) and the sm_120 ``mma.sync`` (RTX 50xx / RTX PRO Blackwell) take
fp8 (e4m3, e5m2), fp6 (e2m3, e3m2) and fp4 (e2m1) elements, A and B of different types, and, in the
block-scaled kinds, one scale factor per 32 (or 16) consecutive K-elements of each row of A and each column
of B, applied *inside* the instruction. The arithmetic below follows MMA-Sim (Microsoft's bit-accurate
simulator, ``mmasim.nv_ptx``) and is checked against it bit for bit (``tests/test_mma_blackwell.py``); this
module is an independent, vectorised NumPy implementation (MMA-Sim is used only in the tests).

Two data paths, one rounding per instruction, products summed from the addend ``c`` (the previous D):

* **fused sum of scaled products** (``f8f6f4``, ``mxf8f6f4``; 32 products per instruction): every nonzero
  product ``a_i*b_i*sa*sb`` is exact, with exponent ``E_i = e_a + e_b + e_sa + e_sb``
  (``e_x = max(floor(log2|x|), emin_x)``); zero products (and a zero ``c``) get ``e_zero`` (-133, or -21
  for fp16 output); ``E_max = max(E_i, e_c)``; every term, ``c`` included, is truncated (toward zero) to the
  grid ``2**(E_max - F)`` with ``F = 25``; the integer sum is rounded once: RZ to fp32 (RNE to fp16 for
  ``f8f6f4`` with fp16 output);
* **grouped fused sum** (``mxf4``, ``mxf4nvf4``; 64 products per instruction): the products of each group
  of 16 are summed exactly; group ``g`` becomes one term ``P_g * sa * sb`` whose exponent is the *scales'*
  exponent ``e_sa + e_sb`` (``e_zero = -139`` when the group's products are all zero or a scale is 0);
  then the same truncated fused sum with ``F = 35`` and RZ to fp32.

Specials: a NaN operand or scale (E8M0 ``0xFF``, UE4M3 ``0x7F``), ``inf*0`` or ``+inf`` with ``-inf`` gives
NaN, otherwise an infinite product or ``c`` gives that infinity; a sum beyond fp32's range gives ±inf
(also in RZ mode, as MMA-Sim). Zero results are +0.

Not modelled: the order a GEMM library splits K over instructions and CTAs (every output here is one chain
of instructions in increasing K order), ``.ws``/``cta_group::2`` variants, and sm_103 ``kind::mxf4`` with
``.block_scale.scale_vec::4X`` differences (none are in MMA-Sim).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from .._fpenv import ieee_mode
from .._interop import returns_input_kind
from .._names import norm_name, parse_name
from ..formats import Format, FormatLike, as_format, fp16, fp32
from ..rounding import _as_float_array, _first_non_value
from ..rounding import round as _fround
from ._convert import convert_c, convert_inputs
from ._unit import UnitBase
from .model import NO_EXP, exponents, fma_round, round_block
from .scaled import ScaledTensor

__all__ = [
    "BLOCK_KINDS",
    "BlockScaledModel",
    "ELEMENT_FORMATS",
    "SCALE_FORMATS",
    "block_scaled_model",
    "matmul_block_scaled",
    "model_for",
]

#: The ``kind::`` qualifiers modelled.
BLOCK_KINDS: tuple[str, ...] = ("f8f6f4", "mxf8f6f4", "mxf4", "mxf4nvf4")
#: Element formats of ``kind::f8f6f4`` / ``kind::mxf8f6f4`` (``mxf4*`` take fp4_e2m1 only).
ELEMENT_FORMATS: tuple[str, ...] = ("fp8_e4m3", "fp8_e5m2", "fp6_e2m3", "fp6_e3m2", "fp4_e2m1")
#: Scale-factor types: UE8M0 (a power of two, ``0xFF`` NaN) and UE4M3 (unsigned E4M3, ``0x7F`` NaN).
SCALE_FORMATS: tuple[str, ...] = ("ue8m0", "ue4m3")

_PTX = {"fp8_e4m3": "e4m3", "fp8_e5m2": "e5m2", "fp6_e2m3": "e2m3", "fp6_e3m2": "e3m2", "fp4_e2m1": "e2m1"}
_MMASIM = "MMA-Sim 2.1.1 (mmasim.nv_ptx, Microsoft; validated on hardware by its authors)"

# Devices: canonical name -> (architecture, instruction path).
_DEVICES = {"b200": ("Blackwell (sm_100a)", "tcgen05"), "rtx5090": ("RTX Blackwell (sm_120a)", "mma.sync")}
_DEVICE_ALIASES = {
    "b200": "b200", "b100": "b200", "gb200": "b200", "blackwell": "b200", "sm100": "b200", "sm100a": "b200",
    "rtx5090": "rtx5090", "rtx5080": "rtx5090", "rtxpro6000": "rtx5090", "rtxblackwell": "rtx5090",
    "sm120": "rtx5090", "sm120a": "rtx5090", "gb202": "rtx5090",
}


def _norm_device(device: Any) -> str:
    key = re.sub(r"[\s_\-.]+", "", norm_name(device, "device"))
    key = re.sub(r"^(nvidia|geforce)+", "", key)
    if key in _DEVICE_ALIASES:
        return _DEVICE_ALIASES[key]
    raise ValueError(f"unknown device {device!r} for block-scaled MMA; valid: {', '.join(_DEVICES)} "
                     f"(aliases {', '.join(sorted(k for k in _DEVICE_ALIASES if k not in _DEVICES))})")


def _elem(fmt: FormatLike, what: str, allowed: tuple[str, ...] = ELEMENT_FORMATS) -> Format:
    try:
        f: Format | None = as_format(fmt)
    except (ValueError, TypeError):
        f = None
    if f is None or f.name not in allowed:
        raise ValueError(f"unsupported {what} format {fmt!r}; valid: {', '.join(allowed)}")
    return f


@ieee_mode
@dataclass(frozen=True)
class BlockScaledModel:
    """One Blackwell narrow-input / block-scaled MMA data path (see the module docstring for the arithmetic).

    Build one with :func:`block_scaled_model`; evaluate it with :func:`matmul_block_scaled` or
    :func:`fpsim.matmul` (``model=``).

    Attributes
    ----------
    name : str
        E.g. ``"b200 mxf8f6f4 e4m3 x e2m1 (ue8m0/32) -> fp32"``.
    device, path : str
        ``"b200"`` / ``"tcgen05"`` or ``"rtx5090"`` / ``"mma.sync"`` (same numerics for these kinds).
    kind : {"f8f6f4", "mxf8f6f4", "mxf4", "mxf4nvf4"}
    a, b : Format
        Element formats of A and B (they may differ for ``f8f6f4`` and ``mxf8f6f4``).
    output : Format
        fp32, or fp16 (``f8f6f4`` only). C is rounded (RNE) to it first.
    block : int or None
        K-elements per scale factor (32 or 16); None for ``f8f6f4`` (no scales).
    scale : {"ue8m0", "ue4m3"} or None
    k : int
        Products per instruction (32; 64 for ``mxf4``/``mxf4nvf4``).
    F : int
        Fraction bits of the truncation grid below ``E_max`` (25; 35 for the grouped path).
    e_zero : int
        Exponent given to zero terms (-133 fp32 out, -21 fp16 out, -139 grouped).
    group : int or None
        Products summed exactly into one term before alignment (16 for ``mxf4``/``mxf4nvf4``).
    rounding : {"rz", "rne"}
        Rounding of each instruction's result (RZ to fp32; RNE to fp16).
    provenance, source, confidence : str

    Examples
    --------
    >>> m = block_scaled_model("b200", "mxf4nvf4")
    >>> (m.k, m.block, m.scale, m.group, m.F)
    (64, 16, 'ue4m3', 16, 35)
    """

    name: str
    device: str
    path: str
    kind: str
    a: Format
    b: Format
    output: Format = fp32
    block: int | None = None
    scale: str | None = None
    k: int = 32
    F: int = 25
    e_zero: int = -133
    group: int | None = None
    rounding: str = "rz"
    provenance: str = field(default="agrees with MMA-Sim", compare=False)
    source: str = field(default=_MMASIM, compare=False)
    confidence: str = field(default="", compare=False)

    @property
    def mb(self) -> int:
        """Fraction bits kept in each instruction's result (23 for fp32, 10 for fp16)."""
        return self.output.mbits

    @property
    def instruction(self) -> str:
        """The PTX instruction this model stands for (shape for the smallest tile)."""
        kq = f"kind::{self.kind}"
        ab = f"{_PTX[self.a.name]}.{_PTX[self.b.name]}"
        d = "f16" if self.output == fp16 else "f32"
        if self.path == "tcgen05":
            base = f"tcgen05.mma.cta_group::1.{kq}"
            if self.block is None:
                return f"{base} (m128nNk{self.k}, D {d}, A {ab.replace('.', ' B ')})"
            return f"{base}.block_scale.block{self.block} (m128nNk{self.k}, {ab}, scales {self.scale})"
        if self.block is None:
            return f"mma.sync.aligned.m16n8k{self.k}.row.col.{kq}.{d}.{ab}.{d}"
        return (f"mma.sync.aligned.m16n8k{self.k}.row.col.{kq}.block_scale.scale_vec::"
                f"{self.k // self.block}X.f32.{ab}.f32.{self.scale}")

    @property
    def _unit(self) -> BlockScaledUnit:
        """The matrix unit of block-scaled models (an executor of its own: scales inside each instruction)."""
        return _UNIT

    def with_(self, **changes: Any) -> BlockScaledModel:
        """A copy with some fields changed (``dataclasses.replace``)."""
        return replace(self, **changes)

    def describe(self) -> str:
        """Multi-line summary: arithmetic parameters, provenance and source."""
        sc = "no scales" if self.block is None else f"one {self.scale} scale per {self.block} K-elements"
        grp = f", groups of {self.group} summed exactly" if self.group else ""
        return "\n".join([
            f"{self.name}: {self.instruction}",
            f"  {self.k} products per instruction, {sc}{grp}",
            (f"  truncated fused sum: F={self.F} grid bits below E_max, e_zero={self.e_zero}, "
             f"result {self.rounding.upper()} to {self.output.name}"),
            f"  provenance: {self.provenance}; source: {self.source}",
        ])


@ieee_mode
def block_scaled_model(device: str = "b200", kind: str = "mxf8f6f4", a: FormatLike | None = None,
                       b: FormatLike | None = None, output: FormatLike = "fp32", *, block: int | None = None,
                       scale: str | None = None) -> BlockScaledModel:
    """The model of one Blackwell ``kind::f8f6f4`` / block-scaled MMA instruction.

    Parameters
    ----------
    device : str
        ``"b200"`` (``tcgen05.mma``; aliases b100, gb200, blackwell, sm100) or ``"rtx5090"`` (sm_120
        ``mma.sync``; aliases sm120, rtx5080, rtxpro6000, rtxblackwell). Same numerics for these kinds.
    kind : {"f8f6f4", "mxf8f6f4", "mxf4", "mxf4nvf4"}
    a, b : str or Format, optional
        Element formats of A and B (``a`` defaults to fp8_e4m3, or fp4_e2m1 for ``mxf4``/``mxf4nvf4``;
        ``b`` defaults to ``a``): fp8_e4m3, fp8_e5m2, fp6_e2m3, fp6_e3m2,
        fp4_e2m1 for ``f8f6f4``/``mxf8f6f4``; fp4_e2m1 only for ``mxf4``/``mxf4nvf4``.
    output : {"fp32", "fp16"}
        fp16 only for ``f8f6f4``.
    block : {32, 16}, optional
        K-elements per scale: 32 for ``mxf8f6f4`` and ``mxf4``; 16 (default) or 32 for ``mxf4nvf4``.
    scale : {"ue8m0", "ue4m3"}, optional
        ``ue8m0`` for the MX kinds; ``mxf4nvf4`` defaults to ``ue4m3`` with block 16 (NVFP4) and takes
        ``ue8m0`` with block 16 or 32.

    Raises
    ------
    ValueError
        For unknown names and for combinations the instructions do not have (listing the valid ones).

    Examples
    --------
    >>> m = block_scaled_model("b200", "mxf8f6f4", "e4m3", "fp4_e2m1")
    >>> m.name
    'b200 mxf8f6f4 e4m3 x e2m1 (ue8m0/32) -> fp32'
    >>> block_scaled_model("rtx5090", "f8f6f4", "fp6_e3m2", output="fp16").e_zero
    -21
    """
    dev = _norm_device(device)
    kd = parse_name(kind, BLOCK_KINDS, "block-scaled MMA kind")
    fp4 = ("fp4_e2m1",)
    allowed = fp4 if kd in ("mxf4", "mxf4nvf4") else ELEMENT_FORMATS
    if a is None:
        a = allowed[0]
    fa = _elem(a, f"{kd} A element", allowed)
    fb = _elem(a if b is None else b, f"{kd} B element", allowed)
    try:
        fo: Format | None = as_format(output)
    except (ValueError, TypeError):
        fo = None
    outs = ("fp32", "fp16") if kd == "f8f6f4" else ("fp32",)
    if fo is None or fo.name not in outs:
        raise ValueError(f"unsupported {kd} output format {output!r}; valid: {', '.join(outs)}")
    if block is not None and (isinstance(block, (bool, np.bool_)) or not isinstance(block, (int, np.integer))):
        raise TypeError(f"block must be an int, got {type(block).__name__}: {block!r}")
    sc = None if scale is None else parse_name(scale, SCALE_FORMATS, "scale format")
    if kd == "f8f6f4":
        if block is not None or sc is not None:
            raise ValueError("kind f8f6f4 takes no block scales (block and scale must be None); use "
                             "'mxf8f6f4' for UE8M0 scales per 32 elements")
        blk, sfmt = None, None
    elif kd in ("mxf8f6f4", "mxf4"):
        blk = 32 if block is None else int(block)
        sfmt = "ue8m0" if sc is None else sc
        if blk != 32 or sfmt != "ue8m0":
            raise ValueError(f"kind {kd} takes block=32 with scale='ue8m0', got block={block!r}, scale={scale!r}")
    else:  # mxf4nvf4
        blk = 16 if block is None else int(block)
        sfmt = sc if sc is not None else ("ue4m3" if blk == 16 else "ue8m0")
        if (blk, sfmt) not in ((16, "ue4m3"), (16, "ue8m0"), (32, "ue8m0")):
            raise ValueError(f"kind mxf4nvf4 takes (block, scale) in (16, 'ue4m3'), (16, 'ue8m0'), (32, 'ue8m0'); "
                             f"got ({block!r}, {scale!r})")
    arch, path = _DEVICES[dev]
    grouped = kd in ("mxf4", "mxf4nvf4")
    to16 = fo == fp16
    sdesc = "" if blk is None else f" ({sfmt}/{blk})"
    name = f"{dev} {kd} {_PTX[fa.name]} x {_PTX[fb.name]}{sdesc} -> {fo.name}"
    return BlockScaledModel(
        name=name, device=dev, path=path, kind=kd, a=fa, b=fb, output=fo, block=blk, scale=sfmt,
        k=64 if grouped else 32, F=35 if grouped else 25, e_zero=-139 if grouped else (-21 if to16 else -133),
        group=16 if grouped else None, rounding="rne" if to16 else "rz",
        confidence=(f"{arch}: bit-identical to MMA-Sim on random and special inputs (tests/test_mma_blackwell.py); "
                    "no published hardware rows checked"))


# ---------------------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------------------

def _exp32(x: np.ndarray, emin: int, e_zero: int) -> np.ndarray:
    """``max(floor(log2|x|), emin)`` as int32; ``e_zero`` for zero and non-finite values."""
    e = exponents(x, emin).astype(np.int32)
    return np.where(e == NO_EXP, np.int32(e_zero), e)


def _fdpa(val: np.ndarray, e: np.ndarray, c: np.ndarray, m: BlockScaledModel, has_specials: bool) -> np.ndarray:
    """One truncated fused sum: terms ``val`` (T, *S) with exponents ``e`` (T, *S), addend c (S)."""
    spec = None
    cfin = bool(np.isfinite(c).all())
    if has_specials or not cfin:
        with np.errstate(invalid="ignore"):
            vn, vp, vm = np.isnan(val).any(0), (val == np.inf).any(0), (val == -np.inf).any(0)
            cn, cp, cm = np.isnan(c) | vn, (c == np.inf) | vp, (c == -np.inf) | vm
        mask = cn | cp | cm
        if mask.any():
            spec = (mask, np.where(cn | (cp & cm), np.nan, np.where(cp, np.inf, -np.inf)))
        with np.errstate(invalid="ignore"):
            val = np.where(np.isfinite(val), val, 0.0)
        c = np.where(np.isfinite(c), c, 0.0)
    out = m.output
    ec = _exp32(c, out.emin, m.e_zero)
    emax = np.maximum(e.max(axis=0), ec)
    sh = (m.F - emax).astype(np.int32)
    with np.errstate(under="ignore"):
        q = np.trunc(np.ldexp(val, sh[None]))
    s = np.add.reduce(q, axis=0) + np.trunc(np.ldexp(c, sh))
    d = round_block(np.ldexp(s, -sh), m.mb, out.emin, out.emax, m.rounding == "rz")
    if spec is not None:
        d = np.where(spec[0], spec[1], d)
    return d


def _instruction(a: np.ndarray, b: np.ndarray, ea: np.ndarray, eb: np.ndarray, sa: np.ndarray, sb: np.ndarray,
                 esa: np.ndarray, esb: np.ndarray, c: np.ndarray, m: BlockScaledModel,
                 has_specials: bool) -> np.ndarray:
    """One instruction for a tile: a (k, Mt, 1), b (k, 1, Nt); scales per term block, shapes (nb, Mt, 1) and
    (nb, 1, Nt) with nb = k // (block or k); c (Mt, Nt)."""
    with np.errstate(invalid="ignore", over="ignore"):
        p = a * b  # exact: narrow significands, exponents well inside float64
    if m.group is None:
        rep = m.k // sa.shape[0]
        with np.errstate(invalid="ignore", over="ignore"):
            s = sa * sb  # (nb, Mt, Nt): exact products of scale values
            val = p * np.repeat(s, rep, axis=0)
        e = ea + eb + np.repeat(esa + esb, rep, axis=0)
        e = np.where(val == 0, np.int32(m.e_zero), e)
        return _fdpa(val, e, c, m, has_specials)
    g = m.group
    shp = p.shape[1:]
    pg = p.reshape((m.k // g, g) + shp)
    psum = np.add.reduce(pg, axis=1)  # exact: fp4 products are multiples of 1/4 below 36
    allzero = (pg == 0).all(axis=1)
    rep = (m.k // g) // sa.shape[0]
    with np.errstate(invalid="ignore", over="ignore"):
        s = np.repeat(sa * sb, rep, axis=0)
        val = psum * s
    e = np.repeat(esa + esb, rep, axis=0)
    e = np.where(allzero | (s == 0), np.int32(m.e_zero), e)
    return _fdpa(val, e, c, m, has_specials)


# ---------------------------------------------------------------------------------------------------------
# Scale factors
# ---------------------------------------------------------------------------------------------------------

_E8M0 = as_format("e8m0")
_E4M3 = as_format("fp8_e4m3")


def _scale_values(x: Any, sfmt: str, name: str) -> np.ndarray:
    """Scale factors as float64 values: float carriers of values of the scale type, or uint8 codes."""
    if isinstance(x, np.ndarray) and x.dtype == np.uint8:
        if sfmt == "ue8m0":
            return np.where(x == 0xFF, np.nan, np.ldexp(1.0, (x.astype(np.int32) - 127)))
        codes = x & 0x7F  # the sign bit is not part of UE4M3 (the hardware ignores it, as MMA-Sim)
        from ..bits import from_bits

        return np.asarray(from_bits(codes, _E4M3), dtype=np.float64)
    arr = np.asarray(_as_float_array(x, name)[0], dtype=np.float64)
    fin = arr[np.isfinite(arr)]
    if sfmt == "ue8m0":
        if fin.size:
            bad = _first_non_value(fin, _E8M0)
            if bad is not None or (fin <= 0).any():
                v = bad if bad is not None else float(fin[fin <= 0][0])
                raise ValueError(f"{name} holds {v!r}, not a UE8M0 value (a power of two in [2**-127, 2**127], "
                                 "or NaN); pass decode factors such as fpsim.scaling.mx_scales returns")
    else:
        if fin.size:
            bad = _first_non_value(fin, _E4M3)
            if bad is not None or (fin < 0).any():
                v = bad if bad is not None else float(fin[fin < 0][0])
                raise ValueError(f"{name} holds {v!r}, not a UE4M3 value (a non-negative fp8_e4m3 value, "
                                 "or NaN); pass block scales such as fpsim.scaling.nvfp4_quantize returns")
    if np.isinf(arr).any():
        raise ValueError(f"{name} holds inf, which neither UE8M0 nor UE4M3 can hold")
    return arr


def _valid_scales(x: np.ndarray, sfmt: str) -> bool:
    try:
        _scale_values(x, sfmt, "scale")
    except ValueError:
        return False
    return True


def _scales_for(x: Any, sfmt: str, shape: tuple[int, int], name: str, layout: str) -> np.ndarray:
    v = _scale_values(x, sfmt, name)
    try:
        return np.ascontiguousarray(np.broadcast_to(v, shape))
    except ValueError:
        raise ValueError(f"{name} has shape {v.shape}; expected {layout} = {shape}") from None


# ---------------------------------------------------------------------------------------------------------
# GEMM driver
# ---------------------------------------------------------------------------------------------------------

_TILE_ELEMS = 1 << 18


def _values(x: Any, fmt: Format, input_rounding: str | None, name: str) -> np.ndarray:
    raw = np.asarray(_as_float_array(x, name)[0], dtype=np.float64)
    # Values already in the format (inf and NaN included) enter as they are; others are converted.
    arr = raw if _first_non_value(raw, fmt) is None else convert_inputs(raw, fmt, input_rounding, name)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be 2-D for a block-scaled GEMM, got shape {arr.shape}")
    return arr


def _st_parts(t: ScaledTensor, k_axis: int, name: str) -> tuple[np.ndarray, np.ndarray, int]:
    """(data, decode factors along K as (M, K/g) or (K/g, N), g) of a 2-D ScaledTensor; factors constant
    along the other axis."""
    if t.ndim != 2:
        raise ValueError(f"ScaledTensor {name} must be 2-D for a block-scaled GEMM, got shape {t.shape}")
    other = 1 - (k_axis % 2)
    if t.block[other] != 1 and t.block[other] != t.shape[other]:
        what = "row of A" if k_axis == 1 else "column of B"
        raise ValueError(f"ScaledTensor {name} has blocks {t.block}: the hardware scales each {what} "
                         "separately; the block along the other axis must be 1")
    g = t.block[k_axis % 2]
    s = t.scale.astype(np.float64)
    if t.block[other] != 1:
        s = np.repeat(s, t.shape[other], axis=other)
    return np.asarray(t.data, dtype=np.float64), s, g


@ieee_mode
def model_for(a: ScaledTensor, b: ScaledTensor, *, device: str = "b200",
              output: FormatLike = "fp32") -> BlockScaledModel:
    """The block-scaled MMA that takes two quantized tensors as they are (duck-typed on :class:`ScaledTensor`).

    MX tensors (E8M0 factors per 32 along K, from ``fpsim.scaling.quantize_scaled(..., scaling="mx")``)
    map to ``mxf4`` when both are fp4_e2m1 and to ``mxf8f6f4`` otherwise; NVFP4 tensors (fp4 with E4M3 factors
    per 16) to ``mxf4nvf4`` block 16 UE4M3; a per-tensor (or per-row / per-column) factor to ``f8f6f4`` with
    the factors applied in the epilogue.

    Examples
    --------
    >>> import numpy as np, fpsim.scaling as S
    >>> qa = S.quantize_scaled(np.ones((2, 64)), "fp4_e2m1", scaling="nvfp4")
    >>> qb = S.quantize_scaled(np.ones((64, 3)), "fp4_e2m1", scaling="nvfp4", axis=0)
    >>> model_for(qa, qb).name
    'b200 mxf4nvf4 e2m1 x e2m1 (ue4m3/16) -> fp32'
    """
    for nm, t in (("a", a), ("b", b)):
        if not isinstance(t, ScaledTensor):
            raise TypeError(f"{nm} must be a ScaledTensor (fpsim.scaling.quantize_scaled), got {type(t).__name__}")
    _, fa, ga = _st_parts(a, 1, "A")
    _, fb, gb = _st_parts(b, 0, "B")
    kk = a.shape[1]
    fp4 = as_format("fp4_e2m1")
    both4 = a.format == fp4 and b.format == fp4
    glob = a.global_scale != 1 or b.global_scale != 1
    pow2 = not glob and _valid_scales(fa, "ue8m0") and _valid_scales(fb, "ue8m0")
    if ga == gb == 16 and both4:
        return block_scaled_model(device, "mxf4nvf4", fp4, fp4, output, block=16,
                                  scale="ue8m0" if pow2 else "ue4m3")
    if ga == gb == 32 and pow2:
        return block_scaled_model(device, "mxf4" if both4 else "mxf8f6f4", a.format, b.format, output)
    if ga == kk and gb == b.shape[0]:
        return block_scaled_model(device, "f8f6f4", a.format, b.format, output)
    if ga != gb:
        raise ValueError(f"A is scaled per {ga} and B per {gb} K-elements; a block-scaled MMA needs one block size")
    raise ValueError(f"no block-scaled MMA takes blocks of {ga} along K (valid: 16, 32, or one factor for all of K)")


@ieee_mode
@returns_input_kind(dtype_option=False)
def matmul_block_scaled(A: Any, B: Any, C: Any = None, *, scale_a: Any = None, scale_b: Any = None,
                        model: BlockScaledModel | None = None, device: str = "b200",
                        input_rounding: str | None = None) -> Any:
    """``D = C + (A * scale_a) @ (B * scale_b)`` as a chain of Blackwell block-scaled MMA instructions along K.

    Parameters
    ----------
    A : array_like (M, K) or ScaledTensor
    B : array_like (K, N) or ScaledTensor
        Values of the model's element formats (others are converted like :func:`fpsim.matmul` does: RNE,
        saturating; ``input_rounding="exact"`` refuses them). :class:`ScaledTensor` operands (from
        :func:`fpsim.scaling.quantize_scaled` with ``scaling="mx"`` or ``"nvfp4"``; B quantized along
        ``axis=0``) carry their scales and pick the model (:func:`model_for`) when `model` is None.
    C : array_like, broadcastable to (M, N), optional
        Rounded (RNE) to the output format; the first instruction's addend. Default 0.
    scale_a : array_like (M, K/block)
        Decode factors of A: one per ``block`` consecutive K-elements of each row (float values of the
        scale type, e.g. ``mx_scales``' powers of two, or ``uint8`` codes: E8M0 ``0xFF`` / E4M3 ``0x7F``
        is NaN). Required for the block-scaled kinds; must be None for ``f8f6f4``.
    scale_b : array_like (K/block, N)
        The same for B: one per ``block`` K-elements of each column.
    model : BlockScaledModel, optional
        From :func:`block_scaled_model`; required for plain arrays.
    device : str
        Device used by :func:`model_for` when `model` is None and A, B are ScaledTensors.
    input_rounding : {None, "rne", "rtz", "exact"}

    Returns
    -------
    ndarray (M, N)
        float32 when A and B are float32, else float64. K must be a multiple of ``block``; it is padded with
        zero products to whole instructions (which changes nothing).

    Notes
    -----
    ScaledTensor operands: the block factors must be values of the model's scale type; a per-tensor
    ``global_scale`` (NVFP4's fp32 tensor scale) is applied after the MMA chain, as cuBLAS' ``alpha``:
    ``D = RN_fp32(RN_fp32(g_a * g_b) * acc + C)`` with ``acc`` the chain started from 0. For ``f8f6f4`` the
    (per-tensor, per-row, per-column) factors are applied the same way. This epilogue is an assumption about
    cuBLAS' ``alpha`` (no MMA-Sim instruction and no hardware data cover it; its test re-applies the same
    formula to MMA-Sim's chain): only the block-scaled chain itself is checked against MMA-Sim.

    Examples
    --------
    >>> import numpy as np
    >>> m = block_scaled_model("b200", "mxf8f6f4", "fp8_e4m3")
    >>> A = np.ones((1, 32)); B = np.ones((32, 1))
    >>> float(matmul_block_scaled(A, B, scale_a=[[2.0]], scale_b=[[0.25]], model=m)[0, 0])
    16.0
    """
    scaled = isinstance(A, ScaledTensor) or isinstance(B, ScaledTensor)
    epi_a = epi_b = None
    ga = gb = np.float32(1.0)
    if scaled:
        if scale_a is not None or scale_b is not None:
            raise ValueError("ScaledTensor operands carry their scales: do not pass scale_a/scale_b as well")
        if input_rounding not in (None, "exact"):
            raise ValueError(f"ScaledTensor data are already values of their formats; input_rounding="
                             f"{input_rounding!r} does not apply (leave it None)")
        if not (isinstance(A, ScaledTensor) and isinstance(B, ScaledTensor)):
            raise TypeError("pass both A and B as ScaledTensor, or both as arrays with scale_a/scale_b")
        m = model_for(A, B, device=device) if model is None else model
        a32 = A.data.dtype == np.float32 and B.data.dtype == np.float32
        a_data, fa, _ = _st_parts(A, 1, "A")
        b_data, fb, _ = _st_parts(B, 0, "B")
        ga, gb = A.global_scale, B.global_scale
        if m.block is None:
            if fa.shape[1] != 1 or fb.shape[0] != 1:
                raise ValueError(f"{m.kind} takes no block scales: A and B must have one factor along all of K")
            epi_a, epi_b = fa.astype(np.float32).astype(np.float64), fb.astype(np.float32).astype(np.float64)
            sa_in = sb_in = None
        else:
            sa_in, sb_in = fa, fb
        A_in, B_in = a_data, b_data
        rounding: str | None = "exact"
    else:
        if model is None:
            raise TypeError("model is required for plain arrays: build one with block_scaled_model(...)")
        m = model
        A_in, B_in, sa_in, sb_in, rounding = A, B, scale_a, scale_b, input_rounding
        a32 = (_as_float_array(A, "A")[0].dtype == np.float32 and _as_float_array(B, "B")[0].dtype == np.float32)
    if not isinstance(m, BlockScaledModel):
        raise TypeError(f"model must be a BlockScaledModel (block_scaled_model(...)), got {type(m).__name__}")
    a = _values(A_in, m.a, rounding, "A")
    b = _values(B_in, m.b, rounding, "B")
    mm, kk = a.shape
    if b.shape[0] != kk:
        raise ValueError(f"A and B disagree on K: A has shape {a.shape}, B has shape {b.shape}")
    nn = b.shape[1]
    cv = convert_c(C, m.output, (mm, nn))
    if m.block is None:
        if sa_in is not None or sb_in is not None:
            raise ValueError(f"kind {m.kind} takes no block scales: scale_a and scale_b must be None")
        nb = max(1, -(-kk // m.k))
        sa = np.ones((mm, nb))
        sb = np.ones((nb, nn))
        ssym = "ue8m0"
    else:
        if sa_in is None or sb_in is None:
            raise ValueError(f"kind {m.kind} needs scale_a (M, K/{m.block}) and scale_b (K/{m.block}, N)")
        if kk % m.block:
            raise ValueError(f"K = {kk} is not a multiple of the scale block {m.block}")
        nb = kk // m.block
        sa = _scales_for(sa_in, m.scale or "ue8m0", (mm, nb), "scale_a", f"(M, K/{m.block})")
        sb = _scales_for(sb_in, m.scale or "ue8m0", (nb, nn), "scale_b", f"(K/{m.block}, N)")
        ssym = m.scale or "ue8m0"
    epilogue = epi_a is not None or ga != 1 or gb != 1
    res = np.empty((mm, nn))
    if mm and nn:
        res = _gemm(a, b, sa, sb, ssym, np.zeros((mm, nn)) if epilogue else cv, m)
    if epilogue and mm and nn:
        with np.errstate(over="ignore", invalid="ignore"):
            g = np.float64(np.float32(np.float32(ga) * np.float32(gb)))
            f = np.full((mm, nn), g)
            if epi_a is not None and epi_b is not None:
                f = np.asarray(_fround(epi_a * epi_b * g, fp32, "rne"), dtype=np.float64)
            res = fma_round(f * res, cv, fp32)
    if a32:
        res = res.astype(np.float32)
    return res


def _from_matmul(A: Any, B: Any, C: Any, model: Any, promote_every: Any, scales: Any,
                 input_rounding: str | None) -> Any:
    """:func:`fpsim.matmul` with a :class:`BlockScaledModel`: ``scales=(scale_a, scale_b)`` are the block scales."""
    if promote_every is not None:
        raise ValueError("promote_every does not apply to a block-scaled MMA model: its scales are applied inside "
                         "each instruction (leave promote_every None)")
    sa: Any = None
    sb: Any = None
    if scales is not None:
        if not (isinstance(scales, (tuple, list)) and len(scales) == 2):
            raise TypeError("scales must be a pair (scale_a, scale_b)")
        sa, sb = scales
    return matmul_block_scaled(A, B, C, scale_a=sa, scale_b=sb, model=model, input_rounding=input_rounding)


def _gemm(a: np.ndarray, b: np.ndarray, sa: np.ndarray, sb: np.ndarray, sfmt: str, c: np.ndarray,
          m: BlockScaledModel) -> np.ndarray:
    mm, kk = a.shape
    nn = b.shape[1]
    if kk == 0:
        return c + 0.0
    kb = m.block if m.block is not None else m.k  # K-elements per scale column
    # Pad K to whole instructions (zero products; their scale columns are 1).
    kp = -(-kk // m.k) * m.k
    at = np.zeros((kp, mm))
    at[:kk] = a.T
    bk = np.zeros((kp, nn))
    bk[:kk] = b
    nbp = kp // kb
    sat = np.ones((nbp, mm))
    sat[: sa.shape[1]] = sa.T
    sbk = np.ones((nbp, nn))
    sbk[: sb.shape[0]] = sb
    has_specials = not (np.isfinite(at).all() and np.isfinite(bk).all() and np.isfinite(sat).all()
                        and np.isfinite(sbk).all() and np.isfinite(c).all())
    ea = _exp32(at, m.a.emin, m.e_zero)
    eb = _exp32(bk, m.b.emin, m.e_zero)
    semin = -127 if sfmt == "ue8m0" else _E4M3.emin
    esa = _exp32(sat, semin, 0)
    esb = _exp32(sbk, semin, 0)
    per = max(1, _TILE_ELEMS // m.k)
    nt = min(nn, max(1, int(math.sqrt(per))))
    mt = min(mm, max(1, per // nt))
    nt = min(nn, max(1, per // mt))
    spi = m.k // kb  # scale columns per instruction
    out = np.empty((mm, nn))
    for i0 in range(0, mm, mt):
        i1 = min(mm, i0 + mt)
        for j0 in range(0, nn, nt):
            j1 = min(nn, j0 + nt)
            d = c[i0:i1, j0:j1]
            for t, k0 in enumerate(range(0, kp, m.k)):
                ks, ss = slice(k0, k0 + m.k), slice(t * spi, (t + 1) * spi)
                d = _instruction(at[ks, i0:i1, None], bk[ks, None, j0:j1], ea[ks, i0:i1, None], eb[ks, None, j0:j1],
                                 sat[ss, i0:i1, None], sbk[ss, None, j0:j1], esa[ss, i0:i1, None],
                                 esb[ss, None, j0:j1], d, m, has_specials)
            out[i0:i1, j0:j1] = d
    return out


class BlockScaledUnit(UnitBase):
    """The Blackwell block-scaled family: its scales act inside each instruction, so it runs matmul itself.

    :func:`fpsim.matmul` hands it the whole call (``scales=(scale_a, scale_b)`` are its block scales;
    ``promote_every`` does not apply).
    """

    own_matmul = True

    def matmul(self, model: Any, A: Any, B: Any, C: Any, promote_every: int | None, scales: Any,
               input_rounding: str | None) -> Any:
        return _from_matmul(A, B, C, model, promote_every, scales, input_rounding)


_UNIT = BlockScaledUnit()
