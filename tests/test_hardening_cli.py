"""Issue 12, command line and exact rationals: fpsim._exact against MPFR, and the ``fpsim`` command.

The rounding oracle here is MPFR (gmpy2) fed the exact rational (``mpq``), never a float64: precision p,
the format's exponent range, ``subnormalize=True``; nearest-away and round-to-odd are decided from MPFR's two
directed neighbours by exact comparison, and the format quirks MPFR does not model are applied by the rules of
the spec (tests/_mpfr_oracle.py).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
import subprocess
import sys
from decimal import Decimal
from fractions import Fraction
from typing import Any

import gmpy2
import numpy as np
import pytest
from _mpfr_oracle import _MODES, _overflow_result

import fpsim
from fpsim._exact import decimal_str, parse_decimal
from fpsim.rounding import round_rational

MODES = ["rne", "rna", "rtz", "rup", "rdn", "rto"]
OVERFLOWS = ["ieee", "saturate"]
# Registered formats plus custom ones that take the direct (integer) path or sit at float64's edges.
CUSTOM = [
    fpsim.Format("e11m51", 11, 51),  # p = 52: direct path; grid reaches float64's subnormals
    fpsim.Format("e11m20", 11, 20),  # emax = 1023 with p <= 51: round-to-odd path, no float64 above 2**1024
    fpsim.Format("e10m52", 10, 52),  # p = 53 with a small range: direct path, overflow via fpsim.round
    fpsim.Format("e11m52_nosub", 11, 52, subnormals=False),
    fpsim.Format("e11m49", 11, 49),  # emin - mbits - 2 = -1073: round-to-odd path at float64's floor
]
FORMATS = [f for f in fpsim.all_formats() if f.table is None] + CUSTOM  # table formats: test_hif8.py
NAN = float("nan")


def _ctx(fmt: fpsim.Format, mode: str) -> gmpy2.context:
    # MPFR's exponent is IEEE's + 1; unbounded above (overflow judged separately, inputs reach 10**5000).
    return gmpy2.context(precision=fmt.p, emin=fmt.emin - fmt.mbits + 1, emax=1 << 20, subnormalize=True,
                         round=_MODES[mode])


def _show(q: Fraction) -> str:
    return f"{float(q):.17g}" if abs(q.numerator) < 10**300 > q.denominator else f"~2**{_log2(q)}"


def _log2(q: Fraction) -> int:
    return abs(q.numerator).bit_length() - q.denominator.bit_length()


def _odd(v: Fraction, fmt: fpsim.Format) -> bool:
    """Whether v (on the format's grid, unbounded above) has an odd significand; 0 is even."""
    if v == 0:
        return False
    e = max(_floor_log2(abs(v)), fmt.emin)
    m = abs(v) / Fraction(2) ** (e - fmt.mbits)
    assert m.denominator == 1
    return m.numerator % 2 == 1


def _floor_log2(a: Fraction) -> int:
    e = _log2(a)
    return e if a >= Fraction(2) ** e else e - 1


def _unbounded(q: Fraction, fmt: fpsim.Format, mode: str) -> Fraction:
    """q rounded to p bits with the format's subnormal grid and no upper exponent limit (exact)."""
    x = gmpy2.mpq(q.numerator, q.denominator)
    if mode in ("rne", "rtz", "rup", "rdn"):
        with _ctx(fmt, mode):
            return Fraction(*gmpy2.mpfr(x).as_integer_ratio())
    with _ctx(fmt, "rtz"):
        lo = Fraction(*gmpy2.mpfr(x).as_integer_ratio())
    with _ctx(fmt, "away"):
        hi = Fraction(*gmpy2.mpfr(x).as_integer_ratio())
    if lo == q:
        return lo
    if mode == "rto":
        return lo if _odd(lo, fmt) else hi
    assert mode == "rna"
    return hi if abs(hi - q) <= abs(q - lo) else lo


def oracle(q: Fraction, fmt: fpsim.Format, mode: str, overflow: str, subnormals: bool = True) -> float:
    """The specified result of rounding the exact rational q into fmt (rules of tests/_mpfr_oracle.py)."""
    if not fmt.signed and fmt.has_zero:  # ue5m3: the signed twin's result; negative nonzero is NaN, -0 is +0
        twin = dataclasses.replace(fmt, name=fmt.name + "_signed", signed=True, aliases=())
        r = oracle(q, twin, mode, overflow, subnormals)
        return NAN if (math.isnan(r) or r < 0) else (0.0 if r == 0 else r)
    if q == 0:
        if not fmt.signed:
            return NAN
        return 0.0
    neg = q < 0
    if not fmt.signed:
        if neg:
            return NAN
        r = _unbounded(q, fmt, "rna" if mode == "rne" and fmt.p == 1 else mode)
        if r > Fraction(fmt.max):
            return _overflow_result(mode, False, fmt, overflow)
        return max(float(r), fmt.min_normal)
    r = _unbounded(q, fmt, mode)
    if abs(r) > Fraction(fmt.max):
        return _overflow_result(mode, neg, fmt, overflow)
    v = float(r)  # a value of the format: exact
    if not subnormals or not fmt.subnormals:
        if 0 < abs(v) < fmt.min_normal:
            v = math.copysign(0.0, v)
    if v == 0:
        v = -0.0 if neg and fmt.signed_zero else 0.0
    return v


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))


def _grid_point(fmt: fpsim.Format, rng: np.random.Generator) -> tuple[int, int]:
    """A random positive value M * 2**k of fmt as (M, k), M an integer significand on the format's grid."""
    e = int(rng.integers(fmt.emin, fmt.emax + 1))
    lo = 1 << fmt.mbits
    hi = lo + fmt.max_mantissa if e == fmt.emax else 2 * lo - 1
    if e == fmt.emin and fmt.subnormals and fmt.mbits and rng.random() < 0.3:
        lo = 1  # a subnormal
    m = int(rng.integers(lo, hi + 1)) if hi > lo else lo
    return m, e - fmt.mbits


