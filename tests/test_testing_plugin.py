"""The fpsim pytest plugin, run on a throwaway project in a subprocess."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import fpsim

PROJECT = '''
import pytest

def test_all(fpsim_format):
    assert fpsim_format.width > 0

@pytest.mark.fpsim_formats("bf16", "fp16")
def test_some(fpsim_format):
    assert fpsim_format.name in ("bf16", "fp16")

@pytest.mark.parametrize("fpsim_format", ["mine"])
def test_own_parametrize(fpsim_format):
    assert fpsim_format == "mine"

def test_rng(fpsim_rng):
    print("RNG", int(fpsim_rng.integers(1 << 40)))

def test_mpfr(fpsim_mpfr):
    assert fpsim_mpfr.mpfr(1) == 1

def test_strategies(fpsim_strategies):
    assert hasattr(fpsim_strategies, "from_format")

def test_plain():
    pass
'''


NOEXTRA = '''
import sys
import pytest

@pytest.fixture(autouse=True)
def _no_oracle_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "gmpy2", None)
    monkeypatch.setitem(sys.modules, "hypothesis", None)

def test_mpfr_missing(fpsim_mpfr):
    pass

def test_strategies_missing(fpsim_strategies):
    pass
'''

BAD = "import pytest\n@pytest.mark.fpsim_formats('bf17')\ndef test_x(fpsim_format):\n    pass\n"

# Other plugins only cost start-up time here.
QUIET = ["-p", "no:cacheprovider", "-p", "no:benchmark", "-p", "no:hypothesispytest", "-p", "no:xdist"]


def _run(tmp: Path, *args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "pytest", *QUIET, "-v", "-s", "-rs", *args],
                       cwd=tmp, check=False, capture_output=True, text=True, timeout=120)
    return r.stdout + r.stderr


def _rng_value(out: str) -> int:
    m = re.search(r"RNG (\d+)", out)
    assert m, out
    return int(m.group(1))


def test_plugin_fixtures_marker_options_and_skips(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = --strict-markers\n")
    (tmp_path / "test_proj.py").write_text(PROJECT)
    (tmp_path / "test_noextra.py").write_text(NOEXTRA)
    out = _run(tmp_path, "test_proj.py", "test_noextra.py")
    n = len(fpsim.format_names())
    assert f"{n + 2 + 5} passed, 2 skipped" in out, out
    assert "test_all[bf16] PASSED" in out and "test_all[fp8_e4m3] PASSED" in out
    assert "test_some[fp16] PASSED" in out and "test_some[fp32]" not in out
    assert "test_own_parametrize[mine] PASSED" in out
    assert "fpsim: --fpsim-seed" not in out  # silent unless asked
    assert "gmpy2 (MPFR oracle) is not installed; install fpsim's oracle extra" in out
    assert "hypothesis is not installed" in out
    # Default seed 0: each test's stream comes from (seed, crc32(node id)).
    import zlib

    import numpy as np

    want = np.random.default_rng([0, zlib.crc32(b"test_proj.py::test_rng")]).integers(1 << 40)
    assert _rng_value(out) == int(want)

    (tmp_path / "test_bad.py").write_text(BAD)
    out2 = _run(tmp_path, "--continue-on-collection-errors", "--fpsim-seed=7", "--fpsim-formats=fp8_e4m3, e8m0", "-k", "all or rng")
    assert "fpsim: --fpsim-seed=7" in out2
    assert "test_all[fp8_e4m3] PASSED" in out2 and "test_all[e8m0] PASSED" in out2 and "test_all[bf16]" not in out2
    assert _rng_value(out2) != _rng_value(out)
    assert "unknown format 'bf17'" in out2  # a bad marker fails that module's collection, clearly


def test_plugin_is_inert_for_projects_that_do_not_use_it(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_x.py").write_text("def test_x():\n    pass\n")
    on = _run(tmp_path)
    off = _run(tmp_path, "-p", "no:fpsim")
    assert "1 passed" in on and "1 passed" in off
    head = on.split("collecting")[0]
    assert "fpsim:" not in head and "fpsim (" not in head
