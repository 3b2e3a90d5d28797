"""Judging tensors: the targets (``FORMAT:SCALING``), each piece quantised through :mod:`fpsim.scaling`, the
counts (underflow, subnormal, overflow), SQNR and relative errors, the verdicts against :data:`THRESHOLDS`, one tensor
(:func:`audit_tensor`) and many small tensors in batches. Public names are re-exported by :mod:`fpsim.audit`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import scaling as S
from .._fpenv import ieee_mode
from .._names import norm_name, parse_name
from ..formats import Format, as_format, format_names
from ..rounding import round as _fround
from ..scaling._tensor import _presaturate
from ._safetensors import (DTYPES, TensorInfo, _CHUNK, _Mapped, _as_2d, _brief, _f8_table, _open_regular, _pieces,
                           list_tensors)


#: Scalings a target may name (``FORMAT:SCALING``); docs/audit.md describes each.
SCALINGS = ("none", "tensor", "channel", "block128", "block128x128", "mx32", "nvfp4")

#: Targets audited when none are given.
DEFAULT_TARGETS = ("fp8_e4m3:tensor", "fp8_e4m3:block128", "fp8_e4m3:mx32", "fp4_e2m1:mx32", "fp4_e2m1:nvfp4")

#: Verdict thresholds. A target's verdict for a tensor is ``"risk"`` if any ``risk_*`` limit is crossed,
#: else ``"warn"`` if any ``warn_*`` limit is, else ``"ok"``. SQNR limits are dB below the format's
#: rounding floor ``6.02 * p + 4.8`` dB (p: significand bits; about the SQNR of a well-scaled Gaussian).
THRESHOLDS: dict[str, float] = {
    "warn_underflow": 1e-2, "risk_underflow": 1e-1,
    "warn_overflow": 1e-4, "risk_overflow": 1e-2,
    "warn_sqnr_below_floor_db": 3.0, "risk_sqnr_below_floor_db": 10.0,
}

_GROUP = 2  # whole-row chunks quantised and counted in one go in pass 2 (sums still per chunk: same bits)
# --------------------------------------------------------------------------------------------------
# Targets


@ieee_mode
@dataclass(frozen=True)
class Target:
    """A cast to audit: element format and scaling recipe; ``name`` is ``"FORMAT:SCALING"``."""

    fmt: Format
    scaling: str

    @property
    def name(self) -> str:
        return f"{self.fmt.name}:{self.scaling}"

    @property
    def floor_db(self) -> float:
        """The format's rounding-floor SQNR ``6.02 * p + 4.8`` dB (see :data:`THRESHOLDS`)."""
        return 6.02 * self.fmt.p + 4.8


def _target_formats() -> list[str]:
    return [n for n in format_names() if as_format(n).signed and as_format(n).has_zero and as_format(n).max > 0
            and n != "e8m0"]


@ieee_mode
def parse_target(value: str | Target) -> Target:
    """Parse ``"FORMAT:SCALING"`` (the one name rule: case and surrounding space ignored; format aliases
    such as ``float8_e4m3fn`` accepted). ``ValueError`` lists the valid formats and scalings.

    ``nvfp4`` takes ``fp4_e2m1`` elements only.

    >>> parse_target(" FP8_E4M3 : Tensor ").name
    'fp8_e4m3:tensor'
    >>> parse_target("fp8_e4m3:mx")
    Traceback (most recent call last):
    ...
    ValueError: unknown target scaling 'mx' in 'fp8_e4m3:mx'; valid: none, tensor, channel, block128, block128x128, mx32, nvfp4 (targets are FORMAT:SCALING, e.g. fp8_e4m3:tensor)
    """
    if isinstance(value, Target):
        return value
    key = norm_name(value, "target")
    fmts = _target_formats()
    hint = "(targets are FORMAT:SCALING, e.g. fp8_e4m3:tensor)"
    if key.count(":") != 1:
        raise ValueError(f"target {value!r} is not FORMAT:SCALING; formats: {', '.join(fmts)}; "
                         f"scalings: {', '.join(SCALINGS)} {hint}")
    fpart, spart = (s.strip() for s in key.split(":"))
    try:
        fmt = as_format(fpart)
    except ValueError:
        raise ValueError(f"unknown target format {fpart!r} in {value!r}; valid: {', '.join(fmts)} {hint}") from None
    if fmt.name not in fmts:
        raise ValueError(f"format {fmt.name!r} cannot be a cast target; valid: {', '.join(fmts)} {hint}")
    try:
        sc = parse_name(spart, SCALINGS, "target scaling")
    except ValueError:
        raise ValueError(f"unknown target scaling {spart!r} in {value!r}; valid: {', '.join(SCALINGS)} {hint}") from None
    if sc == "nvfp4" and fmt.name != "fp4_e2m1":
        raise ValueError(f"target {value!r}: NVFP4 elements are fp4_e2m1 (use fp4_e2m1:nvfp4), got {fmt.name!r}")
    return Target(fmt, sc)


