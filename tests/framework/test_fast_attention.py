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

pytestmark = pytest.mark.nn

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
