"""fpsim.round against MPFR (gmpy2) in every format, mode, overflow policy and sign.

Cases: every value of each small format, the exact midpoints between neighbours, those midpoints moved
by one float64 ulp and one float32 ulp each way, the overflow threshold and half the smallest subnormal
with a hair either side, the subnormal/normal boundary — and hypothesis-drawn float64 values.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fpsim
from _mpfr_oracle import mpfr_bounded_ieee, oracle_round

MODES = ["rne", "rna", "rtz", "rup", "rdn", "rto"]
OVERFLOWS = ["ieee", "saturate"]
FORMATS = [f for f in fpsim.all_formats() if f.name != "fp64" and f.table is None]  # tables: test_hif8.py
SMALL = [f for f in FORMATS if f.width <= 8]
ids = lambda f: f.name  # noqa: E731


def same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise bit-level equality of values: NaN == NaN, -0 != +0."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return (np.isnan(a) & np.isnan(b)) | ((a == b) & (np.signbit(a) == np.signbit(b)))


def _sample_values(fmt: fpsim.Format, n: int, rng: np.random.Generator) -> np.ndarray:
    """Positive finite values of fmt: all of them for <= 8 bits, else a random sample of codes."""
    if fmt.width <= 8:
        return fmt.values()[fmt.values() > 0]
    width = fmt.width - int(fmt.signed)
    codes = rng.integers(0, 1 << width, n, dtype=np.uint64)
    # always include the edges of the range
    edges = np.array([1, 2, 3, (1 << fmt.mbits) - 1, 1 << fmt.mbits, (1 << fmt.mbits) + 1], dtype=np.uint64)
    v = fpsim.from_bits(np.concatenate([codes, edges]), fmt)
    v = v[np.isfinite(v) & (v > 0)]
    top = np.array([fmt.max, fmt.min_normal, fmt.min_subnormal])
    return np.unique(np.concatenate([v, top]))


def hard_cases(fmt: fpsim.Format, n: int = 400, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    v = _sample_values(fmt, n, rng)
    up = np.asarray(fmt.next_up(v), dtype=np.float64)
    up = np.where(np.isfinite(up), up, v + fmt.ulp(fmt.max))  # past max: the overflow threshold grid
    mids = (v + up) / 2
    q = fmt.min_subnormal
    special = np.array(
        [
            q / 2,
            q / 4,
            3 * q / 4,
            fmt.min_normal - q / 2,
            fmt.min_normal * (1 - 2.0**-30),
            fmt.max + fmt.ulp(fmt.max) / 2,
            fmt.max * 2,
            fmt.max * 1e10 if fmt.max < 1e290 else fmt.max,
            1e-300,
            5e-324,
            1.0,
            0.1,
            1 / 3,
        ]
    )
    base = np.concatenate([v, mids, special, np.array([0.0])])
    cases = [base, np.nextafter(base, np.inf), np.nextafter(base, -np.inf)]
    with np.errstate(over="ignore"):
        f32 = base.astype(np.float32)
        exact32 = f32.astype(np.float64) == base
        cases.append(np.nextafter(f32[exact32], np.float32(np.inf)).astype(np.float64))
        cases.append(np.nextafter(f32[exact32], np.float32(-np.inf)).astype(np.float64))
    x = np.concatenate(cases)
    x = x[np.isfinite(x)]
    x = np.concatenate([x, -x, np.array([np.inf, -np.inf, np.nan, -0.0])])
    return np.unique(x)  # unique keeps one of ±0 only; add -0 explicitly below
    # (np.unique treats -0 == 0)


def _check(x: np.ndarray, fmt: fpsim.Format, mode: str, overflow: str, subnormals: bool = True) -> None:
    x = np.concatenate([x, np.array([-0.0])])
    got = np.asarray(fpsim.round(x, fmt, mode, overflow=overflow, subnormals=subnormals), dtype=np.float64)
    want = np.array([oracle_round(float(v), fmt, mode, overflow, subnormals) for v in x])
    bad = ~same(got, want)
    if np.any(bad):
        i = np.flatnonzero(bad)[:8]
        lines = [f"{float(x[j]).hex()} ({x[j]!r}): got {got[j]!r}, want {want[j]!r}" for j in i]
        pytest.fail(f"{bad.sum()} mismatches in {fmt.name}/{mode}/{overflow}:\n" + "\n".join(lines))


@pytest.mark.parametrize("overflow", OVERFLOWS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", FORMATS, ids=ids)
def test_hard_cases_float64(fmt: fpsim.Format, mode: str, overflow: str) -> None:
    _check(hard_cases(fmt, n=150), fmt, mode, overflow)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", FORMATS, ids=ids)
def test_hard_cases_float32_input(fmt: fpsim.Format, mode: str) -> None:
    x = hard_cases(fmt, n=150, seed=1)
    with np.errstate(over="ignore"):
        x32 = x.astype(np.float32)
    x32 = x32[(x32.astype(np.float64) == x) | np.isnan(x)]
    got = fpsim.round(x32, fmt, mode)
    assert got.dtype == (np.float32 if fmt.fits_float32 else np.float64)
    want = np.array([oracle_round(float(v), fmt, mode) for v in x32])
    assert same(got, want).all(), x32[~same(got, want)][:5]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", [f for f in FORMATS if f.subnormals and f.signed], ids=ids)
def test_flush_to_zero(fmt: fpsim.Format, mode: str) -> None:
    _check(hard_cases(fmt, n=80, seed=2), fmt, mode, "ieee", subnormals=False)


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", [fpsim.fp16, fpsim.bf16], ids=ids)
def test_every_16bit_value_and_midpoint(fmt: fpsim.Format, mode: str) -> None:
    """All 2**16 patterns of fp16/bf16: each value, each midpoint and both float64 neighbours of it."""
    v = fmt.values()
    mids = (v[:-1] + v[1:]) / 2
    x = np.concatenate([v, mids, np.nextafter(mids, np.inf), np.nextafter(mids, -np.inf)])
    if fmt is fpsim.bf16:
        x = x[np.random.default_rng(0).random(x.size) < 0.25]  # bf16: a quarter, for time
    got = np.asarray(fpsim.round(x, fmt, mode), dtype=np.float64)
    want = np.array([oracle_round(float(t), fmt, mode) for t in x])
    bad = ~same(got, want)
    assert not bad.any(), (x[bad][:5], got[bad][:5], want[bad][:5])


@pytest.mark.parametrize("mode", ["rne", "rtz", "rup", "rdn"])
@pytest.mark.parametrize("fmt", [f for f in FORMATS if f.has_inf], ids=ids)
def test_ieee_overflow_matches_mpfr_exponent_range(fmt: fpsim.Format, mode: str) -> None:
    """For IEEE formats, MPFR with the format's own emax decides overflow too: the §7.4 rules agree."""
    x = hard_cases(fmt, n=60, seed=3)
    x = x[np.isfinite(x)]
    got = np.asarray(fpsim.round(x, fmt, mode), dtype=np.float64)
    want = np.array([mpfr_bounded_ieee(float(t), fmt, mode) for t in x])
    assert same(got, want).all()


