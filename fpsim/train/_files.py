"""Files written whole or not at all, and the temporaries of killed writers removed without touching live ones.

One rule for every file the training layer writes (checkpoints, demo results): a temporary file beside
the target, created exclusively, **locked** (``flock``) for as long as it is being written, flushed and
fsynced, renamed over the target, then the folder fsynced. A kill at any moment leaves the old file or
the new one, never a mixture.

A temporary is stale when no process holds its lock and it has not been modified for ``min_age_s``
seconds (the age covers the instant between creating a file and locking it). A live writer always holds
the lock, so a paused, slow or swapping process, another PID namespace on the same host name or another
machine on a shared folder (NFS maps ``flock`` to byte-range locks) is never mistaken for a dead one.
Only plain files of the current user whose names match the caller's pattern are considered. Where
``fcntl`` is missing (Windows) nothing is locked and the age rule alone applies, with an hour's margin.
"""

from __future__ import annotations

import os
import re
import secrets
import stat
import time
from collections.abc import Callable
from typing import IO

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["atomic_write", "remove_stale_tmp"]

_NO_LOCK_AGE_S = 3600.0  # without locks, only the age can tell: be generous


def _fsync_dir(folder: str) -> None:
    """Make a rename durable (POSIX); where a folder cannot be opened (Windows) there is nothing to do."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str, write: Callable[[IO[bytes]], object], *, prefix: str, suffix: str = "",
                 mode: int = 0o666) -> None:
    """Write ``path`` atomically: ``write(f)`` fills a locked temporary ``<prefix><token><suffix>`` beside it.

    The file gets ``mode`` less the umask (as ``open`` gives). On any exception the temporary is removed
    and the exception propagates; ``path`` is then untouched. A symbolic link is written through, as
    ``open`` would: the temporary goes beside the link's final target and is renamed onto it, so the link
    stays (renaming onto the link itself would replace it with a plain file).
    """
    path = os.path.realpath(path)
    d = os.path.dirname(path)
    tmp = os.path.join(d, f"{prefix}{secrets.token_hex(8)}{suffix}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), mode)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)  # held until the fd closes, after the rename
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
            os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(d)


def remove_stale_tmp(folder: str, pattern: re.Pattern[str], min_age_s: float) -> list[str]:
    """Remove the stale temporaries in ``folder`` whose names ``pattern`` matches; returns their paths.

    Best effort: an unreadable folder, a file that vanished, is locked or cannot be removed is skipped.
    """
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    removed = []
    now = time.time()
    uid = os.getuid() if hasattr(os, "getuid") else None
    age = min_age_s if fcntl is not None else max(min_age_s, _NO_LOCK_AGE_S)
    for name in names:
        if pattern.match(name) is None:
            continue
        p = os.path.join(folder, name)
        try:
            fd = os.open(p, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
        except OSError:
            continue  # gone, a link, or not ours to read
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or (uid is not None and st.st_uid != uid):
                continue  # not a plain file of ours
            if now - st.st_mtime <= age:
                continue
            if fcntl is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    continue  # a live writer holds it
            cur = os.lstat(p)
            if (cur.st_dev, cur.st_ino) != (st.st_dev, st.st_ino):
                continue  # renamed or replaced meanwhile
            os.unlink(p)
            removed.append(p)
        except OSError:
            pass
        finally:
            os.close(fd)
    return removed