def _p2(k: int) -> Fraction:
    return Fraction(2) ** k


def hard_rationals(fmt: fpsim.Format, n: int = 24, seed: int = 0) -> list[Fraction]:
    rng = np.random.default_rng(seed)
    tiny = Fraction(1, 10**30)
    out: list[Fraction] = [Fraction(0)]
    for _ in range(n):
        m, k = _grid_point(fmt, rng)
        v, nxt, mid = m * _p2(k), (m + 1) * _p2(k), (2 * m + 1) * _p2(k - 1)
        r = Fraction(int(rng.integers(1, 1 << 62)), int(rng.integers(1, 1 << 62)))
        out += [v, mid, mid * (1 + tiny), mid * (1 - tiny), v * (1 + tiny), v * (1 - tiny),
                v + (nxt - v) * (r - int(r))]
    for _ in range(n):  # random rationals of any magnitude around the format's range
        k = int(rng.integers(fmt.emin - fmt.mbits - 20, fmt.emax + 20))
        out.append(Fraction(int(rng.integers(1, 1 << 62)) * int(rng.integers(1, 1 << 30)),
                            int(rng.integers(1, 1 << 62)) | 1) * _p2(k))
    q = _p2(fmt.emin - fmt.mbits)  # smallest subnormal (also below it without subnormals: the grid is the same)
    mmax = (1 << fmt.mbits) + fmt.max_mantissa
    top = mmax * _p2(fmt.emax - fmt.mbits)
    thr = (2 * mmax + 1) * _p2(fmt.emax - fmt.mbits - 1)  # overflow threshold of the nearest modes
    out += [q, q / 2, q / 2 * (1 + tiny), q / 2 * (1 - tiny), q * tiny, Fraction(1, 10**400), Fraction(1, 10**5000),
            3 * q / 2, _p2(fmt.emin), _p2(fmt.emin) * (1 - tiny),
            top, top * (1 + tiny), thr, thr * (1 + tiny), thr * (1 - tiny), _p2(fmt.emax + 1),
            _p2(fmt.emax + 1) * (1 - tiny), _p2(fmt.emax + 1) + 1, Fraction(10**400), Fraction(10**5000),
            Fraction(1, 3), Fraction(2, 3)]
    return out + [-x for x in out]


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_round_rational_matches_mpfr(fmt: fpsim.Format) -> None:
    cases = hard_rationals(fmt)
    bad = []
    for mode in MODES:
        for ov in OVERFLOWS:
            for q in cases:
                got, want = round_rational(q, fmt, mode, ov, True), oracle(q, fmt, mode, ov)
                if not same(got, want):
                    bad.append((_show(q), mode, ov, got, want))
    assert not bad, f"{len(bad)} mismatches, first: {bad[:5]}"


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f.subnormals and f.mbits], ids=lambda f: f.name)
def test_round_rational_flush_matches_mpfr(fmt: fpsim.Format) -> None:
    cases = [c for c in hard_rationals(fmt, n=8, seed=1) if abs(c) < 4 * _p2(fmt.emin)]
    bad = [(_show(q), mode) for mode in MODES for q in cases
           if not same(round_rational(q, fmt, mode, "ieee", False), oracle(q, fmt, mode, "ieee", False))]
    assert not bad, bad[:5]


def test_round_rational_agrees_with_fpsim_round_on_floats() -> None:
    """On float64 inputs the rational path is fpsim.round (checked against MPFR elsewhere)."""
    rng = np.random.default_rng(3)
    xs = np.concatenate([rng.standard_normal(40) * 10.0 ** rng.integers(-45, 45, 40), [5e-324, -1e308, 65520.0]])
    for fmt in ("fp16", "bf16", "fp8_e4m3", "e8m0", "fp64"):
        for mode in MODES:
            for x in xs:
                assert same(round_rational(float(x), fmt, mode, "ieee", True),
                            float(fpsim.round(float(x), fmt, mode))), (fmt, mode, x)


def test_round_rational_issue_examples() -> None:
    assert round_rational(parse_decimal("1.00048828125000000001"), "fp16", "rne", "ieee", True) == 1.0009765625
    assert round_rational(parse_decimal("0.99999999999999999999"), "bf16", "rtz", "ieee", True) == 0.99609375
    assert round_rational(parse_decimal("1e-400"), "fp16", "rup", "ieee", True) == 2.0**-24
    assert round_rational(parse_decimal("-1e-400"), "fp16", "rup", "ieee", True) == 0.0
    assert math.copysign(1, round_rational(parse_decimal("-1e-400"), "fp16", "rne", "ieee", True)) < 0


