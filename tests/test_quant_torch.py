"""fpsim.quant against PyTorch (CPU) as the oracle: fake quantization forward/backward, observers,
FakeQuantize presets, the learnable (LSQ) op and FP8 casts. Comparisons are bit-exact unless noted."""

from __future__ import annotations

import numpy as np
import pytest

import fpsim.quant as Q

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.torch,
    # torch's own deprecation notices (reduce_range, torch.ao.quantization) are not what we test
    pytest.mark.filterwarnings("ignore:Please use quant_min:UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

_SPECIAL = np.float32([np.nan, np.inf, -np.inf, 1e30, -1e30, 1e18, -0.0, 0.0, 3e-39, -3e-39])


def _bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view(np.uint32 if a.dtype == np.float32 else np.uint64)


def _assert_same(ours: np.ndarray, ref: np.ndarray, what: str) -> None:
    ours = np.asarray(ours)
    assert ours.dtype == ref.dtype, (what, ours.dtype, ref.dtype)
    same = (_bits(ours) == _bits(ref)) | (np.isnan(ours) & np.isnan(ref))
    if not same.all():
        i = np.flatnonzero(~same.reshape(-1))[:5]
        raise AssertionError(f"{what}: {int((~same).sum())} mismatches, e.g. ours {ours.reshape(-1)[i]} "
                             f"torch {ref.reshape(-1)[i]} ({_bits(ours).reshape(-1)[i]} vs {_bits(ref).reshape(-1)[i]})")


def _torch_fq_tensor(x: np.ndarray, s: float, zp: int, qmin: int, qmax: int, dy: np.ndarray):
    xt = torch.from_numpy(x.copy()).requires_grad_(True)
    y = torch.fake_quantize_per_tensor_affine(xt, s, zp, qmin, qmax)
    y.backward(torch.from_numpy(dy.copy()))
    return y.detach().numpy(), xt.grad.numpy()


def _torch_fq_channel(x, s, zp, axis, qmin, qmax, dy):
    xt = torch.from_numpy(x.copy()).requires_grad_(True)
    y = torch.fake_quantize_per_channel_affine(xt, torch.from_numpy(s), torch.from_numpy(zp), axis, qmin, qmax)
    y.backward(torch.from_numpy(dy.copy()))
    return y.detach().numpy(), xt.grad.numpy()


# ------------------------------------------------------------------------------------------------
# per tensor

_PARAMS = [
    (0.5, 0, -128, 127),
    (0.1, 0, -128, 127),  # not a float32: used as float32(0.1)
    (0.0236220472, 42, 0, 127),
    (np.float32(0.013), 3, 0, 255),
    (1e-3, -5, -8, 7),
    (3.7, 100, 0, 255),
    (2.0**-10, 0, -(2**15), 2**15 - 1),
]


@pytest.mark.parametrize("s,zp,qmin,qmax", _PARAMS, ids=lambda v: repr(v))
def test_per_tensor_random(s, zp, qmin, qmax):
    rng = np.random.default_rng(int(abs(zp)) + qmax)
    width = float(s) * (qmax - qmin)
    x = (rng.standard_normal(60000) * width * 0.4 + rng.uniform(-1, 1) * width * 0.2).astype(np.float32)
    x = np.concatenate([x, _SPECIAL])
    dy = rng.standard_normal(x.size).astype(np.float32)
    y_ref, g_ref = _torch_fq_tensor(x, float(s), zp, qmin, qmax, dy)
    x_before = x.copy()
    _assert_same(Q.fake_quantize(x, s, zp, qmin, qmax), y_ref, "forward")
    _assert_same(Q.fake_quantize_grad(dy, x, s, zp, qmin, qmax), g_ref, "backward")
    assert np.array_equal(_bits(x), _bits(x_before))  # input untouched


@pytest.mark.parametrize("s", [0.5, 0.1, 0.25, 0.3, 1.0 / 3.0, 2.0**-7])
@pytest.mark.parametrize("zp,qmin,qmax", [(0, -128, 127), (3, 0, 255), (0, 0, 15), (7, 0, 15)])
def test_exact_ties_and_clamp_edges(s, zp, qmin, qmax):
    k = np.arange(qmin - zp - 4, qmax - zp + 4, dtype=np.float64)
    s32 = float(np.float32(s))
    ties = ((k + 0.5) * s32).astype(np.float32)  # x / s = k + 0.5 (exact for power-of-two s)
    at = (k * s32).astype(np.float32)
    near = np.concatenate([np.nextafter(ties, np.float32(np.inf)), np.nextafter(ties, np.float32(-np.inf))])
    x = np.concatenate([ties, -ties, at, near])
    dy = np.ones_like(x)
    y_ref, g_ref = _torch_fq_tensor(x, s, zp, qmin, qmax, dy)
    _assert_same(Q.fake_quantize(x, s, zp, qmin, qmax), y_ref, "forward")
    _assert_same(Q.fake_quantize_grad(dy, x, s, zp, qmin, qmax), g_ref, "backward")


def test_reference_table():
    """Rows of the reference's table (torch 2.13 observations), written out by hand."""
    x = np.float32([-1.75, -1.25, -0.75, -0.25, 0.25, 0.75, 1.25, 1.75, 0.3, 0.7, 63.5, 63.7, -64, -64.25,
                    63.75, 63.8, 64, 1e6, -64.3, -64.5])
    y = [-2, -1, -1, 0, 0, 1, 1, 2, 0.5, 0.5, 63.5, 63.5, -64, -64, 63.5, 63.5, 63.5, 63.5, -64, -64]
    g = [1] * 14 + [0] * 6
    assert Q.fake_quantize(x, 0.5, 0, -128, 127).tolist() == y
    assert Q.fake_quantize_grad(np.ones_like(x), x, 0.5, 0, -128, 127).tolist() == g
    x = np.float32([0.05, 0.15, 0.25, 0.35, 12.75])
    assert Q.fake_quantize(x, 0.1, 0, -128, 127).tolist() == [float(np.float32(v)) for v in (0, 0.2, 0.2, 0.4, 12.7)]
    assert Q.fake_quantize_grad(np.ones_like(x), x, 0.1, 0, -128, 127).tolist() == [1, 1, 1, 1, 0]


def test_per_tensor_float64_input():
    rng = np.random.default_rng(5)
    x = rng.standard_normal(5000) * 20
    for s, zp in ((0.1, 0), (0.37, 4)):
        y_ref, g_ref = _torch_fq_tensor(x, s, zp, -128, 127, np.ones_like(x))
        _assert_same(Q.fake_quantize(x, s, zp, -128, 127), y_ref, "forward f64")
        _assert_same(Q.fake_quantize_grad(np.ones_like(x), x, s, zp, -128, 127), g_ref, "backward f64")


def test_per_channel_float64_input():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((4, 500)) * 5
    s = np.float32([0.1, 0.37, 0.05, 0.013])
    for zp in (np.int32([0, 3, -2, 1]), np.float32([0.5, 1.5, -2.25, 0])):
        y_ref, g_ref = _torch_fq_channel(x, s, zp, 0, -128, 127, np.ones_like(x))
        _assert_same(Q.fake_quantize(x, s, zp, -128, 127, axis=0), y_ref, "forward f64")
        _assert_same(Q.fake_quantize_grad(np.ones_like(x), x, s, zp, -128, 127, axis=0), g_ref, "backward f64")


def test_grad_nan_times_zero_like_torch():
    x = np.float32([1000.0, 0.1, 1000.0])
    dy = np.float32([np.nan, 2.0, np.inf])
    _, g_ref = _torch_fq_tensor(x, 0.5, 0, -128, 127, dy)
    _assert_same(Q.fake_quantize_grad(dy, x, 0.5, 0, -128, 127), g_ref, "nan grads")


def test_tensor_qparams_overload_matches():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(3000) * 3).astype(np.float32)
    ref = torch.fake_quantize_per_tensor_affine(
        torch.from_numpy(x), torch.tensor([0.037]), torch.tensor([5], dtype=torch.int32), 0, 255).numpy()
    _assert_same(Q.fake_quantize(x, np.float32([0.037]), np.int32([5]), 0, 255), ref, "tensor qparams")


