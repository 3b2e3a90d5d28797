"""Build the optional C extensions: the rounding kernel (without it fpsim falls back to its NumPy kernel) and
the FTZ/DAZ control (without it fpsim raises FloatingPointError where flush-to-zero is on).

Two packaging details (issue 19):

* The shipped .so files carry no debug info: Python's own CFLAGS hold ``-g`` (the kernel was 633 KB with it,
  about 100 KB without), so gcc/clang builds add ``-g0`` and, on ELF platforms, strip at link (``-s``). Only
  for the "unix" compiler class (gcc, clang, including macOS, where only ``-g0`` is added: ld64 ignores
  ``-s`` as obsolete); MSVC gets no extra flags. ``FPSIM_DEBUG_BUILD=1`` keeps the debug info for a local debug build.
* The wheel's tags say what it holds: both extensions are optional, so without a working compiler the build
  succeeds with neither, and setuptools would still tag that wheel ``cpXY-cpXY-<platform>`` (it decides from
  the *declared* extensions). ``bdist_wheel`` below looks at what was built: no compiled module, pure
  ``py3-none-any`` wheel.
"""

import os
import sys

from setuptools import Extension, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_ext import build_ext


class BuildExt(build_ext):
    """Add the optimisation and no-debug-info flags for gcc/clang only (the flags MSVC would not know)."""

    def build_extensions(self):
        if self.compiler.compiler_type == "unix":
            compile_args = ["-O3"]
            link_args = []
            if os.environ.get("FPSIM_DEBUG_BUILD", "") in ("", "0"):
                compile_args.append("-g0")  # after Python's CFLAGS on the command line, so it overrides -g
                if sys.platform != "darwin":
                    link_args.append("-s")  # drop the symbol table too (PyInit_* stays in .dynsym)
            for ext in self.extensions:
                extra = list(compile_args)
                if ext.name == "fpsim._carith":
                    # its fma switches the rounding mode (fesetround): no constant folding, contraction or
                    # reordering across the switch (gcc/clang spellings, hence here and not for MSVC)
                    extra += ["-frounding-math", "-fno-trapping-math", "-ffp-contract=off"]
                ext.extra_compile_args = list(ext.extra_compile_args or []) + extra
                ext.extra_link_args = list(ext.extra_link_args or []) + link_args
        super().build_extensions()


class BdistWheel(bdist_wheel):
    """Tag the wheel by what it contains: platform-tagged with a compiled module, ``py3-none-any`` without."""

    def run(self):
        if not self.skip_build and self.distribution.ext_modules:
            self.reinitialize_command("build_ext").inplace = False  # as bdist_wheel.run does
            self.run_command("build")  # runs once: bdist_wheel.run's own run_command("build") is then a no-op
            outputs = self.get_finalized_command("build_ext").get_outputs()
            if not any(os.path.exists(path) for path in outputs):
                print(
                    "fpsim: no C extension was built (no working compiler?): building a pure py3-none-any "
                    "wheel; fpsim falls back to its NumPy kernel",
                    file=sys.stderr,
                )
                self.distribution.ext_modules = []  # install: purelib layout, no build_ext rerun
                self.root_is_pure = True
        super().run()


setup(
    ext_modules=[
        # _csink.h: the interface by which the kernel hands rounded blocks to _carith (analyze, to_bits);
        # _cpool.h: the worker threads kept between calls (every threaded extension)
        Extension("fpsim._ckernel", sources=["fpsim/_ckernel.c"], depends=["fpsim/_csink.h", "fpsim/_cpool.h"],
                  optional=True),
        # the compiled block-FMA GEMM (fpsim/mma/gemm.py); without it fpsim.mma runs its NumPy reference
        Extension("fpsim._cgemm", sources=["fpsim/_cgemm.c"], depends=["fpsim/_cpool.h"], optional=True),
        # FTZ/DAZ and rounding-mode control (fpsim/_fpenv.py); without it fpsim refuses to run in a thread that
        # flushes subnormals or rounds in a directed mode
        Extension("fpsim._cfpenv", sources=["fpsim/_cfpenv.c"], optional=True),
        # compiled hot paths of the arithmetic layer (fma, pairwise sums, to_bits, analyze); NumPy fallback
        Extension("fpsim._carith", sources=["fpsim/_carith.c"], depends=["fpsim/_csink.h", "fpsim/_cpool.h"],
                  optional=True),
    ],
    cmdclass={"build_ext": BuildExt, "bdist_wheel": BdistWheel},
)
