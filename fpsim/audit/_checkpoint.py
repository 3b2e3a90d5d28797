"""A whole checkpoint: :func:`audit_checkpoint` reads every header first, then audits the tensors serially or on
Dask workers (each worker reads the file itself; same chunks, same sums, same bits), and sums up the verdicts.
Public names are re-exported by :mod:`fpsim.audit`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from .._fpenv import ieee_mode
from ._judge import THRESHOLDS, Target, _audit_batch, _batchable, _batches, _parse_targets, audit_tensor
from ._safetensors import TensorInfo, _CHUNK, list_tensors


AUDIT_JSON_VERSION = 1
_LARGE_BYTES = 256 << 20  # checkpoints at least this large get a LocalCluster when workers is not given
_MALLOC_TUNED = False


def _tune_malloc(own_process: bool = False) -> None:
    """In a Dask worker process: undo ``MALLOC_TRIM_THRESHOLD_=65536``, which Dask's nanny sets so that
    workers hand freed memory back to the OS. It pins glibc's mmap threshold at 128 KiB, so every NumPy
    temporary of a chunk is a fresh mmap: measured 50 000 page faults instead of 900 and 3-5x slower
    audits. Here the thresholds become 32 MiB (mmap) and 64 MiB (trim): at most that much freed memory is
    kept per worker. Once per process, in every Dask worker process (also without the variable: glibc's
    own dynamic threshold still leaves a page fault per 4 KiB of most chunk temporaries; tuned, the
    workers' audit needs about 25% less CPU, measured), and in the ``fpsim audit`` command's process
    (``own_process``); never in a caller's own process (a serial :func:`audit_checkpoint`), and nothing
    happens outside glibc."""
    global _MALLOC_TUNED
    if _MALLOC_TUNED or not (own_process or "MALLOC_TRIM_THRESHOLD_" in os.environ or _in_dask_worker()):
        return
    _MALLOC_TUNED = True
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.mallopt(-1, 64 << 20)  # M_TRIM_THRESHOLD
        libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        pass


def _in_dask_worker() -> bool:
    """Whether this process is a Dask worker (where the audit owns the process's allocator settings)."""
    import sys

    if "distributed" not in sys.modules:
        return False
    try:
        sys.modules["distributed"].get_worker()
    except (ValueError, AttributeError):
        return False
    return True


_Job = tuple[tuple[TensorInfo, ...], tuple[Target, ...], int]


def _audit_job(job: _Job) -> list[dict[str, Any]]:
    """What a worker runs: plain data in (path, offset, dtype, shape of one tensor, or of a batch of small
    ones; the parsed targets), small dicts out (one per tensor)."""
    _tune_malloc()
    ts, tgs, chunk = job
    if len(ts) == 1 and not _batchable(ts[0], tgs, chunk):
        return [audit_tensor(ts[0], list(tgs), chunk=chunk)]
    return _audit_batch(ts, tgs)


# --------------------------------------------------------------------------------------------------
# A whole checkpoint

_ORDER = {"risk": 0, "warn": 1, "ok": 2}


@ieee_mode
def at_risk(report: Mapping[str, Any], k: int = 10) -> list[dict[str, Any]]:
    """The ``k`` (tensor, target) pairs most at risk: worst verdict first, then lowest SQNR.

    >>> at_risk({"tensors": []})
    []
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"k must be an integer >= 0, got {k!r}")
    rows = []
    for e in report["tensors"]:
        for name, r in e.get("targets", {}).items():
            if r["verdict"] != "ok":
                rows.append({"tensor": e["name"], "target": name, "verdict": r["verdict"], "sqnr_db": r["sqnr_db"],
                             "underflow": r["underflow"], "overflow": r["overflow"], "reasons": r["reasons"]})
    rows.sort(key=lambda r: (_ORDER[r["verdict"]], r["sqnr_db"], r["tensor"], r["target"]))
    return rows[:k]


def _summary(tensors: list[dict[str, Any]], tgs: list[Target]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for g in tgs:
        rs = [e["targets"][g.name] for e in tensors if "targets" in e]
        counts = {v: sum(r["verdict"] == v for r in rs) for v in ("ok", "warn", "risk")}
        out[g.name] = {**counts, "worst_sqnr_db": min((r["sqnr_db"] for r in rs), default=math.inf),
                       "floor_db": g.floor_db}
    return out


@ieee_mode
def audit_checkpoint(path: str | os.PathLike[str], targets: Sequence[str | Target] | str | None = None, *,
                     workers: int | None = None, scheduler: str | None = None, client: Any = None,
                     top: int = 10, progress: bool | None = False, chunk: int = _CHUNK) -> dict[str, Any]:
    """Audit every tensor of a safetensors checkpoint against each target; returns the JSON report.

    Parameters
    ----------
    path : str or path-like
        A ``.safetensors`` file, a ``*.safetensors.index.json`` or a folder holding one (see
        :func:`list_tensors`). All headers are validated before any data is read.
    targets : sequence of str, optional
        ``FORMAT:SCALING`` names (comma-separated strings too; :func:`parse_target`); default
        :data:`DEFAULT_TARGETS`.
    workers : int, optional
        ``0``: serially in this process. ``N >= 1``: a LocalCluster of N worker processes (one thread
        each). Default: serial for checkpoints under 256 MB, else a LocalCluster with one worker per CPU.
    scheduler : str, optional
        Address of a running Dask scheduler (``tcp://host:8786``); its workers must see ``path``.
    client : distributed.Client, optional
        An existing client to use (tests, notebooks); wins over ``workers`` and ``scheduler``.
    top : int
        How many (tensor, target) pairs go into ``at_risk``.
    progress : bool or None
        Progress bar on stderr (``None``: when stderr is a terminal).
    chunk : int
        Elements per chunk (memory per worker: a few dozen bytes per chunk element plus one band's pages).

    Returns
    -------
    dict
        ``{"version", "path", "files", "targets", "thresholds", "tensors", "skipped", "at_risk", "summary",
        "bytes"}``; entries of ``tensors`` as :func:`audit_tensor` returns them, in checkpoint order.
        Identical for every way of running (serial, LocalCluster, scheduler).
    """
    from .._dask import check_scheduler_address, check_workers, dask_client, progress_bar

    tgs = _parse_targets(targets)
    if isinstance(top, bool) or not isinstance(top, int) or top < 0:
        raise ValueError(f"top must be an integer >= 0, got {top!r}")
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 128:
        raise ValueError(f"chunk must be an integer >= 128 (elements), got {chunk!r}")
    if scheduler is not None:
        scheduler = check_scheduler_address(scheduler)
    if workers is not None and not (workers == 0 and not isinstance(workers, bool)):
        workers = check_workers(workers)
    infos = list_tensors(path)  # every header checked before any data is touched
    names = tuple(g.name for g in tgs)
    targets_t = tuple(tgs)  # parsed once here, not once per tensor
    small = [i for i, t in enumerate(infos) if _batchable(t, targets_t, chunk)]
    groups = _batches(infos, small) + [[i] for i, t in enumerate(infos) if not _batchable(t, targets_t, chunk)]
    jobs: list[_Job] = [(tuple(infos[i] for i in grp), targets_t, chunk) for grp in groups]
    total = sum(t.nbytes for t in infos)
    # biggest first keeps workers busy to the end; results are put back in checkpoint order
    order = sorted(range(len(jobs)), key=lambda j: -sum(t.nbytes for t in jobs[j][0]))
    results: list[dict[str, Any] | None] = [None] * len(infos)
    bar = progress_bar(len(infos), desc="audit", enabled=progress)
    try:
        parallel = client is not None or scheduler is not None or (
            workers != 0 and (workers is not None or total >= _LARGE_BYTES))
        if not parallel:
            for j in order:
                for i, r in zip(groups[j], _audit_job(jobs[j])):
                    results[i] = r
                bar.update(len(groups[j]))
        else:
            import uuid

            tag = uuid.uuid4().hex[:12]

            def run(c: Any) -> None:
                futs = {c.submit(_audit_job, jobs[i], pure=False, retries=2, key=f"fpsim-audit-{tag}-{i}"): i
                        for i in order}
                import distributed

                try:
                    for fut in distributed.as_completed(list(futs), loop=c.loop):  # type: ignore[no-untyped-call]
                        grp = groups[futs[fut]]
                        for i, r in zip(grp, fut.result()):
                            results[i] = r
                        bar.update(len(grp))
                except BaseException:
                    c.cancel([f for f in futs if not f.done()])
                    raise

            if client is not None:
                run(client)
            else:
                with dask_client(workers=workers, scheduler=scheduler) as c:
                    run(c)
    finally:
        bar.close()
    tensors = [r for r in results if r is not None and "targets" in r]
    skipped = [{"name": r["name"], "dtype": r["dtype"], "reason": r["skipped"]}
               for r in results if r is not None and "skipped" in r]
    rep: dict[str, Any] = {
        "version": AUDIT_JSON_VERSION, "path": os.fspath(path),
        "files": sorted({os.path.basename(t.file) for t in infos}),
        "targets": list(names), "thresholds": dict(THRESHOLDS), "tensors": tensors, "skipped": skipped,
        "bytes": total,
    }
    rep["at_risk"] = at_risk(rep, top)
    rep["summary"] = _summary(tensors, tgs)
    return rep


