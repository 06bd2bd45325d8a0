"""nn.Conv (hw4) against a direct-loop numpy convolution, with gradients by finite differences."""

import numpy as np
import pytest
from conftest import DEVICES

import needle as ndl
import needle.fast  # noqa: F401 (ndl.fast)

pytestmark = [pytest.mark.conv, pytest.mark.both_backends]


def conv_loop(x, w, b, stride):
    """Reference NCHW convolution in float64 by a loop over output pixels.

    x (N, C, H, W), w (k, k, C, O), b (O,) or None; "same" zero padding k // 2.
    """
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    k, _, _, o = w.shape
    p = k // 2
    n, _, h, wd = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
    ho, wo = (h + 2 * p - k) // stride + 1, (wd + 2 * p - k) // stride + 1
    out = np.zeros((n, o, ho, wo))
    for i in range(ho):
        for j in range(wo):
            patch = xp[:, :, i * stride : i * stride + k, j * stride : j * stride + k]
            for di in range(k):
                for dj in range(k):
                    out[:, :, i, j] += patch[:, :, di, dj] @ w[di, dj]
    if b is not None:
        out += np.asarray(b, np.float64)[None, :, None, None]
    return out


def fd_grad(f, arr, idx_list, eps=1e-3):
    """Central finite differences of scalar f at ``arr`` for each flat index in ``idx_list``."""
    g = []
    for idx in idx_list:
        plus, minus = arr.copy(), arr.copy()
        plus.flat[idx] += eps
        minus.flat[idx] -= eps
        g.append((f(plus) - f(minus)) / (2 * eps))
    return np.array(g)


# (image size s, C_in, C_out, k, stride); the first five are the course's hw4 forward cases
FORWARD_CASES = [
    (4, 8, 16, 3, 1),
    (32, 8, 16, 3, 2),
    (32, 8, 8, 3, 2),
    (32, 16, 8, 3, 1),
    (32, 16, 8, 3, 2),
    (7, 3, 5, 1, 1),
    (7, 3, 5, 1, 2),
    (9, 2, 3, 5, 1),
    (9, 2, 3, 5, 2),
    (6, 4, 2, 2, 1),
    (1, 3, 4, 3, 1),
]


