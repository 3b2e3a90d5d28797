"""`FPArray`: a NumPy-protocol array whose every result is rounded into its floating-point format.

Write ordinary NumPy code "in bf16" and watch what happens::

    >>> import numpy as np, fpsim
    >>> x = fpsim.array([1.0, 2.0, 3.0], "bf16")
    >>> x / 3
    FPArray(bf16, [0.333984375, 0.66796875, 1.0])
    >>> np.sum(fpsim.array(np.ones(1000), "bf16"))      # a sequential bf16 running sum
    FPArray(bf16, 256.0)

Semantics
---------
* Values travel as float64 carriers holding values of the format exactly (``np.asarray(x)``).
* ``+ - * /``, ``np.sqrt``, ``np.square``, ``np.reciprocal`` and :func:`fpsim.fma` are correctly rounded
  (IEEE 754 operations of the format, in the array's rounding mode); unary minus, ``abs``, ``np.maximum``,
  ``np.minimum``, ``np.copysign``, ``np.floor``/``ceil``/``trunc``/``rint`` are exact.
* Comparisons (``== < <= ...``), ``np.isnan``/``isinf``/``isfinite``/``signbit`` are exact and return
  plain boolean arrays.
* Other float ufuncs (``exp, log, tanh, sin, power, arctan2, ...``) are evaluated in float64 on the exact
  operands and rounded once: *faithful* (within one unit in the last place of the format, and almost
  always correctly rounded, since float64's libm is accurate to about one float64 ulp), not guaranteed
  correctly rounded.
* Python numbers and plain arrays mixed with an FPArray are first rounded into its format (as PyTorch
  does with Python scalars).
* **Promotion** of two formats: if every value of one is a value of the other, the result has the wider
  format (``fp8_e4m3 + fp16 -> fp16``, ``bf16 + fp32 -> fp32``); otherwise, if fp32 contains both, the
  result is fp32 (``fp16 + bf16 -> fp32``, as in PyTorch); otherwise ``TypeError``. The rounding mode and
  accumulation settings are those of the operand whose format wins (the first one on a tie).
* ``np.sum``, ``np.mean``, ``np.prod``, ``np.cumsum``, ``np.dot`` and ``@`` use the array's accumulation
  model: ``order`` (``"sequential"`` by default: a naive loop in the array's format; or ``"pairwise"``,
  ``"blocked"``, ``"kahan"``, ``"exact"``) and ``accumulate`` (format of the partial sums; e.g.
  ``"fp32"`` to accumulate in fp32 and round once). Set them in :func:`array` or with
  :meth:`FPArray.with_accumulation`. Dot products use fused multiply-adds (see :func:`fpsim.dot`).
* Indexing, slicing, reshaping, transposing, concatenation, stacking, sorting, ``np.where``,
  ``np.max``/``np.min`` and similar data movement keep the format (values are unchanged).
* NumPy functions fpsim does not model run on the float64 carriers and return plain NumPy results.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

from ._carrier import as_float_array as _as_float_array
from ._fpenv import ieee_mode
from .arith import Context
from .bits import to_bits
from .formats import Format, FormatLike, as_format, fp32
from .rounding import Rounding, RoundingLike, as_rounding

__all__ = ["FPArray", "array", "promote_formats"]

# Sums, dot and matrix products of FPArrays follow the summation orders of fpsim.accumulate, which sits
# one layer above this module: it registers its functions here when it is imported (``import fpsim``
# always imports it), so this module never imports upward.
_REDUCTIONS: dict[str, Callable[..., Any]] = {}


def _register_reductions(**fns: Callable[..., Any]) -> None:
    """Called by fpsim.accumulate: ``sum``, ``matmul``, ``check_order``, ``check_block``."""
    _REDUCTIONS.update(fns)


class _Reductions:
    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            return _REDUCTIONS[name]
        except KeyError:
            raise RuntimeError("fpsim.accumulate is not loaded: import fpsim first") from None


_acc = _Reductions()


def _contains(big: Format, small: Format) -> bool:
    """Every value of ``small`` is a value of ``big`` (so converting into ``big`` is exact)."""
    return big.contains(small)


@ieee_mode
def promote_formats(*fmts: FormatLike) -> Format:
    """The format of a result mixing ``fmts`` (see the module docstring).

    >>> from fpsim.array import promote_formats
    >>> promote_formats("fp8_e4m3", "fp16").name, promote_formats("fp16", "bf16").name
    ('fp16', 'fp32')
    """
    fs = [as_format(f) for f in fmts]
    for cand in fs:
        if all(_contains(cand, f) for f in fs):
            return cand
    if all(_contains(fp32, f) for f in fs):
        return fp32
    names = ", ".join(f.name for f in fs)
    raise TypeError(f"no promotion rule for formats {names}: convert one with .to(fmt) first")


@ieee_mode
class FPArray(NDArrayOperatorsMixin):
    """An array of values of one floating-point format; every result is rounded into that format.

    Create with :func:`fpsim.array`. See the module docstring for the semantics.
    """

    __slots__ = ("_accf", "_block", "_ctx", "_fmt", "_mode", "_order", "_rng", "_v")
    __array_priority__ = 20

    def __init__(self, values: np.ndarray, fmt: Format, mode: Rounding, order: str, accumulate: Format | None,
                 block: int | None, rng: np.random.Generator | None, ctx: Context | None = None) -> None:
        # Internal: `values` must already hold values of `fmt` (use fpsim.array to convert).
        self._v = values
        self._fmt = fmt
        self._mode = mode
        self._order = order
        self._accf = accumulate
        self._block = block
        self._rng = rng
        self._ctx = ctx if ctx is not None else Context(fmt, mode, rng=rng)

    @staticmethod
    def __fpsim_op__(name: str, args: tuple[Any, ...]) -> Any:
        """``fpsim.add(a, b)`` and the others with ``fmt=None`` and an FPArray operand: the operands' format,
        mode and promotion decide (`fpsim.arith` calls this; it does not import this module)."""
        if name == "fma":
            return _fma(*args)
        uf = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide, "sqrt": np.sqrt}[name]
        return uf(*args)

    # -- construction helpers ---------------------------------------------------------------------
    def _new(self, values: np.ndarray, fmt: Format | None = None) -> FPArray:
        if fmt is None or fmt == self._fmt:
            return FPArray(values, self._fmt, self._mode, self._order, self._accf, self._block, self._rng, self._ctx)
        return FPArray(values, fmt, self._mode, self._order, self._accf, self._block, self._rng)

    def with_accumulation(self, order: str | None = None, accumulate: FormatLike | None = None, *,
                          block: int | None = None) -> FPArray:
        """The same values with another accumulation model for sums and dot products.

        >>> import numpy as np, fpsim
        >>> x = fpsim.array(np.ones(1000), "bf16")
        >>> float(np.sum(x)), float(np.sum(x.with_accumulation("pairwise")))
        (256.0, 1000.0)
        >>> float(np.sum(x.with_accumulation(accumulate="fp32")))
        1000.0
        """
        o = _acc.check_order(order) if order is not None else self._order
        a = as_format(accumulate) if accumulate is not None else self._accf
        b = _acc.check_block(block, o) if block is not None else self._block
        return FPArray(self._v, self._fmt, self._mode, o, a, b, self._rng, self._ctx)

    # -- properties -------------------------------------------------------------------------------
    @property
    def format(self) -> Format:
        """The array's format."""
        return self._fmt

    @property
    def rounding(self) -> str:
        """The rounding mode of every operation."""
        return self._mode.value

    @property
    def order(self) -> str:
        """Summation order of ``np.sum``, ``np.dot``, ``@`` (see :func:`fpsim.sum`)."""
        return self._order

    @property
    def accumulate(self) -> Format | None:
        """Format of partial sums (None: the array's format)."""
        return self._accf

    @property
    def values(self) -> np.ndarray:
        """The float64 carrier values (a read-only view)."""
        v = self._v.view()
        v.flags.writeable = False
        return np.asarray(v)

    @property
    def bits(self) -> np.ndarray:
        """The bit patterns of the values (unsigned integers, see :func:`fpsim.to_bits`)."""
        return np.asarray(to_bits(self._v, self._fmt))

    shape = property(lambda self: self._v.shape, doc="Shape of the array.")
    ndim = property(lambda self: self._v.ndim, doc="Number of dimensions.")
    size = property(lambda self: self._v.size, doc="Number of elements.")
    dtype = property(lambda self: self._v.dtype, doc="Dtype of the carrier (float64).")

    @property
    def T(self) -> FPArray:
        return self._new(self._v.T)

    def to(self, fmt: FormatLike, rounding: RoundingLike | None = None) -> FPArray:
        """Convert into another format (one rounding, in ``rounding`` or the array's mode).

        >>> import fpsim
        >>> fpsim.array([1.0, 1.0 + 2**-10], "fp16").to("bf16")
        FPArray(bf16, [1.0, 1.0])
        """
        return array(self._v, fmt, rounding=rounding if rounding is not None else self._mode, order=self._order,
                     accumulate=self._accf, block=self._block, rng=self._rng)

    # -- NumPy protocol ---------------------------------------------------------------------------
    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        if copy:
            return np.array(self._v, dtype=dtype, copy=True)
        return self.values if dtype is None else self._v.astype(dtype)

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        out = kwargs.pop("out", None)
        if method == "reduce":
            return self._reduce_ufunc(ufunc, inputs, out, kwargs)
        if method != "__call__":
            return NotImplemented
        if kwargs:
            raise TypeError(f"FPArray: {ufunc.__name__} keyword(s) {sorted(kwargs)} are not supported")
        owner, fmt = _owner(inputs)
        ctx = _context(owner, fmt)
        name = ufunc.__name__
        if name == "matmul":
            res = _matmul(owner, fmt, inputs[0], inputs[1])
            return _store(res, out, owner, fmt)
        xs = [_carrier(x, fmt, ctx) for x in inputs]
        if name in _PREDICATES:
            with np.errstate(invalid="ignore"):
                r = ufunc(*xs)
            return r if out is None else _store_plain(r, out)
        shape = np.broadcast_shapes(*[x.shape for x in xs])
        flat = [np.ascontiguousarray(np.broadcast_to(x, shape)).reshape(-1) for x in xs]
        fn = _ARITH.get(name)
        with np.errstate(all="ignore"):
            if fn is not None:
                r = fn(ctx, *flat)
            else:
                if not any(t.endswith("->d") for t in ufunc.types) or ufunc.nout != 1:
                    return NotImplemented
                r = ctx.round(np.ascontiguousarray(ufunc(*flat), dtype=np.float64))
        return _store(r.reshape(shape), out, owner, fmt)

    def _reduce_ufunc(self, ufunc: np.ufunc, inputs: tuple[Any, ...], out: Any, kw: dict[str, Any]) -> Any:
        axis = kw.pop("axis", 0)
        keepdims = kw.pop("keepdims", False)
        if kw or out is not None:
            raise TypeError(f"FPArray: {ufunc.__name__}.reduce with {sorted(kw) or ['out']} is not supported")
        x = inputs[0]
        if ufunc is np.add:
            return x.sum(axis=axis, keepdims=keepdims)
        if ufunc is np.multiply:
            return x.prod(axis=axis, keepdims=keepdims)
        if ufunc in (np.maximum, np.minimum, np.fmax, np.fmin):
            return x._new(ufunc.reduce(x._v, axis=axis, keepdims=keepdims))
        return NotImplemented

    def __array_function__(self, func: Callable[..., Any], types: tuple[type, ...], args: tuple[Any, ...],
                           kwargs: dict[str, Any]) -> Any:
        impl = _FUNCS.get(func)
        if impl is not None:
            return impl(*args, **kwargs)
        if func in _MOVE:
            owner, fmt = _owner(_flatten_args(args) + _flatten_args(tuple(kwargs.values())))
            ctx = _context(owner, fmt)
            r = func(*_unwrap(args, fmt, ctx), **_unwrap(kwargs, fmt, ctx))
            return _wrap(r, owner, fmt)
        # not modelled: compute on the float64 carriers, return plain NumPy results
        return func(*_unwrap(args, None, None), **_unwrap(kwargs, None, None))

    # -- array-like methods -----------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._v)

    def __iter__(self) -> Iterator[FPArray]:
        for i in range(len(self._v)):
            yield self[i]

    def __getitem__(self, key: Any) -> FPArray:
        key = _unwrap(key, None, None)
        return self._new(np.asarray(self._v[key]))

    def __setitem__(self, key: Any, value: Any) -> None:
        key = _unwrap(key, None, None)
        self._v[key] = _carrier(value, self._fmt, self._ctx)

    def __float__(self) -> float:
        return float(self._v)

    def __int__(self) -> int:
        return int(self._v)

    def __bool__(self) -> bool:
        return bool(self._v)

    def __repr__(self) -> str:
        if self._v.size <= 64:
            body = repr(self._v.tolist())  # exact values, as Python floats print them
        else:  # summarized, still with round-trip digits
            body = np.array2string(self._v, separator=", ", threshold=64, floatmode="unique", prefix="FPArray(")
        return f"FPArray({self._fmt.name}, {body}" + (f", rounding={self._mode.value!r})" if self._mode is not Rounding.RNE else ")")

    def __str__(self) -> str:
        return f"{np.array2string(self._v)} ({self._fmt.name})"

    def tolist(self) -> Any:
        return self._v.tolist()

    def item(self, *args: Any) -> float:
        return float(self._v.item(*args))

    def copy(self) -> FPArray:
        return self._new(self._v.copy())

    def reshape(self, *shape: Any, **kw: Any) -> FPArray:
        return self._new(self._v.reshape(*shape, **kw))

    def transpose(self, *axes: Any) -> FPArray:
        return self._new(self._v.transpose(*axes))

    def ravel(self) -> FPArray:
        return self._new(self._v.ravel())

    def flatten(self) -> FPArray:
        return self._new(self._v.flatten())

    def squeeze(self, axis: Any = None) -> FPArray:
        return self._new(self._v.squeeze(axis))

    def astype(self, fmt: FormatLike) -> FPArray:
        """Alias of :meth:`to` (the argument is a format, not a NumPy dtype)."""
        return self.to(fmt)

    def sum(self, axis: Any = None, keepdims: bool = False) -> FPArray:
        """Sum with the array's accumulation model (see :func:`fpsim.sum`)."""
        r = _acc.sum(self._v, self._fmt, order=self._order, block=self._block if self._order == "blocked" else None,
                     accumulate=self._accf, rounding=self._mode, axis=axis, keepdims=keepdims, rng=self._rng)
        return self._new(np.asarray(r, dtype=np.float64))

    def mean(self, axis: Any = None, keepdims: bool = False) -> FPArray:
        """The sum (array's accumulation model) divided by the exact count, one rounding."""
        s = self.sum(axis=axis, keepdims=keepdims)
        n = self._v.size // max(s._v.size, 1) if self._v.size else 0
        return s._new(self._ctx.div(np.ascontiguousarray(s._v, dtype=np.float64).reshape(-1),
                                    np.full(s._v.size, float(n))).reshape(s._v.shape))

    def prod(self, axis: Any = None, keepdims: bool = False) -> FPArray:
        """Product, a sequential loop of correctly rounded multiplications."""
        v = self._v
        if axis is None:
            v, axis = v.reshape(-1), 0
        t = np.moveaxis(v, axis, 0)
        r: np.ndarray = np.ones(t.shape[1:]).reshape(-1)
        for i in range(t.shape[0]):
            r = self._ctx.mul(r, np.ascontiguousarray(t[i]).reshape(-1), exact_inputs=True)
        r = r.reshape(t.shape[1:])
        if keepdims:
            r = np.expand_dims(r, axis)
        return self._new(r)

    def cumsum(self, axis: Any = None) -> FPArray:
        """Running sums (every partial of a sequential sum, in the accumulator format, then rounded)."""
        v = self._v.reshape(-1) if axis is None else self._v
        ax = 0 if axis is None else axis
        t = np.moveaxis(v, ax, 0)
        acc = Context(self._accf, self._mode, rng=self._rng) if self._accf is not None else self._ctx
        outs = np.empty(t.shape)
        if t.shape[0]:
            s = acc.round(np.ascontiguousarray(t[0]).reshape(-1))
            outs[0] = s.reshape(t.shape[1:])
            for i in range(1, t.shape[0]):
                s = acc.add(s, acc.round(np.ascontiguousarray(t[i]).reshape(-1)), exact_inputs=True)
                outs[i] = s.reshape(t.shape[1:])
        r = self._ctx.round(np.ascontiguousarray(outs))
        return self._new(np.moveaxis(r, 0, ax))

    def max(self, axis: Any = None, keepdims: bool = False) -> FPArray:
        return self._new(np.asarray(np.max(self._v, axis=axis, keepdims=keepdims)))

    def min(self, axis: Any = None, keepdims: bool = False) -> FPArray:
        return self._new(np.asarray(np.min(self._v, axis=axis, keepdims=keepdims)))

    def dot(self, other: Any) -> FPArray:
        return _np_dot(self, other)


