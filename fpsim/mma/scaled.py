"""A quantised tensor and its dequantisation factors, as one value: :class:`ScaledTensor`.

One convention everywhere a scaled tensor travels (quantizers in :mod:`fpsim.scaling`, :func:`fpsim.matmul`):
``scale`` holds *decode* (dequantisation) factors, ``x ≈ data * scale`` with each factor repeated over its
block, as TransformerEngine's ``Float8Tensor._scale_inv``, torchao's float8 tensors and the OCP MX
specification store them. (The *encode* scale TransformerEngine multiplies by before the cast, the one
:func:`fpsim.scaling.compute_scale` returns, is its reciprocal.)

The class lives in the matrix layer because :func:`fpsim.matmul` consumes it; :mod:`fpsim.scaling` (which
produces it) re-exports it as ``fpsim.scaling.ScaledTensor``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .._fpenv import ieee_mode
from ..formats import Format, FormatLike, as_format
from ..rounding import _as_float_array, _first_non_value

__all__ = ["ScaledTensor"]

_F32 = np.float32


def _block_tuple(block: Any, shape: tuple[int, ...]) -> tuple[int, ...]:
    """``block`` as one positive length per axis, each dividing that axis (``None``: one block per tensor)."""
    if block is None:
        return tuple(max(s, 1) for s in shape)
    if isinstance(block, (int, np.integer)) and not isinstance(block, (bool, np.bool_)):
        block = (int(block),)
    if not isinstance(block, (tuple, list)):
        raise TypeError(f"block must be None, an int or a tuple of ints, got {type(block).__name__}: {block!r}")
    blk: list[int] = []
    for b in block:
        if isinstance(b, (bool, np.bool_)) or not isinstance(b, (int, np.integer)):
            raise TypeError(f"block entries must be ints, got {b!r} in {block!r}")
        blk.append(int(b))
    if len(blk) > len(shape):
        raise ValueError(f"block {tuple(blk)} has more dimensions than the data's shape {shape}")
    full = tuple([1] * (len(shape) - len(blk)) + blk)
    for i, (s, b) in enumerate(zip(shape, full)):
        if b < 1:
            raise ValueError(f"block entries must be >= 1, got {tuple(blk)}")
        if s % b:
            raise ValueError(f"block {full} does not divide the data's shape {shape} (axis {i}: {s} % {b} != 0)")
    return full


@ieee_mode
@dataclass(frozen=True, eq=False)
class ScaledTensor:
    """Quantised values of a format with their dequantisation factors: ``x ≈ data * scale``.

    Parameters
    ----------
    data : array_like
        Values of `format` in float carriers (float32 stays float32, anything else becomes float64), e.g.
        the elements a quantizer produced. Copied and made read-only. Values not in `format` raise
        ``ValueError``.
    scale : float or array_like
        **Decode** factors (what TransformerEngine calls ``scale_inv``), one per block: shape
        ``data.shape // block`` (a scalar is broadcast). Stored as float32 (the hardware's and
        TransformerEngine's scale type; rounded to nearest). Not the *encode* scale that
        :func:`fpsim.scaling.compute_scale` returns: that is the reciprocal.
    format : Format or str
        The format of `data` (``"fp8_e4m3"``, ``"fp4_e2m1"``, ...).
    block : None, int or tuple of ints
        Block layout, aligned to the trailing axes like :func:`fpsim.scaling.amax`'s ``block=``: ``None``
        one scale for the whole tensor; ``(1, K)`` one per row; ``(1, 128)`` tiles; ``(128, 128)`` blocks;
        ``(1, 32)`` MX blocks along the last axis. Stored as one entry per axis.
    global_scale : float
        A second, per-tensor decode factor (NVFP4's fp32 tensor scale); 1 otherwise. It is folded into
        each block factor in float32, ``float32(scale * global_scale)``, as :func:`fpsim.scaling.nvfp4_dequantize`
        does.

    Examples
    --------
    >>> import numpy as np
    >>> from fpsim.scaling import ScaledTensor
    >>> t = ScaledTensor(np.float32([[448, -1], [2, 0.5]]), [[0.25], [2.0]], "fp8_e4m3", block=(1, 2))
    >>> t.block, t.scale.shape
    ((1, 2), (2, 1))
    >>> t.dequantize().tolist()
    [[112.0, -0.25], [4.0, 1.0]]
    """

    data: np.ndarray
    scale: np.ndarray
    format: Format
    block: tuple[int, ...]
    global_scale: np.float32

    def __init__(self, data: Any, scale: Any, format: FormatLike, block: Any = None, *,
                 global_scale: float | np.floating[Any] = 1.0) -> None:
        fmt = as_format(format)
        d = np.array(_as_float_array(data, "data")[0], copy=True)
        blk = _block_tuple(block, d.shape)
        grid = tuple(s // b for s, b in zip(d.shape, blk))
        s_arr = np.asarray(_as_float_array(scale, "scale")[0])
        with np.errstate(over="ignore"):
            s32 = s_arr.astype(_F32)
        if s32.size == 1 and s32.shape != grid:
            s32 = np.full(grid, s32.reshape(()), dtype=_F32)
        if s32.shape != grid:
            raise ValueError(f"scale has shape {s_arr.shape}; data of shape {d.shape} in blocks of {blk} needs "
                             f"one decode factor per block, shape {grid}")
        s32 = np.array(s32, dtype=_F32, copy=True)
        g_arr = np.asarray(_as_float_array(global_scale, "global_scale")[0])
        if g_arr.size != 1:
            raise ValueError(f"global_scale must be a single number, got shape {g_arr.shape}")
        with np.errstate(over="ignore"):
            g = _F32(g_arr.reshape(()))
        if d.size:
            v = _first_non_value(d, fmt)
            if v is not None:
                raise ValueError(f"data holds {v!r}, which is not a value of {fmt.name}; quantize first "
                                 "(fpsim.scaling.quantize_scaled) or give the format the data are in")
        d.setflags(write=False)
        s32.setflags(write=False)
        object.__setattr__(self, "data", d)
        object.__setattr__(self, "scale", s32)
        object.__setattr__(self, "format", fmt)
        object.__setattr__(self, "block", blk)
        object.__setattr__(self, "global_scale", g)

    # -- views -------------------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the data."""
        return tuple(self.data.shape)

    @property
    def ndim(self) -> int:
        return int(self.data.ndim)

    def factors(self) -> np.ndarray:
        """The decode factor of every element (float32, data's shape): ``float32(scale * global_scale)``
        repeated over each block."""
        with np.errstate(over="ignore", invalid="ignore"):
            s = (self.scale * self.global_scale).astype(_F32)
        for ax, b in enumerate(self.block):
            if b > 1:
                s = np.repeat(s, b, axis=ax)
        return s

    def dequantize(self) -> np.ndarray:
        """``data * factors()`` rounded once to data's dtype (the float64 product is exact: a narrow
        format's significand times a float32 factor fits in 53 bits)."""
        with np.errstate(over="ignore", invalid="ignore"):
            out: np.ndarray = (self.data.astype(np.float64) * self.factors().astype(np.float64)).astype(self.data.dtype)
        return out

    def __repr__(self) -> str:
        return (f"ScaledTensor(shape={self.shape}, format={self.format.name!r}, block={self.block}, "
                f"scale.shape={self.scale.shape}" + ("" if self.global_scale == 1 else
                                                     f", global_scale={float(self.global_scale)!r}") + ")")
