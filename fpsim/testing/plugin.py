"""pytest plugin (registered through the ``pytest11`` entry point as ``fpsim``); inert unless used.

It adds, for test suites that want them:

- ``--fpsim-seed=N``: the base seed of the ``fpsim_rng`` fixture (default 0, so runs are reproducible;
  each test gets its own stream derived from the seed and its node id);
- ``--fpsim-formats=bf16,fp16``: the formats the ``fpsim_format`` fixture runs over by default;
- the ``fpsim_format`` fixture: a test that takes it runs once per format (all registered formats, the
  ``--fpsim-formats`` list, or the marker's list: ``@pytest.mark.fpsim_formats("bf16", "fp8_e4m3")``),
  with the format name as the test id;
- ``fpsim_rng`` (a seeded ``numpy.random.Generator``), ``fpsim_mpfr`` (the gmpy2 module) and
  ``fpsim_strategies`` (:mod:`fpsim.testing.strategies`): the last two skip the test with a clear reason
  when the oracle extra (gmpy2, hypothesis) is not installed.

Nothing else changes: loading the plugin imports only fpsim's light core (NumPy and the assertion
helpers; never hypothesis, gmpy2, matplotlib or torch), adds two options and one marker, and prints
nothing unless ``--fpsim-seed`` is given. Tests that use none of the fixtures or the marker run exactly
as before. Disable it with ``-p no:fpsim``.
"""

from __future__ import annotations

import zlib
from typing import Any

import pytest

__all__ = [
    "fpsim_format",
    "fpsim_mpfr",
    "fpsim_rng",
    "fpsim_strategies",
    "pytest_addoption",
    "pytest_configure",
    "pytest_generate_tests",
    "pytest_report_header",
]

_EXTRA_HINT = "install fpsim's oracle extra: pip install 'fpsim-precision[test]'"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("fpsim", "fpsim (floating-point oracle)")
    group.addoption(
        "--fpsim-seed",
        action="store",
        type=int,
        default=None,
        metavar="N",
        help="base seed of the fpsim_rng fixture (default 0)",
    )
    group.addoption(
        "--fpsim-formats",
        action="store",
        default=None,
        metavar="NAMES",
        help="comma-separated formats for the fpsim_format fixture (default: all registered formats)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "fpsim_formats(*names): formats the fpsim_format fixture runs over for this test",
    )


def pytest_report_header(config: pytest.Config) -> str | None:
    seed = config.getoption("fpsim_seed", None)
    return None if seed is None else f"fpsim: --fpsim-seed={seed}"


def _chosen_formats(metafunc: pytest.Metafunc) -> list[Any]:
    from fpsim.formats import all_formats, as_format

    marker = metafunc.definition.get_closest_marker("fpsim_formats")
    names: list[Any]
    if marker is not None:
        names = list(marker.args)
        if len(names) == 1 and isinstance(names[0], (list, tuple)):
            names = list(names[0])
        if not names:
            raise pytest.UsageError(f"{metafunc.definition.nodeid}: @pytest.mark.fpsim_formats() needs format names")
    else:
        opt = metafunc.config.getoption("fpsim_formats", None)
        if opt:
            names = [n.strip() for n in str(opt).split(",") if n.strip()]
        else:
            return list(all_formats())
    out = []
    for n in names:
        try:
            out.append(as_format(n))
        except (TypeError, ValueError) as e:
            raise pytest.UsageError(f"{metafunc.definition.nodeid}: fpsim_formats: {e}") from None
    return out


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "fpsim_format" not in metafunc.fixturenames:
        return
    # A test that parametrizes fpsim_format itself keeps its own list.
    for m in metafunc.definition.iter_markers("parametrize"):
        argnames = m.args[0] if m.args else m.kwargs.get("argnames", "")
        names = [a.strip() for a in argnames.split(",")] if isinstance(argnames, str) else list(argnames)
        if "fpsim_format" in names:
            return
    fmts = _chosen_formats(metafunc)
    metafunc.parametrize("fpsim_format", fmts, ids=[f.name for f in fmts], indirect=True)


@pytest.fixture
def fpsim_format(request: pytest.FixtureRequest) -> Any:
    """The `fpsim.Format` this test instance runs with (see the ``fpsim_formats`` marker)."""
    param = getattr(request, "param", None)
    if param is None:
        raise pytest.UsageError("fpsim_format is parametrized by the fpsim plugin; use it as a test argument")
    from fpsim.formats import as_format

    return as_format(param)


@pytest.fixture
def fpsim_rng(request: pytest.FixtureRequest) -> Any:
    """A ``numpy.random.Generator`` seeded from ``--fpsim-seed`` and the test's node id."""
    import numpy as np

    seed = request.config.getoption("fpsim_seed", None)
    base = 0 if seed is None else int(seed)
    return np.random.default_rng([base, zlib.crc32(request.node.nodeid.encode())])


@pytest.fixture
def fpsim_mpfr() -> Any:
    """The gmpy2 module (MPFR), the independent rounding oracle; skips the test when it is missing."""
    return pytest.importorskip("gmpy2", reason=f"gmpy2 (MPFR oracle) is not installed; {_EXTRA_HINT}")


@pytest.fixture
def fpsim_strategies() -> Any:
    """:mod:`fpsim.testing.strategies`; skips the test when hypothesis is missing."""
    pytest.importorskip("hypothesis", reason=f"hypothesis is not installed; {_EXTRA_HINT}")
    from fpsim.testing import strategies

    return strategies
