"""Same bits whatever the thread's flush mode: fpsim's entry points run with IEEE subnormals.

fpsim computes on float32/float64 carriers whose subnormals must stay subnormal. A process can switch
the calling thread's FPU to flush-to-zero (FTZ: subnormal results become 0) and denormals-are-zero
(DAZ: subnormal inputs read as 0): ``torch.set_flush_denormal(True)`` does, and so does loading any
library built with ``-ffast-math``. NumPy and Python floats then give different bits, silently.

:func:`ieee_mode` wraps a public entry point: a two-operation probe tells whether the thread flushes
(the fast path: nothing else happens); if it does, the flush controls are cleared for the call and the
caller's mode is restored afterwards, also when the call raises. Without the C helper (``_cfpenv``,
built at install time) a flushing thread gets :class:`FloatingPointError` naming the cause and the fix,
never a different result. docs/fp-environment.md explains the choice.

Threads: the FPU mode is per thread. Threads that fpsim starts (the rounding pool) are created inside a
wrapped call, so they inherit the cleared mode (Linux copies the creating thread's FP control register).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import struct
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar, cast

_cfpenv: Any
try:  # built at install time (setup.py); optional like the rounding kernel. importlib, not "from . import":
    # the latter makes type checkers import the package (fpsim/__init__) from formats.py, a cycle
    _cfpenv = importlib.import_module(f"{__package__}._cfpenv")
except ImportError:  # pragma: no cover - exercised where no compiler was available
    _cfpenv = None

__all__ = ["FTZ", "DAZ", "FZ16", "IEEEMode", "flush_flags", "ieee_mode", "is_ieee", "set_flush_flags"]

FTZ, DAZ, FZ16 = 1, 2, 4  # the C helper's flag bits (FZ16: aarch64 half precision)

# Operands live in module globals so that nothing folds the probe at compile time. Under FTZ the
# product (a subnormal) is flushed to 0; under DAZ the input reads as 0 (and so does the comparison).
# The smallest subnormal is built from its bits: a literal 5e-324 compiled (into the .pyc) by a thread
# that flushes would be parsed as 0.0.
_TINY: float = struct.unpack("<d", struct.pack("<Q", 1))[0]
_ONE = 1.0

F = TypeVar("F", bound=Callable[..., Any])

_REFUSAL = (
    "{name}: this thread's FPU flushes subnormals to zero (FTZ/DAZ is set in this process, e.g. by "
    "torch.set_flush_denormal(True) or by a library built with -ffast-math), which would change fpsim's "
    "results silently, and {why}. Fix: turn the mode off around fpsim calls (torch.set_flush_denormal(False)), "
    "or reinstall fpsim where a C compiler is available so that it can clear and restore the mode itself."
)


def is_ieee() -> bool:
    """Whether the calling thread keeps subnormals (neither FTZ nor DAZ is on). Pure Python, ~30 ns."""
    return not _TINY * _ONE == 0.0


def _helper() -> Any:
    c = _cfpenv
    return c if c is not None and c.SUPPORTED else None


def flush_flags() -> int:
    """The calling thread's flush flags (``FTZ | DAZ | FZ16`` bits) as the C helper reads them.

    Raises
    ------
    OSError
        When the C helper is not built or the platform is neither x86 nor aarch64.
    """
    c = _helper()
    if c is None:
        raise OSError("fpsim._cfpenv (the FTZ/DAZ control) is not available in this installation")
    return int(c.get())


def set_flush_flags(flags: int) -> int:
    """Set the calling thread's flush flags; returns the previous ones (for tests and for restoring)."""
    c = _helper()
    if c is None:
        raise OSError("fpsim._cfpenv (the FTZ/DAZ control) is not available in this installation")
    return int(c.set(flags))


