"""Cost of fpsim's fused AdamW / SGD steps (bit-exact replays of torch's CPU kernels) against fpsim's
unfused step and against torch's own fused step on the same float32 tensors; and the cost of the
pure-BF16 update rules against the plain master-weight update. Prints ratios measured in this run.
The fused step is timed twice: with the compiled float32 FMA (``fma_f32`` in fpsim/_ckernel.c) and with
the NumPy emulation it replaces (``fpsim.amp.fused.use_c_fma = False``, the reference); results are the
same bits either way.

    python3 benchmarks/bench_fused.py [--n 1000000] [--tensors 8] [--repeat 5]
"""

from __future__ import annotations

import argparse

import numpy as np

from fpsim.amp import SGD, AdamW, MasterWeights, get_policy
from fpsim.amp import fused as fused_mod
from _timing import best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=1_000_000, help="parameters in all (split over --tensors)")
    ap.add_argument("--tensors", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    size = args.n // args.tensors + 3                      # not a multiple of 8: the scalar tail runs too
    names = [f"p{i}" for i in range(args.tensors)]
    w0 = {k: rng.standard_normal(size).astype(np.float32) for k in names}
    g = {k: (rng.standard_normal(size) * 1e-2).astype(np.float32) for k in names}
    n = size * args.tensors
    print(f"{n:,} float32 parameters in {args.tensors} tensors, best of {args.repeat}")

    def fp(opt: AdamW | SGD) -> float:
        w = {k: v.copy() for k, v in w0.items()}
        return best(lambda: opt.step(w, g), args.repeat)  # (without grad_scale the gradients are not written)

    rows = []
    for name, fused, unfused, tkw in (
            ("AdamW", AdamW(lr=1e-3, weight_decay=0.01, fused=True), AdamW(lr=1e-3, weight_decay=0.01),
             dict(lr=1e-3, weight_decay=0.01)),
            ("SGD (momentum 0.9)", SGD(lr=1e-2, momentum=0.9, fused=True), SGD(lr=1e-2, momentum=0.9),
             dict(lr=1e-2, momentum=0.9))):
        have_c = fused_mod.use_c_fma
        t_f = fp(fused)
        fused_mod.use_c_fma = False
        t_n = fp(fused)
        fused_mod.use_c_fma = have_c
        if not have_c:
            t_f = float("nan")
        t_u = fp(unfused)
        t_t = float("nan")
        try:
            import torch

            torch.set_num_threads(1)  # as fpsim's NumPy: one core
            ps = [torch.tensor(v.copy(), requires_grad=True) for v in w0.values()]
            for p, v in zip(ps, g.values()):
                p.grad = torch.tensor(v)
            topt = (torch.optim.AdamW if name == "AdamW" else torch.optim.SGD)(ps, fused=True, **tkw)
            t_t = best(topt.step, args.repeat)
        except ImportError:
            pass
        rows.append((name, t_f, t_n, t_u, t_t))
    print("fused C: the fused step with the compiled FMA; fused NumPy: with the NumPy FMA emulation")
    print(f"{'step':<20} {'fused C':>9} {'fused NumPy':>12} {'unfused':>9} {'torch fused':>12} "
          f"{'C/unfused':>10} {'C/torch':>8} {'NumPy/unfused':>14} {'NumPy/torch':>12}")
    for name, t_f, t_n, t_u, t_t in rows:
        print(f"{name:<20} {t_f * 1e3:7.1f}ms {t_n * 1e3:10.1f}ms {t_u * 1e3:7.1f}ms {t_t * 1e3:10.2f}ms "
              f"{t_f / t_u:10.2f} {t_f / t_t:8.1f} {t_n / t_u:14.2f} {t_n / t_t:12.1f}")

    print("\npure-BF16 update rules (MasterWeights.apply of one update, same tensors)")
    ups = {k: v * np.float32(1e-3) for k, v in g.items()}
    base = None
    for pol in ("bf16-mixed", "bf16-pure-rne", "bf16-pure-sr", "bf16-pure-kahan"):
        p = get_policy(pol)
        store = MasterWeights(w0, p, p.runtime(seed=0))
        t = best(lambda: store.apply(ups), args.repeat)
        base = t if base is None else base
        print(f"{pol:<18} {t * 1e3:8.1f} ms   x{t / base:.2f} of the FP32-master update")


if __name__ == "__main__":
    main()
