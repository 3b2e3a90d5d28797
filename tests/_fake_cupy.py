"""A fake CuPy whose "GPU" computes with fpsim's presets, for running the GPU plumbing without a device.

It checks the wiring only (kernel names, argument order and shapes, launch sizes, device queries), never the
numerics: every kernel is recognised from its source and emulated on the CPU with the preset of the device it
claims to be. Like CuPy 14 it builds kernels only through ``RawModule(code=...)``: the removed
``cupy.cuda.compiler.compile_with_cache`` and ``RawKernel`` are absent, so code still calling them fails here.

In this process: ``install(monkeypatch)``. In a child process (``tools/gpu_crosscheck.sh``):
``write_shim(folder)`` writes a ``cupy`` package there that installs the fake on import; put the folder first on
``PYTHONPATH``.
"""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np

import fpsim


def _kernel(src: str, name: str, device: str, launches: list[tuple[str, int, int]]) -> Any:
    from fpsim.gpu.convert import CONVERSIONS
    from fpsim.gpu.fragments import BLOCK_SCALED_INSTRUCTIONS, GENERATION_INSTRUCTIONS, PATHS, instruction_for
    from fpsim.gpu.mma_check import block_scaled_model_for, emulate_block_scaled, emulate_words
    from fpsim.gpu.wgmma import emulate_wgmma, wgmma_instruction
    from fpsim.mma import get_model

    def call(grid: tuple[int, ...], block: tuple[int, ...], args: tuple[Any, ...]) -> None:
        threads = int(grid[0]) * int(block[0])
        assert int(block[0]) % 32 == 0, block
        if name == "fpsim_mma" and len(args) == 7:  # block-scaled: a, b, c, sa, sb, d, tiles
            a, b, c, sa, sb, d, t = args
            assert isinstance(t, np.int32) and threads >= int(t) * 32
            ptx = re.search(r'asm volatile\("(\S+) ', src).group(1)  # type: ignore[union-attr]
            ins = next(i for i in BLOCK_SCALED_INSTRUCTIONS.values() if i.ptx == ptx)
            assert sa.shape == sb.shape == (int(t), 32), (sa.shape, sb.shape)
            model = block_scaled_model_for(ins, device)
            d[...] = emulate_block_scaled(a, b, c, sa, sb, ins, model)
            launches.append((ptx, threads, int(t)))
        elif name == "fpsim_mma":
            a, b, c, d, t = args
            assert isinstance(t, np.int32) and threads >= int(t) * 32
            ptx = re.search(r'asm volatile\("(\S+) ', src).group(1)  # type: ignore[union-attr]
            ins = next(i for i in [instruction_for(*pa) for pa in PATHS] + list(GENERATION_INSTRUCTIONS.values())
                       if i.ptx == ptx)
            d[...] = emulate_words(a, b, c, ins, get_model(device, ins.input, ins.output))
            launches.append((ptx, threads, int(t)))
        elif name == "fpsim_wgmma":
            a, b, c, d, t = args
            assert isinstance(t, np.int32) and threads == int(t) * 128
            ptx = re.search(r"(wgmma\.mma_async\.\S+?)\s", src).group(1)  # type: ignore[union-attr]
            ins = next(w for i in ("fp8_e4m3", "fp8_e5m2") for o in ("fp32", "fp16") for n in (8, 16, 32, 64, 128, 256)
                       if (w := wgmma_instruction(i, o, n)).ptx == ptx)
            model = get_model(device, ins.input, ins.output, path="wgmma")
            d[...] = emulate_wgmma(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8), c, ins, model)
            launches.append((ptx, threads, int(t)))
        elif name == "fpsim_cvt":
            x, out, n = args
            assert isinstance(n, np.int64) and threads >= int(n) and x.dtype == np.float32
            (fmt, rnd, sat), = [k for k, expr in CONVERSIONS.items() if f"out[i] = {expr};" in src]
            out[...] = fpsim.to_bits(x, fmt, rnd, overflow="saturate" if sat else "ieee")
            launches.append((fmt, threads, int(n)))
        else:
            raise AssertionError(f"the fake CuPy does not know kernel {name!r}")

    return call


class FakeCompileException(Exception):
    """What CuPy's RawModule raises when NVRTC or ptxas refuses a kernel (cupy.cuda.compiler.CompileException)."""


FakeCompileException.__name__ = "CompileException"


