"""Arrays from other libraries in, the same kind out: the one converter at fpsim's API edge.

Input (:func:`host_array`, called first by ``_carrier.as_float_array``, which every entry point uses):

- NumPy and ml_dtypes arrays, NumPy scalars, Python numbers, lists: passed through unchanged (no copy).
- torch CPU tensors of every dtype. Floating dtypes that NumPy lacks (bfloat16, the float8 types,
  float8_e8m0fnu, float4_e2m1fn_x2) are read through their bit patterns: ``t.view(torch.uint8 or
  torch.int16)`` -> NumPy -> ``.view(<the ml_dtypes type>)``, never through a cast, so every value,
  NaN and signed zero arrives exactly. ``float4_e2m1fn_x2`` packs two values in a byte: the low nibble
  is the first element, so a shape ``(..., n)`` tensor reads as ``(..., 2 * n)`` values.
- JAX arrays on CPU (``np.asarray``: bfloat16 and float8 arrive as ml_dtypes types).
- Array API arrays (``array_api_strict`` ...) and any other object with ``__dlpack__`` on the CPU
  (``np.from_dlpack``; ``np.asarray`` where that fails and the object has ``__array__``).
- Refused with a :class:`TypeError` naming the kind and the fix: nested, sparse (COO, CSR, ...),
  quantized and ``complex32`` torch tensors, tensors without storage (inside ``torch.vmap``/``torch.func``,
  fake tensors), raw DLPack capsules.
- Device arrays are refused with a :class:`TypeError` naming the way to move them to the host
  (``t.cpu()``, ``jax.device_get(x)``, ``cupy.asnumpy(x)``): fpsim computes on the CPU, and a silent
  device-to-host round trip inside every call would hide a cost the caller should see. The assertion
  helpers of :mod:`fpsim.testing` copy device arrays to the host instead (documented there: they return
  no array, and comparing a GPU kernel's output with the oracle is what they are for).

Output (:func:`returns_input_kind`, a decorator on the entry points whose results are arrays): when
one of the call's positional arguments is a torch tensor, a JAX array or an array-API array, NumPy
array and scalar results (also inside a tuple) come back as that library's arrays; dataclass results
are left alone. ``as_dtype=True`` asks for the result in the library's own dtype of the call's format
(the ``fmt`` argument; the input's dtype where the call has none); a format the library lacks raises
:class:`ValueError` naming it. With NumPy (or Python) input nothing changes and the wrapper costs a
type lookup per positional argument. A call given ``out=`` (an ndarray; NumPy's ufunc convention) gets
that array back untouched, whatever kind of arrays went in, and may not combine it with ``as_dtype=True``.

Storage dtypes: :func:`ml_dtype` names the NumPy or ml_dtypes dtype of a format (``fpsim.bits.ml_dtype``).

Where it sits (the foundation is a line; each module imports only those before it)::

    _names, _checks, _fpenv  ->  formats  ->  _interop  ->  _carrier  ->  _exact  ->  rounding  ->  bits  ->  _grid

It needs no rounding and no bit codec: conversions in and out are exact, or refused.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from typing import Any, TypeVar, cast, overload

import numpy as np

from .formats import FormatLike, as_format

__all__ = ["as_array", "host_array", "returns_input_kind", "input_kind", "ml_dtype", "ML_NAMES", "TORCH_FORMATS"]

F = TypeVar("F", bound=Callable[..., Any])

# torch dtype name -> (ml_dtypes type name, bits per stored element). float16/32/64 go through .numpy().
TORCH_FORMATS: dict[str, tuple[str, int]] = {
    "bfloat16": ("bfloat16", 16),
    "float8_e4m3fn": ("float8_e4m3fn", 8),
    "float8_e5m2": ("float8_e5m2", 8),
    "float8_e4m3fnuz": ("float8_e4m3fnuz", 8),
    "float8_e5m2fnuz": ("float8_e5m2fnuz", 8),
    "float8_e8m0fnu": ("float8_e8m0fnu", 8),
    "float4_e2m1fn_x2": ("float4_e2m1fn", 4),
}

_TORCH, _JAX, _CUPY, _XP = "torch", "jax", "cupy", "array_api"


def _root(x: object) -> str:
    return type(x).__module__.split(".")[0]


def _is_torch(x: object) -> bool:
    """A torch tensor, subclasses from other packages (torchao, user code) included."""
    if _root(x) == "torch" and hasattr(x, "detach"):
        return True
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _kind_of_type(x: object) -> str | None:
    """"torch", "jax", "cupy", "array_api" or None (NumPy, Python, anything else) for ``x``'s type."""
    if isinstance(x, (np.ndarray, np.generic)):
        return None
    root = _root(x)
    if _is_torch(x):
        return _TORCH
    if root in ("jax", "jaxlib") and hasattr(x, "devices"):
        return _JAX
    if root == "cupy":
        return _CUPY
    if hasattr(x, "__array_namespace__"):
        return _XP
    return None


