"""Transformer modules (hw4_extra): MultiHeadAttention, AttentionLayer, TransformerLayer,
Transformer.

Shapes follow the course: attention works on (batch_size, num_head, seq_len, dim_head); the
layers work batch-first, (batch_size, seq_len, features); ``Transformer`` is time-major
(seq_len, batch_size, features) unless ``batch_first=True``, like the RNN and LSTM.
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

import needle.init as init
from needle import ops
from needle.autograd import Tensor

from .nn_basic import Dropout, LayerNorm1d, Linear, Module, ReLU, Sequential
from .nn_sequence import Embedding

__all__ = ["MultiHeadAttention", "AttentionLayer", "TransformerLayer", "Transformer"]


def check_tensor(x, ndim: int, what: str, layout: str) -> None:
    """Raise unless ``x`` is a needle Tensor with ``ndim`` axes (``layout`` names them)."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{what} expects a needle Tensor, got {type(x).__name__}")
    if len(x.shape) != ndim:
        raise ValueError(f"{what} expects a {ndim}-D input {layout}, got shape {tuple(x.shape)}")


def check_attention_inputs(q: Tensor, k: Tensor, v: Tensor) -> int:
    """Check q (B, H, Tq, D), k and v (B, H, Tk, D); returns D."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(t, 4, f"MultiHeadAttention {name}", "(batch, heads, seq_len, dim_head)")
    q_dim, k_dim, v_dim = q.shape[3], k.shape[3], v.shape[3]
    if not (q_dim == k_dim == v_dim):
        raise ValueError(f"q, k, v must share dim_head, got {q_dim}, {k_dim}, {v_dim}")
    if tuple(k.shape) != tuple(v.shape) or k.shape[:2] != q.shape[:2]:
        raise ValueError(
            f"k and v must have shape (batch, heads, keys_len, dim_head) matching "
            f"q {tuple(q.shape)}: got k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    return q_dim


# question: hw4_extra_attention
class MultiHeadAttention(Module):
    """Scaled dot-product attention over already-split heads.

    softmax(Q Kᵀ / sqrt(dim_head) + mask) V, the softmax over the key axis (the last one). With
    ``causal=True`` query i may not attend to key j > i + (keys_len - queries_len): the course
    adds -finfo(float32).max to those logits (``create_causal_mask``), so their weight is 0.
    Dropout is applied to the probabilities.
    """

    def __init__(
        self, *, dropout: float = 0.0, causal: bool = False, device=None, dtype: str = "float32"
    ):
        super().__init__()
        self.device = device
        self.dtype = dtype
        self.causal = causal
        self.dropout = Dropout(dropout)

    def create_causal_mask(self, i: int, j: int, device):
        """The additive mask Tensor (1, 1, i, j): 0 on and below the diagonal j - i, -max above."""
        mask = -np.finfo(np.float32).max * np.triu(
            np.ones((1, 1, i, j), dtype=np.float32), j - i + 1
        )
        return Tensor(mask, device=device, dtype="float32", requires_grad=False)

    def matmul(self, a: Tensor, b_transpose: Tensor) -> Tensor:
        """Batched a @ b_transposeᵀ: (..., n, d) and (..., m, d) → (..., n, m)."""
        return ops.matmul(a, ops.transpose(b_transpose))

    def softmax(self, logit: Tensor) -> Tensor:
        """Softmax over the last axis, shifted by the (constant) row max for stability."""
        row = (*logit.shape[:-1], 1)
        max_val = Tensor(
            logit.realize_cached_data().max(axis=len(logit.shape) - 1),
            device=logit.device,
            dtype=logit.dtype,
            requires_grad=False,
        )
        probs = ops.exp(logit - max_val.reshape(row).broadcast_to(logit.shape))
        denom = probs.sum(axes=len(logit.shape) - 1).reshape(row).broadcast_to(logit.shape)
        return probs / denom

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tuple[Tensor, Tensor]:
        """q (B, H, Tq, D), k and v (B, H, Tk, D) → (result (B, H, Tq, D), probs (B, H, Tq, Tk)).

        ``probs`` is returned after dropout, as in the course.
        """
        q_dim = check_attention_inputs(q, k, v)
        queries_len, keys_values_len = q.shape[2], k.shape[2]
        logits = self.matmul(q, k) / np.sqrt(q_dim)
        if self.causal:
            mask = self.create_causal_mask(queries_len, keys_values_len, q.device)
            logits = logits + mask.broadcast_to(logits.shape)
        probs = self.dropout(self.softmax(logits))
        result = self.matmul(probs, ops.transpose(v))
        return result, probs


# question: hw4_extra_attention_layer
class AttentionLayer(Module):
    """Multi-head attention with pre-norm inputs and bias-free projections.

    q (B, Tq, q_features), k/v (B, Tk, k_features/v_features) are each LayerNorm1d-ed
    (``prenorm_q/k/v``), projected to num_head·dim_head (``q/k/v_projection``), split into
    heads, attended (``attn``), merged and projected to out_features (``out_projection``).
    After a forward, ``probs`` holds the attention weights (B, H, Tq, Tk), detached (an
    extension, for heat maps).
    """

    def __init__(
        self,
        q_features: int,
        num_head: int,
        dim_head: int,
        *,
        k_features: Optional[int] = None,
        v_features: Optional[int] = None,
        out_features: Optional[int] = None,
        dropout: float = 0.0,
        causal: bool = True,
        device=None,
        dtype: str = "float32",
    ):
        super().__init__()
        self.device = device
        self.dtype = dtype
        if k_features is None:
            k_features = q_features
        if v_features is None:
            v_features = q_features
        if out_features is None:
            out_features = q_features
        self.q_features = q_features
        self.k_features = k_features
        self.v_features = v_features
        self.out_features = out_features
        self.num_head = num_head
        self.dim_head = dim_head
        self.prenorm_q = LayerNorm1d(q_features, device=device, dtype=dtype)
        self.prenorm_k = LayerNorm1d(k_features, device=device, dtype=dtype)
        self.prenorm_v = LayerNorm1d(v_features, device=device, dtype=dtype)
        inner_dim = num_head * dim_head
        self.q_projection = Linear(q_features, inner_dim, bias=False, device=device, dtype=dtype)
        self.k_projection = Linear(k_features, inner_dim, bias=False, device=device, dtype=dtype)
        self.v_projection = Linear(v_features, inner_dim, bias=False, device=device, dtype=dtype)
        self.attn = MultiHeadAttention(dropout=dropout, causal=causal, device=device, dtype=dtype)
        self.out_projection = Linear(
            inner_dim, out_features, bias=False, device=device, dtype=dtype
        )

    def _heads(self, x: Tensor, norm: Module, proj: Module) -> Tensor:
        """(B, T, F) → normalised, projected and split into heads: (B, H, T, D)."""
        b, t, f = x.shape
        x = proj(norm(x.reshape((b * t, f))))
        x = x.reshape((b, t, self.num_head, self.dim_head))
        return ops.transpose(x, (1, 2))

    def forward(self, q: Tensor, k: Optional[Tensor] = None, v: Optional[Tensor] = None) -> Tensor:
        """q (B, Tq, q_features), k (B, Tk, k_features), v (B, Tk, v_features); k, v default
        to q (self-attention). Returns (B, Tq, out_features)."""
        if k is None:
            k = q
        if v is None:
            v = q
        for name, t, f in (
            ("q", q, self.q_features),
            ("k", k, self.k_features),
            ("v", v, self.v_features),
        ):
            check_tensor(t, 3, f"AttentionLayer {name}", "(batch, seq_len, features)")
            if t.shape[2] != f:
                raise ValueError(
                    f"AttentionLayer {name} must have {f} features, got shape {tuple(t.shape)}"
                )
        batch_size, queries_len, _ = q.shape
        qh = self._heads(q, self.prenorm_q, self.q_projection)
        kh = self._heads(k, self.prenorm_k, self.k_projection)
        vh = self._heads(v, self.prenorm_v, self.v_projection)
        out, probs = self.attn(qh, kh, vh)
        # An extension: the last attention weights, detached, for heat maps.
        self.probs = probs.detach()
        out = ops.transpose(out, (1, 2)).reshape(
            (batch_size * queries_len, self.num_head * self.dim_head)
        )
        return self.out_projection(out).reshape((batch_size, queries_len, self.out_features))


# question: hw4_extra_transformer_layer
class TransformerLayer(Module):
    """A pre-norm Transformer block, as in hw4_extra:

    x = x + dropout(attn(x)); x = x + dropout(linear2(dropout(relu(linear1(layernorm(x)))))).
    Input and output (batch_size, seq_len, q_features).
    """

    def __init__(
        self,
        q_features: int,
        num_head: int,
        dim_head: int,
        hidden_size: int,
        *,
        dropout: float = 0.0,
        causal: bool = True,
        device=None,
        dtype: str = "float32",
    ):
        super().__init__()
        self.device = device
        self.dtype = dtype
        self.q_features = q_features
        self.attn = AttentionLayer(
            q_features,
            num_head,
            dim_head,
            out_features=q_features,
            dropout=dropout,
            causal=causal,
            device=device,
            dtype=dtype,
        )
        self.layernorm = LayerNorm1d(q_features, device=device, dtype=dtype)
        self.linear1 = Linear(q_features, hidden_size, device=device, dtype=dtype)
        self.linear2 = Linear(hidden_size, q_features, device=device, dtype=dtype)
        self.relu = ReLU()
        self.dropout = Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """x (batch_size, seq_len, q_features) → same shape."""
        check_tensor(x, 3, "TransformerLayer", "(batch, seq_len, features)")
        b, t, f = x.shape
        x = x + self.dropout(self.attn(x))
        y = self.layernorm(x.reshape((b * t, f)))
        y = self.linear2(self.dropout(self.relu(self.linear1(y))))
        return x + self.dropout(y.reshape((b, t, f)))


# question: hw4_extra_transformer
class Transformer(Module):
    """A decoder-only Transformer: learned positional embeddings + ``num_layers`` blocks.

    forward(x) adds ``positional_embedding`` of positions 0..seq_len-1 and applies ``layers``.
    x is (seq_len, bs, embedding_size), or (bs, seq_len, embedding_size) with
    ``batch_first=True``; seq_len may not exceed ``sequence_len``.
    """

    def __init__(
        self,
        embedding_size: int,
        hidden_size: int,
        num_layers: int,
        *,
        num_head: int = 8,
        dim_head: int = 32,
        dropout: float = 0.0,
        causal: bool = True,
        device=None,
        dtype: str = "float32",
        batch_first: bool = False,
        sequence_len: int = 2048,
    ):
        super().__init__()
        self.device = device
        self.dtype = dtype
        self.batch_first = batch_first
        self.embedding_size = embedding_size
        self.sequence_len = sequence_len
        self.positional_embedding = Embedding(
            sequence_len, embedding_size, device=device, dtype=dtype
        )
        self.layers = Sequential(
            *[
                TransformerLayer(
                    embedding_size,
                    num_head,
                    dim_head,
                    hidden_size,
                    dropout=dropout,
                    causal=causal,
                    device=device,
                    dtype=dtype,
                )
                for _ in range(num_layers)
            ]
        )

    def forward(self, x: Tensor, h=None) -> Tuple[Tensor, Tensor]:
        """x (seq_len, bs, E) (or (bs, seq_len, E) if batch_first) → (x', zeros_like(x')).

        ``h`` is accepted for interface parity with RNN/LSTM and ignored.
        """
        layout = "(bs, seq_len, E)" if self.batch_first else "(seq_len, bs, E)"
        check_tensor(x, 3, "Transformer", layout)
        if x.shape[2] != self.embedding_size:
            raise ValueError(
                f"Transformer expects {layout} with E = {self.embedding_size}, "
                f"got shape {tuple(x.shape)}"
            )
        if not self.batch_first:
            x = ops.transpose(x, axes=(0, 1))
        bs, seq_len, _ = x.shape
        if seq_len > self.sequence_len:
            raise ValueError(
                f"sequence length {seq_len} exceeds the positional embedding's "
                f"sequence_len={self.sequence_len}"
            )
        # One lookup per position, broadcast over the batch (a view): the same sum as looking
        # up positions broadcast to (seq_len, bs), without a (seq_len, bs, E) array kept.
        positions = Tensor(
            np.arange(seq_len, dtype=np.float32).reshape(seq_len, 1),
            device=x.device,
            dtype=x.dtype,
            requires_grad=False,
        )
        pos = self.positional_embedding(positions).broadcast_to((seq_len, bs, x.shape[2]))
        x = self.layers(x + ops.transpose(pos, axes=(0, 1)))
        if not self.batch_first:
            x = ops.transpose(x, axes=(0, 1))
        return x, init.zeros_like(x)
