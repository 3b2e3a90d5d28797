"""Device presets: which BFMA parameters each NVIDIA GPU uses for each input/output format.

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
t4         fp16 -> fp32: block size k and mel unknown -> ValueError
=========  =====================  ====  =====  =====  ===========  ======================================

FP8 means ``fp8_e4m3`` and ``fp8_e5m2``. bf16, tf32 and fp8 only accumulate to fp32 except FP8 -> fp16 where
listed. "mel is never exercised by the published data": its values come from the KM-TACO models.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..formats import Format, FormatLike, as_format, bf16, fp8_e4m3, fp8_e5m2, fp16, fp32, tf32
from .model import MMAModel

__all__ = ["DEVICES", "INPUTS", "DeviceInfo", "device_info", "get_model"]

INPUTS: tuple[str, ...] = ("fp16", "bf16", "tf32", "fp8_e4m3", "fp8_e5m2")

_KM = "Khattak & Mikaitis, Accurate Models of NVIDIA Tensor Cores (arXiv:2512.07004), MATLAB-tensor-core @b12b5a7"
_FS = "Fasi, Higham, Mikaitis, Pranesh, PeerJ CS 7:e330 (2021) test suite"
_HPEC = "Khattak & Mikaitis, IEEE HPEC 2025 (arXiv:2510.15884), A30 test output"
_SA2 = "SageAttention2 FP22 statement (thu-ml/SageAttention#287)"


@dataclass(frozen=True)
class DeviceInfo:
    """One GPU: its architecture, the family whose parameters it uses, and a short provenance note."""

    name: str
    arch: str
    family: str
    note: str


DEVICES: dict[str, DeviceInfo] = {
    "v100": DeviceInfo("v100", "Volta", "volta", "published 5000-row sets reproduced; subset shipped"),
    "t4": DeviceInfo("t4", "Turing", "turing", "only Fasi et al. suite expectations; k and mel unknown"),
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
    key = re.sub(r"^(nvidia|tesla)", "", key) if key not in _ALIASES else key
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


def get_model(device: str, input: FormatLike, output: FormatLike = "fp32", *, path: str | None = None) -> MMAModel:
    """The BFMA model of `device`'s matrix unit for one input -> output format pair.

    Parameters
    ----------
    device : str
        ``v100 t4 a100 a2 a30 ada l40s h100 h200 b200`` (case, spaces, dashes and board suffixes are
        ignored: ``"H100"``, ``"A100-SXM4-80GB"``, ``"RTX-1000"``, ``"Hopper"`` all work; ``"h800"`` maps
        to h100, the same Hopper SM).
    input : str or Format
        ``fp16 bf16 tf32 fp8_e4m3 fp8_e5m2`` (``"e4m3"``/``"e5m2"`` and ml_dtypes names accepted).
    output : str or Format
        ``fp32`` (default) or ``fp16``.
    path : str, optional
        Instruction path where a device has several with different numerics. Only B200 FP8 -> fp32:
        ``"mma.sync"`` (default, variant V3, derived from published data) or ``"tcgen05"`` (native,
        k = 32, neab = 2, C inside; low confidence, no data).

    Raises
    ------
    ValueError
        For unknown names, for pairs the hardware does not have (V100 bf16, tf32 -> fp16, fp8 before Ada,
        bf16 -> fp16), and for undocumented behaviour (T4, whose block size is unknown).

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
        raise ValueError("t4 (Turing) fp16 tensor-core numerics are undocumented: only the Fasi et al. suite "
                         "expectations it shares with A100 exist (e.g. P1); the block size k and exponent floor "
                         "mel are unknown, so no bit-exact model can be given (use 'a100' as a guess at your risk)")
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
            return mk(4, 1, -132, "rz", 23, src, "high: published tf32 sets reproduced")
        if fin in _FP8:  # Ada only
            if to16:
                return mk(16, -10, None, "rne", 10, f"{_KM} data; variant V2 (derived)",
                          "derived fit: 13-bit grid, mb kept at 10, RNE; reproduces the published rows")
            return mk(16, -10, -132, "rz", 13, f"{_KM}; {_SA2}",
                      "high: published sets reproduced with C != 0 and K = 32 (two blocks)")
        if to16:
            return mk(8, 1, -20, "rne", 10, src, "high: published sets reproduced")
        return mk(8, 1, -132, "rz", 23, src, "high: published sets reproduced (A100, A2, Ada, L40S)"
                  if dev != "a30" else "high: A30 HPEC output agrees with the Ampere parameters")
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
