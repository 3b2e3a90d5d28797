"""LoRA (Hu et al., arXiv 2106.09685): low-rank adapters on a frozen linear layer.

``out = x @ W + b + (alpha / r) * (x @ A.T) @ B.T`` with the base ``W`` (Cin, Cout) frozen, ``A`` (r, Cin)
random (kaiming-uniform with a = sqrt(5), bound ``1/sqrt(Cin)``, as peft initialises ``lora_A``) and
``B`` (Cout, r) zero, so the first forward pass is the base model's bit for bit (the adapter term is an
exact zero). Only ``A`` and ``B`` get gradients.

Two ways in, one arithmetic:

* :func:`lora_linear_forward` / :func:`lora_linear_backward`: the layer pair (llm.c style), every GEMM
  through the :class:`~fpsim.nn.Precision` hooks (sites ``site``, ``site.lora_a``, ``site.lora_b``).
* :class:`LoRAPrecision`: wraps any precision object (any policy) and adds the adapters to the GEMMs at
  the named sites, so :func:`~fpsim.nn.gpt_forward`/``gpt_backward`` fine-tune with LoRA unchanged; the
  adapter gradients collect in :attr:`LoRAPrecision.grads`. The technique is a layer-level change
  every policy then applies to (design.md). The frozen base's weight gradient is still computed by the
  wrapped policy's backward and discarded (the GEMM is the policy's; real LoRA kernels skip it).

The base weight arrives as a float carrier: what the caller stores (BF16, FP16, int8 per channel, NF4)
is dequantized by the caller (:mod:`fpsim.train.finetune`); this layer never imports a quantizer.

>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> x, w = rng.standard_normal((2, 8)), rng.standard_normal((8, 3))
>>> A, B = lora_init(8, 3, r=2, rng=rng)
>>> out, cache = lora_linear_forward(x, w, None, A, B, scale=2.0)
>>> bool(np.array_equal(out, x @ w))                  # B = 0: exactly the base layer
True
>>> dx, dA, dB = lora_linear_backward(np.ones((2, 3)), cache)
>>> dA.shape, dB.shape
((2, 8), (3, 2))
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .._checks import check_int, check_real
from .._fpenv import ieee_mode
from .._interop import as_array
from .precision import Precision, current_precision

__all__ = ["LORA_SITES", "LoRAPrecision", "lora_init", "lora_linear_backward", "lora_linear_forward"]

#: The GPT's linear sites LoRA adapts by default (every block's attention and MLP projections).
LORA_SITES = ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj")


@ieee_mode
def lora_init(c_in: int, c_out: int, r: int, rng: np.random.Generator | None = None,
              dtype: Any = np.float32) -> tuple[np.ndarray, np.ndarray]:
    """``A`` (r, c_in) kaiming-uniform (a = sqrt(5): U(-1/sqrt(c_in), 1/sqrt(c_in)), peft's default) and
    ``B`` (c_out, r) zeros."""
    c_in, c_out = check_int(c_in, "c_in", lo=1), check_int(c_out, "c_out", lo=1)
    r = check_int(r, "r", lo=1)
    rng = np.random.default_rng() if rng is None else rng
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    bound = 1.0 / np.sqrt(c_in)
    A = rng.uniform(-bound, bound, size=(r, c_in)).astype(dtype)
    return A, np.zeros((c_out, r), dtype)


def _float_array(a: Any, name: str) -> np.ndarray:
    """``a`` as a real numeric array (TypeError naming it otherwise: a str, bool or object array)."""
    arr = as_array(a, name, carrier=True)
    if arr.dtype.kind not in "fiu":
        raise TypeError(f"{name} must be a real float array, got {type(a).__name__} of dtype {arr.dtype}")
    return arr


def _check_adapter(site: object, ab: object) -> None:
    if not isinstance(ab, (tuple, list)) or len(ab) != 2:
        raise TypeError(f"adapters[{site!r}] must be a pair (A, B) of arrays, got {type(ab).__name__}")
    A, B = (_float_array(m, f"adapters[{site!r}][{i}]") for i, m in enumerate(ab))
    if A.ndim != 2 or B.ndim != 2 or A.shape[0] != B.shape[1]:
        raise ValueError(f"adapters[{site!r}] must be A (r, Cin) and B (Cout, r) with one rank r, got A {A.shape}, "
                         f"B {B.shape}")


def _check_ab(w: np.ndarray, A: np.ndarray, B: np.ndarray) -> None:
    if w.ndim != 2:
        raise ValueError(f"the base weight must be 2-D (Cin, Cout), got shape {w.shape}")
    if A.ndim != 2 or B.ndim != 2 or A.shape[1] != w.shape[0] or B.shape[0] != w.shape[1] or \
            A.shape[0] != B.shape[1]:
        raise ValueError(f"LoRA shapes do not fit: W {w.shape} (Cin, Cout) needs A (r, {w.shape[0]}) and "
                         f"B ({w.shape[1]}, r); got A {A.shape}, B {B.shape}")


def _lora_matmul(prec: Precision, x2: np.ndarray, w: np.ndarray, bias: np.ndarray | None, A: np.ndarray,
                 B: np.ndarray, scale: float, site: str, kind: str) -> tuple[np.ndarray, Any]:
    base, cb = prec.matmul(x2, w, site, kind, bias=bias)                        # (N, Cout)
    u, ca = prec.matmul(x2, A.T, f"{site}.lora_a", "linear")                   # (N, r)
    v, cv = prec.matmul(u, B.T, f"{site}.lora_b", "linear")                    # (N, Cout)
    out = prec.act(base + v * v.dtype.type(scale), f"{site}.lora", "residual")
    return out, (cb, ca, cv, scale)


def _lora_matmul_backward(prec: Precision, d2: np.ndarray, cache: Any
                          ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    cb, ca, cv, scale = cache
    d2 = prec.grad(d2, "lora", "residual")
    dx, _, dbias = prec.matmul_backward(d2, cb)          # the frozen base: only dx (and a bias grad)
    du, dBt, _ = prec.matmul_backward(d2 * d2.dtype.type(scale), cv)            # (N, r), (r, Cout)
    dxa, dAt, _ = prec.matmul_backward(du, ca)                                  # (N, Cin), (Cin, r)
    return dx + dxa, dAt.T, dBt.T, dbias


@ieee_mode
def lora_linear_forward(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, A: np.ndarray, B: np.ndarray,
                        scale: float, *, prec: Precision | None = None,
                        site: str = "linear") -> tuple[np.ndarray, Any]:
    """``x @ w + b + scale * (x @ A.T) @ B.T``. x (..., Cin), w (Cin, Cout), A (r, Cin), B (Cout, r) ->
    out (..., Cout); ``scale`` is ``alpha / r``."""
    prec = current_precision(prec)
    x, w, A, B = (_float_array(a, n) for a, n in ((x, "x"), (w, "w"), (A, "A"), (B, "B")))
    _check_ab(w, A, B)
    if x.ndim < 1 or x.shape[-1] != w.shape[0]:
        raise ValueError(f"x must be (..., Cin) with Cin = {w.shape[0]} (w is {w.shape}), got shape {x.shape}")
    if b is not None and np.shape(b) != (w.shape[1],):
        raise ValueError(f"b must be (Cout,) = ({w.shape[1]},), got shape {np.shape(b)}")
    scale = check_real(scale, "scale")
    shape = x.shape
    out, c = _lora_matmul(prec, x.reshape(-1, shape[-1]), w, b, A, B, scale, site, "linear")
    return out.reshape(*shape[:-1], w.shape[1]), (c, shape, prec, b is not None, w.shape[1])


@ieee_mode
def lora_linear_backward(dout: np.ndarray, cache: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dx (..., Cin), dA (r, Cin), dB (Cout, r)); the base weight and bias are frozen (no gradient)."""
    if not (isinstance(cache, tuple) and len(cache) == 5):
        raise TypeError(f"cache must be the second value lora_linear_forward returned, got {type(cache).__name__}")
    c, shape, prec, _, c_out = cache
    dout = as_array(dout, "dout", carrier=True)
    want = (*shape[:-1], c_out)
    if dout.shape != want:
        raise ValueError(f"dout must have the forward output's shape {want}, got {dout.shape}")
    dx, dA, dB, _ = _lora_matmul_backward(prec, dout.reshape(-1, dout.shape[-1]), c)
    return dx.reshape(shape), dA, dB


@ieee_mode
class LoRAPrecision:
    """A :class:`~fpsim.nn.Precision` that adds LoRA adapters to the GEMMs of the named sites.

    ``inner``: the precision (policy runtime, or :data:`~fpsim.nn.FULL`) every GEMM still goes through.
    ``adapters``: site (``"h0.attn.qkv"``) -> ``(A, B)``; ``scale``: alpha / r. After ``gpt_backward``,
    :attr:`grads` holds site -> ``(dA, dB)`` (summed over the calls of that site in the step); call
    :meth:`zero_grad` between steps. Everything else (``act``, ``grad``, a policy's own attributes) is the
    inner precision's.

    >>> import numpy as np
    >>> from fpsim.nn import FULL
    >>> A, B = lora_init(4, 2, r=1, rng=np.random.default_rng(0))
    >>> p = LoRAPrecision(FULL, {"fc": (A, B)}, scale=1.0)
    >>> out, c = p.matmul(np.ones((3, 4)), np.ones((4, 2)), "fc", "linear")
    >>> _ = p.matmul_backward(np.ones((3, 2)), c); sorted(p.grads)
    ['fc']
    """

    def __init__(self, inner: Precision, adapters: Mapping[str, tuple[np.ndarray, np.ndarray]],
                 scale: float) -> None:
        if not isinstance(inner, Precision):
            raise TypeError(f"inner must implement fpsim.nn.Precision, got {type(inner).__name__}")
        if not isinstance(adapters, Mapping):
            raise TypeError(f"adapters must map site -> (A, B), got {type(adapters).__name__}")
        for site, ab in adapters.items():
            _check_adapter(site, ab)
        self.inner = inner
        self.adapters = dict(adapters)
        self.scale = check_real(scale, "scale")
        self.grads: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def zero_grad(self) -> None:
        self.grads = {}

    def matmul(self, a: np.ndarray, b: np.ndarray, site: str, kind: str,
               bias: np.ndarray | None = None) -> tuple[np.ndarray, Any]:
        ab = self.adapters.get(site)
        if ab is None:
            out, c = self.inner.matmul(a, b, site, kind, bias=bias)
            return out, ("plain", c)
        A, B = ab
        _check_ab(b, A, B)
        out, c = _lora_matmul(self.inner, a, b, bias, A, B, self.scale, site, kind)
        return out, ("lora", c, site)

    def matmul_backward(self, dout: np.ndarray, cache: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        if cache[0] == "plain":
            return self.inner.matmul_backward(dout, cache[1])
        _, c, site = cache
        dx, dA, dB, dbias = _lora_matmul_backward(self.inner, dout, c)
        if site in self.grads:
            gA, gB = self.grads[site]
            dA, dB = gA + dA, gB + dB
        self.grads[site] = (dA, dB)
        wshape = (dx.shape[-1], dout.shape[-1])
        return dx, np.zeros(wshape, dout.dtype), dbias          # the frozen base: a zero weight gradient

    def act(self, x: np.ndarray, site: str, op: str) -> np.ndarray:
        return self.inner.act(x, site, op)

    def grad(self, g: np.ndarray, site: str, op: str) -> np.ndarray:
        return self.inner.grad(g, site, op)

    def __getattr__(self, name: str) -> Any:
        if name in ("inner", "adapters", "scale", "grads"):
            raise AttributeError(name)
        return getattr(self.inner, name)