def test_round_rational_inputs_and_errors() -> None:
    assert round_rational(Fraction(0), "fp16", "rdn", "ieee", True) == 0.0
    assert math.copysign(1, round_rational(Fraction(0), "fp16", "rdn", "ieee", True)) > 0  # a zero Fraction is +0
    assert math.copysign(1, round_rational(-0.0, "fp16", "rne", "ieee", True)) < 0
    assert round_rational(7, "fp8_e4m3", " RNE ", "IEEE", True) == 7.0  # one name rule
    assert math.isnan(round_rational(math.nan, "fp16", "rne", "ieee", True))
    assert round_rational(np.float32(0.1), "bf16") == float(fpsim.round(np.float32(0.1), "bf16"))
    assert round_rational(np.int64(7), "fp16") == 7.0 and round_rational(np.uint64(2**64 - 1), "fp32") == 2.0**64
    assert round_rational(np.dtype(">f4").type(1.5), "fp16") == 1.5
    assert round_rational(Decimal("1e-400"), "fp16", "rup") == 2.0**-24
    assert math.isnan(round_rational(Decimal("NaN"), "fp16")) and round_rational(Decimal("-Inf"), "fp16") == -math.inf
    with pytest.raises(ValueError, match="signaling"):
        round_rational(Decimal("sNaN"), "fp16")
    ld = np.longdouble(1) + np.longdouble(2.0**-11) + np.finfo(np.longdouble).eps  # above an fp16 midpoint
    if np.finfo(np.longdouble).nmant > 52:  # x87 extended: float(ld) would land on the midpoint and round to 1
        assert round_rational(ld, "fp16") == 1 + 2.0**-10
    for bad_arr in (np.array(1.5), np.array([1.5])):
        with pytest.raises(TypeError):
            round_rational(bad_arr, "fp16")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs rng"):
        round_rational(Fraction(1, 3), "fp16", "sr", "ieee", True)
    with pytest.raises(ValueError, match="only to rounding='sr'"):
        round_rational(Fraction(1, 3), "fp16", "rne", "ieee", True, rng=np.random.default_rng(0))
    with pytest.raises(TypeError):
        round_rational(Fraction(1, 3), "fp16", "sr", "ieee", True, rng=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="valid"):
        round_rational(Fraction(1, 3), "fp16", "nearest", "ieee", True)
    with pytest.raises(ValueError, match="valid"):
        round_rational(Fraction(1, 3), "fp17", "rne", "ieee", True)
    for bad in ("1", True, None, 1j, [1]):
        with pytest.raises(TypeError):
            round_rational(bad, "fp16", "rne", "ieee", True)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        round_rational(Fraction(1), "fp16", "rne", "ieee", 1)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "q, fmt",
    [(Fraction(1, 3), "fp16"), (1 + Fraction(1, 2**53), "fp64"), (Fraction(3, 10**45), "fp32"),
     (Fraction(-7, 10), "fp8_e4m3"), (Fraction(3, 2**128) + Fraction(1, 10**60), "e8m0"),
     (Fraction(65519) + Fraction(1, 3), "fp16")],
)
def test_round_rational_sr_probability(q: Fraction, fmt: str) -> None:
    """Exact stochastic rounding: up with probability (|q| - lo) / (hi - lo), the two neighbours only."""
    lo = round_rational(q, fmt, "rtz", "ieee", True)
    hi = round_rational(q, fmt, "rup" if q > 0 else "rdn", "ieee", True)
    hi_grid = abs(Fraction(hi)) if math.isfinite(hi) else Fraction(65536)  # fp16: SR past max gives inf
    p_up = float((abs(q) - abs(Fraction(lo))) / (hi_grid - abs(Fraction(lo))))
    rng = np.random.default_rng(7)
    n = 3000
    got = [round_rational(q, fmt, "sr", "ieee", True, rng=rng) for _ in range(n)]
    assert set(got) <= {lo, hi}
    k = sum(g == hi for g in got)
    assert abs(k - n * p_up) <= 5 * math.sqrt(n * p_up * (1 - p_up)) + 1, (k, n * p_up)
    again = [round_rational(q, fmt, "sr", "ieee", True, rng=np.random.default_rng(7)) for _ in range(3)]
    assert again == [got[0]] * 3  # same seed, same result


def test_round_rational_sr_on_a_float64_is_fpsim_round() -> None:
    for x in (0.1, -3e-8, 1e-310, 65519.0):
        for seed in range(5):
            a = round_rational(Fraction(x), "fp16", "sr", "ieee", True, rng=np.random.default_rng(seed))
            b = float(fpsim.round(x, "fp16", "sr", rng=np.random.default_rng(seed)))
            assert same(a, b), (x, seed)


@pytest.mark.parametrize(
    "text, want",
    [
        ("0.1", Fraction(1, 10)), ("  -1.5e-3 ", Fraction(-3, 2000)), (".5", Fraction(1, 2)), ("5.", Fraction(5)),
        ("1E+2", Fraction(100)), ("1e-400", Fraction(1, 10**400)), ("1e400", Fraction(10**400)),
        ("0x1.8p-3", Fraction(3, 16)), ("-0X1P+10", Fraction(-1024)), ("0x.8p1", Fraction(1)), ("0x10", Fraction(16)),
        ("0x1.p0", Fraction(1)), ("0x1.999999999999ap-4", Fraction(0.1)), ("0x1p-1100", Fraction(1, 2**1100)),
        ("1/3", Fraction(1, 3)), ("-22/7", Fraction(-22, 7)), ("+7", Fraction(7)), ("0", Fraction(0)),
        ("1" + "0" * 5000 + "e-5000", Fraction(1)), ("0." + "0" * 6000 + "1", Fraction(1, 10**6001)),
    ],
)
def test_parse_decimal_exact(text: str, want: Fraction) -> None:
    got = parse_decimal(text)
    assert isinstance(got, Fraction) and got == want


def test_parse_decimal_specials() -> None:
    assert parse_decimal("inf") == math.inf and parse_decimal("-Infinity") == -math.inf
    assert math.isnan(parse_decimal("NaN")) and math.isnan(parse_decimal("-nan"))  # type: ignore[arg-type]
    z = parse_decimal("-0.0e5")
    assert isinstance(z, float) and z == 0 and math.copysign(1, z) < 0
    assert math.copysign(1, parse_decimal("-0x0p0")) < 0  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["", " ", "abc", "1e", "e5", "1.2.3", "0x", "0xg", "0x1p", "1/0", "1/-3", "--1",
                                  "1e5.5", "nan(1)", "infx", "1,5", "١", "1_000", "0x1.8p-3f", "1e999999999999",
                                  "1e100001", "1e-100001", "9" * 100_001])
