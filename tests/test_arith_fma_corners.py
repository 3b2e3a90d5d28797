"""fpsim.fma at the ends of float64's range, checked against MPFR (gmpy2) and IEEE 754's special rules.

The exact value ``a*b + c`` is a gmpy2 rational; MPFR rounds it once into the target (precision p, the
format's subnormal grid, no upper exponent limit; overflow and the format's encodings of infinity, NaN and
zero are then applied by the rules of tests/_mpfr_oracle.py). Nearest-away and round-to-odd, which MPFR
lacks, come from MPFR's two directed neighbours. Special values (NaN, infinities, zero signs) follow the
rules of IEEE 754 §6 and §7.2 written out below, not MPFR's.

The operands are hostile: random float64 bit patterns over the whole exponent range, huge x tiny products,
subnormal operands, products that overflow or underflow float64 while the exact result is representable,
exact midpoints, cancellation ``a*b ~ -c`` and every combination of special values.
"""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest

import fpsim

gmpy2 = pytest.importorskip("gmpy2")

from _mpfr_oracle import _MODES, _overflow_result, oracle_round  # noqa: E402

NAN = float("nan")
INF = float("inf")
F64 = fpsim.as_format("fp64")
MODES = ("rne", "rna", "rtz", "rup", "rdn", "rto")
TARGETS = ("fp32", "tf32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "fp8_e4m3fnuz", "fp6_e2m3", "fp4_e2m1")

# The cases of the bug report (fpsim.fma(..., "fp64") gave NaN, NaN, and a ValueError before the fix).
REPORTED = [
    (1.3797795079703432e305, 2.0203341064122122e-125, 3.306421346266564e-124, 2.7876155992811454e180),
    (1e300, 1e10, -INF, -INF),
    (1e-200, 1e-200, 1e-300, 1e-300),
]


# --------------------------------------------------------------------------------------------------
# The oracle


def _ctx(fmt: fpsim.Format, mode: str) -> gmpy2.context:
    # MPFR: x = m * 2**e, m in [0.5, 1): the IEEE exponent E is MPFR's e - 1.
    return gmpy2.context(precision=fmt.p, emin=fmt.emin - fmt.mbits + 1, emax=1 << 20, subnormalize=True,
                         round=_MODES[mode])


def _odd(v: gmpy2.mpfr, fmt: fpsim.Format) -> bool:
    m, e = v.as_mantissa_exp()  # v = m * 2**e exactly
    m, e = abs(int(m)), int(e)
    last = max(e + m.bit_length() - 1, fmt.emin) - fmt.mbits  # exponent of the last place
    n = m << (e - last) if e >= last else m >> (last - e)  # exact: v lies on the grid
    return n % 2 == 1


def _unbounded(q: gmpy2.mpq, fmt: fpsim.Format, mode: str) -> float:
    """q != 0 rounded to p bits on the format's subnormal grid, with no upper exponent limit."""
    if mode in ("rne", "rtz", "rup", "rdn"):
        with _ctx(fmt, mode):
            r = gmpy2.mpfr(q)
        return float(r) if abs(r) <= 2 * fmt.max else math.copysign(INF, r)
    with _ctx(fmt, "rtz"):
        lo = gmpy2.mpfr(q)
    with _ctx(fmt, "away"):
        hi = gmpy2.mpfr(q)
    if lo == q:
        return float(lo)
    if mode == "rto":
        pick = lo if _odd(lo, fmt) else hi
    else:  # rna
        pick = hi if abs(gmpy2.mpq(hi) - q) <= abs(q - gmpy2.mpq(lo)) else lo
    return float(pick) if abs(pick) <= 2 * fmt.max else math.copysign(INF, pick)


def expected(a: float, b: float, c: float, fmt: fpsim.Format, mode: str) -> float:
    """IEEE 754 fusedMultiplyAdd(a, b, c) rounded once into fmt."""
    if math.isnan(a) or math.isnan(b) or math.isnan(c):
        return NAN
    prod_neg = (math.copysign(1.0, a) < 0) != (math.copysign(1.0, b) < 0)
    if math.isinf(a) or math.isinf(b):
        if a == 0 or b == 0:
            return NAN  # inf * 0
        if math.isinf(c) and (c < 0) != prod_neg:
            return NAN  # inf - inf
        return oracle_round(-INF if prod_neg else INF, fmt, mode)
    if math.isinf(c):
        return oracle_round(c, fmt, mode)  # a finite exact product cannot cancel an infinity
    q = gmpy2.mpq(a) * gmpy2.mpq(b) + gmpy2.mpq(c)
    if q == 0:
        if (a == 0 or b == 0) and c == 0 and (math.copysign(1.0, c) < 0) == prod_neg:
            z = -0.0 if prod_neg else 0.0  # (+-0) + (+-0) of one sign keeps it
        else:
            z = -0.0 if mode == "rdn" else 0.0  # IEEE 754 §6.3: exact zero sum
        return oracle_round(z, fmt, mode)
    neg = q < 0
    r = _unbounded(q, fmt, mode)
    if abs(r) > fmt.max:
        return _overflow_result(mode, neg, fmt, "ieee")
    if r == 0:
        r = -0.0 if neg else 0.0  # underflow keeps the sign
    return oracle_round(r, fmt, mode)  # r is a value of fmt: this only applies the format's encodings


def _same(x: float, y: float) -> bool:
    return (math.isnan(x) and math.isnan(y)) or (x == y and math.copysign(1, x) == math.copysign(1, y))


def mismatches(a: np.ndarray, b: np.ndarray, c: np.ndarray, fmt: str, mode: str) -> list[tuple[float, ...]]:
    """(a, b, c, fpsim, oracle) for every case where fpsim.fma differs from the oracle."""
    f = fpsim.as_format(fmt)
    got = np.asarray(fpsim.fma(a, b, c, fmt, rounding=mode), dtype=np.float64)
    bad = []
    for x, y, z, g in zip(a.tolist(), b.tolist(), c.tolist(), got.tolist()):
        e = expected(x, y, z, f, mode)
        if not _same(g, e):
            bad.append((x, y, z, g, e))
    return bad


# --------------------------------------------------------------------------------------------------
# Hostile operands


def _mant(rng: np.random.Generator, n: int) -> np.ndarray:
    """Random signed significands in [1, 2) with all 52 fraction bits random."""
    bits = (np.uint64(1023) << np.uint64(52)) | (rng.integers(0, 1 << 52, n, dtype=np.uint64))
    return bits.view(np.float64) * rng.choice([-1.0, 1.0], n)


def _pow2(e: np.ndarray) -> np.ndarray:
    return np.ldexp(1.0, e.astype(np.int32))


def hostile(n: int, seed: int, target: fpsim.Format = F64) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """About 8n operand triples of the kinds listed in the module docstring."""
    with np.errstate(all="ignore"):
        return _hostile(n, seed, target)


def _hostile(n: int, seed: int, target: fpsim.Format) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    parts = []
    # 1. random bit patterns: every exponent, subnormals, infinities and NaNs included
    parts.append(tuple(rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True).view(np.float64)
                       for _ in range(3)))
    # 2. huge x tiny with a moderate or random product, c of the product's size (or random)
    ea = rng.integers(850, 1024, n)
    eb = rng.integers(-1120, -850, n)
    a = np.ldexp(_mant(rng, n), ea.astype(np.int32))
    b = np.ldexp(_mant(rng, n), eb.astype(np.int32))  # below -1074: 0 (a zero product), else maybe subnormal
    p = a * b
    c = np.where(rng.random(n) < 0.7, p * rng.uniform(-3, 3, n), _mant(rng, n) * _pow2(rng.integers(-1074, 1024, n)))
    sw = rng.random(n) < 0.5
    parts.append((np.where(sw, b, a), np.where(sw, a, b), c))
    # 3. cancellation a*b ~ -c over the whole range (c = -RN(a*b), a few ulps off, or -max where it overflows)
    a = _mant(rng, n) * _pow2(rng.integers(-1074, 1024, n))
    b = _mant(rng, n) * _pow2(np.clip(rng.integers(-1100, 1100, n) - np.frexp(a)[1] + rng.integers(-60, 60, n),
                                      -1074, 1023))
    p = a * b
    c = -p
    for _ in range(3):
        c = np.where(rng.random(n) < 0.4, np.nextafter(c, rng.choice([-INF, INF], n)), c)
    c = np.where(np.isinf(c), -np.sign(p) * F64.max * rng.uniform(0.5, 1, n), c)
    parts.append((a, b, c))
    # 4. exact midpoints: products of k-bit integers (k <= 27) that need one bit more than the target's p,
    #    c zero, the smallest subnormal, or a sticky term of either sign
    k = rng.integers(1, 28, n)
    ma = rng.integers(0, 1 << 27, n) >> (27 - k) | 1
    mb = rng.integers(0, 1 << 27, n) >> (27 - k) | 1
    e1 = rng.integers(-1100, 1000, n)
    e2 = rng.integers(-200, 200, n) + np.where(rng.random(n) < 0.5, 0, rng.integers(-900, 900, n))
    a = np.ldexp(ma.astype(np.float64) * rng.choice([-1.0, 1.0], n), np.clip(e1, -1074, 1000).astype(np.int32))
    b = np.ldexp(mb.astype(np.float64) * rng.choice([-1.0, 1.0], n), np.clip(e2, -1074, 1000).astype(np.int32))
    p = a * b
    choice = rng.integers(0, 4, n)
    tiny = np.abs(p) * _pow2(-rng.integers(60, 2000, n))
    c = np.select([choice == 0, choice == 1, choice == 2],
                  [np.zeros(n), rng.choice([-1.0, 1.0], n) * 5e-324, rng.choice([-1.0, 1.0], n) * tiny],
                  rng.choice([-1.0, 1.0], n) * np.abs(p) * _pow2(rng.integers(-3, 3, n)))
    parts.append((a, b, c))
    # 5. float64 product overflows, exact result finite: a*b in (2**1023, 2**1026), c ~ -a*b
    ea = rng.integers(500, 1024, n)
    a = np.ldexp(_mant(rng, n), ea.astype(np.int32))
    b = np.ldexp(_mant(rng, n), (1024 - ea + rng.integers(-1, 2, n)).astype(np.int32))
    c = -np.sign(a * b) * F64.max * rng.choice([1.0, 0.75, 0.5, 1 - 2.0**-40], n)
    parts.append((a, b, c))
    # 6. float64 product underflows (or is subnormal), c zero, subnormal or tiny
    ea = rng.integers(-1074, -400, n)
    a = np.ldexp(_mant(rng, n), ea.astype(np.int32))
    b = np.ldexp(_mant(rng, n), np.clip(-1074 - ea + rng.integers(-120, 60, n), -1074, 1023).astype(np.int32))
    c = np.select([choice == 0, choice == 1],
                  [rng.choice([-0.0, 0.0], n), rng.choice([-1.0, 1.0], n) * 5e-324 * rng.integers(1, 9, n)],
                  _mant(rng, n) * _pow2(rng.integers(-1074, -1000, n)))
    parts.append((a, b, c))
    # 7. products near the target's overflow threshold and subnormal range, made of extreme float64 operands
    top = np.where(rng.random(n) < 0.5, target.emax + 1, target.emin - target.mbits)
    t = top + rng.integers(-3, 3, n)
    ea = rng.integers(-1074, 1024, n)
    a = np.ldexp(_mant(rng, n), ea.astype(np.int32))
    b = np.ldexp(_mant(rng, n), np.clip(t - np.frexp(a)[1], -1074, 1023).astype(np.int32))
    c = np.select([choice == 0, choice == 1],
                  [np.zeros(n), np.ldexp(_mant(rng, n), t.astype(np.int32))],
                  rng.choice([-1.0, 1.0], n) * np.float64(target.max) * rng.choice([1.0, 0.5], n))
    parts.append((a, b, c))
    # 8. a subnormal operand times anything
    a = _mant(rng, n) * 5e-324 * rng.integers(1, 1 << 52, n)
    b = _mant(rng, n) * _pow2(rng.integers(-1074, 1024, n))
    c = np.where(rng.random(n) < 0.5, a * b * rng.uniform(-2, 2, n), _mant(rng, n) * _pow2(rng.integers(-1074, 1024, n)))
    parts.append((a, b, c))
    return tuple(np.concatenate([p_[i] for p_ in parts]) for i in range(3))  # type: ignore[return-value]


