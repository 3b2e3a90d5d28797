"""Benchmark: fpsim's Blackwell block-scaled MMA against MMA-Sim (``TCGen05MMABlockScale``, CPU torch).

Run:  python benchmarks/bench_blockscaled.py [--m 128] [--n 128] [--k 512] [--repeat 3]

For each kind (``mxf8f6f4`` e4m3 x e4m3, ``mxf8f6f4`` e2m1 x e4m3, ``mxf4`` and ``mxf4nvf4`` with UE4M3 per 16),
one (m x k) @ (k x n) product of random codes with random scales, chained along K: the best-of-`repeat`
seconds of :func:`fpsim.mma.matmul_block_scaled` and of MMA-Sim called once per instruction (what a user would
otherwise run), their ratio, and a bit-for-bit check of the two results.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))

from _timing import best  # noqa: E402

import fpsim  # noqa: E402
from fpsim.mma import block_scaled_model, matmul_block_scaled  # noqa: E402

PTX = {"fp8_e4m3": "e4m3", "fp4_e2m1": "e2m1"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, default=128)
    ap.add_argument("--n", type=int, default=128)
    ap.add_argument("--k", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    import torch
    from mmasim.nv_ptx.sim import TCGen05MMABlockScale

    rng = np.random.default_rng(0)
    m, n, k = args.m, args.n, args.k
    print(f"A ({m} x {k}) @ B ({k} x {n}), best of {args.repeat}; MMA-Sim one call per instruction")
    print(f"{'kind':34s} {'fpsim s':>9s} {'MMA-Sim s':>10s} {'ratio':>7s}  bits")
    for kind, fa, fb, blk, sf in (("mxf8f6f4", "fp8_e4m3", "fp8_e4m3", 32, "ue8m0"),
                                  ("mxf8f6f4", "fp4_e2m1", "fp8_e4m3", 32, "ue8m0"),
                                  ("mxf4", "fp4_e2m1", "fp4_e2m1", 32, "ue8m0"),
                                  ("mxf4nvf4", "fp4_e2m1", "fp4_e2m1", 16, "ue4m3")):
        def codes(fmt: str, shape: tuple[int, int]) -> np.ndarray:
            f = fpsim.formats.as_format(fmt)
            c = rng.integers(0, 1 << f.width, size=shape).astype(np.uint8)
            c[~np.isfinite(np.asarray(fpsim.from_bits(c, f), dtype=np.float64))] = 0
            return c

        ca, cb = codes(fa, (m, k)), codes(fb, (k, n))
        if sf == "ue8m0":
            sa = rng.integers(115, 140, (m, k // blk)).astype(np.uint8)
            sb = rng.integers(115, 140, (k // blk, n)).astype(np.uint8)
        else:
            sa = rng.integers(0x30, 0x50, (m, k // blk)).astype(np.uint8)
            sb = rng.integers(0x30, 0x50, (k // blk, n)).astype(np.uint8)
        model = block_scaled_model("b200", kind, fa, fb, block=blk, scale=sf)
        av = np.asarray(fpsim.from_bits(ca, fa), dtype=np.float64)
        bv = np.asarray(fpsim.from_bits(cb, fb), dtype=np.float64)
        c0 = np.zeros((m, n))
        ours = matmul_block_scaled(av, bv, c0, scale_a=sa, scale_b=sb, model=model)
        t_ours = best(lambda: matmul_block_scaled(av, bv, c0, scale_a=sa, scale_b=sb, model=model), args.repeat)

        ki = model.k
        op = TCGen05MMABlockScale("Blackwell", f"m{m}n{n}k{ki}.kind::{kind}.block{blk}.f32.{PTX[fa]}.{PTX[fb]}.{sf}")
        sview = torch.float8_e8m0fnu if sf == "ue8m0" else torch.float8_e4m3fn

        def elem(x: np.ndarray, fmt: str) -> torch.Tensor:
            t = torch.from_numpy(np.ascontiguousarray(x))
            return t.view(torch.float8_e4m3fn) if fmt == "fp8_e4m3" else t << 2

        def packed(x: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray((x[..., 0::2] << 4) | x[..., 1::2]))

        def ref() -> np.ndarray:
            acc = torch.zeros((m, n), dtype=torch.float32)
            per = ki // blk
            for t, k0 in enumerate(range(0, k, ki)):
                if ki == 64:
                    ta, tb = packed(ca[:, k0:k0 + ki]), packed(cb[k0:k0 + ki].T).T
                else:
                    ta, tb = elem(ca[:, k0:k0 + ki], fa), elem(cb[k0:k0 + ki], fb)
                acc = op(ta, tb, acc, torch.from_numpy(np.ascontiguousarray(sa[:, t * per:(t + 1) * per])).view(sview),
                         torch.from_numpy(np.ascontiguousarray(sb[t * per:(t + 1) * per])).view(sview))
            return np.asarray(acc.double().numpy())

        same = bool(np.array_equal(ours, ref(), equal_nan=True))
        t_ref = best(ref, args.repeat)
        label = f"{kind} {PTX[fa]} x {PTX[fb]} ({sf}/{blk})"
        print(f"{label:34s} {t_ours:9.3f} {t_ref:10.3f} {t_ref / t_ours:6.1f}x  {'identical' if same else 'DIFFER'}")


if __name__ == "__main__":
    main()
