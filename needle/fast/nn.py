"""Fused twins of the course's modules: the same parameters, values and gradients, fewer nodes.

Each class here subclasses the course module it speeds up and overrides only ``forward`` (and
the helpers that ``forward`` needs), so a module keeps its parameters, buffers and
``state_dict`` when :func:`needle.fast.fuse` swaps its class, and swapping back restores the
course's code. The fused ops they call live in :mod:`needle.fast.ops`; the equality of each
twin with its course module (outputs, gradients, running statistics) is tested.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Optional, Tuple

import numpy as np

from needle import ops
from needle.autograd import Tensor
from needle.nn import nn_basic, nn_conv, nn_sequence, nn_transformer
from needle.nn.nn_basic import BatchNorm1d, BatchNorm2d, Linear, Module, ReLU, check_features
from needle.ops.ops_mathematic import NCHW_TO_NHWC, NHWC_TO_NCHW

from . import ops as fops

__all__ = [
    "FastSequential",
    "FastBatchNorm1d",
    "FastBatchNorm2d",
    "FastLayerNorm1d",
    "FastSoftmaxLoss",
    "FastLSTMCell",
    "FastLSTM",
    "FastEmbedding",
    "FastMultiHeadAttention",
    "FastAttentionLayer",
    "FastTransformerLayer",
    "course_forward",
    "linear",
    "remember_course_forward",
    "fold_statistics",
    "normalise",
]

# The course's forward of each class, as imported: a class whose ``forward`` was since replaced
# (a monkey-patch) is no longer the code a fused twin reproduces, so it is not fused.
_COURSE_FORWARDS: Dict[type, Any] = {
    cls: cls.forward
    for cls in (
        nn_basic.Sequential,
        nn_basic.Linear,
        nn_basic.ReLU,
        nn_basic.BatchNorm1d,
        nn_basic.BatchNorm2d,
        nn_basic.LayerNorm1d,
        nn_basic.SoftmaxLoss,
        nn_conv.Conv,
        nn_sequence.LSTMCell,
        nn_sequence.LSTM,
        nn_sequence.Embedding,
        nn_transformer.MultiHeadAttention,
        nn_transformer.AttentionLayer,
        nn_transformer.TransformerLayer,
    )
}


def remember_course_forward(cls: type) -> None:
    """Record ``cls.forward`` as the course forward of ``cls`` (a class registered with
    :func:`needle.fast.register`), unless one is recorded already."""
    _COURSE_FORWARDS.setdefault(cls, cls.forward)  # type: ignore[attr-defined]


def course_forward(m: Module, cls: type) -> bool:
    """True when ``m`` runs ``cls``'s course forward unchanged: ``m`` is an instance of exactly
    ``cls`` (or of its fused twin), and neither the class nor the instance replaced ``forward``."""
    course = getattr(type(m), "_course_class", type(m))
    return course is cls and "forward" not in vars(m) and _COURSE_FORWARDS.get(cls) is cls.forward


# ---- normalisation ----------------------------------------------------------------------------
def fold_statistics(norm: BatchNorm1d, op, out: Tensor) -> Tensor:
    """``out``, the result of a training-mode batch-norm ``op`` over ``norm``'s channels, after
    folding the op's batch mean and biased variance into ``norm``'s running averages."""
    out.realize_cached_data()  # computed now even in lazy mode: the statistics are read
    mean, var = op.statistics()
    m = norm.momentum
    norm.running_mean = Tensor.make_const(
        norm.running_mean.realize_cached_data() * (1 - m) + mean * m
    )
    norm.running_var = Tensor.make_const(norm.running_var.realize_cached_data() * (1 - m) + var * m)
    return out


def normalise(
    norm: BatchNorm1d, x: Tensor, pre_bias: Optional[Tensor] = None, relu: bool = False
) -> Tensor:
    """``norm`` applied to each column of ``x`` (..., dim) over its leading indices, with
    ``pre_bias`` (dim) added to x first and max(·, 0) after when ``relu``: one node in training."""
    n = math.prod(x.shape[:-1])
    if norm.training and n > 0:
        op = fops.BatchNormTrain(norm.eps, pre_bias=pre_bias is not None, relu=relu)
        return fold_statistics(norm, op, op.apply(x, norm.weight, norm.bias, pre_bias))
    # Evaluation, and an empty training batch (no statistics: the running ones stay).
    if pre_bias is not None:
        x = ops.bias_add(x, pre_bias)
    row = (1,) * (len(x.shape) - 1) + (norm.dim,)
    centred = x - norm.running_mean.reshape(row).broadcast_to(x.shape)
    std = ((norm.running_var + norm.eps) ** 0.5).reshape(row).broadcast_to(x.shape)
    w = norm.weight.reshape(row).broadcast_to(x.shape)
    b = norm.bias.reshape(row).broadcast_to(x.shape)
    out = w * (centred / std) + b
    return ops.relu(out) if relu else out


class FastBatchNorm1d(BatchNorm1d):
    """:class:`needle.nn.BatchNorm1d` in one node per training forward
    (``fast.ops.BatchNormTrain``)."""

    _course_class = BatchNorm1d

    def forward(self, x: Tensor) -> Tensor:
        check_features(x, self.dim, "BatchNorm1d")
        return normalise(self, x)


class FastBatchNorm2d(BatchNorm2d):
    """:class:`needle.nn.BatchNorm2d` with one ``permute`` each way around a fused norm."""

    _course_class = BatchNorm2d

    def forward(self, x: Tensor) -> Tensor:
        if len(x.shape) != 4 or x.shape[1] != self.dim:
            raise ValueError(
                f"BatchNorm2d expects input of shape (N, {self.dim}, H, W), got {x.shape}"
            )
        y = self.forward_nhwc(ops.permute(x, NCHW_TO_NHWC))
        return ops.permute(y, NHWC_TO_NCHW)

    def forward_nhwc(
        self, x: Tensor, pre_bias: Optional[Tensor] = None, relu: bool = False
    ) -> Tensor:
        """Normalise channels-last ``x`` (N, H, W, C) per channel; returns (N, H, W, C)."""
        if len(x.shape) != 4 or x.shape[3] != self.dim:
            raise ValueError(
                f"BatchNorm2d.forward_nhwc expects input of shape "
                f"(N, H, W, {self.dim}), got {x.shape}"
            )
        return normalise(self, x, pre_bias, relu)


class FastLayerNorm1d(nn_basic.LayerNorm1d):
    """:class:`needle.nn.LayerNorm1d` as one fused op (``fast.ops.layernorm_rows``)."""

    _course_class = nn_basic.LayerNorm1d

    def forward(self, x: Tensor) -> Tensor:
        if len(x.shape) < 1 or x.shape[-1] != self.dim:
            raise ValueError(f"LayerNorm1d expects input of shape (..., {self.dim}), got {x.shape}")
        return fops.layernorm_rows(x, self.weight, self.bias, self.eps)


class FastSoftmaxLoss(nn_basic.SoftmaxLoss):
    """:class:`needle.nn.SoftmaxLoss` as one fused op (``fast.ops.softmax_cross_entropy``)."""

    _course_class = nn_basic.SoftmaxLoss

    def forward(self, logits: Tensor, y: Tensor) -> Tensor:
        nn_basic.check_softmax_loss_shapes(logits, y)
        return fops.softmax_cross_entropy(logits, y)


# ---- Sequential: Linear -> BatchNorm1d -> ReLU as one node -------------------------------------
class FastSequential(nn_basic.Sequential):
    """:class:`needle.nn.Sequential` that runs, in training, a ``BatchNorm1d`` right after a
    ``Linear`` with a bias (and a ``ReLU`` right after such a norm) as one node. Only modules
    running their course forward unchanged are joined (:func:`course_forward`)."""

    _course_class = nn_basic.Sequential

    def forward(self, x: Tensor) -> Tensor:
        modules, i = self.modules, 0
        while i < len(modules):
            m = modules[i]
            norm = modules[i + 1] if i + 1 < len(modules) else None
            relu_next = i + 2 < len(modules) and course_forward(modules[i + 2], ReLU)
            if isinstance(m, Linear) and isinstance(norm, BatchNorm1d) and _joins_norm(m, norm, x):
                x = _linear_norm(m, norm, x, relu_next)
                i += 3 if relu_next else 2
                continue
            if (
                isinstance(m, BatchNorm1d)
                and _is_training_norm(m)
                and norm is not None
                and course_forward(norm, ReLU)
            ):
                check_features(x, m.dim, "BatchNorm1d")
                x = normalise(m, x, relu=True)
                i += 2
                continue
            x = m(x)
            i += 1
        return x


def _is_training_norm(m: Module) -> bool:
    return course_forward(m, BatchNorm1d) and m.training


def _joins_norm(m: Linear, norm: BatchNorm1d, x: Tensor) -> bool:
    """True when ``m`` is a course ``Linear`` with a bias taking ``x`` (2-D) as it is, followed
    by a course ``BatchNorm1d`` in training."""
    return (
        course_forward(m, Linear)
        and m.bias is not None
        and _is_training_norm(norm)
        and len(x.shape) == 2
        and x.shape[1] == m.in_features
    )


def _linear_norm(linear: Linear, norm: BatchNorm1d, x: Tensor, relu: bool) -> Tensor:
    """norm(linear(x)), then its ReLU when ``relu``: the product, then one node for the bias,
    the norm and the ReLU (the same values as the modules called in turn)."""
    h = x @ linear.weight
    check_features(h, norm.dim, "BatchNorm1d")
    return normalise(norm, h, pre_bias=linear.bias, relu=relu)


# ---- sequence models -------------------------------------------------------------------------
class FastLSTMCell(nn_sequence.LSTMCell):
    """:class:`needle.nn.LSTMCell` with the gate activations and the state update as one op."""

    _course_class = nn_sequence.LSTMCell

    def forward(
        self, X: Tensor, h: Optional[Tuple[Tensor, Tensor]] = None
    ) -> Tuple[Tensor, Tensor]:
        X, (h0, c0) = self.checked_state(X, h)
        xw = nn_sequence.input_projection(self, X)
        return fops.lstm_cell_step(xw + h0 @ self.W_hh, c0)


class FastLSTM(nn_sequence.LSTM):
    """:class:`needle.nn.LSTM` with each layer's time loop as one op (``fast.ops.lstm_layer``)."""

    _course_class = nn_sequence.LSTM

    def forward(
        self, X: Tensor, h: Optional[Tuple[Tensor, Tensor]] = None
    ) -> Tuple[Tensor, Tuple[Tensor, Tensor]]:
        states = self.initial_states(X, h)
        output = X
        h_n, c_n = [], []
        for cell, (h_0, c_0) in zip(self.lstm_cells, states):
            biases = () if cell.bias_ih is None else (cell.bias_ih, cell.bias_hh)
            output, h_t, c_t = fops.lstm_layer(output, h_0, c_0, cell.W_hh, cell.W_ih, *biases)
            h_n.append(h_t)
            c_n.append(c_t)
        return output, (ops.stack(h_n, 0), ops.stack(c_n, 0))


