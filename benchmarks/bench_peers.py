"""Peers side by side: fpsim's rounding and Tensor Core GEMM against the libraries a user would use instead.

Run: python3 benchmarks/bench_peers.py [--n 10000000] [--slow-n 1000000] [--repeat 5] [--gemm-size 512]

Rounding (issue 17 section 3): every time is a ratio to ``np.copyto`` of the same float32 array, taken in the
same interleaved loop (best of ``--repeat``), for bf16, fp16, fp8 e4m3 and e5m2, round-to-nearest-even (RNE)
and stochastic rounding (SR), on N(0,1) and on a wide spread N(0,1) * 2**U{-24..11} (as bench_round.py).
Peers: fpsim single-threaded (``fpsim.rounding.max_threads = 1``) and with its default threads, CPFloat
(benchmarks/_cpfloat.py: C + OpenMP, one thread and one per CPU), ml_dtypes' and NumPy's float16 cast round
trips, torch CPU casts (``torch.set_num_threads(1)`` and default), and, where installed, pychop, gfloat and
QPyTorch (qtorch). The pure-Python/NumPy peers (pychop, gfloat) and qtorch are timed on the first
``--slow-n`` elements (ratio to a copy of that slice). Beside every time: bit agreement with fpsim on the same
input (RNE: mismatching elements, NaN = NaN; SR: only the distribution is comparable, so the fraction of
inexact elements rounded up, observed against the exact expectation E[(x - lo) / (hi - lo)]).

GEMM: fpsim.mma.matmul under fpsim's h100 models against MMA-Sim (mmasim.nv_ptx.sim, CPU: NVIDIA ``mma.sync``
m16n8k16 for fp16/bf16 and Hopper ``wgmma`` m64nNk32 for FP8, both modelled as a truncated fused dot-product-add)
and the naive per-row model of bench_mma.py, on the same inputs, with bit agreement counts.

Optional peers that are absent are skipped with a line saying why.
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _cpfloat

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import fpsim
import fpsim.rounding as R

FORMATS = ("bf16", "fp16", "fp8_e4m3", "fp8_e5m2")
MODES = ("rne", "sr")
# (exponent bits, trailing significand bits) for the peers that take a format as two widths.
WIDTHS = {"bf16": (8, 7), "fp16": (5, 10), "fp8_e4m3": (4, 3), "fp8_e5m2": (5, 2)}

Fn = Callable[[], Any]
_DEFAULT_THREADS = R.max_threads  # fpsim's default (None: one thread per CPU, at most 8), read at import


@dataclass
class Peer:
    """One library's rounding: ``make(x, fmt, mode)`` returns a no-argument callable, or a string (why not)."""

    name: str
    make: Callable[[np.ndarray, str, str], Fn | str]
    slow: bool = False  # timed on the first --slow-n elements
    note: str = ""
    skipped: dict[tuple[str, str], str] = field(default_factory=dict)


