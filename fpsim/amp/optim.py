"""Optimizers (SGD with momentum, AdamW) and the weight store with optional FP32 master weights.

The optimizer turns gradients into *intended* updates, keeping its moments in the policy's
``optimizer_state`` format; :class:`MasterWeights` applies them to the stored weights in the policy's
``weights`` format (FP32 master, or the low-precision params themselves) and counts the updates that
rounding swallowed: an update smaller than half an ulp of its weight leaves the weight unchanged.

>>> import numpy as np
>>> from fpsim.amp import get_policy, MasterWeights
>>> p = get_policy("fp16-no-master")
>>> store = MasterWeights({"w": np.float32([1.0, 1.0])}, p, p.runtime())
>>> lost = store.apply({"w": np.float32([1e-4, 1e-3])})   # 1e-4 < ulp(1)/2 = 2**-11 in fp16
>>> store.weights["w"].tolist(), lost["w"]
([1.0, 0.9990234375], 0.5)
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .._fpenv import ieee_mode
from .._names import parse_name
from ..formats import as_format
from .policy import Policy

__all__ = ["SGD", "AdamW", "MasterWeights", "make_optimizer"]

_F32 = np.float32
Cast = Callable[[np.ndarray], np.ndarray]


def _identity(x: np.ndarray) -> np.ndarray:
    return x


def _numbers(who: str, **values: object) -> None:
    """Hyperparameters are finite real numbers (not bools or strings; inf and NaN would make every
    update inf or NaN); the ranges are checked by each optimizer."""
    for name, v in values.items():
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (numbers.Real, np.floating, np.integer)):
            raise TypeError(f"{who} {name} must be a real number, got {type(v).__name__}: {v!r}")
        if not math.isfinite(float(v)):
            raise ValueError(f"{who} {name} must be finite, got {v!r}")


def _callable(who: str, f: object) -> None:
    if not callable(f):
        raise TypeError(f"{who} cast_state must be callable, got {type(f).__name__}")


def _adam_moments_f32(g: np.ndarray, m0: np.ndarray, v0: np.ndarray, b1: np.float32, b2: np.float32
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Adam's new float32 moments b1 m0 + (1 - b1) g and b2 v0 + (1 - b2) g g: the plain expression's
    operations in its order, into two new arrays with one temporary (m0 and v0 are left as they are)."""
    t = np.multiply(g, _F32(1) - b1)
    m = np.multiply(m0, b1)
    m += t
    t = np.multiply(g, _F32(1) - b2, out=t)
    t *= g
    v = np.multiply(v0, b2)
    v += t
    return m, v


def _adam_step_f32(m: np.ndarray, v: np.ndarray, bc1: np.float32, bc2: np.float32, eps: np.float32,
                   lr32: np.float32) -> np.ndarray:
    """lr * ((m / bc1) / (sqrt(v / bc2) + eps)) in float32, in two buffers (the plain expression's order)."""
    u: np.ndarray = np.divide(m, bc1)
    d = np.divide(v, bc2)
    np.sqrt(d, out=d)
    d += eps
    u /= d
    u *= lr32
    return u


