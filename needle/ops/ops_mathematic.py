"""Element-wise, scalar, shape and matrix ops (hw1, hw2, hw4).

Each op's ``compute`` works on the backend's raw arrays — needle's NDArray (``NEEDLE_BACKEND=nd``,
element-wise ops need equal shapes, reductions/broadcasts/permutes are NDArray methods) or numpy
(``NEEDLE_BACKEND=np``) — and its ``gradient`` is written with needle ops, so it can be
differentiated again.
"""
from __future__ import annotations

from numbers import Number
from typing import Optional, Tuple, Union

import numpy

from ..autograd import NDArray, Tensor, TensorOp
from ..backend_selection import array_api

_NUMPY = array_api is numpy


# ---- backend helpers (raw arrays) ----------------------------------------------------------
def _compact(a):
    """``a`` laid out contiguously (NDArray.compact; numpy arrays are returned as they are)."""
    return a if _NUMPY else a.compact()


def _reshape(a, shape):
    shape = tuple(shape)
    if _NUMPY:
        return numpy.reshape(a, shape)
    return a.compact().reshape(shape)


def _permute(a, axes):
    return numpy.transpose(a, axes) if _NUMPY else a.permute(tuple(axes))


def _broadcast(a, shape):
    return numpy.broadcast_to(a, tuple(shape)) if _NUMPY else a.broadcast_to(tuple(shape))


def _sum(a, axes, keepdims: bool = False):
    """Sum over ``axes`` (a tuple of non-negative ints; () sums nothing)."""
    if len(axes) == 0:
        return a
    if _NUMPY:
        return numpy.asarray(numpy.sum(a, axis=axes, keepdims=keepdims))
    return a.sum(axis=tuple(axes), keepdims=keepdims)


def _max(a, axes, keepdims: bool = False):
    if len(axes) == 0:
        return a
    if _NUMPY:
        return numpy.asarray(numpy.max(a, axis=axes, keepdims=keepdims))
    return a.max(axis=tuple(axes), keepdims=keepdims)


def _empty(shape, like):
    if _NUMPY:
        return numpy.empty(tuple(shape), dtype=like.dtype)
    return array_api.empty(tuple(shape), device=like.device)


def _zeros(shape, like):
    if _NUMPY:
        return numpy.zeros(tuple(shape), dtype=like.dtype)
    return array_api.full(tuple(shape), 0.0, device=like.device)


def _positive_mask(a):
    """1.0 where a > 0, else 0.0, in ``a``'s dtype."""
    return (a > 0).astype(a.dtype) if _NUMPY else (a > 0)


def _norm_axes(axes, ndim: int, what: str) -> Tuple[int, ...]:
    """``axes`` (None: all, int or sequence) as sorted non-negative ints, validated."""
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


def _check_same_shape(a, b, what: str) -> None:
    if tuple(a.shape) != tuple(b.shape):
        raise ValueError(f"{what}: operand shapes {tuple(a.shape)} and {tuple(b.shape)} differ "
                         "(needle does not broadcast implicitly: use broadcast_to)")


def _check_scalar(scalar, what: str):
    if not isinstance(scalar, Number) or isinstance(scalar, bool):
        raise TypeError(f"{what} needs a number, got {type(scalar).__name__}")
    return scalar


def _sum_to_shape(x: Tensor, shape) -> Tensor:
    """Sum ``x`` over the dimensions that broadcasting added to reach it from ``shape``."""
    shape = tuple(shape)
    if tuple(x.shape) == shape:
        return x
    lead = len(x.shape) - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, d in enumerate(shape) if d == 1 and x.shape[lead + i] != 1)
    if axes:
        x = summation(x, axes)
    return reshape(x, shape) if tuple(x.shape) != shape else x


# ---- element-wise and scalar arithmetic ----------------------------------------------------
class EWiseAdd(TensorOp):
    """a + b for tensors of equal shape."""

    def compute(self, a: NDArray, b: NDArray):
        _check_same_shape(a, b, "add")
        return a + b

    def gradient(self, out_grad: Tensor, node: Tensor):
        return out_grad, out_grad


def add(a: Tensor, b: Tensor) -> Tensor:
    """a + b, element-wise (equal shapes)."""
    return EWiseAdd()(a, b)


class AddScalar(TensorOp):
    """a + scalar."""

    def __init__(self, scalar):
        self.scalar = _check_scalar(scalar, "AddScalar")

    def compute(self, a: NDArray):
        return a + self.scalar

    def gradient(self, out_grad: Tensor, node: Tensor):
        return out_grad


def add_scalar(a: Tensor, scalar: float) -> Tensor:
    """a + scalar, element-wise."""
    return AddScalar(scalar)(a)


