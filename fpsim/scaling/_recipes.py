"""TransformerEngine's recipes: :class:`DelayedScaling` (amax history), :class:`CurrentScaling`, the FP8 format
pairs and the named :class:`Recipe` table. Public names are re-exported by :mod:`fpsim.scaling`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._fpenv import ieee_mode
from .._names import parse_name
from ..formats import Format, FormatLike, as_format
from ..rounding import RoundingLike
from ._common import _F32, _FLT_MAX, _as_float, _check_int, _check_margin, _check_real, _check_scale
from ._mx import mx_quantize, nvfp4_quantize
from ._tensor import amax, compute_scale, dequantize, quantize, scale_and_quantize


# --------------------------------------------------------------------------------------------------
# TransformerEngine recipes


FP8_FORMATS: dict[str, tuple[str, str]] = {
    "E4M3": ("fp8_e4m3", "fp8_e4m3"),
    "E5M2": ("fp8_e5m2", "fp8_e5m2"),
    "HYBRID": ("fp8_e4m3", "fp8_e5m2"),
}
"""TransformerEngine's ``Format`` names -> (forward format, backward format)."""


@ieee_mode
def fp8_format_pair(name: str) -> tuple[Format, Format]:
    """(forward, backward) formats of a TE format name: ``"HYBRID"`` -> (fp8_e4m3, fp8_e5m2).

    ``"E5M2"`` is listed for completeness; TransformerEngine's recipes reject pure E5M2 training.

    >>> [f.name for f in fp8_format_pair("HYBRID")]
    ['fp8_e4m3', 'fp8_e5m2']
    """
    key = parse_name(name, tuple(k.lower() for k in FP8_FORMATS), "FP8 format").upper()
    fw, bw = FP8_FORMATS[key]
    return as_format(fw), as_format(bw)


_ALGOS = ("max", "most_recent")
_PATHS = ("unfused", "fused")


