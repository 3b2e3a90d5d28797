"""A small GPT (pre-LayerNorm, GELU MLP, causal attention, tied embeddings) built from the layers.

Parameters live in a plain ordered ``dict[str, numpy.ndarray]``; :func:`gpt_forward` returns the logits,
the loss and a cache, :func:`gpt_backward` the gradients as a dict with the same keys.

>>> import numpy as np
>>> from fpsim.nn import GPTConfig, init_params, gpt_forward, gpt_backward
>>> cfg = GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16)
>>> params = init_params(cfg, seed=0)
>>> idx = np.zeros((2, 8), dtype=np.int64)
>>> logits, loss, cache = gpt_forward(params, cfg, idx, idx)
>>> logits.shape, round(float(loss), 2)
((2, 8, 11), 2.25)
>>> sorted(gpt_backward(1.0, cache)) == sorted(params)
True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .._checks import check_bool, check_int, check_real
from .._fpenv import ieee_mode
from .._names import parse_name
from . import recompute as _recompute
from .attention import attention_backward, attention_forward
from .layers import (
    _check_ids,
    cross_entropy_backward,
    cross_entropy_forward,
    embedding_backward,
    embedding_forward,
    gelu_backward,
    gelu_forward,
    layernorm_backward,
    layernorm_forward,
    linear_backward,
    linear_forward,
)
from .precision import Precision, current_precision

__all__ = ["ATTENTION_KINDS", "CHECKPOINT_MODES", "GPTConfig", "activation_elements", "count_params", "gpt_backward",
           "gpt_forward", "init_params"]

#: Attention implementations a GPTConfig may name.
ATTENTION_KINDS: tuple[str, ...] = ("standard", "flash")
#: Named checkpointing modes (an int k >= 1 is also accepted: every k-th block).
CHECKPOINT_MODES: tuple[str, ...] = ("none", "blocks", "selective")


def _parse_checkpoint(value: object, n_layer: int) -> str | int:
    """``"none" | "blocks" | "selective"`` (one name rule) or an int k >= 1 (every k-th block)."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        k = int(value)
        if k < 1:
            raise ValueError(f"GPTConfig.checkpoint: an int means every k-th block and must be >= 1, got {k}")
        return k
    if isinstance(value, str):
        return parse_name(value, CHECKPOINT_MODES, "GPTConfig.checkpoint")
    raise TypeError(f"GPTConfig.checkpoint must be one of {', '.join(CHECKPOINT_MODES)} or an int k >= 1, "
                    f"got {type(value).__name__} {value!r}")


