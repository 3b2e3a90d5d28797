"""Training (layer L5): data tasks, the loop with telemetry, checkpoints, and the ``fpsim demo`` report."""

from __future__ import annotations

from .checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from .data import CharText, ModularAddition, SequenceTask, Task, get_task, task_names
from .loop import History, TrainConfig, Trainer, lr_at

__all__ = [
    "CharText",
    "CheckpointError",
    "History",
    "ModularAddition",
    "SequenceTask",
    "Task",
    "TrainConfig",
    "Trainer",
    "get_task",
    "load_checkpoint",
    "lr_at",
    "save_checkpoint",
    "task_names",
]
