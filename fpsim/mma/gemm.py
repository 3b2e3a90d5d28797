"""Dot products and GEMMs under an :class:`~fpsim.mma.MMAModel`, with optional fp32 promotion and scales.

:func:`dot` chains one model's blocks along K for many rows at once; :func:`matmul` does the same for every
output of a GEMM, tile by tile (memory stays bounded), optionally promoting the partial sum into an fp32
accumulator every ``promote_every`` products (DeepSeek-V3's fix for FP8 on Hopper) and applying per-block
dequantisation scales at each promotion.

This module is the one executor: it converts, batches, pads, tiles and promotes, and asks the model's
*matrix unit* (``model._unit``, a :class:`~fpsim.mma._unit.MatrixUnit`: one class per family, in
:mod:`fpsim.mma._bfma`, :mod:`fpsim.mma._generic`, :mod:`fpsim.mma._exact`, :mod:`fpsim.mma.amd`,
:mod:`fpsim.mma.blockscaled`) for everything that depends on the family: its NumPy reference reduction, its
compiled-kernel parameters, its K granularity and padding, its chunking and its own executor if it has one.
It never asks which family it holds.

Units that describe a compiled kernel (the NVIDIA block FMA; the generic chains, without promotion) run in
``fpsim/_cgemm.c`` (integer arithmetic, vectorised over outputs, tiled, threaded over output tiles with the
GIL released; threads per :data:`fpsim.rounding.max_threads`) when it was built at install; it gives the same
bits as the units' NumPy references, which stay as the reference and the fallback
(``fpsim.mma.gemm.use_c_gemm = False`` forces them; tests/test_cgemm.py checks the two against each other on
every NVIDIA preset). Promotion and scales are applied in NumPy on the kernel's partial sums. The block-FMA
kernel keeps one work buffer between calls (at most 48 MiB, about 26 bytes per element of A and B: square
GEMMs up to about 1400 x 1400), so that a run of GEMMs does not fault in fresh pages for each.

What is *not* modelled: the order a real GEMM library (cuBLAS, CUTLASS) splits K across MMA instructions,
warps and split-K partitions. Here every output is one chain of blocks in increasing K order.
"""

from __future__ import annotations

import functools
import math
import os
from typing import TYPE_CHECKING, Any

import numpy as np

from .._fpenv import ieee_mode
from .._interop import returns_input_kind
from ..formats import fp32
from ..rounding import _as_float_array
from ..rounding import round as _fround
from ._convert import EXACT_INPUT, convert_c, convert_inputs
from ._unit import BFMAKernel, MatrixUnit
from .model import NO_EXP, MMAModel, as_model, exponents, fma_round
from .scaled import ScaledTensor

if TYPE_CHECKING:
    from .blockscaled import BlockScaledModel

__all__ = ["convert_inputs", "dot", "matmul"]

try:  # the compiled BFMA GEMM (fpsim/_cgemm.c, built at install time); the NumPy path is reference and fallback
    from .. import _cgemm  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - exercised where no compiler was available
    _cgemm = None

use_c_gemm: bool = _cgemm is not None
"""Whether the models whose matrix unit describes a compiled kernel (the NVIDIA block FMA for GEMMs and dots;
the generic wide, FMA-chain and pairwise chains for GEMMs without promotion) run in it (set False to force the
NumPy references).
Threads: :data:`fpsim.rounding.max_threads`; the bits do not depend on it (each output is one chain)."""

_C_MIN_PARALLEL = 1 << 20  # MACs below which the compiled GEMM runs on one thread

# Elements of one (k, Mt, Nt) product block (units that walk K an instruction at a time, ``unit.blockwise``)
# or of one (K, Mt, Nt) product array (units that hold the whole chain).
_BLOCK_ELEMS = 1 << 18
_GENERIC_ELEMS = 1 << 20
# Elements of each operand gathered at once from broadcast operands (rows of dot, batch entries of matmul):
# memory follows the data, never the broadcast product.
_GATHER_ELEMS = 1 << 19


