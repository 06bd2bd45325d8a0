"""Bytes a training step's ops keep and allocate, counted by the device module's allocator
counter (``memory_stats``): deterministic figures derived from the shapes, one test per memory
fix of the language-model steps (issue 22's memory target).

Each test states the bytes the op needs (its result, the arrays its backward reads) and checks
the counter's peak against that figure; the code before each fix allocated or kept whole extra
arrays of the same size, which these bounds exclude.
"""

from __future__ import annotations

import gc
from typing import Callable, Tuple

import numpy as np
import pytest
from conftest import device_params

import needle as ndl
import needle.fast as fast
from needle import nn
from needle.backend_ndarray import fused

# The NDArray devices, each with an allocator counter (the numpy backend's arrays have none).
COUNTED = device_params(("cpu", "cuda", "cpu_numpy"))
F32 = 4
# Slack for the small arrays around a big one (a column of N, alignment pads of 64 bytes).
SMALL = 64 * 1024


def _peak(device, fn: Callable[[], object]) -> Tuple[int, object]:
    """(peak bytes allocated above the start during ``fn()``, its result), cycle collector off."""
    gc.collect()
    gc.disable()
    try:
        mod = device.mod
        start = mod.memory_stats()["live_bytes"]
        mod.reset_peak()
        out = fn()
        return mod.memory_stats()["peak_bytes"] - start, out
    finally:
        gc.enable()


@pytest.mark.parametrize("device", COUNTED)
def test_softmax_xent_gradient_allocates_only_its_result(device):
    """(probs - one_hot) * column used to hold the one-hot matrix and the difference beside the
    result: three (N, C) arrays, the peak of a language model's step. Now one kernel writes the
    result alone, or into the probabilities (out=probs) with nothing new."""
    rows, cols = 256, 1000
    rng = np.random.default_rng(0)
    logits = ndl.NDArray(rng.standard_normal((rows, cols)).astype(np.float32), device=device)
    labels = ndl.NDArray(rng.integers(0, cols, rows).astype(np.float32), device=device)
    dloss = ndl.NDArray(rng.standard_normal(rows).astype(np.float32), device=device)
    _, probs = fused.softmax_xent(logits, labels)
    peak, grad = _peak(device, lambda: fused.softmax_xent_bwd(probs, labels, dloss, 0.5))
    result = rows * cols * F32
    assert result <= peak <= result + SMALL, peak
    # into the probabilities themselves: nothing of their size is allocated
    p = probs.numpy()
    in_place = lambda: fused.softmax_xent_bwd(probs, labels, dloss, 0.5, out=probs)  # noqa: E731
    peak, same = _peak(device, in_place)
    assert same is probs and peak <= SMALL, peak
    np.testing.assert_array_equal(same.numpy(), grad.numpy())
    # the values: (softmax - one_hot) * dloss * scale, against numpy
    one_hot = np.eye(cols, dtype=np.float32)[labels.numpy().astype(int)]
    want = (p - one_hot) * (dloss.numpy()[:, None] * np.float32(0.5))
    np.testing.assert_allclose(grad.numpy(), want, rtol=1e-6, atol=1e-7)


def _live(device) -> int:
    return device.mod.memory_stats()["live_bytes"]


@pytest.mark.parametrize("device", COUNTED)
def test_lstm_keeps_no_input_projection_between_forward_and_backward(device):
    """needle.fast's LSTM computes the input projections X W_ih + b (T, B, 4H) inside its op:
    the graph used to keep two such arrays per layer (the product and the sum with the
    biases) until backward. What stays is what the backward reads: the gate activations
    (T, B, 4H), the outputs (T, B, H), h_T and c_T, the stacked h_n and c_n (and the zero
    initial states)."""
    steps, batch, features, hidden = 16, 8, 32, 32
    np.random.seed(0)
    lstm = fast.fuse(nn.LSTM(features, hidden, num_layers=1, device=device))
    x = ndl.Tensor(np.random.randn(steps, batch, features).astype(np.float32), device=device)
    gc.collect()
    gc.disable()
    try:
        before = _live(device)
        out, (h_n, c_n) = lstm(x)
        kept = _live(device) - before
    finally:
        gc.enable()
    bh = batch * hidden * F32
    needed = steps * 4 * bh + steps * bh + 2 * bh + 2 * bh
    projection = steps * 4 * bh  # one (T, B, 4H) array
    assert needed <= kept <= needed + projection // 4, (kept, needed)
    # the gradients still flow to the input and every parameter
    (out * out).sum().backward(create_graph=False)
    assert x.grad is not None and all(p.grad is not None for p in lstm.parameters())


