"""Integer inference (fpsim.quant_int) against torch's quantized CPU kernels (torch 2.13), bit for bit.

Oracle: ``torch.quantize_per_tensor`` / ``quantize_per_channel`` (``.int_repr()``),
``torch.ao.nn.quantized.Linear``, ``torch.ao.nn.intrinsic.quantized.LinearReLU`` and
``torch.ops.quantized.linear`` on a packed weight, for every engine in
``torch.backends.quantized.supported_engines``.

The kernels' integer GEMM depends on the CPU (``fpsim.quant_int.ISAS``): the Linear tests are parametrized by
ISA and each runs only on a CPU of that kind, skipping elsewhere with the reason. Validated with torch 2.13.0+cpu:
``avx2`` on an AMD EPYC with AVX2 and neither AVX-512 nor AVX-VNNI (``get_cpu_capability()`` = ``AVX2``),
``avx512`` on an AMD EPYC with AVX-512 VNNI (``get_cpu_capability()`` = ``AVX512``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import fpsim.quant_int as QI

F = np.float32


# torch deprecates the eager quantized API that is the oracle here. Per test (a mark), not a filter set once in
# a module fixture: pytest restores the filters after each test, so such a filter held for the first test only.
pytestmark = pytest.mark.filterwarnings("ignore:.*quantize_per_tensor.*deprecated.*")


@pytest.fixture(scope="module")
def torch() -> Any:
    return pytest.importorskip("torch")


#: The torch version whose kernels these tests pin down (named in every failure message).
TORCH_VALIDATED = "2.13"


def _cpu_flags() -> set[str] | None:
    """The CPU's feature flags from /proc/cpuinfo (None where it cannot be read)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        return None
    return None


def _need_isa(torch: Any, isa: str) -> None:
    """Skip unless this CPU runs torch's quantized GEMMs the way ``isa`` models (see the module docstring)."""
    cap = str(torch.backends.cpu.get_cpu_capability())
    flags = _cpu_flags()
    if isa == "avx2":
        ok = cap == "AVX2" and (flags is None or "avx_vnni" not in flags)
        need = "torch.backends.cpu.get_cpu_capability() == 'AVX2' on a CPU without AVX-VNNI"
    else:
        ok = cap == "AVX512" and (flags is None or "avx512_vnni" in flags)
        need = "torch.backends.cpu.get_cpu_capability() == 'AVX512' on a CPU with AVX-512 VNNI"
    if not ok:
        vnni = "" if flags is None else f", VNNI flags {sorted(f for f in flags if 'vnni' in f)}"
        pytest.skip(f"validates torch {TORCH_VALIDATED}'s {isa} kernels: needs {need}; "
                    f"this machine: {cap}{vnni}, torch {torch.__version__}")


def _engines() -> list[str]:
    try:
        import torch
    except ImportError:  # pragma: no cover
        return []
    return [e for e in torch.backends.quantized.supported_engines if e in QI.ENGINES]


@contextlib.contextmanager
def _engine(torch: Any, name: str) -> Iterator[None]:
    old = torch.backends.quantized.engine
    torch.backends.quantized.engine = name
    try:
        yield
    finally:
        torch.backends.quantized.engine = old


def _near_ties(rng: np.random.Generator, shape: tuple[int, ...], scale: Any) -> np.ndarray:
    """Values at and one float32 ulp either side of (k + 1/2) * scale: where the rounding order shows."""
    k = rng.integers(-300, 300, shape) + 0.5
    x = (k * scale).astype(F)
    step = rng.integers(-1, 2, shape)
    x = np.where(step > 0, np.nextafter(x, F(np.inf)), np.where(step < 0, np.nextafter(x, F(-np.inf)), x))
    return x.astype(F)


# ------------------------------------------------------------------ quantize


