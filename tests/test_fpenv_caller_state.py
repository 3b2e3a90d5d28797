"""The same bits whatever floating-point state the caller left around fpsim (issue: fpenv findings A-D).

A. A library in the process may leave a directed rounding mode set (``fesetround(FE_UPWARD)``; here through
   libm and ctypes). Before the fix 15-17 of the calls below per mode gave other bits
   (``fpsim.div(1.0, 3.0, "fp64")`` was 0.33333333333333337, ``fpsim.matmul([[1, 2**-30]], [[1], [1]])``
   1.0000001192092896): every public entry point now runs in round-to-nearest and gives the mode back.
B. Every public function and method is guarded (structural test over ``tests/api_snapshot.txt``).
C. A strict caller (``np.seterr(all="raise")``, ``warnings.simplefilter("error")``) got FloatingPointError or
   a stray numpy RuntimeWarning from 16 of 34 entry points on special values (inf, nan, huge, 0): fpsim now
   computes under its own NumPy error state, whatever the caller's.
D. ``python -W error -c "import fpsim"`` and the import order with torch give no warning and the same bits.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import enum
import importlib
import inspect
import os
import platform
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fpsim
import fpsim.amp as amp
import fpsim.mma
import fpsim.quant as Q
import fpsim.quant_nf4 as NF
import fpsim.scaling as S
from fpsim import _fpenv
from fpsim.mma import blockscaled as BS
from fpsim.nn import attention as ATT
from fpsim.nn import flash as FL
from fpsim.nn.gpt import GPTConfig
from fpsim.train.loop import TrainConfig, Trainer
from test_hardening_fpenv import CASES as FTZ_CASES
from test_hardening_fpenv import _call, _canon

ROOT = Path(__file__).resolve().parents[1]
HELPER = _fpenv._helper()

# -- the caller's rounding mode ----------------------------------------------------------------------------

_LIBM: Any = None
if sys.platform.startswith("linux"):
    _LIBM = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
# glibc's FE_* values (x86-64 and aarch64 differ); the C helper knows them where it is built
if HELPER is not None and getattr(HELPER, "ROUNDING", 0):
    MODES = {"upward": HELPER.UPWARD, "downward": HELPER.DOWNWARD, "towardzero": HELPER.TOWARDZERO}
    NEAREST = HELPER.TONEAREST
else:  # pragma: no cover - x86-64 glibc values
    MODES = {"upward": 0x800, "downward": 0x400, "towardzero": 0xC00}
    NEAREST = 0
needs_libm = pytest.mark.skipif(_LIBM is None, reason="sets the rounding mode through glibc's libm")


@contextlib.contextmanager
def rounding_mode(mode: int) -> Iterator[None]:
    """Set the thread's rounding mode the way another library would (libm's fesetround), and restore it."""
    assert _LIBM.fesetround(mode) == 0
    try:
        yield
    finally:
        _LIBM.fesetround(NEAREST)


# -- the calls (inputs are built at import, in the normal environment) ------------------------------------

_rng = np.random.default_rng(12)  # consumed at import only, in a fixed order: the inputs are constants
A16 = np.asarray(fpsim.round(_rng.standard_normal((8, 16)), "fp16"))
B16 = np.asarray(fpsim.round(_rng.standard_normal((16, 8)), "fp16"))
C32 = _rng.standard_normal((8, 8)).astype(np.float32)
V64 = _rng.standard_normal(257) * np.exp2(_rng.integers(-20, 20, 257))
V32 = V64.astype(np.float32)
W32 = (_rng.standard_normal(257) * 3).astype(np.float32)
ROWS = (_rng.standard_normal((4, 64)) * 7).astype(np.float32)
QKV = [(_rng.standard_normal((1, 2, 8, 16)) * 0.7).astype(np.float32) for _ in range(3)]
X_ATT = (_rng.standard_normal((1, 8, 16)) * 0.5).astype(np.float32)
W_QKV = (_rng.standard_normal((16, 48)) * 0.2).astype(np.float32)
W_PROJ = (_rng.standard_normal((16, 16)) * 0.2).astype(np.float32)
GRADS = [(_rng.standard_normal(33) * 5).astype(np.float32), (_rng.standard_normal((4, 5))).astype(np.float32)]
LIN = np.linspace(0.1, 1, 1000)
THIRD = (1.0, 3.0)
ROW_TINY = np.array([[1.0, 2.0**-30]])
COL_ONES = np.array([[1.0], [1.0]])
SCALE_A = np.ones((8, 1), np.float32)
MX_A = np.asarray(fpsim.round(_rng.standard_normal((8, 64)), "fp8_e4m3"))
MX_B = np.asarray(fpsim.round(_rng.standard_normal((64, 8)), "fp8_e4m3"))
OVERFLOWING = np.where(np.arange(257) % 7 == 0, np.float32(np.inf), W32).astype(np.float32)
MXF8 = BS.block_scaled_model("b200", "mxf8f6f4", "fp8_e4m3", "fp8_e4m3")
V32_STEPS = [V32 * np.float32(k) for k in (1.0, 3.0, 0.1)]  # built here: in a case it would round in the mode
F32_MIN_SUB = np.float32(np.ldexp(np.float32(1), -149))
F32_AMAX = np.float32(3.3)  # np.float32(3.3) inside a case would round in the caller's mode
F32_SEVENTH = np.float32(1) / np.float32(7)
del _rng


def _rt(fmt: str, mode: str) -> Callable[[], Any]:
    return lambda: fpsim.round(V64, fmt, mode, rng=np.random.default_rng(5) if mode == "sr" else None)


def _arith(op: str, fmt: str) -> Callable[[], Any]:
    f = getattr(fpsim, op)
    return (lambda: f(V64, fmt)) if op == "sqrt" else (lambda: f(V64, W32, fmt))  # sqrt: nan for < 0 alike


def _trainer(policy: str) -> Callable[[], Any]:
    def run() -> Any:
        cfg = TrainConfig(task="reverse", task_kwargs={"n_symbols": 5, "length": 3}, steps=2, batch_size=4,
                          eval_every=0, telemetry_every=0, warmup=1,
                          model=GPTConfig(vocab_size=6, block_size=6, n_layer=1, n_head=2, n_embd=8))
        tr = Trainer(policy, cfg)
        out = [tr.step()["loss"] for _ in range(2)]
        return out, sorted((k, np.asarray(v).tobytes()) for k, v in tr.store.weights.items())
    return run


def _delayed_steps() -> Any:
    s = S.DelayedScaling("fp8_e4m3", amax_history_len=4)
    out = [s.fake_quantize(x) for x in V32_STEPS]
    return out, s.update(), s.scale


def _scaler() -> Any:
    sc = amp.DynamicLossScaler(init_scale=2.0**10, growth_interval=1)
    out = []
    for g in (W32, OVERFLOWING, W32):
        grads, found_inf = sc.unscale({"w": g})
        sc.update(found_inf)
        out.append((grads["w"], found_inf, sc.scale))
    return out


def _adamw() -> Any:
    p = {"w": W32.copy()}
    opt = amp.AdamW(lr=1e-3, weight_decay=0.01)
    opt.step(p, {"w": V32.copy()})
    opt.step(p, {"w": W32 * 0.5})
    return p["w"]


CASES: dict[str, Callable[[], Any]] = {
    # the examples of the finding
    "div_third": lambda: fpsim.div(*THIRD, "fp64"),
    "matmul_tiny": lambda: fpsim.matmul(ROW_TINY, COL_ONES),
    "sum_linspace": lambda: fpsim.sum(LIN, "fp64"),
    "sum_linspace32": lambda: fpsim.sum(LIN, "fp32"),
    "sum_pairwise": lambda: fpsim.sum(LIN, "fp64", order="pairwise"),
    "dot64": lambda: fpsim.dot(V64, W32, "fp64"),
    "accumulate_matmul": lambda: fpsim.accumulate.matmul(A16, B16, "fp32"),
    # GEMMs on several models
    **{f"matmul_{m}": (lambda m=m: fpsim.matmul(A16, B16, C32, model=m))  # type: ignore[misc]
       for m in ["a100:fp16", "h100:fp16", "h100:bf16", "v100:fp16", "a100:tf32", "mi300:fp16", "b200:fp16"]},
    "matmul_exact": lambda: fpsim.matmul(A16, B16, C32, model=fpsim.mma.exact),
    "matmul_fma_chain": lambda: fpsim.matmul(A16, B16, C32, model=fpsim.mma.fma_chain),
    "matmul_block_scaled": lambda: BS.matmul_block_scaled(MX_A, MX_B, scale_a=np.ones((8, 2), np.float32),
                                                          scale_b=np.ones((2, 8), np.float32), model=MXF8),
    # scaling, MX, NVFP4, fake quantization, NF4
    "scale_and_quantize": lambda: S.scale_and_quantize(V32, "fp8_e4m3"),
    "compute_scale": lambda: S.compute_scale(F32_AMAX, "fp8_e4m3"),
    "mx_quantize": lambda: S.mx_quantize(ROWS, "fp8_e4m3"),
    "mx_fp4": lambda: S.mx_quantize(ROWS, "fp4_e2m1"),
    "nvfp4": lambda: S.nvfp4_quantize(ROWS),
    "delayed_steps": _delayed_steps,
    "current_scaling": lambda: S.CurrentScaling("fp8_e5m2").fake_quantize(V32),
    "fake_quantize": lambda: Q.fake_quantize(V32, 0.037, 3, -128, 127),
    "fake_quantize_grad": lambda: Q.fake_quantize_grad(W32, V32, 0.037, 3, -128, 127),
    "learnable": lambda: Q.learnable_fake_quantize_grad(W32, V32, 0.037, 0.3, -128, 127),
    "fp8_fake": lambda: Q.fp8_fake_quantize(V32, "fp8_e4m3", F32_SEVENTH),
    "observer": lambda: (lambda ob: (ob(ROWS), ob.calculate_qparams()))(Q.MovingAverageMinMaxObserver()),
    "nf4_quantize": lambda: NF.nf4_quantize(ROWS, 64, double_quant=True),
    "nf4_roundtrip": lambda: (lambda c, a: NF.nf4_dequantize(c, a, 64))(*NF.nf4_quantize(ROWS, 64)),
    "nf4_tensor": lambda: NF.NF4Tensor.quantize(ROWS, 64).dequantize(),
    "dynamic_map": lambda: NF.dynamic_map(),
    "torch_float32_sum": lambda: NF.torch_float32_sum(V32),
    # attention
    "attention_fwd": lambda: ATT.attention_forward(X_ATT, W_QKV, None, W_PROJ, None, 2)[0],
    "attention_bwd": lambda: (lambda o, c: ATT.attention_backward(np.ones_like(o), c))(
        *ATT.attention_forward(X_ATT, W_QKV, None, W_PROJ, None, 2)),
    "flash": lambda: FL.flash_attention(*QKV, block_q=4, block_k=4),
    "reference_attention": lambda: FL.reference_attention(*QKV),
    "fp8_attention": lambda: FL.fp8_attention(*QKV, block_q=4, block_k=4),
    "hadamard": lambda: FL.hadamard(16),
    # amp pieces
    "clip": lambda: (lambda g: (amp.clip_grad_norm_(g, 1.0), g))([x.copy() for x in GRADS]),
    "total_norm_inf": lambda: amp.clip.total_norm(GRADS, "inf"),
    "scaler": _scaler,
    "adamw": _adamw,
    "log2_histogram": lambda: amp.log2_histogram(V32),
    # training: a few steps of every policy
    **{f"train_{p}": _trainer(p) for p in amp.policy_names()},
    # arithmetic in every rounding mode of fpsim and several formats
    **{f"{op}_{fmt}": _arith(op, fmt) for op in ["add", "sub", "mul", "div", "sqrt"]
       for fmt in ["fp64", "fp32", "bf16", "fp8_e4m3"]},
    **{f"round_{fmt}_{m}": _rt(fmt, m) for fmt in ["fp32", "fp16", "fp8_e5m2"] for m in ["rne", "rup", "rtz", "sr"]},
    "fma64": lambda: fpsim.fma(V64, W32, V64, "fp64"),
    "fma_bf16": lambda: fpsim.fma(V32, W32, V32, "bf16"),
    "fparray": lambda: (lambda a, b: (a / b, a * b + a, (a @ b)))(fpsim.array(V32, "bf16"), fpsim.array(W32, "bf16")),
    # the FTZ sweep of test_hardening_fpenv (subnormal inputs)
    **{f"ftz_{k}": v for k, v in FTZ_CASES.items()},
}


@pytest.fixture(scope="module")
def nearest_results() -> dict[str, Any]:
    assert _LIBM is None or _LIBM.fegetround() == NEAREST
    return {name: _canon(_call(fn)) for name, fn in CASES.items()}


def _raised(r: Any) -> bool:
    return isinstance(r, tuple) and len(r) == 3 and isinstance(r[0], str) and r[0] == "raised"


# assertions that fail alike in every mode, and a case of the FTZ sweep that rejects its float input alike
RAISE_BY_DESIGN = {"ftz_assert_same_bits_differs", "ftz_assert_rounded", "ftz_assert_ulp_close",
                   "ftz_assert_matmul_matches", "ftz_mma_naive"}


def test_the_sweep_is_broad_and_computes(nearest_results: dict[str, Any]) -> None:
    """~190 calls, and they compute (a call that raised in both modes would prove nothing)."""
    assert len(CASES) >= 170
    raised = {k: r for k, r in nearest_results.items() if _raised(r)}
    assert set(raised) <= RAISE_BY_DESIGN, raised


def test_the_examples_of_the_finding() -> None:
    assert fpsim.div(1.0, 3.0, "fp64") == 1.0 / 3.0
    assert float(np.asarray(fpsim.matmul(ROW_TINY, COL_ONES))[0, 0]) == 1.0
    if _LIBM is None:
        pytest.skip("needs libm")
    with rounding_mode(MODES["upward"]):
        got = (fpsim.div(1.0, 3.0, "fp64"), float(np.asarray(fpsim.matmul(ROW_TINY, COL_ONES))[0, 0]),
               float(fpsim.sum(LIN, "fp64")))
    assert got[:2] == (0.3333333333333333, 1.0)
    assert got[2] == float(fpsim.sum(LIN, "fp64"))


@needs_libm
@pytest.mark.parametrize("mode", sorted(MODES))
def test_same_bits_in_a_directed_rounding_mode(mode: str, nearest_results: dict[str, Any]) -> None:
    differ = []
    for name, fn in CASES.items():
        with rounding_mode(MODES[mode]):
            got = _call(fn)
            after = _LIBM.fegetround()
        assert after == MODES[mode], f"{name} did not give the caller's rounding mode back"
        if _canon(got) != nearest_results[name]:
            differ.append(name)
    assert not differ, f"{len(differ)} of {len(CASES)} calls differ under {mode}: {differ}"


@needs_libm
@pytest.mark.skipif(HELPER is None, reason="no fpsim._cfpenv")
def test_mode_restored_on_exceptions_and_nested_with_ftz() -> None:
    with rounding_mode(MODES["downward"]):
        with pytest.raises(ValueError, match="bogus"):
            fpsim.add(V64, W32, "bogus")
        assert _LIBM.fegetround() == MODES["downward"]
        prev = _fpenv.set_flush_flags(_fpenv.FTZ | _fpenv.DAZ)
        try:
            assert fpsim.div(1.0, 3.0, "fp64") == 0.3333333333333333
            assert fpsim.to_bits(F32_MIN_SUB, "fp32") == 1
            assert _fpenv.flush_flags() == _fpenv.FTZ | _fpenv.DAZ
        finally:
            _fpenv.set_flush_flags(prev)
        assert _LIBM.fegetround() == MODES["downward"]
        with _fpenv.IEEEMode("block"):
            assert _LIBM.fegetround() == NEAREST and _fpenv.is_ieee()
        assert _LIBM.fegetround() == MODES["downward"]


@needs_libm
@pytest.mark.parametrize("mode", sorted(MODES))
def test_probe_sees_each_directed_mode(mode: str) -> None:
    assert _fpenv.is_ieee()
    with rounding_mode(MODES[mode]):
        assert not _fpenv.is_ieee()
        if HELPER is not None:
            assert _fpenv.rounding_mode() == MODES[mode]
    assert _fpenv.is_ieee()


@needs_libm
def test_refuses_a_directed_mode_without_the_c_helper(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_fpenv, "_cfpenv", None)
    assert fpsim.div(1.0, 3.0, "fp64") == 1.0 / 3.0  # the normal mode needs no helper
    with rounding_mode(MODES["upward"]):
        with pytest.raises(FloatingPointError, match=r"^fpsim\.arith\.div: .*rounding mode.*fesetround") as info:
            fpsim.div(1.0, 3.0, "fp64")
        assert "not built" in str(info.value) and "C compiler" in str(info.value)
        assert _LIBM.fegetround() == MODES["upward"]


@needs_libm
@pytest.mark.skipif(HELPER is None, reason="no fpsim._cfpenv")
def test_refuses_a_rounding_mode_it_cannot_restore(monkeypatch: pytest.MonkeyPatch) -> None:
    """A helper whose mode setting changes nothing: refuse rather than differ, and leave the caller's mode."""
    fake = type("Fake", (), {"SUPPORTED": 1, "ROUNDING": 1, "TONEAREST": NEAREST, "get": staticmethod(lambda: 0),
                             "set": staticmethod(lambda f: 0), "getround": staticmethod(HELPER.getround),
                             "setround": staticmethod(lambda m: HELPER.getround()),
                             "nearest": staticmethod(HELPER.getround),
                             "restoreround": staticmethod(lambda m: None)})
    monkeypatch.setattr(_fpenv, "_cfpenv", fake)
    with rounding_mode(MODES["towardzero"]):
        with pytest.raises(FloatingPointError, match="did not restore round-to-nearest"):
            fpsim.sum(LIN, "fp64")
        assert _LIBM.fegetround() == MODES["towardzero"]


