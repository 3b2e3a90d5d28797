"""fpsim.testing assertion helpers, checked against independent oracles (MPFR, ml_dtypes enumeration)."""

from __future__ import annotations

import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import fpsim
import fpsim.testing as ft

gmpy2 = pytest.importorskip("gmpy2")
from _mpfr_oracle import oracle_round

ML = {
    "bf16": ml_dtypes.bfloat16,
    "fp16": np.float16,
    "fp8_e4m3": ml_dtypes.float8_e4m3fn,
    "fp8_e5m2": ml_dtypes.float8_e5m2,
    "fp8_e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
    "fp8_e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
    "fp6_e2m3": ml_dtypes.float6_e2m3fn,
    "fp6_e3m2": ml_dtypes.float6_e3m2fn,
    "fp4_e2m1": ml_dtypes.float4_e2m1fn,
    "e8m0": ml_dtypes.float8_e8m0fnu,
}
MODES = ["rne", "rna", "rtz", "rup", "rdn", "rto"]


def _grid(name: str) -> np.ndarray:
    """All finite values of a format, ascending, -0 folded, decoded by ml_dtypes (not fpsim)."""
    dt = np.dtype(ML[name])
    codes = np.arange(1 << (8 * dt.itemsize), dtype=np.uint16 if dt.itemsize == 2 else np.uint8)
    if name in ("fp6_e2m3", "fp6_e3m2", "fp4_e2m1"):
        width = {"fp6_e2m3": 6, "fp6_e3m2": 6, "fp4_e2m1": 4}[name]
        codes = codes[: 1 << width]
    with np.errstate(invalid="ignore"):
        v = codes.view(dt).astype(np.float64)
    v = v[np.isfinite(v)]
    return np.unique(v + 0.0)


def _hard_inputs(name: str) -> np.ndarray:
    """Grid points, midpoints and both float64 neighbours of each, plus out-of-range and specials."""
    g = _grid(name)
    mids = (g[1:] + g[:-1]) / 2
    pts = np.concatenate([g, mids, [g[-1] * 1.1, g[-1] * 4, -g[-1] * 4, np.inf, -np.inf, np.nan]])
    pts = pts[(pts > 0) | (name != "e8m0")]
    with np.errstate(over="ignore"):
        return np.concatenate([pts, np.nextafter(pts, np.inf), np.nextafter(pts, -np.inf)])


# -- assert_rounded against MPFR --------------------------------------------------------------------


