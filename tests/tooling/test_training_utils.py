"""The training loops' backward: no graph of the gradients with this project's needle, the
course's plain ``backward()`` with a needle whose ``backward`` takes no keywords."""

from __future__ import annotations

import numpy as np

import needle as ndl
from companion.apps.training_utils import backward_for_training


def test_training_backward_records_no_gradient_graph():
    w = ndl.Tensor(np.arange(6, dtype=np.float32).reshape(2, 3), device=ndl.cpu())
    loss = (w * w).sum()
    backward_for_training(loss)
    np.testing.assert_array_equal(w.grad.numpy(), 2 * w.numpy())
    assert not w.grad.requires_grad and w.grad.op is None  # a constant, no graph behind it

    plain = ndl.Tensor(w.numpy(), device=ndl.cpu())
    (plain * plain).sum().backward()  # the course's default: a differentiable gradient
    assert plain.grad.requires_grad


def test_a_backward_without_keywords_gets_the_plain_call():
    calls = []

    class CourseTensor:  # the course's signature: backward(self, out_grad=None)
        def backward(self, out_grad=None):
            calls.append(out_grad)

    backward_for_training(CourseTensor())
    assert calls == [None]
