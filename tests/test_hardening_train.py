"""Issue 12, items 11-12 and section 3: trainer inputs and configs are checked before any work, and every
name in the precision/training layers parses by the one rule (fpsim._names).

The outcome before the fix is noted beside each case; cases without a note are controls, or bounds that
held already and are kept next to the new ones.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import numpy as np
import pytest

from fpsim.amp import (
    SGD,
    AdamW,
    DynamicLossScaler,
    FP8Recipe,
    LossScaler,
    Policy,
    QuantConfig,
    get_policy,
    make_optimizer,
    register_policy,
)
from fpsim.nn import GPTConfig, attention_forward, cross_entropy_forward, embedding_forward, gpt_forward, init_params
from fpsim.nn import softmax_forward
from fpsim.train import CharText, ModularAddition, SequenceTask, Task, TrainConfig, Trainer, get_task, lr_at
from fpsim.train.checkpoint import load_checkpoint, save_checkpoint

ROOT = Path(__file__).resolve().parent.parent
NAN, INF = float("nan"), float("inf")
CFG = GPTConfig(vocab_size=6, block_size=6, n_layer=1, n_head=2, n_embd=8)
IDX = np.zeros((2, 6), dtype=np.int64)


@pytest.fixture(scope="module")
def params():
    return init_params(CFG, seed=0)


def small(**kw):
    base = dict(task="reverse", task_kwargs={"n_symbols": 5, "length": 3}, model=CFG, steps=2, batch_size=2,
                eval_batches=1)
    return TrainConfig(**{**base, **kw})


# ------------------------------------------------------------------------------------------ item 11: ids

@pytest.mark.parametrize("ids, match", [
    (IDX - 1, r"idx\[0, 0\] = -1 is not a valid id: need 0 <= id < 6"),   # before: read the last row silently
    (IDX + 6, r"idx\[0, 0\] = 6 is not a valid id"),                       # before: IndexError
    (np.array([[0, 1, 2, 3, 4, 2**40]]), r"idx\[0, 5\] = 1099511627776"),
], ids=["minus-one", "vocab-size", "huge"])
def test_out_of_range_token_ids_raise_naming_the_value(params, ids, match):
    with pytest.raises(ValueError, match=match):
        gpt_forward(params, CFG, ids, None)
    with pytest.raises(ValueError, match="is not a valid id"):
        embedding_forward(ids, params["wte"])


@pytest.mark.parametrize("targets, match", [
    (IDX - 2, r"targets\[0, 0\] = -2 is not a valid id: need 0 <= id < 6 or = -1 \(ignored\)"),  # before: scored
    (IDX + 6, r"targets\[0, 0\] = 6"),                                                             # before: IndexError
], ids=["minus-two", "vocab-size"])
def test_out_of_range_targets_raise(params, targets, match):
    with pytest.raises(ValueError, match=match):
        gpt_forward(params, CFG, IDX, targets)
    with pytest.raises(ValueError, match=match):
        cross_entropy_forward(np.zeros((2, 6, 6), np.float32), targets)


def test_ignore_index_still_ignored(params):
    y = np.array([[1, 2, -1, -1, 3, -1], [0, -1, 5, 4, -1, 1]])
    keep = y != -1
    logits, loss, _ = gpt_forward(params, CFG, IDX, y)
    z = logits.astype(np.float64)
    logp = z - z.max(-1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
    want = -np.mean(logp[keep, y[keep]])
    assert math.isclose(float(loss), want, rel_tol=1e-5)


@pytest.mark.parametrize("ids, targets, exc, match", [
    (IDX.astype(np.float64), IDX, TypeError, "idx must be an integer array, got dtype float64"),   # before: IndexError
    (IDX.astype(bool), IDX, TypeError, "idx must be an integer array, got dtype bool"),
    (IDX.astype(object), IDX, TypeError, "got dtype object"),
    (IDX, IDX + 0.5, TypeError, "targets must be an integer array"),                              # before: IndexError
    (IDX, IDX[:, :3], ValueError, r"targets must have idx's shape \(2, 6\), got \(2, 3\)"),      # before: IndexError
    (IDX[:, :0], IDX[:, :0], ValueError, "at least one sequence of at least one token"),  # before: NumPy reduction
    (IDX[:0], IDX[:0], ValueError, "at least one sequence"),                                      # before: loss 0.0
    (IDX[0], None, ValueError, r"idx must be \(B, T\)"),
], ids=["float-ids", "bool-ids", "object-ids", "float-targets", "shape", "zero-length", "empty-batch", "1-d"])
def test_bad_ids_kinds_and_shapes(params, ids, targets, exc, match):
    with pytest.raises(exc, match=match):
        gpt_forward(params, CFG, ids, targets)


def test_ids_accepted_in_every_integer_layout(params):
    want = float(gpt_forward(params, CFG, IDX, IDX)[1])
    ro = IDX.copy()
    ro.flags.writeable = False
    for ids in (IDX.astype(np.uint8), IDX.astype(">i8"), np.zeros((4, 6), np.int64)[::2], ro, IDX.tolist()):
        assert float(gpt_forward(params, CFG, ids, ids)[1]) == want


def test_forward_checks_its_other_arguments(params):
    with pytest.raises(TypeError, match="ignore_index must be an int"):
        gpt_forward(params, CFG, IDX, IDX, ignore_index=1.5)
    with pytest.raises(ValueError, match="loss_normalizer must be an int >= 1, got 0"):
        gpt_forward(params, CFG, IDX, IDX, loss_normalizer=0)
    with pytest.raises(TypeError, match="loss_normalizer must be an int, got float"):
        gpt_forward(params, CFG, IDX, IDX, loss_normalizer=2.5)   # before: truncated to 2 silently
    with pytest.raises(TypeError, match="prec must implement"):
        gpt_forward(params, CFG, IDX, IDX, prec="bf16")   # None now means: the ambient autocast, else FULL
    with pytest.raises(TypeError, match="cfg must be a GPTConfig"):
        gpt_forward(params, {}, IDX, IDX)
    with pytest.raises(ValueError, match=r"unexpected \['extra'\]"):
        gpt_forward({**params, "extra": params["wte"]}, CFG, IDX, IDX)
    with pytest.raises(TypeError, match=r"params\['wte'\] must be a float NumPy array"):
        gpt_forward({**params, "wte": params["wte"].astype(np.int32)}, CFG, IDX, IDX)
    with pytest.raises(TypeError, match="normalizer must be an int"):
        cross_entropy_forward(np.zeros((2, 3)), np.zeros(2, int), normalizer=1.5)
    with pytest.raises(ValueError, match="logits must be a float array"):
        cross_entropy_forward(np.zeros((2, 0)), np.zeros(2, int))
    with pytest.raises(ValueError, match="at least one entry"):
        softmax_forward(np.zeros((2, 0)))                                   # before: NumPy reduction error
    with pytest.raises(ValueError, match="n_head must be an int >= 1"):    # before: ZeroDivisionError
        attention_forward(np.zeros((1, 2, 4)), np.zeros((4, 12)), None, np.zeros((4, 4)), None, 0)


def test_masked_ids_and_weights_are_refused(params):
    masked = np.ma.array(IDX + 1, mask=IDX == 0)      # before: the mask was dropped silently
    with pytest.raises(TypeError, match="idx: masked arrays are not supported"):
        gpt_forward(params, CFG, masked, IDX)
    with pytest.raises(TypeError, match="targets: masked arrays"):
        gpt_forward(params, CFG, IDX, masked)
    with pytest.raises(TypeError, match=r"init\['wte'\]: masked arrays"):
        Trainer("fp32", small(), init={**params, "wte": np.ma.array(params["wte"], mask=params["wte"] > 0)})


@pytest.mark.parametrize("kw, exc", [
    ({"vocab_size": 6.0}, TypeError), ({"n_layer": True}, TypeError), ({"n_embd": "8"}, TypeError),
    ({"init_std": INF}, ValueError),          # before: accepted, inf weights
    ({"ln_eps": -1.0}, ValueError),           # before: accepted, NaN activations
    ({"ln_eps": NAN}, ValueError),
    ({"tie_weights": "no"}, TypeError),       # before: accepted ("no" is truthy)
    ({"bias": 0}, TypeError),
])
def test_gptconfig_checks_every_field(kw, exc):
    with pytest.raises(exc, match=f"GPTConfig.{next(iter(kw))}"):
        GPTConfig(**kw)


def test_gptconfig_stores_python_ints_and_init_params_checks_dtype():
    c = GPTConfig(vocab_size=np.int64(6), block_size=6, n_layer=1, n_head=2, n_embd=8)
    assert type(c.vocab_size) is int and c == CFG
    with pytest.raises(TypeError, match="float dtype"):
        init_params(CFG, dtype=np.int32)
    with pytest.raises(TypeError, match="cfg must be a GPTConfig"):
        init_params({})


def test_trainer_refuses_bad_batches_before_any_update():
    class BadTask(Task):
        name, vocab_size, seq_len = "bad", 6, 6

        def batch(self, rng, batch_size):
            x = np.zeros((batch_size, 6), np.int64)
            return x - 1, x

    tr = Trainer("fp32", small(), task=BadTask())
    w0 = {k: v.copy() for k, v in tr.store.weights.items()}
    with pytest.raises(ValueError, match="idx.* = -1 is not a valid id"):
        tr.step()
    assert tr.step_count == 0 and all(np.array_equal(w0[k], tr.store.weights[k]) for k in w0)


# ------------------------------------------------------------------------------------------ item 11: init=

@pytest.mark.parametrize("change, exc, match", [
    (lambda p: {k: v for k, v in p.items() if k != "wpe"}, ValueError, r"missing \['wpe'\]"),      # before: KeyError
    (lambda p: {**p, "bogus": p["wte"]}, ValueError, r"unexpected \['bogus'\]"),                 # before: accepted
    (lambda p: {**p, "wte": p["wte"][:3]}, ValueError, r"init\['wte'\] has shape \(3, 8\)"),     # before: IndexError
    (lambda p: {**p, "wte": p["wte"].astype(np.int32)}, TypeError, "dtype int32"),
    (lambda p: {**p, "wte": p["wte"].astype(complex)}, TypeError, "dtype complex128"),
    (lambda p: {**p, "wte": p["wte"].tolist()}, TypeError, "got list"),
    (lambda p: {**p, "wte": p["wte"] * NAN}, ValueError, r"init\['wte'\] holds inf or NaN"),     # before: NaN loss
    (lambda p: {**p, "lnf.g": p["lnf.g"] + INF}, ValueError, "inf or NaN"),
    (lambda p: list(p.values()), TypeError, "init must be a mapping"),
], ids=["missing", "extra", "shape", "int", "complex", "list", "nan", "inf", "not-a-mapping"])
def test_init_weights_are_validated(params, change, exc, match):
    with pytest.raises(exc, match=match):
        Trainer("fp32", small(), init=change(params))


def test_valid_init_is_used_and_not_modified(params):
    init = {k: v.astype(np.float64) for k, v in params.items()}
    snap = {k: v.copy() for k, v in init.items()}
    tr = Trainer("fp32", small(), init=init)
    tr.run()
    assert all(np.array_equal(init[k], snap[k]) for k in init)


# ------------------------------------------------------------------------------------------ TrainConfig

@pytest.mark.parametrize("field, value, exc", [
    ("min_lr_frac", -0.5, ValueError),    # before: accepted, negative learning rate
    ("min_lr_frac", NAN, ValueError),     # before: accepted, NaN learning rate
    ("min_lr_frac", 1.5, ValueError),
    ("min_lr_frac", "0.1", TypeError),
    ("steps", 0, ValueError), ("steps", 1.5, TypeError), ("steps", True, TypeError), ("steps", "10", TypeError),
    ("batch_size", 0, ValueError), ("batch_size", 2.0, TypeError), ("eval_batches", 0, ValueError),
    ("micro_batches", 0, ValueError), ("micro_batches", True, TypeError),
    ("warmup", -1, ValueError), ("eval_every", -1, ValueError), ("telemetry_every", -1, ValueError),
    ("histogram_every", -1, ValueError), ("seed", -1, ValueError), ("seed", 1.5, TypeError),
    ("lr", 0, ValueError), ("lr", -1e-3, ValueError), ("lr", NAN, ValueError), ("lr", INF, ValueError),
    ("lr", "1e-3", TypeError), ("lr", True, TypeError), ("lr", 1j, TypeError),
    ("weight_decay", -0.1, ValueError), ("weight_decay", NAN, ValueError), ("weight_decay", "0", TypeError),
    ("betas", (0.9,), TypeError), ("betas", (0.9, 1.0), ValueError), ("betas", (NAN, 0.9), ValueError),
    ("betas", "ab", TypeError), ("eps", -1.0, ValueError), ("eps", INF, ValueError),
    ("momentum", 1.0, ValueError), ("momentum", NAN, ValueError),
    ("optimizer", "lion", ValueError), ("optimizer", "", ValueError), ("optimizer", None, TypeError),
    ("task", "nope", ValueError), ("task", "", ValueError), ("task", 3, TypeError),
    ("task_kwargs", {"bogus": 1}, ValueError), ("task_kwargs", {"n_symbols": 1}, ValueError),
    ("task_kwargs", {"n_symbols": "5"}, TypeError), ("task_kwargs", None, TypeError),
    ("model", {}, TypeError),
])
def test_every_trainconfig_field_is_checked_at_construction(field, value, exc):
    with pytest.raises(exc, match=re.escape(field) if field not in ("task", "task_kwargs") else None):
        small(**{field: value})


def test_trainconfig_stores_canonical_names_and_python_numbers():
    c = small(task=" Reverse", optimizer=" AdamW ", steps=np.int64(3), lr=np.float32(0.5), betas=[0.9, 0.99])
    assert c.task == "reverse" and c.optimizer == "adamw"
    assert type(c.steps) is int and type(c.lr) is float and c.betas == (0.9, 0.99)
    assert TrainConfig.from_dict(c.as_dict()) == c


def test_lr_never_negative_and_lr_at_checks_its_step():
    cfg = TrainConfig(steps=50, warmup=5, min_lr_frac=0.0)
    assert min(lr_at(cfg, s) for s in range(60)) >= 0.0
    with pytest.raises(ValueError, match="step must be an int >= 0"):
        lr_at(cfg, -1)
    with pytest.raises(TypeError, match="step must be an int"):
        lr_at(cfg, 1.5)


def test_trainer_checks_its_arguments():
    with pytest.raises(TypeError, match="config must be a TrainConfig"):
        Trainer("fp32", {})                                            # before: AttributeError
    with pytest.raises(TypeError, match="task must be a fpsim.train.Task"):
        Trainer("fp32", small(), task="reverse")
    tr = Trainer("fp32", small())
    with pytest.raises(ValueError, match="steps must be an int >= 0"):
        tr.run(-1)
    with pytest.raises(TypeError, match="steps must be an int"):
        tr.run(1.5)                                                    # before: truncated to 1
    with pytest.raises(ValueError, match="checkpoint_every"):
        tr.run(checkpoint_every=-1)


# ------------------------------------------------------------------------------------------ item 12: recipes

def test_misspelt_fp8_kind_raises_listing_the_valid_kinds():
    # before: accepted, and the policy trained without any FP8 GEMM
    with pytest.raises(ValueError, match="FP8Recipe.kinds: unknown GEMM kind 'linaer'; valid: linear, attn, lm_head"):
        FP8Recipe(kinds=("linaer",))
    with pytest.raises(TypeError, match="must be a tuple of GEMM kinds"):
        FP8Recipe(kinds="linear")                                      # before: a tuple of letters
    with pytest.raises(ValueError, match="empty"):
        FP8Recipe(kinds=())
    assert FP8Recipe(kinds=(" Linear", "LM_HEAD", "linear")).kinds == ("linear", "lm_head")
    # canonical order, whatever the container: the policy fingerprint (checked on resume) cannot vary
    assert FP8Recipe(kinds={"lm_head", "attn"}).kinds == ("attn", "lm_head")
    assert QuantConfig(kinds=["lm_head", "attn"]).kinds == ("attn", "lm_head")


@pytest.mark.parametrize("kw, exc", [
    ({"margin": 0.5}, TypeError),             # before: failed at the first step
    ({"margin": True}, TypeError),
    ({"amax_history_len": 1.5}, TypeError),   # before: truncated to 1
    ({"amax_history_len": 0}, ValueError),
    ({"amax_compute_algo": "mean"}, ValueError),
    ({"forward": "nope"}, ValueError),
])
def test_fp8_recipe_fails_at_construction(kw, exc):
    with pytest.raises(exc, match=next(iter(kw))):
        FP8Recipe(**kw)


@pytest.mark.parametrize("kw, exc", [
    ({"kinds": ("linaer",)}, ValueError), ({"kinds": ()}, ValueError), ({"kinds": "linear"}, TypeError),
    ({"averaging_constant": 0.0}, ValueError), ({"averaging_constant": -1}, ValueError),
    ({"averaging_constant": NAN}, ValueError), ({"averaging_constant": "0.01"}, TypeError),
    ({"calibration_batches": 0}, ValueError), ({"calibration_batches": 1.5}, TypeError),
    ({"per_channel": "yes"}, TypeError), ({"per_channel": 1}, TypeError),
    ({"start": NAN}, ValueError), ({"start": "0.5"}, TypeError), ({"start": 1.0}, ValueError),
    ({"bits": 8.0}, TypeError), ({"bits": 1}, ValueError), ({"act_bits": 17}, ValueError),
    ({"mode": "fp8"}, ValueError),
])
def test_every_quantconfig_field_is_checked(kw, exc):
    # before: kinds, averaging_constant, calibration_batches and per_channel were not checked at all
    with pytest.raises(exc, match=next(iter(kw))):
        QuantConfig(**kw)


def test_policy_fails_at_construction_not_at_the_first_step():
    with pytest.raises(ValueError, match="unknown keys \\['bogus'\\]; valid: init_scale"):
        Policy("x", loss_scale="dynamic", scaler_kwargs={"bogus": 1})  # before: failed at the first step
    with pytest.raises(ValueError, match="growth_factor"):
        Policy("x", loss_scale="dynamic", scaler_kwargs={"growth_factor": 0.5})
    with pytest.raises(ValueError, match="apply only with loss_scale='dynamic'"):
        Policy("x", scaler_kwargs={"growth_interval": 8})              # before: ignored silently
    with pytest.raises(ValueError, match="Policy.gemm='fsat'.*unknown device"):
        Policy("x", gemm="fsat")                                       # before: failed at the first step
    with pytest.raises(ValueError, match="Policy.gemm='h100' \\(activations fp32\\)"):
        Policy("x", gemm="h100")                                       # before: failed at the first step
    with pytest.raises(ValueError, match="loss_scale"):
        Policy("x", loss_scale=INF)                                    # before: failed in make_scaler
    with pytest.raises(TypeError, match="Policy.fp8 must be an FP8Recipe"):
        Policy("x", fp8={"kinds": ("linear",)})
    with pytest.raises(TypeError, match="fp32_ops must be a set"):
        Policy("x", fp32_ops="layernorm")
    with pytest.raises(ValueError, match="both claim GEMM kinds \\['linear'\\]"):
        Policy("x", fp8=FP8Recipe(), quant=QuantConfig())
    with pytest.raises(TypeError, match="Policy.name must be a str"):
        Policy(3)


def test_policy_gemm_names_follow_the_one_rule():
    assert Policy("x", gemm="FAST").gemm == "fast"       # before: accepted, then unknown device at step 1
    assert Policy("x", gemm=" Fast64 ").gemm == "fast64"
    assert Policy("x", gemm=" A100-SXM4 ", params="bf16", activations="bf16", gradients="bf16").gemm == "a100"
    tr = Trainer(Policy("x", gemm="FAST"), small())
    tr.step()


# ------------------------------------------------------------------------------------------ item 12: names

def test_names_parse_by_the_one_rule_in_every_layer():
    # before: each of these raised "unknown ..." (or, for the task, failed later in the Trainer)
    assert get_policy(" FP16-Mixed ") is get_policy("fp16-mixed")
    assert get_task(" Sort ").name == "sort" and SequenceTask(kind="COPY").name == "copy"
    assert small(task=" Reverse ", optimizer="SGD").optimizer == "sgd"
    pol = get_policy("fp32")
    assert isinstance(make_optimizer(" AdamW ", pol, pol.runtime()), AdamW)
    assert isinstance(make_optimizer("SGD", pol, pol.runtime()), SGD)
    assert pol.memory_ledger("ADAMW") == pol.memory_ledger("adamw")
    assert FP8Recipe(amax_compute_algo=" MOST_RECENT").amax_compute_algo == "most_recent"
    assert QuantConfig(mode=" PTQ").mode == "ptq"
    p = Policy("x", loss_scale=" Dynamic", fp32_ops={" LayerNorm", "SOFTMAX"}, rounding=" RNE")
    assert p.loss_scale == "dynamic" and p.fp32_ops == {"layernorm", "softmax"} and p.rounding == "rne"
    with pytest.raises(ValueError, match="unknown policy 'nope'; valid: fp32"):
        get_policy("nope")
    with pytest.raises(TypeError, match="policy must be a Policy or a name"):
        get_policy(3)


def test_registry_refuses_names_that_differ_only_by_case():
    with pytest.raises(ValueError, match="a policy named 'fp32' is already registered"):
        register_policy(Policy("FP32"))
    with pytest.raises(ValueError, match="white space"):
        register_policy(Policy(" padded "))


# ------------------------------------------------------------------------------------------ scalers, optimizers

@pytest.mark.parametrize("make, exc, match", [
    (lambda: LossScaler("8"), TypeError, "scale must be a real number"),                 # before: accepted
    (lambda: DynamicLossScaler(growth_factor="2"), TypeError, "growth_factor"),          # before: accepted
    (lambda: DynamicLossScaler(backoff_factor=0.0), ValueError, "backoff_factor"),       # before: scale 0
    (lambda: DynamicLossScaler(backoff_factor=-0.5), ValueError, "backoff_factor"),      # before: accepted
    (lambda: DynamicLossScaler(growth_interval=1.5), TypeError, "growth_interval must be an int"),
    (lambda: SGD(lr=INF), ValueError, "lr must be finite"),                              # before: accepted
    (lambda: SGD(lr="0.1"), TypeError, "SGD lr must be a real number"),   # before: "'>=' not supported"
    (lambda: AdamW(betas=0.9), TypeError, "betas must be a pair"),        # before: "cannot unpack"
    (lambda: AdamW(eps=NAN), ValueError, "eps"),
    (lambda: SGD(cast_state=3), TypeError, "cast_state must be callable"),               # before: accepted
    (lambda: make_optimizer("sgd", "fp32", None), TypeError, "policy must be a Policy"),  # AttributeError
])
def test_scalers_and_optimizers_check_kinds(make, exc, match):
    with pytest.raises(exc, match=match):
        make()


# ------------------------------------------------------------------------------------------ tasks

@pytest.mark.parametrize("make, exc, match", [
    (lambda: get_task("sort", bogus=1), ValueError, r"takes no arguments \['bogus'\]"),  # before: raw TypeError
    (lambda: SequenceTask(n_symbols=2.5), TypeError, "n_symbols must be an int"),        # before: accepted
    (lambda: ModularAddition(p="7"), TypeError, "p must be an int"),           # before: "'<' not supported"
    (lambda: CharText(3), TypeError, "text must be a str"),                    # before: "has no len()"
    (lambda: CharText("abcdefgh", seq_len=1.5), TypeError, "seq_len must be an int"),    # before: accepted
    (lambda: get_task("sort").batch(np.random.default_rng(0), 0), ValueError, "batch_size"),  # empty batch
    (lambda: get_task("sort").batch(0, 2), TypeError, "rng must be a numpy.random.Generator"),  # AttributeError
])
def test_tasks_check_their_arguments(make, exc, match):
    with pytest.raises(exc, match=match):
        make()


# ------------------------------------------------------------------------------------------ section 3

def test_default_trainconfig_trains():
    # before: ValueError "model vocab_size 16 != task vocab_size 11"
    cfg = TrainConfig(steps=2, batch_size=2, eval_batches=1)
    tr = Trainer("fp32", cfg)
    h = tr.run()
    assert len(h) == 2 and all(math.isfinite(v) for v in h["loss"])
    assert tr.model == GPTConfig(vocab_size=11, block_size=16) == cfg.model_for(tr.task)
    assert TrainConfig().model is None and TrainConfig.from_dict(cfg.as_dict()) == cfg


def test_model_none_is_sized_for_whatever_task_is_run():
    short = dict(steps=1, batch_size=2, eval_batches=1)
    text = CharText("hello world, hello fpsim", seq_len=8)
    for cfg, task in [(TrainConfig(task="modadd", task_kwargs={"p": 7}, **short), None),
                      (dataclasses.replace(TrainConfig(**short), task="sort"), None),
                      (TrainConfig(**short), text)]:
        tr = Trainer("fp32", cfg, task=task)
        tr.run()
        assert (tr.model.vocab_size, tr.model.block_size) == (tr.task.vocab_size, tr.task.seq_len)


def test_model_none_checkpoint_round_trip(tmp_path):
    cfg = TrainConfig(steps=2, batch_size=2, eval_batches=1, eval_every=0)
    tr = Trainer("fp32", cfg)
    tr.run(1)
    path = str(tmp_path / "ck.npz")
    save_checkpoint(tr, path)
    back = load_checkpoint(path)
    assert back.config == cfg and back.model == tr.model
    assert all(np.array_equal(back.store.weights[k], tr.store.weights[k]) for k in tr.store.weights)


def _docs_block() -> str:
    text = (ROOT / "docs" / "training.md").read_text(encoding="utf-8")
    section = text.split("## Training in three lines", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_docs_training_page_shows_the_three_lines_and_they_run(capsys):
    code = _docs_block()
    lines = [ln for ln in code.splitlines() if ln.strip()]
    assert lines[0].startswith("from fpsim.train import") and "TrainConfig(" in lines[1] and ".run()" in lines[2]
    # As written but shorter (the page says steps=20): the test stays well under a second.
    exec(compile(re.sub(r"steps=\d+", "steps=2", code), "docs/training.md", "exec"), {})
    assert math.isfinite(float(capsys.readouterr().out.strip()))
