"""Training-step speed: fpsim's fp32 policy vs PyTorch CPU eager, and every policy relative to fp32.

Run: python benchmarks/bench_train.py [--steps N] [--clock wall|cpu]
Both sides run single-threaded (BLAS and torch), on the demo's model (2 layers, width 64, sort task,
batch 32 x 20 tokens). Ratios are measured in one run; absolute times depend on the machine's load (printed).
``--clock cpu`` times with the process's CPU time (time.process_time) instead of the wall clock: on a machine
other jobs load, a single-threaded step's CPU time moves far less than its wall time (the compiled GEMM of
the bit-exact table runs 2 threads by default: its CPU time then counts both).
Last table: the step with every GEMM bit-exact under the h100 Tensor Core model (fp16-mixed, bf16-mixed)
against the fast emulated step of the same policy, and the share of that step spent in the device GEMMs (the runtime's entry fpsim.mma.gemm._matmul_values, same bits as fpsim.mma.matmul).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from fpsim.amp import get_policy, policy_names
from fpsim.nn import count_params, init_params
from fpsim.train import Trainer
from fpsim.train._threads import limit_blas_threads
from fpsim.train.demo import activation_bytes_per_token, demo_settings


def make_trainer(policy: Any, cfg: Any, telemetry: bool) -> Trainer:
    from dataclasses import replace

    c = replace(cfg, telemetry_every=1 if telemetry else 0, histogram_every=0, eval_every=0, steps=10 ** 6)
    tr = Trainer(policy, c)
    q = tr.policy.quant
    if q is not None and q.mode == "qat":
        tr.runtime.quant_active = True  # time the fake-quantized (fine-tuning) phase
    tr.step()  # warm-up (allocations, FP8 state)
    return tr


#: The clock the steps are timed with (``--clock``): the wall clock, or the process's CPU time.
clock = time.perf_counter


def time_steps(tr: Trainer, steps: int) -> float:
    t0 = clock()
    for _ in range(steps):
        tr.step()
    return (clock() - t0) / steps


def time_fpsim(policy: Any, cfg: Any, steps: int, telemetry: bool) -> float:
    return time_steps(make_trainer(policy, cfg, telemetry), steps)


def time_torch(cfg: Any, steps: int) -> float | None:
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return None
    torch.set_num_threads(1)
    m = cfg.model
    p = {k: torch.tensor(v, requires_grad=True) for k, v in init_params(m, seed=0).items()}
    opt = torch.optim.AdamW(list(p.values()), lr=1e-3, weight_decay=0.0)
    tr = Trainer("fp32", cfg)
    x, y = tr.batch(0)
    xi, yi = torch.tensor(x), torch.tensor(y)
    B, T = x.shape
    C, H = m.n_embd, m.n_head
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))

    def step() -> None:
        h = p["wte"][xi] + p["wpe"][:T]
        for i in range(m.n_layer):
            a = F.layer_norm(h, (C,), p[f"h{i}.ln1.g"], p[f"h{i}.ln1.b"])
            qkv = a @ p[f"h{i}.attn.qkv.w"] + p[f"h{i}.attn.qkv.b"]
            q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in qkv.split(C, dim=-1))
            att = ((q @ k.transpose(-2, -1)) * (1.0 / np.sqrt(C // H))).masked_fill(~mask, float("-inf")).softmax(-1)
            yy = (att @ v).transpose(1, 2).reshape(B, T, C)
            h = h + yy @ p[f"h{i}.attn.proj.w"] + p[f"h{i}.attn.proj.b"]
            mm = F.layer_norm(h, (C,), p[f"h{i}.ln2.g"], p[f"h{i}.ln2.b"])
            mm = F.gelu(mm @ p[f"h{i}.mlp.fc.w"] + p[f"h{i}.mlp.fc.b"], approximate="tanh")
            h = h + mm @ p[f"h{i}.mlp.proj.w"] + p[f"h{i}.mlp.proj.b"]
        h = F.layer_norm(h, (C,), p["lnf.g"], p["lnf.b"])
        loss = F.cross_entropy((h @ p["wte"].T).reshape(-1, m.vocab_size), yi.reshape(-1), ignore_index=-1)
        opt.zero_grad()
        loss.backward()
        opt.step()

    step()
    t0 = clock()
    for _ in range(steps):
        step()
    return (clock() - t0) / steps


class _MatmulClock:
    """Wall time spent in the runtime's bit-exact GEMM entry (fpsim.mma.gemm._matmul_values, the bits of
    fpsim.mma.matmul; 2-D GEMMs and batched ones apart) while installed."""

    def __init__(self) -> None:
        from fpsim.mma import gemm as gemm_mod

        self.mma, self.real = gemm_mod, gemm_mod._matmul_values
        self.gemm_mod, self.real_convert, self.real_c = gemm_mod, gemm_mod.convert_inputs, getattr(gemm_mod, "_cgemm", None)
        self.t2d = self.tbatch = self.tconvert = self.tkernel = 0.0
        self.n2d = self.nbatch = self.macs = 0

    def install(self) -> None:
        real, conv, ck = self.real, self.real_convert, self.real_c

        def timed_convert(*a: Any, **kw: Any) -> Any:  # the operands' re-conversion inside fpsim.mma.matmul
            t0 = clock()
            r = conv(*a, **kw)
            self.tconvert += clock() - t0
            return r

        class _Kernel:  # the compiled BFMA kernel's calls (fpsim/_cgemm.c), when it is built
            def __getattr__(_, name: str) -> Any:
                f = getattr(ck, name)
                if name != "bfma_gemm":
                    return f

                def timed_kernel(*a: Any) -> Any:
                    t0 = clock()
                    r = f(*a)
                    self.tkernel += clock() - t0
                    return r
                return timed_kernel

        self.gemm_mod.convert_inputs = timed_convert
        if ck is not None:
            self.gemm_mod._cgemm = _Kernel()

        def timed(a: Any, b: Any, c: Any, m: Any) -> Any:
            t0 = clock()
            r = real(a, b, c, m)
            dt = clock() - t0
            self.macs += int(np.prod(np.shape(r), dtype=np.int64)) * int(np.shape(a)[-1])
            if np.ndim(a) > 2 or np.ndim(b) > 2:
                self.tbatch += dt
                self.nbatch += 1
            else:
                self.t2d += dt
                self.n2d += 1
            return r

        self.mma._matmul_values = timed

    def remove(self) -> None:
        self.mma._matmul_values = self.real
        self.gemm_mod.convert_inputs = self.real_convert
        self.gemm_mod._cgemm = self.real_c


def bit_exact_table(cfg: Any, steps: int, rounds: int) -> None:
    """The step with every GEMM bit-exact under the h100 model (fp16 and bf16 policies) against the fast
    emulated step of the same policy, interleaved in the same rounds; then where the bit-exact step's time goes."""
    import os

    import fpsim.mma.gemm as gemm_mod
    from fpsim.train.bitexact import bit_exact_policy

    here = os.path.dirname(os.path.dirname(os.path.abspath(gemm_mod.__file__)))
    cgemm = sorted(f for f in os.listdir(here) if f.startswith("_cgemm") and f.endswith(".so"))
    flag = getattr(gemm_mod, "use_c_gemm", None)
    print(f"\nbit-exact h100 GEMMs (every GEMM of the model: linear, attention q k^T and p v, lm_head, and both "
          f"backward GEMMs of each), best of {rounds} interleaved rounds of {steps} steps; compiled GEMM: "
          f"{', '.join(cgemm) or 'not built'}, fpsim.mma.gemm.use_c_gemm = {flag!r}, threads: "
          f"fpsim.rounding.max_threads = {__import__('fpsim').rounding.max_threads!r}; load average "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    from fpsim import rounding

    pols = ("fp16-mixed", "bf16-mixed")
    fast = {n: make_trainer(n, cfg, False) for n in pols}
    exact = {n: make_trainer(bit_exact_policy(n, "h100"), cfg, False) for n in pols}
    bf: dict[str, float] = {}
    be: dict[str, float] = {}
    be1: dict[str, float] = {}
    clocks: dict[str, _MatmulClock] = {}
    saved = rounding.max_threads
    for _ in range(rounds):
        for n in pols:
            bf[n] = min(bf.get(n, float("inf")), time_steps(fast[n], max(steps, 5)))
            clk = _MatmulClock()  # where the time goes, kept from the fastest round
            clk.install()
            try:
                te = time_steps(exact[n], steps)
            finally:
                clk.remove()
            if te < be.get(n, float("inf")):
                be[n], clocks[n] = te, clk
            rounding.max_threads = 1  # the compiled GEMM on one thread, as the fast step's BLAS
            try:
                be1[n] = min(be1.get(n, float("inf")), time_steps(exact[n], steps))
            finally:
                rounding.max_threads = saved
    print("| policy | fast step ms | bit-exact h100 step ms | ratio (goal <= 2x) | bit-exact, GEMM on 1 thread | ratio "
          "| GEMMs per step |")
    print("|---|---|---|---|---|---|---|")
    for n in pols:
        print(f"| {n} | {1e3 * bf[n]:.1f} | {1e3 * be[n]:.1f} | {be[n] / bf[n]:.1f}x | {1e3 * be1[n]:.1f} | "
              f"{be1[n] / bf[n]:.1f}x | {(clocks[n].n2d + clocks[n].nbatch) // steps} |")
    for n in pols:
        clk, dt = clocks[n], be[n]
        for k in ("t2d", "tbatch", "n2d", "nbatch", "macs", "tconvert", "tkernel"):
            setattr(clk, k, getattr(clk, k) / steps)  # per step
        rest = dt - clk.t2d - clk.tbatch
        print(f"{n}@h100, a step {1e3 * dt:.0f} ms: the device GEMM entry (fpsim.mma.gemm._matmul_values) {100 * (clk.t2d + clk.tbatch) / dt:.0f}% "
              f"({clk.n2d:.0f} 2-D GEMMs {1e3 * clk.t2d:.0f} ms, {clk.nbatch:.0f} batched attention GEMMs "
              f"{1e3 * clk.tbatch:.0f} ms; {clk.macs / 1e6:.0f} M MACs, {clk.macs / 1e9 / (clk.t2d + clk.tbatch):.2f} "
              f"G MAC/s), the rest of the step {1e3 * rest:.0f} ms = {rest / bf[n]:.2f}x the fast step")
        inner = clk.t2d + clk.tbatch - clk.tkernel - clk.tconvert
        print(f"    inside that entry: compiled kernel calls {1e3 * clk.tkernel:.0f} ms "
              f"({100 * clk.tkernel / dt:.0f}% of the step; {clk.macs / 1e9 / clk.tkernel if clk.tkernel else 0:.2f} "
              f"G MAC/s), re-conversion of the already rounded operands (convert_inputs) {1e3 * clk.tconvert:.0f} ms "
              f"({100 * clk.tconvert / dt:.0f}%), the rest (checks, padding copies, batch loop) {1e3 * inner:.0f} ms "
              f"({100 * inner / dt:.0f}%)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--exact-steps", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    args = ap.parse_args()
    global clock
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    limit_blas_threads(1)
    import os

    print(f"load average {', '.join(f'{x:.2f}' for x in os.getloadavg())} (on {os.cpu_count()} CPUs); clock: "
          f"{'process CPU time' if args.clock == 'cpu' else 'wall'}")
    cfg = demo_settings().train_config()
    n = count_params(init_params(cfg.model))
    print(f"model: {cfg.model.n_layer} layers, width {cfg.model.n_embd}, {n} parameters; batch {cfg.batch_size} x "
          f"{cfg.model.block_size} tokens; best of {args.rounds} interleaved rounds of {args.steps} steps, single-threaded")
    # Interleaved rounds, best of each: the machine may be shared, and the minimum is the least disturbed.
    names = [n for n in policy_names() if not n.startswith("test-")]
    trainers = {(n, t): make_trainer(n, cfg, t) for n in names for t in (False, True)}
    best: dict[Any, float] = {}
    best_torch = float("inf")
    for _ in range(args.rounds):
        tt = time_torch(cfg, args.steps)
        if tt is not None:
            best_torch = min(best_torch, tt)
        for key, tr in trainers.items():
            best[key] = min(best.get(key, float("inf")), time_steps(tr, args.steps))
    t_torch = best_torch if np.isfinite(best_torch) else None
    t32, t32t = best[("fp32", False)], best[("fp32", True)]
    if t_torch is not None:
        print(f"PyTorch CPU eager step: {1e3 * t_torch:.1f} ms")
    vs = f"  ({t32 / t_torch:.2f}x PyTorch; goal <= 1)" if t_torch else ""
    print(f"fpsim fp32 step:        {1e3 * t32:.1f} ms{vs}")
    print(f"fpsim fp32 + telemetry: {1e3 * t32t:.1f} ms  ({t32t / t32:.2f}x)")
    print("\n| policy | ms/step | vs fp32 | with telemetry | vs fp32 |")
    print("|---|---|---|---|---|")
    for name in names:
        t, tt2 = best[(name, False)], best[(name, True)]
        print(f"| {name} | {1e3 * t:.1f} | {t / t32:.2f}x | {1e3 * tt2:.1f} | {tt2 / t32:.2f}x |")
    bit_exact_table(cfg, args.exact_steps, args.rounds)
    print(f"load average at the end {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("\nmemory ledger (bytes per parameter, AdamW) and activation bytes per token:")
    print("| policy | weights | grads | master | optimizer | total | activations/token |")
    print("|---|---|---|---|---|---|---|")
    for name in policy_names():
        if name.startswith("test-"):
            continue
        d = get_policy(name).memory_ledger()
        a = activation_bytes_per_token(name, cfg.model)
        print(f"| {name} | {d['weights']:g} | {d['grads']:g} | {d['master']:g} | {d['optimizer_state']:g} | "
              f"{d['total']:g} | {a:g} |")


if __name__ == "__main__":
    main()
