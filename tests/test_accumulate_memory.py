"""fpsim.accumulate.dot / matmul never build the whole (outputs x K) product tensor for the whole-array orders.

The exact, pairwise, blocked and SumTree orders used to broadcast both operands to (K, *outputs) at once: an
(M, N, K) float64 tensor (and the exact sum's int64 temporaries on top), 100-1800x the data. They now run a
chunk of outputs at a time, with the same bits (outputs are independent; stochastic rounding keeps one pass so
that its random bits are drawn in the same order).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import fpsim.accumulate as acc
from fpsim.accumulate import SumTree

from _memory import peak_bytes as _peak

ORDERS: list[tuple[Any, dict[str, Any]]] = [
    ("exact", {}),
    ("pairwise", {}),
    ("blocked", {"block": 4}),
    ("blocked", {"block": 4, "fused": False}),
    ("sequential", {}),
    ("kahan", {}),
]


@pytest.mark.parametrize(("order", "kw"), ORDERS + [pytest.param("tree", {}, marks=pytest.mark.slow)],
                         ids=lambda v: str(v))
def test_matmul_peak_follows_data(order: Any, kw: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(acc, "_DOT_ELEMS", 1 << 14, raising=False)
    rng = np.random.default_rng(21)
    a = rng.standard_normal((40, 256))
    b = rng.standard_normal((256, 30))
    if order == "tree":
        order = SumTree.lanes(256, 4)
    data = a.nbytes + b.nbytes + 40 * 30 * 8
    peak = _peak(lambda: acc.matmul(a, b, "bf16", order=order, **kw))
    assert peak <= 8 * data, f"{order}: peak {peak / data:.1f}x the data"


def test_dot_broadcast_peak_follows_data(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(acc, "_DOT_ELEMS", 1 << 14, raising=False)
    rng = np.random.default_rng(22)
    a = rng.standard_normal((100, 1, 128))
    b = rng.standard_normal((1, 30, 128))
    data = a.nbytes + b.nbytes + 100 * 30 * 8
    peak = _peak(lambda: acc.dot(a, b, "fp16", order="pairwise"))
    assert peak <= 8 * data, f"peak {peak / data:.1f}x the data"


@pytest.mark.parametrize(("order", "kw"), ORDERS + [("tree", {}), ("tree", {"fused": False})],
                         ids=lambda v: str(v))
@pytest.mark.parametrize("fmt", ["bf16", "fp32", "fp64"])
def test_chunks_keep_bits(order: Any, kw: dict[str, Any], fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(23)
    a = rng.standard_normal((3, 1, 5, 37))
    b = rng.standard_normal((1, 4, 37, 6)) * 1e3
    a[0, 0, 1, :3] = [np.inf, -0.0, 1e-300]
    b[0, 1, 5, 2] = np.nan
    b[0, 2, :, 3] = -0.0
    a[1, 0, 2, :] = -0.0
    if order == "tree":
        order = SumTree.pairwise(37)
    ref = acc.matmul(a, b, fmt, order=order, **kw)
    refd = acc.dot(a[:, :, :, None, :], np.swapaxes(b, -1, -2)[:, :, None], fmt, order=order, **kw)
    monkeypatch.setattr(acc, "_DOT_ELEMS", 64, raising=False)  # chunks of one or two outputs
    got = acc.matmul(a, b, fmt, order=order, **kw)
    gotd = acc.dot(a[:, :, :, None, :], np.swapaxes(b, -1, -2)[:, :, None], fmt, order=order, **kw)
    assert got.shape == ref.shape == (3, 4, 5, 6)
    np.testing.assert_array_equal(got, ref)
    # signed zeros always; a NaN's sign only on NumPy 2 (1.24's SIMD loops pick which NaN, and so its sign, by
    # the arrays' alignment, as test_hardening notes for the FMA emulation's payloads)
    signed = ~np.isnan(ref) if np.lib.NumpyVersion(np.__version__) < "2.0.0" else np.ones(ref.shape, bool)
    np.testing.assert_array_equal(np.signbit(got)[signed], np.signbit(ref)[signed])
    np.testing.assert_array_equal(gotd, refd)
    np.testing.assert_array_equal(gotd, got)


def test_stochastic_rounding_keeps_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """With SR the random bits go to the same outputs whatever the chunk size (one pass)."""
    a = np.random.default_rng(24).standard_normal((6, 50))
    b = np.random.default_rng(25).standard_normal((50, 5))
    ref = acc.matmul(a, b, "bf16", order="pairwise", rounding="sr", rng=np.random.default_rng(1))
    monkeypatch.setattr(acc, "_DOT_ELEMS", 64, raising=False)
    got = acc.matmul(a, b, "bf16", order="pairwise", rounding="sr", rng=np.random.default_rng(1))
    np.testing.assert_array_equal(got, ref)
