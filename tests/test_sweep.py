"""Sweeps on Dask distributed (issue 16 part 2): the demo's policy x seed grid, bit-identical to the serial
run, surviving a killed worker, resumable, and the seed-spread statistics of the report."""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import signal
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from fpsim.train.demo import DemoSettings
from fpsim.train.sweep import Cell, SweepError, grid, load_results, run_cell, run_sweep, seed_spread, t_quantile

TINY = DemoSettings(steps=4, n_layer=1, n_head=2, n_embd=8, batch_size=4, eval_every=2, histogram_every=2,
                    task_kwargs={"n_symbols": 6, "length": 4})
ALL = ("fp32", "bf16-mixed", "fp16-mixed", "fp16-fast-scaler", "fp16-static", "fp16-no-scaling", "fp16-no-master",
       "fp8-hybrid", "int8-qat", "int4-qat", "int8-ptq", "int4-ptq")


@pytest.fixture(scope="module")
def cluster() -> Any:
    """A 2-worker LocalCluster (processes, one thread each) of our own; its address is what a user passes."""
    distributed = pytest.importorskip("distributed")
    import dask

    with dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}):  # see fpsim/_dask.py
        c = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                     scheduler_kwargs={"dashboard_address": ":0"}, silence_logs=logging.ERROR)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def serial() -> dict[str, dict[str, Any]]:
    """Every policy x seeds 0, 1 of the tiny demo, one after another in this process: the reference."""
    return run_sweep(grid(ALL, seeds=2, settings={"tiny": TINY}), workers=0)


def _series(r: dict[str, Any]) -> dict[str, np.ndarray]:
    """Every number a cell computed (metrics and the whole history, nested), flattened to named arrays."""
    out: dict[str, np.ndarray] = {}

    def walk(prefix: str, v: Any) -> None:
        if isinstance(v, dict):
            for k, x in v.items():
                walk(f"{prefix}.{k}", x)
        elif isinstance(v, list) and v and all(isinstance(x, list) for x in v):
            for i, x in enumerate(v):
                walk(f"{prefix}[{i}]", x)
        elif isinstance(v, (list, int, float)) and not isinstance(v, bool):
            out[prefix] = np.asarray(v, dtype=np.float64)
        elif isinstance(v, list) or isinstance(v, bool) or v is None:
            out[prefix] = np.asarray([np.nan if x is None else x for x in (v if isinstance(v, list) else [v])],
                                     dtype=np.float64)

    walk("metrics", r["metrics"])
    walk("history", r["history"])
    return out


def _assert_same(a: dict[str, dict[str, Any]], b: dict[str, dict[str, Any]]) -> int:
    """np.array_equal on every series of every cell; returns how many arrays were compared."""
    assert list(a) == list(b)
    n = 0
    for cid in a:
        sa, sb = _series(a[cid]), _series(b[cid])
        assert sa.keys() == sb.keys(), cid
        for k in sa:
            assert np.array_equal(sa[k], sb[k], equal_nan=True), f"{cid} {k}: {sa[k]} != {sb[k]}"
            n += 1
    return n


# ----------------------------------------------------------------------------------------------------------
# runners the workers import (module-level, so that they pickle by reference)
# ----------------------------------------------------------------------------------------------------------

def _kill_worker_once(marker: str, target: str, cell: Cell) -> dict[str, Any]:
    """Runs ``cell``; the first time ``target`` runs anywhere, its worker process is killed (SIGKILL)."""
    with open(marker + ".log", "a") as f:
        f.write(f"{cell.id} {os.getpid()}\n")
    if cell.id == target:
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            pass
        else:
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
            os.kill(os.getpid(), signal.SIGKILL)
    return run_cell(cell)


def _raise_once(marker: str, cell: Cell) -> dict[str, Any]:
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return run_cell(cell)
    os.close(fd)
    raise RuntimeError("a transient fault")


def _always_fail_fp16(cell: Cell) -> dict[str, Any]:
    if cell.policy == "fp16-mixed":
        raise RuntimeError("this cell always fails")
    return run_cell(cell)


# ----------------------------------------------------------------------------------------------------------
# bit identity, fault tolerance
# ----------------------------------------------------------------------------------------------------------