@pytest.mark.parametrize("dtype", ["quint8", "qint8"])
def test_quantize_per_tensor_matches_torch(torch: Any, dtype: str) -> None:
    rng = np.random.default_rng(1)
    tdt = getattr(torch, dtype)
    lo, hi = QI.QDTYPES[dtype][1:]
    mism = total = 0
    for i in range(200):
        n = int(rng.integers(1, 80))                                  # vector body and scalar tails
        s = F(rng.uniform(0.003, 0.05))
        z = int(rng.integers(lo, hi + 1))
        x = _near_ties(rng, (n,), s) if i % 2 else (rng.standard_normal(n) * 3).astype(F)
        x[: n // 8] *= F(50)                                          # saturating values
        want = torch.quantize_per_tensor(torch.from_numpy(x), float(s), z, tdt).int_repr().numpy()
        got = QI.quantize_per_tensor(x, s, z, dtype)
        assert got.dtype == want.dtype
        mism += int(np.count_nonzero(got != want))
        total += n
    assert mism == 0, f"{mism} of {total} codes differ"


@pytest.mark.parametrize("dtype", ["quint8", "qint8"])
def test_quantize_per_channel_matches_torch(torch: Any, dtype: str) -> None:
    rng = np.random.default_rng(2)
    tdt = getattr(torch, dtype)
    lo, hi = QI.QDTYPES[dtype][1:]
    mism = total = 0
    for _ in range(200):
        n, k = int(rng.integers(1, 7)), int(rng.integers(1, 50))
        s = rng.uniform(0.003, 0.05, n).astype(F)
        z = rng.integers(lo, hi + 1, n) // 2
        x = _near_ties(rng, (n, k), s[:, None])
        want = torch.quantize_per_channel(torch.from_numpy(x), torch.from_numpy(s.astype(np.float64)),
                                          torch.from_numpy(z), 0, tdt).int_repr().numpy()
        got = QI.quantize_per_channel(x, s, z, 0, dtype)
        mism += int(np.count_nonzero(got != want))
        total += x.size
    assert mism == 0, f"{mism} of {total} codes differ"


def test_rounding_orders_differ_near_ties() -> None:
    """The per-tensor kernel rounds x * inv + zp once (FMA); per channel rounds the product first."""
    s = F(0.1)
    x = np.float32([0.35000005])                          # x * inv just above 3.5; + 11 lands on 14.5 in float32
    inv = F(1) / s
    assert float(F(x[0] * inv) + F(11)) == 14.5
    assert QI.quantize_per_tensor(x, s, 11, "quint8").tolist() == [15]        # 14.5000005 -> 15
    assert QI.quantize_per_channel(x.reshape(1, 1), [s], [11], 0, "quint8").tolist() == [[14]]  # tie -> even


def test_dequantize_matches_torch(torch: Any) -> None:
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(257) * 4).astype(F)
    t = torch.quantize_per_tensor(torch.from_numpy(x), 0.0371, 37, torch.quint8)
    got = QI.dequantize(t.int_repr().numpy(), F(0.0371), 37)
    assert np.array_equal(got.view(np.uint32), t.dequantize().numpy().view(np.uint32))


# ------------------------------------------------------------------ int GEMM


def test_int_matmul_exact_against_int64() -> None:
    rng = np.random.default_rng(4)
    qx = rng.integers(0, 256, (3, 5, 67)).astype(np.uint8)
    qw = rng.integers(-128, 128, (13, 67)).astype(np.int8)
    zw = rng.integers(-5, 5, 13)
    want = np.einsum("bmk,nk->bmn", qx.astype(np.int64) - 100, qw.astype(np.int64) - zw[:, None])
    got = QI.int_matmul(qx, 100, qw, zw)
    assert got.dtype == np.int32 and np.array_equal(got, want)


def test_int_matmul_overflow_is_an_error() -> None:
    qx = np.full((1, 140_000), 255, np.uint8)
    qw = np.full((1, 140_000), -128, np.int8)
    with pytest.raises(OverflowError, match="int32"):
        QI.int_matmul(qx, 0, qw, 0)


def _pair_ref(qx: np.ndarray, zx: int, qw: np.ndarray, zw: np.ndarray) -> np.ndarray:
    """vpmaddubsw's sum by brute force: raw products of adjacent pairs (k = 2j, 2j + 1) clipped to int16,
    widened and summed, minus the zero points' exact offsets."""
    k = qw.shape[1]
    a = np.concatenate([qx.astype(np.int64), np.zeros(qx.shape[:-1] + (k % 2,), np.int64)], axis=-1)
    w = np.concatenate([qw.astype(np.int64), np.zeros((qw.shape[0], k % 2), np.int64)], axis=1)
    raw = np.zeros(qx.shape[:-1] + (qw.shape[0],), np.int64)
    for j in range(0, a.shape[-1], 2):
        p = a[..., j, None] * w[:, j] + a[..., j + 1, None] * w[:, j + 1]
        raw += np.clip(p, -32768, 32767)
    zw = np.broadcast_to(zw, (qw.shape[0],))
    return raw - zx * qw.astype(np.int64).sum(1) - qx.astype(np.int64).sum(-1)[..., None] * zw + k * zx * zw