def test_parse_decimal_rejects(text: str) -> None:
    with pytest.raises(ValueError) as e:
        parse_decimal(text)
    assert (repr(text) if len(text) < 60 else "characters") in str(e.value)


def test_parse_decimal_type() -> None:
    with pytest.raises(TypeError):
        parse_decimal(1.5)  # type: ignore[arg-type]


def test_decimal_str() -> None:
    assert decimal_str(Fraction(1, 10)) == "0.1"
    assert decimal_str(Fraction(-3, 16)) == "-0.1875"
    assert decimal_str(Fraction(1, 3)) is None
    assert decimal_str(2.0**-24) == "5.9604644775390625e-8"
    assert decimal_str(Fraction(10**400)) == "1e400"
    assert decimal_str(65504.0) == "65504"
    assert decimal_str(-0.0) == "-0" and decimal_str(math.inf) == "inf"
    for x in (0.1, 1e-320, 1.7976931348623157e308, 3.0, 1234.5):
        assert Fraction(parse_decimal(decimal_str(x))) == Fraction(x)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------------
# fpsim round (issue 12 items 4, 12, 13)
# ------------------------------------------------------------------------------------------------------


from _cli import run_cli  # noqa: E402  (shared by the CLI tests)


def round_json(*argv: str) -> dict:  # type: ignore[type-arg]
    rc, out, err = run_cli(["round", *argv, "--json"])
    assert rc == 0 and err == "", err
    return json.loads(out)  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    "argv, rounded, code",
    [
        (["1.00048828125000000001", "-f", "fp16"], "1.0009765625", "0x3C01"),  # was 1.0 (float64 first)
        (["0.99999999999999999999", "-f", "bf16", "-r", "rtz"], "0.99609375", "0x3F7F"),  # was 1.0
        (["1e-400", "-f", "fp16", "-r", "rup"], repr(2.0**-24), "0x0001"),  # was 0
        (["1e400", "-f", "fp64", "-r", "rtz"], repr(1.7976931348623157e308), "0x7FEFFFFFFFFFFFFF"),  # was inf
        (["0x1.0018p0", "-f", "fp16"], "1.0", "0x3C00"),  # a hex float, exactly (was "not a number")
        (["1/3", "-f", "fp16"], "0.333251953125", "0x3555"),
        (["-1e-3", "-f", "fp16"], "-0.0010004043579101562", "0x9419"),  # a negative value is not an option
        (["-inf", "-f", "fp8_e4m3"], "nan", "0x7F"),  # no infinity: NaN (canonical code)
    ],
)
def test_cli_round_once_from_the_exact_value(argv: list[str], rounded: str, code: str) -> None:
    d = round_json(*argv)
    assert (d["rounded"], d["code"]) == (rounded, code)


def test_cli_round_json_keys_and_exact_error() -> None:
    from fpsim.cli import ROUND_JSON_KEYS

    d = round_json("1/3", "-f", "fp16")
    assert tuple(d) == ROUND_JSON_KEYS
    assert d["value"] is None and d["value_fraction"] == "1/3" and d["error_fraction"] == "-1/12288"
    assert d["error"] is None and d["exact"] is False and d["relative_error"] == pytest.approx(2**-12)
    d = round_json("1.00048828125000000001", "-f", "fp16")
    assert d["value"] == "1.00048828125000000001" and d["float64"] == "1.00048828125"
    assert d["error"] == "0.00048828124999999999" and d["rounded_exact"] == "1.0009765625"
    assert Fraction(d["rounded_hex"] and float.fromhex(d["rounded_hex"])) == Fraction(1.0009765625)
    d = round_json("1e-400", "-f", "fp16", "-r", "rup")
    assert d["relative_error"] is None  # 6e392 does not fit a float64; JSON has no infinity
    assert Fraction(parse_decimal(d["error"])) == Fraction(2.0**-24) - Fraction(1, 10**400)  # type: ignore[arg-type]
    d = round_json("nan", "-f", "fp16")
    assert d["error"] is None and d["exact"] is True and d["code"] == "0x7E00"
    rc, out, _ = run_cli(["round", "1e-400", "-f", "fp16", "-r", "rup", "--json"])
    json.loads(out, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))


def test_cli_round_text_shows_exact_input_and_error() -> None:
    rc, out, err = run_cli(["round", "1.00048828125000000001", "-f", "fp16"])
    assert rc == 0 and err == ""
    assert "exact     1.00048828125000000001  (not a float64; nearest float64 1.00048828125)" in out
    assert "rounded   1.0009765625" in out and "0x3C01" in out
    assert "error     0.00048828124999999999  (rounded - input, exact; relative 0.000488)" in out
    rc, out, _ = run_cli(["round", "1e-400", "-f", "fp16", "-r", "rup"])
    assert rc == 0 and "relative 5.96e+392" in out and "--json has all" in out


@pytest.mark.parametrize("argv, says", [
    (["70000", "-f", "fp16"], "overflow: |input| is beyond fp16's largest finite value 65504, so it rounds to "
                              "+infinity (--overflow saturate gives 65504 instead)"),
    (["-70000", "-f", "fp16"], "rounds to -infinity (--overflow saturate gives -65504 instead)"),
    (["465", "-f", "fp8_e4m3"], "rounds to NaN (the format has no infinity) (--overflow saturate gives 448"),
    (["nan", "-f", "bf16"], "error     - (a special value in: nothing to round)"),
])
def test_cli_round_says_why_there_is_no_error(argv: list[str], says: str) -> None:
    # Before (issue 25 item 7): "error     -" for an overflow, the same line as for a NaN input.
    rc, out, err = run_cli(["round", *argv])
    assert rc == 0 and err == ""
    assert says in out


