"""fpsim.random.Philox (issue 30): Random123's known answers, the compiled stream against the NumPy reference,
the same bits on any number of threads and chunking, and an unbiased stochastic rounding."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import fpsim
import fpsim.rounding as R
from fpsim.random import Philox, philox_words
from fpsim.random import _rounds as philox_rounds

from _loops import compiled_loops

# Random123's kat_vectors (philox4x32 10): counter (4 words), key (2 words) -> the four output words.
KAT = [
    ((0x00000000, 0x00000000, 0x00000000, 0x00000000), (0x00000000, 0x00000000),
     (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF),
     (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.fixture
def kernel_switches():
    saved = (R.use_c_kernel, R.max_threads)
    impl = R._ckernel.philox_impl() if R._ckernel is not None else None
    yield
    R.use_c_kernel, R.max_threads = saved
    if impl is not None:
        R._ckernel.philox_impl("auto")


def _loops() -> list[str]:
    """The compiled Philox loops this machine runs (the AVX2 one where the CPU has it)."""
    return [] if R._ckernel is None else compiled_loops(R._ckernel.philox_impl)


@pytest.mark.parametrize("ctr,key,want", KAT)
def test_known_answers(ctr, key, want) -> None:
    got = philox_rounds(np.array([ctr], dtype=np.uint64), key[0] | (key[1] << 32))
    assert tuple(int(w) for w in got[0]) == want


def test_stream_words_are_the_counter_blocks() -> None:
    assert tuple(int(w) for w in philox_words(0, 0, 4)) == KAT[0][2]
    key = 0x0123456789ABCDEF
    for start, n in [(0, 9), (3, 17), (4 * (2**32 - 1) - 2, 12)]:  # across the counter's 32-bit carry
        w = philox_words(key, start, n)
        blocks = np.arange(start // 4, (start + n + 3) // 4, dtype=np.uint64)
        c = np.zeros((blocks.size, 4), dtype=np.uint64)
        c[:, 0], c[:, 1] = blocks & np.uint64(0xFFFFFFFF), blocks >> np.uint64(32)
        ref = philox_rounds(c, key).reshape(-1)[start % 4 : start % 4 + n]
        assert np.array_equal(w, ref)


@pytest.mark.skipif(R._ckernel is None, reason="the compiled kernel is not built")
@pytest.mark.parametrize("dtype,fmt,sr_bits", [(np.float32, "bf16", None), (np.float32, "fp8_e4m3", None),
                                               (np.float64, "fp16", None), (np.float64, "fp8_e5m2", None),
                                               (np.float32, "fp4_e2m1", None), (np.float32, "fp8_e4m3", 12),
                                               (np.float32, "fp16", 16), (np.float32, "bf16", 20)])
def test_compiled_stream_is_the_reference(kernel_switches, dtype, fmt, sr_bits) -> None:
    """C kernel (each loop; 1 to 8 threads) == NumPy kernel drawing philox_words, bit for bit; whole and
    half words per element (bf16 and sr_bits <= 16 from float32 take half a word)."""
    rng = np.random.default_rng(11)
    n = (1 << 21) + 37  # past the threading threshold, an odd tail
    x = (rng.standard_normal(n) * rng.choice([1e-6, 1.0, 300.0], n)).astype(dtype)
    key = int(rng.integers(0, 2**63))
    R.use_c_kernel = False
    p_ref = Philox(key, position=8)
    ref = fpsim.round(x, fmt, rounding="sr", rng=p_ref, sr_bits=sr_bits)
    R.use_c_kernel = True
    for loop in _loops():
        R._ckernel.philox_impl(loop)
        for threads in (1, 2, 3, 8):
            R.max_threads = threads
            p = Philox(key, position=8)
            got = fpsim.round(x, fmt, rounding="sr", rng=p, sr_bits=sr_bits)
            assert np.array_equal(got.view(np.uint8), ref.view(np.uint8)), (loop, threads)
            assert p.position == p_ref.position


@pytest.mark.parametrize("use_c", [True, False])
def test_half_words_are_the_documented_halves(kernel_switches, use_c) -> None:
    """bf16 SR from float32 reads 16 random bits per element: element 2j takes the low half of stream word j,
    element 2j + 1 the high half, and rounds up iff its 16 dropped bits plus that half carry (built here from
    philox_words, whose blocks the Random123 vectors check, not from the kernel)."""
    if use_c and R._ckernel is None:
        pytest.skip("the compiled kernel is not built")
    R.use_c_kernel = use_c
    rng = np.random.default_rng(5)
    n = 5001
    x = rng.uniform(1, 2, n).astype(np.float32)
    w = philox_words(77, 40, (n + 1) // 2)
    halves = np.stack([w & 0xFFFF, w >> 16], axis=1).reshape(-1)[:n].astype(np.uint64)
    low = (x.view(np.uint32) & 0xFFFF).astype(np.uint64)
    up = (low + halves) >= 1 << 16
    want = ((x.view(np.uint32) & np.uint32(0xFFFF0000)) + (up.astype(np.uint32) << np.uint32(16))).view(np.float32)
    p = Philox(77, position=40)
    got = fpsim.round(x, "bf16", rounding="sr", rng=p)
    assert np.array_equal(got, want)
    assert p.position == 40 + 2504  # 2501 words, then the next block


@pytest.mark.skipif(R._ckernel is None, reason="the compiled kernel is not built")
def test_loops_across_the_counter_carry(kernel_switches) -> None:
    """Word positions whose block index crosses 2**32 (the counter's second word) and odd starts."""
    x = np.full(4099, 1 + 2**-9, dtype=np.float32)
    for start in (4 * (2**32 - 3), 4 * (2**32 - 3) + 4 * 37, 12):
        R.use_c_kernel = False
        ref = fpsim.round(x, "bf16", rounding="sr", rng=Philox(99, position=start))
        R.use_c_kernel = True
        for loop in _loops():
            R._ckernel.philox_impl(loop)
            got = fpsim.round(x, "bf16", rounding="sr", rng=Philox(99, position=start))
            assert np.array_equal(got, ref), (loop, start)


@pytest.mark.skipif(R._ckernel is None, reason="the compiled kernel is not built")
def test_philox_impl_refusals_switch_nothing(kernel_switches) -> None:
    """philox_impl lists its loops by name, refuses non-strings and extra arguments, and refuses a loop the CPU
    lacks with the reason; a refused call leaves the loop in use as it was."""
    before = R._ckernel.philox_impl()
    with pytest.raises(ValueError, match="sse is not one of 'auto', 'scalar'") as err:
        R._ckernel.philox_impl("sse")
    assert all(f"'{loop}'" in str(err.value) for loop in _loops())
    with pytest.raises(TypeError):
        R._ckernel.philox_impl(2)
    with pytest.raises(TypeError):
        R._ckernel.philox_impl("avx2", "scalar")
    for loop, cpu in (("avx2", "AVX2"), ("avx512", "AVX-512F")):
        if loop not in _loops():
            with pytest.raises(ValueError, match=cpu):
                R._ckernel.philox_impl(loop)
    assert R._ckernel.philox_impl() == before == _loops()[-1]  # auto: the widest loop this machine runs


@pytest.mark.skipif(R._ckernel is None, reason="the compiled kernel is not built")
def test_loops_at_every_group_edge(kernel_switches) -> None:
    """Every start word mod 160 and lengths around the loops' group sizes (8 blocks for AVX2, 8 and 32 for
    AVX-512: 32, 128 words): each loop's partial groups and tails give the reference's bits."""
    rng = np.random.default_rng(23)
    lengths = sorted({1, 31, 32, 33, 127, 128, 129, 159, 160, 161, 2047, 2048, 2049, 4096 + 96 + 5})
    for start in range(0, 160, 4):
        n = lengths[start // 4 % len(lengths)]
        x = rng.uniform(1, 2, n).astype(np.float32)  # 20 dropped bits of fp8: one word per element
        R.use_c_kernel = False
        ref = fpsim.round(x, "fp8_e4m3", rounding="sr", rng=Philox(31, position=start))
        R.use_c_kernel = True
        for loop in _loops():
            R._ckernel.philox_impl(loop)
            R.max_threads = 1
            got = fpsim.round(x, "fp8_e4m3", rounding="sr", rng=Philox(31, position=start))
            assert np.array_equal(got, ref), (loop, start, n)


def test_calls_take_consecutive_words(kernel_switches) -> None:
    x = np.full(10, 1 + 2**-9, dtype=np.float32)
    p = Philox(5)
    fpsim.round(x, "fp8_e4m3", rounding="sr", rng=p)
    assert p.position == 12  # 10 words, then the next block
    fpsim.round(x.astype(np.float64), "bf16", rounding="sr", rng=p)
    assert p.position == 32  # two words per float64 element
    fpsim.round(x, "bf16", rounding="sr", rng=p)
    assert p.position == 40  # half a word per element: 5 words, then the next block
    q = Philox.from_state(json.loads(json.dumps(Philox(5, position=12).state)))
    a = fpsim.round(x, "bf16", rounding="sr", rng=q)
    b = fpsim.round(x, "bf16", rounding="sr", rng=Philox(5, position=12))
    assert np.array_equal(a, b)


def test_seed_from_a_generator_and_inputs_kept() -> None:
    g1, g2 = np.random.default_rng(3), np.random.default_rng(3)
    x = np.linspace(-2, 2, 1001, dtype=np.float32)
    keep = x.copy()
    a = fpsim.round(x, "fp8_e4m3", rounding="sr", rng=Philox(g1))
    b = fpsim.round(x, "fp8_e4m3", rounding="sr", rng=Philox(g2))
    assert np.array_equal(a, b) and np.array_equal(x, keep)


@pytest.mark.parametrize("bad,err", [(-1, ValueError), (2**64, ValueError), (1.5, TypeError), (True, TypeError),
                                     ("7", TypeError)])
def test_bad_seeds_named(bad, err) -> None:
    with pytest.raises(err, match="seed"):
        Philox(bad)


def test_other_entry_points_refuse_philox_by_name() -> None:
    with pytest.raises(TypeError, match="fpsim.random.Philox"):
        fpsim.analyze(np.ones(4), "bf16", rounding="sr", rng=Philox(1))
    with pytest.raises(ValueError, match="state"):
        Philox.from_state({"key": 1})


@pytest.mark.slow
def test_rounding_probability_unbiased() -> None:
    """10^8 draws: the share rounded up lies within the binomial 99.99% interval of its exact probability."""
    p = Philox(2026)
    ups, n, chunk = 0, 0, 1 << 24
    frac = 0.3 + 2**-20  # of a bf16 ulp above 1: the exact probability of rounding up
    x = np.full(chunk, np.float32(1 + frac * 2**-7), dtype=np.float32)
    prob = float(np.float32(1 + frac * 2**-7) - 1) / 2**-7
    while n < 10**8:
        r = fpsim.round(x, "bf16", rounding="sr", rng=p)
        ups += int(np.count_nonzero(r > 1))
        n += chunk
    sd = math.sqrt(n * prob * (1 - prob))
    assert abs(ups - n * prob) < 3.9 * sd, (ups / n, prob)


def test_table_formats_take_philox_too() -> None:
    """HiF8 rounds through the table path: SR there takes the stream's 64-bit words (their top bits)."""
    x = np.full(20000, 1.1, dtype=np.float32)
    a = fpsim.round(x, "hif8", rounding="sr", rng=Philox(1))
    b = fpsim.round(x, "hif8", rounding="sr", rng=Philox(1))
    assert np.array_equal(a, b) and set(a.tolist()) == {1.0, 1.125}
    assert abs(float(a.mean()) - float(np.float32(1.1))) < 0.002  # unbiased: 1.1 on average
