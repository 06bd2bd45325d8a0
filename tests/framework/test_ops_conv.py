"""Convolution (hw4): forward against a direct loop, gradients against finite differences.

The oracle is a plain numpy loop over output pixels; gradients are checked by finite
differences for strides 1 and 2 (and 3), kernel sizes 1 to 3 and padding 0 to 2, on
non-square inputs too. The gradient of the gradient is checked as well.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from conftest import DEVICES
from helpers import backend_dtype, check_gradients, numerical_gradients, rand, tensor, tolerances

import needle as ndl
from needle.backend_selection import array_api

pytestmark = [pytest.mark.ops, pytest.mark.conv, pytest.mark.both_backends]


def conv_loop(x: np.ndarray, w: np.ndarray, stride: int, padding: int) -> np.ndarray:
    """By definition: out[n, i, j, o] = Σ_{a,b,c} xpad[n, i·s + a, j·s + b, c] · w[a, b, c, o]."""
    x = np.pad(x, ((0, 0), (padding, padding), (padding, padding), (0, 0)))
    N, H, W, C = x.shape
    KH, KW, _, O = w.shape
    Ho, Wo = (H - KH) // stride + 1, (W - KW) // stride + 1
    out = np.zeros((N, Ho, Wo, O))
    for n, i, j, o in itertools.product(range(N), range(Ho), range(Wo), range(O)):
        patch = x[n, i * stride : i * stride + KH, j * stride : j * stride + KW, :]
        out[n, i, j, o] = np.sum(patch * w[:, :, :, o])
    return out


CONFIGS = [(k, s, p) for k in (1, 2, 3) for s in (1, 2) for p in (0, 1, 2)] + [(3, 3, 1)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("k,stride,padding", CONFIGS)
@pytest.mark.hw4_conv_forward
def test_conv_forward_matches_loop(device, k, stride, padding):
    rng = np.random.default_rng(k * 100 + stride * 10 + padding)
    x, w = rand((2, 6, 5, 3), rng), rand((k, k, 3, 4), rng)
    out = ndl.conv(tensor(x, device), tensor(w, device), stride=stride, padding=padding)
    expected = conv_loop(x.astype(backend_dtype()), w.astype(backend_dtype()), stride, padding)
    assert out.shape == expected.shape
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("k,stride,padding", CONFIGS)
@pytest.mark.hw4_conv_backward
def test_conv_gradient_matches_finite_differences(device, k, stride, padding):
    rng = np.random.default_rng(k * 100 + stride * 10 + padding + 7)
    x, w = rand((2, 5, 4, 2), rng), rand((k, k, 2, 3), rng)
    check_gradients(
        lambda a, b: ndl.conv(a, b, stride=stride, padding=padding), x, w, device=device
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.hw4_conv_forward
def test_conv_defaults_are_the_courses(device):
    """``ndl.conv`` defaults to stride 1 and padding 1; ``Conv()`` to padding 0."""
    rng = np.random.default_rng(3)
    x, w = rand((1, 4, 4, 2), rng), rand((3, 3, 2, 2), rng)
    out = ndl.conv(tensor(x, device), tensor(w, device))
    assert out.shape == (1, 4, 4, 2)
    np.testing.assert_allclose(out.numpy(), conv_loop(x, w, 1, 1), rtol=1e-5, atol=1e-5)
    assert ndl.Conv().stride == 1 and ndl.Conv().padding == 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("stride,padding", [(1, 1), (2, 1), (2, 0), (3, 2)])
def test_conv_second_order(device, stride, padding):
    """Differentiate the input gradient with respect to the weight and the output adjoint.

    L(x, w) = Σ conv(x, w)·R is linear in x, so Σ (dL/dx)·S = Σ conv(S, w)·R exactly: its
    gradient in w is checked against finite differences of that forward expression, and its
    gradient in R is conv(S, w) itself (against the direct loop).
    """
    rng = np.random.default_rng(11 + stride + padding)
    dtype = backend_dtype()
    x, w = rand((2, 5, 5, 2), rng), rand((3, 3, 2, 2), rng)
    xt, wt = tensor(x, device), tensor(w, device)
    out = ndl.conv(xt, wt, stride=stride, padding=padding)
    R = rng.standard_normal(out.shape)
    S = rng.standard_normal(x.shape)
    Rt = tensor(R, device)
    (out * Rt).sum().backward(create_graph=True)
    directional = (xt.grad * tensor(S, device, requires_grad=False)).sum()
    wt.grad, Rt.grad = None, None
    directional.backward()
    tol = tolerances()
    expected = conv_loop(S.astype(dtype), w.astype(dtype), stride, padding)
    np.testing.assert_allclose(
        Rt.grad.numpy(), expected, rtol=tol["rtol"], atol=tol["atol"] * np.abs(expected).max()
    )
    Sd = S.astype(dtype)
    numeric = numerical_gradients(
        lambda wv: ndl.conv(
            tensor(Sd, device, requires_grad=False), wv, stride=stride, padding=padding
        ),
        [w.astype(dtype)],
        device,
        R,
        tol["eps"],
    )[0]
    np.testing.assert_allclose(
        wt.grad.numpy(), numeric, rtol=tol["rtol"], atol=tol["atol"] * np.abs(numeric).max()
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("k,stride,padding", [(3, 1, 1), (3, 2, 1), (2, 2, 0), (3, 3, 1)])
def test_conv_weight_gradient_second_order(device, k, stride, padding):
    """Differentiate the weight gradient with respect to the input and the output adjoint.

    With L = Σ conv(x, w)·R, dL/dw is bilinear in (x, R) and Σ (dL/dw)·V = Σ conv(x, V)·R
    exactly: its gradient in x is checked against finite differences of that forward
    expression, and its gradient in R is conv(x, V) itself (against the direct loop).
    """
    rng = np.random.default_rng(5 * k + stride + padding)
    dtype = backend_dtype()
    x, w = rand((2, 7, 6, 2), rng), rand((k, k, 2, 3), rng)
    xt, wt = tensor(x, device), tensor(w, device)
    out = ndl.conv(xt, wt, stride=stride, padding=padding)
    R = rng.standard_normal(out.shape).astype(dtype)
    V = rng.standard_normal(w.shape).astype(dtype)
    Rt = tensor(R, device)
    (out * Rt).sum().backward(create_graph=True)
    directional = (wt.grad * tensor(V, device, requires_grad=False)).sum()
    xt.grad, Rt.grad = None, None
    directional.backward()
    tol = tolerances()
    numeric = numerical_gradients(
        lambda xv: ndl.conv(
            xv, tensor(V, device, requires_grad=False), stride=stride, padding=padding
        ),
        [x.astype(dtype)],
        device,
        R,
        tol["eps"],
    )[0]
    np.testing.assert_allclose(
        xt.grad.numpy(), numeric, rtol=tol["rtol"], atol=tol["atol"] * np.abs(numeric).max()
    )
    expected = conv_loop(x.astype(dtype), V, stride, padding)
    np.testing.assert_allclose(
        Rt.grad.numpy(), expected, rtol=tol["rtol"], atol=tol["atol"] * np.abs(expected).max()
    )


@pytest.mark.parametrize("device", DEVICES)
def test_conv_weight_gradient_twice_from_one_graph(device):
    """Two backward passes over one graph give the same (finite-difference checked) weight
    gradient: the kernels keep no state between calls."""
    rng = np.random.default_rng(21)
    x, w = rand((2, 6, 5, 3), rng), rand((3, 3, 3, 2), rng)
    xt, wt = tensor(x, device), tensor(w, device)
    out = ndl.conv(xt, wt, stride=2, padding=1)
    R = rng.standard_normal(out.shape).astype(backend_dtype())
    loss = (out * tensor(R, device, requires_grad=False)).sum()
    loss.backward()
    first = wt.grad.numpy()
    wt.grad = None
    loss.backward()
    tol = tolerances()
    numeric = numerical_gradients(
        lambda wv: ndl.conv(
            tensor(x.astype(backend_dtype()), device, requires_grad=False), wv, stride=2, padding=1
        ),
        [w.astype(backend_dtype())],
        device,
        R,
        tol["eps"],
    )[0]
    for grad in (first, wt.grad.numpy()):
        np.testing.assert_allclose(
            grad, numeric, rtol=tol["rtol"], atol=tol["atol"] * np.abs(numeric).max()
        )


CONV_KERNELS = ("conv_fwd", "conv_input_grad", "conv_weight_grad")


def _count_kernel_calls(device, monkeypatch, names) -> dict:
    """Counts of calls to the kernels ``names``: of the device module (NEEDLE_BACKEND=nd,
    through ``device``) or of the numpy kernels (NEEDLE_BACKEND=np)."""
    counts = dict.fromkeys(names, 0)
    if ndl.BACKEND == "nd":
        owner = device
    else:
        from needle.backend_ndarray import numpy_kernels as owner
    for name in names:
        real = getattr(owner, name)

        def counted(*args, _real=real, _name=name):
            counts[_name] += 1
            return _real(*args)

        monkeypatch.setattr(owner, name, counted)
    return counts


@pytest.mark.parametrize("device", DEVICES)
def test_conv_forward_and_gradients_are_one_kernel_call_each(device, monkeypatch):
    """Forward, input gradient and weight gradient each make one call into the device module
    (im2col, col2im and the product are inside it): no matmul, no strided add from Python."""
    others = ("matmul", "matmul_strided", "ewise_setitem") if ndl.BACKEND == "nd" else ()
    counts = _count_kernel_calls(device, monkeypatch, CONV_KERNELS + others)
    rng = np.random.default_rng(4)
    x, w = rng.standard_normal((2, 9, 8, 3)), rng.standard_normal((3, 3, 3, 4))
    xt, wt = tensor(x, device), tensor(w, device)
    out = ndl.conv(xt, wt, stride=2, padding=1)
    assert counts == {**dict.fromkeys(counts, 0), "conv_fwd": 1}
    out.sum().backward()
    assert counts == {**dict.fromkeys(counts, 0), **dict.fromkeys(CONV_KERNELS, 1)}
    np.testing.assert_allclose(out.numpy(), conv_loop(x, w, 2, 1), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_a_one_pixel_input_with_same_padding_is_one_product(device, monkeypatch):
    """ResNet-9's last blocks see 1x1 inputs with 3x3 kernels and padding 1: only the centre
    tap meets the pixel, so forward and both gradients are one matrix product each (im2col
    would multiply the eight other taps by padding); the values are the kernel path's."""
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal((4, 1, 1, 6)), rng.standard_normal((3, 3, 6, 5))
    xt, wt = tensor(x, device), tensor(w, device)
    counts = _count_kernel_calls(device, monkeypatch, CONV_KERNELS)
    out = ndl.conv(xt, wt, stride=1, padding=1)
    out.backward(tensor(rng.standard_normal(out.shape), device, requires_grad=False))
    assert counts == dict.fromkeys(CONV_KERNELS, 0)
    monkeypatch.undo()
    kernel = array_api.conv_fwd(xt.realize_cached_data(), wt.realize_cached_data(), 1, 1)
    np.testing.assert_allclose(out.numpy(), kernel.numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out.numpy(), conv_loop(x, w, 1, 1), rtol=1e-4, atol=1e-4)
    grad = xt.grad.numpy()
    assert grad.shape == x.shape and not np.any(wt.grad.numpy()[[0, 0, 2, 2], [0, 2, 0, 2]])


