"""Checkpoints: one ``.npz`` (no pickle) holding weights, optimizer, loss scaler, policy runtime state
and the history, written atomically (temporary file in the same folder, fsync, rename, fsync of the
folder).

Resuming gives the same bits as a run that was never interrupted: batches are a function of
``(seed, step)``, evaluation draws from its own generator, and every piece of state the step depends on
is saved (weights in their storage dtype, optimizer moments, loss-scaler state, FP8 scales and amax
histories, QAT/PTQ observers and switches, the stochastic-rounding generator, the history).

Loading trusts nothing in the file. The zip directory, each member's ``.npy`` header (parsed here, never
with pickle) and every size are checked before anything is inflated or allocated: a member may hold
only what the model, policy and configuration say it holds, so memory stays bounded by the model's
size whatever the file claims. Then the contents are validated against the model, policy and
configuration (names, shapes, dtypes, ranges). Every bad file raises :class:`CheckpointError` naming
what is wrong; only a path that cannot be opened raises the ``OSError`` of ``open``.

Temporary files of saves that were killed (``.ckpt-*.npz.tmp``) are removed by the next save or load in
that folder once they are stale: no process holds their lock (a save locks its temporary until the
rename) and they have not been modified for :data:`STALE_TMP_AGE_S` seconds. A live save, however
slow, paused or far away (another PID namespace, another machine on a shared folder), holds its lock
and is never touched; files of other users are left alone (``fpsim.train._files``).
"""

from __future__ import annotations

import ast
import json
import math
import os
import re
import struct
import zipfile
from collections.abc import Callable
from typing import IO, Any

import numpy as np

from .._fpenv import ieee_mode
from ._files import atomic_write, remove_stale_tmp

__all__ = ["FORMAT_VERSION", "STALE_TMP_AGE_S", "CheckpointError", "load_checkpoint", "save_checkpoint"]

FORMAT_VERSION = 1

#: A checkpoint temporary that no process holds locked and that was not modified for this many seconds is
#: stale (its save died).
STALE_TMP_AGE_S = 60.0