def test_two_dask_workers_equal_the_serial_run_bit_for_bit(cluster: Any, serial: dict[str, Any]) -> None:
    cells = grid(ALL, seeds=2, settings={"tiny": TINY})
    par = run_sweep(cells, scheduler=cluster.scheduler_address)
    assert len(par) == len(cells) == 24
    n = _assert_same(serial, par)
    assert n > 24 * 20  # losses, eval losses, underflow, lost updates, scales, histograms, per-tensor stats
    assert len({r["run_info"]["pid"] for r in par.values()}) == 2  # both workers ran cells
    assert {r["run_info"]["pid"] for r in par.values()}.isdisjoint({os.getpid()})


def test_a_killed_worker_loses_and_duplicates_nothing(cluster: Any, serial: dict[str, Any], tmp_path: Any) -> None:
    cells = grid(ALL, seeds=2, settings={"tiny": TINY})
    marker = str(tmp_path / "killed")
    target = cells[9].id  # mid-sweep
    out = tmp_path / "cells"
    par = run_sweep(cells, scheduler=cluster.scheduler_address, out=str(out),
                run=functools.partial(_kill_worker_once, marker, target))
    with open(marker) as f:
        killed_pid = int(f.read())
    with open(marker + ".log") as f:
        runs = [line.split() for line in f.read().splitlines()]
    assert [pid for cid, pid in runs if cid == target][0] == str(killed_pid)
    assert sum(cid == target for cid, _ in runs) >= 2  # it ran again after the kill
    assert par[target]["run_info"]["pid"] != killed_pid
    assert sorted(par) == sorted(c.id for c in cells)  # every cell exactly once (a dict keyed by cell id)
    assert sorted(os.listdir(out)) == sorted(f"{c.id}.json" for c in cells)  # one file per cell, no temporaries
    _assert_same(serial, par)
    _assert_same(serial, load_results(cells, str(out)))  # and the files hold the same bits


def test_a_raising_cell_is_retried(cluster: Any, serial: dict[str, Any], tmp_path: Any) -> None:
    cells = [c for c in grid(ALL, seeds=2, settings={"tiny": TINY}) if c.policy in ("fp32", "fp16-mixed")]
    par = run_sweep(cells, scheduler=cluster.scheduler_address, run=functools.partial(_raise_once, str(tmp_path / "m")))
    assert os.path.exists(tmp_path / "m")
    _assert_same({k: serial[k] for k in par}, par)


def test_a_cell_failing_every_time_is_named_and_the_rest_kept(cluster: Any, tmp_path: Any) -> None:
    cells = grid(["fp32", "fp16-mixed"], seeds=1, settings={"tiny": TINY})
    with pytest.raises(SweepError, match=r"tiny\.fp16-mixed\.s0.*always fails"):
        run_sweep(cells, scheduler=cluster.scheduler_address, out=str(tmp_path), retries=1, run=_always_fail_fp16)
    assert os.listdir(tmp_path) == ["tiny.fp32.s0.json"]


# ----------------------------------------------------------------------------------------------------------
# partial results and resume (serial: the bookkeeping is the same code for both)
# ----------------------------------------------------------------------------------------------------------

def test_an_interrupted_sweep_resumes_from_its_files(tmp_path: Any, serial: dict[str, Any]) -> None:
    cells = grid(["fp32", "fp16-no-scaling", "int4-ptq"], seeds=2, settings={"tiny": TINY})
    ran: list[str] = []

    def stop_at_fourth(cell: Cell) -> dict[str, Any]:
        if len(ran) == 3:
            # the three finished cells are on disk already, before the sweep ends
            assert sorted(os.listdir(tmp_path)) == sorted(f"{c.id}.json" for c in cells[:3])
            raise KeyboardInterrupt
        ran.append(cell.id)
        return run_cell(cell)

    with pytest.raises(KeyboardInterrupt):
        run_sweep(cells, workers=0, out=str(tmp_path), run=stop_at_fourth)
    again: list[str] = []
    res = run_sweep(cells, workers=0, out=str(tmp_path), run=lambda c: again.append(c.id) or run_cell(c))
    assert again == [c.id for c in cells[3:]]  # done cells skipped
    _assert_same({k: serial[k] for k in res}, res)
    assert run_sweep(cells, workers=0, out=str(tmp_path), run=lambda c: pytest.fail("ran a finished cell")).keys() \
        == res.keys()


