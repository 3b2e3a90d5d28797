"""The block-FMA (BFMA) model of a matrix unit, and generic accumulation models for comparison.

One :class:`MMAModel` describes one hardware data path (for example H100 fp16 inputs with fp32 output)
or one generic, non-hardware way of forming ``d = c + sum_i a_i * b_i`` (``exact``, ``fma_chain``,
``pairwise``, ``wide``). A model is data; its behaviour is its *matrix unit* (``model._unit``, one class per
family implementing :class:`fpsim.mma._unit.MatrixUnit`: :mod:`fpsim.mma._bfma`, :mod:`fpsim.mma._generic`,
:mod:`fpsim.mma._exact`, :mod:`fpsim.mma.amd`), whose kernels work on *term arrays* whose first axis is K and
are vectorized over every other axis; :mod:`fpsim.mma.gemm` feeds them rows (``dot``) or tiles (``matmul``).
This module holds the model and the helpers the kernels share.

The BFMA (reference ``tensorcore.md`` section 1) for one block of ``k`` products and an addend ``c``:

1. every nonzero product ``a_i*b_i`` is exact; its *unnormalised* exponent is ``E_i = e_a + e_b`` with
   ``e_x = max(floor(log2|x|), emin_IN)``; the addend's exponent ``E_c`` comes from its binary32 encoding;
2. ``E_max = max(E_i, E_c, mel)`` over nonzero terms;
3. every term's magnitude is truncated to the grid ``2**(E_max - 23 - neab)`` on its own
   (sign-magnitude truncation), i.e. ``Q_i = trunc(v_i * 2**(23 + neab - E_max))``;
4. the integers ``Q_i`` are summed exactly;
5. the block value is rounded once, to ``mb`` fraction bits (RZ for fp32 out, RNE for fp16 out) with the
   quantum clamped at the output format's ``emin`` (subnormal outputs).

Integer-valued floats carry the ``Q_i``: products of fp16/fp8 inputs are exact in float32 and scaling by a
power of two is exact, so ``numpy.trunc`` performs step 3 exactly; the sums run in float64, exact because
every partial sum stays below ``2**53`` (:func:`fpsim.mma._bfma.bfma`). :mod:`fpsim.mma.gemm` runs the same
model in a compiled kernel (``fpsim/_cgemm.c``, integer significands and exponents) when it is built; the NumPy
kernels are its reference.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np

from .._fpenv import ieee_mode
from ..arith import Context
from ..formats import Format, FormatLike, as_format, fp16, fp32
from ..rounding import round as _fround
from ._unit import MatrixUnit, unit_for

__all__ = [
    "KINDS",
    "MMAModel",
    "as_model",
    "exact",
    "fma_chain",
    "generic",
    "pairwise",
    "wide",
]

Kind = Literal["bfma", "exact", "fma_chain", "pairwise", "wide",
               "seq_fma", "e_fdpa", "ftz_mul_add", "tr_fdpa", "gtr_fdpa"]
KINDS: tuple[str, ...] = ("bfma", "exact", "fma_chain", "pairwise", "wide",
                          "seq_fma", "e_fdpa", "ftz_mul_add", "tr_fdpa", "gtr_fdpa")
#: The AMD MFMA kinds, run by :func:`fpsim.mma.amd.run_mfma` (arithmetic described there).
AMD_KINDS: tuple[str, ...] = ("seq_fma", "e_fdpa", "ftz_mul_add", "tr_fdpa", "gtr_fdpa")
_ROUNDINGS = ("rz", "rne")
_C_ENTRIES = ("inside", "late")
_GROUPINGS = ("none", "mod4")

#: Exponent given to zero (and non-finite) values so that they never win ``E_max``.
NO_EXP = -8000


@ieee_mode
@dataclass(frozen=True)
class MMAModel:
    """One matrix-multiply-accumulate data path: ``D = C + A @ B`` as some hardware (or rule) computes it.

    Parameters
    ----------
    name : str
        Readable identifier, e.g. ``"h100 fp16->fp32"``.
    kind : {"bfma", "exact", "fma_chain", "pairwise", "wide"}
        ``"bfma"``: the hardware block-FMA chain described by the fields below. Generic comparisons:
        ``"exact"`` (exact dot product plus C, rounded once, RNE, to `output`), ``"fma_chain"`` (``d := c``,
        then ``d := fma(a_i, b_i, d)`` correctly rounded (RNE) in `acc` in index order; a CPU loop),
        ``"pairwise"`` (products rounded to `acc`, summed by a pairwise tree in `acc` with RNE, then C
        added), ``"wide"`` (products and C summed in float64 in index order, then rounded once).
        Generic kinds round their `acc` result to `output` (RNE) at the end.
        AMD CDNA MFMA data paths (:mod:`fpsim.mma.amd`, MMA-Sim's operations): ``"seq_fma"`` (FMA chain
        in `output`, fp32 or fp64), ``"e_fdpa"`` (CDNA1: exact sum of each block of `k` products and C, RNE
        to fp32), ``"ftz_mul_add"`` (CDNA2: fp32 products and additions, flushed to zero, `k` = 2 or 4),
        ``"tr_fdpa"`` / ``"gtr_fdpa"`` (CDNA3: products truncated to ``23 + neab`` bits below the block's
        largest exponent; sum and C floored and added, floored to `mb` = F2 fraction bits, RNE to fp32;
        ``gtr`` sums even and odd products apart).
    input : Format
        Format of the A and B entries (fp16, bf16, tf32, fp8_e4m3, fp8_e5m2 for hardware paths).
    output : Format
        Format of C and D (fp32 or fp16). C is rounded (RNE) to it before use.
    k : int
        BFMA block size: products aligned and summed together before one rounding.
    neab : int
        Extra alignment bits: terms are truncated to ``23 + neab`` fraction bits below ``E_max``
        (negative for FP8 on Ada/Hopper: the 13-bit "FP22" accumulator).
    mel : int or None
        Exponent floor for ``E_max`` (``min_exp_limit``); ``None`` when absent.
    rounding : {"rz", "rne"}
        Rounding of each block result: ``"rz"`` (truncation; fp32 out) or ``"rne"`` (fp16 out).
    mb : int
        Fraction bits kept in each block result (23 for fp32, 13 for the FP22 accumulator, 10 for fp16).
    c_entry : {"inside", "late"}
        How C enters one instruction: ``"inside"`` = as a term of the first BFMA (aligned and truncated
        with the products); ``"late"`` = the instruction's products are reduced from 0 and C is added
        afterwards by one correctly rounded (RNE) addition in `output` (variants V1 and V3).
    grouping : {"none", "mod4"}
        ``"mod4"`` = variant V1 (Hopper/Blackwell FP8 -> fp16 ``mma.sync``): one instruction of ``2k``
        products is split into G0 = {i : i mod 4 in {0, 1}} and G1 = {i mod 4 in {2, 3}}, chained as two
        BFMAs (G0 from 0, then G1 with the G0 result as addend).
    acc : Format
        Accumulator format of the generic ``fma_chain`` and ``pairwise`` kinds.
    source, confidence : str
        Where the parameters come from and how sure we are (presets fill these in).
    input_b : Format, optional
        Format of the B entries when it differs from A's (AMD CDNA3 ``fp8_bf8`` / ``bf8_fp8`` MFMA); None:
        `input`. :attr:`b_format` gives the one in use.

    Examples
    --------
    >>> from fpsim.mma import get_model
    >>> m = get_model("h100", "fp16")
    >>> (m.k, m.neab, m.mel, m.rounding, m.mb)
    (16, 2, -133, 'rz', 23)
    >>> m.instruction_k
    16
    """

    name: str
    kind: Kind = "bfma"
    input: Format = fp16
    output: Format = fp32
    k: int = 1
    neab: int = 0
    mel: int | None = None
    rounding: str = "rz"
    mb: int = 23
    c_entry: str = "inside"
    grouping: str = "none"
    acc: Format = fp32
    source: str = field(default="", compare=False)
    confidence: str = field(default="", compare=False)
    input_b: Format | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "input", as_format(self.input))
        object.__setattr__(self, "output", as_format(self.output))
        object.__setattr__(self, "acc", as_format(self.acc))
        if self.input_b is not None:
            object.__setattr__(self, "input_b", as_format(self.input_b))
            if self.kind not in AMD_KINDS:
                raise ValueError(f"input_b (a B format differing from A's) applies to the AMD kinds "
                                 f"({', '.join(AMD_KINDS)}), not {self.kind!r}")
        if self.kind not in KINDS:
            raise ValueError(f"unknown MMA model kind {self.kind!r}; valid: {', '.join(KINDS)}")
        if self.rounding not in _ROUNDINGS:
            raise ValueError(f"unknown block rounding {self.rounding!r}; valid: {', '.join(_ROUNDINGS)}")
        if self.c_entry not in _C_ENTRIES:
            raise ValueError(f"unknown c_entry {self.c_entry!r}; valid: {', '.join(_C_ENTRIES)}")
        if self.grouping not in _GROUPINGS:
            raise ValueError(f"unknown grouping {self.grouping!r}; valid: {', '.join(_GROUPINGS)}")
        if not isinstance(self.k, (int, np.integer)) or self.k < 1:
            raise ValueError(f"block size k must be a positive integer, got {self.k!r}")
        if self.grouping == "mod4" and self.k % 2:
            raise ValueError(f"grouping 'mod4' needs an even k (2k must be a multiple of 4), got k={self.k}")
        if not 0 <= self.mb <= 52:
            raise ValueError(f"mb must lie in [0, 52], got {self.mb!r}")
        if self.kind == "bfma":
            if self.input.p > 24 or self.input.emax > 127:
                raise ValueError(f"BFMA input format {self.input.name} is wider than fp32; the model "
                                 "assumes products exact in float64 and inputs inside the fp32 range")
            if self.output.p > 24:
                raise ValueError(f"BFMA output format {self.output.name} is wider than fp32")
            if not self.output.has_inf:
                raise ValueError(f"BFMA output format {self.output.name} has no infinity")
        elif self.kind not in AMD_KINDS:  # the AMD kinds are checked where they are built (fpsim.mma.amd)
            if self.input.p > 26:
                raise ValueError(f"generic models need inputs of at most 26 significant bits (products exact in "
                                 f"float64); {self.input.name} has {self.input.p}")
            if self.output.p > 25 or self.acc.p > 25:
                raise ValueError("generic models round to formats of at most 25 significant bits "
                                 f"(output {self.output.name}, acc {self.acc.name})")

    @property
    def _unit(self) -> MatrixUnit:
        """The matrix unit of this model's family (what :mod:`fpsim.mma.gemm` runs it with)."""
        return unit_for(self.kind)

    @property
    def b_format(self) -> Format:
        """Format of the B operand: `input_b` when set, else `input`."""
        return self.input if self.input_b is None else self.input_b

    @property
    def instruction_k(self) -> int:
        """Products consumed by one instruction: ``2k`` for the mod-4 grouping, else ``k`` (1 for generics)."""
        return 2 * self.k if self.grouping == "mod4" else self.k

    def with_(self, **changes: Any) -> MMAModel:
        """A copy with some fields changed (``dataclasses.replace``), e.g. ``m.with_(neab=2)``."""
        return replace(self, **changes)

    def describe(self) -> str:
        """Multi-line summary of the parameters, their source and confidence."""
        if self.kind in AMD_KINDS:
            ins = self.input.name if self.input_b is None else f"{self.input.name} x {self.input_b.name}"
            lines = [f"{self.name}: AMD MFMA '{self.kind}', {ins} inputs, output {self.output.name}",
                     f"  block k={self.k}" + (f", F={23 + self.neab}, F2={self.mb}" if self.kind in ("tr_fdpa", "gtr_fdpa") else "")]
        elif self.kind != "bfma":
            lines = [(f"{self.name}: generic '{self.kind}' model, {self.input.name} inputs, "
                     f"accumulator {self.acc.name}, output {self.output.name}")]
        else:
            lines = [
                f"{self.name}: BFMA {self.input.name} -> {self.output.name}",
                (f"  block k={self.k}, neab={self.neab} ({23 + self.neab} grid bits), mel={self.mel}, "
                f"result {self.rounding.upper()} to {self.mb} fraction bits"),
                f"  C enters {self.c_entry}; grouping {self.grouping}; instruction depth {self.instruction_k}",
            ]
        if self.source:
            lines.append(f"  source: {self.source}")
        if self.confidence:
            lines.append(f"  confidence: {self.confidence}")
        return "\n".join(lines)


