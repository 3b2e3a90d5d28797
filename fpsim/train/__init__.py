"""Training (layer L5): data tasks, the loop with telemetry, checkpoints, and the ``fpsim demo`` report."""

from __future__ import annotations

from .checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from .data import CharText, ModularAddition, SequenceTask, Task, get_task, task_names
from .ledger import StepLedger, measure_checkpointing, measure_step
from .loop import History, TrainConfig, Trainer, lr_at
from .sweep import Cell, Paired, SweepError, paired_interval, run_sweep, seed_spread
from .parallel import DataParallelTrainer, GradCompressor, all_reduce, ddp_all_reduce

__all__ = [
    "Cell",
    "CharText",
    "CheckpointError",
    "DataParallelTrainer",
    "GradCompressor",
    "History",
    "ModularAddition",
    "Paired",
    "SequenceTask",
    "StepLedger",
    "SweepError",
    "Task",
    "TrainConfig",
    "Trainer",
    "all_reduce",
    "ddp_all_reduce",
    "get_task",
    "load_checkpoint",
    "lr_at",
    "measure_checkpointing",
    "measure_step",
    "paired_interval",
    "run_sweep",
    "save_checkpoint",
    "seed_spread",
    "task_names",
]
