"""The MXFP8 and NVFP4 training policies (``Policy.block``, issue 28): each trains, each ingredient does what
it says, checkpoints resume bit for bit; Four over Six against an ml_dtypes oracle."""

from __future__ import annotations

import os
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from fpsim.amp import BlockRecipe, Policy, get_policy
from fpsim.amp.runtime import random_hadamard
from fpsim.formats import as_format
from fpsim.nn import GPTConfig
from fpsim.scaling import nvfp4_quantize
from fpsim.train import TrainConfig, Trainer, load_checkpoint

BLOCK_POLICIES = ("mxfp8", "mxfp8-e5m2-grads", "nvfp4")
ABLATIONS: dict[str, dict[str, Any]] = {
    "no-hadamard": {"hadamard": False}, "no-sr": {"sr_gradients": False}, "1d-weights": {"weight_2d": False},
    "all-fp4": {"bf16_last": 0}, "four-over-six": {"four_over_six": True},
    "mx-floor": {"scheme": "mxfp8", "scale_rounding": "floor", "forward": "fp8_e4m3", "backward": "fp8_e4m3"},
}


def _tiny(seed: int = 0, steps: int = 6, n_layer: int = 2) -> TrainConfig:
    return TrainConfig(task="reverse", task_kwargs={"n_symbols": 5, "length": 3}, steps=steps, batch_size=4,
                       model=GPTConfig(vocab_size=6, block_size=6, n_layer=n_layer, n_head=2, n_embd=8), seed=seed,
                       eval_every=0, lr=1e-3)


@pytest.mark.parametrize("name", BLOCK_POLICIES)
def test_policy_trains_without_nan(name: str) -> None:
    tr = Trainer(name, _tiny())
    h = tr.run(progress=False)
    assert np.all(np.isfinite(h["loss"])) and np.isfinite(h["eval_loss"][-1])
    assert tr.runtime.block_calls > 0
    q = [k for k in h["tensors"] if k.endswith(":q")]
    assert q and all("saturation_fraction" in h["tensors"][k] for k in q)


@pytest.mark.parametrize("abl", sorted(ABLATIONS))
def test_each_ablation_trains(abl: str) -> None:
    p = get_policy("nvfp4").replace(name=f"nvfp4-{abl}", **ABLATIONS[abl])
    h = Trainer(p, _tiny(steps=3)).run(progress=False)
    assert np.all(np.isfinite(h["loss"]))


def test_replace_reaches_the_block_recipe() -> None:
    p = get_policy("nvfp4")
    assert p.block is not None and p.block.hadamard and p.block.sr_gradients and p.block.weight_2d
    q = p.replace(hadamard=False, name="x")
    assert q.block is not None and not q.block.hadamard and q.block.sr_gradients and q.name == "x"
    assert q.fingerprint() != p.fingerprint()
    assert p.block.hadamard  # the original is unchanged
    with pytest.raises(ValueError, match="no block recipe"):
        get_policy("bf16-mixed").replace(hadamard=False)
    with pytest.raises(TypeError, match="unexpected keyword"):
        p.replace(hadamrd=False)


def test_policies_describe_their_recipe() -> None:
    d = get_policy("mxfp8").describe()["block"]
    assert d["scheme"] == "mxfp8" and d["forward"] == d["backward"] == "fp8_e4m3" and d["scale_rounding"] == "ceil"
    assert not d["hadamard"] and not d["sr_gradients"] and not get_policy("mxfp8").stochastic
    assert get_policy("mxfp8-e5m2-grads").block.backward.name == "fp8_e5m2"  # type: ignore[union-attr]
    assert "block" not in get_policy("bf16-mixed").describe()  # other fingerprints unchanged


@pytest.mark.parametrize("kw, err, match", [
    ({"scheme": "mxfp9"}, ValueError, "mxfp9"),
    ({"scheme": "mxfp8", "forward": "fp4_e2m1"}, ValueError, "fp8_e4m3, fp8_e5m2"),
    ({"scheme": "nvfp4", "backward": "fp8_e4m3"}, ValueError, "fp4_e2m1"),
    ({"hadamard": 1}, TypeError, "hadamard"),
    ({"bf16_last": -1}, ValueError, "bf16_last"),
    ({"kinds": ("attn",)}, ValueError, "attn"),
    ({"gemm": "h100"}, ValueError, "b200"),
    ({"scale_rounding": "even"}, ValueError, "ceil"),
])
def test_block_recipe_refuses_bad_fields(kw: dict[str, Any], err: type, match: str) -> None:
    with pytest.raises(err, match=match):
        BlockRecipe(**kw)


