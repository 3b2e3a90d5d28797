"""HiF8 (arXiv 2409.16626), exhaustively, against an oracle written here from the paper's definition.

The oracle decodes each code from the bit fields (sign, prefix-coded dot, sign-magnitude exponent with an implicit
leading bit, mantissa; denormal mode 2**(M-23)) independently of fpsim's table, and rounds with exact rationals
(fractions: every comparison with a neighbour or a midpoint is exact): the nearest value, ties away from zero
(the paper's TA) or to the even code, overflow from the midpoint of 2**15 and 1.5 * 2**15 (the place of the
infinity code on the grid). en_dtypes (which has ``hifloat8``) is a second oracle where it is installed.
"""

from __future__ import annotations

import bisect
import math
from fractions import Fraction

import numpy as np
import pytest

import fpsim

MAX = 32768.0
ABOVE = 49152.0  # the grid value of the infinity code 0x6F


def spec_decode(code: int) -> float:
    """One code, from the fields of the paper's Table 1, by string slicing (nothing shared with fpsim)."""
    if code == 0x80:
        return math.nan
    s, rest = code >> 7, f"{code & 0x7F:07b}"
    if rest.startswith("0000"):  # denormal mode
        m = int(rest[4:], 2)
        mag = 0.0 if m == 0 else 2.0 ** (m - 23)
    else:
        width = {"11": 4, "10": 3, "01": 2}.get(rest[:2])
        if width is None:
            width, body = (1, rest[3:]) if rest.startswith("001") else (0, rest[4:])
        else:
            body = rest[2:]
        if width == 0:
            e, frac = 0, body
        else:
            e_abs = int("1" + body[1:width], 2)  # the implicit leading magnitude bit
            e, frac = (-e_abs if body[0] == "1" else e_abs), body[width:]
        mag = (1 + Fraction(int(frac, 2) if frac else 0, 2 ** len(frac))) * Fraction(2) ** e
        mag = float(mag)
        if code & 0x7F == 0x6F:
            mag = math.inf
    return -mag if s else mag


CODES = list(range(256))
DECODED = [spec_decode(c) for c in CODES]
POS = sorted((v, c) for c, v in zip(CODES, DECODED) if not math.isnan(v) and 0 <= v < math.inf)
GRID: list[tuple[float, int | None]] = [*POS, (ABOVE, None)]
GRID_Q = [Fraction(v) for v, _ in GRID]


def oracle(x: float, mode: str, overflow: str = "ieee") -> float:
    if math.isnan(x):
        return math.nan
    neg = math.copysign(1.0, x) < 0
    if math.isinf(x):
        r = MAX if overflow == "saturate" else math.inf
        return -r if neg else r
    a = Fraction(abs(x))
    grid = GRID
    k = bisect.bisect_right(GRID_Q, a) - 1  # the last grid value <= a (exact comparisons)
    lo, clo = grid[k]
    if Fraction(lo) == a or k == len(grid) - 1:
        r_i = k
    else:
        hi, chi = grid[k + 1]
        c = 2 * a - Fraction(lo) - Fraction(hi)
        if mode == "rna":
            up = c >= 0
        elif mode == "rne":
            up = c > 0 or (c == 0 and (0x6F if chi is None else chi) % 2 == 0)
        elif mode == "rtz":
            up = False
        elif mode == "rup":
            up = not neg
        else:  # rdn
            up = neg
        r_i = k + int(up)
    if r_i == len(grid) - 1:  # past max on the grid: IEEE 754 7.4
        stop = overflow == "saturate" or mode == "rtz" or (mode == "rdn" and not neg) or (mode == "rup" and neg)
        r = MAX if stop else math.inf
    else:
        r = grid[r_i][0]
    return (-r if r != 0 else 0.0) if neg else r


def probes() -> np.ndarray:
    vals = np.array([v for v, _ in POS])
    mids = (vals[:-1] + vals[1:]) / 2
    edge = np.array([MAX, (MAX + ABOVE) / 2, ABOVE, 1e5, 1e30, 2.0**-23, 2.0**-24, 1.5 * 2.0**-23, 1e-30,
                     0.0, np.inf, np.nan, 1.5e-45])
    base = np.concatenate([vals, mids, edge]).astype(np.float32)
    x = np.concatenate([base, np.nextafter(base, np.float32(np.inf)), np.nextafter(base, np.float32(-np.inf))])
    return np.concatenate([x, -x])


def same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (np.isnan(a) & np.isnan(b)) | ((a == b) & (np.signbit(a) == np.signbit(b)))


