"""Revealing summation orders (issue 15 §4): fpsim.testing.reveal_order / reveal_dot_order, and the
SumTree order object that fpsim.sum / fpsim.dot replay.

The oracle for the reveal is the real function: the revealed tree, replayed by fpsim, must reproduce
NumPy's sum, the installed BLAS (dot and a GEMM row), torch.sum and a plain Python loop bit for bit on
thousands of random inputs. The replay itself is checked against NumPy float32/float16 arithmetic and
MPFR (gmpy2) for fused and multi-term nodes.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Callable

import numpy as np
import pytest

import fpsim
from fpsim.accumulate import SumTree
from fpsim.testing import reveal_dot_order, reveal_order
from fpsim.testing.reveal import _random_inputs


def _blas_name() -> str:
    try:
        cfg = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{cfg.get('name', 'blas')}-{cfg.get('version', '?')}"
    except Exception:  # pragma: no cover - NumPy < 1.25 has no dict mode
        return "blas"


BLAS = _blas_name()
FAST_N = [7, 64, 100]
SLOW_N = [1000, 1024]
DTYPES = [np.float32, np.float64]
CASES = 4000  # random inputs per (function, length, dtype)


def _same_bits(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    return ((got == want) & (np.signbit(got) == np.signbit(want))) | (np.isnan(got) & np.isnan(want))


def _fmt(dt: Any) -> str:
    return {np.float32: "fp32", np.float64: "fp64"}[dt]


def _check_sum(fn: Callable[[np.ndarray], Any], n: int, dt: Any, seed: int = 1) -> SumTree:
    tree = reveal_order(fn, n, dt)
    x = _random_inputs(n, CASES, np.dtype(dt), np.random.default_rng(seed))
    got = np.array([float(np.asarray(fn(row))) for row in x])
    want = fpsim.sum(x, _fmt(dt), order=tree, axis=1)
    bad = int((~_same_bits(got, want)).sum())
    assert bad == 0, f"{bad} of {CASES} replays differ ({tree.describe()})"
    return tree


def _check_dot(dot: Callable[[np.ndarray, np.ndarray], Any], n: int, dt: Any, seed: int = 1) -> SumTree:
    tree = reveal_dot_order(dot, n, dt)
    g = np.random.default_rng(seed)
    a = _random_inputs(n, CASES, np.dtype(dt), g)
    b = _random_inputs(n, CASES, np.dtype(dt), g)[::-1].copy()
    got = np.array([float(np.asarray(dot(u, v))) for u, v in zip(a, b)])
    want = fpsim.dot(a, b, _fmt(dt), order=tree)
    bad = int((~_same_bits(got, want)).sum())
    assert bad == 0, f"{bad} of {CASES} replays differ ({tree.describe()})"
    return tree


def _loop(x: np.ndarray) -> Any:
    s = x[0]
    for v in x[1:]:
        s = s + v
    return s


def _gemm_row(a: np.ndarray, b: np.ndarray) -> Any:
    """Element [0, 0] of a real GEMM (4 x n) @ (n x 4): row a against column b."""
    A = np.ones((4, a.size), dtype=a.dtype)
    B = np.ones((b.size, 4), dtype=b.dtype)
    A[0], B[:, 0] = a, b
    return (A @ B)[0, 0]


def _torch_sum(threads: int) -> Callable[[np.ndarray], Any]:
    torch = pytest.importorskip("torch")

    def f(x: np.ndarray) -> Any:
        return torch.from_numpy(x).sum().item()

    f.threads = threads  # type: ignore[attr-defined]
    return f


def _params(ns: list[int], slow: bool, prefix: str = "") -> list[Any]:
    marks = [pytest.mark.slow] if slow else []
    return [pytest.param(n, dt, id=f"{prefix}n{n}-{np.dtype(dt).name}", marks=marks) for n in ns for dt in DTYPES]


ALL = _params(FAST_N, False) + _params(SLOW_N, True)
ALL_BLAS = _params(FAST_N, False, BLAS + "-") + _params(SLOW_N, True, BLAS + "-")


# -- the real functions ---------------------------------------------------------------------------------


@pytest.mark.parametrize("n,dt", ALL)
def test_numpy_sum_replays(n: int, dt: Any) -> None:
    tree = _check_sum(np.sum, n, dt)
    if n >= 8:
        assert tree.describe().startswith("NumPy pairwise"), tree.describe()


@pytest.mark.parametrize("n,dt", ALL_BLAS)
def test_numpy_dot_replays(n: int, dt: Any) -> None:
    """numpy.dot of two vectors goes to the installed BLAS (named in the test id)."""
    _check_dot(np.dot, n, dt)


@pytest.mark.parametrize("n,dt", ALL_BLAS)
def test_blas_gemm_row_replays(n: int, dt: Any) -> None:
    _check_dot(_gemm_row, n, dt)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n,dt", ALL)
def test_torch_sum_replays(n: int, dt: Any, threads: int) -> None:
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        _check_sum(_torch_sum(threads), n, dt)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("n,dt", _params([7, 64], False) + _params([1000], True))
def test_python_loop_replays(n: int, dt: Any) -> None:
    tree = _check_sum(_loop, n, dt)
    assert tree == SumTree.sequential(n)


def test_blas_name_recorded() -> None:
    if tuple(int(v) for v in np.__version__.split(".")[:2]) < (1, 25):
        pytest.skip("NumPy < 1.25: np.show_config has no dict mode to read the BLAS name from")
    assert BLAS and BLAS != "blas", "np.show_config() names no BLAS"


def test_torch_trees_per_thread_count() -> None:
    """Reveal torch.sum at 1 and 2 threads; each replays (asserted above); here: both are revealed and
    described (the trees are equal on this machine for n <= 1024: torch does not split such short sums)."""
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    trees = {}
    try:
        for th in (1, 2):
            torch.set_num_threads(th)
            trees[th] = reveal_order(_torch_sum(th), 256, np.float32)
    finally:
        torch.set_num_threads(before)
    for t in trees.values():
        assert "lanes" in t.describe()


def test_torch_thread_count_changes_the_order_of_long_sums() -> None:
    """At n = 65536 torch hands each of 2 threads one half: x[0:32768] becomes its own subtree. Two FPRev
    probes show it (the full reveals are in docs/reveal-order.md: 1 thread 286,737 calls, 2 threads
    311,313, both replayed on random inputs)."""
    torch = pytest.importorskip("torch")
    n, big = 1 << 16, np.float32(2.0**127)
    x = np.ones(n, np.float32)
    x[0], x[n // 2 - 1] = big, -big

    def lca_size(threads: int) -> int:
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return n - int(torch.from_numpy(x).sum().item())
        finally:
            torch.set_num_threads(before)

    assert lca_size(2) == n // 2       # the first half is one thread's subtree
    assert lca_size(1) > n // 2        # one thread: x[0] and x[32767] meet higher up


# -- what the reveal refuses -------------------------------------------------------------------------------


def test_fsum_has_no_order() -> None:
    with pytest.raises(ValueError, match="no summation order.*math.fsum.*order='exact'"):
        reveal_order(math.fsum, 16, np.float64)
    # ... and order="exact" is indeed what fsum is
    x = _random_inputs(16, 200, np.dtype(np.float64), np.random.default_rng(3))
    got = np.array([math.fsum(r) for r in x])
    assert _same_bits(got, fpsim.sum(x, "fp64", order="exact", axis=1)).all()


def test_value_dependent_order_is_refused() -> None:
    with pytest.raises(ValueError, match="not a fixed summation tree.*differs"):
        reveal_order(lambda x: np.sum(np.sort(x)), 12, np.float32)
    with pytest.raises(ValueError, match="no summation order.*largest magnitudes first"):
        reveal_order(lambda x: _loop(x[np.argsort(-np.abs(x), kind="stable")]), 12, np.float32)


def test_not_a_sum_is_refused() -> None:
    with pytest.raises(ValueError, match="does not sum its input"):
        reveal_order(lambda x: np.float32(0), 8)
    with pytest.raises(ValueError, match="not a fixed summation tree.*returned"):
        reveal_order(lambda x: np.sum(x) if np.all(x == 1) else np.sum(x) * 0.3, 8)
    with pytest.raises(TypeError, match="one number"):
        reveal_order(lambda x: x, 8)


def test_wider_accumulator_is_found() -> None:
    """float32 terms summed in a float64 accumulator, rounded once at the end: the tree is NumPy's,
    its partial sums fp64 (found while verifying)."""
    fn = lambda x: np.float32(np.sum(x.astype(np.float64)))  # noqa: E731
    tree = _check_sum(fn, 100, np.float32)
    assert any(f is not None and f.name == "fp64" for f in tree.formats)
    assert "partial sums in fp64" in tree.describe()


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="unsupported dtype 'int32'; valid: float16, float32, float64"):
        reveal_order(np.sum, 8, np.int32)
    with pytest.raises(TypeError, match="n must be an int"):
        reveal_order(np.sum, True)
    with pytest.raises(TypeError, match="n must be an int"):
        reveal_order(np.sum, 8.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="n must be in 1"):
        reveal_order(np.sum, 0)
    with pytest.raises(TypeError, match="fn must be callable"):
        reveal_order("sum", 8)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="verify must be >= 0"):
        reveal_order(np.sum, 8, verify=-1)
    with pytest.raises(TypeError, match="fused must be a bool"):
        reveal_dot_order(np.dot, 8, fused=1)  # type: ignore[arg-type]


def test_inputs_handed_to_fn_are_fresh() -> None:
    """fn may modify what it is given; the reveal still works (each call gets its own array)."""
    def messy(x: np.ndarray) -> Any:
        s = np.sum(x)
        x[:] = 7
        return s

    assert reveal_order(messy, 20) == reveal_order(np.sum, 20)


def test_worst_case_order() -> None:
    """A running sum from the last term down: the pivot (x[0]) meets everything at the root, so the
    refined algorithm needs n(n-1)/2 calls, like the basic one; and the tree is n deep."""
    calls = [0]

    def rev(x: np.ndarray) -> Any:
        calls[0] += 1
        return np.cumsum(x[::-1])[-1]

    n = 300
    tree = reveal_order(rev, n, verify=16)
    assert tree.describe() == "sequential from the last term down" and tree.height == n - 1
    assert calls[0] == 1 + n * (n - 1) // 2 + 16


def test_small_lengths() -> None:
    assert reveal_order(np.sum, 1).root == 0
    assert reveal_order(np.sum, 2).root == (0, 1)
    assert reveal_order(_loop, 3, np.float16).root == ((0, 1), 2)
    # NumPy sums float16 in a float32 accumulator: 2**15 + 1 is exact there, so the probe is repeated with
    # 2**-24 as the small terms; the tree comes back with partial sums in fp32 (see test_fp16_summed_in_fp32)
    assert reveal_order(np.sum, 3, np.float16).root == ((0, 1), 2)
    # float16 summed in float64: 2**15 swamps not even 2**-24 there; refused, saying so
    with pytest.raises(ValueError, match="no summation order.*wider.*2\\*\\*-24.*wider than float32"):
        reveal_order(lambda x: np.sum(x.astype(np.float64)), 3, np.float16)


def _fp16_cases(n: int, count: int, seed: int) -> np.ndarray:
    """Random float16 rows that stay finite (the reveal's mixed-magnitude rows overflow float16)."""
    g = np.random.default_rng(seed)
    x = g.standard_normal((count, n)) * np.exp2(g.integers(-12, 8, (count, n)))
    return x.astype(np.float16)


@pytest.mark.parametrize("n", [7, 64, 100, 500])
@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_fp16_summed_in_fp32(n: int, lib: str) -> None:
    """NumPy and torch sum float16 in a float32 accumulator: revealed with 2**-24 as the small terms and
    replayed (nodes in fp32, the result rounded to fp16) bit for bit on 2000 fresh random inputs."""
    if lib == "torch":
        torch = pytest.importorskip("torch")

        def fn(x: np.ndarray) -> Any:
            return torch.from_numpy(x).sum().item()
    else:
        fn = np.sum
    tree = reveal_order(fn, n, np.float16)
    assert tree.annotated and "fp32" in tree.describe()
    x = _fp16_cases(n, 2000, 3)
    got = np.array([float(np.asarray(fn(row))) for row in x])
    want = fpsim.sum(x, "fp16", order=tree, axis=1)
    bad = int((~_same_bits(got, want)).sum())
    assert bad == 0, f"{bad} of 2000 replays differ ({tree.describe()})"
    # the plain tree (every node rounded to fp16) is not the same function
    plain = fpsim.sum(x, "fp16", order=SumTree(tree.root), axis=1)
    assert n < 8 or (~_same_bits(got, plain)).any()


def test_fn_must_return_a_number() -> None:
    for ret, kind in [(None, "NoneType"), ("3.0", "str"), (True, "bool"), ([1.0, 2.0], "shape")]:
        with pytest.raises(TypeError, match=kind):
            reveal_order(lambda x, r=ret: r, 4)
    with pytest.raises(TypeError, match="dot must return one real number.*NoneType"):
        reveal_dot_order(lambda a, b: np.dot(a, b) if (b == 1).all() else None, 4)  # None on verify


def test_annotation_is_checked_on_fresh_inputs() -> None:
    """An annotation picked to fit the first batch must also fit a fresh one: a function that behaves as an
    fp64-accumulated running sum on the first 64 calls after the reveal and as an fp32 one afterwards fits
    the first batch only."""
    n = 16
    state = {"calls": 0}

    def fn(x: np.ndarray) -> Any:
        state["calls"] += 1
        if state["calls"] <= n + 64:  # the reveal (n calls for a running sum) and the first batch
            return np.float32(math.fsum([]) + sum(x.astype(np.float64).tolist()))
        return _loop(x)

    with pytest.raises(ValueError, match="fitted 64 random inputs but differs on .* of 64 fresh ones"):
        reveal_order(fn, n)


# -- FPRev's structure: round trips through fpsim's own replay, multi-term nodes ------------------------


def _random_tree(n: int, rng: np.random.Generator) -> Any:
    nodes: list[Any] = list(rng.permutation(n).tolist())
    while len(nodes) > 1:
        i, j = sorted(rng.choice(len(nodes), 2, replace=False).tolist())
        b = nodes.pop(j)
        a = nodes.pop(i)
        nodes.append((a, b))
    return nodes[0]


@pytest.mark.parametrize("seed", range(5))
def test_round_trip_random_trees(seed: int) -> None:
    rng = np.random.default_rng(seed)
    tree = SumTree(_random_tree(40, rng))
    calls = [0]

    def fn(x: np.ndarray) -> Any:
        calls[0] += 1
        return fpsim.sum(x, "fp32", order=tree)

    assert reveal_order(fn, 40, verify=8) == tree
    refined, calls[0] = calls[0], 0
    assert reveal_order(fn, 40, verify=8, method="BASIC") == tree
    assert calls[0] == 1 + 40 * 39 // 2 + 8 > refined


def test_method_names() -> None:
    with pytest.raises(ValueError, match="unknown reveal method 'fast'; valid: fprev, basic"):
        reveal_order(np.sum, 8, method="fast")


@pytest.mark.parametrize("root", [
    (((0, 1, 2, 3), 4, 5, 6), 7, 8, 9),       # a fused 4-term adder chained on its accumulator
    (((0, 1, 2), (3, 4)), 5),
    ((0, 1, 2), (3, 4, 5)),
    (((0, 1), 2, 3), ((4, 5), 6, 7)),
], ids=str)
def test_round_trip_exact_multi_term_nodes(root: Any) -> None:
    """Exact multi-term nodes (children added exactly, rounded once: fpsim's replay of a k-way node)."""
    tree = SumTree(root)
    assert reveal_order(lambda x: fpsim.sum(x, "fp32", order=tree), tree.n, verify=32) == tree


def test_exact_nodes_with_unequal_branches_are_refused() -> None:
    tree = SumTree(((0, 1), (2, 3), (4, 5), 6, 7))
    with pytest.raises(ValueError, match="branches of unequal sizes"):
        reveal_order(lambda x: fpsim.sum(x, "fp32", order=tree), tree.n)


def _tensor_core_add(vals: np.ndarray) -> np.float32:
    """A fused multi-term adder as in matrix units: terms aligned to the largest exponent, truncated to
    24 + 3 bits there, summed exactly, rounded once to fp32. A 1 beside 2**127 is shifted out."""
    v = vals.astype(np.float64)
    nz = v[v != 0]
    if nz.size == 0:
        return np.float32(0)
    e = math.frexp(float(np.max(np.abs(nz))))[1]
    q = math.ldexp(1.0, e - 27)
    return np.float32(float(np.sum(np.trunc(v / q) * q)))


def test_multi_term_nodes() -> None:
    def fused4(x: np.ndarray) -> Any:
        s = np.float32(0)
        for k in range(0, x.size, 4):
            s = _tensor_core_add(np.concatenate([[s], x[k:k + 4]]).astype(np.float32)) if k else \
                _tensor_core_add(x[:4])
        return s

    tree = reveal_order(fused4, 12, verify=0)
    assert tree.max_arity == 5 and tree.root == (((0, 1, 2, 3), 4, 5, 6, 7), 8, 9, 10, 11)
    assert "(5-way)" in tree.text() and "(4-way)" in tree.text()


# -- the order object and its replay ---------------------------------------------------------------------


def test_sumtree_validation() -> None:
    with pytest.raises(ValueError, match="repeated \\[1\\]"):
        SumTree((0, (1, 1)))
    with pytest.raises(ValueError, match="missing \\[1\\]"):
        SumTree((0, 2))
    with pytest.raises(ValueError, match="at least two children"):
        SumTree((0, (1,)))
    with pytest.raises(TypeError, match="leaf must be an int"):
        SumTree((0, True))
    with pytest.raises(TypeError, match="nested tuples of int"):
        SumTree((0, 1.0))
    t = SumTree([[3, 1], [0, 2]])
    assert t.root == ((0, 2), (1, 3)) and t.n == 4 and t.height == 2 and t.max_arity == 2
    assert t == SumTree(((2, 0), (3, 1))) and hash(t) == hash(SumTree(((2, 0), (3, 1))))
    assert t != SumTree.pairwise(4) and SumTree(t) == t


def test_named_orders_match_fpsim_and_numpy() -> None:
    x = _random_inputs(37, 50, np.dtype(np.float32), np.random.default_rng(0))
    for name in ("sequential", "pairwise"):
        tree = getattr(SumTree, name)(37)
        assert _same_bits(fpsim.sum(x, "fp32", order=tree, axis=1), fpsim.sum(x, "fp32", order=name, axis=1)).all()
    # the oracle for a running sum: NumPy float32 arithmetic
    want = np.array([_loop(r) for r in x])
    assert _same_bits(fpsim.sum(x, "fp32", order=SumTree.sequential(37), axis=1), want).all()
    assert SumTree.lanes(8, 2).root == ((((0, 2), 4), 6), (((1, 3), 5), 7))
    assert SumTree.lanes(12, 4, combine="sequential").describe().startswith("4 strided lanes")


def test_replay_in_fp16_against_numpy_half() -> None:
    """Any format: each node rounded in fp16 (NumPy's float16 add is correctly rounded: via float32,
    24 >= 2*11 + 2 bits, double rounding is innocuous)."""
    rng = np.random.default_rng(5)
    tree = SumTree(_random_tree(25, rng))
    x = (rng.standard_normal((300, 25)) * 8).astype(np.float16)

    def walk(node: Any, row: np.ndarray) -> np.float16:
        if not isinstance(node, tuple):
            return row[node]
        a, b = node
        return np.float16(walk(a, row) + walk(b, row))

    want = np.array([walk(tree.root, r) for r in x])
    assert _same_bits(fpsim.sum(x, "fp16", order=tree, axis=1), want).all()


def test_fused_dot_and_multi_term_against_mpfr() -> None:
    gmpy2 = pytest.importorskip("gmpy2")
    rng = np.random.default_rng(9)
    a = rng.standard_normal((200, 6)).astype(np.float32)
    b = rng.standard_normal((200, 6)).astype(np.float32)
    r32 = gmpy2.ieee(32)
    wide = gmpy2.context(precision=400)
    tree = SumTree((((0, 1), 2), (3, 4, 5)))
    want = []
    for u, v in zip(a.tolist(), b.tolist()):
        m = [gmpy2.mpfr(w, 53) for w in u], [gmpy2.mpfr(w, 53) for w in v]
        s = r32.mul(m[0][0], m[1][0])              # x0's product, rounded
        s = r32.fma(m[0][1], m[1][1], s)           # (0, 1): x1 fused into it
        s = r32.fma(m[0][2], m[1][2], s)           # (., 2)
        e = wide.add(wide.add(wide.mul(m[0][3], m[1][3]), wide.mul(m[0][4], m[1][4])), wide.mul(m[0][5], m[1][5]))
        t = r32.add(e, 0)                          # (3, 4, 5): exact, rounded once
        want.append(float(r32.add(s, t)))
    got = fpsim.dot(a, b, "fp32", order=tree)
    assert _same_bits(got, np.array(want)).all()


def test_replay_errors() -> None:
    x = np.ones(5, np.float32)
    with pytest.raises(ValueError, match="summation tree has 4 terms but the reduced axis has length 5"):
        fpsim.sum(x, "fp32", order=SumTree.sequential(4))
    with pytest.raises(ValueError, match="block applies only"):
        fpsim.sum(x, "fp32", order=SumTree.sequential(5), block=2)
    with pytest.raises(ValueError, match="unknown summation order 'tree'"):
        fpsim.sum(x, "fp32", order="tree")
    with pytest.raises(ValueError, match="summation tree has 4 terms"):
        fpsim.dot(x, x, "fp32", order=SumTree.sequential(4))
    # an empty axis is checked too (it used to return 0.0)
    with pytest.raises(ValueError, match="summation tree has 1 terms but the reduced axis has length 0"):
        fpsim.sum(np.ones(0), "fp32", order=SumTree.sequential(1))
    with pytest.raises(ValueError, match="summation tree has 1 terms but the reduced axis has length 0"):
        fpsim.dot(np.ones(0), np.ones(0), "fp32", order=SumTree.sequential(1))
    # nested tuples are a tree; anything else that is not a name says what is accepted
    assert float(fpsim.sum(x[:3], "fp32", order=((0, 1), 2))) == 3.0
    assert float(fpsim.dot(x[:3], x[:3], "fp32", order=(2, (0, 1)))) == 3.0
    with pytest.raises(TypeError, match="a name .*sequential.*SumTree or nested tuples.*got int"):
        fpsim.sum(x, "fp32", order=3)
    with pytest.raises(ValueError, match="must hold each index 0..2 once"):
        fpsim.sum(x[:3], "fp32", order=((0, 1), 5))


def test_deep_trees_need_no_recursion() -> None:
    t = SumTree.sequential(5000)
    assert t.height == 4999 and t.describe() == "sequential (a running sum)"
    assert float(fpsim.sum(np.ones(5000), "fp32", order=t)) == 5000.0
    assert len(t.text().splitlines()) == 9999
    assert SumTree(t.root) == t


def test_text_and_describe() -> None:
    t = SumTree.lanes(16, 4)
    assert t.describe() == "4 strided lanes (running sums of x[k::4]), lane sums combined pairwise"
    lines = t.text(max_depth=1).splitlines()
    assert lines == ["+ x[0:16]", "|-- + 8 terms from x[0] to x[13]: height 4",
                     "`-- + 8 terms from x[2] to x[15]: height 4"], lines
    np_tree = reveal_order(np.sum, 300)
    assert np_tree.describe().startswith("NumPy pairwise: halves")
    ann = SumTree.sequential(3).annotate([4], accumulate="fp64", fused=False)
    assert ann.text().splitlines()[0] == "+ x[0:3] [fp64, unfused]"
    assert ann != SumTree.sequential(3) and ann.annotated
    with pytest.raises(ValueError, match="node number"):
        SumTree.sequential(3).annotate([1])


# -- the exact sum behind order="exact" and multi-term nodes: vectorised, checked against MPFR -------------


def _exact_cases(rng: np.random.Generator) -> list[np.ndarray]:
    k, m = 12, 40
    wide = rng.standard_normal((k, m)) * np.exp2(rng.integers(-1070, 1000, (k, m)))
    base = rng.standard_normal((k, m)) * np.exp2(rng.integers(-40, 40, (k, m)))
    cancel = np.concatenate([base, -base[::-1] + rng.standard_normal((k, m)) * 2.0**-70])
    tiny = rng.integers(-7, 8, (k, m)) * np.exp2(rng.integers(-1074, -1050, (k, m)))
    huge = rng.standard_normal((k, m))
    huge[0], huge[-1] = 1e308, -1e308
    ties = np.ones((3, m)) * np.array([1.0, 2.0**-53, 2.0**-106])[:, None] * rng.choice([-1.0, 1.0], (3, m))
    return [wide, cancel, tiny, huge, ties, rng.standard_normal((1, m))]


@pytest.mark.parametrize("fmt, prec, emin, emax", [("fp64", 53, -1073, 1024), ("fp32", 24, -148, 128),
                                                   ("bf16", 8, -132, 128)])
def test_exact_sum_against_mpfr(fmt: str, prec: int, emin: int, emax: int) -> None:
    """fpsim.sum(order="exact") and a fused multi-term node against MPFR: the exact sum (an mpq) rounded
    once to the format, with subnormals (gmpy2's subnormalize)."""
    gmpy2 = pytest.importorskip("gmpy2")
    ctx = gmpy2.context(precision=prec, emin=emin, emax=emax, subnormalize=True,
                        round=gmpy2.RoundToNearest)
    rng = np.random.default_rng(11)
    total = 0
    for x in _exact_cases(rng):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # out-of-range values: overflow warnings, replaced below
            x = np.asarray(fpsim.round(x, fmt), dtype=np.float64)  # terms in the format (inputs of a sum)
        x = np.where(np.isfinite(x), x, 0.0)
        want = []
        for col in x.T.tolist():
            q = builtins_sum(gmpy2.mpq(v) for v in col)
            w = ctx.plus(gmpy2.mpfr(q, 2300))  # the dyadic sum exactly (2300 bits span it), then one rounding
            want.append(float(w))
        want_a = np.array(want)
        got = np.asarray(fpsim.sum(x, fmt, order="exact", axis=0), dtype=np.float64)
        fin = np.isfinite(want_a)
        bad = ~_same_bits(got[fin], want_a[fin]) & ~((got[fin] == 0) & (want_a[fin] == 0))
        assert not bad.any(), (fmt, got[fin][bad][:3], want_a[fin][bad][:3])
        # the same columns as one fused node of a tree (all terms added exactly, rounded once)
        node = SumTree(tuple(range(x.shape[0]))) if x.shape[0] > 1 else SumTree(0)
        got2 = np.asarray(fpsim.sum(x, fmt, order=node, axis=0), dtype=np.float64)
        assert not (~_same_bits(got2[fin], want_a[fin]) & ~((got2[fin] == 0) & (want_a[fin] == 0))).any()
        total += int(fin.sum())
    assert total >= 200


def builtins_sum(it: Any) -> Any:
    out: Any = 0
    for v in it:
        out = out + v
    return out


# --- issue 29 §2: batched probes, sums of squares, fma-fused dot products -----------------------------

@pytest.mark.parametrize("n", [1, 2, 7, 20, 100, 300, 1000])
def test_batched_matches_one_by_one(n: int) -> None:
    """The batched probe (pivot queries as the rows of one call) reveals the same tree as one call per
    query, for NumPy's row sums (which sum each contiguous row as the 1-D sum does, NumPy 2.x)."""
    calls = [0]

    def rows(x: np.ndarray) -> np.ndarray:
        calls[0] += 1
        return np.sum(x, axis=1)

    tree = reveal_order(rows, n, verify=32, batched=True)
    assert tree == reveal_order(np.sum, n, verify=0)
    assert calls[0] <= n + 2 + 1  # one call per pivot at most, the all-ones check, the verify batch


def test_batched_refuses_a_wrong_shape() -> None:
    with pytest.raises(TypeError, match="batched=True"):
        reveal_order(lambda X: float(np.sum(X)), 20, batched=True)
    with pytest.raises(TypeError, match="batched must be a bool"):
        reveal_order(np.sum, 20, batched=1)  # type: ignore[arg-type]


def _python_sq_loop(x: np.ndarray) -> Any:
    s = x[0] * x[0]
    for v in x[1:]:
        s = s + v * v  # the square rounded to the dtype, then added: unfused
    return s


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("n", [1, 2, 7, 20, 100, 300])
def test_sum_of_squares_numpy(n: int, dt: Any) -> None:
    """np.sum(x * x) is NumPy's pairwise sum (8 strided lanes in blocks of 128, halves above) of the
    rounded squares: the triplet probe must find exactly the tree the signed probe finds for np.sum,
    unfused, and the replay must match on 2,000 fresh random inputs."""
    tree = reveal_order(lambda x: np.sum(x * x), n, dt, terms="squares")
    assert tree.root == reveal_order(np.sum, n, dt, verify=0).root
    x = _random_inputs(n, 2000, np.dtype(dt), np.random.default_rng(5))
    got = np.array([np.sum(r * r) for r in x], dtype=np.float64)
    want = fpsim.dot(x, x, _fmt(dt), order=tree, fused=True)
    assert int((~_same_bits(got, want)).sum()) == 0


@pytest.mark.parametrize("n", [1, 5, 40])
def test_sum_of_squares_loop_and_norm(n: int) -> None:
    """A Python loop of rounded squares is a running sum; its square root (a hand-written 2-norm) is
    revealed as the same tree."""
    t = reveal_order(_python_sq_loop, n, np.float32, terms="squares")
    assert t.root == SumTree.sequential(n).root
    t2 = reveal_order(lambda x: np.sqrt(_python_sq_loop(x)), n, np.float32, terms="squares")
    assert t2.root == t.root


def test_sum_of_squares_refusals() -> None:
    with pytest.raises(ValueError, match="not a sum of squares"):
        reveal_order(np.sum, 10, terms="squares")          # a plain sum: x[0] alone gives x[0], not x[0]**2
    with pytest.raises(ValueError, match="float32 or float64"):
        reveal_order(lambda x: np.sum(x * x), 10, np.float16, terms="squares")
    with pytest.raises(ValueError, match="terms"):
        reveal_order(np.sum, 10, terms="cubes")


@pytest.mark.parametrize("n", [8, 64, 67, 1000])
def test_torch_vector_norm(n: int) -> None:
    """torch.linalg.vector_norm on CPU (the clip_grad_norm_ kernel, fitted by hand in fpsim.amp.clip):
    8 strided lanes of unfused squares over x[0:n - n % 8], the lane sums added one by one, then the
    tail; revealed with no fitting, and replayed bit for bit on 2,000 random vectors."""
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)

    def norm(x: np.ndarray) -> Any:
        return torch.linalg.vector_norm(torch.from_numpy(x)).item()

    tree = reveal_order(norm, n, np.float32, terms="squares")
    m = n - n % 8
    lanes = SumTree.lanes(m, 8, combine="sequential").root
    want: Any = lanes
    for k in range(m, n):
        want = (want, k)
    assert tree.root == want
    x = _random_inputs(n, 2000, np.dtype(np.float32), np.random.default_rng(6))
    got = np.array([norm(r) for r in x], dtype=np.float64)
    rep = np.sqrt(np.asarray(fpsim.dot(x, x, "fp32", order=tree, fused=True), dtype=np.float32))
    assert int((~_same_bits(got, rep)).sum()) == 0
    # and the hand-fitted replay in fpsim.amp agrees with the revealed one
    from fpsim.amp.clip import _norm2
    assert all(float(_norm2(r)) == g for r, g in zip(x[:200], got[:200]))


