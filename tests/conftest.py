"""Every test starts from the same process state, whatever ran before it (issue 24: order independence).

The autouse fixture below snapshots the global switches a test may change (fpsim's kernel switches and
thread counts, NumPy's error state and legacy random state, the working directory, the environment,
torch's quantized engine, thread count, default dtype and flush mode, the FPU's rounding and flush modes)
and puts them back after the test, pass or fail. pytest itself restores the warnings filters per test.

Random data comes from a generator made inside each test from a fixed seed (``np.random.default_rng(N)``),
or from the ``rng`` fixture, seeded from the test's own id: never from a generator shared at module level,
whose draws would depend on which tests ran before in the same worker.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import fpsim._fpenv as _fpenv

# (module, attribute) of every process-wide switch fpsim has; a test that flips one gets it back.
_SWITCHES = [
    ("fpsim.rounding", "use_c_kernel"),
    ("fpsim.rounding", "use_c_analyze"),
    ("fpsim.rounding", "max_threads"),
    ("fpsim.arith", "use_c_arith"),
    ("fpsim.accumulate", "use_c_sum"),
    ("fpsim.bits", "use_c_bits"),
    ("fpsim.mma.gemm", "use_c_gemm"),
    ("fpsim.amp.fused", "use_c_fma"),
]


try:  # the C library's rounding-mode controls: a test that leaves a directed mode set gets nearest back
    _libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
    _fegetround: Any = _libm.fegetround
    _fesetround: Any = _libm.fesetround
except (OSError, AttributeError):  # pragma: no cover - no C math library by that name
    _fegetround = _fesetround = None


def _torch_state() -> tuple[Any, ...] | None:
    torch = sys.modules.get("torch")  # only if a test imported it: never import torch for this
    if torch is None or not hasattr(torch, "backends"):
        return None
    try:
        engine = torch.backends.quantized.engine
    except Exception:  # pragma: no cover - a torch build without quantized engines
        engine = None
    return (engine, torch.get_num_threads(), torch.get_default_dtype(),
            torch.are_deterministic_algorithms_enabled())


def _restore_torch(state: tuple[Any, ...] | None) -> None:
    torch = sys.modules.get("torch")
    if state is None or torch is None:
        return
    engine, threads, dtype, deterministic = state
    if engine is not None and torch.backends.quantized.engine != engine:
        torch.backends.quantized.engine = engine
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    if torch.get_default_dtype() != dtype:
        torch.set_default_dtype(dtype)
    if torch.are_deterministic_algorithms_enabled() != deterministic:
        torch.use_deterministic_algorithms(deterministic)


@pytest.fixture(autouse=True)
def _fresh_process_state() -> Iterator[None]:
    import importlib

    mods = {name: importlib.import_module(name) for name, _ in _SWITCHES}
    switches = [(mods[m], a, getattr(mods[m], a)) for m, a in _SWITCHES]
    err = np.geterr()
    legacy_random = np.random.get_state()
    cwd = os.getcwd()
    environ = dict(os.environ)
    torch_state = _torch_state()
    try:
        flush: int | None = _fpenv.flush_flags()
    except OSError:  # no C helper here, or a platform it does not know: nothing to restore
        flush = None
    rounding_mode = _fegetround() if _fegetround is not None else None
    try:
        yield
    finally:
        for mod, attr, value in switches:
            setattr(mod, attr, value)
        np.seterr(**err)
        np.random.set_state(legacy_random)
        if os.getcwd() != cwd:
            os.chdir(cwd)
        if dict(os.environ) != environ:
            os.environ.clear()
            os.environ.update(environ)
        _restore_torch(torch_state)
        if flush is not None and _fpenv.flush_flags() != flush:
            _fpenv.set_flush_flags(flush)
        if rounding_mode is not None and _fegetround() != rounding_mode:
            _fesetround(rounding_mode)


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """A generator of the test's own, seeded from its id: the same draws in any order, on any worker."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