@ieee_mode
class SGD:
    """SGD with momentum (torch semantics: ``buf = momentum*buf + (1-dampening)*g``; update ``lr*buf``, or
    ``lr*(g + momentum*buf)`` with ``nesterov``), decoupled weight decay optional. The momentum buffer is
    rounded with ``cast_state`` after every step.

    ``fused=True``: :meth:`step` runs :func:`fpsim.amp.fused_sgd_step`, bit for bit as
    ``torch.optim.SGD(fused=True)`` on CPU (weight decay then torch's: L2, added to the gradient before
    the momentum), with ``grad_scale``/``found_inf`` as torch's GradScaler passes them; the state stays
    in float32 (``cast_state`` is not applied) and :meth:`updates` is refused (the fused step writes the
    weights itself).
    """

    def __init__(self, lr: float = 0.01, momentum: float = 0.9, weight_decay: float = 0.0,
                 cast_state: Cast = _identity, *, dampening: float = 0.0, nesterov: bool = False,
                 maximize: bool = False, fused: bool = False) -> None:
        _numbers("SGD", lr=lr, momentum=momentum, weight_decay=weight_decay, dampening=dampening)
        if not lr >= 0 or not 0 <= momentum < 1 or not weight_decay >= 0:
            raise ValueError(f"SGD needs lr >= 0, 0 <= momentum < 1, weight_decay >= 0; got {lr}, {momentum}, "
                             f"{weight_decay}")
        _callable("SGD", cast_state)
        for name, v in (("nesterov", nesterov), ("maximize", maximize), ("fused", fused)):
            _bool("SGD", name, v)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError(f"SGD nesterov=True needs momentum > 0 and dampening = 0; got momentum={momentum}, "
                             f"dampening={dampening}")
        self.lr, self.momentum, self.weight_decay = float(lr), float(momentum), float(weight_decay)
        self.dampening, self.nesterov, self.maximize, self.fused = float(dampening), bool(nesterov), \
            bool(maximize), bool(fused)
        self.cast_state = cast_state
        self.state: dict[str, np.ndarray] = {}
        self.t = 0

    def step(self, params: Mapping[str, np.ndarray], grads: Mapping[str, np.ndarray], *, lr: float | None = None,
             grad_scale: np.ndarray | None = None, found_inf: np.ndarray | None = None,
             copy_format: Any = None) -> dict[str, np.ndarray] | None:
        """Update the float32 ``params`` (the master weights) in place, as ``torch.optim.SGD.step``.

        See :meth:`AdamW.step` for ``grad_scale``, ``found_inf`` (fused only; ``grads`` are then unscaled in
        place, as torch's kernel does) and ``copy_format``.
        """
        keys = _step_keys(params, grads, "SGD", lr)
        if not self.fused:
            return _unfused_step(self, params, grads, keys, lr, grad_scale, found_inf, copy_format)
        from .fused import fused_sgd_step

        first = self.momentum != 0 and not any(k in self.state for k in keys)
        if first:
            for k in keys:
                self.state[k] = np.zeros_like(params[k])
        fused_sgd_step([params[k] for k in keys], [grads[k] for k in keys],
                       [self.state[k] for k in keys] if self.momentum != 0 else [],
                       weight_decay=self.weight_decay, momentum=self.momentum,
                       lr=float(self.lr if lr is None else lr), dampening=self.dampening, nesterov=self.nesterov,
                       maximize=self.maximize, is_first_step=first, grad_scale=grad_scale, found_inf=found_inf)
        if not _skipped(found_inf):
            self.t += 1
        return _low_copy(params, copy_format)

    def updates(self, weights: Mapping[str, np.ndarray], grads: Mapping[str, np.ndarray],
                lr: float | None = None) -> dict[str, np.ndarray]:
        _no_fused_updates(self)
        lr32 = _F32(self.lr if lr is None else lr)
        mom = _F32(self.momentum)
        keep = _F32(1.0 - self.dampening)
        out = {}
        for k, g in grads.items():
            g = g.astype(_F32, copy=False)
            if self.maximize:
                g = -g
            buf = self.state.get(k)
            buf = g.copy() if buf is None else mom * buf + (g if keep == 1 else keep * g)
            buf = self.cast_state(buf)
            self.state[k] = buf
            u = lr32 * (g + mom * buf if self.nesterov else buf)
            if self.weight_decay:
                u = u + lr32 * _F32(self.weight_decay) * weights[k]
            out[k] = u
        self.t += 1
        return out

    def state_dict(self) -> dict[str, np.ndarray]:
        d = {f"buf.{k}": v for k, v in self.state.items()}
        d["t"] = np.asarray(self.t)
        return d

    def load_state_dict(self, d: Mapping[str, np.ndarray]) -> None:
        t = _state_step(d, "SGD")
        self.state = {k[4:]: _state_array(v, "SGD", k) for k, v in d.items() if k.startswith("buf.")}
        self.t = t