def _parse_targets(targets: Iterable[str | Target] | str | None) -> list[Target]:
    if targets is None:
        targets = DEFAULT_TARGETS
    if isinstance(targets, (str, Target)):
        targets = [targets]
    out: list[Target] = []
    for t in targets:
        parts = t.split(",") if isinstance(t, str) else [t]
        for part in parts:
            if isinstance(part, str) and not part.strip():
                continue
            tg = parse_target(part)
            if tg not in out:
                out.append(tg)
    if not out:
        raise ValueError(f"no target given; e.g. {', '.join(DEFAULT_TARGETS)}")
    return out


# --------------------------------------------------------------------------------------------------
# Quantise one piece for one target (all the math is fpsim.scaling's)


def _pad(x: np.ndarray, rows: int, cols: int) -> np.ndarray:
    r, c = x.shape
    if r % rows == 0 and c % cols == 0:
        return x
    out = np.zeros((r + (-r % rows), c + (-c % cols)), x.dtype)
    out[:r, :c] = x
    return out


def _quantize(tg: Target, x: np.ndarray, ctx: dict[str, Any], r0: int, r1: int) -> tuple[np.ndarray, np.ndarray]:
    """(elements in the target format's units, dequantised values), both of x's shape. Zero padding to
    whole blocks changes no block's amax and is cropped again."""
    f, sc = tg.fmt, tg.scaling
    if sc == "none":
        q = S.quantize(x, f, 1.0)
        return q, q
    if sc == "tensor":
        s = ctx["scale"]
        q = S.quantize(x, f, s)
        return q, S.dequantize(q, s)
    if sc == "channel":
        s = ctx["row_scale"][r0:r1]
        q = S.quantize(x, f, s, axis=0)
        return q, S.dequantize(q, s, axis=0)
    r, c = x.shape
    if sc in ("block128", "block128x128"):
        blk = (1, 128) if sc == "block128" else (128, 128)
        xp = _pad(x, blk[0], blk[1])
        q, s = S.scale_and_quantize(xp, f, block=blk)
        d = S.dequantize(q, s, block=blk)
        return q[:r, :c], d[:r, :c]
    if sc == "mx32":
        xp = _pad(x, 1, 32)
        q, s = S.mx_quantize(xp, f, block=32, axis=-1)
        # = S.mx_dequantize (float64 product, rounded to q's dtype): q * 2**k is exact in float64, so one
        # multiply in q's own dtype rounds the same exact product once, to the same value (NaN scales too)
        d = (q.reshape(q.shape[0], -1, 32) * s[:, :, None].astype(q.dtype)).reshape(q.shape)
        return q[:r, :c], d[:r, :c]
    # nvfp4
    xp = _pad(x, 1, 16)
    q, bs, g = S.nvfp4_quantize(xp, block=16, axis=-1, global_amax=ctx["gamax"])
    # = S.nvfp4_dequantize: its float32 scale bs * g, then q * scale exact in float64 (2-bit q times a
    # 24-bit scale) rounded once to q's dtype: one multiply in q's dtype rounds the same product the same way
    with np.errstate(over="ignore", invalid="ignore"):
        s = (np.asarray(bs, dtype=np.float32) * np.float32(g)).astype(np.float32)
        d = (q.reshape(q.shape[0], -1, 16) * s.reshape(q.shape[0], -1)[:, :, None].astype(q.dtype)).reshape(q.shape)
    return q[:r, :c], d[:r, :c]


def _overflow_rule(f: Format) -> tuple[float, bool]:
    """(T / max, whether a tie at T overflows): a value overflows when its scaled magnitude passes
    T = max + half an ulp at max, past which a cast rounding to nearest no longer gives max (IEEE 754:
    overflow to inf, or NaN in a format without infinity). At T itself ties go to even: up (overflow)
    when max's significand is odd (fp4_e2m1's 6 = 3 * 2, fp8_e5m2's 57344 = 7 * 2**13), down when even
    (fp8_e4m3's 448 = 14 * 2**5)."""
    _, e = np.frexp(f.max)  # max = m * 2**e, 0.5 <= m < 1: max's exponent is e - 1
    ulp = math.ldexp(1.0, int(e) - 1 - (f.p - 1))
    return (f.max + ulp / 2) / f.max, int(f.max / ulp) % 2 == 1


