"""The AVX2 and AVX-512 loops of the compiled block-FMA GEMM (fpsim/_cgemm.c, issue 30) against the integer loop
and NumPy.

``_cgemm.impl("avx2")`` runs the block sums in float32 AVX2 lanes on a packed B (inputs of at most 12
significant bits with exponents in [-40, 40]; other inputs, and lanes past the last full 8-lane vector, take
the integer loop), and rounds normal results with an AVX2 mask; ``_cgemm.impl("avx512")`` runs the same steps
16 lanes at a time (its last 8-lane vector and partial vector through the AVX2 groups); ``"auto"`` picks the
widest the CPU has; ``_cgemm.impl("scalar")`` is the integer reference loop. Each loop this machine has must give the NumPy reference's bits (fpsim.mma._bfma) on every BFMA preset: K not a
multiple of the block, N with a tail past the last vector and over several 128-lane tiles, NaN/inf/subnormal
operands, exponents across and beyond the alignment window, inputs outside the float32 loop's range,
subnormal and overflowing outputs, batches, promotion, and 1 vs 2 threads.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import numpy as np
import pytest

import fpsim
from fpsim import rounding
from fpsim.mma import gemm as G
from fpsim.mma import get_model

from _loops import compiled_loops

C = G._cgemm
pytestmark = pytest.mark.skipif(C is None or not hasattr(C, "impl"),
                                reason="fpsim._cgemm (the compiled GEMM) is not built")


#: the loops each test runs: the integer reference, then every float32 loop this machine has
LOOPS = tuple(compiled_loops(C.impl)) if C is not None and hasattr(C, "impl") else ("scalar",)
HAS_AVX2, HAS_AVX512 = "avx2" in LOOPS, "avx512" in LOOPS


from test_cgemm import IDS, PRESETS  # every BFMA preset, as tests/test_cgemm.py runs them  # noqa: E402


def _bits(x: Any) -> np.ndarray:
    """float64 bits, every NaN as one value (the payload is not modelled)."""
    a = np.array(x, dtype=np.float64)
    return np.where(np.isnan(a), np.nan, a).view(np.uint64)


def _runs(fn: Callable[[], Any]) -> Iterator[tuple[str, np.ndarray]]:
    """fn() on each compiled loop and thread count, then on the NumPy reference (label 'numpy')."""
    old_impl, old_threads, old_c = C.impl(), rounding.max_threads, G.use_c_gemm
    try:
        G.use_c_gemm = True
        for mode in LOOPS:
            C.impl(mode)
            for th in (1, 2):
                rounding.max_threads = th
                yield f"{mode}/{th} threads", _bits(fn())
        G.use_c_gemm = False
        yield "numpy", _bits(fn())
    finally:
        C.impl(old_impl)
        rounding.max_threads = old_threads
        G.use_c_gemm = old_c


def assert_all_same(fn: Callable[[], Any]) -> None:
    runs = list(_runs(fn))
    ref_name, ref = runs[-1]
    for name, got in runs[:-1]:
        bad = int((got != ref).sum())
        assert bad == 0, f"{name}: {bad} of {ref.size} outputs differ from {ref_name}"


def _values(rng: np.random.Generator, shape: tuple[int, ...], fmt: Any, spread: int) -> np.ndarray:
    """Values of `fmt` (rounded by matmul): normals over +-spread binades, subnormals, zeros, the largest."""
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-spread, spread + 1, shape))
    u = rng.random(shape)
    sub = rng.integers(1, 2**fmt.mbits, shape) * 2.0 ** (fmt.emin - fmt.mbits) * rng.choice([-1, 1], shape)
    x = np.where(u < 0.08, sub, x)
    x = np.where((u >= 0.08) & (u < 0.16), 0.0, x)
    return np.where((u >= 0.16) & (u < 0.18), rng.choice([-1, 1], shape) * fmt.max, x)


@pytest.mark.parametrize("key", PRESETS, ids=IDS)
def test_every_preset_all_loops_identical(key: tuple[str, str, str, str | None]) -> None:
    m = get_model(key[0], key[1], key[2], path=key[3])
    rng = np.random.default_rng(3030)
    ki = m.instruction_k
    # N: one vector, a tail past the last vector, several 128-lane tiles with a tail; K not a multiple of ki
    for mm, kk, nn in ((3, 2 * ki + 5, 8), (5, ki + 3, 21), (4, 3 * ki - 1, 263)):
        a = _values(rng, (mm, kk), m.input, 10)
        b = _values(rng, (kk, nn), m.input, 10)
        c = rng.standard_normal((mm, nn)) * np.exp2(rng.integers(-10, 11, (mm, nn)))
        c[rng.random((mm, nn)) < 0.2] = 0.0
        assert_all_same(lambda: fpsim.matmul(a, b, c, model=m))
        assert_all_same(lambda: fpsim.matmul(a, b, model=m))


@pytest.mark.parametrize("spec", ["h100:fp16", "h100:bf16", "h100:fp8_e4m3", "h100:fp8_e5m2", "h100:fp16:fp16",
                                  "a100:tf32", "h100:fp8_e4m3:fp16", "v100:fp16:fp16"])
def test_specials_shifts_and_outputs(spec: str) -> None:
    m = fpsim.mma.as_model(spec)
    rng = np.random.default_rng(17)
    ki = m.instruction_k
    mm, kk, nn = 6, 4 * ki + 3, 40
    # alignment: products spread across and beyond the window, with exact cancellation in column 0
    a = _values(rng, (mm, kk), m.input, 30)
    b = _values(rng, (kk, nn), m.input, 30)
    b[1::2, 0] = -b[0:-1:2, 0]
    a[0, 1::2] = a[0, 0:-1:2]
    c = rng.standard_normal((mm, nn)) * np.exp2(rng.integers(-30, 31, (mm, nn)))
    assert_all_same(lambda: fpsim.matmul(a, b, c, model=m))
    # NaN / inf operands and addends (lanes inside the AVX2 vectors and in the tail)
    for x in (a, b, c):
        flat = x.reshape(-1)
        idx = rng.choice(flat.size, size=max(1, flat.size // 50), replace=False)
        flat[idx] = rng.choice([np.nan, np.inf, -np.inf], size=idx.size)
    assert_all_same(lambda: fpsim.matmul(a, b, c, model=m))
    # outputs at the output format's edges: subnormal results (tiny addends, tiny products) and overflow
    out = m.output
    a = _values(rng, (mm, kk), m.input, 2)
    b = _values(rng, (kk, nn), m.input, 2)
    c = rng.choice([-1, 1], (mm, nn)) * rng.integers(1, 2**out.mbits, (mm, nn)) * 2.0 ** (out.emin - out.mbits)
    assert_all_same(lambda: fpsim.matmul(a * 0.0, b, c, model=m))
    # sums below the output's smallest normal with more bits than its subnormals hold (fp16 outputs; with
    # fp32 outputs these inputs' products stay above 2**-126)
    s = 2.0 ** ((out.emin - 4) // 2)
    assert_all_same(lambda: fpsim.matmul(a * s, b * s, model=m))
    assert_all_same(lambda: fpsim.matmul(a * s, b * s, c, model=m))
    c[:, ::3] = out.max * rng.choice([-1, 1], (mm, (nn + 2) // 3))
    assert_all_same(lambda: fpsim.matmul(a, b, c, model=m))
    assert_all_same(lambda: fpsim.matmul(np.full((mm, kk), m.input.max), np.full((kk, nn), m.input.max), model=m))


def test_inputs_outside_the_float32_loop_range() -> None:
    """bf16 values beyond 2**+-40 take the integer loop for the whole call (same bits); in range, AVX2."""
    m = get_model("h100", "bf16")
    rng = np.random.default_rng(5)
    a = rng.standard_normal((7, 50))
    b = rng.standard_normal((50, 33))
    assert_all_same(lambda: fpsim.matmul(a, b, model=m))
    for scale in (2.0**60, 2.0**-60, 2.0**41, 2.0**-41):
        a2 = a.copy()
        a2[3, 7] *= scale
        assert_all_same(lambda: fpsim.matmul(a2, b, model=m))


def test_batches_and_promotion() -> None:
    m = get_model("h100", "fp16")
    rng = np.random.default_rng(11)
    a = rng.standard_normal((3, 5, 70))
    b = rng.standard_normal((3, 70, 24))
    assert_all_same(lambda: fpsim.matmul(a, b, model=m))
    a2, b2 = a[0], b[0]
    assert_all_same(lambda: fpsim.matmul(a2, b2, model=m, promote_every=32))


def test_large_tile_grid_threads() -> None:
    """Several row and column tiles split over threads (the bits never depend on the thread count)."""
    m = get_model("h100", "fp16")
    rng = np.random.default_rng(12)
    a = rng.standard_normal((67, 96))
    b = rng.standard_normal((96, 300))
    c = rng.standard_normal((67, 300))
    assert_all_same(lambda: fpsim.matmul(a, b, c, model=m))


def test_impl_switch() -> None:
    old = C.impl()
    assert old in ("auto", "scalar", "avx2", "avx512")
    try:
        assert C.impl("scalar") == old
        assert C.impl() == "scalar"
        with pytest.raises(ValueError, match="'auto', 'scalar', 'avx2', 'avx512'"):
            C.impl("sse")
        with pytest.raises(TypeError):
            C.impl(3)
        assert C.impl() == "scalar"  # a refused name changes nothing
        for loop, has, cpu in (("avx2", HAS_AVX2, "AVX2"), ("avx512", HAS_AVX512, "AVX-512F")):
            if has:
                assert C.impl(loop) == "scalar"
                assert C.impl("scalar") == loop
            else:
                with pytest.raises(ValueError, match=cpu):
                    C.impl(loop)
                assert C.impl() == "scalar"
    finally:
        C.impl(old)
    assert C.impl() == old


# The fused AVX2 block (issue 30, second pass): passes 0-3 per group of 8, 16 or 32 lanes in registers, the
# chain value rounded in place, non-finite addends recorded only for the groups that hold one, the general
# rounding redone per 4-lane chunk from register values, and one cached work buffer reused across calls.
FUSED_SPECS = ["h100:fp16", "h100:fp16:fp16", "h100:fp8_e4m3", "h100:fp8_e4m3:fp16", "a100:bf16",
               "ada:fp8_e5m2:fp16", "v100:fp16:fp16", "h100:tf32"]


@pytest.mark.parametrize("spec", FUSED_SPECS)
def test_fused_groups_tails_and_odd_rows(spec: str) -> None:
    """Every group shape (1, 2 and 4 vectors, and their sums), lane tails, odd M, K tails, RZ and RNE presets."""
    m = fpsim.mma.as_model(spec)
    rng = np.random.default_rng(3031)
    ki = m.instruction_k
    for mm, kk, nn in ((1, ki, 8), (3, 2 * ki + 1, 16), (5, ki - 1, 24), (7, 3 * ki + 5, 56), (9, 2 * ki, 120),
                       (3, ki + 7, 131), (2, 5 * ki + 3, 136)):
        a = _values(rng, (mm, kk), m.input, 6)
        b = _values(rng, (kk, nn), m.input, 6)
        c = rng.standard_normal((mm, nn)) * np.exp2(rng.integers(-8, 9, (mm, nn)))
        assert_all_same(lambda: fpsim.matmul(a, b, c, model=m))


@pytest.mark.parametrize("spec", FUSED_SPECS)
def test_fused_special_addends_in_some_groups(spec: str) -> None:
    """NaN/inf addends in one lane of one group (the other groups of the row finite), in place over K blocks;
    a row of infinities of both signs, and an inf product meeting an inf addend of the other sign."""
    m = fpsim.mma.as_model(spec)
    rng = np.random.default_rng(3032)
    ki = m.instruction_k
    mm, kk, nn = 5, 3 * ki + 2, 100  # 96 lanes in groups (4, 4, 4 vectors) and a 4-lane tail
    a = _values(rng, (mm, kk), m.input, 4)
    b = _values(rng, (kk, nn), m.input, 4)
    c = rng.standard_normal((mm, nn))
    c[0, 3] = np.nan
    c[1, 40] = np.inf
    c[2, 95] = -np.inf
    c[3, 97] = np.nan
    c[4, ::7] = np.inf * rng.choice([-1, 1], c[4, ::7].shape)
    assert_all_same(lambda: fpsim.matmul(a, b, c, model=m))
    a2 = a.copy()
    a2[1, 0] = np.inf
    b2 = b.copy()
    b2[0, 40] = 1.0
    c2 = c.copy()
    c2[1, 40] = -np.inf  # inf product + -inf addend: NaN
    assert_all_same(lambda: fpsim.matmul(a2, b2, c2, model=m))


@pytest.mark.parametrize("spec", FUSED_SPECS)
def test_fused_general_rounding_in_some_chunks(spec: str) -> None:
    """Subnormal and overflowing results in single 4-lane chunks among normal ones (the chunk is redone the
    general way from register values while the chain is rounded in place), with and without an addend."""
    m = fpsim.mma.as_model(spec)
    out = m.output
    rng = np.random.default_rng(3033)
    ki = m.instruction_k
    mm, kk, nn = 4, 2 * ki + 3, 72
    a = _values(rng, (mm, kk), m.input, 2)
    b = _values(rng, (kk, nn), m.input, 2)
    c = rng.standard_normal((mm, nn))
    sub = rng.integers(1, 2**out.mbits, 6) * 2.0 ** (out.emin - out.mbits)
    b[:, 5] = 0.0
    c[0, 5] = sub[0]  # a subnormal result in the first chunk
    b[:, 33] = 0.0
    c[1, 33] = -sub[1]
    c[2, 70] = out.max  # overflow candidates
    c[3, 12] = -out.max
    assert_all_same(lambda: fpsim.matmul(a, b, c, model=m))
    big = np.full((mm, kk), m.input.max)
    big[:, 1::2] = 1.0
    assert_all_same(lambda: fpsim.matmul(big, np.abs(b) + 1.0, model=m))
    s = 2.0 ** ((out.emin - 4) // 2)
    assert_all_same(lambda: fpsim.matmul(a * s, b * s, c * 2.0**out.emin, model=m))


def test_work_buffer_reused_across_sizes_and_threads() -> None:
    """The cached work buffer: calls of growing and shrinking sizes, and two Python threads calling at once
    (one of them gets a buffer of its own), all give the NumPy reference's bits."""
    import threading

    m = get_model("h100", "fp16")
    rng = np.random.default_rng(3034)
    cases = []
    for mm, kk, nn in ((40, 64, 48), (8, 16, 8), (70, 200, 130), (3, 17, 24), (40, 64, 48)):
        cases.append((rng.standard_normal((mm, kk)), rng.standard_normal((kk, nn)), rng.standard_normal((mm, nn))))
    old = G.use_c_gemm
    try:
        G.use_c_gemm = False
        refs = [_bits(fpsim.matmul(a, b, c, model=m)) for a, b, c in cases]
    finally:
        G.use_c_gemm = old
    for (a, b, c), ref in zip(cases, refs):
        assert np.array_equal(_bits(fpsim.matmul(a, b, c, model=m)), ref)
    got: dict[int, list[np.ndarray]] = {0: [], 1: []}

    def run(t: int) -> None:
        for _ in range(3):
            for a, b, c in cases:
                got[t].append(_bits(fpsim.matmul(a, b, c, model=m)))

    ths = [threading.Thread(target=run, args=(t,)) for t in (0, 1)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    for t in (0, 1):
        assert len(got[t]) == 3 * len(cases)
        for n, g in enumerate(got[t]):
            assert np.array_equal(g, refs[n % len(cases)]), f"thread {t}, call {n}"


@pytest.mark.parametrize("spec", ["h100:fp16", "h100:fp8_e4m3:fp16", "a100:bf16", "v100:fp16:fp16"])
def test_float32_operands_widened_in_the_kernel(spec: str) -> None:
    """float32 operands (the training runtime's values) go to the kernel as they are and are widened there:
    the same bits as float64 operands and as the NumPy reference, on every loop and thread count, each operand
    float32 or float64, with a batch, a K tail and NaN/inf (inf only where the format has one: these are values
    of the format, which _matmul_values takes as they are)."""
    m = fpsim.mma.as_model(spec)
    rng = np.random.default_rng(3035)
    ki = m.instruction_k
    # values of the input format, as the runtime passes them (_matmul_values does not round its inputs)
    a = np.asarray(G.convert_inputs(_values(rng, (3, 6, 2 * ki + 3), m.input, 5), m.input, None, "A"))
    b = np.asarray(G.convert_inputs(_values(rng, (2 * ki + 3, 40), m.input, 5), m.b_format, None, "B"))
    a[0, 1, 2] = np.nan
    b[3, 7] = -np.inf if np.isinf(float(G.convert_inputs(np.array([np.inf]), m.b_format, None, "B")[0])) else np.nan
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    ref = fpsim.matmul(a, b, model=m)
    for x, y in ((a32, b32), (a32, b), (a, b32)):
        assert_all_same(lambda: G._matmul_values(x.astype(np.float32), y.astype(np.float32), None, m))
        got = G._matmul_values(np.asarray(x, dtype=np.float32), np.asarray(y, dtype=np.float32), None, m)
        assert np.array_equal(_bits(got), _bits(np.asarray(ref, dtype=np.float32)))
    kern = G._c_kernel(m)
    if kern is None or kern.order is not None:
        return
    kk = a.shape[-1]
    for x, y in ((a32, b32), (a32, b), (a, b32)):
        d = np.zeros((3, 6, 40))
        C.bfma_gemm(np.ascontiguousarray(x), np.ascontiguousarray(np.broadcast_to(y, (3, kk, 40))), d, 6, 40, kk,
                    0, kk, kern.params, 2, 4, 32, 0, 3)
        assert np.array_equal(_bits(d), _bits(ref))
    with pytest.raises(ValueError, match="float32"):
        C.bfma_gemm(a32[:, :, :-1].copy(), b, np.zeros((3, 6, 40)), 6, 40, kk, 0, kk, kern.params, 1, 4, 32, 0, 3)


@pytest.mark.parametrize("spec", ["h100:fp16", "a100:bf16", "h100:fp8_e5m2:fp16"])
def test_float32_operands_prepared_lean_every_tail_group(spec: str) -> None:
    """float32 operands are prepared for the AVX2 loop straight from their bits (no float64 copy): every shape
    of the last group of lanes (a partial vector alone, or with the full vector of its pair; past a 128-lane
    tile), NaN/inf in A and B, and values the AVX2 loop cannot take (beyond 2**+-40; bf16 subnormals, which
    are float32 subnormals), which send the whole call to the integer loop, in whole vectors and in the
    tails read with masked loads: the same bits as the reference."""
    m = fpsim.mma.as_model(spec)
    rng = np.random.default_rng(3037)
    ki = m.instruction_k
    has_inf = bool(np.isinf(float(G.convert_inputs(np.array([np.inf]), m.b_format, None, "B")[0])))
    for nn in (1, 5, 13, 20, 27, 64 + 3, 128 + 13, 128 + 24):
        kk = 2 * ki + 3
        a = np.asarray(G.convert_inputs(_values(rng, (2, 5, kk), m.input, 5), m.input, None, "A"), np.float32)
        b = np.asarray(G.convert_inputs(_values(rng, (kk, nn), m.input, 5), m.b_format, None, "B"), np.float32)
        variants = [(a, b)]
        a2, b2 = a.copy(), b.copy()
        a2[1, 2, ki + 1] = np.nan
        b2[kk - 1, nn - 1] = np.inf if has_inf else np.nan
        variants.append((a2, b2))
        for v in (2.0**41, 2.0**-41, m.input.min_subnormal):
            # in a whole vector, and in the masked tails (A's last block, B's last row and partial pair)
            for ia, ib in (((0, 0, 1), (1, 0)), ((1, 4, kk - 1), (kk - 1, nn - 1))):
                a3 = a.copy()
                a3[ia] = np.float32(G.convert_inputs(np.array([v]), m.input, None, "A")[0])
                variants.append((a3, b))
                b3 = b.copy()
                b3[ib] = np.float32(G.convert_inputs(np.array([v]), m.b_format, None, "B")[0])
                variants.append((a, b3))
        for x, y in variants:
            ref = np.asarray(fpsim.matmul(x.astype(np.float64), y.astype(np.float64), model=m), np.float32)
            assert_all_same(lambda: G._matmul_values(x, y, None, m))
            got = G._matmul_values(x, y, None, m)
            assert np.array_equal(_bits(got), _bits(ref)), (spec, nn)


@pytest.mark.parametrize("spec", ["h100:bf16", "a100:bf16", "a100:tf32", "h100:tf32", "h100:fp16"])
def test_operands_scaled_into_the_float32_loop(spec: str) -> None:
    """Operands far from 1 (bf16 gradients of 2**-60, large activations) run the float32 loop scaled by a power
    of two per operand; products below 2**-126 then meet zero, tiny and normal addends (the zero addend's
    exponent must not floor E_max at -126); an operand spanning more than 111 binades takes the integer loop.
    All the same bits as the NumPy reference."""
    m = fpsim.mma.as_model(spec)
    rng = np.random.default_rng(3041)
    ki = m.instruction_k
    mm, kk, nn = 5, 3 * ki + 2, 27
    lo_fmt = m.input.emin - m.input.mbits
    for ra, rb in (((-70, -60), (-70, -60)), ((-66, -62), (-68, -64)), ((40, 60), (50, 62)), ((-100, 5), (-3, 3)),
                   ((-100, 20), (0, 1)), ((-14, 15), (-24, -10))):
        ra = (max(ra[0], lo_fmt), max(ra[1], lo_fmt + 1))
        rb = (max(rb[0], lo_fmt), max(rb[1], lo_fmt + 1))
        a = rng.choice([-1, 1], (mm, kk)) * (1 + rng.random((mm, kk))) * np.exp2(rng.integers(*ra, (mm, kk)))
        b = rng.choice([-1, 1], (kk, nn)) * (1 + rng.random((kk, nn))) * np.exp2(rng.integers(*rb, (kk, nn)))
        a = np.asarray(G.convert_inputs(np.minimum(np.abs(a), m.input.max) * np.sign(a), m.input, None, "A"))
        b = np.asarray(G.convert_inputs(np.minimum(np.abs(b), m.input.max) * np.sign(b), m.b_format, None, "B"))
        for c in (None, np.zeros((mm, nn)), rng.standard_normal((mm, nn)) * 2.0**-130,
                  rng.standard_normal((mm, nn))):
            if c is not None:
                c = np.asarray(fpsim.round(c, m.output))
            assert_all_same(lambda: fpsim.matmul(a, b, c, model=m))
            assert_all_same(lambda: G._matmul_values(a.astype(np.float32), b.astype(np.float32),
                                                     None if c is None else c.astype(np.float32), m))




@pytest.mark.parametrize("spec", FUSED_SPECS)
def test_fused_chunk_checks_skipped_only_where_safe(spec: str) -> None:
    """The AVX2 loop skips the per-chunk subnormal/overflow checks where every lane's E_max lies well inside
    the output range. Products of full-mantissa inputs (random signs, so the sums have bits to round) at
    every exponent sum the input format reaches, rows by A's exponent and lanes by B's: the blocks' E_max
    sweep across both edges of that window wherever the format reaches them (subnormal and overflowing
    results beside normal ones), with no addend, an addend of the same size, and a tiny one."""
    m = fpsim.mma.as_model(spec)
    fin = m.input
    rng = np.random.default_rng(3052)
    ki = m.instruction_k
    ta = np.unique(np.array([fin.emin, fin.emin // 2, -3, 0, 3, fin.emax // 2, fin.emax]))
    tb = np.arange(fin.emin, fin.emax + 1)

    def full(shape: tuple[int, ...], e: np.ndarray) -> np.ndarray:
        x = (1.0 + rng.random(shape)) * np.exp2(e.astype(float)) * rng.choice([-1.0, 1.0], shape)
        return np.asarray(G.convert_inputs(x, fin, None, "A"), dtype=np.float64)

    a = full((len(ta), 2 * ki), np.repeat(ta[:, None], 2 * ki, axis=1))
    b = full((2 * ki, len(tb)), np.repeat(tb[None, :], 2 * ki, axis=0))
    with np.errstate(over="ignore", invalid="ignore"):
        same = np.asarray(fpsim.round(np.exp2((ta[:, None] + tb[None, :]).astype(float)) * 3.7, m.output))
        for c in (None, same, same * 2.0**-30):
            assert_all_same(lambda: fpsim.matmul(a, b, c, model=m))
