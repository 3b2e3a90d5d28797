"""Same bits whatever the BLAS thread count: fpsim's float GEMMs run BLAS single-threaded.

A multi-threaded BLAS splits a large GEMM between its threads in a way that changes the summation order, so
the same float32 product can differ in the last bits between 1 and 2 threads (OpenBLAS 0.3.31 on Haswell:
already ``(256, 64) @ (64, 64)``). Training amplifies one such bit into different weights, so a run's result
would depend on ``OPENBLAS_NUM_THREADS``/``OMP_NUM_THREADS``, on threadpoolctl, or on the number of cores.

Every float GEMM of the training path (the layers' and the policies' forward, dX, dW, attention, the LM head,
flash tiles, LoRA) calls :func:`matmul`, which runs inside :func:`single_threaded`: BLAS at one thread for the
duration, the previous count restored afterwards, also on exceptions. The trainer runs whole steps inside
:func:`single_threaded` as well, so the GEMMs inside only count a nesting level.

Process-wide and thread-safe: BLAS's thread count is global to the process, so the pin is reference-counted
under a lock. The first region to open saves every library's count and sets 1; the last to close restores the
saved counts. :func:`set_threads` inside a region changes the count restored at its end, never the pinned one.
Code that calls the BLAS library itself (threadpoolctl, ``openblas_set_num_threads``) from another thread
while a region is open can still change the count under it; fpsim does not.

The libraries (OpenBLAS, MKL, BLIS) are found with threadpoolctl when it is installed (every platform), else
in ``/proc/self/maps`` (Linux), and set through their own process-wide calls. Where none is found (Apple's
Accelerate) the regions do nothing; fix the thread count before NumPy loads instead (``VECLIB_MAXIMUM_THREADS=1``).
An OpenBLAS built on OpenMP keeps a count per calling thread: the region's own thread is pinned, GEMMs that
other threads start while it is open are not.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

__all__ = ["get_threads", "matmul", "set_threads", "single_threaded"]

# (get, set) of one BLAS library's thread count.
_Control = tuple[Callable[[], int], Callable[[int], Any]]

# (setter, getter) symbols of the libraries fpsim can pin without threadpoolctl: OpenBLAS's (NumPy's wheels
# ship scipy-openblas with a prefix and an ILP64 suffix), MKL's, BLIS's.
_SYMBOLS = (
    ("openblas_set_num_threads", "openblas_get_num_threads"),
    ("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
    ("scipy_openblas_set_num_threads", "scipy_openblas_get_num_threads"),
    ("openblas_set_num_threads64_", "openblas_get_num_threads64_"),
    ("openblas_set_num_threads64", "openblas_get_num_threads64"),
    ("MKL_Set_Num_Threads", "MKL_Get_Max_Threads"),
    ("bli_thread_set_num_threads", "bli_thread_get_num_threads"),
)
_LIB_NAMES = ("openblas", "mkl_rt", "libblis")

_lock = threading.Lock()
_depth = 0                       # open single_threaded regions, all threads together
_saved: list[int] = []           # each library's count before the outermost region (restored after it)
_controls: list[_Control] | None = None


def _reset_lock_in_child() -> None:
    # A thread that held the lock at fork() does not exist in the child: the child needs a free lock. Its open
    # regions stay counted, so the child stays pinned (deterministic) rather than restoring too early.
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_lock_in_child)


def _library_paths() -> list[str]:
    """Files of the loaded BLAS libraries: threadpoolctl's list (every platform) together with the ones mapped
    into this process (Linux), so that an older threadpoolctl that does not know a library's name (NumPy's
    scipy-openblas wheels) misses nothing."""
    paths: set[str] = set()
    try:
        tpc = importlib.import_module("threadpoolctl")
        paths.update(str(d["filepath"]) for d in tpc.threadpool_info() if d.get("user_api") == "blas")
    except ImportError:
        pass
    try:
        with open("/proc/self/maps") as f:
            paths.update(line.split()[-1] for line in f
                         if ".so" in line and any(n in line.lower() for n in _LIB_NAMES))
    except OSError:
        pass
    return sorted(paths)


def _find_controls() -> list[_Control]:
    # The library's own process-wide setters, not threadpoolctl's: threadpoolctl >= 3.6 ignores a call from any
    # thread but the first one that set an OpenBLAS limit, and the regions here may open in any thread.
    out: list[_Control] = []
    for path in _library_paths():
        if not os.path.isfile(path):
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for set_sym, get_sym in _SYMBOLS:
            setter, getter = getattr(lib, set_sym, None), getattr(lib, get_sym, None)
            if setter is not None and getter is not None:
                # BLIS counts in dim_t (64-bit in its usual builds); OpenBLAS and MKL in int
                count = ctypes.c_int64 if set_sym.startswith("bli_") else ctypes.c_int
                setter.argtypes, setter.restype, getter.restype = [count], None, count
                out.append((getter, setter))
                break
    return out


def _libraries(refresh: bool = False) -> list[_Control]:
    """The loaded BLAS libraries, found once (NumPy's is loaded with NumPy); ``refresh`` looks again. Under
    the lock."""
    global _controls
    if _controls is None or refresh:
        found = _find_controls()
        if _depth and len(found) != len(_controls or ()):
            return _controls or []  # a region is open: keep the list whose counts it saved
        _controls = found
    return _controls


def _enter() -> None:
    global _depth
    with _lock:
        if _depth == 0:
            libs = _libraries()
            _saved[:] = [int(get()) for get, _ in libs]
            for (_, put), n in zip(libs, _saved):
                if n != 1:
                    put(1)
        _depth += 1


def _exit() -> None:
    global _depth
    with _lock:
        _depth -= 1
        if _depth == 0:
            for (_, put), n in zip(_libraries(), _saved):
                if n != 1:
                    put(n)


@contextlib.contextmanager
def single_threaded() -> Iterator[None]:
    """Context manager: every BLAS library runs one thread inside; nestable and thread-safe.

    The counts in effect before the outermost region (of all threads) are restored when it closes, also
    when the body raises.
    """
    _enter()
    try:
        yield
    finally:
        _exit()


def matmul(a: Any, b: Any) -> Any:
    """``a @ b`` with BLAS single-threaded: the same bits whatever the BLAS thread count.

    Every float GEMM on fpsim's training path goes through here (``tests/test_blas_threads.py`` checks that no
    ``@`` is left outside it).
    """
    _enter()
    try:
        return a @ b
    finally:
        _exit()


def get_threads() -> int | None:
    """The BLAS thread count outside fpsim's single-threaded regions (the first library's); None if no
    controllable BLAS library is loaded."""
    with _lock:
        if _depth:
            return _saved[0] if _saved else None
        libs = _libraries()
        return int(libs[0][0]()) if libs else None


def set_threads(n: int) -> bool:
    """Set every loaded BLAS library to ``n`` threads; True if one was found.

    Inside an open :func:`single_threaded` region the count applies once the region closes (the GEMMs in it
    stay single-threaded).
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"BLAS thread count must be an int, got {type(n).__name__} {n!r}")
    if n < 1:
        raise ValueError(f"BLAS thread count must be >= 1, got {n}")
    with _lock:
        libs = _libraries(refresh=True)
        if _depth:
            _saved[:] = [int(n)] * len(libs)
        else:
            for _, put in libs:
                put(int(n))
        return bool(libs)
