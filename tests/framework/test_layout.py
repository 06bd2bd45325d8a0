"""Channels-first models without layout copies: element-wise ops keep a permuted-but-dense
layout, ``permute``/``bias_add`` make one node each, and norm layers take (..., C) directly.

The oracles are numpy (values), the course's own compositions (two transposes, reshape +
broadcast_to + add, reshape around BatchNorm1d), finite differences (gradients) and the device
module's call log (which kernels ran, which arrays were copied).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import DEVICES
from helpers import away_from_zero, check_gradients, rand, tensor

import needle as ndl
import needle.fast  # noqa: F401 (ndl.fast)
from needle import nn

pytestmark = [pytest.mark.both_backends]
ND = ndl.BACKEND == "nd"
ND_DEVICES = DEVICES if ND else []


def _nhwc_memory_nchw_view(shape_nchw, device, seed=0):
    """(numpy values (N, C, H, W), a Tensor of those values laid out NHWC in memory)."""
    x = rand(shape_nchw, np.random.default_rng(seed)).astype(np.float32)
    nhwc = ndl.Tensor(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), device=device)
    return x, ndl.ops.permute(nhwc, (0, 3, 1, 2))


# ---- NDArray.memory_order -------------------------------------------------------------------
@pytest.mark.skipif(not ND, reason="NDArray layouts exist on the nd backend only")
@pytest.mark.parametrize("device", ND_DEVICES)
def test_memory_order_names_the_axis_order_of_dense_views(device):
    a = ndl.NDArray(np.zeros((2, 3, 4, 5), np.float32), device=device)
    assert a.memory_order() == (0, 1, 2, 3)
    view = a.permute((0, 3, 1, 2))
    order = view.memory_order()
    assert order == (0, 2, 3, 1) and view.permute(order).is_compact()
    # size-1 axes have free strides; the order still makes a compact view
    b = ndl.NDArray(np.zeros((2, 1, 1, 5), np.float32), device=device).permute((0, 3, 1, 2))
    assert b.permute(b.memory_order()).is_compact()
    for not_dense in (a[:, 1:], a[1:], a[:, :1].broadcast_to((2, 3, 4, 5))):
        assert not_dense.memory_order() is None


# ---- element-wise ops on permuted views: the course's row-major result ----------------------
ELEMENTWISE = {
    "add": (lambda a, b: a + b, np.add),
    "mul": (lambda a, b: a * b, np.multiply),
    "div": (lambda a, b: a / (b * b + 1), lambda a, b: a / (b * b + 1)),
    "relu": (lambda a, b: ndl.relu(a), lambda a, b: np.maximum(a, 0)),
    "tanh": (lambda a, b: ndl.tanh(a) - b, lambda a, b: np.tanh(a) - b),
    "scalar": (lambda a, b: (a + 1) * 2 - b / 3, lambda a, b: (a + 1) * 2 - b / 3),
    "exp_log": (lambda a, b: ndl.log(ndl.exp(a) + 1), lambda a, b: np.log(np.exp(a) + 1)),
}


@pytest.mark.skipif(not ND, reason="NDArray layouts exist on the nd backend only")
@pytest.mark.parametrize("device", ND_DEVICES)
@pytest.mark.parametrize("name", list(ELEMENTWISE))
def test_elementwise_ops_on_permuted_views_give_row_major_results(device, name):
    ours, theirs = ELEMENTWISE[name]
    x, xv = _nhwc_memory_nchw_view((2, 3, 4, 5), device, seed=1)
    y, yv = _nhwc_memory_nchw_view((2, 3, 4, 5), device, seed=2)
    out = ours(xv, yv)
    assert out.realize_cached_data().is_compact()
    np.testing.assert_allclose(out.numpy(), theirs(x, y), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_gradients_through_permuted_layouts(device):
    """relu(x_nhwc viewed NCHW) * y + x: finite differences through the layout-keeping path."""

    def f(a, b):
        view = ndl.ops.permute(a, (0, 3, 1, 2))
        return ndl.relu(view) * ndl.ops.permute(b, (0, 3, 1, 2)) + view

    rng = np.random.default_rng(4)  # away from relu's kink, where differences are not derivatives
    check_gradients(f, away_from_zero((2, 3, 4, 2), rng), rand((2, 3, 4, 2), rng), device=device)


# ---- permute and bias_add -----------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_permute_equals_the_course_transposes(device):
    x = rand((2, 3, 4, 5), np.random.default_rng(5))
    a = tensor(x, device)
    one = ndl.ops.permute(a, (0, 2, 3, 1))
    two = a.transpose((1, 2)).transpose((2, 3))
    np.testing.assert_array_equal(one.numpy(), two.numpy())
    w = rand(one.shape, np.random.default_rng(6))
    (one * tensor(w, device, requires_grad=False)).sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), w.transpose(0, 3, 1, 2), rtol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("axes", [(0, 1), (0, 0, 1), (0, 1, 3)])
def test_permute_rejects_what_is_not_a_permutation(device, axes):
    a = tensor(np.zeros((2, 3, 4)), device)
    with pytest.raises(ValueError):
        ndl.ops.permute(a, axes)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bias_shape", [(3,), (2, 4), (4, 1), (1, 1, 1, 4), ()])
def test_bias_add_names_a_bias_that_does_not_fit(device, bias_shape):
    x = tensor(np.zeros((2, 4)), device)
    b = tensor(np.zeros(bias_shape), device)
    with pytest.raises(ValueError, match="bias_add: a bias of shape"):
        ndl.ops.bias_add(x, b)


@pytest.mark.parametrize("device", DEVICES)
def test_bias_add_equals_the_course_broadcast(device):
    rng = np.random.default_rng(7)
    x, b = rand((3, 2, 4), rng), rand((1, 4), rng)
    ours = ndl.ops.bias_add(tensor(x, device), tensor(b, device))
    course = tensor(x, device) + tensor(b, device).reshape((1, 1, 4)).broadcast_to((3, 2, 4))
    np.testing.assert_array_equal(ours.numpy(), course.numpy())
    check_gradients(lambda u, v: ndl.ops.bias_add(u, v) ** 2, x, b, device=device)


# ---- norm layers on (..., C) ----------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_batchnorm2d_nhwc_equals_batchnorm1d_on_the_rows(device):
    rng = np.random.default_rng(8)
    x = rand((2, 3, 3, 4), rng)
    # needle.fast's norms take channels-last (..., C) input directly
    bn2 = ndl.fast.fuse(nn.BatchNorm2d(4, device=device))
    bn1 = ndl.fast.fuse(nn.BatchNorm1d(4, device=device))
    a, b = tensor(x, device), tensor(x.reshape(18, 4), device)
    y2, y1 = bn2.forward_nhwc(a), bn1(b)
    np.testing.assert_allclose(y2.numpy().reshape(18, 4), y1.numpy(), rtol=1e-5, atol=1e-6)
    w = tensor(rand((2, 3, 3, 4), rng), device, requires_grad=False)
    (y2 * w).sum().backward()
    (y1 * w.reshape((18, 4))).sum().backward()
    np.testing.assert_allclose(a.grad.numpy().reshape(18, 4), b.grad.numpy(), atol=1e-5)
    np.testing.assert_allclose(bn2.weight.grad.numpy(), bn1.weight.grad.numpy(), rtol=1e-5)
    np.testing.assert_allclose(bn2.running_var.numpy(), bn1.running_var.numpy(), rtol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_layernorm_on_three_axes_matches_finite_differences(device):
    ln = nn.LayerNorm1d(3, device=device)
    x = rand((2, 4, 3), np.random.default_rng(9))
    y = ln(tensor(x, device))
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    np.testing.assert_allclose(y.numpy(), (x - mean) / np.sqrt(var + 1e-5), rtol=1e-4, atol=1e-5)
    check_gradients(lambda a: ln(a) ** 2, x, device=device)


@pytest.mark.skipif(not ND, reason="counts device-module calls of the nd backend")
@pytest.mark.parametrize("device", ND_DEVICES)
def test_unused_batch_statistics_are_not_read_back(device, monkeypatch):
    """needle.fast's BatchNorm1d uses only the normalised output: its backward knows the
    statistics' adjoints are zero without copying them to the host."""
    bn = ndl.fast.fuse(nn.BatchNorm1d(4, device=device))
    x = tensor(rand((5, 4), np.random.default_rng(10)), device)
    y = bn(x)
    reads = []
    monkeypatch.setattr(ndl.NDArray, "numpy", lambda self: reads.append(self.shape))
    (y * y).sum().backward()
    assert reads == []
    monkeypatch.undo()
    # the statistics' terms are still there when a statistic is used downstream
    out = ndl.fast.ops.BatchNormColumns(1e-5)(x, bn.weight, bn.bias)
    x.grad = None
    (out[0].sum() + (out[1] * out[1]).sum()).backward()
    mean_term = 2 * x.numpy().mean(0) / 5
    plain = tensor(x.numpy(), device)
    ndl.fast.ops.BatchNormColumns(1e-5)(plain, bn.weight, bn.bias)[0].sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), plain.grad.numpy() + mean_term, rtol=1e-4, atol=1e-5)