def inputs(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """The two input distributions of bench_round.py, as float32 arrays of n values."""
    rng = np.random.default_rng(seed)
    normal = rng.standard_normal(n).astype(np.float32)
    wide = (rng.standard_normal(n) * np.exp2(rng.integers(-24, 12, n))).astype(np.float32)
    return {"N(0,1)": normal, "wide N(0,1)*2**U{-24..11}": wide}


def best_interleaved(fns: dict[str, Fn], repeat: int, baseline: str | None = None) -> dict[str, float]:
    """Best-of-``repeat`` seconds for each callable, the calls interleaved (one warm-up call each first).

    With ``baseline`` (a key of ``fns``), that callable is timed again just before every other call and its best
    is taken over all those runs: on a shared machine the reference every ratio divides by is then measured as
    often, and as close in time to each peer, as possible.
    """
    for f in fns.values():
        f()
    best = {k: float("inf") for k in fns}

    def run(k: str) -> None:
        t0 = time.perf_counter()
        fns[k]()
        best[k] = min(best[k], time.perf_counter() - t0)
    for _ in range(repeat):
        for k in fns:
            if baseline is not None and k != baseline:
                run(baseline)
            run(k)
    return best


def as_f32(y: Any) -> np.ndarray:
    """A peer's result as a float32 NumPy array (torch tensors, float64 arrays: exact, the values are in format)."""
    if hasattr(y, "numpy") and not isinstance(y, np.ndarray):
        y = y.numpy()
    return np.asarray(y).astype(np.float32, copy=False)


def mismatches(y: np.ndarray, ref: np.ndarray) -> int:
    """Elements whose float32 bit patterns differ (any NaN equals any NaN)."""
    y, ref = as_f32(y), as_f32(ref)
    same = (y.view(np.uint32) == ref.view(np.uint32)) | (np.isnan(y) & np.isnan(ref))
    return int(y.size - np.count_nonzero(same))


def sr_stats(x: np.ndarray, y: np.ndarray, fmt: str) -> tuple[float, float, int]:
    """(expected, observed) fraction of inexact elements rounded up, and how many results are neither neighbour.

    The neighbours lo <= x <= hi are fpsim's directed roundings; elements whose neighbours are not both finite
    (overflow) are left out.
    """
    x64 = x.astype(np.float64)
    lo = fpsim.round(x, fmt, "rdn").astype(np.float64)
    hi = fpsim.round(x, fmt, "rup").astype(np.float64)
    y64 = as_f32(y).astype(np.float64)
    sel = (lo != hi) & np.isfinite(lo) & np.isfinite(hi)
    if not sel.any():
        return float("nan"), float("nan"), 0
    expected = float(np.mean((x64[sel] - lo[sel]) / (hi[sel] - lo[sel])))
    observed = float(np.mean(y64[sel] == hi[sel]))
    off = int(np.count_nonzero((y64[sel] != hi[sel]) & (y64[sel] != lo[sel])))
    return expected, observed, off


# ----------------------------------------------------------------------------------------------- the peers


def _fpsim(threads: int | None) -> Peer:
    def make(x: np.ndarray, fmt: str, mode: str) -> Fn:
        rng = np.random.default_rng(1)

        def f() -> Any:
            prev, R.max_threads = R.max_threads, (_DEFAULT_THREADS if threads is None else threads)
            try:
                return fpsim.round(x, fmt, mode, rng=rng if mode == "sr" else None)
            finally:
                R.max_threads = prev
        return f
    label = "fpsim 1 thread" if threads == 1 else "fpsim default threads"
    return Peer(label, make, note="fpsim.round(x, fmt, mode) -> new float32 array")


def _fpsim_out(threads: int | None) -> Peer | None:
    # fpsim.round(..., out=) where it exists (issue 17 section 2): the like-for-like comparison with CPFloat.
    if "out" not in inspect.signature(fpsim.round).parameters:
        return None

    def make(x: np.ndarray, fmt: str, mode: str) -> Fn:
        rng = np.random.default_rng(1)
        out = np.empty_like(x)

        def f() -> Any:
            prev, R.max_threads = R.max_threads, (_DEFAULT_THREADS if threads is None else threads)
            try:
                return fpsim.round(x, fmt, mode, rng=rng if mode == "sr" else None, out=out)  # type: ignore[call-arg]
            finally:
                R.max_threads = prev
        return f
    label = "fpsim 1 thread out=" if threads == 1 else "fpsim default out="
    return Peer(label, make, note="fpsim.round(..., out=) into a preallocated array")


def _cpf(threads: int | None) -> Peer:
    def make(x: np.ndarray, fmt: str, mode: str) -> Fn | str:
        out = np.empty_like(x)
        _cpfloat.seed(1)
        return lambda: _cpfloat.round(x, out, fmt, mode, threads=threads)
    label = "CPFloat 1 thread" if threads == 1 else "CPFloat OpenMP all CPUs"
    call = "cpfloatf_sequential" if threads == 1 else "cpfloatf_parallel (OpenMP, one thread per CPU)"
    return Peer(label, make, note=f"{call} into a preallocated array (e4m3: IEEE-style, max 240, see _cpfloat.py)")


def _ml_dtypes() -> Peer | str:
    try:
        import ml_dtypes
    except ImportError as e:
        return f"ml_dtypes not installed ({e})"
    types = {"bf16": ml_dtypes.bfloat16, "fp8_e4m3": ml_dtypes.float8_e4m3fn, "fp8_e5m2": ml_dtypes.float8_e5m2}

    def make(x: np.ndarray, fmt: str, mode: str) -> Fn | str:
        if mode != "rne":
            return "no SR cast"
        if fmt not in types:
            return "no float16 type (NumPy's is the cast)"
        t = types[fmt]
        return lambda: x.astype(t).astype(np.float32)
    return Peer(f"ml_dtypes {ml_dtypes.__version__}", make, note="x.astype(T).astype(float32)")


def _numpy_f16() -> Peer:
    def make(x: np.ndarray, fmt: str, mode: str) -> Fn | str:
        if fmt != "fp16" or mode != "rne":
            return "float16 RNE only"
        return lambda: x.astype(np.float16).astype(np.float32)
    return Peer(f"NumPy {np.__version__} float16", make, note="x.astype(float16).astype(float32)")


def _torch(single: bool) -> Peer | str:
    try:
        import torch
    except ImportError as e:
        return f"torch not installed ({e})"
    default = torch.get_num_threads()
    types = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8_e4m3": torch.float8_e4m3fn,
             "fp8_e5m2": torch.float8_e5m2}
    nthreads = 1 if single else default

    def make(x: np.ndarray, fmt: str, mode: str) -> Fn | str:
        if mode != "rne":
            return "no SR cast"
        t, dt = torch.from_numpy(x), types[fmt]

        def f() -> Any:
            torch.set_num_threads(nthreads)
            try:
                return t.to(dt).to(torch.float32)
            finally:
                torch.set_num_threads(default)
        return f
    return Peer(f"torch {torch.__version__.split('+')[0]} {'1 thread' if single else f'{default} threads'}", make,
                note="t.to(dtype).to(float32)")


