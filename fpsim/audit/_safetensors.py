"""Reading safetensors files, trusting nothing in them: the header (8-byte little-endian length, then JSON) parsed
and validated (dtypes, shapes, offsets, sizes, overlaps, bounds) for every file before any data is read, sharded
folders with their index, regular files only; one tensor read with ``pread`` a band of rows at a time
(:class:`_Mapped`), the dtypes decoded to float; and :func:`save_safetensors`, the writer. Public names are
re-exported by :mod:`fpsim.audit`.
"""

from __future__ import annotations

import json
import math
import os
import stat
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, Any

import numpy as np

from .._fpenv import ieee_mode


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
    from ..train._files import atomic_write

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


