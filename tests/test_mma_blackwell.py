"""Blackwell narrow-input and block-scaled MMA (fpsim.mma.blockscaled) against MMA-Sim, bit for bit.

Oracle: MMA-Sim 2.1.1 (``mmasim.nv_ptx``: ``TCGen05MMA``/``TCGen05MMABlockScale`` for B200 tcgen05.mma,
``MMA``/``MMABlockScale`` for sm_120 mma.sync), an independent simulator validated on hardware by its
authors. Every element type and scale kind, chained along K (C of each instruction = D of the previous),
on random codes over the whole finite range, extreme scales, zeros and (where the formats have them)
NaN and inf. Each comparison reports its case and mismatch counts; ``FPSIM_MMASIM_COUNTS=path`` appends
them as JSON lines (used for the docs' table).
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import fpsim
from fpsim.mma import blockscaled as bs
from fpsim.mma.blockscaled import block_scaled_model, matmul_block_scaled, model_for

torch = pytest.importorskip("torch")
sim = pytest.importorskip("mmasim.nv_ptx.sim")

ELEMS = bs.ELEMENT_FORMATS
PTX = {"fp8_e4m3": "e4m3", "fp8_e5m2": "e5m2", "fp6_e2m3": "e2m3", "fp6_e3m2": "e3m2", "fp4_e2m1": "e2m1"}
FP = {n: fpsim.formats.as_format(n) for n in ELEMS}


# ------------------------------------------------------------------------------------------------------
# Random operands as codes (uint8) and values


def _codes(rng: np.random.Generator, fmt: str, shape: tuple[int, ...], specials: bool) -> np.ndarray:
    f = FP[fmt]
    codes = rng.integers(0, 1 << f.width, size=shape).astype(np.uint8)
    v = np.asarray(fpsim.from_bits(codes, f), dtype=np.float64)
    if not specials:
        bad = ~np.isfinite(v)
        while bad.any():
            codes[bad] = rng.integers(0, 1 << f.width, size=int(bad.sum())).astype(np.uint8)
            v = np.asarray(fpsim.from_bits(codes, f), dtype=np.float64)
            bad = ~np.isfinite(v)
    # Zeros: a fifth of the entries in some rows, to exercise e_zero.
    z = rng.random(shape) < 0.1
    codes[z] = 0
    return codes


def _vals(codes: np.ndarray, fmt: str) -> np.ndarray:
    return np.asarray(fpsim.from_bits(codes, FP[fmt]), dtype=np.float64)


def _torch_elem(codes: np.ndarray, fmt: str) -> torch.Tensor:
    """Operands as MMA-Sim takes them: fp8 as torch float8, fp6 in bits 5:0 and fp4 in bits 5:2 of a uint8."""
    t = torch.from_numpy(codes.copy())
    if fmt == "fp8_e4m3":
        return t.view(torch.float8_e4m3fn)
    if fmt == "fp8_e5m2":
        return t.view(torch.float8_e5m2)
    if fmt == "fp4_e2m1":
        return t << 2
    return t


def _torch_fp4_packed(codes: np.ndarray) -> torch.Tensor:
    """fp4 codes (..., K) packed two per byte along K, element 2i in the high nibble (MMA-Sim's mxf4 layout)."""
    c = codes.astype(np.uint8)
    return torch.from_numpy(((c[..., 0::2] << 4) | c[..., 1::2]).astype(np.uint8))


def _scale_codes(rng: np.random.Generator, sfmt: str, shape: tuple[int, ...], mode: str) -> np.ndarray:
    if sfmt == "ue8m0":
        if mode == "typical":
            c = rng.integers(127 - 12, 127 + 12, size=shape)
        elif mode == "extreme":
            c = rng.choice(np.array([0, 1, 2, 60, 127, 190, 252, 253, 254]), size=shape)
        else:  # full range with NaN
            c = rng.integers(0, 256, size=shape)
        return c.astype(np.uint8)
    if mode == "typical":
        c = rng.integers(0x30, 0x50, size=shape)  # about 2**-1 .. 2**3
    elif mode == "extreme":
        c = rng.choice(np.array([0x00, 0x01, 0x02, 0x07, 0x08, 0x38, 0x77, 0x7E]), size=shape)
    else:
        c = rng.integers(0, 0x80, size=shape)  # zero, subnormals, NaN (0x7F)
    return c.astype(np.uint8)


def _scale_vals(codes: np.ndarray, sfmt: str) -> np.ndarray:
    if sfmt == "ue8m0":
        return np.where(codes == 0xFF, np.nan, np.ldexp(1.0, codes.astype(np.int32) - 127))
    return np.asarray(fpsim.from_bits(codes, "fp8_e4m3"), dtype=np.float64)


def _torch_scale(codes: np.ndarray, sfmt: str) -> torch.Tensor:
    t = torch.from_numpy(codes.copy())
    return t.view(torch.float8_e8m0fnu) if sfmt == "ue8m0" else t.view(torch.float8_e4m3fn)


def _c_values(rng: np.random.Generator, shape: tuple[int, ...], out: str, specials: bool) -> np.ndarray:
    if out == "fp16":
        c = rng.integers(0, 1 << 16, size=shape).astype(np.uint16)
        v = c.view(np.float16).astype(np.float64)
    else:
        mant = rng.standard_normal(shape)
        ex = rng.integers(-30, 30, size=shape)
        v = np.ldexp(mant, ex).astype(np.float32).astype(np.float64)
        pick = rng.random(shape)
        v = np.where(pick < 0.15, 0.0, v)
        v = np.where((pick > 0.15) & (pick < 0.2), np.float64(np.float32(2.0**-140)) * np.sign(mant), v)
    if specials:
        pick = rng.random(shape)
        v = np.where(pick < 0.03, np.inf, np.where(pick < 0.06, -np.inf, np.where(pick < 0.09, np.nan, v)))
    elif out == "fp16":
        v = np.where(np.isfinite(v), v, 0.0)
    return v


def _same(x: np.ndarray, y: np.ndarray, out: str) -> np.ndarray:
    """Bitwise equality, every NaN equal to every NaN."""
    dt = np.float16 if out == "fp16" else np.float32
    ut = np.uint16 if out == "fp16" else np.uint32
    xa, ya = np.asarray(x, dtype=dt), np.asarray(y, dtype=dt)
    nan = np.isnan(xa) & np.isnan(ya)
    return nan | (xa.view(ut) == ya.view(ut))


def _record(label: str, n: int, bad: int) -> None:
    path = os.environ.get("FPSIM_MMASIM_COUNTS")
    if path:
        with open(path, "a") as fh:
            fh.write(json.dumps({"case": label, "n": n, "mismatches": bad}) + "\n")


def _report(label: str, ours: np.ndarray, ref: np.ndarray, out: str) -> None:
    ok = _same(ours, ref, out)
    n, bad = ok.size, int((~ok).sum())
    _record(label, n, bad)
    if bad:
        i = np.argwhere(~ok)[0]
        pytest.fail(f"{label}: {bad} of {n} outputs differ from MMA-Sim; first at {tuple(i)}: "
                    f"fpsim {float(np.asarray(ours)[tuple(i)])!r} vs MMA-Sim {float(np.asarray(ref)[tuple(i)])!r}")


# ------------------------------------------------------------------------------------------------------
# MMA-Sim references, chained along K


def _ref_unscaled(dev: str, a: str, b: str, out: str, ca: np.ndarray, cb: np.ndarray, c: np.ndarray) -> np.ndarray:
    d = "f32" if out == "fp32" else "f16"
    mm, nn = c.shape
    if dev == "b200":
        op = sim.TCGen05MMA("Blackwell", f"m{mm}n{nn}k32.kind::f8f6f4.{d}.{PTX[a]}.{PTX[b]}")
    else:
        op = sim.MMA("RTX Blackwell", f"m16n8k32.kind::f8f6f4.{d}.{PTX[a]}.{PTX[b]}.{d}")
    tdt = torch.float32 if out == "fp32" else torch.float16
    acc = torch.from_numpy(c).to(tdt)
    for k0 in range(0, ca.shape[1], 32):
        acc = op(_torch_elem(ca[:, k0:k0 + 32], a), _torch_elem(cb[k0:k0 + 32], b), acc)
    return acc.to(torch.float64).numpy()


def _ref_scaled(dev: str, kind: str, a: str, b: str, block: int, sfmt: str, ca: np.ndarray, cb: np.ndarray,
                sa: np.ndarray, sb: np.ndarray, c: np.ndarray) -> np.ndarray:
    mm, nn = c.shape
    kk = 64 if kind in ("mxf4", "mxf4nvf4") else 32
    if dev == "b200":
        op = sim.TCGen05MMABlockScale(
            "Blackwell", f"m{mm}n{nn}k{kk}.kind::{kind}.block{block}.f32.{PTX[a]}.{PTX[b]}.{sfmt}")
    else:
        op = sim.MMABlockScale("RTX Blackwell",
                               f"m16n8k{kk}.kind::{kind}.block{block}.f32.{PTX[a]}.{PTX[b]}.f32.{sfmt}")
    acc = torch.from_numpy(c).to(torch.float32)
    per = kk // block
    for t, k0 in enumerate(range(0, ca.shape[1], kk)):
        if kk == 64:
            ta, tb = _torch_fp4_packed(ca[:, k0:k0 + kk]), _torch_fp4_packed(cb[k0:k0 + kk].T).T
        else:
            ta, tb = _torch_elem(ca[:, k0:k0 + kk], a), _torch_elem(cb[k0:k0 + kk], b)
        acc = op(ta, tb, acc, _torch_scale(sa[:, t * per:(t + 1) * per], sfmt),
                 _torch_scale(sb[t * per:(t + 1) * per], sfmt))
    return acc.to(torch.float64).numpy()


def _shape(dev: str) -> tuple[int, int]:
    return (128, 8) if dev == "b200" else (16, 8)


# ------------------------------------------------------------------------------------------------------
# kind::f8f6f4 (no scales), fp32 and fp16 output, every A x B type pair


@pytest.mark.parametrize("dev", ["b200", "rtx5090"])
@pytest.mark.parametrize("out", ["fp32", "fp16"])
@pytest.mark.parametrize("a", ELEMS)
def test_f8f6f4_matches_mmasim(dev: str, out: str, a: str) -> None:
    rng = np.random.default_rng(abs(hash((dev, out, a))) % 2**32)
    mm, nn = _shape(dev)
    kk = 96  # three chained instructions
    for b in ELEMS:
        for specials in (False, True):
            ca = _codes(rng, a, (mm, kk), specials)
            cb = _codes(rng, b, (kk, nn), specials)
            c = _c_values(rng, (mm, nn), out, specials)
            ref = _ref_unscaled(dev, a, b, out, ca, cb, c)
            m = block_scaled_model(dev, "f8f6f4", a, b, out)
            ours = matmul_block_scaled(_vals(ca, a), _vals(cb, b), c, model=m)
            _report(f"{dev} f8f6f4 {PTX[a]}x{PTX[b]}->{out}{' specials' if specials else ''}", ours, ref, out)


# ------------------------------------------------------------------------------------------------------
# kind::mxf8f6f4: UE8M0 per 32, every A x B type pair, typical / extreme / NaN scales


@pytest.mark.parametrize("dev", ["b200", "rtx5090"])
@pytest.mark.parametrize("a", ELEMS)
def test_mxf8f6f4_matches_mmasim(dev: str, a: str) -> None:
    rng = np.random.default_rng(abs(hash((dev, "mx", a))) % 2**32)
    mm, nn = _shape(dev)
    kk = 96
    for b in ELEMS:
        for mode in ("typical", "extreme", "full"):
            specials = mode == "full"
            ca = _codes(rng, a, (mm, kk), specials)
            cb = _codes(rng, b, (kk, nn), specials)
            sa = _scale_codes(rng, "ue8m0", (mm, kk // 32), mode)
            sb = _scale_codes(rng, "ue8m0", (kk // 32, nn), mode)
            c = _c_values(rng, (mm, nn), "fp32", specials)
            ref = _ref_scaled(dev, "mxf8f6f4", a, b, 32, "ue8m0", ca, cb, sa, sb, c)
            m = block_scaled_model(dev, "mxf8f6f4", a, b)
            ours = matmul_block_scaled(_vals(ca, a), _vals(cb, b), c, scale_a=_scale_vals(sa, "ue8m0"),
                                       scale_b=_scale_vals(sb, "ue8m0"), model=m)
            _report(f"{dev} mxf8f6f4 {PTX[a]}x{PTX[b]} ue8m0 {mode}", ours, ref, "fp32")


# ------------------------------------------------------------------------------------------------------
# kind::mxf4 and kind::mxf4nvf4 (fp4 x fp4, 64 per instruction, groups of 16)

FP4_KINDS = [("mxf4", 32, "ue8m0"), ("mxf4nvf4", 32, "ue8m0"), ("mxf4nvf4", 16, "ue8m0"), ("mxf4nvf4", 16, "ue4m3")]


@pytest.mark.parametrize("dev", ["b200", "rtx5090"])
@pytest.mark.parametrize("kind,block,sfmt", FP4_KINDS, ids=[f"{k}-{b}-{s}" for k, b, s in FP4_KINDS])
@pytest.mark.parametrize("mode", ["typical", "extreme", "full"])
def test_mxf4_matches_mmasim(dev: str, kind: str, block: int, sfmt: str, mode: str) -> None:
    rng = np.random.default_rng(abs(hash((dev, kind, block, sfmt, mode))) % 2**32)
    mm, nn = _shape(dev)
    kk = 192  # three instructions
    f = "fp4_e2m1"
    for rep in range(2):
        ca = _codes(rng, f, (mm, kk), False)
        cb = _codes(rng, f, (kk, nn), False)
        if rep:  # whole groups of zero products (e_zero) and cancelling groups
            ca[: mm // 2, :16] = 0
            cb[16:32, : nn // 2] = 0
        sa = _scale_codes(rng, sfmt, (mm, kk // block), mode)
        sb = _scale_codes(rng, sfmt, (kk // block, nn), mode)
        c = _c_values(rng, (mm, nn), "fp32", mode == "full")
        ref = _ref_scaled(dev, kind, f, f, block, sfmt, ca, cb, sa, sb, c)
        m = block_scaled_model(dev, kind, f, block=block, scale=sfmt)
        ours = matmul_block_scaled(_vals(ca, f), _vals(cb, f), c, scale_a=_scale_vals(sa, sfmt),
                                   scale_b=_scale_vals(sb, sfmt), model=m)
        _report(f"{dev} {kind} block{block} {sfmt} {mode}", ours, ref, "fp32")
        # uint8 scale codes are accepted as they are and give the same result
        ours2 = matmul_block_scaled(_vals(ca, f), _vals(cb, f), c, scale_a=sa, scale_b=sb, model=m)
        assert np.array_equal(np.asarray(ours2), np.asarray(ours), equal_nan=True)


def test_cancelling_group_keeps_its_scale_exponent() -> None:
    """A group whose products cancel to 0 still sets E_max from its scales (MMA-Sim's rule), unlike an all-zero
    group (e_zero): a small C is truncated away in the first case only."""
    f = "fp4_e2m1"
    m = block_scaled_model("b200", "mxf4nvf4", f, block=16, scale="ue8m0")
    a = np.zeros((1, 64))
    b = np.zeros((64, 1))
    a[0, :2], b[:2, 0] = [6.0, 6.0], [1.0, -1.0]  # group 0: 6 - 6 = 0
    sa = np.ones((1, 4))
    sb = np.ones((4, 1))
    sa[0, 0] = 2.0**100
    c = np.array([[1.0]])
    d = matmul_block_scaled(a, b, c, scale_a=sa, scale_b=sb, model=m)
    assert float(d[0, 0]) == 0.0  # 1 is far below 2**(100 - 35)
    a[0, :2] = 0.0
    assert float(matmul_block_scaled(a, b, c, scale_a=sa, scale_b=sb, model=m)[0, 0]) == 1.0


# ------------------------------------------------------------------------------------------------------
# fpsim.scaling -> block-scaled GEMM, end to end


def _ref_from_scaled(qa: object, qb: object, m: bs.BlockScaledModel, c: np.ndarray) -> np.ndarray:
    """MMA-Sim on the codes of two ScaledTensors (block scales inside the MMA)."""
    a_codes = np.asarray(fpsim.to_bits(qa.data, qa.format)).astype(np.uint8)
    b_codes = np.asarray(fpsim.to_bits(qb.data, qb.format)).astype(np.uint8)
    if m.scale == "ue8m0":
        sa = (np.frexp(qa.scale.astype(np.float64))[1] - 1 + 127).astype(np.uint8)
        sb = (np.frexp(qb.scale.astype(np.float64))[1] - 1 + 127).astype(np.uint8)
    else:
        sa = np.asarray(fpsim.to_bits(qa.scale, "fp8_e4m3")).astype(np.uint8)
        sb = np.asarray(fpsim.to_bits(qb.scale, "fp8_e4m3")).astype(np.uint8)
    return _ref_scaled("b200", m.kind, qa.format.name, qb.format.name, m.block, m.scale, a_codes, b_codes, sa, sb, c)


@pytest.mark.parametrize("fa,fb", [("fp8_e4m3", "fp8_e4m3"), ("fp8_e5m2", "fp8_e4m3"), ("fp6_e2m3", "fp6_e3m2"),
                                   ("fp4_e2m1", "fp8_e4m3"), ("fp4_e2m1", "fp4_e2m1")])
def test_mx_quantized_tensors_go_straight_in(fa: str, fb: str) -> None:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((128, 64)) * np.exp(rng.uniform(-4, 4, (128, 1)))
    w = rng.standard_normal((64, 8)) * np.exp(rng.uniform(-4, 4, (1, 8)))
    qa = fpsim.scaling.quantize_scaled(x, fa, scaling="mx")
    qb = fpsim.scaling.quantize_scaled(w, fb, scaling="mx", axis=0)
    m = model_for(qa, qb)
    assert m.kind == ("mxf4" if fa == fb == "fp4_e2m1" else "mxf8f6f4")
    c = _c_values(rng, (128, 8), "fp32", False)
    ours = fpsim.matmul(qa, qb, c, model=m)  # fpsim.matmul dispatches to the block-scaled GEMM
    ours2 = fpsim.scaling.matmul_block_scaled(qa, qb, c)  # model picked from the tensors
    ref = _ref_from_scaled(qa, qb, m, c)
    _report(f"scaling.mx {fa}x{fb} -> {m.kind}", ours, ref, "fp32")
    assert np.array_equal(ours, ours2)


def test_nvfp4_quantized_tensors_go_straight_in() -> None:
    rng = np.random.default_rng(11)
    x = rng.standard_normal((128, 128)).astype(np.float32)
    w = rng.standard_normal((128, 8)).astype(np.float32)
    qa = fpsim.scaling.quantize_scaled(x, "fp4_e2m1", scaling="nvfp4")
    qb = fpsim.scaling.quantize_scaled(w, "fp4_e2m1", scaling="nvfp4", axis=0)
    m = model_for(qa, qb)
    assert (m.kind, m.block, m.scale) == ("mxf4nvf4", 16, "ue4m3")
    c = _c_values(rng, (128, 8), "fp32", False)
    ours = fpsim.matmul(qa, qb, c, model=m)
    assert ours.dtype == np.float32
    # Reference: MMA-Sim's chain from 0 with the block scales, then alpha = g_a * g_b and C in fp32 (cuBLAS).
    acc = _ref_from_scaled(qa, qb, m, np.zeros((128, 8)))
    g = np.float32(qa.global_scale * qb.global_scale)
    gmpy2 = pytest.importorskip("gmpy2")
    ctx = gmpy2.context(precision=24, emin=-148, emax=128, subnormalize=True)  # binary32, one rounding
    with ctx:
        ref = np.array([float(gmpy2.fma(float(g), float(p), float(q))) for p, q in zip(acc.ravel(), c.ravel())])
    ref = ref.reshape(acc.shape)
    _report("scaling.nvfp4 -> mxf4nvf4 (+ global scales)", ours, ref, "fp32")
    # and it approximates the unquantized product
    exact = x.astype(np.float64) @ w.astype(np.float64) + c
    assert np.median(np.abs(ours - exact) / (np.abs(x) @ np.abs(w))) < 0.05


# ------------------------------------------------------------------------------------------------------
# API: validation, names, dispatch


def test_model_names_and_validation() -> None:
    m = block_scaled_model(" B200 ", "MXF4NVF4")
    assert m.kind == "mxf4nvf4" and m.path == "tcgen05" and m.provenance == "agrees with MMA-Sim"
    assert "tcgen05.mma" in m.instruction and "block16" in m.instruction
    assert block_scaled_model("sm120", "mxf4", "fp4_e2m1").instruction.startswith("mma.sync.aligned.m16n8k64")
    with pytest.raises(ValueError, match="valid: f8f6f4, mxf8f6f4, mxf4, mxf4nvf4"):
        block_scaled_model("b200", "mxf16")
    with pytest.raises(ValueError, match="valid: b200, rtx5090"):
        block_scaled_model("h100", "mxf4")
    with pytest.raises(ValueError, match="valid: fp4_e2m1"):
        block_scaled_model("b200", "mxf4", "fp8_e4m3")
    with pytest.raises(ValueError, match="block=32"):
        block_scaled_model("b200", "mxf8f6f4", block=16)
    with pytest.raises(ValueError, match=r"\(16, 'ue4m3'\)"):
        block_scaled_model("b200", "mxf4nvf4", block=32, scale="ue4m3")
    with pytest.raises(ValueError, match="valid: fp32$"):
        block_scaled_model("b200", "mxf8f6f4", output="fp16")
    with pytest.raises(TypeError):
        block_scaled_model("b200", "mxf8f6f4", block=32.0)  # type: ignore[arg-type]


def test_scale_validation_and_inputs_untouched() -> None:
    m = block_scaled_model("b200", "mxf8f6f4", "fp8_e4m3")
    A = np.ones((2, 32))
    B = np.ones((32, 2))
    A0 = A.copy()
    with pytest.raises(ValueError, match="not a UE8M0 value"):
        matmul_block_scaled(A, B, scale_a=np.full((2, 1), 3.0), scale_b=np.ones((1, 2)), model=m)
    with pytest.raises(ValueError, match=r"expected \(M, K/32\)"):
        matmul_block_scaled(A, B, scale_a=np.ones((2, 2)), scale_b=np.ones((1, 2)), model=m)
    with pytest.raises(ValueError, match="needs scale_a"):
        matmul_block_scaled(A, B, model=m)
    with pytest.raises(ValueError, match="multiple of the scale block"):
        matmul_block_scaled(A[:, :16], B[:16], scale_a=1.0, scale_b=1.0, model=m)
    with pytest.raises(TypeError, match="model is required"):
        matmul_block_scaled(A, B, scale_a=1.0, scale_b=1.0)
    nv = block_scaled_model("b200", "mxf4nvf4")
    with pytest.raises(ValueError, match="not a UE4M3 value"):
        matmul_block_scaled(np.ones((1, 64)), np.ones((64, 1)), scale_a=-1.0, scale_b=1.0, model=nv)
    assert np.array_equal(A, A0)
    # fpsim.matmul with a BlockScaledModel and scales=(sa, sb)
    d = fpsim.matmul(A, B, model=m, scales=(np.full((2, 1), 2.0), np.full((1, 2), 0.5)))
    assert d.tolist() == [[32.0, 32.0], [32.0, 32.0]]
    with pytest.raises(ValueError, match="promote_every"):
        fpsim.matmul(A, B, model=m, promote_every=32, scales=(1.0, 1.0))


def test_float32_in_float32_out_and_empty() -> None:
    m = block_scaled_model("b200", "f8f6f4", "fp8_e5m2")
    d = matmul_block_scaled(np.ones((3, 5), np.float32), np.ones((5, 2), np.float32), model=m)
    assert d.dtype == np.float32 and d.tolist() == [[5.0, 5.0]] * 3
    assert matmul_block_scaled(np.ones((3, 0)), np.ones((0, 2)), 1.5, model=m).tolist() == [[1.5, 1.5]] * 3
    assert matmul_block_scaled(np.ones((0, 4)), np.ones((4, 2)), model=m).shape == (0, 2)
