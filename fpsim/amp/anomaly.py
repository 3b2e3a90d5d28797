"""Find the first inf or NaN of a run: which op, which layer, forward or backward, which step.

torch's ``torch.autograd.detect_anomaly`` names the backward function that first produced a NaN. Here the
same question is asked of every tensor a policy stores: inside :func:`detect_anomaly`, each output of a
:class:`~fpsim.amp.PolicyRuntime` cast (every GEMM result, every elementwise op's output, every gradient,
forward and backward, in FP32 kept ops too) is checked for inf and NaN, and the ones that hold any are
recorded, in the order the run produced them, as :class:`Anomaly` events. The first is where the trouble
started; the ones after it are mostly its consequences.

Outside the context the runtime pays one context-variable lookup per cast and checks nothing.

>>> import dataclasses
>>> from fpsim.amp import detect_anomaly
>>> from fpsim.train import Trainer
>>> from fpsim.train.demo import demo_settings
>>> cfg = dataclasses.replace(demo_settings(quick=True).train_config(), steps=3, eval_every=0)
>>> with detect_anomaly() as log:
...     _ = Trainer("fp16-no-scaling", cfg).run(progress=False)
>>> log.first is None          # three healthy steps: nothing overflowed
True
"""

from __future__ import annotations

import contextvars
import re
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import numpy as np

from .._checks import check_bool, check_int
from .._fpenv import ieee_mode
from ..formats import Format

__all__ = ["Anomaly", "AnomalyError", "AnomalyLog", "detect_anomaly"]

#: The innermost active log (None: detection off). Per thread and per asyncio task, as autocast's.
_ACTIVE: contextvars.ContextVar[AnomalyLog | None] = contextvars.ContextVar("fpsim_anomaly_log", default=None)

_LAYER = re.compile(r"^h(\d+)\.")


@dataclass(frozen=True)
class Anomaly:
    """One tensor a policy stored with inf or NaN values in it.

    Attributes
    ----------
    step : int or None
        The training step (``Trainer.step_count`` when the tensor was made); None outside a trainer.
    phase : str
        ``"forward"`` or ``"backward"``.
    training : bool
        False for an evaluation forward pass (``Trainer.evaluate``).
    site : str
        The tensor's name in the model: ``"h1.attn.qk"`` (a GEMM's output), ``"h0.ln1"`` (an op's output),
        ``"h0.mlp.fc.dx"`` / ``".dw"`` / ``".db"`` / ``".dy"`` (a GEMM's gradients and the gradient entering
        it), ``"h0.ln1.grad"`` (the gradient of an op's output), ``"loss"``.
    op : str
        ``"matmul"`` for GEMM results, else the op (:data:`fpsim.amp.OPS`: ``"softmax"``, ``"layernorm"``...).
    layer : int or None
        The transformer block (``i`` of ``"h<i>."``), None outside the blocks (embedding, final norm, head).
    fmt : str
        The format the tensor is stored in (``"fp32"`` for ops the policy keeps in FP32).
    n_inf, n_nan : int
        How many values are infinite, NaN.
    n_overflow : int
        How many of them were finite before the cast: values the cast into ``fmt`` overflowed to infinity.
    size : int
        Number of values in the tensor.
    amax : float
        The largest finite magnitude before the cast (for an overflow: how far past ``fmt``'s maximum).

    >>> a = Anomaly(step=3, phase="forward", training=True, site="h1.attn.qk", op="matmul", layer=1,
    ...             fmt="fp16", n_inf=2, n_nan=0, n_overflow=2, size=64, amax=70000.0)
    >>> a.cause
    'overflow'
    >>> print(a)
    step 3, forward: h1.attn.qk (matmul, layer 1) overflowed fp16: 2 of 64 values became inf (largest finite |x| 7e+04)
    """

    step: int | None
    phase: str
    training: bool
    site: str
    op: str
    layer: int | None
    fmt: str
    n_inf: int
    n_nan: int
    n_overflow: int
    size: int
    amax: float

    @property
    def cause(self) -> str:
        """``"overflow"`` (the cast made finite values infinite), else ``"nan"`` or ``"inf"``: the op's own
        result (computed in FP32, or from inputs that were already not finite)."""
        if self.n_overflow:
            return "overflow"
        return "nan" if self.n_nan else "inf"

    def __str__(self) -> str:
        where = f"step {self.step}" if self.step is not None else "outside a trainer"
        phase = self.phase if self.training else f"{self.phase} (evaluation)"
        layer = "" if self.layer is None else f", layer {self.layer}"
        head = f"{where}, {phase}: {self.site} ({self.op}{layer})"
        if self.cause == "overflow":
            return (f"{head} overflowed {self.fmt}: {self.n_overflow} of {self.size} values became inf "
                    f"(largest finite |x| {self.amax:.3g})")
        bad = self.n_nan if self.cause == "nan" else self.n_inf
        return f"{head} is {self.cause} in {bad} of {self.size} values ({self.fmt})"


class AnomalyError(FloatingPointError):
    """Raised at the first anomaly by ``detect_anomaly(raise_error=True)``; ``.anomaly`` is the event."""

    def __init__(self, anomaly: Anomaly) -> None:
        super().__init__(str(anomaly))
        self.anomaly = anomaly


