"""Observers (min/max, moving average, per channel) computing the scale and zero point of
``torch.ao.quantization``, and :class:`FakeQuantize` (observer + fake quantization) with its presets. Public names are
re-exported by :mod:`fpsim.quant`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._fpenv import ieee_mode
from ..scaling._common import _as_float
from ._fake import _EPS32, _F32, _int, fake_quantize_with_mask


# --------------------------------------------------------------------------------------------------
# Observers

_DTYPES = ("quint8", "qint8", "uint8", "int8", "qint32", "int32", "uint16", "int16", "quint4x2")
_QSCHEMES = ("per_tensor_affine", "per_tensor_symmetric", "per_channel_affine", "per_channel_symmetric",
             "per_channel_affine_float_qparams")


@ieee_mode
def quant_range(dtype: str = "quint8", *, reduce_range: bool = False, quant_min: int | None = None,
                quant_max: int | None = None) -> tuple[int, int]:
    """Integer range of a quantized dtype, as torch's ``calculate_qmin_qmax``.

    >>> quant_range("quint8"), quant_range("qint8"), quant_range("quint8", reduce_range=True)
    ((0, 255), (-128, 127), (0, 127))
    >>> quant_range("quint8", quant_min=0, quant_max=255, reduce_range=True)
    (0, 127)
    """
    if dtype not in _DTYPES:
        raise ValueError(f"unknown quantized dtype {dtype!r}; valid: {', '.join(_DTYPES)}")
    if quant_min is not None and quant_max is not None:
        qmin, qmax = _int("quant_min", quant_min), _int("quant_max", quant_max)
        if not qmin <= 0 <= qmax:
            raise ValueError(f"user-specified quantization range [{qmin}, {qmax}] must include 0")
        if qmin >= qmax:
            raise ValueError(f"quant_min ({qmin}) must be less than quant_max ({qmax})")
        n = qmax - qmin + 1
        if dtype in ("qint8", "int8") and not 0 < n <= 256:
            raise ValueError(f"quantization range [{qmin}, {qmax}] is too large for {dtype}")
        if reduce_range:
            qmin, qmax = qmin // 2, qmax // 2
        return qmin, qmax
    if dtype in ("qint8", "int8"):
        return (-64, 63) if reduce_range else (-128, 127)
    if dtype in ("quint8", "uint8"):
        return (0, 127) if reduce_range else (0, 255)
    if dtype in ("qint32", "int32"):
        return -(2**31), 2**31 - 1
    if dtype == "uint16":
        return 0, 2**16 - 1
    if dtype == "int16":
        return -(2**15), 2**15 - 1
    return 0, 15


@ieee_mode
class ObserverBase:
    """Shared parts of torch's uniform quantization observers (qparams from running min/max).

    Parameters (as torch): ``dtype`` (``"quint8"``, ``"qint8"``, ...), ``qscheme``
    (``"per_tensor_affine"``, ``"per_tensor_symmetric"``, per-channel names for per-channel observers),
    ``reduce_range``, ``quant_min``/``quant_max`` (a custom range; both or neither), ``eps`` (lower bound
    on the scale, float32 machine epsilon 2**-23 by default).

    Calling an observer on a batch updates ``min_val``/``max_val`` (float32) and returns the batch
    unchanged; :meth:`calculate_qparams` returns ``(scale, zero_point)``: float32 and int64 arrays of shape
    ``(1,)`` (per tensor) or ``(C,)`` (per channel).
    """

    _per_channel = False

    def __init__(self, dtype: str = "quint8", qscheme: str = "per_tensor_affine", reduce_range: bool = False,
                 quant_min: int | None = None, quant_max: int | None = None, eps: float = _EPS32) -> None:
        if dtype not in _DTYPES:
            raise ValueError(f"unknown quantized dtype {dtype!r}; valid: {', '.join(_DTYPES)}")
        if qscheme not in _QSCHEMES:
            raise ValueError(f"unknown qscheme {qscheme!r}; valid: {', '.join(_QSCHEMES)}")
        if qscheme.startswith("per_channel") != self._per_channel:
            kind = "per-channel" if self._per_channel else "per-tensor"
            raise ValueError(f"{type(self).__name__} is a {kind} observer; qscheme {qscheme!r} does not fit")
        if reduce_range and dtype in ("quint8", "uint8") and qscheme.endswith("symmetric"):
            raise NotImplementedError("Cannot reduce range for symmetric quantization for quint8 (as torch)")
        if (quant_min is None) != (quant_max is None):
            raise ValueError("give both quant_min and quant_max, or neither")
        self.dtype = dtype
        self.qscheme = qscheme
        self.reduce_range = bool(reduce_range)
        self.has_customized_qrange = quant_min is not None and quant_max is not None
        self.quant_min, self.quant_max = quant_range(dtype, reduce_range=reduce_range, quant_min=quant_min,
                                                     quant_max=quant_max)
        self.eps = _F32(eps)
        self.min_val: np.ndarray = np.zeros(0, _F32)
        self.max_val: np.ndarray = np.zeros(0, _F32)
        self.reset_min_max_vals()

    def reset_min_max_vals(self) -> None:
        """Forget what was observed (torch: +inf / -inf per tensor, empty per channel)."""
        if self._per_channel:
            self.min_val = np.zeros(0, _F32)
            self.max_val = np.zeros(0, _F32)
        else:
            self.min_val = np.array(np.inf, dtype=_F32)
            self.max_val = np.array(-np.inf, dtype=_F32)

    def __call__(self, x: Any) -> Any:
        """Observe a batch (cast to float32 like torch) and return it unchanged."""
        a = _as_float(x)
        if a.size:
            self._observe(a.astype(_F32, copy=False))
        return x

    forward = __call__

    def _observe(self, x: np.ndarray) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _valid(self) -> bool:
        mn, mx = self.min_val, self.max_val
        if mn.size == 0 or mx.size == 0:
            return False
        if mn.ndim == 0 and mn == np.inf and mx == -np.inf:
            return False
        if not np.all(mn <= mx):
            raise ValueError(f"min {mn} should be less than max {mx} (NaN observed?)")
        return True

    def calculate_qparams(self) -> tuple[np.ndarray, np.ndarray]:
        """(scale float32, zero_point int64) from the observed min/max, as torch's ``_calculate_qparams``.

        Symmetric: ``scale = max(-min_neg, max_pos) / ((qmax - qmin) / 2)``, at least eps; zero point 0,
        or 128 for quint8 (``(qmin + qmax) // 2`` with a custom range, 2**15 for uint16). Affine:
        ``scale = max((max_pos - min_neg) / (qmax - qmin), eps)``,
        ``zp = clamp(qmin - round(min_neg / scale), qmin, qmax)`` (ties to even), where
        ``min_neg = min(min, 0)`` and ``max_pos = max(max, 0)``. All float32. Nothing observed:
        scale 1, zero point 0.
        """
        if not self._valid():
            return np.array([1.0], dtype=_F32), np.array([0], dtype=np.int64)
        mn = np.asarray(self.min_val, dtype=_F32)
        mx = np.asarray(self.max_val, dtype=_F32)
        qmin, qmax = self.quant_min, self.quant_max
        min_neg = np.minimum(mn, _F32(0))
        max_pos = np.maximum(mx, _F32(0))
        zp = np.zeros(min_neg.shape, dtype=np.int64)
        with np.errstate(divide="ignore", invalid="ignore"):
            if self.qscheme.endswith("symmetric"):
                m = np.maximum(-min_neg, max_pos)
                scale = (m / _F32((qmax - qmin) / 2)).astype(_F32)
                scale = np.maximum(scale, self.eps)
                if self.dtype in ("quint8", "uint8"):
                    zp[...] = (qmin + qmax) // 2 if self.has_customized_qrange else 128
                elif self.dtype == "uint16":
                    zp[...] = 2**15
            elif self.qscheme == "per_channel_affine_float_qparams":
                scale = ((mx - mn) / _F32(qmax - qmin)).astype(_F32)
                scale = np.where(scale > self.eps, scale, _F32(1.0)).astype(_F32)
                zpf = (_F32(-1) * mn / scale).astype(_F32)
                return np.atleast_1d(scale), np.atleast_1d(zpf)
            else:
                scale = ((max_pos - min_neg) / _F32(qmax - qmin)).astype(_F32)
                scale = np.maximum(scale, self.eps)
                r = np.rint((min_neg / scale).astype(_F32)).astype(np.int64)
                zp = np.clip(qmin - r, qmin, qmax).astype(np.int64)
        return np.atleast_1d(np.asarray(scale, dtype=_F32)), np.atleast_1d(zp)

    def state_dict(self) -> dict[str, Any]:
        """min_val / max_val as lists (plus the configuration, for checking on load)."""
        return {"dtype": self.dtype, "qscheme": self.qscheme, "quant_min": self.quant_min,
                "quant_max": self.quant_max, "min_val": np.asarray(self.min_val).tolist(),
                "max_val": np.asarray(self.max_val).tolist()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("dtype", "qscheme", "quant_min", "quant_max"):
            if key in state and state[key] != getattr(self, key):
                raise ValueError(f"state has {key}={state[key]!r}, this observer has {getattr(self, key)!r}")
        if "min_val" not in state or "max_val" not in state:
            raise ValueError("state_dict needs min_val and max_val")
        self.min_val = np.asarray(state["min_val"], dtype=_F32)
        self.max_val = np.asarray(state["max_val"], dtype=_F32)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(dtype={self.dtype!r}, qscheme={self.qscheme!r}, "
                f"quant_min={self.quant_min}, quant_max={self.quant_max}, min_val={self.min_val}, "
                f"max_val={self.max_val})")


def _aminmax(x: np.ndarray) -> tuple[np.float32, np.float32]:
    return _F32(x.min()), _F32(x.max())  # NaN propagates, as torch.aminmax


@ieee_mode
class MinMaxObserver(ObserverBase):
    """Running min and max over all batches (``torch.ao.quantization.MinMaxObserver``).

    >>> import numpy as np
    >>> ob = MinMaxObserver()
    >>> _ = ob(np.float32([-1, 3]))
    >>> s, zp = ob.calculate_qparams()
    >>> float(s[0]), int(zp[0])
    (0.01568627543747425, 64)
    """

    def _observe(self, x: np.ndarray) -> None:
        lo, hi = _aminmax(x)
        self.min_val = np.asarray(np.minimum(lo, self.min_val), dtype=_F32)  # NaN propagates, as torch.min
        self.max_val = np.asarray(np.maximum(hi, self.max_val), dtype=_F32)


@ieee_mode
class MovingAverageMinMaxObserver(ObserverBase):
    """Exponential moving average of batch min/max (``averaging_constant`` c, default 0.01).

    The first batch sets min/max; later ``min += c * (batch_min - min)`` (float32, c as float32).

    >>> import numpy as np
    >>> ob = MovingAverageMinMaxObserver()
    >>> for b in ([-1, 2], [-3, 6]):
    ...     _ = ob(np.float32(b))
    >>> float(ob.min_val), float(ob.max_val)
    (-1.0199999809265137, 2.0399999618530273)
    """

    def __init__(self, averaging_constant: float = 0.01, dtype: str = "quint8",
                 qscheme: str = "per_tensor_affine", reduce_range: bool = False, quant_min: int | None = None,
                 quant_max: int | None = None, eps: float = _EPS32) -> None:
        self.averaging_constant = float(averaging_constant)
        super().__init__(dtype, qscheme, reduce_range, quant_min, quant_max, eps)

    def _observe(self, x: np.ndarray) -> None:
        lo, hi = _aminmax(x)
        if self.min_val == np.inf and self.max_val == -np.inf:
            self.min_val, self.max_val = np.asarray(lo), np.asarray(hi)
            return
        c = _F32(self.averaging_constant)
        self.min_val = np.asarray(_F32(self.min_val + _F32(c * _F32(lo - self.min_val))))
        self.max_val = np.asarray(_F32(self.max_val + _F32(c * _F32(hi - self.max_val))))


def _per_channel_minmax(x: np.ndarray, ch_axis: int) -> tuple[np.ndarray, np.ndarray]:
    if x.ndim == 0:
        raise ValueError("per-channel observers need an array with at least one dimension")
    if not -x.ndim <= ch_axis < x.ndim:
        raise ValueError(f"ch_axis {ch_axis} is out of range for an array with {x.ndim} dimension(s)")
    y = np.moveaxis(x, ch_axis, 0).reshape(x.shape[ch_axis], -1)
    return y.min(axis=1).astype(_F32), y.max(axis=1).astype(_F32)


@ieee_mode
class PerChannelMinMaxObserver(ObserverBase):
    """Running min/max per channel along ``ch_axis`` (``torch.ao.quantization.PerChannelMinMaxObserver``).

    >>> import numpy as np
    >>> ob = PerChannelMinMaxObserver(ch_axis=0, dtype="qint8", qscheme="per_channel_symmetric")
    >>> _ = ob(np.float32([[-1, 3], [0.5, 0.25]]))
    >>> s, zp = ob.calculate_qparams()
    >>> s.tolist(), zp.tolist()
    ([0.0235294122248888, 0.003921568859368563], [0, 0])
    """

    _per_channel = True

    def __init__(self, ch_axis: int = 0, dtype: str = "quint8", qscheme: str = "per_channel_affine",
                 reduce_range: bool = False, quant_min: int | None = None, quant_max: int | None = None,
                 eps: float = _EPS32) -> None:
        self.ch_axis = int(ch_axis)
        super().__init__(dtype, qscheme, reduce_range, quant_min, quant_max, eps)

    def _observe(self, x: np.ndarray) -> None:
        lo, hi = _per_channel_minmax(x, self.ch_axis)
        if self.min_val.size == 0 or self.max_val.size == 0:
            self.min_val, self.max_val = lo, hi
        else:
            self.min_val = np.minimum(lo, self.min_val)
            self.max_val = np.maximum(hi, self.max_val)


@ieee_mode
class MovingAveragePerChannelMinMaxObserver(PerChannelMinMaxObserver):
    """Per-channel moving-average min/max (``torch.ao.quantization.MovingAveragePerChannelMinMaxObserver``)."""

    def __init__(self, averaging_constant: float = 0.01, ch_axis: int = 0, dtype: str = "quint8",
                 qscheme: str = "per_channel_affine", reduce_range: bool = False, quant_min: int | None = None,
                 quant_max: int | None = None, eps: float = _EPS32) -> None:
        self.averaging_constant = float(averaging_constant)
        super().__init__(ch_axis, dtype, qscheme, reduce_range, quant_min, quant_max, eps)

    def _observe(self, x: np.ndarray) -> None:
        lo, hi = _per_channel_minmax(x, self.ch_axis)
        if self.min_val.size == 0 or self.max_val.size == 0:
            self.min_val, self.max_val = lo, hi
            return
        c = _F32(self.averaging_constant)
        self.min_val = (self.min_val + (c * (lo - self.min_val).astype(_F32)).astype(_F32)).astype(_F32)
        self.max_val = (self.max_val + (c * (hi - self.max_val).astype(_F32)).astype(_F32)).astype(_F32)


@ieee_mode
class FakeQuantize:
    """Observer + fake quantization, like ``torch.ao.quantization.FakeQuantize``.

    ``forward(x)``: if ``observer_enabled``, observe ``x`` and copy the observer's qparams into
    ``scale``/``zero_point`` (the batch affects its own qparams); then, if ``fake_quant_enabled``,
    fake-quantise (per channel along the observer's ``ch_axis`` for per-channel observers).
    ``backward(dy)`` applies the straight-through mask cached by the last forward.

    >>> import numpy as np
    >>> fq = default_fake_quant()
    >>> y = fq(np.float32([-1.0, 0.5, 2.0]))
    >>> float(fq.scale[0]), int(fq.zero_point[0]), y.tolist()
    (0.023622047156095505, 42, [-0.9921259880065918, 0.4960629940032959, 2.007874011993408])
    """

    def __init__(self, observer: type[ObserverBase] = MovingAverageMinMaxObserver, quant_min: int | None = None,
                 quant_max: int | None = None, **observer_kwargs: Any) -> None:
        if quant_min is not None and quant_max is not None:
            if quant_min > quant_max:
                raise ValueError(f"quant_min ({quant_min}) must be <= quant_max ({quant_max})")
            observer_kwargs["quant_min"] = quant_min
            observer_kwargs["quant_max"] = quant_max
        self.activation_post_process: ObserverBase = observer(**observer_kwargs)
        self.quant_min = self.activation_post_process.quant_min
        self.quant_max = self.activation_post_process.quant_max
        self.is_per_channel = self.activation_post_process.qscheme.startswith("per_channel")
        self.ch_axis = int(getattr(self.activation_post_process, "ch_axis", -1)) if self.is_per_channel else -1
        self.scale: np.ndarray = np.array([1.0], dtype=_F32)
        self.zero_point: np.ndarray = np.array([0], dtype=np.int32)
        self.fake_quant_enabled = True
        self.observer_enabled = True
        self._mask: np.ndarray | None = None

    def calculate_qparams(self) -> tuple[np.ndarray, np.ndarray]:
        return self.activation_post_process.calculate_qparams()

    def enable_fake_quant(self, enabled: bool = True) -> FakeQuantize:
        self.fake_quant_enabled = bool(enabled)
        return self

    def disable_fake_quant(self) -> FakeQuantize:
        return self.enable_fake_quant(False)

    def enable_observer(self, enabled: bool = True) -> FakeQuantize:
        self.observer_enabled = bool(enabled)
        return self

    def disable_observer(self) -> FakeQuantize:
        return self.enable_observer(False)

    def forward(self, x: Any) -> Any:
        a = _as_float(x)
        if self.observer_enabled:
            self.activation_post_process(a)
            s, zp = self.calculate_qparams()
            self.scale = s.astype(_F32)
            self.zero_point = zp.astype(np.float32 if zp.dtype.kind == "f" else np.int32)
        if not self.fake_quant_enabled:
            self._mask = None
            return a
        if self.is_per_channel:
            y, m = fake_quantize_with_mask(a, self.scale, self.zero_point, self.quant_min, self.quant_max,
                                           axis=self.ch_axis)
        else:
            y, m = fake_quantize_with_mask(a, self.scale, int(self.zero_point[0]), self.quant_min, self.quant_max)
        self._mask = np.asarray(m)
        return y

    __call__ = forward

    def backward(self, dy: Any) -> Any:
        """``dy * mask`` of the last forward (identity if fake quantization was off)."""
        g = _as_float(dy, "dy")
        if self._mask is None:
            return g
        with np.errstate(invalid="ignore"):
            return g * self._mask.astype(g.dtype)

    def state_dict(self) -> dict[str, Any]:
        return {"scale": self.scale.tolist(), "zero_point": self.zero_point.tolist(),
                "fake_quant_enabled": self.fake_quant_enabled, "observer_enabled": self.observer_enabled,
                "observer": self.activation_post_process.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale = np.asarray(state["scale"], dtype=_F32).reshape(-1)
        zp = np.asarray(state["zero_point"]).reshape(-1)
        self.zero_point = zp.astype(np.float32 if zp.dtype.kind == "f" else np.int32)
        self.fake_quant_enabled = bool(state.get("fake_quant_enabled", True))
        self.observer_enabled = bool(state.get("observer_enabled", True))
        if "observer" in state:
            self.activation_post_process.load_state_dict(state["observer"])


@ieee_mode
def default_fake_quant() -> FakeQuantize:
    """torch's ``default_fake_quant``: moving-average observer, quint8 affine, [0, 255] with
    ``reduce_range=True`` (effective [0, 127])."""
    return FakeQuantize(MovingAverageMinMaxObserver, quant_min=0, quant_max=255, dtype="quint8",
                        qscheme="per_tensor_affine", reduce_range=True)


@ieee_mode
def default_weight_fake_quant() -> FakeQuantize:
    """torch's ``default_weight_fake_quant``: moving-average observer, qint8 symmetric [-128, 127]."""
    return FakeQuantize(MovingAverageMinMaxObserver, quant_min=-128, quant_max=127, dtype="qint8",
                        qscheme="per_tensor_symmetric", reduce_range=False)


@ieee_mode
def default_per_channel_weight_fake_quant() -> FakeQuantize:
    """torch's ``default_per_channel_weight_fake_quant``: per-channel moving average, qint8 symmetric, axis 0."""
    return FakeQuantize(MovingAveragePerChannelMinMaxObserver, quant_min=-128, quant_max=127, dtype="qint8",
                        qscheme="per_channel_symmetric", reduce_range=False, ch_axis=0)

