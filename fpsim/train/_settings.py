"""The demo's experiment settings and its output-folder check, read by ``demo``, ``ledger`` and ``sweep``.

:data:`DEFAULT_POLICIES`, :class:`DemoSettings`, :func:`demo_settings` and :func:`check_output_dir` are public as
``fpsim.train.demo.*``; they live here, below the modules that read them, so that ``demo`` (which runs the
ledger and the sweeps) is imported by none of them.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass, field, replace
from typing import Any

from .._fpenv import ieee_mode
from ..nn import GPTConfig
from ._files import remove_stale_tmp
from .data import get_task
from .loop import TrainConfig

__all__ = ["DEFAULT_POLICIES", "DemoSettings", "demo_settings", "check_output_dir", "TMP_PREFIX", "TMP_RE",
           "STALE_TMP_AGE_S"]

#: Seeds ``fpsim demo`` trains when ``--seeds`` is not given: 3 for the full demo, so that its lesson table says
#: for every lesson whether it holds beyond seed noise; 1 for ``--quick`` (and ``--gemm``), whose table then says
#: "not measured: 1 seed" and how to measure it.
DEFAULT_SEEDS = 3
DEFAULT_SEEDS_QUICK = 1
DEFAULT_POLICIES = ("fp32", "bf16-mixed", "fp16-mixed", "fp16-fast-scaler", "fp16-static", "fp16-no-scaling",
                    "fp16-no-master",
                    "fp8-hybrid", "int8-qat", "int4-qat", "int8-ptq", "int4-ptq")


@ieee_mode
@dataclass(frozen=True)
class DemoSettings:
    """The experiment: task, model and training hyper-parameters shared by every policy."""

    task: str = "sort"
    task_kwargs: dict[str, Any] = field(default_factory=lambda: {"n_symbols": 16, "length": 10})
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    steps: int = 400
    batch_size: int = 32
    micro_batches: int = 2048
    lr: float = 2e-3
    warmup: int = 20
    histogram_every: int = 50
    eval_every: int = 50
    seed: int = 0

    def train_config(self) -> TrainConfig:
        t = get_task(self.task, **self.task_kwargs)
        model = GPTConfig(vocab_size=t.vocab_size, block_size=t.seq_len, n_layer=self.n_layer,
                          n_head=self.n_head, n_embd=self.n_embd)
        return TrainConfig(task=self.task, task_kwargs=dict(self.task_kwargs), model=model, steps=self.steps,
                           batch_size=self.batch_size, lr=self.lr, warmup=min(self.warmup, self.steps),
                           micro_batches=self.micro_batches, seed=self.seed,
                           eval_every=self.eval_every, histogram_every=self.histogram_every)


@ieee_mode
def demo_settings(quick: bool = False, steps: int | None = None, seed: int = 0) -> DemoSettings:
    """The full demo, or the ``--quick`` one (fewer steps)."""
    s = DemoSettings(steps=120, histogram_every=30, eval_every=40) if quick else DemoSettings()
    if steps is not None:
        if steps < 1:
            raise ValueError(f"--steps must be >= 1, got {steps}")
        s = replace(s, steps=int(steps), histogram_every=max(1, min(s.histogram_every, steps)),
                    eval_every=max(1, min(s.eval_every, steps)))
    return replace(s, seed=int(seed))


TMP_PREFIX = ".fpsim-demo-tmp-"  # our temporary files, and only ours, are removed when stale
TMP_RE = re.compile(r"\.fpsim-demo-tmp-[A-Za-z0-9_]{1,64}\Z")
STALE_TMP_AGE_S = 60.0


@ieee_mode
def check_output_dir(out: str | os.PathLike[str]) -> str:
    """Create ``out`` if needed and prove it writable, before any training; returns the path as a str.

    Writability is tested by creating and removing a file there (permission bits say nothing for root, a
    read-only mount or a full disk), so the check holds for every user. A folder that cannot be created or
    written raises ``ValueError`` naming it and the reason. Temporary files a killed run left behind
    (``.fpsim-demo-tmp-*``, unlocked and a minute old) are removed; a live run's are never touched.

    >>> import tempfile, os
    >>> d = check_output_dir(os.path.join(tempfile.mkdtemp(), "demo"))
    >>> os.listdir(d)
    []
    """
    if not isinstance(out, (str, os.PathLike)):
        raise TypeError(f"output folder must be a path (str), got {type(out).__name__}: {out!r}")
    path = os.fspath(out)
    if not isinstance(path, str) or not path.strip():
        raise ValueError(f"output folder must be a non-empty path, got {path!r}")
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"output folder {path!r} exists and is not a folder")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise ValueError(f"cannot create output folder {path!r}: {e.strerror or e}") from None
    try:
        fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, dir=path)
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        raise ValueError(f"cannot write in output folder {path!r}: {e.strerror or e}") from None
    remove_stale_tmp(path, TMP_RE, STALE_TMP_AGE_S)  # never another live run's file (fpsim.train._files)
    return path
