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

from .._checks import check_bool, check_int, check_real
from .._fpenv import ieee_mode
from .._names import norm_name, parse_name
from ..formats import Format, as_format
from ..nn.precision import GEMM_KINDS
from ..rounding import Rounding, as_rounding
from .scaler import DynamicLossScaler, LossScaler

__all__ = [
    "FP32_OPS",
    "OPS",
    "BlockRecipe",
    "FP8Recipe",
    "Policy",
    "QuantConfig",
    "get_policy",
    "policy_names",
    "register_policy",
]

#: Update rules of ``Policy.update`` for weights kept without a master copy (applied by `fpsim.amp.bf16`).
UPDATE_RULES = ("rne", "sr", "kahan")

#: Operations whose output a policy may keep in FP32 (CUDA autocast keeps layer_norm, softmax and the
#: losses in FP32; the residual stream and the embedding output stay FP32 because the weights are FP32).
FP32_OPS = frozenset({"layernorm", "softmax", "cross_entropy", "residual", "embedding"})
#: Every op name the model reports (GEMMs are handled separately).
OPS = ("embedding", "layernorm", "softmax", "scale", "gelu", "residual", "cross_entropy")

LossScaleLike = Union[float, str, None]  # noqa: UP007 - a runtime alias on Python 3.10


def _format(value: Any, what: str) -> Format:
    """``as_format`` with the field named in its error."""
    try:
        return as_format(value)
    except (TypeError, ValueError) as e:
        raise type(e)(f"{what}: {e}") from None


def _parse_kinds(kinds: object, what: str) -> tuple[str, ...]:
    """A non-empty tuple of GEMM kinds (:data:`fpsim.nn.GEMM_KINDS`), each parsed by the one name rule."""
    if isinstance(kinds, str) or not isinstance(kinds, (tuple, list, set, frozenset)):
        raise TypeError(f"{what} must be a tuple of GEMM kinds ({', '.join(GEMM_KINDS)}), "
                        f"got {type(kinds).__name__}: {kinds!r}")
    try:
        given = {parse_name(k, GEMM_KINDS, "GEMM kind") for k in kinds}
    except (TypeError, ValueError) as e:
        raise type(e)(f"{what}: {e}") from None
    # Canonical order (not the caller's, nor a set's hash order): the policy fingerprint must not vary.
    out = tuple(k for k in GEMM_KINDS if k in given)
    if not out:
        raise ValueError(f"{what} is empty: it would apply to no GEMM; valid kinds: {', '.join(GEMM_KINDS)}")
    return out


@ieee_mode
@dataclass(frozen=True)
class FP8Recipe:
    """Transformer-Engine-style FP8 GEMMs with per-tensor delayed scaling.

    GEMMs whose kind is in ``kinds`` quantize their inputs (activation and weight) to ``forward`` and the
    incoming gradient to ``backward``, each with its own scale ``fp8_max / amax / 2**margin`` computed from
    the amax history of the previous steps (``amax_compute_algo`` ``"max"`` or ``"most_recent"``). Casts
    saturate. GEMM outputs are stored in the policy's activation/gradient format.

    Checked here, not at the first FP8 GEMM: ``kinds`` is a non-empty tuple of :data:`fpsim.nn.GEMM_KINDS`
    (names by the one rule; a misspelt kind raises instead of training without FP8), ``margin`` an int,
    ``amax_history_len`` an int >= 1.

    >>> FP8Recipe(kinds=(" Linear", "LM_HEAD")).kinds
    ('linear', 'lm_head')
    """

    forward: Format = field(default_factory=lambda: as_format("fp8_e4m3"))
    backward: Format = field(default_factory=lambda: as_format("fp8_e5m2"))
    margin: int = 0
    amax_history_len: int = 1024
    amax_compute_algo: str = "max"
    kinds: tuple[str, ...] = ("linear",)

    def __post_init__(self) -> None:
        # Everything is checked here, not at the first FP8 GEMM: a misspelt kind would otherwise train
        # silently without FP8, and a bad margin would fail only once training had started.
        object.__setattr__(self, "forward", _format(self.forward, "FP8Recipe.forward"))
        object.__setattr__(self, "backward", _format(self.backward, "FP8Recipe.backward"))
        object.__setattr__(self, "margin", check_int(self.margin, "FP8Recipe.margin"))
        object.__setattr__(self, "amax_history_len",
                           check_int(self.amax_history_len, "FP8Recipe.amax_history_len", lo=1))
        object.__setattr__(self, "amax_compute_algo",
                           parse_name(self.amax_compute_algo, ("max", "most_recent"), "amax_compute_algo"))
        object.__setattr__(self, "kinds", _parse_kinds(self.kinds, "FP8Recipe.kinds"))