@pytest.mark.parametrize("variant", [["-r", "RNE"], ["-r", " rne"], ["--overflow", "SATURATE"], ["-f", " BF16 "],
                                     ["-f", "bfloat16"], ["--rounding", "Rne", "--overflow", " ieee"]])
def test_cli_round_names_follow_the_one_rule(variant: list[str]) -> None:
    """-r/--overflow/-f parse as the library does (strip, case-insensitive, aliases); they were argparse choices."""
    base = round_json("70000.5", "-f", "bf16")
    d = round_json("70000.5", "-f", "bf16", *variant)
    assert d["rounded"] == base["rounded"] and d["code"] == base["code"]
    assert run_cli(["ROUND", "1"])[0] == 0 and run_cli([" round ", "1"])[0] == 0


def test_cli_round_sr_is_reproducible() -> None:
    a = round_json("0.1", "-r", "sr", "--seed", "3", "-f", "fp16")
    assert a == round_json("0.1", "-r", "SR", "--seed", "3", "-f", "fp16") and a["seed"] == 3
    assert a["rounded"] in ("0.0999755859375", "0.10003662109375")
    x = round_json("0.25000000000000000001", "-r", "sr", "-f", "fp8_e5m2")  # P(up) ~ 1e-20
    assert x["rounded"] == "0.25" and x["seed"] == 0
    y = round_json("0x1.0018p0", "-r", "sr", "--seed", "5", "-f", "fp16")  # a float64: fpsim.round's stream
    assert float(y["rounded"]) == float(fpsim.round(float.fromhex("0x1.0018p0"), "fp16", "sr",
                                                    rng=np.random.default_rng(5)))


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["round", "abc"], "value"), (["round", ""], "value"), (["round", "1e999999"], "value"),
        (["round", "1", "-f", "fp7"], "--format"), (["round", "1", "-f", ""], "--format"),
        (["round", "1", "-r", "nearest"], "--rounding"), (["round", "1", "-r", "r n e"], "--rounding"),
        (["round", "1", "--overflow", "clamp"], "--overflow"), (["round", "1", "--seed", "-1", "-r", "sr"], "--seed"),
        (["round", "1", "--seed", "abc"], "--seed"), (["round", "1", "--seed", "1e3"], "--seed"),
        (["round", "1", "--seed", "9" * 40], "--seed"),
        (["demo", "--seed", "-1"], "--seed"), (["demo", "--seed", "x"], "--seed"),
        (["demo", "--steps", "0"], "--steps"),
        (["demo", "--steps", "-3"], "--steps"), (["demo", "--steps", "2.5"], "--steps"),
        (["demo", "--policies", ""], "--policies"), (["demo", "--policies", ",", " "], "--policies"),
        (["demo", "--policies", "fp32", "nope"], "--policies"), (["demo", "--out", ""], "--out"),
    ],
)
def test_cli_bad_values_are_one_line_naming_the_flag(argv: list[str], flag: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import fpsim.train.demo as demo

    monkeypatch.setattr(demo, "run_demo", lambda *a, **k: pytest.fail("trained despite a bad flag"))
    rc, out, err = run_cli(argv)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"fpsim {argv[0]}: error: {flag}"), err


@pytest.mark.parametrize("argv", [["round"], ["round", "1", "--bogus"], [], ["frobnicate"], ["probe", "--device", "x"],
                                  ["demo", "--quick", "extra"], ["round", "1", "-f"]])
def test_cli_usage_errors_are_one_line(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)
    rc, out, err = run_cli(argv)
    assert rc == 2 and out == "" and err.count("\n") == 1 and "error:" in err and "Traceback" not in err, err


def test_cli_probe_without_cupy_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)
    for argv in (["probe"], ["probe", "--json", "--random-rows", "0"]):
        rc, out, err = run_cli(argv)
        assert rc == 2 and out == "" and err.count("\n") == 1 and "CuPy" in err
    for argv, flag in ((["probe", "--random-rows", "-3"], "--random-rows"), (["probe", "--device", "-1"], "--device")):
        rc, out, err = run_cli(argv)
        assert rc == 2 and out == "" and err == f"fpsim probe: error: {flag}: expected a non-negative integer, got " \
            f"{argv[-1]}\n"


def test_cli_version() -> None:
    from importlib.metadata import version

    rc, out, err = run_cli(["--version"])
    assert rc == 0 and out.strip() == f"fpsim {version('fpsim-precision')}"


def test_cli_formats_lists_every_format() -> None:
    rc, out, _ = run_cli(["formats"])
    assert rc == 0 and all(f.name in out for f in fpsim.all_formats())


