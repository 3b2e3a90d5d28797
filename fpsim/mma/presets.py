"""Device presets: which BFMA parameters each NVIDIA GPU uses for each input/output format, and the registry.

Every preset of every vendor is registered here with a :class:`Provenance` (reproduces published hardware rows /
agrees with MMA-Sim / from documentation only, with its source): the NVIDIA ones below, the others from their
own modules (:mod:`fpsim.mma.amd`, :mod:`fpsim.mma.xla`, :mod:`fpsim.mma.trainium`, :mod:`fpsim.mma.gaudi`, ...)
through :func:`register_device` and :func:`register_preset`. ``fpsim devices`` prints them (docs/devices.md).

Every entry follows the per-device parameter table of the reference (``tensorcore.md`` section 3, variants in
section 4) and carries its source and confidence; :func:`get_model` returns the :class:`MMAModel`.

=========  =====================  ====  =====  =====  ===========  ======================================
device     input -> output        k     neab   mel    result       source, confidence
=========  =====================  ====  =====  =====  ===========  ======================================
v100       fp16 -> fp32           4     0      none   RZ, mb 23    FHMP21 suite; KM-TACO data. high
v100       fp16 -> fp16           4     0      -19    RNE, mb 10   KM-TACO data. high
a100/a2/   fp16, bf16 -> fp32     8     1      -132   RZ, mb 23    KM-TACO A100, A2 data; KM-HPEC A30. high
a30        fp16 -> fp16           8     1      -20    RNE, mb 10   KM-TACO data. high
           tf32 -> fp32           4     1      -132   RZ, mb 23    KM-TACO data. high
ada/l40s   fp16, bf16 -> fp32     8     1      -132   RZ, mb 23    KM-TACO RTX-1000, L40S data. high
           fp16 -> fp16           8     1      -20    RNE, mb 10   high
           tf32 -> fp32           4     1      -132   RZ, mb 23    high
           fp8 -> fp32            16    -10    -132   RZ, mb 13    high (C != 0, K = 32 checked)
           fp8 -> fp16 (V2)       16    -10    none   RNE, mb 10   derived fit to KM-TACO data
h100/h200  fp16, bf16 -> fp32     16    2      -133   RZ, mb 23    KM-TACO data. high
           fp16 -> fp16           16    2      -21    RNE, mb 10   high
           tf32 -> fp32           8     2      -133   RZ, mb 23    medium (rows have K = 4)
           fp8 -> fp32 (wgmma)    32    -10    -133   RZ, mb 13    high for C = 0; C != 0 per SA2 quote
           fp8 -> fp16 (V1)       2x16  2      -21    RNE, mb 10   derived fit (mma.sync, mod-4 groups)
b200       fp16, bf16 as h100; tf32 as h100 (medium); fp8 -> fp16 V1 (derived)
           fp8 -> fp32 (V3)       32    2      -133   RZ 23, +C RNE  derived fit (mma.sync); path="tcgen05":
                                                                   k 32, neab 2, C inside (low: no data)
t4         fp16 -> fp32       8     1      -132   RZ, mb 23    MMA-Sim sm_75 model (nvidia_mmasim). medium
           fp16 -> fp16       8     1      -20    RNE, mb 10   MMA-Sim sm_75 model; no hardware rows
=========  =====================  ====  =====  =====  ===========  ======================================

FP8 means ``fp8_e4m3`` and ``fp8_e5m2``. bf16, tf32 and fp8 only accumulate to fp32 except FP8 -> fp16 where
listed. "mel is never exercised by the published data": its values come from the KM-TACO models.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .._fpenv import ieee_mode
from .._names import norm_name, parse_name
from ..formats import Format, FormatLike, as_format, bf16, fp8_e4m3, fp8_e5m2, fp16, fp32, tf32
from .model import MMAModel, _use_presets

__all__ = [
    "DEVICES",
    "DOCUMENTATION",
    "HARDWARE_ROWS",
    "INPUTS",
    "LEVELS",
    "MMA_SIM",
    "TABLE_KEYS",
    "DeviceInfo",
    "Preset",
    "Provenance",
    "add_provenance",
    "device_info",
    "get_model",
    "preset_provenance",
    "preset_table",
    "presets",
    "register_device",
    "register_preset",
]

INPUTS: tuple[str, ...] = ("fp16", "bf16", "tf32", "fp8_e4m3", "fp8_e5m2")

_KM = "Khattak & Mikaitis, Accurate Models of NVIDIA Tensor Cores (arXiv:2512.07004), MATLAB-tensor-core @b12b5a7"
_FS = "Fasi, Higham, Mikaitis, Pranesh, PeerJ CS 7:e330 (2021) test suite"
_HPEC = "Khattak & Mikaitis, IEEE HPEC 2025 (arXiv:2510.15884), A30 test output"
_SA2 = "SageAttention2 FP22 statement (thu-ml/SageAttention#287)"


#: Provenance levels, strongest evidence first. The first two may be combined; the third stands alone.
HARDWARE_ROWS = "reproduces published hardware rows"
MMA_SIM = "agrees with MMA-Sim"
DOCUMENTATION = "from documentation only"
LEVELS: tuple[str, ...] = (HARDWARE_ROWS, MMA_SIM, DOCUMENTATION)
_LEVEL_ALIASES = {"hardware-rows": HARDWARE_ROWS, "hardware": HARDWARE_ROWS, "mma-sim": MMA_SIM,
                  "mmasim": MMA_SIM, "documentation": DOCUMENTATION, "docs": DOCUMENTATION}


@ieee_mode
@dataclass(frozen=True)
class Provenance:
    """Where a preset's numerics come from, and how far they have been checked.

    Parameters
    ----------
    levels : str or tuple of str
        Non-empty: :data:`HARDWARE_ROWS` ("reproduces published hardware rows") and/or :data:`MMA_SIM`
        ("agrees with MMA-Sim"), or :data:`DOCUMENTATION` ("from documentation only") alone. Short spellings
        ``"hardware-rows"``, ``"mma-sim"``, ``"documentation"`` are accepted; stored in the order of
        :data:`LEVELS`.
    source : str
        The citations: paper, repository at a commit, URL or document name.
    note : str
        What exactly was compared and its limits (derived fit, C = 0 only, rows not shipped, ...).
    tests : tuple of str
        Test ids in this repository that check the claim; empty when the claim rests on the cited work.

    Examples
    --------
    >>> p = Provenance(("mma-sim", "hardware-rows"), source="KM-TACO rows; mmasim 2.1.1")
    >>> p.levels == (HARDWARE_ROWS, MMA_SIM), p.validated
    (True, True)
    >>> Provenance("documentation", source="vendor guide").label
    'from documentation only'
    """

    levels: tuple[str, ...] | str
    source: str
    note: str = ""
    tests: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        raw = (self.levels,) if isinstance(self.levels, str) else self.levels
        if not isinstance(raw, (tuple, list)):
            raise TypeError(f"levels must be a str or a tuple of str, got {type(raw).__name__}: {raw!r}")
        got = set()
        for lv in raw:
            key = norm_name(lv, "provenance level")
            got.add(parse_name(_LEVEL_ALIASES.get(key, key), LEVELS, "provenance level"))
        if not got:
            raise ValueError(f"a provenance needs at least one level; valid: {', '.join(LEVELS)}")
        if DOCUMENTATION in got and len(got) > 1:
            raise ValueError(f"{DOCUMENTATION!r} cannot be combined with a validated level ({sorted(got)})")
        for name in ("source", "note"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"{name} must be a str, got {type(getattr(self, name)).__name__}")
        if isinstance(self.tests, str) or not all(isinstance(t, str) for t in self.tests):
            raise TypeError(f"tests must be a tuple of str, got {self.tests!r}")
        object.__setattr__(self, "levels", tuple(lv for lv in LEVELS if lv in got))
        object.__setattr__(self, "tests", tuple(self.tests))

    @property
    def validated(self) -> bool:
        """True when some comparison (hardware rows or MMA-Sim) stands behind the preset."""
        return DOCUMENTATION not in self.levels

    @property
    def label(self) -> str:
        """The levels joined by ``" + "``."""
        return " + ".join(self.levels)

    def merged(self, other: Provenance) -> Provenance:
        """This provenance with `other`'s levels, source, note and tests added (both must be validated)."""
        if not (self.validated and other.validated):
            raise ValueError("only validated levels combine; a documentation-only preset is replaced, not merged")

        def join(a: str, b: str) -> str:
            return a if not b or b in a else (f"{a}; {b}" if a else b)

        return Provenance(tuple(self.levels) + tuple(other.levels), join(self.source, other.source),
                          join(self.note, other.note),
                          self.tests + tuple(t for t in other.tests if t not in self.tests))


