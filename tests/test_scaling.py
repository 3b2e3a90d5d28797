"""fpsim.scaling: TransformerEngine delayed/current scaling, per-channel/per-block quantize, MX and NVFP4.

Oracles: the reference's TE traces and tables written out by hand; ml_dtypes casts of float32 values
(a single correct rounding for float32 input) for element values; plain Python loops per block.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import fpsim.scaling as S

F32 = np.float32
FLT_MAX = float(np.finfo(np.float32).max)
INF, NAN = float("inf"), float("nan")
_MD = {
    "fp8_e4m3": ml_dtypes.float8_e4m3fn,
    "fp8_e5m2": ml_dtypes.float8_e5m2,
    "fp6_e2m3": ml_dtypes.float6_e2m3fn,
    "fp6_e3m2": ml_dtypes.float6_e3m2fn,
    "fp4_e2m1": ml_dtypes.float4_e2m1fn,
}
_MAX = {"fp8_e4m3": 448.0, "fp8_e5m2": 57344.0, "fp6_e2m3": 7.5, "fp6_e3m2": 28.0, "fp4_e2m1": 6.0}
_EMAX = {"fp8_e4m3": 8, "fp8_e5m2": 15, "fp6_e2m3": 2, "fp6_e3m2": 4, "fp4_e2m1": 2}


def _md_round_sat(v: np.ndarray, name: str) -> np.ndarray:
    """Independent saturating cast: clip to ±max, then ml_dtypes' (single, RNE) cast from float32."""
    v = np.asarray(v, dtype=F32)
    return np.clip(v, -_MAX[name], _MAX[name]).astype(_MD[name]).astype(F32)


# ------------------------------------------------------------------------------------------------
# Delayed scaling: the reference's trace (E4M3, history 4, margin 0), written out by hand.

_AMAX = [1, 2, .5, .25, 0, 8, INF, 1, 1, 1, 1, NAN, 1e-45, 3, 3, 3, 3]
_T = float(F32(448) / F32(3))  # 149.333...
_UNFUSED_MAX = [448, 224, 224, 224, 224, 56, 56, 56, 56, 56, 448, 448, 448, 448, 448, _T, _T]
_FUSED_MAX = [448, 224, 224, 224, 224, 56, 56, 56, 56, 56, 448, 448, 448, _T, _T, _T, _T]
_MOST_RECENT = [448, 224, 896, 1792, 1792, 56, 56, 448, 448, 448, 448, 448, FLT_MAX, _T, _T, _T, _T]


@pytest.mark.parametrize("algo,path,expected", [
    ("max", "unfused", _UNFUSED_MAX),
    ("max", "fused", _FUSED_MAX),
    ("most_recent", "unfused", _MOST_RECENT),
    ("most_recent", "fused", _MOST_RECENT),
], ids=["max-unfused", "max-fused", "most_recent-unfused", "most_recent-fused"])
def test_delayed_scaling_reference_trace(algo, path, expected):
    ds = S.DelayedScaling("fp8_e4m3", amax_history_len=4, amax_compute_algo=algo, update_path=path)
    got = [ds.update(a) for a in _AMAX]
    assert all(isinstance(g, np.float32) for g in got)
    assert [float(g) for g in got] == [float(F32(e)) for e in expected]


def _te_unfused_reference(amaxes, fp8_max, length, algo, margin):
    """The reference's unfused update, transcribed from its text with Python lists and float32 scalars."""
    hist = [F32(0)] * length
    scale = F32(1)
    out = []
    for a in amaxes:
        hist[0] = F32(a)
        if algo == "max":
            cur = F32(np.nan) if any(np.isnan(h) for h in hist) else max(hist)
        else:
            cur = hist[0]
        hist = hist[1:] + hist[:1]  # torch.roll(h, -1)
        hist[0] = F32(0)
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            sf = F32(F32(F32(fp8_max) / cur) / F32(2.0**margin))
        if not (cur > 0 and np.isfinite(cur)):
            sf = scale
        if np.isinf(sf):
            sf = F32(FLT_MAX)
        scale = sf
        out.append(float(scale))
    return out


