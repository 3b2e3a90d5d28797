"""CPFloat (Fasi & Mikaitis' C library for custom-precision rounding) through ctypes, for the benchmarks.

CPFloat is a header-only C library; it is not on PyPI and its code (LGPL) must stay out of this repository.
This module builds a tiny shared library from CPFloat's headers in a source directory outside the repository
(``$CPFLOAT_DIR``, default ``/tmp/cpfloat``: ``cpfloat_binary32.h``, ``cpfloat_definitions.h``,
``cpfloat_template.h``, ``cpfloat_threshold_binary32.h``, and PCG's ``pcg_variants.h`` there or in
``$CPFLOAT_PCG_DIR``) with the system C compiler (``$CC``, default ``cc``) and the flags of CPFloat's own
Makefile (:data:`CFLAGS`; extra link flags in ``$CPFLOAT_LDFLAGS``, e.g. ``-L deps/pcg-c/src -lpcg_random``
for an upstream pcg-c whose non-inlined functions live in its library), caches it under
``~/.cache/fpsim-bench/`` (``$FPSIM_BENCH_CACHE``), and exposes one call::

    import _cpfloat
    if _cpfloat.available():
        out = np.empty_like(x)                  # float32
        _cpfloat.round(x, out, "bf16", "rne", threads=1)
    else:
        print("CPFloat skipped:", _cpfloat.skip_reason())

API (kept stable for the other benchmark scripts):

- ``available() -> bool`` and ``skip_reason() -> str`` (why not: headers or compiler absent, build failed);
- ``round(x, out, fmt, mode="rne", threads=1) -> out``: rounds the float32 array ``x`` into the float32 array
  ``out`` (same shape, C-contiguous; ``out`` may be ``x``) with CPFloat's ``cpfloatf_sequential``
  (``threads=1``) or ``cpfloatf_parallel`` on ``threads`` OpenMP threads (``None`` or 0: one per CPU);
  ``fmt`` in :data:`FORMATS`, ``mode`` in :data:`MODES`; returns ``out``;
- ``seed(s)``: resets CPFloat's PCG32 stream used by ``"sr"`` (the library starts from ``seed(0)``; the
  stream, and so the SR bits, depend on the thread count, as in CPFloat);
- ``FORMATS``, ``MODES``, ``CFLAGS``, ``info() -> str``.

What CPFloat rounds to (its ``optstruct``: ``precision`` p, ``emax``, ``subnormal = CPFLOAT_SUBN_USE``,
``explim = CPFLOAT_EXPRANGE_TARG``, no soft errors). CPFloat models IEEE-754-like binary formats only: the
largest finite value is ``2**emax * (2 - 2**(1-p))`` and overflow gives infinity (no saturation or "no
infinity" flag in this version of CPFloat):

- ``bf16`` p=8, emax=127; ``fp16`` p=11, emax=15; ``fp8_e5m2`` p=3, emax=15: exactly fpsim's formats;
- ``fp8_e4m3`` p=4, emax=7: the IEEE-754-style E4M3 (bias 7, the top exponent kept for infinity and NaN:
  emin -6, largest finite 240). This CPFloat has no ``emin`` field (emin = 1 - emax), so OCP E4M3 (fpsim's
  ``fp8_e4m3``: emin -6, emax 8, largest finite 448, no infinity) cannot be expressed: emax=8 would move emin
  to -7 and change every subnormal. With emax=7 the two agree bit for bit on every input of magnitude below
  248 (the subnormal range included); from 248 up CPFloat returns infinity, fpsim 256..448 or NaN
  (``overflow="ieee"``; 448 with ``overflow="saturate"``).

Stochastic rounding is CPFloat's ``CPFLOAT_RND_SP`` (proportional probabilities, 32 random bits from PCG32
per element); only its distribution, not its bits, is comparable with another library's SR.

libgomp's worker threads busy-wait after a parallel region by default, which would steal the CPU from
whatever is timed next on a small machine: unless ``OMP_WAIT_POLICY`` is already set, this module sets it to
``PASSIVE`` before loading the library (it must be set before any OpenMP runtime starts in the process).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["CFLAGS", "FORMATS", "HEADERS", "MODES", "available", "info", "round", "seed", "skip_reason"]

# (precision p, emax) of the CPFloat target format for each fpsim format name, and what differs.
FORMATS: dict[str, tuple[int, int, str]] = {
    "bf16": (8, 127, "same format as fpsim's bf16"),
    "fp16": (11, 15, "same format as fpsim's fp16"),
    "fp8_e4m3": (4, 7, "IEEE-style E4M3 (max 240, infinity); agrees with OCP E4M3 only below 248 in magnitude"),
    "fp8_e5m2": (3, 15, "same format as fpsim's fp8_e5m2"),
}
# fpsim rounding-mode name -> CPFloat's cpfloat_rounding_t value.
MODES: dict[str, int] = {"rna": -1, "rne": 1, "rup": 2, "rdn": 3, "rtz": 4, "sr": 5, "rto": 7}

HEADERS = ("cpfloat_binary32.h", "cpfloat_definitions.h", "cpfloat_template.h",
           "cpfloat_threshold_binary32.h", "pcg_variants.h")
# CPFloat's Makefile: WFLAGS=-Wall -Wextra -pedantic, ARCHFLAGS=-march=native, -std=gnu99, COPTIM=-O3,
# CLIBS=-lm -fopenmp, PCG_INCLUDE=-include pcg_variants.h; plus -fPIC -shared for a loadable library.
CFLAGS = ("-std=gnu99", "-O3", "-march=native", "-fopenmp", "-fPIC", "-shared",
          "-Wall", "-Wextra", "-pedantic", "-include", "pcg_variants.h")

_SHIM = r"""
#include "cpfloat_binary32.h"

