"""The cost of LoRA and of NF4 (issue 14 §4), as ratios.

Run: python benchmarks/bench_lora.py [--quick]

* LoRA step: one forward + backward + AdamW step of the tiny GPT (fpsim.train.finetune defaults, batch
  32) with LoRA adapters (r = 4, :class:`fpsim.nn.lora.LoRAPrecision` over FULL) over the same step
  with full fine-tuning; and the LoRA linear layer pair over a plain linear layer pair.
* NF4: ``nf4_quantize`` / ``nf4_dequantize`` of a 4096 x 4096 float32 weight over a plain copy
  (``np.copy``) and over bitsandbytes 0.50.2's CPU ``quantize_4bit`` / ``dequantize_4bit`` (when it
  imports), single and double quantization. Single-threaded BLAS; torch at 1 thread.
* The 8-bit step of double quantization alone (``absmax_search``): fpsim's bitsandbytes-exact lookup
  table and its nearest-entry rule on 2**20 float32 constants (blocks of 256) over bitsandbytes'
  ``quantize_blockwise`` (its C++ CPU kernel).
"""

from __future__ import annotations

import argparse
import logging

import numpy as np

from fpsim.amp import AdamW
from fpsim.nn import FULL, gpt_backward, gpt_forward, linear_backward, linear_forward
from fpsim.nn.lora import LoRAPrecision, lora_init, lora_linear_backward, lora_linear_forward
from fpsim.quant import nf4_dequantize, nf4_quantize
from fpsim.train._threads import limit_blas_threads
from fpsim.train.finetune import FinetuneSettings, _linear_keys, pretrain, quantize_base
from fpsim.train.data import get_task

from _timing import best


def lora_step(repeat: int) -> None:
    s = FinetuneSettings(pretrain_steps=1)
    cfg = s.model()
    params = pretrain(s, 0)
    task = get_task(s.finetune_task, **s.task_kwargs)
    x, y = task.batch(np.random.default_rng(0), s.batch_size)
    opt = AdamW(lr=1e-3)

    def full() -> None:
        _, _, c = gpt_forward(params, cfg, x, y, prec=FULL)
        opt.step(params, gpt_backward(1.0, c))

    vals, _ = quantize_base(params, cfg, "bf16")
    rng = np.random.default_rng(0)
    ad = {k[:-2]: lora_init(vals[k].shape[0], vals[k].shape[1], s.r, rng=rng) for k in _linear_keys(cfg)}
    lp = LoRAPrecision(FULL, ad, s.alpha / s.r)
    flat = {f"{k}.{n}": ab[i] for k, ab in ad.items() for i, n in enumerate("AB")}
    opt2 = AdamW(lr=1e-3)

    def lora() -> None:
        lp.zero_grad()
        _, _, c = gpt_forward(vals, cfg, x, y, prec=lp)
        gpt_backward(1.0, c)
        opt2.step(flat, {f"{k}.{n}": ab[i] for k, ab in lp.grads.items() for i, n in enumerate("AB")})

    tf, tl = best(full, repeat), best(lora, repeat)
    print(f"GPT step (C={cfg.n_embd}, L={cfg.n_layer}, B={s.batch_size}, T={cfg.block_size}): full "
          f"{tf * 1e3:.1f} ms, LoRA r={s.r} {tl * 1e3:.1f} ms, ratio LoRA/full {tl / tf:.2f}")
    xr = np.random.default_rng(1).standard_normal((1024, 512)).astype(np.float32)
    w = np.random.default_rng(2).standard_normal((512, 512)).astype(np.float32)
    A, B = lora_init(512, 512, 8, rng=rng)
    d = np.ones((1024, 512), np.float32)

    def lin() -> None:
        _, c = linear_forward(xr, w, None, prec=FULL)
        linear_backward(d, c)

    def llin() -> None:
        _, c = lora_linear_forward(xr, w, None, A, B, 2.0, prec=FULL)
        lora_linear_backward(d, c)

    a, b = best(lin, repeat), best(llin, repeat)
    print(f"linear 1024x512 @ 512x512 fwd+bwd: plain {a * 1e3:.2f} ms, LoRA r=8 {b * 1e3:.2f} ms, "
          f"ratio {b / a:.2f} (LoRA skips dW of the base: 2 GEMMs + 4 thin ones vs 3)")


def nf4(repeat: int, n: int) -> None:
    w = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
    tc = best(lambda: np.copy(w), repeat)
    for dq in (False, True):
        tq = best(lambda: nf4_quantize(w, 64, dq, packed=True), repeat)
        c, a = nf4_quantize(w, 64, dq, packed=True)
        td = best(lambda: nf4_dequantize(c, a, 64, shape=w.shape), repeat)
        line = (f"NF4 {n}x{n} double_quant={dq}: quantize {tq * 1e3:.1f} ms ({tq / tc:.1f}x copy), "
                f"dequantize {td * 1e3:.1f} ms ({td / tc:.1f}x copy)")
        try:
            import torch
            logging.disable(logging.WARNING)
            import bitsandbytes.functional as F
            logging.disable(logging.NOTSET)
            torch.set_num_threads(1)
            t = torch.from_numpy(w)
            bq = best(lambda: F.quantize_4bit(t, blocksize=64, quant_type="nf4", compress_statistics=dq), repeat)
            q, st = F.quantize_4bit(t, blocksize=64, quant_type="nf4", compress_statistics=dq)
            bd = best(lambda: F.dequantize_4bit(q, st), repeat)
            line += f"; vs bitsandbytes CPU: quantize {tq / bq:.2f}x, dequantize {td / bd:.2f}x its time"
        except ImportError:
            line += "; bitsandbytes not importable"
        print(line)
    print(f"(plain copy of {n}x{n} float32: {tc * 1e3:.2f} ms)")


def blockwise8(repeat: int, n: int = 1 << 20) -> None:
    from fpsim.quant_nf4 import _quantize_blockwise8
    v = (np.random.default_rng(1).standard_normal(n) * 0.1).astype(np.float32)
    tl = best(lambda: _quantize_blockwise8(v, 256, "bitsandbytes"), repeat)
    tn = best(lambda: _quantize_blockwise8(v, 256, "nearest"), repeat)
    line = f"8-bit blockwise, {n} constants: bitsandbytes rule {tl * 1e3:.1f} ms, nearest {tn * 1e3:.1f} ms"
    try:
        import torch
        logging.disable(logging.WARNING)
        import bitsandbytes.functional as F
        logging.disable(logging.NOTSET)
        torch.set_num_threads(1)
        t = torch.from_numpy(v)
        tb = best(lambda: F.quantize_blockwise(t, blocksize=256), repeat)
        line += f"; vs bitsandbytes quantize_blockwise {tb * 1e3:.1f} ms: {tl / tb:.1f}x, {tn / tb:.1f}x its time"
    except ImportError:
        line += "; bitsandbytes not importable"
    print(line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    limit_blas_threads(1)
    repeat = 3 if args.quick else 7
    lora_step(repeat)
    nf4(repeat, 1024 if args.quick else 4096)
    blockwise8(repeat)


if __name__ == "__main__":
    main()
