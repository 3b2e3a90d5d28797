"""Intel Gaudi 2 / Gaudi 3 Matrix Multiplication Engine (MME) presets, from documentation.

What the documentation and Intel's own quantization code state (sources in :data:`SOURCES`):

* the MME runs every operation that lowers to a matrix multiplication; BF16, FP16 and FP8 inputs, FP32
  accumulation;
* **Gaudi 2's FP8 E4M3 is not OCP's**: Intel Neural Compressor's FP8 toolkit describes it as
  ``float8_e4m3fnuz`` (exponent bias 8, largest value **240**, no infinity, one NaN, no -0) and scales
  Gaudi 2 tensors by ``448 / 240`` to reuse OCP-calibrated scales; Gaudi 3 takes OCP ``float8_e4m3fn``
  (bias 7, largest 448). Both take ``float8_e5m2`` (bias 15, IEEE-style).
* the MME applies power-of-two scales for free by changing the FP8 exponent bias, from a set per device
  (:func:`hw_scales`): Gaudi 2 E4M3 biases {3, 7, 11, 15}, E5M2 {15}; Gaudi 3 any bias 0..62.

What fpsim assumes (provenance **from documentation only**): the MME's accumulation is modelled as exact products
added in K order in fp32 with RNE; its real order and internal widths are not published.

>>> from fpsim.mma import get_model
>>> get_model("gaudi2", "e4m3").input.max, get_model("gaudi3", "e4m3").input.max
(240.0, 448.0)
"""

from __future__ import annotations

from typing import Any

from .._fpenv import ieee_mode
from ..formats import FormatLike, as_format
from .model import MMAModel, generic
from .presets import DEVICES, DOCUMENTATION, DeviceInfo, Provenance, device_info, register_device, register_preset

__all__ = ["SOURCES", "hw_scales", "input_format"]

SOURCES = (
    "Intel Gaudi docs, 'Gaudi Architecture' (docs.habana.ai: MME for all matrix-multiplication operations; TPC for "
    "the rest)",
    "Intel Neural Compressor, FP8 quantization toolkit fp_utils.py (Gaudi 2: float8_e4m3fnuz, bias 8, max 240; "
    "Gaudi 3: float8_e4m3fn; EXP_BIAS_SETS {(GAUDI2, e4m3): [3, 7, 11, 15], (GAUDI2, e5m2): [15], "
    "(GAUDI3, *): range(0, 63)}); vllm-gaudi extension/scales.py (same sets, Gaudi 2 scale factor 448/240)",
    "Intel Gaudi docs, 'FP8 Training with Intel Gaudi Transformer Engine' (FP8 E4M3/E5M2 on Gaudi 2)",
)

