"""Reveal the summation tree of a black-box summing function, as FPRev does.

FPRev (Xie, Gao, Wang and Xue, "Revealing Floating-Point Accumulation Orders in Software/Hardware
Implementations", USENIX ATC 2025, arXiv 2411.00442) calls the function on crafted inputs: term ``i`` is
a huge ``M`` (the largest power of two of the dtype), term ``j`` is ``-M``, every other term is 1. A one
added to a partial sum holding ``±M`` is swamped (lost), so ``M`` and ``-M`` cancel to 0 at their lowest
common ancestor and every one below that node vanishes with them, while the ones summed elsewhere are
counted exactly. The output is therefore ``n - size(lca(i, j))``: each call measures how many terms the
node joining ``i`` and ``j`` adds. Those sizes determine the tree.

The basic algorithm measures every pair (``n(n-1)/2`` calls). The one used here (FPRev's refinement)
measures a pivot ``i`` against the other terms of a subtree: sorted by size, the answers are the
ancestors of ``i`` from the bottom up, and the terms with one size are exactly the subtrees that node
joins to ``i``'s side, each then revealed the same way. A running sum costs ``n - 1`` calls, a pairwise
tree about ``n log2(n) / 2``, and no tree more than the basic algorithm. A node joining several subtrees
at once is a multi-term (fused) node: when its adder truncates (matrix units align to the largest
exponent), every cross pair measures the node's size; when it adds exactly and rounds once, the ones of
its other branches survive and a pair measures the sizes of its own two branches, ``t + t'``. Both are
recognised (the exact kind where the branches besides the pivot's are of equal size).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import functools
import itertools
import math
import sys

import numpy as np

from .._fpenv import ieee_mode
from .._interop import host_array
from .._names import parse_name
from ..accumulate import SumTree
from ..accumulate import dot as _dot
from ..accumulate import sum as _sum

__all__ = ["reveal_dot_order", "reveal_order"]

_DTYPES = {"float16": "fp16", "float32": "fp32", "float64": "fp64"}
_BY_TYPE = {np.float16: "fp16", np.float32: "fp32", np.float64: "fp64"}  # (dtype.name is slow to compute)


def _dtype(dtype: Any) -> tuple[np.dtype, str]:
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype must be a NumPy float dtype, got {type(dtype).__name__}: {dtype!r}") from None
    fmt = _BY_TYPE.get(dt.type) if dt.isnative else None
    if fmt is None:
        raise ValueError(f"unsupported dtype {dt.name!r}; valid: {', '.join(_DTYPES)}")
    return dt, fmt


class _Prober:
    """Calls ``fn`` on the crafted inputs and turns each output into the size of lca(i, j).

    The cost of a reveal is the calls, so a call does as little besides ``fn`` as it can: ``fn`` gets
    one probe buffer, not a copy per call (a function found to write into its input is probed again
    with a fresh copy every call), its result is read without the generic converter when it is a plain
    number, and the queries of one pivot go out together, as rows of one 2-D array when ``batched``."""

    def __init__(self, fn: Callable[[np.ndarray], Any], n: int, dt: np.dtype, unit: float = 1.0,
                 batched: bool = False, copy: bool = False) -> None:
        self.fn, self.n, self.dt, self.batched = fn, n, dt, batched
        self.big = dt.type(np.ldexp(1.0, np.finfo(dt).maxexp - 1))  # the largest power of two: 2**127 for float32
        self.unit = float(unit)  # the small terms: 1, or for float16 summed in float32 the smallest subnormal
        self.calls = 0
        self.cache: dict[int, int] = {}
        self._x = np.full(n, unit, dtype=dt)
        self._buf: np.ndarray | None = None
        self._copy = copy  # a copy of the probe for every call (fn writes into its input)
        # rows of one batched call: about 4 MiB of probe inputs (larger batches stream from memory and
        # were no faster here)
        self._rows = max(1, min(4096, (1 << 22) // max(1, n * dt.itemsize)))

    def output(self, x: np.ndarray) -> float:
        self.calls += 1
        out = self.fn(x.copy() if self._copy else x)
        t = type(out)
        if t is float or t is np.float32 or t is np.float64 or t is np.float16:
            return float(out)  # the common case, without the generic converter
        return _number(out, "fn")

    def intact(self) -> bool:
        """Whether ``fn`` left the shared probe buffers as they were (it may write into its input)."""
        ref = self.dt.type(self.unit).tobytes()
        ok: bool = self._x.tobytes() == ref * self.n  # (a byte compare: cheap next to np.all for small n)
        if self._buf is not None:
            ok = ok and self._buf.tobytes() == ref * self._buf.size
        return ok

    def outputs(self, x: np.ndarray) -> np.ndarray:
        """``fn`` of a batch ``x`` of shape (k, n): its k outputs as float64."""
        self.calls += 1
        out = self.fn(x)
        try:
            a = np.asarray(host_array(out, "fn's result", to_host=True))
        except Exception:
            a = np.asarray(out)
        if a.dtype.kind == "V" and a.dtype.names is None:
            a = a.astype(np.float64)
        if a.dtype.kind not in "fiu" or a.shape != (x.shape[0],):
            raise TypeError(f"with batched=True, fn must return the {x.shape[0]} sums of the rows of its "
                            f"({x.shape[0]}, {self.n}) input as a 1-D array, got {type(out).__name__} of "
                            f"shape {getattr(a, 'shape', None)} and dtype {getattr(a, 'dtype', None)}")
        return a.astype(np.float64)

    def sizes(self, i: int, js: list[int]) -> dict[int, int]:
        """The size of lca(i, j) for every j of ``js``."""
        n, cache = self.n, self.cache
        res: dict[int, int] = {}
        todo: list[int] = []
        for j in js:
            c = cache.get(i * n + j if i < j else j * n + i)
            if c is None:
                todo.append(j)
            else:
                res[j] = c
        if not todo:
            return res
        if self.batched:
            buf = self._buf
            if buf is None:  # probe rows reused between calls: reset where changed, never refilled
                buf = self._buf = np.full((self._rows, n), self.unit, dtype=self.dt)
            unit = self.dt.type(self.unit)
            for s in range(0, len(todo), self._rows):
                part = todo[s:s + self._rows]
                k = len(part)
                r = np.arange(k)
                buf[:k, i] = self.big
                buf[r, part] = -self.big
                try:
                    bouts = self.outputs(buf[:k].copy() if self._copy else buf[:k])
                finally:
                    buf[:k, i] = unit
                    buf[r, part] = unit
                cnt = self.n - bouts / self.unit
                ok = np.isfinite(cnt) & (cnt == np.floor(cnt)) & (cnt >= 2) & (cnt <= n)
                if not ok.all():
                    bad = int(np.flatnonzero(~ok)[0])
                    self._count(i, part[bad], float(bouts[bad]))  # raises, naming the input
                res.update(zip(part, cnt.astype(np.int64).tolist()))
        else:
            # the tight loop of a reveal: the pivot's M set once, one -M moved along, the outputs
            # converted together afterwards
            x, fn = self._x, self.fn
            nbig, unit = -self.big, self.dt.type(self.unit)
            got: list[Any] = []
            x[i] = self.big
            try:
                if self._copy:
                    for j in todo:
                        x[j] = nbig
                        got.append(fn(x.copy()))
                        x[j] = unit
                else:
                    for j in todo:
                        x[j] = nbig
                        got.append(fn(x))
                        x[j] = unit
            finally:
                x[i] = unit
                if len(got) < len(todo):
                    x[todo[len(got)]] = unit
            self.calls += len(got)
            if len(got) <= 32:  # few answers: plain Python is cheaper than a handful of array operations
                fast = (float, np.float32, np.float64, np.float16)
                for j, o in zip(todo, got):
                    res[j] = self._count(i, j, float(o) if type(o) in fast else _number(o, "fn"))
                for j in todo:
                    cache[i * n + j if i < j else j * n + i] = res[j]
                return res
            try:
                vals = np.array(got, dtype=np.float64)
                plain = vals.shape == (len(got),)
            except (TypeError, ValueError):
                plain = False
            if not plain:  # tensors, arrays, anything else: one by one through the converter
                vals = np.array([_number(o, "fn") for o in got], dtype=np.float64)
            cnt = n - vals / self.unit
            ok = np.isfinite(cnt) & (cnt == np.floor(cnt)) & (cnt >= 2) & (cnt <= n)
            if not ok.all():
                bad = int(np.flatnonzero(~ok)[0])
                self._count(i, todo[bad], float(vals[bad]))  # raises, naming the input
            res.update(zip(todo, cnt.astype(np.int64).tolist()))
        for j in todo:
            cache[i * n + j if i < j else j * n + i] = res[j]
        return res

    def total(self, value: float) -> float:
        """``fn`` of ``n`` terms all equal to ``value``."""
        x = np.full((1, self.n) if self.batched else self.n, value, dtype=self.dt)
        return float(self.outputs(x)[0]) if self.batched else self.output(x)

    def size(self, i: int, j: int) -> int:
        return self.sizes(i, [j])[j]

    def _count(self, i: int, j: int, out: float) -> int:
        if not math.isfinite(out):
            # a sum of the terms as given never overflows here (M and -M cancel); a sum of |x| or x*x does
            raise ValueError(
                f"fn is not a summation of its terms: with x[{i}] = {float(self.big):g}, x[{j}] = "
                f"{-float(self.big):g} and every other of the n = {self.n} terms {self.unit:g}, it returned "
                f"{out!r}; a sum of the signed terms in any order returns a finite multiple of {self.unit:g} "
                f"(the two huge terms cancel). fn transforms the terms before adding them (np.abs, a square, "
                f"an exp?): reveal the order of the sum it applies to the transformed terms instead, or for a "
                f"sum of squares pass terms='squares'")
        c = self.n - out / self.unit
        if not (c == int(c) and 2 <= c <= self.n):
            raise ValueError(
                f"fn is not a fixed summation tree: with x[{i}] = {float(self.big):g}, x[{j}] = "
                f"{-float(self.big):g} and every other of the n = {self.n} terms {self.unit:g}, it returned "
                f"{out!r}; a sum in any order returns {self.unit:g} times an integer from 0 to {self.n - 2} "
                f"(the small terms not swamped)")
        return int(c)


class _NoOrder(ValueError):
    """No pair swamped any small term: fn does not round its partial sums at the probe's scale."""


