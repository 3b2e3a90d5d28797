"""Same bits whatever floating-point state the caller left: fpsim's entry points run in a state of their own.

fpsim computes on float32/float64 carriers with NumPy and Python arithmetic, whose results depend on three
pieces of state that belong to the calling thread (or context), not to fpsim:

* the flush controls: FTZ (subnormal results become 0) and DAZ (subnormal inputs read as 0), set by
  ``torch.set_flush_denormal(True)`` or by loading any library built with ``-ffast-math``;
* the rounding mode: a library may leave ``fesetround(FE_UPWARD)`` (or ``FE_DOWNWARD``, ``FE_TOWARDZERO``)
  set, and every float operation then rounds that way (``1.0 / 3.0`` changes its last bit);
* NumPy's error state (``np.seterr(all="raise")``) and the warnings filters (``filterwarnings = error``):
  a strict caller turned an overflow that fpsim handles into a FloatingPointError or an exception.

:func:`ieee_mode` wraps a public entry point. A probe of three float operations on module globals tells
whether the thread flushes or rounds in a directed mode (the fast path: nothing else happens); if it does,
the flush controls are cleared and round-to-nearest is set for the call through the C helper
(``_cfpenv``, built at install time), and the caller's state is restored afterwards, also when the call
raises. Without the C helper such a thread gets :class:`FloatingPointError` naming the cause and the fix,
never a different result. NumPy's error state is "ignore all" for the call (a context variable swap, the
caller's state is back afterwards): what fpsim means to report, it reports with its own warning classes.
docs/fp-environment.md explains the choices.

Threads: the FPU mode is per thread. Threads that fpsim starts (the compiled kernels' pools) are created
inside a wrapped call, so they inherit the cleared mode and round-to-nearest (Linux copies the creating
thread's FP control registers); they run no NumPy code, so the error state does not matter there.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import inspect
import struct
import sys
import threading
from collections.abc import Callable
from types import ModuleType, TracebackType
from typing import Any, TypeVar, cast

import numpy as np

_cfpenv: Any
try:  # built at install time (setup.py); optional like the rounding kernel. importlib, not "from . import":
    # the latter makes type checkers import the package (fpsim/__init__) from formats.py, a cycle
    _cfpenv = importlib.import_module(f"{__package__}._cfpenv")
except ImportError:  # pragma: no cover - exercised where no compiler was available
    _cfpenv = None

__all__ = ["FTZ", "DAZ", "FZ16", "IEEEMode", "flush_flags", "ieee_mode", "install_import_guard", "is_ieee",
           "rounding_mode", "set_flush_flags", "set_rounding_mode"]

FTZ, DAZ, FZ16 = 1, 2, 4  # the C helper's flag bits (FZ16: aarch64 half precision)

# Operands live in module globals so that nothing folds the probe at compile time. Under FTZ the
# product (a subnormal) is flushed to 0; under DAZ the input reads as 0 (and so does the comparison).
# The smallest subnormal is built from its bits: a literal 5e-324 compiled (into the .pyc) by a thread
# that flushes would be parsed as 0.0.
_TINY: float = struct.unpack("<d", struct.pack("<Q", 1))[0]
_ONE = 1.0
# 2**-60 is far below half an ulp of 1.0 (2**-53): 1 + s rounds up to 1 + 2**-52 only in FE_UPWARD, 1 - s rounds
# down to 1 - 2**-53 only in FE_DOWNWARD and FE_TOWARDZERO, so 1 + s == 1 - s (both 1) only in round-to-nearest:
# one comparison tells it from the three directed modes (-1 - s moves only in FE_DOWNWARD: nothing to add).
_SMALL: float = struct.unpack("<d", struct.pack("<Q", (1023 - 60) << 52))[0]

# NumPy's error state lives in a context variable (NumPy >= 2): swapping in an "ignore all" state object made
# once costs ~0.1 us, np.errstate(all="ignore") ~1-4 us. Older NumPy: np.errstate (_np1_quiet).
_ERRVAR: Any = None
_IGNORE: Any = object()
try:
    _ERRVAR = importlib.import_module("numpy._core._ufunc_config")._extobj_contextvar
    with np.errstate(all="ignore"):
        _IGNORE = _ERRVAR.get()
except (ImportError, AttributeError):  # pragma: no cover - NumPy 1.x keeps it elsewhere: np.errstate then
    _ERRVAR = None


def _np1_quiet() -> Any:  # pragma: no cover - NumPy 1.x: enter np.errstate(all="ignore"), the token exits it
    tok = np.errstate(all="ignore")
    tok.__enter__()
    return tok


def _np1_reset(tok: Any) -> None:  # pragma: no cover
    tok.__exit__(None, None, None)


# bound once: the wrapper calls these directly (get: already quiet, i.e. nested in another fpsim call)
_err_get: Callable[[], Any] = _ERRVAR.get if _ERRVAR is not None else (lambda: None)
_err_quiet: Callable[[], Any] = functools.partial(_ERRVAR.set, _IGNORE) if _ERRVAR is not None else _np1_quiet
_err_reset: Callable[[Any], Any] = _ERRVAR.reset if _ERRVAR is not None else _np1_reset

F = TypeVar("F", bound=Callable[..., Any])

_REFUSAL_ROUNDING = (
    "{name}: this thread's rounding mode is not round-to-nearest (fesetround was called in this process, "
    "e.g. by another library, and left {mode}), which would change fpsim's results silently, and {why}. Fix: "
    "restore round-to-nearest around fpsim calls (fesetround(FE_TONEAREST)), or reinstall fpsim where a C "
    "compiler is available so that it can set and restore the mode itself."
)

_REFUSAL = (
    "{name}: this thread's FPU flushes subnormals to zero (FTZ/DAZ is set in this process, e.g. by "
    "torch.set_flush_denormal(True) or by a library built with -ffast-math), which would change fpsim's "
    "results silently, and {why}. Fix: turn the mode off around fpsim calls (torch.set_flush_denormal(False)), "
    "or reinstall fpsim where a C compiler is available so that it can clear and restore the mode itself."
)


def is_ieee() -> bool:
    """Whether the calling thread keeps subnormals (neither FTZ nor DAZ is on) and rounds to nearest.

    Pure Python, three float operations: the probe of every wrapped call.
    """
    return not (_TINY * _ONE == 0.0 or _ONE + _SMALL != _ONE - _SMALL)


def _nearest() -> bool:
    return _ONE + _SMALL == _ONE - _SMALL


def _helper() -> Any:
    c = _cfpenv
    return c if c is not None and c.SUPPORTED else None


def _required(c: Any, what: str) -> Any:
    """The helper, or OSError saying which control this installation lacks."""
    if c is None:
        raise OSError(f"fpsim._cfpenv (the {what} control) is not available in this installation")
    return c


def flush_flags() -> int:
    """The calling thread's flush flags (``FTZ | DAZ | FZ16`` bits) as the C helper reads them.

    Raises
    ------
    OSError
        When the C helper is not built or the platform is neither x86 nor aarch64.
    """
    return int(_required(_helper(), "FTZ/DAZ").get())


def set_flush_flags(flags: int) -> int:
    """Set the calling thread's flush flags; returns the previous ones (for tests and for restoring)."""
    return int(_required(_helper(), "FTZ/DAZ").set(flags))