_KINDS: dict[type, str | None] = {float: None, int: None, str: None, type(None): None, np.ndarray: None,
                                  np.float64: None, np.float32: None, list: None, tuple: None, bool: None}


def input_kind(x: object) -> str | None:
    """The library ``x`` belongs to for result conversion (None: NumPy, Python or anything else)."""
    t = type(x)
    try:
        return _KINDS[t]
    except KeyError:
        k = _kind_of_type(x)
        if k != _CUPY:  # a fake or exotic object with the same type can't change the answer
            _KINDS[t] = k
        return k


# ---------------------------------------------------------------------------------------------- input


def _refuse_device(name: str, what: str, how: str) -> TypeError:
    return TypeError(f"{name}: fpsim computes on the CPU and does not move arrays off a device; got {what}. "
                     f"Move it to the host first: {how}")


def _torch_to_numpy(t: Any, name: str, to_host: bool) -> np.ndarray:
    dev = t.device
    if getattr(dev, "type", str(dev)) != "cpu":
        if not to_host:
            raise _refuse_device(name, f"a torch tensor on {dev}", f"pass {name}.cpu()")
        t = t.detach().cpu()
    torch = sys.modules["torch"]  # the object exists, so torch is imported already
    _refuse_torch_kind(t, name)
    try:
        return _torch_dense_to_numpy(t, name, torch)
    except RuntimeError as e:  # functorch/vmap wrappers, fake and other storage-less tensors
        why = str(e).rstrip(".")
        raise TypeError(f"{name}: cannot read this {type(t).__name__} ({t.dtype}) as a NumPy array: {why}. "
                        f"fpsim needs a plain CPU tensor with storage (outside torch.vmap, torch.func "
                        f"transforms, torch.compile tracing and FakeTensorMode)") from None
    except TypeError as e:  # a dtype NumPy lacks and fpsim does not read through its bits (bits8, uint1..7)
        raise TypeError(f"{name}: torch dtype {t.dtype} has no NumPy equivalent ({str(e).rstrip('.')}); fpsim "
                        f"reads the float (bfloat16, float8, float4_e2m1fn_x2 included) and integer dtypes") from None


def _refuse_torch_kind(t: Any, name: str) -> None:
    """TypeError naming the kind of torch tensor NumPy cannot view element by element (torch's own
    errors there are internal or name the wrong fix)."""
    torch = sys.modules["torch"]
    if getattr(t, "is_nested", False):
        raise TypeError(f"{name}: a nested (ragged) torch tensor has no single shape; pass its components "
                        f"one by one ({name}.unbind()) or a padded dense tensor ({name}.to_padded_tensor(0.0))")
    layout = getattr(t, "layout", torch.strided)
    if layout != torch.strided:
        raise TypeError(f"{name}: a torch tensor with layout {layout} is not supported (dense, strided tensors "
                        f"are); pass {name}.to_dense()")
    if getattr(t, "is_quantized", False):
        raise TypeError(f"{name}: a quantized torch tensor ({t.dtype}) is not supported; pass "
                        f"{name}.dequantize() (or {name}.int_repr() for the stored integers)")
    if t.dtype == getattr(torch, "complex32", None):  # other complex dtypes: the caller refuses or accepts
        raise TypeError(f"{name}: torch.complex32 has no NumPy dtype (and fpsim takes real values)")