@needs_libm
@pytest.mark.skipif(HELPER is None, reason="no fpsim._cfpenv")
def test_threads_started_inside_a_call_round_to_nearest() -> None:
    import threading

    seen: list[int] = []

    @_fpenv.ieee_mode
    def start_thread() -> None:
        t = threading.Thread(target=lambda: seen.append(int(_LIBM.fegetround())))
        t.start()
        t.join()

    with rounding_mode(MODES["upward"]):
        start_thread()
    assert seen == [NEAREST]


@pytest.mark.skipif(HELPER is None or not getattr(HELPER, "ROUNDING", 0), reason="no rounding control")
@pytest.mark.parametrize("bad, exc", [(-5, ValueError), (0x123, ValueError), (2**70, ValueError), (1.0, TypeError),
                                      (None, TypeError)])
def test_helper_rejects_bad_rounding_modes(bad: Any, exc: type[Exception]) -> None:
    before = HELPER.getround()
    with pytest.raises(exc):
        HELPER.setround(bad)
    assert HELPER.getround() == before


# -- strict callers: np.seterr and warnings filters --------------------------------------------------------

SPECIAL32 = np.array([np.inf, -np.inf, np.nan, 3.4e38, -3.4e38, 0.0, -0.0, 1e-45, 1.0, 65504.0, 1e30, -2.0] * 6,
                     np.float32)[:64]
