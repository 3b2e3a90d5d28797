"""Fused optimizer steps, bit for bit as torch's CPU kernels ``torch._fused_adamw_`` and ``torch._fused_sgd_``.

A fused step does in one pass what an AMP loop otherwise does in four: unscale the gradient (divide by
``grad_scale``), skip everything when ``found_inf`` says the scaled gradients overflowed, update the
optimizer state and the FP32 master weights. (The low-precision copy is then rounded once from the new
master: :meth:`fpsim.amp.AdamW.step` with ``copy_format=``.) The functions here replay the float32
arithmetic of torch 2.13's CPU kernels (``aten/src/ATen/native/cpu/FusedAdamKernel.cpp`` and
``FusedSGDKernel.cpp``), including where the compiled kernel rounds once and where twice:

- **The vector body.** Each tensor is processed, in memory order, in ``at::vec::Vectorized<float>``
  registers. The kernel asks for a fused multiply-add in a few places (``vec::fmadd``: the ``lerp`` of the
  first moment, SGD's weight decay, momentum and Nesterov terms), and the compiler contracts some of the
  remaining ``a * b + c`` into FMAs too (AdamW's second moment ``v*beta2 + (1-beta2)*g*g`` becomes
  ``fma((1-beta2)*g, g, v*beta2)``; SGD's ``p += g*(-lr)`` becomes ``fma(g, -lr, p)``).
- **The scalar tail.** The last ``n % 8`` elements of a tensor (``n`` its size) go through the scalar
  loop the kernel writes for the remainder, which the compiler contracts differently: there the second
  moment is ``fma(v, beta2, ((1-beta2)*g)*g)`` and SGD's momentum ``fma(buf, momentum, g*(1-dampening))``.
  The AVX-512 kernel's 16-wide body leaves up to 15 elements; the compiler vectorises 8 of them with the
  body's contraction, so with AVX2 (8 wide) and AVX-512 alike the scalar loop sees exactly ``n % 8``.
  Established by measurement against torch (``tests/test_fused_optim.py``), not read from a compiler.
- **Constants.** Computed in double as the kernel does (``1 - beta1**step``, ``lr / bias_correction1``,
  ``sqrt(1 - beta2**step)``, ``1 - lr*weight_decay``) and rounded once to float32 where the kernel
  converts them to ``scalar_t``.

**Speed.** Each FMA runs through ``fma_f32`` of the compiled extension ``fpsim._ckernel`` (C ``fmaf``, correctly
rounded: the hardware instruction where the CPU has one, glibc's otherwise; a NaN result is given the NaN
the emulation gives) when it is built, and otherwise through a NumPy emulation (product and sum in float64,
float32-tie detection, round-to-odd repair; ``use_c_fma = False`` forces it), the reference: the two
agree in every bit (``tests/test_fused_c_fma.py``). Tensors are processed in chunks of 65,536 elements so
the temporaries stay small.

These are the one documented exception to "inputs are never modified": like torch's kernels they update
``params``, the optimizer states and (with ``grad_scale``) ``grads`` in place. Every array must be a
writeable C-contiguous float32 NumPy array.

>>> import numpy as np
>>> from fpsim.amp import fused_adamw_step
>>> p, g = np.float32([1.0, -2.0]), np.float32([0.5, 0.25])
>>> m, v, step = np.zeros(2, np.float32), np.zeros(2, np.float32), np.float32([1.0])
>>> fused_adamw_step([p], [g], [m], [v], [], [step], lr=0.1, beta1=0.9, beta2=0.999, weight_decay=0.0,
...                  eps=1e-8, amsgrad=False, maximize=False)
>>> p.tolist()                          # the first Adam step moves each weight by about lr
[0.9000000357627869, -2.0999999046325684]
"""

from __future__ import annotations

import bisect
import math
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._fpenv import ieee_mode

__all__ = ["SCALAR_TAIL", "fused_adamw_step", "fused_sgd_step"]

_F32 = np.float32
_F64 = np.float64
#: The scalar loop of torch's fused CPU kernels handles the last ``n % SCALAR_TAIL`` elements of a tensor.
SCALAR_TAIL = 8


_CH = 1 << 15  # elements per chunk: the float64 temporaries of _fma32_numpy stay in cache

try:  # the compiled float32 FMA (fpsim/_ckernel.c; absent without a compiler, or in an older build)
    from .. import _ckernel  # type: ignore[attr-defined]

    _c_fma: Any = getattr(_ckernel, "fma_f32", None)
