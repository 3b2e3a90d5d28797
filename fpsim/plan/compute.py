"""Training compute: 6 N D, the Chinchilla compute optimum, step FLOPs with recomputation, and time on a device.

- ``training_flops(N, D) = 6 N D`` (Kaplan et al. 2020; Hoffmann et al. 2022, "Chinchilla", arXiv 2203.15556,
  use the same approximation for their Table 3): 2 FLOPs per parameter per token forward, 4 backward.
- :func:`compute_optimal`: the parameters and tokens that minimise loss for a budget. ``method="rule"``
  (default): D = 20 N, so N = sqrt(C / 120) (the rounded outcome of the paper's three approaches, which
  all give exponents a ~ b ~ 0.5); ``method="table3"``: the power law N = G C^a fitted (least squares in log
  space) to the nine rows of the paper's Table 3 (approach 1), with D = C / (6 N).
- :func:`step_flops`: FLOPs of one training step of a transformer with and without recomputation, counted
  GEMM by GEMM (Narayanan et al. 2021, arXiv 2104.04473, eq. 3: 96 B s L h^2 (1 + s/6h + V/16Lh) with
  full recomputation; 72 B s L h^2 (1 + s/6h + V/12Lh) without).
- :data:`ACCELERATORS`: dense peak throughput per precision (vendor datasheets, sparsity excluded) and
  :func:`training_time`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from .._checks import check_int, check_real
from .._fpenv import ieee_mode
from .._names import parse_name
from .memory import _parse_checkpoint
from .models import ModelSpec, get_model

__all__ = [
    "ACCELERATORS",
    "Accelerator",
    "CHINCHILLA_TABLE3",
    "PRECISIONS",
    "accelerator_names",
    "compute_optimal",
    "get_accelerator",
    "step_flops",
    "training_flops",
    "training_time",
]

#: Precisions an accelerator's peak table may list (dense matrix throughput; fp32 = non-tensor FP32).
PRECISIONS: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16", "fp8", "fp4")

#: Hoffmann et al. (arXiv 2203.15556) Table 3, "Estimated optimal training FLOPs and training tokens for
#: various model sizes" (approach 1): (parameters, FLOPs, tokens).
CHINCHILLA_TABLE3: tuple[tuple[float, float, float], ...] = (
    (400e6, 1.92e19, 8.0e9),
    (1e9, 1.21e20, 20.2e9),
    (10e9, 1.23e22, 205.1e9),
    (67e9, 5.76e23, 1.5e12),
    (175e9, 3.85e24, 3.7e12),
    (280e9, 9.90e24, 5.9e12),
    (520e9, 3.43e25, 11.0e12),
    (1e12, 1.27e26, 21.2e12),
    (10e12, 1.30e28, 216.2e12),
)

TOKENS_PER_PARAM = 20.0


@ieee_mode
def training_flops(n_params: float, n_tokens: float) -> float:
    """6 N D: the FLOPs of training N parameters on D tokens (forward 2 N D, backward 4 N D).

    Examples
    --------
    Chinchilla, 70B parameters on 1.4T tokens (the paper's budget is 5.76e23, Gopher's):

    >>> f"{training_flops(70e9, 1.4e12):.3g}"
    '5.88e+23'
    """
    n = check_real(n_params, "n_params", lo=0.0, lo_open=True)
    d = check_real(n_tokens, "n_tokens", lo=0.0, lo_open=True)
    return 6.0 * n * d


def _table3_fit() -> tuple[float, float]:
    """(a, log G) of N = G C^a, least squares over Table 3 in natural logs."""
    c = np.log([row[1] for row in CHINCHILLA_TABLE3])
    n = np.log([row[0] for row in CHINCHILLA_TABLE3])
    a, logg = np.polyfit(c, n, 1)
    return float(a), float(logg)


@ieee_mode
def compute_optimal(flops: float, *, method: str = "rule") -> tuple[float, float]:
    """Compute-optimal (n_params, n_tokens) for a training budget of ``flops`` (Chinchilla).

    ``method="rule"``: D = 20 N with C = 6 N D, i.e. N = sqrt(C / 120). ``method="table3"``: N from the
    power law fitted to the paper's Table 3 (exponent ~0.50), D = C / (6 N). Both are approximations of the
    paper's fits; docs/planner.md compares them with the table's rows.

    Examples
    --------
    >>> n, d = compute_optimal(5.76e23)
    >>> f"{n:.3g} {d:.3g}"
    '6.93e+10 1.39e+12'
    """
    c = check_real(flops, "flops", lo=0.0, lo_open=True)
    how = parse_name(method, ("rule", "table3"), "compute_optimal method")
    if how == "rule":
        n = math.sqrt(c / (6.0 * TOKENS_PER_PARAM))
    else:
        a, logg = _table3_fit()
        n = math.exp(logg + a * math.log(c))
    return n, c / (6.0 * n)


@ieee_mode
def step_flops(model: str | ModelSpec | Any, *, batch: int = 1, seq_len: int | None = None,
               checkpoint: str | int = "none") -> dict[str, float]:
    """FLOPs of one training step (forward and backward) on ``batch`` sequences, counted GEMM by GEMM.

    Returns ``{"model": ..., "hardware": ..., "overhead": ...}``: model FLOPs (forward 1x, backward 2x of
    every matrix product: linear layers, Q K^T, P V, logits), hardware FLOPs including the recomputed
    forward work under ``checkpoint`` (``"blocks"``: every block's forward again; ``"selective"``: Q K^T and
    P V again; an int k: every k-th block), and overhead = hardware / model - 1. Element-wise work
    (softmax, norms) is not counted, as in the papers' formulas.

    Examples
    --------
    For GPT-3 the counts reduce to Narayanan et al.'s 72 B s L h^2 (1 + s/6h + V/12Lh) and, with full
    recomputation, 96 B s L h^2 (1 + s/6h + V/16Lh):

    >>> f = step_flops("gpt3-175b", checkpoint="blocks")
    >>> B, s, L, h, V = 1, 2048, 96, 12288, 50257
    >>> math.isclose(f["model"], 72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h)))
    True
    >>> math.isclose(f["hardware"], 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h)))
    True
    """
    m = get_model(model)
    b = check_int(batch, "batch", lo=1)
    s = m.seq_len if seq_len is None else check_int(seq_len, "seq_len", lo=1)
    ck = _parse_checkpoint(checkpoint)
    linear = 2 * b * s * sum(a * c for a, c in m.linear_shapes())  # forward FLOPs of a block's GEMMs
    attn_core = 2 * 2 * b * s * s * m.n_embd  # Q K^T and P V, all heads (full s x s, as the papers count)
    block_fwd = linear + attn_core
    logits_fwd = 2 * b * s * m.n_embd * m.vocab_size
    L = m.n_layer
    model_flops = 3.0 * (L * block_fwd + logits_fwd)
    if ck == "none":
        extra = 0.0
    elif ck == "selective":
        extra = float(L * attn_core)
    elif ck == "blocks":
        extra = float(L * block_fwd)
    else:
        assert isinstance(ck, int)
        extra = float(len(range(0, L, ck)) * block_fwd)
    hw = model_flops + extra
    return {"model": model_flops, "hardware": hw, "overhead": hw / model_flops - 1.0}


# -- accelerators -----------------------------------------------------------------------------------


@ieee_mode
@dataclass(frozen=True)
class Accelerator:
    """A device's dense peak throughput per precision (TFLOP/s, no 2:4 sparsity) and memory (GB = 1e9 B).

    A precision missing from ``peak_tflops`` is one the device has no dense matrix rate for in its datasheet
    (or one the datasheet does not give: see ``source``).
    """

    name: str
    peak_tflops: Mapping[str, float]
    memory_gb: float
    source: str = field(compare=False)


def _acc(name: str, peaks: dict[str, float], mem: float, source: str) -> Accelerator:
    return Accelerator(name, MappingProxyType(peaks), mem, source)


_ACCS = (
    _acc("v100", {"fp32": 15.7, "fp16": 125.0}, 32.0,
         "NVIDIA Tesla V100 datasheet, SXM2: FP32 15.7 TFLOPS, Tensor Core (FP16 in, FP32 accumulate) 125 TFLOPS; "
         "no TF32/BF16/FP8"),
    _acc("a100", {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}, 80.0,
         "NVIDIA A100 datasheet, SXM 80GB: FP32 19.5, TF32 156, BF16 312, FP16 312 TFLOPS dense (the datasheet's "
         "312/624/624 are with sparsity); no FP8"),
    _acc("h100-sxm", {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9}, 80.0,
         "NVIDIA H100 Tensor Core GPU Architecture whitepaper, H100 SXM5 dense rates (the datasheet's 989 / 1,979 "
         "/ 3,958 TFLOPS for TF32 / BF16 / FP8 are with sparsity, 'specifications 1/2 lower without')"),
    _acc("h200", {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5, "fp8": 1979.0}, 141.0,
         "NVIDIA H200 datasheet, SXM: FP32 67, TF32 989*, BF16/FP16 1,979*, FP8 3,958* TFLOPS (*with sparsity; "
         "halved here); 141 GB HBM3e"),
    _acc("b200", {"fp32": 75.0, "tf32": 1100.0, "bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0, "fp4": 9000.0},
         180.0,
         "NVIDIA HGX B200 datasheet, per GPU (1,000 W): FP32 75 TFLOPS; TF32 2.2, FP16/BF16 4.5, FP8 9, FP4 18 "
         "PFLOPS with sparsity (halved here); 180 GB HBM3e"),
    _acc("mi300x", {"fp32": 163.4, "tf32": 653.7, "bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9}, 192.0,
         "AMD Instinct MI300X data sheet: peak FP32 matrix 163.4, TF32 653.7, FP16/BF16 1,307.4, FP8 2,614.9 "
         "TFLOPS dense (sparsity doubles the last three); no FP4"),
    _acc("tpu-v5p", {"bf16": 459.0}, 95.0,
         "Google Cloud TPU v5p documentation: peak compute per chip (bf16) 459 TFLOPS, 95 GB HBM2e; no FP32, "
         "FP8 or FP4 matrix rate is published there, so none is listed"),
    _acc("trainium2", {"fp32": 181.0, "tf32": 667.0, "bf16": 667.0, "fp16": 667.0, "fp8": 1299.0}, 103.1,
         "AWS Neuron documentation, Trainium2 architecture: 1,299 FP8, 667 BF16/FP16/TF32, 181 FP32 dense TFLOPS "
         "per chip; 96 GiB (103.1 GB) device memory"),
)

#: Named accelerators: name -> :class:`Accelerator`.
ACCELERATORS: Mapping[str, Accelerator] = MappingProxyType({a.name: a for a in _ACCS})


@ieee_mode
def accelerator_names() -> list[str]:
    """Names :func:`get_accelerator` (and ``fpsim plan --device``) accepts."""
    return list(ACCELERATORS)


@ieee_mode
def get_accelerator(device: str | Accelerator) -> Accelerator:
    """An :class:`Accelerator` by name (one name rule), or the object itself.

    Examples
    --------
    >>> get_accelerator("H100-SXM").peak_tflops["bf16"]
    989.4
    """
    if isinstance(device, Accelerator):
        return device
    return ACCELERATORS[parse_name(device, accelerator_names(), "device")]


@ieee_mode
def training_time(flops: float, device: str | Accelerator, *, mfu: float = 0.4, n_devices: int = 1,
                  precision: str | None = None) -> dict[str, float]:
    """Seconds to run ``flops`` on ``n_devices`` devices at model FLOPs utilisation ``mfu``, per precision.

    seconds = flops / (n_devices * mfu * peak), for every precision the device lists (or only
    ``precision``). Returns precision -> seconds.

    Examples
    --------
    Chinchilla's budget on 1024 A100s at 40% utilisation in BF16, in days:

    >>> t = training_time(5.76e23, "a100", mfu=0.4, n_devices=1024, precision="bf16")
    >>> round(t["bf16"] / 86400, 1)
    52.2
    """
    c = check_real(flops, "flops", lo=0.0, lo_open=True)
    acc = get_accelerator(device)
    u = check_real(mfu, "mfu", lo=0.0, hi=1.0, lo_open=True)
    k = check_int(n_devices, "n_devices", lo=1)
    if precision is None:
        precs = [p for p in PRECISIONS if p in acc.peak_tflops]
    else:
        p = parse_name(precision, PRECISIONS, "precision")
        if p not in acc.peak_tflops:
            raise ValueError(f"{acc.name} lists no dense {p} rate; it lists: {', '.join(acc.peak_tflops)}")
        precs = [p]
    return {p: c / (k * u * acc.peak_tflops[p] * 1e12) for p in precs}
