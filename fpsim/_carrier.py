"""The float carrier: how every numbers-layer function reads its input (shared by `rounding` and `bits`).

Values travel as native-order float32/float64 NumPy arrays holding exact values ("carriers"). This module is
the one input rule that turns what a caller passes (NumPy arrays of any float, integer or ml_dtypes kind, Python
and NumPy scalars, ints/Fractions/Decimals held exactly, torch/JAX/array-API objects through `_interop`) into a
carrier without rounding, refusing what it cannot hold exactly. It also fixes the block size that the
rounding and bit-codec loops share.

Where it sits (the foundation is a line; each module imports only those before it)::

    _names, _checks, _fpenv  ->  formats  ->  _interop  ->  _carrier  ->  _exact  ->  rounding  ->  bits  ->  _grid

Its names carry no underscore because they are shared on purpose; the module itself is private.

>>> a, scalar = as_float_array([1, 2.5])
>>> a.dtype.name, scalar
('float64', False)
"""

from __future__ import annotations

import decimal
import fractions
import math
import sys
from typing import Any

import numpy as np

from ._interop import host_array

__all__ = ["BLOCK", "MAX_EXACT_INT", "EXACT_HINT", "exact_value", "exact_float", "object_to_float", "refuse_masked",
           "widening_table", "as_float_array"]

BLOCK = 1 << 16
"""Elements per block of the entry points that work block by block (`bits.to_bits`, `bits.from_bits`,
`rounding.analyze`): bounds their temporaries to a few MiB. Even, so that SR assigns every element the random
word one round() call would."""

MAX_EXACT_INT = 2**53
EXACT_HINT = " (fpsim.round rounds an int, Fraction or Decimal scalar exactly)"


def exact_value(v: object) -> fractions.Fraction | float | None:
    """The exact value of an int (not bool), Fraction or Decimal as a Fraction (a float for a
    non-finite Decimal); None for anything else."""
    if isinstance(v, (bool, np.bool_, np.timedelta64)):  # timedelta64 subclasses np.signedinteger
        return None
    if isinstance(v, (int, np.integer)):
        return fractions.Fraction(int(v))
    if isinstance(v, fractions.Fraction):
        return v
    if isinstance(v, decimal.Decimal):
        if v.is_nan():
            return math.nan
        if v.is_infinite():
            return -math.inf if v.is_signed() else math.inf
        if v.is_zero():
            return -0.0 if v.is_signed() else 0.0
        # Decimal('1e999999999') would be a billion-digit integer. Every format lies inside
        # (10**-400, 10**400) with its smallest subnormal above 2 * 10**-400, so a value beyond rounds
        # in every mode exactly as the bound does.
        sign = -1 if v.is_signed() else 1
        if v.adjusted() > 400:
            return fractions.Fraction(sign * 10**400)
        if v.adjusted() < -400:
            return fractions.Fraction(sign, 10**400)
        return fractions.Fraction(v)
    return None


def exact_float(q: fractions.Fraction | float) -> float | None:
    """``q`` as a float64 when that is exact, else None."""
    if isinstance(q, float):
        return q
    try:
        f = q.numerator / q.denominator  # int true division: correctly rounded
    except OverflowError:
        return None
    return f if fractions.Fraction(f) == q else None


def object_to_float(a: np.ndarray, name: str) -> np.ndarray:
    """An object array of floats, ints, Fractions and Decimals as float64, exactly or not at all."""
    out = np.empty(a.shape, dtype=np.float64)
    flat = out.reshape(-1)
    for i, v in enumerate(a.reshape(-1)):
        if isinstance(v, (float, np.floating)) and not isinstance(v, np.longdouble):
            flat[i] = v
            continue
        q = exact_value(v)
        if q is None:
            raise TypeError(f"{name} must be a real number or array of them, got {type(v).__name__}: {v!r}")
        f = exact_float(q)
        if f is None:
            raise ValueError(f"{name}: {v!r} cannot be held exactly in float64{EXACT_HINT}")
        flat[i] = f
    return out


