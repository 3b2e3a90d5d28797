"""Scaling for narrow float formats: per-tensor, per-channel and per-block scales, TransformerEngine's
delayed and current scaling, MX block formats (E8M0 shared scales) and NVFP4.

Conventions (those of TransformerEngine): a *scale* multiplies the high-precision values before the cast,
``q = round(x * scale)``, and dequantisation multiplies by ``scale_inv = 1 / scale`` (a float32
reciprocal). MX and NVFP4 functions instead return *decode* scales (``x ≈ q * scale``), as the OCP MX
specification stores them. Every rounding goes through :func:`fpsim.round` (one correct rounding,
``overflow="saturate"`` by default, as FP8 casts in TransformerEngine saturate).

>>> import numpy as np, fpsim.scaling as S
>>> x = np.float32([0.5, -3.0, 1e-3])
>>> s = S.compute_scale(S.amax(x), "fp8_e4m3")
>>> float(s)                       # 448 / 3 in float32
149.3333282470703
>>> q = S.quantize(x, "fp8_e4m3", s)
>>> q.tolist()
[72.0, -448.0, 0.15625]
>>> [round(float(v), 6) for v in S.dequantize(q, s)]
[0.482143, -3.0, 0.001046]
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Union

import numpy as np

from ._fpenv import ieee_mode
from ._interop import returns_input_kind
from ._names import parse_name
from .formats import Format, FormatLike, as_format
from .mma.blockscaled import matmul_block_scaled  # MX/NVFP4 ScaledTensors straight into Blackwell's MMA
from .mma.scaled import ScaledTensor
from .rounding import Overflow, Rounding, RoundingLike, _as_float_array, as_rounding, parse_options
from .rounding import round as _round

__all__ = [
    "FP8_FORMATS",
    "CurrentScaling",
    "DelayedScaling",
    "Recipe",
    "ScaledTensor",
    "amax",
    "compute_scale",
    "dequantize",
    "fake_quantize",
    "fp8_format_pair",
    "get_recipe",
    "matmul_block_scaled",
    "mx_dequantize",
    "mx_quantize",
    "mx_scales",
    "nvfp4_dequantize",
    "nvfp4_quantize",
    "quantize",
    "quantize_scaled",
    "recipes",
    "scale_and_quantize",
]

_F32 = np.float32
_FLT_MAX = np.float32(np.finfo(np.float32).max)

BlockLike = Union[int, tuple[int, ...], list[int]]  # noqa: UP007  (a runtime alias: needs Union on 3.10)


# --------------------------------------------------------------------------------------------------
# Validation helpers


def _check_int(name: str, v: Any, lo: int | None = None) -> int:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(v).__name__}: {v!r}")
    if lo is not None and v < lo:
        raise ValueError(f"{name} must be >= {lo}, got {v}")
    return int(v)


_MARGIN_MAX = 127
_FLT_MIN = np.float32(np.finfo(np.float32).tiny)  # 2**-126: the smallest scale whose reciprocal is finite


def _check_margin(margin: Any) -> int:
    """``margin`` as an int in [-127, 127]: ``2**margin`` is then a normal float32, so dividing by it is
    exact (TransformerEngine's ``/ powf(2, margin)``); beyond that the float32 divisor is inf or 0."""
    m = _check_int("margin", margin)
    if not -_MARGIN_MAX <= m <= _MARGIN_MAX:
        raise ValueError(f"margin must be an integer in [-{_MARGIN_MAX}, {_MARGIN_MAX}] (2**margin must be a "
                         f"normal float32), got {margin!r}")
    return m


def _check_real(name: str, v: Any, lo: float | None) -> float:
    """A real Python/NumPy number (not bool), not NaN, and >= ``lo`` when given."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {type(v).__name__}: {v!r}")
    f = float(v)
    if math.isnan(f) or (lo is not None and f < lo):
        raise ValueError(f"{name} must be a number >= {lo}, got {v!r}" if lo is not None
                         else f"{name} must not be NaN, got {v!r}")
    return f


def _check_scale(v: Any) -> np.float32:
    """A per-tensor scale for a scaling state machine: a finite positive number, as float32."""
    f = _check_real("scale", v, None)
    s: np.float32 = _F32(f) if abs(f) < float(_FLT_MAX) else _F32(np.inf)
    if not (np.isfinite(s) and s > 0):
        raise ValueError(f"scale must be a finite positive number (as float32), got {v!r}")
    return s


def _norm_axis(axis: Any, ndim: int) -> int:
    a = _check_int("axis", axis)
    if not -ndim <= a < ndim:
        raise ValueError(f"axis {a} is out of range for an array with {ndim} dimension(s)")
    return a % ndim


def _block_shape(shape: tuple[int, ...], block: Any) -> tuple[int, ...]:
    """Normalise ``block`` (an int or a tuple aligned to the trailing axes) to one entry per axis."""
    if isinstance(block, (int, np.integer)) and not isinstance(block, (bool, np.bool_)):
        blk: tuple[int, ...] = (int(block),)
    elif isinstance(block, (tuple, list)):
        blk = tuple(_check_int("block entry", b) for b in block)
    else:
        raise TypeError(f"block must be an int or a tuple of ints, got {type(block).__name__}: {block!r}")
    if len(blk) > len(shape):
        raise ValueError(f"block {blk} has more dimensions than the array's shape {shape}")
    if any(b < 1 for b in blk):
        raise ValueError(f"block entries must be >= 1, got {blk}")
    full = (1,) * (len(shape) - len(blk)) + blk
    bad = [i for i, (s, b) in enumerate(zip(shape, full)) if s % b]
    if bad:
        raise ValueError(
            f"block {blk} does not divide shape {shape} (axis {bad[0]}: {shape[bad[0]]} % {full[bad[0]]} != 0); "
            "pad the array or choose a block whose entries divide the trailing dimensions"
        )
    return full


def _blocked(x: np.ndarray, full: tuple[int, ...]) -> np.ndarray:
    """View ``x`` as (n0, b0, n1, b1, ...)."""
    new: list[int] = []
    for s, b in zip(x.shape, full):
        new += [s // b, b]
    return x.reshape(new)


def _grid_shape(shape: tuple[int, ...], full: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(s // b for s, b in zip(shape, full))


def _as_float(x: Any, name: str = "x") -> np.ndarray:
    a, _ = _as_float_array(x, name)
    return a


def _broadcast_scale(s: np.ndarray, shape: tuple[int, ...], axis: Any, block: Any, what: str = "scale") -> np.ndarray:
    """Shape a per-tensor / per-channel / per-block scale array so that it broadcasts against ``shape``."""
    if axis is not None and block is not None:
        raise ValueError("give either axis= (per channel) or block= (per block), not both")
    if axis is not None:
        ax = _norm_axis(axis, len(shape))
        s = s.reshape(-1)
        if s.size not in (1, shape[ax]):
            raise ValueError(f"{what} has {s.size} entries but axis {ax} has length {shape[ax]}")
        bshape = [1] * len(shape)
        bshape[ax] = s.size
        return s.reshape(bshape)
    if block is not None:
        full = _block_shape(shape, block)
        grid = _grid_shape(shape, full)
        if s.size == 1:
            s = np.broadcast_to(s.reshape(()), grid)
        if s.shape != grid:
            raise ValueError(f"{what} has shape {s.shape}; block {tuple(full)} over shape {shape} needs {grid}")
        inter: list[int] = []
        for g in grid:
            inter += [g, 1]
        return s.reshape(inter)
    if s.size == 1:
        return s.reshape(())
    try:
        np.broadcast_shapes(s.shape, shape)
    except ValueError:
        raise ValueError(f"{what} of shape {s.shape} does not broadcast to the data's shape {shape}") from None
    return s


def _apply(x: np.ndarray, s: np.ndarray, axis: Any, block: Any, fn: Any) -> np.ndarray:
    """``fn(x, s)`` with ``s`` broadcast per tensor / channel / block."""
    sb = _broadcast_scale(s, x.shape, axis, block)
    if block is not None:
        full = _block_shape(x.shape, block)
        return np.asarray(fn(_blocked(x, full), sb)).reshape(x.shape)
    return np.asarray(fn(x, sb))


def _out(a: np.ndarray, scalar_in: bool) -> Any:
    return a[()] if scalar_in or a.ndim == 0 else a


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


# --------------------------------------------------------------------------------------------------
# TransformerEngine recipes


FP8_FORMATS: dict[str, tuple[str, str]] = {
    "E4M3": ("fp8_e4m3", "fp8_e4m3"),
    "E5M2": ("fp8_e5m2", "fp8_e5m2"),
    "HYBRID": ("fp8_e4m3", "fp8_e5m2"),
}
"""TransformerEngine's ``Format`` names -> (forward format, backward format)."""


@ieee_mode
def fp8_format_pair(name: str) -> tuple[Format, Format]:
    """(forward, backward) formats of a TE format name: ``"HYBRID"`` -> (fp8_e4m3, fp8_e5m2).

    ``"E5M2"`` is listed for completeness; TransformerEngine's recipes reject pure E5M2 training.

    >>> [f.name for f in fp8_format_pair("HYBRID")]
    ['fp8_e4m3', 'fp8_e5m2']
    """
    key = parse_name(name, tuple(k.lower() for k in FP8_FORMATS), "FP8 format").upper()
    fw, bw = FP8_FORMATS[key]
    return as_format(fw), as_format(bw)


_ALGOS = ("max", "most_recent")
_PATHS = ("unfused", "fused")


@ieee_mode
class DelayedScaling:
    """TransformerEngine's delayed scaling: the scale for step t comes from the amax history up to t−1.

    Follows TE's reference (unfused, ``NVTE_UNFUSED_FP8_UPDATE=1``) update, all in float32. After each
    step, :meth:`update` with that step's amax:

    1. writes amax into history slot 0;
    2. takes ``amax = max(history)`` (``"max"``; a NaN propagates) or ``history[0]`` (``"most_recent"``);
    3. rolls the history by −1 and zeroes slot 0 (window = this amax and the previous ``len − 1``);
    4. ``sf = (fmt.max / amax) / 2**margin``; keeps the previous scale if amax is 0, inf or NaN;
       uses float32's max if ``sf`` is inf.

    An inf (or, unfused, a NaN) amax therefore holds the previous scale until it leaves the window,
    ``amax_history_len`` steps later. ``update_path="fused"`` follows TE's default CUDA kernel instead:
    a step with amax 0 leaves history and scale untouched, and the window max skips NaN (``fmaxf``).

    Parameters
    ----------
    fmt : Format or str
        FP8 format of the tensor (TE HYBRID: fp8_e4m3 forward, fp8_e5m2 for gradients).
    margin : int
        ``scale /= 2**margin``.
    amax_history_len : int
        Window length (TE default 1024).
    amax_compute_algo : {"max", "most_recent"}
    scale : float
        Initial scale (TE: 1.0).
    update_path : {"unfused", "fused"}

    Attributes
    ----------
    scale : numpy.float32
        Scale to use for the *next* quantisation.
    scale_inv : numpy.float32
        ``float32(1 / scale)``.
    amax_history : numpy.ndarray
        float32 array of length ``amax_history_len``; slot 0 is the pending (current) step.

    Examples
    --------
    >>> ds = DelayedScaling("fp8_e4m3", amax_history_len=4)
    >>> [float(ds.update(a)) for a in (1.0, 2.0, 0.5, 0.25, 0.0, 8.0, float("inf"))]
    [448.0, 224.0, 224.0, 224.0, 224.0, 56.0, 56.0]
    """

    def __init__(
        self,
        fmt: FormatLike = "fp8_e4m3",
        *,
        margin: int = 0,
        amax_history_len: int = 1024,
        amax_compute_algo: str = "max",
        scale: float = 1.0,
        update_path: str = "unfused",
    ) -> None:
        self.fmt: Format = as_format(fmt)
        self.margin = _check_margin(margin)
        self.amax_history_len = _check_int("amax_history_len", amax_history_len, 1)
        self.amax_compute_algo = parse_name(amax_compute_algo, _ALGOS, "amax_compute_algo")
        self.update_path = parse_name(update_path, _PATHS, "update_path")
        self.scale: np.float32 = _check_scale(scale)
        self.amax_history: np.ndarray = np.zeros(self.amax_history_len, dtype=_F32)
        self._pending: np.float32 | None = None

    @property
    def scale_inv(self) -> np.float32:
        with np.errstate(divide="ignore", over="ignore"):
            inv: np.float32 = _F32(_F32(1.0) / self.scale)
        return inv

    def __repr__(self) -> str:
        return (
            f"DelayedScaling({self.fmt.name!r}, margin={self.margin}, amax_history_len={self.amax_history_len}, "
            f"amax_compute_algo={self.amax_compute_algo!r}, scale={float(self.scale)!r})"
        )

    # -- using the scale ---------------------------------------------------------------------------
    def record(self, x: Any) -> np.float32:
        """Record ``max|x|`` for the current step (the max over several calls) and return it."""
        with np.errstate(over="ignore"):  # float64 beyond float32's range: an inf amax (holds the scale)
            a = _F32(amax(x))
        if self._pending is None or np.isnan(a) or a > self._pending:
            self._pending = a
        out: np.float32 = a
        return out

    def quantize(self, x: Any, *, rounding: RoundingLike = "rne", rng: np.random.Generator | None = None) -> Any:
        """``round(x * scale)`` (saturating) with the current scale, recording this step's amax."""
        self.record(x)
        return quantize(x, self.fmt, self.scale, rounding=rounding, overflow="saturate", rng=rng)

    def dequantize(self, q: Any) -> Any:
        """``q * scale_inv`` with the current scale."""
        return dequantize(q, self.scale)

    def fake_quantize(self, x: Any, *, rounding: RoundingLike = "rne", rng: np.random.Generator | None = None) -> Any:
        """Quantize-dequantize with the current scale, recording this step's amax."""
        scale = self.scale
        return dequantize(self.quantize(x, rounding=rounding, rng=rng), scale)

    # -- the state machine -------------------------------------------------------------------------
    def update(self, amax: Any = None) -> np.float32:
        """End of step: record ``amax`` (or what :meth:`record`/:meth:`quantize` saw), update the scale.

        Returns the new scale (to be used at the next step).
        """
        if amax is None:
            a = self._pending if self._pending is not None else _F32(0.0)
        else:
            with np.errstate(over="ignore"):  # as in record()
                a = _F32(_as_float(amax, "amax").reshape(-1).max()) if np.size(amax) else _F32(0.0)
        self._pending = None
        h = self.amax_history
        h[0] = a
        fmax = _F32(self.fmt.max)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            if self.update_path == "unfused":
                cur = h.max() if self.amax_compute_algo == "max" else h[0]
                cur = _F32(cur)
                self._roll()
                sf = _F32(_F32(fmax / cur) / _F32(2.0**self.margin))
            else:
                last = h[0]
                if last != 0:
                    cur = _F32(np.fmax.reduce(h)) if self.amax_compute_algo == "max" else _F32(last)
                    self._roll()
                else:
                    cur = _F32(0.0)
                sf = _F32(_F32(fmax * _F32(2.0**-self.margin)) / cur)
            if not (cur > 0) or not np.isfinite(cur):
                sf = self.scale
            if np.isinf(sf):
                sf = _FLT_MAX
        self.scale = _F32(sf)
        return self.scale

    def _roll(self) -> None:
        h = self.amax_history
        if h.size > 1:
            self.amax_history = np.roll(h, -1)
        self.amax_history[0] = 0.0

    # -- checkpoints -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Plain-Python state (JSON-friendly apart from non-finite floats): config, scale and history."""
        return {
            "fmt": self.fmt.name,
            "margin": self.margin,
            "amax_history_len": self.amax_history_len,
            "amax_compute_algo": self.amax_compute_algo,
            "update_path": self.update_path,
            "scale": float(self.scale),
            "amax_history": [float(v) for v in self.amax_history],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (validated; the format and history length must match)."""
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict, got {type(state).__name__}")
        missing = [k for k in ("scale", "amax_history") if k not in state]
        if missing:
            raise ValueError(f"state_dict is missing {missing}")
        if "fmt" in state and as_format(state["fmt"]) != self.fmt:
            raise ValueError(f"state is for format {state['fmt']!r}, this DelayedScaling uses {self.fmt.name!r}")
        hist = np.asarray(state["amax_history"], dtype=_F32).reshape(-1)
        if hist.size != self.amax_history_len:
            raise ValueError(f"amax_history has {hist.size} entries, expected {self.amax_history_len}")
        for key in ("margin", "amax_compute_algo", "update_path"):
            if key in state and state[key] != getattr(self, key):
                raise ValueError(f"state has {key}={state[key]!r}, this object has {getattr(self, key)!r}")
        self.scale = _check_scale(state["scale"])
        self.amax_history = hist.copy()
        self._pending = None


@ieee_mode
class CurrentScaling:
    """TransformerEngine's ``Float8CurrentScaling``: a just-in-time per-tensor scale from the current amax.

    ``scale = compute_scale(amax(x), fmt, power_of_two=..., amax_epsilon=...)``: amax 0, inf or NaN
    gives scale 1, an infinite scale becomes float32's max, ``power_of_two`` rounds the scale down.

    Examples
    --------
    >>> import numpy as np
    >>> cs = CurrentScaling("fp8_e4m3")
    >>> q, s = cs.quantize(np.float32([3.0, -1.0]))
    >>> float(s), q.tolist()
    (149.3333282470703, [448.0, -144.0])
    """

    def __init__(self, fmt: FormatLike = "fp8_e4m3", *, power_of_two: bool = False, amax_epsilon: float = 0.0,
                 margin: int = 0) -> None:
        self.fmt: Format = as_format(fmt)
        self.power_of_two = bool(power_of_two)
        self.amax_epsilon = _check_real("amax_epsilon", amax_epsilon, 0.0)
        self.margin = _check_margin(margin)

    def __repr__(self) -> str:
        return (f"CurrentScaling({self.fmt.name!r}, power_of_two={self.power_of_two}, "
                f"amax_epsilon={self.amax_epsilon})")

    def scale_for(self, x: Any) -> np.float32:
        """The scale current scaling would use for ``x``."""
        s: np.float32 = _F32(compute_scale(_F32(amax(x)), self.fmt, margin=self.margin,
                                           power_of_two=self.power_of_two, amax_epsilon=self.amax_epsilon))
        return s

    def quantize(self, x: Any, *, rounding: RoundingLike = "rne",
                 rng: np.random.Generator | None = None) -> tuple[Any, np.float32]:
        """``(q, scale)`` with ``q = round(x * scale)`` saturating."""
        s = self.scale_for(x)
        return quantize(x, self.fmt, s, rounding=rounding, overflow="saturate", rng=rng), s

    def fake_quantize(self, x: Any, *, rounding: RoundingLike = "rne", rng: np.random.Generator | None = None) -> Any:
        """Quantize-dequantize with the current tensor's own scale."""
        q, s = self.quantize(x, rounding=rounding, rng=rng)
        return dequantize(q, s)


@ieee_mode
@dataclass(frozen=True)
class Recipe:
    """A named scaling recipe: which format each tensor role gets and how its scale is chosen.

    ``scaling`` is one of ``"delayed"``, ``"current"``, ``"block"`` (fp32 scales per tile/block,
    DeepSeek-V3 style), ``"mx"`` (E8M0 scale per 32 values) or ``"nvfp4"``. Roles are
    ``"activation"``, ``"weight"`` (forward format) and ``"gradient"`` (backward format).
    """

    name: str
    scaling: str
    forward_format: str
    backward_format: str
    margin: int = 0
    amax_history_len: int = 1024
    amax_compute_algo: str = "max"
    power_of_two: bool = False
    activation_block: tuple[int, ...] | int | None = None
    weight_block: tuple[int, ...] | int | None = None
    gradient_block: tuple[int, ...] | int | None = None
    scale_rounding: str = "ceil"
    description: str = field(default="", compare=False)

    def format_for(self, role: str) -> Format:
        """Format of a tensor role (``"activation"``, ``"weight"``, ``"gradient"``)."""
        r = parse_name(role, ("activation", "weight", "gradient"), "role")
        return as_format(self.backward_format if r == "gradient" else self.forward_format)

    def block_for(self, role: str) -> tuple[int, ...] | int | None:
        """Block shape of a role (None for per-tensor recipes)."""
        role = parse_name(role, ("activation", "weight", "gradient"), "role")
        return {"activation": self.activation_block, "weight": self.weight_block,
                "gradient": self.gradient_block}[role]

    def scaler(self, role: str) -> DelayedScaling | CurrentScaling:
        """A fresh per-tensor scaling object for ``role`` (delayed and current recipes only)."""
        fmt = self.format_for(role)
        if self.scaling == "delayed":
            return DelayedScaling(fmt, margin=self.margin, amax_history_len=self.amax_history_len,
                                  amax_compute_algo=self.amax_compute_algo)
        if self.scaling == "current":
            return CurrentScaling(fmt, power_of_two=self.power_of_two, margin=self.margin)
        raise ValueError(f"recipe {self.name!r} uses {self.scaling} scaling, which has no per-tensor scaler; "
                         "use quantize/scale_and_quantize with block=, or mx_quantize / nvfp4_quantize")


recipes: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe("delayed_hybrid", "delayed", "fp8_e4m3", "fp8_e5m2",
               description="TE DelayedScaling default: HYBRID, history 1024, max, margin 0"),
        Recipe("delayed_e4m3", "delayed", "fp8_e4m3", "fp8_e4m3", description="DelayedScaling with E4M3 everywhere"),
        Recipe("current_hybrid", "current", "fp8_e4m3", "fp8_e5m2",
               description="TE Float8CurrentScaling default: per-tensor scale from the current amax"),
        Recipe("current_e4m3", "current", "fp8_e4m3", "fp8_e4m3", description="current scaling, E4M3 everywhere"),
        Recipe("current_hybrid_pow2", "current", "fp8_e4m3", "fp8_e5m2", power_of_two=True,
               description="current scaling with power-of-two scales"),
        Recipe("block_fp8", "block", "fp8_e4m3", "fp8_e4m3", power_of_two=True,
               activation_block=(1, 128), weight_block=(128, 128), gradient_block=(1, 128),
               description="TE Float8BlockScaling / DeepSeek-V3: 1x128 tiles, 128x128 weight blocks, pow-2 fp32 scales"),
        Recipe("mxfp8", "mx", "fp8_e4m3", "fp8_e4m3", activation_block=32, weight_block=32, gradient_block=32,
               scale_rounding="ceil", description="TE MXFP8BlockScaling: E8M0 scale per 32, exponent rounded up"),
        Recipe("mxfp8_ocp", "mx", "fp8_e4m3", "fp8_e4m3", activation_block=32, weight_block=32, gradient_block=32,
               scale_rounding="floor", description="OCP MX v1.0 MXFP8: shared exponent floor(log2 amax) - emax"),
        Recipe("mxfp8_hybrid_ocp", "mx", "fp8_e4m3", "fp8_e5m2", activation_block=32, weight_block=32,
               gradient_block=32, scale_rounding="floor", description="OCP MXFP8 with E5M2 gradients"),
        Recipe("mxfp6_ocp", "mx", "fp6_e2m3", "fp6_e3m2", activation_block=32, weight_block=32, gradient_block=32,
               scale_rounding="floor", description="OCP MXFP6"),
        Recipe("mxfp4_ocp", "mx", "fp4_e2m1", "fp4_e2m1", activation_block=32, weight_block=32, gradient_block=32,
               scale_rounding="floor", description="OCP MXFP4"),
        Recipe("nvfp4", "nvfp4", "fp4_e2m1", "fp4_e2m1", activation_block=16, weight_block=(16, 16),
               gradient_block=16, description="NVFP4: E2M1 x 16 with E4M3 block scales and an fp32 tensor scale"),
    )
}
"""The usual recipes by name (see :class:`Recipe`)."""


