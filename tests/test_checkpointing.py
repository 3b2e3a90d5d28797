"""Activation checkpointing (GPTConfig.checkpoint): gradients and policy state bit-identical to no
checkpointing for every policy, and each recomputation pitfall shown first with the naive re-run.

Pitfalls (fpsim.nn.recompute): stochastic rounding must replay the forward's random draws; FP8 delayed
scaling must not record an amax twice; QAT observers must not see the batch twice; telemetry must not
count recomputed activations. "Naive" is fpsim.nn.recompute.naive_recomputation(): a plain re-run.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from fpsim.amp import FP8Recipe, Policy, get_policy, policy_names
from fpsim.nn import GPTConfig, gpt_backward, gpt_forward, init_params
from fpsim.nn.attention import attention_backward, attention_forward
from fpsim.nn.recompute import is_naive, naive_recomputation
from fpsim.train import TrainConfig, Trainer

MODES: tuple[Any, ...] = ("blocks", 2, "selective")
MODEL = GPTConfig(vocab_size=6, block_size=8, n_layer=3, n_head=2, n_embd=8)
BASE = TrainConfig(task="reverse", task_kwargs={"n_symbols": 5, "length": 4}, batch_size=4, steps=4, eval_every=0,
                   histogram_every=1, model=MODEL)


def _sr(name: str) -> Policy:
    return get_policy(name).replace(name=f"{name}+sr", rounding="sr")


# Every registered policy, and stochastic-rounding variants (none is registered): mixed, no master copy
# (its gradients are cast after the backward pass: the stream must continue where it would have), FP8, QAT.
FP8_ATTN = get_policy("fp8-hybrid").replace(name="fp8-attn", fp8=FP8Recipe(kinds=("linear", "attn", "lm_head")))
POLICIES = [get_policy(n) for n in policy_names() if not n.startswith("test-")] + [
    _sr("bf16-mixed"), _sr("fp16-no-master"), _sr("fp8-hybrid"), _sr("int8-qat"), FP8_ATTN]
IDS = [p.name for p in POLICIES]


def _run(pol: Policy, ck: Any, *, naive: bool = False, steps: int = 4, attention: str = "standard",
         cfg: TrainConfig = BASE) -> tuple[Trainer, list[dict[str, np.ndarray]], list[Any]]:
    """A real Trainer run; returns it, the gradients the optimizer received each step, and per step the
    runtime's amax-record and observer-update counts."""
    c = replace(cfg, model=replace(cfg.model, checkpoint=ck, attention=attention))
    tr = Trainer(pol, c)
    grads: list[dict[str, np.ndarray]] = []
    orig = tr.optimizer.updates

    def updates(w: Any, g: Any, lr: float) -> Any:
        grads.append({k: v.copy() for k, v in g.items()})
        return orig(w, g, lr=lr)

    tr.optimizer.updates = updates  # type: ignore[method-assign]
    counts = []
    with naive_recomputation() if naive else contextlib.nullcontext():
        for _ in range(steps):
            tr.step()
            counts.append((dict(tr.runtime.amax_records), dict(tr.runtime.observer_updates)))
    return tr, grads, counts


