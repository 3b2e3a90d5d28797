"""FlashAttention emulation (fpsim.nn.flash): time, cache memory and error against FP64.

Run: python benchmarks/bench_attention.py [--part time|memory|errors|all] [--quick]

* time: forward + backward of the attention layer, flash (64 x 64 tiles) over standard, in one run, under
  FULL in float32 and under the bf16-mixed policy; torch's scaled_dot_product_attention (float32, CPU)
  forward + backward of the core alone as what a user would run instead. Single-threaded BLAS.
* memory: bytes of the arrays each layer's cache holds for the backward pass, vs T.
* errors: max abs / RMS error against the float64 reference (and the spread over heads) of standard and
  flash attention in BF16/FP16 and of the FP8 variants, on N(0,1) and U(0,1) inputs, on FA-3's outlier
  distribution (N(0,1) plus N(0,10^2) on 0.1% of the entries) and on channel outliers (N(0,1) Q and K whose
  channels 3, 17, 42, 99 are scaled by 20, 40, 60, 100, then the whole of Q and K rescaled to unit mean square,
  so the scores keep their usual size; V plain N(0,1)), T = 1024..4096, head_dim 64/128.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from fpsim import round as fround
from fpsim.amp import get_policy
from fpsim.nn import (
    KernelPrecision,
    attention_backward,
    attention_forward,
    flash_attention,
    flash_attention_backward,
    flash_attention_forward,
    fp8_attention,
    reference_attention,
)
from fpsim.train._threads import limit_blas_threads

from _timing import best


def cache_bytes(obj: Any, seen: set[int] | None = None) -> int:
    """Bytes of the distinct NumPy arrays reachable from a cache (views counted by their own size)."""
    seen = set() if seen is None else seen
    if isinstance(obj, np.ndarray):
        if id(obj) in seen:
            return 0
        seen.add(id(obj))
        return int(obj.nbytes)
    if isinstance(obj, dict):
        return sum(cache_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (tuple, list)):
        return sum(cache_bytes(v, seen) for v in obj)
    return 0


def _layer(T: int, C: int, dtype: Any, seed: int = 0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    return tuple(a.astype(dtype) for a in (rng.standard_normal((1, T, C)), rng.standard_normal((C, 3 * C)) * C ** -0.5,
                                           np.zeros(3 * C), rng.standard_normal((C, C)) * C ** -0.5, np.zeros(C),
                                           rng.standard_normal((1, T, C))))


def part_time(quick: bool) -> None:
    print("## time: forward + backward of one attention layer (B=1, C=128, 4 heads of 32), best of 3")
    print("| T | precision | standard ms | flash ms | flash / standard | torch SDPA ms (core) |")
    print("|---|---|---|---|---|---|")
    for T in ((256, 1024) if quick else (256, 1024, 2048)):
        for label in ("FULL float32", "bf16-mixed"):
            x, w, b, wp, bp, do = _layer(T, 128, np.float32)
            prec = None if label == "FULL float32" else get_policy("bf16-mixed").runtime()
            kw = {} if prec is None else {"prec": prec}

            def std() -> None:
                attention_backward(do, attention_forward(x, w, b, wp, bp, 4, **kw)[1])

            def fl() -> None:
                flash_attention_backward(do, flash_attention_forward(x, w, b, wp, bp, 4, **kw)[1])

            ts, tf = best(std, 3), best(fl, 3)
            tt = _torch_time(T) if label == "FULL float32" else None
            print(f"| {T} | {label} | {ts * 1e3:.1f} | {tf * 1e3:.1f} | {tf / ts:.2f} | "
                  f"{'' if tt is None else f'{tt * 1e3:.1f}'} |")


def _torch_time(T: int) -> float | None:
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(1)
    q, k, v = (torch.randn(1, 4, T, 32, requires_grad=True) for _ in range(3))
    do = torch.randn(1, 4, T, 32)

    def run() -> None:
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        o.backward(do)

    return best(run, 3)


def part_memory() -> None:
    print("## memory: bytes held by the layer's cache for backward (B=1, C=128, 4 heads, float32)")
    print("| T | standard | flash | standard / flash |")
    print("|---|---|---|---|")
    for T in (128, 256, 512, 1024, 2048):
        x, w, b, wp, bp, _ = _layer(T, 128, np.float32)
        cs = cache_bytes(attention_forward(x, w, b, wp, bp, 4)[1])
        cf = cache_bytes(flash_attention_forward(x, w, b, wp, bp, 4)[1])
        print(f"| {T} | {cs:,} | {cf:,} | {cs / cf:.1f} |")


#: Channel outliers: these head-dim channels of Q and K (not V) are multiplied by these factors, the
#: pattern of LLM activations (a few channels 20-100x larger than the rest, the same channels every token).
OUTLIER_CHANNELS = (3, 17, 42, 99)
OUTLIER_FACTORS = (20.0, 40.0, 60.0, 100.0)


def channel_scale(hd: int) -> np.ndarray:
    """Per-channel factors (hd,) of the ``"channels"`` distribution: 1 except the outlier channels."""
    f = np.ones(hd)
    for c, a in zip(OUTLIER_CHANNELS, OUTLIER_FACTORS):
        f[c % hd] = a
    return f


def _inputs(shape: tuple[int, ...], dist: str, fmt: str, rng: np.random.Generator, qk: bool = True) -> np.ndarray:
    x = rng.random(shape) if dist == "uniform" else rng.standard_normal(shape)
    if dist == "outliers":
        x = x + rng.standard_normal(shape) * 10 * (rng.random(shape) < 0.001)
    if dist == "channels" and qk:
        x = x * channel_scale(shape[-1]) / np.sqrt(np.mean(channel_scale(shape[-1]) ** 2))  # same total energy
    return np.asarray(fround(x, fmt))


def _row(name: str, o: np.ndarray, ref: np.ndarray) -> str:
    e = o.astype(np.float64) - ref
    per_head = np.sqrt(np.mean(e ** 2, axis=(0, 2, 3)))
    return (f"| {name} | {np.abs(e).max():.2e} | {np.sqrt(np.mean(e ** 2)):.2e} | "
            f"{per_head.min():.2e}–{per_head.max():.2e} |")


def part_errors(quick: bool, dists: list[str] | None = None) -> None:
    Ts = (1024,) if quick else (1024, 2048, 4096)
    for fmt, dist, hd, causal in (("bf16", "normal", 64, True), ("bf16", "uniform", 64, True),
                                  ("fp16", "outliers", 128, False), ("bf16", "channels", 128, True)):
        if dists is not None and dist not in dists:
            continue
        for T in Ts:
            rng = np.random.default_rng(T)
            q, k, v = (_inputs((1, 4, T, hd), dist, fmt, rng, qk=i < 2) for i in range(3))
            ref = reference_attention(q, k, v, causal=causal)
            print(f"## errors vs FP64: {fmt} inputs, {dist}, T={T}, head_dim={hd}, 4 heads, causal={causal}")
            print("| variant | max abs | RMS | RMS per head (min–max) |")
            print("|---|---|---|---|")
            kp = KernelPrecision(fmt)
            print(_row(f"standard {fmt} (S, P, O stored in {fmt})", reference_attention(q, k, v, prec=kp, causal=causal), ref))
            print(_row(f"flash {fmt} 64x64 (FP32 S, m, l, acc)", flash_attention(q, k, v, prec=kp, causal=causal)[0], ref))
            print(_row(f"flash {fmt} 128x128", flash_attention(q, k, v, prec=kp, block_q=128, block_k=128,
                                                               causal=causal)[0], ref))
            print(_row(f"flash {fmt}, S/l/acc rounded to {fmt} each tile",
                       flash_attention(q, k, v, prec=kp, causal=causal, stats_format=fmt)[0], ref))
            if dist in ("outliers", "channels"):
                f8: dict[str, dict[str, Any]] = {
                    "FP8 baseline: standard, per-tensor scales": {"block_scaling": False, "tiled": False},
                    "FP8 flash, per-tensor scales": {"block_scaling": False},
                    "FP8 flash, block scales": {},
                    "FP8 flash, per-tensor + rotation": {"block_scaling": False, "rotate": True},
                    "FP8 flash, block + rotation (FA-3)": {"rotate": True},
                    "FP8 flash, block + rotation, P x 256": {"rotate": True, "p_scale": 256.0},
                }
                for name, kw in f8.items():
                    print(_row(name, fp8_attention(q, k, v, causal=causal, out_format=fmt, **kw), ref))
            print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", default="all", choices=("time", "memory", "errors", "all"))
    ap.add_argument("--quick", action="store_true", help="small sizes only")
    ap.add_argument("--dist", nargs="+", default=None, help="errors part: only these distributions")
    a = ap.parse_args()
    limit_blas_threads(1)
    if a.part in ("time", "all"):
        part_time(a.quick)
        print()
    if a.part in ("memory", "all"):
        part_memory()
        print()
    if a.part in ("errors", "all"):
        part_errors(a.quick, a.dist)


if __name__ == "__main__":
    main()
