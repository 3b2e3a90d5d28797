"""Argument checks shared by the configuration objects of the upper layers (nn, amp, train).

One wording everywhere: ``TypeError`` for a value of the wrong kind, ``ValueError`` for a value out of
range, each naming the argument and the value. ``bool`` is never taken for a number (``True`` is an
``int`` in Python, but ``steps=True`` is a mistake). Layer 0: imports nothing from fpsim.

>>> check_int(3, "steps", lo=1)
3
>>> check_real(0.5, "min_lr_frac", lo=0.0, hi=1.0)
0.5
>>> check_int(0, "steps", lo=1)
Traceback (most recent call last):
...
ValueError: steps must be an int >= 1, got 0
"""

from __future__ import annotations

import math
import numbers
from typing import Any, cast

import numpy as np

__all__ = ["check_bool", "check_int", "check_out", "check_real"]


def _range_text(lo: float | None, hi: float | None, lo_open: bool, hi_open: bool) -> str:
    parts = []
    if lo is not None:
        parts.append(f"{'>' if lo_open else '>='} {lo}")
    if hi is not None:
        parts.append(f"{'<' if hi_open else '<='} {hi}")
    return " and ".join(parts)


def check_int(value: object, what: str, *, lo: int | None = None, hi: int | None = None) -> int:
    """``value`` as a Python ``int`` (NumPy integers accepted), with ``lo <= value <= hi``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what} must be an int, got {type(value).__name__}: {value!r}")
    v = int(value)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise ValueError(f"{what} must be an int {_range_text(lo, hi, False, False)}, got {v!r}")
    return v


def check_real(value: object, what: str, *, lo: float | None = None, hi: float | None = None,
               lo_open: bool = False, hi_open: bool = False) -> float:
    """``value`` as a finite Python ``float`` within the bounds (``lo_open``/``hi_open``: strict)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Real, np.floating, np.integer)):
        raise TypeError(f"{what} must be a real number, got {type(value).__name__}: {value!r}")
    try:
        v = float(value)
    except OverflowError:  # an int or Fraction beyond the float range
        v = math.inf if cast(Any, value) > 0 else -math.inf
    rng = _range_text(lo, hi, lo_open, hi_open)
    bad = not math.isfinite(v)
    if lo is not None:
        bad = bad or (v <= lo if lo_open else v < lo)
    if hi is not None:
        bad = bad or (v >= hi if hi_open else v > hi)
    if bad:
        raise ValueError(f"{what} must be a finite number{' ' + rng if rng else ''}, got {value!r}")
    return v


def check_bool(value: object, what: str) -> bool:
    """``value`` as a Python ``bool`` (``numpy.bool_`` accepted; 0/1 and strings are not)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{what} must be a bool, got {type(value).__name__}: {value!r}")
    return bool(value)


def check_out(out: object, shape: tuple[int, ...], dtype: Any, what: str = "out") -> np.ndarray:
    """``out`` as the ndarray a function writes its result into, as NumPy ufuncs take ``out=``.

    It must be a writeable :class:`numpy.ndarray` of exactly `shape` and `dtype` (no casting: the
    result's bits are stored as they are); masked arrays and ``numpy.matrix`` raise ``TypeError``. It may
    be one of the inputs (in-place operation); callers read every input before they write.

    >>> import numpy as np
    >>> check_out(np.empty(3, np.float32), (3,), np.float32).shape
    (3,)
    >>> check_out(np.empty(3), (3,), np.float32)
    Traceback (most recent call last):
    ...
    ValueError: out has dtype float64; this result is float32 (pass an array of that dtype)
    """
    if not isinstance(out, np.ndarray):
        raise TypeError(f"{what} must be a numpy.ndarray, got {type(out).__name__}: {out!r}")
    # Subclasses whose elements do not behave as plain ones: a masked array's mask would hide (or keep
    # hiding) results written under it, and a matrix is always 2-D (reshape(-1) gives (1, n)).
    if isinstance(out, np.ma.MaskedArray):
        raise TypeError(f"{what} must be a plain numpy.ndarray, got a masked array (its mask would be "
                        f"ignored); pass {what}.data, or a new array and apply the mask afterwards")
    if isinstance(out, np.matrix):
        raise TypeError(f"{what} must be a plain numpy.ndarray, got a numpy.matrix (always 2-D); pass "
                        f"np.asarray({what})")
    want = np.dtype(dtype)
    if out.dtype != want:
        raise ValueError(f"{what} has dtype {out.dtype}; this result is {want} (pass an array of that dtype)")
    if out.shape != tuple(shape):
        raise ValueError(f"{what} has shape {out.shape}; this result has shape {tuple(shape)}")
    if not out.flags.writeable:
        raise ValueError(f"{what} is read-only")
    return out
