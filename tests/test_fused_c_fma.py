"""Issue 14 §2: the compiled float32 FMA (``fma_f32`` in fpsim/_ckernel.c) behind the fused optimizer steps,
against the NumPy emulation it replaces (the reference, bit for bit) and against MPFR on hostile cases."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from fpsim.amp import fused
from fpsim.amp.fused import _fma32, _fma32_numpy

F = np.float32
needs_c = pytest.mark.skipif(fused._c_fma is None, reason="fpsim._ckernel without fma_f32 (no compiler)")


def u32(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, F).view(np.uint32)


def hostile(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ties, float32-subnormal and underflowing results, cancellation, overflow, inf, NaN, signed zeros."""
    rng = np.random.default_rng(seed)
    k = n // 8
    a = rng.standard_normal(n).astype(F)
    b = (rng.standard_normal(n) * 2.0 ** rng.integers(-40, 40, n)).astype(F)
    c = (rng.standard_normal(n) * 2.0 ** rng.integers(-40, 40, n)).astype(F)
    a[:k] = b[:k] = F(1 + 2 ** -12)                    # a*b = 1 + 2**-11 + 2**-24: a tie c nudges off
    c[:k] = F(2 ** -24) * rng.integers(-3, 3, k).astype(F)
    a[k:2 * k] = F(2 ** -70)                           # float32-subnormal results
    b[k:2 * k] = (rng.standard_normal(k) * 2 ** -60).astype(F)
    c[k:2 * k] = (rng.standard_normal(k) * 2 ** -130).astype(F)
    c[2 * k:3 * k] = -(a[2 * k:3 * k].astype(np.float64) * b[2 * k:3 * k]).astype(F)  # cancellation
    a[3 * k:4 * k] = F(3e38)                           # overflow, and inf - inf
    c[3 * k:4 * k] = rng.choice(np.array([0.0, np.inf, -np.inf, 3e38], F), k)
    sp = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 3.4028235e38], F)
    for x in (a, b, c):
        x[4 * k:5 * k] = rng.choice(sp, k)
    ties = rng.integers(1, 2 ** 23, k)                 # exact halfway between float32 neighbours, via c
    a[5 * k:6 * k] = (1.0 + ties * 2.0 ** -23).astype(F)
    b[5 * k:6 * k] = F(1.0)
    c[5 * k:6 * k] = F(2.0 ** -24) * rng.choice(np.array([-1.0, 1.0], F), k)
    return a, b, c


# Which NaN a float64 NumPy operation returns for two NaN operands is not specified by IEEE 754; NumPy 1.24's
# SIMD loops pick by alignment (seen: the emulation's NaN payloads changed with the test order), NumPy 2.x's
# are stable. So NaN payloads are compared bit for bit only on NumPy 2; elsewhere a NaN equals any NaN.
_NAN_PAYLOADS = int(np.__version__.split(".")[0]) >= 2


def bits_equal(x: np.ndarray, y: np.ndarray) -> bool:
    if _NAN_PAYLOADS:
        return bool(np.array_equal(u32(x), u32(y)))
    return same(x, y) == 0 and bool(np.array_equal(np.isnan(x), np.isnan(y)))


def same(x: np.ndarray, y: np.ndarray) -> int:
    """Mismatching elements: bit patterns, except that any NaN equals any NaN (MPFR has no payloads)."""
    nan = np.isnan(x) & np.isnan(y)
    return int(np.count_nonzero((u32(x) != u32(y)) & ~nan))


@needs_c
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_c_fma_equals_numpy_emulation(seed: int) -> None:
    a, b, c = hostile(200_003, seed)                    # beyond one chunk of the NumPy emulation
    got = _fma32(a, b, c)
    want = _fma32_numpy(a, b, c)
    assert np.isnan(want).sum() > 10_000
    assert bits_equal(got, want)          # every bit, NaN payloads and signs included (on NumPy 2)


