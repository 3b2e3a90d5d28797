"""Floating-point formats: the `Format` dataclass and the registry of named formats.

Every limit is derived from a handful of defining fields (exponent bits, mantissa bits, bias and the
special-value flags), never tabulated by hand. Formats are parsed once at the API edge with
:func:`as_format`; code below the edge works with `Format` objects and their capability flags.

Where it sits (the foundation is a line; each module imports only those before it)::

    _names, _checks, _fpenv  ->  formats  ->  _interop  ->  _carrier  ->  _exact  ->  rounding  ->  bits  ->  _grid

This module is data and derivations: at module level it imports nothing of fpsim but ``_names`` and ``_fpenv``.
The value-level conveniences (:meth:`Format.values`, :meth:`Format.ulp`, :meth:`Format.next_up`,
:meth:`Format.next_down`) need the rounding kernel and the bit codec, so their implementations live in
``fpsim._grid`` and each method imports it in its body when called.
"""

from __future__ import annotations

import enum
import math
import struct
from dataclasses import dataclass, field
from typing import Any, Union

import numpy as np

from ._fpenv import ieee_mode
from ._names import norm_name

__all__ = [
    "NaNEncoding",
    "Format",
    "FormatLike",
    "as_format",
    "register",
    "format_names",
    "all_formats",
    "fp64",
    "fp32",
    "tf32",
    "fp16",
    "bf16",
    "fp8_e4m3",
    "fp8_e5m2",
    "fp8_e4m3fnuz",
    "fp8_e5m2fnuz",
    "fp6_e2m3",
    "fp6_e3m2",
    "fp4_e2m1",
    "e8m0",
    "fp8_e4m3_ieee",
    "fp8_e3m4",
    "fp8_e4m3b11fnuz",
    "ue5m3",
    "hif8",
]


class NaNEncoding(str, enum.Enum):
    """How a format encodes NaN.

    ``IEEE``: every pattern with an all-ones exponent and a nonzero mantissa (fp16, bf16, fp8_e5m2).
    ``ALL_ONES``: only the all-ones exponent-and-mantissa pattern of each sign (OCP fp8_e4m3, e8m0).
    ``NEG_ZERO``: the single pattern that would be −0 (the *fnuz* formats, which have no −0).
    ``NONE``: no NaN at all (the OCP MX fp6 and fp4 element formats).
    """

    IEEE = "ieee"
    ALL_ONES = "all_ones"
    NEG_ZERO = "neg_zero"
    NONE = "none"


def _pow2(e: int) -> float:
    """2**e exactly. Below float64's normal range it is built from its bit pattern: ``math.ldexp`` gives 0
    there in a thread that flushes subnormals (FTZ), and a format's limits must not depend on the FPU mode."""
    if e >= -1022:
        return math.ldexp(1.0, e)
    if e < -1074:
        return 0.0
    return float(struct.unpack("<d", struct.pack("<Q", 1 << (e + 1074)))[0])