def _dot(v: np.ndarray, cuts: Sequence[int]) -> list[float]:
    """float64 sum of squares of each slice ``v[cuts[k]:cuts[k + 1]]`` (``numpy.einsum``: no BLAS, so the
    same bits whatever the thread settings; one sum per piece, the pieces' sums then added in order)."""
    return [float(np.einsum("i,i->", v[a:b], v[a:b], dtype=np.float64)) for a, b in zip(cuts[:-1], cuts[1:])]


def _scratch(bufs: dict[tuple[str, Any], np.ndarray], key: str, like: np.ndarray, dtype: Any = None) -> np.ndarray:
    """An uninitialised scratch array of ``like``'s shape (and dtype unless given) from ``bufs``, grown as needed."""
    k = (key, np.dtype(like.dtype if dtype is None else dtype))
    b = bufs.get(k)
    if b is None or b.size < like.size:
        b = bufs[k] = np.empty(like.size, k[1])
    return b[: like.size].reshape(like.shape)


class _Piece:
    """Target-independent facts about a group of consecutive pieces (flat ``cuts``: where each piece of
    the group starts and ends in ``x.reshape(-1)``), computed once for all targets."""

    def __init__(self, x: np.ndarray, cuts: Sequence[int] | None = None,
                 bufs: dict[tuple[str, Any], np.ndarray] | None = None) -> None:
        self.bufs = {} if bufs is None else bufs
        self.x = x.reshape(-1)
        self.cuts = list(cuts) if cuts is not None else [0, self.x.size]
        sx2 = _dot(self.x, self.cuts)  # each finite iff no inf/NaN in its piece (or an F64 square overflows)
        self.mask: np.ndarray | None = None
        self.xf = self.x
        if not all(math.isfinite(v) for v in sx2):  # float32 squares cannot overflow float64: inf or NaN in x
            self.mask = np.isfinite(self.x)
            self.xf = np.where(self.mask, self.x, 0).astype(x.dtype)
            sx2 = _dot(self.xf, self.cuts)  # pieces without inf/NaN: the same values, the same sums
        self.sx2 = sx2
        self.nonfinite = 0 if self.mask is None else int(self.x.size - np.count_nonzero(self.mask))
        self.zeros = int(np.count_nonzero(self.xf == 0)) - self.nonfinite  # xf holds 0 for each non-finite
        self.nz = self.x.size - self.zeros - self.nonfinite
        # denominators of the relative errors: 1 where x is 0 (there the error is 0 too: 0 casts to 0)
        self.den = self.xf if self.zeros + self.nonfinite == 0 else np.where(self.xf == 0, 1, self.xf).astype(x.dtype)

    def buf(self, key: str, dtype: Any) -> np.ndarray:
        """A flat scratch array of this group's size, reused from group to group (``bufs``: the tensor's)."""
        return _scratch(self.bufs, key, self.x, dtype)


class _Acc:
    """Sums for one target over one tensor, accumulated piece by piece in a fixed order (float64 sums,
    ``numpy.einsum`` loops: no BLAS, so the same bits whatever the process's thread settings)."""

    def __init__(self, tg: Target) -> None:
        self.tg = tg
        self.ratio, self.tie = _overflow_rule(tg.fmt)
        self.nz = self.under = self.sub = self.over = 0
        self.sx2 = self.se2 = self.srel2 = 0.0
        self.maxrel = 0.0

    def add(self, pc: _Piece, q: np.ndarray, d: np.ndarray) -> None:
        f = self.tg.fmt
        x, xf = pc.x, pc.xf
        q, d = q.reshape(-1), d.reshape(-1)
        # temporaries in buffers kept across pieces (fresh ones cost a page fault per 4 KiB, about a third
        # of the time); the same operations, so the same bits
        e, aq, b = pc.buf("e", xf.dtype), pc.buf("a", q.dtype), pc.buf("b", np.bool_)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            if pc.mask is not None:  # non-finite inputs take no part: their outputs are set to 0 (no error)
                q = np.where(pc.mask, q, 0).astype(q.dtype)
                d = np.where(pc.mask, d, 0).astype(d.dtype)
            np.subtract(d, xf, out=e)
            se2 = _dot(e, pc.cuts)
            np.abs(q, out=aq)
            qzero = int(np.count_nonzero(np.equal(aq, 0, out=b)))
            self.nz += pc.nz
            self.under += int(np.count_nonzero(np.equal(d, 0, out=b))) - pc.zeros
            self.sub += int(np.count_nonzero(np.less(aq, f.min_normal, out=b))) - qzero
            # NaN blocks (MX), inf: only in pieces whose error sum is not finite (elsewhere d is all finite)
            bad = None if all(math.isfinite(v) for v in se2) else ~np.isfinite(d)
            sat = np.flatnonzero(np.equal(aq, f.max, out=b))
            n_over = 0
            if sat.size:
                axs = np.abs(x[sat]).astype(np.float64)
                lim = np.abs(d[sat]).astype(np.float64) * self.ratio
                big = (axs >= lim) if self.tie else (axs > lim)
                if bad is not None:
                    big &= ~bad[sat]
                n_over += int(np.count_nonzero(big))
            if bad is not None:  # counted as overflow; the error sums cover the values that stay finite
                n_over += int(np.count_nonzero(bad))
                np.copyto(e, 0, where=bad)
                se2 = _dot(e, pc.cuts)
            self.over += n_over
            for v in pc.sx2:
                self.sx2 += v
            for v in se2:
                self.se2 += v
            rel = np.divide(e, pc.den, out=e) if e.dtype == np.result_type(e, pc.den) else e / pc.den
            for v in _dot(rel, pc.cuts):
                self.srel2 += v
            if rel.size:
                self.maxrel = max(self.maxrel, float(np.max(np.abs(rel, out=rel))))

    def result(self) -> dict[str, Any]:
        return _stats(self.tg, self.nz, self.under, self.sub, self.over, self.sx2, self.se2, self.srel2, self.maxrel)


