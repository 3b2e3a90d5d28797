"""Which rule made these bytes? Given data and the block scales (and element codes) another library produced,
list every named rule consistent with them, and for each that is not, where and by how much it differs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..bits import from_bits, to_bits
from ..formats import FormatLike, as_format
from ..rounding import round as _round
from ._common import _as_float
from ._mx import _block_absmax, _mx_prepare
from ._rules import SCALE_RULES, _as_scale_format, _divisors, _mx_rule, _rule_scales
from .._fpenv import ieee_mode


@ieee_mode
@dataclass(frozen=True)
class RuleDiff:
    """How one candidate differs from the given bytes.

    Attributes
    ----------
    name : str
        The candidate (a scale rule, or a quantizer such as ``"rne/saturate"``).
    mismatches : int
        Blocks (scale rules) or elements (quantizers) that differ.
    fraction : float
        ``mismatches`` over the number of blocks or elements compared.
    first : tuple of int or None
        Index of the first differing block (in the scales' shape) or element (in the data's shape).
    steps : int or None
        At ``first``: given minus predicted, in steps of the code (E8M0 steps for E8M0 scales); None where either
        side is NaN.
    """

    name: str
    mismatches: int
    fraction: float
    first: tuple[int, ...] | None
    steps: int | None


@ieee_mode
@dataclass(frozen=True)
class IdentifyReport:
    """Result of :func:`identify_scale_rule` / :func:`identify_quantizer`.

    ``consistent`` lists every candidate that reproduces all the given bytes (several when they coincide on this
    data); ``diffs`` has one :class:`RuleDiff` per candidate (``mismatches == 0`` for the consistent ones);
    ``notes`` records observations (e.g. how NaN blocks were encoded). ``str(report)`` is a table.
    """

    consistent: tuple[str, ...]
    diffs: dict[str, RuleDiff]
    compared: int
    notes: tuple[str, ...] = field(default=())

    def __str__(self) -> str:
        lines = [f"consistent: {', '.join(self.consistent) or '(none)'}  ({self.compared} compared)",
                 f"{'candidate':<24}{'mismatches':>12}{'fraction':>10}  first  steps"]
        for d in self.diffs.values():
            lines.append(f"{d.name:<24}{d.mismatches:>12}{d.fraction:>10.4f}  {d.first}  {d.steps}")
        lines += list(self.notes)
        return "\n".join(lines)


def _codes(values: Any, fmt: Any, what: str) -> np.ndarray:
    """Integer codes of ``values`` in ``fmt``: integer input is taken as codes already, floats are encoded and
    must be values of the format."""
    a = np.asarray(values)
    if a.dtype.kind in "ui":
        return a.astype(np.int64)
    if a.dtype.kind != "f" and not (a.dtype.kind == "V" or "float" in str(a.dtype)):
        raise TypeError(f"{what} must be integer codes or float values, got dtype {a.dtype}")
    v = np.asarray(a, dtype=np.float64)
    c = np.asarray(to_bits(v, fmt)).astype(np.int64)
    back = np.asarray(from_bits(c, fmt), dtype=np.float64)
    bad = ~((back == v) | (np.isnan(back) & np.isnan(v)))
    if bad.any():
        i = int(np.flatnonzero(bad.reshape(-1))[0])
        raise ValueError(f"{what} holds {v.reshape(-1)[i]!r}, not a value of {as_format(fmt).name}: pass the codes")
    return c


def _diff(name: str, given: np.ndarray, pred: np.ndarray, nan_code: int, shape: tuple[int, ...],
          total: int | None = None) -> RuleDiff:
    bad = given != pred
    n = int(bad.sum())
    if n == 0:
        return RuleDiff(name, 0, 0.0, None, None)
    i = int(np.flatnonzero(bad.reshape(-1))[0])
    g, p = int(given.reshape(-1)[i]), int(pred.reshape(-1)[i])
    steps = None if nan_code in (g, p) else g - p
    first = tuple(int(k) for k in np.unravel_index(i, shape))
    return RuleDiff(name, n, n / max(bad.size if total is None else total, 1), first, steps)


def _blocks(x: Any, block: int, axis: int) -> tuple[np.ndarray, int, tuple[int, ...]]:
    a, b, ax = _mx_prepare(x, block, axis)
    moved = np.moveaxis(a, ax, -1)
    blocks = moved.reshape(moved.shape[:-1] + (moved.shape[-1] // b, b))
    return blocks, ax, moved.shape


def _scale_codes(scales: Any, expect: tuple[int, ...], ax: int, ndim: int, sf: Any) -> np.ndarray:
    s = np.asarray(scales)
    if s.ndim == ndim:
        s = np.moveaxis(s, ax, -1)
    if s.size != int(np.prod(expect)):
        raise ValueError(f"scales have {s.size} entries; the data's blocks need {int(np.prod(expect))}")
    return _codes(s.reshape(expect), sf, "scales")


@ieee_mode
def identify_scale_rule(x: Any, scales: Any, *, elem: FormatLike, block: int = 32, axis: int = -1,
                        scale_format: FormatLike = "e8m0", rules: Any = None) -> IdentifyReport:
    """Which named block-scale rules reproduce ``scales`` for data ``x``?

    Parameters
    ----------
    x : array_like
        The data the other library quantised (float32 as it saw it).
    scales : array_like
        Its block scales: integer codes (E8M0 bytes, e.g. ``torch.float8_e8m0fnu`` viewed as uint8) or their
        values as floats; one per block, in the data's shape with ``axis`` divided by ``block``, or flat.
    elem : Format or str
        The element format the scales were computed for.
    block, axis : int
        Block length and the axis the blocks run along.
    scale_format : Format or str
        The scales' format (E8M0 by default).
    rules : iterable of str, optional
        Candidates (default: every MX rule of :data:`~fpsim.scaling.SCALE_RULES`).

    Returns
    -------
    IdentifyReport
        ``consistent``: every rule that reproduces all the bytes; ``diffs[rule]``: mismatching blocks, their
        fraction, the first one (block index) and ``steps`` = given minus predicted there (E8M0 steps).

    Examples
    --------
    >>> import numpy as np, fpsim.scaling as S
    >>> x = np.float32([[460.0] + [1.0] * 31, [3.0] * 32])
    >>> e, s = S.mx_quantize(x, "fp8_e4m3", scale_rule="te")
    >>> rep = S.identify_scale_rule(x, s, elem="fp8_e4m3")
    >>> rep.consistent
    ('te', 'torchao-rceil', 'onnx-up')
    >>> d = rep.diffs["ocp"]
    >>> d.mismatches, d.first, d.steps
    (1, (0, 0), 1)
    """
    f = as_format(elem)
    sf = _as_scale_format(scale_format)
    names = [r.name for r in SCALE_RULES.values() if r.applies_to == "mx"] if rules is None else \
        [_mx_rule(r).name for r in rules]
    blocks, ax, shp = _blocks(x, block, axis)
    with np.errstate(invalid="ignore"):
        bam = np.asarray(_block_absmax(blocks), dtype=np.float64)
    given = _scale_codes(scales, bam.shape, ax, len(shp), sf)
    nan_code = -1 if sf.nan_code is None else int(sf.nan_code)
    out_shape = np.moveaxis(np.empty(bam.shape, dtype=np.int8), -1, ax).shape if bam.ndim else ()
    g_out = np.moveaxis(given, -1, ax) if given.ndim else given
    diffs: dict[str, RuleDiff] = {}
    for n in names:
        pred = np.asarray(to_bits(_rule_scales(bam, f, SCALE_RULES[n], sf), sf)).astype(np.int64)
        p_out = np.moveaxis(pred, -1, ax) if pred.ndim else pred
        diffs[n] = _diff(n, g_out, p_out, nan_code, out_shape)
    consistent = tuple(n for n, d in diffs.items() if d.mismatches == 0)
    return IdentifyReport(consistent, diffs, int(given.size))


_ROUNDINGS = ("rne", "rna", "rtz", "rup", "rdn")
_MIN_DIVISORS = {"scale": "ocp", "2**-126": "torchao-floor", "1": "te"}


@ieee_mode
def identify_quantizer(x: Any, scales: Any, codes: Any, *, elem: FormatLike, block: int = 32, axis: int = -1,
                       scale_format: FormatLike = "e8m0") -> IdentifyReport:
    """Which element quantizer turned ``x`` and these block ``scales`` into these element ``codes``?

    Candidates are named ``"<rounding>/<overflow>/<divisor>"``: rounding ``rne``, ``rna``, ``rtz``, ``rup``,
    ``rdn`` (and ``sr``: every element is one of the two neighbours of its exact value); overflow ``saturate``
    (to ±max) or ``ieee`` (to inf, or NaN in a format without inf); divisor ``scale`` (OCP), ``2**-126``
    (torchao's FLOOR/CEIL/EVEN clamp the smallest E8M0 scale) or ``1`` (TE and torchao's RCEIL leave
    smallest-scale blocks unscaled). Blocks with a NaN scale are left out of the comparison (they decode to NaN
    whatever their elements), and a note says how their elements were encoded (NaN handling).

    Parameters
    ----------
    x : array_like
        The data.
    scales : array_like
        Block scales, as codes (integers) or values (floats), one per block.
    codes : array_like
        Element codes (integers, e.g. fp8 bytes; fp4/fp6 one code per byte, unpacked) or element values (floats).
    elem : Format or str
        The element format.
    block, axis : int
        Block length and the axis the blocks run along.
    scale_format : Format or str
        The scales' format (E8M0 by default).

    Returns
    -------
    IdentifyReport
        ``consistent`` candidates; ``diffs`` per candidate with the first differing *element* (index in the
        data's shape) and ``steps`` = given minus predicted code there.

    Examples
    --------
    >>> import numpy as np, fpsim.scaling as S
    >>> x = np.float32([[0.3, -1.3, 2.5, 700.0]])
    >>> e, s = S.mx_quantize(x, "fp4_e2m1", block=4)
    >>> rep = S.identify_quantizer(x, s, e, elem="fp4_e2m1", block=4)
    >>> "rne/saturate/scale" in rep.consistent, "rtz/saturate/scale" in rep.consistent
    (True, False)
    """
    f = as_format(elem)
    sf = _as_scale_format(scale_format)
    blocks, ax, shp = _blocks(x, block, axis)
    gs = _scale_codes(scales, blocks.shape[:-1], ax, len(shp), sf)
    sval = np.asarray(from_bits(gs, sf), dtype=np.float64)
    c = np.asarray(codes)
    if c.shape != np.asarray(_as_float(x)).shape:
        raise ValueError(f"codes have shape {c.shape}; the data has shape {np.shape(x)}")
    given = np.moveaxis(_codes(c, f, "codes"), ax, -1).reshape(blocks.shape)
    ok = ~np.isnan(sval)
    xb = blocks.astype(np.float64)
    notes: list[str] = []
    if (~ok).any():
        nan_blocks = given[~ok]
        xn = xb[~ok]
        if f.nan_code is not None and bool((nan_blocks == int(f.nan_code)).all()):
            notes.append("NaN-scale blocks: every element NaN")
        elif bool((np.asarray(from_bits(nan_blocks, f))[~np.isnan(xn)] == 0).all()):
            notes.append("NaN-scale blocks: elements 0 except at NaN inputs (divided by an infinite scale)")
        else:
            notes.append("NaN-scale blocks: elements neither all NaN nor zero")
    diffs: dict[str, RuleDiff] = {}
    xshape = np.asarray(_as_float(x)).shape
    okb = np.broadcast_to(ok[..., None], given.shape)

    def back(a: np.ndarray) -> np.ndarray:  # blocked, axis-last layout -> the data's layout
        return np.moveaxis(a.reshape(shp), -1, ax)

    g_out = back(given)
    nan_code = -1 if f.nan_code is None else int(f.nan_code)
    for dname, rname in _MIN_DIVISORS.items():
        div = _divisors(np.where(ok, sval, 1.0), SCALE_RULES[rname], sf)
        with np.errstate(invalid="ignore", over="ignore"):
            v = np.where(okb, xb / div[..., None], 0.0)
        nb: dict[str, np.ndarray] = {}
        for over in ("saturate", "ieee"):
            for mode in _ROUNDINGS:
                name = f"{mode}/{over}/{dname}"
                with np.errstate(invalid="ignore", over="ignore"):
                    q = np.asarray(_round(v, f, mode, overflow=over), dtype=np.float64)
                if not f.has_nan:
                    q = np.nan_to_num(q, nan=0.0)
                pred = np.where(okb, np.asarray(to_bits(q, f)).astype(np.int64), given)
                diffs[name] = _diff(name, g_out, back(pred), nan_code, xshape, int(okb.sum()))
                if over == "saturate" and mode in ("rdn", "rup"):
                    nb[mode] = pred
        sr = (given == nb["rdn"]) | (given == nb["rup"])
        name = f"sr/saturate/{dname}"
        diffs[name] = _diff(name, back(np.where(sr, 0, 1)), np.zeros(xshape, dtype=np.int64), -1, xshape,
                            int(okb.sum()))
    consistent = tuple(n for n, d in diffs.items() if d.mismatches == 0)
    return IdentifyReport(consistent, diffs, int(okb.sum()), tuple(notes))
