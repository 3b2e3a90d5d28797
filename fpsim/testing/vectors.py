"""Golden vectors: the casts into a format as files a C, C++, Rust or JS test suite reads without fpsim.

``write_vectors(fmt, out_dir)`` (and ``fpsim vectors FORMAT --out DIR``) writes two tables:

- ``decode``: every code of the format (formats up to 19 bits wide: fp16, bf16, tf32, every fp8, fp6,
  fp4, e8m0) with its value as float32 and float64 bits;
- ``cast``: inputs (float32 bit patterns; float64 for a cast into fp32) and what the cast into the format
  gives, in the chosen rounding and overflow modes: the output code and the value as float64 bits. The
  inputs are every value of the format, every tie (the midpoint of two neighbours, and the overflow tie
  above the largest value), each tie one input ulp below and above, the range edges, zeros, float32
  subnormals, infinities, NaNs with several payloads and signs, and a seeded random sample of bit patterns.

Each table goes to ``NAME.bin`` (packed little-endian fixed records) and ``NAME.npy`` (the same records as
a NumPy structured array), and ``manifest.json`` says what is where: fpsim's version, the format's
layout, the modes, the record layout, the counts per category and the SHA-256 of every file. Every file is
written to a temporary name beside its target and moved into place (``os.replace``), the manifest last.
``write_gemm_vectors(preset, out_dir)`` (``fpsim vectors --gemm PRESET``) writes (A, B, C, D) rows of
a matrix-unit preset the same way: random rows and adversarial ones (cancellation, alignment shifts,
subnormals, overflow, a dominant C). ``docs/golden-vectors.md`` documents the layout for a reader in
another language.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from typing import Any

import numpy as np

from .._fpenv import ieee_mode
from .._names import parse_name
from ..bits import from_bits, to_bits
from ..formats import Format, as_format
from ..rounding import round as _round

__all__ = ["write_vectors", "write_gemm_vectors", "CAST_DTYPE", "DECODE_DTYPE", "CATEGORIES", "GEMM_CATEGORIES"]

#: One cast record, 24 bytes: the input's bits (float32 zero-extended, or float64), the output value as
#: float64 bits, the output code, the input's category (an index into CATEGORIES).
CAST_DTYPE = np.dtype([("input_bits", "<u8"), ("output_f64_bits", "<u8"), ("output_code", "<u4"),
                       ("category", "<u4")])
#: One decode record, 16 bytes: the code, its value as float32 bits, as float64 bits.
DECODE_DTYPE = np.dtype([("code", "<u4"), ("f32_bits", "<u4"), ("f64_bits", "<u8")])
#: Categories of cast inputs, by index.
CATEGORIES = ("value", "tie", "tie_minus_ulp", "tie_plus_ulp", "edge", "zero", "subnormal", "infinity", "nan",
              "random")
_CAT = {c: i for i, c in enumerate(CATEGORIES)}
#: float32 NaNs with different payloads, quiet and signalling, both signs.
_NAN32 = (0x7FC00000, 0x7FC00001, 0x7FFFFFFF, 0x7F800001, 0x7FA00000, 0x7FBFFFFF, 0xFFC00000, 0xFF800001,
          0xFFFFFFFF, 0xFFA5A5A5)
_NAN64 = (0x7FF8000000000000, 0x7FF8000000000001, 0x7FFFFFFFFFFFFFFF, 0x7FF0000000000001,
          0xFFF8000000000000, 0xFFF0000000000001)
_MAX_DECODE_BITS = 19  # tf32: 524,288 codes; fp32 and fp64 have no exhaustive table


def _write_atomic(path: str, data: bytes) -> None:
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        um = os.umask(0)
        os.umask(um)
        os.chmod(tmp, 0o666 & ~um)  # mkstemp makes 0600; the vectors are for others to read
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _npy_bytes(a: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()


def _spec(f: Format) -> dict[str, Any]:
    d = f.describe()
    return {"name": f.name, "width_bits": f.width, "exponent_bits": f.ebits, "mantissa_bits": f.mbits,
            "bias": f.bias, "signed": bool(f.signed), "subnormals": bool(f.subnormals), "inf": str(d["inf"]),
            "nan": str(d["nan"]), "max": float(f.max), "min_normal": float(f.min_normal),
            "min_subnormal": float(f.min_subnormal) if f.min_subnormal else None}


def _finite_values(f: Format) -> np.ndarray:
    """Every finite value of the format (codes decoded), float64, -0 included once."""
    v = np.asarray(from_bits(np.arange(1 << f.width, dtype=np.uint64), f), dtype=np.float64)
    v = v[np.isfinite(v)]
    return np.unique(v)


def _f32(x: np.ndarray) -> np.ndarray:
    """The float64 values that float32 holds exactly, as float32."""
    with np.errstate(over="ignore"):
        y = x.astype(np.float32)
    return np.asarray(y[y.astype(np.float64) == x])


def _inputs32(f: Format, rng: np.random.Generator, n_random: int) -> tuple[np.ndarray, np.ndarray]:
    """float32 cast inputs for a format up to 19 bits wide, with their categories."""
    vals = _finite_values(f)
    pos = vals[vals >= 0]
    parts: list[tuple[np.ndarray, str]] = [(_f32(vals), "value")]
    top = float(f.max) + (float(f.max) - float(pos[-2])) / 2 if pos.size > 1 else float(f.max) * 1.5
    ties64 = np.concatenate([(pos[:-1] + pos[1:]) / 2, [top]])  # and the overflow tie above the largest
    ties64 = np.concatenate([ties64, -ties64]) if f.signed else ties64
    ties = _f32(ties64)
    parts += [(ties, "tie"), (np.nextafter(ties, np.float32(-np.inf)), "tie_minus_ulp"),
              (np.nextafter(ties, np.float32(np.inf)), "tie_plus_ulp")]
    fi = np.finfo(np.float32)
    edges = [float(f.max), float(f.min_normal), float(pos[pos > 0][0]), float(pos[pos > 0][0]) / 2,
             float(f.max) * 2, float(fi.max), float(fi.tiny), float(fi.smallest_subnormal), 1.0]
    e = _f32(np.array(edges, dtype=np.float64))
    e = np.concatenate([e, np.nextafter(e, np.float32(-np.inf)), np.nextafter(e, np.float32(np.inf))])
    parts += [(np.concatenate([e, -e]), "edge"), (np.array([0.0, -0.0], np.float32), "zero")]
    sub_bits = np.concatenate([np.uint32(1) << np.arange(23, dtype=np.uint32),
                               rng.integers(1, 1 << 23, 64, dtype=np.uint32)])
    sub = sub_bits.view(np.float32)
    parts += [(np.concatenate([sub, -sub]), "subnormal"),
              (np.array([np.inf, -np.inf], np.float32), "infinity")]
    if f.has_nan:
        parts.append((np.array(_NAN32, dtype=np.uint32).view(np.float32), "nan"))
    r = np.frombuffer(rng.bytes(4 * n_random), dtype="<u4").view(np.float32)
    if not f.has_nan:
        r = r[~np.isnan(r)]  # the format cannot hold a NaN: a cast of one is an error, not a vector
    parts.append((r, "random"))
    x = np.concatenate([p for p, _ in parts]).astype(np.float32)
    cat = np.concatenate([np.full(p.size, _CAT[c], np.uint32) for p, c in parts])
    return x, cat


def _inputs64(f: Format, rng: np.random.Generator, n_random: int) -> tuple[np.ndarray, np.ndarray]:
    """float64 cast inputs for fp32: a seeded sample of float32 values (no exhaustive table: 2**32), each
    with its tie to the next float32 and one float64 ulp either side, plus edges and specials."""
    v = np.frombuffer(rng.bytes(4 * n_random), dtype="<u4").view(np.float32)
    v = v[np.isfinite(v) & (np.abs(v) < np.finfo(np.float32).max)]
    nxt = np.nextafter(v, np.float32(np.inf))
    ties = (v.astype(np.float64) + nxt.astype(np.float64)) / 2
    fi = np.finfo(np.float32)
    top = float(fi.max) + float(np.spacing(fi.max)) / 2
    e = np.array([float(fi.max), top, float(fi.tiny), float(fi.smallest_subnormal),
                  float(fi.smallest_subnormal) / 2, 1.0, 1e300, 1e-300], dtype=np.float64)
    e = np.concatenate([e, np.nextafter(e, -np.inf), np.nextafter(e, np.inf)])
    parts = [(v.astype(np.float64), "value"), (ties, "tie"), (np.nextafter(ties, -np.inf), "tie_minus_ulp"),
             (np.nextafter(ties, np.inf), "tie_plus_ulp"), (np.concatenate([e, -e]), "edge"),
             (np.array([0.0, -0.0]), "zero"),
             (np.array([5e-324, 1e-310, -5e-324]), "subnormal"), (np.array([np.inf, -np.inf]), "infinity"),
             (np.array(_NAN64, dtype=np.uint64).view(np.float64), "nan"),
             (np.frombuffer(rng.bytes(8 * n_random), dtype="<u8").view(np.float64), "random")]
    x = np.concatenate([p for p, _ in parts])
    cat = np.concatenate([np.full(p.size, _CAT[c], np.uint32) for p, c in parts])
    return x, cat


def _canon_bits(v: np.ndarray) -> np.ndarray:
    """float64 bits of the values, every NaN as the one quiet NaN 0x7FF8000000000000."""
    b = np.ascontiguousarray(v, dtype=np.float64).view(np.uint64).copy()
    b[np.isnan(v)] = np.uint64(0x7FF8000000000000)
    return np.asarray(b)


@ieee_mode
def write_vectors(fmt: Any, out_dir: str | os.PathLike[str], *, rounding: str = "rne", overflow: str = "ieee",
                  n_random: int = 65536, seed: int = 0) -> dict[str, Any]:
    """Write the golden vectors of the casts into ``fmt`` to ``out_dir`` (created if absent).

    Parameters
    ----------
    fmt : Format or str
        Target format: any of ``fpsim.format_names()`` but fp64 (a cast of float64 into fp64 rounds
        nothing). Formats up to 19 bits get the exhaustive decode table and every tie; fp32 gets a seeded
        sample of float64 inputs around ``n_random`` float32 values.
    out_dir : path
        Folder for ``decode.bin/.npy``, ``cast.bin/.npy`` and ``manifest.json``.
    rounding : {"rne", "rna", "rtz", "rup", "rdn", "rto"}
        Rounding mode of the cast (stochastic rounding has no fixed answer to write down).
    overflow : {"ieee", "saturate"}
        Overflow policy (see :func:`fpsim.round`).
    n_random : int
        Random input bit patterns (default 65,536), from ``numpy.random.default_rng(seed)``.
    seed : int
        Seed of the random inputs.

    Returns
    -------
    dict
        The manifest (also in ``out_dir/manifest.json``).

    Examples
    --------
    >>> import json, os, tempfile
    >>> from fpsim.testing import write_vectors
    >>> d = tempfile.mkdtemp()
    >>> m = write_vectors("fp4_e2m1", d, n_random=100)
    >>> m["tables"]["decode"]["records"], sorted(os.listdir(d))
    (16, ['cast.bin', 'cast.npy', 'decode.bin', 'decode.npy', 'manifest.json'])
    >>> m["tables"]["cast"]["record_bytes"], m["tables"]["cast"]["fields"][0]
    (24, {'name': 'input_bits', 'type': 'u64', 'offset': 0})
    """
    f = as_format(fmt)
    rounding = parse_name(rounding, ("rne", "rna", "rtz", "rup", "rdn", "rto"), "rounding mode")
    overflow = parse_name(overflow, ("ieee", "saturate"), "overflow policy")
    if isinstance(n_random, (bool, np.bool_)) or not isinstance(n_random, (int, np.integer)) or n_random < 0:
        raise ValueError(f"n_random must be an int >= 0, got {n_random!r}")
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}: {seed!r}")
    if f.name == "fp64":
        raise ValueError("fp64 has no golden cast vectors: the inputs are float64, so nothing rounds; valid "
                         "formats: every other of fpsim.format_names()")
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(int(seed))
    tables: dict[str, dict[str, Any]] = {}
    files: dict[str, bytes] = {}

    if f.width <= _MAX_DECODE_BITS:
        codes = np.arange(1 << f.width, dtype=np.uint64)
        v = np.asarray(from_bits(codes, f), dtype=np.float64)
        dec = np.zeros(codes.size, DECODE_DTYPE)
        dec["code"] = codes.astype(np.uint32)
        with np.errstate(over="ignore"):
            v32 = v.astype(np.float32)
        b32 = v32.view(np.uint32).copy()
        b32[np.isnan(v32)] = np.uint32(0x7FC00000)
        dec["f32_bits"] = b32
        dec["f64_bits"] = _canon_bits(v)
        files["decode.bin"] = dec.tobytes()
        files["decode.npy"] = _npy_bytes(dec)
        tables["decode"] = {"records": int(dec.size), "record_bytes": DECODE_DTYPE.itemsize,
                            "fields": _fields(DECODE_DTYPE), "files": ["decode.bin", "decode.npy"]}

    if f.width <= _MAX_DECODE_BITS:
        x, cat = _inputs32(f, rng, int(n_random))
        in_bits = x.view(np.uint32).astype(np.uint64)
        in_dtype = "float32"
    else:
        x, cat = _inputs64(f, rng, int(n_random))
        in_bits = x.view(np.uint64)
        in_dtype = "float64"
    with np.errstate(all="ignore"):
        val = np.asarray(_round(x, f, rounding, overflow=overflow), dtype=np.float64)
        code = np.asarray(to_bits(x, f, rounding, overflow=overflow)).astype(np.uint64)
    cast = np.zeros(x.size, CAST_DTYPE)
    cast["input_bits"] = in_bits
    cast["output_f64_bits"] = _canon_bits(val)
    cast["output_code"] = code.astype(np.uint32)
    cast["category"] = cat
    files["cast.bin"] = cast.tobytes()
    files["cast.npy"] = _npy_bytes(cast)
    counts = {c: int(np.sum(cat == i)) for i, c in enumerate(CATEGORIES)}
    tables["cast"] = {"records": int(cast.size), "record_bytes": CAST_DTYPE.itemsize,
                      "fields": _fields(CAST_DTYPE), "files": ["cast.bin", "cast.npy"], "input_dtype": in_dtype,
                      "categories": list(CATEGORIES), "counts": counts}

    from .. import __version__

    for name, data in files.items():
        _write_atomic(os.path.join(out_dir, name), data)
    manifest = {
        "fpsim_version": str(__version__), "kind": "cast", "format": _spec(f),
        "modes": {"rounding": rounding, "overflow": overflow}, "seed": int(seed), "n_random": int(n_random),
        "byte_order": "little", "nan_canonical_f64_bits": "0x7ff8000000000000",
        "tables": tables,
        "sha256": {name: hashlib.sha256(data).hexdigest() for name, data in files.items()},
        "sizes": {name: len(data) for name, data in files.items()},
    }
    _write_atomic(os.path.join(out_dir, "manifest.json"), json.dumps(manifest, indent=2).encode())
    return manifest


def _fields(dt: np.dtype) -> list[dict[str, Any]]:
    assert dt.names is not None and dt.fields is not None
    return [{"name": n, "type": f"u{dt.fields[n][0].itemsize * 8}", "offset": int(dt.fields[n][1])}
            for n in dt.names]


def register_cli(subparsers: Any) -> None:
    """``fpsim vectors FORMAT [--rounding MODE] [--overflow POLICY] --out DIR``."""
    s = subparsers.add_parser(
        "vectors", help="write golden vectors of the casts into a format (binary, .npy, JSON manifest)",
        description="Write the exhaustive decode table and the cast vectors (every value, tie, tie +- 1 ulp, "
                    "edge, special and a seeded random sample) of a format, as packed little-endian records "
                    "and .npy, with a JSON manifest (layout, counts, SHA-256): docs/golden-vectors.md.")
    s.add_argument("format", metavar="FORMAT", nargs="?", default=None,
                   help="target format (fpsim formats lists them; not fp64); omit with --gemm")
    s.add_argument("--gemm", default=None, metavar="PRESET",
                   help="write (A, B, C, D) rows of a matrix-unit preset instead ('a100:fp16:fp32'; fpsim devices)")
    s.add_argument("--rows", type=int, default=1000, metavar="N", help="--gemm rows per category (default 1000)")
    s.add_argument("--rounding", "-r", default="rne", metavar="MODE",
                   help="rounding mode (default rne): rne, rna, rtz, rup, rdn, rto")
    s.add_argument("--overflow", default="ieee", metavar="POLICY", help="overflow policy: ieee (default), saturate")
    s.add_argument("--random", type=int, default=65536, metavar="N", help="random input patterns (default 65536)")
    s.add_argument("--seed", type=int, default=0, metavar="S", help="seed of the random inputs (default 0)")
    s.add_argument("--out", required=True, metavar="DIR", help="output folder (created if absent)")
    s.set_defaults(func=_cmd_vectors)


def _cmd_vectors(args: Any) -> int:
    if (args.gemm is None) == (args.format is None):
        raise ValueError("give a FORMAT (cast vectors) or --gemm PRESET (matrix-unit rows), not both or neither")
    if args.gemm is not None:
        m = write_gemm_vectors(args.gemm, args.out, rows=args.rows, seed=args.seed)
        t = m["tables"]["gemm"]
        print(f"gemm: {t['records']:,} rows of K = {t['K']} ({t['record_bytes']} bytes) -> "
              f"{', '.join(os.path.join(args.out, x) for x in t['files'])}")
        print(f"manifest: {os.path.join(args.out, 'manifest.json')}")
        return 0
    m = write_vectors(args.format, args.out, rounding=args.rounding, overflow=args.overflow,
                      n_random=args.random, seed=args.seed)
    for name, t in m["tables"].items():
        print(f"{name}: {t['records']:,} records of {t['record_bytes']} bytes -> "
              f"{', '.join(os.path.join(args.out, x) for x in t['files'])}")
    print(f"manifest: {os.path.join(args.out, 'manifest.json')}")
    return 0


GEMM_CATEGORIES = ("random", "cancellation", "alignment", "subnormal", "overflow", "c_dominant")


def _gemm_inputs(model: Any, rows: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                                            np.ndarray]:
    """float64 (a, b, c, category) rows before rounding into the model's formats: ``rows`` of each
    category. Adversarial kinds: cancellation (products in +-pairs plus a small remainder), alignment
    shifts (one product 2**s times larger than the rest, s over the accumulator's width and beyond),
    subnormal inputs, overflow (products near the output's largest value), and a C that dwarfs the sum."""
    fin, fout = model.input, model.output
    k = int(model.k)
    emax_in = int(np.floor(np.log2(float(fin.max))))
    parts = []
    for ci, kind in enumerate(GEMM_CATEGORIES):
        a = rng.standard_normal((rows, k))
        b = rng.standard_normal((rows, k))
        c = rng.standard_normal(rows)
        if kind == "cancellation":
            h = k // 2
            b[:, h:2 * h] = -b[:, :h] * np.where(rng.random((rows, 1)) < 0.5, 1.0, 1.0 + 2.0**-6)
            a[:, h:2 * h] = a[:, :h]
            c = c * 2.0**-12
        elif kind == "alignment":
            s = rng.integers(0, 2 * (fout.mbits + 4), rows)
            a[:, 0] = np.exp2(np.minimum(s // 2, emax_in - 1)) * np.sign(a[:, 0])
            b[:, 0] = np.exp2(np.minimum(s - s // 2, emax_in - 1)) * np.sign(b[:, 0])
        elif kind == "subnormal":
            tiny = float(fin.min_subnormal) if fin.min_subnormal else float(fin.min_normal)
            a = np.round(a * 4) * tiny
            c = c * float(fout.min_normal)
        elif kind == "overflow":
            big = float(np.sqrt(float(fout.max) / k)) * 1.5
            a = np.sign(a) * min(big, float(fin.max)) * (1 - rng.random((rows, k)) / 4)
            b = np.sign(b) * min(big, float(fin.max)) * (1 - rng.random((rows, k)) / 4)
        elif kind == "c_dominant":
            c = c * 2.0 ** min(40, int(np.log2(float(fout.max))) - 2)
        parts.append((a, b, c, np.full(rows, ci, np.uint32)))
    a = np.concatenate([p[0] for p in parts])
    b = np.concatenate([p[1] for p in parts])
    c = np.concatenate([p[2] for p in parts])
    cat = np.concatenate([p[3] for p in parts])
    return a, b, c, cat


@ieee_mode
def write_gemm_vectors(preset: str, out_dir: str | os.PathLike[str], *, rows: int = 1000,
                       seed: int = 0) -> dict[str, Any]:
    """Write (A, B, C, D) rows of a matrix-unit preset: ``D = C + sum_k a[k] * b[k]`` over one block of
    ``K = model.k`` terms, as :func:`fpsim.mma.dot` computes it under the preset.

    Parameters
    ----------
    preset : str
        ``"device:input[:output]"`` as :func:`fpsim.mma.as_model` takes it (``"a100:fp16:fp32"``).
    out_dir : path
        Folder for ``gemm.bin``, ``gemm.npy`` and ``manifest.json``.
    rows : int
        Rows per category (random, cancellation, alignment, subnormal, overflow, c_dominant).
    seed : int
        Seed of the rows.

    Returns
    -------
    dict
        The manifest.

    Examples
    --------
    >>> import tempfile
    >>> from fpsim.testing.vectors import write_gemm_vectors
    >>> m = write_gemm_vectors("a100:fp16:fp32", tempfile.mkdtemp(), rows=10)
    >>> m["tables"]["gemm"]["records"], m["tables"]["gemm"]["K"], m["tables"]["gemm"]["record_bytes"]
    (60, 8, 76)
    """
    from ..mma import as_model
    from ..mma import dot as _mma_dot

    if not isinstance(preset, str):
        raise TypeError(f"preset must be a string 'device:input[:output]', got {type(preset).__name__}: {preset!r}")
    model = as_model(preset)
    if isinstance(rows, (bool, np.bool_)) or not isinstance(rows, (int, np.integer)) or rows < 1:
        raise ValueError(f"rows must be an int >= 1, got {rows!r}")
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}: {seed!r}")
    fin, fout = model.input, model.output
    if fin.width > 32 or fout.width > 32:
        raise ValueError(f"gemm vectors hold inputs and outputs of up to 32 bits; {model.name} has "
                         f"{fin.name} -> {fout.name}")
    k = int(model.k)
    a64, b64, c64, cat = _gemm_inputs(model, int(rows), np.random.default_rng(int(seed)))
    with np.errstate(all="ignore"):
        a = np.asarray(_round(a64, fin, "rne", overflow="saturate"), dtype=np.float64)
        b = np.asarray(_round(b64, fin, "rne", overflow="saturate"), dtype=np.float64)
        c = np.asarray(_round(c64, fout, "rne", overflow="saturate"), dtype=np.float64)
        d = np.asarray(_mma_dot(a, b, c, model), dtype=np.float64)
        rec_dt = np.dtype([("a", "<u4", (k,)), ("b", "<u4", (k,)), ("c", "<u4"), ("d", "<u4"),
                           ("category", "<u4")])
        g = np.zeros(a.shape[0], rec_dt)
        g["a"] = np.asarray(to_bits(a, fin)).astype(np.uint32)
        g["b"] = np.asarray(to_bits(b, fin)).astype(np.uint32)
        g["c"] = np.asarray(to_bits(c, fout)).astype(np.uint32)
        g["d"] = np.asarray(to_bits(d, fout)).astype(np.uint32)
    g["category"] = cat
    files = {"gemm.bin": g.tobytes(), "gemm.npy": _npy_bytes(g)}
    from .. import __version__

    os.makedirs(out_dir, exist_ok=True)
    for name, data in files.items():
        _write_atomic(os.path.join(out_dir, name), data)
    fields = [{"name": "a", "type": "u32", "count": k, "offset": 0},
              {"name": "b", "type": "u32", "count": k, "offset": 4 * k},
              {"name": "c", "type": "u32", "offset": 8 * k}, {"name": "d", "type": "u32", "offset": 8 * k + 4},
              {"name": "category", "type": "u32", "offset": 8 * k + 8}]
    manifest = {
        "fpsim_version": str(__version__), "kind": "gemm", "preset": preset, "model": repr(model),
        "input_format": _spec(fin), "output_format": _spec(fout), "seed": int(seed),
        "byte_order": "little", "operation": "d = c + sum_k a[k] * b[k] (one block of K terms, fpsim.mma.dot)",
        "tables": {"gemm": {"records": int(g.size), "record_bytes": rec_dt.itemsize, "K": k, "fields": fields,
                            "files": list(files), "categories": list(GEMM_CATEGORIES),
                            "counts": {cn: int(np.sum(cat == i)) for i, cn in enumerate(GEMM_CATEGORIES)}}},
        "sha256": {name: hashlib.sha256(data).hexdigest() for name, data in files.items()},
        "sizes": {name: len(data) for name, data in files.items()},
    }
    _write_atomic(os.path.join(out_dir, "manifest.json"), json.dumps(manifest, indent=2).encode())
    return manifest