SPECIALS = np.array([0.0, -0.0, INF, -INF, NAN, 1.0, -1.0, 1.5, -3.0, 5e-324, -5e-324, 2.0**-1022,
                     F64.max, -F64.max, 2.0**1000, -(2.0**-1000), 2.0**600, 2.0**-600, 65504.0, 2.0**-149])


def special_grid() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    a, b, c = np.meshgrid(SPECIALS, SPECIALS, SPECIALS, indexing="ij")
    return a.ravel(), b.ravel(), c.ravel()


# --------------------------------------------------------------------------------------------------
# Tests


@pytest.mark.parametrize("a,b,c,want", REPORTED)
def test_reported_cases(a, b, c, want):
    got = float(fpsim.fma(a, b, c, "fp64"))
    assert got == want
    assert _same(expected(a, b, c, F64, "rne"), want)  # the oracle agrees with the report


def test_fp64_hostile_matches_mpfr():
    a, b, c = hostile(1500, seed=1)
    bad = mismatches(a, b, c, "fp64", "rne")
    assert not bad, f"{len(bad)} of {a.size} differ, e.g. {bad[:3]}"


def test_fp64_specials_match_ieee():
    a, b, c = special_grid()
    bad = mismatches(a, b, c, "fp64", "rne")
    assert not bad, f"{len(bad)} of {a.size} differ, e.g. {bad[:3]}"


