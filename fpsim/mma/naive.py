"""A literal, scalar transcription of the BFMA model with Python integers: the reference for the vectorized kernels.

Slow (one Python loop per product) and written to mirror the reference text step by step, so that the fast
float-carrier kernel in :mod:`fpsim.mma._bfma` can be tested against an implementation that shares none of
its tricks. Specials (NaN, infinities) are not handled here.

>>> from fpsim.mma import get_model
>>> u = 2.0**-24
>>> dot_naive([1.0, 1.0, 1.0, 1.0], [u, u, u, u], 1.0, get_model("a100", "fp16")) == 1 + 2**-22
True
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

from .._fpenv import ieee_mode
from .model import MMAModel

__all__ = ["bfma_naive", "dot_naive"]


def _split(x: float, emin: int) -> tuple[int, int, Fraction]:
    """(sign, e_x, s_x) with e_x = max(floor(log2|x|), emin) and s_x = |x| / 2**e_x."""
    sign = -1 if x < 0 else 1
    e = math.frexp(abs(x))[1]
    ex = max(e - 1, emin)
    return sign, ex, Fraction(abs(x)) / Fraction(2) ** ex


def _round(v: Fraction, mb: int, emin: int, emax: int, rz: bool) -> float:
    if v == 0:
        return 0.0
    mag = abs(v)
    e = math.floor(math.log2(mag))
    while Fraction(2) ** e > mag:
        e -= 1
    while Fraction(2) ** (e + 1) <= mag:
        e += 1
    q = Fraction(2) ** (max(e, emin) - mb)
    n = mag / q
    fl = math.floor(n)
    if not rz:
        rem = n - fl
        if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and fl % 2 == 1):
            fl += 1
    r = fl * q
    sign = -1.0 if v < 0 else 1.0
    if r >= Fraction(2) ** (emax + 1):
        return sign * math.inf
    return sign * float(r)


@ieee_mode
def bfma_naive(a: Sequence[float], b: Sequence[float], c: float, model: MMAModel) -> float:
    """One BFMA of ``len(a)`` products and addend c, following reference section 1 literally."""
    fin = model.input
    terms: list[tuple[int, int, int]] = []  # (sign, P, E) with value sign * P * 2**(E - 23)
    for x, y in zip(a, b):
        if x == 0 or y == 0:
            continue
        sx, ex, mx = _split(x, fin.emin)
        sy, ey, my = _split(y, fin.emin)
        pf = mx * my * 2**23
        assert pf.denominator == 1, "product significand must be an integer"
        terms.append((sx * sy, int(pf), ex + ey))
    if c != 0:
        sc, ec, mc = _split(c, -126)  # binary32 encoding of c
        pc = mc * 2**23
        assert pc.denominator == 1
        terms.append((sc, int(pc), ec))
    if not terms:
        return 0.0
    emax = max(t[2] for t in terms)
    if model.mel is not None and emax < model.mel:
        emax = model.mel
    s = 0
    for sign, p, e in terms:
        q = p << model.neab if model.neab >= 0 else p >> -model.neab
        q >>= emax - e  # magnitude truncation, term by term
        s += sign * q
    v = Fraction(s) * Fraction(2) ** (emax - 23 - model.neab)
    out = model.output
    return _round(v, model.mb, out.emin, out.emax, model.rounding == "rz") + 0.0


@ieee_mode
def dot_naive(a: Sequence[float], b: Sequence[float], c: float, model: MMAModel) -> float:
    """Chain of BFMAs along K (zero padded), with the late-C and mod-4 variants; inputs must be exact."""
    ki = model.instruction_k
    a = list(a) + [0.0] * (-len(a) % ki)
    b = list(b) + [0.0] * (-len(b) % ki)
    out = model.output
    d = _round(Fraction(c), out.mbits, out.emin, out.emax, False) if c != 0 else 0.0
    for j in range(0, len(a), ki):
        aj, bj = a[j:j + ki], b[j:j + ki]
        if model.grouping == "mod4":
            g0 = [i for i in range(ki) if i % 4 < 2]
            g1 = [i for i in range(ki) if i % 4 >= 2]
            d1 = bfma_naive([aj[i] for i in g0], [bj[i] for i in g0], 0.0, model)
            d2 = bfma_naive([aj[i] for i in g1], [bj[i] for i in g1], d1, model)
            d = _round(Fraction(d2) + Fraction(d), out.mbits, out.emin, out.emax, False) + 0.0
        elif model.c_entry == "late":
            s = bfma_naive(aj, bj, 0.0, model)
            d = _round(Fraction(s) + Fraction(d), out.mbits, out.emin, out.emax, False) + 0.0
        else:
            d = bfma_naive(aj, bj, d, model)
    return d

