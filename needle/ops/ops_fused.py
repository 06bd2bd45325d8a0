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

from ..autograd import Tensor, TensorOp, TensorTuple, TensorTupleOp, Value
from ..backend_selection import array_api

__all__ = [
    "SoftmaxCrossEntropy",
    "softmax_cross_entropy",
    "LayerNormRows",
    "layernorm_rows",
    "BatchNormColumns",
    "batchnorm_columns",
    "LSTMCellStep",
    "lstm_cell_step",
    "LSTMLayer",
    "lstm_layer",
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
        return SoftmaxCrossEntropyBackward(self.probs, self.labels, self._scale())(
            out_grad, node.inputs[0]
        )


class SoftmaxCrossEntropyBackward(_BackwardOp, TensorOp):
    """d logits (N, C) = (softmax - one_hot(labels))·adjoint·scale, from the scalar adjoint.

    Inputs (adjoint, logits): the logits are not read (softmax was saved by the forward pass)
    but make the gradient depend on them in the graph, so that differentiating it again raises
    instead of silently giving zero."""

    forward_name = "softmax_cross_entropy"

    def __init__(self, probs, labels, scale: float):
        self.probs, self.labels, self.scale = probs, labels, scale

    def compute(self, dloss, _logits):
        return array_api.softmax_xent_bwd(self.probs, self.labels, dloss, self.scale)


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
    (every leading index a row; an extension that saves the reshapes around the op)."""

    def __init__(self, eps: float):
        self.eps = eps
        self.xhat = self.rstd = None

    def compute(self, x, w, b):
        y, self.xhat, self.rstd = array_api.layernorm_fwd(_as_rows(x), w, b, self.eps)
        return y.reshape(x.shape) if len(x.shape) != 2 else y

    def gradient(self, out_grad: Tensor, node: Tensor):
        grads = NormBackward(array_api.layernorm_bwd, "layernorm_rows", self.xhat, self.rstd)(
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
class LSTMLayer(TensorTupleOp):
    """One LSTM layer run over a sequence, as one op: inputs ``xw`` (T, B, 4H), the input
    projections X_t W_ih + biases of every step, ``h0``, ``c0`` (B, H) and ``W_hh`` (H, 4H);
    output the tuple (hidden states (T, B, H), h_T, c_T). Step t is exactly LSTMCell's:
    gates = xw[t] + h_{t-1} W_hh, then :class:`LSTMCellStep`'s kernel.

    The loop over the steps runs in the device module (``lstm_layer_fwd``, one call), which
    keeps for the backward pass each step's gate activations (T, B, 4H) beside the output; the
    backward pass is one call too (``lstm_layer_bwd``): it recomputes the cell states from the
    activations and forms dW_hh = Σ_t h_{t-1}ᵀ dgates_t as one product of the stacked states."""

    def __init__(self):
        self.act = self.out = None

    def compute(self, xw, h0, c0, w_hh):
        out, h, c, self.act = array_api.lstm_layer_fwd(xw, h0, c0, w_hh, xw.shape[0])
        self.out = out
        return out, h, c

    def gradient(self, out_grad: TensorTuple, node: TensorTuple):
        grads = LSTMLayerBackward(self.act, self.out)(out_grad, *node.inputs)
        return tuple(grads[k] for k in range(4))


class LSTMLayerBackward(_BackwardOp, TensorTupleOp):
    """(d xw, d h0, d c0, d W_hh) of :class:`LSTMLayer`; inputs (the tuple adjoint (d output,
    d h_T, d c_T), xw, h0, c0, W_hh), and the forward pass's saved arrays: ``act`` (T, B, 4H),
    every step's gate activations, and ``out`` (T, B, H), the hidden states."""

    forward_name = "lstm_layer"

    def __init__(self, act, out):
        self.act, self.out = act, out

    def compute(self, adjoint, xw, h0, c0, w_hh):
        d_out, dh, dc = adjoint
        steps = xw.shape[0]
        return tuple(
            array_api.lstm_layer_bwd(d_out, dh, dc, self.act, self.out, h0, c0, w_hh, steps)
        )


def lstm_layer(xw: Tensor, h0: Tensor, c0: Tensor, w_hh: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """An LSTM layer over a sequence: (output (T, B, H), h_T, c_T) from the input projections
    ``xw`` (T, B, 4H), the initial state ``h0``, ``c0`` (B, H) and ``w_hh`` (H, 4H)."""
    out = LSTMLayer()(xw, h0, c0, w_hh)
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