#: Block-scaled GEMM schemes of :class:`BlockRecipe`.
BLOCK_SCHEMES = ("mxfp8", "nvfp4")


@ieee_mode
@dataclass(frozen=True)
class BlockRecipe:
    """Block-scaled GEMMs (MXFP8, NVFP4) as the 2025 training recipes run them.

    Every GEMM of kind ``kinds`` (the linear layers by default) quantises its two operands along the
    reduction axis, each from the higher-precision tensor, for each of the three GEMMs (forward
    ``Y = X W``, data gradient ``dX = dY Wᵀ``, weight gradient ``dW = Xᵀ dY``): elements in ``forward``
    (X, W) or ``backward`` (dY), one scale per block. The GEMM multiplies the elements, applies the block
    scales inside the product and a per-tensor scale (NVFP4) after it, as Blackwell's block-scaled MMA and
    cuBLAS' ``alpha`` do; its FP32 result is then cast like any GEMM output of the policy.

    Parameters
    ----------
    scheme : {"mxfp8", "nvfp4"}
        ``"mxfp8"``: 1x32 blocks, E8M0 scales (:func:`fpsim.scaling.mx_quantize`); ``"nvfp4"``: 1x16 blocks,
        E4M3 block scales and an FP32 tensor scale (:func:`fpsim.scaling.nvfp4_quantize`).
    forward, backward : Format
        Element formats of X and W, and of dY (fp8_e4m3 / fp8_e5m2 for MXFP8, fp4_e2m1 for NVFP4).
    scale_rounding : {"ceil", "floor"}
        MXFP8's E8M0 rule: ``"ceil"`` rounds ``amax / elem_max`` up to a power of two (Mishra et al., arXiv
        2506.08027; nothing saturates), ``"floor"`` is OCP MX v1.0's. Ignored by NVFP4.
    weight_2d : bool
        NVFP4: 16x16 blocks for the weights, so the forward and the data-gradient GEMM see the same
        quantised W (arXiv 2509.25149 section 4.3); False: 1x16 along each GEMM's reduction axis.
    hadamard : bool
        A 16x16 random Hadamard transform (``H16 / 4`` times a diagonal of random signs drawn once from the
        runtime's seed) on both inputs of the weight-gradient GEMM, along the token (reduction) axis, before
        they are quantised: ``(T X)ᵀ (T dY) = Xᵀ dY`` in exact arithmetic (arXiv 2509.25149 section 4.2).
    sr_gradients : bool
        Stochastic rounding of the quantised gradient dY (the runtime's seeded generator); X and W are
        rounded to nearest even (arXiv 2509.25149 section 4.4).
    four_over_six : bool
        NVFP4: each block scaled to 6 or to 4, whichever has the lower squared error (Cook et al., arXiv
        2512.02010); see :func:`fpsim.scaling.nvfp4_quantize`.
    bf16_last : int
        The linear layers of the last ``bf16_last`` transformer blocks keep the policy's own GEMMs
        (NVIDIA's recipe keeps about 15% of the linear layers, mostly the last ones, in BF16). The
        runtime needs the model's depth for this (``PolicyRuntime.n_layer``, set by the trainer).
    gemm : str
        ``"fast"``: the dequantised operands (block scales applied exactly, in float32) multiplied with
        float32 BLAS, the tensor scales applied after; ``"b200"``: every block-scaled GEMM through
        :func:`fpsim.mma.matmul_block_scaled` (Blackwell's instruction chain, bit-exact, slow).
    kinds : tuple of str
        GEMM kinds the recipe applies to (:data:`fpsim.nn.GEMM_KINDS`).

    Examples
    --------
    >>> BlockRecipe("nvfp4").replace(hadamard=False).hadamard
    False
    """

    scheme: str = "nvfp4"
    forward: Format | None = None
    backward: Format | None = None
    scale_rounding: str = "ceil"
    weight_2d: bool = True
    hadamard: bool = True
    sr_gradients: bool = True
    four_over_six: bool = False
    bf16_last: int = 0
    gemm: str = "fast"
    kinds: tuple[str, ...] = ("linear",)

    def __post_init__(self) -> None:
        sch = parse_name(self.scheme, BLOCK_SCHEMES, "BlockRecipe.scheme")
        object.__setattr__(self, "scheme", sch)
        dflt = ("fp8_e4m3", "fp8_e4m3") if sch == "mxfp8" else ("fp4_e2m1", "fp4_e2m1")
        allowed = ("fp8_e4m3", "fp8_e5m2") if sch == "mxfp8" else ("fp4_e2m1",)
        for f, d in zip(("forward", "backward"), dflt):
            fmt = _format(d if getattr(self, f) is None else getattr(self, f), f"BlockRecipe.{f}")
            if fmt.name not in allowed:
                raise ValueError(f"BlockRecipe.{f}={fmt.name} is not an element format of {sch}; "
                                 f"valid: {', '.join(allowed)}")
            object.__setattr__(self, f, fmt)
        object.__setattr__(self, "scale_rounding",
                           parse_name(self.scale_rounding, ("ceil", "floor"), "BlockRecipe.scale_rounding"))
        for f in ("weight_2d", "hadamard", "sr_gradients", "four_over_six"):
            object.__setattr__(self, f, check_bool(getattr(self, f), f"BlockRecipe.{f}"))
        object.__setattr__(self, "bf16_last", check_int(self.bf16_last, "BlockRecipe.bf16_last", lo=0))
        object.__setattr__(self, "gemm", parse_name(self.gemm, ("fast", "b200"), "BlockRecipe.gemm"))
        object.__setattr__(self, "kinds", _parse_kinds(self.kinds, "BlockRecipe.kinds"))
        if "attn" in self.kinds:  # the recipes keep attention's batched GEMMs in BF16 (arXiv 2509.25149)
            raise ValueError("BlockRecipe.kinds: 'attn' (attention's batched GEMMs) is not block-scaled here; "
                             "valid: linear, lm_head")

    @property
    def block(self) -> int:
        """Elements per scale along the reduction axis (32 for MXFP8, 16 for NVFP4)."""
        return 32 if self.scheme == "mxfp8" else 16

    def replace(self, **changes: Any) -> BlockRecipe:
        """A copy with some fields changed (``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)

    def describe(self) -> dict[str, Any]:
        """Plain-data summary (for reports and the policy fingerprint)."""
        assert self.forward is not None and self.backward is not None
        return {"scheme": self.scheme, "forward": self.forward.name, "backward": self.backward.name,
                "scale_rounding": self.scale_rounding, "weight_2d": self.weight_2d, "hadamard": self.hadamard,
                "sr_gradients": self.sr_gradients, "four_over_six": self.four_over_six,
                "bf16_last": self.bf16_last, "gemm": self.gemm, "kinds": list(self.kinds)}


_BLOCK_FIELDS = frozenset(f.name for f in dataclasses.fields(BlockRecipe))


@ieee_mode
@dataclass(frozen=True)
class QuantConfig:
    """Integer fake quantization of the GEMMs of kind ``kinds`` (torch ``FakeQuantize`` semantics).

    Weights: symmetric, per output channel (``per_channel=False``: one scale per tensor),
    ``[-2**(bits-1), 2**(bits-1)-1]``, range taken from the current weights. Activations: affine, per
    tensor, ``[0, 2**act_bits - 1]`` (``act_bits`` defaults to ``bits``), min/max from a moving-average
    observer (``averaging_constant``). ``start``: QAT switches fake quantization on after this fraction of
    the training steps (0: from the first step; 0.5: FP32 pre-training, then QAT fine-tuning, the usual
    recipe). Backward: straight-through estimator masked where the rounded value fell outside the range.
    ``mode="qat"`` fake-quantizes during training; ``mode="ptq"`` trains in the policy's float formats and
    fake-quantizes only for evaluation after calibrating the observers.

    Every field is checked here: ``bits``/``act_bits`` ints in 2..16, ``mode`` and ``kinds`` names by the
    one rule (``kinds`` a non-empty tuple of :data:`fpsim.nn.GEMM_KINDS`), ``0 < averaging_constant <= 1``,
    ``calibration_batches >= 1``, ``0 <= start < 1``, ``per_channel`` a bool.

    >>> QuantConfig(bits=4, mode="PTQ").mode
    'ptq'
    >>> QuantConfig(kinds=("linaer",))
    Traceback (most recent call last):
    ...
    ValueError: QuantConfig.kinds: unknown GEMM kind 'linaer'; valid: linear, attn, lm_head
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
            v = check_int(v, f"QuantConfig.{f}")
            if not 2 <= v <= 16:
                raise ValueError(f"QuantConfig.{f} must be an int in 2..16, got {v!r}")
            object.__setattr__(self, f, v)
        object.__setattr__(self, "mode", parse_name(self.mode, ("qat", "ptq"), "QuantConfig.mode"))
        object.__setattr__(self, "kinds", _parse_kinds(self.kinds, "QuantConfig.kinds"))
        # torch's MovingAverageMinMaxObserver: x_min <- x_min + c (min(x) - x_min); c = 0 would never move.
        object.__setattr__(self, "averaging_constant", check_real(
            self.averaging_constant, "QuantConfig.averaging_constant", lo=0.0, hi=1.0, lo_open=True))
        object.__setattr__(self, "calibration_batches",
                           check_int(self.calibration_batches, "QuantConfig.calibration_batches", lo=1))
        start = check_real(self.start, "QuantConfig.start")
        if not 0.0 <= start < 1.0:
            raise ValueError(f"QuantConfig.start must be a fraction in [0, 1), got {self.start!r}")
        object.__setattr__(self, "start", start)
        object.__setattr__(self, "per_channel", check_bool(self.per_channel, "QuantConfig.per_channel"))

    @property
    def weight_range(self) -> tuple[int, int]:
        return -(2 ** (self.bits - 1)), 2 ** (self.bits - 1) - 1

    @property
    def act_range(self) -> tuple[int, int]:
        return 0, 2 ** (self.bits if self.act_bits is None else self.act_bits) - 1