static cpfloat_randseedf_t fpsim_randstate;
static cpfloat_bitseed_t fpsim_bitstate;

void fpsim_cpf_seed(unsigned long long s) {
  pcg32_srandom_r(&fpsim_randstate, s, 54u);
  pcg32_srandom_r(&fpsim_bitstate, s ^ 0x9E3779B97F4A7C15ULL, 55u);
}

int fpsim_cpf_max_threads(void) {
#ifdef _OPENMP
  return omp_get_num_procs();
#else
  return 0;
#endif
}

int fpsim_cpf_round(float *X, const float *A, size_t n, unsigned int precision, int emax,
                    int round, int threads) {
  optstruct o;
  memset(&o, 0, sizeof(o));
  strcpy(o.format, "c");
  o.precision = precision;
  o.emax = emax;
  o.subnormal = CPFLOAT_SUBN_USE;
  o.explim = CPFLOAT_EXPRANGE_TARG;
  o.round = (cpfloat_rounding_t)round;
  o.flip = 0; /* no soft errors: CPFLOAT_NO_SOFTERR in older CPFloat, CPFLOAT_SOFTERR_NO in newer (both 0) */
#ifdef FPSIM_CPF_HAS_EMIN
  /* newer CPFloat reads emin, infinities and saturation from the options (a zeroed emin is a format whose
     smallest normal is 1: every value of interest subnormal, wrong and slow); older ones derive emin */
  o.emin = 1 - emax;
  o.infinity = CPFLOAT_INF_USE;
  o.saturation = CPFLOAT_SAT_NO;
#endif
  o.p = 0;
  o.bitseed = &fpsim_bitstate;
  o.randseedf = &fpsim_randstate;
  o.randseed = NULL;
#ifdef _OPENMP
  if (threads == 1)
    return cpfloatf_sequential(X, A, n, &o);
  omp_set_num_threads(threads > 1 ? threads : omp_get_num_procs());
  return cpfloatf_parallel(X, A, n, &o);
#else
  (void)threads;
  return cpfloatf(X, A, n, &o);
#endif
}
"""

_lib: Any = None
_reason: str | None = None
_flags_used: tuple[str, ...] = ()
_lib_path: Path | None = None


def source_dir() -> Path:
    """The CPFloat source directory: ``$CPFLOAT_DIR`` or ``/tmp/cpfloat``."""
    return Path(os.environ.get("CPFLOAT_DIR", "/tmp/cpfloat"))


def _cache_dir() -> Path:
    return Path(os.environ.get("FPSIM_BENCH_CACHE", Path.home() / ".cache" / "fpsim-bench"))


def _version_flags(definitions: Path) -> tuple[str, ...]:
    """Macros for the option fields this CPFloat has (newer releases added ``emin``, ``infinity`` and
    ``saturation`` to ``optstruct``; older ones have none of them)."""
    text = definitions.read_text(encoding="utf-8", errors="replace")
    return ("-DFPSIM_CPF_HAS_EMIN",) if "cpfloat_exponent_t emin;" in text else ()


def _build() -> Any:
    global _flags_used, _lib_path
    src = source_dir()
    pcg = Path(os.environ.get("CPFLOAT_PCG_DIR", src))
    paths = {h: (pcg if h == "pcg_variants.h" else src) / h for h in HEADERS}
    missing = [str(p) for p in paths.values() if not p.is_file()]
    if missing:
        raise RuntimeError(f"CPFloat headers not found in {src} (set CPFLOAT_DIR, and CPFLOAT_PCG_DIR for "
                           f"pcg_variants.h): missing {', '.join(missing)}")
    ldflags = tuple(os.environ.get("CPFLOAT_LDFLAGS", "").split())
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        raise RuntimeError(f"no C compiler: {cc!r} not on PATH (set CC)")
    digest = hashlib.sha256(_SHIM.encode())
    for p in paths.values():
        digest.update(p.read_bytes())
    cache = _cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    shim = cache / "fpsim_cpfloat_shim.c"
    shim.write_text(_SHIM)
    errors = []
    for flags in (CFLAGS, tuple(f for f in CFLAGS if f != "-fopenmp")):  # without OpenMP if libgomp is absent
        tag = hashlib.sha256(digest.digest() + " ".join((cc, *flags, *ldflags)).encode()).hexdigest()[:16]
        lib = cache / f"libfpsim_cpfloat_{tag}.so"
        if not lib.is_file():
            tmp = lib.with_suffix(f".{os.getpid()}.tmp")
            cmd = [cc, *flags, *_version_flags(paths["cpfloat_definitions.h"]), "-I", str(src), "-I", str(pcg),
                   str(shim), "-o", str(tmp), "-lm", *ldflags]
            r = subprocess.run(cmd, cwd=src, capture_output=True, text=True, check=False)
            if r.returncode != 0:
                errors.append(f"{' '.join(cmd)}: {r.stderr.strip()[-400:]}")
                continue
            os.replace(tmp, lib)
        _flags_used = flags
        _lib_path = lib
        return ctypes.CDLL(str(lib))
    raise RuntimeError("building CPFloat failed: " + " | ".join(errors))


def _load() -> Any:
    global _lib, _reason
    if _lib is None and _reason is None:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        try:
            lib = _build()
            lib.fpsim_cpf_round.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint,
                                            ctypes.c_int, ctypes.c_int, ctypes.c_int]
            lib.fpsim_cpf_round.restype = ctypes.c_int
            lib.fpsim_cpf_seed.argtypes = [ctypes.c_ulonglong]
            lib.fpsim_cpf_seed.restype = None
            lib.fpsim_cpf_max_threads.restype = ctypes.c_int
            lib.fpsim_cpf_seed(0)
            _lib = lib
        except (RuntimeError, OSError) as e:
            _reason = str(e)
    return _lib


def available() -> bool:
    """Whether CPFloat could be built and loaded (builds it on the first call)."""
    return _load() is not None


def skip_reason() -> str:
    """Why CPFloat is unavailable ('' when it is available)."""
    _load()
    return _reason or ""


def info() -> str:
    """One line: where the library came from and how it was compiled."""
    if not available():
        return f"CPFloat unavailable: {_reason}"
    omp = _lib.fpsim_cpf_max_threads()
    return (f"CPFloat from {source_dir()} built with {os.environ.get('CC', 'cc')} {' '.join(_flags_used)} "
            f"-> {_lib_path} ({'OpenMP, ' + str(omp) + ' CPUs' if omp else 'no OpenMP'})")


def seed(s: int) -> None:
    """Reset the PCG32 stream CPFloat's stochastic rounding draws from."""
    if not available():
        raise RuntimeError(f"CPFloat unavailable: {_reason}")
    _lib.fpsim_cpf_seed(int(s) & (2**64 - 1))