_MAX_NPY_HEADER = 65536            # numpy itself refuses headers over 10000 bytes by default
_MAX_MEMBERS = 100_000
_DEFLATE_MAX_RATIO = 1100          # deflate cannot expand more than ~1032:1; a larger claim is a lie
_META_SLACK = 64 * 2**20           # metadata (JSON text): at most the archive size plus this
_META_DEFLATE_RATIO = 64           # deflated metadata: at most this many times its compressed size
_SMALL_TEXT = 2**20                # the SR generator state, an FP8 format name


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: truncated, corrupted, inconsistent, of another version, policy
    or config. The message names the file and what is wrong."""


# ---------------------------------------------------------------------------------------------- writing

_TMP_PREFIX, _TMP_SUFFIX = ".ckpt-", ".npz.tmp"
_TMP_RE = re.compile(r"\.ckpt-[A-Za-z0-9_@.\-]{1,100}\.npz\.tmp\Z")


def _remove_stale_tmp(folder: str) -> list[str]:
    """Remove the stale checkpoint temporaries in ``folder`` (see the module docstring); returns their paths."""
    return remove_stale_tmp(folder, _TMP_RE, STALE_TMP_AGE_S)


@ieee_mode
def save_checkpoint(trainer: Any, path: str | os.PathLike[str]) -> str:
    """Write ``trainer``'s full state to ``path`` atomically; returns the path.

    The state goes to a temporary file in the same folder, which is flushed, fsynced and renamed over
    ``path`` (then the folder is fsynced): a crash or kill at any moment leaves either the previous
    file or the new one at ``path``, never a mixture. Stale temporaries of earlier killed saves in the
    folder are removed first.

    Examples
    --------
    >>> import os, tempfile
    >>> from fpsim.nn import GPTConfig
    >>> from fpsim.train import TrainConfig, Trainer, load_checkpoint, save_checkpoint
    >>> cfg = TrainConfig(task_kwargs={"n_symbols": 5, "length": 3}, steps=2, batch_size=2,
    ...                   model=GPTConfig(vocab_size=6, block_size=6, n_layer=1, n_head=1, n_embd=4))
    >>> tr = Trainer("fp16-mixed", cfg)
    >>> _ = tr.run(1, progress=False)
    >>> path = save_checkpoint(tr, os.path.join(tempfile.mkdtemp(), "ck.npz"))
    >>> load_checkpoint(path).step_count
    1
    """
    from .loop import Trainer

    if not isinstance(trainer, Trainer):
        raise TypeError(f"save_checkpoint needs a fpsim.train.Trainer, got {type(trainer).__name__}")
    path = os.fspath(path)
    if not isinstance(path, str):
        raise TypeError(f"checkpoint path must be a str or os.PathLike of str, got {type(path).__name__}")
    meta = {
        "format_version": FORMAT_VERSION,
        "policy": trainer.policy.name,
        "policy_fingerprint": trainer.policy.fingerprint(),
        "config": trainer.config.as_dict(),
        "task": trainer.task.describe(),
        "step": trainer.step_count,
        "scaler": trainer.scaler.state_dict(),
        "history": trainer.history.to_dict(),
        "wall_s": trainer.history["wall_s"][-1] if len(trainer.history) else 0.0,
        "quant_active": bool(trainer.runtime.quant_active),
    }
    rt = trainer.runtime.state_dict()
    meta["runtime_keys"] = sorted(rt)  # so that a file with some runtime state removed is refused
    arrays: dict[str, np.ndarray] = {"meta": np.asarray(json.dumps(meta))}
    for k, v in trainer.store.weights.items():
        arrays[f"w/{k}"] = np.asarray(v)
    for k, v in trainer.optimizer.state_dict().items():
        arrays[f"opt/{k}"] = np.asarray(v)
    for k, v in rt.items():
        arrays[f"rt/{k}"] = np.asarray(v)
    for k, a in arrays.items():  # plain numbers and text only: nothing that would need pickle
        if a.dtype.kind not in "fiubU" or a.dtype.fields is not None:
            raise TypeError(f"checkpoint entry {k!r} has dtype {a.dtype}, which a checkpoint cannot hold")
    _remove_stale_tmp(os.path.dirname(os.path.abspath(path)))
    # stored (not deflated) .npy members
    atomic_write(path, lambda f: np.savez(f, **arrays), prefix=_TMP_PREFIX, suffix=_TMP_SUFFIX)  # type: ignore[arg-type]
    return path


# ---------------------------------------------------------------------------------------------- reading

class _Bad(Exception):
    """Internal: what is wrong with the file (becomes a CheckpointError naming it)."""


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise _Bad(msg)


def _read_exact(f: IO[bytes], n: int, what: str) -> bytes:
    b = f.read(n)
    _need(len(b) == n, f"{what}: truncated")
    return b


# dtype kinds a checkpoint member may have: floats, ints, bools, text. Never objects or records.
_KINDS = "fiubU"


def _npy_header(f: IO[bytes], what: str) -> tuple[np.dtype[Any], tuple[int, ...], bool, int]:
    """Parse a ``.npy`` header without numpy's reader: (dtype, shape, fortran_order, header length)."""
    magic = _read_exact(f, 8, what)
    _need(magic[:6] == b"\x93NUMPY", f"{what}: not a .npy array")
    major = magic[6]
    _need(major in (1, 2, 3), f"{what}: unknown .npy version {major}.{magic[7]}")
    size_fmt = "<H" if major == 1 else "<I"
    (hlen,) = struct.unpack(size_fmt, _read_exact(f, struct.calcsize(size_fmt), what))
    _need(hlen <= _MAX_NPY_HEADER, f"{what}: .npy header of {hlen} bytes")
    text = _read_exact(f, hlen, what).decode("utf8" if major == 3 else "latin1")
    d = ast.literal_eval(text)  # literals only; never evaluates code
    _need(isinstance(d, dict) and set(d) == {"descr", "fortran_order", "shape"}, f"{what}: bad .npy header")
    descr, fortran, shape = d["descr"], d["fortran_order"], d["shape"]
    _need(isinstance(descr, str) and isinstance(fortran, bool) and isinstance(shape, tuple)
          and all(type(n) is int and 0 <= n < 2**63 for n in shape) and len(shape) <= 32,
          f"{what}: bad .npy header")
    dt = np.dtype(descr)
    _need(dt.kind in _KINDS and dt.fields is None and dt.subdtype is None and not dt.hasobject,
          f"{what}: dtype {dt} is not allowed in a checkpoint")
    return dt, shape, fortran, len(magic) + struct.calcsize(size_fmt) + hlen