def _mpfr_fma_chain(order: str) -> Callable[[np.ndarray, np.ndarray], float]:
    """A hand-built float32 dot: a chain of fused multiply-adds, each rounded once by MPFR (24 bits, the
    float32 exponent range), independent of fpsim. order "forward": s = fma(a[k], b[k], s) from k = 0;
    "pairs": two fma chains over the even and odd terms, added at the end; "fold": four lanes, lane j first
    the sum of the products j and j + 4 each rounded on its own (as OpenBLAS's AVX-512 sdot folds its 16-lane
    accumulators after one step), then fma chains over j + 8, j + 12, ..., the lanes added in turn."""
    gmpy2 = pytest.importorskip("gmpy2")

    def ctx() -> Any:
        return gmpy2.context(precision=24, emin=-148, emax=128, subnormalize=True)

    def chain(a: np.ndarray, b: np.ndarray, idx: range) -> Any:
        with ctx():
            s = gmpy2.mpfr(0)
            for k in idx:
                s = gmpy2.fma(gmpy2.mpfr(float(a[k])), gmpy2.mpfr(float(b[k])), s)
            return s

    def dot(a: np.ndarray, b: np.ndarray) -> float:
        n = a.size
        if order == "forward":
            return float(chain(a, b, range(n)))
        with ctx():
            if order == "fold":
                lanes = []
                for j in range(4):
                    s = gmpy2.mpfr(float(a[j])) * float(b[j]) + gmpy2.mpfr(float(a[j + 4])) * float(b[j + 4])
                    for k in range(j + 8, n, 4):
                        s = gmpy2.fma(gmpy2.mpfr(float(a[k])), gmpy2.mpfr(float(b[k])), s)
                    lanes.append(s)
                return float(((lanes[0] + lanes[1]) + lanes[2]) + lanes[3])
            return float(chain(a, b, range(0, n, 2)) + chain(a, b, range(1, n, 2)))

    return dot