@dataclass(frozen=True)
class Format:
    """A binary floating-point format, defined by its bit layout and special-value rules.

    Parameters
    ----------
    name : str
        Registry name (``"bf16"``) or a descriptive name for a custom format.
    ebits, mbits : int
        Exponent and stored mantissa (fraction) bits. The precision is ``p = mbits + 1``.
    bias : int, optional
        Exponent bias; defaults to ``2**(ebits-1) - 1``.
    has_inf : bool
        Whether the all-ones exponent with a zero mantissa encodes ±infinity.
    nan : NaNEncoding or str
        How NaN is encoded (see :class:`NaNEncoding`).
    signed_zero : bool
        Whether −0 exists (False for the fnuz formats: −0 becomes +0).
    subnormals : bool
        Whether the format has subnormal numbers (gradual underflow).
    signed : bool
        Whether there is a sign bit (False for the e8m0 scale format).
    has_zero : bool
        Whether zero is representable. When False (e8m0), the all-zeros exponent encodes the
        smallest normal power of two ``2**-bias``.
    table : tuple of float, optional
        For a format that no exponent/mantissa layout describes (tapered precision, as HiF8): the magnitude of
        every code with the sign bit clear, in code order (``0.0`` first, ``inf`` at the infinity code). Rounding,
        encoding and neighbours then follow the sorted values (``fpsim.rounding``'s table path); ``ebits`` and
        ``mbits`` only say the widest exponent range and the most fraction bits (``eps``, ``p``), ``bias`` gives
        the smallest normal ``2**(1 - bias)``. Such a format is signed, and its NaN is NEG_ZERO's or none.
    table_above : float, optional
        With ``table``: the value the code after ``max`` would have on the format's grid. Rounding to nearest
        overflows from the midpoint of ``max`` and it (IEEE 754 7.4's unbounded-exponent rule).

    Examples
    --------
    >>> import fpsim
    >>> fpsim.bf16.max
    3.3895313892515355e+38
    >>> fpsim.fp8_e4m3.max, fpsim.fp8_e4m3.min_subnormal
    (448.0, 0.001953125)
    >>> e5m7 = fpsim.Format("e5m7", ebits=5, mbits=7)   # a custom IEEE-style format
    >>> e5m7.eps, e5m7.width
    (0.0078125, 13)
    """

    name: str
    ebits: int
    mbits: int
    bias: int | None = None
    has_inf: bool = True
    nan: NaNEncoding = NaNEncoding.IEEE
    signed_zero: bool = True
    subnormals: bool = True
    signed: bool = True
    has_zero: bool = True
    table: tuple[float, ...] | None = field(default=None, repr=False)
    table_above: float | None = field(default=None, repr=False)
    aliases: tuple[str, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise TypeError(f"Format.name must be a string, got {type(self.name).__name__}: {self.name!r}")
        if not isinstance(self.aliases, tuple) or not all(isinstance(a, str) for a in self.aliases):
            raise TypeError(f"Format.aliases must be a tuple of strings, got {self.aliases!r}")
        for attr in ("ebits", "mbits", "bias"):
            v = getattr(self, attr)
            if v is None and attr == "bias":
                continue
            if not isinstance(v, (int, np.integer)) or isinstance(v, (bool, np.bool_)):
                raise TypeError(f"Format.{attr} must be an int, got {v!r}")
            object.__setattr__(self, attr, int(v))  # NumPy integers would leak into the derived limits
        for attr in ("has_inf", "signed_zero", "subnormals", "signed", "has_zero"):
            v = getattr(self, attr)
            if not isinstance(v, (bool, np.bool_)):
                raise TypeError(f"Format.{attr} must be a bool, got {v!r}")
            object.__setattr__(self, attr, bool(v))
        if not 1 <= self.ebits <= 11:
            raise ValueError(f"Format.ebits must be in 1..11, got {self.ebits}")
        if not 0 <= self.mbits <= 52:
            raise ValueError(f"Format.mbits must be in 0..52, got {self.mbits}")
        try:
            nan = NaNEncoding(self.nan)
        except ValueError:
            valid = ", ".join(repr(e.value) for e in NaNEncoding)
            raise ValueError(f"unknown NaN encoding {self.nan!r}; valid: {valid}") from None
        object.__setattr__(self, "nan", nan)
        if self.bias is None:
            object.__setattr__(self, "bias", (1 << (self.ebits - 1)) - 1)
        if nan is NaNEncoding.NEG_ZERO and self.signed_zero:
            object.__setattr__(self, "signed_zero", False)
        if nan is NaNEncoding.NEG_ZERO and not self.signed:
            raise ValueError("a NEG_ZERO NaN encoding needs a sign bit")
        if not self.has_zero:
            if self.signed:
                raise ValueError(f"format {self.name!r}: a format without zero must be unsigned (signed=False), "
                                 "as e8m0")
            # The all-zeros exponent encodes the normal 2**emin: there is no subnormal range.
            object.__setattr__(self, "subnormals", False)
        if self.table is not None:
            self._check_table()
        elif self.table_above is not None:
            raise ValueError("Format.table_above needs a table")
        if self.has_inf and nan in (NaNEncoding.ALL_ONES, NaNEncoding.NEG_ZERO) and self.table is None:
            raise ValueError(f"infinity together with NaN encoding {nan.value!r} is not supported")
        if self.has_inf and self.mbits == 0 and nan is NaNEncoding.IEEE:
            raise ValueError("an IEEE NaN encoding needs at least one mantissa bit")
        if self.emax < self.emin:
            raise ValueError(f"format {self.name!r} has no finite normal exponent")
        # Every value must be a float64: that is the carrier all computations rely on.
        if self.emin < -1022 or self.emax > 1023:
            raise ValueError(
                f"format {self.name!r} has a range beyond float64 (emin={self.emin}, emax={self.emax})"
            )

    def _check_table(self) -> None:
        t = self.table
        if not isinstance(t, tuple) or not all(isinstance(v, float) for v in t):
            raise TypeError(f"Format.table must be a tuple of floats, got {t!r}")
        n = len(t)
        if n < 2 or n & (n - 1):
            raise ValueError(f"Format.table must hold a power of two (>= 2) of magnitudes, one per code; got {n}")
        if not self.signed or self.nan not in (NaNEncoding.NEG_ZERO, NaNEncoding.NONE):
            raise ValueError("a table format is signed, with NaN encoding 'neg_zero' or 'none'")
        fin = [v for v in t if math.isfinite(v)]
        if t[0] != 0.0 or any(math.isnan(v) or v < 0 for v in t) or len(set(t)) != n:
            raise ValueError("Format.table must start with 0.0 and hold distinct nonnegative magnitudes (inf allowed)")
        if (math.inf in t) != self.has_inf or t.count(math.inf) > 1:
            raise ValueError(f"Format.table holds {t.count(math.inf)} infinities but has_inf={self.has_inf}")
        ab = self.table_above
        if not isinstance(ab, float) or not math.isfinite(ab) or ab <= max(fin):
            raise ValueError(f"Format.table_above must be a finite float above the largest value, got {ab!r}")

    # -- derived limits -------------------------------------------------------------------------
    @property
    def p(self) -> int:
        """Precision in bits, including the implicit leading bit."""
        return self.mbits + 1

    @property
    def width(self) -> int:
        """Total storage width in bits."""
        if self.table is not None:
            return int(self.signed) + (len(self.table) - 1).bit_length()
        return int(self.signed) + self.ebits + self.mbits

    @property
    def _top_field(self) -> int:
        """Largest exponent field that encodes finite numbers."""
        top = (1 << self.ebits) - 1
        if self.has_inf or self.nan is NaNEncoding.IEEE:
            return top - 1
        if self.nan is NaNEncoding.ALL_ONES and self.mbits == 0:
            return top - 1
        return top

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal number."""
        assert self.bias is not None
        return (1 if self.has_zero else 0) - self.bias

    @property
    def emax(self) -> int:
        """Exponent of the largest finite number."""
        assert self.bias is not None
        if self.table is not None:
            return math.frexp(self.max)[1] - 1
        return self._top_field - self.bias

    @property
    def max_mantissa(self) -> int:
        """Largest stored mantissa in the top binade (one less where the all-ones pattern is NaN)."""
        full = (1 << self.mbits) - 1
        if self.nan is NaNEncoding.ALL_ONES and self.mbits > 0 and not self.has_inf:
            if self._top_field == (1 << self.ebits) - 1:
                return full - 1
        return full

    @property
    def max(self) -> float:
        """Largest finite value."""
        if self.table is not None:
            return max(v for v in self.table if v != math.inf)
        return math.ldexp(1.0 + self.max_mantissa / (1 << self.mbits), self.emax)

    @property
    def min_normal(self) -> float:
        """Smallest positive normal value, ``2**emin``."""
        return _pow2(self.emin)

    @property
    def min_subnormal(self) -> float:
        """Smallest positive value (equal to ``min_normal`` without subnormals)."""
        if self.table is not None:
            return min(v for v in self.table if v > 0) if self.subnormals else self.min_normal
        return _pow2(self.emin - self.mbits) if self.subnormals else self.min_normal

    @property
    def eps(self) -> float:
        """Machine epsilon: the gap between 1 and the next larger value, ``2**-mbits``."""
        return _pow2(-self.mbits)

    @property
    def has_nan(self) -> bool:
        return self.nan is not NaNEncoding.NONE

    @property
    def fits_float32(self) -> bool:
        """True when every value of the format is a float32 (results may then travel as float32)."""
        return self.emax <= 127 and self.emin - (self.mbits if self.subnormals else 0) >= -149 and self.p <= 24

    def contains(self, other: Format) -> bool:
        """Whether every value of ``other`` (signed zeros and infinities included) is a value of this format,
        so that converting from ``other`` is exact.

        >>> import fpsim
        >>> fpsim.fp32.contains(fpsim.bf16), fpsim.bf16.contains(fpsim.fp16), fpsim.fp16.contains(fpsim.fp8_e4m3)
        (True, False, True)
        """
        if self == other:
            return True
        if self.table is not None or other.table is not None:
            return self._holds_values_of(other)
        lo_self = self.emin - (self.mbits if self.subnormals else 0)
        lo_other = other.emin - (other.mbits if other.subnormals else 0)
        return (
            self.p >= other.p
            and self.max >= other.max
            and lo_self <= lo_other
            and (self.has_inf or not other.has_inf)
            and (self.signed_zero or not other.signed_zero)
            and (self.signed or not other.signed)
        )

    def _holds_values_of(self, other: Format) -> bool:
        """`contains` where a table format is involved: every finite value of ``other`` (at most 16 bits wide,
        or a table) checked one by one, by the definition of ``self`` alone."""
        if (other.has_inf and not self.has_inf) or (other.signed_zero and not self.signed_zero) or (
                other.signed and not self.signed):
            return False
        if other.table is not None:
            mags: list[float] = [v for v in other.table if math.isfinite(v)]
        elif other.width <= 16:
            mags = [float(v) for v in other.values() if v >= 0]
        else:
            return False
        if self.table is not None:
            return set(mags) <= set(self.table)
        for v in mags:  # a non-table self: v a multiple of self's quantum at its exponent, within range
            if v == 0:
                continue
            if v > self.max or v < self.min_subnormal:
                return False
            e = max(math.frexp(v)[1] - 1, self.emin)
            if math.ldexp(v, self.mbits - e) % 1:
                return False
        return True

    # -- bit-level constants used by bits.py ----------------------------------------------------
    @property
    def nan_code(self) -> int | None:
        """The canonical NaN bit pattern, or None when the format has no NaN."""
        top = (1 << self.ebits) - 1
        if self.nan is NaNEncoding.IEEE:
            return (top << self.mbits) | (1 << (self.mbits - 1))
        if self.nan is NaNEncoding.ALL_ONES:
            return (top << self.mbits) | ((1 << self.mbits) - 1)
        if self.nan is NaNEncoding.NEG_ZERO:
            return 1 << (self.width - 1)
        return None

    # -- enumeration and neighbours -------------------------------------------------------------
    @ieee_mode
    def values(self, *, finite: bool = True) -> np.ndarray:
        """Every distinct value of the format in ascending order (formats of up to 16 bits).

        ``-0`` is folded into ``0``; with ``finite=False`` the infinities are included too.

        >>> import fpsim
        >>> fpsim.fp4_e2m1.values().tolist()
        [-6.0, -4.0, -3.0, -2.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
        """
        from ._grid import values  # a convenience: the implementation decodes codes, above this module

        return values(self, finite=finite)

    @ieee_mode
    def ulp(self, x: Any) -> Any:
        """Spacing of the format at ``x``: ``2**(max(floor(log2|x|), emin) - mbits)``; NaN for NaN and ±inf
        (as ``numpy.spacing``: no spacing exists there).

        >>> import fpsim
        >>> float(fpsim.bf16.ulp(1.0)), float(fpsim.fp16.ulp(0.0)), float(fpsim.fp16.ulp(float("nan")))
        (0.0078125, 5.960464477539063e-08, nan)
        """
        from ._grid import ulp  # a convenience: the implementation reads input, above this module

        return ulp(self, x)

    @ieee_mode
    def next_up(self, x: Any) -> Any:
        """The smallest value of the format greater than ``x``.

        IEEE 754 nextUp: ``next_up(-inf)`` is the least finite value (``-max``), ``next_up(max)`` and
        ``next_up(inf)`` are ``+inf`` (NaN for a format without infinity: no value is greater), NaN gives NaN.

        >>> import fpsim
        >>> float(fpsim.fp16.next_up(1.0)), float(fpsim.fp16.next_up(-float("inf")))
        (1.0009765625, -65504.0)
        """
        from ._grid import neighbour  # a convenience: the implementation rounds, above this module

        return neighbour(self, x, up=True)

    @ieee_mode
    def next_down(self, x: Any) -> Any:
        """The largest value of the format less than ``x``.

        IEEE 754 nextDown: ``next_down(inf)`` is ``max``; below the least value the result is ``-inf``
        (NaN for a format without ``-inf``, unsigned formats included); NaN gives NaN.

        >>> import fpsim
        >>> float(fpsim.fp16.next_down(1.0)), float(fpsim.fp16.next_down(float("inf")))
        (0.99951171875, 65504.0)
        """
        from ._grid import neighbour  # a convenience: the implementation rounds, above this module

        return neighbour(self, x, up=False)

    # -- display --------------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """The format's defining fields and derived limits, as a dict (for tables and JSON)."""
        inf = "±inf" if self.has_inf else "none"
        code = f"0x{self.nan_code:X}" if self.nan_code is not None else ""
        nan = {
            NaNEncoding.IEEE: "exp all ones, mantissa ≠ 0",
            NaNEncoding.ALL_ONES: f"{code} (all ones)" + (" and its negative" if self.signed else ""),
            NaNEncoding.NEG_ZERO: f"{code} (the −0 pattern)",
            NaNEncoding.NONE: "none",
        }[self.nan]
        return {
            "name": self.name,
            "bits": self.width,
            "layout": (f"{'1' if self.signed else '0'}-{self.ebits}-{self.mbits}" if self.table is None
                       else f"{'1' if self.signed else '0'}-tapered"),
            "bias": self.bias,
            "p": self.p,
            "emin": self.emin,
            "emax": self.emax,
            "max": self.max,
            "min_normal": self.min_normal,
            "min_subnormal": self.min_subnormal if self.subnormals else None,
            "eps": self.eps,
            "inf": inf,
            "nan": nan,
        }

    def __str__(self) -> str:
        return self.name

    def _repr_html_(self) -> str:
        d = self.describe()
        cells = []
        if self.signed:
            cells.append('<td style="background:#e69f00;padding:2px 6px">S</td>')
        cells.append(
            f'<td colspan="{self.ebits}" style="background:#56b4e9;padding:2px 6px">exponent ({self.ebits})</td>'
        )
        if self.mbits:
            cells.append(
                f'<td colspan="{self.mbits}" style="background:#009e73;padding:2px 6px">'
                f"mantissa ({self.mbits})</td>"
            )
        rows = "".join(f"<tr><th style='text-align:left'>{k}</th><td>{v}</td></tr>" for k, v in d.items())
        return (
            f"<div><b>fpsim.Format {self.name}</b><table><tr>{''.join(cells)}</tr></table>"
            f"<table>{rows}</table></div>"
        )


FormatLike = Union[Format, str, np.dtype, type]

_REGISTRY: dict[str, Format] = {}
_ALIASES: dict[str, str] = {}


def register(fmt: Format) -> Format:
    """Add a format (and its aliases) to the registry so that names resolve to it."""
    if not isinstance(fmt, Format):
        raise TypeError(f"register() takes a Format, got {type(fmt).__name__}")
    for key in (fmt.name, *fmt.aliases):
        k = key.lower()
        owner = _ALIASES.get(k)
        if owner is not None and (owner != fmt.name or _REGISTRY[owner] != fmt):
            raise ValueError(f"name {key!r} already names format {owner!r}")
    _REGISTRY[fmt.name] = fmt
    for key in (fmt.name, *fmt.aliases):
        _ALIASES[key.lower()] = fmt.name
    return fmt


def format_names() -> list[str]:
    """The registered format names (not aliases), in registration order."""
    return list(_REGISTRY)


def all_formats() -> list[Format]:
    """The registered formats, in registration order."""
    return list(_REGISTRY.values())


def as_format(fmt: FormatLike) -> Format:
    """Parse a format argument: a `Format`, a registry name or alias, or a NumPy/ml_dtypes dtype.

    >>> import fpsim
    >>> fpsim.as_format("bfloat16") is fpsim.bf16
    True
    """
    if isinstance(fmt, Format):
        return fmt
    if isinstance(fmt, str):
        name = _ALIASES.get(norm_name(fmt, "format"))
        if name is None:
            raise ValueError(f"unknown format {fmt!r}; valid names: {', '.join(format_names())}")
        return _REGISTRY[name]
    if isinstance(fmt, (np.dtype, type)):
        try:
            dt = np.dtype(fmt)
        except TypeError:
            raise TypeError(f"cannot interpret {fmt!r} as a format") from None
        name = _ALIASES.get(dt.name.lower())
        if name is None:
            raise ValueError(f"dtype {dt.name!r} has no fpsim format; valid names: {', '.join(format_names())}")
        return _REGISTRY[name]
    raise TypeError(f"a format must be a Format, a name or a dtype, got {type(fmt).__name__}: {fmt!r}")


_N = NaNEncoding
fp64 = register(Format("fp64", 11, 52, aliases=("float64", "binary64", "double")))
fp32 = register(Format("fp32", 8, 23, aliases=("float32", "binary32", "single")))
tf32 = register(Format("tf32", 8, 10, aliases=("tensorfloat32",)))
fp16 = register(Format("fp16", 5, 10, aliases=("float16", "binary16", "half")))
bf16 = register(Format("bf16", 8, 7, aliases=("bfloat16",)))
fp8_e4m3 = register(
    Format("fp8_e4m3", 4, 3, has_inf=False, nan=_N.ALL_ONES, aliases=("float8_e4m3fn", "e4m3", "fp8_e4m3fn"))
)
fp8_e5m2 = register(Format("fp8_e5m2", 5, 2, aliases=("float8_e5m2", "e5m2")))
fp8_e4m3fnuz = register(
    Format("fp8_e4m3fnuz", 4, 3, bias=8, has_inf=False, nan=_N.NEG_ZERO, aliases=("float8_e4m3fnuz",))
)
fp8_e5m2fnuz = register(
    Format("fp8_e5m2fnuz", 5, 2, bias=16, has_inf=False, nan=_N.NEG_ZERO, aliases=("float8_e5m2fnuz",))
)
fp6_e2m3 = register(Format("fp6_e2m3", 2, 3, has_inf=False, nan=_N.NONE, aliases=("float6_e2m3fn", "e2m3")))
fp6_e3m2 = register(Format("fp6_e3m2", 3, 2, has_inf=False, nan=_N.NONE, aliases=("float6_e3m2fn", "e3m2")))
fp4_e2m1 = register(Format("fp4_e2m1", 2, 1, has_inf=False, nan=_N.NONE, aliases=("float4_e2m1fn", "e2m1")))
e8m0 = register(
    Format(
        "e8m0",
        8,
        0,
        has_inf=False,
        nan=_N.ALL_ONES,
        subnormals=False,
        signed=False,
        has_zero=False,
        aliases=("float8_e8m0fnu", "e8m0fnu", "fp8_e8m0"),
    )
)
# ml_dtypes' other 8-bit formats, so that every ml_dtypes type has an fpsim twin.
fp8_e4m3_ieee = register(Format("fp8_e4m3_ieee", 4, 3, aliases=("float8_e4m3",)))
fp8_e3m4 = register(Format("fp8_e3m4", 3, 4, aliases=("float8_e3m4",)))
fp8_e4m3b11fnuz = register(
    Format("fp8_e4m3b11fnuz", 4, 3, bias=11, has_inf=False, nan=_N.NEG_ZERO, aliases=("float8_e4m3b11fnuz",))
)
# UE5M3, the block-scale type of NVIDIA's Rubin generation: unsigned E5M3, bias 15, subnormals, no infinity,
# NaN only at 0xFF (so the largest value is 0xFE = 1.75 * 2**16 = 114688). The layout, the absence of infinity
# and the single NaN are as cited for PTX ISA 13.4 (whose text was not at hand here: not checked against it).
# The bias 15 and the subnormal range are those of ml_dtypes 0.7.0's float8_e5m3fnu (finfo: smallest normal
# 2**-14, smallest subnormal 2**-17, max 114688), which the tests check code by code.
ue5m3 = register(
    Format("ue5m3", 5, 3, has_inf=False, nan=_N.ALL_ONES, signed=False, aliases=("float8_e5m3fnu", "e5m3fnu"))
)


def _hif8_table() -> tuple[float, ...]:
    """HiF8's 128 magnitudes, code by code, from the definition of arXiv 2409.16626 (Ascend HiFloat8, v1).

    After the sign bit, a prefix-coded dot field D says how many exponent bits follow: ``11`` 4, ``10`` 3,
    ``01`` 2, ``001`` 1, ``0001`` 0, and ``0000`` is the denormal mode. The exponent is sign-magnitude with an
    implicit leading magnitude bit (its first stored bit the exponent's sign, 1 negative), so D bits give
    |E| in [2**(D-1), 2**D - 1] (D = 0: E = 0); the mantissa takes the bits left. Denormal mode: the 3 bits M give
    2**(M - 23) (M = 0 is zero). The code 0x6F (E = +15, mantissa 1) is infinity, 0x80 (the -0 pattern) NaN.
    """
    mags: list[float] = []
    for code in range(128):
        b = f"{code:07b}"
        for prefix, d in (("11", 4), ("10", 3), ("01", 2), ("001", 1), ("0001", 0), ("0000", -1)):
            if b.startswith(prefix):
                rest = b[len(prefix):]
                break
        if d < 0:
            m = int(rest, 2)
            mags.append(0.0 if m == 0 else math.ldexp(1.0, m - 23))
            continue
        if d == 0:
            e, mant = 0, rest
        else:
            es, em, mant = rest[0], rest[1:d], rest[d:]
            mag = (1 << (d - 1)) | (int(em, 2) if em else 0)
            e = -mag if es == "1" else mag
        mb = len(mant)
        mags.append(math.ldexp(1.0 + (int(mant, 2) if mb else 0) / (1 << mb), e))
    mags[0x6F] = math.inf
    return tuple(mags)


# HiF8 (Huawei Ascend, arXiv 2409.16626): tapered precision, 3 fraction bits for |E| <= 3, 2 for 4..7, 1 for
# 8..15, and 7 denormal powers 2**-22..2**-16; max 2**15, no -0, NaN at 0x80, ±inf at 0x6F/0xEF. A table format:
# ebits/mbits are the widest (31 exponents, 3 bits), bias 16 puts the smallest normal at 2**-15. The overflow
# boundary comes from the code after max: 0x6F's place on the grid, 1.5 * 2**15.
hif8 = register(
    Format("hif8", 5, 3, bias=16, has_inf=True, nan=_N.NEG_ZERO, table=_hif8_table(), table_above=49152.0,
           aliases=("hifloat8",))
)
del _N