def _stats(tg: Target, n: int, under: int, sub: int, over: int, sx2: float, se2: float, srel2: float,
           maxrel: float) -> dict[str, Any]:
    """One target's JSON statistics of one tensor from its counts and sums (:class:`_Acc`, :func:`_audit_batch`)."""
    if se2 == 0 or not math.isfinite(se2):
        sqnr = math.inf if se2 == 0 else -math.inf
    else:
        sqnr = 10.0 * math.log10(sx2 / se2) if sx2 > 0 else -math.inf
    r: dict[str, Any] = {
        "underflow": under / n if n else 0.0,
        "subnormal": sub / n if n else 0.0,
        "overflow": over / n if n else 0.0,
        "sqnr_db": sqnr,
        "max_rel_error": maxrel if math.isfinite(maxrel) else math.inf,
        "rms_rel_error": math.sqrt(srel2 / n) if n else 0.0,
        "nonzero": n,
    }
    r["verdict"], r["reasons"] = _verdict(tg, r)
    return r


def _verdict(tg: Target, r: Mapping[str, Any]) -> tuple[str, list[str]]:
    th = THRESHOLDS
    risk, warn = [], []
    for key, label in (("underflow", "underflow"), ("overflow", "overflow")):
        v = r[key]
        if v > th[f"risk_{key}"]:
            risk.append(f"{label} {v:.3g} > {th[f'risk_{key}']:g}")
        elif v > th[f"warn_{key}"]:
            warn.append(f"{label} {v:.3g} > {th[f'warn_{key}']:g}")
    s = r["sqnr_db"]
    fl = tg.floor_db
    if r["nonzero"] and s < fl - th["risk_sqnr_below_floor_db"]:
        risk.append(f"SQNR {s:.1f} dB < {fl - th['risk_sqnr_below_floor_db']:.1f} dB")
    elif r["nonzero"] and s < fl - th["warn_sqnr_below_floor_db"]:
        warn.append(f"SQNR {s:.1f} dB < {fl - th['warn_sqnr_below_floor_db']:.1f} dB")
    if risk:
        return "risk", risk + warn
    return ("warn", warn) if warn else ("ok", [])


# --------------------------------------------------------------------------------------------------
# One tensor