# float16 inputs summed in a float32 accumulator (NumPy, torch): 2**15 + 1 is exact in float32, so the ones
# survive; with the smallest float16 subnormal 2**-24 as the small term, 2**15 swamps up to 2**15 of them in
# float32 (half an ulp of 2**15 is 2**-9) while k * 2**-24 stays exact in float16 for k < 2**11.
_FP16_UNIT = 2.0**-24
_FP16_UNIT_MAX_N = 2**11 - 1


def _number(out: Any, what: str) -> float:
    """The one real number a summing function returned (a Python or NumPy number, a 0-d or one-element
    array, a torch scalar); a TypeError naming what came back otherwise."""
    try:  # torch (requires_grad, bfloat16, on a GPU) and JAX results, exactly, through the one converter
        a = np.asarray(host_array(out, f"{what}'s result", to_host=True))
    except Exception:  # not an array of any known kind: refused below, naming what came back
        a = np.asarray(out, dtype=object) if not isinstance(out, np.ndarray) else out
    if a.dtype.kind == "V" and a.dtype.names is None:  # an ml_dtypes float (bfloat16, float8): exact in float64
        try:
            a = a.astype(np.float64)
        except (TypeError, ValueError):
            pass
    if a.dtype.kind not in "fiu" or isinstance(out, (bool, np.bool_)):
        raise TypeError(f"{what} must return one real number (the sum), got {type(out).__name__}: {out!r:.80}")
    if a.size != 1:
        raise TypeError(f"{what} must return one number (the sum), got an array of shape {a.shape}")
    return float(a.reshape(-1)[0])


