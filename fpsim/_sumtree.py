"""An explicit summation tree: the order object that :func:`fpsim.sum` and :func:`fpsim.dot` replay.

A :class:`SumTree` says which partial sums a summing function forms: a leaf is the index of a term, a
node is a tuple of two or more children. ``((0, 1), (2, 3))`` is the pairwise sum of four terms,
``(((0, 1), 2), 3)`` the running sum. :func:`fpsim.testing.reveal_order` reveals the tree of a black-box
function (NumPy's ``sum``, a BLAS ``dot``, ``torch.sum``); ``fpsim.sum(x, fmt, order=tree)`` replays it,
every node's result rounded in the accumulator format. A node with more than two children is a fused
multi-term addition: its children are added exactly and rounded once.

This module holds the structure only (validation, schedule, rendering); the arithmetic that replays a
tree lives in :mod:`fpsim.accumulate`. Layer 2; imports only layer 0 (formats, the FP environment guard).
"""

from __future__ import annotations

from typing import Any, Union

import numpy as np

from ._fpenv import ieee_mode
from .formats import Format, FormatLike, as_format

__all__ = ["SumTree"]

Node = Union[int, tuple["Node", ...]]


def _from_nested(root: Any) -> tuple[int, tuple[tuple[int, ...], ...]]:
    """Validate nested tuples (iteratively: a running sum of 10^5 terms is 10^5 deep) and number the
    nodes canonically: children sorted by their smallest leaf, internal nodes ``n, n+1, ...`` in post-order."""
    # pass 1: temporary ids for the internal nodes, their children and smallest leaves
    kids: list[list[int]] = []  # temp internal id t -> children; leaf i is encoded as -1 - i
    low: list[int] = []
    leaves: list[int] = []
    # explicit post-order over the input
    stack2: list[tuple[Any, bool]] = [(root, False)]
    out: list[int] = []  # value stack: encoded child references
    while stack2:
        node, done = stack2.pop()
        if isinstance(node, (bool, np.bool_)):
            raise TypeError(f"a summation tree leaf must be an int (a term's index), got {node!r}")
        if isinstance(node, (int, np.integer)):
            i = int(node)
            leaves.append(i)
            out.append(-1 - i)
            continue
        if not isinstance(node, (tuple, list)):
            raise TypeError(f"a summation tree is nested tuples of int leaf indices, got "
                            f"{type(node).__name__}: {node!r}")
        if not done:
            if len(node) < 2:
                raise ValueError(f"a summation tree node needs at least two children, got {tuple(node)!r}")
            stack2.append((node, True))
            stack2.extend((c, False) for c in reversed(node))
            continue
        k = len(node)
        ch = out[len(out) - k:]
        del out[len(out) - k:]
        lo = min((-1 - c) if c < 0 else low[c] for c in ch)
        kids.append(ch)
        low.append(lo)
        out.append(len(kids) - 1)
    n = len(leaves)
    if sorted(leaves) != list(range(n)):
        cnt: dict[int, int] = {}
        for i in leaves:
            cnt[i] = cnt.get(i, 0) + 1
        dup = sorted(i for i, c in cnt.items() if c > 1)[:5]
        missing = sorted(set(range(n)) - set(leaves))[:5]
        bad = sorted(i for i in cnt if not 0 <= i < n)[:5]
        raise ValueError(f"a summation tree over n={n} terms must hold each index 0..{n - 1} once; "
                         f"repeated {dup}, missing {missing}, out of range {bad}")
    if not kids:
        return n, ()
    # pass 2: canonical post-order from the root (the last temp node), children sorted by smallest leaf
    def key(c: int) -> int:
        return (-1 - c) if c < 0 else low[c]

    final: list[tuple[int, ...]] = []
    fid: dict[int, int] = {}
    st: list[tuple[int, bool]] = [(len(kids) - 1, False)]
    while st:
        t, done = st.pop()
        if not done:
            st.append((t, True))
            st.extend((c, False) for c in sorted(kids[t], key=key, reverse=True) if c >= 0)
            continue
        final.append(tuple((-1 - c) if c < 0 else fid[c] for c in sorted(kids[t], key=key)))
        fid[t] = n + len(final) - 1
    return n, tuple(final)