@ieee_mode
def generic(kind: str, output: FormatLike = "fp32", *, input: FormatLike = "fp32",
            acc: FormatLike = "fp32") -> MMAModel:
    """A generic (non-hardware) model: ``"exact"``, ``"fma_chain"``, ``"pairwise"`` or ``"wide"``.

    Examples
    --------
    >>> m = generic("fma_chain", "fp16")
    >>> (m.name, m.kind, m.acc.name, m.output.name)
    ('fma_chain->fp16', 'fma_chain', 'fp32', 'fp16')
    """
    if kind not in KINDS or kind == "bfma" or kind in AMD_KINDS:
        raise ValueError(f"unknown generic model {kind!r}; valid: exact, fma_chain, pairwise, wide")
    out = as_format(output)
    name = kind if out == fp32 else f"{kind}->{out.name}"
    return MMAModel(name=name, kind=kind, input=as_format(input), output=out, acc=as_format(acc),  # type: ignore[arg-type]
                    rounding="rne", mb=out.mbits, source="plain arithmetic (not a hardware claim)",
                    confidence="exact by construction")


#: Exact dot product plus C, rounded once (RNE) to fp32.
exact: MMAModel = generic("exact")
#: Sequential correctly rounded fp32 FMAs in index order (a CPU loop).
fma_chain: MMAModel = generic("fma_chain")
#: Products rounded to fp32, pairwise tree of fp32 additions, then C.
pairwise: MMAModel = generic("pairwise")
#: float64 accumulation in index order, one rounding to fp32.
wide: MMAModel = generic("wide")

