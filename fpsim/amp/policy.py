"""Precision policies: which format every tensor class is kept in, and how GEMMs are computed.

A :class:`Policy` is a frozen description; :meth:`Policy.runtime` makes the stateful object the model
calls (see :mod:`fpsim.amp.runtime`). Named policies live in a small registry; users build their own with
``Policy(...)`` or ``get_policy("fp16-mixed").replace(name="mine", gradients="bf16")`` and may
:func:`register_policy` them.

>>> from fpsim.amp import get_policy
>>> p = get_policy("fp16-mixed")
>>> p.params.name, p.activations.name, p.gradients.name, p.master.name, p.loss_scale
('fp16', 'fp16', 'fp16', 'fp32', 'dynamic')
>>> get_policy("fp16-no-master").master is None
True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Union

from ..formats import Format, as_format
from ..rounding import Rounding, as_rounding
from .scaler import DynamicLossScaler, LossScaler

__all__ = [
    "FP32_OPS",
    "OPS",
    "FP8Recipe",
    "Policy",
    "QuantConfig",
    "get_policy",
    "policy_names",
    "register_policy",
]

#: Operations whose output a policy may keep in FP32 (CUDA autocast keeps layer_norm, softmax and the
#: losses in FP32; the residual stream and the embedding output stay FP32 because the weights are FP32).
FP32_OPS = frozenset({"layernorm", "softmax", "cross_entropy", "residual", "embedding"})
#: Every op name the model reports (GEMMs are handled separately).
OPS = ("embedding", "layernorm", "softmax", "scale", "gelu", "residual", "cross_entropy")

LossScaleLike = Union[float, str, None]  # noqa: UP007 - a runtime alias on Python 3.10


@dataclass(frozen=True)
class FP8Recipe:
    """Transformer-Engine-style FP8 GEMMs with per-tensor delayed scaling.

    GEMMs whose kind is in ``kinds`` quantize their inputs (activation and weight) to ``forward`` and the
    incoming gradient to ``backward``, each with its own scale ``fp8_max / amax / 2**margin`` computed from
    the amax history of the previous steps (``amax_compute_algo`` ``"max"`` or ``"most_recent"``). Casts
    saturate. GEMM outputs are stored in the policy's activation/gradient format.
    """

    forward: Format = field(default_factory=lambda: as_format("fp8_e4m3"))
    backward: Format = field(default_factory=lambda: as_format("fp8_e5m2"))
    margin: int = 0
    amax_history_len: int = 1024
    amax_compute_algo: str = "max"
    kinds: tuple[str, ...] = ("linear",)

    def __post_init__(self) -> None:
        object.__setattr__(self, "forward", as_format(self.forward))
        object.__setattr__(self, "backward", as_format(self.backward))
        if self.amax_compute_algo not in ("max", "most_recent"):
            raise ValueError(f"amax_compute_algo must be 'max' or 'most_recent', got {self.amax_compute_algo!r}")
        if int(self.amax_history_len) < 1:
            raise ValueError(f"amax_history_len must be >= 1, got {self.amax_history_len!r}")


@dataclass(frozen=True)
class QuantConfig:
    """Integer fake quantization of the GEMMs of kind ``kinds`` (torch ``FakeQuantize`` semantics).

    Weights: symmetric, per output channel (``per_channel=False``: one scale per tensor),
    ``[-2**(bits-1), 2**(bits-1)-1]``, range taken from the current weights. Activations: affine, per tensor, ``[0, 2**act_bits - 1]`` (``act_bits`` defaults to ``bits``),
    min/max from a moving-average observer (``averaging_constant``). ``start``: QAT switches fake
    quantization on after this fraction of the training steps (0: from the first step; 0.5: FP32
    pre-training, then QAT fine-tuning, the usual recipe). Backward: straight-through estimator masked where the rounded value fell
    outside the range. ``mode="qat"`` fake-quantizes during training; ``mode="ptq"`` trains in the policy's
    float formats and fake-quantizes only for evaluation after calibrating the observers.
    """

    bits: int = 8
    mode: str = "qat"
    kinds: tuple[str, ...] = ("linear",)
    averaging_constant: float = 0.01
    calibration_batches: int = 8
    act_bits: int | None = None
    start: float = 0.0
    per_channel: bool = True

    def __post_init__(self) -> None:
        for f in ("bits", "act_bits"):
            v = getattr(self, f)
            if v is None and f == "act_bits":
                continue
            if isinstance(v, bool) or not isinstance(v, int) or not 2 <= v <= 16:
                raise ValueError(f"QuantConfig.{f} must be an int in 2..16, got {v!r}")
        if self.mode not in ("qat", "ptq"):
            raise ValueError(f"QuantConfig.mode must be 'qat' or 'ptq', got {self.mode!r}")
        if not 0.0 <= float(self.start) < 1.0:
            raise ValueError(f"QuantConfig.start must be a fraction in [0, 1), got {self.start!r}")

    @property
    def weight_range(self) -> tuple[int, int]:
        return -(2 ** (self.bits - 1)), 2 ** (self.bits - 1) - 1

    @property
    def act_range(self) -> tuple[int, int]:
        return 0, 2 ** (self.bits if self.act_bits is None else self.act_bits) - 1


@dataclass(frozen=True)
class Policy:
    """Where every tensor class lives, and how GEMMs and losses are computed.

    Parameters
    ----------
    name : str
        Registry name.
    params : Format
        Format of the weights as the GEMMs see them (the low-precision copy). Without a master copy it is
        also the storage format the optimizer updates in place.
    activations : Format
        Format of GEMM inputs and outputs and of elementwise ops not kept in FP32.
    gradients : Format
        Format of the gradient of every low-precision tensor (GEMM results of the backward pass).
    master : Format or None
        Format of the master weights the optimizer updates (FP32), or None for no master copy.
    optimizer_state : Format
        Format of the optimizer's moments.
    fp32_ops : frozenset of str
        Ops (see :data:`OPS`) whose outputs stay in FP32, like autocast's FP32 list.
    gemm : str
        ``"fast"``: round the operands, multiply with float32 BLAS, round the result once; ``"fast64"``:
        the same with float64 BLAS; any other value is a device name for ``fpsim.mma.get_model`` (bit-exact
        block-FMA emulation, much slower).
    loss_scale : None, float or "dynamic"
        No scaling, a static scale, or a :class:`DynamicLossScaler` built from ``scaler_kwargs``.
    fp8 : FP8Recipe or None
    quant : QuantConfig or None
    rounding : str
        Rounding mode of every cast (``"rne"``; ``"sr"`` draws from the runtime's seeded generator).
    description : str
        One line for reports.
    """

    name: str
    params: Format = field(default_factory=lambda: as_format("fp32"))
    activations: Format = field(default_factory=lambda: as_format("fp32"))
    gradients: Format = field(default_factory=lambda: as_format("fp32"))
    master: Format | None = field(default_factory=lambda: as_format("fp32"))
    optimizer_state: Format = field(default_factory=lambda: as_format("fp32"))
    fp32_ops: frozenset[str] = FP32_OPS
    gemm: str = "fast"
    loss_scale: float | str | None = None
    scaler_kwargs: Mapping[str, Any] = field(default_factory=dict)
    fp8: FP8Recipe | None = None
    quant: QuantConfig | None = None
    rounding: str = "rne"
    description: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Policy.name must be a non-empty str, got {self.name!r}")
        for f in ("params", "activations", "gradients", "optimizer_state"):
            fmt = as_format(getattr(self, f))
            if not fmt.fits_float32:
                raise ValueError(f"Policy.{f}={fmt.name}: fpsim.amp carries tensors in float32; "
                                 "choose a format that fits in float32")
            object.__setattr__(self, f, fmt)
        if self.master is not None:
            object.__setattr__(self, "master", as_format(self.master))
        ops = frozenset(self.fp32_ops)
        bad = ops - set(OPS)
        if bad:
            raise ValueError(f"Policy.fp32_ops has unknown ops {sorted(bad)}; valid: {', '.join(OPS)}")
        object.__setattr__(self, "fp32_ops", ops)
        if not isinstance(self.gemm, str) or not self.gemm:
            raise ValueError(f"Policy.gemm must be 'fast', 'fast64' or an fpsim.mma device name, got {self.gemm!r}")
        ls = self.loss_scale
        if not (ls is None or ls == "dynamic" or (isinstance(ls, (int, float)) and not isinstance(ls, bool)
                                                  and ls > 0)):
            raise ValueError(f"Policy.loss_scale must be None, a positive number or 'dynamic', got {ls!r}")
        object.__setattr__(self, "scaler_kwargs", dict(self.scaler_kwargs))
        r = as_rounding(self.rounding)
        object.__setattr__(self, "rounding", r.value)

    # ------------------------------------------------------------------ derived
    @property
    def weights(self) -> Format:
        """Storage format of the weights the optimizer updates: the master format, or ``params``."""
        return self.master if self.master is not None else self.params

    @property
    def stochastic(self) -> bool:
        return self.rounding == Rounding.SR.value

    def make_scaler(self) -> LossScaler:
        """A fresh loss scaler for this policy (``LossScaler(1)`` when there is no loss scaling)."""
        if self.loss_scale is None:
            return LossScaler(1.0)
        if self.loss_scale == "dynamic":
            return DynamicLossScaler(**dict(self.scaler_kwargs))
        return LossScaler(float(self.loss_scale))

    def runtime(self, seed: int = 0) -> Any:
        """The stateful object the model calls (a :class:`fpsim.amp.runtime.PolicyRuntime`)."""
        from .runtime import PolicyRuntime

        return PolicyRuntime(self, seed=seed)

    def replace(self, **changes: Any) -> Policy:
        """A copy with some fields changed (``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)

    def fingerprint(self) -> str:
        """A stable text identity used to refuse resuming a checkpoint under another policy."""
        d = self.describe()
        return ";".join(f"{k}={d[k]}" for k in sorted(d) if k != "description")

    def describe(self) -> dict[str, Any]:
        """Plain-data summary (for reports and metrics.json)."""
        return {
            "name": self.name,
            "params": self.params.name,
            "activations": self.activations.name,
            "gradients": self.gradients.name,
            "master": None if self.master is None else self.master.name,
            "optimizer_state": self.optimizer_state.name,
            "fp32_ops": sorted(self.fp32_ops),
            "gemm": self.gemm,
            "loss_scale": self.loss_scale,
            "scaler_kwargs": dict(self.scaler_kwargs),
            "fp8": None if self.fp8 is None else {
                "forward": self.fp8.forward.name, "backward": self.fp8.backward.name, "margin": self.fp8.margin,
                "amax_history_len": self.fp8.amax_history_len, "amax_compute_algo": self.fp8.amax_compute_algo,
                "kinds": list(self.fp8.kinds)},
            "quant": None if self.quant is None else {
                "bits": self.quant.bits, "act_bits": self.quant.act_bits, "mode": self.quant.mode,
                "kinds": list(self.quant.kinds), "start": self.quant.start,
                "per_channel": self.quant.per_channel},
            "rounding": self.rounding,
            "description": self.description,
        }

    def memory_ledger(self, optimizer: str = "adamw") -> dict[str, float]:
        """Bytes per parameter: weights (the low-precision copy), gradients, master, optimizer state."""
        nstate = {"adamw": 2, "sgd": 1}.get(optimizer)
        if nstate is None:
            raise ValueError(f"optimizer must be 'adamw' or 'sgd', got {optimizer!r}")
        w = self.params.width / 8
        g = self.gradients.width / 8
        m = 0.0 if self.master is None or self.master == self.params else self.master.width / 8
        s = nstate * self.optimizer_state.width / 8
        return {"weights": w, "grads": g, "master": m, "optimizer_state": s, "total": w + g + m + s}


_REGISTRY: dict[str, Policy] = {}


def register_policy(policy: Policy, *, overwrite: bool = False) -> Policy:
    """Add a policy to the registry under ``policy.name``."""
    if not isinstance(policy, Policy):
        raise TypeError(f"register_policy needs a Policy, got {type(policy).__name__}")
    if policy.name in _REGISTRY and not overwrite:
        raise ValueError(f"a policy named {policy.name!r} is already registered (pass overwrite=True)")
    _REGISTRY[policy.name] = policy
    return policy


def policy_names() -> list[str]:
    """Names of the registered policies, in registration order."""
    return list(_REGISTRY)


def get_policy(policy: str | Policy) -> Policy:
    """Look a policy up by name (a :class:`Policy` is returned as is)."""
    if isinstance(policy, Policy):
        return policy
    if isinstance(policy, str) and policy in _REGISTRY:
        return _REGISTRY[policy]
    raise ValueError(f"unknown policy {policy!r}; valid: {', '.join(_REGISTRY)}")


def _builtin() -> None:
    f16, b16, f32 = as_format("fp16"), as_format("bf16"), as_format("fp32")
    mixed16: dict[str, Any] = {"params": f16, "activations": f16, "gradients": f16, "master": f32}
    register_policy(Policy("fp32", description="everything in FP32 (the reference)"))
    register_policy(Policy("bf16-mixed", params=b16, activations=b16, gradients=b16, master=f32,
                           description="BF16 GEMMs and activations, FP32 master weights, no loss scaling"))
    register_policy(Policy("fp16-mixed", **mixed16, loss_scale="dynamic",
                           description="FP16 GEMMs and activations, FP32 master weights, dynamic loss scaling"))
    register_policy(Policy("fp16-fast-scaler", **mixed16, loss_scale="dynamic",
                           scaler_kwargs={"growth_interval": 8},
                           description="as fp16-mixed with growth_interval=8: the scale climbs to the overflow "
                                       "boundary, then oscillates below it, skipping a step at each overflow"))
    register_policy(Policy("fp16-static", **mixed16, loss_scale=1024.0,
                           description="as fp16-mixed with a fixed loss scale of 1024"))
    register_policy(Policy("fp16-no-scaling", **mixed16, loss_scale=None,
                           description="as fp16-mixed without loss scaling: small gradients underflow"))
    register_policy(Policy("fp16-no-master", params=f16, activations=f16, gradients=f16, master=None,
                           loss_scale="dynamic",
                           description="as fp16-mixed but FP16 weights updated in place (no master copy)"))
    register_policy(Policy("fp8-hybrid", params=b16, activations=b16, gradients=b16, master=f32,
                           fp8=FP8Recipe(),
                           description="linear-layer GEMMs in FP8 (E4M3 forward, E5M2 gradients, delayed "
                                       "scaling), the rest in BF16, FP32 master weights"))
    for bits in (8, 4):
        register_policy(Policy(f"int{bits}-qat", quant=QuantConfig(bits=bits, mode="qat", start=0.5),
                               description=f"FP32 training, then (second half of the steps) fine-tuning with "
                                           f"int{bits} fake-quantized linear layers (weights per channel, "
                                           "activations per tensor, straight-through gradients)"))
        register_policy(Policy(f"int{bits}-ptq", quant=QuantConfig(bits=bits, mode="ptq"),
                               description=f"FP32 training, then int{bits} quantization of the trained "
                                           "linear layers after calibration"))


_builtin()
