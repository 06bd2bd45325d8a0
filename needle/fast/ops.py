"""Fused ops: softmax cross-entropy, layer norm, batch norm (training statistics) and the LSTM
cell, each one kernel call forward and one backward (``array_api.softmax_xent`` etc.), a
whole LSTM layer over a sequence (one graph node; its backward makes one W_hh product), and the
embedding lookup (a gather forward, a scatter-add backward).

They compute exactly what the course's compositions of small ops compute (the tests compare
both, values and gradients) with far fewer graph nodes and array passes per training step.
Each op's gradient is another op wrapping its backward kernel, so ``backward()`` works as for
any op; the backward ops themselves have no gradient: differentiating a fused op twice raises
NotImplementedError (compose the course's ops instead when second derivatives are needed).
The embedding lookup and the (masked) softmax over the last axis are the exceptions: they
differentiate any number of times.
"""

from __future__ import annotations

import math
from typing import Tuple

from ..autograd import Tensor, TensorOp, TensorTuple, TensorTupleOp, Value, is_grad_enabled
from ..backend_selection import BACKEND, array_api
from ..ops import ops_conv
from ..ops.ops_mathematic import (
    NCHW_TO_NHWC,
    NHWC_TO_NCHW,
    ReLU,
    SumToShape,
    _relu_mask,
    matmul,
    permute,
    summation,
    transpose,
)

__all__ = [
    "SoftmaxCrossEntropy",
    "softmax_cross_entropy",
    "LayerNormRows",
    "layernorm_rows",
    "BatchNormColumns",
    "batchnorm_columns",
    "BatchNormTrain",
    "ConvBatchNormTrain",
    "batchnorm_train",
    "LSTMCellStep",
    "lstm_cell_step",
    "LSTMLayer",
    "lstm_layer",
    "MatMulAddBias",
    "matmul_add_bias",
    "Attention",
    "attention",
    "AttentionWeights",
    "attention_weights",
    "AttentionValues",
    "attention_values",
    "SelfAttentionQKV",
    "self_attention_qkv",
    "SoftmaxLastAxis",
    "SoftmaxLastAxisBackward",
    "softmax_last_axis",
    "EmbeddingLookup",
    "EmbeddingScatterAdd",
    "embedding",
]


class _BackwardOp:
    """Mixin for the backward op of a fused op: its own gradient is not implemented."""

    forward_name = "a fused op"

    def gradient(self, out_grad: Value, node: Value):
        raise NotImplementedError(
            f"the second derivative of {self.forward_name} is not implemented: its backward "
            "pass is one fused kernel; build the forward pass from the course's ops (e.g. "
            "logsumexp, summation, broadcast_to) to differentiate it twice"
        )


# ---- softmax cross-entropy ----------------------------------------------------------------------
class SoftmaxCrossEntropy(TensorOp):
    """Mean over the batch of the cross-entropy of logits (N, C) against fixed integer labels:
    a scalar (shape ()); an empty batch gives NaN (the mean of nothing, as in numpy and PyTorch).

    loss = mean_r(logsumexp(logits[r]) - logits[r, labels[r]]). ``labels`` is a raw array (N,)
    on the logits' device; it is data, not an input, so it gets no gradient. A non-target logit
    of -inf contributes nothing (the loss stays finite). Gradient: (softmax - one_hot)·adjoint/N.
    """

    def __init__(self, labels):
        self.labels = labels
        self.probs = None

    def compute(self, logits):
        loss, self.probs = array_api.softmax_xent(logits, self.labels)
        if self.probs.shape[0] == 0:  # the mean of nothing, as numpy and PyTorch give it
            return loss.sum(axis=(0,)) + float("nan")
        return (loss * self._scale()).sum(axis=(0,))

    def _scale(self) -> float:
        n = self.probs.shape[0]
        return 1.0 / n if n else float("nan")

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tensor:
        if self.probs is None:
            raise RuntimeError(
                "softmax_cross_entropy's saved probabilities were turned into its gradient by "
                "an earlier backward that recorded no graph (create_graph=False or no_grad())"
            )
        # A backward that records no graph frees this node once it has passed the gradient on
        # (autograd.compute_gradient_of_variables): the probabilities are read for the last
        # time, so the gradient is written over them instead of into a new (N, C) array.
        last_use = not is_grad_enabled()
        backward = SoftmaxCrossEntropyBackward(self.probs, self.labels, self._scale(), last_use)
        if last_use:
            self.probs = None
        return backward(out_grad, node.inputs[0])


