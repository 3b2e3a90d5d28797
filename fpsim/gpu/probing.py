"""Identify a GPU's matrix-unit arithmetic from probe vectors, and fit the block-FMA parameters.

:func:`probe_suite` lists the probe vectors for one ``mma.sync`` path (input -> output format): the reference
probes P1-P24 (``tensorcore.md`` section 6) where their values exist in the formats, their sign variants,
the P20 block-size detector generalised to other grid widths (``K<m>.<j>``), alignment-width families
(``AL<m>.<t>``: 2^(t-m) terms of 2^-t added to 1; ``TB.<t>``/``TBG.<t>``: one tiny term beside a leading
one), rounding ties of both signs (``RT<m>.<f><sign>``), exponent-floor families (``ML.<e>.<d>``,
``MLH.<e>``: a leading product 2^e with a tiny one, near the bottom of the output range), and seeded random
rows (``R.<i>``). :func:`fit_parameters` takes the outputs a device gave for them (a pure
function, tested on recorded and model-made outputs) and returns the block-FMA parameters that reproduce
every output, with the fpsim presets that match and human-readable detector readings. :func:`probe` runs the
suite on the present GPU and fits every path it supports.

The fitting machinery lives in :mod:`fpsim.testing` (``fpsim.testing._identify``): the probes are rows like any
others there, and :func:`fpsim.testing.identify_accumulator` takes any measured rows. The fit enumerates
candidate models (block size k dividing the instruction's K, extra alignment bits neab in [-12, 4], RZ/RNE block
rounding, kept fraction bits mb, C inside or added late, mod-4 grouping) on every probe but the exponent-floor
ones, keeps those that reproduce the most outputs, and then fits the exponent floor mel on all probes. Rounding
toward +-infinity or ties away cannot be expressed by :class:`fpsim.mma.MMAModel`; the detectors report them anyway.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._fpenv import ieee_mode
from ..bits import from_bits, to_bits
from ..formats import Format, as_format, fp32
from ..mma import MMAModel, dot
from ..rounding import round as fpround
from ..testing._identify import best_fit, fit_candidates
from ._probes import Probe, p, probe_suite
from .fragments import PATHS, MMAInstruction, decode_d, instruction_for
from .mma_check import gpu_runner, probe_tiles, run_tiles

__all__ = [
    "FittedModel",
    "Probe",
    "ProbeOutputs",
    "ProbeResult",
    "evaluate_probes",
    "fit_parameters",
    "model_outputs",
    "probe",
    "probe_suite",
]

# ---------------------------------------------------------------------------------------------------------
# Observed outputs
# ---------------------------------------------------------------------------------------------------------

def _code(v: float, fmt: Format) -> int:
    if fmt == fp32:
        with np.errstate(over="ignore"):
            return int(np.float32(v).view(np.uint32))
    return int(to_bits(float(v), fmt))


def _value(code: int, fmt: Format) -> float:
    if fmt == fp32:
        return float(np.uint32(code).view(np.float32))
    return float(from_bits(code, fmt))


@ieee_mode
@dataclass(frozen=True)
class ProbeOutputs:
    """What one device returned for the probes of one path: ``values[probe id] = D`` (a float).

    Only the ids present are used by :func:`fit_parameters`, so a partial set (e.g. a published table) works.
    `seed` and `random_rows` must be those of the :func:`probe_suite` that produced the ``R.*`` ids.
    """

    input: str
    output: str
    values: Mapping[str, float]
    device: str = ""
    seed: int = 0
    random_rows: int = 48
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        fo = instruction_for(self.input, self.output).output
        digits = 8 if fo == fp32 else 4
        return {"input": self.input, "output": self.output, "device": self.device, "seed": self.seed,
                "random_rows": self.random_rows, "note": self.note,
                "values": {k: f"{_code(v, fo):0{digits}x}" for k, v in self.values.items()}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ProbeOutputs:
        """Inverse of :meth:`to_dict` (values as hex codes of the output format, or as numbers)."""
        fo = instruction_for(d["input"], d["output"]).output
        vals = {k: (_value(int(v, 16), fo) if isinstance(v, str) else float(v)) for k, v in d["values"].items()}
        return cls(input=str(d["input"]), output=str(d["output"]), values=vals, device=str(d.get("device", "")),
                   seed=int(d.get("seed", 0)), random_rows=int(d.get("random_rows", 48)), note=str(d.get("note", "")))


def _padded(probes: Sequence[Probe], K: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A, B (zero-padded to K terms; a probe has at most K) and C of the probes, as float64 rows."""
    a = np.zeros((len(probes), K))
    b = np.zeros((len(probes), K))
    for i, q in enumerate(probes):  # a few hundred short probes: building the rows is not a data path
        a[i, : len(q.a)] = q.a
        b[i, : len(q.b)] = q.b
    return a, b, np.array([q.c for q in probes], dtype=np.float64)


