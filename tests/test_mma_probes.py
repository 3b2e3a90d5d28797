"""Probe vectors P1-P24, F1-F3 and hardware rows H1-H3 of the Tensor Core reference (tensorcore.md section 6).

Each probe states its expected output per column: V100 (k4, neab0), A100 (k8, neab1), H100 (k16, neab2; also
B200), exactRN (exact result rounded once) and the fp32 FMA chain. The expected values are the reference's
(stated by the Fasi et al. suite, the HPEC A30 output, or derived), not computed by fpsim.
"""

from __future__ import annotations

import numpy as np
import pytest

from fpsim.mma import dot, generic, get_model
from fpsim.mma.naive import dot_naive

u = 2.0**-24


def p(n: int) -> float:
    return 2.0**n


COLS = ("v100", "a100", "h100", "exact", "fma")


def model_for(col: str, out: str = "fp32", inp: str = "fp16"):
    if col == "exact":
        return generic("exact", out, input=inp)
    if col == "fma":
        return generic("fma_chain", out, input=inp)
    return get_model(col, inp, out)


# (id, a, b, c, output, {column: expected}); a missing column means "n/a".
PROBES = [
    ("P1", [1], [1], -(1 - u), "fp32", {"v100": p(-23), "a100": p(-24), "h100": p(-24), "exact": p(-24), "fma": p(-24)}),
    ("P2", [1] * 4, [u] * 4, 1.0, "fp32", {"v100": 1, "a100": 1 + p(-22), "h100": 1 + p(-22), "exact": 1 + p(-22), "fma": 1}),
    ("P3", [0.5] * 4, [u] * 4, 1.0, "fp32", {"v100": 1, "a100": 1, "h100": 1 + p(-23), "exact": 1 + p(-23), "fma": 1}),
    ("P4", [1] * 4, [2, 3 * u, 0, 0], 0.0, "fp32", {"v100": 2, "a100": 2, "h100": 2, "exact": 2 + p(-22), "fma": 2 + p(-22)}),
    ("P5", [1] * 4, [-2, -3 * u, 0, 0], 0.0, "fp32",
     {"v100": -2, "a100": -2, "h100": -2, "exact": -2 - p(-22), "fma": -2 - p(-22)}),
    ("P6", [1] * 4, [u] * 4, 1 - u, "fp32",
     {"v100": 1 + p(-23), "a100": 1 + p(-23), "h100": 1 + p(-23), "exact": 1 + p(-22), "fma": 1}),
    ("P7", [1, 1], [1, -u], -1 + u, "fp32", {"v100": p(-23), "a100": 0, "h100": 0, "exact": 0, "fma": 0}),
    ("P9", [1] * 4, [1, 1.5, 1.75, 1.875], 1.875, "fp32", {"v100": 8, "a100": 8, "h100": 8, "exact": 8, "fma": 8}),
    ("P10", [1] * 4, [1] * 4, 1 + p(-22) + p(-23), "fp32",
     {"v100": 5, "a100": 5, "h100": 5, "exact": 5 + p(-21), "fma": 5 + p(-21)}),
    ("P11", [1] * 4, [-1] * 4, -(1 + p(-22) + p(-23)), "fp32",
     {"v100": -5, "a100": -5, "h100": -5, "exact": -5 - p(-21), "fma": -5 - p(-21)}),
    ("P12a", [0.5] * 4, [u, u, u, 3 * u], 1 - u, "fp32",
     {"v100": 1, "a100": 1 + p(-23), "h100": 1 + p(-23), "exact": 1 + p(-23), "fma": 1 + p(-23)}),
    ("P12b", [0.5] * 4, [u, u, u, 3 * u], 1.0, "fp32",
     {"v100": 1, "a100": 1, "h100": 1 + p(-23), "exact": 1 + p(-22), "fma": 1 + p(-23)}),
    ("P13", [u, u], [0.5, 0.25], 0.0, "fp16", {"v100": u, "a100": u, "h100": u, "exact": u, "fma": u}),
    ("P14", [u], [4], 0.0, "fp32", {"v100": p(-22), "a100": p(-22), "h100": p(-22), "exact": p(-22), "fma": p(-22)}),
    ("P14h", [u], [4], 0.0, "fp16", {"v100": p(-22), "a100": p(-22), "h100": p(-22), "exact": p(-22), "fma": p(-22)}),
    ("P15", [0.0], [0.0], p(-149), "fp32",
     {"v100": p(-149), "a100": p(-149), "h100": p(-149), "exact": p(-149), "fma": p(-149)}),
    ("P18", [u, u], [1, 1], 1.0, "fp32", {"v100": 1, "a100": 1 + p(-23), "h100": 1 + p(-23), "exact": 1 + p(-23), "fma": 1}),
    ("P19", [u, u, u], [1, 0.5, 0.5], 1.0, "fp32",
     {"v100": 1, "a100": 1, "h100": 1 + p(-23), "exact": 1 + p(-23), "fma": 1}),
    ("P21", [p(-21) + u] * 2, [1, 1], 1 - p(-21), "fp32",
     {"v100": 1 + p(-21) + p(-23), "a100": 1 + p(-21) + p(-23), "h100": 1 + p(-21) + p(-23),
          "exact": 1 + p(-21) + p(-23), "fma": 1 + p(-21)}),
    ("P22", [1, 1, 1], [1, 1, 1], 1 + p(-10) + p(-9), "fp16",
     {"v100": 4 + p(-8), "a100": 4 + p(-8), "h100": 4 + p(-8), "exact": 4 + p(-8), "fma": 4 + p(-8)}),
    ("P23", [0] * 8 + [u] + [0] * 7, [0] * 8 + [1.5] + [0] * 7, 1 + p(-23), "fp32",
     {"v100": 1 + p(-23), "a100": 1 + p(-23), "h100": 1 + p(-23), "exact": 1 + p(-22), "fma": 1 + p(-22)}),
    ("P24", [1, 1], [1, -u], 0.0, "fp32", {"v100": 1, "a100": 1 - u, "h100": 1 - u, "exact": 1 - u, "fma": 1 - u}),
]