def _reveal(p: _Prober, method: str) -> SumTree:
    """FPRev's refined algorithm (pivot queries); nested tuples built bottom-up. ``method="basic"``
    first measures every pair (FPRev's basic algorithm), then builds the tree from those counts."""
    n = p.n
    if n == 1:
        return SumTree(0)
    if method == "basic":
        for i in range(n):
            p.sizes(i, list(range(i + 1, n)))
    first = p.sizes(0, list(range(1, n)))
    if n >= 3 and all(c == 2 for c in first.values()):
        raise _NoOrder(
            f"fn has no summation order to reveal: with x[0] = {float(p.big):g} and x[j] = -x[0], the other "
            f"{n - 2} ones all survived for every j (none was swamped by the huge partial sum), so fn adds "
            f"without rounding its partial sums: a correctly rounded sum such as math.fsum, or an exact "
            f"(long) accumulator (replay it with order='exact'), a partial sum in a format much wider than "
            f"{p.dt.name}, or an order by value (largest magnitudes first)")

    def build(s: list[int], known: dict[int, int] | None) -> Any:
        """The subtree whose terms are exactly ``s`` (a sorted list)."""
        if len(s) == 1:
            return s[0]
        piv = s[0]
        c = known if known is not None else p.sizes(piv, s[1:])
        groups: dict[int, list[int]] = {}
        for j in s[1:]:
            groups.setdefault(c[j], []).append(j)
        node: Any = piv
        have = 1
        for size in sorted(groups):
            g = groups[size]
            if have + len(g) == size:  # a node of `size` terms joins g to the pivot's side
                node = (node, *forest(g, size))
                have = size
                continue
            # An exact multi-term node (adds without rounding, so the ones of its other branches survive):
            # the count is have + t for each branch of t terms; equal branches give one group.
            t = size - have
            if t < 1 or len(g) % t:
                raise ValueError(
                    f"fn is not a fixed summation tree: the terms joined to x[{piv}] by a node adding {size} "
                    f"terms are {len(g)} ({_show(g)}) while x[{piv}]'s side already holds {have}; the counts "
                    f"fit no tree of roundings (an order that depends on the values, or an exact multi-term "
                    f"adder with branches of unequal sizes?)")
            node = (node, *exact_branches(g, t))
            have += len(g)
        if have != len(s):
            raise ValueError(f"fn is not a fixed summation tree: x[{piv}] and the terms {_show(s)} were "
                             f"expected to form one subtree of {len(s)} terms, the counts say {have}")
        return node

    def exact_branches(g: list[int], t: int) -> list[Any]:
        """Split ``g`` into the branches of ``t`` terms an exact node joins (across two such branches
        the count is 2t, within one at most t)."""
        if t == 1:
            return list(g)
        out: list[Any] = []
        rest = g
        while rest:
            q = rest[0]
            c = p.sizes(q, rest[1:])
            mine = [q] + [j for j in rest[1:] if c[j] <= t]
            if len(mine) != t or any(c[j] != 2 * t for j in rest[1:] if c[j] > t):
                raise ValueError(f"fn is not a fixed summation tree: x[{q}] does not sit in a branch of {t} "
                                 f"terms of an exact multi-term node, as the other counts implied")
            out.append(build(mine, {j: c[j] for j in mine[1:]}))
            rest = [j for j in rest[1:] if c[j] > t]
        return out

    def forest(g: list[int], size: int) -> list[Any]:
        """The subtrees that one node of ``size`` terms joins, given all their terms ``g``."""
        out: list[Any] = []
        rest = g
        while rest:
            q = rest[0]
            c = p.sizes(q, rest[1:])
            if any(v > size for v in c.values()):
                raise ValueError(f"fn is not a fixed summation tree: x[{q}] measures a node larger than "
                                 f"{size} terms inside one that adds {size}")
            mine = [q] + [j for j in rest[1:] if c[j] < size]
            out.append(build(mine, {j: c[j] for j in mine[1:]}))
            rest = [j for j in rest[1:] if c[j] == size]
        return out

    limit = sys.getrecursionlimit()  # build/forest recurse once per level of the tree (n deep at most)
    sys.setrecursionlimit(max(limit, 4 * n + 200))
    try:
        return SumTree(build(list(range(n)), first))
    finally:
        sys.setrecursionlimit(limit)