@ieee_mode
def get_recipe(name: str | Recipe) -> Recipe:
    """Look up a recipe by name (or pass a `Recipe` through).

    >>> get_recipe("delayed_hybrid").format_for("gradient").name
    'fp8_e5m2'
    """
    if isinstance(name, Recipe):
        return name
    return recipes[parse_name(name, recipes, "recipe")]


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


@ieee_mode
@returns_input_kind(dtype_option=False)
def mx_scales(block_amax: Any, elem_fmt: FormatLike, *, scale_rounding: str = "floor") -> np.ndarray:
    """E8M0 decode scales (powers of two, as float32) for block amaxes.

    ``"floor"`` (OCP MX v1.0): ``X = 2**(floor(log2 amax) - emax_elem)``; the block's largest values may
    exceed ``elem.max`` after scaling and saturate. ``"ceil"`` (TransformerEngine MXFP8):
    ``X = 2**ceil(log2(float32(amax * float32(1/elem.max))))``, so nothing saturates. Exponents are
    clamped to E8M0's range [−127, 127]; an all-zero block gets 2**−127. A block whose amax is NaN
    gets a NaN scale (OCP: the whole block decodes to NaN); an inf amax gives NaN under ``"floor"``
    and 2**127 under ``"ceil"`` (TE's ``float_to_e8m0``).

    >>> mx_scales([500.0, 448.0, 1.0, 0.003], "fp8_e4m3", scale_rounding="ceil").tolist()
    [2.0, 1.0, 0.00390625, 7.62939453125e-06]
    >>> mx_scales([500.0, 448.0], "fp8_e4m3", scale_rounding="floor").tolist()
    [1.0, 1.0]
    """
    f = as_format(elem_fmt)
    scale_rounding = parse_name(scale_rounding, _SCALE_RULES, "scale_rounding")
    a = np.asarray(_as_float(block_amax, "block_amax"), dtype=np.float64)
    finite = np.isfinite(a)
    ok = finite & (a > 0)
    safe = np.where(ok, a, 1.0)
    e8 = as_format("e8m0")
    lo, hi = e8.min_normal, e8.max  # 2**-127, 2**127
    if scale_rounding == "floor":
        # 2**floor(log2 amax) is amax rounded down onto E8M0's grid; then divide by 2**emax (exact).
        p2 = np.asarray(_round(safe, e8, "rdn", overflow="saturate"), dtype=np.float64)
        x = np.ldexp(p2, -f.emax)
    else:
        # TE: float32 product with the float32 reciprocal of the element max, rounded up onto E8M0
        # (cvt.rp.satfinite.ue8m0); a product that underflows to 0 gives E8M0's smallest value.
        with np.errstate(over="ignore"):  # an amax beyond float32's range is inf there: 2**127 below
            v = (safe.astype(_F32) * _F32(1.0 / f.max)).astype(np.float64)
        v = np.where(v > 0, v, lo)
        x = np.asarray(_round(v, e8, "rup", overflow="saturate"), dtype=np.float64)
    x = np.where(ok, np.clip(x, lo, hi), lo)
    out = x.astype(_F32)
    if scale_rounding == "ceil":
        # TE's float_to_e8m0: inf -> 0xFE (2**127), NaN -> 0xFF (NaN)
        res: np.ndarray = np.where(np.isnan(a), _F32(np.nan), np.where(np.isinf(a), _F32(hi), out)).astype(_F32)
    else:
        res = np.where(finite, out, _F32(np.nan)).astype(_F32)
    return res