@ieee_mode
class SumTree:
    """The order of a floating-point sum as a tree over the term indices ``0 .. n-1``.

    Parameters
    ----------
    root : int or nested tuple of ints
        A leaf (the index of a term) or a tuple of two or more children. Every index ``0 .. n-1``
        appears exactly once. Children are kept sorted by their smallest index (addition commutes);
        in :func:`fpsim.dot` with ``fused=True`` a node with a leaf child adds that product with a fused
        multiply-add into its other child (of two leaves, the higher index is fused into the other's
        rounded product), as an FMA accumulator lane does.

    Attributes
    ----------
    n : int
        Number of terms.
    height : int
        Additions on the longest path from a term to the result (0 for a single term).
    max_arity : int
        The most children of any node (2 for a binary tree; 0 for a single term).
    nodes : tuple of tuples
        The flat form: node ``n + j`` adds the values ``nodes[j]`` (numbers below ``n`` are terms),
        numbered in post-order; the last node is the result.
    formats, fused : tuple
        Per node (as ``nodes``): the format its partial sum is rounded in (``None``: the accumulator
        format of the call) and whether, in a dot product, it adds a product by a fused multiply-add
        (``None``: the call's ``fused``). Set them with :meth:`annotate`, e.g. for a BLAS kernel whose
        scalar remainder loop keeps a double accumulator.

    Examples
    --------
    >>> import numpy as np, fpsim
    >>> from fpsim.accumulate import SumTree
    >>> t = SumTree(((0, 1), (2, 3)))
    >>> t.n, t.height, t.describe()
    (4, 2, 'pairwise (adjacent pairs, level by level)')
    >>> x = np.array([1.0, 2.0**-24, 2.0**-24, 2.0**-24], dtype=np.float32)
    >>> float(fpsim.sum(x, "fp32", order=t)), float(fpsim.sum(x, "fp32", order="sequential"))
    (1.0000001192092896, 1.0)
    >>> print(t.text())
    + x[0:4]
    |-- + x[0:2]
    |   |-- x[0]
    |   `-- x[1]
    `-- + x[2:4]
        |-- x[2]
        `-- x[3]
    """

    __slots__ = ("n", "nodes", "height", "max_arity", "formats", "fused", "_sched", "_lo", "_hi", "_cnt", "_level")

    def __init__(self, root: Any) -> None:
        if isinstance(root, SumTree):
            n, nodes = root.n, root.nodes
        else:
            n, nodes = _from_nested(root)
        self._init(n, nodes)

    def _init(self, n: int, nodes: tuple[tuple[int, ...], ...], formats: tuple[Format | None, ...] | None = None,
              fused: tuple[bool | None, ...] | None = None) -> None:
        self.n = n
        self.nodes = nodes
        self.formats = formats if formats is not None else (None,) * len(nodes)
        self.fused = fused if fused is not None else (None,) * len(nodes)
        lo = list(range(n))
        hi = list(range(n))
        cnt = [1] * n
        level = [0] * n
        for ch in nodes:
            lo.append(min(lo[c] for c in ch))
            hi.append(max(hi[c] for c in ch))
            cnt.append(sum(cnt[c] for c in ch))
            level.append(1 + max(level[c] for c in ch))
        self._lo, self._hi, self._cnt, self._level = lo, hi, cnt, level
        self.height = level[-1]
        self.max_arity = max((len(ch) for ch in nodes), default=0)
        self._sched: list[tuple[np.ndarray, np.ndarray, Format | None, bool | None]] | None = None

    @classmethod
    def _flat(cls, n: int, nodes: tuple[tuple[int, ...], ...], formats: tuple[Format | None, ...] | None = None,
              fused: tuple[bool | None, ...] | None = None) -> SumTree:
        t = cls.__new__(cls)
        t._init(n, nodes, formats, fused)
        return t

    @property
    def annotated(self) -> bool:
        """Whether any node has its own format or fused flag."""
        return any(f is not None for f in self.formats) or any(f is not None for f in self.fused)

    def annotate(self, nodes: Any, *, accumulate: FormatLike | None = None, fused: bool | None = None) -> SumTree:
        """A copy in which the given nodes round their partial sums in ``accumulate`` and/or add products
        fused or not (``None`` leaves that setting as it is).

        ``nodes`` are value numbers (``n + j`` for ``nodes[j]``), or a callable ``pick(lo, hi, count)``
        called with each node's smallest and largest term index and number of terms.

        >>> from fpsim.accumulate import SumTree
        >>> t = SumTree.sequential(4).annotate(lambda lo, hi, count: count >= 3, accumulate="fp64")
        >>> print(t.text())
        + x[0:4] [fp64]
        |-- + x[0:3] [fp64]
        |   |-- + x[0:2]
        |   |   |-- x[0]
        |   |   `-- x[1]
        |   `-- x[2]
        `-- x[3]
        """
        if fused is not None and not isinstance(fused, (bool, np.bool_)):
            raise TypeError(f"fused must be a bool or None, got {fused!r}")
        f = as_format(accumulate) if accumulate is not None else None
        m = len(self.nodes)
        if callable(nodes):
            pick = [j for j in range(m) if nodes(self._lo[self.n + j], self._hi[self.n + j], self._cnt[self.n + j])]
        else:
            pick = []
            for v in nodes:
                is_int = isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
                if not is_int or not self.n <= v < self.n + m:
                    raise ValueError(f"a node number must be an int in {self.n}..{self.n + m - 1}, got {v!r}")
                pick.append(int(v) - self.n)
        fm, fu = list(self.formats), list(self.fused)
        for j in pick:
            if f is not None:
                fm[j] = f
            if fused is not None:
                fu[j] = bool(fused)
        return SumTree._flat(self.n, self.nodes, tuple(fm), tuple(fu))

    @property
    def root(self) -> Node:
        """The tree as nested tuples of term indices (children sorted by their smallest index)."""
        vals: list[Node] = list(range(self.n))
        for ch in self.nodes:
            vals.append(tuple(vals[c] for c in ch))
        return vals[-1]

    # ---------------------------------------------------------------------------------------------
    # Constructors of the familiar orders

    @classmethod
    def sequential(cls, n: int) -> SumTree:
        """The running sum ``((x0 + x1) + x2) + ...``.

        >>> from fpsim.accumulate import SumTree
        >>> SumTree.sequential(4).root
        (((0, 1), 2), 3)
        """
        n = _check_n(n)
        node: Node = 0
        for i in range(1, n):
            node = (node, i)
        return cls(node)

    @classmethod
    def pairwise(cls, n: int) -> SumTree:
        """Adjacent pairs level by level, an odd last element carried up (``fpsim.sum(order="pairwise")``).

        >>> from fpsim.accumulate import SumTree
        >>> SumTree.pairwise(5).root
        (((0, 1), (2, 3)), 4)
        """
        level: list[Node] = list(range(_check_n(n)))
        while len(level) > 1:
            nxt: list[Node] = [(level[k], level[k + 1]) for k in range(0, len(level) - 1, 2)]
            if len(level) % 2:
                nxt.append(level[-1])
            level = nxt
        return cls(level[0])

    @classmethod
    def lanes(cls, n: int, lanes: int, *, combine: str = "pairwise") -> SumTree:
        """``lanes`` strided running sums (lane k adds ``x[k], x[k+lanes], ...``), then the lane sums combined.

        ``combine="pairwise"`` adds the lane sums as adjacent pairs level by level, ``"sequential"`` one
        after the other (the shape of a SIMD accumulator loop followed by a horizontal sum).

        >>> from fpsim.accumulate import SumTree
        >>> SumTree.lanes(8, 2).root
        ((((0, 2), 4), 6), (((1, 3), 5), 7))
        """
        n = _check_n(n)
        if not isinstance(lanes, (int, np.integer)) or isinstance(lanes, bool) or lanes < 1:
            raise ValueError(f"lanes must be a positive int, got {lanes!r}")
        if combine not in ("pairwise", "sequential"):
            raise ValueError(f"unknown combine {combine!r}; valid: pairwise, sequential")
        chains: list[Node] = []
        for k in range(min(int(lanes), n)):
            node: Node = k
            for i in range(k + int(lanes), n, int(lanes)):
                node = (node, i)
            chains.append(node)
        while len(chains) > 1:
            if combine == "sequential":
                chains = [(chains[0], chains[1])] + chains[2:]
            else:
                nxt: list[Node] = [(chains[k], chains[k + 1]) for k in range(0, len(chains) - 1, 2)]
                if len(chains) % 2:
                    nxt.append(chains[-1])
                chains = nxt
        return cls(chains[0])

    # ---------------------------------------------------------------------------------------------
    # Comparison, rendering

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SumTree):
            return NotImplemented
        return (self.n == other.n and self.nodes == other.nodes and self.formats == other.formats
                and self.fused == other.fused)

    def __hash__(self) -> int:
        return hash((self.n, self.nodes, self.formats, self.fused))

    def __repr__(self) -> str:
        return f"SumTree(n={self.n}: {self.describe()})"

    def subtree(self, node: int) -> SumTree:
        """The subtree below value number ``node`` (a term or a node), its terms renumbered ``0 ..``
        in the order of their indices."""
        if not 0 <= node < self.n + len(self.nodes):
            raise ValueError(f"node must be in 0..{self.n + len(self.nodes) - 1}, got {node!r}")
        if node < self.n:
            return SumTree(0)
        size = self._internal_count(node)
        first = node - size + 1  # post-order: a subtree's nodes are numbered consecutively
        block = self.nodes[first - self.n: node - self.n + 1]
        terms = sorted({c for ch in block for c in ch if c < self.n})
        rn = {t: k for k, t in enumerate(terms)}
        m = len(terms)
        nodes = tuple(tuple(rn[c] if c < self.n else c - first + m for c in ch) for ch in block)
        sl = slice(first - self.n, node - self.n + 1)
        return SumTree._flat(m, nodes, self.formats[sl], self.fused[sl])

    def _internal_count(self, node: int) -> int:
        stack, k = [node], 0
        while stack:
            v = stack.pop()
            if v >= self.n:
                k += 1
                stack.extend(self.nodes[v - self.n])
        return k

    def text(self, max_depth: int | None = None) -> str:
        """The tree drawn as text, one node per line; below ``max_depth`` a subtree is one summary line.

        A node reads ``+ x[a:b]`` when it adds a contiguous range of terms, ``+ {i, j, ...}`` otherwise,
        with ``(k-way)`` for a fused node of k > 2 children.
        """
        lines: list[str] = []
        stack: list[tuple[int, str, str, int]] = [(self.n + len(self.nodes) - 1, "", "", 0)]
        while stack:
            v, prefix, tail, depth = stack.pop()
            label = self._label(v)
            if v >= self.n and max_depth is not None and depth >= max_depth:
                contiguous = self._hi[v] - self._lo[v] + 1 == self._cnt[v]
                summary = _describe(self.subtree(v), 1) if contiguous else f"height {self._level[v]}"
                lines.append(f"{prefix}{label}: {summary}")
                continue
            lines.append(prefix + label)
            if v >= self.n:
                ch = self.nodes[v - self.n]
                for k in range(len(ch) - 1, -1, -1):
                    last = k == len(ch) - 1
                    stack.append((ch[k], tail + ("`-- " if last else "|-- "), tail + ("    " if last else "|   "),
                                  depth + 1))
        return "\n".join(lines)

    def _label(self, v: int) -> str:
        if v < self.n:
            return f"x[{v}]"
        k = len(self.nodes[v - self.n])
        way = f" ({k}-way)" if k > 2 else ""
        fm, fu = self.formats[v - self.n], self.fused[v - self.n]
        if fm is not None or fu is not None:
            way += " [" + ", ".join(([fm.name] if fm is not None else []) +
                                    ([("fused" if fu else "unfused")] if fu is not None else [])) + "]"
        lo, hi, cnt = self._lo[v], self._hi[v], self._cnt[v]
        if hi - lo + 1 == cnt:
            return f"+ x[{lo}:{hi + 1}]{way}"
        return f"+ {cnt} terms from x[{lo}] to x[{hi}]{way}"

    def describe(self) -> str:
        """A compact description: a familiar order by name (sequential, pairwise, strided lanes, NumPy's
        blocked pairwise) when the tree is one, else its shape (the split at the top, then each part)."""
        return _describe(self, 0) + _notes(self)

    # ---------------------------------------------------------------------------------------------
    # The replay schedule (used by fpsim.accumulate)

    def schedule(self) -> list[tuple[np.ndarray, np.ndarray, Format | None, bool | None]]:
        """Nodes grouped by level for a vectorized replay.

        Values are numbered: terms ``0 .. n-1``, then the nodes (``n + j`` adds ``nodes[j]``). Returns
        one ``(ids, children, format, fused)`` group per (level, arity, annotation): ``ids`` the numbers of
        that level's nodes of one arity ``k``, ``children`` their children's numbers, shape
        ``(len(ids), k)``, in the order to compute them (every child at an earlier level); ``format`` and
        ``fused`` as in :attr:`formats` and :attr:`fused`. The last node, ``n + len(nodes) - 1``, is the result.
        """
        if self._sched is None:
            Row = tuple[list[int], list[tuple[int, ...]], Format | None, bool | None]
            rows: dict[tuple[int, int, str, int], Row] = {}
            for j, ch in enumerate(self.nodes):
                fm, fu = self.formats[j], self.fused[j]
                key = (self._level[self.n + j], len(ch), "" if fm is None else fm.name, -1 if fu is None else int(fu))
                ids, cs, _, _ = rows.setdefault(key, ([], [], fm, fu))
                ids.append(self.n + j)
                cs.append(ch)
            self._sched = [(np.array(ids, dtype=np.intp), np.array(cs, dtype=np.intp).reshape(len(ids), key[1]), fm, fu)
                           for key, (ids, cs, fm, fu) in sorted(rows.items())]
        return self._sched


