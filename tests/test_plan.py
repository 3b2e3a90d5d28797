"""Issue 13, part 3: the planner (fpsim.plan, ``fpsim plan``) against the published figures.

Anchors: ZeRO (Rajbhandari et al., arXiv 1910.02054), Korthikanti et al. (arXiv 2205.05198, section 4 and
Table 2), Narayanan et al. (arXiv 2104.04473, eq. 3), Chinchilla (Hoffmann et al., arXiv 2203.15556,
Table 3) and QLoRA (Dettmers et al., arXiv 2305.14314, section 3). The published numbers are written out
here as the papers print them; the planner computes them from its own per-tensor accounting.
"""

from __future__ import annotations

import json
import math

import pytest

import fpsim.plan as P
from fpsim.plan import MEMORY_KEYS, ModelSpec

GB = 1e9


def gpt(L: int, h: int, a: int, s: int, V: int = 51200) -> ModelSpec:
    return ModelSpec("gpt", n_layer=L, n_embd=h, n_head=a, vocab_size=V, seq_len=s, dropout=True)


# -- ZeRO ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("recipe", ["fp16-mixed", "bf16-mixed", " FP16-Mixed "])
def test_zero_16_bytes_per_parameter_for_mixed_precision_adam(recipe: str) -> None:
    p = P.memory(1e9, recipe=recipe, optimizer="adamw")
    assert dict(p.bytes_per_param) == {"weights": 2, "grads": 2, "master": 4, "optimizer": 8, "total": 16}


def test_zero_figure1_7_5b_on_64_ranks() -> None:
    """ZeRO Figure 1: Psi = 7.5e9, K = 12, N_d = 64: 120 GB, then 31.4 / 16.6 / 1.9 GB at stages 1/2/3.

    The paper's GB is 1e9 bytes: 16 * 7.5e9 = 120e9 bytes is "120GB", while in GiB it would be 111.8.
    """
    got = [P.memory(7.5e9, recipe="fp16-mixed", dp=64, zero=z).per_device["total"] for z in range(4)]
    assert got == [120_000_000_000, 31_406_250_000, 16_640_625_000, 1_875_000_000]  # exact: (2+2+12) Psi / ...
    assert [round(g / GB, 1) for g in got] == [120.0, 31.4, 16.6, 1.9]
    assert round(got[0] / 2**30, 1) == 111.8  # not the paper's 120: its GB is decimal


def test_zero_stages_partition_the_right_states() -> None:
    n, nd = 7.5e9, 64
    for z in range(4):
        d = P.memory(n, recipe="fp16-mixed", dp=nd, zero=z).per_device
        assert d["weights"] == (2 * n / nd if z >= 3 else 2 * n)
        assert d["grads"] == (2 * n / nd if z >= 2 else 2 * n)
        assert d["master"] == (4 * n / nd if z >= 1 else 4 * n)
        assert d["optimizer"] == (8 * n / nd if z >= 1 else 8 * n)
        assert d["total"] == sum(d[k] for k in MEMORY_KEYS[:-1])
    p = P.memory(n, recipe="fp16-mixed", dp=1, zero=3)
    assert p.per_device["total"] == 16 * n and any("dp=1" in note for note in p.notes)


# -- Korthikanti et al. ------------------------------------------------------------------------------------


@pytest.mark.parametrize("L, h, a, s, b", [(1, 64, 4, 32, 2), (96, 12288, 96, 2048, 1), (105, 20480, 128, 2048, 3),
                                           (2, 48, 3, 7, 5)])
