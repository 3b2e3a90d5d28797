"""Pure-BF16 policies (no FP32 master): RNE, stochastic-rounding and Kahan-compensated weight updates."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

from fpsim.amp import UPDATE_RULES, MasterWeights, Policy, get_policy
from fpsim.train import TrainConfig, Trainer, load_checkpoint
from fpsim.nn import GPTConfig

F = np.float32
gmpy2 = pytest.importorskip("gmpy2")


def _bf16_ctx() -> Any:
    # BF16: 8 significant bits, exponent range of float32 (the values here stay normal)
    return gmpy2.context(precision=8, emax=128, emin=-132, subnormalize=True, round=gmpy2.RoundToNearest)


def _store(rule: str, w: np.ndarray, seed: int = 0) -> MasterWeights:
    p = get_policy(f"bf16-pure-{rule}")
    return MasterWeights({"w": w}, p, p.runtime(seed=seed))


def _bf16_values(rng: np.random.Generator, n: int) -> np.ndarray:
    x = (rng.standard_normal(n) * 2.0 ** rng.integers(-6, 6, n)).astype(F)
    return (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(F)  # truncated to BF16


def test_policies_registered_with_their_memory() -> None:
    assert UPDATE_RULES == ("rne", "sr", "kahan")
    for rule in UPDATE_RULES:
        p = get_policy(f"bf16-pure-{rule}")
        assert p.master is None and p.update == rule and p.params.name == "bf16"
        assert p.optimizer_state.name == "fp32"
        led = p.memory_ledger("adamw")
        assert led["total"] == (14.0 if rule == "kahan" else 12.0)
    assert get_policy("bf16-mixed").memory_ledger("adamw")["total"] == 16.0
    assert get_policy("bf16-pure-sr").stochastic and not get_policy("bf16-pure-rne").stochastic


def test_policy_update_is_checked() -> None:
    with pytest.raises(ValueError, match="master"):
        Policy("x", params="bf16", update="sr")                # a master copy is there: no update rule
    with pytest.raises(ValueError, match="valid: rne, sr, kahan"):
        Policy("x", params="bf16", master=None, update="stochastic")
    assert Policy("x", params="bf16", master=None, update=" SR").update == "sr"
    assert "update" not in get_policy("bf16-mixed").describe()  # fingerprints of the other policies unchanged
    assert "update=kahan" in get_policy("bf16-pure-kahan").fingerprint()


def test_rne_update_is_exact_then_rounded_once() -> None:
    """Oracle: MPFR at BF16 precision of the exact float64 difference."""
    rng = np.random.default_rng(0)
    w = _bf16_values(rng, 2000)
    u = (w * rng.uniform(-0.02, 0.02, w.size)).astype(F)
    s = _store("rne", w.copy())
    s.apply({"w": u})
    with _bf16_ctx():
        want = np.array([float(gmpy2.mpfr(float(a) - float(b))) for a, b in zip(w, u)], F)
    assert np.array_equal(s.weights["w"], want)
    assert s.last_lost == int(np.count_nonzero((want == w) & (u != 0)))


def test_sr_update_is_unbiased_and_between_neighbours() -> None:
    w = np.ones(20000, F)
    u = np.full(20000, 1e-3, F)                      # 0.256 of BF16's ulp(1) below 1 (2**-8)
    s = _store("sr", w.copy(), seed=1)
    s.apply({"w": u})
    new = s.weights["w"]
    assert set(np.unique(new).tolist()) == {1.0, 1.0 - 2.0 ** -8}
    frac = float(np.mean(new != 1.0))
    assert abs(frac - 1e-3 / 2.0 ** -8) < 0.015         # P(round down) = distance / ulp
    again = _store("sr", w.copy(), seed=1)
    again.apply({"w": u})
    assert np.array_equal(again.weights["w"], new)      # same seed, same bits


def test_kahan_update_matches_a_reference_in_bf16_arithmetic() -> None:
    """Zamirai et al.'s compensated update, every operation rounded once in BF16 (oracle: MPFR)."""
    rng = np.random.default_rng(2)
    w0 = _bf16_values(rng, 64)
    ups = [(np.abs(w0) * rng.uniform(-3e-3, 3e-3, 64)).astype(F) for _ in range(30)]
    s = _store("kahan", w0.copy())
    for u in ups:
        s.apply({"w": u})
    with _bf16_ctx():
        mp = gmpy2.mpfr
        ref = []
        for i in range(64):
            w, c = mp(float(w0[i])), mp(0)
            for u in ups:
                y = mp(-float(u[i])) - c
                t = w + y
                c = (t - w) - y
                w = t
            ref.append(float(w))
    assert np.array_equal(s.weights["w"], np.array(ref, F))


def test_small_updates_stall_under_rne_only() -> None:
    w = np.ones(4000, F)
    out = {}
    for rule in UPDATE_RULES:
        s = _store(rule, w.copy(), seed=3)
        applied = intended = 0.0
        for _ in range(200):
            s.apply({"w": np.full(4000, 5e-4, F)})
            applied, intended = applied + s.last_applied, intended + s.last_intended
        out[rule] = (float(s.weights["w"].mean()), applied / intended)
    assert out["rne"] == (1.0, 0.0)                    # every update lost
    for rule in ("sr", "kahan"):
        mean, ratio = out[rule]
        assert abs(mean - 0.9) < 0.01 and abs(ratio - 1) < 0.05


def _tiny(seed: int = 0, steps: int = 6) -> TrainConfig:
    return TrainConfig(task="reverse", task_kwargs={"n_symbols": 5, "length": 3}, steps=steps, batch_size=4,
                       model=GPTConfig(vocab_size=6, block_size=6, n_layer=1, n_head=2, n_embd=8), seed=seed,
                       eval_every=0, lr=1e-3)


@pytest.mark.parametrize("rule", UPDATE_RULES)
def test_trainer_runs_and_counts_lost_updates(rule: str) -> None:
    h = Trainer(f"bf16-pure-{rule}", _tiny()).run(progress=False)
    lost = np.asarray(h["lost_update_fraction"], float)
    assert np.all((lost >= 0) & (lost <= 1)) and np.isfinite(h["eval_loss"][-1])


def test_sr_training_is_reproducible_and_resumes(tmp_path: Any) -> None:
    a = Trainer("bf16-pure-sr", _tiny(seed=4))
    a.run(progress=False)
    path = os.path.join(str(tmp_path), "sr.npz")
    b = Trainer("bf16-pure-sr", _tiny(seed=4))
    b.run(3, progress=False, checkpoint=path)
    c = load_checkpoint(path)
    c.run(progress=False)
    for k, v in a.store.weights.items():
        assert np.array_equal(v, c.store.weights[k])
    rne = Trainer("bf16-pure-rne", _tiny(seed=4))
    rne.run(progress=False)
    assert any(not np.array_equal(v, rne.store.weights[k]) for k, v in a.store.weights.items())


def test_kahan_compensation_is_checkpointed(tmp_path: Any) -> None:
    a = Trainer("bf16-pure-kahan", _tiny(seed=5))
    a.run(progress=False)
    path = os.path.join(str(tmp_path), "k.npz")
    b = Trainer("bf16-pure-kahan", _tiny(seed=5))
    b.run(3, progress=False, checkpoint=path)
    assert any(np.any(c != 0) for c in b.runtime.kahan.values())   # something is waiting in the buffers
    c = load_checkpoint(path)
    c.run(progress=False)
    for k, v in a.store.weights.items():
        assert np.array_equal(v, c.store.weights[k])
        assert np.array_equal(a.runtime.kahan[k], c.runtime.kahan[k])