@pytest.mark.parametrize("n", [8, 12, 24, 30])
def test_folded_lanes_of_two_rounded_products(n: int) -> None:
    """Lanes that start as the sum of two products each rounded on its own, then fuse the next products
    (MPFR, independent of fpsim): the reveal annotates those four nodes as unfused (with n = 8 nothing is
    fused: every node unfused) and the tree replays 2,000 random pairs bit for bit (the plain fused tree
    does not: the fold's products would be fused)."""
    fold = _mpfr_fma_chain("fold")
    tree = reveal_dot_order(fold, n, np.float32, fused=True)
    want = "unfused: 7 nodes within x[0:8]" if n == 8 else "unfused: 4 nodes within x[0:8]"
    assert tree.describe().endswith(want), tree.describe()
    g = np.random.default_rng(8)
    a = _random_inputs(n, 2000, np.dtype(np.float32), g)
    b = _random_inputs(n, 2000, np.dtype(np.float32), g)[::-1].copy()
    got = np.array([fold(u, v) for u, v in zip(a, b)])
    assert int((~_same_bits(got, fpsim.dot(a, b, "fp32", order=tree, fused=True))).sum()) == 0
    plain = SumTree(tree.root)
    assert int((~_same_bits(got, fpsim.dot(a, b, "fp32", order=plain, fused=True))).sum()) > 0