def _pychop() -> Peer | str:
    try:
        import pychop
        from pychop import Chop
    except Exception as e:  # noqa: BLE001  (an optional peer: any import failure is a reason to skip it)
        return f"pychop not importable ({type(e).__name__}: {e})"
    pychop.backend("numpy")

    def make(x: np.ndarray, fmt: str, mode: str) -> Fn:
        eb, sb = WIDTHS[fmt]
        ch = Chop(eb, sb, rmode=1 if mode == "rne" else 5, subnormal=True, random_state=1)

        def f() -> Any:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")  # pychop's NumPy backend overflows in intermediate products
                return ch(x)
        return f
    return Peer(f"pychop {pychop.__version__}", make, slow=True, note="Chop(exp_bits, sig_bits, rmode=1|5)(x), "
                                                                    "NumPy backend (e4m3: IEEE-like)")


def _gfloat() -> Peer | str:
    try:
        import gfloat
        import gfloat.formats as gf
        from gfloat import RoundMode, round_ndarray
    except Exception as e:  # noqa: BLE001
        return f"gfloat not importable ({type(e).__name__}: {e})"
    infos = {"bf16": gf.format_info_bfloat16, "fp16": gf.format_info_binary16,
             "fp8_e4m3": gf.format_info_ocp_e4m3, "fp8_e5m2": gf.format_info_ocp_e5m2}
    version = getattr(gfloat, "__version__", "")
    if not version:
        try:
            from importlib.metadata import version as _v
            version = _v("gfloat")
        except Exception:  # noqa: BLE001
            version = "?"

    def make(x: np.ndarray, fmt: str, mode: str) -> Fn:
        fi = infos[fmt]
        if mode == "rne":
            return lambda: round_ndarray(fi, x, RoundMode.TiesToEven)
        rng = np.random.default_rng(1)
        # 32 random bits per element: with float32 inputs the discarded fraction has at most 24 + 149 bits, but
        # gfloat's Stochastic first rounds it to srnumbits bits; 32 is far below any visible bias.
        return lambda: round_ndarray(fi, x, RoundMode.Stochastic,
                                     srbits=rng.integers(0, 2**32, x.size, dtype=np.int64), srnumbits=32)
    return Peer(f"gfloat {version}", make, slow=True, note="round_ndarray(format_info, x, mode) (OCP e4m3)")


def _qtorch() -> Peer | str:
    try:
        import torch
        from qtorch.quant import float_quantize
    except Exception as e:  # noqa: BLE001  (qtorch builds a C++ extension on first import)
        return f"qtorch not importable ({type(e).__name__}: {str(e)[-200:]})"

    def make(x: np.ndarray, fmt: str, mode: str) -> Fn:
        eb, sb = WIDTHS[fmt]
        t = torch.from_numpy(x)
        return lambda: float_quantize(t, eb, sb, "nearest" if mode == "rne" else "stochastic")
    return Peer("qtorch 0.3.0", make, slow=True,
                note="float_quantize(t, exp, man, 'nearest'|'stochastic'); 'nearest' rounds ties away from zero, "
                     "e4m3 saturates at 480")