@ieee_mode
@dataclass(frozen=True)
class DeviceInfo:
    """One device: its architecture, the family whose parameters it uses, a short note, vendor and unit.

    ``vendor`` and ``unit`` (the matrix unit's name) are keyword fields added for the non-NVIDIA devices;
    the first four stay positional as before.
    """

    name: str
    arch: str
    family: str
    note: str
    vendor: str = "NVIDIA"
    unit: str = "Tensor Core"


@ieee_mode
@dataclass(frozen=True)
class Preset:
    """One registered (device, input, output, path) data path: its provenance and the builder of its model."""

    device: str
    input: str
    output: str
    path: str | None
    provenance: Provenance
    build: Callable[[], MMAModel] | None = field(default=None, compare=False, repr=False)
    usage: str = ""

    def model(self) -> MMAModel:
        """The preset's :class:`MMAModel` (what :func:`get_model` returns for it)."""
        if self.build is None:
            raise ValueError(f"{self.device} {self.input}->{self.output}"
                             f"{'' if self.path is None else f' (path {self.path!r})'} is not a single MMAModel: "
                             f"{self.usage or 'see its module'}")
        return self.build()


DEVICES: dict[str, DeviceInfo] = {
    "v100": DeviceInfo("v100", "Volta", "volta", "published 5000-row sets reproduced; subset shipped"),
    "t4": DeviceInfo("t4", "Turing", "turing", "MMA-Sim's sm_75 model only: no published hardware rows"),
    "a100": DeviceInfo("a100", "Ampere", "ampere", "published sets reproduced; subset shipped"),
    "a2": DeviceInfo("a2", "Ampere", "ampere", "published sets reproduced (not shipped here)"),
    "a30": DeviceInfo("a30", "Ampere", "ampere", "HPEC 2025 test output (block size 8, one extra bit)"),
    "ada": DeviceInfo("ada", "Ada Lovelace", "ada", "RTX 1000 Ada sets reproduced; subset shipped"),
    "l40s": DeviceInfo("l40s", "Ada Lovelace", "ada", "published sets reproduced (not shipped here)"),
    "h100": DeviceInfo("h100", "Hopper", "hopper", "published sets reproduced; subset shipped"),
    "h200": DeviceInfo("h200", "Hopper", "hopper", "published sets reproduced (not shipped here)"),
    "b200": DeviceInfo("b200", "Blackwell", "blackwell", "published sets reproduced (not shipped here)"),
}

