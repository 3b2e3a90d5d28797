"""Golden vectors (issue 29 §3): fpsim.testing.write_vectors / ``fpsim vectors``.

The files are read back by a reader written here from the documented layout alone (struct over the
packed little-endian records, hashlib over the bytes, json for the manifest: neither numpy's loader nor
fpsim's arrays), for every format. The records must then agree (0 differences) with fpsim.round and
fpsim.bits, and, independently, with NumPy's float16 cast and ml_dtypes' casts wherever those exist for
the format and mode (ml_dtypes 0.7: round to nearest even; overflow as each type defines it).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
from typing import Any

import numpy as np
import pytest

import fpsim
from fpsim.bits import to_bits
from fpsim.testing import write_vectors

from _versions import ML_DTYPES_E8M0_SUBNORMAL_DEFECT, ML_DTYPES_E8M0_TIES_DEFECT

FORMATS = [pytest.param(f, marks=pytest.mark.slow) if f == "tf32" else f  # tf32: 2.2 M records, ~25 s
           for f in fpsim.format_names() if f != "fp64"]
N_RANDOM = 4096


def _read(d: str) -> tuple[dict[str, Any], dict[str, list[tuple[int, ...]]]]:
    """The independent reader: manifest, SHA-256 check of every file, records via struct."""
    with open(os.path.join(d, "manifest.json"), encoding="utf-8") as fh:
        man = json.load(fh)
    for name, digest in man["sha256"].items():
        with open(os.path.join(d, name), "rb") as fh:
            data = fh.read()
        assert hashlib.sha256(data).hexdigest() == digest, name
        assert len(data) == man["sizes"][name]
    out: dict[str, list[tuple[int, ...]]] = {}
    for table, t in man["tables"].items():
        code = {"u64": "Q", "u32": "I"}
        fmt = "<" + "".join(code[f["type"]] for f in t["fields"])
        assert struct.calcsize(fmt) == t["record_bytes"]
        with open(os.path.join(d, f"{table}.bin"), "rb") as fh:
            data = fh.read()
        assert len(data) == t["records"] * t["record_bytes"]
        out[table] = list(struct.iter_unpack(fmt, data))
        # the .npy holds the same bytes after its header (format 1.0/2.0/3.0: magic, version, header)
        with open(os.path.join(d, f"{table}.npy"), "rb") as fh:
            npy = fh.read()
        assert npy[:6] == b"\x93NUMPY"
        hlen = struct.unpack("<H", npy[8:10])[0] if npy[6] == 1 else struct.unpack("<I", npy[8:12])[0]
        assert npy[(10 if npy[6] == 1 else 12) + hlen:] == data
    return man, out


def _f64(bits: int) -> float:
    return float(struct.unpack("<d", struct.pack("<Q", bits))[0])


def _f32(bits: int) -> float:
    return float(struct.unpack("<f", struct.pack("<I", bits))[0])


_ML = {"bf16": "bfloat16", "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2",
       "fp8_e4m3fnuz": "float8_e4m3fnuz", "fp8_e5m2fnuz": "float8_e5m2fnuz", "fp6_e2m3": "float6_e2m3fn",
       "fp6_e3m2": "float6_e3m2fn", "fp4_e2m1": "float4_e2m1fn", "fp8_e3m4": "float8_e3m4",
       "fp8_e4m3_ieee": "float8_e4m3", "fp8_e4m3b11fnuz": "float8_e4m3b11fnuz", "e8m0": "float8_e8m0fnu"}


def _same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return ((a == b) & (np.signbit(a) == np.signbit(b))) | (np.isnan(a) & np.isnan(b))


@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip_every_format(fmt: str, tmp_path: Any) -> None:
    man = write_vectors(fmt, tmp_path, n_random=N_RANDOM, seed=3)
    man2, recs = _read(str(tmp_path))
    assert man2 == json.loads(json.dumps(man))
    f = fpsim.as_format(fmt)
    assert man2["format"]["width_bits"] == f.width and man2["fpsim_version"] == fpsim.__version__
    # decode table: every code, once, in order; value = fpsim's decode
    if "decode" in recs:
        dec = recs["decode"]
        assert [r[0] for r in dec] == list(range(1 << f.width))
        got = np.array([_f64(r[2]) for r in dec])
        want = np.asarray(fpsim.bits.from_bits(np.arange(1 << f.width), f), dtype=np.float64)
        assert int((~_same(got, want)).sum()) == 0
        g32 = np.array([_f32(r[1]) for r in dec])
        assert int((~_same(g32, got.astype(np.float32).astype(np.float64))).sum()) == 0
    # cast table: outputs = fpsim.round / fpsim.bits of the inputs read back
    cast = recs["cast"]
    in32 = man2["tables"]["cast"]["input_dtype"] == "float32"
    raw = np.array([r[0] for r in cast], dtype=np.uint64)
    x = raw.astype(np.uint32).view(np.float32) if in32 else raw.view(np.float64)
    val = np.array([_f64(r[1]) for r in cast])
    code = np.array([r[2] for r in cast], dtype=np.uint64)
    cats = man2["tables"]["cast"]["categories"]
    counts = {c: sum(1 for r in cast if r[3] == i) for i, c in enumerate(cats)}
    assert counts == man2["tables"]["cast"]["counts"] and sum(counts.values()) == len(cast)
    with np.errstate(all="ignore"):
        want_v = np.asarray(fpsim.round(x, f, "rne"), dtype=np.float64)
        want_c = np.asarray(to_bits(x, f, "rne")).astype(np.uint64)
    assert int((~_same(val, want_v)).sum()) == 0
    assert int((code != want_c).sum()) == 0
    # every tie category present where the format has ties
    assert counts["tie"] > 0 and counts["tie_minus_ulp"] == counts["tie"] == counts["tie_plus_ulp"]


@pytest.mark.parametrize("fmt", ["fp16"] + sorted(_ML))
def test_against_numpy_and_ml_dtypes(fmt: str, tmp_path: Any) -> None:
    """The independent oracle: NumPy's float16 cast, ml_dtypes' casts (RNE). Compared on every record
    whose input the oracle handles with the same overflow rule (ml_dtypes types without inf turn an
    overflow into NaN or saturate as the type defines; records beyond the range are compared only where
    the format has inf, as IEEE does)."""
    if fmt == "fp16":
        cast = lambda a: a.astype(np.float16).astype(np.float64)  # noqa: E731
    else:
        ml_dtypes = pytest.importorskip("ml_dtypes")
        t = getattr(ml_dtypes, _ML[fmt], None)
        if t is None:
            pytest.skip(f"ml_dtypes {ml_dtypes.__version__} has no {_ML[fmt]}")
        cast = lambda a: a.astype(t).astype(np.float64)  # noqa: E731
    write_vectors(fmt, tmp_path, n_random=N_RANDOM, seed=4)
    _, recs = _read(str(tmp_path))
    raw = np.array([r[0] for r in recs["cast"]], dtype=np.uint64).astype(np.uint32)
    x = raw.view(np.float32)
    val = np.array([_f64(r[1]) for r in recs["cast"]])
    f = fpsim.as_format(fmt)
    with np.errstate(all="ignore"):
        fin = np.isfinite(x)
        keep = fin & (np.abs(x.astype(np.float64)) <= f.max)
        if f.has_inf:
            keep |= fin
        if fmt == "e8m0":
            keep &= x > 0  # e8m0 has no sign and no zero: ml_dtypes and fpsim define those casts differently
            # defects of older ml_dtypes, by version (tests/_versions.py; MPFR sides with fpsim)
            if ML_DTYPES_E8M0_TIES_DEFECT:
                keep &= np.frexp(x.astype(np.float64))[0] != 0.75  # the ties 1.5 * 2**k
            if ML_DTYPES_E8M0_SUBNORMAL_DEFECT:
                keep &= np.abs(x) >= np.finfo(np.float32).tiny
        want = cast(x[keep])
    bad = int((~_same(val[keep], want)).sum())
    assert keep.sum() > 1000
    assert bad == 0, f"{bad} of {int(keep.sum())} records differ from the oracle"


def test_modes_and_refusals(tmp_path: Any) -> None:
    m = write_vectors("fp8_e5m2", tmp_path / "a", rounding="rtz", overflow="saturate", n_random=10)
    assert m["modes"] == {"rounding": "rtz", "overflow": "saturate"}
    _, recs = _read(str(tmp_path / "a"))
    x = np.array([r[0] for r in recs["cast"]], dtype=np.uint64).astype(np.uint32).view(np.float32)
    val = np.array([_f64(r[1]) for r in recs["cast"]])
    with np.errstate(all="ignore"):
        assert int((~_same(val, np.asarray(fpsim.round(x, "fp8_e5m2", "rtz", overflow="saturate"),
                                           dtype=np.float64))).sum()) == 0
    with pytest.raises(ValueError, match="rounding"):
        write_vectors("fp16", tmp_path, rounding="sr")
    with pytest.raises(ValueError, match="fp64"):
        write_vectors("fp64", tmp_path)
    with pytest.raises(ValueError, match="overflow"):
        write_vectors("fp16", tmp_path, overflow="wrap")
    assert not any(p.name.startswith(".tmp-") for p in tmp_path.rglob("*"))


def test_cli(tmp_path: Any, capsys: Any) -> None:
    from fpsim.cli import main

    assert main(["vectors", "fp4_e2m1", "--random", "50", "--out", str(tmp_path)]) == 0
    assert "cast:" in capsys.readouterr().out
    man, recs = _read(str(tmp_path))
    assert len(recs["decode"]) == 16 and man["format"]["name"] == "fp4_e2m1"
    assert not math.isnan(_f64(recs["cast"][0][1]))


GEMM_PRESETS = [("a100", "fp16", "fp32"), ("a100", "bf16", "fp32"), ("v100", "fp16", "fp32"),
                ("h100", "fp8_e4m3", "fp32"), ("ada", "fp8_e5m2", "fp32"), ("a100", "fp16", "fp16")]


def _read_gemm(d: str) -> tuple[dict[str, Any], list[tuple[list[int], list[int], int, int, int]]]:
    with open(os.path.join(d, "manifest.json"), encoding="utf-8") as fh:
        man = json.load(fh)
    for name, digest in man["sha256"].items():
        with open(os.path.join(d, name), "rb") as fh:
            assert hashlib.sha256(fh.read()).hexdigest() == digest, name
    t = man["tables"]["gemm"]
    k = t["K"]
    fmt = f"<{k}I{k}IIII"
    assert struct.calcsize(fmt) == t["record_bytes"]
    with open(os.path.join(d, "gemm.bin"), "rb") as fh:
        data = fh.read()
    rows = []
    for r in struct.iter_unpack(fmt, data):
        rows.append((list(r[:k]), list(r[k:2 * k]), r[2 * k], r[2 * k + 1], r[2 * k + 2]))
    assert len(rows) == t["records"]
    return man, rows


@pytest.mark.parametrize("dev,inp,out", GEMM_PRESETS)
def test_gemm_vectors_against_mmasim(dev: str, inp: str, out: str, tmp_path: Any) -> None:
    """--gemm rows read back independently, then D recomputed by MMA-Sim (an independent simulator of
    the same instruction) from the decoded A, B, C: 0 differences; and by fpsim.mma.dot."""
    pytest.importorskip("torch")
    pytest.importorskip("mmasim.nv_ptx.sim")
    from test_mma_mmasim_nvidia import mmasim_dpa

    from fpsim.testing.vectors import write_gemm_vectors

    preset = f"{dev}:{inp}:{out}"
    man = write_gemm_vectors(preset, tmp_path, rows=150, seed=9)
    man2, rows = _read_gemm(str(tmp_path))
    assert man2["sha256"] == man["sha256"] and man2["kind"] == "gemm"
    a = np.asarray(fpsim.bits.from_bits(np.array([r[0] for r in rows], dtype=np.uint64), inp), dtype=np.float64)
    b = np.asarray(fpsim.bits.from_bits(np.array([r[1] for r in rows], dtype=np.uint64), inp), dtype=np.float64)
    c = np.asarray(fpsim.bits.from_bits(np.array([r[2] for r in rows], dtype=np.uint64), out), dtype=np.float64)
    d = np.asarray(fpsim.bits.from_bits(np.array([r[3] for r in rows], dtype=np.uint64), out), dtype=np.float64)
    ref = mmasim_dpa(dev, inp, out, None, a, b, c)
    bad = int((~_same(d, ref)).sum())
    assert bad == 0, f"{bad} of {len(rows)} rows differ from MMA-Sim"
    from fpsim.mma import dot as mma_dot
    assert int((~_same(d, np.asarray(mma_dot(a, b, c, preset), dtype=np.float64))).sum()) == 0
    cats = man2["tables"]["gemm"]["counts"]
    assert all(v == 150 for v in cats.values()) and len(cats) == 6


def test_cli_refusals(tmp_path: Any, capsys: Any) -> None:
    from fpsim.cli import main

    assert main(["vectors", "--out", str(tmp_path)]) == 2
    assert "FORMAT" in capsys.readouterr().err
    assert main(["vectors", "fp99", "--out", str(tmp_path)]) == 2
    assert "valid names" in capsys.readouterr().err
    assert main(["vectors", "--gemm", "nope:fp16", "--out", str(tmp_path)]) == 2
    assert not list(tmp_path.iterdir())
