"""Benchmark fpsim.round against CPFloat, ml_dtypes' cast round trip, NumPy float16 and a plain copy.

Run: python3 benchmarks/bench_round.py [--n 10000000] [--repeat 15] [--threads T] [--mem-n 100000000]

Every figure is a ratio to ``np.copyto`` of the same float32 array into an existing one (single-threaded),
measured in this one run: the candidates are timed in turn, round after round, and each keeps its best
time, so a burst of load elsewhere hits them alike. Columns, single-threaded and then with T threads
(``fpsim.rounding.max_threads``; CPFloat's OpenMP thread count):

- ``fpsim``: ``fpsim.round(x, fmt, mode)``, a new result array (its first-touch page faults included: a
  copy into a new array, ``x.copy()``, costs the ``fresh copy`` ratio printed above each table);
- ``out=``: ``fpsim.round(x, fmt, mode, out=y)`` into an existing array (what CPFloat does);
- ``CPFloat``: ``cpfloatf_sequential`` / ``cpfloatf_parallel`` into an existing array (benchmarks/_cpfloat.py,
  built from its headers; skipped with the reason when absent). Its fp8_e4m3 is the IEEE-style E4M3 (max
  240), the nearest format it can express; SR is its own PCG32 stream (fpsim's: the NumPy generator's words);
- ``out/CPF``: fpsim ``out=`` time over CPFloat's (below 1: fpsim faster);
- ``xT``: the speed-up of T threads over one (fpsim, new result).

A second table has ml_dtypes' cast round trip ``x.astype(T).astype(np.float32)`` (NumPy's float16 for fp16)
and fpsim on the same values as float64, single-threaded, RNE.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

import fpsim
import fpsim.rounding as R

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _cpfloat

FORMATS = {"bf16": ml_dtypes.bfloat16, "fp16": np.float16, "fp8_e4m3": ml_dtypes.float8_e4m3fn,
           "fp8_e5m2": ml_dtypes.float8_e5m2}
MODES = ["rne", "sr", "sr-philox"]  # sr-philox: rng=fpsim.random.Philox (issue 30)


def measure(cands: dict[str, Callable[[], Any]], repeat: int) -> dict[str, float]:
    """Best time of each candidate, timed in turn (after one warm-up call each)."""
    for fn in cands.values():
        fn()
    best = dict.fromkeys(cands, float("inf"))
    for _ in range(repeat):
        for k, fn in cands.items():
            t0 = time.perf_counter()
            fn()
            best[k] = min(best[k], time.perf_counter() - t0)
    return best


def with_threads(threads: int | None, fn: Callable[[], Any]) -> Callable[[], Any]:
    def run() -> Any:
        old = R.max_threads
        R.max_threads = threads
        try:
            return fn()
        finally:
            R.max_threads = old
    return run


def run(label: str, x: np.ndarray, repeat: int, T: int, results: list[dict[str, Any]]) -> None:
    dst = np.empty_like(x)
    y = np.empty_like(x)
    cpf = _cpfloat.available()
    cands: dict[str, Callable[[], Any]] = {"copy": lambda: np.copyto(dst, x), "fresh": lambda: x.copy()}
    for fmt in FORMATS:
        for mode in MODES:
            def rng(md: str = mode) -> Any:
                return (np.random.default_rng(1) if md == "sr" else fpsim.random.Philox(1) if md == "sr-philox"
                        else None)
            fm = mode.split("-")[0]  # the rounding mode; CPFloat's SR stands beside both streams
            for th, tag in ((1, "1"), (T, "T")):
                cands[f"{fmt}/{mode}/fpsim/{tag}"] = with_threads(th, lambda f=fmt, m=fm, g=rng: fpsim.round(x, f, m, rng=g()))
                cands[f"{fmt}/{mode}/out/{tag}"] = with_threads(
                    th, lambda f=fmt, m=fm, g=rng: fpsim.round(x, f, m, rng=g(), out=y))
                if cpf:
                    cands[f"{fmt}/{mode}/cpf/{tag}"] = lambda f=fmt, m=fm, t=th: _cpfloat.round(x, y, f, m, threads=t)
    load = os.getloadavg()
    t = measure(cands, repeat)
    c = t["copy"]
    print(f"\n{label}: n = {x.size:,} float32 values; np.copyto = {c * 1e3:.2f} ms (1.00x); "
          f"fresh copy (x.copy()) {t['fresh'] / c:.2f}x; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    hdr = f"{'format':9s} {'mode':4s} |"
    for tag in ("1 thread", f"{T} threads"):
        hdr += f" {tag + ': fpsim':>16s} {'out=':>6s} {'CPFloat':>7s} {'out/CPF':>7s} |"
    print(hdr + f" {'x' + str(T):>5s}")
    for fmt in FORMATS:
        for mode in MODES:
            row = f"{fmt:9s} {mode:4s} |"
            rec: dict[str, Any] = {"dist": label, "fmt": fmt, "mode": mode}
            for tag in ("1", "T"):
                f_, o_ = t[f"{fmt}/{mode}/fpsim/{tag}"] / c, t[f"{fmt}/{mode}/out/{tag}"] / c
                p_ = t[f"{fmt}/{mode}/cpf/{tag}"] / c if cpf else float("nan")
                rec.update({f"fpsim{tag}": f_, f"out{tag}": o_, f"cpf{tag}": p_})
                cp = f"{p_:6.2f}x {o_ / p_:6.2f}x" if cpf else f"{'-':>7s} {'-':>7s}"
                row += f" {f_:15.2f}x {o_:5.2f}x {cp} |"
            rec["scale"] = t[f"{fmt}/{mode}/fpsim/1"] / t[f"{fmt}/{mode}/fpsim/T"]
            results.append(rec)
            print(row + f" {rec['scale']:5.2f}")
    # ml_dtypes and float64 input, single-threaded RNE
    x64 = x.astype(np.float64)
    c2: dict[str, Callable[[], Any]] = {"copy": lambda: np.copyto(dst, x)}
    for fmt, T_ in FORMATS.items():
        c2[f"{fmt}/fpsim"] = with_threads(1, lambda f=fmt: fpsim.round(x, f))
        c2[f"{fmt}/ml"] = lambda T_=T_: x.astype(T_).astype(np.float32)
        c2[f"{fmt}/f64"] = with_threads(1, lambda f=fmt: fpsim.round(x64, f))
    t2 = measure(c2, max(3, repeat // 2))
    c = t2["copy"]
    print(f"{'format':9s} {'fpsim':>7s} {'ml_dtypes':>9s} {'fpsim/ml':>8s} {'fpsim f64':>9s} {'f64/f32':>7s}   (RNE, 1 thread)")
    for fmt in FORMATS:
        a, m, d = t2[f"{fmt}/fpsim"] / c, t2[f"{fmt}/ml"] / c, t2[f"{fmt}/f64"] / c
        print(f"{fmt:9s} {a:6.2f}x {m:8.2f}x {a / m:7.2f}x {d:8.2f}x {d / a:6.2f}x")


def goals(results: list[dict[str, Any]], T: int) -> None:
    """Issue 17's goals, from the tables above (worst case over both inputs)."""
    print(f"\ngoals (issue 17), worst over both inputs; ratios to np.copyto; T = {T}:")
    for fmt in FORMATS:
        for mode in MODES:
            rs = [r for r in results if r["fmt"] == fmt and r["mode"] == mode]
            w = {k: max(r[k] for r in rs) for k in ("fpsim1", "out1", "fpsimT", "outT")}
            vs = {k: max(r[f"out{k}"] / r[f"cpf{k}"] for r in rs) for k in ("1", "T")}
            cp = (f"; out=/CPFloat {vs['1']:.2f} (1 thread) {vs['T']:.2f} ({T})" if all(
                r["cpf1"] == r["cpf1"] for r in rs) else "")
            print(f"  {fmt:9s} {mode}: 1 thread {w['fpsim1']:.2f}x (out= {w['out1']:.2f}x), {T} threads "
                  f"{w['fpsimT']:.2f}x (out= {w['outT']:.2f}x), scaling {min(r['scale'] for r in rs):.2f}-"
                  f"{max(r['scale'] for r in rs):.2f}{cp}")


