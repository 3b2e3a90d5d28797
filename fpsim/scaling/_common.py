"""What the scaling functions share: argument checks, axis and block geometry (a block shape, the blocked view of
an array, a scale broadcast over its blocks) and the float32 input/output conventions.
"""

from __future__ import annotations

import math
from typing import Any, Union

import numpy as np

from ..rounding import _as_float_array


_F32 = np.float32
_FLT_MAX = np.float32(np.finfo(np.float32).max)

BlockLike = Union[int, tuple[int, ...], list[int]]  # noqa: UP007  (a runtime alias: needs Union on 3.10)


# --------------------------------------------------------------------------------------------------
# Validation helpers


def _check_int(name: str, v: Any, lo: int | None = None) -> int:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(v).__name__}: {v!r}")
    if lo is not None and v < lo:
        raise ValueError(f"{name} must be >= {lo}, got {v}")
    return int(v)


_MARGIN_MAX = 127
_FLT_MIN = np.float32(np.finfo(np.float32).tiny)  # 2**-126: the smallest scale whose reciprocal is finite


def _check_margin(margin: Any) -> int:
    """``margin`` as an int in [-127, 127]: ``2**margin`` is then a normal float32, so dividing by it is
    exact (TransformerEngine's ``/ powf(2, margin)``); beyond that the float32 divisor is inf or 0."""
    m = _check_int("margin", margin)
    if not -_MARGIN_MAX <= m <= _MARGIN_MAX:
        raise ValueError(f"margin must be an integer in [-{_MARGIN_MAX}, {_MARGIN_MAX}] (2**margin must be a "
                         f"normal float32), got {margin!r}")
    return m


def _check_real(name: str, v: Any, lo: float | None) -> float:
    """A real Python/NumPy number (not bool), not NaN, and >= ``lo`` when given."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {type(v).__name__}: {v!r}")
    f = float(v)
    if math.isnan(f) or (lo is not None and f < lo):
        raise ValueError(f"{name} must be a number >= {lo}, got {v!r}" if lo is not None
                         else f"{name} must not be NaN, got {v!r}")
    return f


def _check_scale(v: Any) -> np.float32:
    """A per-tensor scale for a scaling state machine: a finite positive number, as float32."""
    f = _check_real("scale", v, None)
    s: np.float32 = _F32(f) if abs(f) < float(_FLT_MAX) else _F32(np.inf)
    if not (np.isfinite(s) and s > 0):
        raise ValueError(f"scale must be a finite positive number (as float32), got {v!r}")
    return s


def _norm_axis(axis: Any, ndim: int) -> int:
    a = _check_int("axis", axis)
    if not -ndim <= a < ndim:
        raise ValueError(f"axis {a} is out of range for an array with {ndim} dimension(s)")
    return a % ndim


def _block_shape(shape: tuple[int, ...], block: Any) -> tuple[int, ...]:
    """Normalise ``block`` (an int or a tuple aligned to the trailing axes) to one entry per axis."""
    if isinstance(block, (int, np.integer)) and not isinstance(block, (bool, np.bool_)):
        blk: tuple[int, ...] = (int(block),)
    elif isinstance(block, (tuple, list)):
        blk = tuple(_check_int("block entry", b) for b in block)
    else:
        raise TypeError(f"block must be an int or a tuple of ints, got {type(block).__name__}: {block!r}")
    if len(blk) > len(shape):
        raise ValueError(f"block {blk} has more dimensions than the array's shape {shape}")
    if any(b < 1 for b in blk):
        raise ValueError(f"block entries must be >= 1, got {blk}")
    full = (1,) * (len(shape) - len(blk)) + blk
    bad = [i for i, (s, b) in enumerate(zip(shape, full)) if s % b]
    if bad:
        raise ValueError(
            f"block {blk} does not divide shape {shape} (axis {bad[0]}: {shape[bad[0]]} % {full[bad[0]]} != 0); "
            "pad the array or choose a block whose entries divide the trailing dimensions"
        )
    return full


def _blocked(x: np.ndarray, full: tuple[int, ...]) -> np.ndarray:
    """View ``x`` as (n0, b0, n1, b1, ...)."""
    new: list[int] = []
    for s, b in zip(x.shape, full):
        new += [s // b, b]
    return x.reshape(new)


def _grid_shape(shape: tuple[int, ...], full: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(s // b for s, b in zip(shape, full))


def _as_float(x: Any, name: str = "x") -> np.ndarray:
    a, _ = _as_float_array(x, name)
    return a


def _broadcast_scale(s: np.ndarray, shape: tuple[int, ...], axis: Any, block: Any, what: str = "scale") -> np.ndarray:
    """Shape a per-tensor / per-channel / per-block scale array so that it broadcasts against ``shape``."""
    if axis is not None and block is not None:
        raise ValueError("give either axis= (per channel) or block= (per block), not both")
    if axis is not None:
        ax = _norm_axis(axis, len(shape))
        s = s.reshape(-1)
        if s.size not in (1, shape[ax]):
            raise ValueError(f"{what} has {s.size} entries but axis {ax} has length {shape[ax]}")
        bshape = [1] * len(shape)
        bshape[ax] = s.size
        return s.reshape(bshape)
    if block is not None:
        full = _block_shape(shape, block)
        grid = _grid_shape(shape, full)
        if s.size == 1:
            s = np.broadcast_to(s.reshape(()), grid)
        if s.shape != grid:
            raise ValueError(f"{what} has shape {s.shape}; block {tuple(full)} over shape {shape} needs {grid}")
        inter: list[int] = []
        for g in grid:
            inter += [g, 1]
        return s.reshape(inter)
    if s.size == 1:
        return s.reshape(())
    try:
        np.broadcast_shapes(s.shape, shape)
    except ValueError:
        raise ValueError(f"{what} of shape {s.shape} does not broadcast to the data's shape {shape}") from None
    return s


def _apply(x: np.ndarray, s: np.ndarray, axis: Any, block: Any, fn: Any) -> np.ndarray:
    """``fn(x, s)`` with ``s`` broadcast per tensor / channel / block."""
    sb = _broadcast_scale(s, x.shape, axis, block)
    if block is not None:
        full = _block_shape(x.shape, block)
        return np.asarray(fn(_blocked(x, full), sb)).reshape(x.shape)
    return np.asarray(fn(x, sb))


def _out(a: np.ndarray, scalar_in: bool) -> Any:
    return a[()] if scalar_in or a.ndim == 0 else a