@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("margin", [0, 1, 3])
def test_delayed_scaling_random_sequences(algo, margin):
    rng = np.random.default_rng(margin + len(algo))
    pool = [0.0, INF, NAN, 1e-45, 1e-40, 3e38, 1.0, 448.0]
    seq = [float(rng.choice(pool)) if rng.random() < 0.3 else float(np.exp(rng.uniform(-20, 20)))
           for _ in range(300)]
    for length in (1, 5, 16):
        ds = S.DelayedScaling("fp8_e5m2", amax_history_len=length, amax_compute_algo=algo, margin=margin)
        assert [float(ds.update(a)) for a in seq] == _te_unfused_reference(seq, 57344.0, length, algo, margin)


def test_delayed_scaling_margin_halves():
    ds = S.DelayedScaling("fp8_e4m3", amax_history_len=4, margin=1)
    got = [float(ds.update(a)) for a in _AMAX]
    assert got == [float(F32(e) / F32(2)) for e in _UNFUSED_MAX]
    assert got[-1] == float(F32(74.666664))


def test_delayed_scaling_history_mechanics():
    # history 1 = most recent; the window is this amax plus the previous len-1.
    ds = S.DelayedScaling("fp8_e5m2", amax_history_len=1)
    assert [float(ds.update(a)) for a in (2.0, 0.0, 7.0, NAN, 57344.0)] == [28672.0, 28672.0, 8192.0, 8192.0, 1.0]
    ds = S.DelayedScaling("fp8_e4m3", amax_history_len=3)
    ds.update(1.0)
    assert ds.amax_history.tolist() == [0.0, 0.0, 1.0]
    ds.update(4.0)
    assert ds.amax_history.tolist() == [0.0, 1.0, 4.0]
    ds.update(2.0)
    assert ds.amax_history.tolist() == [0.0, 4.0, 2.0]  # TE's roll drops slot 1 when zeroing slot 0
    assert float(ds.scale) == 112.0 and float(ds.scale_inv) == float(F32(1) / F32(112))
    assert float(ds.update(0.5)) == 112.0  # 4 still in the window
    assert float(ds.update(0.5)) == 224.0  # window (0.5, 0.5, 2)


def test_delayed_scaling_tiny_amax_and_record():
    ds = S.DelayedScaling("fp8_e4m3", amax_history_len=2)
    assert float(ds.update(1e-45)) == FLT_MAX  # 448 / 2**-149 overflows float32
    ds = S.DelayedScaling("fp8_e4m3", amax_history_len=2, scale=2.0)
    q = ds.quantize(np.float32([1.0, -300.0]))  # scale 2 of the previous step; saturates
    assert q.tolist() == [2.0, -448.0]
    ds.record(np.float32([10.0]))
    assert float(ds.update()) == float(F32(448) / F32(300))  # max of the recorded amaxes


def test_delayed_scaling_state_dict_round_trip():
    a = S.DelayedScaling("fp8_e4m3", amax_history_len=4)
    for v in _AMAX[:8]:
        a.update(v)
    st = a.state_dict()
    b = S.DelayedScaling("fp8_e4m3", amax_history_len=4)
    b.load_state_dict(st)
    assert [float(a.update(v)) for v in _AMAX[8:]] == [float(b.update(v)) for v in _AMAX[8:]]
    with pytest.raises(ValueError, match="entries"):
        S.DelayedScaling("fp8_e4m3", amax_history_len=5).load_state_dict(st)
    with pytest.raises(ValueError, match="format"):
        S.DelayedScaling("fp8_e5m2", amax_history_len=4).load_state_dict(st)
    with pytest.raises(ValueError, match="amax_compute_algo"):
        S.DelayedScaling(amax_compute_algo="mean")
    with pytest.raises(ValueError, match="update_path"):
        S.DelayedScaling(update_path="cuda")


# ------------------------------------------------------------------------------------------------
# Current scaling and compute_scale (TE compute_scale_from_amax; reference observations)