def _parse_ops(ops: object) -> frozenset[str]:
    if isinstance(ops, str) or not isinstance(ops, (tuple, list, set, frozenset)):
        raise TypeError(f"Policy.fp32_ops must be a set of op names ({', '.join(OPS)}), "
                        f"got {type(ops).__name__}: {ops!r}")
    good, bad = set(), []
    for op in ops:
        try:
            good.add(parse_name(op, OPS, "op"))
        except ValueError:
            bad.append(op)
    if bad:
        raise ValueError(f"Policy.fp32_ops has unknown ops {sorted(map(str, bad))}; valid: {', '.join(OPS)}")
    return frozenset(good)


def _parse_gemm(gemm: object, activations: Format) -> str:
    """``"fast"``, ``"fast64"`` or the canonical name of a device whose model exists for ``activations``."""
    key = norm_name(gemm, "Policy.gemm")
    if key in ("fast", "fast64"):
        return key
    from .. import mma  # L2; imported only for a device GEMM, as the runtime does

    try:
        dev = mma.device_info(key).name
        mma.get_model(dev, activations.name, "fp32")  # the pair the runtime will ask for at the first GEMM
    except ValueError as e:
        raise ValueError(f"Policy.gemm={gemm!r} (activations {activations.name}): not 'fast', 'fast64' or a "
                         f"device with a model for these inputs: {e}") from None
    return dev