def test_int_matmul_pair_saturation_on_avx2() -> None:
    """fbgemm/x86/onednn on avx2 saturate each pair of u8 x s8 products to int16; avx512 (VNNI) and qnnpack
    sum exactly. Checked against a brute-force pair loop, big weights, odd K, per-channel zero points."""
    qx, qw = np.uint8([[255, 255, 3]]), np.int8([[127, 127, 1], [-128, -128, 0], [127, -128, 0]])
    assert QI.int_matmul(qx, 0, qw, 0, engine="fbgemm", isa="avx2").tolist() == [[32767 + 3, -32768, -255]]
    assert QI.int_matmul(qx, 0, qw, 0, engine="onednn", isa=" AVX2 ").tolist() == [[32767 + 3, -32768, -255]]
    for eng, isa in (("fbgemm", "avx512"), ("qnnpack", "avx2"), (None, "avx2")):
        assert QI.int_matmul(qx, 0, qw, 0, engine=eng, isa=isa).tolist() == [[64773, -65280, -255]]
    rng = np.random.default_rng(5)
    for k in (1, 2, 7, 64, 67):
        qx = rng.integers(0, 256, (2, 3, k)).astype(np.uint8)
        qx[0, 0] = 255
        qw = rng.integers(-128, 128, (9, k)).astype(np.int8)
        zw = rng.integers(-5, 6, 9)
        exact = QI.int_matmul(qx, 7, qw, zw)
        for eng in ("fbgemm", "x86", "onednn"):
            got = QI.int_matmul(qx, 7, qw, zw, engine=eng, isa="avx2")
            assert got.dtype == np.int32 and np.array_equal(got, _pair_ref(qx, 7, qw, zw))
        assert np.array_equal(QI.int_matmul(qx, 7, qw, zw, engine="fbgemm", isa="avx512"), exact)
        assert np.array_equal(QI.int_matmul(qx, 7, qw, zw, engine="qnnpack", isa="avx2"), exact)
        if k >= 64:
            assert not np.array_equal(_pair_ref(qx, 7, qw, zw), exact)      # the case does saturate
    small = rng.integers(-60, 61, (5, 40)).astype(np.int8)                   # no pair can leave int16
    qx = rng.integers(0, 256, (4, 40)).astype(np.uint8)
    assert np.array_equal(QI.int_matmul(qx, 3, small, 0, engine="x86", isa="avx2"), QI.int_matmul(qx, 3, small, 0))


def test_default_isa_follows_an_imported_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    def fake(cap: Any) -> types.ModuleType:
        mod = types.ModuleType("torch")
        def get() -> Any:
            if isinstance(cap, Exception):
                raise cap
            return cap

        setattr(mod, "backends", types.SimpleNamespace(cpu=types.SimpleNamespace(get_cpu_capability=get)))
        return mod

    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert QI.default_isa() == "avx512"                                     # no torch: the documented default
    for cap, want in (("AVX2", "avx2"), ("AVX512", "avx512"), ("DEFAULT", "avx512"), ("NO AVX", "avx512"),
                      (RuntimeError("no"), "avx512")):
        monkeypatch.setitem(sys.modules, "torch", fake(cap))
        assert QI.default_isa() == want, cap
    qx, qw = np.uint8([[255, 255]]), np.int8([[127, 127]])
    monkeypatch.setitem(sys.modules, "torch", fake("AVX2"))
    assert QI.int_matmul(qx, 0, qw, 0, engine="fbgemm").tolist() == [[32767]]
    assert QI.quantized_linear(qx, 1 / 16, 0, qw, 1 / 32, 0, None, 1.0, 128).tolist() == [[192]]
    monkeypatch.setitem(sys.modules, "torch", fake("AVX512"))
    assert QI.int_matmul(qx, 0, qw, 0, engine="fbgemm").tolist() == [[64770]]
    assert QI.quantized_linear(qx, 1 / 16, 0, qw, 1 / 32, 0, None, 1.0, 128).tolist() == [[255]]