@ieee_mode
@returns_input_kind(dtype_option=False)
def mx_quantize(
    x: Any,
    elem_fmt: FormatLike,
    *,
    block: int = 32,
    axis: int = -1,
    scale_rounding: str = "floor",
    rounding: RoundingLike = "rne",
    rng: np.random.Generator | None = None,
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
    rounding : str
        Element rounding (``"rne"``; ``"sr"`` needs ``rng=``). Elements always saturate.

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
    scale_rounding = parse_name(scale_rounding, _SCALE_RULES, "scale_rounding")
    mode = as_rounding(rounding)
    a, b, ax = _mx_prepare(x, block, axis)
    moved = np.moveaxis(a, ax, -1)
    shp = moved.shape
    blocks = moved.reshape(shp[:-1] + (shp[-1] // b, b))  # (..., nblocks, block)
    bam = _block_absmax(blocks)  # (..., nblocks)
    scales = mx_scales(bam, f, scale_rounding=scale_rounding)  # (..., nblocks)
    # x / X is exact for power-of-two X unless the quotient drops below the carrier's normal range,
    # which is far below half the element format's smallest subnormal: then it rounds to 0 anyway in
    # the nearest / toward-zero modes. Other modes divide in float64.
    work = a.dtype if (a.dtype == np.float32 and mode in (Rounding.RNE, Rounding.RNA, Rounding.RTZ)) else np.float64
    div = scales
    if scale_rounding == "ceil":
        # TE multiplies by exp2f_rcp(biased exponent), which is 1 (not 2**127) for the smallest scale.
        div = np.where(scales == _F32(2.0**-127), _F32(1.0), scales)
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
    (with ``rng=``) rounds elements stochastically, as NVFP4 recipes do for gradients. Not modelled:
    the random Hadamard transform.

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
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        s_enc = _F32(min(_F32(_F32(fp8.max * fp4.max) / gam), _FLT_MAX))
        if s_enc == 0:
            s_enc = _F32(1.0)
        s_dec = _F32(_F32(1.0) / s_enc)
        mult = _F32(s_enc * _F32(1.0 / fp4.max))
        bam = np.asarray(amax(a32, block=full), dtype=_F32)
        d32 = np.minimum((bam * mult).astype(_F32), _FLT_MAX)
        d32 = np.clip(d32, -fp8.max, fp8.max).astype(_F32)
        d = np.asarray(_round(d32, fp8, "rne", overflow="saturate"), dtype=_F32)
        enc = np.minimum((_F32(1.0) / (d * s_dec).astype(_F32)).astype(_F32), _FLT_MAX).astype(_F32)
        scaled = _apply(a32, enc, None, full, np.multiply).astype(_F32, copy=False)
    _presaturate(scaled, fp4)
    el = np.asarray(_round(scaled, fp4, rounding, overflow="saturate", rng=rng)).astype(a.dtype, copy=False)
    return el, d, s_dec


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


# --------------------------------------------------------------------------------------------------
# One scaled-tensor value for every recipe

_SCALINGS = ("current", "mx", "nvfp4")


@ieee_mode
def quantize_scaled(
    x: Any,
    fmt: FormatLike = "fp8_e4m3",
    *,
    scaling: str = "current",
    axis: int | None = None,
    block: BlockLike | None = None,
    margin: int = 0,
    power_of_two: bool = False,
    amax_epsilon: float = 0.0,
    scale_rounding: str = "floor",
    rounding: RoundingLike = "rne",
    overflow: str = "saturate",
    rng: np.random.Generator | None = None,
) -> ScaledTensor:
    """Quantize ``x`` and return a :class:`ScaledTensor` (data plus **decode** factors, ``x ≈ data * scale``).

    The one value every recipe produces and :func:`fpsim.matmul` consumes directly
    (``matmul(qa, qb, model=...)``), so that no scale convention has to be remembered.

    Parameters
    ----------
    x : array_like
        High-precision values (never modified).
    fmt : Format or str
        Element format (``"fp4_e2m1"`` for NVFP4).
    scaling : {"current", "mx", "nvfp4"}
        ``"current"``: :func:`scale_and_quantize` (TE current scaling; per tensor, per channel with
        ``axis=``, per block with ``block=``); the stored factor is ``scale_inv = float32(1 / scale)``, so
        ``dequantize()`` gives the same bits as :func:`dequantize`. ``"mx"``: :func:`mx_quantize` (E8M0
        factors; ``block`` an int, default 32, along ``axis``, default -1). ``"nvfp4"``:
        :func:`nvfp4_quantize` (E4M3 block factors and the fp32 tensor factor as ``global_scale``;
        ``block`` 16 or ``(16, 16)``).
    axis, block, margin, power_of_two, amax_epsilon, scale_rounding, rounding, overflow, rng
        As in the function each scaling calls (``margin``, ``power_of_two``, ``amax_epsilon`` and
        ``overflow`` for current scaling only; ``scale_rounding`` for MX only).

    Returns
    -------
    ScaledTensor

    Examples
    --------
    >>> import numpy as np, fpsim.scaling as S
    >>> t = S.quantize_scaled(np.float32([[0.1, 2.0], [300.0, -7.0]]), "fp8_e4m3", block=(1, 2), power_of_two=True)
    >>> t.scale.ravel().tolist()          # decode factors: the reciprocals of scale_and_quantize's scales
    [0.0078125, 1.0]
    >>> t.dequantize().tolist()
    [[0.1015625, 2.0], [288.0, -7.0]]
    >>> S.quantize_scaled(np.arange(64.0), "fp8_e4m3", scaling="mx").block
    (32,)
    """
    kind = parse_name(scaling, _SCALINGS, "scaling")
    if kind == "current":
        a = _as_float(x)
        q, s = scale_and_quantize(a, fmt, axis=axis, block=block, margin=margin, power_of_two=power_of_two,
                                  amax_epsilon=amax_epsilon, rounding=rounding, overflow=overflow, rng=rng)
        with np.errstate(divide="ignore", over="ignore"):
            inv = (_F32(1.0) / np.asarray(s, dtype=_F32)).astype(_F32)
        if axis is not None:
            ax = _norm_axis(axis, a.ndim)
            blk = tuple(1 if i == ax else max(n, 1) for i, n in enumerate(a.shape))
            inv = inv.reshape(tuple(a.shape[ax] if i == ax else 1 for i in range(a.ndim)))
            return ScaledTensor(q, inv, fmt, blk)
        if block is not None:
            return ScaledTensor(q, inv, fmt, _block_shape(a.shape, block))
        return ScaledTensor(q, inv, fmt, None)
    if kind == "mx":
        if block is not None and not isinstance(block, (int, np.integer)):
            raise TypeError(f"MX blocks run along one axis: block must be an int, got {block!r}")
        b = 32 if block is None else int(block)
        ax_mx = -1 if axis is None else axis
        el, sc = mx_quantize(x, fmt, block=b, axis=ax_mx, scale_rounding=scale_rounding, rounding=rounding,
                             rng=rng)
        ax = _norm_axis(ax_mx, np.ndim(el))
        return ScaledTensor(el, sc, fmt, tuple(b if i == ax else 1 for i in range(np.ndim(el))))
    f = as_format(fmt)
    if f != as_format("fp4_e2m1"):
        raise ValueError(f"NVFP4 elements are fp4_e2m1, got format {f.name!r}")
    nb: BlockLike = 16 if block is None else block
    ax_nv = -1 if axis is None else axis
    q4, d, g = nvfp4_quantize(x, block=nb, axis=ax_nv, rounding=rounding, rng=rng)
    return ScaledTensor(q4, d, f, _nvfp4_block(np.shape(q4), nb, ax_nv), global_scale=g)
