"""One scaled-tensor value for every recipe: :func:`quantize_scaled` returns a
:class:`~fpsim.mma.scaled.ScaledTensor` that Blackwell's block-scaled MMA takes. Re-exported by :mod:`fpsim.scaling`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._fpenv import ieee_mode
from .._names import parse_name
from ..formats import FormatLike, as_format
from ..mma.scaled import ScaledTensor
from ..rounding import RoundingLike
from ._common import BlockLike, _F32, _as_float, _block_shape, _norm_axis
from ._mx import _nvfp4_block, mx_quantize, nvfp4_quantize
from ._tensor import scale_and_quantize


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
