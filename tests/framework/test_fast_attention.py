"""``needle.fast``'s self-attention projections: ``fast.fuse`` on an ``nn.AttentionLayer`` packs
its three pre-norms and q, k, v projections into one node (``fast.ops.self_attention_qkv``).

The packed op folds each norm's affine into its projection, so it reassociates float32 sums:
the tests hold it to the course's layer within a relative 1e-5 of each quantity's scale
(outputs, the input's gradient; parameter gradients within 1e-5 of the largest of them), over
two SGD steps, with norm weights and biases that are not the
initial ones (at ones and zeros the fold would be trivially exact). The oracle is the course's
layer itself (its ops are tested against numpy and finite differences elsewhere) and, for the
op alone, numpy.
"""

from __future__ import annotations

import numpy as np
import pytest

import needle as ndl
import needle.fast as fast
from needle import nn
from needle.fast import ops as fops

pytestmark = [pytest.mark.nn, pytest.mark.both_backends]

# relative to the largest magnitude of each compared quantity: float32 reassociation
SCALED_TOL = 1e-5
E, HEADS, DIM_HEAD = 16, 2, 8


def _close(got, want, scale=0.0):
    scale = max(float(np.abs(want).max()), scale, 1e-6)
    np.testing.assert_allclose(got, want, rtol=0, atol=SCALED_TOL * scale)


def _layer(seed: int = 0, **kwargs) -> nn.AttentionLayer:
    """A seeded AttentionLayer whose three norms have random, distinct weights and biases."""
    np.random.seed(seed)
    layer = nn.AttentionLayer(E, HEADS, DIM_HEAD, causal=True, **kwargs)
    rng = np.random.default_rng(seed + 1)
    for norm in (layer.prenorm_q, layer.prenorm_k, layer.prenorm_v):
        norm.weight = nn.Parameter(rng.standard_normal(E).astype(np.float32))
        norm.bias = nn.Parameter(rng.standard_normal(E).astype(np.float32))
    return layer


def _train(layer: nn.AttentionLayer, steps: int = 2):
    """Outputs, input gradients and parameter gradients of ``steps`` SGD steps on a fixed
    batch (the weights of step 2 are step 1's update)."""
    rng = np.random.default_rng(7)
    x_np = rng.standard_normal((3, 5, E)).astype(np.float32)
    w_np = rng.standard_normal((3, 5, E)).astype(np.float32)
    opt = ndl.optim.SGD(layer.parameters(), lr=0.1)
    record = []
    for _ in range(steps):
        opt.reset_grad()
        x = ndl.Tensor(x_np, requires_grad=True)
        out = layer(x)
        (out * ndl.Tensor(w_np, requires_grad=False)).sum().backward()
        record.append([out.numpy(), x.grad.numpy(), layer.probs.numpy()])
        record[-1] += [p.grad.numpy() for p in layer.parameters()]
        opt.step()
    return record


def test_packed_layer_trains_as_the_course_layer():
    course, packed = _layer(), fast.fuse(_layer())
    assert type(packed) is fast.nn.FastAttentionLayer
    for got_step, want_step in zip(_train(packed), _train(course)):
        assert len(got_step) == len(want_step) == 3 + 10
        for got, want in zip(got_step[:3], want_step[:3]):
            _close(got, want)
        # The key norm's bias gets a gradient of exactly 0 (adding one vector to every key
        # shifts each query's logits by a constant), so both paths give rounding noise there:
        # parameter gradients are held to the scale of the largest parameter gradient.
        scale = max(float(np.abs(w).max()) for w in want_step[3:])
        for got, want in zip(got_step[3:], want_step[3:]):
            _close(got, want, scale)


