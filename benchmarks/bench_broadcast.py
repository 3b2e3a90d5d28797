"""Benchmark: peak memory of broadcast ``fpsim.mma`` dots and batched GEMMs, as a multiple of their data.

Run:  python benchmarks/bench_broadcast.py [--numpy]

Broadcast operands (``dot`` with a (1000, 1, 512) against b (1, 100, 512); ``matmul`` with batch axes
(B1, 1) against (1, B2)) should cost memory in proportion to the data (inputs + output), not to the
broadcast product. For each case and model family this prints the peak Python (NumPy) allocation measured by
``tracemalloc`` during the call divided by the bytes of the inputs and the output, for the compiled kernels
(``fpsim/_cgemm.c``, where the model has one) and the NumPy reference (``use_c_gemm = False``). tracemalloc
does not see the compiled kernel's own buffers (16 bytes per input element of the call, i.e. of one
gathered chunk). The last case is ``fpsim.accumulate.matmul`` with the whole-array orders (exact, pairwise,
blocked), which built the whole (K, M, N) product tensor.
"""

from __future__ import annotations

import argparse
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np

import fpsim.accumulate as acc
from fpsim.mma import dot, gemm as G, matmul


def peak_ratio(fn: Callable[[], Any], data_bytes: int) -> tuple[float, float]:
    """(peak traced bytes during fn() / data_bytes, seconds)."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    t = time.perf_counter()
    try:
        fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak / data_bytes, time.perf_counter() - t


def cases() -> list[tuple[str, list[str], Callable[[str], Callable[[], Any]], int]]:
    """(name, models, model -> call, bytes of inputs + output)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((1000, 1, 512))
    b = rng.standard_normal((1, 100, 512))
    dot_bytes = a.nbytes + b.nbytes + 1000 * 100 * 8
    A = rng.standard_normal((32, 1, 8, 1024))
    B = rng.standard_normal((1, 32, 1024, 8))
    mat_bytes = A.nbytes + B.nbytes + 32 * 32 * 8 * 8 * 8
    A2 = rng.standard_normal((8, 1024))  # one shared A against a batch of B
    B2 = rng.standard_normal((1024, 1024, 8))
    shared_bytes = A2.nbytes + B2.nbytes + 1024 * 8 * 8 * 8
    av = np.broadcast_to(rng.standard_normal((1, 100, 512)), (300, 100, 512))  # a broadcast view
    bw = rng.standard_normal((300, 1, 512))
    view_bytes = 100 * 512 * 8 + bw.nbytes + 300 * 100 * 8
    x = rng.standard_normal((300, 400))
    y = rng.standard_normal((400, 200))
    acc_bytes = x.nbytes + y.nbytes + 300 * 200 * 8
    return [
        ("dot (1000,1,512) x (1,100,512)", DOT_MODELS, lambda mod: lambda: dot(a, b, None, mod), dot_bytes),
        ("matmul (32,1,8,1024) x (1,32,1024,8)", MATMUL_MODELS, lambda mod: lambda: matmul(A, B, model=mod),
         mat_bytes),
        ("matmul (8,1024) x (1024,1024,8)", MATMUL_MODELS, lambda mod: lambda: matmul(A2, B2, model=mod),
         shared_bytes),
        ("dot view (300,100,512)<-(1,100,512) x (300,1,512)", ["a100:fp16", "wide"],
         lambda mod: lambda: dot(av, bw, None, mod), view_bytes),
        ("accumulate.matmul (300,400) x (400,200)", ACC_ORDERS,
         lambda order: lambda: acc.matmul(x, y, "bf16", order=order), acc_bytes),
    ]


DOT_MODELS = ["a100:fp16", "h100:fp8_e4m3:fp16", "wide", "fma_chain", "pairwise", "exact", "mi300:fp16",
              "mi100:fp16"]
# The AMD kinds run the NumPy batch loop (no compiled kernel), which never copied the batch.
MATMUL_MODELS = ["a100:fp16", "h100:fp8_e4m3:fp16", "wide", "exact"]
ACC_ORDERS = ["exact", "pairwise", "blocked"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--numpy", action="store_true", help="also the NumPy reference path of fpsim.mma (slow)")
    ap.add_argument("--only", default="", help="run the cases whose name contains this text")
    args = ap.parse_args()
    print(f"{'case':50s} {'model/order':20s} {'path':7s} {'peak/data':>10s} {'s':>7s}")
    for name, models, make, nbytes in cases():
        if args.only not in name:
            continue
        for mod in models:
            paths = [True, False] if args.numpy and not name.startswith("acc") else [True]
            for use_c in paths:
                old = G.use_c_gemm
                G.use_c_gemm = use_c and G._cgemm is not None
                try:
                    ratio, sec = peak_ratio(make(mod), nbytes)
                finally:
                    G.use_c_gemm = old
                print(f"{name:50s} {mod:20s} {'default' if use_c else 'NumPy':7s} {ratio:10.1f} {sec:7.2f}", flush=True)


if __name__ == "__main__":
    main()
