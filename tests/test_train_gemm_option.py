"""The bit-exact GEMM option of the training runtime and of the demo (issue 17: ``fpsim demo --gemm h100``).

Oracles: MMA-Sim (``mmasim.nv_ptx``, Hopper ``mma.sync`` m16n8k16 f16 -> f32, chained along K) for the
runtime's device GEMMs, forward and backward; ``fpsim.mma.matmul`` of the same rounded operands (itself checked
against MMA-Sim and the published hardware rows in tests/test_mma_mmasim_nvidia.py) for the routing of every
GEMM of the model; the CLI's one name rule for ``--gemm``.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from _cli import run_cli

import fpsim
from fpsim import mma
from fpsim.amp import FP8Recipe, Policy, QuantConfig, get_policy
from fpsim.train.bitexact import bit_exact_policy, gemm_device


def _bits(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).view(np.uint32)


def _vals(rng: np.random.Generator, shape: tuple[int, ...], spread: int = 6) -> np.ndarray:
    """float32 carriers with a spread of exponents (alignment inside the blocks matters), some zeros."""
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-spread, spread + 1, shape))
    x[rng.random(shape) < 0.05] = 0.0
    return x.astype(np.float32)


def _tiny():  # type: ignore[no-untyped-def]
    from fpsim.train.demo import DemoSettings

    return DemoSettings(steps=2, n_layer=1, n_embd=16, n_head=2, batch_size=4, histogram_every=1, eval_every=1,
                        task_kwargs={"n_symbols": 8, "length": 4})


# ------------------------------------------------------------------------------------------------ routing


@pytest.mark.parametrize("fmt", ["fp16", "bf16"])
def test_linear_forward_and_backward_are_mma_matmul_of_the_rounded_operands(fmt: str) -> None:
    rng = np.random.default_rng(1)
    pol = Policy("t", params=fmt, activations=fmt, gradients=fmt, gemm="h100")
    rt = pol.runtime()
    model = mma.get_model("h100", fmt, "fp32")
    x, w, dy = _vals(rng, (24, 40)), _vals(rng, (40, 12)), _vals(rng, (24, 12), spread=10)
    x0, w0, dy0 = x.copy(), w.copy(), dy.copy()
    out, cache = rt.matmul(x, w, "s", "linear")
    xr, wr = fpsim.round(x, fmt), fpsim.round(w, fmt)
    ref = fpsim.round(mma.matmul(xr, wr, model=model), fmt)
    assert np.array_equal(_bits(out), _bits(ref))
    dx, dw, db = rt.matmul_backward(dy, cache)
    dyr = fpsim.round(dy, fmt)
    assert db is None
    assert np.array_equal(_bits(dx), _bits(fpsim.round(mma.matmul(dyr, wr.T, model=model), fmt)))   # dX = dY Wᵀ
    assert np.array_equal(_bits(dw), _bits(fpsim.round(mma.matmul(xr.T, dyr, model=model), fmt)))   # dW = Xᵀ dY
    assert rt.mma_calls == 3
    assert np.array_equal(x, x0) and np.array_equal(w, w0) and np.array_equal(dy, dy0)  # inputs untouched


def test_attention_batched_gemms_go_through_the_model() -> None:
    rng = np.random.default_rng(2)
    rt = get_policy("bf16-mixed").replace(name="t", gemm="h100").runtime()
    model = mma.get_model("h100", "bf16", "fp32")
    q, kt, dy = _vals(rng, (2, 3, 5, 8)), _vals(rng, (2, 3, 8, 5)), _vals(rng, (2, 3, 5, 5))
    s, cache = rt.matmul(q, kt, "a.qk", "attn")
    qr, kr, dyr = (fpsim.round(v, "bf16") for v in (q, kt, dy))
    assert np.array_equal(_bits(s), _bits(fpsim.round(mma.matmul(qr, kr, model=model), "bf16")))
    dq, dk, _ = rt.matmul_backward(dy, cache)
    assert np.array_equal(_bits(dq), _bits(fpsim.round(mma.matmul(dyr, np.swapaxes(kr, -1, -2), model=model), "bf16")))
    assert np.array_equal(_bits(dk), _bits(fpsim.round(mma.matmul(np.swapaxes(qr, -1, -2), dyr, model=model), "bf16")))


def test_every_gemm_of_a_training_step_goes_through_the_device_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPT step has 6 GEMMs per layer + the lm_head forward, and two backward GEMMs for each: all 3 (6L + 1) of
    them run under the device model (none is left to float32 BLAS)."""
    from fpsim.train import Trainer

    cfg = _tiny().train_config()
    tr = Trainer(bit_exact_policy("fp16-mixed", "h100"), cfg)
    seen: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    from fpsim.mma import gemm as _gemm

    real = _gemm._matmul_values  # the runtime's entry into the device model (same bits as mma.matmul)

    def spy(a, b, c, m):  # type: ignore[no-untyped-def]
        assert m == mma.get_model("h100", "fp16", "fp32")
        seen.append((np.shape(a), np.shape(b)))
        return real(a, b, c, m)

    monkeypatch.setattr(_gemm, "_matmul_values", spy)
    tr.step()
    assert cfg.model is not None
    assert len(seen) == tr.runtime.mma_calls == 3 * (6 * cfg.model.n_layer + 1)