# ------------------------------------------------------------------------------------------------
# per channel


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_per_channel_axes(axis):
    rng = np.random.default_rng(axis + 10)
    x = (rng.standard_normal((6, 7, 8)) * 4).astype(np.float32)
    x.reshape(-1)[:len(_SPECIAL)] = _SPECIAL
    C = x.shape[axis]
    s = rng.uniform(0.005, 0.2, C).astype(np.float32)
    s[0] = 0.5
    zp = rng.integers(-20, 20, C).astype(np.int32)
    # exact ties in channel 0 (scale 0.5)
    idx = [slice(None)] * 3
    idx[axis] = 0
    x[tuple(idx)] = (np.arange(x[tuple(idx)].size).reshape(x[tuple(idx)].shape) - 20.5) * 0.5
    dy = rng.standard_normal(x.shape).astype(np.float32)
    y_ref, g_ref = _torch_fq_channel(x, s, zp, axis % 3, -128, 127, dy)
    _assert_same(Q.fake_quantize(x, s, zp, -128, 127, axis=axis), y_ref, "forward")
    _assert_same(Q.fake_quantize_grad(dy, x, s, zp, -128, 127, axis=axis), g_ref, "backward")


@pytest.mark.parametrize("shape,axis", [((3, 2, 70000), 1), ((100, 700, 3), 1), ((2, 3000), 0), ((5, 4, 3), 2)])
def test_per_channel_chunking(shape, axis):
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    x.reshape(-1)[::997] = np.inf
    C = shape[axis]
    s = rng.uniform(0.01, 0.1, C).astype(np.float32)
    zp = rng.integers(-10, 10, C).astype(np.int32)
    dy = np.ones(shape, np.float32)
    y_ref, g_ref = _torch_fq_channel(x, s, zp, axis, -128, 127, dy)
    _assert_same(Q.fake_quantize(x, s, zp, -128, 127, axis=axis), y_ref, "forward")
    _assert_same(Q.fake_quantize_grad(dy, x, s, zp, -128, 127, axis=axis), g_ref, "backward")


