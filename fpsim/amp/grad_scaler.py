"""``torch.amp.GradScaler``'s methods and semantics over fpsim's bit-exact :class:`DynamicLossScaler`.

The scale arithmetic is :class:`~fpsim.amp.DynamicLossScaler`'s (torch's ``_amp_update_scale_``: float32
scale, products in double, growth refused when it would overflow). What this module adds is torch's
protocol around it: the per-optimizer stages (``unscale_`` at most once per optimizer per iteration and
never after ``step``; ``step`` at most once; ``update`` after at least one inf check), in-place unscaling
with torch's reciprocal (``float32(1 / float64(scale))``, a multiply, the values passed through when it is
exactly 1), a skipped ``optimizer.step`` when any gradient was inf or NaN, and for a fused optimizer the
scale handed to the kernel (``grad_scale``, a division there) instead of an unscale.

fpsim keeps gradients in a dict, not in ``param.grad``: where torch's calls take ``optimizer`` alone,
fpsim's take ``(optimizer, grads)`` (``unscale_``) or forward the arguments of ``optimizer.step``
(``step(optimizer, params, grads, **kw)``, the ``grads`` being ``args[1]``). Like torch's, ``unscale_``
changes the gradient arrays in place (the trailing underscore); they must be writeable float32 arrays.

>>> import numpy as np
>>> from fpsim.amp import GradScaler
>>> scaler = GradScaler(init_scale=1024.0, growth_interval=2)
>>> float(scaler.scale(np.float32(0.5)))           # the loss, scaled
512.0
>>> grads = {"w": np.float32([2048.0, -512.0])}
>>> opt = object()                                  # any optimizer; only its identity is used here
>>> scaler.unscale_(opt, grads)
>>> grads["w"].tolist()
[2.0, -0.5]
>>> scaler.update(); scaler.get_scale()             # one clean step of two: no growth yet
1024.0
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from .._fpenv import ieee_mode
from .._names import parse_name
from .scaler import DynamicLossScaler

__all__ = ["GradScaler", "OptState"]

_F32 = np.float32


class OptState(enum.Enum):
    """Where an optimizer is in an iteration (torch's ``OptState``)."""

    READY = 0
    UNSCALED = 1
    STEPPED = 2


def _fresh() -> dict[str, Any]:
    return {"stage": OptState.READY, "found_inf": None}


def _writeable_grads(grads: object, who: str) -> list[np.ndarray]:
    if not isinstance(grads, Mapping):
        raise TypeError(f"{who}: grads must be a mapping of name -> float32 array (the backward pass's "
                        f"result), got {type(grads).__name__}")
    out = []
    for k, g in grads.items():
        if not isinstance(g, np.ndarray) or g.dtype != _F32:
            raise TypeError(f"{who}: grads[{k!r}] must be a float32 NumPy array (unscaled in place, as torch's "
                            f".grad), got {type(g).__name__}{'' if not isinstance(g, np.ndarray) else ' ' + str(g.dtype)}")
        if not g.flags.writeable:
            raise ValueError(f"{who}: grads[{k!r}] is read-only; unscale_ changes the gradients in place")
        out.append(g)
    return out


def _any_nonfinite(gs: list[np.ndarray]) -> bool:
    return not all(bool(np.isfinite(g).all()) for g in gs)


@ieee_mode
class GradScaler:
    """Dynamic loss scaling with torch's API: ``scale``, ``unscale_``, ``step``, ``update``.

    Parameters
    ----------
    device : str
        ``"cuda"`` or ``"cpu"`` (accepted for torch's signature; the arithmetic is the same).
    init_scale, growth_factor, backoff_factor, growth_interval
        As torch (defaults ``2**16``, 2, 0.5, 2000); checked by :class:`DynamicLossScaler` (a
        ``ValueError`` naming the value where torch raises ``AssertionError`` or accepts a backoff <= 0).
    enabled : bool
        False: every method is a pass-through (``scale`` returns its input, ``step`` calls
        ``optimizer.step``, ``get_scale`` is 1.0, ``state_dict`` is empty), as torch's.

    Notes
    -----
    Errors in the order of calls are torch's, type and message: ``unscale_`` twice
    (``RuntimeError: unscale_() has already been called on this optimizer since the last update().``),
    ``unscale_`` after ``step``, ``step`` twice, a ``closure``, ``update`` with no inf check recorded
    (``AssertionError``), a call before the first ``scale`` (``AssertionError``).

    Examples
    --------
    A skipped step and the back-off (``opt`` any object with ``step(params, grads, ...)``):

    >>> import numpy as np
    >>> class Opt:
    ...     def step(self, params, grads):
    ...         params["w"] -= grads["w"]
    >>> scaler, opt = GradScaler(init_scale=8.0), Opt()
    >>> params = {"w": np.float32([1.0])}
    >>> _ = scaler.scale(np.float32(1.0))
    >>> scaler.step(opt, params, {"w": np.float32([np.inf])}) is None     # inf: skipped
    True
    >>> scaler.update(); scaler.get_scale(), params["w"].tolist()
    (4.0, [1.0])
    """

    def __init__(self, device: str = "cuda", init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, enabled: bool = True) -> None:
        self._device = parse_name(device, ("cuda", "cpu"), "GradScaler device")
        if not isinstance(enabled, (bool, np.bool_)):
            raise TypeError(f"GradScaler enabled must be a bool, got {type(enabled).__name__}: {enabled!r}")
        self._enabled = bool(enabled)
        self._dyn = DynamicLossScaler(init_scale=init_scale, growth_factor=growth_factor,
                                      backoff_factor=backoff_factor, growth_interval=growth_interval)
        self._started = False  # torch creates its scale tensor lazily, at the first scale()
        self._per_optimizer: dict[int, dict[str, Any]] = {}

    # ------------------------------------------------------------------ torch's API
    def scale(self, outputs: Any) -> Any:
        """``outputs * scale`` (float32; a list/tuple/dict of them mapped, as torch maps iterables).

        For fpsim's backward pass the useful output is the seed: ``gpt_backward(scaler.scale(1.0), cache)``
        starts the backward of ``loss * scale`` (torch's ``scaler.scale(loss).backward()``).
        """
        if not self._enabled:
            return outputs
        self._started = True
        s = self._dyn._scale

        def one(v: Any) -> Any:
            if isinstance(v, (list, tuple)):
                return type(v)(one(x) for x in v)
            if isinstance(v, Mapping):
                return {k: one(x) for k, x in v.items()}
            if isinstance(v, (str, bytes)) or v is None or isinstance(v, (bool, np.bool_)):
                raise ValueError("outputs must be an array or a number, or a list/tuple/dict of them")
            a = np.asarray(v)
            if a.dtype.kind not in "fiu":
                raise ValueError(f"outputs must be numbers, got dtype {a.dtype}")
            with np.errstate(over="ignore", invalid="ignore"):
                r = a.astype(_F32, copy=False) * s
            return r if a.ndim else _F32(r)

        return one(outputs)

    def _check_started(self, what: str) -> None:
        if not self._started:
            raise AssertionError(f"Attempted {what} but _scale is None.  This may indicate your script did not "
                                 "use scaler.scale(loss or outputs) earlier in the iteration.")

    def _state(self, optimizer: object) -> dict[str, Any]:
        return self._per_optimizer.setdefault(id(optimizer), _fresh())

    def unscale_(self, optimizer: object, grads: Mapping[str, np.ndarray]) -> None:
        """Multiply ``grads`` in place by ``float32(1/scale)`` and record whether any was inf or NaN
        (tested on the scaled values, as torch's kernel does). At most once per optimizer per iteration."""
        if not self._enabled:
            return
        self._check_started("unscale_")
        st = self._state(optimizer)
        if st["stage"] is OptState.UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        if st["stage"] is OptState.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        gs = _writeable_grads(grads, "GradScaler.unscale_")
        found = _any_nonfinite(gs)
        inv = _F32(1.0 / np.float64(self._dyn._scale))
        if inv != _F32(1.0):   # torch's kernel: (inv_scale == 1.f) ? val : val * inv_scale
            with np.errstate(over="ignore", invalid="ignore"):
                for g in gs:
                    np.multiply(g, inv, out=g)
        st["found_inf"] = found
        st["stage"] = OptState.UNSCALED

    def step(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        """``optimizer.step(*args, **kwargs)`` unless a gradient was inf/NaN (then None, the step skipped).

        The gradients are ``args[1]`` (fpsim's ``step(params, grads, ...)``) or ``kwargs["grads"]``; they
        are unscaled first unless :meth:`unscale_` was called for this optimizer. A fused optimizer
        (``optimizer.fused`` true, torch's ``_step_supports_amp_scaling``) is not unscaled here: it gets
        ``grad_scale`` (the scale, None if already unscaled) and ``found_inf`` (1.0 or 0.0) as one-element
        float32 arrays and divides and skips itself, as torch's ``_fused_adamw_``.
        """
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        self._check_started("step")
        st = self._state(optimizer)
        if st["stage"] is OptState.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        grads = kwargs["grads"] if "grads" in kwargs else (args[1] if len(args) > 1 else None)
        if getattr(optimizer, "fused", False) is True:
            if st["stage"] is OptState.READY:
                st["found_inf"] = _any_nonfinite(_writeable_grads(grads, "GradScaler.step"))
            gscale = None if st["stage"] is OptState.UNSCALED else np.full(1, self._dyn._scale, dtype=_F32)
            found = np.full(1, 1.0 if st["found_inf"] else 0.0, dtype=_F32)
            retval = optimizer.step(*args, grad_scale=gscale, found_inf=found, **kwargs)
            st["stage"] = OptState.STEPPED
            return retval
        if st["stage"] is OptState.READY:
            if grads is None:
                raise TypeError("GradScaler.step: pass the gradients as optimizer.step takes them "
                                "(step(optimizer, params, grads, ...)), or call unscale_(optimizer, grads) first")
            self.unscale_(optimizer, grads)
        if st["found_inf"] is None:
            raise AssertionError("No inf checks were recorded for this optimizer.")
        retval = None if st["found_inf"] else optimizer.step(*args, **kwargs)
        st["stage"] = OptState.STEPPED
        return retval

    def update(self, new_scale: float | np.ndarray | None = None) -> None:
        """Back off (any optimizer's step skipped) or grow (``growth_interval`` clean iterations in a row);
        ``update(new_scale)`` sets the scale instead (float32; the growth tracker is left as it is)."""
        if not self._enabled:
            return
        self._check_started("update")
        if new_scale is not None:
            if isinstance(new_scale, float):
                self._dyn._scale = _F32(new_scale)
            else:
                a = np.asarray(new_scale) if isinstance(new_scale, np.ndarray) else None
                if a is None or a.size != 1 or a.dtype != _F32:
                    raise AssertionError("new_scale should be a float or a 1-element float32 array.")
                self._dyn._scale = _F32(a.reshape(()))
        else:
            found = [st["found_inf"] for st in self._per_optimizer.values() if st["found_inf"] is not None]
            if not found:
                raise AssertionError("No inf checks were recorded prior to update.")
            self._dyn.update(any(found))
        self._per_optimizer = {}

    def get_scale(self) -> float:
        """The current scale (a float32 value as a Python float), or 1.0 when disabled."""
        return float(self._dyn._scale) if self._enabled else 1.0

    def get_growth_factor(self) -> float:
        return self._dyn.growth_factor

    def get_backoff_factor(self) -> float:
        return self._dyn.backoff_factor

    def get_growth_interval(self) -> int:
        return self._dyn.growth_interval

    def is_enabled(self) -> bool:
        return self._enabled

    @property
    def loss_scaler(self) -> DynamicLossScaler:
        """The :class:`DynamicLossScaler` whose arithmetic this scaler runs (shared, not copied)."""
        return self._dyn

    def state_dict(self) -> dict[str, Any]:
        """torch's five keys (``scale``, ``growth_factor``, ``backoff_factor``, ``growth_interval``,
        ``_growth_tracker``); empty when disabled."""
        return self._dyn.state_dict() if self._enabled else {}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load :meth:`state_dict`'s keys (also a torch ``GradScaler``'s); a no-op when disabled."""
        if not self._enabled:
            return
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"state_dict must be a mapping, got {type(state_dict).__name__}")
        if len(state_dict) == 0:
            raise RuntimeError("The source state dict is empty, possibly because it was saved from a disabled "
                               "instance of GradScaler.")
        DynamicLossScaler(init_scale=1.0, growth_factor=state_dict.get("growth_factor", 2.0),
                          backoff_factor=state_dict.get("backoff_factor", 0.5),
                          growth_interval=state_dict.get("growth_interval", 1))  # checks, before any change
        s = state_dict.get("scale")
        if isinstance(s, (bool, np.bool_)) or not isinstance(s, (int, float, np.floating, np.integer)) \
                or math.isnan(float(s)):
            raise ValueError(f"state_dict['scale'] must be a number, got {s!r}")
        self._dyn.load_state_dict(state_dict)

    def __repr__(self) -> str:
        if not self._enabled:
            return "GradScaler(enabled=False)"
        d = self._dyn
        return (f"GradScaler(scale={d.scale!r}, growth_factor={d.growth_factor}, backoff_factor={d.backoff_factor}, "
                f"growth_interval={d.growth_interval}, growth_tracker={d.growth_tracker})")