def test_cli_subprocess_end_to_end() -> None:
    cmd = [sys.executable, "-m", "fpsim.cli"]
    r = subprocess.run(cmd + ["round", "1e-400", "-f", "FP16", "-r", "RUP", "--json"], capture_output=True, text=True)
    assert r.returncode == 0 and json.loads(r.stdout)["code"] == "0x0001"
    r = subprocess.run(cmd + ["round", "1", "-r", "bogus"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1 and "--rounding" in r.stderr


# ------------------------------------------------------------------------------------------------------
# fpsim demo --out (issue 12 item 6, demo part)
# ------------------------------------------------------------------------------------------------------


def _tiny():  # type: ignore[no-untyped-def]
    from fpsim.train.demo import DemoSettings

    return DemoSettings(steps=2, n_layer=1, n_embd=16, n_head=2, batch_size=4, histogram_every=1, eval_every=1,
                        task_kwargs={"n_symbols": 8, "length": 4})


@pytest.fixture
def no_training(monkeypatch: pytest.MonkeyPatch) -> None:
    import fpsim.train.demo as demo

    monkeypatch.setattr(demo.Trainer, "run", lambda *a, **k: pytest.fail("trained before checking --out"))


def _unwritable_dirs(tmp_path) -> list[str]:  # type: ignore[no-untyped-def]
    f = tmp_path / "a-file"
    f.write_text("x")
    out = [str(f / "sub"), str(f), str(f / "a" / "b")]
    if sys.platform.startswith("linux") and os.path.isdir("/proc"):
        out.append("/proc")  # exists, and not even root can create a file in it
    return out


def test_demo_unwritable_out_fails_before_training(tmp_path, no_training) -> None:  # type: ignore[no-untyped-def]
    from fpsim.train.demo import run_demo

    for d in _unwritable_dirs(tmp_path):
        rc, out, err = run_cli(["demo", "--steps", "1", "--policies", "fp32", "--out", d])
        assert rc == 2 and out == "" and err.count("\n") == 1, (d, err)
        assert err.startswith("fpsim demo: error: --out:") and repr(d) in err and "Traceback" not in err
        with pytest.raises(ValueError, match="output folder"):
            run_demo(d, policies=["fp32"], settings=_tiny(), log=None)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes through permission bits")
def test_demo_readonly_dir_fails_before_training(tmp_path, no_training) -> None:  # type: ignore[no-untyped-def]
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o500)
    try:
        rc, _, err = run_cli(["demo", "--steps", "1", "--out", str(d)])
        assert rc == 2 and "cannot write" in err
    finally:
        d.chmod(0o700)


def test_demo_check_writes_rather_than_trusting_permission_bits(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The check creates a file: as root a 0o500 folder is writable and is accepted; a stale temp file goes."""
    from fpsim.train.demo import check_output_dir

    d = tmp_path / "d"
    d.mkdir()
    (d / ".fpsim-demo-tmp-stale").write_text("left by a killed run")
    os.utime(d / ".fpsim-demo-tmp-stale", (time.time() - 3600, time.time() - 3600))  # unlocked, an hour old
    (d / "keep.txt").write_text("the user's")
    assert check_output_dir(str(d)) == str(d)
    assert sorted(os.listdir(d)) == ["keep.txt"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        d.chmod(0o500)
        try:
            assert check_output_dir(str(d)) == str(d)
        finally:
            d.chmod(0o700)
    with pytest.raises(TypeError):
        check_output_dir(3)  # type: ignore[arg-type]


def test_demo_keeps_finished_policies_when_a_later_one_crashes(  # type: ignore[no-untyped-def]
        tmp_path, monkeypatch) -> None:
    import fpsim.train.demo as demo
    import fpsim.train.report as report

    monkeypatch.setattr(report, "write_plots", lambda *a, **k: {})
    real_run = demo.Trainer.run
    calls = []

    def run(self, *a, **k):  # type: ignore[no-untyped-def]
        calls.append(self.policy.name)
        if len(calls) == 2:
            raise RuntimeError("killed during the second policy")
        return real_run(self, *a, **k)

    monkeypatch.setattr(demo.Trainer, "run", run)
    out = tmp_path / "o"
    with pytest.raises(RuntimeError, match="second policy"):
        demo.run_demo(str(out), policies=["fp32", "fp16-mixed", "bf16-mixed"], settings=_tiny(), log=None)
    m = json.loads((out / "metrics.json").read_text())
    assert m["complete"] is False and list(m["policies"]) == ["fp32"] and m["policies"]["fp32"]["steps"] == 2
    assert list(json.loads((out / "histories.json").read_text())) == ["fp32"]
    assert not [n for n in os.listdir(out) if n.startswith(".fpsim-demo-tmp-")]


def test_demo_complete_run_marks_complete(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import fpsim.train.demo as demo
    import fpsim.train.report as report

    monkeypatch.setattr(report, "write_plots", lambda *a, **k: {})
    out = tmp_path / "o"
    res = demo.run_demo(str(out), policies=["fp32", "int8-ptq"], settings=_tiny(), log=None)
    m = json.loads((out / "metrics.json").read_text())
    assert m["complete"] is True and res["complete"] is True and list(m["policies"]) == ["fp32", "int8-ptq"]
    assert sorted(os.listdir(out)) == ["histories.json", "metrics.json", "report.md"]
    assert oct(os.stat(out / "metrics.json").st_mode & 0o777) == oct(0o644)


def test_run_demo_keys_results_by_canonical_policy_names(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """run_demo called from Python parses names by the one rule too (it kept " FP32 " as a key before)."""
    import fpsim.train.demo as demo
    import fpsim.train.report as report

    monkeypatch.setattr(report, "write_plots", lambda *a, **k: {})
    res = demo.run_demo(str(tmp_path / "o"), policies=[" FP32 ", "fp32"], settings=_tiny(), log=None)
    assert list(res["policies"]) == ["fp32"]


def test_cli_demo_policies_parse_by_the_one_rule(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import fpsim.train.demo as demo

    seen = {}
    monkeypatch.setattr(demo, "run_demo", lambda out, **k: seen.update(k, out=out))
    rc, _, err = run_cli(["demo", "--policies", " FP32,fp16-MIXED", "fp32", "--steps", "3", "--seed", "7",
                          "--out", str(tmp_path / "x")])
    assert rc == 0, err
    assert seen["policies"] == ["fp32", "fp16-mixed"] and seen["steps"] == 3 and seen["seed"] == 7
    assert os.path.isdir(tmp_path / "x")


def test_cli_demo_interrupt_and_io_error_are_one_line(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import fpsim.train.demo as demo

    def interrupted(*a, **k):  # type: ignore[no-untyped-def]
        raise KeyboardInterrupt

    def disk_full(*a, **k):  # type: ignore[no-untyped-def]
        raise OSError(28, "No space left on device")

    for fake, status, words in ((interrupted, 130, "interrupted"), (disk_full, 1, "No space left on device")):
        monkeypatch.setattr(demo, "run_demo", fake)
        rc, out, err = run_cli(["demo", "--steps", "1", "--out", str(tmp_path / "d")])
        assert rc == status and err.count("\n") == 1 and words in err and "Traceback" not in err, err


# ------------------------------------------------------------------------------------------------------
# hostile arguments to every subcommand: one clean line and a nonzero status, never a traceback
# ------------------------------------------------------------------------------------------------------

BIG = "99999999999999999999"


@pytest.mark.parametrize("argv, flag", [
    (["demo", "--seeds", BIG], "--seeds"), (["demo", "--seeds", "18446744073709551616"], "--seeds"),
    (["demo", "--seeds", "10001"], "--seeds"), (["demo", "--steps", BIG], "--steps"),
    (["demo", "--steps", "10000001"], "--steps"), (["demo", "--workers", BIG], "--workers"),
    (["demo", "--workers", "513"], "--workers"),
    (["plan", "--params", "1e308"], "--params"), (["plan", "--params", "1e31", "--json"], "--params"),
    (["plan", "--budget", "5e-324"], "--budget"), (["plan", "--budget", "0.5", "--json"], "--budget"),
    (["plan", "--budget", "1e308", "--device", "h100-sxm"], "--budget"),
    (["plan", "--model", "llama3-8b", "--tokens", "1e-320"], "--tokens"),
    (["probe", "--random-rows", BIG], "--random-rows"), (["probe", "--device", BIG], "--device"),
])
def test_cli_out_of_range_numbers_are_one_line(argv: list[str], flag: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import fpsim.train.demo as demo

    monkeypatch.setitem(sys.modules, "cupy", None)
    monkeypatch.setattr(demo, "run_demo", lambda *a, **k: pytest.fail("trained despite a bad flag"))
    rc, out, err = run_cli(argv)
    assert rc == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"fpsim {argv[0]}: error: {flag}: expected"), err


def test_cli_audit_workers_beyond_the_bound_start_no_cluster(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    distributed = pytest.importorskip("distributed")
    st = pytest.importorskip("safetensors.numpy")
    p = str(tmp_path / "m.safetensors")
    st.save_file({"w": np.random.default_rng(0).standard_normal(8).astype(np.float32)}, p)
    monkeypatch.setattr(distributed, "LocalCluster", lambda *a, **k: pytest.fail("started a cluster"))
    for n in (BIG, "513"):
        rc, out, err = run_cli(["audit", p, "--workers", n])
        assert rc == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err, err
        assert err.startswith("fpsim audit: error: workers must be an integer >= 1 and <= 512"), err
    from fpsim._dask import MAX_WORKERS, check_workers

    assert check_workers(MAX_WORKERS) == MAX_WORKERS
    for bad in (MAX_WORKERS + 1, 10**20):
        with pytest.raises(ValueError, match="<= 512"):
            check_workers(bad)


def test_cli_sweep_and_grid_refuse_huge_seed_counts() -> None:
    from fpsim.train.sweep import MAX_SEEDS, demo_sweep, grid

    assert len(grid(["fp32"], seeds=3)) == 3
    for n in (MAX_SEEDS + 1, 10**20):
        with pytest.raises(ValueError, match=f"seeds must be >= 1 and <= {MAX_SEEDS}"):
            grid(["fp32"], seeds=n)
        with pytest.raises(ValueError, match=f"<= {MAX_SEEDS}"):
            demo_sweep("unused", _tiny(), ["fp32"], seeds=n)


def _strict_json(text: str) -> object:
    def refuse(c: str) -> object:
        raise ValueError(f"not JSON: {c}")

    return json.loads(text, parse_constant=refuse)


def test_cli_plan_json_is_strict_json_even_for_an_infinite_time() -> None:
    rc, out, err = run_cli(["plan", "--model", "llama3-8b", "--budget", "1e30", "--device", "h100-sxm", "--mfu",
                            "1e-300", "--json"])
    assert rc == 0, err
    res = _strict_json(out)
    assert isinstance(res, dict)
    assert res["compute"]["seconds"]["bf16"] == "inf" and res["compute"]["days"]["bf16"] == "inf"
    rc, out, _ = run_cli(["plan", "--model", "llama3-8b", "--budget", "1e30", "--device", "h100-sxm",
                          "--mfu", "1e-300"])
    assert rc == 0 and "inf days" in out


@pytest.mark.parametrize("argv", [["devices", "--json"], ["round", "1e-400", "-f", "fp16", "--json"],
                                  ["round", "inf", "--json"], ["round", "nan", "-f", "fp8_e4m3", "--json"],
                                  ["round", "1e999999", "-f", "fp32", "--json"],
                                  ["plan", "--model", "llama3-8b", "--tokens", "1e30", "--device", "v100", "--json"]])
def test_cli_every_json_output_is_strict(argv: list[str]) -> None:
    rc, out, err = run_cli(argv)
    if rc == 0:
        _strict_json(out)
    else:
        assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err


def test_json_safe_of_non_finite_values() -> None:
    from fpsim._cliargs import json_safe, json_text

    v = {"a": math.inf, "b": [-math.inf, math.nan, 1.5], "c": (np.float32(np.inf), np.int64(3), np.float64(2.0)),
         "d": None, "e": "inf"}
    assert json_safe(v) == {"a": "inf", "b": ["-inf", None, 1.5], "c": ["inf", 3, 2.0], "d": None, "e": "inf"}
    assert json.loads(json_text(v)) == json_safe(v)
    assert v["a"] == math.inf  # the input is not modified


def test_cli_failed_sweep_is_one_line_exit_1(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import fpsim.train.demo as demo
    import fpsim.train.sweep as sw

    monkeypatch.setattr(demo, "demo_settings", lambda quick=False, steps=None, seed=0: _tiny())

    def dead(*a, **k):  # type: ignore[no-untyped-def]
        raise sw.SweepError("1 cell(s) failed after 2 resubmissions: demo.fp32.s1: KilledWorker: worker died")

    monkeypatch.setattr(sw, "run_sweep", dead)
    rc, out, err = run_cli(["demo", "--seeds", "2", "--workers", "0", "--policies", "fp32",
                            "--out", str(tmp_path / "d")])
    assert rc == 1 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("fpsim demo: error: 1 cell(s) failed after 2 resubmissions"), err


def test_cli_unexpected_errors_keep_their_traceback_and_ask_for_a_report(tmp_path: Any,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import fpsim.train.demo as demo

    def bug(*a, **k):  # type: ignore[no-untyped-def]
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(demo, "run_demo", bug)
    rc, out, err = run_cli(["demo", "--steps", "1", "--out", str(tmp_path / "d")])
    assert rc == 1 and out == ""
    assert "Traceback" in err and "ZeroDivisionError: a bug" in err, err
    assert err.splitlines()[-1] == ("fpsim demo: internal error (ZeroDivisionError): this is a bug in fpsim; please "
                                    "report it with the command line and the traceback above")

    def oom(*a, **k):  # type: ignore[no-untyped-def]
        raise MemoryError

    monkeypatch.setattr(demo, "run_demo", oom)
    rc, out, err = run_cli(["demo", "--steps", "1", "--out", str(tmp_path / "d")])
    assert (rc, out, err) == (1, "", "fpsim demo: error: out of memory\n")


def test_cli_dask_killed_worker_is_one_line(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """An audit task whose workers all died (out of memory on a cluster): the machines' failure, not a bug."""
    distributed = pytest.importorskip("distributed")
    import types

    import fpsim.train.demo as demo

    def killed(*a, **k):  # type: ignore[no-untyped-def]
        raise distributed.KilledWorker("fpsim-audit-x-0", types.SimpleNamespace(address="tcp://10.0.0.9:1234"), 3)

    monkeypatch.setattr(demo, "run_demo", killed)
    rc, out, err = run_cli(["demo", "--steps", "1", "--out", str(tmp_path / "d")])
    assert rc == 1 and out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("fpsim demo: error: Attempted to run task 'fpsim-audit-x-0' on 4 different workers"), err


@pytest.mark.parametrize("argv", [["formats"], ["devices"], ["devices", "--json"], ["round", "1", "--json"],
                                  ["plan", "--model", "llama3-8b"], ["--help"], ["--version"]])
def test_cli_output_to_a_closed_pipe_is_quiet(argv: list[str]) -> None:
    """``fpsim formats | head -1``: the reader has gone before the first write; no BrokenPipeError traceback."""
    r, w = os.pipe()
    os.close(r)  # the reader left
    try:
        p = subprocess.run([sys.executable, "-m", "fpsim.cli", *argv], stdout=w, stderr=subprocess.PIPE, text=True,
                           timeout=120)
    finally:
        os.close(w)
    assert "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr, p.stderr
    assert p.returncode in (0, 120) if argv[0].startswith("--") else p.returncode == 0, p.stderr


class _FlushLog:
    """A stdout that remembers what had been flushed (what a reader of a redirected stdout has seen)."""

    def __init__(self) -> None:
        self.text, self.flushed = "", ""

    def write(self, s: str) -> int:
        self.text += s
        return len(s)

    def flush(self) -> None:
        self.flushed = self.text

    def isatty(self) -> bool:
        return False


def test_cli_demo_flushes_its_lines_before_the_sweep_trains(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import fpsim.train.demo as demo
    import fpsim.train.sweep as sw
    from fpsim.cli import main

    monkeypatch.setattr(demo, "demo_settings", lambda quick=False, steps=None, seed=0: _tiny())
    seen: list[str] = []
    log = _FlushLog()

    def first_cell(cell):  # type: ignore[no-untyped-def]
        seen.append(log.flushed)  # what `fpsim demo > log` shows while the first cell trains
        raise KeyboardInterrupt

    monkeypatch.setattr(sw, "run_cell", first_cell)
    monkeypatch.setattr(sys, "stdout", log)
    rc = main(["demo", "--seeds", "2", "--workers", "0", "--policies", "fp32", "--out", str(tmp_path / "d")])
    monkeypatch.undo()
    assert rc == 130 and len(seen) == 1
    assert "fpsim demo: task" in seen[0] and "sweep: 1 policies x 2 seeds = 2 cells serially" in seen[0], seen


def test_cli_demo_sweep_says_each_cell_when_not_on_a_terminal(tmp_path: Any,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import fpsim.train.demo as demo
    import fpsim.train.report as report

    monkeypatch.setattr(demo, "demo_settings", lambda quick=False, steps=None, seed=0: _tiny())
    monkeypatch.setattr(report, "write_plots", lambda *a, **k: {})
    rc, out, err = run_cli(["demo", "--seeds", "2", "--workers", "0", "--policies", "fp32", "--out",
                            str(tmp_path / "d")])
    assert rc == 0, err
    assert "sweep: 1/2 cells done (demo.fp32.s0)" in out and "sweep: 2/2 cells done (demo.fp32.s1)" in out, out
