"""Sweeps: the demo's policy x seed x setting grid, run serially or on Dask distributed, with seed statistics.

A *cell* is one demo training run: one policy, one seed, one named setting (a :class:`DemoSettings`).
:func:`run_cell` trains it and returns plain data (losses, counters, the whole history: JSON-able, no
pickled objects). :func:`run_sweep` runs many cells, in this process or on Dask workers (an embedded
``LocalCluster`` by default, or an existing scheduler by address), writes each result to its own file
as it arrives, skips the cells a previous (interrupted) sweep already finished, and retries the cells of
failed or killed workers. Each cell is seeded by its own seed only, so the results are the same bits
whichever worker runs a cell and in whichever order (tests/test_sweep.py checks serial against two
workers, and a sweep in which a worker is killed). :func:`seed_spread` turns the results into the mean
and spread over seeds of every lesson the demo draws, and whether each effect is beyond seed noise.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import secrets
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from .._cliargs import CommandError
from .._fpenv import ieee_mode
from ..amp import get_policy
from ._files import atomic_write
from ._settings import DEFAULT_POLICIES, DemoSettings, check_output_dir
from ._threads import blas_threads
from .loop import History, Trainer

__all__ = ["LESSONS", "Cell", "Lesson", "Paired", "SweepError", "demo_sweep", "grid", "history_of", "load_results",
           "paired_interval", "run_cell", "run_sweep", "seed_spread", "t_quantile"]

SWEEP_VERSION = 1
#: The most seeds :func:`grid` makes from a count (``fpsim demo --seeds``): every seed is a training run per policy.
MAX_SEEDS = 10_000
_SETTING_RE = re.compile(r"\A[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}\Z")
_TMP_PREFIX = ".fpsim-demo-tmp-"  # the demo's pattern: check_output_dir removes stale ones
# keys of a result that depend on when and where a cell ran, not on what it computed
RUN_INFO = "run_info"


class SweepError(RuntimeError, CommandError):
    """Some cells failed on every try; the finished ones are kept (and a rerun with ``out=`` resumes)."""


@ieee_mode
@dataclass(frozen=True)
class Cell:
    """One training run of a sweep: ``policy`` trained with ``settings`` and seed ``seed``.

    ``setting`` names the settings (letters, digits, ``_ . -``); it is part of :attr:`id`, the key of the
    result (and its file name). ``settings.seed`` is ignored: the cell's own ``seed`` is used.

    >>> c = Cell("FP16-Mixed", 3)
    >>> c.id, c.policy
    ('default.fp16-mixed.s3', 'fp16-mixed')
    """

    policy: str
    seed: int
    setting: str = "default"
    settings: DemoSettings = field(default_factory=DemoSettings)

    def __post_init__(self) -> None:
        object.__setattr__(self, "policy", get_policy(self.policy).name)  # the one name rule
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)):
            raise TypeError(f"seed must be an int, got {type(self.seed).__name__}: {self.seed!r}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        object.__setattr__(self, "seed", int(self.seed))
        if not isinstance(self.setting, str) or _SETTING_RE.match(self.setting) is None:
            raise ValueError(f"setting name {self.setting!r} must be 1-64 letters, digits or _ . - "
                             "(it names the result file)")
        if not isinstance(self.settings, DemoSettings):
            raise TypeError(f"settings must be a DemoSettings, got {type(self.settings).__name__}")

    @property
    def id(self) -> str:
        """``"<setting>.<policy>.s<seed>"``: unique in a sweep, the result's key and file name."""
        return f"{self.setting}.{self.policy}.s{self.seed}"

    def run_settings(self) -> DemoSettings:
        """The settings this cell trains with (its own seed)."""
        return replace(self.settings, seed=self.seed)

    def digest(self) -> str:
        """A hash of everything the result depends on (policy, seed, settings): a resumed file must match."""
        d = {"policy": self.policy, "seed": self.seed, "settings": asdict(self.run_settings()),
             "version": SWEEP_VERSION}
        return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


