"""fpsim: bit-exact floating-point precision simulator and teaching library.

>>> import fpsim
>>> float(fpsim.round(3.14159, "bf16"))
3.140625
"""

from __future__ import annotations

import importlib as _importlib
import typing as _typing

# First: every submodule below compiles and runs its body in round-to-nearest with IEEE subnormals, whatever
# mode the importing thread has (docs/fp-environment.md, "Imports")
from ._fpenv import install_import_guard as _install_import_guard

_install_import_guard(__name__)

# L0 numbers
from .bits import bits_str, code_dtype, from_bits, ml_dtype, to_bits, to_ml_dtypes
from .formats import (
    Format,
    NaNEncoding,
    all_formats,
    as_format,
    bf16,
    e8m0,
    format_names,
    fp4_e2m1,
    fp6_e2m3,
    fp6_e3m2,
    fp8_e3m4,
    fp8_e4m3,
    fp8_e4m3_ieee,
    fp8_e4m3b11fnuz,
    fp8_e4m3fnuz,
    fp8_e5m2,
    fp8_e5m2fnuz,
    fp16,
    fp32,
    fp64,
    register,
    hif8,
    tf32,
    ue5m3,
)
from .rounding import Overflow, Rounding, RoundingReport, analyze, as_overflow, as_rounding, round
from . import random  # counter-based streams for rounding="sr" (rounding imports it)

# L1 arithmetic (NumPy only)
from . import accumulate, arith  # submodules first: the name `array` below is the function
from .accumulate import dot, sum  # noqa: A004 - fpsim.sum shadows the builtin on purpose
from .arith import add, div, fma, mul, sqrt, sub
from .array import FPArray, array

# L2 matrix units up to L5 training load on first use (PEP 562, as SciPy does): `import fpsim` costs little
# more than `import numpy`, so every CLI call, test process and xdist worker starts fast (issue 30).
# `fpsim.train`, `from fpsim import amp` and `fpsim.matmul` import what they name when first touched.
# plot, testing and gpu were always imported on demand: `import fpsim.plot`.
_LAZY_MODULES = ("mma", "quant", "scaling", "nn", "amp", "train")
_LAZY_NAMES = {"matmul": "mma"}

if _typing.TYPE_CHECKING:  # what the type checker and IDEs see; at run time __getattr__ imports these
    from . import amp, mma, nn, quant, scaling, train
    from .mma import matmul
else:  # hidden from the type checker, which would otherwise accept any attribute of fpsim (typos included)

    def __getattr__(name: str) -> _typing.Any:
        if name in _LAZY_MODULES:
            return _importlib.import_module(f".{name}", __name__)  # binds fpsim.<name> as import does
        if name in _LAZY_NAMES:
            value = getattr(_importlib.import_module(f".{_LAZY_NAMES[name]}", __name__), name)
            globals()[name] = value
            return value
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(globals()) | set(_LAZY_MODULES) | set(_LAZY_NAMES))


__version__ = "0.1.0"

__all__ = [
    "__version__",
    "mma",
    "matmul",
    "quant",
    "scaling",
    "nn",
    "amp",
    "train",
    "random",
    # formats
    "Format",
    "NaNEncoding",
    "all_formats",
    "as_format",
    "format_names",
    "register",
    "fp64",
    "fp32",
    "tf32",
    "fp16",
    "bf16",
    "fp8_e4m3",
    "fp8_e5m2",
    "fp8_e4m3fnuz",
    "fp8_e5m2fnuz",
    "fp6_e2m3",
    "fp6_e3m2",
    "fp4_e2m1",
    "e8m0",
    "fp8_e4m3_ieee",
    "fp8_e3m4",
    "fp8_e4m3b11fnuz",
    "ue5m3",
    "hif8",
    # rounding
    "Rounding",
    "Overflow",
    "round",
    "as_rounding",
    "as_overflow",
    "analyze",
    "RoundingReport",
    # bits
    "to_bits",
    "from_bits",
    "bits_str",
    "to_ml_dtypes",
    "ml_dtype",
    "code_dtype",
    # arithmetic, FPArray, summation orders
    "arith",
    "accumulate",
    "add",
    "sub",
    "mul",
    "div",
    "sqrt",
    "fma",
    "array",
    "FPArray",
    "sum",
    "dot",
]