def test_korthikanti_per_layer_formula(L: int, h: int, a: int, s: int, b: int) -> None:
    """Section 4.1: a GPT layer with dropout keeps s b h (34 + 5 a s / h) bytes in 16 bits."""
    m = gpt(L, h, a, s)
    t = P.activation_terms(m, micro_batch=b)
    assert sum(t.values()) == s * b * h * (34 + 5 * a * s / h)
    # Selective recomputation or a flash kernel: the 5 a s^2 b term goes (flash keeps its FP32 log-sum-exp).
    r = P.activation_bytes(m, micro_batch=b, checkpoint="selective", flash=False, outside_layers=False)
    assert r["layers"] == L * 34 * s * b * h
    f = P.activation_bytes(m, micro_batch=b, flash=True, outside_layers=False)
    assert f["layers"] == L * (34 * s * b * h + 4 * a * s * b)
    full = P.activation_bytes(m, micro_batch=b, checkpoint="blocks", outside_layers=False)
    assert full["layers"] == L * 2 * s * b * h


def test_korthikanti_table2_with_tensor_parallelism() -> None:
    """Table 2, activation memory per transformer layer for t-way tensor parallelism (GPT-3 175B, t = 8)."""
    s, b, h, a, L, t = 2048, 1, 12288, 96, 96, 8
    m = gpt(L, h, a, s)

    def layers(**kw: object) -> float:
        return P.activation_bytes(m, micro_batch=b, outside_layers=False, flash=False, tp=t, **kw)["layers"]

    sbhL = s * b * h * L
    assert layers() == pytest.approx(sbhL * (10 + 24 / t + 5 * a * s / (h * t)), rel=1e-15)
    assert layers(sequence_parallel=True) == pytest.approx(sbhL * (34 / t + 5 * a * s / (h * t)), rel=1e-15)
    assert layers(checkpoint="selective") == pytest.approx(sbhL * (10 + 24 / t), rel=1e-15)
    assert layers(checkpoint="selective", sequence_parallel=True) == pytest.approx(sbhL * 34 / t, rel=1e-15)
    assert layers(checkpoint="blocks") == 2 * sbhL  # "full activation recomputation: 2 s b h L"


def test_korthikanti_gpt3_and_mtnlg_selective_savings() -> None:
    """Section 5: 5 a s / h = 80 for GPT-3 (a 96, s 2048, h 12288) and 64 for MT-NLG (a 128, h 20480), so
    selective recomputation removes 80/114 = 70% and 64/98 = 65% of the activation memory."""
    for m, ratio, pct in ((P.get_model("gpt3-175b"), 80, 0.70), (gpt(105, 20480, 128, 2048), 64, 0.65)):
        assert 5 * m.n_head * m.seq_len / m.n_embd == ratio
        none = P.activation_bytes(m, flash=False, outside_layers=False)["layers"]
        sel = P.activation_bytes(m, flash=False, checkpoint="selective", outside_layers=False)["layers"]
        assert round(1 - sel / none, 2) == pct


def test_activations_outside_layers_and_element_size() -> None:
    """Section 4.3: embedding dropout mask s b h, final norm and output GEMM inputs 4 s b h, FP32 logits 4 s b v."""
    m = gpt(2, 64, 4, 32, V=100)
    r = P.activation_bytes(m, micro_batch=3, flash=False)
    s, b, h, v = 32, 3, 64, 100
    assert r["outside_layers"] == s * b * h + 4 * s * b * h + 4 * s * b * v
    # FP32 activations: the 16-bit tensors double, the 1-byte masks do not: 66 s b h + 9 a s^2 b.
    t = P.activation_terms(m, micro_batch=b, element_bytes=4)
    assert sum(t.values()) == 66 * s * b * h + 9 * 4 * s * s * b
    p32 = P.memory(model=m, recipe="fp32", flash=False, micro_batch=b)
    assert p32.per_device["activations"] == math.ceil(P.activation_bytes(m, micro_batch=b, flash=False,
                                                                         element_bytes=4)["total"])


