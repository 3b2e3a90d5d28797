"""Access to CuPy and a CUDA device, imported lazily so that ``import fpsim.gpu`` never needs CuPy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._fpenv import ieee_mode
from ._compile import compile_options, is_compile_error  # re-exported: their home is _compile

__all__ = ["DeviceInfo", "GPUUnavailable", "compile_options", "device_info", "is_compile_error", "require_cupy"]


class GPUUnavailable(RuntimeError):
    """CuPy is not installed, no CUDA device is visible, or the device lacks a needed feature.

    The message is one line meant for a user (the ``fpsim probe`` command prints it and exits with status 2).
    """


@ieee_mode
@dataclass(frozen=True)
class DeviceInfo:
    """The CUDA device a check ran on."""

    index: int
    name: str
    cc: int  # compute capability as 10*major + minor, e.g. 90 for Hopper
    cuda_runtime: int
    cupy_version: str

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "name": self.name, "compute_capability": f"{self.cc // 10}.{self.cc % 10}",
                "cuda_runtime": self.cuda_runtime, "cupy": self.cupy_version}


def require_cupy(device: int = 0) -> Any:
    """Import CuPy and select CUDA device `device`; raise :class:`GPUUnavailable` (one line) if impossible."""
    if not isinstance(device, int) or isinstance(device, bool) or device < 0:
        raise ValueError(f"device must be a non-negative int, got {device!r}")
    try:
        import cupy
    except Exception as e:  # noqa: BLE001  (ImportError, or a broken CUDA install raising at import)
        raise GPUUnavailable(f"CuPy is not available ({type(e).__name__}: {e}); on a machine with a CUDA GPU "
                             "install the 'gpu' extra for CUDA 13 (pip install 'fpsim-precision[gpu]', i.e. "
                             "cupy-cuda13x) or 'gpu-cuda12' for CUDA 12 (cupy-cuda12x)") from None
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as e:  # noqa: BLE001  (CUDARuntimeError and driver errors alike mean "no GPU")
        raise GPUUnavailable(f"no CUDA device is usable ({type(e).__name__}: {e})") from None
    if count == 0:
        raise GPUUnavailable("no CUDA device is visible to CuPy")
    if device >= count:
        raise GPUUnavailable(f"CUDA device {device} does not exist (this machine has {count})")
    cupy.cuda.Device(device).use()
    return cupy


@ieee_mode
def device_info(device: int = 0) -> DeviceInfo:
    """Name and compute capability of CUDA device `device` (raises :class:`GPUUnavailable` without one)."""
    cp = require_cupy(device)
    props = cp.cuda.runtime.getDeviceProperties(device)
    name = props["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    cc = int(props["major"]) * 10 + int(props["minor"])
    return DeviceInfo(index=device, name=name, cc=cc, cuda_runtime=int(cp.cuda.runtime.runtimeGetVersion()),
                      cupy_version=str(cp.__version__))