CASES = [pytest.param(a, b, c, out, col, exp[col], id=f"{pid}-{col}")
         for pid, a, b, c, out, exp in PROBES for col in COLS if col in exp]


def check(got: float, want: float) -> None:
    g, w = np.float32(got), np.float32(want)
    assert g.view(np.uint32) == w.view(np.uint32), f"got {float(g)!r} ({g.view(np.uint32):08x}), " \
        f"want {float(w)!r} ({w.view(np.uint32):08x})"


@pytest.mark.parametrize("a, b, c, out, col, want", CASES)
def test_probe(a, b, c, out, col, want):
    m = model_for(col, out)
    check(dot(a, b, c, m, input_rounding="exact"), want)
    if col not in ("exact", "fma"):
        check(dot_naive([float(x) for x in a], [float(x) for x in b], c, m), want)


# Also with the ± sign variants of P18-P23 (RZ is symmetric, so negating inputs and c negates D).
@pytest.mark.parametrize("pid, a, b, c, out, exp", [pr for pr in PROBES if pr[0] in ("P18", "P19", "P21", "P22",
                                                                                       "P23")],
                         ids=lambda v: v if isinstance(v, str) and v.startswith("P") else "")
@pytest.mark.parametrize("col", ("v100", "a100", "h100", "exact"))
def test_probe_negated(pid, a, b, c, out, exp, col):
    m = model_for(col, out)
    check(dot([-x for x in a], b, -c, m, input_rounding="exact"), -exp[col])


@pytest.mark.parametrize("i", range(4))
@pytest.mark.parametrize("col", COLS)
def test_p8_carry_out(i, col):
    b = [1.0] * 4
    b[i] = p(-23)
    check(dot([1.0] * 4, b, 1 + p(-22) + p(-23), model_for(col), input_rounding="exact"), 4 + p(-21))


@pytest.mark.parametrize("col, k", [("v100", 4), ("a100", 8), ("h100", 16), ("exact", None), ("fma", None)])
@pytest.mark.parametrize("j", range(1, 32))
def test_p20_block_size_detector(col, k, j):
    a = [0.0] * 32
    b = [0.0] * 32
    a[0] = b[0] = 1.0
    a[j], b[j] = p(-23), 1.0
    if col == "exact":
        want = 2 + p(-22)
    elif col == "fma":
        want = 2.0
    else:
        want = 2 + p(-22) if j < k else 2.0
    check(dot(a, b, 1 + p(-23), model_for(col), input_rounding="exact"), want)


@pytest.mark.parametrize("col", ("a100", "h100", "exact", "fma"))
def test_p16_bf16_subnormal_output(col):
    m = model_for(col, inp="bf16")
    check(dot([p(-133)], [p(7)], 0.0, m, input_rounding="exact"), p(-126))
    check(dot([p(-126)], [1.0], -p(-127), m, input_rounding="exact"), p(-127))


def test_p16_v100_has_no_bf16():
    with pytest.raises(ValueError, match="bf16"):
        get_model("v100", "bf16")


@pytest.mark.parametrize("col", ("a100", "h100", "exact", "fma"))
def test_p17_tf32_truncates_fp32_inputs(col):
    m = model_for(col, inp="tf32")
    x = np.float32(1 - u)  # fp32 register value; tf32 keeps 10 fraction bits: RZ gives 1 - p(-11)
    got = dot(np.array([x]), np.array([x]), np.float32(0))
    assert got.dtype == np.float32  # default model is exact on fp32 inputs
    res = dot(np.array([x]), np.array([x]), 0.0, m)  # default input_rounding: RZ for tf32
    assert np.float32(res).view(np.uint32) == 0x3F7FC004
    rne = dot(np.array([x]), np.array([x]), 0.0, m, input_rounding="rne")  # RNE gives 1
    check(rne, 1.0)


# FP8 probes. Columns: 13-bit (Ada and H100 fp32 out), B200 native tcgen05 and B200 mma.sync (V3), exact, fma.
FP8_COLS = ("ada", "h100", "b200-tcgen05", "b200", "exact", "fma")


