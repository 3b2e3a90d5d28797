"""Dot products and GEMMs under an :class:`~fpsim.mma.MMAModel`, with optional fp32 promotion and scales.

:func:`dot` chains one model's blocks along K for many rows at once; :func:`matmul` does the same for every
output of a GEMM, tile by tile (memory stays bounded), optionally promoting the partial sum into an fp32
accumulator every ``promote_every`` products (DeepSeek-V3's fix for FP8 on Hopper) and applying per-block
dequantisation scales at each promotion.

BFMA models run in a compiled kernel (``fpsim/_cgemm.c``: integer arithmetic, vectorised over outputs, tiled,
threaded over output tiles with the GIL released; threads per :data:`fpsim.rounding.max_threads`) when it was
built at install; it gives the same bits as the NumPy kernels of :mod:`fpsim.mma.model`, which stay as the
reference and the fallback (``fpsim.mma.gemm.use_c_gemm = False`` forces them; tests/test_cgemm.py checks the
two against each other on every NVIDIA preset). Promotion and scales are applied in NumPy on the kernel's
partial sums. The generic ``wide``, ``fma_chain`` and ``pairwise`` models have compiled kernels too (without
promotion); ``exact`` uses BLAS on error-free slices, the AMD kinds :mod:`fpsim.mma.amd`.

What is *not* modelled: the order a real GEMM library (cuBLAS, CUTLASS) splits K across MMA instructions,
warps and split-K partitions. Here every output is one chain of blocks in increasing K order.
"""

from __future__ import annotations

import functools
import math
import os
from typing import Any

import numpy as np

from .._fpenv import ieee_mode
from .._interop import returns_input_kind
from .._names import parse_name
from ..formats import Format, fp32, tf32
from ..rounding import _as_float_array, _first_non_value
from ..rounding import round as _fround
from .amd import run_mfma
from .blockscaled import BlockScaledModel, _from_matmul
from .model import (
    AMD_KINDS,
    NO_EXP,
    MMAModel,
    as_model,
    bfma_instruction,
    exact_sum,
    exponents,
    fma_round,
    generic_reduce,
    product_dtype,
    term_range,
)
from .model import _rne_out as _rne
from .scaled import ScaledTensor

__all__ = ["convert_inputs", "dot", "matmul"]

try:  # the compiled BFMA GEMM (fpsim/_cgemm.c, built at install time); the NumPy path is reference and fallback
    from .. import _cgemm  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - exercised where no compiler was available
    _cgemm = None

use_c_gemm: bool = _cgemm is not None
"""Whether BFMA GEMMs and dots (``kind="bfma"``) and the generic ``wide``, ``fma_chain`` and ``pairwise`` GEMMs
run in the compiled kernels (set False to force the NumPy reference).
Threads: :data:`fpsim.rounding.max_threads`; the bits do not depend on it (each output is one chain)."""

_C_MIN_PARALLEL = 1 << 20  # MACs below which the compiled GEMM runs on one thread

_INPUT_ROUNDINGS = ("rne", "rtz", "exact")

# Elements of one (k, Mt, Nt) product block (BFMA) or one (K, Mt, Nt) product array (generic models).
_BLOCK_ELEMS = 1 << 18
_GENERIC_ELEMS = 1 << 20
# Elements of each operand gathered at once from broadcast operands (rows of dot, batch entries of matmul):
# memory follows the data, never the broadcast product.
_GATHER_ELEMS = 1 << 19


@ieee_mode
def convert_inputs(x: Any, fmt: Format, input_rounding: str | None, name: str) -> np.ndarray:
    """Values of `x` in `fmt` as float64.

    ``input_rounding``: ``None`` = ``"rtz"`` for tf32 (what A100 does with fp32 registers: the low 13
    fraction bits are dropped) and ``"rne"`` otherwise (CUDA's ``__float2half``/``__float2bfloat16``
    and saturating ``__nv_cvt_float_to_fp8`` round to nearest); ``"rtz"``/``"rne"`` force a mode;
    ``"exact"`` raises ``ValueError`` if a value is not representable.
    """
    arr, _ = _as_float_array(x, name)
    if arr.dtype != np.float32:  # float32 is rounded as it is (same values, half the memory traffic)
        arr = np.asarray(arr, dtype=np.float64)
    if input_rounding is None:
        mode = "rtz" if fmt == tf32 else "rne"
    else:
        mode = parse_name(input_rounding, _INPUT_ROUNDINGS, "input_rounding")
    overflow = "saturate" if fmt.width <= 8 else "ieee"
    if mode == "exact":
        v = _first_non_value(arr, fmt)
        if v is not None:
            raise ValueError(f"{name} holds {v!r}, not exactly representable in {fmt.name}; "
                             "pass input_rounding='rne' or 'rtz' to convert")
        return np.asarray(_fround(arr, fmt, "rne"), dtype=np.float64)
    return np.asarray(_fround(arr, fmt, "rtz" if mode == "rtz" else "rne", overflow=overflow), dtype=np.float64)


def _convert_c_fmt(c: Any, fmt: Format, shape: tuple[int, ...]) -> np.ndarray:
    """C rounded (RNE) to `fmt` and broadcast to the output shape, as float64."""
    if c is None:
        return np.zeros(shape)
    arr = np.asarray(_as_float_array(c, "c")[0], dtype=np.float64)
    arr = np.asarray(_fround(arr, fmt, "rne"), dtype=np.float64)
    try:
        return np.ascontiguousarray(np.broadcast_to(arr, shape), dtype=np.float64)
    except ValueError:
        raise ValueError(f"c of shape {arr.shape} does not broadcast to the output shape {shape}") from None


def _compact_lead(x: Any, keep: int) -> tuple[Any, tuple[int, ...] | None]:
    """A broadcast view's repeated leading axes (stride 0, e.g. from ``np.broadcast_to``) cut to length 1.

    The last `keep` axes are left alone. Returns ``(view, x.shape)`` when some axis was cut (dot and matmul
    broadcast it again by shape, so the repeated entries are neither converted nor copied), else ``(x, None)``.
    """
    if not isinstance(x, np.ndarray) or x.ndim <= keep:
        return x, None
    cut = [i for i in range(x.ndim - keep) if x.strides[i] == 0 and x.shape[i] > 1]
    if not cut:
        return x, None
    return x[tuple(slice(0, 1) if i in cut else slice(None) for i in range(x.ndim))], x.shape