def round(x: np.ndarray, out: np.ndarray, fmt: str, mode: str = "rne", threads: int | None = 1) -> np.ndarray:
    """Round float32 ``x`` into float32 ``out`` with CPFloat (see the module docstring); returns ``out``."""
    if not available():
        raise RuntimeError(f"CPFloat unavailable: {_reason}")
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r} not modelled with CPFloat here; choose one of {sorted(FORMATS)}")
    if mode not in MODES:
        raise ValueError(f"rounding mode {mode!r} not mapped to CPFloat; choose one of {sorted(MODES)}")
    for name, a in (("x", x), ("out", out)):
        if not isinstance(a, np.ndarray) or a.dtype != np.float32 or not a.flags.c_contiguous:
            raise TypeError(f"{name} must be a C-contiguous float32 NumPy array")
    if out.shape != x.shape or not out.flags.writeable:
        raise ValueError(f"out must be a writeable array of x's shape {x.shape}, got {out.shape}")
    if threads is not None and threads < 0:
        raise ValueError(f"threads must be None, 0 (one per CPU) or a positive count, got {threads}")
    p, emax, _ = FORMATS[fmt]
    rc = _lib.fpsim_cpf_round(out.ctypes.data, x.ctypes.data, x.size, p, emax, MODES[mode], threads or 0)
    if rc not in (0,):
        raise RuntimeError(f"CPFloat returned {rc} for {fmt} {mode}")
    return out