def fp8_model(col: str, fmt: str):
    if col == "b200-tcgen05":
        return get_model("b200", fmt, path="tcgen05")
    return model_for(col, inp=fmt) if col in ("exact", "fma") else get_model(col, fmt)


@pytest.mark.parametrize("col", FP8_COLS)
@pytest.mark.parametrize("c, thirteen", [(1 + p(-23), 1.0), (1 + p(-13), 1 + p(-13)), (2 - p(-23), 2 - p(-13))])
def test_f1_fp22_accumulator_zeroes_low_bits(col, c, thirteen):
    want = thirteen if col in ("ada", "h100") else c
    check(dot([0.0] * 32, [0.0] * 32, c, fp8_model(col, "fp8_e4m3"), input_rounding="exact"), want)


@pytest.mark.parametrize("col", FP8_COLS)
@pytest.mark.parametrize("a, thirteen", [([0.5, 0.5], 2049.0), ([0.75, 0.25], 2049.0), ([0.875, 0.125], 2048.75)])
def test_f2_bit_14(col, a, thirteen):
    want = thirteen if col in ("ada", "h100") else 2049.0
    check(dot(a, [1.0, 1.0], 2048.0, fp8_model(col, "fp8_e5m2"), input_rounding="exact"), want)


@pytest.mark.parametrize("col", FP8_COLS)
@pytest.mark.parametrize("a, b, thirteen, wide", [([1, p(-7)], [1, p(-7)], 1.0, 1 + p(-14)),
                                                 ([1, p(-6)], [1, p(-7)], 1 + p(-13), 1 + p(-13))])
def test_f3_e4m3_grid(col, a, b, thirteen, wide):
    want = thirteen if col in ("ada", "h100") else wide
    check(dot(a, b, 0.0, fp8_model(col, "fp8_e4m3"), input_rounding="exact"), want)


def _words(s: str) -> np.ndarray:
    return np.array([int(w, 16) for w in s.split()], dtype=np.uint32).view(np.float32)


H_ROWS = [
    ("H1", "v100", "fp16", "bf0c6000 bf976000 3ee2c000 3ff56000", "bee90000 bfa62000 3f710000 3f270000",
     0x3EAB6396, 0x407257B2, 0x407257B3),
    ("H2", "a100", "tf32", "bdc52000 3fa08000 bf280000 3f572000", "3dd70000 bf9d0000 3f52a000 3f868000",
     0x3F418C50, 0xBEE5E08E, 0xBEE5E08F),
    ("H3", "h100", "fp8_e4m3",
     ("3f700000 3f800000 bea00000 3fb00000 bf300000 3ea00000 3f800000 3fe00000 3f600000 3f500000 bf800000 "
     "3eb00000 3cf00000 3e900000 3f800000 3f500000 bf800000 3f700000 3bc00000 bfa00000 bee00000 be600000 "
     "3fa00000 3fd00000 bd200000 3e600000 bf000000 bef00000 bf300000 3f300000 40200000 3ed00000"),
     ("3f100000 bf200000 3ed00000 3e900000 bff00000 3ef00000 bfc00000 bf900000 3db00000 bf300000 bf500000 "
     "40000000 bc600000 40100000 3e100000 bea00000 bf700000 3ff00000 bf200000 3f100000 bed00000 bdd00000 "
     "bf800000 3fa00000 3fd00000 3fb00000 bdb00000 bc400000 bfc00000 bec00000 3d200000 bbc00000"),
     0, 0x40727C00, 0x40727C70),
]


@pytest.mark.parametrize("hid, dev, fmt, a, b, c, want, exact_want", H_ROWS, ids=[h[0] for h in H_ROWS])
def test_hardware_rows(hid, dev, fmt, a, b, c, want, exact_want):
    av, bv = _words(a), _words(b)
    cv = np.array([c], dtype=np.uint32).view(np.float32)[0]
    d = dot(av, bv, cv, get_model(dev, fmt), input_rounding="exact")
    assert d.dtype == np.float32 and d.view(np.uint32) == want, f"{d.view(np.uint32):08x} != {want:08x}"
    e = dot(av, bv, cv, generic("exact", input=fmt), input_rounding="exact")
    assert e.view(np.uint32) == exact_want


@pytest.mark.parametrize("dev", ["v100", "a100", "h100"])
def test_fprev_order_probe_sees_one_chain_of_k_blocks(dev):
    """FPRev probe (reference section 7.4): units 2^-24, masks +-2^15 at i < j; the swamped count
    L(i, j) = n - out * 2^24 equals k * (floor(j / k) + 1) for one sequential chain of k-blocks."""
    m = get_model(dev, "fp16")
    n = 32
    i, j = np.triu_indices(n, 1)
    b = np.full((i.size, n), u)
    b[np.arange(i.size), i] = 2.0**15
    b[np.arange(i.size), j] = -(2.0**15)
    out = dot(np.ones(n), b, 0.0, m)
    assert np.array_equal(n - out * 2**24, m.k * (j // m.k + 1))
