"""The one-pass analyze and to_bits (issue 30): the rounding kernel of fpsim/_ckernel.c hands each rounded block to
a counting or encoding sink of fpsim/_carith.c (fpsim/_csink.h) instead of storing it.

Checked against the NumPy references (``fpsim.rounding.use_c_analyze = False``, ``fpsim.bits.use_c_bits =
False``) and against the block-by-block compiled path of before (``fpsim.rounding.use_sink = False``), report for
report and code for code, on adversarial inputs (NaN, infinities, subnormals, overflow, ties, values beyond
max), in every mode, SR with seeded generators (same results, same generator state after the call), on 1, 2 and
3 threads, odd sizes, strided, float64 and float16 inputs; and against ml_dtypes' casts (an independent
rounding) for the counts and codes of RNE.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

import fpsim
from fpsim import bits, rounding
from fpsim.formats import as_format

pytestmark = pytest.mark.skipif(
    bits._carith is None or rounding._ckernel is None or not hasattr(bits._carith, "analyze_sink"),
    reason="the compiled kernel and fpsim._carith are not built (no C compiler)")

FORMATS = ["bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "fp32", "tf32", "fp8_e4m3fnuz", "fp8_e5m2fnuz", "fp6_e2m3",
           "fp4_e2m1", "e8m0", "hif8"]
MODES = ["rne", "rna", "rtz", "rup", "rdn", "rto", "sr"]

SPECIAL = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 2.0**-126, 1e-40, 3.4e38, -3.4e38,
                    2.0**100, 2.0**-100, 65504.0, 65520.0, -65520.0, 6e-8, 448.0, 464.0, -480.0, 57344.0, 61440.0,
                    1.0, -1.0, 1 + 2.0**-23, 2.0**-149, 2.0**-24, 2.0**-25, 2.0**-16, 2.0**-17, 2.0**-10, 6.0, 7.5])


def _ties(fmt: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """float64 midpoints of neighbouring values of fmt (ties for the nearest modes), both signs."""
    f = as_format(fmt)
    if f.width <= 16:
        v = np.asarray(fpsim.from_bits(np.arange(2**f.width, dtype=np.uint64), f))
    else:  # fp32: random float32 values, their successors
        v = rng.standard_normal(n).astype(np.float32).astype(np.float64)
        v = np.concatenate([v, np.nextafter(v.astype(np.float32), np.float32(np.inf)).astype(np.float64)])
    v = np.unique(v[np.isfinite(v)])
    mid = (v[:-1] + v[1:]) / 2
    return rng.choice(mid, n) if mid.size else mid


def _inputs(fmt: str, n: int, dtype: Any, rng: np.random.Generator) -> np.ndarray:
    """Random values over many binades, with specials and ties of fmt sprinkled in (every special once)."""
    with np.errstate(all="ignore"):
        x = rng.standard_normal(n) * np.exp2(rng.integers(-40, 40, n).astype(float))
        k = n // 8
        x[rng.integers(0, n, k)] = rng.choice(SPECIAL, k)
        t = _ties(fmt, k, rng)
        if t.size:
            x[rng.integers(0, n, t.size)] = t
        x[: len(SPECIAL)] = SPECIAL
        return x.astype(dtype)


def _run(fn: Callable[[], Any]) -> Any:
    """fn()'s result, or its exception as a value."""
    try:
        r = fn()
    except (ValueError, TypeError) as e:
        return f"{type(e).__name__}: {e}"
    if isinstance(r, fpsim.RoundingReport):
        return r
    a = np.asarray(r)
    return a.dtype.str, a.shape, a.tobytes()