def test_flash_attention_tiles_take_c_inside_the_chain() -> None:
    rng = np.random.default_rng(3)
    rt = get_policy("fp16-mixed").replace(name="t", gemm="h100").runtime()
    a, b, c = _vals(rng, (4, 16)), _vals(rng, (16, 6)), _vals(rng, (4, 6))
    got = rt.matmul_accumulate(a, b, "f", "attn", c)
    ref = mma.matmul(fpsim.round(a, "fp16"), fpsim.round(b, "fp16"), c, model=mma.get_model("h100", "fp16"))
    assert np.array_equal(_bits(got), _bits(ref))


def test_fast_gemm_unchanged() -> None:
    rng = np.random.default_rng(4)
    rt = get_policy("fp16-mixed").runtime()
    x, w, dy = _vals(rng, (8, 16)), _vals(rng, (16, 4)), _vals(rng, (8, 4))
    out, cache = rt.matmul(x, w, "s", "linear")
    dx, dw, _ = rt.matmul_backward(dy, cache)
    xr, wr, dyr = (np.asarray(fpsim.round(v, "fp16"), np.float32) for v in (x, w, dy))
    assert np.array_equal(_bits(out), _bits(fpsim.round(xr @ wr, "fp16")))
    assert np.array_equal(_bits(dx), _bits(fpsim.round(dyr @ wr.T, "fp16")))
    assert np.array_equal(_bits(dw), _bits(fpsim.round(xr.T @ dyr, "fp16")))
    assert rt.mma_calls == 0


# ------------------------------------------------------------------------------------------------ MMA-Sim oracle


def _mmasim_gemm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A (M, K) @ B (K, N) as Hopper's mma.sync m16n8k16 f16 -> f32 chain per output (MMA-Sim), K zero-padded
    to a multiple of 16 as a GEMM library pads it."""
    torch = pytest.importorskip("torch")
    sim = pytest.importorskip("mmasim.nv_ptx.sim")
    op = sim.MMA("Hopper", "m16n8k16.f32.f16.f16.f32")
    m, k = a.shape
    n = b.shape[1]
    kp = -(-k // 16) * 16
    ap = np.zeros((m, kp)); ap[:, :k] = a
    bp = np.zeros((kp, n)); bp[:k] = b
    rows_a = np.repeat(ap, n, axis=0)                      # (M*N, Kp): row i of A for output (i, j)
    rows_b = np.tile(bp.T, (m, 1))                         # (M*N, Kp): column j of B
    d = op.dpa(torch.from_numpy(rows_a).to(torch.float16), torch.from_numpy(rows_b).to(torch.float16),
               torch.zeros(m * n, dtype=torch.float32))    # type: ignore[attr-defined]
    return d.double().numpy().reshape(m, n).astype(np.float32)


def test_runtime_device_gemms_agree_with_mmasim() -> None:
    """The raw GEMM results (before the output cast) of a linear layer's forward, dX and dW under gemm="h100"
    equal MMA-Sim's Hopper chain bit for bit (K = 40, 24, 12: padded and unpadded chains)."""
    rng = np.random.default_rng(5)
    rt = Policy("t", params="fp16", activations="fp16", gradients="fp16", gemm="h100").runtime()
    x = np.asarray(fpsim.round(_vals(rng, (12, 40)), "fp16"), np.float32)
    w = np.asarray(fpsim.round(_vals(rng, (40, 24)), "fp16"), np.float32)
    dy = np.asarray(fpsim.round(_vals(rng, (12, 24), spread=10), "fp16"), np.float32)
    bad = 0
    for a, b in ((x, w), (dy, w.T), (x.T, dy)):
        got = rt._gemm(a, b)                      # what matmul / matmul_backward cast into fp16
        ref = _mmasim_gemm(a.astype(np.float64), b.astype(np.float64))
        bad += int(np.count_nonzero(_bits(got) != _bits(ref)))
    assert bad == 0, f"{bad} of {12 * 24 + 12 * 40 + 40 * 24} outputs differ from MMA-Sim"


# ------------------------------------------------------------------------------------------------ policies


