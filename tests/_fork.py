"""Run a function in a forked child and return what it put on its queue (the fork tests of the kernels'
worker pools: a child must start an empty pool, never wait on its parent's threads)."""

from __future__ import annotations

import multiprocessing
from typing import Any, Callable


def in_forked_child(target: Callable[..., None], *args: Any, timeout: float = 60) -> Any:
    """``target(q, *args)`` in a forked child; the one value it puts on ``q``. Fails (``queue.Empty``) if the
    child hangs or dies before putting it, and if it exits non-zero; the child is killed, never left behind."""
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=target, args=(q, *args))
    p.start()
    try:
        got = q.get(timeout=timeout)  # before join: the child exits once its result is read
    finally:
        p.join(10)
        if p.is_alive():
            p.kill()
            p.join()
    assert p.exitcode == 0, f"forked child exited with {p.exitcode}"
    return got