def _check_n(n: int) -> int:
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool):
        raise TypeError(f"n must be an int, got {type(n).__name__}: {n!r}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n!r}")
    return int(n)


# --------------------------------------------------------------------------------------------------
# Compact descriptions


def _numpy_pairwise(a: int, b: int) -> Node:
    """NumPy's pairwise_sum over x[a:b] (numpy/_core/src/umath/loops_utils.h.src): below 8 terms a running
    sum; up to 128 terms, 8 strided accumulators combined ((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7)) and the
    remainder added one by one; above, split at n/2 rounded down to a multiple of 8."""
    n = b - a
    if n < 8:
        node: Node = a
        for i in range(a + 1, b):
            node = (node, i)
        return node
    if n <= 128:
        r: list[Node] = list(range(a, a + 8))
        i = 8
        while i < n - (n % 8):
            r = [(r[j], a + i + j) for j in range(8)]
            i += 8
        res: Node = (((r[0], r[1]), (r[2], r[3])), ((r[4], r[5]), (r[6], r[7])))
        for k in range(a + i, b):
            res = (res, k)
        return res
    n2 = n // 2
    n2 -= n2 % 8
    return (_numpy_pairwise(a, a + n2), _numpy_pairwise(a + n2, b))


def _reverse_seq(n: int) -> Node:
    node: Node = n - 1
    for i in range(n - 2, -1, -1):
        node = (node, i)
    return node


