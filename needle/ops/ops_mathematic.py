"""Element-wise, scalar, shape and matrix ops (hw1, hw2, hw4).

Each op's ``compute`` is array math through the array API (the methods and module functions
of needle's NDArray, which the ``NEEDLE_BACKEND=np`` adapter provides on numpy arrays too), and
its ``gradient`` is written with needle ops, so it can be differentiated again. Element-wise ops
between tensors broadcast with numpy's rules, and their gradients are summed back to each
input's own shape.
"""

from __future__ import annotations

import functools
from numbers import Integral, Real
from typing import Any, Iterable, Optional, Sequence, Tuple, Union, cast

import numpy

from ..autograd import NDArray, Tensor, TensorOp

# A shape argument: a sequence of ints, or one int for a 1-D shape.
ShapeArg = Union[int, Iterable[int]]


@functools.lru_cache(maxsize=1024)
def _norm_axes_cached(axes, ndim: int, what: str) -> Tuple[int, ...]:
    if axes is None:
        return tuple(range(ndim))
    if isinstance(axes, (int, numpy.integer)):
        axes = (axes,)
    out = []
    for ax in axes:
        if not isinstance(ax, (int, numpy.integer)) or isinstance(ax, bool):
            raise TypeError(f"{what}: axis {ax!r} is not an int")
        if not -ndim <= ax < ndim:
            raise ValueError(f"{what}: axis {ax} is out of range for {ndim} dimensions")
        out.append(int(ax) % ndim)
    if len(set(out)) != len(out):
        raise ValueError(f"{what}: repeated axis in {tuple(axes)}")
    return tuple(sorted(out))


_EVERY_AXIS = tuple(tuple(range(n)) for n in range(33))  # axes=None, without a call


def _norm_axes(axes, ndim: int, what: str) -> Tuple[int, ...]:
    """``axes`` (None: all, int or sequence) as sorted non-negative ints, validated."""
    if axes is None and ndim < 33:
        return _EVERY_AXIS[ndim]
    if isinstance(axes, list):
        axes = tuple(axes)
    try:
        return _norm_axes_cached(axes, ndim, what)
    except TypeError:
        if isinstance(axes, tuple) or axes is None or isinstance(axes, (int, numpy.integer)):
            raise  # a validation error, not an unhashable argument
        raise TypeError(
            f"{what}: axes must be None, an int or a tuple of ints, got {type(axes).__name__}"
        ) from None


def scalar_value(value: object, what: str) -> Union[int, float]:
    """``value`` as a Python int or float, for the scalar ops.

    Accepts Python and numpy real numbers, 0-d arrays and one-element arrays (numpy or
    NDArray); a bool, complex number, string or larger array is a TypeError. Converting keeps
    the tensor's dtype: a numpy float64 scalar does not promote a float32 tensor.
    """
    kind = type(value)
    if kind is float or kind is int:  # the common case, without the ABC checks below
        return cast(Union[int, float], value)
    if isinstance(value, (bool, numpy.bool_)):
        raise TypeError(f"{what} needs a real number, got a bool")
    if isinstance(value, Integral):
        return int(value)
    if isinstance(value, Real):
        return float(value)
    if isinstance(value, NDArray) and not isinstance(value, numpy.ndarray):
        value = value.numpy()
    if isinstance(value, numpy.ndarray):
        if value.size != 1:
            raise TypeError(
                f"{what} needs a scalar or a one-element array, got an array of shape "
                f"{value.shape} (wrap it in a Tensor for an element-wise op)"
            )
        if value.dtype.kind in "iuf":
            return value.item()
        raise TypeError(f"{what} needs a real number, got an array of dtype {value.dtype}")
    raise TypeError(
        f"{what} needs a real number (int, float, numpy scalar or one-element "
        f"array), got {type(value).__name__}"
    )


def _cached_or_checked(check: Any, *args: Any) -> Any:
    """``check(*args)`` through its lru_cache, or uncached when an argument cannot be a cache
    key (a list where an int belongs): the uncached check then names the problem."""
    try:
        return check(*args)
    except TypeError:
        return check.__wrapped__(*args)