@ieee_mode
def evaluate_probes(probes: Sequence[Probe], model: MMAModel, K: int) -> np.ndarray:
    """D of every probe under `model` (float64), each zero-padded to K terms."""
    a, b, c = _padded(probes, K)
    return np.atleast_1d(np.asarray(dot(a, b, c, model), dtype=np.float64))


@ieee_mode
def model_outputs(model: MMAModel, *, random_rows: int = 48, seed: int = 0, device: str = "") -> ProbeOutputs:
    """The :class:`ProbeOutputs` `model` predicts for its path (what a device following it would return)."""
    ins = instruction_for(model.input, model.output)
    suite = probe_suite(ins.input, ins.output, random_rows=random_rows, seed=seed)
    d = evaluate_probes(suite, model, ins.k)
    return ProbeOutputs(ins.input.name, ins.output.name, {q.id: float(v) for q, v in zip(suite, d)},
                        device=device or model.name, seed=seed, random_rows=random_rows, note="model prediction")


# ---------------------------------------------------------------------------------------------------------
# Fitting
# ---------------------------------------------------------------------------------------------------------

_PARAMS = ("k", "neab", "rounding", "mb", "c_entry", "grouping")


@ieee_mode
@dataclass(frozen=True)
class FittedModel:
    """Block-FMA parameters fitted to a device's probe outputs for one path.

    ``exact`` is True when the fitted model reproduces every observed output (``mismatches`` == 0);
    ``alternatives`` lists other parameter sets that fit as well (the probes could not tell them apart);
    ``mel_candidates`` the exponent floors consistent with the data (None = no floor); ``matches`` the fpsim
    device presets that reproduce every output; ``detectors`` direct readings of individual probe families.
    """

    input: str
    output: str
    k: int
    neab: int
    rounding: str
    mb: int
    mel: int | None
    c_entry: str
    grouping: str
    exact: bool
    mismatches: int
    n_probes: int
    alternatives: tuple[dict[str, Any], ...] = ()
    mel_candidates: tuple[int | None, ...] = ()
    matches: tuple[str, ...] = ()
    detectors: Mapping[str, str] = field(default_factory=dict)
    device: str = ""

    @property
    def model(self) -> MMAModel:
        """The fitted parameters as an :class:`fpsim.mma.MMAModel`."""
        return MMAModel(name=f"fitted {self.device or 'device'} {self.input}->{self.output}", kind="bfma",
                        input=as_format(self.input), output=as_format(self.output), k=self.k, neab=self.neab, mel=self.mel,
                        rounding=self.rounding, mb=self.mb, c_entry=self.c_entry, grouping=self.grouping,
                        source="fpsim.gpu.fit_parameters", confidence="fitted to probe outputs")

    def params(self) -> dict[str, Any]:
        return {"k": self.k, "neab": self.neab, "rounding": self.rounding, "mb": self.mb, "mel": self.mel,
                "c_entry": self.c_entry, "grouping": self.grouping}

    def summary(self) -> str:
        head = (f"{self.input}->{self.output}: k={self.k} neab={self.neab} ({23 + self.neab} grid bits) "
                f"{self.rounding.upper()} mb={self.mb} mel={self.mel} C {self.c_entry}"
                + (f" grouping {self.grouping}" if self.grouping != "none" else ""))
        fit = ("reproduces all" if self.exact else f"best fit, {self.mismatches} of") + f" {self.n_probes} probes"
        pres = f"matches preset(s): {', '.join(self.matches)}" if self.matches else "matches no fpsim preset"
        amb = f"; {len(self.alternatives)} other parameter set(s) fit equally" if self.alternatives else ""
        return f"{head} [{fit}; {pres}{amb}]"

    def to_dict(self) -> dict[str, Any]:
        return {"input": self.input, "output": self.output, **self.params(), "exact": self.exact,
                "mismatches": self.mismatches, "n_probes": self.n_probes, "alternatives": list(self.alternatives),
                "mel_candidates": list(self.mel_candidates), "matches": list(self.matches),
                "detectors": dict(self.detectors), "device": self.device}