SPECIAL_ROWS = np.tile(SPECIAL32, (2, 1))
HUGE_ROWS = np.where(np.isnan(SPECIAL_ROWS), np.float32(3e38), SPECIAL_ROWS)  # an observer rejects NaN
SPECIAL64 = np.array([np.inf, -np.inf, np.nan, 1.7e308, -1.7e308, 0.0, -0.0, 5e-324, 1.0, 1e300, 1e-300, -3.0])
ZEROS32 = np.zeros(64, np.float32)
ZERO_ROWS = np.zeros((2, 64), np.float32)
HUGE16 = np.full((8, 16), 60000.0)
INF_QKV = [q.copy() for q in QKV]
INF_QKV[0][0, 0, 0, 0] = np.inf
X_HUGE = X_ATT * np.float32(1e30)
HUGE_GRADS = [np.array([3e38, 3e38, np.inf], np.float32), np.array([np.nan, 1.0], np.float32)]


def _strict_scaling() -> Any:
    s = S.DelayedScaling("fp8_e4m3", amax_history_len=2)
    return s.fake_quantize(SPECIAL32), s.update(), s.fake_quantize(ZEROS32), s.update(), s.scale


SPECIAL_CASES: dict[str, Callable[[], Any]] = {
    "div": lambda: fpsim.div(SPECIAL64, SPECIAL64[::-1].copy(), "fp64"),
    "div_zero": lambda: fpsim.div(SPECIAL64, 0.0, "fp32"),
    "mul_over": lambda: fpsim.mul(SPECIAL64, 1e300, "fp16"),
    "sqrt": lambda: fpsim.sqrt(SPECIAL64, "bf16"),
    "fma": lambda: fpsim.fma(SPECIAL64, SPECIAL64, -SPECIAL64, "fp32"),
    "round": lambda: fpsim.round(SPECIAL64, "fp8_e4m3", "rup"),
    "analyze": lambda: fpsim.analyze(SPECIAL64, "fp16"),
    "sum": lambda: fpsim.sum(SPECIAL64, "fp32"),
    "sum_pairwise": lambda: fpsim.sum(SPECIAL32, "fp16", order="pairwise"),
    "dot": lambda: fpsim.dot(SPECIAL64, SPECIAL64, "fp64"),
    "fparray": lambda: (lambda a: (a / a, a * a, a - a))(fpsim.array(SPECIAL32, "fp16")),
    "matmul": lambda: fpsim.matmul(HUGE16, HUGE16.T.copy(), model="a100:fp16"),
    "matmul_exact": lambda: fpsim.matmul(SPECIAL_ROWS[:, :16], SPECIAL_ROWS[:, :16].T.copy(), model=fpsim.mma.exact),
    "matmul_block_scaled": lambda: BS.matmul_block_scaled(SPECIAL_ROWS, SPECIAL_ROWS.T.copy(),
                                                          scale_a=np.ones((2, 2), np.float32),
                                                          scale_b=np.ones((2, 2), np.float32), model=MXF8),
    "amax": lambda: S.amax(SPECIAL32),
    "compute_scale_zero": lambda: S.compute_scale(np.float32(0.0), "fp8_e4m3"),
    "compute_scale_inf": lambda: S.compute_scale(np.float32(np.inf), "fp8_e4m3"),
    "scale_and_quantize": lambda: S.scale_and_quantize(SPECIAL32, "fp8_e4m3"),
    "scale_and_quantize_zero": lambda: S.scale_and_quantize(ZEROS32, "fp8_e5m2"),
    "mx": lambda: S.mx_quantize(SPECIAL_ROWS, "fp8_e4m3"),
    "mx_zero": lambda: S.mx_quantize(ZERO_ROWS, "fp4_e2m1"),
    "nvfp4": lambda: S.nvfp4_quantize(SPECIAL_ROWS),
    "nvfp4_zero": lambda: S.nvfp4_quantize(ZERO_ROWS),
    "delayed": _strict_scaling,
    "fake_quantize": lambda: Q.fake_quantize(SPECIAL32, 1e-30, 0, -128, 127),
    "fp8_fake_quantize": lambda: Q.fp8_fake_quantize(SPECIAL32, "fp8_e4m3", np.float32(1e-30)),
    "observer": lambda: (lambda ob: (ob(HUGE_ROWS), ob.calculate_qparams()))(Q.MinMaxObserver()),
    "nf4": lambda: NF.nf4_quantize(SPECIAL_ROWS, 64),
    "nf4_zero": lambda: NF.nf4_quantize(ZERO_ROWS, 64, double_quant=True),
    "nf4_dequantize": lambda: (lambda c, a: NF.nf4_dequantize(c, a, 64))(*NF.nf4_quantize(SPECIAL_ROWS, 64)),
    "clip": lambda: (lambda g: (amp.clip_grad_norm_(g, 1.0), g))([x.copy() for x in HUGE_GRADS]),
    "total_norm": lambda: amp.clip.total_norm(HUGE_GRADS),
    "attention": lambda: FL.reference_attention(*INF_QKV),
    "flash": lambda: FL.flash_attention(*INF_QKV, block_q=4, block_k=4),
    "fp8_attention": lambda: FL.fp8_attention(*INF_QKV, block_q=4, block_k=4),
    "attention_fwd": lambda: ATT.attention_forward(X_HUGE, W_QKV, None, W_PROJ, None, 2)[0],
    "log2_histogram": lambda: amp.log2_histogram(SPECIAL32),
    "scaler_overflow": lambda: (lambda sc: (sc.unscale({"g": SPECIAL32}), sc.update(True), sc.scale,
                                            sc.unscale({"g": SPECIAL32[5:9]})))(amp.DynamicLossScaler()),
}