@pytest.mark.parametrize("device", DEVICES)
def test_conv_input_without_gradient_costs_no_input_gradient(device, monkeypatch):
    """A network's input images need no adjoint: the backward pass skips conv_input_grad."""
    counts = _count_kernel_calls(device, monkeypatch, CONV_KERNELS)
    x = tensor(np.ones((1, 5, 5, 2)), device, requires_grad=False)
    ndl.conv(x, tensor(np.ones((3, 3, 2, 2)), device)).sum().backward()
    assert counts == {"conv_fwd": 1, "conv_input_grad": 0, "conv_weight_grad": 1}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "x_shape, w_shape, stride, padding",
    [
        ((2, 7, 5, 3), (3, 2, 3, 2), 1, 1),  # non-square kernel, odd sizes
        ((1, 9, 7, 2), (2, 3, 2, 3), 2, 2),
        ((2, 6, 6, 4), (1, 1, 4, 3), 2, 0),  # pointwise, strided (windows skip pixels)
        ((1, 5, 5, 2), (1, 1, 2, 2), 1, 0),  # pointwise: the input is its own im2col matrix
        ((1, 4, 6, 1), (4, 6, 1, 2), 1, 0),  # kernel as large as the input: one window
        ((1, 3, 3, 2), (3, 3, 2, 2), 4, 3),  # stride beyond the kernel: padding-only windows
        ((3, 1, 1, 4), (3, 3, 4, 5), 1, 1),  # 1x1 input, "same" padding: the centre tap only
        ((2, 1, 1, 3), (5, 5, 3, 2), 2, 2),  # the same at stride 2, with a 5x5 kernel
    ],
)
def test_conv_odd_geometries_match_loop_and_finite_differences(
    device, x_shape, w_shape, stride, padding
):
    rng = np.random.default_rng(sum(x_shape) + sum(w_shape) + stride)
    x, w = rand(x_shape, rng), rand(w_shape, rng)
    out = ndl.conv(tensor(x, device), tensor(w, device), stride=stride, padding=padding)
    expected = conv_loop(x.astype(backend_dtype()), w.astype(backend_dtype()), stride, padding)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-5)
    check_gradients(
        lambda a, b: ndl.conv(a, b, stride=stride, padding=padding), x, w, device=device
    )


