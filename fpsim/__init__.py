"""fpsim: bit-exact floating-point precision simulator and teaching library.

>>> import fpsim
>>> float(fpsim.round(3.14159, "bf16"))
3.140625
"""

from __future__ import annotations

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

# L1 arithmetic, L2 matrix units and summation orders (NumPy only)
from . import accumulate, arith, mma  # submodules first: the name `array` below is the function
from .accumulate import dot, sum  # noqa: A004 - fpsim.sum shadows the builtin on purpose
from .arith import add, div, fma, mul, sqrt, sub
from .array import FPArray, array
from .mma import matmul

# L3 layers, L4 precision (scaling, quantization, policies), L5 training (NumPy only; plot, testing and
# gpu are imported on demand: `import fpsim.plot`)
from . import amp, nn, quant, scaling, train

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
