"""fpsim.quant without torch: a naive per-element transcription of torch's kernels, the reference's
tables by hand, validation, module state, and import weight. (Torch-oracle tests: test_quant_torch.py.)"""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

import fpsim.quant as Q

F32 = np.float32


def _naive_fq(x: float, s: float, zp: int, qmin: int, qmax: int) -> tuple[float, bool]:
    """torch's per-tensor CPU kernel, one element at a time, in float32 scalars."""
    s32 = F32(s)
    inv = F32(F32(1.0) / s32)
    t = F32(np.rint(F32(F32(x) * inv)) + F32(zp))
    mask = bool(qmin <= t <= qmax)
    c = F32(qmin) if math.isnan(t) else min(max(t, F32(qmin)), F32(qmax))
    return float(F32(F32(c - F32(zp)) * s32)), mask


@pytest.mark.parametrize("s,zp,qmin,qmax", [(0.5, 0, -128, 127), (0.1, 3, 0, 255), (0.0137, -2, -8, 7)])
def test_vectorised_matches_naive(s, zp, qmin, qmax):
    rng = np.random.default_rng(qmax)
    x = (rng.standard_normal(3000) * s * (qmax - qmin) / 3).astype(F32)
    x[:8] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e30, (qmax - zp + 0.5) * s, (qmin - zp - 0.5) * s]
    y, m = Q.fake_quantize_with_mask(x, s, zp, qmin, qmax)
    ref = [_naive_fq(float(v), s, zp, qmin, qmax) for v in x]
    assert y.tolist() == [r[0] for r in ref]
    assert m.tolist() == [r[1] for r in ref]
    assert np.array_equal(Q.fake_quantize(x, s, zp, qmin, qmax), y)  # mask-free forward path
    big = np.tile(x, 30)  # several chunks
    assert np.array_equal(Q.fake_quantize(big, s, zp, qmin, qmax), np.tile(y, 30))


def test_scalar_and_list_inputs():
    assert float(Q.fake_quantize(np.float32(0.75), 0.5, 0, -128, 127)) == 1.0
    y = Q.fake_quantize([0.25, 0.75], 0.5, 0, -128, 127)
    assert y.dtype == np.float64 and y.tolist() == [0.0, 1.0]


def test_validation():
    x = np.zeros(4, F32)
    with pytest.raises(ValueError, match="quant_min"):
        Q.fake_quantize(x, 0.5, 0, 10, 5)
    with pytest.raises(ValueError, match="zero_point"):
        Q.fake_quantize(x, 0.5, 300, 0, 255)
    with pytest.raises(ValueError, match="per-channel"):
        Q.fake_quantize(x, [0.5, 0.25], 0, 0, 255)
    with pytest.raises(ValueError, match="channels"):
        Q.fake_quantize(np.zeros((2, 3), F32), [0.5, 0.25, 1.0], [0, 0, 0], 0, 255, axis=0)
    with pytest.raises(ValueError, match="out of range"):
        Q.fake_quantize(np.zeros((2, 3), F32), [0.5, 0.25], [0, 0], 0, 255, axis=2)
    with pytest.raises(TypeError):
        Q.fake_quantize(x, 0.5, "0", 0, 255)
    with pytest.raises(TypeError):
        Q.fake_quantize(np.array(["a"]), 0.5, 0, 0, 255)
    with pytest.raises(ValueError, match="integer"):
        Q.fake_quantize(x, 0.5, 0.5, 0, 255)
    with pytest.raises(ValueError, match="unknown quantized dtype"):
        Q.MinMaxObserver(dtype="int4")
    with pytest.raises(ValueError, match="qscheme"):
        Q.MinMaxObserver(qscheme="per_channel_affine")
    with pytest.raises(ValueError, match="include 0"):
        Q.MinMaxObserver(quant_min=1, quant_max=255)
    with pytest.raises(NotImplementedError):
        Q.MinMaxObserver(dtype="quint8", qscheme="per_tensor_symmetric", reduce_range=True)


def test_quant_range():
    assert Q.quant_range("quint8") == (0, 255)
    assert Q.quant_range("qint8", reduce_range=True) == (-64, 63)
    assert Q.quant_range("qint8", quant_min=-127, quant_max=127) == (-127, 127)
    assert Q.quant_range("quint8", quant_min=0, quant_max=255, reduce_range=True) == (0, 127)
    assert Q.quant_range("qint32") == (-(2**31), 2**31 - 1)


