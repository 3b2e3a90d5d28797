"""Checkpoints: one ``.npz`` (no pickle) holding weights, optimizer, loss scaler, policy runtime state
and the history, written atomically (temporary file in the same folder, fsync, rename).

Resuming gives the same bits as a run that was never interrupted: batches are a function of
``(seed, step)``, and every piece of state the step depends on is saved. Loading checks the file's
integrity (zip CRCs), its format version, and that the policy and configuration match.
"""

from __future__ import annotations

import json
import os
import tempfile
import zipfile
from typing import Any

import numpy as np

__all__ = ["FORMAT_VERSION", "CheckpointError", "load_checkpoint", "save_checkpoint"]

FORMAT_VERSION = 1


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: truncated, corrupted, of another version, policy or config."""


def save_checkpoint(trainer: Any, path: str | os.PathLike[str]) -> str:
    """Write ``trainer``'s full state to ``path`` atomically; returns the path.

    A crash while writing leaves any previous file at ``path`` untouched.
    """
    path = os.fspath(path)
    meta = {
        "format_version": FORMAT_VERSION,
        "policy": trainer.policy.name,
        "policy_fingerprint": trainer.policy.fingerprint(),
        "config": trainer.config.as_dict(),
        "task": trainer.task.describe(),
        "step": trainer.step_count,
        "scaler": trainer.scaler.state_dict(),
        "history": trainer.history.to_dict(),
        "wall_s": trainer.history["wall_s"][-1] if len(trainer.history) else 0.0,
        "quant_active": bool(trainer.runtime.quant_active),
    }
    arrays: dict[str, np.ndarray] = {"meta": np.asarray(json.dumps(meta))}
    for k, v in trainer.store.weights.items():
        arrays[f"w/{k}"] = v
    for k, v in trainer.optimizer.state_dict().items():
        arrays[f"opt/{k}"] = np.asarray(v)
    for k, v in trainer.runtime.state_dict().items():
        arrays[f"rt/{k}"] = np.asarray(v)
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".ckpt-", suffix=".npz.tmp", dir=d)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)  # type: ignore[arg-type] # plain arrays only; loading uses allow_pickle=False
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def _read(path: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    try:
        with open(path, "rb") as f, np.load(f, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}  # reading every member checks its CRC
    except FileNotFoundError:
        raise
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(f"checkpoint {path!r} is truncated or corrupted ({type(e).__name__}: {e})") from e
    if "meta" not in arrays:
        raise CheckpointError(f"checkpoint {path!r} has no 'meta' entry: not an fpsim training checkpoint")
    try:
        meta = json.loads(str(arrays.pop("meta")))
    except json.JSONDecodeError as e:
        raise CheckpointError(f"checkpoint {path!r} has unreadable metadata: {e}") from e
    if meta.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {path!r} has format version {meta.get('format_version')!r}; "
                              f"this fpsim reads version {FORMAT_VERSION}")
    return meta, arrays


def load_checkpoint(path: str | os.PathLike[str], *, policy: Any = None, config: Any = None,
                    task: Any = None) -> Any:
    """A :class:`~fpsim.train.Trainer` restored from ``path``, ready to continue with ``run()``.

    ``policy`` / ``config``: if given they must match the checkpoint's (else :class:`CheckpointError`);
    by default the checkpoint's own are used (the policy looked up by name, its definition checked).
    ``task``: needed for a text task (the text is not stored); must describe itself identically.
    """
    from ..amp import get_policy
    from .loop import History, TrainConfig, Trainer

    path = os.fspath(path)
    meta, arrays = _read(path)
    try:
        pol = get_policy(policy if policy is not None else meta["policy"])
    except ValueError as e:
        raise CheckpointError(f"checkpoint {path!r}: {e}") from e
    if pol.fingerprint() != meta["policy_fingerprint"]:
        raise CheckpointError(f"checkpoint {path!r} was written under policy {meta['policy']!r} with a different "
                              f"definition than policy {pol.name!r} given now")
    saved_cfg = TrainConfig.from_dict(meta["config"])
    cfg = saved_cfg if config is None else config
    if cfg.as_dict() != saved_cfg.as_dict():
        diff = sorted(k for k, v in cfg.as_dict().items() if saved_cfg.as_dict().get(k) != v)
        raise CheckpointError(f"checkpoint {path!r} has a different training configuration (fields {diff})")
    tr = Trainer(pol, cfg, task=task)
    if tr.task.describe() != meta["task"]:
        raise CheckpointError(f"checkpoint {path!r} was trained on task {meta['task']}, not {tr.task.describe()}")
    w = {k[2:]: v for k, v in arrays.items() if k.startswith("w/")}
    if set(w) != set(tr.store.weights) or any(w[k].shape != tr.store.weights[k].shape for k in w):
        raise CheckpointError(f"checkpoint {path!r} holds weights that do not match the model")
    tr.store.weights = {k: np.asarray(w[k], np.float32).copy() for k in tr.store.weights}
    tr.optimizer.load_state_dict({k[4:]: v for k, v in arrays.items() if k.startswith("opt/")})
    tr.runtime.load_state_dict({k[3:]: v for k, v in arrays.items() if k.startswith("rt/")})
    tr.runtime.quant_active = bool(meta.get("quant_active", tr.runtime.quant_active))
    try:
        tr.scaler.load_state_dict(meta["scaler"])
    except ValueError as e:
        raise CheckpointError(f"checkpoint {path!r}: {e}") from e
    tr.history = History(meta["history"])
    tr.step_count = int(meta["step"])
    tr._wall_offset = float(meta.get("wall_s", 0.0))
    return tr
