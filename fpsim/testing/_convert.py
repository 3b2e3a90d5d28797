"""Turn arrays from other libraries into NumPy float64 carriers, exactly (no rounding on the way)."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from ..rounding import _as_float_array

__all__: list[str] = []


def _from_torch(t: Any) -> np.ndarray:
    torch = sys.modules["torch"]  # the object exists, so torch is imported already
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.is_complex():
        raise TypeError(f"expected real values, got a complex torch tensor ({t.dtype})")
    if t.dtype.is_floating_point and t.dtype not in (torch.float32, torch.float64):
        # bfloat16, float16 and the float8 types all widen to float32 exactly.
        try:
            t = t.float()
        except (RuntimeError, TypeError) as e:
            raise TypeError(f"cannot widen torch dtype {t.dtype} to float32: {e}") from None
    if t.dtype == torch.bool:
        raise TypeError("expected numeric values, got a boolean torch tensor")
    a: np.ndarray = t.resolve_conj().resolve_neg().numpy()
    return a


def to_numpy(x: Any) -> np.ndarray:
    """A NumPy array for NumPy, ml_dtypes, torch, CuPy, JAX or DLPack input, without rounding.

    torch tensors of narrow float types (bfloat16, float16, float8) are widened to float32, which
    is exact; device arrays are copied to the host.
    """
    if isinstance(x, np.ndarray):
        return x
    root = type(x).__module__.split(".")[0]
    if root == "torch" and hasattr(x, "detach"):
        return _from_torch(x)
    if root == "cupy" and hasattr(x, "get"):
        return np.asarray(x.get())
    if hasattr(x, "__array__") or not hasattr(x, "__dlpack__"):
        try:
            return np.asarray(x)
        except (TypeError, ValueError, RuntimeError):
            if not hasattr(x, "__dlpack__"):
                raise
    try:
        return np.from_dlpack(x)
    except (TypeError, ValueError, RuntimeError, BufferError) as e:
        raise TypeError(f"cannot convert {type(x).__name__} to a NumPy array: {e}") from None


def to_float64(x: Any, name: str) -> tuple[np.ndarray, np.dtype]:
    """``x`` as a float64 array holding exactly the same values, and the dtype it arrived with."""
    if isinstance(x, (bool, np.bool_, str, bytes, complex, np.complexfloating)):
        a, _ = _as_float_array(x, name)  # raises the foundation's TypeError
    arr = to_numpy(x) if not isinstance(x, (int, float, np.generic, list, tuple)) else np.asarray(x)
    src = arr.dtype
    # Widening is exact; NumPy still warns about NaN in casts from some ml_dtypes types.
    with np.errstate(invalid="ignore", over="ignore"):
        a, _ = _as_float_array(arr, name)
        return np.asarray(a, dtype=np.float64), src
