"""Trainium3 (NeuronCore-v4) MX matmul preset against a naive reference written here.

The reference follows the stated model with exact arithmetic: element x E8M0 scale (Fractions), the products added
in K order from C, each sum rounded once to fp32 by MPFR (gmpy2: precision 24, fp32's exponent range, RNE), the
result written to BF16 by MPFR (precision 8) with RNE. Stochastic rounding is checked for reproducibility from a
saved generator state and for landing on a BF16 neighbour.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

import fpsim
from fpsim.mma import get_model, preset_provenance, trainium

gmpy2 = pytest.importorskip("gmpy2", reason="the naive reference rounds with MPFR (gmpy2)")


def _round(q: Fraction, p: int) -> Fraction:
    # fp32 (p=24) / bf16 (p=8): exponent range of fp32, subnormals; MPFR exponent = IEEE exponent + 1
    with gmpy2.context(precision=p, emin=-126 - (p - 1) + 1, emax=128, subnormalize=True,
                       round=gmpy2.RoundToNearest):
        return Fraction(*gmpy2.mpfr(gmpy2.mpq(q.numerator, q.denominator)).as_integer_ratio())


def naive(a: np.ndarray, b: np.ndarray, sa: np.ndarray, sb: np.ndarray, c: np.ndarray | None,
          out_p: int | None) -> np.ndarray:
    m, k = a.shape
    n = b.shape[1]
    d = np.empty((m, n))
    for i in range(m):
        for j in range(n):
            acc = Fraction(0) if c is None else Fraction(float(c[i, j]))
            for t in range(k):
                x = Fraction(float(a[i, t])) * Fraction(float(sa[i, t // 32]))
                y = Fraction(float(b[t, j])) * Fraction(float(sb[t // 32, j]))
                acc = _round(acc + x * y, 24)
            d[i, j] = float(_round(acc, out_p) if out_p else acc)
    return d


def operands(rng: np.random.Generator, m: int, k: int, n: int, ea: str, eb: str) -> tuple[np.ndarray, ...]:
    a = np.asarray(fpsim.round(rng.normal(size=(m, k)) * 2, ea, overflow="saturate"), dtype=np.float64)
    b = np.asarray(fpsim.round(rng.normal(size=(k, n)) * 2, eb, overflow="saturate"), dtype=np.float64)
    a[0, :5] = 0.0  # zeros, a sign cancellation and the largest elements
    b[:3, 0] = -b[:3, 0]
    a[-1, -1] = fpsim.as_format(ea).max
    sa = 2.0 ** rng.integers(-6, 7, (m, k // 32)).astype(np.float64)
    sb = 2.0 ** rng.integers(-6, 7, (k // 32, n)).astype(np.float64)
    return a, b, sa, sb


@pytest.mark.parametrize("ea,eb", [("fp8_e4m3", "fp8_e4m3"), ("fp8_e5m2", "fp8_e4m3"), ("fp4_e2m1", "fp4_e2m1")])
@pytest.mark.parametrize("output", ["fp32", "bf16"])
def test_mx_matmul_matches_naive_reference(ea: str, eb: str, output: str) -> None:
    rng = np.random.default_rng(3003)
    a, b, sa, sb = operands(rng, 5, 96, 4, ea, eb)
    c = np.asarray(fpsim.round(rng.normal(size=(5, 4)), "fp32"), dtype=np.float64)
    args = (a.copy(), b.copy(), sa.copy(), sb.copy())
    got = np.asarray(trainium.matmul_mx(a, b, sa, sb, c, element=ea, element_b=eb, output=output), dtype=np.float64)
    ref = naive(a, b, sa, sb, c, 8 if output == "bf16" else None)
    assert np.array_equal(got, ref), np.argwhere(got != ref)[:4]
    for x, y in zip((a, b, sa, sb), args):
        assert np.array_equal(x, y)  # inputs untouched


def test_sr_bf16_write_replays_from_a_saved_state() -> None:
    rng = np.random.default_rng(3004)
    a, b, sa, sb = operands(rng, 4, 64, 4, "fp8_e4m3", "fp8_e4m3")
    g = np.random.default_rng(77)
    state = g.bit_generator.state  # a plain dict: save it anywhere (JSON), restore to replay the draws
    r1 = trainium.matmul_mx(a, b, sa, sb, output="bf16", stochastic_rounding=True, rng=g)
    g.bit_generator.state = state
    r2 = trainium.matmul_mx(a, b, sa, sb, output="bf16", stochastic_rounding=True, rng=g)
    assert np.array_equal(r1, r2)
    d32 = np.asarray(trainium.matmul_mx(a, b, sa, sb), dtype=np.float64)
    lo = np.asarray(fpsim.round(d32, "bf16", "rdn"), dtype=np.float64)
    hi = np.asarray(fpsim.round(d32, "bf16", "rup"), dtype=np.float64)
    assert np.all((r1 == lo) | (r1 == hi))


def test_edges_and_errors() -> None:
    a = np.zeros((1, 32))
    b = np.zeros((32, 1))
    one = np.ones((1, 1))
    nan_scale = np.full((1, 1), np.nan)
    assert np.isnan(trainium.matmul_mx(a, b, nan_scale, one)[0, 0])  # an E8M0 NaN scale makes its block NaN
    assert trainium.matmul_mx(a, b, one, one)[0, 0] == 0.0
    with pytest.raises(ValueError, match="not a value of fp8_e4m3"):
        trainium.matmul_mx(np.full((1, 32), 0.3), b, one, one)
    with pytest.raises(ValueError, match="E8M0"):
        trainium.matmul_mx(a, b, np.full((1, 1), 3.0), one)
    with pytest.raises(ValueError, match="valid: fp8_e4m3, fp8_e5m2, fp4_e2m1"):
        trainium.matmul_mx(a, b, one, one, element="fp6_e2m3")
    with pytest.raises(ValueError, match="multiple of 32"):
        trainium.matmul_mx(np.zeros((1, 16)), np.zeros((16, 1)), one, one)
    with pytest.raises(ValueError, match="valid: trn3"):
        trainium.matmul_mx(a, b, one, one, device="trn2")
    with pytest.raises(ValueError, match="needs rng"):
        trainium.matmul_mx(a, b, one, one, output="bf16", stochastic_rounding=True)


def test_presets_registered_with_provenance() -> None:
    for fin in trainium.INPUTS_V4:
        assert get_model("trainium3", fin).name.startswith("trn3")
        prov = preset_provenance("trn3", fin)
        assert not prov.validated and "NeuronCore-v4" in prov.source
    with pytest.raises(ValueError, match="valid: bf16->fp32"):
        get_model("trn3", "tf32")
