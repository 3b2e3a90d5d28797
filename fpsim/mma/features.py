"""FTTN-style feature tests: probe any matrix-unit model for the numerical features Li et al. test on hardware.

Li, Li, Fang, Swirydowicz, Laguna and Gopalakrishnan, *FTTN: Feature-Targeted Testing for Numerical Properties
of NVIDIA & AMD Matrix Accelerators* (CCGrid 2024, arXiv:2403.00232; suite at github.com/LLNL/FTTN) find a
matrix unit's features from the outputs of a few crafted ``D = A @ B + C`` products. :func:`probe_features` runs the
same probe vectors (those of the suite's ``fp16in.cpp``, the fp16 -> fp32 program, with its decision rules) on
an :class:`~fpsim.mma.MMAModel` through :func:`fpsim.mma.dot`, so every preset (NVIDIA and AMD) can be compared
with the published hardware answers. Probes whose constants the model's input format cannot hold (FP8) are not
run.

Examples
--------
>>> from fpsim.mma import get_model
>>> f = probe_features(get_model("a100", "fp16"))
>>> (f["rounding"], f["extra_bits"], f["fma_width"])
('rtz', 1, 8)
>>> probe_features(get_model("mi250x", "fp16"))["subnormal_inputs"]
False
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._fpenv import ieee_mode
from ..formats import fp32
from .gemm import dot
from .model import MMAModel, as_model

__all__ = ["FEATURES", "probe_features"]

#: Keys of the dict :func:`probe_features` returns, in FTTN's order (T_si_no ... T_acc_order).
FEATURES: tuple[str, ...] = ("subnormal_inputs", "subnormal_c", "subnormal_outputs", "rounding_product", "rounding",
                             "rounding_acc", "extra_bits", "ties_to_even", "sticky_bit", "fma_width", "preserves_extra_bits",
                             "normalisation", "monotonic")

_MN = 2.0**-14  # fp16 min normal, FTTN's "minnormal16"


def _run(model: MMAModel, a: list[float], b: list[float], c: float) -> float:
    return float(dot(np.array(a, dtype=np.float64), np.array(b, dtype=np.float64), c, model,
                     input_rounding="exact"))


def _direction(pos: float, neg: float, lo: float, hi: float) -> str:
    """FTTN's rounding decision from a positive case (exact value between lo and hi = lo + ulp) and its mirror."""
    up = {lo: False, hi: True}.get(pos)
    down_away = {-lo: False, -hi: True}.get(neg)
    if up is None or down_away is None:
        return "undetermined"
    return {(False, False): "rtz", (True, True): "rn", (True, False): "rup", (False, True): "rdn"}[(up, down_away)]