def _torch_dense_to_numpy(t: Any, name: str, torch: Any) -> np.ndarray:
    t = t.detach().resolve_conj().resolve_neg()  # bool passes: the caller refuses it
    spec = TORCH_FORMATS.get(str(t.dtype).removeprefix("torch."))
    if spec is None:
        a: np.ndarray = t.numpy()  # float16/32/64 and the integer types: NumPy has them (a view)
        return a
    import ml_dtypes  # a dependency of fpsim

    ml_name, bits = spec
    ml = getattr(ml_dtypes, ml_name, None)
    if ml is None:  # pragma: no cover - an ml_dtypes older than the torch dtype
        raise TypeError(f"{name}: torch dtype {t.dtype} needs ml_dtypes.{ml_name}; upgrade ml_dtypes")
    raw: np.ndarray = t.view(torch.int16 if bits == 16 else torch.uint8).numpy()
    if bits == 4:  # two values a byte, the first in the low nibble
        raw = np.stack([raw & 0xF, raw >> 4], axis=-1).reshape(raw.shape[:-1] + (2 * raw.shape[-1],)) \
            if raw.ndim else np.stack([raw & 0xF, raw >> 4])
        return raw.astype(np.uint8).view(ml)
    return raw.view(ml)


def _jax_to_numpy(x: Any, name: str, to_host: bool) -> np.ndarray:
    try:
        platforms = {d.platform for d in x.devices()}
    except Exception:  # a tracer inside jit has no devices: np.asarray raises jax's own message
        platforms = {"cpu"}
    if platforms != {"cpu"}:
        if not to_host:
            where = ", ".join(sorted(platforms))
            raise _refuse_device(name, f"a JAX array on {where}", f"pass jax.device_get({name})")
        import jax

        host: np.ndarray = np.asarray(jax.device_get(x))
        return host
    a: np.ndarray = np.asarray(x)
    return a


def _dlpack_device_type(x: Any) -> int | None:
    try:
        return int(x.__dlpack_device__()[0])
    except Exception:
        return None


def host_array(x: Any, name: str = "x", *, to_host: bool = False) -> Any:
    """``x`` as a NumPy array when it comes from another library (torch, JAX, CuPy, array API, DLPack).

    NumPy arrays, NumPy scalars, Python numbers, lists and anything unknown are returned unchanged (no
    copy); the values of a converted array are exactly the input's. Device arrays raise ``TypeError``
    naming how to move them, or are copied to the host with ``to_host=True`` (fpsim.testing).
    """
    if isinstance(x, (np.ndarray, np.generic, float, int, list, tuple)):
        return x
    root = _root(x)
    if _is_torch(x):
        return _torch_to_numpy(x, name, to_host)
    if root in ("jax", "jaxlib") and hasattr(x, "devices"):
        return _jax_to_numpy(x, name, to_host)
    if root == "cupy":
        if not to_host:
            raise _refuse_device(name, "a CuPy array (GPU memory)", f"pass cupy.asnumpy({name})")
        return np.asarray(x.get())
    if not hasattr(x, "__dlpack__"):
        if type(x).__name__ == "PyCapsule":  # np.from_dlpack takes the producer, not its capsule
            raise TypeError(f"{name}: a raw DLPack capsule cannot be read (it is consumed once and NumPy takes "
                            f"the object with __dlpack__); pass the array itself, or torch.from_dlpack(capsule)")
        if hasattr(x, "__cuda_array_interface__") and not to_host:  # numba/pycuda device arrays
            raise _refuse_device(name, f"a {type(x).__name__} in GPU memory (__cuda_array_interface__)",
                                 "copy it to host memory first (e.g. its copy_to_host())")
        return x  # __array__, the buffer protocol or nothing: np.asarray decides
    dev = _dlpack_device_type(x)
    if dev is not None and dev != 1:  # 1: kDLCPU
        if not to_host:
            raise _refuse_device(name, f"a {type(x).__name__} on DLPack device type {dev}",
                                 "copy it to host memory (the library's to-NumPy or to-CPU call)")
        if hasattr(x, "__array__"):
            return np.asarray(x)
    try:
        return np.from_dlpack(x)
    except (TypeError, ValueError, RuntimeError, BufferError, AttributeError) as e:
        if hasattr(x, "__array__"):
            return x
        raise TypeError(f"{name}: cannot read {type(x).__name__} through DLPack: {e}") from None


