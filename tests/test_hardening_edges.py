"""Hardening at the edges (issue 12): what a new user trips on in fpsim.testing and the shipped data."""

from __future__ import annotations

import subprocess
import sys


def _python(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (import-time behaviour needs one)."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_strategies_reachable_as_attribute_and_lazy() -> None:
    """`import fpsim.testing` does not import hypothesis; `fpsim.testing.strategies` then loads it on access."""
    code = (
        "import sys, fpsim.testing as ft\n"
        "assert 'hypothesis' not in sys.modules, 'hypothesis imported by fpsim.testing'\n"
        "assert ft.strategies.from_format is not None\n"
        "assert 'hypothesis' in sys.modules\n"
        "try:\n    ft.no_such_name\nexcept AttributeError as e:\n    assert 'no_such_name' in str(e)\n"
        "else:\n    raise SystemExit('no AttributeError')\n"
    )
    r = _python(code)
    assert r.returncode == 0, r.stderr


def test_progress_with_ipykernel_imported_but_no_kernel() -> None:
    """A process that imported ipykernel (e.g. after running notebooks) but has no kernel trains quietly;
    it crashed with AttributeError on None.update before."""
    code = (
        "import ipykernel\n"
        "from fpsim.train import TrainConfig, Trainer\n"
        "h = Trainer('fp32', TrainConfig(steps=2, batch_size=4)).run()\n"
        "assert len(h['loss']) == 2\n"
    )
    r = _python(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "" and r.stderr == "", (r.stdout, r.stderr)  # not a terminal, no notebook: silent
