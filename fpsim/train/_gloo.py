"""Run real ``torch.distributed`` gloo all-reduces on localhost, for checking :func:`fpsim.train.all_reduce`.

Not imported by ``fpsim``: torch is imported only inside the worker processes (this file run as a
script, which imports nothing from fpsim), so the library stays light. :func:`run_gloo` starts ``world_size`` processes with
the gloo backend on ``127.0.0.1`` (a free port, ``OMP_NUM_THREADS=1``), each all-reduces every case's
input of its rank (:func:`case_input`, a pure function of the case and the rank) and rank 0 writes the
results; every rank writes a digest of its results, so the caller can check that all ranks got the same
bits. Processes that do not finish within ``timeout`` seconds are killed.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["case_input", "run_gloo"]

_TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def case_input(case: Mapping[str, Any], rank: int) -> np.ndarray:
    """Rank ``rank``'s float32 input for ``case`` (keys ``n``, ``dtype``, ``seed``): normal values times
    powers of two spread over 2^-20..2^20 (2^-12..2^12 for fp16), so the order of the additions matters."""
    n, seed = int(case["n"]), int(case.get("seed", 0))
    span = 12 if case["dtype"] == "fp16" else 20
    rng = np.random.default_rng([seed, n, rank, 7])
    x = rng.standard_normal(n, dtype=np.float32)
    e = rng.integers(-span, span + 1, n).astype(np.float32)
    return (x * np.exp2(e)).astype(np.float32)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_gloo(world_size: int, cases: Sequence[Mapping[str, Any]], *, timeout: float = 180.0,
             repeats: int = 0) -> dict[str, Any]:
    """All-reduce every case with real gloo in ``world_size`` processes.

    ``cases``: dicts with ``n``, ``dtype`` (fp32/bf16/fp16), ``op`` (sum/avg), optionally ``seed``.
    Returns ``{"results": [float32 array per case, from rank 0], "agree": [bool per case: every rank's
    digest equal], "seconds": [median seconds of ``repeats`` timed all-reduces per case on rank 0, or
    None]}``. Raises ``RuntimeError`` with the workers' output when a worker fails or times out.
    """
    cases = [dict(c) for c in cases]
    with tempfile.TemporaryDirectory(prefix="fpsim-gloo-") as tmp:
        spec = os.path.join(tmp, "cases.json")
        with open(spec, "w") as f:
            json.dump({"cases": cases, "repeats": int(repeats)}, f)
        port = _free_port()
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        # The worker runs this file as a script: it imports numpy and torch, not fpsim.
        procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), str(r), str(world_size), tmp],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                 for r in range(world_size)]
        deadline = time.monotonic() + timeout
        outs: list[str] = []
        failed = False
        try:
            for p in procs:
                left = max(deadline - time.monotonic(), 0.1)
                try:
                    out, _ = p.communicate(timeout=left)
                except subprocess.TimeoutExpired:
                    failed = True
                    break
                outs.append(out.decode(errors="replace"))
                failed |= p.returncode != 0
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        if failed:
            raise RuntimeError(f"gloo workers (world size {world_size}) failed or timed out:\n" + "\n".join(outs))
        digests = []
        for r in range(world_size):
            with open(os.path.join(tmp, f"digest{r}.json")) as f:
                digests.append(json.load(f))
        with np.load(os.path.join(tmp, "rank0.npz")) as z:
            results = [np.array(z[f"c{i}"]) for i in range(len(cases))]
        with open(os.path.join(tmp, "times.json")) as f:
            seconds = json.load(f)
    agree = [all(d[i] == digests[0][i] for d in digests) for i in range(len(cases))]
    return {"results": results, "agree": agree, "seconds": seconds}


def _worker(rank: int, world: int, tmp: str) -> None:  # pragma: no cover - runs in the subprocesses
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    with open(os.path.join(tmp, "cases.json")) as f:
        spec = json.load(f)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    try:
        results, digests, times = {}, [], []
        for i, case in enumerate(spec["cases"]):
            dt = getattr(torch, _TORCH_DTYPES[case["dtype"]])
            x = torch.from_numpy(case_input(case, rank)).to(dt)
            op = dist.ReduceOp.AVG if case.get("op", "sum") == "avg" else dist.ReduceOp.SUM
            t = x.clone()
            dist.all_reduce(t, op=op)
            out = t.float().numpy()
            digests.append(hashlib.sha1(out.tobytes()).hexdigest())
            if rank == 0:
                results[f"c{i}"] = out
            ts = []
            for _ in range(int(spec["repeats"])):
                t = x.clone()
                dist.barrier()
                t0 = time.perf_counter()
                dist.all_reduce(t, op=op)
                ts.append(time.perf_counter() - t0)
            times.append(float(np.median(ts)) if ts else None)
        with open(os.path.join(tmp, f"digest{rank}.json"), "w") as f:
            json.dump(digests, f)
        if rank == 0:
            savez: Any = np.savez  # its stubs' keyword type differs between NumPy versions
            savez(os.path.join(tmp, "rank0.npz"), **results)
            with open(os.path.join(tmp, "times.json"), "w") as f:
                json.dump(times, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":  # pragma: no cover
    _worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