@pytest.mark.parametrize("name", ["bf16", "fp8_e4m3", "fp8_e5m2", "fp8_e4m3fnuz", "fp6_e2m3", "fp4_e2m1", "e8m0"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("overflow", ["ieee", "saturate"])
def test_assert_rounded_accepts_mpfr_results_and_rejects_one_step_off(name: str, mode: str, overflow: str) -> None:
    f = fpsim.as_format(name)
    x = _hard_inputs(name)
    if x.size > 1500:
        x = np.random.default_rng(0).choice(x, 1500, replace=False)
    want = np.array([oracle_round(float(v), f, mode, overflow) for v in x])
    ft.assert_rounded(want, x, f, rounding=mode, overflow=overflow)
    # One element moved by one step of the grid must be caught, and only that one reported.
    i = int(np.flatnonzero(np.isfinite(want) & (np.abs(want) < f.max) & (want > 0))[0])
    bad = want.copy()
    bad[i] = f.next_up(bad[i])
    with pytest.raises(AssertionError, match=r"Mismatched elements: 1 / ") as e:
        ft.assert_rounded(bad, x, f, rounding=mode, overflow=overflow)
    assert f"[{i}]" in str(e.value)
    assert "ulp distance +1" in str(e.value)


def test_failure_message_contents() -> None:
    x = np.array([1.0, 1 + 2**-8 + 2**-30, 3.0, 0.1])
    actual = np.array([1.0, 1.0, 3.0, 0.10009765625], dtype=np.float64)  # element 1: double rounded
    with pytest.raises(AssertionError) as e:
        ft.assert_rounded(actual, x, "bf16", err_msg="my kernel")
    msg = str(e.value)
    assert "not correctly rounded to bf16 (rounding=rne" in msg
    assert "my kernel" in msg
    assert "Mismatched elements: 1 / 4 (25%)" in msg
    assert "[1] x = 1.0039062509313226 (0x1.0100000400000p+0)" in msg
    assert "expected 1.0078125 = 0 01111111 0000001 (0x3f81)" in msg
    assert "actual   1.0 = 0 01111111 0000000 (0x3f80)" in msg
    assert "ulp distance -1" in msg
    assert "Likely cause: double rounding through float32" in msg


def test_hint_ties_away() -> None:
    x = np.array([1 + 2**-8, 1 + 3 * 2**-8, 2.5])  # bf16 ties
    with pytest.raises(AssertionError, match="Likely cause: ties rounded away from zero instead of to even"):
        ft.assert_rounded(fpsim.round(x, "bf16", "rna"), x, "bf16")


def test_hint_flush_to_zero() -> None:
    x = np.array([2.0**-20, -(2.0**-17), 1.0])  # fp16 subnormal results
    with pytest.raises(AssertionError, match="Likely cause: flush-to-zero") as e:
        ft.assert_rounded(np.array([0.0, -0.0, 1.0]), x, "fp16")
    assert "Mismatched elements: 2 / 3" in str(e.value)


def test_hint_saturation_and_overflow() -> None:
    x = np.array([500.0, -1e6, 1.0])
    with pytest.raises(AssertionError, match="Likely cause: saturation to ±max instead of overflow"):
        ft.assert_rounded(np.array([448.0, -448.0, 1.0]), x, "fp8_e4m3")
    with pytest.raises(AssertionError, match=r"Likely cause: overflow \(inf/NaN\) instead of saturation"):
        ft.assert_rounded(np.array([np.inf, -np.inf, 1.0]), x, "fp8_e5m2", overflow="saturate")


def test_hint_truncation() -> None:
    x = np.array([1.0 + 0.75 * 2**-7, -(1.0 + 0.9 * 2**-7), 1.0 + 0.6 * 2**-7])
    with pytest.raises(AssertionError, match=r"Likely cause: truncation \(rounded toward zero\) \(3 of 3\)"):
        ft.assert_rounded(np.trunc(x * 2**7) / 2**7, x, "bf16")


def test_hint_not_rounded_and_not_representable() -> None:
    x = np.array([0.1])
    with pytest.raises(AssertionError) as e:
        ft.assert_rounded(x, x, "bf16")
    assert "not a bf16 value" in str(e.value)
    assert "not rounded at all" in str(e.value)


def test_signed_zero_and_nan() -> None:
    ft.assert_rounded(np.array([-0.0, np.nan]), np.array([-1e-300, np.nan]), "fp16")
    with pytest.raises(AssertionError, match="sign of zero lost"):
        ft.assert_rounded(np.array([0.0]), np.array([-1e-300]), "fp16")
    # fnuz formats have no -0: either zero is the same code.
    ft.assert_rounded(np.array([-0.0]), np.array([-1e-300]), "fp8_e4m3fnuz")
    ft.assert_rounded(np.array([0.0]), np.array([-1e-300]), "fp8_e4m3fnuz")


def test_stochastic_rounding_accepts_either_neighbour() -> None:
    x = np.array([1 + 2**-9, 1 + 2**-9, 1.0])
    ft.assert_rounded(np.array([1.0, 1.0078125, 1.0]), x, "bf16", rounding="sr")
    with pytest.raises(AssertionError, match="or"):
        ft.assert_rounded(np.array([1.015625, 1.0, 1.0]), x, "bf16", rounding="sr")


def test_more_mismatches_than_shown() -> None:
    x = np.linspace(1, 2, 100) + 2**-12
    with pytest.raises(AssertionError) as e:
        ft.assert_rounded(x, x, "bf16")
    assert "... and" in str(e.value)


def test_shapes_and_scalars() -> None:
    ft.assert_rounded(1.0, 1.0000001, "bf16")
    ft.assert_rounded(np.ones((2, 3)), 1.0, "bf16")
    with pytest.raises(AssertionError, match="shape mismatch"):
        ft.assert_rounded(np.ones(3), np.ones(4), "bf16")
    x = np.full((2, 3), 1.0)
    x[1, 2] = 1.5
    with pytest.raises(AssertionError, match=r"\(1, 2\) x = 1.5"):
        ft.assert_rounded(np.ones((2, 3)), x, "bf16")


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="unknown format"):
        ft.assert_rounded(1.0, 1.0, "bf17")
    with pytest.raises(ValueError, match="unknown rounding mode"):
        ft.assert_rounded(1.0, 1.0, "bf16", rounding="nearest")
    with pytest.raises(TypeError):
        ft.assert_rounded("1.0", 1.0, "bf16")
    with pytest.raises(TypeError):
        ft.assert_rounded(1.0, 1.0, "bf16", subnormals="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_ulp"):
        ft.assert_ulp_close(1.0, 1.0, "bf16", max_ulp=-1)


def test_inputs_not_modified() -> None:
    x = np.array([1.1, 2.2])
    a = np.array([1.1, 2.2])
    with pytest.raises(AssertionError):
        ft.assert_rounded(a, x, "bf16")
    assert x.tolist() == [1.1, 2.2] and a.tolist() == [1.1, 2.2]


# -- ulp_distance against an enumeration of the grid ----------------------------------------------


@pytest.mark.parametrize("name", ["bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "fp8_e4m3fnuz", "fp6_e3m2", "e8m0"])
def test_ulp_distance_counts_grid_steps(name: str) -> None:
    g = _grid(name)
    rng = np.random.default_rng(1)
    i = rng.integers(0, g.size, 4000)
    j = rng.integers(0, g.size, 4000)
    d = ft.ulp_distance(g[i], g[j], name)
    assert np.array_equal(d, (i - j).astype(np.float64))
    # Midpoints are half a step above the lower neighbour.
    k = rng.integers(0, g.size - 1, 1000)
    mid = (g[k] + g[k + 1]) / 2
    assert np.array_equal(ft.ulp_distance(mid, g[k], name), np.full(k.size, 0.5))


def test_ulp_distance_specials() -> None:
    assert ft.ulp_distance(-0.0, 0.0, "fp16") == 0
    assert ft.ulp_distance(2.0**-24, -(2.0**-24), "fp16") == 2
    assert ft.ulp_distance(np.inf, 65504.0, "fp16") == 1
    assert ft.ulp_distance(np.inf, 448.0, "fp8_e4m3") == np.inf
    assert ft.ulp_distance(np.inf, np.inf, "fp8_e4m3") == 0
    assert np.isnan(ft.ulp_distance(np.nan, 1.0, "fp16"))
    assert ft.ulp_distance(1.0, np.nextafter(1.0, 2.0), "fp64") == -1
    assert ft.ulp_distance(5e-324, -5e-324, "fp64") == 2
    assert ft.ulp_distance(np.float32(1.5), 1.0, "fp32") == 2**22
    assert isinstance(ft.ulp_distance(1.0, 1.0, "bf16"), np.float64)


def test_assert_ulp_close_and_same_bits() -> None:
    ft.assert_ulp_close([1.0, -0.0], [1.0078125, 0.0], "bf16", max_ulp=1)
    ft.assert_ulp_close([np.nan], [np.nan], "bf16")
    with pytest.raises(AssertionError, match="Max ulp distance: 2"):
        ft.assert_ulp_close([1.0, 1.0], [1.015625, 1.0], "bf16", max_ulp=1)
    ft.assert_same_bits([np.nan, -0.0, 448.0], [np.nan, -0.0, 448.0], "fp8_e4m3")
    with pytest.raises(AssertionError, match="0x80"):
        ft.assert_same_bits([-0.0], [0.0], "fp8_e4m3")
    ft.assert_same_bits([-0.0], [0.0], "fp8_e4m3fnuz")  # no -0 in fnuz: same code
    with pytest.raises(AssertionError, match="not a bf16 value"):
        ft.assert_same_bits([0.1], [0.1], "bf16")


# -- input kinds ---------------------------------------------------------------------------------


class _ArrayOnly:
    def __init__(self, a: np.ndarray) -> None:
        self._a = a

    def __array__(self, dtype: object = None, copy: object = None) -> np.ndarray:
        return self._a


class _DLPackOnly:
    def __init__(self, a: np.ndarray) -> None:
        self._a = a

    def __dlpack__(self, **kw: object) -> object:
        return self._a.__dlpack__(**kw)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._a.__dlpack_device__()


def test_input_kinds_numpy_ml_dtypes_protocols() -> None:
    x = np.array([1.0, 1 + 2**-8 + 2**-20, 300.0])
    r = fpsim.round(x, "bf16")
    for actual in (r.astype(ml_dtypes.bfloat16), r.astype(np.float32), list(r), _ArrayOnly(r), _DLPackOnly(r)):
        ft.assert_rounded(actual, x, "bf16")
    ft.assert_rounded(r, x.astype(np.float32), "bf16")


@pytest.mark.torch
def test_input_kinds_torch() -> None:
    torch = pytest.importorskip("torch")
    x = torch.tensor([1.0, 1 + 2**-8 + 2**-20, 300.0, -1e-40], dtype=torch.float32, requires_grad=True)
    for dt, name in ((torch.bfloat16, "bf16"), (torch.float16, "fp16"), (torch.float8_e5m2, "fp8_e5m2")):
        ft.assert_rounded(x.to(dt), x, name)
    ft.assert_same_bits(x.to(torch.bfloat16), fpsim.round(x.detach().numpy(), "bf16"), "bf16")
    with pytest.raises(TypeError, match="complex"):
        ft.assert_rounded(torch.ones(2, dtype=torch.complex64), np.ones(2), "bf16")


def test_importing_testing_does_not_import_hypothesis() -> None:
    code = ("import sys, fpsim, fpsim.testing, fpsim.testing.plugin; "
            "bad = [m for m in ('hypothesis', 'gmpy2', 'matplotlib', 'torch') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


# -- assert_matmul_matches -----------------------------------------------------------------------


def test_assert_matmul_matches() -> None:
    if not hasattr(fpsim, "matmul"):
        pytest.skip("fpsim.matmul is not available yet (the matrix layer is being written)")
    rng = np.random.default_rng(0)
    A = fpsim.round(rng.standard_normal((8, 16)), "bf16")
    B = fpsim.round(rng.standard_normal((16, 4)), "bf16")
    # Independent reference for the exact model: bf16 products and their sum are exact in float64
    # here (few bits, narrow exponent range), and NumPy's float64 -> float32 cast rounds once.
    ref = (A @ B).astype(np.float32)
    ft.assert_matmul_matches(ref, A, B)
    ft.assert_matmul_matches(ref, A.astype(ml_dtypes.bfloat16), B.astype(ml_dtypes.bfloat16), model="exact")
    wrong = ref.copy()
    wrong[0, 0] = np.nextafter(wrong[0, 0], np.float32(np.inf))
    with pytest.raises(AssertionError, match="Mismatched elements: 1 / 32") as e:
        ft.assert_matmul_matches(wrong, A, B)
    assert "ulp distance +1" in str(e.value) and "compared in fp32" in str(e.value)
    ft.assert_matmul_matches(wrong, A, B, max_ulp=1)
    # A hardware model with fp16 output: a float32 result that is not an fp16 value fails.
    hw = fpsim.matmul(A, B, None, model="v100:fp16:fp16")
    ft.assert_matmul_matches(hw, A, B, model="v100:fp16:fp16")
    with pytest.raises(AssertionError, match="not a fp16 value"):
        ft.assert_matmul_matches(np.asarray(hw) + 2.0**-20, A, B, model="v100:fp16:fp16")


# -- dogfood: the plugin's own fixtures, in fpsim's suite ------------------------------------------


def test_assert_rounded_every_format_random_inputs(fpsim_format: fpsim.Format, fpsim_rng: np.random.Generator,
                                                   fpsim_mpfr: object) -> None:
    """For every registered format: MPFR's results pass, and results of the wrong mode are caught."""
    f = fpsim_format
    if f.table is not None:
        pytest.skip("a table format (HiF8): the MPFR oracle's IEEE grid does not describe it; see test_hif8.py")
    x = np.ldexp(fpsim_rng.uniform(1, 2, 300), fpsim_rng.integers(f.emin - f.mbits - 2, f.emax + 2, 300))
    x = np.concatenate([x, -x[:100]]) if f.signed else x
    want = np.array([oracle_round(float(v), f, "rne") for v in x])
    ft.assert_rounded(want, x, f)
    up = np.array([oracle_round(float(v), f, "rup") for v in x])
    if not np.array_equal(up, want, equal_nan=True):
        with pytest.raises(AssertionError, match="rounded toward \\+inf"):
            ft.assert_rounded(up, x, f)
