"""Formats: derived limits, every bit pattern, neighbours, parsing and display."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import fpsim

SMALL = [f for f in fpsim.all_formats() if f.width <= 16]
ids = lambda f: f.name  # noqa: E731

# Limits as published (IEEE 754, OCP FP8 and MX specifications, the fnuz papers).
KNOWN = {
    "fp64": (np.finfo(np.float64).max, 2.0**-1022, 2.0**-1074, 2.0**-52),
    "fp32": (np.finfo(np.float32).max, 2.0**-126, 2.0**-149, 2.0**-23),
    "tf32": ((2 - 2.0**-10) * 2.0**127, 2.0**-126, 2.0**-136, 2.0**-10),
    "fp16": (65504.0, 2.0**-14, 2.0**-24, 2.0**-10),
    "bf16": ((2 - 2.0**-7) * 2.0**127, 2.0**-126, 2.0**-133, 2.0**-7),
    "fp8_e4m3": (448.0, 2.0**-6, 2.0**-9, 0.125),
    "fp8_e5m2": (57344.0, 2.0**-14, 2.0**-16, 0.25),
    "fp8_e4m3fnuz": (240.0, 2.0**-7, 2.0**-10, 0.125),
    "fp8_e5m2fnuz": (57344.0, 2.0**-15, 2.0**-17, 0.25),
    "fp6_e2m3": (7.5, 1.0, 0.125, 0.125),
    "fp6_e3m2": (28.0, 0.25, 0.0625, 0.25),
    "fp4_e2m1": (6.0, 1.0, 0.5, 0.5),
    "e8m0": (2.0**127, 2.0**-127, 2.0**-127, 1.0),
}


@pytest.mark.parametrize("name", list(KNOWN))
def test_known_limits(name: str) -> None:
    f = fpsim.as_format(name)
    assert (f.max, f.min_normal, f.min_subnormal, f.eps) == KNOWN[name]


@pytest.mark.parametrize("fmt", [f for f in SMALL if f.name in fpsim.bits._ML_NAMES
     and hasattr(ml_dtypes, fpsim.bits._ML_NAMES[f.name])], ids=ids)
def test_limits_match_ml_dtypes_finfo(fmt: fpsim.Format) -> None:
    fi = ml_dtypes.finfo(fpsim.ml_dtype(fmt))
    assert float(fi.max) == fmt.max
    assert float(fi.smallest_normal) == fmt.min_normal
    assert float(fi.eps) == fmt.eps
    if fmt.subnormals:
        assert float(fi.smallest_subnormal) == fmt.min_subnormal


@pytest.mark.parametrize("fmt", SMALL, ids=ids)
def test_every_pattern_decodes_and_reencodes(fmt: fpsim.Format) -> None:
    codes = np.arange(1 << fmt.width, dtype=np.uint32)
    v = fpsim.from_bits(codes, fmt)
    back = fpsim.to_bits(v, fmt) if fmt.has_nan else None
    nan = np.isnan(v)
    if back is None:  # no NaN: every pattern is a number
        back = fpsim.to_bits(v, fmt)
    back = np.asarray(back).astype(np.uint32)
    assert np.array_equal(back[~nan], codes[~nan]), "encode(decode(c)) != c"
    if nan.any():
        assert np.all(back[nan] == fmt.nan_code), "NaN patterns re-encode to the canonical NaN"
    # decoding is monotone in the sign-magnitude order of codes (not in a tapered table format: HiF8's
    # sign-magnitude exponent puts 2**-1 after 2**1)
    pos = v[(codes < (1 << (fmt.width - 1)) if fmt.signed else codes >= 0) & ~nan]
    if fmt.table is None:
        assert np.all(np.diff(pos) > 0)
    else:
        assert np.unique(pos).size == pos.size


@pytest.mark.parametrize("fmt", [f for f in SMALL if f.name in fpsim.bits._ML_NAMES
     and hasattr(ml_dtypes, fpsim.bits._ML_NAMES[f.name])], ids=ids)
def test_decode_matches_ml_dtypes(fmt: fpsim.Format) -> None:
    """ml_dtypes is an independent decoder for every pattern of every format it has."""
    codes = np.arange(1 << fmt.width, dtype=np.uint32)
    dt = fpsim.ml_dtype(fmt)
    st = np.uint8 if dt.itemsize == 1 else np.uint16
    with np.errstate(invalid="ignore"):  # signalling-NaN patterns
        ref = codes.astype(st).view(dt).astype(np.float64)
    got = fpsim.from_bits(codes, fmt)
    same = (np.isnan(got) & np.isnan(ref)) | ((got == ref) & (np.signbit(got) == np.signbit(ref)))
    assert same.all(), codes[~same][:8]


@pytest.mark.parametrize("fmt", SMALL, ids=ids)
def test_values_and_neighbours(fmt: fpsim.Format) -> None:
    v = fmt.values()
    assert v.size == np.unique(v).size
    assert v.max() == fmt.max
    inner = v[:-1]
    assert np.array_equal(np.asarray(fmt.next_up(inner)), v[1:])
    assert np.array_equal(np.asarray(fmt.next_down(v[1:])), inner)
    # ulp is the gap above each nonnegative value below max
    pos = v[(v >= 0) & (v < fmt.max)]
    gaps = np.asarray(fmt.next_up(pos)) - pos
    assert np.array_equal(np.asarray(fmt.ulp(pos)), gaps)


def test_next_up_past_max_and_between_values() -> None:
    f = fpsim.fp16
    assert f.next_up(65504.0) == math.inf
    assert f.next_up(1.0001) == 1.0 + 2**-10
    assert f.next_down(1.0) == 1 - 2**-11
    assert f.next_up(-0.0) == 2.0**-24
    assert fpsim.fp8_e4m3.next_up(448.0) != fpsim.fp8_e4m3.next_up(448.0)  # NaN: no infinity


def test_one_plus_eps() -> None:
    for f in (fpsim.fp16, fpsim.bf16, fpsim.fp8_e4m3, fpsim.tf32):
        assert fpsim.round(1 + f.eps, f) == 1 + f.eps
        assert fpsim.round(1 + f.eps / 2, f) == 1.0  # a tie, to even


def test_parse_names_aliases_dtypes() -> None:
    assert fpsim.as_format("BF16") is fpsim.bf16
    assert fpsim.as_format("float8_e4m3fn") is fpsim.fp8_e4m3
    assert fpsim.as_format("float8_e4m3") is fpsim.fp8_e4m3_ieee  # ml_dtypes' IEEE-style e4m3, not OCP
    assert fpsim.as_format(np.float16) is fpsim.fp16
    assert fpsim.as_format(ml_dtypes.bfloat16) is fpsim.bf16
    assert fpsim.as_format(np.dtype(ml_dtypes.float8_e5m2fnuz)) is fpsim.fp8_e5m2fnuz


def test_unknown_format_lists_valid() -> None:
    with pytest.raises(ValueError, match="valid names: fp64, fp32"):
        fpsim.as_format("fp7")
    with pytest.raises(TypeError):
        fpsim.as_format(3.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no fpsim format"):
        fpsim.as_format(np.int32)


def test_custom_formats() -> None:
    f = fpsim.Format("e5m7", ebits=5, mbits=7)
    assert (f.p, f.emin, f.emax, f.width) == (8, -14, 15, 13)
    assert fpsim.round(1 + 2**-8, f) == 1.0
    g = fpsim.Format("e3m2_noinf", 3, 2, has_inf=False, nan="none")
    assert g.max == 28.0
    with pytest.raises(ValueError, match="ebits"):
        fpsim.Format("bad", 0, 3)
    with pytest.raises(ValueError, match="NaN encoding"):
        fpsim.Format("bad", 4, 3, nan="sometimes")
    with pytest.raises(TypeError):
        fpsim.Format("bad", 4.0, 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="already names"):
        fpsim.register(fpsim.Format("fp16", 5, 9))


def test_repr_html_and_describe() -> None:
    html = fpsim.fp8_e4m3._repr_html_()
    assert "exponent (4)" in html and "mantissa (3)" in html and "448" in html
    d = fpsim.e8m0.describe()
    assert d["layout"] == "0-8-0" and d["nan"].startswith("0xFF")