def _three(monkeypatch: pytest.MonkeyPatch, what: str, x: np.ndarray, fmt: str, mode: str, seed: int = 7,
           **kw: Any) -> list[tuple[Any, Any]]:
    """(result, generator state after) of the one-pass path, the block-by-block compiled path and the NumPy
    reference, each with a fresh generator of the same seed."""
    out = []
    for sink, ref in ((True, False), (False, False), (True, True)):
        monkeypatch.setattr(rounding, "use_sink", sink)
        monkeypatch.setattr(rounding, "use_c_analyze", not ref)
        monkeypatch.setattr(bits, "use_c_bits", not ref)
        g = np.random.default_rng(seed)
        fn = fpsim.analyze if what == "analyze" else fpsim.to_bits
        r = _run(lambda: fn(x, fmt, mode, rng=g, **kw))
        # after an error the generator is wherever the path stopped (the compiled and NumPy encoders take
        # blocks of different sizes): compared only after a result
        out.append((r, None if isinstance(r, str) else g.bit_generator.state))
    return out


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("what", ["analyze", "to_bits"])
def test_one_pass_equals_the_references(fmt: str, what: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(300)
    cases = 0
    for dtype in (np.float32, np.float64):
        x = _inputs(fmt, 3 * 2**16 + 7, dtype, rng)  # several blocks, an odd tail
        for mode in MODES:
            new, old, ref = _three(monkeypatch, what, x, fmt, mode)
            assert new == ref, f"{what} {fmt} {mode} {x.dtype}: one pass {new[0]} != reference {ref[0]}"
            assert new == old, f"{what} {fmt} {mode} {x.dtype}"
            cases += 1
    assert cases == 2 * len(MODES)


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "fp8_e4m3", "fp8_e5m2"])
def test_one_pass_sr_bits_and_overflow_policies(fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(301)
    x = _inputs(fmt, 2**17 + 3, np.float32, rng)
    for what in ("analyze", "to_bits"):
        for kw in ({"sr_bits": 5}, {"sr_bits": 40}, {"overflow": "saturate"}, {"subnormals": False}):
            mode = "sr" if "sr_bits" in kw else "rne"
            new, old, ref = _three(monkeypatch, what, x, fmt, mode, **kw)
            assert new == ref == old, f"{what} {fmt} {kw}"


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "fp8_e4m3", "fp8_e5m2"])
def test_one_pass_overflow_counts_many_blocks_sr(fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # values just beyond max in several blocks: the overflow pass steps a copy of the generator block by block
    f = as_format(fmt)
    rng = np.random.default_rng(302)
    n = 5 * 2**16 + 1
    x = rng.standard_normal(n)
    idx = rng.integers(0, n, 300)
    x[idx] = f.max * (1 + rng.random(300) * 2.0 ** -(f.mbits + 1)) * rng.choice([-1.0, 1.0], 300)
    for dtype in (np.float32, np.float64):
        for mode in ("sr", "rne", "rtz"):
            new, old, ref = _three(monkeypatch, "analyze", x.astype(dtype), fmt, mode)
            assert new == ref == old, f"{fmt} {mode} {dtype}"
            assert new[0].overflow > 0 or mode == "rtz"


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "fp8_e4m3", "fp8_e5m2"])
def test_one_pass_does_not_depend_on_the_thread_count(fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(303)
    x = _inputs(fmt, 2**20 + 2**14 + 5, np.float32, rng)  # above the size from which the kernel splits
    results = []
    for threads in (1, 2, 3):
        monkeypatch.setattr(rounding, "max_threads", threads)
        for mode in ("rne", "sr"):
            g = np.random.default_rng(9)
            a = fpsim.analyze(x, fmt, mode, rng=g)
            g2 = np.random.default_rng(9)
            c = np.asarray(fpsim.to_bits(x, fmt, mode, rng=g2)).tobytes()
            results.append((threads, mode, a, c, g.bit_generator.state, g2.bit_generator.state))
    by_mode: dict[str, list[Any]] = {}
    for r in results:
        by_mode.setdefault(r[1], []).append(r[2:])
    for mode, rs in by_mode.items():
        assert rs[0] == rs[1] == rs[2], f"{fmt} {mode}"
    # and the reference agrees
    monkeypatch.setattr(rounding, "use_c_analyze", False)
    assert fpsim.analyze(x, fmt) == by_mode["rne"][0][0]


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "fp8_e4m3", "fp8_e5m2"])
def test_one_pass_other_layouts_and_dtypes(fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(304)
    base = _inputs(fmt, 2 * 2**18 + 11, np.float64, rng)
    with np.errstate(all="ignore"):
        cases = [base[::2], base.astype(np.float32)[1::3], base.astype(np.float16),
                 base[: 2**18].reshape(512, 512).T, base.astype(np.float32)[:1], base[:0]]
    for x in cases:
        for what in ("analyze", "to_bits"):
            for mode in ("rne", "sr"):
                new, old, ref = _three(monkeypatch, what, x, fmt, mode)
                assert new == ref == old, f"{what} {fmt} {mode} {x.dtype} {x.shape}"


def test_one_pass_inputs_are_not_modified() -> None:
    x = np.random.default_rng(305).standard_normal(2**20 + 1).astype(np.float32)
    keep = x.copy()
    fpsim.analyze(x, "fp8_e4m3")
    fpsim.to_bits(x, "bf16")
    assert np.array_equal(x, keep)


def test_one_pass_error_leaves_the_generator_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    # NaN into a format without NaN: the one-pass encoder gives up, the generator is wound back, and the
    # block-by-block path raises as before, with the generator where that path leaves it
    x = np.random.default_rng(306).standard_normal(3 * 2**16).astype(np.float32)
    x[2**17 + 5] = np.nan
    states = []
    for sink in (True, False):
        monkeypatch.setattr(rounding, "use_sink", sink)
        g = np.random.default_rng(5)
        with pytest.raises(ValueError, match="fp4_e2m1 has no NaN encoding"):
            fpsim.to_bits(x, "fp4_e2m1", "sr", rng=g)
        states.append(g.bit_generator.state)
    assert states[0] == states[1]


@pytest.mark.parametrize("fmt,ml", [("bf16", "bfloat16"), ("fp16", "float16"), ("fp8_e4m3", "float8_e4m3fn"),
                                    ("fp8_e5m2", "float8_e5m2")])
def test_one_pass_against_ml_dtypes(fmt: str, ml: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """RNE counts and codes against ml_dtypes' casts (an independent rounding; NumPy's float16 for fp16), on
    2 threads, over values that do not overflow (ml_dtypes' e4m3 saturates to NaN differently)."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    monkeypatch.setattr(rounding, "max_threads", 2)
    f = as_format(fmt)
    dt = np.dtype(np.float16 if ml == "float16" else getattr(ml_dtypes, ml))
    rng = np.random.default_rng(307)
    n = 2**20 + 2**12 + 1
    lo = max(f.emin - f.mbits - 4, -140)  # down to the format's subnormals and below (float32's too for bf16)
    x = (rng.standard_normal(n) * np.exp2(rng.integers(lo, 12, n).astype(float))).astype(np.float32)
    x = x[np.abs(x) < f.max]
    x[:4] = [0.0, -0.0, np.nan, 2.0**-149]
    y = x.astype(dt)
    codes = y.view(np.uint8 if dt.itemsize == 1 else np.uint16)
    got = np.asarray(fpsim.to_bits(x, fmt))
    nan = np.isnan(x)
    mism = int(np.count_nonzero(got[~nan] != codes[~nan]))
    assert mism == 0, f"{mism} of {x.size} codes differ from ml_dtypes"
    r = y.astype(np.float64)
    b = x.astype(np.float64)
    fin = np.isfinite(b)
    err = np.abs(r[fin] - b[fin])
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(b[fin] != 0, err / np.abs(b[fin]), 0.0)
    want = dict(total=x.size, exact=int(np.count_nonzero((r == b) | (np.isnan(r) & np.isnan(b)))),
                underflow=int(np.count_nonzero(fin & (b != 0) & (r == 0))),
                subnormal=int(np.count_nonzero(np.isfinite(r) & (r != 0) & (np.abs(r) < f.min_normal))),
                overflow=0, nan=int(np.count_nonzero(np.isnan(r))), max_abs_error=float(err.max()),
                max_rel_error=float(rel.max()))
    rep = fpsim.analyze(x, fmt).as_dict()
    assert {k: rep[k] for k in want} == want
    assert want["subnormal"] > 0 and want["underflow"] > 0  # the inputs reach the subnormal range


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "fp32", "fp4_e2m1"])
def test_the_one_pass_path_is_taken(fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # the comparisons above would pass vacuously if analyze and to_bits never reached the sinks
    calls: list[int] = []
    real = rounding.round_sink

    def spy(src: np.ndarray, *a: Any) -> None:
        calls.append(src.size)
        real(src, *a)

    monkeypatch.setattr(rounding, "round_sink", spy)
    x = np.random.default_rng(308).standard_normal(2**20 + 3).astype(np.float32)
    fpsim.analyze(x, fmt)
    fpsim.to_bits(x, fmt, "sr", rng=np.random.default_rng(1))
    assert calls == [x.size, x.size]  # one call each for a contiguous input in the carrier's dtype
    monkeypatch.setattr(rounding, "use_sink", False)
    fpsim.analyze(x, fmt)
    assert len(calls) == 2