def test_compute_scale_reference_values():
    got = [float(S.compute_scale(a, "fp8_e4m3")) for a in (1, 3, 1e-3, 0, INF, NAN)]
    assert got == [448.0, float(F32(149.333328)), float(F32(447999.97)), 1.0, 1.0, 1.0]
    assert float(S.compute_scale(1e-40, "fp8_e4m3")) == FLT_MAX
    assert float(S.compute_scale(1e-40, "fp8_e4m3", value_for_inf=3.3895314e38)) == float(F32(3.3895314e38))
    pow2 = [float(S.compute_scale(a, "fp8_e4m3", power_of_two=True)) for a in (1, 3, 1e-3)]
    assert pow2 == [256.0, 128.0, 262144.0]
    assert float(S.compute_scale(1e-9, "fp8_e4m3", amax_epsilon=1e-3)) == float(F32(447999.97))
    arr = S.compute_scale(np.float32([1, 2, 0]), "fp8_e5m2", margin=2)
    assert arr.dtype == np.float32 and arr.tolist() == [14336.0, 7168.0, 1.0]


def test_current_scaling():
    cs = S.CurrentScaling("fp8_e4m3")
    q, s = cs.quantize(np.float32([3.0, -1.0, 0.001]))
    assert float(s) == float(F32(448) / F32(3))
    assert q.tolist() == _md_round_sat(np.float32([3.0, -1.0, 0.001]) * s, "fp8_e4m3").tolist()
    cs2 = S.CurrentScaling("fp8_e4m3", power_of_two=True)
    assert float(cs2.scale_for(np.float32([3.0]))) == 128.0
    assert float(S.CurrentScaling().scale_for(np.zeros(3, F32))) == 1.0
    with pytest.raises(ValueError):
        S.CurrentScaling(amax_epsilon=-1.0)


def test_recipes():
    assert [f.name for f in S.fp8_format_pair("HYBRID")] == ["fp8_e4m3", "fp8_e5m2"]
    r = S.get_recipe("delayed_hybrid")
    assert r.format_for("activation").name == "fp8_e4m3" and r.format_for("weight").name == "fp8_e4m3"
    assert r.format_for("gradient").name == "fp8_e5m2"
    sc = r.scaler("gradient")
    assert isinstance(sc, S.DelayedScaling) and sc.fmt.name == "fp8_e5m2" and sc.amax_history_len == 1024
    assert isinstance(S.recipes["current_hybrid"].scaler("weight"), S.CurrentScaling)
    assert S.recipes["block_fp8"].block_for("weight") == (128, 128)
    assert S.recipes["mxfp8"].scale_rounding == "ceil" and S.recipes["mxfp8_ocp"].scale_rounding == "floor"
    with pytest.raises(ValueError, match="valid"):
        S.get_recipe("fp8_magic")
    with pytest.raises(ValueError, match="role"):
        r.format_for("bias")
    with pytest.raises(ValueError, match="per-tensor"):
        S.recipes["mxfp8"].scaler("weight")
    with pytest.raises(ValueError, match="(?i)hybrid"):  # names parse by the one rule (fpsim._names)
        S.fp8_format_pair("E3M4")
    assert S.fp8_format_pair(" hybrid")[1].name == "fp8_e5m2"


# ------------------------------------------------------------------------------------------------
# quantize / dequantize: per tensor, per channel, per block, against plain loops + ml_dtypes


def test_amax_groupings():
    x = np.float32([[1, -2, 3, -4], [0.5, 0, 0, 8]])
    assert float(S.amax(x)) == 8.0
    assert S.amax(x, axis=0).tolist() == [4.0, 8.0]
    assert S.amax(x, axis=1).tolist() == [1.0, 2.0, 3.0, 8.0]
    assert S.amax(x, block=(1, 2)).tolist() == [[2.0, 4.0], [0.5, 8.0]]
    assert S.amax(x, block=2).tolist() == [[2.0, 4.0], [0.5, 8.0]]
    assert math.isnan(S.amax(np.float32([1, NAN])))
    assert float(S.amax(np.zeros(0, F32))) == 0.0


