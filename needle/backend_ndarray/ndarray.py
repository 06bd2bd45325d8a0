"""The strided n-dimensional array behind needle's ``nd`` backend (hw3).

An :class:`NDArray` is a flat float32 buffer (a device module's ``Array``) plus ``shape``,
``strides`` (in elements) and ``offset``. Views — ``reshape``, ``permute``, ``broadcast_to``,
slicing, ``as_strided`` — build a new NDArray over the same buffer without copying; ``compact``
copies a view into row-major order when a kernel needs contiguous memory.

All argument checking happens here, in Python, before a device module is called: the compiled
kernels trust the shapes, strides and offsets they receive.
"""
from __future__ import annotations

import builtins
import functools
import math
from typing import Iterable, Sequence

import numpy as np

from .device import (
    BackendDevice,
    _check_dtype,
    all_devices,
    cpu,
    cpu_numpy,
    cuda,
    default_device,
    ndarray_backend_cpu,
    ndarray_backend_cuda,
    ndarray_backend_numpy,
)


def prod(x: Iterable[int]) -> int:
    """Product of the integers in ``x`` (1 for an empty sequence)."""
    return math.prod(x)


def _as_float32_numpy(other) -> np.ndarray:
    try:
        arr = np.asarray(other)
    except Exception as exc:  # ragged nested lists and the like
        raise TypeError(f"cannot convert {type(other).__name__} to a float32 NDArray: {exc}") from exc
    if arr.dtype.kind not in "biuf":
        raise TypeError(
            f"cannot convert data of dtype {arr.dtype} ({type(other).__name__}) to a float32 NDArray"
        )
    # not np.ascontiguousarray: it turns a 0-d array into shape (1,)
    return np.asarray(arr, dtype=np.float32, order="C")