def as_array(x: Any, name: str = "x", *, carrier: bool = False) -> np.ndarray:
    """``np.asarray(x)`` for entry points that take arrays of any library and read their values as they
    are: torch/JAX/DLPack arrays through :func:`host_array` (exactly; clear errors for the kinds it
    refuses), masked arrays refused with a ``TypeError`` (``np.asarray`` would drop the mask and the
    masked values would be used). ``carrier=True``: an ml_dtypes float of 16 bits or fewer (bfloat16,
    the float8/6/4 types: from NumPy, torch or JAX) comes back as float32, which holds each exactly."""
    if isinstance(x, np.ma.MaskedArray):
        raise TypeError(f"{name}: masked arrays are not supported (the mask would be ignored); pass "
                        f"{name}.filled(value) or {name}.compressed()")
    a = np.asarray(host_array(x, name))
    if carrier and a.dtype.kind == "V" and a.dtype.names is None and a.dtype.itemsize <= 2:
        try:
            a = a.astype(np.float32)
        except (TypeError, ValueError):  # a plain void dtype: the caller refuses it by its dtype
            pass
    return a


# --------------------------------------------------------------------------------------------- output


ML_NAMES = {
    "fp64": "float64",
    "fp32": "float32",
    "fp16": "float16",
    "bf16": "bfloat16",
    "fp8_e4m3": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2",
    "fp8_e4m3fnuz": "float8_e4m3fnuz",
    "fp8_e5m2fnuz": "float8_e5m2fnuz",
    "fp6_e2m3": "float6_e2m3fn",
    "fp6_e3m2": "float6_e3m2fn",
    "fp4_e2m1": "float4_e2m1fn",
    "e8m0": "float8_e8m0fnu",
    "fp8_e4m3_ieee": "float8_e4m3",
    "fp8_e3m4": "float8_e3m4",
    "fp8_e4m3b11fnuz": "float8_e4m3b11fnuz",
    "ue5m3": "float8_e5m3fnu",  # ml_dtypes 0.7.0 and later
}


def ml_dtype(fmt: FormatLike) -> np.dtype:
    """The NumPy or ml_dtypes dtype storing ``fmt`` (``ValueError`` for formats with none, e.g. tf32)."""
    f = as_format(fmt)
    name = ML_NAMES.get(f.name)
    if name is None:
        raise ValueError(f"{f.name} has no NumPy/ml_dtypes storage type; formats that do: {', '.join(ML_NAMES)}")
    if hasattr(np, name) and name.startswith("float") and name in ("float64", "float32", "float16"):
        dt: np.dtype = np.dtype(getattr(np, name))
        return dt
    import ml_dtypes

    typ = getattr(ml_dtypes, name, None)
    if typ is None:  # a type newer than the installed ml_dtypes (float8_e5m3fnu arrived in 0.7.0)
        raise ValueError(f"{f.name} is stored as ml_dtypes.{name}, which ml_dtypes {ml_dtypes.__version__} lacks; "
                         "a newer ml_dtypes has it")
    mdt: np.dtype = np.dtype(typ)
    return mdt


def _format_of(fmt: Any) -> Any:
    return as_format(fmt)


def _ml_type_for(fmt: Any) -> Any:
    """The NumPy or ml_dtypes type holding ``fmt`` exactly, or None."""
    try:
        return np.dtype(ml_dtype(fmt))
    except (ValueError, TypeError):
        return None


def _exact_cast(a: np.ndarray, dt: Any, what: str) -> np.ndarray:
    """``a`` cast to ``dt``, raising ValueError unless every value (NaN, signed zero) survives."""
    with np.errstate(all="ignore"):
        c = a.astype(dt)
        back = c.astype(a.dtype)
    if a.dtype.kind == "f":
        nan = np.isnan(a)
        same = ((back == a) & (np.signbit(back) == np.signbit(a))) | (nan & np.isnan(back))
    else:
        same = back == a
    if not np.all(same):
        raise ValueError(f"as_dtype=True: the results are not all representable in {what}")
    return c


def _torch_dtype_name(fmt: Any) -> str | None:
    """The torch dtype name of an fpsim format (None where torch lacks it)."""
    dt = _ml_type_for(fmt)
    if dt is None:
        return None
    name: str = np.dtype(dt).name
    if name in ("float16", "float32", "float64"):
        return name
    return next((t for t, (m, b) in TORCH_FORMATS.items() if m == name and b != 4), None)