#: ``get_model(device, input[, output])`` of :mod:`fpsim.mma.presets`, which hands it over on import
#: (:func:`_use_presets`): the presets sit above the models and construct them; models never import presets.
_preset_lookup: Callable[..., MMAModel] | None = None


def _use_presets(lookup: Callable[..., MMAModel]) -> None:
    """Let :func:`as_model` resolve ``"device:input[:output]"`` names through `lookup` (the presets' call)."""
    global _preset_lookup
    _preset_lookup = lookup


_GENERICS = {"exact": exact, "fma_chain": fma_chain, "pairwise": pairwise, "wide": wide}


def as_model(model: MMAModel | str | None) -> MMAModel:
    """Parse a model argument: an :class:`MMAModel`, a generic name, ``"device:input[:output]"``, or None (exact).

    Examples
    --------
    >>> as_model("h100:fp8_e4m3").mb
    13
    >>> as_model(None).kind
    'exact'
    """
    if model is None:
        return exact
    if isinstance(model, MMAModel):
        return model
    if isinstance(model, str):
        key = model.strip().lower()
        if key in _GENERICS:
            return _GENERICS[key]
        if ":" in key and _preset_lookup is not None:
            parts = key.split(":")
            if len(parts) in (2, 3):
                return _preset_lookup(*parts)
        raise ValueError(f"unknown model {model!r}; valid: an MMAModel, one of {', '.join(_GENERICS)}, "
                         "or 'device:input[:output]' such as 'h100:fp16:fp32'")
    raise TypeError(f"model must be an MMAModel or a str, got {type(model).__name__}")


