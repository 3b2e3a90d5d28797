"""Integer fake quantization, bit-identical to PyTorch (CPU, torch 2.13): ``torch.fake_quantize_per_tensor_affine``
and ``torch.fake_quantize_per_channel_affine``, forward and straight-through backward, and the argument checks the
rest of :mod:`fpsim.quant` shares. Public names are re-exported by :mod:`fpsim.quant`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._fpenv import ieee_mode
from .._interop import returns_input_kind
from ..scaling._common import _as_float, _out


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


