"""Matrix multiply-accumulate on emulated hardware: NVIDIA Tensor Core models, bit for bit.

"FP32 accumulation" on a Tensor Core is not IEEE fp32 summation: products are summed in blocks, aligned to
the largest exponent with a fixed number of extra bits, truncated term by term and rounded toward zero; on
Ada/Hopper FP8 only 13 fraction bits survive. :class:`MMAModel` describes one such data path (the block-FMA
model of Khattak & Mikaitis); :func:`get_model` returns the preset for a device and format; :func:`dot` and
:func:`matmul` evaluate it (:func:`matmul` also takes :class:`ScaledTensor` operands). Generic comparison models: :data:`exact`, :data:`fma_chain`, :data:`pairwise`,
:data:`wide`.

>>> import fpsim
>>> m = fpsim.mma.get_model("h100", "fp16")
>>> float(fpsim.mma.dot([1.0, 1.0], [1.0, -2.0**-24], 0.0, m)) == 1 - 2**-24
True
"""

from __future__ import annotations

# The matrix units of MMAModel's kinds register themselves on import (amd: also its presets, right after the
# NVIDIA ones, which keeps the order of fpsim.mma.presets() and `fpsim devices`).
from . import _bfma, _exact, _generic, amd  # noqa: F401,I001
from .experiments import deepseek_experiment
from .gemm import convert_inputs, dot, matmul
from .model import KINDS, MMAModel, as_model, exact, fma_chain, generic, pairwise, wide
from .presets import DEVICES, INPUTS, DeviceInfo, Provenance, device_info, get_model, preset_provenance, preset_table, presets
from .scaled import ScaledTensor
from .blockscaled import BlockScaledModel, block_scaled_model, matmul_block_scaled
from . import nvidia_mmasim  # noqa: E402,I001 - MMA-Sim provenance and the presets added from it
from . import gaudi, trainium, xla  # noqa: E402,I001 - vendor modules register their presets on import
from .features import FEATURES, probe_features  # noqa: E402,I001 - FTTN-style feature probes

__all__ = [
    "DEVICES",
    "FEATURES",
    "INPUTS",
    "KINDS",
    "BlockScaledModel",
    "DeviceInfo",
    "MMAModel",
    "Provenance",
    "ScaledTensor",
    "as_model",
    "block_scaled_model",
    "convert_inputs",
    "deepseek_experiment",
    "device_info",
    "dot",
    "exact",
    "fma_chain",
    "generic",
    "get_model",
    "matmul",
    "matmul_block_scaled",
    "pairwise",
    "preset_provenance",
    "preset_table",
    "presets",
    "probe_features",
    "wide",
]
