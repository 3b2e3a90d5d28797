"""AMD CDNA MFMA presets against MMA-Sim (``mmasim.amd.sim.MFMA``), the independent bit-accurate oracle.

Each preset is compared bit for bit (NaN == NaN; the sign of zero counts) with MMA-Sim's simulation of the MFMA
instruction it names, on chained MFMAs (K = 1, 2 and 4 times the instruction's K, so blocks and instructions
chain through the accumulator) over: Gaussian values; random finite encodings (every exponent of the format);
subnormals and values near the smallest normal (inputs and C; the FTZ paths flush them); signed zeros and exact
cancellations; and random bit patterns including infinities and NaN. MMA-Sim takes A (M, K), B (K, N) and
C (M, N) as torch tensors of the instruction's types and chains its blocks over any K in index order.
"""

from __future__ import annotations

import re
import zlib

import numpy as np
import pytest

import fpsim
from fpsim.mma import amd, get_model

torch = pytest.importorskip("torch")
mfma_mod = pytest.importorskip("mmasim.amd.sim")

TD = {"fp16": torch.float16, "bf16": torch.bfloat16, "bf16_1k": torch.bfloat16, "fp32": torch.float32,
      "xf32": torch.float32, "fp64": torch.float64, "fp8_e4m3fnuz": torch.float8_e4m3fnuz,
      "fp8_e5m2fnuz": torch.float8_e5m2fnuz, "fp8_bf8": torch.float8_e4m3fnuz, "bf8_fp8": torch.float8_e5m2fnuz}
TD_B = {**TD, "fp8_bf8": torch.float8_e5m2fnuz, "bf8_fp8": torch.float8_e4m3fnuz}  # B's type (mixed FP8)
_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_MIN_NORMAL = {torch.float16: 2.0**-14, torch.bfloat16: 2.0**-126, torch.float32: 2.0**-126,
               torch.float64: 2.0**-1022, torch.float8_e4m3fnuz: 2.0**-7, torch.float8_e5m2fnuz: 2.0**-15}

PRESETS = list(amd.INSTRUCTIONS)
IDS = [f"{d}-{i}" + ("" if p is None else f"-{p}") for d, i, p in PRESETS]

MODES = ("normal", "wide", "subnormal", "zeros")


def _model(key):
    dev, inp, path = key
    return get_model(dev, inp, "fp64" if inp == "fp64" else "fp32", path=path)


def _instr_k(key) -> int:
    return int(re.search(r"\d+x\d+x(\d+)", amd.INSTRUCTIONS[key][1]).group(1))


