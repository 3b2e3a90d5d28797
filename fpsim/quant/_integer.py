"""True integer inference (int8 GEMMs with int32 accumulation and requantization, bit-identical to
PyTorch's quantized ``Linear`` on CPU): the code. Described, and re-exported, by :mod:`fpsim.quant_int`.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from .._checks import check_bool
from .._fpenv import ieee_mode
from .._interop import returns_input_kind
from .._names import parse_name
from ..amp.policy import Policy
from ..amp.runtime import PolicyRuntime
from ._fake import _fma32, _int
from ..scaling._common import _as_float

__all__ = [
    "ENGINES",
    "ISAS",
    "QDTYPES",
    "IntegerRuntime",
    "dequantize",
    "default_isa",
    "dequantize_linear",
    "int_matmul",
    "quantize_per_channel",
    "quantize_per_tensor",
    "quantized_linear",
    "requantize",
]

_F32 = np.float32
#: Quantized engines modelled (``torch.backends.quantized.engine`` names). ``x86`` runs fbgemm's
#: kernels for ``quantized::linear``.
ENGINES = ("fbgemm", "x86", "qnnpack", "onednn")
#: CPU instruction sets whose integer GEMM is modelled (``torch.backends.cpu.get_cpu_capability()``
#: spelled in lower case): ``"avx2"`` sums u8 x s8 products in adjacent pairs saturated to int16
#: (``vpmaddubsw``), ``"avx512"`` (with VNNI) sums them exactly (``vpdpbusd``). See :func:`default_isa`.
ISAS = ("avx2", "avx512")
#: The ISA assumed when torch is not imported: the one the model was first validated on.
_DEFAULT_ISA = "avx512"
#: Engines whose x86 GEMM kernels use ``vpmaddubsw`` without VNNI (qnnpack's SSE2 kernels widen to
#: int16 and use ``pmaddwd``: exact on every ISA).
_PAIR_ENGINES = ("fbgemm", "x86", "onednn")
#: Quantized dtypes: name -> (NumPy integer dtype, min, max).
QDTYPES: dict[str, tuple[type[np.integer[Any]], int, int]] = {
    "quint8": (np.uint8, 0, 255),
    "qint8": (np.int8, -128, 127),
    "qint32": (np.int32, -(2**31), 2**31 - 1),
}
_I32_MAX = 2**31 - 1


def _qdtype(dtype: Any) -> tuple[str, type[np.integer[Any]], int, int]:
    name = parse_name(dtype, QDTYPES, "dtype")
    t, lo, hi = QDTYPES[name]
    return name, t, lo, hi


def _scales(scale: Any, what: str) -> np.ndarray:
    """Scales as float32 (torch's kernels use float32 scales), positive and finite."""
    s = np.asarray(_as_float(scale, what))
    with np.errstate(over="ignore"):
        s32 = s.astype(_F32)
    if s32.size == 0 or not np.all(np.isfinite(s32)) or not np.all(s32 > 0):
        raise ValueError(f"{what} must be positive finite float32 values, got {scale!r}")
    return s32


def _zero_points(zp: Any, n: int | None, lo: int, hi: int, what: str) -> np.ndarray:
    if isinstance(zp, (bool, np.bool_)):
        raise TypeError(f"{what} must be an int or an array of ints, got a bool")
    a = np.asarray(zp)
    if a.dtype.kind not in "iu" and not (a.dtype.kind == "f" and np.all(a == np.round(a))):
        raise TypeError(f"{what} must be integers, got {a.dtype} values {zp!r}")
    z = a.astype(np.int64)
    if n is not None and z.size != 1 and z.size != n:
        raise ValueError(f"{what} must have 1 or {n} values, got {z.size}")
    if np.any(z < lo) or np.any(z > hi):
        raise ValueError(f"{what} must lie in [{lo}, {hi}], got {zp!r}")
    return z.reshape(-1)


def _quantize(x: np.ndarray, inv: Any, zp: Any, lo: int, hi: int, fused: bool) -> np.ndarray:
    """``nearbyint(x * inv + zp)`` in float32 (rounded once with ``fused``, as torch 2.13's per-tensor
    kernel, an FMA; else the product then the sum, as its per-channel kernel), clamped to [lo, hi]."""
    x32 = x.astype(_F32, copy=False)
    zf = np.asarray(zp).astype(_F32)
    with np.errstate(over="ignore", invalid="ignore"):
        if fused:
            t = _fma_f32(x32, np.asarray(inv, _F32), zf)
        else:
            t = ((x32 * inv).astype(_F32) + zf).astype(_F32)
        r = np.nan_to_num(np.rint(t).astype(np.float64), nan=float(lo), posinf=float(hi), neginf=float(lo))
        return np.asarray(np.clip(r, lo, hi))


def _fma_f32(x32: np.ndarray, inv: np.ndarray, zf: np.ndarray) -> np.ndarray:
    """``float32(x * inv + zf)`` rounded once: the product is exact in float64; the float64 sum, then
    float32, rounds twice, which can differ only where the float64 sum lies exactly halfway between two
    float32 values (its 29 low significand bits are 1000...0); those few go through the exact
    :func:`fpsim.quant._fma32`. (The test is exact in float32's normal range; below 2**-126 the result
    only feeds ``nearbyint``, which gives 0 either way.)"""
    s = x32.astype(np.float64) * inv.astype(np.float64) + zf.astype(np.float64)
    r = s.astype(_F32)
    mid = (s.view(np.uint64) & np.uint64(0x1FFFFFFF)) == np.uint64(0x10000000)
    if np.any(mid):
        i = np.nonzero(mid)
        r[i] = _fma32(x32[i], np.broadcast_to(inv, x32.shape)[i], np.broadcast_to(zf, x32.shape)[i])
    return np.asarray(r)


@ieee_mode
@returns_input_kind(dtype_option=False)
def quantize_per_tensor(x: Any, scale: Any, zero_point: Any, dtype: str = "quint8") -> np.ndarray:
    """The integer values of ``torch.quantize_per_tensor(x, scale, zero_point, dtype)`` (``.int_repr()``).

    float32 arithmetic as torch's CPU kernel: ``inv = 1.0f / scale``, ``nearbyint(fma(x, inv, zp))``
    (one rounding of ``x * inv + zp``, then ties to even), then a clamp to the dtype's range
    (``dtype``: quint8, qint8, qint32). Float64 input is rounded to float32 first (torch quantizes float32 tensors).
    NaN gives the dtype's minimum (torch's result for NaN depends on its vector or scalar path).

    >>> quantize_per_tensor([0.5, 1.5, 2.5, -300.0], 1.0, 0, "qint8").tolist()   # ties to even; clamp
    [0, 2, 2, -128]
    """
    _, t, lo, hi = _qdtype(dtype)
    s = _scales(scale, "scale")
    if s.size != 1:
        raise ValueError(f"per-tensor scale must be a scalar, got shape {s.shape}; use quantize_per_channel")
    zp = _zero_points(zero_point, 1, lo, hi, "zero_point")
    x32 = np.asarray(_as_float(x, "x")).astype(_F32)
    inv = (_F32(1.0) / s.reshape(())).astype(_F32)
    return _quantize(x32, inv, zp[0], lo, hi, True).astype(t)


@ieee_mode
@returns_input_kind(dtype_option=False)
def quantize_per_channel(x: Any, scales: Any, zero_points: Any, axis: int, dtype: str = "qint8") -> np.ndarray:
    """The integer values of ``torch.quantize_per_channel(x, scales, zero_points, axis, dtype)``.

    Per slice along ``axis``: ``nearbyint(float(x * (1.0f / scale)) + zero_point)`` in float32 (the
    product rounded, then the sum), clamped.

    >>> w = np.float32([[0.3, -0.7], [10.0, 1.0]])
    >>> quantize_per_channel(w, [0.1, 0.05], [0, 0], 0).tolist()
    [[3, -7], [127, 20]]
    """
    _, t, lo, hi = _qdtype(dtype)
    x32 = np.asarray(_as_float(x, "x")).astype(_F32)
    ax = _int("axis", axis)
    if not -x32.ndim <= ax < x32.ndim:
        raise ValueError(f"axis {axis} out of range for an array of {x32.ndim} dimensions")
    ax %= x32.ndim
    n = x32.shape[ax]
    s = _scales(scales, "scales").reshape(-1)
    if s.size != n:
        raise ValueError(f"scales must have {n} values (x.shape[{ax}]), got {s.size}")
    zp = _zero_points(zero_points, n, lo, hi, "zero_points")
    shape = [1] * x32.ndim
    shape[ax] = n
    inv = (_F32(1.0) / s).astype(_F32).reshape(shape)
    return _quantize(x32, inv, np.broadcast_to(zp, (n,)).reshape(shape), lo, hi, False).astype(t)


@ieee_mode
@returns_input_kind(dtype_option=False)
def dequantize(q: Any, scale: Any, zero_point: Any, axis: int | None = None) -> np.ndarray:
    """``(q - zero_point) * scale`` in float32, as ``Tensor.dequantize()`` (per channel along ``axis``).

    >>> dequantize(np.uint8([0, 10, 255]), 0.5, 10).tolist()
    [-5.0, 0.0, 122.5]
    """
    qa = np.asarray(q)
    if qa.dtype.kind not in "iu":
        raise TypeError(f"q must be an integer array, got {qa.dtype}")
    s = _scales(scale, "scale").reshape(-1)
    zp = _zero_points(zero_point, None, -(2**31), 2**31 - 1, "zero_point")
    if axis is None:
        if s.size != 1 or zp.size != 1:
            raise ValueError("per-channel scale or zero_point needs axis=")
        return np.asarray(((qa.astype(np.int64) - zp[0]).astype(_F32) * s[0]).astype(_F32))
    ax = _int("axis", axis) % max(qa.ndim, 1)
    shape = [1] * qa.ndim
    shape[ax] = qa.shape[ax]
    zb = np.broadcast_to(zp, (qa.shape[ax],)).reshape(shape)
    sb = np.broadcast_to(s, (qa.shape[ax],)).reshape(shape)
    return np.asarray(((qa.astype(np.int64) - zb).astype(_F32) * sb).astype(_F32))


def _int_operands(qx: Any, qw: Any) -> tuple[np.ndarray, np.ndarray]:
    a, w = np.asarray(qx), np.asarray(qw)
    for name, v in (("qx", a), ("qw", w)):
        if v.dtype.kind not in "iu":
            raise TypeError(f"{name} must be an integer array (the quantized values), got {v.dtype}")
    if w.ndim != 2:
        raise ValueError(f"qw must be 2-D (out_features, in_features) as torch's weight, got shape {w.shape}")
    if a.ndim < 1 or a.shape[-1] != w.shape[1]:
        raise ValueError(f"qx's last dimension ({a.shape[-1] if a.ndim else None}) must equal "
                         f"in_features ({w.shape[1]})")
    return a, w


@ieee_mode
def default_isa() -> str:
    """The ISA :func:`int_matmul` and :func:`quantized_linear` model when ``isa`` is not given.

    If torch is already imported (fpsim never imports it), the one torch reports,
    ``torch.backends.cpu.get_cpu_capability()``: ``"AVX2"`` gives ``"avx2"``, ``"AVX512"`` gives
    ``"avx512"``. Otherwise (no torch, or another capability) ``"avx512"``, the ISA the model was first
    validated on. torch's capability says nothing about VNNI, and fbgemm and oneDNN detect the CPU
    themselves (``ATEN_CPU_CAPABILITY`` does not steer them): on an AVX-512 CPU without VNNI, or with
    that variable set, pass ``isa`` explicitly.

    >>> default_isa() in ISAS
    True
    """
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            cap = str(torch.backends.cpu.get_cpu_capability())
        except Exception:  # noqa: BLE001 - a partly imported or stubbed torch: fall back to the default
            return _DEFAULT_ISA
        if cap.strip().lower() in ISAS:
            return cap.strip().lower()
    return _DEFAULT_ISA


def _isa(isa: str | None) -> str:
    return default_isa() if isa is None else parse_name(isa, ISAS, "isa")


def _pair_excess(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``sum_j (p_j - sat16(p_j))`` per output, ``p_j = a[2j] w[n, 2j] + a[2j+1] w[n, 2j+1]``: what
    ``vpmaddubsw``'s int16 saturation takes off the exact raw sum ``sum_k a[k] w[n, k]``.

    ``a`` (..., K) in [0, 255], ``w`` (N, K) in [-128, 127]; an odd K is padded with a zero, as the
    packed matrices are. Only a pair of same-sign weights can leave int16 (``|p| <= 255 * 128`` else), and
    only when ``max(a) * (|w0| + |w1|)`` passes the bound; just those pairs are evaluated, in blocks of
    rows, so the usual case (small weights) costs one pass over ``w``.
    """
    n, k = w.shape
    rows = int(np.prod(a.shape[:-1], dtype=np.int64))
    out = np.zeros((rows, n), np.int64)
    amax = int(a.max()) if a.size else 0
    w64 = w.astype(np.int64)
    if k % 2:
        w64 = np.concatenate([w64, np.zeros((n, 1), np.int64)], axis=1)
    we, wo = w64[:, 0::2], w64[:, 1::2]
    same = (we * wo >= 0)
    mag = np.abs(we) + np.abs(wo)
    up = (we + wo) > 0                                      # a same-sign pair can only overflow its own way
    limit = np.where(up, 32767, 32768)
    nn, jj = np.nonzero(same & (amax * mag > limit))
    if nn.size == 0 or rows == 0:
        return out.reshape(a.shape[:-1] + (n,))
    a2 = a.reshape(rows, k)
    ae, ao = a2[:, 0::2], a2[:, 1::2]
    if k % 2:
        ao = np.concatenate([ao, np.zeros((rows, 1), a2.dtype)], axis=1)
    w0 = np.abs(we[nn, jj]).astype(np.int32)
    w1 = np.abs(wo[nn, jj]).astype(np.int32)
    lim = limit[nn, jj].astype(np.int32)
    sign = np.where(up[nn, jj], 1, -1)
    block = max(1, (1 << 22) // nn.size)                                   # ~4M pair products at a time
    flat = out.reshape(-1)
    for r0 in range(0, rows, block):
        p = ae[r0:r0 + block][:, jj].astype(np.int32)
        p *= w0
        p += ao[r0:r0 + block][:, jj].astype(np.int32) * w1                  # |a0 w0 + a1 w1|, exact
        p -= lim
        r, c = np.nonzero(p > 0)                                             # the pairs past int16: few
        np.add.at(flat, (r + r0) * n + nn[c], p[r, c] * sign[c])
    return out.reshape(a.shape[:-1] + (n,))


@ieee_mode
@returns_input_kind(dtype_option=False)
def int_matmul(qx: Any, x_zero_point: Any, qw: Any, w_zero_point: Any, *, engine: str | None = None,
               isa: str | None = None) -> np.ndarray:
    """int32 accumulator ``acc[..., n] = sum_k (qx[..., k] - zx) * (qw[n, k] - zw[n])``.

    ``qw`` has torch's weight layout ``(out_features, in_features)``; ``w_zero_point`` is a scalar or
    one per output channel. Without ``engine``, the exact sum. With ``engine``, the sum that engine's
    kernel computes on ``isa`` (see :data:`ISAS`; ``None``: :func:`default_isa`): fbgemm (``x86``) and
    oneDNN form the raw ``sum_k qx[k] * qw[n, k]`` and subtract the zero points' row and column offsets
    exactly; on ``"avx2"`` (and on AVX-512 without VNNI) the raw sum is built with ``vpmaddubsw``, which
    adds the products of adjacent pairs ``k = 2j, 2j + 1`` saturated to int16 ([-32768, 32767]) before
    widening, so a pair like 255 * 127 + 255 * 127 counts as 32767 (``qx`` must then be uint8 values and
    ``qw`` int8 values). On ``"avx512"`` (VNNI's ``vpdpbusd``) and for qnnpack the sum is exact.

    Computed exactly (a float64 GEMM of integers is exact while every partial sum stays below 2**53,
    which |acc| <= 2**31 and K < 2**21 guarantee); a result outside int32 raises ``OverflowError`` (the
    backends would wrap it silently).

    >>> int_matmul(np.uint8([[255, 255]]), 0, np.int8([[127, 127]]), 0).tolist()
    [[64770]]
    >>> int_matmul(np.uint8([[255, 255]]), 0, np.int8([[127, 127]]), 0, engine="fbgemm", isa="avx2").tolist()
    [[32767]]
    """
    a, w = _int_operands(qx, qw)
    eng = None if engine is None else parse_name(engine, ENGINES, "engine")
    cpu = _isa(isa)
    zx = _zero_points(x_zero_point, 1, -(2**31), 2**31 - 1, "x_zero_point")[0]
    zw = _zero_points(w_zero_point, w.shape[0], -(2**31), 2**31 - 1, "w_zero_point")
    if w.shape[1] >= 2**21:
        raise ValueError(f"in_features {w.shape[1]} too large for the exact float64 GEMM (< 2**21)")
    af = a.astype(np.float64) - float(zx)
    wf = w.astype(np.float64) - zw.astype(np.float64).reshape(-1, 1)
    acc = af @ wf.T                                                            # (..., N), exact
    if eng in _PAIR_ENGINES and cpu == "avx2":
        # the kernel saturates the raw products, not the zero-point-corrected ones
        for name, v, lo, hi in (("qx", a, 0, 255), ("qw", w, -128, 127)):
            if v.size and (v.min() < lo or v.max() > hi):
                raise ValueError(f"{name} must hold values in [{lo}, {hi}] for {eng} on {cpu} "
                                 f"(u8 x s8 products), got [{v.min()}, {v.max()}]")
        acc = acc - _pair_excess(a, w)
    if acc.size and (acc.max() > _I32_MAX or acc.min() < -(2**31)):
        raise OverflowError("int32 accumulator overflow (the backends would wrap): "
                            f"range [{acc.min():.0f}, {acc.max():.0f}]")
    return np.asarray(acc.astype(np.int32))


def _bias32(bias: Any, n: int) -> np.ndarray | None:
    if bias is None:
        return None
    b = np.asarray(_as_float(bias, "bias")).astype(_F32).reshape(-1)
    if b.size != n:
        raise ValueError(f"bias must have {n} values (out_features), got {b.size}")
    return b


@ieee_mode
@returns_input_kind(dtype_option=False)
def requantize(acc: Any, x_scale: Any, w_scale: Any, out_scale: Any, out_zero_point: Any, bias: Any = None, *,
               engine: str = "fbgemm", relu: bool = False) -> np.ndarray:
    """Requantize an int32 accumulator ``(..., N)`` to the output's quint8, as ``engine`` does.

    ``x_scale``: the input's scale; ``w_scale``: one weight scale or one per output channel;
    ``bias``: float (N,) or None. See the module docstring for each engine's formula. All float
    arithmetic in float32, rounding ``nearbyint`` (ties to even), saturation at ``[0, 255]``
    (``[out_zero_point, 255]`` with ``relu=True``).

    >>> acc = np.int32([[-30000, 0, 25, 30, 35, 10**6]])
    >>> requantize(acc, 0.1, 0.1, 1.0, 128).tolist()        # 25 * 0.01 = 0.25 -> 0 (tie to even)
    [[0, 128, 128, 128, 128, 255]]
    """
    eng = parse_name(engine, ENGINES, "engine")
    relu = check_bool(relu, "relu")
    a = np.asarray(acc)
    if a.dtype.kind not in "iu":
        raise TypeError(f"acc must be an integer array (the int32 accumulator), got {a.dtype}")
    n = a.shape[-1] if a.ndim else 1
    sx = _scales(x_scale, "x_scale").reshape(-1)
    if sx.size != 1:
        raise ValueError("x_scale must be a scalar (activations are quantized per tensor)")
    sw = _scales(w_scale, "w_scale").reshape(-1)
    if sw.size not in (1, n):
        raise ValueError(f"w_scale must have 1 or {n} values, got {sw.size}")
    sy = _scales(out_scale, "out_scale").reshape(-1)
    if sy.size != 1:
        raise ValueError("out_scale must be a scalar")
    zy = int(_zero_points(out_zero_point, 1, 0, 255, "out_zero_point")[0])
    b = _bias32(bias, n)
    atw = (sx[0] * sw).astype(_F32)                                     # s_x * s_w, float32
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if eng in ("fbgemm", "x86"):
            mult = (atw / sy[0]).astype(_F32)
            v = a.astype(_F32)
            if b is not None:
                v = (v + (b / atw).astype(_F32)).astype(_F32)
            v = (v * mult).astype(_F32)
        elif eng == "qnnpack":
            mult = (atw / sy[0]).astype(_F32)
            acc64 = a.astype(np.int64)
            if b is not None:
                inv = (_F32(1.0) / atw).astype(_F32)
                qb = _quantize(b, inv, 0, -(2**31), _I32_MAX, True).astype(np.int64)
                acc64 = acc64 + qb
                acc64 = ((acc64 + 2**31) % 2**32) - 2**31                  # int32 wrap, as the kernel
            v = (acc64.astype(_F32) * mult).astype(_F32)
        else:  # onednn: torch hands ideep reciprocal scales (float(1.0 / scale)), inverted back in float32
            rsx, rsw, rsy = _recip2(sx[0]), _recip2(sw), _recip2(sy[0])
            cs = (rsx * rsw).astype(_F32)
            af = a.astype(_F32)
            v = _fma32(af, np.broadcast_to(cs, af.shape), np.broadcast_to(_F32(0) if b is None else b, af.shape))
            v = ((v * (_F32(1.0) / rsy).astype(_F32)).astype(_F32) + _F32(zy)).astype(_F32)
        r = np.rint(v).astype(np.float64)
        r = np.nan_to_num(r, nan=0.0, posinf=2.0**40, neginf=-(2.0**40))
    if eng != "onednn":
        r = r + zy                                   # fbgemm, qnnpack: nearbyint(v) + z_y
    return np.asarray(np.clip(r, zy if relu else 0, 255).astype(np.uint8))


def _recip2(s: Any) -> np.ndarray:
    """``1.0f / float(1.0 / s)``: a float32 scale after torch's reciprocal (double) and ideep's (float)."""
    r = (1.0 / np.asarray(s, np.float64)).astype(_F32)
    return np.asarray((_F32(1.0) / r).astype(_F32))


@ieee_mode
@returns_input_kind(dtype_option=False)
def quantized_linear(qx: Any, x_scale: Any, x_zero_point: Any, qw: Any, w_scale: Any, w_zero_point: Any,
                     bias: Any, out_scale: Any, out_zero_point: Any, *, engine: str = "fbgemm",
                     relu: bool = False, isa: str | None = None) -> np.ndarray:
    """``torch.ops.quantized.linear`` (``linear_relu`` with ``relu=True``): quint8 in, quint8 out.

    ``qx`` (..., K) uint8 with ``x_scale``/``x_zero_point``; ``qw`` (N, K) int8 with per-tensor or
    per-channel ``w_scale``/``w_zero_point``; ``bias`` float (N,) or None; output scale and zero point.
    :func:`int_matmul` (``engine``'s accumulator on ``isa``, default :func:`default_isa`) then
    :func:`requantize` (the same on every ISA).

    >>> qx = np.uint8([[0, 255, 7]]); qw = np.int8([[127, 127, 127]])
    >>> quantized_linear(qx, 0.1, 0, qw, 0.1, 0, np.float32([0.5]), 0.05, 0).tolist()   # saturates
    [[255]]
    """
    a, w = _int_operands(qx, qw)
    acc = int_matmul(a, x_zero_point, w, w_zero_point, engine=engine, isa=isa)
    return requantize(acc, x_scale, w_scale, out_scale, out_zero_point, bias, engine=engine, relu=relu)


@ieee_mode
@returns_input_kind(dtype_option=False)
def dequantize_linear(qx: Any, x_scale: Any, x_zero_point: Any, qw: Any, w_scale: Any, w_zero_point: Any,
                      bias: Any = None) -> np.ndarray:
    """Integer GEMM with a float32 output: ``float(acc) * (s_x * s_w) + bias`` (no output quantization).

    The int32 accumulator dequantized in the GEMM's epilogue (fbgemm's ``ReQuantizeForFloat`` order),
    for a quantized linear followed by float ops (LayerNorm, GELU, softmax, a residual add).

    >>> dequantize_linear(np.uint8([[10, 20]]), 0.5, 10, np.int8([[2, -2]]), 0.25, 0).tolist()
    [[-2.5]]
    """
    a, w = _int_operands(qx, qw)
    acc = int_matmul(a, x_zero_point, w, w_zero_point)
    sx = _scales(x_scale, "x_scale").reshape(-1)
    sw = _scales(w_scale, "w_scale").reshape(-1)
    atw = (sx[0] * sw).astype(_F32)
    out = (acc.astype(_F32) * atw).astype(_F32)
    b = _bias32(bias, w.shape[0])
    if b is not None:
        out = (out + b).astype(_F32)
    return np.asarray(out)


# --------------------------------------------------------------------------------------------------
# A QAT-trained model run in integers


@ieee_mode
class IntegerRuntime(PolicyRuntime):
    """Evaluate a QAT (or PTQ) model with true integer inference in its quantized GEMMs.

    Built from the trained model's :class:`~fpsim.amp.runtime.PolicyRuntime` (its policy and frozen
    activation observers). For every GEMM whose kind the policy quantizes (default: the ``linear``
    kind: attention qkv and output projections, MLP fc and projection; not ``lm_head``, not the
    attention score/value GEMMs): the activation is quantized to ``[0, 2**act_bits - 1]`` per tensor
    with the observer's scale and zero point (the fake-quant model's), the weight per output channel
    (symmetric, as QAT), the GEMM runs in integers with an exact int32 accumulator, and then

    * ``output="float"``: the accumulator is dequantized in the epilogue, ``float(acc) * (s_x s_w) + b``
      (:func:`dequantize_linear`) — the same model as the fake-quant estimate, computed in integers;
    * ``output="quint8"``: requantized to quint8 like ``torch.ao.nn.quantized.Linear`` (``engine``'s
      accumulator on ``isa``, see :func:`int_matmul`, and its :func:`requantize`), with output scale and
      zero point from a min/max observer calibrated by :meth:`calibrate_outputs`, then dequantized for the
      float op that follows (a ``DeQuantStub``). ``isa=None`` is :func:`default_isa` when the runtime is
      built (kept in ``self.isa``).

    LayerNorm, GELU, softmax, residual adds, embeddings and the ``lm_head`` stay float (FP32), as in the
    fake-quant model. Evaluation only: there is no integer backward.
    """

    def __init__(self, trained: PolicyRuntime, *, output: str = "float", engine: str = "fbgemm",
                 isa: str | None = None) -> None:
        if not isinstance(trained, PolicyRuntime):
            raise TypeError(f"trained must be a PolicyRuntime, got {type(trained).__name__}")
        pol: Policy = trained.policy
        q = pol.quant
        if q is None:
            raise ValueError(f"policy {pol.name!r} has no integer quantization (Policy.quant is None)")
        wmin, wmax = q.weight_range
        amin, amax = q.act_range
        if (wmin, wmax) != (-128, 127) or (amin, amax) != (0, 255):
            raise ValueError(f"integer inference models int8 weights and uint8 activations; policy "
                             f"{pol.name!r} has weights [{wmin}, {wmax}] and activations [{amin}, {amax}]")
        super().__init__(pol)
        self.output = parse_name(output, ("float", "quint8"), "output")
        self.engine = parse_name(engine, ENGINES, "engine")
        self.isa = _isa(isa)
        self._obs = {k: v.copy() for k, v in trained._obs.items()}
        self.training = False
        self.quant_active = True
        #: per site: (min, max) of the float GEMM outputs seen by :meth:`calibrate_outputs`.
        self.out_obs: dict[str, np.ndarray] = {}
        self._calib_out = False
        #: per site: how many outputs saturated at 0 or 255 (``output="quint8"``), and how many in total.
        self.saturated: dict[str, list[int]] = {}
        #: per site: how many activation codes differ from the fake quant's, and how many in total.
        self.act_code_diff: dict[str, list[int]] = {}

    def calibrate_outputs(self, on: bool) -> None:
        """While on, quantized GEMMs return float outputs and record their min/max per site."""
        self._calib_out = check_bool(on, "on")

    def qparams(self, site: str) -> tuple[np.float32, int]:
        """The activation scale and zero point of ``site`` (the QAT observer's, as the fake quant)."""
        if site not in self._obs:
            raise ValueError(f"no activation observer for site {site!r}; known: {sorted(self._obs)}")
        mn, mx = self._obs[site]
        mn0, mx0 = min(mn, _F32(0)), max(mx, _F32(0))
        s_a = max(_F32((mx0 - mn0) / _F32(255)), _F32(np.finfo(np.float32).eps))
        zp = int(np.clip(0 - np.rint(mn0 / s_a), 0, 255))
        return _F32(s_a), zp

    def _quant_matmul(self, a: np.ndarray, b: np.ndarray, site: str,
                      bias: np.ndarray | None) -> tuple[np.ndarray, Any]:
        q = self.policy.quant
        assert q is not None
        a = self.cast(a, self.policy.activations)
        s_a, zp_a = self.qparams(site)
        qa = quantize_per_tensor(a, s_a, zp_a, "quint8")                       # (..., K) uint8
        # the fake quant's codes: nearbyint(x * inv) + zp (zero point after rounding; torch's
        # quantize_per_tensor rounds x * inv + zp once): they differ only next to ties
        with np.errstate(over="ignore", invalid="ignore"):
            fq = np.clip(np.rint((a * (_F32(1.0) / s_a).astype(_F32)).astype(_F32)) + zp_a, 0, 255)
        cd = self.act_code_diff.setdefault(site, [0, 0])
        cd[0] += int(np.count_nonzero(fq != qa))
        cd[1] += int(qa.size)
        wabs = np.abs(b).max(axis=0)                                          # (N,) per output channel
        if not q.per_channel:
            wabs = np.full_like(wabs, wabs.max())
        s_w = np.maximum((wabs / _F32(127.5)).astype(_F32), _F32(np.finfo(np.float32).eps))
        qw = quantize_per_channel(b.T, s_w, np.zeros(b.shape[1], np.int64), 0, "qint8")   # (N, K)
        bias32 = None if bias is None else np.asarray(bias, _F32)
        out = dequantize_linear(qa, s_a, zp_a, qw, s_w, 0, bias32)
        if self._calib_out:
            mn, mx = _F32(out.min()), _F32(out.max())
            old = self.out_obs.get(site)
            self.out_obs[site] = np.array([mn, mx] if old is None else [min(old[0], mn), max(old[1], mx)], _F32)
        elif self.output == "quint8":
            if site not in self.out_obs:
                raise ValueError(f"output='quint8' needs calibrated output ranges: run calibrate_outputs(True), "
                                 f"a few forward passes, calibrate_outputs(False) (site {site!r} not seen)")
            mn, mx = self.out_obs[site]
            mn0, mx0 = min(mn, _F32(0)), max(mx, _F32(0))
            s_y = max(_F32((mx0 - mn0) / _F32(255)), _F32(np.finfo(np.float32).eps))
            zp_y = int(np.clip(0 - np.rint(mn0 / s_y), 0, 255))
            acc = int_matmul(qa, zp_a, qw, 0, engine=self.engine, isa=self.isa)
            qy = requantize(acc, s_a, s_w, s_y, zp_y, bias32, engine=self.engine)
            st = self.saturated.setdefault(site, [0, 0])
            st[0] += int(np.count_nonzero((qy == 0) | (qy == 255)))
            st[1] += int(qy.size)
            out = dequantize(qy, s_y, zp_y)
        out = self.cast(out, self.policy.activations)
        return out, ("int", site)

    def matmul_backward(self, dout: np.ndarray, cache: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        if cache[0] == "int":
            raise RuntimeError("IntegerRuntime is for inference: integer GEMMs have no backward pass")
        return super().matmul_backward(dout, cache)
