"""Benchmark: emulated Tensor Core GEMMs (fpsim.mma): the compiled BFMA kernel, the NumPy reference, numpy.matmul.

Run:  python benchmarks/bench_mma.py [--size 512] [--naive-rows 2] [--repeat 5]

For h100 fp16->fp32, bf16->fp32 and fp8_e4m3->fp32, one size^3 GEMM (N(0,1) inputs) through

* ``fpsim.matmul`` with the compiled kernel (fpsim/_cgemm.c), single-threaded and with the default threads
  (``fpsim.rounding.max_threads = None``: one per CPU, at most 8);
* ``fpsim.matmul`` with the NumPy reference path (``fpsim.mma.gemm.use_c_gemm = False``);
* ``numpy.matmul`` in float32 (no emulation: what a user would run instead);
* a naive implementation of the same model written here (one output and one block at a time), timed on a few
  rows and extrapolated, and checked bit for bit against the first rows;

and the bit identity of the compiled and NumPy results over the whole GEMM. Timings are the best of
``--repeat`` runs, the variants interleaved in each round (the machine is shared: compare ratios from one
run, and read them beside the load average). Peak extra memory: tracemalloc sees only Python (NumPy)
allocations; the compiled kernel's own buffers (decomposed inputs, 16 bytes per input element, 4 (A) and
6 (B) more for the AVX2 loop's float32 copies, and
per-thread stack tiles of 128 lanes) are given as a computed bound beside it. Generic models: exact
(NumPy: BLAS on error-free slices), wide, fma_chain and pairwise (compiled kernel and NumPy reference).
"""

from __future__ import annotations

import argparse
import math
import os
import time
import tracemalloc

import numpy as np

import fpsim
from fpsim import rounding
from fpsim.mma import MMAModel, generic, get_model
from fpsim.mma import gemm as G


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


def _run(a: np.ndarray, b: np.ndarray, model: MMAModel, c_path: bool, threads: int | None) -> np.ndarray:
    old, oldt = G.use_c_gemm, rounding.max_threads
    G.use_c_gemm, rounding.max_threads = c_path, threads
    try:
        return np.asarray(fpsim.matmul(a, b, model=model))
    finally:
        G.use_c_gemm, rounding.max_threads = old, oldt


