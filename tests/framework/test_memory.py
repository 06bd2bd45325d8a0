"""A training step's graph frees itself by reference counting alone (issue: memory that grows
until the cycle collector runs).

After a default ``backward()`` (the course's semantics) each leaf's gradient is a graph that
refers back to the forward graph and to the leaf: the only reference cycles left, released
when the gradients are reset (``opt.reset_grad()``, ``x.grad = None``). With
``create_graph=False`` gradients are detached constants and no cycle forms at all. Checked with
the cycle collector disabled: the live-Value count (``autograd.TENSOR_COUNTER``) for every op of
the library, and the resident memory of training loops.
"""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest
from conftest import DEVICES
from helpers import rand, tensor
from test_ops import CASES, Case, _inputs

import needle as ndl
from needle import autograd

pytestmark = pytest.mark.autograd

MEMORY_CASES = CASES + [
    Case(
        "conv_strided_padded",
        lambda x, w: ndl.conv(x, w, stride=2, padding=1),
        None,
        lambda rng: [rand((2, 5, 5, 3), rng), rand((3, 3, 3, 4), rng)],
    ),
]


class _NoCycleCollector:
    """Disable Python's cycle collector inside the block (reference counting only)."""

    def __enter__(self):
        gc.collect()
        gc.disable()

    def __exit__(self, *exc):
        gc.enable()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", MEMORY_CASES, ids=[c.id for c in MEMORY_CASES])
def test_graph_is_freed_by_reference_counting(case: Case, device):
    arrays = _inputs(case)
    with _NoCycleCollector():
        inputs = [tensor(a, device) for a in arrays]
        start = autograd.TENSOR_COUNTER
        # default backward: the gradients' graphs hold the forward graph until they are reset
        out = case.fn(*inputs)
        # squaring makes every adjoint depend on forward values (the source of cycles)
        loss = (out * out).sum()
        loss.backward()
        assert None not in [x.grad for x in inputs]
        del out, loss
        for x in inputs:
            x.grad = None
        assert autograd.TENSOR_COUNTER == start
        # create_graph=False: detached gradients, and every interior node goes with the loss
        out = case.fn(*inputs)
        loss = (out * out).sum()
        loss.backward(create_graph=False)
        grads = {id(x.grad): x.grad for x in inputs}
        for g in grads.values():
            assert g.is_leaf() and not g.requires_grad
        del out, loss, g
        # only the leaves' gradients are left: every interior node is gone
        assert autograd.TENSOR_COUNTER == start + len(grads)
        grads.clear()
        for x in inputs:
            x.grad = None
        assert autograd.TENSOR_COUNTER == start


@pytest.mark.parametrize("device", DEVICES)
def test_retained_and_second_order_gradients_are_released_with_the_graph(device):
    """retain_grad() and differentiable gradients keep more, and it all goes once the
    gradients are reset."""
    with _NoCycleCollector():
        x = tensor([0.5, 1.5], device)
        start = autograd.TENSOR_COUNTER
        y = ndl.exp(x)
        y.retain_grad()
        (y * y).sum().backward()
        np.testing.assert_allclose(y.grad.numpy(), 2 * np.exp([0.5, 1.5]), rtol=1e-5)
        # y's gradient graph refers back to y (a cycle, as with PyTorch's create_graph=True)
        y.grad = None
        del y
        x.grad = None
        assert autograd.TENSOR_COUNTER == start
        (ndl.exp(x) * x).sum().backward()
        assert x.grad.requires_grad
        x.grad = None
        assert autograd.TENSOR_COUNTER == start


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _train_mlp_rss(sizes, batch: int, steps: int, check_at: int):
    """Train an MLP of layer ``sizes`` with SGD on random data, cycle collector off.

    Returns (RSS at step ``check_at``, largest RSS after it, live-Value counts per step).
    """
    device = DEVICES[0].values[0]
    rng = np.random.default_rng(0)
    x = ndl.Tensor(
        rng.standard_normal((batch, sizes[0])).astype(np.float32),
        device=device,
        requires_grad=False,
    )
    y = ndl.Tensor(
        rng.integers(0, sizes[-1], batch).astype(np.float32), device=device, requires_grad=False
    )
    layers = []
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(ndl.nn.Linear(n_in, n_out, device=device))
        if i < len(sizes) - 2:
            layers.append(ndl.nn.ReLU())
    model = ndl.nn.Sequential(*layers)
    loss_fn = ndl.nn.SoftmaxLoss()
    opt = ndl.optim.SGD(model.parameters(), lr=0.01)
    base, peak, counts = None, 0, []
    with _NoCycleCollector():
        for step in range(1, steps + 1):
            opt.reset_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            del loss
            counts.append(autograd.TENSOR_COUNTER)
            if step == check_at:
                base = _rss_bytes()
            elif step > check_at:
                peak = max(peak, _rss_bytes())
    return base, peak, counts


pytest_linux = pytest.mark.skipif(
    not os.path.exists("/proc/self/statm"), reason="reads the resident set size from /proc"
)


@pytest_linux
def test_training_memory_stays_flat_short():
    """120 steps of a 256-512-512-10 MLP at batch 64: flat Value count and RSS.

    Before the fix every step's graph (about 1 MiB of activations here) stayed alive until
    the cycle collector ran: 100 MiB over these steps."""
    base, peak, counts = _train_mlp_rss((256, 512, 512, 10), batch=64, steps=120, check_at=20)
    assert len(set(counts[1:])) == 1, f"live Values grow: {counts[:5]} ... {counts[-5:]}"
    assert peak <= 1.15 * base, f"RSS grew from {base / 2**20:.0f} MiB to {peak / 2**20:.0f} MiB"


@pytest_linux
@pytest.mark.slow
def test_training_memory_stays_flat_large():
    """The issue's case: 512-1024-1024-10 MLP, batch 256, 1,000 SGD steps, no gc.collect()."""
    base, peak, counts = _train_mlp_rss((512, 1024, 1024, 10), batch=256, steps=1000, check_at=100)
    assert len(set(counts[1:])) == 1, f"live Values grow: {counts[:5]} ... {counts[-5:]}"
    assert peak <= 1.15 * base, f"RSS grew from {base / 2**20:.0f} MiB to {peak / 2**20:.0f} MiB"
