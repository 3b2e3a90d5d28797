"""Benchmark correctly rounded arithmetic, FPArray, the summation orders, to_bits and analyze against NumPy.

Run: python3 benchmarks/bench_arith.py [--n 1000000] [--nbits 10000000] [--repeat 9]
Every figure is a ratio of two timings taken in this one run (best of --repeat); the load average is printed.

Goals of issue 3: correctly rounded fp16/bf16 add and mul within 3x of NumPy's float16 add. Goals of issue 17
(section 2): fma fp32 within 5x of a float64 multiply-add, fpsim.sum(order="pairwise") within 10x of np.sum,
to_bits and analyze within 3x of np.copyto of the same float32 array (issue 30: on 1 and on 2 threads, bf16, fp16,
fp8 e4m3/e5m2). The compiled paths (fpsim/_carith.c) are timed beside their NumPy references (the module flags
that force them), so the speed-up shows in one run.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

import fpsim
from fpsim import accumulate, arith, bits, rounding
from fpsim.arith import Context
from _timing import best


@contextmanager
def _reference(module: Any, flag: str) -> Iterator[None]:
    """Force a NumPy reference path for the duration (its module flag off)."""
    old = getattr(module, flag)
    setattr(module, flag, False)
    try:
        yield
    finally:
        setattr(module, flag, old)


def _pair(fn: Callable[[], Any], module: Any, flag: str, rep: int) -> tuple[float, float]:
    """(compiled, NumPy reference) timings of fn, interleaved: best of rep rounds of one call each."""
    tc, tr = [], []
    for _ in range(max(1, rep // 3)):
        tc.append(best(fn, 3))
        with _reference(module, flag):
            tr.append(best(fn, 3))
    return min(tc), min(tr)




def _interleaved(fns: list[Callable[[], Any]], rounds: int) -> list[float]:
    """Best time of each of fns, called in turn for ``rounds`` rounds (after one warm-up call each)."""
    for fn in fns:
        fn()
    ts: list[list[float]] = [[] for _ in fns]
    for _ in range(rounds):
        for k, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            ts[k].append(time.perf_counter() - t0)
    return [min(t) for t in ts]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--seq", type=int, default=10_000, help="length of the sequential-sum timing")
    ap.add_argument("--nbits", type=int, default=10_000_000, help="float32 values for the to_bits/analyze timing")
    ap.add_argument("--rounds", type=int, default=9, help="rounds of the interleaved to_bits/analyze timing")
    a = ap.parse_args()
    n, rep = a.n, a.repeat
    print(f"load average at start: {', '.join(f'{v:.2f}' for v in os.getloadavg())}; "
          f"compiled hot paths (fpsim._carith): {'yes' if arith._carith is not None else 'NO (NumPy only)'}")
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

    e1 = d1 * 1.1  # arbitrary float64 operands (not fp32 values)
    t_fma64 = best(lambda: d1 * d2 + d3, rep)
    print(f"\nfma, ratio to a float64 multiply-add a * b + c ({t_fma64 * 1e3:.2f} ms; goal fp32 <= 5x); "
          "compiled path and its NumPy reference:")
    print(f"  {'operation':34s} {'compiled':>9s} {'ratio':>7s} {'NumPy ref':>10s} {'ratio':>7s}")
    fma_rows = [
        ("fpsim.fma fp32, fp32 operands", lambda: fpsim.fma(f1, f2, f3, "fp32")),
        ("fpsim.fma fp32, any f64 operands", lambda: fpsim.fma(e1, d2, d3, "fp32")),
        ("fpsim.fma bf16, fp32 operands", lambda: fpsim.fma(f1, f2, f3, "bf16")),
        ("fpsim.fma fp32 rtz, out=c (f32)", lambda: fpsim.fma(f1, f2, f3, "fp32", rounding="rtz", out=f3c)),
    ]
    f3c = f3.copy()
    for label, fn in fma_rows:
        tc, tr = _pair(fn, arith, "use_c_arith", rep)
        print(f"  {label:34s} {tc * 1e3:7.2f}ms {tc / t_fma64:6.2f}x {tr * 1e3:8.2f}ms {tr / t_fma64:6.2f}x")

    s = np.asarray(fpsim.round(rng.standard_normal(n), "fp32"))
    s32 = s.astype(np.float32)
    b16 = np.asarray(fpsim.round(rng.standard_normal(n), "bf16"))
    t_npsum = best(lambda: np.sum(s), rep)
    print(f"\nSums of {n:,} values, ratio to np.sum of the same float64 array ({t_npsum * 1e3:.3f} ms; goal "
          "pairwise <= 10x); compiled tree and the NumPy reference:")
    print(f"  {'operation':34s} {'compiled':>9s} {'ratio':>7s} {'NumPy ref':>10s} {'ratio':>7s}")
    sum_rows = [
        ("sum pairwise fp32 (float64 in)", lambda: fpsim.sum(s, "fp32", order="pairwise")),
        ("sum pairwise fp32 (float32 in)", lambda: fpsim.sum(s32, "fp32", order="pairwise")),
        ("sum pairwise fp16", lambda: fpsim.sum(x16, "fp16", order="pairwise")),
        ("sum pairwise bf16", lambda: fpsim.sum(b16, "bf16", order="pairwise")),
    ]
    for label, fn in sum_rows:
        tc, tr = _pair(fn, accumulate, "use_c_sum", rep)
        print(f"  {label:34s} {tc * 1e3:7.2f}ms {tc / t_npsum:6.2f}x {tr * 1e3:8.2f}ms {tr / t_npsum:6.2f}x")
    t_ex = best(lambda: fpsim.sum(s, "fp32", order="exact"), rep)
    print(f"  {'sum exact fp32':34s} {t_ex * 1e3:7.2f}ms {t_ex / t_npsum:6.2f}x")
    m = a.seq
    t_seq = best(lambda: fpsim.sum(x16[:m], "fp16"), max(1, rep // 2))
    t_seq2 = best(lambda: fpsim.sum(x16[: 1000 * 256].reshape(1000, 256), "fp16", axis=0), max(1, rep // 2))
    print(f"  sequential 1-D, {m:,} elements: {t_seq * 1e3:.1f} ms ({t_seq / m * 1e6:.1f} us per step)")
    print(f"  sequential over axis 0 of (1000, 256): {t_seq2 * 1e3:.1f} ms ({t_seq2 / 1000 * 1e6:.1f} us per step)")
    ctx = Context("fp16")
    one = np.ones(1)
    t_step = best(lambda: ctx.add(one, one, exact_inputs=True), 50)
    print(f"  one Context.add on a 1-element array: {t_step * 1e6:.1f} us")

    nb = a.nbits
    x = np.random.default_rng(1).standard_normal(nb).astype(np.float32)
    dst = np.empty_like(x)
    t_copy = best(lambda: np.copyto(dst, x), rep)
    t_fresh = best(lambda: x.copy(), rep)
    t_round = best(lambda: fpsim.round(x, "bf16"), rep)
    rounds = max(5, a.rounds)
    print(f"\nto_bits and analyze (RNE) of {nb:,} float32 N(0,1) values, ratio to np.copyto of the same array into "
          f"an existing one ({t_copy * 1e3:.2f} ms; goal <= 3x on 1 and on 2 threads); a copy into a fresh array "
          f"is {t_fresh / t_copy:.2f}x, fpsim.round bf16 {t_round / t_copy:.2f}x. Columns: the one-pass path "
          "(issue 30: the kernel hands each rounded block to the counts or the encoder while it is in cache), "
          "and the block-by-block compiled path it replaced (fpsim.rounding.use_sink = False; the NumPy references, "
          "use_c_analyze / use_c_bits = False, are 50-500x and not timed here); each row times np.copyto and its "
          f"candidates in turn, best of "
          f"{rounds} rounds, so load elsewhere hits them alike:")
    head = f"{'one pass':>9s} {'blocks':>8s}"
    print(f"  {'':18s} | {'1 thread':^18s} | {'2 threads':^18s}\n  {'operation':18s} | {head} | {head}")
    threads0 = rounding.max_threads
    try:
        for what, fn_of in (("to_bits", fpsim.to_bits), ("analyze", fpsim.analyze)):
            for fmt in ("bf16", "fp16", "fp8_e4m3", "fp8_e5m2"):
                cells = []
                for threads in (1, 2):
                    rounding.max_threads = threads

                    def call(fn_of: Any = fn_of, fmt: str = fmt) -> None:
                        fn_of(x, fmt)

                    def blocks() -> None:
                        with _reference(rounding, "use_sink"):
                            call()

                    tc, t1, tb = _interleaved([lambda: np.copyto(dst, x), call, blocks], rounds)
                    cells.append(f"{t1 / tc:8.2f}x {tb / tc:7.2f}x")
                print(f"  {what + ' ' + fmt:18s} | {cells[0]} | {cells[1]}", flush=True)
    finally:
        rounding.max_threads = threads0
    print(f"load average at end: {', '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