@ieee_mode
def probe_features(model: MMAModel | str) -> dict[str, Any]:
    """Run FTTN's feature tests on `model` (fp16, bf16, tf32/xf32 or fp32 inputs; fp32 output).

    Returns
    -------
    dict
        ``subnormal_inputs``: a subnormal input (A or B) yields its exact product (T_si_no);
        ``subnormal_c``: a subnormal C passes through (``2**-127`` with zero products);
        ``subnormal_outputs``: normal inputs whose product is an fp32 subnormal give it (T_no_so; ``None`` for
        fp16 inputs, whose products never reach fp32's subnormal range);
        ``rounding_product``: direction of the rounding of one fp32 product (T_prod, fp32 inputs only);
        ``rounding`` / ``rounding_acc``: direction of the rounding of a product sum ``a1 b1 + a2 b2`` and of
        ``a1 b1 + c`` (T_rnd_dir): ``"rtz"``, ``"rn"``, ``"rup"``, ``"rdn"``;
        ``extra_bits``: alignment bits kept below fp32's last bit: 0, 1, or 3 (FTTN's T_1_bit and
        T_3_bits_fin_rnd; 3 means "2 or 3" under truncation, as FTTN says);
        ``ties_to_even`` / ``sticky_bit``: asked only with three extra bits and round-to-nearest (else None);
        ``fma_width``: products summed before any rounding (T_blk_fma_width; FTTN stops at 16);
        ``preserves_extra_bits``: the case FTTN's reordering test finds (T_pres_extra_acc / T_acc_order):
        ``"preserved"`` (case 1), ``"order-dependent"`` (case 2) or ``"not preserved"`` (case 3);
        ``normalisation``: ``"once"`` or ``"partial"`` (normalise the partial sum), when FTTN can tell;
        ``monotonic``: FTTN's monotonicity probe (None where it does not apply).

    Examples
    --------
    >>> f = probe_features("v100:fp16")
    >>> (f["subnormal_inputs"], f["rounding"], f["extra_bits"], f["fma_width"])
    (True, 'rtz', 0, 1)
    """
    m = as_model(model)
    if m.output != fp32 or m.input.name not in ("fp16", "bf16", "tf32", "fp32"):
        raise ValueError(f"FTTN's probes need fp16, bf16, tf32 (xf32) or fp32 inputs and fp32 output; {m.name} has "
                         f"{m.input.name} -> {m.output.name}")
    sub = float(m.input.min_subnormal)
    out: dict[str, Any] = {}
    out["subnormal_inputs"] = (_run(m, [sub], [1.0], 0.0) == sub) and (_run(m, [1.0], [sub], 0.0) == sub)
    out["subnormal_c"] = _run(m, [0.0], [0.0], 2.0**-127) == 2.0**-127
    if m.input.name == "fp16":
        out["subnormal_outputs"] = None
    else:  # tf-fp32in.cpp: minnormal32 * 0.5 = 2**-127, an fp32 subnormal from normal inputs
        out["subnormal_outputs"] = _run(m, [2.0**-126], [0.5], 0.0) == 2.0**-127
    if m.input.name == "fp32":  # tf-fp32in.cpp's T_prod: a product that is not an fp32 value, C = 0
        a1, b1 = 1.0 + 2.0**-22 + 2.0**-23, 1.25
        out["rounding_product"] = _direction(_run(m, [a1], [b1], 0.0), _run(m, [-a1], [b1], 0.0),
                                             1.25 + 2.0**-22 + 2.0**-23, 1.25 + 2.0**-21)
    else:
        out["rounding_product"] = None
    t = 2.0**-9 + 2.0**-10  # minnormal16 * t = 0.75 ulp of 2 in fp32
    out["rounding"] = _direction(_run(m, [_MN, 1.0], [t, 2.0], 0.0), _run(m, [_MN, 1.0], [-t, -2.0], 0.0),
                                 2.0, 2.0 + 2.0**-22)
    out["rounding_acc"] = _direction(_run(m, [_MN], [t], 2.0), _run(m, [1.0], [-2.0], -(2.0**-23 + 2.0**-24)),
                                     2.0, 2.0 + 2.0**-22)
    one_extra = _run(m, [1.0], [1.0], -(1.0 - 2.0**-24)) == 2.0**-24
    extra = 1 if one_extra else 0
    rz = out["rounding"] == "rtz" and out["rounding_acc"] == "rtz"
    rn = out["rounding"] == "rn" and out["rounding_acc"] == "rn"
    if one_extra and rz:
        r = np.float32(_run(m, [1.0], [1.25], -(2.0**-3 + 2.0**-25))).view(np.uint32)
        extra = 3 if r == 0x3F8FFFFF else 1
    elif one_extra and rn:
        r = np.float32(_run(m, [1.0], [1.25], -(2.0**-3 + 2.0**-24 + 2.0**-26))).view(np.uint32)
        extra = 3 if r == 0x3F8FFFFF else 1
    out["extra_bits"] = extra
    # Only asked by FTTN for three extra bits under round-to-nearest.
    out["ties_to_even"] = (_run(m, [2.0**-10], [_MN], 1.0) == 1.0) if extra == 3 and rn else None
    out["sticky_bit"] = (_run(m, [1.0], [1.0], 2.0**-24 + 2.0**-27) == 1.0 + 2.0**-23) \
        if extra == 3 and rn and out["ties_to_even"] else None
    # Reordering test: two tiny products with C = 1, against one tiny product, C = tiny and a 1*1 product.
    tiny = 2.0**-10  # tiny * minnormal16 = 2**-24
    sum_c = _run(m, [tiny, tiny], [_MN, _MN], 1.0)
    same = (_run(m, [1.0, tiny], [1.0, _MN], 2.0**-24) == sum_c) and (_run(m, [tiny, 1.0], [_MN, 1.0], 2.0**-24)
                                                                    == sum_c)
    case = ("not preserved" if sum_c == 1.0 else "preserved") if same else "order-dependent"
    out["preserves_extra_bits"] = case
    if case == "preserved":
        width = 64
        for idx in range(1, 64):
            a = [tiny] + [0.0] * (idx - 1) + [tiny]
            bb = [_MN] + [0.0] * (idx - 1) + [_MN]
            if _run(m, a, bb, 1.0) == 1.0:
                width = idx
                break
    else:
        width = 1
    out["fma_width"] = width
    norm: str | None = None
    if width >= 4 and case == "preserved" and rz and extra == 1:
        r2 = _run(m, [2.0**-9, 2.0**-11, 2.0**-11], [_MN] * 3, 1.0 - 2.0**-24)
        norm = {1.0: "partial", 1.0 + 2.0**-23: "once"}.get(r2, "undetermined")
    elif case != "preserved" and rn:
        r2 = _run(m, [2.0**-9, 2.0**-10], [_MN] * 2, 1.0 - 2.0**-24)
        norm = {1.0: "partial", 1.0 + 2.0**-23: "once"}.get(r2, "undetermined")
    out["normalisation"] = norm
    mono: bool | None = None
    if norm == "once" and width >= 8 and extra == 1:
        smaller = _run(m, [1.0] * 8, [1.0] * 8, 2.0**25 - 2.0)
        larger = _run(m, [1.0] * 8, [1.0] * 8, 2.0**25)
        mono = smaller <= larger
    out["monotonic"] = mono
    return {k: out[k] for k in FEATURES}
