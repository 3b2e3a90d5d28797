"""NVIDIA's runtime compiler (NVRTC) through :mod:`ctypes`, without CuPy and without a GPU (edges layer, ``gpu/``).

Used to prove that every kernel fpsim generates compiles for the architectures it claims (and is refused below
them): :mod:`fpsim.gpu.kernels` and ``tests/test_gpu_compile.py``. NVRTC runs ``ptxas`` inside itself, so an
``-arch=sm_XX`` compile yields the PTX *and* the SASS (cubin): an instruction the target lacks is refused there.

Where NVRTC is looked for, first hit wins: the ``FPSIM_NVRTC`` environment variable (the path of
``libnvrtc.so.*``), the ``nvidia-cuda-nvrtc`` wheel (``nvidia/cu13/lib`` for CUDA 13, ``nvidia/cuda_nvrtc/lib``
for CUDA 12), ``$CUDA_PATH``/``$CUDA_HOME``, then the system's library search. The CUDA headers (``cuda_fp16.h``
...) come from ``FPSIM_CUDA_INCLUDE``, the ``nvidia-cuda-runtime`` wheel (``nvidia/cu13/include``,
``nvidia/cuda_runtime/include``) or ``$CUDA_PATH/include``.

>>> from fpsim.gpu._nvrtc import parse_arch
>>> parse_arch("sm_90a")
(90, 'a')
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import importlib.util
import os
import re
from dataclasses import dataclass

__all__ = ["NVRTC", "CompileResult", "cuda_include_dir", "find_nvrtc", "load_nvrtc", "parse_arch"]

# Library file names per wheel layout, newest CUDA first (a CUDA 13 wheel nests everything under cu13/).
_WHEEL_LIBS = ("cu13/lib/libnvrtc.so.13", "cuda_nvrtc/lib/libnvrtc.so.12", "cu13/bin/nvrtc64_*.dll",
               "cuda_nvrtc/bin/nvrtc64_*.dll")
# Header folders per CUDA major: the headers must match NVRTC's major (CUDA 13.5's cuda_fp8.hpp does not
# compile under NVRTC 12.9, measured).
_WHEEL_INCLUDES = {13: ("cu13/include",), 12: ("cuda_runtime/include",)}


def parse_arch(arch: str) -> tuple[int, str]:
    """``"sm_90a"`` -> ``(90, "a")``; ``"sm_80"`` -> ``(80, "")`` (also ``compute_XX``)."""
    m = re.fullmatch(r"(?:sm|compute)_(\d+)([af]?)", arch) if isinstance(arch, str) else None
    if m is None:
        raise ValueError(f"arch must look like 'sm_80', 'sm_90a' or 'compute_90', got {arch!r}")
    return int(m.group(1)), m.group(2)


def _nvidia_dirs() -> list[str]:
    """The folders of the ``nvidia`` namespace package (pip's CUDA wheels), without importing anything heavy."""
    spec = importlib.util.find_spec("nvidia")
    return list(spec.submodule_search_locations or []) if spec is not None else []


def find_nvrtc() -> str | None:
    """Path of the NVRTC shared library to use, or None (see the module docstring for the search order)."""
    env = os.environ.get("FPSIM_NVRTC")
    if env:
        return env
    for base in _nvidia_dirs():
        for pat in _WHEEL_LIBS:
            hits = sorted(glob.glob(os.path.join(base, pat)))
            if hits:
                return hits[-1]
    for var in ("CUDA_PATH", "CUDA_HOME"):
        root = os.environ.get(var)
        if root:
            hits = sorted(glob.glob(os.path.join(root, "lib64", "libnvrtc.so*")))
            if hits:
                return hits[0]
    return ctypes.util.find_library("nvrtc")


def cuda_include_dir(major: int | None = None) -> str | None:
    """A folder holding ``cuda_fp16.h``, ``cuda_bf16.h`` and ``cuda_fp8.h`` for CUDA `major` (any when None).

    ``FPSIM_CUDA_INCLUDE`` wins; then the pip wheels' folders (for `major`, or newest first), then
    ``$CUDA_PATH/include``.
    """
    cands = [os.environ.get("FPSIM_CUDA_INCLUDE", "")]
    majors = [major] if major is not None else sorted(_WHEEL_INCLUDES, reverse=True)
    cands += [os.path.join(b, inc) for m in majors for inc in _WHEEL_INCLUDES.get(m, ()) for b in _nvidia_dirs()]
    cands += [os.path.join(os.environ.get(v, ""), "include") for v in ("CUDA_PATH", "CUDA_HOME") if os.environ.get(v)]
    for c in cands:
        if c and os.path.isfile(os.path.join(c, "cuda_fp8.h")):
            return c
    return None


@dataclass(frozen=True)
class CompileResult:
    """One NVRTC compile: ``ok``, NVRTC's status name, its log, the PTX text and the cubin (empty for compute_XX)."""

    ok: bool
    status: str
    log: str
    ptx: str
    cubin: bytes

    @property
    def target(self) -> str:
        """The ``.target`` line of the PTX, e.g. ``sm_90a`` ('' when there is no PTX)."""
        m = re.search(r"^\.target\s+(\S+)", self.ptx, re.M)
        return m.group(1) if m else ""

    @property
    def first_error(self) -> str:
        """The first line of the log that says ``error`` (else the status)."""
        for line in self.log.splitlines():
            if "error" in line.lower():
                return line.strip()
        return self.status


class NVRTC:
    """A loaded NVRTC: its version, the real architectures it can target, and :meth:`compile`.

    Raises OSError (from :func:`load_nvrtc`) when the library cannot be loaded.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._lib = ctypes.CDLL(path)
        lib = self._lib
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check(lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
        self.version: tuple[int, int] = (major.value, minor.value)
        n = ctypes.c_int()
        self._check(lib.nvrtcGetNumSupportedArchs(ctypes.byref(n)), "nvrtcGetNumSupportedArchs")
        arr = (ctypes.c_int * n.value)()
        self._check(lib.nvrtcGetSupportedArchs(arr), "nvrtcGetSupportedArchs")
        self.archs: tuple[int, ...] = tuple(int(a) for a in arr)

    @property
    def include_dir(self) -> str | None:
        """CUDA headers of this NVRTC's major version (:func:`cuda_include_dir`); next to a toolkit's lib64 first."""
        root = os.path.dirname(os.path.dirname(os.path.realpath(self.path)))
        if os.path.isfile(os.path.join(root, "include", "cuda_fp8.h")):
            return os.path.join(root, "include")
        return cuda_include_dir(self.version[0])

    def _status(self, rc: int) -> str:
        s = self._lib.nvrtcGetErrorString(rc)
        return s.decode() if isinstance(s, bytes) else str(rc)

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise OSError(f"{what} failed: {self._status(rc)}")

    def supports(self, arch: str) -> bool:
        """Whether this NVRTC accepts ``-arch=<arch>`` (its supported list has the number)."""
        return parse_arch(arch)[0] in self.archs

    def compile(self, source: str, options: tuple[str, ...] | list[str], name: str = "fpsim.cu") -> CompileResult:
        """Compile `source` with `options`; a refusal (front end or ptxas) is a result with ``ok=False``."""
        lib = self._lib
        prog = ctypes.c_void_p()
        self._check(lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None),
                    "nvrtcCreateProgram")
        try:
            opts = [o.encode() for o in options]
            rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
            size = ctypes.c_size_t()
            self._check(lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)), "nvrtcGetProgramLogSize")
            buf = ctypes.create_string_buffer(size.value)
            self._check(lib.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
            log = buf.value.decode(errors="replace")
            ptx, cubin = "", b""
            if rc == 0:
                self._check(lib.nvrtcGetPTXSize(prog, ctypes.byref(size)), "nvrtcGetPTXSize")
                buf = ctypes.create_string_buffer(size.value)
                self._check(lib.nvrtcGetPTX(prog, buf), "nvrtcGetPTX")
                ptx = buf.value.decode(errors="replace")
                # compute_XX targets make no cubin: NVRTC then reports size 0 (or an error status)
                if lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)) == 0 and size.value:
                    raw = ctypes.create_string_buffer(size.value)
                    self._check(lib.nvrtcGetCUBIN(prog, raw), "nvrtcGetCUBIN")
                    cubin = raw.raw
            return CompileResult(ok=rc == 0, status=self._status(rc), log=log, ptx=ptx, cubin=cubin)
        finally:
            lib.nvrtcDestroyProgram(ctypes.byref(prog))

    def __repr__(self) -> str:
        return f"NVRTC({self.version[0]}.{self.version[1]}, sm_{{{','.join(map(str, self.archs))}}}, {self.path!r})"


def load_nvrtc(path: str | None = None) -> NVRTC:
    """Load NVRTC from `path` or :func:`find_nvrtc`; raise OSError naming where it looked when there is none."""
    p = path or find_nvrtc()
    if not p:
        raise OSError("NVRTC not found: set FPSIM_NVRTC to libnvrtc.so.*, or pip install nvidia-cuda-nvrtc "
                      "(CUDA 13) or nvidia-cuda-nvrtc-cu12")
    return NVRTC(p)
