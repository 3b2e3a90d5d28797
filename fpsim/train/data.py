"""Deterministic training data: procedurally generated sequence tasks and character-level text.

A task turns a NumPy ``Generator`` into a batch ``(x, y)`` of int64 arrays (B, T); ``y`` holds the next
token where the loss counts and ``-1`` (ignored) elsewhere. The trainer seeds the generator from
``(seed, step)``, so the same seed gives the same batches bit for bit, and resuming needs no data state.

>>> import numpy as np
>>> t = get_task("reverse", n_symbols=5, length=4)
>>> x, y = t.batch(np.random.default_rng(0), 1)
>>> x.tolist(), y.tolist()
([[4, 3, 2, 1, 5, 1, 2, 3]], [[-1, -1, -1, -1, 1, 2, 3, 4]])
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._checks import check_int
from .._fpenv import ieee_mode
from .._names import parse_name

__all__ = ["CharText", "ModularAddition", "SequenceTask", "Task", "get_task", "task_names"]


@ieee_mode
class Task:
    """Base class: ``vocab_size``, ``seq_len`` (T) and ``batch(rng, B) -> (x, y)``."""

    name = "task"
    vocab_size: int
    seq_len: int

    def batch(self, rng: np.random.Generator, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "vocab_size": self.vocab_size, "seq_len": self.seq_len}


_TRANSFORMS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "copy": lambda s: s,
    "reverse": lambda s: s[:, ::-1],
    "sort": lambda s: np.sort(s, axis=1),
}


@ieee_mode
@dataclass
class SequenceTask(Task):
    """``length`` random symbols, a separator, then their copy / reversal / sorted order.

    Tokens: symbols ``0 .. n_symbols-1``, separator ``n_symbols``. The loss counts only the answer.
    """

    kind: str = "reverse"
    n_symbols: int = 10
    length: int = 8

    def __post_init__(self) -> None:
        self.kind = parse_name(self.kind, _TRANSFORMS, "sequence task")
        self.n_symbols = check_int(self.n_symbols, "SequenceTask.n_symbols")
        self.length = check_int(self.length, "SequenceTask.length")
        if self.n_symbols < 2 or self.length < 1:
            raise ValueError(f"need n_symbols >= 2 and length >= 1, got {self.n_symbols}, {self.length}")
        self.name = self.kind
        self.vocab_size = self.n_symbols + 1
        self.seq_len = 2 * self.length

    def batch(self, rng: np.random.Generator, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        batch_size = _check_batch(rng, batch_size)
        L = self.length
        s = rng.integers(0, self.n_symbols, size=(batch_size, L))                     # (B, L)
        ans = _TRANSFORMS[self.kind](s)                                                # (B, L)
        sep = np.full((batch_size, 1), self.n_symbols)
        seq = np.concatenate([s, sep, ans], axis=1).astype(np.int64)                   # (B, 2L+1)
        x = seq[:, :-1]                                                                # (B, 2L)
        y = seq[:, 1:].copy()
        y[:, : L] = -1                                                                 # only the answer counts
        return np.ascontiguousarray(x), y

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "n_symbols": self.n_symbols, "length": self.length}


@ieee_mode
@dataclass
class ModularAddition(Task):
    """``a b = (a+b) mod p``: tokens 0..p-1 and ``=`` (token p); the loss counts only the answer."""

    p: int = 13

    def __post_init__(self) -> None:
        self.p = check_int(self.p, "ModularAddition.p")
        if self.p < 2:
            raise ValueError(f"modulus p must be >= 2, got {self.p}")
        self.name = "modadd"
        self.vocab_size = self.p + 1
        self.seq_len = 3

    def batch(self, rng: np.random.Generator, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        batch_size = _check_batch(rng, batch_size)
        a = rng.integers(0, self.p, size=batch_size)
        b = rng.integers(0, self.p, size=batch_size)
        x = np.stack([a, b, np.full(batch_size, self.p)], axis=1).astype(np.int64)    # (B, 3)
        y = np.full((batch_size, 3), -1, dtype=np.int64)
        y[:, 2] = (a + b) % self.p
        return x, y

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "p": self.p}


@ieee_mode
class CharText(Task):
    """Character-level language modelling on a text (or the contents of a file): random windows of
    ``seq_len`` characters, every next character counts."""

    name = "text"

    def __init__(self, text: str | None = None, *, path: str | os.PathLike[str] | None = None,
                 seq_len: int = 32) -> None:
        if (text is None) == (path is None):
            raise ValueError("give exactly one of text= or path=")
        seq_len = check_int(seq_len, "CharText.seq_len", lo=1)
        if path is not None:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        if not isinstance(text, str):
            raise TypeError(f"CharText text must be a str, got {type(text).__name__}")
        if len(text) < seq_len + 2:
            raise ValueError(f"text has {len(text)} characters; need at least seq_len + 2 = {seq_len + 2}")
        self.chars = sorted(set(text))
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        self.data = np.array([self.stoi[c] for c in text], dtype=np.int64)
        self.vocab_size = len(self.chars)
        self.seq_len = int(seq_len)
        self.source = str(path) if path is not None else "<text>"

    def batch(self, rng: np.random.Generator, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        batch_size = _check_batch(rng, batch_size)
        T = self.seq_len
        i = rng.integers(0, self.data.size - T - 1, size=batch_size)                   # (B,)
        ix = i[:, None] + np.arange(T + 1)[None, :]                                    # (B, T+1)
        w = self.data[ix]
        return np.ascontiguousarray(w[:, :-1]), np.ascontiguousarray(w[:, 1:])

    def decode(self, idx: Any) -> str:
        return "".join(self.chars[int(i)] for i in np.asarray(idx).ravel())

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "source": self.source}


def _check_batch(rng: object, batch_size: object) -> int:
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    return check_int(batch_size, "batch_size", lo=1)


#: The keyword arguments each task takes (``get_task`` refuses others before building anything).
_TASK_KWARGS: dict[str, tuple[str, ...]] = {
    "copy": ("n_symbols", "length"), "reverse": ("n_symbols", "length"), "sort": ("n_symbols", "length"),
    "modadd": ("p",), "text": ("text", "path", "seq_len"),
}


def task_names() -> list[str]:
    return ["copy", "reverse", "sort", "modadd", "text"]


def _parse_task_name(name: object) -> str:
    """The canonical task name by the one name rule (``" Reverse"`` is ``"reverse"``)."""
    return parse_name(name, task_names(), "task")


def _check_task_kwargs(name: str, kwargs: object) -> dict[str, Any]:
    """``kwargs`` as a dict whose keys task ``name`` takes (ValueError listing them otherwise)."""
    if not isinstance(kwargs, Mapping):
        raise TypeError(f"task_kwargs must be a mapping, got {type(kwargs).__name__}: {kwargs!r}")
    kw = dict(kwargs)
    valid = _TASK_KWARGS[_parse_task_name(name)]
    bad = sorted(str(k) for k in kw if k not in valid)
    if bad:
        raise ValueError(f"task {name!r} takes no arguments {bad}; valid: {', '.join(valid)}")
    return kw


@ieee_mode
def get_task(name: str | Task, **kwargs: Any) -> Task:
    """A task by name: ``copy``, ``reverse``, ``sort`` (kwargs n_symbols, length), ``modadd`` (p),
    ``text`` (path= or text=, seq_len). Names follow the one rule (case and surrounding space ignored)."""
    if isinstance(name, Task):
        if kwargs:
            raise ValueError(f"task arguments {sorted(kwargs)} given with a Task object; build the Task with them")
        return name
    key = _parse_task_name(name)
    kw = _check_task_kwargs(key, kwargs)
    if key in _TRANSFORMS:
        return SequenceTask(kind=key, **kw)
    if key == "modadd":
        return ModularAddition(**kw)
    return CharText(**kw)
