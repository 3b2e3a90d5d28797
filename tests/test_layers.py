"""The import rules of ARCHITECTURE.md, enforced: imports point down the layers, the foundation is a line, and
there are no import circles among fpsim's modules. Also: heavy packages (matplotlib, hypothesis, cupy, torch)
are never imported by ``import fpsim``.

Every module's imports are read with :mod:`ast` (nothing is imported): ``import fpsim.x``, ``from fpsim.x import
y``, ``from . import x``, ``from ..x import y``, at module level and inside functions ("deferred" imports: a
circle hidden in a function body is still a circle), but not under ``if TYPE_CHECKING:``.

The layer of every top-level module and folder of ``fpsim/`` is declared once, in :data:`LAYERS`. Run this file
as a script (``python tests/test_layers.py``) to print the circles and upward imports it finds.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "fpsim"

# --------------------------------------------------------------------------------------------------
# The one layer table: bottom first. A module (or any module of a folder) may import only from its own layer or
# below. In the layers named in LINES the listed order is also the import order: a module imports only the
# modules listed before it (the numbers are a line, not a knot).

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("helpers", ("_names", "_checks", "_fpenv", "_deprecation", "_blas", "_dask", "_cliargs", "random",
                 "_ckernel", "_carith", "_cgemm", "_cfpenv")),  # private helpers and the C extensions
    ("numbers", ("formats", "_interop", "_carrier", "_exact", "rounding", "bits", "_grid")),
    ("arithmetic", ("arith", "array")),
    ("matrix units", ("_sumtree", "accumulate", "mma")),
    ("layers", ("nn",)),
    # quant/ holds fake quantization, NF4 and integer inference; quant_int and quant_nf4 re-export the last two
    ("precision", ("amp", "quant", "quant_int", "quant_nf4", "scaling")),
    ("training", ("train",)),
    ("edges", ("cli", "audit", "plot", "plan", "gpu", "testing")),
)
LINES = frozenset({"numbers", "arithmetic"})

# Conveniences: a method whose implementation lives in a module above its class's (Format's value operations,
# Policy.runtime, Trainer.run's checkpoints), imported inside the method body only, so that the lower module
# never needs the upper one to load. Each is an explicit, reviewed exception (module -> module); every other
# deferred import counts like a module-level one.
CONVENIENCES: frozenset[tuple[str, str]] = frozenset({
    ("fpsim.formats", "fpsim._grid"),  # Format.values/ulp/next_up/next_down round and decode: _grid does it
    ("fpsim.amp.policy", "fpsim.amp.runtime"),  # Policy.runtime(): the stateful object built from the policy
    ("fpsim.train.loop", "fpsim.train.checkpoint"),  # Trainer.run(checkpoint=path) writes the checkpoint
})

RANK = {name: i for i, (_, names) in enumerate(LAYERS) for name in names}
LAYER_NAME = {name: layer for layer, names in LAYERS for name in names}
POSITION = {name: j for layer, names in LAYERS if layer in LINES for j, name in enumerate(names)}


# --------------------------------------------------------------------------------------------------
# Reading the imports


@dataclass(frozen=True)
class Edge:
    """``source`` imports ``target`` (both dotted module names) at ``line``; ``deferred``: inside a function."""

    source: str
    target: str
    line: int
    deferred: bool
    names: tuple[str, ...] = ()  # the names a ``from`` import takes (for the private-name rule)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def module_files() -> dict[str, Path]:
    """Every fpsim module: dotted name -> file (the C extensions are named by their ``.c`` source)."""
    mods = {_module_name(p): p for p in ROOT.rglob("*.py")}
    mods.update({_module_name(p): p for p in ROOT.glob("_c*.c")})
    return mods


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.Module) -> Iterable[tuple[ast.Import | ast.ImportFrom, bool]]:
    """(import statement, deferred) for every import outside ``if TYPE_CHECKING:`` blocks."""
    def visit(node: ast.AST, deferred: bool) -> Iterable[tuple[ast.Import | ast.ImportFrom, bool]]:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, deferred
            return
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                yield from visit(child, deferred)
            return
        inner = deferred or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            yield from visit(child, inner)
    yield from visit(tree, False)


def module_edges(name: str, path: Path, mods: Mapping[str, Path]) -> list[Edge]:
    """The fpsim modules that module ``name`` (file ``path``) imports."""
    if path.suffix != ".py":
        return []
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out: list[Edge] = []
    for node, deferred in _import_nodes(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [Edge(name, a.name, node.lineno, deferred) for a in node.names if a.name.split(".")[0] == "fpsim"]
            continue
        if node.level:
            base = package[: len(package) - node.level + 1]
            mod = ".".join(base + (node.module.split(".") if node.module else []))
        else:
            mod = node.module or ""
        if mod.split(".")[0] != "fpsim":
            continue
        names = tuple(a.name for a in node.names)
        subs = [n for n in names if f"{mod}.{n}" in mods]  # "from . import rounding": the submodule
        out += [Edge(name, f"{mod}.{n}", node.lineno, deferred) for n in subs]
        rest = tuple(n for n in names if n not in subs and not (n.startswith("__") and n.endswith("__")))
        if rest:  # names defined in `mod` itself (package metadata such as __version__ is not code)
            out.append(Edge(name, mod, node.lineno, deferred, rest))
    return [e for e in out if e.target != name]


def import_graph() -> list[Edge]:
    mods = module_files()
    return [e for name, path in sorted(mods.items()) for e in module_edges(name, path, mods)]


# --------------------------------------------------------------------------------------------------
# The rules, as functions of an import graph (so that a planted graph can test them)


def circles(edges: Iterable[tuple[str, str]]) -> list[frozenset[str]]:
    """The import circles: strongly connected components of more than one module (Tarjan, iteratively)."""
    graph: dict[str, list[str]] = {}
    for a, b in edges:
        graph.setdefault(a, []).append(b)
        graph.setdefault(b, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(graph[w])))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    x = stack.pop()
                    on_stack.discard(x)
                    comp.add(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    found.append(frozenset(comp))
    return found


def layer_key(module: str) -> str | None:
    """The entry of :data:`LAYERS` a dotted module name belongs to (``fpsim.mma.gemm`` -> ``mma``); None for the
    package ``fpsim`` itself (the facade that re-exports everything)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def upward(edges: Iterable[Edge], rank: Mapping[str, int] = RANK, position: Mapping[str, int] = POSITION,
           allowed: frozenset[tuple[str, str]] = CONVENIENCES) -> list[str]:
    """Each import that goes up a layer, or back along a line, as a readable line."""
    bad = []
    for e in edges:
        if (e.source, e.target) in allowed:
            continue
        me, it = layer_key(e.source), layer_key(e.target)
        if me is None or me == it:
            continue
        if it is None:
            bad.append(f"{e.source} line {e.line}: imports the package fpsim itself (import the module instead)")
            continue
        if rank[it] > rank[me]:
            bad.append(f"{e.source} line {e.line}: imports {e.target} ({LAYER_NAME.get(it, it)}) from "
                       f"{LAYER_NAME.get(me, me)}")
        elif rank[it] == rank[me] and me in position and it in position and position[it] > position[me]:
            bad.append(f"{e.source} line {e.line}: imports {e.target}, after it in the line of "
                       f"{LAYER_NAME.get(me, me)}")
    return bad