def _bits(a: Any, b: Any) -> bool:
    """Same dtype, shape and bytes (NaNs included: a run that diverges must diverge identically)."""
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _same_tree(a: Any, b: Any) -> bool:
    """Equal nested dicts/lists of numbers, NaN equal to NaN."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same_tree(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_same_tree(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    return bool(a == b)


def _same_state(a: Trainer, b: Trainer) -> bool:
    sa, sb = a.runtime.state_dict(), b.runtime.state_dict()
    return sa.keys() == sb.keys() and all(_bits(sa[k], sb[k]) for k in sa)


def _same_grads(ga: list[dict[str, np.ndarray]], gb: list[dict[str, np.ndarray]]) -> bool:
    return len(ga) == len(gb) and all(a.keys() == b.keys() and all(_bits(a[k], b[k]) for k in a)
                                      for a, b in zip(ga, gb))


def _same_weights(a: Trainer, b: Trainer) -> bool:
    return all(_bits(a.store.weights[k], b.store.weights[k]) for k in a.store.weights)


_REF: dict[tuple[str, str], Any] = {}


def _reference(pol: Policy, attention: str = "standard") -> Any:
    key = (pol.name, attention)
    if key not in _REF:
        _REF[key] = _run(pol, "none", attention=attention)
    return _REF[key]


# ------------------------------------------------------------------------------------------ bit identity
@pytest.mark.parametrize("ck", MODES, ids=str)
@pytest.mark.parametrize("pol", POLICIES, ids=IDS)
def test_trainer_run_bit_identical_for_every_policy(pol: Policy, ck: Any) -> None:
    """Four real steps: every gradient the optimizer receives, the weights, the runtime state (FP8
    scales and amax histories, QAT observers, SR generator), the amax/observer counts and the whole
    telemetry history equal those of the run without checkpointing, bit for bit (a run that diverges to
    NaN, like apex O3 here, diverges identically)."""
    r0 = _reference(pol)
    r1 = _run(pol, ck)
    assert _same_grads(r0[1], r1[1])
    assert _same_weights(r0[0], r1[0])
    assert _same_state(r0[0], r1[0])
    assert r0[2] == r1[2]
    assert _same_history(r0[0], r1[0])


def _same_history(a: Trainer, b: Trainer) -> bool:
    """Every telemetry series (loss, scale, per-tensor stats, histograms, lost updates) but wall time."""
    da, db = dict(a.history.data), dict(b.history.data)
    da.pop("wall_s"), db.pop("wall_s")
    return _same_tree(da, db)


def test_qat_reference_run_reaches_fake_quantization() -> None:
    """The QAT runs above switch fake quantization on at step 2 of 4 (start=0.5): the observers are used."""
    tr, _, counts = _reference(get_policy("int8-qat"))
    assert tr.runtime.quant_active and counts[-1][1] and not counts[0][1]


def test_single_step_float64_full_precision() -> None:
    """No policy (FULL, float64): every checkpointing mode gives the same gradient bits."""
    p = init_params(MODEL, seed=1, dtype=np.float64)
    rng = np.random.default_rng(0)
    idx, tgt = rng.integers(0, 6, (3, 8)), rng.integers(0, 6, (3, 8))
    _, l0, c0 = gpt_forward(p, MODEL, idx, tgt)
    g0 = gpt_backward(1.0, c0)
    for ck in (*MODES, 1, 3, 7):
        cfg = replace(MODEL, checkpoint=ck)
        _, l1, c1 = gpt_forward(p, cfg, idx, tgt)
        g1 = gpt_backward(1.0, c1)
        assert np.array_equal(l0, l1) and all(np.array_equal(g0[k], g1[k]) for k in g0), ck
        assert g1.keys() == g0.keys()


def test_backward_can_run_twice_on_one_cache() -> None:
    """The backward pass does not consume a checkpointed cache (same gradients on a second call)."""
    pol = _sr("bf16-mixed")
    rt = pol.runtime(seed=0)
    p = init_params(MODEL, seed=0)
    idx = np.zeros((2, 8), dtype=np.int64)
    _, _, c = gpt_forward(p, replace(MODEL, checkpoint="blocks"), idx, idx, prec=rt)
    state = rt.rng.bit_generator.state
    g1 = gpt_backward(np.float32(1), c)
    rt.rng.bit_generator.state = state
    g2 = gpt_backward(np.float32(1), c)
    assert all(np.array_equal(g1[k], g2[k]) for k in g1)


def test_checkpointed_cache_keeps_only_inputs() -> None:
    """'blocks' keeps each block's input and no block cache; k=2 checkpoints blocks 0 and 2 of 3;
    'selective' keeps no T x T array in any block."""
    p = init_params(MODEL)
    idx = np.zeros((2, 8), dtype=np.int64)
    from fpsim.nn.gpt import _BlockCheckpoint

    caches = gpt_forward(p, replace(MODEL, checkpoint="blocks"), idx, idx)[2][0]
    assert all(isinstance(caches[f"h{i}"], _BlockCheckpoint) for i in range(3))
    caches = gpt_forward(p, replace(MODEL, checkpoint=2), idx, idx)[2][0]
    assert [isinstance(caches[f"h{i}"], _BlockCheckpoint) for i in range(3)] == [True, False, True]
    caches = gpt_forward(p, replace(MODEL, checkpoint="selective"), idx, idx)[2][0]
    from fpsim.nn.saved import saved_tensors

    sel = {t.kind for t in saved_tensors(caches)}
    assert "softmax" not in sel and "mask" not in sel and "recompute_input" in sel
    full = {t.kind for t in saved_tensors(gpt_forward(p, MODEL, idx, idx)[2][0])}
    assert {"softmax", "mask"} <= full


# ------------------------------------------------------------------------------------------ the pitfalls
def test_pitfall_stochastic_rounding_replay() -> None:
    """Naive: the recomputed forward draws new random numbers, so the backward pass uses activations the
    forward pass never produced, and every later draw of the step shifts: different gradient bits.
    With the replay (torch's preserve_rng_state): identical bits, and the generator ends where it would."""
    pol = _sr("bf16-mixed")
    r0 = _reference(pol)
    for ck in MODES:
        naive = _run(pol, ck, naive=True, steps=1)
        assert not _same_grads(r0[1][:1], naive[1]), ck
        good = _run(pol, ck, steps=1)
        assert _same_grads(r0[1][:1], good[1]), ck
    one = _run(pol, "none", steps=1)[0]
    assert _same_state(one, good[0])  # the generator state after the step (state_dict holds it)


def test_pitfall_fp8_amax_recorded_twice() -> None:
    """Naive: each recomputed FP8 GEMM records its input amaxes a second time (TransformerEngine guards
    this with its "FP8 activation recompute phase"). In fpsim's DelayedScaling the step's amax is the max
    of the recordings and the scales update once per step (end_step), so the repeated identical amax
    leaves the histories and bits unchanged: only the count shows it. Guarded: one record per tensor."""
    pol = get_policy("fp8-hybrid")
    r0 = _reference(pol)
    assert all(v == 1 for v in r0[2][0][0].values()) and r0[2][0][0]
    for ck in ("blocks", 2):
        naive = _run(pol, ck, naive=True, steps=2)
        rec = naive[2][0][0]
        twice = sorted(k for k, v in rec.items() if v == 2)
        assert twice and all(k.startswith(("h0.", "h2.") if ck == 2 else "h") for k in twice)
        assert _same_grads(r0[1][:2], naive[1])  # measured: same bits (max-merge), see the docstring
        good = _run(pol, ck, steps=2)
        assert good[2] == r0[2][:2]
        assert _same_state(_run(pol, "none", steps=2)[0], good[0])


def test_pitfall_fp8_attention_core_selective() -> None:
    """FP8 also inside attention (Q K^T and P V in E4M3): the selective re-run of the core records the
    q, k^T, P, v amaxes again when naive, and not at all when guarded."""
    r0 = _reference(FP8_ATTN)
    naive = _run(FP8_ATTN, "selective", naive=True, steps=1)
    twice = sorted(k for k, v in naive[2][0][0].items() if v == 2)
    assert twice == sorted(f"h{i}.attn.{g}.{r}" for i in range(3) for g in ("qk", "pv") for r in ("x", "w"))
    good = _run(FP8_ATTN, "selective", steps=1)
    assert good[2] == r0[2][:1] and _same_grads(r0[1][:1], good[1])


def test_pitfall_qat_observer_sees_batch_twice() -> None:
    """Naive: every QAT observer updates its moving average again in the recomputation, and the
    recomputed fake quantization uses that second value: different observer state and different bits
    from the second quantized step on. Guarded: one update per observer per step, identical bits."""
    pol = get_policy("int8-qat")
    r0 = _reference(pol)
    naive = _run(pol, "blocks", naive=True)
    upd = naive[2][-1][1]
    assert upd and all(v == 2 for v in upd.values())
    assert all(v == 1 for v in r0[2][-1][1].values())
    assert not _same_state(r0[0], naive[0])
    assert not _same_grads(r0[1], naive[1])
    assert not _same_weights(r0[0], naive[0])
    good = _run(pol, "blocks")
    assert good[2] == r0[2] and _same_state(r0[0], good[0]) and _same_grads(r0[1], good[1])


def test_pitfall_telemetry_counts_recomputed_activations() -> None:
    """Naive: the activation histograms count every recomputed activation a second time."""
    pol = get_policy("bf16-mixed")
    r0 = _reference(pol)
    naive = _run(pol, "blocks", naive=True, steps=1)
    a0 = np.asarray(r0[0].history.data["hist"]["act"][0])
    a1 = np.asarray(naive[0].history.data["hist"]["act"][0])
    assert a1.sum() > a0.sum()
    good = _run(pol, "blocks", steps=1)
    assert np.array_equal(np.asarray(good[0].history.data["hist"]["act"][0]), a0)


def test_naive_switch_is_scoped() -> None:
    assert not is_naive()
    with pytest.raises(KeyError), naive_recomputation():
        assert is_naive()
        raise KeyError
    assert not is_naive()


def test_nested_recomputation_refused() -> None:
    rt = get_policy("fp32").runtime()
    with rt.recomputing(None), pytest.raises(RuntimeError, match="already inside"), rt.recomputing(None):
        pass
    assert not rt._recomputing


# ------------------------------------------------------------------------------------------ flash
def _flash_available() -> bool:
    try:
        import fpsim.nn.flash  # noqa: F401
        from fpsim.nn.gpt import _attention_impl

        _attention_impl(replace(MODEL, attention="flash"))
    except (ImportError, NotImplementedError):
        return False
    return True


@pytest.mark.skipif(not _flash_available(), reason="flash attention not in this tree")
@pytest.mark.parametrize("ck", MODES, ids=str)
@pytest.mark.parametrize("pol", [get_policy("bf16-mixed"), get_policy("fp8-hybrid"), get_policy("int8-qat"),
                                 _sr("bf16-mixed")], ids=lambda p: p.name)
def test_flash_attention_bit_identical(pol: Policy, ck: Any) -> None:
    """With GPTConfig(attention="flash"): the same bit identity ('selective' is flash itself: flash keeps
    no T x T tensor, so nothing more is recomputed)."""
    r0 = _reference(pol, "flash")
    r1 = _run(pol, ck, attention="flash")
    assert _same_grads(r0[1], r1[1]) and _same_weights(r0[0], r1[0]) and _same_state(r0[0], r1[0])
    assert r0[2] == r1[2]


# ------------------------------------------------------------------------------------------ inputs
@pytest.mark.parametrize("bad, exc", [(0, ValueError), (-2, ValueError), ("Block", ValueError), ("", ValueError),
                                      (True, TypeError), (2.0, TypeError), (None, TypeError), (["blocks"], TypeError)])
def test_checkpoint_values_refused(bad: Any, exc: type[Exception]) -> None:
    with pytest.raises(exc, match="checkpoint"):
        GPTConfig(checkpoint=bad)


def test_checkpoint_names_canonical() -> None:
    assert GPTConfig(checkpoint=" Blocks ").checkpoint == "blocks"
    k = GPTConfig(checkpoint=np.int64(3)).checkpoint
    assert k == 3 and type(k) is int
    with pytest.raises(ValueError, match="none, blocks, selective"):
        GPTConfig(checkpoint="full")


def test_trainer_checkpoint_config_round_trips(tmp_path: Any) -> None:
    """A run with checkpointing saves and resumes (the mode travels in the checkpoint's config)."""
    from fpsim.train import load_checkpoint, save_checkpoint

    c = replace(BASE, model=replace(MODEL, checkpoint=2))
    tr = Trainer("bf16-mixed", c)
    tr.run(2)
    save_checkpoint(tr, str(tmp_path / "ck"))
    tr2 = load_checkpoint(str(tmp_path / "ck"))
    assert tr2.model.checkpoint == 2
    tr.run(4)
    tr2.run(4)
    assert _same_weights(tr, tr2)


def test_attention_recompute_core_flag() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 8))
    w, wp = rng.standard_normal((8, 24)), rng.standard_normal((8, 8))
    out0, c0 = attention_forward(x, w, None, wp, None, 2)
    out1, c1 = attention_forward(x, w, None, wp, None, 2, recompute_core=True)
    assert np.array_equal(out0, out1)
    dout = rng.standard_normal(out0.shape)
    g0, g1 = attention_backward(dout, c0), attention_backward(dout, c1)
    assert all(np.array_equal(g0[k], g1[k]) for k in ("x", "w_qkv", "w_proj"))
    with pytest.raises(TypeError, match="recompute_core"):
        attention_forward(x, w, None, wp, None, 2, recompute_core=1)  # type: ignore[arg-type]