def _show(idx: list[int]) -> str:
    return ", ".join(f"x[{i}]" for i in idx[:6]) + (", ..." if len(idx) > 6 else "")


def _random_inputs(n: int, count: int, dt: np.dtype, rng: np.random.Generator) -> np.ndarray:
    """``count`` rows of ``n`` values: normal, uniform positive, mixed magnitudes over 2**±20 (float16:
    2**±8, which stays finite) with mixed signs, and near-cancelling rows (pairs of opposite values plus
    small noise)."""
    k = np.arange(count) % 4
    x = rng.standard_normal((count, n))
    x[k == 1] = rng.random((int(np.sum(k == 1)), n))
    m3 = int(np.sum(k == 2))
    e = 8 if dt.itemsize <= 2 else 20
    x[k == 2] = rng.standard_normal((m3, n)) * np.exp2(rng.integers(-e, e + 1, (m3, n)))
    m4 = int(np.sum(k == 3))
    base = rng.standard_normal((m4, n)) * 1e3
    x[k == 3] = np.where(np.arange(n) % 2, -np.roll(base, 1, axis=1), base) + rng.standard_normal((m4, n))
    with np.errstate(over="ignore"):
        return x.astype(dt)


def _same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.asarray(((a == b) & (np.signbit(a) == np.signbit(b))) | (np.isnan(a) & np.isnan(b)), dtype=bool)


def _groups(tree: SumTree) -> list[Callable[[int, int, int], bool]]:
    """Node groups that may differ in precision or fusion: a vector kernel over a prefix x[0:m] (the
    largest subtree holding exactly a prefix and joining two partial sums, not a term), the remainder
    x[m:n] (a scalar loop), and the nodes joining the two."""
    n = tree.n
    m = max((tree._cnt[n + j] for j, ch in enumerate(tree.nodes)
             if tree._lo[n + j] == 0 and tree._hi[n + j] == tree._cnt[n + j] - 1 < n - 1 and min(ch) >= n),
            default=0)
    if m < 2:
        return [lambda lo, hi, c: True]
    return [lambda lo, hi, c: hi < m, lambda lo, hi, c: lo >= m, lambda lo, hi, c: lo < m <= hi]


def _pairs(lo: int, hi: int, c: int) -> bool:
    """The nodes that add two terms: in a dot, two products each rounded on its own where a vector kernel
    adds the lanes of an accumulator that took one product each (OpenBLAS's AVX-512 sdot folds its zmm
    accumulators after one step when 64 <= n < 128) before the next products are fused into them."""
    return c == 2


def _fit(tree: SumTree, got: np.ndarray, replay: Callable[[SumTree, slice], np.ndarray], fmt: str,
         dot: bool) -> tuple[SumTree | None, int, np.ndarray]:
    """The plain tree if its replay reproduces ``got``; else the simplest annotation of its node groups
    (partial sums in fp64, products not fused) that does; else None, with the plain tree's mismatches."""
    plain = np.asarray(replay(tree, slice(None)), dtype=np.float64)
    bad = ~_same(got, plain)
    if not bad.any():
        return tree, 0, plain
    groups = _groups(tree)
    wider = {"fp16": ["fp32", "fp64"], "fp32": ["fp64"]}.get(fmt, [])  # partial sums wider than the inputs
    choices: list[tuple[str | None, bool | None]] = [(a, f) for a in [None, *wider]
                                                     for f in ([None, False] if dot else [None])]
    per_group = [choices] * len(groups)
    if dot:  # and, inside any of them, the nodes adding two products: fused or not
        groups = [*groups, _pairs]
        per_group = [*per_group, [(None, None), (None, False)]]
    cands = list(itertools.product(*per_group))
    # the simplest first; the two-product nodes only where nothing else fits (they are a rarer kernel shape,
    # and where a plainer annotation also fits they would hide it)
    cands.sort(key=lambda c: (dot and c[-1][1] is not None, sum((a is not None) + (f is not None) for a, f in c)))
    quick = slice(0, min(8, got.size))
    for cand in cands[1:]:
        t = tree
        for pick, (a, f) in zip(groups, cand):
            if a is not None or f is not None:
                t = t.annotate(pick, accumulate=a, fused=f)
        if _same(got[quick], np.asarray(replay(t, quick), dtype=np.float64)).all():
            if _same(got, np.asarray(replay(t, slice(None)), dtype=np.float64)).all():
                return t, 0, plain
    return None, int(bad.sum()), plain