class SoftmaxCrossEntropyBackward(_BackwardOp, TensorOp):
    """d logits (N, C) = (softmax - one_hot(labels))·adjoint·scale, from the scalar adjoint.

    Inputs (adjoint, logits): the logits are not read (softmax was saved by the forward pass)
    but make the gradient depend on them in the graph, so that differentiating it again raises
    instead of silently giving zero. With ``in_place`` the gradient overwrites ``probs`` (the
    caller's last use of them) in one kernel call, so it allocates no new (N, C) array."""

    forward_name = "softmax_cross_entropy"

    def __init__(self, probs, labels, scale: float, in_place: bool = False):
        self.probs, self.labels, self.scale = probs, labels, scale
        self.in_place = in_place

    def compute(self, dloss, _logits):
        out = self.probs if self.in_place else None
        return array_api.softmax_xent_bwd(self.probs, self.labels, dloss, self.scale, out=out)


def softmax_cross_entropy(logits: Tensor, labels: Tensor) -> Tensor:
    """Mean over the batch of the cross-entropy of ``logits`` (N, C) against the integer
    ``labels`` (N,) (a Tensor, on any device; it gets no gradient): a scalar Tensor."""
    y = labels.realize_cached_data()
    if labels.device != logits.device:
        y = Tensor(labels.numpy(), device=logits.device, dtype=logits.dtype).realize_cached_data()
    return SoftmaxCrossEntropy(y)(logits)


# ---- layer norm and batch norm ------------------------------------------------------------------
def _as_rows(x):
    """The array ``x`` (..., C) as the (R, C) matrix of its rows (a view when compact)."""
    if len(x.shape) == 2:
        return x
    return x.compact().reshape((math.prod(x.shape[:-1]), x.shape[-1]))


class LayerNormRows(TensorOp):
    """Layer norm: y = w·(x - mean)/sqrt(var + eps) + b with the mean and biased variance of
    each row of x (R, C); inputs (x, w, b), w and b of C elements. x may also be (..., C)
    (every leading index a row; an extension that saves the reshapes around the op).

    Nothing is saved between forward and backward: the backward kernel's xhat = (x - mean)·rstd
    and rstd are computed again from x (an input, kept by the graph anyway) by the same forward
    kernel, so they are the forward's bits exactly; keeping xhat cost one (R, C) array per
    layer norm until backward, PyTorch keeps none either."""

    def __init__(self, eps: float):
        self.eps = eps

    def compute(self, x, w, b):
        y = array_api.layernorm_fwd(_as_rows(x), w, b, self.eps)[0]
        return y.reshape(x.shape) if len(x.shape) != 2 else y

    def gradient(self, out_grad: Tensor, node: Tensor):
        # xhat and rstd depend on x alone (not on w, b)
        x, w, b = (t.realize_cached_data() for t in node.inputs)
        _, xhat, rstd = array_api.layernorm_fwd(_as_rows(x), w, b, self.eps)
        grads = NormBackward(array_api.layernorm_bwd, "layernorm_rows", xhat, rstd)(
            out_grad, *node.inputs
        )
        return tuple(grads[k] for k in range(3))


class BatchNormColumns(TensorTupleOp):
    """Batch norm in training mode, as the tuple (y, mean, var): y = w·(x - mean)/sqrt(var +
    eps) + b with the batch mean and biased batch variance (C,) of each column of x (N ≥ 1, C)
    over the batch; inputs (x, w, b), w and b of C elements. The statistics are returned for
    the running averages (``nn.BatchNorm1d`` reads them from the result); gradients through
    them are exact too. x may also be (..., C), normalised per channel over every leading
    index (``nn.BatchNorm2d`` on channels-last images; an extension)."""

    def __init__(self, eps: float):
        self.eps = eps
        self.xhat = self.rstd = None

    def compute(self, x, w, b):
        y, self.xhat, self.rstd, mean, var = array_api.batchnorm_fwd(_as_rows(x), w, b, self.eps)
        return (y.reshape(x.shape) if len(x.shape) != 2 else y), mean, var

    def gradient(self, out_grad: TensorTuple, node: TensorTuple):
        # Statistics that nothing downstream used have all-zero adjoints; reverse mode says
        # which (no need to read them back from the device to find out).
        unused: frozenset = getattr(out_grad, "zero_components", frozenset())
        grads = NormBackward(
            array_api.batchnorm_bwd,
            "batchnorm_columns",
            self.xhat,
            self.rstd,
            with_statistics=True,
            statistics_unused=unused >= {1, 2},
        )(out_grad, *node.inputs)
        return tuple(grads[k] for k in range(3))


