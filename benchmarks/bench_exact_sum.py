"""Exact summation behind fpsim.sum(order="exact") and fused multi-term SumTree nodes: the vectorised
fixed-point accumulator (fpsim.accumulate._exact) against what it replaced and what a user would write
instead, math.fsum per column plus a second fsum for the residual's sign (RO53).

    python3 benchmarks/bench_exact_sum.py
"""

from __future__ import annotations

import math
import time

import numpy as np

from fpsim.accumulate import _exact


def _fsum_ro53(flat: np.ndarray) -> np.ndarray:
    from fpsim.arith import _round_to_odd

    cols = flat.T.tolist()
    s = np.array([math.fsum(c) for c in cols])
    r = np.array([math.fsum(c + [-v]) for c, v in zip(cols, s.tolist())])
    nz = s != 0
    return np.where(nz, _round_to_odd(np.where(nz, s, 1.0), r), s)


def _time(f, *a, reps: int = 3) -> float:
    best = math.inf
    for _ in range(reps):
        t = time.perf_counter()
        f(*a)
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    rng = np.random.default_rng(0)
    print("| terms k | columns m | fsum per column (s) | vectorised (s) | speed-up |")
    print("|---|---|---|---|---|")
    for k, m in ((4, 100_000), (16, 100_000), (128, 10_000), (1024, 1_000)):
        x = rng.standard_normal((k, m)) * np.exp2(rng.integers(-30, 30, (k, m)))
        a, b = _exact([x]), _fsum_ro53(x)
        assert np.array_equal(a, b)
        t_old, t_new = _time(_fsum_ro53, x), _time(lambda v: _exact([v]), x)
        print(f"| {k} | {m} | {t_old:.3f} | {t_new:.3f} | {t_old / t_new:.1f}x |")


if __name__ == "__main__":
    main()