def _named(t: SumTree) -> str:
    """The name of a familiar order over x[0:n] that ``t`` is, or ''."""
    n = t.n
    if n == 1:
        return "a single term"
    if t == SumTree.sequential(n):
        return "sequential (a running sum)"
    if n > 2 and t == SumTree(_reverse_seq(n)):
        return "sequential from the last term down"
    if t == SumTree.pairwise(n):
        return "pairwise (adjacent pairs, level by level)"
    if n >= 8 and t == SumTree(_numpy_pairwise(0, n)):
        return ("NumPy pairwise: halves (cut at multiples of 8) down to blocks of at most 128 terms, each "
                "summed in 8 strided lanes combined ((0+1)+(2+3))+((4+5)+(6+7)), its remainder added one by one")
    for lanes in (2, 4, 8, 16, 32, 64):
        if lanes >= n:
            break
        for how in ("pairwise", "sequential"):
            if t == SumTree.lanes(n, lanes, combine=how):
                return f"{lanes} strided lanes (running sums of x[k::{lanes}]), lane sums combined {how}"
    # a SIMD loop with a scalar remainder: lanes over the first m terms, then x[m], x[m+1], ... one by one
    v, tail = t.n + len(t.nodes) - 1, 0
    while v >= n and len(t.nodes[v - n]) == 2 and t.nodes[v - n][1] == n - 1 - tail:
        v, tail = t.nodes[v - n][0], tail + 1
        m = n - tail
        if v < n or t._cnt[v] != m or t._lo[v] != 0:
            break
        sub = t.subtree(v)
        for lanes in (2, 4, 8, 16, 32, 64):
            if lanes >= m:
                break
            for how in ("pairwise", "sequential"):
                if sub == SumTree.lanes(m, lanes, combine=how):
                    return (f"{lanes} strided lanes over x[0:{m}] (lane sums combined {how}), then the last "
                            f"{tail} added one by one")
    return ""


