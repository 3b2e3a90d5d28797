"""paired_interval: the paired Student-t verdict notebooks and reports print instead of hand-written words."""

from __future__ import annotations

import math

import numpy as np
import pytest
from fpsim.train import Paired, paired_interval


def test_matches_the_tabulated_t_interval():
    rng = np.random.default_rng(250)
    a = rng.normal(1.0, 0.1, 5)
    b = a - rng.normal(0.02, 0.01, 5)
    r = paired_interval(a, b)
    d = a - b
    # Student's t 97.5% quantile with 4 degrees of freedom, from the published tables (scipy.stats.t.ppf gives the
    # same 2.7764451051977987): an oracle independent of fpsim's own t_quantile
    half = 2.7764451051977987 * d.std(ddof=1) / math.sqrt(5)
    assert r.n == 5 and r.diff == pytest.approx(d.mean(), rel=1e-12)
    assert r.ci == pytest.approx((d.mean() - half, d.mean() + half), rel=1e-9)
    assert r.verdict == ("beyond seed noise" if r.ci[0] > 0 or r.ci[1] < 0 else "within seed noise")


def test_mapping_pairs_by_seed_and_drops_missing():
    r = paired_interval({0: 1.0, 1: 2.0, 2: float("nan"), 3: 4.0}, {3: 3.5, 1: 1.5, 0: 0.5, 2: 1.0})
    # seeds 0, 1, 3 pair up (seed 2 is NaN on one side); every difference is 0.5, so a zero-width interval at 0.5
    assert r.n == 3 and r.diff == pytest.approx(0.5) and r.ci == pytest.approx((0.5, 0.5))
    assert r.verdict == "beyond seed noise"


def test_sentence_states_the_printed_numbers():
    r = paired_interval([1.0, 2.0, 3.0], [0.9, 1.7, 2.95])
    s = r.sentence("A - B", "+.3f")
    assert s.startswith("A - B: mean +0.150, 95% paired interval [") and s.endswith(r.verdict)
    assert str(r) == r.sentence()
    one = paired_interval([1.0], [0.5])
    assert one.ci is None and one.verdict == "one seed: no spread" and "one seed" in str(one)
    assert isinstance(one, Paired) and not one.beyond


@pytest.mark.parametrize("bad", ["abc", 3.0, None])
def test_bad_kinds_name_the_value(bad):
    with pytest.raises(TypeError, match="per-seed"):
        paired_interval(bad, [1.0])


def test_bad_shape_and_level():
    with pytest.raises(ValueError, match="1-D"):
        paired_interval(np.ones((2, 2)), [1.0, 2.0])
    with pytest.raises(ValueError, match="level"):
        paired_interval([1.0, 2.0], [1.0, 2.0], level=1.5)


def test_inputs_not_modified():
    a = np.array([1.0, 2.0, 3.0])
    b = [0.5, 1.0, 1.5]
    a0, b0 = a.copy(), list(b)
    paired_interval(a, b)
    assert np.array_equal(a, a0) and b == b0


def test_hostile_inputs_get_clear_errors():
    with pytest.raises(ValueError, match="same seed order"):
        paired_interval([1.0, 2.0], [1.0, 2.0, 3.0])
    with pytest.raises(TypeError, match="numbers"):
        paired_interval([True, False], [1.0, 0.0])
    with pytest.raises(TypeError, match="numbers"):
        paired_interval(["x", "y"], [1.0, 0.0])
    with pytest.raises(TypeError, match="keys"):
        paired_interval({"a": 1.0}, {"a": 2.0})
    with pytest.raises(ValueError, match="overflows"):
        paired_interval([1e308, -1e308], [-1e308, 1e308])


def test_big_endian_non_contiguous_and_none():
    a = np.array([1.0, 9.0, 2.0, 9.0, 3.0], dtype=">f8")[::2]
    r = paired_interval(a, np.array([0.0, 1.0, 1.5], dtype=">f4"))
    assert r == paired_interval([1.0, 2.0, 3.0], [0.0, 1.0, 1.5])
    assert paired_interval([1.0, None, 3.0], [0.5, 1.0, 2.0]).n == 2
    assert paired_interval([], []).verdict == "no data"
