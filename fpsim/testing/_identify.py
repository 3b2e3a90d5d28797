"""Identify a matrix unit's accumulator from measured rows: which block-FMA models reproduce every one.

:func:`identify_accumulator` takes rows ``D = C + sum_k A[:, k] * B[:, k]`` measured on some hardware (random
data will do: no designed probes are needed) and searches the full cross product of the
:class:`fpsim.mma.MMAModel` block-FMA parameters (:func:`candidate_space`): block size ``k``, extra alignment
bits ``neab``, block rounding (RZ/RNE), kept fraction bits ``mb``, how C enters (inside the first block, or
added late), the mod-4 grouping order, and the exponent floor ``mel``. It returns every model that reproduces
every row, the shipped presets among them, and for each rejected hypothesis the first row that rules it out.

The search is vectorised over candidates: all hypotheses that share a block size and C entry are evaluated
together on the same rows (:func:`predict`, the block-FMA arithmetic of :mod:`fpsim.mma._bfma` with its
parameters as arrays). The first 64 rows prune, the survivors see the rest. The exponent floor changes a
prediction only on rows where some block's largest product exponent lies below it, so each ``mel`` is checked
on those rows alone, next to the ``mel = None`` answer on the others.

The designed probe vectors of :mod:`fpsim.gpu.probing` are one input among others: ``fit_parameters`` turns
them into rows and scores its candidates with :func:`mismatch_counts`.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._fpenv import ieee_mode
from ..bits import from_bits
from ..formats import Format, FormatLike, as_format, fp32
from ..mma import DEVICES, MMAModel, dot, get_model
from ..mma.model import exponents, prod_flags, specials
from ..rounding import round as _round

__all__ = [
    "Identification",
    "Rejection",
    "candidate_space",
    "identify_accumulator",
    "mismatch_counts",
    "predict",
    "preset_models",
]

PARAMS: tuple[str, ...] = ("k", "neab", "rounding", "mb", "c_entry", "grouping", "mel")
_NO_MEL = -(1 << 20)  # "no exponent floor" as an integer that never wins E_max
_FIRST = 64  # rows every candidate sees before the survivors see the rest
_TERMS = 1 << 22  # float64 terms evaluated at once (memory bound of the batched evaluator)


# ---------------------------------------------------------------------------------------------------------
# Rows
# ---------------------------------------------------------------------------------------------------------

def _values(x: Any, fmt: Format, name: str, *, exact: bool) -> np.ndarray:
    """Codes (integer arrays) or values of `fmt` as float64; values must be exact in `fmt` when `exact`."""
    arr = np.asarray(x)
    if arr.dtype.kind in "ui":
        if fmt == fp32:
            return arr.astype(np.uint32).view(np.float32).astype(np.float64)
        return np.asarray(from_bits(arr.astype(np.uint64), fmt), dtype=np.float64)
    if arr.dtype.kind == "b" or arr.dtype.kind not in "f":
        raise TypeError(f"{name} must hold float values or integer codes of {fmt.name}, got dtype {arr.dtype}")
    v = arr.astype(np.float64)
    if exact:
        with np.errstate(invalid="ignore", over="ignore"):
            r = np.asarray(_round(v, fmt, "rne"), dtype=np.float64)
        bad = ~((r == v) | np.isnan(v))
        if bad.any():
            i = tuple(int(j) for j in np.unravel_index(int(np.flatnonzero(bad.ravel())[0]), v.shape))
            raise ValueError(f"{name}{list(i)} = {float(v[i])!r} is not a value of {fmt.name} ({int(bad.sum())} such "
                             f"entries); pass values exact in the stated format, or its integer codes")
    return v


def _rows(A: Any, B: Any, C: Any, D: Any, fin: Format, fout: Format
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    a = _values(A, fin, "A", exact=True)
    b = _values(B, fin, "B", exact=True)
    if a.ndim != 2 or a.shape != b.shape:
        raise ValueError(f"A and B must be 2-D (rows x K) of one shape, got {a.shape} and {b.shape}")
    r = a.shape[0]
    if r == 0 or a.shape[1] == 0:
        raise ValueError(f"need at least one row and one term, got A of shape {a.shape}")
    c = np.broadcast_to(_values(C, fout, "C", exact=False), (r,)).astype(np.float64)
    # C is rounded (RNE) to the output format before use, as fpsim.mma.dot and the hardware do.
    if fout == fp32:
        with np.errstate(over="ignore"):
            c = c.astype(np.float32).astype(np.float64)
    else:
        with np.errstate(invalid="ignore", over="ignore"):
            c = np.asarray(_round(c, fout, "rne"), dtype=np.float64)
    d = _values(D, fout, "D", exact=True)
    if d.shape != (r,):
        raise ValueError(f"D must hold one value per row, shape ({r},), got {d.shape}")
    return a, b, c, d


# ---------------------------------------------------------------------------------------------------------
# The batched block-FMA arithmetic
# ---------------------------------------------------------------------------------------------------------

def _round_block(v: np.ndarray, mb: np.ndarray, fout: Format, rz: np.ndarray) -> np.ndarray:
    """fpsim.mma.model.round_block with per-candidate `mb` and `rz` (arrays broadcasting against v)."""
    _, ex = np.frexp(v)
    q = np.maximum(ex - 1, fout.emin) - mb
    y = np.ldexp(v, -q)
    y = np.where(rz, np.trunc(y), np.rint(y))
    d = np.ldexp(y, q)
    with np.errstate(invalid="ignore"):
        d = np.where(np.abs(d) >= 2.0 ** (fout.emax + 1), np.copysign(np.inf, d), d)
    res: np.ndarray = d + 0.0
    return res


def _late_add(d: np.ndarray, c: np.ndarray, fout: Format) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        s = d + c
        if fout == fp32:
            r: np.ndarray = s.astype(np.float32).astype(np.float64) + 0.0
        else:
            r = np.asarray(_round(s, fout, "rne"), dtype=np.float64) + 0.0
    return r


def _block(p: np.ndarray, e: np.ndarray, c: np.ndarray, neab: np.ndarray, mb: np.ndarray, rz: np.ndarray,
           mel: np.ndarray, fout: Format) -> np.ndarray:
    """One block FMA for every (candidate, row): p, e of shape (k, R); c and the result (N, R)."""
    spec = None
    fin_p = bool(np.isfinite(p).all())
    fin_c = bool(np.isfinite(c).all())
    if not (fin_p and fin_c):
        spec = specials(None if fin_p else prod_flags(p), c)
        if not fin_p:
            with np.errstate(invalid="ignore"):
                p = np.where(np.isfinite(p), p, 0.0)
        if not fin_c:
            c = np.where(np.isfinite(c), c, 0.0)
    ec = exponents(c, -126).astype(np.int32)  # C's binary32 exponent, also in fp16-out mode
    emax = np.maximum(np.maximum(e.max(axis=0).astype(np.int32)[None, :], ec), mel)
    sh = 23 + neab - emax
    scale = np.ldexp(1.0, np.clip(sh, -1074, 1023))
    with np.errstate(under="ignore"):
        x = np.trunc(p[None, :, :] * scale[:, None, :])
        s = x.sum(axis=1) + np.trunc(np.ldexp(c, np.clip(sh, -1074, 1023)))  # integers below 2**53: exact
    d = _round_block(np.ldexp(s, -sh), mb, fout, rz)
    if spec is not None:
        d = np.where(spec[0], spec[1], d)
    return d


@ieee_mode
def predict(a: np.ndarray, b: np.ndarray, c: np.ndarray, input: FormatLike, output: FormatLike, *, k: int,
            c_entry: str, grouping: str, neab: Sequence[int] | np.ndarray, mb: Sequence[int] | np.ndarray,
            rounding: Sequence[str] | np.ndarray, mel: Sequence[int | None] | np.ndarray) -> np.ndarray:
    """D of every row under N block-FMA candidates sharing ``k``, ``c_entry`` and ``grouping``: shape (N, R).

    `a`, `b` (R, K) hold values of `input`, `c` (R,) values of `output` (already rounded to it); `neab`, `mb`,
    `rounding` and `mel` give each candidate's other parameters (``mel`` None: no floor). Same bits as
    :func:`fpsim.mma.dot` with ``input_rounding="exact"`` on ``MMAModel(kind="bfma", ...)`` with those
    parameters (the tests check it), for all candidates at once.

    Examples
    --------
    >>> import numpy as np
    >>> a = np.array([[1.0, 2.0**-24, 2.0**-24]]); b = np.ones((1, 3))  # 1 + 2^-23 exactly
    >>> predict(a, b, np.array([0.0]), "fp16", "fp32", k=4, c_entry="inside", grouping="none",
    ...         neab=[0, 1], mb=[23, 23], rounding=["rz", "rz"], mel=[None, None]).tolist()
    [[1.0], [1.0000001192092896]]
    """
    fin, fout = as_format(input), as_format(output)
    n = len(neab)
    col = (slice(None), None)
    ne = np.asarray(neab, dtype=np.int32)[col]
    mbs = np.asarray(mb, dtype=np.int32)[col]
    rz = (np.asarray(rounding) == "rz")[col]
    mels = np.array([_NO_MEL if m is None else int(m) for m in mel], dtype=np.int32)[col]
    ki = 2 * k if grouping == "mod4" else k
    r, kk = a.shape
    kp = -(-kk // ki) * ki
    x = np.zeros((kp, r))
    y = np.zeros((kp, r))
    x[:kk] = a.T
    y[:kk] = b.T
    with np.errstate(invalid="ignore", over="ignore"):
        prod = x * y
    e = exponents(x, fin.emin).astype(np.int32) + exponents(y, fin.emin)
    d = np.broadcast_to(c, (n, r)).astype(np.float64)
    zero = np.zeros((n, r))
    g0 = (np.arange(ki) % 4) < 2
    for j in range(0, kp, ki):
        pj, ej = prod[j:j + ki], e[j:j + ki]
        if grouping == "mod4":
            d0 = _block(pj[g0], ej[g0], zero, ne, mbs, rz, mels, fout)
            d = _late_add(_block(pj[~g0], ej[~g0], d0, ne, mbs, rz, mels, fout), d, fout)
        elif c_entry == "late":
            d = _late_add(_block(pj, ej, zero, ne, mbs, rz, mels, fout), d, fout)
        else:
            d = _block(pj, ej, d, ne, mbs, rz, mels, fout)
    return d


def _agree(pred: np.ndarray, obs: np.ndarray) -> np.ndarray:
    """Bitwise agreement of values of one format; NaN matches NaN, and signed zero is not modelled."""
    with np.errstate(invalid="ignore"):
        return np.asarray((pred == obs) | (np.isnan(pred) & np.isnan(obs)))


# ---------------------------------------------------------------------------------------------------------
# Candidates and presets
# ---------------------------------------------------------------------------------------------------------

def _pow2_upto(n: int) -> list[int]:
    out, k = [], 1
    while k <= n:
        out.append(k)
        k *= 2
    return out


def _kcap(K: int) -> int:
    """Smallest power of two >= K: every block size from there on gives the same D on K-term rows."""
    return 1 << max(0, (K - 1).bit_length())


@ieee_mode
def candidate_space(input: FormatLike, output: FormatLike, K: int) -> list[dict[str, Any]]:
    """The block-FMA hypotheses for rows of K terms (without ``mel``), as parameter dicts.

    The full cross product: ``k`` a power of two up to the first one >= K (larger blocks give the same D on
    K-term rows), ``neab`` in [-12, 6], rounding RZ or RNE, ``mb`` from ``output.mbits - 13`` to
    ``output.mbits``, and C inside / C late / C late with the mod-4 grouping (even ``k`` up to half that cap).

    Examples
    --------
    >>> len(candidate_space("fp16", "fp32", 8))
    5320
    """
    fout = as_format(output)
    as_format(input)
    cap = _kcap(K)
    mbs = range(max(0, fout.mbits - 13), fout.mbits + 1)
    out: list[dict[str, Any]] = []
    for (c_entry, grouping), k in itertools.chain(
            itertools.product([("inside", "none"), ("late", "none")], _pow2_upto(cap)),
            itertools.product([("late", "mod4")], [k for k in _pow2_upto(cap // 2) if k >= 2])):
        for neab, rnd, mb in itertools.product(range(-12, 7), ("rz", "rne"), mbs):
            out.append({"k": k, "neab": neab, "rounding": rnd, "mb": mb, "c_entry": c_entry, "grouping": grouping})
    return out


def mel_options(output: FormatLike) -> list[int | None]:
    """Exponent floors tried: none, and ``output.emin - d`` for d in 0..12 (the presets use d = 5..7)."""
    fout = as_format(output)
    return [None] + [fout.emin - d for d in range(13)]


def preset_models(input: FormatLike, output: FormatLike) -> dict[str, MMAModel]:
    """Every fpsim device preset for this input -> output pair, keyed by device (b200's tcgen05 path apart)."""
    fin, fout = as_format(input), as_format(output)
    out: dict[str, MMAModel] = {}
    for dev in DEVICES:
        try:
            out[dev] = get_model(dev, fin, fout)
        except ValueError:
            continue
    if "b200" in DEVICES:
        try:
            out["b200 (tcgen05)"] = get_model("b200", fin, fout, path="tcgen05")
        except ValueError:
            pass
    return out


def _canonical(m: MMAModel | Mapping[str, Any], K: int) -> tuple[Any, ...]:
    """The hypothesis' parameters with k cut to the largest block size that still differs on K-term rows."""
    vals: dict[str, Any] = ({f: getattr(m, f) for f in PARAMS} if isinstance(m, MMAModel)
                            else {f: m.get(f) for f in PARAMS})
    cap = _kcap(K) // 2 if vals["grouping"] == "mod4" else _kcap(K)
    return (min(int(vals["k"]), max(cap, 1)),) + tuple(vals[f] for f in PARAMS[1:])


# ---------------------------------------------------------------------------------------------------------
# Scoring (also used by fpsim.gpu.probing.fit_parameters)
# ---------------------------------------------------------------------------------------------------------

def _groups(cands: Sequence[Mapping[str, Any]]) -> dict[tuple[int, str, str], list[int]]:
    g: dict[tuple[int, str, str], list[int]] = {}
    for i, c in enumerate(cands):
        g.setdefault((int(c["k"]), str(c["c_entry"]), str(c["grouping"])), []).append(i)
    return g


def _predict_many(a: np.ndarray, b: np.ndarray, c: np.ndarray, fin: Format, fout: Format,
                  cands: Sequence[Mapping[str, Any]], idx: Sequence[int], key: tuple[int, str, str]) -> np.ndarray:
    sel = [cands[i] for i in idx]
    params = {"neab": [s["neab"] for s in sel], "mb": [s["mb"] for s in sel],
              "rounding": [s["rounding"] for s in sel], "mel": [s.get("mel") for s in sel]}
    R = a.shape[0]
    # Rows are independent: a chunk of them at a time keeps the (candidates, k, rows) term array near 32 MB.
    step = max(1, _TERMS // max(1, len(sel) * 2 * key[0]))
    if R <= step:
        return predict(a, b, c, fin, fout, k=key[0], c_entry=key[1], grouping=key[2], **params)
    return np.concatenate([predict(a[i:i + step], b[i:i + step], c[i:i + step], fin, fout, k=key[0],
                                   c_entry=key[1], grouping=key[2], **params) for i in range(0, R, step)], axis=1)


@ieee_mode
def mismatch_counts(a: np.ndarray, b: np.ndarray, c: np.ndarray, d: np.ndarray, input: FormatLike,
                    output: FormatLike, candidates: Sequence[Mapping[str, Any]]) -> np.ndarray:
    """Rows each block-FMA candidate gets wrong (int array, one per candidate), vectorised over candidates.

    Rows are values: `a`, `b` (R, K) of `input`, `c` and `d` (R,) of `output`. A candidate is a dict of
    :data:`PARAMS` (``mel`` optional, default None).

    Examples
    --------
    >>> import numpy as np
    >>> a = np.array([[1.0, 2.0**-24, 2.0**-24]]); b = np.ones((1, 3)); c = np.zeros(1); d = np.array([1.0])
    >>> base = {"k": 4, "rounding": "rz", "mb": 23, "c_entry": "inside", "grouping": "none"}
    >>> mismatch_counts(a, b, c, d, "fp16", "fp32", [{**base, "neab": 0}, {**base, "neab": 1}]).tolist()
    [0, 1]
    """
    fin, fout = as_format(input), as_format(output)
    out = np.zeros(len(candidates), dtype=np.int64)
    for key, idx in _groups(candidates).items():
        pred = _predict_many(a, b, c, fin, fout, candidates, idx, key)
        out[idx] = (~_agree(pred, d[None, :])).sum(axis=1)
    return out


# ---------------------------------------------------------------------------------------------------------
# Identification
# ---------------------------------------------------------------------------------------------------------

@ieee_mode
@dataclass(frozen=True)
class Rejection:
    """Why one hypothesis was rejected: the first row it gets wrong, what it predicts there and what was seen."""

    params: Mapping[str, Any]
    row: int
    expected: float
    observed: float

    def __str__(self) -> str:
        p = self.params
        return (f"k={p['k']} neab={p['neab']} {str(p['rounding']).upper()} mb={p['mb']} mel={p['mel']} "
                f"C {p['c_entry']}{' mod4' if p['grouping'] == 'mod4' else ''}: row {self.row} predicts "
                f"{self.expected!r}, observed {self.observed!r}")


@ieee_mode
@dataclass(frozen=True)
class Identification:
    """:func:`identify_accumulator`'s answer.

    ``models``: every hypothesis that reproduces every row (as :class:`fpsim.mma.MMAModel`); ``presets``: the
    fpsim device presets that reproduce every row (checked with :func:`fpsim.mma.dot`); ``unexplained``: rows
    that no hypothesis reproduces (only computed when no model fits); ``candidates``: hypotheses tried
    (``mel`` included); ``seconds``: wall time of the search.
    """

    input: str
    output: str
    rows: int
    K: int
    candidates: int
    models: tuple[MMAModel, ...]
    presets: tuple[str, ...]
    unexplained: tuple[int, ...]
    seconds: float
    _table: Mapping[str, np.ndarray] = field(repr=False, compare=False)
    _observed: np.ndarray = field(repr=False, compare=False)

    @property
    def rejected(self) -> tuple[Rejection, ...]:
        """Every rejected hypothesis with the first row that rules it out."""
        t = self._table
        idx = np.flatnonzero(t["row"] >= 0)
        return tuple(self._rejection(int(i)) for i in idx)

    def _rejection(self, i: int) -> Rejection:
        t = self._table
        mel = int(t["mel"][i])
        params = {"k": int(t["k"][i]), "neab": int(t["neab"][i]), "rounding": "rz" if t["rz"][i] else "rne",
                  "mb": int(t["mb"][i]), "c_entry": str(t["c_entry"][i]), "grouping": str(t["grouping"][i]),
                  "mel": None if mel == _NO_MEL else mel}
        r = int(t["row"][i])
        return Rejection(params, r, float(t["expected"][i]), float(self._observed[r]))

    def why_not(self, model: MMAModel | Mapping[str, Any]) -> Rejection | None:
        """The first row that rules out `model` (an MMAModel or a dict of the parameters); None if it fits.

        Raises ValueError when the hypothesis lies outside the searched space.
        """
        key = _canonical(model, self.K)
        t = self._table
        mel = _NO_MEL if key[6] is None else int(key[6])
        hit = np.flatnonzero((t["k"] == key[0]) & (t["neab"] == key[1]) & (t["rz"] == (key[2] == "rz"))
                             & (t["mb"] == key[3]) & (t["c_entry"] == key[4]) & (t["grouping"] == key[5])
                             & (t["mel"] == mel))
        if hit.size == 0:
            raise ValueError(f"hypothesis {dict(zip(PARAMS, key))} is outside the searched space "
                             "(see fpsim.testing.candidate_space)")
        return None if t["row"][hit[0]] < 0 else self._rejection(int(hit[0]))

    def parameter_sets(self) -> list[dict[str, Any]]:
        """The fitting models' parameters, one dict each."""
        return [{f: getattr(m, f) for f in PARAMS} for m in self.models]

    def summary(self, *, limit: int = 8) -> str:
        head = (f"{self.input}->{self.output}: {self.rows} rows of K={self.K}; {self.candidates} hypotheses "
                f"tried in {self.seconds:.2f} s; {len(self.models)} reproduce every row")
        lines = [head]
        for m in self.models[:limit]:
            lines.append(f"  k={m.k} neab={m.neab} {m.rounding.upper()} mb={m.mb} mel={m.mel} C {m.c_entry}"
                         + (" mod4" if m.grouping == "mod4" else ""))
        if len(self.models) > limit:
            lines.append(f"  ... and {len(self.models) - limit} more")
        lines.append("presets reproducing every row: " + (", ".join(self.presets) or "none"))
        if self.unexplained:
            lines.append(f"rows no hypothesis explains: {len(self.unexplained)} (first: "
                         f"{', '.join(map(str, self.unexplained[:10]))})")
        return "\n".join(lines)


def _first_bad(ok: np.ndarray) -> np.ndarray:
    """Index of the first False along axis 1, or -1 where all are True."""
    bad = ~ok
    any_bad = bad.any(axis=1)
    return np.where(any_bad, np.argmax(bad, axis=1), -1)


def _lowest_block(a: np.ndarray, b: np.ndarray, fin: Format, k: int, grouping: str) -> np.ndarray:
    """Per row, the smallest over blocks of the block's largest product exponent.

    An exponent floor ``mel`` can change a row's D only where this lies below ``mel`` (elsewhere every block
    has ``E_max >= mel`` already), so each floor is evaluated on those rows alone.
    """
    ki = 2 * k if grouping == "mod4" else k
    r, kk = a.shape
    kp = -(-kk // ki) * ki
    e = np.full((r, kp), -30000, dtype=np.int32)
    e[:, :kk] = exponents(a, fin.emin).astype(np.int32) + exponents(b, fin.emin)
    if grouping == "mod4":
        g = e.reshape(r, kp // ki, ki)
        g0 = (np.arange(ki) % 4) < 2
        bm = np.concatenate([g[:, :, g0].max(axis=2), g[:, :, ~g0].max(axis=2)], axis=1)
    else:
        bm = e.reshape(r, kp // k, k).max(axis=2)
    res: np.ndarray = bm.min(axis=1)
    return res


def _search(a: np.ndarray, b: np.ndarray, c: np.ndarray, d: np.ndarray, fin: Format, fout: Format,
            base: Sequence[Mapping[str, Any]], key: tuple[int, str, str], mels: Sequence[int | None],
            low: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """First wrong row (-1: none) and the prediction there, for every (candidate, mel): two (n, n_mel) arrays.

    Rows are visited in two chunks, the first :data:`_FIRST` and the rest; a hypothesis that failed in the
    first chunk is not evaluated on the second. Each mel is evaluated only on its rows (see _lowest_block);
    elsewhere it takes the no-floor prediction.
    """
    R = len(d)
    n, nm = len(base), len(mels)
    row = np.full((n, nm), -1, dtype=np.int64)
    exp_ = np.zeros((n, nm))
    for lo, hi in ((0, min(_FIRST, R)), (min(_FIRST, R), R)):
        if hi <= lo:
            continue
        alive_any = np.flatnonzero((row < 0).any(axis=1))
        if not alive_any.size:
            break
        rs = slice(lo, hi)
        sel = [{**base[i], "mel": None} for i in alive_any.tolist()]
        pred0 = _predict_many(a[rs], b[rs], c[rs], fin, fout, sel, range(len(sel)), key)
        for j, mel in enumerate(mels):
            alive = np.flatnonzero(row[alive_any, j] < 0)
            if not alive.size:
                continue
            pred = pred0[alive]
            if mel is not None:
                srows = np.flatnonzero(low[rs] < mel)
                if srows.size:
                    pred = pred.copy()
                    selm = [{**base[int(alive_any[i])], "mel": mel} for i in alive]
                    pred[:, srows] = _predict_many(a[rs][srows], b[rs][srows], c[rs][srows], fin, fout, selm,
                                                   range(len(selm)), key)
            fb = _first_bad(_agree(pred, d[None, rs]))
            hit = fb >= 0
            who = alive_any[alive[hit]]
            row[who, j] = fb[hit] + lo
            exp_[who, j] = pred[hit, fb[hit]]
    return row, exp_


@ieee_mode
def identify_accumulator(A: Any, B: Any, C: Any, D: Any, *, input: FormatLike, output: FormatLike = "fp32",
                         candidates: Iterable[Mapping[str, Any]] | None = None) -> Identification:
    """Which block-FMA models reproduce every measured row ``D = C + sum_k A[:, k] * B[:, k]``?

    Parameters
    ----------
    A, B : array_like, shape (rows, K)
        One dot product per row, as values exact in `input` or as its integer codes.
    C : array_like, shape (rows,) or scalar
        Addends as values (rounded RNE to `output` before use, as the hardware does) or codes of `output`.
    D : array_like, shape (rows,)
        The measured results, values of `output` or its integer codes.
    input, output : format name or Format
        The data path, e.g. ``input="fp8_e4m3", output="fp32"``.
    candidates : iterable of dict, optional
        Hypotheses to test instead of :func:`candidate_space` (each crossed with every ``mel`` option).

    Returns
    -------
    Identification
        The models that reproduce every row (``models``), the presets among them (``presets``), each rejected
        hypothesis with the first row that rules it out (``rejected``, ``why_not``), and, when nothing fits,
        the rows no hypothesis explains (``unexplained``). Signed zeros are not compared (not modelled).

    Examples
    --------
    >>> import numpy as np, fpsim
    >>> from fpsim.mma import dot, get_model
    >>> rng = np.random.default_rng(0)
    >>> A = fpsim.round(rng.standard_normal((300, 8)), "fp16")
    >>> B = fpsim.round(rng.standard_normal((300, 8)), "fp16")
    >>> C = fpsim.round(rng.standard_normal(300), "fp32")
    >>> D = dot(A, B, C, get_model("a100", "fp16"))      # stand-in for measured rows
    >>> found = identify_accumulator(A, B, C, D, input="fp16", output="fp32")
    >>> "a100" in found.presets, all(m.k == 8 for m in found.models)
    (True, True)
    >>> print(found.why_not(get_model("v100", "fp16")).row)   # the first row that rules V100's model out
    1
    """
    t0 = time.perf_counter()
    fin, fout = as_format(input), as_format(output)
    a, b, c, d = _rows(A, B, C, D, fin, fout)
    R, K = a.shape
    cands = list(candidate_space(fin, fout, K) if candidates is None else candidates)
    if not cands:
        raise ValueError("no candidate hypotheses to test")
    for cd in cands:
        missing = [f for f in PARAMS[:6] if f not in cd]
        if missing:
            raise ValueError(f"candidate {dict(cd)} lacks {', '.join(missing)}; a candidate needs {', '.join(PARAMS[:6])}")
    mels = mel_options(fout)
    groups = _groups(cands)
    cols: dict[str, list[Any]] = {f: [] for f in ("k", "neab", "rz", "mb", "c_entry", "grouping", "mel", "row",
                                                  "expected")}
    lows: dict[tuple[int, str, str], np.ndarray] = {}
    for key, idx in groups.items():
        low = lows[key] = _lowest_block(a, b, fin, key[0], key[2])
        row, exp_ = _search(a, b, c, d, fin, fout, [cands[i] for i in idx], key, mels, low)
        nm = len(mels)
        for f in ("neab", "mb"):
            cols[f].append(np.tile(np.array([cands[i][f] for i in idx], dtype=np.int32), nm))
        cols["k"].append(np.full(len(idx) * nm, key[0], dtype=np.int32))
        cols["rz"].append(np.tile(np.array([cands[i]["rounding"] == "rz" for i in idx]), nm))
        cols["c_entry"].append(np.full(len(idx) * nm, key[1]))
        cols["grouping"].append(np.full(len(idx) * nm, key[2]))
        cols["mel"].append(np.repeat(np.array([_NO_MEL if m is None else m for m in mels], dtype=np.int32),
                                     len(idx)))
        cols["row"].append(row.T.reshape(-1))
        cols["expected"].append(exp_.T.reshape(-1))
    table = {f: np.concatenate(v) for f, v in cols.items()}
    fit = np.flatnonzero(table["row"] < 0)
    models = []
    for i in fit:
        mv = int(table["mel"][i])
        models.append(MMAModel(
            name=f"identified {fin.name}->{fout.name}", kind="bfma", input=fin, output=fout, k=int(table["k"][i]),
            neab=int(table["neab"][i]), mel=None if mv == _NO_MEL else mv,
            rounding="rz" if table["rz"][i] else "rne", mb=int(table["mb"][i]), c_entry=str(table["c_entry"][i]),
            grouping=str(table["grouping"][i]), source="fpsim.testing.identify_accumulator",
            confidence=f"reproduces all {R} given rows"))
    presets = []
    for dev, m in preset_models(fin, fout).items():
        try:
            got = np.asarray(dot(a, b, c, m, input_rounding="exact"), dtype=np.float64)
        except (ValueError, TypeError):
            continue
        if _agree(got, d).all():
            presets.append(dev)
    unexplained: tuple[int, ...] = ()
    if not models:
        # Rows no hypothesis reproduces: each group only looks at the rows still unexplained.
        left = np.arange(R)
        # The hypotheses that got furthest explain most rows: they go first, so the full sweep sees few rows.
        for i in np.argsort(-table["row"], kind="stable")[:8]:
            mv = int(table["mel"][i])
            gk = (int(table["k"][i]), str(table["c_entry"][i]), str(table["grouping"][i]))
            one = [{"k": gk[0], "neab": int(table["neab"][i]), "mb": int(table["mb"][i]),
                    "rounding": "rz" if table["rz"][i] else "rne", "c_entry": gk[1], "grouping": gk[2],
                    "mel": None if mv == _NO_MEL else mv}]
            pred = _predict_many(a[left], b[left], c[left], fin, fout, one, [0], gk)
            left = left[~_agree(pred[0], d[left])]
        for key, idx in groups.items():
            for mel in mels:
                if not left.size:
                    break
                rows_m = left if mel is None else left[lows[key][left] < mel]
                if not rows_m.size:
                    continue
                sel = [{**cands[i], "mel": mel} for i in idx]
                pred = _predict_many(a[rows_m], b[rows_m], c[rows_m], fin, fout, sel, range(len(sel)), key)
                hit = _agree(pred, d[None, rows_m]).any(0)
                left = np.setdiff1d(left, rows_m[hit])
        unexplained = tuple(int(i) for i in left)
    return Identification(input=fin.name, output=fout.name, rows=R, K=K, candidates=int(table["row"].size),
                          models=tuple(models), presets=tuple(presets), unexplained=unexplained,
                          seconds=time.perf_counter() - t0, _table=table, _observed=d)


# ---------------------------------------------------------------------------------------------------------
# Best fit (fpsim.gpu.probing.fit_parameters: designed probes, which need not all be reproduced)
# ---------------------------------------------------------------------------------------------------------

def fit_candidates(output: FormatLike, K: int) -> list[dict[str, Any]]:
    """The probe fit's hypotheses for one instruction of K products (a subset of :func:`candidate_space`).

    ``k`` dividing K, ``neab`` in [-12, 4], RZ/RNE, ``mb`` the output's (or ``23 + neab`` for a narrower fp32
    accumulator), C inside / late / late with the mod-4 grouping.
    """
    fout = as_format(output)
    ks = [k for k in (1, 2, 4, 8, 16, 32) if k <= K and K % k == 0]
    out: list[dict[str, Any]] = []
    for k, neab, rnd in itertools.product(ks, range(-12, 5), ("rz", "rne")):
        mbs = ((23,) if neab >= 0 else (23 + neab, 23)) if fout == fp32 else (fout.mbits,)
        for mb in mbs:
            for c_entry, grouping in (("inside", "none"), ("late", "none"), ("late", "mod4")):
                if grouping == "mod4" and (K % (2 * k) or k % 2):
                    continue
                out.append({"k": k, "neab": neab, "rounding": rnd, "mb": mb, "c_entry": c_entry,
                            "grouping": grouping})
    return out


@dataclass(frozen=True)
class BestFit:
    """:func:`best_fit`'s answer: the preferred parameters (``mel`` included) and how well they fit."""

    params: Mapping[str, Any]
    mismatches: int
    alternatives: tuple[dict[str, Any], ...]
    mel_candidates: tuple[int | None, ...]
    matches: tuple[str, ...]
    mel_options: tuple[int | None, ...] = ()


def _key(m: MMAModel | Mapping[str, Any]) -> tuple[Any, ...]:
    if isinstance(m, MMAModel):
        return tuple(getattr(m, f) for f in PARAMS[:6])
    return tuple(m[f] for f in PARAMS[:6])


@ieee_mode
def best_fit(a: np.ndarray, b: np.ndarray, c: np.ndarray, d: np.ndarray, input: FormatLike, output: FormatLike,
             *, candidates: Sequence[Mapping[str, Any]], floor_rows: np.ndarray | None = None,
             max_alternatives: int = 20) -> BestFit:
    """The candidate with the fewest wrong rows (rows as values; `c` already in `output`), then its ``mel``.

    Stage 1 scores every candidate (no exponent floor) on the rows outside `floor_rows` (a boolean mask of
    rows designed to read the floor); stage 2 scores the exponent floors of the chosen parameters on all rows.
    Ties prefer a parameter set some fpsim preset uses, then C inside without grouping, then the smallest
    ``|neab|``, then the largest ``k``.
    """
    fin, fout = as_format(input), as_format(output)
    main = np.ones(len(d), dtype=bool) if floor_rows is None else ~np.asarray(floor_rows, dtype=bool)
    presets = preset_models(fin, fout)
    preset_keys = {_key(m) for m in presets.values()}
    cands = [dict(cd) for cd in candidates]
    if main.any():
        s1 = mismatch_counts(a[main], b[main], c[main], d[main], fin, fout, cands)
    else:
        s1 = np.zeros(len(cands), dtype=np.int64)
    tied = [cands[i] for i in np.flatnonzero(s1 == s1.min())]

    def pref(cd: Mapping[str, Any]) -> tuple[int, int, int, int]:
        return (0 if _key(cd) in preset_keys else 1,
                0 if (cd["c_entry"], cd["grouping"]) == ("inside", "none") else 1, abs(cd["neab"]), -cd["k"])

    tied.sort(key=pref)
    chosen = tied[0]
    preset_mels = [m.mel for m in presets.values() if _key(m) == _key(chosen)]
    mel_opts: list[int | None] = [None] + sorted({fout.emin - dd for dd in range(13)}
                                                 | {m for m in preset_mels if m is not None})
    s2 = mismatch_counts(a, b, c, d, fin, fout, [{**chosen, "mel": m} for m in mel_opts])
    best = int(s2.min())
    mel_ok = tuple(m for sc, m in zip(s2, mel_opts) if sc == best)
    mel = next((m for m in preset_mels if m in mel_ok), None if None in mel_ok else mel_ok[0])
    matches = []
    for dev, m in presets.items():
        got = np.asarray(dot(a, b, c, m, input_rounding="exact"), dtype=np.float64)
        if _agree(got, d).all():
            matches.append(dev)
    return BestFit(params={**chosen, "mel": mel}, mismatches=best,
                   alternatives=tuple({**cd} for cd in tied[1:1 + max_alternatives]), mel_candidates=mel_ok,
                   matches=tuple(matches), mel_options=tuple(mel_opts))
