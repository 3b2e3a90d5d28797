"""Cross-check fpsim's GEMM models against cuBLAS, called through PyTorch on a CUDA GPU, bit for bit.

Each GEMM has K equal to one Tensor Core instruction's K (32 for FP8, 16 for fp16/bf16) and no addend, so every
output is one instruction (``mma.sync`` m16n8k32/k16, Hopper ``wgmma`` k32/k16, Blackwell ``tcgen05``) followed
by the epilogue's conversion to the output type; cuBLAS cannot split such a K. The expected output is the
device preset's :func:`fpsim.mma.dot` (input -> fp32) rounded to nearest-even into the output type.

* ``scaled_mm e4m3->fp32`` / ``->bf16``: ``torch._scaled_mm`` of fp8 e4m3 operands, scales 1.
* ``matmul bf16->bf16`` / ``fp16->fp16``: ``torch.matmul`` (cuBLAS, fp32 compute).
* ``mm bf16->fp32`` / ``fp16->fp32``: ``torch.mm(..., out_dtype=torch.float32)`` where the torch build has it.

Where a device has several presets for an input (B200 FP8: ``mma.sync`` and ``tcgen05``) each is compared and
the report names those that agree. The GPU is reached through a *backend* (``backend(a_codes, b_codes, case)
-> out_codes``): :func:`torch_backend` for the real thing, :func:`emulated_backend` (fpsim itself, wiring only)
for tests. ``python -m fpsim.gpu.torch_check --out DIR`` adds a ``torch_checks`` section to ``DIR/results.json``
and ``DIR/results.md`` (written by :mod:`fpsim.gpu.run_all`) or writes them if absent.

>>> [c.label for c in CASES][:2]
['scaled_mm fp8_e4m3->fp32', 'scaled_mm fp8_e4m3->bf16']
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._fpenv import ieee_mode
from ..bits import from_bits, to_bits
from ..formats import Format, as_format, bf16, fp8_e4m3, fp16, fp32
from ..mma import MMAModel, dot, get_model
from ..rounding import round as fround
from ._device import GPUUnavailable

__all__ = ["CASES", "Backend", "TorchCase", "candidates", "compare_case", "emulated_backend", "main", "render_markdown",
           "run_torch_checks", "torch_backend"]


@ieee_mode
@dataclass(frozen=True)
class TorchCase:
    """One GEMM call: `op` (``"scaled_mm"``, ``"matmul"`` or ``"mm_out"``) on `input` operands giving `output`."""

    op: str
    input: Format
    output: Format
    k: int

    @property
    def label(self) -> str:
        return f"{self.op} {self.input.name}->{self.output.name}"


#: The calls made, in order.
CASES: tuple[TorchCase, ...] = (
    TorchCase("scaled_mm", fp8_e4m3, fp32, 32),
    TorchCase("scaled_mm", fp8_e4m3, bf16, 32),
    TorchCase("matmul", bf16, bf16, 16),
    TorchCase("matmul", fp16, fp16, 16),
    TorchCase("mm_out", bf16, fp32, 16),
    TorchCase("mm_out", fp16, fp32, 16),
)

#: ``backend(a_codes (M, K), b_codes (K, N), case) -> output codes (M, N)`` (uint32 fp32 bits or uint16).
Backend = Callable[[np.ndarray, np.ndarray, TorchCase], np.ndarray]

# Per-element exponent spread (+-) of the random operands: alignment shifts vary, sums stay finite.
_SPREAD = {"fp8_e4m3": 3, "bf16": 12, "fp16": 5}


def _codes_of(x: np.ndarray, fmt: Format) -> np.ndarray:
    """Output codes: fp32 bits (uint32) or the 16-bit pattern (uint16); RNE, overflow to inf."""
    if fmt == fp32:
        with np.errstate(over="ignore"):
            return np.ascontiguousarray(np.asarray(x, dtype=np.float32)).view(np.uint32)
    return np.asarray(to_bits(np.asarray(x, dtype=np.float64), fmt), dtype=np.uint16)


def _values_of(codes: np.ndarray, fmt: Format) -> np.ndarray:
    if fmt == fp32:
        return np.asarray(codes, dtype=np.uint32).view(np.float32).astype(np.float64)
    return np.asarray(from_bits(codes, fmt), dtype=np.float64)


def _operands(case: TorchCase, m: int, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Random A (M, K) and B (K, N) values exact in the input format: half the rows of A and half the columns
    of B N(0,1), the others with a random power-of-two scale per element."""
    w = _SPREAD[case.input.name]
    ov = "saturate" if case.input.width <= 8 else "ieee"

    def draw(shape: tuple[int, int], wide: np.ndarray) -> np.ndarray:
        x = rng.standard_normal(shape)
        x = np.where(wide, np.ldexp(x, rng.integers(-w, w + 1, size=shape)), x)
        return np.asarray(fround(x, case.input, "rne", overflow=ov), dtype=np.float64)

    a = draw((m, case.k), (np.arange(m) % 2 == 1)[:, None])
    b = draw((case.k, n), (np.arange(n) % 2 == 1)[None, :])
    return a, b


