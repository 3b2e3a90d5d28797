"""Peak memory of a call as tracemalloc sees it (NumPy reports its array allocations to tracemalloc)."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from typing import Any


def peak_bytes(fn: Callable[[], Any]) -> int:
    """The largest traced allocation total while ``fn()`` ran, in bytes."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