def _sum_to_shape(x: Tensor, shape) -> Tensor:
    """Sum ``x`` over the dimensions that broadcasting added to reach it from ``shape``."""
    shape = tuple(shape)
    return x if x.shape == shape else SumToShape(shape)(x)


@functools.lru_cache(maxsize=1024)
def _summed_axes(a_shape: Tuple[int, ...], shape: Tuple[int, ...]) -> Tuple[int, ...]:
    """The axes of ``a_shape`` that broadcasting ``shape`` to it added or stretched (cached)."""
    lead = len(a_shape) - len(shape)
    return tuple(range(lead)) + tuple(
        lead + i for i, d in enumerate(shape) if d == 1 and a_shape[lead + i] != 1
    )


class SumToShape(TensorOp):
    """Sum ``a`` down to ``shape``, the adjoint of broadcasting ``shape`` to ``a.shape``: over
    the leading axes broadcasting added and every axis where ``shape`` has 1 and ``a`` does not.
    One node (a sum and a free reshape) where the course writes summation then reshape; its
    gradient broadcasts back. Internal: the gradient of the broadcasting ops."""

    def __init__(self, shape: Sequence[int]) -> None:
        self.shape = tuple(shape)

    def compute(self, a: NDArray):
        axes = _summed_axes(tuple(a.shape), self.shape)
        out = _reduce_sum(a, axes, keepdims=True) if axes else a
        return out.compact().reshape(self.shape)

    def gradient(self, out_grad: Tensor, node: Tensor):
        return broadcast_to(out_grad, node.inputs[0].shape)


@functools.lru_cache(maxsize=256)
def _inverse_permutation(axes: Tuple[int, ...]) -> Tuple[int, ...]:
    """The axis order that undoes ``permute(axes)`` (negative axes allowed)."""
    inverse = [0] * len(axes)
    for i, axis in enumerate(axes):
        inverse[axis % len(axes)] = i
    return tuple(inverse)


def _binary_adjoints(ga: Tensor, gb: Tensor, node: Tensor):
    """The adjoints (ga, gb) of a broadcasting binary op, each summed to its input's shape."""
    a, b = node.inputs
    return _sum_to_shape(ga, a.shape), _sum_to_shape(gb, b.shape)


# ---- element-wise and scalar arithmetic ----------------------------------------------------
class EWiseAdd(TensorOp):
    """a + b, broadcasting like numpy."""

    gradient_reads_output = False

    # question: hw1_add_forward
    def compute(self, a: NDArray, b: NDArray):
        return a + b

    # question: hw1_add_backward
    def gradient(self, out_grad: Tensor, node: Tensor):
        return _binary_adjoints(out_grad, out_grad, node)


def add(a: Tensor, b: Tensor) -> Tensor:
    """a + b, element-wise (numpy broadcasting)."""
    return EWiseAdd()(a, b)


class BiasAdd(TensorOp):
    """x + b for x (..., C) and a bias b of C elements (shape (C,), (1, C), (1, 1, 1, C), ...),
    broadcast over the leading axes inside the array op: one node where the course writes
    reshape, broadcast_to and add (an extension; same values). The bias adjoint is the
    output adjoint summed over the leading axes."""

    gradient_reads_output = False

    def compute(self, x: NDArray, b: NDArray):
        return x + b.reshape((x.shape[-1],))

    def gradient(self, out_grad: Tensor, node: Tensor):
        return out_grad, _sum_to_shape(out_grad, node.inputs[1].shape)


def bias_add(x: Tensor, b: Tensor) -> Tensor:
    """``x`` (..., C) plus the bias ``b`` (C elements, every other dimension 1) on each row."""
    c = x.shape[-1] if x.shape else None
    if (
        c is None
        or len(b.shape) == 0
        or len(b.shape) > len(x.shape)
        or b.shape[-1] != c
        or any(d != 1 for d in b.shape[:-1])
    ):
        raise ValueError(
            f"bias_add: a bias of shape {tuple(b.shape)} does not match the last axis of an "
            f"input of shape {tuple(x.shape)}"
        )
    return BiasAdd()(x, b)