_ALIASES = {
    "volta": "v100", "teslav100": "v100",
    "turing": "t4", "teslat4": "t4",
    "ampere": "a100",
    "adalovelace": "ada", "rtx1000": "ada", "rtx1000ada": "ada", "rtxa1000": "ada",
    "hopper": "h100", "h800": "h100",
    "blackwell": "b200",
}

_FP8 = (fp8_e4m3, fp8_e5m2)
# Board and memory suffixes after the chip name: "sxm4", "pcie", "nvl", "hbm3", "80gb", "sxm480gb" ...
_BOARD_SUFFIX = r"((sxm\d*)|pcie|nvl|(hbm\d*e?)|(\d+gb))*"


def _norm_device(device: str) -> str:
    if not isinstance(device, str):
        raise TypeError(f"device must be a str, got {type(device).__name__}")
    key = re.sub(r"[\s_\-]+", "", device.strip().lower())
    key = re.sub(r"^(nvidia|tesla|amd|instinct|google|cloud|aws|intel|habana)", "", key) \
        if key not in _ALIASES else key
    if key in _ALIASES:
        return _ALIASES[key]
    if key in DEVICES:
        return key
    # Board suffixes: "a100sxm480gb", "h100pcie", "l40s48gb"...
    for name in sorted(DEVICES, key=len, reverse=True):
        if key.startswith(name) and re.fullmatch(_BOARD_SUFFIX, key[len(name):]):
            return name
    raise ValueError(f"unknown device {device!r}; valid: {', '.join(DEVICES)} (or aliases "
                     f"{', '.join(sorted(_ALIASES))})")


def device_info(device: str) -> DeviceInfo:
    """The :class:`DeviceInfo` for a device name (common spellings accepted)."""
    return DEVICES[_norm_device(device)]


def _norm_input(fmt: FormatLike) -> Format:
    try:
        f: Format | None = as_format(fmt)
    except (ValueError, TypeError):
        f = None
    if f is None or f not in (fp16, bf16, tf32, fp8_e4m3, fp8_e5m2):
        raise ValueError(f"unsupported matrix-unit input format {fmt!r}; valid: {', '.join(INPUTS)}")
    return f


def _norm_output(fmt: FormatLike) -> Format:
    try:
        f = as_format(fmt)
    except ValueError:
        f = None
    if f not in (fp32, fp16):
        raise ValueError(f"unsupported matrix-unit output format {fmt!r}; valid: fp32, fp16")
    assert f is not None
    return f


