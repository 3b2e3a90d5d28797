"""Speed of fpsim.quant.fake_quantize vs torch's CPU fake quantization, and of fpsim.scaling.mx_quantize
vs a plain fpsim.round, on 10M float32 values. Prints ratios measured in this run (best of N).

    python3 benchmarks/bench_quant.py [--n 10000000] [--repeat 5]
"""

from __future__ import annotations

import argparse

import numpy as np

import fpsim
import fpsim.quant as Q
import fpsim.scaling as S
from _timing import best




def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=10_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    n, rep = args.n, args.repeat
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(n) * 3).astype(np.float32)
    dy = np.ones_like(x)
    print(f"n = {n:,} float32 values, best of {rep}")

    rows = []
    t_fq = best(lambda: Q.fake_quantize(x, 0.05, 3, 0, 255), rep)
    t_fqm = best(lambda: Q.fake_quantize_with_mask(x, 0.05, 3, 0, 255), rep)
    t_grad = best(lambda: Q.fake_quantize_grad(dy, x, 0.05, 3, 0, 255), rep)
    try:
        import torch

        xt = torch.from_numpy(x)
        t_torch = best(lambda: torch.fake_quantize_per_tensor_affine(xt, 0.05, 3, 0, 255), rep)
        xg = xt.clone().requires_grad_(True)
        g = torch.from_numpy(dy)

        def torch_fwd_bwd() -> None:
            xg.grad = None
            torch.fake_quantize_per_tensor_affine(xg, 0.05, 3, 0, 255).backward(g)

        t_torch_fb = best(torch_fwd_bwd, rep)
        threads = torch.get_num_threads()
        rows.append(("fake_quantize (per tensor) vs torch forward", t_fq, t_torch))
        rows.append(("fake_quantize_with_mask + grad vs torch fwd+bwd", t_fqm + t_grad, t_torch_fb))
        print(f"torch {torch.__version__}, {threads} threads")
    except ImportError:
        print("torch not installed: fake_quantize ratios skipped")

    w = rng.standard_normal((1024, n // 1024)).astype(np.float32)
    t_pc = best(lambda: Q.fake_quantize(w, np.full(1024, 0.01, np.float32), np.zeros(1024, np.int32), -128, 127,
                                        axis=0), rep)
    try:
        import torch

        wt = torch.from_numpy(w)
        st, zt = torch.full((1024,), 0.01), torch.zeros(1024, dtype=torch.int32)
        t_pc_t = best(lambda: torch.fake_quantize_per_channel_affine(wt, st, zt, 0, -128, 127), rep)
        rows.append(("fake_quantize (per channel, axis 0) vs torch", t_pc, t_pc_t))
    except ImportError:
        pass

    # N(0, 90^2): few values beyond E4M3's 448, so the baseline and the scaled casts round alike
    # (saturating elements take the kernel's slower special path, which would skew the ratios).
    xs = x * np.float32(30)
    xs2 = xs * np.float32(2)
    t_round = best(lambda: fpsim.round(xs, "fp8_e4m3", overflow="saturate"), rep)
    t_round2 = best(lambda: fpsim.round(xs2, "fp8_e4m3", overflow="saturate"), rep)
    t_mx = best(lambda: S.mx_quantize(xs, "fp8_e4m3"), rep)
    t_mx_ceil = best(lambda: S.mx_quantize(xs, "fp8_e4m3", scale_rounding="ceil"), rep)
    t_q = best(lambda: S.quantize(xs, "fp8_e4m3", 2.0), rep)
    rows.append(("mx_quantize fp8_e4m3 (floor) vs fpsim.round", t_mx, t_round))
    rows.append(("mx_quantize fp8_e4m3 (ceil) vs fpsim.round", t_mx_ceil, t_round))
    rows.append(("scaling.quantize fp8_e4m3 (per tensor) vs fpsim.round", t_q, t_round2))

    print(f"{'case':55s} {'fpsim s':>9s} {'baseline s':>10s} {'ratio':>6s}")
    for name, a, b in rows:
        print(f"{name:55s} {a:9.3f} {b:10.3f} {a / b:6.2f}")


if __name__ == "__main__":
    main()
