"""needle.fast's attention ops: a whole attention softmax(scale · q kᵀ) v as one node and one
kernel call each way (:class:`Attention`), the attention weights as one node and their product
with the values (the two ops it replaces where the weights go through dropout), and
self-attention's three pre-norms and q, k, v projections as one node
(:class:`SelfAttentionQKV`). Re-exported by :mod:`needle.fast.ops`."""

from __future__ import annotations

from ..autograd import Tensor, TensorOp, TensorTuple, TensorTupleOp
from ..backend_selection import array_api
from ..ops.ops_mathematic import MatMul, matmul, transpose
from .ops import SoftmaxLastAxis, SoftmaxLastAxisBackward, _add_over, _BackwardOp

__all__ = [
    "Attention",
    "attention",
    "AttentionWeights",
    "attention_weights",
    "AttentionValues",
    "attention_values",
    "MatMulTransposed",
    "SelfAttentionQKV",
    "self_attention_qkv",
]


# ---- attention ----------------------------------------------------------------------------------
def _swap_last(a):
    """The view of raw array ``a`` with its last two axes swapped."""
    axes = list(range(a.ndim))
    axes[-2], axes[-1] = axes[-1], axes[-2]
    return a.permute(tuple(axes))


def _times_transposed(a, b):
    """a @ bᵀ over the last two axes of raw arrays a (..., n, d) and b (..., m, d), on compact
    copies of a and of bᵀ, the batched engine's fastest layout: per-head views of (B, T, H, D)
    arrays read in place, bᵀ column-major with a row stride of H·D, ran 3-5 times slower at
    T = D = 32 than the two small copies and the product together (measured when the engine
    ran batches of small products on one thread). Since :class:`Attention` took over, this
    serves only the two-op path that runs when dropout acts on the weights."""
    return a.compact() @ _swap_last(b).compact()


class MatMulTransposed(TensorOp):
    """a @ bᵀ over the last two axes for a (..., n, d) and b (..., m, d) with the same leading
    axes: (..., n, m), the values of ``matmul(a, transpose(b))`` (see
    :func:`_times_transposed`). The gradient (g b, gᵀ a) is written with needle ops."""

    def compute(self, a, b):
        return _times_transposed(a, b)

    def gradient(self, out_grad: Tensor, node: Tensor):
        a, b = node.inputs
        return matmul(out_grad, b), matmul(transpose(out_grad), a)


class AttentionWeights(TensorOp):
    """softmax(scale · q kᵀ) over the keys, the attention weights (..., Tq, Tk) of queries q
    (..., Tq, D) and keys k (..., Tk, D) (same leading axes), causally masked as
    :class:`SoftmaxLastAxis` with ``causal=True``: the product and the softmax as one node.

    The logits q kᵀ are a temporary of the forward pass: the softmax's gradient reads only its
    output, so the graph keeps the weights alone, where the two ops kept the logits too. The
    gradient is written with needle ops (the softmax's backward op, then the products'
    gradients), so it differentiates again."""

    def __init__(self, scale: float = 1.0, causal: bool = False):
        self.softmax = SoftmaxLastAxis(scale, causal)

    def compute(self, q, k):
        return self.softmax.compute(_times_transposed(q, k))

    def gradient(self, out_grad: Tensor, node: Tensor):
        q, k = node.inputs
        d_logits = SoftmaxLastAxisBackward(self.softmax.scale)(out_grad, node)
        return matmul(d_logits, k), matmul(transpose(d_logits), q)


def attention_weights(q: Tensor, k: Tensor, scale: float = 1.0, causal: bool = False) -> Tensor:
    """softmax(``scale`` · q kᵀ) over the last axis for q (..., Tq, D) and k (..., Tk, D):
    (..., Tq, Tk), with the causal mask of :class:`SoftmaxLastAxis` when ``causal``."""
    return AttentionWeights(scale, causal)(q, k)