def _nvidia_model(dev: str, input: FormatLike, output: FormatLike, path: str | None) -> MMAModel:
    """The NVIDIA presets (reference tensorcore.md sections 3-4), with their specific refusals."""
    info = DEVICES[dev]
    fin = _norm_input(input)
    fout = _norm_output(output)
    fam = info.family
    label = f"{dev} {fin.name}->{fout.name}"

    if path is not None and not (dev == "b200" and fin in _FP8 and fout == fp32):
        raise ValueError(f"path={path!r} only applies to b200 FP8 -> fp32 (valid: 'mma.sync', 'tcgen05')")

    if fam == "turing":
        if fin != fp16:
            raise ValueError(f"t4 (Turing) has no {fin.name} tensor-core path: Turing multiplies fp16 (and "
                             "integers) only")
        # fp16 on Turing comes from MMA-Sim's sm_75 model, registered by fpsim/mma/nvidia_mmasim.py
        raise ValueError(f"t4 (Turing) has no {fin.name}->{fout.name} preset on path {path!r}; valid: fp16->fp32, "
                         "fp16->fp16 (mma.sync)")
    if fam == "volta" and fin != fp16:
        raise ValueError(f"v100 (Volta) has no {fin.name} tensor-core path: Volta multiplies fp16 only")
    if fam in ("volta", "ampere") and fin in _FP8:
        raise ValueError(f"{dev} ({info.arch}) has no {fin.name} tensor-core path: FP8 tensor cores start "
                         "with Ada and Hopper")
    if fout == fp16 and fin in (bf16, tf32):
        raise ValueError(f"{dev} ({info.arch}) has no {fin.name}->fp16 tensor-core path: {fin.name} products "
                         "accumulate in fp32 only")

    def mk(k: int, neab: int, mel: int | None, rounding: str, mb: int, src: str, conf: str,
           c_entry: str = "inside", grouping: str = "none") -> MMAModel:
        model = MMAModel(name=label, kind="bfma", input=fin, output=fout, k=k, neab=neab, mel=mel,
                         rounding=rounding, mb=mb, c_entry=c_entry, grouping=grouping, source=src,
                         confidence=conf)
        # Each preset documents itself: parameters, source and confidence (``help``-free: ``m.__doc__``).
        object.__setattr__(model, "__doc__", model.describe())
        return model

    to16 = fout == fp16
    if fam == "volta":
        if to16:
            return mk(4, 0, -19, "rne", 10, _KM, "high: published set reproduced bit for bit")
        return mk(4, 0, None, "rz", 23, f"{_FS}; {_KM}", "high: suite expectations and published set reproduced")
    if fam in ("ampere", "ada"):
        src = _KM if dev != "a30" else f"{_HPEC}; {_KM} (Ampere)"
        if fin == tf32:
            return mk(4, 1, -132, "rz", 23, src, "high: published tf32 sets reproduced" if dev != "a30" else
                      "documentation only: Ampere (A100) parameters; no A30 data for tf32")
        if fin in _FP8:  # Ada only
            if to16:
                return mk(16, -10, None, "rne", 10, f"{_KM} data; variant V2 (derived)",
                          "derived fit: 13-bit grid, mb kept at 10, RNE; reproduces the published rows")
            return mk(16, -10, -132, "rz", 13, f"{_KM}; {_SA2}",
                      "high: published sets reproduced with C != 0 and K = 32 (two blocks)")
        if to16:
            return mk(8, 1, -20, "rne", 10, src, "high: published sets reproduced")
        return mk(8, 1, -132, "rz", 23, src, "high: published sets reproduced (A100, A2, Ada, L40S)"
                  if dev != "a30" else "high: A30 HPEC output agrees with the Ampere parameters" if fin == fp16
                  else "documentation only: Ampere (A100) parameters; no A30 data for bf16")
    # hopper, blackwell
    if fin == tf32:
        return mk(8, 2, -133, "rz", 23, _KM, "medium: published rows have K = 4, so k = 8 is untested")
    if fin in _FP8:
        if to16:
            return mk(16, 2, -21, "rne", 10, f"{_KM} data; variant V1 (derived)",
                      "derived fit: mma.sync m16n8k32 f16 as two fp16 HMMA steps over mod-4 groups then one "
                      "fp16 add of C; reproduces every published row", c_entry="late", grouping="mod4")
        if fam == "blackwell":
            if path in (None, "mma.sync"):
                return mk(32, 2, -133, "rz", 23, f"{_KM} data; variant V3 (derived)",
                          "derived fit: mma.sync; 32 products RZ to fp32 with neab 2, then RNE(S + C)",
                          c_entry="late")
            if path == "tcgen05":
                return mk(32, 2, -133, "rz", 23, "DeepGEMM#176 ('25 bits'); no published data",
                          "low: no hardware data for tcgen05 FP8")
            raise ValueError(f"unknown path {path!r} for b200 FP8 -> fp32; valid: 'mma.sync', 'tcgen05'")
        return mk(32, -10, -133, "rz", 13, f"{_KM}; {_SA2}; DeepSeek-V3 report",
                  "high for C = 0 (published WGMMA sets); C != 0 rests on the SageAttention2 quote")
    if to16:
        return mk(16, 2, -21, "rne", 10, _KM, "high: published sets reproduced")
    return mk(16, 2, -133, "rz", 23, _KM, "high: published sets reproduced")


