"""Hostile inputs to the recently added parts: each case gives the correct result or a clear
TypeError/ValueError naming the problem, never a wrong result or another library's internal error."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fpsim

# ------------------------------------------------------------------------------------ reveal_order


@pytest.mark.parametrize("fn", [lambda x: np.sum(np.abs(x)), lambda x: np.sum(x * x)])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_reveal_order_transformed_terms_clear_error(fn, dtype):
    # fn(ones) == n passes the first check; the probe's +M and -M then overflow instead of cancelling
    with pytest.raises(ValueError, match="not a summation of its terms.*inf"):
        fpsim.testing.reveal_order(fn, 16, dtype)


def test_reveal_dot_order_transformed_terms_clear_error():
    with pytest.raises(ValueError, match="not a summation of its terms"):
        fpsim.testing.reveal_dot_order(lambda a, b: np.sum(np.abs(a * b)), 8)


def test_reveal_order_abs_n2():
    with pytest.raises(ValueError, match="not a summation of its terms"):
        fpsim.testing.reveal_order(lambda x: np.sum(np.abs(x)), 2)


# ------------------------------------------------------------------------------------------- out=


def _out_ops():
    return {
        "round": lambda x, y, out: fpsim.round(x, "bf16", out=out),
        "add": lambda x, y, out: fpsim.add(x, y, "bf16", out=out),
        "sub": lambda x, y, out: fpsim.sub(x, y, "bf16", out=out),
        "mul": lambda x, y, out: fpsim.mul(x, y, "bf16", out=out),
        "div": lambda x, y, out: fpsim.div(x, y, "bf16", out=out),
        "sqrt": lambda x, y, out: fpsim.sqrt(np.abs(x), "bf16", out=out),
        "fma": lambda x, y, out: fpsim.fma(x, y, x, "bf16", out=out),
    }


@pytest.mark.parametrize("op", sorted(_out_ops()))
@pytest.mark.parametrize("mask", [[0, 1] * 4, False])
def test_out_masked_array_refused(op, mask):
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal(8).astype(np.float32), rng.standard_normal(8).astype(np.float32)
    out = np.ma.masked_array(np.zeros(8, np.float32), mask=mask)
    with pytest.raises(TypeError, match="masked array"):
        _out_ops()[op](x, y, out)
    assert np.all(out.data == 0)


@pytest.mark.parametrize("op", sorted(_out_ops()))
def test_out_matrix_refused(op):
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((1, 8)).astype(np.float32), rng.standard_normal((1, 8)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PendingDeprecationWarning)
        out = np.asmatrix(np.zeros((1, 8), np.float32))
    with pytest.raises(TypeError, match="numpy.matrix"):
        _out_ops()[op](x, y, out)


def test_round_exact_scalar_out_masked_refused():
    with pytest.raises(TypeError, match="masked array"):
        fpsim.round(2**60 + 1, "bf16", out=np.ma.masked_array(np.zeros(())))


@pytest.mark.parametrize("op", sorted(_out_ops()))
def test_out_hostile_but_valid(op):
    """Strided, reversed, byte-swapped-free subclass and aliasing outs give the plain result; bad ones
    are refused; the inputs are never modified."""
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal(8).astype(np.float32), rng.standard_normal(8).astype(np.float32)
    x0, y0 = x.copy(), y.copy()
    f = _out_ops()[op]
    want = f(x, y, None)

    class Sub(np.ndarray):
        pass

    for out in (np.zeros(16, np.float32)[::2], np.zeros(8, np.float32)[::-1], np.zeros(8, np.float32).view(Sub)):
        assert f(x, y, out) is out
        np.testing.assert_array_equal(np.asarray(out), want)
    ro = np.zeros(8, np.float32)
    ro.flags.writeable = False
    for bad, exc in ((np.zeros(8, np.float64), ValueError), (np.zeros(4, np.float32), ValueError),
                     (np.zeros((), np.float32), ValueError), (ro, ValueError), ([0.0] * 8, TypeError)):
        with pytest.raises(exc, match="out"):
            f(x, y, bad)
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(y, y0)
    # out overlapping an input by one element: computed as if into a new array
    buf = np.concatenate([x, y])
    got = f(buf[0:8], buf[8:16], buf[1:9])
    np.testing.assert_array_equal(got, f(x, y, None))