class FastEmbedding(nn_sequence.Embedding):
    """:class:`needle.nn.Embedding` as a gather of the rows used (``fast.ops.embedding``); its
    gradient scatter-adds the adjoint's rows."""

    _course_class = nn_sequence.Embedding

    def forward(self, x: Tensor) -> Tensor:
        nn_sequence.check_ids(x)
        return fops.embedding(x, self.weight)


# ---- Transformer -------------------------------------------------------------------------------
def linear(module: Module, x: Tensor, relu: Optional[Module] = None) -> Tensor:
    """``module(x)`` for x (N, features), then ``relu`` of it if given; a course ``Linear`` with
    a bias (and a course ``ReLU``) as one op (``fast.ops.matmul_add_bias``)."""
    if (
        isinstance(module, Linear)
        and course_forward(module, Linear)
        and module.bias is not None
        and x.shape[-1] == module.in_features
        and (relu is None or course_forward(relu, ReLU))
    ):
        return fops.matmul_add_bias(x, module.weight, module.bias, relu=relu is not None)
    out = module(x)
    return relu(out) if relu is not None else out


class FastMultiHeadAttention(nn_transformer.MultiHeadAttention):
    """:class:`needle.nn.MultiHeadAttention` as one node (``fast.ops.attention``: the weights
    and their product with the values in one kernel call each way) when no dropout acts on the
    weights; with dropout (p > 0 in training), the scaled, masked softmax of the logits as one
    node, dropout, then the batched product."""

    _course_class = nn_transformer.MultiHeadAttention

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tuple[Tensor, Tensor]:
        q_dim = nn_transformer.check_attention_inputs(q, k, v)
        scale = 1.0 / float(np.sqrt(q_dim))
        if not (self.dropout.p and self.dropout.training):
            return fops.attention(q, k, v, scale=scale, causal=self.causal)
        probs = self.dropout(fops.attention_weights(q, k, scale=scale, causal=self.causal))
        return fops.attention_values(probs, v), probs


