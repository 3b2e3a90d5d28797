"""``fpsim.amp.autocast``: torch's ``autocast`` context manager for ``fpsim.nn`` forward calls.

Inside ``with autocast("bf16"):`` every ``fpsim.nn`` forward call given no ``prec=`` (``gpt_forward``,
``linear_forward``, ``attention_forward``) computes under the policy that reproduces torch's autocast op
lists for that format: GEMMs (torch's ``lower_precision_fp`` list: ``linear``, ``matmul``, ``bmm``, ...)
round both operands to the low format, multiply with FP32 accumulation and round the result once; ops on
the FP32 list keep FP32; the residual add promotes to the widest input (FP32); the others run in the
format of their input. The weights stay what they are (FP32: autocast casts them at each use, as torch's
cast cache does within one forward).

How it reaches the layers without ``fpsim.nn`` (layer L3) importing ``fpsim.amp`` (L4): ``nn.precision``
holds a context variable, :func:`fpsim.nn.precision.current_precision`, which forward calls consult when
``prec`` is None; ``autocast`` sets it on entry and resets it on exit. A context variable is per thread
and per asyncio task, so autocasts nest and do not leak across threads; ``enabled=False`` sets
:data:`fpsim.nn.FULL` (no rounding: FP32 carriers stay FP32) for its block. An explicit ``prec=`` always
wins over the context.

Op lists (fpsim op name -> how torch 2.13's autocast treats it; see ``docs/amp.md`` for torch's lists):

============== ================= ================= =====================================================
fpsim op       CUDA              CPU               result in the GPT
============== ================= ================= =====================================================
linear, attn,  lower_precision   lower_precision   low format (operands rounded, FP32 accumulation)
lm_head
layernorm      fp32              (none: input's)   FP32 (its input, the residual stream, is FP32)
softmax        fp32              (none: input's)   CUDA FP32; CPU low (its input, the scores, is low)
cross_entropy  fp32              fp32              FP32
residual       promote (add)     promote (add)     FP32 (FP32 stream + low branch)
embedding      (none: input's)   (none: input's)   FP32 (the weight is FP32)
gelu, scale    (none: input's)   (none: input's)   low (their input is a GEMM output)
============== ================= ================= =====================================================

>>> import numpy as np
>>> from fpsim.amp import autocast
>>> from fpsim.nn import linear_forward
>>> x, w = np.float32([[1.0, 1.0]]), np.float32([[1 + 2**-10], [1.0]])
>>> float(linear_forward(x, w, None)[0][0, 0])             # FP32
2.0009765625
>>> with autocast("bf16"):
...     float(linear_forward(x, w, None)[0][0, 0])         # w rounded to bf16, result rounded to bf16
2.0
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

from .._fpenv import ieee_mode
from .._names import parse_name
from ..formats import Format, as_format
from ..nn import precision as _nnprec
from .policy import FP32_OPS, Policy, get_policy

__all__ = ["AUTOCAST_DEVICES", "OP_LISTS", "autocast", "autocast_policy"]

F = TypeVar("F", bound=Callable[..., Any])

#: Devices whose op lists autocast reproduces.
AUTOCAST_DEVICES = ("cuda", "cpu")

#: fpsim op (or GEMM kind) -> torch 2.13 autocast's treatment, per device: ``"lower_precision_fp"``,
#: ``"fp32"``, ``"promote"``, or ``"input"`` (on no list: runs in its input's format).
OP_LISTS: dict[str, dict[str, str]] = {
    "cuda": {"linear": "lower_precision_fp", "attn": "lower_precision_fp", "lm_head": "lower_precision_fp",
             "layernorm": "fp32", "softmax": "fp32", "cross_entropy": "fp32", "residual": "promote",
             "embedding": "input", "gelu": "input", "scale": "input"},
    "cpu": {"linear": "lower_precision_fp", "attn": "lower_precision_fp", "lm_head": "lower_precision_fp",
            "layernorm": "input", "softmax": "input", "cross_entropy": "fp32", "residual": "promote",
            "embedding": "input", "gelu": "input", "scale": "input"},
}

#: The ops whose output is FP32 in the GPT under each device's lists (the policy's ``fp32_ops``): the
#: FP32-listed ones, the promoted residual add, and the "input" ops whose input is FP32 there.
_FP32_IN_GPT = {"cuda": FP32_OPS, "cpu": FP32_OPS - {"softmax"}}


def _dtype(dtype: object) -> Format:
    """``"bf16"``/``"fp16"`` (any alias fpsim's formats accept, e.g. ``"bfloat16"``, or a torch dtype)."""
    name = dtype
    mod = type(dtype).__module__
    if mod.startswith("torch"):            # torch.bfloat16 -> "bfloat16" (without importing torch)
        name = str(dtype).rsplit(".", 1)[-1]
    try:
        fmt = as_format(name) if isinstance(name, (str, Format)) else None
    except ValueError:
        fmt = None
    if fmt is None or fmt.name not in ("bf16", "fp16"):
        if not isinstance(name, (str, Format)):
            raise TypeError(f"autocast dtype must be 'bf16' or 'fp16' (or a Format), got {type(dtype).__name__}: "
                            f"{dtype!r}")
        raise ValueError(f"autocast dtype must be one of bf16, fp16 (as torch's autocast), got {dtype!r}")
    return fmt


@ieee_mode
def autocast_policy(dtype: object = "bf16", device_type: str = "cuda") -> Policy:
    """The policy ``autocast(dtype, device_type=...)`` computes under.

    ``bf16``/``cuda`` is the registered ``"bf16-mixed"``, ``fp16``/``cuda`` is apex's ``"O1"`` (the same
    formats as ``"fp16-mixed"``); the CPU lists differ only in softmax (on no CPU list: its low input
    keeps it low).

    >>> autocast_policy("fp16").name, autocast_policy("bf16", "cpu").name
    ('O1', 'autocast-cpu-bf16')
    """
    fmt = _dtype(dtype)
    dev = parse_name(device_type, AUTOCAST_DEVICES, "autocast device_type")
    base = get_policy("bf16-mixed" if fmt.name == "bf16" else "O1")
    if dev == "cuda":
        return base
    return base.replace(name=f"autocast-cpu-{fmt.name}", fp32_ops=_FP32_IN_GPT["cpu"],
                        description=f"torch CPU autocast({fmt.name}) op lists: GEMMs in {fmt.name}, softmax in "
                                    "its input's format, cross-entropy in FP32")


@ieee_mode
class autocast:  # noqa: N801 - torch's name
    """Context manager (and decorator) under which ``fpsim.nn`` forward calls use torch's autocast lists.

    Parameters
    ----------
    dtype : "bf16" or "fp16"
        The low format (torch's ``dtype``; ``torch.bfloat16``/``torch.float16`` and ml_dtypes' names are
        accepted). Default bf16.
    enabled : bool
        False: the block computes without rounding (FP32 carriers stay FP32), also inside an enabled one.
    device_type : "cuda" or "cpu"
        Whose op lists (they differ for softmax; see the module docstring). Default ``"cuda"``.
    seed : int
        Seed of the runtime's generator (used only by a stochastic-rounding policy).

    Attributes
    ----------
    policy : Policy
        :func:`autocast_policy` of the arguments.
    runtime : PolicyRuntime
        The precision object the forward calls receive (its telemetry, ``stats``, is readable); one per
        ``autocast`` object, shared by every block it opens.

    Notes
    -----
    Blocks opened with one object nest (a stack of context tokens); concurrent threads or asyncio tasks
    should each open their own ``autocast(...)`` (as with torch's), while the decorator form is safe to
    call concurrently (each call sets and resets its own token).

    Examples
    --------
    Nesting, and ``enabled=False`` restoring FP32:

    >>> import numpy as np
    >>> from fpsim.nn.precision import current_precision, FULL
    >>> with autocast("fp16") as ac:
    ...     inner = current_precision() is ac.runtime
    ...     with autocast(enabled=False):
    ...         off = current_precision() is FULL
    >>> inner, off, current_precision() is FULL
    (True, True, True)
    """

    def __init__(self, dtype: object = "bf16", enabled: bool = True, *, device_type: str = "cuda",
                 seed: int = 0) -> None:
        if not isinstance(enabled, bool):
            raise TypeError(f"autocast enabled must be a bool, got {type(enabled).__name__}: {enabled!r}")
        self.enabled = enabled
        self.device_type = parse_name(device_type, AUTOCAST_DEVICES, "autocast device_type")
        self.dtype = _dtype(dtype)
        self.policy = autocast_policy(self.dtype, self.device_type)
        self.runtime = self.policy.runtime(seed=seed)
        self._tokens: list[contextvars.Token[Any]] = []

    def __enter__(self) -> autocast:
        self._tokens.append(_nnprec._AMBIENT.set(self.runtime if self.enabled else _nnprec.FULL))
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        _nnprec._AMBIENT.reset(self._tokens.pop())

    def __call__(self, func: F) -> F:
        """Use as a decorator: ``@autocast("bf16")`` runs every call of ``func`` inside the context."""
        if not callable(func):
            raise TypeError(f"autocast decorates a callable, got {type(func).__name__}")

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            token = _nnprec._AMBIENT.set(self.runtime if self.enabled else _nnprec.FULL)  # per call: threads
            try:
                return func(*args, **kwargs)
            finally:
                _nnprec._AMBIENT.reset(token)

        return wrapper  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"autocast(dtype={self.dtype.name!r}, enabled={self.enabled}, device_type={self.device_type!r})"
