"""The DeepSeek-V3 accumulation-precision experiment (technical report section 3.3.2), under the H100 FP8 model.

DeepSeek-V3 reports that Hopper's FP8 GEMM keeps "around 14 bits" of the accumulation (13 fraction bits plus
the leading one: the FP22 accumulator of the BFMA model), that random matrices with K = 4096 showed a maximum
relative error of "nearly 2%", and that copying the Tensor Core partial into fp32 registers every
N_C = 128 products ("promotion") fixes it. :func:`deepseek_experiment` replays that with fpsim's H100 model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .._fpenv import ieee_mode
from .._interop import returns_input_kind
from .._names import parse_name
from ..formats import fp8_e4m3, fp32
from ..rounding import _as_float_array
from ..rounding import round as _fround
from .gemm import matmul
from .presets import get_model

__all__ = ["deepseek_experiment", "quantize_tiles"]

_GROUP = 128


@ieee_mode
@returns_input_kind(dtype_option=False)
def quantize_tiles(a: np.ndarray, b: np.ndarray, *, per_tensor: bool = False) -> tuple[np.ndarray, ...]:
    """E4M3 quantisation with DeepSeek-V3's fine-grained scales.

    A (M, K) gets one fp32 factor per 1x128 tile (row, 128 K-columns), B (K, N) one per 128x128 block;
    each factor is ``amax / 448`` of its tile (rounded to fp32) and the values are ``RNE_e4m3(x / factor)``.
    With ``per_tensor=True`` one factor per matrix (broadcast to the same shapes). An all-zero tile gets the
    factor 1.

    The factors are **decode** factors (``x ≈ q * factor``): the convention of
    :class:`fpsim.scaling.ScaledTensor` and of ``matmul(scales=)``; for K and N multiples of 128,
    ``ScaledTensor(aq, sa, "fp8_e4m3", block=(1, 128))`` and ``ScaledTensor(bq, sb, "fp8_e4m3",
    block=(128, 128))`` multiply with ``fpsim.matmul`` to the same bits as
    ``matmul(aq, bq, promote_every=128, scales=(sa, sb))``.

    Returns
    -------
    aq, bq, sa, sb
        Quantised values (float64 carriers of E4M3 values), scale_a of shape (M, G), scale_b of shape
        (G, ceil(N/128)) with ``G = ceil(K/128)``.
    """
    a = np.asarray(_as_float_array(a, "a")[0], dtype=np.float64)
    b = np.asarray(_as_float_array(b, "b")[0], dtype=np.float64)
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"a and b must be matrices (M, K) and (K, N), got shapes {a.shape} and {b.shape}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"a and b disagree on K: shapes {a.shape} and {b.shape}")
    m, k = a.shape
    n = b.shape[1]
    g = -(-k // _GROUP)
    nb = -(-n // _GROUP)
    fmax = float(fp8_e4m3.max)
    if per_tensor:
        # NaN propagates into the factor; an empty matrix has amax 0 (factor 1 below)
        am_a = float(np.max(np.abs(a))) if a.size else 0.0
        am_b = float(np.max(np.abs(b))) if b.size else 0.0
        with np.errstate(over="ignore"):  # amax/448 beyond fp32: an inf factor
            sa = np.full((m, g), float(_fround(am_a / fmax, fp32)))
            sb = np.full((g, nb), float(_fround(am_b / fmax, fp32)))
    else:
        pad_a = np.zeros((m, g * _GROUP))
        pad_a[:, :k] = np.abs(a)
        sa = np.asarray(_fround(pad_a.reshape(m, g, _GROUP).max(axis=2) / fmax, fp32), dtype=np.float64)
        pad_b = np.zeros((g * _GROUP, nb * _GROUP))
        pad_b[:k, :n] = np.abs(b)
        sb = np.asarray(_fround(pad_b.reshape(g, _GROUP, nb, _GROUP).max(axis=(1, 3)) / fmax, fp32),
                        dtype=np.float64)
    sa = np.where(sa == 0, 1.0, sa)
    sb = np.where(sb == 0, 1.0, sb)
    sa_full = np.repeat(sa, _GROUP, axis=1)[:, :k]
    sb_full = np.repeat(np.repeat(sb, _GROUP, axis=0), _GROUP, axis=1)[:k, :n]
    with np.errstate(invalid="ignore"):  # inf / inf (an inf tile) is NaN, as on the GPU
        aq = np.asarray(_fround(a / sa_full, fp8_e4m3, overflow="saturate"), dtype=np.float64)
        bq = np.asarray(_fround(b / sb_full, fp8_e4m3, overflow="saturate"), dtype=np.float64)
    return aq, bq, sa, sb


def _reference(aq: np.ndarray, bq: np.ndarray, sa: np.ndarray, sb: np.ndarray) -> np.ndarray:
    """The product of the dequantised inputs. Each 128-group partial of E4M3 products is exact in float64
    (fewer than 44 bits); combining the groups with their scales adds a relative error below 1e-15."""
    m, k = aq.shape
    n = bq.shape[1]
    sbn = np.repeat(sb, _GROUP, axis=1)[:, :n]
    x = np.zeros((m, n))
    for gi, k0 in enumerate(range(0, k, _GROUP)):
        part = aq[:, k0:k0 + _GROUP] @ bq[k0:k0 + _GROUP, :]
        x += (sa[:, gi][:, None] * sbn[gi][None, :]) * part
    return x


def _errors(d: np.ndarray, x: np.ndarray) -> dict[str, float]:
    nz = x != 0
    rel = np.abs(d[nz] - x[nz]) / np.abs(x[nz])
    return {"max": float(rel.max()), "median": float(np.median(rel)),
            "norm": float(np.linalg.norm(d - x) / np.linalg.norm(x))}


@ieee_mode
def deepseek_experiment(m: int = 64, n: int = 64, ks: Sequence[int] = (128, 256, 512, 1024, 2048, 4096), *,
                        distribution: str = "uniform", seed: int = 0, device: str = "h100") -> dict[str, Any]:
    """Relative error of FP8 GEMMs under the Hopper FP8 model, with and without promotion, against K.

    For each K, A (m x K) and B (K x n) are drawn once (prefixes of the largest K), quantised to E4M3 and
    multiplied four ways; each result is compared with the exact product of *its own* quantised inputs, so
    only accumulation error is measured:

    * ``unpromoted``: per-tensor scales, the Tensor Core model (k = 32, 13-bit RZ accumulator) chained
      over all of K, scales applied once at the end (per-tile scales cannot be applied without promotion);
    * ``promoted``: per-tensor scales, partial promoted into fp32 every 128 products;
    * ``tile_promoted``: DeepSeek-V3's recipe: 1x128 / 128x128 scales applied at each promotion;
    * ``wide25``: per-tensor scales, a 25-bit alignment window (neab = 2) for contrast, no promotion.

    Parameters
    ----------
    m, n : int
        Output size (m*n dot products per K).
    ks : sequence of int
        K values (multiples of 128).
    distribution : {"uniform", "normal"}
        Entries U[0, 1) (no cancellation; DeepSeek does not state theirs) or N(0, 1).
    seed : int
        Seed of ``numpy.random.default_rng``.
    device : str
        Device whose FP8 -> fp32 model is used (``h100``/``h200``; ``ada`` has the same 13-bit window).

    Returns
    -------
    dict
        ``{"config": {...}, "rows": [{"K": K, "<arm>_max": ..., "<arm>_median": ..., "<arm>_norm": ...}]}``.

    Examples
    --------
    >>> r = deepseek_experiment(m=4, n=4, ks=(256,))
    >>> r["rows"][0]["promoted_max"] < r["rows"][0]["unpromoted_max"]
    True
    """
    distribution = parse_name(distribution, ("uniform", "normal"), "distribution")
    for name, v in (("m", m), ("n", n)):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{name} must be an int, got {type(v).__name__}: {v!r}")
        if v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    if isinstance(ks, (str, bytes)) or not all(isinstance(k, (int, np.integer)) and not isinstance(k, bool)
                                               for k in ks):
        raise TypeError(f"ks must be a sequence of ints, got {ks!r}")
    ks = [int(k) for k in ks]
    if not ks or any(k <= 0 or k % _GROUP for k in ks):
        raise ValueError(f"ks must be positive multiples of {_GROUP}, got {ks}")
    rng = np.random.default_rng(seed)
    kmax = max(ks)
    draw = rng.random if distribution == "uniform" else rng.standard_normal
    a_all = draw((m, kmax))
    b_all = draw((kmax, n))
    tc = get_model(device, "fp8_e4m3", "fp32")
    wide25 = tc.with_(name=tc.name + " neab=2", neab=2, mb=23)
    rows = []
    for k in sorted(ks):
        a, b = a_all[:, :k], b_all[:k, :]
        row: dict[str, Any] = {"K": k}
        aq, bq, sa, sb = quantize_tiles(a, b, per_tensor=True)
        x = _reference(aq, bq, sa, sb)
        s = float(_fround(sa[0, 0] * sb[0, 0], fp32))
        for arm, model, promote in (("unpromoted", tc, None), ("promoted", tc, _GROUP), ("wide25", wide25, None)):
            d = matmul(aq, bq, model=model, promote_every=promote, input_rounding="exact")
            d = np.asarray(_fround(s * d, fp32), dtype=np.float64)
            row.update({f"{arm}_{key}": v for key, v in _errors(d, x).items()})
        aq, bq, sa, sb = quantize_tiles(a, b)
        x = _reference(aq, bq, sa, sb)
        d = matmul(aq, bq, model=tc, promote_every=_GROUP, scales=(sa, sb), input_rounding="exact")
        row.update({f"tile_promoted_{key}": v for key, v in _errors(d, x).items()})
        rows.append(row)
    return {"config": {"m": m, "n": n, "distribution": distribution, "seed": seed, "model": tc.name,
                       "promote_every": _GROUP}, "rows": rows}
