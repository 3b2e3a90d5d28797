"""The GEMM executor and the matrix units: gemm.py knows no model kind, every kind has a unit, a new unit
needs no edit of the executor, and fpsim.mma's modules import each other without circles (issue 26)."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fpsim
from fpsim.formats import Format, fp16, fp32
from fpsim.mma import KINDS, BlockScaledModel, MMAModel, block_scaled_model, get_model
from fpsim.mma import _unit as U
from fpsim.mma import gemm as G

MMA = Path(fpsim.__file__).parent / "mma"


def test_gemm_names_no_model_kind() -> None:
    """No model-kind string, no ``.kind`` and no isinstance on a model class in the executor's code."""
    tree = ast.parse((MMA / "gemm.py").read_text(encoding="utf-8"))
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef)) and n.body
                  and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in KINDS and id(node) not in docstrings:
            found.append(f"line {node.lineno}: {node.value!r}")
        if isinstance(node, ast.Attribute) and node.attr == "kind":
            found.append(f"line {node.lineno}: .kind")
        if isinstance(node, ast.Name) and node.id in ("AMD_KINDS", "KINDS"):
            found.append(f"line {node.lineno}: {node.id}")
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "isinstance" and len(node.args) == 2:
            classes = {getattr(n, "id", "") for n in ast.walk(node.args[1])}
            if any(c.endswith("Model") for c in classes):
                found.append(f"line {node.lineno}: isinstance on {sorted(classes)}")
    # input_rounding="exact" is an input conversion, not the exact model: gemm.py names it EXACT_INPUT
    assert not found, found


def test_every_kind_has_a_unit() -> None:
    protocol = [n for n in dir(U.MatrixUnit) if not n.startswith("_")]
    assert {"reference", "bfma_kernel", "generic_kernel", "k_step", "pad_to", "matmul"} <= set(protocol)
    for kind in KINDS:
        unit = U.unit_for(kind)
        assert all(hasattr(unit, n) for n in protocol), kind
    assert block_scaled_model("b200", "f8f6f4", "fp8_e4m3", "fp8_e4m3")._unit.own_matmul
    assert not get_model("h100", "fp16")._unit.own_matmul
    with pytest.raises(ValueError, match="no matrix unit is registered"):
        U.unit_for("no_such_kind")


def test_unit_answers_follow_the_model() -> None:
    h = get_model("h100", "fp16")
    v1 = get_model("h100", "fp8_e4m3", "fp16")  # mod-4 grouping: 2k products per instruction
    assert (h._unit.k_step(h), h._unit.pad_to(h, None), h._unit.pad_to(h, 64)) == (16, 16, 64)
    assert v1._unit.k_step(v1) == 32
    kern = v1._unit.bfma_kernel(v1)
    assert kern is not None and kern.order is not None and kern.instruction_k == 32
    assert sorted(kern.order(64).tolist()) == list(range(64))
    assert h._unit.bfma_kernel(h).order is None  # type: ignore[union-attr]
    for name in ("exact", "fma_chain", "pairwise", "wide", "mi300x:bf16"):
        m = fpsim.mma.as_model(name)
        assert m._unit.k_step(m) == 1 and m._unit.bfma_kernel(m) is None
    assert fpsim.mma.fma_chain._unit.generic_kernel(fpsim.mma.fma_chain) is not None
    assert fpsim.mma.exact._unit.generic_kernel(fpsim.mma.exact) is None


# -- a new matrix unit: one module's worth of code, no edit of the executor ------------------------------------

class _HalfUnit(U.UnitBase):
    """A toy family: products rounded to fp16, summed in float64 in index order with C, RNE to fp32."""

    def reference(self, x: np.ndarray, y: np.ndarray, ex: np.ndarray, ey: np.ndarray, c: np.ndarray,
                  model: Any, has_specials: bool, lsb_top: tuple[int, int] | None) -> np.ndarray:
        prod = np.broadcast_to(x * y, (x.shape[0],) + c.shape).astype(np.float16).astype(np.float64)
        d = c.astype(np.float64)
        for i in range(prod.shape[0]):
            d = d + prod[i]
        res: np.ndarray = d.astype(np.float32).astype(np.float64)
        return res


