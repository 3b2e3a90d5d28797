"""Audit a safetensors checkpoint for low-precision casts: which tensors survive FP8, MXFP4, NVFP4, ...?

``fpsim audit PATH`` (and :func:`audit_checkpoint`) reads a ``.safetensors`` file, or a sharded folder
with its ``*.safetensors.index.json``, tensor by tensor (small ones in batches), and for every *target*
(``FORMAT:SCALING``, e.g. ``fp8_e4m3:tensor``, ``fp4_e2m1:mx32``, ``fp4_e2m1:nvfp4``) reports per tensor
the amax, the shares of nonzero values that underflow to 0, become subnormal, or overflow (saturate, or
become inf/NaN), the SQNR and the max and RMS relative error, with a verdict and the tensors most at risk.
docs/audit.md documents every key, scaling and threshold.

Nothing in a file is trusted: every header (8-byte little-endian length, then JSON) is parsed here and
validated (dtypes, shapes, offsets, sizes, overlaps, bounds against the file size) for **all** files
before any tensor data is read; a bad file raises :class:`SafetensorsError` naming the file and the
tensor. Data is read with ``pread`` into buffers one band of rows at a time (never mapped: a file that
shrinks during an audit is an error naming it, not a SIGBUS) and processed in chunks, so memory stays
bounded by a chunk, never the model (never pickle, never the whole file). Only regular files are opened
(a FIFO or device is refused before ``open``, which would block on a FIFO).

Quantisation is :mod:`fpsim.scaling`'s (current scaling, per-channel, per-block, MX, NVFP4), each
rounding through :func:`fpsim.round`; this module only reads, chunks and counts. Tensors go to Dask
workers (:mod:`fpsim._dask`) as (path, offset, dtype, shape): each worker reads the file itself. Results
are identical to the serial run (same chunks, same order of every sum).

>>> import numpy as np, os, tempfile, fpsim.audit as A
>>> d = tempfile.mkdtemp()
>>> path = A.save_safetensors({"w": np.float32([[0.5, -3.0], [1e-3, 2e-9]])}, os.path.join(d, "m.safetensors"))
>>> rep = A.audit_checkpoint(path, targets=["fp8_e4m3:tensor"], workers=0)
>>> t = rep["tensors"][0]
>>> t["name"], t["dtype"], t["shape"], float(t["amax"])
('w', 'F32', [2, 2], 3.0)
>>> r = t["targets"]["fp8_e4m3:tensor"]
>>> r["underflow"], r["overflow"], r["verdict"]        # 2e-9 * 448/3 is far below E4M3's smallest value
(0.25, 0.0, 'risk')
"""

from __future__ import annotations

import json
import math
import os
import stat
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

import numpy as np

from . import scaling as S
from ._cliargs import json_text, printable
from ._fpenv import ieee_mode
from ._names import norm_name, parse_name
from .formats import Format, as_format, format_names
from .rounding import round as _fround
from .scaling._tensor import _presaturate

__all__ = [
    "AUDIT_JSON_VERSION",
    "DEFAULT_TARGETS",
    "DTYPES",
    "SCALINGS",
    "THRESHOLDS",
    "SafetensorsError",
    "Target",
    "TensorInfo",
    "at_risk",
    "audit_checkpoint",
    "audit_tensor",
    "format_table",
    "list_tensors",
    "parse_target",
    "plot_audit",
    "read_header",
    "register_cli",
    "save_safetensors",
    "to_json",
]

AUDIT_JSON_VERSION = 1

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

# Every dtype of the safetensors format (library 0.8) -> bits per element. F4 and F6 pack elements across
# bytes: a tensor of them must hold a whole number of bytes (as the library requires).
_DTYPE_BITS: dict[str, int] = {
    "F64": 64, "F32": 32, "F16": 16, "BF16": 16, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "F6_E2M3": 6, "F6_E3M2": 6, "F4": 4, "C64": 64,
    "I64": 64, "I32": 32, "I16": 16, "I8": 8, "U64": 64, "U32": 32, "U16": 16, "U8": 8, "BOOL": 8,
}
#: safetensors dtypes whose tensors are audited (the others, e.g. integer, complex, F4 or F8_E8M0 tensors,
#: are valid and listed as skipped, with their dtype).
DTYPES = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2")
_DTYPE_SIZES: dict[str, int] = {k: _DTYPE_BITS[k] // 8 for k in DTYPES}  # bytes per element of the audited

_HEADER_LIMIT = 100_000_000  # bytes: the safetensors library's own limit on the JSON header
_CHUNK = 1 << 17  # elements per chunk: the working set (a few dozen bytes per element) stays ~10 MB
_GROUP = 2  # whole-row chunks quantised and counted in one go in pass 2 (sums still per chunk: same bits)
_LARGE_BYTES = 256 << 20  # checkpoints at least this large get a LocalCluster when workers is not given


class SafetensorsError(ValueError):
    """A safetensors file (or sharded checkpoint index) that cannot be read: the message names the file
    and, where one is at fault, the tensor. Raised before any tensor data is read, except for a file that
    changes (shrinks) while it is being audited."""


def _brief(v: Any, limit: int = 120) -> str:
    """``repr(v)`` for an error message, cut to about ``limit`` characters (a hostile header can put a
    100 MB name or shape into one): repr escapes control characters, so the message stays one safe line."""
    r = repr(v)
    return r if len(r) <= limit else f"{r[: limit - 20]}...{r[-12:]} ({len(r)} characters)"


_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _check_regular(mode: int, what: str) -> None:
    if not stat.S_ISREG(mode):
        kind = next((k for test, k in _KINDS if test(mode)), "not a regular file")
        raise SafetensorsError(f"{what} is {kind}, not a regular file")


def _open_regular(path: str, what: str) -> int:
    """A read-only descriptor of ``path``, which must be a regular file (following symbolic links).

    ``os.stat`` first, so that a FIFO, device or socket is refused without opening it (``open`` of a FIFO
    blocks until a writer comes; of a socket it fails obscurely); opened with ``O_NONBLOCK`` (no effect on
    a regular file) and checked again with ``fstat``, in case the path was swapped in between."""
    _check_regular(os.stat(path).st_mode, what)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
                 | getattr(os, "O_BINARY", 0))
    try:
        _check_regular(os.fstat(fd).st_mode, what)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _loads(text: str | bytes, where: str, what: str) -> Any:
    """``json.loads`` without duplicate keys; any failure is a :class:`SafetensorsError` naming the file:
    invalid JSON, an integer of more than ``sys.get_int_max_str_digits()`` digits, and nesting too deep for
    the parser (a ``RecursionError``, e.g. 200 000 brackets), which is refused, never a crash."""
    try:
        return json.loads(text, object_pairs_hook=_no_dupes)
    except _Dup as e:
        raise SafetensorsError(f"{where}: {what} names {_brief(e.args[0])} twice") from None
    except json.JSONDecodeError as e:
        raise SafetensorsError(f"{where}: {what} is not valid JSON ({e.msg} at byte {e.pos})") from None
    except RecursionError:
        raise SafetensorsError(f"{where}: {what} is nested too deeply to parse (a hostile or corrupt file)") from None
    except ValueError as e:  # e.g. an integer with more digits than Python converts
        raise SafetensorsError(f"{where}: {what} is not valid JSON ({' '.join(str(e).split())})") from None


