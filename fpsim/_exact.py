"""Exact rationals: text in and out, and the integer arithmetic that rounds them (behind ``fpsim round``).

:func:`parse_decimal` reads a number written as text (decimal, hexadecimal float, ``a/b``) into its exact
value, never through float64; :func:`decimal_str`, :func:`fraction_str` and :func:`int_str` write exact values
back as text of any length. :func:`floor_log2`, :func:`div_pow2`, :func:`is_float64` and :func:`draw_below` are
the exact integer steps of :func:`fpsim.rounding.round_rational`, which rounds an exact rational once (it lives
in `rounding` because :func:`fpsim.round` calls it for an int, Fraction or Decimal that no float64 holds).

Where it sits (the foundation is a line; each module imports only those before it)::

    _names, _checks, _fpenv  ->  formats  ->  _interop  ->  _carrier  ->  _exact  ->  rounding  ->  bits  ->  _grid

It imports nothing of fpsim.

>>> parse_decimal("0x1.8p1"), fraction_str(parse_decimal("1/3"))
(Fraction(3, 1), '1/3')
"""

from __future__ import annotations

import math
import numbers
import re
from decimal import Decimal
from fractions import Fraction
from typing import Union

import numpy as np

__all__ = ["parse_decimal", "decimal_str", "fraction_str", "int_str", "MAX_DIGITS", "MAX_EXPONENT", "RationalLike",
           "floor_log2", "div_pow2", "is_float64", "draw_below"]

RationalLike = Union[Fraction, int, float, Decimal]

MAX_DIGITS = 100_000
"""Most digits :func:`parse_decimal` reads (a bound on time and memory, far beyond any format's need)."""

MAX_EXPONENT = 100_000
"""Largest magnitude of the decimal exponent of a parsed value (``1e-100000`` .. ``9e100000``); every format's
range is inside ±330, so values out there round exactly as the bound would, but they are refused instead."""

_DEC = re.compile(r"([+-]?)([0-9]*)(?:\.([0-9]*))?(?:[eE]([+-]?[0-9]+))?")
_HEX = re.compile(r"([+-]?)0[xX]([0-9a-fA-F]*)(?:\.([0-9a-fA-F]*))?(?:[pP]([+-]?[0-9]+))?")
_FRAC = re.compile(r"([+-]?)([0-9]+)/([0-9]+)")
_SPECIAL = {"inf": math.inf, "infinity": math.inf, "nan": math.nan}


def _short(text: str) -> str:
    return repr(text) if len(text) <= 60 else repr(text[:40] + "...") + f" ({len(text)} characters)"


def _int10(digits: str) -> int:
    """int(digits) for any length: Python refuses str -> int beyond 4300 digits (sys.int_info), so split."""
    if len(digits) <= 4000:
        return int(digits or "0")
    half = len(digits) // 2
    return _int10(digits[:half]) * int(10 ** (len(digits) - half)) + _int10(digits[half:])


def _exponent(s: str | None, text: str) -> int:
    if not s:
        return 0
    if len(s.lstrip("+-").lstrip("0")) > 9:  # int() of a huge exponent string would itself be slow
        raise ValueError(f"exponent of {_short(text)} is out of range (at most {MAX_EXPONENT} in magnitude)")
    return int(s)


