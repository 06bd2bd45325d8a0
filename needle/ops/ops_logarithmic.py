"""Numerically stable log-sum-exp and log-softmax (hw2).

Both subtract the maximum over the reduced axes only (row by row for a batch, never a global
maximum), so logits as large as ±1e10 give finite, correct results. A slice that is entirely
-inf has log-sum-exp -inf (not NaN); NaN inputs propagate.
"""

from __future__ import annotations

from typing import Optional, Union

import numpy

from ..autograd import NDArray, Tensor, TensorOp
from ..backend_selection import array_api
from .ops_mathematic import (
    _kept_shape,
    _norm_axes,
    _reduce_sum,
    broadcast_to,
    exp,
    log,
    reshape,
    summation,
)


def _clamp_to_finite(m):
    """``m`` with +inf/-inf replaced by the largest finite value of the dtype (NaN stays NaN).

    A shift of ±inf would turn ``z - max`` into inf - inf = NaN; a finite shift keeps an
    all -inf slice at exp(-inf) = 0, so its log-sum-exp is log(0) + shift = -inf.
    """
    big = float(numpy.finfo(m.dtype).max)
    return -array_api.maximum(-array_api.maximum(m, -big), -big)


def _row_max(Z, axes: tuple):
    """The max of ``Z`` over ``axes`` (keepdims), clamped to finite values."""
    return _clamp_to_finite(Z.max(axis=axes, keepdims=True))


def _shifted_and_log_sum(Z, axes: tuple):
    """(Z - M, M, log Σ exp(Z - M)) with M the max over ``axes`` (keepdims, clamped finite)."""
    # log(0) = -inf for an all -inf slice is the intended result, not a numpy warning
    with numpy.errstate(divide="ignore", invalid="ignore"):
        m = _row_max(Z, axes)
        shifted = Z - m.broadcast_to(Z.shape)
        return shifted, m, _reduce_sum(shifted.exp(), axes, keepdims=True).log()


def _softmax(Z: Tensor, axes: tuple) -> Tensor:
    """softmax(Z) over ``axes`` as a needle expression (differentiable again).

    Written as exp((Z - M) - log Σ exp(Z - M)) with the row max M a constant: M cancels
    analytically, and unlike exp(Z - logsumexp(Z)) it keeps full precision when |Z| is huge
    (1e10 + log 2 rounds to 1e10 in float32).
    """
    kept = _kept_shape(axes, tuple(Z.shape))
    M = Tensor.make_const(_row_max(Z.realize_cached_data(), axes))
    shifted = Z - broadcast_to(M, Z.shape)
    log_sum = reshape(log(summation(exp(shifted), axes)), kept)
    return exp(shifted - broadcast_to(log_sum, Z.shape))


# question: hw2_logsumexp
class LogSumExp(TensorOp):
    """log(Σ exp(Z)) over ``axes`` (None: all, an int, or a tuple), without keepdims.

    Subtracts the max over ``axes``: Z (…) -> Z with ``axes`` removed. A slice of all -inf
    gives -inf; NaN propagates. Gradient: softmax of Z over ``axes`` times the adjoint.
    """

    def __init__(self, axes: Optional[Union[int, tuple]] = None):
        if isinstance(axes, list):
            axes = tuple(axes)
        self.axes = axes

    def compute(self, Z: NDArray):
        axes = _norm_axes(self.axes, Z.ndim, "logsumexp")
        if not axes:
            return Z
        out_shape = tuple(d for i, d in enumerate(Z.shape) if i not in axes)
        if any(Z.shape[i] == 0 for i in axes):  # the sum of no terms is 0: log 0 = -inf
            return array_api.full(out_shape, -numpy.inf, dtype=Z.dtype, device=Z.device)
        _, m, log_sum = _shifted_and_log_sum(Z, axes)
        return (log_sum + m).compact().reshape(out_shape)

    def gradient(self, out_grad: Tensor, node: Tensor):
        Z = node.inputs[0]
        axes = _norm_axes(self.axes, len(Z.shape), "logsumexp")
        if any(Z.shape[i] == 0 for i in axes):  # Z has no elements: an empty adjoint
            return Tensor.make_const(array_api.empty(Z.shape, dtype=Z.dtype, device=Z.device))
        kept = _kept_shape(axes, tuple(Z.shape))
        return broadcast_to(reshape(out_grad, kept), Z.shape) * _softmax(Z, axes)


def logsumexp(a: Tensor, axes: Optional[Union[int, tuple]] = None) -> Tensor:
    """Stable log(sum(exp(a))) over ``axes``."""
    return LogSumExp(axes=axes)(a)


class LogSoftmax(TensorOp):
    """Z - logsumexp(Z) over the last axis: (batch, classes) -> same shape (course: 2-D, axis 1).

    Stable: computed as (Z - M) - log Σ exp(Z - M) with M the row max. Entries of -inf give -inf; a
    row of all -inf gives NaN
    (softmax is 0/0 there, as in PyTorch). Gradient: g - softmax(Z)·Σ g over the row.
    """

    def compute(self, Z: NDArray):
        if Z.ndim < 1:
            raise ValueError("logsoftmax needs at least one dimension, got a 0-d array")
        if Z.shape[-1] == 0:  # rows of no entries: an empty result
            return array_api.empty(Z.shape, dtype=Z.dtype, device=Z.device)
        shifted, _, log_sum = _shifted_and_log_sum(Z, (Z.ndim - 1,))
        # (Z - M) - log Σ exp(Z - M), not Z - logsumexp(Z): keeps log 2 next to 1e10 in float32
        with numpy.errstate(invalid="ignore"):  # an all -inf row is NaN by definition
            return shifted - log_sum.broadcast_to(Z.shape)

    def gradient(self, out_grad: Tensor, node: Tensor):
        shape = node.shape
        kept = tuple(shape[:-1]) + (1,)
        row_sum = reshape(summation(out_grad, (len(shape) - 1,)), kept)
        return out_grad - exp(node) * broadcast_to(row_sum, shape)


def logsoftmax(a: Tensor) -> Tensor:
    """Stable log-softmax over the last axis (axis 1 of a (batch, classes) tensor)."""
    return LogSoftmax()(a)


__all__ = ["LogSumExp", "logsumexp", "LogSoftmax", "logsoftmax"]