except ImportError:  # pragma: no cover - exercised where no compiler was available
    _c_fma = None

use_c_fma = _c_fma is not None
"""Whether the fused steps use the compiled ``fmaf`` (set False to force the NumPy emulation, the reference;
results are bit-identical either way, ``tests/test_fused_c_fma.py``)."""


def _fma32(a: Any, b: Any, c: Any, out: np.ndarray | None = None) -> np.ndarray:
    """``a*b + c`` for float32 operands (broadcast), rounded once to float32, into ``out`` (a C-contiguous
    float32 array of the broadcast shape; it may be one of the operands) or a new array.

    The compiled ``fmaf`` when present (:data:`use_c_fma`), else :func:`_fma32_numpy`."""
    a, b, c = np.asarray(a, _F32), np.asarray(b, _F32), np.asarray(c, _F32)
    shape = np.broadcast_shapes(a.shape, b.shape, c.shape)
    if out is None:
        out = np.empty(shape, _F32)
    elif out.shape != shape or out.dtype != _F32 or not out.flags.c_contiguous:
        raise ValueError(f"_fma32: out must be a C-contiguous float32 array of shape {shape}")
    if use_c_fma and _c_fma is not None:
        flat = [x.reshape(1) if x.size == 1 else np.ascontiguousarray(np.broadcast_to(x, shape)).reshape(-1)
                for x in (a, b, c)]
        _c_fma(flat[0], flat[1], flat[2], out.reshape(-1))
    else:
        out[...] = _fma32_numpy(a, b, c)
    return out


_STEP_CH = 1 << 16  # elements per chunk of a fused step: its float32 temporaries stay small (measured best)


def _chunks(n: int) -> list[tuple[int, int]]:
    return [(lo, min(lo + _STEP_CH, n)) for lo in range(0, n, _STEP_CH)] or [(0, 0)]


def _fma32_numpy(a: Any, b: Any, c: Any) -> np.ndarray:
    """The NumPy emulation of the float32 FMA (the reference), in cache-sized chunks."""
    a, b, c = np.broadcast_arrays(np.asarray(a, _F32), np.asarray(b, _F32), np.asarray(c, _F32))
    fa, fb, fc = a.reshape(-1), b.reshape(-1), c.reshape(-1)   # (1-D: a 0-d result too)
    if a.size <= _CH:
        return np.asarray(_fma32_block(fa, fb, fc).reshape(a.shape))
    out = np.empty(fa.size, _F32)
    for i in range(0, fa.size, _CH):
        out[i:i + _CH] = _fma32_block(fa[i:i + _CH], fb[i:i + _CH], fc[i:i + _CH])
    return np.asarray(out.reshape(a.shape))