def _round_helper() -> Any:
    c = _cfpenv
    return c if c is not None and bool(getattr(c, "ROUNDING", False)) else None


def rounding_mode() -> int:
    """The calling thread's rounding mode (C ``fegetround``: compare with ``fpsim._cfpenv.TONEAREST`` etc.).

    Raises
    ------
    OSError
        When the C helper is not built or the platform has no ``fenv.h`` rounding control.
    """
    return int(_required(_round_helper(), "rounding-mode").getround())


def set_rounding_mode(mode: int) -> int:
    """Set the calling thread's rounding mode (C ``fesetround``); returns the previous one (tests, restoring)."""
    return int(_required(_round_helper(), "rounding-mode").setround(mode))


class IEEEMode:
    """``with IEEEMode("what"):`` runs a block with IEEE subnormals (see :func:`ieee_mode`)."""

    __slots__ = ("_name", "_local")

    def __init__(self, name: str = "fpsim") -> None:
        self._name = name
        # one stack of saved modes per thread: the same instance may be nested or shared between threads
        self._local = threading.local()

    def _stack(self) -> list[_State]:
        st: list[_State] | None = getattr(self._local, "stack", None)
        if st is None:
            st = self._local.stack = []
        return st

    def __enter__(self) -> IEEEMode:
        fpu = None if is_ieee() else _enter(self._name)
        try:
            tok = _err_quiet()
        except BaseException:
            if fpu is not None:
                _leave(fpu)
            raise
        self._stack().append((fpu, tok))
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        fpu, tok = self._stack().pop()
        try:
            _err_reset(tok)
        finally:
            if fpu is not None:
                _leave(fpu)