def _detectors(obs: Mapping[str, float], fout: Format, K: int, mb: int) -> dict[str, str]:
    """Direct readings of the probe families (independent of the enumeration)."""
    det: dict[str, str] = {}
    # Block size from the k detectors: the tiny term is kept (sum 2 + 2^(1-m)) while j < k.
    for fam, m in (("P20", 23), ("K23", 23), ("K13", 13), ("K10", 10)):
        js = [j for j in range(1, K) if f"{fam}.{j}" in obs]
        if not js:
            continue
        kept = [obs[f"{fam}.{j}"] == 2 + p(1 - m) for j in js]
        if kept[0] and not all(kept):
            first_lost = js[kept.index(False)]
            if all(kept[: kept.index(False)]) and not any(kept[kept.index(False):]):
                det["k"] = f"{fam}: tiny term kept for j < {first_lost}, lost after -> k = {first_lost}"
                break
        elif all(kept):
            det["k"] = f"{fam}: tiny term kept for every j < {K} -> k = {K} (one block per instruction)"
            break
    # Alignment width: largest t with 2^(t-m) terms of 2^-t all surviving.
    for m in (23, 13, 10):
        ts = sorted(int(key.split(".")[1]) for key in obs if key.startswith(f"AL{m}.") and not key.endswith("-"))
        if not ts:
            continue
        kept_t = [t for t in ts if obs[f"AL{m}.{t}"] == 1 + p(-m)]
        if kept_t and kept_t == ts[: len(kept_t)]:
            more = "" if len(kept_t) < len(ts) else " or more"
            det["alignment"] = (f"AL{m}: terms down to 2^-{kept_t[-1]} below the leading exponent survive -> "
                                f"{kept_t[-1]}{more} grid bits (neab = {kept_t[-1] - 23}{'+' if more else ''})")
            break
    tb = sorted(int(key[3:-1]) for key in obs if key.startswith("TB.") and key.endswith("-"))
    if tb:
        kept_rz = [t for t in tb if obs[f"TB.{t}-"] < 2]
        kept_rn = [t for t in tb if obs.get(f"TB.{t}+", 0.0) > 2 + p(-fout.mbits)]
        kept_tb = kept_rz if len(kept_rz) >= len(kept_rn) else kept_rn
        if kept_tb and kept_tb == tb[: len(kept_tb)] and len(kept_tb) < len(tb):
            g = kept_tb[-1]
            det["grid"] = (f"TB: a lone term 2^-{g} below the leading exponent survives, 2^-{g + 1} "
                           f"does not -> {g} grid bits (neab = {g - 23})")
    # Rounding from ties of both signs (quanta of the result at exponent 1 with m fraction bits).
    modes = {"rz": (1, 2, -1, -2), "rne": (2, 2, -2, -2), "rna": (2, 3, -2, -3), "rup": (2, 3, -1, -2),
             "rdn": (1, 2, -2, -3)}
    for m in (mb, 23, 13, 10):
        ids = [f"RT{m}.3+", f"RT{m}.5+", f"RT{m}.3-", f"RT{m}.5-"]
        if all(i in obs for i in ids):
            q = p(1 - m)
            got = tuple(round((abs(obs[i]) - 2) / q) * (1 if obs[i] > 0 else -1) for i in ids)
            name = next((k for k, v in modes.items() if v == got), None)
            det["rounding"] = (f"RT{m} ties +1.5/+2.5/-1.5/-2.5 quanta -> {got}: "
                               + (name.upper() if name else "no standard mode"))
            break
    if "P21" in obs:
        late = obs["P21"] == 1 + p(-21) + p(-23)
        det["normalisation"] = ("P21: late normalisation (block summed exactly, normalised once)" if late
                                else "P21: normalised between terms (result 1+2^-21 family)")
    if "P12a" in obs and "P12b" in obs:
        det["monotonic_in_c"] = ("P12: result falls as c rises (not monotonic)" if obs["P12b"] < obs["P12a"]
                                 else "P12: monotonic on this probe")
    if "P9" in obs:
        det["carry"] = "P9: third carry bit kept" if obs["P9"] == 8 else f"P9: carry lost (got {obs['P9']!r})"
    if "P14" in obs:
        det["subnormal_inputs"] = ("P14: subnormal input used" if obs["P14"] == p(-22)
                                   else f"P14: subnormal input flushed (got {obs['P14']!r})")
    if "P16a" in obs:
        det["subnormal_outputs"] = ("P16: subnormal outputs kept" if obs["P16a"] == p(-126) and obs.get("P16b") == p(-127)
                                    else "P16: subnormal outputs flushed or altered")
    return det


