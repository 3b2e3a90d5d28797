"""Model shapes for the planner: a transformer given by its sizes, or a named published configuration.

A :class:`ModelSpec` holds what the memory and FLOP formulas need: layers L, width h, heads a (and
key/value heads for grouped-query attention), vocabulary V, sequence length s, MLP width, whether the
MLP is gated (SwiGLU) and whether dropout is used. Parameter counts are computed from the shape
(:meth:`ModelSpec.param_count`); the published count of each named model is kept beside it
(``published_params``) and the tests compare the two.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from .._checks import check_bool, check_int
from .._fpenv import ieee_mode
from .._names import norm_name, parse_name

__all__ = ["ModelSpec", "get_model", "model_names"]


@ieee_mode
@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer's shape, as the planner's formulas see it.

    ``n_layer`` L, ``n_embd`` h, ``n_head`` a, ``vocab_size`` V, ``seq_len`` s (the training context),
    ``n_kv_head`` (grouped-query attention; default ``n_head``), ``ffn_hidden`` (MLP width; default 4h),
    ``gated_mlp`` (SwiGLU: three MLP matrices instead of two), ``tied_embeddings`` (output projection =
    token embedding), ``learned_positions`` (a learned s x h position table, GPT-2/3), ``bias`` (biases in
    the linear layers and LayerNorms), ``dropout`` (dropout after attention softmax, attention and MLP:
    Korthikanti et al.'s activation formula assumes it). ``published_params``: the count the model's
    paper gives (None for a custom shape). ``source``: where the shape comes from.

    Examples
    --------
    >>> m = ModelSpec("tiny", n_layer=2, n_embd=64, n_head=4, vocab_size=16, seq_len=32)
    >>> m.param_count()
    103168
    """

    name: str
    n_layer: int
    n_embd: int
    n_head: int
    vocab_size: int
    seq_len: int
    n_kv_head: int | None = None
    ffn_hidden: int | None = None
    gated_mlp: bool = False
    tied_embeddings: bool = True
    learned_positions: bool = True
    bias: bool = True
    dropout: bool = False
    published_params: float | None = None
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise TypeError(f"ModelSpec.name must be a string, got {type(self.name).__name__}")
        for f in ("n_layer", "n_embd", "n_head", "vocab_size", "seq_len"):
            object.__setattr__(self, f, check_int(getattr(self, f), f"ModelSpec.{f}", lo=1))
        kv = self.n_head if self.n_kv_head is None else check_int(self.n_kv_head, "ModelSpec.n_kv_head", lo=1)
        ffn = 4 * self.n_embd if self.ffn_hidden is None else check_int(self.ffn_hidden, "ModelSpec.ffn_hidden",
                                                                          lo=1)
        object.__setattr__(self, "n_kv_head", kv)
        object.__setattr__(self, "ffn_hidden", ffn)
        if self.n_embd % self.n_head:
            raise ValueError(f"ModelSpec.n_embd={self.n_embd} must be divisible by n_head={self.n_head}")
        if self.n_head % kv:
            raise ValueError(f"ModelSpec.n_head={self.n_head} must be divisible by n_kv_head={kv}")
        for f in ("gated_mlp", "tied_embeddings", "learned_positions", "bias", "dropout"):
            object.__setattr__(self, f, check_bool(getattr(self, f), f"ModelSpec.{f}"))

    # -- derived sizes -------------------------------------------------------------------------------

    @property
    def head_dim(self) -> int:
        """h / a."""
        return self.n_embd // self.n_head

    @property
    def kv_dim(self) -> int:
        """Width of K (and of V): n_kv_head * head_dim (= h without grouped-query attention)."""
        return int(self.n_kv_head or self.n_head) * self.head_dim

    def linear_shapes(self) -> list[tuple[int, int]]:
        """(d_in, d_out) of every linear layer inside one block (the matrices LoRA adapts)."""
        h, kv, f = self.n_embd, self.kv_dim, int(self.ffn_hidden or 4 * self.n_embd)
        attn = [(h, h), (h, kv), (h, kv), (h, h)]  # q, k, v, output projection
        mlp = [(h, f), (h, f), (f, h)] if self.gated_mlp else [(h, f), (f, h)]
        return attn + mlp

    def block_linear_params(self) -> int:
        """Weights of the linear layers of all blocks (no biases): the part QLoRA stores in NF4."""
        return self.n_layer * sum(a * b for a, b in self.linear_shapes())

    def lora_params(self, rank: int) -> int:
        """Parameters of rank-``rank`` LoRA adapters on every block linear layer: r (d_in + d_out) each."""
        r = check_int(rank, "lora_rank", lo=1)
        return self.n_layer * sum(r * (a + b) for a, b in self.linear_shapes())

    def param_count(self) -> int:
        """Parameters of the model, counted from its shape.

        Per block: the linear weights (:meth:`linear_shapes`), two norms (gain, plus a bias when ``bias``),
        the linear biases when ``bias``; then token embedding V h, a learned position table s h when
        ``learned_positions``, the final norm, and an untied output projection V h.
        """
        h = self.n_embd
        norm = 2 * h if self.bias else h
        per_block = sum(a * b for a, b in self.linear_shapes()) + 2 * norm
        if self.bias:
            per_block += sum(b for _, b in self.linear_shapes())
        n = self.n_layer * per_block + self.vocab_size * h + norm
        if self.learned_positions:
            n += self.seq_len * h
        if not self.tied_embeddings:
            n += self.vocab_size * h
        return int(n)

    def with_seq_len(self, seq_len: int) -> ModelSpec:
        """The same model trained at another context length (a learned position table grows with it)."""
        return replace(self, seq_len=check_int(seq_len, "seq_len", lo=1))

    @classmethod
    def from_gpt_config(cls, cfg: Any, name: str = "gpt") -> ModelSpec:
        """The shape of an :class:`fpsim.nn.GPTConfig` (nanoGPT layout: GELU MLP 4h, no dropout)."""
        from ..nn import GPTConfig

        if not isinstance(cfg, GPTConfig):
            raise TypeError(f"from_gpt_config needs an fpsim.nn.GPTConfig, got {type(cfg).__name__}")
        return cls(name, n_layer=cfg.n_layer, n_embd=cfg.n_embd, n_head=cfg.n_head, vocab_size=cfg.vocab_size,
                   seq_len=cfg.block_size, tied_embeddings=cfg.tie_weights, bias=cfg.bias, dropout=False,
                   source="fpsim.nn.GPTConfig")


