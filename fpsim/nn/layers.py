"""Layers as explicit forward/backward pairs (llm.c / micrograd style).

Each ``x_forward(...)`` returns ``(out, cache)`` and the matching ``x_backward(dout, cache)`` returns the
gradients. Shapes: ``B`` batch, ``T`` time, ``C`` channels, ``V`` vocabulary, ``N`` = B*T rows.
Arithmetic is plain NumPy in the carrier dtype of the inputs (float32 in training, float64 in gradient
checks); the optional ``prec`` argument (see :mod:`fpsim.nn.precision`) is where a policy rounds.

>>> import numpy as np
>>> from fpsim.nn import layers
>>> x = np.array([[1.0, 2.0, 3.0]])
>>> out, cache = layers.layernorm_forward(x, np.ones(3), np.zeros(3))
>>> np.round(out, 4)
array([[-1.2247,  0.    ,  1.2247]])
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._checks import check_int
from .._fpenv import ieee_mode
from .precision import Precision, current_precision

try:  # GELU's float32 passes in one loop each (fpsim/_carith.c); the NumPy code below stays the reference
    from .. import _carith  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - built without a compiler
    _carith = None

use_c_gelu = _carith is not None
"""Whether float32 GELU runs its elementwise passes in compiled loops (the same float32 operations in the same
order as the NumPy code, so the same bits; tanh stays NumPy's). ``False`` forces the NumPy code."""

__all__ = [
    "cross_entropy_backward",
    "cross_entropy_forward",
    "embedding_backward",
    "embedding_forward",
    "gelu_backward",
    "gelu_forward",
    "layernorm_backward",
    "layernorm_forward",
    "linear_backward",
    "linear_forward",
    "residual_backward",
    "residual_forward",
    "softmax_backward",
    "softmax_forward",
]

Cache = Any


def _same_float(*arrays: Any) -> bool:
    """All NumPy arrays of one float dtype (float32 or float64): then an operation written into an existing
    buffer (``out=``, ``*=``) gives the bits of the same operation returning a new array."""
    d = getattr(arrays[0], "dtype", None)
    return (d == np.float32 or d == np.float64) and all(
        isinstance(a, np.ndarray) and a.dtype == d for a in arrays)


# ---------------------------------------------------------------------------------------------- embedding

def _check_ids(ids: Any, n: int, what: str, *, ignore_index: int | None = None) -> np.ndarray:
    """``ids`` as an integer array whose every value is in ``[0, n)`` (or equals ``ignore_index``).

    Raises ``TypeError`` for a non-integer array (floats, bools) and ``ValueError`` naming the first
    value out of range and where it is. NumPy would read ``-1`` as the last row silently and give a bare
    ``IndexError`` for the rest.

    >>> _check_ids([[0, 3]], 4, "idx").tolist()
    [[0, 3]]
    >>> _check_ids([[0, 4]], 4, "idx")
    Traceback (most recent call last):
    ...
    ValueError: idx[0, 1] = 4 is not a valid id: need 0 <= id < 4
    """
    if isinstance(ids, np.ma.MaskedArray):  # np.asarray would drop the mask and read the hidden ids
        raise TypeError(f"{what}: masked arrays are not supported; pass {what}.filled(value)")
    a = np.asarray(ids)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{what} must be an integer array, got dtype {a.dtype}")
    if a.size:
        bad = (a < 0) | (a >= n)
        if ignore_index is not None:
            bad &= a != ignore_index
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            pos = f"[{', '.join(map(str, where))}]" if where else ""
            extra = f" or = {ignore_index} (ignored)" if ignore_index is not None else ""
            raise ValueError(f"{what}{pos} = {a[where]} is not a valid id: need 0 <= id < {n}{extra}")
    return a


@ieee_mode
def embedding_forward(idx: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, Cache]:
    """Look up rows of ``w``. idx (B, T) int with values in [0, V), w (V, C) -> out (B, T, C)."""
    w = np.asarray(w)
    if w.ndim != 2:
        raise ValueError(f"embedding weight must be (V, C), got shape {w.shape}")
    idx = _check_ids(idx, w.shape[0], "idx")
    out = w[idx]                                                  # (B, T, C)
    return out, (idx, w.shape)


@ieee_mode
def embedding_backward(dout: np.ndarray, cache: Cache) -> np.ndarray:
    """dW (V, C): rows of ``dout`` (B, T, C) summed into the rows they were read from."""
    idx, wshape = cache
    dw = np.zeros(wshape, dtype=dout.dtype)
    np.add.at(dw, idx.reshape(-1), dout.reshape(-1, wshape[1]))   # (N, C) scattered into (V, C)
    return dw


# ---------------------------------------------------------------------------------------------- linear

@ieee_mode
def linear_forward(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, *, prec: Precision | None = None,
                   site: str = "linear", kind: str = "linear") -> tuple[np.ndarray, Cache]:
    """``x @ w + b``. x (..., Cin), w (Cin, Cout), b (Cout,) -> out (..., Cout). ``prec=None``: the
    innermost ``fpsim.amp.autocast``'s precision, else :data:`~fpsim.nn.FULL`."""
    prec = current_precision(prec)
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])                                 # (N, Cin)
    out, mcache = prec.matmul(x2, w, site, kind, bias=b)          # (N, Cout)
    return out.reshape(*shape[:-1], w.shape[1]), (mcache, shape, prec)