def test_block_recipe_conflicts_refused() -> None:
    from fpsim.amp import FP8Recipe

    with pytest.raises(ValueError, match="both claim"):
        Policy("x", block=BlockRecipe(), fp8=FP8Recipe())
    with pytest.raises(ValueError, match="BlockRecipe.gemm"):
        Policy("x", params="bf16", activations="bf16", gradients="bf16", gemm="b200", block=BlockRecipe())


# ---------------------------------------------------------------------------------------------- ingredients
def _layer(policy: Policy, seed: int, *, n_layer: int | None = 2) -> tuple[Any, dict[str, np.ndarray]]:
    """One linear layer's forward and backward under ``policy``; the operands each quantisation saw."""
    rt = policy.runtime(seed=3)
    rt.n_layer = n_layer
    seen: dict[str, np.ndarray] = {}
    orig = rt._bq

    def spy(x: np.ndarray, axis: int, fmt: Any, key: str, **kw: Any) -> Any:
        seen[key.split(".")[-1]] = np.array(x, copy=True)
        return orig(x, axis, fmt, key, **kw)

    rt._bq = spy
    g = np.random.default_rng(seed)
    # small integers: every value and every Hadamard sum (multiples of 1/4) is exact in bf16 and float32
    x = g.integers(-3, 4, size=(2, 16, 32)).astype(np.float32)
    w = g.integers(-3, 4, size=(32, 16)).astype(np.float32)
    dy = g.integers(-3, 4, size=(2, 16, 16)).astype(np.float32)
    rt.begin_step(recording=True)
    _, cache = rt.matmul(x, w, "h0.mlp.fc", "linear")
    rt.matmul_backward(dy, cache)
    seen["X"], seen["DY"] = x.reshape(-1, 32), dy.reshape(-1, 16)
    return rt, seen


def test_hadamard_changes_the_wgrad_operands_not_their_exact_product() -> None:
    on = get_policy("nvfp4").replace(sr_gradients=False)
    _, a = _layer(on, 1)
    _, b = _layer(on.replace(hadamard=False), 1)
    for k in ("x", "w", "dy"):   # the forward and data-gradient operands are untouched
        assert np.array_equal(a[k], b[k])
    assert not np.array_equal(a["x_wgrad"], b["x_wgrad"]) and not np.array_equal(a["dy_wgrad"], b["dy_wgrad"])
    assert np.array_equal(b["x_wgrad"], a["X"].T) and np.array_equal(b["dy_wgrad"], a["DY"])

    def exact(xt: np.ndarray, d: np.ndarray) -> list[list[Fraction]]:   # rational arithmetic: the oracle
        return [[sum((Fraction(float(xt[i, m])) * Fraction(float(d[m, j])) for m in range(d.shape[0])),
                     Fraction(0)) for j in range(d.shape[1])] for i in range(xt.shape[0])]

    assert exact(a["x_wgrad"], a["dy_wgrad"]) == exact(b["x_wgrad"], b["dy_wgrad"])


def test_random_hadamard_is_orthogonal_and_checks_its_input() -> None:
    g = np.random.default_rng(7)
    s = np.where(g.random(16) < 0.5, -1.0, 1.0)
    eye = random_hadamard(np.eye(16, dtype=np.float32), s).astype(np.float64)
    assert np.array_equal(eye.T @ eye, np.eye(16))
    with pytest.raises(ValueError, match="multiple of 16"):
        random_hadamard(np.ones((15, 2)), s)
    with pytest.raises(ValueError, match="signs"):
        random_hadamard(np.ones((16, 2)), np.full(16, 2.0))


def test_hadamard_signs_come_from_the_seed() -> None:
    p = get_policy("nvfp4")
    a, b, c = p.runtime(seed=1).rht_signs, p.runtime(seed=1).rht_signs, p.runtime(seed=2).rht_signs
    assert a is not None and np.array_equal(a, b) and not np.array_equal(a, c)
    assert p.replace(hadamard=False).runtime(seed=1).rht_signs is None