def _values(rng, shape, dt, mode, *, operand: bool):
    """A torch tensor of dtype `dt` drawn by `mode`."""
    nb = torch.empty(0, dtype=dt).element_size()
    if mode == "normal":
        return torch.from_numpy(rng.standard_normal(shape) * np.exp2(rng.integers(-3, 4, shape))).to(dt)
    if mode == "zeros":  # signed zeros, exact cancellations, a few ones and tiny powers of two
        choice = rng.choice([0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0**-6, -(2.0**-6)], size=shape)
        return torch.from_numpy(choice).to(dt)
    if mode == "edges":  # the format's special values mixed with ones: zeros of both signs, extremes, inf, NaN
        fi = torch.finfo(dt)
        tiny, big = float(fi.smallest_normal), float(fi.max)
        vals = [0.0, -0.0, 1.0, -1.0, 0.5, tiny, -tiny, tiny * 2.0**-2, -tiny * 2.0**-2, big, -big,
                big * 2.0**-10, float("inf"), float("-inf"), float("nan")]
        v = np.asarray(vals)[rng.integers(0, len(vals), size=shape)]
        v = np.where(rng.random(shape) < 0.5, 1.0, v)  # mostly ones, so that single specials matter
        return torch.from_numpy(v).to(dt)
    if mode == "subnormal":
        tiny = _MIN_NORMAL[dt]
        v = tiny * np.exp2(rng.uniform(-8, 3, shape)) * rng.choice([-1.0, 1.0], size=shape)
        if dt == torch.float64 and operand:  # subnormal times subnormal underflows: pair with large values too
            v = np.where(rng.random(shape) < 0.5, v, rng.standard_normal(shape) * 2.0**rng.integers(0, 1000, shape))
        v = np.where(rng.random(shape) < 0.2, 0.0, v)
        return torch.from_numpy(v).to(dt)
    # "wide" (finite encodings only) and "bits" (any encoding, infinities and NaN included)
    if nb < 8:
        bits = rng.integers(0, 2 ** (8 * nb), size=shape, dtype=np.int64)
        if nb > 1:  # torch has no uint16/uint32 views: use the signed integer of the same width
            bits = bits - (bits >= 2 ** (8 * nb - 1)) * (2 ** (8 * nb))
    else:  # fp64: every exponent; specials planted for "bits"
        bits = rng.integers(-(2**63), 2**63 - 1, size=shape, dtype=np.int64, endpoint=True)
        if mode == "bits":
            pick = rng.random(shape)
            bits = np.where(pick < 0.05, np.int64(0x7FF0000000000000), bits)
            bits = np.where((pick >= 0.05) & (pick < 0.1), np.int64(0x7FF8000000000000), bits)
            bits = np.where((pick >= 0.1) & (pick < 0.15), np.int64(0), bits)
            bits = np.where((pick >= 0.15) & (pick < 0.25), bits & np.int64(0x000FFFFFFFFFFFFF), bits)  # subnormal
            bits = np.where(rng.random(shape) < 0.5, bits | np.int64(-(2**63)), bits)
    x = torch.from_numpy(np.asarray(bits)).to(_INT[nb]).view(dt)
    if mode == "wide":
        xf = x.double() if nb < 8 else x
        x = torch.where(torch.isfinite(xf), x, torch.zeros_like(x))
    return x


def _carrier(t):
    """float64 NumPy values of a torch tensor."""
    return t.double().numpy() if t.dtype != torch.float64 else t.numpy().copy()


def compare(key, mode, k, rng, m=6, n=5):
    """(cases, mismatch mask, got, want, A, B, C) for one random chained-MFMA product."""
    model = _model(key)
    arch, suffix = amd.INSTRUCTIONS[key]
    dt, dtb = TD[key[1]], TD_B[key[1]]
    odt = torch.float64 if key[1] == "fp64" else torch.float32
    A = _values(rng, (m, k), dt, mode, operand=True)
    B = _values(rng, (k, n), dtb, mode, operand=True)
    C = _values(rng, (m, n), odt, mode, operand=False)
    want = _carrier(mfma_mod.MFMA(arch, suffix)(A, B, C))
    got = np.asarray(fpsim.matmul(_carrier(A), _carrier(B), _carrier(C), model=model), dtype=np.float64)
    same = ((got == want) & (np.signbit(got) == np.signbit(want))) | (np.isnan(got) & np.isnan(want))
    return same.size, ~same, got, want, A, B, C


def _report(key, mode, k, bad, got, want):
    i = tuple(np.argwhere(bad)[0])
    return f"{key} {mode} K={k}: {int(bad.sum())} mismatches, first at {i}: fpsim {got[i]!r}, MMA-Sim {want[i]!r}"


@pytest.mark.parametrize("key", PRESETS, ids=IDS)
def test_agrees_with_mmasim(key):
    rng = np.random.default_rng(zlib.crc32(repr(key).encode()))
    kk = _instr_k(key)
    for mode in MODES:
        for k in (kk, 2 * kk, 4 * kk):
            _, bad, got, want, *_ = compare(key, mode, k, rng)
            assert not bad.any(), _report(key, mode, k, bad, got, want)