class _ScalarOp(TensorOp):
    """An op with one tensor input and a real ``scalar`` (see :func:`scalar_value`)."""

    def __init__(self, scalar: object) -> None:
        self.scalar = scalar_value(scalar, type(self).__name__)


class AddScalar(_ScalarOp):
    """a + scalar."""

    # question: hw1_add_scalar_forward
    def compute(self, a: NDArray):
        return a + self.scalar

    # question: hw1_add_scalar_backward
    def gradient(self, out_grad: Tensor, node: Tensor):
        return out_grad


def add_scalar(a: Tensor, scalar: float) -> Tensor:
    """a + scalar, element-wise."""
    return AddScalar(scalar)(a)


class EWiseMul(TensorOp):
    """a * b, broadcasting like numpy."""

    # question: hw1_multiply_forward
    def compute(self, a: NDArray, b: NDArray):
        return a * b

    # question: hw1_multiply_backward
    def gradient(self, out_grad: Tensor, node: Tensor):
        lhs, rhs = node.inputs
        return _binary_adjoints(out_grad * rhs, out_grad * lhs, node)


def multiply(a: Tensor, b: Tensor) -> Tensor:
    """a * b, element-wise (numpy broadcasting)."""
    return EWiseMul()(a, b)


class MulScalar(_ScalarOp):
    """a * scalar."""

    # question: hw1_mul_scalar_forward
    def compute(self, a: NDArray):
        return a * self.scalar

    # question: hw1_mul_scalar_backward
    def gradient(self, out_grad: Tensor, node: Tensor):
        return (out_grad * self.scalar,)


def mul_scalar(a: Tensor, scalar: float) -> Tensor:
    """a * scalar, element-wise."""
    return MulScalar(scalar)(a)


class EWisePow(TensorOp):
    """a ** b element-wise, broadcasting like numpy.

    The gradient with respect to b needs log(a), so it is finite for a > 0 only.
    """

    # question: hw1_power_forward
    def compute(self, a: NDArray, b: NDArray):
        return a**b

    # question: hw1_power_backward
    def gradient(self, out_grad: Tensor, node: Tensor):
        a, b = node.inputs
        return _binary_adjoints(out_grad * b * power(a, b - 1), out_grad * node * log(a), node)


def power(a: Tensor, b: Tensor) -> Tensor:
    """a ** b, element-wise (numpy broadcasting)."""
    return EWisePow()(a, b)


class PowerScalar(_ScalarOp):
    """a ** scalar; the exponent may be any real number (non-integers need a >= 0)."""

    # question: hw1_power_scalar_forward
    def compute(self, a: NDArray):
        return a**self.scalar

    # question: hw1_power_scalar_backward
    def gradient(self, out_grad: Tensor, node: Tensor):
        a = node.inputs[0]
        if self.scalar == 0:
            return out_grad * 0
        return out_grad * power_scalar(a, self.scalar - 1) * self.scalar


def power_scalar(a: Tensor, scalar: float) -> Tensor:
    """a ** scalar, element-wise."""
    return PowerScalar(scalar)(a)


class EWiseDiv(TensorOp):
    """a / b, broadcasting like numpy."""

    # question: hw1_divide_forward
    def compute(self, a: NDArray, b: NDArray):
        return a / b

    # question: hw1_divide_backward
    def gradient(self, out_grad: Tensor, node: Tensor):
        lhs, rhs = node.inputs
        return _binary_adjoints(out_grad / rhs, -out_grad * lhs / (rhs * rhs), node)


def divide(a: Tensor, b: Tensor) -> Tensor:
    """a / b, element-wise (numpy broadcasting)."""
    return EWiseDiv()(a, b)


class DivScalar(_ScalarOp):
    """a / scalar."""

    # question: hw1_divide_scalar_forward
    def compute(self, a: NDArray):
        return a / self.scalar

    # question: hw1_divide_scalar_backward
    def gradient(self, out_grad: Tensor, node: Tensor):
        return out_grad / self.scalar


def divide_scalar(a: Tensor, scalar: float) -> Tensor:
    """a / scalar, element-wise."""
    return DivScalar(scalar)(a)