def peers(quiet: bool = False, skip: tuple[str, ...] = ()) -> list[Peer]:
    """Every peer that is available here (less those whose name starts with a word in ``skip``); prints one line
    per skipped peer saying why."""
    out: list[Peer] = [_fpsim(1), _fpsim(None)]
    po = [_fpsim_out(1), _fpsim_out(None)]
    if po[0] is not None and po[1] is not None:
        out += [po[0], po[1]]
    else:
        print("skip: fpsim out= -- fpsim.round has no out= parameter yet")
    if any("cpfloat".startswith(s.lower()) for s in skip):
        print("skip: CPFloat -- --skip")
    elif _cpfloat.available():
        out += [_cpf(1), _cpf(None)]
        if not quiet:
            print(_cpfloat.info())
    else:
        print(f"skip: CPFloat -- {_cpfloat.skip_reason()}")
    makers = {"ml_dtypes": _ml_dtypes, "numpy": _numpy_f16, "torch": lambda: _torch(True),
              "torch ": lambda: _torch(False), "pychop": _pychop, "gfloat": _gfloat, "qtorch": _qtorch}
    for key, mk in makers.items():
        if any(key.strip().lower().startswith(s.lower()) for s in skip):
            print(f"skip: {key.strip()} -- --skip")
            continue
        p = mk()
        if isinstance(p, str):
            print(f"skip: {p}")
        else:
            out.append(p)
    return out


# ----------------------------------------------------------------------------------------------- rounding


@dataclass
class Cell:
    ratio: float | None = None       # time / np.copyto time on the same array
    agree: str = ""                  # RNE: mismatches; SR: "P(up) observed/expected"
    n: int = 0


def rounding(xs: dict[str, np.ndarray], plist: list[Peer], repeat: int, slow_n: int, slow_repeat: int,
             formats: tuple[str, ...] = FORMATS, modes: tuple[str, ...] = MODES) -> dict[tuple[str, str], Any]:
    """Time every peer on every (distribution, mode, format); returns {(dist, mode): {peer: {fmt: Cell}}}."""
    results: dict[tuple[str, str], Any] = {}
    for dist, x in xs.items():
        xs_slow = x[:slow_n].copy()
        for mode in modes:
            table: dict[str, dict[str, Cell]] = {p.name: {} for p in plist}
            for fmt in formats:
                for sub, group, rep in ((x, [p for p in plist if not p.slow], repeat),
                                        (xs_slow, [p for p in plist if p.slow], slow_repeat)):
                    if not group:
                        continue
                    dst = np.empty_like(sub)
                    fns: dict[str, Fn] = {"np.copyto": lambda sub=sub, dst=dst: np.copyto(dst, sub)}
                    for p in group:
                        f = p.make(sub, fmt, mode)
                        if isinstance(f, str):
                            p.skipped[(fmt, mode)] = f
                            table[p.name][fmt] = Cell(None, "", sub.size)
                        else:
                            fns[p.name] = f
                    times = best_interleaved(fns, rep, baseline="np.copyto")
                    ref = fpsim.round(sub, fmt) if mode == "rne" else None
                    for p in group:
                        if p.name not in fns:
                            continue
                        y = fns[p.name]()
                        if mode == "rne":
                            agree = str(mismatches(y, ref))
                        else:
                            e, o, off = sr_stats(sub, y, fmt)
                            agree = f"{o:.4f}/{e:.4f}" + (f" off {off}" if off else "")
                        table[p.name][fmt] = Cell(times[p.name] / times["np.copyto"], agree, sub.size)
            results[(dist, mode)] = table
    return results


