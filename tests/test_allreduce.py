"""fpsim.train.all_reduce and the DDP pieces, against naive message-passing simulations whose additions are
rounded by NumPy/ml_dtypes casts (an oracle independent of fpsim.round and of the vectorised schedules)."""

from __future__ import annotations

import math
from typing import Any, Callable

import ml_dtypes
import numpy as np
import pytest

from fpsim.nn import GPTConfig
from fpsim.train import DataParallelTrainer, GradCompressor, TrainConfig, Trainer, all_reduce, ddp_all_reduce
from fpsim.train.parallel import ALGORITHMS, comm_bytes, ddp_buckets, reduction_order

DTYPES = {"fp32": np.float32, "bf16": ml_dtypes.bfloat16, "fp16": np.float16,
          "fp8_e4m3": ml_dtypes.float8_e4m3fn, "fp8_e5m2": ml_dtypes.float8_e5m2}


def _caster(wire: str) -> Callable[[np.ndarray], np.ndarray]:
    dt = DTYPES[wire]
    if wire.startswith("fp8"):
        mx = float(ml_dtypes.finfo(dt).max)
        return lambda a: np.clip(np.asarray(a, np.float32), -mx, mx).astype(dt).astype(np.float32)
    return lambda a: np.asarray(a, np.float32).astype(dt).astype(np.float32)


def _add(wire: str) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    c = _caster(wire)
    return lambda a, b: c(a.astype(np.float64) + b.astype(np.float64))


