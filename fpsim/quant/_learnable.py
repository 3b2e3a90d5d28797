"""Learnable scale (LSQ), as ``torch._fake_quantize_learnable_per_tensor_affine`` including its tie quirk.
Public names are re-exported by :mod:`fpsim.quant`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._fpenv import ieee_mode
from .._interop import returns_input_kind
from ..scaling._common import _as_float, _out
from ._fake import _F32, _TWO63, _check_range, _float_input, _fma32, _fq_per_tensor, _int, _scalar_scale


# --------------------------------------------------------------------------------------------------
# Learnable scale (LSQ) as torch._fake_quantize_learnable_per_tensor_affine


def _zp_from_tensor(zero_point: Any, qmin: int, qmax: int, forward: bool) -> int:
    z = _F32(np.asarray(_as_float(zero_point, "zero_point")).reshape(-1)[0])
    z = _F32(np.rint(z)) if forward else _F32(z + _F32(0.5))
    z = min(max(z, _F32(qmin)), _F32(qmax))
    return int(np.trunc(z))


@ieee_mode
def lsq_grad_factor(numel: int, quant_max: int) -> float:
    """LSQ's step-size gradient scale ``1 / sqrt(numel * quant_max)`` (torch ``_LearnableFakeQuantize``)."""
    n, q = _int("numel", numel), _int("quant_max", quant_max)
    if n <= 0 or q <= 0:
        raise ValueError(f"numel and quant_max must be positive, got {n}, {q}")
    return 1.0 / math.sqrt(n * q)


@ieee_mode
@returns_input_kind(dtype_option=False)
def learnable_fake_quantize(x: Any, scale: Any, zero_point: Any, quant_min: int, quant_max: int) -> Any:
    """Forward of ``torch._fake_quantize_learnable_per_tensor_affine``: the ordinary per-tensor op with
    ``scale`` as float32 and ``zero_point = int(clamp(nearbyint(zero_point), qmin, qmax))``."""
    qmin, qmax = _check_range(quant_min, quant_max)
    zp = _zp_from_tensor(zero_point, qmin, qmax, True)
    a, scalar = _float_input(x)
    with np.errstate(over="ignore"):  # the op is float32: float64 beyond its range becomes ±inf
        a = a.astype(_F32, copy=False)
    y, _ = _fq_per_tensor(a, _scalar_scale(scale), zp, qmin, qmax, False)
    return _out(y, scalar)


@ieee_mode
@returns_input_kind(dtype_option=False)
def learnable_fake_quantize_grad(
    grad: Any,
    x: Any,
    scale: Any,
    zero_point: Any,
    quant_min: int,
    quant_max: int,
    grad_factor: float = 1.0,
    *,
    reduce: bool = True,
) -> tuple[Any, Any, Any]:
    """Backward of ``torch._fake_quantize_learnable_per_tensor_affine``: ``(dx, dscale, dzero_point)``.

    torch's CPU kernel, in float32: ``zp = int(clamp(zero_point + 0.5, qmin, qmax))`` (truncated) and
    ``xq = nearbyint(zp + x * inv)`` — the zero point joins *before* rounding, unlike the forward
    (``nearbyint(x * inv) + zp``). On ties with an odd zero point the two disagree: the forward value
    comes from one integer while the mask and the scale gradient use its neighbour (e.g. s 0.5, zp 3,
    [0, 255], x = 126.25: forward 126 from q = 255, but xq = 256 is out of range, so dx = 0 and
    dscale = 252 per element, whereas the ordinary op's dx is 1).

    In range: ``dx = dy``, ``dscale = dy * (xfq - x) * inv * grad_factor`` with
    ``xfq = (clamp(xq) - zp) * scale``, ``dzp = 0``. Out of range: ``dx = 0``,
    ``dscale = dy * (qmin - zp or qmax - zp) * grad_factor``, ``dzp = -dy * scale * grad_factor``.

    Parameters
    ----------
    reduce : bool
        True (torch): ``dscale`` and ``dzero_point`` are summed to 1-element float32 arrays with eight
        float32 lane accumulators, as torch's CPU sum of a short vector (bit-identical for many short
        lengths; torch's cascade for long vectors may differ in the last bits). False: the per-element
        float32 vectors, bit-identical to torch's before its sum.

    Examples
    --------
    >>> import numpy as np
    >>> x = np.float32([0.26, 0.74, -0.9, 10, -10, 3.1, 0.5])
    >>> dx, ds, dz = learnable_fake_quantize_grad(np.ones(7, np.float32), x, 0.5, 0.0, -8, 7)
    >>> dx.tolist(), float(ds[0]), float(dz[0])
    ([1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0], -1.3999996185302734, -1.0)
    """
    qmin, qmax = _check_range(quant_min, quant_max)
    s = _scalar_scale(scale)
    with np.errstate(divide="ignore", over="ignore"):
        inv = _F32(_F32(1.0) / s)
    zp = _zp_from_tensor(zero_point, qmin, qmax, False)
    gf = _F32(grad_factor)
    with np.errstate(over="ignore"):  # float64 beyond float32's range becomes ±inf (torch's float32 op)
        a = np.asarray(_as_float(x), dtype=_F32)
        dy = np.asarray(_as_float(grad, "grad"), dtype=_F32)
    if dy.shape != a.shape:
        raise ValueError(f"grad of shape {dy.shape} does not match x of shape {a.shape}")
    with np.errstate(invalid="ignore", over="ignore"):
        t = np.rint(_fma32(a, inv, _F32(zp)))  # nearbyint(zp + x * inv), contracted to an FMA by torch's build
        bad = ~(np.abs(t) < _F32(_TWO63))
        t = np.where(bad, _F32(-_TWO63), t).astype(_F32)
        inside = (t >= qmin) & (t <= qmax)
        below = t < qmin
        dx = (dy * inside.astype(_F32)).astype(_F32)
        c = np.minimum(np.maximum(t, _F32(qmin)), _F32(qmax))
        # xfq - x with xfq = (clamp(xq) - zp) * scale: torch's build fuses it, fma(clamp - zp, scale, -x)
        diff = _fma32((c - _F32(zp)).astype(_F32), s, -a)
        ds_in = ((((dy * diff).astype(_F32)) * inv).astype(_F32) * gf).astype(_F32)
        ds_out = (np.where(below, dy * _F32(qmin - zp), dy * _F32(qmax - zp)).astype(_F32) * gf).astype(_F32)
        dscale = np.where(inside, ds_in, ds_out).astype(_F32)
        dz_out = (((dy * _F32(-1)).astype(_F32) * s).astype(_F32) * gf).astype(_F32)
        dzp = np.where(inside, _F32(0), dz_out).astype(_F32)
    if not reduce:
        return dx, dscale, dzp
    return dx, _torchlike_sum(dscale), _torchlike_sum(dzp)


def _torchlike_sum(v: np.ndarray) -> np.ndarray:
    """Sum to a 1-element float32 array the way torch's CPU sum does for short float32 vectors: eight
    float32 lane accumulators (element i into lane i % 8), then the lanes added in order. Matches torch
    bit for bit on the sizes checked (up to 4, 8, 9, 16, 17, 32, 33); for other and long vectors torch's
    tail handling and cascade differ in the last bits."""
    v = np.ascontiguousarray(v, dtype=_F32).reshape(-1)
    pad = (-v.size) % 8
    lanes = np.add.reduce(np.concatenate([v, np.zeros(pad, _F32)]).reshape(-1, 8), axis=0, dtype=_F32)
    return np.array([np.cumsum(lanes, dtype=_F32)[-1]], dtype=_F32)


