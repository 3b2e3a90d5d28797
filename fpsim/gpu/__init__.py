"""Cross-checks against real NVIDIA GPUs (CuPy) and a probe that identifies a GPU's matrix-unit arithmetic.

CuPy is an optional dependency imported only inside the functions that touch a device; importing this package
needs NumPy only. Without CuPy or a CUDA device those functions raise :class:`GPUUnavailable` (one line).

* :func:`crosscheck_round`: CUDA conversion intrinsics (``__float2half_rn`` ..., ``__nv_cvt_float_to_fp8``
  with and without SATFINITE) versus :func:`fpsim.to_bits`, bit for bit; :func:`compare_round` is the pure
  comparison.
* :func:`crosscheck_mma`: one ``mma.sync`` instruction per warp versus :func:`fpsim.mma.dot`;
  :func:`compare_mma` is the pure comparison, :mod:`fpsim.gpu.fragments` the register layouts and kernel source.
* :func:`crosscheck_wgmma`: one Hopper ``wgmma.mma_async`` FP8 instruction per warpgroup (shared-memory
  descriptors, :mod:`fpsim.gpu.wgmma`) versus the ``path="wgmma"`` presets.
* :func:`probe`: probe vectors on the GPU, :func:`fit_parameters` (pure) infers block size, alignment bits,
  rounding and normalisation and names the matching fpsim presets.
* ``python -m fpsim.gpu.run_all --out DIR`` runs everything and writes JSON and Markdown.

>>> from fpsim.gpu import instruction_for
>>> instruction_for("fp16", "fp32").ptx
'mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32'
"""

from __future__ import annotations

from ._device import DeviceInfo, GPUUnavailable, device_info, require_cupy
from .convert import RoundReport, compare_round, conversion_inputs, conversion_kernel_source, crosscheck_round
from .fragments import MMAInstruction, instruction_for, mma_kernel_source
from .mma_check import MMAReport, compare_mma, crosscheck_mma, emulate_words
from .probing import FittedModel, Probe, ProbeOutputs, ProbeResult, fit_parameters, model_outputs, probe, probe_suite
from .wgmma import WGMMAInstruction, crosscheck_wgmma, emulate_wgmma, wgmma_instruction, wgmma_kernel_source

__all__ = [
    "DeviceInfo",
    "FittedModel",
    "GPUUnavailable",
    "MMAInstruction",
    "MMAReport",
    "Probe",
    "ProbeOutputs",
    "ProbeResult",
    "RoundReport",
    "WGMMAInstruction",
    "compare_mma",
    "compare_round",
    "conversion_inputs",
    "conversion_kernel_source",
    "crosscheck_mma",
    "crosscheck_round",
    "crosscheck_wgmma",
    "device_info",
    "emulate_words",
    "emulate_wgmma",
    "fit_parameters",
    "instruction_for",
    "mma_kernel_source",
    "model_outputs",
    "probe",
    "probe_suite",
    "require_cupy",
    "wgmma_instruction",
    "wgmma_kernel_source",
]
