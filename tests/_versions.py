"""What installed third-party libraries do, by version: facts about a version, not truths.

A test that pins another library's behaviour reads it from here, so the statement carries its version.
The oracle (MPFR) says what is right; these say what a version does. Each entry was observed on the
versions named; anything outside them is only checked against the oracle (see the tests that use them).
"""

from __future__ import annotations

import re

import ml_dtypes


def version_tuple(text: str) -> tuple[int, ...]:
    """'2.13.0+cpu' -> (2, 13, 0); pre-release suffixes are ignored."""
    return tuple(int(p) for p in re.findall(r"\d+", text.split("+")[0])[:3])


ML_DTYPES = version_tuple(ml_dtypes.__version__)
NUMPY = version_tuple(__import__("numpy").__version__)

# NumPy 1.24 (the declared floor): an in-place ufunc chain and the same expression into new arrays can give
# NaN results different sign/payload bits (every other value the same; seen in fpsim's buffer-reusing layers and
# AdamW against their plain expressions); NumPy 2.x gives the same bits, NaNs included. IEEE 754 leaves a NaN's
# sign and payload open there, so neither is wrong.
NUMPY_NAN_BITS_DEPEND_ON_BUFFERS = NUMPY < (2, 0)

# ml_dtypes before 0.7 casts float64 to bfloat16 and the float8 types through float32 (two roundings:
# seen on 0.5.0 and 0.6.x); 0.7.0 rounds float64 once, correctly.
ML_DTYPES_FLOAT64_DOUBLE_ROUNDS = ML_DTYPES < (0, 7)

# ml_dtypes 0.5.0 rounds half of the exact float32 ties between two float8_e8m0fnu values the wrong way
# (126 of the 253 ties; MPFR sides with fpsim); 0.6.0 and 0.7.0 round every tie correctly.
ML_DTYPES_E8M0_TIES_DEFECT = ML_DTYPES < (0, 6)

# ml_dtypes 0.5 and 0.6 round float32 *subnormal* inputs into float8_e8m0fnu the wrong way (MPFR sides
# with fpsim); 0.7.0 rounds them correctly.
ML_DTYPES_E8M0_SUBNORMAL_DEFECT = ML_DTYPES < (0, 7)


def torch_version() -> tuple[int, ...]:
    import torch

    return version_tuple(torch.__version__)


# torch casts float64 tensors to bfloat16, float16 and float8 through float32 (observed on 2.13.0 CPU).
TORCH_FLOAT64_DOUBLE_ROUNDS_SEEN_ON = {(2, 13)}


def bitsandbytes_version() -> tuple[int, ...]:
    import bitsandbytes

    return version_tuple(bitsandbytes.__version__)


# bitsandbytes 0.50.2's CPU blockwise 8-bit quantization (csrc/cpu_ops.cpp quantize_cpu_impl, used for the
# double-quantized NF4 absmax constants) returns lut[(uint16)fma((clamp(v)+1)*0.5, 65535, 0.5)] from a
# 65536-bin table (bin i at 2i/65535 - 1 mapped to the count of map midpoints below it) instead of the
# nearest map entry: for a value within about half a bin (2**-16) of a midpoint between two map entries
# it can return the farther entry (observed on 0.50.2 CPU; older cpu_ops.cpp sources binary-search the
# map, BinAlgo Direct2). Near 0, where map entries are closer than a bin, up to 4 entries from the nearest.
BITSANDBYTES_CPU_LUT_QUANTIZE_SEEN_ON = {(0, 50, 2)}
