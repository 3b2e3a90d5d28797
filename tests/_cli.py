"""The one in-process runner of the ``fpsim`` command that CLI tests share."""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """fpsim.cli.main in-process: (status, stdout, stderr); argparse's SystemExit becomes its code."""
    from fpsim.cli import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = int(e.code or 0)
    return rc, out.getvalue(), err.getvalue()
