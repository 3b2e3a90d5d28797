"""Issue 12, section 2 item 3: the same bits whatever the FPU's flush mode (FTZ/DAZ), or a clear error.

Every entry point runs on inputs with float32/float64 subnormals (in and out) once in the normal mode and
once with FTZ+DAZ set, through fpsim's own C helper and through ``torch.set_flush_denormal(True)``; the
results must be bit-identical and the caller's mode must be the same after the call. Before the fix
14 of 20 entry points changed bits silently (``to_bits(np.float32(1e-45), "fp32")`` gave 0).
"""

from __future__ import annotations

import contextlib
import inspect
import struct
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import fpsim
import fpsim.mma
import fpsim.quant as Q
import fpsim.scaling as S
import fpsim.testing as ft
from fpsim import _fpenv
import fpsim.nn.flash
import fpsim.plan
import fpsim.train.ledger
from fpsim.mma import experiments, naive

HELPER = _fpenv._helper()
FLUSH = _fpenv.FTZ | _fpenv.DAZ

try:
    import torch
except ImportError:  # pragma: no cover - torch is optional
    torch = None  # type: ignore[assignment]


@contextlib.contextmanager
def _flush_helper() -> Iterator[None]:
    prev = _fpenv.set_flush_flags(FLUSH)
    try:
        yield
    finally:
        _fpenv.set_flush_flags(prev)


@contextlib.contextmanager
def _flush_torch() -> Iterator[None]:
    assert torch is not None
    prev = _fpenv.flush_flags() if HELPER is not None else 0
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)
        if HELPER is not None:
            _fpenv.set_flush_flags(prev)


VIAS = {
    "helper": pytest.param(_flush_helper, marks=pytest.mark.skipif(HELPER is None, reason="no fpsim._cfpenv")),
    "torch": pytest.param(_flush_torch, marks=[
        pytest.mark.skipif(torch is None, reason="no torch"),
        pytest.mark.skipif(HELPER is None, reason="no fpsim._cfpenv (the refusal is tested separately)"),
        pytest.mark.torch]),
}


@pytest.fixture(params=list(VIAS.values()), ids=list(VIAS))
def flushing(request: pytest.FixtureRequest) -> Callable[[], contextlib.AbstractContextManager[None]]:
    return request.param  # type: ignore[no-any-return]


def _canon(obj: Any) -> Any:
    """A hashable, bit-exact picture of a result (NaN == NaN, -0 != +0), built in the normal mode."""
    if isinstance(obj, fpsim.FPArray):
        return ("FPArray", obj.format.name, _canon(np.asarray(obj.values)))
    if isinstance(obj, (np.ndarray, np.generic)):
        a = np.asarray(obj)
        if a.dtype.kind == "O":  # strings of bits_str
            return ("O", a.shape, tuple(_canon(v) for v in a.ravel().tolist()))
        return (a.dtype.str, a.shape, a.tobytes())
    if isinstance(obj, float):
        return ("f", struct.pack("<d", obj))
    if isinstance(obj, (tuple, list)):
        return tuple(_canon(x) for x in obj)
    if isinstance(obj, dict):
        return tuple(sorted((k, _canon(v)) for k, v in obj.items()))
    if isinstance(obj, fpsim.RoundingReport):
        return _canon(obj.as_dict())
    return obj