def parse_decimal(text: str) -> Fraction | float:
    """The exact value of a number written as text.

    Accepted (surrounding white space ignored, ASCII digits only):

    - decimals with any number of digits and an optional exponent: ``0.1``, ``-1.5e-3``, ``1e-400``, ``.5``;
    - hexadecimal floats as C99 and ``float.hex`` write them: ``0x1.8p-3``, ``-0X1P+10``, ``0x.8p1``, ``0x10``;
    - fractions of two decimal integers: ``1/3``, ``-22/7``;
    - ``inf``, ``infinity``, ``nan`` with an optional sign (returned as floats).

    Returns a `fractions.Fraction` for finite values, except negative zero (``-0``, ``-0x0p0``), returned as the
    float ``-0.0`` so that its sign survives. Bad text raises ``ValueError`` naming it; more than
    :data:`MAX_DIGITS` digits or a decimal exponent beyond :data:`MAX_EXPONENT` raise ``ValueError`` too.

    Examples
    --------
    >>> parse_decimal("1.00048828125000000001")
    Fraction(100048828125000000001, 100000000000000000000)
    >>> parse_decimal("0x1.8p-3"), parse_decimal("1/3"), parse_decimal("-inf")
    (Fraction(3, 16), Fraction(1, 3), -inf)
    >>> parse_decimal("1e-400") == Fraction(1, 10**400)
    True
    """
    if not isinstance(text, str):
        raise TypeError(f"parse_decimal takes a str, got {type(text).__name__}: {text!r}")
    s = text.strip()
    low = s.lower()
    sign_s, body = (low[0], low[1:]) if low[:1] in ("+", "-") else ("", low)
    if body in _SPECIAL:
        v = _SPECIAL[body]
        return -v if sign_s == "-" else v
    m = _HEX.fullmatch(s)
    if m is not None:
        sign, ip, fp, ex = m.group(1), m.group(2), m.group(3) or "", m.group(4)
        if not (ip or fp):
            raise ValueError(f"not a number: {_short(text)} (a hex float needs digits after 0x)")
        if len(ip) + len(fp) > MAX_DIGITS:
            raise ValueError(f"{_short(text)} has more than {MAX_DIGITS} digits")
        mant = int((ip + fp) or "0", 16)
        e2 = _exponent(ex, text) - 4 * len(fp)
        if mant and abs(e2 + mant.bit_length()) > MAX_EXPONENT * 10 // 3 + 4:  # 10**MAX_EXPONENT in binary
            raise ValueError(f"exponent of {_short(text)} is out of range (at most 2**±{MAX_EXPONENT * 10 // 3})")
        return _signed(sign, Fraction(mant * 2**e2) if e2 >= 0 else Fraction(mant, 2**-e2))
    m = _FRAC.fullmatch(s)
    if m is not None:
        sign, a, b = m.groups()
        if len(a) + len(b) > MAX_DIGITS:
            raise ValueError(f"{_short(text)} has more than {MAX_DIGITS} digits")
        den = _int10(b)
        if den == 0:
            raise ValueError(f"not a number: {_short(text)} (division by zero)")
        return _signed(sign, Fraction(_int10(a), den))
    m = _DEC.fullmatch(s)
    if m is None or not (m.group(2) or m.group(3)):
        raise ValueError(f"not a number: {_short(text)} (expected a decimal like 0.1 or 1e-8, a hex float like "
                         "0x1.8p-3, a fraction like 1/3, inf or nan)")
    sign, ip, fp, ex = m.group(1), m.group(2), m.group(3) or "", m.group(4)
    digits = (ip + fp).lstrip("0")
    if len(digits) > MAX_DIGITS:
        raise ValueError(f"{_short(text)} has more than {MAX_DIGITS} significant digits")
    e10 = _exponent(ex, text) - len(fp)
    if digits:
        digits_t = digits.rstrip("0")  # trailing zeros move into the exponent: 1000e-3 is cheap
        e10 += len(digits) - len(digits_t)
        lead = e10 + len(digits_t) - 1  # decimal exponent of the leading digit
        if abs(lead) > MAX_EXPONENT:
            raise ValueError(f"exponent of {_short(text)} is out of range (at most {MAX_EXPONENT} in magnitude)")
        n = _int10(digits_t)
        return _signed(sign, Fraction(n * 10**e10) if e10 >= 0 else Fraction(n, 10**-e10))
    return _signed(sign, Fraction(0))


def _signed(sign: str, q: Fraction) -> Fraction | float:
    if sign == "-":
        return -0.0 if q == 0 else -q
    return q