def test_resume_refuses_a_result_of_other_settings(tmp_path: Any) -> None:
    c = Cell("fp32", 0, "tiny", TINY)
    run_sweep([c], workers=0, out=str(tmp_path))
    other = Cell("fp32", 0, "tiny", DemoSettings(**{**TINY.__dict__, "lr": 1e-3}))
    with pytest.raises(ValueError, match="other settings"):
        run_sweep([other], workers=0, out=str(tmp_path))
    (tmp_path / "tiny.fp32.s0.json").write_text("{not json")
    with pytest.raises(ValueError, match="cannot read the sweep result"):
        run_sweep([c], workers=0, out=str(tmp_path))


def test_results_are_plain_json(serial: dict[str, Any]) -> None:
    r = serial["tiny.int8-ptq.s1"]
    assert json.loads(json.dumps(r)) == json.loads(json.dumps(r))
    assert r["policy"] == "int8-ptq" and r["seed"] == 1 and r["metrics"]["steps"] == 4
    assert isinstance(r["metrics"]["float_loss_before_quantization"], float)
    assert "wall_s" not in r["history"]  # timing lives in run_info only


def test_bad_arguments() -> None:
    c = Cell("fp32", 0, "tiny", TINY)
    with pytest.raises(ValueError, match="duplicate cells"):
        run_sweep([c, c], workers=0)
    with pytest.raises(ValueError, match="cannot be combined"):
        run_sweep([c], workers=2, scheduler="tcp://127.0.0.1:8786")
    with pytest.raises(ValueError, match="scheme 'http'"):
        run_sweep([c], scheduler="http://127.0.0.1:8786")
    with pytest.raises(ValueError, match="workers must be an integer >= 1"):
        run_sweep([c], workers=-1)
    with pytest.raises(TypeError, match="Cell"):
        run_sweep(["fp32"], workers=0)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="setting name"):
        Cell("fp32", 0, "a/b", TINY)
    with pytest.raises(ValueError, match="policy"):
        Cell("fp99", 0)
    with pytest.raises(ValueError, match="seeds must be >= 1"):
        grid(["fp32"], seeds=0)


def test_unreachable_scheduler_is_one_clear_error() -> None:
    pytest.importorskip("distributed")
    import socket

    from fpsim._dask import dask_client

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # a port nobody listens on
    with pytest.raises(ValueError, match=rf"cannot connect to the Dask scheduler at 'tcp://127.0.0.1:{port}'"):
        with dask_client(scheduler=f"127.0.0.1:{port}", timeout=1):
            pass


# ----------------------------------------------------------------------------------------------------------
# seed statistics
# ----------------------------------------------------------------------------------------------------------

def test_t_quantile_matches_the_tables() -> None:
    table = {1: 12.7062, 2: 4.3027, 3: 3.1824, 4: 2.7764, 5: 2.5706, 9: 2.2622, 30: 2.0423}
    for nu, t in table.items():
        assert abs(t_quantile(0.95, nu) - t) < 5e-5, nu
    scipy_stats = pytest.importorskip("scipy.stats")
    for nu in (1, 2, 3, 7, 10, 31, 100):
        for p in (0.5, 0.9, 0.95, 0.99):
            assert math.isclose(t_quantile(p, nu), scipy_stats.t.ppf(0.5 + p / 2, nu), rel_tol=1e-9)


