"""The one way fpsim builds a CUDA kernel on a device: CuPy's ``RawModule`` (edges layer, ``gpu/``).

Every runner (conversions, ``mma.sync``, ``wgmma``, the probe) calls :func:`build_kernel`. It compiles through
CuPy's current API, ``cupy.RawModule(code=..., options=...).get_function(name)`` (CuPy 13 and 14 removed
``cupy.cuda.compiler.compile_with_cache``), with the options of :func:`compile_options`:

* ``-std=c++17`` and ``-ftz=true``: what CuPy 14.2 passes by default (it adds ``-ftz=true`` itself too), so the
  compile tests (``tests/test_gpu_compile.py``, NVRTC through ctypes) see exactly what a device run sees;
* ``-I<CUDA headers>`` for ``cuda_fp8.h`` and friends: CuPy's toolkit folder, else the pip wheel's of the
  CUDA major of CuPy's NVRTC (``nvidia/cu13/include``; CUDA 13.5's headers do not compile under NVRTC 12.9);
* ``--gpu-architecture=sm_XXa`` only for an instruction that exists on an architecture-specific target alone
  (``wgmma`` on sm_90a). CuPy then appends its own ``-arch=sm_XX`` (the device's). NVRTC 13.5 takes the
  number of the last ``-arch`` and keeps the ``a`` of any: the PTX target is ``sm_90a`` (measured; the compile
  tests check it on every CI run, against the NVRTC installed there).

A kernel the toolkit cannot build raises :class:`KernelBuildError` (:func:`is_compile_error` is true for it and
for CuPy's own ``CompileException``/``NVRTCError``), and a run records that path as skipped, not failed.

>>> compile_options(None, arch="sm_90a")[:2]
('-std=c++17', '-ftz=true')
"""

from __future__ import annotations

import os
from typing import Any

from ._nvrtc import cuda_include_dir, parse_arch

__all__ = ["BASE_OPTIONS", "CUPY_APPENDS", "KernelBuildError", "build_kernel", "compile_options",
           "device_arch", "is_compile_error"]

#: The options CuPy 14.2's RawModule uses by default (``--std=c++17`` unless one is given; ``-ftz=true`` always).
BASE_OPTIONS: tuple[str, ...] = ("-std=c++17", "-ftz=true")
#: What CuPy 14.2 appends after the caller's options, besides its ``-arch=sm_<device>`` and include folders.
CUPY_APPENDS: tuple[str, ...] = ("-ftz=true", "--device-as-default-execution-space")

# Exception class names that mean "NVRTC or ptxas refused the kernel" in CuPy 12-14.
_COMPILE_ERRORS = frozenset({"CompileException", "NVRTCError"})


class KernelBuildError(RuntimeError):
    """The CUDA toolkit could not build a kernel fpsim generated (an instruction or target it lacks)."""


def compile_options(cp: Any = None, arch: str | None = None) -> tuple[str, ...]:
    """NVRTC options for a kernel: :data:`BASE_OPTIONS`, the CUDA include folder, and the target if `arch` is given.

    `cp` is the CuPy module (for its toolkit folder) or None; `arch` such as ``"sm_90a"``.
    """
    opts = list(BASE_OPTIONS)
    inc = None
    if cp is not None:
        try:
            root = cp.cuda.get_cuda_path()
        except Exception:  # noqa: BLE001  (CuPy without a toolkit lookup: fall back to the pip headers)
            root = None
        if root and os.path.isfile(os.path.join(root, "include", "cuda_fp8.h")):
            inc = os.path.join(root, "include")
    if inc is None and cp is not None:
        try:  # headers of the CUDA major CuPy's NVRTC has: a mismatch breaks cuda_fp8.hpp
            inc = cuda_include_dir(int(cp.cuda.nvrtc.getVersion()[0]))
        except Exception:  # noqa: BLE001  (no NVRTC version from CuPy: CuPy finds its own headers)
            inc = None
    elif cp is None:
        inc = cuda_include_dir()
    if inc:
        opts.append("-I" + inc)
    if arch is not None:
        parse_arch(arch)
        opts.append(f"--gpu-architecture={arch}")
    return tuple(opts)


def device_arch(ins: Any, cc: int) -> str | None:
    """The target to request for instruction `ins` on a device of compute capability `cc` (10*major + minor).

    None (CuPy's default, ``sm_<cc>``) for ordinary instructions; ``sm_<cc><suffix>`` when the instruction's
    ``arch_suffix`` attribute says it exists on an architecture-specific target only (``"a"`` for wgmma).

    >>> from fpsim.gpu import wgmma_instruction, instruction_for
    >>> device_arch(wgmma_instruction(), 90), device_arch(instruction_for("fp16"), 90)
    ('sm_90a', None)
    """
    suffix = str(getattr(ins, "arch_suffix", "") or "")
    return f"sm_{int(cc)}{suffix}" if suffix else None


def build_kernel(cp: Any, source: str, name: str, *, arch: str | None = None) -> Any:
    """Compile `source` with CuPy's RawModule and return its function `name` (a CuPy ``Function``).

    Raises :class:`KernelBuildError` when NVRTC or ptxas refuses it (its first error line in the message).
    """
    opts = compile_options(cp, arch)
    try:
        # RawModule compiles lazily: get_function is where NVRTC runs and where its errors surface.
        return cp.RawModule(code=source, options=opts).get_function(name)
    except Exception as e:  # noqa: BLE001  (re-raised unless it is a compiler refusal)
        if type(e).__name__ not in _COMPILE_ERRORS:
            raise
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        first = next((ln for ln in lines if "error" in ln.lower()), lines[0] if lines else type(e).__name__)
        where = f" for {arch}" if arch else ""
        raise KernelBuildError(f"cannot build {name}{where}: {first}") from e


def is_compile_error(e: BaseException) -> bool:
    """Whether `e` says the CUDA toolkit cannot build a kernel (not a bug in fpsim, not a launch failure).

    True for :class:`KernelBuildError` and CuPy's ``CompileException``/``NVRTCError``; an AttributeError from
    a CuPy API that moved, say, stays an error.
    """
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, KernelBuildError) or type(seen).__name__ in _COMPILE_ERRORS:
            return True
        seen = seen.__cause__
    return False
