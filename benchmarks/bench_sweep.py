"""Sweeps on Dask: wall time of a small demo sweep run serially against the same cells on 2 Dask workers.

Run: python benchmarks/bench_sweep.py [--policies P ...] [--seeds N] [--steps S] [--workers W]

Cells: the policies given (default four) x N seeds (default 3) of a demo-shaped run (the demo's task, model
and batch; S steps, default 40). Reported, each measured once per run (a shared machine: rerun to see the
noise):

- serial: the cells one after another in this process (``run_sweep(..., workers=0)``, what a user without
  Dask gets), BLAS single-threaded as in the demo;
- dask cold: ``run_sweep(..., workers=W)`` as ``fpsim demo --seeds N --workers W`` runs it, cluster start
  (W worker processes importing fpsim) included;
- dask warm: the same cells on an already running LocalCluster of W workers (``scheduler=ADDRESS``: what a
  user with a cluster pays), after one warm-up cell per worker;
- process pool: the same cells on ``concurrent.futures.ProcessPoolExecutor(W)`` (spawned processes, pool
  start included): what a user would write without Dask, and the baseline for what W processes get on this
  machine;
- Dask overhead per cell: (warm wall time x W - the summed per-cell compute time the workers report) / cells:
  the time per cell spent on scheduling, pickling and result transfer rather than training (negative values
  mean noise); and the same from trivial one-step cells, (warm time - serial time) / cells.

Every Dask result is compared with the serial one (np.array_equal on every loss and metric series): the count
of bit-identical cells is printed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from dataclasses import replace
from typing import Any


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    strip = lambda r: json.dumps({k: v for k, v in r.items() if k != "run_info"}, sort_keys=True)  # noqa: E731
    return strip(a) == strip(b)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--policies", nargs="+", default=["fp32", "bf16-mixed", "fp16-mixed", "fp16-no-master"])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", default=None, help="also write the numbers to this file")
    a = ap.parse_args()

    from distributed import Client, LocalCluster

    from fpsim.train._threads import limit_blas_threads
    from fpsim.train.demo import demo_settings
    from fpsim.train.sweep import grid, run_sweep

    limit_blas_threads(1)
    st = demo_settings(steps=a.steps)
    st = replace(st, histogram_every=max(1, a.steps // 4), eval_every=a.steps)
    cells = grid(a.policies, seeds=a.seeds, settings={"bench": st})
    n = len(cells)
    print(f"{len(a.policies)} policies x {a.seeds} seeds = {n} cells of {a.steps} demo steps; {os.cpu_count()} CPUs")

    t0 = time.perf_counter()
    ser = run_sweep(cells, workers=0)
    t_serial = time.perf_counter() - t0
    compute = sum(r["run_info"]["wall_s"] for r in ser.values())

    t0 = time.perf_counter()
    cold = run_sweep(cells, workers=a.workers)
    t_cold = time.perf_counter() - t0

    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from fpsim.train.sweep import run_cell

    t0 = time.perf_counter()
    with ProcessPoolExecutor(a.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        pooled = dict(zip([c.id for c in cells], pool.map(run_cell, cells)))
    t_pool = time.perf_counter() - t0
    pool_compute = sum(r["run_info"]["wall_s"] for r in pooled.values())

    import dask

    with dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}):  # as fpsim._dask
        cluster = LocalCluster(n_workers=a.workers, threads_per_worker=1, processes=True, dashboard_address=None,
                               scheduler_kwargs={"dashboard_address": ":0"}, silence_logs=logging.ERROR)
    try:
        with Client(cluster, set_as_default=False) as c:
            c.run(lambda: __import__("fpsim.train.sweep"))  # workers import fpsim before the clock starts
        warmup = grid(a.policies[:1], seeds=list(range(1000, 1000 + a.workers)),
                      settings={"warm": replace(st, steps=1, eval_every=1)})
        run_sweep(warmup, scheduler=cluster.scheduler_address)
        t0 = time.perf_counter()
        warm = run_sweep(cells, scheduler=cluster.scheduler_address)
        t_warm = time.perf_counter() - t0
        worker_compute = sum(r["run_info"]["wall_s"] for r in warm.values())
        trivial = grid(a.policies, seeds=a.seeds, settings={"trivial": replace(st, steps=1, eval_every=1,
                                                                                histogram_every=1)})
        t0 = time.perf_counter()
        run_sweep(trivial, workers=0)
        t_triv_serial = time.perf_counter() - t0
        t0 = time.perf_counter()
        run_sweep(trivial, scheduler=cluster.scheduler_address)
        t_triv_dask = time.perf_counter() - t0
    finally:
        cluster.close()

    same = sum(_same(ser[k], cold[k]) and _same(ser[k], warm[k]) and _same(ser[k], pooled[k]) for k in ser)
    over = (t_warm * a.workers - worker_compute) / n
    over_triv = (t_triv_dask - t_triv_serial) / n
    rows = {
        "cells": n, "workers": a.workers, "steps": a.steps,
        "serial_s": t_serial, "serial_compute_s": compute,
        "pool_s": t_pool, "pool_compute_s": pool_compute, "dask_cold_s": t_cold, "dask_warm_s": t_warm, "worker_compute_s": worker_compute,
        "speedup_cold": t_serial / t_cold, "speedup_warm": t_serial / t_warm,
        "overhead_per_cell_s": over, "trivial_serial_s": t_triv_serial, "trivial_dask_s": t_triv_dask,
        "overhead_per_trivial_cell_s": over_triv, "bit_identical_cells": same,
    }
    print(f"  serial                        {t_serial:7.2f} s   (cells' own compute {compute:.2f} s)")
    print(f"  process pool, {a.workers} processes       {t_pool:7.2f} s   serial/pool = {t_serial / t_pool:5.2f}x "
          f"(processes' compute {pool_compute:.2f} s)")
    print(f"  dask, {a.workers} workers, cold start     {t_cold:7.2f} s   serial/dask = {t_serial / t_cold:5.2f}x, "
          f"pool/dask = {t_pool / t_cold:5.2f}x")
    print(f"  dask, {a.workers} workers, warm cluster   {t_warm:7.2f} s   serial/dask = {t_serial / t_warm:5.2f}x, "
          f"pool/dask = {t_pool / t_warm:5.2f}x "
          f"(workers' compute {worker_compute:.2f} s)")
    print(f"  Dask overhead per cell        {1e3 * over:7.1f} ms  (warm x {a.workers} - compute, per cell)")
    print(f"  trivial 1-step cells          serial {t_triv_serial:.2f} s, dask {t_triv_dask:.2f} s: "
          f"{1e3 * over_triv:+.1f} ms per cell")
    print(f"  bit-identical to serial: {same}/{n} cells (Dask cold and warm, process pool)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    assert same == n, "a Dask result differs from the serial one"


if __name__ == "__main__":
    main()
