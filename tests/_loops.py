"""The compiled loops a `_ckernel` switch (``philox_impl``, ``sr_impl``) can select on this machine."""

from __future__ import annotations

from typing import Callable


def compiled_loops(switch: Callable[..., str]) -> list[str]:
    """``["scalar"]``, and ``"avx2"`` where the build and the CPU have it; leaves the switch on ``"auto"``."""
    loops = ["scalar"]
    try:
        switch("avx2")
        loops.append("avx2")
    except ValueError:
        pass
    switch("auto")
    return loops
