"""Benchmark fpsim.round against ml_dtypes' cast round trip, NumPy float16 and a plain copy.

Run: python3 benchmarks/bench_round.py [--n 10000000] [--repeat 5]
All figures are ratios to np.copyto of the same float32 array, measured in this one run.
"""

from __future__ import annotations

import argparse
import tracemalloc

import ml_dtypes
import numpy as np

import fpsim
import fpsim.rounding as R
from _timing import best




def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--mem-n", type=int, default=100_000_000)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    normal = rng.standard_normal(a.n).astype(np.float32)
    wide = (rng.standard_normal(a.n) * np.exp2(rng.integers(-24, 12, a.n))).astype(np.float32)
    for label, x in (("N(0,1)", normal), ("wide: N(0,1) * 2**U{-24..11}", wide)):
        run(label, x, a.repeat)
    memory(a.mem_n)


def run(label: str, x: np.ndarray, repeat: int) -> None:
    x64 = x.astype(np.float64)
    dst = np.empty_like(x)
    t_copy = best(lambda: np.copyto(dst, x), repeat)
    print(f"\n{label}: n = {x.size:,} float32 values; np.copyto = {t_copy * 1e3:.2f} ms (1.00x)")
    print(f"{'format':10s} {'fpsim f32':>10s} {'ml_dtypes':>10s} {'fpsim/ml':>9s} {'fpsim f64':>10s} "
          f"{'f64/f32':>8s} {'SR':>8s} {'SR/RNE':>7s} {'threads':>8s}")
    a = argparse.Namespace(repeat=repeat)
    refs = {"bf16": ml_dtypes.bfloat16, "fp16": np.float16, "fp8_e4m3": ml_dtypes.float8_e4m3fn,
            "fp8_e5m2": ml_dtypes.float8_e5m2}
    for name, T in refs.items():
        R.max_threads = 1  # the comparisons are single-threaded, like ml_dtypes' casts
        t_f = best(lambda: fpsim.round(x, name), a.repeat)
        t_m = best(lambda: x.astype(T).astype(np.float32), a.repeat)
        t_64 = best(lambda: fpsim.round(x64, name), a.repeat)
        t_sr = best(lambda: fpsim.round(x, name, "sr", rng=np.random.default_rng(1)), a.repeat)
        R.max_threads = None  # default: the kernel shares large arrays among the CPUs
        t_th = best(lambda: fpsim.round(x, name), a.repeat)
        print(f"{name:10s} {t_f / t_copy:9.2f}x {t_m / t_copy:9.2f}x {t_f / t_m:8.2f}x "
              f"{t_64 / t_copy:9.2f}x {t_64 / t_f:7.2f}x {t_sr / t_copy:7.2f}x {t_sr / t_f:6.2f}x {t_th / t_copy:7.2f}x")


def memory(mem_n: int) -> None:
    # Peak extra memory for a large array (beyond input and output): chunking keeps it small.
    big = np.ones(mem_n, dtype=np.float32)
    tracemalloc.start()
    out = fpsim.round(big, "bf16")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    extra = peak - out.nbytes
    print(f"\npeak extra memory rounding {mem_n:,} float32 values to bf16: {extra / 2**20:.1f} MiB "
          f"({extra / big.nbytes:.3f} input sizes, output excluded)")


if __name__ == "__main__":
    main()
