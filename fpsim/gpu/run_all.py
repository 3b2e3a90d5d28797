"""Run every GPU cross-check and the probe, and write ``results.json`` and ``results.md``.

Usage (on a machine with CuPy and a CUDA GPU; a few minutes on an H200)::

    python -m fpsim.gpu.run_all --out gpu-results            # device 0, presets named after the device
    python -m fpsim.gpu.run_all --out DIR --device 1 --as h200 --rows 20000

Exit status: 0 when every comparison agrees bit for bit, 1 when some disagree (the files say which), 2 when
no GPU can be used (one line on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._fpenv import ieee_mode
from .fragments import BLOCK_SCALED_INSTRUCTIONS, GENERATION_INSTRUCTIONS, PATHS, instruction_for

__all__ = ["WGMMA_PATHS", "main", "render_markdown", "run_all"]

#: Hopper ``wgmma`` FP8 paths run after the ``mma.sync`` ones (on compute capability 9.0 only).
WGMMA_PATHS: tuple[tuple[str, str], ...] = (("fp8_e4m3", "fp32"), ("fp8_e5m2", "fp32"), ("fp8_e4m3", "fp16"),
                                            ("fp8_e5m2", "fp16"))


def _atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to a temporary beside ``path`` and rename it over ``path``; a symbolic link is
    written through (the temporary goes beside its final target), never replaced by a plain file."""
    path = Path(os.path.realpath(path))
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


