"""The stateful side of a policy: the object the model calls for every cast (implements
:class:`fpsim.nn.Precision`), with per-tensor FP8 scales, QAT observers and gradient telemetry.

Casts are :func:`fpsim.round` calls on float32 carriers; a cast to FP32 of a float32 array is skipped
(it is the identity). Gradient casts can record, per tensor ("site"), how many values were nonzero, how
many underflowed to zero, became subnormal or overflowed, and the amax — see :attr:`PolicyRuntime.stats`.

GEMMs: every GEMM the model asks for — forward (:meth:`PolicyRuntime.matmul`, FlashAttention's tiles through
:meth:`PolicyRuntime.matmul_accumulate`) and both backward GEMMs (``dX = dY Wᵀ``, ``dW = Xᵀ dY``, in
:meth:`PolicyRuntime.matmul_backward`), attention's batched products included — runs through one method,
``_gemm``: float32 BLAS for ``Policy.gemm="fast"``, float64 for ``"fast64"``, and for a device name the
device's block-FMA model (the bits of :func:`fpsim.mma.matmul`, through its low-overhead private entry
``fpsim.mma.gemm._matmul_values``; the policy's one operand format in, fp32 out, C inside the chain). The operands arrive already rounded by the policy's casts, each once; the GEMM's result is then cast
like any other. :attr:`PolicyRuntime.mma_calls` counts the GEMMs run under the device model.

Block-scaled GEMMs (``Policy.block``, a :class:`fpsim.amp.policy.BlockRecipe`: the MXFP8 and NVFP4 recipes) quantise
both operands of each of the three GEMMs along its reduction axis (``_block_matmul``, ``_block_backward``), multiply
with the block scales applied inside the product and NVFP4's tensor scales after it, and record per operand
("<site>.x", ".w", ".dy", ".w_t", ".x_wgrad", ".dy_wgrad") how many values underflowed to zero and how many
saturated (:attr:`PolicyRuntime.qstats`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from .. import rounding as _rounding
from .._blas import matmul as _blas_matmul
from .._fpenv import ieee_mode
from ..formats import Format, as_format
from ..quant import fake_quantize_with_mask
from ..rounding import round as fround
from .anomaly import _ACTIVE, _watch
from .policy import Policy

__all__ = ["HIST_HI", "HIST_LO", "PolicyRuntime", "log2_histogram", "random_hadamard"]

_F32 = np.float32
_FP32 = as_format("fp32")
_EPS32 = _F32(np.finfo(np.float32).eps)

#: log2-magnitude histograms use integer bins [HIST_LO, HIST_HI); bin i counts |x| in [2^(LO+i), 2^(LO+i+1)),
#: values below 2^LO go to the first bin, above to the last; zeros are counted separately.
HIST_LO, HIST_HI = -80, 20


@ieee_mode
def log2_histogram(x: np.ndarray) -> tuple[np.ndarray, int]:
    """(counts per integer binade in [HIST_LO, HIST_HI), number of exact zeros) of the finite values."""
    a = np.abs(x[np.isfinite(x)]).ravel()
    nz = a[a != 0]
    _, e = np.frexp(nz)                                   # |x| = m 2^e, m in [0.5, 1): binade e - 1
    b = np.clip(e.astype(np.int64) - 1 - HIST_LO, 0, HIST_HI - HIST_LO - 1)
    return np.bincount(b, minlength=HIST_HI - HIST_LO), int(a.size - nz.size)


def _hadamard16() -> np.ndarray:
    """Sylvester's 16x16 Hadamard matrix divided by 4 (orthonormal; every entry +-1/4, exact)."""
    h = np.ones((1, 1))
    for _ in range(4):
        h = np.block([[h, h], [h, -h]])
    out: np.ndarray = h / 4.0
    return out


_H16 = _hadamard16()


@ieee_mode
def random_hadamard(x: np.ndarray, signs: np.ndarray) -> np.ndarray:
    """``T x`` on every group of 16 rows of ``x`` (rows a multiple of 16), ``T = (H16 / 4) diag(signs)``.

    ``T`` is orthogonal (``Tᵀ T = I``), so transforming both inputs of ``Xᵀ dY`` along the rows leaves the
    product unchanged in exact arithmetic: ``(T X)ᵀ (T dY) = Xᵀ dY``. Computed in float64, returned float32
    (the transform's output is what gets quantised).

    >>> import numpy as np
    >>> x = np.arange(32.0).reshape(16, 2); s = np.ones(16)
    >>> y = random_hadamard(x, s)
    >>> bool(np.array_equal(y.T.astype(float) @ y.astype(float), x.T @ x))
    True
    """
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] % 16:
        raise ValueError(f"random_hadamard needs a 2-D array whose rows are a multiple of 16, got shape {a.shape}")
    sg = np.asarray(signs, dtype=np.float64)
    if sg.shape != (16,) or not np.all(np.abs(sg) == 1):
        raise ValueError(f"signs must be 16 values of +-1, got {signs!r}")
    t = _H16 * sg[None, :]
    y = np.asarray(_blas_matmul(t, a.reshape(-1, 16, a.shape[1]))).reshape(a.shape)  # t @ each 16-row block
    out: np.ndarray = y.astype(np.float32)
    return out


