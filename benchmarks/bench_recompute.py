"""Cost of activation recomputation: time per training step per checkpointing mode, as a ratio to no
checkpointing, beside the GEMM-FLOP ratio and the measured peak activation memory ratio.

Run: python benchmarks/bench_recompute.py [--steps N] [--rounds R] [--layers L ...]
Single-threaded BLAS; the demo's task and width (sort, 64 wide, 4 heads, batch 32 x 20 tokens), for
each number of layers given (default 2, the demo model, and 8). Time: CPU time of the process (less
disturbed than wall time on a shared machine; user time is the computation, system time mostly the page
faults of fresh large allocations: the minor page faults per step, ``getrusage().ru_minflt``, are printed,
the fewest of the rounds, and the system time as best user+system less best user) and wall time, each the best of R interleaved rounds of N
real Trainer steps per mode (each mode's trainer warmed up by one step first). Memory and FLOPs: one traced
step (fpsim.train.measure_step; deterministic). Flash rows appear when GPTConfig(attention="flash") runs.
"""

from __future__ import annotations

import argparse
import resource
import time
from dataclasses import replace
from typing import Any

from fpsim.train import Trainer, measure_step
from fpsim.train._threads import limit_blas_threads
from fpsim.train.demo import demo_settings
from fpsim.train.ledger import _flash_ok

MODES: list[tuple[str, Any, str]] = [("none", "none", "standard"), ("blocks", "blocks", "standard"),
                                     ("every 2nd", 2, "standard"), ("selective", "selective", "standard")]
FLASH: list[tuple[str, Any, str]] = [("flash", "none", "flash"), ("flash+blocks", "blocks", "flash")]


def _trainer(policy: str, cfg: Any, ck: Any, attn: str) -> Trainer:
    c = replace(cfg, model=replace(cfg.model, checkpoint=ck, attention=attn), telemetry_every=0, histogram_every=0,
                eval_every=0, steps=10 ** 6)
    tr = Trainer(policy, c)
    tr.step()  # warm-up
    return tr


def _time(tr: Trainer, steps: int) -> tuple[float, float, float, float]:
    """(wall, user CPU, user + system CPU) seconds and minor page faults (``ru_minflt``) per step."""
    t0, c0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(steps):
        tr.step()
    c1 = resource.getrusage(resource.RUSAGE_SELF)
    return ((time.perf_counter() - t0) / steps, (c1.ru_utime - c0.ru_utime) / steps,
            (c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime) / steps, (c1.ru_minflt - c0.ru_minflt) / steps)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--layers", type=int, nargs="+", default=[2, 8])
    ap.add_argument("--policies", nargs="+", default=["fp32", "bf16-mixed"])
    args = ap.parse_args()
    limit_blas_threads(1)
    base = demo_settings().train_config()
    assert base.model is not None
    for L in args.layers:
        model = replace(base.model, n_layer=L)
        cfg = replace(base, model=model)
        modes = MODES + (FLASH if _flash_ok(model) else [])
        for pol in args.policies:
            led = {name: measure_step(pol, cfg, checkpoint=ck, attention=at) for name, ck, at in modes}
            trs = {name: _trainer(pol, cfg, ck, at) for name, ck, at in modes}
            best: dict[str, list[float]] = {}
            for _ in range(args.rounds):  # interleaved: a burst of load hits every mode alike
                for name, tr in trs.items():
                    t = _time(tr, args.steps)
                    b = best.setdefault(name, [float("inf")] * 4)
                    best[name] = [min(x, y) for x, y in zip(b, t)]
            ref, (w0, u0, c0, _) = led["none"], best["none"]
            print(f"\n{L} layers, {pol}: batch {ref.batch} x {ref.seq_len} tokens; best of {args.rounds} rounds of "
                  f"{args.steps} steps; 'none' = {1e3 * w0:.1f} ms/step wall, {1e3 * u0:.1f} ms user CPU, "
                  f"{1e3 * c0:.1f} ms user+system; peak {ref.peak_device_bytes:,} B, {ref.flops / 1e6:.1f} MFLOP")
            print("| mode | user CPU / none | user+system CPU / none | wall / none | GEMM FLOPs / none "
                  "| peak activation bytes / none | peak at | minor page faults / step | system CPU ms / step |")
            print("|---|---|---|---|---|---|---|---|---|")
            for name, _, _ in modes:
                d = led[name]
                w, u, c, f = best[name]
                print(f"| {name} | {u / u0:.2f}x | {c / c0:.2f}x | {w / w0:.2f}x | {d.flops / ref.flops:.3f}x | "
                      f"{d.peak_device_bytes / ref.peak_device_bytes:.3f}x | {d.peak_device_event} | {f:,.0f} | "
                      f"{1e3 * (c - u):.1f} |")


if __name__ == "__main__":
    main()
