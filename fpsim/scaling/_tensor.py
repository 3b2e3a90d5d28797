"""Per-tensor, per-channel and per-block scaling: :func:`amax`, :func:`compute_scale`, :func:`quantize`,
:func:`dequantize`, :func:`scale_and_quantize` and :func:`fake_quantize`. Public names are re-exported by
:mod:`fpsim.scaling`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._fpenv import ieee_mode
from .._interop import returns_input_kind
from ..formats import Format, FormatLike, as_format
from ..rounding import Overflow, RoundingLike, parse_options
from ..rounding import round as _round
from ._common import (BlockLike, _F32, _FLT_MAX, _FLT_MIN, _apply, _as_float, _block_shape, _blocked, _check_margin,
                      _check_real, _grid_shape, _norm_axis, _out)


# --------------------------------------------------------------------------------------------------
# amax, scales, quantize / dequantize


@ieee_mode
@returns_input_kind(dtype_option=False)
def amax(x: Any, *, axis: int | None = None, block: BlockLike | None = None) -> Any:
    """Largest magnitude ``max|x|``: of the whole tensor, per channel, or per block.

    Parameters
    ----------
    x : array_like
        Values (never modified). A NaN anywhere in a group makes that group's amax NaN (so that a
        scaling recipe sees it and keeps its previous scale); ±inf gives inf. An empty group gives 0.
    axis : int, optional
        Per-channel amax: one value per index along ``axis`` (reduced over every other axis).
    block : int or tuple of ints, optional
        Per-block amax: tiles of this shape, aligned to the trailing axes (``(1, 128)`` tiles,
        ``(128, 128)`` blocks); each entry must divide the corresponding dimension.

    Returns
    -------
    float32 for float32 input, else float64 (a NumPy scalar per tensor, an array otherwise).

    Examples
    --------
    >>> import numpy as np, fpsim.scaling as S
    >>> x = np.float32([[1, -2, 3, -4], [0.5, 0, 0, 8]])
    >>> float(S.amax(x)), S.amax(x, axis=0).tolist(), S.amax(x, block=(1, 2)).tolist()
    (8.0, [4.0, 8.0], [[2.0, 4.0], [0.5, 8.0]])
    """
    a = _as_float(x)
    if axis is not None and block is not None:
        raise ValueError("give either axis= (per channel) or block= (per block), not both")
    m = np.abs(a)
    if axis is not None:
        if a.ndim == 0:
            raise ValueError("axis= needs an array with at least one dimension")
        ax = _norm_axis(axis, a.ndim)
        mm = np.moveaxis(m, ax, 0).reshape(a.shape[ax], -1)
        if mm.shape[1] == 0:
            return np.zeros(a.shape[ax], dtype=a.dtype)
        return mm.max(axis=1)
    if block is not None:
        full = _block_shape(a.shape, block)
        grid = _grid_shape(a.shape, full)
        if a.size == 0:
            return np.zeros(grid, dtype=a.dtype)
        if all(b == 1 for b in full[:-1]):
            # blocks along the last axis only ((1, 128) tiles, NVFP4's 16): one flat reduceat over
            # contiguous runs, several times faster than a reduction over the blocked view's odd axes
            flat = m.reshape(-1)  # C order (a copy only for a non-C-contiguous x)
            red: np.ndarray = np.maximum.reduceat(flat, np.arange(0, flat.size, full[-1]))
            return red.reshape(grid)
        return _blocked(m, full).max(axis=tuple(range(1, 2 * a.ndim, 2)))
    if a.size == 0:
        return a.dtype.type(0)
    return m.max()


def _pow2_floor_f32(s: np.ndarray) -> np.ndarray:
    """Keep only the sign and exponent bits of float32 values (TE's power-of-two scale: rounds down)."""
    s = np.array(s, dtype=_F32)
    out: np.ndarray = (s.reshape(-1).view(np.uint32) & np.uint32(0xFF800000)).view(_F32).reshape(s.shape)
    return out


@ieee_mode
@returns_input_kind(dtype_option=False)
def compute_scale(
    amax: Any,
    fmt: FormatLike,
    *,
    margin: int = 0,
    power_of_two: bool = False,
    amax_epsilon: float = 0.0,
    value_for_inf: float | None = None,
) -> Any:
    """Scale that maps ``amax`` onto the format's largest value: ``scale = (fmt.max / amax) / 2**margin``.

    This is TransformerEngine's ``compute_scale_from_amax`` (current scaling), in float32:
    ``amax = max(amax, amax_epsilon)``; an amax of 0, inf or NaN gives scale 1; a scale that
    overflows to inf becomes ``value_for_inf`` (float32's max by default, TE's value for float32
    inputs); ``power_of_two=True`` keeps only the sign and exponent bits (rounds *down* to a power of
    two, so ``amax * scale`` never exceeds ``fmt.max``). Quantise with ``round(x * scale)``.

    A scale below float32's smallest normal 2**-126 (only reachable with a large ``margin``: TE's
    formula would give 0 or a subnormal, whose reciprocal overflows) becomes 2**-126, so that
    ``scale_inv = 1 / scale`` stays finite.

    Parameters
    ----------
    amax : float or array_like
        Largest magnitude(s); an array gives per-channel / per-block scales of the same shape.
    fmt : Format or str
        Target format (its ``max`` is used).
    margin : int
        Extra headroom: divides the scale by ``2**margin``; an integer in [-127, 127] (``ValueError``
        otherwise), so that ``2**margin`` is a normal float32 and the division exact.
    power_of_two : bool
        Round the scale down to a power of two (TE's ``power_2_scale``; DeepSeek-style block scaling).
    amax_epsilon : float
        Lower bound on amax (TE ``amax_epsilon``).
    value_for_inf : float, optional
        Scale used when ``fmt.max / amax`` overflows float32 (TE: the input dtype's max; bf16 inputs
        use 3.3895314e38).

    Returns
    -------
    numpy.float32 or float32 array

    Examples
    --------
    >>> import fpsim.scaling as S
    >>> [float(S.compute_scale(a, "fp8_e4m3")) for a in (1, 3, 0, float("inf"))]
    [448.0, 149.3333282470703, 1.0, 1.0]
    >>> [float(S.compute_scale(a, "fp8_e4m3", power_of_two=True)) for a in (1, 3, 1e-3)]
    [256.0, 128.0, 262144.0]
    """
    f = as_format(fmt)
    m = _check_margin(margin)
    eps = _F32(_check_real("amax_epsilon", amax_epsilon, 0.0))
    vinf = _FLT_MAX if value_for_inf is None else _F32(_check_real("value_for_inf", value_for_inf, None))
    if not vinf > 0:
        raise ValueError(f"value_for_inf must be positive, got {value_for_inf!r}")
    scalar_in = np.isscalar(amax)
    with np.errstate(over="ignore"):  # a float64 amax beyond float32's range becomes inf (scale 1)
        a = np.asarray(_as_float(amax, "amax"), dtype=_F32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        a = np.where(a < eps, eps, a)  # std::max(amax, eps): a NaN amax stays NaN
        sf = (_F32(f.max) / a) / _F32(2.0**m)  # exact: 2**m is a normal float32
        sf = np.where(np.isinf(sf), vinf, sf)
        sf = np.where(sf < _FLT_MIN, _FLT_MIN, sf)  # keep 1/scale finite (see above)
        bad = ~np.isfinite(a) | (a <= 0)
        sf = np.where(bad, _F32(1.0), sf).astype(_F32)
    if power_of_two:
        sf = _pow2_floor_f32(sf)
    return _out(np.asarray(sf, dtype=_F32), scalar_in)


@ieee_mode
def quantize(
    x: Any,
    fmt: FormatLike,
    scale: Any,
    *,
    rounding: RoundingLike = "rne",
    overflow: str = "saturate",
    axis: int | None = None,
    block: BlockLike | None = None,
    rng: np.random.Generator | None = None,
) -> Any:
    """Scale and round into ``fmt``: ``q = round(x * scale, fmt)`` (values of ``fmt``, unscaled units).

    The product is taken in the input's precision (float32 input: a float32 product, as
    TransformerEngine's ``(x.float() * scale).to(fp8)``), then rounded once with :func:`fpsim.round`.

    Parameters
    ----------
    x : array_like
        High-precision values (never modified).
    fmt : Format or str
        Target format, e.g. ``"fp8_e4m3"``.
    scale : float or array_like
        Multiplier: a scalar (per tensor), one value per index along ``axis`` (per channel), one value
        per block of shape ``block`` (per block), or any array that broadcasts against ``x``.
    rounding : str
        Rounding mode (``"rne"``, ``"sr"`` with ``rng=``, ...).
    overflow : {"saturate", "ieee"}
        ``"saturate"`` (default) clamps to ±max like TE's FP8 casts; ``"ieee"`` gives inf/NaN.
    axis, block : optional
        How ``scale`` maps onto ``x`` (see :func:`amax`).
    rng : numpy.random.Generator, optional
        For ``rounding="sr"``.

    Returns
    -------
    Values of ``fmt`` (float32 for float32 input, else float64), same shape as ``x``.

    Examples
    --------
    >>> import numpy as np, fpsim.scaling as S
    >>> S.quantize(np.float32([1.0, 2.0, 10.0]), "fp8_e4m3", 100.0)
    array([ 96., 192., 448.], dtype=float32)
    >>> S.quantize(np.float32([[1, 2], [3, 4]]), "fp8_e4m3", [1.0, 0.5], axis=0).tolist()
    [[1.0, 2.0], [1.5, 2.0]]
    """
    f, mode, ov = parse_options(fmt, rounding, overflow, True, rng)
    scalar_in = np.isscalar(x)
    xs = _scaled(_as_float(x), scale, axis, block)
    if ov is Overflow.SATURATE:
        _presaturate(xs, f)
    q = _round(xs, f, mode, overflow=ov, rng=rng)
    return _out(np.asarray(q), scalar_in)


def _scaled(a: np.ndarray, scale: Any, axis: Any, block: Any) -> np.ndarray:
    """A fresh array ``a * scale`` in ``a``'s precision (a float32 scale for float32 data), with the scale
    broadcast per tensor / channel / block; overflow to inf and NaN products are kept, not warned about."""
    s = _as_float(scale, "scale")
    with np.errstate(over="ignore", invalid="ignore"):
        if a.dtype == np.float32:
            s = s.astype(_F32)  # a scale beyond float32's range becomes ±inf
        return _apply(a, s, axis, block, np.multiply).astype(a.dtype, copy=False)


def _presaturate(v: np.ndarray, f: Format) -> None:
    """Clip a fresh array to ±fmt.max in place before a saturating rounding: the same result (any value
    beyond max saturates to it in every mode), and the rounding kernel's overflow path is slow."""
    if v.dtype == np.float64 or f.fits_float32:
        with np.errstate(invalid="ignore"):
            np.clip(v, -f.max, f.max, out=v)


@ieee_mode
@returns_input_kind(dtype_option=False)
def dequantize(q: Any, scale: Any, *, axis: int | None = None, block: BlockLike | None = None) -> Any:
    """Back to high-precision units: ``q * scale_inv`` with ``scale_inv = float32(1 / scale)``.

    TransformerEngine stores ``scale_inv`` as the float32 reciprocal of the scale and multiplies by it;
    for power-of-two scales this equals dividing. float32 carriers give float32 products.

    Examples
    --------
    >>> import numpy as np, fpsim.scaling as S
    >>> S.dequantize(np.float32([96, 448]), 100.0)
    array([0.96, 4.48], dtype=float32)
    """
    scalar_in = np.isscalar(q)
    a = _as_float(q, "q")
    with np.errstate(over="ignore"):  # scales are float32 (TE): beyond its range is ±inf
        s = np.asarray(_as_float(scale, "scale"), dtype=_F32)
    with np.errstate(divide="ignore", over="ignore"):
        inv = (_F32(1.0) / s).astype(_F32)
    if a.dtype == np.float64:
        inv = inv.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        out = _apply(a, inv, axis, block, np.multiply).astype(a.dtype, copy=False)
    return _out(out, scalar_in)


@ieee_mode
@returns_input_kind(dtype_option=False)
def scale_and_quantize(
    x: Any,
    fmt: FormatLike,
    *,
    axis: int | None = None,
    block: BlockLike | None = None,
    margin: int = 0,
    power_of_two: bool = False,
    amax_epsilon: float = 0.0,
    rounding: RoundingLike = "rne",
    overflow: str = "saturate",
    rng: np.random.Generator | None = None,
) -> tuple[Any, Any]:
    """Current scaling in one call: amax (per tensor / channel / block) -> scale -> quantize.

    Returns ``(q, scale)`` where ``scale`` is the **encode** scale (multiplied before the cast, as
    :func:`compute_scale` returns it); ``dequantize(q, scale, axis=axis, block=block)`` goes back. Its
    reciprocal is the decode factor that :func:`fpsim.matmul`'s ``scales=`` expects: to multiply
    quantized tensors use :func:`quantize_scaled`, whose :class:`ScaledTensor` carries the decode
    factors and goes to ``fpsim.matmul`` as it is.

    Examples
    --------
    >>> import numpy as np, fpsim.scaling as S
    >>> x = np.float32([[0.1, 2.0], [300.0, -7.0]])
    >>> q, s = S.scale_and_quantize(x, "fp8_e4m3", block=(1, 2), power_of_two=True)
    >>> s.ravel().tolist()
    [128.0, 1.0]
    """
    am = amax(x, axis=axis, block=block)
    s = compute_scale(am, fmt, margin=margin, power_of_two=power_of_two, amax_epsilon=amax_epsilon)
    q = quantize(x, fmt, s, rounding=rounding, overflow=overflow, axis=axis, block=block, rng=rng)
    return q, s


@ieee_mode
@returns_input_kind(dtype_option=False)
def fake_quantize(
    x: Any,
    fmt: FormatLike,
    scale: Any = 1.0,
    *,
    rounding: RoundingLike = "rne",
    overflow: str = "saturate",
    axis: int | None = None,
    block: BlockLike | None = None,
    rng: np.random.Generator | None = None,
) -> Any:
    """Quantize-dequantize through a float format: ``dequantize(quantize(x, fmt, scale), scale)``.

    (:func:`fpsim.quant.fp8_fake_quantize` is the same with its straight-through gradient.)

    >>> import numpy as np, fpsim.scaling as S
    >>> S.fake_quantize(np.float32([0.3, 1000.0]), "fp8_e4m3").tolist()
    [0.3125, 448.0]
    """
    q = quantize(x, fmt, scale, rounding=rounding, overflow=overflow, axis=axis, block=block, rng=rng)
    return dequantize(q, scale, axis=axis, block=block)