def test_per_channel_int64_zero_points_and_edges():
    x = np.float32([[0.25, 0.75, 64, -64.5], [0.125, 0.375, 33, -31]])
    y = Q.fake_quantize(x, [0.5, 0.25], np.int64([0, 2]), -128, 127, axis=0)
    assert y.tolist() == [[0, 1, 63.5, -64], [0, 0.5, 31.25, -31]]
    g = Q.fake_quantize_grad(np.ones_like(x), x, [0.5, 0.25], np.int64([0, 2]), -128, 127, axis=0)
    assert g.tolist() == [[1, 1, 0, 0], [1, 1, 0, 1]]
    big = np.float32([[np.nan, np.inf, -np.inf, 1e30, 4.6e18, 4.7e18, 9.3e18, 1e18]]).T.copy()
    big = np.repeat(big, 2, axis=1)
    s, zp = np.float32([0.5, 0.25]), np.int32([0, 1])
    y_ref, g_ref = _torch_fq_channel(big, s, zp, 1, -128, 127, np.ones_like(big))
    _assert_same(Q.fake_quantize(big, s, zp, -128, 127, axis=1), y_ref, "int64 conversion edges")
    _assert_same(Q.fake_quantize_grad(np.ones_like(big), big, s, zp, -128, 127, axis=1), g_ref, "edges grad")