def test_observers_by_hand():
    ob = Q.MinMaxObserver()
    assert [a.tolist() for a in ob.calculate_qparams()] == [[1.0], [0]]  # nothing observed
    ob(np.zeros(0, F32))
    assert [a.tolist() for a in ob.calculate_qparams()] == [[1.0], [0]]
    ob(np.float32([-1, 3]))
    s, z = ob.calculate_qparams()
    assert s[0] == F32(4) / F32(255) and z.tolist() == [64]
    ob(np.float32([np.nan]))
    with pytest.raises(ValueError, match="NaN"):
        ob.calculate_qparams()
    ma = Q.MovingAverageMinMaxObserver()
    for b in ([-1, 2], [-3, 6], [0, 1]):
        ma(np.float32(b))
    assert float(ma.min_val) == float(F32(-1.0098)) and float(ma.max_val) == float(F32(2.0296))
    st = ma.state_dict()
    mb = Q.MovingAverageMinMaxObserver()
    mb.load_state_dict(st)
    assert [a.tolist() for a in mb.calculate_qparams()] == [a.tolist() for a in ma.calculate_qparams()]
    with pytest.raises(ValueError, match="dtype"):
        Q.MovingAverageMinMaxObserver(dtype="qint8").load_state_dict(st)
    pc = Q.PerChannelMinMaxObserver(ch_axis=1, dtype="qint8", qscheme="per_channel_symmetric")
    pc(np.float32([[1, -2, 0], [0.5, 4, 0]]))
    s, z = pc.calculate_qparams()
    assert s.tolist() == [float(F32(1) / F32(127.5)), float(F32(4) / F32(127.5)), float(np.finfo(F32).eps)]
    assert z.tolist() == [0, 0, 0]


def test_fake_quantize_module_state():
    fq = Q.default_per_channel_weight_fake_quant()
    w = np.float32([[0.1, -0.2, 0.3], [1.0, 2.0, -4.0]])
    y = fq(w)
    assert fq.scale.shape == (2,) and fq.zero_point.tolist() == [0, 0]
    assert np.array_equal(y, Q.fake_quantize(w, fq.scale, fq.zero_point, -128, 127, axis=0))
    assert np.array_equal(fq.backward(np.ones_like(w)), np.ones_like(w))
    st = fq.state_dict()
    fq2 = Q.default_per_channel_weight_fake_quant()
    fq2.load_state_dict(st)
    fq2.disable_observer()
    assert np.array_equal(fq2(w), y)
    fq2.disable_fake_quant()
    assert np.array_equal(fq2(w), w)
    assert np.array_equal(fq2.backward(np.ones_like(w)), np.ones_like(w))


def test_learnable_by_hand_and_unreduced():
    x = np.float32([0.26, 0.74, -0.9, 10, -10, 3.1, 0.5])
    dx, ds, dz = Q.learnable_fake_quantize_grad(np.ones(7, F32), x, 0.5, 0.0, -8, 7, reduce=False)
    assert dx.tolist() == [1, 1, 1, 0, 0, 1, 1]
    assert dz.tolist() == [0, 0, 0, -0.5, -0.5, 0, 0]
    assert ds[3] == 7.0 and ds[4] == -8.0  # qmax - zp, qmin - zp
    assert ds[0] == F32(F32(F32(0.5) - F32(0.26)) * F32(2.0))  # (round(x/s)·s - x)·inv
    assert Q.lsq_grad_factor(100, 127) == 1 / math.sqrt(12700)


def test_fp8_fake_quantize_ste():
    x = np.float32([1.0, 500.0, -1e4, np.nan])
    y = Q.fp8_fake_quantize(x, "fp8_e4m3")
    assert y[:3].tolist() == [1.0, 448.0, -448.0] and np.isnan(y[3])
    g = np.float32([1, 2, 3, 4])
    assert Q.fp8_fake_quantize_grad(g, x).tolist() == [1, 2, 3, 4]
    assert Q.fp8_fake_quantize_grad(g, x, "fp8_e4m3", clip=True).tolist() == [1, 0, 0, 0]
    assert Q.fp8_fake_quantize_grad(g, x, "fp8_e4m3", 0.5, clip=True).tolist() == [1, 2, 0, 0]
    with pytest.raises(ValueError, match="needs x"):
        Q.fp8_fake_quantize_grad(g, clip=True)


def test_import_is_light():
    code = "import sys, fpsim; fpsim.quant; fpsim.scaling; print(sorted(m for m in ('torch', 'matplotlib', " \
           "'hypothesis') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_fma32_single_rounding_against_mpfr():
    gmpy2 = pytest.importorskip("gmpy2")
    from fpsim.quant._fake import _fma32

    def oracle(a: float, b: float, c: float) -> float:
        with gmpy2.context(precision=24, round=gmpy2.RoundToNearest, emin=-148, emax=128, subnormalize=True):
            return float(gmpy2.mpfr(gmpy2.mpq(a) * gmpy2.mpq(b) + gmpy2.mpq(c)))

    # a double-rounding trap: the float64 sum is exactly a float32 midpoint, the exact sum is just below
    a, b, c = F32(2.0**-24 * (1 + 2.0**-23)), F32(1 - 2.0**-23), F32(1 + 2.0**-23)
    assert float(_fma32(a, b, c)) == oracle(float(a), float(b), float(c)) == 1 + 2.0**-23
    assert float(F32(np.float64(a) * np.float64(b) + np.float64(c))) == 1 + 2.0**-22  # the naive result
    rng = np.random.default_rng(0)
    av = (rng.standard_normal(3000) * np.exp(rng.uniform(-20, 20, 3000))).astype(F32)
    bv = (rng.standard_normal(3000) * np.exp(rng.uniform(-20, 20, 3000))).astype(F32)
    cv = (-(av.astype(np.float64) * bv) * rng.choice([1, 1 + 2**-24, 1 - 2**-30, 0.5], 3000)).astype(F32)
    got = _fma32(av, bv, cv)
    assert [float(g) for g in got] == [oracle(float(x), float(y), float(z)) for x, y, z in zip(av, bv, cv)]