def refuse_masked(x: object, name: str) -> None:
    """Masked arrays are refused rather than honoured: every result and reduction would need a mask rule
    of its own, and dropping the mask (what np.asarray does) silently rounds the hidden values as data."""
    ma = sys.modules.get("numpy.ma")  # no masked array can exist before numpy.ma is imported
    if ma is not None and isinstance(x, ma.MaskedArray):
        raise TypeError(f"{name}: masked arrays are not supported; pass {name}.filled(value) or {name}.compressed()")


_WIDEN: dict[np.dtype[Any], np.ndarray] = {}


def widening_table(dt: np.dtype[Any]) -> np.ndarray:
    """float64 value of every code of an 8-bit ml_dtypes type, as ml_dtypes itself widens it (so the table
    gives exactly its bits, NaNs included)."""
    t = _WIDEN.get(dt)
    if t is None:
        t = _WIDEN[dt] = np.arange(256, dtype=np.uint8).view(dt).astype(np.float64)
    return t


def as_float_array(x: Any, name: str = "x") -> tuple[np.ndarray, bool]:
    """Convert input to a native-order float32 or float64 array without rounding.

    Returns (array, was_scalar). The caller's object is never written to.
    """
    scalar = np.isscalar(x)
    if isinstance(x, (bool, np.bool_)):
        raise TypeError(f"{name} must be numeric, got a bool: {x!r}")
    refuse_masked(x, name)
    if isinstance(x, (str, bytes, bytearray)):
        raise TypeError(f"{name} must be numeric, got {type(x).__name__}: {x!r}")
    if isinstance(x, (complex, np.complexfloating)):
        raise TypeError(f"{name} must be real, got a complex value: {x!r}")
    if not isinstance(x, np.ndarray):  # torch, JAX, CuPy, array API, DLPack: exactly, CPU only (_interop)
        x = host_array(x, name)
    if not isinstance(x, np.ndarray) and hasattr(x, "__array__") and not isinstance(x, (list, tuple)):
        x = np.asarray(x)
    a = np.asarray(x)
    k = a.dtype.kind
    if k == "f":
        if a.dtype.itemsize > 8:
            raise TypeError(f"{name}: {a.dtype} input is not supported (float16, float32, float64 are)")
        if a.dtype.itemsize in (4, 8):  # float32/float64 of either byte order: native order, same width
            return a.astype(a.dtype.newbyteorder("="), copy=False), scalar
        return a.astype(np.float64), scalar  # float16: exact
    if k == "V":
        if a.dtype.names is not None:  # a structured array would be read as its first field
            raise TypeError(f"{name} must be a real number or array of them, got structured dtype {a.dtype}")
        # ml_dtypes types (kind 'V' in NumPy): every one widens exactly to float64.
        try:
            if a.dtype.itemsize == 1 and a.size >= 4096:  # 8-bit types: a 256-entry table, ~3x ml_dtypes' cast
                return widening_table(a.dtype)[a.view(np.uint8)], scalar
            return a.astype(np.float64), scalar
        except (TypeError, ValueError):
            raise TypeError(f"{name}: cannot convert dtype {a.dtype} to float") from None
    if k in "iu":
        f = a.astype(np.float64)
        if a.size and np.iinfo(a.dtype).max > MAX_EXACT_INT:
            lim = a.dtype.type(MAX_EXACT_INT)  # compare as integers: exact
            big = (a > lim) | (a < -lim) if k == "i" else a > lim
            if np.any(big):
                ab, fb = a[big], f[big]
                # exact iff the float64 converts back to the same integer; one at or past the type's
                # range (2**63, 2**64 after rounding up) cannot equal it
                ok = (fb < 2.0**63) & (fb >= -(2.0**63)) if k == "i" else fb < 2.0**64
                back = np.zeros_like(ab)
                back[ok] = fb[ok].astype(a.dtype)
                inexact = ~ok | (back != ab)
                if np.any(inexact):
                    bad = int(ab[inexact][0])
                    raise ValueError(f"{name}: integer {bad} exceeds 2**53 in magnitude and cannot be held exactly "
                                     f"in float64{EXACT_HINT}")
        return f, scalar
    if k == "O":
        return object_to_float(a, name), scalar
    if k == "b":
        raise TypeError(f"{name} must be numeric, got a boolean array")
    if k == "c":
        raise TypeError(f"{name} must be real, got dtype {a.dtype}")
    raise TypeError(f"{name} must be a real number or array of them, got dtype {a.dtype}")