@pytest.mark.parametrize("device", COUNTED)
def test_lstm_without_biases_matches_its_cells(device):
    """The projection inside the layer op without biases (``W_ih`` only): outputs and every
    gradient equal those of the LSTMCell steps run one by one (a separate composition of ops)."""
    steps, batch, features, hidden = 5, 3, 4, 6
    np.random.seed(1)
    lstm = nn.LSTM(features, hidden, bias=False, device=device)
    x_np = np.random.randn(steps, batch, features).astype(np.float32)
    weights = np.random.randn(steps, batch, hidden).astype(np.float32)

    def run(step_by_step: bool):
        for p in lstm.parameters():
            p.grad = None
        x = ndl.Tensor(x_np, device=device)
        if step_by_step:
            cell, state, hs = lstm.lstm_cells[0], None, []
            for t in range(steps):
                state = cell(ndl.ops.split(x, 0)[t], state)
                hs.append(state[0])
            out = ndl.ops.stack(hs, 0)
        else:
            out = lstm(x)[0]
        (out * ndl.Tensor(weights, device=device, requires_grad=False)).sum().backward()
        return [out.numpy(), x.grad.numpy()] + [p.grad.numpy() for p in lstm.parameters()]

    for got, want in zip(run(False), run(True)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", COUNTED)
def test_layer_norm_keeps_only_its_output(device):
    """The layer norm op saves nothing for its backward (it recomputes the normalised rows
    from its input there): its forward keeps its output alone, where it kept the normalised
    rows xhat (R, C) and rstd (R,) beside it. The gradients still match finite differences
    (test_fused) and the values of the kept-array version (below, against numpy)."""
    rows, cols = 256, 64
    rng = np.random.default_rng(2)
    norm = fast.fuse(nn.LayerNorm1d(cols, device=device))
    x = ndl.Tensor(rng.standard_normal((rows, cols)).astype(np.float32), device=device)
    gc.collect()
    gc.disable()
    try:
        before = _live(device)
        y = norm(x)
        kept = _live(device) - before
    finally:
        gc.enable()
    assert rows * cols * F32 <= kept <= rows * cols * F32 + 4 * 1024, kept
    g = rng.standard_normal((rows, cols)).astype(np.float32)
    (y * ndl.Tensor(g, device=device, requires_grad=False)).sum().backward()
    x64 = x.numpy().astype(np.float64)
    xhat = (x64 - x64.mean(1, keepdims=True)) / np.sqrt(x64.var(1, keepdims=True) + norm.eps)
    dxhat = g * norm.weight.numpy().reshape(-1)
    dx = (dxhat - dxhat.mean(1, keepdims=True) - xhat * (dxhat * xhat).mean(1, keepdims=True)) / (
        np.sqrt(x64.var(1, keepdims=True) + norm.eps)
    )
    np.testing.assert_allclose(x.grad.numpy(), dx, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(
        norm.weight.grad.numpy().reshape(-1), (g * xhat).sum(0), rtol=1e-3, atol=1e-3
    )


@pytest.mark.parametrize("device", COUNTED)
def test_attention_keeps_its_weights_and_one_result(device):
    """needle.fast's MultiHeadAttention keeps the weights and the result (B, H, Tq, D) only:
    the logits q kᵀ are a temporary of the weights' op (they were a kept graph node), and the
    result is stored (B, Tq, H, D)-major so that merging the heads, as AttentionLayer does, is
    a view (it was a copy kept beside the result)."""
    b, h, tq, tk, d = 4, 4, 16, 16, 16
    rng = np.random.default_rng(3)
    q, k, v = (
        ndl.Tensor(rng.standard_normal((b, h, t, d)).astype(np.float32), device=device)
        for t in (tq, tk, tk)
    )
    attn = fast.fuse(nn.MultiHeadAttention(causal=True, device=device))
    gc.collect()
    gc.disable()
    try:
        before = _live(device)
        result, probs = attn(q, k, v)
        kept = _live(device) - before
        merged = ndl.ops.transpose(result, (1, 2)).reshape((b * tq, h * d))
        merging = _live(device) - before - kept
    finally:
        gc.enable()
    weights, values = b * h * tq * tk * F32, b * h * tq * d * F32
    assert weights + values <= kept <= weights + values + 1024, kept
    assert merging == 0, merging
    # merged rows are the heads side by side: row (b, t) = result[b, :, t, :] flattened
    np.testing.assert_array_equal(
        merged.numpy().reshape(b, tq, h, d), result.numpy().transpose(0, 2, 1, 3)
    )


@pytest.mark.parametrize("device", COUNTED)
def test_attention_ops_differentiate_twice_like_the_ops_they_replace(device):
    """attention_weights and attention_values against matmul + softmax_last_axis + matmul
    (the composition they replace): values, first and second derivatives."""
    from needle.fast import ops as ops_fused

    rng = np.random.default_rng(4)
    shapes = ((2, 2, 3, 4), (2, 2, 5, 4), (2, 2, 5, 4))
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    w = rng.standard_normal((2, 2, 3, 4)).astype(np.float32)
    scale = 0.5

    def fused_path(q, k, v):
        return ops_fused.attention_values(ops_fused.attention_weights(q, k, scale, True), v)

    def composed(q, k, v):
        logits = ndl.ops.matmul(q, ndl.ops.transpose(k))
        return ndl.ops.matmul(ops_fused.softmax_last_axis(logits, scale, True), v)

    results = []
    for fn in (fused_path, composed):
        ts = [ndl.Tensor(a, device=device) for a in arrays]
        out = fn(*ts)
        (out * ndl.Tensor(w, device=device, requires_grad=False)).sum().backward()
        first = [t.grad for t in ts]
        for t in ts:
            t.grad = None
        sum(((g * g).sum() for g in first[1:]), (first[0] * first[0]).sum()).backward()
        results.append([out.numpy()] + [g.numpy() for g in first] + [t.grad.numpy() for t in ts])
    for got, want in zip(*results):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def _mlp(device, layers: int, width: int):
    rng = np.random.default_rng(5)
    return [
        ndl.Tensor(rng.standard_normal((width, width)).astype(np.float32) / width, device=device)
        for _ in range(layers)
    ]


def _forward(x, weights):
    for w in weights:
        x = ndl.ops.relu(x @ w)
    return (x * x).sum()


@pytest.mark.parametrize("device", COUNTED)
def test_fast_backward_frees_the_graph_as_it_goes(device):
    """backward(create_graph=False) cuts each node from its inputs once it has passed its
    adjoint on, so the activations are freed during the pass although the caller still holds
    the loss: afterwards only the gradients (one per weight) are left. It used to keep every
    activation until the loss was dropped, and the backward pass's own arrays came on top."""
    rows, width, layers = 256, 32, 6
    weights = _mlp(device, layers, width)
    x = ndl.Tensor(np.ones((rows, width), np.float32), device=device, requires_grad=False)
    gc.collect()
    gc.disable()
    try:
        start = _live(device)
        loss = _forward(x, weights)
        activations = _live(device) - start
        device.mod.reset_peak()
        loss.backward(create_graph=False)
        peak = device.mod.memory_stats()["peak_bytes"] - start
        left = _live(device) - start
    finally:
        gc.enable()
    act, grads = rows * width * F32, layers * width * width * F32
    assert activations >= 2 * layers * act  # x @ w and relu(.) per layer
    assert left <= grads + 1024, (left, grads)  # the gradients and the scalar loss
    # the peak is at the pass's first ops, before anything could be freed: every activation
    # and the adjoints of x * x in flight
    assert peak <= activations + grads + 4 * act, (peak, activations)
    assert float(loss.numpy()) > 0  # the loss keeps its value


@pytest.mark.parametrize("device", COUNTED)
def test_freed_graph_keeps_values_and_refuses_a_second_backward(device):
    """After backward(create_graph=False) the tensors the caller holds keep their values; a
    second backward through the freed graph is a RuntimeError saying why (PyTorch's rule)."""
    weights = _mlp(device, 2, 8)
    x = ndl.Tensor(np.ones((4, 8), np.float32), device=device, requires_grad=False)
    hidden = ndl.ops.relu(x @ weights[0])
    out = ndl.ops.relu(hidden @ weights[1])
    loss = (out * out).sum()  # _forward's ops, so that its gradients are the same
    value, hidden_value = loss.numpy(), hidden.numpy()
    loss.backward(create_graph=False)
    grads = [w.grad.numpy() for w in weights]
    np.testing.assert_array_equal(loss.numpy(), value)
    np.testing.assert_array_equal(hidden.numpy(), hidden_value)
    with pytest.raises(RuntimeError, match="freed by an earlier backward"):
        loss.backward(create_graph=False)
    with pytest.raises(RuntimeError, match="create_graph=True"):
        (hidden * 2).sum().backward()
    # a new forward pass works again and gives the same gradients
    for w in weights:
        w.grad = None
    _forward(x, weights).backward(create_graph=False)
    for w, g in zip(weights, grads):
        np.testing.assert_array_equal(w.grad.numpy(), g)
    # the default backward keeps its graph: a second pass through it works
    loss = _forward(x, weights)
    loss.backward()
    loss.backward()


@pytest.mark.parametrize("device", COUNTED)
def test_softmax_loss_fast_backward_overwrites_its_probabilities(device):
    """A backward that records no graph reads softmax_cross_entropy's saved probabilities for
    the last time: the gradient overwrites them in one kernel call, so the pass allocates no
    (N, C) array at all. The default backward keeps them (a second backward works) and both
    give the same gradient."""
    from needle.fast import ops as ops_fused

    rows, cols = 512, 1000
    rng = np.random.default_rng(6)
    z = rng.standard_normal((rows, cols)).astype(np.float32)
    labels = ndl.Tensor(rng.integers(0, cols, rows).astype(np.float32), device=device)
    grads = {}
    for create_graph in (True, False):
        x = ndl.Tensor(z, device=device)
        loss = ops_fused.softmax_cross_entropy(x, labels)
        peak, _ = _peak(device, lambda: loss.backward(create_graph=create_graph))
        grads[create_graph] = x.grad.numpy()
        full = rows * cols * F32
        if create_graph:
            assert full <= peak <= full + SMALL, peak  # the gradient, a new array
            x.grad = None
            loss.backward()  # the graph and the probabilities are kept
        else:  # x.grad is the probabilities' buffer: nothing of the logits' size is new
            assert peak <= SMALL < full, peak
    np.testing.assert_array_equal(grads[True], grads[False])
    e = np.exp(z - z.max(1, keepdims=True))
    want = (e / e.sum(1, keepdims=True) - np.eye(cols)[labels.numpy().astype(int)]) / rows
    np.testing.assert_allclose(grads[False], want, rtol=1e-4, atol=1e-8)


@pytest.mark.parametrize("device", COUNTED)
def test_transformer_feed_forward_keeps_one_array_per_linear(device):
    """TransformerLayer's relu(linear1(y)) and linear2(.) are one op each
    (ops_fused.matmul_add_bias): the graph keeps each result alone, not the product x W, the
    sum with the bias and the ReLU beside it. Values, gradients and second derivatives equal
    those of nn.Linear and nn.ReLU."""
    from needle.fast import ops as ops_fused

    rows, features, hidden = 128, 32, 64
    rng = np.random.default_rng(7)
    linear = nn.Linear(features, hidden, device=device)
    x_np = rng.standard_normal((rows, features)).astype(np.float32)
    x = ndl.Tensor(x_np, device=device)
    gc.collect()
    gc.disable()
    try:
        before = _live(device)
        out = ops_fused.matmul_add_bias(x, linear.weight, linear.bias, relu=True)
        kept = _live(device) - before
    finally:
        gc.enable()
    assert rows * hidden * F32 <= kept <= rows * hidden * F32 + 1024, kept
    w = rng.standard_normal((rows, hidden)).astype(np.float32)
    results = []
    for one_op in (True, False):
        xt = ndl.Tensor(x_np, device=device)
        for p in linear.parameters():
            p.grad = None
        if one_op:
            out = ops_fused.matmul_add_bias(xt, linear.weight, linear.bias, relu=True)
        else:
            out = nn.ReLU()(linear(xt))
        (out * out * ndl.Tensor(w, device=device, requires_grad=False)).sum().backward()
        first = [xt.grad, linear.weight.grad, linear.bias.grad]
        values = [out.numpy()] + [g.numpy() for g in first]
        xt.grad = linear.weight.grad = linear.bias.grad = None
        sum((g * g).sum() for g in first[1:]).backward()  # second derivatives
        values += [xt.grad.numpy(), linear.weight.grad.numpy()]
        results.append(values)
    for got, want in zip(*results):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", COUNTED)
def test_positional_embedding_is_looked_up_once_per_position(device):
    """Transformer adds the positional embedding of each position broadcast over the batch (a
    view), instead of looking it up for every (position, batch) pair: its forward keeps no
    (seq_len, bs, E) array for it. Its gradient is the input's gradient summed over the
    batch (the same positions are added to every batch element)."""
    seq, batch, e = 8, 16, 32
    np.random.seed(8)
    model = nn.Transformer(e, 16, 0, num_head=2, dim_head=4, device=device, sequence_len=8)
    x = ndl.Tensor(np.random.randn(seq, batch, e).astype(np.float32), device=device)
    gc.collect()
    gc.disable()
    try:
        before = _live(device)
        out, zeros = model(x)
        kept = _live(device) - before
    finally:
        gc.enable()
    act = seq * batch * e * F32
    # the sum x + pos and the zero state: two (seq, bs, E) arrays; the positions' rows: small
    assert 2 * act <= kept <= 2 * act + 2 * seq * e * F32 + 1024, kept
    w = np.random.randn(seq, batch, e).astype(np.float32)
    (out * ndl.Tensor(w, device=device, requires_grad=False)).sum().backward()
    np.testing.assert_allclose(
        model.positional_embedding.weight.grad.numpy(), x.grad.numpy().sum(1), rtol=1e-6
    )


@pytest.mark.parametrize("device", COUNTED)
@pytest.mark.parametrize("hold, create_graph", [(False, False), (True, False), (False, True)])
def test_backward_without_graph_frees_a_product_before_its_adjoints(
    device, hold, create_graph, monkeypatch
):
    """needle.fast.backward (a backward that records no graph) drops the array of a node whose
    gradient never reads it (ops.MatMul: Op.gradient_reads_output is False) before computing
    that gradient, when only the pass holds the node: the product's (N, P) array is gone before
    its two adjoints are allocated. A node the caller holds keeps its value; a recording
    backward keeps all."""
    seen = []
    gradient = ndl.ops.MatMul.gradient

    def spy(self, out_grad, node):
        seen.append(node.cached_data is None)
        return gradient(self, out_grad, node)

    monkeypatch.setattr(ndl.ops.MatMul, "gradient", spy)
    rng = np.random.default_rng(8)
    a, b = rng.standard_normal((6, 4)), rng.standard_normal((4, 5))
    x = ndl.Tensor(a, device=device)
    w = ndl.Tensor(b, device=device)
    y = x @ w
    loss = (y * 2.0).sum()
    held = y if hold else None
    del y
    if create_graph:
        loss.backward()
    else:
        fast.backward(loss)
    assert seen == [not hold and not create_graph]
    np.testing.assert_allclose(x.grad.numpy(), 2 * np.ones((6, 5)) @ b.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(w.grad.numpy(), a.T @ (2 * np.ones((6, 5))), rtol=1e-5, atol=1e-5)
    if held is not None:
        np.testing.assert_allclose(held.numpy(), a @ b, rtol=1e-5, atol=1e-5)