def decimal_str(q: Fraction | float) -> str | None:
    """The exact decimal expansion of ``q`` (``"0.1"``, ``"-1.5e-400"``), or None when it has none (``1/3``).

    Finite expansions exist exactly when the reduced denominator has no prime factor but 2 and 5 (every
    binary float has one). Plain notation when the exponent is modest, scientific otherwise; ``inf``/``nan``
    for floats that are.

    >>> decimal_str(Fraction(3, 16)), decimal_str(Fraction(1, 3)), decimal_str(2.0**-24)
    ('0.1875', None, '5.9604644775390625e-8')
    """
    if isinstance(q, float):
        if not math.isfinite(q):
            return repr(q)
        if q == 0:
            return "-0" if math.copysign(1.0, q) < 0 else "0"
        q = Fraction(q)
    if q == 0:
        return "0"
    neg = q < 0
    n, d = abs(q.numerator), q.denominator
    a = (d & -d).bit_length() - 1  # powers of 2 in d
    d >>= a
    b = 0
    pows = [5]  # 5**(2**i): strip the factors of 5 in O(log) big divisions, not one by one
    while pows[-1].bit_length() * 2 <= d.bit_length() + 1:
        pows.append(pows[-1] ** 2)
    for i in reversed(range(len(pows))):
        if d % pows[i] == 0:
            d //= pows[i]
            b += 1 << i
    if d != 1:
        return None
    k = max(a, b)  # q = n * 2**(k-a) * 5**(k-b) / 10**k
    digits = int_str(n * 2 ** (k - a) * 5 ** (k - b))
    # strip trailing zeros of the integer part into the exponent
    t = digits.rstrip("0")
    e = len(digits) - len(t) - k  # value = int(t) * 10**e
    lead = e + len(t) - 1
    if -7 <= lead < 21:
        if e >= 0:
            s = t + "0" * e
        elif lead >= 0:
            s = t[: lead + 1] + "." + t[lead + 1:]
        else:
            s = "0." + "0" * (-lead - 1) + t
    else:
        s = t[0] + ("." + t[1:] if len(t) > 1 else "") + f"e{lead}"
    return ("-" if neg else "") + s


def int_str(n: int) -> str:
    """``str(n)`` for any size (Python refuses int -> str beyond 4300 digits; this splits instead)."""
    if n < 0:
        return "-" + int_str(-n)
    if n.bit_length() <= 13000:  # about 3900 digits: within the limit
        return str(n)
    out = []
    while n:
        n, r = divmod(n, 10**3000)
        out.append(str(r).rjust(3000, "0") if n else str(r))
    return "".join(reversed(out))


def fraction_str(q: Fraction) -> str:
    """``"num/den"`` (``"num"`` for an integer) for any size."""
    return int_str(q.numerator) if q.denominator == 1 else f"{int_str(q.numerator)}/{int_str(q.denominator)}"


# --------------------------------------------------------------------------------------------------
# Exact integer steps of rounding.round_rational


def floor_log2(num: int, den: int) -> int:
    """floor(log2(num / den)) for positive integers."""
    e = num.bit_length() - den.bit_length()
    if (num << -e if e < 0 else num) < (den << e if e > 0 else den):
        e -= 1
    return e


def div_pow2(num: int, den: int, s: int) -> tuple[int, int, int]:
    """(m, rem, d) with num / den / 2**s = m + rem / d, 0 <= rem < d."""
    n, d = (num, den << s) if s >= 0 else (num << -s, den)
    m, rem = divmod(n, d)
    return m, rem, d


def is_float64(num: int, den: int, E: int) -> bool:
    """Whether num/den (positive, floor(log2) = E, within float64's exponent range) is a float64."""
    if den & (den - 1) or E > 1023:
        return False  # not dyadic, or too large
    lsb = max(E, -1022) - 52  # float64 quantum at that magnitude
    k = den.bit_length() - 1  # num / 2**k
    return k <= -lsb or num % (1 << (k + lsb)) == 0


def draw_below(rem: int, d: int, rng: np.random.Generator) -> bool:
    """True with probability exactly rem/d (0 < rem < d): a uniform U in [0, 1), drawn 64 bits at a time,
    compared with rem/d digit by digit in base 2**64 until they differ."""
    n = rem
    while True:
        w = int(rng.integers(0, 1 << 64, dtype=np.uint64, endpoint=False))
        digit, n = divmod(n << 64, d)
        if w != digit:
            return w < digit
        if n == 0:
            return False  # U >= rem/d exactly from here on