@ieee_mode
def fit_parameters(probe_outputs: ProbeOutputs | Mapping[str, Any], *, max_alternatives: int = 20) -> FittedModel:
    """Fit block-FMA parameters to observed probe outputs (pure; no GPU needed).

    Parameters
    ----------
    probe_outputs : ProbeOutputs or dict
        The device's D for some or all probe ids of :func:`probe_suite` (a dict as made by
        :meth:`ProbeOutputs.to_dict` is accepted).

    Returns
    -------
    FittedModel
        Preference among equally good fits: a parameter set some fpsim preset uses, then C inside without
        grouping, then the smallest ``|neab|``.

    Examples
    --------
    >>> from fpsim.mma import get_model
    >>> fit = fit_parameters(model_outputs(get_model("a100", "fp16"), random_rows=8))
    >>> (fit.k, fit.neab, fit.rounding, fit.exact, "a100" in fit.matches)
    (8, 1, 'rz', True, True)
    """
    po = probe_outputs if isinstance(probe_outputs, ProbeOutputs) else ProbeOutputs.from_dict(probe_outputs)
    ins = instruction_for(po.input, po.output)
    fin, fout, K = ins.input, ins.output, ins.k
    suite = {q.id: q for q in probe_suite(fin, fout, random_rows=po.random_rows, seed=po.seed)}
    unknown = sorted(set(po.values) - set(suite))
    if unknown:
        raise ValueError(f"unknown probe id(s) for {fin.name}->{fout.name}: {', '.join(unknown[:10])}; valid ids "
                         "come from fpsim.gpu.probe_suite")
    if not po.values:
        raise ValueError("probe_outputs holds no values")
    ids = sorted(po.values)
    # The designed probes are rows like any others (fpsim.testing's fitting machinery does the rest); the
    # exponent-floor probes (ML*) only take part in fitting mel.
    a, b, c = _probe_rows([suite[i] for i in ids], fin, fout, K)
    obs = np.array([po.values[i] for i in ids], dtype=np.float64)
    fit = best_fit(a, b, c, obs, fin, fout, candidates=fit_candidates(fout, K),
                   floor_rows=np.array([i.startswith("ML") for i in ids]), max_alternatives=max_alternatives)
    chosen = {f: fit.params[f] for f in _PARAMS}
    det = _detectors(po.values, fout, K, chosen["mb"])
    mel_ok = fit.mel_candidates
    if len(mel_ok) == 1:
        det["mel"] = f"ML probes: exponent floor mel = {mel_ok[0]}"
    elif len(mel_ok) < len(fit.mel_options):
        det["mel"] = f"ML probes: exponent floor one of {', '.join(str(m) for m in mel_ok)}"
    else:
        det["mel"] = "exponent floor not visible to these probes"
    return FittedModel(input=fin.name, output=fout.name, mel=fit.params["mel"], exact=fit.mismatches == 0,
                       mismatches=fit.mismatches, n_probes=len(ids), alternatives=fit.alternatives,
                       mel_candidates=mel_ok, matches=fit.matches, detectors=det, device=po.device, **chosen)


