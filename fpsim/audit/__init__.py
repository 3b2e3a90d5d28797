"""Audit a safetensors checkpoint for low-precision casts: which tensors survive FP8, MXFP4, NVFP4, ...?

``fpsim audit PATH`` (and :func:`audit_checkpoint`) reads a ``.safetensors`` file, or a sharded folder
with its ``*.safetensors.index.json``, tensor by tensor (small ones in batches), and for every *target*
(``FORMAT:SCALING``, e.g. ``fp8_e4m3:tensor``, ``fp4_e2m1:mx32``, ``fp4_e2m1:nvfp4``) reports per tensor
the amax, the shares of nonzero values that underflow to 0, become subnormal, or overflow (saturate, or
become inf/NaN), the SQNR and the max and RMS relative error, with a verdict and the tensors most at risk.
docs/audit.md documents every key, scaling and threshold.

Nothing in a file is trusted: every header (8-byte little-endian length, then JSON) is parsed here and
validated (dtypes, shapes, offsets, sizes, overlaps, bounds against the file size) for **all** files
before any tensor data is read; a bad file raises :class:`SafetensorsError` naming the file and the
tensor. Data is read with ``pread`` into buffers one band of rows at a time (never mapped: a file that
shrinks during an audit is an error naming it, not a SIGBUS) and processed in chunks, so memory stays
bounded by a chunk, never the model (never pickle, never the whole file). Only regular files are opened
(a FIFO or device is refused before ``open``, which would block on a FIFO).

Quantisation is :mod:`fpsim.scaling`'s (current scaling, per-channel, per-block, MX, NVFP4), each
rounding through :func:`fpsim.round`; this module only reads, chunks and counts. Tensors go to Dask
workers (:mod:`fpsim._dask`) as (path, offset, dtype, shape): each worker reads the file itself. Results
are identical to the serial run (same chunks, same order of every sum).

>>> import numpy as np, os, tempfile, fpsim.audit as A
>>> d = tempfile.mkdtemp()
>>> path = A.save_safetensors({"w": np.float32([[0.5, -3.0], [1e-3, 2e-9]])}, os.path.join(d, "m.safetensors"))
>>> rep = A.audit_checkpoint(path, targets=["fp8_e4m3:tensor"], workers=0)
>>> t = rep["tensors"][0]
>>> t["name"], t["dtype"], t["shape"], float(t["amax"])
('w', 'F32', [2, 2], 3.0)
>>> r = t["targets"]["fp8_e4m3:tensor"]
>>> r["underflow"], r["overflow"], r["verdict"]        # 2e-9 * 448/3 is far below E4M3's smallest value
(0.25, 0.0, 'risk')

The audit package (the edges): ``_safetensors.py`` reads (and writes) the files, ``_judge.py`` judges tensors
(targets, quantisation, counts, verdicts), ``_checkpoint.py`` runs a whole checkpoint (serially or on Dask),
``_report.py`` writes the JSON, table and figures, ``_cli.py`` wires ``fpsim audit``.
"""

from __future__ import annotations

from ._checkpoint import AUDIT_JSON_VERSION, at_risk, audit_checkpoint
from ._cli import register_cli
from ._judge import DEFAULT_TARGETS, SCALINGS, THRESHOLDS, Target, audit_tensor, parse_target
from ._report import format_table, plot_audit, to_json
from ._safetensors import DTYPES, SafetensorsError, TensorInfo, list_tensors, read_header, save_safetensors

__all__ = [
    "AUDIT_JSON_VERSION",
    "DEFAULT_TARGETS",
    "DTYPES",
    "SCALINGS",
    "THRESHOLDS",
    "SafetensorsError",
    "Target",
    "TensorInfo",
    "at_risk",
    "audit_checkpoint",
    "audit_tensor",
    "format_table",
    "list_tensors",
    "parse_target",
    "plot_audit",
    "read_header",
    "register_cli",
    "save_safetensors",
    "to_json",
]
