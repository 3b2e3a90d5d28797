"""The compiled hot paths of fpsim/_carith.c against the NumPy references beside them, bit for bit, and
against independent oracles (MPFR via gmpy2 for fma; NumPy/ml_dtypes arithmetic for the pairwise tree;
ml_dtypes casts for to_bits). Issue 17, section 2.

Each compiled path has a module flag that forces its reference: ``fpsim.arith.use_c_arith`` (fma),
``fpsim.accumulate.use_c_sum`` (pairwise sums), ``fpsim.bits.use_c_bits`` (to_bits) and
``fpsim.rounding.use_c_analyze`` (analyze).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any, Callable

import numpy as np
import pytest

import fpsim
from fpsim import accumulate, arith, bits, rounding
from fpsim.formats import as_format

pytestmark = pytest.mark.skipif(arith._carith is None, reason="fpsim._carith is not built (no C compiler)")

MODES = ["rne", "rna", "rtz", "rup", "rdn", "rto", "sr"]
ALL_FORMATS = ["fp32", "tf32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "fp8_e4m3fnuz", "fp8_e5m2fnuz",
               "fp6_e2m3", "fp6_e3m2", "fp4_e2m1", "e8m0"]

SPECIAL64 = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 5e-324, -5e-324, 2.0**-1022, 1e-310,
                      np.finfo(np.float64).max, -np.finfo(np.float64).max, 2.0**1000, 2.0**-1000, 1e-45, 1e-40,
                      -1e-38, 3.4e38, 3.5e38, -3.5e38, 65504.0, 65520.0, 6e-8, 448.0, 1.0, -1.0, 1 + 2.0**-24,
                      1 - 2.0**-25, 2.0**-149, 2.0**-150, 2.0**127, 2.0**128])
SPECIAL32 = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 2.0**-126, 1e-40,
                      np.finfo(np.float32).max, -np.finfo(np.float32).max, 2.0**100, 2.0**-100, 65504.0,
                      65520.0, 6e-8, 448.0, 1.0, -1.0, 1 + 2.0**-23, 2.0**-149, 3e38], dtype=np.float32)


def _bits(a: Any) -> bytes:
    a = np.asarray(a)
    return a.dtype.str.encode() + repr(a.shape).encode() + a.tobytes()


def _both(monkeypatch: pytest.MonkeyPatch, module: Any, flag: str, fn: Callable[[], Any]) -> tuple[Any, Any]:
    """fn() with the compiled path, then with the NumPy reference (exceptions are returned as values)."""
    out = []
    for on in (True, False):
        monkeypatch.setattr(module, flag, on)
        try:
            out.append(fn())
        except (ValueError, TypeError) as e:
            out.append(f"{type(e).__name__}: {e}")
    return out[0], out[1]


def _mixed(n: int, specials: np.ndarray, dtype: Any, rng: np.random.Generator) -> np.ndarray:
    """Random values over many binades with specials sprinkled in (every special at least once)."""
    with np.errstate(all="ignore"):
        x = rng.standard_normal(n) * np.exp2(rng.integers(-30, 30, n).astype(float))
        k = max(len(specials), n // 8)
        x[rng.integers(0, n, k)] = rng.choice(specials, k)
        x[: len(specials)] = specials
        return x.astype(dtype)


# ------------------------------------------------------------------------------------------------ fma

def _fma_cases(dtype: Any, rng: np.random.Generator, n: int = 4000) -> list[np.ndarray]:
    sp = SPECIAL32 if dtype == np.float32 else SPECIAL64
    a, b, c = (_mixed(n, sp, dtype, rng) for _ in range(3))
    # all pairs of specials as products, with special and random addends
    i, j = np.meshgrid(np.arange(len(sp)), np.arange(len(sp)))
    a = np.concatenate([a, sp[i.ravel()]])
    b = np.concatenate([b, sp[j.ravel()]])
    c = np.concatenate([c, rng.choice(sp, i.size).astype(dtype)])
    # cancellation: c = -(a*b) rounded to the operand precision, and its neighbours
    with np.errstate(all="ignore"):
        p = (a[:n] * b[:n]).astype(dtype)
        a = np.concatenate([a, a[:n], a[:n], a[:n]])
        b = np.concatenate([b, b[:n], b[:n], b[:n]])
        c = np.concatenate([c, -p, -np.nextafter(p, np.inf).astype(dtype), -np.nextafter(p, -np.inf).astype(dtype)])
    return [a, b, c]


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("fmt", ["fp32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "fp4_e2m1", "tf32"])
def test_fma_c_matches_numpy_reference(fmt: str, dtype: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b, c = _fma_cases(dtype, np.random.default_rng(10))
    for mode in MODES:
        for kw in ({}, {"overflow": "saturate"}, {"subnormals": False}):
            got, want = _both(monkeypatch, arith, "use_c_arith", lambda: fpsim.fma(
                a, b, c, fmt, rounding=mode, rng=np.random.default_rng(1), **kw))
            if _bits(got) != _bits(want):
                bad = np.flatnonzero(np.asarray(got).view(np.uint8).reshape(len(a), -1).any(1) !=
                                     np.asarray(want).view(np.uint8).reshape(len(a), -1).any(1))
                diff = np.flatnonzero(np.asarray(got).astype(float).view(np.uint64) !=
                                      np.asarray(want).astype(float).view(np.uint64))[:3]
                raise AssertionError(f"{fmt} {mode} {kw}: {len(diff)}+ mismatches, e.g. "
                                     f"{[(a[k], b[k], c[k], got[k], want[k]) for k in diff]} {bad[:0]}")


@pytest.mark.parametrize("fmt", ["fp32", "bf16", "fp16"])
def test_fma_context_c_matches_numpy_reference_exact_inputs(fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Context.fma with operands known to be format values (the dot-product loops use it)
    rng = np.random.default_rng(11)
    a, b, c = (np.asarray(fpsim.round(rng.standard_normal((64, 33)), fmt)) for _ in range(3))
    ctx = arith.Context(fmt, "rdn")
    got, want = _both(monkeypatch, arith, "use_c_arith", lambda: ctx.fma(a, b, c, exact_inputs=True))
    assert _bits(got) == _bits(want)
    assert got.shape == (64, 33)


def _mpfr_fma(a: float, b: float, c: float, fmt: Any, mode: str) -> float:
    """a*b + c rounded once into fmt (IEEE options) by MPFR, from the exact rational value."""
    gmpy2 = pytest.importorskip("gmpy2")
    modes = {"rne": gmpy2.RoundToNearest, "rtz": gmpy2.RoundToZero, "rup": gmpy2.RoundUp,
             "rdn": gmpy2.RoundDown}
    x = Fraction(a) * Fraction(b) + Fraction(c)
    if x == 0:  # IEEE 754 §6.3: +0 (-0 under rdn) unless the product and c are zeros of one sign
        prod_neg = (np.signbit(a) != np.signbit(b))
        both_neg = (a == 0 or b == 0) and prod_neg and c == 0 and np.signbit(c)
        both_pos = (a == 0 or b == 0) and not prod_neg and c == 0 and not np.signbit(c)
        if both_neg:
            return -0.0
        if both_pos:
            return 0.0
        return -0.0 if mode == "rdn" else 0.0
    ctx = gmpy2.context(precision=fmt.p, emin=fmt.emin - fmt.mbits + 1, emax=fmt.emax + 1, subnormalize=True,
                        round=modes[mode])
    with ctx:
        return float(gmpy2.mpfr(gmpy2.mpq(x.numerator, x.denominator)))


def _hard_fma_cases(rng: np.random.Generator, n: int) -> list[np.ndarray]:
    # ties: (1 + k 2^-12)(1 + j 2^-12) = 1 + (k + j) 2^-12 + kj 2^-24: kj odd is half an fp32 ulp above
    # a float32; c a small multiple of 2^-23 keeps the tie; scaled over binades (subnormals included)
    k = rng.integers(1, 2**11, n) | 1
    j = rng.integers(1, 2**11, n) | 1
    s = np.exp2(rng.integers(-75, 60, n).astype(float))
    a = ((1 + k * 2.0**-12) * s).astype(np.float32)
    b = (1 + j * 2.0**-12).astype(np.float32)
    c = (rng.integers(-8, 8, n) * 2.0**-23 * s).astype(np.float32)
    # cancellation: c = -RN32(a*b) leaves the product's rounding error only
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    z = -(x * y)
    return [np.concatenate([a, x]), np.concatenate([b, y]), np.concatenate([c, z])]


@pytest.mark.parametrize("fmt_name", ["fp32", "bf16", "fp16"])
def test_fma_c_against_mpfr(fmt_name: str) -> None:
    fmt = as_format(fmt_name)
    rng = np.random.default_rng(12)
    a, b, c = _hard_fma_cases(rng, 300)
    # random float32 operands, and arbitrary float64 operands over a wide range (not format values)
    r = [rng.standard_normal(300).astype(np.float32) for _ in range(3)]
    w = [rng.standard_normal(300) * np.exp2(rng.integers(-200, 200, 300).astype(float)) for _ in range(3)]
    cols = [(np.concatenate([a, r[0]]), np.concatenate([b, r[1]]), np.concatenate([c, r[2]])), tuple(w)]
    mismatches = cases = 0
    assert arith.use_c_arith
    for x, y, z in cols:
        for mode in ("rne", "rtz", "rup", "rdn"):
            got = np.asarray(fpsim.fma(x, y, z, fmt, rounding=mode), dtype=np.float64)
            for i in range(len(x)):
                want = _mpfr_fma(float(x[i]), float(y[i]), float(z[i]), fmt, mode)
                cases += 1
                if np.float64(want).view(np.uint64) != got[i].view(np.uint64):
                    mismatches += 1
                    assert mismatches > 3, (f"{fmt_name} {mode}: fma({x[i]!r}, {y[i]!r}, {z[i]!r}) = {got[i]!r}, "
                                            f"MPFR {want!r}")
    assert (mismatches, cases) == (0, (900 + 300) * 4)


# ----------------------------------------------------------------------------------------- pairwise

PAIRWISE_FORMATS = ["fp32", "fp16", "bf16", "fp8_e5m2", "tf32"]


@pytest.mark.parametrize("fmt", PAIRWISE_FORMATS)
def test_pairwise_c_matches_reference(fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(20)
    sizes = list(range(1, 40)) + [255, 256, 257, 4097, 16385, 70001]
    for n in sizes:
        for dtype in (np.float32, np.float64, np.float16):
            sp = SPECIAL32 if dtype != np.float64 else SPECIAL64
            x = _mixed(n, sp[: max(1, n // 3)], dtype, rng)
            got, want = _both(monkeypatch, accumulate, "use_c_sum", lambda: fpsim.sum(x, fmt, order="pairwise"))
            assert _bits(got) == _bits(want), f"{fmt} n={n} {np.dtype(dtype).name}: {got!r} != {want!r}"


@pytest.mark.parametrize("fmt", ["fp32", "bf16"])
def test_pairwise_c_axes_and_keepdims(fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(21)
    x = rng.standard_normal((37, 5, 2050)).astype(np.float32)
    for axis in (None, 0, 1, 2, (0, 2), (1,), -1):
        for keepdims in (False, True):
            got, want = _both(monkeypatch, accumulate, "use_c_sum", lambda: fpsim.sum(
                x, fmt, order="pairwise", axis=axis, keepdims=keepdims))
            assert _bits(got) == _bits(want), (axis, keepdims)


def _tree_oracle(x: np.ndarray, dtype: Any) -> float:
    """The documented pairwise tree in the format's own NumPy/ml_dtypes arithmetic (each add rounded once by
    that library): level by level, adjacent pairs added, an odd last element carried."""
    t = x.astype(dtype)
    while t.size > 1:
        m = t.size // 2
        s = (t[0 : 2 * m : 2] + t[1 : 2 * m : 2]).astype(dtype)
        t = np.concatenate([s, t[2 * m :]]) if t.size % 2 else s
    return float(t[0])


@pytest.mark.parametrize("fmt", ["fp32", "fp16", "bf16"])
def test_pairwise_c_against_library_arithmetic(fmt: str) -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    dtype = {"fp32": np.float32, "fp16": np.float16, "bf16": ml_dtypes.bfloat16}[fmt]
    rng = np.random.default_rng(22)
    mismatches = 0
    cases = 0
    for n in list(range(1, 33)) + [100, 1000, 5000, 65537]:
        for scale in (1.0, 1e-3, 30.0):
            x = (rng.standard_normal(n) * scale).astype(dtype).astype(np.float32)  # values of the format
            got = float(fpsim.sum(x, fmt, order="pairwise"))
            want = _tree_oracle(x, dtype)
            cases += 1
            mismatches += np.float64(got).view(np.uint64) != np.float64(want).view(np.uint64)
    assert (mismatches, cases) == (0, 36 * 3)


# ------------------------------------------------------------------------------------ to_bits, analyze

def _all_codes_values(fmt: str) -> np.ndarray:
    f = as_format(fmt)
    codes = np.arange(2 ** f.width, dtype=np.uint64)
    return np.asarray(fpsim.from_bits(codes, f))


@pytest.mark.parametrize("fmt", ALL_FORMATS)
def test_to_bits_c_matches_reference(fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(30)
    f = as_format(fmt)
    inputs = [_mixed(5000, SPECIAL64, np.float64, rng), _mixed(5000, SPECIAL32, np.float32, rng)]
    if f.width <= 16:
        v = _all_codes_values(fmt)
        inputs += [v, v[~np.isnan(v)]]
        if f.fits_float32:
            inputs.append(v.astype(np.float32))
    for x in inputs:
        for mode in ("rne", "rtz", "rup", "sr"):
            got, want = _both(monkeypatch, bits, "use_c_bits", lambda: fpsim.to_bits(
                x, fmt, mode, rng=np.random.default_rng(3)))
            assert (got if isinstance(got, str) else _bits(got)) == (want if isinstance(want, str) else _bits(want)), \
                f"{fmt} {mode} {x.dtype}"


@pytest.mark.parametrize("fmt", ["fp16", "bf16"])
def test_to_bits_round_trip_every_code(fmt: str) -> None:
    f = as_format(fmt)
    codes = np.arange(2**16, dtype=np.uint16)
    v = np.asarray(fpsim.from_bits(codes, f))
    got = np.asarray(fpsim.to_bits(v, f))
    nan = np.isnan(v)
    assert np.array_equal(got[~nan], codes[~nan])
    assert np.all(got[nan] == f.nan_code)


@pytest.mark.parametrize("fmt,ml", [("bf16", "bfloat16"), ("fp16", "float16"), ("fp8_e4m3", "float8_e4m3fn"),
                                    ("fp8_e5m2", "float8_e5m2")])
def test_to_bits_against_ml_dtypes_casts(fmt: str, ml: str) -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    dt = np.float16 if ml == "float16" else getattr(ml_dtypes, ml)
    rng = np.random.default_rng(31)
    x = (rng.standard_normal(100_000) * np.exp2(rng.integers(-20, 10, 100_000).astype(float))).astype(np.float32)
    if fmt in ("fp8_e4m3", "fp16"):
        x = x[np.abs(x) < as_format(fmt).max]  # no overflow: ml_dtypes' e4m3 cast saturates to NaN differently
    want = x.astype(dt).view(np.uint8 if np.dtype(dt).itemsize == 1 else np.uint16)
    got = np.asarray(fpsim.to_bits(x, fmt))
    assert got.dtype == want.dtype
    assert np.array_equal(got, want), f"{np.count_nonzero(got != want)} of {x.size} differ"


@pytest.mark.parametrize("fmt", ALL_FORMATS)
def test_analyze_c_matches_reference(fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(40)
    for x in (_mixed(3 * 2**16 + 7, SPECIAL64, np.float64, rng), _mixed(5000, SPECIAL32, np.float32, rng),
              rng.standard_normal(1000).astype(np.float16)):
        for mode in ("rne", "rtz", "rdn", "sr"):
            got, want = _both(monkeypatch, rounding, "use_c_analyze", lambda: fpsim.analyze(
                x, fmt, mode, rng=np.random.default_rng(4)))
            assert got == want, f"{fmt} {mode} {x.dtype}"


@pytest.mark.parametrize("fmt", ["bf16", "fp8_e4m3", "fp16"])
def test_to_bits_and_analyze_do_not_depend_on_the_thread_count(fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(50)
    x = _mixed(2**19 + 5, SPECIAL32, np.float32, rng)
    results = []
    for threads in (1, 2, 3):
        monkeypatch.setattr(rounding, "max_threads", threads)
        results.append((_bits(fpsim.to_bits(x, fmt)), fpsim.analyze(x, fmt, "rup")))
    assert results[0] == results[1] == results[2]


def test_compiled_encoders_direct() -> None:
    # the low-level entry points refuse mismatched buffers with ValueError naming the rule
    with pytest.raises(ValueError, match="encode_table"):
        arith._carith.encode_table(np.zeros(3, np.float32), np.zeros(2, np.uint8), np.zeros(16, np.uint32), 20)
    with pytest.raises(ValueError, match="analyze_block"):
        arith._carith.analyze_block(np.zeros(3, np.float32), np.zeros(3), 1, 1.0, 2.0)
    with pytest.raises(ValueError, match="fma_ro"):
        arith._carith.fma_ro(np.zeros(3), np.zeros(2), np.zeros(3), np.zeros(3), 0, 0)
    with pytest.raises(ValueError, match="pairwise_rne"):
        arith._carith.pairwise_rne(np.zeros(3), np.zeros(1), 4, 1, 0, 0, 24, -126, 127)


# ------------------------------------------------------------------------------------------------ GELU

def _same_f32_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit for bit, any NaN matching any NaN (a NaN's payload follows the operand order the compiler picked)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    na, nb = np.isnan(a), np.isnan(b)
    return bool(np.array_equal(na, nb) and np.array_equal(a.view(np.uint32)[~na], b.view(np.uint32)[~nb]))


def test_gelu_c_matches_numpy_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """GELU's compiled float32 passes (forward around NumPy's tanh, and the backward) against the NumPy code of
    fpsim.nn.layers: random bit patterns (every exponent, subnormals, NaN, inf), values over many binades with
    specials, overflow of x**3, and shapes; the inputs are left as they were."""
    from fpsim.nn import layers

    rng = np.random.default_rng(1705)
    pats = rng.integers(0, 2**32, 1 << 16, dtype=np.uint64).astype(np.uint32).view(np.float32)
    mixed = _mixed(1 << 15, SPECIAL32, np.float32, rng)
    edge = np.array([2.0**42, -(2.0**42), 2.0**43, 1e13, -1e13, 3e12, 5.5, -5.5, 9.0, -9.0, 1e-20, -1e-30],
                    dtype=np.float32)
    for x in (pats, mixed, edge, mixed[:1000].reshape(10, 20, 5), np.zeros((0, 4), np.float32)):
        x0 = x.copy()
        dout = np.resize(_mixed(4096, SPECIAL32, np.float32, rng), x.shape).astype(np.float32)
        d0 = dout.copy()
        with np.errstate(all="ignore"):
            (o_c, cache_c), (o_n, cache_n) = _both(monkeypatch, layers, "use_c_gelu", lambda: layers.gelu_forward(x))
            assert _same_f32_bits(o_c, o_n) and _same_f32_bits(cache_c[1], cache_n[1])
            g_c, g_n = _both(monkeypatch, layers, "use_c_gelu", lambda: layers.gelu_backward(dout, cache_n))
            assert _same_f32_bits(g_c, g_n)
        assert np.array_equal(x.view(np.uint32), x0.view(np.uint32))
        assert np.array_equal(dout.view(np.uint32), d0.view(np.uint32))


def test_gelu_c_takes_only_contiguous_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    """Strided, float64 and mixed-dtype calls run the NumPy code (the same results either way)."""
    from fpsim.nn import layers

    rng = np.random.default_rng(1706)
    x = rng.standard_normal((64, 48)).astype(np.float32)
    calls: list[str] = []
    real = layers._carith
    assert real is not None

    class Spy:
        def __getattr__(self, name: str) -> Any:
            calls.append(name)
            return getattr(real, name)

    monkeypatch.setattr(layers, "_carith", Spy())
    for arg in (x[:, ::2], x.astype(np.float64), x.T, x.astype(">f4")):  # strided, float64, F-order, big-endian
        out, cache = layers.gelu_forward(arg)
        layers.gelu_backward(np.ones_like(out), cache)
    assert calls == []
    out, cache = layers.gelu_forward(x)
    layers.gelu_backward(np.ones_like(out), cache)
    assert calls == ["gelu_u", "gelu_out", "gelu_grad"]
    # a float64 gradient with float32 activations: the NumPy code
    calls.clear()
    layers.gelu_backward(np.ones(out.shape), cache)
    assert calls == []
    # big-endian and strided inputs give the compiled path's bits through the NumPy code
    monkeypatch.setattr(layers, "_carith", real)
    want = layers.gelu_forward(x)[0]
    for arg in (x.astype(">f4"), np.asfortranarray(x)):
        got = layers.gelu_forward(arg)[0]
        assert _same_f32_bits(np.asarray(got, np.float32), want)


def test_gelu_c_entry_refuses_mismatched_buffers() -> None:
    """The private passes refuse buffers of different lengths (ValueError) and a read-only output (TypeError),
    writing nothing."""
    from fpsim.nn import layers

    c = layers._carith
    assert c is not None
    x = np.ones(8, np.float32)
    out = np.full(8, 7.0, np.float32)
    with pytest.raises(ValueError, match="gelu_u"):
        c.gelu_u(x, np.empty(7, np.float32), 0.5, 0.5)
    with pytest.raises(ValueError, match="gelu_grad"):
        c.gelu_grad(x, x, np.ones(9, np.float32), out, 0.5, 0.5)
    ro = np.zeros(8, np.float32)
    ro.flags.writeable = False
    with pytest.raises(TypeError):
        c.gelu_out(x, x, ro)
    assert np.all(out == 7.0) and np.all(ro == 0.0)


def test_fp32_training_steps_same_bits_with_compiled_gelu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three fp32 demo steps give bit-identical parameters with the compiled GELU passes and without."""
    from dataclasses import replace

    from fpsim.amp import get_policy
    from fpsim.nn import layers
    from fpsim.train import Trainer
    from fpsim.train.demo import demo_settings

    cfg = replace(demo_settings().train_config(), steps=3, telemetry_every=0, histogram_every=0, eval_every=0)
    params = []
    for on in (True, False):
        monkeypatch.setattr(layers, "use_c_gelu", on)
        tr = Trainer(get_policy("fp32"), cfg)
        for _ in range(3):
            tr.step()
        params.append({k: np.asarray(v).copy() for k, v in tr.store.weights.items()})
    assert params[0].keys() == params[1].keys()
    for k in params[0]:
        assert np.array_equal(params[0][k].view(np.uint32), params[1][k].view(np.uint32)), k