@ieee_mode
class AdamW:
    """AdamW (torch semantics, float32 arithmetic): ``m = b1 m + (1-b1) g``, ``v = b2 v + (1-b2) g^2``,
    update ``lr * (m_hat / (sqrt(v_hat) + eps) + wd * w)``. Moments rounded with ``cast_state``.

    ``amsgrad`` keeps the running maximum of ``v`` and divides by it; ``maximize`` ascends. ``fused=True``:
    :meth:`step` runs :func:`fpsim.amp.fused_adamw_step`, bit for bit as ``torch.optim.AdamW(fused=True)``
    on CPU, with ``grad_scale``/``found_inf`` as torch's GradScaler passes them; the moments stay in float32
    (``cast_state`` is not applied) and :meth:`updates` is refused (the fused step writes the weights
    itself). The unfused and the fused step round at different points (see ``docs/optimizers.md``).

    >>> import numpy as np
    >>> opt = AdamW(lr=0.1, fused=True)
    >>> w = {"w": np.float32([1.0, -1.0])}
    >>> opt.step(w, {"w": np.float32([0.5, -0.5])}, copy_format="bf16")["w"].tolist()
    [0.8984375, -0.8984375]
    >>> w["w"].tolist()                                   # the FP32 master, updated in place
    [0.9000000357627869, -0.9000000357627869]
    """

    def __init__(self, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, cast_state: Cast = _identity, *, amsgrad: bool = False,
                 maximize: bool = False, fused: bool = False) -> None:
        if isinstance(betas, (str, bytes)) or not hasattr(betas, "__len__") or len(betas) != 2:
            raise TypeError(f"AdamW betas must be a pair (b1, b2), got {betas!r}")
        b1, b2 = betas
        _numbers("AdamW", lr=lr, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay)
        _callable("AdamW", cast_state)
        if not lr >= 0 or not 0 <= b1 < 1 or not 0 <= b2 < 1 or not eps >= 0 or not weight_decay >= 0:
            raise ValueError(f"AdamW needs lr >= 0, 0 <= betas < 1, eps >= 0, weight_decay >= 0; got lr={lr}, "
                             f"betas={betas}, eps={eps}, weight_decay={weight_decay}")
        self.lr, self.b1, self.b2, self.eps, self.weight_decay = float(lr), float(b1), float(b2), float(eps), \
            float(weight_decay)
        for name, v in (("amsgrad", amsgrad), ("maximize", maximize), ("fused", fused)):
            _bool("AdamW", name, v)
        self.amsgrad, self.maximize, self.fused = bool(amsgrad), bool(maximize), bool(fused)
        self.cast_state = cast_state
        self.state: dict[str, np.ndarray] = {}
        self.t = 0
        # the last flat update's (keys, m, v, m views, v views): see _flat_updates
        self._flat: tuple[list[str], np.ndarray, np.ndarray, list[np.ndarray], list[np.ndarray]] | None = None

    def step(self, params: Mapping[str, np.ndarray], grads: Mapping[str, np.ndarray], *, lr: float | None = None,
             grad_scale: np.ndarray | None = None, found_inf: np.ndarray | None = None,
             copy_format: Any = None) -> dict[str, np.ndarray] | None:
        """Update the float32 ``params`` (the master weights) in place, as ``torch.optim.AdamW.step``.

        ``grad_scale`` / ``found_inf`` (one-element float32 arrays, fused only, as torch's GradScaler hands
        them to a fused optimizer): the kernel divides the gradients by ``grad_scale`` (in place, as torch
        does) and skips the whole step when ``found_inf`` is 1 (the step count is then not advanced).
        ``copy_format`` (a format or name): also return the low-precision copy of every weight, rounded
        once (RNE) from the new master, as apex's O2 keeps it; None returns None.
        """
        keys = _step_keys(params, grads, "AdamW", lr)
        if not self.fused:
            return _unfused_step(self, params, grads, keys, lr, grad_scale, found_inf, copy_format)
        from .fused import fused_adamw_step

        for k in keys:
            if f"m.{k}" not in self.state:
                self.state[f"m.{k}"] = np.zeros_like(params[k])
                self.state[f"v.{k}"] = np.zeros_like(params[k])
                if self.amsgrad:
                    self.state[f"vmax.{k}"] = np.zeros_like(params[k])
        steps = [np.array([self.t + 1], dtype=_F32) for _ in keys]  # torch: _foreach_add_(state_steps, 1) first
        fused_adamw_step([params[k] for k in keys], [grads[k] for k in keys], [self.state[f"m.{k}"] for k in keys],
                         [self.state[f"v.{k}"] for k in keys],
                         [self.state[f"vmax.{k}"] for k in keys] if self.amsgrad else [], steps,
                         lr=float(self.lr if lr is None else lr), beta1=self.b1, beta2=self.b2,
                         weight_decay=self.weight_decay, eps=self.eps, amsgrad=self.amsgrad, maximize=self.maximize,
                         grad_scale=grad_scale, found_inf=found_inf)
        if not _skipped(found_inf):   # torch: _foreach_sub_(state_steps, found_inf) afterwards
            self.t += 1
        return _low_copy(params, copy_format)

    def updates(self, weights: Mapping[str, np.ndarray], grads: Mapping[str, np.ndarray],
                lr: float | None = None) -> dict[str, np.ndarray]:
        _no_fused_updates(self)
        self.t += 1
        lr32 = _F32(self.lr if lr is None else lr)
        b1, b2 = _F32(self.b1), _F32(self.b2)
        bc1 = _F32(1.0 - self.b1 ** self.t)
        bc2 = _F32(1.0 - self.b2 ** self.t)
        eps = _F32(self.eps)
        if self.cast_state is _identity and not (self.maximize or self.amsgrad):
            flat = self._flat_updates(weights, grads, lr32, b1, b2, bc1, bc2, eps)
            if flat is not None:
                return flat
        out = {}
        for k, g in grads.items():
            g = g.astype(_F32, copy=False)
            if self.maximize:
                g = -g
            m = self.state.get(f"m.{k}")
            v = self.state.get(f"v.{k}")
            if m is not None and v is not None and m.dtype == v.dtype == g.dtype == _F32:
                # the same float32 operations in the same order, into fresh state arrays (a state_dict
                # handed out earlier keeps its arrays) with one temporary each instead of two or three
                m, v = _adam_moments_f32(g, m, v, b1, b2)
            else:
                m = (_F32(1) - b1) * g if m is None else b1 * m + (_F32(1) - b1) * g
                v = (_F32(1) - b2) * g * g if v is None else b2 * v + (_F32(1) - b2) * g * g
            m, v = self.cast_state(m), self.cast_state(v)
            self.state[f"m.{k}"], self.state[f"v.{k}"] = m, v
            if self.amsgrad:
                vmax = self.state.get(f"vmax.{k}")
                v = v if vmax is None else np.maximum(vmax, v)
                self.state[f"vmax.{k}"] = v
            if m.dtype == v.dtype == _F32:
                u = _adam_step_f32(m, v, bc1, bc2, eps, lr32)
            else:
                u = lr32 * ((m / bc1) / (np.sqrt(v / bc2) + eps))
            if self.weight_decay:
                u = u + lr32 * _F32(self.weight_decay) * weights[k]
            out[k] = u.astype(_F32, copy=False)
        return out

    def _flat_updates(self, weights: Mapping[str, np.ndarray], grads: Mapping[str, np.ndarray], lr32: np.float32,
                      b1: np.float32, b2: np.float32, bc1: np.float32, bc2: np.float32,
                      eps: np.float32) -> dict[str, np.ndarray] | None:
        """The update of :meth:`updates` (float32 moments kept as they are computed) on all tensors at once,
        as torch's foreach kernels: every operation is elementwise, so each element gets the bits of the
        per-tensor loop; the moments are views of one new array per step (a state_dict handed out keeps its
        values). None where that does not hold (other dtypes, some moments missing): the loop then runs."""
        keys = list(grads)
        gs = [grads[k] for k in keys]
        if not keys or any(not isinstance(g, np.ndarray) or g.dtype != _F32 for g in gs):
            return None
        ms = [self.state.get(f"m.{k}") for k in keys]
        vs = [self.state.get(f"v.{k}") for k in keys]
        fresh = all(m is None for m in ms) and all(v is None for v in vs)
        if not fresh and not all(isinstance(a, np.ndarray) and a.dtype == _F32 and a.shape == g.shape
                                 for pair in (ms, vs) for a, g in zip(pair, gs)):
            return None
        wd = self.weight_decay
        if wd and any(not isinstance(weights[k], np.ndarray) or weights[k].dtype != _F32 or
                      weights[k].shape != g.shape for k, g in zip(keys, gs)):
            return None
        g = np.concatenate([x.reshape(-1) for x in gs])
        if fresh:
            m = (_F32(1) - b1) * g
            v = (_F32(1) - b2) * g * g
        else:
            last = getattr(self, "_flat", None)
            # the moments are still last step's views: their two arrays as they are, no gathering copy
            if last is not None and last[0] == keys and all(a is b for a, b in zip(ms, last[3])) \
                    and all(a is b for a, b in zip(vs, last[4])):
                m0, v0 = last[1], last[2]
            else:
                m0 = np.concatenate([x.reshape(-1) for x in ms])  # type: ignore[union-attr]
                v0 = np.concatenate([x.reshape(-1) for x in vs])  # type: ignore[union-attr]
            m, v = _adam_moments_f32(g, m0, v0, b1, b2)
        u = _adam_step_f32(m, v, bc1, bc2, eps, lr32)
        if wd:
            u = u + lr32 * _F32(wd) * np.concatenate([weights[k].reshape(-1) for k in keys])
        out: dict[str, np.ndarray] = {}
        mv: list[np.ndarray] = []
        vv: list[np.ndarray] = []
        i = 0
        for k, x in zip(keys, gs):
            j = i + x.size
            out[k] = u[i:j].reshape(x.shape)
            mv.append(m[i:j].reshape(x.shape))
            vv.append(v[i:j].reshape(x.shape))
            self.state[f"m.{k}"], self.state[f"v.{k}"] = mv[-1], vv[-1]
            i = j
        self._flat = (keys, m, v, mv, vv)
        return out

    def state_dict(self) -> dict[str, np.ndarray]:
        d = dict(self.state)
        d["t"] = np.asarray(self.t)
        return d

    def load_state_dict(self, d: Mapping[str, np.ndarray]) -> None:
        t = _state_step(d, "AdamW")
        self.state = {k: _state_array(v, "AdamW", k) for k, v in d.items() if k != "t"}
        self.t = t


