"""Causal multi-head self-attention as an explicit forward/backward pair.

The sequence of operations (and so of precision decisions) follows nanoGPT's non-flash path::

    qkv = x @ W_qkv + b_qkv                 GEMM ("linear")
    s   = (q @ k^T) * 1/sqrt(hd)            GEMM ("attn"), then an elementwise scale ("scale")
    p   = softmax(masked s)                 "softmax" (autocast keeps it in FP32)
    y   = p @ v                             GEMM ("attn")
    out = merge_heads(y) @ W_proj + b_proj  GEMM ("linear")
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._checks import check_bool, check_int
from .._fpenv import ieee_mode
from . import recompute as _recompute
from .layers import linear_backward, linear_forward, softmax_backward, softmax_forward
from .precision import Precision, current_precision

__all__ = ["attention_backward", "attention_forward"]


def _check_attention_input(x: Any, n_head: Any) -> tuple[np.ndarray, tuple[int, int, int, int, int]]:
    """x as an array of shape (B, T, C) and ``(B, T, C, n_head, head_dim)``; the checks every attention
    implementation (standard, flash) makes before any work."""
    x = np.asarray(x)
    if x.ndim != 3:
        raise ValueError(f"x must be (B, T, C), got shape {x.shape}")
    B, T, C = x.shape
    n_head = check_int(n_head, "n_head", lo=1)
    if C % n_head:
        raise ValueError(f"n_embd={C} is not divisible by n_head={n_head}")
    hd = C // n_head
    if hd == 0:
        raise ValueError(f"head_dim = n_embd // n_head must be >= 1, got n_embd={C}, n_head={n_head}")
    return x, (B, T, C, n_head, hd)


def _check_attention_weights(C: int, w_qkv: Any, b_qkv: Any, w_proj: Any, b_proj: Any) -> None:
    """The projections' shapes for n_embd ``C`` (a ValueError naming the one that does not fit, rather
    than a reshape error deep inside)."""
    for name, a, want in (("w_qkv", w_qkv, (C, 3 * C)), ("b_qkv", b_qkv, (3 * C,)), ("w_proj", w_proj, (C, C)),
                          ("b_proj", b_proj, (C,))):
        if (a is not None or name[0] == "w") and np.shape(a) != want:
            raise ValueError(f"{name} must have shape {want} for n_embd={C}, got {np.shape(a)}")


@ieee_mode
def attention_forward(x: np.ndarray, w_qkv: np.ndarray, b_qkv: np.ndarray | None, w_proj: np.ndarray,
                      b_proj: np.ndarray | None, n_head: int, *, prec: Precision | None = None,
                      site: str = "attn", recompute_core: bool = False) -> tuple[np.ndarray, Any]:
    """Causal self-attention. x (B, T, C), w_qkv (C, 3C), w_proj (C, C) -> out (B, T, C).

    ``recompute_core=True`` is selective recomputation (Korthikanti et al. 2022): the cache keeps only
    the inputs of the attention core (q, k, v) instead of its T x T tensors (probabilities, their
    low-precision copy, the mask); :func:`attention_backward` runs the core again, bit-identically
    (see :mod:`fpsim.nn.recompute`).

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> x = rng.standard_normal((2, 5, 8))
    >>> out, cache = attention_forward(x, rng.standard_normal((8, 24)), None, rng.standard_normal((8, 8)), None, 2)
    >>> out.shape
    (2, 5, 8)
    """
    prec = current_precision(prec)  # None: the innermost fpsim.amp.autocast's, else FULL
    x, (B, T, C, n_head, hd) = _check_attention_input(x, n_head)
    _check_attention_weights(C, w_qkv, b_qkv, w_proj, b_proj)
    recompute_core = check_bool(recompute_core, "recompute_core")
    qkv, c_qkv = linear_forward(x, w_qkv, b_qkv, prec=prec, site=f"{site}.qkv")        # (B, T, 3C)
    qkv = qkv.reshape(B, T, 3, n_head, hd).transpose(2, 0, 3, 1, 4)                  # (3, B, nh, T, hd)
    q, k, v = qkv[0], qkv[1], qkv[2]                                                 # each (B, nh, T, hd)
    kt = np.ascontiguousarray(k.transpose(0, 1, 3, 2))                               # (B, nh, hd, T)
    q, v = np.ascontiguousarray(q), np.ascontiguousarray(v)                          # (B, nh, T, hd)
    scale = np.asarray(1.0 / np.sqrt(hd), dtype=x.dtype)
    state = _recompute.snapshot(prec) if recompute_core else None
    y, core = _core_forward(q, kt, v, scale, prec, site)                             # (B, nh, T, hd)
    c_qk, c_sm, c_pv = core[0], core[1], core[2]
    mask: np.ndarray | None = core[3]
    if recompute_core:  # keep the core's inputs, drop its T x T tensors (rebuilt in the backward pass)
        c_qk, c_sm, c_pv, mask = _CoreInputs(q, kt, v, state), None, None, None
    y = y.transpose(0, 2, 1, 3).reshape(B, T, C)                                     # (B, T, C)
    out, c_proj = linear_forward(y, w_proj, b_proj, prec=prec, site=f"{site}.proj")  # (B, T, C)
    cache = (c_qkv, c_qk, c_sm, c_pv, c_proj, mask, scale, (B, T, C, n_head, hd), prec, site)
    return out, cache


class _CoreInputs:
    """What selective recomputation keeps of the attention core: q, k^T, v and the precision snapshot."""

    __slots__ = ("kt", "q", "state", "v")

    def __init__(self, q: np.ndarray, kt: np.ndarray, v: np.ndarray, state: Any) -> None:
        self.q, self.kt, self.v, self.state = q, kt, v, state


def _core_forward(q: np.ndarray, kt: np.ndarray, v: np.ndarray, scale: np.ndarray, prec: Precision,
                  site: str) -> tuple[np.ndarray, tuple[Any, Any, Any, np.ndarray]]:
    """The attention core: softmax(mask(q k^T * scale)) v; returns y and (c_qk, c_sm, c_pv, mask)."""
    T = q.shape[-2]
    s, c_qk = prec.matmul(q, kt, f"{site}.qk", "attn")                               # (B, nh, T, T)
    s = prec.act(s * scale, f"{site}.scores", "scale")
    mask = np.tril(np.ones((T, T), dtype=bool))                                     # causal: j <= i
    s = np.where(mask, s, np.asarray(-np.inf, dtype=s.dtype))
    p, c_sm = softmax_forward(s)
    p = prec.act(p, f"{site}.softmax", "softmax")
    y, c_pv = prec.matmul(p, v, f"{site}.pv", "attn")                                # (B, nh, T, hd)
    return y, (c_qk, c_sm, c_pv, mask)


@ieee_mode
def attention_backward(dout: np.ndarray, cache: Any) -> dict[str, Any]:
    """Gradients: ``{"x", "w_qkv", "b_qkv", "w_proj", "b_proj"}`` from dout (B, T, C)."""
    c_qkv, c_qk, c_sm, c_pv, c_proj, mask, scale, (B, T, C, nh, hd), prec, site = cache
    if isinstance(c_qk, _CoreInputs):  # selective recomputation: rebuild the core's cache, same bits
        ci = c_qk
        with _recompute.replaying(prec, ci.state, site):
            _, (c_qk, c_sm, c_pv, mask) = _core_forward(ci.q, ci.kt, ci.v, scale, prec, site)
        _recompute._transient(f"recompute {site}", site, ((c_qk, c_sm, c_pv, mask), prec))
    dy, dw_proj, db_proj = linear_backward(dout, c_proj)                             # dy (B, T, C)
    dy = np.ascontiguousarray(dy.reshape(B, T, nh, hd).transpose(0, 2, 1, 3))       # (B, nh, T, hd)
    dp, dv, _ = prec.matmul_backward(dy, c_pv)                                       # (B,nh,T,T), (B,nh,T,hd)
    dp = prec.grad(dp, f"{site}.softmax", "softmax")
    ds = softmax_backward(dp, c_sm)                                                  # (B, nh, T, T)
    ds = np.where(mask, ds, np.zeros((), dtype=ds.dtype))
    ds = prec.grad(ds, f"{site}.scores", "scale")
    dq, dkt, _ = prec.matmul_backward(ds * scale, c_qk)                              # (B,nh,T,hd), (B,nh,hd,T)
    dk = dkt.transpose(0, 1, 3, 2)
    # (B, T, 3, nh, hd) written once (np.stack then a transposed copy made the same values twice)
    dqkv = np.empty((B, T, 3, nh, hd), dtype=np.result_type(dq, dk, dv))
    for j, d in enumerate((dq, dk, dv)):
        dqkv[:, :, j] = d.transpose(0, 2, 1, 3)
    dqkv = dqkv.reshape(B, T, 3 * C)                                                 # (B, T, 3C)
    dx, dw_qkv, db_qkv = linear_backward(dqkv, c_qkv)
    return {"x": dx, "w_qkv": dw_qkv, "b_qkv": db_qkv, "w_proj": dw_proj, "b_proj": db_proj}