def _lane_chains(t: SumTree) -> list[list[int]]:
    """The maximal running sums (each node adding one more term to the previous) of 2+ terms, as the
    term indices in the order they are added."""
    n = t.n
    seq = [False] * len(t.nodes)
    for j, ch in enumerate(t.nodes):
        if len(ch) == 2 and ch[1] < n and (ch[0] < n or seq[ch[0] - n]):
            seq[j] = True
    inner = {t.nodes[j][0] for j in range(len(t.nodes)) if seq[j] and t.nodes[j][0] >= n}
    chains = []
    for j in range(len(t.nodes)):
        if seq[j] and n + j not in inner:
            terms, v = [], n + j
            while v >= n:
                a, b = t.nodes[v - n]
                terms.append(b)
                v = a
            terms.append(v)
            chains.append(terms[::-1])
    return chains


def _lanes_desc(t: SumTree) -> str:
    """'k lanes ...' when most terms sit in running sums of equal stride (SIMD accumulators)."""
    chains = _lane_chains(t)
    if len(chains) < 2:
        return ""
    covered = sum(len(c) for c in chains)
    strides = {c[1] - c[0] for c in chains}
    if covered < t.n / 2 or len(strides) != 1 or any(
            any(c[i + 1] - c[i] != c[1] - c[0] for i in range(len(c) - 1)) for c in chains):
        return ""
    (s,) = strides
    lens = sorted({len(c) for c in chains})
    rest = t.n - covered
    rest_s = f", and {rest} other terms" if rest else ""
    if s == 1:  # running sums over contiguous blocks (a GEMM's K blocks)
        chains.sort()
        sizes = ", ".join(str(len(c)) for c in chains[:8]) + (", ..." if len(chains) > 8 else "")
        return (f"{len(chains)} blocks, each a running sum over a contiguous range (sizes {sizes}), the block "
                f"sums combined{rest_s} (tree height {t.height})")
    ln = str(lens[0]) if len(lens) == 1 else f"{lens[0]}-{lens[-1]}"
    first = sorted(c[0] for c in chains)
    js = ", ".join(map(str, first[:4])) + (", ..." if len(first) > 4 else "")
    return (f"{len(chains)} lanes, each a running sum of {ln} terms x[j], x[j+{s}], ... (j = {js}), the lane sums "
            f"combined{rest_s} (tree height {t.height})")


