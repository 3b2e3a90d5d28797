"""The generic chain units: ``wide``, ``fma_chain`` and ``pairwise`` (plain arithmetic, not hardware claims).

Each is a :class:`~fpsim.mma._unit.MatrixUnit` (one class per rule, see :class:`~fpsim.mma.MMAModel` for the
arithmetic): the executor (:mod:`fpsim.mma.gemm`) hands its reference every product of a chain at once, or
runs the compiled chain kernel (``fpsim/_cgemm.c``, ``generic_gemm``; same bits) where
:meth:`ChainUnit.generic_kernel` describes the model.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..formats import Format, NaNEncoding
from ._unit import UnitBase, register_unit
from .model import _rne_out, fma_round, products64

__all__ = ["ChainUnit", "FMAChainUnit", "PairwiseUnit", "WideUnit"]


def _ieee_like(f: Format) -> bool:
    """A format the compiled generic kernels round to: IEEE-style infinities, NaN, subnormals, signed zero."""
    return bool(f.has_inf and f.subnormals and f.signed and f.signed_zero and f.nan == NaNEncoding.IEEE
                and 1 <= f.mbits <= 24 and -1000 < f.emin and f.emax < 1000)


class ChainUnit(UnitBase):
    """A generic chain: every product of the chain held at once, reduced by :meth:`reduce`, then RNE to output.

    Subclasses set :attr:`code` (the compiled kernel's rule number) and :attr:`acc_is_output` and implement
    :meth:`reduce`.
    """

    #: The rule's number in the compiled kernel (``generic_gemm``).
    code: int = -1
    #: Whether the rule accumulates in the output format (``wide``) rather than in ``model.acc``.
    acc_is_output: bool = False

    def reduce(self, prod: np.ndarray, c: np.ndarray, model: Any) -> np.ndarray:
        """The rule's accumulation of exact float64 products ``prod`` (K, *S) and addends c (S), unrounded."""
        raise NotImplementedError

    def reference(self, x: np.ndarray, y: np.ndarray, ex: np.ndarray, ey: np.ndarray, c: np.ndarray,
                  model: Any, has_specials: bool, lsb_top: tuple[int, int] | None) -> np.ndarray:
        prod = products64(x, y, c.shape)
        with np.errstate(invalid="ignore", over="ignore"):
            d = self.reduce(prod, c, model)
            return _rne_out(d, model.output) + 0.0

    def generic_kernel(self, model: Any) -> tuple[int, ...] | None:
        if model.input_b is not None:
            return None
        fin, out = model.input, model.output
        acc = out if self.acc_is_output else model.acc
        if not (fin.p <= 26 and fin.emax <= 127 and fin.emin - fin.mbits >= -160 and _ieee_like(acc)
                and _ieee_like(out)):
            return None
        return (self.code, acc.mbits, acc.emin, acc.emax, out.mbits, out.emin, out.emax)


class WideUnit(ChainUnit):
    """``wide``: products and C summed in float64 in index order, then rounded once."""

    code = 0
    acc_is_output = True

    def reduce(self, prod: np.ndarray, c: np.ndarray, model: Any) -> np.ndarray:
        d = c.astype(np.float64)
        for i in range(prod.shape[0]):
            d = d + prod[i]
        return d


class FMAChainUnit(ChainUnit):
    """``fma_chain``: ``d := c``, then ``d := fma(a_i, b_i, d)`` correctly rounded (RNE) in ``acc``."""

    code = 1

    def reduce(self, prod: np.ndarray, c: np.ndarray, model: Any) -> np.ndarray:
        d = c.astype(np.float64)
        for i in range(prod.shape[0]):
            d = fma_round(prod[i].astype(np.float64), d, model.acc)
        return d


class PairwiseUnit(ChainUnit):
    """``pairwise``: products rounded to ``acc``, a pairwise tree of ``acc`` additions, then C added."""

    code = 2

    def reduce(self, prod: np.ndarray, c: np.ndarray, model: Any) -> np.ndarray:
        t = _rne_out(prod.astype(np.float64), model.acc)
        while t.shape[0] > 1:
            m = t.shape[0] // 2
            pair = _rne_out(t[: 2 * m : 2] + t[1 : 2 * m : 2], model.acc)
            t = np.concatenate([pair, t[2 * m :]], axis=0) if t.shape[0] % 2 else pair
        s = t[0] if t.shape[0] else np.zeros(c.shape)
        res: np.ndarray = _rne_out(s + c, model.acc)
        return res


register_unit(("wide",), WideUnit())
register_unit(("fma_chain",), FMAChainUnit())
register_unit(("pairwise",), PairwiseUnit())