def _demo() -> ModelSpec:
    from ..train.demo import DemoSettings

    cfg = DemoSettings().train_config().model
    spec = ModelSpec.from_gpt_config(cfg, name="demo")
    return replace(spec, source="fpsim.train.demo.DemoSettings (the `fpsim demo` model)")


# Named configurations. Shapes from the models' papers; published_params as the papers state them.
_MODELS: dict[str, ModelSpec] = {
    "gpt3-175b": ModelSpec(
        "gpt3-175b", n_layer=96, n_embd=12288, n_head=96, vocab_size=50257, seq_len=2048, dropout=True,
        published_params=175e9,
        source="Brown et al. 2020 (arXiv 2005.14165) Table 2.1: 96 layers, d_model 12288, 96 heads, context "
               "2048; GPT-2 BPE vocabulary of 50257; dropout as in Korthikanti et al.'s formula"),
    "llama3-8b": ModelSpec(
        "llama3-8b", n_layer=32, n_embd=4096, n_head=32, n_kv_head=8, ffn_hidden=14336, vocab_size=128256,
        seq_len=8192, gated_mlp=True, tied_embeddings=False, learned_positions=False, bias=False,
        dropout=False, published_params=8.03e9,
        source="Llama 3 (Grattafiori et al. 2024, arXiv 2407.21783) Table 3 and the released config: 32 layers, "
               "width 4096, FFN 14336, 32 heads / 8 KV heads, vocabulary 128256, context 8192"),
    "llama3-70b": ModelSpec(
        "llama3-70b", n_layer=80, n_embd=8192, n_head=64, n_kv_head=8, ffn_hidden=28672, vocab_size=128256,
        seq_len=8192, gated_mlp=True, tied_embeddings=False, learned_positions=False, bias=False,
        dropout=False, published_params=70.6e9,
        source="Llama 3 (arXiv 2407.21783) Table 3 and the released config: 80 layers, width 8192, FFN 28672, "
               "64 heads / 8 KV heads, vocabulary 128256, context 8192"),
}
_LAZY = {"demo": _demo}


@ieee_mode
def model_names() -> list[str]:
    """Names :func:`get_model` (and ``fpsim plan --model``) accepts."""
    return [*_MODELS, *_LAZY]


@ieee_mode
def get_model(model: str | ModelSpec | Any) -> ModelSpec:
    """A :class:`ModelSpec` from a name (:func:`model_names`), a ModelSpec, or an ``fpsim.nn.GPTConfig``.

    Examples
    --------
    >>> m = get_model(" GPT3-175B ")
    >>> m.n_layer, m.n_embd, m.n_head
    (96, 12288, 96)
    >>> get_model("gpt4")
    Traceback (most recent call last):
    ...
    ValueError: unknown model 'gpt4'; valid: gpt3-175b, llama3-8b, llama3-70b, demo
    """
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, str):
        name = parse_name(model, model_names(), "model")
        return _MODELS[name] if name in _MODELS else _LAZY[name]()
    from ..nn import GPTConfig

    if isinstance(model, GPTConfig):
        return ModelSpec.from_gpt_config(model)
    norm_name(model, "model")  # raises the TypeError naming the value
    raise AssertionError("unreachable")  # pragma: no cover
