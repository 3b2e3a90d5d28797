"""Block formats with shared scales: MX (OCP Microscaling, E8M0 scales) and NVFP4 (FP8 E4M3 block scales and a
float32 global scale). Public names are re-exported by :mod:`fpsim.scaling`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._fpenv import ieee_mode
from .._interop import returns_input_kind
from .._names import parse_name
from ..formats import FormatLike, as_format
from ..rounding import Rounding, RoundingLike, as_rounding
from ..rounding import round as _round
from ._common import BlockLike, _F32, _FLT_MAX, _apply, _as_float, _block_shape, _check_int, _check_real, _norm_axis
from ._rules import ScaleRule, _as_scale_format, _divisors, _mx_rule, _rule_scales
from ._tensor import _presaturate, amax


# --------------------------------------------------------------------------------------------------
# MX block formats

_MX_ELEMS = ("fp8_e4m3", "fp8_e5m2", "fp6_e2m3", "fp6_e3m2", "fp4_e2m1")
_SCALE_RULES = ("floor", "ceil")


def _mx_prepare(x: Any, block: Any, axis: Any) -> tuple[np.ndarray, int, int]:
    a = _as_float(x)
    if a.ndim == 0:
        raise ValueError("MX quantisation needs an array with at least one dimension")
    b = _check_int("block", block, 1)
    ax = _norm_axis(axis, a.ndim)
    if a.shape[ax] % b:
        raise ValueError(
            f"block {b} does not divide the length {a.shape[ax]} of axis {ax} (shape {a.shape}); pad the array"
        )
    return a, b, ax


def _block_absmax(blocks: np.ndarray) -> np.ndarray:
    """max|x| over the last axis (NaN propagates). ``maximum.reduceat`` over the flat array: about twice
    as fast as NumPy's reduction over a short last axis."""
    if blocks.size == 0:
        return np.zeros(blocks.shape[:-1], dtype=blocks.dtype)
    m = np.abs(blocks).reshape(-1)
    b = blocks.shape[-1]
    out: np.ndarray = np.maximum.reduceat(m, np.arange(0, m.size, b)).reshape(blocks.shape[:-1])
    return out


def _resolve_rule(scale_rounding: Any, scale_rule: Any) -> ScaleRule:
    """One rule from the two spellings: ``scale_rounding`` (the original "floor"/"ceil") or ``scale_rule``."""
    if scale_rounding is not None:
        scale_rounding = parse_name(scale_rounding, _SCALE_RULES, "scale_rounding")
        r = _mx_rule(scale_rounding)
        if scale_rule is not None and _mx_rule(scale_rule) != r:
            raise ValueError(f"scale_rounding={scale_rounding!r} and scale_rule={scale_rule!r} disagree; "
                             "give only scale_rule")
        return r
    return _mx_rule("ocp" if scale_rule is None else scale_rule)


@ieee_mode
@returns_input_kind(dtype_option=False)
def mx_scales(block_amax: Any, elem_fmt: FormatLike, *, scale_rounding: str | None = None,
              scale_rule: str | ScaleRule | None = None, scale_format: FormatLike = "e8m0") -> np.ndarray:
    """Block decode scales (E8M0 powers of two by default, as float32) for block amaxes.

    ``scale_rule`` names one of :data:`~fpsim.scaling.SCALE_RULES` (docs/scale-rules.md); the default is
    ``"ocp"``. ``scale_rounding`` is the older spelling of the two original rules: ``"floor"`` (= ``"ocp"``)
    and ``"ceil"`` (= ``"te"``).

    ``"floor"`` (OCP MX v1.0): ``X = 2**(floor(log2 amax) - emax_elem)``; the block's largest values may
    exceed ``elem.max`` after scaling and saturate. ``"ceil"`` (TransformerEngine MXFP8):
    ``X = 2**ceil(log2(float32(amax * float32(1/elem.max))))``, so nothing saturates. Exponents are
    clamped to E8M0's range [−127, 127]; an all-zero block gets 2**−127. A block whose amax is NaN
    gets a NaN scale (OCP: the whole block decodes to NaN); an inf amax gives NaN under ``"floor"``
    and 2**127 under ``"ceil"`` (TE's ``float_to_e8m0``).

    ``scale_format`` (default ``"e8m0"``) is the format the scales are rounded onto, in the rule's direction
    and clamped to the format's positive range: ``"fp8_e4m3"`` gives UE4M3 scales, and ``"ue5m3"`` works once
    that format is registered.

    >>> mx_scales([500.0, 448.0, 1.0, 0.003], "fp8_e4m3", scale_rounding="ceil").tolist()
    [2.0, 1.0, 0.00390625, 7.62939453125e-06]
    >>> mx_scales([500.0, 448.0], "fp8_e4m3", scale_rounding="floor").tolist()
    [1.0, 1.0]
    >>> mx_scales([500.0, 448.0], "fp8_e4m3", scale_rule="neuron-emax").tolist()
    [2.0, 2.0]
    """
    f = as_format(elem_fmt)
    r = _resolve_rule(scale_rounding, scale_rule)
    sf = _as_scale_format(scale_format)
    a = np.asarray(_as_float(block_amax, "block_amax"), dtype=np.float64)
    res: np.ndarray = _rule_scales(a, f, r, sf).astype(_F32)
    return res


