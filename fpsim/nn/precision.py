"""The precision hooks the layers call, and the full-precision default.

Layers never cast by themselves. Every place where a real mixed-precision framework would hand a tensor
to a lower-precision kernel (a GEMM, an elementwise op outside the FP32 list, the gradient of a
low-precision tensor) calls one method of a :class:`Precision` object. `fpsim.amp` provides the
implementation driven by a policy; :data:`FULL` here does no rounding at all and is what the gradient
checks use (in float64).
"""

from __future__ import annotations

import contextvars
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .._blas import matmul as _blas_matmul
from .._fpenv import ieee_mode

__all__ = ["FULL", "GEMM_KINDS", "FullPrecision", "Precision", "current_precision"]

#: The roles a GEMM can play; a policy may treat them differently (e.g. FP8 only for ``"linear"``).
#: ``linear``: activations @ weight; ``attn``: activations @ activations inside attention;
#: ``lm_head``: final activations @ tied embedding (transposed).
GEMM_KINDS = ("linear", "attn", "lm_head")


@runtime_checkable
class Precision(Protocol):
    """What a layer may ask of a precision policy.

    ``site`` names the tensor (``"h0.attn.qkv"``) so a policy can keep per-tensor state (FP8 scales,
    QAT observers) and telemetry. ``op`` names the operation that produced an activation
    (``"gelu"``, ``"softmax"``, ``"layernorm"``, ``"residual"``, ``"scale"``, ``"cross_entropy"``).
    """

    def matmul(self, a: np.ndarray, b: np.ndarray, site: str, kind: str,
               bias: np.ndarray | None = None) -> tuple[np.ndarray, Any]:
        """``a @ b (+ bias)`` with the operand and result casts of the policy; returns (out, cache)."""
        ...

    def matmul_backward(self, dout: np.ndarray, cache: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Gradients ``(da, db, dbias)`` of :meth:`matmul`, each in the policy's gradient format."""
        ...

    def act(self, x: np.ndarray, site: str, op: str) -> np.ndarray:
        """The output of elementwise op ``op`` as the policy stores it (unchanged for FP32-listed ops)."""
        ...

    def grad(self, g: np.ndarray, site: str, op: str) -> np.ndarray:
        """The gradient with respect to the output of ``op``, in the format that output had."""
        ...


@ieee_mode
class FullPrecision:
    """No rounding anywhere: plain NumPy in the inputs' dtype (float64 for gradient checks)."""

    def matmul(self, a: np.ndarray, b: np.ndarray, site: str, kind: str,
               bias: np.ndarray | None = None) -> tuple[np.ndarray, Any]:
        out = _blas_matmul(a, b)
        if bias is not None:
            out = out + bias
        return out, (a, b, bias is not None)

    def matmul_backward(self, dout: np.ndarray, cache: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        a, b, has_bias = cache
        return _matmul_grads(dout, a, b, has_bias)

    def act(self, x: np.ndarray, site: str, op: str) -> np.ndarray:
        return x

    def grad(self, g: np.ndarray, site: str, op: str) -> np.ndarray:
        return g


def _matmul_grads(dout: np.ndarray, a: np.ndarray, b: np.ndarray,
                  has_bias: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Gradients of ``out = a @ b (+ bias)`` for 2-D ``b`` (weights) or batched ``a``/``b`` (attention).

    a (..., M, K), b (K, N) or (..., K, N), dout (..., M, N).
    """
    da = _blas_matmul(dout, np.swapaxes(b, -1, -2))                         # (..., M, K)
    if b.ndim == 2:
        a2 = a.reshape(-1, a.shape[-1])                          # (B*M, K)
        d2 = dout.reshape(-1, dout.shape[-1])                    # (B*M, N)
        db = _blas_matmul(a2.T, d2)                              # (K, N)
    else:
        db = _blas_matmul(np.swapaxes(a, -1, -2), dout)          # (..., K, N)
    dbias = dout.reshape(-1, dout.shape[-1]).sum(axis=0) if has_bias else None  # (N,)
    return da, db, dbias


#: The shared no-rounding instance.
FULL = FullPrecision()


#: The precision forward calls use when given none (``prec=None``); set by ``fpsim.amp.autocast`` (L4) so
#: that this layer never imports a policy. A context variable: per thread and per asyncio task, nestable.
_AMBIENT: contextvars.ContextVar[Precision | None] = contextvars.ContextVar("fpsim_ambient_precision",
                                                                            default=None)


@ieee_mode
def current_precision(prec: Precision | None = None) -> Precision:
    """``prec`` if given, else the innermost ``fpsim.amp.autocast``'s precision, else :data:`FULL`.

    >>> current_precision() is FULL
    True
    """
    if prec is not None:
        return prec
    amb = _AMBIENT.get()
    return FULL if amb is None else amb
