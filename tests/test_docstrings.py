"""Every docstring example of every fpsim module runs and gives what it shows (numpy-style docs are
promises). Modules that need an optional dependency missing here are skipped."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import fpsim

MODULES = sorted(m.name for m in pkgutil.walk_packages(fpsim.__path__, "fpsim.") if not m.name.endswith("_cfpenv")
                 and not m.name.endswith("_ckernel"))


@pytest.mark.parametrize("modname", MODULES)
def test_docstring_examples(modname: str) -> None:
    try:
        mod = importlib.import_module(modname)
    except ImportError as e:  # pragma: no cover - optional dependency missing
        pytest.skip(f"{modname}: {e}")
    res = doctest.testmod(mod, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert res.failed == 0, f"{res.failed} of {res.attempted} examples of {modname} failed (run python -m pytest " \
                            f"--doctest-modules on it for details)"
