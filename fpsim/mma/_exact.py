"""The exact unit: the exact dot product plus C, rounded once (RNE) to the output format.

Not a hardware claim: the reference every other unit is compared with. Its NumPy reference sums every product
and C exactly in integer limbs (:func:`~fpsim.mma.model.exact_sum`) over the bit range of the operands
(:meth:`ExactUnit.operand_range`); a finite, unpromoted GEMM takes a faster route with the same bits, float64
BLAS on error-free integer slices (:meth:`ExactUnit.shortcut`, Ozaki-style).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..formats import fp32
from ._unit import UnitBase, register_unit
from .model import NO_EXP, MMAModel, _rne_out, exact_sum, exponents, prod_flags, products64, specials, term_range

__all__ = ["ExactUnit"]


_MAX_SLICES = 6


def _slices(x: np.ndarray, beta: int, axis: int) -> tuple[list[np.ndarray], np.ndarray] | None:
    """Split x exactly into integer-valued slices: x = 2**(e+1) * sum_s I_s * 2**(-beta*(s+1)), |I_s| < 2**beta,
    with e the largest exponent along `axis` (per row of A or column of B). None if more than _MAX_SLICES."""
    e = exponents(x, -1074).max(axis=axis, keepdims=True).astype(np.int32)
    e = np.where(e == NO_EXP, 0, e)
    r = np.ldexp(x, -(e + 1))  # |r| < 1
    out = []
    while True:
        r = np.ldexp(r, beta)
        i_s = np.trunc(r)
        out.append(i_s)
        r = r - i_s
        if not r.any():
            return out, e
        if len(out) >= _MAX_SLICES:
            return None


def _exact_matmul_split(a: np.ndarray, b: np.ndarray, c: np.ndarray, m: MMAModel,
                        elems: int) -> np.ndarray | None:
    """Exact GEMM through float64 BLAS on error-free integer slices (Ozaki-style), then one rounding.

    Each slice product sums K integers below 2**(2*beta), so with ``K * 2**(2*beta) <= 2**53`` every partial
    sum is exact whatever order BLAS uses. The S*S exact partial products and C are combined by
    :func:`~fpsim.mma.model.exact_sum`, a block of rows at a time (bounded memory). Returns None (the caller
    falls back to the limb kernel) when the inputs span too many bits for a few slices. `elems`: about how
    many float64 of partial products one block of rows may hold.
    """
    kk = a.shape[1]
    lg = max(1, math.ceil(math.log2(max(kk, 2))))
    beta = (53 - lg) // 2
    sa = _slices(a, beta, axis=1)
    sb = _slices(b, beta, axis=0)
    if sa is None or sb is None:
        return None
    (ia, ea), (ib, eb) = sa, sb
    lsb = int(ea.min() + eb.min()) + 2 - beta * (len(ia) + len(ib))
    top = int(ea.max() + eb.max()) + 2 + lg + 1
    if (c != 0).any():
        lc, tc = term_range(c, fp32)
        lsb, top = min(lsb, lc), max(top, tc)
    mm, nn = c.shape
    out = np.empty((mm, nn))
    step = max(1, elems // max(1, nn * (len(ia) * len(ib) + 1)))
    for i0 in range(0, mm, step):
        rows = slice(i0, min(mm, i0 + step))
        terms = [np.ldexp(x[rows] @ y, ea[rows] + eb + 2 - beta * (s_ + t_ + 2))  # exact integer units
                 for s_, x in enumerate(ia) for t_, y in enumerate(ib)]
        terms.append(c[rows])
        out[rows] = _rne_out(exact_sum(np.stack(terms), lsb, top), m.output)
    return out


class ExactUnit(UnitBase):
    """The exact dot product plus C, rounded once.

    Examples
    --------
    >>> import numpy as np
    >>> from fpsim.mma import exact
    >>> a = np.array([[1.0, 2.0**-30]]); b = np.array([[1.0], [1.0]])
    >>> exact._unit.operand_range(a.T, b, exact)  # products: multiples of 2**-76 (fp32 grids), below 2**2
    (-76, 2)
    """

    def operand_range(self, a: np.ndarray, b: np.ndarray, model: Any) -> tuple[int, int] | None:
        fin_a = np.where(np.isfinite(a), a, 0.0)
        fin_b = np.where(np.isfinite(b), b, 0.0)
        la, ta = term_range(fin_a, model.input)
        lb, tb = term_range(fin_b, model.input)
        return la + lb, ta + tb

    def shortcut(self, a: np.ndarray, b: np.ndarray, c: np.ndarray, model: Any, elems: int) -> np.ndarray | None:
        return _exact_matmul_split(a, b, c, model, elems)

    def reference(self, x: np.ndarray, y: np.ndarray, ex: np.ndarray, ey: np.ndarray, c: np.ndarray,
                  model: Any, has_specials: bool, lsb_top: tuple[int, int] | None) -> np.ndarray:
        prod = products64(x, y, c.shape)
        spec = None
        if has_specials or not np.isfinite(c).all():
            spec = specials(prod_flags(prod) if has_specials else None, c)
            with np.errstate(invalid="ignore"):
                prod = np.where(np.isfinite(prod), prod, 0.0)
                c = np.where(np.isfinite(c), c, 0.0)
        lsb, top = lsb_top if lsb_top is not None else (-1074, 1024)
        lc, tc = term_range(c, fp32)
        if (c != 0).any():
            lsb, top = min(lsb, lc), max(top, tc)
        terms = np.concatenate([prod, c[None]], axis=0) if prod.shape[0] else c[None]
        y_ = exact_sum(terms, lsb, top)
        d: np.ndarray = _rne_out(y_, model.output) + 0.0
        if spec is not None:
            d = np.where(spec[0], spec[1], d)
        return d


register_unit(("exact",), ExactUnit())
