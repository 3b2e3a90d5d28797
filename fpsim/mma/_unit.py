"""The matrix-unit protocol: what the GEMM executor (:mod:`fpsim.mma.gemm`) asks of a model's family.

A *matrix unit* is one family of data paths (NVIDIA block FMA, the generic ``wide`` / ``fma_chain`` /
``pairwise`` chains, the exact dot product, AMD MFMA, Blackwell block-scaled MMA). A model (an
:class:`~fpsim.mma.MMAModel` or a :class:`~fpsim.mma.BlockScaledModel`) is data: its parameters. Its unit is
behaviour: one object per family implementing :class:`MatrixUnit`, reached through the model's private
``_unit`` attribute (an :class:`~fpsim.mma.MMAModel` finds it by its ``kind`` in :data:`_UNITS`, which the
family modules fill with :func:`register_unit` on import). The executor converts, batches, pads, tiles and
promotes, and calls the unit for everything that depends on the family; it never asks which family it holds.

This module sits at the bottom of :mod:`fpsim.mma`: it imports nothing of fpsim, and every family module
(``_bfma``, ``_generic``, ``_exact``, ``amd``, ``blockscaled``) imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

__all__ = ["BFMAKernel", "MatrixUnit", "UnitBase", "register_unit", "unit_for"]


@dataclass(frozen=True)
class BFMAKernel:
    """What the compiled block-FMA GEMM (``fpsim/_cgemm.c``, ``bfma_gemm``) needs for one model.

    Attributes
    ----------
    params : tuple of int
        The kernel's parameter tuple (block size, grid bits, rounding, output limits, ...).
    instruction_k : int
        Products per instruction; promotion groups and the padded K are multiples of it.
    order : callable or None
        ``order(kp)``: the permutation of K (padded to whole instructions, length ``kp``) in which the kernel
        takes the products, or None for index order (then a last, partial block is taken as it is).
    """

    params: tuple[int, ...]
    instruction_k: int
    order: Callable[[int], np.ndarray] | None = None


class MatrixUnit(Protocol):
    """One matrix-unit family, as the executor sees it. Every method takes the model (the family's data).

    The executor's shared path converts A and B to the model's input formats, turns them into carrier arrays
    (:meth:`carrier`) with int16 exponents, pads K (:meth:`pad_to`), cuts the outputs into tiles sized by
    :attr:`blockwise` and :meth:`terms_held`, and hands each tile's term arrays (K along axis 0) to
    :meth:`reference`. Compiled kernels run instead where :meth:`bfma_kernel` or :meth:`generic_kernel`
    describe the model; a family with an executor of its own (:attr:`own_matmul`) runs :meth:`matmul` whole.
    """

    #: True when the family runs the whole of :func:`fpsim.matmul` itself (:meth:`matmul`).
    own_matmul: bool
    #: True when :meth:`reference` walks K one instruction at a time (tiles sized for one instruction's
    #: products); False when it holds every product of the chain at once.
    blockwise: bool

    def matmul(self, model: Any, A: Any, B: Any, C: Any, promote_every: int | None, scales: Any,
               input_rounding: str | None) -> Any:
        """The whole of :func:`fpsim.matmul` for a family with its own executor (:attr:`own_matmul`)."""

    def k_step(self, model: Any) -> int:
        """Products per instruction: ``promote_every`` and scale groups must be multiples of it (1: any)."""

    def pad_to(self, model: Any, promote_every: int | None) -> int:
        """The multiple the NumPy reference pads K to with zero products (1: no padding)."""

    def carrier(self, model: Any) -> type[np.floating[Any]]:
        """The dtype the reference carries input values in (exact products)."""

    def terms_held(self, model: Any, k: int) -> int:
        """Products the reference holds per output at once for a chain of `k` products."""

    def operand_range(self, a: np.ndarray, b: np.ndarray, model: Any) -> tuple[int, int] | None:
        """What the reference needs to know of the operands beforehand (the exact sum's bit range), or None."""

    def shortcut(self, a: np.ndarray, b: np.ndarray, c: np.ndarray, model: Any, elems: int) -> np.ndarray | None:
        """A faster route with the same bits for a finite, unpromoted 2-D GEMM ``c + a @ b``, or None.

        `elems`: the executor's memory budget (float64 elements held at once)."""

    def reference(self, x: np.ndarray, y: np.ndarray, ex: np.ndarray, ey: np.ndarray, c: np.ndarray,
                  model: Any, has_specials: bool, lsb_top: tuple[int, int] | None) -> np.ndarray:
        """The NumPy reference: D (float64) for the products ``x*y`` over all K (axis 0) and addends `c`."""

    def bfma_kernel(self, model: Any) -> BFMAKernel | None:
        """The compiled block-FMA kernel's description for `model`, or None (it does not apply)."""

    def generic_kernel(self, model: Any) -> tuple[int, ...] | None:
        """Parameters of the compiled generic chain kernel (``generic_gemm``), or None (it does not apply)."""


class UnitBase:
    """Defaults for :class:`MatrixUnit`: no own executor, no padding, float64 carriers, no compiled kernel.

    A family subclasses it and overrides :meth:`reference` (and whatever else differs).
    """

    own_matmul: bool = False
    blockwise: bool = False

    def matmul(self, model: Any, A: Any, B: Any, C: Any, promote_every: int | None, scales: Any,
               input_rounding: str | None) -> Any:
        raise NotImplementedError(f"{type(self).__name__} runs on the shared GEMM executor")

    def k_step(self, model: Any) -> int:
        return 1

    def pad_to(self, model: Any, promote_every: int | None) -> int:
        return 1

    def carrier(self, model: Any) -> type[np.floating[Any]]:
        return np.float64

    def terms_held(self, model: Any, k: int) -> int:
        return k

    def operand_range(self, a: np.ndarray, b: np.ndarray, model: Any) -> tuple[int, int] | None:
        return None

    def shortcut(self, a: np.ndarray, b: np.ndarray, c: np.ndarray, model: Any, elems: int) -> np.ndarray | None:
        return None

    def reference(self, x: np.ndarray, y: np.ndarray, ex: np.ndarray, ey: np.ndarray, c: np.ndarray,
                  model: Any, has_specials: bool, lsb_top: tuple[int, int] | None) -> np.ndarray:
        raise NotImplementedError(f"{type(self).__name__} has no NumPy reference")

    def bfma_kernel(self, model: Any) -> BFMAKernel | None:
        return None

    def generic_kernel(self, model: Any) -> tuple[int, ...] | None:
        return None


#: The unit of each :class:`~fpsim.mma.MMAModel` kind, filled by the family modules on import.
_UNITS: dict[str, MatrixUnit] = {}


def register_unit(kinds: tuple[str, ...], unit: MatrixUnit) -> None:
    """Make `unit` the matrix unit of the :class:`~fpsim.mma.MMAModel` kinds `kinds` (a family module's job)."""
    for kind in kinds:
        _UNITS[kind] = unit


def unit_for(kind: str) -> MatrixUnit:
    """The matrix unit registered for an :class:`~fpsim.mma.MMAModel` kind."""
    try:
        return _UNITS[kind]
    except KeyError:
        raise ValueError(f"no matrix unit is registered for the model kind {kind!r} (import fpsim.mma)") from None
