"""Scaling for narrow float formats: per-tensor, per-channel and per-block scales, TransformerEngine's
delayed and current scaling, MX block formats (E8M0 shared scales) and NVFP4.

Conventions (those of TransformerEngine): a *scale* multiplies the high-precision values before the cast,
``q = round(x * scale)``, and dequantisation multiplies by ``scale_inv = 1 / scale`` (a float32
reciprocal). MX and NVFP4 functions instead return *decode* scales (``x ≈ q * scale``), as the OCP MX
specification stores them. Every rounding goes through :func:`fpsim.round` (one correct rounding,
``overflow="saturate"`` by default, as FP8 casts in TransformerEngine saturate).

>>> import numpy as np, fpsim.scaling as S
>>> x = np.float32([0.5, -3.0, 1e-3])
>>> s = S.compute_scale(S.amax(x), "fp8_e4m3")
>>> float(s)                       # 448 / 3 in float32
149.3333282470703
>>> q = S.quantize(x, "fp8_e4m3", s)
>>> q.tolist()
[72.0, -448.0, 0.15625]
>>> [round(float(v), 6) for v in S.dequantize(q, s)]
[0.482143, -3.0, 0.001046]

The scaling package (the precision layer): ``_tensor.py`` (per-tensor, per-channel and per-block scales),
``_recipes.py`` (TransformerEngine's delayed and current scaling, the recipe table), ``_mx.py`` (MX and NVFP4),
``_rules.py`` (every named block-scale rule, :data:`SCALE_RULES`), ``_identify.py`` (which rule made these
bytes), ``_scaled.py`` (:func:`quantize_scaled`, one scaled tensor for every recipe) and ``_common.py`` (the shared checks
and block geometry).
"""

from __future__ import annotations

from ..mma.blockscaled import matmul_block_scaled  # MX/NVFP4 ScaledTensors straight into Blackwell's MMA
from ..mma.scaled import ScaledTensor
from ._common import BlockLike
from ._mx import mx_dequantize, mx_quantize, mx_scales, nvfp4_dequantize, nvfp4_quantize
from ._identify import IdentifyReport, RuleDiff, identify_quantizer, identify_scale_rule
from ._recipes import FP8_FORMATS, CurrentScaling, DelayedScaling, Recipe, fp8_format_pair, get_recipe, recipes
from ._rules import SCALE_RULES, ScaleRule, rules_table, scale_rule
from ._scaled import quantize_scaled
from ._tensor import amax, compute_scale, dequantize, fake_quantize, quantize, scale_and_quantize

__all__ = [
    "FP8_FORMATS",
    "SCALE_RULES",
    "CurrentScaling",
    "DelayedScaling",
    "IdentifyReport",
    "Recipe",
    "RuleDiff",
    "ScaleRule",
    "ScaledTensor",
    "amax",
    "compute_scale",
    "dequantize",
    "fake_quantize",
    "fp8_format_pair",
    "get_recipe",
    "identify_quantizer",
    "identify_scale_rule",
    "matmul_block_scaled",
    "mx_dequantize",
    "mx_quantize",
    "mx_scales",
    "nvfp4_dequantize",
    "nvfp4_quantize",
    "quantize",
    "quantize_scaled",
    "recipes",
    "rules_table",
    "scale_and_quantize",
    "scale_rule",
]

