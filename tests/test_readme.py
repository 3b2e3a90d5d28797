"""The README's code runs as written (issue 25 item 7: its torch line failed on dtype, its MX line on length).

The tour block runs whole and its commented results are checked; the "in another project's tests" block runs
with a stand-in bf16 kernel (torch, when installed).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent


def _python_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)


def test_tour_runs_and_says_what_it_prints() -> None:
    tour = _python_blocks()[0]
    assert "fpsim.scaling.mx_quantize(x, " in tour
    ns: dict[str, Any] = {}
    exec(compile(tour, "README.md (tour)", "exec"), ns)
    fpsim = ns["fpsim"]
    # the values the comments state
    assert fpsim.round(1 + 2**-8 + 2**-40, "bf16") == 1.0078125
    r = fpsim.round([464, 465], "fp8_e4m3")
    assert r[0] == 448.0 and np.isnan(r[1])
    assert fpsim.bits_str(1.0, "bf16") == "0 01111111 0000000"
    assert fpsim.sum(np.ones(10_000), "bf16") == 256.0
    assert "# 1.0078125" in tour and "# [448., nan]" in tour and "# 256.0" in tour


def test_oracle_block_runs_with_a_bf16_kernel() -> None:
    torch = pytest.importorskip("torch")
    import fpsim

    block = _python_blocks()[1]
    t = torch.from_numpy(np.random.default_rng(5).standard_normal(64).astype(np.float32))
    x = t.numpy()
    ns: dict[str, Any] = {
        "torch": torch, "fpsim": fpsim, "t": t, "x": x,
        "kernel": lambda u: u.to(torch.bfloat16),               # a bf16 kernel: returns a bf16 tensor
        "my_kernel_bf16": lambda u: fpsim.round(u, "bf16"),     # a correctly rounding one
    }
    exec(compile(block, "README.md (oracle)", "exec"), ns)