@ieee_mode
def audit_tensor(t: TensorInfo, targets: Sequence[str | Target] | None = None, *, chunk: int = _CHUNK) -> dict[str, Any]:
    """Audit one tensor of a checkpoint (what each Dask worker runs): map it, piece by piece, and return its
    JSON entry (``name``, ``dtype``, ``shape``, ``numel``, ``amax``, counts of NaN/inf/zero values, and
    ``targets``: target name -> statistics; docs/audit.md lists the keys).

    ``chunk`` bounds the elements handled at once (memory: a few dozen bytes per element of a chunk).
    Targets needing a whole-tensor quantity (``tensor``, ``channel``: amax per tensor / row; ``nvfp4``:
    the tensor amax) take it in a first pass over the pieces.

    Examples
    --------
    >>> import numpy as np, os, tempfile, fpsim.audit as A
    >>> p = A.save_safetensors({"w": np.float32([1.0, 2.0, 3.0])}, os.path.join(tempfile.mkdtemp(), "m.safetensors"))
    >>> e = A.audit_tensor(A.list_tensors(p)[0], ["fp8_e4m3:none"])
    >>> e["targets"]["fp8_e4m3:none"]["sqnr_db"]        # 1, 2, 3 are E4M3 values: no error at all
    inf
    """
    if not isinstance(t, TensorInfo):
        raise TypeError(f"t must be a TensorInfo (from list_tensors), got {type(t).__name__}")
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 128:
        raise ValueError(f"chunk must be an integer >= 128 (elements), got {chunk!r}")
    tgs = _parse_targets(targets)
    entry: dict[str, Any] = {"name": t.name, "file": os.path.basename(t.file), "dtype": t.dtype,
                             "shape": list(t.shape), "numel": t.numel, "bytes": t.nbytes}
    if t.dtype not in DTYPES:
        entry["skipped"] = f"dtype {t.dtype} is not audited (audited: {', '.join(DTYPES)})"
        return entry
    if t.numel == 0:  # nothing to read or allocate, whatever the nominal shape (e.g. [2**40, 0])
        entry.update({"amax": 0.0, "nan": 0, "inf": 0, "zeros": 0,
                      "targets": {g.name: _Acc(g).result() for g in tgs}})
        return entry
    fd = _open_regular(t.file, f"safetensors file {_brief(t.file, 400)}")
    try:
        entry.update(_audit_data(_Mapped(t, fd), tgs, chunk))
    finally:
        os.close(fd)
    return entry


def _audit_data(m: _Mapped, tgs: list[Target], chunk: int) -> dict[str, Any]:
    """The statistics of one tensor with at least one element (:func:`audit_tensor`'s two passes)."""
    t = m.t
    band = 128 if any(g.scaling == "block128x128" for g in tgs) else 1
    pieces = _pieces(m.R, m.C, band, chunk) if t.numel else []
    cached = m.read(*pieces[0]) if len(pieces) == 1 else None
    bufs: dict[tuple[str, Any], np.ndarray] = {}  # scratch arrays reused from piece to piece
    xbuf = np.empty(min(t.numel, _GROUP * chunk), np.float32) if t.dtype == "BF16" and cached is None else None
    zero = m.carrier(0)
    amax_p, amax_f = zero, zero  # NaN-propagating (as fpsim.scaling.amax) and NaN-skipping (as NVFP4's)
    rows = any(g.scaling == "channel" for g in tgs)
    row_amax = np.zeros(m.R if rows else 0, m.carrier)  # only when needed: R can be as large as the tensor
    if any(g.scaling in ("tensor", "channel", "nvfp4") for g in tgs):  # pass 1: whole-tensor amaxes
        for pc in pieces:
            x = cached if cached is not None else m.read(*pc, out=xbuf)
            if x.size == 0:
                continue
            ax = np.abs(x, out=_scratch(bufs, "a", x))
            amax_p = np.maximum(amax_p, ax.max())
            amax_f = np.fmax(amax_f, np.fmax.reduce(ax, axis=None))
            if rows:
                row_amax[pc[0]:pc[1]] = np.maximum(row_amax[pc[0]:pc[1]], ax.max(axis=1))
    gamax = float(np.float32(amax_f)) if np.isfinite(amax_f) else 0.0
    ctxs: list[dict[str, Any]] = []
    for g in tgs:
        if g.scaling == "tensor":
            ctxs.append({"scale": S.compute_scale(m.carrier(amax_p), g.fmt)})
        elif g.scaling == "channel":
            ctxs.append({"row_scale": S.compute_scale(row_amax, g.fmt)})
        else:
            ctxs.append({"gamax": gamax})
    accs = [_Acc(g) for g in tgs]
    nan = inf = zeros = 0
    amax = 0.0
    for grp in _groups(pieces, _GROUP * chunk):  # pass 2: quantise and count, a group of pieces at once
        pc = (grp[0][0], grp[-1][1], grp[0][2], grp[0][3])
        x = cached if cached is not None else m.read(*pc, out=xbuf)
        if x.size == 0:
            continue
        w = pc[3] - pc[2]
        piece = _Piece(x, [(p[0] - pc[0]) * w for p in grp] + [x.size], bufs)
        zeros += piece.zeros
        if piece.nonfinite:
            n_nan = int(np.count_nonzero(np.isnan(piece.x)))
            nan += n_nan
            inf += piece.nonfinite - n_nan
        amax = max(amax, float(np.max(np.abs(piece.xf))))
        for g, acc, c in zip(tgs, accs, ctxs):
            q, d = _quantize(g, x, c, pc[0], pc[1])
            acc.add(piece, q, d)
    return {"amax": amax, "nan": nan, "inf": inf, "zeros": zeros,
            "targets": {g.name: acc.result() for g, acc in zip(tgs, accs)}}


