"""`import fpsim` is light (issue 30): the trainer, policies, matrix units and plotting load on first use."""

from __future__ import annotations

import subprocess
import sys

import pytest

import fpsim
import fpsim.cli as cli

#: What `import fpsim`, `fpsim --help` and `fpsim round` must not load: each costs tens of milliseconds.
HEAVY = ("train", "amp", "nn", "plot", "mma", "quant", "scaling", "gpu", "testing", "plan", "audit")


def _loaded_after(code: str) -> list[str]:
    probe = (f"import sys\n{code}\n"
             "print(' '.join(sorted({m.split('.')[1] for m in sys.modules if m.startswith('fpsim.')})))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    return [m for m in out.split() if m in HEAVY]


@pytest.mark.parametrize("code", [
    "import fpsim",
    "import fpsim; fpsim.round(0.1, 'bf16'); fpsim.sum([1.0, 2.0], 'fp16')",
    "import fpsim.cli as c, contextlib, io\nwith contextlib.redirect_stdout(io.StringIO()): c.main(['round', '0.1'])",
    "import fpsim.cli as c, contextlib, io\nwith contextlib.redirect_stdout(io.StringIO()):\n"
    "    try: c.main(['--help'])\n    except SystemExit: pass",
])
def test_light_paths_load_no_heavy_layer(code: str) -> None:
    assert _loaded_after(code) == []


def test_lazy_names_resolve_to_the_submodules() -> None:
    import fpsim.mma
    import fpsim.train

    assert fpsim.matmul is fpsim.mma.matmul
    assert fpsim.train is sys.modules["fpsim.train"]
    from fpsim import amp, scaling

    assert amp is sys.modules["fpsim.amp"] and scaling is sys.modules["fpsim.scaling"]
    assert {"train", "amp", "matmul", "round"} <= set(dir(fpsim))


def test_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'trian'"):
        fpsim.trian  # noqa: B018
    assert not hasattr(fpsim, "trian")


def _sub_help(p: object) -> dict[str, str]:
    import argparse

    assert isinstance(p, argparse.ArgumentParser)
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            return {c.dest: str(c.help) for c in a._choices_actions}
    raise AssertionError("no subcommands")


@pytest.mark.parametrize("name", sorted(cli._EXTENSIONS))
def test_listed_help_is_what_the_module_registers(name: str) -> None:
    """The one-line help kept in fpsim.cli for `fpsim --help` cannot drift from the subcommand's own."""
    assert _sub_help(cli.build_parser(name))[name] == _sub_help(cli.build_parser())[name]
    assert _sub_help(cli.build_parser(name)).keys() == _sub_help(cli.build_parser()).keys()