@pytest.mark.parametrize("s,cin,cout,k,stride", FORWARD_CASES)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.hw4_nn_conv
def test_conv_forward_matches_loop(s, cin, cout, k, stride, device):
    np.random.seed(0)
    f = ndl.nn.Conv(cin, cout, k, stride=stride, device=device)
    x = ndl.init.rand(2, cin, s, s, device=device)
    y = f(x)
    expected = conv_loop(x.numpy(), f.weight.numpy(), f.bias.numpy(), stride)
    assert y.shape == expected.shape
    assert y.device == device
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_conv_output_size_same_padding(device):
    # odd k with padding k // 2 gives ceil(H / stride) (course: "same" for stride 1)
    for k, stride, h in [(3, 1, 10), (3, 2, 10), (3, 2, 9), (7, 4, 32), (5, 3, 11)]:
        f = ndl.nn.Conv(2, 3, k, stride=stride, device=device)
        y = f(ndl.init.rand(1, 2, h, h + 1, device=device))
        assert y.shape == (1, 3, -(-h // stride), -(-(h + 1) // stride)), (k, stride, h)


@pytest.mark.parametrize("device", DEVICES)
def test_conv_no_bias(device):
    np.random.seed(1)
    f = ndl.nn.Conv(3, 4, 3, stride=2, bias=False, device=device)
    assert f.bias is None
    assert len(f.parameters()) == 1
    x = ndl.init.randn(2, 3, 5, 5, device=device)
    np.testing.assert_allclose(
        f(x).numpy(), conv_loop(x.numpy(), f.weight.numpy(), None, 2), rtol=1e-4, atol=1e-4
    )


# (batch, image size, C_in, C_out, k, stride)
BACKWARD_CASES = [
    (2, 4, 1, 1, 3, 1),
    (2, 5, 3, 4, 3, 1),
    (2, 5, 3, 4, 3, 2),
    (1, 6, 2, 3, 5, 2),
    (2, 4, 2, 2, 1, 1),
    (1, 6, 2, 2, 1, 2),
    (1, 8, 8, 16, 3, 2),
    (1, 12, 3, 2, 7, 4),
]  # the last: ResNet-9's first layer, smaller


@pytest.mark.parametrize("n,s,cin,cout,k,stride", BACKWARD_CASES)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.hw4_nn_conv
def test_conv_backward_finite_differences(n, s, cin, cout, k, stride, device):
    """d/d(x, weight, bias) of sum(conv(x) * R) against central differences of the loop."""
    np.random.seed(2)
    f = ndl.nn.Conv(cin, cout, k, stride=stride, device=device)
    x_np = np.random.randn(n, cin, s, s).astype(np.float32)
    w_np, b_np = f.weight.numpy(), f.bias.numpy()
    out_shape = conv_loop(x_np, w_np, b_np, stride).shape
    R = np.random.randn(*out_shape)

    x = ndl.Tensor(x_np, device=device, requires_grad=True)
    loss = (f(x) * ndl.Tensor(R.astype(np.float32), device=device)).sum()
    loss.backward()

    rng = np.random.default_rng(0)
    for name, arr, grad, fn in [
        ("x", x_np, x.grad, lambda a: np.sum(conv_loop(a, w_np, b_np, stride) * R)),
        ("weight", w_np, f.weight.grad, lambda a: np.sum(conv_loop(x_np, a, b_np, stride) * R)),
        ("bias", b_np, f.bias.grad, lambda a: np.sum(conv_loop(x_np, w_np, a, stride) * R)),
    ]:
        assert grad.shape == arr.shape, name
        a64 = arr.astype(np.float64)
        idx = np.arange(a64.size) if a64.size <= 64 else rng.choice(a64.size, 40, replace=False)
        expected = fd_grad(fn, a64, idx)
        np.testing.assert_allclose(
            grad.numpy().reshape(-1)[idx],
            expected,
            rtol=1e-3,
            atol=1e-3,
            err_msg=f"gradient of {name}",
        )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.hw4_nn_conv
def test_conv_init_draws_weight_then_bias(device):
    cin, cout, k = 3, 5, 3
    np.random.seed(7)
    f = ndl.nn.Conv(cin, cout, k, device=device)
    np.random.seed(7)
    wb = np.sqrt(2) * np.sqrt(3 / (cin * k * k))  # kaiming_uniform bound, fan_in = C_in·k²
    w = np.random.rand(k, k, cin, cout) * 2 * wb - wb
    bb = 1 / np.sqrt(cin * k * k)
    b = np.random.rand(cout) * 2 * bb - bb
    assert f.weight.shape == (k, k, cin, cout) and f.bias.shape == (cout,)
    np.testing.assert_allclose(f.weight.numpy(), w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(f.bias.numpy(), b, rtol=1e-5, atol=1e-6)
    assert [p.shape for p in f.parameters()] == [(k, k, cin, cout), (cout,)]
    assert f.weight.device == device and f.weight.dtype == "float32"


def test_conv_rejects_bad_arguments():
    with pytest.raises(ValueError, match="in_channels"):
        ndl.nn.Conv(0, 4, 3)
    with pytest.raises(ValueError, match="kernel_size"):
        ndl.nn.Conv(3, 4, -1)
    with pytest.raises(ValueError, match="stride"):
        ndl.nn.Conv(3, 4, 3, stride=0)
    with pytest.raises(ValueError, match="square"):
        ndl.nn.Conv(3, 4, (3, 5))


@pytest.mark.parametrize("device", DEVICES)
def test_conv_rejects_wrong_input_shape(device):
    f = ndl.nn.Conv(3, 4, 3, device=device)
    with pytest.raises(ValueError, match=r"\(N, 3, H, W\).*\(2, 4, 5, 5\)"):
        f(ndl.init.rand(2, 4, 5, 5, device=device))
    with pytest.raises(ValueError, match="expects input"):
        f(ndl.init.rand(3, 5, 5, device=device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("stride", [1, 2])
def test_conv_forward_nhwc_is_forward_channels_last(stride, device):
    """forward_nhwc on (N, H, W, C) equals the direct loop's NCHW output moved channels-last."""
    np.random.seed(4)
    f = ndl.nn.Conv(3, 5, 3, stride=stride, device=device)
    x = np.random.randn(2, 3, 7, 6).astype(np.float32)
    out = f.forward_nhwc(ndl.Tensor(x.transpose(0, 2, 3, 1), device=device))
    expected = conv_loop(x, f.weight.numpy(), f.bias.numpy(), stride).transpose(0, 2, 3, 1)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match=r"\(N, H, W, 3\).*\(2, 7, 6, 4\)"):
        f.forward_nhwc(ndl.init.rand(2, 7, 6, 4, device=device))


@pytest.mark.parametrize("device", DEVICES)
def test_batchnorm2d_forward_nhwc_normalises_each_channel(device):
    """forward_nhwc on (N, H, W, C): per-channel batch statistics (numpy), affine parameters
    applied, and the same values as forward on the NCHW layout."""
    np.random.seed(5)
    bn = ndl.fast.fuse(ndl.nn.BatchNorm2d(3, device=device))  # the fused twin takes NHWC
    bn.weight.data = ndl.Tensor(np.array([1.0, 2.0, 0.5], np.float32), device=device)
    bn.bias.data = ndl.Tensor(np.array([0.0, -1.0, 3.0], np.float32), device=device)
    x = np.random.randn(2, 4, 5, 3).astype(np.float32)
    out = bn.forward_nhwc(ndl.Tensor(x, device=device)).numpy()
    x64 = x.astype(np.float64)
    mean, var = x64.mean(axis=(0, 1, 2)), x64.var(axis=(0, 1, 2))
    expected = (x64 - mean) / np.sqrt(var + bn.eps) * [1.0, 2.0, 0.5] + [0.0, -1.0, 3.0]
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)
    nchw = bn(ndl.Tensor(x.transpose(0, 3, 1, 2), device=device)).numpy()
    np.testing.assert_allclose(nchw.transpose(0, 2, 3, 1), expected, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match=r"\(N, H, W, 3\)"):
        bn.forward_nhwc(ndl.init.rand(2, 3, 4, 5, device=device))
