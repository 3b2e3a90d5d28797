"""Loss scalers: torch GradScaler's scale sequence, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from fpsim.amp import DynamicLossScaler, LossScaler

# Reference trace (training.md §1): init 2^16, growth_interval 3.
TRACE_GRADS = ["ok", "ok", "ok", "ok", "inf", "ok", "ok", "nan", "nan", "ok", "ok", "ok", "-inf", "ok", "ok", "ok", "ok", "ok", "ok"]
TRACE_SCALE_K = [64, 64, 128, 128, 64, 64, 64, 32, 16, 16, 16, 32, 16, 16, 16, 32, 32, 32, 64]
TRACE_TRACKER = [1, 2, 0, 1, 0, 1, 2, 0, 0, 1, 2, 0, 0, 1, 2, 0, 1, 2, 0]


def test_reference_trace() -> None:
    s = DynamicLossScaler(init_scale=2.0 ** 16, growth_interval=3)
    for g, k, t in zip(TRACE_GRADS, TRACE_SCALE_K, TRACE_TRACKER):
        grads = {"w": np.float32([1.0, {"ok": 2.0, "inf": np.inf, "-inf": -np.inf, "nan": np.nan}[g]])}
        _, found_inf = s.unscale(grads)
        assert found_inf == (g != "ok")
        s.update(found_inf)
        assert s.scale == k * 1024 and s.growth_tracker == t


def test_odd_factors_in_float32() -> None:
    s = DynamicLossScaler(init_scale=1000.0, growth_factor=1.1, backoff_factor=0.3, growth_interval=2)
    got = []
    for inf in [False, False, True, False, False, True, False, False]:
        s.update(inf)
        got.append(s.scale)
    want = np.float32([1000, 1100, 330, 330, 363, 108.900002, 108.900002, 119.790001])
    assert np.array_equal(np.float32(got), want)


def test_growth_to_inf_refused_and_backoff_to_zero() -> None:
    s = DynamicLossScaler(init_scale=2.0 ** 126, growth_interval=1)
    s.update(False)
    assert s.scale == 2.0 ** 127
    s.update(False)
    assert s.scale == 2.0 ** 127 and s.growth_tracker == 0
    s = DynamicLossScaler(init_scale=1.0)
    for _ in range(149):
        s.update(True)
    assert s.scale == 2.0 ** -149
    s.update(True)
    assert s.scale == 0.0


def test_defaults_grow_at_2000() -> None:
    s = DynamicLossScaler()
    for i in range(4000):
        s.update(False)
        if i == 1998:
            assert s.scale == 65536.0
        if i == 1999:
            assert s.scale == 131072.0
    assert s.scale == 262144.0


def test_unscale_semantics() -> None:
    s = LossScaler(3.0)
    g, inf = s.unscale({"a": np.float32([3.0, 21.0, 3e-3])})
    assert not inf
    inv = np.float32(1.0 / np.float64(np.float32(3.0)))
    assert float(inv) == 0.3333333432674408
    assert np.array_equal(g["a"], np.float32([3.0, 21.0, 3e-3]) * inv)
    src = np.float32([1.0, 2.0])
    g, _ = LossScaler(1.0).unscale({"a": src})
    assert g["a"] is not src and np.array_equal(g["a"], src)


def test_state_dict_roundtrip_and_errors() -> None:
    s = DynamicLossScaler(init_scale=8.0, growth_interval=5)
    s.update(False)
    d = s.state_dict()
    assert set(d) == {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"}
    t = DynamicLossScaler()
    t.load_state_dict(d)
    assert t.state_dict() == d
    with pytest.raises(ValueError, match="needs keys"):
        t.load_state_dict({"scale": 1.0})
    with pytest.raises(ValueError, match="growth_factor"):
        DynamicLossScaler(growth_factor=1.0)
    with pytest.raises(ValueError, match="backoff_factor"):
        DynamicLossScaler(backoff_factor=1.0)
    with pytest.raises(ValueError, match="growth_interval"):
        DynamicLossScaler(growth_interval=0)
    with pytest.raises(ValueError, match="finite"):
        LossScaler(float("inf"))


@pytest.mark.torch
def test_against_torch_update_kernel() -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    cases = [(2.0 ** 16, 2.0, 0.5, 3), (1000.0, 1.1, 0.3, 2), (2.0 ** 120, 4.0, 0.5, 1), (1.0, 2.0, 0.25, 1),
             (3.0, 1.7, 0.9, 4), (2.0 ** -140, 2.0, 0.5, 1)]
    for init, gf, bf, gi in cases:
        ours = DynamicLossScaler(init_scale=init, growth_factor=gf, backoff_factor=bf, growth_interval=gi)
        scale = torch.full((), init, dtype=torch.float32)
        tracker = torch.zeros((), dtype=torch.int32)
        p_inf = rng.uniform(0.0, 0.6)
        for _ in range(300):
            inf = bool(rng.random() < p_inf)
            torch._amp_update_scale_(scale, tracker, torch.full((), float(inf)), gf, bf, gi)
            ours.update(inf)
            assert np.float32(ours.scale).tobytes() == scale.numpy().tobytes()
            assert ours.growth_tracker == int(tracker)


@pytest.mark.torch
def test_state_dict_matches_torch_keys() -> None:
    torch = pytest.importorskip("torch")
    g = torch.amp.GradScaler("cpu")
    assert set(g.state_dict()) == set(DynamicLossScaler().state_dict())
    assert g.state_dict() == DynamicLossScaler().state_dict()