def test_seed_spread_rule() -> None:
    def rows(a: list[float], b: list[float]) -> list[dict[str, Any]]:
        return ([{"policy": "fp32", "seed": s, "setting": "x", "metrics": {"final_loss": v}} for s, v in enumerate(b)]
                + [{"policy": "fp8-hybrid", "seed": s, "setting": "x", "metrics": {"final_loss": v}}
                   for s, v in enumerate(a)])

    # differences 0.1, 0.3, 0.2: mean 0.2, sd 0.1, 95% half-width 4.3027 * 0.1 / sqrt(3) = 0.2484: contains 0
    L = seed_spread(rows([1.1, 2.3, 3.2], [1.0, 2.0, 3.0]))["lessons"]
    (fp8,) = [x for x in L if x["key"] == "fp8-vs-fp32"]
    assert fp8["n"] == 3 and math.isclose(fp8["diff"], 0.2) and math.isclose(fp8["diff_sd"], 0.1)
    assert math.isclose(fp8["ci"][1] - fp8["diff"], t_quantile(0.95, 2) * 0.1 / math.sqrt(3))
    assert fp8["verdict"] == "within seed noise"
    # the same spread of means over seeds but a consistent per-seed difference: beyond seed noise
    L = seed_spread(rows([1.2, 2.21, 3.19], [1.0, 2.0, 3.0]))["lessons"]
    assert [x["verdict"] for x in L if x["key"] == "fp8-vs-fp32"] == ["beyond seed noise"]
    one = seed_spread(rows([1.2], [1.0]))
    assert one["lessons"][0]["verdict"] == "one seed: no spread" and one["lessons"][0]["ci"] is None
    assert seed_spread(rows([1.0, 2.0], [1.0, 2.0]))["lessons"][0]["verdict"] == "no difference"
    with pytest.raises(ValueError, match="several settings"):
        seed_spread(rows([1.0], [1.0]) + [{"policy": "fp32", "seed": 0, "setting": "y", "metrics": {}}])


def test_seed_spread_of_the_tiny_sweep(serial: dict[str, Any]) -> None:
    sp = seed_spread(serial)
    assert sp["n_seeds"] == 2 and sp["seeds"] == [0, 1]
    les = {x["key"]: x for x in sp["lessons"]}
    assert len(les) == 12 and all(x["n"] == 2 for x in les.values())
    # no loss scaling loses a sizeable share of FP16 gradients at every seed: a real effect even with 2 seeds
    assert les["no-scaling-underflow"]["verdict"] == "beyond seed noise" and les["no-scaling-underflow"]["diff"] > 0.1
    fl = sp["policies"]["fp32"]["final_loss"]
    v = [serial[f"tiny.fp32.s{s}"]["metrics"]["final_loss"] for s in (0, 1)]
    assert fl["mean"] == float(np.mean(v)) and fl["sd"] == float(np.std(v, ddof=1))


# ----------------------------------------------------------------------------------------------------------
# fpsim demo --seeds / --workers / --scheduler
# ----------------------------------------------------------------------------------------------------------

from _cli import run_cli  # noqa: E402  (shared by the CLI tests)


@pytest.fixture
def tiny_demo(monkeypatch: pytest.MonkeyPatch) -> None:
    import fpsim.train.demo as demo

    monkeypatch.setattr(demo, "demo_settings", lambda quick=False, steps=None, seed=0: DemoSettings(
        **{**TINY.__dict__, "seed": seed}))


def test_demo_seeds_on_a_given_scheduler(cluster: Any, tiny_demo: None, tmp_path: Any,
                                         serial: dict[str, Any]) -> None:
    rc, out, err = run_cli(["demo", "--seeds", "2", "--policies", "fp16-mixed,fp16-no-scaling", "--scheduler",
                            cluster.scheduler_address, "--out", str(tmp_path)])
    assert rc == 0, err
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["sweep"]["n_seeds"] == 2 and cluster.scheduler_address in m["sweep"]["where"]
    for p in ("fp16-mixed", "fp16-no-scaling"):  # the report's seed-0 rows are the sweep's cells, same bits as serial
        assert m["policies"][p]["final_loss"] == serial[f"tiny.{p}.s0"]["metrics"]["final_loss"]
    rep = (tmp_path / "report.md").read_text()
    assert "## Across seeds (2 seeds: 0, 1)" in rep and "paired Student-t" in rep
    assert "| no loss scaling vs dynamic: gradient underflow |" in rep and "beyond seed noise" in rep
    assert "final loss, 2 seeds (mean ± sd)" in rep
    cells = os.listdir(tmp_path / "cells")
    assert len(cells) == 1 and len(os.listdir(tmp_path / "cells" / cells[0])) == 4
    assert m["seed_spread"]["lessons"][0]["key"] == "no-scaling-underflow"


