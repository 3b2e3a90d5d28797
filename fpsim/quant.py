"""Fake quantization for quantization-aware training, bit-identical to PyTorch (CPU, torch 2.13).

* :func:`fake_quantize` / :func:`fake_quantize_grad`: ``torch.fake_quantize_per_tensor_affine`` and
  ``torch.fake_quantize_per_channel_affine``, forward and straight-through backward, with torch's
  float32 order of operations: ``inv = 1.0f / scale`` (multiply, never divide),
  ``q = nearbyint(x * inv) + zero_point`` (ties to even; zero point added *after* rounding),
  ``y = (clamp(q, qmin, qmax) - zero_point) * scale``; the gradient passes where the *unclamped*
  rounded ``q`` lies in ``[qmin, qmax]``.
* Observers (:class:`MinMaxObserver`, :class:`MovingAverageMinMaxObserver` and the per-channel
  variants) computing the same scale and zero point as ``torch.ao.quantization``'s.
* :class:`FakeQuantize` (observer + fake quant, like ``torch.ao.quantization.FakeQuantize``) and the
  presets :func:`default_fake_quant`, :func:`default_weight_fake_quant`,
  :func:`default_per_channel_weight_fake_quant`.
* Learnable scale (LSQ): :func:`learnable_fake_quantize` / :func:`learnable_fake_quantize_grad`, as
  ``torch._fake_quantize_learnable_per_tensor_affine`` including its tie quirk.
* :func:`fp8_fake_quantize` / :func:`fp8_fake_quantize_grad`: quantize-dequantize through a float format
  with a scale and a straight-through gradient.

>>> import numpy as np, fpsim.quant as Q
>>> x = np.float32([-1.75, -0.25, 0.25, 0.3, 63.75])
>>> Q.fake_quantize(x, 0.5, 0, -128, 127).tolist()     # ties to even; 63.75 -> 127.5 -> 128 clamps
[-2.0, 0.0, 0.0, 0.5, 63.5]
>>> Q.fake_quantize_grad(np.ones(5, np.float32), x, 0.5, 0, -128, 127).tolist()
[1.0, 1.0, 1.0, 1.0, 0.0]
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ._fpenv import ieee_mode
from ._interop import returns_input_kind
from .formats import FormatLike, as_format
from .rounding import RoundingLike
from .scaling import BlockLike, _as_float, _out, _scaled
from .scaling import fake_quantize as _float_fake_quantize

__all__ = [
    "FakeQuantize",
    "MinMaxObserver",
    "MovingAverageMinMaxObserver",
    "MovingAveragePerChannelMinMaxObserver",
    "ObserverBase",
    "PerChannelMinMaxObserver",
    "default_fake_quant",
    "default_per_channel_weight_fake_quant",
    "default_weight_fake_quant",
    "fake_quantize",
    "fake_quantize_grad",
    "fake_quantize_with_mask",
    "fp8_fake_quantize",
    "fp8_fake_quantize_grad",
    "learnable_fake_quantize",
    "learnable_fake_quantize_grad",
    "lsq_grad_factor",
    "quant_range",
]

# NF4 (QLoRA) lives in its own module (fpsim/quant_nf4.py); re-exported here under fpsim.quant.*.
from .quant_nf4 import (NF4, NF4Absmax, NF4Tensor, dynamic_map, nf4_bits_per_parameter,  # noqa: E402
                        nf4_dequantize, nf4_quantize)

__all__ += ["NF4", "NF4Absmax", "NF4Tensor", "dynamic_map", "nf4_bits_per_parameter", "nf4_dequantize",
            "nf4_quantize"]

_F32 = np.float32
_EPS32 = float(np.finfo(np.float32).eps)
_CHUNK = 1 << 16
_TWO63 = float(2**63)


# --------------------------------------------------------------------------------------------------
# Argument handling


def _int(name: str, v: Any) -> int:
    if isinstance(v, np.ndarray) and v.size == 1:
        v = v.reshape(()).item()
    if isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{name} must be an int, got a bool: {v!r}")
    if isinstance(v, (float, np.floating)):
        if not float(v).is_integer():
            raise ValueError(f"{name} must be an integer, got {v!r}")
        return int(v)
    if not isinstance(v, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(v).__name__}: {v!r}")
    return int(v)


def _check_range(quant_min: Any, quant_max: Any) -> tuple[int, int]:
    qmin = _int("quant_min", quant_min)
    qmax = _int("quant_max", quant_max)
    if qmin > qmax:
        raise ValueError(f"quant_min ({qmin}) must be <= quant_max ({qmax})")
    return qmin, qmax


def _per_tensor_zp(zero_point: Any, qmin: int, qmax: int) -> int:
    zp = _int("zero_point", zero_point)
    if not qmin <= zp <= qmax:
        raise ValueError(f"zero_point ({zp}) must be between quant_min ({qmin}) and quant_max ({qmax})")
    return zp


def _scalar_scale(scale: Any) -> np.float32:
    s = np.asarray(_as_float(scale, "scale"))
    if s.size != 1:
        raise ValueError(f"per-tensor scale must be a scalar or a 1-element array, got shape {s.shape}; "
                         "for per-channel scales pass axis=")
    with np.errstate(over="ignore"):  # as torch's double -> float: beyond float32's range is ±inf
        out: np.float32 = _F32(s.reshape(()))
    return out


def _float_input(x: Any, name: str = "x") -> tuple[np.ndarray, bool]:
    scalar = np.isscalar(x)
    a = _as_float(x, name)
    return a, scalar


def _fma32(a: Any, b: Any, c: Any) -> np.ndarray:
    """``float32(a * b + c)`` rounded once (a fused multiply-add), for float32 operands.

    torch's CPU kernels are compiled with FMA contraction in a few places (the learnable op's backward,
    the float-zero-point per-channel op); rounding the product first would differ near ties. The
    product is exact in float64; the sum is rounded to float64 and then to float32, and the rare
    double-rounding case (a float64 sum exactly halfway between two float32 values while the exact
    sum is not) is corrected with the TwoSum error term.
    """
    p = np.asarray(a, dtype=np.float64) * np.asarray(b, dtype=np.float64)
    c64 = np.asarray(c, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        s = p + c64
        bb = s - p
        err = (p - (s - bb)) + (c64 - bb)  # TwoSum: s + err == p + c exactly
        r = s.astype(_F32)
        r64 = r.astype(np.float64)
        toward = np.where(s > r64, _F32(np.inf), _F32(-np.inf))
        other = np.nextafter(r, toward).astype(np.float64)
        tie = (s != r64) & np.isfinite(s) & ((r64 + other) * 0.5 == s) & (err != 0)
        if np.any(tie):
            # the exact sum lies beyond the midpoint on err's side
            up = err > 0
            pick_other = np.where(up, other > r64, other < r64)
            r = np.where(tie & pick_other, other.astype(_F32), r).astype(_F32)
    return np.asarray(r, dtype=_F32)


# --------------------------------------------------------------------------------------------------
# Integer fake quantization


def _fq_per_tensor(x: np.ndarray, scale: np.float32, zp: int, qmin: int, qmax: int,
                   want_mask: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """torch's per-tensor cachemask kernel on a float32 or float64 array (chunked, in place on buffers).

    torch 2.13 CPU: NaN -> qmin, ±inf and huge values clamp (an ``fmax``/``fmin`` clamp in floating point).
    """
    dt = x.dtype.type
    s = dt(scale)
    with np.errstate(divide="ignore", over="ignore"):
        inv = dt(_F32(_F32(1.0) / scale))
    zpf, lo, hi = dt(zp), dt(qmin), dt(qmax)
    src = np.ascontiguousarray(x).reshape(-1)
    out = np.empty_like(src)
    mask = np.empty(src.shape, dtype=bool) if want_mask else None
    buf = np.empty(min(_CHUNK, src.size), dtype=src.dtype)
    tmp = np.empty(min(_CHUNK, src.size), dtype=bool) if want_mask else None
    with np.errstate(invalid="ignore", over="ignore"):
        for i in range(0, src.size, _CHUNK):
            xc = src[i : i + _CHUNK]
            n = xc.size
            t = buf[:n]
            np.multiply(xc, inv, out=t)
            np.rint(t, out=t)
            np.add(t, zpf, out=t)  # also turns -0 into +0, as torch's integer q does
            if mask is not None and tmp is not None:
                m = mask[i : i + n]
                np.greater_equal(t, lo, out=m)
                np.less_equal(t, hi, out=tmp[:n])
                np.logical_and(m, tmp[:n], out=m)
            np.fmax(t, lo, out=t)
            np.fmin(t, hi, out=t)
            if zp:
                np.subtract(t, zpf, out=t)
            if dt is _F32:
                np.multiply(t, s, out=out[i : i + n])
            else:  # torch rounds the output product to float32 even for float64 inputs
                out[i : i + n] = (t.astype(_F32) * _F32(scale)).astype(dt)
    return out.reshape(x.shape), None if mask is None else mask.reshape(x.shape)


def _fq_per_channel(x: np.ndarray, scale: np.ndarray, zp: np.ndarray, axis: int, qmin: int, qmax: int
                    ) -> tuple[np.ndarray, np.ndarray]:
    """torch's per-channel cachemask kernel: like per tensor, but the rounded value goes through an
    int64 conversion (NaN and |q| >= 2**63 become INT64_MIN, so they clamp to qmin)."""
    dt = x.dtype.type
    if zp.dtype.kind != "f" and x.size:
        return _fq_per_channel_int(x, scale, zp, axis, qmin, qmax)
    shape = [1] * x.ndim
    shape[axis] = -1
    s32 = scale.astype(_F32)
    with np.errstate(divide="ignore", over="ignore"):
        inv = (_F32(1.0) / s32).astype(dt).reshape(shape)
    float_zp = zp.dtype.kind == "f"
    with np.errstate(invalid="ignore", over="ignore"):
        if float_zp:
            # per_channel_affine_float_qparams: lrintf(zp + x * inv), zp joins before rounding.
            zpb = zp.astype(_F32).astype(dt).reshape(shape)
            if dt is _F32:  # lrintf(fma(x, inv, zp)): torch's build contracts the multiply-add
                t = np.rint(_fma32(x, inv, zpb)) + dt(0.0)  # an integer result: no -0
            else:
                t = np.rint((x * inv).astype(dt) + zpb) + dt(0.0)
        else:
            zpb = zp.astype(np.int64).astype(dt).reshape(shape)
            t = np.rint(x * inv) + zpb
        t = np.asarray(t, dtype=dt)
        bad = ~(np.abs(t) < dt(_TWO63))
        if np.any(bad):
            t = np.where(bad, dt(-_TWO63), t)
        mask = (t >= dt(qmin)) & (t <= dt(qmax))
        c = np.minimum(np.maximum(t, dt(qmin)), dt(qmax))
        if float_zp:
            # (double(clamped) - float zp) * float scale, in double, then stored in the input's dtype.
            y = ((c.astype(np.float64) - zp.astype(_F32).astype(np.float64).reshape(shape))
                 * s32.astype(np.float64).reshape(shape)).astype(dt)
        else:
            y = ((c - zpb) * s32.astype(dt).reshape(shape)).astype(dt)
    return y, mask


def _fq_per_channel_int(x: np.ndarray, scale: np.ndarray, zp: np.ndarray, axis: int, qmin: int, qmax: int
                        ) -> tuple[np.ndarray, np.ndarray]:
    """Integer zero points: the same rule as :func:`_fq_per_channel`, chunked over a (A*C, B) view so
    that the temporaries stay in cache (x viewed as (A, C, B) with C the channel axis)."""
    dt = x.dtype.type
    C = x.shape[axis]
    A = int(np.prod(x.shape[:axis], dtype=np.int64))
    B = int(np.prod(x.shape[axis + 1 :], dtype=np.int64))
    src = np.ascontiguousarray(x).reshape(A * C, B)
    s32 = scale.astype(_F32)
    with np.errstate(divide="ignore", over="ignore"):
        inv_rows = np.tile((_F32(1.0) / s32).astype(dt), A)
    s_rows = np.tile(s32.astype(dt), A)
    zp_rows = np.tile(zp.astype(np.int64).astype(dt), A)
    out = np.empty_like(src)
    mask = np.empty(src.shape, dtype=bool)
    lo, hi, big = dt(qmin), dt(qmax), dt(_TWO63)
    rows = max(1, _CHUNK // max(B, 1))
    cols = min(B, _CHUNK)
    with np.errstate(invalid="ignore", over="ignore"):
        for r in range(0, A * C, rows):
            rs = slice(r, r + rows)
            inv_c, s_c, zp_c = inv_rows[rs, None], s_rows[rs, None], zp_rows[rs, None]
            for c in range(0, B, cols):
                cs = slice(c, c + cols)
                t = src[rs, cs] * inv_c
                np.rint(t, out=t)
                np.add(t, zp_c, out=t)
                over = t >= big  # int64 conversion overflow -> INT64_MIN (NaN and -inf clamp there anyway)
                if over.any():
                    t[over] = -big
                m = mask[rs, cs]
                np.greater_equal(t, lo, out=m)
                m &= t <= hi
                np.fmax(t, lo, out=t)
                np.fmin(t, hi, out=t)
                np.subtract(t, zp_c, out=t)
                np.multiply(t, s_c, out=out[rs, cs])
    return out.reshape(x.shape), mask.reshape(x.shape)


@ieee_mode
@returns_input_kind(dtype_option=False)
def fake_quantize_with_mask(
    x: Any,
    scale: Any,
    zero_point: Any,
    quant_min: int,
    quant_max: int,
    *,
    axis: int | None = None,
) -> tuple[Any, Any]:
    """:func:`fake_quantize` that also returns the straight-through mask (bool, x's shape).

    ``dx = dy * mask`` is the backward pass (:func:`fake_quantize_grad`); keep the mask as the cache
    of an ``x_forward(...) -> (out, cache)`` pair.
    """
    qmin, qmax = _check_range(quant_min, quant_max)
    a, scalar = _float_input(x)
    if axis is None:
        s = _scalar_scale(scale)
        zp = _per_tensor_zp(zero_point, qmin, qmax)
        y, m = _fq_per_tensor(a, s, zp, qmin, qmax, True)
        assert m is not None
        return _out(y, scalar), _out(m, scalar)
    if a.ndim == 0:
        raise ValueError("per-channel fake quantization needs an array with at least one dimension")
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"axis must be an int, got {axis!r}")
    if not -a.ndim <= axis < a.ndim:
        raise ValueError(f"axis {axis} is out of range for an array with {a.ndim} dimension(s)")
    ax = int(axis) % a.ndim
    with np.errstate(over="ignore"):  # torch keeps scales in float32: beyond its range is ±inf
        sc = np.asarray(_as_float(scale, "scale"), dtype=_F32).reshape(-1)
    zpa = np.asarray(zero_point)
    if zpa.dtype.kind not in "iuf" or zpa.dtype == np.bool_:
        raise TypeError(f"zero_point must be integers (or floats for float qparams), got dtype {zpa.dtype}")
    zpa = zpa.reshape(-1)
    C = a.shape[ax]
    if sc.size != C or zpa.size != C:
        raise ValueError(f"axis {ax} has {C} channels but scale has {sc.size} and zero_point {zpa.size} entries")
    if zpa.dtype.kind != "f" and np.any((zpa < qmin) | (zpa > qmax)):
        raise ValueError(f"zero_point values must be between quant_min ({qmin}) and quant_max ({qmax})")
    y, m = _fq_per_channel(a, sc, zpa, ax, qmin, qmax)
    return y, m


@ieee_mode
@returns_input_kind(dtype_option=False)
def fake_quantize(
    x: Any,
    scale: Any,
    zero_point: Any,
    quant_min: int,
    quant_max: int,
    *,
    axis: int | None = None,
) -> Any:
    """Affine fake quantization, bit-identical to torch's CPU kernels.

    ``axis=None``: ``torch.fake_quantize_per_tensor_affine(x, scale, zero_point, quant_min, quant_max)``;
    ``axis=k``: ``torch.fake_quantize_per_channel_affine(x, scale, zero_point, k, quant_min, quant_max)``.

    In float32 (the input's precision; float64 inputs compute in float64 with the float32 scale):
    ``inv = float32(1 / float32(scale))``; ``q = nearbyint(x * inv) + zero_point`` (ties to even);
    ``y = (clamp(q, quant_min, quant_max) - zero_point) * scale``. Non-finite inputs follow torch
    2.13: per tensor NaN -> ``quant_min``, ±inf clamp; per channel NaN, ±inf and ``|q| >= 2**63`` ->
    ``quant_min`` (an out-of-range int64 conversion). A float ``zero_point`` with ``axis=`` is torch's
    ``per_channel_affine_float_qparams`` rule (zero point added *before* rounding).

    Parameters
    ----------
    x : array_like
        float32 (as torch) or float64 values; never modified.
    scale : float or array_like
        Per tensor: a scalar or 1-element array (used as float32). Per channel: ``x.shape[axis]`` values.
    zero_point : int or array_like
        Per tensor: an int in ``[quant_min, quant_max]``. Per channel: integers (or floats).
    quant_min, quant_max : int
        Integer range, e.g. 0, 255 (quint8) or -128, 127 (qint8).
    axis : int, optional
        Channel axis for per-channel quantization.

    Returns
    -------
    Fake-quantized values, x's dtype and shape.

    Examples
    --------
    >>> import numpy as np
    >>> fake_quantize(np.float32([0.25, 0.75, 1.25, -0.25]), 0.5, 3, 0, 255).tolist()
    [0.0, 1.0, 1.0, 0.0]
    >>> x = np.float32([[0.25, 0.75, 64, -64.5], [0.125, 0.375, 33, -31]])
    >>> fake_quantize(x, [0.5, 0.25], [0, 2], -128, 127, axis=0).tolist()
    [[0.0, 1.0, 63.5, -64.0], [0.0, 0.5, 31.25, -31.0]]
    """
    if axis is None:  # the forward alone skips building the mask
        qmin, qmax = _check_range(quant_min, quant_max)
        zp = _per_tensor_zp(zero_point, qmin, qmax)
        a, scalar = _float_input(x)
        y1, _ = _fq_per_tensor(a, _scalar_scale(scale), zp, qmin, qmax, False)
        return _out(y1, scalar)
    y, _ = fake_quantize_with_mask(x, scale, zero_point, quant_min, quant_max, axis=axis)
    return y


@ieee_mode
@returns_input_kind(dtype_option=False)
def fake_quantize_grad(
    grad: Any,
    x: Any,
    scale: Any,
    zero_point: Any,
    quant_min: int,
    quant_max: int,
    *,
    axis: int | None = None,
) -> Any:
    """Backward of :func:`fake_quantize`: ``grad * mask`` (straight-through estimator).

    ``mask`` is true where the *unclamped* rounded value ``q = nearbyint(x * inv) + zero_point`` lies in
    ``[quant_min, quant_max]`` — so ``x / scale`` in ``[quant_max, quant_max + 0.5]`` (ties to even
    permitting) still passes, unlike LSQ's clip-before-round. As torch computes ``grad * mask``, a NaN
    or inf gradient where the mask is false gives NaN (not 0). No gradient reaches scale or zero point.

    >>> import numpy as np
    >>> x = np.float32([63.5, 63.7, -64.0, -64.25, 63.75, -64.5])
    >>> fake_quantize_grad(np.ones(6, np.float32), x, 0.5, 0, -128, 127).tolist()
    [1.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    """
    _, m = fake_quantize_with_mask(x, scale, zero_point, quant_min, quant_max, axis=axis)
    g, scalar = _float_input(grad, "grad")
    mk = np.asarray(m)
    if g.shape != mk.shape:
        try:
            g = np.broadcast_to(g, mk.shape)
        except ValueError:
            raise ValueError(f"grad of shape {g.shape} does not match x of shape {mk.shape}") from None
    with np.errstate(invalid="ignore"):
        out = g * mk.astype(g.dtype)
    return _out(np.asarray(out), scalar and mk.ndim == 0)


# --------------------------------------------------------------------------------------------------
# Observers

_DTYPES = ("quint8", "qint8", "uint8", "int8", "qint32", "int32", "uint16", "int16", "quint4x2")
_QSCHEMES = ("per_tensor_affine", "per_tensor_symmetric", "per_channel_affine", "per_channel_symmetric",
             "per_channel_affine_float_qparams")


@ieee_mode
def quant_range(dtype: str = "quint8", *, reduce_range: bool = False, quant_min: int | None = None,
                quant_max: int | None = None) -> tuple[int, int]:
    """Integer range of a quantized dtype, as torch's ``calculate_qmin_qmax``.

    >>> quant_range("quint8"), quant_range("qint8"), quant_range("quint8", reduce_range=True)
    ((0, 255), (-128, 127), (0, 127))
    >>> quant_range("quint8", quant_min=0, quant_max=255, reduce_range=True)
    (0, 127)
    """
    if dtype not in _DTYPES:
        raise ValueError(f"unknown quantized dtype {dtype!r}; valid: {', '.join(_DTYPES)}")
    if quant_min is not None and quant_max is not None:
        qmin, qmax = _int("quant_min", quant_min), _int("quant_max", quant_max)
        if not qmin <= 0 <= qmax:
            raise ValueError(f"user-specified quantization range [{qmin}, {qmax}] must include 0")
        if qmin >= qmax:
            raise ValueError(f"quant_min ({qmin}) must be less than quant_max ({qmax})")
        n = qmax - qmin + 1
        if dtype in ("qint8", "int8") and not 0 < n <= 256:
            raise ValueError(f"quantization range [{qmin}, {qmax}] is too large for {dtype}")
        if reduce_range:
            qmin, qmax = qmin // 2, qmax // 2
        return qmin, qmax
    if dtype in ("qint8", "int8"):
        return (-64, 63) if reduce_range else (-128, 127)
    if dtype in ("quint8", "uint8"):
        return (0, 127) if reduce_range else (0, 255)
    if dtype in ("qint32", "int32"):
        return -(2**31), 2**31 - 1
    if dtype == "uint16":
        return 0, 2**16 - 1
    if dtype == "int16":
        return -(2**15), 2**15 - 1
    return 0, 15


@ieee_mode
class ObserverBase:
    """Shared parts of torch's uniform quantization observers (qparams from running min/max).

    Parameters (as torch): ``dtype`` (``"quint8"``, ``"qint8"``, ...), ``qscheme``
    (``"per_tensor_affine"``, ``"per_tensor_symmetric"``, per-channel names for per-channel observers),
    ``reduce_range``, ``quant_min``/``quant_max`` (a custom range; both or neither), ``eps`` (lower bound
    on the scale, float32 machine epsilon 2**-23 by default).

    Calling an observer on a batch updates ``min_val``/``max_val`` (float32) and returns the batch
    unchanged; :meth:`calculate_qparams` returns ``(scale, zero_point)``: float32 and int64 arrays of shape
    ``(1,)`` (per tensor) or ``(C,)`` (per channel).
    """

    _per_channel = False

    def __init__(self, dtype: str = "quint8", qscheme: str = "per_tensor_affine", reduce_range: bool = False,
                 quant_min: int | None = None, quant_max: int | None = None, eps: float = _EPS32) -> None:
        if dtype not in _DTYPES:
            raise ValueError(f"unknown quantized dtype {dtype!r}; valid: {', '.join(_DTYPES)}")
        if qscheme not in _QSCHEMES:
            raise ValueError(f"unknown qscheme {qscheme!r}; valid: {', '.join(_QSCHEMES)}")
        if qscheme.startswith("per_channel") != self._per_channel:
            kind = "per-channel" if self._per_channel else "per-tensor"
            raise ValueError(f"{type(self).__name__} is a {kind} observer; qscheme {qscheme!r} does not fit")
        if reduce_range and dtype in ("quint8", "uint8") and qscheme.endswith("symmetric"):
            raise NotImplementedError("Cannot reduce range for symmetric quantization for quint8 (as torch)")
        if (quant_min is None) != (quant_max is None):
            raise ValueError("give both quant_min and quant_max, or neither")
        self.dtype = dtype
        self.qscheme = qscheme
        self.reduce_range = bool(reduce_range)
        self.has_customized_qrange = quant_min is not None and quant_max is not None
        self.quant_min, self.quant_max = quant_range(dtype, reduce_range=reduce_range, quant_min=quant_min,
                                                     quant_max=quant_max)
        self.eps = _F32(eps)
        self.min_val: np.ndarray = np.zeros(0, _F32)
        self.max_val: np.ndarray = np.zeros(0, _F32)
        self.reset_min_max_vals()

    def reset_min_max_vals(self) -> None:
        """Forget what was observed (torch: +inf / -inf per tensor, empty per channel)."""
        if self._per_channel:
            self.min_val = np.zeros(0, _F32)
            self.max_val = np.zeros(0, _F32)
        else:
            self.min_val = np.array(np.inf, dtype=_F32)
            self.max_val = np.array(-np.inf, dtype=_F32)

    def __call__(self, x: Any) -> Any:
        """Observe a batch (cast to float32 like torch) and return it unchanged."""
        a = _as_float(x)
        if a.size:
            self._observe(a.astype(_F32, copy=False))
        return x

    forward = __call__

    def _observe(self, x: np.ndarray) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _valid(self) -> bool:
        mn, mx = self.min_val, self.max_val
        if mn.size == 0 or mx.size == 0:
            return False
        if mn.ndim == 0 and mn == np.inf and mx == -np.inf:
            return False
        if not np.all(mn <= mx):
            raise ValueError(f"min {mn} should be less than max {mx} (NaN observed?)")
        return True

    def calculate_qparams(self) -> tuple[np.ndarray, np.ndarray]:
        """(scale float32, zero_point int64) from the observed min/max, as torch's ``_calculate_qparams``.

        Symmetric: ``scale = max(-min_neg, max_pos) / ((qmax - qmin) / 2)``, at least eps; zero point 0,
        or 128 for quint8 (``(qmin + qmax) // 2`` with a custom range, 2**15 for uint16). Affine:
        ``scale = max((max_pos - min_neg) / (qmax - qmin), eps)``,
        ``zp = clamp(qmin - round(min_neg / scale), qmin, qmax)`` (ties to even), where
        ``min_neg = min(min, 0)`` and ``max_pos = max(max, 0)``. All float32. Nothing observed:
        scale 1, zero point 0.
        """
        if not self._valid():
            return np.array([1.0], dtype=_F32), np.array([0], dtype=np.int64)
        mn = np.asarray(self.min_val, dtype=_F32)
        mx = np.asarray(self.max_val, dtype=_F32)
        qmin, qmax = self.quant_min, self.quant_max
        min_neg = np.minimum(mn, _F32(0))
        max_pos = np.maximum(mx, _F32(0))
        zp = np.zeros(min_neg.shape, dtype=np.int64)
        with np.errstate(divide="ignore", invalid="ignore"):
            if self.qscheme.endswith("symmetric"):
                m = np.maximum(-min_neg, max_pos)
                scale = (m / _F32((qmax - qmin) / 2)).astype(_F32)
                scale = np.maximum(scale, self.eps)
                if self.dtype in ("quint8", "uint8"):
                    zp[...] = (qmin + qmax) // 2 if self.has_customized_qrange else 128
                elif self.dtype == "uint16":
                    zp[...] = 2**15
            elif self.qscheme == "per_channel_affine_float_qparams":
                scale = ((mx - mn) / _F32(qmax - qmin)).astype(_F32)
                scale = np.where(scale > self.eps, scale, _F32(1.0)).astype(_F32)
                zpf = (_F32(-1) * mn / scale).astype(_F32)
                return np.atleast_1d(scale), np.atleast_1d(zpf)
            else:
                scale = ((max_pos - min_neg) / _F32(qmax - qmin)).astype(_F32)
                scale = np.maximum(scale, self.eps)
                r = np.rint((min_neg / scale).astype(_F32)).astype(np.int64)
                zp = np.clip(qmin - r, qmin, qmax).astype(np.int64)
        return np.atleast_1d(np.asarray(scale, dtype=_F32)), np.atleast_1d(zp)

    def state_dict(self) -> dict[str, Any]:
        """min_val / max_val as lists (plus the configuration, for checking on load)."""
        return {"dtype": self.dtype, "qscheme": self.qscheme, "quant_min": self.quant_min,
                "quant_max": self.quant_max, "min_val": np.asarray(self.min_val).tolist(),
                "max_val": np.asarray(self.max_val).tolist()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("dtype", "qscheme", "quant_min", "quant_max"):
            if key in state and state[key] != getattr(self, key):
                raise ValueError(f"state has {key}={state[key]!r}, this observer has {getattr(self, key)!r}")
        if "min_val" not in state or "max_val" not in state:
            raise ValueError("state_dict needs min_val and max_val")
        self.min_val = np.asarray(state["min_val"], dtype=_F32)
        self.max_val = np.asarray(state["max_val"], dtype=_F32)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(dtype={self.dtype!r}, qscheme={self.qscheme!r}, "
                f"quant_min={self.quant_min}, quant_max={self.quant_max}, min_val={self.min_val}, "
                f"max_val={self.max_val})")


def _aminmax(x: np.ndarray) -> tuple[np.float32, np.float32]:
    return _F32(x.min()), _F32(x.max())  # NaN propagates, as torch.aminmax


@ieee_mode
class MinMaxObserver(ObserverBase):
    """Running min and max over all batches (``torch.ao.quantization.MinMaxObserver``).

    >>> import numpy as np
    >>> ob = MinMaxObserver()
    >>> _ = ob(np.float32([-1, 3]))
    >>> s, zp = ob.calculate_qparams()
    >>> float(s[0]), int(zp[0])
    (0.01568627543747425, 64)
    """

    def _observe(self, x: np.ndarray) -> None:
        lo, hi = _aminmax(x)
        self.min_val = np.asarray(np.minimum(lo, self.min_val), dtype=_F32)  # NaN propagates, as torch.min
        self.max_val = np.asarray(np.maximum(hi, self.max_val), dtype=_F32)


@ieee_mode
class MovingAverageMinMaxObserver(ObserverBase):
    """Exponential moving average of batch min/max (``averaging_constant`` c, default 0.01).

    The first batch sets min/max; later ``min += c * (batch_min - min)`` (float32, c as float32).

    >>> import numpy as np
    >>> ob = MovingAverageMinMaxObserver()
    >>> for b in ([-1, 2], [-3, 6]):
    ...     _ = ob(np.float32(b))
    >>> float(ob.min_val), float(ob.max_val)
    (-1.0199999809265137, 2.0399999618530273)
    """

    def __init__(self, averaging_constant: float = 0.01, dtype: str = "quint8",
                 qscheme: str = "per_tensor_affine", reduce_range: bool = False, quant_min: int | None = None,
                 quant_max: int | None = None, eps: float = _EPS32) -> None:
        self.averaging_constant = float(averaging_constant)
        super().__init__(dtype, qscheme, reduce_range, quant_min, quant_max, eps)

    def _observe(self, x: np.ndarray) -> None:
        lo, hi = _aminmax(x)
        if self.min_val == np.inf and self.max_val == -np.inf:
            self.min_val, self.max_val = np.asarray(lo), np.asarray(hi)
            return
        c = _F32(self.averaging_constant)
        self.min_val = np.asarray(_F32(self.min_val + _F32(c * _F32(lo - self.min_val))))
        self.max_val = np.asarray(_F32(self.max_val + _F32(c * _F32(hi - self.max_val))))


def _per_channel_minmax(x: np.ndarray, ch_axis: int) -> tuple[np.ndarray, np.ndarray]:
    if x.ndim == 0:
        raise ValueError("per-channel observers need an array with at least one dimension")
    if not -x.ndim <= ch_axis < x.ndim:
        raise ValueError(f"ch_axis {ch_axis} is out of range for an array with {x.ndim} dimension(s)")
    y = np.moveaxis(x, ch_axis, 0).reshape(x.shape[ch_axis], -1)
    return y.min(axis=1).astype(_F32), y.max(axis=1).astype(_F32)


@ieee_mode
class PerChannelMinMaxObserver(ObserverBase):
    """Running min/max per channel along ``ch_axis`` (``torch.ao.quantization.PerChannelMinMaxObserver``).

    >>> import numpy as np
    >>> ob = PerChannelMinMaxObserver(ch_axis=0, dtype="qint8", qscheme="per_channel_symmetric")
    >>> _ = ob(np.float32([[-1, 3], [0.5, 0.25]]))
    >>> s, zp = ob.calculate_qparams()
    >>> s.tolist(), zp.tolist()
    ([0.0235294122248888, 0.003921568859368563], [0, 0])
    """

    _per_channel = True

    def __init__(self, ch_axis: int = 0, dtype: str = "quint8", qscheme: str = "per_channel_affine",
                 reduce_range: bool = False, quant_min: int | None = None, quant_max: int | None = None,
                 eps: float = _EPS32) -> None:
        self.ch_axis = int(ch_axis)
        super().__init__(dtype, qscheme, reduce_range, quant_min, quant_max, eps)

    def _observe(self, x: np.ndarray) -> None:
        lo, hi = _per_channel_minmax(x, self.ch_axis)
        if self.min_val.size == 0 or self.max_val.size == 0:
            self.min_val, self.max_val = lo, hi
        else:
            self.min_val = np.minimum(lo, self.min_val)
            self.max_val = np.maximum(hi, self.max_val)


@ieee_mode
class MovingAveragePerChannelMinMaxObserver(PerChannelMinMaxObserver):
    """Per-channel moving-average min/max (``torch.ao.quantization.MovingAveragePerChannelMinMaxObserver``)."""

    def __init__(self, averaging_constant: float = 0.01, ch_axis: int = 0, dtype: str = "quint8",
                 qscheme: str = "per_channel_affine", reduce_range: bool = False, quant_min: int | None = None,
                 quant_max: int | None = None, eps: float = _EPS32) -> None:
        self.averaging_constant = float(averaging_constant)
        super().__init__(ch_axis, dtype, qscheme, reduce_range, quant_min, quant_max, eps)

    def _observe(self, x: np.ndarray) -> None:
        lo, hi = _per_channel_minmax(x, self.ch_axis)
        if self.min_val.size == 0 or self.max_val.size == 0:
            self.min_val, self.max_val = lo, hi
            return
        c = _F32(self.averaging_constant)
        self.min_val = (self.min_val + (c * (lo - self.min_val).astype(_F32)).astype(_F32)).astype(_F32)
        self.max_val = (self.max_val + (c * (hi - self.max_val).astype(_F32)).astype(_F32)).astype(_F32)


@ieee_mode
class FakeQuantize:
    """Observer + fake quantization, like ``torch.ao.quantization.FakeQuantize``.

    ``forward(x)``: if ``observer_enabled``, observe ``x`` and copy the observer's qparams into
    ``scale``/``zero_point`` (the batch affects its own qparams); then, if ``fake_quant_enabled``,
    fake-quantise (per channel along the observer's ``ch_axis`` for per-channel observers).
    ``backward(dy)`` applies the straight-through mask cached by the last forward.

    >>> import numpy as np
    >>> fq = default_fake_quant()
    >>> y = fq(np.float32([-1.0, 0.5, 2.0]))
    >>> float(fq.scale[0]), int(fq.zero_point[0]), y.tolist()
    (0.023622047156095505, 42, [-0.9921259880065918, 0.4960629940032959, 2.007874011993408])
    """

    def __init__(self, observer: type[ObserverBase] = MovingAverageMinMaxObserver, quant_min: int | None = None,
                 quant_max: int | None = None, **observer_kwargs: Any) -> None:
        if quant_min is not None and quant_max is not None:
            if quant_min > quant_max:
                raise ValueError(f"quant_min ({quant_min}) must be <= quant_max ({quant_max})")
            observer_kwargs["quant_min"] = quant_min
            observer_kwargs["quant_max"] = quant_max
        self.activation_post_process: ObserverBase = observer(**observer_kwargs)
        self.quant_min = self.activation_post_process.quant_min
        self.quant_max = self.activation_post_process.quant_max
        self.is_per_channel = self.activation_post_process.qscheme.startswith("per_channel")
        self.ch_axis = int(getattr(self.activation_post_process, "ch_axis", -1)) if self.is_per_channel else -1
        self.scale: np.ndarray = np.array([1.0], dtype=_F32)
        self.zero_point: np.ndarray = np.array([0], dtype=np.int32)
        self.fake_quant_enabled = True
        self.observer_enabled = True
        self._mask: np.ndarray | None = None

    def calculate_qparams(self) -> tuple[np.ndarray, np.ndarray]:
        return self.activation_post_process.calculate_qparams()

    def enable_fake_quant(self, enabled: bool = True) -> FakeQuantize:
        self.fake_quant_enabled = bool(enabled)
        return self

    def disable_fake_quant(self) -> FakeQuantize:
        return self.enable_fake_quant(False)

    def enable_observer(self, enabled: bool = True) -> FakeQuantize:
        self.observer_enabled = bool(enabled)
        return self

    def disable_observer(self) -> FakeQuantize:
        return self.enable_observer(False)

    def forward(self, x: Any) -> Any:
        a = _as_float(x)
        if self.observer_enabled:
            self.activation_post_process(a)
            s, zp = self.calculate_qparams()
            self.scale = s.astype(_F32)
            self.zero_point = zp.astype(np.float32 if zp.dtype.kind == "f" else np.int32)
        if not self.fake_quant_enabled:
            self._mask = None
            return a
        if self.is_per_channel:
            y, m = fake_quantize_with_mask(a, self.scale, self.zero_point, self.quant_min, self.quant_max,
                                           axis=self.ch_axis)
        else:
            y, m = fake_quantize_with_mask(a, self.scale, int(self.zero_point[0]), self.quant_min, self.quant_max)
        self._mask = np.asarray(m)
        return y

    __call__ = forward

    def backward(self, dy: Any) -> Any:
        """``dy * mask`` of the last forward (identity if fake quantization was off)."""
        g = _as_float(dy, "dy")
        if self._mask is None:
            return g
        with np.errstate(invalid="ignore"):
            return g * self._mask.astype(g.dtype)

    def state_dict(self) -> dict[str, Any]:
        return {"scale": self.scale.tolist(), "zero_point": self.zero_point.tolist(),
                "fake_quant_enabled": self.fake_quant_enabled, "observer_enabled": self.observer_enabled,
                "observer": self.activation_post_process.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale = np.asarray(state["scale"], dtype=_F32).reshape(-1)
        zp = np.asarray(state["zero_point"]).reshape(-1)
        self.zero_point = zp.astype(np.float32 if zp.dtype.kind == "f" else np.int32)
        self.fake_quant_enabled = bool(state.get("fake_quant_enabled", True))
        self.observer_enabled = bool(state.get("observer_enabled", True))
        if "observer" in state:
            self.activation_post_process.load_state_dict(state["observer"])


@ieee_mode
def default_fake_quant() -> FakeQuantize:
    """torch's ``default_fake_quant``: moving-average observer, quint8 affine, [0, 255] with
    ``reduce_range=True`` (effective [0, 127])."""
    return FakeQuantize(MovingAverageMinMaxObserver, quant_min=0, quant_max=255, dtype="quint8",
                        qscheme="per_tensor_affine", reduce_range=True)


@ieee_mode
def default_weight_fake_quant() -> FakeQuantize:
    """torch's ``default_weight_fake_quant``: moving-average observer, qint8 symmetric [-128, 127]."""
    return FakeQuantize(MovingAverageMinMaxObserver, quant_min=-128, quant_max=127, dtype="qint8",
                        qscheme="per_tensor_symmetric", reduce_range=False)


@ieee_mode
def default_per_channel_weight_fake_quant() -> FakeQuantize:
    """torch's ``default_per_channel_weight_fake_quant``: per-channel moving average, qint8 symmetric, axis 0."""
    return FakeQuantize(MovingAveragePerChannelMinMaxObserver, quant_min=-128, quant_max=127, dtype="qint8",
                        qscheme="per_channel_symmetric", reduce_range=False, ch_axis=0)


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