def test_every_kth_block_checkpointing_counts_like_gptconfig() -> None:
    m = gpt(5, 64, 4, 16)
    full = P.activation_terms(m)
    kept = 2 * 16 * 64
    r = P.activation_bytes(m, checkpoint=2, flash=False, outside_layers=False)  # blocks 0, 2, 4 recomputed
    assert r["layers"] == 3 * kept + 2 * sum(full.values())
    assert P.activation_bytes(m, checkpoint=1, outside_layers=False)["layers"] == \
        P.activation_bytes(m, checkpoint="blocks", outside_layers=False)["layers"]


def test_no_dropout_gqa_and_swiglu_terms() -> None:
    m = P.get_model("llama3-8b")
    t = P.activation_terms(m, flash=True)
    s, h, kv, f, a = 8192, 4096, 1024, 14336, 32
    assert not any("dropout" in k for k in t)
    assert t["q,k"] == 2 * s * (h + kv) and t["v"] == 2 * s * kv and t["gate,up"] == 2 * 2 * s * f
    assert t["softmax.lse"] == 4 * a * s
    assert sum(t.values()) == 2 * s * (5 * h + 2 * kv + 3 * f) + 4 * a * s + 2 * s * h


# -- model shapes and recipes -------------------------------------------------------------------------------


@pytest.mark.parametrize("name, rel", [("gpt3-175b", 3e-3), ("llama3-8b", 1e-4), ("llama3-70b", 1e-3)])
def test_named_models_match_their_published_parameter_counts(name: str, rel: float) -> None:
    m = P.get_model(name)
    assert m.published_params is not None
    assert m.param_count() == pytest.approx(m.published_params, rel=rel)


def test_demo_model_is_the_demo_gpt() -> None:
    from fpsim.nn import count_params, init_params
    from fpsim.train.demo import DemoSettings

    cfg = DemoSettings().train_config().model
    assert P.get_model("demo").param_count() == count_params(init_params(cfg))
    assert P.get_model(cfg).param_count() == count_params(init_params(cfg))
    assert P.memory(model="demo").n_params == count_params(init_params(cfg))


@pytest.mark.parametrize("recipe, total", [("fp32", 16), ("bf16-sr-bf16-states", 8), ("fp8-bf16-master", 13),
                                           ("bf16-sr", 8), ("fp8", 13), ("fp16-no-master", 12),
                                           ("bf16-pure-sr", 12), ("fp8-hybrid", 16), ("fp16-mixed", 16),
                                           ("int8-qat", 16)])
def test_recipe_bytes_per_parameter_with_adam(recipe: str, total: float) -> None:
    assert P.memory(1e6, recipe=recipe).bytes_per_param["total"] == total


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_policy_recipes_agree_with_the_policies_own_ledger(optimizer: str) -> None:
    from fpsim.amp import get_policy, policy_names

    for name in policy_names():
        led = get_policy(name).memory_ledger(optimizer)
        bpp = P.memory(1e6, recipe=name, optimizer=optimizer).bytes_per_param
        assert (bpp["weights"], bpp["grads"], bpp["master"], bpp["optimizer"]) == \
            (led["weights"], led["grads"], led["master"], led["optimizer_state"]), name


def test_every_recipe_is_a_policy_or_planner_only() -> None:
    """A recipe name is either a registered policy (and then stores what the policy's memory_ledger says)
    or one of the planner-only recipes, whose description says so; the old names bf16-sr / fp8 (planner
    recipes that were easy to read as the policies bf16-pure-sr / fp8-hybrid) resolve to the renamed ones."""
    from fpsim.amp import get_policy, policy_names
    from fpsim.plan.memory import _RECIPES

    pols = set(policy_names())
    only = [n for n in P.recipe_names() if n not in pols]
    assert only == ["bf16-sr-bf16-states", "fp8-bf16-master", "qlora"] and not set(_RECIPES) & pols
    for name in P.recipe_names():
        r = P.get_recipe(name)
        if name in pols:
            led = get_policy(name).memory_ledger()
            assert (r.weights, r.grads, r.master, 2 * r.state) == \
                (led["weights"], led["grads"], led["master"], led["optimizer_state"]), name
            assert r.activations == get_policy(name).activations.width // 8
        else:
            assert r.description.startswith("planner-only"), name
    assert P.get_recipe(" BF16-SR ").name == "bf16-sr-bf16-states" and P.get_recipe("fp8").name == "fp8-bf16-master"
    assert P.memory(1e6, recipe="bf16-pure-sr").bytes_per_param["optimizer"] == 8      # FP32 moments
    assert P.memory(1e6, recipe="bf16-sr-bf16-states").bytes_per_param["optimizer"] == 4


