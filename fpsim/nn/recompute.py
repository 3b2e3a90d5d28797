"""Activation recomputation (gradient checkpointing) done so that the recomputed forward is bit-identical.

A checkpointed piece of the model (a whole block, or for ``checkpoint="selective"`` only the attention
core) keeps its inputs in the forward pass and runs its forward again in the backward pass to rebuild
the cache it threw away. Under mixed precision the second run is only the *same* computation if the
precision object's state is handled, which is what torch's ``preserve_rng_state`` and TransformerEngine's
"FP8 activation recompute phase" do:

- stochastic rounding draws random numbers: the recomputation must replay the draws of the forward pass
  (restore the generator to where the forward pass started the piece), and afterwards put the generator
  back where the backward pass had it, so the rest of the step draws exactly what it would have drawn;
- FP8 delayed scaling records each tensor's amax: a recomputed forward must not record it again;
- QAT observers update their moving averages on every training forward: the recomputation must reuse the
  values the forward pass used, not update them a second time;
- telemetry (activation histograms) must not count the recomputed tensors twice.

Layers know nothing of policies (:mod:`fpsim.nn.precision`), so the precision object is asked through two
optional methods (the :class:`Recomputable` protocol): ``recompute_state()`` when a checkpoint is taken, and
``recomputing(state)`` as a context manager around the recomputation. A precision object without them
(:data:`~fpsim.nn.FULL`) is stateless and needs nothing. :func:`naive_recomputation` switches the
protocol off, to show what goes wrong without it.

The module also carries the hook the memory ledger uses to see what the backward pass holds
(:func:`tracing`); it costs one global lookup per event when nothing traces.

>>> from fpsim.nn.recompute import naive_recomputation, is_naive
>>> with naive_recomputation():
...     is_naive()
True
>>> is_naive()
False
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping
from typing import Any, Protocol, runtime_checkable

from .._fpenv import ieee_mode

__all__ = ["Recomputable", "is_naive", "naive_recomputation", "replaying", "snapshot", "tracing"]


@runtime_checkable
class Recomputable(Protocol):
    """What a stateful precision object offers so that recomputation reproduces the forward pass."""

    def recompute_state(self) -> Any:
        """A snapshot taken where a checkpointed piece starts its forward (e.g. the SR generator's state)."""
        ...

    def recomputing(self, state: Any) -> contextlib.AbstractContextManager[None]:
        """Context around a recomputation: replay ``state``, record nothing, update no observer."""
        ...


class _Local(threading.local):
    naive = False
    tracer: Any = None


_LOCAL = _Local()


@contextlib.contextmanager
def naive_recomputation() -> Iterator[None]:
    """Recompute without the protocol (for teaching and tests): the recomputed forward draws fresh
    random numbers, records amaxes and updates observers again, as a plain re-run would.

    Per thread; restores the previous setting on exit.
    """
    old = _LOCAL.naive
    _LOCAL.naive = True
    try:
        yield
    finally:
        _LOCAL.naive = old


@ieee_mode
def is_naive() -> bool:
    """True inside :func:`naive_recomputation`."""
    return bool(_LOCAL.naive)


@ieee_mode
def snapshot(prec: Any) -> Any:
    """``prec.recompute_state()`` where the precision object has one (and not naive), else None."""
    f = getattr(prec, "recompute_state", None)
    if f is None or _LOCAL.naive:
        return None
    return f()


@contextlib.contextmanager
def replaying(prec: Any, state: Any, what: str) -> Iterator[None]:
    """Run a recomputation of ``what`` (a layer name, for the ledger) under ``prec.recomputing(state)``."""
    tr = _LOCAL.tracer
    if tr is not None:
        tr.phase_begin("recompute", what)
    try:
        f = getattr(prec, "recomputing", None)
        if f is None or _LOCAL.naive:
            yield
        else:
            with f(state):
                yield
    finally:
        if tr is not None:
            tr.phase_end("recompute", what)


# ------------------------------------------------------------------------------------------ tracing
class Tracer(Protocol):
    """Receives the events of a traced step (see :func:`tracing`)."""

    def event(self, name: str, live: Mapping[str, Any], params: Mapping[str, Any]) -> None: ...

    def transient(self, name: str, layer: str, cache: Any) -> None: ...

    def phase_begin(self, phase: str, what: str) -> None: ...

    def phase_end(self, phase: str, what: str) -> None: ...


@contextlib.contextmanager
def tracing(tracer: Tracer) -> Iterator[Tracer]:
    """Within the block, :func:`fpsim.nn.gpt_forward` / :func:`~fpsim.nn.gpt_backward` report to ``tracer``.

    ``tracer.event(name, live, params)`` is called at each point where what the backward pass holds
    changes: ``live`` maps a layer name to the cache it keeps (or the transient cache of a recomputed
    block), ``params`` are the weights (not activations). ``tracer.transient(name, layer, cache)``: in
    addition to the last ``live``, ``cache`` (of ``layer``) exists now (a recomputed attention core).
    ``phase_begin`` / ``phase_end`` bracket the ``"forward"``, ``"backward"`` and ``"recompute"``
    phases. Per thread; one tracer at a time.
    """
    old = _LOCAL.tracer
    _LOCAL.tracer = tracer
    try:
        yield tracer
    finally:
        _LOCAL.tracer = old


def _event(name: str, live: Mapping[str, Any], params: Mapping[str, Any]) -> None:
    tr = _LOCAL.tracer
    if tr is not None:
        tr.event(name, live, params)


def _transient(name: str, layer: str, cache: Any) -> None:
    tr = _LOCAL.tracer
    if tr is not None:
        tr.transient(name, layer, cache)


def _phase(begin: bool, phase: str, what: str = "") -> None:
    tr = _LOCAL.tracer
    if tr is not None:
        (tr.phase_begin if begin else tr.phase_end)(phase, what)


def _tracing() -> bool:
    return _LOCAL.tracer is not None