def _convert_c_fmt(c: Any, fmt: Any, shape: tuple[int, ...]) -> np.ndarray:
    """C rounded (RNE) to `fmt` and broadcast to the output shape, as float64 (:func:`~fpsim.mma._convert.convert_c`)."""
    return convert_c(c, fmt, shape)


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


def _prepare(v: np.ndarray, model: MMAModel, unit: MatrixUnit) -> tuple[np.ndarray, np.ndarray]:
    """Carrier array (the unit's dtype) and int16 exponents of input values."""
    e = exponents(v, model.input.emin)
    return v.astype(unit.carrier(model)), e


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
        A preset from :func:`fpsim.mma.get_model`, a generic model's name or ``"device:input[:output]"``
        (see :func:`fpsim.mma.as_model`). Default: :data:`fpsim.mma.exact`.
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
    unit = m._unit
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
    kern = _c_kernel(m) if use_c_gemm and _cgemm is not None else None
    if kern is not None:
        threads = _c_threads(r * k)
        for r0 in range(0, r, rc):
            r1 = min(r, r0 + rc)
            at = np.ascontiguousarray(_bcast_rows(a2, av.shape[:-1], shape, r0, r1).T)  # (K, rows)
            bt = np.ascontiguousarray(_bcast_rows(b2, bv.shape[:-1], shape, r0, r1).T)
            out[r0:r1] = _c_dot(at, bt, cflat[r0:r1], kern, threads)
    else:
        # Every broadcast row is a row of a2 / b2 (r > 0): checks over the operands hold for the rows.
        has_specials = not (np.isfinite(a2).all() and np.isfinite(b2).all() and np.isfinite(cv).all())
        lsb_top = unit.operand_range(a2, b2, m)
        per = _BLOCK_ELEMS if unit.blockwise else _GENERIC_ELEMS
        step = max(1, per // max(1, unit.terms_held(m, k)))
        mult = unit.pad_to(m, None)
        for g0 in range(0, r, rc):
            g1 = min(r, g0 + rc)
            xa, ea = _prepare(np.ascontiguousarray(_bcast_rows(a2, av.shape[:-1], shape, g0, g1).T), m, unit)
            xb, eb = _prepare(np.ascontiguousarray(_bcast_rows(b2, bv.shape[:-1], shape, g0, g1).T), m, unit)
            if mult > 1:
                xa, ea = _pad_k(xa, ea, mult)
                xb, eb = _pad_k(xb, eb, mult)
            for r0 in range(0, g1 - g0, step):
                sl = slice(r0, min(g1 - g0, r0 + step))
                out[g0 + sl.start:g0 + sl.stop] = unit.reference(xa[:, sl], xb[:, sl], ea[:, sl], eb[:, sl],
                                                                 cflat[g0 + sl.start:g0 + sl.stop], m,
                                                                 has_specials, lsb_top)
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
    m: Any = model
    unit: MatrixUnit | None = getattr(m, "_unit", None)  # the model's matrix unit (its family's behaviour)
    if unit is None:  # a name (or None): parsed into a model
        m = as_model(m)
        unit = m._unit
    if unit.own_matmul:  # a unit with an executor of its own (block scales inside each instruction)
        return unit.matmul(m, A, B, C, promote_every, scales, input_rounding)
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
        step = unit.k_step(m)
        if promote_every % step:
            raise ValueError(f"promote_every={promote_every} is not a multiple of the model's instruction "
                             f"depth {step}")
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
        flat = _matmul2d(av.reshape(rows, kk), bv, cv.reshape(rows, nn), m, unit, promote_every, None,
                         C is None)
        res = flat.reshape(out_shape)
    else:
        av_b = np.broadcast_to(av, batch + (mm, kk))  # views: entries are taken one at a time below
        bv_b = np.broadcast_to(bv, batch + (kk, nn))
        kern = _c_kernel(m) if use_c_gemm and _cgemm is not None else None
        if batch and kern is not None and scales is None and mm and nn and kk:
            # a batch of GEMMs with their own B: few calls of the compiled kernel, each on a bounded chunk
            # of batch entries gathered from the (unbroadcast) operands
            res = _c_batched(av, bv, cv, batch, kern, promote_every, C is None).reshape(out_shape)
        elif not batch:
            res = _matmul2d(av, bv, cv, m, unit, promote_every, scales, C is None)
        else:
            res = np.empty(out_shape)
            for idx in np.ndindex(*batch):
                res[idx] = _matmul2d(av_b[idx], bv_b[idx], cv[idx], m, unit, promote_every, scales)
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
    kern = _c_kernel(m) if use_c_gemm and _cgemm is not None else None
    if kern is None or a.ndim < 2 or b.ndim < 2:
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
        res = _c_matmul2d(a.reshape(1, -1, kk), b[None], d.reshape(1, -1, nn), kern, None, None, True)
    else:  # a chunk of batch entries per call, gathered from the unbroadcast operands
        res = _c_batched(a, b, d, batch, kern, None, True)
    return res.astype(np.float32).reshape(out_shape)


def _c_batched(a: np.ndarray, b: np.ndarray, c: np.ndarray, batch: tuple[int, ...], kern: BFMAKernel,
               promote_every: int | None, c_owned: bool) -> np.ndarray:
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
        return _c_matmul2d(a3, b3, c3, kern, promote_every, None, c_owned, threads)
    out = c3 if (c_owned and c3.flags.c_contiguous and c3.dtype == np.float64) else np.empty((nbt, mm, nn))
    for i0 in range(0, nbt, per):
        i1 = min(nbt, i0 + per)
        out[i0:i1] = _c_matmul2d(_bcast_rows(a3, a.shape[:-2], batch, i0, i1),
                                 _bcast_rows(b3, b.shape[:-2], batch, i0, i1),
                                 c3[i0:i1], kern, promote_every, None, c_owned, threads)
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
    if input_rounding not in (None, EXACT_INPUT):
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
        step = m._unit.k_step(m)
        if g % step:
            raise ValueError(f"scale groups of {g} along K are not a multiple of the model's instruction depth "
                             f"{step}: {m.name} cannot apply them at promotion")
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
                                        input_rounding=EXACT_INPUT), dtype=np.float64)
                s = np.asarray(_fround(fa[idx] * fb[idx], fp32, "rne"), dtype=np.float64)  # (M,1)*(1,N)
                with np.errstate(invalid="ignore", over="ignore"):
                    res[idx] = fma_round(s * acc, cv[idx], fp32)
            else:
                res[idx] = matmul(da[idx], db[idx], cv[idx], model=m, promote_every=g,
                                  scales=(fa[idx], fb[idx]), input_rounding=EXACT_INPUT)
    if a32:
        res = res.astype(np.float32)
    return res