class IEEEMode:
    """``with IEEEMode("what"):`` runs a block with IEEE subnormals (see :func:`ieee_mode`)."""

    __slots__ = ("_name", "_local")

    def __init__(self, name: str = "fpsim") -> None:
        self._name = name
        # one stack of saved modes per thread: the same instance may be nested or shared between threads
        self._local = threading.local()

    def _stack(self) -> list[int | None]:
        st: list[int | None] | None = getattr(self._local, "stack", None)
        if st is None:
            st = self._local.stack = []
        return st

    def __enter__(self) -> IEEEMode:
        self._stack().append(None if is_ieee() else _clear(self._name))
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        prev = self._stack().pop()
        if prev is not None:
            _cfpenv.set(prev)


def _clear(name: str) -> int:
    """Clear the flush controls of this thread (it flushes now); returns the caller's flags."""
    c = _helper()
    if c is None:
        why = ("fpsim's FTZ/DAZ control (the C extension fpsim._cfpenv) was not built in this installation"
               if _cfpenv is None else "fpsim cannot change the FPU mode on this platform")
        raise FloatingPointError(_REFUSAL.format(name=name, why=why))
    prev = int(c.set(0))
    if not is_ieee():  # a mode this helper does not know: refuse rather than differ
        c.set(prev)
        raise FloatingPointError(_REFUSAL.format(name=name, why="clearing FTZ/DAZ did not restore IEEE subnormals"))
    return prev


def _call_ieee(func: Callable[..., Any], name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    prev = _clear(name)
    try:
        return func(*args, **kwargs)
    finally:
        _cfpenv.set(prev)


def _wrap_function(func: Callable[..., Any], name: str) -> Callable[..., Any]:
    if getattr(func, "__fpsim_ieee__", False):
        return func

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _TINY * _ONE == 0.0:  # the thread flushes subnormals (see is_ieee)
            return _call_ieee(func, name, args, kwargs)
        return func(*args, **kwargs)

    wrapper.__fpsim_ieee__ = True  # type: ignore[attr-defined]
    return wrapper


# Class attributes the class decorator leaves alone: object-protocol hooks that compute nothing.
_SKIP = frozenset({
    "__new__", "__init_subclass__", "__class_getitem__", "__getattr__", "__getattribute__", "__setattr__",
    "__delattr__", "__dir__", "__reduce__", "__reduce_ex__", "__getstate__", "__setstate__", "__subclasshook__",
})


def _wrap_class(cls: type) -> type:
    for attr, val in list(vars(cls).items()):
        dunder = attr.startswith("__") and attr.endswith("__")
        if (attr.startswith("_") and not dunder) or attr in _SKIP:
            continue
        qual = f"{cls.__module__}.{cls.__qualname__}.{attr}"
        if isinstance(val, (staticmethod, classmethod)):
            setattr(cls, attr, type(val)(_wrap_function(val.__func__, qual)))
        elif isinstance(val, property):
            fget = None if val.fget is None else _wrap_function(val.fget, qual)
            fset = None if val.fset is None else _wrap_function(val.fset, qual)
            setattr(cls, attr, property(fget, fset, val.fdel, val.__doc__))
        elif inspect.isfunction(val):
            setattr(cls, attr, _wrap_function(val, qual))
    return cls


def ieee_mode(obj: F) -> F:
    """Run a function (or every public method and operator of a class) with IEEE subnormals.

    When the calling thread flushes subnormals (FTZ/DAZ), the flush controls are cleared for the call and
    the caller's mode is restored afterwards, also on exceptions; without the C helper the call raises
    :class:`FloatingPointError` instead. In the normal mode the wrapper costs one multiply and compare.
    ``functools.wraps`` keeps the name, docstring and signature, so the API and its docs are unchanged.
    Applied to a class, methods whose names start with one underscore are left alone (internal helpers
    run inside a wrapped call).

    Examples
    --------
    >>> from fpsim._fpenv import ieee_mode
    >>> @ieee_mode
    ... def half(x: float) -> float:
    ...     return x * 0.5
    >>> half(2.0**-1073) == 2.0**-1074
    True
    """
    if isinstance(obj, type):
        return cast(F, _wrap_class(obj))
    name = f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"
    return cast(F, _wrap_function(obj, name))