def test_default_isa_matches_torch(torch: Any) -> None:
    cap = str(torch.backends.cpu.get_cpu_capability()).lower()
    assert QI.default_isa() == (cap if cap in QI.ISAS else "avx512")


# ------------------------------------------------------------------ quantized Linear vs torch


@pytest.mark.parametrize("engine", _engines())
@pytest.mark.parametrize("isa", QI.ISAS)
def test_pair_saturation_matches_torch(torch: Any, isa: str, engine: str) -> None:
    """Pairs of products past int16 (255 * 127 * 2): power-of-two scales make the output show the
    accumulator (m = 2**-9), so the saturated 32767 and the exact 64770 land on different codes."""
    _need_isa(torch, isa)
    qx = np.uint8([[255, 255, 255, 255], [255, 0, 255, 9], [200, 200, 0, 0], [255, 255, 0, 0]])
    qw = np.int8([[127, 127, 0, 0], [-128, -128, 0, 0], [127, -128, 127, 1], [100, 100, 100, 100], [2, 3, 4, 5]])
    with _engine(torch, engine):
        qx_t = torch._make_per_tensor_quantized_tensor(torch.from_numpy(qx), 1 / 16, 0)
        qw_t = torch._make_per_tensor_quantized_tensor(torch.from_numpy(qw), 1 / 32, 0)
        for relu in (False, True):
            mod = (torch.ao.nn.intrinsic.quantized.LinearReLU if relu else torch.ao.nn.quantized.Linear)(4, 5)
            mod.set_weight_bias(qw_t, None)
            mod.scale, mod.zero_point = 1.0, 128
            want = mod(qx_t).int_repr().numpy()
            got = QI.quantized_linear(qx, 1 / 16, 0, qw, 1 / 32, 0, None, 1.0, 128, engine=engine, relu=relu, isa=isa)
            assert np.array_equal(got, want), (f"torch {torch.__version__} (model: {TORCH_VALIDATED}) {engine} on "
                                               f"{isa}: {got.tolist()} != {want.tolist()}")
    other = "avx512" if isa == "avx2" else "avx2"
    ours = QI.quantized_linear(qx, 1 / 16, 0, qw, 1 / 32, 0, None, 1.0, 128, engine=engine, isa=isa)
    theirs = QI.quantized_linear(qx, 1 / 16, 0, qw, 1 / 32, 0, None, 1.0, 128, engine=engine, isa=other)
    assert np.array_equal(ours, theirs) == (engine == "qnnpack")           # only the GEMM depends on the ISA



def _case(rng: np.random.Generator, *, per_channel: bool, bias: bool, pow2: bool, wzp: bool,
          m: int, k: int, n: int) -> dict[str, Any]:
    """One random problem; ``pow2``: power-of-two scales, so requantized values land on exact ties."""
    x = (rng.standard_normal((m, k)) * rng.uniform(0.3, 3)).astype(F)
    w = (rng.standard_normal((n, k)) * rng.uniform(0.02, 0.5)).astype(F)
    if pow2:
        xs = F(2.0 ** -int(rng.integers(3, 7)))
        ws = np.full(n, F(2.0 ** -int(rng.integers(5, 9))))
        ys = F(2.0 ** -int(rng.integers(-1, 4)))
    else:
        xs = F(rng.uniform(0.005, 0.05))
        ws = (np.abs(w).max(1) / 127.5 * rng.uniform(0.5, 1.3, n)).astype(F)
        ys = F(rng.uniform(0.005, 0.3))                              # small output scales saturate
    if not per_channel:
        ws = np.full(n, ws[0])
    wz = rng.integers(-8, 9, n) if wzp else np.zeros(n, np.int64)
    if not per_channel:
        wz = np.full(n, wz[0])
    b = (rng.standard_normal(n) * rng.uniform(0.1, 5)).astype(F) if bias else None
    if b is not None and pow2:
        b = (np.round(b * 64) / 64).astype(F)
    return {"x": x, "w": w, "xs": xs, "xz": int(rng.integers(0, 256)), "ws": ws, "wz": wz, "b": b,
            "ys": ys, "yz": int(rng.integers(0, 256)), "per_channel": per_channel}


