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
* ``F32_F32_F32``: float32 arithmetic; modelled as a sequential fp32 FMA chain (how a backend orders it is
  not documented).

The "NaN -> 0" step is XLA's guard for infinite inputs (``inf = inf + NaN``: the low parts of an infinity
are NaN); it makes ``inf * 1`` come out ``inf`` instead of NaN. Each pass is a bf16 x bf16 -> fp32 matrix
product of the chosen device; on ``"tpu"`` it is modelled as exact products added one after another in fp32
with RNE (the MXU is a systolic array accumulating in fp32; its internal order is not documented), and every
f32 -> bf16 conversion flushes subnormals to zero, as the Cloud TPU documentation says.

Provenance: **from documentation only**. XLA:CPU (JAX 0.10.2 here) accepts these algorithms and ignores them
(its results equal ``F32_F32_F32`` bit for bit), so no CPU run can confirm them, and a CPU is not a TPU. The
split arithmetic itself is checked against MPFR in ``tests/test_mma_xla.py``.

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

__all__ = ["ALGORITHMS", "PRECISIONS", "DotAlgorithm", "algorithm", "dot", "matmul", "mxu_pass", "split"]

_XLA_SRC = ("openxla/xla xla/service/gpu/transforms/dot_algorithm_rewriter.cc @e5f7d14 (splits, passes, "
            "summation order); jax.lax.DotAlgorithmPreset / jax.lax.Precision docstrings (JAX 0.10.2: on TPU "
            "DEFAULT = bf16, HIGH = 3 bf16 passes, HIGHEST = 6)")
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
        middle passes, the NaN guard (if `guard`), then ``r = fl(r + p_last)``.
    guard : bool
        XLA's ``ReplaceNaNWithZeros`` before the last addition.

    Examples
    --------
    >>> algorithm("high").passes
    ((1, 0), (0, 1), (0, 0))
    """

    name: str
    part: Format
    components: int
    passes: tuple[tuple[int, int], ...]
    guard: bool

    @property
    def n_passes(self) -> int:
        """Number of matrix-unit passes (the ``_X3``/``_X6`` suffix)."""
        return len(self.passes)


ALGORITHMS: dict[str, DotAlgorithm] = {
    "bf16_bf16_f32": DotAlgorithm("BF16_BF16_F32", bf16, 1, ((0, 0),), False),
    "bf16_bf16_f32_x3": DotAlgorithm("BF16_BF16_F32_X3", bf16, 2, ((1, 0), (0, 1), (0, 0)), True),
    "bf16_bf16_f32_x6": DotAlgorithm("BF16_BF16_F32_X6", bf16, 3,
                                     ((1, 1), (0, 2), (2, 0), (0, 1), (1, 0), (0, 0)), True),
    "tf32_tf32_f32": DotAlgorithm("TF32_TF32_F32", tf32, 1, ((0, 0),), False),
    "f32_f32_f32": DotAlgorithm("F32_F32_F32", fp32, 1, ((0, 0),), False),
}
#: ``jax.lax.Precision`` levels on TPU (lax.Precision docstring): the algorithm each one runs.
PRECISIONS: dict[str, str] = {"default": "bf16_bf16_f32", "fastest": "bf16_bf16_f32",
                              "high": "bf16_bf16_f32_x3", "highest": "bf16_bf16_f32_x6"}
_TPU_ALGS = ("bf16_bf16_f32", "bf16_bf16_f32_x3", "bf16_bf16_f32_x6")


def _device(device: str) -> DeviceInfo:
    return device_info(device)


@ieee_mode
def algorithm(name: str | DotAlgorithm, device: str = "tpu") -> DotAlgorithm:
    """Parse an algorithm name (``"BF16_BF16_F32_X3"``) or a precision level (``"HIGHEST"``) for `device`.

    Precision levels follow ``jax.lax.Precision``: on TPU ``default``/``fastest`` = ``BF16_BF16_F32``,
    ``high`` = ``_X3``, ``highest`` = ``_X6``; on an NVIDIA device ``default`` and ``high`` = ``TF32_TF32_F32``
    where the GPU has tf32 (else ``F32_F32_F32``) and ``highest`` = ``F32_F32_F32``.

    Examples
    --------
    >>> algorithm("HIGHEST").name
    'BF16_BF16_F32_X6'
    >>> algorithm("highest", "h100").name
    'F32_F32_F32'
    """
    if isinstance(name, DotAlgorithm):
        return name
    key = norm_name(name, "dot algorithm")
    info = _device(device)
    if key in PRECISIONS:
        if info.name == "tpu":
            key = PRECISIONS[key]
        elif info.vendor == "NVIDIA":
            has_tf32 = info.family not in ("volta", "turing")
            key = "f32_f32_f32" if key == "highest" or not has_tf32 else "tf32_tf32_f32"
        else:
            raise ValueError(f"precision levels are defined for tpu and NVIDIA devices, not {info.name}; "
                             f"name an algorithm: {', '.join(a.name for a in ALGORITHMS.values())}")
    key = parse_name(key, list(ALGORITHMS) + list(PRECISIONS), "dot algorithm")
    alg = ALGORITHMS[key]
    if info.name == "tpu" and key not in _TPU_ALGS:
        raise ValueError(f"{alg.name} is not a TPU algorithm (the MXU multiplies bf16); valid on tpu: "
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


@ieee_mode
def split(x: Any, components: int = 2, *, ftz: bool = False) -> list[np.ndarray]:
    """XLA's split of float32 values into 1, 2 or 3 bf16 components (see the module docstring).

    ``components=1``: ``[bf16_RNE(x)]``; 2: ``[hi, bf16_RNE(x - hi)]``; 3: ``[hi, mid, bf16_RNE(x - hi - mid)]``
    with ``hi``/``mid`` truncations (bit masks). Values not float32 are rounded (RNE) to float32 first.
    ``ftz=True`` flushes subnormal bf16 results of every conversion to zero (TPU).

    Returns
    -------
    list of float32 ndarray
        The components (values of bf16), highest first.

    Examples
    --------
    >>> hi, lo = split([1 + 2.0**-10 + 2.0**-20])
    >>> float(hi[0]), float(lo[0]) == 2.0**-10
    (1.0, True)
    """
    if isinstance(components, bool) or not isinstance(components, (int, np.integer)):
        raise TypeError(f"components must be an int, got {type(components).__name__}")
    if components not in (1, 2, 3):
        raise ValueError(f"components must be 1, 2 or 3, got {components!r}")
    x32 = _as_fp32(x, "x")
    return _split(x32, int(components), bool(ftz))


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


def _combine(parts: list[np.ndarray], guard: bool) -> np.ndarray:
    """XLA's summation of the pass results (float32 arrays): left to right, NaN -> 0 before the last."""
    with np.errstate(invalid="ignore", over="ignore"):
        r = parts[0]
        for p in parts[1:-1]:
            r = r + p
        if len(parts) > 1:
            if guard:
                r = np.where(np.abs(r) <= np.float32(np.inf), r, np.float32(0.0))  # select(inf >= |r|, r, 0)
            r = r + parts[-1]
    return np.asarray(r, dtype=np.float32)