def test_fp8_attention_gemm_backward_batched() -> None:
    """FP8 on attention GEMMs (batched operands): the backward used ``.T`` (all axes reversed) and raised a
    shape error; now dA = dQ B^T and dB = A^T dQ per batch, held against NumPy on the same quantized values."""
    rt = FP8_ATTN.runtime()
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 3, 5, 4)).astype(np.float32), rng.standard_normal((2, 3, 4, 6)).astype(np.float32)
    _, cache = rt.matmul(a, b, "s", "attn")
    _, aq, bq, ainv, binv, _, _ = cache
    d = rng.standard_normal((2, 3, 5, 6)).astype(np.float32)
    da, db, _ = rt.matmul_backward(d, cache)
    assert FP8_ATTN.fp8 is not None
    # the same quantization of dY the backward made (a fresh delayed scale: 1.0, as "s.dy" had)
    dq, dinv = rt._fp8_quant(rt.cast(d, FP8_ATTN.gradients), "s.dy.check", FP8_ATTN.fp8.backward)
    want_a = rt.cast((dq.astype(np.float64) @ np.swapaxes(bq, -1, -2).astype(np.float64)).astype(np.float32)
                     * (dinv * binv), FP8_ATTN.gradients)
    want_b = rt.cast((np.swapaxes(aq, -1, -2).astype(np.float64) @ dq.astype(np.float64)).astype(np.float32)
                     * (ainv * dinv), FP8_ATTN.gradients)
    assert da.shape == a.shape and db.shape == b.shape
    assert np.array_equal(da, want_a) and np.array_equal(db, want_b)