class NormBackward(_BackwardOp, TensorTupleOp):
    """(dx, dw, db) of a :class:`LayerNormRows` or :class:`BatchNormColumns`: ``kernel`` is the
    array-API backward kernel (``layernorm_bwd`` or ``batchnorm_bwd``), ``xhat`` and ``rstd``
    the forward pass's saved arrays. Inputs (adjoint, x, w, b), of which only the adjoint and w
    are read (x enters the graph as for softmax_cross_entropy). With ``with_statistics`` the
    adjoint is the tuple (dy, dmean, dvar) of batch norm's outputs, and dx gains the terms of
    the batch statistics, dmean/N + dvar·2(x - mean)/N, when those adjoints are not zero."""

    def __init__(
        self,
        kernel,
        forward_name: str,
        xhat,
        rstd,
        with_statistics: bool = False,
        statistics_unused: bool = False,
    ):
        self.kernel, self.xhat, self.rstd = kernel, xhat, rstd
        self.forward_name = forward_name
        self.with_statistics = with_statistics
        self.statistics_unused = statistics_unused

    def compute(self, adjoint, x, w, _b):
        if not self.with_statistics:
            dx, dw, db = self.kernel(_as_rows(adjoint), self.xhat, self.rstd, w)
            return (dx.reshape(x.shape) if len(x.shape) != 2 else dx), dw, db
        dy, dmean, dvar = adjoint
        dx, dw, db = self.kernel(_as_rows(dy), self.xhat, self.rstd, w)
        # only when a statistic was used
        if not self.statistics_unused and (dmean.numpy().any() or dvar.numpy().any()):
            rows, cols = self.xhat.shape
            row = (1, cols)
            # x - mean = xhat / rstd; d mean / dx = 1/N, d var / dx = 2(x - mean)/N
            scale = (dvar.compact().reshape(row) / self.rstd.compact().reshape(row)) * (2 / rows)
            shift = dmean.compact().reshape(row) * (1 / rows)
            dx = (
                dx + self.xhat * scale.broadcast_to((rows, cols)) + shift.broadcast_to((rows, cols))
            )
        return (dx.reshape(x.shape) if len(x.shape) != 2 else dx), dw, db


def layernorm_rows(x: Tensor, w: Tensor, b: Tensor, eps: float) -> Tensor:
    """Layer norm of each row of ``x`` (R, C), or (..., C), with weight and bias ``w``, ``b``
    (C,)."""
    return LayerNormRows(eps)(x, w, b)


def batchnorm_columns(x: Tensor, w: Tensor, b: Tensor, eps: float) -> Tensor:
    """Training-mode batch norm of ``x`` (N ≥ 1, C) with ``w``, ``b`` (C,), batch statistics
    (the normalised output only; :class:`BatchNormColumns` also returns the statistics)."""
    return BatchNormColumns(eps)(x, w, b)[0]