@pytest.mark.slow
def test_demo_seeds_on_an_embedded_cluster_matches_the_one_seed_demo(tiny_demo: None, tmp_path: Any) -> None:
    pytest.importorskip("distributed")
    pols = "fp32,fp16-no-master,int4-ptq"
    rc, _, err = run_cli(["demo", "--seeds", "1", "--policies", pols, "--out", str(tmp_path / "one")])
    assert rc == 0, err
    rc, _, err = run_cli(["demo", "--seeds", "2", "--workers", "2", "--policies", pols, "--out", str(tmp_path / "two")])
    assert rc == 0, err
    one = json.loads((tmp_path / "one" / "metrics.json").read_text())
    two = json.loads((tmp_path / "two" / "metrics.json").read_text())
    assert "seed_spread" not in one and "sweep" not in one  # the one-seed demo is unchanged
    assert "2 worker processes" in two["sweep"]["where"]
    for p in pols.split(","):  # PTQ reuses fp32's weights in the one-seed demo and trains itself in a cell
        for k in ("final_loss", "final_train_loss", "grad_underflow_fraction", "lost_update_fraction",
                  "skipped_steps", "steps_to_target"):
            assert one["policies"][p].get(k) == two["policies"][p].get(k), (p, k)
    h1 = json.loads((tmp_path / "one" / "histories.json").read_text())
    h2 = json.loads((tmp_path / "two" / "histories.json").read_text())
    for p in pols.split(","):
        for k in ("loss", "eval_loss", "loss_scale", "lost_update_fraction"):
            assert np.array_equal(np.asarray(h1[p][k], float), np.asarray(h2[p][k], float), equal_nan=True)


@pytest.mark.parametrize("argv, flag", [
    (["--seeds", "0"], "--seeds"), (["--seeds", "x"], "--seeds"), (["--seeds", "-2"], "--seeds"),
    (["--workers", "-1"], "--workers"), (["--workers", "two"], "--workers"),
    (["--scheduler", "http://h:8786"], "--scheduler"), (["--scheduler", "tcp://h"], "--scheduler"),
    (["--scheduler", "tcp://h:99999"], "--scheduler"), (["--scheduler", ""], "--scheduler"),
    (["--scheduler", "tcp://h:8786", "--workers", "2"], "--workers"),
])
def test_demo_bad_sweep_flags_are_one_line(argv: list[str], flag: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import fpsim.train.demo as demo

    monkeypatch.setattr(demo, "run_demo", lambda *a, **k: pytest.fail("trained despite a bad flag"))
    rc, out, err = run_cli(["demo", *argv])
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"fpsim demo: error: {flag}"), err


