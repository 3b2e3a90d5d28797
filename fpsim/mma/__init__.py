"""Matrix multiply-accumulate on emulated hardware: NVIDIA Tensor Core models, bit for bit.

"FP32 accumulation" on a Tensor Core is not IEEE fp32 summation: products are summed in blocks, aligned to
the largest exponent with a fixed number of extra bits, truncated term by term and rounded toward zero; on
Ada/Hopper FP8 only 13 fraction bits survive. :class:`MMAModel` describes one such data path (the block-FMA
model of Khattak & Mikaitis); :func:`get_model` returns the preset for a device and format; :func:`dot` and
:func:`matmul` evaluate it (:func:`matmul` also takes :class:`ScaledTensor` operands). Generic comparison models: :data:`exact`, :data:`fma_chain`, :data:`pairwise`,
:data:`wide`.

How the package is laid out (each line imports only from the lines above it):

* ``_unit``: the :class:`~fpsim.mma._unit.MatrixUnit` protocol and the kind -> unit registry;
* ``model``: :class:`MMAModel` (data: one data path's parameters), the generic models, and the numeric helpers
  the units share; ``scaled``: :class:`ScaledTensor`; ``_convert``: operand conversion;
* the units, one module per family, each a class implementing the protocol: ``_bfma`` (NVIDIA block FMA),
  ``_generic`` (``wide``, ``fma_chain``, ``pairwise``), ``_exact`` (exact dot product), ``amd`` (AMD MFMA,
  with its presets), ``blockscaled`` (Blackwell block-scaled MMA, a model class and unit of its own);
* ``presets``: the tables of device parameters with their provenance, which construct the models
  (``nvidia_mmasim``, ``xla``, ``trainium``, ``gaudi`` add theirs through :func:`~fpsim.mma.presets.register_preset`);
* ``gemm``: the one executor (:func:`dot`, :func:`matmul`): converts, batches, pads, tiles and promotes, and
  calls ``model._unit`` for the rest, never asking which family it holds; ``xla``, ``trainium``, ``experiments``
  and ``features`` build on it (XLA's, Trainium's and Gaudi's paths are compositions of BFMA and generic
  models run through it, not units of their own).

**Adding a matrix unit** is one new module plus its presets, and no edit of the executor:

1. a module (``fpsim/mma/_myunit.py``, or a public one when it has public names) with a class that
   implements :class:`~fpsim.mma._unit.MatrixUnit`, usually by subclassing
   :class:`~fpsim.mma._unit.UnitBase` and overriding :meth:`reference` (the NumPy reduction of one chain's
   products, K along axis 0) and whatever differs from the defaults: ``k_step`` (instruction depth that
   ``promote_every`` and scale groups must respect), ``pad_to`` (the K multiple the reference pads to),
   ``carrier``, ``blockwise`` / ``terms_held`` (tile sizes), ``operand_range``, ``shortcut``,
   ``bfma_kernel`` / ``generic_kernel`` (compiled-kernel parameters, or None); a family whose arithmetic
   does not fit the shared path (scales inside each instruction) sets ``own_matmul = True`` and implements
   ``matmul``;
2. its registration: either a model class of its own with a ``_unit`` property (as
   :class:`BlockScaledModel`), or ``register_unit(("my_kind",), MyUnit())`` for a new :class:`MMAModel`
   kind, whose name is then also listed in :data:`KINDS` (the kinds users see, checked by
   :class:`MMAModel`, which also checks the fields of the kinds it knows);
3. its presets: rows with :class:`Provenance`, registered with :func:`~fpsim.mma.presets.register_device` and
   :func:`~fpsim.mma.presets.register_preset` (see :mod:`fpsim.mma.amd`), and the module imported here;
4. a test that checks it against its oracle, and the compiled path (if any) against the NumPy reference.

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
