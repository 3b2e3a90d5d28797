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
from collections.abc import Iterator
from typing import Any

__all__ = ["DIST_HINT", "check_scheduler_address", "check_workers", "dask_client", "distributed_available",
           "progress_bar", "require_distributed"]

DIST_HINT = "pip install 'fpsim-precision[dist]'"

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
    """A worker count: an int (or decimal text) >= 1; ``ValueError``/``TypeError`` naming the value."""
    if isinstance(value, str):
        v = value.strip()
        if not v.isascii() or not v.isdigit() or len(v) > 6:
            raise ValueError(f"workers must be an integer >= 1, got {value!r}")
        value = int(v)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"workers must be an int >= 1, got {type(value).__name__}: {value!r}")
    if value < 1:
        raise ValueError(f"workers must be an integer >= 1, got {value}")
    return value


@contextlib.contextmanager
def dask_client(*, workers: int | None = None, scheduler: str | None = None,
                timeout: float = 10.0) -> Iterator[Any]:
    """A ``distributed.Client``: to ``scheduler`` if given, else to a new embedded ``LocalCluster``.

    The LocalCluster has ``workers`` (default: the CPU count) worker processes with one thread each, no
    dashboard, and logs below ERROR silenced; it is closed on exit. A scheduler that does not answer
    within ``timeout`` seconds raises ``ValueError`` naming the address. The client is never made the
    process's default (``set_as_default=False``), so code that merely imports dask is unaffected.
    """
    distributed = require_distributed()
    if scheduler is not None:
        addr = check_scheduler_address(scheduler)
        try:
            client = distributed.Client(addr, timeout=timeout, set_as_default=False)
        except (OSError, TimeoutError) as e:
            raise ValueError(f"cannot connect to the Dask scheduler at {addr!r} within {timeout:g} s "
                             f"({' '.join(str(e).split()) or type(e).__name__}); start one with `dask scheduler` "
                             "and `dask worker ADDRESS`, or leave the address out for a local cluster") from None
        try:
            yield client
        finally:
            client.close()
        return
    n = check_workers(workers if workers is not None else (os.cpu_count() or 1))
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
