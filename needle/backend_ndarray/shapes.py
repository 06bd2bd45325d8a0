"""Shape, stride and index bookkeeping of :class:`~needle.backend_ndarray.ndarray.NDArray`.

The pure-Python helpers ``ndarray.py`` runs before a device module does: compact (row-major)
strides, numpy's broadcasting of shapes and strides, axis and slice normalisation, the plans of
a reduction and of a batched matmul, and ``reshape``'s shape with its ``-1``. They read shapes
and strides only (never a buffer), and raise the precise IndexError / TypeError / ValueError a
Python user sees.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any, Iterable, Optional, Sequence, Tuple, Union

import numpy as np

if TYPE_CHECKING:
    from .ndarray import NDArray

Shape = Tuple[int, ...]
# An axis argument: None (all axes), one axis, or several.
Axes = Union[None, int, Sequence[int]]
# One subscript of __getitem__ / __setitem__.
Index = Union[int, np.integer[Any], slice]


def prod(x: Iterable[int]) -> int:
    """Product of the integers in ``x`` (1 for an empty sequence)."""
    return math.prod(x)


@functools.lru_cache(maxsize=4096)
def _compact_strides(shape: Shape) -> Shape:
    stride = 1
    res: list[int] = []
    for n in reversed(shape):
        res.append(stride)
        stride *= n
    return tuple(reversed(res))


def _check_as_strided(dims: Shape, steps: Shape, offset: int, size: int) -> None:
    """ValueError unless a view of shape ``dims`` with strides ``steps`` at ``offset`` stays
    inside a buffer of ``size`` elements (``NDArray.as_strided``'s checks)."""
    if len(dims) != len(steps):
        raise ValueError(f"as_strided: shape {dims} and strides {steps} differ in length")
    if any(n < 0 for n in dims):
        raise ValueError(f"as_strided: negative dimension in shape {dims}")
    if any(s < 0 for s in steps):
        raise ValueError(f"as_strided: negative strides {steps} are not supported")
    if prod(dims) > 0:
        last = offset + sum((n - 1) * s for n, s in zip(dims, steps))
        if last >= size:
            raise ValueError(
                f"as_strided: shape {dims} with strides {steps} and offset {offset} "
                f"reaches element {last}, beyond the buffer of {size}"
            )


def _slice_bound(v: int, n: int, dim: int, name: str) -> int:
    """A slice start/stop ``v`` of a dimension of size ``n`` made non-negative (IndexError
    outside [-n, n])."""
    if not -n <= v <= n:
        raise IndexError(f"slice {name} {v} is out of range for dimension {dim} of size {n}")
    return v + n if v < 0 else v


def _norm_axis(axis: object, ndim: int) -> int:
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise TypeError(f"axis must be an int, got {axis!r}")
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis {axis} is out of range for an array with {ndim} dimensions")
    return int(axis) % ndim


@functools.lru_cache(maxsize=1024)
def _permutation(axes: Tuple[int, ...], ndim: int) -> Optional[Shape]:
    """``axes`` with negative axes normalised, or None when it is not a permutation of
    range(ndim) (cached: the same permutations recur every step)."""
    norm = tuple(_norm_axis(a, ndim) for a in axes)
    return norm if sorted(norm) == list(range(ndim)) else None


def _norm_axes(axis: Union[int, Sequence[int]], ndim: int, shape: Shape) -> set[int]:
    """The set of non-negative axes named by an int or a tuple/list of ints (no duplicates)."""
    if isinstance(axis, (tuple, list)):
        axes = [_norm_axis(a, ndim) for a in axis]
        if len(set(axes)) != len(axes):
            raise ValueError(f"duplicate axis in {tuple(axis)} for an array of shape {shape}")
        return set(axes)
    return {_norm_axis(axis, ndim)}


@functools.lru_cache(maxsize=4096)
def _reduce_plan(
    shape: Shape, strides: Shape, axis: Axes, keepdims: bool
) -> Tuple[Shape, Shape, int, Shape, bool, bool, int]:
    """How to reduce a view over ``axis``: the permuted view (kept axes first, reduced axes
    last) as (shape, strides), the number of kept axes, the output shape, whether a non-empty
    output would reduce over an empty extent, whether the output has no elements to compute,
    and the run length (the reduced elements per output) when the reduced axes are the trailing
    ones, in order, with something to reduce, else 0: over a compact array, the course's
    reduce_sum(a, out, run) (cached: the same reductions recur)."""
    ndim = len(shape)
    if axis is None or axis == ():
        axes = set(range(ndim))
        out_shape = (1,) * ndim if keepdims else (1,)
    else:
        axes = _norm_axes(axis, ndim, shape)
        if keepdims:
            out_shape = tuple(1 if a in axes else shape[a] for a in range(ndim))
        else:
            out_shape = tuple(shape[a] for a in range(ndim) if a not in axes)
    order = [a for a in range(ndim) if a not in axes] + sorted(axes)
    keep = ndim - len(axes)
    view_shape = tuple(shape[a] for a in order)
    no_output = 0 in view_shape[:keep]
    empty = 0 in view_shape[keep:] and not no_output
    trailing = order == list(range(ndim))
    run = prod(view_shape[keep:]) if trailing and not (empty or no_output) else 0
    return view_shape, tuple(strides[a] for a in order), keep, out_shape, empty, no_output, run


def _batched_matmul_plan(
    a: NDArray, b: NDArray
) -> Tuple[Shape, Shape, Shape, Tuple[int, int, int]]:
    """For ``a @ b`` with a batch: the broadcast batch shape, each operand's strides over
    (batch..., rows, cols), and (m, n, p); ValueError for fewer than 2 dimensions or inner
    sizes that differ."""
    a_shape, b_shape = a._shape, b._shape
    if len(a_shape) < 2 or len(b_shape) < 2:
        raise ValueError(
            f"matmul needs operands of at least 2 dimensions, got shapes {a.shape} and {b.shape}"
        )
    m, n = a_shape[-2:]
    p = b_shape[-1]
    if b_shape[-2] != n:
        raise ValueError(f"matmul inner sizes differ: {a.shape} @ {b.shape}")
    batch_shape = _broadcast_shapes(a_shape[:-2], b_shape[:-2], "matmul batch dimensions of")
    a_strides = _broadcast_strides(a, batch_shape + a_shape[-2:])
    b_strides = _broadcast_strides(b, batch_shape + b_shape[-2:])
    return batch_shape, a_strides, b_strides, (m, n, p)


def _broadcast_shapes(a: Shape, b: Shape, what: str) -> Shape:
    """numpy's broadcast of two shapes; ValueError naming both when they do not broadcast."""
    if len(a) < len(b):
        a = (1,) * (len(b) - len(a)) + a
    elif len(b) < len(a):
        b = (1,) * (len(a) - len(b)) + b
    out = []
    for x, y in zip(a, b):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            raise ValueError(f"{what} could not be broadcast together: shapes {a} and {b}")
    return tuple(out)


def _broadcast_strides(x: NDArray, shape: Shape) -> Shape:
    """Strides of ``x`` viewed with the (broadcast) ``shape``: 0 along new and stretched axes."""
    return _stretched_strides(x._shape, x._strides, shape)


def _stretched_strides(old_shape: Shape, old_strides: Shape, shape: Shape) -> Shape:
    """Strides of a view (``old_shape``, ``old_strides``) broadcast to ``shape``."""
    lead = len(shape) - len(old_shape)
    strides = [0] * lead
    for old, new, stride in zip(old_shape, shape[lead:], old_strides):
        if old == new:
            strides.append(stride)
        elif old == 1:
            strides.append(0)
        else:
            raise ValueError(
                f"cannot broadcast shape {old_shape} to {shape}: "
                f"dimension of size {old} is not 1 and differs from {new}"
            )
    return tuple(strides)


def _broadcast_view(new_shape: Iterable[int], shape: Shape, strides: Shape) -> Tuple[Shape, Shape]:
    """(shape, strides) of the view (``shape``, ``strides``) broadcast to ``new_shape``
    (numpy's rules, new leading dimensions too); ValueError when it does not broadcast.
    Cached for a tuple ``new_shape`` (the same broadcasts recur every step)."""
    if type(new_shape) is tuple:
        try:
            return _broadcast_view_cached(new_shape, shape, strides)
        except TypeError:  # unhashable entries: the uncached checks name the problem
            pass
    return _broadcast_view_checked(new_shape, shape, strides)


def _broadcast_view_checked(
    new_shape: Iterable[int], shape: Shape, strides: Shape
) -> Tuple[Shape, Shape]:
    target = tuple(int(s) for s in new_shape)
    if target == shape:
        return target, strides
    if any(s < 0 for s in target):
        raise ValueError(f"cannot broadcast shape {shape} to {target}: negative dimension")
    if len(target) < len(shape):
        raise ValueError(f"cannot broadcast shape {shape} to fewer dimensions {target}")
    return target, _stretched_strides(shape, strides, target)


_broadcast_view_cached = functools.lru_cache(maxsize=4096)(_broadcast_view_checked)


def _normalize_shape(shape: Union[int, Iterable[int]], size: int) -> Shape:
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


def _reshape_shape(new_shape: Union[int, Iterable[int]], shape: Shape) -> Shape:
    """``new_shape`` normalised (one -1 inferred) for reshaping an array of ``shape``;
    ValueError when the element counts differ. Cached for hashable arguments (the same
    reshapes recur every step); anything else takes the same checks uncached."""
    if type(new_shape) is tuple:
        try:
            return _reshape_shape_cached(new_shape, shape)
        except TypeError:  # unhashable entries: the uncached checks name the problem
            pass
    return _reshape_shape_checked(new_shape, shape)


def _reshape_shape_checked(new_shape: Union[int, Iterable[int]], shape: Shape) -> Shape:
    size = prod(shape)
    out = _normalize_shape(new_shape, size)
    if prod(out) != size:
        raise ValueError(
            f"cannot reshape an array of shape {shape} ({size} elements) into shape {out}"
        )
    return out


_reshape_shape_cached = functools.lru_cache(maxsize=4096)(_reshape_shape_checked)