# ---------------------------------------------------------------------------------------------------------
# The registry: every vendor module registers its devices and presets (see docs/devices.md)
# ---------------------------------------------------------------------------------------------------------

_PRESETS: dict[tuple[str, str, str, str | None], Preset] = {}
_FALLBACKS: dict[str, Callable[[Any, Any, Any], MMAModel]] = {}


def _name_key(x: Any, what: str) -> str:
    """Canonical name of a format argument (a Format's name), or the lower-cased text of another name."""
    if isinstance(x, Format):
        return x.name
    if not isinstance(x, str):
        try:
            return as_format(x).name
        except (ValueError, TypeError):
            raise TypeError(f"{what} must be a str or a Format, got {type(x).__name__}: {x!r}") from None
    try:
        return as_format(x).name
    except ValueError:
        return norm_name(x, what)


def _combo(p: Preset) -> str:
    return f"{p.input}->{p.output}" + ("" if p.path is None else f" (path={p.path!r})")


@ieee_mode
def register_device(info: DeviceInfo, *, aliases: Iterable[str] = (),
                    fallback: Callable[[Any, Any, Any], MMAModel] | None = None) -> DeviceInfo:
    """Add a device to :data:`DEVICES` (and its alternative names to the device-name parser).

    `fallback(input, output, path)` is called by :func:`get_model` when no registered preset matches; it
    raises a ``ValueError`` saying why that pair does not exist (or returns a model). Re-registering an
    identical device is a no-op; a different one under the same name raises ``ValueError``.

    Examples
    --------
    >>> info = device_info("tpu")
    >>> (info.vendor, info.unit)
    ('Google', 'MXU')
    """
    if not isinstance(info, DeviceInfo):
        raise TypeError(f"info must be a DeviceInfo, got {type(info).__name__}")
    name = norm_name(info.name, "device name")
    if name != info.name or not re.fullmatch(r"[a-z0-9.]+", name):
        raise ValueError(f"device names are lower-case letters and digits, got {info.name!r}")
    old = DEVICES.get(name)
    if old is not None and old != info:
        raise ValueError(f"device {name!r} is already registered as {old}")
    DEVICES[name] = info
    for a in aliases:
        key = re.sub(r"[\s_\-]+", "", norm_name(a, "device alias"))
        if _ALIASES.get(key, name) != name or (key in DEVICES and key != name):
            raise ValueError(f"alias {a!r} already names {_ALIASES.get(key, key)!r}")
        _ALIASES[key] = name
    if fallback is not None:
        _FALLBACKS[name] = fallback
    return info


@ieee_mode
def register_preset(device: str, input: FormatLike, output: FormatLike, *, provenance: Provenance,
                    build: Callable[[], MMAModel] | None = None, path: str | None = None,
                    usage: str = "") -> Preset:
    """Register one (device, input, output, path) preset with its provenance and the builder of its model.

    `build` is a zero-argument callable returning the :class:`MMAModel`; ``None`` lists a data path that is
    not one MMAModel (an XLA dot algorithm of several passes, say), with `usage` saying how to run it.

    Examples
    --------
    >>> p = presets("tpu")[0]
    >>> (p.device, p.input, p.output, p.provenance.label)
    ('tpu', 'bf16', 'fp32', 'from documentation only')
    """
    dev = _norm_device(device)
    if not isinstance(provenance, Provenance):
        raise TypeError(f"provenance must be a Provenance, got {type(provenance).__name__}")
    if build is not None and not callable(build):
        raise TypeError("build must be a zero-argument callable returning an MMAModel")
    key = (dev, _name_key(input, "input format"), _name_key(output, "output format"),
           None if path is None else norm_name(path, "path"))
    if key in _PRESETS:
        raise ValueError(f"preset {key} is already registered (use add_provenance to add a level)")
    p = Preset(key[0], key[1], key[2], key[3], provenance, build, usage)
    _PRESETS[key] = p
    return p


