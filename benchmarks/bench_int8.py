"""The cost of fpsim's integer linear layer (issue 14 §5), as ratios.

Run: python benchmarks/bench_int8.py [--quick]

* ``quantized_linear`` (uint8 x int8 GEMM, exact int32 accumulator, fbgemm requantization) of an
  M x K input and an N x K per-channel weight, over torch's ``torch.ao.nn.quantized.Linear`` on the
  same codes (fbgemm and qnnpack engines, torch at 1 thread), over a float32 NumPy GEMM of the same
  shape, and fpsim's fake-quant path (quantize-dequantize both operands + float32 GEMM) for scale.
* ``quantize_per_tensor`` of the input over ``torch.quantize_per_tensor``.
Single-threaded BLAS.

``--loss``: instead, the measurement behind docs/quantization.md: train the demo GPT with ``int8-qat``
(``DemoSettings()``, 400 steps), then evaluate 16 held-out batches with the fake quant and with
:class:`fpsim.quant_int.IntegerRuntime` (float epilogue; quint8 outputs per engine). A few minutes.
"""

from __future__ import annotations

import argparse
import warnings

import numpy as np

import fpsim.quant_int as QI
from fpsim.quant import fake_quantize
from fpsim.train._threads import limit_blas_threads

from _timing import best


def loss_comparison() -> None:
    import dataclasses

    from fpsim.nn import gpt_forward
    from fpsim.train import Trainer
    from fpsim.train.demo import DemoSettings

    cfg = dataclasses.replace(DemoSettings().train_config(), eval_every=0, histogram_every=0, eval_batches=16)
    tr = Trainer("int8-qat", cfg)
    tr.run(progress=False)
    bs = tr.eval_batches()
    tr.runtime.training = False
    fq = np.array([float(gpt_forward(tr.store.weights, tr.model, x, y, prec=tr.runtime)[1]) for x, y in bs])
    print(f"fake quant: mean eval loss {fq.mean():.7f} over {len(bs)} batches of {cfg.batch_size}")
    for out, eng in (("float", "fbgemm"), ("quint8", "fbgemm"), ("quint8", "qnnpack"), ("quint8", "onednn")):
        ir = QI.IntegerRuntime(tr.runtime, output=out, engine=eng)
        if out == "quint8":
            ir.calibrate_outputs(True)
            rng = np.random.default_rng([cfg.seed, 12345])
            for _ in range(8):
                x, y = tr.task.batch(rng, cfg.batch_size)
                gpt_forward(tr.store.weights, tr.model, x, y, prec=ir)
            ir.calibrate_outputs(False)
        ir.act_code_diff.clear()
        ls = np.array([float(gpt_forward(tr.store.weights, tr.model, x, y, prec=ir)[1]) for x, y in bs])
        d = ls - fq
        cd = [sum(v[i] for v in ir.act_code_diff.values()) for i in (0, 1)]
        sat = [sum(v[i] for v in ir.saturated.values()) for i in (0, 1)]
        print(f"integers, {out:6s} {eng:7s} (isa {ir.isa}): {ls.mean():.7f}  diff {d.mean():+.2e}  max|per batch| "
              f"{np.abs(d).max():.2e}  activation codes differing {cd[0]}/{cd[1]}  saturated {sat[0]}/{sat[1]}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--loss", action="store_true")
    args = ap.parse_args()
    if args.loss:
        loss_comparison()
        return
    import torch

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    repeat = 3 if args.quick else 7
    m, k, n = (256, 256, 256) if args.quick else (1024, 512, 512)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    xs, xz, ys, yz = np.float32(0.03), 128, np.float32(0.2), 120
    ws = (np.abs(w).max(1) / 127.5).astype(np.float32)
    qx = QI.quantize_per_tensor(x, xs, xz)
    qw = QI.quantize_per_channel(w, ws, np.zeros(n, np.int64), 0)
    print(f"M x K x N = {m} x {k} x {n}; best of {repeat}; single-threaded BLAS, torch 1 thread")
    rows = []
    limit_blas_threads(1)
    t_fp = best(lambda: QI.quantized_linear(qx, xs, xz, qw, ws, 0, b, ys, yz), repeat)
    t_np = best(lambda: x @ w.T + b, repeat)
    zw = np.zeros(n, np.int64)
    t_fq = best(lambda: fake_quantize(x, xs, xz, 0, 255) @ fake_quantize(w, ws, zw, -128, 127, axis=0).T + b,
                repeat)
    t_q = best(lambda: QI.quantize_per_tensor(x, xs, xz), repeat)
    rows.append((f"fpsim quantized_linear (fbgemm rules, isa={QI.default_isa()})", t_fp, "1"))
    rows.append(("NumPy float32 x @ w.T + b", t_np, f"{t_fp / t_np:.1f}x faster than fpsim int"))
    rows.append(("fpsim fake-quant linear (QAT forward)", t_fq, f"{t_fp / t_fq:.2f}x (fpsim int / fake quant)"))
    xt = torch.from_numpy(x)
    qxt = torch.quantize_per_tensor(xt, float(xs), xz, torch.quint8)
    qwt = torch.quantize_per_channel(torch.from_numpy(w), torch.from_numpy(ws.astype(np.float64)),
                                     torch.zeros(n, dtype=torch.long), 0, torch.qint8)
    for eng in ("fbgemm", "qnnpack"):
        if eng not in torch.backends.quantized.supported_engines:
            continue
        torch.backends.quantized.engine = eng
        mod = torch.ao.nn.quantized.Linear(k, n)
        mod.set_weight_bias(qwt, torch.from_numpy(b))
        mod.scale, mod.zero_point = float(ys), yz
        t_t = best(lambda: mod(qxt), repeat)
        rows.append((f"torch quantized Linear ({eng})", t_t, f"fpsim {t_fp / t_t:.0f}x slower"))
    t_tq = best(lambda: torch.quantize_per_tensor(xt, float(xs), xz, torch.quint8), repeat)
    rows.append(("fpsim quantize_per_tensor", t_q, "1"))
    rows.append(("torch.quantize_per_tensor", t_tq, f"fpsim {t_q / t_tq:.0f}x slower"))
    for name, t, r in rows:
        print(f"{name:42s} {t * 1e3:9.2f} ms   {r}")


if __name__ == "__main__":
    main()