#: A member's expected contents: a check of (dtype, shape) that raises _Bad, and the most data bytes.
_Spec = tuple[Callable[[np.dtype[Any], tuple[int, ...]], None], int]


def _spec(kind: str, shape: tuple[int, ...] | None, dtype: Any = None, max_bytes: int | None = None) -> _Spec:
    """Expect dtype kind ``kind`` (and exactly ``dtype`` up to byte order, if given) and ``shape``."""
    want = None if dtype is None else np.dtype(dtype)

    def check(dt: np.dtype[Any], sh: tuple[int, ...]) -> None:
        if want is not None and dt.newbyteorder("=") != want.newbyteorder("="):
            raise _Bad(f"dtype {dt}, expected {want}")
        if dt.kind != kind:
            raise _Bad(f"dtype {dt}, expected kind {kind!r}")
        if shape is not None and sh != shape:
            raise _Bad(f"shape {sh}, expected {shape}")

    if max_bytes is None:
        assert want is not None and shape is not None
        max_bytes = want.itemsize * math.prod(shape)
    return check, max_bytes


class _Archive:
    """The zip directory of a checkpoint, checked; members are read one at a time with bounded memory."""

    def __init__(self, f: IO[bytes], size: int) -> None:
        self.size = size
        self.zf = zipfile.ZipFile(f)
        infos = self.zf.infolist()
        _need(len(infos) <= _MAX_MEMBERS, f"{len(infos)} zip members")
        self.members: dict[str, zipfile.ZipInfo] = {}
        for i in infos:
            name = i.filename
            _need(name.endswith(".npy"), f"zip member {name!r} is not a .npy array")
            key = name[:-4]
            _need(key not in self.members, f"zip member {name!r} appears twice")
            _need(not i.flag_bits & 0x1, f"zip member {name!r} is encrypted")
            _need(i.compress_type in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED),
                  f"zip member {name!r} uses compression method {i.compress_type}")
            _need(0 <= i.compress_size <= size, f"zip member {name!r} claims {i.compress_size} bytes, "
                                                f"more than the file's {size}")
            if i.compress_type == zipfile.ZIP_STORED:
                _need(i.file_size == i.compress_size, f"zip member {name!r}: sizes disagree")
            else:
                _need(i.file_size <= _DEFLATE_MAX_RATIO * i.compress_size + 1024,
                      f"zip member {name!r} claims {i.file_size} bytes from {i.compress_size} compressed")
            self.members[key] = i

    def read(self, key: str, spec: _Spec, *, header_only: bool = False) -> np.ndarray:
        """Member ``key`` as an array: header and declared size checked against ``spec`` before any
        data is inflated or allocated, then exactly the data bytes read (the CRC is checked at the end).
        ``header_only``: stop after the checks (returns an empty array)."""
        check, max_bytes = spec
        info = self.members.get(key)
        _need(info is not None, f"entry {key!r} is missing")
        assert info is not None
        what = f"entry {key!r}"
        _need(info.file_size <= max_bytes + _MAX_NPY_HEADER + 16,
              f"{what} claims {info.file_size} bytes; at most {max_bytes} of data are expected")
        with self.zf.open(info) as m:  # a ZipExtFile: streams, inflating only what is read
            dt, shape, fortran, hlen = _npy_header(m, what)
            try:
                check(dt, shape)
            except _Bad as e:
                raise _Bad(f"{what}: {e}") from None
            nbytes = dt.itemsize * math.prod(shape)
            _need(nbytes <= max_bytes, f"{what} holds {nbytes} bytes; at most {max_bytes} are expected")
            _need(hlen + nbytes == info.file_size, f"{what}: its header and its size disagree")
            if header_only:
                return np.empty(0)
            buf = bytearray(nbytes)
            view, got = memoryview(buf), 0
            while got < nbytes:
                n = m.readinto(view[got:])  # type: ignore[attr-defined] # ZipExtFile has it
                _need(n > 0, f"{what}: truncated")
                got += n
            _need(m.read(1) == b"", f"{what}: data after the array")  # also makes zipfile check the CRC
        a = np.frombuffer(buf, dt).reshape(shape, order="F" if fortran else "C")
        return a.astype(dt.newbyteorder("="), order="C")  # native byte order, C order, 0-d kept 0-d