@ieee_mode
@returns_input_kind(dtype_option=False)
def mx_quantize(
    x: Any,
    elem_fmt: FormatLike,
    *,
    block: int = 32,
    axis: int = -1,
    scale_rounding: str | None = None,
    rounding: RoundingLike = "rne",
    rng: np.random.Generator | None = None,
    scale_rule: str | ScaleRule | None = None,
    scale_format: FormatLike = "e8m0",
) -> tuple[Any, np.ndarray]:
    """MX quantisation: every ``block`` consecutive values along ``axis`` share an E8M0 scale.

    Parameters
    ----------
    x : array_like
        Values; ``x.shape[axis]`` must be a multiple of ``block``.
    elem_fmt : Format or str
        Element format: fp8_e4m3, fp8_e5m2, fp6_e2m3, fp6_e3m2 or fp4_e2m1 (others are accepted too).
    block : int
        Block length (32 in OCP MX).
    axis : int
        Axis along which blocks run (TE quantises rowwise and columnwise copies separately).
    scale_rounding : {"floor", "ceil"}
        ``"floor"``: OCP MX v1.0 (elements saturate when the block amax's mantissa exceeds the element
        max's); ``"ceil"``: TransformerEngine MXFP8 (see :func:`mx_scales`), including its kernel's
        quirk for blocks that get the smallest scale 2**−127 (amax ≤ 2**−127 · elem.max): their
        elements are rounded unscaled (TE's ``exp2f_rcp`` returns 1 there), so they mostly become 0.
        The older spelling of ``scale_rule``; give one of the two.
    rounding : str
        Element rounding (``"rne"``; ``"sr"`` needs ``rng=``). Elements always saturate.
    scale_rule : str or ScaleRule, optional
        Any MX rule of :data:`~fpsim.scaling.SCALE_RULES` (default ``"ocp"``), its smallest-scale divisor
        included (torchao's FLOOR/CEIL/EVEN divide by 2**-126 there, TE and torchao's RCEIL not at all).
    scale_format : Format or str
        The scales' format (default ``"e8m0"``); see :func:`mx_scales`.

    Returns
    -------
    (elements, scales)
        ``elements``: values of ``elem_fmt`` (float32 for float32 input), shape of ``x``;
        ``scales``: float32 powers of two (E8M0 values), shape of ``x`` with ``axis`` divided by
        ``block``. ``x ≈ elements * scales`` repeated along ``axis`` (:func:`mx_dequantize`).

    Examples
    --------
    >>> import numpy as np
    >>> x = np.float32([500, 1, -3, 0.01] + [0] * 28)
    >>> e, s = mx_quantize(x, "fp8_e4m3", scale_rounding="floor")
    >>> s.tolist(), e[:4].tolist()
    ([1.0], [448.0, 1.0, -3.0, 0.009765625])
    >>> e, s = mx_quantize(x, "fp8_e4m3", scale_rounding="ceil")
    >>> s.tolist(), e[:4].tolist()
    ([2.0], [256.0, 0.5, -1.5, 0.005859375])
    """
    f = as_format(elem_fmt)
    rule = _resolve_rule(scale_rounding, scale_rule)
    sf = _as_scale_format(scale_format)
    mode = as_rounding(rounding)
    a, b, ax = _mx_prepare(x, block, axis)
    moved = np.moveaxis(a, ax, -1)
    shp = moved.shape
    blocks = moved.reshape(shp[:-1] + (shp[-1] // b, b))  # (..., nblocks, block)
    bam = _block_absmax(blocks)  # (..., nblocks)
    scales = _rule_scales(np.asarray(bam, dtype=np.float64), f, rule, sf).astype(_F32)  # (..., nblocks)
    # x / X is exact for power-of-two X unless the quotient drops below the carrier's normal range,
    # which is far below half the element format's smallest subnormal: then it rounds to 0 anyway in
    # the nearest / toward-zero modes. Other modes divide in float64.
    # (a scale format with mantissa bits makes the quotient inexact: float64 then, rounded once more below)
    pow2 = sf.mbits == 0
    work = (a.dtype if (a.dtype == np.float32 and pow2 and mode in (Rounding.RNE, Rounding.RNA, Rounding.RTZ))
            else np.float64)
    # TE multiplies by exp2f_rcp(biased exponent), which is 1 (not 2**127) for the smallest scale; torchao's
    # FLOOR/CEIL/EVEN clamp that divisor to 2**-126 (its comment: subnormal handling in Triton)
    div = _divisors(scales, rule, sf)
    with np.errstate(invalid="ignore", over="ignore"):
        scaled = (blocks.astype(work, copy=False) / div[..., None].astype(work)).astype(work, copy=False)
    _presaturate(scaled, f)
    el = np.asarray(_round(scaled, f, mode, overflow="saturate", rng=rng))
    bad = np.isnan(scales)
    if bad.any():
        el = np.where(bad[..., None], np.nan, el)
    el = np.moveaxis(el.reshape(shp).astype(a.dtype, copy=False), -1, ax)
    return el, np.moveaxis(scales, -1, ax)


@ieee_mode
@returns_input_kind(dtype_option=False)
def mx_dequantize(q: Any, scales: Any, *, block: int = 32, axis: int = -1) -> Any:
    """``q * scale`` with each scale repeated over its ``block`` elements along ``axis``.

    The exact product is rounded once to ``q``'s dtype (in float64, or in float32 when both ``q`` and the
    scales are float32: the same bits).

    >>> import numpy as np
    >>> mx_dequantize(np.float32([256, 0.5, -1.5, 0]), np.float32([2.0]), block=4).tolist()
    [512.0, 1.0, -3.0, 0.0]
    """
    a, b, ax = _mx_prepare(q, block, axis)
    s = np.asarray(_as_float(scales, "scales"), dtype=np.float64)
    moved = np.moveaxis(a, ax, -1)
    shp = moved.shape
    s_moved: np.ndarray = np.moveaxis(s, ax, -1) if s.ndim == a.ndim else s
    expect = shp[:-1] + (shp[-1] // b,)
    if s_moved.shape != expect:
        raise ValueError(f"scales have shape {s.shape}; q of shape {a.shape} with block {b} on axis {ax} "
                         f"needs {np.moveaxis(np.empty(expect), -1, ax).shape}")
    work: Any = np.float64
    if a.dtype == np.float32:
        with np.errstate(over="ignore", invalid="ignore"):
            s32 = s_moved.astype(_F32)
            if np.array_equal(s32, s_moved, equal_nan=True):
                # float32 q and float32 scales: their float64 product is exact (24 + 24 bits, no over- or
                # underflow), so one float32 multiply rounds the same product once, to the same value
                work, s_moved = _F32, s32
    blocks = moved.reshape(expect + (b,)).astype(work, copy=False)
    with np.errstate(over="ignore", invalid="ignore"):
        out = (blocks * s_moved[..., None]).reshape(shp).astype(a.dtype, copy=False)
    return np.moveaxis(out, -1, ax)


# --------------------------------------------------------------------------------------------------
# NVFP4


def _nvfp4_block(shape: tuple[int, ...], block: Any, axis: Any) -> tuple[int, ...]:
    """Full per-axis block shape: an int runs along ``axis``; a tuple tiles the trailing axes."""
    if len(shape) == 0:
        raise ValueError("NVFP4 quantisation needs an array with at least one dimension")
    if isinstance(block, (tuple, list)):
        return _block_shape(shape, block)
    b = _check_int("block", block, 1)
    ax = _norm_axis(axis, len(shape))
    full = [1] * len(shape)
    full[ax] = b
    return _block_shape(shape, tuple(full))


@ieee_mode
@returns_input_kind(dtype_option=False)
def nvfp4_quantize(
    x: Any,
    *,
    block: BlockLike = 16,
    axis: int = -1,
    global_amax: float | None = None,
    rounding: RoundingLike = "rne",
    rng: np.random.Generator | None = None,
    four_over_six: bool = False,
) -> tuple[Any, np.ndarray, np.float32]:
    """NVFP4: fp4_e2m1 elements in blocks of 16, an fp8_e4m3 scale per block, one fp32 scale per tensor.

    Two-level scaling following TransformerEngine's NVFP4 reference quantiser
    (``NVFP4QuantizerRef``), in float32:

    * tensor: ``s_enc = min((448 * 6) / amax, float32 max)``, 1 if that is 0 (amax inf);
      ``s_dec = 1 / s_enc`` (returned as ``global_scale``);
    * block: ``d = e4m3(clamp(block_amax * (s_enc * float32(1/6)), ±448))`` (the stored block scale);
    * elements: ``e2m1(clamp(x * min(1 / (d * s_dec), float32 max), ±6))``, round to nearest even.

    Decode: ``x ≈ q * d * s_dec`` (:func:`nvfp4_dequantize`). ``block=16`` runs along ``axis``;
    ``block=(16, 16)`` tiles the two trailing axes (TE's 2-D weight quantisation). ``rounding="sr"``
    (with ``rng=``) rounds elements stochastically, as NVFP4 recipes do for gradients. Not modelled
    here: the random Hadamard transform (the trainer's ``nvfp4`` policy applies it before quantising).

    ``four_over_six=True``: "Four over Six" (Cook et al., arXiv 2512.02010; rule as in their reference
    code, mit-han-lab/fouroversix): the tensor scale uses 256 in place of E4M3's 448
    (``s_enc = 256 * 6 / amax``), and each block is quantised twice, with its amax scaled to 6 (the
    rule above) and to 4 (``d = e4m3(block_amax * s_enc / 4)``, at most 384: no saturation); the block
    keeps the candidate whose dequantised values have the lower squared error (ties keep 6). With
    ``rounding="sr"`` both candidates draw their own random numbers.

    NaN is confined to its block, as in MX: the tensor amax skips NaN (an ``fmaxf`` reduction, as
    TransformerEngine's amax kernel computes it), so one NaN does not poison the per-tensor scale;
    the NaN's block gets a NaN block scale (E4M3 has NaN) and all its elements decode to NaN; every
    other block is quantised as if the NaN were absent. (TE's Python reference takes ``torch.amax``,
    which propagates NaN into the global scale and so into every block, and then maps NaN elements
    to 0: the whole tensor is lost silently. See docs/scaling.md.) ±inf saturates: an infinite amax
    gives the tensor scale 1 (TE's rule) and inf elements become ±6.

    Returns
    -------
    (elements, block_scales, global_scale)
        fp4 values (x's shape), fp8_e4m3 values (float32, one per block), float32 decode scale.

    Examples
    --------
    >>> import numpy as np
    >>> x = np.float32(np.linspace(-3, 3, 16))
    >>> q, d, g = nvfp4_quantize(x)
    >>> float(d[0]), float(g)
    (448.0, 0.0011160714784637094)
    >>> float(np.abs(nvfp4_dequantize(q, d, g) - x).max()) <= 0.5   # half the top fp4 step, unscaled
    True
    """
    fp4 = as_format("fp4_e2m1")
    fp8 = as_format("fp8_e4m3")
    a = _as_float(x)
    full = _nvfp4_block(a.shape, block, axis)
    with np.errstate(over="ignore"):  # float64 values beyond float32's range become ±inf (NVFP4 works in fp32)
        a32 = a.astype(_F32, copy=False)  # read only below: no copy of a float32 input
    if global_amax is None:
        # NaN-skipping, like an fmaxf reduction (TE's amax kernel): a NaN stays confined to its block.
        gam = _F32(np.fmax.reduce(np.abs(a32), axis=None)) if a32.size else _F32(0.0)
    else:
        gam = _F32(_check_real("global_amax", global_amax, 0.0))
    if not isinstance(four_over_six, (bool, np.bool_)):
        raise TypeError(f"four_over_six must be a bool, got {type(four_over_six).__name__}: {four_over_six!r}")
    # 4/6 lowers the tensor scale's target from 448 to 256 so that a block scaled to 4 (its E4M3 scale
    # 1.5 times larger) still fits E4M3: 256 * 1.5 = 384 <= 448.
    top = _F32(256.0) if four_over_six else _F32(fp8.max)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        s_enc = _F32(min(_F32(_F32(top * fp4.max) / gam), _FLT_MAX))
        if s_enc == 0:
            s_enc = _F32(1.0)
        s_dec = _F32(_F32(1.0) / s_enc)
        bam = np.asarray(amax(a32, block=full), dtype=_F32)
    el, d = _nvfp4_candidate(a32, bam, s_enc, s_dec, fp4.max, full, rounding, rng)
    if four_over_six:
        el4, d4 = _nvfp4_candidate(a32, bam, s_enc, s_dec, 4.0, full, rounding, rng)
        with np.errstate(over="ignore", invalid="ignore"):
            e6 = _block_sq_err(a32, el, d, s_dec, full)
            e4 = _block_sq_err(a32, el4, d4, s_dec, full)
        pick4 = e4 < e6                                     # NaN errors (NaN blocks) keep the rule of 6
        d = np.where(pick4, d4, d).astype(_F32)
        el = np.where(_expand(pick4, full, a32.shape), el4, el)
    return el.astype(a.dtype, copy=False), d, s_dec


def _expand(per_block: np.ndarray, full: tuple[int, ...], shape: tuple[int, ...]) -> np.ndarray:
    """A per-block array repeated over each block's elements (``full`` the per-axis block shape)."""
    out = per_block
    for ax, b in enumerate(full):
        if b > 1:
            out = np.repeat(out, b, axis=ax)
    return np.broadcast_to(out, shape)


def _nvfp4_candidate(a32: np.ndarray, bam: np.ndarray, s_enc: np.float32, s_dec: np.float32, target: float,
                     full: tuple[int, ...], rounding: RoundingLike,
                     rng: np.random.Generator | None) -> tuple[np.ndarray, np.ndarray]:
    """Elements (float32) and E4M3 block scales with each block's amax scaled to ``target`` (6, or 4)."""
    fp4 = as_format("fp4_e2m1")
    fp8 = as_format("fp8_e4m3")
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        mult = _F32(s_enc * _F32(1.0 / target))
        d32 = np.minimum((bam * mult).astype(_F32), _FLT_MAX)
        d32 = np.clip(d32, -fp8.max, fp8.max).astype(_F32)
        d = np.asarray(_round(d32, fp8, "rne", overflow="saturate"), dtype=_F32)
        enc = np.minimum((_F32(1.0) / (d * s_dec).astype(_F32)).astype(_F32), _FLT_MAX).astype(_F32)
        scaled = _apply(a32, enc, None, full, np.multiply).astype(_F32, copy=False)
    _presaturate(scaled, fp4)
    el = np.asarray(_round(scaled, fp4, rounding, overflow="saturate", rng=rng), dtype=_F32)
    return el, d


def _block_sq_err(a32: np.ndarray, el: np.ndarray, d: np.ndarray, s_dec: np.float32,
                  full: tuple[int, ...]) -> np.ndarray:
    """Sum over each block of (dequantised - x)**2, in float64 (the selection criterion of 4/6)."""
    s = (d.astype(np.float64) * np.float64(s_dec))
    deq = el.astype(np.float64) * _expand(s, full, a32.shape)
    err = (deq - a32.astype(np.float64)) ** 2
    # sum over each block: reshape every axis n into (n / b, b) and sum the b axes
    shp: list[int] = []
    for n, b in zip(a32.shape, full):
        shp += [n // b, b]
    out: np.ndarray = err.reshape(shp).sum(axis=tuple(range(1, 2 * a32.ndim, 2)))
    return out


@ieee_mode
@returns_input_kind(dtype_option=False)
def nvfp4_dequantize(q: Any, block_scales: Any, global_scale: Any, *, block: BlockLike = 16,
                     axis: int = -1) -> Any:
    """``q * (block_scale * global_scale)``: the two scales multiplied in float32, then the product with
    each element rounded once to ``q``'s dtype."""
    a = _as_float(q, "q")
    full = _nvfp4_block(a.shape, block, axis)
    g = np.asarray(_as_float(global_scale, "global_scale"))
    if g.size != 1:
        raise ValueError(f"global_scale must be a single number, got shape {g.shape}")
    with np.errstate(over="ignore", invalid="ignore"):  # float32 scales, as TE's: beyond its range is inf
        s = (np.asarray(_as_float(block_scales, "block_scales"), dtype=_F32) * _F32(g.reshape(()))).astype(_F32)
    # float32 q: q * s is exact in float64 (24 + 24 bits), so one float32 multiply gives the same rounding
    work = _F32 if a.dtype == np.float32 else np.float64
    with np.errstate(over="ignore", invalid="ignore"):
        out = _apply(a.astype(work, copy=False), s.astype(work), None, full, np.multiply)
    return out.astype(a.dtype, copy=False)