# ---------------------------------------------------------------------------------------------------------
# Helpers shared by the kernels
# ---------------------------------------------------------------------------------------------------------

def exponents(x: np.ndarray, emin: int) -> np.ndarray:
    """``max(floor(log2|x|), emin)`` as int16 for finite nonzero x, :data:`NO_EXP` for zero and non-finite."""
    with np.errstate(invalid="ignore"):
        _, e = np.frexp(x)
    e = np.maximum(e.astype(np.int16) - 1, np.int16(emin))
    ok = np.isfinite(x) & (x != 0)
    res: np.ndarray = np.where(ok, e, np.int16(NO_EXP)).astype(np.int16)
    return res


def product_dtype(fmt: Format) -> type[np.floating[Any]]:
    """float32 when every product of two `fmt` values and its scaled terms are exact in float32, else float64."""
    lo = 2 * (fmt.emin - fmt.mbits)
    if 2 * fmt.p <= 24 and 2 * fmt.emax + 2 < 100 and lo > -100:
        return np.float32
    return np.float64


def round_block(v: np.ndarray, mb: int, emin: int, emax: int, rz: bool) -> np.ndarray:
    """Round exact float64 values to ``mb`` fraction bits, quantum clamped at ``2**(emin-mb)``; overflow -> inf.

    RZ (truncation) when `rz`, else RNE. Zero results are +0 (signed zero is not modelled).
    """
    _, ex = np.frexp(v)
    q = np.maximum(ex - 1, emin) - mb
    y = np.ldexp(v, -q)
    y = np.trunc(y) if rz else np.rint(y)
    d = np.ldexp(y, q)
    big = np.abs(d) >= math.ldexp(1.0, emax + 1)
    if big.any():
        d = np.where(big, np.copysign(np.inf, d), d)
    res: np.ndarray = d + 0.0  # -0 -> +0
    return res


def _rne_out(x: np.ndarray, out: Format) -> np.ndarray:
    """RNE to `out` (IEEE overflow) of exact-or-innocuously-rounded float64 values."""
    if out == fp32:
        with np.errstate(over="ignore"):
            return x.astype(np.float32).astype(np.float64)
    return np.asarray(_fround(x, out, "rne"), dtype=np.float64)


_ADD_CONTEXTS: dict[Format, Any] = {}