def _text(a: np.ndarray) -> str:
    return str(a[()])


def _is_num(v: Any) -> bool:
    """A float, or an int a float can hold (JSON allows 10**400, which float() refuses)."""
    return isinstance(v, float) or (isinstance(v, int) and not isinstance(v, bool) and abs(v) < 2**1024)


def _check_history(h: Any, step: int, weight_names: set[str]) -> None:
    from ..amp.runtime import HIST_HI, HIST_LO
    from .loop import SERIES

    _need(isinstance(h, dict), "history is not a dict")
    base = set(SERIES) | {"eval_step", "eval_loss", "tensors", "by_weight", "hist_step", "hist", "hist_zeros",
                          "hist_lo", "hist_hi"}
    missing, extra = base - set(h), set(h) - base - {"float_eval_loss"}
    _need(not missing and not extra, f"history keys: missing {sorted(missing)}, unexpected {sorted(extra)}")
    for k in SERIES:
        v = h[k]
        _need(isinstance(v, list) and len(v) == step, f"history[{k!r}] does not have one entry per step ({step})")
        ok = all(isinstance(x, bool) for x in v) if k == "skipped" else all(_is_num(x) for x in v)
        _need(ok, f"history[{k!r}] holds values of the wrong kind")
    _need(h["step"] == list(range(step)), "history['step'] is not 0, 1, ..., step - 1")
    es, el = h["eval_step"], h["eval_loss"]
    _need(isinstance(es, list) and isinstance(el, list) and len(es) == len(el), "history eval lists disagree")
    _need(all(type(s) is int for s in es) and es == sorted(set(es)) and all(0 <= s <= step for s in es),
          "history['eval_step'] is not an increasing list of steps")
    _need(all(_is_num(x) for x in el), "history['eval_loss'] holds values that are not numbers")
    if "float_eval_loss" in h:
        _need(_is_num(h["float_eval_loss"]), "history['float_eval_loss'] is not a number")
    _need(isinstance(h["tensors"], dict) and all(
        isinstance(t, dict) and all(isinstance(s, list) and len(s) <= step and all(_is_num(x) for x in s)
                                    for s in t.values()) for t in h["tensors"].values()),
          "history['tensors'] is malformed")
    bw = h["by_weight"]
    _need(isinstance(bw, dict) and set(bw) <= weight_names and all(
        isinstance(s, list) and len(s) <= step and all(_is_num(x) for x in s) for s in bw.values()),
          "history['by_weight'] is malformed")
    _need(h["hist_lo"] == HIST_LO and h["hist_hi"] == HIST_HI, "history histogram range differs")
    hs = h["hist_step"]
    _need(isinstance(hs, list) and all(type(s) is int and 0 <= s < step for s in hs), "history['hist_step']")
    nb = HIST_HI - HIST_LO
    _need(isinstance(h["hist"], dict) and all(
        isinstance(v, list) and len(v) <= len(hs) and all(isinstance(c, list) and len(c) == nb for c in v)
        for v in h["hist"].values()), "history['hist'] is malformed")
    _need(isinstance(h["hist_zeros"], dict) and all(
        isinstance(v, list) and len(v) <= len(hs) for v in h["hist_zeros"].values()),
          "history['hist_zeros'] is malformed")