@ieee_mode
def candidates(device: str, case: TorchCase) -> list[tuple[str, MMAModel]]:
    """(label, preset) of the device's input -> fp32 presets that a cuBLAS kernel for `case` may use: the default
    one, and those of other instruction paths (B200 FP8: ``tcgen05``). Raises ValueError if there is none.

    >>> [label for label, _ in candidates("b200", CASES[0])]
    ['b200 fp8_e4m3->fp32', 'b200 fp8_e4m3->fp32 (path tcgen05)']
    """
    first = get_model(device, case.input, fp32)
    models = [(first.name, first)]
    for path in ("tcgen05",):
        try:
            m = get_model(device, case.input, fp32, path=path)
        except ValueError:  # only some devices have a second path
            continue
        if m != first:
            models.append((m.name if m.name != first.name else f"{m.name} (path {path})", m))
    return models


@ieee_mode
def compare_case(a: np.ndarray, b: np.ndarray, got: np.ndarray, case: TorchCase, model: MMAModel, *,
                 label: str | None = None, max_examples: int = 5) -> dict[str, Any]:
    """Compare GPU output codes (M, N) with RNE(`model` dot) in ``case.output`` (pure; NaN agrees with NaN,
    +0 vs -0 is counted apart as the models do not model the sign of zero)."""
    want_v = np.asarray(dot(a[:, None, :], b.T[None, :, :], None, model), dtype=np.float64)
    want = _codes_of(want_v, case.output).astype(np.uint64)
    got = np.asarray(got).astype(np.uint64)
    if got.shape != want.shape:
        raise ValueError(f"output codes must have shape {want.shape}, got {got.shape}")
    wv = _values_of(want, case.output)
    gv = _values_of(got, case.output)
    with np.errstate(invalid="ignore"):
        both_nan = np.isnan(wv) & np.isnan(gv)
        zero_sign = (wv == 0) & (gv == 0) & (want != got)
    bad = (want != got) & ~both_nan & ~zero_sign
    digits = 8 if case.output == fp32 else 4
    ex = [{"row": int(i), "col": int(j), "a": [float(v) for v in a[i]], "b": [float(v) for v in b[:, j]],
           "fpsim": f"{int(want[i, j]):0{digits}x}", "gpu": f"{int(got[i, j]):0{digits}x}"}
          for i, j in list(zip(*np.nonzero(bad)))[:max_examples]]
    return {"model": label or model.name, "n": int(got.size), "mismatches": int(bad.sum()),
            "zero_sign_diffs": int(zero_sign.sum()), "examples": ex}


@ieee_mode
def emulated_backend(device: str) -> Backend:
    """A backend computing with the device's first preset (fpsim itself): checks the wiring, never the numerics."""

    def run(a_codes: np.ndarray, b_codes: np.ndarray, case: TorchCase) -> np.ndarray:
        a = np.asarray(from_bits(a_codes, case.input), dtype=np.float64)
        b = np.asarray(from_bits(b_codes, case.input), dtype=np.float64)
        model = get_model(device, case.input, fp32)
        return _codes_of(np.asarray(dot(a[:, None, :], b.T[None, :, :], None, model)), case.output)

    return run


def _torch_dtype(torch: Any, fmt: Format) -> Any:
    return {"fp8_e4m3": torch.float8_e4m3fn, "bf16": torch.bfloat16, "fp16": torch.float16,
            "fp32": torch.float32}[fmt.name]