def _gtr_c_dropped(key, A, B, C, got, want) -> np.ndarray:
    """Outputs where MMA-Sim's GTR_FDPA dropped a non-finite running sum that fpsim propagates.

    torch.frexp(inf or NaN) returns the exponent 0, so MMA-Sim's e_c is -1, and C is zeroed when
    e_c < e_max - 25: in any block of 16 whose largest product exponent e_a + e_b exceeds 24 an infinite or
    NaN accumulator (C, or the result of an earlier block with a NaN input) is lost and the result is finite.

    The excuse needs all of: a block ``j`` with a largest finite product exponent > 24 whose incoming
    accumulator is non-finite (C non-finite, or a non-finite input in a product of an earlier block of that
    row and column), fpsim non-finite and MMA-Sim finite. Finite inputs cannot overflow the fp32 accumulator
    at these K (16 products of at most 2**32 each), so a non-finite fpsim result without a non-finite
    C or earlier input is never excused: a spurious overflow in fpsim shows up as a mismatch.
    """
    a, b = _carrier(A), _carrier(B)
    c = _carrier(C)
    emin_a = -7 if A.dtype == torch.float8_e4m3fnuz else -15
    emin_b = -7 if B.dtype == torch.float8_e4m3fnuz else -15
    with np.errstate(divide="ignore", invalid="ignore"):
        ea = np.where(np.isfinite(a) & (a != 0), np.maximum(np.floor(np.log2(np.abs(a))), emin_a), -999)
        eb = np.where(np.isfinite(b) & (b != 0), np.maximum(np.floor(np.log2(np.abs(b))), emin_b), -999)
    eprod = ea[:, :, None] + eb[None, :, :]  # (M, K, N)
    nonfin = ~np.isfinite(a)[:, :, None] | ~np.isfinite(b)[None, :, :]  # (M, K, N): product is inf/NaN
    kk = eprod.shape[1]
    acc_nonfinite = ~np.isfinite(c)  # the accumulator entering the current block
    dropped = np.zeros((eprod.shape[0], eprod.shape[2]), dtype=bool)
    for j in range(0, kk, 16):
        dropped |= acc_nonfinite & (eprod[:, j:j + 16].max(axis=1) > 24)
        acc_nonfinite = acc_nonfinite | nonfin[:, j:j + 16].any(axis=1)
    return dropped & ~np.isfinite(got) & np.isfinite(want)


@pytest.mark.parametrize("key", PRESETS, ids=IDS)
def test_specials_agree_with_mmasim(key):
    """Random bit patterns (infinities, NaN, signed zeros, subnormals, every exponent)."""
    rng = np.random.default_rng(7 + zlib.crc32(repr(key).encode()))
    kk = _instr_k(key)
    for mode in ("bits", "edges"):
        for k in (kk, 2 * kk):
            _, bad, got, want, A, B, C = compare(key, mode, k, rng)
            if amd.INSTRUCTIONS[key][1].endswith(("fp8", "bf8")):
                # the one known divergence: fpsim propagates an inf/NaN C that MMA-Sim's GTR_FDPA drops
                bad = bad & ~_gtr_c_dropped(key, A, B, C, got, want)
            assert not bad.any(), _report(key, mode, k, bad, got, want)


def test_gtr_nonfinite_c_divergence_is_documented():
    """MI300X bf8: an inf C with large products: MMA-Sim returns a finite sum (C dropped), fpsim returns inf."""
    key = ("mi300x", "fp8_e5m2fnuz", None)
    A = torch.full((1, 16), 2.0**14).to(torch.float8_e5m2fnuz)
    B = torch.full((16, 1), 2.0**14).to(torch.float8_e5m2fnuz)
    C = torch.full((1, 1), float("inf"))
    want = _carrier(mfma_mod.MFMA(*amd.INSTRUCTIONS[key])(A, B, C))
    got = np.asarray(fpsim.matmul(_carrier(A), _carrier(B), _carrier(C), model=_model(key)))
    assert np.isfinite(want).all() and _gtr_c_dropped(key, A, B, C, got, want).all()
    assert np.isinf(got).all()
    # the excuse needs a non-finite C (or earlier input): a spurious inf from fpsim with a finite C is not excused
    finite_c = torch.zeros((1, 1))
    fake_inf = np.full((1, 1), np.inf)
    assert not _gtr_c_dropped(key, A, B, finite_c, fake_inf, np.zeros((1, 1))).any()
    # ...nor a non-finite input in the same block of 16 (MMA-Sim keeps that one: it is not a dropped C)
    A2 = A.clone()
    A2[0, 3] = float("nan")
    assert not _gtr_c_dropped(key, A2, B, finite_c, fake_inf, np.zeros((1, 1))).any()
    # a NaN input in an earlier block of 16 makes the running sum non-finite: excused when a later block is large
    A3 = torch.cat([torch.ones((1, 16)), torch.full((1, 16), 2.0**14)], dim=1).to(torch.float8_e5m2fnuz)
    A3[0, 0] = float("nan")
    B3 = torch.full((32, 1), 2.0**14).to(torch.float8_e5m2fnuz)
    assert _gtr_c_dropped(key, A3, B3, finite_c, fake_inf, np.zeros((1, 1))).all()
    # with small products MMA-Sim keeps the infinity too
    A = torch.ones((1, 16)).to(torch.float8_e5m2fnuz)
    want = _carrier(mfma_mod.MFMA(*amd.INSTRUCTIONS[key])(A, A.T.contiguous(), C))
    got = np.asarray(fpsim.matmul(_carrier(A), _carrier(A.T.contiguous()), _carrier(C), model=_model(key)))
    assert np.isinf(want).all() and np.isinf(got).all()


