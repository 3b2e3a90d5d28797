"""True integer inference: int8 x int8 GEMMs with int32 accumulation and requantization, bit-identical to
PyTorch's quantized ``Linear`` on CPU (torch 2.13: engines ``fbgemm``/``x86``, ``qnnpack``, ``onednn``).

The pieces, each the arithmetic torch's kernels do (float32 everywhere a float appears; scales are taken
as float32, as the kernels use them; torch's qparams are doubles, so pass float32-representable scales to
torch when comparing):

* :func:`quantize_per_tensor` / :func:`quantize_per_channel`: ``torch.quantize_per_tensor(...).int_repr()``
  and ``torch.quantize_per_channel``: ``inv = 1.0f / scale``, then per tensor
  ``q = nearbyint(fma(x, inv, zero_point))`` (rounded once, as torch 2.13's vectorised kernel), per
  channel ``q = nearbyint(float(x * inv) + zero_point)`` (two float32 roundings); ties to even; clamped
  to the dtype's range (quint8 0..255, qint8 -128..127, qint32). Both differ from the fake-quant kernels'
  ``nearbyint(x * inv) + zero_point`` near ties (zero point added after rounding). Both orders were
  established by measurement against torch 2.13 on an AVX512 CPU (near-tie probes), not from its source.
* :func:`int_matmul`: the integer GEMM ``acc[m, n] = sum_k (qx[m, k] - zx) * (qw[n, k] - zw[n])``
  (what fbgemm and oneDNN obtain from the raw ``qx @ qw`` and the zero points' row/column offsets),
  checked to fit int32. Exact, except where the raw sum depends on the CPU (``isa``, one of
  :data:`ISAS`; default :func:`default_isa`): without VNNI (``"avx2"``; also AVX-512 CPUs without
  VNNI), fbgemm/x86 and oneDNN build the raw sum with ``vpmaddubsw``, which adds the u8 x s8 products
  of adjacent pairs ``k = 2j, 2j + 1`` saturated to int16 before widening to int32 (fbgemm's
  ``GenerateKernelU8S8S32ACC32.cc``; oneDNN's non-VNNI ``dot_product``), so ``255*127 + 255*127``
  counts as 32767; with VNNI (``"avx512"``: ``vpdpbusd``) the sum is exact. qnnpack's x86 kernels
  widen to int16 first (``pmaddwd``): exact on every ISA. The requantization below is the same on both
  ISAs. Validated against torch 2.13.0+cpu: ``"avx2"`` on an AMD EPYC with AVX2 and no AVX-512 or
  AVX-VNNI, ``"avx512"`` on an AMD EPYC with AVX-512 VNNI (0 mismatching codes over 448 random Linear
  problems per engine on each).
* :func:`requantize`: the int32 accumulator to the output's quint8, per engine:

  - ``fbgemm``/``x86`` (``fbgemm::ReQuantizeOutput`` with a float bias):
    ``m = (s_x * s_w) / s_y``, ``v = (float(acc) + bias / (s_x * s_w)) * m``,
    ``q = nearbyint(v) + z_y``;
  - ``qnnpack``: the bias is first quantized to int32 with scale ``s_x * s_w`` (as
    ``quantize_per_tensor(bias, s_x * s_w, 0, qint32)``) and added to the accumulator;
    ``q = nearbyint(float(acc + qbias) * ((s_x * s_w) / s_y)) + z_y`` (QNNPACK's float requantization
    scale, the one torch's PyTorch-QNNPACK fork uses since per-channel weights);
  - ``onednn``: torch passes ideep the reciprocal scales ``float(1.0 / s)``, which are inverted back in
    float32 (``s' = 1.0f / float(1.0 / s)``, sometimes one ulp off ``s``);
    ``q = nearbyint(fma(float(acc), s_x' * s_w', bias) * (1 / s_y') + z_y)`` (zero point added *before*
    rounding). Fitted to torch's results (0 mismatches, see docs/quantization.md), not read from
    oneDNN's JIT source;

  then saturation at ``[0, 255]`` (``[z_y, 255]`` with a fused ReLU).
* :func:`quantized_linear`: all of it, like ``torch.ops.quantized.linear`` (``linear_relu``) on a packed
  weight (``engine``'s accumulator on ``isa``, then its requantization); :func:`dequantize_linear`: the
  exact GEMM with a float output ``float(acc) * (s_x * s_w) + bias`` (the int32 result dequantized in the
  epilogue, no output quantization).
* :class:`IntegerRuntime`: a QAT-trained model (an ``int8-qat`` policy's runtime) run with true integer
  inference in its quantized GEMMs; every other op stays float as in the fake-quant model.

>>> import numpy as np, fpsim.quant_int as QI
>>> QI.quantize_per_tensor(np.float32([-1.0, 0.25, 0.75, 1.25, 99.0]), 0.5, 10, "quint8").tolist()
[8, 10, 12, 12, 208]
>>> qx = np.uint8([[12, 200, 3]]); qw = np.int8([[127, -128, 5], [1, 2, 3]])
>>> QI.int_matmul(qx, 3, qw, 0).tolist()           # sum (qx - 3) * qw, exact in int32
[[-24073, 403]]
>>> QI.quantized_linear(qx, 0.02, 3, qw, np.float32([0.01, 0.02]), 0, None, 0.05, 128, isa="avx512").tolist()
[[32, 131]]
>>> big = np.uint8([[255, 255]]); w2 = np.int8([[127, 127]])
>>> [QI.int_matmul(big, 0, w2, 0, engine="fbgemm", isa=i).tolist() for i in QI.ISAS]  # int16 pair saturation
[[[32767]], [[64770]]]

The code lives in ``fpsim/quant/_integer.py`` (:mod:`fpsim.quant` is the quantization package: fake quantization,
integer inference, NF4); this module re-exports its names, so ``fpsim.quant_int`` stays the import path.
"""

from __future__ import annotations

from .quant._integer import (ENGINES, ISAS, QDTYPES, IntegerRuntime, dequantize, default_isa, dequantize_linear,
                             int_matmul, quantize_per_channel, quantize_per_tensor, quantized_linear, requantize)

__all__ = [
    "ENGINES",
    "ISAS",
    "QDTYPES",
    "IntegerRuntime",
    "dequantize",
    "default_isa",
    "dequantize_linear",
    "int_matmul",
    "quantize_per_channel",
    "quantize_per_tensor",
    "quantized_linear",
    "requantize",
]
