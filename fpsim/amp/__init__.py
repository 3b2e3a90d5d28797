"""Mixed precision (layer L4): precision policies, loss scalers, optimizers and master weights.

>>> from fpsim.amp import policy_names
>>> policy_names()[:3]
['fp32', 'bf16-mixed', 'fp16-mixed']
"""

from __future__ import annotations

from .optim import SGD, AdamW, MasterWeights, make_optimizer
from .policy import FP32_OPS, OPS, FP8Recipe, Policy, QuantConfig, get_policy, policy_names, register_policy
from .runtime import PolicyRuntime, log2_histogram
from .scaler import DynamicLossScaler, LossScaler

__all__ = [
    "FP32_OPS",
    "OPS",
    "SGD",
    "AdamW",
    "DynamicLossScaler",
    "FP8Recipe",
    "LossScaler",
    "MasterWeights",
    "Policy",
    "PolicyRuntime",
    "QuantConfig",
    "get_policy",
    "log2_histogram",
    "make_optimizer",
    "policy_names",
    "register_policy",
]