@ieee_mode
def torch_backend(device: str = "cuda:0") -> tuple[Backend, dict[str, Any]]:
    """The cuBLAS backend through PyTorch on `device` and a description of it (torch version, GPU name).

    ``device="cpu"`` runs torch's CPU kernels instead: the same calls, used to test the wiring without a GPU.
    Raises :class:`GPUUnavailable` (one line) without torch or, for a CUDA device, without a visible GPU.
    """
    try:
        import torch
    except Exception as e:  # noqa: BLE001  (ImportError, or a broken CUDA install raising at import)
        raise GPUUnavailable(f"torch is not available ({type(e).__name__}: {e})") from None
    dev = torch.device(device)
    info: dict[str, Any] = {"torch": str(torch.__version__), "cuda": str(torch.version.cuda), "device": str(dev)}
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise GPUUnavailable(f"torch {torch.__version__} sees no CUDA device")
        info["name"] = str(torch.cuda.get_device_name(dev))
        info["capability"] = ".".join(str(v) for v in torch.cuda.get_device_capability(dev))
    else:
        info["name"] = "cpu"

    def to_torch(codes: np.ndarray, fmt: Format) -> Any:
        raw = np.ascontiguousarray(codes, dtype=np.uint8 if fmt.width == 8 else np.uint16)
        raw = raw if fmt.width == 8 else raw.view(np.int16)  # torch views int16, not uint16, as bf16/fp16
        return torch.from_numpy(raw).to(dev).view(_torch_dtype(torch, fmt))

    def from_torch(t: Any, fmt: Format) -> np.ndarray:
        if fmt == fp32:
            return np.asarray(t.contiguous().view(torch.int32).cpu().numpy()).view(np.uint32)
        return np.asarray(t.contiguous().view(torch.int16).cpu().numpy()).view(np.uint16)

    def run(a_codes: np.ndarray, b_codes: np.ndarray, case: TorchCase) -> np.ndarray:
        ta, tb = to_torch(a_codes, case.input), to_torch(b_codes, case.input)
        out_dt = _torch_dtype(torch, case.output)
        matmul_flags = torch.backends.cuda.matmul
        saved = (matmul_flags.allow_bf16_reduced_precision_reduction,
                 matmul_flags.allow_fp16_reduced_precision_reduction)
        try:
            # fp32 reductions only: with K = one instruction there is no split-K, but say so to cuBLAS anyway
            matmul_flags.allow_bf16_reduced_precision_reduction = False
            matmul_flags.allow_fp16_reduced_precision_reduction = False
            if case.op == "scaled_mm":
                one = torch.tensor(1.0, device=dev)
                tb = tb.t().contiguous().t()  # _scaled_mm wants B column-major
                out = torch._scaled_mm(ta, tb, scale_a=one, scale_b=one, out_dtype=out_dt)
            elif case.op == "matmul":
                out = torch.matmul(ta, tb)
            elif case.op == "mm_out":
                out = torch.mm(ta, tb, out_dtype=out_dt)
            else:
                raise ValueError(f"unknown op {case.op!r}; valid: 'scaled_mm', 'matmul', 'mm_out'")
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
        finally:
            matmul_flags.allow_bf16_reduced_precision_reduction = saved[0]
            matmul_flags.allow_fp16_reduced_precision_reduction = saved[1]
        if out.dtype != out_dt:
            raise TypeError(f"{case.op} returned {out.dtype}, expected {out_dt}")
        return from_torch(out, case.output)

    return run, info


