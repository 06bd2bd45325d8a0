"""Activation checkpointing (needle.checkpoint): the same gradients as the plain model, with
fewer arrays kept alive between forward and backward.

Oracle: the un-checkpointed model, run from the same parameters and the same random state.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import backend_dtype

import needle as ndl
import needle.nn as nn
from needle.checkpoint import Checkpoint, checkpoint, checkpoint_sequential, graph_bytes, sqrt_rule

pytestmark = pytest.mark.nn

DEPTH, WIDTH, BATCH = 8, 24, 16


def _layers(seed: int, dropout: float = 0.0):
    """DEPTH blocks Linear-ReLU(-Dropout) and a head; same seed, same parameters."""
    np.random.seed(seed)
    mods = []
    for _ in range(DEPTH):
        mods += [nn.Linear(WIDTH, WIDTH, dtype=backend_dtype()), nn.ReLU()]
        if dropout:
            mods.append(nn.Dropout(dropout))
    mods.append(nn.Linear(WIDTH, 3, dtype=backend_dtype()))
    return mods


def _grads(model, x_np, y_np, seed=7):
    """Loss and gradients (input first, then parameters) of one step of ``model``."""
    x = ndl.Tensor(x_np, dtype=backend_dtype(), requires_grad=True)
    y = ndl.Tensor(y_np, dtype=backend_dtype(), requires_grad=False)
    np.random.seed(seed)  # the dropout masks
    loss = nn.SoftmaxLoss()(model(x), y)
    loss.backward()
    return float(loss.numpy()), [x.grad.numpy()] + [p.grad.numpy() for p in model.parameters()]


@pytest.fixture
def batch():
    rng = np.random.default_rng(0)
    return (
        rng.standard_normal((BATCH, WIDTH)).astype(backend_dtype()),
        rng.integers(0, 3, BATCH).astype(backend_dtype()),
    )


@pytest.mark.parametrize("every", [1, 2, 3, 5, 100])
def test_checkpoint_sequential_gradients_equal_plain(batch, every):
    plain_loss, plain = _grads(nn.Sequential(*_layers(1)), *batch)
    ckpt_loss, ckpt = _grads(checkpoint_sequential(_layers(1), every), *batch)
    assert ckpt_loss == pytest.approx(plain_loss, rel=1e-6)
    assert len(ckpt) == len(plain) == 2 * (DEPTH + 1) + 1
    for a, b in zip(ckpt, plain):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_dropout_masks_are_replayed(batch):
    plain_loss, plain = _grads(nn.Sequential(*_layers(2, dropout=0.3)), *batch)
    ckpt_loss, ckpt = _grads(checkpoint_sequential(_layers(2, dropout=0.3), 2), *batch)
    assert ckpt_loss == pytest.approx(plain_loss, rel=1e-6)
    for a, b in zip(ckpt, plain):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_function_form_and_unused_input_grads(batch):
    np.random.seed(3)
    lin = nn.Linear(WIDTH, WIDTH, dtype=backend_dtype())
    x_np = batch[0]
    x1 = ndl.Tensor(x_np, dtype=backend_dtype())
    (ndl.ops.relu(lin(x1)) ** 2).sum().backward()
    expected = [x1.grad.numpy(), lin.weight.grad.numpy(), lin.bias.grad.numpy()]
    lin.weight.grad = lin.bias.grad = None
    x2 = ndl.Tensor(x_np, dtype=backend_dtype())
    out = checkpoint(lambda t: ndl.ops.relu(lin(t)) ** 2, x2, lin.parameters())
    out.sum().backward()
    for a, b in zip([x2.grad.numpy(), lin.weight.grad.numpy(), lin.bias.grad.numpy()], expected):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    # a parameter that fn does not use gets a zero gradient, not an error
    unused = ndl.Tensor(np.ones((2, 2)), dtype=backend_dtype())
    x3 = ndl.Tensor(x_np, dtype=backend_dtype())
    checkpoint(lambda t: t * 2, x3, [unused]).sum().backward()
    np.testing.assert_array_equal(unused.grad.numpy(), np.zeros((2, 2)))
    np.testing.assert_allclose(x3.grad.numpy(), np.full(x_np.shape, 2.0))


def test_existing_parameter_grads_are_not_clobbered_by_the_recompute(batch):
    """The recompute runs its own backward; the outer backward's result must be what is kept."""
    model = checkpoint_sequential(_layers(4), 3)
    _, first = _grads(model, *batch)
    _, second = _grads(model, *batch)  # .grad already set from the first step
    for a, b in zip(first, second):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8)


