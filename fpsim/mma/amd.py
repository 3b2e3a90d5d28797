"""AMD CDNA Matrix Core (MFMA) models: MI100 (CDNA1), MI250X (CDNA2) and MI300X (CDNA3), bit for bit.

An MFMA instruction ``D = C + A @ B`` does not round like an NVIDIA Tensor Core, and the three CDNA generations do
not round like each other. Five data paths cover every MFMA input type (MMA-Sim's classification, Microsoft's
bit-accurate simulator validated on the hardware; its operation names in brackets):

``seq_fma`` [MMA_FMA]
    fp64 and fp32 inputs (every generation, except CDNA3 ``xf32``): ``d := c``, then ``d := fma(a_i, b_i, d)``
    correctly rounded (RNE) in the output format, in index order: IEEE arithmetic, subnormals kept.
``e_fdpa`` [MMA_E_FDPA] -- CDNA1 (MI100) fp16 (block of 4) and bf16 (block of 2)
    every block of ``k`` exact products and the running sum are added **exactly** and rounded once (RNE) to fp32.
``ftz_mul_add`` [MMA_FTZ_MUL_ADD] -- CDNA2 (MI250X) fp16 and bf16_1k (``k = 4``), legacy bf16 (``k = 2``)
    subnormal inputs and C are flushed to +0; each product is rounded to fp32 and flushed below ``2**-126``
    (sign kept); every addition is an RNE fp32 addition flushed the same way: per block of 4
    ``d := d + ((p0 + p1) + (p2 + p3))``, of 2 ``d := d + (p0 + p1)``.
``tr_fdpa`` [MMA_TR_FDPA] -- CDNA3 (MI300X) fp16/bf16 (``k = 8``) and xf32 (``k = 4``)
    the ``k`` products are aligned to the largest product exponent and each truncated to ``F = 24`` fraction
    bits (``neab = 1`` in fpsim's BFMA terms); the block sum and C are then aligned to the larger exponent,
    rounded **down** (floor, toward -inf) to ``F2 + 1 = 32`` and ``F = 24`` fraction bits, added, the sum
    rounded down to ``F2 = 31`` fraction bits of its own exponent, and finally rounded RNE to fp32. A product
    whose exponent reaches 128 is an infinity.
``gtr_fdpa`` [MMA_GTR_FDPA] -- CDNA3 fp8/bf8 (fnuz formats, ``k = 16``; mixed inputs ``"fp8_bf8"``, ``"bf8_fp8"``)
    as ``tr_fdpa``, but the even- and odd-indexed products are truncated and summed as two groups of 8, the two
    sums floored to 24 fraction bits at the larger group exponent and added; C is dropped when its exponent is
    more than 25 below the block's.

Blocks chain along K in index order (``d`` of one block is ``c`` of the next), which is also how consecutive
MFMA instructions chain through their accumulator registers; the instruction's own K (e.g. 8 for
``v_mfma_f32_32x32x8f16``) is a multiple of the block. This module is an independent NumPy implementation
(float64 carriers of exact integer grids); MMA-Sim is used only as the oracle in ``tests/test_mma_amd.py``.

Examples
--------
>>> import fpsim
>>> m = fpsim.mma.get_model("mi300x", "fp16")
>>> (m.kind, m.k, m.neab, m.mb)
('tr_fdpa', 8, 1, 31)
>>> models = [fpsim.mma.get_model(d, "fp16") for d in ("mi100", "mi250x", "mi300x")]
>>> [float(fpsim.mma.dot([2.0**-24], [1.0], 0.0, m)) for m in models] == [2.0**-24, 0.0, 2.0**-24]  # FTZ
True
>>> t = 2.0**-9 + 2.0**-10  # 2**-14 * t is 0.75 ulp of 2 in fp32
>>> [float(fpsim.mma.dot([2.0**-14, 1.0], [t, 2.0], 0.0, m)) - 2 for m in models] == [2.0**-22, 2.0**-22, 0.0]
True
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from .._fpenv import ieee_mode
from .._names import norm_name
from ..arith import Context, _fma64_wide  # the exact int64-limb fp64 FMA (RNE)
from ..formats import Format, as_format, bf16, fp8_e4m3fnuz, fp8_e5m2fnuz, fp16, fp32, fp64, tf32
from .model import AMD_KINDS, MMAModel, exact_sum, prod_flags, specials
from ._unit import UnitBase, register_unit
from .presets import MMA_SIM, DeviceInfo, Provenance, register_device, register_preset

__all__ = ["AMD_KINDS", "INSTRUCTIONS", "instruction", "run_mfma"]


_MMASIM = ("mmasim.amd.sim.MFMA('{arch}', '{suffix}'): Microsoft MMA-Sim 2.1.1 (arXiv:2511.10909; "
           "pip install mmasim)")
_MI200_FTZ = ("AMD MIOpen docs, 'MI200 MFMA behavior specifics': MFMA_F16, MFMA_BF16 and MFMA_BF16_1K flush "
              "subnormal input/output data to zero")
_TESTS = ("tests/test_mma_amd.py::test_agrees_with_mmasim", "tests/test_mma_amd.py::test_specials_agree_with_mmasim")

# (device, input key, path) -> (arch, MMA-Sim/ISA suffix, kind, k, input format, output format).
# The instruction listed is the largest-K 32x32 (or 16x16 for fp64) variant; every variant of one input type
# on one architecture has the same arithmetic in MMA-Sim (the block depends on the type, not the shape).
_TABLE: dict[tuple[str, str, str | None], tuple[str, str, str, int, Format, Format]] = {
    ("mi100", "fp32", None): ("CDNA1", "f32_32x32x2f32", "seq_fma", 1, fp32, fp32),
    ("mi100", "fp16", None): ("CDNA1", "f32_32x32x8f16", "e_fdpa", 4, fp16, fp32),
    ("mi100", "bf16", None): ("CDNA1", "f32_32x32x4bf16", "e_fdpa", 2, bf16, fp32),
    ("mi250x", "fp64", None): ("CDNA2", "f64_16x16x4f64", "seq_fma", 1, fp64, fp64),
    ("mi250x", "fp32", None): ("CDNA2", "f32_32x32x2f32", "seq_fma", 1, fp32, fp32),
    ("mi250x", "fp16", None): ("CDNA2", "f32_32x32x8f16", "ftz_mul_add", 4, fp16, fp32),
    ("mi250x", "bf16", None): ("CDNA2", "f32_32x32x8bf16_1k", "ftz_mul_add", 4, bf16, fp32),
    ("mi250x", "bf16", "bf16_1k"): ("CDNA2", "f32_32x32x8bf16_1k", "ftz_mul_add", 4, bf16, fp32),
    ("mi250x", "bf16", "bf16"): ("CDNA2", "f32_32x32x4bf16", "ftz_mul_add", 2, bf16, fp32),
    ("mi250x", "bf16_1k", None): ("CDNA2", "f32_32x32x8bf16_1k", "ftz_mul_add", 4, bf16, fp32),
    ("mi300x", "fp64", None): ("CDNA3", "f64_16x16x4_f64", "seq_fma", 1, fp64, fp64),
    ("mi300x", "fp32", None): ("CDNA3", "f32_32x32x2_f32", "seq_fma", 1, fp32, fp32),
    ("mi300x", "xf32", None): ("CDNA3", "f32_32x32x4_xf32", "tr_fdpa", 4, tf32, fp32),
    ("mi300x", "fp16", None): ("CDNA3", "f32_32x32x8_f16", "tr_fdpa", 8, fp16, fp32),
    ("mi300x", "bf16", None): ("CDNA3", "f32_32x32x8_bf16", "tr_fdpa", 8, bf16, fp32),
    ("mi300x", "fp8_e4m3fnuz", None): ("CDNA3", "f32_32x32x16_fp8_fp8", "gtr_fdpa", 16, fp8_e4m3fnuz, fp32),
    ("mi300x", "fp8_e5m2fnuz", None): ("CDNA3", "f32_32x32x16_bf8_bf8", "gtr_fdpa", 16, fp8_e5m2fnuz, fp32),
    ("mi300x", "fp8_bf8", None): ("CDNA3", "f32_32x32x16_fp8_bf8", "gtr_fdpa", 16, fp8_e4m3fnuz, fp32),
    ("mi300x", "bf8_fp8", None): ("CDNA3", "f32_32x32x16_bf8_fp8", "gtr_fdpa", 16, fp8_e5m2fnuz, fp32),
}
#: B's format where it differs from A's (the mixed CDNA3 FP8 instructions).
_INPUT_B: dict[tuple[str, str, str | None], Format] = {
    ("mi300x", "fp8_bf8", None): fp8_e5m2fnuz,
    ("mi300x", "bf8_fp8", None): fp8_e4m3fnuz,
}

#: (device, input, path) -> (MMA-Sim architecture, MFMA suffix) of every AMD preset.
INSTRUCTIONS: dict[tuple[str, str, str | None], tuple[str, str]] = {
    key: (row[0], row[1]) for key, row in _TABLE.items()
}

_CONF = {
    "seq_fma": "IEEE FMA chain; agrees with MMA-Sim (which calls the C library's fma)",
    "e_fdpa": "exact block sums; agrees with MMA-Sim",
    "ftz_mul_add": "agrees with MMA-Sim; FTZ as AMD documents for MI200",
    "tr_fdpa": "agrees with MMA-Sim",
    "gtr_fdpa": ("agrees with MMA-Sim except where MMA-Sim drops an inf/NaN accumulator next to products of "
                 "exponent above 24 (fpsim propagates it; docs/matrix-units.md)"),
}


def _build(key: tuple[str, str, str | None]) -> MMAModel:
    arch, suffix, kind, k, fin, fout = _TABLE[key]
    dev, inp, path = key
    label = f"{dev} {inp}->{fout.name} (v_mfma_{suffix})"
    src = _MMASIM.format(arch=arch, suffix=suffix)
    if kind == "ftz_mul_add":
        src += "; " + _MI200_FTZ
    tr = kind in ("tr_fdpa", "gtr_fdpa")
    model = MMAModel(name=label, kind=kind, input=fin, output=fout, k=k,  # type: ignore[arg-type]
                     neab=1 if tr else 0, mel=None, rounding="rne", mb=31 if tr else fout.mbits, acc=fout,
                     source=src, confidence=_CONF[kind], input_b=_INPUT_B.get(key))
    object.__setattr__(model, "__doc__", model.describe())
    return model


@ieee_mode
def instruction(model: MMAModel) -> tuple[str, str]:
    """The (MMA-Sim architecture, MFMA suffix) an AMD preset models, read from its name.

    Examples
    --------
    >>> from fpsim.mma import get_model
    >>> instruction(get_model("mi250x", "bf16", path="bf16"))
    ('CDNA2', 'f32_32x32x4bf16')
    """
    if not isinstance(model, MMAModel):
        raise TypeError(f"model must be an MMAModel, got {type(model).__name__}")
    if model.kind not in AMD_KINDS or "(v_mfma_" not in model.name:
        raise ValueError(f"{model.name!r} is not an AMD MFMA preset")
    suffix = model.name.split("(v_mfma_", 1)[1].rstrip(")")
    dev = model.name.split(" ", 1)[0]
    for (d, _inp, _path), (arch, suf) in INSTRUCTIONS.items():
        if d == dev and suf == suffix:
            return arch, suf
    raise ValueError(f"{model.name!r} names no known MFMA instruction")


# ---------------------------------------------------------------------------------------------------------
# The executor: one model over all K (axis 0) of the products x*y, addends c
# ---------------------------------------------------------------------------------------------------------

_TINY32 = 2.0**-126  # smallest normal fp32: the FTZ threshold and the exponent floor of fp32 C
_CONTEXTS: dict[Format, Context] = {}


@ieee_mode
def run_mfma(x: np.ndarray, y: np.ndarray, c: np.ndarray, model: MMAModel) -> np.ndarray:
    """``D = c + sum_k x[k] * y[k]`` under an AMD model; x, y (K, ...) broadcast to (K, *c.shape).

    `x` and `y` hold values of ``model.input`` and ``model.b_format`` and `c` values of ``model.output``
    (float64 carriers); the result is float64 with the shape of `c`. K need not be a multiple of the block:
    the last block is shorter (MMA-Sim's slicing), except for ``ftz_mul_add`` whose last group is zero-padded.

    Examples
    --------
    >>> import numpy as np
    >>> from fpsim.mma import get_model
    >>> x = np.array([[1.0], [2.0**-23]]); y = np.ones((2, 1))
    >>> float(run_mfma(x, y, np.zeros(1), get_model("mi100", "fp16"))[0]) == 1 + 2**-23
    True
    """
    if not isinstance(model, MMAModel):
        raise TypeError(f"model must be an MMAModel, got {type(model).__name__}")
    kind = model.kind
    if kind not in AMD_KINDS:
        raise ValueError(f"run_mfma runs the AMD kinds ({', '.join(AMD_KINDS)}), not {kind!r}")
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    d = np.asarray(c, dtype=np.float64)
    kk = x.shape[0]
    if kk == 0:
        return d + 0.0
    with np.errstate(invalid="ignore", over="ignore", under="ignore"):
        if kind == "seq_fma":
            return _seq_fma(x, y, d, model.output)
        if kind == "ftz_mul_add":
            return _ftz_mul_add(x, y, d, model.k, model.input)
        step = model.k
        for j in range(0, kk, step):
            prod = np.broadcast_to(x[j:j + step] * y[j:j + step], (min(step, kk - j),) + d.shape)
            if kind == "e_fdpa":
                d = _e_fdpa_block(prod, d)
            else:
                d = _tr_block(prod, x[j:j + step], y[j:j + step], d, model, even_odd=kind == "gtr_fdpa")
    return d


def _context(fmt: Format) -> Context:
    ctx = _CONTEXTS.get(fmt)
    if ctx is None:
        ctx = _CONTEXTS[fmt] = Context(fmt, "rne")
    return ctx


def _seq_fma(x: np.ndarray, y: np.ndarray, d: np.ndarray, out: Format) -> np.ndarray:
    """d := fma(x_i, y_i, d) in `out` (fp32: exact product in float64 then one rounding; fp64: fpsim.arith,
    and :func:`_fma64_wide` where an operand, the product or the addend leaves 2**+-900, where fpsim.arith's
    error-free transformations are not exact)."""
    ctx = _context(out)
    shape = d.shape
    d = np.ascontiguousarray(d).ravel()
    for i in range(x.shape[0]):
        a = np.ascontiguousarray(np.broadcast_to(x[i], shape)).ravel()
        b = np.ascontiguousarray(np.broadcast_to(y[i], shape)).ravel()
        if out == fp64:
            p = np.abs(a * b)
            fin = np.isfinite(a) & np.isfinite(b)
            keep = fin & ~np.isfinite(d)  # the exact product is finite: an inf or NaN accumulator stays
            wide = (fin & ~keep & (a != 0) & (b != 0)
                    & ((p < 2.0**-900) | (p > 2.0**900) | (np.abs(d) > 2.0**900)
                       | (np.abs(a) > 2.0**900) | (np.abs(b) > 2.0**900)   # Veltkamp's split overflows
                       | (np.abs(a) < 2.0**-900) | (np.abs(b) < 2.0**-900)))  # ... or is inexact
            if wide.any() or keep.any():
                r = d.copy()
                ok = ~wide & ~keep
                r[ok] = ctx.fma(a[ok], b[ok], d[ok])
                r[wide] = _fma64_wide(a[wide], b[wide], d[wide])
                d = r
                continue
        d = ctx.fma(a, b, d)
    return d.reshape(shape)


def _to32(v: np.ndarray) -> np.ndarray:
    """RNE to fp32 (IEEE overflow to inf, subnormals kept) of float64 values, as float64."""
    return v.astype(np.float32).astype(np.float64)


def _flush(v: np.ndarray) -> np.ndarray:
    """Values below 2**-126 in magnitude become zeros of their own sign (MMA-Sim's keep_sign flush)."""
    return np.where(np.abs(v) < _TINY32, np.copysign(0.0, v), v)


def _ftz_mul_add(x: np.ndarray, y: np.ndarray, d: np.ndarray, p: int, fin: Format) -> np.ndarray:
    """CDNA2: products rounded to fp32 and flushed; RNE fp32 additions, each flushed (sign kept)."""
    tiny_in = float(fin.min_normal)
    x = np.where(np.abs(x) < tiny_in, 0.0, x)  # subnormal inputs -> +0
    y = np.where(np.abs(y) < tiny_in, 0.0, y)
    d = np.where(np.abs(d) < _TINY32, 0.0, d)  # subnormal C -> +0
    kk = x.shape[0]
    pad = (-kk) % p
    if pad:
        x = np.concatenate([x, np.zeros((pad,) + x.shape[1:])], 0)
        y = np.concatenate([y, np.zeros((pad,) + y.shape[1:])], 0)
    for j in range(0, x.shape[0], p):
        pr = [_flush(_to32(x[j + i] * y[j + i])) for i in range(p)]
        s = _flush(_to32(pr[0] + pr[1]))
        if p == 4:
            s = _flush(_to32(s + _flush(_to32(pr[2] + pr[3]))))
        d = _flush(_to32(d + s))
    return d


def _exp_of(v: np.ndarray, emin: int) -> np.ndarray:
    """``max(floor(log2|v|), emin)`` as int64 for finite nonzero v; `emin` for zeros."""
    _, e = np.frexp(np.where(np.isfinite(v), v, 0.0))
    return np.where(v != 0, np.maximum(e.astype(np.int64) - 1, emin), emin)


def _e_fdpa_block(prod: np.ndarray, c: np.ndarray) -> np.ndarray:
    """CDNA1: RNE_fp32(c + sum(prod)) with the sum exact (products of fp16/bf16 are exact in float64)."""
    spec = specials(prod_flags(prod), c)
    fin_p = np.where(np.isfinite(prod), prod, 0.0)
    fin_c = np.where(np.isfinite(c), c, 0.0)
    terms = np.concatenate([fin_p, fin_c[None]], axis=0)
    nz = terms != 0
    if not nz.any():
        d = np.zeros(c.shape)
    else:
        _, e = np.frexp(terms[nz])
        lsb, top = int(e.min()) - 53, int(e.max()) + 1
        d = _to32(exact_sum(terms, lsb, top))
    if spec is not None:
        d = np.where(spec[0], spec[1], d)
    return d


def _tr_block(prod: np.ndarray, xa: np.ndarray, yb: np.ndarray, c: np.ndarray, model: MMAModel, *,
              even_odd: bool) -> np.ndarray:
    """CDNA3 truncated-alignment block (``tr_fdpa``; ``gtr_fdpa`` with `even_odd`)."""
    f = 23 + model.neab  # F = 24
    f2 = model.mb  # F2 = 31
    emin = model.input.emin
    if not even_odd:
        # A product whose normalised exponent reaches 128 overflows to infinity (bf16, xf32).
        prod = np.where(np.abs(prod) >= 2.0**128, np.copysign(np.inf, prod), prod)
    spec = specials(prod_flags(prod), c)
    fin = np.isfinite(prod)
    prod = np.where(fin, prod, 0.0)
    cf = np.where(np.isfinite(c), c, 0.0)
    # Unnormalised product exponents e_a + e_b (each clamped at the input format's emin); zeros never win.
    e = np.broadcast_to(_exp_of(xa, emin) + _exp_of(yb, model.b_format.emin), prod.shape)
    e = np.where(prod != 0, e, -(1 << 20))
    if even_odd:
        s0, e0 = _trunc_sum(prod[0::2], e[0::2], f)
        s1, e1 = _trunc_sum(prod[1::2], e[1::2], f)
        edot = np.maximum(e0, e1)
        sdot = (np.floor(np.ldexp(s0, _clip(e0 - edot))) + np.floor(np.ldexp(s1, _clip(e1 - edot))))
    else:
        sdot, edot = _trunc_sum(prod, e, f)
    # sdot: integer, the block sum in units of 2**(edot - F)
    ec = _exp_of(cf, -126)
    emax = np.maximum(edot, ec)
    dq = np.floor(np.ldexp(sdot, _clip(edot - f + f2 + 1 - emax)))  # units 2**(emax - F2 - 1), floor
    cq = np.floor(np.ldexp(cf, _clip(f - emax)))  # units 2**(emax - F), floor
    if even_odd:
        cq = np.where(ec < emax - f - 1, 0.0, cq)
    v = np.ldexp(dq + np.ldexp(cq, f2 + 1 - f), _clip(emax - f2 - 1))
    # floor to F2 fraction bits below v's own exponent (clamped at -126), then RNE to fp32
    q = _exp_of(v, -126) - f2
    v = np.ldexp(np.floor(np.ldexp(v, _clip(-q))), _clip(q))
    d = np.where(v == 0, 0.0, _to32(v))  # an exact zero is +0; a nonzero tiny value rounding to 0 keeps its sign
    if spec is not None:
        d = np.where(spec[0], spec[1], d)
    return d


def _clip(e: Any) -> np.ndarray:
    res: np.ndarray = np.clip(e, -2000, 2000).astype(np.int32)
    return res


def _trunc_sum(prod: np.ndarray, e: np.ndarray, f: int) -> tuple[np.ndarray, np.ndarray]:
    """Products truncated (toward zero) to `f` fraction bits below the group's largest exponent, summed.

    Returns (S, E): the exact integer sum S in units of ``2**(E - f)`` and E (a huge negative number when every
    product is zero, so that it never wins a later maximum).
    """
    if prod.shape[0] == 0:
        shape = prod.shape[1:]
        return np.zeros(shape), np.full(shape, -(1 << 20), dtype=np.int64)
    emax = e.max(axis=0)
    q = np.trunc(np.ldexp(prod, _clip(f - emax)[None]))
    return q.sum(axis=0), emax


# ---------------------------------------------------------------------------------------------------------
# Registration: devices, presets and their provenance
# ---------------------------------------------------------------------------------------------------------

_DEVICES = (
    (DeviceInfo("mi100", "CDNA1", "cdna1", "MFMA (gfx908); MMA-Sim cross-checked", vendor="AMD", unit="Matrix Core"),
     ("cdna1", "instinctmi100", "gfx908")),
    (DeviceInfo("mi250x", "CDNA2", "cdna2", "MFMA (gfx90a); MMA-Sim cross-checked", vendor="AMD", unit="Matrix Core"),
     ("cdna2", "mi250", "mi210", "mi200", "instinctmi250x", "gfx90a")),
    (DeviceInfo("mi300x", "CDNA3", "cdna3", "MFMA (gfx942); MMA-Sim cross-checked", vendor="AMD", unit="Matrix Core"),
     ("cdna3", "mi300", "mi300a", "mi325x", "instinctmi300x", "gfx942")),
)

_INPUTS_OF = {dev: sorted({k[1] for k in _TABLE if k[0] == dev}) for dev in ("mi100", "mi250x", "mi300x")}


def _fallback(dev: str) -> Any:
    arch = {"mi100": "CDNA1", "mi250x": "CDNA2", "mi300x": "CDNA3"}[dev]

    def fallback(input: Any, output: Any, path: Any) -> MMAModel:
        try:
            fin = as_format(input).name
        except (ValueError, TypeError):
            fin = norm_name(input, "input format") if isinstance(input, str) else repr(input)
        try:
            fout = as_format(output).name
        except (ValueError, TypeError):
            fout = norm_name(output, "output format") if isinstance(output, str) else repr(output)
        valid = ", ".join(_INPUTS_OF[dev])
        paths = "" if dev != "mi250x" else "; bf16 takes path='bf16_1k' (default) or path='bf16' (legacy)"
        if (dev, fin, None) in _TABLE or (fin == "bf16_1k" and dev == "mi250x"):
            want = _TABLE.get((dev, fin, None), _TABLE[("mi250x", "bf16", None)])[5].name
            if path is not None:
                raise ValueError(f"{dev} ({arch}) {fin} has no instruction path {path!r}{paths or '; no paths'}")
            raise ValueError(f"{dev} ({arch}) {fin} MFMA accumulates to {want}, not {fout}: pass "
                             f"output={want!r}")
        why = ""
        if fin == "fp64":
            why = ": fp64 MFMA starts with CDNA2 (MI200)"
        elif fin in ("fp8_e4m3fnuz", "fp8_e5m2fnuz"):
            why = ": FP8 MFMA starts with CDNA3 (MI300)"
        elif fin in ("fp8_e4m3", "fp8_e5m2"):
            why = (": CDNA3 FP8 MFMA takes the fnuz formats (fp8_e4m3fnuz, fp8_e5m2fnuz); OCP FP8 arrives with "
                   "CDNA4" if dev == "mi300x" else ": FP8 MFMA starts with CDNA3 (MI300), in the fnuz formats")
        elif fin in ("tf32", "xf32"):
            why = ": use input='xf32' (CDNA3's reduced-precision fp32 inputs)" if dev == "mi300x" else \
                ": xf32 MFMA exists on CDNA3 (MI300) only"
        raise ValueError(f"{dev} ({arch}) has no {fin} -> {fout} MFMA{why}; valid inputs: {valid}{paths}")

    return fallback


def _register() -> None:
    for info, aliases in _DEVICES:
        register_device(info, aliases=aliases, fallback=_fallback(info.name))
    for key, (arch, suffix, kind, _k, _fin, fout) in _TABLE.items():
        dev, inp, path = key
        note = (f"bit-identical to MMA-Sim's MFMA('{arch}', '{suffix}') on chained MFMAs (random inputs, wide "
                "exponent ranges, subnormals, signed zeros, inf and NaN); counts in docs/matrix-units.md; no hardware rows")
        if kind == "gtr_fdpa":
            note += ("; except an inf/NaN C with a block exponent above 24, which MMA-Sim drops (frexp of inf) "
                     "and fpsim propagates")
        prov = Provenance((MMA_SIM,), source=_MMASIM.format(arch=arch, suffix=suffix), note=note, tests=_TESTS)
        register_preset(dev, inp, fout.name, path=path, provenance=prov,
                        build=functools.partial(_build, key))


_register()


class MFMAUnit(UnitBase):
    """The AMD CDNA MFMA family (the five kinds above): every product of a chain held, run by :func:`run_mfma`."""

    def reference(self, x: np.ndarray, y: np.ndarray, ex: np.ndarray, ey: np.ndarray, c: np.ndarray,
                  model: Any, has_specials: bool, lsb_top: tuple[int, int] | None) -> np.ndarray:
        return run_mfma(x, y, c, model)


register_unit(AMD_KINDS, MFMAUnit())