def _check_device_gemm(p: Policy) -> None:
    """A device GEMM (one Tensor Core model, one input format) needs every GEMM operand in one format.

    Forward GEMMs multiply activations by weights (``params``) or by activations, the backward ones
    gradients by weights or activations: with ``params``, ``activations`` and ``gradients`` equal, every
    GEMM of the model is an MMA of that one format, as a framework's fp16/bf16 kernels are. FP8 recipes
    (E5M2 gradients times E4M3 values in the backward GEMMs) and fake-quantized integer GEMMs are not
    modelled bit-exactly: refused here rather than run through a model of another format.
    """
    fmts = {f: getattr(p, f).name for f in ("params", "activations", "gradients")}
    if len(set(fmts.values())) > 1:
        raise ValueError(f"Policy.gemm={p.gemm!r} (a device's Tensor Core model, one input format) needs the GEMM "
                         f"operands in one format: params, activations and gradients are "
                         f"{', '.join(f'{k}={v}' for k, v in fmts.items())}; make them equal or use gemm='fast'")
    if p.fp8 is not None:
        raise ValueError(f"Policy.gemm={p.gemm!r} with an FP8Recipe: bit-exact FP8 device GEMMs (E4M3 x E5M2 in the "
                         "backward pass) are not modelled by the runtime; use gemm='fast' (or fpsim.mma directly)")
    if p.block is not None:
        raise ValueError(f"Policy.gemm={p.gemm!r} with a BlockRecipe: its GEMMs are block-scaled; choose their "
                         "model with BlockRecipe.gemm ('fast' or 'b200') and leave Policy.gemm='fast'")
    if p.quant is not None:
        raise ValueError(f"Policy.gemm={p.gemm!r} with a QuantConfig: fake-quantized integer operands are not values "
                         f"of the device's {p.activations.name} input format; use gemm='fast'")


