"""Benchmark correctly rounded arithmetic, FPArray and the summation orders against plain NumPy.

Run: python3 benchmarks/bench_arith.py [--n 1000000] [--repeat 5]
Every figure is a ratio of two timings taken in this one run (best of --repeat).

Goals of issue 3: correctly rounded fp16/bf16 add and mul within 3x of NumPy's float16 add, fma within 10x
of a float64 multiply-add.
"""

from __future__ import annotations

import argparse

import numpy as np

import fpsim
from fpsim.arith import Context
from _timing import best




def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--seq", type=int, default=10_000, help="length of the sequential-sum timing")
    a = ap.parse_args()
    n, rep = a.n, a.repeat
    rng = np.random.default_rng(0)
    h1 = rng.standard_normal(n).astype(np.float16)
    h2 = rng.standard_normal(n).astype(np.float16)
    x16, y16 = h1.astype(np.float64), h2.astype(np.float64)  # values of fp16 (and, rounded, of bf16)
    b1 = np.asarray(fpsim.round(rng.standard_normal(n), "bf16"))
    b2 = np.asarray(fpsim.round(rng.standard_normal(n), "bf16"))
    f1 = rng.standard_normal(n).astype(np.float32)
    f2 = rng.standard_normal(n).astype(np.float32)
    f3 = rng.standard_normal(n).astype(np.float32)
    d1, d2, d3 = f1.astype(np.float64), f2.astype(np.float64), f3.astype(np.float64)

    t_np16 = best(lambda: np.add(h1, h2), rep)
    t_np64 = best(lambda: np.add(d1, d2), rep)
    t_round = best(lambda: fpsim.round(x16, "fp16"), rep)
    print(f"n = {n:,}; np.add float16 = {t_np16 * 1e3:.2f} ms, np.add float64 = {t_np64 * 1e3:.2f} ms, "
          f"fpsim.round fp16 (float64 in) = {t_round * 1e3:.2f} ms")
    print("\nCorrectly rounded elementwise operations, ratio to np.add on float16 arrays (goal <= 3x):")
    rows = [
        ("fpsim.add fp16 rne", lambda: fpsim.add(x16, y16, "fp16")),
        ("fpsim.add fp16 rtz", lambda: fpsim.add(x16, y16, "fp16", rounding="rtz")),
        ("fpsim.add bf16 rne", lambda: fpsim.add(b1, b2, "bf16")),
        ("fpsim.mul fp16 rne", lambda: fpsim.mul(x16, y16, "fp16")),
        ("fpsim.mul bf16 rne", lambda: fpsim.mul(b1, b2, "bf16")),
        ("fpsim.div fp16 rne", lambda: fpsim.div(x16, y16, "fp16")),
        ("fpsim.sqrt fp16 rne", lambda: fpsim.sqrt(np.abs(x16), "fp16")),
    ]
    x_arr, y_arr = fpsim.array(x16, "fp16"), fpsim.array(y16, "fp16")
    rows.append(("FPArray fp16 x + y", lambda: x_arr + y_arr))
    rows.append(("FPArray fp16 x * y", lambda: x_arr * y_arr))
    for label, fn in rows:
        t = best(fn, rep)
        print(f"  {label:24s} {t * 1e3:8.2f} ms  {t / t_np16:6.2f}x")

    t_fma64 = best(lambda: d1 * d2 + d3, rep)
    t_fma = best(lambda: fpsim.fma(f1, f2, f3, "fp32"), rep)
    t_fma_any = best(lambda: fpsim.fma(d1 * 1.1, d2, d3, "fp32"), rep)
    print("\nfma, ratio to a float64 multiply-add a * b + c (goal <= 10x):")
    print(f"  {'fpsim.fma fp32 (fp32 in)':24s} {t_fma * 1e3:8.2f} ms  {t_fma / t_fma64:6.2f}x")
    print(f"  {'fpsim.fma fp32 (any f64)':24s} {t_fma_any * 1e3:8.2f} ms  {t_fma_any / t_fma64:6.2f}x")

    s = np.asarray(fpsim.round(rng.standard_normal(n), "fp32"))
    t_npsum = best(lambda: np.sum(s), rep)
    t_pw = best(lambda: fpsim.sum(s, "fp32", order="pairwise"), rep)
    t_pw16 = best(lambda: fpsim.sum(x16, "fp16", order="pairwise"), rep)
    t_ex = best(lambda: fpsim.sum(s, "fp32", order="exact"), rep)
    print("\nSums, ratio to np.sum of the same float64 array:")
    print(f"  {'np.sum':24s} {t_npsum * 1e3:8.2f} ms  {1:6.2f}x")
    print(f"  {'fpsim.sum fp32 pairwise':24s} {t_pw * 1e3:8.2f} ms  {t_pw / t_npsum:6.2f}x")
    print(f"  {'fpsim.sum fp16 pairwise':24s} {t_pw16 * 1e3:8.2f} ms  {t_pw16 / t_npsum:6.2f}x")
    print(f"  {'fpsim.sum exact':24s} {t_ex * 1e3:8.2f} ms  {t_ex / t_npsum:6.2f}x")
    m = a.seq
    t_seq = best(lambda: fpsim.sum(x16[:m], "fp16"), max(1, rep // 2))
    t_seq2 = best(lambda: fpsim.sum(x16[: 1000 * 256].reshape(1000, 256), "fp16", axis=0), max(1, rep // 2))
    print(f"  sequential 1-D, {m:,} elements: {t_seq * 1e3:.1f} ms ({t_seq / m * 1e6:.1f} us per step)")
    print(f"  sequential over axis 0 of (1000, 256): {t_seq2 * 1e3:.1f} ms ({t_seq2 / 1000 * 1e6:.1f} us per step)")
    ctx = Context("fp16")
    one = np.ones(1)
    t_step = best(lambda: ctx.add(one, one, exact_inputs=True), 50)
    print(f"  one Context.add on a 1-element array: {t_step * 1e6:.1f} us")


if __name__ == "__main__":
    main()
