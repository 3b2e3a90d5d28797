"""What the backward pass holds: walk the caches of :func:`fpsim.nn.gpt_forward` and name every array.

The memory ledger (:func:`fpsim.train.measure_step`) counts bytes from the arrays themselves; this
module knows the layout of the caches the layers build and says, for each array, which layer and site
it belongs to, what kind of saved tensor it is and which operation produced it (so the ledger can also
count it at the width of the format the values were rounded to). GEMM caches are opaque to the layers:
a precision object may describe its own through ``saved_arrays(cache) -> [(role, array, format), ...]``
(:class:`fpsim.amp.runtime.PolicyRuntime` does); otherwise every array in it is listed.

Kinds: ``gemm_input`` (activation operands a GEMM keeps for its weight gradient), ``weight_copy``
(low-precision copies of the weights: weight memory, not activations), ``softmax`` (attention
probabilities, and their low-precision copy as the P @ V operand), ``mask`` (the causal mask, QAT's
straight-through masks), ``layernorm`` (normalized input and 1/std), ``gelu`` (GELU input and tanh),
``cross_entropy`` (probabilities, targets), ``ids`` (token ids), ``fp8_scale`` (FP8 inverse scales),
``recompute_input`` (what checkpointing keeps instead: block inputs, attention-core q/k/v),
``attention`` (flash attention's output O, kept for its backward; or the arrays of an attention
implementation whose layout this module does not know). Under flash attention ``softmax`` is the
log-sum-exp (O(T) per head) that replaces the T x T probabilities.

>>> import numpy as np
>>> from fpsim.nn import GPTConfig, init_params, gpt_forward
>>> from fpsim.nn.saved import saved_tensors
>>> cfg = GPTConfig(vocab_size=5, block_size=4, n_layer=1, n_head=1, n_embd=4)
>>> params = init_params(cfg)
>>> idx = np.zeros((1, 4), dtype=np.int64)
>>> _, _, (caches, _, _, _) = gpt_forward(params, cfg, idx, idx)
>>> sorted({t.kind for t in saved_tensors(caches)})
['cross_entropy', 'gelu', 'gemm_input', 'ids', 'layernorm', 'mask', 'softmax', 'weight_copy']
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._fpenv import ieee_mode
from .attention import _CoreInputs
from .gpt import _BlockCheckpoint

__all__ = ["SavedTensor", "buffer_of", "core_tensors", "saved_tensors"]


@ieee_mode
@dataclass(frozen=True)
class SavedTensor:
    """One array held for the backward pass.

    ``layer``: ``"embedding"``, ``"h0"``, ..., ``"lnf"``, ``"lm_head"``, ``"loss"``; ``site``: the tensor's
    name (``"h0.attn.qk.a"``); ``kind``: see the module docstring; ``array``: the array itself;
    ``produced_by``: what decided its values' format: an op name (``"layernorm"``, ``"gelu"``,
    ``"residual"``, ... as passed to ``Precision.act``: the policy rounds it unless the op is in its FP32
    list), ``"gemm"`` (a GEMM output, in the activation format), a :class:`fpsim.Format` (said by the
    precision object), ``"weight"`` (a weight copy, in the policy's ``params`` format) or ``None`` (never
    rounded: the carrier's own precision, also for bool and integer arrays).
    """

    layer: str
    site: str
    kind: str
    array: np.ndarray
    produced_by: Any = None


@ieee_mode
def buffer_of(a: np.ndarray) -> np.ndarray:
    """The array owning ``a``'s memory (follows ``.base`` through views)."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _arrays(obj: Any, depth: int = 0) -> Iterator[np.ndarray]:
    """Every ndarray inside nested tuples / lists / dicts / slotted objects (bounded depth)."""
    if depth > 8:
        return
    if isinstance(obj, np.ndarray):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for o in obj:
            yield from _arrays(o, depth + 1)
    elif isinstance(obj, Mapping):
        for o in obj.values():
            yield from _arrays(o, depth + 1)
    elif hasattr(obj, "__slots__") and not isinstance(obj, (str, bytes)):
        for k in obj.__slots__:
            yield from _arrays(getattr(obj, k, None), depth + 1)


def _gemm(layer: str, site: str, mcache: Any, prec: Any, b_kind: str, a_kind: str = "gemm_input",
          a_from: Any = "gemm") -> Iterator[SavedTensor]:
    """The arrays of one GEMM cache. ``b_kind``: ``"weight_copy"`` for a linear layer, an activation kind
    inside attention; ``a_from``: what produced the first operand when the precision object does not say."""
    f = getattr(prec, "saved_arrays", None)
    if f is not None:
        for role, arr, fmt in f(mcache):
            if not isinstance(arr, np.ndarray):
                arr = np.asarray(arr)
            if role == "a":
                yield SavedTensor(layer, f"{site}.a", a_kind, arr, fmt if fmt is not None else a_from)
            elif role == "b":
                by = fmt if fmt is not None else ("weight" if b_kind == "weight_copy" else "gemm")
                yield SavedTensor(layer, f"{site}.b", b_kind, arr, by)
            elif role == "scale":
                yield SavedTensor(layer, f"{site}.scale", "fp8_scale", arr, fmt)
            elif role == "mask_a":
                yield SavedTensor(layer, f"{site}.mask_a", "mask", arr, None)
            elif role == "mask_b":  # weight-shaped: belongs with the weight copy
                yield SavedTensor(layer, f"{site}.mask_b", "weight_copy" if b_kind == "weight_copy" else "mask",
                                  arr, None)
            else:
                yield SavedTensor(layer, f"{site}.{role}", "other", arr, fmt)
        return
    arrs = list(_arrays(mcache))  # FullPrecision: (a, b, has_bias)
    for j, arr in enumerate(arrs):
        if j == 0:
            yield SavedTensor(layer, f"{site}.a", a_kind, arr, None)
        else:
            yield SavedTensor(layer, f"{site}.b", b_kind, arr, None)


def _linear(layer: str, site: str, cache: Any, b_kind: str = "weight_copy",
            a_from: Any = "gemm") -> Iterator[SavedTensor]:
    mcache, _shape, prec = cache
    yield from _gemm(layer, site, mcache, prec, b_kind, a_from=a_from)


def _layernorm(layer: str, site: str, cache: Any) -> Iterator[SavedTensor]:
    xhat, rstd, _g = cache  # g is a parameter
    yield SavedTensor(layer, f"{site}.xhat", "layernorm", xhat, None)
    yield SavedTensor(layer, f"{site}.rstd", "layernorm", rstd, None)


def _flash(layer: str, site: str, cache: Mapping[str, Any], a_from: Any) -> Iterator[SavedTensor]:
    """:func:`fpsim.nn.flash.flash_attention_forward`'s cache: q, k, v (views of the qkv GEMM output),
    the output O (kept for D = rowsum(dO * O)) and the log-sum-exp (the softmax's statistics, FP32)."""
    yield from _linear(layer, f"{site}.qkv", cache["qkv"], a_from=a_from)
    for nm in ("q", "k", "v"):
        yield SavedTensor(layer, f"{site}.{nm}", "gemm_input", cache[nm], "gemm")
    yield SavedTensor(layer, f"{site}.o", "attention", cache["o"], "scale")
    yield SavedTensor(layer, f"{site}.lse", "softmax", cache["lse"], None)
    yield from _linear(layer, f"{site}.proj", cache["proj"])


def _attention(layer: str, site: str, cache: Any, a_from: Any) -> Iterator[SavedTensor]:
    if isinstance(cache, Mapping) and all(k in cache for k in ("qkv", "proj", "q", "k", "v", "o", "lse")):
        yield from _flash(layer, site, cache, a_from)
        return
    if not (isinstance(cache, tuple) and len(cache) == 10):  # an attention implementation not known here
        for j, arr in enumerate(_arrays(cache)):
            yield SavedTensor(layer, f"{site}.{j}", "attention", arr, None)
        return
    c_qkv, c_qk, c_sm, c_pv, c_proj, mask, _scale, _shape, prec, _ = cache  # scale: a constant
    yield from _linear(layer, f"{site}.qkv", c_qkv, a_from=a_from)
    if isinstance(c_qk, _CoreInputs):  # selective recomputation: the core's inputs
        for nm in ("q", "kt", "v"):
            yield SavedTensor(layer, f"{site}.core.{nm}", "recompute_input", getattr(c_qk, nm), "gemm")
    elif c_qk is not None:
        yield from _gemm(layer, f"{site}.qk", c_qk, prec, "gemm_input")
    if c_sm is not None:  # softmax_forward's cache: the probabilities y
        yield SavedTensor(layer, f"{site}.softmax", "softmax", c_sm, None)
    if c_pv is not None:  # P in the activation format (the P @ V operand), then V
        yield from _gemm(layer, f"{site}.pv", c_pv, prec, "gemm_input", a_kind="softmax", a_from="softmax")
    if mask is not None:
        yield SavedTensor(layer, f"{site}.mask", "mask", mask, None)
    yield from _linear(layer, f"{site}.proj", c_proj)


def core_tensors(layer: str, site: str, core: Any, prec: Any) -> Iterator[SavedTensor]:
    """:func:`saved_tensors` for a recomputed attention core (c_qk, c_sm, c_pv, mask) of ``layer``."""
    c_qk, c_sm, c_pv, mask = core
    yield from _gemm(layer, f"{site}.qk", c_qk, prec, "gemm_input")
    yield SavedTensor(layer, f"{site}.softmax", "softmax", c_sm, None)
    yield from _gemm(layer, f"{site}.pv", c_pv, prec, "gemm_input", a_kind="softmax", a_from="softmax")
    yield SavedTensor(layer, f"{site}.mask", "mask", mask, None)


def _block(layer: str, cache: Any, block_input_from: Any) -> Iterator[SavedTensor]:
    if isinstance(cache, _BlockCheckpoint):  # a checkpointed block
        yield SavedTensor(layer, f"{layer}.input", "recompute_input", cache.x, block_input_from)
        return
    if isinstance(cache, tuple) and len(cache) == 2 and isinstance(cache[0], _BlockCheckpoint):  # recomputed
        yield from _block(layer, cache[0], block_input_from)
        cache = cache[1]
    c, h, _prec, _ = cache
    yield from _layernorm(layer, f"{h}.ln1", c["ln1"])
    yield from _attention(layer, f"{h}.attn", c["attn"], a_from="layernorm")
    yield from _layernorm(layer, f"{h}.ln2", c["ln2"])
    yield from _linear(layer, f"{h}.mlp.fc", c["fc"], a_from="layernorm")
    x, t = c["gelu"]
    yield SavedTensor(layer, f"{h}.gelu.x", "gelu", x, "gemm")
    yield SavedTensor(layer, f"{h}.gelu.tanh", "gelu", t, None)
    yield from _linear(layer, f"{h}.mlp.proj", c["proj"], a_from="gelu")


def saved_tensors(live: Mapping[str, Any]) -> Iterator[SavedTensor]:
    """Every array in ``live`` (the ``caches`` dict of a :func:`~fpsim.nn.gpt_forward` cache, or the part
    of it the backward pass still holds), as :class:`SavedTensor` records, in model order.

    Views are listed as they are; the ledger counts each buffer once (:func:`buffer_of`). Parameters in
    the caches (LayerNorm gains, tied embeddings) are listed too; leave them out by buffer.
    """
    if not isinstance(live, Mapping):
        raise TypeError(f"saved_tensors needs the caches mapping of a gpt_forward cache, got {type(live).__name__}")
    for key, cache in live.items():
        if key == "wte":
            idx, _ = cache
            yield SavedTensor("embedding", "wte.ids", "ids", np.asarray(idx), None)
        elif key == "lnf":
            yield from _layernorm("lnf", "lnf", cache)
        elif key == "lm_head":
            yield from _linear("lm_head", "lm_head", cache, a_from="layernorm")
        elif key == "ce":
            probs, tt, valid, _n, _shape = cache
            yield SavedTensor("loss", "ce.probs", "cross_entropy", probs, None)
            yield SavedTensor("loss", "ce.targets", "cross_entropy", np.asarray(tt), None)
            yield SavedTensor("loss", "ce.valid", "cross_entropy", np.asarray(valid), None)
        elif key.startswith("h") and key[1:].isdigit():
            yield from _block(key, cache, "residual" if key != "h0" else "embedding")
        else:
            for j, arr in enumerate(_arrays(cache)):
                yield SavedTensor(key, f"{key}.{j}", "other", arr, None)