def _pad_k(x: np.ndarray, e: np.ndarray, mult: int) -> tuple[np.ndarray, np.ndarray]:
    """Zero-pad axis 0 to a multiple of `mult` (exponents with NO_EXP)."""
    k = x.shape[0]
    pad = (-k) % mult
    if pad == 0:
        return x, e
    zshape = (pad,) + x.shape[1:]
    return (np.concatenate([x, np.zeros(zshape, x.dtype)], 0),
            np.concatenate([e, np.full(zshape, NO_EXP, np.int16)], 0))


def _run_terms(x: np.ndarray, y: np.ndarray, ex: np.ndarray, ey: np.ndarray, c: np.ndarray,
               model: MMAModel, has_specials: bool, lsb_top: tuple[int, int] | None) -> np.ndarray:
    """One model over all K (axis 0) of the products ``x*y`` (broadcast), addends c; returns D (float64)."""
    if model.kind in AMD_KINDS:
        return run_mfma(x, y, c, model)
    if model.kind != "bfma":
        with np.errstate(invalid="ignore", over="ignore"):
            prod = x.astype(np.float64) * y.astype(np.float64)
        prod = np.broadcast_to(prod, (x.shape[0],) + c.shape)
        return generic_reduce(prod, c, model, lsb_top, has_specials=has_specials)
    ki = model.instruction_k
    d = c
    with np.errstate(invalid="ignore"):
        for j in range(0, x.shape[0], ki):
            prod = x[j:j + ki] * y[j:j + ki]  # (ki, *S)
            e = ex[j:j + ki] + ey[j:j + ki]
            d = bfma_instruction(prod, e, d, model, has_specials=has_specials)
    return d


def _prepare(v: np.ndarray, model: MMAModel) -> tuple[np.ndarray, np.ndarray]:
    """Carrier array (product dtype for BFMA, float64 for generics) and int16 exponents of input values."""
    e = exponents(v, model.input.emin)
    dt = product_dtype(model.input) if model.kind == "bfma" else np.float64
    return v.astype(dt), e


def _lsb_top(a: np.ndarray, b: np.ndarray, model: MMAModel) -> tuple[int, int] | None:
    if model.kind != "exact":
        return None
    fin_a = np.where(np.isfinite(a), a, 0.0)
    fin_b = np.where(np.isfinite(b), b, 0.0)
    la, ta = term_range(fin_a, model.input)
    lb, tb = term_range(fin_b, model.input)
    return la + lb, ta + tb


