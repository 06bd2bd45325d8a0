"""The strided n-dimensional array behind needle's ``nd`` backend (hw3).

An :class:`NDArray` is a flat float32 buffer (a device module's ``Array``) plus ``shape``,
``strides`` (in elements) and ``offset``. Views — ``reshape``, ``permute``, ``broadcast_to``,
slicing, ``as_strided`` — build a new NDArray over the same buffer without copying; ``compact``
copies a view into row-major order.

The kernels take strided operands (``protocol.py``): element-wise ops read broadcast (stride 0),
permuted and sliced views directly, reductions run over a permuted view, and ``@`` passes
transposed and batched operands as strides; compact operands take the course's compact entry
points, which need no strides (``elementwise.py``, ``_reduce``). What stays in Python is the
bookkeeping — shapes, broadcasting, axis normalisation (their helpers are in ``shapes.py``) and
the argument checks that give a Python user a precise message — done once per call, before a
device module runs.
The device modules check again at their border (the compiled bindings with
``src/common/ndarray_checks.h``, the numpy module in Python), since they can be called
directly: a bad buffer, size or view is a ValueError there, never a crash.
"""

from __future__ import annotations

import math
from typing import (
    TYPE_CHECKING,
    Any,
    ClassVar,
    Iterable,
    Optional,
    Sequence,
    Tuple,
    Union,
)

import numpy as np

from .device import (
    BackendDevice,
    _check_dtype,
    all_devices,
    cpu,
    cpu_numpy,
    cuda,
    default_device,
    default_tensor_device,
)
from .protocol import (
    MAX_ELEMENTS,
    REDUCE_OPS,
    Array,
    module_functions,
)
from .shapes import (
    Axes,
    Index,
    Shape,
    _batched_matmul_plan,
    _broadcast_view,
    _check_as_strided,
    _compact_strides,
    _norm_axis,
    _permutation,
    _reduce_plan,
    _reshape_shape,
    _slice_bound,
    prod,
)

# A scalar operand of the element-wise ops (see _scalar).
Scalar = Union[int, float, np.integer[Any], np.floating[Any], np.bool_]

__all__ = [
    "BackendDevice",
    "NDArray",
    "all_devices",
    "array",
    "broadcast_to",
    "cpu",
    "cpu_numpy",
    "cuda",
    "default_device",
    "default_tensor_device",
    "empty",
    "flip",
    "full",
    "matmul",
    "matmul_tiled",
    "pad",
    "permute",
    "prod",
    "reshape",
]

# Op codes of the reductions (the tables are identical in every device module).
_SUM, _MAX = (REDUCE_OPS.index(n) for n in ("sum", "max"))


#: The largest integer magnitude up to which every integer is exactly representable in float32.
FLOAT32_EXACT_INT = 2**24


def _as_float32_numpy(other: object) -> np.ndarray:
    try:
        arr = np.asarray(other)
    except Exception as exc:  # ragged nested lists and the like
        raise TypeError(
            f"cannot convert {type(other).__name__} to a float32 NDArray: {exc}"
        ) from exc
    if arr.dtype.kind not in "biuf":
        raise TypeError(
            f"cannot convert data of dtype {arr.dtype} ({type(other).__name__}) "
            "to a float32 NDArray"
        )
    if arr.dtype.kind in "iu" and arr.size and int(np.abs(arr).max()) > FLOAT32_EXACT_INT:
        # e.g. class labels or word ids: float32 would round them to a neighbour silently
        raise ValueError(
            f"integer data up to {int(np.abs(arr).max())} cannot be held exactly by a float32 "
            f"NDArray (integers above 2**24 = {FLOAT32_EXACT_INT} are rounded); keep such ids "
            f"in numpy, or convert to float yourself if rounding is acceptable"
        )
    # not np.ascontiguousarray: it turns a 0-d array into shape (1,)
    return np.asarray(arr, dtype=np.float32, order="C")