@needs_c
def test_c_fma_against_mpfr() -> None:
    gmpy2 = pytest.importorskip("gmpy2")
    a, b, c = hostile(4000, 7)
    got = _fma32(a, b, c)
    with gmpy2.context(gmpy2.ieee(32)):
        want = np.array([float(gmpy2.fma(gmpy2.mpfr(float(x)), gmpy2.mpfr(float(y)), gmpy2.mpfr(float(z))))
                         for x, y, z in zip(a, b, c)], F)
    assert same(got, want) == 0 and np.array_equal(np.isnan(got), np.isnan(want))
    z = (got == 0) & (want == 0)
    assert np.array_equal(np.signbit(got[z]), np.signbit(want[z]))   # signed zeros too (u32 already: explicit)


@needs_c
@pytest.mark.parametrize("which", range(8))
def test_c_fma_broadcast_and_aliasing(which: int) -> None:
    """Each operand a full array or one value (the 8 compiled variants), and out one of the operands."""
    a, b, c = hostile(1003, which)
    ops: list[Any] = [a, b, c]
    for i in range(3):
        if not (which >> (2 - i)) & 1:
            ops[i] = ops[i][5]                          # a scalar (0-d) operand
    want = _fma32_numpy(*ops)
    assert bits_equal(_fma32(*ops), want)
    full = [i for i in range(3) if np.ndim(ops[i])]
    if full:
        tgt = np.array(ops[full[0]], F)                 # out aliases the first full operand
        ops2 = list(ops)
        ops2[full[0]] = tgt
        assert _fma32(*ops2, out=tgt) is tgt and bits_equal(tgt, want)


@needs_c
def test_fused_steps_identical_with_and_without_c(monkeypatch: pytest.MonkeyPatch) -> None:
    from fpsim.amp import fused_adamw_step, fused_sgd_step

    shapes = [(37,), (8, 9), (5,), (1,)]

    def run() -> list[np.ndarray]:
        r = np.random.default_rng(3)
        p = [r.standard_normal(s).astype(F) for s in shapes]
        q = [x.copy() for x in p]
        m, v, vm = ([np.zeros_like(x) for x in p] for _ in range(3))
        buf = [np.zeros_like(x) for x in p]
        for t in range(1, 4):
            g = [(r.standard_normal(s) * 1e-3).astype(F) for s in shapes]
            fused_adamw_step(p, [x.copy() for x in g], m, v, vm, [np.float32([t]) for _ in p], lr=1e-2, beta1=0.9,
                             beta2=0.999, weight_decay=0.1, eps=1e-8, amsgrad=True, maximize=False)
            fused_sgd_step(q, [x.copy() for x in g], buf, weight_decay=0.1, momentum=0.9, lr=1e-2, dampening=0.1,
                           nesterov=False, maximize=False, is_first_step=t == 1)
        return p + q + m + v + vm + buf

    with_c = run()
    monkeypatch.setattr(fused, "use_c_fma", False)
    without = run()
    assert all(np.array_equal(u32(x), u32(y)) for x, y in zip(with_c, without))


@needs_c
def test_c_fma_bad_buffers() -> None:
    o = np.empty(4, F)
    with pytest.raises(ValueError, match="as many float32 values as out, or one"):
        fused._c_fma(np.ones(3, F), np.ones(4, F), np.ones(4, F), o)
    with pytest.raises(ValueError, match="whole number of float32 words"):
        fused._c_fma(np.ones(1, F), np.ones(1, F), np.ones(1, F), np.empty(3, np.uint8))
    ro = np.ones(4, F)
    ro.setflags(write=False)
    with pytest.raises(TypeError, match="read-write"):
        fused._c_fma(np.ones(4, F), np.ones(4, F), np.ones(4, F), ro)
    with pytest.raises(ValueError, match="C-contiguous float32 array of shape"):
        _fma32(np.ones(4, F), F(1), F(1), out=np.empty(5, F))
    a = np.ones(4, F)
    a.setflags(write=False)                             # read-only inputs are fine (and unchanged)
    assert _fma32(a, a, a).tolist() == [2.0] * 4
    fused._c_fma(np.ones(0, F), np.ones(0, F), np.ones(0, F), np.empty(0, F))  # empty: nothing to do
