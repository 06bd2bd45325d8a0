"""Devices of the ``nd`` backend: a name plus the module implementing the device protocol.

``cpu()`` is the compiled C++ module, ``cuda()`` the compiled CUDA module (``enabled()`` is
False where it was not built or no GPU is visible), ``cpu_numpy()`` the numpy reference module.
Each is one object, so ``enabled()`` is asked once and comparisons stay cheap.

Two defaults (docs/array_layer.md, "Default devices"):

* :func:`default_device` is the course's: ``cpu_numpy()``, used by ``NDArray(x)`` and the
  module functions (``array``, ``empty``, ``full``) when no device is given.
* :func:`default_tensor_device` is needle's: the compiled ``cpu()`` when it is built, else
  ``cpu_numpy()``; ``Tensor`` and ``init`` use it so that everything lands on one device.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any, Iterable, Optional

import numpy as np
from numpy.typing import DTypeLike

from . import ndarray_backend_numpy, protocol

if TYPE_CHECKING:
    from .ndarray import NDArray

_REBUILD = "rebuild it with `make build` (or `pip install -e .`)"

try:
    from . import ndarray_backend_cpu as ndarray_backend_cpu

    _CPU_IMPORT_ERROR = None
except ImportError as exc:  # not compiled, or compiled for another Python / machine
    ndarray_backend_cpu = None
    _CPU_IMPORT_ERROR = f"{type(exc).__name__}: {exc}"


def _warn_if_build_lost_its_module() -> None:
    """One stderr line when this checkout has a build (``build/`` beside ``needle/``) but the
    compiled CPU module is missing or broken: everything would otherwise run on the numpy
    device without a word (e.g. after a rebuild that was interrupted)."""
    import sys
    from pathlib import Path

    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "CMakeLists.txt").is_file() and (checkout / "build").is_dir():
        print(
            f"needle: the compiled CPU module is missing or broken ({_CPU_IMPORT_ERROR}); "
            f"cpu() is disabled and Tensors go to cpu_numpy(): {_REBUILD}",
            file=sys.stderr,
        )


if ndarray_backend_cpu is None:
    _warn_if_build_lost_its_module()

try:
    from . import ndarray_backend_cuda as ndarray_backend_cuda

    _CUDA_IMPORT_ERROR = None
except ImportError as exc:  # built without nvcc
    ndarray_backend_cuda = None
    _CUDA_IMPORT_ERROR = f"{type(exc).__name__}: {exc}"


class BackendDevice:
    """A device: a name plus the module implementing the device protocol (``protocol.py``).

    Devices compare equal by name; attribute access forwards to the module (and is cached on
    the device), so ``device.ewise_binary`` is the module's kernel.
    """

    def __init__(self, name: str, mod: Optional[ModuleType], import_error: str | None = None):
        self.name = name
        self.mod = mod
        self._import_error = import_error

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, BackendDevice) and self.name == other.name)

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return self.name + "()"

    def __getattr__(self, name: str) -> Any:
        if name in ("mod", "_import_error", "_enabled"):  # before __init__ (copy, pickle)
            raise AttributeError(name)
        mod = self.__dict__.get("mod")
        if mod is None:
            raise RuntimeError(self._why_disabled())
        try:
            value = getattr(mod, name)
        except AttributeError:
            hint = (
                f" (a compiled module older than the protocol: {_REBUILD})"
                if hasattr(protocol.DeviceModule, name)
                else ""
            )
            raise AttributeError(f"device {self.name}() has no {name!r}{hint}") from None
        self.__dict__[name] = value  # later look-ups skip __getattr__
        return value

    def _why_disabled(self) -> str:
        if self.mod is None:
            reason = (
                f"its compiled module failed to import ({self._import_error})"
                if self._import_error
                else "its module is not built"
            )
            return f"device {self.name}() is not enabled: {reason}; {_REBUILD}"
        return f"device {self.name}() is not enabled: no GPU is visible on this machine"

    def enabled(self) -> bool:
        """True when the module is built and, for CUDA, a GPU is visible (asked once)."""
        enabled = self.__dict__.get("_enabled")
        if enabled is None:
            is_available = getattr(self.mod, "is_available", None)
            enabled = self.mod is not None and (is_available is None or bool(is_available()))
            self._enabled = enabled
        return enabled

    def _check(self) -> None:
        if not self.enabled():
            raise RuntimeError(self._why_disabled())

    def cache_info(self) -> dict[str, Any] | None:
        """The module's buffer-cache report (cap, bytes held, hits...) or None if it keeps none."""
        info = getattr(self.mod, "cache_info", None)
        if info is None:
            return None
        report: dict[str, Any] = info()
        return report

    def cache_clear(self) -> None:
        """Release every buffer the module's cache holds (no-op for a module without one)."""
        clear = getattr(self.mod, "cache_clear", None)
        if clear is not None:
            clear()

    def randn(self, *shape: int, dtype: str = "float32") -> "NDArray":
        """Standard normal samples from numpy's global RNG, moved to this device."""
        from .ndarray import NDArray

        return NDArray(np.random.randn(*shape).astype(dtype), device=self)

    def rand(self, *shape: int, dtype: str = "float32") -> "NDArray":
        """Uniform [0, 1) samples from numpy's global RNG, moved to this device."""
        from .ndarray import NDArray

        return NDArray(np.random.rand(*shape).astype(dtype), device=self)

    def one_hot(self, n: int, i: Any, dtype: str = "float32") -> "NDArray":
        """Rows of the n×n identity selected by the integer indices ``i``: shape i.shape + (n,)."""
        from .ndarray import NDArray

        return NDArray(np.eye(n, dtype=dtype)[np.asarray(i, dtype=np.int64)], device=self)

    def empty(self, shape: Iterable[int], dtype: str = "float32") -> "NDArray":
        """An uninitialised float32 array of ``shape`` on this device."""
        from .ndarray import NDArray

        _check_dtype(dtype)
        return NDArray.make(tuple(shape), device=self)

    def full(self, shape: Iterable[int], fill_value: float, dtype: str = "float32") -> "NDArray":
        """A float32 array of ``shape`` filled with ``fill_value`` on this device."""
        arr = self.empty(shape, dtype)
        arr.fill(fill_value)
        return arr