def _scalar(value: object) -> float:
    """A scalar operand (Python or numpy number) as a float; TypeError for anything else."""
    if type(value) is float or type(value) is int:
        return float(value)
    if isinstance(value, (bool, np.bool_, int, float, np.integer, np.floating)):
        return float(value)
    raise TypeError(f"expected a number or an NDArray, got {type(value).__name__}")


def _new(shape: Shape, device: BackendDevice) -> "NDArray":
    """A fresh compact array (internal: ``shape`` is a tuple of non-negative ints and
    ``device`` is enabled, since an array already lives there)."""
    layout = _LAYOUTS.get(shape)
    if layout is None:
        layout = _compact_layout(shape)
    array = _object_new(NDArray)
    array._shape = shape
    array._strides = layout[0]
    array._offset = 0
    array._device = device
    array._handle = device.Array(layout[1])
    array._compact = True
    return array


def _compact_layout(shape: Shape) -> tuple[Shape, int]:
    """(row-major strides, size) of ``shape``, checked against MAX_ELEMENTS and remembered in
    _LAYOUTS: _new runs for every result, and a program uses few shapes over and over."""
    size = math.prod(shape)
    if size > MAX_ELEMENTS:
        raise ValueError(
            f"shape {shape} has {size} elements, more than an array may hold ({MAX_ELEMENTS})"
        )
    if len(_LAYOUTS) >= 4096:  # a bound for programs that do not repeat their shapes
        _LAYOUTS.clear()
    layout = _LAYOUTS[shape] = (tuple(map(int, _compact_strides(shape))), int(size))
    return layout


_LAYOUTS: dict[Shape, tuple[Shape, int]] = {}
_object_new = object.__new__  # a module global: _new runs for every result


def _view(base: "NDArray", shape: Shape, strides: Shape, offset: int) -> "NDArray":
    """A view of ``base``'s buffer (internal: the caller guarantees it stays inside)."""
    array = object.__new__(NDArray)
    array._shape = shape
    array._strides = strides
    array._offset = offset
    array._device = base._device
    array._handle = base._handle
    array._compact = None
    return array


