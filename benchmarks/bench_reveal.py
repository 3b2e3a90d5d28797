"""Cost of revealing a summation order (fpsim.testing.reveal_order, issue 15 §4) as a function of n.

    python3 benchmarks/bench_reveal.py [max_n]

For each function and n: the calls to the function and the seconds the refined FPRev algorithm needs
(verification off, so only the reveal is timed), against FPRev's basic algorithm (every pair, n(n-1)/2
calls; run up to n = 1024), the alternative a user would otherwise run. Then the replay: fpsim.sum with the
revealed tree over 10,000 random rows of n = 1024, against NumPy's own sum of those rows one by one.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable

import numpy as np

import fpsim
from fpsim.testing import reveal_order


def _counted(fn: Callable[[np.ndarray], Any]) -> tuple[Callable[[np.ndarray], Any], list[int]]:
    calls = [0]

    def f(x: np.ndarray) -> Any:
        calls[0] += 1
        return fn(x)

    return f, calls


def _time(fn: Callable[[np.ndarray], Any], n: int, method: str) -> tuple[int, float]:
    f, calls = _counted(fn)
    t0 = time.perf_counter()
    reveal_order(f, n, np.float32, verify=0, method=method)
    return calls[0], time.perf_counter() - t0


def _loop(x: np.ndarray) -> Any:
    s = x[0]
    for v in x[1:]:
        s = s + v
    return s


def main(max_n: int) -> None:
    funcs: dict[str, Callable[[np.ndarray], Any]] = {"numpy.sum": np.sum}
    ones = {n: np.ones(n, np.float32) for n in (2 ** k for k in range(4, 13))}
    funcs["numpy.dot (BLAS)"] = lambda x: np.dot(x, ones[x.size])
    try:
        import torch

        torch.set_num_threads(1)
        funcs["torch.sum"] = lambda x: torch.from_numpy(x).sum().item()
    except ImportError:  # pragma: no cover
        pass
    funcs["Python loop"] = _loop
    print(f"{'function':18} {'n':>5} {'calls':>7} {'seconds':>8} {'basic calls':>11} {'basic s':>8} "
          f"{'calls ratio':>11} {'time ratio':>10}")
    for name, fn in funcs.items():
        n = 16
        while n <= max_n:
            if name == "Python loop" and n > 1024:
                break
            calls, secs = _time(fn, n, "fprev")
            if n <= 1024 and name != "Python loop":
                bcalls, bsecs = _time(fn, n, "basic")
                extra = f"{bcalls:11d} {bsecs:8.3f} {bcalls / calls:10.1f}x {bsecs / secs:9.1f}x"
            else:
                extra = f"{n * (n - 1) // 2 + 1:11d} {'-':>8} {(n * (n - 1) // 2 + 1) / calls:10.1f}x {'-':>10}"
            print(f"{name:18} {n:5d} {calls:7d} {secs:8.3f} {extra}")
            n *= 4 if n < 256 else 2
    # the default call: reveal, then verify on 64 random inputs
    for n in (1024, 4096):
        f, calls = _counted(np.sum)
        t0 = time.perf_counter()
        reveal_order(f, n, np.float32)
        print(f"reveal_order(numpy.sum, {n}) with the default verify=64: {calls[0]} calls, "
              f"{time.perf_counter() - t0:.3f} s")
    # replay speed
    n, rows = 1024, 10_000
    tree = reveal_order(np.sum, n, np.float32, verify=0)
    x = np.random.default_rng(0).standard_normal((rows, n)).astype(np.float32)
    t0 = time.perf_counter()
    r = fpsim.sum(x, "fp32", order=tree, axis=1)
    t_replay = time.perf_counter() - t0
    t0 = time.perf_counter()
    want = np.array([np.sum(row) for row in x])
    t_np = time.perf_counter() - t0
    t0 = time.perf_counter()
    np.sum(x, axis=1)
    t_np_axis = time.perf_counter() - t0
    assert np.array_equal(r, want)
    print(f"\nreplay of numpy.sum's tree (n = {n}, height {tree.height}) over {rows:,} rows: {t_replay:.3f} s; "
          f"numpy.sum row by row {t_np:.3f} s ({t_replay / t_np:.1f}x); np.sum(axis=1) {t_np_axis:.4f} s "
          f"({t_replay / t_np_axis:.0f}x; a different order); bit-identical to the row-by-row sums")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4096)