# --------------------------------------------------------------------------------------------------
# Helpers


def _flatten_args(args: tuple[Any, ...]) -> tuple[Any, ...]:
    out: list[Any] = []
    for a in args:
        if isinstance(a, (list, tuple)):
            out.extend(_flatten_args(tuple(a)))
        else:
            out.append(a)
    return tuple(out)


def _owner(inputs: tuple[Any, ...]) -> tuple[FPArray, Format]:
    arrs = [x for x in _flatten_args(inputs) if isinstance(x, FPArray)]
    fmt = promote_formats(*[a._fmt for a in arrs]) if len({a._fmt for a in arrs}) > 1 else arrs[0]._fmt
    owner = next((a for a in arrs if a._fmt == fmt), arrs[0])
    return owner, fmt


def _context(owner: FPArray, fmt: Format) -> Context:
    """The owner's arithmetic context, or a new one in its mode when promotion changed the format."""
    return owner._ctx if owner._fmt == fmt else Context(fmt, owner._mode, rng=owner._rng)


def _carrier(x: Any, fmt: Format, ctx: Context) -> np.ndarray:
    """Float64 values of fmt: FPArrays converted exactly (promotion), anything else rounded into fmt."""
    if isinstance(x, FPArray):
        if x._fmt == fmt or _contains(fmt, x._fmt):
            return x._v
        return ctx.round(np.ascontiguousarray(x._v))
    a, _ = _as_float_array(x)
    return ctx.round(np.ascontiguousarray(a, dtype=np.float64).reshape(-1)).reshape(np.shape(a))