@functools.lru_cache(maxsize=128)
def _kernels(m: MMAModel) -> tuple[BFMAKernel | None, tuple[int, ...] | None]:
    """The compiled kernels' descriptions for `m` (its unit's), by value: block FMA, generic chain."""
    unit = m._unit
    return unit.bfma_kernel(m), unit.generic_kernel(m)


# The kernels of the models seen last, by identity: a dict lookup instead of hashing the model's fields (the
# model is kept as well, so its id is not reused while it is here).
_PLANS: dict[int, tuple[MMAModel, BFMAKernel | None, tuple[int, ...] | None]] = {}


def _plan(m: MMAModel) -> tuple[BFMAKernel | None, tuple[int, ...] | None]:
    e = _PLANS.get(id(m))
    if e is not None and e[0] is m:
        return e[1], e[2]
    k = _kernels(m)
    if len(_PLANS) >= 256:
        _PLANS.clear()
    _PLANS[id(m)] = (m, k[0], k[1])
    return k


def _c_kernel(m: MMAModel) -> BFMAKernel | None:
    """The compiled block-FMA kernel's description for `m` (its unit's), or None: the NumPy path."""
    return _plan(m)[0]


def _c_params(m: MMAModel) -> tuple[int, ...] | None:
    """Parameters of the compiled BFMA kernel for `m`, or None where it does not apply (NumPy path)."""
    kern = _c_kernel(m)
    return None if kern is None else kern.params