class EWiseMul(TensorOp):
    """a * b for tensors of equal shape."""

    def compute(self, a: NDArray, b: NDArray):
        _check_same_shape(a, b, "multiply")
        return a * b

    def gradient(self, out_grad: Tensor, node: Tensor):
        lhs, rhs = node.inputs
        return out_grad * rhs, out_grad * lhs


def multiply(a: Tensor, b: Tensor) -> Tensor:
    """a * b, element-wise (equal shapes)."""
    return EWiseMul()(a, b)


class MulScalar(TensorOp):
    """a * scalar."""

    def __init__(self, scalar):
        self.scalar = _check_scalar(scalar, "MulScalar")

    def compute(self, a: NDArray):
        return a * self.scalar

    def gradient(self, out_grad: Tensor, node: Tensor):
        return (out_grad * self.scalar,)


def mul_scalar(a: Tensor, scalar: float) -> Tensor:
    """a * scalar, element-wise."""
    return MulScalar(scalar)(a)


class EWisePow(TensorOp):
    """a ** b element-wise, for equal shapes.

    On the NDArray backend it is computed as exp(b·log(a)), so it is defined for a >= 0 only
    (a < 0 gives NaN); numpy computes integer powers of negatives too. The gradient needs
    log(a), so it is finite for a > 0.
    """

    def compute(self, a: NDArray, b: NDArray):
        _check_same_shape(a, b, "power")
        if _NUMPY:
            return a ** b
        return array_api.exp(b * array_api.log(a))

    def gradient(self, out_grad: Tensor, node: Tensor):
        a, b = node.inputs
        return out_grad * b * power(a, b - 1), out_grad * node * log(a)


def power(a: Tensor, b: Tensor) -> Tensor:
    """a ** b, element-wise (equal shapes)."""
    return EWisePow()(a, b)


class PowerScalar(TensorOp):
    """a ** scalar; the exponent may be any real number (non-integers need a >= 0)."""

    def __init__(self, scalar):
        self.scalar = _check_scalar(scalar, "PowerScalar")

    def compute(self, a: NDArray):
        return a ** self.scalar

    def gradient(self, out_grad: Tensor, node: Tensor):
        a = node.inputs[0]
        if self.scalar == 0:
            return out_grad * 0
        return out_grad * power_scalar(a, self.scalar - 1) * self.scalar


def power_scalar(a: Tensor, scalar: float) -> Tensor:
    """a ** scalar, element-wise."""
    return PowerScalar(scalar)(a)


class EWiseDiv(TensorOp):
    """a / b for tensors of equal shape."""

    def compute(self, a: NDArray, b: NDArray):
        _check_same_shape(a, b, "divide")
        return a / b

    def gradient(self, out_grad: Tensor, node: Tensor):
        lhs, rhs = node.inputs
        return out_grad / rhs, -out_grad * lhs / (rhs * rhs)


def divide(a: Tensor, b: Tensor) -> Tensor:
    """a / b, element-wise (equal shapes)."""
    return EWiseDiv()(a, b)


class DivScalar(TensorOp):
    """a / scalar."""

    def __init__(self, scalar):
        self.scalar = _check_scalar(scalar, "DivScalar")

    def compute(self, a: NDArray):
        return a / self.scalar

    def gradient(self, out_grad: Tensor, node: Tensor):
        return out_grad / self.scalar


def divide_scalar(a: Tensor, scalar: float) -> Tensor:
    """a / scalar, element-wise."""
    return DivScalar(scalar)(a)


class Negate(TensorOp):
    """-a."""

    def compute(self, a: NDArray):
        return -a

    def gradient(self, out_grad: Tensor, node: Tensor):
        return -out_grad


def negate(a: Tensor) -> Tensor:
    """-a, element-wise."""
    return Negate()(a)


class Log(TensorOp):
    """Natural logarithm, element-wise (log 0 = -inf, negative -> NaN)."""

    def compute(self, a: NDArray):
        return array_api.log(a)

    def gradient(self, out_grad: Tensor, node: Tensor):
        return out_grad / node.inputs[0]


def log(a: Tensor) -> Tensor:
    """log(a), element-wise."""
    return Log()(a)


class Exp(TensorOp):
    """exp(a), element-wise."""

    def compute(self, a: NDArray):
        return array_api.exp(a)

    def gradient(self, out_grad: Tensor, node: Tensor):
        return out_grad * node


def exp(a: Tensor) -> Tensor:
    """exp(a), element-wise."""
    return Exp()(a)


class ReLU(TensorOp):
    """max(a, 0), element-wise; its derivative is taken as 0 at a = 0."""

    def compute(self, a: NDArray):
        return array_api.maximum(a, 0)

    def gradient(self, out_grad: Tensor, node: Tensor):
        mask = Tensor.make_const(_positive_mask(node.inputs[0].realize_cached_data()))
        return out_grad * mask


