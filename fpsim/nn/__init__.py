"""Layers with explicit forward/backward pairs and a small GPT (layer L3).

Every layer is a pair ``x_forward(...) -> (out, cache)`` / ``x_backward(dout, cache) -> grads``.
Precision decisions are delegated to a :class:`Precision` object (see :mod:`fpsim.amp`), never made here.
"""

from __future__ import annotations

from .attention import attention_backward, attention_forward
from .flash import (
    KernelPrecision,
    flash_attention,
    flash_attention_backward,
    flash_attention_forward,
    flash_attention_grads,
    fp8_attention,
    reference_attention,
)
from .gpt import GPTConfig, activation_elements, count_params, gpt_backward, gpt_forward, init_params
from .layers import (
    cross_entropy_backward,
    cross_entropy_forward,
    embedding_backward,
    embedding_forward,
    gelu_backward,
    gelu_forward,
    layernorm_backward,
    layernorm_forward,
    linear_backward,
    linear_forward,
    residual_backward,
    residual_forward,
    softmax_backward,
    softmax_forward,
)
from .precision import FULL, GEMM_KINDS, FullPrecision, Precision

__all__ = [
    "FULL",
    "GEMM_KINDS",
    "FullPrecision",
    "GPTConfig",
    "KernelPrecision",
    "Precision",
    "activation_elements",
    "attention_backward",
    "attention_forward",
    "count_params",
    "cross_entropy_backward",
    "cross_entropy_forward",
    "embedding_backward",
    "embedding_forward",
    "flash_attention",
    "flash_attention_backward",
    "flash_attention_forward",
    "flash_attention_grads",
    "fp8_attention",
    "gelu_backward",
    "gelu_forward",
    "gpt_backward",
    "gpt_forward",
    "init_params",
    "layernorm_backward",
    "layernorm_forward",
    "linear_backward",
    "linear_forward",
    "reference_attention",
    "residual_backward",
    "residual_forward",
    "softmax_backward",
    "softmax_forward",
]