def test_optimizer_states() -> None:
    per = {o: P.memory(1e6, recipe="fp32", optimizer=o).bytes_per_param["optimizer"]
           for o in ("adamw", "adam", "sgd", "sgd-no-momentum")}
    assert per == {"adamw": 8, "adam": 8, "sgd": 4, "sgd-no-momentum": 0}


def test_qlora_double_quantization_constants() -> None:
    """QLoRA section 3: constants cost 32/64 = 0.5 bits/param; double-quantized 8/64 + 32/(64*256) = 0.127,
    saving 0.373 bits/param, "approximately 3 GB for a 65B model"."""
    assert round(P.QLORA_CONSTANT_BITS, 3) == 0.127
    assert round(32 / 64 - P.QLORA_CONSTANT_BITS, 3) == 0.373
    assert round((32 / 64 - P.QLORA_CONSTANT_BITS) * 65e9 / 8 / GB) == 3
    m = P.get_model("llama3-8b")
    p = P.memory(model=m, recipe="qlora", lora_rank=64, activations=False)
    quant, lora = m.block_linear_params(), m.lora_params(64)
    other = m.param_count() - quant
    assert p.trainable_params == lora
    assert p.per_device["weights"] == math.ceil(quant * (4 + P.QLORA_CONSTANT_BITS) / 8 + other * 2 + lora * 2)
    assert p.per_device["grads"] == 2 * lora and p.per_device["master"] == 0
    assert p.per_device["optimizer"] == 8 * lora
    with pytest.raises(ValueError, match="needs model="):
        P.memory(8e9, recipe="qlora")


def test_qlora_65b_finetuning_figure() -> None:
    """QLoRA abstract: a 65B model needs ">780GB" to fine-tune in 16 bits (16-bit weights and gradients,
    32-bit Adam states: 12 bytes/param, fp16-no-master here) and fits "<48GB" with QLoRA (weights only here;
    LLaMA-65B: 80 layers, width 8192, FFN 22016, 64 heads, vocabulary 32000)."""
    llama65 = ModelSpec("llama-65b", n_layer=80, n_embd=8192, n_head=64, ffn_hidden=22016, vocab_size=32000,
                        seq_len=2048, gated_mlp=True, tied_embeddings=False, learned_positions=False, bias=False)
    assert llama65.param_count() == pytest.approx(65.2e9, rel=2e-3)
    assert P.memory(model=llama65, recipe="fp16-no-master", activations=False).per_device["total"] > 780 * GB
    q = P.memory(model=llama65, recipe="qlora", activations=False).per_device["total"]
    assert q < 48 * GB


# -- compute -----------------------------------------------------------------------------------------------


def test_chinchilla_6nd() -> None:
    """Chinchilla: 70B parameters on 1.4T tokens; 6 N D = 5.88e23 against the paper's budget of 5.76e23."""
    c = P.training_flops(70e9, 1.4e12)
    assert c == pytest.approx(5.88e23, rel=1e-12)
    assert abs(c / 5.76e23 - 1) < 0.021
    for n, flops, d in P.CHINCHILLA_TABLE3:  # the table's FLOPs column is 6 N D of its rounded N and D
        assert P.training_flops(n, d) == pytest.approx(flops, rel=0.05)