ND_DEVICES = DEVICES if ndl.BACKEND == "nd" else []


@pytest.mark.parametrize("device", ND_DEVICES)
def test_nd_conv_never_round_trips_through_numpy(device, monkeypatch):
    """Forward and backward (strided, padded) run on NDArray calls only."""
    x = tensor(np.random.randn(2, 5, 5, 3), device)
    w = tensor(np.random.randn(3, 3, 3, 2), device)

    def forbidden(self):
        raise AssertionError("conv converted an NDArray to numpy in its hot path")

    monkeypatch.setattr(ndl.NDArray, "numpy", forbidden)
    out = ndl.conv(x, w, stride=2, padding=1)
    out.backward()
    assert isinstance(x.grad.realize_cached_data(), ndl.NDArray)
    assert isinstance(w.grad.realize_cached_data(), ndl.NDArray)


@pytest.mark.parametrize("device", DEVICES)
def test_conv_rejects_bad_shapes(device):
    x = tensor(np.ones((1, 4, 4, 3)), device)
    with pytest.raises(ValueError, match="channels"):
        ndl.conv(x, tensor(np.ones((3, 3, 2, 4)), device))
    with pytest.raises(ValueError, match=r"\(N, H, W, C_in\)"):
        ndl.conv(tensor(np.ones((4, 4, 3)), device), tensor(np.ones((3, 3, 3, 4)), device))
    with pytest.raises(ValueError, match="larger than the padded input"):
        ndl.conv(x, tensor(np.ones((7, 7, 3, 1)), device), padding=1)
    with pytest.raises(ValueError, match="stride"):
        ndl.conv(x, tensor(np.ones((3, 3, 3, 1)), device), stride=0)