def fma_round(p: np.ndarray, z: np.ndarray, fmt: Format) -> np.ndarray:
    """RNE_fmt(p + z) for float64 p (an exact product) and z: one correct rounding (fpsim.arith's add)."""
    ctx = _ADD_CONTEXTS.get(fmt)
    if ctx is None:
        ctx = _ADD_CONTEXTS[fmt] = Context(fmt, "rne")
    p, z = np.broadcast_arrays(np.asarray(p, dtype=np.float64), np.asarray(z, dtype=np.float64))
    res: np.ndarray = ctx.add(np.ascontiguousarray(p), np.ascontiguousarray(z))
    return res


def specials(prod_nonfinite: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
             c: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Special-value result of a block: (mask, value) where the result is NaN/inf by step 0, else None."""
    with np.errstate(invalid="ignore"):
        cn, cp, cm = np.isnan(c), c == np.inf, c == -np.inf
    if prod_nonfinite is not None:
        pn, pp, pm = prod_nonfinite
        cn, cp, cm = cn | pn, cp | pp, cm | pm
    mask = cn | cp | cm
    if not mask.any():
        return None
    val = np.where(cn | (cp & cm), np.nan, np.where(cp, np.inf, -np.inf))
    return mask, val


def prod_flags(prod: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-output flags (any NaN, any +inf, any -inf) over axis 0 of a product block."""
    with np.errstate(invalid="ignore"):
        return np.isnan(prod).any(0), (prod == np.inf).any(0), (prod == -np.inf).any(0)


# ---------------------------------------------------------------------------------------------------------
# Generic kernels (all terms along axis 0)
# ---------------------------------------------------------------------------------------------------------

_W = 26  # limb width: two limbs (52 bits) fit a float64 exactly


def exact_sum(terms: np.ndarray, lsb: int, top: int) -> np.ndarray:
    """A float64 per output that rounds exactly like ``sum(terms, axis=0)`` to any precision <= 25 bits.

    Every term must be a finite float64 that is an integer multiple of ``2**lsb`` with ``|term| < 2**top``.
    The exact sum is accumulated in 26-bit int64 limbs; the top 52 bits plus a sticky half-unit are returned.
    """
    n = max(1, -(-(top - lsb) // _W))
    shape = terms.shape[1:]
    nl = n + 3
    limbs = np.zeros((nl,) + shape, dtype=np.int64)
    r = np.ldexp(terms, -lsb)
    for j in range(n - 1, -1, -1):
        if j:
            d = np.trunc(np.ldexp(r, -_W * j))
            r = r - np.ldexp(d, _W * j)
        else:
            d = r
        limbs[j] = np.add.reduce(d, axis=0).astype(np.int64)  # exact: |d| < 2**26, fewer than 2**27 terms
    mask = (1 << _W) - 1

    def normalise(lb: np.ndarray) -> None:
        for j in range(nl - 1):
            carry = lb[j] >> _W
            lb[j] &= mask
            lb[j + 1] += carry

    normalise(limbs)
    neg = limbs[nl - 1] < 0
    if neg.any():
        limbs = np.where(neg, -limbs, limbs)
        normalise(limbs)
    nz = limbs != 0
    anynz = nz.any(0)
    h = (nl - 1) - np.argmax(nz[::-1], axis=0)
    hi = np.take_along_axis(limbs, h[None], 0)[0]
    lo = np.take_along_axis(limbs, np.maximum(h - 1, 0)[None], 0)[0]
    lo = np.where(h >= 1, lo, 0)
    below = np.logical_or.accumulate(nz, axis=0)  # below[j]: some limb <= j is nonzero
    sticky = np.take_along_axis(below, np.maximum(h - 2, 0)[None], 0)[0] & (h >= 2)
    y = (hi.astype(np.float64) * float(1 << _W) + lo.astype(np.float64)) + 0.5 * sticky
    y = np.ldexp(y, (_W * (h - 1) + lsb).astype(np.int32))
    y = np.where(anynz, y, 0.0)
    return np.where(neg, -y, y)


def term_range(x: np.ndarray, fmt: Format) -> tuple[int, int]:
    """(lsb, top) of nonzero finite values of format `fmt` in x: multiples of 2**lsb, below 2**top."""
    e = exponents(x, fmt.emin)
    ok = e != NO_EXP
    if not ok.any():
        return 0, 0
    return int(e[ok].min()) - fmt.mbits, int(e[ok].max()) + 1


def products64(x: np.ndarray, y: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The products ``x*y`` (K along axis 0) in float64, broadcast to ``(K,) + shape`` (no error raised)."""
    with np.errstate(invalid="ignore", over="ignore"):
        prod = x.astype(np.float64) * y.astype(np.float64)
    res: np.ndarray = np.broadcast_to(prod, (x.shape[0],) + shape)
    return res
