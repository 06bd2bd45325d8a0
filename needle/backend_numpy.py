"""The ``NEEDLE_BACKEND=np`` array API: numpy arrays that speak NDArray's method names.

Autograd and the ops call one array API, the one of :mod:`needle.backend_ndarray`. Under this
backend a tensor's ``cached_data`` is an :class:`NDArray` here: a ``numpy.ndarray`` subclass
(so it is still a numpy array for course code and users) that adds NDArray's methods
(``compact``, ``permute``, ``broadcast_to``, ``flip``, ``pad``, ``as_strided``, ``device``,
``numpy``, ``maximum``/``minimum``, ``log``/``exp``/``tanh``/``sqrt``/``abs``/``sigmoid``/
``relu``/``neg``) and returns arrays, never numpy scalars, from ``sum``/``max``. This module also
exposes the module functions of ``needle.backend_ndarray`` (``array``, ``empty``, ``full``,
``maximum``, ``log``, ``exp``, ``tanh``, ``sum``, ``flip``, ``broadcast_to``, ``reshape``, ...)
and the devices: only ``cpu()`` computes; ``cpu_numpy()`` is the same device, and ``cuda()``
exists so code that names it imports, but it is never enabled and refuses to allocate.

Unlike the NDArray backend, arrays keep numpy's dtype (``dtype=None`` keeps the input's, as in
the course), and comparisons return numpy booleans.
"""
from __future__ import annotations

import builtins
import math
from typing import Sequence

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


class NDArray(numpy.ndarray):
    """A numpy array with NDArray's methods (see the module docstring). Views stay NDArrays."""

    @property
    def device(self) -> "CPUDevice":
        """Always ``cpu()``: numpy arrays live on the host."""
        return _CPU

    def numpy(self) -> numpy.ndarray:
        """A plain ``numpy.ndarray`` copy."""
        return numpy.array(self)

    def compact(self) -> "NDArray":
        """Self when C-contiguous, else a C-contiguous copy."""
        return self if self.flags.c_contiguous else self.copy(order="C")

    def permute(self, new_axes: Sequence[int]) -> "NDArray":
        """A view with the axes reordered (``numpy.transpose``)."""
        return self.transpose(tuple(new_axes))

    def broadcast_to(self, new_shape: Sequence[int]) -> "NDArray":
        """A read-only stride-0 view of ``new_shape`` (numpy's broadcasting rules)."""
        return numpy.broadcast_to(self, tuple(new_shape), subok=True)

    def as_strided(self, shape: Sequence[int], strides: Sequence[int]) -> "NDArray":
        """A read-only view with ``shape`` and ``strides`` counted in elements.

        ValueError when an element would fall outside this (compact) array's buffer.
        """
        shape, strides = tuple(shape), tuple(strides)
        if len(shape) != len(strides) or any(s < 0 for s in strides):
            raise ValueError(f"as_strided: bad shape {shape} / strides {strides}")
        base = self.compact()
        if math.prod(shape) > 0 and builtins.sum((n - 1) * s for n, s in zip(shape, strides)) >= base.size:
            raise ValueError(f"as_strided: shape {shape} with strides {strides} leaves the buffer "
                             f"of {base.size} elements")
        return numpy.lib.stride_tricks.as_strided(
            base, shape, tuple(s * base.itemsize for s in strides), subok=True, writeable=False)

    def flip(self, axes) -> "NDArray":
        """A compact copy reversed along ``axes`` (an int or a tuple; None: every axis)."""
        return numpy.flip(self, axes).copy()

    def pad(self, axes) -> "NDArray":
        """Zero padding: ``axes`` holds one (before, after) pair per dimension."""
        axes = tuple(tuple(int(v) for v in a) for a in axes)
        if len(axes) != self.ndim or any(len(a) != 2 or min(a) < 0 for a in axes):
            raise ValueError(f"pad needs one non-negative (before, after) pair per dimension of "
                             f"shape {self.shape}, got {axes}")
        return numpy.pad(self, axes).view(NDArray)

    def sum(self, axis=None, keepdims: bool = False, **kwargs) -> "NDArray":
        """Sum over ``axis`` (None, an int or a tuple); always an array (0-d for a full sum)."""
        out = numpy.ndarray.sum(self, axis=axis, keepdims=keepdims, **kwargs)
        return out if isinstance(out, NDArray) else numpy.asarray(out).view(NDArray)

    def max(self, axis=None, keepdims: bool = False, **kwargs) -> "NDArray":
        """Maximum over ``axis`` (ValueError over an empty axis); always an array."""
        out = numpy.ndarray.max(self, axis=axis, keepdims=keepdims, **kwargs)
        return out if isinstance(out, NDArray) else numpy.asarray(out).view(NDArray)

    def maximum(self, other) -> "NDArray":
        """Element-wise max with an array (broadcast) or a scalar."""
        return numpy.maximum(self, other)

    def minimum(self, other) -> "NDArray":
        """Element-wise min with an array (broadcast) or a scalar."""
        return numpy.minimum(self, other)

    def log(self) -> "NDArray":
        """Natural logarithm, element-wise."""
        return numpy.log(self)

    def exp(self) -> "NDArray":
        """exp, element-wise."""
        return numpy.exp(self)

    def tanh(self) -> "NDArray":
        """tanh, element-wise."""
        return numpy.tanh(self)

    def sqrt(self) -> "NDArray":
        """Square root, element-wise."""
        return numpy.sqrt(self)

    def abs(self) -> "NDArray":
        """Absolute value, element-wise."""
        return numpy.abs(self)

    def neg(self) -> "NDArray":
        """-self, element-wise."""
        return numpy.negative(self)

    def relu(self) -> "NDArray":
        """max(self, 0), element-wise (NaN propagates)."""
        return numpy.maximum(self, 0)

    def sigmoid(self) -> "NDArray":
        """1 / (1 + exp(-self)), element-wise."""
        with numpy.errstate(over="ignore"):  # exp(-x) overflows to inf for x << 0: σ = 0
            return 1 / (1 + numpy.exp(-self))