_State = tuple[Any, Any]  # IEEEMode's saved state: (_enter's result or None, the error-state token)


def _enter(name: str) -> tuple[int | None, int | None]:
    """Clear FTZ/DAZ and set round-to-nearest where needed; returns what to restore: (flags, rounding mode)."""
    flags = _clear(name) if _TINY * _ONE == 0.0 else None
    try:
        mode = None if _nearest() else _to_nearest(name)
    except BaseException:
        if flags is not None:
            _cfpenv.set(flags)
        raise
    return flags, mode


def _leave(saved: tuple[int | None, int | None]) -> None:
    flags, mode = saved
    if mode is not None:
        _cfpenv.restoreround(mode)
    if flags is not None:
        _cfpenv.set(flags)


def _mode_name(c: Any) -> str:
    try:
        mode = int(c.getround())
    except Exception:  # no helper: the probe tells the direction
        return "FE_UPWARD" if _ONE + _SMALL != _ONE else "FE_DOWNWARD or FE_TOWARDZERO"  # see _SMALL
    names = {getattr(c, k, None): f"FE_{k}" for k in ("UPWARD", "DOWNWARD", "TOWARDZERO")}
    return names.get(mode, f"mode {mode:#x}")


def _to_nearest(name: str) -> int:
    """Set round-to-nearest in this thread (it rounds in a directed mode now); returns the caller's mode."""
    c = _round_helper()
    if c is None:
        why = ("fpsim's rounding-mode control (the C extension fpsim._cfpenv) was not built in this installation"
               if _cfpenv is None else "fpsim cannot change the rounding mode on this platform")
        raise FloatingPointError(_REFUSAL_ROUNDING.format(name=name, mode=_mode_name(_cfpenv), why=why))
    # nearest() saves and sets every unit's rounding control (x86: the x87 word and MXCSR, which a library may
    # have set apart), so restoreround gives the caller back exactly the state it had
    prev = int(c.nearest())
    if not _nearest():  # a mode this helper does not control: refuse rather than differ
        c.restoreround(prev)
        raise FloatingPointError(_REFUSAL_ROUNDING.format(
            name=name, mode=_mode_name(c), why="setting FE_TONEAREST did not restore round-to-nearest"))
    return prev


def _clear(name: str) -> int:
    """Clear the flush controls of this thread (it flushes now); returns the caller's flags."""
    c = _helper()
    if c is None:
        why = ("fpsim's FTZ/DAZ control (the C extension fpsim._cfpenv) was not built in this installation"
               if _cfpenv is None else "fpsim cannot change the FPU mode on this platform")
        raise FloatingPointError(_REFUSAL.format(name=name, why=why))
    prev = int(c.set(0))
    if _TINY * _ONE == 0.0:  # a mode this helper does not know: refuse rather than differ
        c.set(prev)
        raise FloatingPointError(_REFUSAL.format(name=name, why="clearing FTZ/DAZ did not restore IEEE subnormals"))
    return prev


