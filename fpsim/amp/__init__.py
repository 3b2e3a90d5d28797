"""Mixed precision (layer L4): precision policies, loss scalers, optimizers and master weights.

>>> from fpsim.amp import policy_names
>>> policy_names()[:3]
['fp32', 'bf16-mixed', 'fp16-mixed']
"""

from __future__ import annotations

from .anomaly import Anomaly, AnomalyError, AnomalyLog, detect_anomaly
from .autocast_mode import autocast, autocast_policy
from .bf16 import UPDATE_RULES
from .clip import clip_grad_norm_
from .fused import fused_adamw_step, fused_sgd_step
from .grad_scaler import GradScaler
from .optim import SGD, AdamW, MasterWeights, make_optimizer
from .policy import (FP32_OPS, OPS, BlockRecipe, FP8Recipe, Policy, QuantConfig, get_policy, policy_names,
                     register_policy)
from .runtime import PolicyRuntime, log2_histogram
from .scaler import DynamicLossScaler, LossScaler

__all__ = [
    "FP32_OPS",
    "OPS",
    "SGD",
    "UPDATE_RULES",
    "AdamW",
    "Anomaly",
    "AnomalyError",
    "AnomalyLog",
    "DynamicLossScaler",
    "BlockRecipe",
    "FP8Recipe",
    "GradScaler",
    "LossScaler",
    "MasterWeights",
    "Policy",
    "PolicyRuntime",
    "QuantConfig",
    "autocast",
    "autocast_policy",
    "clip_grad_norm_",
    "detect_anomaly",
    "fused_adamw_step",
    "fused_sgd_step",
    "get_policy",
    "log2_histogram",
    "make_optimizer",
    "policy_names",
    "register_policy",
]
