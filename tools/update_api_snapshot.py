"""Regenerate ``tests/api_snapshot.txt``, the frozen list of fpsim's public names.

The public API is the ``__all__`` of ``fpsim`` and of every public submodule (no path component
starting with ``_``). Each line is ``module: name``; a public module without ``__all__`` is recorded as
``module: <no __all__>`` so that the omission shows up in review (likewise names listed in ``__all__``
but undefined, or listed twice). Modules that cannot be imported here
because an optional dependency is missing (CuPy, hypothesis, ...) are listed as
``module: <needs NAME>`` and their names are not compared.

Usage::

    python tools/update_api_snapshot.py          # rewrite the snapshot
    python tools/update_api_snapshot.py --check  # exit 1 and print a diff if it is out of date
"""

from __future__ import annotations

import difflib
import importlib
import os
import pkgutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOT = ROOT / "tests" / "api_snapshot.txt"
HEADER = "# fpsim public API (module: name). Regenerate with: python tools/update_api_snapshot.py\n"


def public_modules() -> list[str]:
    """``fpsim`` and its public submodules, sorted."""
    import fpsim

    names = ["fpsim"]
    for info in pkgutil.walk_packages(fpsim.__path__, "fpsim.", onerror=lambda name: None):
        if any(part.startswith("_") for part in info.name.split(".")):
            continue
        names.append(info.name)
    return sorted(set(names))


def module_lines(modname: str) -> list[str]:
    """Snapshot lines of one module."""
    try:
        mod = importlib.import_module(modname)
    except ModuleNotFoundError as e:
        missing = e.name or "?"
        if missing.split(".")[0] == "fpsim":
            raise
        return [f"{modname}: <needs {missing.split('.')[0]}>"]
    names = getattr(mod, "__all__", None)
    if names is None:
        return [f"{modname}: <no __all__>"]
    lines = []
    for n in sorted(set(names)):
        # A name listed but not defined is recorded, so that the API tests can point at it.
        lines.append(f"{modname}: {n}" if hasattr(mod, n) else f"{modname}: {n} <listed in __all__ but undefined>")
    lines += [f"{modname}: {n} <listed twice>" for n in sorted(set(names)) if list(names).count(n) > 1]
    return lines


def current_api() -> list[str]:
    lines: list[str] = []
    for m in public_modules():
        lines.extend(module_lines(m))
    return lines


def read_snapshot(path: Path = SNAPSHOT) -> list[str]:
    if not path.exists():
        return []
    return [ln for ln in path.read_text().splitlines() if ln and not ln.startswith("#")]


def write_snapshot(lines: list[str], path: Path = SNAPSHOT) -> None:
    text = HEADER + "".join(ln + "\n" for ln in lines)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".api_snapshot.", suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)  # atomic


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(ROOT))
    lines = current_api()
    if "--check" in argv:
        old = read_snapshot()
        if old == lines:
            print("API snapshot is up to date")
            return 0
        sys.stdout.writelines(difflib.unified_diff([ln + "\n" for ln in old], [ln + "\n" for ln in lines],
                                                   "tests/api_snapshot.txt", "current API"))
        return 1
    write_snapshot(lines)
    print(f"wrote {SNAPSHOT.relative_to(ROOT)}: {len(lines)} entries")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
