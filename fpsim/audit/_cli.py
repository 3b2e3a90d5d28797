"""``fpsim audit``: the command's arguments and its wiring to :func:`audit_checkpoint` and the reports.
"""

from __future__ import annotations

import json
import os
from typing import Any

from .._cliargs import printable
from ._checkpoint import _tune_malloc, audit_checkpoint
from ._judge import DEFAULT_TARGETS, SCALINGS, _parse_targets
from ._report import format_table, plot_audit, to_json


# --------------------------------------------------------------------------------------------------
# fpsim audit


def _cmd_audit(args: Any) -> int:
    import sys

    from .._cliargs import flag_value, nonneg_int
    from .._dask import check_scheduler_address

    targets = flag_value("--targets", _parse_targets, args.targets) if args.targets else None
    workers = None if args.workers is None else flag_value("--workers", nonneg_int, args.workers)
    sched = None if args.scheduler is None else flag_value("--scheduler", check_scheduler_address, args.scheduler)
    top = flag_value("--top", nonneg_int, args.top)
    if not os.path.exists(args.path):
        raise ValueError(f"PATH {args.path!r} does not exist (a .safetensors file, an index.json or a folder)")
    if args.plot:  # before the audit, which can take hours: a bad --plot found after it lost the report
        _check_out_dir(args.plot, "--plot")
    _tune_malloc(own_process=True)  # this process is the command's: a serial audit needs ~25% less CPU
    rep = audit_checkpoint(args.path, targets, workers=workers, scheduler=sched, top=top, progress=None)
    # the report first: a late failure (disk full while plotting) must not lose it
    print(to_json(rep) if args.json else format_table(rep), flush=True)
    if args.plot:
        for p in plot_audit(rep, args.plot):
            print(f"wrote {printable(p)}", file=sys.stderr)
    return 0


def _check_out_dir(path: str, flag: str) -> None:
    """Refuse an output folder that cannot be created or written (``ValueError`` naming ``flag``), without
    creating anything: it, or its nearest existing ancestor, must be a writable folder; matplotlib must
    be importable."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise ValueError(f"{flag} needs matplotlib (pip install matplotlib)")
    d = os.path.abspath(path)
    probe = d
    while not os.path.exists(probe):  # nearest existing ancestor (a dangling link does not exist either)
        if os.path.lexists(probe):
            raise ValueError(f"{flag} {path!r}: {probe!r} is a broken symbolic link")
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        what = "is" if probe == d else f"cannot be created: {probe!r} is"
        raise ValueError(f"{flag} {path!r} {what} not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {path!r}: folder {probe!r} is not writable")


def register_cli(subparsers: Any) -> None:
    """Add ``audit`` to the ``fpsim`` command's subparsers."""
    s = subparsers.add_parser(
        "audit", help="audit a safetensors checkpoint for low-precision casts (FP8, MXFP4, NVFP4, ...)",
        description="Read a .safetensors checkpoint (a file, or a sharded folder with its index.json) tensor by "
                    "tensor and report, per tensor and target FORMAT:SCALING, the shares "
                    "that underflow, become subnormal or overflow, the SQNR and relative errors, with a verdict "
                    "(docs/audit.md).")
    s.add_argument("path", metavar="PATH", help="a .safetensors file, a *.safetensors.index.json, or a folder")
    s.add_argument("--targets", nargs="+", default=None, metavar="FORMAT:SCALING",
                   help=f"targets (space or comma separated; default {' '.join(DEFAULT_TARGETS)}); scalings: "
                        f"{', '.join(SCALINGS)}")
    s.add_argument("--json", action="store_true", help="print the report as JSON (keys in docs/audit.md)")
    s.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="a running Dask scheduler (tcp://host:8786) whose workers see PATH")
    s.add_argument("--workers", default=None, metavar="N",
                   help="0: serial in this process; N: a local Dask cluster of N processes "
                        "(default: serial under 256 MB, else one per CPU)")
    s.add_argument("--plot", default=None, metavar="DIR", help="write sqnr.png and fractions.png into DIR")
    s.add_argument("--top", default="10", metavar="K", help="how many tensors most at risk to list (default 10)")
    s.set_defaults(func=_cmd_audit)