def test_checkpointing_keeps_fewer_arrays(batch):
    """Between forward and backward the plain graph holds every activation; the checkpointed
    one holds the segment inputs only (parameters count in both)."""

    def held(model):
        x = ndl.Tensor(batch[0], dtype=backend_dtype())
        out = model(x)
        params = sum(p.numpy().nbytes for p in model.parameters())
        return graph_bytes(out) - params - batch[0].nbytes

    act = BATCH * WIDTH * np.dtype(backend_dtype()).itemsize  # one activation
    plain = held(nn.Sequential(*_layers(5)))
    every1 = held(checkpoint_sequential(_layers(5), 1))
    every4 = held(checkpoint_sequential(_layers(5), 4))
    # plain: per block the Linear's matmul, bias broadcast, sum and the ReLU output
    assert plain >= 3 * DEPTH * act
    # every=1: one output per module (2·DEPTH + 1 modules), nothing inside a module
    assert every1 <= (2 * DEPTH + 1) * act + 3 * 8 * WIDTH
    # every=4: one output per segment of four modules
    assert every4 <= ((2 * DEPTH + 1) // 4 + 1) * act + 3 * 8 * WIDTH
    assert every4 < every1 < plain


def test_second_derivative_through_checkpoint_raises(batch):
    """A plain backward() records the gradient graph (the course's semantics); a checkpoint's
    gradients are exact graph nodes that refuse to be differentiated again."""
    x = ndl.Tensor(batch[0], dtype=backend_dtype())
    block = nn.Sequential(*_layers(6)[:2])
    out = Checkpoint(block)(x).sum()
    out.backward()
    assert x.grad.requires_grad
    y = ndl.Tensor(batch[0], dtype=backend_dtype())
    block(y).sum().backward(create_graph=False)
    np.testing.assert_allclose(x.grad.numpy(), y.grad.numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(NotImplementedError, match="second derivatives through a checkpoint"):
        (x.grad * x.grad).sum().backward()


def test_a_tensor_used_inside_but_not_listed_is_refused_by_name():
    """A parameter used inside and outside the block but missing from params used to get only
    its outside gradient, silently; now backward names it."""
    rng = np.random.default_rng(3)
    w = ndl.Tensor(rng.standard_normal((4, 4)).astype(np.float32), dtype=backend_dtype())
    x = ndl.Tensor(rng.standard_normal((2, 4)).astype(np.float32), dtype=backend_dtype())
    out = checkpoint(lambda t: ndl.relu(t @ w), x, params=[]) @ w
    with pytest.raises(ValueError, match=r"not in params \(shape \(4, 4\)\)"):
        out.sum().backward()
    # listed, it gets the whole gradient: the uses inside and outside the block
    w.grad = x.grad = None
    checkpoint(lambda t: ndl.relu(t @ w), x, params=[w]).__matmul__(w).sum().backward()
    listed = w.grad.numpy()
    w.grad = None
    (ndl.relu(x @ w) @ w).sum().backward()
    np.testing.assert_allclose(listed, w.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_bad_arguments():
    with pytest.raises(TypeError, match="needle Tensor"):
        checkpoint(lambda t: t, np.ones(3))
    with pytest.raises(TypeError, match=r"params\[0\]"):
        checkpoint(lambda t: t, ndl.Tensor(np.ones(3)), [np.ones(3)])
    with pytest.raises(TypeError, match="must return a Tensor"):
        checkpoint(lambda t: 3.0, ndl.Tensor(np.ones(3)))
    with pytest.raises(TypeError, match="wraps a Module"):
        Checkpoint(lambda t: t)
    with pytest.raises(ValueError, match="positive int"):
        checkpoint_sequential(_layers(0), 0)
    with pytest.raises(ValueError, match="no modules"):
        checkpoint_sequential([], 2)
    with pytest.raises(ValueError, match="positive"):
        sqrt_rule(0)
    assert [sqrt_rule(n) for n in (1, 4, 5, 16, 17)] == [1, 2, 3, 4, 5]


def test_another_thread_drawing_random_numbers_does_not_change_the_recomputed_mask():
    """The recomputation used to rewind numpy's global generator to where the forward pass
    started: a draw by another thread in between shifted the block's own draws, so backward
    used another Dropout mask than forward (and the other thread got its numbers twice).
    Oracle: with x = ones, the forward output is nonzero where the forward's mask kept a unit,
    and x.grad is nonzero where the recomputation's mask did: both must agree."""
    import threading
    import time

    drop = nn.Dropout(0.5)

    def block(t):
        time.sleep(0.002)  # work before the draw: the other thread gets to draw meanwhile
        return drop(t)

    stop = threading.Event()

    def other_thread():
        while not stop.is_set():
            np.random.rand(64)

    drawer = threading.Thread(target=other_thread, daemon=True)
    drawer.start()
    try:
        mismatches = 0
        for _ in range(20):
            x = ndl.Tensor(np.ones((8, 32), np.float32), dtype=backend_dtype())
            y = checkpoint(block, x)
            y.sum().backward(create_graph=False)
            forward_mask = y.numpy() != 0
            backward_mask = x.grad.numpy() != 0
            mismatches += int(not np.array_equal(forward_mask, backward_mask))
            np.testing.assert_allclose(x.grad.numpy(), y.numpy())  # both mask / (1 - p)
    finally:
        stop.set()
        drawer.join()
    assert mismatches == 0


def test_the_recomputation_leaves_numpys_generator_where_it_was():
    """Backward takes the block's draws from the forward pass: numpy's generator is neither
    rewound nor advanced by it, so the numbers drawn after backward are the next ones."""
    drop = nn.Dropout(0.5)
    np.random.seed(11)
    x = ndl.Tensor(np.ones((4, 6), np.float32), dtype=backend_dtype(), requires_grad=True)
    y = checkpoint(lambda t: drop(t) * 3.0, x)
    after_forward = np.random.get_state()[1].copy()
    (y * y).sum().backward()
    np.testing.assert_array_equal(np.random.get_state()[1], after_forward)
    # y = 3·2·m·x (Dropout scales by 2): d(sum y²)/dx = 2·y·6·m = 12·y
    np.testing.assert_allclose(x.grad.numpy(), 12.0 * y.numpy())


def test_nested_checkpoints_replay_their_masks():
    """A checkpoint inside a checkpointed block: each recomputation gets the draws its own
    forward pass made (the outer recomputation re-runs the inner forward pass on them)."""
    drop1, drop2 = nn.Dropout(0.5), nn.Dropout(0.5)
    inner = lambda t: drop2(t) * 2.0  # noqa: E731
    outer = lambda t: checkpoint(inner, drop1(t) + 1.0)  # noqa: E731
    x = ndl.Tensor(np.ones((5, 7), np.float32), dtype=backend_dtype(), requires_grad=True)
    y = checkpoint(outer, x)
    y.sum().backward()
    # y = 2·m2·(2·m1·x + 1)·2 (Dropout scales by 1/(1-p) = 2): dy/dx = 8·m1·m2
    ys = y.numpy()
    m2 = ys != 0
    m1 = ys > 4.0 + 1e-3  # 4·m2·(2·m1 + 1) is 4 or 12 where m2 keeps a unit
    np.testing.assert_allclose(x.grad.numpy(), 8.0 * (m1 & m2))


def test_a_recomputation_that_draws_differently_is_refused():
    calls = []

    def block(t):
        calls.append(1)
        return t * ndl.init.rand(*((3, 4) if len(calls) == 1 else (4, 3)), device=t.device)

    x = ndl.Tensor(np.ones((3, 4), np.float32), dtype=backend_dtype(), requires_grad=True)
    with pytest.raises(RuntimeError, match=r"random draw 1 of the recomputation.*\(4, 3\)"):
        checkpoint(block, x).sum().backward()


def _outside_tensor_grads(use_checkpoint, h_first, create_graph):
    """(w.grad, x.grad) of a loss that uses h = w * 2, made outside the block, inside and
    outside it; ``h_first`` puts h before the block's output in the last product."""
    rng = np.random.default_rng(5)
    w = ndl.Tensor(rng.standard_normal((4, 4)).astype(np.float32), dtype=backend_dtype())
    x = ndl.Tensor(rng.standard_normal((3, 4)).astype(np.float32), dtype=backend_dtype())
    w.requires_grad = x.requires_grad = True
    h = w * 2.0
    inside = checkpoint(lambda t: t @ h, x, [w]) if use_checkpoint else x @ h
    loss = ((h @ inside.transpose()) if h_first else (inside @ h)).sum() + (h * h).sum()
    loss.backward(create_graph=create_graph)
    return w.grad.numpy(), x.grad.numpy()


@pytest.mark.parametrize("create_graph", [False, True])
def test_an_outside_tensor_used_inside_the_block_keeps_its_graph(create_graph):
    """A non-leaf made outside the block and used inside it, which the caller's backward
    reaches after the block: the recomputation's own backward pass freed it, and the caller's
    backward then failed, blaming "an earlier backward" although it was the only one.
    Oracle: the same loss without the checkpoint."""
    got = _outside_tensor_grads(True, h_first=True, create_graph=create_graph)
    want = _outside_tensor_grads(False, h_first=True, create_graph=create_graph)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4)


def test_an_outside_tensor_freed_before_the_block_is_refused_saying_what_happened():
    """The caller's fast backward reaches such a tensor before the block and frees it: the
    gradient from inside the block cannot reach w any more. The error used to blame "an
    earlier backward"; it now says what happened and what to do. With create_graph=True the
    gradients are right (oracle: the loss without the checkpoint)."""
    with pytest.raises(RuntimeError, match=r"computed outside the block.*shape \(4, 4\)") as e:
        _outside_tensor_grads(True, h_first=False, create_graph=False)
    assert "earlier backward" not in str(e.value)
    got = _outside_tensor_grads(True, h_first=False, create_graph=True)
    want = _outside_tensor_grads(False, h_first=False, create_graph=True)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4)
