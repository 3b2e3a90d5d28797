"""The compiled kernels give the reference's bits whatever rounding mode the calling thread has set.

A library in the same process may call ``fesetround`` (review finding: the rounding kernel's subnormal step, the
GEMM's tie-to-even trick and ``fmaf`` used the caller's mode). The kernels run in round-to-nearest and give the
caller's mode back; these tests set each directed mode with libm's ``fesetround`` through ctypes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

import numpy as np
import pytest

import fpsim
from fpsim import rounding
from fpsim.mma import gemm as G
from fpsim.mma import get_model

if not sys.platform.startswith("linux"):
    pytest.skip("the FE_* constants below are glibc x86-64's", allow_module_level=True)
_libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
MODES = {"upward": 0x800, "downward": 0x400, "towardzero": 0xC00}
NEAREST = 0


def _in_mode(mode: int, fn):  # type: ignore[no-untyped-def]
    assert _libm.fesetround(mode) == 0
    try:
        res = fn()
        assert _libm.fegetround() == mode  # the caller's mode is given back
        return res
    finally:
        _libm.fesetround(NEAREST)


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("threads", [1, 2])
def test_round_in_a_directed_caller_mode(mode: str, threads: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rounding, "max_threads", threads)
    rng = np.random.default_rng(3)
    n = (1 << 20) + 5 if threads > 1 else 4096
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-30, 10, n))).astype(np.float32)
    for fmt in ["fp16", "bf16", "fp8_e4m3", "fp8_e5m2"]:
        want = np.asarray(fpsim.round(x, fmt))
        got = _in_mode(MODES[mode], lambda: np.asarray(fpsim.round(x, fmt)))  # noqa: B023
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), fmt


@pytest.mark.parametrize("mode", sorted(MODES))
def test_fma_and_gemm_in_a_directed_caller_mode(mode: str) -> None:
    rng = np.random.default_rng(4)
    a, b, c = (rng.standard_normal(4096).astype(np.float32) for _ in range(3))
    want = np.asarray(fpsim.fma(a, b, c, "fp32"))
    got = _in_mode(MODES[mode], lambda: np.asarray(fpsim.fma(a, b, c, "fp32")))
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    A = np.asarray(fpsim.round(rng.standard_normal((24, 48)) * 30, "fp16"))
    B = np.asarray(fpsim.round(rng.standard_normal((48, 20)), "fp16"))
    C = rng.standard_normal((24, 20))
    for dev, out in [("h100", "fp32"), ("a100", "fp16")]:
        m = get_model(dev, "fp16", out)
        want = np.asarray(fpsim.matmul(A, B, C, model=m))
        got = _in_mode(MODES[mode], lambda: np.asarray(fpsim.matmul(A, B, C, model=m)))  # noqa: B023
        assert np.array_equal(got.view(np.uint64), want.view(np.uint64)), (dev, out)
    assert G.use_c_gemm