def _torch_q(torch: Any, c: dict[str, Any]) -> tuple[Any, Any]:
    qx = torch.quantize_per_tensor(torch.from_numpy(c["x"]), float(c["xs"]), c["xz"], torch.quint8)
    if c["per_channel"]:
        qw = torch.quantize_per_channel(torch.from_numpy(c["w"]), torch.from_numpy(c["ws"].astype(np.float64)),
                                        torch.from_numpy(c["wz"]), 0, torch.qint8)
    else:
        qw = torch.quantize_per_tensor(torch.from_numpy(c["w"]), float(c["ws"][0]), int(c["wz"][0]), torch.qint8)
    return qx, qw


def _fpsim_linear(c: dict[str, Any], qx: np.ndarray, qw: np.ndarray, engine: str, relu: bool,
                  isa: str) -> np.ndarray:
    ws = c["ws"] if c["per_channel"] else c["ws"][0]
    wz = c["wz"] if c["per_channel"] else int(c["wz"][0])
    return QI.quantized_linear(qx, c["xs"], c["xz"], qw, ws, wz, c["b"], c["ys"], c["yz"], engine=engine, relu=relu,
                               isa=isa)


def _run_engine(torch: Any, engine: str, n_cases: int, seed: int, isa: str) -> tuple[int, int, int, int]:
    """(cases, mismatching codes, codes, saturated codes) over random problems for ``engine``."""
    rng = np.random.default_rng(seed)
    cases = mism = total = sat = 0
    with _engine(torch, engine):
        for i in range(n_cases):
            pc, hb, relu, pow2 = bool(i & 1), bool(i & 2), bool(i & 4), bool(i & 8)
            wzp = engine != "onednn" and i % 3 == 0                 # oneDNN refuses weight zero points
            m, k, n = (int(v) for v in rng.integers(1, 70, 3))     # rarely multiples of vector widths
            c = _case(rng, per_channel=pc, bias=hb, pow2=pow2, wzp=wzp, m=m, k=k, n=n)
            qx_t, qw_t = _torch_q(torch, c)
            mod = (torch.ao.nn.intrinsic.quantized.LinearReLU if relu else torch.ao.nn.quantized.Linear)(k, n)
            mod.set_weight_bias(qw_t, None if c["b"] is None else torch.from_numpy(c["b"]))
            mod.scale, mod.zero_point = float(c["ys"]), c["yz"]
            want = mod(qx_t).int_repr().numpy()
            qx = QI.quantize_per_tensor(c["x"], c["xs"], c["xz"])
            assert np.array_equal(qx, qx_t.int_repr().numpy())
            got = _fpsim_linear(c, qx, qw_t.int_repr().numpy(), engine, relu, isa)
            cases += 1
            mism += int(np.count_nonzero(got != want))
            total += want.size
            sat += int(np.count_nonzero((want == 0) | (want == 255)))
    return cases, mism, total, sat


@pytest.mark.parametrize("engine", _engines())
@pytest.mark.parametrize("isa", QI.ISAS)
def test_quantized_linear_matches_torch(torch: Any, isa: str, engine: str) -> None:
    _need_isa(torch, isa)
    cases, mism, total, sat = _run_engine(torch, engine, 48, seed=10, isa=isa)
    assert cases == 48 and sat > 0
    assert mism == 0, (f"torch {torch.__version__} (model: {TORCH_VALIDATED}) {engine} on {isa}: "
                       f"{mism} of {total} output codes differ over {cases} cases")


@pytest.mark.slow
@pytest.mark.parametrize("engine", _engines())
@pytest.mark.parametrize("isa", QI.ISAS)
def test_quantized_linear_matches_torch_many(torch: Any, isa: str, engine: str) -> None:
    _need_isa(torch, isa)
    cases, mism, total, sat = _run_engine(torch, engine, 400, seed=11, isa=isa)
    assert mism == 0, (f"torch {torch.__version__} (model: {TORCH_VALIDATED}) {engine} on {isa}: "
                       f"{mism} of {total} output codes differ over {cases} cases")


