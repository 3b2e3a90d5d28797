"""API freeze: the public names (``__all__`` of fpsim and its public submodules) match the snapshot.

An intended change is recorded by running ``python tools/update_api_snapshot.py`` and committing the
new ``tests/api_snapshot.txt`` with it; removals must first go through a deprecation cycle (see
docs/oracle.md, "API stability").
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("update_api_snapshot", ROOT / "tools" / "update_api_snapshot.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("update_api_snapshot", mod)
    spec.loader.exec_module(mod)
    return mod


def _comparable(lines: list[str], skip: set[str]) -> list[str]:
    return [ln for ln in lines if ln.split(":")[0] not in skip]


def test_public_api_matches_snapshot() -> None:
    tool = _tool()
    current = tool.current_api()
    frozen = tool.read_snapshot()
    assert frozen, "tests/api_snapshot.txt is missing: run python tools/update_api_snapshot.py"
    # A module that needs an optional dependency missing here is compared where it can be imported.
    skip = {ln.split(":")[0] for ln in current + frozen if ": <needs " in ln}
    cur, old = _comparable(current, skip), _comparable(frozen, skip)
    if cur != old:
        added = sorted(set(cur) - set(old))
        removed = sorted(set(old) - set(cur))
        pytest.fail(
            "public API differs from tests/api_snapshot.txt\n"
            + "".join(f"  + {ln}\n" for ln in added)
            + "".join(f"  - {ln}\n" for ln in removed)
            + "If intended, run: python tools/update_api_snapshot.py (removals need a deprecation cycle first)"
        )


def test_every_public_module_declares_a_valid_all() -> None:
    bad = [ln for ln in _tool().current_api() if ln.endswith(("<no __all__>", "undefined>", "<listed twice>"))]
    assert not bad, "problems with __all__:\n" + "\n".join(bad)


def test_top_level_all_is_explicit_and_importable() -> None:
    import fpsim

    assert len(fpsim.__all__) == len(set(fpsim.__all__))
    for name in fpsim.__all__:
        assert hasattr(fpsim, name), name
    # Public, non-module attributes of the package are all listed (no accidental exports).
    stray = sorted(
        n for n, v in vars(fpsim).items()
        if not n.startswith("_") and not isinstance(v, ModuleType) and n not in fpsim.__all__
        and n not in ("annotations",)
    )
    assert not stray, f"public names missing from fpsim.__all__: {stray}"


def test_deprecation_helper_warns_at_the_caller() -> None:
    from fpsim._deprecation import deprecated

    @deprecated(since="0.2", removed_in="0.4", alternative="fpsim.round")
    def old(x: float) -> float:
        """Old."""
        return x

    with pytest.warns(DeprecationWarning, match=r"old is deprecated since fpsim 0.2 and will be removed in 0.4; "
                                                r"use fpsim.round instead") as rec:
        assert old(2.0) == 2.0
    assert rec[0].filename == __file__
    assert old.__doc__ is not None and "deprecated:: 0.2" in old.__doc__


def test_top_level_names_are_in_their_modules_all() -> None:
    import importlib

    import fpsim

    stray = []
    for name in fpsim.__all__:
        home = getattr(getattr(fpsim, name), "__module__", None)
        public_home = isinstance(home, str) and home.startswith("fpsim.") and not home.split(".")[-1].startswith("_")
        if public_home and name not in getattr(importlib.import_module(str(home)), "__all__", ()):
            stray.append(f"{home}.{name}")
    assert not stray, f"exported by fpsim but missing from their module's __all__: {stray}"