def memory(mem_n: int) -> None:
    # Peak extra memory for a large array (beyond input and output): no temporaries at all.
    if mem_n <= 0:  # --mem-n 0: skipped
        return
    big = np.ones(mem_n, dtype=np.float32)
    tracemalloc.start()
    out = fpsim.round(big, "bf16")
    fpsim.round(big, "fp8_e4m3", "sr", rng=np.random.default_rng(0), out=out)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    extra = peak - out.nbytes
    print(f"\npeak extra memory rounding {mem_n:,} float32 values (bf16 RNE, then fp8_e4m3 SR with out=): "
          f"{extra / 2**20:.1f} MiB ({extra / big.nbytes:.3f} input sizes, output excluded)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10_000_000)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--threads", type=int, default=None, help="T (default: fpsim's default, one per CPU, at most 8)")
    ap.add_argument("--mem-n", type=int, default=100_000_000)
    a = ap.parse_args()
    T = a.threads or min(os.cpu_count() or 1, 8)
    print(f"fpsim {fpsim.__version__}; NumPy {np.__version__}; {os.cpu_count()} CPUs; T = {T} threads; "
          f"compiled kernel: {'yes' if R.use_c_kernel else 'NO (NumPy reference kernel)'}")
    print(_cpfloat.info() if _cpfloat.available() else f"CPFloat skipped: {_cpfloat.skip_reason()}")
    rng = np.random.default_rng(0)
    normal = rng.standard_normal(a.n).astype(np.float32)
    wide = (rng.standard_normal(a.n) * np.exp2(rng.integers(-24, 12, a.n))).astype(np.float32)
    results: list[dict[str, Any]] = []
    for label, x in (("N(0,1)", normal), ("wide: N(0,1) * 2**U{-24..11}", wide)):
        run(label, x, a.repeat, T, results)
    goals(results, T)
    memory(a.mem_n)


if __name__ == "__main__":
    main()