def test_chinchilla_compute_optimal_against_table3() -> None:
    """20 tokens/parameter: N within 4.1% and D within 7.7% of every Table 3 row (the worst is the 67B row,
    whose printed N and D are rounded); the power law fitted to the table: N within 1.3%, D within 5.7%."""
    for n, flops, d in P.CHINCHILLA_TABLE3:
        nr, dr = P.compute_optimal(flops)
        assert dr == pytest.approx(20 * nr) and 6 * nr * dr == pytest.approx(flops)
        assert abs(nr / n - 1) < 0.041 and abs(dr / d - 1) < 0.077
        nt, dt = P.compute_optimal(flops, method="table3")
        assert abs(nt / n - 1) < 0.013 and abs(dt / d - 1) < 0.057
    from fpsim.plan.compute import _table3_fit

    assert _table3_fit()[0] == pytest.approx(0.50, abs=0.005)  # the paper's approach-1 exponent a = 0.50
    n, d = P.compute_optimal(5.76e23)
    assert (round(n / 1e9), round(d / 1e12, 2)) == (69, 1.39)


def test_step_flops_narayanan_formulas() -> None:
    for m in (P.get_model("gpt3-175b"), gpt(105, 20480, 128, 2048), gpt(3, 64, 4, 32, V=17)):
        B, s, L, h, V = 4, m.seq_len, m.n_layer, m.n_embd, m.vocab_size
        f = P.step_flops(m, batch=B, checkpoint="blocks")
        assert f["model"] == pytest.approx(72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h)), rel=1e-14)
        assert f["hardware"] == pytest.approx(96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h)),
                                              rel=1e-14)
        assert P.step_flops(m, batch=B)["overhead"] == 0
        sel = P.step_flops(m, batch=B, checkpoint="selective")
        assert sel["hardware"] - sel["model"] == pytest.approx(4 * B * s * s * h * L, rel=1e-14)
    # A GPT layer's 6-FLOPs-per-parameter rule: model FLOPs ~ 6 N tokens for a model with s << 6h.
    m = P.get_model("gpt3-175b")
    assert P.step_flops(m)["model"] / (6 * m.param_count() * m.seq_len) == pytest.approx(1.0, abs=0.05)


def test_accelerator_table() -> None:
    assert {"v100", "a100", "h100-sxm", "h200", "b200", "mi300x", "tpu-v5p", "trainium2"} <= set(P.ACCELERATORS)
    for a in P.ACCELERATORS.values():
        assert a.source and set(a.peak_tflops) <= set(P.PRECISIONS) and all(v > 0 for v in a.peak_tflops.values())
        assert a.memory_gb > 0
    h = P.get_accelerator(" H100-SXM ")
    assert (h.peak_tflops["bf16"], h.peak_tflops["fp8"]) == (989.4, 1978.9)
    assert "fp4" in P.get_accelerator("b200").peak_tflops and "fp8" not in P.get_accelerator("a100").peak_tflops
    t = P.training_time(1e24, "h100-sxm", mfu=0.5, n_devices=100)
    assert t["bf16"] == 1e24 / (100 * 0.5 * 989.4e12) and list(t) == ["fp32", "tf32", "bf16", "fp16", "fp8"]
    with pytest.raises(ValueError, match="lists no dense fp8"):
        P.training_time(1e20, "tpu-v5p", precision="fp8")
    with pytest.raises(ValueError, match="valid: v100, a100"):
        P.get_accelerator("h800")


# -- the result object, bad input ---------------------------------------------------------------------------


def test_memory_plan_object() -> None:
    p = P.memory(model="gpt3-175b", recipe="bf16-mixed", dp=8, zero=3, checkpoint="selective")
    assert tuple(p.per_device) == MEMORY_KEYS
    assert p.per_device["total"] == sum(p.per_device[k] for k in MEMORY_KEYS[:-1])
    d = p.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert set(d) >= {"model", "n_params", "recipe", "optimizer", "dp", "zero", "checkpoint", "flash", "per_device",
                      "bytes_per_param", "activations_included"}
    text = str(p)
    assert text == p.to_markdown() and "| total |" in text and "gpt3-175b" in text
    assert "| activations |" in P.memory(1e9).to_markdown() and "n/a" in P.memory(1e9).to_markdown()
    with pytest.raises(Exception):
        p.dp = 2  # type: ignore[misc]
    with pytest.raises(TypeError):
        p.per_device["total"] = 0  # type: ignore[index]


