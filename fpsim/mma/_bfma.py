"""The NVIDIA block-FMA (BFMA) matrix unit: its NumPy reference kernel and its compiled-kernel parameters.

One :class:`~fpsim.mma.MMAModel` of kind ``"bfma"`` describes one Tensor Core data path (V100 to Blackwell,
the presets of :mod:`fpsim.mma.presets`); the arithmetic of one block is described in :mod:`fpsim.mma.model`.
:class:`BlockFMAUnit` is the family's :class:`~fpsim.mma._unit.MatrixUnit`: the executor
(:mod:`fpsim.mma.gemm`) pads K to whole instructions, tiles the outputs for one instruction's products at a
time, and runs :func:`bfma_instruction` along K, or the compiled kernel (``fpsim/_cgemm.c``, ``bfma_gemm``)
with the parameters of :meth:`BlockFMAUnit.bfma_kernel` where they fit it (same bits; the NumPy code is the
reference).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ..formats import Format
from ._unit import BFMAKernel, UnitBase, register_unit
from .model import MMAModel, _rne_out, exponents, prod_flags, product_dtype, round_block, specials

__all__ = ["BlockFMAUnit", "bfma", "bfma_instruction"]


def bfma(prod: np.ndarray, e: np.ndarray, c: np.ndarray, model: MMAModel, *,
         has_specials: bool = False) -> np.ndarray:
    """One block FMA for every output at once.

    Parameters
    ----------
    prod : ndarray, shape (k, *S)
        Exact products ``a_i*b_i`` (float32 or float64); zeros for padding.
    e : ndarray of int16, shape (k, *S)
        Unnormalised product exponents ``e_a + e_b`` (:data:`NO_EXP`-based for zero factors).
    c : ndarray of float64, shape S
        Addends, values of the model's output format (or fp32).
    has_specials : bool
        Whether `prod` may hold NaN or infinities (checked by the caller once per GEMM).

    Returns
    -------
    ndarray of float64, shape S
    """
    spec = None
    cfin = bool(np.isfinite(c).all())
    if has_specials or not cfin:
        flags = prod_flags(prod) if has_specials else None
        spec = specials(flags, c)
        if has_specials:
            with np.errstate(invalid="ignore"):
                prod = np.where(np.isfinite(prod), prod, prod.dtype.type(0))
        if not cfin:
            c = np.where(np.isfinite(c), c, 0.0)
    ec = exponents(c, -126)  # c's binary32 exponent, also in fp16-out mode
    emax_ = np.maximum(e.max(axis=0), ec).astype(np.int32)
    if model.mel is not None:
        emax_ = np.maximum(emax_, model.mel)
    sh = 23 + model.neab - emax_  # terms are scaled by 2**sh, then truncated
    if prod.dtype == np.float32:
        # Clipping only matters when no nonzero float32-safe product exists (see product_dtype).
        scale = np.ldexp(np.float32(1.0), np.clip(sh, -149, 127).astype(np.int32))
    else:
        scale = np.ldexp(1.0, np.clip(sh, -1074, 1023).astype(np.int32))
    with np.errstate(under="ignore"):
        x = prod * scale
    np.trunc(x, out=x)
    s = np.add.reduce(x, axis=0, dtype=np.float64)
    s += np.trunc(np.ldexp(c, np.clip(sh, -1074, 1023)))
    v = np.ldexp(s, -sh)
    out = model.output
    d = round_block(v, model.mb, out.emin, out.emax, model.rounding == "rz")
    if spec is not None:
        d = np.where(spec[0], spec[1], d)
    return d


def bfma_instruction(prod: np.ndarray, e: np.ndarray, c: np.ndarray, model: MMAModel, *,
                     has_specials: bool = False) -> np.ndarray:
    """One instruction of ``model.instruction_k`` products (plain, late-C, or mod-4 grouped); shape (kI, *S)."""
    if model.grouping == "mod4":
        idx = np.arange(prod.shape[0])
        g0 = (idx % 4) < 2
        zero = np.zeros(c.shape)
        d = bfma(prod[g0], e[g0], zero, model, has_specials=has_specials)
        d = bfma(prod[~g0], e[~g0], d, model, has_specials=has_specials)
        return _late_add(d, c, model.output)
    if model.c_entry == "late":
        d = bfma(prod, e, np.zeros(c.shape), model, has_specials=has_specials)
        return _late_add(d, c, model.output)
    return bfma(prod, e, c, model, has_specials=has_specials)


def _late_add(d: np.ndarray, c: np.ndarray, out: Format) -> np.ndarray:
    """RNE_out(d + c) for two values of `out` (exact-enough in float64: innocuous double rounding)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return _rne_out(d + c, out) + 0.0