def _unwrap(obj: Any, fmt: Format | None, ctx: Context | None) -> Any:
    if isinstance(obj, FPArray):
        return obj._v if fmt is None or ctx is None else _carrier(obj, fmt, ctx)
    if isinstance(obj, tuple):
        return tuple(_unwrap(o, fmt, ctx) for o in obj)
    if isinstance(obj, list):
        return [_unwrap(o, fmt, ctx) for o in obj]
    if isinstance(obj, dict):
        return {k: _unwrap(v, fmt, ctx) for k, v in obj.items()}
    return obj


def _wrap(r: Any, owner: FPArray, fmt: Format) -> Any:
    if isinstance(r, np.ndarray) and r.dtype.kind == "f":
        return owner._new(np.asarray(r, dtype=np.float64), fmt)
    if isinstance(r, np.floating):
        return owner._new(np.asarray(r, dtype=np.float64), fmt)
    if isinstance(r, (list, tuple)):
        return type(r)(_wrap(x, owner, fmt) for x in r)
    return r


def _store(r: np.ndarray, out: Any, owner: FPArray, fmt: Format) -> Any:
    if out is None:
        return owner._new(np.asarray(r, dtype=np.float64), fmt)
    target = out[0] if isinstance(out, tuple) else out
    if not isinstance(target, FPArray):
        raise TypeError("FPArray: out= must be an FPArray")
    target[...] = owner._new(np.asarray(r, dtype=np.float64), fmt)
    return target