@pytest.mark.parametrize("kwargs, exc, match", [
    ({"recipe": "bf17"}, ValueError, "valid: fp32, bf16-mixed, fp16-mixed, fp16-fast-scaler"),
    ({"recipe": "bf17"}, ValueError, "bf16-sr-bf16-states, fp8-bf16-master, qlora"),
    ({"optimizer": "lion"}, ValueError, "valid: adamw, adam, sgd, sgd-no-momentum"),
    ({"zero": 4}, ValueError, "zero"), ({"dp": 0}, ValueError, "dp"), ({"dp": 2.0}, TypeError, "dp"),
    ({"checkpoint": "all"}, ValueError, "valid: none, blocks, selective"),
    ({"checkpoint": 0}, ValueError, "k-th"), ({"checkpoint": 1.5}, TypeError, "checkpoint"),
    ({"recipe": 3}, TypeError, "recipe"), ({"flash": "yes"}, TypeError, "flash"),
    ({"model": "gpt5"}, ValueError, "valid: gpt3-175b, llama3-8b, llama3-70b, demo"),
    ({"model": 7}, TypeError, "model"),
])
def test_bad_input(kwargs: dict[str, object], exc: type, match: str) -> None:
    kw = {"n_params": 1e9, **kwargs}
    with pytest.raises(exc, match=match):
        P.memory(**kw)  # type: ignore[arg-type]


def test_bad_counts_and_missing_model() -> None:
    with pytest.raises(ValueError, match="whole number"):
        P.memory(1.5)
    with pytest.raises(ValueError, match="needs n_params or model"):
        P.memory()
    with pytest.raises(ValueError, match="divisible"):
        ModelSpec("x", n_layer=1, n_embd=10, n_head=3, vocab_size=2, seq_len=2)
    with pytest.raises(ValueError, match="flops"):
        P.compute_optimal(0)
    with pytest.raises(ValueError, match="valid: rule, table3"):
        P.compute_optimal(1e20, method="kaplan")


def test_plot_memory(tmp_path) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plans = {f"ZeRO-{z}": P.memory(model="llama3-8b", dp=8, zero=z, checkpoint="blocks") for z in range(4)}
    ax = P.plot_memory(plans, capacity=80)
    assert len(ax.patches) == 4 * 5 and ax.get_ylabel() == "GB per device"
    ax.figure.savefig(tmp_path / "m.png")
    plt.close(ax.figure)
    with pytest.raises(TypeError):
        P.plot_memory([1, 2])  # type: ignore[list-item]


# -- the command line ---------------------------------------------------------------------------------------


from _cli import run_cli  # noqa: E402  (shared by the CLI tests)


def test_cli_plan_zero_figures_json() -> None:
    from fpsim.plan.cli import COMPUTE_JSON_KEYS, PLAN_JSON_KEYS

    totals = []
    for z in range(4):
        rc, out, err = run_cli(["plan", "--params", "7.5e9", "--recipe", "fp16-mixed", "--dp", "64", "--zero", str(z),
                                "--json"])
        assert rc == 0 and err == ""
        d = json.loads(out)
        assert tuple(d) == PLAN_JSON_KEYS and d["compute"] is None
        assert tuple(d["memory"]["per_device"]) == MEMORY_KEYS
        totals.append(d["memory"]["per_device"]["total"])
    assert totals == [120_000_000_000, 31_406_250_000, 16_640_625_000, 1_875_000_000]
    rc, out, _ = run_cli(["plan", "--model", "LLAMA3-8B", "--tokens", "15e12", "--device", "h100-sxm", "--mfu", "0.4",
                          "--devices", "16000", "--json"])
    c = json.loads(out)["compute"]
    assert rc == 0 and tuple(c) == COMPUTE_JSON_KEYS and c["budget_from"] == "6ND"
    assert c["budget_flops"] == 6 * P.get_model("llama3-8b").param_count() * 15e12
    assert c["days"]["bf16"] == pytest.approx(c["budget_flops"] / (16000 * 0.4 * 989.4e12) / 86400)