def print_rounding(results: dict[tuple[str, str], Any], xs: dict[str, np.ndarray], t_copy: dict[str, float],
                   t_fresh: dict[str, float], formats: tuple[str, ...] = FORMATS) -> None:
    w = 24
    for (dist, mode), table in results.items():
        n = xs[dist].size
        print(f"\n{dist}, {mode.upper()}: n = {n:,} float32 (slow peers: first {min(n, _SLOW_N[0]):,}); "
              f"np.copyto = {t_copy[dist] * 1e3:.2f} ms = 1.00x; copy into a fresh array (x.copy()) = "
              f"{t_fresh[dist] / t_copy[dist]:.2f}x")
        print(f"{'time / np.copyto':{w}s}" + "".join(f"{f:>10s}" for f in formats)
              + ("   | mismatches with fpsim RNE (of n)" if mode == "rne"
                 else "   | SR: P(round up) observed/expected"))
        for name, cells in table.items():
            if all(c.ratio is None for c in cells.values()):
                continue
            ratios = "".join(f"{c.ratio:9.2f}x" if c.ratio is not None else f"{'-':>10s}"
                             for c in (cells.get(f, Cell()) for f in formats))
            agree = "  ".join(f"{(cells.get(f, Cell()).agree or '-'):>8s}" for f in formats)
            label = name + (" *" if cells and next(iter(cells.values())).n != n else "")
            print(f"{label:{w}s}{ratios}   | {agree}")


_SLOW_N = [1_000_000]


# ----------------------------------------------------------------------------------------------- GEMM


def gemm(size: int, mmasim_rows: int, naive_rows: int, repeat: int,
         cases: tuple[tuple[str, str, str], ...] = (("h100", "fp16", "fp32"), ("h100", "bf16", "fp32"),
                                                    ("h100", "fp8_e4m3", "fp32"))) -> list[dict[str, Any]]:
    """fpsim.mma.matmul against MMA-Sim and the naive per-row model on the same inputs; returns one dict per case."""
    from bench_mma import naive_bfma_gemm_rows

    from fpsim.mma import get_model
    try:
        import torch
        from mmasim.nv_ptx import sim
    except Exception as e:  # noqa: BLE001
        sim = None
        print(f"skip: MMA-Sim -- mmasim.nv_ptx.sim not importable ({type(e).__name__}: {e})")
    rows_out = []
    rng = np.random.default_rng(0)
    for dev, fin, fout in cases:
        model = get_model(dev, fin, fout)
        a = np.asarray(fpsim.round(rng.standard_normal((size, size)), fin), dtype=np.float32)
        b = np.asarray(fpsim.round(rng.standard_normal((size, size)), fin), dtype=np.float32)
        c = rng.standard_normal((size, size)).astype(np.float32)
        t_full = best_interleaved({"f": lambda a=a, b=b, c=c, model=model: fpsim.matmul(a, b, c, model=model)},
                                  repeat)["f"]
        d = np.asarray(fpsim.matmul(a, b, c, model=model), dtype=np.float32)
        t_np = best_interleaved({"f": lambda a=a, b=b: np.matmul(a, b)}, max(repeat, 5))["f"]
        r = {"case": f"{dev} {fin}->{fout}", "size": size, "macs": size**3, "fpsim": t_full, "numpy": t_np}
        if sim is not None:
            ptx = {"fp16": "f16", "bf16": "bf16", "fp8_e4m3": "e4m3", "fp8_e5m2": "e5m2"}[fin]
            if fin.startswith("fp8"):
                op, opname = sim.WGMMA("Hopper", f"m64n8k32.f32.{ptx}.{ptx}"), f"WGMMA m64n8k32.f32.{ptx}.{ptx}"
            else:
                op, opname = sim.MMA("Hopper", f"m16n8k16.f32.{ptx}.{ptx}.f32"), f"MMA m16n8k16.f32.{ptx}.{ptx}.f32"
            dt = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp8_e4m3": torch.float8_e4m3fn,
                  "fp8_e5m2": torch.float8_e5m2}[fin]
            m = min(mmasim_rows, size)
            ta, tb = torch.from_numpy(a[:m]).to(dt), torch.from_numpy(b).to(dt)
            tc = torch.from_numpy(c[:m])
            t0 = time.perf_counter()
            ref = op(ta, tb, tc).numpy().astype(np.float32)
            t_sim = time.perf_counter() - t0
            t_sub = best_interleaved({"f": lambda a=a, b=b, c=c, m=m, model=model: fpsim.matmul(a[:m], b, c[:m], model=model)},
                                     repeat)["f"]
            r.update(mmasim=opname, sim_rows=m, t_sim=t_sim, t_sub=t_sub, sim_bad=mismatches(ref, d[:m]),
                     sim_n=ref.size)
        k = min(naive_rows, size)
        t0 = time.perf_counter()
        dn = naive_bfma_gemm_rows(a, b, model, k)
        r.update(naive_rows=k, t_naive=(time.perf_counter() - t0) * size / k,
                 naive_bad=mismatches(dn.astype(np.float32), fpsim.matmul(a[:k], b, model=model)),  # naive: no C
                 naive_n=k * size)
        rows_out.append(r)
    return rows_out


