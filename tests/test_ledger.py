"""The measured memory ledger (fpsim.train.measure_step): bytes counted from the arrays a real training
step holds for its backward pass, held against an independent count from the layer inventory
(expected_activation_bytes), GEMM FLOPs held against the shapes counted by hand."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from fpsim.amp import get_policy
from fpsim.nn import GPTConfig, activation_elements, gpt_forward, init_params
from fpsim.nn.saved import buffer_of, saved_tensors
from fpsim.train import StepLedger, TrainConfig, Trainer, measure_checkpointing, measure_step
from fpsim.train.ledger import checkpoint_table, expected_activation_bytes, korthikanti_layer_bytes

MODEL = GPTConfig(vocab_size=6, block_size=8, n_layer=3, n_head=2, n_embd=8)
CFG = TrainConfig(task="reverse", task_kwargs={"n_symbols": 5, "length": 4}, batch_size=4, steps=4, eval_every=0,
                  model=MODEL)
MODES: tuple[Any, ...] = ("none", "blocks", 1, 2, 3, "selective")


@pytest.mark.parametrize("mode", MODES, ids=str)
@pytest.mark.parametrize("policy", ["fp32", "bf16-mixed", "fp16-no-master", "fp8-hybrid", "int8-qat"])
def test_measured_peak_equals_layer_inventory(policy: str, mode: Any) -> None:
    """peak_device_bytes of a real step = the hand count of every saved tensor over the backward schedule."""
    led = measure_step(policy, CFG, checkpoint=mode)
    e = expected_activation_bytes(replace(MODEL, checkpoint=mode), policy, led.batch, led.seq_len,
                                  quant_active=False)
    assert led.peak_device_bytes == e["peak"]
    if get_policy(policy).activations.name == "fp32" and get_policy(policy).fp8 is None:
        assert led.peak_bytes == led.peak_device_bytes  # FP32 carriers hold FP32 values: same count


def test_qat_masks_counted_when_quantizing() -> None:
    """With fake quantization on, the straight-through masks (1 byte per GEMM input element) are held too."""
    tr = Trainer("int8-qat", CFG)
    tr.runtime.quant_active = True
    led = measure_step(tr)
    e = expected_activation_bytes(MODEL, "int8-qat", led.batch, led.seq_len, quant_active=True)
    assert led.peak_device_bytes == e["peak"] and led.by_kind["mask"] > MODEL.block_size ** 2 * MODEL.n_layer


def test_checkpointing_saves_memory_and_costs_flops() -> None:
    t = measure_checkpointing("bf16-mixed", CFG, modes=("none", "blocks", 2, "selective"))
    none, blocks, k2, sel = t["none"], t["blocks"], t["2"], t["selective"]
    assert blocks.peak_bytes < k2.peak_bytes < none.peak_bytes
    assert sel.peak_bytes < none.peak_bytes and sel.by_kind.get("softmax", 0) < none.by_kind["softmax"]
    assert none.flops_by_phase["recompute"] == 0 < sel.flops_by_phase["recompute"] < k2.flops_by_phase["recompute"]
    assert blocks.peak_event.startswith("recompute h") and none.peak_event == "forward"
    assert "recompute_input" in blocks.by_kind and "recompute_input" not in none.by_kind
    assert {l.flops_by_phase["forward"] for l in t.values()} == {none.flops_by_phase["forward"]}
    assert {l.flops_by_phase["backward"] for l in t.values()} == {none.flops_by_phase["backward"]}


def test_flops_counted_by_hand() -> None:
    """GEMM FLOPs (2 M N K) from the shapes: per block qkv, q k^T, P v, proj, fc, mlp proj; the lm_head;
    backward twice the forward; full recomputation one more forward of every block."""
    led = measure_step("fp32", CFG)
    B, T = led.batch, led.seq_len
    N, C, H, V, L = B * T, MODEL.n_embd, MODEL.n_head, MODEL.vocab_size, MODEL.n_layer
    hd = C // H
    block = 2 * N * C * 3 * C + 2 * (2 * B * H * T * T * hd) + 2 * N * C * C + 2 * N * C * 4 * C + 2 * N * 4 * C * C
    fwd = L * block + 2 * N * C * V
    assert led.flops_by_phase == {"forward": fwd, "backward": 2 * fwd, "recompute": 0}
    full = measure_step("fp32", CFG, checkpoint="blocks")
    assert full.flops_by_phase["recompute"] == L * block
    sel = measure_step("fp32", CFG, checkpoint="selective")
    assert sel.flops_by_phase["recompute"] == L * 2 * (2 * B * H * T * T * hd)


def test_each_buffer_counted_once() -> None:
    """Views share their base: under fp32 the P @ V operand is the softmax output itself (one buffer);
    under bf16 it is a separate low-precision copy. Parameters (LayerNorm gains, tied wte) are not counted."""
    f32, b16 = measure_step("fp32", CFG), measure_step("bf16-mixed", CFG)
    B, T, H = f32.batch, f32.seq_len, MODEL.n_head
    P = 4 * B * H * T * T
    assert f32.by_kind["softmax"] == MODEL.n_layer * P
    assert b16.by_kind["softmax"] == 2 * MODEL.n_layer * P   # carrier: FP32 probabilities + float32-carried BF16 P
    assert b16.by_kind_device["softmax"] == MODEL.n_layer * (P + P // 2)
    assert "weight_copy" not in f32.by_kind and b16.weight_copy_bytes > 0


def test_walk_matches_a_generic_array_count() -> None:
    """The named walk finds every array a plain recursive search of the cache finds (nothing missed)."""
    p = init_params(MODEL)
    rt = get_policy("fp8-hybrid").runtime()
    idx = np.zeros((2, 8), dtype=np.int64)
    for ck in ("none", "blocks", "selective"):
        caches = gpt_forward(p, replace(MODEL, checkpoint=ck), idx, idx, prec=rt)[2][0]
        named = {id(buffer_of(t.array)) for t in saved_tensors(caches)}
        found: set[int] = set()

        def walk(o: Any, d: int = 0) -> None:
            if d > 10:
                return
            if isinstance(o, np.ndarray):
                found.add(id(buffer_of(o)))
            elif isinstance(o, (tuple, list)):
                for v in o:
                    walk(v, d + 1)
            elif isinstance(o, dict):
                for v in o.values():
                    walk(v, d + 1)
            elif hasattr(o, "__slots__"):
                for k in o.__slots__:
                    walk(getattr(o, k, None), d + 1)

        walk(caches)
        params = {id(buffer_of(v)) for v in p.values()}
        missing = found - named - params
        # the only arrays not named: each attention's 0-d scale constant
        assert all(np.ndim(_by_id(caches, i)) == 0 for i in missing), ck


def _by_id(obj: Any, i: int, d: int = 0) -> Any:
    if isinstance(obj, np.ndarray):
        return obj if id(buffer_of(obj)) == i else None
    items: Any = ()
    if isinstance(obj, (tuple, list)):
        items = obj
    elif isinstance(obj, dict):
        items = obj.values()
    elif hasattr(obj, "__slots__"):
        items = [getattr(obj, k, None) for k in obj.__slots__]
    for v in items:
        r = _by_id(v, i, d + 1) if d < 10 else None
        if r is not None:
            return r
    return None


def test_measuring_does_not_change_the_bits() -> None:
    a, b = Trainer("bf16-mixed", CFG), Trainer("bf16-mixed", CFG)
    measure_step(a, repeat=2)
    b.step()
    b.step()
    assert a.step_count == 2 and all(np.array_equal(a.store.weights[k], b.store.weights[k]) for k in a.store.weights)
    assert not hasattr(a.runtime.__dict__, "matmul") and "matmul" not in a.runtime.__dict__


def test_trainer_model_restored_after_override() -> None:
    tr = Trainer("fp32", CFG)
    led = measure_step(tr, checkpoint="blocks")
    assert led.checkpoint == "blocks" and tr.model.checkpoint == "none"


def test_to_dict_is_json() -> None:
    led = measure_step("fp8-hybrid", CFG, checkpoint=2)
    d = json.loads(json.dumps(led.to_dict()))
    assert d["peak_bytes"] == led.peak_bytes and d["tokens"] == led.batch * led.seq_len
    assert d["checkpoint"] == 2 and d["fp8_state_bytes"] > 0 and d["by_kind"]["fp8_scale"] > 0
    assert isinstance(led, StepLedger) and led.seconds > 0


def test_activation_elements_is_an_estimate() -> None:
    """The old estimate, held against the ledger (FP32, so elements = bytes / 4): it misses LayerNorm's
    x-hat and GELU's tanh and the loss's probabilities; measured is larger. Documented in docs/memory.md."""
    led = measure_step("fp32", CFG)
    est = activation_elements(MODEL, led.seq_len) * 4 * led.tokens
    assert est < led.peak_bytes


@pytest.mark.parametrize("kw, exc", [({"repeat": 0}, ValueError), ({"repeat": True}, TypeError),
                                     ({"repeat": 1.5}, TypeError), ({"checkpoint": "full"}, ValueError),
                                     ({"checkpoint": 0}, ValueError), ({"attention": "fast"}, ValueError)])
def test_bad_arguments(kw: dict[str, Any], exc: type[Exception]) -> None:
    with pytest.raises(exc):
        measure_step("fp32", CFG, **kw)


def test_bad_policy_and_config() -> None:
    with pytest.raises(ValueError, match="fp32"):
        measure_step("fp31", CFG)
    with pytest.raises(TypeError, match="TrainConfig"):
        measure_step("fp32", {"steps": 1})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="modes"):
        measure_checkpointing("fp32", CFG, modes="blocks")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="modes"):   # used to run the modes "b", "l", "o", ... (or fail on "b")
        checkpoint_table("fp32", CFG, modes="blocks", flash=False)  # type: ignore[arg-type]


@pytest.mark.slow
def test_demo_report_has_the_checkpointing_section(tmp_path: Any) -> None:
    """`fpsim demo` measures the ledger of its model per mode and reports it (one section, metrics.json)."""
    from fpsim.train.demo import DemoSettings, run_demo

    st = DemoSettings(steps=2, n_layer=2, n_embd=16, n_head=2, batch_size=4, histogram_every=1, eval_every=1,
                      task_kwargs={"n_symbols": 8, "length": 4})
    res = run_demo(str(tmp_path), policies=["fp32", "bf16-mixed"], settings=st, log=None)
    rows = {r["mode"]: r for r in res["checkpointing"]["rows"]}
    assert res["checkpointing"]["policy"] == "bf16-mixed"
    assert {"none", "blocks", "2", "selective"} <= set(rows)
    assert rows["blocks"]["memory_ratio"] < 1 < rows["blocks"]["flops_ratio"]
    m = st.train_config().model
    assert m is not None
    e = expected_activation_bytes(m, "bf16-mixed", 4)
    assert rows["none"]["peak_device_bytes"] == e["peak"]
    report = (tmp_path / "report.md").read_text()
    assert report.count("## Checkpointing ledger (measured)") == 1
    assert "Korthikanti" in report and "| blocks |" in report
    assert "| every 2nd block (block 0 of 2) |" in report  # checkpoint=2 spelled out, not a bare "2"
    saved = json.loads((tmp_path / "metrics.json").read_text())
    assert saved["checkpointing"]["rows"][0]["mode"] == "none"
    assert saved["memory_ledger"]["fp32"]["activation_bytes_per_token_measured"] > \
        saved["memory_ledger"]["fp32"]["activation_bytes_per_token"]


def test_config_with_a_trainer_refused() -> None:
    with pytest.raises(ValueError, match="config"):
        measure_step(Trainer("fp32", CFG), CFG)


def test_timeline_follows_the_backward_schedule() -> None:
    """Events: end of forward, head freed, then per block (last first) its recomputation and its release."""
    led = measure_step("fp32", CFG, checkpoint="blocks")
    names = [e[0] for e in led.timeline]
    assert names == ["forward", "freed head", "recompute h2", "freed h2", "recompute h1", "freed h1",
                     "recompute h0", "freed h0"]
    assert led.timeline[-1][1] == led.tokens * 8  # only the token ids are left
    sel = [e[0] for e in measure_step("fp32", CFG, checkpoint="selective").timeline]
    assert sel[2:4] == ["recompute h2.attn", "freed h2"]


@pytest.mark.parametrize("call, exc", [
    (lambda: expected_activation_bytes(MODEL, "fp32", 2.5), TypeError),
    (lambda: expected_activation_bytes(MODEL, "fp32", 0), ValueError),
    (lambda: expected_activation_bytes(MODEL, "fp32", 2, 9), ValueError),      # beyond block_size
    (lambda: expected_activation_bytes(MODEL, "fp32", 2, quant_active=1), TypeError),
    (lambda: expected_activation_bytes({"n_layer": 2}, "fp32", 2), TypeError),
    (lambda: korthikanti_layer_bytes(20, 32, 64, 4, "full"), ValueError),
    (lambda: korthikanti_layer_bytes(20.0, 32, 64, 4), TypeError),
    (lambda: korthikanti_layer_bytes(0, 32, 64, 4), ValueError),
    (lambda: checkpoint_table("fp32", CFG, modes=("none",), flash="no"), TypeError),
    (lambda: list(saved_tensors([1, 2])), TypeError),  # type: ignore[arg-type]
])
def test_hostile_inputs(call: Any, exc: type[Exception]) -> None:
    with pytest.raises(exc):
        call()


def test_korthikanti_formula() -> None:
    """34 s b h + 5 a s^2 b per layer (GPT-3 175B shape: s=2048, h=12288, a=96, b=1); names by the one rule."""
    assert korthikanti_layer_bytes(2048, 1, 12288, 96) == 34 * 2048 * 12288 + 5 * 96 * 2048 ** 2
    assert korthikanti_layer_bytes(2048, 1, 12288, 96, " Selective") == 34 * 2048 * 12288
    assert korthikanti_layer_bytes(2048, 1, 12288, 96, "blocks") == 2 * 2048 * 12288


# ------------------------------------------------------------------- flash attention in the ledger

FLASH = replace(MODEL, attention="flash")
FLASH_CFG = replace(CFG, model=FLASH)


def _fp8_attn_policy() -> Any:
    p = get_policy("fp8-hybrid")
    assert p.fp8 is not None
    return replace(p, name="fp8-hybrid-attn", fp8=replace(p.fp8, kinds=("linear", "attn", "lm_head")))


def test_flash_flops_equal_across_policies() -> None:
    """GEMM FLOPs are a property of the shapes: the FP8 fallback of matmul_accumulate (which calls
    matmul) must not be counted twice (it was: 199,680 forward FLOPs under FP8-with-attn vs 175,104)."""
    flops = {p if isinstance(p, str) else p.name: measure_step(p, FLASH_CFG).flops_by_phase
             for p in ("fp32", "bf16-mixed", _fp8_attn_policy())}
    assert len({tuple(sorted(f.items())) for f in flops.values()}) == 1, flops


@pytest.mark.parametrize("mode", MODES, ids=str)
@pytest.mark.parametrize("policy", ["fp32", "bf16-mixed", "fp8-hybrid", "int8-qat"])
def test_flash_measured_peak_equals_layer_inventory(policy: str, mode: Any) -> None:
    """With attention="flash" the hand count (q, k, v, O, the FP32 lse; no T x T tensor) is what a real
    step holds, in every checkpointing mode."""
    led = measure_step(policy, FLASH_CFG, checkpoint=mode)
    e = expected_activation_bytes(replace(FLASH, checkpoint=mode), policy, led.batch, led.seq_len,
                                  quant_active=False)
    assert led.attention == "flash" and led.peak_device_bytes == e["peak"]
    # the only softmax tensor is the FP32 row log-sum-exp (B, H, T) per layer; no causal mask is kept
    lse = 4 * led.batch * FLASH.n_head * led.seq_len * FLASH.n_layer
    assert led.by_kind_device.get("mask", 0) == 0
    assert led.by_kind_device["softmax"] == lse or mode not in ("none", "selective")


def test_flash_attention_memory_linear_standard_quadratic_in_t() -> None:
    """Per block, the attention tensors of a measured step: standard grows as T^2 (softmax, its copy, the
    mask), flash as T (O and the lse); measured at T = 8, 16, 32 under bf16-mixed."""
    def attn_bytes(attn: str, T: int) -> int:
        m = replace(MODEL, block_size=T, n_layer=1, attention=attn)
        cfg = replace(CFG, model=m, task_kwargs={"n_symbols": 5, "length": T // 2})
        led = measure_step("bf16-mixed", cfg)
        assert led.seq_len == T
        return sum(v for k, v in led.by_site_device.items() if k.startswith("h0.attn.")
                   and not k.endswith((".qkv.a", ".proj.a")))
    ts = (8, 16, 32)
    std = [attn_bytes("standard", T) for T in ts]
    fl = [attn_bytes("flash", T) for T in ts]
    d_std = [b - a for a, b in zip(std, std[1:])]
    d_fl = [b - a for a, b in zip(fl, fl[1:])]
    assert d_fl[1] == 2 * d_fl[0]                     # linear: equal increments per token
    assert d_std[1] > 3.5 * d_std[0]                  # quadratic term dominating
    assert fl[-1] * 3 < std[-1]
