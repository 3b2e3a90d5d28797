"""Benchmark: fpsim's AMD MFMA models against MMA-Sim (``mmasim.amd.sim.MFMA``, CPU torch) on the same GEMM.

Run:  python benchmarks/bench_amd.py [--size 64] [--k 256] [--repeat 3]

For every AMD preset, one (size x k) @ (k x size) + C product of random N(0, 1) values of the preset's input
type: the best-of-`repeat` seconds of ``fpsim.matmul(A, B, C, model=...)`` and of MMA-Sim's ``MFMA(arch,
suffix)(A, B, C)`` (the tool a user would otherwise reach for), their ratio, and a bit-for-bit check of the
two results. MMA-Sim is what you would use instead of fpsim for AMD numerics, so the ratio is the point.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))

from _timing import best  # noqa: E402

import fpsim  # noqa: E402
from fpsim.mma import amd, get_model  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--k", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    import torch
    from mmasim.amd.sim import MFMA

    td = {"fp16": torch.float16, "bf16": torch.bfloat16, "bf16_1k": torch.bfloat16, "fp32": torch.float32,
          "xf32": torch.float32, "fp64": torch.float64, "fp8_e4m3fnuz": torch.float8_e4m3fnuz,
          "fp8_e5m2fnuz": torch.float8_e5m2fnuz, "fp8_bf8": torch.float8_e4m3fnuz, "bf8_fp8": torch.float8_e5m2fnuz}
    td_b = {**td, "fp8_bf8": torch.float8_e5m2fnuz, "bf8_fp8": torch.float8_e4m3fnuz}
    rng = np.random.default_rng(0)
    n, k = args.size, args.k
    print(f"GEMM ({n} x {k}) @ ({k} x {n}) + C, best of {args.repeat}; torch threads {torch.get_num_threads()}")
    print(f"{'preset':<24}{'kind':<13}{'fpsim s':>10}{'MMA-Sim s':>11}{'MMA-Sim/fpsim':>15}  bits")
    for key, (arch, suffix) in amd.INSTRUCTIONS.items():
        dev, inp, path = key
        if inp == "bf16_1k" or (dev == "mi250x" and inp == "bf16" and path == "bf16_1k"):
            continue  # same instruction as the default bf16 row
        m = get_model(dev, inp, "fp64" if inp == "fp64" else "fp32", path=path)
        dt = td[inp]
        odt = torch.float64 if inp == "fp64" else torch.float32
        A = torch.from_numpy(rng.standard_normal((n, k))).to(dt)
        B = torch.from_numpy(rng.standard_normal((k, n))).to(td_b[inp])
        C = torch.from_numpy(rng.standard_normal((n, n))).to(odt)
        a, b, c = (t.double().numpy() for t in (A, B, C))
        sim = MFMA(arch, suffix)
        t_f = best(lambda: fpsim.matmul(a, b, c, model=m), args.repeat)
        t_s = best(lambda: sim(A, B, C), args.repeat)
        same = np.array_equal(np.asarray(fpsim.matmul(a, b, c, model=m)), sim(A, B, C).double().numpy())
        pid = f"{dev} {inp}" + ("" if path is None else f" ({path})")
        print(f"{pid:<24}{m.kind:<13}{t_f:>10.4f}{t_s:>11.4f}{t_s / t_f:>14.2f}x  {'same' if same else 'DIFFER'}")


if __name__ == "__main__":
    main()
