"""fpsim.testing as the oracle for other libraries' casts: ml_dtypes, torch, NumPy.

These are the examples of docs/oracle.md. What another library does is a fact about its version
(tests/_versions.py), never a truth: the oracle (fpsim.round, itself checked against MPFR) says what is
right, and each test here states what the installed version does. ml_dtypes before 0.7 and torch 2.13
round float64 through float32 (double rounding) on the way to bfloat16/float8 (torch also float16);
ml_dtypes 0.7 rounds float64 once. From float32 they round correctly. torch's float8_e4m3fn cast
saturates out-of-range values (infinity included) to ±448; float8_e5m2 overflows to ±inf. NumPy's
float16 casts are correctly rounded from float64 and float32. The defect class itself (a float32 detour)
is shown on casts built to have it, so the suite proves ``assert_rounded`` catches it whatever the
installed versions do.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import fpsim
import fpsim.testing as ft

from _mpfr_oracle import oracle_round
from _versions import ML_DTYPES, ML_DTYPES_FLOAT64_DOUBLE_ROUNDS, TORCH_FLOAT64_DOUBLE_ROUNDS_SEEN_ON, torch_version

# A float64 just above the bf16 tie 1 + 2**-8: float32 drops the 2**-30 and leaves an exact tie,
# which then rounds to even (1.0) instead of up (1.0078125).
X_BF16 = 1 + 2**-8 + 2**-30
# The same trap for the 8-bit formats: ties at 1 + 2**-4 (e4m3) and 1 + 2**-3 (e5m2).
X_E4M3 = 1 + 2**-4 + 2**-30
X_E5M2 = 1 + 2**-3 + 2**-30

ML8 = {"fp8_e4m3": ml_dtypes.float8_e4m3fn, "fp8_e5m2": ml_dtypes.float8_e5m2,
       "fp8_e4m3fnuz": ml_dtypes.float8_e4m3fnuz, "fp8_e5m2fnuz": ml_dtypes.float8_e5m2fnuz}


def _all_values(name: str) -> np.ndarray:
    """Every finite value of a format of up to 16 bits (from the format's grid, both signs)."""
    return np.asarray(fpsim.as_format(name).values(), dtype=np.float64)


def _ties_and_neighbours(name: str, dtype: type) -> np.ndarray:
    """Every grid point and midpoint of ``name`` (beyond max too) and their neighbours in ``dtype``."""
    g = _all_values(name)
    f = fpsim.as_format(name)
    g = np.concatenate([g, [f.max + float(f.ulp(f.max)), -f.max - float(f.ulp(f.max))]])
    g = np.sort(g)
    with np.errstate(over="ignore"):
        pts = np.concatenate([g, (g[1:] + g[:-1]) / 2]).astype(dtype)
        return np.concatenate([pts, np.nextafter(pts, dtype(np.inf)), np.nextafter(pts, dtype(-np.inf))])


def _cast(x: np.ndarray, dt: type) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return x.astype(dt)


# -- ml_dtypes ------------------------------------------------------------------------------------


TRAPS = [(X_BF16, "bf16", ml_dtypes.bfloat16), (X_E4M3, "fp8_e4m3", ml_dtypes.float8_e4m3fn),
         (X_E5M2, "fp8_e5m2", ml_dtypes.float8_e5m2)]


def _detour(x: np.ndarray, dt: type) -> np.ndarray:
    """A cast with the defect built in: float64 -> float32 -> dt (two roundings)."""
    return _cast(_cast(x, np.float32), dt)


@pytest.mark.parametrize("x,name,dt", TRAPS)
def test_float32_detour_is_caught(x: float, name: str, dt: type) -> None:
    """The defect class, on a cast built to have it: assert_rounded names double rounding."""
    xs = np.array([1.0, x, 2.0])
    with pytest.raises(AssertionError) as e:
        ft.assert_rounded(_detour(xs, dt), xs, name)
    msg = str(e.value)
    assert "Mismatched elements: 1 / 3" in msg
    assert "Likely cause: double rounding through float32" in msg
    assert "ulp distance -1" in msg


@pytest.mark.parametrize("name", ["bf16", *ML8])
def test_float32_detour_on_all_ties(name: str) -> None:
    """Over every tie nudged by one float64 ulp, each error of a float32 detour is named double rounding."""
    dt = ml_dtypes.bfloat16 if name == "bf16" else ML8[name]
    x = _ties_and_neighbours(name, np.float64)
    x = x[np.abs(x) < 3e38]
    with pytest.raises(AssertionError) as e:
        ft.assert_rounded(_detour(x, dt), x, name)
    m = e.value.args[0]
    n_bad = int(m.split("Mismatched elements: ")[1].split(" /")[0])
    assert n_bad > 0
    assert f"Likely cause: double rounding through float32 (actual == round(round(x, float32), {name})) " \
           f"({n_bad} of {n_bad})" in m


@pytest.mark.parametrize("x,name,dt", TRAPS)
def test_ml_dtypes_float64_cast_by_version(x: float, name: str, dt: type) -> None:
    """What the installed ml_dtypes does with float64 input, checked against MPFR: before 0.7 it rounds
    twice (through float32), from 0.7 on once."""
    right = oracle_round(x, fpsim.as_format(name), "rne")
    got = float(_cast(np.array([x]), dt)[0])
    twice = float(_detour(np.array([x]), dt)[0])
    assert twice != right  # the input is a trap: one rounding and two differ
    if ML_DTYPES_FLOAT64_DOUBLE_ROUNDS:
        assert got == twice, f"ml_dtypes {ML_DTYPES}: expected the float32 detour's {twice}, got {got}"
    else:
        assert got == right, f"ml_dtypes {ML_DTYPES}: expected MPFR's {right}, got {got}"


@pytest.mark.parametrize("name", ["bf16", *ML8])
def test_ml_dtypes_float64_casts_on_all_ties_by_version(name: str) -> None:
    """Every tie nudged by one float64 ulp: ml_dtypes >= 0.7 is correctly rounded; older versions' errors
    are all double roundings through float32."""
    dt = ml_dtypes.bfloat16 if name == "bf16" else ML8[name]
    x = _ties_and_neighbours(name, np.float64)
    x = x[np.abs(x) < 3e38]
    if not ML_DTYPES_FLOAT64_DOUBLE_ROUNDS:
        ft.assert_rounded(_cast(x, dt), x, name)
        return
    with pytest.raises(AssertionError) as e:
        ft.assert_rounded(_cast(x, dt), x, name)
    m = e.value.args[0]
    n_bad = int(m.split("Mismatched elements: ")[1].split(" /")[0])
    assert f"Likely cause: double rounding through float32 (actual == round(round(x, float32), {name})) " \
           f"({n_bad} of {n_bad})" in m


@pytest.mark.parametrize("name", ["bf16", *ML8])
def test_ml_dtypes_float32_inputs_are_correctly_rounded(name: str) -> None:
    dt = ml_dtypes.bfloat16 if name == "bf16" else ML8[name]
    x = _ties_and_neighbours(name, np.float32)
    x = x[np.isfinite(x)]
    # ml_dtypes overflows to inf/NaN (IEEE), it does not saturate.
    ft.assert_rounded(_cast(x, dt), x, name)
    specials = np.array([np.inf, -np.inf, np.nan, 1e30, -1e30], dtype=np.float32)
    ft.assert_rounded(_cast(specials, dt), specials, name)


# -- torch ----------------------------------------------------------------------------------------


@pytest.mark.torch
def test_torch_float8_casts_from_float32() -> None:
    torch = pytest.importorskip("torch")
    for name, tdt, overflow in (("fp8_e4m3", torch.float8_e4m3fn, "saturate"),
                                ("fp8_e5m2", torch.float8_e5m2, "ieee"),
                                ("fp8_e4m3fnuz", torch.float8_e4m3fnuz, "ieee"),
                                ("fp8_e5m2fnuz", torch.float8_e5m2fnuz, "ieee")):
        x = _ties_and_neighbours(name, np.float32)
        x = np.concatenate([x[np.isfinite(x)], np.float32([np.inf, -np.inf, np.nan, 1e30, -1e30])])
        t = torch.from_numpy(x).to(tdt)
        ft.assert_rounded(t, x, name, overflow=overflow, err_msg=f"torch {tdt}")
    # e4m3fn saturates: infinity and everything beyond the overflow threshold become ±448, and the
    # IEEE rule (NaN, as the format has no infinity) would flag it with the saturation hint.
    big = np.float32([464.0, 1e6, np.inf, -np.inf])
    got = torch.from_numpy(big).to(torch.float8_e4m3fn)
    ft.assert_same_bits(got, [448.0, 448.0, 448.0, -448.0], "fp8_e4m3")
    with pytest.raises(AssertionError, match="Likely cause: saturation to ±max instead of overflow"):
        ft.assert_rounded(got, big, "fp8_e4m3")


@pytest.mark.torch
def test_torch_float64_casts_by_version() -> None:
    """torch 2.13 rounds float64 tensors through float32; for a version not yet seen, the cast must be one
    of the two known behaviours (correct, or the float32 detour), and which one is reported."""
    torch = pytest.importorskip("torch")
    seen = torch_version()[:2] in TORCH_FLOAT64_DOUBLE_ROUNDS_SEEN_ON
    for x, name, tdt in ((X_BF16, "bf16", torch.bfloat16), (X_E4M3, "fp8_e4m3", torch.float8_e4m3fn),
                         (1 + 2**-11 + 2**-40, "fp16", torch.float16)):
        xs = np.array([x])
        got = float(torch.from_numpy(xs).to(tdt).double()[0])
        right = oracle_round(x, fpsim.as_format(name), "rne")
        twice = float(torch.from_numpy(np.float32(xs)).to(tdt).double()[0])
        if seen:
            assert got == twice != right
            with pytest.raises(AssertionError, match="Likely cause: double rounding through float32"):
                ft.assert_rounded(torch.from_numpy(xs).to(tdt), xs, name, overflow="saturate")
        else:
            assert got in (right, twice), f"torch {torch.__version__}: {got} is neither {right} nor {twice}"
        # ...and from float32 the same values round correctly.
        x32 = np.float32(xs)
        ft.assert_rounded(torch.from_numpy(x32).to(tdt), x32, name, overflow="saturate")


@pytest.mark.torch
def test_torch_bfloat16_and_float16_from_float32() -> None:
    torch = pytest.importorskip("torch")
    for name, tdt in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        x = _ties_and_neighbours(name, np.float32)
        x = x[np.isfinite(x)]
        ft.assert_rounded(torch.from_numpy(x).to(tdt), x, name)


# -- NumPy float16 --------------------------------------------------------------------------------


@pytest.mark.parametrize("carrier", [np.float64, np.float32])
def test_numpy_float16_casts_are_correctly_rounded(carrier: type) -> None:
    x = _ties_and_neighbours("fp16", carrier)
    x = x[np.isfinite(x)]
    ft.assert_rounded(_cast(x, np.float16), x, "fp16")
    tiny = np.array([2.0**-25, 2.0**-25 * (1 + 2**-20), 3 * 2.0**-26, -(2.0**-26)], dtype=carrier)
    ft.assert_rounded(tiny.astype(np.float16), tiny, "fp16")


def test_hypothesis_recipe_finds_double_rounding() -> None:
    """The copy-paste recipe of docs/oracle.md, pointed at a float64 -> bfloat16 cast through float32."""
    hypothesis = pytest.importorskip("hypothesis")
    from hypothesis import given, settings

    import fpsim.testing.strategies as fst

    @settings(max_examples=300, deadline=None, database=None, derandomize=True)
    @given(fst.hard_cases("bf16"))
    def test_cast(x: float) -> None:
        ft.assert_rounded(_detour(np.array([x]), ml_dtypes.bfloat16), np.array([x]), "bf16")

    with pytest.raises(AssertionError, match="double rounding through float32"):
        test_cast()
    del hypothesis


@pytest.mark.torch
def test_docs_oracle_examples_run() -> None:
    """Every Python block of docs/oracle.md runs (in order, one namespace); the recipe's tests pass."""
    pytest.importorskip("torch")
    pytest.importorskip("hypothesis")
    import inspect
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "oracle.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    assert len(blocks) >= 6
    ns: dict[str, object] = {"__name__": "oracle_md"}
    for block in blocks:
        before = set(ns)
        exec(compile(block, "docs/oracle.md", "exec"), ns)  # noqa: S102  # our own docs
        if "test_my_cast.py" in block:  # the copy-paste recipe: run its tests
            ran = 0
            for name in sorted(set(ns) - before):
                fn = ns[name]
                if name.startswith("test_") and callable(fn) and not inspect.signature(fn).parameters:
                    fn()
                    ran += 1
            assert ran == 3
