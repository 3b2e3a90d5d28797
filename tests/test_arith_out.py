"""``out=`` on fpsim.add/sub/mul/div/sqrt/fma and on the Context methods (issue 17, section 2).

The rule, as for NumPy ufuncs: ``out`` is a writeable ndarray of exactly the result's shape and dtype
(``fpsim._checks.check_out``); it may be one of the operands (in place); the function writes the result
there and returns ``out`` itself, with the same bits as the call without ``out``. Scalar operands give a
0-d result: ``out`` then has shape ``()``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import fpsim
from fpsim import arith
from fpsim.arith import Context

OPS = {"add": 2, "sub": 2, "mul": 2, "div": 2, "sqrt": 1, "fma": 3}
FMTS = ["fp32", "bf16", "fp16", "fp8_e4m3"]


def _operands(n: int, k: int, dtype: Any, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    xs = [np.asarray(np.abs(rng.standard_normal(n)) + 0.5 if i == 0 else rng.standard_normal(n), dtype=dtype)
          for i in range(k)]
    return xs


def _bits(a: Any) -> bytes:
    a = np.asarray(a)
    return a.dtype.str.encode() + a.shape.__repr__().encode() + a.tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("op", list(OPS))
def test_out_fresh_and_in_place_same_bits(op: str, fmt: str, dtype: Any) -> None:
    fn = getattr(fpsim, op)
    xs = _operands(1000, OPS[op], dtype)
    want = fn(*xs, fmt)
    out = np.empty_like(want)
    got = fn(*xs, fmt, out=out)
    assert got is out
    assert _bits(out) == _bits(want)
    for i in range(OPS[op]):  # each operand in turn is the output
        ys = [x.copy() for x in xs]
        r = fn(*ys, fmt, out=ys[i])
        assert r is ys[i]
        assert _bits(ys[i]) == _bits(want), f"{op} in place on operand {i}"
        for j in range(OPS[op]):
            if j != i:
                assert _bits(ys[j]) == _bits(xs[j]), "another operand was modified"


@pytest.mark.parametrize("op", list(OPS))
def test_out_large_chunked_in_place(op: str) -> None:
    # more than one chunk of Context (2**15 elements): the chunk loop writes into out while reading it
    fn = getattr(fpsim, op)
    xs = _operands(3 * 2**15 + 17, OPS[op], np.float64, seed=1)
    want = fn(*xs, "bf16", rounding="rup")
    a = xs[0].copy()
    fn(a, *xs[1:], "bf16", rounding="rup", out=a)
    assert _bits(a) == _bits(want)


@pytest.mark.parametrize("mode", ["rne", "rtz", "rup", "rdn", "rna"])
def test_fma_fp32_out_float32_every_mode(mode: str) -> None:
    a, b, c = _operands(5000, 3, np.float32, seed=2)
    want = fpsim.fma(a, b, c, "fp32", rounding=mode)
    c2 = c.copy()
    assert fpsim.fma(a, b, c2, "fp32", rounding=mode, out=c2) is c2
    assert _bits(c2) == _bits(want)


def test_out_broadcast_and_non_contiguous() -> None:
    a = np.arange(12.0).reshape(3, 4) / 7
    b = np.linspace(0.1, 2, 4)
    want = fpsim.mul(a, b, "fp16")
    out = np.empty((3, 8))[:, ::2]  # a strided view: written through a temporary
    assert fpsim.mul(a, b, "fp16", out=out) is out
    assert _bits(np.ascontiguousarray(out)) == _bits(want)


def test_out_overlapping_shifted_view() -> None:
    # out overlaps an operand at another offset: the result must be as if the operand were copied first
    x = np.linspace(0.5, 3.0, 70001)
    want = fpsim.add(x[:-1].copy(), 1.0, "bf16")
    fpsim.add(x[:-1], 1.0, "bf16", out=x[1:])
    assert _bits(x[1:]) == _bits(want)


def test_scalar_operands_take_a_0d_out() -> None:
    out = np.empty(())
    r = fpsim.add(256.0, 1.0, "bf16", rounding="rup", out=out)
    assert r is out and float(out) == 258.0
    with pytest.raises(ValueError, match=r"out has shape \(1,\); this result has shape \(\)"):
        fpsim.add(256.0, 1.0, "bf16", out=np.empty(1))


def test_out_errors() -> None:
    x = np.ones(3)
    with pytest.raises(ValueError, match="out has dtype float32; this result is float64"):
        fpsim.add(x, x, "bf16", out=np.empty(3, np.float32))
    with pytest.raises(ValueError, match="out has shape"):
        fpsim.add(x, x, "bf16", out=np.empty(4))
    with pytest.raises(TypeError, match="out must be a numpy.ndarray, got list"):
        fpsim.add(x, x, "bf16", out=[0.0, 0.0, 0.0])
    ro = np.empty(3)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="out is read-only"):
        fpsim.fma(x, x, x, "fp16", out=ro)
    # float32 operands, a format that does not fit float32: the result (and out) is float64
    f = np.ones(3, np.float32)
    with pytest.raises(ValueError, match="this result is float64"):
        fpsim.add(f, f, "fp64", out=np.empty(3, np.float32))
    with pytest.raises(ValueError, match="as_dtype=True and out= cannot be combined"):
        fpsim.add(x, x, "bf16", out=np.empty(3), as_dtype=True)
    with pytest.raises(TypeError, match="out= needs fmt"):
        fpsim.add(fpsim.array([1.0], "bf16"), 1.0, out=np.empty(1))
    assert x.tolist() == [1.0, 1.0, 1.0]


def test_out_with_torch_input_returns_the_ndarray() -> None:
    torch = pytest.importorskip("torch")
    t = torch.tensor([256.0, 1.0], dtype=torch.float32)
    out = np.empty(2, np.float32)
    r = fpsim.add(t, t, "bf16", out=out)
    assert r is out
    assert out.tolist() == [512.0, 2.0]


@pytest.mark.parametrize("c_arith", [True, False], ids=["c", "numpy"])
@pytest.mark.parametrize("op", list(OPS))
def test_context_out(op: str, c_arith: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(arith, "use_c_arith", c_arith)
    ctx = Context("fp16", "rtz")
    xs = _operands(2**15 + 5, OPS[op], np.float64, seed=3)
    want = getattr(ctx, op)(*xs)
    out = np.empty_like(xs[0])
    assert getattr(ctx, op)(*xs, out=out) is out
    assert _bits(out) == _bits(want)
    a = xs[0].copy()
    getattr(ctx, op)(a, *xs[1:], out=a)
    assert _bits(a) == _bits(want)
    # a float32 out for a format that fits float32: the same values
    o32 = np.empty(xs[0].shape, np.float32)
    getattr(ctx, op)(*xs, out=o32)
    assert _bits(o32.astype(np.float64)) == _bits(want)


def test_context_add_one_element_out() -> None:
    ctx = Context("bf16")
    s = np.array([256.0])
    assert ctx.add(s, np.array([2.0]), out=s) is s
    assert s.tolist() == [258.0]