def _c_dot(at: np.ndarray, bt: np.ndarray, c: np.ndarray, kern: BFMAKernel,
           threads: int | None = None) -> np.ndarray:
    """The rows of :func:`dot` (``at``, ``bt``: (K, R) values, ``c``: (R,)) in the compiled kernel's dot mode.

    ``threads``: the caller's thread count for the whole dot (it runs in chunks); default from this call."""
    assert _cgemm is not None
    kk, r = at.shape
    ki = kern.instruction_k
    if kern.order is None:  # a last, partial block as it is (see _c_matmul2d)
        kp, ap, bp = kk, np.ascontiguousarray(at, dtype=np.float64), np.ascontiguousarray(bt, dtype=np.float64)
    else:
        kp = kk + (-kk) % ki
        ap = np.zeros((kp, r))
        ap[:kk] = at
        bp = np.zeros((kp, r))
        bp[:kk] = bt
        perm = kern.order(kp)
        ap = np.ascontiguousarray(ap[perm])
        bp = np.ascontiguousarray(bp[perm])
    d = np.array(c, dtype=np.float64, order="C", copy=True)
    nth = _c_threads(r * kk) if threads is None else threads
    _cgemm.bfma_gemm(ap, bp, d, 1, r, kp, 0, kp, kern.params, nth, 1, min(max(r, 1), 128), 1, 1)
    return d


def _g_params(m: MMAModel) -> tuple[int, ...] | None:
    """Parameters of the compiled generic chain kernel (its unit's), or None (NumPy path)."""
    return _plan(m)[1]


def _c_threads(macs: int) -> int:
    from .. import rounding

    if macs < _C_MIN_PARALLEL:
        return 1
    mt = rounding.max_threads
    return max(1, mt if mt is not None else min(os.cpu_count() or 1, 8))