def _representable(a: np.ndarray, fmt: Any) -> bool:
    """Every non-NaN value of ``a`` is a value of ``fmt`` (what rounding to ``fmt`` leaves unchanged)."""
    from ..formats import as_format
    from ..rounding import round as fround

    if fmt == as_format("fp64") or (fmt == as_format("fp32") and a.dtype == np.float32):
        return True  # every value of the carrier is one

    with np.errstate(all="ignore"):
        r = np.asarray(fround(a, fmt, "rne"))
    return bool(np.all((r == a) | np.isnan(a)))


def _storage_dtype(fmt: Any) -> Any:
    return np.float32 if fmt.fits_float32 else np.float64


@ieee_mode
def load_checkpoint(path: str | os.PathLike[str], *, policy: Any = None, config: Any = None,
                    task: Any = None) -> Any:
    """A :class:`~fpsim.train.Trainer` restored from ``path``, ready to continue with ``run()``.

    ``policy`` / ``config``: if given they must match the checkpoint's (else :class:`CheckpointError`);
    by default the checkpoint's own are used (the policy looked up by name, its definition checked).
    ``task``: needed for a text task (the text is not stored); must describe itself identically.

    Every bad file raises :class:`CheckpointError` (see the module docstring for what is checked);
    ``OSError`` only when ``path`` cannot be opened.

    Examples
    --------
    >>> from fpsim.train import CheckpointError
    >>> import os, tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "junk.npz")
    >>> with open(p, "wb") as f:
    ...     _ = f.write(b"PK not a checkpoint")
    >>> try:
    ...     load_checkpoint(p)
    ... except CheckpointError as e:
    ...     print(str(e).split("' ", 1)[1])
    is truncated or corrupted (BadZipFile: File is not a zip file)
    """
    from ..amp import Policy, get_policy
    from .data import Task
    from .loop import History, TrainConfig, Trainer

    if policy is not None and not isinstance(policy, (str, Policy)):
        raise TypeError(f"policy must be a Policy, a policy name or None, got {type(policy).__name__}")
    if config is not None and not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a TrainConfig or None, got {type(config).__name__}")
    if task is not None and not isinstance(task, Task):
        raise TypeError(f"task must be a fpsim.train.Task or None, got {type(task).__name__}")
    path = os.fspath(path)
    if not isinstance(path, str):
        raise TypeError(f"checkpoint path must be a str or os.PathLike of str, got {type(path).__name__}")
    _remove_stale_tmp(os.path.dirname(os.path.abspath(path)))
    with open(path, "rb") as f:  # OSError (missing file, a folder, no permission) propagates
        try:
            return _load(f, path, policy, config, task, get_policy, History, TrainConfig, Trainer)
        except CheckpointError:
            raise
        except _Bad as e:
            raise CheckpointError(f"checkpoint {path!r}: {e}") from None
        except Exception as e:  # noqa: BLE001 - whatever a damaged file makes zipfile/json/numpy raise
            raise CheckpointError(f"checkpoint {path!r} is truncated or corrupted ({type(e).__name__}: {e})") from e


