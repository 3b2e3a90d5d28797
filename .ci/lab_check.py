"""Wait for the JupyterLab the README's course command started; check it serves the notebooks and a python3 kernel.

Usage: python3 .ci/lab_check.py PORT TOKEN NOTEBOOK_DIR PID  (exit 0 when it does; 1 when the command PID ends
first or after 5 minutes without).
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any


def get(port: str, token: str, path: str) -> Any:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)


def main() -> int:
    port, token, nbdir, pid = sys.argv[1:5]
    want = sorted(p.name for p in Path(nbdir).glob("*.ipynb"))
    deadline = time.monotonic() + 300  # the command installs the course extra first
    while time.monotonic() < deadline:
        try:
            specs = get(port, token, "/api/kernelspecs")
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                print("the course command ended before JupyterLab answered")
                return 1
            time.sleep(2)
            continue
        # `jupyter lab notebooks/` serves that folder as its root
        listing = get(port, token, "/api/contents/")
        have = sorted(c["name"] for c in listing["content"] if c["name"].endswith(".ipynb"))
        kernels = sorted(specs["kernelspecs"])
        print(f"== JupyterLab on port {port}: {len(have)} notebooks, kernels {kernels}")
        if have != want:
            print(f"JupyterLab serves {have}, expected {want}")
            return 1
        if "python3" not in kernels:
            print("no python3 kernel")
            return 1
        return 0
    print("JupyterLab did not answer within 5 minutes")
    return 1


if __name__ == "__main__":
    sys.exit(main())