def _call(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as e:  # the same error (type and message) in both modes is the same result
        return ("raised", type(e).__name__, str(e))


# Inputs are built here, in the normal mode: under FTZ even np.float32(1e-45) would be 0.
F32_MIN_SUB = np.float32(np.ldexp(np.float32(1), -149))
X32 = np.array([1e-45, 3e-39, -1e-40, 1.1754942e-38, 1.1754944e-38, 0.5, -0.0, 3.0, 2.5e-41, 1e-38],
               dtype=np.float32)
Y32 = np.array([1e-45, -3e-39, 2e-40, 1.1754942e-38, 0.5, 2.0**-127, 1.0, -0.25, 1e-45, 2.0], dtype=np.float32)
X64 = np.array([5e-324, 1e-310, -3e-320, 2.2250738585072009e-308, 2.2250738585072014e-308, 1.0, -0.0, 1e-300,
                3.5e-323, 2.0**-1030])
Y64 = np.array([5e-324, -1e-310, 1.0, 0.5, 2.0**-52, 1e-10, 1.0, 1e-20, 5e-324, 3.0])
M32 = X32[:8].reshape(2, 4)
N32 = Y32[:8].reshape(4, 2)
ROWS32 = np.tile(X32[:4], (2, 8))  # (2, 32): MX/NVFP4 blocks
BITS32 = np.array([1, 2, 0x007FFFFF, 0x00800000, 0x80000001, 0x3F800000], dtype=np.uint32)
BITS64 = np.array([1, 2, 0x000FFFFFFFFFFFFF, 0x8000000000000001, 0x3FF0000000000000], dtype=np.uint64)
TINY64 = np.array([1e-9, 2e-8, 7e-8, -1e-12])  # around fp16's smallest subnormal 2**-24
SUB64_OUT = np.array([2.0**-1022, 2.0**-1000, 3.0 * 2.0**-1023])  # normal inputs, subnormal products
A_FP = fpsim.array(X32, "fp32")
B_FP = fpsim.array(Y32, "fp32")
H_FP = fpsim.array(TINY64, "fp16")
ONES32 = np.ones(10, dtype=np.float32)
BIG_SR = np.resize(X32, (1 << 20) + 7)  # big enough for the rounding thread pool
BIG64 = np.resize(X64, (1 << 20) + 7)
# Everything a case needs is built here: a literal converted inside a lambda would be flushed first.
AMAX_SUB = np.float32(1e-41)
MX_AMAX = np.array([1e-40, 3e-39], np.float32)
ABS32, ABS64 = np.abs(X32), np.abs(X64)
HALF3, MINSUB3, POW30 = np.full(3, 0.5), np.full(3, 5e-324), np.full(3, 2.0**-30)
ZERO1 = np.zeros(1, np.float32)


def _setitem() -> Any:
    c = A_FP.copy()
    c[0] = Y32[1]
    return c


def _delayed() -> Any:
    s = S.DelayedScaling("fp8_e4m3", amax_history_len=4)
    q = s.quantize(X32)
    return q, s.update(), s.scale, s.fake_quantize(X32), s.dequantize(q)


def _current() -> Any:
    s = S.CurrentScaling("fp8_e5m2")
    return s.quantize(X32), s.fake_quantize(X32)


def _observer(cls: type) -> Any:
    ob = cls()
    y = ob(X32.reshape(2, 5))
    return y, ob.calculate_qparams()


def _fake_quant_module() -> Any:
    fq = Q.FakeQuantize()
    return fq.forward(X32), fq.backward(Y32), fq.calculate_qparams()


CASES: dict[str, Callable[[], Any]] = {
    # numbers
    "round32": lambda: fpsim.round(X32, "fp32"),
    "round64": lambda: fpsim.round(X64, "fp64"),
    "round_bf16": lambda: fpsim.round(X32, "bf16", "rup"),
    "round_fp16_rup": lambda: fpsim.round(TINY64, "fp16", "rup"),
    "round_sr_bits": lambda: fpsim.round(X32, "bf16", "sr", rng=np.random.default_rng(3), sr_bits=40),
    "round_threads_sr": lambda: fpsim.round(BIG_SR, "bf16", "sr", rng=np.random.default_rng(4), sr_bits=40),
    "round_threads64": lambda: fpsim.round(BIG64, "fp64", "rup"),
    "analyze32": lambda: fpsim.analyze(X32, "fp16"),
    "analyze64": lambda: fpsim.analyze(X64, "fp32"),
    "to_bits32": lambda: fpsim.to_bits(X32, "fp32"),
    "to_bits_scalar": lambda: fpsim.to_bits(F32_MIN_SUB, "fp32"),
    "to_bits64": lambda: fpsim.to_bits(X64, "fp64"),
    "to_bits_bf16": lambda: fpsim.to_bits(X32, "bf16"),
    "from_bits32": lambda: fpsim.from_bits(BITS32, "fp32"),
    "from_bits64": lambda: fpsim.from_bits(BITS64, "fp64"),
    "bits_str": lambda: fpsim.bits_str(X32, "fp32"),
    "to_ml_dtypes": lambda: fpsim.to_ml_dtypes(X32, "bf16").view(np.uint16),
    "format_ulp": lambda: (fpsim.fp64.ulp(X64), fpsim.fp32.ulp(X32)),
    "format_next": lambda: (fpsim.fp64.next_up(X64), fpsim.fp64.next_down(X64), fpsim.fp32.next_up(X32)),
    "format_values": lambda: fpsim.fp16.values(),
    # arithmetic
    "add32": lambda: fpsim.add(X32, Y32, "fp32"),
    "add_scalar": lambda: fpsim.add(F32_MIN_SUB, np.float32(0), "fp32"),
    "sub64": lambda: fpsim.sub(X64, Y64, "fp64"),
    "mul_rup": lambda: fpsim.mul(5e-324, 1.0, "fp16", rounding="rup"),
    "mul64_sub_out": lambda: fpsim.mul(SUB64_OUT, POW30, "fp64"),
    "mul32": lambda: fpsim.mul(X32, Y32, "fp32", rounding="rdn"),
    "div64": lambda: fpsim.div(X64, Y64, "fp64"),
    "div32": lambda: fpsim.div(X32, Y32, "bf16", rounding="rtz"),
    "sqrt64": lambda: fpsim.sqrt(ABS64, "fp64"),
    "sqrt32": lambda: fpsim.sqrt(ABS32, "fp32"),
    "fma32": lambda: fpsim.fma(X32, Y32, X32, "fp32"),
    "fma64": lambda: fpsim.fma(SUB64_OUT, HALF3, MINSUB3, "fp64"),
    # FPArray
    "array": lambda: fpsim.array(X32, "fp32"),
    "fparray_ops": lambda: (A_FP + B_FP, A_FP - B_FP, A_FP * B_FP, A_FP / B_FP, np.sqrt(abs(A_FP)), -A_FP),
    "fparray_fp16": lambda: (H_FP * H_FP, H_FP + H_FP, np.sum(H_FP), H_FP.to("bf16")),
    "fparray_reduce": lambda: (A_FP.sum(), A_FP.mean(), A_FP.prod(), A_FP.cumsum(), np.sum(A_FP), A_FP.max()),
    "fparray_dot": lambda: (A_FP.dot(B_FP), A_FP @ B_FP, np.dot(A_FP, B_FP)),
    "fparray_misc": lambda: (A_FP.bits, A_FP.to("bf16"), repr(A_FP), str(A_FP), A_FP.tolist(), A_FP > B_FP),
    "fparray_setitem": _setitem,
    # accumulation and Tensor Cores
    "sum": lambda: fpsim.sum(X32, "fp32"),
    "sum_pairwise64": lambda: fpsim.sum(X64, "fp64", order="pairwise"),
    "dot": lambda: fpsim.dot(X32, Y32, "fp32"),
    "accumulate_matmul": lambda: fpsim.accumulate.matmul(M32, N32, "fp32"),
    "matmul": lambda: fpsim.matmul(M32, N32),
    "matmul_h100": lambda: fpsim.matmul(M32, N32, model="h100:bf16"),
    "mma_dot": lambda: fpsim.mma.dot(X32, Y32, 0.0, fpsim.mma.get_model("a100", "tf32")),
    "mma_convert": lambda: fpsim.mma.convert_inputs(X32, fpsim.bf16, "rne", "A"),
    "mma_naive": lambda: naive.dot_naive(list(X32[:4]), list(Y32[:4]), 0.0, fpsim.mma.get_model("a100", "tf32")),
    "mma_quantize_tiles": lambda: experiments.quantize_tiles(np.tile(X32[:8], (128, 16)), np.tile(Y32[:8], (128, 16))),
    # scaling and quantization
    "amax": lambda: S.amax(X32),
    "compute_scale": lambda: S.compute_scale(AMAX_SUB, "fp8_e4m3"),
    "quantize": lambda: S.quantize(X32, "fp8_e4m3", np.float32(2.0**100)),
    "dequantize": lambda: S.dequantize(X32, np.float32(2.0**20)),
    "scale_and_quantize": lambda: S.scale_and_quantize(X32, "fp8_e5m2"),
    "scaling_fake_quantize": lambda: S.fake_quantize(X32, "fp8_e4m3", np.float32(2.0**100)),
    "mx": lambda: (S.mx_quantize(ROWS32, "fp8_e4m3"), S.mx_scales(MX_AMAX, "fp8_e4m3")),
    "mx_dequantize": lambda: S.mx_dequantize(ROWS32, np.array([2.0**-100, 2.0**-120], np.float32).reshape(2, 1)),
    "nvfp4": lambda: S.nvfp4_quantize(ROWS32),
    "nvfp4_dequantize": lambda: S.nvfp4_dequantize(ROWS32, np.ones((2, 2), np.float32), np.float32(2.0**-20)),
    "delayed_scaling": _delayed,
    "current_scaling": _current,
    "quant_fake_quantize": lambda: Q.fake_quantize(X32, 1e-41, 0, -128, 127),
    "quant_fake_quantize_mask": lambda: Q.fake_quantize_with_mask(X32, 1e-41, 0, -128, 127),
    "quant_fake_quantize_grad": lambda: Q.fake_quantize_grad(Y32, X32, 1e-41, 0, -128, 127),
    "quant_learnable": lambda: (Q.learnable_fake_quantize(X32, 1e-41, 0.0, -128, 127),
                                Q.learnable_fake_quantize_grad(Y32, X32, 1e-41, 0.0, -128, 127)),
    "quant_fp8": lambda: (Q.fp8_fake_quantize(X32, "fp8_e4m3", np.float32(2.0**100)),
                          Q.fp8_fake_quantize_grad(Y32, X32, "fp8_e4m3", np.float32(2.0**100))),
    "observer_minmax": lambda: _observer(Q.MinMaxObserver),
    "observer_moving": lambda: _observer(Q.MovingAverageMinMaxObserver),
    "observer_per_channel": lambda: _observer(Q.PerChannelMinMaxObserver),
    "observer_moving_per_channel": lambda: _observer(Q.MovingAveragePerChannelMinMaxObserver),
    "fake_quantize_module": _fake_quant_module,
    # testing helpers: the assertions must fail (or pass) in both modes alike
    "ulp_distance": lambda: ft.ulp_distance(X32, Y32, "fp32"),
    "assert_same_bits_differs": lambda: ft.assert_same_bits(X32[:1], X32[8:9], "fp32"),
    "assert_same_bits_same": lambda: ft.assert_same_bits(X32, X32.copy(), "fp32"),
    "assert_rounded": lambda: ft.assert_rounded(ZERO1, X32[:1], "fp32"),
    "assert_ulp_close": lambda: ft.assert_ulp_close(X32, Y32, "fp32", max_ulp=1),
    "assert_matmul_matches": lambda: ft.assert_matmul_matches(np.zeros((2, 2), np.float32), M32, N32),
}


@pytest.fixture(scope="module")
def normal_results() -> dict[str, Any]:
    assert _fpenv.is_ieee()
    return {name: _canon(_call(fn)) for name, fn in CASES.items()}


@pytest.mark.parametrize("name", list(CASES))
def test_same_bits_under_ftz_daz(name: str, flushing: Any, normal_results: dict[str, Any]) -> None:
    with flushing():
        assert not _fpenv.is_ieee()
        got = _call(CASES[name])
        after = _fpenv.flush_flags()
    assert after == FLUSH, f"{name} did not restore the caller's mode: {after:#x}"
    assert _canon(got) == normal_results[name], f"{name} differs under FTZ/DAZ"


@pytest.mark.skipif(HELPER is None, reason="no fpsim._cfpenv")
def test_flushed_results_match_an_independent_oracle() -> None:
    """Not only the same bits as the normal mode: the right bits (NumPy bit views, IEEE float32/float64
    arithmetic in the normal mode, MPFR for the narrow formats)."""
    with _flush_helper():
        bits32, bits64 = fpsim.to_bits(X32, "fp32"), fpsim.to_bits(X64, "fp64")
        add32 = fpsim.add(X32, Y32, "fp32")
        mul64 = fpsim.mul(SUB64_OUT, POW30, "fp64")
        up16 = fpsim.mul(5e-324, 1.0, "fp16", rounding="rup")
        bf = fpsim.round(X32, "bf16", "rup")
    assert np.array_equal(bits32, X32.view(np.uint32)) and np.array_equal(bits64, X64.view(np.uint64))
    assert np.array_equal(add32.view(np.uint32), (X32 + Y32).view(np.uint32))  # float32 add is IEEE here
    assert np.array_equal(mul64.view(np.uint64), (SUB64_OUT * POW30).view(np.uint64))
    assert up16 == 2.0**-24
    pytest.importorskip("gmpy2")
    from _mpfr_oracle import oracle_round

    want = np.array([oracle_round(float(v), fpsim.bf16, "rup") for v in X32])
    assert np.array_equal(np.asarray(bf, dtype=np.float64).view(np.uint64), want.view(np.uint64))


def test_cases_hold_subnormals() -> None:
    """The inputs really are subnormal (in float32 and float64), so that the comparison means something."""
    assert np.any((X32 != 0) & (np.abs(X32) < np.finfo(np.float32).tiny))
    assert np.any((X64 != 0) & (np.abs(X64) < np.finfo(np.float64).tiny))
    assert np.any((np.abs(SUB64_OUT * 2.0**-30) < np.finfo(np.float64).tiny))


@pytest.mark.skipif(HELPER is None, reason="no fpsim._cfpenv")
@pytest.mark.parametrize("flags", [_fpenv.FTZ, _fpenv.DAZ, FLUSH])
def test_probe_sees_each_bit(flags: int) -> None:
    with contextlib.ExitStack() as stack:
        prev = _fpenv.set_flush_flags(flags)
        stack.callback(_fpenv.set_flush_flags, prev)
        assert not _fpenv.is_ieee()
        assert fpsim.to_bits(F32_MIN_SUB, "fp32") == 1
        assert _fpenv.flush_flags() & flags == flags  # aarch64 has one bit for both: reads back FTZ|DAZ
    assert _fpenv.is_ieee()


@pytest.mark.skipif(torch is None, reason="no torch")
def test_probe_sees_torch_flush_denormal() -> None:
    try:
        assert torch.set_flush_denormal(True)
        assert not _fpenv.is_ieee()
        if HELPER is not None:
            assert _fpenv.flush_flags() == FLUSH
    finally:
        torch.set_flush_denormal(False)
    assert _fpenv.is_ieee()


@pytest.mark.skipif(HELPER is None, reason="no fpsim._cfpenv")
def test_mode_restored_when_the_call_raises() -> None:
    with _flush_helper():
        with pytest.raises(ValueError, match="bogus"):
            fpsim.add(X32, Y32, "bogus")
        assert _fpenv.flush_flags() == FLUSH
        with _fpenv.IEEEMode("block"):
            assert _fpenv.is_ieee()
            assert _fpenv.flush_flags() == 0
        assert _fpenv.flush_flags() == FLUSH


@pytest.mark.skipif(HELPER is None, reason="no fpsim._cfpenv")
def test_only_the_flush_bits_are_touched() -> None:
    """A wrapped call keeps whatever else the caller's thread has (e.g. the FZ16 bit on aarch64 is
    cleared and restored with the others; x86 has no such bit and reads it back as 0)."""
    with _flush_helper():
        before = _fpenv.flush_flags()
        fpsim.round(X32, "bf16")
        assert _fpenv.flush_flags() == before


@pytest.mark.skipif(HELPER is None, reason="no fpsim._cfpenv")
def test_threads() -> None:
    """The FPU mode is per thread: a thread fpsim starts inside a call inherits the cleared mode; a
    caller's thread that flushes is protected on its own."""
    seen: list[int] = []

    @_fpenv.ieee_mode
    def start_thread() -> None:
        t = threading.Thread(target=lambda: seen.append(_fpenv.flush_flags()))
        t.start()
        t.join()

    with _flush_helper():
        start_thread()
        outside: list[int] = []
        t = threading.Thread(target=lambda: outside.append(_fpenv.flush_flags()))
        t.start()
        t.join()
    assert seen == [0]
    assert outside == [FLUSH]  # Linux: threads inherit the creating thread's mode

    ref = fpsim.to_bits(X32, "fp32")
    got: list[Any] = []

    def worker() -> None:
        with _flush_helper():
            got.append(fpsim.to_bits(X32, "fp32"))
            got.append(_fpenv.flush_flags())

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert np.array_equal(got[0], ref) and got[1] == FLUSH
    assert _fpenv.is_ieee()  # the main thread never flushed


@pytest.mark.skipif(HELPER is None, reason="no fpsim._cfpenv")
def test_rounding_threads_started_in_a_flushing_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled kernel's worker threads (a pool in C, once a Python pool) take the caller's
    floating-point environment for each job, which the wrapper has cleared: called from a flushing thread,
    threaded rounding gives the bits it gives elsewhere (subnormal inputs and results, SR included)."""
    from fpsim import rounding

    if getattr(rounding, "_ckernel", None) is None:
        pytest.skip("no compiled kernel")
    monkeypatch.setattr(rounding, "max_threads", 2)
    g = np.random.default_rng(2)
    x32 = (g.standard_normal((1 << 20) + 7) * np.exp2(g.integers(-150, -100, (1 << 20) + 7))).astype(np.float32)
    cases = [(BIG64, "fp64", "rup"), (BIG64, "bf16", "sr"), (x32, "fp16", "sr"), (x32, "e8m0", "sr"), (x32, "fp8_e4m3fnuz", "rna")]
    ref = [fpsim.round(x, f, m, rng=np.random.default_rng(1) if m == "sr" else None) for x, f, m in cases]
    with _flush_helper():
        got = [fpsim.round(x, f, m, rng=np.random.default_rng(1) if m == "sr" else None) for x, f, m in cases]
    for (x, f, m), a, b in zip(cases, ref, got):
        ut = np.uint64 if a.dtype == np.float64 else np.uint32
        assert np.array_equal(a.view(ut), b.view(ut)), (f, m)


@pytest.mark.skipif(HELPER is None, reason="no fpsim._cfpenv")
def test_probe_constant_survives_compilation_under_ftz() -> None:
    """A literal 5e-324 compiled by a flushing thread (a first ``import fpsim`` after
    ``torch.set_flush_denormal(True)`` writes the .pyc) parses as 0.0; the probe's operand must not."""
    from pathlib import Path

    src = Path(_fpenv.__file__).read_text(encoding="utf-8")
    with _flush_helper():
        literal = compile("x = 5e-324", "<probe>", "exec").co_consts
        code = compile(src, _fpenv.__file__, "exec")
    assert 0.0 in literal  # the hazard is real here
    ns: dict[str, Any] = {"__name__": "fpsim._fpenv_copy", "__package__": "fpsim"}
    exec(code, ns)
    assert struct.pack("<d", ns["_TINY"]) == struct.pack("<Q", 1)
    with _flush_helper():
        assert not ns["is_ieee"]()
    assert ns["is_ieee"]()


# -- the refusal path --------------------------------------------------------------------------------------


def _flush_raw(helper: Any) -> contextlib.AbstractContextManager[None]:
    @contextlib.contextmanager
    def cm() -> Iterator[None]:
        prev = helper.set(FLUSH)
        try:
            yield
        finally:
            helper.set(prev)
    return cm()


@pytest.mark.skipif(HELPER is None and torch is None, reason="no way to set FTZ here")
def test_refuses_without_the_c_helper(monkeypatch: pytest.MonkeyPatch) -> None:
    real = HELPER
    monkeypatch.setattr(_fpenv, "_cfpenv", None)
    # the normal mode needs no helper
    assert fpsim.to_bits(F32_MIN_SUB, "fp32") == 1
    flush = _flush_raw(real) if real is not None else _flush_torch()
    with flush:
        for call in (lambda: fpsim.to_bits(F32_MIN_SUB, "fp32"), lambda: fpsim.add(X32, Y32, "fp32"),
                     lambda: A_FP + B_FP, lambda: ft.assert_same_bits(X32, X32, "fp32")):
            with pytest.raises(FloatingPointError) as info:
                call()
            msg = str(info.value)
            assert "FTZ/DAZ" in msg and "torch.set_flush_denormal(False)" in msg and "C compiler" in msg
            assert "not built" in msg
        assert not _fpenv.is_ieee()  # the caller's mode is left as it was
    with pytest.raises(FloatingPointError, match=r"^fpsim\.bits\.to_bits: "):  # names the entry point
        with _flush_raw(real) if real is not None else _flush_torch():
            fpsim.to_bits(F32_MIN_SUB, "fp32")


@pytest.mark.skipif(HELPER is None, reason="no fpsim._cfpenv")
def test_refuses_on_an_unsupported_platform(monkeypatch: pytest.MonkeyPatch) -> None:
    real = HELPER
    monkeypatch.setattr(_fpenv, "_cfpenv", types.SimpleNamespace(SUPPORTED=0))
    with _flush_raw(real):
        with pytest.raises(FloatingPointError, match="cannot change the FPU mode on this platform"):
            fpsim.round(X32, "fp16")
    with pytest.raises(OSError, match="not available"):
        _fpenv.flush_flags()


@pytest.mark.skipif(HELPER is None, reason="no fpsim._cfpenv")
def test_refuses_a_mode_it_cannot_clear(monkeypatch: pytest.MonkeyPatch) -> None:
    """A flushing mode the helper does not control (it clears nothing): refuse, never differ."""
    real = HELPER
    fake = types.SimpleNamespace(SUPPORTED=1, get=lambda: 0, set=lambda flags: 0)
    monkeypatch.setattr(_fpenv, "_cfpenv", fake)
    with _flush_raw(real):
        with pytest.raises(FloatingPointError, match="did not restore IEEE subnormals"):
            fpsim.sum(X32, "fp32")
        assert real.get() == FLUSH


# -- the API is unchanged --------------------------------------------------------------------------------

MODULES = [fpsim, fpsim.arith, fpsim.bits, fpsim.rounding, fpsim.accumulate, fpsim.mma, fpsim.scaling,
           fpsim.quant, fpsim.testing, fpsim.mma.gemm, experiments, naive, fpsim.nn.flash, fpsim.plan,
           fpsim.train.ledger]
# Public callables that compute nothing with floats of the user's data (names, registries, factories).
EXEMPT = {
    "Format", "NaNEncoding", "all_formats", "as_format", "format_names", "register", "Rounding", "Overflow",
    "as_rounding", "as_overflow", "parse_options", "RoundingReport", "code_dtype", "ml_dtype", "supports",
    "MMAModel", "DeviceInfo", "as_model", "generic", "get_model", "device_info", "Recipe", "get_recipe",
    "fp8_format_pair", "quant_range", "lsq_grad_factor", "default_fake_quant", "default_weight_fake_quant",
    "default_per_channel_weight_fake_quant",
}


def _public_callables() -> Iterator[tuple[str, Any]]:
    seen: set[int] = set()
    for mod in MODULES:
        for name in getattr(mod, "__all__", []):
            obj = getattr(mod, name, None)
            if not (inspect.isfunction(obj) or isinstance(obj, type)) or id(obj) in seen:
                continue  # modules, constants, models, typing aliases
            if name in EXEMPT or isinstance(obj, type) and issubclass(obj, Exception):
                continue
            seen.add(id(obj))
            yield f"{mod.__name__}.{name}", obj


def test_every_entry_point_is_guarded() -> None:
    """A new public function or class that computes with floats gets ``@ieee_mode`` (or an entry in EXEMPT)."""
    missing = []
    for qual, obj in _public_callables():
        if isinstance(obj, type):
            meths = {k: v for k, v in vars(obj).items()
                     if inspect.isfunction(v) and not (k.startswith("_") and not k.startswith("__"))
                     and k not in _fpenv._SKIP}
            missing += [f"{qual}.{k}" for k, v in meths.items() if not getattr(v, "__fpsim_ieee__", False)]
        elif not getattr(obj, "__fpsim_ieee__", False):
            missing.append(qual)
    for meth in ("ulp", "next_up", "next_down", "values"):
        if not getattr(getattr(fpsim.Format, meth), "__fpsim_ieee__", False):
            missing.append(f"fpsim.Format.{meth}")
    assert not missing, f"entry points without @ieee_mode: {missing}"


def test_wrappers_keep_name_docstring_and_signature() -> None:
    checked = 0
    for qual, obj in _public_callables():
        funcs = [obj] if not isinstance(obj, type) else [
            v for v in vars(obj).values() if inspect.isfunction(v) and hasattr(v, "__wrapped__")]
        for f in funcs:
            inner = f.__wrapped__
            assert f.__name__ == inner.__name__ and f.__qualname__ == inner.__qualname__, qual
            assert f.__doc__ == inner.__doc__ and f.__module__ == inner.__module__, qual
            assert inspect.signature(f) == inspect.signature(inner), qual
            checked += 1
    assert checked > 60
    assert inspect.getdoc(fpsim.add) and "Examples" in (fpsim.add.__doc__ or "")
    assert str(inspect.signature(fpsim.round)).startswith("(x: 'Any', fmt: 'FormatLike'")
    assert "def add(" in "".join(inspect.getsourcelines(fpsim.add)[0])  # inspect follows __wrapped__
    import pickle  # multiprocessing pickles functions by qualified name: the wrapper must be what it finds

    for f in (fpsim.add, fpsim.round, ft.assert_same_bits, fpsim.FPArray.to, fpsim.Format.ulp, S.DelayedScaling.update):
        assert pickle.loads(pickle.dumps(f)) is f
    a = fpsim.array(X32, "fp32")
    assert _canon(pickle.loads(pickle.dumps(a))) == _canon(a)


def test_docstring_examples_still_found() -> None:
    """doctest finds the examples of wrapped functions (it follows ``__module__``)."""
    import doctest

    names = {t.name.rsplit(".", 1)[-1] for t in doctest.DocTestFinder().find(fpsim.arith) if t.examples}
    assert {"add", "fma"} <= names


def test_ieee_mode_on_a_class_and_twice() -> None:
    class K:
        def f(self) -> float:
            return 2.0**-1074 * 1.0

        @property
        def p(self) -> float:
            return 2.0**-1073 * 0.5

        @staticmethod
        def s() -> float:
            return 2.0**-1022 / 4

        def _private(self) -> float:
            return 1.0

    W = _fpenv.ieee_mode(K)
    assert W is K and K.f.__fpsim_ieee__ and K.__dict__["p"].fget.__fpsim_ieee__  # type: ignore[attr-defined]
    assert K.__dict__["s"].__func__.__fpsim_ieee__ and not hasattr(K._private, "__fpsim_ieee__")
    g = _fpenv.ieee_mode(fpsim.add)
    assert g is fpsim.add  # not wrapped twice
    if HELPER is not None:
        with _flush_helper():
            k = K()
            assert (k.f(), k.p, K.s()) == (5e-324, 5e-324, 2.0**-1024)


@pytest.mark.skipif(HELPER is None, reason="no fpsim._cfpenv")
@pytest.mark.parametrize("bad, exc", [(-1, ValueError), (8, ValueError), (2**70, ValueError), (1.0, TypeError),
                                      ("1", TypeError), (None, TypeError)])
def test_helper_rejects_bad_flags(bad: Any, exc: type[Exception]) -> None:
    prev = _fpenv.flush_flags()
    with pytest.raises(exc):
        _fpenv.set_flush_flags(bad)
    assert _fpenv.flush_flags() == prev


# -- hostile inputs, under FTZ/DAZ -------------------------------------------------------------------------

_RO = X32.copy()
_RO.flags.writeable = False
HOSTILE = {
    "nan_inf": np.array([np.nan, np.inf, -np.inf, 1e-45, -1e-45], np.float32),
    "empty": np.array([], np.float32),
    "zero_d": np.array(np.float32(1e-45)),
    "big_endian": X32.astype(">f4"),
    "big_endian64": X64.astype(">f8"),
    "non_contiguous": np.repeat(X32, 2)[::2],
    "read_only": _RO,
    "huge": np.array([3.4e38, -3.4e38, 1e-45], np.float32),
    "float16": np.array([6e-8, -6e-8, 1e-5], np.float16),
    "python_list": [5e-324, 1e-310, -0.0],
    "int": [0, 1, -3],
}
HOSTILE_OPS: dict[str, Callable[[Any], Any]] = {
    "round": lambda x: fpsim.round(x, "bf16", "rup"),
    "to_bits": lambda x: fpsim.to_bits(x, "fp32"),
    "analyze": lambda x: fpsim.analyze(x, "fp16"),
    "add": lambda x: fpsim.add(x, x, "fp32"),
    "mul_fp16": lambda x: fpsim.mul(x, x, "fp16", rounding="rup"),
    "sum": lambda x: fpsim.sum(x, "fp32"),
    "array": lambda x: fpsim.array(x, "fp32") * fpsim.array(x, "fp32"),
    "scaling_quantize": lambda x: S.quantize(x, "fp8_e4m3", np.float32(2.0**100)),
    "quant_fake": lambda x: Q.fake_quantize(x, 1e-41, 0, -128, 127),
    "same_bits": lambda x: ft.assert_same_bits(x, x, "fp32"),
}


@pytest.mark.skipif(HELPER is None, reason="no fpsim._cfpenv")
@pytest.mark.parametrize("op", list(HOSTILE_OPS))
def test_hostile_inputs_same_under_ftz(op: str) -> None:
    fn = HOSTILE_OPS[op]
    for kind, x in HOSTILE.items():
        snapshot = np.asarray(x).tobytes()
        ref = _canon(_call(lambda: fn(x)))
        with _flush_helper():
            got = _call(lambda: fn(x))
            assert _fpenv.flush_flags() == FLUSH
        assert _canon(got) == ref, f"{op}({kind}) differs under FTZ/DAZ"
        assert np.asarray(x).tobytes() == snapshot, f"{op} modified its {kind} input"


@pytest.mark.skipif(HELPER is None, reason="needs the FTZ/DAZ helper")
def test_ieee_mode_context_is_reentrant_and_per_thread() -> None:
    """Review: one IEEEMode instance nested lost the caller's mode (flags 0 after the blocks, 3 expected)."""
    import threading

    from fpsim._fpenv import DAZ, FTZ, IEEEMode, flush_flags, set_flush_flags

    guard = IEEEMode("test")
    prev = set_flush_flags(FTZ | DAZ)
    try:
        with guard:
            with guard:
                assert flush_flags() == 0
            assert flush_flags() == 0
        assert flush_flags() == FTZ | DAZ
        seen: list[int] = []

        def other() -> None:  # another thread, its own stack (threads start with the creator's mode)
            with guard:
                seen.append(flush_flags())
            seen.append(flush_flags())

        with guard:
            t = threading.Thread(target=other)
            t.start()
            t.join()
        assert flush_flags() == FTZ | DAZ
        assert seen[0] == 0
    finally:
        set_flush_flags(prev)


@pytest.mark.skipif(HELPER is None, reason="needs the FTZ/DAZ helper")
def test_format_limits_do_not_depend_on_the_fpu_mode() -> None:
    """Review: fp64.min_subnormal (math.ldexp below 2**-1022) was 0.0 when computed in a flushing thread."""
    import struct

    from fpsim._fpenv import DAZ, FTZ, set_flush_flags

    fresh = fpsim.Format("x64", 11, 52)  # limits computed now, not cached from import time
    prev = set_flush_flags(FTZ | DAZ)
    try:
        got = {k: fresh.describe()[k] for k in ("min_subnormal", "min_normal", "max", "eps")}
        sub = fresh.min_subnormal
    finally:
        set_flush_flags(prev)
    assert struct.pack("<d", sub) == struct.pack("<Q", 1)
    assert {k: struct.pack("<d", v) for k, v in got.items()} == {
        k: struct.pack("<d", v) for k, v in fpsim.fp64.describe().items() if k in got}