def print_gemm(rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    size = rows[0]["size"]
    print(f"\nGEMM {size}x{size}x{size}: D = A @ B + C, A and B N(0,1) rounded to the input format, C N(0,1) float32, "
          f"fpsim's h100 models (default threads).")
    print("Times as ratios to fpsim.mma.matmul on the same rows (MMA-Sim and fpsim timed on the first rows only; "
          "naive extrapolated from its rows); agreement = mismatching fp32 outputs (the naive model of "
          "bench_mma.py takes no C: compared with fpsim's A @ B).")
    print(f"{'case':22s} {'fpsim M MAC/s':>13s} {'numpy/fpsim':>11s} {'MMA-Sim/fpsim':>13s} {'MMA-Sim agree':>16s} "
          f"{'naive/fpsim':>11s} {'naive agree':>12s}  MMA-Sim operation")
    for r in rows:
        sim_ratio = f"{r['t_sim'] / r['t_sub']:12.1f}x" if "t_sim" in r else f"{'-':>13s}"
        sim_agree = f"{r['sim_bad']} of {r['sim_n']}" if "t_sim" in r else "-"
        print(f"{r['case']:22s} {r['macs'] / r['fpsim'] / 1e6:13.1f} {r['numpy'] / r['fpsim']:10.3f}x {sim_ratio} "
              f"{sim_agree:>16s} {r['t_naive'] / r['fpsim']:10.1f}x {r['naive_bad']:>5d} of {r['naive_n']:<5d} "
              f" {r.get('mmasim', '-')}" + (f" ({r['sim_rows']} rows)" if "t_sim" in r else ""))


# ----------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_000_000, help="elements per rounding input")
    ap.add_argument("--slow-n", type=int, default=1_000_000, help="elements for pychop, gfloat and qtorch")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--slow-repeat", type=int, default=2)
    ap.add_argument("--gemm-size", type=int, default=512)
    ap.add_argument("--mmasim-rows", type=int, default=32)
    ap.add_argument("--naive-rows", type=int, default=2)
    ap.add_argument("--gemm-repeat", type=int, default=3)
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--no-gemm", action="store_true")
    ap.add_argument("--skip", default="", help="comma-separated optional peers to leave out, e.g. pychop,qtorch")
    a = ap.parse_args(argv)
    formats = tuple(a.formats.split(","))
    modes = tuple(a.modes.split(","))
    _SLOW_N[0] = a.slow_n
    load0 = os.getloadavg()
    print(f"bench_peers: {os.cpu_count()} CPUs, load average {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f} at start; "
          f"command: python3 benchmarks/bench_peers.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    plist = peers(skip=tuple(t for t in a.skip.split(",") if t))
    xs = inputs(a.n)
    t_copy, t_fresh = {}, {}
    for dist, x in xs.items():
        dst = np.empty_like(x)
        t = best_interleaved({"copyto": lambda x=x, dst=dst: np.copyto(dst, x), "copy": x.copy}, a.repeat)
        t_copy[dist], t_fresh[dist] = t["copyto"], t["copy"]
    res = rounding(xs, plist, a.repeat, a.slow_n, a.slow_repeat, formats, modes)
    print_rounding(res, xs, t_copy, t_fresh, formats)
    print("\n* timed on the first --slow-n elements (ratio to np.copyto of that slice).")
    for p in plist:
        print(f"  {p.name}: {p.note}" + (f"; not run: {sorted(set(p.skipped.values()))}" if p.skipped else ""))
    print("  SR: bits are not comparable between libraries (different random streams); the check is the fraction "
          "of inexact elements rounded up against its exact expectation (neighbours from fpsim rdn/rup), and "
          "'off N' counts results that are neither neighbour.")
    g = [] if a.no_gemm else gemm(a.gemm_size, a.mmasim_rows, a.naive_rows, a.gemm_repeat)
    print_gemm(g)
    load1 = os.getloadavg()
    print(f"\nload average {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f} at the end (on {os.cpu_count()} CPUs)")
    return {"rounding": res, "gemm": g, "load": (load0, load1)}


if __name__ == "__main__":
    main()