@pytest.mark.parametrize("engine", _engines())
@pytest.mark.parametrize("isa", QI.ISAS)
def test_packed_op_and_batched_input(torch: Any, isa: str, engine: str) -> None:
    """``torch.ops.quantized.linear`` on ``linear_prepack`` params, a 3-D input, ReLU op."""
    _need_isa(torch, isa)
    rng = np.random.default_rng(12)
    c = _case(rng, per_channel=True, bias=True, pow2=False, wzp=False, m=1, k=33, n=17)
    x = (rng.standard_normal((2, 5, 33)) * 2).astype(F)
    c["x"] = x
    with _engine(torch, engine):
        qx_t, qw_t = _torch_q(torch, c)
        for relu, op in ((False, torch.ops.quantized.linear), (True, torch.ops.quantized.linear_relu)):
            # one packed weight per op: oneDNN's primitive cache (keyed on scales, zero points and shapes,
            # not on the post-op) would run linear_relu as the linear primitive built first
            packed = torch.ops.quantized.linear_prepack(qw_t, torch.from_numpy(c["b"]))
            want = op(qx_t, packed, float(c["ys"]), c["yz"]).int_repr().numpy()
            got = _fpsim_linear(c, qx_t.int_repr().numpy(), qw_t.int_repr().numpy(), engine, relu, isa)
            assert got.shape == want.shape == (2, 5, 17)
            assert np.array_equal(got, want)


def test_requantize_saturates_and_relu() -> None:
    acc = np.int32([[-(2**30), -1000, 0, 1000, 2**30]])
    assert QI.requantize(acc, 0.1, 0.1, 1.0, 100).tolist() == [[0, 90, 100, 110, 255]]
    assert QI.requantize(acc, 0.1, 0.1, 1.0, 100, relu=True).tolist() == [[100, 100, 100, 110, 255]]


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="fbgemm"):
        QI.requantize(np.int32([[1]]), 0.1, 0.1, 1.0, 0, engine="tensorrt")
    with pytest.raises(ValueError, match="unknown isa 'avx1024'; valid: avx2, avx512"):
        QI.quantized_linear(np.uint8([[1]]), 0.1, 0, np.int8([[1]]), 0.1, 0, None, 1.0, 0, isa="avx1024")
    with pytest.raises(TypeError, match="isa"):
        QI.int_matmul(np.uint8([[1]]), 0, np.int8([[1]]), 0, engine="fbgemm", isa=2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="engine"):
        QI.int_matmul(np.uint8([[1]]), 0, np.int8([[1]]), 0, engine="tensorrt")
    with pytest.raises(ValueError, match=r"qx must hold values in \[0, 255\]"):
        QI.int_matmul(np.int16([[300]]), 0, np.int8([[1]]), 0, engine="onednn", isa="avx2")
    with pytest.raises(ValueError, match=r"qw must hold values in \[-128, 127\]"):
        QI.int_matmul(np.uint8([[3]]), 0, np.int16([[200]]), 0, engine="x86", isa="avx2")

    with pytest.raises(ValueError, match="quint8"):
        QI.quantize_per_tensor([1.0], 0.1, 0, "uint4")
    with pytest.raises(TypeError, match="integer"):
        QI.int_matmul(np.float32([[1.0]]), 0, np.int8([[1]]), 0)
    with pytest.raises(ValueError, match="zero_point"):
        QI.quantize_per_tensor([1.0], 0.1, 300, "quint8")
    with pytest.raises(ValueError, match="scale"):
        QI.quantize_per_tensor([1.0], -0.1, 0)
    x = np.float32([1.0, 2.0])
    QI.quantize_per_tensor(x, 0.1, 0)
    assert x.tolist() == [1.0, 2.0]


# ------------------------------------------------------------------ a QAT model in integers


@pytest.fixture(scope="module")
def qat_trainer() -> Any:
    from fpsim.nn import GPTConfig
    from fpsim.train import TrainConfig, Trainer
    from fpsim.train.data import get_task

    t = get_task("sort", n_symbols=8, length=6)
    model = GPTConfig(vocab_size=t.vocab_size, block_size=t.seq_len, n_layer=1, n_head=2, n_embd=32)
    cfg = TrainConfig(task="sort", task_kwargs={"n_symbols": 8, "length": 6}, model=model, steps=24,
                      batch_size=16, eval_every=0, eval_batches=2, warmup=4)
    tr = Trainer("int8-qat", cfg)
    tr.run(progress=False)
    return tr