class NDArray:
    """A strided float32 array on a device.

    ``NDArray(other, device=None)`` copies ``other`` (an NDArray, numpy array or nested
    sequence of numbers) to ``device`` (default :func:`default_device`).
    """

    __slots__ = ("_shape", "_strides", "_offset", "_device", "_handle", "_compact", "__weakref__")
    _shape: Shape
    _strides: Shape
    _offset: int
    _device: BackendDevice
    _handle: Array
    _compact: Optional[bool]  # is_compact(), once asked (None: not yet); the layout never changes

    def __init__(self, other: object, device: BackendDevice | None = None):
        if isinstance(other, NDArray):
            src = other.to(device) if device is not None else other
            self._init(src._copy() if src is other else src)
        elif isinstance(other, np.ndarray) or not hasattr(other, "_handle"):
            device = device if device is not None else default_device()
            array = _as_float32_numpy(other)
            device._check()
            result = _new(array.shape, device)
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
        self._compact = other._compact

    compact_strides = staticmethod(_compact_strides)
    compact_strides.__doc__ = "Row-major strides (in elements) of the tuple ``shape`` (cached)."

    @staticmethod
    def make(
        shape: Iterable[int],
        strides: Optional[Iterable[int]] = None,
        device: Optional[BackendDevice] = None,
        handle: Optional[Array] = None,
        offset: int = 0,
    ) -> "NDArray":
        """An NDArray over ``handle`` (a fresh buffer of prod(shape) elements when None)."""
        shape = tuple(map(int, shape))
        device = device if device is not None else default_device()
        array: NDArray
        if handle is None:
            if shape and min(shape) < 0:
                raise ValueError(f"negative dimension in shape {shape}")
            device._check()
            array = _new(shape, device)
            if strides is None and not offset:
                return array  # a fresh compact buffer, as _new made it
        else:
            array = object.__new__(NDArray)
            array._shape = shape
            array._device = device
            array._handle = handle
        array._strides = _compact_strides(shape) if strides is None else tuple(strides)
        array._offset = int(offset)
        array._compact = None
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
        return math.prod(self._shape)

    @property
    def buffer(self) -> tuple[Any, int]:
        """``(handle, offset)``: the device buffer this array views (shared by its views) and
        the index of its first element, read-only (for tools such as ``needle.fast.compile``
        that follow buffers through kernel calls; ``NDArray.make(..., handle=, offset=)``
        builds a view of one)."""
        return self._handle, self._offset

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
        self._device.fill(self._handle, _scalar(value))

    def to(self, device: BackendDevice) -> "NDArray":
        """This array on ``device`` (self when already there)."""
        if device == self._device:
            return self
        return NDArray(self.numpy(), device=device)

    def numpy(self) -> np.ndarray:
        """A numpy copy with this array's shape."""
        if 0 in self._shape:
            return np.zeros(self._shape, dtype=np.float32)
        out: np.ndarray = self._device.to_numpy(
            self._handle, self._shape, self._strides, self._offset
        )
        return out

    def is_compact(self) -> bool:
        """Row-major strides and the buffer holds exactly these elements."""
        compact = self._compact
        if compact is None:
            compact = self._compact = (
                self._strides == _compact_strides(self._shape)
                and math.prod(self._shape) == self._handle.size
            )
        return compact

    def memory_order(self) -> Optional[Tuple[int, ...]]:
        """The axis order in which this array's elements lie in its buffer, when it is a
        permuted view of a whole compact buffer: ``self.permute(order)`` is then compact (the
        identity for a compact array). None for any other view (a slice, a broadcast, an
        offset). An extension, for callers that choose a layout."""
        if self._offset or math.prod(self._shape) != self._handle.size:
            return None
        strides = self._strides
        order = tuple(sorted(range(len(strides)), key=lambda i: -strides[i]))
        shape = self._shape
        if tuple(strides[i] for i in order) != _compact_strides(tuple(shape[i] for i in order)):
            return None
        return order

    def copy(self) -> "NDArray":
        """A compact copy of this array in a new buffer on its device (an extension, numpy's
        ``copy``: the optimizers give a parameter its next array this way)."""
        return self._copy()

    def _copy(self) -> "NDArray":
        out = _new(self._shape, self._device)
        if 0 not in self._shape:
            self._device.compact(
                self._handle, out._handle, self._shape, self._strides, self._offset
            )
        return out

    def compact(self) -> "NDArray":
        """Self if compact, else a row-major copy."""
        return self if self.is_compact() else self._copy()

    def as_strided(self, shape: Iterable[int], strides: Iterable[int]) -> "NDArray":
        """A view with the given shape and strides over the same buffer (and offset).

        Raises ValueError when an element of the view would fall outside the buffer.
        """
        dims, steps = tuple(int(n) for n in shape), tuple(int(s) for s in strides)
        _check_as_strided(dims, steps, self._offset, self._handle.size)
        return _view(self, dims, steps, self._offset)

    # ---- views -----------------------------------------------------------------------------
    # question: hw3_reshape
    def reshape(self, new_shape: Union[int, Iterable[int]]) -> "NDArray":
        """A view with ``new_shape`` (one -1 is inferred). The array must be compact."""
        shape = _reshape_shape(new_shape, self._shape)
        if not (self._compact or self.is_compact()):
            raise ValueError(
                f"cannot reshape a non-compact array (shape {self.shape}, strides {self.strides}) "
                "without copying: call .compact() first"
            )
        view = _view(self, shape, _compact_strides(shape), 0)
        view._compact = True  # a compact array's buffer, read in its own order
        return view

    # question: hw3_permute
    def permute(self, new_axes: Iterable[int]) -> "NDArray":
        """A view with the axes reordered: dimension i of the result is ``new_axes[i]`` of self."""
        axes = _permutation(tuple(new_axes), len(self._shape))
        if axes is None:
            raise ValueError(
                f"permute: {tuple(new_axes)} is not a permutation of the {self.ndim} "
                f"axes of an array of shape {self.shape}"
            )
        return _view(
            self,
            tuple(map(self._shape.__getitem__, axes)),
            tuple(map(self._strides.__getitem__, axes)),
            self._offset,
        )

    # question: hw3_broadcast_to
    def broadcast_to(self, new_shape: Iterable[int]) -> "NDArray":
        """A view repeating size-1 dimensions with stride 0 (numpy rules, new leading dims too)."""
        shape, strides = _broadcast_view(new_shape, self._shape, self._strides)
        return _view(self, shape, strides, self._offset)

    def process_slice(self, sl: slice, dim: int) -> slice:
        """Normalise a slice of dimension ``dim``: non-negative start/stop, positive step.

        Negative start/stop count from the end; a start or stop outside [-n, n] raises
        IndexError; a negative or zero step raises ValueError. An empty range is allowed.
        """
        n = self._shape[dim]
        start, stop, step = sl.start, sl.stop, sl.step
        step = 1 if step is None else step
        if step <= 0:
            raise ValueError(f"slice step must be positive, got {step} in dimension {dim}")
        start = 0 if start is None else _slice_bound(start, n, dim, "start")
        stop = n if stop is None else _slice_bound(stop, n, dim, "stop")
        return slice(start, stop if stop > start else start, step)

    # question: hw3_getitem
    def __getitem__(self, idxs: Union[Index, Tuple[Index, ...]]) -> "NDArray":
        """A view of the selected elements; every dimension is kept (an int selects size 1)."""
        if not isinstance(idxs, tuple):
            idxs = (idxs,)
        if len(idxs) > len(self._shape):
            raise IndexError(f"too many indices ({len(idxs)}) for an array of shape {self.shape}")
        shape, strides = list(self._shape), list(self._strides)
        offset = self._offset
        for dim, s in enumerate(idxs):
            if isinstance(s, slice):
                if s.start is None and s.stop is None and s.step is None:
                    continue  # the whole dimension: shape and stride unchanged
                s = self.process_slice(s, dim)
                start, stop, step = s.start, s.stop, s.step
                shape[dim] = (stop - start + step - 1) // step
                offset += strides[dim] * start
                strides[dim] *= step
            elif isinstance(s, (int, np.integer)) and not isinstance(s, bool):
                n = shape[dim]
                if not -n <= s < n:
                    raise IndexError(f"index {s} is out of range for dimension {dim} of size {n}")
                offset += strides[dim] * (int(s) + n if s < 0 else int(s))
                shape[dim] = 1
            else:
                raise TypeError(f"NDArray indices must be ints or slices, got {type(s).__name__}")
        if 0 in shape:
            offset = self._offset
        return _view(self, tuple(shape), tuple(strides), offset)

    def __setitem__(
        self, idxs: Union[Index, Tuple[Index, ...]], other: Union["NDArray", Scalar]
    ) -> None:
        """Assign a scalar, or an NDArray of the view's shape (or broadcastable to it)."""
        view = self.__getitem__(idxs)
        if isinstance(other, NDArray):
            self._check_device(other)
            if other.shape != view.shape:
                other = other.broadcast_to(view.shape)
            if view.size == 0:
                return
            src = other.compact()
            if src._handle is view._handle:
                # The source is the destination buffer itself: a kernel writing while it reads
                # could see its own writes, so copy first (numpy does the same).
                src = other._copy()
            self._device.ewise_setitem(
                src._handle, view._handle, view._shape, view._strides, view._offset
            )
        else:
            value = _scalar(other)
            if view.size:
                self._device.scalar_setitem(
                    view.size, value, view._handle, view._shape, view._strides, view._offset
                )

    # ---- element-wise and scalar ops ---------------------------------------------------------
    def _check_device(self, other: "NDArray") -> None:
        if other._device != self._device:
            raise ValueError(f"arrays are on different devices: {self.device} and {other.device}")

    # The element-wise methods (__add__, __radd__, ..., maximum, exp, relu, ...) are generated
    # below the class from protocol.OP_METHODS (_binary_method / _unary_method): each holds its
    # op code, so that a call is one Python frame before the kernel.
    if TYPE_CHECKING:  # their signatures, for the type checker
        Operand = Union["NDArray", Scalar]

        def __add__(self, other: Operand) -> NDArray: ...
        def __radd__(self, other: Operand) -> NDArray: ...
        def __sub__(self, other: Operand) -> NDArray: ...
        def __rsub__(self, other: Operand) -> NDArray: ...
        def __mul__(self, other: Operand) -> NDArray: ...
        def __rmul__(self, other: Operand) -> NDArray: ...
        def __truediv__(self, other: Operand) -> NDArray: ...
        def __rtruediv__(self, other: Operand) -> NDArray: ...
        def __pow__(self, other: Operand) -> NDArray: ...
        def __rpow__(self, other: Operand) -> NDArray: ...
        def maximum(self, other: Operand) -> NDArray: ...
        def minimum(self, other: Operand) -> NDArray: ...
        # element-wise comparisons return arrays of 0/1, as numpy's return boolean arrays
        def __eq__(self, other: Operand) -> NDArray: ...  # type: ignore[override]
        def __ne__(self, other: Operand) -> NDArray: ...  # type: ignore[override]
        def __lt__(self, other: Operand) -> NDArray: ...
        def __le__(self, other: Operand) -> NDArray: ...
        def __gt__(self, other: Operand) -> NDArray: ...
        def __ge__(self, other: Operand) -> NDArray: ...
        def __neg__(self) -> NDArray: ...
        def neg(self) -> NDArray: ...
        def __abs__(self) -> NDArray: ...
        def abs(self) -> NDArray: ...
        def sqrt(self) -> NDArray: ...
        def exp(self) -> NDArray: ...
        def log(self) -> NDArray: ...
        def tanh(self) -> NDArray: ...
        def sigmoid(self) -> NDArray: ...
        def relu(self) -> NDArray: ...

    # Unhashable, like a numpy array (``==`` is element-wise); object's __hash__ is a method,
    # so declaring it None is an assignment mypy flags.
    __hash__: ClassVar[None]  # type: ignore[assignment]
    __hash__ = None

    # ---- matrix multiplication ---------------------------------------------------------------
    def __matmul__(self, other: "NDArray") -> "NDArray":
        """Matrix product with numpy's matmul rules for operands of 2 or more dimensions:
        (..., m, n) @ (..., n, p) -> (..., m, p), the batch dimensions broadcast.

        One call to the device's ``matmul_strided``: transposed, sliced, broadcast and
        permuted operands (per-head attention's (B, H, T, D) views of (B, T, H, D)) are passed
        as strides, one per batch dimension, without copies. Two compact 2-D operands go to the
        plain ``matmul`` instead, which has no strides to convert.
        """
        if not isinstance(other, NDArray):
            raise TypeError(f"matmul needs an NDArray operand, got {type(other).__name__}")
        device = self._device
        if other._device is not device:
            self._check_device(other)
        a_shape, b_shape = self._shape, other._shape
        if len(a_shape) == 2 and len(b_shape) == 2:  # the plain product: no batch to work out
            (m, n), (n_b, p) = a_shape, b_shape
            if n_b != n:
                raise ValueError(f"matmul inner sizes differ: {self.shape} @ {other.shape}")
            if self._compact and other._compact:
                # Both known compact (offset 0, row-major): the course's plain ``matmul`` entry,
                # which converts no strides (a third of a small product's fixed cost).
                out = _new((m, p), device)
                if m and p:
                    device.matmul(self._handle, other._handle, out._handle, m, n, p)
                return out
            batch_shape: Shape = ()
            a_strides, b_strides = self._strides, other._strides
            out_shape: Shape = (m, p)
            empty = not (m and p)
        else:
            batch_shape, a_strides, b_strides, (m, n, p) = _batched_matmul_plan(self, other)
            out_shape = batch_shape + (m, p)
            empty = not (m and p and prod(batch_shape))
        out = _new(out_shape, device)
        if not empty:
            device.matmul_strided(
                self._handle,
                a_strides,
                self._offset,
                other._handle,
                b_strides,
                other._offset,
                out._handle,
                batch_shape,
                m,
                n,
                p,
            )
        return out

    def matmul_tiled(self, other: "NDArray") -> "NDArray":
        """The lecture's tiled product of 2-D arrays: both operands are copied into the
        (rows/T, cols/T, T, T) tiled layout, multiplied tile by tile by the device's
        ``matmul_tiled`` and copied back (T = the device's ``__tile_size__``; every size must
        be a multiple of it). An exhibit: ``@`` is the fast route."""
        if not isinstance(other, NDArray):
            raise TypeError(f"matmul_tiled needs an NDArray operand, got {type(other).__name__}")
        self._check_device(other)
        mod = self._device.mod
        tile = getattr(mod, "__tile_size__", None)
        if not hasattr(mod, "matmul_tiled") or not tile:
            raise RuntimeError(f"device {self.device} has no tiled matmul kernel")
        if self.ndim != 2 or other.ndim != 2 or self.shape[1] != other.shape[0]:
            raise ValueError(
                f"matmul_tiled needs 2-D operands (m, n) @ (n, p), got shapes "
                f"{self.shape} and {other.shape}"
            )
        m, n, p = self.shape[0], self.shape[1], other.shape[1]
        if m % tile or n % tile or p % tile or m * n * p == 0:
            raise ValueError(
                f"matmul_tiled needs positive sizes that are multiples of the tile "
                f"size {tile}, got m={m}, n={n}, p={p}"
            )

        def tiled(x: NDArray) -> NDArray:
            rows, cols = x.shape
            return _view(
                x, (rows // tile, cols // tile, tile, tile), (cols * tile, tile, cols, 1), x._offset
            )._copy()

        a, b = tiled(self.compact()), tiled(other.compact())
        out = _new((m // tile, p // tile, tile, tile), self._device)
        self._device.matmul_tiled(a._handle, b._handle, out._handle, m, n, p)
        return out.permute((0, 2, 1, 3))._copy().reshape((m, p))

    # ---- reductions --------------------------------------------------------------------------
    def _reduce(self, op: int, axis: Axes, keepdims: bool) -> "NDArray":
        if isinstance(axis, list):
            axis = tuple(axis)
        view_shape, view_strides, keep, out_shape, empty, no_output, run = _reduce_plan(
            self._shape, self._strides, axis, keepdims
        )
        if empty and op == _MAX:
            raise ValueError(
                f"max of an empty axis has no identity (shape {self.shape}, axis {axis})"
            )
        out = _new(out_shape, self._device)
        if run and self._compact:
            # Trailing axes of a compact array (its strides are row-major): the course's
            # reduce_sum/reduce_max, which take no strides (the same runs, summed in the same
            # order as by ``reduce``).
            if op == _MAX:
                self._device.reduce_max(self._handle, out._handle, run)
            else:
                self._device.reduce_sum(self._handle, out._handle, run)
        elif not no_output:
            self._device.reduce(
                op, self._handle, view_shape, view_strides, self._offset, keep, out._handle
            )
        return out

    def sum(self, axis: Axes = None, keepdims: bool = False) -> "NDArray":
        """Sum over ``axis`` (None: all elements, shape (1,) or all-ones with keepdims; an int
        or a tuple of ints, negative counting from the end)."""
        return self._reduce(_SUM, axis, keepdims)

    def max(self, axis: Axes = None, keepdims: bool = False) -> "NDArray":
        """Maximum over ``axis`` (as :meth:`sum`); NaN propagates; an empty axis is a
        ValueError."""
        return self._reduce(_MAX, axis, keepdims)

    # ---- flip and pad ------------------------------------------------------------------------
    # question: hw4_ndarray_flip
    def flip(self, axes: Axes) -> "NDArray":
        """A compact copy with the order of elements reversed along ``axes`` (int or tuple)."""
        if axes is None:
            axes = tuple(range(self.ndim))
        axes = axes if isinstance(axes, (tuple, list)) else (axes,)
        flipped = {_norm_axis(a, self.ndim) for a in axes}
        offset = self._offset
        strides = list(self.strides)
        for a in flipped:
            if self.shape[a] > 0:
                offset += (self.shape[a] - 1) * strides[a]
            strides[a] = -strides[a]
        # A negative-stride view is only ever handed to the copy, whose kernels take signed
        # strides; it never escapes this method.
        return _view(self, self._shape, tuple(strides), offset)._copy()

    # question: hw4_ndarray_pad
    def pad(self, axes: Sequence[Sequence[int]]) -> "NDArray":
        """Zero padding: ``axes`` is one (before, after) pair per dimension."""
        axes = tuple(tuple(int(v) for v in a) for a in axes)
        if len(axes) != self.ndim or any(len(a) != 2 or min(a) < 0 for a in axes):
            raise ValueError(
                f"pad needs one non-negative (before, after) pair per dimension of "
                f"shape {self.shape}, got {axes}"
            )
        out = _new(tuple(s + a + b for s, (a, b) in zip(self.shape, axes)), self._device)
        out.fill(0.0)
        out[tuple(slice(a, a + s) for s, (a, _) in zip(self.shape, axes))] = self
        return out


# The element-wise operator methods (__add__, exp, maximum, ...), made from the op tables.
from . import elementwise  # noqa: E402  (it needs NDArray and _new defined above)

elementwise.install(NDArray)


# ---- module functions (the course's array_api, plus the methods added above) -------------------
def array(a: object, dtype: str = "float32", device: BackendDevice | None = None) -> NDArray:
    """A float32 NDArray copy of ``a`` on ``device``."""
    _check_dtype(dtype)
    return NDArray(a, device=device)


def empty(
    shape: Iterable[int], dtype: str = "float32", device: BackendDevice | None = None
) -> NDArray:
    """An uninitialised float32 array of ``shape``."""
    device = device if device is not None else default_device()
    return device.empty(shape, dtype)


def full(
    shape: Iterable[int],
    fill_value: float,
    dtype: str = "float32",
    device: BackendDevice | None = None,
) -> NDArray:
    """A float32 array of ``shape`` filled with ``fill_value``."""
    device = device if device is not None else default_device()
    return device.full(shape, fill_value, dtype)


def broadcast_to(array: NDArray, new_shape: Iterable[int]) -> NDArray:
    """``array`` viewed with ``new_shape`` (numpy's broadcasting rules; stride 0, no copy)."""
    return array.broadcast_to(new_shape)


def reshape(array: NDArray, new_shape: Union[int, Iterable[int]]) -> NDArray:
    """A view of the compact ``array`` with ``new_shape``."""
    return array.reshape(new_shape)


def permute(array: NDArray, new_axes: Iterable[int]) -> NDArray:
    """A view of ``array`` with its axes reordered."""
    return array.permute(new_axes)


# maximum, minimum, neg, abs, sqrt, exp, log, tanh, sigmoid, relu, sum, max: f(a, ...) = a.f(...)
_FUNCTIONS = module_functions(NDArray)
globals().update(_FUNCTIONS)
__all__ += list(_FUNCTIONS)


def matmul(a: NDArray, b: NDArray) -> NDArray:
    """``a @ b`` (numpy's matmul rules for operands of 2 or more dimensions)."""
    return a @ b


def matmul_tiled(a: NDArray, b: NDArray) -> NDArray:
    """The lecture's tiled product of 2-D arrays (see :meth:`NDArray.matmul_tiled`)."""
    return a.matmul_tiled(b)


def flip(a: NDArray, axes: Axes) -> NDArray:
    """A copy of ``a`` reversed along ``axes``."""
    return a.flip(axes)


def pad(a: NDArray, axes: Sequence[Sequence[int]]) -> NDArray:
    """``a`` zero-padded by one (before, after) pair per dimension."""
    return a.pad(axes)