def _load(f: IO[bytes], path: str, policy: Any, config: Any, task: Any, get_policy: Any, History: Any,
          TrainConfig: Any, Trainer: Any) -> Any:
    from ..nn.gpt import _param_shapes

    size = os.fstat(f.fileno()).st_size
    ar = _Archive(f, size)
    _need("meta" in ar.members, "no 'meta' entry: not an fpsim training checkpoint")
    mi = ar.members["meta"]
    # A stored member is bounded by the file; a deflated one also by what JSON text (held as UTF-32)
    # plausibly compresses to, so a small file cannot make the loader allocate gigabytes.
    meta_cap = size + _META_SLACK if mi.compress_type == zipfile.ZIP_STORED else \
        min(size + _META_SLACK, max(2**20, _META_DEFLATE_RATIO * mi.compress_size))
    meta_raw = ar.read("meta", _spec("U", (), max_bytes=meta_cap))
    meta = json.loads(_text(meta_raw))
    _need(isinstance(meta, dict), "metadata is not a JSON object")
    _need(meta.get("format_version") == FORMAT_VERSION,
          f"format version {meta.get('format_version')!r}; this fpsim reads version {FORMAT_VERSION}")
    keys = {"format_version", "policy", "policy_fingerprint", "config", "task", "step", "scaler", "history",
            "wall_s", "quant_active"}
    optional = {"runtime_keys"}  # written since the runtime state is checked for completeness
    _need(keys <= set(meta) <= keys | optional, f"metadata keys: missing {sorted(keys - set(meta))}, "
                                                f"unexpected {sorted(set(meta) - keys - optional)}")
    _need(isinstance(meta["policy"], str) and isinstance(meta["policy_fingerprint"], str),
          "metadata policy is not text")
    try:
        pol = get_policy(policy if policy is not None else meta["policy"])
    except ValueError as e:
        raise _Bad(str(e)) from None
    if pol.fingerprint() != meta["policy_fingerprint"]:
        raise _Bad(f"written under policy {meta['policy']!r} with a different definition than policy "
                   f"{pol.name!r} given now")
    _need(isinstance(meta["config"], dict), "metadata config is not a JSON object")
    try:
        saved_cfg = TrainConfig.from_dict(meta["config"])
    except (TypeError, ValueError, KeyError) as e:
        raise _Bad(f"invalid training configuration ({type(e).__name__}: {e})") from None
    cfg = saved_cfg if config is None else config
    if cfg.as_dict() != saved_cfg.as_dict():
        diff = sorted(k for k, v in cfg.as_dict().items() if saved_cfg.as_dict().get(k) != v)
        raise _Bad(f"a different training configuration (fields {diff})")
    step = meta["step"]
    _need(type(step) is int and step >= 0, f"step {step!r} is not an int >= 0")
    wall = meta["wall_s"]
    _need(_is_num(wall) and math.isfinite(wall) and wall >= 0, f"wall_s {wall!r} is not a time")
    _need(isinstance(meta["quant_active"], bool), "quant_active is not a bool")
    _need(pol.quant is not None or not meta["quant_active"], "quant_active is set for a policy without quant")

    # The model's shapes, before anything of its size is allocated: the file must hold them.
    if task is None:
        from .data import get_task

        task = get_task(cfg.task, **cfg.task_kwargs)
    _need(task.describe() == meta["task"], f"trained on task {meta['task']}, not {task.describe()}")
    model = cfg.model_for(task) if hasattr(cfg, "model_for") else cfg.model
    shapes = {k: tuple(s) for k, s in _param_shapes(model).items()}
    wdt = np.dtype(_storage_dtype(pol.weights))
    for k, s in shapes.items():  # headers and declared sizes only: nothing of the model's size is read yet
        _need(f"w/{k}" in ar.members, f"weight {k!r} is missing")
        ar.read(f"w/{k}", _spec("f", s, wdt), header_only=True)
    extra = sorted(k for k in ar.members if k.startswith("w/") and k[2:] not in shapes)
    _need(not extra, f"weights the model does not have: {extra}")

    tr = Trainer(pol, cfg, task=task)
    weights = {}
    for k, s in shapes.items():
        w = ar.read(f"w/{k}", _spec("f", s, wdt))
        _need(bool(np.isfinite(w).all()), f"weight {k!r} holds inf or NaN values")
        _need(_representable(w, pol.weights), f"weight {k!r} holds values that are not {pol.weights.name} values")
        weights[k] = w

    # Optimizer: "t" (steps taken), then all moments or (t = 0) none.
    opt = {k[4:] for k in ar.members if k.startswith("opt/")}
    _need("t" in opt, "optimizer entry 't' is missing")
    t = int(ar.read("opt/t", _spec("i", (), max_bytes=8))[()])
    _need(0 <= t <= step, f"optimizer step count t={t} is not in [0, step={step}]")
    names = ("m", "v") if cfg.optimizer == "adamw" else ("buf",)
    want = {"t"} | ({f"{n}.{k}" for n in names for k in shapes} if t else set())
    _need(opt == want, f"optimizer entries: missing {sorted(want - opt)}, unexpected {sorted(opt - want)}")
    ostate: dict[str, np.ndarray] = {"t": np.asarray(t)}
    for key in sorted(want - {"t"}):
        n, k = key.split(".", 1)
        a = ar.read(f"opt/{key}", _spec("f", shapes[k], np.float32))
        _need(not bool(np.isnan(a).any()), f"optimizer moment {key!r} holds NaN values")
        _need(n != "v" or bool((a >= 0).all()), f"optimizer moment {key!r} holds negative values")
        _need(_representable(a, pol.optimizer_state),
              f"optimizer moment {key!r} holds values that are not {pol.optimizer_state.name} values")
        ostate[key] = a

    # Policy runtime: SR generator, FP8 delayed-scaling state, quantization observers.
    rt_keys = {k[3:] for k in ar.members if k.startswith("rt/")}
    rstate: dict[str, np.ndarray] = {}
    if pol.stochastic:
        _need("rng" in rt_keys, "the stochastic-rounding generator state 'rng' is missing")
        st = json.loads(_text(ar.read("rt/rng", _spec("U", (), max_bytes=_SMALL_TEXT))))
        ref = tr.runtime.rng.bit_generator.state
        _need(isinstance(st, dict) and st.get("bit_generator") == ref["bit_generator"] and set(st) == set(ref),
              "the stochastic-rounding generator state is not a "
              f"{ref['bit_generator']} state")
        probe = np.random.default_rng()
        probe.bit_generator.state = st  # raises on a malformed state
        rstate["rng"] = np.asarray(json.dumps(st))
    fp8_keys = {k for k in rt_keys if k.startswith("fp8.")}
    if fp8_keys:
        _need(pol.fp8 is not None, f"FP8 state {sorted(fp8_keys)[:3]} for a policy without FP8")
    sites = {k[4:].rsplit(".", 1)[0] for k in fp8_keys}
    for site in sorted(sites):
        for part in ("scale", "hist", "fmt"):
            _need(f"fp8.{site}.{part}" in rt_keys, f"FP8 state 'fp8.{site}.{part}' is missing")
        assert pol.fp8 is not None
        fmt = pol.fp8.backward if site.endswith(".dy") else pol.fp8.forward
        got = _text(ar.read(f"rt/fp8.{site}.fmt", _spec("U", (), max_bytes=256)))
        _need(got == fmt.name, f"FP8 state of {site!r} is in {got!r}, the policy uses {fmt.name}")
        sc = ar.read(f"rt/fp8.{site}.scale", _spec("f", (), np.float32))
        _need(bool(np.isfinite(sc)) and float(sc) > 0, f"FP8 scale of {site!r} is {float(sc)!r}")
        hist = ar.read(f"rt/fp8.{site}.hist", _spec("f", (pol.fp8.amax_history_len,), np.float32))
        _need(not bool((hist < 0).any()), f"FP8 amax history of {site!r} holds negative values")
        rstate.update({f"fp8.{site}.fmt": np.asarray(got), f"fp8.{site}.scale": sc, f"fp8.{site}.hist": hist})
    obs = {k for k in rt_keys if k.startswith("obs.")}
    if obs:
        _need(pol.quant is not None, "quantization observers for a policy without quant")
    for k in sorted(obs):
        a = ar.read(f"rt/{k}", _spec("f", (2,), np.float32))
        _need(bool(np.isfinite(a).all()), f"observer {k[4:]!r} holds inf or NaN")
        rstate[k] = a
    for k in sorted(x for x in rt_keys if x.startswith("kahan.")):  # pure-BF16 Kahan compensation (amp.bf16)
        _need(pol.update == "kahan" and k[6:] in shapes, f"Kahan compensation {k!r} for a policy or weight without one")
        a = ar.read(f"rt/{k}", _spec("f", shapes[k[6:]], np.float32))
        _need(bool(np.isfinite(a).all()) and _representable(a, pol.params),
              f"Kahan compensation {k!r} holds values that are not finite {pol.params.name} values")
        rstate[k] = a
    unknown = rt_keys - set(rstate)
    _need(not unknown, f"unknown runtime entries {sorted(unknown)}")
    unknown = set(ar.members) - {"meta"} - {f"w/{k}" for k in shapes} - {f"opt/{k}" for k in want} \
        - {f"rt/{k}" for k in rstate}
    _need(not unknown, f"unknown entries {sorted(unknown)}")

    # Loss scaler: the keys and constants of this policy's scaler, a finite positive float32 scale.
    sc_state = meta["scaler"]
    fresh = tr.scaler.state_dict()
    _need(isinstance(sc_state, dict) and set(sc_state) == set(fresh),
          f"loss-scaler state keys {sorted(sc_state) if isinstance(sc_state, dict) else sc_state!r}, "
          f"expected {sorted(fresh)}")
    s = sc_state["scale"]
    _need(_is_num(s) and math.isfinite(s) and s > 0 and float(np.float32(s)) == s,
          f"loss scale {s!r} is not a finite positive float32")
    for k in fresh:
        if k not in ("scale", "_growth_tracker"):
            _need(sc_state[k] == fresh[k], f"loss-scaler {k}={sc_state[k]!r}, the policy's is {fresh[k]!r}")
    if "_growth_tracker" in fresh:
        g = sc_state["_growth_tracker"]
        _need(type(g) is int and 0 <= g < fresh["growth_interval"],
              f"loss-scaler growth tracker {g!r} is not in [0, growth_interval)")
    elif not getattr(tr.scaler, "dynamic", False):
        _need(s == fresh["scale"], f"static loss scale {s!r}, the policy's is {fresh['scale']!r}")
    _check_history(meta["history"], step, set(shapes))
    skipped = sum(meta["history"]["skipped"])
    _need(t == step - skipped, f"optimizer step count t={t}, but {step} steps with {skipped} skipped took "
                               f"{step - skipped} optimizer steps")
    if "runtime_keys" in meta:
        rk = meta["runtime_keys"]
        _need(isinstance(rk, list) and all(isinstance(k, str) for k in rk), "metadata runtime_keys is malformed")
        _need(set(rk) == rt_keys, f"runtime state: missing {sorted(set(rk) - rt_keys)}, "
                                  f"unexpected {sorted(rt_keys - set(rk))}")

    # Everything checked: restore.
    tr.store.weights = weights
    tr.optimizer.load_state_dict(ostate)
    tr.runtime.load_state_dict(rstate)
    tr.runtime.quant_active = meta["quant_active"]
    tr.scaler.load_state_dict(sc_state)
    tr.history = History(meta["history"])
    tr.step_count = step
    tr._wall_offset = float(wall)
    return tr