def _owned32(a: Any) -> bool:
    """A C-contiguous float32 ndarray owning its memory (a result just made, e.g. by a GEMM): safe to write
    into in place when nothing else was handed it."""
    return isinstance(a, np.ndarray) and a.dtype == np.float32 and a.flags.owndata and a.flags.c_contiguous \
        and a.flags.writeable


def _pad(x: np.ndarray, axis: int, mult: int) -> np.ndarray:
    """Zeros appended along ``axis`` up to a multiple of ``mult`` (zero rows add nothing to a product)."""
    n = x.shape[axis]
    extra = -n % mult
    if not extra:
        return x
    w = [(0, 0)] * x.ndim
    w[axis] = (0, extra)
    return np.pad(x, w)


@ieee_mode
class PolicyRuntime:
    """A policy in action: casts, GEMMs, per-tensor state and telemetry.

    Attributes
    ----------
    policy : Policy
    recording : bool
        When True, gradient casts add to :attr:`stats` (cleared by :meth:`begin_step`).
    histograms : bool
        When True (and recording), log2-magnitude histograms of the activation gradients entering each
        GEMM (``"grad_act"``), of the weight gradients (``"grad_w"``) and of activations (``"act"``) are
        accumulated in :attr:`hists`.
    stats : dict
        site -> float64 array ``[total, nonzero, underflow, subnormal, overflow, amax]`` for this step.
    training : bool
        QAT observers update only while training (or calibrating).
    quant_active : bool
        Fake quantization on (always for QAT; for PTQ only after calibration).
    """

    def __init__(self, policy: Policy, seed: int = 0) -> None:
        self.policy = policy
        self.recording = False
        self.histograms = False
        self.stats: dict[str, np.ndarray] = {}
        self.hists: dict[str, np.ndarray] = {}
        self.hist_zeros: dict[str, int] = {}
        self.training = True
        self.quant_active = policy.quant is not None and policy.quant.mode == "qat" and policy.quant.start == 0
        self.rng = np.random.default_rng(seed) if policy.stochastic else None
        self._fp8: dict[str, Any] = {}
        self._obs: dict[str, np.ndarray] = {}
        self._mma_model: Any = None
        #: GEMMs run through the device model so far (``Policy.gemm`` a device name); 0 for fast GEMMs.
        self.mma_calls = 0
        #: The training step the trainer is in (set by :meth:`begin_step`; reported by ``detect_anomaly``).
        self.step: int | None = None
        #: Per step: how many times each FP8 tensor's amax was recorded, and each QAT observer updated
        #: (cleared by :meth:`begin_step`); a recomputed forward adds nothing (see :meth:`recomputing`).
        self.amax_records: dict[str, int] = {}
        self.observer_updates: dict[str, int] = {}
        self._recomputing = False
        #: Block-scaled operands' telemetry for this step (recording steps): site -> float64
        #: ``[total, nonzero, underflow, subnormal, saturated, amax]`` of the elements, like :attr:`stats`.
        self.qstats: dict[str, np.ndarray] = {}
        #: The model's number of transformer blocks (set by the trainer): needed by ``BlockRecipe.bf16_last``.
        self.n_layer: int | None = None
        #: Block-scaled GEMMs run so far (any of the three GEMMs of a block-scaled layer).
        self.block_calls = 0
        blk = policy.block
        #: The random signs of the Hadamard transform, drawn once from the seed (NVIDIA's recipe reuses one).
        self.rht_signs: np.ndarray | None = None
        if blk is not None and blk.hadamard:
            self.rht_signs = np.where(np.random.default_rng([seed, 0x524854]).random(16) < 0.5, -1.0, 1.0)
        self._bs_models: dict[tuple[str, str], Any] = {}
        #: Per format: the bit kernel's plan for float32 arrays under the policy's rounding (False where
        #: fpsim.round would take another path); see :meth:`_round32`.
        self._plans: dict[Format, Any] = {}

    # ------------------------------------------------------------------ casts
    def cast(self, x: np.ndarray, fmt: Format) -> np.ndarray:
        """Round ``x`` (float32 carrier; float64 for FP64 master weights) into ``fmt`` with the policy's
        rounding mode, once; the result is a float32 carrier."""
        x = np.asarray(x)
        if x.dtype == np.float64:  # e.g. FP64 master weights: round once from float64, not through float32
            return np.asarray(fround(x, fmt, self.policy.rounding, rng=self.rng), np.float32)
        if x.dtype != np.float32:
            x = x.astype(np.float32)
        if fmt is _FP32 or fmt == _FP32:
            return x
        return self._round32(x, fmt)  # rng is set iff rounding is "sr"

    def _round32(self, x: np.ndarray, fmt: Format, out: np.ndarray | None = None) -> np.ndarray:
        """``fpsim.round(x, fmt, policy.rounding, rng=self.rng, out=out)`` for a float32 array (`out` None or a
        float32 array of x's shape): fpsim.round's bit-kernel path (`rounding._round_planned`) on a plan made
        once per format, without fpsim.round's per-call checks and option parsing (~50 us, against a few us
        to round a small array). The same bits and the same SR draws; a table format or a float64 carrier goes
        through fpsim.round itself."""
        pl = self._plans.get(fmt)
        if pl is None:
            pl = self._plans[fmt] = self._plan32(fmt)
        if pl is False:
            return np.asarray(fround(x, fmt, self.policy.rounding, rng=self.rng, out=out))
        return _rounding._round_planned(x, _rounding._F32, pl, self.rng, out, np.dtype(np.float32))

    def _plan32(self, fmt: Format) -> Any:
        """The plan `_round32` hands the bit kernel for float32 input, or False where fpsim.round would
        not round a float32 array with that kernel in the float32 carrier."""
        f, mode, ov = _rounding.parse_options(fmt, self.policy.rounding, "ieee", True, self.rng, None, philox=True)
        if f.table is not None:
            return False
        c = _rounding._carrier_for(np.dtype(np.float32), f, mode, None)
        if c is not _rounding._F32:
            return False
        return _rounding._plan_cached(c, f, mode, ov, True, None)

    def _gcast(self, x: np.ndarray, fmt: Format, site: str, hist: str | None = None,
               op: str = "matmul") -> np.ndarray:
        """A gradient cast that records telemetry (and, inside ``detect_anomaly``, checks its output)."""
        r = self.cast(x, fmt)
        log = _ACTIVE.get()
        if log is not None:
            _watch(log, r, x, fmt, site, op, "backward", self)
        if self.recording:
            self._record(site, x, r, fmt)
            if self.histograms and hist is not None:
                self._hist(hist, x)
        return r

    def _record(self, site: str, x: np.ndarray, r: np.ndarray, fmt: Format) -> None:
        nzx = x != 0
        nz = int(np.count_nonzero(nzx))
        zr = r == 0
        under = int(np.count_nonzero(nzx & zr))
        ar = np.abs(r)
        sub = int(np.count_nonzero(ar < fmt.min_normal)) - int(np.count_nonzero(zr))
        with np.errstate(invalid="ignore"):
            amax = float(np.max(np.abs(x))) if x.size else 0.0
        over = 0
        if not (amax <= fmt.max):  # something overflowed, saturated or was already non-finite
            fin_x = np.isfinite(x)
            over = int(np.count_nonzero(fin_x & (~np.isfinite(r) | ((ar == fmt.max) & (np.abs(x) > fmt.max)))))
            ax = np.abs(x[fin_x])
            amax = float(ax.max()) if ax.size else 0.0
        row = np.array([x.size, nz, under, max(sub, 0), over, amax], dtype=np.float64)
        old = self.stats.get(site)
        if old is None:
            self.stats[site] = row
        else:
            old[:5] += row[:5]
            old[5] = max(old[5], amax)

    def _hist(self, key: str, x: np.ndarray) -> None:
        c, z = log2_histogram(x)
        if key in self.hists:
            self.hists[key] += c
            self.hist_zeros[key] += z
        else:
            self.hists[key] = c
            self.hist_zeros[key] = z

    def begin_step(self, recording: bool = False, histograms: bool = False, step: int | None = None) -> None:
        """Start a training step: clear the per-step telemetry; ``step`` is the trainer's step count."""
        self.step = step
        self.recording = recording
        self.histograms = histograms and recording
        self.stats = {}
        self.hists = {}
        self.hist_zeros = {}
        self.amax_records = {}
        self.observer_updates = {}
        self.qstats = {}

    def end_step(self) -> None:
        """End of a training step: FP8 delayed scales take this step's amax (TE updates even on skipped steps)."""
        for ds in self._fp8.values():
            ds.update()

    # ------------------------------------------------------------------ nn.Precision
    def act(self, x: np.ndarray, site: str, op: str) -> np.ndarray:
        log = _ACTIVE.get()
        if op in self.policy.fp32_ops:
            if log is not None:
                _watch(log, x, x, _FP32, site, op, "forward", self)
            return x
        r = self.cast(x, self.policy.activations)
        if log is not None:
            _watch(log, r, x, self.policy.activations, site, op, "forward", self)
        if self.recording and self.histograms and op != "cross_entropy" and not self._recomputing:
            self._hist("act", r)
        return r

    def grad(self, g: np.ndarray, site: str, op: str) -> np.ndarray:
        if op in self.policy.fp32_ops:
            log = _ACTIVE.get()
            if log is not None:
                _watch(log, g, g, _FP32, f"{site}.grad", op, "backward", self)
            return g
        return self._gcast(g, self.policy.gradients, f"{site}.grad", op=op)

    def _gemm(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Every GEMM of the model, forward and backward (``dX = dY Wᵀ``, ``dW = Xᵀ dY``, attention's batched
        products included): the operands arrive rounded to their formats (values, float32 carriers)."""
        g = self.policy.gemm
        if g == "fast":
            return np.asarray(_blas_matmul(a, b))  # single-threaded BLAS: the same bits at any thread count
        if g == "fast64":
            return np.asarray(_blas_matmul(a.astype(np.float64), b.astype(np.float64)))
        return self._mma(a, b)

    def _mma(self, a: np.ndarray, b: np.ndarray, c: np.ndarray | None = None) -> np.ndarray:
        """``c + a @ b`` under the device's block-FMA model (inputs in the policy's one GEMM operand format,
        fp32 out, ``c`` inside the instruction chain); float32."""
        from .. import mma  # L2: bit-exact block-FMA models, imported only when asked for
        from ..mma import gemm

        if self._mma_model is None:
            self._mma_model = mma.get_model(self.policy.gemm, self.policy.activations, "fp32")
        self.mma_calls += 1
        # The operands are float32 values of the policy's one GEMM format (its casts rounded them) and c float32:
        # the low-overhead entry skips matmul's checks and re-conversion (same bits: tests/test_cgemm.py).
        a = np.asarray(a, dtype=np.float32)
        b = np.asarray(b, dtype=np.float32)
        return gemm._matmul_values(a, b, None if c is None else np.asarray(c, np.float32), self._mma_model)

    def _fp8_state(self, key: str, fmt: Format) -> Any:
        ds = self._fp8.get(key)
        if ds is None:
            from ..scaling import DelayedScaling

            r = self.policy.fp8
            assert r is not None
            ds = DelayedScaling(fmt, margin=r.margin, amax_history_len=r.amax_history_len,
                                amax_compute_algo=r.amax_compute_algo)
            self._fp8[key] = ds
        return ds

    def _fp8_quant(self, x: np.ndarray, key: str, fmt: Format) -> tuple[np.ndarray, np.float32]:
        ds = self._fp8_state(key, fmt)
        inv = ds.scale_inv
        pending = ds._pending
        q = np.asarray(ds.quantize(x, rounding=self.policy.rounding, rng=self.rng))
        if not self.training or self._recomputing:  # evaluation uses the scales but its amax is not
            ds._pending = pending  # recorded: training must not depend on when or how often evaluation
            # runs; a recomputed forward saw this amax already (TE's "FP8 activation recompute phase")
        else:
            self.amax_records[key] = self.amax_records.get(key, 0) + 1
        return q.astype(np.float32, copy=False), inv

    def matmul_accumulate(self, a: np.ndarray, b: np.ndarray, site: str, kind: str,
                          c: np.ndarray | None = None) -> np.ndarray:
        """``c + a @ b`` inside a fused kernel (FlashAttention's tiles): the operands cast as :meth:`matmul`
        casts activations, the result left in the FP32 accumulator (no output cast), ``c`` entering the
        GEMM as its accumulator (a Tensor Core model adds it inside the instruction chain).

        FP8 and QAT GEMMs quantize per call with their own state; they keep :meth:`matmul`'s semantics
        (the class's method is called, not an instance attribute, so a wrapper installed on the instance,
        such as the ledger's FLOP counter, sees one GEMM, not two).
        """
        pol = self.policy
        fp8 = (pol.fp8 is not None and kind in pol.fp8.kinds) or self._block_on(site, kind)
        quant = pol.quant is not None and kind in pol.quant.kinds and (self.quant_active or self._calibrating)
        if fp8 or quant:
            out = np.asarray(type(self).matmul(self, a, b, site, kind)[0], np.float32)
            return out if c is None else np.asarray(c, np.float32) + out
        ac, bc = self.cast(a, pol.activations), self.cast(b, pol.activations)
        g = pol.gemm
        if g in ("fast", "fast64"):
            out = self._gemm(ac, bc).astype(np.float32, copy=False)
            out = out if c is None else np.asarray(c, np.float32) + out
        else:  # the device model adds C inside its chain
            out = self._mma(ac, bc, None if c is None else np.asarray(c, np.float32))
        log = _ACTIVE.get()
        if log is not None:  # the FP32 accumulator of a fused kernel: no cast
            _watch(log, out, out, _FP32, site, "matmul", "forward", self)
        return out

    def matmul(self, a: np.ndarray, b: np.ndarray, site: str, kind: str,
               bias: np.ndarray | None = None) -> tuple[np.ndarray, Any]:
        pol = self.policy
        weight = kind in ("linear", "lm_head")
        if pol.fp8 is not None and kind in pol.fp8.kinds:
            aq, ainv = self._fp8_quant(a, f"{site}.x", pol.fp8.forward)
            bq, binv = self._fp8_quant(b, f"{site}.w", pol.fp8.forward)
            raw = self._gemm(aq, bq) * (ainv * binv)            # dequantize in the GEMM epilogue
            if bias is not None:
                raw = raw + self.cast(bias, pol.params)
            out = self._forward_out(raw, site)
            return out, ("fp8", aq, bq, ainv, binv, site, bias is not None)
        if self._block_on(site, kind):
            return self._block_matmul(a, b, site, bias)
        if pol.quant is not None and kind in pol.quant.kinds and (self.quant_active or self._calibrating):
            return self._quant_matmul(a, b, site, bias)
        ac = self.cast(a, pol.activations)
        bc = self.cast(b, pol.params if weight else pol.activations)
        raw = self._gemm(ac, bc)
        if bias is not None:
            bq = self.cast(bias, pol.params)
            if _owned32(raw) and bq.dtype == np.float32 and bq.shape == raw.shape[-1:]:
                np.add(raw, bq, out=raw)  # the GEMM's own new result: the same sum without a new array
            else:
                raw = raw + bq
        out = self._forward_out(raw, site, owned=True)
        return out, ("std", ac, bc, site, bias is not None)

    def _forward_out(self, raw: np.ndarray, site: str, owned: bool = False) -> np.ndarray:
        """A forward GEMM's result cast into the activation format (checked inside ``detect_anomaly``).
        ``owned``: ``raw`` is this call's own new array, which nothing else holds: rounded in place unless
        ``detect_anomaly`` needs the value before the cast."""
        log = _ACTIVE.get()
        fmt = self.policy.activations
        if owned and log is None and fmt is not _FP32 and fmt != _FP32 and _owned32(raw):
            return self._round32(raw, fmt, out=raw)
        out = self.cast(raw, fmt)
        if log is not None:
            _watch(log, out, raw, fmt, site, "matmul", "forward", self)
        return out

    def matmul_backward(self, dout: np.ndarray, cache: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        pol = self.policy
        gf = pol.gradients
        tag = cache[0]
        if tag == "std":
            _, ac, bc, site, has_bias = cache
            d = self._gcast(dout, gf, f"{site}.dy", hist="grad_act")
            da = self._gcast(self._gemm(d, np.swapaxes(bc, -1, -2)), gf, f"{site}.dx")      # dX = dY Wᵀ
            db = self._wgrad(ac, d, gf, site)                                                 # dW = Xᵀ dY
            dbias = self._bias_grad(d, gf, site) if has_bias else None
            return da, db, dbias
        if tag == "fp8":
            _, aq, bq, ainv, binv, site, has_bias = cache
            assert pol.fp8 is not None
            d = self.cast(dout, gf)
            log = _ACTIVE.get()
            if log is not None:
                _watch(log, d, dout, gf, f"{site}.dy", "matmul", "backward", self)
            scale = self._fp8_state(f"{site}.dy", pol.fp8.backward).scale  # the scale this quantization uses
            dq, dinv = self._fp8_quant(d, f"{site}.dy", pol.fp8.backward)
            if self.recording:
                with np.errstate(over="ignore", invalid="ignore"):
                    self._record(f"{site}.dy", (d * scale).astype(np.float32), dq, pol.fp8.backward)
                if self.histograms:
                    self._hist("grad_act", d)
            # swapaxes, not .T: inside attention (FP8Recipe kinds with "attn") the operands are batched
            da = self._gcast(self._gemm(dq, np.swapaxes(bq, -1, -2)) * (dinv * binv), gf, f"{site}.dx")
            if aq.ndim == 2 or dq.ndim == 2:
                a2 = aq.reshape(-1, aq.shape[-1])
                dw = self._gemm(a2.T, dq.reshape(-1, dq.shape[-1])) * (ainv * dinv)
            else:
                dw = self._gemm(np.swapaxes(aq, -1, -2), dq) * (ainv * dinv)
            db = self._gcast(dw, gf, f"{site}.dw", hist="grad_w" if aq.ndim == 2 else None)
            dbias = self._bias_grad(d, gf, site) if has_bias else None
            return da, db, dbias
        if tag == "quant":
            _, aq, amask, wq, wmask, site, has_bias = cache
            d = self._gcast(dout, gf, f"{site}.dy", hist="grad_act")
            da = self._gcast(self._gemm(d, np.swapaxes(wq, -1, -2)) * amask, gf, f"{site}.dx")
            if wq.ndim > 2:                                                   # activation x activation
                dw = self._gcast(self._gemm(np.swapaxes(aq, -1, -2), d) * wmask, gf, f"{site}.dw")
            else:
                a2 = aq.reshape(-1, aq.shape[-1])
                dw = self._gcast(self._gemm(a2.T, d.reshape(-1, d.shape[-1])) * wmask, gf, f"{site}.dw",
                                 hist="grad_w")
            dbias = self._bias_grad(d, gf, site) if has_bias else None
            return da, dw, dbias
        if tag == "block":
            return self._block_backward(dout, cache)
        raise ValueError(f"unknown matmul cache tag {tag!r}")

    def _bias_grad(self, d: np.ndarray, gf: Format, site: str) -> np.ndarray:
        return self._gcast(d.reshape(-1, d.shape[-1]).sum(axis=0), gf, f"{site}.db")   # (N,)

    def _wgrad(self, ac: np.ndarray, d: np.ndarray, gf: Format, site: str) -> np.ndarray:
        if ac.ndim == 2 or d.ndim == 2:
            a2 = ac.reshape(-1, ac.shape[-1])
            raw = self._gemm(a2.T, d.reshape(-1, d.shape[-1]))               # (K, N)
        else:
            raw = self._gemm(np.swapaxes(ac, -1, -2), d)                     # (..., K, N)
        return self._gcast(raw, gf, f"{site}.dw", hist="grad_w" if ac.ndim == 2 else None)

    # ------------------------------------------------------------------ block-scaled GEMMs (MXFP8, NVFP4)
    def _block_on(self, site: str, kind: str) -> bool:
        """Whether this GEMM is block-scaled: its kind is the recipe's and it is not in the last
        ``bf16_last`` transformer blocks (sites ``"h<i>.…"``)."""
        blk = self.policy.block
        if blk is None or kind not in blk.kinds:
            return False
        if blk.bf16_last == 0:
            return True
        if not (site.startswith("h") and "." in site and site[1:site.index(".")].isdigit()):
            return True
        if self.n_layer is None:
            raise RuntimeError("BlockRecipe.bf16_last needs the model's depth: set PolicyRuntime.n_layer "
                               "(the trainer does)")
        return int(site[1:site.index(".")]) < self.n_layer - blk.bf16_last

    def _bq(self, x: np.ndarray, axis: int, fmt: Format, key: str, *, sr: bool = False,
            tile2d: bool = False) -> tuple[np.ndarray, np.ndarray, np.float32]:
        """Block-quantise a 2-D operand along ``axis`` (its length a multiple of the block): elements,
        each element's block decode scale (float32, the shape of ``x``), the tensor decode scale."""
        from ..scaling import mx_quantize, nvfp4_quantize  # same layer; deferred as the FP8 path does

        blk = self.policy.block
        assert blk is not None
        mode = "sr" if sr else "rne"
        rng = self.rng if sr else None
        b = blk.block
        if blk.scheme == "mxfp8":
            el, sc = mx_quantize(x, fmt, block=b, axis=axis, scale_rounding=blk.scale_rounding, rounding=mode,
                                 rng=rng)
            g = np.float32(1.0)
            sfull = np.repeat(np.asarray(sc, np.float32), b, axis=axis)
        else:
            if tile2d:
                el, sc, g = nvfp4_quantize(x, block=(16, 16), rounding=mode, rng=rng,
                                           four_over_six=blk.four_over_six)
                sfull = np.repeat(np.repeat(np.asarray(sc, np.float32), 16, axis=0), 16, axis=1)
            else:
                el, sc, g = nvfp4_quantize(x, block=16, axis=axis, rounding=mode, rng=rng,
                                           four_over_six=blk.four_over_six)
                sfull = np.repeat(np.asarray(sc, np.float32), 16, axis=axis)
        el = np.asarray(el, np.float32)
        if self.recording and not self._recomputing:
            self._qrecord(key, x, el, sfull, np.float32(g), fmt)
        return el, sfull, np.float32(g)

    def _qrecord(self, key: str, x: np.ndarray, el: np.ndarray, sfull: np.ndarray, g: np.float32,
                 fmt: Format) -> None:
        """Underflow (nonzero values quantised to 0) and saturation (values beyond the element format's
        largest after scaling, clamped to it) of one block-quantised operand."""
        nzx = x != 0
        ael = np.abs(el)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            scaled = np.abs(x.astype(np.float64)) / (sfull.astype(np.float64) * np.float64(g))
        under = int(np.count_nonzero(nzx & (el == 0)))
        sat = int(np.count_nonzero((ael == fmt.max) & (scaled > fmt.max)))
        sub = int(np.count_nonzero((ael > 0) & (ael < fmt.min_normal)))
        amax = float(np.max(np.abs(x))) if x.size else 0.0
        row = np.array([x.size, int(np.count_nonzero(nzx)), under, sub, sat, amax], dtype=np.float64)
        old = self.qstats.get(key)
        if old is None:
            self.qstats[key] = row
        else:
            old[:5] += row[:5]
            old[5] = max(old[5], amax)

    def _bgemm(self, a: tuple[np.ndarray, np.ndarray, np.float32], b: tuple[np.ndarray, np.ndarray, np.float32],
               fa: Format, fb: Format) -> np.ndarray:
        """``A @ B`` of two block-quantised operands (A blocked along its columns, B along its rows): block
        scales inside the product, the tensor scales after it (cuBLAS' ``alpha``); float32."""
        blk = self.policy.block
        assert blk is not None
        self.block_calls += 1
        ea, sa, ga = a
        eb, sb, gb = b
        alpha = np.float32(ga * gb)
        if blk.gemm == "fast":
            # element x block scale is exact in float32 (E4M3/E5M2 x 2^k; E2M1 x E4M3): the scaled operands
            # are the values the hardware multiplies; float32 BLAS accumulates them
            raw = np.asarray(_blas_matmul(ea * sa, eb * sb), np.float32)
            return raw if alpha == 1 else (raw * alpha).astype(np.float32)
        from ..mma import block_scaled_model, matmul_block_scaled  # L2, only for the bit-exact path

        mk = (fa.name, fb.name)
        m = self._bs_models.get(mk)
        if m is None:
            kind = "mxf8f6f4" if blk.scheme == "mxfp8" else "mxf4nvf4"
            m = self._bs_models[mk] = block_scaled_model(blk.gemm, kind, fa, fb)
        k = blk.block
        acc = matmul_block_scaled(ea.astype(np.float64), eb.astype(np.float64), scale_a=sa[:, ::k],
                                  scale_b=sb[::k, :], model=m)
        # D = RN_fp32(RN_fp32(ga gb) * acc): the float64 product of two float32 values is exact
        out: np.ndarray = (np.float64(alpha) * np.asarray(acc, np.float64)).astype(np.float32)
        return out

    def _block_matmul(self, a: np.ndarray, b: np.ndarray, site: str,
                      bias: np.ndarray | None) -> tuple[np.ndarray, Any]:
        pol = self.policy
        blk = pol.block
        assert blk is not None and blk.forward is not None
        if b.ndim != 2:
            raise ValueError(f"block-scaled GEMM {site!r}: the second operand must be a 2-D weight, "
                             f"got shape {b.shape}")
        ac = self.cast(a, pol.activations)
        bc = self.cast(b, pol.params)
        lead, k = ac.shape[:-1], ac.shape[-1]
        n = bc.shape[1]
        bk = blk.block
        tile2d = blk.scheme == "nvfp4" and blk.weight_2d
        xq = self._bq(_pad(ac.reshape(-1, k), 1, bk), 1, blk.forward, f"{site}.x")
        wp = _pad(bc, 0, bk)
        if tile2d:
            wp = _pad(wp, 1, 16)
        wq = self._bq(wp, 0, blk.forward, f"{site}.w", tile2d=tile2d)
        raw = self._bgemm(xq, wq, blk.forward, blk.forward)[:, :n].reshape(lead + (n,))
        if bias is not None:
            raw = raw + self.cast(bias, pol.params)
        out = self._forward_out(raw, site)
        return out, ("block", ac, bc, wq if tile2d else None, site, bias is not None)

    def _block_backward(self, dout: np.ndarray, cache: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        pol = self.policy
        blk = pol.block
        assert blk is not None and blk.forward is not None and blk.backward is not None
        gf = pol.gradients
        _, ac, bc, wq2d, site, has_bias = cache
        k, n = bc.shape
        bk = blk.block
        d = self._gcast(dout, gf, f"{site}.dy", hist="grad_act")
        d2 = d.reshape(-1, n)
        x2 = ac.reshape(-1, k)
        sr = blk.sr_gradients
        # dX = dY Wᵀ: reduction over N
        np_ = n + (-n % (16 if wq2d is not None else bk))
        dyq = self._bq(_pad(d2, 1, bk) if wq2d is None else _pad(d2, 1, 16), 1, blk.backward, f"{site}.dy", sr=sr)
        if wq2d is not None:  # the forward's 16x16-block weight, transposed: the same quantised values
            el, sfull, g = wq2d
            wt = (el.T, sfull.T, g)
        else:
            wt = self._bq(_pad(bc.T, 0, bk), 0, blk.forward, f"{site}.w_t")
        assert dyq[0].shape[1] == wt[0].shape[0] == np_
        dx = self._bgemm(dyq, wt, blk.backward, blk.forward)[:, :k].reshape(ac.shape)
        da = self._gcast(dx, gf, f"{site}.dx")
        # dW = Xᵀ dY: reduction over the tokens M; the random Hadamard transform acts along M
        xm, dm = _pad(x2, 0, bk), _pad(d2, 0, bk)
        if self.rht_signs is not None:
            xm, dm = random_hadamard(xm, self.rht_signs), random_hadamard(dm, self.rht_signs)
        xtq = self._bq(np.ascontiguousarray(xm.T), 1, blk.forward, f"{site}.x_wgrad")
        dwq = self._bq(dm, 0, blk.backward, f"{site}.dy_wgrad", sr=sr)
        dw = self._gcast(self._bgemm(xtq, dwq, blk.forward, blk.backward), gf, f"{site}.dw", hist="grad_w")
        dbias = self._bias_grad(d, gf, site) if has_bias else None
        return da, dw, dbias

    # ------------------------------------------------------------------ QAT / PTQ
    _calibrating = False

    def calibrate(self, on: bool) -> None:
        """PTQ: observe activation ranges (``on=True``) without quantizing; then freeze them."""
        self._calibrating = bool(on)
        self.training = bool(on)

    def _observe(self, site: str, a: np.ndarray) -> np.ndarray:
        q = self.policy.quant
        assert q is not None
        mn, mx = _F32(a.min()), _F32(a.max())
        old = self._obs.get(site)
        if old is None:
            cur = np.array([mn, mx], dtype=_F32)
        elif self.training:
            c = _F32(q.averaging_constant)
            cur = np.array([old[0] + c * (mn - old[0]), old[1] + c * (mx - old[1])], dtype=_F32)
        else:
            cur = old
        self._obs[site] = cur
        return cur

    def _quant_matmul(self, a: np.ndarray, b: np.ndarray, site: str,
                      bias: np.ndarray | None) -> tuple[np.ndarray, Any]:
        q = self.policy.quant
        assert q is not None
        a = self.cast(a, self.policy.activations)
        if (self.training and not self._recomputing) or site not in self._obs:
            # a recomputed forward reuses the observer values its forward pass used (no second update)
            mn, mx = self._observe(site, a)
            if self.training:
                self.observer_updates[site] = self.observer_updates.get(site, 0) + 1
        else:
            mn, mx = self._obs[site]
        if self._calibrating and not self.quant_active:
            out = self._gemm(a, b) + (bias if bias is not None else 0)
            return self._forward_out(out, site), ("std", a, b, site, bias is not None)
        amin, amax_ = q.act_range
        mn0, mx0 = min(mn, _F32(0)), max(mx, _F32(0))
        s_a = max(_F32((mx0 - mn0) / _F32(amax_ - amin)), _EPS32)
        zp_a = np.clip(amin - np.rint(mn0 / s_a), amin, amax_).astype(_F32)
        aq, amask = fake_quantize_with_mask(a, s_a, int(zp_a), amin, amax_)
        wmin, wmax = q.weight_range
        if b.ndim > 2:
            # attention's second operand is an activation batch (..., K, N), not a weight: one symmetric
            # scale for the tensor (per-channel scales belong to weights)
            b = self.cast(b, self.policy.activations)
            s_b = max(_F32(_F32(np.abs(b).max()) / _F32((wmax - wmin) / 2)), _EPS32)
            wq, wmask = fake_quantize_with_mask(b, s_b, 0, wmin, wmax)
        else:
            wabs = np.abs(b).max(axis=0)                                      # per output channel (Cout,)
            if not q.per_channel:
                wabs = np.full_like(wabs, wabs.max())                         # one scale for the tensor
            s_w = np.maximum((wabs / _F32((wmax - wmin) / 2)).astype(_F32), _EPS32)
            wq, wmask = fake_quantize_with_mask(b, s_w, np.zeros(b.shape[1], np.int64), wmin, wmax, axis=1)
        out = self._gemm(aq, wq)
        if bias is not None:
            out = out + bias
        out = self._forward_out(out, site)
        return out, ("quant", aq, amask, wq, wmask, site, bias is not None)

    # ------------------------------------------------------------------ recomputation
    def recompute_state(self) -> Any:
        """Snapshot where a checkpointed piece of the model starts its forward pass: the stochastic
        rounding generator's state (None without SR). See :mod:`fpsim.nn.recompute`."""
        return None if self.rng is None else self.rng.bit_generator.state

    @contextlib.contextmanager
    def recomputing(self, state: Any) -> Iterator[None]:
        """Around a recomputed forward: replay the SR draws from ``state`` (then put the generator back
        where the backward pass had it, as torch's ``preserve_rng_state``), record no FP8 amax, update
        no QAT observer and add nothing to the telemetry: the recomputation reproduces the forward's
        bits and leaves the policy state as one forward pass leaves it."""
        if self._recomputing:
            raise RuntimeError("PolicyRuntime.recomputing: already inside a recomputation")
        rng = self.rng
        now = None if rng is None else rng.bit_generator.state
        if rng is not None and state is not None:
            rng.bit_generator.state = state
        self._recomputing = True
        try:
            yield
        finally:
            self._recomputing = False
            if rng is not None and now is not None:
                rng.bit_generator.state = now

    def saved_arrays(self, cache: Any) -> list[tuple[str, Any, Format | None]]:
        """What a :meth:`matmul` cache holds for the backward pass, for the memory ledger: a list of
        ``(role, array, format)`` with role ``"a"`` (the activation operand), ``"b"`` (the second
        operand: a weight copy, or an activation inside attention), ``"scale"`` (FP8 inverse scales),
        ``"mask_a"`` / ``"mask_b"`` (QAT straight-through masks, bool) and the format the values are in
        (None: the carrier's, e.g. bool)."""
        pol = self.policy
        tag = cache[0]
        if tag == "std":
            _, ac, bc, site, _ = cache
            return [("a", ac, pol.activations), ("b", bc, None)]
        if tag == "fp8":
            _, aq, bq, ainv, binv, site, _ = cache
            assert pol.fp8 is not None
            f8 = pol.fp8.forward
            return [("a", aq, f8), ("b", bq, f8), ("scale", ainv, _FP32), ("scale", binv, _FP32)]
        if tag == "quant":
            _, aq, amask, wq, wmask, site, _ = cache
            return [("a", aq, pol.activations), ("mask_a", amask, None), ("b", wq, pol.params),
                    ("mask_b", wmask, None)]
        if tag == "block":
            return [("a", cache[1], pol.activations), ("b", cache[2], pol.params)]
        raise ValueError(f"unknown matmul cache tag {tag!r}")

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, np.ndarray]:
        """Arrays to checkpoint: FP8 scales/histories, QAT observers, the SR generator state."""
        out: dict[str, np.ndarray] = {}
        for k, ds in self._fp8.items():
            out[f"fp8.{k}.scale"] = np.asarray(ds.scale, _F32)
            out[f"fp8.{k}.hist"] = np.asarray(ds.amax_history, _F32)
            out[f"fp8.{k}.fmt"] = np.asarray(ds.fmt.name)
        for k, v in self._obs.items():
            out[f"obs.{k}"] = v.copy()
        if self.rng is not None:
            import json

            out["rng"] = np.asarray(json.dumps(self.rng.bit_generator.state))
        for k, v in getattr(self, "kahan", {}).items():  # compensation buffers of update="kahan" (amp.bf16)
            out[f"kahan.{k}"] = v.copy()
        return out

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        self._fp8 = {}
        self._obs = {}
        for k, v in state.items():
            if k.startswith("fp8.") and k.endswith(".scale"):
                key = k[4:-6]
                ds = self._fp8_state(key, as_format(str(state[f"fp8.{key}.fmt"])))
                ds.scale = _F32(v)
                ds.amax_history = np.asarray(state[f"fp8.{key}.hist"], _F32).copy()
            elif k.startswith("obs."):
                self._obs[k[4:]] = np.asarray(v, _F32).copy()
            elif k.startswith("kahan."):
                self.__dict__.setdefault("kahan", {})[k[6:]] = np.asarray(v, _F32).copy()
        if "rng" in state and self.rng is not None:
            import json

            self.rng.bit_generator.state = json.loads(str(state["rng"]))