def test_per_channel_float_zero_point():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((5, 300)) * 2).astype(np.float32)
    x[:, :len(_SPECIAL)] = _SPECIAL
    s = rng.uniform(0.01, 0.1, 5).astype(np.float32)
    zp = rng.uniform(-3, 3, 5).astype(np.float32)
    zp[0] = 0.0
    y_ref, g_ref = _torch_fq_channel(x, s, zp, 0, 0, 255, np.ones_like(x))
    _assert_same(Q.fake_quantize(x, s, zp, 0, 255, axis=0), y_ref, "float zp forward")
    _assert_same(Q.fake_quantize_grad(np.ones_like(x), x, s, zp, 0, 255, axis=0), g_ref, "float zp backward")


# ------------------------------------------------------------------------------------------------
# observers

from torch.ao.quantization import observer as tob

_TDT = {"quint8": torch.quint8, "qint8": torch.qint8}
_TQS = {
    "per_tensor_affine": torch.per_tensor_affine,
    "per_tensor_symmetric": torch.per_tensor_symmetric,
    "per_channel_affine": torch.per_channel_affine,
    "per_channel_symmetric": torch.per_channel_symmetric,
    "per_channel_affine_float_qparams": torch.per_channel_affine_float_qparams,
}


def _batches(seed: int, shape=(4, 50)) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = [np.float32(rng.standard_normal(shape) * rng.uniform(0.1, 5) + rng.uniform(-2, 2)) for _ in range(5)]
    out.append(np.abs(out[0]))  # all positive
    out.append(np.zeros(shape, np.float32))
    return out


_OBS_CASES = [
    ("quint8", "per_tensor_affine", False, None, None),
    ("quint8", "per_tensor_affine", True, None, None),
    ("qint8", "per_tensor_affine", False, None, None),
    ("qint8", "per_tensor_symmetric", False, None, None),
    ("qint8", "per_tensor_symmetric", True, None, None),
    ("quint8", "per_tensor_symmetric", False, None, None),
    ("quint8", "per_tensor_affine", True, 0, 255),
    ("quint8", "per_tensor_symmetric", False, 0, 100),
    ("qint8", "per_tensor_symmetric", False, -127, 127),
]


@pytest.mark.parametrize("moving", [False, True], ids=["minmax", "moving_avg"])
@pytest.mark.parametrize("dtype,qscheme,rr,qmin,qmax", _OBS_CASES, ids=lambda v: str(v))
def test_observers_per_tensor(moving, dtype, qscheme, rr, qmin, qmax):
    kw = {"dtype": _TDT[dtype], "qscheme": _TQS[qscheme], "reduce_range": rr, "quant_min": qmin, "quant_max": qmax}
    ours_cls = Q.MovingAverageMinMaxObserver if moving else Q.MinMaxObserver
    ref = (tob.MovingAverageMinMaxObserver if moving else tob.MinMaxObserver)(**kw)
    ours = ours_cls(dtype=dtype, qscheme=qscheme, reduce_range=rr, quant_min=qmin, quant_max=qmax)
    assert (ours.quant_min, ours.quant_max) == (ref.quant_min, ref.quant_max)
    s0, z0 = ours.calculate_qparams()
    assert (s0.tolist(), z0.tolist()) == ([1.0], [0])
    for b in _batches(hash((dtype, qscheme, rr)) % 1000):
        ref(torch.from_numpy(b))
        ours(b)
        assert float(ours.min_val) == float(ref.min_val) and float(ours.max_val) == float(ref.max_val)
        rs, rz = ref.calculate_qparams()
        s, z = ours.calculate_qparams()
        _assert_same(s, rs.numpy().astype(np.float32), "scale")
        assert z.tolist() == rz.tolist()