_SCALER_KEYS = ("init_scale", "growth_factor", "backoff_factor", "growth_interval")


def _check_scaler_kwargs(kwargs: object, loss_scale: object) -> dict[str, Any]:
    if not isinstance(kwargs, Mapping):
        raise TypeError(f"Policy.scaler_kwargs must be a mapping, got {type(kwargs).__name__}")
    kw = dict(kwargs)
    if not kw:
        return kw
    if loss_scale != "dynamic":
        raise ValueError(f"Policy.scaler_kwargs {kw} apply only with loss_scale='dynamic', got "
                         f"loss_scale={loss_scale!r}")
    bad = sorted(str(k) for k in kw if k not in _SCALER_KEYS)
    if bad:
        raise ValueError(f"Policy.scaler_kwargs has unknown keys {bad}; valid: {', '.join(_SCALER_KEYS)}")
    DynamicLossScaler(**kw)  # its own checks, now rather than at the first step
    return kw


@ieee_mode
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
        block-FMA emulation of the device's matrix unit, ``activations`` in, fp32 out, slower). Parsed by
        the one name rule (``"FAST"`` is ``"fast"``); a device is looked up, with its model for
        ``activations``, when the policy is built, and stored canonical (``" A100-SXM4"`` becomes
        ``"a100"``). A device GEMM applies to *every* GEMM of the model: the forward ones (linear layers,
        attention's ``q kᵀ`` and ``p v``, the lm_head) and both backward ones of each (``dX = dY Wᵀ``,
        ``dW = Xᵀ dY``), and it needs ``params``, ``activations`` and ``gradients`` in one format, no
        ``fp8`` and no ``quant`` (refused otherwise: those operands are not one format's values).
    loss_scale : None, float or "dynamic"
        No scaling, a finite positive static scale, or a :class:`DynamicLossScaler` built from
        ``scaler_kwargs`` (keys ``init_scale``, ``growth_factor``, ``backoff_factor``, ``growth_interval``,
        checked when the policy is built; refused without ``"dynamic"``, where they would be ignored).
    fp8 : FP8Recipe or None
    quant : QuantConfig or None
    block : BlockRecipe or None
        Block-scaled GEMMs (MXFP8, NVFP4 recipes); its fields are also reachable through
        :meth:`replace` (``get_policy("nvfp4").replace(hadamard=False)`` is the ablation).
    rounding : str
        Rounding mode of every cast (``"rne"``; ``"sr"`` draws from the runtime's seeded generator).
    update : None or str
        How the optimizer's update is rounded into weights kept without a master copy (``master=None``):
        None (the default: ``round(w - u)`` as any cast), or ``"rne"``, ``"sr"`` (stochastic rounding of
        the update only, the casts keep ``rounding``) or ``"kahan"`` (a compensation buffer in the params
        format, Zamirai et al., arXiv 2010.06192), each computed by :mod:`fpsim.amp.bf16`, which also
        counts the update mass applied.
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
    update: str | None = None
    block: BlockRecipe | None = None

    def __post_init__(self) -> None:
        # Every field is checked (and every name parsed by the one rule) here, so a policy that
        # constructs is one that trains: nothing fails later at the first step.
        if not isinstance(self.name, str):
            raise TypeError(f"Policy.name must be a str, got {type(self.name).__name__}: {self.name!r}")
        if not self.name.strip():
            raise ValueError(f"Policy.name must be a non-empty str, got {self.name!r}")
        if not isinstance(self.description, str):
            raise TypeError(f"Policy.description must be a str, got {type(self.description).__name__}")
        for f in ("params", "activations", "gradients", "optimizer_state"):
            fmt = _format(getattr(self, f), f"Policy.{f}")
            if not fmt.fits_float32:
                raise ValueError(f"Policy.{f}={fmt.name}: fpsim.amp carries tensors in float32; "
                                 "choose a format that fits in float32")
            object.__setattr__(self, f, fmt)
        if self.master is not None:
            object.__setattr__(self, "master", _format(self.master, "Policy.master"))
        object.__setattr__(self, "fp32_ops", _parse_ops(self.fp32_ops))
        object.__setattr__(self, "gemm", _parse_gemm(self.gemm, self.activations))
        ls = self.loss_scale
        if isinstance(ls, str):
            ls = parse_name(ls, ("dynamic",), "Policy.loss_scale")
        elif ls is not None:
            try:
                v = check_real(ls, "Policy.loss_scale", lo=0.0, lo_open=True)
            except (TypeError, ValueError) as e:
                raise type(e)(f"Policy.loss_scale must be None, a positive number or 'dynamic', got {ls!r}") from None
            ls = ls if type(ls) in (int, float) else v  # NumPy scalars become floats (JSON, fingerprint)
        object.__setattr__(self, "loss_scale", ls)
        object.__setattr__(self, "scaler_kwargs", _check_scaler_kwargs(self.scaler_kwargs, ls))
        if self.fp8 is not None and not isinstance(self.fp8, FP8Recipe):
            raise TypeError(f"Policy.fp8 must be an FP8Recipe or None, got {type(self.fp8).__name__}")
        if self.quant is not None and not isinstance(self.quant, QuantConfig):
            raise TypeError(f"Policy.quant must be a QuantConfig or None, got {type(self.quant).__name__}")
        if self.block is not None and not isinstance(self.block, BlockRecipe):
            raise TypeError(f"Policy.block must be a BlockRecipe or None, got {type(self.block).__name__}")
        for other in ("fp8", "quant"):
            rec = getattr(self, other)
            if self.block is not None and rec is not None and set(self.block.kinds) & set(rec.kinds):
                raise ValueError(f"Policy.block and Policy.{other} both claim GEMM kinds "
                                 f"{sorted(set(self.block.kinds) & set(rec.kinds))}; give each kind to one")
        if self.fp8 is not None and self.quant is not None:
            both = sorted(set(self.fp8.kinds) & set(self.quant.kinds))
            if both:  # FP8 would win and the quantization config would be ignored for these GEMMs
                raise ValueError(f"Policy.fp8 and Policy.quant both claim GEMM kinds {both}; give each kind to one")
        if self.gemm not in ("fast", "fast64"):
            _check_device_gemm(self)
        r = as_rounding(self.rounding)
        object.__setattr__(self, "rounding", r.value)
        if self.update is not None:
            object.__setattr__(self, "update", parse_name(self.update, UPDATE_RULES, "Policy.update"))
            if self.master is not None:
                raise ValueError(f"Policy.update={self.update!r} is a rule for weights kept without a master copy; "
                                 f"set master=None (got master={self.master.name})")

    # ------------------------------------------------------------------ derived
    @property
    def weights(self) -> Format:
        """Storage format of the weights the optimizer updates: the master format, or ``params``."""
        return self.master if self.master is not None else self.params

    @property
    def stochastic(self) -> bool:
        """Whether the runtime needs a seeded generator (SR casts, or SR weight updates)."""
        return (self.rounding == Rounding.SR.value or self.update == "sr"
                or (self.block is not None and self.block.sr_gradients))

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
        """A copy with some fields changed (``dataclasses.replace``).

        Fields of :class:`BlockRecipe` that are not Policy fields (``hadamard``, ``weight_2d``,
        ``sr_gradients``, ``four_over_six``, ``bf16_last``, ``scale_rounding``, ``scheme``) change the
        policy's block recipe, so an ablation is one call: ``get_policy("nvfp4").replace(hadamard=False)``.
        """
        own = {f.name for f in dataclasses.fields(self)}
        to_block = {k: changes.pop(k) for k in list(changes) if k not in own and k in _BLOCK_FIELDS}
        if to_block:
            blk = changes.get("block", self.block)
            if blk is None:
                raise ValueError(f"Policy.replace({', '.join(sorted(to_block))}=...): these are BlockRecipe fields "
                                 f"and policy {self.name!r} has no block recipe (Policy.block is None)")
            changes["block"] = blk.replace(**to_block)
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
            **({} if self.update is None else {"update": self.update}),  # absent: fingerprints stay as they were
            **({} if self.block is None else {"block": self.block.describe()}),
        }

    def memory_ledger(self, optimizer: str = "adamw") -> dict[str, float]:
        """Bytes per parameter: weights (the low-precision copy), gradients, master, optimizer state.

        The compensation buffer of ``update="kahan"`` (one params-format value per weight) is counted as
        ``master``: it is what the policy keeps instead of a master copy."""
        nstate = {"adamw": 2, "sgd": 1}[parse_name(optimizer, ("adamw", "sgd"), "optimizer")]
        w = self.params.width / 8
        g = self.gradients.width / 8
        m = 0.0 if self.master is None or self.master == self.params else self.master.width / 8
        if self.update == "kahan":
            m = self.params.width / 8
        s = nstate * self.optimizer_state.width / 8
        return {"weights": w, "grads": g, "master": m, "optimizer_state": s, "total": w + g + m + s}


_REGISTRY: dict[str, Policy] = {}


def register_policy(policy: Policy, *, overwrite: bool = False) -> Policy:
    """Add a policy to the registry under ``policy.name``."""
    if not isinstance(policy, Policy):
        raise TypeError(f"register_policy needs a Policy, got {type(policy).__name__}")
    # Names are looked up by the one rule, so "Mine" and "mine " would be the same name.
    if policy.name != policy.name.strip():
        raise ValueError(f"a registered policy name cannot start or end with white space, got {policy.name!r}")
    same = [k for k in _REGISTRY if k.lower() == norm_name(policy.name, "policy name")]
    if same and not overwrite:
        raise ValueError(f"a policy named {same[0]!r} is already registered (pass overwrite=True)")
    for k in same:
        if k != policy.name:
            del _REGISTRY[k]
    _REGISTRY[policy.name] = policy
    return policy


def policy_names() -> list[str]:
    """Names of the registered policies, in registration order."""
    return list(_REGISTRY)


@ieee_mode
def get_policy(policy: str | Policy) -> Policy:
    """Look a policy up by name (a :class:`Policy` is returned as is)."""
    if isinstance(policy, Policy):
        return policy
    if not isinstance(policy, str):
        raise TypeError(f"policy must be a Policy or a name, got {type(policy).__name__}: {policy!r}")
    return _REGISTRY[parse_name(policy, _REGISTRY, "policy")]


@ieee_mode
def register_pure_bf16() -> None:
    """Register ``bf16-pure-rne``, ``bf16-pure-sr`` and ``bf16-pure-kahan`` (called by the policy registry)."""
    b16 = as_format("bf16")
    what = {"rne": "updates rounded to nearest (small updates are lost: the classic stall)",
            "sr": "updates rounded stochastically (unbiased; Graphcore/Trainium-style)",
            "kahan": "Kahan-compensated updates (a BF16 compensation buffer; Zamirai et al. 2020)"}
    for rule in UPDATE_RULES:
        register_policy(Policy(f"bf16-pure-{rule}", params=b16, activations=b16, gradients=b16, master=None,
                               update=rule,
                               description=f"pure BF16: BF16 weights without an FP32 master, FP32 optimizer "
                                           f"moments, {what[rule]}"), overwrite=True)


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
                           description="as fp16-mixed with growth_interval=8: the scale doubles after every 8 clean "
                                       "steps, so it reaches the overflow boundary (if the run is long enough) "
                                       "sooner; each overflow skips a step and halves it"))
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
    # apex's opt levels (apex.amp.initialize): O0 pure FP32; O1 autocast's op lists (CUDA), FP32 weights, dynamic
    # loss scale; O2 FP16 model with FP32 master weights and FP32 norms (keep_batchnorm_fp32), FP32 loss
    # (apex casts the model output to FP32), dynamic loss scale; O3 pure FP16 (no master, FP16 optimizer state,
    # apex's default static loss scale 1).
    register_policy(Policy("O0", loss_scale=1.0, description="apex O0: everything in FP32"))
    register_policy(Policy("O1", **mixed16, loss_scale="dynamic",
                           description="apex O1 / torch autocast(fp16): GEMMs in FP16 by autocast's op lists, "
                                       "FP32 weights, dynamic loss scaling"))
    register_policy(Policy("O2", **mixed16, fp32_ops=frozenset({"layernorm", "cross_entropy"}),
                           loss_scale="dynamic",
                           description="apex O2: FP16 model (residual stream and softmax in FP16) with FP32 master "
                                       "weights, FP32 layer norms and loss, dynamic loss scaling"))
    register_policy(Policy("O3", params=f16, activations=f16, gradients=f16, master=None, optimizer_state=f16,
                           fp32_ops=frozenset(), loss_scale=1.0,
                           description="apex O3: pure FP16 (weights, activations, norms, loss and optimizer "
                                       "state), no master copy, loss scale 1"))
    register_pure_bf16()
    register_block_policies()


