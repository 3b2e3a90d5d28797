"""The import-layer rule of design.md: a module imports only from its own layer or below, and heavy
packages (matplotlib, hypothesis, cupy, torch) are never imported by ``import fpsim``."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "fpsim"

LAYER = {
    "formats": 0, "rounding": 0, "bits": 0, "_deprecation": 0, "_ckernel": 0, "_names": 0, "_fpenv": 0,
    "_exact": 0, "_cliargs": 0, "_interop": 0, "_dask": 0,
    "_checks": 0, "_blas": 0,
    "arith": 1, "array": 1,
    "mma": 2, "accumulate": 2, "_sumtree": 2,
    "nn": 3,
    "amp": 4, "quant": 4, "scaling": 4, "quant_nf4": 4, "quant_int": 4,
    "train": 5, "plan": 5,
    "plot": 6, "testing": 6, "gpu": 6, "cli": 6, "audit": 6,
}


def _top(modpath: Path) -> str:
    rel = modpath.relative_to(ROOT)
    return rel.parts[0].removesuffix(".py")


def _imports(path: Path) -> list[tuple[str, int]]:
    """(first component of each fpsim-internal import, line) for a module file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    pkg_parts = path.relative_to(ROOT.parent).with_suffix("").parts[:-1]  # ("fpsim", "mma") for fpsim/mma/x.py
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(pkg_parts[: len(pkg_parts) - node.level + 1])
                mod = base + (node.module.split(".") if node.module else [])
                if len(mod) == 1:  # "from . import x, y"
                    out += [(a.name, node.lineno) for a in node.names]
                else:
                    out.append((mod[1], node.lineno))
            elif node.module and node.module.split(".")[0] == "fpsim":
                parts = node.module.split(".")
                if len(parts) > 1:
                    out.append((parts[1], node.lineno))
                else:
                    out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] == "fpsim" and len(parts) > 1:
                    out.append((parts[1], node.lineno))
    return out


MODULES = [p for p in ROOT.rglob("*.py") if p.name != "__init__.py" or p.parent != ROOT]


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_point_down(path: Path) -> None:
    me = _top(path)
    if me not in LAYER:
        pytest.fail(f"module {me!r} has no layer in tests/test_layers.py (add it where design.md puts it)")
    bad = [
        f"line {line}: imports fpsim.{name} (layer {LAYER[name]}) from layer {LAYER[me]}"
        for name, line in _imports(path)
        if name in LAYER and LAYER[name] > LAYER[me]
    ]
    assert not bad, f"{path.relative_to(ROOT)}:\n" + "\n".join(bad)


def test_import_fpsim_is_light() -> None:
    code = (
        "import sys, fpsim; heavy = [m for m in ('matplotlib', 'hypothesis', 'cupy', 'torch', 'gmpy2') "
        "if m in sys.modules]; print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"import fpsim pulled in: {out.stdout.strip()}"