@ieee_mode
@returns_input_kind(dtype_option=False)
def dot(a: Any, b: Any, c: Any = None, model: MMAModel | str | None = None, *,
        input_rounding: str | None = None) -> Any:
    """``D = c + sum_i a[..., i] * b[..., i]`` under `model`, chaining its blocks along K in order.

    Parameters
    ----------
    a, b : array_like, shape (..., K)
        Rows of A and columns of B (broadcast against each other). Converted to ``model.input`` first
        (see `input_rounding`).
    c : array_like, shape (...), optional
        Addends, rounded (RNE) to ``model.output``; default 0.
    model : MMAModel or str, optional
        A preset from :func:`fpsim.mma.get_model`, a generic name (``"exact"``, ``"fma_chain"``,
        ``"pairwise"``, ``"wide"``) or ``"device:input[:output]"``. Default ``exact``.
    input_rounding : {None, "rne", "rtz", "exact"}
        How values not representable in the input format are converted. ``None``: RZ (truncation) for
        tf32, as A100 does with fp32 registers; RNE for the other formats (CUDA's conversions).
        ``"exact"`` refuses unrepresentable values.

    Returns
    -------
    ndarray or numpy scalar
        D with shape (...); float32 when `a` and `b` are float32, else float64.

    Examples
    --------
    >>> from fpsim.mma import dot, get_model
    >>> u = 2.0**-24
    >>> float(dot([1, 1, 1, 1], [u, u, u, u], 1.0, get_model("v100", "fp16")))  # P2: V100 loses all 4
    1.0
    >>> float(dot([1, 1, 1, 1], [u, u, u, u], 1.0, get_model("a100", "fp16"))) == 1 + 2**-22
    True
    """
    m = as_model(model)
    if isinstance(a, ScaledTensor) or isinstance(b, ScaledTensor):
        raise TypeError("dot takes plain arrays; multiply ScaledTensor operands with fpsim.matmul, or pass "
                        "t.data (and apply t.scale yourself)")
    a_in, a_full = _compact_lead(a, 1)
    b_in, b_full = _compact_lead(b, 1)
    a_arr = _as_float_array(a_in, "a")[0]
    b_arr = _as_float_array(b_in, "b")[0]
    a32, b32 = a_arr.dtype == np.float32, b_arr.dtype == np.float32
    if a_arr.ndim == 0 or b_arr.ndim == 0:
        raise ValueError("a and b need at least one axis (K)")
    if a_arr.shape[-1] != b_arr.shape[-1]:
        raise ValueError(f"a and b disagree on K: {a_arr.shape[-1]} vs {b_arr.shape[-1]}")
    av = convert_inputs(a_arr, m.input, input_rounding, "a")
    bv = convert_inputs(b_arr, m.b_format, input_rounding, "b")
    a_shape, b_shape = a_full or av.shape, b_full or bv.shape
    try:
        shape = np.broadcast_shapes(a_shape[:-1], b_shape[:-1])
    except ValueError:
        raise ValueError(f"a of shape {a_shape} and b of shape {b_shape} do not broadcast against each "
                         "other (their axes before K)") from None
    k = av.shape[-1]
    cv = _convert_c_fmt(c, m.output, shape)
    r = int(np.prod(shape, dtype=np.int64))
    if k == 0 or r == 0:
        # The empty sum is +0 (as in matmul): D = C + 0 for every model.
        res0 = cv.reshape(shape) + 0.0
        if a32 and b32:
            res0 = res0.astype(np.float32)
        return res0[()] if res0.ndim == 0 else res0
    # The operands stay as they are (one row per entry of their own leading shape): the broadcast rows are
    # gathered a chunk at a time, so memory follows the data, not the broadcast product.
    a2 = av.reshape(int(np.prod(av.shape[:-1], dtype=np.int64)), k)
    b2 = bv.reshape(int(np.prod(bv.shape[:-1], dtype=np.int64)), k)
    cflat = cv.reshape(r)
    out = np.empty(r)
    rc = max(1, _GATHER_ELEMS // k)  # rows per gathered chunk
    params = _c_params(m) if use_c_gemm and _cgemm is not None else None
    if params is not None:
        threads = _c_threads(r * k)
        for r0 in range(0, r, rc):
            r1 = min(r, r0 + rc)
            at = np.ascontiguousarray(_bcast_rows(a2, av.shape[:-1], shape, r0, r1).T)  # (K, rows)
            bt = np.ascontiguousarray(_bcast_rows(b2, bv.shape[:-1], shape, r0, r1).T)
            out[r0:r1] = _c_dot(at, bt, cflat[r0:r1], m, params, threads)
    else:
        # Every broadcast row is a row of a2 / b2 (r > 0): checks over the operands hold for the rows.
        has_specials = not (np.isfinite(a2).all() and np.isfinite(b2).all() and np.isfinite(cv).all())
        lsb_top = _lsb_top(a2, b2, m)
        per = _BLOCK_ELEMS if m.kind == "bfma" else _GENERIC_ELEMS
        step = max(1, per // max(1, m.instruction_k if m.kind == "bfma" else k))
        for g0 in range(0, r, rc):
            g1 = min(r, g0 + rc)
            xa, ea = _prepare(np.ascontiguousarray(_bcast_rows(a2, av.shape[:-1], shape, g0, g1).T), m)
            xb, eb = _prepare(np.ascontiguousarray(_bcast_rows(b2, bv.shape[:-1], shape, g0, g1).T), m)
            if m.kind == "bfma":
                xa, ea = _pad_k(xa, ea, m.instruction_k)
                xb, eb = _pad_k(xb, eb, m.instruction_k)
            for r0 in range(0, g1 - g0, step):
                sl = slice(r0, min(g1 - g0, r0 + step))
                out[g0 + sl.start:g0 + sl.stop] = _run_terms(xa[:, sl], xb[:, sl], ea[:, sl], eb[:, sl],
                                                             cflat[g0 + sl.start:g0 + sl.stop], m, has_specials,
                                                             lsb_top)
    res = out.reshape(shape)
    if a32 and b32:
        res = res.astype(np.float32)
    return res[()] if res.ndim == 0 else res


def _bcast_rows(flat: np.ndarray, lead: tuple[int, ...], full: tuple[int, ...], i0: int, i1: int) -> np.ndarray:
    """Entries ``i0:i1`` (C order over `full`) of an operand broadcast over its leading axes, gathered.

    `flat` holds the operand with its leading axes (shape `lead`) flattened into axis 0; `full` is the
    broadcast leading shape. The result equals ``np.broadcast_to(x, full + tail).reshape(-1, *tail)[i0:i1]``
    without materialising the broadcast: a view when no gathering is needed (a slice of `flat`, or its one
    entry repeated), else a copy of ``i1 - i0`` entries.
    """
    pad = (1,) * (len(full) - len(lead)) + tuple(lead)
    if pad == tuple(full):
        return flat[i0:i1]
    if flat.shape[0] == 1:
        return np.broadcast_to(flat[0], (i1 - i0,) + flat.shape[1:])
    multi = np.unravel_index(np.arange(i0, i1), full)
    idx = np.zeros(i1 - i0, dtype=np.intp)
    stride = 1
    for d in range(len(full) - 1, -1, -1):
        if pad[d] != 1:  # broadcast axes (size 1 in the operand) index its one entry
            idx += multi[d] * stride
        stride *= pad[d]
    res: np.ndarray = flat[idx]
    return res


def _expand_scales(scales: Any, m_: int, n_: int, groups: int) -> tuple[np.ndarray, np.ndarray]:
    if not (isinstance(scales, (tuple, list)) and len(scales) == 2):
        raise TypeError("scales must be a pair (scale_a, scale_b)")
    sa = np.asarray(_as_float_array(scales[0], "scales[0]")[0], dtype=np.float64)
    sb = np.asarray(_as_float_array(scales[1], "scales[1]")[0], dtype=np.float64)
    try:
        sa = np.broadcast_to(sa, (m_, groups))
    except ValueError:
        raise ValueError(f"scale_a has shape {sa.shape}; expected (M, K/promote_every) = ({m_}, {groups})"
                         " (one factor per 1x128 tile of A)") from None
    nb = -(-n_ // 128)
    if sb.ndim == 2 and sb.shape == (groups, nb) and nb != n_:
        sb = np.repeat(sb, 128, axis=1)[:, :n_]
    try:
        sb = np.broadcast_to(sb, (groups, n_))
    except ValueError:
        raise ValueError(f"scale_b has shape {sb.shape}; expected (K/promote_every, ceil(N/128)) = "
                         f"({groups}, {nb}) (one factor per 128x128 block of B) or ({groups}, {n_})") from None
    return sa, sb


@ieee_mode
@returns_input_kind(dtype_option=False)
def matmul(A: Any, B: Any, C: Any = None, *, model: MMAModel | BlockScaledModel | str | None = None,
           promote_every: int | None = None, scales: Any = None,
           input_rounding: str | None = None) -> Any:
    """``D = C + A @ B`` with every output computed as one chain of `model`'s blocks along K.

    Parameters
    ----------
    A : array_like, shape (M, K) or (..., M, K)
    B : array_like, shape (K, N) or (..., K, N)
        Converted to ``model.input`` (see `input_rounding`, as in :func:`dot`).
    C : array_like, broadcastable to (..., M, N), optional
        Rounded (RNE) to ``model.output`` (or fp32 when promoting); default 0.
    model : MMAModel, BlockScaledModel or str, optional
        Default ``exact`` (the exact product plus C rounded once to fp32). A
        :class:`~fpsim.mma.BlockScaledModel` (Blackwell ``kind::f8f6f4`` / block-scaled MMA) runs
        :func:`fpsim.mma.matmul_block_scaled`, with ``scales=(scale_a, scale_b)`` as its block scales.
    promote_every : int, optional
        Every `promote_every` products along K the matrix unit's partial sum (started from 0) is added
        into an fp32 accumulator with one RNE rounding, as DeepSeek-V3 does on H800 (N_C = 128). Must be
        a multiple of the model's instruction depth. The result is then fp32.
    scales : (scale_a, scale_b), optional
        **Decode** (dequantisation) factors, ``x ≈ q * factor`` (TransformerEngine's ``scale_inv``), applied
        at each promotion (requires `promote_every`). Not the *encode* scales that
        :func:`fpsim.scaling.compute_scale` / :func:`fpsim.scaling.scale_and_quantize` return (their
        reciprocals: passing those is wrong by the square of the scale). Prefer passing A and B as
        :class:`~fpsim.scaling.ScaledTensor` (from :func:`fpsim.scaling.quantize_scaled`), which carry their
        factors. ``scale_a`` of shape
        (M, G) with ``G = ceil(K / promote_every)`` (1 x promote_every tiles of A), ``scale_b`` of shape
        (G, ceil(N/128)) (promote_every x 128 blocks of B) or (G, N). At promotion
        ``acc = RN_fp32(RN_fp32(sa*sb) * partial + acc)`` (one fused multiply-add, as the CUDA-core code
        compiles it).
    input_rounding : {None, "rne", "rtz", "exact"}
        As in :func:`dot`.

    Returns
    -------
    ndarray
        Shape (..., M, N); float32 when A and B are float32, else float64. K = 0 gives C (rounded to the
        output format; +0 without C: the empty sum is +0, and a -0 addend becomes +0); M = 0 or N = 0 an
        empty result, as NumPy.

    Notes
    -----
    **Scaled operands.** When A and B are :class:`~fpsim.scaling.ScaledTensor` (both, at least 2-D), their
    data (values of their formats) enter the model exactly (a format the model's input cannot hold raises
    ``ValueError``) and their decode factors ``f = float32(scale * global_scale)`` are applied in fp32:

    * factors constant along K (per tensor, per row of A, per column of B): in the epilogue, as cuBLAS
      applies ``alpha``: ``D = RN_fp32(RN_fp32(f_a * f_b) * acc + C)`` with ``acc`` the model's product of
      the data;
    * factors varying along K (1 x g tiles / g x n blocks / MX and NVFP4 blocks along K, the same ``g`` for
      A and B or one a multiple of the other): at promotion every ``g`` products, as with ``scales=``
      (``promote_every`` defaults to ``g`` and must equal it; ``g`` must be a multiple of the model's
      instruction depth). Hardware that applies MX/NVFP4 block scales inside the MMA instruction is not
      modelled.

    Examples
    --------
    >>> import numpy as np, fpsim
    >>> A = np.full((2, 4), 1.0); B = np.full((4, 3), 2.0**-24)
    >>> float(fpsim.matmul(A, B, 1.0, model="v100:fp16")[0, 0])
    1.0
    >>> float(fpsim.matmul(A, B, 1.0)[0, 0]) == 1 + 2**-22
    True
    """
    if isinstance(model, BlockScaledModel):  # Blackwell kind::f8f6f4 / block-scaled MMA (blockscaled.py)
        return _from_matmul(A, B, C, model, promote_every, scales, input_rounding)
    m = as_model(model)
    if isinstance(A, ScaledTensor) or isinstance(B, ScaledTensor):
        return _matmul_scaled(A, B, C, m, promote_every, scales, input_rounding)
    a_in, a_full = _compact_lead(A, 2)  # repeated batch entries of broadcast views: converted once
    b_in, b_full = _compact_lead(B, 2)
    a_arr = _as_float_array(a_in, "A")[0]
    b_arr = _as_float_array(b_in, "B")[0]
    a32, b32 = a_arr.dtype == np.float32, b_arr.dtype == np.float32
    if a_arr.ndim < 1 or b_arr.ndim < 1:
        raise ValueError("A and B need at least one axis")
    vec_a, vec_b = a_arr.ndim == 1, b_arr.ndim == 1
    if vec_a:
        a_arr = a_arr[None, :]
    if vec_b:
        b_arr = b_arr[:, None]
    if a_arr.shape[-1] != b_arr.shape[-2]:
        raise ValueError(f"A and B disagree on K: A has shape {a_arr.shape}, B has shape {b_arr.shape}")
    if promote_every is not None:
        if isinstance(promote_every, (bool, np.bool_)) or not isinstance(promote_every, (int, np.integer)):
            raise TypeError(f"promote_every must be an int, got {type(promote_every).__name__}: {promote_every!r}")
        if promote_every < 1:
            raise ValueError(f"promote_every must be a positive integer, got {promote_every!r}")
        if m.kind == "bfma" and promote_every % m.instruction_k:
            raise ValueError(f"promote_every={promote_every} is not a multiple of the model's instruction "
                             f"depth {m.instruction_k}")
    if scales is not None and promote_every is None:
        raise ValueError("scales are applied at promotion: give promote_every too (DeepSeek-V3: 128)")
    av = convert_inputs(a_arr, m.input, input_rounding, "A")
    bv = convert_inputs(b_arr, m.b_format, input_rounding, "B")
    batch = np.broadcast_shapes((a_full or av.shape)[:-2], (b_full or bv.shape)[:-2])
    mm, kk, nn = av.shape[-2], av.shape[-1], bv.shape[-1]
    out_shape = batch + (mm, nn)
    # C joins the fp32 accumulator when promoting, else the matrix unit's first block.
    cv = _convert_c_fmt(C, fp32 if promote_every is not None else m.output, out_shape)
    if batch and bv.ndim == 2 and scales is None and av.shape[:-2] == batch:
        # One shared B: stack A's batch into rows, one large GEMM (same per-output chains, fewer calls).
        rows = int(np.prod(av.shape[:-1], dtype=np.int64))  # explicit: -1 is ambiguous when K or N is 0
        flat = _matmul2d(av.reshape(rows, kk), bv, cv.reshape(rows, nn), m, promote_every, None, C is None)
        res = flat.reshape(out_shape)
    else:
        av_b = np.broadcast_to(av, batch + (mm, kk))  # views: entries are taken one at a time below
        bv_b = np.broadcast_to(bv, batch + (kk, nn))
        params = _c_params(m) if use_c_gemm and _cgemm is not None else None
        if batch and params is not None and scales is None and mm and nn and kk:
            # a batch of GEMMs with their own B: few calls of the compiled kernel, each on a bounded chunk
            # of batch entries gathered from the (unbroadcast) operands
            res = _c_batched(av, bv, cv, batch, m, params, promote_every, C is None).reshape(out_shape)
        elif not batch:
            res = _matmul2d(av, bv, cv, m, promote_every, scales, C is None)
        else:
            res = np.empty(out_shape)
            for idx in np.ndindex(*batch):
                res[idx] = _matmul2d(av_b[idx], bv_b[idx], cv[idx], m, promote_every, scales)
    if vec_b:
        res = res[..., 0]
    if vec_a:
        res = res[..., 0, :] if not vec_b else res[..., 0]
    if a32 and b32:
        res = res.astype(np.float32)
    return res[()] if np.ndim(res) == 0 else res


def _matmul_values(a: np.ndarray, b: np.ndarray, c: np.ndarray | None, m: MMAModel) -> np.ndarray:
    """``c + a @ b`` under `m`, float32 out: the low-overhead entry of the training runtime (private).

    The caller guarantees what :func:`matmul` checks and converts: `a` (..., M, K) and `b` (..., K, N) are
    float32 arrays of values of ``m.input`` (already rounded; no :func:`convert_inputs`), `c` None or float32
    values of ``m.output``, broadcastable to the output. A batch runs in one call of the compiled kernel with a
    shared 2-D `b` (A's batch stacked into rows), else in chunks of batch entries gathered from the unbroadcast
    operands (:func:`_c_batched`). Same bits as ``matmul(a, b, c, model=m)`` (float32);
    tests/test_cgemm.py checks it on every NVIDIA preset family the policies use. Anything the kernel does not
    take (no compiled GEMM, other kinds, empty shapes, 1-D operands) goes through :func:`matmul` itself.
    """
    params = _c_params(m) if use_c_gemm and _cgemm is not None else None
    if params is None or a.ndim < 2 or b.ndim < 2:
        return np.asarray(matmul(a, b, c, model=m), dtype=np.float32)
    mm, kk, nn = a.shape[-2], a.shape[-1], b.shape[-1]
    if mm == 0 or kk == 0 or nn == 0 or b.shape[-2] != kk:
        return np.asarray(matmul(a, b, c, model=m), dtype=np.float32)
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    out_shape = batch + (mm, nn)
    d: np.ndarray
    if c is None:
        d = np.zeros(out_shape)
    else:
        d = np.empty(out_shape)
        d[...] = c  # float32 values of the output format: exact in float64
    if b.ndim == 2:  # one shared B (also the plain 2-D GEMM): A's batch stacked into rows
        res = _c_matmul2d(a.reshape(1, -1, kk), b[None], d.reshape(1, -1, nn), m, params, None, None, True)
    else:  # a chunk of batch entries per call, gathered from the unbroadcast operands
        res = _c_batched(a, b, d, batch, m, params, None, True)
    return res.astype(np.float32).reshape(out_shape)


def _c_batched(a: np.ndarray, b: np.ndarray, c: np.ndarray, batch: tuple[int, ...], m: MMAModel,
               params: tuple[int, ...], promote_every: int | None, c_owned: bool) -> np.ndarray:
    """The batched GEMM ``c + a @ b`` over the broadcast `batch` in the compiled kernel, returned (nbt, M, N).

    `a` (..., M, K) and `b` (..., K, N) are not broadcast: chunks of batch entries are gathered from them
    (at most about :data:`_GATHER_ELEMS` elements of each per call), so memory follows the data, never the
    broadcast product. `c` has the output shape (batch + (M, N)); ``c_owned``: a scratch array of the
    caller's, chained in place. Every output is one chain: the chunking does not change the bits.
    """
    mm, kk = a.shape[-2:]
    nn = b.shape[-1]
    nbt = int(np.prod(batch, dtype=np.int64))
    na, nb = int(np.prod(a.shape[:-2], dtype=np.int64)), int(np.prod(b.shape[:-2], dtype=np.int64))
    a3 = a.reshape(na, mm, kk)
    b3 = b.reshape(nb, kk, nn)
    c3 = c.reshape(nbt, mm, nn)
    threads = _c_threads(nbt * mm * nn * kk)
    per = max(1, _GATHER_ELEMS // max(1, mm * kk + kk * nn))  # batch entries per call
    if per >= nbt and na == nbt and nb == nbt:
        return _c_matmul2d(a3, b3, c3, m, params, promote_every, None, c_owned, threads)
    out = c3 if (c_owned and c3.flags.c_contiguous and c3.dtype == np.float64) else np.empty((nbt, mm, nn))
    for i0 in range(0, nbt, per):
        i1 = min(nbt, i0 + per)
        out[i0:i1] = _c_matmul2d(_bcast_rows(a3, a.shape[:-2], batch, i0, i1),
                                 _bcast_rows(b3, b.shape[:-2], batch, i0, i1),
                                 c3[i0:i1], m, params, promote_every, None, c_owned, threads)
    return out


def _k_factors(t: ScaledTensor, g: int, k_axis: int) -> np.ndarray:
    """Decode factors of `t` (float32 values as float64) per element along the non-K axes and per group of
    `g` along its K axis (``k_axis``: -1 for A, -2 for B)."""
    with np.errstate(over="ignore", invalid="ignore"):
        f = (t.scale * t.global_scale).astype(np.float32).astype(np.float64)
    nd = t.ndim
    for ax, b in enumerate(t.block):
        rep = b // g if ax == nd + k_axis else b
        if rep > 1:
            f = np.repeat(f, rep, axis=ax)
    return f


def _matmul_scaled(A: Any, B: Any, C: Any, m: MMAModel, promote_every: int | None, scales: Any,
                   input_rounding: str | None) -> Any:
    """matmul of two ScaledTensor operands (see :func:`matmul`, Notes)."""
    for name, t in (("A", A), ("B", B)):
        if not isinstance(t, ScaledTensor):
            raise TypeError(f"{name} is a {type(t).__name__} but the other operand is a ScaledTensor: pass both as "
                            "ScaledTensor (wrap plain values with ScaledTensor(x, 1.0, format))")
        if t.ndim < 2:
            raise ValueError(f"ScaledTensor {name} must have at least 2 axes (M, K) / (K, N), got shape {t.shape}")
    if scales is not None:
        raise ValueError("ScaledTensor operands carry their decode factors: do not pass scales= as well")
    if input_rounding not in (None, "exact"):
        raise ValueError(f"ScaledTensor data are already values of their formats; input_rounding={input_rounding!r} "
                         "does not apply (leave it None)")
    kk = A.shape[-1]
    if B.shape[-2] != kk:
        raise ValueError(f"A and B disagree on K: A has shape {A.shape}, B has shape {B.shape}")
    batch = np.broadcast_shapes(A.shape[:-2], B.shape[:-2])
    mm, nn = A.shape[-2], B.shape[-1]
    out_shape = batch + (mm, nn)
    a32 = A.data.dtype == np.float32 and B.data.dtype == np.float32
    cv = _convert_c_fmt(C, fp32, out_shape)
    ga, gb = A.block[-1], B.block[-2]
    if kk == 0 or mm == 0 or nn == 0 or (ga == kk and gb == kk):
        g = max(kk, 1)
    else:
        g, big = min(ga, gb), max(ga, gb)
        if big % g:
            raise ValueError(f"the K blocks of A ({ga}) and B ({gb}) do not nest: one must divide the other")
        if promote_every is not None and promote_every != g:
            raise ValueError(f"A and B are scaled in groups of {g} along K, so their factors are applied at "
                             f"promotion every {g} products; promote_every={promote_every!r} disagrees")
        if m.kind == "bfma" and g % m.instruction_k:
            raise ValueError(f"scale groups of {g} along K are not a multiple of the model's instruction depth "
                             f"{m.instruction_k}: {m.name} cannot apply them at promotion")
    if kk == 0 or mm == 0 or nn == 0:
        res = np.empty(out_shape) if (mm == 0 or nn == 0) else cv + 0.0
    else:
        fa = np.broadcast_to(_k_factors(A, g, -1), batch + (mm, kk // g))
        fb = np.broadcast_to(_k_factors(B, g, -2), batch + (kk // g, nn))
        da = np.broadcast_to(A.data, batch + (mm, kk))
        db = np.broadcast_to(B.data, batch + (kk, nn))
        res = np.empty(out_shape)
        for idx in np.ndindex(*batch) if batch else [()]:
            if g == kk:
                acc = np.asarray(matmul(da[idx], db[idx], model=m, promote_every=promote_every,
                                        input_rounding="exact"), dtype=np.float64)
                s = np.asarray(_fround(fa[idx] * fb[idx], fp32, "rne"), dtype=np.float64)  # (M,1)*(1,N)
                with np.errstate(invalid="ignore", over="ignore"):
                    res[idx] = fma_round(s * acc, cv[idx], fp32)
            else:
                res[idx] = matmul(da[idx], db[idx], cv[idx], model=m, promote_every=g,
                                  scales=(fa[idx], fb[idx]), input_rounding="exact")
    if a32:
        res = res.astype(np.float32)
    return res


_MAX_SLICES = 6


def _slices(x: np.ndarray, beta: int, axis: int) -> tuple[list[np.ndarray], np.ndarray] | None:
    """Split x exactly into integer-valued slices: x = 2**(e+1) * sum_s I_s * 2**(-beta*(s+1)), |I_s| < 2**beta,
    with e the largest exponent along `axis` (per row of A or column of B). None if more than _MAX_SLICES."""
    e = exponents(x, -1074).max(axis=axis, keepdims=True).astype(np.int32)
    e = np.where(e == NO_EXP, 0, e)
    r = np.ldexp(x, -(e + 1))  # |r| < 1
    out = []
    while True:
        r = np.ldexp(r, beta)
        i_s = np.trunc(r)
        out.append(i_s)
        r = r - i_s
        if not r.any():
            return out, e
        if len(out) >= _MAX_SLICES:
            return None


def _exact_matmul_split(a: np.ndarray, b: np.ndarray, c: np.ndarray, m: MMAModel) -> np.ndarray | None:
    """Exact GEMM through float64 BLAS on error-free integer slices (Ozaki-style), then one rounding.

    Each slice product sums K integers below 2**(2*beta), so with ``K * 2**(2*beta) <= 2**53`` every partial
    sum is exact whatever order BLAS uses. The S*S exact partial products and C are combined by
    :func:`~fpsim.mma.model.exact_sum`, a block of rows at a time (bounded memory). Returns None (the caller
    falls back to the limb kernel) when the inputs span too many bits for a few slices.
    """
    kk = a.shape[1]
    lg = max(1, math.ceil(math.log2(max(kk, 2))))
    beta = (53 - lg) // 2
    sa = _slices(a, beta, axis=1)
    sb = _slices(b, beta, axis=0)
    if sa is None or sb is None:
        return None
    (ia, ea), (ib, eb) = sa, sb
    lsb = int(ea.min() + eb.min()) + 2 - beta * (len(ia) + len(ib))
    top = int(ea.max() + eb.max()) + 2 + lg + 1
    if (c != 0).any():
        lc, tc = term_range(c, fp32)
        lsb, top = min(lsb, lc), max(top, tc)
    mm, nn = c.shape
    out = np.empty((mm, nn))
    step = max(1, _GENERIC_ELEMS // max(1, nn * (len(ia) * len(ib) + 1)))
    for i0 in range(0, mm, step):
        rows = slice(i0, min(mm, i0 + step))
        terms = [np.ldexp(x[rows] @ y, ea[rows] + eb + 2 - beta * (s_ + t_ + 2))  # exact integer units
                 for s_, x in enumerate(ia) for t_, y in enumerate(ib)]
        terms.append(c[rows])
        out[rows] = _rne(exact_sum(np.stack(terms), lsb, top), m.output)
    return out


@functools.lru_cache(maxsize=128)
def _c_params(m: MMAModel) -> tuple[int, ...] | None:
    """Parameters of the compiled BFMA kernel for `m`, or None where it does not apply (NumPy path)."""
    if m.kind != "bfma" or m.input_b is not None:
        return None
    fin, out = m.input, m.output
    g = max(0, 23 + m.neab - 2 * fin.mbits)
    pmax = ((1 << fin.p) - 1) ** 2 << g  # largest |m_a * m_b| (A's significand pre-shifted by g bits)
    if not (fin.p <= 24 and pmax < 2**31 and -23 <= m.neab <= 6 and m.mb <= 28 and out.p <= 24 and m.k <= 4096):
        return None
    cs = min(m.k, (2**31 - 1) // pmax)  # products summed in int32 before widening: no overflow
    return (m.k, 2 if m.grouping == "mod4" else 1, int(m.c_entry == "late" or m.grouping == "mod4"),
            fin.mbits, fin.emin, m.neab, int(m.mel is not None), int(m.mel or 0), m.mb,
            int(m.rounding == "rne"), out.emin, out.emax, out.mbits, cs)


def _mod4_order(kp: int, ki: int) -> np.ndarray:
    """K order that puts each instruction's G0 (i mod 4 in {0, 1}) before its G1: two consecutive blocks."""
    idx = np.arange(ki)
    order = np.concatenate([idx[idx % 4 < 2], idx[idx % 4 >= 2]])
    res: np.ndarray = (np.arange(0, kp, ki)[:, None] + order[None, :]).reshape(-1)
    return res


def _c_dot(at: np.ndarray, bt: np.ndarray, c: np.ndarray, m: MMAModel, params: tuple[int, ...],
           threads: int | None = None) -> np.ndarray:
    """The rows of :func:`dot` (``at``, ``bt``: (K, R) values, ``c``: (R,)) in the compiled kernel's dot mode.

    ``threads``: the caller's thread count for the whole dot (it runs in chunks); default from this call."""
    assert _cgemm is not None
    kk, r = at.shape
    ki = m.instruction_k
    if m.grouping != "mod4":  # a last, partial block as it is (see _c_matmul2d)
        kp, ap, bp = kk, np.ascontiguousarray(at, dtype=np.float64), np.ascontiguousarray(bt, dtype=np.float64)
    else:
        kp = kk + (-kk) % ki
        ap = np.zeros((kp, r))
        ap[:kk] = at
        bp = np.zeros((kp, r))
        bp[:kk] = bt
    if m.grouping == "mod4":
        perm = _mod4_order(kp, ki)
        ap = np.ascontiguousarray(ap[perm])
        bp = np.ascontiguousarray(bp[perm])
    d = np.array(c, dtype=np.float64, order="C", copy=True)
    nth = _c_threads(r * kk) if threads is None else threads
    _cgemm.bfma_gemm(ap, bp, d, 1, r, kp, 0, kp, params, nth, 1, min(max(r, 1), 128), 1, 1)
    return d


def _ieee_like(f: Format) -> bool:
    """A format the compiled generic kernels round to: IEEE-style infinities, NaN, subnormals, signed zero."""
    from ..formats import NaNEncoding

    return bool(f.has_inf and f.subnormals and f.signed and f.signed_zero and f.nan == NaNEncoding.IEEE
                and 1 <= f.mbits <= 24 and -1000 < f.emin and f.emax < 1000)


@functools.lru_cache(maxsize=128)
def _g_params(m: MMAModel) -> tuple[int, ...] | None:
    """Parameters of the compiled generic kernel ("wide", "fma_chain", "pairwise"), or None (NumPy path)."""
    if m.kind not in ("wide", "fma_chain", "pairwise") or m.input_b is not None:
        return None
    fin, acc, out = m.input, m.acc if m.kind != "wide" else m.output, m.output
    if not (fin.p <= 26 and fin.emax <= 127 and fin.emin - fin.mbits >= -160 and _ieee_like(acc) and _ieee_like(out)):
        return None
    kind = {"wide": 0, "fma_chain": 1, "pairwise": 2}[m.kind]
    return (kind, acc.mbits, acc.emin, acc.emax, out.mbits, out.emin, out.emax)


def _c_threads(macs: int) -> int:
    from .. import rounding

    if macs < _C_MIN_PARALLEL:
        return 1
    mt = rounding.max_threads
    return max(1, mt if mt is not None else min(os.cpu_count() or 1, 8))


def _c_matmul2d(a: np.ndarray, b: np.ndarray, c: np.ndarray, m: MMAModel, params: tuple[int, ...],
                promote_every: int | None, scales: Any, c_owned: bool = False,
                threads: int | None = None) -> np.ndarray:
    """The BFMA chains of :func:`_matmul2d` in the compiled kernel (same bits); promotion and scales as there.

    ``a``, ``b``, ``c`` are (M, K), (K, N), (M, N), or (nb, M, K), (nb, K, N), (nb, M, N) for a batch of
    independent GEMMs in one call (then without scales). ``c_owned``: `c` is a scratch array of the caller's
    (never a user's), which may then be chained in place. ``threads``: the caller's count (for a GEMM run in
    chunks); default from this call's size."""
    assert _cgemm is not None
    if a.ndim == 2:
        one: np.ndarray = _c_matmul2d(a[None], b[None], c[None], m, params, promote_every, scales, c_owned,
                                      threads)[0]
        return one
    nbt, mm, kk = a.shape
    nn = b.shape[2]
    ki = m.instruction_k
    step = ki if promote_every is None else promote_every
    # The kernel takes a last, partial block as it is (its missing products are zeros, which never win E_max);
    # the mod-4 grouping and the promotion groups are padded with zeros as in the NumPy path.
    kp = kk if (m.grouping != "mod4" and promote_every is None) else kk + (-kk) % step
    if kp == kk:
        ap = np.ascontiguousarray(a, dtype=np.float64)
        bp = np.ascontiguousarray(b, dtype=np.float64)
    else:
        ap = np.zeros((nbt, mm, kp))
        ap[:, :, :kk] = a
        bp = np.zeros((nbt, kp, nn))
        bp[:, :kk] = b
    if m.grouping == "mod4":
        perm = _mod4_order(kp, ki)
        ap = np.ascontiguousarray(ap[:, :, perm])
        bp = np.ascontiguousarray(bp[:, perm])
    if threads is None:
        threads = _c_threads(nbt * mm * nn * kk)
    nt = min(nn, 128)
    mt = max(1, min(mm, 32, -(-mm // max(1, threads))))

    def chain(d: np.ndarray, k0: int, k1: int) -> None:
        _cgemm.bfma_gemm(ap, bp, d, mm, nn, kp, k0, k1, params, threads, mt, nt, 0, nbt)

    if promote_every is None:
        if c_owned and c.flags.c_contiguous and c.dtype == np.float64 and c.shape == (nbt, mm, nn):
            d = c  # matmul's own zeros (no C given): chained in place
        else:
            d = np.array(np.broadcast_to(c, (nbt, mm, nn)), dtype=np.float64, order="C", copy=True)
        chain(d, 0, kp)
        return d
    groups = -(-kk // promote_every)
    sa = sb = None
    if scales is not None:
        assert nbt == 1
        sa, sb = _expand_scales(scales, mm, nn, groups)
    acc = np.array(np.broadcast_to(c, (nbt, mm, nn)), dtype=np.float64, order="C", copy=True)
    for g, k0 in enumerate(range(0, kp, promote_every)):
        part = np.zeros((nbt, mm, nn))
        chain(part, k0, min(kp, k0 + promote_every))
        if sa is not None and sb is not None:
            with np.errstate(over="ignore", invalid="ignore"):  # inf/NaN factors propagate
                s = np.asarray(_fround(sa[:, g][:, None] * sb[g][None, :], fp32, "rne"), dtype=np.float64)
            with np.errstate(invalid="ignore", over="ignore"):
                part = s * part
        acc = fma_round(part, acc, fp32)
    return acc


def _matmul2d(a: np.ndarray, b: np.ndarray, c: np.ndarray, m: MMAModel, promote_every: int | None,
              scales: Any, c_owned: bool = False) -> np.ndarray:
    mm, kk = a.shape
    nn = b.shape[1]
    if mm == 0 or nn == 0:
        # No outputs: nothing to tile (the tile arithmetic below divides by the tile sizes).
        return np.empty((mm, nn))
    if kk == 0:
        # The empty sum is +0 (IEEE 754 §9.4 sum): D = C + 0, which also turns a -0 addend into +0.
        return c + 0.0
    if use_c_gemm and _cgemm is not None and m.kind == "bfma":
        params = _c_params(m)
        if params is not None:
            return _c_matmul2d(a, b, c, m, params, promote_every, scales, c_owned)
    if use_c_gemm and _cgemm is not None and promote_every is None and m.kind in ("wide", "fma_chain", "pairwise"):
        gp = _g_params(m)
        if gp is not None:
            d = np.array(c, dtype=np.float64, order="C", copy=True)
            _cgemm.generic_gemm(np.ascontiguousarray(a, dtype=np.float64), np.ascontiguousarray(b, dtype=np.float64),
                                d, mm, nn, kk, gp, _c_threads(mm * nn * kk), 16, min(nn, 128))
            return d
    at = np.ascontiguousarray(a.T)  # (K, M)
    bk = np.ascontiguousarray(b)  # (K, N)
    # C counts too: the exact kernels sum finite terms only (a NaN or inf addend went through them as garbage).
    has_specials = not (np.isfinite(at).all() and np.isfinite(bk).all() and np.isfinite(c).all())
    if m.kind == "exact" and promote_every is None and not has_specials and kk and mm and nn:
        fast = _exact_matmul_split(a, b, c, m)
        if fast is not None:
            return fast
    lsb_top = _lsb_top(at, bk, m)
    xa, ea = _prepare(at, m)
    xb, eb = _prepare(bk, m)
    if m.kind == "bfma":
        mult = m.instruction_k if promote_every is None else promote_every
        xa, ea = _pad_k(xa, ea, mult)
        xb, eb = _pad_k(xb, eb, mult)
        per = max(1, _BLOCK_ELEMS // m.instruction_k)
    else:
        per = max(1, _GENERIC_ELEMS // max(1, min(kk, promote_every or kk)))
    # Tile shape: square-ish Mt x Nt with Mt*Nt <= per.
    nt = min(nn, max(1, int(math.sqrt(per))))
    mt = min(mm, max(1, per // nt))
    nt = min(nn, max(1, per // mt))
    ktot = xa.shape[0]
    groups = -(-kk // promote_every) if promote_every else 1
    sa = sb = None
    if scales is not None:
        sa, sb = _expand_scales(scales, mm, nn, groups)
    out = np.empty((mm, nn))
    for i0 in range(0, mm, mt):
        i1 = min(mm, i0 + mt)
        for j0 in range(0, nn, nt):
            j1 = min(nn, j0 + nt)
            x = xa[:, i0:i1, None]
            y = xb[:, None, j0:j1]
            ex = ea[:, i0:i1, None]
            ey = eb[:, None, j0:j1]
            ct = c[i0:i1, j0:j1]
            if promote_every is None:
                out[i0:i1, j0:j1] = _run_terms(x, y, ex, ey, ct, m, has_specials, lsb_top)
                continue
            acc = ct.copy()
            zero = np.zeros(ct.shape)
            for g, k0 in enumerate(range(0, ktot, promote_every)):
                k1 = min(ktot, k0 + promote_every)
                part = _run_terms(x[k0:k1], y[k0:k1], ex[k0:k1], ey[k0:k1], zero, m, has_specials, lsb_top)
                if sa is not None and sb is not None:
                    with np.errstate(over="ignore", invalid="ignore"):  # inf/NaN factors propagate
                        s = np.asarray(_fround(sa[i0:i1, g][:, None] * sb[g, j0:j1][None, :], fp32, "rne"),
                                       dtype=np.float64)
                    with np.errstate(invalid="ignore", over="ignore"):
                        part = s * part
                acc = fma_round(part, acc, fp32)
            out[i0:i1, j0:j1] = acc
    return out
