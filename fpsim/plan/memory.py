"""Training memory per device: model states by recipe, optimizer and ZeRO stage; activations by formula.

Model states (Rajbhandari et al., "ZeRO", arXiv 1910.02054, section 3.1): with mixed-precision Adam every
parameter costs 2 bytes of 16-bit weights, 2 of 16-bit gradients and K = 12 of optimizer states (FP32
master copy, momentum, variance): 16 bytes. ZeRO stage 1 partitions the optimizer states (master copy
included) across the N_d data-parallel ranks, stage 2 the gradients too, stage 3 the weights too.

Activations (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models",
arXiv 2205.05198, section 4): per layer s b h (34 + 5 a s / h) bytes with 16-bit activations and 1-byte
dropout masks; with selective recomputation (the attention core recomputed) or a flash kernel the
5 a s^2 b term goes; full recomputation keeps each layer's 16-bit input, 2 s b h. The planner counts
the same tensors one by one (:func:`activation_terms`), so the formula falls out for a GPT layer and the
same accounting extends to grouped-query attention, SwiGLU, no dropout, FP32 activations and tensor
parallelism (Korthikanti's Table 2).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from .._checks import check_bool, check_int, check_real
from .._fpenv import ieee_mode
from .._names import norm_name, parse_name
from .models import ModelSpec, get_model

__all__ = [
    "CHECKPOINT_MODES",
    "MEMORY_KEYS",
    "MemoryPlan",
    "OPTIMIZERS",
    "Recipe",
    "activation_bytes",
    "activation_terms",
    "get_recipe",
    "memory",
    "plot_memory",
    "recipe_names",
]

#: Keys of :attr:`MemoryPlan.per_device` (and of ``fpsim plan --json``'s ``"per_device"``), in stacking order.
MEMORY_KEYS: tuple[str, ...] = ("weights", "grads", "master", "optimizer", "activations", "total")
#: Optimizer name -> number of per-parameter states. ``sgd`` is SGD with momentum, as fpsim.amp.SGD.
OPTIMIZERS: Mapping[str, int] = MappingProxyType({"adamw": 2, "adam": 2, "sgd": 1, "sgd-no-momentum": 0})
#: Activation checkpointing modes, as fpsim.nn.GPTConfig.checkpoint (an int k >= 1 also: every k-th block).
CHECKPOINT_MODES: tuple[str, ...] = ("none", "blocks", "selective")

_NF4_BITS = 4.0
# QLoRA (Dettmers et al., arXiv 2305.14314, section 3, "Double Quantization"): FP32 constants per block of
# 64 weights cost 32/64 = 0.5 bits/parameter; quantizing them to 8 bits in blocks of 256, with one FP32
# second-level constant per block, costs 8/64 + 32/(64*256) = 0.127 bits/parameter.
QLORA_CONSTANT_BITS = 8 / 64 + 32 / (64 * 256)


@ieee_mode
@dataclass(frozen=True)
class Recipe:
    """Bytes per parameter of each model state, and the element size of saved activations.

    ``weights``: the copy the forward pass reads; ``grads``: gradients; ``master``: a separate
    higher-precision copy the optimizer updates (0 when there is none); ``state``: bytes of each
    optimizer state (momentum, variance); ``activations``: bytes of a saved activation element.
    ``frozen``: the base weights are not trained (no grads, master or states for them; QLoRA).
    ``adapter``: (weight, grad, master, state) bytes of trainable LoRA parameters (QLoRA only).
    """

    name: str
    weights: float
    grads: float
    master: float
    state: float
    activations: int
    description: str
    frozen: bool = False
    adapter: tuple[float, float, float, float] | None = None

    def __post_init__(self) -> None:
        for f in ("weights", "grads", "master", "state"):
            object.__setattr__(self, f, check_real(getattr(self, f), f"Recipe.{f}", lo=0.0))
        object.__setattr__(self, "activations", check_int(self.activations, "Recipe.activations", lo=1))


#: Recipes with no fpsim.amp policy behind them (the planner's own); every other recipe name is a
#: registered policy, whose bytes come from the policy's formats (its ``memory_ledger``).
_RECIPES: dict[str, Recipe] = {
    "bf16-sr-bf16-states": Recipe(
        "bf16-sr-bf16-states", 2, 2, 0, 2, 2,
        "planner-only (no fpsim.amp policy): pure BF16 as Ozkara et al. train: weights, "
        "gradients AND the Adam moments in BF16, the update rounded stochastically, no master copy (8 "
        "bytes/parameter with Adam; the policy bf16-pure-sr keeps FP32 moments: 12)"),
    "fp8-bf16-master": Recipe(
        "fp8-bf16-master", 1, 2, 2, 4, 2,
        "planner-only (no fpsim.amp policy): an FP8 (E4M3) copy of the weights for the forward GEMMs, BF16 "
        "weights updated by the optimizer (the master copy), BF16 gradients, FP32 Adam moments, BF16 saved "
        "activations (13 bytes/parameter with Adam; the policy fp8-hybrid keeps BF16 weights and an FP32 "
        "master: 16)"),
    "qlora": Recipe("qlora", (_NF4_BITS + QLORA_CONSTANT_BITS) / 8, 0, 0, 0, 2,
                    "planner-only (no fpsim.amp policy): QLoRA: frozen NF4 block weights (4 bits + 0.127 bits "
                    "of double-quantized constants), BF16 embeddings/norms/output layer, BF16 LoRA adapters "
                    "with BF16 gradients and FP32 Adam states", frozen=True, adapter=(2, 2, 0, 4)),
}
#: Earlier names of planner-only recipes, still accepted (they were easy to confuse with the policies
#: ``bf16-pure-sr`` and ``fp8-hybrid``, which store more).
_ALIASES: dict[str, str] = {"bf16-sr": "bf16-sr-bf16-states", "fp8": "fp8-bf16-master"}


def _policy_recipe(name: str) -> Recipe | None:
    """A registered fpsim.amp policy as a recipe (its formats' widths), or None if there is none so named."""
    from ..amp import get_policy, policy_names

    names = policy_names()
    try:
        canon = parse_name(name, names, "policy")
    except ValueError:
        return None
    pol = get_policy(canon)
    w = pol.params.width / 8
    master = 0.0 if pol.master is None or pol.master == pol.params else pol.master.width / 8
    if pol.update == "kahan":  # pure BF16 with Kahan-compensated updates: a params-format buffer per weight
        master = w
    return Recipe(pol.name, w, pol.gradients.width / 8, master, pol.optimizer_state.width / 8,
                  pol.activations.width // 8, f"the fpsim.amp policy {pol.name!r}: {pol.description}")


@ieee_mode
def recipe_names() -> list[str]:
    """Recipes :func:`memory` accepts: every fpsim.amp policy name (its true storage, from the policy's
    formats), then the planner-only recipes (``bf16-sr-bf16-states``, ``fp8-bf16-master``, ``qlora``).

    Examples
    --------
    >>> names = recipe_names()
    >>> names[:3], names[-3:]
    (['fp32', 'bf16-mixed', 'fp16-mixed'], ['bf16-sr-bf16-states', 'fp8-bf16-master', 'qlora'])
    """
    from ..amp import policy_names

    pol = policy_names()
    return [*pol, *(n for n in _RECIPES if n not in pol)]


@ieee_mode
def get_recipe(recipe: str | Recipe) -> Recipe:
    """A :class:`Recipe` by name (one name rule; :func:`recipe_names` lists them), or the Recipe itself.

    Examples
    --------
    >>> r = get_recipe("FP16-Mixed")
    >>> r.weights + r.grads + r.master + 2 * r.state
    16.0
    """
    if isinstance(recipe, Recipe):
        return recipe
    if isinstance(recipe, str):
        recipe = _ALIASES.get(norm_name(recipe, "recipe"), recipe)
    canon = parse_name(recipe, recipe_names(), "recipe")
    r = _policy_recipe(canon)   # a policy name: the policy's own storage
    if r is not None:
        return r
    return _RECIPES[canon]


# -- activations ------------------------------------------------------------------------------------


def _parse_checkpoint(value: object) -> str | int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(f"checkpoint must be one of {', '.join(CHECKPOINT_MODES)} or an int k >= 1, "
                        f"got {type(value).__name__} {value!r}")
    if isinstance(value, int):
        return check_int(value, "checkpoint (every k-th block)", lo=1)
    return parse_name(value, CHECKPOINT_MODES, "checkpoint mode")


@ieee_mode
def activation_terms(model: str | ModelSpec | Any, *, micro_batch: int = 1, seq_len: int | None = None,
                     element_bytes: int = 2, flash: bool = False, tp: int = 1,
                     sequence_parallel: bool = False, dropout: bool | None = None) -> dict[str, float]:
    """Bytes each saved tensor of ONE transformer layer takes, no recomputation (Korthikanti et al. section 4.1).

    Keys are the tensors (``"ln1.input"``, ``"q,k"``, ``"softmax"``, ...). ``element_bytes``: size of an
    activation element (2 for 16-bit; masks are 1 byte). ``flash``: the attention core is a flash kernel:
    no s x s tensors, but the row log-sum-exp (FP32, a s b) is kept. ``tp``: tensor-parallel degree
    (Megatron splits attention heads and the MLP width; the tensors before the QKV and FC GEMMs, the norms'
    inputs and the dropout masks after the two row-parallel GEMMs are replicated unless
    ``sequence_parallel``). ``dropout``: None takes the model's own setting.

    For a GPT layer with dropout in 16 bits the terms add up to s b h (34 + 5 a s / h):

    Examples
    --------
    >>> m = ModelSpec("t", n_layer=1, n_embd=64, n_head=4, vocab_size=16, seq_len=32, dropout=True)
    >>> t = activation_terms(m, micro_batch=2)
    >>> s, b, h, a = 32, 2, 64, 4
    >>> sum(t.values()) == s * b * h * (34 + 5 * a * s / h)
    True
    """
    m = get_model(model)
    b = check_int(micro_batch, "micro_batch", lo=1)
    s = m.seq_len if seq_len is None else check_int(seq_len, "seq_len", lo=1)
    e = check_int(element_bytes, "element_bytes", lo=1)
    t = check_int(tp, "tp", lo=1)
    fl = check_bool(flash, "flash")
    sp = check_bool(sequence_parallel, "sequence_parallel")
    dr = m.dropout if dropout is None else check_bool(dropout, "dropout")
    h, a, kv, f = m.n_embd, m.n_head, m.kv_dim, int(m.ffn_hidden or 4 * m.n_embd)
    sbh = s * b * h
    rep = t if sp else 1  # replicated tensors are split only with sequence parallelism
    terms: dict[str, float] = {
        "ln1.input": e * sbh / rep,
        "qkv.input": e * sbh / rep,
        "q,k": e * s * b * (h + kv) / t,
        "v": e * s * b * kv / t,
        "proj.input": e * sbh / t,
    }
    if fl:
        terms["softmax.lse"] = 4 * a * s * b / t  # FP32 row log-sum-exp, FlashAttention's only O(s) extra
    else:
        terms["softmax"] = e * a * s * s * b / t
        if dr:
            terms["softmax.dropout_mask"] = 1 * a * s * s * b / t
            terms["softmax.dropout"] = e * a * s * s * b / t
    if dr:
        terms["attn.dropout_mask"] = 1 * sbh / rep
    terms["ln2.input"] = e * sbh / rep
    terms["fc.input"] = e * sbh / rep
    if m.gated_mlp:  # SwiGLU: gate and up pre-activations, and their product (the down projection's input)
        terms["gate,up"] = 2 * e * s * b * f / t
        terms["down.input"] = e * s * b * f / t
    else:
        terms["gelu.input"] = e * s * b * f / t
        terms["fc2.input"] = e * s * b * f / t
    if dr:
        terms["mlp.dropout_mask"] = 1 * sbh / rep
    return terms


def _outside_layers(m: ModelSpec, b: int, s: int, e: int, tp: int, dr: bool) -> float:
    """Embedding dropout mask, final norm and output-layer inputs, FP32 logits (Korthikanti section 4.3)."""
    sbh = s * b * m.n_embd
    out = 2 * e * sbh / tp + 4 * s * b * m.vocab_size / tp  # final norm and output GEMM inputs; FP32 logits
    if dr:
        out += sbh / tp  # embedding dropout mask
    return out


@ieee_mode
def activation_bytes(model: str | ModelSpec | Any, *, micro_batch: int = 1, seq_len: int | None = None,
                     checkpoint: str | int = "none", flash: bool = True, element_bytes: int = 2, tp: int = 1,
                     sequence_parallel: bool = False, dropout: bool | None = None,
                     outside_layers: bool = True) -> dict[str, float]:
    """Activation bytes kept for the backward pass of one micro-batch, by Korthikanti et al.'s accounting.

    Returns ``{"per_layer": ..., "layers": ..., "outside_layers": ..., "total": ...}`` where ``per_layer``
    is a layer without recomputation (:func:`activation_terms`) and ``layers`` all L layers under
    ``checkpoint``: ``"none"``; ``"selective"`` (the attention core recomputed: the s x s terms and the
    log-sum-exp go); ``"blocks"`` (every block recomputed: each keeps only its input, ``element_bytes`` s b h,
    split by ``tp`` only with sequence parallelism); an int k (every k-th block recomputed, as
    fpsim.nn.GPTConfig). ``outside_layers``: add the embedding dropout mask, final-norm and output-layer
    inputs and the FP32 logits (section 4.3). The one layer being recomputed during the backward pass is a
    transient workspace and is not counted, as in the paper.

    Examples
    --------
    GPT-3 175B with 8-way tensor parallelism, sequence parallelism and selective recomputation keeps
    s b h L 34 / t bytes (Korthikanti's Table 2):

    >>> r = activation_bytes("gpt3-175b", checkpoint="selective", flash=False, tp=8, sequence_parallel=True,
    ...                      outside_layers=False)
    >>> r["layers"] == 2048 * 12288 * 96 * 34 / 8
    True
    """
    m = get_model(model)
    b = check_int(micro_batch, "micro_batch", lo=1)
    s = m.seq_len if seq_len is None else check_int(seq_len, "seq_len", lo=1)
    ck = _parse_checkpoint(checkpoint)
    fl = check_bool(flash, "flash")
    sp = check_bool(sequence_parallel, "sequence_parallel")
    t = check_int(tp, "tp", lo=1)
    dr = m.dropout if dropout is None else check_bool(dropout, "dropout")
    e = check_int(element_bytes, "element_bytes", lo=1)
    full = activation_terms(m, micro_batch=b, seq_len=s, element_bytes=e, flash=fl, tp=t, sequence_parallel=sp,
                            dropout=dr)
    per_layer = float(sum(full.values()))
    kept_input = e * s * b * m.n_embd / (t if sp else 1)
    L = m.n_layer
    if ck == "none":
        layers = L * per_layer
    elif ck == "selective":
        drop = ("softmax", "softmax.dropout_mask", "softmax.dropout", "softmax.lse")
        layers = L * float(sum(v for k, v in full.items() if k not in drop))
    elif ck == "blocks":
        layers = L * kept_input
    else:
        assert isinstance(ck, int)
        n_ck = len(range(0, L, ck))  # blocks 0, k, 2k, ... are recomputed
        layers = n_ck * kept_input + (L - n_ck) * per_layer
    outside = _outside_layers(m, b, s, e, t, dr) if check_bool(outside_layers, "outside_layers") else 0.0
    return {"per_layer": per_layer, "layers": float(layers), "outside_layers": float(outside),
            "total": float(layers + outside)}


# -- the plan ---------------------------------------------------------------------------------------


def _as_count(value: object, what: str) -> int:
    v = check_real(value, what, lo=1.0)
    if v != math.floor(v):
        raise ValueError(f"{what} must be a whole number, got {value!r}")
    return int(v)


def _share(n: int, parts: int) -> int:
    """Elements per rank when n elements are partitioned over ``parts`` ranks (the last rank padded)."""
    return -(-n // parts)


@ieee_mode
@dataclass(frozen=True)
class MemoryPlan:
    """What :func:`memory` computes. Byte counts are integers (decimal units only in the printed table).

    ``per_device``: bytes one device holds, keyed by :data:`MEMORY_KEYS` (``"activations"`` is 0 when the
    model's shape is unknown or ``activations=False``; ``activations_included`` says which).
    ``bytes_per_param``: model-state bytes per parameter (of ``n_params``) before partitioning; for QLoRA
    the adapters' bytes are spread over the base parameters too. ``activation_detail``: the terms of
    :func:`activation_bytes`. ``notes``: what the numbers assume.
    """

    model: str
    n_params: int
    trainable_params: int
    recipe: str
    optimizer: str
    dp: int
    zero: int
    tp: int
    checkpoint: str | int
    flash: bool
    micro_batch: int
    seq_len: int | None
    activations_included: bool
    bytes_per_param: Mapping[str, float]
    per_device: Mapping[str, int]
    activation_detail: Mapping[str, float]
    notes: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (the keys ``fpsim plan --json`` prints; docs/planner.md lists them)."""
        return {
            "model": self.model, "n_params": self.n_params, "trainable_params": self.trainable_params,
            "recipe": self.recipe, "optimizer": self.optimizer, "dp": self.dp, "zero": self.zero,
            "tp": self.tp, "checkpoint": self.checkpoint, "flash": self.flash, "micro_batch": self.micro_batch,
            "seq_len": self.seq_len, "activations_included": self.activations_included,
            "bytes_per_param": dict(self.bytes_per_param), "per_device": dict(self.per_device),
            "activation_detail": dict(self.activation_detail), "notes": list(self.notes),
        }

    def to_markdown(self, unit: str = "GB") -> str:
        """A Markdown table of bytes per parameter and per device (``unit``: GB = 1e9 bytes, or GiB, MB, MiB)."""
        scale = _unit(unit)
        head = (f"{self.model}: {self.n_params:,} parameters, recipe {self.recipe}, optimizer {self.optimizer}, "
                f"dp={self.dp}, ZeRO-{self.zero}, tp={self.tp}, checkpoint={self.checkpoint}, "
                f"flash={'on' if self.flash else 'off'}, micro-batch {self.micro_batch}"
                + (f", sequence {self.seq_len}" if self.seq_len else ""))
        rows = [head, "", f"| | bytes/param | per device ({unit}) |", "|---|---:|---:|"]
        for k in MEMORY_KEYS:
            bpp = self.bytes_per_param.get(k)
            per = self.per_device[k]
            cell = f"{per / scale:.4g}"
            if k == "activations" and not self.activations_included:
                cell = "n/a"
            rows.append(f"| {k} | {'' if bpp is None else f'{bpp:.4g}'} | {cell} |")
        return "\n".join(rows)

    def __str__(self) -> str:
        return self.to_markdown()


_UNITS = {"b": 1.0, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "kib": 2.0**10, "mib": 2.0**20,
          "gib": 2.0**30, "tib": 2.0**40}


def _unit(unit: str) -> float:
    key = parse_name(unit, tuple(_UNITS), "unit")
    return _UNITS[key]


@ieee_mode
def memory(n_params: float | None = None, *, model: str | ModelSpec | Any = None, recipe: str | Recipe = "bf16-mixed",
           optimizer: str = "adamw", dp: int = 1, zero: int = 0, checkpoint: str | int = "none",
           flash: bool = True, micro_batch: int = 1, seq_len: int | None = None, activations: bool = True,
           tp: int = 1, sequence_parallel: bool = False, dropout: bool | None = None,
           lora_rank: int = 64) -> MemoryPlan:
    """Bytes per device for training a model: weights, gradients, master copy, optimizer states, activations.

    Parameters
    ----------
    n_params
        Number of parameters (overrides the count from ``model``'s shape); needed when no model is given.
    model
        A name (:func:`fpsim.plan.model_names`: ``gpt3-175b``, ``llama3-8b``, ``llama3-70b``, ``demo``), a
        :class:`ModelSpec` or an ``fpsim.nn.GPTConfig``. Without a shape, activations are not computed.
    recipe
        Any fpsim.amp policy name (``fp32``, ``bf16-mixed``, ``fp16-mixed``, ``bf16-pure-sr``, ``fp8-hybrid``,
        ...: what that policy stores), or a planner-only recipe: ``bf16-sr-bf16-states`` (pure BF16 with
        BF16 Adam moments), ``fp8-bf16-master`` (FP8 weight copy, BF16 master), ``qlora``
        (:func:`recipe_names`; :func:`get_recipe` says what each stores; ``bf16-sr`` and ``fp8`` are
        accepted as the old names of the first two).
    optimizer
        ``adamw``/``adam`` (2 states), ``sgd`` (momentum: 1 state, as fpsim.amp.SGD), ``sgd-no-momentum`` (0).
    dp, zero
        Data-parallel degree N_d and ZeRO stage: 1 partitions master copy and optimizer states over the N_d
        ranks, 2 also the gradients, 3 also the weights (Rajbhandari et al.).
    checkpoint, flash, micro_batch, seq_len, tp, sequence_parallel, dropout
        Activation accounting (:func:`activation_bytes`); ``tp`` also divides the model states (Megatron
        tensor parallelism; replicated norms and biases ignored).
    activations
        Whether to count activations at all.
    lora_rank
        Rank of the LoRA adapters (``recipe="qlora"`` only; QLoRA used 64 on every block linear layer).

    Examples
    --------
    ZeRO's example (section 5.1 / Figure 1): 7.5B parameters, mixed-precision Adam, 64-way data parallelism.

    >>> for stage in range(4):
    ...     p = memory(7.5e9, recipe="fp16-mixed", dp=64, zero=stage)
    ...     print(stage, p.per_device["total"] / 1e9)
    0 120.0
    1 31.40625
    2 16.640625
    3 1.875
    """
    r = get_recipe(recipe)
    opt = parse_name(optimizer, tuple(OPTIMIZERS), "optimizer")
    nd = check_int(dp, "dp", lo=1)
    stage = check_int(zero, "zero", lo=0, hi=3)
    t = check_int(tp, "tp", lo=1)
    ck = _parse_checkpoint(checkpoint)
    fl = check_bool(flash, "flash")
    acts = check_bool(activations, "activations")
    mb = check_int(micro_batch, "micro_batch", lo=1)
    sl = None if seq_len is None else check_int(seq_len, "seq_len", lo=1)
    spec = None if model is None else get_model(model)
    if n_params is None and spec is None:
        raise ValueError("memory() needs n_params or model= (a name, a ModelSpec or a GPTConfig)")
    n = spec.param_count() if n_params is None and spec is not None else _as_count(n_params, "n_params")
    notes: list[str] = []
    nstate = OPTIMIZERS[opt]

    # Model states, in parameters of each kind held per device, then bytes.
    if r.frozen:
        if spec is None:
            raise ValueError(f"recipe {r.name!r} needs model= (the LoRA adapters and the NF4 part depend on "
                             "the shape)")
        assert r.adapter is not None
        quant = min(spec.block_linear_params(), n)
        other = n - quant  # embeddings, norms, output layer: BF16, frozen
        lora = spec.lora_params(check_int(lora_rank, "lora_rank", lo=1))
        aw, ag, am, ast = r.adapter
        w_bytes = quant * r.weights + other * 2.0 + lora * aw
        states = {"weights": w_bytes, "grads": lora * ag, "master": lora * am, "optimizer": lora * ast * nstate}
        trainable = lora
        notes.append(f"QLoRA: {quant:,} block linear weights in NF4 ({r.weights * 8:.3f} bits each), {other:,} "
                     f"other parameters in BF16, {lora:,} LoRA parameters (rank {lora_rank}) trained")
    else:
        states = {"weights": n * r.weights, "grads": n * r.grads, "master": n * r.master,
                  "optimizer": n * r.state * nstate}
        trainable = n
    bpp = {k: v / n for k, v in states.items()}
    bpp["total"] = sum(bpp.values())
    parts = {"weights": 3, "grads": 2, "master": 1, "optimizer": 1}  # the ZeRO stage that partitions each
    per: dict[str, int] = {}
    for k, total_bytes in states.items():
        div = t * (nd if stage >= parts[k] else 1)
        per[k] = math.ceil(total_bytes / div)
    if stage and nd == 1:
        notes.append("ZeRO with dp=1 partitions nothing")

    # Activations.
    detail: dict[str, float] = {}
    included = False
    if acts and spec is not None:
        detail = activation_bytes(spec, micro_batch=mb, seq_len=sl, checkpoint=ck, flash=fl,
                                  element_bytes=r.activations, tp=t, sequence_parallel=sequence_parallel,
                                  dropout=dropout)
        per["activations"] = math.ceil(detail["total"])
        included = True
    else:
        per["activations"] = 0
        if acts:
            notes.append("activations not counted: no model shape (give model=)")
    per["total"] = sum(per[k] for k in MEMORY_KEYS[:-1])
    notes.append("not counted: temporary buffers, communication buckets, fragmentation, CUDA context")
    return MemoryPlan(
        model=spec.name if spec is not None else "custom", n_params=n, trainable_params=trainable, recipe=r.name,
        optimizer=opt, dp=nd, zero=stage, tp=t, checkpoint=ck, flash=fl, micro_batch=mb,
        seq_len=(sl if sl is not None else spec.seq_len) if spec is not None else sl, activations_included=included,
        bytes_per_param=MappingProxyType(bpp), per_device=MappingProxyType(per),
        activation_detail=MappingProxyType(detail), notes=tuple(notes))


@ieee_mode
def plot_memory(plans: Sequence[MemoryPlan] | Mapping[str, MemoryPlan], *, ax: Any = None, unit: str = "GB",
                capacity: float | None = None) -> Any:
    """A stacked bar per plan: weights, grads, master, optimizer, activations per device.

    ``plans``: a sequence (labels made from each plan's model, recipe and ZeRO stage) or a mapping
    label -> plan. ``capacity``: draw a horizontal line at this many ``unit`` (a device's memory).
    Returns the matplotlib Axes (matplotlib is imported here, only when plotting).
    """
    items = list(plans.items()) if isinstance(plans, Mapping) else [(None, p) for p in plans]
    bad = [p for _, p in items if not isinstance(p, MemoryPlan)]
    if not items or bad:
        raise TypeError(f"plot_memory needs one or more MemoryPlan objects, got {bad[0] if bad else 'none'!r}")
    items = [(f"{p.model}\n{p.recipe}\nZeRO-{p.zero}" if lab is None else str(lab), p) for lab, p in items]
    import matplotlib.pyplot as plt

    scale = _unit(unit)
    if ax is None:
        _, ax = plt.subplots(figsize=(max(4.0, 1.1 * len(items) + 2), 4.0), layout="constrained")
    x = list(range(len(items)))
    bottom = [0.0] * len(items)
    for k in MEMORY_KEYS[:-1]:
        vals = [p.per_device[k] / scale for _, p in items]
        ax.bar(x, vals, bottom=bottom, label=k)
        bottom = [b + v for b, v in zip(bottom, vals)]
    if capacity is not None:
        ax.axhline(check_real(capacity, "capacity", lo=0.0), color="k", ls="--", lw=1, label="device memory")
    ax.set_xticks(x, [lab for lab, _ in items], fontsize=8)
    ax.set_ylabel(f"{unit} per device")
    ax.legend(fontsize=8)
    return ax
