"""The reference device module (``cpu_numpy()``): the device protocol written with numpy.

Every function takes flat ``Array`` buffers plus shape/strides/offset, exactly like the compiled
CPU and CUDA modules, so NDArray's logic is exercised identically on all three. It is slow and
meant as an oracle and a readable specification of the protocol, including its checks: like
the compiled modules, every function rejects buffers whose sizes do not fit (ValueError) and
views reaching outside their buffer (IndexError), naming the function and the sizes.
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


def _check_view(fn: str, buf: Array, shape, strides, offset) -> int:
    """The number of elements of the view; IndexError if it reaches outside ``buf``."""
    shape, strides = tuple(shape), tuple(strides)
    if len(shape) != len(strides):
        raise ValueError(f"{fn}: shape {shape} and strides {strides} differ in length")
    if any(n < 0 for n in shape):
        raise ValueError(f"{fn}: negative dimension in shape {shape}")
    size = int(np.prod(shape, dtype=np.int64))
    if size:
        lo = offset + sum((n - 1) * s for n, s in zip(shape, strides) if s < 0)
        hi = offset + sum((n - 1) * s for n, s in zip(shape, strides) if s > 0)
        if lo < 0 or hi >= buf.size:
            raise IndexError(f"{fn}: view with shape {shape}, strides {strides} and offset "
                             f"{offset} reaches elements [{lo}, {hi}], outside the buffer of "
                             f"{buf.size} elements")
    return size


def _check_sizes(fn: str, out: Array, *inputs: Array) -> None:
    if any(a.size != out.size for a in inputs):
        sizes = " and ".join(str(a.size) for a in inputs)
        raise ValueError(f"{fn}: input{'s' if len(inputs) > 1 else ''} of {sizes} elements but "
                         f"out has {out.size}")


def _view(a: Array, shape, strides, offset) -> np.ndarray:
    # as_strided from the buffer's start: negative strides (flip) reach below `offset`
    return np.lib.stride_tricks.as_strided(
        a.array[offset:], shape, tuple(s * _datetype_size for s in strides)
    )


def to_numpy(a: Array, shape, strides, offset) -> np.ndarray:
    """A copy of the strided view (shape, strides in elements, offset) of ``a``."""
    _check_view("to_numpy", a, shape, strides, offset)
    return _view(a, shape, strides, offset).copy()


def from_numpy(a: np.ndarray, out: Array) -> None:
    """Copy the numpy array ``a`` (any shape, row-major order) into ``out``."""
    if a.size != out.size:
        raise ValueError(f"from_numpy: numpy array has {a.size} elements but out has {out.size}")
    out.array[:] = a.flatten()


def fill(out: Array, val: float) -> None:
    out.array.fill(val)


def compact(a: Array, out: Array, shape, strides, offset) -> None:
    """Write the strided view of ``a`` into ``out`` in row-major order."""
    size = _check_view("compact", a, shape, strides, offset)
    if size != out.size:
        raise ValueError(f"compact: shape {tuple(shape)} has {size} elements but out has "
                         f"{out.size}")
    out.array[:] = _view(a, shape, strides, offset).flatten()


def ewise_setitem(a: Array, out: Array, shape, strides, offset) -> None:
    """Write compact ``a`` into the strided view of ``out``."""
    size = _check_view("ewise_setitem", out, shape, strides, offset)
    if size != a.size:
        raise ValueError(f"ewise_setitem: shape {tuple(shape)} has {size} elements but the "
                         f"source has {a.size}")
    _view(out, shape, strides, offset)[...] = a.array.reshape(shape)


def scalar_setitem(size: int, val: float, out: Array, shape, strides, offset) -> None:
    """Set every element of the strided view of ``out`` (``size`` elements) to ``val``."""
    view_size = _check_view("scalar_setitem", out, shape, strides, offset)
    if view_size != size:
        raise ValueError(f"scalar_setitem: size {size} does not match shape {tuple(shape)} "
                         f"({view_size} elements)")
    _view(out, shape, strides, offset)[...] = val


def ewise_add(a, b, out):
    _check_sizes("ewise_add", out, a, b)
    out.array[:] = a.array + b.array


def scalar_add(a, val, out):
    _check_sizes("scalar_add", out, a)
    out.array[:] = a.array + val


def ewise_mul(a, b, out):
    _check_sizes("ewise_mul", out, a, b)
    out.array[:] = a.array * b.array


def scalar_mul(a, val, out):
    _check_sizes("scalar_mul", out, a)
    out.array[:] = a.array * val


def ewise_div(a, b, out):
    _check_sizes("ewise_div", out, a, b)
    out.array[:] = a.array / b.array


def scalar_div(a, val, out):
    _check_sizes("scalar_div", out, a)
    out.array[:] = a.array / val


def scalar_power(a, val, out):
    _check_sizes("scalar_power", out, a)
    out.array[:] = a.array**val


def ewise_maximum(a, b, out):
    _check_sizes("ewise_maximum", out, a, b)
    out.array[:] = np.maximum(a.array, b.array)


def scalar_maximum(a, val, out):
    _check_sizes("scalar_maximum", out, a)
    out.array[:] = np.maximum(a.array, val)


def ewise_eq(a, b, out):
    _check_sizes("ewise_eq", out, a, b)
    out.array[:] = (a.array == b.array).astype(np.float32)


def scalar_eq(a, val, out):
    _check_sizes("scalar_eq", out, a)
    out.array[:] = (a.array == val).astype(np.float32)


def ewise_ge(a, b, out):
    _check_sizes("ewise_ge", out, a, b)
    out.array[:] = (a.array >= b.array).astype(np.float32)


def scalar_ge(a, val, out):
    _check_sizes("scalar_ge", out, a)
    out.array[:] = (a.array >= val).astype(np.float32)


def ewise_log(a, out):
    _check_sizes("ewise_log", out, a)
    out.array[:] = np.log(a.array)


def ewise_exp(a, out):
    _check_sizes("ewise_exp", out, a)
    out.array[:] = np.exp(a.array)


def ewise_tanh(a, out):
    _check_sizes("ewise_tanh", out, a)
    out.array[:] = np.tanh(a.array)


def matmul(a, b, out, m, n, p):
    """out (m, p) = a (m, n) @ b (n, p), all compact."""
    for what, buf, count in (("a", a, m * n), ("b", b, n * p), ("out", out, m * p)):
        if count > buf.size:
            raise ValueError(f"matmul: {what} needs {count} elements for m={m}, n={n}, p={p} "
                             f"but has {buf.size}")
    product = a.array[: m * n].reshape(m, n) @ b.array[: n * p].reshape(n, p)
    out.array[: m * p] = product.reshape(-1)


def _check_reduce(fn: str, a: Array, out: Array, reduce_size: int) -> None:
    if reduce_size <= 0:
        raise ValueError(f"{fn}: reduce_size must be positive, got {reduce_size}")
    if out.size * reduce_size > a.size:
        raise ValueError(f"{fn}: out has {out.size} elements, reducing {reduce_size} each needs "
                         f"{out.size * reduce_size} but a has {a.size}")


def reduce_max(a, out, reduce_size):
    """Max over consecutive blocks of ``reduce_size`` elements of compact ``a``."""
    _check_reduce("reduce_max", a, out, reduce_size)
    out.array[:] = a.array[: out.array.size * reduce_size].reshape(-1, reduce_size).max(axis=1)


def reduce_sum(a, out, reduce_size):
    """Sum over consecutive blocks of ``reduce_size`` elements of compact ``a``."""
    _check_reduce("reduce_sum", a, out, reduce_size)
    out.array[:] = a.array[: out.array.size * reduce_size].reshape(-1, reduce_size).sum(axis=1)
