"""Benchmark: the compiled block-FMA GEMM's inner loops (issue 30): the integer loop, the AVX2 and AVX-512 loops.

Run:  python benchmarks/bench_gemm_loops.py [--size 512] [--repeat 7] [--old-so PATH] [--small]

For h100 fp16->fp32, bf16->fp32, fp8_e4m3->fp32 and fp8_e5m2->fp32, one size^3 GEMM (N(0,1) inputs) through
``fpsim.matmul`` with ``fpsim._cgemm.impl("scalar")`` (the integer reference loop), ``impl("avx2")`` and
``impl("avx512")`` (each where the CPU has it; ``"auto"``, the default, takes the widest), on 1 thread and on
the default threads; and
``numpy.matmul`` in float64 at 1024^3 for scale. ``--old-so`` adds a third variant: another build of
``_cgemm`` (e.g. the previous commit's, built into a scratch folder), loaded under the same name.

Each variant reports the best wall time and the best CPU time (``time.process_time``: all threads of this
process) of ``--repeat`` rounds, the variants interleaved in each round; emulated MAC/s are given from both.
``--small`` adds the demo model's GEMMs (640 x 64 @ 64 x 64, 640 x 64 @ 64 x 256, 640 x 256 @ 256 x 64):
``fpsim.matmul``, the training runtime's ``_matmul_values`` and the bare kernel call, to show the overhead.
On a shared machine the CPU time is the steadier measure: wall time counts the time other jobs hold the
cores. Every variant's result is compared bit for bit with the first one's. The load average is printed.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import time
from typing import Any

import numpy as np

import fpsim
from fpsim import rounding
from fpsim.mma import gemm as G
from fpsim.mma import get_model


def _load_so(path: str) -> Any:
    spec = importlib.util.spec_from_file_location("fpsim._cgemm", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path!r}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--old-so", default=None, help="another build of fpsim/_cgemm to compare")
    ap.add_argument("--small", action="store_true", help="also the demo model's small GEMMs (overhead)")
    args = ap.parse_args()
    new = G._cgemm
    if new is None or not hasattr(new, "impl"):
        raise SystemExit("fpsim._cgemm is not built (or has no impl()): build it first")
    variants: list[tuple[str, Any, str | None]] = [("integer loop", new, "scalar")]
    old = new.impl()
    for label, loop in (("AVX2 loop", "avx2"), ("AVX-512 loop", "avx512")):
        try:
            new.impl(loop)
            variants.append((label, new, loop))
        except ValueError as e:
            print(f"{label}: not run ({e})")
    new.impl(old)
    if args.old_so:
        variants.insert(0, ("old .so", _load_so(args.old_so), None))
    n = args.size
    macs = n**3
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n))
    b = rng.standard_normal((n, n))
    print(f"load average at start: {os.getloadavg()}; CPUs: {os.cpu_count()}")
    x = rng.standard_normal((1024, 1024))
    y = rng.standard_normal((1024, 1024))
    np.matmul(x, y)
    tw = tc = 1e9
    for _ in range(args.repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        np.matmul(x, y)
        tw, tc = min(tw, time.perf_counter() - t0), min(tc, time.process_time() - c0)
    np_rate = 1024**3 / tw / 1e9
    print(f"numpy.matmul float64 1024^3: {tw * 1e3:.1f} ms wall ({np_rate:.1f} G MAC/s), {tc * 1e3:.1f} ms CPU")
    old_impl, old_threads = new.impl(), rounding.max_threads
    try:
        for fin in ("fp16", "bf16", "fp8_e4m3", "fp8_e5m2"):
            m = get_model("h100", fin)
            for th in (1, None):
                rounding.max_threads = th
                best = {v[0]: (1e9, 1e9) for v in variants}
                bits: dict[str, np.ndarray] = {}
                for _ in range(args.repeat):
                    for name, mod, mode in variants:
                        G._cgemm = mod
                        if mode is not None:
                            mod.impl(mode)
                        t0, c0 = time.perf_counter(), time.process_time()
                        out = np.asarray(fpsim.matmul(a, b, model=m))
                        w, c = time.perf_counter() - t0, time.process_time() - c0
                        best[name] = (min(best[name][0], w), min(best[name][1], c))
                        bits[name] = out.view(np.uint64)
                first = bits[variants[0][0]]
                same = all(np.array_equal(first, v) for v in bits.values())
                label = "default threads" if th is None else "1 thread"
                print(f"h100 {fin}->fp32 {n}^3, {label}: bit-identical across variants: {same}")
                base = best[variants[0][0]][1]
                for name, (w, c) in best.items():
                    print(f"  {name:13s} {w * 1e3:7.1f} ms wall ({macs / w / 1e9:5.2f} G MAC/s, "
                          f"{macs / w / 1e9 / np_rate:.3f}x numpy f64), {c * 1e3:7.1f} ms CPU "
                          f"({macs / c / 1e9:5.2f} G MAC per CPU-second; {base / c:.2f}x the first)")
        if args.small:
            _small(variants, new, max(50, args.repeat * 20))
    finally:
        G._cgemm = new
        new.impl(old_impl)
        rounding.max_threads = old_threads
    print(f"load average at end: {os.getloadavg()}")


# The demo model's GEMMs (fpsim.train's MLP: a batch of 640 rows, widths 64 and 256)
SMALL = ((640, 64, 64), (640, 64, 256), (640, 256, 64))


def _small(variants: list[tuple[str, Any, str | None]], new: Any, repeat: int) -> None:
    """Small GEMMs: ``fpsim.matmul`` (float64 in: input rounding and checks), ``_matmul_values`` (the
    training runtime's entry: float32 values in and out) and the bare kernel call (the new build), best CPU
    and wall time of `repeat` interleaved rounds, so that the overhead outside the kernel shows."""
    m = get_model("h100", "fp16")
    kern = G._c_kernel(m)
    assert kern is not None
    rng = np.random.default_rng(1)
    for mm, kk, nn in SMALL:
        a = rng.standard_normal((mm, kk))
        b = rng.standard_normal((kk, nn))
        av = np.asarray(G.convert_inputs(a, m.input, None, "A"))
        bv = np.asarray(G.convert_inputs(b, m.b_format, None, "B"))
        a32, b32 = av.astype(np.float32), bv.astype(np.float32)
        for th in (1, None):
            rounding.max_threads = th
            nth = G._c_threads(mm * kk * nn)
            runs: list[tuple[str, Any, Any]] = []
            for name, mod, mode in variants:
                if mode == "scalar":
                    continue
                runs.append((f"{name}: matmul", mod, lambda: fpsim.matmul(a, b, model=m)))
                runs.append((f"{name}: _matmul_values", mod, lambda: G._matmul_values(a32, b32, None, m)))
            runs.append(("bare kernel call", new, lambda: new.bfma_gemm(
                av, bv, np.zeros((mm, nn)), mm, nn, kk, 0, kk, kern.params, nth, 32, min(nn, 128), 0, 1)))
            best = {r[0]: (1e9, 1e9) for r in runs}
            for _ in range(repeat):
                for name, mod, fn in runs:
                    G._cgemm = mod
                    if hasattr(mod, "impl"):
                        mod.impl("auto")
                    t0, c0 = time.perf_counter(), time.process_time()
                    fn()
                    w, c = time.perf_counter() - t0, time.process_time() - c0
                    best[name] = (min(best[name][0], w), min(best[name][1], c))
            G._cgemm = new
            label = "default threads" if th is None else "1 thread"
            print(f"h100 fp16->fp32 {mm}x{kk} @ {kk}x{nn}, {label} ({nth} in the kernel):")
            for name, (w, c) in best.items():
                print(f"  {name:28s} {w * 1e6:8.0f} us wall, {c * 1e6:8.0f} us CPU "
                      f"({mm * kk * nn / w / 1e9:5.2f} G MAC/s wall)")


if __name__ == "__main__":
    main()