class NDArray:
    """A strided float32 array on a device.

    ``NDArray(other, device=None)`` copies ``other`` (an NDArray, numpy array or nested
    sequence of numbers) to ``device`` (default :func:`default_device`).
    """

    def __init__(self, other, device: BackendDevice | None = None):
        if isinstance(other, NDArray):
            if device is None:
                device = other.device
            self._init(other.to(device) + 0.0)  # a compact copy
        elif isinstance(other, np.ndarray) or not hasattr(other, "_handle"):
            device = device if device is not None else default_device()
            array = _as_float32_numpy(other)
            device._check()
            result = self.make(array.shape, device=device)
            if array.size:
                device.from_numpy(array, result._handle)
            self._init(result)
        else:
            raise TypeError(f"cannot build an NDArray from {type(other).__name__}")

    def _init(self, other: "NDArray") -> None:
        self._shape = other._shape
        self._strides = other._strides
        self._offset = other._offset
        self._device = other._device
        self._handle = other._handle

    @staticmethod
    @functools.lru_cache(maxsize=4096)
    def compact_strides(shape: Sequence[int]) -> tuple[int, ...]:
        """Row-major strides (in elements) of ``shape`` (a tuple; cached: called on every op)."""
        stride = 1
        res = []
        for i in range(1, len(shape) + 1):
            res.append(stride)
            stride *= shape[-i]
        return tuple(res[::-1])

    @staticmethod
    def make(shape, strides=None, device=None, handle=None, offset: int = 0) -> "NDArray":
        """An NDArray over ``handle`` (a fresh buffer of prod(shape) elements when None)."""
        # Called for every result and view: kept lean (validation lives in the public methods).
        array = object.__new__(NDArray)
        array._shape = shape = tuple(map(int, shape))
        array._strides = NDArray.compact_strides(shape) if strides is None else tuple(strides)
        array._offset = int(offset)
        array._device = device = device if device is not None else default_device()
        if handle is None:
            if shape and min(shape) < 0:
                raise ValueError(f"negative dimension in shape {shape}")
            device._check()
            handle = device.Array(math.prod(shape))
        array._handle = handle
        return array

    # ---- properties ------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def strides(self) -> tuple[int, ...]:
        return self._strides

    @property
    def device(self) -> BackendDevice:
        return self._device

    @property
    def dtype(self) -> str:
        return "float32"

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def size(self) -> int:
        return prod(self._shape)

    @property
    def flat(self) -> "NDArray":
        """A 1-D view (or compact copy) of every element in row-major order."""
        return self.compact().reshape((self.size,))

    def __repr__(self) -> str:
        return "NDArray(" + self.numpy().__str__() + f", device={self.device})"

    def __str__(self) -> str:
        return self.numpy().__str__()

    # ---- memory ----------------------------------------------------------------------------
    def fill(self, value: float) -> None:
        """Set every element of the buffer to ``value`` (in place)."""
        self._device.fill(self._handle, float(value))

    def to(self, device: BackendDevice) -> "NDArray":
        """This array on ``device`` (self when already there)."""
        if device == self.device:
            return self
        return NDArray(self.numpy(), device=device)

    def numpy(self) -> np.ndarray:
        """A numpy copy with this array's shape."""
        if self.size == 0:
            return np.zeros(self._shape, dtype=np.float32)
        return self.device.to_numpy(self._handle, self._shape, self._strides, self._offset)

    def is_compact(self) -> bool:
        """Row-major strides and the buffer holds exactly these elements."""
        return (
            self._strides == self.compact_strides(self._shape)
            and prod(self.shape) == self._handle.size
        )

    def compact(self) -> "NDArray":
        """Self if compact, else a row-major copy."""
        if self.is_compact():
            return self
        out = NDArray.make(self.shape, device=self.device)
        if out.size:
            self.device.compact(self._handle, out._handle, self.shape, self.strides, self._offset)
        return out

    def as_strided(self, shape, strides) -> "NDArray":
        """A view with the given shape and strides over the same buffer (and offset).

        Raises ValueError when an element of the view would fall outside the buffer.
        """
        shape, strides = tuple(shape), tuple(strides)
        if len(shape) != len(strides):
            raise ValueError(f"as_strided: shape {shape} and strides {strides} differ in length")
        if any(s < 0 for s in strides):
            raise ValueError(f"as_strided: negative strides {strides} are not supported")
        if prod(shape) > 0:
            last = self._offset + builtins.sum((n - 1) * s for n, s in zip(shape, strides))
            if last >= self._handle.size:
                raise ValueError(
                    f"as_strided: shape {shape} with strides {strides} and offset {self._offset} "
                    f"reaches element {last}, beyond the buffer of {self._handle.size}"
                )
        return NDArray.make(shape, strides=strides, device=self.device, handle=self._handle,
                            offset=self._offset)

    # ---- views -----------------------------------------------------------------------------
    def reshape(self, new_shape) -> "NDArray":
        """A view with ``new_shape`` (one -1 is inferred). The array must be compact."""
        new_shape = _normalize_shape(new_shape, self.size)
        if prod(new_shape) != self.size:
            raise ValueError(f"cannot reshape an array of shape {self.shape} ({self.size} elements) "
                             f"into shape {new_shape}")
        if not self.is_compact():
            raise ValueError(
                f"cannot reshape a non-compact array (shape {self.shape}, strides {self.strides}) "
                "without copying: call .compact() first"
            )
        return NDArray.make(new_shape, device=self.device, handle=self._handle)

    def permute(self, new_axes) -> "NDArray":
        """A view with the axes reordered: dimension i of the result is ``new_axes[i]`` of self."""
        new_axes = tuple(new_axes)
        if sorted(_norm_axis(a, self.ndim) for a in new_axes) != list(range(self.ndim)):
            raise ValueError(f"permute: {new_axes} is not a permutation of the {self.ndim} axes of "
                             f"an array of shape {self.shape}")
        new_axes = tuple(_norm_axis(a, self.ndim) for a in new_axes)
        return NDArray.make(
            tuple(self.shape[a] for a in new_axes),
            strides=tuple(self.strides[a] for a in new_axes),
            device=self.device, handle=self._handle, offset=self._offset,
        )

    def broadcast_to(self, new_shape) -> "NDArray":
        """A view repeating size-1 dimensions with stride 0 (numpy rules, new leading dims too)."""
        new_shape = tuple(int(s) for s in new_shape)
        if len(new_shape) < self.ndim:
            raise ValueError(f"cannot broadcast shape {self.shape} to fewer dimensions {new_shape}")
        lead = len(new_shape) - self.ndim
        strides = [0] * lead
        for old, new, stride in zip(self.shape, new_shape[lead:], self.strides):
            if old == new:
                strides.append(stride)
            elif old == 1:
                strides.append(0)
            else:
                raise ValueError(f"cannot broadcast shape {self.shape} to {new_shape}: "
                                 f"dimension of size {old} is not 1 and differs from {new}")
        return NDArray.make(new_shape, strides=tuple(strides), device=self.device,
                            handle=self._handle, offset=self._offset)

    def process_slice(self, sl: slice, dim: int) -> slice:
        """Normalise a slice of dimension ``dim``: non-negative start/stop, positive step.

        Negative start/stop count from the end; a start or stop outside [-n, n] raises
        IndexError; a negative or zero step raises ValueError. An empty range is allowed.
        """
        n = self.shape[dim]
        start, stop, step = sl.start, sl.stop, sl.step
        step = 1 if step is None else step
        if step <= 0:
            raise ValueError(f"slice step must be positive, got {step} in dimension {dim}")

        def bound(v, default, name):
            if v is None:
                return default
            if not -n <= v <= n:
                raise IndexError(f"slice {name} {v} is out of range for dimension {dim} of size {n}")
            return v + n if v < 0 else v

        start = bound(start, 0, "start")
        stop = bound(stop, n, "stop")
        return slice(start, builtins.max(start, stop), step)

    def __getitem__(self, idxs) -> "NDArray":
        """A view of the selected elements; every dimension is kept (an int selects size 1)."""
        if not isinstance(idxs, tuple):
            idxs = (idxs,)
        if len(idxs) > self.ndim:
            raise IndexError(f"too many indices ({len(idxs)}) for an array of shape {self.shape}")
        idxs = tuple(idxs) + (slice(None),) * (self.ndim - len(idxs))
        slices = []
        for dim, s in enumerate(idxs):
            if isinstance(s, slice):
                slices.append(self.process_slice(s, dim))
            elif isinstance(s, (int, np.integer)) and not isinstance(s, bool):
                n = self.shape[dim]
                if not -n <= s < n:
                    raise IndexError(f"index {s} is out of range for dimension {dim} of size {n}")
                s = int(s) + n if s < 0 else int(s)
                slices.append(slice(s, s + 1, 1))
            else:
                raise TypeError(f"NDArray indices must be ints or slices, got {type(s).__name__}")
        shape = tuple(math.ceil((s.stop - s.start) / s.step) for s in slices)
        strides = tuple(st * s.step for st, s in zip(self.strides, slices))
        offset = self._offset + builtins.sum(st * s.start for st, s in zip(self.strides, slices))
        if prod(shape) == 0:
            offset = self._offset
        return NDArray.make(shape, strides=strides, device=self.device, handle=self._handle,
                            offset=offset)

    def __setitem__(self, idxs, other) -> None:
        """Assign a scalar, or an NDArray of the view's shape (or broadcastable to it)."""
        view = self.__getitem__(idxs)
        if view.size == 0:
            return
        if isinstance(other, NDArray):
            self._check_device(other)
            if other.shape != view.shape:
                other = other.broadcast_to(view.shape)
            src = other.compact()
            if src._handle is view._handle:
                # The source is (a view of) the destination buffer: a kernel writing while it
                # reads could see its own writes, so copy first (numpy does the same).
                src = NDArray.make(src.shape, device=self.device)
                self.device.compact(other._handle, src._handle, other.shape, other.strides,
                                    other._offset)
            self.device.ewise_setitem(src._handle, view._handle, view.shape, view.strides,
                                      view._offset)
        else:
            self.device.scalar_setitem(view.size, _scalar(other), view._handle, view.shape,
                                       view.strides, view._offset)

    # ---- element-wise and scalar ops ---------------------------------------------------------
    def _check_device(self, other: "NDArray") -> None:
        if other.device != self.device:
            raise ValueError(f"arrays are on different devices: {self.device} and {other.device}")

    def ewise_or_scalar(self, other, ewise_func, scalar_func) -> "NDArray":
        """Apply ``ewise_func`` when ``other`` is an NDArray of the same shape, else ``scalar_func``."""
        out = NDArray.make(self.shape, device=self.device)
        if isinstance(other, NDArray):
            self._check_device(other)
            if self.shape != other.shape:
                raise ValueError(f"operands could not be combined element-wise: shapes {self.shape} "
                                 f"and {other.shape} differ (broadcast explicitly first)")
            if out.size:
                ewise_func(self.compact()._handle, other.compact()._handle, out._handle)
        else:
            if out.size:
                scalar_func(self.compact()._handle, _scalar(other), out._handle)
        return out

    def __add__(self, other):
        return self.ewise_or_scalar(other, self.device.ewise_add, self.device.scalar_add)

    __radd__ = __add__

    def __sub__(self, other):
        return self + (-other)

    def __rsub__(self, other):
        return other + (-self)

    def __mul__(self, other):
        return self.ewise_or_scalar(other, self.device.ewise_mul, self.device.scalar_mul)

    __rmul__ = __mul__

    def __truediv__(self, other):
        return self.ewise_or_scalar(other, self.device.ewise_div, self.device.scalar_div)

    def __rtruediv__(self, other):
        if isinstance(other, NDArray):
            return other / self
        numerator = NDArray.make(self.shape, device=self.device)
        numerator.fill(_scalar(other))
        return numerator / self

    def __neg__(self):
        return self * (-1)

    def __pow__(self, other):
        if isinstance(other, NDArray):
            raise TypeError("NDArray ** NDArray is not supported: only a scalar exponent")
        return self._unary(lambda a, out: self.device.scalar_power(a, _scalar(other), out))

    def maximum(self, other):
        return self.ewise_or_scalar(other, self.device.ewise_maximum, self.device.scalar_maximum)

    # comparisons return 1.0 / 0.0 floats
    def __eq__(self, other):
        return self.ewise_or_scalar(other, self.device.ewise_eq, self.device.scalar_eq)

    def __ge__(self, other):
        return self.ewise_or_scalar(other, self.device.ewise_ge, self.device.scalar_ge)

    def __ne__(self, other):
        return 1 - (self == other)

    def __gt__(self, other):
        return (self >= other) * (self != other)

    def __lt__(self, other):
        return 1 - (self >= other)

    def __le__(self, other):
        return 1 - (self > other)

    __hash__ = None

    def _unary(self, func) -> "NDArray":
        out = NDArray.make(self.shape, device=self.device)
        if out.size:
            func(self.compact()._handle, out._handle)
        return out

    def log(self):
        return self._unary(self.device.ewise_log)

    def exp(self):
        return self._unary(self.device.ewise_exp)

    def tanh(self):
        return self._unary(self.device.ewise_tanh)

    # ---- matrix multiplication ---------------------------------------------------------------
    def __matmul__(self, other: "NDArray") -> "NDArray":
        """2-D matrix product (m, n) @ (n, p) -> (m, p).

        When the device has ``matmul_tiled`` and every size is a multiple of its
        ``__tile_size__``, both operands are first laid out as contiguous tiles.
        """
        if not isinstance(other, NDArray):
            raise TypeError(f"matmul needs an NDArray operand, got {type(other).__name__}")
        self._check_device(other)
        if self.ndim != 2 or other.ndim != 2:
            raise ValueError(f"matmul needs 2-D operands, got shapes {self.shape} and {other.shape}")
        if self.shape[1] != other.shape[0]:
            raise ValueError(f"matmul inner sizes differ: {self.shape} @ {other.shape}")
        m, n, p = self.shape[0], self.shape[1], other.shape[1]

        tile = getattr(self.device.mod, "__tile_size__", None)
        if (hasattr(self.device.mod, "matmul_tiled") and tile
                and m % tile == 0 and n % tile == 0 and p % tile == 0 and m * n * p > 0):

            def tiled(a: NDArray, t: int) -> NDArray:
                # In bounds by construction: skips as_strided's extent check.
                rows, cols = a.shape
                return NDArray.make((rows // t, cols // t, t, t), strides=(cols * t, t, cols, 1),
                                    device=a.device, handle=a._handle, offset=a._offset)

            a = tiled(self.compact(), tile).compact()
            b = tiled(other.compact(), tile).compact()
            out = NDArray.make((a.shape[0], b.shape[1], tile, tile), device=self.device)
            self.device.matmul_tiled(a._handle, b._handle, out._handle, m, n, p)
            return out.permute((0, 2, 1, 3)).compact().reshape((m, p))

        out = NDArray.make((m, p), device=self.device)
        if out.size:
            if n == 0:
                out.fill(0.0)
            else:
                self.device.matmul(self.compact()._handle, other.compact()._handle, out._handle,
                                   m, n, p)
        return out

    # ---- reductions --------------------------------------------------------------------------
    def reduce_view_out(self, axis, keepdims: bool = False):
        """The compact view whose last axis is reduced, and the output array.

        ``axis`` is None (all elements), an int, or a tuple of ints (an extension: the
        course's NDArray takes one axis).
        """
        if isinstance(axis, tuple) and len(axis) == 0:
            axis = None
        if axis is None:
            view = self.compact().reshape((1,) * (self.ndim - 1) + (self.size,)) if self.ndim else \
                self.compact().reshape((1,))
            out_shape = (1,) * self.ndim if keepdims else (1,)
            out = NDArray.make(out_shape, device=self.device)
            return view, out
        axes = axis if isinstance(axis, tuple) else (axis,)
        normalized = [_norm_axis(a, self.ndim) for a in axes]
        if len(set(normalized)) != len(normalized):
            raise ValueError(f"duplicate axis in {axis} for an array of shape {self.shape}")
        axes = tuple(sorted(normalized))
        keep = [a for a in range(self.ndim) if a not in axes]
        view = self.permute(tuple(keep) + axes)
        reduce_size = prod(self.shape[a] for a in axes)
        view = view.compact().reshape(tuple(self.shape[a] for a in keep) + (reduce_size,))
        if keepdims:
            out_shape = tuple(1 if i in axes else s for i, s in enumerate(self.shape))
        else:
            out_shape = tuple(self.shape[a] for a in keep)
        out = NDArray.make(out_shape, device=self.device)
        return view, out

    def _reduce(self, kernel, axis, keepdims, empty_value):
        view, out = self.reduce_view_out(axis, keepdims=keepdims)
        if out.size:
            if view.shape[-1] == 0:
                if empty_value is None:
                    raise ValueError("max of an empty axis has no identity")
                out.fill(empty_value)
            else:
                kernel(view.compact()._handle, out._handle, view.shape[-1])
        return out

    def sum(self, axis=None, keepdims: bool = False) -> "NDArray":
        """Sum over ``axis`` (None: all elements, shape (1,) or all-ones with keepdims)."""
        return self._reduce(self.device.reduce_sum, axis, keepdims, 0.0)

    def max(self, axis=None, keepdims: bool = False) -> "NDArray":
        """Maximum over ``axis`` (None: all elements)."""
        return self._reduce(self.device.reduce_max, axis, keepdims, None)

    # ---- flip and pad ------------------------------------------------------------------------
    def flip(self, axes) -> "NDArray":
        """A compact copy with the order of elements reversed along ``axes`` (int or tuple)."""
        if axes is None:
            axes = tuple(range(self.ndim))
        axes = axes if isinstance(axes, (tuple, list)) else (axes,)
        axes = {_norm_axis(a, self.ndim) for a in axes}
        offset = self._offset
        strides = list(self.strides)
        for a in axes:
            if self.shape[a] > 0:
                offset += (self.shape[a] - 1) * strides[a]
            strides[a] = -strides[a]
        # A negative-stride view is only ever handed to compact(), whose kernels take
        # signed strides; it never escapes this method.
        view = NDArray.make(self.shape, strides=tuple(strides), device=self.device,
                            handle=self._handle, offset=offset)
        out = NDArray.make(self.shape, device=self.device)
        if out.size:
            self.device.compact(view._handle, out._handle, view.shape, view.strides, view._offset)
        return out

    def pad(self, axes) -> "NDArray":
        """Zero padding: ``axes`` is one (before, after) pair per dimension."""
        axes = tuple(tuple(int(v) for v in a) for a in axes)
        if len(axes) != self.ndim or any(len(a) != 2 or min(a) < 0 for a in axes):
            raise ValueError(f"pad needs one non-negative (before, after) pair per dimension of "
                             f"shape {self.shape}, got {axes}")
        out = NDArray.make(tuple(s + a + b for s, (a, b) in zip(self.shape, axes)),
                           device=self.device)
        out.fill(0.0)
        out[tuple(slice(a, a + s) for s, (a, _) in zip(self.shape, axes))] = self
        return out


def _scalar(value) -> float:
    if isinstance(value, (bool, np.bool_)):
        return float(value)
    if isinstance(value, (int, float, np.integer, np.floating)):
        return float(value)
    raise TypeError(f"expected a number or an NDArray, got {type(value).__name__}")


def _norm_axis(axis, ndim: int) -> int:
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise TypeError(f"axis must be an int, got {axis!r}")
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis {axis} is out of range for an array with {ndim} dimensions")
    return int(axis) % ndim


def _normalize_shape(shape, size: int) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    shape = tuple(int(s) for s in shape)
    if shape.count(-1) > 1:
        raise ValueError(f"only one dimension can be -1, got {shape}")
    if -1 in shape:
        known = prod(s for s in shape if s != -1)
        if known == 0 or size % known:
            raise ValueError(f"cannot infer -1 in shape {shape} for {size} elements")
        shape = tuple(size // known if s == -1 else s for s in shape)
    if any(s < 0 for s in shape):
        raise ValueError(f"negative dimension in shape {shape}")
    return shape


# ---- module functions (the course's array_api) -------------------------------------------------
def array(a, dtype: str = "float32", device: BackendDevice | None = None) -> NDArray:
    """A float32 NDArray copy of ``a`` on ``device``."""
    _check_dtype(dtype)
    return NDArray(a, device=device)


def empty(shape, dtype: str = "float32", device: BackendDevice | None = None) -> NDArray:
    device = device if device is not None else default_device()
    return device.empty(shape, dtype)


def full(shape, fill_value: float, dtype: str = "float32",
         device: BackendDevice | None = None) -> NDArray:
    device = device if device is not None else default_device()
    return device.full(shape, fill_value, dtype)


def broadcast_to(array: NDArray, new_shape) -> NDArray:
    return array.broadcast_to(new_shape)


def reshape(array: NDArray, new_shape) -> NDArray:
    return array.reshape(new_shape)


def maximum(a: NDArray, b) -> NDArray:
    return a.maximum(b)


def log(a: NDArray) -> NDArray:
    return a.log()


def exp(a: NDArray) -> NDArray:
    return a.exp()


def tanh(a: NDArray) -> NDArray:
    return a.tanh()


def sum(a: NDArray, axis=None, keepdims: bool = False) -> NDArray:
    return a.sum(axis=axis, keepdims=keepdims)


def flip(a: NDArray, axes) -> NDArray:
    return a.flip(axes)
