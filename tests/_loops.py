"""The compiled loops a switch (``_ckernel.philox_impl``, ``_ckernel.sr_impl``, ``_cgemm.impl``) can select on this
machine."""

from __future__ import annotations

from typing import Callable


def compiled_loops(switch: Callable[..., str]) -> list[str]:
    """``["scalar"]``, then ``"avx2"`` and ``"avx512"`` where the switch has them and the CPU runs them;
    leaves the switch on ``"auto"``."""
    loops = ["scalar"]
    for name in ("avx2", "avx512"):
        try:
            switch(name)
            loops.append(name)
        except ValueError:
            pass
    switch("auto")
    return loops