def _c_matmul2d(a: np.ndarray, b: np.ndarray, c: np.ndarray, kern: BFMAKernel,
                promote_every: int | None, scales: Any, c_owned: bool = False,
                threads: int | None = None) -> np.ndarray:
    """The BFMA chains of :func:`_matmul2d` in the compiled kernel (same bits); promotion and scales as there.

    ``a``, ``b``, ``c`` are (M, K), (K, N), (M, N), or (nb, M, K), (nb, K, N), (nb, M, N) for a batch of
    independent GEMMs in one call (then without scales). ``c_owned``: `c` is a scratch array of the caller's
    (never a user's), which may then be chained in place. ``threads``: the caller's count (for a GEMM run in
    chunks); default from this call's size."""
    assert _cgemm is not None
    if a.ndim == 2:
        one: np.ndarray = _c_matmul2d(a[None], b[None], c[None], kern, promote_every, scales, c_owned, threads)[0]
        return one
    nbt, mm, kk = a.shape
    nn = b.shape[2]
    step = kern.instruction_k if promote_every is None else promote_every
    # The kernel takes a last, partial block as it is (its missing products are zeros, which never win E_max);
    # a reordered K (the mod-4 grouping) and the promotion groups are padded with zeros as in the NumPy path.
    kp = kk if (kern.order is None and promote_every is None) else kk + (-kk) % step
    ap: np.ndarray
    bp: np.ndarray
    if kp == kk:  # float32 operands (the training runtime's) go as they are where the kernel widens them
        f32 = getattr(_cgemm, "FLOAT32_OPERANDS", 0)
        ap = np.ascontiguousarray(a, dtype=np.float32 if f32 and a.dtype == np.float32 else np.float64)
        bp = np.ascontiguousarray(b, dtype=np.float32 if f32 and b.dtype == np.float32 else np.float64)
    else:
        ap = np.zeros((nbt, mm, kp))
        ap[:, :, :kk] = a
        bp = np.zeros((nbt, kp, nn))
        bp[:, :kk] = b
    if kern.order is not None:
        perm = kern.order(kp)
        ap = np.ascontiguousarray(ap[:, :, perm])
        bp = np.ascontiguousarray(bp[:, perm])
    if threads is None:
        threads = _c_threads(nbt * mm * nn * kk)
    nt = min(nn, 128)
    mt = max(1, min(mm, 32, -(-mm // max(1, threads))))

    def chain(d: np.ndarray, k0: int, k1: int) -> None:
        _cgemm.bfma_gemm(ap, bp, d, mm, nn, kp, k0, k1, kern.params, threads, mt, nt, 0, nbt)

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


def _matmul2d(a: np.ndarray, b: np.ndarray, c: np.ndarray, m: MMAModel, unit: MatrixUnit,
              promote_every: int | None, scales: Any, c_owned: bool = False) -> np.ndarray:
    """``c + a @ b`` (2-D) under `m`, whose matrix unit is `unit`: compiled kernel, shortcut or NumPy tiles."""
    mm, kk = a.shape
    nn = b.shape[1]
    if mm == 0 or nn == 0:
        # No outputs: nothing to tile (the tile arithmetic below divides by the tile sizes).
        return np.empty((mm, nn))
    if kk == 0:
        # The empty sum is +0 (IEEE 754 §9.4 sum): D = C + 0, which also turns a -0 addend into +0.
        return c + 0.0
    if use_c_gemm and _cgemm is not None:
        kern = _c_kernel(m)
        if kern is not None:
            return _c_matmul2d(a, b, c, kern, promote_every, scales, c_owned)
    if use_c_gemm and _cgemm is not None and promote_every is None:
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
    if promote_every is None and not has_specials:
        fast = unit.shortcut(a, b, c, m, _GENERIC_ELEMS)
        if fast is not None:
            return fast
    lsb_top = unit.operand_range(at, bk, m)
    xa, ea = _prepare(at, m, unit)
    xb, eb = _prepare(bk, m, unit)
    mult = unit.pad_to(m, promote_every)
    if mult > 1:
        xa, ea = _pad_k(xa, ea, mult)
        xb, eb = _pad_k(xb, eb, mult)
    held = max(1, unit.terms_held(m, min(kk, promote_every or kk)))
    per = max(1, (_BLOCK_ELEMS if unit.blockwise else _GENERIC_ELEMS) // held)
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
                out[i0:i1, j0:j1] = unit.reference(x, y, ex, ey, ct, m, has_specials, lsb_top)
                continue
            acc = ct.copy()
            zero = np.zeros(ct.shape)
            for g, k0 in enumerate(range(0, ktot, promote_every)):
                k1 = min(ktot, k0 + promote_every)
                part = unit.reference(x[k0:k1], y[k0:k1], ex[k0:k1], ey[k0:k1], zero, m, has_specials, lsb_top)
                if sa is not None and sb is not None:
                    with np.errstate(over="ignore", invalid="ignore"):  # inf/NaN factors propagate
                        s = np.asarray(_fround(sa[i0:i1, g][:, None] * sb[g, j0:j1][None, :], fp32, "rne"),
                                       dtype=np.float64)
                    with np.errstate(invalid="ignore", over="ignore"):
                        part = s * part
                acc = fma_round(part, acc, fp32)
            out[i0:i1, j0:j1] = acc
    return out
