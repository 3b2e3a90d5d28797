"""The training loop: one policy, one model, one task; telemetry every step; checkpoints.

>>> from fpsim.train import TrainConfig, Trainer
>>> from fpsim.nn import GPTConfig
>>> cfg = TrainConfig(task="reverse", task_kwargs={"n_symbols": 5, "length": 3}, steps=3, batch_size=4,
...                   model=GPTConfig(vocab_size=6, block_size=6, n_layer=1, n_head=2, n_embd=8))
>>> tr = Trainer("fp16-mixed", cfg)
>>> h = tr.run()
>>> len(h["loss"]), h["loss_scale"][0]
(3, 65536.0)
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .._checks import check_int, check_real
from .._fpenv import ieee_mode
from .._names import parse_name
from ..amp import MasterWeights, Policy, get_policy, make_optimizer
from ..amp.runtime import HIST_HI, HIST_LO
from ..nn import GPTConfig, gpt_backward, gpt_forward, init_params
from ..nn.gpt import _check_params
from ._threads import single_threaded
from .data import Task, _check_task_kwargs, _parse_task_name, get_task

__all__ = ["History", "TrainConfig", "Trainer", "lr_at"]

_EVAL_SEED = 987_654_321


@ieee_mode
@dataclass(frozen=True)
class TrainConfig:
    """Everything that defines a run besides the policy.

    ``model=None`` (the default) means "sized for the task": :class:`~fpsim.nn.GPTConfig` with
    ``vocab_size`` and ``block_size`` taken from the task the trainer runs (``task.vocab_size``,
    ``task.seq_len``) and GPTConfig's defaults for the rest (2 layers, 4 heads, width 64), so
    ``Trainer("fp32", TrainConfig()).run()`` trains as it stands and a changed ``task`` or ``task_kwargs``
    keeps fitting (see :meth:`model_for`). A given ``model`` must match the task (``vocab_size``,
    ``block_size >= seq_len``); :meth:`Trainer.__init__` checks. Learning rate: linear warm-up for
    ``warmup`` steps, then cosine decay to ``lr * min_lr_frac`` at ``steps``. ``telemetry_every``: record
    per-tensor gradient statistics every k steps (0: never); ``histogram_every``: also log2 histograms
    every k steps (0: never).

    Every field is checked at construction (a ``TypeError`` for a wrong kind, a ``ValueError`` for a value
    out of range, each naming the field and the value); ``task`` and ``optimizer`` are parsed by the one
    name rule (``" Reverse"`` is ``"reverse"``, ``"AdamW"`` is ``"adamw"``) and stored canonical.

    ``micro_batches``: each step's batch is treated as one of this many micro-batches of a global batch
    (data parallelism or gradient accumulation): its summed loss is divided by the global number of
    target tokens, ``micro_batches`` times this batch's count, as DDP-style training does, so the
    gradients the backward pass produces (and casts) are that many times smaller: what makes FP16
    gradients underflow in real large-batch training. After unscaling, the optimizer receives the
    gradient multiplied back by ``micro_batches`` (the sum over the global batch, estimated from this
    micro-batch). With a power of two this round trip is exact in FP32, so an FP32 run is bit-identical
    to one with ``micro_batches=1``.

    ``fused``: the optimizer takes torch's fused step (:func:`fpsim.amp.fused_adamw_step` /
    :func:`fpsim.amp.fused_sgd_step`, ``torch.optim.AdamW(fused=True)`` on CPU): the scaled gradients
    (multiplied by ``micro_batches`` first, as an all-reduce sums them before the optimizer) go to the
    kernel with ``grad_scale`` (the loss scale, when the policy scales the loss) and ``found_inf`` (1.0 if any
    is inf/NaN), as torch's GradScaler hands them to a fused optimizer; the kernel divides by the scale and
    updates the FP32 master weights in one pass (the low-precision copy is rounded from the new master at
    its next use). Needs a policy with FP32 master weights and FP32 optimizer state; the per-step
    ``lost_update_fraction`` is then not measured (NaN).
    """

    task: str = "reverse"
    task_kwargs: Mapping[str, Any] = field(default_factory=dict)
    model: GPTConfig | None = None
    steps: int = 200
    batch_size: int = 32
    optimizer: str = "adamw"
    lr: float = 3e-3
    min_lr_frac: float = 0.1
    warmup: int = 20
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    momentum: float = 0.9
    seed: int = 0
    eval_every: int = 50
    eval_batches: int = 4
    telemetry_every: int = 1
    histogram_every: int = 0
    micro_batches: int = 1
    fused: bool = False

    def __post_init__(self) -> None:
        # Stored as plain Python numbers and canonical names: the config travels as JSON in checkpoints
        # and is compared field by field on resume.
        def put(f: str, v: Any) -> None:
            object.__setattr__(self, f, v)

        for f in ("steps", "batch_size", "eval_batches", "micro_batches"):
            put(f, check_int(getattr(self, f), f"TrainConfig.{f}", lo=1))
        for f in ("warmup", "eval_every", "telemetry_every", "histogram_every", "seed"):
            put(f, check_int(getattr(self, f), f"TrainConfig.{f}", lo=0))
        put("task", _parse_task_name(self.task))
        put("task_kwargs", _check_task_kwargs(self.task, self.task_kwargs))
        if self.task != "text":  # cheap and free of side effects: the task's own checks run now
            get_task(self.task, **self.task_kwargs)
        if self.model is not None and not isinstance(self.model, GPTConfig):
            raise TypeError(f"TrainConfig.model must be a GPTConfig or None, got {type(self.model).__name__}")
        put("optimizer", parse_name(self.optimizer, ("adamw", "sgd"), "TrainConfig.optimizer"))
        put("lr", check_real(self.lr, "TrainConfig.lr", lo=0.0, lo_open=True))
        put("min_lr_frac", check_real(self.min_lr_frac, "TrainConfig.min_lr_frac", lo=0.0, hi=1.0))
        put("weight_decay", check_real(self.weight_decay, "TrainConfig.weight_decay", lo=0.0))
        b = self.betas
        if isinstance(b, (str, bytes)) or not isinstance(b, (tuple, list)) or len(b) != 2:
            raise TypeError(f"TrainConfig.betas must be a pair (b1, b2), got {b!r}")
        put("betas", tuple(check_real(x, f"TrainConfig.betas[{i}]", lo=0.0, hi=1.0, hi_open=True)
                           for i, x in enumerate(b)))
        put("eps", check_real(self.eps, "TrainConfig.eps", lo=0.0))
        put("momentum", check_real(self.momentum, "TrainConfig.momentum", lo=0.0, hi=1.0, hi_open=True))
        if not isinstance(self.fused, (bool, np.bool_)):
            raise TypeError(f"TrainConfig.fused must be a bool, got {type(self.fused).__name__}: {self.fused!r}")
        put("fused", bool(self.fused))

    def model_for(self, task: Task) -> GPTConfig:
        """The model this config trains on ``task``: ``model``, or when it is None one sized for the task
        (``GPTConfig(vocab_size=task.vocab_size, block_size=task.seq_len)``, the other fields default).

        >>> from fpsim.train import get_task
        >>> m = TrainConfig().model_for(get_task("reverse"))
        >>> m.vocab_size, m.block_size, m.n_layer, m.n_embd
        (11, 16, 2, 64)
        """
        if self.model is not None:
            return self.model
        return GPTConfig(vocab_size=task.vocab_size, block_size=task.seq_len)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["model"] = None if self.model is None else self.model.as_dict()
        d["betas"] = list(self.betas)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TrainConfig:
        d = dict(d)
        d["model"] = None if d.get("model") is None else GPTConfig(**d["model"])
        d["betas"] = tuple(d["betas"])
        return cls(**d)


@ieee_mode
def lr_at(cfg: TrainConfig, step: int) -> float:
    """Learning rate at 0-based ``step``: linear warm-up, then cosine to ``lr * min_lr_frac``."""
    if not isinstance(cfg, TrainConfig):
        raise TypeError(f"cfg must be a TrainConfig, got {type(cfg).__name__}")
    step = check_int(step, "step", lo=0)
    if cfg.warmup and step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    span = max(cfg.steps - cfg.warmup, 1)
    t = min(max(step - cfg.warmup, 0) / span, 1.0)
    lo = cfg.lr * cfg.min_lr_frac
    return lo + 0.5 * (cfg.lr - lo) * (1.0 + math.cos(math.pi * t))


# Per-step series of a History, in order (all lists of length = number of steps taken).
SERIES = ("step", "loss", "loss_scale", "skipped", "lr", "grad_underflow_fraction", "grad_subnormal_fraction",
          "grad_overflow", "grad_amax", "lost_update_fraction", "wall_s")


@ieee_mode
class History:
    """Telemetry of a run as a plain dict of lists (``history.data``; also ``history[key]``).

    Per step (lists aligned with ``"step"``; NaN where telemetry was off that step):

    ``step`` (0-based), ``loss`` (unscaled training loss), ``loss_scale`` (scale used this step),
    ``skipped`` (bool: non-finite gradients, no update), ``lr``, ``grad_underflow_fraction`` (over all
    gradient casts of the step: values that were nonzero and became 0, over the nonzero values),
    ``grad_subnormal_fraction`` (results that are subnormal in the gradient format, over the nonzero
    values), ``grad_overflow`` (count of values that became inf/NaN or saturated), ``grad_amax`` (largest
    |gradient| seen, loss scale included), ``lost_update_fraction`` (nonzero weight updates that left the
    stored weight unchanged, over all nonzero updates), ``wall_s`` (seconds since the run started).

    Evaluation: ``eval_step``, ``eval_loss`` (mean loss over a fixed held-out set of batches).

    Per tensor: ``tensors[site]`` is a dict of lists aligned with ``step`` with keys
    ``underflow_fraction``, ``subnormal_fraction``, ``overflow``, ``amax``. Sites are
    ``"<gemm site>.dy"`` (gradient entering a GEMM's backward, i.e. an activation gradient),
    ``".dx"`` (its result), ``".dw"`` (weight gradient), ``".db"`` (bias gradient), ``"<op site>.grad"``.
    Block-scaled GEMMs (``Policy.block``) add one site per quantised operand, ``"<gemm site>.<operand>:q"``
    (operands ``x``, ``w``, ``dy``, ``w_t``, ``x_wgrad``, ``dy_wgrad``), with ``overflow`` the count and
    ``saturation_fraction`` the share of nonzero values that saturated at the element format's largest.
    Per weight: ``by_weight[name]`` lists the lost-update fraction of each parameter tensor.

    Histograms (when requested): ``hist_step`` and ``hist[key]`` (key ``"grad_act"``, ``"grad_w"``,
    ``"act"``) lists of count arrays over integer binades ``hist_lo .. hist_hi - 1`` (bin i counts
    ``|x|`` in ``[2^(hist_lo+i), 2^(hist_lo+i+1))``; values beyond the ends are clipped into the end bins),
    with the exact zeros in ``hist_zeros[key]``. Histograms are of the values *before* the cast, loss scale
    included.
    """

    def __init__(self, data: dict[str, Any] | None = None) -> None:
        if data is None:
            data = {k: [] for k in SERIES}
            data.update(eval_step=[], eval_loss=[], tensors={}, by_weight={}, hist_step=[], hist={}, hist_zeros={},
                        hist_lo=HIST_LO, hist_hi=HIST_HI)
        self.data: dict[str, Any] = data

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def __contains__(self, key: object) -> bool:
        return key in self.data

    def keys(self) -> Any:
        return self.data.keys()

    def __len__(self) -> int:
        return len(self.data["step"])

    def to_dict(self) -> dict[str, Any]:
        """The plain dict (shared, not copied)."""
        return self.data

    as_dict = to_dict

    def _append_tensor(self, site: str, key: str, value: float) -> None:
        n = len(self.data["step"])
        t = self.data["tensors"].setdefault(site, {})
        lst = t.setdefault(key, [])
        lst.extend([float("nan")] * (n - 1 - len(lst)))
        lst.append(value)

    def summary(self, last: int = 10) -> dict[str, float]:
        """Means over the last ``last`` steps of the main series, and the totals."""
        d = self.data
        n = len(d["step"])

        def tail_mean(k: str) -> float:
            v = np.asarray(d[k][-last:], dtype=np.float64)
            v = v[np.isfinite(v)]
            return float(v.mean()) if v.size else float("nan")

        return {
            "steps": n,
            "final_train_loss": tail_mean("loss"),
            "final_loss": float(d["eval_loss"][-1]) if d["eval_loss"] else tail_mean("loss"),
            "grad_underflow_fraction": _nanmean(d["grad_underflow_fraction"]),
            "grad_subnormal_fraction": _nanmean(d["grad_subnormal_fraction"]),
            "lost_update_fraction": _nanmean(d["lost_update_fraction"]),
            "skipped_steps": int(np.sum(d["skipped"])),
            "final_loss_scale": float(d["loss_scale"][-1]) if n else float("nan"),
        }


def _nanmean(v: Any) -> float:
    a = np.asarray(v, dtype=np.float64)
    a = a[np.isfinite(a)]
    return float(a.mean()) if a.size else float("nan")


class _Progress:
    """A one-line progress bar on a terminal (stderr) or in a notebook; silent otherwise."""

    def __init__(self, total: int, label: str, enabled: bool | None = None) -> None:
        self.total, self.label = total, label
        self.mode = "off"
        if enabled is False:
            return
        if "ipykernel" in sys.modules:
            try:
                from IPython.core.getipython import get_ipython
                from IPython.display import display

                # ipykernel imported is not a kernel running (e.g. a process that ran notebooks through
                # nbclient): without one, display() would print the bar once and hand back no handle
                # typed as Any: whether IPython's stubs type get_ipython() depends on its version
                ipython: Any = get_ipython
                if getattr(ipython(), "kernel", None) is not None:
                    show: Any = display
                    self.handle = show(self._text(0, ""), display_id=True)
                    self.mode = "notebook"
                elif enabled or sys.stderr.isatty():
                    self.mode = "tty"
            except Exception:  # noqa: BLE001 - any IPython trouble: fall back to no bar
                self.mode = "off"
        elif enabled or sys.stderr.isatty():
            self.mode = "tty"

    def _text(self, i: int, extra: str) -> str:
        w = 30
        k = int(w * i / max(self.total, 1))
        return f"{self.label:>16} [{'#' * k}{'.' * (w - k)}] {i}/{self.total} {extra}"

    def update(self, i: int, extra: str = "") -> None:
        if self.mode == "tty":
            sys.stderr.write("\r" + self._text(i, extra))
            sys.stderr.flush()
        elif self.mode == "notebook":
            self.handle.update(self._text(i, extra))

    def close(self) -> None:
        if self.mode == "tty":
            sys.stderr.write("\n")
            sys.stderr.flush()


@ieee_mode
class Trainer:
    """Train a GPT on a task under a policy.

    Parameters
    ----------
    policy : Policy or str
    config : TrainConfig
    task : Task, optional
        Overrides ``config.task`` (e.g. a :class:`~fpsim.train.data.CharText` built from a file).
    init : dict, optional
        Initial weights (default: :func:`fpsim.nn.init_params` with ``config.seed``).
    """

    def __init__(self, policy: Policy | str, config: TrainConfig, *, task: Task | None = None,
                 init: Mapping[str, np.ndarray] | None = None) -> None:
        self.policy = get_policy(policy)
        if not isinstance(config, TrainConfig):
            raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
        if task is not None and not isinstance(task, Task):
            raise TypeError(f"task must be a fpsim.train.Task, got {type(task).__name__}")
        self.config = config
        self.task = task if task is not None else get_task(config.task, **config.task_kwargs)
        #: The model trained: ``config.model``, or one sized for the task (``config.model_for``).
        self.model = m = config.model_for(self.task)
        if m.vocab_size != self.task.vocab_size:
            raise ValueError(f"model vocab_size {m.vocab_size} != task vocab_size {self.task.vocab_size}")
        if m.block_size < self.task.seq_len:
            raise ValueError(f"model block_size {m.block_size} < task sequence length {self.task.seq_len}")
        if init is not None:  # names, shapes, float dtypes and finite values, before any work
            _check_params(init, m, "init", finite=True)
        self.runtime = self.policy.runtime(seed=config.seed)
        self.runtime.n_layer = m.n_layer  # BlockRecipe.bf16_last counts blocks from the end
        params = init if init is not None else init_params(m, seed=config.seed)
        self.store = MasterWeights(params, self.policy, self.runtime)
        kw: dict[str, Any] = {"lr": config.lr, "weight_decay": config.weight_decay}
        if config.optimizer == "adamw":
            kw.update(betas=config.betas, eps=config.eps)
        else:
            kw.update(momentum=config.momentum)
        if config.fused:
            from ..amp.fused import _trainer_check

            _trainer_check(self.policy)
            kw["fused"] = True  # the kernel updates the master in place: the store must own its arrays
            self.store.weights = {k: np.array(v, np.float32, order="C") for k, v in self.store.weights.items()}
        self.optimizer = make_optimizer(config.optimizer, self.policy, self.runtime, **kw)
        self.scaler = self.policy.make_scaler()
        self.history = History()
        self.step_count = 0
        self._t0 = time.perf_counter()
        self._wall_offset = 0.0

    # ------------------------------------------------------------------ data
    def batch(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """The training batch of ``step`` (a pure function of seed and step)."""
        rng = np.random.default_rng([self.config.seed, step])
        return self.task.batch(rng, self.config.batch_size)

    def eval_batches(self) -> list[tuple[np.ndarray, np.ndarray]]:
        rng = np.random.default_rng([self.config.seed, _EVAL_SEED])
        return [self.task.batch(rng, self.config.batch_size) for _ in range(self.config.eval_batches)]

    # ------------------------------------------------------------------ steps
    def _begin_step(self) -> tuple[int, bool, bool]:
        """The start of every step (this Trainer's and the data-parallel one's): the step index, whether it
        records telemetry and histograms, the QAT phase switch, the runtime's begin_step."""
        cfg, rt = self.config, self.runtime
        s = self.step_count
        rec = cfg.telemetry_every > 0 and s % cfg.telemetry_every == 0
        hist = rec and cfg.histogram_every > 0 and s % cfg.histogram_every == 0
        rt.training = True
        q = self.policy.quant
        if q is not None and q.mode == "qat" and not rt.quant_active and s >= int(q.start * cfg.steps):
            rt.quant_active = True  # QAT fine-tuning phase begins
        rt.begin_step(recording=rec, histograms=hist, step=s)
        return s, rec, hist

    @single_threaded()  # BLAS at one thread: the same bits at any thread count (fpsim/_blas.py)
    def step(self) -> dict[str, Any]:
        """One training step; returns its row of telemetry."""
        cfg, pol, rt = self.config, self.policy, self.runtime
        s, rec, hist = self._begin_step()
        x, y = self.batch(s)
        scale = self.scaler.scale
        n_tok = max(int(np.count_nonzero(y != -1)), 1)
        norm = n_tok * cfg.micro_batches if cfg.micro_batches > 1 else None
        gscale: Any = None  # the fused kernel's grad_scale
        # Overflow to inf (and inf - inf = NaN) is an expected event under loss scaling: the step is
        # skipped below, so NumPy's warnings are silenced here.
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            _, loss_arr, cache = gpt_forward(self.store.weights, self.model, x, y, prec=rt, loss_normalizer=norm)
            grads = gpt_backward(np.float32(scale), cache)
            if pol.master is None:  # the .grad of a low-precision leaf is low precision too
                grads = {k: rt.cast(g, pol.gradients) for k, g in grads.items()}
            if cfg.fused:
                from ..amp.fused import _trainer_grads

                grads, found_inf, gscale = _trainer_grads(grads, cfg.micro_batches, pol, scale)
            else:  # the backward pass's own new arrays: unscaled in place (same values as unscale's copies)
                grads, found_inf = self.scaler._unscale_owned(grads)
        loss = float(np.asarray(loss_arr)) * cfg.micro_batches  # report the mean over this batch's tokens
        # the all-reduced (summed) gradient: micro_batches such micro-batches (fused: already in the kernel's)
        if cfg.micro_batches > 1 and not cfg.fused:
            mb = np.float32(cfg.micro_batches)
            with np.errstate(over="ignore", invalid="ignore"):
                grads = {k: g * mb for k, g in grads.items()}
        return self._finish_step(s, grads, found_inf, loss, scale, rec, hist, gscale=gscale)

    def _finish_step(self, s: int, grads: dict[str, np.ndarray], found_inf: bool, loss: float, scale: float,
                     rec: bool, hist: bool, *, gscale: Any = None) -> dict[str, Any]:
        """The end of every step (this Trainer's and the data-parallel one's): the optimizer update unless
        the step overflowed, the scaler's update, telemetry, the step count."""
        cfg, rt = self.config, self.runtime
        lr = lr_at(cfg, s)
        lost_frac = float("nan")
        lost: dict[str, float] = {}
        if cfg.fused:  # one pass: unscale, skip on found_inf, update the master (see TrainConfig.fused)
            self.optimizer.step(self.store.weights, grads, lr=lr, grad_scale=gscale,
                                found_inf=np.full(1, 1.0 if found_inf else 0.0, np.float32))
        elif not found_inf:
            ups = self.optimizer.updates(self.store.weights, grads, lr=lr)
            lost = self.store.apply(ups)
            nz = self.store.last_nonzero
            lost_frac = self.store.last_lost / nz if nz else float("nan")
        self.scaler.update(found_inf)
        rt.end_step()
        row = self._log(s, loss, scale, found_inf, lr, lost_frac, lost, rec, hist)
        self.step_count += 1
        return row

    def _log(self, s: int, loss: float, scale: float, skipped: bool, lr: float, lost_frac: float,
             lost: dict[str, float], rec: bool, hist: bool) -> dict[str, Any]:
        d = self.history.data
        rt = self.runtime
        nan = float("nan")
        if rec and rt.stats:
            tot = np.sum([v for v in rt.stats.values()], axis=0)
            nz = tot[1]
            under = tot[2] / nz if nz else 0.0
            sub = tot[3] / nz if nz else 0.0
            over, amax = float(tot[4]), float(max(v[5] for v in rt.stats.values()))
        else:
            under = sub = over = amax = nan
        row = {"step": s, "loss": loss, "loss_scale": float(scale), "skipped": bool(skipped), "lr": lr,
               "grad_underflow_fraction": float(under), "grad_subnormal_fraction": float(sub),
               "grad_overflow": over, "grad_amax": amax, "lost_update_fraction": lost_frac,
               "wall_s": self._wall_offset + time.perf_counter() - self._t0}
        for k in SERIES:
            d[k].append(row[k])
        if rec:
            for site, v in rt.stats.items():
                nzs = v[1] if v[1] else 1.0
                self.history._append_tensor(site, "underflow_fraction", float(v[2] / nzs))
                self.history._append_tensor(site, "subnormal_fraction", float(v[3] / nzs))
                self.history._append_tensor(site, "overflow", float(v[4]))
                self.history._append_tensor(site, "amax", float(v[5]))
            # block-scaled operands (MXFP8, NVFP4): sites "<gemm>.x:q" etc., kept out of the gradient totals
            for site, v in getattr(rt, "qstats", {}).items():
                nzs = v[1] if v[1] else 1.0
                self.history._append_tensor(f"{site}:q", "underflow_fraction", float(v[2] / nzs))
                self.history._append_tensor(f"{site}:q", "subnormal_fraction", float(v[3] / nzs))
                self.history._append_tensor(f"{site}:q", "overflow", float(v[4]))
                self.history._append_tensor(f"{site}:q", "saturation_fraction", float(v[4] / nzs))
                self.history._append_tensor(f"{site}:q", "amax", float(v[5]))
        n = len(d["step"])
        for k, f in lost.items():
            lst = d["by_weight"].setdefault(k, [])
            lst.extend([nan] * (n - 1 - len(lst)))
            lst.append(f)
        if hist:
            d["hist_step"].append(s)
            for k, c in rt.hists.items():
                d["hist"].setdefault(k, []).append(c.astype(np.int64).tolist())
                d["hist_zeros"].setdefault(k, []).append(int(rt.hist_zeros[k]))
        return row

    @single_threaded()  # BLAS at one thread: the same bits at any thread count (fpsim/_blas.py)
    def evaluate(self, batches: list[tuple[np.ndarray, np.ndarray]] | None = None) -> float:
        """Mean loss over the held-out batches, computed in the policy's forward precision."""
        rt = self.runtime
        train_rng = self._side_rng(_EVAL_SEED + 2)
        rt.training = False
        try:
            rt.begin_step(recording=False, step=self.step_count)
            bs = self.eval_batches() if batches is None else batches
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                losses = [float(np.asarray(gpt_forward(self.store.weights, self.model, x, y, prec=rt)[1]))
                          for x, y in bs]
        finally:
            rt.training = True
            rt.rng = train_rng
        return float(np.mean(losses))

    def _side_rng(self, tag: int) -> np.random.Generator | None:
        """Point the runtime's stochastic rounding at a generator of its own for evaluation or
        calibration, seeded by (seed, tag, step); returns the training generator to put back.

        So the training generator, and with it every trained bit, does not depend on when or how often
        evaluation runs (``eval_every``), and an evaluation needs no state of its own in a checkpoint.
        """
        rt = self.runtime
        train_rng: np.random.Generator | None = rt.rng
        if train_rng is not None:
            rt.rng = np.random.default_rng([self.config.seed, tag, self.step_count])
        return train_rng

    def _eval_log(self) -> None:
        self.history.data["eval_step"].append(self.step_count)
        self.history.data["eval_loss"].append(self.evaluate())

    @single_threaded()  # BLAS at one thread: the same bits at any thread count (fpsim/_blas.py)
    def run(self, steps: int | None = None, *, progress: bool | None = None, checkpoint: str | None = None,
            checkpoint_every: int = 0, label: str | None = None) -> History:
        """Train until ``steps`` (default ``config.steps``) steps have been taken in total.

        Evaluates every ``config.eval_every`` steps and at the end of training (``config.steps``, or
        ``steps`` if larger); for a PTQ policy, calibrates and quantizes after the last step (the final
        evaluation is then the quantized model's). ``run(k)`` with ``k < config.steps`` stops before that
        end, so ``run(k)``, a checkpoint, and ``run()`` give the bits of one uninterrupted ``run()``.
        ``checkpoint``: a path written every ``checkpoint_every`` steps and at the end.
        """
        from .checkpoint import save_checkpoint

        total = self.config.steps if steps is None else check_int(steps, "steps", lo=0)
        checkpoint_every = check_int(checkpoint_every, "checkpoint_every", lo=0)
        # Training ends at config.steps (or at a larger ``steps``): only there the final evaluation (and a
        # PTQ policy's quantization) happens, so run(k) + run() gives the bits of run().
        end = max(total, self.config.steps)
        bar = _Progress(total, label or self.policy.name, progress)
        try:
            while self.step_count < total:
                row = self.step()
                if self.config.eval_every and self.step_count % self.config.eval_every == 0 \
                        and self.step_count < end:
                    self._eval_log()
                if checkpoint and checkpoint_every and self.step_count % checkpoint_every == 0:
                    save_checkpoint(self, checkpoint)
                bar.update(self.step_count, f"loss {row['loss']:.4f} scale {row['loss_scale']:g}")
        finally:
            bar.close()
        if self.step_count == end and (not self.history["eval_step"] or self.history["eval_step"][-1] != end):
            self.finish()
        if checkpoint:
            save_checkpoint(self, checkpoint)
        return self.history

    def finish(self) -> None:
        """Final evaluation (after post-training quantization for a PTQ policy)."""
        q = self.policy.quant
        if q is not None and q.mode == "ptq" and not self.runtime.quant_active:
            self.history.data["float_eval_loss"] = self.evaluate()
            self.post_training_quantize()
        self._eval_log()

    @single_threaded()  # BLAS at one thread: the same bits at any thread count (fpsim/_blas.py)
    def post_training_quantize(self) -> None:
        """Calibrate the activation observers on ``calibration_batches`` training batches, then switch
        fake quantization on with the observers frozen (PTQ)."""
        q = self.policy.quant
        if q is None:
            raise ValueError(f"policy {self.policy.name!r} has no quantization config")
        rt = self.runtime
        train_rng = self._side_rng(_EVAL_SEED + 3)
        rt.calibrate(True)
        try:
            rng = np.random.default_rng([self.config.seed, _EVAL_SEED + 1])
            for _ in range(q.calibration_batches):
                x, y = self.task.batch(rng, self.config.batch_size)
                gpt_forward(self.store.weights, self.model, x, y, prec=rt)
        finally:
            rt.calibrate(False)
            rt.rng = train_rng
        rt.quant_active = True