def test_every_code_decodes_as_the_paper_defines() -> None:
    got = np.asarray(fpsim.from_bits(np.arange(256, dtype=np.uint16), "hif8"), dtype=np.float64)
    assert same(got, np.array(DECODED)).all()
    f = fpsim.hif8
    assert (f.max, f.min_subnormal, f.min_normal, f.width, f.nan_code, f.eps) == (MAX, 2.0**-22, 2.0**-15, 8,
                                                                                   0x80, 0.125)
    assert f.values().size == 253  # 126 finite magnitudes each sign, one zero
    fin = np.isfinite(got) & ~np.isnan(got)
    back = np.asarray(fpsim.to_bits(got[fin], "hif8")).astype(np.int64)
    assert np.array_equal(back, np.arange(256)[fin])  # every number re-encodes to its code
    assert fpsim.to_bits(np.inf, "hif8") == 0x6F and fpsim.to_bits(-np.inf, "hif8") == 0xEF
    assert fpsim.to_bits(np.nan, "hif8") == 0x80 and fpsim.to_bits(-0.0, "hif8") == 0


@pytest.mark.parametrize("overflow", ["ieee", "saturate"])
@pytest.mark.parametrize("mode", ["rne", "rna", "rtz", "rup", "rdn"])
def test_rounding_matches_the_oracle(mode: str, overflow: str) -> None:
    rng = np.random.default_rng(8001)
    # probes, plus random float32 patterns over the whole range and random float64 in HiF8's range
    x32 = np.concatenate([probes(), rng.integers(0, 1 << 32, 4000, dtype=np.uint64).astype(np.uint32)
                          .view(np.float32)])
    x64 = np.ldexp(rng.uniform(-2, 2, 4000), rng.integers(-26, 18, 4000))
    for x in (x32, x64):
        before = x.copy()
        got = np.asarray(fpsim.round(x, "hif8", mode, overflow=overflow), dtype=np.float64)
        ref = np.array([oracle(float(v), mode, overflow) for v in x])
        bad = ~same(got, ref)
        assert not bad.any(), f"{int(bad.sum())}/{x.size}: {x[bad][:4]} -> {got[bad][:4]} != {ref[bad][:4]}"
        assert np.array_equal(x, before, equal_nan=True)


def test_exact_rationals_round_as_floats_do() -> None:
    q = [Fraction(17, 16) + Fraction(1, 10**30), Fraction(17, 16), Fraction(10**400), -Fraction(1, 10**400),
         Fraction(81920 + 1, 2)]
    got = [float(fpsim.round(v, "hif8", "rna")) for v in q]
    assert got[:4] == [1.125, 1.125, math.inf, 0.0] and got[4] == math.inf


def test_stochastic_rounding_is_unbiased_and_reproducible() -> None:
    x = np.full(200_000, 1.03125)  # a quarter of the way from 1.0 to 1.125
    r1 = np.asarray(fpsim.round(x, "hif8", "sr", rng=np.random.default_rng(3)))
    r2 = np.asarray(fpsim.round(x, "hif8", "sr", rng=np.random.default_rng(3)))
    assert np.array_equal(r1, r2) and set(np.unique(r1)) == {1.0, 1.125}
    assert abs(float(np.mean(r1 == 1.125)) - 0.25) < 0.005


def test_neighbours_ulp_and_arrays() -> None:
    h = fpsim.hif8
    assert float(h.next_up(15.0)) == 16.0 and float(h.next_down(16.0)) == 15.0 and float(h.next_up(MAX)) == np.inf
    assert float(h.next_up(-(2.0**-22))) == 0.0 and float(h.ulp(300.0)) == 128.0
    a = fpsim.array([1.0, 2.0, 3.0], "hif8")
    assert (a / 3).tolist() == [0.34375, 0.6875, 1.0]  # each quotient rounded to nearest, ties to even code
    assert fpsim.as_format("hifloat8") is h
    assert fpsim.fp16.contains(h) and not h.contains(fpsim.fp8_e4m3)
    rep = fpsim.analyze(np.array([1.0, 40000.0, 45000.0, 1e-9]), "hif8")
    assert (rep.total, rep.overflow) == (4, 1)


def test_matches_en_dtypes_where_installed() -> None:
    en = pytest.importorskip("en_dtypes", reason="en_dtypes (hifloat8) is not installed")
    codes = np.arange(256, dtype=np.uint8)
    ref = codes.view(en.hifloat8).astype(np.float64)
    assert same(np.asarray(fpsim.from_bits(codes, "hif8"), dtype=np.float64), ref).all()
    rng = np.random.default_rng(8002)
    x = np.concatenate([probes(), rng.integers(0, 1 << 32, 100_000, dtype=np.uint64).astype(np.uint32)
                        .view(np.float32)])
    with np.errstate(all="ignore"):
        ref = x.astype(en.hifloat8).astype(np.float64)
    got = np.asarray(fpsim.round(x, "hif8", "rna"), dtype=np.float64)  # en_dtypes rounds ties away (TA)
    # en_dtypes gives -0 nowhere either (0x80 is NaN), so values compare with their signs
    assert same(got, ref).all(), x[~same(got, ref)][:5]