def test_fp64_special_rules_spelled_out():
    f = lambda a, b, c: float(fpsim.fma(a, b, c, "fp64"))  # noqa: E731
    assert math.isnan(f(INF, 0.0, 1.0)) and math.isnan(f(0.0, -INF, 1.0))
    assert math.isnan(f(INF, 1.0, -INF)) and math.isnan(f(NAN, 0.0, INF))
    assert f(1e300, 1e300, -INF) == -INF and f(-1e300, 1e300, INF) == INF
    assert f(2.0**1000, 2.0**100, -F64.max) == INF  # an overflowing product stays finite until rounded
    assert f(1.5 * 2.0**512, 2.0**512, -F64.max) == 2.0**1023 + 2.0**971  # 1.5*2**1024 - max
    assert math.copysign(1, f(-0.0, 1.0, -0.0)) < 0 and math.copysign(1, f(0.0, 1.0, -0.0)) > 0
    assert math.copysign(1, f(2.0**-600, -(2.0**-600), 0.0)) < 0  # an underflowed product keeps its sign
    assert f(2.0**-600, 2.0**-600, 0.0) == 0.0 and f(2.0**-537, 2.0**-537, 0.0) == 5e-324
    x = 1 + 2.0**-52
    assert math.copysign(1, f(x, x, -(x * x))) > 0  # an exact nonzero cancellation is +0 (rne)