@ieee_mode
def register_block_policies() -> None:
    """Register ``mxfp8``, ``mxfp8-e5m2-grads`` and ``nvfp4`` (called by the policy registry)."""
    b16, f32 = as_format("bf16"), as_format("fp32")
    base: dict[str, Any] = {"params": b16, "activations": b16, "gradients": b16, "master": f32}
    # MXFP8 (arXiv 2506.08027) has no Hadamard transform and no stochastic rounding: plain RNE casts
    mx: dict[str, Any] = {"hadamard": False, "sr_gradients": False}
    register_policy(Policy("mxfp8", **base, block=BlockRecipe("mxfp8", **mx),
                           description="MXFP8 (arXiv 2506.08027): every linear GEMM's operands E4M3 in 1x32 blocks "
                                       "along K with E8M0 scales rounded up, FP32 accumulation, BF16 elsewhere, "
                                       "FP32 master weights"), overwrite=True)
    register_policy(Policy("mxfp8-e5m2-grads", **base,
                           block=BlockRecipe("mxfp8", backward=as_format("fp8_e5m2"), **mx),
                           description="as mxfp8 with E5M2 gradients (the variant arXiv 2506.08027 reports "
                                       "diverging at scale)"), overwrite=True)
    register_policy(Policy("nvfp4", **base, block=BlockRecipe("nvfp4", bf16_last=1),
                           description="NVFP4 recipe (arXiv 2509.25149): E2M1 elements, E4M3 block scales and an "
                                       "FP32 tensor scale, 16x16 weight blocks, 1x16 activation and gradient "
                                       "blocks, random Hadamard transform on the weight-gradient GEMM's inputs, "
                                       "stochastic rounding of gradients, the last block's linear layers in "
                                       "BF16"), overwrite=True)


_builtin()