def test_cli_plan_text_and_sizes() -> None:
    rc, out, err = run_cli(["plan", "--layers", "96", "--hidden", "12288", "--heads", "96", "--vocab", "51200",
                            "--seq-len", "2048", "--dropout", "--no-flash", "--checkpoint", "selective",
                            "--budget", "3.14e23", "--device", "a100"])
    assert rc == 0 and err == ""
    assert "per device (GB)" in out and "optimum" in out and "bf16" in out and "days" in out
    m = gpt(96, 12288, 96, 2048)
    want = P.memory(model=m, checkpoint="selective", flash=False)
    rc, out, _ = run_cli(["plan", "--layers", "96", "--hidden", "12288", "--heads", "96", "--vocab", "51200",
                          "--seq-len", "2048", "--dropout", "--no-flash", "--checkpoint", "selective", "--json"])
    assert json.loads(out)["memory"]["per_device"] == dict(want.per_device)


@pytest.mark.parametrize("argv, flag", [
    (["--model", "gpt5"], "--model"), (["--params", "abc"], "--params"), (["--params", "1.5"], "--params"),
    (["--params", "1e9", "--recipe", "fp9"], "--recipe"), (["--params", "1e9", "--optimizer", "lion"], "--optimizer"),
    (["--params", "1e9", "--zero", "4"], "--zero"), (["--params", "1e9", "--dp", "0"], "--dp"),
    (["--params", "1e9", "--checkpoint", "every"], "--checkpoint"), (["--budget", "-1"], "--budget"),
    (["--budget", "1e23", "--mfu", "1.5"], "--mfu"), (["--budget", "1e23", "--device", "h800"], "--device"),
    (["--layers", "2"], "--hidden"), ([], "--model"), (["--params", "1e9", "--unit", "furlong"], "--unit"),
    (["--params", "8e9", "--recipe", "qlora"], "--recipe"), (["--params", "1e9", "--device", "a100"], "--device"),
    (["--model", "demo", "--layers", "2"], "--model"), (["--budget", "1e23", "--method", "x"], "--method"),
])
def test_cli_plan_bad_values_are_one_line_naming_the_flag(argv: list[str], flag: str) -> None:
    rc, out, err = run_cli(["plan", *argv])
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"fpsim plan: error: {flag}"), err


def test_cli_plan_usage_error_is_one_line() -> None:
    rc, out, err = run_cli(["plan", "--bogus"])
    assert rc == 2 and out == "" and err.count("\n") == 1 and "error:" in err


@pytest.mark.slow
def test_step_flops_equal_the_measured_ledger() -> None:
    """The planner's GEMM count against the FLOPs a real training step ran (fpsim.train.measure_step counts
    2 M N K per GEMM call as it happens, forward, backward and recomputation)."""
    train = pytest.importorskip("fpsim.train")
    if not hasattr(train, "measure_step"):
        pytest.skip("fpsim.train.measure_step is not in this checkout")
    from fpsim.train.demo import demo_settings

    cfg = demo_settings(quick=True).train_config()
    spec = P.get_model(cfg.model)
    for ck in ("none", "selective", "blocks", 2):
        led = train.measure_step("fp32", cfg, checkpoint=ck)
        assert P.step_flops(spec, batch=cfg.batch_size, checkpoint=ck)["hardware"] == led.flops, ck
