"""The training step's fast paths give the bits of the plain code they replace (issue 30).

The layers (GELU, LayerNorm, softmax: forward and backward) write their operations into existing buffers,
AdamW's unfused update uses fewer temporaries, and :class:`fpsim.amp.PolicyRuntime` rounds float32 arrays with
the compiled kernel on a plan made once per format instead of through ``fpsim.round``'s entry. Each is
checked here against the code it replaces, bit for bit: the unit paths against the plain NumPy expressions
(written out below) on values that include signed zeros, subnormals, huge values, infinities and NaN, in
float32 and float64; the casts against ``fpsim.round`` (every mode the policies use, SR included: the same
draws and the same generator state after) and, for RNE, against ml_dtypes as an independent oracle; and whole
training runs with the fast paths switched off against the same runs with them on (weights, optimizer state
and the full telemetry history). Hashes of runs are not stored: the GEMMs' bits depend on the platform's BLAS.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

import fpsim.nn.layers as L
from fpsim import rounding
from fpsim.amp import AdamW, get_policy
from fpsim.formats import as_format
from fpsim.nn import GPTConfig
from fpsim.train import TrainConfig, Trainer

from _versions import NUMPY_NAN_BITS_DEPEND_ON_BUFFERS

_C = float(np.sqrt(2.0 / np.pi))


def _bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view(np.uint32 if a.dtype == np.float32 else np.uint64)


def _same(a: Any, b: Any) -> bool:
    """The same bits; NaNs as any NaN where the installed NumPy's NaN bits depend on the buffers used
    (tests/_versions.py: NumPy 1.x)."""
    a, b = np.asarray(a), np.asarray(b)
    if not (a.dtype == b.dtype and a.shape == b.shape):
        return False
    if NUMPY_NAN_BITS_DEPEND_ON_BUFFERS and a.dtype.kind == "f":
        na, nb = np.isnan(a), np.isnan(b)
        return bool(np.array_equal(na, nb) and np.array_equal(_bits(np.where(na, 0, a).astype(a.dtype)),
                                                             _bits(np.where(nb, 0, b).astype(b.dtype))))
    return bool(np.array_equal(_bits(a), _bits(b)))


def _values(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """Normal values over a wide exponent range, with signed zeros, subnormals, huge values, inf and NaN."""
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-12, 12, size=shape))
    x = x.astype(dtype)
    flat = x.reshape(-1)
    tiny = np.finfo(dtype).smallest_subnormal
    specials = np.array([0.0, -0.0, tiny, -tiny, 3 * tiny, np.finfo(dtype).max, -np.finfo(dtype).max, np.inf,
                         -np.inf, np.nan], dtype=dtype)
    pos = rng.choice(flat.size, size=min(flat.size, 4 * specials.size), replace=False)
    flat[pos] = np.resize(specials, pos.size)
    return x


# ------------------------------------------------------------------ the layers' plain expressions
def gelu_forward_ref(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    u = _C * (x + 0.044715 * (x * x * x))
    t = np.tanh(u)
    return 0.5 * x * (1.0 + t), t


def gelu_backward_ref(dout: np.ndarray, x: np.ndarray, t: np.ndarray) -> np.ndarray:
    du_dx = _C * (1.0 + 3 * 0.044715 * x * x)
    local = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du_dx
    return np.asarray(dout * local)


def layernorm_forward_ref(x: np.ndarray, g: np.ndarray, b: np.ndarray, eps: float) -> tuple[np.ndarray, ...]:
    mean = x.mean(axis=-1, keepdims=True)
    xc = x - mean
    var = (xc * xc).mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(var + np.asarray(eps, dtype=x.dtype))
    xhat = xc * rstd
    return xhat * g + b, xhat, rstd


def layernorm_backward_ref(dout: np.ndarray, xhat: np.ndarray, rstd: np.ndarray,
                           g: np.ndarray) -> tuple[np.ndarray, ...]:
    C = xhat.shape[-1]
    d2 = dout.reshape(-1, C)
    dg = (d2 * xhat.reshape(-1, C)).sum(axis=0)
    db = d2.sum(axis=0)
    dxhat = dout * g
    dx = rstd * (dxhat - dxhat.mean(axis=-1, keepdims=True) - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))
    return dx, dg, db


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(3, 5, 16), (7, 1), (1, 33), (2, 0, 4)])
def test_layers_match_the_plain_expressions(dtype: Any, shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng([30, len(shape), shape[-1], np.dtype(dtype).itemsize])
    x, d = _values(rng, shape, dtype), _values(rng, shape, dtype)
    C = shape[-1]
    g, b = _values(rng, (C,), dtype), _values(rng, (C,), dtype)
    with np.errstate(all="ignore"):
        y, (cx, t) = L.gelu_forward(x)
        y0, t0 = gelu_forward_ref(x)
        assert _same(y, y0) and _same(t, t0) and cx is x
        assert _same(L.gelu_backward(d, (x, t)), gelu_backward_ref(d, x, t0))
        out, (xhat, rstd, g_) = L.layernorm_forward(x, g, b, 1e-5)
        out0, xhat0, rstd0 = layernorm_forward_ref(x, g, b, 1e-5)
        assert _same(out, out0) and _same(xhat, xhat0) and _same(rstd, rstd0) and g_ is g
        for got, want in zip(L.layernorm_backward(d, (xhat, rstd, g)), layernorm_backward_ref(d, xhat0, rstd0, g)):
            assert _same(got, want)
        s, c = L.softmax_forward(x)
        e = np.exp(x - x.max(axis=-1, keepdims=True)) if C else x
        assert _same(s, e / e.sum(axis=-1, keepdims=True)) and c is s
        assert _same(L.softmax_backward(d, s), s * (d - (d * s).sum(axis=-1, keepdims=True)))


def test_layers_leave_their_inputs_alone() -> None:
    rng = np.random.default_rng(3001)
    x, d = _values(rng, (4, 8), np.float32), _values(rng, (4, 8), np.float32)
    g, b = _values(rng, (8,), np.float32), _values(rng, (8,), np.float32)
    keep = [a.copy() for a in (x, d, g, b)]
    with np.errstate(all="ignore"):
        _, gc = L.gelu_forward(x)
        L.gelu_backward(d, gc)
        _, lc = L.layernorm_forward(x, g, b)
        lc_copy = [a.copy() for a in lc]
        L.layernorm_backward(d, lc)
        s, sc = L.softmax_forward(x)
        s_copy = s.copy()
        L.softmax_backward(d, sc)
    assert all(_same(a, k) for a, k in zip((x, d, g, b), keep))
    assert all(_same(a, k) for a, k in zip(lc, lc_copy)) and _same(s, s_copy)


def test_mixed_dtypes_take_the_plain_path() -> None:
    rng = np.random.default_rng(3002)
    x = _values(rng, (3, 6), np.float64)
    d = _values(rng, (3, 6), np.float32)
    with np.errstate(all="ignore"):
        y, (_, t) = L.gelu_forward(x)
        assert _same(L.gelu_backward(d, (x, t)), gelu_backward_ref(d, x, t))  # float64 result, as before
        g32, b32 = np.ones(6, np.float32), np.zeros(6, np.float32)
        assert _same(L.layernorm_forward(x, g32, b32)[0], layernorm_forward_ref(x, g32, b32, 1e-5)[0])


# ------------------------------------------------------------------ AdamW
def adamw_updates_ref(state: dict[str, np.ndarray], grads: dict[str, np.ndarray], weights: dict[str, np.ndarray],
                      t: int, lr: float, b1: float, b2: float, eps: float, wd: float) -> dict[str, np.ndarray]:
    f = np.float32
    lr32, B1, B2 = f(lr), f(b1), f(b2)
    bc1, bc2, e = f(1.0 - b1 ** t), f(1.0 - b2 ** t), f(eps)
    out = {}
    for k, g in grads.items():
        m, v = state.get(f"m.{k}"), state.get(f"v.{k}")
        m = (f(1) - B1) * g if m is None else B1 * m + (f(1) - B1) * g
        v = (f(1) - B2) * g * g if v is None else B2 * v + (f(1) - B2) * g * g
        state[f"m.{k}"], state[f"v.{k}"] = m, v
        u = lr32 * ((m / bc1) / (np.sqrt(v / bc2) + e))
        if wd:
            u = u + lr32 * f(wd) * weights[k]
        out[k] = u.astype(f, copy=False)
    return out


@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_adamw_updates_match_the_plain_expressions(wd: float) -> None:
    rng = np.random.default_rng([3003, int(wd * 10)])
    opt = AdamW(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=wd)
    ref: dict[str, np.ndarray] = {}
    w = {"a": _values(rng, (5, 7), np.float32), "b": _values(rng, (3,), np.float32)}
    for step in range(1, 6):
        grads = {k: _values(rng, v.shape, np.float32) for k, v in w.items()}
        with np.errstate(all="ignore"):
            got = opt.updates(w, grads, lr=1e-3 * step)
            want = adamw_updates_ref(ref, grads, w, step, 1e-3 * step, 0.9, 0.95, 1e-8, wd)
        assert all(_same(got[k], want[k]) for k in w)
        assert all(_same(opt.state[k], ref[k]) for k in ref)
    held = opt.state_dict()
    before = {k: np.array(v) for k, v in held.items()}
    opt.updates(w, {k: np.ones_like(v) for k, v in w.items()})
    assert all(_same(held[k], before[k]) for k in held)  # a state_dict handed out keeps its values
    # resumed from a state_dict (moments gathered again), and the per-tensor loop (a moment cast that is not
    # the identity): the same bits as the plain expressions
    again = AdamW(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=wd)
    again.load_state_dict(held)
    looped = AdamW(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=wd, cast_state=lambda x: x)
    looped.load_state_dict(held)
    ref = {k: v for k, v in held.items() if k != "t"}
    grads = {k: _values(rng, v.shape, np.float32) for k, v in w.items()}
    with np.errstate(all="ignore"):
        want = adamw_updates_ref(ref, grads, w, 6, 1e-3, 0.9, 0.95, 1e-8, wd)
        for o in (again, looped):
            got = o.updates(w, grads, lr=1e-3)
            assert all(_same(got[k], want[k]) for k in w)
            assert all(_same(o.state[k], ref[k]) for k in ref)


# ------------------------------------------------------------------ casts
_FORMATS = ["bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "fp4_e2m1", "tf32", "e8m0"]


@pytest.mark.parametrize("policy", ["bf16-mixed", "fp16-mixed", "bf16-pure-sr", "fp8-hybrid"])
@pytest.mark.parametrize("fmt", _FORMATS)
def test_runtime_cast_matches_fpsim_round(policy: str, fmt: str) -> None:
    rng = np.random.default_rng([3004, _FORMATS.index(fmt)])
    pol = get_policy(policy)
    rt = pol.runtime(seed=5)
    ref_rng = np.random.default_rng(5) if pol.stochastic else None
    f = as_format(fmt)
    x = _values(rng, (37, 11), np.float32)
    for a in (x, x[:, ::2], x[3, 4], np.float32(x[0, 0]) * np.ones((), np.float32), x[:0]):
        with np.errstate(all="ignore"):
            got = rt.cast(a, f)
            want = np.asarray(rounding.round(a, f, pol.rounding, rng=ref_rng))
        assert _same(got, want), (policy, fmt, np.shape(a))
        if ref_rng is not None:
            assert rt.rng is not None and rt.rng.bit_generator.state == ref_rng.bit_generator.state
    buf = x.copy()
    with np.errstate(all="ignore"):
        got = rt._round32(buf, f, out=buf)  # in place, as the forward GEMM's own result is rounded
        want = np.asarray(rounding.round(x, f, pol.rounding, rng=ref_rng))
    assert got is buf and _same(buf, want)


@pytest.mark.parametrize("fmt,name", [("bf16", "bfloat16"), ("fp16", "float16"), ("fp8_e4m3", "float8_e4m3fn"),
                                      ("fp8_e5m2", "float8_e5m2")])
def test_runtime_cast_against_ml_dtypes(fmt: str, name: str) -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng([3005, len(name)])
    f = as_format(fmt)
    x = (rng.standard_normal(200_000) * np.exp2(rng.integers(-30, 20, size=200_000))).astype(np.float32)
    x = x[np.abs(x) < np.float32(f.max)]  # overflow rules differ by library; the rounding itself is compared
    rt = get_policy("bf16-mixed").runtime(seed=0)
    dt = np.float16 if name == "float16" else getattr(ml_dtypes, name)  # NumPy's own for fp16
    want = x.astype(dt).astype(np.float32)
    got = rt.cast(x, f)
    mismatches = int(np.count_nonzero(_bits(got) != _bits(want)))
    assert mismatches == 0, f"{mismatches} of {x.size} values differ from ml_dtypes {name}"


# ------------------------------------------------------------------ whole runs: fast paths off vs on
def _config(**kw: Any) -> TrainConfig:
    base: dict[str, Any] = {"task": "sort", "task_kwargs": {"n_symbols": 6, "length": 5}, "steps": 6, "batch_size": 8,
                            "eval_every": 0, "telemetry_every": 1, "histogram_every": 3,
                            "model": GPTConfig(vocab_size=7, block_size=10, n_layer=2, n_head=2, n_embd=16)}
    base.update(kw)
    return TrainConfig(**base)


def _run(policy: Any, cfg: TrainConfig) -> Trainer:
    tr = Trainer(policy, cfg)
    for _ in range(cfg.steps):
        tr.step()
    return tr


def _same_run(a: Trainer, b: Trainer) -> bool:
    ha = {k: v for k, v in a.history.data.items() if k != "wall_s"}
    hb = {k: v for k, v in b.history.data.items() if k != "wall_s"}
    sa, sb = a.optimizer.state_dict(), b.optimizer.state_dict()
    return (all(_same(a.store.weights[k], b.store.weights[k]) for k in a.store.weights)
            and sa.keys() == sb.keys() and all(_same(sa[k], sb[k]) for k in sa)
            and repr(ha) == repr(hb))


@pytest.mark.parametrize("policy,ckpt", [("fp32", "none"), ("bf16-mixed", "blocks"), ("fp16-mixed", "selective"),
                                         ("bf16-pure-sr", "none"), ("fp8-hybrid", "none")])
def test_training_runs_are_bit_identical_with_the_fast_paths_off(monkeypatch: pytest.MonkeyPatch, policy: str,
                                                                  ckpt: str) -> None:
    cfg = _config()
    cfg = replace(cfg, model=replace(cfg.model, checkpoint=ckpt))
    fast = _run(policy, cfg)
    from fpsim.amp import runtime as R

    monkeypatch.setattr(L, "_same_float", lambda *a: False)          # the layers' plain expressions
    monkeypatch.setattr(R.PolicyRuntime, "_plan32", lambda self, fmt: False)  # every cast through fpsim.round
    monkeypatch.setattr(R, "_owned32", lambda a: False)               # no in-place bias add or result rounding
    plain = _run(policy, cfg)
    assert _same_run(fast, plain)


@pytest.mark.parametrize("scale", [1.0, 1024.0, 3.0])
def test_unscale_of_owned_gradients_matches_unscale(scale: float) -> None:
    from fpsim.amp import LossScaler

    rng = np.random.default_rng([3006, int(scale)])
    s = LossScaler(scale)
    grads = {"a": _values(rng, (6, 5), np.float32), "b": _values(rng, (4,), np.float32),
             "c": _values(rng, (3, 2), np.float64), "v": _values(rng, (8,), np.float32)[::2]}
    with np.errstate(all="ignore"):
        want, inf_want = s.unscale(grads)
        got, inf_got = s._unscale_owned({k: np.array(v) if v.flags.owndata else v for k, v in grads.items()})
    assert inf_got == inf_want and got.keys() == want.keys() and all(_same(got[k], want[k]) for k in want)
    shared = _values(rng, (5,), np.float32)
    keep = shared.copy()
    with np.errstate(all="ignore"):
        out, _ = s._unscale_owned({"x": shared, "y": shared})  # one array twice: not scaled twice in place
    assert _same(shared, keep) and _same(out["x"], s.unscale({"x": keep})[0]["x"])
