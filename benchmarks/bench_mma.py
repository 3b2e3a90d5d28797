"""Benchmark: emulated Tensor Core GEMM (fpsim.mma) against numpy.matmul and a naive row-by-row emulation.

Run:  python benchmarks/bench_mma.py [--size 512] [--naive-rows 4]

Reports, in one run: emulated MAC/s of a size^3 fp16 GEMM under the h100 model (tiled, vectorized over rows
and blocks), its peak extra memory (tracemalloc), numpy.matmul in float32, and a naive implementation of the
same model written here (one output element at a time, one BFMA block at a time) measured on a few rows and
checked bit for bit against the fast path. Generic models: exact on the same GEMM, fma_chain on a smaller one.
"""

from __future__ import annotations

import argparse
import math
import os
import time
import tracemalloc

import numpy as np

import fpsim
from fpsim.mma import MMAModel, generic, get_model


def naive_bfma_gemm_rows(a: np.ndarray, b: np.ndarray, model: MMAModel, rows: int) -> np.ndarray:
    """The BFMA chain for the first `rows` rows of A @ B, one output element and one block at a time."""
    k = model.k
    kk = a.shape[1]
    out = np.empty((rows, b.shape[1]))
    emin_in = model.input.emin
    for i in range(rows):
        for j in range(b.shape[1]):
            d = 0.0
            for k0 in range(0, kk, k):
                x = a[i, k0:k0 + k].astype(np.float64)
                y = b[k0:k0 + k, j].astype(np.float64)
                prod = x * y
                nz = prod != 0
                ex = np.maximum(np.frexp(x)[1] - 1, emin_in)
                ey = np.maximum(np.frexp(y)[1] - 1, emin_in)
                exps = list((ex + ey)[nz])
                if d != 0:
                    exps.append(max(math.frexp(d)[1] - 1, -126))
                if not exps:
                    d = 0.0
                    continue
                emax = int(max(max(exps), model.mel) if model.mel is not None else max(exps))
                grid = math.ldexp(1.0, emax - 23 - model.neab)
                s = float(np.sum(np.trunc(prod / grid))) + math.trunc(d / grid)
                v = s * grid
                e = max(math.frexp(v)[1] - 1, -126) if v else -126
                q = math.ldexp(1.0, e - model.mb)
                d = math.trunc(v / q) * q
            out[i, j] = d
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--naive-rows", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    n = args.size
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(np.float16).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float16).astype(np.float32)
    macs = n**3
    model = get_model("h100", "fp16", "fp32")

    fpsim.matmul(a[:32], b, model=model)  # warm-up
    times = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        d = fpsim.matmul(a, b, model=model)
        times.append(time.perf_counter() - t)
    t_fast = min(times)

    tracemalloc.start()
    fpsim.matmul(a, b, model=model)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()

    times = []
    for _ in range(max(5, args.repeat)):
        t = time.perf_counter()
        np.matmul(a, b)
        times.append(time.perf_counter() - t)
    t_np = min(times)

    r = args.naive_rows
    t = time.perf_counter()
    dn = naive_bfma_gemm_rows(a, b, model, r)
    t_naive_rows = time.perf_counter() - t
    same = np.array_equal(dn.astype(np.float32).view(np.uint32), d[:r].view(np.uint32))
    t_naive = t_naive_rows * n / r  # extrapolated to the full GEMM

    gen = {}
    for name, rows in (("exact", n), ("fma_chain", 128)):
        gm = generic(name, input="fp16")
        t = time.perf_counter()
        fpsim.matmul(a[:rows, :], b[:, :rows], model=gm)
        gen[name] = (rows, rows * rows * n / (time.perf_counter() - t))

    print(f"fp16 GEMM {n}x{n}x{n} under {model.name} (k={model.k}, neab={model.neab})")
    print(f"  fpsim.matmul (h100 model): {t_fast:8.3f} s  {macs / t_fast / 1e6:8.1f} M MAC/s")
    print(f"  peak extra memory (tracemalloc): {peak / 2**20:8.1f} MiB")
    print(f"  numpy.matmul float32:      {t_np:8.4f} s  {macs / t_np / 1e6:8.1f} M MAC/s")
    print(f"  naive row-by-row model:    {t_naive:8.1f} s  {macs / t_naive / 1e6:8.3f} M MAC/s "
          f"(extrapolated from {r} rows; bit-identical: {same})")
    print(f"  ratio fpsim / numpy time:  {t_fast / t_np:8.1f}x slower")
    print(f"  ratio naive / fpsim time:  {t_naive / t_fast:8.1f}x faster than naive")
    for name, (rows, rate) in gen.items():
        print(f"  generic {name:10s} ({rows}x{n}x{rows}): {rate / 1e6:8.2f} M MAC/s")
    print(f"  load average during the run: {os.getloadavg()[0]:.1f} (on {os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
