"""Per-call cost of fpsim's floating-point environment guard (``fpsim._fpenv.ieee_mode``).

Run: python3 benchmarks/bench_fpenv.py [--repeat 7] [--n 200000]

Times one call of a function that does nothing, bare and wrapped: by the guard as it was before the rounding
mode and NumPy's error state were added (an FTZ probe only), by the guard now (the normal state; a call nested
in another fpsim call; a thread that flushes or rounds upward, where the C helper switches the mode), and,
for scale, by ``np.errstate(all="ignore")`` and a scalar ``fpsim.add``. Figures are nanoseconds per call
(best of --repeat loops of --n calls); the load average is printed, as the machine may be shared.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import functools
import os
import sys
import timeit
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

import fpsim
from fpsim import _fpenv


def _noop(x: float) -> float:
    return x


def _old_guard(func: Callable[..., Any]) -> Callable[..., Any]:
    """The guard before this change: the FTZ probe, nothing else in the normal mode."""
    tiny, one = _fpenv._TINY, _fpenv._ONE

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if tiny * one == 0.0:
            raise AssertionError("not timed")
        return func(*args, **kwargs)

    return wrapper


def _ns(fn: Callable[[], Any], n: int, repeat: int) -> float:
    return min(timeit.repeat(fn, number=n, repeat=repeat)) / n * 1e9


@contextlib.contextmanager
def _upward() -> Iterator[None]:
    libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
    c = _fpenv._cfpenv
    libm.fesetround(c.UPWARD)
    try:
        yield
    finally:
        libm.fesetround(c.TONEAREST)


@contextlib.contextmanager
def _flushing() -> Iterator[None]:
    prev = _fpenv.set_flush_flags(_fpenv.FTZ | _fpenv.DAZ)
    try:
        yield
    finally:
        _fpenv.set_flush_flags(prev)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--n", type=int, default=200_000)
    a = ap.parse_args()
    n, r = a.n, a.repeat
    old, new = _old_guard(_noop), _fpenv.ieee_mode(functools.wraps(_noop)(lambda x: _noop(x)))
    outer = _fpenv.ieee_mode(lambda: [new(1.0) for _ in range(100)])

    def errstate() -> None:
        with np.errstate(all="ignore"):
            _noop(1.0)

    rows = [
        ("bare call", _ns(lambda: _noop(1.0), n, r)),
        ("old guard (FTZ probe only)", _ns(lambda: old(1.0), n, r)),
        ("new guard, normal state", _ns(lambda: new(1.0), n, r)),
        ("new guard, nested call (per call)", _ns(outer, n // 100, r) / 100),
        ("np.errstate(all='ignore') around a call", _ns(errstate, n // 4, r)),
    ]
    helper = _fpenv._helper()
    if helper is not None and sys.platform.startswith("linux"):
        with _flushing():
            rows.append(("new guard, FTZ/DAZ thread (clear, restore)", _ns(lambda: new(1.0), n // 4, r)))
        with _upward():
            rows.append(("new guard, FE_UPWARD thread (set, restore)", _ns(lambda: new(1.0), n // 4, r)))
    x, y = 1.0, 3.0
    rows.append(("for scale: fpsim.add(1.0, 3.0, 'fp64')", _ns(lambda: fpsim.add(x, y, "fp64"), n // 20, r)))
    rows.append(("for scale: fpsim.div(1.0, 3.0, 'bf16')", _ns(lambda: fpsim.div(x, y, "bf16"), n // 20, r)))
    print(f"load average {os.getloadavg()[0]:.2f}; ns per call, best of {r}")
    for label, ns in rows:
        print(f"  {label:<46} {ns:9.0f}")


if __name__ == "__main__":
    main()