def _describe(t: SumTree, depth: int) -> str:
    name = _named(SumTree._flat(t.n, t.nodes)) if t._hi[-1] - t._lo[-1] + 1 == t.n else ""
    if name:
        return name
    lanes = _lanes_desc(t)
    if lanes:
        return lanes
    root = t.n + len(t.nodes) - 1
    ch = t.nodes[-1]
    way = f", fused nodes up to {t.max_arity}-way" if t.max_arity > 2 else ""
    sizes = " + ".join(str(t._cnt[c]) for c in ch)
    head = f"{t.n} terms: {'a ' + str(len(ch)) + '-way node of ' if len(ch) > 2 else ''}{sizes}"
    contiguous = all(t._hi[c] - t._lo[c] + 1 == t._cnt[c] for c in ch)
    if depth < 6 and contiguous:
        parts = [_describe(t.subtree(c), depth + 1) for c in ch]
        if len(set(parts)) == 1:
            return f"{head}, each {parts[0]}"
        if len(ch) == 2:
            return f"{head}: [{parts[0]}] + [{parts[1]}]"
    del root
    return f"{head} (height {t.height}{way})"


def _notes(t: SumTree) -> str:
    """The annotations, per setting: which terms' partial sums they cover."""
    if not t.annotated:
        return ""
    out = []
    for label, vals in (("partial sums in", t.formats), ("", t.fused)):
        seen: dict[str, list[int]] = {}
        for j, v in enumerate(vals):
            if v is not None:
                key = (v.name if isinstance(v, Format) else ("fused" if v else "unfused"))
                seen.setdefault(key, []).append(t.n + j)
        for key, ids in seen.items():
            lo = min(t._lo[i] for i in ids)
            hi = max(t._hi[i] for i in ids)
            out.append(f"{(label + ' ') if label else ''}{key}: {len(ids)} nodes within x[{lo}:{hi + 1}]")
    return "; " + "; ".join(out)
