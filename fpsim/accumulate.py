"""Summation and dot products in a chosen order, with every partial result rounded as hardware would.

`sum` and `dot` make the order of floating-point accumulation explicit:

``"sequential"``
    A running sum, ``acc = round(acc + x[i])`` for ``i = 0, 1, ...`` (a naive loop). The loop runs over
    the reduced axis only; each step is one vectorized operation over all the other axes.
``"pairwise"``
    A balanced binary tree: adjacent pairs are added level by level (an odd element is carried to the
    next level), ``ceil(log2 n)`` vectorized levels. Error grows like ``log n`` instead of ``n``.
``"blocked"``
    Sequential sums inside blocks of ``block`` consecutive elements (default 32), all blocks at once,
    then a sequential sum of the block sums (what tiled GPU and BLAS kernels do).
``"kahan"``
    Kahan's compensated summation, each of its four operations rounded in the accumulator format.
``"exact"``
    The exact sum (a vectorised fixed-point accumulation of the terms), rounded once.
a :class:`SumTree`
    Any explicit tree over the terms (for example one revealed from a library by
    :func:`fpsim.testing.reveal_order`): each node's children are added and the result rounded, level
    by level (all nodes of a level at once); a node of more than two children adds them exactly and
    rounds once.

Inputs are first rounded into ``fmt`` (a no-op for values already in it); partial results live in the
accumulator format ``accumulate`` (default: ``fmt``); the result is rounded into ``fmt``. Every
rounding is a correctly rounded operation of :mod:`fpsim.arith` with the given mode.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ._fpenv import ieee_mode
from ._interop import returns_input_kind
from ._names import parse_name
from ._sumtree import SumTree
from .arith import Context, _two_prod
from .array import _register_reductions
from .formats import Format, FormatLike
from .rounding import Overflow, Rounding, RoundingLike, _as_float_array

try:  # the compiled pairwise tree (fpsim/_carith.c); _pairwise below stays the reference and fallback
    from . import _carith  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - no compiler at install time
    _carith = None

__all__ = ["ORDERS", "SumTree", "dot", "matmul", "sum"]

ORDERS = ("sequential", "pairwise", "blocked", "kahan", "exact")
_DEFAULT_BLOCK = 32
# Products (K x outputs) that the whole-array orders of dot/matmul (exact, pairwise, blocked, trees) hold at once:
# larger dots run a chunk of outputs at a time, so an (M, N, K) product tensor is never built whole.
_DOT_ELEMS = 1 << 18


def _check_order(order: str | SumTree | tuple[Any, ...]) -> str | SumTree:
    if isinstance(order, SumTree):
        return order
    if isinstance(order, tuple):  # nested tuples of term indices, as SumTree takes them
        return SumTree(order)
    if not isinstance(order, str):
        raise TypeError(f"summation order must be a name ({', '.join(ORDERS)}), a fpsim.accumulate.SumTree or "
                        f"nested tuples of term indices, got {type(order).__name__}: {order!r}")
    return parse_name(order, ORDERS, "summation order")


def _check_tree(tree: SumTree, n: int) -> None:
    if tree.n != n:
        raise ValueError(f"the summation tree has {tree.n} terms but the reduced axis has length {n}")


def _check_block(block: int | None, order: str | SumTree) -> int:
    if block is None:
        return _DEFAULT_BLOCK
    if order != "blocked":
        raise ValueError(f"block applies only to order='blocked', got order={order!r}")
    if not isinstance(block, (int, np.integer)) or isinstance(block, bool) or block < 1:
        raise ValueError(f"block must be a positive int, got {block!r}")
    return int(block)


def _normalize_axes(axis: int | Sequence[int] | None, ndim: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))

    def is_int(v: object) -> bool:  # as numpy: ints and 0-d integer arrays, not bools
        if isinstance(v, np.ndarray):
            return v.ndim == 0 and v.dtype.kind in "iu"
        return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))

    if is_int(axis):
        axes: tuple[int, ...] = (int(axis),)  # type: ignore[arg-type]
    elif isinstance(axis, (tuple, list)) and all(is_int(ax) for ax in axis):
        axes = tuple(int(ax) for ax in axis)
    else:  # a float, bool, string or anything else: a wrong kind, not a bad value
        raise TypeError(f"axis must be None, an int or a tuple of ints, got {type(axis).__name__}: {axis!r}")
    out = []
    for ax in axes:
        if not -ndim <= ax < ndim:
            raise ValueError(f"axis {ax!r} is out of bounds for an array of dimension {ndim}")
        out.append(int(ax) % ndim)
    if len(set(out)) != len(out):
        raise ValueError(f"repeated axis in {axis!r}")
    return tuple(sorted(out))


# --------------------------------------------------------------------------------------------------
# Reductions over axis 0 of a float64 array whose values are already in the accumulator format


def _seq(acc: Context, t: np.ndarray, exact: bool) -> np.ndarray:
    s = t[0].copy()
    for i in range(1, t.shape[0]):
        s = acc.add(s, t[i], exact_inputs=exact)
    return np.asarray(s)


use_c_sum = _carith is not None
"""Whether ``sum(order="pairwise")`` takes the compiled tree of fpsim/_carith.c where it applies
(round-to-nearest-even, IEEE options, an IEEE-style format with p <= 25, no separate accumulator format);
set False to force the NumPy reference (:func:`_pairwise`). The results are the same bits."""


def _c_pairwise_kind(out: Context, acc: Context) -> int | None:
    """0 (fp32: float casts) or 1 (another IEEE-style format) where the compiled pairwise tree applies."""
    f = out.fmt
    if not (use_c_sum and _carith is not None) or acc.fmt != f or out.mode is not Rounding.RNE:
        return None
    if out.overflow is not Overflow.IEEE or not out.subnormals or not (f.has_inf and f.has_nan and f.subnormals
                                                                        and f.signed_zero and f.signed and f.has_zero):
        return None
    if f.nan_code is None or f.p > 25 or f.emax > 1000 or f.emin < -1000 or f.width != 1 + f.ebits + f.mbits:
        return None
    return 0 if (f.p, f.emin, f.emax) == (24, -126, 127) else 1


def _pairwise_c(a: np.ndarray, axes: tuple[int, ...], rest: list[int], kind: int, f: Format) -> np.ndarray:
    """The pairwise tree over ``axes`` of a float32/float64 array in compiled code: shape (m,) float64."""
    assert _carith is not None
    t = np.transpose(a, list(axes) + rest)
    n = math.prod(t.shape[: len(axes)])
    m = t.size // n
    x = np.ascontiguousarray(t).reshape(n, m)
    r = np.empty(m)
    _carith.pairwise_rne(x, r, n, m, int(x.dtype == np.float32), kind, f.p, f.emin, f.emax)
    return r


def _pairwise(acc: Context, t: np.ndarray, exact: bool) -> np.ndarray:
    """The reference pairwise tree: level by level over axis 0, adjacent pairs added (an odd last element
    carried), so node j of level k sums terms [j 2^k, (j+1) 2^k)."""
    while t.shape[0] > 1:
        m = t.shape[0] // 2
        s = acc.add(np.ascontiguousarray(t[0 : 2 * m : 2]), np.ascontiguousarray(t[1 : 2 * m : 2]),
                    exact_inputs=exact)
        t = np.concatenate([s, t[2 * m :]]) if t.shape[0] % 2 else s
    return np.asarray(t[0])


def _blocked(acc: Context, t: np.ndarray, block: int, exact: bool) -> np.ndarray:
    n = t.shape[0]
    nb = -(-n // block)
    if nb == 1:
        return _seq(acc, t, exact)
    pad = nb * block - n
    # Block k holds t[k*block : (k+1)*block]; step j adds element j of every block at once.
    tp = np.concatenate([t, np.zeros((pad,) + t.shape[1:])]) if pad else t
    tb = tp.reshape((nb, block) + t.shape[1:])
    s = np.ascontiguousarray(tb[:, 0])
    for j in range(1, block):
        nxt = acc.add(s, np.ascontiguousarray(tb[:, j]), exact_inputs=exact)
        if pad and j >= block - pad:
            nxt[nb - 1] = s[nb - 1]  # the last block is short: nothing to add there
        s = nxt
    return _seq(acc, s, exact)


def _kahan(acc: Context, t: np.ndarray, exact: bool) -> np.ndarray:
    s = t[0].copy()
    c = np.zeros_like(s)
    for i in range(1, t.shape[0]):
        y = acc.sub(t[i], c, exact_inputs=exact)
        u = acc.add(s, y, exact_inputs=exact)
        c = acc.sub(acc.sub(u, s, exact_inputs=exact), y, exact_inputs=exact)
        s = u
    return np.asarray(s)


_LIMB = 30  # bits per limb of the exact (fixed-point) accumulator
_LIMB_MASK = (1 << _LIMB) - 1


def _exact_sum_ro53(flat: np.ndarray, nearest64: bool) -> np.ndarray:
    """The exact sum over axis 0 of finite float64 terms ``flat`` (k, m), as RO53 (or RN64 with
    ``nearest64``) per column; 0.0 where the exact sum is zero.

    Vectorised fixed-point accumulation: each term is ``M * 2**p`` (``|M| < 2**53``); its two halves are
    shifted onto 30-bit limbs (only the limbs the terms' exponents span, plus carry room) and added with
    ``np.bincount`` (float64 sums of fewer than 2**23 values of at most 2**30 are exact); carries are
    propagated limb by limb over all columns at once, and the top 62 bits with a sticky bit for the rest
    are rounded in integer arithmetic.
    """
    k, m = flat.shape
    if k >= 2**23:  # pragma: no cover - bincount's float64 sums would no longer be exact
        raise ValueError(f"exact summation takes fewer than 2**23 terms, got {k}")
    f, e = np.frexp(flat)
    mant = np.abs(np.ldexp(f, 53)).astype(np.int64)  # |x| = mant * 2**(e - 53), mant < 2**53
    neg = f < 0
    q = e.astype(np.int64) - 53  # the exponent of mant's bit 0
    live = mant != 0
    qmin = int(q[live].min()) if live.any() else 0
    qmax = int(q[live].max()) if live.any() else 0
    q = np.where(live, q, qmin)  # zeros add nothing: keep their (meaningless) exponent inside the range
    base = (qmin // _LIMB - 2) * _LIMB  # limb 0's bit 0; limbs 0 and 1 stay zero (room for the window)
    nl = (qmax + 53 - base) // _LIMB + 3  # one limb above the top term, one for the carries of k terms
    q = q - base
    lo, hi = mant & ((1 << 26) - 1), mant >> 26
    col = np.broadcast_to(np.arange(m, dtype=np.int64), (k, m))
    acc = np.zeros(nl * m)
    for part, pos in ((lo, q), (hi, q + 26)):
        limb, sh = np.divmod(pos, _LIMB)
        v = part << sh  # < 2**56: fits int64
        for piece, at in ((v & _LIMB_MASK, limb), (v >> _LIMB, limb + 1)):
            w = np.where(neg, -piece, piece).astype(np.float64)
            acc += np.bincount((at * m + col).ravel(), weights=w.ravel(), minlength=nl * m)
    a = acc.reshape(nl, m).astype(np.int64)  # (limb, column)

    def carry(a: np.ndarray) -> None:  # limbs 0..nl-2 into [0, 2**30), the sign into the top limb
        for i in range(nl - 1):
            c = a[i] >> _LIMB
            a[i] -= c << _LIMB
            a[i + 1] += c

    carry(a)
    negative = a[-1] < 0
    if negative.any():
        a[:, negative] = -a[:, negative]
        carry(a)
    nz = a != 0
    anynz = nz.any(axis=0)
    h = np.where(anynz, nl - 1 - np.argmax(nz[::-1], axis=0), 2)  # the highest nonzero limb (>= 2)
    cols = np.arange(m)
    top, mid, low = a[h, cols], a[h - 1, cols], a[h - 2, cols]
    b = np.maximum(np.frexp(top.astype(np.float64))[1], 1).astype(np.int64)  # bit length of top, 1..30 (exact)
    sh = _LIMB - b  # 0..29: top << sh has exactly 30 bits
    drop = 28 - sh  # bits of `low` below the 62-bit window (-1..28)
    lowpart = np.where(drop >= 0, low >> np.maximum(drop, 0), low << 1)
    window = (top << (32 + sh)) + (mid << (2 + sh)) + lowpart  # 62 bits, leading bit at 61
    below = np.where(drop > 0, low & ((np.int64(1) << np.maximum(drop, 0)) - 1), 0) != 0
    rest = (nz & (np.arange(nl)[:, None] < (h - 2)[None, :])).any(axis=0)
    window |= (below | rest).astype(np.int64)
    t, r9 = window >> 9, window & 0x1FF
    if nearest64:
        t = t + ((r9 > 0x100) | ((r9 == 0x100) & ((t & 1) == 1)))
    else:
        t = t | (r9 != 0)
    expo = (_LIMB * (h - 2) + base) + (28 - sh) + 9
    with np.errstate(over="ignore"):
        out = np.ldexp(t.astype(np.float64), expo.astype(np.int32))
    out = np.where(anynz, out, 0.0)
    return np.asarray(np.where(negative, -out, out))


def _exact(terms: list[np.ndarray], nearest64: bool = False) -> np.ndarray:
    """RO53 of the exact sum over axis 0 of the given arrays' terms (several arrays: their union); RN64
    with ``nearest64`` (fp64 results). The round-to-odd value is the one that one more rounding to any
    narrower format turns into the correctly rounded result. Vectorised: :func:`_exact_sum_ro53`.
    """
    t = np.concatenate(terms) if len(terms) > 1 else terms[0]
    n = t.shape[0]
    flat = t.reshape(n, -1)
    out = np.empty(flat.shape[1])
    finite = np.isfinite(flat).all(axis=0)
    with np.errstate(invalid="ignore", over="ignore"):
        out[~finite] = flat[:, ~finite].sum(axis=0)  # IEEE: NaN or ±inf propagate
    s = _exact_sum_ro53(np.ascontiguousarray(flat[:, finite]), nearest64)
    if s.size:
        nz = s != 0
        # an exact zero sum: +0 unless every term is -0 (IEEE 754 §6.3 for round-to-nearest)
        allneg0 = np.all((flat[:, finite] == 0) & np.signbit(flat[:, finite]), axis=0)
        s = np.where(~nz & allneg0, -0.0, s)
    out[finite] = s
    return out.reshape(t.shape[1:])


def _node_ctx(acc: Context, fm: Format | None, cache: dict[str, Context]) -> Context:
    if fm is None:
        return acc
    if fm.name not in cache:
        cache[fm.name] = Context(fm, acc.mode, overflow=acc.overflow, subnormals=acc.subnormals, rng=acc.rng)
    return cache[fm.name]


def _tree_sum(acc: Context, t: np.ndarray, tree: SumTree, exact: bool) -> np.ndarray:
    """Replay ``tree`` over axis 0 of ``t``: one vectorized operation per (level, arity) of the tree."""
    n = t.shape[0]
    _check_tree(tree, n)
    sched = tree.schedule()
    total = n + builtins.sum(len(g[0]) for g in sched)
    v = np.empty((total,) + t.shape[1:])
    v[:n] = t
    cache: dict[str, Context] = {}
    mixed = tree.annotated  # children may be wider than their node: round each sum from the exact inputs
    for ids, ch, fm, _ in sched:
        ctx = _node_ctx(acc, fm, cache)
        ex = exact and not mixed
        if ch.shape[1] == 2:
            v[ids] = ctx.add(v[ch[:, 0]], v[ch[:, 1]], exact_inputs=ex)
        else:  # a fused multi-term node: its children added exactly, rounded once
            v[ids] = ctx.round(_exact([v[ch.T]], ctx.native))
    return np.asarray(v[total - 1])


def _tree_dot(acc: Context, xf: np.ndarray, yf: np.ndarray, tree: SumTree, fused: bool,
              exact_in: bool) -> np.ndarray:
    """Replay ``tree`` over the products ``xf[i] * yf[i]`` (shape (k, m)); a fused node with a leaf
    child adds that product by an FMA, and a fused multi-term node adds its leaf products exactly."""
    k = xf.shape[0]
    _check_tree(tree, k)
    p = acc.mul(xf, yf, exact_inputs=exact_in)
    if not fused and not tree.annotated:
        return _tree_sum(acc, p, tree, True)
    sched = tree.schedule()
    total = k + builtins.sum(len(g[0]) for g in sched)
    v = np.empty((total,) + xf.shape[1:])
    v[:k] = p
    cache: dict[str, Context] = {}
    mixed = tree.annotated
    for ids, ch, fm, fu in sched:
        ctx = _node_ctx(acc, fm, cache)
        use_fma = fused if fu is None else fu
        ex = exact_in and not mixed
        if ch.shape[1] == 2:
            a, b = ch[:, 0], ch[:, 1]
            leaf_a, leaf_b = a < k, b < k
            f = np.where(leaf_b, b, a)  # the fused leaf: the second child when it is a leaf
            o = np.where(leaf_b, a, b)
            fz = (leaf_a | leaf_b) if use_fma else np.zeros(len(ids), dtype=bool)
            if fz.any():
                v[ids[fz]] = ctx.fma(xf[f[fz]], yf[f[fz]], v[o[fz]], exact_inputs=ex)
            if not fz.all():
                v[ids[~fz]] = ctx.add(v[a[~fz]], v[b[~fz]], exact_inputs=ex and not mixed)
            continue
        terms = []
        for j in range(ch.shape[1]):
            c = ch[:, j]
            leaf = (c < k).reshape((-1,) + (1,) * (xf.ndim - 1)) & use_fma
            ci = np.minimum(c, k - 1)
            with np.errstate(over="ignore", invalid="ignore", under="ignore"):
                ph, pl = _two_prod(xf[ci], yf[ci])
            terms.append(np.where(leaf, ph, v[c]))
            terms.append(np.where(leaf & np.isfinite(ph), pl, 0.0))
        v[ids] = ctx.round(_exact([np.stack(terms)], ctx.native))
    return np.asarray(v[total - 1])


def _reduce(terms: np.ndarray, order: str | SumTree, acc: Context, block: int, exact: bool) -> np.ndarray:
    if isinstance(order, SumTree):
        return _tree_sum(acc, terms, order, exact)
    if order == "sequential":
        return _seq(acc, terms, exact)
    if order == "pairwise":
        return _pairwise(acc, terms, exact)
    if order == "blocked":
        return _blocked(acc, terms, block, exact)
    return _kahan(acc, terms, exact)


def _contexts(fmt: FormatLike, accumulate: FormatLike | None, rounding: RoundingLike, overflow: Overflow | str,
              subnormals: bool, rng: np.random.Generator | None) -> tuple[Context, Context]:
    out = Context(fmt, rounding, overflow=overflow, subnormals=subnormals, rng=rng)
    if accumulate is None:
        return out, out
    acc = Context(accumulate, rounding, overflow=overflow, subnormals=subnormals, rng=rng)
    return out, acc


def _contains(big: Format, small: Format) -> bool:
    """Every value of ``small`` is a value of ``big`` (so converting into ``big`` is exact)."""
    return big.contains(small)


def _result(r: np.ndarray, scalar: bool, keepdims_shape: tuple[int, ...] | None) -> Any:
    if keepdims_shape is not None:
        r = r.reshape(keepdims_shape)
    if r.ndim == 0 or scalar:
        return r[()]
    return r


@ieee_mode
@returns_input_kind
def sum(
    x: Any,
    fmt: FormatLike,
    *,
    order: str | SumTree | tuple[Any, ...] = "sequential",
    block: int | None = None,
    accumulate: FormatLike | None = None,
    rounding: RoundingLike = "rne",
    axis: int | Sequence[int] | None = None,
    keepdims: bool = False,
    overflow: Overflow | str = "ieee",
    subnormals: bool = True,
    rng: np.random.Generator | None = None, as_dtype: bool = False,
) -> Any:
    """Sum values in a floating-point format, in an explicit order of accumulation.

    Parameters
    ----------
    x : array_like
        Values; first rounded into ``fmt`` with ``rounding`` (a no-op for values already in it).
    fmt : Format or str
        Element and result format.
    order : {"sequential", "pairwise", "blocked", "kahan", "exact"}, SumTree or nested tuples
        Order of accumulation (see the module docstring): a name, or an explicit :class:`SumTree` over
        the reduced terms (``tree.n`` must equal their number, also for an empty axis), e.g. one revealed
        from a library with :func:`fpsim.testing.reveal_order`; nested tuples of term indices such as
        ``((0, 1), 2)`` are turned into a :class:`SumTree`.
    block : int, optional
        Block length for ``order="blocked"`` (default 32).
    accumulate : Format or str, optional
        Format of the partial sums (default ``fmt``), e.g. ``"fp32"`` to accumulate bf16 values in fp32
        and round once at the end.
    rounding : str
        Mode of every rounding (inputs, partial sums, result).
    axis : int or tuple of ints, optional
        Axes to reduce (default all).
    keepdims : bool
        Keep reduced axes with length one.
    overflow, subnormals, rng
        As for :func:`fpsim.round`.

    as_dtype : bool, optional
        ``True``: the result in the input library's own dtype of the format (ml_dtypes for NumPy input,
        ``torch.bfloat16``, ``jnp.float8_e4m3fn``, ...) instead of a float32/float64 carrier; applied at
        the API edge (``fpsim._interop.returns_input_kind``).
    Returns
    -------
    numpy.ndarray or numpy scalar (float64)

    Examples
    --------
    A bf16 running sum of 10,000 ones stops at 256 (256 + 1 is a tie, and ties go to even 256):

    >>> import numpy as np, fpsim
    >>> float(fpsim.sum(np.ones(10_000), "bf16"))
    256.0

    With fp32 partial sums every running sum up to 10000 is exact; the one rounding, of 10000 into bf16
    (spacing 64 in [8192, 16384)), goes to the nearer neighbour 9984 = 156 * 64, not 10048:

    >>> float(fpsim.sum(np.ones(10_000), "bf16", accumulate="fp32"))   # fp32 partials, one rounding
    9984.0
    >>> float(fpsim.sum(np.ones(10_000), "bf16", order="pairwise"))
    9984.0
    >>> float(fpsim.sum(np.ones(10_000), "bf16", order="exact"))
    9984.0

    ``order="pairwise"`` with round-to-nearest-even and the default options, into an IEEE-style format with
    p <= 25 (fp32, tf32, fp16, bf16, fp8_e5m2) and no separate ``accumulate`` format, runs the same tree in
    compiled code (fpsim/_carith.c; same bits; ``fpsim.accumulate.use_c_sum = False`` forces the NumPy
    reference).
    """
    order = _check_order(order)
    blk = _check_block(block, order)
    out, acc = _contexts(fmt, accumulate, rounding, overflow, subnormals, rng)
    a, _ = _as_float_array(x)
    kind = _c_pairwise_kind(out, acc) if order == "pairwise" else None
    if kind is None or a.dtype not in (np.float32, np.float64):
        a = np.asarray(a, dtype=np.float32 if kind is not None and a.dtype == np.float16 else np.float64)
    axes = _normalize_axes(axis, a.ndim)
    keep_shape = tuple(1 if i in axes else n for i, n in enumerate(a.shape)) if keepdims else None
    rest = [i for i in range(a.ndim) if i not in axes]
    rest_shape = tuple(a.shape[i] for i in rest)
    if kind is not None and a.size:  # the compiled tree: leaves rounded and summed in one pass (same bits)
        return _result(_pairwise_c(a, axes, rest, kind, out.fmt).reshape(rest_shape), False, keep_shape)
    a = np.asarray(a, dtype=np.float64)
    # reduced axes first, flattened into one, the others into a second: shape (n, m)
    t = np.transpose(a, list(axes) + rest).reshape(-1, math.prod(rest_shape))
    t = out.round(np.ascontiguousarray(t))
    if isinstance(order, SumTree):
        _check_tree(order, t.shape[0])
    if t.shape[0] == 0:
        return _result(np.zeros(rest_shape), False, keep_shape)
    if order == "exact":
        return _result(out.round(_exact([t], out.native)).reshape(rest_shape), False, keep_shape)
    exact = True
    if acc is not out:
        exact = _contains(acc.fmt, out.fmt)
        if not exact:
            t = acc.round(t)
            exact = True
    r = _reduce(t, order, acc, blk, exact)
    return _result(out.round(np.ascontiguousarray(r)).reshape(rest_shape), False, keep_shape)


@ieee_mode
@returns_input_kind
def dot(
    a: Any,
    b: Any,
    fmt: FormatLike,
    *,
    order: str | SumTree | tuple[Any, ...] = "sequential",
    block: int | None = None,
    accumulate: FormatLike | None = None,
    rounding: RoundingLike = "rne",
    fused: bool = True,
    overflow: Overflow | str = "ieee",
    subnormals: bool = True,
    rng: np.random.Generator | None = None, as_dtype: bool = False,
) -> Any:
    """Dot product over the last axis, ``sum_i a[..., i] * b[..., i]``, in an explicit order.

    ``a`` and ``b`` are rounded into ``fmt`` and broadcast against each other except along the last
    axis, which is reduced. With ``fused=True`` (default) the ``"sequential"`` and ``"blocked"`` orders
    use fused multiply-adds, ``acc = fma(a[i], b[i], acc)`` rounded once per step in the accumulator
    format; otherwise (and for ``"pairwise"`` and ``"kahan"``) each product is first rounded into the
    accumulator format and the products are summed in that order. ``"exact"`` rounds the exact dot
    product once. A :class:`SumTree` order replays that tree over the products: with ``fused=True`` a
    node with a leaf child adds that product by a fused multiply-add into its other child (two leaves:
    the higher index is fused into the lower one's rounded product), as FMA accumulator lanes do.
    Other parameters as for :func:`sum`.

    Examples
    --------
    >>> import numpy as np, fpsim
    >>> a = np.full(4096, 0.5)
    >>> float(fpsim.dot(a, a, "fp16")), float(fpsim.dot(a, a, "fp16", order="exact"))  # 512 + 0.25 is a tie
    (512.0, 1024.0)
    >>> float(fpsim.dot(np.ones(3000), np.ones(3000), "fp16"))   # 2048 + 1 is a tie: stays 2048
    2048.0
    """
    order = _check_order(order)
    blk = _check_block(block, order)
    if not isinstance(fused, (bool, np.bool_)):
        raise TypeError(f"fused must be a bool, got {fused!r}")
    out, acc = _contexts(fmt, accumulate, rounding, overflow, subnormals, rng)
    x, _ = _as_float_array(a, "a")
    y, _ = _as_float_array(b, "b")
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.ndim == 0 or y.ndim == 0:
        raise ValueError("dot needs arrays with at least one axis (the one reduced)")
    if x.shape[-1] != y.shape[-1]:
        raise ValueError(f"dot: last axes differ in length: {x.shape} and {y.shape}")
    # the reduced axis first; the others broadcast lazily, step by step
    xr = out.round(np.ascontiguousarray(np.moveaxis(x, -1, 0)))
    yr = out.round(np.ascontiguousarray(np.moveaxis(y, -1, 0)))
    return _result(_dot_core(xr, yr, order, blk, out, acc, bool(fused)), False, None)


@ieee_mode
@returns_input_kind
def matmul(
    a: Any,
    b: Any,
    fmt: FormatLike,
    *,
    order: str | SumTree | tuple[Any, ...] = "sequential",
    block: int | None = None,
    accumulate: FormatLike | None = None,
    rounding: RoundingLike = "rne",
    fused: bool = True,
    overflow: Overflow | str = "ieee",
    subnormals: bool = True,
    rng: np.random.Generator | None = None, as_dtype: bool = False,
) -> Any:
    """Matrix product with the accumulation model of :func:`dot` for every output element.

    Shapes follow ``np.matmul`` (1-D operands are promoted and the added axis removed; leading axes
    broadcast). This is the plain summation-order model used by :class:`fpsim.FPArray`; hardware
    matrix units (block FMAs, Tensor Cores) are modelled in :mod:`fpsim.mma`.

    >>> import numpy as np, fpsim
    >>> fpsim.accumulate.matmul(np.ones((2, 3000)), np.ones((3000, 2)), "fp16")
    array([[2048., 2048.],
           [2048., 2048.]])
    """
    order = _check_order(order)
    blk = _check_block(block, order)
    out, acc = _contexts(fmt, accumulate, rounding, overflow, subnormals, rng)
    x, _ = _as_float_array(a, "a")
    y, _ = _as_float_array(b, "b")
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.ndim == 0 or y.ndim == 0:
        raise ValueError("matmul: scalar operands are not allowed, use multiplication")
    x2 = x[None, :] if x.ndim == 1 else x
    y2 = y[:, None] if y.ndim == 1 else y
    if x2.shape[-1] != y2.shape[-2]:
        raise ValueError(f"matmul: shapes {x.shape} and {y.shape} are not aligned")
    xr = out.round(np.ascontiguousarray(np.moveaxis(x2, -1, 0)))[..., None]  # (k, ..., m, 1)
    yr = out.round(np.ascontiguousarray(np.moveaxis(y2, -2, 0)))[..., None, :]  # (k, ..., 1, n)
    r = _dot_core(xr, yr, order, blk, out, acc, bool(fused))
    if x.ndim == 1:
        r = r[..., 0, :]
    if y.ndim == 1:
        r = r[..., 0]
    return _result(np.asarray(r), False, None)


def _gather_outputs(v: np.ndarray, shape: tuple[int, ...], c0: int, c1: int) -> np.ndarray:
    """Terms of outputs ``c0:c1`` (C order over `shape`) of an operand (k, *s) broadcasting to (k, *shape), as
    (k, c1 - c0): a view where no gathering is needed, else a copy of those columns only."""
    k = v.shape[0]
    vs = v.shape[1:]
    flat = v.reshape(k, -1)
    if vs == shape:
        return flat[:, c0:c1]
    if flat.shape[1] == 1:
        return np.broadcast_to(flat, (k, c1 - c0))
    multi = np.unravel_index(np.arange(c0, c1), shape)
    idx = np.zeros(c1 - c0, dtype=np.intp)
    stride = 1
    for d in range(len(shape) - 1, -1, -1):
        if vs[d] != 1:  # a broadcast axis (size 1 in the operand) indexes its one entry
            idx += multi[d] * stride
        stride *= vs[d]
    res: np.ndarray = flat[:, idx]
    return res


def _dot_core(xr: np.ndarray, yr: np.ndarray, order: str | SumTree, blk: int, out: Context, acc: Context,
              fused: bool) -> np.ndarray:
    """Dot over axis 0 of operands in the element format, shapes (k, *sx) and (k, *sy), the other axes
    broadcasting; returns shape broadcast(sx, sy)."""
    k = xr.shape[0]
    shape = np.broadcast_shapes(xr.shape[1:], yr.shape[1:])
    if isinstance(order, SumTree):
        _check_tree(order, k)
    if k == 0:
        return np.zeros(shape)
    nd = 1 + len(shape)  # align ranks (new axes after the reduced one) so that term i broadcasts
    xr = xr.reshape((k,) + (1,) * (nd - xr.ndim) + xr.shape[1:])
    yr = yr.reshape((k,) + (1,) * (nd - yr.ndim) + yr.shape[1:])
    size = int(np.prod(shape, dtype=np.int64))
    whole = isinstance(order, SumTree) or order in ("exact", "pairwise", "blocked")
    # Outputs are independent in every order, so chunks give the same bits, except that stochastic
    # rounding would draw its random bits in another order: it keeps the one pass.
    # The exact sum holds about 16 int64 temporaries per product: a smaller chunk.
    per = _DOT_ELEMS // 16 if order == "exact" or isinstance(order, SumTree) else _DOT_ELEMS
    step = max(1, per // k)  # outputs per chunk (at least one: a chunk never chunks again)
    if whole and size > step and Rounding.SR not in (out.mode, acc.mode):
        res = np.empty(size)
        for c0 in range(0, size, step):
            c1 = min(size, c0 + step)
            res[c0:c1] = _dot_core(_gather_outputs(xr, shape, c0, c1), _gather_outputs(yr, shape, c0, c1),
                                   order, blk, out, acc, fused)
        return res.reshape(shape)

    def row(v: np.ndarray, i: int, lead: tuple[int, ...] = ()) -> np.ndarray:  # term i, broadcast, flat
        return np.ascontiguousarray(np.broadcast_to(v[i], lead + shape)).reshape(lead + (-1,))

    def full(v: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(np.broadcast_to(v, (k,) + shape)).reshape(k, -1)

    exact_in = _contains(acc.fmt, out.fmt)
    if isinstance(order, SumTree):
        return out.round(_tree_dot(acc, full(xr), full(yr), order, fused, exact_in)).reshape(shape)
    if order == "exact":
        xf, yf = full(xr), full(yr)
        with np.errstate(over="ignore", invalid="ignore", under="ignore"):
            if out.fmt.p <= 26:
                prods = [xf * yf]  # exact: at most 26 + 26 significant bits
            else:
                ph, pl = _two_prod(xf, yf)
                prods = [ph, np.where(np.isfinite(ph), pl, 0.0)]
        return out.round(_exact(prods, out.native)).reshape(shape)
    if fused and order in ("sequential", "blocked"):
        if order == "sequential" or k <= blk:
            s = acc.mul(row(xr, 0), row(yr, 0), exact_inputs=exact_in)
            for i in range(1, k):
                s = acc.fma(row(xr, i), row(yr, i), s, exact_inputs=exact_in)
            return out.round(s).reshape(shape)
        # blocked and fused: fma chains inside each block (all blocks at once), then a sequential sum
        nb = -(-k // blk)
        pad = nb * blk - k
        xp = np.concatenate([xr, np.zeros((pad,) + xr.shape[1:])]) if pad else xr
        yp = np.concatenate([yr, np.zeros((pad,) + yr.shape[1:])]) if pad else yr
        xb = xp.reshape((nb, blk) + xr.shape[1:]).swapaxes(0, 1)  # (blk, nb, ...)
        yb = yp.reshape((nb, blk) + yr.shape[1:]).swapaxes(0, 1)
        s = acc.mul(row(xb, 0, (nb,)), row(yb, 0, (nb,)), exact_inputs=exact_in)
        for j in range(1, blk):
            nxt = acc.fma(row(xb, j, (nb,)), row(yb, j, (nb,)), s, exact_inputs=exact_in)
            if pad and j >= blk - pad:
                nxt[nb - 1] = s[nb - 1]  # the last block is short
            s = nxt
        return out.round(_seq(acc, s, True)).reshape(shape)
    if order == "pairwise":
        p = acc.mul(full(xr), full(yr), exact_inputs=exact_in)
        return out.round(np.ascontiguousarray(_pairwise(acc, p, True))).reshape(shape)
    # unfused sequential, blocked and kahan: products rounded into the accumulator format, one row at a time
    if order == "blocked":
        p = acc.mul(full(xr), full(yr), exact_inputs=exact_in)
        return out.round(np.ascontiguousarray(_blocked(acc, p, blk, True))).reshape(shape)
    s = acc.mul(row(xr, 0), row(yr, 0), exact_inputs=exact_in)
    c = np.zeros_like(s)
    for i in range(1, k):
        t = acc.mul(row(xr, i), row(yr, i), exact_inputs=exact_in)
        if order == "sequential":
            s = acc.add(s, t, exact_inputs=True)
        else:
            y = acc.sub(t, c, exact_inputs=True)
            u = acc.add(s, y, exact_inputs=True)
            c = acc.sub(acc.sub(u, s, exact_inputs=True), y, exact_inputs=True)
            s = u
    return out.round(s).reshape(shape)


# FPArray (one layer below) reduces through these
_register_reductions(sum=sum, matmul=matmul, check_order=_check_order, check_block=_check_block)