def _fma32_block(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """``a*b + c`` for float32 operands, rounded once to float32 (what a hardware FMA returns).

    The product is exact in float64, and so is the rounding of ``p + c`` to float32 through float64
    unless the float64 sum lands exactly on a float32 rounding boundary (a tie, or a float32-subnormal
    result): only there the sum's own rounding error (TwoSum) decides, by rounding to odd in float64
    (a round-to-odd result with 53 >= 24 + 2 bits rounds correctly to float32).
    """
    with np.errstate(invalid="ignore", over="ignore"):
        p = a.astype(_F64) * b.astype(_F64)
        c64 = c.astype(_F64)
        s = p + c64
        out = s.astype(_F32)
        low = s.view(np.int64) & 0x1FFFFFFF                  # the 29 bits float32 drops
        risky = (low == 0x10000000) | (np.abs(s) < 2.0 ** -125)
        if np.any(risky):
            pr = p[risky]
            cr = c64[risky]
            sr = s[risky]
            bb = sr - pr
            err = (pr - (sr - bb)) + (cr - bb)
            inexact = (err != 0) & np.isfinite(err)
            bits = sr.view(np.int64).copy()
            bits[inexact & ((err > 0) != (sr > 0))] -= 1     # RN went away from zero: one ulp back
            bits[inexact] |= 1                                # and the sticky bit
            out[risky] = np.where(inexact, bits.view(_F64), sr).astype(_F32)
        return np.asarray(out)


def _arrays(what: str, xs: object, n: int | None, unused: str | None = None) -> list[np.ndarray]:
    """``xs`` checked as a list of ``n`` writeable C-contiguous float32 arrays; ``unused`` names the option
    under which the list must be empty (then ``n`` is 0)."""
    if isinstance(xs, np.ndarray) or not isinstance(xs, (list, tuple)):
        raise TypeError(f"{what} must be a list of float32 arrays, got {type(xs).__name__}")
    out = list(xs)
    if n is not None and len(out) != n:
        if unused is not None and n == 0:
            raise ValueError(f"{what} must be empty with {unused}, got {len(out)} arrays")
        raise ValueError(f"{what} has {len(out)} arrays, params has {n} (one per parameter)")
    for i, a in enumerate(out):
        if not isinstance(a, np.ndarray):
            raise TypeError(f"{what}[{i}] must be a float32 NumPy array, got {type(a).__name__}")
        if a.dtype != _F32:
            raise TypeError(f"{what}[{i}] must be float32 (the fused kernels update float32 in place), got {a.dtype}")
        if not a.flags.c_contiguous or not a.flags.writeable:
            raise ValueError(f"{what}[{i}] must be a writeable C-contiguous array (it is updated in place)")
    return out


def _disjoint(written: list[tuple[str, list[np.ndarray]]], steps: list[np.ndarray]) -> None:
    """ValueError naming the two entries when arrays the step writes share memory (the same array given
    twice, a gradient that is its parameter, overlapping views): each would see the other's update. All
    are C-contiguous, so an array's memory is exactly [start, start + nbytes); the step counts are only
    read and may be shared among themselves, not with a written array. O(n log n) in the arrays."""
    spans = sorted((a.__array_interface__["data"][0], a.nbytes, f"{what}[{i}]")
                   for what, xs in written for i, a in enumerate(xs) if a.nbytes)
    end, last = -1, ""
    for lo, nb, name in spans:
        if lo < end:
            raise ValueError(f"{last} and {name} share memory; every parameter, gradient and state array of a "
                             f"fused step must be its own array (it is updated in place)")
        if lo + nb > end:
            end, last = lo + nb, name
    starts = [lo for lo, _, _ in spans]
    for i, a in enumerate(steps):
        lo = a.__array_interface__["data"][0]
        k = bisect.bisect_right(starts, lo + a.nbytes - 1) - 1   # the last written span starting inside or before
        if a.nbytes and k >= 0 and spans[k][0] + spans[k][1] > lo:
            raise ValueError(f"state_steps[{i}] shares memory with {spans[k][2]}, which the step updates")


def _same_shapes(params: list[np.ndarray], what: str, xs: list[np.ndarray]) -> None:
    for i, (p, x) in enumerate(zip(params, xs)):
        if x.shape != p.shape:
            raise ValueError(f"{what}[{i}] has shape {x.shape}, params[{i}] has {p.shape}")


def _real(what: str, v: object, lo: float | None = None, hi: float | None = None, hi_open: bool = False) -> float:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (numbers.Real, np.floating, np.integer)):
        raise TypeError(f"{what} must be a real number, got {type(v).__name__}: {v!r}")
    f = float(v)
    if not math.isfinite(f) or (lo is not None and f < lo) or (hi is not None and (f >= hi if hi_open else f > hi)):
        rng = f" [{lo}, {hi}{')' if hi_open else ']'}" if hi is not None else f" >= {lo}" if lo is not None else ""
        raise ValueError(f"{what} must be a finite number{rng}, got {v!r}")
    return f


def _flag(what: str, v: object) -> bool:
    if not isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{what} must be a bool, got {type(v).__name__}: {v!r}")
    return bool(v)


def _scalar32(what: str, x: object) -> np.ndarray | None:
    if x is None:
        return None
    if not isinstance(x, np.ndarray) or x.dtype != _F32 or x.size != 1:
        raise TypeError(f"{what} must be None or a one-element float32 array (as torch's tensor), got "
                        f"{type(x).__name__}{'' if not isinstance(x, np.ndarray) else f' {x.dtype} {x.shape}'}")
    return x


def _unscale_and_skip(grads: list[np.ndarray], grad_scale: object, found_inf: object) -> bool:
    """torch: ``if (found_inf_ptr && *found_inf_ptr == 1.0) return;`` then each gradient is divided by
    ``grad_scale`` (a division, not a multiply by the reciprocal) and stored back."""
    gs, fi = _scalar32("grad_scale", grad_scale), _scalar32("found_inf", found_inf)
    if fi is not None and float(fi.reshape(())) == 1.0:
        return True
    if gs is not None:
        s = _F32(gs.reshape(()))
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            for g in grads:
                np.divide(g, s, out=g)
    return False