class BatchNormTrain(TensorOp):
    """Training-mode batch norm of x (..., C) per channel as ONE node with one output:
    y = w·(x' - mean)/sqrt(var + eps) + b over every leading index, where x' = x + bias when
    ``pre_bias`` (the bias of the layer before, e.g. a convolution's, added first) and the
    result passes through max(·, 0) when ``relu``. Inputs (x, [bias,] w, b); w, b and bias have
    C elements.

    The same values as bias_add, :class:`BatchNormColumns`'s y and relu in turn (the same
    kernels on the same arrays), with one graph node instead of four and no intermediate
    Tensor kept alive by the graph: only x (an input) and the saved x̂ and 1/std. The batch
    statistics are data for the running averages, not outputs: after the forward pass
    :meth:`statistics` hands them over once. Its gradient is one backward kernel
    (:class:`BatchNormTrainBackward`), not differentiable again, like batch norm's."""

    def __init__(self, eps: float, pre_bias: bool = False, relu: bool = False):
        self.eps = eps
        self.pre_bias, self.relu = pre_bias, relu
        self.xhat = self.rstd = None
        self._stats: Tuple = ()

    def compute(self, x, *params):
        w, b = params[-2:]
        if self.pre_bias:
            x = x + params[0].reshape((x.shape[-1],))  # as BiasAdd computes it
        y, self.xhat, self.rstd, mean, var = array_api.batchnorm_fwd(_as_rows(x), w, b, self.eps)
        self._stats = (mean, var)
        y = y.reshape(x.shape) if len(x.shape) != 2 else y
        return ReLU().compute(y) if self.relu else y

    def apply(self, x: Tensor, w: Tensor, b: Tensor, bias: Tensor | None = None) -> Tensor:
        """This op on (x, [bias,] w, b), its inputs' order; ``bias`` is given exactly when the
        op was made with ``pre_bias``."""
        if (bias is not None) != self.pre_bias:
            raise ValueError("BatchNormTrain: give a bias exactly when made with pre_bias=True")
        return self(x, *([bias] if bias is not None else []), w, b)

    def statistics(self) -> Tuple:
        """(batch mean, biased batch variance), arrays of C elements, once per forward pass."""
        stats, self._stats = self._stats, ()
        if not stats:
            raise RuntimeError("batch norm's statistics were already taken, or never computed")
        return stats

    def gradient(self, out_grad: Tensor, node: Tensor):
        backward = BatchNormTrainBackward(self.xhat, self.rstd, self.pre_bias, self.relu)
        grads = backward(out_grad, node, *node.inputs)
        return tuple(grads[k] for k in range(len(node.inputs)))


class BatchNormTrainBackward(_BackwardOp, TensorTupleOp):
    """The adjoints (dx, [dbias,] dw, db) of :class:`BatchNormTrain` from its output adjoint:
    the ReLU's mask (output > 0) applied first when it has one, then batch norm's backward
    kernel, and dbias = dx summed over the leading axes. Inputs (adjoint, output, x, [bias,]
    w, b): the output is read for the mask, w by the kernel; dx has x's shape, or ``shape``
    when given (:class:`ConvBatchNormTrain` passes the convolution's input as x, for the graph,
    and the shape of its output, which it did not keep)."""

    forward_name = "batchnorm_train"

    def __init__(self, xhat, rstd, pre_bias: bool, relu: bool, shape: Tuple | None = None):
        self.xhat, self.rstd, self.pre_bias, self.relu = xhat, rstd, pre_bias, relu
        self.shape = shape

    def compute(self, adjoint, out, x, *params):
        w = params[-2]
        if self.relu:  # as ReLU's gradient
            adjoint = adjoint * _relu_mask(out)
        dx, dw, db = array_api.batchnorm_bwd(_as_rows(adjoint), self.xhat, self.rstd, w)
        shape = self.shape or x.shape
        dx = dx.reshape(shape) if len(shape) != 2 else dx
        if not self.pre_bias:
            return dx, dw, db
        return dx, SumToShape(params[0].shape).compute(dx), dw, db


class ConvBatchNormTrain(TensorOp):
    """conv(x, weight) (NHWC, see :class:`~needle.ops.ops_conv.Conv`), then training-mode batch
    norm with the conv's bias added first and, when ``relu``, max(·, 0) — ResNet-9's ConvBN
    block — as ONE node with channels-last output. Inputs (x, weight, bias, w, b); with
    ``channels_first`` x is (N, C, H, W) and its channels-last copy is made inside, forward and
    again backward for the weight gradient, rather than kept through the step (the network's
    input images: 0.39 MB of ResNet-9's step).

    The convolution's output is a temporary of the forward pass: batch norm's backward reads
    its saved x̂ (and the output, for the ReLU's mask), never its input, so the graph keeps
    the block's output and x̂, not the convolution's result beside them (PyTorch keeps the
    norm's input instead of x̂: the same count). The same kernels on the same arrays as
    :class:`BatchNormTrain` after ``conv`` (the same bits, forward and backward);
    :meth:`statistics` hands over the batch statistics as BatchNormTrain's does."""

    def __init__(
        self, stride: int, padding: int, eps: float, relu: bool = False, channels_first=False
    ):
        self.conv = ops_conv.Conv(stride, padding)
        self.norm = BatchNormTrain(eps, pre_bias=True, relu=relu)
        self.channels_first = channels_first
        self.conv_shape: Tuple = ()

    def compute(self, x, weight, bias, w, b):
        if self.channels_first:  # the channels-last copy is a temporary too (made again below)
            x = x.permute(NCHW_TO_NHWC).compact()
        h = self.conv.compute(x, weight)
        self.conv_shape = tuple(h.shape)
        return self.norm.compute(h, bias, w, b)

    def statistics(self) -> Tuple:
        """(batch mean, biased batch variance) of the convolution's output channels, once."""
        return self.norm.statistics()

    def gradient(self, out_grad: Tensor, node: Tensor):
        x, weight, bias, w, b = node.inputs
        norm = self.norm
        backward = BatchNormTrainBackward(
            norm.xhat, norm.rstd, True, norm.relu, shape=self.conv_shape
        )
        grads = backward(out_grad, node, x, bias, w, b)
        x_nhwc = permute(x, NCHW_TO_NHWC, compact=True) if self.channels_first else x
        dx, dweight = ops_conv.conv_adjoints(
            x_nhwc, weight, grads[0], self.conv.stride, self.conv.padding, x.requires_grad
        )
        if dx is not None and self.channels_first:
            dx = permute(dx, NHWC_TO_NCHW)
        return dx, dweight, grads[1], grads[2], grads[3]