def _store_plain(r: np.ndarray, out: Any) -> Any:
    target = out[0] if isinstance(out, tuple) else out
    target[...] = r
    return target


def _fma(a: Any, b: Any, c: Any) -> FPArray:
    owner, fmt = _owner((a, b, c))
    ctx = _context(owner, fmt)
    xs = [_carrier(x, fmt, ctx) for x in (a, b, c)]
    shape = np.broadcast_shapes(*[x.shape for x in xs])
    flat = [np.ascontiguousarray(np.broadcast_to(x, shape)).reshape(-1) for x in xs]
    return owner._new(ctx.fma(*flat, exact_inputs=True).reshape(shape), fmt)


def _ex(f: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    """An exact operation: its result is a value of the format up to -0 in formats without it."""
    return lambda ctx, *xs: ctx.round(np.ascontiguousarray(f(*xs)))


_ARITH: dict[str, Callable[..., np.ndarray]] = {
    "add": lambda ctx, a, b: ctx.add(a, b, exact_inputs=True),
    "subtract": lambda ctx, a, b: ctx.sub(a, b, exact_inputs=True),
    "multiply": lambda ctx, a, b: ctx.mul(a, b, exact_inputs=True),
    "divide": lambda ctx, a, b: ctx.div(a, b, exact_inputs=True),
    "true_divide": lambda ctx, a, b: ctx.div(a, b, exact_inputs=True),
    "sqrt": lambda ctx, a: ctx.sqrt(a, exact_inputs=True),
    "square": lambda ctx, a: ctx.mul(a, a, exact_inputs=True),
    "reciprocal": lambda ctx, a: ctx.div(np.ones_like(a), a, exact_inputs=True),
    "negative": _ex(np.negative),
    "positive": _ex(np.positive),
    "absolute": _ex(np.absolute),
    "fabs": _ex(np.fabs),
    "maximum": _ex(np.maximum),
    "minimum": _ex(np.minimum),
    "fmax": _ex(np.fmax),
    "fmin": _ex(np.fmin),
    "copysign": _ex(np.copysign),
    "floor": _ex(np.floor),
    "ceil": _ex(np.ceil),
    "trunc": _ex(np.trunc),
    "rint": _ex(np.rint),
    "sign": _ex(np.sign),
}
_PREDICATES = {
    "equal", "not_equal", "less", "less_equal", "greater", "greater_equal", "isnan", "isinf", "isfinite",
    "signbit", "logical_and", "logical_or", "logical_xor", "logical_not",
}


def _matmul(owner: FPArray, fmt: Format, a: Any, b: Any) -> np.ndarray:
    ctx = _context(owner, fmt)
    x, y = _carrier(a, fmt, ctx), _carrier(b, fmt, ctx)
    order = owner._order
    r = _acc.matmul(x, y, fmt, order=order, block=owner._block if order == "blocked" else None,
                    accumulate=owner._accf, rounding=owner._mode, rng=owner._rng)
    return np.asarray(r, dtype=np.float64)


def _np_dot(a: Any, b: Any, out: Any = None) -> FPArray:
    owner, fmt = _owner((a, b))
    nd = [np.ndim(a), np.ndim(b)]
    if 0 in nd:
        return np.multiply(a, b)  # type: ignore[no-any-return]
    if max(nd) > 2:
        raise TypeError("FPArray: np.dot supports 1-D and 2-D operands; use @ (matmul) for stacks")
    return _store(_matmul(owner, fmt, a, b), out, owner, fmt)  # type: ignore[no-any-return]


def _np_reduction(name: str) -> Callable[..., Any]:
    """``np.sum``/``np.mean``/``np.prod`` of an FPArray: its method of that name (axis and keepdims only)."""

    def f(a: Any, axis: Any = None, dtype: Any = None, out: Any = None, keepdims: bool = False, **kw: Any) -> Any:
        if dtype is not None or kw:
            raise TypeError(f"FPArray: np.{name} supports axis and keepdims only")
        return _store(getattr(a, name)(axis=axis, keepdims=keepdims)._v, out, a, a._fmt)

    return f


def _np_cumsum(a: Any, axis: Any = None, dtype: Any = None, out: Any = None) -> Any:
    if dtype is not None:
        raise TypeError("FPArray: np.cumsum supports axis only")
    return _store(a.cumsum(axis=axis)._v, out, a, a._fmt)


def _like(fill: float | None) -> Callable[..., FPArray]:
    def f(a: FPArray, fill_value: Any = None, dtype: Any = None, order: Any = "K", subok: bool = True,
          shape: Any = None, **kw: Any) -> FPArray:
        v = fill if fill is not None else (0.0 if fill_value is None else fill_value)
        base = np.full(a.shape if shape is None else shape, v, dtype=np.float64)
        return a._new(a._ctx.round(base))
    return f


def _np_clip(a: Any, a_min: Any = None, a_max: Any = None, out: Any = None, **kw: Any) -> Any:
    owner, fmt = _owner((a,))
    lo = None if a_min is None else _carrier(a_min, fmt, owner._ctx)
    hi = None if a_max is None else _carrier(a_max, fmt, owner._ctx)
    return _store(np.clip(owner._v, lo, hi), out, owner, fmt)


_FUNCS: dict[Callable[..., Any], Callable[..., Any]] = {
    np.sum: _np_reduction("sum"),
    np.mean: _np_reduction("mean"),
    np.prod: _np_reduction("prod"),
    np.cumsum: _np_cumsum,
    np.dot: _np_dot,
    np.zeros_like: _like(0.0),
    np.ones_like: _like(1.0),
    np.full_like: _like(None),
    np.empty_like: _like(0.0),
    np.clip: _np_clip,
}
# Data movement: values are unchanged, the format is kept.
_MOVE = {
    np.concatenate, np.stack, np.vstack, np.hstack, np.dstack, np.column_stack, np.reshape, np.transpose,
    np.ravel, np.squeeze, np.expand_dims, np.swapaxes, np.moveaxis, np.copy, np.flip, np.fliplr, np.flipud,
    np.sort, np.broadcast_to, np.atleast_1d, np.atleast_2d, np.atleast_3d, np.tile, np.repeat, np.roll,
    np.take, np.diagonal, np.diag, np.triu, np.tril, np.max, np.min, np.amax, np.amin, np.where, np.split,
    np.array_split, np.take_along_axis, np.rot90, np.pad, np.nanmax, np.nanmin, np.median, np.select,
}
_MOVE.discard(np.median)  # the mean of two middle values would need a rounding


@ieee_mode
def array(
    values: Any,
    fmt: FormatLike,
    *,
    rounding: RoundingLike = "rne",
    order: str = "sequential",
    accumulate: FormatLike | None = None,
    block: int | None = None,
    rng: np.random.Generator | None = None,
) -> FPArray:
    """Values rounded into ``fmt``, as an :class:`FPArray` whose every result is rounded into ``fmt``.

    Parameters
    ----------
    values : array_like
        Values to convert (rounded once into ``fmt`` with ``rounding``); an FPArray is converted.
    fmt : Format or str
        The array's format (every registered format up to fp32; fp64 with ``"rne"``).
    rounding : str
        Rounding mode of the conversion and of every operation on the array.
    order, accumulate, block
        Accumulation model of ``np.sum``, ``np.dot``, ``@`` (see :func:`fpsim.sum`).
    rng : numpy.random.Generator, optional
        Random bits for ``rounding="sr"``.

    Examples
    --------
    >>> import numpy as np, fpsim
    >>> x = fpsim.array([0.1, 0.2], "fp16")
    >>> x
    FPArray(fp16, [0.0999755859375, 0.199951171875])
    >>> (x[0] + x[1]).bits, x.format.name
    (array(13516, dtype=uint16), 'fp16')
    >>> x @ x                      # fp16 fused multiply-adds
    FPArray(fp16, 0.04998779296875)
    """
    f = as_format(fmt)
    mode = as_rounding(rounding)
    o = _acc.check_order(order)
    acc = as_format(accumulate) if accumulate is not None else None
    blk = _acc.check_block(block, o) if block is not None else None
    ctx = Context(f, mode, rng=rng)
    if isinstance(values, FPArray):
        values = values._v
    a, _ = _as_float_array(values, "values")
    v = ctx.round(np.array(a, dtype=np.float64, copy=True))
    return FPArray(np.asarray(v, dtype=np.float64), f, mode, o, acc, blk, rng, ctx)
