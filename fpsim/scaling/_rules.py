"""Every block-scale rule in use, named: how each library or document turns a block's amax into its shared
scale, as one table (:data:`SCALE_RULES`) that :func:`~fpsim.scaling.mx_scales` and
:func:`~fpsim.scaling.mx_quantize` read through their ``scale_rule=`` parameter.

Each rule is three steps, recorded in its :class:`ScaleRule`: a *pre-value* ``v`` computed from the block amax
(e.g. ``amax / 2**emax_elem``), a *direction* that rounds ``v`` onto the scale format's grid (E8M0 by default: the
powers of two), and what an infinite amax gives. The element side differs in one place only: the divisor used
for blocks whose scale is the scale format's smallest value (2**-127 for E8M0), where some implementations avoid
a subnormal float32 divisor.
"""

from __future__ import annotations

from dataclasses import dataclass
import numpy as np

from ..formats import Format, FormatLike, as_format
from ..rounding import round as _round
from ._common import _F32
from .._fpenv import ieee_mode


@ieee_mode
@dataclass(frozen=True)
class ScaleRule:
    """One block-scale rule: how it computes and where it is defined.

    Attributes
    ----------
    name : str
        The name ``scale_rule=`` accepts.
    source : str
        The document or code (with version) that defines the rule.
    formula : str
        How the scale is computed, in words.
    prevalue : str
        ``"amax/2**emax"``, ``"2*amax/2**emax"``, ``"amax*f32(1/max)"`` (float32 product with the float32
        reciprocal), ``"f32(amax/max)"`` (float32 quotient) or ``"even"`` (amax rounded, ties away, to the
        element's mantissa width, then divided by 2**emax).
    direction : str
        How the pre-value is rounded onto the scale format: ``"down"``, ``"up"`` or ``"nearest"`` (ties up).
    on_inf : str
        Scale of a block whose amax is infinite: ``"nan"``, ``"max"`` (the scale format's largest value) or
        ``"2**(128-emax)"`` (torchao's exponent-field arithmetic on float32 inf).
    min_divisor : str
        Elements of a block with the smallest scale are divided by ``"scale"`` (the scale itself),
        ``"2**-126"`` (the scale clamped to float32's smallest normal) or ``"1"`` (not scaled).
    applies_to : str
        ``"mx"`` (:func:`~fpsim.scaling.mx_scales`, :func:`~fpsim.scaling.mx_quantize`) or ``"nvfp4"``
        (:func:`~fpsim.scaling.nvfp4_quantize`, a two-level scale).
    validated : str
        The oracle the rule is checked against bit for bit, or ``"unvalidated"``.
    aliases : tuple of str
        Other accepted names.

    Examples
    --------
    >>> from fpsim.scaling import scale_rule
    >>> r = scale_rule("torchao-rceil")
    >>> r.prevalue, r.direction, r.min_divisor
    ('f32(amax/max)', 'up', '1')
    """

    name: str
    source: str
    formula: str
    prevalue: str
    direction: str
    on_inf: str
    min_divisor: str
    applies_to: str
    validated: str
    aliases: tuple[str, ...] = ()


_TAO = "torchao 0.18 torchao/prototype/mx_formats (ScaleCalculationMode, to_mx)"
_ONNX = "ONNX opset 25 Cast to float8e8m0, round_mode={m}, saturate=1 (onnx 1.23 operator docs)"