class Negate(TensorOp):
    """-a."""

    # question: hw1_negate_forward
    def compute(self, a: NDArray):
        return -a

    # question: hw1_negate_backward
    def gradient(self, out_grad: Tensor, node: Tensor):
        return -out_grad


def negate(a: Tensor) -> Tensor:
    """-a, element-wise."""
    return Negate()(a)


class Log(TensorOp):
    """Natural logarithm, element-wise (log 0 = -inf, negative -> NaN)."""

    # question: hw1_log_forward
    def compute(self, a: NDArray):
        return a.log()

    # question: hw1_log_backward
    def gradient(self, out_grad: Tensor, node: Tensor):
        return out_grad / node.inputs[0]


def log(a: Tensor) -> Tensor:
    """log(a), element-wise."""
    return Log()(a)


class Exp(TensorOp):
    """exp(a), element-wise."""

    # question: hw1_exp_forward
    def compute(self, a: NDArray):
        return a.exp()

    # question: hw1_exp_backward
    def gradient(self, out_grad: Tensor, node: Tensor):
        return out_grad * node


def exp(a: Tensor) -> Tensor:
    """exp(a), element-wise."""
    return Exp()(a)


class ReLU(TensorOp):
    """max(a, 0), element-wise; its derivative is taken as 0 at a = 0."""

    # question: hw1_relu_forward
    def compute(self, a: NDArray):
        return a.relu()

    # question: hw1_relu_backward
    def gradient(self, out_grad: Tensor, node: Tensor):
        return out_grad * Tensor.make_const(_relu_mask(node.realize_cached_data()))


def _relu_mask(out: NDArray) -> NDArray:
    """The derivative of relu read off its output: 1 where ``out`` > 0, else 0 (relu(a) > 0
    exactly where a > 0, so the derivative at a = 0 is 0); a bool array under numpy."""
    return out > 0


def relu(a: Tensor) -> Tensor:
    """max(a, 0), element-wise."""
    return ReLU()(a)


# question: hw4_tanh
class Tanh(TensorOp):
    """tanh(a), element-wise; derivative 1 - tanh(a)²."""

    def compute(self, a: NDArray):
        return a.tanh()

    def gradient(self, out_grad: Tensor, node: Tensor):
        return out_grad * (-(node * node) + 1)


def tanh(a: Tensor) -> Tensor:
    """tanh(a), element-wise."""
    return Tanh()(a)


# ---- shape ops ----------------------------------------------------------------------------
class Transpose(TensorOp):
    """Swap two axes: ``axes=(i, j)``; the default None swaps the last two."""

    def __init__(self, axes: Optional[Sequence[int]] = None) -> None:
        if axes is not None and (len(tuple(axes)) != 2):
            raise ValueError(f"Transpose swaps exactly two axes, got axes={axes!r}")
        self.axes = None if axes is None else tuple(axes)

    def _perm(self, ndim: int):
        return _cached_or_checked(_swap_permutation, self.axes, ndim)

    # question: hw1_transpose_forward
    def compute(self, a: NDArray):
        return a.permute(self._perm(a.ndim))

    # question: hw1_transpose_backward
    def gradient(self, out_grad: Tensor, node: Tensor):
        return transpose(out_grad, self.axes)


@functools.lru_cache(maxsize=256)
def _swap_permutation(axes: Optional[Tuple[int, int]], ndim: int) -> Tuple[int, ...]:
    """The axis order of ``ndim`` axes with ``axes`` (default: the last two) swapped (cached:
    every backward through a product transposes)."""
    if ndim < 2:
        raise ValueError(f"transpose needs at least 2 dimensions, got {ndim}")
    i, j = (ndim - 2, ndim - 1) if axes is None else _unsorted_axes(axes, ndim)
    perm = list(range(ndim))
    perm[i], perm[j] = perm[j], perm[i]
    return tuple(perm)


def _unsorted_axes(axes, ndim):
    for ax in axes:
        if not isinstance(ax, (int, numpy.integer)) or not -ndim <= ax < ndim:
            raise ValueError(f"transpose: axis {ax!r} is out of range for {ndim} dimensions")
    return tuple(int(ax) % ndim for ax in axes)


