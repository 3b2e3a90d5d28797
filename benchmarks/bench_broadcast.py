"""Benchmark: peak memory of broadcast ``fpsim.mma`` dots and batched GEMMs, as a multiple of their data.

Run:  python benchmarks/bench_broadcast.py [--scale 1.0]

Broadcast operands (``dot`` with a (1000, 1, 512) against b (1, 100, 512); ``matmul`` with batch axes
(B1, 1) against (1, B2)) should cost memory in proportion to the data (inputs + output), not to the
broadcast product. For each case and model family this prints the peak Python (NumPy) allocation measured by
``tracemalloc`` during the call divided by the bytes of the inputs and the output, for the compiled kernels
(``fpsim/_cgemm.c``, where the model has one) and the NumPy reference (``use_c_gemm = False``). tracemalloc
does not see the compiled kernel's own buffers (16 bytes per input element of the call, i.e. of one
gathered chunk).
"""

from __future__ import annotations

import argparse
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np

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


def cases(scale: float) -> list[tuple[str, Callable[[str], Callable[[], Any]], int]]:
    rng = np.random.default_rng(0)
    r1, r2, k = max(1, int(1000 * scale)), max(1, int(100 * scale)), 512
    a = rng.standard_normal((r1, 1, k))
    b = rng.standard_normal((1, r2, k))
    dot_bytes = a.nbytes + b.nbytes + r1 * r2 * 8
    bb, mm, kk, nn = max(1, int(32 * scale)), 32, 256, 32
    A = rng.standard_normal((bb, 1, mm, kk))
    B = rng.standard_normal((1, bb, kk, nn))
    mat_bytes = A.nbytes + B.nbytes + bb * bb * mm * nn * 8
    A2 = rng.standard_normal((mm, kk))  # one shared A against a batch of B
    B2 = rng.standard_normal((bb * bb, kk, nn))
    shared_bytes = A2.nbytes + B2.nbytes + bb * bb * mm * nn * 8
    return [
        ("dot (1000,1,512) x (1,100,512)", lambda mod: lambda: dot(a, b, None, mod), dot_bytes),
        ("matmul (32,1,32,256) x (1,32,256,32)", lambda mod: lambda: matmul(A, B, model=mod), mat_bytes),
        ("matmul (32,256) x (1024,256,32)", lambda mod: lambda: matmul(A2, B2, model=mod), shared_bytes),
    ]


MODELS = ["a100:fp16", "h100:fp8_e4m3:fp16", "wide", "fma_chain", "pairwise", "exact", "mi300:fp16",
          "mi100:fp16"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=1.0, help="scale of the broadcast axes")
    ap.add_argument("--numpy", action="store_true", help="also the NumPy reference path (slow)")
    args = ap.parse_args()
    print(f"{'case':40s} {'model':22s} {'path':8s} {'peak/data':>10s} {'s':>8s}")
    for name, make, nbytes in cases(args.scale):
        for mod in MODELS:
            paths = [True, False] if args.numpy else [True]
            for use_c in paths:
                old = G.use_c_gemm
                G.use_c_gemm = use_c and G._cgemm is not None
                try:
                    ratio, sec = peak_ratio(make(mod), nbytes)
                finally:
                    G.use_c_gemm = old
                print(f"{name:40s} {mod:22s} {'C' if use_c else 'NumPy':8s} {ratio:10.1f} {sec:8.2f}", flush=True)


if __name__ == "__main__":
    main()