def _groups(pieces: list[tuple[int, int, int, int]], limit: int) -> list[list[tuple[int, int, int, int]]]:
    """Consecutive whole-width row bands joined into groups of at most ``limit`` elements (a piece cut
    into columns stays alone). Every quantity of a group is elementwise or per block (blocks never cross
    a piece), and every float sum is still taken piece by piece (:func:`_dot`): the same bits as one piece
    at a time, with a fraction of the calls."""
    out: list[list[tuple[int, int, int, int]]] = []
    for pc in pieces:
        last = out[-1][-1] if out else None
        if last is not None and pc[2] == 0 == last[2] and pc[3] == last[3] and pc[0] == last[1] \
                and (pc[1] - out[-1][0][0]) * pc[3] <= limit:
            out[-1].append(pc)
        else:
            out.append([pc])
    return out


# --------------------------------------------------------------------------------------------------
# Many small tensors at once
#
# A checkpoint may hold thousands of tiny tensors (biases, norms, scales; a hostile header millions): one
# at a time, each paid ~6 ms of per-call overhead (parsing, quantiser set-up, dozens of NumPy calls on a
# handful of elements). Tensors of at most _SMALL elements (one piece each in audit_tensor) are instead
# audited in batches: their rows stacked, zero-padded, into one matrix per (file, dtype, padded width);
# each target quantised once for the whole batch with per-row scales (every scaling but 128x128 blocks
# works row by row: per-tensor and per-row scales are elementwise, 1x128 / 1x32 / 1x16 blocks never cross
# a row); the counts and maxima reduced per tensor with ufunc.reduceat, and every float sum still taken
# with numpy.einsum over each tensor's own elements. The same operations on the same values: reports
# identical, bit for bit, to audit_tensor's (tests/test_hardening_audit.py checks it).

_SMALL = 4096  # elements: tensors up to this size (and up to ``chunk``) are batched
_BATCH_ELEMS = 1 << 17  # padded elements per batch (the working set of a chunk)
_BATCH_TENSORS = 4096


def _batchable(t: TensorInfo, tgs: Sequence[Target], chunk: int) -> bool:
    return (t.dtype in DTYPES and 0 < t.numel <= min(_SMALL, chunk)
            and not any(g.scaling == "block128x128" for g in tgs))