def batchnorm_train(
    x: Tensor, w: Tensor, b: Tensor, eps: float, bias: Tensor | None = None, relu: bool = False
) -> Tensor:
    """Training-mode batch norm of ``x`` (..., C) per channel with ``w``, ``b`` (C,) and batch
    statistics, one node; ``bias`` (C elements) is added to x first and ``relu`` applies
    max(·, 0) after (see :class:`BatchNormTrain`, whose ``statistics()`` gives mean and var)."""
    return BatchNormTrain(eps, pre_bias=bias is not None, relu=relu).apply(x, w, b, bias)


# ---- LSTM cell ----------------------------------------------------------------------------------
class LSTMCellStep(TensorTupleOp):
    """(h, c) of one LSTM step from gate pre-activations (B, 4H), order i, f, g, o, and c_prev
    (B, H): c = σ(f)·c_prev + σ(i)·tanh(g), h = σ(o)·tanh(c)."""

    def __init__(self):
        self.act = self.tanh_c = self.c_prev = None

    def compute(self, gates, c_prev):
        h, c, self.act, self.tanh_c = array_api.lstm_cell_fwd(gates, c_prev)
        self.c_prev = c_prev
        return h, c

    def gradient(self, out_grad: TensorTuple, node: TensorTuple):
        grads = LSTMCellBackward(self.act, self.c_prev, self.tanh_c)(out_grad, *node.inputs)
        return grads[0], grads[1]


class LSTMCellBackward(_BackwardOp, TensorTupleOp):
    """(d gates, d c_prev) of :class:`LSTMCellStep`; inputs (the tuple adjoint (dh, dc), gates,
    c_prev), the last two only to enter the graph (see softmax_cross_entropy)."""

    forward_name = "lstm_cell_step"

    def __init__(self, act, c_prev, tanh_c):
        self.act, self.c_prev, self.tanh_c = act, c_prev, tanh_c

    def compute(self, adjoint, _gates, _c_prev):
        dh, dc = adjoint
        return tuple(array_api.lstm_cell_bwd(dh, dc, self.act, self.c_prev, self.tanh_c))


def lstm_cell_step(gates: Tensor, c_prev: Tensor) -> Tuple[Tensor, Tensor]:
    """One LSTM step: (h, c), each (B, H), from ``gates`` (B, 4H) and ``c_prev`` (B, H)."""
    out = LSTMCellStep()(gates, c_prev)
    return out[0], out[1]


# ---- LSTM layer over a sequence -----------------------------------------------------------------
def _project(x, w_ih, biases):
    """x W_ih + b_ih + b_hh for x (T, B, I): the input projections (T, B, 4H) of every step,
    computed as ``nn_sequence._input_projection`` does on Tensors (the same kernels)."""
    steps, batch, features = x.shape
    z = x.compact().reshape((steps * batch, features)) @ w_ih
    if biases:
        b_ih, b_hh = biases
        z = z + (b_ih + b_hh).compact().reshape((1, z.shape[1])).broadcast_to(z.shape)
    return z.reshape((steps, batch, z.shape[1]))