def agreement_counts(trials: int = 4, seed: int = 0) -> dict[str, tuple[int, int]]:
    """Cases and mismatches per preset over every mode (bits included; the gtr divergence counted apart).

    Returns ``{preset id: (cases, mismatches, gtr_nonfinite_c_cases)}``. Used by the slow test and for the
    counts in docs/matrix-units.md (``python -c "from tests.test_mma_amd import agreement_counts; ..."``).
    """
    rng = np.random.default_rng(seed)
    out = {}
    for key, pid in zip(PRESETS, IDS):
        kk = _instr_k(key)
        cases = bad_n = drop_n = 0
        for _ in range(trials):
            for mode in MODES + ("bits", "edges"):
                for k in (kk, 2 * kk, 4 * kk):
                    n, bad, got, want, A, B, C = compare(key, mode, k, rng, m=8, n=8)
                    if amd.INSTRUCTIONS[key][1].endswith(("fp8", "bf8")):
                        drop = _gtr_c_dropped(key, A, B, C, got, want)
                        drop_n += int((bad & drop).sum())
                        bad = bad & ~drop
                    cases += n
                    bad_n += int(bad.sum())
        out[pid] = (cases, bad_n, drop_n)
    return out


@pytest.mark.slow
def test_agreement_counts_slow():
    counts = agreement_counts(trials=3, seed=1)
    assert all(bad == 0 for _cases, bad, _drop in counts.values()), counts


# ---------------------------------------------------------------------------------------------------------
# The presets as a user meets them
# ---------------------------------------------------------------------------------------------------------

def test_get_model_names_and_kinds():
    assert get_model("MI300X", "fp16").kind == "tr_fdpa"
    assert get_model("cdna2", "fp16").kind == "ftz_mul_add"
    assert get_model("Instinct-MI100", "bf16").k == 2
    assert get_model("mi250x", "bf16").k == 4 and get_model("mi250x", "bf16_1k").k == 4
    assert get_model("mi250x", "bf16", path="bf16").k == 2
    assert get_model("mi300x", "xf32").input.name == "tf32"
    assert get_model("mi300x", "float8_e4m3fnuz").kind == "gtr_fdpa"
    mixed = get_model("mi300x", "fp8_bf8")
    assert (mixed.input.name, mixed.b_format.name) == ("fp8_e4m3fnuz", "fp8_e5m2fnuz")
    assert get_model("mi300x", "bf8_fp8").b_format.name == "fp8_e4m3fnuz"
    assert get_model("mi250x", "fp64", "fp64").output.name == "fp64"
    assert amd.instruction(get_model("mi250x", "fp16")) == ("CDNA2", "f32_32x32x8f16")
    assert fpsim.mma.as_model("mi300x:bf16").kind == "tr_fdpa"


@pytest.mark.parametrize("args, match", [
    (("mi100", "fp64", "fp64"), "fp64 MFMA starts with CDNA2"),
    (("mi250x", "fp8_e4m3fnuz"), "FP8 MFMA starts with CDNA3"),
    (("mi300x", "fp8_e4m3"), "fnuz"),
    (("mi300x", "tf32"), "xf32"),
    (("mi250x", "fp64"), "output='fp64'"),
    (("mi300x", "fp16", "fp16"), "accumulates to fp32"),
])
def test_get_model_errors_explain(args, match):
    with pytest.raises(ValueError, match=match):
        get_model(*args)


