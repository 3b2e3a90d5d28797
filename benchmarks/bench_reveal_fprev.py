"""reveal_order beside FPRev (issue 29 §2), both timed in one run on this machine.

    FPREV_PATH=/work/fprev python3 benchmarks/bench_reveal_fprev.py [max_n]

FPRev (Xie et al., USENIX ATC 2025) is public research code and is NOT part of fpsim: point FPREV_PATH
at a checkout of its repository (the folder holding ``fprev.py`` and ``experiments/``; FPRev imports the
``graphviz`` Python package, which must be importable from there or from the environment). Without it
the FPRev column is skipped. The workload is FPRev's own RQ1 case (``experiments/accumimpls/numpy.py``,
``NumpySum``: ``ndarray.sum`` of a float32 vector), at the n of its RQ1 table (4..8, then doubling; its
paper reaches n = 32,768 in 2.4 s), and beyond. fpsim calls the same ``ndarray.sum`` one probe at a time,
and, batched, ``X.sum(axis=1)`` on the rows of one 2-D probe per pivot. Each time is the best of
``repeats`` runs (FPRev's script averages 10 after a warm-up); every fpsim tree is checked equal to the
1-D one, and FPRev's graph is checked to have the same number of internal nodes.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable

import numpy as np

from fpsim.testing import reveal_order


def _best(f: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = f()
        best = min(best, time.perf_counter() - t0)
    return best, out


def _load_fprev() -> tuple[Any, Any] | None:
    path = os.environ.get("FPREV_PATH", "/work/fprev")
    if not os.path.exists(os.path.join(path, "fprev.py")):
        return None
    sys.path[:0] = [path, os.path.join(path, "experiments")]
    try:
        from fprev import fprev  # type: ignore[import-not-found]
        from accumimpls.numpy import NumpySum  # type: ignore[import-not-found]
    except ImportError as e:  # graphviz missing, say
        print(f"FPRev at {path} not importable ({e}); its column is skipped")
        return None
    return fprev, NumpySum


def main(max_n: int) -> None:
    print(f"load average {os.getloadavg()}, numpy {np.__version__}")
    fp = _load_fprev()
    ns = [4, 5, 6, 7, 8] + [2**k for k in range(4, 20) if 2**k <= max_n]
    print(f"{'n':>6} {'FPRev s':>9} {'fpsim s':>9} {'ratio':>6} {'batched s':>9} {'ratio':>6} {'fpsim calls':>11}")
    for n in ns:
        reps = 5 if n <= 1024 else (2 if n <= 8192 else 1)
        calls = [0]

        def one(x: np.ndarray) -> Any:
            calls[0] += 1
            return x.sum()

        t_f, tree = _best(lambda: reveal_order(np.ndarray.sum, n, np.float32, verify=0), reps)
        reveal_order(one, n, np.float32, verify=0)
        t_b, tb = _best(lambda: reveal_order(lambda X: X.sum(axis=1), n, np.float32, verify=0, batched=True), reps)
        assert tb == tree, n
        if fp is not None:
            fprev, NumpySum = fp
            impl = NumpySum(n)
            fprev(impl) if n <= 1024 else None  # FPRev's warm-up run
            t_p, g = _best(lambda: fprev(impl), reps)
            plus = sum(1 for line in g.body if 'label="+"' in line)  # FPRev's internal nodes
            assert tree.max_arity > 2 or plus == n - 1, (n, plus)
            print(f"{n:6d} {t_p:9.4f} {t_f:9.4f} {t_p / t_f:5.2f}x {t_b:9.4f} {t_p / t_b:5.2f}x {calls[0]:11d}")
        else:
            print(f"{n:6d} {'-':>9} {t_f:9.4f} {'-':>6} {t_b:9.4f} {'-':>6} {calls[0]:11d}")
        sys.stdout.flush()
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 32768)