def relu(a: Tensor) -> Tensor:
    """max(a, 0), element-wise."""
    return ReLU()(a)


class Tanh(TensorOp):
    """tanh(a), element-wise; derivative 1 - tanh(a)²."""

    def compute(self, a: NDArray):
        return array_api.tanh(a)

    def gradient(self, out_grad: Tensor, node: Tensor):
        return out_grad * (-(node * node) + 1)


def tanh(a: Tensor) -> Tensor:
    """tanh(a), element-wise."""
    return Tanh()(a)


# ---- shape ops ----------------------------------------------------------------------------
class Transpose(TensorOp):
    """Swap two axes: ``axes=(i, j)``; the default None swaps the last two."""

    def __init__(self, axes: Optional[tuple] = None):
        if axes is not None and (len(tuple(axes)) != 2):
            raise ValueError(f"Transpose swaps exactly two axes, got axes={axes!r}")
        self.axes = None if axes is None else tuple(axes)

    def _perm(self, ndim: int):
        if ndim < 2:
            raise ValueError(f"transpose needs at least 2 dimensions, got {ndim}")
        i, j = (ndim - 2, ndim - 1) if self.axes is None else _unsorted_axes(self.axes, ndim)
        perm = list(range(ndim))
        perm[i], perm[j] = perm[j], perm[i]
        return tuple(perm)

    def compute(self, a: NDArray):
        return _permute(a, self._perm(a.ndim))

    def gradient(self, out_grad: Tensor, node: Tensor):
        return transpose(out_grad, self.axes)


def _unsorted_axes(axes, ndim):
    for ax in axes:
        if not isinstance(ax, (int, numpy.integer)) or not -ndim <= ax < ndim:
            raise ValueError(f"transpose: axis {ax!r} is out of range for {ndim} dimensions")
    return tuple(int(ax) % ndim for ax in axes)


def transpose(a: Tensor, axes: Optional[tuple] = None) -> Tensor:
    """``a`` with two axes swapped (default: the last two)."""
    return Transpose(axes)(a)


