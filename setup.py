"""Build the optional C rounding kernel. Without a compiler fpsim falls back to its NumPy kernel."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("fpsim._ckernel", sources=["fpsim/_ckernel.c"], extra_compile_args=["-O3"], optional=True),
    ]
)
