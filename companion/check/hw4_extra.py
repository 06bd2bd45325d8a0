"""hw4_extra checks: multi-head attention, the attention layer, the Transformer.

Attention is compared with a numpy softmax(QK^T/sqrt(d) + mask)V; the layers with numpy
re-computations from their parameters where the course fixes the names, and otherwise with
properties any correct answer has (causality, shapes, batch_first as a transpose).
"""

import numpy as np

from .common import randn
from .diagnose import check_close, require, to_numpy
from .hw4 import on_device


def _t(a):
    import needle as ndl

    return ndl.Tensor(np.asarray(a, dtype=np.float32), requires_grad=False, **on_device())


def attention_ref(q, k, v, causal):
    """softmax(q k^T / sqrt(d) + mask) v and the probabilities, over (B, H, T, D) arrays."""
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if causal:
        s = s + np.triu(np.full(s.shape[-2:], -np.inf), k=1)
    p = np.exp(s - s.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)
    return p @ v, p


def hw4_extra_attention(ctx):
    import needle as ndl

    q, k, v = (randn(2, 2, 4, 3, seed=s) for s in (120, 121, 122))
    for causal in (False, True):
        layer = ndl.nn.MultiHeadAttention(dropout=0.0, causal=causal, **on_device())
        layer.eval()
        out, probs = layer(_t(q), _t(k), _t(v))
        check_close(
            f"MultiHeadAttention(causal={causal}) probabilities",
            probs,
            lambda causal=causal: attention_ref(q, k, v, causal)[1],
            inputs={"q": q, "k": k, "v": v},
            rtol=1e-4,
            atol=1e-5,
            hint="softmax over the last axis of q k^T / sqrt(dim_head)"
            + ("; mask entries above the diagonal" if causal else ""),
        )
        check_close(
            f"MultiHeadAttention(causal={causal}) result",
            out,
            lambda causal=causal: attention_ref(q, k, v, causal)[0],
            rtol=1e-4,
            atol=1e-5,
        )


def _ln(x, eps=1e-5):
    m = x.mean(-1, keepdims=True)
    return (x - m) / np.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + eps)


def hw4_extra_attention_layer(ctx):
    import needle as ndl

    np.random.seed(15)
    layer = ndl.nn.AttentionLayer(6, 2, 3, causal=True, dropout=0.0, **on_device())
    layer.eval()
    x = randn(2, 4, 6, seed=123)
    w = {
        n: to_numpy(getattr(layer, n).weight).astype(np.float64)
        for n in ("q_projection", "k_projection", "v_projection", "out_projection")
    }

    def expected():
        xn = _ln(x.astype(np.float64))

        def heads(z):
            return z.reshape(2, 4, 2, 3).transpose(0, 2, 1, 3)

        out, _ = attention_ref(
            heads(xn @ w["q_projection"]),
            heads(xn @ w["k_projection"]),
            heads(xn @ w["v_projection"]),
            True,
        )
        return out.transpose(0, 2, 1, 3).reshape(2, 4, 6) @ w["out_projection"]

    check_close(
        "AttentionLayer(6, num_head=2, dim_head=3, causal=True)(x), x (B, T, 6)",
        layer(_t(x)),
        expected,
        inputs={"x": x},
        rtol=1e-4,
        atol=1e-4,
        hint="pre-norm (prenorm_q/k/v), bias-free q/k/v projections, split into "
        "heads (B, H, T, D), attention, merge heads, out_projection",
    )


def _causal(make, x, what):
    out = to_numpy(make(x))
    x2 = x.copy()
    x2[-1] += 1.0
    out2 = to_numpy(make(x2))
    check_close(
        f"{what}: outputs before the last time step after changing only the last "
        "input (causal=True must not look ahead)",
        out2[:-1],
        lambda: out[:-1],
        rtol=1e-4,
        atol=1e-5,
    )
    require(not np.allclose(out2[-1], out[-1]), f"{what}: the last output ignores its input")


def hw4_extra_transformer_layer(ctx):
    import needle as ndl

    np.random.seed(16)
    layer = ndl.nn.TransformerLayer(6, 2, 3, 8, dropout=0.0, causal=True, **on_device())
    layer.eval()
    x = randn(2, 4, 6, seed=124)
    out = to_numpy(layer(_t(x)))
    require(
        out.shape == (2, 4, 6),
        f"TransformerLayer(6, 2, 3, 8) on (B, T, 6) gives shape {out.shape}, expected (2, 4, 6)",
    )
    # time is axis 1 here: move it first for the causality check
    _causal(
        lambda a: np.swapaxes(to_numpy(layer(_t(np.swapaxes(a, 0, 1)))), 0, 1),
        np.swapaxes(x, 0, 1),
        "TransformerLayer(causal=True)",
    )


def hw4_extra_transformer(ctx):
    import needle as ndl

    def make(batch_first):
        np.random.seed(17)
        m = ndl.nn.Transformer(
            6,
            8,
            2,
            num_head=2,
            dim_head=3,
            dropout=0.0,
            causal=True,
            batch_first=batch_first,
            sequence_len=10,
            **on_device(),
        )
        m.eval()
        return m

    model = make(False)
    x = randn(4, 2, 6, seed=125)
    out = model(_t(x))
    require(
        isinstance(out, tuple) and len(out) == 2,
        "Transformer.forward must return the pair (x, zeros_like(x))",
    )
    y = to_numpy(out[0])
    require(
        y.shape == (4, 2, 6), f"Transformer on (T, B, 6) gives shape {y.shape}, expected (4, 2, 6)"
    )
    check_close("the second value Transformer returns", out[1], lambda: np.zeros_like(y))
    _causal(lambda a: model(_t(a))[0], x, "Transformer(causal=True)")
    yb = make(True)(_t(np.swapaxes(x, 0, 1)))[0]
    check_close(
        "Transformer(batch_first=True) on x transposed to (B, T, E), compared with "
        "batch_first=False",
        np.swapaxes(to_numpy(yb), 0, 1),
        lambda: y,
        rtol=1e-4,
        atol=1e-5,
    )