def transpose(a: Tensor, axes: Optional[Sequence[int]] = None) -> Tensor:
    """``a`` with two axes swapped (default: the last two)."""
    return Transpose(axes)(a)


# Axis orders between the course's NCHW images and the channels-last layout of the kernels.
NCHW_TO_NHWC = (0, 2, 3, 1)
NHWC_TO_NCHW = (0, 3, 1, 2)


class Permute(TensorOp):
    """Reorder every axis: output axis ``i`` is input axis ``axes[i]`` (an extension; the course
    composes ``transpose`` calls). One view forward, one inverse permutation backward, so a
    layout change such as NCHW -> NHWC is one graph node instead of two transposes. With
    ``compact=True`` the result is a row-major copy, made once for every op that reads it."""

    def __init__(self, axes: Sequence[int], compact: bool = False) -> None:
        self.axes = tuple(axes)
        self.compact = compact

    def compute(self, a: NDArray):
        out = a.permute(self.axes)  # which checks that the axes are a permutation
        return out.compact() if self.compact else out

    def gradient(self, out_grad: Tensor, node: Tensor):
        return permute(out_grad, _inverse_permutation(self.axes))


def permute(a: Tensor, axes: Sequence[int], compact: bool = False) -> Tensor:
    """``a`` with its axes reordered: ``permute(a, axes).shape[i] == a.shape[axes[i]]`` (a
    view; a row-major copy with ``compact=True``)."""
    return Permute(axes, compact)(a)


def compacted(a: Tensor) -> Tensor:
    """``a`` itself when its array is row-major, else one node holding a row-major copy, for
    several kernels that each need one (they would each copy)."""
    data = a.realize_cached_data()
    if not hasattr(data, "is_compact") or data.is_compact():
        return a
    return Permute(tuple(range(len(a.shape))), compact=True)(a)


def _shape_arg(shape: ShapeArg) -> Tuple[int, ...]:
    if type(shape) is tuple:  # the common case, as is
        return shape
    return (int(shape),) if isinstance(shape, (int, numpy.integer)) else tuple(shape)


class Reshape(TensorOp):
    """``a`` with a new shape holding the same number of elements (one -1 may be inferred).

    A view when ``a`` is compact, else a compact copy; a size mismatch is a ValueError.
    """

    def __init__(self, shape: ShapeArg) -> None:
        self.shape = _shape_arg(shape)

    # question: hw1_reshape_forward
    def compute(self, a: NDArray):
        return a.compact().reshape(self.shape)

    # question: hw1_reshape_backward
    def gradient(self, out_grad: Tensor, node: Tensor):
        return reshape(out_grad, node.inputs[0].shape)


def reshape(a: Tensor, shape: ShapeArg) -> Tensor:
    """``a`` reshaped to ``shape``."""
    return Reshape(shape)(a)


class BroadcastTo(TensorOp):
    """Broadcast ``a`` to ``shape`` (numpy rules: size-1 dims repeat, new dims lead).

    The gradient sums over every broadcast dimension.
    """

    def __init__(self, shape: ShapeArg) -> None:
        self.shape = _shape_arg(shape)

    # question: hw1_broadcast_to_forward
    def compute(self, a: NDArray):
        if not _cached_or_checked(_broadcasts, tuple(a.shape), self.shape):
            raise ValueError(f"cannot broadcast shape {tuple(a.shape)} to {self.shape}")
        return a.broadcast_to(self.shape)

    # question: hw1_broadcast_to_backward
    def gradient(self, out_grad: Tensor, node: Tensor):
        return _sum_to_shape(out_grad, node.inputs[0].shape)


@functools.lru_cache(maxsize=1024)
def _broadcasts(old: Tuple[int, ...], new: Tuple[int, ...]) -> bool:
    """Whether numpy's rules broadcast shape ``old`` to ``new`` (cached: the same broadcasts
    recur every step)."""
    lead = len(new) - len(old)
    return lead >= 0 and all(o == 1 or o == n for o, n in zip(old, new[lead:]))


def broadcast_to(a: Tensor, shape: ShapeArg) -> Tensor:
    """``a`` broadcast to ``shape``."""
    return BroadcastTo(shape)(a)


