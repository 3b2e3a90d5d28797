"""Operand conversion for the matrix units: A, B and C as values of a model's formats (float64 carriers).

Shared by the executor (:mod:`fpsim.mma.gemm`) and the units with an executor of their own
(:mod:`fpsim.mma.blockscaled`), below both.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._fpenv import ieee_mode
from .._names import parse_name
from ..formats import Format, tf32
from ..rounding import _as_float_array, _first_non_value
from ..rounding import round as _fround

__all__ = ["EXACT_INPUT", "convert_c", "convert_inputs"]

#: The `input_rounding` that refuses values not representable in the input format.
EXACT_INPUT = "exact"
_INPUT_ROUNDINGS = ("rne", "rtz", EXACT_INPUT)


@ieee_mode
def convert_inputs(x: Any, fmt: Format, input_rounding: str | None, name: str) -> np.ndarray:
    """Values of `x` in `fmt` as float64.

    ``input_rounding``: ``None`` = ``"rtz"`` for tf32 (what A100 does with fp32 registers: the low 13
    fraction bits are dropped) and ``"rne"`` otherwise (CUDA's ``__float2half``/``__float2bfloat16``
    and saturating ``__nv_cvt_float_to_fp8`` round to nearest); ``"rtz"``/``"rne"`` force a mode;
    ``"exact"`` raises ``ValueError`` if a value is not representable.

    Examples
    --------
    >>> from fpsim.formats import fp16
    >>> convert_inputs([1.0, 1 + 2.0**-12], fp16, None, "a").tolist()
    [1.0, 1.0]
    """
    arr, _ = _as_float_array(x, name)
    if arr.dtype != np.float32:  # float32 is rounded as it is (same values, half the memory traffic)
        arr = np.asarray(arr, dtype=np.float64)
    if input_rounding is None:
        mode = "rtz" if fmt == tf32 else "rne"
    else:
        mode = parse_name(input_rounding, _INPUT_ROUNDINGS, "input_rounding")
    overflow = "saturate" if fmt.width <= 8 else "ieee"
    if mode == EXACT_INPUT:
        v = _first_non_value(arr, fmt)
        if v is not None:
            raise ValueError(f"{name} holds {v!r}, not exactly representable in {fmt.name}; "
                             "pass input_rounding='rne' or 'rtz' to convert")
        return np.asarray(_fround(arr, fmt, "rne"), dtype=np.float64)
    return np.asarray(_fround(arr, fmt, "rtz" if mode == "rtz" else "rne", overflow=overflow), dtype=np.float64)


def convert_c(c: Any, fmt: Format, shape: tuple[int, ...]) -> np.ndarray:
    """C rounded (RNE) to `fmt` and broadcast to the output shape, as float64 (zeros when `c` is None)."""
    if c is None:
        return np.zeros(shape)
    arr = np.asarray(_as_float_array(c, "c")[0], dtype=np.float64)
    arr = np.asarray(_fround(arr, fmt, "rne"), dtype=np.float64)
    try:
        return np.ascontiguousarray(np.broadcast_to(arr, shape), dtype=np.float64)
    except ValueError:
        raise ValueError(f"c of shape {arr.shape} does not broadcast to the output shape {shape}") from None