class AttentionValues(MatMul):
    """probs @ v for attention weights (B, H, Tq, Tk) and values (B, H, Tk, D): the product of
    :class:`~needle.ops.ops_mathematic.MatMul` (same values, same gradient), its result
    (B, H, Tq, D) stored as a view of a row-major (B, Tq, H, D) array. The heads are merged
    by transposing axes 1 and 2 and reshaping to (B, Tq, H·D) (``nn.AttentionLayer``): on
    this layout that is a view, where on the product's own layout it was a copy, kept beside
    the product until backward."""

    def compute(self, probs, v):
        return _heads_inner(super().compute(probs, v))

    def gradient(self, out_grad: Tensor, node: Tensor):
        probs, v = node.inputs
        if tuple(probs.shape[:-2]) != tuple(v.shape[:-2]):  # broadcast batch axes: MatMul's
            return super().gradient(out_grad, node)
        # d probs = out_grad vᵀ on compact operands (:class:`MatMulTransposed`), not on views
        d_probs = MatMulTransposed()(out_grad, v) if probs.requires_grad else None
        d_v = matmul(transpose(probs), out_grad) if v.requires_grad else None
        return d_probs, d_v


def _heads_inner(out):
    """A raw (B, H, T, D) array copied into a row-major (B, T, H, D) buffer and viewed as
    (B, H, T, D) again: merging the heads (transpose axes 1 and 2, reshape) is then a view."""
    heads_inner = (0, 2, 1, 3)
    return out.permute(heads_inner).compact().permute(heads_inner)


def attention_values(probs: Tensor, v: Tensor) -> Tensor:
    """probs (B, H, Tq, Tk) @ v (B, H, Tk, D) → (B, H, Tq, D), laid out as (B, Tq, H, D) in
    memory (see :class:`AttentionValues`)."""
    if len(probs.shape) != 4 or len(v.shape) != 4:
        raise ValueError(
            f"attention_values needs 4-D probs (B, H, Tq, Tk) and v (B, H, Tk, D), got shapes "
            f"{tuple(probs.shape)} and {tuple(v.shape)}"
        )
    return AttentionValues()(probs, v)


class Attention(TensorTupleOp):
    """Attention per head as one node: for q (B, H, Tq, D), k and v (B, H, Tk, D), the tuple
    (out (B, H, Tq, D), probs (B, H, Tq, Tk)) with probs = softmax(scale · q kᵀ) over the keys
    (causally masked as :class:`SoftmaxLastAxis` with ``causal=True``) and out = probs v: what
    :func:`attention_weights` then :func:`attention_values` compute, in one ``attention_fwd``
    call, whose CPU kernel keeps each head's logits in cache instead of passing them through
    memory between a batched product, a softmax and another product. The products sum in
    another order, so values and gradients equal the two ops' to float32 rounding (tested),
    not bit for bit. out is laid out (B, Tq, H, D) in memory, as :class:`AttentionValues`
    lays it out (merging the heads is then a view).

    The gradient is one ``attention_bwd`` call, which takes the adjoint of probs as well (zeros
    when only out is used): a node whose second derivative is not implemented (it says so by
    name); the two-op path differentiates any number of times."""

    def __init__(self, scale: float = 1.0, causal: bool = False):
        self.scale, self.causal = float(scale), bool(causal)
        self.probs = None

    def compute(self, q, k, v):
        b, h, tq, d = q.shape
        tk = k.shape[2]
        out, self.probs = array_api.attention_fwd(
            _heads_flat(q), _heads_flat(k), _heads_flat(v), self.scale, self.causal
        )
        return _heads_inner(out.reshape((b, h, tq, d))), self.probs.reshape((b, h, tq, tk))

    def gradient(self, out_grad: TensorTuple, node: TensorTuple):
        grads = AttentionBackward(self)(out_grad, *node.inputs)
        return grads[0], grads[1], grads[2]


def _heads_flat(a):
    """A raw (B, H, T, D) array as a compact (B·H, T, D) one."""
    b, h, t, d = a.shape
    return a.compact().reshape((b * h, t, d))


