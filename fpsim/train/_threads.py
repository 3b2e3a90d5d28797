"""Limit the BLAS thread pool at run time (what threadpoolctl does, for OpenBLAS only).

Tiny GEMMs gain nothing from threads, and on a busy machine OpenBLAS's spinning threads make them
10-20x slower; the demo and the benchmark therefore run BLAS single-threaded.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterator
from typing import Any

__all__ = ["blas_threads", "limit_blas_threads"]

_SYMBOLS = ("openblas_set_num_threads", "scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
            "openblas_set_num_threads64_", "openblas_set_num_threads64")


def _loaded_openblas() -> list[str]:
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower() and ".so" in line}
    except OSError:
        return []
    return sorted(p for p in paths if os.path.isfile(p))


def _blas_functions(names: tuple[str, ...]) -> Iterator[Any]:
    """For each loaded OpenBLAS library, the first of ``names`` it exports."""
    for path in _loaded_openblas():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for sym in names:
            fn = getattr(lib, sym, None)
            if fn is not None:
                yield fn
                break


def _get_threads() -> int | None:
    for fn in _blas_functions(tuple(sym.replace("set_num", "get_num") for sym in _SYMBOLS)):
        return int(fn())
    return None


@contextlib.contextmanager
def blas_threads(n: int = 1) -> Iterator[None]:
    """Context manager: OpenBLAS runs with ``n`` threads inside, the previous count is restored after."""
    old = _get_threads()
    limit_blas_threads(n)
    try:
        yield
    finally:
        if old is not None:
            limit_blas_threads(old)


def limit_blas_threads(n: int = 1) -> bool:
    """Set OpenBLAS's thread count to ``n`` for the running process; True if a library was found."""
    done = False
    for fn in _blas_functions(_SYMBOLS):
        fn(ctypes.c_int(int(n)))
        done = True
    return done