# --------------------------------------------------------------------------------------------------
# Tests

EDGES = import_graph()
MODULES = sorted(module_files())


def test_every_module_has_one_layer() -> None:
    keys = {layer_key(m) for m in MODULES} - {None}
    missing = sorted(k for k in keys if k not in RANK)
    assert not missing, f"no layer in LAYERS for {missing}: add each where ARCHITECTURE.md puts it"
    stale = sorted(set(RANK) - keys)
    assert not stale, f"LAYERS names modules that do not exist: {stale}"
    declared = [n for _, names in LAYERS for n in names]
    assert len(declared) == len(set(declared)), "a module is listed in two layers"


def test_no_circles_among_module_level_imports() -> None:
    found = circles((e.source, e.target) for e in EDGES if not e.deferred)
    assert not found, "import circles at module level: " + "; ".join(" <-> ".join(sorted(c)) for c in found)


def test_no_import_circles() -> None:
    """Deferred imports count: a circle hidden inside a function body is still a circle."""
    found = set(circles((e.source, e.target) for e in EDGES if (e.source, e.target) not in CONVENIENCES))
    assert not found, "import circles: " + "; ".join(" <-> ".join(sorted(c)) for c in sorted(found, key=sorted))


def test_conveniences_are_deferred_and_real() -> None:
    for source, target in sorted(CONVENIENCES):
        uses = [e for e in EDGES if (e.source, e.target) == (source, target)]
        assert uses, f"CONVENIENCES lists {source} -> {target}, which no longer exists: remove it"
        eager = [e.line for e in uses if not e.deferred]
        assert not eager, f"{source} imports {target} at module level (lines {eager}): only inside methods"


