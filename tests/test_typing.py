"""Type hints of the public modules pass ``mypy --strict``."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Public modules held to mypy --strict. Add a module here once it is clean.
STRICT = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "fpsim").rglob("*.py"))
# Every module of the package is held to --strict (public and private alike).


@pytest.mark.slow
def test_public_modules_pass_mypy_strict() -> None:
    pytest.importorskip("mypy")
    r = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary", "--hide-error-context", *STRICT],
        cwd=ROOT, check=False, capture_output=True, text=True, timeout=600,
    )
    # mypy also reports modules the listed ones import; hold only the listed ones to --strict here.
    ours = [ln for ln in r.stdout.splitlines()
            if re.match(r"^([\w/.]+\.py):\d+: error", ln) and ln.split(":")[0] in STRICT]
    assert not ours, "mypy --strict errors:\n" + "\n".join(ours)
    assert r.returncode in (0, 1), r.stdout + r.stderr