@ieee_mode
def fused_adamw_step(params: Sequence[np.ndarray], grads: Sequence[np.ndarray], exp_avgs: Sequence[np.ndarray],
                     exp_avg_sqs: Sequence[np.ndarray], max_exp_avg_sqs: Sequence[np.ndarray],
                     state_steps: Sequence[np.ndarray], *, lr: float, beta1: float, beta2: float,
                     weight_decay: float, eps: float, amsgrad: bool, maximize: bool,
                     grad_scale: np.ndarray | None = None, found_inf: np.ndarray | None = None,
                     decoupled: bool = True) -> None:
    """One AdamW step over lists of float32 arrays, in place, bit for bit as ``torch._fused_adamw_`` (CPU).

    Mirrors torch's kernel: it reads the step count from ``state_steps`` (one-element float32 arrays the
    caller has already incremented, as ``torch.optim.AdamW`` does) and does not change it. When
    ``found_inf`` holds 1.0 nothing is touched (torch tests ``== 1.0``, the value its GradScaler writes);
    otherwise each gradient is divided by ``grad_scale`` and **written back** (as torch's kernel does),
    then per element::

        p = p * f32(1 - lr*wd)                              # decoupled weight decay (AdamW)
        m = fma(w - 1, g - m, g)  or  fma(w, g - m, m)      # m.lerp_(g, w = 1 - beta1), |w| >= or < 0.5
        v = fma((1-b2)*g, g, v*b2)   [scalar tail: fma(v, b2, ((1-b2)*g)*g)]
        v_max = max(v_max, v)                               # amsgrad
        d = sqrt(v or v_max) / f32(sqrt(1 - b2**step)) + eps
        p = p + (f32(-lr / (1 - b1**step)) * m) / d

    Parameters
    ----------
    params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps : lists of float32 arrays
        Updated in place (``max_exp_avg_sqs`` empty unless ``amsgrad``; ``grads`` only with
        ``grad_scale``). Shapes must agree; arrays must be writeable, C-contiguous and not share memory
        with one another (``ValueError`` naming the two); ``state_steps`` hold counts >= 1.
    lr, beta1, beta2, weight_decay, eps : float
        Python floats (torch's ``double`` arguments).
    amsgrad, maximize : bool
    grad_scale, found_inf : one-element float32 arrays or None
        As torch's ``grad_scale`` / ``found_inf`` tensors.
    decoupled : bool
        True: AdamW (``_fused_adamw_``); False: Adam with L2 weight decay added to the gradient
        (``_fused_adam_``).

    Examples
    --------
    A skipped step (``found_inf`` = 1) changes nothing; otherwise the gradient is unscaled in place:

    >>> import numpy as np
    >>> p, g = np.float32([1.0]), np.float32([1024.0])
    >>> st = [np.zeros(1, np.float32), np.zeros(1, np.float32), np.float32([1.0])]
    >>> kw = dict(lr=0.1, beta1=0.9, beta2=0.999, weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False)
    >>> fused_adamw_step([p], [g], [st[0]], [st[1]], [], [st[2]], grad_scale=np.float32([1024.0]),
    ...                  found_inf=np.float32([1.0]), **kw)
    >>> float(p[0]), float(g[0])
    (1.0, 1024.0)
    >>> fused_adamw_step([p], [g], [st[0]], [st[1]], [], [st[2]], grad_scale=np.float32([1024.0]),
    ...                  found_inf=np.float32([0.0]), **kw)
    >>> float(p[0]), float(g[0])
    (0.9000000357627869, 1.0)
    """
    ps = _arrays("params", params, None)
    n = len(ps)
    gs = _arrays("grads", grads, n)
    ms = _arrays("exp_avgs", exp_avgs, n)
    vs = _arrays("exp_avg_sqs", exp_avg_sqs, n)
    ams = _flag("amsgrad", amsgrad)
    mx = _arrays("max_exp_avg_sqs", max_exp_avg_sqs, n if ams else 0, "amsgrad=False")
    steps = _arrays("state_steps", state_steps, n)
    for what, xs in (("grads", gs), ("exp_avgs", ms), ("exp_avg_sqs", vs), ("max_exp_avg_sqs", mx)):
        _same_shapes(ps, what, xs)
    for i, s in enumerate(steps):
        if s.size != 1:
            raise ValueError(f"state_steps[{i}] must hold one number (the step count), got shape {s.shape}")
        if not float(s.reshape(())) >= 1.0 or not math.isfinite(float(s.reshape(()))):
            # torch.optim.AdamW counts from 1 (incremented before the step); 0 divides by zero, < 0 is sqrt(< 0)
            raise ValueError(f"state_steps[{i}] must hold the step count, a finite number >= 1 (incremented "
                             f"before the step, as torch.optim.AdamW does), got {float(s.reshape(()))!r}")
    lr_ = _real("lr", lr, 0.0)
    b1, b2 = _real("beta1", beta1, 0.0, 1.0, True), _real("beta2", beta2, 0.0, 1.0, True)
    wd, eps_ = _real("weight_decay", weight_decay, 0.0), _real("eps", eps, 0.0)
    maxi, dec = _flag("maximize", maximize), _flag("decoupled", decoupled)
    _scalar32("grad_scale", grad_scale), _scalar32("found_inf", found_inf)
    _disjoint([("params", ps), ("grads", gs), ("exp_avgs", ms), ("exp_avg_sqs", vs), ("max_exp_avg_sqs", mx)],
              steps)
    if _unscale_and_skip(gs, grad_scale, found_inf):
        return
    one = _F32(1.0)
    w = _F32(1.0 - b1)                         # exp_avg_grad_coefficient
    small = abs(w) < _F32(0.5)
    c2, b2f, epsf = _F32(1.0 - b2), _F32(b2), _F32(eps_)
    decay = _F32(1.0 - lr_ * wd)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        for i, p in enumerate(ps):
            step = float(steps[i].reshape(()))
            bc1 = 1.0 - b1 ** step
            bc2s = _F32(math.sqrt(1.0 - b2 ** step))
            neg_step = _F32(-(lr_ / bc1)) if bc1 != 0 else _F32(-math.inf)
            n_i = p.size
            kk = n_i - n_i % SCALAR_TAIL                # [0, kk): vector body; [kk, n): the scalar loop
            for lo, hi in _chunks(n_i):                 # elementwise: chunks only keep temporaries small
                P, G, M, V = (a.reshape(-1)[lo:hi] for a in (p, gs[i], ms[i], vs[i]))
                g = -G if maxi else G.copy()
                if wd != 0.0:
                    if dec:
                        P *= decay
                    else:  # Adam (L2): g += p*wd, contracted to one FMA in the body and the tail alike
                        g = _fma32(P, _F32(wd), g, out=g)
                if small:
                    _fma32(w, g - M, M, out=M)
                else:
                    _fma32(w - one, g - M, g, out=M)
                k = min(max(kk - lo, 0), hi - lo)
                cg = c2 * g
                _fma32(cg[:k], g[:k], V[:k] * b2f, out=V[:k])
                _fma32(V[k:], b2f, cg[k:] * g[k:], out=V[k:])
                if ams:
                    X = mx[i].reshape(-1)[lo:hi]
                    np.maximum(X, V, out=X)
                    d = np.sqrt(X) / bc2s + epsf
                else:
                    d = np.sqrt(V) / bc2s + epsf
                P += (neg_step * M) / d