def _run(op: str, a: Any, b: Any, c: Any, alg: str | DotAlgorithm, device: str, pass_model: MMAModel | str | None,
         ftz: bool | None) -> Any:
    info = _device(device)
    al = algorithm(alg, info.name)
    pm = mxu_pass(info.name, al.part) if pass_model is None else as_model(pass_model)
    flush = (info.name == "tpu") if ftz is None else bool(ftz)
    a_arr = _as_float_array(a, "a" if op == "dot" else "A")[0]
    b_arr = _as_float_array(b, "b" if op == "dot" else "B")[0]
    both32 = a_arr.dtype == np.float32 and b_arr.dtype == np.float32
    a32, b32 = _as_fp32(a_arr, "A"), _as_fp32(b_arr, "B")
    if al.part == bf16:
        pa, pb = _split(a32, al.components, flush), _split(b32, al.components, flush)
        rounding = "exact"
    else:  # one component of tf32 (the pass converts: RZ, as the tensor cores read fp32 registers) or fp32
        pa, pb, rounding = [a32], [b32], None
    outs = []
    for i, j in al.passes:
        if op == "dot":
            d = _mma_dot(pa[i], pb[j], None, pm, input_rounding=rounding)
        else:
            d = _mma_matmul(pa[i], pb[j], None, model=pm, input_rounding=rounding)
        outs.append(np.asarray(d, dtype=np.float32))
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
           pass_model: MMAModel | str | None = None, ftz: bool | None = None) -> Any:
    """``D = A @ B (+ C)`` for float32 operands as XLA's dot `algorithm` computes it on `device`.

    Parameters
    ----------
    A, B : array_like, shape (M, K) / (K, N) (batch axes as in :func:`fpsim.matmul`)
        Values not float32 are rounded (RNE) to float32 first (the f32 operands XLA sees).
    C : array_like, optional
        Added last with one fp32 RNE addition (XLA's dot has no addend).
    algorithm : str or DotAlgorithm
        ``BF16_BF16_F32``, ``BF16_BF16_F32_X3``, ``BF16_BF16_F32_X6``, ``TF32_TF32_F32``, ``F32_F32_F32`` or a
        ``jax.lax.Precision`` level ``default``/``high``/``highest`` (see :func:`algorithm`). Default
        ``"default"`` (one bf16 pass on TPU).
    device : str
        ``"tpu"`` (default) or an NVIDIA device whose bf16/tf32 preset runs each pass (XLA:GPU's rewriter).
    pass_model : MMAModel or str, optional
        Override the model of one pass (e.g. ``"exact"``: each pass rounded once from its exact value).
    ftz : bool, optional
        Flush subnormal bf16 components to zero; default True on ``"tpu"`` (documented), else False.

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
    """
    return _run("matmul", A, B, C, algorithm, device, pass_model, ftz)


@ieee_mode
@returns_input_kind(dtype_option=False)
def dot(a: Any, b: Any, c: Any = None, *, algorithm: str | DotAlgorithm = "default", device: str = "tpu",
        pass_model: MMAModel | str | None = None, ftz: bool | None = None) -> Any:
    """``d = sum_i a[..., i] * b[..., i] (+ c)`` under XLA's dot `algorithm` (rows; see :func:`matmul`).

    Examples
    --------
    >>> float(dot([1.0, 2.0**-12], [1.0, 1.0], algorithm="highest")) == 1 + 2.0**-12
    True
    """
    return _run("dot", a, b, c, algorithm, device, pass_model, ftz)


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


def _register() -> None:
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