@ieee_mode
class DelayedScaling:
    """TransformerEngine's delayed scaling: the scale for step t comes from the amax history up to t−1.

    Follows TE's reference (unfused, ``NVTE_UNFUSED_FP8_UPDATE=1``) update, all in float32. After each
    step, :meth:`update` with that step's amax:

    1. writes amax into history slot 0;
    2. takes ``amax = max(history)`` (``"max"``; a NaN propagates) or ``history[0]`` (``"most_recent"``);
    3. rolls the history by −1 and zeroes slot 0 (window = this amax and the previous ``len − 1``);
    4. ``sf = (fmt.max / amax) / 2**margin``; keeps the previous scale if amax is 0, inf or NaN;
       uses float32's max if ``sf`` is inf.

    An inf (or, unfused, a NaN) amax therefore holds the previous scale until it leaves the window,
    ``amax_history_len`` steps later. ``update_path="fused"`` follows TE's default CUDA kernel instead:
    a step with amax 0 leaves history and scale untouched, and the window max skips NaN (``fmaxf``).

    Parameters
    ----------
    fmt : Format or str
        FP8 format of the tensor (TE HYBRID: fp8_e4m3 forward, fp8_e5m2 for gradients).
    margin : int
        ``scale /= 2**margin``.
    amax_history_len : int
        Window length (TE default 1024).
    amax_compute_algo : {"max", "most_recent"}
    scale : float
        Initial scale (TE: 1.0).
    update_path : {"unfused", "fused"}

    Attributes
    ----------
    scale : numpy.float32
        Scale to use for the *next* quantisation.
    scale_inv : numpy.float32
        ``float32(1 / scale)``.
    amax_history : numpy.ndarray
        float32 array of length ``amax_history_len``; slot 0 is the pending (current) step.

    Examples
    --------
    >>> ds = DelayedScaling("fp8_e4m3", amax_history_len=4)
    >>> [float(ds.update(a)) for a in (1.0, 2.0, 0.5, 0.25, 0.0, 8.0, float("inf"))]
    [448.0, 224.0, 224.0, 224.0, 224.0, 56.0, 56.0]
    """

    def __init__(
        self,
        fmt: FormatLike = "fp8_e4m3",
        *,
        margin: int = 0,
        amax_history_len: int = 1024,
        amax_compute_algo: str = "max",
        scale: float = 1.0,
        update_path: str = "unfused",
    ) -> None:
        self.fmt: Format = as_format(fmt)
        self.margin = _check_margin(margin)
        self.amax_history_len = _check_int("amax_history_len", amax_history_len, 1)
        self.amax_compute_algo = parse_name(amax_compute_algo, _ALGOS, "amax_compute_algo")
        self.update_path = parse_name(update_path, _PATHS, "update_path")
        self.scale: np.float32 = _check_scale(scale)
        self.amax_history: np.ndarray = np.zeros(self.amax_history_len, dtype=_F32)
        self._pending: np.float32 | None = None

    @property
    def scale_inv(self) -> np.float32:
        with np.errstate(divide="ignore", over="ignore"):
            inv: np.float32 = _F32(_F32(1.0) / self.scale)
        return inv

    def __repr__(self) -> str:
        return (
            f"DelayedScaling({self.fmt.name!r}, margin={self.margin}, amax_history_len={self.amax_history_len}, "
            f"amax_compute_algo={self.amax_compute_algo!r}, scale={float(self.scale)!r})"
        )

    # -- using the scale ---------------------------------------------------------------------------
    def record(self, x: Any) -> np.float32:
        """Record ``max|x|`` for the current step (the max over several calls) and return it."""
        with np.errstate(over="ignore"):  # float64 beyond float32's range: an inf amax (holds the scale)
            a = _F32(amax(x))
        if self._pending is None or np.isnan(a) or a > self._pending:
            self._pending = a
        out: np.float32 = a
        return out

    def quantize(self, x: Any, *, rounding: RoundingLike = "rne", rng: np.random.Generator | None = None) -> Any:
        """``round(x * scale)`` (saturating) with the current scale, recording this step's amax."""
        self.record(x)
        return quantize(x, self.fmt, self.scale, rounding=rounding, overflow="saturate", rng=rng)

    def dequantize(self, q: Any) -> Any:
        """``q * scale_inv`` with the current scale."""
        return dequantize(q, self.scale)

    def fake_quantize(self, x: Any, *, rounding: RoundingLike = "rne", rng: np.random.Generator | None = None) -> Any:
        """Quantize-dequantize with the current scale, recording this step's amax."""
        scale = self.scale
        return dequantize(self.quantize(x, rounding=rounding, rng=rng), scale)

    # -- the state machine -------------------------------------------------------------------------
    def update(self, amax: Any = None) -> np.float32:
        """End of step: record ``amax`` (or what :meth:`record`/:meth:`quantize` saw), update the scale.

        Returns the new scale (to be used at the next step).
        """
        if amax is None:
            a = self._pending if self._pending is not None else _F32(0.0)
        else:
            with np.errstate(over="ignore"):  # as in record()
                a = _F32(_as_float(amax, "amax").reshape(-1).max()) if np.size(amax) else _F32(0.0)
        self._pending = None
        h = self.amax_history
        h[0] = a
        fmax = _F32(self.fmt.max)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            if self.update_path == "unfused":
                cur = h.max() if self.amax_compute_algo == "max" else h[0]
                cur = _F32(cur)
                self._roll()
                sf = _F32(_F32(fmax / cur) / _F32(2.0**self.margin))
            else:
                last = h[0]
                if last != 0:
                    cur = _F32(np.fmax.reduce(h)) if self.amax_compute_algo == "max" else _F32(last)
                    self._roll()
                else:
                    cur = _F32(0.0)
                sf = _F32(_F32(fmax * _F32(2.0**-self.margin)) / cur)
            if not (cur > 0) or not np.isfinite(cur):
                sf = self.scale
            if np.isinf(sf):
                sf = _FLT_MAX
        self.scale = _F32(sf)
        return self.scale

    def _roll(self) -> None:
        h = self.amax_history
        if h.size > 1:
            self.amax_history = np.roll(h, -1)
        self.amax_history[0] = 0.0

    # -- checkpoints -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Plain-Python state (JSON-friendly apart from non-finite floats): config, scale and history."""
        return {
            "fmt": self.fmt.name,
            "margin": self.margin,
            "amax_history_len": self.amax_history_len,
            "amax_compute_algo": self.amax_compute_algo,
            "update_path": self.update_path,
            "scale": float(self.scale),
            "amax_history": [float(v) for v in self.amax_history],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (validated; the format and history length must match)."""
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict, got {type(state).__name__}")
        missing = [k for k in ("scale", "amax_history") if k not in state]
        if missing:
            raise ValueError(f"state_dict is missing {missing}")
        if "fmt" in state and as_format(state["fmt"]) != self.fmt:
            raise ValueError(f"state is for format {state['fmt']!r}, this DelayedScaling uses {self.fmt.name!r}")
        hist = np.asarray(state["amax_history"], dtype=_F32).reshape(-1)
        if hist.size != self.amax_history_len:
            raise ValueError(f"amax_history has {hist.size} entries, expected {self.amax_history_len}")
        for key in ("margin", "amax_compute_algo", "update_path"):
            if key in state and state[key] != getattr(self, key):
                raise ValueError(f"state has {key}={state[key]!r}, this object has {getattr(self, key)!r}")
        self.scale = _check_scale(state["scale"])
        self.amax_history = hist.copy()
        self._pending = None


@ieee_mode
class CurrentScaling:
    """TransformerEngine's ``Float8CurrentScaling``: a just-in-time per-tensor scale from the current amax.

    ``scale = compute_scale(amax(x), fmt, power_of_two=..., amax_epsilon=...)``: amax 0, inf or NaN
    gives scale 1, an infinite scale becomes float32's max, ``power_of_two`` rounds the scale down.

    Examples
    --------
    >>> import numpy as np
    >>> cs = CurrentScaling("fp8_e4m3")
    >>> q, s = cs.quantize(np.float32([3.0, -1.0]))
    >>> float(s), q.tolist()
    (149.3333282470703, [448.0, -144.0])
    """

    def __init__(self, fmt: FormatLike = "fp8_e4m3", *, power_of_two: bool = False, amax_epsilon: float = 0.0,
                 margin: int = 0) -> None:
        self.fmt: Format = as_format(fmt)
        self.power_of_two = bool(power_of_two)
        self.amax_epsilon = _check_real("amax_epsilon", amax_epsilon, 0.0)
        self.margin = _check_margin(margin)

    def __repr__(self) -> str:
        return (f"CurrentScaling({self.fmt.name!r}, power_of_two={self.power_of_two}, "
                f"amax_epsilon={self.amax_epsilon})")

    def scale_for(self, x: Any) -> np.float32:
        """The scale current scaling would use for ``x``."""
        s: np.float32 = _F32(compute_scale(_F32(amax(x)), self.fmt, margin=self.margin,
                                           power_of_two=self.power_of_two, amax_epsilon=self.amax_epsilon))
        return s

    def quantize(self, x: Any, *, rounding: RoundingLike = "rne",
                 rng: np.random.Generator | None = None) -> tuple[Any, np.float32]:
        """``(q, scale)`` with ``q = round(x * scale)`` saturating."""
        s = self.scale_for(x)
        return quantize(x, self.fmt, s, rounding=rounding, overflow="saturate", rng=rng), s

    def fake_quantize(self, x: Any, *, rounding: RoundingLike = "rne", rng: np.random.Generator | None = None) -> Any:
        """Quantize-dequantize with the current tensor's own scale."""
        q, s = self.quantize(x, rounding=rounding, rng=rng)
        return dequantize(q, s)


@ieee_mode
@dataclass(frozen=True)
class Recipe:
    """A named scaling recipe: which format each tensor role gets and how its scale is chosen.

    ``scaling`` is one of ``"delayed"``, ``"current"``, ``"block"`` (fp32 scales per tile/block,
    DeepSeek-V3 style), ``"mx"`` (E8M0 scale per 32 values) or ``"nvfp4"``. Roles are
    ``"activation"``, ``"weight"`` (forward format) and ``"gradient"`` (backward format).
    """

    name: str
    scaling: str
    forward_format: str
    backward_format: str
    margin: int = 0
    amax_history_len: int = 1024
    amax_compute_algo: str = "max"
    power_of_two: bool = False
    activation_block: tuple[int, ...] | int | None = None
    weight_block: tuple[int, ...] | int | None = None
    gradient_block: tuple[int, ...] | int | None = None
    scale_rounding: str = "ceil"
    description: str = field(default="", compare=False)

    def format_for(self, role: str) -> Format:
        """Format of a tensor role (``"activation"``, ``"weight"``, ``"gradient"``)."""
        r = parse_name(role, ("activation", "weight", "gradient"), "role")
        return as_format(self.backward_format if r == "gradient" else self.forward_format)

    def block_for(self, role: str) -> tuple[int, ...] | int | None:
        """Block shape of a role (None for per-tensor recipes)."""
        role = parse_name(role, ("activation", "weight", "gradient"), "role")
        return {"activation": self.activation_block, "weight": self.weight_block,
                "gradient": self.gradient_block}[role]

    def scaler(self, role: str) -> DelayedScaling | CurrentScaling:
        """A fresh per-tensor scaling object for ``role`` (delayed and current recipes only)."""
        fmt = self.format_for(role)
        if self.scaling == "delayed":
            return DelayedScaling(fmt, margin=self.margin, amax_history_len=self.amax_history_len,
                                  amax_compute_algo=self.amax_compute_algo)
        if self.scaling == "current":
            return CurrentScaling(fmt, power_of_two=self.power_of_two, margin=self.margin)
        raise ValueError(f"recipe {self.name!r} uses {self.scaling} scaling, which has no per-tensor scaler; "
                         "use quantize/scale_and_quantize with block=, or mx_quantize / nvfp4_quantize")


recipes: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe("delayed_hybrid", "delayed", "fp8_e4m3", "fp8_e5m2",
               description="TE DelayedScaling default: HYBRID, history 1024, max, margin 0"),
        Recipe("delayed_e4m3", "delayed", "fp8_e4m3", "fp8_e4m3", description="DelayedScaling with E4M3 everywhere"),
        Recipe("current_hybrid", "current", "fp8_e4m3", "fp8_e5m2",
               description="TE Float8CurrentScaling default: per-tensor scale from the current amax"),
        Recipe("current_e4m3", "current", "fp8_e4m3", "fp8_e4m3", description="current scaling, E4M3 everywhere"),
        Recipe("current_hybrid_pow2", "current", "fp8_e4m3", "fp8_e5m2", power_of_two=True,
               description="current scaling with power-of-two scales"),
        Recipe("block_fp8", "block", "fp8_e4m3", "fp8_e4m3", power_of_two=True,
               activation_block=(1, 128), weight_block=(128, 128), gradient_block=(1, 128),
               description="TE Float8BlockScaling / DeepSeek-V3: 1x128 tiles, 128x128 weight blocks, pow-2 fp32 scales"),
        Recipe("mxfp8", "mx", "fp8_e4m3", "fp8_e4m3", activation_block=32, weight_block=32, gradient_block=32,
               scale_rounding="ceil", description="TE MXFP8BlockScaling: E8M0 scale per 32, exponent rounded up"),
        Recipe("mxfp8_ocp", "mx", "fp8_e4m3", "fp8_e4m3", activation_block=32, weight_block=32, gradient_block=32,
               scale_rounding="floor", description="OCP MX v1.0 MXFP8: shared exponent floor(log2 amax) - emax"),
        Recipe("mxfp8_hybrid_ocp", "mx", "fp8_e4m3", "fp8_e5m2", activation_block=32, weight_block=32,
               gradient_block=32, scale_rounding="floor", description="OCP MXFP8 with E5M2 gradients"),
        Recipe("mxfp6_ocp", "mx", "fp6_e2m3", "fp6_e3m2", activation_block=32, weight_block=32, gradient_block=32,
               scale_rounding="floor", description="OCP MXFP6"),
        Recipe("mxfp4_ocp", "mx", "fp4_e2m1", "fp4_e2m1", activation_block=32, weight_block=32, gradient_block=32,
               scale_rounding="floor", description="OCP MXFP4"),
        Recipe("nvfp4", "nvfp4", "fp4_e2m1", "fp4_e2m1", activation_block=16, weight_block=(16, 16),
               gradient_block=16, description="NVFP4: E2M1 x 16 with E4M3 block scales and an fp32 tensor scale"),
    )
}
"""The usual recipes by name (see :class:`Recipe`)."""


@ieee_mode
def get_recipe(name: str | Recipe) -> Recipe:
    """Look up a recipe by name (or pass a `Recipe` through).

    >>> get_recipe("delayed_hybrid").format_for("gradient").name
    'fp8_e5m2'
    """
    if isinstance(name, Recipe):
        return name
    return recipes[parse_name(name, recipes, "recipe")]