@ieee_mode
def fused_sgd_step(params: Sequence[np.ndarray], grads: Sequence[np.ndarray],
                   momentum_buffer_list: Sequence[np.ndarray], *, weight_decay: float, momentum: float, lr: float,
                   dampening: float, nesterov: bool, maximize: bool, is_first_step: bool,
                   grad_scale: np.ndarray | None = None, found_inf: np.ndarray | None = None) -> None:
    """One SGD step over lists of float32 arrays, in place, bit for bit as ``torch._fused_sgd_`` (CPU).

    ``momentum_buffer_list`` is empty when ``momentum == 0``; on ``is_first_step`` the buffers are
    overwritten with the (decayed) gradient, as torch does with its freshly allocated buffers. ``found_inf``
    and ``grad_scale`` as in :func:`fused_adamw_step` (gradients unscaled in place). Per element::

        g = fma(p, wd, g)                                    # weight decay (L2, as torch's SGD)
        buf = fma(1 - dampening, g, buf*momentum)            [scalar tail: fma(buf, momentum, g*(1-dampening))]
        g = fma(buf, momentum, g)  (nesterov)  or  g = buf
        p = fma(g, -lr, p)

    Examples
    --------
    >>> import numpy as np
    >>> p, g, buf = np.float32([1.0]), np.float32([0.5]), np.zeros(1, np.float32)
    >>> kw = dict(weight_decay=0.0, momentum=0.9, lr=0.1, dampening=0.0, nesterov=False, maximize=False)
    >>> fused_sgd_step([p], [g], [buf], is_first_step=True, **kw)
    >>> fused_sgd_step([p], [g], [buf], is_first_step=False, **kw)
    >>> float(buf[0]), float(p[0])
    (0.949999988079071, 0.8549999594688416)
    """
    ps = _arrays("params", params, None)
    n = len(ps)
    gs = _arrays("grads", grads, n)
    mom = _real("momentum", momentum, 0.0)
    bufs = _arrays("momentum_buffer_list", momentum_buffer_list, n if mom != 0.0 else 0, "momentum=0")
    _same_shapes(ps, "grads", gs)
    _same_shapes(ps, "momentum_buffer_list", bufs)
    wd, lr_ = _real("weight_decay", weight_decay, 0.0), _real("lr", lr, 0.0)
    damp = _real("dampening", dampening)
    nest, maxi, first = _flag("nesterov", nesterov), _flag("maximize", maximize), _flag("is_first_step", is_first_step)
    _scalar32("grad_scale", grad_scale), _scalar32("found_inf", found_inf)
    _disjoint([("params", ps), ("grads", gs), ("momentum_buffer_list", bufs)], [])
    if _unscale_and_skip(gs, grad_scale, found_inf):
        return
    wdf, momf, keep, neg_lr = _F32(wd), _F32(mom), _F32(1.0 - damp), _F32(-lr_)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        for i, p in enumerate(ps):
            kk = p.size - p.size % SCALAR_TAIL
            for lo, hi in _chunks(p.size):
                P, G = p.reshape(-1)[lo:hi], gs[i].reshape(-1)[lo:hi]
                g = -G if maxi else G.copy()
                if wd != 0.0:
                    g = _fma32(P, wdf, g, out=g)
                if mom != 0.0:
                    B = bufs[i].reshape(-1)[lo:hi]
                    if first:
                        B[:] = g
                    else:
                        k = min(max(kk - lo, 0), hi - lo)
                        _fma32(keep, g[:k], B[:k] * momf, out=B[:k])
                        _fma32(B[k:], momf, g[k:] * keep, out=B[k:])
                    g = _fma32(B, momf, g, out=g) if nest else B.copy()
                _fma32(g, neg_lr, P, out=P)