def test_progress_bar_counts_cells(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("tqdm")
    cells = grid(["fp32", "int8-qat"], seeds=1, settings={"tiny": TINY})
    run_sweep(cells, workers=0, progress=True)
    err = capsys.readouterr().err
    assert "fpsim sweep" in err and "2/2" in err
    run_sweep(cells, workers=0, progress=False)
    assert capsys.readouterr().err == ""


def test_import_fpsim_does_not_import_dask() -> None:
    code = ("import sys, fpsim, fpsim.train, fpsim.train.sweep, fpsim.cli; "
            "print(','.join(m for m in ('dask', 'distributed', 'tqdm') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == ""


@pytest.mark.slow
def test_demo_unreachable_scheduler_is_one_line_exit_2(tiny_demo: None, tmp_path: Any,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("distributed")
    import socket

    import fpsim.train.sweep as sw

    monkeypatch.setattr(sw, "run_cell", lambda c: pytest.fail("trained without a scheduler"))
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    rc, _, err = run_cli(["demo", "--seeds", "2", "--policies", "fp32", "--scheduler", f"tcp://127.0.0.1:{port}",
                          "--out", str(tmp_path)])
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"fpsim demo: error: cannot connect to the Dask scheduler at 'tcp://127.0.0.1:{port}'")


# ----------------------------------------------------------------------------------------------------------
# schedulers that never answer, or have no workers: a clear error within a limit, never a hang
# ----------------------------------------------------------------------------------------------------------

def _within(seconds: float, fn: Any) -> BaseException | None:
    """Run ``fn()`` in a thread; its exception (None if it returned), or a test failure if it is still blocked."""
    import threading

    box: dict[str, BaseException | None] = {}

    def target() -> None:
        try:
            fn()
            box["e"] = None
        except BaseException as e:  # noqa: BLE001 - handed to the test
            box["e"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        pytest.fail(f"still blocked after {seconds} s")
    return box["e"]


@pytest.fixture
def silent_server() -> Any:
    """The address of a TCP port on 127.0.0.1 that accepts every connection and never sends a byte."""
    import socket
    import threading

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    s.settimeout(0.1)
    conns: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conns.append(s.accept()[0])
            except (socket.timeout, OSError):
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        yield f"tcp://127.0.0.1:{s.getsockname()[1]}"
    finally:
        stop.set()
        t.join(5)
        s.close()
        for c in conns:
            c.close()


@pytest.fixture
def empty_scheduler() -> Any:
    """A real Dask scheduler (in this process, on tcp) with no workers: its address."""
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=0, processes=False, protocol="tcp", dashboard_address=None,
                                  scheduler_kwargs={"dashboard_address": ":0"}, silence_logs=logging.ERROR) as c:
        yield c.scheduler_address


def test_a_scheduler_that_never_answers_is_a_clear_error_not_a_hang(silent_server: str) -> None:
    pytest.importorskip("distributed")
    from fpsim._dask import dask_client

    def connect() -> None:
        with dask_client(scheduler=silent_server, timeout=1):
            pass

    e = _within(20, connect)
    assert isinstance(e, ValueError), e
    assert f"cannot connect to the Dask scheduler at {silent_server!r} within 1 s" in str(e)


def test_audit_on_a_silent_scheduler_gives_up_by_the_environment_limit(silent_server: str, tmp_path: Any,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("distributed")
    st = pytest.importorskip("safetensors.numpy")
    from fpsim._dask import CONNECT_TIMEOUT_ENV
    from fpsim.audit import audit_checkpoint

    p = str(tmp_path / "m.safetensors")
    st.save_file({"w": np.random.default_rng(0).standard_normal(16).astype(np.float32)}, p)
    monkeypatch.setenv(CONNECT_TIMEOUT_ENV, "1")
    e = _within(20, lambda: audit_checkpoint(p, scheduler=silent_server, progress=False))
    assert isinstance(e, ValueError) and "cannot connect to the Dask scheduler" in str(e), e


def test_demo_on_a_silent_scheduler_is_one_line(silent_server: str, tiny_demo: None, tmp_path: Any,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("distributed")
    import fpsim.train.sweep as sw
    from fpsim._dask import CONNECT_TIMEOUT_ENV

    monkeypatch.setattr(sw, "run_cell", lambda c: pytest.fail("trained without a scheduler"))
    monkeypatch.setenv(CONNECT_TIMEOUT_ENV, "1")
    box: dict[str, Any] = {}
    e = _within(20, lambda: box.setdefault("r", run_cli(["demo", "--seeds", "2", "--policies", "fp32", "--scheduler",
                                                         silent_server, "--out", str(tmp_path)])))
    assert e is None, e
    rc, _, err = box["r"]
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"fpsim demo: error: cannot connect to the Dask scheduler at {silent_server!r}"), err


def test_a_scheduler_without_workers_says_so_then_gives_up(empty_scheduler: str) -> None:
    from fpsim._dask import dask_client

    said: list[str] = []

    def connect() -> None:
        with dask_client(scheduler=empty_scheduler, timeout=5, worker_timeout=1, log=said.append):
            pytest.fail("no worker, yet the client was handed out")

    e = _within(30, connect)
    assert isinstance(e, TimeoutError), e
    assert f"the Dask scheduler at {empty_scheduler} has no workers: none joined within 1 s" in str(e)
    assert len(said) == 1 and said[0].startswith("waiting up to 1 s for a Dask worker") and empty_scheduler in said[0]


def test_demo_and_audit_on_a_scheduler_without_workers(empty_scheduler: str, tiny_demo: None, tmp_path: Any,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    st = pytest.importorskip("safetensors.numpy")
    from fpsim._dask import WORKER_TIMEOUT_ENV
    from fpsim.audit import audit_checkpoint

    monkeypatch.setenv(WORKER_TIMEOUT_ENV, "1")
    box: dict[str, Any] = {}
    e = _within(30, lambda: box.setdefault("r", run_cli(["demo", "--seeds", "2", "--policies", "fp32", "--scheduler",
                                                         empty_scheduler, "--out", str(tmp_path / "d")])))
    assert e is None, e
    rc, out, err = box["r"]
    assert rc == 1 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"fpsim demo: error: the Dask scheduler at {empty_scheduler} has no workers"), err
    assert "waiting up to 1 s for a Dask worker" in out
    p = str(tmp_path / "m.safetensors")
    st.save_file({"w": np.random.default_rng(1).standard_normal(16).astype(np.float32)}, p)
    e = _within(30, lambda: audit_checkpoint(p, scheduler=empty_scheduler, progress=False))
    assert isinstance(e, TimeoutError) and "has no workers" in str(e), e
    assert "waiting up to 1 s for a Dask worker" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "x", "1e7"])
def test_bad_dask_limits_name_the_variable(value: str, empty_scheduler: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from fpsim._dask import CONNECT_TIMEOUT_ENV, WORKER_TIMEOUT_ENV, dask_client

    for env in (CONNECT_TIMEOUT_ENV, WORKER_TIMEOUT_ENV):
        with monkeypatch.context() as m:
            m.setenv(env, value)
            with pytest.raises(ValueError, match=f"environment variable {env}"):
                with dask_client(scheduler=empty_scheduler):
                    pass
    with pytest.raises(ValueError, match="worker_timeout must be a number of seconds > 0"):
        with dask_client(scheduler=empty_scheduler, worker_timeout=float(value) if value != "x" else 0.0):
            pass


def test_workers_leaving_mid_run_end_the_wait_with_a_clear_error() -> None:
    distributed = pytest.importorskip("distributed")
    import time

    from fpsim._dask import dask_client

    said: list[str] = []
    with distributed.LocalCluster(n_workers=1, processes=False, protocol="tcp", dashboard_address=None,
                                  scheduler_kwargs={"dashboard_address": ":0"}, silence_logs=logging.ERROR) as lc:
        def run() -> None:
            with dask_client(scheduler=lc.scheduler_address, worker_timeout=1, log=said.append) as c:
                f = c.submit(time.sleep, 2, pure=False)
                time.sleep(0.3)
                lc.scale(0)  # the only worker leaves; the task would wait for a worker for ever
                f.result()

        e = _within(40, run)
    assert isinstance(e, TimeoutError), e
    assert "has had no workers for 1 s; its tasks were cancelled" in str(e)
    assert any("has no workers left; waiting up to 1 s" in s for s in said), said


def _slow_cell(cell: Cell) -> dict[str, Any]:
    import time

    time.sleep(2)
    return run_cell(cell)


def test_a_sweep_whose_workers_leave_ends_with_a_clear_error(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    distributed = pytest.importorskip("distributed")
    import threading
    import time

    cells = grid(["fp32"], seeds=2, settings={"tiny": TINY})
    with distributed.LocalCluster(n_workers=1, processes=False, protocol="tcp", dashboard_address=None,
                                  scheduler_kwargs={"dashboard_address": ":0"}, silence_logs=logging.ERROR) as lc:
        def leave() -> None:  # the only worker leaves once the cells are submitted
            t0 = time.monotonic()
            while not lc.scheduler.tasks and time.monotonic() - t0 < 20:
                time.sleep(0.05)
            time.sleep(0.3)
            lc.scale(0)

        threading.Thread(target=leave, daemon=True).start()
        said: list[str] = []
        monkeypatch.setenv("FPSIM_DASK_WORKER_TIMEOUT", "1")
        e = _within(60, lambda: run_sweep(cells, scheduler=lc.scheduler_address, run=_slow_cell, out=str(tmp_path),
                                          log=said.append))
    assert isinstance(e, TimeoutError) and "has had no workers for 1 s" in str(e), e
    assert any("no workers left" in s for s in said), said
