"""Start-up cost (issue 30 §3): `import fpsim` against `import numpy`, and the CLI's light commands, each in a
fresh interpreter (the median of 10), in one run.

    python3 benchmarks/bench_import.py

Goal: `import fpsim` <= 1.5x `import numpy`; `fpsim --help` and `fpsim round` well under a second. Each figure
is the wall time of a whole `python -c ...` process, so the interpreter's own start is in every term; the
ratio is also given net of it (minus `python -c pass`).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

CASES = {
    "python -c pass": "pass",
    "import numpy": "import numpy",
    "import fpsim": "import fpsim",
    "fpsim --help": "import sys, fpsim.cli as c\ntry: c.main(['--help'])\nexcept SystemExit: pass",
    "fpsim round 0.1": "import fpsim.cli as c; c.main(['round', '0.1'])",
    "import fpsim; fpsim.train": "import fpsim; fpsim.train",
}


# Children may write bytecode caches, as a user's interpreter does: with PYTHONDONTWRITEBYTECODE set (some
# sandboxes set it) a source tree without __pycache__ recompiles fpsim on every start (~0.1 s here), while
# NumPy's installed wheel ships its .pyc; that compares a cold source tree with an installed package.
_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def _median(code: str, n: int = 10) -> float:
    times = []
    for _ in range(n + 1):  # the first run warms the OS file cache (and writes bytecode) and is dropped
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, stdout=subprocess.DEVNULL, env=_ENV)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def main() -> None:
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}; python {sys.version.split()[0]}; "
          f"PYTHONDONTWRITEBYTECODE {'was set: cleared for the children' if 'PYTHONDONTWRITEBYTECODE' in os.environ else 'unset'}")
    t = {name: _median(code) for name, code in CASES.items()}
    base, np_t = t["python -c pass"], t["import numpy"]
    print(f"{'case':28s} {'median s':>9s} {'/ numpy':>8s} {'net / numpy':>12s}")
    for name, v in t.items():
        net = (v - base) / (np_t - base) if name != "python -c pass" else float("nan")
        print(f"{name:28s} {v:9.3f} {v / np_t:8.2f} {net:12.2f}")


if __name__ == "__main__":
    main()