def _quiet(fn: Callable[[], Any]) -> Any:
    """The reference: NumPy's default error state, warnings not turned into errors (pytest's filter is)."""
    with np.errstate(divide="warn", over="warn", invalid="warn", under="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _canon(_call(fn))


@pytest.fixture(scope="module")
def default_results() -> dict[str, Any]:
    return {name: _quiet(fn) for name, fn in SPECIAL_CASES.items()}


def test_special_cases_compute(default_results: dict[str, Any]) -> None:
    assert len(SPECIAL_CASES) >= 34
    raised = {k: r for k, r in default_results.items() if _raised(r)}
    assert not raised, raised


STRICT = {
    "seterr_raise": lambda: np.errstate(all="raise"),
    "seterr_call": lambda: np.errstate(all="call", call=lambda kind, flag: (_ for _ in ()).throw(ArithmeticError(kind))),
    "warnings_error": lambda: _warnings_error(),
    "both": lambda: _both(),
}


@contextlib.contextmanager
def _warnings_error() -> Iterator[None]:
    with np.errstate(divide="warn", over="warn", invalid="warn", under="warn"), warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


@contextlib.contextmanager
def _both() -> Iterator[None]:
    with _warnings_error(), np.errstate(all="raise"):
        yield


@pytest.mark.parametrize("strict", list(STRICT))
def test_same_results_for_a_strict_caller(strict: str, default_results: dict[str, Any]) -> None:
    differ = []
    for name, fn in SPECIAL_CASES.items():
        before = np.geterr()
        with STRICT[strict]():
            mine = np.geterr()
            got = _canon(_call(fn))
            assert np.geterr() == mine, f"{name} changed the caller's numpy error state"
        assert np.geterr() == before
        if got != default_results[name]:
            differ.append(f"{name}: {got if isinstance(got, tuple) and got[:1] == ('raised',) else 'bits'}")
    assert not differ, f"{len(differ)} of {len(SPECIAL_CASES)} entry points differ under {strict}: {differ}"


def test_no_stray_numpy_warning_from_special_values() -> None:
    """Special values are results, not warnings: no NumPy RuntimeWarning escapes fpsim (its only warning is
    the DeprecationWarning of a deprecated name, fpsim/_deprecation.py)."""
    for name, fn in SPECIAL_CASES.items():
        with np.errstate(all="warn"), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _call(fn)
        stray = list(caught)
        assert not stray, f"{name}: {[(w.category.__name__, str(w.message)) for w in stray]}"


def test_numpy1_fallback_quiets_too(monkeypatch: pytest.MonkeyPatch, default_results: dict[str, Any]) -> None:
    """Where NumPy keeps its error state elsewhere (1.x), the guard enters np.errstate(all="ignore") instead."""
    monkeypatch.setattr(_fpenv, "_err_get", lambda: None)
    monkeypatch.setattr(_fpenv, "_err_quiet", _fpenv._np1_quiet)
    monkeypatch.setattr(_fpenv, "_err_reset", _fpenv._np1_reset)
    for name in ["nvfp4_zero", "attention", "fp8_attention", "scaler_overflow", "observer"]:
        with _both():
            assert _canon(_call(SPECIAL_CASES[name])) == default_results[name], name
            assert np.geterr()["over"] == "raise"


def test_callers_error_state_is_kept_between_calls() -> None:
    with np.errstate(all="raise"):
        fpsim.div(SPECIAL64, 0.0, "fp32")
        with pytest.raises(FloatingPointError):
            np.float64(1.0) / np.zeros(1)  # the caller's own arithmetic still raises
    with np.errstate(divide="call", call=lambda *a: None):
        fpsim.div(SPECIAL64, 0.0, "fp32")
        assert np.geterr()["divide"] == "call"


# -- B: every public entry point is guarded ----------------------------------------------------------------

# Public callables left unwrapped, each with the reason. Names and registries compute nothing on user data;
# context managers and generators cannot be guarded by a call wrapper (the caller's own code runs inside the
# ``with`` block or between the items, in the caller's mode: the fpsim calls made there are guarded).
EXEMPT: dict[str, str] = {
    **{n: "names, registries and parsers: no arithmetic on user data" for n in [
        "fpsim.formats.as_format", "fpsim.formats.format_names", "fpsim.formats.all_formats",
        "fpsim.formats.register", "fpsim.rounding.as_rounding", "fpsim.rounding.as_overflow",
        "fpsim.rounding.parse_options", "fpsim.bits.code_dtype", "fpsim._interop.ml_dtype", "fpsim.arith.supports",
        "fpsim.mma.model.as_model", "fpsim.mma.presets.get_model", "fpsim.mma.presets.device_info",
        "fpsim.amp.policy.policy_names", "fpsim.amp.policy.register_policy", "fpsim.train.data.task_names",
        "fpsim.gpu._device.require_cupy"]},
    **{n: "argparse wiring (the command it registers is guarded)" for n in [
        "fpsim.audit._cli.register_cli", "fpsim.gpu.cli.register_cli", "fpsim.plan.cli.register_cli",
        "fpsim.train.cli.register_cli"]},
    **{n: "pytest hook: pluggy introspects its arguments; the assertions it runs are guarded" for n in [
        "fpsim.testing.plugin.pytest_addoption", "fpsim.testing.plugin.pytest_configure",
        "fpsim.testing.plugin.pytest_generate_tests", "fpsim.testing.plugin.pytest_report_header"]},
    **{f"fpsim.formats.Format.{n}": "a format's fields and limits: integer and power-of-two arithmetic, exact in "
       "every mode (checked below); read by every call, so not worth a guard" for n in [
        "__eq__", "__hash__", "__init__", "__post_init__", "__repr__", "__str__", "contains", "describe", "emax",
        "emin", "eps", "fits_float32", "has_nan", "max", "max_mantissa", "min_normal", "min_subnormal", "nan_code",
        "p", "width"]},
    **{n: "context manager or generator: the caller's code runs inside it, in the caller's state (the fpsim "
       "calls there are guarded)" for n in [
        "fpsim.nn.recompute.naive_recomputation", "fpsim.nn.recompute.replaying", "fpsim.nn.recompute.tracing",
        "fpsim.nn.saved.core_tensors", "fpsim.nn.saved.saved_tensors"]},
    **{f"{c}.{n}": "a result record: its fields, comparisons and the sentence that prints them (string "
       "formatting, no arithmetic on user data)" for c, names in [
        ("fpsim.train.sweep.Paired", ["__eq__", "__hash__", "__init__", "__repr__", "__str__", "beyond", "sentence"]),
        ("fpsim.amp.anomaly.Anomaly", ["__eq__", "__hash__", "__init__", "__repr__", "__str__", "cause"])]
       for n in names},
    **{n: "hypothesis strategy: drawn lazily by hypothesis, outside any call" for n in [
        "fpsim.testing.strategies.arrays", "fpsim.testing.strategies.bit_patterns",
        "fpsim.testing.strategies.from_format", "fpsim.testing.strategies.hard_cases"]},
}
_GUARDED_CLASSES_SKIP = _fpenv._SKIP


def _public_modules() -> list[str]:
    lines = (ROOT / "tests" / "api_snapshot.txt").read_text(encoding="utf-8").splitlines()
    return sorted({ln.split(":")[0] for ln in lines if ln and not ln.startswith("#") and "<needs" not in ln})


def _guarded(f: Any) -> bool:
    while f is not None:  # a cache or deprecation wrapper may sit outside the guard
        if getattr(f, "__fpsim_ieee__", False):
            return True
        f = getattr(f, "__wrapped__", None)
    return False


def _unguarded() -> tuple[list[str], int]:
    missing, checked, seen = [], 0, set()
    for modname in _public_modules():
        mod = importlib.import_module(modname)
        for name in getattr(mod, "__all__", []):
            obj = getattr(mod, name, None)
            if id(obj) in seen or not (inspect.isfunction(obj) or isinstance(obj, type)):
                continue
            if not str(getattr(obj, "__module__", "")).startswith("fpsim"):
                continue
            seen.add(id(obj))
            qual = f"{obj.__module__}.{obj.__qualname__}"
            if isinstance(obj, type):
                if issubclass(obj, (BaseException, enum.Enum)) or getattr(obj, "_is_protocol", False):
                    continue  # errors, enum members and typing protocols compute nothing
                for attr in dir(obj):
                    if (attr.startswith("_") and not attr.endswith("__")) or attr in _GUARDED_CLASSES_SKIP:
                        continue
                    raw = inspect.getattr_static(obj, attr)
                    f = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else (
                        raw.fget if isinstance(raw, property) else raw)
                    if not inspect.isfunction(f) or not str(f.__module__).startswith("fpsim"):
                        continue  # object's and typing's own methods
                    checked += 1
                    if not _guarded(f) and f"{qual}.{attr}" not in EXEMPT:
                        missing.append(f"{qual}.{attr}")
            else:
                checked += 1
                if not _guarded(obj) and qual not in EXEMPT:
                    missing.append(qual)
    return missing, checked


def test_every_public_function_and_method_is_guarded() -> None:
    """A new public function, class or method gets ``@ieee_mode`` (or an entry in EXEMPT, with the reason)."""
    missing, checked = _unguarded()
    assert checked > 600
    assert not missing, f"{len(missing)} public entry points without @ieee_mode: {missing}"


def test_exemptions_are_real() -> None:
    names = set()
    for m in _public_modules():
        for o in vars(importlib.import_module(m)).values():
            qual = f"{getattr(o, '__module__', '')}.{getattr(o, '__qualname__', '')}"
            names.add(qual)
            if isinstance(o, type):
                names |= {f"{qual}.{k}" for k in dir(o)}
    assert set(EXEMPT) <= names, set(EXEMPT) - names
    gens = [k for k, why in EXEMPT.items() if why.startswith("context manager")]
    for qual in gens:  # really generators: a plain function that computes must be guarded instead
        mod, _, name = qual.rpartition(".")
        assert inspect.isgeneratorfunction(inspect.unwrap(getattr(importlib.import_module(mod), name))), qual


@needs_libm
def test_format_limits_are_exact_in_every_rounding_mode() -> None:
    """Why Format's limits need no guard (EXEMPT): they come out the same in every rounding mode."""
    props = ["max", "min_normal", "min_subnormal", "eps", "emin", "emax", "p", "width", "max_mantissa", "nan_code"]
    ref = {f.name: [getattr(f, p) for p in props] + [f.describe()] for f in fpsim.all_formats()}
    for mode in MODES.values():
        with rounding_mode(mode):
            got = {f.name: [getattr(f, p) for p in props] + [f.describe()] for f in fpsim.all_formats()}
            fresh = fpsim.Format("fresh16", 5, 10).describe()
        assert got == ref
        assert {k: v for k, v in fresh.items() if k != "name"} == {
            k: v for k, v in fpsim.fp16.describe().items() if k != "name"}


# -- D: import -----------------------------------------------------------------------------------------------

_DUMP = r"""
import ctypes, ctypes.util, hashlib, importlib, pkgutil, sys, warnings
m = ctypes.CDLL(ctypes.util.find_library("m"))
assert m.fesetround(int(sys.argv[1])) == 0
import numpy as np
import fpsim
for info in sorted(pkgutil.walk_packages(fpsim.__path__, "fpsim."), key=lambda i: i.name):
    try:
        importlib.import_module(info.name)
    except ImportError:  # optional dependencies (cupy, matplotlib, hypothesis...)
        pass
assert m.fegetround() == int(sys.argv[1])
m.fesetround(0)
def canon(v, depth=0):
    if isinstance(v, float):
        return v.hex()
    if isinstance(v, (np.ndarray, np.generic)) and np.asarray(v).dtype.kind in "fc":
        return hashlib.sha1(np.ascontiguousarray(v).tobytes()).hexdigest()
    if isinstance(v, (tuple, list)) and depth < 3:
        return [canon(x, depth + 1) for x in v]
    if isinstance(v, dict) and depth < 3:
        return sorted((repr(k), canon(x, depth + 1)) for k, x in v.items() if isinstance(k, (str, int, float)))
    return None
for name, mod in sorted(sys.modules.items()):
    if name.startswith("fpsim"):
        for k, v in sorted(vars(mod).items()):
            c = canon(v)
            if c:
                print(name, k, c)
"""


@needs_libm
@pytest.mark.slow
def test_module_constants_do_not_depend_on_the_importing_threads_mode(tmp_path: Path) -> None:
    """Before: imported (and compiled) under FE_DOWNWARD, fpsim.quant_nf4.NF4, nn.layers._GELU_C, arith._HUGE,
    plan.CHINCHILLA_TABLE3 and 13 more module constants differed (2.0**-14 folded to 0x1.0000000000001p-14),
    and a .pyc compiled that way kept the wrong constants for later processes."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    outs = {}
    for label, mode in [("nearest", NEAREST), *MODES.items()]:
        # a fresh bytecode cache each time, so that each run compiles fpsim's sources in its mode
        env["PYTHONPYCACHEPREFIX"] = str(tmp_path / label)
        r = subprocess.run([sys.executable, "-c", _DUMP, str(mode)], capture_output=True, text=True, env=env,
                           timeout=300, cwd=str(ROOT))
        assert r.returncode == 0, r.stderr[-2000:]
        outs[label] = r.stdout.splitlines()
    assert len(outs["nearest"]) > 300
    for label, lines in outs.items():
        diff = sorted(set(lines) ^ set(outs["nearest"]))
        assert not diff, f"{label}: {diff[:10]}"


# -- D: import, warnings and torch -----------------------------------------------------------------------------------------------

_SCRIPT = ("import numpy as np, struct, fpsim;"
           "r=[fpsim.div(1.0,3.0,'fp64'), float(np.asarray(fpsim.matmul([[1.0,2**-30]],[[1.0],[1.0]]))[0,0]),"
           " float(fpsim.sum(np.linspace(0.1,1,1000),'fp64')), float(fpsim.round(0.1,'bf16','sr',"
           "rng=np.random.default_rng(1)))];"
           "print(' '.join(struct.pack('<d', v).hex() for v in r))")


def _run(code: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env.pop("PYTHONWARNINGS", None)
    return subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, env=env,
                          timeout=300, cwd=str(ROOT))


@pytest.mark.slow
def test_import_warns_nothing_and_order_with_torch_gives_the_same_bits() -> None:
    plain = _run(_SCRIPT)
    assert plain.returncode == 0 and not plain.stderr, plain.stderr
    runs = {"plain": plain.stdout}
    try:
        import torch  # noqa: F401
    except ImportError:
        pass
    else:
        for label, code in [("torch_first", "import torch;" + _SCRIPT),
                            ("fpsim_first", _SCRIPT.replace("import numpy as np, struct, fpsim;",
                                                            "import numpy as np, struct, fpsim, torch;"))]:
            r = _run(code)
            assert r.returncode == 0 and not r.stderr, (label, r.stderr)
            runs[label] = r.stdout
    assert len(set(runs.values())) == 1, runs
    if _LIBM is not None:  # imported while another library left a directed mode: the same bits, mode kept
        code = (f"import ctypes, ctypes.util; m = ctypes.CDLL(ctypes.util.find_library('m'));"
                f"m.fesetround({MODES['upward']}); import fpsim, fpsim.nn, fpsim.plan;"
                f"assert m.fegetround() == {MODES['upward']}; m.fesetround({NEAREST});" + _SCRIPT)
        r = _run(code)
        assert r.returncode == 0 and not r.stderr, r.stderr
        assert r.stdout == plain.stdout



@pytest.mark.skipif(_fpenv._cfpenv is None or not hasattr(_fpenv._cfpenv, "_set_sse_round")
                    or platform.machine().lower() not in ("x86_64", "amd64"),
                    reason="sets the SSE unit's rounding control alone: x86-64 with the C helper")
@pytest.mark.parametrize("rc", [1, 2, 3])
def test_sse_only_rounding_mode_is_given_back(rc: int) -> None:
    """A library that sets MXCSR's rounding control alone (_MM_SET_ROUNDING_MODE) leaves the x87 word at nearest,
    and fegetround (which reads the x87 word on x86-64) says nearest. Before (review finding): the guard saved
    the x87 mode and "restored" nearest, so the caller's SSE mode was lost after any fpsim call."""
    c = _fpenv._cfpenv
    want = fpsim.div(1.0, 3.0, "fp64")
    before = c._set_sse_round(rc)
    try:
        assert (1.0 + _fpenv._SMALL) != (1.0 - _fpenv._SMALL)  # Python's own arithmetic rounds directed now
        got = fpsim.div(1.0, 3.0, "fp64")
        after = c._set_sse_round(rc)  # reads the mode the call left (and sets the same one again)
    finally:
        c._set_sse_round(before)
    assert got == want
    assert after == rc, f"the caller's SSE rounding control {rc} came back as {after}"