def _as_ndarray(a) -> NDArray:
    return a if type(a) is NDArray else numpy.asarray(a).view(NDArray)


class CPUDevice(Device):
    """numpy on the host: every array is an :class:`NDArray` (a ``numpy.ndarray``)."""

    name = "cpu"

    def enabled(self) -> bool:
        return True

    def zeros(self, *shape, dtype: str = "float32") -> NDArray:
        return numpy.zeros(shape, dtype=dtype).view(NDArray)

    def ones(self, *shape, dtype: str = "float32") -> NDArray:
        return numpy.ones(shape, dtype=dtype).view(NDArray)

    def randn(self, *shape, dtype: str = "float32") -> NDArray:
        return numpy.random.randn(*shape).astype(dtype).view(NDArray)

    def rand(self, *shape, dtype: str = "float32") -> NDArray:
        return numpy.random.rand(*shape).astype(dtype).view(NDArray)

    def one_hot(self, n: int, i, dtype: str = "float32") -> NDArray:
        return numpy.eye(n, dtype=dtype)[numpy.asarray(i, dtype=numpy.int64)].view(NDArray)

    def empty(self, shape, dtype: str = "float32") -> NDArray:
        return numpy.empty(shape, dtype=dtype).view(NDArray)

    def full(self, shape, fill_value, dtype: str = "float32") -> NDArray:
        return numpy.full(shape, fill_value, dtype=dtype).view(NDArray)


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
    """The default device: ``cpu()``."""
    return _CPU


def default_tensor_device() -> CPUDevice:
    """The device ``Tensor`` and ``init`` use when none is given: ``cpu()``."""
    return _CPU


def all_devices() -> list:
    """Every device this backend knows: only ``cpu()``."""
    return [_CPU]


def _device(device) -> CPUDevice:
    if device is None or device == _CPU:
        return _CPU
    raise ValueError(f"device {device} is not available with NEEDLE_BACKEND=np: use cpu()")