# One object per device: enabled() is asked once, and `device == cpu()` stays cheap.
_CUDA = BackendDevice("cuda", ndarray_backend_cuda, _CUDA_IMPORT_ERROR)
_CPU_NUMPY = BackendDevice("cpu_numpy", ndarray_backend_numpy)
_CPU = BackendDevice("cpu", ndarray_backend_cpu, _CPU_IMPORT_ERROR)


def cuda() -> BackendDevice:
    """The CUDA device (``enabled()`` is False without the module or a GPU)."""
    return _CUDA


def cpu_numpy() -> BackendDevice:
    """The numpy reference device."""
    return _CPU_NUMPY


def cpu() -> BackendDevice:
    """The compiled C++ CPU device."""
    return _CPU


def default_device() -> BackendDevice:
    """The device ``NDArray(...)`` uses when given none: ``cpu_numpy()`` (the course's choice)."""
    return _CPU_NUMPY


def default_tensor_device() -> BackendDevice:
    """The device needle's ``Tensor`` and ``init`` use when none is given: the compiled
    ``cpu()`` when it is built and enabled, else ``cpu_numpy()``."""
    return _CPU if _CPU.enabled() else _CPU_NUMPY


def all_devices() -> list[BackendDevice]:
    """Every device needle knows, enabled or not: ``[cpu(), cuda(), cpu_numpy()]``."""
    return [cpu(), cuda(), cpu_numpy()]


def _check_dtype(dtype: DTypeLike) -> None:
    if dtype is not None and np.dtype(dtype) != np.float32:
        raise TypeError(f"NDArray supports only float32, got dtype {dtype!r}")
