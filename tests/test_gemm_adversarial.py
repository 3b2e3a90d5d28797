"""The compiled GEMM (fpsim/_cgemm.c) against the NumPy reference on adversarial data, layouts and dtypes.

Every case runs ``fpsim.mma.matmul`` (and ``dot``) once with ``use_c_gemm = True`` and once with the NumPy
reference (``use_c_gemm = False``) and compares the bits (NaN compared as NaN, signed zeros by sign).
Models: NVIDIA BFMA presets of each kernel variant (plain, late C / mod-4 FP8->fp16, fp16 out, tf32, bf16)
and the generic wide / fma_chain / pairwise kernels.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from fpsim.mma import dot, gemm as G, matmul

pytestmark = pytest.mark.skipif(G._cgemm is None, reason="the compiled GEMM is not built")

MODELS = ["a100:fp16", "h100:fp8_e4m3:fp16", "h100:fp8_e5m2", "v100:fp16:fp16", "a100:tf32", "h100:bf16",
          "wide", "fma_chain", "pairwise"]


def _same(x: Any, y: Any) -> bool:
    x, y = np.asarray(x), np.asarray(y)
    if x.shape != y.shape or x.dtype != y.dtype:
        return False
    nx, ny = np.isnan(x), np.isnan(y)
    return bool(np.array_equal(nx, ny) and np.array_equal(np.where(nx, 0, x), np.where(ny, 0, y))
                and np.array_equal(np.signbit(np.where(nx, 0, x)), np.signbit(np.where(ny, 0, y))))


def _both(fn: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    monkeypatch.setattr(G, "use_c_gemm", True)
    c_res = fn()
    monkeypatch.setattr(G, "use_c_gemm", False)
    ref = fn()
    return c_res, ref


def _check(A: Any, B: Any, C: Any, model: str, monkeypatch: pytest.MonkeyPatch, **kw: Any) -> Any:
    a0, b0 = np.array(A, copy=True), np.array(B, copy=True)
    c_res, ref = _both(lambda: matmul(A, B, C, model=model, **kw), monkeypatch)
    assert _same(c_res, ref), f"{model}: compiled {c_res!r} != reference {ref!r}"
    np.testing.assert_array_equal(np.asarray(A), a0)  # inputs are never modified
    np.testing.assert_array_equal(np.asarray(B), b0)
    return c_res


def _values(rng: np.random.Generator, shape: tuple[int, ...], model: str) -> np.ndarray:
    """Normal values converted to the model's input format (so that no conversion hides a difference)."""
    m = G.as_model(model)
    return G.convert_inputs(rng.standard_normal(shape) * 4.0, m.input, None, "x")


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("layout", ["fortran", "transposed", "negative-stride", "strided", "broadcast-view"])
def test_layouts(model: str, layout: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(1)
    A = _values(rng, (9, 70), model)
    B = _values(rng, (70, 11), model)
    C = rng.standard_normal((9, 11))
    ref = _check(A, B, C, model, monkeypatch)
    if layout == "fortran":
        A2, B2, C2 = np.asfortranarray(A), np.asfortranarray(B), np.asfortranarray(C)
    elif layout == "transposed":
        A2, B2, C2 = np.ascontiguousarray(A.T).T, np.ascontiguousarray(B.T).T, np.ascontiguousarray(C.T).T
    elif layout == "negative-stride":
        A2 = np.ascontiguousarray(A[::-1])[::-1]  # the same values through negative strides
        B2 = np.ascontiguousarray(B[:, ::-1])[:, ::-1]
        C2 = np.ascontiguousarray(C[::-1])[::-1]
    elif layout == "strided":
        big_a = np.zeros((18, 140))
        big_a[::2, ::2] = A
        big_b = np.zeros((140, 33))
        big_b[::2, ::3] = B
        A2, B2, C2 = big_a[::2, ::2], big_b[::2, ::3], C
    else:
        A2 = np.broadcast_to(A, (2, 9, 70))
        B2, C2 = B, np.broadcast_to(C[0], (9, 11))
        C = C2
        ref = np.broadcast_to(_check(A, B, C2, model, monkeypatch), (2, 9, 11))
    got = _check(A2, B2, C2, model, monkeypatch)
    assert _same(got, ref)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("mkn", [(0, 5, 7), (4, 0, 7), (4, 5, 0), (0, 0, 0), (1, 1, 1), (1, 3, 1)])
def test_zero_and_tiny_sizes(model: str, mkn: tuple[int, int, int], monkeypatch: pytest.MonkeyPatch) -> None:
    mm, kk, nn = mkn
    rng = np.random.default_rng(2)
    A = _values(rng, (mm, kk), model)
    B = _values(rng, (kk, nn), model)
    for C in (None, rng.standard_normal((mm, nn)), -0.0):
        res = _check(A, B, C, model, monkeypatch)
        assert res.shape == (mm, nn)
    res = _check(A[None].repeat(3, 0), B, None, model, monkeypatch)  # a batch (A's rows stacked)
    assert res.shape == (3, mm, nn)
    res = _check(A, B[None].repeat(2, 0), None, model, monkeypatch)  # a batch with its own B
    assert res.shape == (2, mm, nn)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("kk", [1, 3, 7, 15, 17, 31, 33, 63, 65, 129])
def test_k_not_a_multiple_of_the_block(model: str, kk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(3)
    A = _values(rng, (5, kk), model)
    B = _values(rng, (kk, 6), model)
    _check(A, B, rng.standard_normal((5, 6)), model, monkeypatch)
    _check(A[None], B[None, None], None, model, monkeypatch)  # (1, 5, K) @ (1, 1, K, 6): a batch


def _special_matrix(rng: np.random.Generator, shape: tuple[int, int], model: str, kind: str) -> np.ndarray:
    m = G.as_model(model)
    fmt = m.input
    x = _values(rng, shape, model)
    mask = rng.random(shape) < 0.3
    if kind == "subnormal":
        sub = float(fmt.min_subnormal) * rng.integers(1, 4, size=shape) * rng.choice([-1.0, 1.0], size=shape)
        x = np.where(mask, sub, x)
    elif kind == "max":
        x = np.where(mask, float(fmt.max) * rng.choice([-1.0, 1.0], size=shape), x)
    elif kind == "negzero":
        x = np.where(mask, -0.0, x)
    elif kind == "inf-nan":
        sp = rng.choice(np.array([np.inf, -np.inf, np.nan]), size=shape)
        x = np.where(rng.random(shape) < 0.05, sp, x)
    return x


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("kind", ["subnormal", "max", "negzero", "inf-nan", "all-negzero"])
def test_special_values(model: str, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(4)
    if kind == "all-negzero":
        A = np.full((6, 40), -0.0)
        B = _values(rng, (40, 7), model)
        for C in (None, -0.0, np.full((6, 7), -0.0), rng.standard_normal((6, 7))):
            _check(A, B, C, model, monkeypatch)
        return
    A = _special_matrix(rng, (6, 40), model, kind)
    B = _special_matrix(rng, (40, 7), model, kind)
    C = rng.standard_normal((6, 7))
    if kind == "max":
        C = np.where(rng.random((6, 7)) < 0.3, 3.0e38, C)
    _check(A, B, C, model, monkeypatch)
    _check(A, B, None, model, monkeypatch)
    c_res, ref = _both(lambda: dot(A[:, None, :], B.T[None], None, model), monkeypatch)
    assert _same(c_res, ref)


@pytest.mark.parametrize("model", MODELS)
def test_special_addends(model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(5)
    A = _values(rng, (4, 20), model)
    B = _values(rng, (20, 5), model)
    C = rng.standard_normal((4, 5))
    C[0, :] = [np.inf, -np.inf, np.nan, -0.0, 3.4e38]
    C[1, :] = [1e-40, -1e-45, 7e-46, 0.0, -3.4e38]
    _check(A, B, C, model, monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["a100:fp16", "h100:fp8_e4m3:fp16", "wide", "pairwise"])
def test_huge_k_small_mn(model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(6)
    kk = 100_003
    A = _values(rng, (2, kk), model)
    B = _values(rng, (kk, 3), model)
    _check(A, B, rng.standard_normal((2, 3)), model, monkeypatch)
    c_res, ref = _both(lambda: dot(A, B.T[:2], None, model), monkeypatch)
    assert _same(c_res, ref)
    # long chains of the largest products (the kernel's int32 partial sums) and of equal terms
    big = float(G.as_model(model).input.max)
    A[0], B[:, 0] = big, big
    A[1], B[:, 1] = 1.0, -1.0
    _check(A, B, None, model, monkeypatch)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float8_e4m3fn", "int4", "float32", "float64", "int8",
                                   "int64", "uint16"])
def test_input_dtypes(model: str, dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(7)
    if dtype in ("bfloat16", "float8_e4m3fn", "int4"):
        ml_dtypes = pytest.importorskip("ml_dtypes")
        dt: Any = getattr(ml_dtypes, dtype)
    else:
        dt = np.dtype(dtype)
    if np.dtype(dt).kind in "iu" or dtype == "int4":
        A = rng.integers(0, 7, size=(5, 24)).astype(dt)
        B = rng.integers(0, 7, size=(24, 6)).astype(dt)
    else:
        A = rng.standard_normal((5, 24)).astype(dt)
        B = rng.standard_normal((24, 6)).astype(dt)
    got = _check(A, B, None, model, monkeypatch)
    # the same values as float64 give the same bits (only float32 x float32 returns float32)
    ref = _check(np.asarray(A, dtype=np.float64), np.asarray(B, dtype=np.float64), None, model, monkeypatch)
    np.testing.assert_array_equal(np.asarray(got, dtype=np.float64), ref)
    assert got.dtype == (np.float32 if dtype == "float32" else np.float64)
    mixed = _check(A, np.asarray(B, dtype=np.float32), None, model, monkeypatch)
    np.testing.assert_array_equal(mixed, ref)


@pytest.mark.parametrize("model", ["a100:fp16", "wide"])
def test_large_integers_convert_like_floats(model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Integers exact in float64 are values like any other: 2**60 overflows fp16 to inf on conversion."""
    A = np.array([[2**60, -(2**40), 3]], dtype=np.int64)
    B = np.array([[1], [1], [2]], dtype=np.int64)
    got = _check(A, B, None, model, monkeypatch)
    np.testing.assert_array_equal(got, _check(A.astype(np.float64), B.astype(np.float64), None, model,
                                              monkeypatch))


@pytest.mark.parametrize("model", ["a100:fp16", "wide"])
@pytest.mark.parametrize("bad", ["bool", "complex", "object-str"])
def test_bad_dtypes_raise(model: str, bad: str, monkeypatch: pytest.MonkeyPatch) -> None:
    A = np.ones((3, 4))
    B = {"bool": np.ones((4, 2), dtype=bool), "complex": np.ones((4, 2), dtype=complex),
         "object-str": np.array([["a"] * 2] * 4, dtype=object)}[bad]
    for use_c in (True, False):
        monkeypatch.setattr(G, "use_c_gemm", use_c)
        with pytest.raises(TypeError, match="B"):
            matmul(A, B, model=model)
        with pytest.raises(TypeError, match="b"):
            dot(np.ones(4), B[:, 0], None, model)


@pytest.mark.parametrize("model", MODELS)
def test_models_take_the_compiled_kernel(model: str) -> None:
    """Guard: every model above runs in a compiled kernel (else the comparisons compare NumPy with itself)."""
    m = G.as_model(model)
    assert (G._c_params(m) if m.kind == "bfma" else G._g_params(m)) is not None


@pytest.mark.parametrize("model", ["a100:fp16", "h100:fp8_e4m3", "h100:fp8_e4m3:fp16", "h100:bf16"])
@pytest.mark.parametrize("kk", [1, 31, 64, 100, 257])
def test_promotion_and_scales(model: str, kk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(8)
    m = G.as_model(model)
    pe = 2 * m.instruction_k
    A = _special_matrix(rng, (5, kk), model, "subnormal")
    B = _special_matrix(rng, (kk, 7), model, "max")
    g = -(-kk // pe)
    sa = rng.choice([0.5, 2.0, 3.0e-3, 1e30], size=(5, g))
    sb = rng.choice([0.25, 4.0, 7.0], size=(g, 1))
    C = rng.standard_normal((5, 7))
    _check(A, B, C, model, monkeypatch, promote_every=pe)
    _check(A, B, C, model, monkeypatch, promote_every=pe, scales=(sa, sb))
    _check(A[None].repeat(2, 0), B[None].repeat(2, 0), C, model, monkeypatch, promote_every=pe)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("cshape", [(), (7,), (5, 1), (2, 1, 7)])
def test_broadcast_addends(model: str, cshape: tuple[int, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(9)
    A = _values(rng, (2, 5, 40), model)
    B = _values(rng, (40, 7), model)
    C = rng.standard_normal(cshape).astype(np.float16)
    _check(A, B, C, model, monkeypatch)
    _check(A, B[None, ::-1][:, ::-1], C, model, monkeypatch)  # B batched through a negative-stride view


@pytest.mark.parametrize("model", ["a100:fp16", "h100:fp8_e4m3:fp16", "wide", "pairwise"])
@pytest.mark.parametrize(("mm", "nn"), [(33, 129), (65, 127), (1, 257), (97, 1)])
def test_tile_edges_and_threads(model: str, mm: int, nn: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Shapes off the kernel's 32 x 128 tiles (partial tiles on both edges), several threads forced."""
    from fpsim import rounding

    monkeypatch.setattr(rounding, "max_threads", 3)
    monkeypatch.setattr(G, "_C_MIN_PARALLEL", 1)
    rng = np.random.default_rng(10)
    A = _special_matrix(rng, (mm, 48), model, "inf-nan")
    B = _values(rng, (48, nn), model)
    _check(A, B, rng.standard_normal((mm, nn)), model, monkeypatch)
    _check(A[None].repeat(2, 0), B[None].repeat(2, 0), None, model, monkeypatch)
    c_res, ref = _both(lambda: dot(A[:, None, :], B.T[None], None, model), monkeypatch)
    assert _same(c_res, ref)
