"""Reference answers to the exercises of notebooks/09_transformers (try them first)."""
import numpy as np


def causal_mask(T):
    """(T, T) array: 0 on and below the diagonal, -inf above."""
    return np.triu(np.full((T, T), -np.inf), k=1)


def attention(q, k, v, causal):
    """softmax(q kᵀ / sqrt(d) + mask) v over the last two axes."""
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if causal:
        scores = scores + causal_mask(q.shape[-2])
    p = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ v


def attention_layer_parameter_count(q_features, num_head, dim_head):
    """3 LayerNorms (2·q each) + q, k, v projections (q·inner each) + output (inner·q)."""
    inner = num_head * dim_head
    return 3 * 2 * q_features + 3 * q_features * inner + inner * q_features
