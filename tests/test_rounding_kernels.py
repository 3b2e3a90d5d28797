"""The compiled kernel against the NumPy reference kernel (both must give the same bits, SR included)."""

from __future__ import annotations

import numpy as np
import pytest

import fpsim
import fpsim.rounding as R
from fpsim.random import Philox
from fpsim.rounding import _F32, _F64, Overflow, Rounding, _c_params, _kernel, _plan

from _loops import compiled_loops

pytestmark = pytest.mark.skipif(not R.use_c_kernel, reason="the C kernel is not built here")

MODES = ["rne", "rna", "rtz", "rup", "rdn", "rto", "sr"]


def _data(dtype: type, n: int = 60_000) -> np.ndarray:
    rng = np.random.default_rng(7)
    # random bit patterns cover every exponent, NaN payloads, infinities and subnormals of the carrier
    w = np.dtype(dtype).itemsize
    raw = rng.integers(0, 2 ** (8 * w) - 1, n, dtype=np.uint64 if w == 8 else np.uint32, endpoint=True)
    x = raw.view(dtype)
    y = (rng.standard_normal(n) * np.exp2(rng.integers(-30, 30, n))).astype(dtype)
    return np.concatenate([x, y, np.array([0.0, -0.0, np.inf, -np.inf], dtype=dtype)])


def _both(x: np.ndarray, fmt: fpsim.Format, mode: str, **kw: object) -> tuple[np.ndarray, np.ndarray]:
    rng_a = np.random.default_rng(3) if mode == "sr" else None
    rng_b = np.random.default_rng(3) if mode == "sr" else None
    a = fpsim.round(x, fmt, mode, rng=rng_a, **kw)
    R.use_c_kernel = False
    try:
        b = fpsim.round(x, fmt, mode, rng=rng_b, **kw)
    finally:
        R.use_c_kernel = True
    return a, b


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", [f for f in fpsim.all_formats()], ids=lambda f: f.name)
def test_c_kernel_equals_numpy_kernel(fmt: fpsim.Format, mode: str, dtype: type) -> None:
    x = _data(dtype)
    for kw in ({}, {"overflow": "saturate"}, {"subnormals": False}):
        a, b = _both(x, fmt, mode, **kw)
        ua = a.view(np.uint64 if a.dtype == np.float64 else np.uint32)
        ub = b.view(np.uint64 if b.dtype == np.float64 else np.uint32)
        assert np.array_equal(ua, ub), (kw, x[ua != ub][:4], a[ua != ub][:4], b[ua != ub][:4])