@dataclass(frozen=True)
class _HalfModel:
    name: str = "toy half-product unit"
    input: Format = fp16
    output: Format = fp32
    source: str = field(default="test", compare=False)

    @property
    def b_format(self) -> Format:
        return self.input

    @property
    def _unit(self) -> _HalfUnit:
        return _HalfUnit()


@pytest.mark.parametrize("use_c", [True, False])
def test_a_new_unit_runs_on_the_executor(use_c: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(G, "use_c_gemm", use_c and G._cgemm is not None)
    rng = np.random.default_rng(26)
    a = rng.standard_normal((2, 3, 20))
    b = rng.standard_normal((20, 4))
    c = rng.standard_normal((3, 4))
    m = _HalfModel()
    got = fpsim.mma.matmul(a, b, c, model=m)  # type: ignore[arg-type]
    av = np.asarray(G.convert_inputs(a, fp16, None, "A"))
    bv = np.asarray(G.convert_inputs(b, fp16, None, "B"))
    cv = c.astype(np.float32).astype(np.float64)
    prod = (av[..., :, :, None] * bv[None, None]).astype(np.float16).astype(np.float64)  # (2, 3, 20, 4)
    want = cv + np.zeros((2, 3, 4))
    for i in range(20):
        want = want + prod[:, :, i]
    np.testing.assert_array_equal(got, want.astype(np.float32).astype(np.float64))
    # promotion: partial sums from 0 every 8 products, added into fp32 (no instruction depth to respect)
    promoted = fpsim.mma.matmul(a[0], b, model=m, promote_every=8)  # type: ignore[arg-type]
    assert promoted.shape == (3, 4)


def test_block_scaled_models_run_their_own_executor() -> None:
    m = block_scaled_model("b200", "f8f6f4", "fp8_e4m3", "fp8_e4m3")
    assert isinstance(m, BlockScaledModel)
    a = np.ones((2, 32))
    b = np.full((32, 3), 0.5)
    np.testing.assert_array_equal(fpsim.mma.matmul(a, b, model=m), np.full((2, 3), 16.0))
    with pytest.raises(ValueError, match="promote_every does not apply"):
        fpsim.mma.matmul(a, b, model=m, promote_every=32)


# -- the import graph of fpsim.mma --------------------------------------------------------------------------

def _mma_imports(every_level: bool) -> dict[str, set[str]]:
    mods = {p.stem for p in MMA.glob("*.py") if p.stem != "__init__"}
    graph: dict[str, set[str]] = {}
    for name in mods:
        tree = ast.parse((MMA / f"{name}.py").read_text(encoding="utf-8"))
        nodes = ast.walk(tree) if every_level else iter(tree.body)
        deps: set[str] = set()
        for node in nodes:
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                deps |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
        graph[name] = deps & mods - {name}
    return graph


def _has_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}

    def visit(v: str, path: list[str]) -> list[str] | None:
        state[v] = 1
        for w in sorted(graph[v]):
            if state.get(w) == 1:
                return path + [v, w]
            if w not in state:
                found = visit(w, path + [v])
                if found:
                    return found
        state[v] = 2
        return None

    for v in sorted(graph):
        if v not in state:
            found = visit(v, [])
            if found:
                return found
    return None


def test_mma_modules_import_without_circles() -> None:
    """Counting function-local imports too: the models never import the presets, the units never the executor."""
    graph = _mma_imports(every_level=True)
    assert _has_cycle(graph) is None, _has_cycle(graph)
    assert "presets" not in graph["model"] and "gemm" not in graph["blockscaled"]
    for unit_module in ("_unit", "_bfma", "_generic", "_exact", "amd", "blockscaled", "model"):
        assert "gemm" not in graph[unit_module], unit_module


def test_as_model_still_resolves_device_names() -> None:
    assert fpsim.mma.as_model("h100:fp16:fp16") == get_model("h100", "fp16", "fp16")
    assert isinstance(fpsim.mma.as_model("mi300x:bf16"), MMAModel)