# --------------------------------------------------------------------------------------------------
# Headers


@ieee_mode
@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a checkpoint: where its bytes are (``file``, absolute byte ``offset``, ``nbytes``)
    and what they hold (safetensors ``dtype`` name, ``shape``). Plain data: it is what workers receive."""

    name: str
    file: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def where(self) -> str:
        """``safetensors file '...', tensor '...'``: how error messages name this tensor."""
        return f"safetensors file {_brief(self.file, 400)}, tensor {_brief(self.name)}"


def _no_dupes(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _Dup(k)
        out[k] = v
    return out


class _Dup(Exception):
    pass


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _read_exact(f: IO[bytes], n: int) -> bytes:
    b = f.read(n)
    return b if b is not None else b""


@ieee_mode
def read_header(path: str | os.PathLike[str]) -> tuple[list[TensorInfo], dict[str, str]]:
    """Parse and validate a safetensors file's header; read no tensor data.

    Returns ``(tensors, metadata)``: the tensors in the order of their data offsets, and the
    ``__metadata__`` string map (empty when absent). Checked, against the file's size: the 8-byte
    header length, that the header is UTF-8 JSON (an object, without duplicate keys), each entry's keys,
    dtype (one of the safetensors dtypes; see :data:`DTYPES` for those audited), shape (non-negative
    ints), ``data_offsets`` (``[begin, end]`` with ``end - begin = numel * itemsize``), that the data lies
    inside the file and that no two tensors overlap. Anything wrong raises :class:`SafetensorsError`
    naming the file and the tensor; a path that cannot be opened raises the ``OSError`` of ``open``.

    Examples
    --------
    >>> import numpy as np, os, tempfile, fpsim.audit as A
    >>> p = A.save_safetensors({"b": np.zeros(3, np.float16)}, os.path.join(tempfile.mkdtemp(), "x.safetensors"))
    >>> [(t.name, t.dtype, t.shape, t.nbytes) for t in A.read_header(p)[0]]
    [('b', 'F16', (3,), 6)]
    """
    p = os.fspath(path)
    where = f"safetensors file {_brief(p, 400)}"
    with os.fdopen(_open_regular(p, where), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 8:
            raise SafetensorsError(f"{where} is {size} bytes: too short for the 8-byte header length (truncated?)")
        (n,) = struct.unpack("<Q", _read_exact(f, 8))
        if n == 0 or n > size - 8:
            raise SafetensorsError(f"{where}: header length {n} does not fit in the file's {size} bytes "
                                   "(truncated, or not a safetensors file)")
        if n > _HEADER_LIMIT:
            raise SafetensorsError(f"{where}: header length {n} exceeds the limit of {_HEADER_LIMIT} bytes")
        raw = _read_exact(f, n)
    if len(raw) != n:
        raise SafetensorsError(f"{where}: the header ends early ({len(raw)} of {n} bytes; truncated)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SafetensorsError(f"{where}: the header is not UTF-8 ({e.reason} at byte {e.start})") from None
    head = _loads(text, where, "the header")
    if not isinstance(head, dict):
        raise SafetensorsError(f"{where}: the header is a JSON {type(head).__name__}, not an object")
    meta = head.pop("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise SafetensorsError(f"{where}: __metadata__ must map strings to strings")
    data_start = 8 + n
    data_size = size - data_start
    out: list[TensorInfo] = []
    for name, ent in head.items():
        at = f"{where}, tensor {_brief(name)}"
        if not isinstance(ent, dict) or set(ent) != {"dtype", "shape", "data_offsets"}:
            got = sorted(ent) if isinstance(ent, dict) else type(ent).__name__
            raise SafetensorsError(f"{at}: entry must have exactly the keys dtype, shape, data_offsets; "
                                   f"got {_brief(got)}")
        dt, shape, offs = ent["dtype"], ent["shape"], ent["data_offsets"]
        if not isinstance(dt, str) or dt not in _DTYPE_BITS:
            raise SafetensorsError(f"{at}: unknown dtype {_brief(dt)}; valid: {', '.join(_DTYPE_BITS)}")
        if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
            raise SafetensorsError(f"{at}: shape must be a list of non-negative integers, got {_brief(shape)}")
        if (not isinstance(offs, list) or len(offs) != 2 or not all(_is_int(o) for o in offs)
                or not 0 <= offs[0] <= offs[1]):
            raise SafetensorsError(f"{at}: data_offsets must be [begin, end] with 0 <= begin <= end, "
                                   f"got {_brief(offs)}")
        bits = math.prod(shape) * _DTYPE_BITS[dt]
        if bits % 8:
            raise SafetensorsError(f"{at}: shape {_brief(shape)} of {dt} ({_DTYPE_BITS[dt]}-bit elements) is "
                                   "not a whole number of bytes")
        need = bits // 8
        if offs[1] - offs[0] != need:
            raise SafetensorsError(f"{at}: data_offsets {_brief(offs)} hold {offs[1] - offs[0]} bytes, but shape "
                                   f"{_brief(shape)} of {dt} needs {_brief(need, 40)}")
        if offs[1] > data_size:
            raise SafetensorsError(f"{at}: data_offsets {_brief(offs)} end past the end of the file (its data "
                                   f"section has {data_size} bytes; truncated?)")
        out.append(TensorInfo(name, os.path.abspath(p), dt, tuple(shape), data_start + offs[0], need))
    out.sort(key=lambda t: (t.offset, t.nbytes))
    prev: TensorInfo | None = None
    for t in out:
        if t.nbytes == 0:
            continue
        if prev is not None and t.offset < prev.offset + prev.nbytes:
            raise SafetensorsError(f"{where}, tensor {_brief(t.name)}: its data overlaps tensor {_brief(prev.name)}'s "
                                   f"(bytes {prev.offset - data_start}..{prev.offset - data_start + prev.nbytes} "
                                   f"and {t.offset - data_start}..{t.offset - data_start + t.nbytes})")
        prev = t
    return out, dict(meta)


def _index_files(folder: str) -> list[str]:
    return sorted(f for f in os.listdir(folder) if f.endswith(".safetensors.index.json"))


@ieee_mode
def list_tensors(path: str | os.PathLike[str]) -> list[TensorInfo]:
    """Every tensor of a checkpoint, all headers validated (:func:`read_header`) before returning.

    ``path`` is a ``.safetensors`` file, a sharded checkpoint's ``*.safetensors.index.json``, or a folder
    holding one such index (or, without an index, exactly one ``.safetensors`` file). The index's
    ``weight_map`` must name plain file names in the index's folder, and every tensor it lists must be in
    the shard it names, and every shard tensor in the map; otherwise :class:`SafetensorsError`.
    Tensors come shard by shard (in the index's order of first appearance), each shard in offset order.

    Examples
    --------
    >>> import numpy as np, os, tempfile, fpsim.audit as A
    >>> p = A.save_safetensors({"a": np.ones(2, np.float32)}, os.path.join(tempfile.mkdtemp(), "x.safetensors"))
    >>> [t.name for t in A.list_tensors(p)]
    ['a']
    """
    p = os.fspath(path)
    if os.path.isdir(p):
        idx = _index_files(p)
        if len(idx) > 1:
            raise SafetensorsError(f"folder {p!r} holds several index files ({', '.join(idx)}); give one of them")
        if not idx:
            st = sorted(f for f in os.listdir(p) if f.endswith(".safetensors"))
            if len(st) != 1:
                raise SafetensorsError(f"folder {p!r} has no *.safetensors.index.json and "
                                       f"{len(st)} .safetensors files (need an index, or exactly one file)")
            return read_header(os.path.join(p, st[0]))[0]
        p = os.path.join(p, idx[0])
    if not p.endswith(".json"):
        return read_header(p)[0]
    return _read_index(p)


def _read_index(p: str) -> list[TensorInfo]:
    where = f"checkpoint index {_brief(p, 400)}"
    with os.fdopen(_open_regular(p, where), "rb") as f:
        raw = f.read(_HEADER_LIMIT + 1)
    if len(raw) > _HEADER_LIMIT:
        raise SafetensorsError(f"{where} is larger than {_HEADER_LIMIT} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SafetensorsError(f"{where} is not UTF-8 ({e.reason} at byte {e.start})") from None
    idx = _loads(text, where, "the index")
    wm = idx.get("weight_map") if isinstance(idx, dict) else None
    if not isinstance(wm, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in wm.items()):
        raise SafetensorsError(f"{where} needs a 'weight_map' object mapping tensor names to shard file names")
    folder = os.path.dirname(os.path.abspath(p))
    shards: dict[str, set[str]] = {}  # shard -> its tensors, shards in order of first appearance (a dict, not
    for name, fn in wm.items():        # a list searched per entry: a million-entry map was quadratic)
        if (fn != os.path.basename(fn) or fn in ("", ".", "..") or "\x00" in fn or os.path.isabs(fn)
                or not fn.endswith(".safetensors")):
            raise SafetensorsError(f"{where}, tensor {_brief(name)}: shard {_brief(fn)} is not a .safetensors file "
                                   "name in the index's folder")
        shards.setdefault(fn, set()).add(name)
    out: list[TensorInfo] = []
    for fn, want in shards.items():
        sp = os.path.join(folder, fn)
        if not os.path.lexists(sp):
            raise SafetensorsError(f"{where}: shard {_brief(fn)} (of tensor {_brief(min(want))}) is missing")
        ts = read_header(sp)[0]
        have = {t.name for t in ts}
        if want - have:
            raise SafetensorsError(f"{where}: tensor {_brief(min(want - have))} is not in shard {_brief(fn)}")
        if have - want:
            raise SafetensorsError(f"{where}: shard {_brief(fn)} holds tensor {_brief(min(have - want))}, which the "
                                   "weight_map does not list (or lists in another shard)")
        out += ts
    return out


# --------------------------------------------------------------------------------------------------
# Writing (the project's own models -> safetensors)

_NP_TO_ST = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
             "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2", "int64": "I64", "int32": "I32",
             "int16": "I16", "int8": "I8", "uint64": "U64", "uint32": "U32", "uint16": "U16", "uint8": "U8",
             "bool": "BOOL"}


@ieee_mode
def save_safetensors(tensors: Mapping[str, Any], path: str | os.PathLike[str], *,
                     metadata: Mapping[str, str] | None = None) -> str:
    """Write a dict of arrays (e.g. a trained GPT's ``params``) as one ``.safetensors`` file, atomically.

    Arrays keep their dtype (float64/32/16, ml_dtypes bfloat16, float8_e4m3fn, float8_e5m2, integers,
    bool), are written C-contiguous little-endian, sorted by name (as the safetensors library does), the
    header padded to a multiple of 8 bytes. The file appears whole or not at all (a locked temporary
    renamed over ``path``, :func:`fpsim.train._files.atomic_write`). Returns the path.

    Examples
    --------
    >>> import numpy as np, os, tempfile, fpsim.audit as A
    >>> p = A.save_safetensors({"w": np.eye(2, dtype=np.float32)}, os.path.join(tempfile.mkdtemp(), "m.safetensors"))
    >>> os.path.getsize(p)
    88
    """
    from .train._files import atomic_write

    if not isinstance(tensors, Mapping):
        raise TypeError(f"tensors must be a mapping of names to arrays, got {type(tensors).__name__}")
    meta = dict(metadata or {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise TypeError("metadata must map strings to strings")
    arrays: list[tuple[str, np.ndarray, str]] = []
    for name in tensors:  # checked before sorting: mixed key types made sorted() raise an unnamed TypeError
        if not isinstance(name, str) or not name or name == "__metadata__":
            raise ValueError(f"tensor names must be non-empty strings other than '__metadata__', got {name!r}")
    for name in sorted(tensors):
        a = np.asarray(tensors[name])
        st = _NP_TO_ST.get(a.dtype.name)
        if st is None:
            raise TypeError(f"tensor {name!r} has dtype {a.dtype.name}, which safetensors cannot hold; valid: "
                            f"{', '.join(_NP_TO_ST)}")
        if a.dtype.byteorder == ">":
            a = a.astype(a.dtype.newbyteorder("<"))
        arrays.append((name, np.asarray(a, order="C"), st))  # not ascontiguousarray: it makes 0-d arrays 1-d
    head: dict[str, Any] = {}
    if meta:
        head["__metadata__"] = meta
    off = 0
    for name, a, st in arrays:
        head[name] = {"dtype": st, "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
    hb = json.dumps(head, separators=(",", ":")).encode("utf-8")
    hb += b" " * (-len(hb) % 8)

    def write(f: IO[bytes]) -> None:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for _, a, _ in arrays:
            f.write(a.reshape(-1).view(np.uint8).data)

    p = os.fspath(path)
    atomic_write(p, write, prefix=f".{os.path.basename(p)}-", suffix=".tmp")
    return p


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
# Reading one tensor in chunks

_NP_READ: dict[str, Any] = {"F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2")}


def _read_dtype(dt: str) -> Any:
    if dt in _NP_READ:
        return _NP_READ[dt]
    if dt in ("F8_E4M3", "F8_E5M2"):
        return np.dtype(np.uint8)  # decoded through a 256-entry table (_F8_TABLES): ml_dtypes' cast is slow
    return np.dtype("<u2")  # BF16: its bits are the top half of a float32's (decoded by a shift, exact)


_F8_TABLES: dict[str, np.ndarray] = {}


def _f8_table(dt: str) -> np.ndarray:
    """float32 value of every FP8 bit pattern, from ml_dtypes (float8_e4m3fn / float8_e5m2)."""
    if dt not in _F8_TABLES:
        import ml_dtypes

        ml = ml_dtypes.float8_e4m3fn if dt == "F8_E4M3" else ml_dtypes.float8_e5m2
        _F8_TABLES[dt] = np.arange(256, dtype=np.uint8).view(ml).astype(np.float32)
    return _F8_TABLES[dt]


def _as_2d(shape: tuple[int, ...]) -> tuple[int, int]:
    """Rows (first axis: output channels in PyTorch's (out, in) layout) x columns (the rest, flattened)."""
    if len(shape) == 0:
        return 1, 1
    if len(shape) == 1:
        return 1, shape[0]
    return shape[0], math.prod(shape[1:])


def _pieces(R: int, C: int, band: int, chunk: int) -> list[tuple[int, int, int, int]]:
    """Rectangles (r0, r1, c0, c1) covering (R, C): row bands of a multiple of ``band`` rows (whole
    width) of about ``chunk`` elements; a band wider than ``chunk`` is cut into column pieces whose
    boundaries are multiples of 128 (so every 1x16, 1x32, 1x128 and 128x128 block lies in one piece)."""
    out = []
    if band * C <= chunk:
        rows = max(band, (chunk // max(C, 1)) // band * band)
        for r0 in range(0, R, rows):
            out.append((r0, min(R, r0 + rows), 0, C))
        return out
    width = max(128, (chunk // band) // 128 * 128)
    for r0 in range(0, R, band):
        for c0 in range(0, C, width):
            out.append((r0, min(R, r0 + band), c0, min(C, c0 + width)))
    return out


class _Mapped:
    """A tensor's bytes, read (``pread``) one band of rows at a time into fresh buffers, as float carriers.

    Never memory-mapped: a mapped page past the end of a file that shrank after its header was checked
    (a checkpoint rewritten in place during the audit) kills the process with SIGBUS; a read there
    just comes back short, which is an error naming the file and the tensor. ``fd``: an open descriptor of
    ``t.file`` to read through (the caller closes it); without one, each :meth:`read` opens the file."""

    def __init__(self, t: TensorInfo, fd: int | None = None) -> None:
        self.t = t
        self.fd = fd
        self.R, self.C = _as_2d(t.shape)
        self.dt = _read_dtype(t.dtype)
        self.item = _DTYPE_SIZES[t.dtype]
        self.carrier = np.float64 if t.dtype == "F64" else np.float32

    def _pread(self, fd: int, buf: np.ndarray, offset: int) -> None:
        """Fill ``buf`` (C-contiguous) with the file's bytes from ``offset``; short means the file shrank."""
        mv = memoryview(buf.data).cast("B")
        got = 0
        while got < len(mv):
            if hasattr(os, "preadv"):
                k = os.preadv(fd, [mv[got:]], offset + got)
            else:  # pragma: no cover - Windows: no pread
                os.lseek(fd, offset + got, os.SEEK_SET)
                k = os.readv(fd, [mv[got:]]) if hasattr(os, "readv") else _readinto(fd, mv[got:])
            if k == 0:
                size = os.fstat(fd).st_size
                raise SafetensorsError(
                    f"{self.t.where}: the file ends at byte {size}, inside the tensor's data (bytes {self.t.offset}.."
                    f"{self.t.offset + self.t.nbytes}): it shrank after its header was checked (rewritten "
                    "during the audit?)")
            got += k

    def read(self, r0: int, r1: int, c0: int, c1: int, out: np.ndarray | None = None) -> np.ndarray:
        """float32 (float64 for F64) copy of rows r0:r1, columns c0:c1 (BF16: into ``out``'s first
        elements when given, a flat float32 scratch array at least that large)."""
        if r1 == r0 or c1 == c0:
            return np.zeros((r1 - r0, c1 - c0), self.carrier)
        raw = np.empty((r1 - r0, c1 - c0), self.dt)
        fd = self.fd if self.fd is not None else \
            _open_regular(self.t.file, f"safetensors file {_brief(self.t.file, 400)}")
        try:
            base = self.t.offset + (r0 * self.C + c0) * self.item
            if c0 == 0 and c1 == self.C:  # whole rows: one contiguous read
                self._pread(fd, raw, base)
            else:  # a column piece of a band: one read per row
                for i in range(r1 - r0):
                    self._pread(fd, raw[i], base + i * self.C * self.item)
        finally:
            if self.fd is None:
                os.close(fd)
        if self.t.dtype.startswith("F8"):
            decoded: np.ndarray = _f8_table(self.t.dtype)[raw]
            return decoded
        if self.t.dtype == "BF16":
            if out is not None and out.dtype == np.float32 and out.size >= raw.size:
                bits = out[: raw.size].view(np.uint32).reshape(raw.shape)
                shifted: np.ndarray = np.left_shift(raw, 16, out=bits, dtype=np.uint32)
            else:
                shifted = np.left_shift(raw, 16, dtype=np.uint32)
            return shifted.view(np.float32)
        if raw.dtype == self.carrier:
            return raw
        return raw.astype(self.carrier)


def _readinto(fd: int, mv: memoryview) -> int:  # pragma: no cover - Windows only
    data = os.read(fd, len(mv))
    mv[: len(data)] = data
    return len(data)


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


_MALLOC_TUNED = False


def _tune_malloc(own_process: bool = False) -> None:
    """In a Dask worker process: undo ``MALLOC_TRIM_THRESHOLD_=65536``, which Dask's nanny sets so that
    workers hand freed memory back to the OS. It pins glibc's mmap threshold at 128 KiB, so every NumPy
    temporary of a chunk is a fresh mmap: measured 50 000 page faults instead of 900 and 3-5x slower
    audits. Here the thresholds become 32 MiB (mmap) and 64 MiB (trim): at most that much freed memory is
    kept per worker. Once per process, in every Dask worker process (also without the variable: glibc's
    own dynamic threshold still leaves a page fault per 4 KiB of most chunk temporaries; tuned, the
    workers' audit needs about 25% less CPU, measured), and in the ``fpsim audit`` command's process
    (``own_process``); never in a caller's own process (a serial :func:`audit_checkpoint`), and nothing
    happens outside glibc."""
    global _MALLOC_TUNED
    if _MALLOC_TUNED or not (own_process or "MALLOC_TRIM_THRESHOLD_" in os.environ or _in_dask_worker()):
        return
    _MALLOC_TUNED = True
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.mallopt(-1, 64 << 20)  # M_TRIM_THRESHOLD
        libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        pass


def _in_dask_worker() -> bool:
    """Whether this process is a Dask worker (where the audit owns the process's allocator settings)."""
    import sys

    if "distributed" not in sys.modules:
        return False
    try:
        sys.modules["distributed"].get_worker()
    except (ValueError, AttributeError):
        return False
    return True


_Job = tuple[tuple[TensorInfo, ...], tuple[Target, ...], int]


def _audit_job(job: _Job) -> list[dict[str, Any]]:
    """What a worker runs: plain data in (path, offset, dtype, shape of one tensor, or of a batch of small
    ones; the parsed targets), small dicts out (one per tensor)."""
    _tune_malloc()
    ts, tgs, chunk = job
    if len(ts) == 1 and not _batchable(ts[0], tgs, chunk):
        return [audit_tensor(ts[0], list(tgs), chunk=chunk)]
    return _audit_batch(ts, tgs)


# --------------------------------------------------------------------------------------------------
# A whole checkpoint

_ORDER = {"risk": 0, "warn": 1, "ok": 2}


@ieee_mode
def at_risk(report: Mapping[str, Any], k: int = 10) -> list[dict[str, Any]]:
    """The ``k`` (tensor, target) pairs most at risk: worst verdict first, then lowest SQNR.

    >>> at_risk({"tensors": []})
    []
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"k must be an integer >= 0, got {k!r}")
    rows = []
    for e in report["tensors"]:
        for name, r in e.get("targets", {}).items():
            if r["verdict"] != "ok":
                rows.append({"tensor": e["name"], "target": name, "verdict": r["verdict"], "sqnr_db": r["sqnr_db"],
                             "underflow": r["underflow"], "overflow": r["overflow"], "reasons": r["reasons"]})
    rows.sort(key=lambda r: (_ORDER[r["verdict"]], r["sqnr_db"], r["tensor"], r["target"]))
    return rows[:k]


def _summary(tensors: list[dict[str, Any]], tgs: list[Target]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for g in tgs:
        rs = [e["targets"][g.name] for e in tensors if "targets" in e]
        counts = {v: sum(r["verdict"] == v for r in rs) for v in ("ok", "warn", "risk")}
        out[g.name] = {**counts, "worst_sqnr_db": min((r["sqnr_db"] for r in rs), default=math.inf),
                       "floor_db": g.floor_db}
    return out


@ieee_mode
def audit_checkpoint(path: str | os.PathLike[str], targets: Sequence[str | Target] | str | None = None, *,
                     workers: int | None = None, scheduler: str | None = None, client: Any = None,
                     top: int = 10, progress: bool | None = False, chunk: int = _CHUNK) -> dict[str, Any]:
    """Audit every tensor of a safetensors checkpoint against each target; returns the JSON report.

    Parameters
    ----------
    path : str or path-like
        A ``.safetensors`` file, a ``*.safetensors.index.json`` or a folder holding one (see
        :func:`list_tensors`). All headers are validated before any data is read.
    targets : sequence of str, optional
        ``FORMAT:SCALING`` names (comma-separated strings too; :func:`parse_target`); default
        :data:`DEFAULT_TARGETS`.
    workers : int, optional
        ``0``: serially in this process. ``N >= 1``: a LocalCluster of N worker processes (one thread
        each). Default: serial for checkpoints under 256 MB, else a LocalCluster with one worker per CPU.
    scheduler : str, optional
        Address of a running Dask scheduler (``tcp://host:8786``); its workers must see ``path``.
    client : distributed.Client, optional
        An existing client to use (tests, notebooks); wins over ``workers`` and ``scheduler``.
    top : int
        How many (tensor, target) pairs go into ``at_risk``.
    progress : bool or None
        Progress bar on stderr (``None``: when stderr is a terminal).
    chunk : int
        Elements per chunk (memory per worker: a few dozen bytes per chunk element plus one band's pages).

    Returns
    -------
    dict
        ``{"version", "path", "files", "targets", "thresholds", "tensors", "skipped", "at_risk", "summary",
        "bytes"}``; entries of ``tensors`` as :func:`audit_tensor` returns them, in checkpoint order.
        Identical for every way of running (serial, LocalCluster, scheduler).
    """
    from ._dask import check_scheduler_address, check_workers, dask_client, progress_bar

    tgs = _parse_targets(targets)
    if isinstance(top, bool) or not isinstance(top, int) or top < 0:
        raise ValueError(f"top must be an integer >= 0, got {top!r}")
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 128:
        raise ValueError(f"chunk must be an integer >= 128 (elements), got {chunk!r}")
    if scheduler is not None:
        scheduler = check_scheduler_address(scheduler)
    if workers is not None and not (workers == 0 and not isinstance(workers, bool)):
        workers = check_workers(workers)
    infos = list_tensors(path)  # every header checked before any data is touched
    names = tuple(g.name for g in tgs)
    targets_t = tuple(tgs)  # parsed once here, not once per tensor
    small = [i for i, t in enumerate(infos) if _batchable(t, targets_t, chunk)]
    groups = _batches(infos, small) + [[i] for i, t in enumerate(infos) if not _batchable(t, targets_t, chunk)]
    jobs: list[_Job] = [(tuple(infos[i] for i in grp), targets_t, chunk) for grp in groups]
    total = sum(t.nbytes for t in infos)
    # biggest first keeps workers busy to the end; results are put back in checkpoint order
    order = sorted(range(len(jobs)), key=lambda j: -sum(t.nbytes for t in jobs[j][0]))
    results: list[dict[str, Any] | None] = [None] * len(infos)
    bar = progress_bar(len(infos), desc="audit", enabled=progress)
    try:
        parallel = client is not None or scheduler is not None or (
            workers != 0 and (workers is not None or total >= _LARGE_BYTES))
        if not parallel:
            for j in order:
                for i, r in zip(groups[j], _audit_job(jobs[j])):
                    results[i] = r
                bar.update(len(groups[j]))
        else:
            import uuid

            tag = uuid.uuid4().hex[:12]

            def run(c: Any) -> None:
                futs = {c.submit(_audit_job, jobs[i], pure=False, retries=2, key=f"fpsim-audit-{tag}-{i}"): i
                        for i in order}
                import distributed

                try:
                    for fut in distributed.as_completed(list(futs), loop=c.loop):  # type: ignore[no-untyped-call]
                        grp = groups[futs[fut]]
                        for i, r in zip(grp, fut.result()):
                            results[i] = r
                        bar.update(len(grp))
                except BaseException:
                    c.cancel([f for f in futs if not f.done()])
                    raise

            if client is not None:
                run(client)
            else:
                with dask_client(workers=workers, scheduler=scheduler) as c:
                    run(c)
    finally:
        bar.close()
    tensors = [r for r in results if r is not None and "targets" in r]
    skipped = [{"name": r["name"], "dtype": r["dtype"], "reason": r["skipped"]}
               for r in results if r is not None and "skipped" in r]
    rep: dict[str, Any] = {
        "version": AUDIT_JSON_VERSION, "path": os.fspath(path),
        "files": sorted({os.path.basename(t.file) for t in infos}),
        "targets": list(names), "thresholds": dict(THRESHOLDS), "tensors": tensors, "skipped": skipped,
        "bytes": total,
    }
    rep["at_risk"] = at_risk(rep, top)
    rep["summary"] = _summary(tensors, tgs)
    return rep


# --------------------------------------------------------------------------------------------------
# Output


@ieee_mode
def to_json(report: Mapping[str, Any]) -> str:
    """The report as strict JSON: infinite SQNR (no error at all) is the string ``"inf"``."""
    return json_text(dict(report), indent=1)


def _f(v: float, kind: str) -> str:
    if kind == "db":
        return "inf" if v == math.inf else ("-inf" if v == -math.inf else f"{v:.1f}")
    if v == 0:
        return "0"
    return f"{v:.2e}" if v < 1e-2 else f"{v:.3f}"


@ieee_mode
def format_table(report: Mapping[str, Any], *, top: int | None = None) -> str:
    """The report as a text table: one line per tensor and target, then the summary and the tensors at risk.

    Names come from the file: every non-printable character in them is escaped
    (:func:`fpsim._cliargs.printable`), so a name cannot drive the terminal or break a line; :func:`to_json`
    keeps them exact.

    >>> print(format_table({"tensors": [], "targets": [], "at_risk": [], "summary": {}, "skipped": []}))
    tensor  dtype  shape  amax  target  underflow  subnormal  overflow  sqnr_db  max_rel  verdict
    ------  -----  -----  ----  ------  ---------  ---------  --------  -------  -------  -------
    """
    cols = ["tensor", "dtype", "shape", "amax", "target", "underflow", "subnormal", "overflow", "sqnr_db",
            "max_rel", "verdict"]
    rows = []
    for e in report["tensors"]:
        for i, (name, r) in enumerate(e["targets"].items()):
            head = [printable(e["name"]), printable(e["dtype"]), "x".join(map(str, e["shape"])) or "()",
                    f"{e['amax']:.3g}"] if i == 0 else ["", "", "", ""]
            rows.append(head + [name, _f(r["underflow"], "f"), _f(r["subnormal"], "f"), _f(r["overflow"], "f"),
                                _f(r["sqnr_db"], "db"), _f(r["max_rel_error"], "f"), r["verdict"]])
    w = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(x) for c, x in zip(cols, w)).rstrip(), "  ".join("-" * x for x in w)]
    lines += ["  ".join(v.ljust(x) for v, x in zip(r, w)).rstrip() for r in rows]
    if report["summary"]:
        lines.append("")
        lines.append("summary (tensors ok / warn / risk; worst SQNR; format's rounding floor):")
        for name, s in report["summary"].items():
            lines.append(f"  {name:<22} {s['ok']:>4} / {s['warn']:>4} / {s['risk']:>4}   worst "
                         f"{_f(s['worst_sqnr_db'], 'db')} dB   floor {s['floor_db']:.1f} dB")
    risk = list(report["at_risk"])[: top if top is not None else None]
    if risk:
        lines.append("")
        lines.append("most at risk:")
        for r in risk:
            lines.append(f"  {r['verdict']:<4}  {printable(r['tensor'])}  {r['target']}: {'; '.join(r['reasons'])}")
    for s in report.get("skipped", []):
        lines.append(f"skipped {printable(s['name'])} ({printable(s['dtype'])}): not audited "
                     f"(audited dtypes: {', '.join(DTYPES)})")
    return "\n".join(lines)


@ieee_mode
def plot_audit(report: Mapping[str, Any], out_dir: str | os.PathLike[str]) -> list[str]:
    """Write ``sqnr.png`` (SQNR per tensor and target, with each format's rounding floor) and
    ``fractions.png`` (underflow and overflow shares) into ``out_dir``; returns the paths.
    matplotlib is imported here only."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    from .plot import colour

    d = os.fspath(out_dir)
    os.makedirs(d, exist_ok=True)
    tensors = list(report["tensors"])
    names = list(report["targets"])
    n = len(tensors)
    x = np.arange(n)
    paths = []
    fig, ax = plt.subplots(figsize=(max(6.0, min(0.25 * n + 3, 24.0)), 4.5))
    for i, tg in enumerate(names):
        y = np.array([e["targets"][tg]["sqnr_db"] for e in tensors], dtype=float)
        y = np.where(np.isposinf(y), np.nan, y)
        ax.plot(x, y, "o", ms=4, color=colour(i), label=tg)
        ax.axhline(parse_target(tg).floor_db, color=colour(i), lw=0.8, ls="--")
    ax.set_xlabel("tensor (checkpoint order)")
    ax.set_ylabel("SQNR (dB)")
    ax.set_title("SQNR per tensor (dashed: format's rounding floor)")
    if n <= 40:
        # names from the file: shown literally (a "$...$" name is not mathtext, whose parse errors killed the plot)
        ax.set_xticks(x, [printable(e["name"]) for e in tensors], rotation=90, fontsize=6, parse_math=False)
    ax.legend(fontsize=7)
    fig.tight_layout()
    p = os.path.join(d, "sqnr.png")
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)
    fig, axs = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for k, (key, ax) in enumerate(zip(("underflow", "overflow"), axs)):
        for i, tg in enumerate(names):
            y = np.array([e["targets"][tg][key] for e in tensors], dtype=float)
            ax.plot(x, np.where(y > 0, y, np.nan), "o", ms=4, color=colour(i), label=tg)
        ax.set_yscale("log")
        ax.set_xlabel("tensor (checkpoint order)")
        ax.set_title(f"share of nonzero values that {'underflow to 0' if k == 0 else 'saturate / overflow'}")
        ax.axhline(THRESHOLDS[f"risk_{key}"], color="k", lw=0.8, ls="--")
    axs[0].set_ylabel("share of nonzero values (log)")
    axs[1].legend(fontsize=7)
    fig.tight_layout()
    p = os.path.join(d, "fractions.png")
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)
    return paths


# --------------------------------------------------------------------------------------------------
# fpsim audit


def _cmd_audit(args: Any) -> int:
    import sys

    from ._cliargs import flag_value, nonneg_int
    from ._dask import check_scheduler_address

    targets = flag_value("--targets", _parse_targets, args.targets) if args.targets else None
    workers = None if args.workers is None else flag_value("--workers", nonneg_int, args.workers)
    sched = None if args.scheduler is None else flag_value("--scheduler", check_scheduler_address, args.scheduler)
    top = flag_value("--top", nonneg_int, args.top)
    if not os.path.exists(args.path):
        raise ValueError(f"PATH {args.path!r} does not exist (a .safetensors file, an index.json or a folder)")
    if args.plot:  # before the audit, which can take hours: a bad --plot found after it lost the report
        _check_out_dir(args.plot, "--plot")
    _tune_malloc(own_process=True)  # this process is the command's: a serial audit needs ~25% less CPU
    rep = audit_checkpoint(args.path, targets, workers=workers, scheduler=sched, top=top, progress=None)
    # the report first: a late failure (disk full while plotting) must not lose it
    print(to_json(rep) if args.json else format_table(rep), flush=True)
    if args.plot:
        for p in plot_audit(rep, args.plot):
            print(f"wrote {printable(p)}", file=sys.stderr)
    return 0


def _check_out_dir(path: str, flag: str) -> None:
    """Refuse an output folder that cannot be created or written (``ValueError`` naming ``flag``), without
    creating anything: it, or its nearest existing ancestor, must be a writable folder; matplotlib must
    be importable."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise ValueError(f"{flag} needs matplotlib (pip install matplotlib)")
    d = os.path.abspath(path)
    probe = d
    while not os.path.exists(probe):  # nearest existing ancestor (a dangling link does not exist either)
        if os.path.lexists(probe):
            raise ValueError(f"{flag} {path!r}: {probe!r} is a broken symbolic link")
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        what = "is" if probe == d else f"cannot be created: {probe!r} is"
        raise ValueError(f"{flag} {path!r} {what} not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {path!r}: folder {probe!r} is not writable")


def register_cli(subparsers: Any) -> None:
    """Add ``audit`` to the ``fpsim`` command's subparsers."""
    s = subparsers.add_parser(
        "audit", help="audit a safetensors checkpoint for low-precision casts (FP8, MXFP4, NVFP4, ...)",
        description="Read a .safetensors checkpoint (a file, or a sharded folder with its index.json) tensor by "
                    "tensor and report, per tensor and target FORMAT:SCALING, the shares "
                    "that underflow, become subnormal or overflow, the SQNR and relative errors, with a verdict "
                    "(docs/audit.md).")
    s.add_argument("path", metavar="PATH", help="a .safetensors file, a *.safetensors.index.json, or a folder")
    s.add_argument("--targets", nargs="+", default=None, metavar="FORMAT:SCALING",
                   help=f"targets (space or comma separated; default {' '.join(DEFAULT_TARGETS)}); scalings: "
                        f"{', '.join(SCALINGS)}")
    s.add_argument("--json", action="store_true", help="print the report as JSON (keys in docs/audit.md)")
    s.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="a running Dask scheduler (tcp://host:8786) whose workers see PATH")
    s.add_argument("--workers", default=None, metavar="N",
                   help="0: serial in this process; N: a local Dask cluster of N processes "
                        "(default: serial under 256 MB, else one per CPU)")
    s.add_argument("--plot", default=None, metavar="DIR", help="write sqnr.png and fractions.png into DIR")
    s.add_argument("--top", default="10", metavar="K", help="how many tensors most at risk to list (default 10)")
    s.set_defaults(func=_cmd_audit)
