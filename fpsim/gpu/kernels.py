"""The catalogue of every CUDA kernel fpsim generates, the architectures each claims, and a compile check (edges).

:func:`catalogue` enumerates the generators' own tables, so a new instruction or conversion appears here
without an edit: every conversion of :data:`fpsim.gpu.convert.CONVERSIONS` (format x rounding x saturate), every
``mma.sync`` instruction of :mod:`fpsim.gpu.fragments` (input x output type, and the block-scaled ones; the probe
runs these same kernels, it has none of its own), and every ``wgmma`` path of :data:`fpsim.gpu.run_all.WGMMA_PATHS` at N = 8 (what the
cross-check runs) and N = 256 (the largest, 128 accumulator registers in one ``asm``).

Each :class:`Kernel` claims the architectures of :data:`ARCHS` from its minimum compute capability up, or
exactly ``sm_<min>a`` for an instruction that exists on an architecture-specific target only (``wgmma``:
sm_90a; an instruction says so with an ``arch_suffix`` attribute). :func:`check` compiles one kernel for one
architecture with NVRTC (:mod:`fpsim.gpu._nvrtc`, no CuPy, no GPU) with the options a CuPy run uses
(:func:`nvrtc_options`), to PTX and cubin; below the minimum (or on another target, for ``a`` kernels) the
compile must be refused.

``python -m fpsim.gpu.kernels --table`` prints the family x architecture table (``--nvrtc PATH`` picks an NVRTC).

>>> from fpsim.gpu.kernels import catalogue
>>> k = next(k for k in catalogue() if k.family == "wgmma")
>>> k.claims, k.min_arch
(('sm_90a',), 'sm_90a')
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from ._compile import CUPY_APPENDS, compile_options
from ._nvrtc import NVRTC, CompileResult, load_nvrtc, parse_arch
from .._fpenv import ieee_mode

__all__ = ["ARCHS", "Check", "Kernel", "catalogue", "check", "judge", "main", "nvrtc_options", "presets_for", "table"]

#: The real architectures the catalogue is checked on: Volta, Turing, Ampere (A100, GA10x), Ada, Hopper (and its
#: architecture-specific sm_90a), datacenter Blackwell (sm_100, sm_100a), RTX Blackwell (sm_120, sm_120a).
ARCHS: tuple[str, ...] = ("sm_70", "sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100", "sm_100a",
                          "sm_120", "sm_120a")

# The compute capability of each architecture name fpsim's NVIDIA device table uses (fpsim.mma.preset_table).
_ARCH_CC = {"Volta": 70, "Turing": 75, "Ampere": 80, "Ada Lovelace": 89, "Hopper": 90, "Blackwell": 100,
            "RTX Blackwell (sm_120)": 120}


@ieee_mode
@dataclass(frozen=True)
class Kernel:
    """One generated kernel: its family, a unique label, entry point, CUDA source and where it compiles.

    ``min_cc`` is the lowest compute capability (10*major + minor) whose target has every instruction it uses;
    ``arch_suffix`` is ``"a"`` when it compiles for ``sm_<min_cc>a`` only; ``io`` the (input, output) formats
    of an MMA kernel and ``preset_path`` the ``path=`` of the presets it checks.
    """

    family: str
    label: str
    name: str
    source: str
    min_cc: int
    arch_suffix: str = ""
    max_cc: int | None = None
    io: tuple[str, str] | None = None
    preset_path: str | None = None
    used_by: tuple[str, ...] = ()
    also: tuple[str, ...] = ()  # further architectures of ARCHS where it compiles (measured, see catalogue)

    @property
    def claims(self) -> tuple[str, ...]:
        """The architectures of :data:`ARCHS` this kernel must compile for."""
        if self.arch_suffix:
            return tuple(a for a in ARCHS if parse_arch(a) == (self.min_cc, self.arch_suffix) or a in self.also)
        top = self.max_cc if self.max_cc is not None else 10**6
        return tuple(a for a in ARCHS if self.min_cc <= parse_arch(a)[0] <= top)

    @property
    def refused(self) -> tuple[str, ...]:
        """The architectures of :data:`ARCHS` on which a compile must fail."""
        return tuple(a for a in ARCHS if a not in self.claims)

    @property
    def min_arch(self) -> str:
        return f"sm_{self.min_cc}{self.arch_suffix}"


@ieee_mode
def presets_for(kernel: Kernel) -> tuple[str, ...]:
    """The NVIDIA presets (device names) whose model a device run of `kernel` checks (none for conversions)."""
    if kernel.io is None:
        return ()
    from ..mma import preset_table

    inp, out = kernel.io
    top = kernel.max_cc if kernel.max_cc is not None else 10**6
    devs = []
    for r in preset_table():
        cc = _ARCH_CC.get(str(r["arch"]))
        runs = cc is not None and (cc == kernel.min_cc if kernel.arch_suffix else kernel.min_cc <= cc <= top)
        if runs and r["vendor"] == "NVIDIA" and (r["input"], r["output"], r["path"]) == (inp, out, kernel.preset_path):
            devs.append(str(r["device"]))
    return tuple(dict.fromkeys(devs))


@ieee_mode
@lru_cache(maxsize=1)
def catalogue() -> tuple[Kernel, ...]:
    """Every kernel fpsim can generate, conversions first, then ``mma.sync``, then ``wgmma``."""
    from .convert import CONVERSION_MIN_CC, CONVERSIONS, KERNEL_NAME, conversion_kernel_source
    from .fragments import _INSTRUCTIONS, BLOCK_SCALED_INSTRUCTIONS, GENERATION_INSTRUCTIONS, mma_kernel_source
    from .fragments import KERNEL_NAME as MMA_NAME
    from .run_all import WGMMA_PATHS
    from .wgmma import WGMMA_KERNEL_NAME, wgmma_instruction, wgmma_kernel_source

    out: list[Kernel] = []
    for fmt, rnd, sat in CONVERSIONS:
        out.append(Kernel("convert", f"{fmt} {rnd}{' satfinite' if sat else ''}", KERNEL_NAME,
                          conversion_kernel_source(fmt, rnd, saturate=sat), CONVERSION_MIN_CC.get(fmt, 70),
                          used_by=("crosscheck_round",)))
    # The instruction table itself, not PATHS: a row may share its (input, output) with another shape.
    # then each generation's own shapes (Turing m16n8k8, sm_120a kind::f8f6f4, sm_120a block-scaled)
    for ins in (*_INSTRUCTIONS.values(), *GENERATION_INSTRUCTIONS.values(), *BLOCK_SCALED_INSTRUCTIONS.values()):
        # kind::f8f6f4 with FP8 operands also assembles for sm_100a (NVRTC 13.5, measured; fp6/fp4 do not)
        also = ("sm_100a",) if getattr(ins, "kind", "") == "f8f6f4" and ins.input.width == 8 else ()
        out.append(Kernel("mma.sync", ins.ptx, MMA_NAME, mma_kernel_source(ins), int(ins.min_cc),
                          str(getattr(ins, "arch_suffix", "") or ""), getattr(ins, "max_cc", None),
                          (ins.input.name, ins.output.name), getattr(ins, "preset_path", None),
                          ("crosscheck_mma", "probe"), also))
    for inp, outp in WGMMA_PATHS:
        for n in (8, 256):
            w = wgmma_instruction(inp, outp, n)
            out.append(Kernel("wgmma", w.ptx, WGMMA_KERNEL_NAME, wgmma_kernel_source(w), w.min_cc, w.arch_suffix,
                              None, (w.input.name, w.output.name), "wgmma", ("crosscheck_wgmma",)))
    return tuple(out)


@ieee_mode
def nvrtc_options(arch: str, include: str | None = None) -> tuple[str, ...]:
    """The options NVRTC receives when CuPy builds a kernel for `arch` through :func:`fpsim.gpu._compile.build_kernel`.

    fpsim's own options (``--gpu-architecture=sm_XXa`` only for an ``a`` target), then what CuPy 14.2 appends:
    ``-ftz=true``, ``--device-as-default-execution-space`` and ``-arch=sm_XX`` for the device.
    """
    cc, suffix = parse_arch(arch)
    opts = [o for o in compile_options(None, arch if suffix else None) if not o.startswith("-I")]
    if include:
        opts.append("-I" + include)
    return (*opts, *CUPY_APPENDS, f"-arch=sm_{cc}")


@ieee_mode
@dataclass(frozen=True)
class Check:
    """The outcome of compiling one kernel for one architecture.

    ``status``: ``"compiles"`` (PTX and cubin made), ``"refused"`` (NVRTC or ptxas said no) or ``"unsupported"``
    (this NVRTC cannot target the architecture at all: nothing was tested). ``expected`` says whether that
    is what the kernel claims (None when unsupported).
    """

    kernel: Kernel
    arch: str
    status: str
    expected: bool | None
    detail: str
    seconds: float

    @property
    def cell(self) -> str:
        """A table cell: ``ok`` (compiles, claimed), ``refused`` (as expected), ``n/a`` or a FAIL."""
        if self.status == "unsupported":
            return "n/a"
        if self.expected:
            return "ok" if self.status == "compiles" else "refused"
        return f"FAIL: {self.status}"


@ieee_mode
def check(kernel: Kernel, arch: str, nvrtc: NVRTC, include: str | None = None) -> Check:
    """Compile `kernel` for `arch` with `nvrtc` (CuPy's options) and say whether the outcome is the claimed one.

    A compile counts as ``compiles`` only with PTX whose ``.target`` is `arch` and a non-empty cubin.
    """
    if not nvrtc.supports(arch):
        return Check(kernel, arch, "unsupported", None,
                     f"NVRTC {nvrtc.version[0]}.{nvrtc.version[1]} cannot target {arch}", 0.0)
    t0 = time.perf_counter()
    r = nvrtc.compile(kernel.source, nvrtc_options(arch, include))
    return judge(kernel, arch, r, time.perf_counter() - t0)


@ieee_mode
def judge(kernel: Kernel, arch: str, r: CompileResult, seconds: float = 0.0) -> Check:
    """The :class:`Check` of an NVRTC result `r` for `kernel` on `arch`."""
    if r.ok and r.target == arch and r.cubin:
        status, detail = "compiles", f"{len(r.cubin)} B cubin"
    elif r.ok:
        status, detail = "wrong target", f"PTX .target {r.target!r}, cubin {len(r.cubin)} B"
    else:
        status, detail = "refused", r.first_error
    claimed = arch in kernel.claims
    return Check(kernel, arch, status, status != "wrong target" and (status == "compiles") == claimed, detail,
                 seconds)


@ieee_mode
def table(checks: Sequence[Check]) -> str:
    """Markdown: one row per kernel, one column per architecture of :data:`ARCHS`."""
    archs = [a for a in ARCHS if any(c.arch == a for c in checks)]
    rows = ["| family | kernel | min | " + " | ".join(archs) + " |", "|---|---|---|" + "---|" * len(archs)]
    seen: dict[tuple[str, str], dict[str, str]] = {}
    mins: dict[tuple[str, str], str] = {}
    for c in checks:
        key = (c.kernel.family, c.kernel.label)
        seen.setdefault(key, {})[c.arch] = c.cell
        mins[key] = c.kernel.min_arch
    for (fam, label), cells in seen.items():
        rows.append(f"| {fam} | `{label}` | {mins[(fam, label)]} | " + " | ".join(cells.get(a, "") for a in archs)
                    + " |")
    return "\n".join(rows)


@ieee_mode
def main(argv: list[str] | None = None) -> int:
    """``python -m fpsim.gpu.kernels [--table] [--nvrtc PATH] [--arch sm_XX ...]``: exit 1 on any FAIL cell."""
    ap = argparse.ArgumentParser(prog="python -m fpsim.gpu.kernels", description=__doc__.split("\n\n")[0])
    ap.add_argument("--table", action="store_true", help="compile everything with NVRTC and print the table")
    ap.add_argument("--nvrtc", default=None, help="path of libnvrtc.so.* (default: FPSIM_NVRTC or the pip wheel)")
    ap.add_argument("--arch", action="append", choices=ARCHS, help="only these architectures (repeatable)")
    args = ap.parse_args(argv)
    kernels = catalogue()
    if not args.table:
        for k in kernels:
            print(f"{k.family:8s} {k.label:60s} {k.min_arch:8s} {' '.join(k.claims)}")
        return 0
    try:
        nv = load_nvrtc(args.nvrtc)
    except OSError as e:
        print(f"fpsim.gpu.kernels: {e}", file=sys.stderr)
        return 2
    inc = nv.include_dir
    t0 = time.perf_counter()
    checks = [check(k, a, nv, inc) for k in kernels for a in (args.arch or ARCHS)]
    print(f"NVRTC {nv.version[0]}.{nv.version[1]} ({nv.path}); headers {inc}; {len(checks)} compiles in "
          f"{time.perf_counter() - t0:.1f} s\n")
    print(table(checks))
    bad = [c for c in checks if c.expected is False]
    for c in bad:
        print(f"FAIL {c.kernel.family} {c.kernel.label} {c.arch}: {c.status}: {c.detail}")
    na = sorted({c.arch for c in checks if c.status == "unsupported"})
    if na:
        print(f"\nn/a: NVRTC {nv.version[0]}.{nv.version[1]} cannot target {', '.join(na)} (nothing tested there)")
    return 1 if bad else 0


if __name__ == "__main__":  # pragma: no cover - the command line
    raise SystemExit(main())
