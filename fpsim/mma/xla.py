"""Google TPU MXU presets and XLA's dot algorithms, from their documented definitions.

A TPU's matrix unit (MXU) multiplies bfloat16 values and accumulates in IEEE float32 (Cloud TPU documentation,
"The bfloat16 numerical format"). A float32 matrix product therefore runs as one or several bf16 *passes*,
chosen by XLA's dot algorithm (``jax.lax.DotAlgorithmPreset``) or, in the older interface, by the precision
level (``jax.lax.Precision``: on TPU ``DEFAULT`` = one bf16 pass, ``HIGH`` = 3 passes, ``HIGHEST`` = 6).

The splits and the order the partial products are summed in are XLA's own definition, in the rewriter that
implements them (``xla/service/gpu/transforms/dot_algorithm_rewriter.cc`` @e5f7d14):

* ``BF16_BF16_F32``: both operands rounded (RNE) to bf16, one pass.
* ``BF16_BF16_F32_X3``: ``x = hi + lo`` with ``hi`` = x truncated to bf16 (bit mask ``0xFFFF0000``) and
  ``lo = bf16_RNE(x - hi)``; passes ``lo*hi``, ``hi*lo``, ``hi*hi``;
  ``D = (fl(lo·hi + hi·lo) with NaN -> 0) + hi·hi``.
* ``BF16_BF16_F32_X6``: ``x = hi + mid + lo`` (hi, mid truncated; lo = bf16_RNE of the rest); passes
  ``mid·mid, hi·lo, lo·hi, hi·mid, mid·hi`` summed left to right in fp32, NaN -> 0, then ``+ hi·hi``.
  (``lo·lo``, ``mid·lo`` and ``lo·mid`` are dropped.)
* ``TF32_TF32_F32``: operands rounded to tf32, one pass of the device's tf32 path (NVIDIA only).

XLA:GPU's Triton GEMM emitter lowers the same algorithms differently (``lowering="triton"``; the only lowering
of ``_X9`` and ``TF32_TF32_F32_X3``), from ``xla/backends/gpu/codegen/triton/transforms/
stablehlo_lower_to_triton.cc`` @0ffbfc8 and Triton's ``F32DotTC.cpp`` @78ef52f:

* splits by conversion, not truncation: ``hi = bf16_RNE(x)``, ``mid = bf16_RNE(x - hi)``,
  ``lo = bf16_RNE(x - hi - mid)`` (``SplitF32``); TF32x3: ``big = tf32_RNA(x)`` (``cvt.rna.tf32.f32``),
  ``small = x - big`` left in fp32 (the tensor core reads its top 19 bits);
* per K tile of ``block_k`` (the autotuner's choice): a zero fp32 partial goes through every pass *as the
  matrix unit's accumulator* (``tt.dot(a, b, partial)``), in the order ``X3``: lo·hi, hi·lo, [guard], hi·hi;
  ``X6``: mid·mid, lo·hi, hi·lo, mid·hi, hi·mid, [guard], hi·hi; ``X9``: lo·lo, mid·lo, lo·mid, mid·mid, lo·hi,
  hi·lo, mid·hi, hi·mid, [guard], hi·hi; ``TF32_X3``: small·big, big·small, big·big (no guard); then the
  running fp32 accumulator adds the tile's partial;
* the guard is ``select(inf > |r|, r, 0)`` (``ZeroNaNs``): it zeroes infinities as well as NaN, unlike the
  rewriter's ``inf >= |r|``.
* ``F32_F32_F32``: float32 arithmetic; modelled as a sequential fp32 FMA chain (how a backend orders it is
  not documented).

The "NaN -> 0" step is XLA's guard for infinite inputs (``inf = inf + NaN``: the low parts of an infinity
are NaN); it makes ``inf * 1`` come out ``inf`` instead of NaN. Each pass is a bf16 x bf16 -> fp32 matrix
product of the chosen device; on ``"tpu"`` it is modelled as exact products added one after another in fp32
with RNE (the MXU is a systolic array accumulating in fp32; its internal order is not documented), and every
f32 -> bf16 conversion flushes subnormals to zero, as the Cloud TPU documentation says.

Provenance: **from documentation only** (XLA's and Triton's source: what the compiler emits, not what a GPU
or TPU was seen to compute). XLA:CPU (JAX 0.10.2 here) accepts ``BF16_BF16_F32``, ``_X3`` and ``_X6`` and
ignores them (its results equal ``F32_F32_F32`` bit for bit) and rejects ``_X9``, ``TF32_TF32_F32`` and
``TF32_TF32_F32_X3`` ("not supported by dot_general on CPU"), so no CPU run can confirm any of them, and a CPU
is not a TPU. The splits and the compositions are checked against MPFR and ml_dtypes in
``tests/test_mma_xla.py`` and ``tests/test_mma_split.py``, the NVIDIA passes against MMA-Sim; cuBLAS's
``CUBLAS_COMPUTE_32F_EMULATED_16BFX9`` publishes no split or order, so it is not modelled.

>>> import numpy as np
>>> from fpsim.mma import xla
>>> a = np.array([[1 + 2.0**-10]], np.float32); b = np.array([[1.0]], np.float32)
>>> [float(xla.matmul(a, b, algorithm=p)[0, 0]) == 1 + 2.0**-10 for p in ("default", "high", "highest")]
[False, True, True]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .._fpenv import ieee_mode
from .._interop import returns_input_kind
from .._names import norm_name, parse_name
from ..formats import Format, bf16, fp32, tf32
from ..rounding import _as_float_array
from ..rounding import round as _fround
from .gemm import dot as _mma_dot
from .gemm import matmul as _mma_matmul
from .model import MMAModel, as_model, generic
from .presets import (
    DOCUMENTATION,
    DeviceInfo,
    Provenance,
    device_info,
    get_model,
    presets,
    register_device,
    register_preset,
)

__all__ = ["ALGORITHMS", "ALIASES", "PRECISIONS", "TRITON_ALGORITHMS", "DotAlgorithm", "algorithm", "dot", "matmul",
           "mxu_pass", "split"]

_XLA_SRC = ("openxla/xla xla/service/gpu/transforms/dot_algorithm_rewriter.cc @e5f7d14 (splits, passes, "
            "summation order); jax.lax.DotAlgorithmPreset / jax.lax.Precision docstrings (JAX 0.10.2: on TPU "
            "DEFAULT = bf16, HIGH = 3 bf16 passes, HIGHEST = 6)")
_TRITON_SRC = ("openxla/xla xla/backends/gpu/codegen/triton/transforms/stablehlo_lower_to_triton.cc @0ffbfc8 "
               "(EmitBF16x3Matmul/EmitBF16x6Matmul/EmitBF16x9Matmul: SplitF32, pass order, ZeroNaNs, the tile's "
               "partial added to the accumulator)")
_TF32X3_SRC = ("triton-lang/triton lib/Dialect/TritonGPU/Transforms/F32DotTC.cpp @78ef52f (TF32x3: cvt.rna.tf32.f32 "
               "split, small*big, big*small, big*big into a zero accumulator, then + C); openxla/xla "
               "xla/backends/gpu/codegen/triton/compilation_pipeline_cuda.cc @1110d1a (RoundF32ToTF32ForTf32Dot runs "
               "before F32DotTC, so the small parts reach the tensor core unrounded)")
_LOWERINGS = ("rewriter", "triton")
_TPU_SRC = ("Cloud TPU documentation 'The bfloat16 numerical format' (https://cloud.google.com/tpu/docs/bfloat16: "
            "bf16 multiplies, IEEE fp32 accumulation; f32 -> bf16 RNE, overflow to inf, subnormals flushed)")


@ieee_mode
@dataclass(frozen=True)
class DotAlgorithm:
    """One of XLA's dot algorithms: how operands are split and which partial products are summed, in order.

    Parameters
    ----------
    name : str
        XLA's name (``BF16_BF16_F32_X3`` ...).
    part : Format
        Format of each component (bf16, tf32 or fp32).
    components : int
        Components per operand (1, 2 or 3): ``x = c0 + c1 + c2``, c0 the highest.
    passes : tuple of (int, int)
        (lhs component, rhs component) of every pass, in summation order: ``r = p0; r = fl(r + p_i)`` for the
        middle passes, the NaN guard (if `guard`), then ``r = fl(r + p_last)`` (``accumulate="outside"``); or
        the order the passes take the unit's accumulator (``accumulate="unit"``).
    guard : bool
        XLA's ``ReplaceNaNWithZeros`` before the last addition.
    split : {"truncate", "rne", "rna"}
        How the components above the last are cut: bit mask (the rewriter), bf16 RNE conversion (Triton's
        ``SplitF32``), tf32 RNA conversion (``cvt.rna.tf32.f32``, TF32x3; the low part stays fp32).
    accumulate : {"outside", "unit"}
        ``"outside"``: every pass a whole dot, the results added in fp32 after (the rewriter);
        ``"unit"``: per K tile, the passes chained through the matrix unit's accumulator from zero, the
        tile's partial then added to the running fp32 accumulator (Triton).
    guard_keeps_inf : bool
        The guard's comparison: ``inf >= |r|`` keeps infinities (rewriter), ``inf > |r|`` zeroes them (Triton).
    lowering : {"rewriter", "triton"}
        Which XLA:GPU lowering this is.
    source : str
        The source file and commit the definition is read from.

    Examples
    --------
    >>> algorithm("high").passes
    ((1, 0), (0, 1), (0, 0))
    >>> a = algorithm("bf16x9", "h100")
    >>> (a.n_passes, a.split, a.accumulate, a.provenance.label)
    (9, 'rne', 'unit', 'from documentation only')
    """

    name: str
    part: Format
    components: int
    passes: tuple[tuple[int, int], ...]
    guard: bool
    split: str = "truncate"
    accumulate: str = "outside"
    guard_keeps_inf: bool = True
    lowering: str = "rewriter"
    source: str = _XLA_SRC

    def __post_init__(self) -> None:
        for field_name, value, valid in (("split", self.split, ("truncate", "rne", "rna")),
                                         ("accumulate", self.accumulate, ("outside", "unit")),
                                         ("lowering", self.lowering, _LOWERINGS)):
            if value not in valid:
                raise ValueError(f"DotAlgorithm {field_name} must be one of {', '.join(valid)}, got {value!r}")
        if self.components not in (1, 2, 3) or any(not (0 <= i < self.components and 0 <= j < self.components)
                                                   for i, j in self.passes) or not self.passes:
            raise ValueError(f"DotAlgorithm {self.name}: passes {self.passes!r} must name components 0.."
                             f"{self.components - 1} (components 1, 2 or 3)")

    @property
    def n_passes(self) -> int:
        """Number of matrix-unit passes (the ``_X3``/``_X6``/``_X9`` suffix)."""
        return len(self.passes)

    @property
    def provenance(self) -> Provenance:
        """Where the definition comes from: XLA's or Triton's source at a commit; no hardware run confirms it."""
        note = ("read from the compiler source, not validated on hardware: XLA:CPU ignores or rejects it "
                "(JAX 0.10.2); the composition is checked against independent references (MPFR, ml_dtypes, "
                "MMA-Sim passes) in tests/test_mma_split.py and tests/test_mma_xla.py")
        return Provenance(DOCUMENTATION, self.source, note)


ALGORITHMS: dict[str, DotAlgorithm] = {
    "bf16_bf16_f32": DotAlgorithm("BF16_BF16_F32", bf16, 1, ((0, 0),), False),
    "bf16_bf16_f32_x3": DotAlgorithm("BF16_BF16_F32_X3", bf16, 2, ((1, 0), (0, 1), (0, 0)), True),
    "bf16_bf16_f32_x6": DotAlgorithm("BF16_BF16_F32_X6", bf16, 3,
                                     ((1, 1), (0, 2), (2, 0), (0, 1), (1, 0), (0, 0)), True),
    "tf32_tf32_f32": DotAlgorithm("TF32_TF32_F32", tf32, 1, ((0, 0),), False),
    "f32_f32_f32": DotAlgorithm("F32_F32_F32", fp32, 1, ((0, 0),), False),
}
#: XLA:GPU's Triton-emitter lowerings (``lowering="triton"``): RNE (or tf32 RNA) splits, passes chained through
#: the unit's accumulator per K tile; the only lowering of ``_X9`` and ``TF32_TF32_F32_X3``.
TRITON_ALGORITHMS: dict[str, DotAlgorithm] = {
    "bf16_bf16_f32_x3": DotAlgorithm("BF16_BF16_F32_X3", bf16, 2, ((1, 0), (0, 1), (0, 0)), True,
                                     "rne", "unit", False, "triton", _TRITON_SRC),
    "bf16_bf16_f32_x6": DotAlgorithm("BF16_BF16_F32_X6", bf16, 3,
                                     ((1, 1), (2, 0), (0, 2), (1, 0), (0, 1), (0, 0)), True,
                                     "rne", "unit", False, "triton", _TRITON_SRC),
    "bf16_bf16_f32_x9": DotAlgorithm("BF16_BF16_F32_X9", bf16, 3,
                                     ((2, 2), (1, 2), (2, 1), (1, 1), (2, 0), (0, 2), (1, 0), (0, 1), (0, 0)),
                                     True, "rne", "unit", False, "triton", _TRITON_SRC),
    "tf32_tf32_f32_x3": DotAlgorithm("TF32_TF32_F32_X3", tf32, 2, ((1, 0), (0, 1), (0, 0)), False,
                                     "rna", "unit", True, "triton", _TF32X3_SRC),
}
#: Short names of the split-precision algorithms.
ALIASES: dict[str, str] = {"bf16x3": "bf16_bf16_f32_x3", "bf16x6": "bf16_bf16_f32_x6",
                           "bf16x9": "bf16_bf16_f32_x9", "tf32x3": "tf32_tf32_f32_x3"}
#: ``jax.lax.Precision`` levels on TPU (lax.Precision docstring): the algorithm each one runs.
PRECISIONS: dict[str, str] = {"default": "bf16_bf16_f32", "fastest": "bf16_bf16_f32",
                              "high": "bf16_bf16_f32_x3", "highest": "bf16_bf16_f32_x6"}
_TPU_ALGS = ("bf16_bf16_f32", "bf16_bf16_f32_x3", "bf16_bf16_f32_x6")


def _device(device: str) -> DeviceInfo:
    return device_info(device)


@ieee_mode
def algorithm(name: str | DotAlgorithm, device: str = "tpu", lowering: str | None = None) -> DotAlgorithm:
    """Parse an algorithm name (``"BF16_BF16_F32_X3"``, ``"bf16x9"``) or a precision level (``"HIGHEST"``).

    Precision levels follow ``jax.lax.Precision``: on TPU ``default``/``fastest`` = ``BF16_BF16_F32``,
    ``high`` = ``_X3``, ``highest`` = ``_X6``; on an NVIDIA device ``default`` and ``high`` = ``TF32_TF32_F32``
    where the GPU has tf32 (else ``F32_F32_F32``) and ``highest`` = ``F32_F32_F32``.

    `lowering` picks XLA:GPU's ``"rewriter"`` (``dot_algorithm_rewriter.cc``: ``_X3``, ``_X6``) or
    ``"triton"`` (the Triton GEMM emitter: ``_X3``, ``_X6``, ``_X9``, ``TF32_TF32_F32_X3``); default: the
    rewriter where it has the algorithm, else Triton. One-pass algorithms are the same under both. The TPU
    takes the rewriter's definitions only.

    Examples
    --------
    >>> algorithm("HIGHEST").name
    'BF16_BF16_F32_X6'
    >>> algorithm("highest", "h100").name
    'F32_F32_F32'
    >>> algorithm("bf16x3", "h100", lowering="triton").passes
    ((1, 0), (0, 1), (0, 0))
    """
    if isinstance(name, DotAlgorithm):
        return name
    key = norm_name(name, "dot algorithm")
    info = _device(device)
    low = None if lowering is None else parse_name(lowering, _LOWERINGS, "lowering")
    if key in PRECISIONS:
        if info.name == "tpu":
            key = PRECISIONS[key]
        elif info.vendor == "NVIDIA":
            has_tf32 = info.family not in ("volta", "turing")
            key = "f32_f32_f32" if key == "highest" or not has_tf32 else "tf32_tf32_f32"
        else:
            raise ValueError(f"precision levels are defined for tpu and NVIDIA devices, not {info.name}; "
                             f"name an algorithm: {', '.join(a.name for a in ALGORITHMS.values())}")
    key = ALIASES.get(key, key)
    names = list(dict.fromkeys([*ALGORITHMS, *TRITON_ALGORITHMS, *ALIASES, *PRECISIONS]))
    key = parse_name(key, names, "dot algorithm")
    key = ALIASES.get(key, key)
    if low == "triton" and key in TRITON_ALGORITHMS:
        alg = TRITON_ALGORITHMS[key]
    elif key in ALGORITHMS:
        alg = ALGORITHMS[key]  # the rewriter's, or a one-pass algorithm (no split: both lowerings alike)
    elif low == "rewriter":
        raise ValueError(f"{TRITON_ALGORITHMS[key].name} has no rewriter form (dot_algorithm_rewriter.cc @e5f7d14 "
                         "rewrites _X3 and _X6 only); use lowering='triton'")
    else:
        alg = TRITON_ALGORITHMS[key]
    if info.name == "tpu" and (key not in _TPU_ALGS or alg.lowering != "rewriter"):
        raise ValueError(f"{alg.name} ({alg.lowering}) is not a TPU algorithm (the MXU multiplies bf16; the "
                         "Triton lowering is XLA:GPU's); valid on tpu: "
                         f"{', '.join(ALGORITHMS[k].name for k in _TPU_ALGS)} or {', '.join(PRECISIONS)}")
    return alg


@ieee_mode
def mxu_pass(device: str = "tpu", part: str | Format = "bf16") -> MMAModel:
    """The model of one matrix-unit pass on `device` for components of format `part`.

    ``"tpu"``: exact bf16 products added in K order in fp32 with RNE (the documented "bf16 multiplies, fp32
    accumulation"; the MXU's internal order is undocumented). NVIDIA devices: their bf16 / tf32 preset
    (:func:`fpsim.mma.get_model`). ``fp32`` components: a sequential fp32 FMA chain on any device.

    Examples
    --------
    >>> m = mxu_pass("tpu")
    >>> (m.kind, m.input.name, m.acc.name)
    ('fma_chain', 'bf16', 'fp32')
    >>> mxu_pass("h100", "tf32").k
    8
    """
    info = _device(device)
    fmt = part if isinstance(part, Format) else {"bf16": bf16, "tf32": tf32, "fp32": fp32}.get(
        norm_name(part, "pass format"))
    if fmt is None:
        raise ValueError(f"unknown pass format {part!r}; valid: bf16, tf32, fp32")
    if fmt == fp32:
        return generic("fma_chain", "fp32", input="fp32", acc="fp32")
    if info.name == "tpu":
        if fmt != bf16:
            raise ValueError(f"the TPU MXU multiplies bf16, not {fmt.name}")
        return get_model("tpu", "bf16", "fp32")
    return get_model(info.name, fmt, "fp32")


def _tpu_pass_model() -> MMAModel:
    m = generic("fma_chain", "fp32", input="bf16", acc="fp32")
    return m.with_(name="tpu bf16->fp32 (MXU pass)", source=_TPU_SRC,
                   confidence="documentation only: exact bf16 products, fp32 RNE accumulation in K order "
                              "(internal order undocumented)")


def _truncate_bf16(x: np.ndarray) -> np.ndarray:
    """x (float32) with the low 16 bits cleared: XLA's ``Truncate`` (bitcast, AND 0xFFFF0000, bitcast)."""
    res: np.ndarray = (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    return res


def _to_bf16(x: np.ndarray, ftz: bool) -> np.ndarray:
    """f32 -> bf16 conversion (RNE, overflow to inf), subnormal results flushed when `ftz` (TPU)."""
    res: np.ndarray = np.asarray(_fround(x, bf16, "rne", subnormals=not ftz), dtype=np.float32)
    return res


_SPLIT_MODES = ("truncate", "rne", "rna_tf32")


@ieee_mode
def split(x: Any, components: int = 2, *, ftz: bool = False, mode: str = "truncate") -> list[np.ndarray]:
    """XLA's split of float32 values into components (see the module docstring).

    ``mode="truncate"`` (the rewriter): ``components=1``: ``[bf16_RNE(x)]``; 2: ``[hi, bf16_RNE(x - hi)]``;
    3: ``[hi, mid, bf16_RNE(x - hi - mid)]`` with ``hi``/``mid`` truncations (bit masks). ``mode="rne"`` (the
    Triton emitter's ``SplitF32``): every component ``bf16_RNE`` of what the ones above leave.
    ``mode="rna_tf32"`` (Triton's TF32x3, ``components=2``): ``[tf32_RNA(x), x - tf32_RNA(x)]``, the second
    left in fp32 (the tensor core truncates it when it reads it). Values not float32 are rounded (RNE) to
    float32 first. ``ftz=True`` flushes subnormal bf16 results of every conversion to zero (TPU).

    Returns
    -------
    list of float32 ndarray
        The components, highest first.

    Examples
    --------
    >>> hi, lo = split([1 + 2.0**-10 + 2.0**-20])
    >>> float(hi[0]), float(lo[0]) == 2.0**-10
    (1.0, True)
    >>> [float(c[0]) for c in split([1 - 2.0**-9], mode="truncate")] == [1 - 2.0**-8, 2.0**-9]
    True
    >>> [float(c[0]) for c in split([1 - 2.0**-9], mode="rne")] == [1.0, -2.0**-9]
    True
    """
    if isinstance(components, bool) or not isinstance(components, (int, np.integer)):
        raise TypeError(f"components must be an int, got {type(components).__name__}")
    if components not in (1, 2, 3):
        raise ValueError(f"components must be 1, 2 or 3, got {components!r}")
    m = parse_name(mode, _SPLIT_MODES, "split mode")
    if m == "rna_tf32" and components != 2:
        raise ValueError(f"mode 'rna_tf32' splits into 2 components (TF32x3), got components={components!r}")
    x32 = _as_fp32(x, "x")
    return _split_by(x32, int(components), {"truncate": "truncate", "rne": "rne", "rna_tf32": "rna"}[m],
                     bool(ftz))


def _as_fp32(x: Any, name: str) -> np.ndarray:
    arr = np.asarray(_as_float_array(x, name)[0])
    if arr.dtype != np.float32:
        arr = np.asarray(_fround(np.asarray(arr, dtype=np.float64), fp32, "rne"), dtype=np.float64)
        with np.errstate(over="ignore"):
            arr = arr.astype(np.float32)
    return np.ascontiguousarray(arr, dtype=np.float32)


def _split(x: np.ndarray, n: int, ftz: bool) -> list[np.ndarray]:
    if n == 1:
        return [_to_bf16(x, ftz)]
    with np.errstate(invalid="ignore", over="ignore"):
        hi = _truncate_bf16(x)
        r = x - hi  # exact in float32 (same sign and exponent); inf - inf = NaN, as in XLA
        if n == 2:
            return [_to_bf16(hi, ftz), _to_bf16(r, ftz)]
        mid = _truncate_bf16(r)
        lo = r - mid
        return [_to_bf16(hi, ftz), _to_bf16(mid, ftz), _to_bf16(lo, ftz)]


def _split_by(x: np.ndarray, n: int, how: str, ftz: bool) -> list[np.ndarray]:
    """Components of `x` (float32) cut as a DotAlgorithm's ``split`` says."""
    if how == "truncate" or n == 1:
        return _split(x, n, ftz)
    with np.errstate(invalid="ignore", over="ignore"):
        if how == "rna":  # cvt.rna.tf32.f32; x - big is exact in fp32 (|x - big| <= half a tf32 ulp of x)
            big = np.asarray(_fround(x, tf32, "rna"), dtype=np.float32)
            return [big, np.asarray(x - big, dtype=np.float32)]
        parts, rest = [], x
        for i in range(n):  # SplitF32: c = bf16(rest); rest = rest - f32(c), an fp32 RNE subtraction
            c = _to_bf16(rest, ftz)
            parts.append(c)
            if i < n - 1:
                rest = np.asarray(rest - c, dtype=np.float32)
        return parts


def _guard(r: np.ndarray, keep_inf: bool) -> np.ndarray:
    """XLA's NaN guard: ``select(inf >= |r|, r, 0)`` (rewriter) or ``select(inf > |r|, r, 0)`` (Triton)."""
    with np.errstate(invalid="ignore"):
        ok = np.abs(r) <= np.float32(np.inf) if keep_inf else np.abs(r) < np.float32(np.inf)
    return np.where(ok, r, np.float32(0.0)).astype(np.float32)


def _combine(parts: list[np.ndarray], guard: bool) -> np.ndarray:
    """XLA's summation of the pass results (float32 arrays): left to right, NaN -> 0 before the last."""
    with np.errstate(invalid="ignore", over="ignore"):
        r = parts[0]
        for p in parts[1:-1]:
            r = r + p
        if len(parts) > 1:
            if guard:
                r = _guard(r, True)
            r = r + parts[-1]
    return np.asarray(r, dtype=np.float32)


def _unit(op: str, a: np.ndarray, b: np.ndarray, c: np.ndarray | None, pm: MMAModel,
          rounding: str | None) -> np.ndarray:
    if op == "dot":
        d = _mma_dot(a, b, c, pm, input_rounding=rounding)
    else:
        d = _mma_matmul(a, b, c, model=pm, input_rounding=rounding)
    return np.asarray(d, dtype=np.float32)


def _chained(op: str, pa: list[np.ndarray], pb: list[np.ndarray], al: DotAlgorithm, pm: MMAModel,
             rounding: str | None, block_k: int | None) -> np.ndarray:
    """Triton's lowering: per K tile, the passes chained through the unit's accumulator from zero."""
    k = pa[0].shape[-1]
    if op == "dot":
        shape = np.broadcast_shapes(pa[0].shape[:-1], pb[0].shape[:-1])
    else:
        shape = (*np.broadcast_shapes(pa[0].shape[:-2], pb[0].shape[:-2]), pa[0].shape[-2], pb[0].shape[-1])
    step = k if block_k is None else block_k
    acc = np.zeros(shape, np.float32)
    last = len(al.passes) - 1
    for k0 in range(0, k, max(step, 1)):
        ks = slice(k0, min(k0 + step, k))
        part = np.zeros(shape, np.float32)
        for n, (i, j) in enumerate(al.passes):
            if n == last and al.guard:
                part = _guard(part, al.guard_keeps_inf)
            bj = pb[j][..., ks] if op == "dot" else pb[j][..., ks, :]
            part = _unit(op, pa[i][..., ks], bj, part, pm, rounding)
        with np.errstate(invalid="ignore", over="ignore"):
            acc = np.asarray(acc + part, dtype=np.float32)
    return acc


def _run(op: str, a: Any, b: Any, c: Any, alg: str | DotAlgorithm, device: str, pass_model: MMAModel | str | None,
         ftz: bool | None, lowering: str | None = None, block_k: int | None = None) -> Any:
    info = _device(device)
    al = algorithm(alg, info.name, lowering)
    if block_k is not None and (isinstance(block_k, bool) or not isinstance(block_k, (int, np.integer))):
        raise TypeError(f"block_k must be a positive int or None, got {type(block_k).__name__}")
    if block_k is not None and block_k < 1:
        raise ValueError(f"block_k must be a positive int or None, got {block_k!r}")
    pm = mxu_pass(info.name, al.part) if pass_model is None else as_model(pass_model)
    flush = (info.name == "tpu") if ftz is None else bool(ftz)
    a_arr = _as_float_array(a, "a" if op == "dot" else "A")[0]
    b_arr = _as_float_array(b, "b" if op == "dot" else "B")[0]
    both32 = a_arr.dtype == np.float32 and b_arr.dtype == np.float32
    a32, b32 = _as_fp32(a_arr, "A"), _as_fp32(b_arr, "B")
    if al.part == bf16:
        pa, pb = _split_by(a32, al.components, al.split, flush), _split_by(b32, al.components, al.split, flush)
        rounding: str | None = "exact"
    elif al.components == 2:  # TF32x3: fp32 parts; the pass reads them as tf32 (RZ, as tensor cores read fp32)
        pa, pb, rounding = _split_by(a32, 2, al.split, flush), _split_by(b32, 2, al.split, flush), None
    else:  # one component of tf32 (the pass converts: RZ, as the tensor cores read fp32 registers) or fp32
        pa, pb, rounding = [a32], [b32], None
    if al.accumulate == "unit":
        res = _chained(op, pa, pb, al, pm, rounding, None if block_k is None else int(block_k))
    else:
        outs = [_unit(op, pa[i], pb[j], None, pm, rounding) for i, j in al.passes]
        res = _combine(outs, al.guard)
    if c is not None:
        cv = _as_fp32(c, "c" if op == "dot" else "C")
        with np.errstate(invalid="ignore", over="ignore"):
            res = np.asarray(res + cv, dtype=np.float32)  # XLA's dot has no addend: C is one fp32 add after
    out = res if both32 else res.astype(np.float64)
    return out[()] if out.ndim == 0 else out


@ieee_mode
@returns_input_kind(dtype_option=False)
def matmul(A: Any, B: Any, C: Any = None, *, algorithm: str | DotAlgorithm = "default", device: str = "tpu",
           pass_model: MMAModel | str | None = None, ftz: bool | None = None, lowering: str | None = None,
           block_k: int | None = None) -> Any:
    """``D = A @ B (+ C)`` for float32 operands as XLA's dot `algorithm` computes it on `device`.

    Parameters
    ----------
    A, B : array_like, shape (M, K) / (K, N) (batch axes as in :func:`fpsim.matmul`)
        Values not float32 are rounded (RNE) to float32 first (the f32 operands XLA sees).
    C : array_like, optional
        Added last with one fp32 RNE addition (XLA's dot has no addend).
    algorithm : str or DotAlgorithm
        ``BF16_BF16_F32``, ``BF16_BF16_F32_X3``/``_X6``/``_X9``, ``TF32_TF32_F32``, ``TF32_TF32_F32_X3``,
        ``F32_F32_F32`` (short names ``bf16x3``, ``bf16x6``, ``bf16x9``, ``tf32x3``) or a ``jax.lax.Precision``
        level ``default``/``high``/``highest`` (see :func:`algorithm`). Default ``"default"`` (one bf16 pass
        on TPU).
    device : str
        ``"tpu"`` (default) or an NVIDIA device whose bf16/tf32 preset runs each pass (XLA:GPU's rewriter).
    pass_model : MMAModel or str, optional
        Override the model of one pass (e.g. ``"exact"``: each pass rounded once from its exact value).
    ftz : bool, optional
        Flush subnormal bf16 components to zero; default True on ``"tpu"`` (documented), else False.
    lowering : {"rewriter", "triton"}, optional
        XLA:GPU's lowering (see :func:`algorithm`); default the rewriter where it has the algorithm.
    block_k : int, optional
        The Triton lowering's K tile (the autotuner's ``block_k``, in the HLO dump's ``triton_gemm_config``):
        each tile's passes run from a zero partial, which is then added to the fp32 accumulator. Default: K
        in one tile. Split-K (``split_k > 1``) is not modelled. Ignored by the rewriter lowering.

    Returns
    -------
    ndarray
        float32 when A and B are float32, else float64 holding float32 values.

    Examples
    --------
    >>> import numpy as np
    >>> A = np.full((1, 3), 1 + 2.0**-9, np.float32); B = np.ones((3, 1), np.float32)
    >>> float(matmul(A, B, algorithm="BF16_BF16_F32")[0, 0])   # bf16 drops the 2**-9
    3.0
    >>> float(matmul(A, B, algorithm="BF16_BF16_F32_X3")[0, 0]) == 3 * (1 + 2.0**-9)
    True
    >>> x = np.full((1, 4), 1 + 2.0**-9 + 2.0**-17, np.float32)   # 18 bits: more than two bf16 parts hold
    >>> exact = float(np.float32(4 * float(x[0, 0]) ** 2))
    >>> [float(matmul(x, x.T, algorithm=a, device="h100")[0, 0]) == exact for a in ("bf16x3", "bf16x9", "tf32x3")]
    [False, True, True]
    """
    return _run("matmul", A, B, C, algorithm, device, pass_model, ftz, lowering, block_k)


@ieee_mode
@returns_input_kind(dtype_option=False)
def dot(a: Any, b: Any, c: Any = None, *, algorithm: str | DotAlgorithm = "default", device: str = "tpu",
        pass_model: MMAModel | str | None = None, ftz: bool | None = None, lowering: str | None = None,
        block_k: int | None = None) -> Any:
    """``d = sum_i a[..., i] * b[..., i] (+ c)`` under XLA's dot `algorithm` (rows; see :func:`matmul`).

    Examples
    --------
    >>> float(dot([1.0, 2.0**-12], [1.0, 1.0], algorithm="highest")) == 1 + 2.0**-12
    True
    """
    return _run("dot", a, b, c, algorithm, device, pass_model, ftz, lowering, block_k)


# ---------------------------------------------------------------------------------------------------------
# Registration: the TPU device, its MXU pass and the three TPU algorithms
# ---------------------------------------------------------------------------------------------------------

def _tpu_fallback(input: Any, output: Any, path: Any) -> MMAModel:
    valid = ", ".join(f"{p.input}->{p.output}" + ("" if p.path is None else f" (path={p.path!r})")
                      for p in presets("tpu"))
    raise ValueError(f"tpu has no {input!r} -> {output!r} preset{'' if path is None else f' on path {path!r}'}: "
                     "the MXU multiplies bf16 and accumulates in fp32; fp32 operands go through an XLA dot "
                     "algorithm, fpsim.mma.xla.matmul(A, B, algorithm='DEFAULT'|'HIGH'|'HIGHEST'|"
                     f"'BF16_BF16_F32_X3'|...); valid: {valid}")


_SPLIT_PATHS = {"bf16x3_triton": ("bf16_bf16_f32_x3", "bf16"), "bf16x6_triton": ("bf16_bf16_f32_x6", "bf16"),
                "bf16x9_triton": ("bf16_bf16_f32_x9", "bf16"), "tf32x3_triton": ("tf32_tf32_f32_x3", "tf32")}


def _register_split(known: list[tuple[str, str, str, str | None]]) -> None:
    """The split-precision algorithms as fp32 -> fp32 paths of every NVIDIA device with the pass preset."""
    have = {(d, i) for d, i, o, path in known if o == "fp32" and path is None}
    for dev in dict.fromkeys(d for d, _, _, _ in known):
        if _device(dev).vendor != "NVIDIA" or (dev, "fp32", "fp32", "bf16x3_triton") in known:
            continue
        for path, (key, part) in _SPLIT_PATHS.items():
            if (dev, part) not in have:
                continue
            alg = TRITON_ALGORITHMS[key]
            register_preset(dev, "fp32", "fp32", path=path, build=None,
                            usage=f"fpsim.mma.xla.matmul(A, B, algorithm={alg.name!r}, device={dev!r}, "
                                  "lowering='triton', block_k=...)",
                            provenance=Provenance(DOCUMENTATION, alg.source,
                                                  f"XLA:GPU Triton lowering, {alg.n_passes} passes of the {dev} "
                                                  f"{part}->fp32 preset; {alg.provenance.note}"))


def _register() -> None:
    _register_split([(p.device, p.input, p.output, p.path) for p in presets()])
    if "tpu" in {p.device for p in presets()}:
        return
    register_device(DeviceInfo("tpu", "TPU (v2-v6e)", "tpu", "MXU: bf16 multiplies, fp32 accumulation "
                               "(Cloud TPU docs); XLA dot algorithms for fp32", vendor="Google", unit="MXU"),
                    aliases=("googletpu", "cloudtpu", "mxu", "tpuv2", "tpuv3", "tpuv4", "tpuv5e", "tpuv5p",
                             "tpuv6e", "trillium"),
                    fallback=_tpu_fallback)
    note = ("from the documented definitions only: no TPU was run. The MXU pass (exact bf16 products, fp32 RNE "
            "accumulation in K order) is a reading of 'bf16 multiplies, fp32 accumulation'; its internal order "
            "and the TPU compiler's own lowering are not public. XLA:CPU (JAX 0.10.2) ignores the dot algorithm, "
            "so it is no oracle; the split arithmetic is checked against MPFR in tests/test_mma_xla.py")
    register_preset("tpu", "bf16", "fp32", build=_tpu_pass_model,
                    provenance=Provenance(DOCUMENTATION, _TPU_SRC, note))
    for key, level in (("bf16_bf16_f32", "DEFAULT"), ("bf16_bf16_f32_x3", "HIGH"), ("bf16_bf16_f32_x6", "HIGHEST")):
        alg = ALGORITHMS[key]
        register_preset("tpu", "fp32", "fp32", path=key, build=None,
                        usage=f"fpsim.mma.xla.matmul(A, B, algorithm={alg.name!r}) (= Precision.{level} on TPU)",
                        provenance=Provenance(DOCUMENTATION, f"{_XLA_SRC}; {_TPU_SRC}",
                                              f"{alg.n_passes} bf16 pass(es); {note}"))


_register()