def _eval(tr: Any, prec: Any) -> float:
    from fpsim.nn import gpt_forward

    return float(np.mean([float(gpt_forward(tr.store.weights, tr.model, x, y, prec=prec)[1])
                          for x, y in tr.eval_batches()]))


@pytest.mark.slow
def test_qat_model_in_integers_matches_fake_quant(qat_trainer: Any) -> None:
    tr = qat_trainer
    fq = tr.evaluate()
    rt = QI.IntegerRuntime(tr.runtime, output="float")
    li = _eval(tr, rt)
    assert abs(li - fq) <= 1e-4 * abs(fq), (li, fq)
    assert sorted(rt.act_code_diff) == ["h0.attn.proj", "h0.attn.qkv", "h0.mlp.fc", "h0.mlp.proj"]
    diff = sum(v[0] for v in rt.act_code_diff.values())
    total = sum(v[1] for v in rt.act_code_diff.values())
    assert diff <= 1e-3 * total
    rq = QI.IntegerRuntime(tr.runtime, output="quint8", engine="fbgemm")
    with pytest.raises(ValueError, match="calibrate_outputs"):
        _eval(tr, rq)
    rq.calibrate_outputs(True)
    _eval(tr, rq)
    rq.calibrate_outputs(False)
    lq = _eval(tr, rq)
    assert abs(lq - fq) <= 2e-2 * abs(fq), (lq, fq)
    assert tr.runtime.quant_active and tr.runtime.training     # the trained runtime is left alone


def test_integer_runtime_refuses_float_policies() -> None:
    from fpsim.amp import get_policy

    with pytest.raises(ValueError, match="no integer quantization"):
        QI.IntegerRuntime(get_policy("fp32").runtime())
    with pytest.raises(ValueError, match="int8"):
        QI.IntegerRuntime(get_policy("int4-qat").runtime())
    with pytest.raises(TypeError):
        QI.IntegerRuntime("int8-qat")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown isa 'sse'"):
        QI.IntegerRuntime(get_policy("int8-qat").runtime(), isa="sse")
    assert QI.IntegerRuntime(get_policy("int8-qat").runtime(), isa="AVX2").isa == "avx2"


@pytest.mark.parametrize("isa", QI.ISAS)
def test_onednn_shared_packed_weight_drops_the_relu(torch: Any, isa: str) -> None:
    """A torch 2.13 quirk worth knowing (not modelled): with the onednn engine, ``linear`` then
    ``linear_relu`` on the *same* packed weight and the same output qparams reuses the cached
    ``linear`` primitive, so the ReLU is silently dropped. fpsim follows a fresh packed weight."""
    if "onednn" not in _engines():
        pytest.skip("onednn engine not built into this torch")
    _need_isa(torch, isa)
    rng = np.random.default_rng(13)
    c = _case(rng, per_channel=True, bias=True, pow2=False, wzp=False, m=6, k=33, n=17)
    c["yz"] = 40
    with _engine(torch, "onednn"):
        qx_t, qw_t = _torch_q(torch, c)
        packed = torch.ops.quantized.linear_prepack(qw_t, torch.from_numpy(c["b"]))
        plain = torch.ops.quantized.linear(qx_t, packed, float(c["ys"]), c["yz"]).int_repr().numpy()
        shared = torch.ops.quantized.linear_relu(qx_t, packed, float(c["ys"]), c["yz"]).int_repr().numpy()
    ours = _fpsim_linear(c, qx_t.int_repr().numpy(), qw_t.int_repr().numpy(), "onednn", True, isa)
    assert plain.min() < c["yz"]
    assert np.array_equal(shared, plain)                       # the ReLU was dropped
    assert np.array_equal(ours, np.maximum(plain, c["yz"]))    # what a fresh packed weight gives


def test_docs_page_example_runs() -> None:
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "quantization.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    assert blocks
    ns: dict[str, Any] = {}
    exec(blocks[0], ns)                                       # noqa: S102 - our own docs page
    assert ns["qy"].dtype == np.uint8 and ns["qy"].shape == (4, 17)
    assert ns["qy2"].min() >= 120                             # the fused ReLU clamps at the zero point