def make(name: str = "NVIDIA H200", cc: tuple[int, int] = (9, 0), preset: str = "h200",
         refuse: tuple[str, ...] = ()) -> types.ModuleType:
    """A fake CuPy 14 (``cupy``, ``cupy.cuda``, ``cupy.cuda.compiler``) claiming one device `name`.

    ``RawModule(code=..., options=...).get_function(name)`` is the only way to a kernel, as in CuPy 14: no
    ``RawKernel``, no ``cupy.cuda.compiler.compile_with_cache`` (removed in CuPy 13), so code that still calls
    them fails here as it would on the device. ``modules`` records (code, options) of every build, ``launches``
    every launch; a kernel whose source contains a string of `refuse` fails to compile as NVRTC would.
    """
    launches: list[tuple[str, int, int]] = []
    built: list[tuple[str, tuple[str, ...]]] = []

    class Function:
        def __init__(self, code: str, name: str, options: tuple[str, ...]) -> None:
            self.src, self.name, self.options = code, name, options
            self._call = _kernel(code, name, preset, launches)

        def __call__(self, grid: tuple[int, ...], block: tuple[int, ...], args: tuple[Any, ...], **kw: Any) -> None:
            if self.name == "fpsim_wgmma":
                assert "--gpu-architecture=sm_90a" in self.options  # wgmma exists on sm_90a only
            self._call(grid, block, args)

    class RawModule:
        def __init__(self, code: str | None = None, *, path: str | None = None, options: tuple[str, ...] = (),
                     **kw: Any) -> None:
            assert (code is None) != (path is None), "RawModule needs code= or path="
            assert isinstance(options, tuple) and "-std=c++17" in options and "-ftz=true" in options  # CuPy's
            self.code = code if code is not None else Path(str(path)).read_text(errors="replace")
            self.options = options
            built.append((self.code, options))

        def get_function(self, name: str) -> Function:
            # CuPy compiles lazily: a refusal surfaces from get_function
            bad = [r for r in refuse if r in self.code]
            if bad:
                raise FakeCompileException(f"ptxas application ptx input, line 1; error   : Instruction '{bad[0]}' "
                                           "not supported on .target 'sm_90'")
            assert re.search(rf"void (__launch_bounds__\(\d+\) )?{name}\(", self.code), name
            return Function(self.code, name, self.options)

    class Device:
        def __init__(self, i: int = 0) -> None:
            self.i = i

        def use(self) -> None:
            pass

    runtime = types.SimpleNamespace(
        getDeviceCount=lambda: 1,
        getDeviceProperties=lambda i: {"name": name.encode(), "major": cc[0], "minor": cc[1]},
        runtimeGetVersion=lambda: 13000,
        deviceSynchronize=lambda: None,
    )
    cuda = types.ModuleType("cupy.cuda")
    cuda.runtime = runtime  # type: ignore[attr-defined]
    cuda.Device = Device  # type: ignore[attr-defined]
    cuda.get_cuda_path = lambda: None  # type: ignore[attr-defined]
    cuda.nvrtc = types.SimpleNamespace(getVersion=lambda: (13, 0))  # type: ignore[attr-defined]
    compiler = types.ModuleType("cupy.cuda.compiler")
    compiler.CompileException = FakeCompileException  # type: ignore[attr-defined]
    cuda.compiler = compiler  # type: ignore[attr-defined]
    cp = types.ModuleType("cupy")
    cp.cuda = cuda  # type: ignore[attr-defined]
    cp.__version__ = "fake"  # type: ignore[attr-defined]
    cp.uint32 = np.uint32  # type: ignore[attr-defined]
    cp.asarray = lambda x, dtype=None: np.array(x, dtype=dtype)  # type: ignore[attr-defined]
    cp.asnumpy = lambda x: np.array(x)  # type: ignore[attr-defined]
    cp.zeros = np.zeros  # type: ignore[attr-defined]
    cp.RawModule = RawModule  # type: ignore[attr-defined]
    cp.launches = launches  # type: ignore[attr-defined]
    cp.modules = built  # type: ignore[attr-defined]
    return cp


def modules(cp: types.ModuleType) -> dict[str, types.ModuleType]:
    """The ``sys.modules`` entries that make ``import cupy`` and ``from cupy.cuda import compiler`` find `cp`."""
    return {"cupy": cp, "cupy.cuda": cp.cuda, "cupy.cuda.compiler": cp.cuda.compiler}  # type: ignore[attr-defined]


def install(monkeypatch: Any, **kw: Any) -> types.ModuleType:
    """Make ``import cupy`` give a fresh fake in this process for the rest of the test; returns it."""
    cp = make(**kw)
    for k, v in modules(cp).items():
        monkeypatch.setitem(sys.modules, k, v)
    return cp


def write_shim(folder: Path) -> Path:
    """Write ``folder/cupy/__init__.py``, which replaces itself by the fake on import (for a child process)."""
    pkg = Path(folder) / "cupy"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(
        "# written by tests/_fake_cupy.py: the fake CuPy, for tests only\n"
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})\n"
        "import _fake_cupy\n"
        "sys.modules.update(_fake_cupy.modules(_fake_cupy.make()))\n")
    return pkg