class FastAttentionLayer(nn_transformer.AttentionLayer):
    """:class:`needle.nn.AttentionLayer` whose self-attention (k and v omitted, or q itself)
    makes its three pre-norms and projections one node (``fast.ops.self_attention_qkv``: one
    product of width 3·H·D, equal to the course's to float32 rounding); other calls, and layers
    whose norms or projections are not the course's, run the course's forward."""

    _course_class = nn_transformer.AttentionLayer

    def forward(self, q: Tensor, k: Optional[Tensor] = None, v: Optional[Tensor] = None) -> Tensor:
        if not self._packs_qkv(q, k, v):
            return super().forward(q, k, v)
        b, t, _ = q.shape
        norms = (self.prenorm_q, self.prenorm_k, self.prenorm_v)
        projections = (self.q_projection, self.k_projection, self.v_projection)
        qh, kh, vh = fops.self_attention_qkv(
            q,
            [(n.weight, n.bias) for n in norms],
            [p.weight for p in projections],
            self.num_head,
            self.prenorm_q.eps,
        )
        out, probs = self.attn(qh, kh, vh)
        self.probs = probs.detach()  # the course's extension: the last weights, for heat maps
        out = ops.transpose(out, (1, 2)).reshape((b * t, self.num_head * self.dim_head))
        return self.out_projection(out).reshape((b, t, self.out_features))

    def _packs_qkv(self, q: Tensor, k: Optional[Tensor], v: Optional[Tensor]) -> bool:
        """True when this call is self-attention on a float32 (B, T, q_features) Tensor (of
        either backend) through course LayerNorm1d's of one eps and bias-free course Linear's
        of width num_head·dim_head."""
        norms = (self.prenorm_q, self.prenorm_k, self.prenorm_v)
        projections = (self.q_projection, self.k_projection, self.v_projection)
        inner = self.num_head * self.dim_head
        return (
            (k is None or k is q)
            and (v is None or v is q)
            and isinstance(q, Tensor)
            and q.dtype == "float32"
            and len(q.shape) == 3
            and q.shape[2] == self.q_features == self.k_features == self.v_features
            and all(course_forward(n, nn_basic.LayerNorm1d) for n in norms)
            and len({n.eps for n in norms}) == 1
            and all(n.dim == self.q_features for n in norms)
            and all(course_forward(p, Linear) and p.bias is None for p in projections)
            and all(
                p.in_features == self.q_features and p.out_features == inner for p in projections
            )
        )


class FastTransformerLayer(nn_transformer.TransformerLayer):
    """:class:`needle.nn.TransformerLayer` with its feed-forward Linear(+ReLU) layers as
    ``fast.ops.matmul_add_bias`` nodes and dropout of p = 0 skipped."""

    _course_class = nn_transformer.TransformerLayer

    def forward(self, x: Tensor) -> Tensor:
        nn_transformer.check_tensor(x, 3, "TransformerLayer", "(batch, seq_len, features)")
        b, t, f = x.shape
        drop = self.dropout if self.dropout.p else (lambda y: y)
        x = x + drop(self.attn(x))
        y = self.layernorm(x.reshape((b * t, f)))
        y = linear(self.linear2, drop(linear(self.linear1, y, self.relu)))
        return x + drop(y.reshape((b, t, f)))
