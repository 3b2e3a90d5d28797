"""Pure-BF16 training: weights kept only in BF16 (no FP32 master), and three ways to apply an update.

Without a master copy every optimizer step rounds ``w - u`` into BF16 (8 significant bits). An update
smaller than half an ulp of its weight is then lost entirely under round-to-nearest: with ``lr = 1e-3``
an Adam step is about ``1e-3 |w|``-sized, under BF16's half-ulp ``2**-9 |w| = 2e-3 |w|``, so late in
training (small, decayed learning rates) most weights stop moving — the classic stall. Two remedies:

``"sr"``
    Stochastic rounding of the update: ``w - u`` (exact) rounds up or down with probabilities
    proportional to the distances, so the expected new weight is ``w - u`` — unbiased, like an FP32
    master on average (what Graphcore IPUs and AWS Trainium do in hardware; Ozkara et al., arXiv
    2502.20566, train BF16 LLMs this way).
``"kahan"``
    Kahan-compensated update (Zamirai et al., "Revisiting BFloat16 Training", arXiv 2010.06192): a
    BF16 buffer ``c`` per weight carries what the last rounding lost, ``y = -u - c; s = w + y;
    c = (s - w) - y; w = s``, each operation rounded once in BF16 (2 more bytes per parameter).
``"rne"``
    ``w - u`` computed exactly and rounded once to nearest (the baseline that stalls).

The rules plug into :class:`fpsim.amp.MasterWeights` through ``Policy(update=...)`` (with
``master=None``); the named policies are ``bf16-pure-rne``, ``bf16-pure-sr`` and ``bf16-pure-kahan``
(BF16 weights, activations and gradients, FP32 optimizer moments, so that the three differ only in how
the update reaches the weights). Besides the lost-update counters of ``MasterWeights`` (``last_lost`` /
``last_nonzero``: nonzero updates that left the weight unchanged), the store records the update mass
intended and applied in each step (``last_intended``, ``last_applied``: sums of ``|u|`` and
``|w_new - w|``): about 1 for SR (unbiased) and Kahan (deferred, then carried), far below 1 for RNE.

>>> import numpy as np
>>> from fpsim.amp import get_policy, MasterWeights
>>> w0 = {"w": np.ones(1000, np.float32)}
>>> for rule in ("rne", "sr", "kahan"):
...     p = get_policy(f"bf16-pure-{rule}")
...     store = MasterWeights(w0, p, p.runtime(seed=0))
...     for _ in range(100):                        # 100 updates of 1e-3: far below BF16's ulp(1)/2
...         _ = store.apply({"w": np.full(1000, 1e-3, np.float32)})
...     print(rule, round(float(store.weights["w"].mean()), 2))
rne 1.0
sr 0.9
kahan 0.9
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .._fpenv import ieee_mode
from ..arith import add, sub
from ..formats import as_format
from .policy import UPDATE_RULES, register_pure_bf16  # the rules' names and policies are policy data

__all__ = ["UPDATE_RULES", "apply_update", "register_pure_bf16"]

_F32 = np.float32


@ieee_mode
def apply_update(store: Any, updates: Mapping[str, np.ndarray]) -> dict[str, float]:
    """``w <- w - u`` under ``store.policy.update`` for a :class:`fpsim.amp.MasterWeights` without master.

    Returns, per tensor, the fraction of nonzero updates that left the weight unchanged (NaN where no
    update was nonzero), as :meth:`MasterWeights.apply`; sets ``last_lost``, ``last_nonzero``,
    ``last_intended`` and ``last_applied`` on the store. Kahan buffers live in ``store.runtime.kahan`` (saved
    with the runtime's state in checkpoints).
    """
    rule = store.policy.update
    fmt = store.fmt
    rng = store.runtime.rng
    # Kahan buffers live on the runtime, whose state_dict the checkpoints save (``kahan.<name>``)
    comp: dict[str, np.ndarray] = store.runtime.__dict__.setdefault("kahan", {})
    lost: dict[str, float] = {}
    store.last_lost = store.last_nonzero = 0
    store.last_intended = store.last_applied = 0.0
    for k, u in updates.items():
        w = store.weights[k]
        u = np.asarray(u, _F32)
        if rule == "rne":
            new = np.asarray(sub(w, u, fmt), _F32)
        elif rule == "sr":
            new = np.asarray(sub(w, u, fmt, rounding="sr", rng=rng), _F32)
        else:  # Kahan-compensated summation of the updates, every operation rounded once in fmt
            c = comp.get(k)
            if c is None:
                c = np.zeros_like(w)
            y = np.asarray(sub(-u, c, fmt), _F32)
            new = np.asarray(add(w, y, fmt), _F32)
            comp[k] = np.asarray(sub(np.asarray(sub(new, w, fmt), _F32), y, fmt), _F32)
        want = u != 0
        n = int(np.count_nonzero(want))
        nl = int(np.count_nonzero(want & (new == w)))
        lost[k] = nl / n if n else float("nan")
        store.last_lost += nl
        store.last_nonzero += n
        store.last_intended += float(np.abs(u.astype(np.float64)).sum())
        store.last_applied += float(np.abs(new.astype(np.float64) - w.astype(np.float64)).sum())
        store.weights[k] = new
    return lost