@pytest.mark.parametrize("block", [(1, 128), (128, 128), (2, 64), (256, 1)])
def test_per_block_matches_loop(block):
    rng = np.random.default_rng(sum(block))
    x = (rng.standard_normal((256, 384)) * np.exp(rng.uniform(-6, 6, (256, 1)))).astype(F32)
    q, s = S.scale_and_quantize(x, "fp8_e4m3", block=block, power_of_two=True)
    assert s.shape == (256 // block[0], 384 // block[1])
    back = S.dequantize(q, s, block=block)
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            blk = x[i * block[0]:(i + 1) * block[0], j * block[1]:(j + 1) * block[1]]
            am = float(np.abs(blk).max())
            sc = F32(2.0 ** math.floor(math.log2(448.0 / am)))  # power-of-two scale, rounded down
            assert s[i, j] == sc
            ref = _md_round_sat(blk * sc, "fp8_e4m3")
            got = q[i * block[0]:(i + 1) * block[0], j * block[1]:(j + 1) * block[1]]
            assert np.array_equal(got, ref)
            assert np.array_equal(back[i * block[0]:(i + 1) * block[0], j * block[1]:(j + 1) * block[1]],
                                  ref * (F32(1) / sc))


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_per_channel_matches_loop(axis):
    rng = np.random.default_rng(axis + 3)
    x = (rng.standard_normal((6, 10)) * 50).astype(F32)
    q, s = S.scale_and_quantize(x, "fp8_e5m2", axis=axis)
    xm = np.moveaxis(x, axis, 0)
    qm = np.moveaxis(q, axis, 0)
    for c in range(xm.shape[0]):
        sc = F32(57344.0) / F32(np.abs(xm[c]).max())
        assert s[c] == sc
        assert np.array_equal(qm[c], _md_round_sat(xm[c] * sc, "fp8_e5m2"))


def test_quantize_overflow_and_validation():
    x = np.float32([500.0, -1e6, NAN])
    assert S.quantize(x, "fp8_e4m3", 1.0).tolist()[:2] == [448.0, -448.0]
    ieee = S.quantize(x, "fp8_e4m3", 1.0, overflow="ieee")
    assert np.isnan(ieee).all()
    x0 = x.copy()
    S.quantize(x, "fp8_e4m3", 2.0)
    assert np.array_equal(x, x0, equal_nan=True)
    with pytest.raises(ValueError, match="does not divide"):
        S.quantize(np.zeros((4, 100), F32), "fp8_e4m3", 1.0, block=(1, 128))
    with pytest.raises(ValueError, match="does not divide"):
        S.amax(np.zeros((3, 128), F32), block=(2, 128))
    with pytest.raises(ValueError, match="more dimensions"):
        S.amax(np.zeros(8, F32), block=(1, 2, 2))
    with pytest.raises(ValueError, match="entries"):
        S.quantize(np.zeros((4, 3), F32), "fp8_e4m3", [1.0, 2.0], axis=0)
    with pytest.raises(ValueError, match="rounding"):
        S.quantize(np.zeros(3, F32), "fp8_e4m3", 1.0, rounding="nearest")
    with pytest.raises(ValueError, match="unknown format"):
        S.quantize(np.zeros(3, F32), "fp7", 1.0)
    with pytest.raises(TypeError):
        S.quantize(np.zeros(3, F32), "fp8_e4m3", 1.0, block=1.5)


def test_stochastic_rounding_is_reproducible():
    x = np.float32(np.linspace(0.01, 1, 1000))
    a = S.quantize(x, "fp8_e4m3", 300.0, rounding="sr", rng=np.random.default_rng(1))
    b = S.quantize(x, "fp8_e4m3", 300.0, rounding="sr", rng=np.random.default_rng(1))
    assert np.array_equal(a, b)


# ------------------------------------------------------------------------------------------------
# MX


def test_mx_hand_computed_blocks():
    """The reference's table: block amax 500, 448, 1, 0.003 under both scale rules (E4M3)."""
    def one(amax, rule):
        x = np.zeros(32, F32)
        x[5] = amax
        e, s = S.mx_quantize(x, "fp8_e4m3", scale_rounding=rule)
        return float(s[0]), float(e[5]), float(S.mx_dequantize(e, s)[5])

    assert one(500, "ceil") == (2.0, 256.0, 512.0)       # 2.4% error
    assert one(500, "floor") == (1.0, 448.0, 448.0)      # clamped: 10.4% error
    assert abs(512 / 500 - 1) < 0.025 and abs(448 / 500 - 1) > 0.10
    for rule in ("ceil", "floor"):
        assert one(448, rule) == (1.0, 448.0, 448.0)
        assert one(1, rule) == (2.0**-8, 256.0, 1.0)
        assert one(0.003, rule) == (2.0**-17, 384.0, 0.0029296875)


def _max_elem_and_rms_errors(lo: float, hi: float, rule: str, elem: str = "fp8_e4m3"):
    rng = np.random.default_rng(0)
    nb = 2000
    e = rng.integers(-10, 10, nb)
    m = rng.uniform(lo, hi, nb)
    x = (rng.uniform(-1, 1, (nb, 32)) * (m * 2.0**e)[:, None]).astype(F32)
    k = rng.integers(0, 32, nb)
    x[np.arange(nb), k] = (m * 2.0**e).astype(F32)  # block amax = m * 2**e
    q, s = S.mx_quantize(x, elem, scale_rounding=rule)
    back = S.mx_dequantize(q, s)
    am = np.abs(x).max(axis=1)
    max_elem = np.abs(back[np.arange(nb), k] - x[np.arange(nb), k]) / am
    rms = np.sqrt(((back - x) ** 2).sum(axis=1) / (x**2).sum(axis=1))
    return max_elem, rms, m


def test_mx_floor_vs_ceil_on_large_mantissa_blocks():
    """Blocks whose amax mantissa exceeds the element max's (1.75 for E4M3): floor saturates the block
    maximum (error (m - 1.75) / m), ceil does not (error at most half an E4M3 ulp at 224..256)."""
    f_max, f_rms, m = _max_elem_and_rms_errors(1.76, 1.999, "floor")
    c_max, c_rms, _ = _max_elem_and_rms_errors(1.76, 1.999, "ceil")
    np.testing.assert_allclose(f_max, (m - 1.75) / m, rtol=1e-4)
    assert c_max.max() <= 8 / 224 + 1e-6
    assert f_max.mean() > 0.06 and c_max.mean() < 0.02      # measured 0.068 vs 0.017
    assert c_rms.mean() < f_rms.mean()                      # measured 0.024 vs 0.037 (relative RMS)
    # mantissa <= 1.75: the two rules pick the same scale for E4M3
    a_max, a_rms, _ = _max_elem_and_rms_errors(1.0, 1.75, "floor")
    b_max, b_rms, _ = _max_elem_and_rms_errors(1.0, 1.75, "ceil")
    assert np.array_equal(a_max, b_max) and np.array_equal(a_rms, b_rms)


@pytest.mark.parametrize("elem", list(_MD))
@pytest.mark.parametrize("rule", ["floor", "ceil"])
def test_mx_properties(elem, rule):
    rng = np.random.default_rng(len(elem) + len(rule))
    x = (rng.standard_normal((40, 64)) * np.exp(rng.uniform(-30, 30, (40, 1)))).astype(F32)
    x[0, :32] = 0.0
    q, s = S.mx_quantize(x, elem, scale_rounding=rule)
    assert s.shape == (40, 2) and s.dtype == np.float32
    mant, _ = np.frexp(s.astype(np.float64))
    assert np.all(mant == 0.5)  # powers of two
    assert float(s[0, 0]) == 2.0**-127
    assert np.array_equal(s.astype(ml_dtypes.float8_e8m0fnu).astype(F32), s)  # E8M0 values
    assert np.array_equal(q.astype(_MD[elem]).astype(F32), q)  # element values
    for i in range(40):
        for j in range(2):
            blk = x[i, 32 * j:32 * (j + 1)]
            am = float(np.abs(blk).max())
            if am == 0:
                continue
            if rule == "floor":
                exp = math.frexp(am)[1] - 1 - _EMAX[elem]
            else:
                v = float(F32(am) * F32(1.0 / _MAX[elem]))
                mm, ee = math.frexp(v)
                exp = ee - 1 if mm == 0.5 else ee
                assert am / 2.0**exp <= _MAX[elem] * (1 + 2**-20)  # nothing saturates
            assert float(s[i, j]) == 2.0**exp
            assert np.array_equal(q[i, 32 * j:32 * (j + 1)], _md_round_sat(blk / F32(2.0**exp), elem))


def test_mx_axis_and_dequantize():
    rng = np.random.default_rng(9)
    x = rng.standard_normal((64, 8)).astype(F32)
    q0, s0 = S.mx_quantize(x, "fp8_e5m2", axis=0)
    q1, s1 = S.mx_quantize(x.T.copy(), "fp8_e5m2", axis=-1)
    assert np.array_equal(q0, q1.T) and np.array_equal(s0, s1.T) and s0.shape == (2, 8)
    back = S.mx_dequantize(q0, s0, axis=0)
    assert back.dtype == np.float32 and np.all(np.abs(back - x) <= np.abs(x) * 2.0**-3 + 2.0**-14)
    exact = np.float32(np.arange(32) - 16) * F32(0.25)
    q, s = S.mx_quantize(exact, "fp8_e4m3")
    assert np.array_equal(S.mx_dequantize(q, s), exact)
    bad = np.zeros(64, F32)
    bad[3], bad[40] = NAN, INF
    q, s = S.mx_quantize(bad, "fp8_e4m3")
    assert np.isnan(s).all() and np.isnan(q).all()
    with pytest.raises(ValueError, match="does not divide"):
        S.mx_quantize(np.zeros(48, F32), "fp8_e4m3")
    with pytest.raises(ValueError, match="scale_rounding"):
        S.mx_quantize(np.zeros(32, F32), "fp8_e4m3", scale_rounding="nearest")
    with pytest.raises(ValueError, match="scales have shape"):
        S.mx_dequantize(np.zeros(64, F32), np.ones(3, F32))


# ------------------------------------------------------------------------------------------------
# NVFP4


def test_nvfp4_hand_computed():
    b1 = np.float32([0, 0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75, 2, 2.5, 3, 3.5, 4, 5, 5.5, -6])  # amax 6
    b2 = np.float32([1.5, 0.1, -0.2, 0.3] + [0] * 12)                                       # amax 1.5
    q, d, g = S.nvfp4_quantize(np.concatenate([b1, b2]))
    # tensor: s_enc = 448*6/6 = 448, s_dec = float32(1/448)
    assert float(g) == float(F32(1) / F32(448))
    # block 1: d = 6/6*448 = 448; element scale 1/(448*s_dec) = 1 -> RNE onto the E2M1 grid
    # block 2: d = 1.5/6*448 = 112; element scale 4
    assert d.tolist() == [448.0, 112.0]
    assert q[:16].tolist() == [0, 0, 0.5, 1, 1, 1, 1.5, 2, 2, 2, 3, 4, 4, 4, 6, -6]
    assert q[16:20].tolist() == [6.0, 0.5, -1.0, 1.0]
    back = S.nvfp4_dequantize(q, d, g)
    assert back[:16].tolist() == q[:16].tolist()
    assert back[16:20].tolist() == [1.5, 0.125, -0.25, 0.25]


def test_nvfp4_properties():
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((8, 64)) * np.exp(rng.uniform(-4, 4, (8, 1)))).astype(F32)
    q, d, g = S.nvfp4_quantize(x)
    assert d.shape == (8, 4) and isinstance(g, np.float32)
    assert np.array_equal(d.astype(ml_dtypes.float8_e4m3fn).astype(F32), d)
    assert np.array_equal(q.astype(ml_dtypes.float4_e2m1fn).astype(F32), q)
    back = S.nvfp4_dequantize(q, d, g)
    blk_amax = np.abs(x.reshape(8, 4, 16)).max(axis=2, keepdims=True)
    err = np.abs(back - x).reshape(8, 4, 16) / blk_amax
    assert err.max() < 0.25  # half of E2M1's top gap (2) over 6, plus the E4M3 scale rounding
    q2, _, _ = S.nvfp4_quantize(x, rounding="sr", rng=np.random.default_rng(0))
    assert np.array_equal(q2.astype(ml_dtypes.float4_e2m1fn).astype(F32), q2)
    qz, dz, gz = S.nvfp4_quantize(np.zeros(16, F32))
    # TE's reference: amax 0 gives s_enc = min(2688 / 0, FLT_MAX) = FLT_MAX, so s_dec = 1 / FLT_MAX
    assert qz.tolist() == [0.0] * 16 and dz.tolist() == [0.0] and float(gz) == float(F32(1) / F32(FLT_MAX))