# ---- module functions: the array API of needle.backend_ndarray ------------------------------
def array(a, dtype=None, device=None) -> NDArray:
    """A copy of ``a`` (array, nested list, number) as an :class:`NDArray` on ``cpu()``.

    ``dtype=None`` keeps numpy's dtype (the course's numpy backend does the same); data that
    is not numeric (strings, objects, complex numbers) is a TypeError.
    """
    _device(device)
    out = numpy.array(a, dtype=dtype)
    if out.dtype.kind not in "biuf":
        raise TypeError(f"cannot make a numeric array from {type(a).__name__} (dtype {out.dtype})")
    return out.view(NDArray)


def empty(shape, dtype="float32", device=None) -> NDArray:
    """An uninitialised array of ``shape``."""
    return _device(device).empty(tuple(shape), dtype)


def full(shape, fill_value, dtype="float32", device=None) -> NDArray:
    """An array of ``shape`` filled with ``fill_value``."""
    return _device(device).full(tuple(shape), fill_value, dtype)


def broadcast_to(a: NDArray, new_shape) -> NDArray:
    """``a`` broadcast to ``new_shape`` (a read-only view)."""
    return _as_ndarray(a).broadcast_to(new_shape)


def reshape(a: NDArray, new_shape) -> NDArray:
    """``a`` with ``new_shape`` (same number of elements)."""
    return _as_ndarray(a).reshape(new_shape)


def permute(a: NDArray, new_axes) -> NDArray:
    """``a`` with its axes reordered (a view)."""
    return _as_ndarray(a).permute(new_axes)


def maximum(a: NDArray, b) -> NDArray:
    """Element-wise max of ``a`` and an array or scalar ``b`` (broadcasting)."""
    return numpy.maximum(_as_ndarray(a), b)


def minimum(a: NDArray, b) -> NDArray:
    """Element-wise min of ``a`` and an array or scalar ``b`` (broadcasting)."""
    return numpy.minimum(_as_ndarray(a), b)


def log(a: NDArray) -> NDArray:
    """Natural logarithm of ``a``, element-wise."""
    return numpy.log(_as_ndarray(a))


def exp(a: NDArray) -> NDArray:
    """exp(a), element-wise."""
    return numpy.exp(_as_ndarray(a))


def tanh(a: NDArray) -> NDArray:
    """tanh(a), element-wise."""
    return numpy.tanh(_as_ndarray(a))


def sqrt(a: NDArray) -> NDArray:
    """Square root of ``a``, element-wise."""
    return numpy.sqrt(_as_ndarray(a))


def sigmoid(a: NDArray) -> NDArray:
    """1 / (1 + exp(-a)), element-wise."""
    return _as_ndarray(a).sigmoid()


def relu(a: NDArray) -> NDArray:
    """max(a, 0), element-wise."""
    return _as_ndarray(a).relu()


def sum(a: NDArray, axis=None, keepdims: bool = False) -> NDArray:
    """Sum of ``a`` over ``axis`` (None, an int or a tuple); an array, 0-d for a full sum."""
    return _as_ndarray(a).sum(axis=axis, keepdims=keepdims)


def max(a: NDArray, axis=None, keepdims: bool = False) -> NDArray:
    """Maximum of ``a`` over ``axis``; ValueError over an empty axis."""
    return _as_ndarray(a).max(axis=axis, keepdims=keepdims)


def matmul(a: NDArray, b: NDArray) -> NDArray:
    """Batched, broadcasting matrix product (numpy's ``@``)."""
    return _as_ndarray(a) @ b


def flip(a: NDArray, axes) -> NDArray:
    """A copy of ``a`` reversed along ``axes``."""
    return _as_ndarray(a).flip(axes)


def pad(a: NDArray, axes) -> NDArray:
    """``a`` zero-padded by one (before, after) pair per dimension."""
    return _as_ndarray(a).pad(axes)


def prod(x) -> int:
    """Product of the integers in ``x`` (1 for an empty sequence)."""
    return math.prod(x)


from .backend_numpy_fused import *  # noqa: F401,F403,E402  (the fused functions on numpy arrays)
