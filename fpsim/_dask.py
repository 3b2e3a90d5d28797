"""Dask distributed for fpsim's parallel jobs (sweeps, audits): an embedded LocalCluster or a given scheduler.

One helper for every command that fans work out (``fpsim demo --seeds``, ``fpsim audit``): with no address
a ``LocalCluster`` is started inside this process (nothing to install or start besides the ``dist``
extra), with ``workers`` worker *processes* of one thread each (so the GIL is not shared and BLAS runs
single-threaded: ``distributed`` sets ``OMP_NUM_THREADS=1`` etc. in its workers); with an address
(``tcp://host:8786``) the client connects to a scheduler someone started (``dask scheduler`` +
``dask worker``), so a user with a cluster runs the same command there.

Layer 0 by import (nothing from fpsim); dask and distributed are imported only when a client is made,
never at ``import fpsim``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["CONNECT_TIMEOUT_ENV", "DIST_HINT", "MAX_WORKERS", "WORKER_TIMEOUT_ENV", "check_scheduler_address",
           "check_timeout", "check_workers", "dask_client", "distributed_available", "progress_bar",
           "require_distributed"]

DIST_HINT = "pip install 'fpsim-precision[dist]'"
#: The most worker processes a local cluster may have (:func:`check_workers`).
MAX_WORKERS = 512

_SCHEMES = ("tcp", "tls", "inproc", "ucx", "ws", "wss")
_ADDR_RE = re.compile(r"\A(?:(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://)?(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)"
                      r"(?::(?P<port>[0-9]{1,5}))?\Z")


def distributed_available() -> bool:
    """True if ``dask.distributed`` can be imported (the ``dist`` extra is installed)."""
    try:
        import distributed  # noqa: F401
    except ImportError:
        return False
    return True


def require_distributed() -> Any:
    """The ``distributed`` module, or ``ImportError`` saying how to install it."""
    try:
        import distributed
    except ImportError as e:
        raise ImportError(f"Dask distributed is needed for this ({DIST_HINT}): {e}") from None
    return distributed


def check_scheduler_address(value: object) -> str:
    """A Dask scheduler address, ``tcp://host:port`` (``host:port`` means tcp); ``ValueError`` otherwise.

    The scheme is one of ``tcp tls inproc ucx ws wss``; the port, when given, 1..65535 (``inproc://`` takes
    none). Only the form is checked here; whether a scheduler answers there is :func:`dask_client`'s job.

    >>> check_scheduler_address(" 127.0.0.1:8786 ")
    'tcp://127.0.0.1:8786'
    >>> check_scheduler_address("http://x:1")
    Traceback (most recent call last):
    ...
    ValueError: scheduler address 'http://x:1': scheme 'http' is not one of tcp, tls, inproc, ucx, ws, wss
    """
    if not isinstance(value, str):
        raise TypeError(f"scheduler address must be a str like 'tcp://host:8786', got {type(value).__name__}")
    v = value.strip()
    m = _ADDR_RE.match(v)
    if not v or m is None:
        raise ValueError(f"scheduler address {value!r} is not of the form tcp://host:port (e.g. tcp://10.0.0.5:8786)")
    scheme = (m.group("scheme") or "tcp").lower()
    if scheme not in _SCHEMES:
        raise ValueError(f"scheduler address {value!r}: scheme {scheme!r} is not one of {', '.join(_SCHEMES)}")
    port = m.group("port")
    if scheme != "inproc":
        if port is None:
            raise ValueError(f"scheduler address {value!r} has no port (e.g. {scheme}://{m.group('host')}:8786)")
        if not 1 <= int(port) <= 65535:
            raise ValueError(f"scheduler address {value!r}: port {int(port)} is not in 1..65535")
    return f"{scheme}://{m.group('host')}" + (f":{int(port)}" if port is not None else "")


def check_workers(value: object) -> int:
    """A worker count: an int (or decimal text) in 1..:data:`MAX_WORKERS`; ``ValueError``/``TypeError`` naming it.

    The bound: each is a process of its own, and a mistyped count must not start millions of them.
    """
    if isinstance(value, str):
        v = value.strip()
        if not v.isascii() or not v.isdigit() or len(v) > 6:
            raise ValueError(f"workers must be an integer >= 1, got {value!r}")
        value = int(v)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"workers must be an int >= 1, got {type(value).__name__}: {value!r}")
    if not 1 <= value <= MAX_WORKERS:
        raise ValueError(f"workers must be an integer >= 1 and <= {MAX_WORKERS}, got {value}")
    return value


#: Environment variables that set :func:`dask_client`'s limits when its arguments are left out (so that a
#: command (``fpsim demo --scheduler``, ``fpsim audit --scheduler``) and a test can change them without a flag).
CONNECT_TIMEOUT_ENV = "FPSIM_DASK_CONNECT_TIMEOUT"
WORKER_TIMEOUT_ENV = "FPSIM_DASK_WORKER_TIMEOUT"
DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_WORKER_TIMEOUT = 60.0


def check_timeout(value: object, name: str) -> float:
    """A limit in seconds: a finite number > 0 and <= 1e6 (an int, float or decimal text); ``ValueError``."""
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__}: {value!r}")
    v = float(value)
    if not (0.0 < v <= 1e6):  # also refuses nan
        raise ValueError(f"{name} must be a number of seconds > 0 and <= 1e6, got {value!r}")
    return v


def _limit(value: float | None, env: str, default: float, name: str) -> float:
    if value is not None:
        return check_timeout(value, name)
    text = os.environ.get(env, "").strip()
    return check_timeout(text, f"{name} (environment variable {env})") if text else default


def _stderr_line(s: str) -> None:
    print(s, file=sys.stderr, flush=True)


def _probe_scheduler(addr: str, timeout: float, connection_args: dict[str, Any]) -> dict[str, Any]:
    """The ``identity`` of the Dask server at ``addr``, all of it (connect, handshake, reply) within ``timeout``.

    distributed's ``connect`` bounds the TCP connection by its timeout but then waits for the server's handshake
    without any limit, so a port that accepts and never answers (a stuck process, a proxy, another protocol)
    blocks ``Client(addr, timeout=...)`` forever. Here the whole exchange runs in a fresh event loop, in a
    thread of its own, under ``asyncio.wait_for``; the thread is joined with a deadline as well, so not even a
    stuck name lookup can hold the caller. ``TimeoutError`` or ``OSError`` when it does not answer.
    """
    import asyncio
    import threading

    from distributed.comm.core import connect

    async def exchange() -> Any:
        comm = await connect(addr, timeout=timeout, **connection_args)  # type: ignore[no-untyped-call]
        try:
            await comm.write({"op": "identity", "reply": True})
            return await comm.read()
        finally:
            comm.abort()

    async def bounded() -> Any:
        return await asyncio.wait_for(exchange(), timeout)

    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["ok"] = asyncio.run(bounded())
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            box["error"] = e

    t = threading.Thread(target=target, name="fpsim-dask-probe", daemon=True)
    t.start()
    t.join(timeout + 5.0)
    if t.is_alive():
        raise TimeoutError(f"no answer within {timeout:g} s")
    if "error" in box:
        e = box["error"]
        if isinstance(e, asyncio.TimeoutError):
            raise TimeoutError(f"no answer within {timeout:g} s") from None
        raise e
    ident = box.get("ok")
    return ident if isinstance(ident, dict) else {}


def _connect_error(addr: str, timeout: float, why: str) -> ValueError:
    return ValueError(f"cannot connect to the Dask scheduler at {addr!r} within {timeout:g} s ({why}); start one "
                      "with `dask scheduler` and `dask worker ADDRESS`, or leave the address out for a local "
                      f"cluster (the limit: environment variable {CONNECT_TIMEOUT_ENV})")


def _wait_for_workers(client: Any, addr: str, limit: float, say: Callable[[str], None]) -> None:
    """Return once the scheduler has a worker; a message first, ``TimeoutError`` after ``limit`` seconds."""
    import asyncio

    if client.nthreads():
        return
    say(f"waiting up to {limit:g} s for a Dask worker to join the scheduler at {addr} (start one with "
        f"`dask worker {addr}`; the limit: environment variable {WORKER_TIMEOUT_ENV})")
    try:
        client.wait_for_workers(1, timeout=limit)
    except (TimeoutError, asyncio.TimeoutError):
        raise TimeoutError(f"the Dask scheduler at {addr} has no workers: none joined within {limit:g} s; start "
                           f"one with `dask worker {addr}` (or raise the limit: environment variable "
                           f"{WORKER_TIMEOUT_ENV})") from None


class _WorkerWatch:
    """Watches, from a thread, that a scheduler keeps a worker while the client is in use.

    Tasks on a scheduler whose workers have all gone wait for ever, and so does whoever waits on them
    (``as_completed``). After one line through ``say``, and ``limit`` seconds without a worker, the client's
    tasks are cancelled, so that the waiting ends (with distributed's ``CancelledError``, which
    :func:`dask_client` turns into a ``TimeoutError`` saying why).
    """

    def __init__(self, client: Any, addr: str, limit: float, say: Callable[[str], None]) -> None:
        import threading

        self.client, self.addr, self.limit, self.say = client, addr, limit, say
        self.fired: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fpsim-dask-workers", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import time

        gone_since: float | None = None
        while not self._stop.wait(min(1.0, self.limit / 4)):
            try:
                n = len(self.client.nthreads())
            except Exception:  # noqa: BLE001 - the client is closing, or the scheduler went: not ours to report
                return
            if n:
                gone_since = None
            elif gone_since is None:
                gone_since = time.monotonic()
                self.say(f"the Dask scheduler at {self.addr} has no workers left; waiting up to {self.limit:g} s "
                         f"for one (the limit: environment variable {WORKER_TIMEOUT_ENV})")
            elif time.monotonic() - gone_since >= self.limit:
                self.fired = (f"the Dask scheduler at {self.addr} has had no workers for {self.limit:g} s; its tasks "
                              f"were cancelled; start a worker with `dask worker {self.addr}` (or raise the limit: "
                              f"environment variable {WORKER_TIMEOUT_ENV})")
                try:
                    from distributed import Future

                    self.client.cancel([Future(k, self.client) for k in list(self.client.futures)])
                except Exception:  # noqa: BLE001 - the client closed meanwhile: nothing left to end
                    pass
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5.0)


@contextlib.contextmanager
def dask_client(*, workers: int | None = None, scheduler: str | None = None, timeout: float | None = None,
                worker_timeout: float | None = None, log: Callable[[str], None] | None = None) -> Iterator[Any]:
    """A ``distributed.Client``: to ``scheduler`` if given, else to a new embedded ``LocalCluster``.

    The LocalCluster has ``workers`` (default: the CPU count) worker processes with one thread each, no
    dashboard, and logs below ERROR silenced; it is closed on exit. The client is never made the process's
    default (``set_as_default=False``), so code that merely imports dask is unaffected.

    With ``scheduler``, nothing waits without a limit:

    * a scheduler that does not answer within ``timeout`` seconds (default: environment variable
      ``FPSIM_DASK_CONNECT_TIMEOUT``, else 10), connection *and* handshake, raises ``ValueError`` naming the
      address (also a port that accepts the connection and then says nothing);
    * a scheduler without workers is waited on for ``worker_timeout`` seconds (default: environment variable
      ``FPSIM_DASK_WORKER_TIMEOUT``, else 60), after one line through ``log`` (default: stderr) saying so;
      then ``TimeoutError`` saying how to start a worker;
    * so is one whose workers all leave while the client is in use: then its tasks are cancelled (whatever
      waits on them ends) and the ``with`` block's error becomes that ``TimeoutError``.
    """
    distributed = require_distributed()
    if scheduler is not None:
        addr = check_scheduler_address(scheduler)
        limit = _limit(timeout, CONNECT_TIMEOUT_ENV, DEFAULT_CONNECT_TIMEOUT, "timeout")
        wlimit = _limit(worker_timeout, WORKER_TIMEOUT_ENV, DEFAULT_WORKER_TIMEOUT, "worker_timeout")
        if not addr.startswith("inproc://"):  # in this process: nothing on a network to hang on
            try:
                ident = _probe_scheduler(addr, limit, distributed.Security().get_connection_args("client"))
            except (OSError, TimeoutError) as e:
                raise _connect_error(addr, limit, " ".join(str(e).split()) or type(e).__name__) from None
            kind = ident.get("type", "Scheduler")
            if kind != "Scheduler":
                raise ValueError(f"{addr!r} is a Dask {kind}, not a scheduler; give the scheduler's address")
        try:
            client = distributed.Client(addr, timeout=limit, set_as_default=False)
        except (OSError, TimeoutError) as e:
            raise _connect_error(addr, limit, " ".join(str(e).split()) or type(e).__name__) from None
        watch = None
        try:
            _wait_for_workers(client, addr, wlimit, log or _stderr_line)
            watch = _WorkerWatch(client, addr, wlimit, log or _stderr_line)
            yield client
        except BaseException:
            if watch is not None and watch.fired is not None:  # the waiting ended by cancelling: say why
                raise TimeoutError(watch.fired) from None
            raise
        finally:
            if watch is not None:
                watch.stop()
            client.close()
        return
    n = check_workers(workers if workers is not None else min(os.cpu_count() or 1, MAX_WORKERS))
    import dask

    # distributed's nannies start workers with MALLOC_TRIM_THRESHOLD_=65536, which turns off glibc's dynamic
    # mmap threshold: every NumPy temporary above 128 KiB is then mmap'ed and unmapped, page faults and all,
    # and fpsim's training runs 2-3x slower in a worker than in this process (measured; benchmarks/README.md).
    # The workers get the environment of this process instead.
    # no dashboard; the scheduler's HTTP server (health, metrics) on a free port: the default 8787 may be taken,
    # and distributed then warns (an error under -W error)
    with dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}):
        cluster = distributed.LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                                           dashboard_address=None, scheduler_kwargs={"dashboard_address": ":0"},
                                           silence_logs=logging.ERROR)
    try:
        client = distributed.Client(cluster, set_as_default=False)
        try:
            yield client
        finally:
            client.close()
    finally:
        cluster.close()


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(total: int, *, desc: str, enabled: bool | None = None) -> Any:
    """A tqdm bar on stderr counting ``total`` items (``update(1)`` per item done, ``close()`` at the end).

    ``enabled=None``: only when stderr is a terminal; ``False`` (tests, pipes) or tqdm missing: a silent
    object with the same methods.
    """
    if enabled is False or (enabled is None and not sys.stderr.isatty()):
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=total, desc=desc, file=sys.stderr, unit="cell", dynamic_ncols=True)