finite64 = st.floats(allow_nan=False, allow_infinity=False, width=64)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    x=st.lists(finite64, min_size=1, max_size=20),
    fmt=st.sampled_from(FORMATS),
    mode=st.sampled_from(MODES),
    overflow=st.sampled_from(OVERFLOWS),
)
def test_hypothesis_any_float64(x: list[float], fmt: fpsim.Format, mode: str, overflow: str) -> None:
    a = np.array(x)
    got = np.asarray(fpsim.round(a, fmt, mode, overflow=overflow), dtype=np.float64)
    want = np.array([oracle_round(float(t), fmt, mode, overflow) for t in a])
    assert same(got, want).all(), (a, got, want)


@settings(max_examples=300, deadline=None)
@given(
    scale=st.integers(-160, 140),
    mant=st.integers(0, 2**52 - 1),
    fmt=st.sampled_from(FORMATS),
    mode=st.sampled_from(MODES),
)
def test_hypothesis_in_format_range(scale: int, mant: int, fmt: fpsim.Format, mode: str) -> None:
    """Values spread over each format's own range (where interesting things happen)."""
    lo = fmt.emin - fmt.mbits - 2
    hi = fmt.emax + 2
    e = lo + (scale - -160) * (hi - lo) // 300
    x = math.ldexp(1 + mant / 2**52, e)
    a = np.array([x, -x])
    got = np.asarray(fpsim.round(a, fmt, mode), dtype=np.float64)
    want = np.array([oracle_round(float(t), fmt, mode) for t in a])
    assert same(got, want).all(), (a, got, want)