@ieee_mode
def run_all(device: int = 0, *, as_device: str | None = None, rows: int = 10000, conv_random: int = 1 << 20,
            seed: int = 0, log: Any = None,
            progress: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run conversions, MMA cross-checks and the probe on CUDA device `device`; return a JSON-able dict.

    `progress`, if given, is called with the dict so far after each check (``main`` writes the files then, so
    that a run stopped by a time limit leaves what it finished)."""
    from ._device import device_info, is_compile_error
    from .convert import CONVERSIONS, crosscheck_round
    from .mma_check import crosscheck_block_scaled, crosscheck_mma
    from .probing import probe
    from .wgmma import crosscheck_wgmma

    def say(msg: str) -> None:
        if log is not None:
            print(msg, file=log, flush=True)
        if progress is not None:
            progress(res)

    def check_mma(label: str, run: Callable[[], Any]) -> None:
        """One MMA path: its report; "skipped" where the toolkit cannot build its kernel; else an error. A failing
        or unsupported path never hides the others."""
        t0 = time.perf_counter()
        try:
            r = run()
        except Exception as e:  # noqa: BLE001
            why = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            if is_compile_error(e):
                res["mma"].append({"path": label, "skipped": f"the CUDA toolkit cannot build it: {why}"})
                say(f"mma {label}: skipped ({why})")
            else:
                res["errors"].append(f"mma {label}: {type(e).__name__}: {why}")
                say(res["errors"][-1])
            return
        res["mma"].append({"path": label, **r.to_dict(), "seconds": round(time.perf_counter() - t0, 2)})
        say(r.summary())

    info = device_info(device)
    name = as_device or info.name
    res: dict[str, Any] = {"device": info.to_dict(), "preset_device": name, "rows": rows, "seed": seed,
                           "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                           "conversions": [], "mma": [], "probe": None, "errors": []}
    for fmt, rnd, sat in CONVERSIONS:
        t0 = time.perf_counter()
        try:
            r = crosscheck_round(fmt, conv_random, rnd, saturate=sat, device=device, seed=seed)
            res["conversions"].append({**r.to_dict(), "seconds": round(time.perf_counter() - t0, 2)})
            say(r.summary())
        except Exception as e:  # noqa: BLE001  (one failing intrinsic must not hide the others)
            res["errors"].append(f"conversion {fmt} {rnd}{' sat' if sat else ''}: {type(e).__name__}: {e}")
            say(res["errors"][-1])
    for inp, out in PATHS:
        ins = instruction_for(inp, out)
        if info.cc < ins.min_cc:
            res["mma"].append({"path": ins.label, "skipped": f"needs compute capability {ins.min_cc}"})
            continue
        check_mma(ins.label, lambda: crosscheck_mma(name, inp, out, rows, device=device, seed=seed))
    for label, gins in GENERATION_INSTRUCTIONS.items():
        if not gins.runs_on(info.cc):
            where = f"compute capability {gins.min_cc}" + (" exactly" if gins.arch_suffix else " or later")
            res["mma"].append({"path": label, "skipped": f"needs {where} ({gins.arch})"})
            continue
        if gins.quad_pairs and info.cc != gins.min_cc:
            # later GPUs accept m8n8k4 but the PTX ISA calls it optimized for sm_70 only; no preset models it there
            res["mma"].append({"path": label, "skipped": "m8n8k4 is checked against the v100 preset on Volta only"})
            continue
        check_mma(label, lambda: crosscheck_mma(name, gins.input, gins.output, rows, device=device, seed=seed,
                                                instruction=gins, probes=gins.input.width >= 8))
    for label, bins in BLOCK_SCALED_INSTRUCTIONS.items():
        if not bins.runs_on(info.cc):
            res["mma"].append({"path": label, "skipped": f"needs compute capability {bins.min_cc} exactly ({bins.arch})"})
            continue
        # the model is the rtx5090 preset: the only device these sm_120a instructions run on
        check_mma(label, lambda: crosscheck_block_scaled(bins, rows, device=device, seed=seed))
    for inp, out in WGMMA_PATHS:
        label = f"wgmma {inp}->{out}"
        if info.cc != 90:  # wgmma exists on sm_90a only
            res["mma"].append({"path": label, "skipped": "wgmma needs compute capability 9.0 (sm_90a)"})
            continue
        check_mma(label, lambda: crosscheck_wgmma(name, inp, out, rows, device=device, seed=seed))
    t0 = time.perf_counter()
    try:
        pr = probe(device, seed=seed)
        res["probe"] = {**pr.to_dict(), "seconds": round(time.perf_counter() - t0, 2)}
        say(pr.summary())
    except Exception as e:  # noqa: BLE001  (recorded in the report instead)
        res["errors"].append(f"probe: {type(e).__name__}: {e}")
    res["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    res["ok"] = (not res["errors"] and all(c["ok"] for c in res["conversions"])
                 and all(m.get("ok", True) for m in res["mma"]))
    return res


@ieee_mode
def render_markdown(res: dict[str, Any]) -> str:
    """A Markdown report of :func:`run_all`'s result (pure)."""
    d = res["device"]
    lines = [f"# fpsim GPU cross-check: {d['name']}", "",
             (f"Compute capability {d['compute_capability']}, CUDA runtime {d['cuda_runtime']}, CuPy {d['cupy']}; "
              f"presets of `{res['preset_device']}`; {res['rows']} random outputs per MMA path; seed {res['seed']}; "
              f"run {res['started']} to {res.get('finished', '?')}."), "",
             ("**Partial: the run stopped after the checks below (see log.txt)**" if res.get("partial") else
              f"**Overall: {'all bit-exact' if res.get('ok') else 'DIFFERENCES FOUND (see below)'}**"), "",
             "## Conversions (CUDA intrinsics vs `fpsim.to_bits`)", "",
             "| format | rounding | SATFINITE | intrinsic | inputs | mismatches |", "|---|---|---|---|---|---|"]
    for c in res["conversions"]:
        lines.append(f"| {c['format']} | {c['rounding']} | {'yes' if c['saturate'] else 'no'} | `{c['intrinsic']}` | "
                     f"{c['n']} | {c['mismatches']} |")
    lines += ["", "## One `mma.sync` (or Hopper `wgmma`) instruction vs `fpsim.mma.dot`", "",
              "| path | instruction | model | outputs | mismatches | probes off | signed-zero diffs |",
              "|---|---|---|---|---|---|---|"]
    for m in res["mma"]:
        if "skipped" in m:
            lines.append(f"| {m['path']} | skipped: {m['skipped']} | | | | | |")
            continue
        lines.append(f"| {m['path']} | `{m['instruction']}` | {m['model']} | {m['n']} | {m['mismatches']} | "
                     f"{', '.join(m['probe_mismatches']) or '-'} | {m['zero_sign_diffs']} |")
    pr = res.get("probe")
    if pr:
        lines += ["", "## Probe: fitted block-FMA parameters", "",
                  "| path | k | neab | rounding | mb | mel | C | grouping | fit | matching presets |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for f in pr["fits"]:
            fit = "exact" if f["exact"] else f"{f['mismatches']} off"
            if f["alternatives"]:
                fit += f" ({len(f['alternatives'])} alternatives)"
            lines.append(f"| {f['input']}->{f['output']} | {f['k']} | {f['neab']} | {f['rounding']} | {f['mb']} | "
                         f"{f['mel']} | {f['c_entry']} | {f['grouping']} | {fit} | {', '.join(f['matches']) or 'none'} |")
        for path, why in pr["skipped"]:
            lines.append(f"| {path} | skipped: {why} | | | | | | | | |")
        lines += ["", "Detector readings:", ""]
        for f in pr["fits"]:
            for k, v in f["detectors"].items():
                lines.append(f"- {f['input']}->{f['output']} {k}: {v}")
    if res["errors"]:
        lines += ["", "## Errors", ""] + [f"- {e}" for e in res["errors"]]
    bad = [c for c in res["conversions"] if c["mismatches"]] + [m for m in res["mma"] if m.get("mismatches")]
    if bad:
        lines += ["", "## First mismatches", ""]
        for b in bad:
            for e in b["examples"][:3]:
                lines.append(f"- {b.get('path', b.get('format'))}: `{json.dumps(e)}`")
    return "\n".join(lines) + "\n"


@ieee_mode
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fpsim.gpu.run_all", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory for results.json and results.md")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--as", dest="as_device", default=None, help="preset device name (default: the CUDA name)")
    ap.add_argument("--rows", type=int, default=10000, help="random MMA outputs per path (default 10000)")
    ap.add_argument("--conv-random", type=int, default=1 << 20, help="random conversion inputs per intrinsic")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    from ._device import GPUUnavailable

    out = Path(args.out)

    def write(res: dict[str, Any]) -> None:
        out.mkdir(parents=True, exist_ok=True)
        _atomic_write(out / "results.json", json.dumps(res, indent=1, default=str) + "\n")
        _atomic_write(out / "results.md", render_markdown(res))

    try:
        res = run_all(args.device, as_device=args.as_device, rows=args.rows, conv_random=args.conv_random,
                      seed=args.seed, log=sys.stderr, progress=lambda r: write({**r, "partial": True}))
    except GPUUnavailable as e:
        print(f"fpsim.gpu.run_all: {e}", file=sys.stderr)
        return 2
    write(res)
    print(f"wrote {out / 'results.json'} and {out / 'results.md'}", file=sys.stderr)
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