@pytest.mark.parametrize("module", MODULES)
def test_imports_point_down(module: str) -> None:
    bad = upward(e for e in EDGES if e.source == module)
    assert not bad, "\n".join(bad)


def test_numbers_use_each_others_public_names() -> None:
    """Inside the foundation no module imports another's private (underscore) names: what two modules share
    lives in a private module under public names (``_carrier``, ``_interop``)."""
    numbers = {n for layer, names in LAYERS if layer == "numbers" for n in names}
    bad = [f"{e.source} line {e.line}: from {e.target} import {n}"
           for e in EDGES if layer_key(e.source) in numbers and layer_key(e.target) in numbers
           for n in e.names if n.startswith("_") and not n.startswith("__")]
    assert not bad, "\n".join(bad)


def test_the_rules_catch_a_planted_circle_and_an_upward_import() -> None:
    planted = [("fpsim.a", "fpsim.b"), ("fpsim.b", "fpsim.c"), ("fpsim.c", "fpsim.a"), ("fpsim.c", "fpsim.d"),
               ("fpsim.e", "fpsim.e")]
    assert circles(planted) == [frozenset({"fpsim.a", "fpsim.b", "fpsim.c"})]
    assert circles(planted[:2]) == []
    rank = {"low": 0, "high": 1, "first": 0, "second": 0}
    position = {"first": 0, "second": 1}
    fake = [Edge("fpsim.low.x", "fpsim.high", 3, True), Edge("fpsim.high", "fpsim.low.y", 4, False),
            Edge("fpsim.first", "fpsim.second", 5, False), Edge("fpsim.second", "fpsim.first", 6, False),
            Edge("fpsim.low.x", "fpsim", 7, True)]
    bad = upward(fake, rank, position, frozenset())
    assert len(bad) == 3 and "fpsim.low.x line 3" in bad[0] and "fpsim.first line 5" in bad[1], bad
    assert upward(fake[:1], rank, position, frozenset({("fpsim.low.x", "fpsim.high")})) == []


def test_the_reader_sees_every_kind_of_import(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    mod = tmp_path / "sub" / "mod.py"  # plays fpsim/sub/mod.py
    mod.write_text("from typing import TYPE_CHECKING\nimport fpsim.formats\nfrom .. import rounding, __version__\n"
                   "from . import thing\nif TYPE_CHECKING:\n    from ..bits import x\n"
                   "def f():\n    from ..arith import add\n")
    mods = {m: mod for m in ("fpsim.formats", "fpsim.rounding", "fpsim.sub", "fpsim.bits", "fpsim.arith")}
    got = {(e.target, e.deferred) for e in module_edges("fpsim.sub.mod", mod, mods)}
    assert got == {("fpsim.formats", False), ("fpsim.rounding", False), ("fpsim.sub", False), ("fpsim.arith", True)}


def test_import_fpsim_is_light() -> None:
    code = (
        "import sys, fpsim; heavy = [m for m in ('matplotlib', 'hypothesis', 'cupy', 'torch', 'gmpy2') "
        "if m in sys.modules]; print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"import fpsim pulled in: {out.stdout.strip()}"


if __name__ == "__main__":
    everything = circles((e.source, e.target) for e in EDGES)
    print(f"{len(everything)} import circles (deferred imports included, conveniences included):")
    for c in everything:
        print("   ", " <-> ".join(sorted(c)))
    ruled = circles((e.source, e.target) for e in EDGES if (e.source, e.target) not in CONVENIENCES)
    print(f"{len(ruled)} without the declared conveniences; "
          f"{len(circles((e.source, e.target) for e in EDGES if not e.deferred))} among module-level imports")
    for line in upward(EDGES):
        print("upward:", line)
