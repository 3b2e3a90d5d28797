"""Turn arrays from other libraries into NumPy float64 carriers, exactly (through fpsim._interop)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._interop import host_array
from ..rounding import _as_float_array

__all__: list[str] = []


def to_float64(x: Any, name: str) -> tuple[np.ndarray, np.dtype]:
    """``x`` as a float64 array holding exactly the same values, and the dtype it arrived with."""
    if isinstance(x, (bool, np.bool_, str, bytes, complex, np.complexfloating)):
        a, _ = _as_float_array(x, name)  # raises the foundation's TypeError
    # Unlike the core entry points, which refuse device arrays, the assertion helpers copy them to the
    # host (documented in fpsim.testing): they return no array, and checking a GPU kernel is their purpose.
    arr = np.asanyarray(host_array(x, name, to_host=True))  # asanyarray: a masked array stays one (refused)
    src = arr.dtype
    # Widening is exact; NumPy still warns about NaN in casts from some ml_dtypes types.
    with np.errstate(invalid="ignore", over="ignore"):
        a, _ = _as_float_array(arr, name)
        return np.asarray(a, dtype=np.float64), src
