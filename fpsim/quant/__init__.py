"""Fake quantization for quantization-aware training, bit-identical to PyTorch (CPU, torch 2.13).

* :func:`fake_quantize` / :func:`fake_quantize_grad`: ``torch.fake_quantize_per_tensor_affine`` and
  ``torch.fake_quantize_per_channel_affine``, forward and straight-through backward, with torch's
  float32 order of operations: ``inv = 1.0f / scale`` (multiply, never divide),
  ``q = nearbyint(x * inv) + zero_point`` (ties to even; zero point added *after* rounding),
  ``y = (clamp(q, qmin, qmax) - zero_point) * scale``; the gradient passes where the *unclamped*
  rounded ``q`` lies in ``[qmin, qmax]``.
* Observers (:class:`MinMaxObserver`, :class:`MovingAverageMinMaxObserver` and the per-channel
  variants) computing the same scale and zero point as ``torch.ao.quantization``'s.
* :class:`FakeQuantize` (observer + fake quant, like ``torch.ao.quantization.FakeQuantize``) and the
  presets :func:`default_fake_quant`, :func:`default_weight_fake_quant`,
  :func:`default_per_channel_weight_fake_quant`.
* Learnable scale (LSQ): :func:`learnable_fake_quantize` / :func:`learnable_fake_quantize_grad`, as
  ``torch._fake_quantize_learnable_per_tensor_affine`` including its tie quirk.
* :func:`fp8_fake_quantize` / :func:`fp8_fake_quantize_grad`: quantize-dequantize through a float format
  with a scale and a straight-through gradient.

>>> import numpy as np, fpsim.quant as Q
>>> x = np.float32([-1.75, -0.25, 0.25, 0.3, 63.75])
>>> Q.fake_quantize(x, 0.5, 0, -128, 127).tolist()     # ties to even; 63.75 -> 127.5 -> 128 clamps
[-2.0, 0.0, 0.0, 0.5, 63.5]
>>> Q.fake_quantize_grad(np.ones(5, np.float32), x, 0.5, 0, -128, 127).tolist()
[1.0, 1.0, 1.0, 1.0, 0.0]

The quantization package (the precision layer): ``_fake.py`` (integer fake quantization and the argument checks),
``_observers.py`` (observers, :class:`FakeQuantize`), ``_learnable.py`` (LSQ), ``_fp8.py`` (float fake quantization),
``_nf4.py`` (NF4, also :mod:`fpsim.quant_nf4`) and ``_integer.py`` (true integer inference, :mod:`fpsim.quant_int`).
"""

from __future__ import annotations

from ._fake import fake_quantize, fake_quantize_grad, fake_quantize_with_mask
from ._fp8 import fp8_fake_quantize, fp8_fake_quantize_grad
from ._learnable import learnable_fake_quantize, learnable_fake_quantize_grad, lsq_grad_factor
from ._observers import (FakeQuantize, MinMaxObserver, MovingAverageMinMaxObserver,
                         MovingAveragePerChannelMinMaxObserver, ObserverBase, PerChannelMinMaxObserver,
                         default_fake_quant, default_per_channel_weight_fake_quant, default_weight_fake_quant,
                         quant_range)
from ._nf4 import NF4, NF4Absmax, NF4Tensor, dynamic_map, nf4_bits_per_parameter, nf4_dequantize, nf4_quantize

__all__ = [
    "FakeQuantize",
    "MinMaxObserver",
    "MovingAverageMinMaxObserver",
    "MovingAveragePerChannelMinMaxObserver",
    "ObserverBase",
    "PerChannelMinMaxObserver",
    "default_fake_quant",
    "default_per_channel_weight_fake_quant",
    "default_weight_fake_quant",
    "fake_quantize",
    "fake_quantize_grad",
    "fake_quantize_with_mask",
    "fp8_fake_quantize",
    "fp8_fake_quantize_grad",
    "learnable_fake_quantize",
    "learnable_fake_quantize_grad",
    "lsq_grad_factor",
    "quant_range",
]

# NF4 (QLoRA), in its own module (_nf4.py, also fpsim.quant_nf4), under fpsim.quant.* too.
__all__ += ["NF4", "NF4Absmax", "NF4Tensor", "dynamic_map", "nf4_bits_per_parameter", "nf4_dequantize",
            "nf4_quantize"]