def test_nvfp4_2d_blocks_and_block_scale_underflow():
    rng = np.random.default_rng(8)
    w = (rng.standard_normal((32, 48)) * np.exp(rng.uniform(-3, 3, (32, 1)))).astype(F32)
    q, d, g = S.nvfp4_quantize(w, block=(16, 16))
    assert d.shape == (2, 3)
    s_enc = F32(F32(2688.0) / F32(np.abs(w).max()))
    mult = F32(s_enc * F32(1.0 / 6.0))
    for i in range(2):
        for j in range(3):
            tile = w[16 * i:16 * (i + 1), 16 * j:16 * (j + 1)]
            dd = F32(np.clip(F32(np.abs(tile).max()) * mult, -448, 448)).astype(ml_dtypes.float8_e4m3fn)
            assert d[i, j] == F32(dd)
            enc = F32(1) / F32(F32(dd) * g)
            assert np.array_equal(q[16 * i:16 * (i + 1), 16 * j:16 * (j + 1)], _md_round_sat(tile * enc, "fp4_e2m1"))
    back = S.nvfp4_dequantize(q, d, g, block=(16, 16))
    assert back.shape == w.shape and back.dtype == np.float32
    # a block whose scale underflows E4M3 (d = 0): encode scale FLT_MAX, nonzero values saturate to ±6
    x = np.float32([1000.0] + [0.0] * 15 + [1e-3, -1e-3] + [0.0] * 14)
    q, d, g = S.nvfp4_quantize(x)
    assert d.tolist() == [448.0, 0.0] and q[16:18].tolist() == [6.0, -6.0]


