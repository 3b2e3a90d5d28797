"""AWS Trainium (NeuronCore-v2 / -v3) Tensor Engine presets and Neuron's rounding modes, from documentation.

What the Neuron documentation states (sources in :data:`SOURCES`):

* the Tensor Engine is a systolic array taking cFP8 (FP8_e4m3, FP8_e5m2, FP8_e3m4), FP16, BF16, TF32 and FP32
  inputs; matrix products accumulate in FP32 (PSUM);
* NeuronCore-v2 (and -v3) round to nearest, ties to even, by default and offer *stochastic rounding* ("round
  up or down with a proportional probability"), selected by ``NEURON_RT_STOCHASTIC_ROUNDING_EN``; with
  ``XLA_USE_BF16`` / ``XLA_DOWNCAST_BF16`` set, stochastic rounding is on by default
  (:func:`neuron_rounding` decodes an environment);
* NeuronCore-v3 (Trainium2) adds adjustable exponent biasing for cFP8 (not modelled: its range is not stated).

What they do not state, and fpsim therefore assumes (provenance **from documentation only**): the Tensor
Engine's accumulation is modelled as exact products added in K order in fp32 with RNE; the number of random
bits of the hardware's stochastic rounding is unknown (``sr_bits=None`` = exact probabilities); the FP8_e4m3
encoding of its maximum and specials is not given on the data-types page (fpsim's OCP ``fp8_e4m3`` is used).

>>> import numpy as np
>>> from fpsim.mma import trainium
>>> x = np.full(10000, 1 + 2.0**-9, np.float32)      # a quarter of the way from 1 to the next bf16
>>> r = trainium.convert(x, stochastic_rounding=True, rng=np.random.default_rng(0))
>>> 0.2 < float((r > 1).mean()) < 0.3                 # rounded up about 25% of the time
True
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .._fpenv import ieee_mode
from .._interop import returns_input_kind
from .._names import norm_name, parse_name
from ..formats import Format, FormatLike, as_format
from ..rounding import _as_float_array, _first_non_value
from ..rounding import round as _fround
from .gemm import matmul as _mma_matmul
from .model import MMAModel, generic
from .presets import DEVICES, DOCUMENTATION, DeviceInfo, Provenance, device_info, get_model, register_device, register_preset

__all__ = ["INPUTS", "INPUTS_V4", "MX_BLOCK", "SOURCES", "SOURCES_V4", "convert", "matmul", "matmul_mx",
           "neuron_rounding"]

#: Input formats of the Tensor Engine modelled here (FP32/TF32 inputs are not: their in-engine handling is undocumented).
INPUTS: tuple[str, ...] = ("bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "fp8_e3m4")

SOURCES = (
    "AWS Neuron docs, 'Data Types' (aws-neuron-sdk about-neuron/arch/neuron-features/data-types.rst @1db4d74: "
    "NeuronCore-v2 types incl. FP8_e5m2/e4m3/e3m4; 'NeuronCore v2 Rounding Modes': RNE default, stochastic "
    "rounding via NEURON_RT_STOCHASTIC_ROUNDING_EN)",
    "AWS Neuron docs, Trainium2 architecture (NeuronCore-v3 Tensor Engine: systolic array, cFP8/FP16/BF16/TF32/FP32 "
    "inputs; programmable rounding RNE & stochastic; adjustable exponent biasing for cFP8)",
    "AWS Neuron docs, PyTorch/XLA migration note: XLA_USE_BF16 / XLA_DOWNCAST_BF16 enable stochastic rounding by "
    "default",
    "AWS Neuron NKI docs: Tensor Engine matmul results accumulate in PSUM in FP32",
)

#: Trainium3 (NeuronCore-v4) Tensor Engine inputs modelled: BF16/FP16, and the MX element types (MXFP8: E4M3, E5M2;
#: MXFP4: E2M1), whose E8M0 block scales :func:`matmul_mx` applies.
INPUTS_V4: tuple[str, ...] = ("bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "fp4_e2m1")
#: Elements per E8M0 scale along K (OCP MX v1.0's block size, the one MXFP8/MXFP4 fix).
MX_BLOCK = 32

SOURCES_V4 = (
    "AWS Neuron docs, 'NeuronCore-v4 Architecture' (about-neuron/arch/neuron-hardware/neuron-core-v4, SDK 2.28, "
    "12/2025): Tensor Engine inputs MXFP8/MXFP4 (OCP compliant), FP16, BF16, TF32, FP32; output FP32 or BF16; "
    "programmable rounding RNE & stochastic rounding",
    "AWS Neuron NKI docs: nki.isa.nc_matmul_mx (NeuronCore-v4 MX matmul; float8_e4m3fn_x4 packed inputs), PSUM "
    "accumulation in FP32",
    "OCP Microscaling Formats (MX) v1.0: blocks of 32 elements sharing one E8M0 scale",
)

_ENV = "NEURON_RT_STOCHASTIC_ROUNDING_EN"


@ieee_mode
def neuron_rounding(env: Mapping[str, str]) -> str:
    """The rounding mode (``"rne"`` or ``"sr"``) the Neuron runtime selects for an environment mapping.

    ``NEURON_RT_STOCHASTIC_ROUNDING_EN`` set to ``1``/``true`` -> ``"sr"``, ``0``/``false`` -> ``"rne"``; unset:
    ``"sr"`` if ``XLA_USE_BF16`` or ``XLA_DOWNCAST_BF16`` is set, else ``"rne"`` (the documented defaults).
    Pass ``os.environ`` to read the current process's.

    Examples
    --------
    >>> neuron_rounding({}), neuron_rounding({"XLA_USE_BF16": "1"}), neuron_rounding({"NEURON_RT_STOCHASTIC_ROUNDING_EN": "0", "XLA_USE_BF16": "1"})
    ('rne', 'sr', 'rne')
    """
    if not isinstance(env, Mapping):
        raise TypeError(f"env must be a mapping (e.g. os.environ), got {type(env).__name__}")
    val = env.get(_ENV)
    if val is None:
        return "sr" if ("XLA_USE_BF16" in env or "XLA_DOWNCAST_BF16" in env) else "rne"
    key = norm_name(val, _ENV)
    choice = parse_name(key, ("1", "0", "true", "false"), _ENV)
    return "sr" if choice in ("1", "true") else "rne"


def _fmt(fmt: FormatLike) -> Format:
    f = as_format(fmt)
    if f.name not in INPUTS:
        raise ValueError(f"unsupported Trainium conversion format {fmt!r}; valid: {', '.join(INPUTS)}")
    return f


@ieee_mode
@returns_input_kind(dtype_option=False)
def convert(x: Any, fmt: FormatLike = "bf16", *, stochastic_rounding: bool = False,
            rng: np.random.Generator | None = None, sr_bits: int | None = None) -> Any:
    """An FP32 -> `fmt` conversion as a NeuronCore does it: RNE, or stochastic rounding when enabled.

    Stochastic rounding is :func:`fpsim.round` with ``"sr"`` (round up with probability equal to the distance
    from the value below, in units of the gap), drawing from `rng`; ``sr_bits`` limits the random bits (the
    hardware's count is undocumented). FP8 conversions saturate (as fpsim's matrix-unit conversions do).

    Examples
    --------
    >>> import numpy as np
    >>> float(convert(np.float32(1 + 2.0**-8)))     # a tie: RNE goes to even
    1.0
    """
    if not isinstance(stochastic_rounding, (bool, np.bool_)):
        raise TypeError(f"stochastic_rounding must be a bool, got {type(stochastic_rounding).__name__}")
    f = _fmt(fmt)
    overflow = "saturate" if f.width <= 8 else "ieee"
    if stochastic_rounding:
        if rng is None:
            raise ValueError("stochastic_rounding=True needs rng= (a numpy.random.Generator): same seed, same result")
        return _fround(x, f, "sr", rng=rng, sr_bits=sr_bits, overflow=overflow)
    return _fround(x, f, "rne", overflow=overflow)


def _pass_model(device: str, fin: str) -> MMAModel:
    m = generic("fma_chain", "fp32", input=fin, acc="fp32")
    return m.with_(name=f"{device} {fin}->fp32 (Tensor Engine)",
                   source="; ".join(SOURCES_V4 if device == "trn3" else SOURCES),
                   confidence="documentation only: exact products, fp32 RNE accumulation in K order (PSUM); "
                              "internal order undocumented")


@ieee_mode
@returns_input_kind(dtype_option=False)
def matmul(A: Any, B: Any, C: Any = None, *, device: str = "trn1", input: FormatLike = "bf16",
           output: FormatLike = "fp32", stochastic_rounding: bool = False, rng: np.random.Generator | None = None,
           sr_bits: int | None = None) -> Any:
    """``D = A @ B (+ C)`` on a Trainium Tensor Engine, with the conversions of FP32 operands modelled.

    A and B (FP32 values; others are first rounded to FP32) are converted to `input` by :func:`convert`
    (RNE, or stochastic rounding: one draw per element, A then B), multiplied by the device's preset
    (:func:`fpsim.mma.get_model`; C, rounded to fp32, starts the fp32 accumulation, as a PSUM tile does); with ``output="bf16"`` the FP32 result is converted
    once more by the same rounding (the next draws from `rng`).

    Returns
    -------
    ndarray
        float32 when A and B are float32, else float64 carriers.

    Examples
    --------
    >>> import numpy as np
    >>> A = np.full((1, 4), 1 + 2.0**-9, np.float32); B = np.ones((4, 1), np.float32)
    >>> float(matmul(A, B)[0, 0])                  # RNE drops the 2**-9 of every input
    4.0
    """
    dev = device_info(device).name
    fin = _fmt(input)
    fout = as_format(output)
    if fout.name not in ("fp32", "bf16"):
        raise ValueError(f"unsupported Trainium output format {output!r}; valid: fp32, bf16")
    model = get_model(dev, fin, "fp32")
    a = np.asarray(_as_float_array(A, "A")[0])
    b = np.asarray(_as_float_array(B, "B")[0])
    both32 = a.dtype == np.float32 and b.dtype == np.float32
    a32 = np.asarray(_fround(a, "fp32", "rne"), dtype=np.float32)
    b32 = np.asarray(_fround(b, "fp32", "rne"), dtype=np.float32)
    qa = convert(a32, fin, stochastic_rounding=stochastic_rounding, rng=rng, sr_bits=sr_bits)
    qb = convert(b32, fin, stochastic_rounding=stochastic_rounding, rng=rng, sr_bits=sr_bits)
    d = np.asarray(_mma_matmul(np.asarray(qa, np.float32), np.asarray(qb, np.float32), C, model=model,
                               input_rounding="exact"), dtype=np.float32)
    if fout.name == "bf16":
        d = np.asarray(convert(d, "bf16", stochastic_rounding=stochastic_rounding, rng=rng, sr_bits=sr_bits),
                       dtype=np.float32)
    return d if both32 else d.astype(np.float64)


def _mx_operand(x: Any, s: Any, fmt: Format, k_axis: int, name: str) -> np.ndarray:
    """Elements times their E8M0 block scales (exact in float64), checked to be fp32 values."""
    a = np.asarray(_as_float_array(x, name)[0], dtype=np.float64)
    sc = np.asarray(_as_float_array(s, f"scale_{name.lower()}")[0], dtype=np.float64)
    if a.ndim != 2 or a.shape[k_axis] % MX_BLOCK:
        raise ValueError(f"{name} must be 2-D with K a multiple of {MX_BLOCK}, got shape {a.shape}")
    want = list(a.shape)
    want[k_axis] //= MX_BLOCK
    if sc.shape != tuple(want):
        raise ValueError(f"scale_{name.lower()} must have shape {tuple(want)} (one E8M0 scale per {MX_BLOCK} "
                         f"elements along K), got {sc.shape}")
    bad = _first_non_value(a, fmt)
    if bad is not None:
        raise ValueError(f"{name} holds {bad!r}, not a value of {fmt.name}: quantize it first (fpsim.scaling)")
    bad = _first_non_value(sc[~np.isnan(sc)], as_format("e8m0"))
    if bad is not None:
        raise ValueError(f"scale_{name.lower()} holds {bad!r}, not an E8M0 value (a power of two 2**-127..2**127)")
    with np.errstate(invalid="ignore", over="ignore"):
        v = a * np.repeat(sc, MX_BLOCK, axis=k_axis)  # exact: a power of two times a few-bit element
        r32 = np.asarray(_fround(v, "fp32", "rne"), dtype=np.float64)
    off = ~((r32 == v) | np.isnan(v))
    if off.any():
        raise ValueError(f"{name}: element x scale {float(v[off].flat[0])!r} is not an fp32 value; how the Tensor "
                         "Engine treats such products is undocumented, so this model refuses them")
    return v


@ieee_mode
@returns_input_kind(dtype_option=False)
def matmul_mx(A: Any, B: Any, scale_a: Any, scale_b: Any, C: Any = None, *, device: str = "trn3",
              element: FormatLike = "fp8_e4m3", element_b: FormatLike | None = None, output: FormatLike = "fp32",
              stochastic_rounding: bool = False, rng: np.random.Generator | None = None,
              sr_bits: int | None = None) -> Any:
    """``D = (A * scale_a) @ (B * scale_b) (+ C)``: an MXFP8/MXFP4 matmul on a Trainium3 Tensor Engine (modelled).

    A (M, K) and B (K, N) hold MX element values (``element``, ``element_b``: fp8_e4m3, fp8_e5m2 or fp4_e2m1);
    ``scale_a`` (M, K/32) and ``scale_b`` (K/32, N) their E8M0 block scales (as values, powers of two; NaN makes
    its block NaN). Model (documentation only, no Trainium3 was run): each element times its scale (exact), the
    products accumulated exactly-rounded in FP32 in K order from C (PSUM); with ``output="bf16"`` the FP32 result
    is written as BF16 with RNE, or with stochastic rounding drawing from ``rng``. The draws are reproducible from
    a saved generator state: ``state = rng.bit_generator.state`` before the call, restore it to replay them.

    Examples
    --------
    >>> import numpy as np
    >>> A = np.full((1, 32), 1.5); B = np.full((32, 1), 0.5)
    >>> sa = np.full((1, 1), 2.0); sb = np.full((1, 1), 0.25)
    >>> float(matmul_mx(A, B, sa, sb)[0, 0])        # 32 * (1.5*2) * (0.5*0.25)
    12.0
    """
    if device_info(device).name != "trn3":
        raise ValueError(f"matmul_mx models Trainium3's MX matmul; got device={device!r}; valid: trn3")
    if not isinstance(stochastic_rounding, (bool, np.bool_)):
        raise TypeError(f"stochastic_rounding must be a bool, got {type(stochastic_rounding).__name__}")
    fa = as_format(element)
    fb = as_format(element if element_b is None else element_b)
    for f, what in ((fa, "element"), (fb, "element_b")):
        if f.name not in INPUTS_V4[2:]:
            raise ValueError(f"unsupported MX element format {what}={f.name!r}; valid: {', '.join(INPUTS_V4[2:])}")
    fout = as_format(output)
    if fout.name not in ("fp32", "bf16"):
        raise ValueError(f"unsupported Trainium3 output format {output!r}; valid: fp32, bf16")
    if stochastic_rounding and fout.name == "bf16" and rng is None:
        raise ValueError("stochastic_rounding=True needs rng= (a numpy.random.Generator): same state, same result")
    a = _mx_operand(A, scale_a, fa, 1, "A")
    b = _mx_operand(B, scale_b, fb, 0, "B")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"A is {a.shape} and B is {b.shape}: K differs")
    model = _pass_model("trn3", "fp32")
    d = np.asarray(_mma_matmul(a.astype(np.float32), b.astype(np.float32), C, model=model, input_rounding="exact"),
                   dtype=np.float32)
    if fout.name == "bf16":
        d = np.asarray(convert(d, "bf16", stochastic_rounding=bool(stochastic_rounding), rng=rng, sr_bits=sr_bits),
                       dtype=np.float32)
    return d


def _fallback(dev: str) -> Any:
    def fb(input: Any, output: Any, path: Any) -> MMAModel:
        valid = ", ".join(f"{i}->fp32" for i in (INPUTS_V4 if dev == "trn3" else INPUTS))
        raise ValueError(f"{dev} has no {input!r} -> {output!r} preset"
                         f"{'' if path is None else f' on path {path!r}'}: the Tensor Engine accumulates in "
                         f"FP32 (FP32/TF32 inputs are not modelled); valid: {valid}")
    return fb


def _register() -> None:
    devices = (
        (DeviceInfo("trn1", "Trainium (NeuronCore-v2)", "neuroncore-v2", "Tensor Engine: systolic array, FP32 "
                    "accumulation; RNE or stochastic rounding", vendor="AWS", unit="Tensor Engine"),
         ("trainium", "trainium1", "neuroncorev2", "trn1n")),
        (DeviceInfo("trn2", "Trainium2 (NeuronCore-v3)", "neuroncore-v3", "as trn1; adds cFP8 exponent biasing "
                    "(not modelled)", vendor="AWS", unit="Tensor Engine"),
         ("trainium2", "neuroncorev3")),
        (DeviceInfo("trn3", "Trainium3 (NeuronCore-v4)", "neuroncore-v4", "MXFP8/MXFP4 (E8M0 scales per 32) and "
                    "BF16/FP16 inputs, FP32 PSUM, FP32 or BF16 output with RNE or stochastic rounding; "
                    "unvalidated by hardware", vendor="AWS", unit="Tensor Engine"),
         ("trainium3", "neuroncorev4")),
    )
    note = ("from the Neuron documentation only: no Trainium was run and no bit-level data exist. Accumulation "
            "modelled as exact products added in K order in fp32 RNE (PSUM); the hardware's stochastic-rounding "
            "bit count is undocumented; SR conversions in fpsim.mma.trainium.convert/matmul")
    for info, aliases in devices:
        if info.name in DEVICES:
            continue
        register_device(info, aliases=aliases, fallback=_fallback(info.name))
        v4 = info.name == "trn3"
        for fin in INPUTS_V4 if v4 else INPUTS:
            extra = "; FP8_e4m3 max/special encoding not stated: OCP fp8_e4m3 assumed" if fin == "fp8_e4m3" else ""
            if v4 and fin in INPUTS_V4[2:]:
                extra = (f"; {fin} as an MX element (OCP MX v1.0: E8M0 scale per 32 along K, applied exactly before "
                         "the FP32 accumulation; where in the array the scale is applied is undocumented): "
                         "fpsim.mma.trainium.matmul_mx, BF16 PSUM writes RNE or SR from a saveable generator state")
            register_preset(info.name, fin, "fp32",
                            build=(lambda d, i: lambda: _pass_model(d, i))(info.name, fin),
                            provenance=Provenance(DOCUMENTATION, "; ".join(SOURCES_V4 if v4 else SOURCES),
                                                  note + extra))


_register()