class LSTMLayer(TensorTupleOp):
    """One LSTM layer run over a sequence, as one op: inputs ``x``, ``h0``, ``c0`` (B, H),
    ``W_hh`` (H, 4H) and optionally ``W_ih`` (I, 4H) with ``b_ih``, ``b_hh`` (4H,); output the
    tuple (hidden states (T, B, H), h_T, c_T).

    Without ``W_ih``, ``x`` is ``xw`` (T, B, 4H), the input projections X_t W_ih + biases of
    every step. With it, ``x`` is the layer's input (T, B, I) and the op computes xw itself and
    does not keep it: the graph then holds no (T, B, 4H) array between forward and backward,
    where the projection as separate ops kept two (the product and the sum with the biases),
    and the backward forms d x, d W_ih and d b from d xw. Step t is exactly LSTMCell's:
    gates = xw[t] + h_{t-1} W_hh, then :class:`LSTMCellStep`'s kernel.

    The loop over the steps runs in the device module (``lstm_layer_fwd``, one call), which
    keeps for the backward pass each step's gate activations (T, B, 4H) beside the output; the
    backward pass is one call too (``lstm_layer_bwd``): it recomputes the cell states from the
    activations and forms dW_hh = Σ_t h_{t-1}ᵀ dgates_t as one product of the stacked states."""

    def __init__(self):
        self.act = self.out = None

    def compute(self, x, h0, c0, w_hh, *projection):
        xw = _project(x, projection[0], projection[1:]) if projection else x
        out, h, c, self.act = array_api.lstm_layer_fwd(xw, h0, c0, w_hh, xw.shape[0])
        self.out = out
        return out, h, c

    def gradient(self, out_grad: TensorTuple, node: TensorTuple):
        grads = LSTMLayerBackward(self.act, self.out)(out_grad, *node.inputs)
        return tuple(grads[k] for k in range(len(node.inputs)))


class LSTMLayerBackward(_BackwardOp, TensorTupleOp):
    """The adjoints of :class:`LSTMLayer`'s inputs: (d x, d h0, d c0, d W_hh), then d W_ih and
    d b_ih = d b_hh when it projects its input; inputs (the tuple adjoint (d output, d h_T,
    d c_T), then the layer's inputs), and the forward pass's saved arrays: ``act`` (T, B, 4H),
    every step's gate activations, and ``out`` (T, B, H), the hidden states."""

    forward_name = "lstm_layer"

    def __init__(self, act, out):
        self.act, self.out = act, out

    def compute(self, adjoint, x, h0, c0, w_hh, *projection):
        d_out, dh, dc = adjoint
        steps = x.shape[0]
        dxw, dh0, dc0, d_w = array_api.lstm_layer_bwd(
            d_out, dh, dc, self.act, self.out, h0, c0, w_hh, steps
        )
        if not projection:
            return dxw, dh0, dc0, d_w
        # the projection's adjoints: d x = d xw W_ihᵀ, d W_ih = xᵀ d xw, d b = Σ_rows d xw
        w_ih = projection[0]
        features, four = w_ih.shape
        rows = x.size // features
        dz = dxw.compact().reshape((rows, four))
        dx = (dz @ w_ih.permute((1, 0))).reshape(tuple(x.shape))
        d_ih = x.compact().reshape((rows, features)).permute((1, 0)) @ dz
        if len(projection) == 1:
            return dx, dh0, dc0, d_w, d_ih
        d_b = dz.sum(axis=0).reshape((four,))
        return dx, dh0, dc0, d_w, d_ih, d_b, d_b


def lstm_layer(
    x: Tensor, h0: Tensor, c0: Tensor, w_hh: Tensor, *projection: Tensor
) -> Tuple[Tensor, Tensor, Tensor]:
    """An LSTM layer over a sequence: (output (T, B, H), h_T, c_T) from the initial state
    ``h0``, ``c0`` (B, H), ``w_hh`` (H, 4H) and either the input projections ``x`` = xw
    (T, B, 4H), or the input ``x`` (T, B, I) with ``projection`` = (W_ih (I, 4H),) or (W_ih,
    b_ih, b_hh) (biases (4H,)): the op then projects x itself without keeping the result."""
    if len(projection) not in (0, 1, 3):
        raise ValueError(
            f"lstm_layer's projection is (), (W_ih,) or (W_ih, b_ih, b_hh); got "
            f"{len(projection)} tensors"
        )
    out = LSTMLayer()(x, h0, c0, w_hh, *projection)
    return out[0], out[1], out[2]