@pytest.mark.parametrize("moving", [False, True], ids=["minmax", "moving_avg"])
@pytest.mark.parametrize("qscheme", ["per_channel_affine", "per_channel_symmetric", "per_channel_affine_float_qparams"])
@pytest.mark.parametrize("ch_axis", [0, 1])
def test_observers_per_channel(moving, qscheme, ch_axis):
    dtype = "quint8" if qscheme == "per_channel_affine_float_qparams" else "qint8"
    kw = {"ch_axis": ch_axis, "dtype": _TDT[dtype], "qscheme": _TQS[qscheme]}
    ref = (tob.MovingAveragePerChannelMinMaxObserver if moving else tob.PerChannelMinMaxObserver)(**kw)
    ours_cls = Q.MovingAveragePerChannelMinMaxObserver if moving else Q.PerChannelMinMaxObserver
    ours = ours_cls(ch_axis=ch_axis, dtype=dtype, qscheme=qscheme)
    for b in _batches(ch_axis + 7, shape=(4, 6, 9)):
        ref(torch.from_numpy(b))
        ours(b)
        _assert_same(ours.min_val, ref.min_val.numpy(), "min")
        _assert_same(ours.max_val, ref.max_val.numpy(), "max")
        rs, rz = ref.calculate_qparams()
        s, z = ours.calculate_qparams()
        _assert_same(s, rs.numpy().astype(np.float32), "scale")
        if qscheme == "per_channel_affine_float_qparams":
            _assert_same(z, rz.numpy(), "zero point")
        else:
            assert z.tolist() == rz.tolist()


def test_observer_reference_table():
    """Values from the reference's table, by hand."""
    for data, s, z in (([-1, 3], 0.0156862754, 64), ([0.5, 3], 0.0117647061, 0), ([0, 0], 1.1920929e-07, 0)):
        ob = Q.MinMaxObserver()
        ob(np.float32(data))
        sc, zp = ob.calculate_qparams()
        assert np.float32(sc[0]) == np.float32(s) and int(zp[0]) == z
    for dt, z in (("qint8", 0), ("quint8", 128)):
        ob = Q.MinMaxObserver(dtype=dt, qscheme="per_tensor_symmetric")
        ob(np.float32([-1, 3]))
        sc, zp = ob.calculate_qparams()
        assert np.float32(sc[0]) == np.float32(0.0235294122) and int(zp[0]) == z


@pytest.mark.parametrize("preset", ["default_fake_quant", "default_weight_fake_quant",
                                    "default_per_channel_weight_fake_quant"])
def test_fake_quantize_presets(preset):
    import torch.ao.quantization as taq

    ref = getattr(taq, preset)()
    ours = getattr(Q, preset)()
    rng = np.random.default_rng(11)
    batches = [np.float32([[-1, 2], [0.5, 1]]), np.float32([[-3, 6], [1, -2]]), np.float32([[0, 1], [0.25, 0.5]])]
    batches += [np.float32(rng.standard_normal((2, 2)) * 3) for _ in range(3)]
    for b in batches:
        xt = torch.from_numpy(b.copy()).requires_grad_(True)
        yr = ref(xt)
        dy = np.float32(rng.standard_normal(b.shape))
        yr.backward(torch.from_numpy(dy))
        y = ours(b)
        _assert_same(ours.scale, ref.scale.numpy(), "scale")
        assert ours.zero_point.tolist() == ref.zero_point.tolist()
        _assert_same(y, yr.detach().numpy(), "output")
        _assert_same(ours.backward(dy), xt.grad.numpy(), "grad")