def _to_torch(a: np.ndarray, as_fmt: Any) -> Any:
    torch = sys.modules["torch"]
    if as_fmt is not None:
        f = _format_of(as_fmt)
        tname = _torch_dtype_name(f)
        if tname is None or not hasattr(torch, tname):
            raise ValueError(f"as_dtype=True: torch has no dtype for format {f.name!r}; "
                             "omit as_dtype to get a float32/float64 carrier")
        dt = _ml_type_for(f)
        c = _exact_cast(a, dt, f"{f.name} (torch.{tname})")
        if tname in TORCH_FORMATS:
            bits = TORCH_FORMATS[tname][1]
            raw = np.asarray(c, order="C").view(np.int16 if bits == 16 else np.uint8)  # asarray: keeps 0-d
            return torch.from_numpy(raw.copy()).view(getattr(torch, tname))
        a = c
    if a.dtype.kind == "V":  # an ml_dtypes result (to_ml_dtypes): exactly through the bits where torch has it
        name = next((t for t, (m, b) in TORCH_FORMATS.items() if m == a.dtype.name and b != 4), None)
        if name is None or not hasattr(torch, name):
            raise TypeError(f"torch has no dtype for {a.dtype}")
        raw = np.asarray(a, order="C").view(np.int16 if a.dtype.itemsize == 2 else np.uint8)  # keeps 0-d
        return torch.from_numpy(raw.copy()).view(getattr(torch, name))
    if not (a.flags.owndata and a.flags.c_contiguous and a.flags.writeable):
        a = np.array(a, copy=True)  # never hand back a view of the caller's input
    return torch.from_numpy(a)


def _to_jax(a: np.ndarray, as_fmt: Any) -> Any:
    import jax
    import jax.numpy as jnp

    if as_fmt is not None:
        f = _format_of(as_fmt)
        dt = _ml_type_for(f)
        # XLA holds neither fp6 type (ml_dtypes has them); fp4 only where jnp names it
        no_fp4 = f.name == "fp4_e2m1" and not hasattr(jnp, "float4_e2m1fn")
        if dt is None or f.name in ("fp6_e2m3", "fp6_e3m2") or no_fp4:
            raise ValueError(f"as_dtype=True: JAX has no dtype for format {f.name!r}; "
                             "omit as_dtype to get a float32/float64 carrier")
        if np.dtype(dt).itemsize == 8 and jax.dtypes.canonicalize_dtype(np.dtype(dt)) != np.dtype(dt):
            raise ValueError(f"as_dtype=True: {f.name} needs float64, which JAX holds only with "
                             "jax.config.update('jax_enable_x64', True)")
        a = _exact_cast(a, dt, f.name)
    target = jax.dtypes.canonicalize_dtype(a.dtype)
    if target != a.dtype:  # x64 off: float64/int64 results must fit float32/int32 exactly
        try:
            a = _exact_cast(a, target, f"{target} (JAX without jax_enable_x64)")
        except ValueError:
            raise ValueError(f"the results need {a.dtype}, which JAX holds only with "
                             "jax.config.update('jax_enable_x64', True)") from None
    return jnp.asarray(a)


def _to_xp(a: np.ndarray, like: Any, as_fmt: Any) -> Any:
    try:
        xp = like.__array_namespace__()
    except AttributeError:  # pragma: no cover - a library without the method
        import array_api_compat

        xp = array_api_compat.array_namespace(like)
    if as_fmt is not None:
        f = _format_of(as_fmt)
        name = {"fp16": "float16", "fp32": "float32", "fp64": "float64"}.get(f.name)
        if name is None or not hasattr(xp, name):
            raise ValueError(f"as_dtype=True: {xp.__name__} has no dtype for format {f.name!r}")
        a = _exact_cast(a, np.dtype(name), f.name)
    return xp.asarray(a)


def _convert(r: Any, kind: str | None, like: Any, as_fmt: Any) -> Any:
    if isinstance(r, tuple):
        return type(r)(_convert(v, kind, like, as_fmt) for v in r) if type(r) is tuple else r
    if not isinstance(r, (np.ndarray, np.generic)):
        return r
    a = np.asarray(r)
    if as_fmt is not None and kind is None:  # NumPy in: the ml_dtypes (or NumPy) type of the format
        f = _format_of(as_fmt)
        dt = _ml_type_for(f)
        if dt is None:
            raise ValueError(f"as_dtype=True: neither NumPy nor ml_dtypes has a dtype for format {f.name!r}")
        c = _exact_cast(a, dt, f.name)
        return c[()] if isinstance(r, np.generic) else c
    if kind == _TORCH:
        return _to_torch(a, as_fmt)
    if kind == _JAX:
        return _to_jax(a, as_fmt)
    if kind == _XP:
        return _to_xp(a, like, as_fmt)
    return r