SCALE_RULES: dict[str, ScaleRule] = {r.name: r for r in (
    ScaleRule("ocp", "OCP Microscaling Formats (MX) v1.0, section 6.3",
              "X = 2**(floor(log2 amax) - emax_elem); NaN or inf amax gives NaN",
              "amax/2**emax", "down", "nan", "scale", "mx", "torchao FLOOR (scales coincide, finite amax)",
              ("floor",)),
    ScaleRule("te", "TransformerEngine MXFP8 (quantize kernel, float_to_e8m0: cvt.rp.satfinite.ue8m0)",
              "X = 2**ceil(log2(f32(amax * f32(1/max_elem)))); inf gives 2**127; smallest scale: elements unscaled",
              "amax*f32(1/max)", "up", "max", "1", "mx", "TransformerEngine source (tests/test_scaling.py)",
              ("ceil",)),
    ScaleRule("torchao-floor", _TAO + " FLOOR",
              "exponent field of f32 amax minus emax_elem, clamped to [-127, 128]; elements divided by "
              "max(X, 2**-126)", "amax/2**emax", "down", "2**(128-emax)", "2**-126", "mx", "torchao to_mx"),
    ScaleRule("torchao-ceil", _TAO + " CEIL",
              "as FLOOR, plus one when amax's mantissa field is non-zero", "amax/2**emax", "up",
              "2**(128-emax)", "2**-126", "mx", "torchao to_mx"),
    ScaleRule("torchao-even", _TAO + " EVEN",
              "as FLOOR on amax first rounded (half up) to the element's mantissa width",
              "even", "down", "2**(128-emax)", "2**-126", "mx", "torchao to_mx"),
    ScaleRule("torchao-rceil", _TAO + " RCEIL (cuBLAS 'Computing scaling and conversion factors for FP8 with "
              "UE8M0 scales')",
              "X = 2**ceil(log2(f32(amax / max_elem))) as cvt.rp.satfinite.ue8m0; inf gives 2**127; smallest "
              "scale: elements unscaled", "f32(amax/max)", "up", "max", "1", "mx", "torchao to_mx"),
    ScaleRule("onnx-up", _ONNX.format(m="up"), "X = Cast(f32(amax / max_elem)) rounded up onto E8M0",
              "f32(amax/max)", "up", "max", "scale", "mx", "onnx reference evaluator"),
    ScaleRule("onnx-down", _ONNX.format(m="down"), "X = Cast(f32(amax / max_elem)) rounded down onto E8M0",
              "f32(amax/max)", "down", "max", "scale", "mx", "onnx reference evaluator"),
    ScaleRule("onnx-nearest", _ONNX.format(m="nearest"),
              "X = Cast(f32(amax / max_elem)) rounded to the nearest power of two, ties (1.5 * 2**k) up",
              "f32(amax/max)", "nearest", "max", "scale", "mx", "onnx reference evaluator"),
    ScaleRule("neuron-emax", "AWS Neuron nki.isa.quantize_mx (NKI docs v2.32) and the QuantizeMX custom call's "
              "'EMAX' scale_method: a block scale twice OCP's",
              "X = 2**(floor(log2 amax) - emax_elem + 1)", "2*amax/2**emax", "down", "nan", "scale", "mx",
              "unvalidated"),
    ScaleRule("nvfp4", "TransformerEngine NVFP4QuantizerRef; NVIDIA NVFP4 (FP32 tensor scale x UE4M3 block scale)",
              "s_enc = 448*6/amax_tensor; block scale e4m3(amax_block * s_enc / 6); see nvfp4_quantize",
              "amax*f32(1/max)", "nearest", "max", "scale", "nvfp4",
              "torchao 0.18 nvfp4_quantize, except its clamp of block scales to 2**-6"),
)}

_ALIASES = {a: r.name for r in SCALE_RULES.values() for a in r.aliases}


@ieee_mode
def scale_rule(rule: str | ScaleRule) -> ScaleRule:
    """The :class:`ScaleRule` called ``rule`` (a name or alias in :data:`SCALE_RULES`, case-insensitive).

    >>> scale_rule("floor").name, scale_rule("ONNX-UP").direction
    ('ocp', 'up')
    """
    if isinstance(rule, ScaleRule):
        return rule
    if not isinstance(rule, str):
        raise TypeError(f"scale_rule must be a rule name or a ScaleRule, got {type(rule).__name__}: {rule!r}")
    key = rule.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in SCALE_RULES:
        valid = ", ".join(list(SCALE_RULES) + sorted(_ALIASES))
        raise ValueError(f"unknown scale rule {rule!r}; valid rules: {valid}")
    return SCALE_RULES[key]


def _mx_rule(rule: str | ScaleRule) -> ScaleRule:
    r = scale_rule(rule)
    if r.applies_to != "mx":
        raise ValueError(f"scale rule {r.name!r} is a two-level scale: use nvfp4_quantize, not the MX functions; "
                         f"MX rules: {', '.join(n for n, v in SCALE_RULES.items() if v.applies_to == 'mx')}")
    return r


