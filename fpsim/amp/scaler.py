"""Loss scalers: a static one and torch ``GradScaler``'s dynamic algorithm, bit for bit.

The dynamic scaler keeps its scale as a float32 and a growth tracker as an int, exactly as
``torch.amp.GradScaler`` does (``_amp_update_scale_``): products ``scale * factor`` are taken in double
and stored as float32; a growth that would overflow to inf is refused (the tracker is still reset);
there is no minimum or maximum scale.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np

from .._checks import check_int
from .._fpenv import ieee_mode

__all__ = ["DynamicLossScaler", "LossScaler"]


def _real(value: object, what: str) -> None:
    """A number (not a string, not a bool): ``float("8")`` would otherwise accept text silently."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Real, np.floating, np.integer)):
        raise TypeError(f"{what} must be a real number, got {type(value).__name__}: {value!r}")


def _finite(grads: Mapping[str, np.ndarray]) -> bool:
    return all(bool(np.isfinite(g).all()) for g in grads.values())


@ieee_mode
class LossScaler:
    """A constant loss scale (``scale=1`` is "no loss scaling").

    The loss is multiplied by :attr:`scale` before the backward pass; :meth:`unscale` divides the gradients
    again (multiplying by the float32 reciprocal, as torch does) and reports non-finite values so the
    step can be skipped.

    >>> s = LossScaler(8.0)
    >>> g, found_inf = s.unscale({"w": np.float32([8.0, 16.0])})
    >>> g["w"].tolist(), found_inf
    ([1.0, 2.0], False)
    """

    dynamic = False

    def __init__(self, scale: float = 1.0) -> None:
        _real(scale, "LossScaler scale")
        s = float(scale)
        if not (math.isfinite(s) and s > 0):
            raise ValueError(f"LossScaler scale must be finite and > 0, got {scale!r}")
        self._scale = np.float32(s)

    @property
    def scale(self) -> float:
        """The current loss scale (a float32 value)."""
        return float(self._scale)

    def unscale(self, grads: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], bool]:
        """Return ``(grads * (1/scale), found_inf)``; the inputs are not modified.

        ``found_inf`` is tested on the still-scaled values (inf, -inf or NaN anywhere). The reciprocal is
        computed in double and rounded to float32; when it is exactly 1 the gradients are passed through.
        """
        found_inf = not _finite(grads)
        inv = np.float32(1.0 / np.float64(self._scale))
        if inv == np.float32(1.0):
            out = {k: np.array(v, dtype=np.float32) for k, v in grads.items()}
        else:
            with np.errstate(invalid="ignore", over="ignore"):
                out = {k: np.asarray(v, dtype=np.float32) * inv for k, v in grads.items()}
        return out, found_inf

    def _unscale_owned(self, grads: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], bool]:
        """:meth:`unscale` for gradients the caller hands over (the trainer's new backward results): the
        same values, but a float32 array that owns its memory (and is no other entry's) is scaled in place
        or passed on as it is, instead of into a copy."""
        if len({id(v) for v in grads.values()}) != len(grads):
            return self.unscale(grads)
        found_inf = not _finite(grads)
        inv = np.float32(1.0 / np.float64(self._scale))
        out: dict[str, np.ndarray] = {}
        with np.errstate(invalid="ignore", over="ignore"):
            for k, v in grads.items():
                own = isinstance(v, np.ndarray) and v.dtype == np.float32 and v.flags.owndata and v.flags.writeable
                if inv == np.float32(1.0):
                    out[k] = v if own else np.array(v, dtype=np.float32)
                else:
                    out[k] = np.multiply(v, inv, out=v) if own else np.asarray(v, dtype=np.float32) * inv
        return out, found_inf

    def update(self, found_inf: bool) -> None:
        """A static scale does not change."""

    def state_dict(self) -> dict[str, Any]:
        return {"scale": float(self._scale)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if "scale" not in state:
            raise ValueError(f"loss scaler state needs a 'scale' entry, got keys {sorted(state)}")
        self._scale = np.float32(state["scale"])

    def __repr__(self) -> str:
        return f"LossScaler(scale={self.scale!r})"


@ieee_mode
class DynamicLossScaler(LossScaler):
    """torch ``GradScaler``'s dynamic loss scale.

    On an overflow (``found_inf``): ``scale <- float32(scale * backoff_factor)``, tracker reset to 0.
    On a clean step the tracker is incremented first; when it reaches ``growth_interval`` the scale becomes
    ``float32(scale * growth_factor)`` if that is finite (otherwise it stays) and the tracker resets.

    >>> s = DynamicLossScaler(init_scale=1000.0, growth_factor=1.1, backoff_factor=0.3, growth_interval=2)
    >>> out = []
    >>> for inf in [False, False, True, False, False, True]:
    ...     s.update(inf); out.append(s.scale)
    >>> [round(v, 6) for v in out]
    [1000.0, 1100.0, 330.0, 330.0, 363.0, 108.900002]
    """

    dynamic = True

    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000) -> None:
        for v, what in ((init_scale, "init_scale"), (growth_factor, "growth_factor"),
                        (backoff_factor, "backoff_factor")):
            _real(v, what)
        if not float(growth_factor) > 1.0:
            raise ValueError(f"growth_factor must be > 1, got {growth_factor!r}")
        # A factor <= 0 would make the scale 0 or negative: no loss scaler can recover from that.
        if not 0.0 < float(backoff_factor) < 1.0:
            raise ValueError(f"backoff_factor must be in (0, 1), got {backoff_factor!r}")
        if check_int(growth_interval, "growth_interval") < 1:
            raise ValueError(f"growth_interval must be a positive int, got {growth_interval!r}")
        self._scale = np.float32(init_scale)  # like torch: any value, even 0 or inf, is taken as given
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = int(growth_interval)
        self._growth_tracker = 0

    @property
    def growth_tracker(self) -> int:
        """Clean steps since the last change (torch's ``_growth_tracker``)."""
        return self._growth_tracker

    def update(self, found_inf: bool) -> None:
        """Back off after an overflow, grow after ``growth_interval`` clean steps (torch's kernel)."""
        if found_inf:
            self._scale = np.float32(np.float64(self._scale) * self.backoff_factor)
            self._growth_tracker = 0
            return
        t = self._growth_tracker + 1
        if t == self.growth_interval:
            with np.errstate(over="ignore"):
                s = np.float32(np.float64(self._scale) * self.growth_factor)
            if np.isfinite(s):
                self._scale = s
            self._growth_tracker = 0
        else:
            self._growth_tracker = t

    def state_dict(self) -> dict[str, Any]:
        """Same keys as torch's ``GradScaler.state_dict()``."""
        return {"scale": float(self._scale), "growth_factor": self.growth_factor,
                "backoff_factor": self.backoff_factor, "growth_interval": self.growth_interval,
                "_growth_tracker": int(self._growth_tracker)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        need = {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"}
        if not need <= set(state):
            raise ValueError(f"dynamic loss scaler state needs keys {sorted(need)}, got {sorted(state)}")
        self._scale = np.float32(state["scale"])
        self.growth_factor = float(state["growth_factor"])
        self.backoff_factor = float(state["backoff_factor"])
        self.growth_interval = int(state["growth_interval"])
        self._growth_tracker = int(state["_growth_tracker"])

    def __repr__(self) -> str:
        return (f"DynamicLossScaler(scale={self.scale!r}, growth_factor={self.growth_factor}, "
                f"backoff_factor={self.backoff_factor}, growth_interval={self.growth_interval}, "
                f"tracker={self._growth_tracker})")
