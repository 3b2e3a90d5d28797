"""Correctly rounded arithmetic in any format: ``add, sub, mul, div, sqrt, fma``, each rounded once.

How the exact result is rounded once
------------------------------------
Every operation first produces, in float64, the pair ``(s, e)`` with ``s = RN64(x)`` the float64 nearest
to the exact result ``x`` and ``e`` an exact residual (or at least one with the sign of ``x - s`` and
zero exactly when ``x == s``), using error-free transformations:

* ``add``/``sub``: TwoSum (Knuth): ``s = a + b`` and ``e = (a - (s - bb)) + (b - bb)``, ``bb = s - a``;
* ``mul``: the product of two operands of at most 26 significant bits (every float32, hence every format
  up to fp32) is exact in float64; other operands use Dekker's TwoProduct (splitting into halves);
* ``div``/``sqrt``: ``q = RN64(a / b)`` and the remainder ``a - q*b`` (``a - s*s``), computed exactly
  with TwoProduct and Sterbenz's lemma, whose sign says on which side of ``q`` the quotient lies;
* ``fma``: the product exactly (as above) and the sum of three terms with Boldo and Melquiond's
  algorithm: ``th + tl = c + ph``, ``v = RO(tl + pl)``, ``RO(th + v)``.

From ``(s, e)`` the *round-to-odd* float64 ``RO53(x)`` is two integer operations on the bits of ``s``
(step toward zero when ``e`` points toward zero, then set the last bit when inexact). Rounding ``RO53(x)``
into any format of precision ``p <= 51`` with :func:`fpsim.round` is the correct rounding of ``x`` in
every deterministic mode (Boldo and Melquiond's round-to-odd theorem: every rounding boundary of the
target is an even float64, and ``RO53(x)`` lies strictly between the same two float64 values as ``x``).
Stochastic rounding (``"sr"``) then rounds ``RO53(x)`` stochastically: the probability of rounding up is
exact when the result is exactly a float64 and otherwise off by less than ``2**-53`` relative to the gap.

Operands that overflow or underflow these transformations (magnitudes beyond about ``2**±900`` — only
possible for float64 inputs that are not values of the format) are scaled by powers of two first; a
result whose magnitude lies far outside the target's range keeps only its sign and "tiny"/"huge", which
is all that rounding needs. Results are therefore one correct rounding of the exact result for *any*
finite float input, not only for operands representable in the format. fp64 ``fma`` (``"rne"``) too: where
an operand, the product or the addend leaves ``2**±900`` it is computed exactly in int64 limbs
(`_fma64_wide`) and rounded once.

For round-to-nearest-even and ``p <= 25`` (fp16, bf16 and narrower) with operands that are values of the
format, plain float64 ``+ - * / sqrt`` followed by one rounding is already correct (double rounding is
innocuous when ``53 >= 2p + 2``); :class:`fpsim.FPArray` uses that shortcut, the public functions do not
(they cannot know that arbitrary inputs are representable).

Special values follow IEEE 754: ``inf - inf``, ``0 * inf``, ``0 / 0``, ``inf / inf`` and the square root
of a negative number give NaN; ``x / 0`` gives a signed infinity; an exact zero sum is ``+0`` except
under ``"rdn"`` where it is ``-0`` (IEEE 754 §6.3; ``x + x`` keeps the sign of ``x``), also for ``fma``;
``sqrt(-0) = -0``. NaN and infinity then take the format's encoding (no infinity: NaN or ±max; no NaN:
the NaN stays a float NaN), as for :func:`fpsim.round`.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from typing import Any

import numpy as np

from ._carrier import as_float_array as _as_float_array
from ._checks import check_out
from ._fpenv import ieee_mode
from ._interop import returns_input_kind
from .formats import Format, FormatLike, as_format
from .rounding import Overflow, Rounding, RoundingLike, parse_options

__all__ = ["add", "div", "fma", "mul", "sqrt", "sub", "supports"]

_F64 = np.float64
_U64 = np.uint64
_SPLIT = 134217729.0  # 2**27 + 1: Dekker's splitter for 53-bit significands
_LOW27 = np.uint64((1 << 27) - 1)
# The error-free transformations need intermediates well inside float64's range. Inside [TINY, HUGE]
# nothing can overflow or lose bits to underflow; elements outside take the scaled path.
_TINY = 2.0**-900
_HUGE = 2.0**900
# Stand-ins for results far outside every supported format's range: any value between 0 and half the
# smallest subnormal (resp. beyond the overflow threshold) rounds the same way in every mode.
_STICKY_TINY = 2.0**-960
_STICKY_HUGE = 2.0**960
_FAR = 950  # |result| outside 2**±950 is replaced by a stand-in
_D = struct.Struct("<d")
_Q = struct.Struct("<Q")


def supports(fmt: FormatLike) -> bool:
    """Whether the arithmetic functions support ``fmt`` in every rounding mode.

    Every format of precision ``p <= 51`` whose range lies well inside float64's (all registered
    formats except fp64) is supported in every mode; fp64 itself only with ``rounding="rne"``
    (native float64 arithmetic).

    >>> import fpsim
    >>> fpsim.arith.supports("fp32"), fpsim.arith.supports("fp64")
    (True, False)
    """
    f = as_format(fmt)
    return f.p <= 51 and f.emax <= 890 and f.emin - f.mbits >= -890


def _is_fp64(f: Format) -> bool:
    return f.p == 53 and f.emin == -1022 and f.emax == 1023 and f.has_inf and f.subnormals


# --------------------------------------------------------------------------------------------------
# Error-free transformations (vectorized, float64)


def _two_sum(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """s + e == a + b exactly, s = RN(a + b) (Knuth; no magnitude condition)."""
    s = a + b
    bb = s - a
    e = s - bb
    np.subtract(a, e, out=e)  # in place: fewer temporaries (the same operations as the formula)
    np.subtract(b, bb, out=bb)
    np.add(e, bb, out=e)
    return s, e


def _split(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    c = _SPLIT * a
    hi = c - (c - a)
    return hi, a - hi


def _two_prod(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """p + e == a * b exactly (Dekker), for |a|, |b| < 2**995 and |a*b| >= 2**-969."""
    p = a * b
    ah, al = _split(a)
    bh, bl = _split(b)
    e = ((ah * bh - p) + ah * bl + al * bh) + al * bl
    return p, e


def _round_to_odd(s: np.ndarray, e: np.ndarray) -> np.ndarray:
    """RO53(s + e) from s = RN64(s + e) and the residual e (only its sign and zeroness are used).

    Requires s finite and nonzero wherever e != 0 (true inside the safe range).
    """
    inexact = e != 0
    toward_zero = e < 0
    np.not_equal(toward_zero, s < 0, out=toward_zero)
    toward_zero &= inexact
    u = s.view(_U64) - toward_zero  # RTZ53: one step toward zero (bool promotes to uint64)
    u |= inexact  # then the sticky last bit
    return np.asarray(u.view(_F64))


def _short(x: np.ndarray) -> bool:
    """All values have at most 26 significant bits (products of two such are exact in float64)."""
    return bool(not np.any(x.view(_U64) & _LOW27))


def _place(z: np.ndarray, k: np.ndarray) -> np.ndarray:
    """z * 2**k for scaled results z (|z| in [2**-60, 4) or 0), with far-away results replaced by stand-ins."""
    with np.errstate(divide="ignore"):
        ez = np.frexp(z)[1] + k
    out = np.ldexp(z, np.clip(k, -2000, 2000).astype(np.int32))
    out = np.where(ez < -_FAR, np.copysign(_STICKY_TINY, z), out)
    out = np.where(ez > _FAR, np.copysign(_STICKY_HUGE, z), out)
    return np.where(z == 0, z, out)


def _clamp_far(x: np.ndarray) -> np.ndarray:
    """Replace magnitudes beyond 2**±950 (including 0 that stands for a nonzero tiny) by stand-ins."""
    ax = np.abs(x)
    out = np.where(ax > 2.0**_FAR, np.copysign(_STICKY_HUGE, x), x)
    return np.where(ax < 2.0**-_FAR, np.copysign(_STICKY_TINY, x), out)


# --------------------------------------------------------------------------------------------------
# Operations on float64 arrays (already broadcast). Each returns RO53 of the exact result, or the exact
# special value (NaN, ±inf, signed zero), ready for one rounding into the target.


def _add_ro(a: np.ndarray, b: np.ndarray, rdn: bool) -> np.ndarray:
    s, e = _two_sum(a, b)
    ok = np.isfinite(e)  # NaN/inf operands, or overflow inside TwoSum
    if not ok.all():
        bad = ~ok
        ab, bb = a[bad], b[bad]
        fin = np.isfinite(ab) & np.isfinite(bb)
        s_b = ab + bb  # IEEE special results (inf, NaN) where an operand is not finite
        e_b = np.zeros_like(s_b)
        if fin.any():
            # Huge finite operands: halve both (a negligible partner is first raised to a sticky size).
            x = np.where(np.abs(ab[fin]) < _TINY, np.copysign(_TINY, ab[fin]), ab[fin]) * 0.25
            y = np.where(np.abs(bb[fin]) < _TINY, np.copysign(_TINY, bb[fin]), bb[fin]) * 0.25
            x = np.where(ab[fin] == 0, 0.0, x)
            y = np.where(bb[fin] == 0, 0.0, y)
            ss, ee = _two_sum(x, y)
            z = _round_to_odd(ss, ee)
            s_b[fin] = _place(z, np.full(z.shape, 2))
        s = s.copy()
        e = e.copy()
        s[bad] = s_b
        e[bad] = e_b
    r = _round_to_odd(s, e)
    if rdn:
        # IEEE 754 §6.3: an exact zero sum is -0 under roundTowardNegative unless both addends are +0.
        z = r == 0
        if z.any():
            both_pos_zero = (a == 0) & (b == 0) & ~np.signbit(a) & ~np.signbit(b)
            r = np.where(z & ~both_pos_zero, -0.0, r)
    return r


def _add_ro_scalar(a: float, b: float, rdn: bool) -> float | None:
    """`_add_ro` for one pair of finite Python floats (None when the array path is needed)."""
    s = a + b
    if not (-2.0**1020 < a < 2.0**1020 and -2.0**1020 < b < 2.0**1020):
        return None
    bb = s - a
    e = (a - (s - bb)) + (b - bb)
    if e != 0:
        u = _Q.unpack(_D.pack(s))[0]
        if (e < 0) != (s < 0):
            u -= 1
        return float(_D.unpack(_Q.pack(u | 1))[0])
    if s == 0 and rdn and not (a == 0 and b == 0 and math.copysign(1.0, a) > 0 and math.copysign(1.0, b) > 0):
        return -0.0
    return s


def _mul_ro(a: np.ndarray, b: np.ndarray, short: bool) -> np.ndarray:
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        p = a * b
    if short:
        # exact whenever it neither overflows nor leaves the normal range
        ap = np.abs(p)
        good = (ap >= 2.0**-1000) & (ap <= 2.0**1000)
        if good.all():
            return np.asarray(p)
        fin = np.isfinite(a) & np.isfinite(b) & (a != 0) & (b != 0)
        fix = ~good & fin
        return np.where(fix, _clamp_far(p), p)
    # Dekker's TwoProduct where nothing can overflow or underflow; other finite operands are scaled first
    ok = _in_range(a) & _in_range(b) & _in_range(p)
    if ok.all():
        s, e = _two_prod(a, b)
        return _round_to_odd(s, e)
    out = p.copy()  # specials (NaN, inf, signed zeros) are exact as computed
    if ok.any():
        s, e = _two_prod(a[ok], b[ok])
        out[ok] = _round_to_odd(s, e)
    fin = ~ok & np.isfinite(a) & np.isfinite(b) & (a != 0) & (b != 0)
    if fin.any():
        ma, ea = np.frexp(a[fin])
        mb, eb = np.frexp(b[fin])
        s, e = _two_prod(ma, mb)
        out[fin] = _place(_round_to_odd(s, e), ea.astype(np.int64) + eb)
    return np.asarray(out)


def _in_range(x: np.ndarray) -> np.ndarray:
    ax = np.abs(x)
    return np.asarray((ax >= _TINY) & (ax <= _HUGE))


def _div_ro(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        q = a / b
    # Fast path: operands and quotient well inside float64's range (every format value qualifies).
    ok = _in_range(a) & _in_range(b) & _in_range(q)
    if ok.all():
        p, pe = _two_prod(q, b)
        r = (a - p) - pe  # the exact remainder a - q*b (Sterbenz; it is representable)
        return _round_to_odd(q, np.where(b < 0, -r, r))  # sign of a/b - q
    out = q.copy()  # x/0, 0/x, inf/x, x/inf, NaN: exact as IEEE computes them
    if ok.any():
        out[ok] = _div_ro(a[ok], b[ok])
    fin = ~ok & np.isfinite(a) & np.isfinite(b) & (a != 0) & (b != 0)
    if fin.any():
        ma, ea = np.frexp(a[fin])
        mb, eb = np.frexp(b[fin])
        qq = ma / mb  # in (0.5, 2): the remainder below is free of under- and overflow
        p, pe = _two_prod(qq, mb)
        r = (ma - p) - pe
        out[fin] = _place(_round_to_odd(qq, np.where(mb < 0, -r, r)), ea.astype(np.int64) - eb)
    return np.asarray(out)


def _sqrt_ro(a: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        s = np.sqrt(a)  # sqrt(-0) = -0, sqrt(x<0) = NaN, sqrt(inf) = inf
    ok = (a >= _TINY) & (a <= _HUGE)
    if ok.all():
        p, pe = _two_prod(s, s)
        return _round_to_odd(s, (a - p) - pe)
    out = s.copy()
    if ok.any():
        out[ok] = _sqrt_ro(a[ok])
    fin = ~ok & np.isfinite(a) & (a > 0)
    if fin.any():
        m, ex = np.frexp(a[fin])
        odd = (ex & 1) == 1
        m = np.where(odd, m * 2.0, m)  # m in [0.5, 2), exponent even
        ex = np.where(odd, ex - 1, ex).astype(np.int64)
        r = np.sqrt(m)
        p, pe = _two_prod(r, r)
        out[fin] = _place(_round_to_odd(r, (m - p) - pe), ex // 2)
    return np.asarray(out)


def _fma_ro(a: np.ndarray, b: np.ndarray, c: np.ndarray, short: bool, rdn: bool,
            bounded: bool = False) -> np.ndarray:
    """``bounded``: a and b are known to be 0, NaN, inf or within 2**±500 (their product cannot underflow)."""
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        p = a * b
        if short:
            # Fast path: the product is exact (at most 52 bits) unless it leaves float64's normal range,
            # and TwoSum is exact unless something overflows (then e is not finite).
            s, e = _two_sum(p, c)
            ok = bool(np.isfinite(e).all())
            tiny_any = False
            if ok and not bounded:
                tiny = np.abs(p) < 2.0**-1000
                if tiny.any():  # a zero operand makes an exact zero product: only nonzero ones are tiny
                    tiny_any = bool(np.any((a[tiny] != 0) & (b[tiny] != 0)))
            if ok and not tiny_any:
                out = _round_to_odd(s, e)
                return _fma_zero_sign(out, a, b, c, rdn)
        else:
            # Fast path for other operands: TwoProduct and the three-term sum need no scaling
            ok_all = bool((_in_range(a) & _in_range(b) & _in_range(p) & (np.abs(c) <= _HUGE)).all())
            if ok_all:
                return _fma_zero_sign(_three_sum_ro(*_two_prod(a, b), c), a, b, c, rdn)
        prod_fin = np.isfinite(a) & np.isfinite(b)
        special = ~(prod_fin & np.isfinite(c))
        zero_prod = ((a == 0) | (b == 0)) & ~special
        # IEEE results where something is not finite (an overflowed float64 product is still finite
        # in exact arithmetic, so then the result is c), and exact ones for a zero product.
        native = np.where(prod_fin & ~np.isfinite(c), c, p + c)
    easy = special | zero_prod
    if short:
        ap = np.abs(p)
        reg = ~easy & (ap >= 2.0**-1000) & (ap <= 2.0**1000) & (np.abs(c) <= 2.0**1000)
    else:
        reg = np.zeros(p.shape, dtype=bool)
    out = native.copy()
    if reg.any():
        s, e = _two_sum(p[reg], c[reg])
        out[reg] = _round_to_odd(s, e)
    gen = ~easy & ~reg
    if gen.any():
        out[gen] = _fma_general(a[gen], b[gen], c[gen])
    return _fma_zero_sign(out, a, b, c, rdn, special)


def _fma_zero_sign(out: np.ndarray, a: np.ndarray, b: np.ndarray, c: np.ndarray, rdn: bool,
                   special: np.ndarray | None = None) -> np.ndarray:
    """IEEE 754 §6.3 under rdn: an exact zero result is -0 unless product and c are both +0."""
    if not rdn:
        return out
    z = out == 0
    if not z.any():
        return out
    zero_prod = (a == 0) | (b == 0)
    prod_neg = np.signbit(a) != np.signbit(b)
    both_pos_zero = zero_prod & ~prod_neg & (c == 0) & ~np.signbit(c)
    keep = both_pos_zero if special is None else both_pos_zero | special
    return np.where(z & ~keep, -0.0, out)


def _three_sum_ro(ph: np.ndarray, pl: np.ndarray, c: np.ndarray) -> np.ndarray:
    """RO53(ph + pl + c) for an exact product ph + pl (|pl| <= ulp(ph)/2): Boldo and Melquiond."""
    th, tl = _two_sum(c, ph)
    ws, we = _two_sum(tl, pl)
    v = np.where(ws == 0, ws, _round_to_odd(np.where(ws == 0, 1.0, ws), we))
    zs, ze = _two_sum(th, v)
    return np.asarray(np.where(zs == 0, zs, _round_to_odd(np.where(zs == 0, 1.0, zs), ze)))


def _fma_general(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """RO53(a*b + c) for finite a, b, c with a*b != 0, any magnitudes."""
    with np.errstate(over="ignore", under="ignore"):
        ok = _in_range(a) & _in_range(b) & _in_range(a * b) & (np.abs(c) <= _HUGE)
    if ok.all():  # nothing can overflow, and the product's error term cannot underflow
        return _three_sum_ro(*_two_prod(a, b), c)
    out = np.empty_like(a)
    if ok.any():
        out[ok] = _three_sum_ro(*_two_prod(a[ok], b[ok]), c[ok])
    rest = ~ok
    out[rest] = _fma_scaled(a[rest], b[rest], c[rest])
    return out


def _fma_scaled(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """`_fma_general` for operands near the ends of float64's range: scaled by the product's exponent."""
    ma, ea = np.frexp(a)
    mb, eb = np.frexp(b)
    k = ea.astype(np.int64) + eb
    with np.errstate(divide="ignore"):
        ec = np.where(c == 0, np.int64(-(1 << 20)), np.frexp(c)[1].astype(np.int64))
    d = ec - k  # |c| ~ 2**d relative to |a*b| ~ 2**0 in the scaled frame
    out = np.empty_like(a)
    dom = d > 60  # c dominates: a*b acts as a sticky bit of c's sign-of-product direction
    if dom.any():
        cs = c[dom]
        prod_sign = np.where(np.signbit(a[dom]) != np.signbit(b[dom]), -1.0, 1.0)
        out[dom] = _clamp_far(_round_to_odd(_clamp_far(cs), prod_sign))
    rest = ~dom
    if rest.any():
        kk = k[rest]
        cr = c[rest]
        dd = d[rest]
        cs = np.where(dd < -200, np.copysign(2.0**-200, cr), np.ldexp(cr, np.clip(-kk, -2000, 2000).astype(np.int32)))
        cs = np.where(cr == 0, 0.0, cs)
        ph, pl = _two_prod(ma[rest], mb[rest])
        out[rest] = _place(_three_sum_ro(ph, pl, cs), kk)
    return out


# --------------------------------------------------------------------------------------------------
# Public functions


def _fparray_op(name: str, args: tuple[Any, ...]) -> Any:
    """``fmt=None``: the operands' FPArray format, mode and promotion decide (see fpsim.array).

    An operand whose type defines ``__fpsim_op__(name, args)`` (:class:`fpsim.FPArray` does) carries its own
    arithmetic; this module, below `array`, asks the operand instead of importing it."""
    owner = next((type(x) for x in args if hasattr(type(x), "__fpsim_op__")), None)
    if owner is None:
        raise TypeError(f"{name}: fmt is required unless an operand is an FPArray")
    return owner.__fpsim_op__(name, args)


def _parse(fmt: FormatLike, rounding: RoundingLike, overflow: Overflow | str, subnormals: bool,
           rng: np.random.Generator | None) -> tuple[Format, Rounding, Overflow]:
    f, mode, ov = parse_options(fmt, rounding, overflow, subnormals, rng)
    if not supports(f) and not (_is_fp64(f) and mode is Rounding.RNE):
        raise ValueError(
            f"arithmetic in {f.name} (p={f.p}, emin={f.emin}, emax={f.emax}) with rounding={mode.value!r} is not "
            "supported: every mode works for formats with p <= 51 and a range inside 2**±890 "
            "(all registered formats up to fp32); fp64 works with rounding='rne' only"
        )
    return f, mode, ov


def _prepare(args: tuple[Any, ...], names: tuple[str, ...]) -> tuple[list[np.ndarray], bool, bool, tuple[int, ...]]:
    """Convert operands to flat broadcast float64 arrays; report (all float32, all scalar, shape)."""
    arrs = []
    all32 = True
    all_scalar = True
    for x, name in zip(args, names):
        a, scalar = _as_float_array(x, name)
        all_scalar &= bool(scalar) or a.ndim == 0
        all32 &= a.dtype == np.float32
        arrs.append(a)
    shaped = np.broadcast_arrays(*arrs)
    dt = np.float32 if all32 else _F64
    return [np.asarray(s, dtype=dt).reshape(-1) for s in shaped], all32, all_scalar, shaped[0].shape


def _run(op: str, args: tuple[Any, ...], names: tuple[str, ...], fmt: FormatLike, rounding: RoundingLike,
         overflow: Overflow | str, subnormals: bool, rng: np.random.Generator | None,
         out: np.ndarray | None = None) -> Any:
    ctx = Context(fmt, rounding, overflow=overflow, subnormals=subnormals, rng=rng)
    xs, all32, scalar, shape = _prepare(args, names)
    dt = np.dtype(np.float32) if all32 and ctx.fmt.fits_float32 else np.dtype(_F64)
    if out is not None:
        user = check_out(out, shape, dt)
        if _direct(user, tuple(xs)):  # also in place: an operand that is out itself
            getattr(ctx, op)(*xs, out=user.reshape(-1))
        else:
            np.copyto(user, getattr(ctx, op)(*xs, out=np.empty(user.size, dtype=dt)).reshape(shape))
        return user
    r = getattr(ctx, op)(*xs, out=np.empty(math.prod(shape), dtype=dt)).reshape(shape)
    return r[()] if scalar or r.ndim == 0 else r


def _no_fparray_out(out: Any, name: str) -> None:
    if out is not None:
        raise TypeError(f"{name}: out= needs fmt (it is not supported for FPArray operands with fmt=None)")


@ieee_mode
@returns_input_kind
def add(a: Any, b: Any, fmt: FormatLike | None = None, *, rounding: RoundingLike = "rne",
        overflow: Overflow | str = "ieee", subnormals: bool = True, rng: np.random.Generator | None = None,
        out: np.ndarray | None = None, as_dtype: bool = False) -> Any:
    """``a + b`` computed exactly and rounded once into ``fmt``; broadcasts like ``np.add``.

    Parameters
    ----------
    a, b : array_like or scalar
        Any float (or small integer) values. Operands that are values of ``fmt`` give the IEEE 754
        operation of that format; any other finite float64 operands still give one correct rounding of
        the exact result.
    fmt : Format or str, optional
        Target format: every registered format up to fp32 in every mode (see :func:`supports`); fp64
        with ``"rne"`` only. May be omitted when an operand is an :class:`fpsim.FPArray`: the array's
        format, mode and promotion rule apply and an FPArray is returned.
    rounding : {"rne", "rna", "rtz", "rup", "rdn", "rto", "sr"}
        Rounding mode of the single rounding.
    overflow : {"ieee", "saturate"}
        Overflow policy, as for :func:`fpsim.round`.
    subnormals : bool
        ``False`` flushes subnormal results to signed zero.
    rng : numpy.random.Generator, optional
        Random bits for ``"sr"`` (required for it).
    out : numpy.ndarray, optional
        Where to write the result, as NumPy ufuncs take it: a writeable ndarray of exactly the result's
        shape and dtype (float32 when all operands are float32 and ``fmt`` fits float32, else float64;
        no casting), which may be one of the operands (in place). The call returns ``out`` itself, with
        the same bits as without it, also for torch/JAX operands. Scalar operands give a 0-d result, so
        ``out`` then has shape ``()``. Not with ``as_dtype=True`` nor with ``fmt=None`` (FPArray operands).
    as_dtype : bool, optional
        ``True``: the result in the input library's own dtype of the format (ml_dtypes for NumPy input,
        ``torch.bfloat16``, ``jnp.float8_e4m3fn``, ...) instead of a float32/float64 carrier; applied at
        the API edge (``fpsim._interop.returns_input_kind``).
    Returns
    -------
    numpy.ndarray or numpy scalar
        float32 when all operands are float32 and ``fmt`` fits float32, else float64.

    Examples
    --------
    >>> import fpsim
    >>> float(fpsim.add(256, 1, "bf16"))              # 257 is a tie between 256 and 258: to even
    256.0
    >>> float(fpsim.add(256, 1, "bf16", rounding="rup"))
    258.0
    >>> float(fpsim.add(1.0, -1.0, "fp16", rounding="rdn"))  # exact zero sum under rdn
    -0.0

    In place, with ``out=`` (no new array):

    >>> import numpy as np
    >>> x = np.array([256.0, 1.0])
    >>> fpsim.add(x, 1.0, "bf16", rounding="rup", out=x) is x
    True
    >>> x.tolist()
    [258.0, 2.0]
    >>> fpsim.add(256.0, 1.0, "bf16", out=np.empty(()))     # scalar operands: a 0-d out
    array(256.)
    """
    if fmt is None:
        _no_fparray_out(out, "add")
        return _fparray_op("add", (a, b))
    return _run("add", (a, b), ("a", "b"), fmt, rounding, overflow, subnormals, rng, out)


@ieee_mode
@returns_input_kind
def sub(a: Any, b: Any, fmt: FormatLike | None = None, *, rounding: RoundingLike = "rne", overflow: Overflow | str = "ieee",
        subnormals: bool = True, rng: np.random.Generator | None = None,
        out: np.ndarray | None = None, as_dtype: bool = False) -> Any:
    """``a - b`` computed exactly and rounded once into ``fmt`` (see :func:`add`).

    >>> import fpsim
    >>> float(fpsim.sub(1.0, 2.0**-12, "fp16"))       # 1 - 2**-12 is a tie below 1: to even
    1.0
    >>> float(fpsim.sub(1.0, 2.0**-12, "fp16", rounding="rdn"))
    0.99951171875
    """
    if fmt is None:
        _no_fparray_out(out, "sub")
        return _fparray_op("sub", (a, b))
    return _run("sub", (a, b), ("a", "b"), fmt, rounding, overflow, subnormals, rng, out)


@ieee_mode
@returns_input_kind
def mul(a: Any, b: Any, fmt: FormatLike | None = None, *, rounding: RoundingLike = "rne", overflow: Overflow | str = "ieee",
        subnormals: bool = True, rng: np.random.Generator | None = None,
        out: np.ndarray | None = None, as_dtype: bool = False) -> Any:
    """``a * b`` computed exactly and rounded once into ``fmt`` (see :func:`add` for the parameters).

    >>> import fpsim
    >>> float(fpsim.mul(3.0, 1.0 / 3.0, "fp32"))     # 1/3 is a float64 here; the product is rounded once
    1.0
    >>> float(fpsim.mul(0.0, float("inf"), "fp16"))
    nan
    """
    if fmt is None:
        _no_fparray_out(out, "mul")
        return _fparray_op("mul", (a, b))
    return _run("mul", (a, b), ("a", "b"), fmt, rounding, overflow, subnormals, rng, out)


@ieee_mode
@returns_input_kind
def div(a: Any, b: Any, fmt: FormatLike | None = None, *, rounding: RoundingLike = "rne", overflow: Overflow | str = "ieee",
        subnormals: bool = True, rng: np.random.Generator | None = None,
        out: np.ndarray | None = None, as_dtype: bool = False) -> Any:
    """``a / b`` correctly rounded into ``fmt`` (see :func:`add` for the parameters).

    >>> import fpsim
    >>> float(fpsim.div(1, 3, "bf16")), float(fpsim.div(1, 3, "bf16", rounding="rup"))
    (0.333984375, 0.333984375)
    >>> float(fpsim.div(1, 3, "bf16", rounding="rtz"))
    0.33203125
    >>> float(fpsim.div(-1.0, 0.0, "fp16"))
    -inf
    """
    if fmt is None:
        _no_fparray_out(out, "div")
        return _fparray_op("div", (a, b))
    return _run("div", (a, b), ("a", "b"), fmt, rounding, overflow, subnormals, rng, out)


@ieee_mode
@returns_input_kind
def sqrt(a: Any, fmt: FormatLike | None = None, *, rounding: RoundingLike = "rne", overflow: Overflow | str = "ieee",
         subnormals: bool = True, rng: np.random.Generator | None = None,
        out: np.ndarray | None = None, as_dtype: bool = False) -> Any:
    """Square root correctly rounded into ``fmt`` (see :func:`add` for the parameters).

    >>> import fpsim
    >>> float(fpsim.sqrt(2, "bf16")), float(fpsim.sqrt(2, "bf16", rounding="rtz"))
    (1.4140625, 1.4140625)
    >>> float(fpsim.sqrt(-0.0, "fp16")), float(fpsim.sqrt(-1.0, "fp16"))
    (-0.0, nan)
    """
    if fmt is None:
        _no_fparray_out(out, "sqrt")
        return _fparray_op("sqrt", (a,))
    return _run("sqrt", (a,), ("a",), fmt, rounding, overflow, subnormals, rng, out)


@ieee_mode
@returns_input_kind
def fma(a: Any, b: Any, c: Any, fmt: FormatLike | None = None, *, rounding: RoundingLike = "rne",
        overflow: Overflow | str = "ieee", subnormals: bool = True, rng: np.random.Generator | None = None,
        out: np.ndarray | None = None, as_dtype: bool = False) -> Any:
    """Fused multiply-add ``a * b + c``, computed exactly and rounded once into ``fmt``.

    Exact for every finite input (fp32 operands included: their product is exact in float64 and the
    sum is an error-free TwoSum). Sign rules of IEEE 754: an exact zero result is ``+0`` (``-0`` under
    ``"rdn"``) unless the product and ``c`` are zeros of the same sign.

    >>> import fpsim
    >>> a = 1 + 2.0**-12                                   # a float32
    >>> float(fpsim.fma(a, a, -1.0, "fp32"))             # exact: 2**-11 + 2**-24, rounded once
    0.0004883408546447754
    >>> float(fpsim.sub(fpsim.mul(a, a, "fp32"), 1.0, "fp32"))  # the product's rounding loses 2**-24
    0.00048828125
    >>> float(fpsim.fma(2.0**-12, 2.0**-12, 1.0, "fp16", rounding="rup"))
    1.0009765625

    ``out=`` as for :func:`add`; float32 operands into fp32 give a float32 result, so ``out`` is float32
    (here the addend is overwritten, as an accumulator would be):

    >>> import numpy as np
    >>> acc = np.zeros(3, np.float32)
    >>> w = np.array([0.1, 0.2, 0.3], np.float32)
    >>> _ = fpsim.fma(w, w, acc, "fp32", out=acc)
    >>> acc.dtype.name, float(acc[2]) == float(np.float32(0.3) * np.float32(0.3))
    ('float32', True)

    With float32 or float64 operands the compiled path (fpsim/_carith.c: two hardware FMAs rounded upward
    and downward give the round-to-odd float64 of the exact result, then one rounding) is used where built;
    ``fpsim.arith.use_c_arith = False`` forces the NumPy reference below, with the same bits.
    """
    if fmt is None:
        _no_fparray_out(out, "fma")
        return _fparray_op("fma", (a, b, c))
    return _run("fma", (a, b, c), ("a", "b", "c"), fmt, rounding, overflow, subnormals, rng, out)


_LB = 26  # limb width of the exact fp64 FMA
_NL = 9  # limbs: 165 bits of aligned sum plus headroom for carries and the normalising shift


def _carry(limbs: np.ndarray) -> None:
    """Normalise int64 limbs in place to [0, 2**26) each, the carry (signed) ending in the top limb."""
    mask = (1 << _LB) - 1
    for j in range(limbs.shape[0] - 1):
        c = limbs[j] >> _LB
        limbs[j] &= mask
        limbs[j + 1] += c


def _fma64_wide(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """RN64(a*b + c) for finite a, b != 0 and finite c of any magnitude, in int64 limbs (vectorised).

    With x = M_x 2**q_x (M_x in [2**52, 2**53), as frexp normalises subnormals too): a product far below c's
    last bit (more than 110 bits) leaves c; an addend far below the product's last bit (more than 58 bits)
    acts only as a sticky bit of its sign. Otherwise the exact sum fits 165 bits; its top 55 bits and a sticky
    bit are rounded once, to 53 bits or to the subnormal grid 2**-1074.
    """
    n = a.shape[0]
    ma, ea = np.frexp(a)
    mb, eb = np.frexp(b)
    mc, ec = np.frexp(c)
    Ma = np.abs(np.ldexp(ma, 53)).astype(np.int64)
    Mb = np.abs(np.ldexp(mb, 53)).astype(np.int64)
    Mc = np.abs(np.ldexp(mc, 53)).astype(np.int64)
    qp = ea.astype(np.int64) + eb - 106
    qc = ec.astype(np.int64) - 53
    sp = np.where((a < 0) != (b < 0), -1, 1).astype(np.int64)
    sc = np.where(c < 0, -1, 1).astype(np.int64)
    czero = c == 0
    far_c = ~czero & (qc - qp > 110)  # the product cannot move c
    sticky_c = ~czero & (qp - qc > 58)  # c is below half the product's last bit: keep its sign only
    Mc = np.where(sticky_c, 1, np.where(czero, 0, Mc))
    qc = np.where(sticky_c, qp - 2, np.where(czero, qp, qc))
    q0 = np.minimum(qp, qc)
    mask = (1 << _LB) - 1
    limbs = np.zeros((_NL, n), dtype=np.int64)
    cols = np.arange(n)
    # product limbs: (a2 a1 a0) x (b2 b1 b0) in base 2**26, shifted by qp - q0 bits
    al = [Ma & mask, (Ma >> _LB) & mask, Ma >> (2 * _LB)]
    bl = [Mb & mask, (Mb >> _LB) & mask, Mb >> (2 * _LB)]
    prod = np.zeros((6, n), dtype=np.int64)
    for i in range(3):
        for j in range(3):
            prod[i + j] += al[i] * bl[j]
    _carry(prod)

    def place(src: np.ndarray, shift: np.ndarray, sign: np.ndarray) -> None:
        w, r = shift // _LB, shift % _LB
        part = np.zeros((src.shape[0] + 1, n), dtype=np.int64)
        part[:-1] = src << r
        _carry(part)
        for k in range(part.shape[0]):
            rows = np.minimum(k + w, _NL - 1)
            limbs[rows, cols] += sign * part[k]

    place(prod, qp - q0, sp)
    cl = np.stack([Mc & mask, (Mc >> _LB) & mask, Mc >> (2 * _LB)])
    place(np.where(far_c, 0, cl), np.where(far_c, 0, qc - q0), sc)
    _carry(limbs)
    neg = limbs[-1] < 0
    limbs = np.where(neg, -limbs, limbs)
    _carry(limbs)
    nz = limbs != 0
    zero = ~nz.any(axis=0)
    h = (_NL - 1) - np.argmax(nz[::-1], axis=0)  # top nonzero limb
    top = limbs[h, cols]
    bl_top = np.floor(np.log2(np.maximum(top, 1).astype(np.float64))).astype(np.int64)  # exact for < 2**26
    sh = (_LB - 1) - bl_top  # left shift that puts the leading bit at position 25 of limb h
    t2 = limbs[h, cols] << sh
    t1 = np.where(h >= 1, limbs[np.maximum(h - 1, 0), cols], 0) << sh
    t0 = np.where(h >= 2, limbs[np.maximum(h - 2, 0), cols], 0) << sh
    tm = np.where(h >= 3, limbs[np.maximum(h - 3, 0), cols], 0) << sh
    # the three shifted limbs as one normalised 78-bit window t2|t1|t0 (t2 holds exactly 26 bits now)
    t0, tm = t0 + (tm >> _LB), tm & mask
    t1, t0 = t1 + (t0 >> _LB), t0 & mask
    t2, t1 = t2 + (t1 >> _LB), t1 & mask
    tt = (t2 << 29) | (t1 << 3) | (t0 >> 23)  # top 55 bits
    low = (t0 & ((1 << 23) - 1)) != 0
    below = np.zeros(n, dtype=bool)
    for j in range(_NL):
        below |= (j < h - 3) & (limbs[j] != 0)  # limbs under the four read above
    sticky = low | (tm != 0) | below
    lead = q0 + _LB * h + bl_top  # exponent of the leading bit
    u = np.maximum(lead - 52, -1074)  # exponent of the result's last bit
    drop = u - (lead - 54)  # bits of tt below the last bit (>= 2)
    big = drop >= 62
    dr = np.where(big, 2, drop)
    qv = tt >> dr
    rem = tt & ((np.int64(1) << dr) - 1)
    half = np.int64(1) << (dr - 1)
    up = (rem > half) | ((rem == half) & (sticky | ((qv & 1) == 1)))
    qv = np.where(big, 0, qv + up)
    with np.errstate(over="ignore"):
        res = np.ldexp(qv.astype(np.float64), u.astype(np.int32))
    res = np.where(neg, -res, res)
    res = np.where(zero, 0.0, res)
    return np.where(far_c, c, res)


def _fma_fp64_fast(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """RN64(a*b + c) by Boldo and Melquiond's RN(th + RO(tl + pl)) with Dekker's TwoProduct.

    Exact only where nothing over- or underflows: |a|, |b|, |a*b| in [2**-900, 2**900] and |c| <= 2**900
    (then the result is normal, and neither the split nor the error terms leave float64's range).
    """
    ph, pl = _two_prod(a, b)
    th, tl = _two_sum(c, ph)
    ws, we = _two_sum(tl, pl)
    v = np.where(ws == 0, ws, _round_to_odd(np.where(ws == 0, 1.0, ws), we))
    return np.asarray(th + v)


def _fma_fp64(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """RN64(a*b + c) for any float64 operands (IEEE 754 fusedMultiplyAdd, roundTiesToEven).

    Operands inside 2**+-900 take the error-free transformations (`_fma_fp64_fast`); other finite ones
    with a nonzero product the exact int64-limb FMA (`_fma64_wide`). A zero or non-finite product and
    non-finite operands follow float64's own ``a*b + c``, except that a finite product (which may
    overflow in float64 although it is finite) plus an infinite ``c`` is ``c``.
    """
    p = a * b
    ap = np.abs(p)
    aa = np.abs(a)
    ab = np.abs(b)
    safe = (ap >= _TINY) & (ap <= _HUGE) & (np.abs(c) <= _HUGE)
    safe &= (aa >= _TINY) & (aa <= _HUGE) & (ab >= _TINY) & (ab <= _HUGE)
    if safe.all():
        return _fma_fp64_fast(a, b, c)
    out = p + c  # IEEE specials: NaN propagation, inf*0, inf - inf, zero products and their signs
    if safe.any():
        out[safe] = _fma_fp64_fast(a[safe], b[safe], c[safe])
    fin = ~safe & np.isfinite(a) & np.isfinite(b)
    inf_c = fin & np.isinf(c)
    out[inf_c] = c[inf_c]  # a finite exact product cannot cancel an infinity
    wide = fin & np.isfinite(c) & (a != 0) & (b != 0)
    if wide.any():
        out[wide] = _fma64_wide(a[wide], b[wide], c[wide])
    return np.asarray(out)


# --------------------------------------------------------------------------------------------------
# A pre-parsed arithmetic context for the layers above (FPArray, summation orders): the format, mode and
# options are validated once, and small arrays skip the per-call set-up of `fpsim.round`.

_CH = 1 << 15  # elements per chunk: the temporaries of the error-free transformations stay in cache

try:  # compiled hot paths (fpsim/_carith.c); the NumPy code here stays the reference and fallback
    from . import _carith  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - exercised where no compiler was available
    _carith = None

use_c_arith = _carith is not None
"""Whether :func:`fma` (and :meth:`Context.fma`) use the compiled RO53 of fpsim/_carith.c (set False to
force the NumPy reference); the results are the same bits."""


def _direct(out: np.ndarray, xs: tuple[np.ndarray, ...]) -> bool:
    """Whether results can be written straight into ``out`` chunk by chunk: it is C-contiguous, and every
    operand either shares no memory with it or is the same memory element for element (in place)."""
    if not out.flags.c_contiguous:
        return False
    for x in xs:
        if np.may_share_memory(x, out) and not (
                x.flags.c_contiguous and x.dtype == out.dtype and x.shape == out.shape
                and x.ctypes.data == out.ctypes.data):
            return False
    return True


class Context:
    """Correctly rounded arithmetic in one format and mode, on float64 arrays, with low per-call overhead.

    The public functions (:func:`add`, ...) and the layers above (:class:`fpsim.FPArray`,
    :mod:`fpsim.accumulate`, whose loops make many small calls) all go through it: the format, mode and
    options are validated once, and large arrays are processed in cache-sized chunks. Operands are float64
    NumPy arrays of one shape (no broadcasting here); results are new float64 arrays of that shape. With
    ``exact_inputs=True`` the caller promises that the operands are values of the format, which enables
    the plain-float64 shortcut for round-to-nearest-even in formats with ``p <= 25`` (double rounding is
    innocuous there). Every operation (and :meth:`round`) takes ``out=``: a writeable ndarray of the
    operands' shape, float64 (or float32 for a format that fits float32), which may be an operand (in place);
    the result is written there and ``out`` returned.

    >>> import numpy as np, fpsim
    >>> ctx = fpsim.arith.Context("bf16", "rup")
    >>> ctx.add(np.array([256.0]), np.array([1.0]))
    array([258.])
    >>> s = np.array([256.0, 1.0])
    >>> ctx.add(s, np.array([1.0, 1.0]), out=s) is s, s.tolist()
    (True, [258.0, 2.0])
    """

    def __init__(self, fmt: FormatLike, rounding: RoundingLike = "rne", *, overflow: Overflow | str = "ieee",
                 subnormals: bool = True, rng: np.random.Generator | None = None) -> None:
        from . import rounding as _r

        self.fmt, self.mode, self.overflow = _parse(fmt, rounding, overflow, subnormals, rng)
        self.subnormals = bool(subnormals)
        self.rng = rng
        self.native = _is_fp64(self.fmt)
        self._rdn = self.mode is Rounding.RDN
        self._shortcut = self.mode is Rounding.RNE and self.fmt.p <= 25
        self._bounded = self.fmt.emax <= 500 and self.fmt.emin - self.fmt.mbits >= -500
        # fp32 with IEEE options in rne/rtz/rup: the compiled fma casts its RO53 result in that hardware mode
        f = self.fmt
        ieee32 = (f.p == 24 and f.emin == -126 and f.emax == 127 and f.has_inf and f.has_nan and f.subnormals
                  and f.signed_zero and self.subnormals and self.overflow is Overflow.IEEE)
        self._hw32 = {Rounding.RNE: 0, Rounding.RTZ: 1, Rounding.RUP: 2}.get(self.mode) if ieee32 else None
        self._plan = None if self.native else _r._plan(_r._F64, self.fmt, self.mode, self.overflow,
                                                        self.subnormals and self.fmt.subnormals, None)
        # The compiled kernel of fpsim.rounding when present (same results as the NumPy kernel, less
        # overhead per call); its parameters are computed once here.
        self._cparams = None
        if self._plan is not None and getattr(_r, "_ckernel", None) is not None and hasattr(_r, "_c_params"):
            try:
                self._cparams = _r._c_params(self._plan)
            except Exception:  # noqa: BLE001  # pragma: no cover - an incompatible kernel: NumPy one
                self._cparams = None

    # -- rounding -----------------------------------------------------------------------------------
    def _round_chunk(self, x: np.ndarray) -> np.ndarray:
        """Round a contiguous 1-D float64 array (a chunk of _CH elements, or 4 _CH for the compiled fma)."""
        from . import rounding as _r

        bits = x.view(_U64)
        if self._cparams is not None and _r.use_c_kernel:
            res = np.empty_like(bits)
            rand = None if self.mode is not Rounding.SR else _r._random_words(self.rng, bits.size, _r._F64)  # type: ignore[arg-type]
            _r._ckernel.round_bits(bits, res, rand, self._cparams)  # type: ignore[attr-defined]
            return np.asarray(res.view(_F64))
        with np.errstate(invalid="ignore"):
            return np.asarray(_r._kernel(bits, self._plan, self.rng).view(_F64))  # type: ignore[arg-type]

    def _native(self, x: np.ndarray) -> np.ndarray:
        """fp64: the float64 result is already the IEEE one; apply the flush and saturation options."""
        if not self.subnormals:
            x = np.where((np.abs(x) < self.fmt.min_normal) & (x != 0), np.copysign(0.0, x), x)
        if self.overflow is Overflow.SATURATE:
            x = np.clip(x, -self.fmt.max, self.fmt.max)
        return x

    def round(self, x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
        """Round float64 values (exact values, or RO53 of exact results) into the format."""
        return self._apply(lambda v: v, x, out=out)

    def _out(self, out: np.ndarray | None, shape: tuple[int, ...], xs: tuple[np.ndarray, ...]
             ) -> tuple[np.ndarray | None, np.ndarray | None]:
        """(the user's out checked, the flat array to write into): out itself where that is safe, else None
        (results go to a new array, copied into out at the end)."""
        if out is None:
            return None, None
        dt = out.dtype if out.dtype == np.float32 and self.fmt.fits_float32 else _F64
        res = check_out(out, shape, dt)
        return res, (res.reshape(-1) if _direct(res, xs) else None)

    def _apply(self, core: Callable[..., np.ndarray], *xs: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """round(core(*chunk)) over cache-sized chunks of same-shaped float64 operands, into ``out``
        (float64, or float32 for a format that fits it) when given."""
        shape = xs[0].shape
        user, dst = self._out(out, shape, xs)
        flat = [x.reshape(-1) for x in xs]  # float32 operands are widened chunk by chunk (in cache)
        n = flat[0].size
        with np.errstate(all="ignore"):
            if n <= _CH and dst is None:
                r = np.ascontiguousarray(core(*[np.asarray(f, dtype=_F64) for f in flat]), dtype=_F64)
                res = self._native(r) if self.native else self._round_chunk(r)
                if user is None:
                    return res.reshape(shape)
                np.copyto(user, res.reshape(shape))
                return user
            buf = dst if dst is not None else np.empty(n, dtype=_F64 if user is None else user.dtype)
            for i in range(0, n, _CH):
                r = np.ascontiguousarray(core(*[np.asarray(f[i : i + _CH], dtype=_F64) for f in flat]), dtype=_F64)
                buf[i : i + _CH] = self._native(r) if self.native else self._round_chunk(r)
        if user is None:
            return buf.reshape(shape)
        if dst is None:
            np.copyto(user, buf.reshape(shape))
        return user

    # -- operations ---------------------------------------------------------------------------------
    # Each takes ``out=``: a writeable ndarray of the operands' shape, float64 (or float32 when the format
    # fits it), which may be one of the operands; the result is written there and ``out`` returned.
    def add(self, a: np.ndarray, b: np.ndarray, *, exact_inputs: bool = False,
            out: np.ndarray | None = None) -> np.ndarray:
        """a + b, rounded once."""
        if a.size == 1 and b.size == 1 and a.shape == b.shape and not self.native:
            # one element (a 1-D running sum): the same TwoSum and round-to-odd on Python floats
            r = _add_ro_scalar(float(a.reshape(-1)[0]), float(b.reshape(-1)[0]), self._rdn)
            if r is not None:
                res = self._round_chunk(np.full(1, r)).reshape(a.shape)
                if out is None:
                    return res
                user = self._out(out, a.shape, ())[0]
                assert user is not None
                np.copyto(user, res)
                return user
        if self.native or (exact_inputs and self._shortcut):
            return self._apply(np.add, a, b, out=out)
        rdn = self._rdn
        return self._apply(lambda x, y: _add_ro(x, y, rdn), a, b, out=out)

    def sub(self, a: np.ndarray, b: np.ndarray, *, exact_inputs: bool = False,
            out: np.ndarray | None = None) -> np.ndarray:
        """a - b, rounded once."""
        return self.add(a, -b, exact_inputs=exact_inputs, out=out)

    def mul(self, a: np.ndarray, b: np.ndarray, *, exact_inputs: bool = False,
            out: np.ndarray | None = None) -> np.ndarray:
        """a * b, rounded once."""
        if self.native:
            return self._apply(np.multiply, a, b, out=out)
        known_short = (exact_inputs and self.fmt.p <= 26) or (a.dtype == np.float32 and b.dtype == np.float32)
        return self._apply(lambda x, y: _mul_ro(x, y, known_short or (_short(x) and _short(y))), a, b, out=out)

    def div(self, a: np.ndarray, b: np.ndarray, *, exact_inputs: bool = False,
            out: np.ndarray | None = None) -> np.ndarray:
        """a / b, rounded once."""
        if self.native or (exact_inputs and self._shortcut):
            return self._apply(np.divide, a, b, out=out)
        return self._apply(_div_ro, a, b, out=out)

    def sqrt(self, a: np.ndarray, *, exact_inputs: bool = False, out: np.ndarray | None = None) -> np.ndarray:
        """Square root, rounded once."""
        if self.native or (exact_inputs and self._shortcut):
            return self._apply(np.sqrt, a, out=out)
        return self._apply(_sqrt_ro, a, out=out)

    def fma(self, a: np.ndarray, b: np.ndarray, c: np.ndarray, *, exact_inputs: bool = False,
            out: np.ndarray | None = None) -> np.ndarray:
        """a * b + c, rounded once."""
        if self.native:
            return self._apply(_fma_fp64, a, b, c, out=out)
        if use_c_arith and _carith is not None and a.shape == b.shape == c.shape:
            return self._fma_c(a, b, c, out)
        return self._fma_numpy(a, b, c, exact_inputs=exact_inputs, out=out)

    def _fma_numpy(self, a: np.ndarray, b: np.ndarray, c: np.ndarray, *, exact_inputs: bool = False,
                   out: np.ndarray | None = None) -> np.ndarray:
        """The NumPy reference of :meth:`fma` (error-free transformations; see the module docstring)."""
        f32 = a.dtype == np.float32 and b.dtype == np.float32
        known_short = (exact_inputs and self.fmt.p <= 26) or f32
        bounded = f32 or (exact_inputs and self._bounded)
        rdn = self._rdn
        return self._apply(
            lambda x, y, z: _fma_ro(x, y, z, known_short or (_short(x) and _short(y)), rdn, bounded), a, b, c,
            out=out)

    def _fma_c(self, a: np.ndarray, b: np.ndarray, c: np.ndarray, out: np.ndarray | None) -> np.ndarray:
        """:meth:`fma` through the compiled RO53 (fpsim/_carith.c): two hardware FMAs rounded upward and
        downward give the round-to-odd float64 of the exact result for any operands; fp32 targets in
        rne/rtz/rup are then one cast, others one call of the rounding kernel per chunk."""
        assert _carith is not None
        shape = a.shape
        user, dst = self._out(out, shape, (a, b, c))
        in32 = a.dtype == b.dtype == c.dtype == np.float32
        dt = np.float32 if in32 else _F64
        fa, fb, fc = (np.ascontiguousarray(x, dtype=dt).reshape(-1) for x in (a, b, c))
        n = fa.size
        buf = dst if dst is not None else np.empty(n, dtype=_F64 if user is None else user.dtype)
        if self._hw32 is not None and buf.flags.c_contiguous:  # fp32: the hardware cast is the rounding
            _carith.fma_ro(fa, fb, fc, buf, int(in32), self._hw32, int(buf.dtype == _F64))
        else:
            ch = 4 * _CH  # the RO53 chunk is the only temporary: larger chunks, fewer calls
            ro = np.empty(min(n, ch))
            with np.errstate(all="ignore"):
                for i in range(0, n, ch):
                    j = min(n, i + ch)
                    r = ro[: j - i]
                    _carith.fma_ro(fa[i:j], fb[i:j], fc[i:j], r, int(in32), 0)
                    if self._rdn:
                        r = _fma_zero_sign(r, fa[i:j], fb[i:j], fc[i:j], True)
                    buf[i:j] = self._round_chunk(np.ascontiguousarray(r))
        if user is None:
            return buf.reshape(shape)
        if dst is None:
            np.copyto(user, buf.reshape(shape))
        return user
