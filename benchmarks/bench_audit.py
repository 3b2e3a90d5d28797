"""``fpsim audit`` throughput against a plain read of the same safetensors file, in one run.

Writes a synthetic BF16 checkpoint (transformer-like shapes; ``--gb`` GB, default 2), then times, each as
MB/s of checkpoint bytes:

* a plain read of the file (``readinto`` a 16 MiB buffer): cold (its pages evicted with
  ``posix_fadvise(DONTNEED)`` first; the disk's speed, or what is left of the page cache) and warm;
* ``audit_checkpoint`` serially (``workers=0``), on a 2-worker LocalCluster (``workers=2``: its start-up
  timed too) and on an already started one (``client=``), with one target (``fp8_e4m3:tensor``) and with
  the default five, cold and warm; every parallel report is checked equal to the serial one;

and the peak RSS of this process during the serial audit above its start (VmHWM), against the largest
tensor. Ratios audit / plain read are what benchmarks/README.md records. ``--baseline OLD_AUDIT_PY``
also times another version of ``fpsim/audit.py`` (loaded as a module beside this one) serially in the
same run, each cold and warm row right before the current one, and checks its report identical;
``--baseline-scaling OLD_SCALING_PY`` does the same with another version of ``fpsim/scaling.py`` swapped in
for the quantizers the audit calls (row ``0 scaling before``).

    python3 benchmarks/bench_audit.py [--gb 2] [--dir /tmp] [--keep] [--baseline /tmp/audit_old.py]
        [--baseline-scaling /tmp/scaling_old.py]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import sys
import tempfile
import time

import ml_dtypes
import numpy as np

import fpsim.audit as A
from fpsim._dask import dask_client

SHAPES = [("attn.qkv", (3 * 2048, 2048)), ("attn.proj", (2048, 2048)), ("mlp.up", (5632, 2048)),
          ("mlp.down", (2048, 5632)), ("ln", (2048,))]


def write_checkpoint(path: str, gb: float) -> tuple[int, int]:
    """A BF16 checkpoint of about ``gb`` GB written tensor by tensor; returns (bytes, largest tensor bytes)."""
    per_layer = sum(2 * int(np.prod(s)) for _, s in SHAPES)
    layers = max(1, int(gb * 1e9 // per_layer))
    head, off, largest = {}, 0, 0
    for i in range(layers):
        for name, s in SHAPES:
            n = 2 * int(np.prod(s))
            head[f"layers.{i}.{name}"] = {"dtype": "BF16", "shape": list(s), "data_offsets": [off, off + n]}
            off += n
            largest = max(largest, n)
    hb = json.dumps(head).encode()
    hb += b" " * (-len(hb) % 8)
    rng = np.random.default_rng(0)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb)
        for i in range(layers):
            for name, s in SHAPES:
                std = 1.0 if name == "ln" else 0.02 / (1 + i % 4)
                w = (rng.standard_normal(s, dtype=np.float32) * std).astype(ml_dtypes.bfloat16)
                f.write(w.tobytes())
        f.flush()
        os.fsync(f.fileno())
    return off + 8 + len(hb), largest


def evict(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def plain_read(path: str) -> float:
    buf = bytearray(16 << 20)
    mv = memoryview(buf)
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.readinto(mv):
            pass
    return time.perf_counter() - t0


def hwm() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def reset_hwm() -> None:
    """Reset VmHWM to the current RSS (Linux >= 4.0: ``echo 5 > /proc/self/clear_refs``)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=2.0)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--keep", action="store_true", help="keep the checkpoint")
    ap.add_argument("--skip-default", action="store_true", help="only the one-target audits")
    ap.add_argument("--baseline", default=None, help="an older fpsim/audit.py to time serially beside this one")
    ap.add_argument("--baseline-scaling", default=None,
                    help="an older fpsim/scaling.py to time serially (in the audit) beside this one")
    args = ap.parse_args()
    base_mod = None
    scal_mod = None
    if args.baseline_scaling:
        import importlib.util

        spec = importlib.util.spec_from_file_location("fpsim._scaling_baseline", args.baseline_scaling)
        assert spec is not None and spec.loader is not None
        scal_mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = scal_mod
        spec.loader.exec_module(scal_mod)
    if args.baseline:
        import importlib.util

        spec = importlib.util.spec_from_file_location("fpsim._audit_baseline", args.baseline)
        assert spec is not None and spec.loader is not None
        base_mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = base_mod
        spec.loader.exec_module(base_mod)
    free = shutil.disk_usage(args.dir).free
    if free < 3 * args.gb * 1e9:
        sys.exit(f"only {free / 1e9:.1f} GB free in {args.dir}; pass a smaller --gb")
    d = tempfile.mkdtemp(dir=args.dir, prefix="bench-audit-")
    path = os.path.join(d, "model.safetensors")
    try:
        t0 = time.perf_counter()
        size, largest = write_checkpoint(path, args.gb)
        n_t = len(A.list_tensors(path))
        print(f"checkpoint: {size / 1e9:.2f} GB BF16, {n_t} tensors, largest {largest / 2**20:.0f} MiB "
              f"(written in {time.perf_counter() - t0:.0f} s); {os.cpu_count()} CPUs; "
              f"load average {os.getloadavg()[0]:.1f}")
        mb = size / 1e6
        evict(path)
        cold = plain_read(path)
        warm = min(plain_read(path) for _ in range(2))
        print(f"plain read: cold {mb / cold:8.0f} MB/s   warm {mb / warm:8.0f} MB/s")
        rows = []
        runs = [("fp8_e4m3:tensor", ["fp8_e4m3:tensor"])]
        if not args.skip_default:
            runs.append(("default 5 targets", list(A.DEFAULT_TARGETS)))
        small = A.save_safetensors({"a": np.ones((4, 256), np.float32)}, os.path.join(d, "s.safetensors"))
        for label, tg in runs:
            A.audit_checkpoint(small, tg, workers=0)  # imports, tables
            if base_mod is not None:
                base_mod.audit_checkpoint(small, tg, workers=0)
            serial = None
            before = (("0 before",) if base_mod is not None else ()) + (("0 scaling before",) if scal_mod else ())
            for workers in before + ("0", "2", "2 started"):
                for cache in ("cold", "warm"):
                    if cache == "cold":
                        evict(path)
                    base = rss()
                    reset_hwm()
                    if workers == "2 started":  # the cluster's start-up (seconds) not timed
                        with dask_client(workers=2) as c:
                            A.audit_checkpoint(small, tg, client=c)
                            t0 = time.perf_counter()
                            rep = A.audit_checkpoint(path, tg, client=c)
                            dt = time.perf_counter() - t0
                    else:
                        mod = base_mod if workers == "0 before" else A
                        new_s = A._judge.S
                        if workers == "0 scaling before":
                            A._judge.S = scal_mod
                        try:
                            t0 = time.perf_counter()
                            rep = mod.audit_checkpoint(path, tg, workers=int(workers.split()[0]))
                            dt = time.perf_counter() - t0
                        finally:
                            A._judge.S = new_s
                    assert len(rep["tensors"]) == n_t
                    if serial is None:
                        serial = rep["tensors"]
                    assert rep["tensors"] == serial, f"run {workers!r} differs from the first serial one"
                    peak = hwm() - base if workers == "0" and cache == "cold" and label == runs[0][0] else None
                    ref = cold if cache == "cold" else warm
                    rows.append((label, workers, cache, mb / dt, (mb / dt) / (mb / ref), peak))
        print(f"{'targets':<20} {'workers':>10} {'cache':>5} {'MB/s':>8} {'/ plain read':>12}")
        for label, w, cache, rate, ratio, _ in rows:
            print(f"{label:<20} {w:>10} {cache:>5} {rate:8.1f} {ratio:12.4f}")
        if args.baseline:  # fresh processes (as `fpsim audit` runs): malloc's state is the process's own
            import subprocess

            code = ("import importlib.util, sys, time, fpsim.audit as A\n"
                    "w, p, tg, small, base = sys.argv[1:6]\ntg = tg.split(',')\nM = A\n"
                    "if w == 'before':\n"
                    "    s = importlib.util.spec_from_file_location('fpsim._audit_baseline', base)\n"
                    "    M = importlib.util.module_from_spec(s); sys.modules[s.name] = M; s.loader.exec_module(M)\n"
                    "if w == 'after, as fpsim audit': A._checkpoint._tune_malloc(own_process=True)\n"
                    "M.audit_checkpoint(small, tg, workers=0)\n"
                    "t0, c0 = time.perf_counter(), time.process_time()\nM.audit_checkpoint(p, tg, workers=0)\n"
                    "print(time.perf_counter() - t0, time.process_time() - c0)\n")
            print(f"fresh process, serial, warm page cache: {'targets':<20} {'version':<22} {'MB/s':>8} "
                  f"{'CPU MB/s':>9}")
            for label, tg in runs:
                for w in ("before", "after", "after, as fpsim audit"):
                    out = subprocess.run([sys.executable, "-c", code, w, path, ",".join(tg), small, args.baseline],
                                         capture_output=True, text=True, check=True).stdout.split()
                    print(f"{'':<39} {label:<20} {w:<22} {mb / float(out[0]):8.1f} {mb / float(out[1]):9.1f}")
        print(f"load average at the end {os.getloadavg()[0]:.1f}")
        peak = next(p for *_, p in rows if p is not None)
        print(f"peak RSS above start, serial audit: {peak / 2**20:.1f} MiB (largest tensor {largest / 2**20:.0f} MiB, "
              f"bound 2x = {2 * largest / 2**20:.0f} MiB; checkpoint {size / 2**20:.0f} MiB)")
    finally:
        if not args.keep:
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