@ieee_mode
@dataclass(frozen=True)
class GPTConfig:
    """Shape of the model.

    ``vocab_size`` V, ``block_size`` (context length) T, ``n_layer`` blocks, ``n_head`` heads, ``n_embd``
    width C (divisible by ``n_head``). ``tie_weights``: the output projection is ``wte.T`` (GPT-2).
    ``init_std``: standard deviation of the normal initialisation (residual projections are further
    divided by sqrt(2 n_layer), as in GPT-2).
    ``attention``: ``"standard"`` (nanoGPT's full T x T path, the naive reference) or ``"flash"``
    (FlashAttention-2's tiled forward and recomputing backward).
    ``checkpoint``: activation checkpointing: ``"none"``, ``"blocks"`` (every block recomputed in the
    backward pass), ``"selective"`` (only the attention core, Korthikanti et al.) or an int k >= 1
    (every k-th block: blocks 0, k, 2k, ...). Gradients are bit-identical to ``"none"`` under every
    policy (see :mod:`fpsim.nn.recompute`).
    """

    vocab_size: int = 16
    block_size: int = 32
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    tie_weights: bool = True
    bias: bool = True
    init_std: float = 0.02
    ln_eps: float = 1e-5
    attention: str = "standard"
    checkpoint: str | int = "none"

    def __post_init__(self) -> None:
        # Stored as plain Python numbers: the config travels as JSON inside checkpoints.
        for f in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            v = check_int(getattr(self, f), f"GPTConfig.{f}")
            if v < 1:
                raise ValueError(f"GPTConfig.{f} must be a positive int, got {v!r}")
            object.__setattr__(self, f, v)
        if self.n_embd % self.n_head:
            raise ValueError(f"GPTConfig.n_embd={self.n_embd} must be divisible by n_head={self.n_head}")
        for f in ("tie_weights", "bias"):
            object.__setattr__(self, f, check_bool(getattr(self, f), f"GPTConfig.{f}"))
        object.__setattr__(self, "init_std", check_real(self.init_std, "GPTConfig.init_std", lo=0.0, lo_open=True))
        object.__setattr__(self, "ln_eps", check_real(self.ln_eps, "GPTConfig.ln_eps", lo=0.0))
        object.__setattr__(self, "attention", parse_name(self.attention, ATTENTION_KINDS, "GPTConfig.attention"))
        object.__setattr__(self, "checkpoint", _parse_checkpoint(self.checkpoint, self.n_layer))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _param_shapes(cfg: GPTConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every parameter of ``cfg``'s model, in :func:`init_params` order."""
    C, V, T = cfg.n_embd, cfg.vocab_size, cfg.block_size
    p: dict[str, tuple[int, ...]] = {"wte": (V, C), "wpe": (T, C)}
    for i in range(cfg.n_layer):
        h = f"h{i}"
        p.update({f"{h}.ln1.g": (C,), f"{h}.ln1.b": (C,), f"{h}.attn.qkv.w": (C, 3 * C),
                  f"{h}.attn.proj.w": (C, C), f"{h}.ln2.g": (C,), f"{h}.ln2.b": (C,),
                  f"{h}.mlp.fc.w": (C, 4 * C), f"{h}.mlp.proj.w": (4 * C, C)})
        if cfg.bias:
            p.update({f"{h}.attn.qkv.b": (3 * C,), f"{h}.attn.proj.b": (C,), f"{h}.mlp.fc.b": (4 * C,),
                      f"{h}.mlp.proj.b": (C,)})
    p.update({"lnf.g": (C,), "lnf.b": (C,)})
    if not cfg.tie_weights:
        p["lm_head.w"] = (C, V)
    return p


def _check_params(params: Any, cfg: GPTConfig, what: str = "params", *, finite: bool = False) -> None:
    """Refuse parameters that do not fit ``cfg``: missing or unknown names, wrong shapes, non-float
    dtypes (and, with ``finite=True``, inf or NaN values), each error naming the tensor."""
    if not isinstance(params, Mapping):
        raise TypeError(f"{what} must be a mapping of name -> array, got {type(params).__name__}")
    want = _param_shapes(cfg)
    missing, extra = [k for k in want if k not in params], sorted(str(k) for k in params if k not in want)
    if missing or extra:
        raise ValueError(f"{what}: names do not match the GPTConfig: missing {missing}, unexpected {extra}")
    for k, shape in want.items():
        v = params[k]
        dt = getattr(v, "dtype", None)
        if not isinstance(v, np.ndarray) or dt is None or dt.kind != "f":
            raise TypeError(f"{what}[{k!r}] must be a float NumPy array, got {type(v).__name__}"
                            f"{'' if dt is None else ' of dtype ' + str(dt)}")
        if isinstance(v, np.ma.MaskedArray):  # the mask would be dropped and the hidden values used
            raise TypeError(f"{what}[{k!r}]: masked arrays are not supported; pass .filled(value)")
        if v.shape != shape:
            raise ValueError(f"{what}[{k!r}] has shape {v.shape}; the GPTConfig needs {shape}")
        if finite and not np.isfinite(v).all():
            raise ValueError(f"{what}[{k!r}] holds inf or NaN values")


@ieee_mode
def init_params(cfg: GPTConfig, seed: int = 0, dtype: Any = np.float32) -> dict[str, np.ndarray]:
    """GPT-2 style initial parameters (normal(0, init_std), zero biases, unit LayerNorm gains)."""
    if not isinstance(cfg, GPTConfig):
        raise TypeError(f"cfg must be a GPTConfig, got {type(cfg).__name__}")
    if np.dtype(dtype).kind != "f":
        raise TypeError(f"dtype must be a float dtype, got {np.dtype(dtype)}")
    rng = np.random.default_rng(seed)
    C, V, T, L = cfg.n_embd, cfg.vocab_size, cfg.block_size, cfg.n_layer
    std = cfg.init_std
    proj_std = std / np.sqrt(2 * L)

    def normal(shape: tuple[int, ...], s: float) -> np.ndarray:
        return (rng.standard_normal(shape) * s).astype(dtype)

    p: dict[str, np.ndarray] = {"wte": normal((V, C), std), "wpe": normal((T, C), std)}
    for i in range(L):
        h = f"h{i}"
        p[f"{h}.ln1.g"] = np.ones(C, dtype)
        p[f"{h}.ln1.b"] = np.zeros(C, dtype)
        p[f"{h}.attn.qkv.w"] = normal((C, 3 * C), std)
        p[f"{h}.attn.proj.w"] = normal((C, C), proj_std)
        p[f"{h}.ln2.g"] = np.ones(C, dtype)
        p[f"{h}.ln2.b"] = np.zeros(C, dtype)
        p[f"{h}.mlp.fc.w"] = normal((C, 4 * C), std)
        p[f"{h}.mlp.proj.w"] = normal((4 * C, C), proj_std)
        if cfg.bias:
            p[f"{h}.attn.qkv.b"] = np.zeros(3 * C, dtype)
            p[f"{h}.attn.proj.b"] = np.zeros(C, dtype)
            p[f"{h}.mlp.fc.b"] = np.zeros(4 * C, dtype)
            p[f"{h}.mlp.proj.b"] = np.zeros(C, dtype)
    p["lnf.g"] = np.ones(C, dtype)
    p["lnf.b"] = np.zeros(C, dtype)
    if not cfg.tie_weights:
        p["lm_head.w"] = normal((C, V), std)
    return p


@ieee_mode
def count_params(params: dict[str, np.ndarray]) -> int:
    """Number of scalar parameters (tied weights counted once)."""
    return int(sum(v.size for v in params.values()))


@ieee_mode
def activation_elements(cfg: GPTConfig, T: int | None = None) -> int:
    """An *estimate* of the activation elements the backward pass keeps per token (sequence position).

    Kept as the estimate it always was; the measured figure is :func:`fpsim.train.measure_step`. On the
    demo model under fp32 this count (x 4 bytes) is 24% below the measured peak: it leaves out
    LayerNorm's x-hat and 1/std, GELU's tanh, the causal mask, the token ids and the loss's
    probabilities (see docs/memory.md).

    Counts the tensors cached for backward: per block two LayerNorm outputs (C each), qkv (3C), attention
    scores and probabilities (2 n_head T, averaged over causal positions: n_head T), attention output (C),
    MLP hidden before and after GELU (8C); plus the final LayerNorm output (C) and the logits (V).
    """
    T = cfg.block_size if T is None else T
    C, H = cfg.n_embd, cfg.n_head
    per_block = 2 * C + 3 * C + 2 * H * T + C + 8 * C
    return cfg.n_layer * per_block + C + cfg.vocab_size


def _get(p: dict[str, np.ndarray], k: str) -> np.ndarray | None:
    return p.get(k)


def _attention_impl(cfg: GPTConfig) -> tuple[Any, Any]:
    """(forward, backward) of the configured attention; both take and return what the standard pair does."""
    if cfg.attention == "standard":
        return attention_forward, attention_backward
    if cfg.attention == "flash":
        from .flash import flash_attention_backward, flash_attention_forward  # the tiled pair (default tiles)

        return flash_attention_forward, flash_attention_backward
    raise NotImplementedError(f"GPTConfig.attention={cfg.attention!r} is not implemented yet")


def _checkpointed(cfg: GPTConfig, i: int) -> bool:
    """Whether block ``i`` keeps only its input (``"blocks"``, or every k-th block: i % k == 0)."""
    ck = cfg.checkpoint
    if ck == "blocks":
        return True
    return isinstance(ck, int) and i % ck == 0


class _BlockCheckpoint:
    """A checkpointed block's cache: its input, the precision snapshot and what the re-run needs."""

    __slots__ = ("cfg", "i", "params", "prec", "state", "x")

    def __init__(self, x: np.ndarray, state: Any, params: dict[str, np.ndarray], cfg: GPTConfig, i: int,
                 prec: Precision) -> None:
        self.x, self.state, self.params, self.cfg, self.i, self.prec = x, state, params, cfg, i, prec


def _block_forward(params: dict[str, np.ndarray], cfg: GPTConfig, x: np.ndarray, i: int,
                   prec: Precision) -> tuple[np.ndarray, Any]:
    """Transformer block ``i``: x (B, T, C) -> x (B, T, C) and the block's cache (for :func:`_block_backward`).

    With ``cfg.checkpoint == "selective"`` (standard attention) the attention core keeps only q, k, v
    and is recomputed in the backward pass; flash attention keeps no T x T tensor in the first place.
    """
    h = f"h{i}"
    c: dict[str, Any] = {}
    attn_fwd, attn_bwd = _attention_impl(cfg)
    a, c["ln1"] = layernorm_forward(x, params[f"{h}.ln1.g"], params[f"{h}.ln1.b"], cfg.ln_eps)
    a = prec.act(a, f"{h}.ln1", "layernorm")
    selective = cfg.checkpoint == "selective" and attn_fwd is attention_forward
    kw: dict[str, Any] = {"recompute_core": True} if selective else {}
    a, c["attn"] = attn_fwd(
        a, params[f"{h}.attn.qkv.w"], _get(params, f"{h}.attn.qkv.b"), params[f"{h}.attn.proj.w"],
        _get(params, f"{h}.attn.proj.b"), cfg.n_head, prec=prec, site=f"{h}.attn", **kw)
    x = prec.act(x + a, f"{h}.res1", "residual")
    m, c["ln2"] = layernorm_forward(x, params[f"{h}.ln2.g"], params[f"{h}.ln2.b"], cfg.ln_eps)
    m = prec.act(m, f"{h}.ln2", "layernorm")
    m, c["fc"] = linear_forward(m, params[f"{h}.mlp.fc.w"], _get(params, f"{h}.mlp.fc.b"),
                                prec=prec, site=f"{h}.mlp.fc")                   # (B, T, 4C)
    m, c["gelu"] = gelu_forward(m)
    m = prec.act(m, f"{h}.gelu", "gelu")
    m, c["proj"] = linear_forward(m, params[f"{h}.mlp.proj.w"], _get(params, f"{h}.mlp.proj.b"),
                                  prec=prec, site=f"{h}.mlp.proj")               # (B, T, C)
    x = prec.act(x + m, f"{h}.res2", "residual")
    return x, (c, h, prec, attn_bwd)


def _block_backward(dx: np.ndarray, cache: Any, g: dict[str, np.ndarray],
                    live: dict[str, Any] | None = None) -> np.ndarray:
    """Gradient through one block: dx (B, T, C) -> dx (B, T, C); parameter gradients written into ``g``.

    A checkpointed block (:class:`_BlockCheckpoint`) first runs its forward again from the kept input,
    under the precision object's recomputation protocol (:mod:`fpsim.nn.recompute`), to rebuild the
    cache it dropped; ``live`` (what the backward pass still holds, for the memory ledger) then holds
    that transient cache in the checkpoint's place.
    """
    if isinstance(cache, _BlockCheckpoint):
        ck = cache
        with _recompute.replaying(ck.prec, ck.state, f"h{ck.i}"):
            _, cache = _block_forward(ck.params, ck.cfg, ck.x, ck.i, ck.prec)
        if live is not None:
            live[f"h{ck.i}"] = (ck, cache)
            _recompute._event(f"recompute h{ck.i}", live, ck.params)
    c, h, prec, attn_bwd = cache
    dx = prec.grad(dx, f"{h}.res2", "residual")
    dm, g[f"{h}.mlp.proj.w"], db = linear_backward(dx, c["proj"])
    if db is not None:
        g[f"{h}.mlp.proj.b"] = db
    dm = prec.grad(dm, f"{h}.gelu", "gelu")
    dm = gelu_backward(dm, c["gelu"])
    dm, g[f"{h}.mlp.fc.w"], db = linear_backward(dm, c["fc"])
    if db is not None:
        g[f"{h}.mlp.fc.b"] = db
    dm = prec.grad(dm, f"{h}.ln2", "layernorm")
    dm, g[f"{h}.ln2.g"], g[f"{h}.ln2.b"] = layernorm_backward(dm, c["ln2"])
    dx = dx + dm
    dx = prec.grad(dx, f"{h}.res1", "residual")
    ga = attn_bwd(dx, c["attn"])
    g[f"{h}.attn.qkv.w"], g[f"{h}.attn.proj.w"] = ga["w_qkv"], ga["w_proj"]
    if ga["b_qkv"] is not None:
        g[f"{h}.attn.qkv.b"], g[f"{h}.attn.proj.b"] = ga["b_qkv"], ga["b_proj"]
    da = prec.grad(ga["x"], f"{h}.ln1", "layernorm")
    da, g[f"{h}.ln1.g"], g[f"{h}.ln1.b"] = layernorm_backward(da, c["ln1"])
    out: np.ndarray = dx + da
    return out


@ieee_mode
def gpt_forward(params: dict[str, np.ndarray], cfg: GPTConfig, idx: np.ndarray, targets: np.ndarray | None = None,
                *, prec: Precision | None = None, ignore_index: int = -1,
                loss_normalizer: int | None = None) -> tuple[np.ndarray, np.ndarray | None, Any]:
    """Logits (B, T, V), the cross-entropy over non-ignored targets (or None), and the cache.

    idx (B, T) integer token ids in ``[0, vocab_size)``, B >= 1, 1 <= T <= block_size; targets (B, T)
    integer classes in ``[0, vocab_size)`` or ``ignore_index`` (default -1: not scored). The loss is the
    mean over the non-ignored targets, or their sum divided by ``loss_normalizer`` (see
    :func:`~fpsim.nn.layers.cross_entropy_forward`). Everything is checked before any work: ``TypeError``
    for wrong kinds (float ids, a params that is not a dict of float arrays), ``ValueError`` for values
    (ids out of range, shapes, names). ``prec=None``: the innermost ``fpsim.amp.autocast``'s precision,
    or :data:`~fpsim.nn.FULL` outside one (:func:`~fpsim.nn.precision.current_precision`).
    """
    prec = current_precision(prec)
    if not isinstance(cfg, GPTConfig):
        raise TypeError(f"cfg must be a GPTConfig, got {type(cfg).__name__}")
    if not isinstance(prec, Precision):
        raise TypeError(f"prec must implement fpsim.nn.Precision, got {type(prec).__name__}")
    _check_params(params, cfg)
    idx = _check_ids(idx, cfg.vocab_size, "idx")
    if idx.ndim != 2:
        raise ValueError(f"idx must be (B, T), got shape {idx.shape}")
    B, T = idx.shape
    if B < 1 or T < 1:
        raise ValueError(f"idx must hold at least one sequence of at least one token, got shape {idx.shape}")
    if T > cfg.block_size:
        raise ValueError(f"sequence length {T} exceeds block_size {cfg.block_size}")
    if targets is not None:
        ignore_index = check_int(ignore_index, "ignore_index")
        targets = _check_ids(targets, cfg.vocab_size, "targets", ignore_index=ignore_index)
        if targets.shape != idx.shape:
            raise ValueError(f"targets must have idx's shape {idx.shape}, got {targets.shape}")
    if loss_normalizer is not None:
        loss_normalizer = check_int(loss_normalizer, "loss_normalizer", lo=1)
    caches: dict[str, Any] = {}
    _recompute._phase(True, "forward")
    tok, caches["wte"] = embedding_forward(idx, params["wte"])                     # (B, T, C)
    pos = params["wpe"][:T]                                                        # (T, C)
    x = prec.act(tok + pos, "emb", "embedding")                                    # (B, T, C)
    for i in range(cfg.n_layer):
        if _checkpointed(cfg, i):  # keep the input and the precision snapshot; drop the block's cache
            ck = _BlockCheckpoint(x, _recompute.snapshot(prec), params, cfg, i, prec)
            x, _ = _block_forward(params, cfg, x, i, prec)                         # (B, T, C)
            caches[f"h{i}"] = ck
        else:
            x, caches[f"h{i}"] = _block_forward(params, cfg, x, i, prec)             # (B, T, C)
    x, caches["lnf"] = layernorm_forward(x, params["lnf.g"], params["lnf.b"], cfg.ln_eps)
    x = prec.act(x, "lnf", "layernorm")
    w_out = params["wte"].T if cfg.tie_weights else params["lm_head.w"]            # (C, V)
    logits, caches["lm_head"] = linear_forward(x, w_out, None, prec=prec, site="lm_head", kind="lm_head")
    loss = None
    if targets is not None:
        loss, caches["ce"] = cross_entropy_forward(logits, np.asarray(targets), ignore_index,
                                                  loss_normalizer)
        loss = prec.act(loss, "loss", "cross_entropy")
    cache = (caches, cfg, prec, T)
    if _recompute._tracing():
        _recompute._event("forward", dict(caches), params)
        _recompute._phase(False, "forward")
    return logits, loss, cache


@ieee_mode
def gpt_backward(dloss: float | np.ndarray, cache: Any) -> dict[str, np.ndarray]:
    """Gradients of ``dloss * loss`` with respect to every parameter (``dloss`` = loss scale, or 1)."""
    caches, cfg, prec, T = cache
    if "ce" not in caches:
        raise ValueError("gpt_backward needs a forward pass that was given targets")
    g: dict[str, np.ndarray] = {}
    # What the backward pass still holds, for the memory ledger: an entry goes once its backward ran.
    live: dict[str, Any] | None = dict(caches) if _recompute._tracing() else None
    _recompute._phase(True, "backward")
    dlogits = cross_entropy_backward(dloss, caches["ce"])                          # (B, T, V)
    dlogits = prec.grad(dlogits, "logits", "cross_entropy")
    dx, dw_out, _ = linear_backward(dlogits, caches["lm_head"])                    # (B, T, C), (C, V)
    dx = prec.grad(dx, "lnf", "layernorm")
    dx, g["lnf.g"], g["lnf.b"] = layernorm_backward(dx, caches["lnf"])
    if live is not None:
        for k in ("ce", "lm_head", "lnf"):
            live.pop(k, None)
        _recompute._event("freed head", live, {})
    for i in reversed(range(cfg.n_layer)):
        dx = _block_backward(dx, caches[f"h{i}"], g, live)                           # (B, T, C)
        if live is not None:
            live.pop(f"h{i}")
            _recompute._event(f"freed h{i}", live, {})
    _recompute._phase(False, "backward")
    dx = prec.grad(dx, "emb", "embedding")
    dwte = embedding_backward(dx, caches["wte"])                                   # (V, C)
    dwpe = np.zeros((cfg.block_size, dx.shape[-1]), dtype=dx.dtype)
    dwpe[:T] = dx.sum(axis=0)                                                      # (T, C)
    if cfg.tie_weights:
        dwte = dwte + dw_out.T
    else:
        g["lm_head.w"] = dw_out
    g["wte"], g["wpe"] = dwte, dwpe
    return g
