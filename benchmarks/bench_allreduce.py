"""Cost of simulating an all-reduce (fpsim.train.all_reduce, issue 16 §1) against what a user runs instead.

    python3 benchmarks/bench_allreduce.py [--gloo]

For world sizes 2, 4, 8 and n = 2^16 and 2^20 float32 elements per rank: the seconds of
``all_reduce(per_rank, algorithm=..., wire=...)`` for every algorithm, FP32 and BF16 wire, as a ratio to
``np.sum(np.stack(per_rank), axis=0)`` (the plain sum over ranks a user writes, in NumPy's own order and
with no wire rounding). With ``--gloo``: also real torch.distributed gloo all_reduce in world-size
processes on this machine (the median of 5 timed calls on rank 0, process start-up excluded).
Best of 5 runs after a warm-up, one BLAS/OpenMP thread.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from _timing import best  # noqa: E402

from fpsim.train import all_reduce  # noqa: E402
from fpsim.train._gloo import case_input, run_gloo  # noqa: E402
from fpsim.train.parallel import ALGORITHMS  # noqa: E402


def main() -> None:
    gloo = "--gloo" in sys.argv
    print(f"{'N':>2} {'n':>8} {'wire':4} {'np.sum ms':>9} " + " ".join(f"{a:>16}" for a in ALGORITHMS))
    for N in (2, 4, 8):
        for n in (1 << 16, 1 << 20):
            X = [case_input({"n": n, "dtype": "fp32", "seed": 0}, r) for r in range(N)]
            base = best(lambda: np.sum(np.stack(X), axis=0), 5)
            for wire in ("fp32", "bf16"):
                cells = []
                for alg in ALGORITHMS:
                    t = best(lambda: all_reduce(X, algorithm=alg, wire=wire), 5)
                    cells.append(f"{t / base:15.1f}x")
                print(f"{N:>2} {n:>8} {wire:4} {base * 1e3:9.2f} " + " ".join(cells), flush=True)
            if gloo:
                cases = [{"n": n, "dtype": "fp32", "op": "sum", "seed": 0}]
                real = run_gloo(N, cases, repeats=5)["seconds"][0]
                sim = best(lambda: all_reduce(X, algorithm="gloo"), 5)
                print(f"{N:>2} {n:>8} fp32 real gloo all_reduce {real * 1e3:.2f} ms; fpsim algorithm='gloo' "
                      f"{sim * 1e3:.2f} ms ({sim / real:.2f}x real gloo)", flush=True)


if __name__ == "__main__":
    main()