@ieee_mode
def add_provenance(device: str, input: FormatLike, output: FormatLike, level: str | tuple[str, ...], *,
                   source: str, note: str = "", tests: tuple[str, ...] = (), path: str | None = None) -> Provenance:
    """Add a validated level (e.g. :data:`MMA_SIM` after a cross-check) to a registered preset.

    A preset documented only gets its level replaced by the validated one; its source and note (the documented
    caveats) are kept after the new ones. Returns the new provenance.

    Examples
    --------
    >>> p = preset_provenance("h100", "fp16")
    >>> HARDWARE_ROWS in p.levels
    True
    """
    dev = _norm_device(device)
    key = (dev, _name_key(input, "input format"), _name_key(output, "output format"),
           None if path is None else norm_name(path, "path"))
    old = _PRESETS.get(key)
    if old is None:
        raise ValueError(f"no preset {key} to add provenance to; registered for {dev}: "
                         f"{', '.join(_combo(p) for p in _PRESETS.values() if p.device == dev) or 'none'}")
    new = Provenance(level, source, note, tests)
    if old.provenance.validated:
        prov = old.provenance.merged(new)
    else:  # the validated level replaces "documentation only", but the documented caveat is carried over
        was = old.provenance
        carried = f"{new.note}; before the cross-check (documentation only): {was.note}" if was.note else new.note
        prov = Provenance(new.levels, f"{new.source}; {was.source}" if was.source else new.source, carried,
                          new.tests + tuple(t for t in was.tests if t not in new.tests))
    _PRESETS[key] = Preset(old.device, old.input, old.output, old.path, prov, old.build, old.usage)
    return prov


@ieee_mode
def presets(device: str | None = None) -> list[Preset]:
    """Every registered :class:`Preset` (of one device when given), in registration order.

    Examples
    --------
    >>> [(p.input, p.output) for p in presets("v100")]
    [('fp16', 'fp32'), ('fp16', 'fp16')]
    """
    if device is None:
        return list(_PRESETS.values())
    dev = _norm_device(device)
    return [p for p in _PRESETS.values() if p.device == dev]


@ieee_mode
def preset_provenance(device: str, input: FormatLike, output: FormatLike = "fp32", *,
                      path: str | None = None) -> Provenance:
    """The :class:`Provenance` of one preset.

    Examples
    --------
    >>> preset_provenance("b200", "e4m3", path="tcgen05").label   # set by fpsim/mma/nvidia_mmasim.py
    'agrees with MMA-Sim'
    """
    dev = _norm_device(device)
    key = (dev, _name_key(input, "input format"), _name_key(output, "output format"),
           None if path is None else norm_name(path, "path"))
    p = _PRESETS.get(key)
    if p is None:
        valid = ", ".join(_combo(q) for q in _PRESETS.values() if q.device == dev) or "none"
        raise ValueError(f"{dev} has no preset {key[1]} -> {key[2]}"
                         f"{'' if path is None else f' on path {path!r}'}; valid: {valid}")
    return p.provenance


#: Keys of each row of :func:`preset_table` and of ``fpsim devices --json`` (stable: keys may be added, none removed).
TABLE_KEYS = ("device", "vendor", "arch", "unit", "input", "output", "path", "provenance", "levels", "validated",
              "source", "note", "tests", "usage", "caveats")

# Short qualifiers shown beside the level (``fpsim devices``, docs/devices.md): (phrase in the note, qualifier).
_CAVEATS = (
    ("sibling rows only", "sibling rows"),
    ("feature-test output only", "feature tests only"),
    ("derived fit", "derived fit"),
    ("C = 0 (published", "rows C = 0 only"),
    ("k = 8 is untested", "rows K = 4"),
    ("not re-checked", "not re-checked"),
    ("no hardware rows", "no hardware rows"),
    ("C's exponent from its binary32", "!= MMA-Sim: fp16-subnormal C at a tie"),
    ("inf/NaN C", "!= MMA-Sim: inf/NaN C"),
    ("global-scale epilogue is an assumption", "epilogue assumed"),
)


def _caveats(prov: Provenance) -> list[str]:
    """The short qualifiers of `prov` (from the phrases of its note), in :data:`_CAVEATS` order."""
    return [q for phrase, q in _CAVEATS if phrase in prov.note]


