"""``fpsim demo``: the subcommand this package adds to the ``fpsim`` command."""

from __future__ import annotations

import argparse
from typing import Any

from .._fpenv import ieee_mode
from ._settings import DEFAULT_SEEDS, DEFAULT_SEEDS_QUICK

__all__ = ["cmd_demo", "register_cli"]

#: The most ``--steps`` a policy trains (the full demo trains a few hundred): a mistyped count is refused at once
#: instead of training for ever.
MAX_STEPS = 10_000_000


def _policies(items: list[str]) -> list[str]:
    """``--policies`` values (space or comma separated) as canonical names, in order, each once."""
    from ..amp import get_policy

    names: list[str] = []
    for item in items:
        for part in item.split(","):
            if part.strip():
                name = get_policy(part).name  # the one name rule; unknown names list the valid ones
                if name not in names:
                    names.append(name)
    if not names:
        raise ValueError(f"no policy named (got {' '.join(repr(i) for i in items)}); give one or more of the "
                         "names `fpsim demo --help` lists")
    return names


def _say(line: str) -> None:
    print(line, flush=True)


@ieee_mode
def cmd_demo(args: argparse.Namespace) -> int:
    from .._cliargs import flag_value, int_range, nonneg_int
    from .._dask import MAX_WORKERS
    from ._threads import blas_threads
    from .demo import check_output_dir, run_demo
    from .sweep import MAX_SEEDS

    # Every value is checked before the first step: a bad flag costs nothing.
    steps = None if args.steps is None else flag_value("--steps", int_range(1, MAX_STEPS), args.steps)
    seed = flag_value("--seed", nonneg_int, args.seed)
    policies = None if args.policies is None else flag_value("--policies", _policies, args.policies)
    # The default answers "beyond seed noise?": the full demo trains 3 seeds; --quick (a few minutes) and --gemm (one
    # seed by design) train 1, and their lesson tables say how to measure it.
    seeds = (flag_value("--seeds", int_range(1, MAX_SEEDS), args.seeds) if args.seeds is not None
             else DEFAULT_SEEDS_QUICK if args.quick or getattr(args, "gemm", None) is not None else DEFAULT_SEEDS)
    workers = None if args.workers is None else flag_value("--workers", int_range(0, MAX_WORKERS), args.workers)
    scheduler = None
    if args.scheduler is not None:
        from .._dask import check_scheduler_address

        scheduler = flag_value("--scheduler", check_scheduler_address, args.scheduler)
        if workers is not None:
            raise ValueError("--workers: cannot be combined with --scheduler (the scheduler's workers run the cells)")
    gemm = None
    if args.gemm is not None:
        from .bitexact import gemm_device

        gemm = flag_value("--gemm", gemm_device, args.gemm)
        if seeds != 1 or workers is not None or scheduler is not None:
            raise ValueError("--gemm: runs one seed in this process; cannot be combined with --seeds > 1, --workers "
                             "or --scheduler")
    out = flag_value("--out", check_output_dir, args.out)
    with blas_threads(1):  # tiny GEMMs: BLAS threads only add contention
        # every line flushed as it is said: with stdout redirected (a file, a pipe, a CI log) it is block-buffered,
        # and a sweep of minutes would show nothing until the end
        run_demo(out, quick=args.quick, steps=steps, policies=policies, seed=seed, progress=None, seeds=seeds,
                 workers=workers, scheduler=scheduler, gemm=gemm, log=_say)
    return 0


def register_cli(subparsers: Any) -> None:
    """Add ``demo`` to the ``fpsim`` command's subparsers."""
    from .._dask import MAX_WORKERS
    from ..amp import policy_names
    from .sweep import MAX_SEEDS

    s = subparsers.add_parser(
        "demo", help="train a tiny GPT under every precision policy and write a report",
        description="Train the same tiny GPT under each named precision policy and write DIR/report.md, "
                    "PNG plots and DIR/metrics.json.")
    s.add_argument("--quick", action="store_true", help="a shorter run (under 3 minutes)")
    s.add_argument("--out", default="fpsim-demo", metavar="DIR",
                   help="output folder, created if needed and checked writable before training (default: "
                        "fpsim-demo); metrics.json is rewritten as each policy finishes")
    s.add_argument("--steps", default=None, metavar="N",
                   help=f"training steps per policy (an integer from 1 to {MAX_STEPS})")
    s.add_argument("--policies", nargs="+", default=None, metavar="POLICY",
                   help=f"policies to run (space or comma separated); default all: {', '.join(policy_names())}")
    s.add_argument("--seed", default="0", metavar="S", help="seed for weights and data (default 0)")
    s.add_argument("--seeds", default=None, metavar="N",
                   help="train every policy with seeds S .. S+N-1 as a sweep on Dask and report the mean and spread "
                        f"over seeds of every lesson, and whether each is beyond seed noise (default {DEFAULT_SEEDS}; "
                        f"{DEFAULT_SEEDS_QUICK} with --quick or --gemm; 1: one run per policy, no Dask; at most "
                        f"{MAX_SEEDS})")
    s.add_argument("--workers", default=None, metavar="N",
                   help="worker processes of the local Dask cluster for the sweep (default: one per CPU; 0: run the "
                        f"cells one after another in this process; at most {MAX_WORKERS})")
    s.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="run the sweep on an existing Dask scheduler (tcp://host:8786) instead of a local cluster; "
                        "its workers need fpsim installed; it must answer within FPSIM_DASK_CONNECT_TIMEOUT seconds "
                        "(default 10) and have a worker within FPSIM_DASK_WORKER_TIMEOUT seconds (default 60)")
    s.add_argument("--gemm", default=None, metavar="DEVICE",
                   help="also train each policy that admits it with every GEMM bit-exact under DEVICE's Tensor Core "
                        "model (e.g. h100, a100, b200; `fpsim devices` lists them) and report the cost per step and "
                        "the loss gap against the fast GEMMs (default: fast GEMMs only)")
    s.set_defaults(func=cmd_demo)