def test_packed_op_matches_numpy():
    """The three outputs against numpy's layer norms and products, split into heads."""
    rng = np.random.default_rng(3)
    b, t = 2, 4
    x = rng.standard_normal((b, t, E)).astype(np.float32)
    norms = [[rng.standard_normal(E).astype(np.float32) for _ in range(2)] for _ in range(3)]
    projections = [rng.standard_normal((E, HEADS * DIM_HEAD)).astype(np.float32) for _ in "qkv"]
    outs = fops.self_attention_qkv(
        ndl.Tensor(x),
        [(ndl.Tensor(g), ndl.Tensor(c)) for g, c in norms],
        [ndl.Tensor(w) for w in projections],
        HEADS,
        1e-5,
    )
    xd = x.astype(np.float64)
    xhat = (xd - xd.mean(-1, keepdims=True)) / np.sqrt(xd.var(-1, keepdims=True) + 1e-5)
    for out, (g, c), w in zip(outs, norms, projections):
        want = ((xhat * g + c) @ w).reshape(b, t, HEADS, DIM_HEAD).transpose(0, 2, 1, 3)
        assert out.shape == want.shape
        _close(out.numpy(), want)


def test_cross_attention_and_unlike_norms_run_the_course_forward(monkeypatch):
    """k or v other than q, or norms of different eps, are not packed (the course's forward
    runs; the packed op is never called)."""
    calls = []
    monkeypatch.setattr(fops, "self_attention_qkv", lambda *a: calls.append(a))
    layer = fast.fuse(_layer())
    x = ndl.Tensor(np.ones((2, 3, E), dtype=np.float32))
    other = ndl.Tensor(np.zeros((2, 3, E), dtype=np.float32))
    layer(x, other, other)
    layer(x, x, other)
    layer.prenorm_k.eps = 1e-3
    layer(x)
    assert calls == []
    layer.prenorm_k.eps = layer.prenorm_q.eps
    with pytest.raises(TypeError):  # the packed path ran: the stub returned None
        layer(x)
    assert len(calls) == 1


def _args(x_shape=(2, 3, E), norm_shape=(E,), w_shapes=((E, 16),) * 3, heads=HEADS, eps=1e-5):
    x = ndl.Tensor(np.ones(x_shape, dtype=np.float32))
    norms = [(ndl.Tensor(np.ones(norm_shape, "f4")), ndl.Tensor(np.ones(norm_shape, "f4")))] * 3
    ws = [ndl.Tensor(np.ones(s, dtype=np.float32)) for s in w_shapes]
    return x, norms, ws, heads, eps


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"x_shape": (6, E)}, "needs x \\(B, T, E\\)"),
        ({"norm_shape": (E + 1,)}, "norm weights and biases of shape"),
        ({"w_shapes": ((E, 16), (E, 16), (E, 8))}, "projections of one shape"),
        ({"w_shapes": ((E + 1, 16),) * 3}, "projections of one shape"),
        ({"heads": 3}, "do not split into 3 heads"),
        ({"heads": 0}, "do not split into 0 heads"),
        ({"eps": 0.0}, "eps > 0"),
    ],
)
def test_packed_op_rejects_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        fops.self_attention_qkv(*_args(**kwargs))


def test_packed_op_needs_three_norms_and_projections():
    x, norms, ws, heads, eps = _args()
    with pytest.raises(ValueError, match="three norms and three projections"):
        fops.self_attention_qkv(x, norms[:2], ws, heads, eps)


def test_packed_op_is_not_differentiated_twice():
    x, norms, ws, heads, eps = _args()
    x = ndl.Tensor(np.random.default_rng(0).standard_normal((2, 3, E)).astype(np.float32))
    q, _, _ = fops.self_attention_qkv(x, norms, ws, heads, eps)
    with pytest.raises(NotImplementedError, match="self_attention_qkv"):
        q.sum().backward()
        x.grad.sum().backward()


# ---- the attention op: one node, one kernel call each way ---------------------------------------
def _heads_views(rng, b, h, t, d):
    """A (B, H, T, D) Tensor viewed from a (B, T, H, D) array, as the layer splits its heads."""
    x = rng.standard_normal((b, t, h, d)).astype(np.float32)
    return ndl.ops.transpose(ndl.Tensor(x, requires_grad=True), (1, 2))