# ---- softmax over the last axis -----------------------------------------------------------------
class SoftmaxLastAxis(TensorOp):
    """softmax over the last axis of ``scale``·x, any shape: exp(z - max) / Σ exp(z - max), the
    row max a constant (the attention softmax of the course, as one graph node and one kernel
    call, ``softmax_fwd``).

    With ``causal=True`` x is (..., Tq, Tk) attention logits and query i sees keys
    j <= i + Tk - Tq only: the others get weight exactly 0, inside the kernel, where the course
    adds a -finfo(float32).max mask (the same weights; a query that sees no key, Tq > Tk, is
    uniform in both, and its gradient is the course's, as if the mask were added). The
    gradient is one ``softmax_bwd`` call; it differentiates any number of times, since the
    backward op's own gradient is written with needle ops."""

    def __init__(self, scale: float = 1.0, causal: bool = False):
        self.scale, self.causal = float(scale), bool(causal)

    def compute(self, x):
        if self.causal and x.ndim < 2:
            raise ValueError(
                f"a causal softmax needs logits (..., queries, keys), got shape {tuple(x.shape)}"
            )
        shape = tuple(x.shape)
        queries = shape[-2] if self.causal else 0
        rows = math.prod(shape[:-1])
        y = array_api.softmax_fwd(x.compact().reshape((rows, shape[-1])), self.scale, queries)
        return y.reshape(shape)

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tensor:
        return SoftmaxLastAxisBackward(self.scale)(out_grad, node)


class SoftmaxLastAxisBackward(TensorOp):
    """The gradient of :class:`SoftmaxLastAxis` from inputs (adjoint g, softmax y), same shape:
    ``scale``·y ⊙ (g - Σ g ⊙ y) over the last axis, one ``softmax_bwd`` call. Its own gradient
    (for a second derivative) is written with needle ops: in g it is this op again (the
    softmax's Jacobian is symmetric), in y it is scale·(g⊙h - (Σ g⊙y) h - g (Σ y⊙h))."""

    def __init__(self, scale: float):
        self.scale = scale

    def compute(self, g, y):
        shape = tuple(y.shape)
        flat = (math.prod(shape[:-1]), shape[-1])
        dx = array_api.softmax_bwd(y.compact().reshape(flat), g.compact().reshape(flat), self.scale)
        return dx.reshape(shape)

    def gradient(self, out_grad: Tensor, node: Tensor):
        g, y = node.inputs
        shape = y.shape
        kept = tuple(shape[:-1]) + (1,)

        def row_dot(a: Tensor, b: Tensor) -> Tensor:
            return (a * b).sum(axes=len(shape) - 1).reshape(kept).broadcast_to(shape)

        h = out_grad
        dy = (g * h - row_dot(g, y) * h - g * row_dot(y, h)) * self.scale
        return SoftmaxLastAxisBackward(self.scale)(h, y), dy


def softmax_last_axis(x: Tensor, scale: float = 1.0, causal: bool = False) -> Tensor:
    """softmax of ``scale * x`` over its last axis (same shape as ``x``); ``causal=True`` masks
    attention logits (..., queries, keys) causally (see :class:`SoftmaxLastAxis`)."""
    return SoftmaxLastAxis(scale, causal)(x)


# ---- a linear layer's product and bias ---------------------------------------------------------
if BACKEND == "nd":
    from ..backend_ndarray.fused import binary_into

    def _add_over(out, row) -> None:
        """out += row, element by element, written over the compact array ``out``."""
        binary_into("add", out, row, out)

else:  # numpy arrays add in place themselves (the NDArray layer is never loaded then)

    def _add_over(out, row) -> None:
        """out += row, element by element, written over the compact array ``out``."""
        out += row


class MatMulAddBias(TensorOp):
    """x @ w + b for x (N, I), w (I, O) and a bias b of O elements (shape (O,) or (1, O)): what
    ``nn.Linear`` computes as ``X @ W + b.broadcast_to``, as one node; with ``relu`` the
    ReLU of that (``relu(linear(x))``). The product (and the pre-activation) is a temporary of
    the forward pass, since the bias's addition needs nothing of it backward and ReLU's
    gradient reads only its output, so the graph keeps the result alone where the separate
    ops kept two or three arrays. The gradient is written with needle ops (it differentiates
    again)."""

    def __init__(self, relu: bool = False):
        self.relu = relu
        self.gradient_reads_output = relu  # ReLU's mask is read off the output

    def compute(self, x, w, b):
        out = x @ w
        row = b.compact().reshape((1, out.shape[1])).broadcast_to(out.shape)
        _add_over(out, row)  # over the fresh product: no second (N, O) array
        return out.relu() if self.relu else out

    def gradient(self, out_grad: Tensor, node: Tensor):
        x, w, b = node.inputs
        if self.relu:  # ReLU's gradient: relu(z) > 0 exactly where z > 0, a constant mask
            out_grad = out_grad * Tensor.make_const(node.realize_cached_data() > 0)
        db = summation(out_grad, axes=(0,)).reshape(b.shape)
        return matmul(out_grad, transpose(w)), matmul(transpose(x), out_grad), db


