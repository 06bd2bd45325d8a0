"""Numerical policy (issue 3, point 4): stable logsumexp/logsoftmax, infinities and NaN.

Expected values are worked out by hand in each docstring (log-sum-exp of a row whose max is M
is M + log Σ exp(z - M)).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import DEVICES
from helpers import tensor

import needle as ndl

pytestmark = [pytest.mark.ops, pytest.mark.both_backends]

INF = np.inf


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.hw2_logsumexp
def test_logsumexp_subtracts_the_max_row_by_row(device):
    """Row 0 holds ±1e10; row 1 is small. A global max (1e10) would underflow row 1 to -inf.

    lse(row 0) = 1e10 (the other terms are exp(-1e10) = 0);
    lse(row 1) = log(e⁻⁵ + 1 + e³).
    """
    z = tensor([[1e10, 0.0, -1e10], [-5.0, 0.0, 3.0]], device)
    out = ndl.logsumexp(z, (1,)).numpy()
    np.testing.assert_allclose(out, [1e10, np.log(np.exp(-5) + 1 + np.exp(3))], rtol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.hw2_logsumexp
def test_logsumexp_of_equal_huge_logits(device):
    """lse(-1e10, -1e10) = -1e10 + log 2 (= -1e10 at float32 precision): finite."""
    out = ndl.logsumexp(tensor([[-1e10, -1e10], [1e10, 1e10]], device), (1,)).numpy()
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, [-1e10 + np.log(2), 1e10 + np.log(2)], rtol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_logsumexp_infinities_and_nan(device):
    """All -inf -> -inf (not NaN); a +inf entry -> +inf; NaN propagates; other rows unaffected."""
    z = tensor([[-INF, -INF, -INF], [0.0, INF, 1.0], [0.0, np.nan, 1.0], [0.0, 0.0, -INF]], device)
    out = ndl.logsumexp(z, (1,)).numpy()
    assert out[0] == -INF
    assert out[1] == INF
    assert np.isnan(out[2])
    np.testing.assert_allclose(out[3], np.log(2.0), rtol=1e-6)
    assert ndl.logsumexp(tensor([[-INF, -INF]], device)).numpy() == -INF


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.hw2_logsumexp
def test_logsumexp_gradient_is_finite_for_huge_logits(device):
    """The gradient is softmax: (1, 0, 0) for row 0 and a proper distribution for row 1."""
    zv = np.array([[1e10, 0.0, -1e10], [1e10, 1e10, 0.0]])
    z = tensor(zv, device)
    ndl.logsumexp(z, (1,)).sum().backward()
    g = z.grad.numpy()
    assert np.all(np.isfinite(g))
    np.testing.assert_allclose(g, [[1.0, 0.0, 0.0], [0.5, 0.5, 0.0]], atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_logsumexp_gradient_with_masked_entries(device):
    """-inf entries (masking) get gradient 0; the others get the softmax of the finite ones."""
    z = tensor([[0.0, -INF, np.log(3.0)]], device)
    ndl.logsumexp(z, (1,)).sum().backward()
    np.testing.assert_allclose(z.grad.numpy(), [[0.25, 0.0, 0.75]], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("device", DEVICES)
def test_logsoftmax_huge_logits(device):
    """logsoftmax(1e10, 0, -1e10) = (0, -1e10, -2e10); row 2 is the ordinary small case."""
    zv = np.array([[1e10, 0.0, -1e10], [1.0, 2.0, 3.0]])
    out = ndl.logsoftmax(tensor(zv, device)).numpy()
    expected_row2 = np.array([1.0, 2.0, 3.0]) - np.log(np.exp([1.0, 2.0, 3.0]).sum())
    np.testing.assert_allclose(out[0], [0.0, -1e10, -2e10], rtol=1e-6)
    np.testing.assert_allclose(out[1], expected_row2, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_logsoftmax_gradient_finite_and_rows_independent(device):
    """Gradient of Σ logsoftmax(z)·v: v - softmax(z)·Σv, finite for huge logits."""
    zv = np.array([[1e10, 0.0, -1e10], [0.5, -0.5, 0.0]])
    v = np.array([[1.0, 2.0, 3.0], [-1.0, 0.0, 1.0]])
    z = tensor(zv, device)
    ndl.logsoftmax(z).backward(tensor(v, device, requires_grad=False))
    p = np.array([[1.0, 0.0, 0.0], np.exp(zv[1]) / np.exp(zv[1]).sum()])
    expected = v - p * v.sum(1, keepdims=True)
    g = z.grad.numpy()
    assert np.all(np.isfinite(g))
    np.testing.assert_allclose(g, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_logsoftmax_infinities(device):
    """-inf logits give -inf log-probabilities; a row of all -inf is NaN (0/0, like PyTorch)."""
    out = ndl.logsoftmax(tensor([[0.0, -INF, 0.0], [-INF, -INF, -INF]], device)).numpy()
    np.testing.assert_allclose(out[0], [-np.log(2), -INF, -np.log(2)], rtol=1e-6)
    assert np.all(np.isnan(out[1]))


@pytest.mark.parametrize("device", DEVICES)
def test_nan_propagates_through_elementwise_ops(device):
    x = tensor([np.nan, 1.0], device)
    for out in (ndl.exp(x), x * 2.0, ndl.tanh(x), x + x, ndl.logsoftmax(ndl.reshape(x, (1, 2)))):
        assert np.isnan(out.numpy().ravel()[0])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.hw1_relu_backward
def test_relu_derivative_is_zero_at_zero(device):
    x = tensor([-1.0, 0.0, 2.0], device)
    ndl.relu(x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [0.0, 0.0, 1.0])


@pytest.mark.parametrize("device", DEVICES)
def test_full_summation_is_zero_dimensional(device):
    """Summing every axis gives shape () on both backends, and backward from it works."""
    x = tensor(np.ones((2, 3)), device)
    s = ndl.summation(x)
    assert s.shape == () and float(s.numpy()) == 6.0
    s.backward()
    np.testing.assert_allclose(x.grad.numpy(), np.ones((2, 3)))


@pytest.mark.parametrize("device", DEVICES)
def test_fractional_powers(device):
    """x^0.5 and x^-0.5 at x = 4: 2 and 0.5; derivatives 0.25 and -1/16."""
    x = tensor([4.0], device)
    (x**0.5 + x**-0.5).backward()
    np.testing.assert_allclose((x**0.5).numpy(), [2.0])
    np.testing.assert_allclose(x.grad.numpy(), [0.25 - 1 / 16], rtol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_logsumexp_over_an_empty_axis_is_minus_infinity(device):
    """numpy/PyTorch: log Σ over no terms = log 0 = -inf; the gradient is empty."""
    z = tensor(np.zeros((3, 0)), device)
    out = ndl.logsumexp(z, axes=(1,))
    assert out.shape == (3,)
    np.testing.assert_array_equal(out.numpy(), np.full(3, -np.inf))
    with np.errstate(divide="ignore"):
        expected = np.log(np.exp(np.zeros((3, 0))).sum(axis=1))
    np.testing.assert_array_equal(out.numpy(), expected)
    ndl.logsumexp(tensor(np.zeros((0, 2)), device), axes=(0,)).sum().backward()


@pytest.mark.parametrize("device", DEVICES)
def test_logsoftmax_of_empty_rows_is_empty(device):
    z = tensor(np.zeros((3, 0)), device)
    out = ndl.logsoftmax(z)
    assert out.shape == (3, 0) and out.numpy().size == 0
    out.sum().backward()
    assert z.grad.shape == (3, 0)
