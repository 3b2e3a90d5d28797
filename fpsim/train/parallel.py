"""Data-parallel gradient numerics: all-reduce algorithms, DDP buckets, compression, a data-parallel trainer.

Data parallelism runs ``world_size`` replicas of the model, each on its own slice of the global batch,
and sums (or averages) their gradients with an *all-reduce*. Floating-point addition is not associative,
so the bits of the reduced gradient depend on the order in which the collective adds the ranks'
contributions, and on the format the partial sums travel (and are accumulated) in. This module runs the
real algorithms' orders, vectorised over the elements, with every partial sum rounded to the wire format
through :func:`fpsim.round`:

``"ring"``
    NCCL's ring: the vector is cut into ``world_size`` contiguous chunks of ``ceil(n / N)`` elements;
    chunk ``c`` is reduced along the ring starting at rank ``c + 1``: ``((x[c+1] + x[c+2]) + ...) + x[c]``
    (ranks mod N; the rank that adds last owns the chunk and all-gathers it). One loop of NCCL's
    schedule, ring order = rank order (NCCL picks the ring from the topology and, for large buffers,
    loops over several chunk rounds; neither is modelled).
``"gloo"``
    Gloo's ``allreduce`` ring (``gloo/allreduce.cc``, what ``torch.distributed`` with the gloo backend
    runs on CPU): ``numSegments = roundUp(max(ceil(bytes / 1 MiB), 2N), N)`` segments of
    ``ceil(n / numSegments)`` elements, ``numSegments / N`` consecutive segments per chunk; rank ``r``
    sends to rank ``r - 1``, so chunk ``c`` starts at rank ``c - 1``: ``((x[c-1] + x[c-2]) + ...) + x[c]``.
    ``op="avg"`` is the SUM followed by ``tensor /= N`` (torch's ProcessGroupGloo: gloo has no AVG).
    Bit-identical to real gloo for 2, 3, 4 and 8 processes in FP32, BF16 and FP16 (tests/test_gloo.py).
``"tree"``
    A binomial tree reduce to rank 0, then a broadcast: at distance ``d = 1, 2, 4, ...`` rank ``r``
    (``r % 2d == 0``) adds rank ``r + d``'s partial: ``((x0 + x1) + (x2 + x3)) + ...``. (NCCL's tree is a
    double binary tree across nodes with a chain inside each node; not modelled.)
``"halving-doubling"``
    Recursive halving reduce-scatter + recursive doubling all-gather (Thakur, Rabenseifner and Gropp
    2005): for N not a power of two the first ``2 (N - p)`` ranks fold pairwise (``x[2i] + x[2i+1]``) into
    ``p`` (the largest power of two <= N) virtual ranks; then partners at distance ``p/2, p/4, ..., 1``
    add: for N = 8, ``((x0 + x4) + (x2 + x6)) + ((x1 + x5) + (x3 + x7))``.
``"direct"``
    Every rank receives every other rank's vector and sums them in rank order:
    ``((x0 + x1) + x2) + ...`` (also the order of gloo's shared-memory path where a build enables it).

Wire formats: ``"fp32"``, ``"bf16"``, ``"fp16"`` (and, outside ``"gloo"``, ``"fp8_e4m3"``/``"fp8_e5m2"``,
saturating). The inputs are first cast to the wire format (the tensor that is sent has the wire dtype),
then every partial sum is rounded to it: NCCL's documented rule that BF16 sums are accumulated in BF16 at
each hop. ``op="avg"``: ``avg="premul"`` (NCCL's ``ncclAvg`` for floating types, and DDP's default
``grad * (1/N)`` before a SUM): every input is first multiplied by ``1/N`` rounded to the wire format,
the product rounded to the wire format (meta-pytorch/torchcomms PRs #4069 and #4071 make CTRAN's ring
BF16/FP16 AVG follow this NCCL rule); ``avg="postdiv"`` (gloo): SUM, then divide by N, rounded once.
The default is ``"postdiv"`` for ``algorithm="gloo"`` and ``"premul"`` otherwise.

>>> import numpy as np
>>> from fpsim.train import all_reduce
>>> x = [np.float32([1.0]), np.float32([2.0**-24]), np.float32([2.0**-24])]
>>> float(all_reduce(x, algorithm="direct")[0][0]) == 1.0          # (1 + u) + u: both halves lost
True
>>> float(all_reduce(x, algorithm="ring")[0][0]) == 1.0 + 2.0**-23   # (u + u) + 1 for chunk 0
True
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._checks import check_bool, check_int, check_real
from .._fpenv import ieee_mode
from .._interop import host_array
from .._names import parse_name
from .._sumtree import SumTree
from ..amp import Policy
from ..formats import Format, as_format
from ..nn import gpt_backward, gpt_forward
from ..rounding import round as fround
from ._threads import single_threaded
from .loop import TrainConfig, Trainer

__all__ = [
    "ALGORITHMS",
    "WIRES",
    "DataParallelTrainer",
    "GradCompressor",
    "all_reduce",
    "comm_bytes",
    "ddp_all_reduce",
    "ddp_buckets",
    "reduction_order",
]

#: The all-reduce algorithms :func:`all_reduce` runs.
ALGORITHMS = ("ring", "tree", "halving-doubling", "direct", "gloo")
#: Wire (transfer and accumulation) formats; gloo takes the first three.
WIRES = ("fp32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2")
_GLOO_WIRES = ("fp32", "bf16", "fp16")
_OPS = ("sum", "avg")
_AVG = ("premul", "postdiv")
_GLOO_MAX_SEGMENT_BYTES = 1024 * 1024  # gloo AllreduceOptionsImpl::kMaxSegmentSize
_MIB = 1024 * 1024


# ---------------------------------------------------------------------------------------------- schedules
def _chunk_of(n: int, world: int, algorithm: str, elem_bytes: int) -> np.ndarray:
    """The chunk (owner rank) of every element of an n-element vector for the ring algorithms."""
    j = np.arange(n, dtype=np.int64)
    if algorithm == "ring":
        size = -(-n // world)
        return j // max(size, 1)
    # gloo/allreduce.cc ring(): segments sized so that there are a multiple of N, at least 2N, of at most
    # 1 MiB each; chunk c = numSegmentsPerRank consecutive segments.
    total = n * elem_bytes
    max_seg = elem_bytes * max(1, _GLOO_MAX_SEGMENT_BYTES // elem_bytes)
    nseg = max(-(-total // max_seg), 2 * world)
    nseg = -(-nseg // world) * world
    per_rank = nseg // world
    seg_elems = -(-n // nseg)
    return j // (per_rank * seg_elems)


def _sequential_orders(n: int, world: int, algorithm: str, elem_bytes: int) -> np.ndarray:
    """(world, n) rank indices: the k-th addend of every element for the sequential (chain) algorithms."""
    k = np.arange(world, dtype=np.int64)[:, None]
    if algorithm == "direct":
        return np.broadcast_to(k, (world, n))
    c = _chunk_of(n, world, algorithm, elem_bytes)[None, :]
    if algorithm == "ring":
        return (c + 1 + k) % world
    return (c - 1 - k) % world  # gloo: data flows from rank r to rank r - 1


def _pair_levels(world: int, algorithm: str) -> tuple[list[tuple[list[int], list[int]]], int]:
    """Levels of pairwise additions ``W[dst] += W[src]`` (vectorised per level) and the root slot."""
    levels: list[tuple[list[int], list[int]]] = []
    if algorithm == "tree":
        d = 1
        while d < world:
            dst = [r for r in range(0, world, 2 * d) if r + d < world]
            levels.append((dst, [r + d for r in dst]))
            d *= 2
        return levels, 0
    # halving-doubling
    p = 1 << (world.bit_length() - 1)
    rem = world - p
    if rem:
        levels.append(([2 * i + 1 for i in range(rem)], [2 * i for i in range(rem)]))
    virt = [2 * i + 1 for i in range(rem)] + list(range(2 * rem, world))
    d = p // 2
    while d >= 1:  # only the pairs on the way to virtual rank 0 (every rank does this for its own half)
        levels.append(([virt[v] for v in range(d)], [virt[v + d] for v in range(d)]))
        d //= 2
    return levels, virt[0]


# ---------------------------------------------------------------------------------------------- arithmetic
def _overflow(fmt: Format) -> str:
    return "saturate" if fmt.width <= 8 else "ieee"


def _to_wire(x: np.ndarray, fmt: Format) -> np.ndarray:
    """Round to the wire format; float32 carriers (every wire format fits in float32)."""
    if fmt.name == "fp32":
        if isinstance(x, np.ndarray) and x.dtype == np.float32:
            return x  # already FP32 (fpsim.round would return the same values)
        return np.asarray(fround(x, fmt), dtype=np.float32)
    return np.asarray(fround(np.asarray(x, dtype=np.float32), fmt, overflow=_overflow(fmt)), dtype=np.float32)


def _adder(fmt: Format) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    if fmt.name == "fp32":
        return lambda a, b: a + b  # float32 addition: IEEE, rounded once
    # The float32 sum of two values of a format with p <= 11 bits is rounded once more to the wire format:
    # 24 >= 2p + 2, so the double rounding is innocuous (equals one correct rounding of the exact sum).
    return lambda a, b: _to_wire(a + b, fmt)


def _reduce(X: np.ndarray, algorithm: str, fmt: Format) -> np.ndarray:
    """The reduced vector (n,) of X (world, n), wire-format values in float32."""
    world, n = X.shape
    add = _adder(fmt)
    if world == 1:
        return np.array(X[0])
    if algorithm in ("tree", "halving-doubling"):
        levels, root = _pair_levels(world, algorithm)
        W = X.copy()
        for dst, src in levels:
            W[dst] = add(W[dst], W[src])
        return np.array(W[root])
    # The chain algorithms: the chunks are contiguous, so each step gathers its addend chunk by chunk from
    # slices (no index arrays) and adds (and rounds) the whole vector at once.
    if algorithm == "direct":
        acc = X[0]
        for k in range(1, world):
            acc = add(acc, X[k])
        return np.array(acc)
    chunk = _chunk_of(n, world, algorithm, fmt.width // 8)
    edges = np.searchsorted(chunk, np.arange(world + 1))
    step = 1 if algorithm == "ring" else -1
    start = 1 if algorithm == "ring" else -1

    def addend(k: int) -> np.ndarray:
        out = np.empty(n, dtype=np.float32)
        for c in range(world):
            lo, hi = int(edges[c]), int(edges[c + 1])
            if lo < hi:
                out[lo:hi] = X[(c + start + step * k) % world, lo:hi]
        return out

    acc = addend(0)
    for k in range(1, world):
        acc = add(acc, addend(k))
    return acc


def _as_rank_arrays(per_rank: object, what: str = "per_rank", key: str | None = None) -> list[np.ndarray]:
    """One real array per rank, all of one shape; ``key``: the arrays are ``what[i][key]`` (a gradient
    dict per rank), and the messages name them so."""
    if isinstance(per_rank, np.ndarray) or not isinstance(per_rank, (list, tuple)):
        raise TypeError(f"{what} must be a list (or tuple) of arrays, one per rank, got {type(per_rank).__name__}")
    if len(per_rank) == 0:
        raise ValueError(f"{what} must hold at least one rank's array, got an empty {type(per_rank).__name__}")
    out = []
    for i, a in enumerate(per_rank):
        item = f"{what}[{i}]" if key is None else f"{what}[{i}][{key!r}]"
        if isinstance(a, np.ma.MaskedArray):  # np.asarray drops the mask: masked values would be summed
            raise TypeError(f"{item} is a masked array (its mask would be ignored); pass "
                            f"{item}.filled(0) to reduce the masked entries as zeros")
        arr = np.asarray(host_array(a, item))   # torch/JAX tensors of every float dtype, exactly
        if arr.dtype.kind == "V" and arr.dtype.names is None and arr.dtype.itemsize <= 2:
            try:  # an ml_dtypes float (bfloat16, float8, ...): exactly, in the float64 carrier of non-fp32 input
                arr = arr.astype(np.float64)
            except (TypeError, ValueError):
                pass
        if arr.dtype.kind not in "fiu" or arr.dtype == np.bool_:
            raise TypeError(f"{item} must hold real numbers, got dtype {arr.dtype}")
        out.append(arr)
    shapes = {a.shape for a in out}
    if len(shapes) > 1:
        whose = what if key is None else f"{what}[...][{key!r}]"
        raise ValueError(f"{whose}: every rank's array must have the same shape, got {[a.shape for a in out]}")
    return out


def _parse(algorithm: object, wire: object, op: object, avg: object) -> tuple[str, Format, str, str]:
    alg = parse_name(algorithm, ALGORITHMS, "all-reduce algorithm")
    w = parse_name(wire, WIRES, "wire format")
    if alg == "gloo" and w not in _GLOO_WIRES:
        raise ValueError(f"gloo reduces fp32, bf16 and fp16 tensors, not wire={wire!r}; valid: "
                         f"{', '.join(_GLOO_WIRES)}")
    o = parse_name(op, _OPS, "all-reduce op")
    if avg is None:
        a = "postdiv" if alg == "gloo" else "premul"
    else:
        a = parse_name(avg, _AVG, "avg rule")
    return alg, as_format(w), o, a


@ieee_mode
def all_reduce(per_rank: Sequence[Any], *, algorithm: str = "ring", wire: str = "fp32", op: str = "sum",
               avg: str | None = None) -> list[np.ndarray]:
    """All-reduce one array per rank, in the order and precision a real collective uses.

    Parameters
    ----------
    per_rank : list of array_like
        One array per rank, all of the same shape (real numbers). Not modified.
    algorithm : {"ring", "tree", "halving-doubling", "direct", "gloo"}
        The reduction order (see the module docstring for each one's exact order).
    wire : {"fp32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2"}
        The format the data travel and are accumulated in: inputs are cast to it, every partial sum is
        rounded to it (FP8 saturating). ``"gloo"`` takes fp32, bf16, fp16.
    op : {"sum", "avg"}
    avg : {"premul", "postdiv"}, optional
        How ``op="avg"`` divides: ``"premul"`` multiplies every input by ``1/N`` rounded to the wire format
        before summing (NCCL ncclAvg, DDP); ``"postdiv"`` divides the sum by N (gloo via torch). Default:
        ``"postdiv"`` for gloo, ``"premul"`` otherwise.

    Returns
    -------
    list of numpy.ndarray
        One array per rank (every algorithm here leaves all ranks with the same bits), each a fresh
        array: float32 for float32 inputs, float64 carriers otherwise, holding wire-format values.

    Examples
    --------
    >>> import numpy as np
    >>> ranks = [np.float32([1.0, 3.0]), np.float32([2.0**-8, 0.0]), np.float32([2.0**-8, 0.0])]
    >>> out = all_reduce(ranks, algorithm="direct", wire="bf16")
    >>> len(out), float(out[0][0])          # (1 + 2^-8) ties back to 1 in BF16, twice
    (3, 1.0)
    >>> float(all_reduce(ranks, algorithm="tree", wire="bf16")[2][0])   # (1 + 2^-8) + 2^-8
    1.0
    >>> float(all_reduce(ranks, algorithm="ring", wire="bf16")[0][0])  # chunk 0: (2^-8 + 2^-8) + 1
    1.0078125
    >>> float(all_reduce(ranks, op="avg", algorithm="gloo")[0][1])
    1.0
    """
    arrays = _as_rank_arrays(per_rank)
    alg, fmt, o, a = _parse(algorithm, wire, op, avg)
    world = len(arrays)
    shape = arrays[0].shape
    out_dtype = np.float32 if all(x.dtype == np.float32 for x in arrays) else np.float64
    with np.errstate(over="ignore", invalid="ignore"):
        X = np.stack([_to_wire(x.reshape(-1), fmt) for x in arrays])  # (world, n), a new array
        if o == "avg" and a == "premul":
            m = _to_wire(np.float64(1.0) / world, fmt)
            X = _to_wire(X * m, fmt)
        R = _reduce(X, alg, fmt)
        if o == "avg" and a == "postdiv":
            R = _to_wire(R / np.float32(world), fmt)
    R = R.reshape(shape).astype(out_dtype)
    return [R.copy() for _ in range(world)]


@ieee_mode
def reduction_order(world_size: int, algorithm: str = "ring", *, n: int = 1, index: int = 0,
                    wire: str = "fp32") -> SumTree:
    """The order in which ``algorithm`` adds the ranks' values at element ``index`` of an n-vector.

    A :class:`~fpsim.accumulate.SumTree` over rank indices (``tree.text()`` draws it; SumTree writes each
    addition's operands in a canonical order, as addition commutes); the ring algorithms'
    order depends on the element's chunk, gloo's also on ``n`` and the wire format's width.

    Examples
    --------
    >>> print(reduction_order(4, "halving-doubling").root)
    ((0, 2), (1, 3))
    >>> print(reduction_order(4, "ring", n=8, index=0).root, reduction_order(4, "gloo", n=8, index=0).root)
    (0, ((1, 2), 3)) (0, (1, (2, 3)))
    """
    world = check_int(world_size, "world_size", lo=1)
    alg = parse_name(algorithm, ALGORITHMS, "all-reduce algorithm")
    n = check_int(n, "n", lo=1)
    index = check_int(index, "index", lo=0, hi=n - 1)
    fmt = as_format(parse_name(wire, WIRES, "wire format"))
    if world == 1:
        return SumTree(0)
    nodes: list[Any] = list(range(world))
    if alg in ("tree", "halving-doubling"):
        levels, root = _pair_levels(world, alg)
        for dst, src in levels:
            for d, s in zip(dst, src):
                nodes[d] = (nodes[d], nodes[s])
        return SumTree(nodes[root])
    order = _sequential_orders(n, world, alg, fmt.width // 8)[:, index]
    acc: Any = int(order[0])
    for k in range(1, world):
        acc = (acc, int(order[k]))
    return SumTree(acc)


@ieee_mode
def comm_bytes(n_elements: int, world_size: int, *, algorithm: str = "ring", wire: str = "fp32") -> float:
    """Bytes each rank sends (mean over ranks) for one all-reduce of ``n_elements`` values.

    ring, gloo and tree (reduce + broadcast): ``2 (N - 1) / N * n * b``; halving-doubling:
    ``2 ((p - 1) n + (N - p) n) / N * b`` with p the largest power of two <= N (the folded ranks send their
    vector in and get the result back); direct: ``(N - 1) n b``. b is the wire format's width in bytes.

    >>> comm_bytes(1000, 4), comm_bytes(1000, 4, wire="bf16"), comm_bytes(1000, 4, algorithm="direct")
    (6000.0, 3000.0, 12000.0)
    """
    n = check_int(n_elements, "n_elements", lo=0)
    world = check_int(world_size, "world_size", lo=1)
    alg = parse_name(algorithm, ALGORITHMS, "all-reduce algorithm")
    b = as_format(parse_name(wire, WIRES, "wire format")).width / 8
    if world == 1:
        return 0.0
    if alg == "direct":
        return float((world - 1) * n * b)
    if alg == "halving-doubling":
        p = 1 << (world.bit_length() - 1)
        return float(2 * ((p - 1) * n + (world - p) * n) / world * b)
    return float(2 * (world - 1) * n / world * b)


# ---------------------------------------------------------------------------------------------- DDP buckets
@ieee_mode
def ddp_buckets(params: Mapping[str, Any], *, bucket_cap_mb: float = 25, first_bucket_mb: float = 1,
                element_size: int = 4) -> list[list[str]]:
    """The gradient buckets torch's DDP reduces in steady state: names, in reverse parameter order.

    DDP's reducer rebuilds its buckets after the first iteration in the order gradients become ready
    (the reverse of the order parameters are defined) with the size limits ``[first, cap]``
    (``dist._DEFAULT_FIRST_BUCKET_BYTES`` = 1 MiB, ``bucket_cap_mb`` = 25 MiB by default):
    parameters are appended to the open bucket and it closes as soon as its size reaches the current
    limit; after the first bucket the limit is the cap (``compute_bucket_assignment_by_size`` in
    torch/csrc/distributed/c10d/reducer.cpp). Each bucket is flattened, all-reduced, unflattened.

    ``params``: name -> array (or shape tuple); ``element_size``: bytes per gradient element.

    >>> import numpy as np
    >>> p = {"a": (300_000,), "b": (100,), "c": (200_000,)}
    >>> ddp_buckets(p, bucket_cap_mb=2)              # c and b fill the first (1 MiB) bucket
    [['c', 'b', 'a']]
    >>> ddp_buckets(p, bucket_cap_mb=1, first_bucket_mb=0.5)
    [['c'], ['b', 'a']]
    """
    if not isinstance(params, Mapping):
        raise TypeError(f"params must be a mapping of name -> array or shape, got {type(params).__name__}")
    cap = check_real(bucket_cap_mb, "bucket_cap_mb", lo=0.0, lo_open=True)
    first = check_real(first_bucket_mb, "first_bucket_mb", lo=0.0, lo_open=True)
    es = check_int(element_size, "element_size", lo=1)
    limits = [int(first * _MIB), int(cap * _MIB)]
    buckets: list[list[str]] = []
    cur: list[str] = []
    size = 0
    li = 0
    for name in reversed(list(params)):
        v = params[name]
        numel = math.prod(v) if isinstance(v, tuple) else int(np.size(v))
        cur.append(name)
        size += numel * es
        if size >= limits[li]:
            buckets.append(cur)
            cur, size = [], 0
            li = min(li + 1, len(limits) - 1)
    if cur:
        buckets.append(cur)
    return buckets


@ieee_mode
@dataclass
class GradCompressor:
    """Gradient compression on the wire: a low-precision format with a per-bucket scale, optionally with
    error feedback (each rank keeps what its quantization lost and adds it to the next step's gradient).

    Per bucket and step, every rank computes its ``amax``; the ranks agree on the maximum (a one-value
    max all-reduce, exact); the scale is the power of two ``2**floor(log2(fmt.max / (N * amax)))`` so that
    no partial sum of the N scaled contributions overflows (1 for BF16, which has FP32's range). Each rank
    sends ``round(g * scale)`` in ``fmt``; the all-reduce rounds every partial sum to ``fmt`` (FP8
    saturating), and the result is divided by the scale. With ``error_feedback`` the residual
    ``(g + e) - round((g + e) * scale) / scale`` is kept per rank and bucket (the local quantization
    error; the rounding of partial sums on the way is not any one rank's and is not fed back).
    ``scaling=False`` sends the values unscaled (scale 1): small gradients underflow in FP8.
    ``op="avg"`` (the default of :meth:`reduce`) first multiplies by ``1/N`` in FP32, as DDP does.

    >>> import numpy as np
    >>> g = [np.float32([1e-3, 3e-6]), np.float32([1e-3, 3e-6])]
    >>> [float(v) for v in GradCompressor("fp8_e4m3").reduce(g, 0)]       # the mean, to 3 bits
    [0.0009765625, 3.0994415283203125e-06]
    >>> GradCompressor("fp8_e4m3", scaling=False).reduce(g, 0).tolist()  # both below E4M3's 2^-10
    [0.0, 0.0]
    """

    fmt: str = "bf16"
    error_feedback: bool = False
    scaling: bool = True

    def __post_init__(self) -> None:
        self.fmt = parse_name(self.fmt, ("bf16", "fp16", "fp8_e4m3", "fp8_e5m2"), "compression format")
        self.error_feedback = check_bool(self.error_feedback, "GradCompressor.error_feedback")
        self.scaling = check_bool(self.scaling, "GradCompressor.scaling")
        self.residual: dict[tuple[int, int], np.ndarray] = {}

    def reset(self) -> None:
        self.residual.clear()

    def _scale(self, amax: float, world: int) -> float:
        f = as_format(self.fmt)
        if not self.scaling or self.fmt == "bf16" or amax == 0.0 or not math.isfinite(amax):
            return 1.0
        return float(2.0 ** math.floor(math.log2(f.max / (world * amax))))

    def reduce(self, per_rank: list[np.ndarray], bucket: int, *, algorithm: str = "ring",
               op: str = "avg") -> np.ndarray:
        """The all-reduced bucket (float32) from one flat float32 vector per rank."""
        vals = [np.asarray(g, dtype=np.float32).reshape(-1) for g in _as_rank_arrays(per_rank)]
        op = parse_name(op, _OPS, "all-reduce op")
        world = len(vals)
        fmt = as_format(self.fmt)
        if op == "avg":  # DDP: grad * (1/N) in fp32 before the SUM
            inv = np.float32(1.0 / world)
            vals = [v * inv for v in vals]
        if self.error_feedback:  # the residual lives in the units sent
            vals = [v + self.residual.get((r, bucket), np.float32(0)) for r, v in enumerate(vals)]
        with np.errstate(invalid="ignore"):
            amax = float(max(np.max(np.abs(v), initial=0.0) for v in vals))
        s = np.float32(self._scale(amax, world))
        q = [_to_wire(v * s, fmt) for v in vals]
        if self.error_feedback:
            for r, (v, qr) in enumerate(zip(vals, q)):
                self.residual[(r, bucket)] = v - qr / s
        out = all_reduce(q, algorithm=algorithm, wire=self.fmt, op="sum")[0]
        return np.asarray(out / s, dtype=np.float32)

    def wire_bytes(self, n: int, world: int, algorithm: str = "ring") -> float:
        """Bytes per rank for one bucket: the payload plus the scale exchange (4-byte amax all-reduce)."""
        extra = 0.0 if self.fmt == "bf16" or not self.scaling else comm_bytes(1, world, algorithm=algorithm, wire="fp32")
        return comm_bytes(n, world, algorithm=algorithm, wire=self.fmt) + extra


@ieee_mode
def ddp_all_reduce(per_rank_grads: Sequence[Mapping[str, Any]], *, algorithm: str = "ring", wire: str = "fp32",
                   op: str = "avg", bucket_cap_mb: float = 25, first_bucket_mb: float = 1,
                   compressor: GradCompressor | None = None) -> dict[str, np.ndarray]:
    """Reduce per-rank gradient dicts as DDP does: bucket (:func:`ddp_buckets`), flatten, all-reduce,
    unflatten. ``op="avg"`` is DDP's ``grad * (1/N)`` (FP32) before a SUM in the wire format. With a
    ``compressor`` the buckets travel compressed (``wire`` is then the compressor's format).

    >>> import numpy as np
    >>> g = [{"w": np.float32([1.0, 2.0]), "b": np.float32([4.0])} for _ in range(4)]
    >>> out = ddp_all_reduce(g)
    >>> out["w"].tolist(), out["b"].tolist()
    ([1.0, 2.0], [4.0])
    """
    if isinstance(per_rank_grads, Mapping) or not isinstance(per_rank_grads, (list, tuple)) or not per_rank_grads:
        raise TypeError("per_rank_grads must be a non-empty list of name -> gradient mappings, one per rank")
    names = list(per_rank_grads[0])
    for r, g in enumerate(per_rank_grads):
        if not isinstance(g, Mapping) or list(g) != names:
            raise ValueError(f"per_rank_grads[{r}] must have the same names as rank 0: {names}")
    o = parse_name(op, _OPS, "all-reduce op")
    world = len(per_rank_grads)
    # Each parameter's gradients checked across ranks as all_reduce checks one array (kind, mask, shape):
    # flattened into buckets, a transposed or masked gradient would otherwise be reduced silently.
    grads = {k: _as_rank_arrays([g[k] for g in per_rank_grads], "per_rank_grads", k) for k in names}
    shapes = {k: grads[k][0].shape for k in names}
    out: dict[str, np.ndarray] = {}
    for b, bucket in enumerate(ddp_buckets(shapes, bucket_cap_mb=bucket_cap_mb, first_bucket_mb=first_bucket_mb)):
        with np.errstate(over="ignore"):  # float64 beyond float32's range: +-inf, as a .float() cast
            flat = [np.concatenate([np.asarray(grads[k][r], dtype=np.float32).reshape(-1) for k in bucket])
                    for r in range(world)]
        if compressor is not None:
            red = compressor.reduce(flat, b, algorithm=algorithm, op=o)
        else:
            if o == "avg":
                inv = np.float32(1.0 / world)
                flat = [f * inv for f in flat]
            red = all_reduce(flat, algorithm=algorithm, wire=wire, op="sum")[0]
        i = 0
        for k in bucket:
            m = int(np.prod(shapes[k]))
            out[k] = red[i:i + m].reshape(shapes[k]).copy()
            i += m
    return {k: out[k] for k in names}


# ---------------------------------------------------------------------------------------------- the trainer
@ieee_mode
class DataParallelTrainer(Trainer):
    """A :class:`~fpsim.train.Trainer` whose step runs ``world_size`` data-parallel ranks.

    The step's global batch (``config.batch_size`` sequences, the same batch a single-process run sees)
    is split into ``world_size`` equal per-rank micro-batches; each rank runs forward and backward on its
    own (loss = the mean over its tokens, as each DDP replica computes it), its gradients are reduced by
    :func:`ddp_all_reduce` (DDP buckets, ``grad * (1/N)`` then a SUM by ``algorithm`` in ``wire``, or
    compressed by ``compressor``), and the one reduced gradient goes through the policy's unscale and
    optimizer as in :meth:`Trainer.step`. ``world_size=1`` is bit-identical to :class:`Trainer`. The
    logged loss is the mean of the ranks' losses. ``wire_bytes`` counts the bytes each rank sent so far.
    An inf or NaN in any rank's own gradient skips the step (checked before a saturating FP8 compression
    could hide it). Not in checkpoints: the compressor's residuals and ``wire_bytes`` (a resumed run with
    error feedback starts with zero residuals).

    >>> from fpsim.nn import GPTConfig
    >>> cfg = TrainConfig(task="reverse", task_kwargs={"n_symbols": 5, "length": 3}, steps=2, batch_size=4,
    ...                   model=GPTConfig(vocab_size=6, block_size=6, n_layer=1, n_head=2, n_embd=8))
    >>> tr = DataParallelTrainer("fp32", cfg, world_size=2, wire="bf16")
    >>> h = tr.run(progress=False)
    >>> len(h["loss"]), tr.wire_bytes > 0
    (2, True)
    """

    def __init__(self, policy: Policy | str, config: TrainConfig, *, world_size: int = 2,
                 algorithm: str = "ring", wire: str = "fp32", compressor: GradCompressor | None = None,
                 bucket_cap_mb: float = 25, first_bucket_mb: float = 1, **kwargs: Any) -> None:
        super().__init__(policy, config, **kwargs)
        self.world_size = check_int(world_size, "world_size", lo=1)
        if config.batch_size % self.world_size:
            raise ValueError(f"batch_size {config.batch_size} must be a multiple of world_size {self.world_size}")
        if config.micro_batches != 1:
            raise ValueError(f"DataParallelTrainer splits the batch itself; micro_batches must be 1, "
                             f"got {config.micro_batches}")
        if getattr(config, "fused", False):
            # its step all-reduces the gradients and then applies the unfused optimizer's updates; a fused
            # step would bypass the reduction, so refuse here rather than at the first step
            raise ValueError("DataParallelTrainer does not support TrainConfig(fused=True) yet; use fused=False")
        self.algorithm, fmt, _, _ = _parse(algorithm, wire, "avg", None)
        self.wire = fmt.name
        if compressor is not None and not isinstance(compressor, GradCompressor):
            raise TypeError(f"compressor must be a GradCompressor or None, got {type(compressor).__name__}")
        self.compressor = compressor
        self.bucket_cap_mb = check_real(bucket_cap_mb, "bucket_cap_mb", lo=0.0, lo_open=True)
        self.first_bucket_mb = check_real(first_bucket_mb, "first_bucket_mb", lo=0.0, lo_open=True)
        self.wire_bytes = 0.0

    def _bytes(self, grads: Mapping[str, np.ndarray]) -> float:
        world = self.world_size
        shapes = {k: np.shape(v) for k, v in grads.items()}
        total = 0.0
        for bucket in ddp_buckets(shapes, bucket_cap_mb=self.bucket_cap_mb, first_bucket_mb=self.first_bucket_mb):
            n = sum(int(np.prod(shapes[k])) for k in bucket)
            if self.compressor is not None:
                total += self.compressor.wire_bytes(n, world, self.algorithm)
            else:
                total += comm_bytes(n, world, algorithm=self.algorithm, wire=self.wire)
        return total

    @single_threaded()  # BLAS at one thread: the same bits at any thread count (fpsim/_blas.py)
    def step(self) -> dict[str, Any]:
        """One data-parallel training step; returns its row of telemetry."""
        cfg, pol, rt = self.config, self.policy, self.runtime
        s, rec, hist = self._begin_step()
        x, y = self.batch(s)
        scale = self.scaler.scale
        world = self.world_size
        per = cfg.batch_size // world
        rank_grads: list[dict[str, np.ndarray]] = []
        losses: list[float] = []
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            for r in range(world):
                xr, yr = x[r * per:(r + 1) * per], y[r * per:(r + 1) * per]
                _, loss_arr, cache = gpt_forward(self.store.weights, self.model, xr, yr, prec=rt)
                g = gpt_backward(np.float32(scale), cache)
                if pol.master is None:
                    g = {k: rt.cast(v, pol.gradients) for k, v in g.items()}
                rank_grads.append(g)
                losses.append(float(np.asarray(loss_arr)))
            # Every rank's GradScaler sees its own inf/NaN before the (possibly saturating) compression.
            local_inf = any(not np.all(np.isfinite(v)) for g in rank_grads for v in g.values())
            if world == 1:
                grads = rank_grads[0]
            else:
                grads = ddp_all_reduce(rank_grads, algorithm=self.algorithm, wire=self.wire, op="avg",
                                       bucket_cap_mb=self.bucket_cap_mb, first_bucket_mb=self.first_bucket_mb,
                                       compressor=self.compressor)
                self.wire_bytes += self._bytes(grads)
            grads, found_inf = self.scaler.unscale(grads)
            found_inf = found_inf or local_inf
        loss = losses[0] if world == 1 else float(np.mean(losses))
        return self._finish_step(s, grads, found_inf, loss, scale, rec, hist)
