"""Timing shared by the benchmark scripts: the best of several runs, after one warm-up call."""

from __future__ import annotations

import time
from typing import Any, Callable


def best(fn: Callable[[], Any], repeat: int) -> float:
    """Seconds of the fastest of ``repeat`` calls of ``fn`` (after one warm-up call)."""
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)
