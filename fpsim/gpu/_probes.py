"""The probe vectors of one ``mma.sync`` path (:func:`probe_suite`; documented in `fpsim.gpu.probing`).

Below both `mma_check` (which runs them beside random tiles in ``crosscheck_mma(probes=True)``) and `probing`
(which fits block-FMA parameters to a device's outputs for them), so neither imports the other's caller.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .._fpenv import ieee_mode
from ..formats import Format, FormatLike, fp32, tf32
from ..rounding import round as fround
from .fragments import instruction_for

__all__ = ["Probe", "probe_suite", "p", "u"]

u = 2.0**-24


def p(n: int) -> float:
    return math.ldexp(1.0, n)


@ieee_mode
@dataclass(frozen=True)
class Probe:
    """One probe: ``d = c + sum_i a[i]*b[i]`` (zero-padded to the instruction's K)."""

    id: str
    a: tuple[float, ...]
    b: tuple[float, ...]
    c: float
    purpose: str = ""


def _exact_in(v: Sequence[float] | float, fmt: Format) -> bool:
    x = np.atleast_1d(np.asarray(v, dtype=np.float64))
    with np.errstate(over="ignore", invalid="ignore"):
        r = np.asarray(fround(x, fmt, "rne"), dtype=np.float64)
    return bool(np.array_equal(r, x))


def _split_pow2(e: int, fmt: Format) -> tuple[float, float] | None:
    """(x, y), both powers of two exact in `fmt`, with x*y = 2**e; prefer y = 1."""
    for y in itertools.chain([0], range(-1, -60, -1)):
        x = e - y
        if _exact_in(p(x), fmt) and _exact_in(p(y), fmt):
            return p(x), p(y)
    return None


def _split_pow2_normal(e: int, fmt: Format) -> tuple[float, float] | None:
    """(x, y), powers of two exact and *normal* in `fmt`, x*y = 2**e (so the product exponent is exactly e)."""
    lo = math.floor(math.log2(fmt.min_normal))
    for x in itertools.chain([e // 2], range(e // 2 + 1, e // 2 + 80)):
        y = e - x
        if lo <= x and lo <= y and _exact_in(p(x), fmt) and _exact_in(p(y), fmt):
            return p(x), p(y)
    return None


def _reference_probes(K: int) -> list[Probe]:
    """P1-P24 of the reference (fp16 inputs, fp32 out unless noted), K-limited."""
    P = [
        Probe("P1", (1,), (1,), -(1 - u), "V100 truncates c's tail"),
        Probe("P2", (1,) * 4, (u,) * 4, 1.0, "alignment of 4 tiny terms"),
        Probe("P3", (0.5,) * 4, (u,) * 4, 1.0, "unnormalised product exponents"),
        Probe("P4", (1,) * 4, (2, 3 * u, 0, 0), 0.0, "output rounding (positive)"),
        Probe("P5", (1,) * 4, (-2, -3 * u, 0, 0), 0.0, "output rounding (negative)"),
        Probe("P6", (1,) * 4, (u,) * 4, 1 - u, "normalisation in the addition"),
        Probe("P7", (1, 1), (1, -u), -1 + u, "cancellation"),
        Probe("P8", (1,) * 4, (p(-23), 1, 1, 1), 1 + p(-22) + p(-23), "carry-out"),
        Probe("P9", (1,) * 4, (1, 1.5, 1.75, 1.875), 1.875, "third carry bit"),
        Probe("P10", (1,) * 4, (1,) * 4, 1 + p(-22) + p(-23), "RZ when normalising"),
        Probe("P11", (1,) * 4, (-1,) * 4, -(1 + p(-22) + p(-23)), "RZ when normalising (negative)"),
        Probe("P12a", (0.5,) * 4, (u, u, u, 3 * u), 1 - u, "monotonicity in c (low c)"),
        Probe("P12b", (0.5,) * 4, (u, u, u, 3 * u), 1.0, "monotonicity in c (high c)"),
        Probe("P14", (u,), (4,), 0.0, "subnormal input"),
        Probe("P15", (0.0,), (0.0,), p(-149), "subnormal C passes"),
        Probe("P16a", (p(-133),), (p(7),), 0.0, "bf16 tiny product (subnormal output)"),
        Probe("P16b", (p(-126),), (1,), -p(-127), "bf16 subnormal result"),
        Probe("P17", (1 - u,), (1 - u,), 0.0, "tf32 truncation of fp32 inputs"),
        Probe("P18", (u, u), (1, 1), 1.0, "one extra alignment bit"),
        Probe("P19", (u, u, u), (1, 0.5, 0.5), 1.0, "two extra alignment bits"),
        Probe("P21", (p(-21) + u,) * 2, (1, 1), 1 - p(-21), "delayed normalisation"),
        Probe("P23", (0,) * 8 + (u,), (0,) * 8 + (1.5,), 1 + p(-23), "RZ across chained blocks"),
        Probe("P24", (1, 1), (1, -u), 0.0, "sign-magnitude truncation"),
        # fp16-output probes
        Probe("P13", (u, u), (0.5, 0.25), 0.0, "fp16 out: RN of a subnormal sum"),
        Probe("P22", (1, 1, 1), (1, 1, 1), 1 + p(-10) + p(-9), "fp16 out: RN to fp16"),
    ]
    for j in range(1, K):
        a = [0.0] * (j + 1)
        b = [0.0] * (j + 1)
        a[0] = b[0] = 1.0
        a[j], b[j] = p(-23), 1.0
        P.append(Probe(f"P20.{j}", tuple(a), tuple(b), 1 + p(-23), "k detector (grid 23 bits)"))
    signed = []
    for q in P:
        if q.id in ("P18", "P19", "P21", "P23"):
            signed.append(Probe(q.id + "-", tuple(-x for x in q.a), q.b, -q.c, q.purpose + " (negated)"))
    return [q for q in P + signed if len(q.a) <= K]


def _families(fin: Format, fout: Format, K: int) -> list[Probe]:
    out: list[Probe] = []
    ms = (23, 13, 10) if fout == fp32 else (10,)
    for m in ms:
        sp = _split_pow2(-m, fin)
        # K detector: 1*1 + c (= 1 + 2^-m) + one tiny term 2^-m at index j: kept only inside one block.
        if sp is not None:
            for j in range(1, K):
                a = [0.0] * (j + 1)
                b = [0.0] * (j + 1)
                a[0] = b[0] = 1.0
                a[j], b[j] = sp
                out.append(Probe(f"K{m}.{j}", tuple(a), tuple(b), 1 + p(-m), f"k detector (grid {m} bits)"))
        # Alignment width: 2^(t-m) terms of 2^-t sum to 2^-m; survive iff the grid is >= t bits.
        for t in range(m, m + 6):
            cnt = 1 << (t - m)
            sp_t = _split_pow2(-t, fin)
            if cnt > K or sp_t is None:
                continue
            out.append(Probe(f"AL{m}.{t}", (sp_t[0],) * cnt, (sp_t[1],) * cnt, 1.0, f"alignment: {t} grid bits?"))
            out.append(Probe(f"AL{m}.{t}-", (-sp_t[0],) * cnt, (sp_t[1],) * cnt, -1.0, "alignment (negated)"))
        # Rounding ties: 1*1 + (1 + f 2^-m) = 2 + (f/2) quanta of a result with m fraction bits.
        for f in (3, 5):
            out.append(Probe(f"RT{m}.{f}+", (1.0,), (1.0,), 1 + f * p(-m), f"rounding: +{f / 2} quanta"))
            out.append(Probe(f"RT{m}.{f}-", (-1.0,), (1.0,), -(1 + f * p(-m)), f"rounding: -{f / 2} quanta"))
    # Grid width with one tiny term 2^-t beside 1*1 (leading exponent 0): for RZ results, c = 1 and a negative
    # tiny term gives 2 - 2^-t, truncated below 2 iff the term survives alignment; for RNE results, c = 1 + 2^-mo
    # puts the sum on a tie that a surviving positive tiny term breaks upward.
    mo = fout.mbits
    for t in range(11, 41):
        sp = _split_pow2(-t, fin)
        if sp is None:
            continue
        out.append(Probe(f"TB.{t}-", (1.0, -sp[0]), (1.0, sp[1]), 1.0, f"grid width: 2^-{t} kept? (RZ)"))
        out.append(Probe(f"TB.{t}+", (1.0, sp[0]), (1.0, sp[1]), 1 + p(-mo), f"grid width: 2^-{t} kept? (RNE tie)"))
    # Exponent floor mel: it only coarsens the grid when every term is below 2^mel. A leading product 2^e and a
    # tiny one at 2^(e-d) (normal factors, so their exponents are exact): with fp32 (RZ) output a negative tiny
    # term shows as one quantum less while it survives; with fp16 (RNE) output a positive one breaks the tie
    # 2^e + 2^-25 (e <= -15: fp16 subnormal quantum 2^-24).
    if fout == fp32 and fin.emin <= -100:
        for d in (12, 18, 24):
            for e in range(-148, -117):
                lead, tiny = _split_pow2_normal(e, fin), _split_pow2(e - d, fin)
                if lead is None or tiny is None:
                    continue
                out.append(Probe(f"ML.{e}.{d}", (lead[0], -tiny[0]), (lead[1], tiny[1]), 0.0,
                                 f"exponent floor: 2^{e} - 2^{e - d}"))
    if fout != fp32:
        half = _split_pow2_normal(-25, fin)
        for e in range(-24, -14):
            lead, tiny = _split_pow2_normal(e, fin), _split_pow2(e - 23, fin)
            if lead is None or tiny is None or half is None:
                continue
            out.append(Probe(f"MLH.{e}", (lead[0], half[0], tiny[0]), (lead[1], half[1], tiny[1]), 0.0,
                             f"exponent floor: tie 2^{e} + 2^-25 broken by 2^{e - 23}?"))
    if fout != fp32 and K >= 6:
        # Grid width inside the first mod-4 group (indices 0, 1, 4, 5) with C = 0, for paths that add C late:
        # 16*16 + 16*16 + 0.5*0.5 is a tie of the fp16 result (2^9 + half a quantum); a surviving tiny term
        # 2^(8-t) at index 5 breaks it upward.
        for t in range(11, 27):
            sp = _split_pow2(8 - t, fin)
            if sp is None or not _exact_in([16.0, 0.5], fin):
                continue
            out.append(Probe(f"TBG.{t}", (16.0, 16.0, 0.0, 0.0, 0.5, sp[0]), (16.0, 16.0, 0.0, 0.0, 0.5, sp[1]), 0.0,
                             f"grid width in group 0: 2^-{t} kept? (RNE tie)"))
    return out


def _random_probes(fin: Format, fout: Format, K: int, n: int, seed: int) -> list[Probe]:
    rng = np.random.default_rng(seed)
    ov = "saturate" if fin.width <= 8 else "ieee"
    a = rng.standard_normal((n, K))
    b = rng.standard_normal((n, K))
    wide = np.arange(n) % 2 == 1
    spread = 3 if fin.width <= 8 else 8
    a[wide] = np.ldexp(a[wide], rng.integers(-spread, spread + 1, size=a[wide].shape))
    a = np.asarray(fround(a, fin, "rne", overflow=ov), dtype=np.float64)
    b = np.asarray(fround(b, fin, "rne", overflow=ov), dtype=np.float64)
    c = np.asarray(fround(rng.uniform(0, 1, n), fout, "rne"), dtype=np.float64)
    return [Probe(f"R.{i}", tuple(a[i]), tuple(b[i]), float(c[i]), "random row") for i in range(n)]


@ieee_mode
def probe_suite(input: FormatLike, output: FormatLike = "fp32", *, random_rows: int = 48,
                seed: int = 0) -> tuple[Probe, ...]:
    """All probes for one ``mma.sync`` path whose values are exact in its formats.

    a and b must be exact in the input format (tf32 probe P17 excepted: it feeds fp32 values on purpose) and
    c exact in the output format; probes longer than the instruction's K are dropped.

    Examples
    --------
    >>> ids = [q.id for q in probe_suite("fp16", "fp32")]
    >>> "P20.15" in ids and "P18-" in ids and "R.0" in ids
    True
    """
    ins = instruction_for(input, output)
    fin, fout, K = ins.input, ins.output, ins.k
    cands = _reference_probes(K) + _families(fin, fout, K)
    keep = []
    seen = set()
    for q in cands:
        if q.id in seen:
            continue
        ok_in = _exact_in(q.a, fin) and _exact_in(q.b, fin)
        if fin == tf32 and q.id == "P17":
            ok_in = True
        if ok_in and _exact_in(q.c, fout):
            keep.append(q)
            seen.add(q.id)
    return tuple(keep) + tuple(_random_probes(fin, fout, K, random_rows, seed))