def _batches(infos: Sequence[TensorInfo], idx: Sequence[int]) -> list[list[int]]:
    """Indices of batchable tensors grouped by (file, dtype, padded row width), in checkpoint order."""
    groups: dict[tuple[str, str, int], list[list[int]]] = {}
    nrows: dict[tuple[str, str, int], int] = {}  # rows in the group's last batch
    for i in idx:
        t = infos[i]
        r, c = _as_2d(t.shape)
        w = -(-c // 128) * 128
        key = (t.file, t.dtype, w)
        bs = groups.setdefault(key, [[]])
        if bs[-1] and (len(bs[-1]) >= _BATCH_TENSORS or (nrows[key] + r) * w > _BATCH_ELEMS):
            bs.append([])
        if not bs[-1]:
            nrows[key] = 0
        bs[-1].append(i)
        nrows[key] += r
    return [b for bs in groups.values() for b in bs]


def _nvfp4_rows(p: np.ndarray, gam: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`fpsim.scaling.nvfp4_quantize` (blocks of 16 along rows, round to nearest even) of every row
    of ``p`` with its own tensor amax ``gam`` (float32, one per row): the same float32 operations, the
    per-tensor scalars s_enc and s_dec made per-row arrays. Returns (elements, dequantised values)."""
    fp4, fp8 = as_format("fp4_e2m1"), as_format("fp8_e4m3")
    f32, fmax = np.float32, np.float32(np.finfo(np.float32).max)
    with np.errstate(over="ignore"):
        a32 = p.astype(f32, copy=False)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        s_enc = np.minimum((f32(fp8.max * fp4.max) / gam).astype(f32), fmax).astype(f32)
        s_enc = np.where(s_enc == 0, f32(1.0), s_enc).astype(f32)
        s_dec = (f32(1.0) / s_enc).astype(f32)
        mult = (s_enc * f32(1.0 / fp4.max)).astype(f32)
        bam = np.asarray(S.amax(a32, block=(1, 16)), dtype=f32)
        d32 = np.minimum((bam * mult[:, None]).astype(f32), fmax)
        d32 = np.clip(d32, -fp8.max, fp8.max).astype(f32)
        d = np.asarray(_fround(d32, fp8, "rne", overflow="saturate"), dtype=f32)
        enc = np.minimum((f32(1.0) / (d * s_dec[:, None]).astype(f32)).astype(f32), fmax).astype(f32)
        scaled = (a32.reshape(a32.shape[0], -1, 16) * enc[:, :, None]).reshape(a32.shape).astype(f32, copy=False)
    _presaturate(scaled, fp4)
    q = np.asarray(_fround(scaled, fp4, "rne", overflow="saturate")).astype(p.dtype, copy=False)
    with np.errstate(over="ignore", invalid="ignore"):  # as _quantize: float32 decode scale, one multiply
        s = (d * s_dec[:, None]).astype(f32)
        dq = (q.reshape(q.shape[0], -1, 16) * s[:, :, None].astype(q.dtype)).reshape(q.shape)
    return q, dq


def _segdot(v: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> list[float]:
    """:func:`_dot` of each tensor's own elements ``v[starts[k]:ends[k]]``: the same einsum call, except
    for tensors of one or two elements, whose einsum sum of float64 squares is ``p0`` or ``p0 + p1`` in any
    summation order (adding the zeros of unused SIMD lanes is exact, the squares are >= +0 or NaN), so
    they are summed here all at once (one einsum call costs ~7 us, most of a tiny tensor's audit)."""
    lens = ends - starts
    out: list[float] = [0.0] * len(starts)
    tiny = np.flatnonzero(lens <= 2)
    if tiny.size:
        a0 = v[starts[tiny]].astype(np.float64)
        sq = a0 * a0
        two = lens[tiny] == 2
        if two.any():
            a1 = v[np.where(two, starts[tiny] + 1, starts[tiny])].astype(np.float64)
            sq = np.where(two, sq + a1 * a1, sq)
        for k, val in zip(tiny.tolist(), sq.tolist()):
            out[k] = val
    for k in np.flatnonzero(lens > 2).tolist():
        a, b = int(starts[k]), int(ends[k])
        out[k] = float(np.einsum("i,i->", v[a:b], v[a:b], dtype=np.float64))
    return out


@ieee_mode
def _audit_batch(ts: Sequence[TensorInfo], tgs: Sequence[Target], fd: int | None = None) -> list[dict[str, Any]]:
    """:func:`audit_tensor`'s entries for small tensors of one file and dtype, computed together."""
    t0 = ts[0]
    K = len(ts)
    shapes = [_as_2d(t.shape) for t in ts]
    R = np.array([r for r, _ in shapes], np.int64)
    C = np.array([c for _, c in shapes], np.int64)
    n = R * C
    W = int(-(-int(C.max()) // 128) * 128)
    starts = np.zeros(K, np.int64)
    np.cumsum(n[:-1], out=starts[1:])
    ends = starts + n
    N = int(n.sum())
    rstart = np.zeros(K, np.int64)
    np.cumsum(R[:-1], out=rstart[1:])
    rows = int(R.sum())
    # read and decode every tensor into one flat array (tensor after tensor, each in C order)
    h = _open_regular(t0.file, f"safetensors file {_brief(t0.file, 400)}") if fd is None else fd
    try:
        m0 = _Mapped(t0, h)
        raw = np.empty(N, m0.dt)
        for t, a, b in zip(ts, starts.tolist(), ends.tolist()):
            _Mapped(t, h)._pread(h, raw[a:b], t.offset)
    finally:
        if fd is None:
            os.close(h)
    if t0.dtype.startswith("F8"):
        x = _f8_table(t0.dtype)[raw]
    elif t0.dtype == "BF16":
        x = np.left_shift(raw, 16, dtype=np.uint32).view(np.float32)
    else:
        x = raw.astype(m0.carrier)
    carrier = m0.carrier
    tid = np.repeat(np.arange(K), n)
    li = np.arange(N) - starts[tid]
    ce = C[tid]
    prow = rstart[tid] + li // ce
    pcol = li % ce
    rtid = np.repeat(np.arange(K), R)
    rowstarts = starts[rtid] + (np.arange(rows) - rstart[rtid]) * C[rtid]  # where each row starts in x
    zero = carrier(0)
    # pass 1: whole-tensor amaxes, as audit_tensor (NaN-propagating and NaN-skipping), and per row
    ax = np.abs(x)
    amax_p = np.maximum(zero, np.maximum.reduceat(ax, starts))
    amax_f = np.fmax(zero, np.fmax.reduceat(ax, starts))
    with np.errstate(over="ignore"):
        gam = np.where(np.isfinite(amax_f), amax_f.astype(np.float32), np.float32(0)).astype(np.float32)
    row_amax = np.maximum(zero, np.maximum.reduceat(ax, rowstarts)) if any(g.scaling == "channel" for g in tgs) \
        else None
    p = np.zeros((rows, W), carrier)
    p[prow, pcol] = x
    # target-independent facts (_Piece), per tensor
    sx2 = _segdot(x, starts, ends)
    fin = np.isfinite(x)
    masked = [not math.isfinite(v) for v in sx2]
    if any(masked):
        xf = np.where(fin, x, 0).astype(x.dtype)
        sx2 = [s2 if not mk else v for s2, mk, v in zip(sx2, masked, _segdot(xf, starts, ends))]
    else:
        xf = x
    nonfin = np.add.reduceat(~fin, starts, dtype=np.int64)
    xzero = xf == 0
    zeros = np.add.reduceat(xzero, starts, dtype=np.int64) - nonfin
    nz = n - zeros - nonfin
    den = xf if not xzero.any() else np.where(xzero, 1, xf).astype(x.dtype)
    nans = np.add.reduceat(np.isnan(x), starts, dtype=np.int64) if nonfin.any() else nonfin
    amax = np.maximum.reduceat(np.abs(xf), starts)
    res: list[dict[str, Any]] = [{} for _ in range(K)]
    for g in tgs:
        f, sc = g.fmt, g.scaling
        if sc == "none":
            q = S.quantize(p, f, 1.0)
            d = q
        elif sc in ("tensor", "channel"):
            s = S.compute_scale(amax_p, f)[rtid] if sc == "tensor" else S.compute_scale(row_amax, f)
            q = S.quantize(p, f, s, axis=0)
            d = S.dequantize(q, s, axis=0)
        elif sc == "block128":
            q, s = S.scale_and_quantize(p, f, block=(1, 128))
            d = S.dequantize(q, s, block=(1, 128))
        elif sc == "mx32":
            q, s = S.mx_quantize(p, f, block=32, axis=-1)
            d = (q.reshape(q.shape[0], -1, 32) * s[:, :, None].astype(q.dtype)).reshape(q.shape)
        else:  # nvfp4
            q, d = _nvfp4_rows(p, gam[rtid])
        q, d = q[prow, pcol], d[prow, pcol]  # back to each tensor's own elements, tensor after tensor
        ratio, tie = _overflow_rule(f)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            if any(masked):
                q = np.where(fin, q, 0).astype(q.dtype)
                d = np.where(fin, d, 0).astype(d.dtype)
            e = d - xf
            se2 = _segdot(e, starts, ends)
            aq = np.abs(q)
            qzero = np.add.reduceat(aq == 0, starts, dtype=np.int64)
            under = np.add.reduceat(d == 0, starts, dtype=np.int64) - zeros
            sub = np.add.reduceat(aq < f.min_normal, starts, dtype=np.int64) - qzero
            badt = [k for k, v in enumerate(se2) if not math.isfinite(v)]
            bad = np.zeros(N, bool)
            for k in badt:
                a, b = int(starts[k]), int(ends[k])
                bad[a:b] = ~np.isfinite(d[a:b])
            sat = np.flatnonzero(aq == f.max)
            over = np.zeros(K, np.int64)
            if sat.size:
                axs = np.abs(x[sat]).astype(np.float64)
                lim = np.abs(d[sat]).astype(np.float64) * ratio
                big = (axs >= lim) if tie else (axs > lim)
                if badt:
                    big &= ~bad[sat]
                over += np.bincount(tid[sat][big], minlength=K)
            if badt:
                over += np.add.reduceat(bad, starts, dtype=np.int64)
                np.copyto(e, 0, where=bad)
                se2b = _segdot(e, starts, ends)
                for k in badt:
                    se2[k] = se2b[k]
            rel = np.divide(e, den, out=e) if e.dtype == np.result_type(e, den) else e / den
            srel2 = _segdot(rel, starts, ends)
            mrel = np.maximum.reduceat(np.abs(rel, out=rel), starts).tolist()
        for k in range(K):
            res[k][g.name] = _stats(g, int(nz[k]), int(under[k]), int(sub[k]), int(over[k]), 0.0 + sx2[k],
                                    0.0 + se2[k], 0.0 + srel2[k], max(0.0, float(mrel[k])))
    out = []
    amaxl, nanl, nonl, zl = amax.tolist(), nans.tolist(), nonfin.tolist(), zeros.tolist()
    for k, t in enumerate(ts):
        out.append({"name": t.name, "file": os.path.basename(t.file), "dtype": t.dtype, "shape": list(t.shape),
                    "numel": t.numel, "bytes": t.nbytes, "amax": max(0.0, float(amaxl[k])), "nan": int(nanl[k]),
                    "inf": int(nonl[k] - nanl[k]), "zeros": int(zl[k]), "targets": res[k]})
    return out


