"""needle.nn basic modules against numpy references, and the parameter-discovery policy.

Oracles: float64 numpy re-implementations of each layer; gradients are compared with central
finite differences of those references (for a random weighting w of the output, the gradient
of sum(w * f(x))); RNG-dependent weights are recomputed from the same seeded numpy draws.
"""

import math

import numpy as np
import pytest
from conftest import DEVICES
from helpers import central_difference, float32_tensor

import needle as ndl
import needle.fast  # noqa: F401 (ndl.fast)
from needle import nn

pytestmark = [pytest.mark.nn, pytest.mark.both_backends]

F32 = np.float32


T = float32_tensor
fd_grad = central_difference


def backward_weighted(out, w, device):
    """Backpropagate sum(w * out); returns nothing (grads land on the leaves)."""
    (out * T(w, device, requires_grad=False)).sum().backward()


# ---- Linear ------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.hw2_linear
def test_linear_rng_order_shapes_forward_backward(device):
    np.random.seed(1)
    lin = nn.Linear(4, 3, device=device)
    np.random.seed(1)
    bw = math.sqrt(2) * math.sqrt(3 / 4)
    W = np.random.rand(4, 3) * 2 * bw - bw  # weight first ...
    bb = math.sqrt(2) * math.sqrt(3 / 3)
    b = (np.random.rand(3, 1) * 2 * bb - bb).reshape(1, 3)  # ... then bias (out, 1) reshaped
    assert isinstance(lin.weight, nn.Parameter) and isinstance(lin.bias, nn.Parameter)
    assert lin.weight.shape == (4, 3) and lin.bias.shape == (1, 3)
    assert lin.weight.device == device and lin.bias.device == device
    np.testing.assert_allclose(lin.weight.numpy(), W, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lin.bias.numpy(), b, rtol=1e-5, atol=1e-6)
    assert [id(p) for p in lin.parameters()] == [id(lin.weight), id(lin.bias)]

    X = np.random.randn(5, 4)
    x = T(X, device)
    out = lin(x)
    np.testing.assert_allclose(out.numpy(), X @ W + b, rtol=1e-5, atol=1e-5)
    w = np.random.randn(5, 3)
    backward_weighted(out, w, device)
    np.testing.assert_allclose(lin.weight.grad.numpy(), X.T @ w, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(lin.bias.grad.numpy(), w.sum(0, keepdims=True), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(x.grad.numpy(), w @ W.T, rtol=1e-4, atol=1e-4)


def test_linear_without_bias_draws_once():
    np.random.seed(2)
    lin = nn.Linear(3, 2, bias=False)
    after = np.random.rand()
    np.random.seed(2)
    np.random.rand(3, 2)
    assert np.random.rand() == after
    assert lin.bias is None
    assert len(lin.parameters()) == 1


def test_linear_rejects_wrong_features():
    lin = nn.Linear(3, 2)
    with pytest.raises(ValueError, match="3 features"):
        lin(ndl.Tensor(np.zeros((2, 4), F32), device=ndl.cpu()))


# ---- element-wise modules ----------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "module, f, df",
    [
        (nn.ReLU, lambda x: np.maximum(x, 0), lambda x: (x > 0).astype(float)),
        (nn.Tanh, np.tanh, lambda x: 1 - np.tanh(x) ** 2),
        (nn.Sigmoid, lambda x: 1 / (1 + np.exp(-x)), lambda x: np.exp(-x) / (1 + np.exp(-x)) ** 2),
        (nn.Identity, lambda x: x, lambda x: np.ones_like(x)),
    ],
    ids=["relu", "tanh", "sigmoid", "identity"],
)
@pytest.mark.hw2_relu
def test_elementwise_modules(device, module, f, df):
    X = np.random.randn(3, 4) * 3
    x = T(X, device)
    out = module()(x)
    np.testing.assert_allclose(out.numpy(), f(X), rtol=1e-5, atol=1e-6)
    w = np.random.randn(3, 4)
    backward_weighted(out, w, device)
    np.testing.assert_allclose(x.grad.numpy(), w * df(X), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_sigmoid_is_finite_at_extremes(device):
    x = T([-200.0, -90.0, 0.0, 90.0, 200.0], device)
    out = nn.Sigmoid()(x)
    np.testing.assert_allclose(out.numpy(), [0.0, 0.0, 0.5, 1.0, 1.0], atol=1e-7)
    out.sum().backward()
    g = x.grad.numpy()
    assert np.all(np.isfinite(g))
    np.testing.assert_allclose(g, [0.0, 0.0, 0.25, 0.0, 0.0], atol=1e-7)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.hw2_flatten
def test_flatten(device):
    X = np.random.randn(2, 3, 4, 5)
    x = T(X, device)
    out = nn.Flatten()(x)
    assert out.shape == (2, 60)
    np.testing.assert_array_equal(out.numpy(), X.astype(F32).reshape(2, 60))
    w = np.random.randn(2, 60)
    backward_weighted(out, w, device)
    np.testing.assert_allclose(x.grad.numpy(), w.reshape(X.shape), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.hw2_sequential
@pytest.mark.hw2_residual
def test_sequential_and_residual(device):
    np.random.seed(0)
    l1, l2 = nn.Linear(4, 6, device=device), nn.Linear(6, 4, device=device)
    seq = nn.Sequential(l1, nn.ReLU(), l2)
    assert isinstance(seq.modules, tuple) and seq.modules[0] is l1
    W1, b1 = l1.weight.numpy(), l1.bias.numpy()
    W2, b2 = l2.weight.numpy(), l2.bias.numpy()
    X = np.random.randn(3, 4).astype(F32)
    ref = np.maximum(X @ W1 + b1, 0) @ W2 + b2
    np.testing.assert_allclose(seq(T(X, device)).numpy(), ref, rtol=1e-5, atol=1e-5)
    res = nn.Residual(seq)
    np.testing.assert_allclose(res(T(X, device)).numpy(), ref + X, rtol=1e-5, atol=1e-5)
    assert [id(p) for p in res.parameters()] == [
        id(l1.weight),
        id(l1.bias),
        id(l2.weight),
        id(l2.bias),
    ]
    with pytest.raises(TypeError, match="not a Module"):
        nn.Sequential(l1, lambda x: x)


# ---- SoftmaxLoss --------------------------------------------------------------------------------
def softmax_loss_ref(z, y):
    m = z.max(axis=1, keepdims=True)
    lse = np.log(np.exp(z - m).sum(axis=1)) + m[:, 0]
    return float(np.mean(lse - z[np.arange(len(y)), y]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.hw2_softmax_loss
def test_softmax_loss_value_and_gradient(device):
    Z = np.random.randn(6, 5) * 2
    y = np.array([0, 4, 2, 2, 1, 3])
    z = T(Z, device)
    loss = nn.SoftmaxLoss()(z, ndl.Tensor(y, device=device, requires_grad=False))
    assert loss.shape in ((), (1,))
    np.testing.assert_allclose(float(loss.numpy()), softmax_loss_ref(Z, y), rtol=1e-5)
    loss.backward()
    np.testing.assert_allclose(
        z.grad.numpy(), fd_grad(lambda a: softmax_loss_ref(a, y), Z), rtol=1e-4, atol=1e-5
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.hw2_softmax_loss
def test_softmax_loss_large_logits_are_stable(device):
    Z = np.array([[1000.0, 0.0, -1000.0], [0.0, 1000.0, 1001.0]])
    y = np.array([1, 2])
    loss = nn.SoftmaxLoss()(T(Z, device), ndl.Tensor(y, device=device, requires_grad=False))
    # row 0: lse = 1000, minus z_1 = 0 -> 1000; row 1: lse = 1001 + log(1 + e^-1), minus 1001
    expected = (1000.0 + math.log1p(math.exp(-1))) / 2
    np.testing.assert_allclose(float(loss.numpy()), expected, rtol=1e-5)


def test_softmax_loss_shape_errors():
    z = ndl.Tensor(np.zeros((3, 4), F32), device=ndl.cpu())
    with pytest.raises(ValueError, match="labels"):
        nn.SoftmaxLoss()(z, ndl.Tensor([0.0, 1.0], device=ndl.cpu()))


# ---- normalisation ------------------------------------------------------------------------------
def bn_ref(x, w, b, eps):
    return w * (x - x.mean(0)) / np.sqrt(x.var(0) + eps) + b


def ln_ref(x, w, b, eps):
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return w * (x - mean) / np.sqrt(var + eps) + b


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.hw2_batchnorm
def test_batchnorm1d_train_forward_backward(device):
    bn = nn.BatchNorm1d(3, device=device)
    wv, bv = np.array([0.5, 2.0, -1.0]), np.array([0.1, -0.3, 0.7])
    bn.weight.data = T(wv, device, requires_grad=False)
    bn.bias.data = T(bv, device, requires_grad=False)
    X = np.random.randn(5, 3) * 2 + 1
    x = T(X, device)
    out = bn(x)
    np.testing.assert_allclose(out.numpy(), bn_ref(X, wv, bv, 1e-5), rtol=1e-4, atol=1e-5)
    w = np.random.randn(5, 3)
    backward_weighted(out, w, device)
    loss = lambda f: lambda a: float(np.sum(w * f(a)))
    np.testing.assert_allclose(
        x.grad.numpy(), fd_grad(loss(lambda a: bn_ref(a, wv, bv, 1e-5)), X), rtol=1e-3, atol=1e-4
    )
    np.testing.assert_allclose(
        bn.weight.grad.numpy(),
        fd_grad(loss(lambda a: bn_ref(X, a, bv, 1e-5)), wv),
        rtol=1e-4,
        atol=1e-4,
    )
    np.testing.assert_allclose(bn.bias.grad.numpy(), w.sum(0), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.hw2_batchnorm
def test_batchnorm1d_running_stats_and_eval(device):
    bn = nn.BatchNorm1d(4, momentum=0.2, device=device)
    assert [id(p) for p in bn.parameters()] == [id(bn.weight), id(bn.bias)]
    rm, rv = np.zeros(4), np.ones(4)
    for _ in range(3):
        X = np.random.randn(6, 4) * 3 - 2
        bn(T(X, device))
        rm = 0.8 * rm + 0.2 * X.mean(0)
        rv = 0.8 * rv + 0.2 * X.var(0)  # biased batch variance, as the course
    np.testing.assert_allclose(bn.running_mean.numpy(), rm, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(bn.running_var.numpy(), rv, rtol=1e-5, atol=1e-5)
    assert not bn.running_mean.requires_grad and bn.running_mean.is_leaf()
    bn.eval()
    X = np.random.randn(2, 4)
    np.testing.assert_allclose(
        bn(T(X, device)).numpy(), (X - rm) / np.sqrt(rv + 1e-5), rtol=1e-4, atol=1e-5
    )
    np.testing.assert_allclose(bn.running_mean.numpy(), rm, rtol=1e-5, atol=1e-5)  # unchanged


@pytest.mark.parametrize("device", DEVICES)
def test_batchnorm2d_nchw(device):
    bn = nn.BatchNorm2d(3, device=device)
    X = np.random.randn(2, 3, 4, 5) + np.array([1.0, -2.0, 3.0]).reshape(1, 3, 1, 1)
    x = T(X, device)
    out = bn(x)
    mean = X.mean((0, 2, 3), keepdims=True)
    var = X.var((0, 2, 3), keepdims=True)
    assert out.shape == (2, 3, 4, 5)
    np.testing.assert_allclose(out.numpy(), (X - mean) / np.sqrt(var + 1e-5), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(bn.running_mean.numpy(), 0.1 * mean.ravel(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        bn.running_var.numpy(), 0.9 + 0.1 * var.ravel(), rtol=1e-5, atol=1e-5
    )
    w = np.random.randn(*X.shape)
    backward_weighted(out, w, device)

    def ref(a):
        return (a - a.mean((0, 2, 3), keepdims=True)) / np.sqrt(
            a.var((0, 2, 3), keepdims=True) + 1e-5
        )

    Xs = X[:1, :, :2, :3]  # finite differences on a small slice of the same layer
    xs = T(Xs, device)
    ws = w[:1, :, :2, :3]
    backward_weighted(nn.BatchNorm2d(3, device=device)(xs), ws, device)
    np.testing.assert_allclose(
        xs.grad.numpy(), fd_grad(lambda a: float(np.sum(ws * ref(a))), Xs), rtol=1e-3, atol=1e-3
    )
    bn.eval()
    X2 = np.random.randn(1, 3, 2, 2)
    rm = bn.running_mean.numpy().reshape(1, 3, 1, 1)
    rv = bn.running_var.numpy().reshape(1, 3, 1, 1)
    np.testing.assert_allclose(
        bn(T(X2, device)).numpy(), (X2 - rm) / np.sqrt(rv + 1e-5), rtol=1e-4, atol=1e-5
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.hw2_layernorm
def test_layernorm1d_forward_backward(device):
    ln = nn.LayerNorm1d(4, eps=1e-3, device=device)
    wv, bv = np.array([1.0, 0.5, -2.0, 3.0]), np.array([0.0, 1.0, -1.0, 0.2])
    ln.weight.data = T(wv, device, requires_grad=False)
    ln.bias.data = T(bv, device, requires_grad=False)
    X = np.random.randn(3, 4) * 2
    x = T(X, device)
    out = ln(x)
    np.testing.assert_allclose(out.numpy(), ln_ref(X, wv, bv, 1e-3), rtol=1e-4, atol=1e-5)
    w = np.random.randn(3, 4)
    backward_weighted(out, w, device)
    np.testing.assert_allclose(
        x.grad.numpy(),
        fd_grad(lambda a: float(np.sum(w * ln_ref(a, wv, bv, 1e-3))), X),
        rtol=1e-3,
        atol=1e-4,
    )
    np.testing.assert_allclose(
        ln.weight.grad.numpy(),
        fd_grad(lambda a: float(np.sum(w * ln_ref(X, a, bv, 1e-3))), wv),
        rtol=1e-4,
        atol=1e-4,
    )


@pytest.mark.parametrize("device", DEVICES)
def test_layernorm1d_three_dims(device):
    ln = nn.LayerNorm1d(5, device=device)
    X = np.random.randn(2, 3, 5)
    np.testing.assert_allclose(
        ln(T(X, device)).numpy(), ln_ref(X, 1.0, 0.0, 1e-5), rtol=1e-4, atol=1e-5
    )
    with pytest.raises(ValueError, match="5"):
        ln(T(np.zeros((2, 4)), device))


def test_norm_layers_reject_wrong_features():
    with pytest.raises(ValueError, match="BatchNorm1d"):
        nn.BatchNorm1d(3)(ndl.Tensor(np.zeros((2, 4), F32), device=ndl.cpu()))
    with pytest.raises(ValueError, match="BatchNorm2d"):
        nn.BatchNorm2d(3)(ndl.Tensor(np.zeros((2, 4, 2, 2), F32), device=ndl.cpu()))


@pytest.mark.parametrize("device", DEVICES)
def test_fused_batchnorm_empty_training_batch_leaves_running_statistics(device):
    # an empty batch has no statistics: PyTorch and needle.fast's norm return the empty output
    # and leave the running statistics alone (the course's formula sets them to NaN for good)
    bn1 = ndl.fast.fuse(nn.BatchNorm1d(3, device=device))
    bn2 = ndl.fast.fuse(nn.BatchNorm2d(3, device=device))
    for bn, shape in ((bn1, (4, 3)), (bn2, (2, 3, 2, 2))):
        bn(T(np.random.randn(*shape) + 2, device))
        mean, var = bn.running_mean.numpy(), bn.running_var.numpy()
        empty = (0,) + shape[1:]
        y = bn(T(np.zeros(empty), device))
        assert y.shape == empty
        np.testing.assert_array_equal(bn.running_mean.numpy(), mean)
        np.testing.assert_array_equal(bn.running_var.numpy(), var)
        assert np.all(np.isfinite(mean)) and np.all(np.isfinite(var))


# ---- Dropout ------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.hw2_dropout
def test_dropout_exact_mask_given_seed(device):
    X = np.random.randn(4, 5).astype(F32)
    drop = nn.Dropout(0.3)
    np.random.seed(7)
    out = drop(T(X, device)).numpy()
    np.random.seed(7)
    keep = np.random.rand(4, 5).astype(F32) <= F32(0.7)  # randb(p = 1 - 0.3)
    np.testing.assert_allclose(out, np.where(keep, X / 0.7, 0.0), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.hw2_dropout
def test_dropout_statistics_and_eval(device):
    X = np.ones((200, 100), F32)
    out = nn.Dropout(0.4)(T(X, device)).numpy()
    zero_rate = np.mean(out == 0)
    assert abs(zero_rate - 0.4) < 0.02  # binomial std 0.0035
    assert abs(out.mean() - 1.0) < 0.04  # survivors scaled by 1/(1-p) keep the mean
    assert set(np.unique(out)) <= {0.0, F32(1 / 0.6)}
    drop = nn.Dropout(0.4)
    drop.eval()
    state = np.random.get_state()[1].copy()
    np.testing.assert_array_equal(drop(T(X, device)).numpy(), X)
    assert np.array_equal(np.random.get_state()[1], state)  # eval draws nothing
    with pytest.raises(ValueError, match="p must"):
        nn.Dropout(1.0)


# ---- train / eval and parameter discovery -------------------------------------------------------
class ScaleAdd(nn.Module):
    """f(x; s, b) = x * s + b with scalar parameters."""

    def __init__(self, s=1.0, b=0.0):
        super().__init__()
        self.s = nn.Parameter(np.array([s], F32))
        self.b = nn.Parameter(np.array([b], F32))

    def forward(self, x):
        return x * self.s + self.b


class Holder(nn.Module):
    def __init__(self, **attrs):
        super().__init__()
        for k, v in attrs.items():
            setattr(self, k, v)


def ids(params):
    return [id(p) for p in params]


def test_parameters_two_branches_in_attributes_list_tuple_dict():
    a, b = ScaleAdd(), ScaleAdd()
    expected = [id(a.s), id(a.b), id(b.s), id(b.b)]
    for model in (
        Holder(p0=a, p1=b),
        Holder(parts=[a, b]),
        Holder(parts=(a, b)),
        Holder(parts={"left": a, "right": b}),
    ):
        assert ids(model.parameters()) == expected
    named = dict(Holder(parts={"left": a, "right": b}).named_parameters())
    assert list(named) == ["parts.left.s", "parts.left.b", "parts.right.s", "parts.right.b"]
    assert [n for n, _ in Holder(layers=[a, b]).named_parameters()] == [
        "layers.0.s",
        "layers.0.b",
        "layers.1.s",
        "layers.1.b",
    ]


def test_parameters_nested_containers_and_plain_parameters():
    a, b, c = ScaleAdd(), ScaleAdd(), ScaleAdd()
    loose = nn.Parameter(np.zeros(2, F32))
    plain = ndl.Tensor(np.zeros(2, F32))  # a tensor that is not a Parameter is not collected
    model = Holder(deep={"x": [a, (b, {"y": loose})]}, extra=plain, tail=[[c]])
    assert ids(model.parameters()) == ids([a.s, a.b, b.s, b.b, loose, c.s, c.b])
    assert [n for n, _ in model.named_parameters()] == [
        "deep.x.0.s",
        "deep.x.0.b",
        "deep.x.1.0.s",
        "deep.x.1.0.b",
        "deep.x.1.1.y",
        "tail.0.0.s",
        "tail.0.0.b",
    ]


def test_shared_parameter_and_module_are_listed_once():
    a, b = ScaleAdd(), ScaleAdd()
    b.s = a.s  # tie the scales
    model = Holder(branches=[a, b])
    assert ids(model.parameters()) == [id(a.s), id(a.b), id(b.b)]
    assert [n for n, _ in model.named_parameters()] == [
        "branches.0.s",
        "branches.0.b",
        "branches.1.b",
    ]
    twice = Holder(first=a, again=a, also=[a])
    assert ids(twice.parameters()) == [id(a.s), id(a.b)]


def test_reference_cycle_terminates():
    a = ScaleAdd()
    outer = Holder(child=a)
    a.parent = outer
    assert ids(outer.parameters()) == [id(a.s), id(a.b)]
    outer.eval()
    assert not a.training


def test_set_of_parameters_or_modules_raises():
    with pytest.raises(TypeError, match="set.*stable order"):
        Holder(parts={ScaleAdd(), ScaleAdd()}).parameters()
    with pytest.raises(TypeError, match="parts"):
        Holder(parts=frozenset([(ScaleAdd(),)])).eval()
    # a set of plain values is not a problem
    assert len(Holder(labels={1, 2, 3}, m=ScaleAdd()).parameters()) == 2


def test_train_eval_reach_every_submodule():
    d1, d2, d3, bn = nn.Dropout(0.5), nn.Dropout(0.5), nn.Dropout(0.5), nn.BatchNorm1d(2)
    model = Holder(seq=nn.Sequential(nn.Residual(d1)), by_name={"a": [d2]}, pair=(bn, d3))
    subs = [model, model.seq, model.seq.modules[0], d1, d2, d3, bn]
    assert all(m.training for m in subs)
    assert model.eval() is model
    assert not any(m.training for m in subs)
    model.train()
    assert all(m.training for m in subs)
    x = ndl.Tensor(np.ones((3, 2), F32), device=ndl.cpu())
    model.eval()
    np.testing.assert_array_equal(model.seq(x).numpy(), 2 * np.ones((3, 2)))  # x + dropout(x)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "layers",
    [("linear", "norm", "relu"), ("linear", "norm"), ("norm", "relu"), ("linear", "relu")],
)
@pytest.mark.parametrize("create_graph", [True, False])
def test_fused_sequential_joins_linear_norm_and_relu_with_the_same_bits(
    device, layers, create_graph
):
    # needle.fast.fuse: in training a BatchNorm1d after a Linear (and a ReLU after the norm)
    # run as one BatchNormTrain node: output, every gradient and the running statistics are the
    # bits of the (fused) modules called in turn; in eval mode the modules are called.
    def build():
        np.random.seed(6)
        make = {
            "linear": lambda: nn.Linear(5, 4, device=device),
            "norm": lambda: nn.BatchNorm1d(4 if layers[0] == "linear" else 5, device=device),
            "relu": lambda: nn.ReLU(),
        }
        return ndl.fast.fuse(nn.Sequential(*(make[name]() for name in layers)))

    X = np.random.default_rng(1).standard_normal((6, 5)).astype(F32)

    def run(model, in_turn):
        x = T(X, device)
        out = x
        if in_turn:
            for m in model.modules:
                out = m(out)
        else:
            out = model(x)
        (out * out).sum().backward(create_graph=create_graph)
        norms = [m for m in model.modules if isinstance(m, nn.BatchNorm1d)]
        stats = [a.numpy() for m in norms for a in (m.running_mean, m.running_var)]
        return out, [out.numpy(), x.grad.numpy()] + [
            p.grad.numpy() for p in model.parameters()
        ] + stats

    model = build()
    out = model(T(X, device))
    op = out.op  # (a backward without graph releases it)
    out, joined = run(build(), in_turn=False)
    _, separate = run(build(), in_turn=True)
    for got, want in zip(joined, separate):
        np.testing.assert_array_equal(got, want)
    if "norm" in layers:
        assert type(op) is ndl.fast.ops.BatchNormTrain
        expected_inputs = 4 if layers[0] == "linear" else 3  # (x W, bias, w, b) or (x, w, b)
        assert op.pre_bias == (expected_inputs == 4)
    model = build().eval()
    assert type(model(T(X, device)).op) is not ndl.fast.ops.BatchNormTrain


def test_fused_sequential_calls_a_subclassed_linear():
    class Doubled(nn.Linear):
        def forward(self, X):
            return super().forward(X) * 2.0

    np.random.seed(7)
    model = ndl.fast.fuse(nn.Sequential(Doubled(3, 2), nn.BatchNorm1d(2)))
    x = ndl.Tensor(np.random.randn(4, 3).astype(F32))
    out = model(x)
    np.random.seed(7)
    lin, norm = Doubled(3, 2), ndl.fast.fuse(nn.BatchNorm1d(2))
    np.testing.assert_array_equal(out.numpy(), norm(lin(x)).numpy())
    assert type(out.inputs[0].op) is ndl.ops.MulScalar