class AttentionBackward(_BackwardOp, TensorTupleOp):
    """The adjoints (dq, dk, dv) of :class:`Attention`'s inputs from the tuple adjoint of its
    (out, probs) and the forward op's saved weights: one ``attention_bwd`` call."""

    forward_name = "attention"

    def __init__(self, forward: Attention):
        self.probs, self.scale = forward.probs, forward.scale

    def compute(self, adjoint, q, k, v):
        d_out, d_probs = adjoint
        b, h, tq, tk = d_probs.shape
        grads = array_api.attention_bwd(
            _heads_flat(d_out),
            d_probs.compact().reshape((b * h, tq, tk)),
            self.probs,
            _heads_flat(q),
            _heads_flat(k),
            _heads_flat(v),
            self.scale,
        )
        return tuple(g.reshape(tuple(x.shape)) for g, x in zip(grads, (q, k, v)))


def attention(q: Tensor, k: Tensor, v: Tensor, scale: float = 1.0, causal: bool = False):
    """(out, probs) of softmax(``scale`` · q kᵀ) v for q (B, H, Tq, D), k and v (B, H, Tk, D),
    with the causal mask when ``causal``: one node (see :class:`Attention`)."""
    shapes = [tuple(t.shape) for t in (q, k, v)]
    if any(len(s) != 4 for s in shapes):
        raise ValueError(f"attention needs 4-D q, k, v (B, H, T, D), got shapes {shapes}")
    (b, h, _, d), kv = shapes[0], shapes[1]
    if kv != shapes[2] or kv[:2] != (b, h) or kv[3] != d:
        raise ValueError(
            f"attention needs q (B, H, Tq, D) and k, v (B, H, Tk, D) alike, got shapes {shapes}"
        )
    out = Attention(scale, causal)(q, k, v)
    return out[0], out[1]


# ---- self-attention's q, k, v projections ------------------------------------------------------
HEADS_FIRST = (2, 0, 3, 1, 4)  # (B, T, 3, H, D) -> (3, B, H, T, D)


def _ones(n: int, device):
    """A cached array of ``n`` ones on ``device`` (a layer norm's identity weight)."""
    key = (n, device)
    if key not in _ONES:
        _ONES[key] = device.full((n,), 1.0)
    return _ONES[key]


_ONES: dict = {}


def _head_views(out, b: int, t: int, heads: int):
    """The three (B, H, T, D) views of the (B·T, 3·H·D) array ``out`` laid out (B, T, 3, H, D)
    (views of either backend's array: an NDArray's integer index keeps its axis, numpy's drops
    it)."""
    dim = out.shape[1] // (3 * heads)
    split = out.reshape((b, t, 3, heads, dim)).permute(HEADS_FIRST)
    views = [split[i] for i in range(3)]
    if len(views[0].shape) == 5:  # the NDArray's (1, B, H, T, D): drop the first axis
        views = [v.as_strided(split.shape[1:], split.strides[1:]) for v in views]
    return tuple(views)


class SelfAttentionQKV(TensorTupleOp):
    """Self-attention's queries, keys and values from one input, as one node: for x (B, T, E)
    and three (layer-norm weight g (E,), bias b (E,), projection W (E, H·D)) triples, the
    tuple (LN_q(x) W_q, LN_k(x) W_k, LN_v(x) W_v), each split into heads (B, H, T, D): what
    ``nn.AttentionLayer._heads`` computes three times when q = k = v = x.

    The three norms share x's normalised rows xhat = (x - mean)·rstd, so each norm's affine is
    folded into its projection, LN_i(x) W_i = xhat (g_i ⊙ W_i) + b_i W_i, and the three
    projections are one product xhat [g_q⊙W_q | g_k⊙W_k | g_v⊙W_v] of width 3·H·D (PyTorch's
    packed in-projection). The fold reassociates float32 sums: values and gradients equal the
    course's to rounding (relative 1e-5, tested), not bit for bit. The result is one
    (B, T, 3, H, D) array; the three outputs are views of it. The backward keeps xhat (B·T, E),
    rstd and the folded weights; it is one ``layernorm_bwd`` call and three products."""

    def __init__(self, heads: int, eps: float):
        self.heads, self.eps = heads, eps

    def compute(self, x, *params):
        b, t, e = x.shape
        rows, device = b * t, x.device
        triples = [params[i : i + 3] for i in (0, 3, 6)]
        inner = triples[0][2].shape[1]
        g0, b0, _ = triples[0]
        _, self.xhat, self.rstd = array_api.layernorm_fwd(
            x.compact().reshape((rows, e)), g0, b0, self.eps
        )
        self.folded = device.empty((e, 3 * inner))
        shift = device.empty((1, 3 * inner))
        for i, (g, bias, w) in enumerate(triples):
            cols = slice(i * inner, (i + 1) * inner)
            self.folded[:, cols] = g.compact().reshape((e, 1)).broadcast_to((e, inner)) * w
            shift[:, cols] = bias.compact().reshape((1, e)) @ w.compact()
        out = self.xhat @ self.folded
        _add_over(out, shift.broadcast_to(out.shape))
        return _head_views(out, b, t, self.heads)

    def gradient(self, out_grad: TensorTuple, node: TensorTuple):
        grads = SelfAttentionQKVBackward(self)(out_grad, *node.inputs)
        return tuple(grads[k] for k in range(10))