@ieee_mode
def run_torch_checks(device_name: str | None = None, *, backend: Backend | None = None, torch_device: str = "cuda:0",
                     rows: int = 4096, cols: int = 64, seed: int = 0, cases: tuple[TorchCase, ...] = CASES,
                     log: Any = None) -> dict[str, Any]:
    """Run every case of `cases`; a failing case is recorded (``error``) and the others still run.

    Parameters
    ----------
    device_name : str, optional
        Preset device (e.g. ``"h200"``); default the name the GPU reports.
    backend : Backend, optional
        Default :func:`torch_backend` on `torch_device`.
    rows, cols : int
        M and N of each GEMM (multiples of 16, as ``_scaled_mm`` needs): ``rows * cols`` outputs per case.

    Returns a JSON-able dict: ``{"backend": {...}, "preset_device", "cases": [...], "ok"}``; raises
    :class:`GPUUnavailable` when no backend can be made.
    """
    for nm, v in (("rows", rows), ("cols", cols)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0 or v % 16:
            raise ValueError(f"{nm} must be a positive multiple of 16, got {v!r}")

    def say(msg: str) -> None:
        if log is not None:
            print(msg, file=log, flush=True)

    info: dict[str, Any] = {"name": device_name or "emulated"}
    if backend is None:
        backend, info = torch_backend(torch_device)
    name = device_name or str(info["name"])
    res: dict[str, Any] = {"backend": info, "preset_device": name, "rows": rows, "cols": cols, "seed": seed,
                           "cases": []}
    for idx, case in enumerate(cases):
        t0 = time.perf_counter()
        entry: dict[str, Any] = {"path": case.label, "k": case.k}
        try:
            models = candidates(name, case)
            rng = np.random.default_rng([seed, idx])
            a, b = _operands(case, rows, cols, rng)
            got = backend(np.asarray(to_bits(a, case.input)), np.asarray(to_bits(b, case.input)), case)
            entry["models"] = [compare_case(a, b, got, case, m, label=lb) for lb, m in models]
            entry["n"] = int(rows * cols)
            entry["matches"] = [r["model"] for r in entry["models"] if r["mismatches"] == 0]
            entry["ok"] = bool(entry["matches"])
            say(f"{case.label}: {rows * cols} outputs; "
                + "; ".join(f"{r['model']}: {r['mismatches']} mismatches" for r in entry["models"]))
        except Exception as e:  # noqa: BLE001  (one failing call must not hide the others)
            why = str(e).strip().splitlines()[0][:160] if str(e).strip() else ""
            if case.op == "mm_out" and ("out_dtype" in why or "mm.dtype" in why):
                entry["skipped"] = f"this torch has no mm(out_dtype=...) here: {type(e).__name__}: {why}"
            else:
                entry["error"] = f"{type(e).__name__}: {why}"
            say(f"{case.label}: {entry.get('skipped', entry.get('error'))}")
        entry["seconds"] = round(time.perf_counter() - t0, 2)
        res["cases"].append(entry)
    res["ok"] = all(c.get("ok", "skipped" in c) for c in res["cases"])
    return res


@ieee_mode
def render_markdown(res: dict[str, Any]) -> str:
    """The ``torch_checks`` section of ``results.md`` (pure)."""
    b = res.get("backend", {})
    lines = ["## cuBLAS through PyTorch (one instruction's K, C = 0) vs `fpsim.mma.dot`", ""]
    if "unavailable" in res:
        return "\n".join(lines + [f"Not run: {res['unavailable']}", ""])
    lines += [f"torch {b.get('torch', '?')} (CUDA {b.get('cuda', '?')}) on {b.get('name', '?')}; presets of "
              f"`{res['preset_device']}`; M x N = {res['rows']} x {res['cols']}; seed {res['seed']}.", "",
              "| call | K | outputs | preset: mismatches (signed-zero diffs) | agrees with |", "|---|---|---|---|---|"]
    for c in res["cases"]:
        if "models" not in c:
            why = c.get("skipped") or c.get("error")
            lines.append(f"| {c['path']} | {c['k']} | | {'skipped' if 'skipped' in c else 'ERROR'}: {why} | |")
            continue
        per = "; ".join(f"{r['model']}: {r['mismatches']} ({r['zero_sign_diffs']})" for r in c["models"])
        lines.append(f"| {c['path']} | {c['k']} | {c['n']} | {per} | {', '.join(c['matches']) or 'none'} |")
    ex = [(c["path"], e) for c in res["cases"] for r in c.get("models", []) for e in r["examples"][:2]]
    if ex:
        lines += ["", "First mismatches:", ""] + [f"- {p}: `{json.dumps(e)}`" for p, e in ex[:8]]
    return "\n".join(lines) + "\n"


_SECTION = "## cuBLAS through PyTorch"


@ieee_mode
def main(argv: list[str] | None = None) -> int:
    """``python -m fpsim.gpu.torch_check --out DIR [--quick]``: exit 0 when every case agrees with a preset,
    1 when some do not or failed, 2 when torch cannot reach a GPU (recorded in the files all the same)."""
    from .run_all import _atomic_write

    ap = argparse.ArgumentParser(prog="python -m fpsim.gpu.torch_check", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory holding (or to hold) results.json and results.md")
    ap.add_argument("--as", dest="as_device", default=None, help="preset device name (default: the CUDA name)")
    ap.add_argument("--torch-device", default="cuda:0", help="torch device (default cuda:0; 'cpu' tests wiring)")
    ap.add_argument("--rows", type=int, default=8192, help="M of each GEMM (default 8192)")
    ap.add_argument("--cols", type=int, default=64, help="N of each GEMM (default 64)")
    ap.add_argument("--quick", action="store_true", help="M x N = 1024 x 16")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rows, cols = (1024, 16) if args.quick else (args.rows, args.cols)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    jpath, mpath = out / "results.json", out / "results.md"
    try:
        res = json.loads(jpath.read_text()) if jpath.exists() else {}
        if not isinstance(res, dict):
            raise ValueError("results.json does not hold an object")
    except ValueError as e:  # a torn or foreign file: start afresh
        print(f"fpsim.gpu.torch_check: {jpath} unreadable ({e}); writing a new one", file=sys.stderr)
        res = {}
    # The presets run_all chose (named after the CuPy device) unless --as names others.
    as_device = args.as_device or (str(res["preset_device"]) if res.get("preset_device") else None)
    rc = 0
    try:
        tc = run_torch_checks(as_device, torch_device=args.torch_device, rows=rows, cols=cols, seed=args.seed,
                              log=sys.stderr)
        rc = 0 if tc["ok"] else 1
    except GPUUnavailable as e:
        print(f"fpsim.gpu.torch_check: {e}", file=sys.stderr)
        tc, rc = {"unavailable": str(e), "ok": False}, 2
    res["torch_checks"] = tc
    md = mpath.read_text() if mpath.exists() else "# fpsim GPU cross-check\n\n"
    md = md.split(_SECTION)[0].rstrip("\n") + "\n\n" + render_markdown(tc)
    _atomic_write(jpath, json.dumps(res, indent=1, default=str) + "\n")
    _atomic_write(mpath, md)
    print(f"wrote the torch checks into {jpath} and {mpath}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