def _input_format(x: Any) -> Any:
    """The fpsim format of a foreign or NumPy array's own dtype (for as_dtype without a ``fmt``)."""
    name = str(getattr(x, "dtype", "float64")).rsplit(".", 1)[-1]
    return _format_of({"float16": "fp16", "float32": "fp32", "float64": "fp64"}.get(name, name))


@overload
def returns_input_kind(func: F, *, dtype_option: bool = True) -> F: ...


@overload
def returns_input_kind(func: None = None, *, dtype_option: bool = True) -> Callable[[F], F]: ...


def returns_input_kind(func: F | None = None, *, dtype_option: bool = True) -> Any:
    """Give results back as the kind of array that went in (see the module docstring).

    The data are the positional arguments; the first torch tensor, JAX array or array-API array among
    them sets the output kind. With ``dtype_option`` (the default) the wrapped function declares the
    keyword-only ``as_dtype: bool = False``, which this wrapper consumes: ``True`` returns results in the
    library's dtype of the call's ``fmt`` (ml_dtypes/NumPy for NumPy input), ``ValueError`` naming the
    format when the library lacks it or when a result is not representable in it.
    """
    if func is None:
        return functools.partial(returns_input_kind, dtype_option=dtype_option)
    sig = inspect.signature(func)
    has_fmt = "fmt" in sig.parameters
    if dtype_option:
        # The function declares ``as_dtype`` itself (so type checkers and the docs see it); this wrapper
        # consumes it, and the function body never needs to look at it.
        p = sig.parameters.get("as_dtype")
        if p is None or p.kind is not inspect.Parameter.KEYWORD_ONLY or p.default is not False:
            raise TypeError(f"{func.__qualname__} must declare a keyword-only 'as_dtype: bool = False' "
                            "for returns_input_kind to handle")

    kinds = _KINDS
    lookup = input_kind

    def _slow(args: tuple[Any, ...], kwargs: dict[str, Any], as_dtype: bool) -> Any:
        like = next((a for a in args if lookup(a) is not None), None)
        kind = None if like is None else lookup(like)
        out = func(*args, **kwargs)
        if kind == _CUPY:  # refused by the converter already; nothing to give back
            return out
        as_fmt = None
        if as_dtype:
            if has_fmt:
                bound = inspect.signature(func).bind(*args, **kwargs)
                bound.apply_defaults()
                as_fmt = bound.arguments["fmt"]
            if as_fmt is None:
                src = like if like is not None else next(iter(args), None)
                as_fmt = _input_format(host_array(src) if kind == _TORCH else src)
        if as_dtype and not all(isinstance(v, (np.ndarray, np.generic)) for v in
                                (out if type(out) is tuple else (out,))):
            raise ValueError(f"as_dtype=True applies to array results; {func.__name__} returned a "
                             f"{type(out).__name__} (convert it with fpsim.to_ml_dtypes or .astype)")
        return _convert(out, kind, like, as_fmt)

    if dtype_option:
        @functools.wraps(func)
        def wrapper(*args: Any, as_dtype: bool = False, **kwargs: Any) -> Any:
            if kwargs.get("out") is not None:  # out= given: the function returns that ndarray, untouched
                if as_dtype:
                    raise ValueError(f"{func.__name__}: as_dtype=True and out= cannot be combined (out fixes "
                                     "the result's dtype); pass one of them")
                return func(*args, **kwargs)
            for a in args:
                if kinds.get(type(a), 0) is not None:  # 0: not seen yet
                    return _slow(args, kwargs, as_dtype)
            if as_dtype:
                return _slow(args, kwargs, as_dtype)
            return func(*args, **kwargs)

    else:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get("out") is not None:  # out= given: the function returns that ndarray, untouched
                return func(*args, **kwargs)
            for a in args:
                if kinds.get(type(a), 0) is not None:
                    return _slow(args, kwargs, False)
            return func(*args, **kwargs)

    return cast(F, wrapper)