def test_sr_gradients_round_without_bias() -> None:
    """The quantised gradient's mean over many draws is the value itself (SR is unbiased); RNE is not."""
    fp4 = as_format("fp4_e2m1")
    g = np.random.default_rng(11)
    x = g.standard_normal((16, 16)).astype(np.float32)
    n = 3000
    for sr, biased in ((True, False), (False, True)):
        rt = get_policy("nvfp4").replace(sr_gradients=sr).runtime(seed=5)
        acc = np.zeros(x.shape)
        acc2 = np.zeros(x.shape)
        varied = np.zeros(x.shape, bool)
        first = None
        for _ in range(n if sr else 1):
            el, s, gs = rt._bq(x, 0, fp4, "k", sr=sr)
            v = el.astype(np.float64) * s * np.float64(gs)
            first = v if first is None else first
            varied |= v != first
            acc += v
            acc2 += v * v
        k = n if sr else 1
        mean = acc / k
        err = mean - x
        if sr:
            se = np.sqrt(np.maximum(acc2 / k - mean ** 2, 0) / k)
            drawn = varied    # the others were on the grid already (each block's amax, scaled to 6, mostly)
            assert np.abs(err[drawn] / se[drawn]).max() < 5.5        # within sampling noise
            # the rest: on (or within a few draws' reach of) the grid, or a block amax that the E4M3 scale's rounding pushed past 6 and the
            # element format clamped (NVFP4's saturation, not SR's)
            fixed = ~drawn
            on_grid = np.abs(err[fixed]) <= 1e-3 * np.abs(x[fixed])
            assert np.all((np.abs(el[fixed]) == 6) | on_grid)
        assert (np.abs(err).mean() > 0.01) == biased


def test_weight_2d_uses_one_quantised_weight_for_both_gemms() -> None:
    two = get_policy("nvfp4").replace(sr_gradients=False, hadamard=False)
    _, a = _layer(two, 2)
    _, b = _layer(two.replace(weight_2d=False), 2)
    assert "w_t" not in a and "w_t" in b       # 2-D: the forward's quantised W, transposed


def test_bf16_last_keeps_the_last_blocks_out() -> None:
    p = get_policy("nvfp4")
    rt = p.runtime()
    rt.n_layer = 2
    assert rt._block_on("h0.mlp.fc", "linear") and not rt._block_on("h1.mlp.fc", "linear")
    assert not rt._block_on("lm_head", "lm_head")
    rt.n_layer = None
    with pytest.raises(RuntimeError, match="n_layer"):
        rt._block_on("h0.mlp.fc", "linear")
    h = Trainer(p, _tiny(steps=2)).run(progress=False)
    assert any(k.startswith("h0.") for k in h["tensors"] if k.endswith(":q"))
    assert not any(k.startswith("h1.") for k in h["tensors"] if k.endswith(":q"))


def test_mx_scale_rounding_shows_in_the_saturation_telemetry() -> None:
    """A block whose amax has a larger mantissa than E4M3's max (448 = 1.75 * 2**8) saturates under OCP's floor
    scale and not under the ceil scale of arXiv 2506.08027."""
    x = np.full((4, 32), 0.5, np.float32)
    x[:, 0] = 500.0
    e4 = as_format("fp8_e4m3")
    for rule, sat in (("ceil", 0), ("floor", 4)):
        rt = get_policy("mxfp8").replace(scale_rounding=rule).runtime()
        rt.begin_step(recording=True)
        rt._bq(x, 1, e4, "t")
        assert rt.qstats["t"][4] == sat and rt.qstats["t"][2] == 0


def test_block_policy_resumes_from_a_checkpoint(tmp_path: Any) -> None:
    a = Trainer("nvfp4", _tiny(seed=4))
    a.run(progress=False)
    path = os.path.join(str(tmp_path), "nv.npz")
    b = Trainer("nvfp4", _tiny(seed=4))
    b.run(3, progress=False, checkpoint=path)
    c = load_checkpoint(path)
    c.run(progress=False)
    for k, v in a.store.weights.items():
        assert np.array_equal(v, c.store.weights[k])
    ab = get_policy("nvfp4").replace(name="nvfp4-no-rht", hadamard=False)
    d = Trainer(ab, _tiny(seed=4))
    d.run(3, progress=False, checkpoint=path)
    assert load_checkpoint(path, policy=ab).policy.fingerprint() == ab.fingerprint()