@pytest.mark.parametrize(
    "b, h, tq, tk, d, causal",
    [(2, 3, 5, 5, 4, True), (1, 2, 3, 6, 5, True), (2, 1, 6, 3, 4, True), (3, 2, 4, 7, 8, False)],
)
@pytest.mark.parametrize("use_probs", [False, True])
def test_attention_op_matches_the_weights_and_values_ops(b, h, tq, tk, d, causal, use_probs):
    """fast.ops.attention against attention_weights then attention_values (the two nodes it
    replaces, themselves tested against the course's MultiHeadAttention): out, probs and the
    gradients of q, k, v, with a loss on out alone or on out and probs (the probs adjoint)."""
    rng = np.random.default_rng(b * 100 + tq * 10 + tk)
    w_out = rng.standard_normal((b, h, tq, d)).astype(np.float32)
    w_probs = rng.standard_normal((b, h, tq, tk)).astype(np.float32)
    arrays = [rng.standard_normal((b, t, h, d)).astype(np.float32) * 2 for t in (tq, tk, tk)]
    results = []
    for fused in (True, False):
        leaves = [ndl.Tensor(a, requires_grad=True) for a in arrays]
        q, k, v = (ndl.ops.transpose(t, (1, 2)) for t in leaves)
        if fused:
            out, probs = fops.attention(q, k, v, scale=0.3, causal=causal)
        else:
            probs = fops.attention_weights(q, k, scale=0.3, causal=causal)
            out = fops.attention_values(probs, v)
        loss = (out * ndl.Tensor(w_out)).sum()
        if use_probs:
            loss = loss + (probs * ndl.Tensor(w_probs)).sum()
        fast.backward(loss)
        results.append([out.numpy(), probs.numpy()] + [t.grad.numpy() for t in leaves])
    for got, want in zip(*results):
        _close(got, want)


def test_attention_op_is_not_differentiated_twice():
    rng = np.random.default_rng(3)
    q, k, v = (_heads_views(rng, 2, 2, 4, 3) for _ in range(3))
    out, _ = fops.attention(q, k, v, scale=0.5, causal=True)
    out.sum().backward()
    with pytest.raises(NotImplementedError, match="second derivative of attention"):
        q.inputs[0].grad.sum().backward()


def test_attention_op_rejects_bad_shapes():
    rng = np.random.default_rng(4)
    q = _heads_views(rng, 2, 2, 4, 3)
    with pytest.raises(ValueError, match="4-D"):
        fops.attention(q, q.reshape((4, 4, 3)), q)
    with pytest.raises(ValueError, match="alike"):
        fops.attention(q, _heads_views(rng, 2, 2, 5, 3), _heads_views(rng, 2, 2, 6, 3))


def test_fast_attention_keeps_the_two_ops_where_dropout_acts(monkeypatch):
    """A fused MultiHeadAttention is one attention node unless dropout acts on the weights (p > 0
    in training): then the weights, dropout and the product, and the probs it returns are the
    dropped weights, as the course's are."""
    calls = []
    real = fops.attention
    monkeypatch.setattr(fops, "attention", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    rng = np.random.default_rng(5)
    q, k, v = (_heads_views(rng, 2, 2, 4, 3) for _ in range(3))
    for p, training, fused in [(0.0, True, True), (0.5, False, True), (0.5, True, False)]:
        attn = nn.MultiHeadAttention(dropout=p, causal=True)
        attn.train() if training else attn.eval()
        fast.fuse(attn)
        calls.clear()
        np.random.seed(0)
        _, probs = attn(q, k, v)
        assert len(calls) == int(fused), (p, training)
        if not fused:  # dropped weights are 0, the others scaled by 1 / (1 - p)
            got = probs.numpy()
            assert (got == 0).any()