def _state_step(d: object, who: str) -> int:
    """The step count of a state dict (a KeyError or a silent truncation of 2.5 before)."""
    if not isinstance(d, Mapping):
        raise TypeError(f"{who}.load_state_dict needs a mapping (from state_dict()), got {type(d).__name__}")
    if "t" not in d:
        raise ValueError(f"{who}.load_state_dict: the state has no step count 't' (keys: {sorted(d)[:8]})")
    t = np.asarray(d["t"])
    if t.size != 1 or t.dtype.kind not in "iuf" or not float(t.reshape(())) >= 0 or \
            float(t.reshape(())) != int(t.reshape(())):
        raise ValueError(f"{who}.load_state_dict: 't' must be a whole number >= 0, got {d['t']!r}")
    return int(t.reshape(()))


def _state_array(v: object, who: str, key: str) -> np.ndarray:
    a = np.asarray(v)
    if isinstance(v, np.ma.MaskedArray) or a.dtype.kind not in "iuf":
        raise TypeError(f"{who}.load_state_dict: {key!r} must be a real array, got {type(v).__name__}"
                        f"{' of dtype ' + str(a.dtype) if isinstance(v, np.ndarray) else ''}")
    return np.array(a, _F32)


def _bool(who: str, name: str, v: object) -> None:
    if not isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{who} {name} must be a bool, got {type(v).__name__}: {v!r}")


