"""The compiled kernel against the NumPy reference kernel (both must give the same bits, SR included)."""

from __future__ import annotations

import numpy as np
import pytest

import fpsim
import fpsim.rounding as R

pytestmark = pytest.mark.skipif(not R.use_c_kernel, reason="the C kernel is not built here")

MODES = ["rne", "rna", "rtz", "rup", "rdn", "rto", "sr"]


def _data(dtype: type, n: int = 60_000) -> np.ndarray:
    rng = np.random.default_rng(7)
    # random bit patterns cover every exponent, NaN payloads, infinities and subnormals of the carrier
    w = np.dtype(dtype).itemsize
    raw = rng.integers(0, 2 ** (8 * w) - 1, n, dtype=np.uint64 if w == 8 else np.uint32, endpoint=True)
    x = raw.view(dtype)
    y = (rng.standard_normal(n) * np.exp2(rng.integers(-30, 30, n))).astype(dtype)
    return np.concatenate([x, y, np.array([0.0, -0.0, np.inf, -np.inf], dtype=dtype)])


def _both(x: np.ndarray, fmt: fpsim.Format, mode: str, **kw: object) -> tuple[np.ndarray, np.ndarray]:
    rng_a = np.random.default_rng(3) if mode == "sr" else None
    rng_b = np.random.default_rng(3) if mode == "sr" else None
    a = fpsim.round(x, fmt, mode, rng=rng_a, **kw)
    R.use_c_kernel = False
    try:
        b = fpsim.round(x, fmt, mode, rng=rng_b, **kw)
    finally:
        R.use_c_kernel = True
    return a, b


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", [f for f in fpsim.all_formats()], ids=lambda f: f.name)
def test_c_kernel_equals_numpy_kernel(fmt: fpsim.Format, mode: str, dtype: type) -> None:
    x = _data(dtype)
    for kw in ({}, {"overflow": "saturate"}, {"subnormals": False}):
        a, b = _both(x, fmt, mode, **kw)
        ua = a.view(np.uint64 if a.dtype == np.float64 else np.uint32)
        ub = b.view(np.uint64 if b.dtype == np.float64 else np.uint32)
        assert np.array_equal(ua, ub), (kw, x[ua != ub][:4], a[ua != ub][:4], b[ua != ub][:4])


@pytest.mark.parametrize("sr_bits", [1, 3, 8])
def test_c_kernel_equals_numpy_kernel_sr_bits(sr_bits: int) -> None:
    x = _data(np.float32)
    a, b = _both(x, fpsim.fp16, "sr", sr_bits=sr_bits)
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("mode", ["rne", "sr"])
def test_threaded_kernel_equals_one_thread(mode: str) -> None:
    """Large arrays are shared among threads; the bits (SR's random stream too) must not depend on it."""
    x = np.random.default_rng(11).standard_normal(3 * R._PARALLEL_MIN // 2 + 7).astype(np.float32) * 1e-3
    rng = (lambda: np.random.default_rng(4)) if mode == "sr" else (lambda: None)
    old = R.max_threads
    try:
        R.max_threads = 2
        a = fpsim.round(x, "fp8_e5m2", mode, rng=rng())
        R.max_threads = 1
        b = fpsim.round(x, "fp8_e5m2", mode, rng=rng())
    finally:
        R.max_threads = old
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