@ieee_mode
def grid(policies: Sequence[str] | None = None, seeds: int | Iterable[int] = 1,
         settings: DemoSettings | Mapping[str, DemoSettings] | None = None) -> list[Cell]:
    """The cells of a policy x seed x setting grid, setting-major, then seed, then policy.

    ``seeds``: a count n (seeds 0..n-1) or the seeds themselves. ``settings``: one :class:`DemoSettings`
    (named ``"default"``), a mapping name -> settings, or None (the full demo's).

    >>> cells = grid(["fp32", "bf16-mixed"], seeds=2)
    >>> [c.id for c in cells]
    ['default.fp32.s0', 'default.bf16-mixed.s0', 'default.fp32.s1', 'default.bf16-mixed.s1']
    """
    names = list(dict.fromkeys(get_policy(p).name for p in (policies or DEFAULT_POLICIES)))
    if isinstance(seeds, bool):
        raise TypeError(f"seeds must be a count or a list of ints, got {seeds!r}")
    if isinstance(seeds, (int, np.integer)):
        if not 1 <= seeds <= MAX_SEEDS:
            raise ValueError(f"seeds must be >= 1 and <= {MAX_SEEDS}, got {seeds}")
        seed_list = list(range(int(seeds)))
    else:
        seed_list = list(dict.fromkeys(seeds))
        if not seed_list:
            raise ValueError("seeds is empty; give a count >= 1 or a list of seeds")
    if settings is None:
        sets: Mapping[str, DemoSettings] = {"default": DemoSettings()}
    elif isinstance(settings, DemoSettings):
        sets = {"default": settings}
    elif isinstance(settings, Mapping):
        sets = dict(settings)
        if not sets:
            raise ValueError("settings is an empty mapping; give at least one name -> DemoSettings")
    else:
        raise TypeError(f"settings must be a DemoSettings or a mapping name -> DemoSettings, got "
                        f"{type(settings).__name__}")
    return [Cell(p, s, name, st) for name, st in sets.items() for s in seed_list for p in names]