def test_fp64_wide_path_keeps_shape_and_input():
    a = np.array([[2.0**1000, 1.0], [5e-324, 3.0]])
    b = np.array([[2.0**-1000, 2.0], [2.0**1000, 4.0]])
    c = np.array([[1.0, 1.0], [0.0, -12.0]])
    keep = a.copy()
    got = fpsim.fma(a, b, c, "fp64")
    assert got.shape == (2, 2) and np.array_equal(a, keep)
    assert got.tolist() == [[2.0, 3.0], [5e-324 * 2.0**1000, 0.0]]


def test_fp64_mma_amd_uses_the_same_exact_fma():
    from fpsim.mma import amd

    assert amd._fma64_wide is fpsim.arith._fma64_wide


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", TARGETS)
def test_narrow_targets_hostile_match_mpfr(fmt, mode):
    f = fpsim.as_format(fmt)
    a, b, c = hostile(60, seed=zlib.crc32(f"{fmt}/{mode}".encode()), target=f)
    bad = mismatches(a, b, c, fmt, mode)
    assert not bad, f"{len(bad)} of {a.size} differ, e.g. {bad[:3]}"


def test_narrow_targets_extreme_float64_operands_spelled_out():
    f = lambda a, b, c, fmt="fp32", mode="rne": float(fpsim.fma(a, b, c, fmt, rounding=mode))  # noqa: E731
    tiny = 2.0**-600  # tiny * tiny underflows float64 to 0; the exact product is positive
    assert f(tiny, tiny, 0.0, mode="rup") == 2.0**-149 and f(tiny, tiny, 0.0, mode="rdn") == 0.0
    assert f(-tiny, tiny, 0.0, mode="rdn") == -(2.0**-149) and math.copysign(1, f(-tiny, tiny, 0.0)) < 0
    assert f(tiny, tiny, 1.0, mode="rup") == 1 + 2.0**-23 and f(-tiny, tiny, 1.0, mode="rtz") == 1 - 2.0**-24
    assert f(1.5 * 2.0**1000, 2.0**-1000, 0.0, "bf16") == 1.5  # huge x tiny
    assert f(5e-324, 2.0**1000, 0.0, mode="rtz") == 2.0**-74  # a subnormal operand
    huge = 2.0**600  # huge * huge overflows float64; the exact sum overflows fp32 too
    assert f(huge, huge, -F64.max) == INF and f(huge, huge, -F64.max, mode="rtz") == fpsim.fp32.max
    assert math.isnan(f(huge, huge, -F64.max, "fp8_e4m3"))  # OCP E4M3: overflow in rne is NaN
    assert f(1.5 * 2.0**512, 2.0**512, -F64.max, "fp16", mode="rdn") == 65504.0
    assert f(2.0**1000, 2.0**100, -INF, "fp16") == -INF


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", ("fp32", "fp8_e4m3", "fp8_e4m3fnuz"))
def test_narrow_targets_specials_match_ieee(fmt, mode):
    a, b, c = special_grid()
    bad = mismatches(a, b, c, fmt, mode)
    assert not bad, f"{len(bad)} of {a.size} differ, e.g. {bad[:3]}"


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ("fp64", "fp32", "bf16"))
def test_hostile_large(fmt):
    f = fpsim.as_format(fmt)
    for mode in ("rne",) if fmt == "fp64" else MODES:
        a, b, c = hostile(3000 if fmt == "fp64" else 800, seed=7, target=f)
        bad = mismatches(a, b, c, fmt, mode)
        assert not bad, f"{mode}: {len(bad)} of {a.size} differ, e.g. {bad[:3]}"