@ieee_mode
def preset_table(device: str | None = None) -> list[dict[str, Any]]:
    """One dict per preset (keys :data:`TABLE_KEYS`), plus one row with ``input: None`` per device without any.

    Examples
    --------
    >>> [(r["device"], r["input"], r["output"], r["provenance"]) for r in preset_table("t4")]
    [('t4', 'fp16', 'fp32', 'agrees with MMA-Sim'), ('t4', 'fp16', 'fp16', 'agrees with MMA-Sim')]
    """
    devs = list(DEVICES) if device is None else [_norm_device(device)]
    rows: list[dict[str, Any]] = []
    for dev in devs:
        info = DEVICES[dev]
        base = {"device": dev, "vendor": info.vendor, "arch": info.arch, "unit": info.unit}
        mine = [p for p in _PRESETS.values() if p.device == dev]
        for p in mine:
            rows.append({**base, "input": p.input, "output": p.output, "path": p.path,
                         "provenance": p.provenance.label, "levels": list(p.provenance.levels),
                         "validated": p.provenance.validated, "source": p.provenance.source,
                         "note": p.provenance.note, "tests": list(p.provenance.tests),
                         "usage": p.usage or "fpsim.mma.get_model", "caveats": _caveats(p.provenance)})
        if not mine:
            rows.append({**base, "input": None, "output": None, "path": None, "provenance": "no model",
                         "levels": [], "validated": False, "source": "", "note": info.note, "tests": [],
                         "usage": "", "caveats": []})
    return rows


def get_model(device: str, input: FormatLike, output: FormatLike = "fp32", *, path: str | None = None) -> MMAModel:
    """The BFMA model of `device`'s matrix unit for one input -> output format pair.

    Parameters
    ----------
    device : str
        NVIDIA: ``v100 t4 a100 a2 a30 ada l40s h100 h200 b200`` (case, spaces, dashes and board suffixes are
        ignored: ``"H100"``, ``"A100-SXM4-80GB"``, ``"RTX-1000"``, ``"Hopper"`` all work; ``"h800"`` maps
        to h100, the same Hopper SM). Other vendors' devices register from their own modules
        (:data:`DEVICES` lists them all; ``fpsim devices`` prints every preset with its provenance).
    input : str or Format
        NVIDIA: ``fp16 bf16 tf32 fp8_e4m3 fp8_e5m2`` (``"e4m3"``/``"e5m2"`` and ml_dtypes names accepted).
        Other devices list theirs in :func:`presets`.
    output : str or Format
        ``fp32`` (default) or ``fp16``.
    path : str, optional
        Instruction path where a device has several with different numerics. Only B200 FP8 -> fp32:
        ``"mma.sync"`` (default, variant V3, derived from published data) or ``"tcgen05"`` (native,
        k = 32, neab = 2, C inside; low confidence, no data). Registered presets of other devices may
        name paths of their own.

    Raises
    ------
    ValueError
        For unknown names, for pairs the hardware does not have (V100 bf16, tf32 -> fp16, fp8 before Ada,
        bf16 -> fp16, T4 anything but fp16).

    Notes
    -----
    Every preset carries a :class:`Provenance`: :func:`preset_provenance` returns it.

    Examples
    --------
    >>> m = get_model("H100", "e4m3")
    >>> (m.k, m.neab, m.mb)
    (32, -10, 13)
    >>> get_model("v100", "bf16")
    Traceback (most recent call last):
    ...
    ValueError: v100 (Volta) has no bf16 tensor-core path: Volta multiplies fp16 only
    """

    dev = _norm_device(device)
    fin = _name_key(input, "input format")
    fout = _name_key(output, "output format")
    pkey = None if path is None else norm_name(path, "path")
    hit = _PRESETS.get((dev, fin, fout, pkey))
    if hit is not None:
        return hit.model()
    fallback = _FALLBACKS.get(dev)
    if fallback is not None:
        return fallback(input, output, path)
    have = [p for p in _PRESETS.values() if p.device == dev]
    valid = ", ".join(_combo(p) for p in have) or "none (no model: see fpsim devices)"
    raise ValueError(f"{dev} has no {fin} -> {fout} preset{'' if path is None else f' on path {path!r}'}; "
                     f"valid: {valid}")


# ---------------------------------------------------------------------------------------------------------
# NVIDIA presets and their provenance (reference tensorcore.md sections 3, 4 and 9)
# ---------------------------------------------------------------------------------------------------------

_HW_TEST = "tests/test_mma_hw.py::test_published_set_bit_exact[{}]"
# Devices whose published rows ship in tests/data/tensorcore-hw (first 1000 rows of each set).
_SHIPPED = {"v100": "V100", "a100": "A100", "ada": "Ada", "h100": "H100"}
_SHIPPED_FMT = {"fp16": "fp16", "bf16": "bf16", "tf32": "tf32", "fp8_e4m3": "E4M3", "fp8_e5m2": "E5M2"}
# Explicit evidence table: (device, input, output) -> where that chip's own published hardware output is. Only
# these (and the shipped sets above) carry HARDWARE_ROWS; tests/test_mma_devices.py checks that rule.
_KMTACO = ("KM-TACO published set (north-numerical-computing/MATLAB-tensor-core @b12b5a7, "
           "model_validation/{}/{}/d_{}_{}.txt)")