def _probe_rows(probes: Sequence[Probe], fin: Format, fout: Format, K: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The probes as rows of K terms (zero-padded), inputs and C converted as fpsim.mma.dot converts them."""
    a, b, c = _padded(probes, K)
    mode = "rtz" if fin.name == "tf32" else "rne"
    with np.errstate(over="ignore", invalid="ignore"):
        a = np.asarray(fpround(a, fin, mode), dtype=np.float64)
        b = np.asarray(fpround(b, fin, mode), dtype=np.float64)
        c = (c.astype(np.float32).astype(np.float64) if fout == fp32
             else np.asarray(fpround(c, fout, "rne"), dtype=np.float64))
    return a, b, c


# ---------------------------------------------------------------------------------------------------------
# Running on a GPU
# ---------------------------------------------------------------------------------------------------------

@ieee_mode
@dataclass(frozen=True)
class ProbeResult:
    """:func:`probe`'s answer: the device, the fitted model and raw outputs per path, and skipped paths."""

    device: str
    compute_capability: str
    fits: tuple[FittedModel, ...]
    outputs: tuple[ProbeOutputs, ...]
    skipped: tuple[tuple[str, str], ...] = ()

    def summary(self) -> str:
        lines = [f"{self.device} (compute capability {self.compute_capability})"]
        lines += [f"  {f.summary()}" for f in self.fits]
        lines += [f"  {path}: skipped ({why})" for path, why in self.skipped]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "compute_capability": self.compute_capability,
                "fits": [f.to_dict() for f in self.fits], "outputs": [o.to_dict() for o in self.outputs],
                "skipped": [list(s) for s in self.skipped]}


def run_probes(ins: MMAInstruction, runner: Callable[..., np.ndarray], *, random_rows: int = 48, seed: int = 0,
               device: str = "") -> ProbeOutputs:
    """Run the probe suite of one path through `runner` (GPU or emulation) and collect D per probe id."""
    suite = probe_suite(ins.input, ins.output, random_rows=random_rows, seed=seed)
    a, b, c = probe_tiles(ins, suite)
    d = decode_d(run_tiles(a, b, c, ins, runner), ins)[:, 0, 0]
    return ProbeOutputs(ins.input.name, ins.output.name, {q.id: float(v) for q, v in zip(suite, d)},
                        device=device, seed=seed, random_rows=random_rows, note="measured")


@ieee_mode
def probe(device: int = 0, *, paths: Sequence[tuple[str, str]] | None = None, random_rows: int = 48,
          seed: int = 0, runner: Callable[..., np.ndarray] | None = None, cc: int | None = None,
          device_name: str | None = None) -> ProbeResult:
    """Run the probe vectors on CUDA device `device` and fit every ``mma.sync`` path it supports.

    Paths need compute capability 8.0 (fp16, bf16, tf32) or 8.9 (FP8); a path whose kernel does not compile
    with the installed CUDA toolkit (FP8 -> fp16 needs PTX ISA 8.7) is reported as skipped. `runner`, `cc` and
    `device_name` replace the GPU (for emulation and tests).

    Raises
    ------
    fpsim.gpu.GPUUnavailable
        Without CuPy or a CUDA device (when no `runner` is given).
    """
    if runner is None:
        from ._device import device_info

        info = device_info(device)
        runner = gpu_runner(device)
        cc = info.cc
        device_name = info.name
    cc = 90 if cc is None else cc
    name = device_name or "emulated device"
    fits: list[FittedModel] = []
    outs: list[ProbeOutputs] = []
    skipped: list[tuple[str, str]] = []
    for path in paths if paths is not None else PATHS:
        ins = instruction_for(*path)
        label = ins.label
        if cc < ins.min_cc:
            skipped.append((label, f"needs compute capability {ins.min_cc // 10}.{ins.min_cc % 10}"))
            continue
        try:
            po = run_probes(ins, runner, random_rows=random_rows, seed=seed, device=name)
        except Exception as e:  # noqa: BLE001  (a CUDA compile/launch error for one path must not hide the others)
            msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
            skipped.append((label, f"{type(e).__name__}: {msg[:200]}"))
            continue
        outs.append(po)
        fits.append(fit_parameters(po))
    return ProbeResult(device=name, compute_capability=f"{cc // 10}.{cc % 10}", fits=tuple(fits),
                       outputs=tuple(outs), skipped=tuple(skipped))