# ---- naive simulations: every rank's buffer, every message ---------------------------------------------
def naive_ring_nccl(X: np.ndarray, add: Any) -> np.ndarray:
    N, n = X.shape
    size = -(-n // N)
    bounds = [(c * size, min((c + 1) * size, n)) for c in range(N)]
    buf = [X[r].copy() for r in range(N)]
    for s in range(N - 1):  # reduce-scatter: at step s rank r sends chunk r-1-s to rank r+1
        msgs = [(r, (r - 1 - s) % N, buf[r][slice(*bounds[(r - 1 - s) % N])].copy()) for r in range(N)]
        for r, c, data in msgs:
            dst, sl = (r + 1) % N, slice(*bounds[c])
            buf[dst][sl] = add(data, buf[dst][sl])
    out = np.empty(n, np.float32)
    for c in range(N):  # chunk c is complete on rank c; all-gather copies
        out[slice(*bounds[c])] = buf[c][slice(*bounds[c])]
    return out


def naive_gloo(X: np.ndarray, add: Any, elem: int) -> np.ndarray:
    """gloo/allreduce.cc ring(), its reduce-scatter loop over segment offsets replayed literally."""
    N, n = X.shape
    total = n * elem
    max_seg = elem * max(1, (1 << 20) // elem)
    nseg = max((total + max_seg - 1) // max_seg, 2 * N)
    nseg = ((nseg + N - 1) // N) * N
    nspr = nseg // N
    seg_bytes = ((total + nseg - 1) // nseg + elem - 1) // elem * elem
    seg = seg_bytes // elem
    buf = [X[r].copy() for r in range(N)]
    for i in range(nseg - nspr):
        msgs = []
        for r in range(N):
            off = (((r + 1) * nspr + i) * seg) % (nseg * seg)
            length = min(seg, n - off)
            if length > 0:
                msgs.append(((r - 1) % N, off, buf[r][off:off + length].copy()))
        for dst, off, data in msgs:  # received from rank dst + 1; reduced into dst's own buffer
            buf[dst][off:off + len(data)] = add(buf[dst][off:off + len(data)], data)
    out = np.empty(n, np.float32)
    for r in range(N):  # rank r owns segments r*nspr ... (r+1)*nspr - 1
        lo, hi = r * nspr * seg, min((r + 1) * nspr * seg, n)
        if lo < hi:
            out[lo:hi] = buf[r][lo:hi]
    return out


def naive_tree(X: np.ndarray, add: Any) -> np.ndarray:
    N = X.shape[0]
    buf = [X[r].copy() for r in range(N)]
    mask = 1
    while mask < N:  # binomial reduce: a rank with this bit set sends to rank - mask and stops
        for r in range(N):
            if r % (2 * mask) == mask:
                buf[r - mask] = add(buf[r - mask], buf[r])
        mask *= 2
    return buf[0]


def naive_halving_doubling(X: np.ndarray, add: Any) -> np.ndarray:
    N, n = X.shape
    p = 1 << (N.bit_length() - 1)
    rem = N - p
    buf = [X[r].copy() for r in range(N)]
    for i in range(rem):  # fold: even rank 2i sends its vector to 2i+1
        buf[2 * i + 1] = add(buf[2 * i], buf[2 * i + 1])
    real = [2 * i + 1 for i in range(rem)] + list(range(2 * rem, N))
    lo = [0] * p
    hi = [n] * p
    d = p // 2
    while d >= 1:  # recursive halving: partners at distance d split their current range
        new = [b.copy() for b in buf]
        for v in range(p):
            u = v ^ d
            mid = (lo[v] + hi[v]) // 2
            keep = slice(lo[v], mid) if not v & d else slice(mid, hi[v])
            new[real[v]][keep] = add(buf[real[v]][keep], buf[real[u]][keep])
        for v in range(p):
            mid = (lo[v] + hi[v]) // 2
            lo[v], hi[v] = (lo[v], mid) if not v & d else (mid, hi[v])
        buf = new
        d //= 2
    out = np.empty(n, np.float32)
    for v in range(p):
        out[lo[v]:hi[v]] = buf[real[v]][lo[v]:hi[v]]
    return out


def naive_direct(X: np.ndarray, add: Any) -> np.ndarray:
    acc = X[0].copy()
    for r in range(1, X.shape[0]):
        acc = add(acc, X[r])
    return acc


def naive(X: np.ndarray, algorithm: str, wire: str) -> np.ndarray:
    add = _add(wire)
    X = _caster(wire)(X)
    if X.shape[0] == 1:
        return X[0]
    if algorithm == "ring":
        return naive_ring_nccl(X, add)
    if algorithm == "gloo":
        return naive_gloo(X, add, np.dtype(DTYPES[wire]).itemsize)
    if algorithm == "tree":
        return naive_tree(X, add)
    if algorithm == "halving-doubling":
        return naive_halving_doubling(X, add)
    return naive_direct(X, add)


def mixed(N: int, n: int, seed: int, span: int = 20) -> np.ndarray:
    rng = np.random.default_rng([seed, N, n])
    return (rng.standard_normal((N, n)) * np.exp2(rng.integers(-span, span + 1, (N, n)))).astype(np.float32)


def bits(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, np.float32).view(np.uint32)


@pytest.mark.parametrize("wire", ["fp32", "bf16", "fp16", "fp8_e5m2"])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("N", [1, 2, 3, 4, 5, 6, 7, 8])
def test_matches_naive_message_passing(N: int, algorithm: str, wire: str) -> None:
    if algorithm == "gloo" and wire.startswith("fp8"):
        pytest.skip("gloo has no fp8")
    span = {"fp16": 10, "fp8_e5m2": 6}.get(wire, 20)
    for n in (1, 5, 37, 1000):
        X = mixed(N, n, 3, span)
        got = all_reduce(list(X), algorithm=algorithm, wire=wire)
        want = naive(X, algorithm, wire)
        assert len(got) == N
        for r in range(N):
            bad = np.flatnonzero(bits(got[r]) != bits(want))
            assert bad.size == 0, (f"{algorithm} {wire} N={N} n={n} rank {r}: {bad.size} mismatches, first at "
                                   f"{bad[0]}: got {bits(got[r])[bad[0]]:#010x} want {bits(want)[bad[0]]:#010x}")


@pytest.mark.parametrize("N", [2, 3, pytest.param(8, marks=pytest.mark.slow)])
def test_gloo_segments_of_large_buffers(N: int) -> None:
    """Past 2N MiB gloo cuts more than 2N segments (1 MiB each at most): chunk edges move."""
    n = (2 * N + 1) * (1 << 18) + 13
    X = mixed(N, n, 5)
    assert np.array_equal(bits(all_reduce(list(X), algorithm="gloo")[0]), bits(naive(X, "gloo", "fp32")))


def test_orders_differ_and_order_trees() -> None:
    X = mixed(8, 4000, 9)
    outs = {a: bits(all_reduce(list(X), algorithm=a)[0]) for a in ALGORITHMS}
    for a in ALGORITHMS:
        for b in ALGORITHMS:
            if a < b:
                assert np.count_nonzero(outs[a] != outs[b]) > 0, (a, b)
    assert reduction_order(8, "halving-doubling").root == (((0, 4), (2, 6)), ((1, 5), (3, 7)))
    assert reduction_order(8, "tree").root == (((0, 1), (2, 3)), ((4, 5), (6, 7)))
    # the order tree replays the vectorised result: fpsim.sum over the ranks in that tree
    import fpsim
    for a in ALGORITHMS:
        for j in (0, 1999, 3999):
            t = reduction_order(8, a, n=4000, index=j)
            assert bits(fpsim.sum(X[:, j], "fp32", order=t)) == outs[a][j], (a, j)


def test_avg_rules() -> None:
    X = mixed(3, 500, 11)
    inv_bf16 = float(np.float32(1 / 3).astype(ml_dtypes.bfloat16))
    c = _caster("bf16")
    pre = naive(c(c(X) * np.float32(inv_bf16)), "ring", "bf16")  # premul by the BF16-rounded 1/3 (NCCL)
    got = all_reduce(list(X), algorithm="ring", wire="bf16", op="avg")[0]
    assert np.array_equal(bits(got), bits(pre))
    post = c(naive(X, "gloo", "bf16") / np.float32(3))               # SUM then divide (gloo via torch)
    assert np.array_equal(bits(all_reduce(list(X), algorithm="gloo", wire="bf16", op="avg")[0]), bits(post))
    assert np.array_equal(bits(all_reduce(list(X), algorithm="ring", wire="bf16", op="avg", avg="postdiv")[0]),
                          bits(c(naive(X, "ring", "bf16") / np.float32(3))))
    # fp32: premul by fl32(1/3), rounded products
    pre32 = naive((X * np.float32(1 / 3)).astype(np.float32), "tree", "fp32")
    assert np.array_equal(bits(all_reduce(list(X), algorithm="tree", op="avg")[0]), bits(pre32))


def test_bf16_wire_loses_more_than_fp32() -> None:
    X = mixed(8, 20000, 13).astype(np.float64)
    exact = X.sum(axis=0)
    e32 = np.abs(all_reduce(list(X.astype(np.float32)), wire="fp32")[0] - exact) / np.abs(exact)
    e16 = np.abs(all_reduce(list(X.astype(np.float32)), wire="bf16")[0] - exact) / np.abs(exact)
    assert np.median(e16) > 100 * np.median(e32)


def test_inputs_not_modified_and_fresh_outputs() -> None:
    X = [np.array([1.5, -2.0, 3.25], np.float32).reshape(3, 1) for _ in range(3)]
    copies = [x.copy() for x in X]
    out = all_reduce(X, wire="bf16", op="avg")
    for x, cp in zip(X, copies):
        assert np.array_equal(x, cp)
    assert out[0].shape == (3, 1) and out[0].dtype == np.float32
    out[0][0, 0] = 99
    assert out[1][0, 0] != 99
    assert all_reduce([np.array([1.0]), np.array([2.0])])[0].dtype == np.float64
    assert all_reduce([[1, 2], [3, 4]], algorithm="direct")[0].tolist() == [4.0, 6.0]


@pytest.mark.parametrize("kwargs, exc, match", [
    ({"algorithm": "butterfly"}, ValueError, "valid: ring, tree, halving-doubling, direct, gloo"),
    ({"wire": "fp64"}, ValueError, "valid: fp32, bf16, fp16"),
    ({"op": "max"}, ValueError, "valid: sum, avg"),
    ({"avg": "half"}, ValueError, "valid: premul, postdiv"),
    ({"algorithm": "gloo", "wire": "fp8_e4m3"}, ValueError, "gloo reduces fp32, bf16 and fp16"),
    ({"algorithm": 3}, TypeError, "must be a string"),
])
def test_bad_options(kwargs: dict[str, Any], exc: type[Exception], match: str) -> None:
    with pytest.raises(exc, match=match):
        all_reduce([np.zeros(2, np.float32)] * 2, **kwargs)


def test_bad_inputs() -> None:
    with pytest.raises(TypeError, match="list"):
        all_reduce(np.zeros((2, 3), np.float32))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one"):
        all_reduce([])
    with pytest.raises(ValueError, match="same shape"):
        all_reduce([np.zeros(2), np.zeros(3)])
    with pytest.raises(TypeError, match="real numbers"):
        all_reduce([np.zeros(2, complex)] * 2)
    with pytest.raises(TypeError, match="real numbers"):
        all_reduce([np.zeros(2, bool)] * 2)


def test_comm_bytes() -> None:
    for N in (2, 3, 4, 8):
        assert comm_bytes(1 << 20, N) == 2 * (N - 1) / N * 4 * (1 << 20)
        assert comm_bytes(1 << 20, N, wire="bf16") == comm_bytes(1 << 20, N) / 2
        assert comm_bytes(1 << 20, N, wire="fp8_e4m3") == comm_bytes(1 << 20, N) / 4
    assert comm_bytes(100, 1) == 0.0
    assert comm_bytes(100, 6, algorithm="halving-doubling") == 2 * (3 * 100 + 2 * 100) / 6 * 4


@pytest.mark.slow  # importing torch takes seconds
@pytest.mark.torch
def test_ddp_buckets_match_torch() -> None:
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    rng = np.random.default_rng(0)
    sizes = [int(s) for s in rng.integers(1, 400_000, 40)]
    ts = [torch.empty(s) for s in sizes]
    for cap in (1, 2, 25):
        want, _ = dist._compute_bucket_assignment_by_size(list(reversed(ts)), [1 << 20, cap << 20],
                                                          [False] * len(ts), list(range(len(ts))))
        got = ddp_buckets({f"p{i}": (s,) for i, s in enumerate(sizes)}, bucket_cap_mb=cap)
        assert got == [[f"p{len(ts) - 1 - j}" for j in b] for b in want], cap


def test_ddp_all_reduce_buckets_and_avg() -> None:
    rng = np.random.default_rng(1)
    shapes = {"a": (300, 700), "b": (5,), "c": (100_000,), "d": (3, 3)}
    grads = [{k: (rng.standard_normal(s) * 1e-3).astype(np.float32) for k, s in shapes.items()} for _ in range(4)]
    out = ddp_all_reduce(grads, algorithm="ring", wire="bf16", bucket_cap_mb=0.5, first_bucket_mb=0.25)
    assert list(out) == list(shapes)
    buckets = ddp_buckets(shapes, bucket_cap_mb=0.5, first_bucket_mb=0.25)
    assert len(buckets) > 1
    for bucket in buckets:  # each bucket is one flat all-reduce of grad * fl32(1/4)
        flat = [np.concatenate([g[k].ravel() for k in bucket]) * np.float32(0.25) for g in grads]
        red = all_reduce(flat, algorithm="ring", wire="bf16")[0]
        got = np.concatenate([out[k].ravel() for k in bucket])
        assert np.array_equal(bits(got), bits(red))


def test_compression_error_feedback_tracks_the_sum() -> None:
    rng = np.random.default_rng(2)
    g = [(rng.standard_normal(4096) * np.exp2(rng.integers(-12, 0, 4096))).astype(np.float32) for _ in range(4)]
    true = np.mean(np.stack(g).astype(np.float64), axis=0)
    errs = {}
    for ef in (False, True):
        comp = GradCompressor("fp8_e4m3", error_feedback=ef)
        acc = np.zeros(4096)
        steps = 32
        for _ in range(steps):
            acc += comp.reduce(g, 0)
        errs[ef] = float(np.linalg.norm(acc / steps - true) / np.linalg.norm(true))
    # Error feedback removes each rank's own quantization error; the FP8 rounding of the partial sums on
    # the ring is nobody's residual and stays.
    assert errs[True] < 0.75 * errs[False], errs
    one = {}
    for ef in (False, True):  # one rank: only local quantization, which error feedback averages away
        comp = GradCompressor("fp8_e4m3", error_feedback=ef)
        acc = np.zeros(4096)
        for _ in range(32):
            acc += comp.reduce(g[:1], 0)
        one[ef] = float(np.linalg.norm(acc / 32 - g[0]) / np.linalg.norm(g[0]))
    assert one[True] < one[False] / 8, one
    # bf16 compression = a bf16 wire with DDP's 1/N premultiply
    comp = GradCompressor("bf16")
    want = all_reduce([x * np.float32(0.25) for x in g], wire="bf16")[0]
    assert np.array_equal(bits(comp.reduce(g, 0)), bits(want))
    assert comp.wire_bytes(4096, 4) == comm_bytes(4096, 4, wire="bf16")
    with pytest.raises(ValueError, match="valid: bf16, fp16, fp8_e4m3, fp8_e5m2"):
        GradCompressor("int8")


def _cfg(**kw: Any) -> TrainConfig:
    base: dict[str, Any] = dict(task="reverse", task_kwargs={"n_symbols": 5, "length": 3}, steps=4, batch_size=8,
                                eval_every=0, telemetry_every=0,
                                model=GPTConfig(vocab_size=6, block_size=6, n_layer=1, n_head=2, n_embd=16))
    base.update(kw)
    return TrainConfig(**base)


def test_world_size_one_is_the_plain_trainer() -> None:
    a, b = Trainer("fp32", _cfg()), DataParallelTrainer("fp32", _cfg(), world_size=1)
    a.run(progress=False)
    b.run(progress=False)
    assert a.history["loss"] == b.history["loss"]
    for k in a.store.weights:
        assert np.array_equal(bits(a.store.weights[k]), bits(b.store.weights[k])), k
    assert b.wire_bytes == 0.0


def test_world_size_changes_the_bits_not_the_loss_much() -> None:
    runs = {N: DataParallelTrainer("fp32", _cfg(), world_size=N) for N in (1, 2, 4)}
    for t in runs.values():
        t.run(progress=False)
    w1, w2, w4 = (runs[N].store.weights["wte"] for N in (1, 2, 4))
    assert not np.array_equal(w1, w2) and not np.array_equal(w2, w4)
    for N in (2, 4):
        assert abs(runs[N].history["loss"][-1] - runs[1].history["loss"][-1]) < 1e-3
    n_params = sum(v.size for v in runs[1].store.weights.values())
    assert runs[4].wire_bytes == pytest.approx(4 * comm_bytes(n_params, 4))  # 4 steps, one bucket


def test_trainer_options_checked() -> None:
    with pytest.raises(ValueError, match="multiple of world_size"):
        DataParallelTrainer("fp32", _cfg(batch_size=6), world_size=4)
    with pytest.raises(ValueError, match="micro_batches must be 1"):
        DataParallelTrainer("fp32", _cfg(micro_batches=2), world_size=2)
    with pytest.raises(ValueError, match="valid: ring"):
        DataParallelTrainer("fp32", _cfg(), world_size=2, algorithm="mesh")
    with pytest.raises(TypeError, match="GradCompressor"):
        DataParallelTrainer("fp32", _cfg(), world_size=2, compressor="bf16")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="fused=True"):   # before: a TypeError at the first step
        DataParallelTrainer("fp32", _cfg(fused=True), world_size=2)


def test_compressed_training_runs() -> None:
    t = DataParallelTrainer("fp32", _cfg(), world_size=2, compressor=GradCompressor("fp8_e4m3", error_feedback=True))
    t.run(progress=False)
    assert all(math.isfinite(v) for v in t.history["loss"])
    assert t.compressor is not None and len(t.compressor.residual) >= 2


@pytest.mark.parametrize("N", [3, 5, 8])
def test_reveal_order_finds_the_documented_orders(N: int) -> None:
    """fpsim.testing.reveal_order, treating all_reduce as a black box over one element per rank, finds the
    tree reduction_order documents (for element 0 of a 1-element vector)."""
    testing = pytest.importorskip("fpsim.testing")
    if not hasattr(testing, "reveal_order"):
        pytest.skip("fpsim.testing.reveal_order not in this checkout")
    for alg in ALGORITHMS:
        tree = testing.reveal_order(lambda x: all_reduce(list(x[:, None]), algorithm=alg)[0][0], N,
                                    dtype=np.float32)
        assert tree.root == reduction_order(N, alg).root, alg


def test_an_inf_on_one_rank_skips_the_step_even_through_saturating_fp8(monkeypatch: pytest.MonkeyPatch) -> None:
    import fpsim.train.parallel as par
    real = par.gpt_backward
    calls = [0]

    def backward(dloss: Any, cache: Any) -> dict[str, np.ndarray]:
        g = real(dloss, cache)
        calls[0] += 1
        if calls[0] == 2:  # rank 1 of the first step overflows
            g["wte"] = g["wte"].copy()
            g["wte"].flat[0] = np.inf
        return g

    monkeypatch.setattr(par, "gpt_backward", backward)
    t = DataParallelTrainer("fp16-mixed", _cfg(steps=2), world_size=2, compressor=GradCompressor("fp8_e4m3"))
    t.run(progress=False)
    assert t.history["skipped"] == [True, False]
    assert t.history["loss_scale"][1] < t.history["loss_scale"][0]
