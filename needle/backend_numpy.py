"""The ``NEEDLE_BACKEND=np`` device: tensors hold plain ``numpy.ndarray`` data on the CPU.

Only ``cpu()`` computes here; ``cpu_numpy()`` is the same device, and ``cuda()`` exists so code
that names it imports, but it is never enabled and refuses to allocate.
"""
from __future__ import annotations

import numpy


class Device:
    """Base class of the numpy backend's devices."""

    name = "device"

    def __repr__(self) -> str:
        return f"{self.name}()"

    def __hash__(self) -> int:
        return hash(repr(self))

    def __eq__(self, other) -> bool:
        return isinstance(other, Device) and other.name == self.name

    def enabled(self) -> bool:
        return False


class CPUDevice(Device):
    """numpy on the host: every array is a ``numpy.ndarray``."""

    name = "cpu"

    def enabled(self) -> bool:
        return True

    def zeros(self, *shape, dtype: str = "float32") -> numpy.ndarray:
        return numpy.zeros(shape, dtype=dtype)

    def ones(self, *shape, dtype: str = "float32") -> numpy.ndarray:
        return numpy.ones(shape, dtype=dtype)

    def randn(self, *shape, dtype: str = "float32") -> numpy.ndarray:
        return numpy.random.randn(*shape).astype(dtype)

    def rand(self, *shape, dtype: str = "float32") -> numpy.ndarray:
        return numpy.random.rand(*shape).astype(dtype)

    def one_hot(self, n: int, i, dtype: str = "float32") -> numpy.ndarray:
        return numpy.eye(n, dtype=dtype)[numpy.asarray(i, dtype=numpy.int64)]

    def empty(self, shape, dtype: str = "float32") -> numpy.ndarray:
        return numpy.empty(shape, dtype=dtype)

    def full(self, shape, fill_value, dtype: str = "float32") -> numpy.ndarray:
        return numpy.full(shape, fill_value, dtype=dtype)


class UnavailableDevice(Device):
    """A device the numpy backend cannot use (``cuda()``); ``enabled()`` is False."""

    def __init__(self, name: str):
        self.name = name

    def __getattr__(self, attr):
        raise RuntimeError(f"{self.name}() is not available with NEEDLE_BACKEND=np; use cpu()")


_CPU = CPUDevice()


def cpu() -> CPUDevice:
    """The host device (numpy arrays)."""
    return _CPU


def cpu_numpy() -> CPUDevice:
    """Same as :func:`cpu` under the numpy backend."""
    return _CPU


def cuda() -> UnavailableDevice:
    """A placeholder: the numpy backend has no GPU device."""
    return UnavailableDevice("cuda")


def default_device() -> CPUDevice:
    return _CPU


def all_devices() -> list:
    """Every device this backend knows: only ``cpu()``."""
    return [_CPU]
from .backend_numpy_fused import *  # noqa: F401,F403  (the fused functions on numpy arrays)
