"""fpsim.scaling's faster paths (issue 16 §3: the audit's quantizers) give the same bits as the code they
replaced, kept here verbatim-in-effect as the reference: per-block amax as a reduction over the blocked
view's odd axes, mx_dequantize / nvfp4_dequantize as a float64 product rounded to q's dtype. Hostile
inputs: NaN / inf blocks, zeros and -0, subnormals (float32's and below), values at and beyond the
formats' range, partial shapes, float32 and float64 carriers, non-contiguous views."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import fpsim.scaling as S
from fpsim.scaling import _common, _mx


def _bits(a: Any) -> np.ndarray:
    a = np.asarray(a)
    return a.view(np.uint32 if a.dtype == np.float32 else np.uint64)


def _same(new: Any, old: Any) -> None:
    new, old = np.asarray(new), np.asarray(old)
    assert new.dtype == old.dtype and new.shape == old.shape
    assert np.array_equal(_bits(new), _bits(old))


# -- the replaced code -----------------------------------------------------------------------------

def _old_amax_block(a: np.ndarray, full: tuple[int, ...]) -> np.ndarray:
    m = np.abs(a)
    if a.size == 0:
        return np.zeros(tuple(s // b for s, b in zip(a.shape, full)), dtype=a.dtype)
    return _common._blocked(m, full).max(axis=tuple(range(1, 2 * a.ndim, 2)))


def _old_mx_dequantize(q: np.ndarray, scales: Any, block: int, axis: int) -> np.ndarray:
    a, b, ax = _mx._mx_prepare(q, block, axis)
    s = np.asarray(scales, dtype=np.float64)
    moved = np.moveaxis(a, ax, -1)
    shp = moved.shape
    s_moved = np.moveaxis(s, ax, -1) if s.ndim == a.ndim else s
    blocks = moved.reshape(shp[:-1] + (shp[-1] // b, b)).astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        out = (blocks * s_moved[..., None]).reshape(shp).astype(a.dtype)
    return np.moveaxis(out, -1, ax)


def _old_nvfp4_dequantize(q: np.ndarray, bs: Any, g: Any, block: Any, axis: Any) -> np.ndarray:
    a = np.asarray(q)
    full = _mx._nvfp4_block(a.shape, block, axis)
    with np.errstate(over="ignore", invalid="ignore"):
        s = (np.asarray(bs, dtype=np.float32) * np.float32(g)).astype(np.float32)
        out = _common._apply(a.astype(np.float64), s.astype(np.float64), None, full, np.multiply)
        return out.astype(a.dtype)  # (the old code cast outside errstate: a RuntimeWarning on overflow)


# -- hostile inputs --------------------------------------------------------------------------------

def _hostile(dtype: Any, shape: tuple[int, int] = (6, 256), seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * np.exp2(rng.integers(-30, 30, shape))).astype(dtype)
    f = x.reshape(-1)
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1.4e-45, 1e-40, 3e38, -3.4e38,
                         448.0, -449.0, 6.0, 1e-300 if dtype == np.float64 else 1e-44, 1e300 if dtype == np.float64
                         else 3.4028235e38], dtype=dtype)
    idx = rng.choice(f.size, 60, replace=False)
    f[idx] = specials[rng.integers(0, specials.size, idx.size)]
    f[:32] = 0.0  # a whole zero block (MX 32, NVFP4 16, 1x16 tiles)
    f[32:48] = -0.0
    f[64:96] = np.nan  # an all-NaN block
    f[96:128] = np.float32(1e-42) if dtype == np.float32 else 1e-310  # subnormals only
    f[128:144] = np.inf
    return x


CARRIERS = [np.float32, np.float64]


@pytest.mark.parametrize("dtype", CARRIERS)
@pytest.mark.parametrize("block", [(1, 16), (1, 128), (1, 1), (1, 256), 16, (2, 16), (6, 32), (3, 64)])
def test_amax_block_bit_identical(dtype: Any, block: Any) -> None:
    x = _hostile(dtype)
    x0 = x.copy()
    full = _common._block_shape(x.shape, block)
    _same(S.amax(x, block=block), _old_amax_block(x, full))
    np.testing.assert_array_equal(_bits(x), _bits(x0))  # input untouched


@pytest.mark.parametrize("dtype", CARRIERS)
def test_amax_block_layouts_and_shapes(dtype: Any) -> None:
    x = _hostile(dtype, (8, 128), seed=1)
    for v in (x.T, np.asfortranarray(x), x[::2], x[:, ::2], x.T[::2]):  # non-contiguous views
        blk = (1, 16) if v.shape[1] % 16 == 0 else (1, v.shape[1])
        _same(S.amax(v, block=blk), _old_amax_block(v, _common._block_shape(v.shape, blk)))
    for shp, blk in (((64,), 16), ((64,), 64), ((2, 3, 32), (1, 1, 16)), ((2, 3, 32), (1, 3, 16)), ((0, 32), (1, 16)),
                     ((4, 0), (1, 1))):
        v = np.resize(_hostile(dtype, (4, 128), seed=2).reshape(-1), shp).astype(dtype) if 0 not in shp \
            else np.zeros(shp, dtype)
        _same(S.amax(v, block=blk), _old_amax_block(v, _common._block_shape(v.shape, blk)))


@pytest.mark.parametrize("dtype", CARRIERS)
@pytest.mark.parametrize("elem", ["fp8_e4m3", "fp8_e5m2", "fp4_e2m1", "fp6_e3m2"])
@pytest.mark.parametrize("rule", ["floor", "ceil"])
def test_mx_dequantize_bit_identical(dtype: Any, elem: str, rule: str) -> None:
    x = _hostile(dtype, (6, 256), seed=3)
    for axis in (-1, 0):
        xx = x if axis == -1 else np.ascontiguousarray(x.T)
        q, s = S.mx_quantize(xx, elem, block=32, axis=axis, scale_rounding=rule)
        q0 = q.copy()
        _same(S.mx_dequantize(q, s, block=32, axis=axis), _old_mx_dequantize(q, s, 32, axis))
        np.testing.assert_array_equal(_bits(q), _bits(q0))
    # arbitrary float32 values and scales (not just E8M0 powers of two), float64 scales, extreme scales
    rng = np.random.default_rng(4)
    q = _hostile(np.float32, (4, 64), seed=5)
    for s in (rng.standard_normal((4, 2)).astype(np.float32),
              np.float32([[2.0**-127, 2.0**127], [np.nan, np.inf], [0.0, -0.0], [1e-45, 3.4e38]]),
              rng.standard_normal((4, 2)),  # float64 scales not representable in float32: the float64 path
              np.array([[1e300, 1e-300], [2.0, 0.5], [np.nan, 3.0], [1.0 + 2**-40, 1.0]])):
        _same(S.mx_dequantize(q, s, block=32), _old_mx_dequantize(q, s, 32, -1))
        _same(S.mx_dequantize(q.astype(np.float64), s, block=32), _old_mx_dequantize(q.astype(np.float64), s, 32, -1))


@pytest.mark.parametrize("dtype", CARRIERS)
def test_nvfp4_dequantize_bit_identical(dtype: Any) -> None:
    x = _hostile(dtype, (6, 256), seed=6)
    for gam in (None, 1.0, 1e-30, 3e38):
        q, d, g = S.nvfp4_quantize(x, global_amax=gam)
        _same(S.nvfp4_dequantize(q, d, g), _old_nvfp4_dequantize(q, d, g, 16, -1))
    q = _hostile(np.float32, (4, 64), seed=7)  # arbitrary q, extreme block and global scales
    rng = np.random.default_rng(8)
    for bs, g in ((rng.standard_normal((4, 4)).astype(np.float32), np.float32(3.7)),
                  (np.float32([[448, -448, 1e-45, 0], [np.nan, np.inf, 2.0, 3.0]] * 2), np.float32(3e38)),
                  (np.full((4, 4), 1e-20, np.float32), np.float32(1e-30))):
        for qq in (q, q.astype(np.float64)):
            _same(S.nvfp4_dequantize(qq, bs, g), _old_nvfp4_dequantize(qq, bs, g, 16, -1))
