"""Devices of the ``nd`` backend: a name plus the module implementing the device protocol.

``cpu()`` is the compiled C++ module, ``cuda()`` the compiled CUDA module (``enabled()`` is
False where it was not built or no GPU is visible), ``cpu_numpy()`` the numpy reference module.
Each is one object, so ``enabled()`` is asked once and comparisons stay cheap.
"""
from __future__ import annotations

import numpy as np

from . import ndarray_backend_numpy

try:
    from . import ndarray_backend_cpu
except ImportError:  # not compiled: cpu() reports enabled() == False
    ndarray_backend_cpu = None

try:
    from . import ndarray_backend_cuda
except ImportError:  # built without nvcc
    ndarray_backend_cuda = None


class BackendDevice:
    """A device: a name plus the module implementing the device protocol (API.md §8).

    Devices compare equal by name; attribute access forwards to the module, so
    ``device.ewise_add`` is the module's kernel.
    """

    def __init__(self, name: str, mod):
        self.name = name
        self.mod = mod

    def __eq__(self, other) -> bool:
        return isinstance(other, BackendDevice) and self.name == other.name

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return self.name + "()"

    def __getattr__(self, name: str):
        mod = self.__dict__.get("mod")
        if mod is None:
            raise RuntimeError(
                f"device {self.name}() is not available: its backend module was not built or "
                "no hardware is visible (check device.enabled())"
            )
        value = getattr(mod, name)
        self.__dict__[name] = value  # later look-ups skip __getattr__
        return value

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
            raise RuntimeError(f"device {self.name}() is not enabled on this machine")

    def randn(self, *shape, dtype: str = "float32") -> "NDArray":
        """Standard normal samples from numpy's global RNG, moved to this device."""
        from .ndarray import NDArray
        return NDArray(np.random.randn(*shape).astype(dtype), device=self)

    def rand(self, *shape, dtype: str = "float32") -> "NDArray":
        """Uniform [0, 1) samples from numpy's global RNG, moved to this device."""
        from .ndarray import NDArray
        return NDArray(np.random.rand(*shape).astype(dtype), device=self)

    def one_hot(self, n: int, i, dtype: str = "float32") -> "NDArray":
        """Rows of the n×n identity selected by the integer indices ``i``: shape i.shape + (n,)."""
        from .ndarray import NDArray
        return NDArray(np.eye(n, dtype=dtype)[np.asarray(i, dtype=np.int64)], device=self)

    def empty(self, shape, dtype: str = "float32") -> "NDArray":
        from .ndarray import NDArray
        _check_dtype(dtype)
        return NDArray.make(tuple(shape), device=self)

    def full(self, shape, fill_value: float, dtype: str = "float32") -> "NDArray":
        arr = self.empty(shape, dtype)
        arr.fill(fill_value)
        return arr


# One object per device: enabled() is asked once, and `device == cpu()` stays cheap.
_CUDA = BackendDevice("cuda", ndarray_backend_cuda)
_CPU_NUMPY = BackendDevice("cpu_numpy", ndarray_backend_numpy)
_CPU = BackendDevice("cpu", ndarray_backend_cpu)


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
    """The device ``NDArray(...)`` uses when none is given: ``cpu_numpy()`` (the course's choice)."""
    return _CPU_NUMPY


def all_devices() -> list[BackendDevice]:
    """Every device needle knows, enabled or not: ``[cpu(), cuda(), cpu_numpy()]``."""
    return [cpu(), cuda(), cpu_numpy()]


def _check_dtype(dtype) -> None:
    if dtype is not None and np.dtype(dtype) != np.float32:
        raise TypeError(f"NDArray supports only float32, got dtype {dtype!r}")