@ieee_mode
def linear_backward(dout: np.ndarray, cache: Cache) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(dx (..., Cin), dw (Cin, Cout), db (Cout,) or None)."""
    mcache, shape, prec = cache
    d2 = dout.reshape(-1, dout.shape[-1])                         # (N, Cout)
    dx, dw, db = prec.matmul_backward(d2, mcache)
    return dx.reshape(shape), dw, db


# ---------------------------------------------------------------------------------------------- layernorm

@ieee_mode
def layernorm_forward(x: np.ndarray, g: np.ndarray, b: np.ndarray, eps: float = 1e-5) -> tuple[np.ndarray, Cache]:
    """Normalize over the last axis, then scale and shift. x (..., C) -> out (..., C)."""
    mean = x.mean(axis=-1, keepdims=True)                         # (..., 1)
    xc = x - mean
    if _same_float(x, xc, g, b) and g.shape == b.shape == x.shape[-1:]:
        # The same operations in the same order, written into two buffers instead of five fresh arrays
        # (fewer allocations: each large temporary may cost its page faults again).
        sq = np.multiply(xc, xc)
        var = sq.mean(axis=-1, keepdims=True)                     # biased variance, as torch
        rstd = 1.0 / np.sqrt(var + np.asarray(eps, dtype=x.dtype))
        xhat = np.multiply(xc, rstd, out=xc)
        out = np.multiply(xhat, g, out=sq)
        out += b
        return out, (xhat, rstd, g)
    var = (xc * xc).mean(axis=-1, keepdims=True)                  # biased variance, as torch
    rstd = 1.0 / np.sqrt(var + np.asarray(eps, dtype=x.dtype))    # (..., 1)
    xhat = xc * rstd
    out = xhat * g + b
    return out, (xhat, rstd, g)


@ieee_mode
def layernorm_backward(dout: np.ndarray, cache: Cache) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dx (..., C), dg (C,), db (C,))."""
    xhat, rstd, g = cache
    C = xhat.shape[-1]
    d2 = dout.reshape(-1, C)
    if isinstance(dout, np.ndarray) and dout.shape == xhat.shape and g.shape == (C,) and \
            _same_float(dout, xhat, rstd, g):
        # The same operations in the same order in two buffers instead of eight fresh arrays.
        tmp = np.multiply(d2, xhat.reshape(-1, C))
        dg = tmp.sum(axis=0)                                      # (C,)
        db = d2.sum(axis=0)                                       # (C,)
        dxhat = np.multiply(dout, g)
        m1 = dxhat.mean(axis=-1, keepdims=True)
        t = np.multiply(dxhat, xhat, out=tmp.reshape(xhat.shape))
        m2 = t.mean(axis=-1, keepdims=True)
        t = np.multiply(xhat, m2, out=t)
        dx = np.subtract(dxhat, m1, out=dxhat)
        dx -= t
        dx = np.multiply(rstd, dx, out=dx)  # operands in the plain code's order: NaN payloads too
        return dx, dg, db
    dg = (d2 * xhat.reshape(-1, C)).sum(axis=0)                   # (C,)
    db = d2.sum(axis=0)                                           # (C,)
    dxhat = dout * g
    dx = rstd * (dxhat - dxhat.mean(axis=-1, keepdims=True)
                 - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))
    return dx, dg, db