@ieee_mode
class AnomalyLog:
    """What :func:`detect_anomaly` records: the events in the order the run produced them.

    Attributes
    ----------
    events : list of Anomaly
        The first ``max_events`` events.
    count : int
        Every event seen, kept or not.
    raise_error : bool
    max_events : int
    """

    def __init__(self, *, raise_error: bool = False, max_events: int = 1000) -> None:
        self.raise_error = check_bool(raise_error, "raise_error")
        self.max_events = check_int(max_events, "max_events", lo=1)
        self.events: list[Anomaly] = []
        self.count = 0
        self._token: contextvars.Token[AnomalyLog | None] | None = None

    @property
    def first(self) -> Anomaly | None:
        """The first event, or None: where the infs and NaNs began."""
        return self.events[0] if self.events else None

    def __len__(self) -> int:
        return self.count

    def __repr__(self) -> str:
        return f"AnomalyLog({self.count} events, first: {self.first})"

    def __enter__(self) -> AnomalyLog:
        if self._token is not None:
            raise RuntimeError("this AnomalyLog is already active; use a new detect_anomaly()")
        self._token = _ACTIVE.set(self)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._token is not None:
            _ACTIVE.reset(self._token)
            self._token = None

    def _check(self, out: np.ndarray, before: np.ndarray, fmt: Format, site: str, op: str, phase: str,
               step: int | None, training: bool) -> None:
        """Record ``out`` (``before`` rounded into ``fmt``) if it holds inf or NaN."""
        if not isinstance(out, np.ndarray) or out.dtype.kind != "f":
            out = np.asarray(out, dtype=np.float32)
        fin = np.isfinite(out)
        if fin.all():
            return
        before = np.asarray(before)
        bad = ~fin
        n_nan = int(np.count_nonzero(np.isnan(out)))
        b_fin = np.isfinite(before)
        if before.shape == out.shape:
            n_over = int(np.count_nonzero(bad & b_fin))
        else:  # not a cast of ``before`` (no shape to compare): only the op's own result is known
            n_over = 0
        fb = np.abs(np.ravel(before)[np.ravel(b_fin)])
        amax = float(fb.max()) if fb.size else float("nan")
        m = _LAYER.match(site)
        ev = Anomaly(step=step, phase=phase, training=training, site=site, op=op,
                     layer=None if m is None else int(m.group(1)), fmt=fmt.name,
                     n_inf=int(np.count_nonzero(bad)) - n_nan, n_nan=n_nan, n_overflow=n_over,
                     size=int(out.size), amax=amax)
        self.count += 1
        if len(self.events) < self.max_events:
            self.events.append(ev)
        if self.raise_error:
            raise AnomalyError(ev)


@ieee_mode
def detect_anomaly(*, raise_error: bool = False, max_events: int = 1000) -> AnomalyLog:
    """A context manager that records every stored tensor holding inf or NaN (see :class:`AnomalyLog`).

    Parameters
    ----------
    raise_error : bool
        Raise :class:`AnomalyError` at the first event (torch's ``detect_anomaly`` raises too), instead of
        recording and letting the run go on (the trainer then skips the step, as for any non-finite
        gradient).
    max_events : int
        How many events to keep (every one is counted in ``count``).

    Returns
    -------
    AnomalyLog
        Use it as ``with detect_anomaly() as log:``; ``log.first`` is the first event.

    Notes
    -----
    Watches the casts of every :class:`~fpsim.amp.PolicyRuntime` (the trainer's, ``autocast``'s) in this
    thread or task: GEMM results (after the cast into the activation format), elementwise op outputs,
    the gradients of both, and the loss. A recomputed forward (activation checkpointing) is not checked
    twice. Under dynamic loss scaling an overflowing scaled gradient is an expected event (the scaler
    skips the step and backs off): filter on ``phase`` to see the forward pass only.

    >>> import numpy as np
    >>> from fpsim.amp import get_policy
    >>> rt = get_policy("fp16-mixed").runtime()
    >>> with detect_anomaly() as log:
    ...     out, _ = rt.matmul(np.full((2, 4), 200.0, np.float32), np.full((4, 3), 100.0, np.float32),
    ...                        "h0.mlp.fc", "linear")
    >>> print(log.first)
    outside a trainer, forward: h0.mlp.fc (matmul, layer 0) overflowed fp16: 6 of 6 values became inf (largest finite |x| 8e+04)
    >>> with detect_anomaly(raise_error=True):
    ...     _ = rt.act(np.float32([1.0, np.nan]), "h0.gelu", "gelu")
    Traceback (most recent call last):
    ...
    fpsim.amp.anomaly.AnomalyError: outside a trainer, forward: h0.gelu (gelu, layer 0) is nan in 1 of 2 values (fp16)
    """
    return AnomalyLog(raise_error=raise_error, max_events=max_events)


def _active() -> AnomalyLog | None:
    """The innermost active log (for the runtime's casts)."""
    return _ACTIVE.get()


def _watch(log: AnomalyLog, out: Any, before: Any, fmt: Format, site: str, op: str, phase: str,
           rt: Any) -> None:
    """The runtime's hook: check one stored tensor against the active ``log``."""
    if getattr(rt, "_recomputing", False):
        return
    log._check(np.asarray(out), np.asarray(before), fmt, site, op, phase, getattr(rt, "step", None),
               bool(getattr(rt, "training", True)))