class SelfAttentionQKVBackward(_BackwardOp, TensorTupleOp):
    """The adjoints of :class:`SelfAttentionQKV`'s inputs (x, then g, b, W of q, k and v) from
    the tuple adjoint of its three outputs and the forward op's saved xhat, rstd and folded
    weights."""

    forward_name = "self_attention_qkv"

    def __init__(self, forward: SelfAttentionQKV):
        self.xhat, self.rstd, self.folded = forward.xhat, forward.rstd, forward.folded
        self.heads = forward.heads

    def compute(self, adjoint, x, *params):
        b, t, e = x.shape
        rows, device = b * t, x.device
        d_out = device.empty((rows, self.folded.shape[1]))
        for view, d in zip(_head_views(d_out, b, t, self.heads), adjoint):
            view[:, :, :, :] = d
        d_folded = self.xhat.permute((1, 0)) @ d_out
        d_shift = d_out.sum(axis=0, keepdims=True)
        d_xhat = d_out @ self.folded.permute((1, 0))
        dx = array_api.layernorm_bwd(d_xhat, self.xhat, self.rstd, _ones(e, device))[0]
        grads = [dx.reshape(tuple(x.shape))]
        inner = self.folded.shape[1] // 3
        for i in range(3):
            g, bias, w = params[3 * i : 3 * i + 3]
            cols = slice(i * inner, (i + 1) * inner)
            dwf, dc = d_folded[:, cols], d_shift[:, cols].broadcast_to((e, inner))
            column = (e, 1)
            dw = g.compact().reshape(column).broadcast_to((e, inner)) * dwf
            dw = dw + bias.compact().reshape(column).broadcast_to((e, inner)) * dc
            dg = (dwf * w).sum(axis=1).reshape(tuple(g.shape))
            db = (w * dc).sum(axis=1).reshape(tuple(bias.shape))
            grads += [dg, db, dw]
        return tuple(grads)


def self_attention_qkv(x: Tensor, norms, projections, heads: int, eps: float):
    """(q, k, v), each (B, H, T, D), of self-attention on x (B, T, E): ``norms`` three
    (weight (E,), bias (E,)) pairs and ``projections`` three weights (E, H·D), one node (see
    :class:`SelfAttentionQKV`)."""
    if len(x.shape) != 3:
        raise ValueError(f"self_attention_qkv needs x (B, T, E), got shape {tuple(x.shape)}")
    e = x.shape[2]
    if len(norms) != 3 or len(projections) != 3:
        raise ValueError("self_attention_qkv needs three norms and three projections (q, k, v)")
    if any(tuple(t.shape) != (e,) for pair in norms for t in pair):
        raise ValueError(f"self_attention_qkv needs norm weights and biases of shape ({e},)")
    inner = projections[0].shape[-1]
    if any(tuple(w.shape) != (e, inner) for w in projections):
        raise ValueError(
            f"self_attention_qkv needs projections of one shape (E={e}, H·D), got "
            f"{[tuple(w.shape) for w in projections]}"
        )
    if heads < 1 or inner % heads:
        raise ValueError(f"self_attention_qkv: {inner} features do not split into {heads} heads")
    if not eps > 0:
        raise ValueError(f"self_attention_qkv needs eps > 0, got {eps}")
    params = [t for (g, b), w in zip(norms, projections) for t in (g, b, w)]
    out = SelfAttentionQKV(heads, float(eps))(x, *params)
    return out[0], out[1], out[2]
