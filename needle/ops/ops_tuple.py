"""Ops on TensorTuples: build one, pick a component, stack/split, a fused example op (hw4)."""

from __future__ import annotations

from typing import cast

from ..autograd import Tensor, TensorOp, TensorTuple, TensorTupleOp, zero_adjoints
from ..backend_selection import array_api


class MakeTensorTuple(TensorTupleOp):
    """Pack tensors into a TensorTuple; the gradient unpacks the tuple adjoint."""

    def compute(self, *args) -> tuple:
        return tuple(args)

    def gradient(self, out_grad: TensorTuple, node: TensorTuple):
        if not isinstance(out_grad, TensorTuple):
            raise TypeError(
                f"the adjoint of a TensorTuple must be a TensorTuple, got {type(out_grad).__name__}"
            )
        return tuple(out_grad[i] for i in range(len(out_grad)))


def make_tuple(*args) -> TensorTuple:
    """A TensorTuple of the given tensors."""
    return MakeTensorTuple()(*args)


class TupleGetItem(TensorOp):
    """Component ``index`` of a TensorTuple; the gradient sends zeros to every other component."""

    selects_component = True  # the backward pass routes adjoints to component ``index``

    def __init__(self, index: int):
        self.index = index

    def __call__(self, a: TensorTuple, fold_const: bool = True) -> Tensor:
        if not isinstance(a, TensorTuple):
            raise TypeError(f"tuple_get_item needs a TensorTuple, got {type(a).__name__}")
        # constant folding: make_tuple(x, y)[0] is x itself
        if fold_const and isinstance(a.op, MakeTensorTuple):
            return cast(Tensor, a.inputs[self.index])  # make_tuple's inputs are Tensors
        return Tensor.make_from_op(self, [a])

    def compute(self, a: tuple):
        return a[self.index]

    def gradient(self, out_grad: Tensor, node: Tensor):
        # the one Tensor whose input is a TensorTuple (see Tensor.inputs)
        parts = cast(TensorTuple, node.inputs[0]).realize_cached_data()
        in_grad = zero_adjoints(parts)
        in_grad[self.index] = out_grad
        return MakeTensorTuple()(*in_grad)


def tuple_get_item(value: TensorTuple, index: int) -> Tensor:
    """Component ``index`` of ``value``."""
    return TupleGetItem(index)(value)


class FusedAddScalars(TensorTupleOp):
    """(x + c0, x + c1) in one op: an example of an op with a tuple output."""

    def __init__(self, c0: float, c1: float):
        self.c0 = c0
        self.c1 = c1

    def compute(self, a) -> tuple:
        return a + self.c0, a + self.c1

    def gradient(self, out_grad: TensorTuple, node: TensorTuple):
        return out_grad[0] + out_grad[1]


def fused_add_scalars(x: Tensor, c0: float, c1: float) -> TensorTuple:
    """The pair (x + c0, x + c1) as a TensorTuple."""
    return FusedAddScalars(c0, c1)(x)


# question: hw4_stack
class Stack(TensorOp):
    """Stack equal-shaped tensors along a new axis ``axis``; takes a TensorTuple."""

    def __init__(self, axis: int):
        self.axis = axis

    def compute(self, args):
        if len(args) == 0:
            raise ValueError("stack needs at least one tensor")
        shape = tuple(args[0].shape)
        for i, arr in enumerate(args):
            if tuple(arr.shape) != shape:
                raise ValueError(
                    f"stack needs equal shapes: tensor 0 has shape {shape}, tensor {i} "
                    f"has {tuple(arr.shape)}"
                )
        ndim = len(shape) + 1
        if not -ndim <= self.axis < ndim:
            raise ValueError(f"stack: axis {self.axis} is out of range for {ndim} dimensions")
        axis = self.axis % ndim
        out_shape = shape[:axis] + (len(args),) + shape[axis:]
        out = array_api.empty(out_shape, dtype=args[0].dtype, device=args[0].device)
        slot = shape[:axis] + (1,) + shape[axis:]
        for i, arr in enumerate(args):
            if arr.device != out.device:
                raise ValueError(f"stack: tensor {i} is on {arr.device}, tensor 0 on {out.device}")
            out[(slice(None),) * axis + (slice(i, i + 1),)] = arr.compact().reshape(slot)
        return out

    def gradient(self, out_grad: Tensor, node: Tensor):
        return split(out_grad, self.axis)


def stack(args, axis: int) -> Tensor:
    """Stack a list/tuple of equal-shaped tensors along a new ``axis``."""
    return Stack(axis)(make_tuple(*args))


# question: hw4_split
class Split(TensorTupleOp):
    """Split along ``axis`` into a TensorTuple of its slices, removing the axis."""

    def __init__(self, axis: int):
        self.axis = axis

    def compute(self, A):
        if not -A.ndim <= self.axis < A.ndim:
            raise ValueError(f"split: axis {self.axis} is out of range for shape {tuple(A.shape)}")
        axis = self.axis % A.ndim
        new_shape = tuple(A.shape[:axis]) + tuple(A.shape[axis + 1 :])
        lead = (slice(None),) * axis
        return tuple(
            A[lead + (slice(i, i + 1),)].compact().reshape(new_shape) for i in range(A.shape[axis])
        )

    def gradient(self, out_grad: TensorTuple, node: TensorTuple):
        return stack(out_grad, self.axis)


def split(a: Tensor, axis: int) -> TensorTuple:
    """The slices of ``a`` along ``axis`` (axis removed), as a TensorTuple."""
    return Split(axis)(a)


__all__ = [
    "MakeTensorTuple",
    "make_tuple",
    "TupleGetItem",
    "tuple_get_item",
    "FusedAddScalars",
    "fused_add_scalars",
    "Stack",
    "stack",
    "Split",
    "split",
]
