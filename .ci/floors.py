"""Print pip constraints that pin every runtime dependency (and the plot extra) to its declared floor.

A declared range is a tested range: .ci/run installs these into a second environment and runs the
non-slow suite there. Reads pyproject.toml, so the floors tested are always the floors declared.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
reqs = list(project["dependencies"]) + list(project["optional-dependencies"]["plot"])
for req in reqs:
    m = re.fullmatch(r"\s*([A-Za-z0-9_.\-]+)\s*>=\s*([0-9][0-9.]*)\s*", req)
    if m is None:
        sys.exit(f"floors.py: {req!r} has no plain '>=' floor to pin")
    print(f"{m.group(1)}=={m.group(2)}")
