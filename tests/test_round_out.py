"""Issue 17 §2: ``fpsim.round(..., out=)`` (NumPy's ufunc convention): the same bits as a new result,
in place allowed, out returned untouched, bad out refused naming it."""

from __future__ import annotations

import numpy as np
import pytest

import fpsim
import fpsim.rounding as R

FORMATS = ["bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "fp8_e4m3fnuz", "fp4_e2m1", "e8m0", "tf32", "fp64"]


def _x(dtype: type, shape: tuple[int, ...] = (37, 29)) -> np.ndarray:
    g = np.random.default_rng(0)
    n = int(np.prod(shape))
    v = g.standard_normal(n) * np.exp2(g.integers(-30, 20, n))
    v[:6] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40]
    return v.astype(dtype).reshape(shape)


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint64 if a.dtype == np.float64 else np.uint32)


def _rng(mode: str) -> np.random.Generator | None:
    return np.random.default_rng(4) if mode == "sr" else None


@pytest.mark.parametrize("c_kernel", [True, False], ids=["c", "numpy"])
@pytest.mark.parametrize("mode", ["rne", "rtz", "rup", "sr"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("fmt", FORMATS)
def test_out_and_in_place_give_the_new_results_bits(fmt: str, dtype: type, mode: str, c_kernel: bool,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    if not c_kernel:
        monkeypatch.setattr(R, "use_c_kernel", False)
    x = _x(dtype)
    want = fpsim.round(x, fmt, mode, rng=_rng(mode))
    out = np.empty_like(want)
    r = fpsim.round(x, fmt, mode, rng=_rng(mode), out=out)
    assert r is out
    assert np.array_equal(_bits(out), _bits(want))
    if want.dtype == x.dtype:  # in place: out is the input itself
        y = x.copy()
        r = fpsim.round(y, fmt, mode, rng=_rng(mode), out=y)
        assert r is y
        assert np.array_equal(_bits(y), _bits(want))


def test_out_keeps_the_generator_stream() -> None:
    x = _x(np.float32, (3001,))
    g1, g2 = np.random.default_rng(9), np.random.default_rng(9)
    a = fpsim.round(x, "fp16", "sr", rng=g1)
    b = fpsim.round(x, "fp16", "sr", rng=g2, out=np.empty_like(a))
    assert np.array_equal(_bits(a), _bits(b))
    assert g1.integers(0, 2**63, 4).tolist() == g2.integers(0, 2**63, 4).tolist()


def test_large_in_place_threaded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(R, "max_threads", 3)
    x = _x(np.float32, (R._PARALLEL_MIN + 4099,))
    for fmt, mode in [("bf16", "rne"), ("fp8_e4m3", "sr"), ("fp16", "rna")]:
        want = fpsim.round(x, fmt, mode, rng=_rng(mode))
        y = x.copy()
        fpsim.round(y, fmt, mode, rng=_rng(mode), out=y)
        assert np.array_equal(_bits(y), _bits(want)), (fmt, mode)


def test_input_not_modified_and_out_strided_or_overlapping() -> None:
    x = _x(np.float32, (64, 33))
    keep = x.copy()
    want = fpsim.round(x, "fp8_e5m2")
    big = np.full((64, 66), 7.0, np.float32)
    out = big[:, ::2]  # strided: written through a temporary
    assert fpsim.round(x, "fp8_e5m2", out=out) is out
    assert np.array_equal(_bits(np.ascontiguousarray(out)), _bits(want))
    assert (big[:, 1::2] == 7.0).all()
    assert np.array_equal(_bits(x), _bits(keep))
    # out overlapping the input without being it: the input is read whole before out is written
    z = np.concatenate([x.reshape(-1), [np.float32(0)]])
    src, dst = z[:-1], z[1:]
    w = fpsim.round(src.copy(), "bf16")
    fpsim.round(src, "bf16", out=dst)
    assert np.array_equal(_bits(dst), _bits(w))
    # Fortran order in, Fortran-ordered out (not C-contiguous: through a temporary)
    xf = np.asfortranarray(x)
    of = np.empty_like(xf)
    fpsim.round(xf, "fp16", out=of)
    assert np.array_equal(_bits(np.ascontiguousarray(of)), _bits(fpsim.round(x, "fp16")))


def test_out_for_float32_input_rounded_through_float64() -> None:
    # SR with sr_bits > 32 takes float32 input through the float64 carrier; the result stays float32
    x = _x(np.float32, (1000,))
    want = fpsim.round(x, "fp16", "sr", rng=np.random.default_rng(1), sr_bits=40)
    y = x.copy()
    fpsim.round(y, "fp16", "sr", rng=np.random.default_rng(1), sr_bits=40, out=y)
    assert want.dtype == np.float32
    assert np.array_equal(_bits(y), _bits(want))
    # a format wider than float32 from float32 input: a float64 result, so out must be float64
    o = np.empty(x.shape, np.float64)
    fpsim.round(x, "fp64", out=o)
    assert np.array_equal(o, x.astype(np.float64), equal_nan=True)
    with pytest.raises(ValueError, match="out has dtype float32; this result is float64"):
        fpsim.round(x, "fp64", out=x)


def test_out_with_scalars_lists_and_exact_values() -> None:
    o = np.empty((), np.float64)
    assert fpsim.round(0.1, "bf16", out=o) is o
    assert float(o) == float(fpsim.round(0.1, "bf16"))
    assert fpsim.round(2**60 + 1, "fp16", out=o) is o  # an exact int beyond float64: rounded exactly
    assert float(o) == np.inf
    assert fpsim.round(3, "fp8_e4m3", out=o) is o and float(o) == 3.0
    o3 = np.empty(3)
    assert fpsim.round([0.1, 0.2, 0.3], "fp16", out=o3) is o3
    assert np.array_equal(o3, fpsim.round([0.1, 0.2, 0.3], "fp16"))
    with pytest.raises(ValueError, match="out has shape"):
        fpsim.round(0.1, "bf16", out=np.empty(1))


def test_bad_out_is_refused_naming_it() -> None:
    x = np.ones((4, 5), np.float32)
    with pytest.raises(TypeError, match="out must be a numpy.ndarray"):
        fpsim.round(x, "bf16", out=[0.0] * 20)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="out has dtype float64; this result is float32"):
        fpsim.round(x, "bf16", out=np.empty((4, 5)))
    with pytest.raises(ValueError, match=r"out has shape \(20,\); this result has shape \(4, 5\)"):
        fpsim.round(x, "bf16", out=np.empty(20, np.float32))
    ro = np.empty((4, 5), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="out is read-only"):
        fpsim.round(x, "bf16", out=ro)
    with pytest.raises(ValueError, match="as_dtype"):
        fpsim.round(x, "bf16", out=np.empty((4, 5), np.float32), as_dtype=True)
    # a refused out is left as it was
    o = np.full((4, 5), 2.5)
    with pytest.raises(ValueError):
        fpsim.round(x, "bf16", out=o)
    assert (o == 2.5).all()


def test_out_with_torch_input_returns_out_itself() -> None:
    torch = pytest.importorskip("torch")
    t = torch.tensor([0.1, 0.2, 1e-6], dtype=torch.float32)
    o = np.empty(3, np.float32)
    r = fpsim.round(t, "fp16", out=o)
    assert r is o
    assert np.array_equal(o, fpsim.round(t.numpy(), "fp16"))