# ---------------------------------------------------------------------------------------------- GELU

_GELU_C = float(np.sqrt(2.0 / np.pi))
# the float32 constants of the compiled passes: NumPy's conversions of the Python floats the NumPy code uses
_C1, _C2, _K3 = (float(np.float32(v)) for v in (0.044715, _GELU_C, 3 * 0.044715))


def _c_gelu(*arrays: Any) -> bool:
    """Whether GELU's compiled float32 passes take these arrays: C-contiguous float32 of one shape."""
    return use_c_gelu and all(
        isinstance(a, np.ndarray) and a.dtype == np.float32 and a.flags.c_contiguous and a.shape == arrays[0].shape
        for a in arrays)


@ieee_mode
def gelu_forward(x: np.ndarray) -> tuple[np.ndarray, Cache]:
    """GELU, tanh approximation (GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    if _c_gelu(x):
        assert _carith is not None
        u = np.empty_like(x)
        _carith.gelu_u(x, u, _C1, _C2)
        t = np.tanh(u, out=u)
        out = np.empty_like(x)
        _carith.gelu_out(x, t, out)
        return out, (x, t)
    if _same_float(x):  # the same operations in the same order, in three buffers instead of nine
        u = np.multiply(x, x)
        u *= x
        u *= 0.044715
        np.add(x, u, out=u)
        u *= _GELU_C
        t = np.tanh(u, out=u)
        out = np.multiply(x, 0.5)
        out *= np.add(t, 1.0)
        return out, (x, t)
    u = _GELU_C * (x + 0.044715 * (x * x * x))  # x*x*x: NumPy's float32 power is ~500x slower
    t = np.tanh(u)
    return 0.5 * x * (1.0 + t), (x, t)


@ieee_mode
def gelu_backward(dout: np.ndarray, cache: Cache) -> np.ndarray:
    x, t = cache
    if _c_gelu(dout, x, t):
        assert _carith is not None
        g: np.ndarray = np.empty_like(x)
        _carith.gelu_grad(dout, x, t, g, _K3, _C2)
        return g
    if isinstance(dout, np.ndarray) and dout.shape == x.shape and _same_float(dout, x, t):
        # the same operations in the same order (each product of a Python float rounds as before), in
        # three buffers instead of eleven fresh arrays
        du_dx = np.multiply(x, 3 * 0.044715)
        du_dx *= x
        du_dx += 1.0
        du_dx *= _GELU_C
        q = np.multiply(x, 0.5)
        r = np.multiply(t, t)
        np.subtract(1.0, r, out=r)
        q *= r
        q *= du_dx
        p = np.add(t, 1.0, out=r)
        p *= 0.5
        p += q
        res: np.ndarray = np.multiply(dout, p, out=p)
        return res
    du_dx = _GELU_C * (1.0 + 3 * 0.044715 * x * x)
    local = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du_dx
    return np.asarray(dout * local)


# ---------------------------------------------------------------------------------------------- softmax

@ieee_mode
def softmax_forward(x: np.ndarray) -> tuple[np.ndarray, Cache]:
    """Softmax over the last axis (``-inf`` entries get probability 0). x (..., K) -> y (..., K), K >= 1."""
    if np.ndim(x) < 1 or np.shape(x)[-1] < 1:
        raise ValueError(f"softmax needs at least one entry on the last axis, got shape {np.shape(x)}")
    m = x.max(axis=-1, keepdims=True)
    if _same_float(x):  # the same operations in one buffer instead of three
        e = np.subtract(x, m)
        np.exp(e, out=e)
        y = np.divide(e, e.sum(axis=-1, keepdims=True), out=e)
        return y, y
    e = np.exp(x - m)
    y = e / e.sum(axis=-1, keepdims=True)
    return y, y


@ieee_mode
def softmax_backward(dout: np.ndarray, cache: Cache) -> np.ndarray:
    """dx = y * (dy - sum(dy * y))."""
    y = cache
    if isinstance(dout, np.ndarray) and dout.shape == y.shape and _same_float(dout, y):
        t = np.multiply(dout, y)  # the same operations in one buffer instead of three
        s = t.sum(axis=-1, keepdims=True)
        t = np.subtract(dout, s, out=t)
        dx: np.ndarray = np.multiply(y, t, out=t)
        return dx
    return np.asarray(y * (dout - (dout * y).sum(axis=-1, keepdims=True)))


# ---------------------------------------------------------------------------------------------- residual

@ieee_mode
def residual_forward(x: np.ndarray, fx: np.ndarray) -> tuple[np.ndarray, Cache]:
    """``x + f(x)``: the residual stream. Both (..., C)."""
    return x + fx, None


@ieee_mode
def residual_backward(dout: np.ndarray, cache: Cache) -> tuple[np.ndarray, np.ndarray]:
    """The gradient flows unchanged into both branches."""
    return dout, dout


# ---------------------------------------------------------------------------------------------- cross-entropy

@ieee_mode
def cross_entropy_forward(logits: np.ndarray, targets: np.ndarray, ignore_index: int = -1,
                          normalizer: int | None = None) -> tuple[np.ndarray, Cache]:
    """Cross-entropy summed over the targets that are not ``ignore_index``, divided by ``normalizer``
    (default: their number, i.e. the mean).

    A larger ``normalizer`` is the loss of one micro-batch of a bigger batch (gradient accumulation or
    data parallelism divide every micro-batch's sum by the global token count).

    logits (B, T, V), targets (B, T) int -> scalar loss (0-d array, logits' dtype). Every target is a
    class in ``[0, V)`` or ``ignore_index`` (default -1, PyTorch's convention in nanoGPT); anything else
    raises ``ValueError``.
    """
    logits = np.asarray(logits)
    if logits.dtype.kind != "f" or logits.ndim < 1 or logits.shape[-1] < 1:
        raise ValueError(f"logits must be a float array (..., V) with V >= 1, got {logits.dtype} {logits.shape}")
    ignore_index = check_int(ignore_index, "ignore_index")
    V = logits.shape[-1]
    targets = _check_ids(targets, V, "targets", ignore_index=ignore_index)
    if targets.shape != logits.shape[:-1]:
        raise ValueError(f"targets must have shape {logits.shape[:-1]} (the logits' without V), "
                         f"got {targets.shape}")
    z = logits.reshape(-1, V)                                     # (N, V)
    t = targets.reshape(-1)                                       # (N,)
    valid = t != ignore_index
    n = max(int(valid.sum()), 1) if normalizer is None else check_int(normalizer, "normalizer", lo=1)
    m = z.max(axis=-1, keepdims=True)
    e = np.exp(z - m)
    s = e.sum(axis=-1, keepdims=True)
    logp = z - m - np.log(s)                                      # (N, V)
    tt = np.where(valid, t, 0)
    nll = -logp[np.arange(z.shape[0]), tt]                        # (N,)
    loss = (nll * valid).sum() / n
    probs = e / s
    return np.asarray(loss, dtype=logits.dtype), (probs, tt, valid, n, logits.shape)


@ieee_mode
def cross_entropy_backward(dloss: float | np.ndarray, cache: Cache) -> np.ndarray:
    """dlogits (B, T, V) = dloss * (softmax - onehot) / normalizer on the valid rows, 0 elsewhere.

    ``dloss`` is 1 for the plain loss, or the loss scale S when the loss was scaled.
    """
    probs, tt, valid, n, shape = cache
    d = np.array(probs)
    d[np.arange(d.shape[0]), tt] -= 1.0
    d *= (np.asarray(dloss, dtype=d.dtype) / np.asarray(n, dtype=d.dtype)) * valid[:, None].astype(d.dtype)
    return np.asarray(d.reshape(shape))