def test_device_gemm_refused_where_it_cannot_be_one_format() -> None:
    with pytest.raises(ValueError, match="FP8Recipe"):
        get_policy("fp8-hybrid").replace(name="t", gemm="h100")
    with pytest.raises(ValueError, match="params=bf16, activations=fp16, gradients=fp16"):
        Policy("t", params="bf16", activations="fp16", gradients="fp16", gemm="h100")
    with pytest.raises(ValueError, match="QuantConfig"):
        Policy("t", params="bf16", activations="bf16", gradients="bf16", quant=QuantConfig(), gemm="h100")
    with pytest.raises(ValueError, match=r"activations fp32.*input format 'fp32'"):
        Policy("t", gemm="h100")
    assert Policy("t", params="bf16", activations="bf16", gradients="bf16", fp8=FP8Recipe()).gemm == "fast"


def test_gemm_device_names() -> None:
    assert gemm_device("H100") == gemm_device(" hopper ") == gemm_device("H100-SXM5") == "h100"
    with pytest.raises(ValueError, match=r"unknown device 'H1000'; valid: .*a100.*h100"):
        gemm_device("H1000")
    with pytest.raises(TypeError):
        gemm_device(100)
    assert bit_exact_policy("bf16-mixed", "A100").name == "bf16-mixed@a100"


# ------------------------------------------------------------------------------------------------ CLI and demo


@pytest.mark.parametrize("argv", [["--gemm", "h1000"], ["--gemm", ""], ["--gemm", "h100", "--seeds", "2"]])
def test_cli_bad_gemm_is_one_line_naming_the_flag(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from fpsim.train import demo

    monkeypatch.setattr(demo, "run_demo", lambda *a, **k: pytest.fail("trained despite a bad flag"))
    rc, out, err = run_cli(["demo", *argv])
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("fpsim demo: error: --gemm"), err
    if argv[1] == "h1000":
        assert "valid: v100" in err and "h100" in err


def test_cli_gemm_reaches_the_demo_and_defaults_to_none(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    from fpsim.train import demo

    got: list[object] = []
    monkeypatch.setattr(demo, "run_demo", lambda *a, **k: got.append(k.get("gemm")) or {})
    assert run_cli(["demo", "--quick", "--out", str(tmp_path)])[0] == 0
    assert run_cli(["demo", "--quick", "--gemm", " H100-SXM5", "--out", str(tmp_path)])[0] == 0
    assert got == [None, "h100"]


def test_tiny_demo_with_gemm_h100_reports_cost_and_loss_gap(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    from fpsim.train import demo

    monkeypatch.setattr(demo, "demo_settings", lambda quick=False, steps=None, seed=0: _tiny())
    d = str(tmp_path)
    rc, out, err = run_cli(["demo", "--policies", "fp32", "fp16-mixed", "fp8-hybrid", "--gemm", "h100", "--out", d])
    assert rc == 0, err
    assert "fp16-mixed@h100" in out and "x the fast step" in out
    with open(os.path.join(d, "metrics.json")) as f:
        res = json.load(f)
    be = res["bit_exact_gemm"]
    assert be["device"] == "h100" and [r["policy"] for r in be["rows"]] == ["fp16-mixed"]
    r = be["rows"][0]
    assert r["time_ratio"] == pytest.approx(r["step_ms"] / r["fast_step_ms"])
    assert r["run_time_ratio"] == pytest.approx(r["ms_per_step"] / r["fast_ms_per_step"])
    assert r["fast_final_loss"] == res["policies"]["fp16-mixed"]["final_loss"]
    assert r["loss_gap"] == pytest.approx(r["final_loss"] - r["fast_final_loss"])
    assert r["gemm_calls"] > 0 and set(be["skipped"]) == {"fp32", "fp8-hybrid"}
    with open(os.path.join(d, "report.md")) as f:
        rep = f.read()
    assert "## Bit-exact h100 GEMMs" in rep
    assert (f"| fp16-mixed | {r['fast_step_ms']:.1f} | {r['step_ms']:.1f} | {r['time_ratio']:.1f}x | "
            f"{r['run_time_ratio']:.1f}x |") in rep
    assert "**Cost**: a bit-exact step took" in rep and "Not run bit-exact: fp32 (fp32 GEMM operands" in rep
    assert "fp8-hybrid (an FP8 recipe" in rep
    assert "fp16-mixed@h100" not in res["policies"]  # the lesson table keeps the fast runs only


def test_demo_gemm_with_no_admitting_policy_fails_before_training(tmp_path: object) -> None:
    from fpsim.train.demo import run_demo

    with pytest.raises(ValueError, match="none of the policies fp8-hybrid admits a device GEMM"):
        run_demo(str(tmp_path), policies=["fp8-hybrid"], settings=_tiny(), gemm="h100", log=None)