def _as_scale_format(scale_format: FormatLike) -> Format:
    sf = as_format(scale_format)
    if not sf.has_nan:
        raise ValueError(f"scale format {sf.name!r} has no NaN to mark a NaN block; use e8m0, fp8_e4m3 (UE4M3 "
                         "values) or another format with NaN")
    return sf


def _smallest(sf: Format) -> float:
    return float(sf.min_subnormal if sf.subnormals else sf.min_normal)


_DIRECTION = {"down": "rdn", "up": "rup", "nearest": "rna"}  # rna = ties up for positive values


def _rule_scales(block_amax: np.ndarray, f: Format, r: ScaleRule, sf: Format) -> np.ndarray:
    """Scales (float64 values of ``sf``, NaN for a NaN amax) that rule ``r`` gives blocks with these amaxes."""
    a = np.asarray(block_amax, dtype=np.float64)
    nan = np.isnan(a)
    inf = np.isinf(a)
    safe = np.where(nan | inf, 0.0, a)
    with np.errstate(over="ignore", under="ignore", divide="ignore", invalid="ignore"):
        a32 = safe.astype(_F32)
        # an amax beyond float32's range (float64 input) floors to 2**127 first, as E8M0 saturates it
        big = np.minimum(safe, float(np.finfo(np.float32).max))
        if r.prevalue == "amax/2**emax":
            v = np.ldexp(big, -f.emax)
        elif r.prevalue == "2*amax/2**emax":
            v = np.ldexp(big, 1 - f.emax)
        elif r.prevalue == "amax*f32(1/max)":
            v = (a32 * _F32(1.0 / f.max)).astype(np.float64)
        elif r.prevalue == "f32(amax/max)":
            v = (a32 / _F32(f.max)).astype(np.float64)
        elif r.prevalue == "even":
            # round half up at the element's last mantissa bit, keep only the exponent field (torchao's EVEN)
            bits = a32.view(np.uint32).astype(np.uint64) + (1 << (22 - f.mbits))
            e = ((bits >> 23) & 0xFF).astype(np.int64)
            v = np.where(e == 0, 0.0, np.ldexp(1.0, e - 127 - f.emax))  # a carry to 255 gives 2**(128-emax)
        else:  # pragma: no cover - the table is fixed
            raise AssertionError(r.prevalue)
    lo, hi = _smallest(sf), float(sf.max)
    pos = v > 0
    with np.errstate(over="ignore", invalid="ignore"):
        rounded = np.asarray(_round(np.where(pos, v, 1.0), sf, _DIRECTION[r.direction], overflow="saturate"),
                             dtype=np.float64)
    x = np.where(pos, rounded, lo)
    x = np.clip(np.where(np.isnan(x), lo, x), lo, hi)
    if r.on_inf == "nan":
        inf_val = np.nan
    elif r.on_inf == "max":
        inf_val = hi
    else:  # torchao: the exponent field 255 of float32 inf read as 2**128, divided by 2**emax
        inf_val = min(2.0 ** (128 - f.emax), hi)
    out: np.ndarray = np.where(nan, np.nan, np.where(inf, inf_val, x))
    return out


def _divisors(scales: np.ndarray, r: ScaleRule, sf: Format) -> np.ndarray:
    """What the elements of each block are divided by (the rule's quirk for the smallest scale)."""
    if r.min_divisor == "scale":
        return scales
    small = scales == _smallest(sf)
    d = 1.0 if r.min_divisor == "1" else 2.0**-126
    out: np.ndarray = np.where(small, np.maximum(scales, d) if d < 1 else d, scales).astype(scales.dtype)
    return out


@ieee_mode
def rules_table() -> str:
    """The rule table as Markdown (name, how it computes, source, oracle), as docs/scale-rules.md shows it.

    >>> print(rules_table().splitlines()[0])
    | rule | computes | on inf amax | smallest-scale divisor | source | checked against |
    """
    rows = ["| rule | computes | on inf amax | smallest-scale divisor | source | checked against |",
            "|---|---|---|---|---|---|"]
    for r in SCALE_RULES.values():
        name = r.name + (f" ({', '.join(r.aliases)})" if r.aliases else "")
        rows.append(f"| `{name}` | {r.formula} | {r.on_inf} | {r.min_divisor} | {r.source} | {r.validated} |")
    return "\n".join(rows)
