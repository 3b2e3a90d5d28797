"""Cost of fpsim.testing's checks relative to the rounding they verify (ratios from one run).

    python benchmarks/bench_testing.py [n]
"""

from __future__ import annotations

import sys
import time

import ml_dtypes
import numpy as np

import fpsim
import fpsim.testing as ft


def _best(fn, reps: int = 5) -> float:
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main(n: int) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal(n).astype(np.float32) * 100
    good = x.astype(ml_dtypes.bfloat16)
    bad = good.copy()
    bad[:: max(1, n // 1000)] = 0  # ~1000 wrong elements: the failure path
    t_round = _best(lambda: fpsim.round(x, "bf16"))
    t_ml = _best(lambda: x.astype(ml_dtypes.bfloat16))
    t_pass = _best(lambda: ft.assert_rounded(good, x, "bf16"))

    def fail() -> None:
        try:
            ft.assert_rounded(bad, x, "bf16")
        except AssertionError:
            pass

    t_fail = _best(fail, 3)
    t_ulp = _best(lambda: ft.ulp_distance(good, x, "bf16"))
    print(f"n = {n:,} float32 -> bf16")
    print(f"fpsim.round                    {t_round * 1e3:8.2f} ms   (ml_dtypes cast {t_ml * 1e3:.2f} ms)")
    print(f"assert_rounded, passing        {t_pass * 1e3:8.2f} ms   = {t_pass / t_round:5.1f} x fpsim.round")
    print(f"assert_rounded, ~1000 failing  {t_fail * 1e3:8.2f} ms   = {t_fail / t_round:5.1f} x fpsim.round")
    print(f"ulp_distance                   {t_ulp * 1e3:8.2f} ms   = {t_ulp / t_round:5.1f} x fpsim.round")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000)
