"""Float (FP8) fake quantization: quantize-dequantize through a float format with a scale and a straight-through
gradient. Public names are re-exported by :mod:`fpsim.quant`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._fpenv import ieee_mode
from .._interop import returns_input_kind
from ..formats import FormatLike, as_format
from ..rounding import RoundingLike
from ..scaling._common import BlockLike, _as_float, _out
from ..scaling._tensor import _scaled
from ..scaling._tensor import fake_quantize as _float_fake_quantize
from ._fake import _float_input


# --------------------------------------------------------------------------------------------------
# Float (FP8) fake quantization


@ieee_mode
@returns_input_kind(dtype_option=False)
def fp8_fake_quantize(
    x: Any,
    fmt: FormatLike = "fp8_e4m3",
    scale: Any = 1.0,
    *,
    rounding: RoundingLike = "rne",
    overflow: str = "saturate",
    axis: int | None = None,
    block: BlockLike | None = None,
    rng: np.random.Generator | None = None,
) -> Any:
    """Quantize-dequantize through a float format: ``round(x * scale, fmt) * float32(1 / scale)``.

    Any float format works (``"fp8_e4m3"``, ``"fp8_e5m2"``, ``"fp4_e2m1"``, ``"bf16"``, ...). Scales
    follow :func:`fpsim.scaling.quantize` (per tensor, ``axis=``, ``block=``); overflow saturates by
    default (TE's FP8 casts do). The gradient is :func:`fp8_fake_quantize_grad`.

    >>> import numpy as np
    >>> fp8_fake_quantize(np.float32([0.3, 1.0, 1000.0]), "fp8_e4m3").tolist()
    [0.3125, 1.0, 448.0]
    >>> fp8_fake_quantize(np.float32([0.3, 1000.0]), "fp8_e4m3", 0.25).tolist()
    [0.3125, 1024.0]
    """
    return _float_fake_quantize(x, fmt, scale, rounding=rounding, overflow=overflow, axis=axis, block=block, rng=rng)


@ieee_mode
@returns_input_kind(dtype_option=False)
def fp8_fake_quantize_grad(
    grad: Any,
    x: Any = None,
    fmt: FormatLike = "fp8_e4m3",
    scale: Any = 1.0,
    *,
    clip: bool = False,
    axis: int | None = None,
    block: BlockLike | None = None,
) -> Any:
    """Straight-through gradient of :func:`fp8_fake_quantize`: ``grad`` unchanged (a copy).

    ``clip=True`` instead zeroes the gradient where the scaled input saturated (``|x * scale| > fmt.max``
    or non-finite), the derivative of a clamp; it needs ``x``.

    >>> import numpy as np
    >>> g = np.ones(3, np.float32); x = np.float32([1.0, 500.0, -1e4])
    >>> fp8_fake_quantize_grad(g, x).tolist(), fp8_fake_quantize_grad(g, x, clip=True).tolist()
    ([1.0, 1.0, 1.0], [1.0, 0.0, 0.0])
    """
    f = as_format(fmt)
    g, scalar = _float_input(grad, "grad")
    if not clip:
        return _out(g.copy(), scalar)
    if x is None:
        raise ValueError("clip=True needs x")
    xs = _scaled(_as_float(x), scale, axis, block)
    with np.errstate(over="ignore", invalid="ignore"):
        out = g * (np.abs(xs) <= f.max).astype(g.dtype)
    return _out(np.asarray(out), scalar)