def _trainer_check(policy: Any) -> None:
    """``TrainConfig(fused=True)``: the fused kernels update FP32 master weights and FP32 state in place."""
    bad = [f"{what} {fmt.name}" for what, fmt in (("weights", policy.weights), ("optimizer_state",
                                                                                policy.optimizer_state))
           if fmt.name != "fp32"]
    if bad or policy.update is not None:
        why = ", ".join(bad + ([f"update rule {policy.update!r}"] if policy.update is not None else []))
        raise ValueError(f"TrainConfig.fused=True needs a policy with FP32 master weights and FP32 optimizer "
                         f"state (the fused kernels update float32 in place); policy {policy.name!r} has {why}")


def _trainer_grads(grads: Any, micro_batches: int, policy: Any,
                   scale: float) -> tuple[dict[str, np.ndarray], bool, np.ndarray | None]:
    """The Trainer's gradients for a fused step, as torch's GradScaler hands them to a fused optimizer:
    still scaled (times ``micro_batches``: the all-reduced sum), ``found_inf`` tested on them, and
    ``grad_scale`` the loss scale (None when the policy does not scale the loss)."""
    out = {k: np.array(g, _F32, order="C") for k, g in grads.items()}   # own arrays: the kernel writes them
    if micro_batches > 1:
        mb = _F32(micro_batches)
        with np.errstate(over="ignore", invalid="ignore"):
            for g in out.values():
                np.multiply(g, mb, out=g)
    found = not all(bool(np.isfinite(g).all()) for g in out.values())
    gscale = None if policy.loss_scale is None else np.full(1, scale, _F32)
    return out, found, gscale
