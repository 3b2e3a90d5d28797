"""Build the optional C extensions: the rounding kernel (without it fpsim falls back to its NumPy kernel) and
the FTZ/DAZ control (without it fpsim raises FloatingPointError where flush-to-zero is on)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("fpsim._ckernel", sources=["fpsim/_ckernel.c"], extra_compile_args=["-O3"], optional=True),
        # FTZ/DAZ control (fpsim/_fpenv.py); without it fpsim refuses to run in a flush-to-zero thread
        Extension("fpsim._cfpenv", sources=["fpsim/_cfpenv.c"], optional=True),
    ]
)
