"""NF4 (QLoRA) against bitsandbytes 0.50.2's CPU path, and against the published table and algorithm."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from fpsim.quant import NF4, NF4Tensor, dynamic_map, nf4_bits_per_parameter, nf4_dequantize, nf4_quantize
from fpsim.quant_nf4 import nf4_pack, nf4_unpack, torch_float32_sum

PUBLISHED = [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
             -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
             0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
             0.7229568362236023, 1.0]


def test_levels_as_published():
    assert NF4.dtype == np.float32 and NF4.tolist() == np.float32(PUBLISHED).tolist()
    assert not NF4.flags.writeable


def _reference(x, bs):
    """Independent re-implementation from the paper/bitsandbytes source: nearest level, ties down."""
    f = np.asarray(x, np.float32).reshape(-1)
    out, am = [], []
    for s in range(0, f.size, bs):
        b = f[s:s + bs]
        m = np.float32(max(np.abs(b).max(), np.float32(1e-38)))
        full = b.size == bs
        v = np.clip(b * (np.float32(1) / m) if full else b / m, -1, 1).astype(np.float32)
        d = np.abs(v[:, None].astype(np.float64) - np.float64(PUBLISHED)[None, :])
        mid = ((np.float32(PUBLISHED)[:-1] + np.float32(PUBLISHED)[1:]) / np.float32(2)).astype(np.float32)
        idx = d.argmin(axis=1)
        # a value exactly on a float32 midpoint goes to the lower level (torch.bucketize, right=False)
        on = np.nonzero(np.isin(v, mid))[0]
        for i in on:
            idx[i] = int(np.nonzero(mid == v[i])[0][0])
        out.append(idx)
        am.append(np.abs(b).max() if full else m)
    return np.concatenate(out).astype(np.uint8), np.float32(am)


@pytest.mark.parametrize("bs", [32, 64, 256])
def test_against_independent_reference(bs):
    rng = np.random.default_rng(bs)
    x = (rng.standard_normal(1000) * 3).astype(np.float32)
    x[:15] = ((np.float32(PUBLISHED)[:-1] + np.float32(PUBLISHED)[1:]) / np.float32(2)) * np.abs(x).max() / 1
    c, a = nf4_quantize(x, bs)
    rc, ra = _reference(x, bs)
    assert np.array_equal(c, rc) and np.array_equal(a, ra)


def test_pack_roundtrip_and_layout():
    c = np.uint8([1, 2, 15])
    assert nf4_pack(c).tolist() == [0x12, 0xF7]
    assert nf4_unpack(nf4_pack(c), 3).tolist() == [1, 2, 15]
    x = np.random.default_rng(0).standard_normal((5, 13)).astype(np.float32)
    c1, a1 = nf4_quantize(x, 32)
    c2, a2 = nf4_quantize(x, 32, packed=True)
    assert np.array_equal(nf4_pack(c1), c2)
    assert np.array_equal(nf4_dequantize(c1, a1, 32), nf4_dequantize(c2, a2, 32, shape=(5, 13)))


def test_bits_per_parameter_paper():
    assert nf4_bits_per_parameter(64 * 256 * 4096) == pytest.approx(4 + 8 / 64 + 32 / (64 * 256), abs=1e-6)
    assert round(nf4_bits_per_parameter(64 * 256 * 4096), 3) == 4.127
    assert nf4_bits_per_parameter(64 * 1000, double_quant=False) == 4.5
    t = NF4Tensor.quantize(np.ones((256, 256), np.float32))
    assert t.nbytes == 256 * 256 // 2 + 1024 + 4 * 4 + 4


def test_bad_input():
    with pytest.raises(ValueError, match="blocksize"):
        nf4_quantize(np.ones(4, np.float32), 48)
    with pytest.raises(TypeError):
        nf4_quantize(np.arange(4), 64)
    with pytest.raises(ValueError, match="absmax"):
        nf4_dequantize(np.zeros(100, np.uint8), np.ones(1, np.float32), 64)
    x = np.ones(70, np.float32)
    x0 = x.copy()
    nf4_quantize(x, 64, True)
    assert np.array_equal(x, x0)


def test_torch_sum_order():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    for n in list(range(1, 70)) + [255, 256, 1000, 4096, 5001, 30000]:
        a = (np.abs(rng.standard_normal(n)) * 3).astype(np.float32)
        assert torch_float32_sum(a) == np.float32(torch.from_numpy(a).sum().item()), n


def _bnb():
    pytest.importorskip("torch")
    logging.disable(logging.WARNING)
    try:
        F = pytest.importorskip("bitsandbytes.functional")
    finally:
        logging.disable(logging.NOTSET)
    return F


CASES = [(bs, n) for bs in (32, 64, 128, 256, 4096) for n in (1, 63, 64, 65, 1000, 4097, 64 * 256 + 3)]


@pytest.mark.slow  # the first call compiles bitsandbytes' dequantize with torch.compile (~10 s)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_bitsandbytes_single_level(dtype):
    """codes, absmax and dequantized values bit for bit, compress_statistics=False."""
    F = _bnb()
    import torch
    rng = np.random.default_rng(7)
    td = getattr(torch, dtype)
    fmt = {"float32": None, "bfloat16": "bf16", "float16": "fp16"}[dtype]
    for bs, n in CASES:
        x = torch.from_numpy((rng.standard_normal(n) * rng.uniform(0.01, 10)).astype(np.float32)).to(td)
        q, s = F.quantize_4bit(x, blocksize=bs, quant_type="nf4", compress_statistics=False)
        y = F.dequantize_4bit(q, s).float().numpy().reshape(-1)
        c, a = nf4_quantize(x, bs, packed=True)
        assert np.array_equal(c, q.numpy().reshape(-1)), (bs, n)
        assert np.array_equal(a.view(np.uint32), s.absmax.numpy().view(np.uint32)), (bs, n)
        out = nf4_dequantize(c, a, bs, shape=(n,), out_format=fmt)
        assert np.array_equal(out.view(np.uint32), y.view(np.uint32)), (bs, n)


def _dq_inputs(rng, full=True):
    """(blocksize, array) cases for double quantization: sizes around block and 256-constant edges,
    scales from 1e-3 to 1e3, absmax constants spread widely or bunched near their mean (values near 0,
    where the 8-bit map is densest), constant inputs (a zero second-level block) and a zero block."""
    out = []
    for bs in (32, 64, 128, 256, 4096) if full else (64, 256):
        for n in (1, 63, 64, 65, 1000, 4097, 64 * 256 + 3, 64 * 256 * 3) if full else (1, 65, 4097, 64 * 256 + 3):
            for scale in (1e-3, 1.0, 1e3):
                out.append((bs, (rng.standard_normal(n) * scale).astype(np.float32)))
    for bs, n in ((64, 100_000), (32, 50_000)) if full else ((32, 50_000),):
        out.append((bs, (rng.standard_normal(n) * rng.uniform(0.01, 10)).astype(np.float32)))
        x = rng.uniform(-1, 1, n).astype(np.float32)
        x[::bs] = np.float32(1) + rng.uniform(-1e-3, 1e-3, x[::bs].size).astype(np.float32)  # bunched absmax
        out.append((bs, x))
    out.append((64, np.ones(64 * 300, np.float32)))
    z = rng.standard_normal(64 * 300).astype(np.float32)
    z[: 64 * 5] = 0
    out.append((64, z))
    return out


def _check_double_quant(F, torch, dtype, cases):
    """Exact: packed codes, offset, second-level absmax, the nested 8-bit codes, the map, and the
    dequantized values (bits), per case. Returns (cases, nested constants) checked."""
    td = getattr(torch, dtype)
    fmt = {"float32": None, "bfloat16": "bf16", "float16": "fp16"}[dtype]
    total = 0
    for bs, x32 in cases:
        x = torch.from_numpy(x32).to(td)
        q, s = F.quantize_4bit(x, blocksize=bs, quant_type="nf4", compress_statistics=True)
        c, a = nf4_quantize(x, bs, True, packed=True)
        n = x32.size
        assert np.array_equal(c, q.numpy().reshape(-1)), (bs, n)
        assert a.offset.view(np.uint32) == np.float32(s.offset.item()).view(np.uint32), (bs, n)
        assert np.array_equal(a.absmax2.view(np.uint32), s.state2.absmax.numpy().view(np.uint32)), (bs, n)
        assert np.array_equal(a.code.view(np.uint32), s.state2.code.numpy().view(np.uint32))
        assert np.array_equal(a.codes, s.absmax.numpy()), (bs, n, int((a.codes != s.absmax.numpy()).sum()))
        y = F.dequantize_4bit(q, s).float().numpy().reshape(-1)
        out = nf4_dequantize(c, a, bs, shape=(n,), out_format=fmt)
        assert np.array_equal(out.view(np.uint32), y.view(np.uint32)), (bs, n)
        total += a.codes.size
    return len(cases), total


@pytest.mark.parametrize("full", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_bitsandbytes_double_quant(full):
    """compress_statistics=True, float32 input: every array bit for bit, the nested codes included
    (full=False: a 28-case subset; full=True: all 126 cases)."""
    F = _bnb()
    import torch
    from _versions import BITSANDBYTES_CPU_LUT_QUANTIZE_SEEN_ON, bitsandbytes_version
    if bitsandbytes_version() not in BITSANDBYTES_CPU_LUT_QUANTIZE_SEEN_ON:
        pytest.skip(f"nested-code rule observed on bitsandbytes {BITSANDBYTES_CPU_LUT_QUANTIZE_SEEN_ON} only")
    ncase, nconst = _check_double_quant(F, torch, "float32", _dq_inputs(np.random.default_rng(11), full))
    print(f"double quant float32: {ncase} cases, {nconst} nested constants, 0 mismatches")


@pytest.mark.slow  # bf16/fp16 dequantize goes through torch.compile on first use
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_bitsandbytes_double_quant_half(dtype):
    F = _bnb()
    import torch
    from _versions import BITSANDBYTES_CPU_LUT_QUANTIZE_SEEN_ON, bitsandbytes_version
    if bitsandbytes_version() not in BITSANDBYTES_CPU_LUT_QUANTIZE_SEEN_ON:
        pytest.skip(f"nested-code rule observed on bitsandbytes {BITSANDBYTES_CPU_LUT_QUANTIZE_SEEN_ON} only")
    cases = [(bs, x) for bs, x in _dq_inputs(np.random.default_rng(12)) if x.size <= 64 * 256 * 3]
    ncase, nconst = _check_double_quant(F, torch, dtype, cases)
    print(f"double quant {dtype}: {ncase} cases, {nconst} nested constants, 0 mismatches")


def _boundary_values():
    """float32 values in [-1, 1] at and 1..3 ulps either side of every LUT bin edge ((i - 0.5) / 65535 *
    2 - 1) and every exact midpoint of two dynamic-map entries."""
    m = dynamic_map().astype(np.float64)
    i = np.arange(65536, dtype=np.float64)
    pts = np.concatenate([(i - 0.5) / 65535 * 2 - 1, (m[:-1] + m[1:]) / 2]).astype(np.float32)
    vals = [pts]
    for d in (np.float32(2), np.float32(-2)):
        w = pts
        for _ in range(3):
            w = np.nextafter(w, d)
            vals.append(w)
    return np.clip(np.concatenate(vals), -1, 1).astype(np.float32)


def _in_unit_blocks(v):
    """Blocks of 256 whose first element is 1.0, so every block's absmax is 1 and the values are
    searched unscaled. -> (blocked array, mask of the original values)."""
    nb = -(-v.size // 255)
    b = np.concatenate([v, np.zeros(nb * 255 - v.size, np.float32)]).reshape(nb, 255)
    full = np.concatenate([np.ones((nb, 1), np.float32), b], axis=1).reshape(-1)
    mask = np.concatenate([np.zeros((nb, 1), bool), (np.arange(nb * 255) < v.size).reshape(nb, 255)],
                          axis=1).reshape(-1)
    return full, mask


def test_blockwise8_lut_rule_on_boundaries():
    """The 8-bit search alone (bitsandbytes.functional.quantize_blockwise, blocksize 256) on ~0.5M values
    at every LUT bin edge and map midpoint: fpsim's default rule gives bitsandbytes' codes exactly."""
    F = _bnb()
    import torch
    from _versions import BITSANDBYTES_CPU_LUT_QUANTIZE_SEEN_ON, bitsandbytes_version
    from fpsim.quant._nf4 import _quantize_blockwise8
    if bitsandbytes_version() not in BITSANDBYTES_CPU_LUT_QUANTIZE_SEEN_ON:
        pytest.skip(f"LUT rule observed on bitsandbytes {BITSANDBYTES_CPU_LUT_QUANTIZE_SEEN_ON} only")
    v, _ = _in_unit_blocks(_boundary_values())
    q, st = F.quantize_blockwise(torch.from_numpy(v), blocksize=256)
    mine, a2 = _quantize_blockwise8(v, 256)
    assert np.array_equal(a2, st.absmax.numpy())
    assert np.array_equal(mine, q.numpy()), int((mine != q.numpy()).sum())


def test_bitsandbytes_cpu_lut_is_not_nearest():
    """tests/_versions.py: bitsandbytes 0.50.2's CPU blockwise quantization returns the LUT bin's entry,
    not the nearest map entry. On the boundary values, and on three specific constants, the two rules
    differ, bitsandbytes siding with the LUT and its entry strictly farther from the value."""
    F = _bnb()
    import torch
    from _versions import BITSANDBYTES_CPU_LUT_QUANTIZE_SEEN_ON, bitsandbytes_version
    from fpsim.quant._nf4 import _quantize_blockwise8
    m64 = dynamic_map().astype(np.float64)
    # values just on the near side of a map midpoint (nearest: the first index; bitsandbytes: the second)
    specific = np.float32([-0.9859463572502136, -0.5499979853630066, 0.9296956658363342])
    expect_nearest, expect_bnb = [0, 32, 250], [1, 31, 249]
    v, mask = _in_unit_blocks(np.concatenate([specific, _boundary_values()]))
    near, _ = _quantize_blockwise8(v, 256, "nearest")
    # the nearest rule checked independently: argmin of the float64 distance (ties: first, lower index),
    # on every 16th value with |x| >= 2**-20 (there the float64 differences are exact)
    xs, ns = v[mask], near[mask]
    sel = np.concatenate([[0, 1, 2], np.nonzero(np.abs(xs) >= 2.0 ** -20)[0][3::16]])
    ref = np.abs(xs[sel].astype(np.float64)[:, None] - m64[None, :]).argmin(axis=1)
    assert np.array_equal(ns[sel], ref)
    q = F.quantize_blockwise(torch.from_numpy(v), blocksize=256)[0].numpy()
    lut, _ = _quantize_blockwise8(v, 256)
    x = v[mask].astype(np.float64)
    assert near[mask][:3].tolist() == expect_nearest
    if bitsandbytes_version() in BITSANDBYTES_CPU_LUT_QUANTIZE_SEEN_ON:
        assert q[mask][:3].tolist() == expect_bnb
        assert np.array_equal(q, lut)
        diff = q[mask] != near[mask]
        d_bnb, d_near = np.abs(x - m64[q[mask]]), np.abs(x - m64[near[mask]])
        exact = np.abs(x) >= 2.0 ** -20                  # float64 distances exact there
        farther = diff & exact & (d_bnb > d_near)
        assert np.all(d_bnb[diff & exact] >= d_near[diff & exact]) and farther[:3].all()
        print(f"bitsandbytes != nearest on {int(diff.sum())} of {int(mask.sum())} boundary values "
              f"({int(farther.sum())} strictly farther where |x| >= 2**-20, the rest ties or tiny); "
              f"largest index gap {int(np.abs(q[mask].astype(int) - near[mask]).max())}")
    else:
        print(f"bitsandbytes {bitsandbytes_version()}: {int((q[mask] != near[mask]).sum())} differ from nearest, "
              f"{int((q != lut).sum())} from the 0.50.2 LUT rule")


def test_absmax_search_option():
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(64 * 256 * 2) * 2).astype(np.float32)
    c1, a1 = nf4_quantize(x, 64, True)
    c2, a2 = nf4_quantize(x, 64, True, absmax_search="Nearest")
    assert np.array_equal(c1, c2) and a1.offset == a2.offset and np.array_equal(a1.absmax2, a2.absmax2)
    assert nf4_quantize(x, 64, True, absmax_search="bitsandbytes")[1].codes.tolist() == a1.codes.tolist()
    with pytest.raises(ValueError, match="nearest"):
        nf4_quantize(x, 64, True, absmax_search="binary")
    with pytest.raises(TypeError):
        nf4_quantize(x, 64, True, absmax_search=1)
    t = NF4Tensor.quantize(x.reshape(256, -1), absmax_search="nearest")
    assert np.array_equal(t.absmax.codes, a2.codes)


def test_dynamic_map_matches_bitsandbytes():
    F = _bnb()
    assert np.array_equal(dynamic_map().view(np.uint32), F.create_dynamic_map().numpy().view(np.uint32))