# Input name -> fpsim format, per device.
_INPUTS: dict[str, dict[str, str]] = {
    "gaudi2": {"bf16": "bf16", "fp16": "fp16", "fp8_e4m3": "fp8_e4m3fnuz", "fp8_e5m2": "fp8_e5m2"},
    "gaudi3": {"bf16": "bf16", "fp16": "fp16", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"},
}
_BIASES: dict[tuple[str, str], tuple[int, ...]] = {
    ("gaudi2", "fp8_e4m3"): (3, 7, 11, 15),
    ("gaudi2", "fp8_e5m2"): (15,),
    ("gaudi3", "fp8_e4m3"): tuple(range(63)),
    ("gaudi3", "fp8_e5m2"): tuple(range(63)),
}
_DEFAULT_BIAS = {"fp8_e4m3": 7, "fp8_e5m2": 15}


def _key(device: str, input: FormatLike) -> tuple[str, str]:
    dev = device_info(device).name
    if dev not in _INPUTS:
        raise ValueError(f"{dev} is not a Gaudi device; valid: {', '.join(_INPUTS)}")
    name = as_format(input).name
    if name == "fp8_e4m3fnuz":
        name = "fp8_e4m3"
    if name not in _INPUTS[dev]:
        raise ValueError(f"unsupported {dev} MME input {input!r}; valid: {', '.join(_INPUTS[dev])}")
    return dev, name


@ieee_mode
def input_format(device: str, input: FormatLike) -> str:
    """The fpsim format a Gaudi device's MME takes for an input name (Gaudi 2 E4M3 -> ``fp8_e4m3fnuz``).

    Examples
    --------
    >>> input_format("gaudi2", "e4m3"), input_format("gaudi3", "e4m3")
    ('fp8_e4m3fnuz', 'fp8_e4m3')
    """
    dev, name = _key(device, input)
    return _INPUTS[dev][name]


@ieee_mode
def hw_scales(device: str, input: FormatLike) -> tuple[float, ...]:
    """The power-of-two scales the MME applies by changing an FP8 exponent bias: ``2**(default_bias - bias)``.

    Largest first. The default biases are 7 (E4M3) and 15 (E5M2), so scale 1 is the unbiased format.

    Examples
    --------
    >>> hw_scales("gaudi2", "e4m3")
    (16.0, 1.0, 0.0625, 0.00390625)
    >>> len(hw_scales("gaudi3", "e5m2"))
    63
    """
    dev, name = _key(device, input)
    if (dev, name) not in _BIASES:
        raise ValueError(f"exponent-bias scaling applies to FP8 inputs; {name} has none (valid: fp8_e4m3, fp8_e5m2)")
    d = _DEFAULT_BIAS[name]
    return tuple(2.0 ** (d - b) for b in _BIASES[(dev, name)])


def _model(dev: str, name: str) -> MMAModel:
    fmt = _INPUTS[dev][name]
    m = generic("fma_chain", "fp32", input=fmt, acc="fp32")
    return m.with_(name=f"{dev} {name}->fp32 (MME{', as ' + fmt if fmt != name else ''})", source="; ".join(SOURCES),
                   confidence="documentation only: exact products, fp32 RNE accumulation in K order "
                              "(MME order and widths unpublished)")


def _fallback(dev: str) -> Any:
    def fb(input: Any, output: Any, path: Any) -> MMAModel:
        raise ValueError(f"{dev} has no {input!r} -> {output!r} preset{'' if path is None else f' on path {path!r}'}"
                         f": the MME accumulates in FP32; valid: {', '.join(i + '->fp32' for i in _INPUTS[dev])}")
    return fb


def _register() -> None:
    infos = (
        (DeviceInfo("gaudi2", "Gaudi 2", "gaudi2", "MME: BF16/FP16/FP8 (E4M3 as fnuz, max 240), FP32 accumulation",
                    vendor="Intel", unit="MME"), ("habanagaudi2", "hl225")),
        (DeviceInfo("gaudi3", "Gaudi 3", "gaudi3", "MME: BF16/FP16/FP8 (OCP E4M3, max 448), FP32 accumulation",
                    vendor="Intel", unit="MME"), ("habanagaudi3", "hl325")),
    )
    note = ("from documentation and Intel's quantization code only: no Gaudi was run, no bit-level data exist. "
            "Accumulation modelled as exact products added in K order in fp32 RNE")
    for info, aliases in infos:
        if info.name in DEVICES:
            continue
        register_device(info, aliases=aliases, fallback=_fallback(info.name))
        for name, fmt in _INPUTS[info.name].items():
            extra = f"; {name} is taken as {fmt} (largest 240, no inf, no -0)" if fmt != name else ""
            register_preset(info.name, name, "fp32", build=(lambda d, n: lambda: _model(d, n))(info.name, name),
                            provenance=Provenance(DOCUMENTATION, "; ".join(SOURCES), note + extra))
        if info.name == "gaudi2":  # the honest spelling of the same path
            register_preset("gaudi2", "fp8_e4m3fnuz", "fp32", build=lambda: _model("gaudi2", "fp8_e4m3"),
                            provenance=Provenance(DOCUMENTATION, "; ".join(SOURCES), note + "; same as fp8_e4m3"))


_register()