_Batch = tuple[np.ndarray, Callable[[SumTree, slice], np.ndarray]]


def _verify(tree: SumTree, got: np.ndarray, replay: Callable[[SumTree, slice], np.ndarray], dt: np.dtype,
            fmt: str, dot: bool, what: str, fresh: Callable[[], _Batch]) -> SumTree:
    """Check the tree on one batch; an annotation chosen to fit that batch is checked again on a fresh
    batch (``fresh()``: new outputs of ``fn`` and their replay), so that it is not fitted and judged on
    the same inputs."""
    if got.size == 0:
        return tree
    fitted, nbad, plain = _fit(tree, got, replay, fmt, dot)
    if fitted is not None and fitted is not tree:
        got2, replay2 = fresh()
        rep2 = np.asarray(replay2(fitted, slice(None)), dtype=np.float64)
        bad2 = ~_same(got2, rep2)
        if bad2.any():
            k = int(np.flatnonzero(bad2)[0])
            raise ValueError(
                f"{what} is not a fixed summation tree in {dt.name}: the annotated tree "
                f"({fitted.describe()}) fitted {got.size} random inputs but differs on {int(bad2.sum())} of "
                f"{got2.size} fresh ones (first: it gave {got2[k]!r}, the replay {rep2[k]!r}); pass verify=0 "
                f"to get the plain tree anyway")
    if fitted is not None:
        return fitted
    k = int(np.flatnonzero(~_same(got, plain))[0])
    raise ValueError(
        f"{what} is not a fixed summation tree in {dt.name}: the tree its counts reveal ({tree.describe()}) "
        f"replayed differs from it on {nbad} of {got.size} random inputs (first: it gave {got[k]!r}, the "
        f"replay {plain[k]!r}), also with partial sums in fp64 or products unfused in the prefix kernel, "
        f"the remainder, the join or the sums of two products. It may order the terms by value, or truncate "
        f"inside fused multi-term adders; pass verify=0 to get the tree anyway")


def _square_probe(dt: np.dtype) -> tuple[float, float]:
    """``(x_big, x_small)`` for the sum-of-squares probe in ``dt`` (``p`` bits of precision):
    ``B = x_big**2 = 2.25 * 2**2k`` has half an ulp ``h = 2**(2k+1-p)``, and ``a = x_small**2`` lies
    strictly between ``h/2`` and ``h``, so that ``B + a`` rounds to ``B`` (a lone small square is lost)
    while ``B + (a + a)`` rounds up to ``B + 2h`` (two that met first are not). Every square is exact.
    ``B`` is ``1.5 * 2**k`` squared, not a power of two, so that the one ulp it gains also survives a
    square root (the norm's): ``sqrt(B + 2h)`` is 2/3 of an ulp above ``1.5 * 2**k`` and rounds up."""
    p = np.finfo(dt).nmant + 1
    k = 20 if p == 24 else 40
    if p % 2 == 0:
        small = 1.25 * 2.0 ** ((2 * k - p) // 2)        # a = 1.5625 * 2**(2k-p), in (h/2, h)
    else:
        small = 1.75 * 2.0 ** ((2 * k - p - 1) // 2)    # a = 3.0625 * 2**(2k-p-1), in (h/2, h)
    return 1.5 * 2.0**k, small


def _reveal_squares(fn: Callable[[np.ndarray], Any], n: int, dt: np.dtype, fmt: str, verify: int,
                    rng: np.random.Generator | None, batched: bool) -> SumTree:
    """The tree of a sum of squares ``fn(x) = sum(x_k**2)`` (or its square root, a 2-norm).

    Squares are never negative, so FPRev's ``M`` and ``-M`` cannot cancel. Instead a triplet query: with
    ``B`` at ``x[u]`` and the small square ``a`` at ``x[v]`` and ``x[w]`` (zeros elsewhere), ``v`` and ``w``
    survive only when they meet before either joins ``u``'s partial sum (see :func:`_square_probe`).
    With ``u = j`` and ``v = i`` (the pivot), the query says whether ``w`` joins ``i``'s side below ``j``
    does; sorting the other terms of a subtree by that comparison gives the ancestors of the pivot from
    the bottom up and the subtree each joins, as in FPRev. Binary trees only (a multi-term node that adds
    exactly makes a pair of queries contradict each other, which is refused)."""
    if fmt == "fp16":
        raise ValueError("terms='squares' needs float32 or float64 inputs (float16 sums accumulate in "
                         "float32 in NumPy and torch, where the float16 probe is not swamped)")
    xb, xs = _square_probe(dt)
    big = xb * xb

    def call(x: np.ndarray) -> float:
        if batched:
            out = fn(x[None, :])
            a = np.asarray(host_array(out, "fn's result", to_host=True), dtype=np.float64).reshape(-1)
            if a.size != 1:
                raise TypeError(f"with batched=True, fn must return one sum per row, got {a.size} for 1 row")
            return float(a[0])
        return _number(fn(x), "fn")

    x = np.zeros(max(n, 2), dtype=dt)
    x[0], x[1 % n] = 3, 4 if n > 1 else 3
    three_four = call(x[:n])
    want = 25.0 if n > 1 else 9.0
    if three_four == want:
        root = False
    elif three_four == math.sqrt(want):
        root = True  # fn returns the square root of the sum (a 2-norm)
    else:
        raise ValueError(f"fn is not a sum of squares: with x[0] = 3, x[1] = 4 and zeros elsewhere it "
                         f"returned {three_four!r}, not {want:g} (a sum of squares) or {math.sqrt(want):g} "
                         f"(its square root)")
    x = np.zeros(n, dtype=dt)
    x[0] = xb
    base = call(x)
    if base != (xb if root else big):
        raise ValueError(f"fn is not a sum of squares: with x[0] = {xb:g} and zeros elsewhere it returned "
                         f"{base!r}, not {xb if root else big:g}")
    cache: dict[tuple[int, int, int], bool] = {}

    def survives(u: int, v: int, w: int) -> bool:
        """B at u, the small square at v and w: do v and w meet before either joins u?"""
        key = (u, v, w) if v < w else (u, w, v)
        r = cache.get(key)
        if r is None:
            y = np.zeros(n, dtype=dt)
            y[u], y[v], y[w] = xb, xs, xs
            out = call(y)
            if not math.isfinite(out) or out < base:
                raise ValueError(f"fn is not a sum of squares: with x[{u}] = {xb:g}, x[{v}] = x[{w}] = {xs:g} "
                                 f"and zeros elsewhere it returned {out!r}, less than with x[{u}] alone")
            r = cache[key] = out > base
        return r

    def build(s: list[int]) -> Any:
        if len(s) == 1:
            return s[0]
        piv = s[0]

        def cmp(j: int, k: int) -> int:
            below = survives(k, piv, j)   # j joins the pivot's side below k does
            above = survives(j, piv, k)
            if below and above:
                raise ValueError(f"fn is not a binary summation tree of the squares: x[{j}] and x[{k}] each "
                                 f"join x[{piv}] before the other (a multi-term node that adds exactly?)")
            return -1 if below else (1 if above else 0)

        rest = sorted(s[1:], key=functools.cmp_to_key(cmp))
        node: Any = piv
        g = [rest[0]]
        for a, b in zip(rest, rest[1:]):
            if cmp(a, b) == 0:
                g.append(b)
            else:
                node = (node, build(g))
                g = [b]
        return (node, build(g))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 4 * n + 200))
    try:
        tree = SumTree(build(list(range(n))))
    finally:
        sys.setrecursionlimit(limit)
    if verify:
        g = rng if rng is not None else np.random.default_rng(0)

        def batch() -> _Batch:
            xr = _random_inputs(n, verify, dt, g)
            got = np.array([call(row.copy()) for row in xr], dtype=np.float64)

            def replay(t: SumTree, sl: slice) -> np.ndarray:
                r = np.asarray(_dot(xr[sl], xr[sl], fmt, order=t, fused=True), dtype=dt)
                return np.sqrt(r) if root else r
            return got, replay

        got, replay = batch()
        tree = _verify(tree, got, replay, dt, fmt, True, "fn", batch)
    return tree


