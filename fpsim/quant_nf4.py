"""NF4, QLoRA's 4-bit NormalFloat (Dettmers et al., arXiv 2305.14314), as bitsandbytes 0.50.2 computes it.

Re-exported from :mod:`fpsim.quant`: :data:`NF4`, :func:`nf4_quantize`, :func:`nf4_dequantize`,
:class:`NF4Absmax`, :class:`NF4Tensor`, :func:`dynamic_map`, :func:`nf4_bits_per_parameter`.

The algorithm, step by step as bitsandbytes' CPU path does it (``backends/default/ops.py`` quantize,
``csrc/cpu_ops.cpp`` dequantize and 8-bit blockwise quantize), every step in float32:

* the input is read as float32 (bf16/fp16 exactly; float64 rounded once to float32, like ``.float()``);
* blocks of ``blocksize`` consecutive elements of the flattened array, each with ``absmax = max|x|``;
* a full block is scaled by *multiplying* with ``1/max(absmax, 1e-38)`` (the reciprocal rounded to
  float32 first); the last, partial block is *divided* by ``max(absmax, 1e-38)`` and stores that
  clamped absmax (a quirk of the reference, kept); the scaled value is clamped to [-1, 1];
* the code is the index of the nearest :data:`NF4` level: bucketing against the 15 float32 midpoints
  ``(l[i] + l[i+1]) / 2``; a value exactly on a midpoint takes the *lower* code (``torch.bucketize``,
  ``right=False``);
* packing (``packed=True``): two codes per byte, the first element in the *high* nibble; an odd count
  pads a 0.0 (code 7) in the last low nibble. Default ``packed=False``: one code per uint8, in the
  input's shape (so :func:`nf4_dequantize` needs no shape);
* dequantize: ``NF4[code] * absmax`` rounded once to float32 (``out_format`` rounds that to bf16/fp16,
  ties to even, as bitsandbytes' ``.to(dtype)``);
* double quantization (``double_quant=True``, bitsandbytes' ``compress_statistics``): ``offset =
  mean(absmax)`` in float32 with torch's CPU summation order (eight float32 lanes and a 4-way cascade,
  :func:`torch_float32_sum`; bit-identical to ``torch.mean`` up to 32768 constants, i.e. 2M parameters
  at blocksize 64, beyond which torch splits the sum over threads), then ``absmax - offset`` quantized
  blockwise to 8 bits with :func:`dynamic_map` in 256-constant blocks as 0.50.2's ``quantize_cpu_impl``
  does: per block ``a2 = max|v|`` (a zero block: codes 0), ``v * (1f / a2)`` (also for the last, partial
  block), clamped to [-1, 1], then *not* the nearest map entry but a 65536-entry lookup table:
  ``lut[(uint16)fma((v + 1f) * 0.5f, 65535f, 0.5f)]``, where bin ``i`` (at ``2i/65535 - 1``) holds the
  number of float32 map midpoints below it. A constant within about half a bin (2**-16) of a midpoint
  can get the farther of two neighbours; near 0, where map entries are closer than a bin, up to 4
  entries away, and entries 124..130 (0.0 among them) are never produced. ``absmax_search="nearest"``
  gives the nearest entry instead (the paper's rule; tests/test_nf4.py counts the difference).

Memory: 4 bits per code, 8 bits per 64 parameters and 32 bits per 64 x 256 parameters for the
double-quantized constants: ``4 + 8/64 + 32/16384 = 4.127`` bits per parameter, the paper's figure
(:func:`nf4_bits_per_parameter` counts the arrays).

>>> import numpy as np
>>> from fpsim.quant import NF4, nf4_quantize, nf4_dequantize
>>> x = np.float32([0.5, -1.0, 0.25, 0.0])
>>> codes, absmax = nf4_quantize(x, blocksize=32)
>>> codes.tolist(), float(absmax[0])
([12, 0, 10, 7], 1.0)
>>> nf4_dequantize(codes, absmax, blocksize=32).tolist() == [float(NF4[12]), -1.0, float(NF4[10]), 0.0]
True

The code lives in ``fpsim/quant/_nf4.py`` (:mod:`fpsim.quant` is the quantization package: fake quantization, integer
inference, NF4); this module re-exports its names, so ``fpsim.quant_nf4`` stays the import path.
"""

from __future__ import annotations

# the valid options, not in __all__ (as before the move), re-exported explicitly
from .quant._nf4 import ABSMAX_SEARCHES as ABSMAX_SEARCHES
from .quant._nf4 import BLOCKSIZES as BLOCKSIZES
from .quant._nf4 import (NF4, NF4Absmax, NF4Tensor, dynamic_map, nf4_bits_per_parameter, nf4_dequantize, nf4_pack,
                         nf4_quantize, nf4_unpack, torch_float32_sum)

__all__ = [
    "NF4",
    "NF4Absmax",
    "NF4Tensor",
    "dynamic_map",
    "nf4_bits_per_parameter",
    "nf4_dequantize",
    "nf4_pack",
    "nf4_quantize",
    "nf4_unpack",
    "torch_float32_sum",
]