@pytest.mark.parametrize("sr_bits", [1, 3, 8])
def test_c_kernel_equals_numpy_kernel_sr_bits(sr_bits: int) -> None:
    x = _data(np.float32)
    a, b = _both(x, fpsim.fp16, "sr", sr_bits=sr_bits)
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("mode", ["rne", "sr"])
def test_threaded_kernel_equals_one_thread(mode: str) -> None:
    """Large arrays are shared among threads; the bits (SR's random stream too) must not depend on it."""
    x = np.random.default_rng(11).standard_normal(3 * R._PARALLEL_MIN // 2 + 7).astype(np.float32) * 1e-3
    rng = (lambda: np.random.default_rng(4)) if mode == "sr" else (lambda: None)
    old = R.max_threads
    try:
        R.max_threads = 2
        a = fpsim.round(x, "fp8_e5m2", mode, rng=rng())
        R.max_threads = 1
        b = fpsim.round(x, "fp8_e5m2", mode, rng=rng())
    finally:
        R.max_threads = old
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


# --------------------------------------------------------------------------------------------------
# Issue 17: the specialised copies, threads in C, SR's words drawn in C


COMMON = ["bf16", "fp16", "fp8_e4m3", "fp8_e5m2"]
# (format, mode, overflow) -> the specialised copy that must serve it
SPECS = {(f, m, "ieee"): f"{t}_{m}" for f, t in zip(COMMON, ["bf16", "fp16", "e4m3", "e5m2"]) for m in ["rne", "rtz", "sr"]}
SPECS.update({(f, m, "saturate"): f"{t}_{m}_sat" for f, t in [("fp8_e4m3", "e4m3"), ("fp8_e5m2", "e5m2")] for m in ["rne", "sr"]})


def _params(c: object, fmt: str, mode: str, overflow: str = "ieee", subnormals: bool = True,
            sr_bits: int | None = None) -> tuple[object, ...]:
    pl = _plan(c, fpsim.as_format(fmt), Rounding(mode), Overflow(overflow), subnormals, sr_bits)  # type: ignore[arg-type]
    return _c_params(pl)


def test_specialised_copies_serve_the_common_plans() -> None:
    for (f, m, ov), tag in SPECS.items():
        assert R._ckernel.spec_name(*_params(_F32, f, m, ov)) == tag
    # everything else takes the generic code (the same algorithm with the plan's numbers)
    for args in [("bf16", "rna"), ("fp16", "rne", "saturate"), ("fp16", "rne", "ieee", False),
                 ("fp16", "sr", "ieee", True, 8), ("fp8_e4m3fnuz", "rne"), ("fp8_e4m3", "rup")]:
        assert R._ckernel.spec_name(*_params(_F32, *args)) is None, args  # type: ignore[arg-type]
    assert R._ckernel.spec_name(*_params(_F64, "bf16", "rne")) is None


# every float32 bit pattern's high 16 bits, with low halves at and around every rounding boundary
_LOWS = np.array([0, 1, 0x7FF, 0x800, 0x801, 0xFFF, 0x1000, 0x1001, 0x1FFF, 0x2000, 0x3FFF, 0x4000, 0x7FFF,
                  0x8000, 0x8001, 0xFFFF], dtype=np.uint32)
_ALL_HIGH = ((np.arange(1 << 16, dtype=np.uint32) << 16)[:, None] | _LOWS[None, :]).reshape(-1)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("overflow", ["ieee", "saturate"])
@pytest.mark.parametrize("fmt", COMMON)
def test_c_kernel_every_high_half_float32(fmt: str, overflow: str, mode: str) -> None:
    """The compiled kernel (specialised copy or generic) against the NumPy reference on all 2**16 high
    halves x 16 low halves (1M patterns: every sign, exponent, NaN payload top, subnormal, boundary)."""
    pl = _plan(_F32, fpsim.as_format(fmt), Rounding(mode), Overflow(overflow), True, None)
    rand = np.random.default_rng(1).integers(0, 2**32, _ALL_HIGH.size, dtype=np.uint64).astype(np.uint32)
    rand = rand if mode == "sr" else None
    ref = np.asarray(_kernel(_ALL_HIGH, pl, None, rand))
    out = np.empty_like(_ALL_HIGH)
    R._ckernel.round_bits(_ALL_HIGH, out, rand, _c_params(pl))
    bad = out != ref
    assert not bad.any(), (int(bad.sum()), [hex(int(v)) for v in _ALL_HIGH[bad][:4]])


@pytest.mark.parametrize("mode", ["rne", "rtz", "sr"])
@pytest.mark.parametrize("fmt", COMMON)
def test_c_kernel_every_high_half_float64(fmt: str, mode: str) -> None:
    hi = np.arange(1 << 16, dtype=np.uint64) << np.uint64(48)
    lows = np.array([0, 1, (1 << 28) - 1, 1 << 28, (1 << 29) + 1, (1 << 44) - 1, 1 << 44, (1 << 48) - 1], np.uint64)
    bits = (hi[:, None] | lows[None, :]).reshape(-1)
    pl = _plan(_F64, fpsim.as_format(fmt), Rounding(mode), Overflow.IEEE, True, None)
    rand = np.random.default_rng(2).integers(0, 2**64 - 1, bits.size, dtype=np.uint64, endpoint=True) if mode == "sr" else None
    ref = np.asarray(_kernel(bits, pl, None, rand))
    out = np.empty_like(bits)
    R._ckernel.round_bits(bits, out, rand, _c_params(pl))
    assert np.array_equal(out, ref)


_BIG = 3 * R._PARALLEL_MIN // 2 + 7  # odd: the last float32 word is half used


def _big(dtype: type) -> np.ndarray:
    g = np.random.default_rng(11)
    return (g.standard_normal(_BIG) * np.exp2(g.integers(-30, 12, _BIG))).astype(dtype)


@pytest.mark.parametrize("case", ["bf16-rne", "fp16-rne", "fp8_e4m3-rna", "fp8_e5m2-sr", "bf16-sr-f64",
                                  "fp16-sr-sr_bits40", "fp16-sr-mt19937", "fp16-sr-philox", "fp16-sr-dxsm"])
def test_thread_counts_give_the_same_bits_and_generator_state(case: str) -> None:
    """1, 2, 3 and 8 threads and the NumPy reference kernel: the same bits, and SR leaves the generator
    where drawing the words in order leaves it (the 32-bit buffer of a generator included)."""
    fmt, mode, *rest = case.split("-")
    x = _big(np.float64 if "f64" in rest else np.float32)
    bg = {"mt19937": np.random.MT19937, "philox": np.random.Philox, "dxsm": np.random.PCG64DXSM}.get(
        rest[0] if rest else "", np.random.PCG64)
    kw = {"sr_bits": 40} if "sr_bits40" in rest else {}
    got = []
    old = R.max_threads
    try:
        for threads, c in [(1, True), (2, True), (3, True), (8, True), (2, False)]:
            R.max_threads, R.use_c_kernel = threads, c
            rng = np.random.Generator(bg(5))
            rng.integers(0, 10, size=3, dtype=np.uint32)  # leaves a buffered 32-bit half in the generator
            r = fpsim.round(x, fmt, mode, rng=rng if mode == "sr" else None, **kw)  # type: ignore[arg-type]
            got.append((r.view(np.uint64 if r.dtype == np.float64 else np.uint32).copy(),
                        rng.integers(0, 2**32, 5, dtype=np.uint64).tolist(), rng.random()))
    finally:
        R.max_threads, R.use_c_kernel = old, True
    for g in got[1:]:
        assert np.array_equal(g[0], got[0][0])
        assert g[1:] == got[0][1:]


def test_pcg64_words_in_c_are_the_generators() -> None:
    """SR's words stepped in C from PCG64's state: the same as drawing them through NumPy."""
    x = np.full(10_001, 1 + 2**-9, np.float32)  # bf16: 2**14 of 2**16 dropped: up iff the word's top 16 bits >= 0xC000
    a = fpsim.round(x, "bf16", "sr", rng=np.random.default_rng(8))
    w = R._random_words(np.random.default_rng(8), x.size, _F32)
    assert np.array_equal(a != 1.0, (w >> 16) >= 0xC000)
    pl = _plan(_F32, fpsim.bf16, Rounding.SR, Overflow.IEEE, True, None)
    out = np.empty(x.size, np.uint32)
    R._ckernel.round_bits(x.view(np.uint32), out, w, _c_params(pl))
    assert np.array_equal(out.view(np.float32), a)


def test_round_bits_refuses_bad_random_sources_and_splits() -> None:
    ck = R._ckernel
    x = np.ones(4096, np.float32).view(np.uint32)
    out = np.empty_like(x)
    p = _params(_F32, "bf16", "sr")
    bg = np.random.PCG64(1)
    with pytest.raises(ValueError, match="chunk must be a multiple"):
        ck.round_bits(x, out, None, _params(_F32, "bf16", "rne"), 1000)
    with pytest.raises(ValueError, match="one bit generator per thread"):
        ck.round_bits(x, out, (bg.capsule, bg.capsule, bg.capsule), p, 2048)
    with pytest.raises(ValueError, match="pcg64"):
        ck.round_bits(x, out, ("mt19937", 0, 0, 0, 1), p, 0)
    with pytest.raises(ValueError):
        ck.round_bits(x, out, (object(),), p, 0)  # not a capsule
    st = bg.state["state"]
    s, inc = st["state"], st["inc"]
    ck.round_bits(x, out, bg.capsule, p, 0)  # the capsule: one word per two float32 elements
    assert bg.state["state"]["state"] != s
    g2 = np.random.PCG64(1)
    hi, lo = ck.round_bits(x, out, ("pcg64", s >> 64, s & (2**64 - 1), inc >> 64, inc & (2**64 - 1)), p, 2048)
    g2.advance(2048)
    assert (hi << 64) | lo == g2.state["state"]["state"] == bg.state["state"]["state"]


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
def test_threads_after_fork_in_a_child() -> None:
    """The parent's C worker pool does not survive a fork (the child starts with an empty one): a forked
    child rounds large arrays with threads, the same bits as its parent."""
    from _fork import in_forked_child

    old = R.max_threads
    R.max_threads = 2
    try:
        x = _big(np.float32)
        want = fpsim.round(x, "fp16", "sr", rng=np.random.default_rng(3))
        assert in_forked_child(_child, x) == want.view(np.uint32).tobytes()
    finally:
        R.max_threads = old


def _child(q: object, x: np.ndarray) -> None:
    q.put(fpsim.round(x, "fp16", "sr", rng=np.random.default_rng(3)).view(np.uint32).tobytes())  # type: ignore[attr-defined]


@pytest.mark.parametrize("case", [k for k in SPECS if k[1] in ("rne", "rtz")], ids="-".join)
def test_non_temporal_path_every_high_half(case: tuple[str, str, str]) -> None:
    """RNE/RTZ of the specialised formats into large outputs store non-temporally (a separate AVX-512 loop
    where the CPU has one): forced here on the 1M patterns, at several start alignments, in one thread and
    in several."""
    fmt, mode, overflow = case
    old = R._ckernel.stream_min_bytes(0)
    try:
        pl = _plan(_F32, fpsim.as_format(fmt), Rounding(mode), Overflow(overflow), True, None)
        ref = np.asarray(_kernel(_ALL_HIGH, pl, None, None))
        for off in range(0, 17, 3):
            for chunk in (0, 1 << 18):
                buf = np.zeros(_ALL_HIGH.size + 16, np.uint32)
                out = buf[off : off + _ALL_HIGH.size - off]
                R._ckernel.round_bits(_ALL_HIGH[off:], out, None, _c_params(pl), chunk)
                assert np.array_equal(out, ref[off:]), (off, chunk)
                assert not buf[off + out.size :].any()  # nothing written past the end
    finally:
        R._ckernel.stream_min_bytes(old)


def test_concurrent_callers_share_or_bypass_the_pool() -> None:
    """Python threads rounding at once (the GIL is released): one dispatch uses the worker pool, the
    others start threads of their own; every result has the bits of a lone call."""
    import threading

    old = R.max_threads
    R.max_threads = 3
    try:
        x = _big(np.float32)
        want = {m: fpsim.round(x, "fp16", m, rng=np.random.default_rng(2) if m == "sr" else None) for m in ("rne", "sr")}
        bad: list[str] = []

        def work(mode: str) -> None:
            for _ in range(3):
                r = fpsim.round(x, "fp16", mode, rng=np.random.default_rng(2) if mode == "sr" else None)
                if not np.array_equal(r.view(np.uint32), want[mode].view(np.uint32)):
                    bad.append(mode)

        ts = [threading.Thread(target=work, args=(m,)) for m in ("rne", "sr", "rne", "sr")]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        assert not bad and not any(t.is_alive() for t in ts)
    finally:
        R.max_threads = old


def _child_encode(q: object) -> None:
    x = np.linspace(-3, 3, 1 << 20, dtype=np.float32)
    q.put((fpsim.to_bits(x, "fp8_e4m3").tobytes(), repr(fpsim.analyze(x, "bf16"))))  # type: ignore[attr-defined]


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
def test_encoder_and_counts_threads_after_fork_in_a_child(monkeypatch: pytest.MonkeyPatch) -> None:
    """_carith's threaded encoder and counts (the block-by-block to_bits and analyze) run on its own worker
    pool: a forked child starts an empty one and gets its parent's codes and counts."""
    from _fork import in_forked_child

    monkeypatch.setattr(R, "max_threads", 2)
    monkeypatch.setattr(R, "use_sink", False)  # the block-by-block path: _carith's threads
    x = np.linspace(-3, 3, 1 << 20, dtype=np.float32)
    want = (fpsim.to_bits(x, "fp8_e4m3").tobytes(), repr(fpsim.analyze(x, "bf16")))  # the parent's pool has run
    assert in_forked_child(_child_encode) == want


@pytest.mark.parametrize("overflow", ["ieee", "saturate"])
@pytest.mark.parametrize("fmt", ["fp16", "fp8_e4m3", "fp8_e5m2"])
def test_sr_carry_boundaries(fmt: str, overflow: str) -> None:
    """Exact SR from float32 with each element's random word at, one below and one above the word that makes
    its dropped part carry: G = floor(frac(|x| / ulp) * 2**32), where ulp is the result's grid (q below the
    min normal), carries iff rand + G >= 2**32. Every float32 exponent, both signs; each compiled loop (the
    specialised copies: AVX2 and scalar) against the NumPy kernel, and the NumPy kernel against that rule."""
    f = fpsim.as_format(fmt)
    rng = np.random.default_rng(17)
    ef = np.repeat(np.arange(255, dtype=np.uint32), 48)
    man = rng.integers(0, 1 << 23, ef.size, dtype=np.uint32)
    man[::48] = 0  # a power of two in each binade
    mag = (ef << np.uint32(23)) | man
    bits = np.concatenate([mag, mag | np.uint32(0x80000000)])
    ax = np.abs(bits.view(np.float32).astype(np.float64))
    q = 2.0 ** (f.emin - f.mbits)
    ulp = np.where(ax < 2.0**f.emin, q, np.exp2(np.floor(np.log2(np.maximum(ax, q))) - f.mbits))
    v = ax / ulp  # exact: a power-of-two scaling
    G = np.floor((v - np.floor(v)) * 2.0**32).astype(np.uint64)
    start = (np.uint64(1 << 32) - G) & np.uint64(0xFFFFFFFF)
    x = np.tile(bits, 3)
    rand = np.concatenate([(start + np.uint64(dl)) & np.uint64(0xFFFFFFFF) for dl in (0xFFFFFFFF, 0, 1)]).astype(np.uint32)
    pl = _plan(_F32, f, Rounding.SR, Overflow(overflow), True, None)
    ref = np.asarray(_kernel(x, pl, None, rand))
    # the NumPy kernel against the rule, on the finite results below the max
    fin = np.tile((G != 0) & (ax < float(f.max)), 3)
    got = np.abs(ref.view(np.float32).astype(np.float64))
    want_up = (rand.astype(np.uint64) + np.tile(G, 3)) >= 1 << 32
    axx = np.tile(ax, 3)
    assert np.array_equal((got > axx)[fin], want_up[fin])
    assert np.all((got[fin] < axx[fin]) | want_up[fin])
    for loop in compiled_loops(R._ckernel.sr_impl):
        R._ckernel.sr_impl(loop)
        try:
            out = np.empty_like(x)
            R._ckernel.round_bits(x, out, rand, _c_params(pl))
        finally:
            R._ckernel.sr_impl("auto")
        bad = out != ref
        assert not bad.any(), (loop, int(bad.sum()), [hex(int(b)) for b in x[bad][:4]])


def test_sr_impl_switch_named() -> None:
    before = R._ckernel.sr_impl()
    with pytest.raises(ValueError, match="'auto', 'scalar', 'avx2'"):
        R._ckernel.sr_impl("sse")
    with pytest.raises(TypeError):
        R._ckernel.sr_impl(1)
    with pytest.raises(TypeError):
        R._ckernel.sr_impl("avx2", "scalar")
    assert R._ckernel.sr_impl() == before in ("avx2", "scalar")  # refused calls switch nothing


@pytest.mark.parametrize("fmt", ["fp16", "fp8_e4m3", "fp8_e5m2"])
def test_sr_below_min_normal_hostile_layouts(fmt: str) -> None:
    """SR through the AVX2 loop (an odd length: a scalar tail too) with NaN, infinities, zeros and values far
    below q: big-endian, strided and Fortran-order inputs give the bits of the native contiguous array; empty
    arrays stay empty; the input is not modified."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(5003) * np.exp2(rng.integers(-30, 12, 5003))).astype(np.float32)
    x[::97], x[1::89], x[2::83], x[3::79] = np.nan, np.inf, -np.inf, -0.0
    keep = x.copy()
    want = fpsim.round(x, fmt, "sr", rng=Philox(9)).view(np.uint32)
    for arg in (x.astype(">f4"), np.repeat(x, 2)[::2], np.asfortranarray(np.stack([x, x]).T)[:, 0]):
        got = np.asarray(fpsim.round(arg, fmt, "sr", rng=Philox(9)), np.float32)
        assert np.array_equal(got.view(np.uint32), want)
    assert np.array_equal(x.view(np.uint32), keep.view(np.uint32))
    assert fpsim.round(np.empty(0, np.float32), fmt, "sr", rng=Philox(9)).shape == (0,)