def _reduce_sum(a: NDArray, axes: Tuple[int, ...], keepdims: bool = False) -> NDArray:
    """Sum of the array ``a`` over ``axes`` (sorted non-negative ints); () sums nothing."""
    if not axes:
        return a
    out = a.sum(axis=axes, keepdims=keepdims)
    if not keepdims and len(axes) == a.ndim and out.ndim:
        out = out.reshape(())
    return out


@functools.lru_cache(maxsize=1024)
def _kept_shape(axes: Tuple[int, ...], shape: Tuple[int, ...]) -> Tuple[int, ...]:
    """``shape`` with the dimensions in ``axes`` set to 1 (a sum's result with keepdims)."""
    return tuple(1 if i in axes else d for i, d in enumerate(shape))


class Summation(TensorOp):
    """Sum over ``axes`` (None: all, an int, or a tuple), without keepdims.

    Summing over every axis gives a 0-d tensor (shape ()) on both backends.
    """

    def __init__(self, axes: Optional[Union[int, tuple]] = None):
        if isinstance(axes, list):
            axes = tuple(axes)
        self.axes = axes

    # question: hw1_summation_forward
    def compute(self, a: NDArray):
        return _reduce_sum(a, _norm_axes(self.axes, a.ndim, "summation"))

    # question: hw1_summation_backward
    def gradient(self, out_grad: Tensor, node: Tensor):
        in_shape = node.inputs[0].shape
        kept = _kept_shape(_norm_axes(self.axes, len(in_shape), "summation"), tuple(in_shape))
        return broadcast_to(reshape(out_grad, kept), in_shape)


def summation(a: Tensor, axes: Optional[Union[int, tuple]] = None) -> Tensor:
    """Sum of ``a`` over ``axes`` (None: every axis)."""
    return Summation(axes)(a)


class MatMul(TensorOp):
    """Matrix product over the last two axes, batched and broadcast like numpy.

    a: (*batch_a, m, n), b: (*batch_b, n, p) -> (*broadcast(batch_a, batch_b), m, p); both
    operands need at least 2 dimensions. The gradient sums over broadcast batch dimensions.
    """

    gradient_reads_output = False

    # question: hw1_matmul_forward
    def compute(self, a: NDArray, b: NDArray):
        if a.ndim < 2 or b.ndim < 2:
            raise ValueError(
                f"matmul needs operands with at least 2 dimensions, got shapes "
                f"{tuple(a.shape)} and {tuple(b.shape)}"
            )
        if a.shape[-1] != b.shape[-2]:
            raise ValueError(f"matmul inner sizes differ: {tuple(a.shape)} @ {tuple(b.shape)}")
        return a @ b

    # question: hw1_matmul_backward
    def gradient(self, out_grad: Tensor, node: Tensor):
        a, b = node.inputs
        # An input that needs no gradient (a one-hot matrix, a data batch) gets None, which
        # backward skips: its adjoint would be a full product computed for nothing.
        ga = _sum_to_shape(matmul(out_grad, transpose(b)), a.shape) if a.requires_grad else None
        gb = _sum_to_shape(matmul(transpose(a), out_grad), b.shape) if b.requires_grad else None
        return ga, gb


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """a @ b over the last two axes (batched, broadcasting)."""
    return MatMul()(a, b)


__all__ = [
    "EWiseAdd",
    "add",
    "BiasAdd",
    "bias_add",
    "AddScalar",
    "add_scalar",
    "EWiseMul",
    "multiply",
    "MulScalar",
    "mul_scalar",
    "EWisePow",
    "power",
    "PowerScalar",
    "power_scalar",
    "EWiseDiv",
    "divide",
    "DivScalar",
    "divide_scalar",
    "Negate",
    "negate",
    "Log",
    "log",
    "Exp",
    "exp",
    "ReLU",
    "relu",
    "Tanh",
    "tanh",
    "Transpose",
    "transpose",
    "Permute",
    "permute",
    "compacted",
    "Reshape",
    "reshape",
    "BroadcastTo",
    "broadcast_to",
    "SumToShape",
    "Summation",
    "summation",
    "MatMul",
    "matmul",
]