def matmul_add_bias(x: Tensor, w: Tensor, b: Tensor, relu: bool = False) -> Tensor:
    """x (N, I) @ w (I, O) + b (O elements, shape (O,) or (1, O)), broadcast over the rows,
    then its ReLU if ``relu``: (N, O), one graph node (see :class:`MatMulAddBias`)."""
    if len(x.shape) != 2 or len(w.shape) != 2 or x.shape[1] != w.shape[0]:
        raise ValueError(
            f"matmul_add_bias needs x (N, I) and w (I, O), got shapes {tuple(x.shape)} and "
            f"{tuple(w.shape)}"
        )
    if math.prod(b.shape) != w.shape[1] or len(b.shape) > 2:
        raise ValueError(
            f"matmul_add_bias needs a bias of {w.shape[1]} elements ((O,) or (1, O)), got shape "
            f"{tuple(b.shape)}"
        )
    return MatMulAddBias(relu)(x, w, b)


# ---- embedding lookup ---------------------------------------------------------------------------
def _flat(ids):
    """The raw ids array as one compact row (N,)."""
    n = 1
    for d in ids.shape:
        n *= d
    return ids.compact().reshape((n,))


class EmbeddingLookup(TensorOp):
    """``weight[ids]``: the rows of weight (V, D) picked by fixed integer ids, shape
    ``ids.shape + (D,)`` — the course's ``one_hot(ids) @ weight`` as one gather. ``ids`` is a
    raw array on the weight's device holding whole numbers in [0, V) (an IndexError names one
    that is not); it is data, not an input, and gets no gradient. The gradient is the adjoint's
    rows scatter-added into a (V, D) zero matrix (:class:`EmbeddingScatterAdd`), so a row used
    twice gets both contributions."""

    def __init__(self, ids):
        self.shape = tuple(ids.shape)
        self.ids = _flat(ids)

    def compute(self, weight):
        out = array_api.embedding_gather(weight, self.ids)
        return out.reshape(self.shape + (weight.shape[1],))

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tensor:
        return EmbeddingScatterAdd(self.ids, node.inputs[0].shape[0])(out_grad)


class EmbeddingScatterAdd(TensorOp):
    """The adjoint of :class:`EmbeddingLookup`: (vocab, D) zeros with each row of its input
    (``ids.shape + (D,)``, read as (N, D)) added to the row its id names. Linear in its input,
    its own gradient is the lookup of the adjoint's rows, so it differentiates again."""

    def __init__(self, ids, vocab: int):
        self.ids, self.vocab = _flat(ids), int(vocab)

    def compute(self, grad):
        rows = self.ids.shape[0]
        flat = grad.compact().reshape((rows, grad.shape[-1]))
        return array_api.embedding_scatter_add(flat, self.ids, self.vocab)

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tensor:
        return EmbeddingLookup(self.ids)(out_grad).reshape(node.inputs[0].shape)


def embedding(ids: Tensor, weight: Tensor) -> Tensor:
    """The rows of ``weight`` (V, D) picked by ``ids`` (a Tensor of whole numbers in [0, V), any
    shape, on any device; it gets no gradient): shape ``ids.shape + (D,)``."""
    raw = ids.realize_cached_data()
    if ids.device != weight.device:
        raw = Tensor(ids.numpy(), device=weight.device, dtype=weight.dtype).realize_cached_data()
    return EmbeddingLookup(raw)(weight)


# The attention ops live in their own module (they use the softmax ops and _BackwardOp above).
from .attention import (  # noqa: E402
    Attention,
    AttentionValues,
    AttentionWeights,
    SelfAttentionQKV,
    attention,
    attention_values,
    attention_weights,
    self_attention_qkv,
)