class Reshape(TensorOp):
    """``a`` with a new shape holding the same number of elements (one -1 may be inferred)."""

    def __init__(self, shape):
        self.shape = (shape,) if isinstance(shape, (int, numpy.integer)) else tuple(shape)

    def compute(self, a: NDArray):
        size = int(numpy.prod(a.shape))
        shape = self.shape
        if shape.count(-1) == 1:
            known = int(numpy.prod([d for d in shape if d != -1]))
            if known == 0 or size % known:
                raise ValueError(f"cannot reshape shape {tuple(a.shape)} into {shape}")
            shape = tuple(size // known if d == -1 else d for d in shape)
        if int(numpy.prod(shape)) != size or any(d < 0 for d in shape):
            raise ValueError(f"cannot reshape an array of shape {tuple(a.shape)} ({size} elements) "
                             f"into shape {self.shape}")
        return _reshape(a, shape)

    def gradient(self, out_grad: Tensor, node: Tensor):
        return reshape(out_grad, node.inputs[0].shape)


def reshape(a: Tensor, shape: tuple) -> Tensor:
    """``a`` reshaped to ``shape``."""
    return Reshape(shape)(a)


class BroadcastTo(TensorOp):
    """Broadcast ``a`` to ``shape`` (numpy rules: size-1 dims repeat, new dims lead).

    The gradient sums over every broadcast dimension.
    """

    def __init__(self, shape):
        self.shape = (shape,) if isinstance(shape, (int, numpy.integer)) else tuple(shape)

    def compute(self, a: NDArray):
        old = tuple(a.shape)
        lead = len(self.shape) - len(old)
        if lead < 0 or any(o != 1 and o != n for o, n in zip(old, self.shape[lead:])):
            raise ValueError(f"cannot broadcast shape {old} to {self.shape}")
        return _broadcast(a, self.shape)

    def gradient(self, out_grad: Tensor, node: Tensor):
        return _sum_to_shape(out_grad, node.inputs[0].shape)


def broadcast_to(a: Tensor, shape: tuple) -> Tensor:
    """``a`` broadcast to ``shape``."""
    return BroadcastTo(shape)(a)


class Summation(TensorOp):
    """Sum over ``axes`` (None: all, an int, or a tuple), without keepdims.

    Summing over every axis gives a 0-d tensor (shape ()) on both backends.
    """

    def __init__(self, axes: Optional[Union[int, tuple]] = None):
        if isinstance(axes, list):
            axes = tuple(axes)
        self.axes = axes

    def compute(self, a: NDArray):
        axes = _norm_axes(self.axes, a.ndim, "summation")
        out = _sum(a, axes)
        if not _NUMPY and len(axes) == a.ndim and a.ndim > 0:
            out = out.reshape(())  # NDArray.sum(None) gives shape (1,)
        return out

    def gradient(self, out_grad: Tensor, node: Tensor):
        in_shape = node.inputs[0].shape
        axes = _norm_axes(self.axes, len(in_shape), "summation")
        kept = tuple(1 if i in axes else d for i, d in enumerate(in_shape))
        return broadcast_to(reshape(out_grad, kept), in_shape)


def summation(a: Tensor, axes: Optional[Union[int, tuple]] = None) -> Tensor:
    """Sum of ``a`` over ``axes`` (None: every axis)."""
    return Summation(axes)(a)


class MatMul(TensorOp):
    """Matrix product over the last two axes, batched and broadcast like numpy.

    a: (*batch_a, m, n), b: (*batch_b, n, p) -> (*broadcast(batch_a, batch_b), m, p); both
    operands need at least 2 dimensions. The gradient sums over broadcast batch dimensions.
    """

    def compute(self, a: NDArray, b: NDArray):
        if a.ndim < 2 or b.ndim < 2:
            raise ValueError(f"matmul needs operands with at least 2 dimensions, got shapes "
                             f"{tuple(a.shape)} and {tuple(b.shape)}")
        if a.shape[-1] != b.shape[-2]:
            raise ValueError(f"matmul inner sizes differ: {tuple(a.shape)} @ {tuple(b.shape)}")
        try:
            batch = numpy.broadcast_shapes(tuple(a.shape[:-2]), tuple(b.shape[:-2]))
        except ValueError:
            raise ValueError(f"matmul batch dimensions do not broadcast: {tuple(a.shape)} @ "
                             f"{tuple(b.shape)}") from None
        if _NUMPY:
            return a @ b
        return _nd_batched_matmul(a, b, batch)

    def gradient(self, out_grad: Tensor, node: Tensor):
        a, b = node.inputs
        grad_a = matmul(out_grad, transpose(b))
        grad_b = matmul(transpose(a), out_grad)
        return _sum_to_shape(grad_a, a.shape), _sum_to_shape(grad_b, b.shape)


def _nd_batched_matmul(a: NDArray, b: NDArray, batch: tuple) -> NDArray:
    """Batched product with NDArray's 2-D ``@``: one call when either side has no batch."""
    m, n = a.shape[-2:]
    p = b.shape[-1]
    nbatch = int(numpy.prod(batch))
    if not batch:
        return a @ b
    if int(numpy.prod(b.shape[:-2])) == 1:
        # fold the batch into rows: (B·m, n) @ (n, p)
        rows = a.broadcast_to(batch + (m, n)).compact().reshape((nbatch * m, n))
        return (rows @ b.compact().reshape((n, p))).reshape(batch + (m, p))
    if int(numpy.prod(a.shape[:-2])) == 1:
        # (a @ b)ᵀ = bᵀ @ aᵀ: fold b's batch into the rows of bᵀ
        bt = b.broadcast_to(batch + (n, p)).permute(
            tuple(range(len(batch))) + (len(batch) + 1, len(batch)))
        bt = bt.compact().reshape((nbatch * p, n))
        at = a.compact().reshape((m, n)).permute((1, 0))
        out_t = (bt @ at).reshape(batch + (p, m))
        return out_t.permute(tuple(range(len(batch))) + (len(batch) + 1, len(batch))).compact()
    a3 = a.broadcast_to(batch + (m, n)).compact().reshape((nbatch, m, n))
    b3 = b.broadcast_to(batch + (n, p)).compact().reshape((nbatch, n, p))
    out = array_api.empty((nbatch, m, p), device=a.device)
    for i in range(nbatch):
        out[i] = (a3[i].compact().reshape((m, n)) @ b3[i].compact().reshape((n, p))).reshape(
            (1, m, p))
    return out.reshape(batch + (m, p))


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """a @ b over the last two axes (batched, broadcasting)."""
    return MatMul()(a, b)


__all__ = [
    "EWiseAdd", "add", "AddScalar", "add_scalar", "EWiseMul", "multiply", "MulScalar",
    "mul_scalar", "EWisePow", "power", "PowerScalar", "power_scalar", "EWiseDiv", "divide",
    "DivScalar", "divide_scalar", "Negate", "negate", "Log", "log", "Exp", "exp", "ReLU", "relu",
    "Tanh", "tanh", "Transpose", "transpose", "Reshape", "reshape", "BroadcastTo", "broadcast_to",
    "Summation", "summation", "MatMul", "matmul",
]
