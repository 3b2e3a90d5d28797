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