def test_mx_small_formats_by_hand():
    x = np.zeros(32, F32)
    x[:3] = [7.0, 1.0, -0.3]
    e, s = S.mx_quantize(x, "fp4_e2m1", scale_rounding="floor")  # X = 2**(2 - 2) = 1; 7 clamps to 6
    assert s.tolist() == [1.0] and e[:3].tolist() == [6.0, 1.0, -0.5]
    e, s = S.mx_quantize(x, "fp4_e2m1", scale_rounding="ceil")   # X = 2**ceil(log2(7/6)) = 2
    assert s.tolist() == [2.0] and e[:3].tolist() == [4.0, 0.5, 0.0]  # 3.5 ties to even (4); 0.15 -> 0
    e, s = S.mx_quantize(x, "fp6_e3m2", scale_rounding="floor")  # X = 2**(2 - 4) = 1/4: 28 exact
    assert s.tolist() == [0.25] and e[:3].tolist() == [28.0, 4.0, -1.25]
    e, s = S.mx_quantize(x, "fp6_e2m3", block=8)                  # 4 blocks; zero blocks get 2**-127
    assert s.tolist() == [1.0, 2.0**-127, 2.0**-127, 2.0**-127] and e[:3].tolist() == [7.0, 1.0, -0.25]


def test_mx_float64_and_directed_modes():
    rng = np.random.default_rng(12)
    x = rng.standard_normal(256) * 10
    e64, s64 = S.mx_quantize(x, "fp8_e4m3")
    assert e64.dtype == np.float64 and s64.dtype == np.float32
    e32, s32 = S.mx_quantize(x.astype(F32), "fp8_e4m3")
    assert np.array_equal(s64, s32)
    up, _ = S.mx_quantize(x.astype(F32), "fp8_e4m3", rounding="rup")
    dn, _ = S.mx_quantize(x.astype(F32), "fp8_e4m3", rounding="rdn")
    assert np.all(up >= e32) and np.all(dn <= e32) and np.all(up - dn >= 0)
    a, _ = S.mx_quantize(x, "fp8_e4m3", rounding="sr", rng=np.random.default_rng(3))
    b, _ = S.mx_quantize(x, "fp8_e4m3", rounding="sr", rng=np.random.default_rng(3))
    assert np.array_equal(a, b) and np.all((a == up) | (a == dn) | (a == e32))