def test_unknown_path_lists_choices():
    with pytest.raises(ValueError, match="bf16_1k"):
        get_model("mi250x", "bf16", path="turbo")


def test_dot_matmul_shapes_dtypes_and_inputs_untouched():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((3, 20)).astype(np.float32)
    b = rng.standard_normal((20, 4)).astype(np.float32)
    a0, b0 = a.copy(), b.copy()
    for dev in ("mi100", "mi250x", "mi300x"):
        m = get_model(dev, "fp16")
        d = fpsim.matmul(a, b, model=m)
        assert d.dtype == np.float32 and d.shape == (3, 4)
        r = fpsim.mma.dot(a[1], b[:, 2], 0.0, m)
        assert float(r) == float(d[1, 2])
        assert fpsim.matmul(a[:, :0], b[:0], model=m).shape == (3, 4)
        assert fpsim.matmul(a[:0], b, model=m).shape == (0, 4)
    np.testing.assert_array_equal(a, a0)
    np.testing.assert_array_equal(b, b0)


def test_k_not_a_multiple_of_the_block():
    """K = 5 on a block of 4 / 8 / pairs of 4: as MMA-Sim, the last block is shorter (zeros for the FTZ pairs)."""
    rng = np.random.default_rng(4)
    for key in [("mi100", "fp16", None), ("mi250x", "fp16", None), ("mi300x", "bf16", None)]:
        A = torch.from_numpy(rng.standard_normal((3, 5))).to(TD[key[1]])
        B = torch.from_numpy(rng.standard_normal((5, 2))).to(TD[key[1]])
        C = torch.from_numpy(rng.standard_normal((3, 2))).float()
        if key[0] == "mi250x":  # MMA-Sim's FTZ_MUL_ADD needs K % 4 == 0: pad with zeros, as the hardware would
            A = torch.cat([A, torch.zeros((3, 3), dtype=A.dtype)], 1)
            B = torch.cat([B, torch.zeros((3, 2), dtype=B.dtype)], 0)
        want = _carrier(mfma_mod.MFMA(*amd.INSTRUCTIONS[key])(A, B, C))
        got = fpsim.matmul(_carrier(A)[:, :5], _carrier(B)[:5], _carrier(C), model=_model(key))
        np.testing.assert_array_equal(got, want)


def test_fp64_fma_matches_the_c_library_fma():
    """The fp64 FMA chain over the whole range (subnormal and huge operands, inf/NaN, cancellations) against
    MMA-Sim's CPU fma (C ``std::fma``), one step on 300,000 random bit patterns and out-of-range cases."""
    fma_mod = pytest.importorskip("mmasim.arithmetic.fma")
    from fpsim.formats import fp64

    rng = np.random.default_rng(11)
    n = 100_000

    def bits():
        return rng.integers(-(2**63), 2**63 - 1, size=n, dtype=np.int64, endpoint=True).view(np.float64)

    def ranged(lo, hi):
        m = rng.integers(2**52, 2**53, n).astype(np.float64) * 2.0**-53
        return rng.choice([-1.0, 1.0], n) * m * np.exp2(rng.integers(lo, hi, n).astype(np.float64))

    cases = [(bits(), bits(), bits()),
             (ranged(-1074, -900), ranged(-200, 1023), ranged(-1074, 1023)),
             (ranged(-600, -480), ranged(-600, -480), ranged(-1074, -1000))]
    a, b, c = cases[2]
    c[::3] = -(a[::3] * b[::3])  # cancellation down to the subnormal range
    for a, b, c in cases:
        with np.errstate(all="ignore"):
            got = amd._seq_fma(a[None], b[None], c.copy(), fp64)
        want = fma_mod.fma(torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(c)).numpy()
        same = ((got == want) & (np.signbit(got) == np.signbit(want))) | (np.isnan(got) & np.isnan(want))
        assert same.all(), (a[~same][:3], b[~same][:3], c[~same][:3], got[~same][:3], want[~same][:3])
