"""The reference device module (``cpu_numpy()``): the device protocol written with numpy.

Every function takes flat ``Array`` buffers plus shape/strides/offset, exactly like the compiled
CPU and CUDA modules, so NDArray's logic is exercised identically on all three. It is slow and
meant as an oracle and a readable specification of the protocol.
"""
from __future__ import annotations

import numpy as np

__device_name__ = "cpu_numpy"
_datatype = np.float32
_datetype_size = np.dtype(_datatype).itemsize


class Array:
    """A flat float32 buffer of ``size`` elements."""

    def __init__(self, size: int):
        if size < 0:
            raise ValueError(f"Array size must be non-negative, got {size}")
        self.array = np.empty(size, dtype=np.float32)

    @property
    def size(self) -> int:
        return self.array.size

    def ptr(self) -> int:
        """Address of the first element (views of one buffer share it)."""
        return self.array.ctypes.data


def to_numpy(a: Array, shape, strides, offset) -> np.ndarray:
    """A copy of the strided view (shape, strides in elements, offset) of ``a``."""
    return np.lib.stride_tricks.as_strided(
        a.array[offset:], shape, tuple(s * _datetype_size for s in strides)
    ).copy()


def from_numpy(a: np.ndarray, out: Array) -> None:
    out.array[:] = a.flatten()


def fill(out: Array, val: float) -> None:
    out.array.fill(val)


def _view(a: Array, shape, strides, offset) -> np.ndarray:
    return np.lib.stride_tricks.as_strided(
        a.array[offset:], shape, tuple(s * _datetype_size for s in strides)
    )


def compact(a: Array, out: Array, shape, strides, offset) -> None:
    """Write the strided view of ``a`` into ``out`` in row-major order."""
    out.array[:] = _view(a, shape, strides, offset).flatten()


def ewise_setitem(a: Array, out: Array, shape, strides, offset) -> None:
    """Write compact ``a`` into the strided view of ``out``."""
    _view(out, shape, strides, offset)[:] = a.array.reshape(shape)


def scalar_setitem(size: int, val: float, out: Array, shape, strides, offset) -> None:
    _view(out, shape, strides, offset)[:] = val


def ewise_add(a, b, out):
    out.array[:] = a.array + b.array


def scalar_add(a, val, out):
    out.array[:] = a.array + val


def ewise_mul(a, b, out):
    out.array[:] = a.array * b.array


def scalar_mul(a, val, out):
    out.array[:] = a.array * val


def ewise_div(a, b, out):
    out.array[:] = a.array / b.array


def scalar_div(a, val, out):
    out.array[:] = a.array / val


def scalar_power(a, val, out):
    out.array[:] = a.array**val


def ewise_maximum(a, b, out):
    out.array[:] = np.maximum(a.array, b.array)


def scalar_maximum(a, val, out):
    out.array[:] = np.maximum(a.array, val)


def ewise_eq(a, b, out):
    out.array[:] = (a.array == b.array).astype(np.float32)


def scalar_eq(a, val, out):
    out.array[:] = (a.array == val).astype(np.float32)


def ewise_ge(a, b, out):
    out.array[:] = (a.array >= b.array).astype(np.float32)


def scalar_ge(a, val, out):
    out.array[:] = (a.array >= val).astype(np.float32)


def ewise_log(a, out):
    out.array[:] = np.log(a.array)


def ewise_exp(a, out):
    out.array[:] = np.exp(a.array)


def ewise_tanh(a, out):
    out.array[:] = np.tanh(a.array)


def matmul(a, b, out, m, n, p):
    """out (m, p) = a (m, n) @ b (n, p), all compact."""
    out.array[:] = (a.array.reshape(m, n) @ b.array.reshape(n, p)).reshape(-1)


def reduce_max(a, out, reduce_size):
    """Max over consecutive blocks of ``reduce_size`` elements of compact ``a``."""
    out.array[:] = a.array[: out.array.size * reduce_size].reshape(-1, reduce_size).max(axis=1)


def reduce_sum(a, out, reduce_size):
    """Sum over consecutive blocks of ``reduce_size`` elements of compact ``a``."""
    out.array[:] = a.array[: out.array.size * reduce_size].reshape(-1, reduce_size).sum(axis=1)