def test_fake_quant_reference_trace():
    """The reference's batches [-1,2], [-3,6], [0,1] through both presets (values by hand)."""
    fq, wq = Q.default_fake_quant(), Q.default_weight_fake_quant()
    scales_a, scales_w = [], []
    for b in ([-1, 2], [-3, 6], [0, 1]):
        y1 = fq(np.float32(b))
        y2 = wq(np.float32(b))
        scales_a.append(fq.scale[0])
        scales_w.append(wq.scale[0])
        if b == [-3, 6]:
            assert y1.tolist() == [np.float32(-1.0119685), np.float32(2.0480316)]
            assert y2.tolist() == [np.float32(-2.0479999), np.float32(2.0319998)]
    assert scales_a == [np.float32(v) for v in (0.0236220472, 0.0240944885, 0.0239322819)]
    assert scales_w == [np.float32(v) for v in (0.0156862754, 0.0159999989, 0.0159184299)]
    assert int(fq.zero_point[0]) == 42 and int(wq.zero_point[0]) == 0


# ------------------------------------------------------------------------------------------------
# learnable (LSQ)


def _torch_learnable(x, s, zp, qmin, qmax, gf, dy):
    xt = torch.from_numpy(x.copy()).requires_grad_(True)
    st = torch.tensor([s], dtype=torch.float32, requires_grad=True)
    zt = torch.tensor([zp], dtype=torch.float32, requires_grad=True)
    y = torch._fake_quantize_learnable_per_tensor_affine(xt, st, zt, qmin, qmax, gf)
    y.backward(torch.from_numpy(dy.copy()))
    return y.detach().numpy(), xt.grad.numpy(), st.grad.numpy(), zt.grad.numpy()


@pytest.mark.parametrize("s,zp,qmin,qmax,gf", [(0.5, 0.0, -8, 7, 1.0), (0.5, 3.0, 0, 255, 1.0),
                                                (0.1, 2.6, 0, 15, 0.5), (0.037, -1.4, -128, 127, 0.01),
                                                (0.25, 7.0, 0, 15, 1.0)])
def test_learnable_matches_torch(s, zp, qmin, qmax, gf):
    rng = np.random.default_rng(int(s * 1000))
    k = np.arange(qmin - 3, qmax + 3)
    x = np.concatenate([(rng.standard_normal(4000) * s * (qmax - qmin) / 3).astype(np.float32),
                        ((k + 0.5) * np.float32(s)).astype(np.float32)])
    dy = rng.standard_normal(x.size).astype(np.float32)
    y_ref, dx_ref, ds_ref, dz_ref = _torch_learnable(x, s, zp, qmin, qmax, gf, dy)
    _assert_same(Q.learnable_fake_quantize(x, s, zp, qmin, qmax), y_ref, "forward")
    dx, ds, dz = Q.learnable_fake_quantize_grad(dy, x, s, zp, qmin, qmax, gf)
    _assert_same(dx, dx_ref, "dx")
    # torch sums the per-element float32 vectors with its own cascade; ours sums in float64.
    np.testing.assert_allclose(ds, ds_ref, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(dz, dz_ref, rtol=2e-5, atol=1e-6)
    # short vectors: the sums are exact
    y_ref, dx_ref, ds_ref, dz_ref = _torch_learnable(x[-8:], s, zp, qmin, qmax, gf, np.ones(8, np.float32))
    dx, ds, dz = Q.learnable_fake_quantize_grad(np.ones(8, np.float32), x[-8:], s, zp, qmin, qmax, gf)
    _assert_same(dx, dx_ref, "dx (short)")
    _assert_same(ds, ds_ref, "dscale (short)")
    _assert_same(dz, dz_ref, "dzero_point (short)")


def test_learnable_tie_quirk_by_hand():
    x = np.float32([0.26, 0.74, -0.9, 10, -10, 3.1, 0.5])
    assert Q.learnable_fake_quantize(x, 0.5, 0.0, -8, 7).tolist() == [0.5, 0.5, -1, 3.5, -4, 3, 0.5]
    dx, ds, dz = Q.learnable_fake_quantize_grad(np.ones(7, np.float32), x, 0.5, 0.0, -8, 7)
    assert dx.tolist() == [1, 1, 1, 0, 0, 1, 1]
    assert np.float32(ds[0]) == np.float32(-1.39999962) and float(dz[0]) == -1.0
    x = np.float32([126.25, 126.75])  # x/s = 252.5, 253.5 with zp 3: forward 126, 126
    assert Q.learnable_fake_quantize(x, 0.5, 3.0, 0, 255).tolist() == [126, 126]
    dx, ds, _ = Q.learnable_fake_quantize_grad(np.ones(2, np.float32), x, 0.5, 3.0, 0, 255)
    assert dx.tolist() == [0, 0] and float(ds[0]) == 504.0
    assert Q.fake_quantize_grad(np.ones(2, np.float32), x, 0.5, 3, 0, 255).tolist() == [1, 0]


# ------------------------------------------------------------------------------------------------
# FP8 fake quantization against torch's float8 casts (torch 2.13 e4m3fn saturates; e5m2 does not)


@pytest.mark.parametrize("fmt,tdt,overflow", [("fp8_e4m3", "float8_e4m3fn", "saturate"),
                                               ("fp8_e5m2", "float8_e5m2", "ieee")])
@pytest.mark.parametrize("scale", [1.0, 149.33333, 2.0**-5])
def test_fp8_fake_quantize_vs_torch_cast(fmt, tdt, overflow, scale):
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(20000) * np.exp(rng.uniform(-8, 8, 20000))).astype(np.float32)
    x[:6] = [0.0, -0.0, 1e9, -1e9, 3e-30, 0.5]
    s = np.float32(scale)
    ref_q = (torch.from_numpy(x) * torch.tensor(s)).to(getattr(torch, tdt)).float()
    ref = (ref_q * (1.0 / torch.tensor(s))).numpy()
    ours = Q.fp8_fake_quantize(x, fmt, s, overflow=overflow)
    _assert_same(ours, ref, f"{fmt} fake quant")
    import fpsim.scaling as S
    _assert_same(S.quantize(x, fmt, s, overflow=overflow), ref_q.numpy(), f"{fmt} quantize")


