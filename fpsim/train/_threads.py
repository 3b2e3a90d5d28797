"""The BLAS thread count during training: results never depend on it.

Every float GEMM of the training path runs BLAS single-threaded (:func:`fpsim._blas.matmul`, the one
mechanism, at layer 0 so that the layers can use it): a multi-threaded BLAS sums a large GEMM in another order,
and the trained weights would differ with ``OPENBLAS_NUM_THREADS``/``OMP_NUM_THREADS``, threadpoolctl or the
number of cores. :func:`single_threaded` opens the same pin around a whole step or run, so that the GEMMs
inside it only count a nesting level (pinning costs a few microseconds per GEMM otherwise); the trainer's
``run``, ``step``, ``evaluate`` and the demo use it.

:func:`blas_threads` and :func:`limit_blas_threads` set the count for other BLAS work (benchmarks); inside an
open pin they take effect when it closes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from .._blas import get_threads, set_threads, single_threaded

__all__ = ["blas_threads", "limit_blas_threads", "single_threaded"]


@contextlib.contextmanager
def blas_threads(n: int = 1) -> Iterator[None]:
    """Context manager: BLAS runs with ``n`` threads inside (training GEMMs: one, whatever ``n``), the previous
    count is restored after, also on exceptions."""
    old = get_threads()
    set_threads(n)
    try:
        yield
    finally:
        if old is not None:
            set_threads(old)


def limit_blas_threads(n: int = 1) -> bool:
    """Set the BLAS libraries' thread count to ``n`` for the running process; True if a library was found."""
    return set_threads(n)