def _no_fused_updates(opt: SGD | AdamW) -> None:
    if opt.fused:
        raise TypeError(f"{type(opt).__name__}(fused=True) writes the weights itself: call step(params, grads, "
                        "...) instead of updates()")


def _skipped(found_inf: np.ndarray | None) -> bool:
    return found_inf is not None and float(np.asarray(found_inf).reshape(())) == 1.0


def _step_keys(params: Mapping[str, np.ndarray], grads: Mapping[str, np.ndarray], who: str,
               lr: object = None) -> list[str]:
    if not isinstance(params, Mapping) or not isinstance(grads, Mapping):
        raise TypeError(f"{who}.step needs params and grads as mappings of name -> float32 array")
    keys = [k for k in params if k in grads]
    extra = sorted(set(grads) - set(params))
    if extra:
        raise ValueError(f"{who}.step: gradients for unknown parameters {extra}")
    if lr is not None:  # a per-step override (a schedule): the constructor's rule, lr >= 0 and finite
        _numbers(f"{who}.step", lr=lr)
        if not float(lr) >= 0:  # type: ignore[arg-type]
            raise ValueError(f"{who}.step lr must be >= 0, got {lr!r}")
    for k in keys:
        g = grads[k]
        if not isinstance(g, np.ndarray) or g.dtype.kind != "f":
            raise TypeError(f"{who}.step: grads[{k!r}] must be a float NumPy array, got "
                            f"{type(g).__name__}{f' of dtype {g.dtype}' if isinstance(g, np.ndarray) else ''}")
        shape = getattr(params[k], "shape", None)
        if g.shape != shape:
            raise ValueError(f"{who}.step: grads[{k!r}] has shape {g.shape}, params[{k!r}] has {shape}")
    return keys


