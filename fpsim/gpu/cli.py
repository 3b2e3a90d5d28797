"""``fpsim probe``: identify the present GPU's Tensor Core arithmetic (needs CuPy and a CUDA device)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .._fpenv import ieee_mode

__all__ = ["cmd_probe", "register_cli"]

MAX_DEVICE = 1023
MAX_RANDOM_ROWS = 100_000


@ieee_mode
def cmd_probe(args: argparse.Namespace) -> int:
    """Run :func:`fpsim.gpu.probe`; without CuPy or a device print one line to stderr and return 2."""
    from ._device import GPUUnavailable
    from .probing import probe

    from .._cliargs import json_text

    for flag, v, hi in (("--device", args.device, MAX_DEVICE), ("--random-rows", args.random_rows, MAX_RANDOM_ROWS)):
        if v < 0:  # before CuPy is looked for: a bad flag is named whatever the machine
            raise ValueError(f"{flag}: expected a non-negative integer, got {v}")
        if v > hi:  # a huge count would allocate for ever; no machine has more device indices
            raise ValueError(f"{flag}: expected an integer from 0 to {hi}, got {v}")
    try:
        res = probe(args.device, random_rows=args.random_rows)
    except GPUUnavailable as e:
        print(f"fpsim probe: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json_text(res.to_dict(), indent=2))
    else:
        print(res.summary())
        for f in res.fits:
            for name, reading in f.detectors.items():
                print(f"    {f.input}->{f.output} {name}: {reading}")
    return 0


def register_cli(subparsers: Any) -> None:
    """Add the ``probe`` subcommand to the ``fpsim`` command's subparsers."""
    s = subparsers.add_parser("probe", help="identify this GPU's Tensor Core arithmetic (needs CuPy and CUDA)",
                              description="Run the Tensor Core probe vectors on a CUDA GPU, fit block size, "
                              "alignment bits and rounding per format, and name the matching fpsim preset.")
    s.add_argument("--device", type=int, default=0, help="CUDA device index (default 0)")
    s.add_argument("--json", action="store_true", help="print the full result as JSON")
    s.add_argument("--random-rows", type=int, default=48, help="random probe rows per path (default 48)")
    s.set_defaults(func=cmd_probe)