@pytest.mark.slow
def test_b200_gemm_path_matches_the_fast_path_closely() -> None:
    """The bit-exact Blackwell chain and float32 BLAS differ only in accumulation rounding."""
    for name in ("nvfp4", "mxfp8"):
        p = get_policy(name).replace(sr_gradients=False)
        x = np.random.default_rng(3).standard_normal((32, 64)).astype(np.float32)
        w = np.random.default_rng(4).standard_normal((64, 16)).astype(np.float32)
        outs = []
        for gemm in ("fast", "b200"):
            q = p.replace(name=f"{name}-{gemm}", block=p.block.replace(gemm=gemm))  # type: ignore[union-attr]
            rt = q.runtime()
            rt.n_layer = 4
            outs.append(rt.matmul(x, w, "h0.mlp.fc", "linear")[0])
            assert rt.block_calls == 1
        assert np.allclose(outs[0], outs[1], rtol=2e-2, atol=1e-2)


# ---------------------------------------------------------------------------------------------- Four over Six
def _four_over_six_oracle(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Independent 4/6 on (n, 16) blocks with ml_dtypes' casts (float8_e4m3fn, float4_e2m1fn; RNE)."""
    ml = pytest.importorskip("ml_dtypes")
    if not hasattr(ml, "float4_e2m1fn"):
        pytest.skip(f"ml_dtypes {ml.__version__} has no float4_e2m1fn")
    f32 = np.float32
    gam = f32(np.abs(x).max())
    s_enc = f32(f32(256.0 * 6.0) / gam)
    s_dec = f32(f32(1.0) / s_enc)
    bam = np.abs(x).max(axis=1).astype(f32)
    best_e = best_d = best_err = None
    for target in (6.0, 4.0):
        d = (bam * f32(s_enc * f32(1.0 / target))).astype(f32)
        d = np.minimum(d, f32(448)).astype(ml.float8_e4m3fn).astype(f32)
        with np.errstate(divide="ignore"):
            enc = np.minimum((f32(1.0) / (d * s_dec).astype(f32)).astype(f32), np.finfo(f32).max).astype(f32)
        sc = np.clip((x * enc[:, None]).astype(f32), -6, 6)
        e = sc.astype(ml.float4_e2m1fn).astype(f32)
        err = ((e.astype(np.float64) * (d.astype(np.float64) * np.float64(s_dec))[:, None] - x) ** 2).sum(axis=1)
        if best_e is None:
            best_e, best_d, best_err = e, d, err
        else:
            pick = err < best_err
            best_e = np.where(pick[:, None], e, best_e)
            best_d = np.where(pick, d, best_d)
    assert best_e is not None and best_d is not None
    return best_e, best_d


def test_four_over_six_matches_an_independent_oracle() -> None:
    g = np.random.default_rng(28)
    x = (g.standard_normal((20000, 16)) * np.exp(g.normal(0, 2, (20000, 1)))).astype(np.float32)
    x[:50] = 0.0                     # all-zero blocks
    x[50:100] = x[50:100, :1]        # all-equal blocks
    e, d, _ = nvfp4_quantize(x, block=16, four_over_six=True)
    oe, od = _four_over_six_oracle(x)
    assert int(np.count_nonzero(e != oe)) == 0 and int(np.count_nonzero(d.ravel() != od)) == 0
    e6, d6, _ = nvfp4_quantize(x, block=16)
    assert np.count_nonzero(d != d6) > 0              # the rule changes some blocks
    with pytest.raises(TypeError, match="four_over_six"):
        nvfp4_quantize(x, four_over_six="yes")  # type: ignore[arg-type]


def test_four_over_six_lowers_the_error() -> None:
    g = np.random.default_rng(6)
    x = g.standard_normal((512, 64)).astype(np.float32)
    from fpsim.scaling import nvfp4_dequantize

    errs = []
    for fos in (False, True):
        for blk in (16, (16, 16)):
            q, d, s = nvfp4_quantize(x, block=blk, four_over_six=fos)
            errs.append(float(((nvfp4_dequantize(q, d, s, block=blk) - x) ** 2).mean()))
    assert errs[2] < errs[0] and errs[3] < errs[1]