@pytest.mark.parametrize("n", [3, 16, 33])
def test_fma_chain_dot(n: int) -> None:
    """Dot products whose leaves are fused: a hand-built FMA chain (MPFR) reveals as a running sum and
    replays with fused=True on 2,000 random pairs; two interleaved chains as two strided lanes. With
    fused=False the verification finds the nodes are fused (no annotation fits)."""
    fwd = _mpfr_fma_chain("forward")
    tree = reveal_dot_order(fwd, n, np.float32, fused=True)
    assert tree.root == SumTree.sequential(n).root and "unfused" not in tree.describe()
    g = np.random.default_rng(7)
    a = _random_inputs(n, 2000, np.dtype(np.float32), g)
    b = _random_inputs(n, 2000, np.dtype(np.float32), g)[::-1].copy()
    got = np.array([fwd(u, v) for u, v in zip(a, b)])
    rep = fpsim.dot(a, b, "fp32", order=tree, fused=True)
    assert int((~_same_bits(got, rep)).sum()) == 0
    if n < 4:
        return  # a lane of one term adds a rounded product: not a fused node, so no 2-lane tree here
    two = reveal_dot_order(_mpfr_fma_chain("pairs"), n, np.float32, fused=True)
    assert two.root == SumTree.lanes(n, 2, combine="sequential").root
