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
from needle import nn
from needle.backend_ndarray import fused

# The NDArray devices with an allocator counter (the numpy backend's arrays have none).
COUNTED = device_params(("cpu", "cpu_numpy"))
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
    result: three (N, C) arrays, the peak of a language model's step. Now one."""
    rows, cols = 256, 1000
    rng = np.random.default_rng(0)
    logits = ndl.NDArray(rng.standard_normal((rows, cols)).astype(np.float32), device=device)
    labels = ndl.NDArray(rng.integers(0, cols, rows).astype(np.float32), device=device)
    dloss = ndl.NDArray(rng.standard_normal(rows).astype(np.float32), device=device)
    _, probs = fused.softmax_xent(logits, labels)
    fused.softmax_xent_bwd(probs, labels, dloss, 0.5)  # the one-hot's iota row is cached once
    peak, grad = _peak(device, lambda: fused.softmax_xent_bwd(probs, labels, dloss, 0.5))
    result = rows * cols * F32
    assert result <= peak <= result + SMALL, peak
    # the values: (softmax - one_hot) * dloss * scale, against numpy
    p = probs.numpy()
    one_hot = np.eye(cols, dtype=np.float32)[labels.numpy().astype(int)]
    want = (p - one_hot) * (dloss.numpy()[:, None] * np.float32(0.5))
    np.testing.assert_allclose(grad.numpy(), want, rtol=1e-6, atol=1e-7)


def _live(device) -> int:
    return device.mod.memory_stats()["live_bytes"]


@pytest.mark.parametrize("device", COUNTED)
def test_lstm_keeps_no_input_projection_between_forward_and_backward(device):
    """nn.LSTM's input projections X W_ih + b (T, B, 4H) are computed inside the layer op:
    the graph used to keep two such arrays per layer (the product and the sum with the
    biases) until backward. What stays is what the backward reads: per step the gate
    activations (B, 4H), tanh(c) and c (B, H); the outputs (T, B, H); h_T; the stacked h_n,
    c_n."""
    steps, batch, features, hidden = 16, 8, 32, 32
    np.random.seed(0)
    lstm = nn.LSTM(features, hidden, num_layers=1, device=device)
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
    needed = steps * (4 * bh + bh + bh) + steps * bh + bh + 2 * bh
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
    norm = nn.LayerNorm1d(cols, device=device)
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