def _json_ready(o: Any) -> Any:
    if isinstance(o, dict):
        return {str(k): _json_ready(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_json_ready(v) for v in o]
    if isinstance(o, np.ndarray):
        return _json_ready(o.tolist())
    if isinstance(o, np.generic):
        return o.item()
    return o


def _canonical(obj: Any) -> Any:
    """The object as JSON gives it back (lists, floats exact; NaN/inf kept as Python's json writes them)."""
    return json.loads(json.dumps(_json_ready(obj)))


@ieee_mode
def run_cell(cell: Cell) -> dict[str, Any]:
    """Train one cell and return its result as plain JSON-able data.

    Keys: ``id``, ``policy``, ``seed``, ``setting``, ``digest`` (see :meth:`Cell.digest`), ``metrics`` (the
    demo's per-policy numbers: ``final_loss``, ``final_train_loss``, ``grad_underflow_fraction``,
    ``grad_subnormal_fraction``, ``lost_update_fraction``, ``skipped_steps``, ``final_loss_scale``,
    ``steps``, and for PTQ ``float_loss_before_quantization``), ``history`` (the run's
    :class:`~fpsim.train.History` as a dict, without its per-step wall times) and ``run_info`` (wall
    times, host, process: the only part that depends on where and when the cell ran). BLAS runs
    single-threaded, as in the demo. A PTQ cell trains its FP32 model itself (bit-identical to the demo,
    which reuses the fp32 run's weights), so that every cell stands alone.

    >>> from fpsim.train.demo import DemoSettings
    >>> tiny = DemoSettings(steps=2, n_layer=1, n_embd=8, n_head=2, batch_size=2, eval_every=2,
    ...                     histogram_every=2, task_kwargs={"n_symbols": 4, "length": 3})
    >>> r = run_cell(Cell("fp32", 0, "tiny", tiny))
    >>> r["id"], r["metrics"]["steps"], len(r["history"]["loss"])
    ('tiny.fp32.s0', 2, 2)
    """
    if not isinstance(cell, Cell):
        raise TypeError(f"run_cell takes a Cell, got {type(cell).__name__}")
    st = cell.run_settings()
    cfg = st.train_config()
    t0 = time.perf_counter()
    with blas_threads(1):
        tr = Trainer(cell.policy, cfg)
        tr.run(progress=False)
    wall = time.perf_counter() - t0
    h = dict(tr.history.to_dict())
    step_wall = h.pop("wall_s", [])
    s = tr.history.summary()
    metrics: dict[str, Any] = {k: s[k] for k in ("final_loss", "final_train_loss", "grad_underflow_fraction",
                                 "grad_subnormal_fraction", "lost_update_fraction", "skipped_steps",
                                 "final_loss_scale", "steps")}
    q = tr.policy.quant
    if q is not None and q.mode == "ptq":
        metrics["float_loss_before_quantization"] = h.get("float_eval_loss")
    out = {"fpsim_sweep_version": SWEEP_VERSION, "id": cell.id, "policy": cell.policy, "seed": cell.seed,
           "setting": cell.setting, "digest": cell.digest(), "metrics": metrics, "history": h,
           RUN_INFO: {"wall_s": wall, "step_wall_s": step_wall, "host": os.uname().nodename if hasattr(os, "uname")
                      else "", "pid": os.getpid()}}
    return _canonical(out)  # type: ignore[no-any-return]


@ieee_mode
def history_of(result: Mapping[str, Any]) -> History:
    """The :class:`~fpsim.train.History` of a cell result (its per-step wall times put back)."""
    d = json.loads(json.dumps(result["history"]))
    d["wall_s"] = list(result.get(RUN_INFO, {}).get("step_wall_s", [float("nan")] * len(d.get("step", []))))
    return History(d)


def _cell_path(folder: str, cell: Cell) -> str:
    return os.path.join(folder, f"{cell.id}.json")


def _read_result(path: str, cell: Cell) -> dict[str, Any] | None:
    """A finished cell's stored result, or None if there is none; ValueError if it is another cell's."""
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read().decode("utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as e:  # RecursionError: JSON nested too deeply to parse
        raise ValueError(f"cannot read the sweep result {path!r} ({e}); remove it to run that cell again") from None
    if not isinstance(data, dict) or data.get("id") != cell.id:
        raise ValueError(f"{path!r} is not the result of cell {cell.id!r}; remove it to run that cell again")
    if data.get("digest") != cell.digest():
        raise ValueError(f"{path!r} holds cell {cell.id!r} run with other settings (digest {data.get('digest')!r}, "
                         f"now {cell.digest()!r}); use another output folder or remove the file")
    return data


def _write_result(folder: str, cell: Cell, res: Mapping[str, Any]) -> None:
    data = json.dumps(res, indent=None).encode("utf-8")
    atomic_write(_cell_path(folder, cell), lambda f: f.write(data), prefix=_TMP_PREFIX, mode=0o644)


@ieee_mode
def load_results(cells: Sequence[Cell], out: str) -> dict[str, dict[str, Any]]:
    """The stored results of ``cells`` in folder ``out`` (cells without one are left out)."""
    found = {}
    for c in cells:
        r = _read_result(_cell_path(os.fspath(out), c), c)
        if r is not None:
            found[c.id] = r
    return found


def _same_bits(a: Any, b: Any) -> bool:
    """Equal as data, NaN equal to NaN (the check a duplicate result must pass)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


@ieee_mode
def run_sweep(cells: Sequence[Cell], *, workers: int | None = None, scheduler: str | None = None,
          out: str | os.PathLike[str] | None = None, progress: bool | None = None, retries: int = 2,
          log: Callable[[str], None] | None = None,
          run: Callable[[Cell], dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    """Run every cell (serially or on Dask) and return ``{cell id: result}`` in the cells' order.

    Parameters
    ----------
    cells : sequence of Cell
        E.g. from :func:`grid`; ids must be unique.
    workers : int, optional
        ``0``: one cell after another in this process (no Dask). ``n >= 1``: an embedded Dask
        ``LocalCluster`` of ``n`` worker processes, one thread each. None (default): a LocalCluster with
        one worker per CPU (at most one per cell) if ``dask.distributed`` is installed, else serially.
    scheduler : str, optional
        Address of a running Dask scheduler (``tcp://host:8786``): its workers run the cells (they need
        fpsim installed; results come back to this process, which writes them). Not with ``workers``.
    out : path, optional
        Folder for the results, one JSON file per cell (``<cell id>.json``), each written atomically as
        its cell finishes. Cells whose file is there already are not run again (resume); a file of the
        same cell id run with other settings raises ``ValueError``.
    progress : bool, optional
        A bar of cells done on stderr (None: only on a terminal; elsewhere a line through ``log`` per cell).
    retries : int
        On Dask: a cell whose run raises, or whose worker dies more often than Dask's
        ``distributed.scheduler.allowed-failures``, is resubmitted up to ``retries`` times; Dask itself
        moves the cells of a killed worker to another one. Every result is kept once, by cell id. Serially
        (``workers=0``) an exception propagates at once (the finished cells' files are kept).
    run : callable, optional
        What runs a cell (default :func:`run_cell`); it must be importable by the workers.

    Raises
    ------
    SweepError
        Cells that failed on every try (named, with their last error); the others' results are kept.
    """
    from .._dask import _NoBar, check_scheduler_address, check_workers, distributed_available, progress_bar

    cells = list(cells)
    for c in cells:
        if not isinstance(c, Cell):
            raise TypeError(f"cells must be Cell objects, got {type(c).__name__}: {c!r}")
    counts = Counter(c.id for c in cells)
    dup = sorted(i for i, k in counts.items() if k > 1)
    if dup:
        raise ValueError(f"duplicate cells: {', '.join(dup)}")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"retries must be an int >= 0, got {retries!r}")
    if scheduler is not None:
        scheduler = check_scheduler_address(scheduler)
        if workers is not None:
            raise ValueError("workers cannot be combined with scheduler (the scheduler's workers run the cells)")
    elif workers is not None and workers != 0:
        workers = check_workers(workers)
    elif workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)):
        raise TypeError(f"workers must be an int, got {type(workers).__name__}: {workers!r}")
    say = log or (lambda s: None)
    fn = run or run_cell
    folder = None
    if out is not None:
        folder = check_output_dir(out)
    results: dict[str, dict[str, Any]] = load_results(cells, folder) if folder else {}
    todo = [c for c in cells if c.id not in results]
    if results:
        say(f"sweep: {len(results)} of {len(cells)} cells already done in {folder}; running the other {len(todo)}")
    mode, n_workers = _execution(workers, scheduler, len(todo))
    use_dask = mode != "serial"
    if workers is None and scheduler is None and not use_dask and len(todo) > 1 and not distributed_available():
        say("sweep: dask.distributed is not installed; running the cells one after another "
            "(pip install 'fpsim-precision[dist]' to run them in parallel)")
    bar = progress_bar(len(cells), desc="fpsim sweep", enabled=progress)
    bar.update(len(results))
    # no terminal for the bar (output to a file or a pipe): a line through log per cell instead, so that a sweep of
    # minutes is not silent
    lines = progress is None and isinstance(bar, _NoBar)

    def record(cell: Cell, res: dict[str, Any]) -> None:
        if not isinstance(res, dict) or res.get("id") != cell.id:
            raise SweepError(f"cell {cell.id!r}: the runner returned {type(res).__name__}, not its result")
        if cell.id in results:  # a duplicate (a resubmitted cell finishing twice): same bits or a fault
            if not _same_bits({k: v for k, v in res.items() if k != RUN_INFO},
                              {k: v for k, v in results[cell.id].items() if k != RUN_INFO}):
                raise SweepError(f"cell {cell.id!r} gave different results on two runs: not reproducible")
            return
        if folder:
            _write_result(folder, cell, res)
        results[cell.id] = res
        bar.update(1)
        if lines:
            say(f"sweep: {len(results)}/{len(cells)} cells done ({cell.id})")

    t0 = time.perf_counter()
    try:
        if not todo:
            pass
        elif not use_dask:
            for c in todo:
                record(c, fn(c))
        else:
            _run_on_dask(todo, fn, record, workers=n_workers, scheduler=scheduler, retries=retries, say=say,
                         log=log)
    finally:
        bar.close()
    if todo:
        say(f"sweep: {len(todo)} cells in {time.perf_counter() - t0:.1f} s {_where(mode, n_workers, scheduler)}")
    return {c.id: results[c.id] for c in cells}


def _execution(workers: int | None, scheduler: str | None, n_todo: int) -> tuple[str, int | None]:
    """("serial" | "local" | "scheduler", LocalCluster worker count) for these options."""
    from .._dask import distributed_available

    if scheduler is not None:
        return "scheduler", None
    if workers == 0:
        return "serial", None
    if workers is None:
        if n_todo <= 1 or not distributed_available():
            return "serial", None
        return "local", min(os.cpu_count() or 1, n_todo)
    return "local", max(1, min(workers, n_todo))


def _where(mode: str, n: int | None, scheduler: str | None) -> str:
    if mode == "scheduler":
        return f"on the Dask scheduler at {scheduler}"
    if mode == "local":
        return f"on a local Dask cluster of {n} worker process{'es' if n != 1 else ''}"
    return "serially in this process"


@ieee_mode
def demo_sweep(out: str, st: DemoSettings, names: Sequence[str], *, seeds: int, workers: int | None = None,
               scheduler: str | None = None, progress: bool | None = None,
               log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The sweep behind ``fpsim demo --seeds N``: ``names`` x seeds ``st.seed .. st.seed + N - 1``.

    Results go to ``out/cells/<hash of the settings>/`` (so a rerun with the same settings resumes and
    other settings never mix in). Returns ``{"cells": {policy: {seed: result}}, "spread":``
    :func:`seed_spread` ``, "seeds", "n_seeds", "cells_dir", "where"}``.
    """
    if isinstance(seeds, bool) or not isinstance(seeds, (int, np.integer)) or not 1 <= seeds <= MAX_SEEDS:
        raise ValueError(f"seeds must be an integer >= 1 and <= {MAX_SEEDS}, got {seeds!r}")
    say = log or (lambda s: None)
    seed_list = list(range(st.seed, st.seed + int(seeds)))
    cells = grid(list(names), seed_list, {"demo": st})
    base = replace(st, seed=0)
    digest = hashlib.sha256(json.dumps(asdict(base), sort_keys=True, default=str).encode()).hexdigest()[:12]
    cells_dir = os.path.join(out, "cells", digest)
    mode, n = _execution(workers, scheduler, len(cells))
    say(f"sweep: {len(names)} policies x {len(seed_list)} seeds = {len(cells)} cells "
        f"{_where(mode, n, scheduler)}; results in {cells_dir}")
    res = run_sweep(cells, workers=workers, scheduler=scheduler, out=cells_dir, progress=progress, log=say)
    by: dict[str, dict[int, dict[str, Any]]] = {}
    for r in res.values():
        by.setdefault(r["policy"], {})[int(r["seed"])] = r
    spread = seed_spread(res)
    for les in spread["lessons"]:
        ci = les["ci"]
        say(f"  {les['title']}: A-B {les['diff']:+.4g}" + (f" [{ci[0]:+.3g}, {ci[1]:+.3g}]" if ci else "")
            + f" over {les['n']} seeds: {les['verdict']}")
    return {"cells": by, "spread": spread, "seeds": seed_list, "n_seeds": len(seed_list), "cells_dir": cells_dir,
            "where": _where(mode, n, scheduler)}


def _run_on_dask(todo: list[Cell], fn: Callable[[Cell], dict[str, Any]],
                 record: Callable[[Cell, dict[str, Any]], None], *, workers: int | None, scheduler: str | None,
                 retries: int, say: Callable[[str], None], log: Callable[[str], None] | None = None) -> None:
    from distributed import as_completed

    from .._dask import dask_client

    n = None if scheduler else min(workers or (os.cpu_count() or 1), len(todo))
    token = secrets.token_hex(4)  # keys unique to this sweep: a shared scheduler may hold others' tasks
    # log None: dask_client says on stderr that it waits for a worker (a scheduler with none is never silent)
    with dask_client(workers=n, scheduler=scheduler, log=log) as client:
        pending: dict[Any, tuple[Cell, int]] = {}

        def submit(c: Cell, attempt: int) -> Any:
            f = client.submit(fn, c, key=f"fpsim-cell-{c.id}-{token}-{attempt}", pure=False, retries=retries)
            pending[f] = (c, attempt)
            return f

        ac = as_completed([submit(c, 0) for c in todo], loop=client.loop)  # type: ignore[no-untyped-call]
        failed: dict[str, str] = {}
        for fut in ac:
            cell, attempt = pending.pop(fut)
            if fut.status == "finished":
                record(cell, fut.result())
            elif fut.status == "cancelled":  # by dask_client when the scheduler's workers are gone, or by someone
                # else on a shared scheduler: resubmitting would wait for ever, or against their will
                raise SweepError(f"cell {cell.id}: its task was cancelled on the scheduler (the finished cells are "
                                 "kept; run the sweep again with the same out= to resume)")
            else:  # raised on every Dask retry, or its workers kept dying (KilledWorker)
                exc = fut.exception()
                err = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
                if attempt < retries:
                    say(f"sweep: cell {cell.id} failed ({err}); resubmitting")
                    ac.add(submit(cell, attempt + 1))  # type: ignore[no-untyped-call]
                else:
                    failed[cell.id] = err
            fut.release()
    if failed:
        raise SweepError(f"{len(failed)} cell(s) failed after {retries} resubmissions: "
                         + "; ".join(f"{k}: {v}" for k, v in failed.items())
                         + " (the finished cells are kept; run the sweep again with the same out= to resume)")


# --------------------------------------------------------------------------------------------------
# seed statistics
# --------------------------------------------------------------------------------------------------

def _t_abs_cdf(t: float, nu: int) -> float:
    """P(|T| <= t) for Student's t with ``nu`` (integer) degrees of freedom (closed form, Abramowitz-Stegun
    26.7.3/26.7.4)."""
    th = math.atan(t / math.sqrt(nu))
    c2 = math.cos(th) ** 2
    if nu % 2 == 1:
        if nu == 1:
            return 2 * th / math.pi
        term, acc = 1.0, 1.0
        for k in range(1, (nu - 3) // 2 + 1):
            term *= c2 * (2 * k) / (2 * k + 1)
            acc += term
        return 2 / math.pi * (th + math.sin(th) * math.cos(th) * acc)
    term, acc = 1.0, 1.0
    for k in range(1, (nu - 2) // 2 + 1):
        term *= c2 * (2 * k - 1) / (2 * k)
        acc += term
    return math.sin(th) * acc


@ieee_mode
def t_quantile(p: float, nu: int) -> float:
    """The two-sided Student-t critical value: ``P(|T| <= t) = p`` for ``nu >= 1`` degrees of freedom.

    >>> round(t_quantile(0.95, 4), 3), round(t_quantile(0.95, 1), 3)
    (2.776, 12.706)
    """
    if isinstance(nu, bool) or not isinstance(nu, (int, np.integer)) or nu < 1:
        raise ValueError(f"degrees of freedom must be an int >= 1, got {nu!r}")
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p!r}")
    lo, hi = 0.0, 1.0
    while _t_abs_cdf(hi, int(nu)) < p:
        hi *= 2
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if _t_abs_cdf(mid, int(nu)) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return 0.5 * (lo + hi)


@ieee_mode
@dataclass(frozen=True)
class Lesson:
    """A comparison the demo report draws: ``metric`` of policy ``a`` against policy ``b``, seed by seed."""

    key: str
    title: str
    a: str
    b: str
    metric: str


LESSONS = (
    Lesson("bf16-vs-fp32", "BF16 mixed precision (FP32 master) vs FP32: final loss", "bf16-mixed", "fp32",
           "final_loss"),
    Lesson("fp16-vs-fp32", "FP16 mixed (master + dynamic loss scaling) vs FP32: final loss", "fp16-mixed", "fp32",
           "final_loss"),
    Lesson("no-scaling-underflow", "no loss scaling vs dynamic: gradient underflow", "fp16-no-scaling",
           "fp16-mixed", "grad_underflow_fraction"),
    Lesson("no-scaling-loss", "no loss scaling vs dynamic: final loss", "fp16-no-scaling", "fp16-mixed",
           "final_loss"),
    Lesson("static-underflow", "static scale 1024 vs dynamic: gradient underflow", "fp16-static", "fp16-mixed",
           "grad_underflow_fraction"),
    Lesson("no-master-lost", "no FP32 master vs master: lost updates", "fp16-no-master", "fp16-mixed",
           "lost_update_fraction"),
    Lesson("no-master-loss", "no FP32 master vs master: final loss", "fp16-no-master", "fp16-mixed", "final_loss"),
    Lesson("fast-scaler-skips", "scaler growth interval 8 vs 2000: skipped steps", "fp16-fast-scaler",
           "fp16-mixed", "skipped_steps"),
    Lesson("fast-scaler-loss", "scaler growth interval 8 vs 2000: final loss", "fp16-fast-scaler", "fp16-mixed",
           "final_loss"),
    Lesson("fp8-vs-fp32", "FP8 hybrid (delayed scaling) vs FP32: final loss", "fp8-hybrid", "fp32", "final_loss"),
    Lesson("int8-qat-ptq", "INT8 QAT vs PTQ: final loss", "int8-qat", "int8-ptq", "final_loss"),
    Lesson("int4-qat-ptq", "INT4 QAT vs PTQ: final loss", "int4-qat", "int4-ptq", "final_loss"),
)

_SPREAD_METRICS = ("final_loss", "grad_underflow_fraction", "lost_update_fraction", "skipped_steps")


def _stats(v: Sequence[float | None]) -> dict[str, Any]:
    a = np.asarray([np.nan if x is None else x for x in v], dtype=np.float64)
    a = a[np.isfinite(a)]
    n = int(a.size)
    return {"n": n, "mean": float(a.mean()) if n else None, "sd": float(a.std(ddof=1)) if n > 1 else None,
            "min": float(a.min()) if n else None, "max": float(a.max()) if n else None}


def _finite(v: float | None) -> bool:
    return v is not None and math.isfinite(v)


def _paired(da: Mapping[int, float | None], db: Mapping[int, float | None], level: float) -> dict[str, Any]:
    seeds = sorted(s for s in da if s in db and _finite(da[s]) and _finite(db[s]))
    a = np.asarray([da[s] for s in seeds], dtype=np.float64)
    b = np.asarray([db[s] for s in seeds], dtype=np.float64)
    d = a - b
    n = int(d.size)
    r: dict[str, Any] = {"n": n, "seeds": seeds, "mean_a": float(a.mean()) if n else None,
                         "mean_b": float(b.mean()) if n else None, "diff": float(d.mean()) if n else None,
                         "diff_sd": float(d.std(ddof=1)) if n > 1 else None, "ci": None, "verdict": "no data"}
    if n == 0:
        return r
    if n == 1:
        r["verdict"] = "one seed: no spread"
        return r
    half = t_quantile(level, n - 1) * float(d.std(ddof=1)) / math.sqrt(n)
    lo, hi = float(d.mean()) - half, float(d.mean()) + half
    r["ci"] = [lo, hi]
    if lo == 0.0 and hi == 0.0:
        r["verdict"] = "no difference"
    elif lo > 0.0 or hi < 0.0:
        r["verdict"] = "beyond seed noise"
    else:
        r["verdict"] = "within seed noise"
    return r


@dataclass(frozen=True)
class Paired:
    """A paired comparison over seeds: the mean of ``a - b``, its interval and the verdict (see
    :func:`paired_interval`). ``str()`` is the sentence a notebook or report prints, so the words and the
    numbers come from the same run."""

    n: int
    diff: float | None
    ci: tuple[float, float] | None
    verdict: str
    level: float = 0.95

    @property
    def beyond(self) -> bool:
        """True when the interval excludes 0 (the effect is *beyond seed noise*)."""
        return self.verdict == "beyond seed noise"

    def sentence(self, what: str = "a - b", fmt: str = "+.4f") -> str:
        """``"<what>: mean +0.0123, 95% paired interval [+0.0100, +0.0146] over 3 seeds: beyond seed noise"``."""
        if self.diff is None:
            return f"{what}: no data"
        head = f"{what}: mean {self.diff:{fmt}}"
        if self.ci is None:
            return f"{head} ({self.verdict})"
        lo, hi = self.ci
        return (f"{head}, {100 * self.level:g}% paired interval [{lo:{fmt}}, {hi:{fmt}}] over {self.n} seeds: "
                f"{self.verdict}")

    def __str__(self) -> str:
        return self.sentence()


def _by_seed(v: Mapping[int, float | None] | Sequence[float | None] | np.ndarray, name: str
             ) -> dict[int, float | None]:
    if isinstance(v, Mapping):
        bad = [k for k in v if isinstance(k, bool) or not isinstance(k, (int, np.integer))]
        if bad:
            raise TypeError(f"{name}: seeds (the mapping's keys) must be integers, got {bad[0]!r}")
        return {int(k): (None if x is None else float(x)) for k, x in v.items()}
    if isinstance(v, (str, bytes)) or not isinstance(v, (Sequence, np.ndarray)):
        raise TypeError(f"{name} must be a sequence of per-seed values or a mapping seed -> value, "
                        f"got {type(v).__name__}")
    raw = np.asarray(v)
    if raw.dtype.kind in "bSUV":
        raise TypeError(f"{name} must hold numbers (one per seed), got dtype {raw.dtype}")
    try:
        a = raw.astype(np.float64)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{name} must hold numbers or None (one per seed): {e}") from None
    if a.ndim != 1:
        raise ValueError(f"{name} must be one value per seed (1-D), got shape {a.shape}")
    return {i: float(x) for i, x in enumerate(a)}


@ieee_mode
def paired_interval(a: Mapping[int, float | None] | Sequence[float | None] | np.ndarray,
                    b: Mapping[int, float | None] | Sequence[float | None] | np.ndarray, *,
                    level: float = 0.95) -> Paired:
    """Is ``a - b`` beyond seed noise? The paired Student-t rule of :func:`seed_spread`, for any two metrics.

    ``a`` and ``b`` are one value per seed, as sequences in the same seed order or as mappings seed -> value;
    seeds missing or non-finite on either side are left out. With n seeds: the mean of the differences
    ``d = a - b`` and the ``level`` interval ``mean(d) +- t(n-1) * sd(d) / sqrt(n)``; *beyond seed noise* when
    it excludes 0, *within seed noise* when it contains 0 (one seed: no spread, no verdict). Print the result
    (or its :meth:`Paired.sentence`) rather than writing a verdict by hand.

    >>> r = paired_interval([1.10, 1.31, 0.92], [1.00, 1.20, 0.83])
    >>> r.verdict, round(r.diff, 3)
    ('beyond seed noise', 0.1)
    >>> print(r.sentence("bf16 - fp32 final loss", ".3f"))
    bf16 - fp32 final loss: mean 0.100, 95% paired interval [0.075, 0.125] over 3 seeds: beyond seed noise
    >>> paired_interval([1.0, 2.0], [1.5, 1.0]).verdict
    'within seed noise'
    """
    if not isinstance(level, (int, float)) or isinstance(level, bool) or not 0.0 < float(level) < 1.0:
        raise ValueError(f"level must be a probability in (0, 1), got {level!r}")
    da, db = _by_seed(a, "a"), _by_seed(b, "b")
    if not isinstance(a, Mapping) and not isinstance(b, Mapping) and len(da) != len(db):
        raise ValueError(f"a and b must hold one value per seed in the same seed order; got {len(da)} and {len(db)} "
                         "values (pass mappings seed -> value to pair by seed)")
    both = [k for k in da if k in db and _finite(da[k]) and _finite(db[k])]
    over = [k for k in both if not math.isfinite(da[k] - db[k])]  # type: ignore[operator]
    if over:
        raise ValueError(f"a - b overflows float64 at seeds {over}: no interval can be computed")
    r = _paired(da, db, float(level))
    ci = None if r["ci"] is None else (float(r["ci"][0]), float(r["ci"][1]))
    return Paired(n=int(r["n"]), diff=r["diff"], ci=ci, verdict=str(r["verdict"]), level=float(level))


@ieee_mode
def seed_spread(results: Mapping[str, Mapping[str, Any]] | Iterable[Mapping[str, Any]], *, level: float = 0.95,
                lessons: Sequence[Lesson] = LESSONS, setting: str | None = None) -> dict[str, Any]:
    """Mean and spread over seeds of each policy's metrics, and of each lesson's effect.

    An effect (policy ``a`` minus policy ``b`` in a metric) is compared seed by seed: the runs of one seed
    share initial weights and batches, so the per-seed difference removes what the seed does to both. The
    rule: with n seeds, the ``level`` (95%) paired Student-t interval of the mean difference,
    ``mean(d) +- t(n-1) * sd(d) / sqrt(n)``; *beyond seed noise* when it excludes 0, *within seed noise*
    when it contains 0 (one seed: no spread, no verdict). Lessons whose two policies were not both run
    are left out. ``setting`` picks one setting's cells when the results hold several.

    >>> res = [{"policy": p, "seed": s, "setting": "default", "metrics": {"final_loss": v}}
    ...        for p, s, v in [("fp32", 0, 1.0), ("fp32", 1, 1.2), ("bf16-mixed", 0, 1.1), ("bf16-mixed", 1, 1.3)]]
    >>> L = seed_spread(res)["lessons"][0]
    >>> L["key"], L["verdict"], round(L["diff"], 3)
    ('bf16-vs-fp32', 'beyond seed noise', 0.1)
    """
    rows = list(results.values()) if isinstance(results, Mapping) else list(results)
    settings_seen = list(dict.fromkeys(str(r["setting"]) for r in rows))
    if setting is None:
        if len(settings_seen) > 1:
            raise ValueError(f"the results hold several settings ({', '.join(settings_seen)}); pass setting=")
    else:
        if setting not in settings_seen:
            raise ValueError(f"setting {setting!r} is not in the results; they hold: {', '.join(settings_seen)}")
        rows = [r for r in rows if r["setting"] == setting]
    by: dict[str, dict[int, Mapping[str, Any]]] = {}
    for r in rows:
        by.setdefault(str(r["policy"]), {})[int(r["seed"])] = r["metrics"]
    seeds = sorted({s for d in by.values() for s in d})
    policies = {p: {m: _stats([d[s].get(m) for s in sorted(d)]) for m in _SPREAD_METRICS} for p, d in by.items()}
    out_lessons = []
    for les in lessons:
        if les.a in by and les.b in by:
            da = {s: by[les.a][s].get(les.metric) for s in by[les.a]}
            db = {s: by[les.b][s].get(les.metric) for s in by[les.b]}
            out_lessons.append({"key": les.key, "title": les.title, "a": les.a, "b": les.b, "metric": les.metric,
                                **_paired(da, db, level)})
    vs_fp32 = {}
    if "fp32" in by:
        for p in by:
            if p != "fp32":
                vs_fp32[p] = _paired({s: by[p][s].get("final_loss") for s in by[p]},
                                     {s: by["fp32"][s].get("final_loss") for s in by["fp32"]}, level)
    return {"level": level, "seeds": seeds, "n_seeds": len(seeds),
            "rule": f"{100 * level:g}% paired Student-t interval of the per-seed difference (n-1 degrees of "
                    "freedom); beyond seed noise when it excludes 0",
            "policies": policies, "lessons": out_lessons, "final_loss_vs_fp32": vs_fp32}