def _mod4_order(kp: int, ki: int) -> np.ndarray:
    """K order that puts each instruction's G0 (i mod 4 in {0, 1}) before its G1: two consecutive blocks."""
    idx = np.arange(ki)
    order = np.concatenate([idx[idx % 4 < 2], idx[idx % 4 >= 2]])
    res: np.ndarray = (np.arange(0, kp, ki)[:, None] + order[None, :]).reshape(-1)
    return res


def _kernel_params(m: MMAModel) -> tuple[int, ...] | None:
    """Parameters of the compiled BFMA kernel for `m`, or None where it does not apply (NumPy path)."""
    if m.input_b is not None:
        return None
    fin, out = m.input, m.output
    g = max(0, 23 + m.neab - 2 * fin.mbits)
    pmax = ((1 << fin.p) - 1) ** 2 << g  # largest |m_a * m_b| (A's significand pre-shifted by g bits)
    if not (fin.p <= 24 and pmax < 2**31 and -23 <= m.neab <= 6 and m.mb <= 28 and out.p <= 24 and m.k <= 4096):
        return None
    cs = min(m.k, (2**31 - 1) // pmax)  # products summed in int32 before widening: no overflow
    return (m.k, 2 if m.grouping == "mod4" else 1, int(m.c_entry == "late" or m.grouping == "mod4"),
            fin.mbits, fin.emin, m.neab, int(m.mel is not None), int(m.mel or 0), m.mb,
            int(m.rounding == "rne"), out.emin, out.emax, out.mbits, cs)


class BlockFMAUnit(UnitBase):
    """The NVIDIA block-FMA family: chains of instructions of ``model.instruction_k`` products along K.

    Examples
    --------
    >>> from fpsim.mma import get_model
    >>> m = get_model("h100", "fp8_e4m3", "fp16")  # the mod-4 grouping: 2k products per instruction
    >>> (m._unit.k_step(m), m._unit.pad_to(m, None), m._unit.pad_to(m, 128))
    (32, 32, 128)
    """

    blockwise = True

    def k_step(self, model: Any) -> int:
        return int(model.instruction_k)

    def pad_to(self, model: Any, promote_every: int | None) -> int:
        return int(model.instruction_k) if promote_every is None else promote_every

    def carrier(self, model: Any) -> type[np.floating[Any]]:
        return product_dtype(model.input)

    def terms_held(self, model: Any, k: int) -> int:
        return int(model.instruction_k)

    def reference(self, x: np.ndarray, y: np.ndarray, ex: np.ndarray, ey: np.ndarray, c: np.ndarray,
                  model: Any, has_specials: bool, lsb_top: tuple[int, int] | None) -> np.ndarray:
        ki = model.instruction_k
        d = c
        with np.errstate(invalid="ignore"):
            for j in range(0, x.shape[0], ki):
                prod = x[j:j + ki] * y[j:j + ki]  # (ki, *S)
                e = ex[j:j + ki] + ey[j:j + ki]
                d = bfma_instruction(prod, e, d, model, has_specials=has_specials)
        return d

    def bfma_kernel(self, model: Any) -> BFMAKernel | None:
        params = _kernel_params(model)
        if params is None:
            return None
        ki = model.instruction_k
        order = functools.partial(_mod4_order, ki=ki) if model.grouping == "mod4" else None
        return BFMAKernel(params, ki, order)


register_unit(("bfma",), BlockFMAUnit())
