"""FlashAttention emulated tile by tile: FlashAttention-2's forward and recomputing backward, and FP8
attention as FlashAttention-3 computes it (block-quantized E4M3 Q, K, V, optionally rotated).

The standard path (:mod:`fpsim.nn.attention`) materialises the T x T scores and probabilities and keeps
P for the backward pass. FlashAttention (Dao et al. 2022; FA-2, arXiv 2307.08691) never does: for each
block of Br query rows it walks the key/value blocks of Bc rows, keeping a running row maximum ``m`` and
row sum ``l`` in FP32 and rescaling its output accumulator whenever the maximum grows::

    for each query tile Q_i (Br x d):              m = -inf, l = 0, acc = 0       (FP32)
        for each key tile j (Bc x d), skipping tiles the causal mask hides:
            S   = (Q_i K_j^T) * scale                 GEMM, FP32 accumulator, never rounded
            m'  = max(m, rowmax S);  P~ = exp(S - m')  FP32
            l   = exp(m - m') l + rowsum P~           FP32, from the *unrounded* P~ (as the kernels do)
            acc = P~ V_j + exp(m - m') acc            GEMM: P~ rounded to the input format as its operand,
                                                      the rescaled acc its C operand (accumulator)
            m   = m'
        O_i = acc / l  (stored in the input format);  L_i = m + log l  (FP32, kept for backward)

The backward pass recomputes S and P = exp(S - L) from Q, K and L tile by tile (FA-2's loop order: key
tiles outside, query tiles inside) and accumulates dV += P^T dO, dP = dO V^T, dS = P * (dP - D) with
D = rowsum(dO * O), dQ += dS K, dK += dS^T Q. So the cache holds Q, K, V, O and L: O(T) per head, never
a T x T array.

Where the rounding happens is what this module is for. Every GEMM goes through the precision object:
when it has the optional hook ``matmul_accumulate(a, b, site, kind, c=None)`` (``c + a @ b`` with the
operand casts and GEMM of the precision, the result left in the FP32 accumulator, as inside a fused
kernel) it is used; otherwise ``prec.matmul(...)[0]`` is (whose output cast then rounds S and each
P~ V_j partial product: :data:`~fpsim.nn.FULL` does no rounding, so the float64 oracle is unaffected).
:class:`KernelPrecision` implements the hook for a kernel's own formats (BF16 / FP16 / E4M3 operands,
FP32 accumulation, ``gemm="fast"`` or a device's Tensor Core model from :mod:`fpsim.mma`), and so does
``fpsim.amp``'s policy runtime for every training policy. The final O,
dQ, dK and dV are stored through ``prec.act(..., "scale")`` / ``prec.grad(..., "scale")``: the kernel
writes them in its input format.

>>> import numpy as np
>>> from fpsim.nn.flash import flash_attention, reference_attention
>>> rng = np.random.default_rng(0)
>>> q, k, v = rng.standard_normal((3, 1, 2, 10, 4))
>>> o, lse = flash_attention(q, k, v, block_q=4, block_k=3)
>>> bool(np.abs(o - reference_attention(q, k, v)).max() < 1e-14)
True
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._blas import matmul as _blas_matmul
from .._checks import check_bool, check_int, check_real
from .._fpenv import ieee_mode
from .._interop import as_array
from .._names import norm_name
from ..formats import Format, as_format
from ..rounding import round as fround
from .attention import _check_attention_input, _check_attention_weights
from .layers import linear_backward, linear_forward, softmax_forward
from .precision import FULL, Precision, _matmul_grads, current_precision

__all__ = [
    "KernelPrecision",
    "flash_attention",
    "flash_attention_backward",
    "flash_attention_forward",
    "flash_attention_grads",
    "fp8_attention",
    "hadamard",
    "random_hadamard",
    "reference_attention",
]

_F32 = np.float32


# ----------------------------------------------------------------------------------------- kernel precision

@ieee_mode
class KernelPrecision:
    """The formats inside one fused attention kernel: operands rounded to ``operands``, products
    accumulated in FP32, stored results rounded to ``out``.

    Parameters
    ----------
    operands : Format or str
        Format of every GEMM operand (Q, K, V, the probabilities P~, dO, dS): ``"bf16"``, ``"fp16"``,
        ``"fp8_e4m3"``, ...
    out : Format or str, optional
        Format of stored results (``act``/``grad`` and the output cast of :meth:`matmul`); default
        ``operands``. FlashAttention-3's FP8 kernel reads E4M3 and writes BF16.
    gemm : str
        ``"fast"``: round the operands, multiply with float32 BLAS (FP32 accumulation); any other value is a
        device for :func:`fpsim.mma.get_model` (``"h100"``, ``"a100"``, ...): the bit-exact Tensor Core
        model, accumulating into the kernel's FP32 registers (``c``) as the MMA instructions do.
    rounding : str
        Rounding mode of the casts (``"rne"``).
    fp32_ops : tuple of str
        Ops whose ``act`` output stays FP32 (default none: a pure-BF16 eager baseline rounds the softmax
        too; pass ``("softmax",)`` for autocast's choice).

    Examples
    --------
    >>> import numpy as np
    >>> kp = KernelPrecision("bf16")
    >>> a = np.full((1, 3), 1 + 2.0**-10, dtype=np.float32)
    >>> float(kp.matmul_accumulate(a, np.ones((3, 1), np.float32), "s", "attn")[0, 0])   # operands rounded
    3.0
    """

    def __init__(self, operands: Format | str = "bf16", *, out: Format | str | None = None, gemm: str = "fast",
                 rounding: str = "rne", fp32_ops: tuple[str, ...] = ()) -> None:
        self.operands = as_format(operands)
        self.out = self.operands if out is None else as_format(out)
        self.rounding = rounding
        if isinstance(fp32_ops, str) or not isinstance(fp32_ops, (tuple, list)) \
                or not all(isinstance(o, str) for o in fp32_ops):
            raise TypeError(f"KernelPrecision.fp32_ops must be a tuple of op names such as ('softmax',), "
                            f"got {type(fp32_ops).__name__}: {fp32_ops!r}")
        self.fp32_ops = tuple(fp32_ops)
        key = norm_name(gemm, "KernelPrecision.gemm")
        self.gemm = key
        self._model: Any = None
        if key != "fast":
            from .. import mma  # L2; only for a device GEMM

            self._model = mma.get_model(key, self.operands, "fp32")
        fround(np.zeros(1, _F32), self.operands, rounding)  # a bad mode fails here, not at the first GEMM

    def __repr__(self) -> str:
        return f"KernelPrecision({self.operands.name!r}, out={self.out.name!r}, gemm={self.gemm!r})"

    def _cast(self, x: np.ndarray, fmt: Format) -> np.ndarray:
        x = np.asarray(x)
        if x.dtype != _F32:
            x = x.astype(_F32)   # carriers are float32 (every kernel format fits)
        return np.asarray(fround(x, fmt, self.rounding, overflow="saturate"), dtype=_F32)

    def matmul_accumulate(self, a: np.ndarray, b: np.ndarray, site: str, kind: str,
                          c: np.ndarray | None = None) -> np.ndarray:
        """``c + a @ b`` with both operands rounded to :attr:`operands`, the result an FP32 accumulator."""
        ac, bc = self._cast(a, self.operands), self._cast(b, self.operands)
        if self._model is not None:
            from .. import mma

            return np.asarray(mma.matmul(ac, bc, c, model=self._model), dtype=_F32)
        out = np.asarray(_blas_matmul(ac, bc))
        return out if c is None else np.asarray(c, _F32) + out

    def matmul(self, a: np.ndarray, b: np.ndarray, site: str, kind: str,
               bias: np.ndarray | None = None) -> tuple[np.ndarray, Any]:
        """``a @ b (+ bias)`` rounded to :attr:`out` (a GEMM that writes its result to memory)."""
        out = self.matmul_accumulate(a, b, site, kind)
        if bias is not None:
            out = out + self._cast(bias, self.out)
        ac, bc = self._cast(a, self.operands), self._cast(b, self.operands)
        return self._cast(out, self.out), (ac, bc, bias is not None)

    def matmul_backward(self, dout: np.ndarray, cache: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        ac, bc, has_bias = cache
        da, db, dbias = _matmul_grads(self._cast(dout, self.operands), ac, bc, has_bias)
        return (self._cast(da, self.out), self._cast(db, self.out),
                None if dbias is None else self._cast(dbias, self.out))

    def act(self, x: np.ndarray, site: str, op: str) -> np.ndarray:
        return np.asarray(x, _F32) if op in self.fp32_ops else self._cast(x, self.out)

    def grad(self, g: np.ndarray, site: str, op: str) -> np.ndarray:
        return np.asarray(g, _F32) if op in self.fp32_ops else self._cast(g, self.out)


def _mm(prec: Precision, a: np.ndarray, b: np.ndarray, site: str, c: np.ndarray | None = None) -> np.ndarray:
    """``c + a @ b`` as a fused kernel computes it: the precision's accumulator when it offers one."""
    hook = getattr(prec, "matmul_accumulate", None)
    if hook is not None:
        return np.asarray(hook(a, b, site, "attn", c))
    out = np.asarray(prec.matmul(a, b, site, "attn")[0])
    return out if c is None else c + out


# ----------------------------------------------------------------------------------------------- checks

def _check_qkv(q: Any, k: Any, v: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    q, k, v = (as_array(a, n, carrier=True) for a, n in ((q, "q"), (k, "k"), (v, "v")))
    for name, a in (("q", q), ("k", k), ("v", v)):
        if a.dtype.kind != "f":
            raise TypeError(f"{name} must be a float array, got dtype {a.dtype}")
        if a.ndim != 4:
            raise ValueError(f"{name} must be (B, n_head, T, head_dim), got shape {a.shape}")
    if q.shape != k.shape or q.shape != v.shape:
        raise ValueError(f"q, k, v must have one shape (B, n_head, T, head_dim), got {q.shape}, {k.shape}, {v.shape}")
    if q.shape[-1] == 0:
        raise ValueError(f"head_dim must be >= 1, got q, k, v of shape {q.shape}")
    return q, k, v


def _check_prec(prec: Any) -> Precision:
    if not isinstance(prec, Precision):
        raise TypeError(f"prec must be a Precision (fpsim.nn.FULL, a KernelPrecision, a policy runtime), "
                        f"got {type(prec).__name__}: {prec!r}")
    return prec


def _opts(block_q: Any, block_k: Any, causal: Any, scale: Any, hd: int) -> tuple[int, int, bool, float]:
    bq = check_int(block_q, "block_q", lo=1)
    bk = check_int(block_k, "block_k", lo=1)
    c = check_bool(causal, "causal")
    s = 1.0 / float(np.sqrt(hd)) if scale is None else check_real(scale, "scale", lo=0.0, lo_open=True)
    return bq, bk, c, s


def _acc_dtype(*arrays: np.ndarray) -> np.dtype[Any]:
    """FP32 statistics for float32/16 carriers; float64 inputs (the oracle) keep float64."""
    return np.result_type(*arrays, np.float32)


def _tile_mask(i0: int, i1: int, j0: int, j1: int) -> np.ndarray | None:
    """Causal mask (col <= row) of the tile rows [i0, i1) x cols [j0, j1); None when nothing is hidden."""
    if j1 - 1 <= i0:
        return None
    return np.arange(j0, j1)[None, :] <= np.arange(i0, i1)[:, None]                   # (Br, Bc)


# ------------------------------------------------------------------------------------------ forward core

def _flash_fwd(q: np.ndarray, k: np.ndarray, v: np.ndarray, prec: Precision, site: str, bq: int, bk: int,
               causal: bool, scale: float, q_descale: np.ndarray | None = None,
               k_descale: np.ndarray | None = None, v_descale: np.ndarray | None = None,
               p_scale: float = 1.0, stats: Format | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The FA-2 forward loop. Descales (B, nh, n_tiles): FP8 block scales applied in the GEMM epilogue.
    ``stats``: a format the S tile, the running max, sum and output accumulator are rounded to after each
    update (None: kept in the carrier, FP32 registers as the kernels do)."""
    B, H, T, hd = q.shape
    dt = _acc_dtype(q, k, v)

    def r(x: np.ndarray) -> np.ndarray:
        return x if stats is None else np.asarray(fround(x, stats), dtype=dt)
    sc = dt.type(scale)
    ps = dt.type(p_scale)
    o = np.empty((B, H, T, hd), dtype=dt)
    lse = np.empty((B, H, T), dtype=dt)
    kt = np.swapaxes(k, -1, -2)                                                        # (B, H, hd, T)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        for ti, i0 in enumerate(range(0, T, bq)):
            i1 = min(i0 + bq, T)
            qi = q[:, :, i0:i1]                                                        # (B, H, Br, hd)
            m = np.full((B, H, i1 - i0), -np.inf, dtype=dt)                            # (B, H, Br)
            l = np.zeros((B, H, i1 - i0), dtype=dt)
            acc = np.zeros((B, H, i1 - i0, hd), dtype=dt)                              # (B, H, Br, hd)
            for tj, j0 in enumerate(range(0, T, bk)):
                if causal and j0 > i1 - 1:
                    break                                                              # tile fully masked
                j1 = min(j0 + bk, T)
                s = r(_mm(prec, qi, kt[..., j0:j1], f"{site}.qk").astype(dt, copy=False))  # (B, H, Br, Bc)
                if q_descale is not None and k_descale is not None:
                    s = s * (q_descale[:, :, ti] * k_descale[:, :, tj])[:, :, None, None]
                s = s * sc
                mask = _tile_mask(i0, i1, j0, j1) if causal else None
                if mask is not None:
                    s = np.where(mask, s, dt.type(-np.inf))
                s = r(s)
                m_new = np.maximum(m, s.max(axis=-1))                                  # (B, H, Br)
                p = np.exp(s - m_new[..., None])                                       # (B, H, Br, Bc)
                if ps != 1:
                    p = p * ps                                                         # FA-3's static P scale
                alpha = np.exp(m - m_new)                                              # (B, H, Br)
                l = r(alpha * l + p.sum(axis=-1))
                if v_descale is None and stats is None:
                    # FA-2 (flash_fwd_kernel.h): softmax_rescale_o scales acc_o, then gemm_rs(acc_o, P, V)
                    # accumulates into it: the rescaled O is the C operand of the P V MMA chain
                    acc = _mm(prec, p, v[:, :, j0:j1], f"{site}.pv",
                              alpha[..., None] * acc).astype(dt, copy=False)           # (B, H, Br, hd)
                else:
                    # block-scaled FP8 (a per-tile V decode factor) or BF16 statistics: P V is a separate
                    # partial product, decoded / rounded, then added to the rescaled accumulator
                    pv = r(_mm(prec, p, v[:, :, j0:j1], f"{site}.pv").astype(dt, copy=False))
                    if v_descale is not None:
                        pv = pv * v_descale[:, :, tj][:, :, None, None]
                    acc = r(alpha[..., None] * acc + pv)
                m = m_new
            o[:, :, i0:i1] = acc / l[..., None]
            lse[:, :, i0:i1] = m + np.log(l) - np.log(ps)
    return o, lse


@ieee_mode
def flash_attention(q: Any, k: Any, v: Any, *, prec: Precision = FULL, site: str = "attn", block_q: int = 64,
                    block_k: int = 64, causal: bool = True, scale: float | None = None,
                    stats_format: Format | str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """FlashAttention-2's tiled forward pass on per-head inputs.

    Parameters
    ----------
    q, k, v : ndarray, shape (B, n_head, T, head_dim)
    prec : Precision
        Where the GEMMs, the output store and (via ``matmul_accumulate``) the FP32 accumulators come from;
        :data:`~fpsim.nn.FULL` rounds nothing (float64 in, float64 out: the oracle).
    site : str
        Name prefix for the precision's per-tensor state (``"h0.attn"``).
    block_q, block_k : int
        Tile sizes Br (query rows) and Bc (key rows); need not divide T.
    causal : bool
        Mask keys after the query (tiles entirely above the diagonal are skipped, never computed).
    scale : float, optional
        Softmax scale; default ``1/sqrt(head_dim)``.
    stats_format : Format or str, optional
        Not what the kernels do, for experiments: round each S tile, the running sum and the output
        accumulator to this format after every update (``"bf16"``: a flash loop whose intermediates are
        BF16, the setting in which Golden et al. see flash deviate more than standard attention).
        Default None: FP32 registers.

    Returns
    -------
    o : ndarray, shape (B, n_head, T, head_dim)
        The attention output, stored through ``prec.act(o, site + ".o", "scale")``.
    lse : ndarray, shape (B, n_head, T)
        Log-sum-exp of each row of the scaled scores (FP32; what the backward pass keeps).

    Examples
    --------
    >>> import numpy as np
    >>> q = k = v = np.ones((1, 1, 5, 2))
    >>> o, lse = flash_attention(q, k, v, block_q=2, block_k=2)
    >>> o.shape, lse.shape, float(o[0, 0, 4, 0])
    ((1, 1, 5, 2), (1, 1, 5), 1.0)
    """
    q, k, v = _check_qkv(q, k, v)
    prec = _check_prec(prec)
    bq, bk, c, s = _opts(block_q, block_k, causal, scale, q.shape[-1])
    st = None if stats_format is None else as_format(stats_format)
    o, lse = _flash_fwd(q, k, v, prec, site, bq, bk, c, s, stats=st)
    return np.asarray(prec.act(o, f"{site}.o", "scale")), lse


# ----------------------------------------------------------------------------------------- backward core

@ieee_mode
def flash_attention_grads(do: Any, q: Any, k: Any, v: Any, o: Any, lse: Any, *, prec: Precision = FULL,
                          site: str = "attn", block_q: int = 64, block_k: int = 64, causal: bool = True,
                          scale: float | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """FlashAttention-2's backward pass: ``(dq, dk, dv)`` from ``do`` and what the forward pass kept.

    S and P are recomputed tile by tile from q, k and the log-sum-exp ``lse`` (nothing T x T is read
    from memory): D = rowsum(do * o), then per (key tile j, query tile i): P = exp(S - L), dV_j += P^T dO_i,
    dP = dO_i V_j^T, dS = P * (dP - D_i), dQ_i += dS K_j, dK_j += dS^T Q_i (the softmax scale applied to
    dQ and dK at the end). Shapes as in :func:`flash_attention`; dq, dk, dv are stored through
    ``prec.grad(..., "scale")``.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(1)
    >>> q, k, v, do = rng.standard_normal((4, 1, 1, 6, 4))
    >>> o, lse = flash_attention(q, k, v, block_q=4, block_k=4)
    >>> dq, dk, dv = flash_attention_grads(do, q, k, v, o, lse, block_q=4, block_k=4)
    >>> dq.shape == q.shape and dv.shape == v.shape
    True
    """
    q, k, v = _check_qkv(q, k, v)
    prec = _check_prec(prec)
    do, o, lse = (as_array(a, n, carrier=True) for a, n in ((do, "do"), (o, "o"), (lse, "lse")))
    if do.shape != q.shape or o.shape != q.shape:
        raise ValueError(f"do and o must have q's shape {q.shape}, got {do.shape} and {o.shape}")
    if lse.shape != q.shape[:3]:
        raise ValueError(f"lse must be (B, n_head, T) = {q.shape[:3]}, got {lse.shape}")
    bq, bk, c, sc = _opts(block_q, block_k, causal, scale, q.shape[-1])
    dq, dk, dv = _flash_bwd(do, q, k, v, o, lse, prec, site, bq, bk, c, sc)
    return (np.asarray(prec.grad(dq, f"{site}.dq", "scale")), np.asarray(prec.grad(dk, f"{site}.dk", "scale")),
            np.asarray(prec.grad(dv, f"{site}.dv", "scale")))


def _flash_bwd(do: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, o: np.ndarray, lse: np.ndarray,
               prec: Precision, site: str, bq: int, bk: int, causal: bool,
               scale: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    B, H, T, hd = q.shape
    dt = _acc_dtype(q, k, v, do, o)
    sc = dt.type(scale)
    D = (do.astype(dt) * o.astype(dt)).sum(axis=-1)                                   # (B, H, T)
    dq = np.zeros((B, H, T, hd), dtype=dt)                                             # FP32 accumulators
    dk = np.zeros((B, H, T, hd), dtype=dt)
    dv = np.zeros((B, H, T, hd), dtype=dt)
    with np.errstate(invalid="ignore", over="ignore"):
        for j0 in range(0, T, bk):
            j1 = min(j0 + bk, T)
            kj, vj = k[:, :, j0:j1], v[:, :, j0:j1]                                    # (B, H, Bc, hd)
            kjt, vjt = np.swapaxes(kj, -1, -2), np.swapaxes(vj, -1, -2)                # (B, H, hd, Bc)
            for i0 in range(0, T, bq):
                i1 = min(i0 + bq, T)
                if causal and j0 > i1 - 1:
                    continue                                                           # tile fully masked
                qi, doi = q[:, :, i0:i1], do[:, :, i0:i1]                              # (B, H, Br, hd)
                s = _mm(prec, qi, kjt, f"{site}.qk").astype(dt, copy=False) * sc       # (B, H, Br, Bc)
                mask = _tile_mask(i0, i1, j0, j1) if causal else None
                if mask is not None:
                    s = np.where(mask, s, dt.type(-np.inf))
                p = np.exp(s - lse[:, :, i0:i1, None])                                 # (B, H, Br, Bc)
                pt = np.swapaxes(p, -1, -2)                                            # (B, H, Bc, Br)
                dv[:, :, j0:j1] = _mm(prec, pt, doi, f"{site}.pv", dv[:, :, j0:j1])    # (B, H, Bc, hd)
                dp = _mm(prec, doi, vjt, f"{site}.dp").astype(dt, copy=False)          # (B, H, Br, Bc)
                ds = p * (dp - D[:, :, i0:i1, None])                                   # (B, H, Br, Bc)
                dq[:, :, i0:i1] = _mm(prec, ds, kj, f"{site}.dq", dq[:, :, i0:i1])     # (B, H, Br, hd)
                dk[:, :, j0:j1] = _mm(prec, np.swapaxes(ds, -1, -2), qi, f"{site}.dk", dk[:, :, j0:j1])
    return dq * sc, dk * sc, dv


# ------------------------------------------------------------------------------------- the layer pair

@ieee_mode
def flash_attention_forward(x: np.ndarray, w_qkv: np.ndarray, b_qkv: np.ndarray | None, w_proj: np.ndarray,
                            b_proj: np.ndarray | None, n_head: int, *, prec: Precision | None = None,
                            site: str = "attn", block_q: int = 64, block_k: int = 64,
                            causal: bool = True) -> tuple[np.ndarray, Any]:
    """Self-attention with the flash core; the call and return of :func:`~fpsim.nn.attention_forward`.

    x (B, T, C), w_qkv (C, 3C), w_proj (C, C) -> out (B, T, C). The cache is a dict of the two linear
    caches and the arrays FlashAttention keeps: ``q``, ``k``, ``v``, ``o`` (B, nh, T, hd) and ``lse``
    (B, nh, T); no T x T array.

    Examples
    --------
    >>> import numpy as np
    >>> from fpsim.nn import attention_forward
    >>> rng = np.random.default_rng(0)
    >>> x, w, wp = rng.standard_normal((2, 7, 8)), rng.standard_normal((8, 24)), rng.standard_normal((8, 8))
    >>> out, cache = flash_attention_forward(x, w, None, wp, None, 2, block_q=3, block_k=2)
    >>> ref, _ = attention_forward(x, w, None, wp, None, 2)
    >>> bool(np.abs(out - ref).max() < 1e-12), sorted(k for k in cache if k in ("q", "k", "v", "o", "lse"))
    (True, ['k', 'lse', 'o', 'q', 'v'])
    """
    x, (B, T, C, n_head, hd) = _check_attention_input(x, n_head)
    _check_attention_weights(C, w_qkv, b_qkv, w_proj, b_proj)
    prec = _check_prec(current_precision(prec))  # None: the innermost fpsim.amp.autocast's, else FULL
    bq, bk, c, scale = _opts(block_q, block_k, causal, None, hd)
    qkv, c_qkv = linear_forward(x, w_qkv, b_qkv, prec=prec, site=f"{site}.qkv")        # (B, T, 3C)
    qkv = qkv.reshape(B, T, 3, n_head, hd).transpose(2, 0, 3, 1, 4)                  # (3, B, nh, T, hd)
    q, k, v = qkv[0], qkv[1], qkv[2]                                                 # each (B, nh, T, hd)
    o, lse = _flash_fwd(q, k, v, prec, site, bq, bk, c, scale)                       # (B,nh,T,hd), (B,nh,T)
    o = np.asarray(prec.act(o, f"{site}.o", "scale"))
    y = o.transpose(0, 2, 1, 3).reshape(B, T, C)                                     # (B, T, C)
    out, c_proj = linear_forward(y, w_proj, b_proj, prec=prec, site=f"{site}.proj")  # (B, T, C)
    cache = {"qkv": c_qkv, "proj": c_proj, "q": q, "k": k, "v": v, "o": o, "lse": lse,
             "shape": (B, T, C, n_head, hd), "tiles": (bq, bk, c, scale), "prec": prec, "site": site}
    return out, cache


@ieee_mode
def flash_attention_backward(dout: np.ndarray, cache: Any) -> dict[str, Any]:
    """Gradients ``{"x", "w_qkv", "b_qkv", "w_proj", "b_proj"}`` from dout (B, T, C), recomputing P."""
    if not isinstance(cache, dict) or "shape" not in cache:
        raise TypeError(f"cache must be the second value flash_attention_forward returned, got "
                        f"{type(cache).__name__}")
    B, T, C, nh, hd = cache["shape"]
    bq, bk, c, scale = cache["tiles"]
    prec, site = cache["prec"], cache["site"]
    dout = np.asarray(dout)
    if dout.shape != (B, T, C):
        raise ValueError(f"dout must have the layer output's shape (B, T, C) = {(B, T, C)}, got {dout.shape}")
    dy, dw_proj, db_proj = linear_backward(dout, cache["proj"])                      # dy (B, T, C)
    do = dy.reshape(B, T, nh, hd).transpose(0, 2, 1, 3)                              # (B, nh, T, hd)
    dq, dk, dv = _flash_bwd(do, cache["q"], cache["k"], cache["v"], cache["o"], cache["lse"], prec, site,
                            bq, bk, c, scale)                                         # each (B, nh, T, hd)
    dq, dk, dv = (np.asarray(prec.grad(g, f"{site}.{n}", "scale")) for g, n in ((dq, "dq"), (dk, "dk"), (dv, "dv")))
    dqkv = np.stack([dq, dk, dv])                                                    # (3, B, nh, T, hd)
    dqkv = dqkv.transpose(1, 3, 0, 2, 4).reshape(B, T, 3 * C)                        # (B, T, 3C)
    dx, dw_qkv, db_qkv = linear_backward(dqkv, cache["qkv"])
    return {"x": dx, "w_qkv": dw_qkv, "b_qkv": db_qkv, "w_proj": dw_proj, "b_proj": db_proj}


# ------------------------------------------------------------------------------------ naive reference

@ieee_mode
def reference_attention(q: Any, k: Any, v: Any, *, prec: Precision = FULL, site: str = "attn",
                        causal: bool = True, scale: float | None = None) -> np.ndarray:
    """Standard (materialised T x T) attention on per-head inputs, the operations of
    :func:`~fpsim.nn.attention_forward`'s core: ``S = q k^T`` (GEMM), ``S * scale`` (op ``"scale"``),
    mask, softmax (op ``"softmax"``), ``P v`` (GEMM); each result stored as ``prec`` stores it.

    q, k, v (B, n_head, T, head_dim) -> (B, n_head, T, head_dim).

    Examples
    --------
    >>> import numpy as np
    >>> float(reference_attention(*np.ones((3, 1, 1, 3, 2)))[0, 0, 2, 1])
    1.0
    """
    q, k, v = _check_qkv(q, k, v)
    prec = _check_prec(prec)
    T = q.shape[2]
    c = check_bool(causal, "causal")
    sc = 1.0 / float(np.sqrt(q.shape[-1])) if scale is None else check_real(scale, "scale", lo=0.0, lo_open=True)
    s, _ = prec.matmul(q, np.swapaxes(k, -1, -2), f"{site}.qk", "attn")              # (B, nh, T, T)
    s = prec.act(s * np.asarray(sc, dtype=s.dtype), f"{site}.scores", "scale")
    if c:
        s = np.where(np.tril(np.ones((T, T), dtype=bool)), s, np.asarray(-np.inf, dtype=s.dtype))
    p, _ = softmax_forward(s)
    p = prec.act(p, f"{site}.softmax", "softmax")
    y, _ = prec.matmul(p, v, f"{site}.pv", "attn")                                   # (B, nh, T, hd)
    return np.asarray(y)


# -------------------------------------------------------------------------------------------- FP8 (FA-3)

@ieee_mode
def hadamard(n: int) -> np.ndarray:
    """The n x n Sylvester Hadamard matrix (entries +-1, ``H H^T = n I``); n a power of two.

    Examples
    --------
    >>> hadamard(2).tolist()
    [[1.0, 1.0], [1.0, -1.0]]
    """
    n = check_int(n, "n", lo=1)
    if n & (n - 1):
        raise ValueError(f"hadamard: n must be a power of two, got {n}")
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])                                                # (2m, 2m)
    return h


@ieee_mode
def random_hadamard(n: int, seed: int = 0) -> np.ndarray:
    """A random orthogonal matrix ``M = diag(s) H / sqrt(n)`` with random signs ``s``: QuaRot/FA-3's
    rotation for incoherent processing (``(Q M)(K M)^T = Q K^T`` exactly in exact arithmetic).

    Examples
    --------
    >>> import numpy as np
    >>> m = random_hadamard(8, seed=3)
    >>> bool(np.allclose(m @ m.T, np.eye(8)))
    True
    """
    h = hadamard(n)
    s = np.random.default_rng(check_int(seed, "seed", lo=0)).choice(np.array([-1.0, 1.0]), size=n)
    out: np.ndarray = s[:, None] * h / np.sqrt(n)
    return out


def _quant_blocks(x: np.ndarray, fmt: Format, block: int | None,
                  rounding: str) -> tuple[np.ndarray, np.ndarray]:
    """x (B, H, T, d) -> (values of ``fmt`` (float32 carriers), decode factors (B, H, n_tiles)).

    One scale per block of ``block`` rows of each head (``None``: one per tensor): ``fmt.max / amax``
    in FP32, the cast saturating. The decode factor is its FP32 reciprocal.
    """
    B, H, T, d = x.shape
    x32 = x.astype(_F32)
    a = np.abs(x32)
    if block is None:
        amax = np.full((B, H, 1), a.max() if a.size else 0, dtype=_F32)               # (B, H, 1)
        rows = np.zeros(T, dtype=np.intp)
    else:
        nb = -(-T // block)
        pad = nb * block - T
        ap = np.pad(a, ((0, 0), (0, 0), (0, pad), (0, 0))) if pad else a            # (B, H, nb*block, d)
        amax = ap.reshape(B, H, nb, block * d).max(axis=-1)                           # (B, H, nb)
        rows = np.arange(T) // block
    # an all-zero block gets scale 1; a NaN amax stays NaN, so the block's scale, values and decode factor
    # are NaN, as a kernel computing the scale from a NaN amax would have it (the NaN is not hidden)
    amax = np.where((amax > 0) | np.isnan(amax), amax, _F32(1))
    enc = (_F32(fmt.max) / amax).astype(_F32)                                         # (B, H, nb)
    xq = np.asarray(fround(x32 * enc[:, :, rows, None], fmt, rounding, overflow="saturate"), _F32)
    return xq, (_F32(1) / enc).astype(_F32)


@ieee_mode
def fp8_attention(q: Any, k: Any, v: Any, *, rotate: bool = False, block_scaling: bool = True,
                  block_q: int = 64, block_k: int = 64, causal: bool = True, scale: float | None = None,
                  qkv_format: Format | str = "fp8_e4m3", out_format: Format | str = "bf16",
                  p_scale: float = 1.0, gemm: str = "fast", seed: int = 0, tiled: bool = True) -> np.ndarray:
    """FP8 attention as FlashAttention-3 computes it (forward only).

    Q, K, V are quantized to ``qkv_format`` (E4M3) with one FP32 scale per tile (Q per ``block_q`` rows,
    K and V per ``block_k`` rows, per head; ``block_scaling=False``: one scale per tensor, the baseline),
    after multiplying Q and K by a random Hadamard rotation when ``rotate`` (incoherent processing: the
    outliers of a few channels are spread over all of them, so the block amax, and the quantization step,
    shrink). The tiles then run through the FA-2 loop of :func:`flash_attention` with E4M3 GEMM operands
    (P~ too, multiplied by ``p_scale`` before its cast: FA-3 later used 256 so that small probabilities do
    not flush in E4M3), FP32 accumulation, the block decode factors applied to each tile's accumulator,
    and O stored in ``out_format``.

    ``tiled=False`` is the baseline FP8 attention FA-3 compares against: the standard (materialised)
    path with FP8 Q, K, V (per-tensor scales: needs ``block_scaling=False``), S and the softmax in FP32,
    and the *normalised* P cast to E4M3 for the P V GEMM (its small probabilities fall into E4M3's
    subnormals; the flash loop casts P~ = exp(S - m), whose row maximum is 1).

    q, k, v (B, n_head, T, head_dim), head_dim a power of two when ``rotate``; returns O (B, n_head, T,
    head_dim) as float32 carriers of ``out_format``.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.standard_normal((3, 1, 2, 32, 16))
    >>> ref = reference_attention(q, k, v)
    >>> err = [float(np.sqrt(np.mean((fp8_attention(q, k, v, rotate=r, block_q=16, block_k=16) - ref) ** 2)))
    ...        for r in (False, True)]
    >>> all(0 < e < 0.1 for e in err)
    True
    """
    q, k, v = _check_qkv(q, k, v)
    hd = q.shape[-1]
    seed = check_int(seed, "seed", lo=0)
    bq, bk, c, sc = _opts(block_q, block_k, causal, scale, hd)
    fmt = as_format(qkv_format)
    prec = KernelPrecision(fmt, out=out_format, gemm=gemm)
    ps = check_real(p_scale, "p_scale", lo=0.0, lo_open=True)
    if check_bool(rotate, "rotate"):
        m = random_hadamard(hd, seed).astype(q.dtype)                                 # (hd, hd)
        q, k = _blas_matmul(q, m), _blas_matmul(k, m)                                 # (B, nh, T, hd)
    blk = check_bool(block_scaling, "block_scaling")
    q8, qd = _quant_blocks(q, fmt, bq if blk else None, prec.rounding)
    k8, kd = _quant_blocks(k, fmt, bk if blk else None, prec.rounding)
    v8, vd = _quant_blocks(v, fmt, bk if blk else None, prec.rounding)
    if not check_bool(tiled, "tiled"):
        if blk:
            raise ValueError("fp8_attention(tiled=False) is the per-tensor baseline: pass block_scaling=False")
        acc = KernelPrecision(fmt, out="fp32", gemm=gemm)   # S, softmax and P V kept in FP32, P cast to E4M3
        o = reference_attention(q8, k8, v8, prec=acc, site="fp8", causal=c,
                                scale=float(np.float32(sc) * qd.ravel()[0] * kd.ravel()[0]))  # (B, nh, T, hd)
        return prec.act(o * vd.ravel()[0], "fp8.o", "scale")
    nq, nk = -(-q.shape[2] // bq), -(-q.shape[2] // bk)
    if not blk:   # one factor per tensor, the same for every tile
        qd, kd, vd = (np.broadcast_to(d, d.shape[:2] + (n,)) for d, n in ((qd, nq), (kd, nk), (vd, nk)))
    o, _ = _flash_fwd(q8, k8, v8, prec, "fp8", bq, bk, c, sc, qd, kd, vd, ps)
    return prec.act(o, "fp8.o", "scale")