@ieee_mode
def reveal_order(fn: Callable[[np.ndarray], Any], n: int, dtype: Any = np.float32, *, verify: int = 64,
                 method: str = "fprev", rng: np.random.Generator | None = None, batched: bool = False,
                 terms: str = "values") -> SumTree:
    """Reveal the summation tree of ``fn``, a black box that sums a 1-D array of ``n`` values.

    Implements FPRev (Xie et al., USENIX ATC 2025; see the module docstring): each call puts ``M`` and
    ``-M`` (``M`` the largest power of two of ``dtype``) at two positions and ones elsewhere; the output
    counts the ones not swamped, which is ``n`` minus the size of the node joining the two positions.
    The returned tree replays: ``fpsim.sum(x, fmt, order=tree)`` adds ``x`` in that tree, rounding every
    node in ``fmt``, and ``fpsim.dot(a, b, fmt, order=tree)`` does the same over the products.

    Parameters
    ----------
    fn : callable
        ``fn(x)`` for a 1-D array ``x`` of ``n`` values of ``dtype`` returns their sum (a number, a 0-d
        or one-element array, a torch scalar). The probes share one buffer, changed between calls
        (``fn`` must not keep a reference to ``x``; one that writes into it is detected and probed
        again with a copy per call). Reveal a dot product with ``lambda x: np.dot(x, ones)``,
        or use :func:`reveal_dot_order`.
    n : int
        Number of terms.
    dtype : numpy dtype
        ``float16``, ``float32`` (default) or ``float64``: the dtype of the inputs, and of the partial
        sums the replay checks.
    verify : int
        After revealing, call ``fn`` on this many random inputs (normal, uniform, mixed signs and
        magnitudes over 2**±20, near-cancelling) and check that the replay in ``dtype`` reproduces
        every output bit for bit (default 64; 0 skips the check). Where the plain tree does not, the
        simplest annotation that does is searched for and kept (see :meth:`SumTree.annotate`): partial
        sums in fp64 (for float16 also fp32), or (in a dot) products not fused, over the vector kernel of a
        prefix, the scalar remainder loop, or the nodes joining them; an annotation so found is checked
        again on ``verify`` fresh random inputs. float16 sums that accumulate in float32 (NumPy, torch)
        are revealed with ``2**-24`` as the small terms (``n`` up to 511).
    method : {"fprev", "basic"}
        ``"fprev"`` (default): the refined algorithm, ``n - 1`` calls for a running sum, about
        ``n log2(n) / 2`` for a balanced tree; ``"basic"``: every pair, ``n (n - 1) / 2`` calls.
    rng : numpy.random.Generator, optional
        For the random inputs of ``verify`` (default: seed 0).
    batched : bool
        ``True``: ``fn`` takes a 2-D array of shape ``(k, n)`` and returns the ``k`` sums of its rows as a
        1-D array, each summed as ``fn`` sums that row alone (``lambda X: np.sum(X, axis=1)``): the queries
        of one pivot then go out as the rows of one call (up to 4 MiB of probe rows), which saves the
        per-call overhead. The tree is that of the batched function; whether it sums a row as the 1-D
        function does is the caller's claim (NumPy 2.4's contiguous row sums do).
    terms : {"values", "squares"}
        ``"values"`` (default): ``fn`` sums the terms as given. ``"squares"``: ``fn`` returns the sum of
        the squares of its inputs, or its square root (``np.sum(x * x)``, a 2-norm such as
        ``torch.linalg.vector_norm``), float32 or float64. Squares cannot cancel, so the probe is a
        triplet query instead (a huge square at one term and two small squares elsewhere, zeros
        everywhere else: the small ones survive only when they meet before joining the huge one);
        sorting by it costs about ``n log2(n)`` calls per level, ``O(n log^2 n)`` for a balanced tree,
        binary trees only. The tree replays with ``fpsim.dot(x, x, fmt, order=tree)`` (squares fused
        into the partial sums, or not where the annotation says ``unfused``), then ``np.sqrt`` for a norm.

    Returns
    -------
    SumTree
        The tree; ``tree.describe()`` names it, ``tree.text()`` draws it.

    Raises
    ------
    ValueError
        When ``fn`` is not a fixed summation tree, saying what was seen: every pair cancelling with no
        one swamped (a correctly rounded sum such as ``math.fsum``), counts that fit no tree (an order
        that depends on the values), a tree whose replay differs from ``fn`` on random inputs, or a
        non-finite output on a probe (``fn`` transforms the terms before summing them, as
        ``np.sum(np.abs(x))`` or ``np.sum(x * x)`` do: the probe's ``M`` and ``-M`` then add up to
        overflow instead of cancelling; reveal the inner sum instead).

    Examples
    --------
    >>> import numpy as np, fpsim
    >>> from fpsim.testing import reveal_order
    >>> def running(x):
    ...     s = x[0]
    ...     for v in x[1:]:
    ...         s = s + v
    ...     return s
    >>> tree = reveal_order(running, 6)
    >>> tree.describe()
    'sequential (a running sum)'
    >>> reveal_order(lambda x: x[:4].sum() + x[4:].sum(), 8).root   # NumPy below 8 terms: a running sum
    ((((0, 1), 2), 3), (((4, 5), 6), 7))
    >>> x = np.array([1.0, 2.0**-24, 2.0**-24, 2.0**-24, 2.0**-24, 2.0**-24, 0, 0], dtype=np.float32)
    >>> tree = reveal_order(lambda x: x[:4].sum() + x[4:].sum(), 8)
    >>> float(fpsim.sum(x, "fp32", order=tree)), float(x[:4].sum() + x[4:].sum()), float(fpsim.sum(x, "fp32"))
    (1.0000001192092896, 1.0000001192092896, 1.0)
    >>> reveal_order(lambda X: np.sum(X, axis=1), 20, batched=True) == reveal_order(np.sum, 20)
    True
    >>> sq = reveal_order(lambda x: np.sum(x * x), 6, terms="squares")   # squares rounded, then summed
    >>> sq.root, sq.describe()
    ((((((0, 1), 2), 3), 4), 5), 'sequential (a running sum); unfused: 5 nodes within x[0:6]')
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}: {fn!r}")
    if not isinstance(n, (int, np.integer)) or isinstance(n, (bool, np.bool_)):
        raise TypeError(f"n must be an int, got {type(n).__name__}: {n!r}")
    dt, fmt = _dtype(dtype)
    if not 1 <= n < 2 ** (np.finfo(dt).nmant - 1):
        raise ValueError(f"n must be in 1..{2 ** (np.finfo(dt).nmant - 1) - 1} for {dt.name} (the counts must "
                         f"be exact), got {n!r}")
    verify = _check_verify(verify)
    _check_rng(rng)
    method = parse_name(method, ("fprev", "basic"), "reveal method")
    if not isinstance(batched, (bool, np.bool_)):
        raise TypeError(f"batched must be a bool, got {type(batched).__name__}: {batched!r}")
    terms = parse_name(terms, ("values", "squares"), "terms")
    if terms == "squares":
        return _reveal_squares(fn, int(n), dt, fmt, verify, rng, bool(batched))
    with np.errstate(over="ignore", invalid="ignore"):  # the probe's huge terms are deliberate
        return _reveal_values(fn, int(n), dt, fmt, verify, method, rng, bool(batched))


def _reveal_values(fn: Callable[[np.ndarray], Any], n: int, dt: np.dtype, fmt: str, verify: int, method: str,
                   rng: np.random.Generator | None, batched: bool, copy: bool = False) -> SumTree:
    p = _Prober(fn, int(n), dt, batched=batched, copy=copy)
    ones = p.total(1.0)
    if ones != n:
        raise ValueError(f"fn does not sum its input: fn(ones({n})) returned {ones!r}, not {n}")
    try:
        tree = _reveal(p, method)
    except ValueError as e:
        if not copy and not p.intact():  # fn wrote into the shared probe: every answer is suspect, so again
            return _reveal_values(fn, n, dt, fmt, verify, method, rng, batched, copy=True)
        if not isinstance(e, _NoOrder):
            raise
        if fmt != "fp16" or n > _FP16_UNIT_MAX_N:
            raise
        # float16 summed in float32? Probe again with 2**-24 as the small terms (see _FP16_UNIT)
        p = _Prober(fn, int(n), dt, unit=_FP16_UNIT, batched=batched, copy=copy)
        if p.total(_FP16_UNIT) != n * _FP16_UNIT:
            raise e from None  # fn flushes float16 subnormals: nothing more to try
        try:
            tree = _reveal(p, method)
        except _NoOrder:
            raise ValueError(f"{e}; with float16 inputs the probe was repeated with the small terms 2**-24 "
                             f"(which a float32 accumulator would swamp) and none was swamped either: the "
                             f"partial sums are wider than float32") from None
    if not copy and not p.intact():  # fn wrote into the shared probe: every answer is suspect, so again
        return _reveal_values(fn, n, dt, fmt, verify, method, rng, batched, copy=True)
    if verify:
        g = rng if rng is not None else np.random.default_rng(0)

        def batch() -> _Batch:
            x = _random_inputs(int(n), verify, dt, g)
            got = p.outputs(x) if batched else np.array([p.output(row) for row in x], dtype=np.float64)
            return got, lambda t, sl: np.asarray(_sum(x[sl], fmt, order=t, axis=1))

        got, replay = batch()
        tree = _verify(tree, got, replay, dt, fmt, False, "fn", batch)
    return tree


@ieee_mode
def reveal_dot_order(dot: Callable[[np.ndarray, np.ndarray], Any], n: int, dtype: Any = np.float32, *,
                     fused: bool = True, verify: int = 64, method: str = "fprev",
                     rng: np.random.Generator | None = None) -> SumTree:
    """Reveal the accumulation tree of a dot product ``dot(a, b)`` of two length-``n`` vectors.

    The tree is revealed on ``dot(x, ones)`` (products equal to the terms) with :func:`reveal_order`;
    ``verify`` random pairs ``(a, b)`` then check that ``fpsim.dot(a, b, fmt, order=tree, fused=fused)``
    reproduces ``dot`` bit for bit. ``fused=True`` models FMA accumulation (each product added into
    its partial sum with one rounding), ``fused=False`` products rounded before they are added; nodes
    that differ (a remainder loop without FMA) are found while verifying and annotated on the tree.

    Examples
    --------
    >>> import numpy as np
    >>> from fpsim.testing import reveal_dot_order
    >>> def dot(a, b):                          # products rounded, then a running sum
    ...     s = a[0] * b[0]
    ...     for u, v in zip(a[1:], b[1:]):
    ...         s = s + u * v
    ...     return s
    >>> reveal_dot_order(dot, 5, fused=False).describe()
    'sequential (a running sum)'
    """
    if not callable(dot):
        raise TypeError(f"dot must be callable, got {type(dot).__name__}: {dot!r}")
    if not isinstance(fused, (bool, np.bool_)):
        raise TypeError(f"fused must be a bool, got {fused!r}")
    dt, fmt = _dtype(dtype)
    verify = _check_verify(verify)
    _check_rng(rng)
    ones = np.ones(int(n) if isinstance(n, (int, np.integer)) else 1, dtype=dt)
    tree = reveal_order(lambda x: dot(x, ones), n, dt, verify=0, method=method)
    if verify:
        g = rng if rng is not None else np.random.default_rng(0)

        def batch() -> _Batch:
            a = _random_inputs(int(n), verify, dt, g)
            b = _random_inputs(int(n), verify, dt, g)[::-1].copy()
            got = np.array([_number(dot(u.copy(), v.copy()), "dot") for u, v in zip(a, b)])
            return got, lambda t, sl: np.asarray(_dot(a[sl], b[sl], fmt, order=t, fused=bool(fused)))

        got, replay = batch()
        tree = _verify(tree, got, replay, dt, fmt, True, "dot", batch)
    return tree


def _check_verify(verify: int) -> int:
    if not isinstance(verify, (int, np.integer)) or isinstance(verify, (bool, np.bool_)):
        raise TypeError(f"verify must be an int, got {type(verify).__name__}: {verify!r}")
    if verify < 0:
        raise ValueError(f"verify must be >= 0, got {verify!r}")
    return int(verify)


def _check_rng(rng: object) -> None:
    if rng is not None and not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator or None, got {type(rng).__name__}: {rng!r}")