def test_delayed_scaling_float64_data_and_fake_quantize():
    ds = S.DelayedScaling("fp8_e4m3", amax_history_len=2)
    x = np.array([0.1, -2.0, 3.0])
    y = ds.fake_quantize(x)  # scale 1 at first
    assert y.dtype == np.float64 and y.tolist() == [0.1015625, -2.0, 3.0]
    assert float(ds.update()) == float(F32(448) / F32(3))
    q = ds.quantize(x)
    assert q.tolist() == _md_round_sat(x.astype(F32) * ds.scale, "fp8_e4m3").tolist()
    assert np.allclose(ds.dequantize(q), x, rtol=2**-4)


def test_mx_scales_extremes():
    ceil = S.mx_scales([1e-45, 1e-40, 0.0, 3e38, 1e-36], "fp8_e4m3", scale_rounding="ceil").tolist()
    assert ceil == [2.0**-127, 2.0**-127, 2.0**-127, 2.0**120, 2.0**-127]
    floor = S.mx_scales([1e-45, 3e38, 2.0**-100], "fp8_e4m3", scale_rounding="floor").tolist()
    assert floor == [2.0**-127, 2.0**119, 2.0**-108]


def test_mx_ceil_rule_te_kernel_edges():
    x = np.zeros(96, F32)
    x[0], x[1] = np.inf, 3.0        # block 0: amax inf -> 2**127 under TE's rule, NaN under OCP's
    x[32] = np.nan                  # block 1: NaN scale under both
    x[64], x[65] = 1e-37, 5e-38     # block 2: amax*(1/448) < 2**-127 -> scale 2**-127, elements unscaled
    e, s = S.mx_quantize(x, "fp8_e4m3", scale_rounding="ceil")
    assert s[0] == F32(2.0**127) and np.isnan(s[1]) and s[2] == F32(2.0**-127)
    assert e[0] == 448.0 and e[1] == 0.0 and np.isnan(e[32:64]).all()
    assert e[64] == 0.0 and e[65] == 0.0  # 1e-37 * 1 rounds to 0 in E4M3 (TE's exp2f_rcp(0) == 1)
    e, s = S.mx_quantize(x, "fp8_e4m3", scale_rounding="floor")
    assert np.isnan(s[0]) and np.isnan(s[1]) and s[2] == F32(2.0**-127)
    assert e[64] == _md_round_sat(np.float32([1e-37 * 2.0**127]), "fp8_e4m3")[0]  # OCP: x / X


def test_delayed_scaling_spike_story_in_docs():
    """docs/scaling.md: a 10 000x spike saturates its own step, then starves a whole window."""
    rng = np.random.default_rng(0)
    base = rng.standard_normal(4096).astype(F32)
    ds = S.DelayedScaling("fp8_e4m3", amax_history_len=16)
    stats = []
    for step in range(26):
        x = (base * F32(1e4 if step == 8 else 1.0)).astype(F32)
        y = ds.fake_quantize(x)
        rel = float(np.sqrt(np.mean((y - x) ** 2) / np.mean(x**2)))
        stats.append((float(ds.scale), rel, float(np.mean((y == 0) & (x != 0)))))
        ds.update()
    assert stats[8][1] > 0.999                           # the spike step, quantised with a stale scale
    assert all(s[0] == stats[9][0] for s in stats[9:25])  # the spike holds the scale for the window
    assert round(stats[9][0], 5) == 0.01149 and 0.05 < stats[9][2] < 0.065 and stats[9][1] > 0.045
    assert stats[25][0] == stats[7][0] and stats[25][1] < 0.03
