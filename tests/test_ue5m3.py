"""UE5M3 (Rubin's block-scale type), exhaustively, against an oracle written here from the definition.

The definition, independent of fpsim: 8 bits, no sign, a 5-bit exponent field e and 3-bit mantissa m, bias 15;
e = 0 is subnormal (m * 2**-17), otherwise (8 + m) * 2**(e - 18); 0xFF is NaN and there is no infinity, so the
largest value is 0xFE = 114688. Rounding is MPFR's (gmpy2) onto 4 bits with that exponent range; a negative
nonzero result is NaN (no sign bit); past 114688 the IEEE policy gives NaN (no infinity) in the modes that
would give infinity and 114688 in those that round toward zero (IEEE 754 7.4); saturation gives 114688.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import fpsim

gmpy2 = pytest.importorskip("gmpy2", reason="the MPFR oracle needs gmpy2")

MAX = 114688.0
MODES = {"rne": gmpy2.RoundToNearest, "rtz": gmpy2.RoundToZero, "rup": gmpy2.RoundUp, "rdn": gmpy2.RoundDown}


def spec_decode(code: int) -> float:
    if code == 0xFF:
        return math.nan
    e, m = code >> 3, code & 7
    return math.ldexp(m, -17) if e == 0 else math.ldexp(8 + m, e - 18)


def oracle(x: float, mode: str, overflow: str) -> float:
    if math.isnan(x):
        return math.nan
    if math.isinf(x):
        return MAX if (overflow == "saturate" and x > 0) else math.nan
    # precision 4, smallest subnormal 2**-17 (MPFR exponent -16), no upper limit: overflow is judged after.
    with gmpy2.context(precision=4, emin=-16, emax=4096, subnormalize=True, round=MODES[mode]):
        r = float(gmpy2.mpfr(x))
    if r < 0:
        return math.nan
    r = abs(r)  # -0 is +0: there is no sign bit
    if r > MAX:  # IEEE 754 7.4: the modes that round toward zero stop at the largest finite value
        return MAX if overflow == "saturate" or mode in ("rtz", "rdn") else math.nan
    return r


def probe_inputs() -> np.ndarray:
    """Every value, every midpoint between neighbours, each +- 1 float32 ulp; edges, specials, negatives."""
    vals = np.array([spec_decode(c) for c in range(255)], dtype=np.float64)
    mids = (vals[:-1] + vals[1:]) / 2
    edge = np.array([MAX, MAX + 4096, MAX + 8192, MAX * 4, 2.0**-17, 2.0**-18, 2.0**-19, 3 * 2.0**-19,
                     2.0**-14, 1e-30, 1e30, np.inf, -np.inf, np.nan, 0.0, -0.0, 1.5e-45])
    base = np.concatenate([vals, mids, edge]).astype(np.float32)
    up = np.nextafter(base, np.float32(np.inf))
    down = np.nextafter(base, np.float32(-np.inf))
    x = np.concatenate([base, up, down])
    return np.concatenate([x, -x])


def same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (np.isnan(a) & np.isnan(b)) | (a == b)


def test_every_code_decodes_as_the_definition() -> None:
    codes = np.arange(256, dtype=np.uint8)
    got = np.asarray(fpsim.from_bits(codes, "ue5m3"), dtype=np.float64)
    ref = np.array([spec_decode(int(c)) for c in codes])
    assert same(got, ref).all()
    f = fpsim.ue5m3
    assert (f.max, f.min_normal, f.min_subnormal, f.width, f.signed, f.has_inf, f.nan_code) == (
        MAX, 2.0**-14, 2.0**-17, 8, False, False, 0xFF)
    # every number re-encodes to its own code
    back = np.asarray(fpsim.to_bits(got[:255], "ue5m3")).astype(np.int64)
    assert np.array_equal(back, np.arange(255))


@pytest.mark.parametrize("overflow", ["ieee", "saturate"])
@pytest.mark.parametrize("mode", list(MODES))
def test_rounding_matches_mpfr(mode: str, overflow: str) -> None:
    rng = np.random.default_rng(5301)
    x = probe_inputs()
    # plus random float32 patterns over the whole range, positive and negative
    rnd = rng.integers(0, 1 << 32, 20000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = np.concatenate([x, rnd])
    x_before = x.copy()
    got = np.asarray(fpsim.round(x, "ue5m3", mode, overflow=overflow), dtype=np.float64)
    ref = np.array([oracle(float(v), mode, overflow) for v in x])
    bad = ~same(got, ref)
    assert not bad.any(), f"{int(bad.sum())} of {x.size} differ, e.g. {x[bad][:4]} -> {got[bad][:4]} != {ref[bad][:4]}"
    assert np.array_equal(x.view(np.uint32), x_before.view(np.uint32))  # input untouched
    # the same through the NumPy reference kernel
    old = fpsim.rounding.use_c_kernel
    try:
        fpsim.rounding.use_c_kernel = False
        got_np = np.asarray(fpsim.round(x, "ue5m3", mode, overflow=overflow), dtype=np.float64)
    finally:
        fpsim.rounding.use_c_kernel = old
    assert same(got_np, ref).all()


def test_rounding_matches_ml_dtypes_where_it_has_the_type() -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    if not hasattr(ml_dtypes, "float8_e5m3fnu"):
        pytest.skip(f"ml_dtypes {ml_dtypes.__version__} has no float8_e5m3fnu (0.7.0 has)")
    rng = np.random.default_rng(5302)
    x = np.concatenate([probe_inputs(), rng.integers(0, 1 << 32, 20000, dtype=np.uint64).astype(np.uint32)
                        .view(np.float32)])
    got = np.asarray(fpsim.round(x, "ue5m3"), dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        ref = x.astype(ml_dtypes.float8_e5m3fnu).astype(np.float64)
    # ml_dtypes 0.7.0 sends every negative nonzero input to NaN, also one that rounds to zero; fpsim (and the
    # oracle above) round first, as IEEE 754 5.8 does for unsigned targets, so -1e-9 becomes 0. Elsewhere equal.
    neg_to_zero = (x < 0) & (got == 0)
    assert same(got, ref)[~neg_to_zero].all()
    assert np.isnan(ref[neg_to_zero]).all()
    # storage: fpsim writes and reads the ml_dtypes type
    assert fpsim.ml_dtype("ue5m3") == np.dtype(ml_dtypes.float8_e5m3fnu)


def test_names_and_arrays() -> None:
    assert fpsim.as_format("float8_e5m3fnu") is fpsim.ue5m3
    a = fpsim.array([1.0, 3.3, 100000.0], "ue5m3")
    assert a.format is fpsim.ue5m3
    assert a.tolist() == [1.0, 3.25, 98304.0]
    assert a.bits.tolist() == [0x78, 0x85, 0xFC]