def test_fma_contraction_near_ties():
    """torch's build fuses zp + x * inv (learnable backward, float-zp per channel): near-ties show it."""
    rng = np.random.default_rng(1)
    C, n = 16, 500
    s = rng.uniform(0.01, 1, C).astype(np.float32)
    zpf = rng.uniform(-3, 3, C).astype(np.float32)
    k = rng.integers(-100, 100, (C, n))
    x = (((k + 0.5) - zpf[:, None].astype(np.float64)) * s[:, None].astype(np.float64)).astype(np.float32)
    y_ref, g_ref = _torch_fq_channel(x, s, zpf, 0, -128, 127, np.ones_like(x))
    _assert_same(Q.fake_quantize(x, s, zpf, -128, 127, axis=0), y_ref, "float zp near ties")
    _assert_same(Q.fake_quantize_grad(np.ones_like(x), x, s, zpf, -128, 127, axis=0), g_ref, "float zp grads")
    for s1, zp in ((0.037, 2.0), (0.3, -1.0), (0.77, 5.0)):
        kk = np.arange(-12, 12)
        base = ((kk + 0.5) * np.float64(np.float32(s1))).astype(np.float32)
        xs = np.concatenate([base, np.nextafter(base, np.float32(np.inf)), np.nextafter(base, np.float32(-np.inf))])
        for i in range(len(xs)):  # one element at a time: dscale of one element is that element's value
            y_ref, dx_ref, ds_ref, dz_ref = _torch_learnable(xs[i:i + 1], s1, zp, -8, 7, 1.0, np.ones(1, np.float32))
            dx, ds, dz = Q.learnable_fake_quantize_grad(np.ones(1, np.float32), xs[i:i + 1], s1, zp, -8, 7, 1.0)
            _assert_same(dx, dx_ref, "dx")
            _assert_same(ds, ds_ref, "dscale")
            _assert_same(dz, dz_ref, "dzp")