def _peak(fn: object) -> int:
    tracemalloc.start()
    fn()  # type: ignore[operator]
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--naive-rows", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=9)
    args = ap.parse_args()
    n = args.size
    macs = n**3
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, n)).astype(np.float32)
    y = rng.standard_normal((n, n)).astype(np.float32)
    have_c = getattr(G, "_cgemm", None) is not None
    load0 = os.getloadavg()
    print(f"GEMM {n}x{n}x{n}, N(0,1) inputs rounded to the model's input format; {os.cpu_count()} CPUs; "
          f"compiled kernel {'built' if have_c else 'NOT built (NumPy only)'}; best of {args.repeat}, interleaved")
    print(f"load average at start: {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}")
    hdr = (f"{'model':22s} {'variant':28s} {'time s':>9s} {'G MAC/s':>9s} {'vs NumPy ref':>13s} "
           f"{'vs np.matmul':>13s}")
    print(hdr)
    t_np = min(_time(lambda: np.matmul(x, y)) for _ in range(3))  # and once per round below
    summary = []
    fmts = ("fp16", "bf16", "fp8_e4m3")
    models = {fin: get_model("h100", fin, "fp32") for fin in fmts}
    ops = {fin: (np.asarray(fpsim.round(x, fin), dtype=np.float32),  # values of the input format
                 np.asarray(fpsim.round(y, fin), dtype=np.float32)) for fin in fmts}
    variants: dict[str, tuple[bool, int | None]] = {"NumPy reference": (False, None)}
    if have_c:
        variants = {"compiled, 1 thread": (True, 1), "compiled, default threads": (True, None), **variants}
    best = {(fin, name): math.inf for fin in fmts for name in variants}
    outs = {}
    for fin in fmts:  # warm-up (and the results compared below)
        for name, (cp, th) in variants.items():
            outs[fin, name] = _run(*ops[fin], models[fin], cp, th)
    for _ in range(args.repeat):  # every format and variant in each round: load changes hit all alike
        for fin in fmts:
            for name, (cp, th) in variants.items():
                t0 = time.perf_counter()
                _run(*ops[fin], models[fin], cp, th)
                best[fin, name] = min(best[fin, name], time.perf_counter() - t0)
        t_np = min(t_np, _time(lambda: np.matmul(x, y)))
    for fin in fmts:
        model = models[fin]
        a, b = ops[fin]
        ref = outs[fin, "NumPy reference"]
        same = None
        if have_c:
            same = (np.array_equal(outs[fin, "compiled, default threads"].view(np.uint32), ref.view(np.uint32)),
                    np.array_equal(outs[fin, "compiled, 1 thread"].view(np.uint32), ref.view(np.uint32)))
        r = args.naive_rows
        t0 = time.perf_counter()
        dn = naive_bfma_gemm_rows(a, b, model, r)
        t_naive = (time.perf_counter() - t0) * n / r
        naive_same = np.array_equal(dn.astype(np.float32).view(np.uint32), ref[:r].view(np.uint32))
        t_ref = best[fin, "NumPy reference"]
        for name, t in [(nm, best[fin, nm]) for nm in variants] + [("naive per-element (extrap.)", t_naive)]:
            print(f"{model.name:22s} {name:28s} {t:9.4f} {macs / t / 1e9:9.3f} {t_ref / t:12.2f}x "
                  f"{t / t_np:12.1f}x")
        peak_ref = _peak(lambda: _run(a, b, model, False, None))
        line = f"{'':22s} peak extra memory (tracemalloc): NumPy path {peak_ref / 2**20:.1f} MiB"
        if have_c:
            peak_c = _peak(lambda: _run(a, b, model, True, None))
            c_own = 16 * 2 * n * n + 2 * n * n // model.k  # int32 significands + exponents of A and B, flags
            c_own += 4 * n * n + 6 * n * n  # the AVX2 loop's float32 A and packed B (issue 30; where it runs)
            line += (f", compiled path {peak_c / 2**20:.1f} MiB (Python side) + {c_own / 2**20:.1f} MiB in C "
                     f"(decomposed inputs, float32 copies) + 8 KiB stack tiles per thread")
        print(line)
        print(f"{'':22s} bit-identical: compiled vs NumPy {same if same is not None else 'n/a'} "
              f"(default threads, 1 thread); naive rows vs NumPy {naive_same}")
        if have_c:
            summary.append((fin, macs / best[fin, "compiled, default threads"] / 1e9,
                            t_ref / best[fin, "compiled, default threads"], macs / best[fin, "compiled, 1 thread"] / 1e9))
    print(f"{'numpy.matmul float32':22s} {'(no emulation)':28s} {t_np:9.4f} {macs / t_np / 1e9:9.3f}")
    # Generic models: exact (BLAS on error-free slices, NumPy), wide and fma_chain (compiled and NumPy)
    print("generic models (fp16 inputs; exact has no compiled kernel: BLAS on error-free slices):")
    for name, rows in (("exact", n), ("wide", 128), ("fma_chain", 128), ("pairwise", 128)):
        gm = generic(name, input="fp16")
        xs, ys = x[:rows, :], y[:, :rows]
        res = {}
        for label, cp in (("compiled", True), ("NumPy", False)):
            if name == "exact" and cp:
                continue
            best_t = math.inf
            for _ in range(max(1, args.repeat // 2)):
                t0 = time.perf_counter()
                res[label] = _run(xs, ys, gm, cp, None)
                best_t = min(best_t, time.perf_counter() - t0)
            rate = rows * rows * n / best_t
            print(f"  {name:10s} {rows}x{n}x{rows} {label:9s} {best_t:9.4f} s {rate / 1e9:8.3f} G MAC/s")
        if len(res) == 2:
            print(f"  {name:10s} bit-identical compiled vs NumPy: "
                  f"{np.array_equal(res['compiled'].view(np.uint32), res['NumPy'].view(np.uint32))}")
    if summary:
        f16, f16s = summary[0][1], summary[0][3]
        print("goals (issue 17): h100 fp16 >= 2 G MAC/s and >= 4x the NumPy path; bf16, fp8 within 1.5x of fp16")
        for fin, rate, ratio, rate1 in summary:
            print(f"  {fin:9s} {rate:6.2f} G MAC/s (default threads), {ratio:5.1f}x the NumPy path, fp16/this = "
                  f"{f16 / rate:4.2f}; 1 thread {rate1:5.2f} G MAC/s, fp16/this = {f16s / rate1:4.2f}")
    load1 = os.getloadavg()
    print(f"load average at end: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")


def _time(fn: object) -> float:
    t0 = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
