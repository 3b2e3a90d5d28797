"""``fpsim demo``: the subcommand this package adds to the ``fpsim`` command."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["cmd_demo", "register_cli"]


def cmd_demo(args: argparse.Namespace) -> int:
    from ._threads import blas_threads
    from .demo import run_demo

    policies = None
    if args.policies:
        policies = [p for item in args.policies for p in item.split(",") if p]
    with blas_threads(1):  # tiny GEMMs: BLAS threads only add contention
        run_demo(args.out, quick=args.quick, steps=args.steps, policies=policies, seed=args.seed,
                 progress=None)
    return 0


def register_cli(subparsers: Any) -> None:
    """Add ``demo`` to the ``fpsim`` command's subparsers."""
    from ..amp import policy_names

    s = subparsers.add_parser(
        "demo", help="train a tiny GPT under every precision policy and write a report",
        description="Train the same tiny GPT under each named precision policy and write DIR/report.md, "
                    "PNG plots and DIR/metrics.json.")
    s.add_argument("--quick", action="store_true", help="a shorter run (under 3 minutes)")
    s.add_argument("--out", default="fpsim-demo", metavar="DIR", help="output folder (default: fpsim-demo)")
    s.add_argument("--steps", type=int, default=None, metavar="N", help="training steps per policy")
    s.add_argument("--policies", nargs="+", default=None, metavar="POLICY",
                   help=f"policies to run (space or comma separated); default all: {', '.join(policy_names())}")
    s.add_argument("--seed", type=int, default=0, metavar="S", help="seed for weights and data (default 0)")
    s.set_defaults(func=cmd_demo)
