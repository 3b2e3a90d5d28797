"""Fine-tuning in low precision: full fine-tuning vs LoRA vs QLoRA on the tiny GPT, measured side by side.

:func:`finetune_comparison` pretrains the model in FP32 on one task (``sort``), then fine-tunes that
model on a second task with each method, for several seeds. The default second task is the same skill
with a new output convention (``sort`` with every answer symbol shifted by 3 mod ``n_symbols``,
:class:`ShiftedTask`): a pretrained model learns it in a few hundred steps, with LoRA too, whereas a new
skill (``reverse`` after ``sort``) needs the attention pattern rebuilt, and low-rank adapters learn it far
more slowly. The methods:

* ``full``: every weight trainable, FP32 weights, AdamW (two FP32 moments per weight);
* ``lora_bf16`` (and ``lora_fp16``, ``lora_int8``): the base stored in BF16 (FP16; int8 per output
  channel with an FP32 scale each, symmetric, through :func:`fpsim.quant.fake_quantize`), frozen; FP32
  LoRA adapters (``r``, ``alpha``) on every block's qkv, attention projection and both MLP GEMMs;
* ``qlora_nf4``: the linear weights stored in NF4 with double quantization (:class:`fpsim.quant.NF4Tensor`,
  bitsandbytes' algorithm), everything else (embeddings, LayerNorms, biases) in BF16, as QLoRA keeps it;
  FP32 adapters.

The GEMMs run in FP32 (:data:`fpsim.nn.FULL`) on the dequantized base, so the comparison isolates what
the *storage* of the base costs; a policy can be passed as ``prec`` to change that. Bytes are measured by
adding the ``nbytes`` of every array held for training: base storage (codes, absmax and double-quant
constants, scales), trainable weights, their gradients and the AdamW moments.

>>> s = FinetuneSettings(pretrain_steps=2, finetune_steps=2, n_embd=16, n_layer=1, batch_size=4)
>>> r = finetune_comparison(s, seeds=(0,), methods=("full", "qlora_nf4"))
>>> sorted(r["methods"]), r["methods"]["qlora_nf4"]["trainable"] < r["methods"]["full"]["trainable"]
(['full', 'qlora_nf4'], True)
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .._checks import check_int
from .._fpenv import ieee_mode
from .._names import parse_name
from ..amp import AdamW
from ..nn import FULL, GPTConfig, Precision, gpt_backward, gpt_forward, init_params
from ..nn.lora import LORA_SITES, LoRAPrecision, lora_init
from ..quant import NF4Tensor, fake_quantize
from ..rounding import round as fround
from ._threads import blas_threads
from .data import SequenceTask, Task, get_task

__all__ = ["FINETUNE_METHODS", "FinetuneSettings", "ShiftedTask", "finetune", "finetune_comparison", "pretrain",
           "quantize_base"]

#: The methods :func:`finetune` knows.
FINETUNE_METHODS = ("full", "lora_bf16", "lora_fp16", "lora_int8", "qlora_nf4")


@ieee_mode
class ShiftedTask(Task):
    """A sequence task whose answer is written in a shifted alphabet: every answer symbol ``a`` becomes
    ``(a + shift) mod n_symbols`` (the prompt and the separator are unchanged).

    The skill (which input symbol goes where) is the base task's; only the output convention is new,
    which is what fine-tuning usually teaches. ``shift = 0`` is the base task itself, batch for batch.

    Parameters
    ----------
    base : SequenceTask
        ``copy``, ``reverse`` or ``sort`` (:func:`fpsim.train.get_task`).
    shift : int
        The shift, ``0 <= shift < base.n_symbols``.

    Examples
    --------
    >>> import numpy as np
    >>> t = ShiftedTask(get_task("sort", n_symbols=5, length=3), 2)
    >>> x, y = t.batch(np.random.default_rng(0), 1)
    >>> x.tolist(), y.tolist()                     # prompt 4 3 2, sorted 2 3 4, shifted by 2 mod 5: 4 0 1
    ([[4, 3, 2, 5, 4, 0]], [[-1, -1, -1, 4, 0, 1]])
    """

    def __init__(self, base: SequenceTask, shift: int) -> None:
        if not isinstance(base, SequenceTask):
            raise TypeError(f"base must be a SequenceTask (copy, reverse or sort), got {type(base).__name__}")
        n = base.n_symbols
        self.base = base
        self.shift = check_int(shift, "shift", lo=0, hi=n - 1)
        self.name = f"{base.name}+{self.shift}"
        self.vocab_size, self.seq_len = base.vocab_size, base.seq_len

    def batch(self, rng: np.random.Generator, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        x, y = self.base.batch(rng, batch_size)
        L, n = self.base.length, self.base.n_symbols
        x, y = x.copy(), y.copy()
        x[:, L + 1:] = (x[:, L + 1:] + self.shift) % n       # the answer fed back (after the separator)
        y[:, L:] = (y[:, L:] + self.shift) % n               # the answer predicted
        return x, y

    def describe(self) -> dict[str, Any]:
        return {**self.base.describe(), "name": self.name, "shift": self.shift}


@ieee_mode
@dataclass(frozen=True)
class FinetuneSettings:
    """Tasks, model and hyper-parameters of the comparison (tiny: the notebook runs 3 seeds in a minute or two).

    The fine-tuning task is ``finetune_task`` with its answers shifted by ``finetune_shift``
    (:class:`ShiftedTask`; 0: unshifted). LoRA has its own learning rate (``lr_lora``, higher than full
    fine-tuning's, as LoRA practice uses), rank ``r`` and ``alpha`` (the adapter term is scaled by
    ``alpha / r``); the defaults come from a sweep on a seed the comparison does not use (notebook 15).
    """

    pretrain_task: str = "sort"
    finetune_task: str = "sort"
    finetune_shift: int = 3
    task_kwargs: dict[str, Any] = field(default_factory=lambda: {"n_symbols": 8, "length": 6})
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 32
    pretrain_steps: int = 300
    finetune_steps: int = 200
    batch_size: int = 32
    lr_pretrain: float = 3e-3
    lr_full: float = 3e-3
    lr_lora: float = 1e-2
    r: int = 8
    alpha: float = 16.0
    eval_batches: int = 4

    def model(self) -> GPTConfig:
        t = get_task(self.pretrain_task, **self.task_kwargs)
        return GPTConfig(vocab_size=t.vocab_size, block_size=t.seq_len, n_layer=self.n_layer,
                         n_head=self.n_head, n_embd=self.n_embd)

    def tasks(self) -> tuple[Task, Task]:
        """(the pretraining task, the fine-tuning task).

        >>> [t.name for t in FinetuneSettings().tasks()]
        ['sort', 'sort+3']
        """
        ft = get_task(self.finetune_task, **self.task_kwargs)
        if self.finetune_shift:
            if not isinstance(ft, SequenceTask):
                raise ValueError(f"finetune_shift needs a copy, reverse or sort task, got {self.finetune_task!r}")
            ft = ShiftedTask(ft, self.finetune_shift)
        return get_task(self.pretrain_task, **self.task_kwargs), ft


def _batch(task: Any, seed: int, step: int, b: int) -> tuple[np.ndarray, np.ndarray]:
    x, y = task.batch(np.random.default_rng((seed, step)), b)
    return x, y


def _eval(params: dict[str, np.ndarray], cfg: GPTConfig, task: Any, s: FinetuneSettings,
          prec: Precision) -> float:
    losses = []
    for i in range(s.eval_batches):
        x, y = _batch(task, 10_000_019, i, 64)                  # fixed held-out batches, every method
        if isinstance(prec, LoRAPrecision):
            prec.zero_grad()
        _, loss, _ = gpt_forward(params, cfg, x, y, prec=prec)
        losses.append(float(loss))  # type: ignore[arg-type]
    return float(np.mean(losses))


@ieee_mode
def pretrain(s: FinetuneSettings, seed: int = 0) -> dict[str, np.ndarray]:
    """The FP32 base model: ``s.pretrain_steps`` of AdamW on ``s.pretrain_task``."""
    cfg = s.model()
    task = s.tasks()[0]
    params = init_params(cfg, seed=seed)
    opt = AdamW(lr=s.lr_pretrain)
    for step in range(s.pretrain_steps):
        x, y = _batch(task, seed, step, s.batch_size)
        _, _, cache = gpt_forward(params, cfg, x, y, prec=FULL)
        opt.step(params, gpt_backward(1.0, cache))
    return params


def _linear_keys(cfg: GPTConfig) -> list[str]:
    return [f"h{i}.{site}.w" for i in range(cfg.n_layer) for site in LORA_SITES]


@ieee_mode
def quantize_base(params: dict[str, np.ndarray], cfg: GPTConfig, storage: str
                  ) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """The base as ``storage`` keeps it: (the float32 values the forward pass sees, bytes per array).

    ``storage``: ``"bf16"``, ``"fp16"``, ``"int8"`` (linear weights int8 per output channel, the rest
    BF16) or ``"nf4"`` (linear weights NF4 + double quantization, the rest BF16).
    """
    storage = parse_name(storage, ("bf16", "fp16", "int8", "nf4"), "base storage")
    lin = set(_linear_keys(cfg))
    vals: dict[str, np.ndarray] = {}
    nbytes: dict[str, int] = {}
    for k, w in params.items():
        if storage in ("int8", "nf4") and k in lin:
            if storage == "nf4":
                t = NF4Tensor.quantize(w, 64, double_quant=True)
                vals[k], nbytes[k] = t.dequantize(), t.nbytes
            else:
                scale = np.maximum(np.abs(w).max(axis=0) / np.float32(127), np.float32(1e-12)).astype(np.float32)
                vals[k] = np.asarray(fake_quantize(w, scale, np.zeros(w.shape[1], np.int32), -127, 127, axis=1),
                                     np.float32)
                nbytes[k] = w.size + scale.nbytes              # int8 codes + an FP32 scale per channel
        else:
            fmt = "fp16" if storage == "fp16" else "bf16"
            vals[k] = np.asarray(fround(w, fmt), np.float32)
            nbytes[k] = 2 * w.size
    return vals, nbytes


@ieee_mode
def finetune(base: dict[str, np.ndarray], s: FinetuneSettings, method: str, seed: int = 0, *,
             prec: Precision = FULL) -> dict[str, Any]:
    """Fine-tune the pretrained ``base`` on the fine-tuning task (:meth:`FinetuneSettings.tasks`) with
    ``method`` (see :data:`FINETUNE_METHODS`).

    Returns the loss curve, the held-out loss on both tasks before and after, the trainable parameter
    count and the measured bytes (``base``, ``trainable``, ``grads``, ``optimizer``, ``total``).
    """
    method = parse_name(method, FINETUNE_METHODS, "fine-tuning method")
    cfg = s.model()
    old, task = s.tasks()
    rng = np.random.default_rng((seed, 77))
    t0 = time.perf_counter()
    curve: list[float] = []
    if method == "full":
        params = {k: v.copy() for k, v in base.items()}
        opt = AdamW(lr=s.lr_full)
        before = _eval(params, cfg, task, s, prec)
        for step in range(s.finetune_steps):
            x, y = _batch(task, seed + 1000, step, s.batch_size)
            _, loss, cache = gpt_forward(params, cfg, x, y, prec=prec)
            curve.append(float(loss))  # type: ignore[arg-type]
            g = gpt_backward(1.0, cache)
            opt.step(params, g)
        trainable = int(sum(v.size for v in params.values()))
        nb = {"base": 0, "trainable": int(sum(v.nbytes for v in params.values())),
              "grads": int(sum(v.nbytes for v in g.values())),
              "optimizer": int(sum(v.nbytes for v in opt.state.values()))}
        after, forgot = _eval(params, cfg, task, s, prec), _eval(params, cfg, old, s, prec)
    else:
        storage = method.split("_")[1]
        vals, base_bytes = quantize_base(base, cfg, storage)
        adapters = {}
        for k in _linear_keys(cfg):
            A, B = lora_init(vals[k].shape[0], vals[k].shape[1], s.r, rng=rng)
            adapters[k[:-2]] = (A, B)
        lp = LoRAPrecision(prec, adapters, scale=s.alpha / s.r)
        flat = {f"{site}.{n}": ab[i] for site, ab in adapters.items() for i, n in enumerate("AB")}
        opt = AdamW(lr=s.lr_lora)
        before = _eval(vals, cfg, task, s, lp)
        for step in range(s.finetune_steps):
            x, y = _batch(task, seed + 1000, step, s.batch_size)
            lp.zero_grad()
            _, loss, cache = gpt_forward(vals, cfg, x, y, prec=lp)
            curve.append(float(loss))  # type: ignore[arg-type]
            gpt_backward(1.0, cache)
            g = {f"{site}.{n}": ab[i] for site, ab in lp.grads.items() for i, n in enumerate("AB")}
            opt.step(flat, g)                                  # updates the adapter arrays in place
        trainable = int(sum(v.size for v in flat.values()))
        nb = {"base": int(sum(base_bytes.values())), "trainable": int(sum(v.nbytes for v in flat.values())),
              "grads": int(sum(v.nbytes for v in g.values())),
              "optimizer": int(sum(v.nbytes for v in opt.state.values()))}
        after, forgot = _eval(vals, cfg, task, s, lp), _eval(vals, cfg, old, s, lp)
    nb["total"] = int(sum(nb.values()))
    return {"method": method, "seed": seed, "curve": curve, "eval_before": before, "eval_after": after,
            "eval_pretrain_task_after": forgot, "trainable": trainable, "bytes": nb,
            "seconds": time.perf_counter() - t0}


@ieee_mode
def finetune_comparison(s: FinetuneSettings | None = None, seeds: Sequence[int] = (0, 1, 2),
                        methods: Sequence[str] = ("full", "lora_bf16", "qlora_nf4"), *,
                        threads: int = 1) -> dict[str, Any]:
    """Pretrain once per seed, fine-tune with every method; per method the mean and spread over seeds.

    ``threads``: BLAS threads for other BLAS work during the runs; the GEMMs of every run are single-threaded
    whatever it is (``fpsim/_blas.py``), so no result depends on it.

    Returns ``{"settings", "runs": [per run dicts], "methods": {method: summary}}``; a summary holds
    ``eval_after`` (mean), ``eval_after_min``/``_max``/``_std`` over seeds, ``eval_before``,
    ``eval_pretrain_task_after``, ``trainable`` and ``bytes`` (identical across seeds).
    """
    s = FinetuneSettings() if s is None else s
    if not isinstance(s, FinetuneSettings):
        raise TypeError(f"settings must be a FinetuneSettings, got {type(s).__name__}")
    methods = [parse_name(m, FINETUNE_METHODS, "fine-tuning method") for m in methods]
    seeds = [int(x) for x in seeds]
    if not seeds or not methods:
        raise ValueError("finetune_comparison needs at least one seed and one method")
    runs = []
    pre_losses = []
    with blas_threads(threads):
        for seed in seeds:
            base = pretrain(s, seed)
            pre_losses.append(_eval(base, s.model(), s.tasks()[0], s, FULL))
            for m in methods:
                runs.append(finetune(base, s, m, seed))
    out: dict[str, Any] = {}
    for m in methods:
        rs = [r for r in runs if r["method"] == m]
        ev = np.array([r["eval_after"] for r in rs])
        out[m] = {"eval_after": float(ev.mean()), "eval_after_min": float(ev.min()),
                  "eval_after_max": float(ev.max()), "eval_after_std": float(ev.std(ddof=1)) if ev.size > 1 else 0.0,
                  "eval_before": float(np.mean([r["eval_before"] for r in rs])),
                  "eval_pretrain_task_after": float(np.mean([r["eval_pretrain_task_after"] for r in rs])),
                  "trainable": rs[0]["trainable"], "bytes": rs[0]["bytes"],
                  "seconds": float(np.mean([r["seconds"] for r in rs]))}
    return {"settings": asdict(s), "seeds": seeds, "pretrain_task_loss": pre_losses, "runs": runs,
            "methods": out}
