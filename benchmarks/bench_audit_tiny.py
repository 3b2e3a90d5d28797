"""``fpsim audit`` cost per tensor on a checkpoint of many tiny tensors (the per-tensor overhead).

A header within the 100 MB limit can list over a million tensors; real checkpoints hold thousands of
small ones (biases, norms, per-block scales). Writes ``--n`` one-element F32 tensors (and, with
``--shape``, another small shape) and times ``audit_checkpoint`` serially with the five default targets:
batched (the default path), one tensor at a time (``_SMALL = 0``: what every tensor cost before batching),
and with ``--baseline OLD_AUDIT_PY`` another version of ``fpsim/audit.py`` loaded beside this one. Checks
that the three reports are identical. Prints ms per tensor.

    python3 benchmarks/bench_audit_tiny.py [--n 20000] [--shape 1] [--baseline /tmp/audit_old.py]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import struct
import sys
import tempfile
import time
from typing import Any

import numpy as np

import fpsim.audit as A


def write(path: str, n: int, shape: tuple[int, ...]) -> None:
    k = int(np.prod(shape))
    head = {f"t{i}": {"dtype": "F32", "shape": list(shape), "data_offsets": [4 * k * i, 4 * k * (i + 1)]}
            for i in range(n)}
    hb = json.dumps(head).encode()
    data = np.random.default_rng(0).standard_normal(n * k).astype(np.float32).tobytes()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb + data)


def timed(mod: Any, path: str) -> tuple[float, str]:
    t0 = time.perf_counter()
    rep = mod.audit_checkpoint(path, workers=0)
    return time.perf_counter() - t0, A.to_json(rep)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20000, help="tensors (default 20000)")
    ap.add_argument("--shape", default="1", help="each tensor's shape, e.g. 1 or 4x16 (default 1)")
    ap.add_argument("--one-at-a-time", type=int, default=1500,
                    help="tensors for the unbatched and baseline runs (slow: ~6 ms each; default 1500)")
    ap.add_argument("--baseline", default=None, help="an older fpsim/audit.py to time beside this one")
    args = ap.parse_args()
    shape = tuple(int(s) for s in args.shape.split("x"))
    d = tempfile.mkdtemp(prefix="bench-audit-tiny-")
    big, small = os.path.join(d, "big.safetensors"), os.path.join(d, "small.safetensors")
    write(big, args.n, shape)
    write(small, args.one_at_a_time, shape)
    A.audit_checkpoint(small, workers=0)  # imports and tables warm
    t, _ = timed(A, big)
    print(f"batched          {args.n:7d} tensors {t:8.2f} s  {t / args.n * 1e3:7.3f} ms/tensor")
    tb, ref = timed(A, small)
    m = args.one_at_a_time
    print(f"batched          {m:7d} tensors {tb:8.2f} s  {tb / m * 1e3:7.3f} ms/tensor")
    keep = A._judge._SMALL
    A._judge._SMALL = 0
    try:
        t1, rep1 = timed(A, small)
    finally:
        A._judge._SMALL = keep
    assert rep1 == ref, "unbatched report differs"
    print(f"one at a time    {m:7d} tensors {t1:8.2f} s  {t1 / m * 1e3:7.3f} ms/tensor")
    if args.baseline:
        spec = importlib.util.spec_from_file_location("fpsim._audit_baseline", args.baseline)
        assert spec is not None and spec.loader is not None
        base = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = base
        spec.loader.exec_module(base)
        t2, rep2 = timed(base, small)
        same = json.loads(rep2)["tensors"] == json.loads(ref)["tensors"]
        print(f"baseline         {m:7d} tensors {t2:8.2f} s  {t2 / m * 1e3:7.3f} ms/tensor  "
              f"(report {'identical' if same else 'DIFFERS'})")


if __name__ == "__main__":
    main()