def _call_ieee(func: Callable[..., Any], name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    saved = _enter(name)
    try:
        if _err_get() is _IGNORE:
            return func(*args, **kwargs)
        tok = _err_quiet()
        try:
            return func(*args, **kwargs)
        finally:
            _err_reset(tok)
    finally:
        _leave(saved)


def _wrap_function(func: Callable[..., Any], name: str) -> Callable[..., Any]:
    if getattr(func, "__fpsim_ieee__", False):
        return func

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        # the probe of is_ieee, inlined: the thread flushes subnormals or rounds in a directed mode
        if _TINY * _ONE == 0.0 or _ONE + _SMALL != _ONE - _SMALL:
            return _call_ieee(func, name, args, kwargs)
        if _err_get() is _IGNORE:  # nested in another fpsim call: NumPy is quiet already
            return func(*args, **kwargs)
        tok = _err_quiet()
        try:
            return func(*args, **kwargs)
        finally:
            _err_reset(tok)

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
    """Run a function (or every public method and operator of a class) in fpsim's floating-point state.

    When the calling thread flushes subnormals (FTZ/DAZ) or rounds in a directed mode, the flush controls
    are cleared and round-to-nearest is set for the call, and the caller's mode is restored afterwards, also
    on exceptions; without the C helper the call raises :class:`FloatingPointError` instead. NumPy's error
    state is "ignore all" for the call (the caller's np.seterr is back afterwards). In the normal state
    the wrapper costs three float operations and a context-variable swap (~0.2 us).
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


# -- imports -------------------------------------------------------------------------------------------------
# A module's body runs, and its source is compiled, in the importing thread's state: under FE_UPWARD the
# literal 2.0**-14 folds to 0x1.0000000000001p-14 and the NF4 table, GELU's constant and the arithmetic's
# limits came out wrong; compiled that way, the wrong constants were even written to the .pyc for later
# processes. fpsim/__init__ puts this finder first on sys.meta_path: it hands each fpsim submodule's loader
# to a wrapper that compiles and runs the module in fpsim's state.


class _GuardedLoader(importlib.abc.Loader):
    """Delegates to the real loader; runs ``exec_module`` (compile and module body) in fpsim's state."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def __getattr__(self, attr: str) -> Any:  # get_source, is_package, get_filename, resources...
        return getattr(self.loader, attr)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return cast("ModuleType | None", self.loader.create_module(spec))

    def exec_module(self, module: ModuleType) -> None:
        # introspection (inspect.getsource, importlib.resources, reload) sees the real loader from here on
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        _import_guarded(f"import {module.__name__}", self.loader.exec_module, module)

    def get_code(self, fullname: str) -> Any:
        """Compile in fpsim's state too (``python -m fpsim.cli`` runs the code runpy gets from here)."""
        return _import_guarded(f"import {fullname}", self.loader.get_code, fullname)


def _import_guarded(name: str, fn: Callable[[Any], Any], arg: Any) -> Any:
    try:
        saved = None if is_ieee() else _enter(name)
    except FloatingPointError:
        if not _nearest():  # a directed mode fpsim cannot leave: the constants would be wrong
            raise
        saved = None  # FTZ/DAZ without the helper: module bodies are flush-safe (docs), calls refuse
    try:
        tok = _err_quiet()
        try:
            return fn(arg)
        finally:
            _err_reset(tok)
    finally:
        if saved is not None:
            _leave(saved)


class _ImportGuard(importlib.abc.MetaPathFinder):
    """Finds fpsim submodules through the other finders and guards their loaders (see above)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def find_spec(self, fullname: str, path: Any, target: ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(self.prefix):
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or isinstance(finder, _ImportGuard) or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module") \
                and not isinstance(spec.loader, _GuardedLoader):
            spec.loader = _GuardedLoader(spec.loader)
        return cast("importlib.machinery.ModuleSpec", spec)


def install_import_guard(package: str) -> None:
    """Guard the imports of ``package``'s submodules (once per process; fpsim/__init__ calls it first)."""
    if not any(isinstance(f, _ImportGuard) and f.prefix == package + "." for f in sys.meta_path):
        sys.meta_path.insert(0, _ImportGuard(package + "."))
