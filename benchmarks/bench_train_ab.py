"""A/B of the training step: an older fpsim against this one, interleaved in one process (issue 30).

Prepare the old tree as a package of another name, e.g. for the commit ``REV``::

    mkdir /tmp/ab && git archive REV fpsim | tar -x -C /tmp/ab && mv /tmp/ab/fpsim /tmp/ab/fpsim_base
    cp fpsim/*.so /tmp/ab/fpsim_base/      # or build that commit's extensions
    PYTHONPATH=/tmp/ab:. python benchmarks/bench_train_ab.py --rounds 6 fp32 bf16-mixed fp16-mixed@h100

Both run the demo's model (as benchmarks/bench_train.py), BLAS single-threaded, best of the interleaved rounds,
timed with the process's CPU time by default (``--clock wall`` for the wall clock): on a machine other jobs load,
CPU time moves far less. PyTorch's CPU eager step of the same model is timed in the same rounds. At the end each
pair of trainers is compared: the same number of steps must have given the same weights, bit for bit.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from dataclasses import replace
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_train  # noqa: E402  (this directory's script, for its PyTorch step)


def make(pkg: str, policy: str) -> Any:
    train = importlib.import_module(f"{pkg}.train")
    demo = importlib.import_module(f"{pkg}.train.demo")
    cfg = replace(demo.demo_settings().train_config(), telemetry_every=0, histogram_every=0, eval_every=0,
                  steps=10 ** 6)
    pol: Any = policy
    if "@" in policy:
        name, dev = policy.split("@")
        pol = importlib.import_module(f"{pkg}.train.bitexact").bit_exact_policy(name, dev)
    tr = train.Trainer(pol, cfg)
    tr.step()  # warm-up
    return tr


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("policies", nargs="+")
    ap.add_argument("--old", default="fpsim_base", help="the old tree's package name")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="cpu")
    ap.add_argument("--no-torch", action="store_true")
    args = ap.parse_args()
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    bench_train.clock = clock
    from fpsim.train._threads import limit_blas_threads
    from fpsim.train.demo import demo_settings

    limit_blas_threads(1)
    print(f"load average {', '.join(f'{x:.2f}' for x in os.getloadavg())}; clock: "
          f"{'process CPU time' if args.clock == 'cpu' else 'wall'}; old = {args.old}, new = fpsim")
    trs = {(pkg, p): make(pkg, p) for p in args.policies for pkg in (args.old, "fpsim")}
    best: dict[Any, float] = {}
    for _ in range(args.rounds):
        if not args.no_torch:
            t = bench_train.time_torch(demo_settings().train_config(), args.steps)
            if t is not None:
                best["torch"] = min(best.get("torch", np.inf), t)
        for key, tr in trs.items():
            n = args.steps if "@" not in key[1] else max(2, args.steps // 5)
            t0 = clock()
            for _ in range(n):
                tr.step()
            best[key] = min(best.get(key, np.inf), (clock() - t0) / n)
    print(f"load average at the end {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    tt = best.get("torch")
    if tt is not None:
        print(f"PyTorch CPU eager step {1e3 * tt:.2f} ms")
    print("| policy | old ms | new ms | new / old |" + (" old / PyTorch | new / PyTorch |" if tt else ""))
    print("|---|---|---|---|" + ("---|---|" if tt else ""))
    for p in args.policies:
        a, b = best[(args.old, p)], best[("fpsim", p)]
        extra = f" {a / tt:.2f} | {b / tt:.2f} |" if tt else ""
        print(f"| {p} | {1e3 * a:.2f} | {1e3 * b:.2f} | {b / a:.3f} |{extra}")
    for p in args.policies:
        a, b = trs[(args.old, p)], trs[("fpsim", p)]
        same = a.step_count == b.step_count and all(
            np.array_equal(a.store.weights[k], b.store.weights[k]) for k in a.store.weights)
        print(f"{p}: {a.step_count} steps each, weights {'bit-identical' if same else 'DIFFERENT'}")


if __name__ == "__main__":
    main()