_A30_TESTS = ("tests/test_mma_devices.py::test_a30_fp16_matches_hpec_output",)
_PUBLISHED_ELSEWHERE: dict[tuple[str, str, str], str] = {
    **{("a2", i, o): _KMTACO.format("A2", _SHIPPED_FMT[i], "A2", o)
       for i, o in (("fp16", "fp32"), ("fp16", "fp16"), ("bf16", "fp32"), ("tf32", "fp32"))},
    **{("l40s", i, o): _KMTACO.format("L40S", _SHIPPED_FMT[i], "L40S", o)
       for i, o in (("fp16", "fp32"), ("fp16", "fp16"), ("bf16", "fp32"), ("tf32", "fp32"))},
    **{(d, i, o): _KMTACO.format(d.upper(), _SHIPPED_FMT[i], d.upper(), o)
       for d in ("h200", "b200")
       for i, o in (("fp16", "fp32"), ("fp16", "fp16"), ("bf16", "fp32"), ("tf32", "fp32"), ("fp8_e4m3", "fp32"),
                    ("fp8_e4m3", "fp16"), ("fp8_e5m2", "fp32"), ("fp8_e5m2", "fp16"))},
    **{("a30", "fp16", o): "published A30 feature-test output (HPEC 2025, KM-HPEC; CUDA/nvidia-tests.cu sample "
       "output): 1 extra alignment bit, block FMA size 8, RZ to fp32, RNE to fp16" for o in ("fp32", "fp16")},
}
_REP = {"volta": "v100", "ampere": "a100", "ada": "ada", "hopper": "h100", "blackwell": "h100"}


def _nvidia_provenance(dev: str, fin: str, fout: str, path: str | None) -> Provenance:
    fam = DEVICES[dev].family
    m = _nvidia_model(dev, fin, fout, path)
    src, caveat = m.source, m.confidence
    if dev == "b200" and path == "tcgen05":
        return Provenance(DOCUMENTATION, src, "no hardware data for tcgen05 FP8; width from a third-party statement")
    derived = "derived" in caveat
    kind = "derived fit (no document states this data path); " if derived else ""
    if dev in _SHIPPED:
        test = _HW_TEST.format(f"{_SHIPPED[dev]}-{_SHIPPED_FMT[fin]}-{fout}")
        return Provenance(HARDWARE_ROWS, src, f"{kind}first 1000 published rows shipped and reproduced bit for bit "
                          f"here; {caveat}", (test,))
    where = _PUBLISHED_ELSEWHERE.get((dev, fin, fout))
    if dev == "a30" and where is not None:
        return Provenance(HARDWARE_ROWS, f"{src}; {where}", "feature-test output only, no random-row sets: "
                          "fpsim's A30 model gives HPEC's stated answers (probes P18-P20, P22; tests/test_mma_probes.py "
                          "encodes them under the a100 column); no A30 rows shipped", _A30_TESTS)
    if where is not None:
        return Provenance(HARDWARE_ROWS, f"{src}; {where}", f"{kind}published {dev.upper()} set exists, not shipped "
                          f"here, not re-checked by the tests (the reference, tensorcore.md sections 3-4, reports the "
                          f"parameters fit it); {caveat}")
    rep = _REP[fam]
    test = _HW_TEST.format(f"{_SHIPPED[rep]}-{_SHIPPED_FMT[fin]}-{fout}") if rep in _SHIPPED else ""
    sib = f"; the {rep.upper()} rows ({DEVICES[rep].arch}) reproduce these parameters ({test})" if test else ""
    return Provenance(DOCUMENTATION, src, f"{kind}sibling rows only: parameters of the {DEVICES[rep].arch} family; "
                      f"no {dev.upper()} data for this pair{sib}; model confidence (of the family): {caveat}")


def _register_nvidia() -> None:
    for dev, info in list(DEVICES.items()):
        if info.vendor != "NVIDIA" or dev in _FALLBACKS:
            continue
        _FALLBACKS[dev] = (lambda d: lambda i, o, p: _nvidia_model(d, i, o, p))(dev)
        for fin in INPUTS:
            for fout in ("fp32", "fp16"):
                paths: tuple[str | None, ...] = (None, "tcgen05") if dev == "b200" and fin.startswith("fp8") \
                    and fout == "fp32" else (None,)
                for path in paths:
                    try:
                        _nvidia_model(dev, fin, fout, path)
                    except ValueError:
                        continue
                    register_preset(dev, fin, fout, path=path, provenance=_nvidia_provenance(dev, fin, fout, path),
                                    build=(lambda d, i, o, p: lambda: _nvidia_model(d, i, o, p))(dev, fin, fout, path))


_register_nvidia()
_use_presets(get_model)  # as_model('device:input[:output]') resolves through the presets (models never import them)