def _unfused_step(opt: SGD | AdamW, params: Mapping[str, np.ndarray], grads: Mapping[str, np.ndarray],
                  keys: list[str], lr: float | None, grad_scale: Any, found_inf: Any,
                  copy_format: Any) -> dict[str, np.ndarray] | None:
    if grad_scale is not None or found_inf is not None:
        raise ValueError(f"{type(opt).__name__}.step: grad_scale and found_inf need fused=True (as torch, whose "
                         "GradScaler unscales the gradients itself for an unfused optimizer)")
    for k in keys:
        if not isinstance(params[k], np.ndarray) or params[k].dtype != _F32 or not params[k].flags.writeable:
            raise TypeError(f"{type(opt).__name__}.step: params[{k!r}] must be a writeable float32 array")
    ups = opt.updates(params, {k: grads[k] for k in keys}, lr=lr)
    for k, u in ups.items():
        params[k][...] = params[k] - u
    return _low_copy(params, copy_format)


def _low_copy(params: Mapping[str, np.ndarray], fmt: Any) -> dict[str, np.ndarray] | None:
    if fmt is None:
        return None
    from ..rounding import round as fround

    return {k: np.asarray(fround(v, fmt)) for k, v in params.items()}


@ieee_mode
def make_optimizer(name: str, policy: Policy, runtime: Any, **kwargs: Any) -> SGD | AdamW:
    """``"adamw"`` or ``"sgd"`` (by the one name rule) with its state kept in ``policy.optimizer_state``."""
    kind = parse_name(name, ("adamw", "sgd"), "optimizer")
    if not isinstance(policy, Policy):
        raise TypeError(f"policy must be a Policy, got {type(policy).__name__}")
    fmt = policy.optimizer_state

    def cast_state(x: np.ndarray) -> np.ndarray:
        return np.asarray(runtime.cast(x, fmt))

    if fmt.name == "fp32" and fmt == as_format("fp32"):  # the cast of a float32 moment is the identity
        cast_state = _identity
    if kind == "adamw":
        return AdamW(cast_state=cast_state, **kwargs)
    return SGD(cast_state=cast_state, **kwargs)


@ieee_mode
class MasterWeights:
    """The weights the optimizer updates, stored in ``policy.weights`` (FP32 master, or the params format).

    The model computes with :attr:`weights` directly; the GEMMs round their weight operand to
    ``policy.params`` (so with a master copy the low-precision copy is refreshed at every use, as
    autocast does).
    """

    def __init__(self, params: Mapping[str, np.ndarray], policy: Policy, runtime: Any) -> None:
        self.policy = policy
        self.runtime = runtime
        self.fmt = policy.weights
        #: Carrier dtype of the stored weights: float32, or float64 for a format wider than float32 (an FP64
        #: master keeps float64 weights and applies updates in float64, never rounding through float32).
        self.dtype = np.dtype(_F32 if self.fmt.fits_float32 else np.float64)
        self.weights: dict[str, np.ndarray] = {k: self._store(v) for k, v in params.items()}

    def _store(self, x: Any) -> np.ndarray:
        """``x`` rounded once to the storage format, in the storage dtype."""
        if self.dtype == _F32:  # (a float64 input, e.g. init= weights, is rounded once by the cast too)
            return np.asarray(self.runtime.cast(np.asarray(x), self.fmt))
        from ..rounding import round as fround

        return np.asarray(fround(np.asarray(x, np.float64), self.fmt, self.policy.rounding, rng=self.runtime.rng),
                          np.float64)

    def apply(self, updates: Mapping[str, np.ndarray]) -> dict[str, float]:
        """``w <- round(w - update)`` in the storage format; returns per tensor the fraction of nonzero
        updates that left the weight unchanged (NaN where no update was nonzero). The totals over all
        tensors are left in ``last_lost`` and ``last_nonzero``."""
        if self.policy.update is not None:  # pure-BF16 update rules (RNE / SR / Kahan), fpsim.amp.bf16
            from .bf16 import apply_update

            return apply_update(self, updates)
        lost: dict[str, float] = {}
        self.last_lost = self.last_nonzero = 0
        for k, u in updates.items():
            w = self.weights[k]
            new = self._store(w - u)
            want = u != 0
            n = int(np.count_nonzero(want))
            nl = int(np.count_nonzero(want & (new == w)))
            lost[k] = nl / n if n else float("nan")
            self.last_lost += nl
            self.last_nonzero += n
            self.weights[k] = new
        return lost
