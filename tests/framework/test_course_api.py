"""The public surface a course user touches, name for name, on both backends.

Each test is named after the course function (or course test) it mirrors and calls it the way
the course's homework code and tests do: the same positional arguments and keywords, numpy
scalars where the course passes them, ``device=``/``dtype=`` where the course passes them. The
oracles are numpy, finite differences (``helpers.check_gradients``) and values derived by hand.
Runs under the default backend and again under ``NEEDLE_BACKEND=np``.
"""

import inspect

import numpy as np
import pytest
from conftest import DEVICES
from helpers import check_gradients, tensor

import needle as ndl
import needle.nn as nn
from companion.apps import mlp_resnet, models, simple_ml
from companion.data import write_idx

pytestmark = pytest.mark.both_backends


def defaults(f) -> dict:
    """{parameter: default} of ``f``'s signature (``inspect.Parameter.empty`` if none)."""
    return {k: p.default for k, p in inspect.signature(f).parameters.items()}


def is_float_pair(result) -> bool:
    return isinstance(result, tuple) and len(result) == 2 and all(type(v) is float for v in result)


# ---- hw0: simple_ml in numpy --------------------------------------------------------------------
@pytest.mark.apps
@pytest.mark.hw0_add
def test_add():
    assert simple_ml.add(5, 6) == 11
    assert simple_ml.add(3.2, 1.5) == 3.2 + 1.5
    np.testing.assert_array_equal(simple_ml.add(np.array([1, 2]), np.array([3, 4])), [4, 6])
    np.testing.assert_array_equal(simple_ml.add(np.array([[1.5], [2.5]]), 1), [[2.5], [3.5]])


def _mnist_files(tmp_path, n=30, rows=28, cols=28, seed=0):
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(n, rows, cols), dtype=np.uint8)
    labels = rng.integers(0, 10, size=n, dtype=np.uint8)
    img = write_idx(tmp_path / "train-images-idx3-ubyte.gz", images)
    lbl = write_idx(tmp_path / "train-labels-idx1-ubyte.gz", labels)
    return str(img), str(lbl), images, labels


@pytest.mark.apps
def test_parse_mnist(tmp_path):
    img, lbl, images, labels = _mnist_files(tmp_path)
    X, y = simple_ml.parse_mnist(img, lbl)
    assert X.dtype == np.float32 and y.dtype == np.uint8
    assert X.shape == (30, 784) and y.shape == (30,)
    np.testing.assert_allclose(X, images.reshape(30, 784) / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(y, labels)


@pytest.mark.apps
def test_softmax_loss():
    Z = np.zeros((50, 10), dtype=np.float32)
    y = np.random.randint(0, 10, size=50).astype(np.uint8)
    loss = simple_ml.softmax_loss(Z, y)
    assert type(loss) is float and loss == pytest.approx(np.log(10), rel=1e-6)
    Z = np.random.randn(50, 10).astype(np.float32)
    by_hand = np.mean([np.log(np.exp(z.astype(np.float64)).sum()) - z[t] for z, t in zip(Z, y)])
    assert simple_ml.softmax_loss(Z, y) == pytest.approx(by_hand, rel=1e-5)


@pytest.mark.apps
def test_softmax_regression_epoch():
    X = np.random.randn(50, 5).astype(np.float32)
    y = np.random.randint(3, size=50).astype(np.uint8)
    theta = np.zeros((5, 3), dtype=np.float32)
    assert simple_ml.softmax_regression_epoch(X, y, theta, lr=1.0, batch=50) is None
    # one full batch from theta = 0: softmax is uniform, so the step is -X^T (1/3 - I_y) / 50
    onehot = np.eye(3)[y]
    np.testing.assert_allclose(
        theta, -X.T.astype(np.float64) @ (1 / 3 - onehot) / 50, rtol=1e-5, atol=1e-6
    )
    theta_cpp = np.zeros((5, 3), dtype=np.float32)
    assert simple_ml.softmax_regression_epoch_cpp(X, y, theta_cpp, lr=1.0, batch=50) is None
    np.testing.assert_allclose(theta_cpp, theta, rtol=1e-5, atol=1e-6)


def _two_layer_problem():
    """X (50, 5), labels y (50,) in 0..2, and the course's scaled-normal W1 (5, 10), W2 (10, 3)."""
    X = np.random.randn(50, 5).astype(np.float32)
    y = np.random.randint(3, size=50).astype(np.uint8)
    W1 = np.random.randn(5, 10).astype(np.float32) / np.sqrt(10)
    W2 = np.random.randn(10, 3).astype(np.float32) / np.sqrt(3)
    return X, y, W1, W2


@pytest.mark.apps
def test_nn_epoch():
    X, y, W1, W2 = _two_layer_problem()
    W1_0, W2_0 = W1.copy(), W2.copy()
    assert simple_ml.nn_epoch(X, y, W1, W2, lr=0.2, batch=50) is None
    # one batch of gradient descent, gradients written out by hand
    Z1 = np.maximum(X @ W1_0, 0)
    S = np.exp(Z1 @ W2_0)
    S /= S.sum(axis=1, keepdims=True)
    G2 = S - np.eye(3)[y]
    G1 = (Z1 > 0) * (G2 @ W2_0.T)
    np.testing.assert_allclose(W1, W1_0 - 0.2 * X.T @ G1 / 50, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(W2, W2_0 - 0.2 * Z1.T @ G2 / 50, rtol=1e-4, atol=1e-6)


@pytest.mark.apps
def test_loss_err():
    h = np.array([[2.0, 1.0, 0.0], [0.0, 0.0, 5.0], [1.0, 3.0, 0.0]], dtype=np.float32)
    y = np.array([0, 1, 1], dtype=np.uint8)
    result = simple_ml.loss_err(h, y)
    assert is_float_pair(result)
    assert result[1] == pytest.approx(1 / 3)
    assert result[0] == pytest.approx(simple_ml.softmax_loss(h, y))
    result_t = simple_ml.loss_err(ndl.Tensor(h), y)  # hw1: logits as a Tensor
    assert is_float_pair(result_t)
    np.testing.assert_allclose(result_t, result, rtol=1e-6)


@pytest.mark.apps
@pytest.mark.parametrize("train", ["train_softmax", "train_nn"])
def test_train_prints_the_course_table(capsys, train):
    X = np.random.randn(120, 6).astype(np.float32)
    y = np.random.randint(3, size=120).astype(np.uint8)
    fn = getattr(simple_ml, train)
    if train == "train_nn":
        fn(X[:100], y[:100], X[100:], y[100:], hidden_dim=8, epochs=2, lr=0.1, batch=25)
    else:
        fn(X[:100], y[:100], X[100:], y[100:], epochs=2, lr=0.1, batch=25)
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "| Epoch | Train Loss | Train Err | Test Loss | Test Err |"
    assert [line.split("|")[1].strip() for line in lines[1:]] == ["0", "1"]


# ---- hw1: Tensor, scalar ops, broadcasting ------------------------------------------------------
SCALAR_OPS = {
    "add_scalar": (ndl.add_scalar, np.add),
    "mul_scalar": (ndl.mul_scalar, np.multiply),
    "divide_scalar": (ndl.divide_scalar, np.divide),
    "power_scalar": (ndl.power_scalar, np.power),
}
SCALARS = {
    "int": lambda: 2,
    "float": lambda: 1.5,
    "np.float32": lambda: np.float32(1.5),
    "np.float64": lambda: np.float64(-0.5),
    "np.int64": lambda: np.int64(3),
    "0-d array": lambda: np.array(2.5),
    "randn(1)": lambda: np.random.randn(1),
    "(1, 1) array": lambda: np.full((1, 1), 0.75),
}


@pytest.mark.autograd
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", list(SCALARS))
@pytest.mark.parametrize("op", list(SCALAR_OPS))
def test_scalar_ops_take_numpy_scalars(op, kind, device):
    """The course's gradient checks pass ``scalar=np.random.randn(1)`` and the like."""
    fn, np_fn = SCALAR_OPS[op]
    scalar = SCALARS[kind]()
    x = np.abs(np.random.randn(5, 4)) + 0.5  # positive, so any power is defined
    out = fn(tensor(x, device), scalar=scalar)
    assert out.shape == (5, 4)
    np.testing.assert_allclose(
        out.numpy(), np_fn(x, float(np.asarray(scalar).item())), rtol=1e-5, atol=1e-6
    )
    check_gradients(lambda a: fn(a, scalar=scalar), x, device=device)


@pytest.mark.autograd
@pytest.mark.parametrize(
    "bad",
    [[1.0, 2.0], np.ones(2), "2", 1 + 2j, None],
    ids=["list", "two-element array", "str", "complex", "None"],
)
@pytest.mark.parametrize("op", list(SCALAR_OPS))
def test_scalar_ops_reject_non_scalars(op, bad):
    with pytest.raises(TypeError):
        SCALAR_OPS[op][0](ndl.Tensor([1.0, 2.0]), scalar=bad)


@pytest.mark.autograd
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "scalar",
    [2, 0.5, np.float32(1.5), np.float64(2.0), np.array([3.0])],
    ids=["int", "float", "np.float32", "np.float64", "(1,) array"],
)
def test_tensor_operators_with_scalars(device, scalar):
    x = np.abs(np.random.randn(3, 4)) + 0.5
    a = tensor(x, device)
    s = float(np.asarray(scalar).item())
    cases = {
        "a + s": (a + scalar, x + s),
        "s + a": (scalar + a, s + x),
        "a * s": (a * scalar, x * s),
        "s * a": (scalar * a, s * x),
        "a - s": (a - scalar, x - s),
        "a / s": (a / scalar, x / s),
        "a ** s": (a**scalar, x**s),
    }
    for name, (got, want) in cases.items():
        assert isinstance(got, ndl.Tensor), name
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6, err_msg=name)


BROADCAST_PAIRS = [
    ((1, 3), (3,)),
    ((2, 3), ()),
    ((2, 3), (2, 1)),
    ((4, 1), (1, 3)),
    ((2, 1, 3), (4, 3)),
    ((3,), (2, 1, 3)),
]
EWISE_OPS = {
    "add": (ndl.add, np.add),
    "multiply": (ndl.multiply, np.multiply),
    "divide": (ndl.divide, np.divide),
    "power": (ndl.power, np.power),
    "subtract": (lambda a, b: a - b, np.subtract),
}


@pytest.mark.autograd
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shapes", BROADCAST_PAIRS, ids=str)
@pytest.mark.parametrize("op", list(EWISE_OPS))
def test_ewise_ops_broadcast_with_gradients_of_each_input_shape(op, shapes, device):
    fn, np_fn = EWISE_OPS[op]
    x = np.abs(np.random.randn(*shapes[0])) + 0.5
    y = np.abs(np.random.randn(*shapes[1])) + 0.5
    a, b = tensor(x, device), tensor(y, device)
    out = fn(a, b)
    np.testing.assert_allclose(out.numpy(), np_fn(x, y), rtol=1e-5, atol=1e-6)
    out.sum().backward()
    assert a.grad.shape == a.shape and b.grad.shape == b.shape
    check_gradients(fn, x, y, device=device)


@pytest.mark.autograd
def test_power():
    """The example from the issue: ``power`` of a (1, 3) and a (3,) tensor."""
    a, b = ndl.Tensor([[1.0, 2.0, 3.0]]), ndl.Tensor(np.ones(3) * 2)
    out = ndl.power(a, b)
    np.testing.assert_allclose(out.numpy(), [[1.0, 4.0, 9.0]])
    out.sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), [[2.0, 4.0, 6.0]], rtol=1e-6)
    np.testing.assert_allclose(b.grad.numpy(), np.log([1.0, 2.0, 3.0]) * [1, 4, 9], rtol=1e-5)


@pytest.mark.autograd
@pytest.mark.parametrize(
    "make",
    [
        lambda: ndl.Tensor([1.0], require_grad=False),
        lambda: ndl.Tensor([1.0], devcie=None),
        lambda: nn.Parameter([1.0], require_grad=False),
        lambda: ndl.init.xavier_uniform(3, 4, require_grad=True),
        lambda: ndl.init.kaiming_uniform(3, 4, devcie=None),
        lambda: ndl.init.rand(2, 3, requires_gard=True),
        lambda: models.LanguageModel(4, 10, 8, seq_model="rnn", nonlinearty="relu"),
    ],
    ids=[
        "Tensor",
        "Tensor-device",
        "Parameter",
        "xavier_uniform",
        "kaiming_uniform",
        "rand",
        "LanguageModel",
    ],
)
def test_unknown_keywords_raise_type_error(make):
    with pytest.raises(TypeError) as info:
        make()
    assert any(
        name in str(info.value)
        for name in ("require_grad", "devcie", "requires_gard", "nonlinearty")
    )


@pytest.mark.autograd
@pytest.mark.parametrize("device", DEVICES)
def test_gradient_check_course_cases(device):
    """The course's hw1 gradient checks, with the keywords it passes."""
    r = np.random.randn
    cases = [
        (lambda a: ndl.summation(a, axes=(1,)), [r(5, 4)]),
        (lambda a: ndl.summation(a, axes=(0, 1)), [r(5, 4)]),
        (lambda a: ndl.summation(a, axes=None), [r(5, 4)]),
        (lambda a: ndl.summation(a, axes=1), [r(5, 4, 3)]),
        (lambda a: ndl.broadcast_to(a, shape=(3, 3)), [r(3, 1)]),
        (lambda a: ndl.broadcast_to(a, shape=(3, 3, 3)), [r(1, 3)]),
        (lambda a: ndl.broadcast_to(a, shape=(3, 3, 3)), [np.array(r())]),
        (lambda a: ndl.reshape(a, shape=(4, 5)), [r(5, 4)]),
        (lambda a: ndl.transpose(a, axes=(1, 2)), [r(3, 5, 4)]),
        (lambda a: ndl.transpose(a), [r(3, 5, 4)]),
        (ndl.matmul, [r(6, 6, 5, 4), r(4, 3)]),
        (ndl.matmul, [r(5, 4), r(6, 6, 4, 3)]),
        (
            lambda a, b, c: ndl.summation((a @ b + c) * (a @ b), axes=None),
            [r(10, 9), r(9, 8), r(10, 8)],
        ),
        (ndl.negate, [r(5, 4)]),
        (lambda a: ndl.logsumexp(a, axes=(0, 2)), [r(3, 4, 5)]),
        (ndl.logsoftmax, [r(3, 5)]),
    ]
    for f, arrays in cases:
        check_gradients(f, *arrays, device=device)


@pytest.mark.autograd
def test_find_topo_sort():
    a1, b1 = ndl.Tensor(np.asarray([[0.88282157]])), ndl.Tensor(np.asarray([[0.90170084]]))
    c1 = 3 * a1 * a1 + 4 * b1 * a1 - a1
    order = ndl.autograd.find_topo_sort([c1])
    assert order[-1] is c1
    seen = set()
    for node in order:  # post-order: every input comes before the node using it
        assert all(id(i) in seen for i in node.inputs)
        seen.add(id(node))
    assert order[0] is a1  # depth-first from the first input of the first op


# ---- hw1: simple_ml with needle ------------------------------------------------------------------
@pytest.mark.apps
def test_softmax_loss_ndl():
    y = np.random.randint(0, 10, size=20)
    y_one_hot = np.zeros((20, 10))
    y_one_hot[np.arange(20), y] = 1
    Z = ndl.Tensor(np.zeros((20, 10)).astype(np.float32))
    loss = simple_ml.softmax_loss(Z, ndl.Tensor(y_one_hot))
    assert isinstance(loss, ndl.Tensor)
    np.testing.assert_allclose(loss.numpy(), np.log(10), rtol=1e-6)


@pytest.mark.apps
def test_nn_epoch_ndl():
    X, y, W1, W2 = _two_layer_problem()
    T1, T2 = simple_ml.nn_epoch(X, y, ndl.Tensor(W1), ndl.Tensor(W2), lr=0.2, batch=25)
    assert isinstance(T1, ndl.Tensor) and isinstance(T2, ndl.Tensor)
    simple_ml.nn_epoch(X, y, W1, W2, lr=0.2, batch=25)  # the numpy version, in place
    np.testing.assert_allclose(T1.numpy(), W1, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(T2.numpy(), W2, rtol=1e-4, atol=1e-5)


# ---- hw2: init, nn, optim, data, mlp_resnet -----------------------------------------------------
@pytest.mark.nn
def test_init_defaults():
    t = ndl.init.rand(2, 3)
    assert t.device == ndl.cpu() and t.dtype == "float32" and not t.requires_grad
    # The course puts Tensor(x) on default_device() = cpu_numpy(), so nn.Linear(3, 4)(Tensor(x))
    # mixes devices and fails there; needle makes Tensor and init meet on one device.
    assert ndl.Tensor([1.0]).device == t.device == nn.Linear(2, 2).weight.device
    assert defaults(ndl.init.randn)["std"] == 1.0 and defaults(ndl.init.rand)["high"] == 1.0
    assert defaults(ndl.init.randb)["p"] == 0.5 and defaults(ndl.init.randb)["dtype"] == "bool"
    assert defaults(ndl.init.kaiming_uniform)["nonlinearity"] == "relu"
    np.random.seed(1)
    w = ndl.init.kaiming_uniform(3, 5)
    np.random.seed(1)
    bound = np.sqrt(2) * np.sqrt(3 / 3)
    np.testing.assert_allclose(w.numpy(), np.random.rand(3, 5) * 2 * bound - bound, rtol=1e-6)


@pytest.mark.nn
@pytest.mark.parametrize("device", DEVICES)
def test_modules_take_device_and_dtype(device):
    kw = dict(device=device, dtype="float32")
    modules = [
        nn.Linear(3, 4, **kw),
        nn.BatchNorm1d(4, **kw),
        nn.LayerNorm1d(4, **kw),
        nn.BatchNorm2d(2, **kw),
        nn.Conv(2, 3, 3, **kw),
        nn.RNNCell(3, 4, **kw),
        nn.RNN(3, 4, **kw),
        nn.LSTMCell(3, 4, **kw),
        nn.LSTM(3, 4, **kw),
        nn.Embedding(5, 3, **kw),
        nn.MultiHeadAttention(**kw),
        nn.AttentionLayer(4, 2, 3, **kw),
        nn.TransformerLayer(4, 2, 3, 8, **kw),
        nn.Transformer(4, 8, 1, num_head=2, dim_head=3, **kw),
    ]
    for m in modules:
        for p in m.parameters():
            assert p.device == device and p.dtype == "float32", type(m).__name__


@pytest.mark.nn
def test_module_defaults():
    lin = nn.Linear(7, 4)
    assert lin.weight.shape == (7, 4) and lin.bias.shape == (1, 4)
    assert isinstance(lin.weight, nn.Parameter)
    bn = nn.BatchNorm1d(4)
    assert (bn.eps, bn.momentum) == (1e-5, 0.1)
    np.testing.assert_array_equal(bn.running_mean.numpy(), np.zeros(4))
    np.testing.assert_array_equal(bn.running_var.numpy(), np.ones(4))
    assert nn.LayerNorm1d(4).eps == 1e-5 and nn.Dropout().p == 0.5
    seq = nn.Sequential(nn.Linear(2, 3), nn.ReLU())
    assert isinstance(seq.modules, tuple) and len(seq.modules) == 2
    assert len(seq.parameters()) == 2 and seq.training
    seq.eval()
    assert not seq.modules[0].training
    conv = nn.Conv(2, 3, 3)
    assert conv.weight.shape == (3, 3, 2, 3)
    x = ndl.Tensor(np.random.randn(1, 2, 5, 5), device=conv.weight.device)
    assert conv(x).shape == (1, 3, 5, 5)  # "same" padding k // 2
    assert defaults(nn.RNN.__init__)["nonlinearity"] == "tanh"
    assert defaults(nn.Transformer.__init__)["num_head"] == 8
    assert defaults(nn.Transformer.__init__)["sequence_len"] == 2048


@pytest.mark.nn
def test_module_and_optimizer_attribute_names():
    """Attributes the course's tests and notebooks read or assign by name."""
    lin = nn.Linear(3, 4)
    assert (lin.in_features, lin.out_features) == (3, 4)
    assert isinstance(nn.Residual(nn.ReLU()).fn, nn.ReLU)
    for name in ("weight", "bias", "running_mean", "running_var"):
        assert isinstance(getattr(nn.BatchNorm1d(3), name), ndl.Tensor), name
    for cell in (nn.RNNCell(2, 3), nn.LSTMCell(2, 3)):
        assert all(
            isinstance(getattr(cell, k), nn.Parameter)
            for k in ("W_ih", "W_hh", "bias_ih", "bias_hh")
        )
    assert nn.RNNCell(2, 3).W_ih.shape == (2, 3) and nn.LSTMCell(2, 3).W_ih.shape == (2, 12)
    assert len(nn.RNN(2, 3, 2).rnn_cells) == 2 and len(nn.LSTM(2, 3, 2).lstm_cells) == 2
    assert nn.Embedding(5, 3).weight.shape == (5, 3)
    w = nn.Parameter(np.ones(2, dtype=np.float32))
    sgd = ndl.optim.SGD([w], lr=0.1, momentum=0.9, weight_decay=0.01)
    assert (sgd.lr, sgd.momentum, sgd.weight_decay) == (0.1, 0.9, 0.01)
    assert sgd.params == [w] and isinstance(sgd.u, dict)
    adam = ndl.optim.Adam([w])
    assert adam.t == 0 and isinstance(adam.m, dict) and isinstance(adam.v, dict)


@pytest.mark.autograd
def test_tensor_methods_and_data_setter():
    x = np.random.randn(2, 3, 4)
    a = ndl.Tensor(x)
    assert a.transpose().shape == (2, 4, 3)  # default: the last two axes
    np.testing.assert_allclose(a.sum(axes=(1,)).numpy(), x.sum(axis=1), rtol=1e-5)
    assert a.reshape((6, 4)).shape == (6, 4) and a.broadcast_to((5, 2, 3, 4)).shape == (5, 2, 3, 4)
    assert repr(a).startswith("needle.Tensor(")
    assert repr(ndl.make_tuple(a, a)).startswith("needle.TensorTuple(")
    assert not a.detach().requires_grad and not a.data.requires_grad
    bias = ndl.Tensor(np.zeros((1, 3), dtype=np.float32))
    bias.data = ndl.Tensor(np.arange(3, dtype=np.float32))  # course code assigns (n,) to (1, n)
    assert bias.shape == (1, 3)
    np.testing.assert_array_equal(bias.numpy(), [[0.0, 1.0, 2.0]])
    with pytest.raises(ValueError):
        bias.data = ndl.Tensor(np.ones(4, dtype=np.float32))


@pytest.mark.sequence
def test_attention_and_transformer_return_pairs():
    q = ndl.Tensor(np.random.randn(2, 3, 4, 5))
    result, probs = nn.MultiHeadAttention(dropout=0.0, causal=False)(q, q, q)
    assert result.shape == (2, 3, 4, 5) and probs.shape == (2, 3, 4, 4)
    np.testing.assert_allclose(probs.numpy().sum(axis=-1), np.ones((2, 3, 4)), rtol=1e-5)
    x = ndl.Tensor(np.random.randn(4, 2, 6))
    out, h = nn.Transformer(6, 8, 2, num_head=2, dim_head=3)(x)
    assert out.shape == (4, 2, 6)
    np.testing.assert_array_equal(h.numpy(), np.zeros((4, 2, 6)))


@pytest.mark.nn
def test_optimizer_defaults():
    assert {k: defaults(ndl.optim.SGD.__init__)[k] for k in ("lr", "momentum", "weight_decay")} == {
        "lr": 0.01,
        "momentum": 0.0,
        "weight_decay": 0.0,
    }
    adam = defaults(ndl.optim.Adam.__init__)
    assert (adam["lr"], adam["beta1"], adam["beta2"], adam["eps"], adam["weight_decay"]) == (
        0.01,
        0.9,
        0.999,
        1e-8,
        0.0,
    )
    w = nn.Parameter(np.ones((2, 2), dtype=np.float32), device=ndl.cpu())
    opt = ndl.optim.SGD([w], lr=0.5, momentum=0.0, weight_decay=0.0)
    (w * w).sum().backward()
    opt.step()
    np.testing.assert_allclose(w.numpy(), np.ones((2, 2)) - 0.5 * 2, rtol=1e-6)
    assert w.dtype == "float32"


@pytest.mark.data
def test_dataloader_ndarray():
    dataset = ndl.data.NDArrayDataset(np.random.rand(100, 10), np.arange(100))
    for batch_size in (1, 10, 33):
        loader = ndl.data.DataLoader(dataset=dataset, batch_size=batch_size, shuffle=False)
        batches = list(loader)
        assert len(batches) == -(-100 // batch_size)
        for i, (bx, by) in enumerate(batches):
            assert isinstance(bx, ndl.Tensor) and isinstance(by, ndl.Tensor)
            want = dataset[i * batch_size : (i + 1) * batch_size]
            np.testing.assert_allclose(bx.numpy(), want[0], rtol=1e-6)
            np.testing.assert_array_equal(by.numpy(), want[1])


@pytest.mark.data
def test_mnist_dataset(tmp_path):
    img, lbl, images, labels = _mnist_files(tmp_path)
    ds = ndl.data.MNISTDataset(img, lbl)
    assert len(ds) == 30
    x, y = ds[4]
    assert x.shape == (784,) and y == labels[4]
    np.testing.assert_allclose(x, images[4].ravel() / 255.0, rtol=1e-6)
    tforms = [ndl.data.RandomCrop(12), ndl.data.RandomFlipHorizontal(0.4)]
    ds_t = ndl.data.MNISTDataset(img, lbl, transforms=tforms)
    assert ds_t[4][0].shape == (784,)
    assert defaults(ndl.data.RandomCrop.__init__)["padding"] == 3
    assert defaults(ndl.data.RandomFlipHorizontal.__init__)["p"] == 0.5


@pytest.mark.apps
def test_mlp_resnet_num_params():
    """The course checks MLPResNet(784, 100)'s size; here it is counted by hand."""
    model = mlp_resnet.MLPResNet(784, 100)
    n_params = sum(int(np.prod(p.shape)) for p in model.parameters())
    linear = lambda i, o: i * o + o  # noqa: E731
    block = linear(100, 50) + 2 * 50 + linear(50, 100) + 2 * 100  # two Linear, two BatchNorm1d
    assert n_params == linear(784, 100) + 3 * block + linear(100, 10)


@pytest.mark.apps
def test_mlp_epoch_and_train_mnist(tmp_path):
    img, lbl, _, _ = _mnist_files(tmp_path, n=60)
    write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", np.zeros((20, 28, 28), np.uint8))
    write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", np.zeros(20, np.uint8))
    ds = ndl.data.MNISTDataset(img, lbl)
    model = mlp_resnet.MLPResNet(784, 16)
    loader = ndl.data.DataLoader(ds, batch_size=20)
    result = mlp_resnet.epoch(loader, model)
    assert is_float_pair(result) and 0.0 <= result[0] <= 1.0
    result = mlp_resnet.epoch(loader, model, ndl.optim.SGD(model.parameters(), lr=0.01))
    assert is_float_pair(result)
    out = mlp_resnet.train_mnist(
        20, 1, ndl.optim.SGD, 0.01, 0.001, 16, data_dir=str(tmp_path), progress=False
    )
    assert isinstance(out, tuple) and len(out) == 4 and all(type(v) is float for v in out)


# ---- hw3: NDArray -------------------------------------------------------------------------------
@pytest.mark.ndarray
@pytest.mark.skipif(ndl.BACKEND == "np", reason="NDArray is the nd backend's array")
def test_ndarray_course_names():
    nd = ndl.backend_ndarray
    a = nd.array(np.arange(6, dtype=np.float32).reshape(2, 3), device=nd.cpu())
    assert isinstance(a, nd.NDArray) and a.shape == (2, 3) and a.device == nd.cpu()
    assert nd.NDArray(np.ones(3), device=nd.cpu()).dtype == "float32"
    np.testing.assert_array_equal(nd.empty((2, 2), device=nd.cpu()).shape, (2, 2))
    np.testing.assert_array_equal(nd.full((2, 2), 3.0, device=nd.cpu()).numpy(), np.full((2, 2), 3))
    b = a.permute((1, 0))
    assert b._handle.ptr() == a._handle.ptr() and b.shape == (3, 2)
    np.testing.assert_array_equal(a.sum(axis=1, keepdims=True).numpy(), [[3], [12]])
    assert str(nd.cpu()) == "cpu()" and str(nd.cuda()) == "cuda()"
    assert nd.all_devices() == [nd.cpu(), nd.cuda(), nd.cpu_numpy()]


# ---- hw4: CIFAR-10, PTB, ResNet9, LanguageModel and their loops ----------------------------------
def _cifar_folder(tmp_path, n=4):
    import pickle

    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {
            b"data": rng.integers(0, 256, size=(n, 3072), dtype=np.uint8),
            b"labels": list(rng.integers(0, 10, size=n)),
            b"batch_label": b"x",
            b"filenames": [b"f.png"] * n,
        }
        batch[b"labels"] = [int(v) for v in batch[b"labels"]]
        with open(tmp_path / name, "wb") as f:
            pickle.dump(batch, f)
    return str(tmp_path)


@pytest.mark.data
def test_cifar10_dataset(tmp_path):
    folder = _cifar_folder(tmp_path)
    train = ndl.data.CIFAR10Dataset(folder, train=True)
    test = ndl.data.CIFAR10Dataset(folder, train=False)
    assert len(train) == 20 and len(test) == 4
    X, y = train[3]
    assert X.shape == (3, 32, 32) and 0.0 <= X.min() and X.max() <= 1.0
    assert defaults(ndl.data.CIFAR10Dataset.__init__)["p"] == 0.5


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.apps
def test_cifar10_loops(tmp_path, device):
    ds = ndl.data.CIFAR10Dataset(_cifar_folder(tmp_path, n=2), train=False)
    loader = ndl.data.DataLoader(dataset=ds, batch_size=2, shuffle=False)
    model = models.ResNet9(device=device, dtype="float32")
    out = model(ndl.Tensor(ds.X, device=device))
    assert out.shape == (2, 10) and out.device == device
    results = [
        simple_ml.epoch_general_cifar10(
            loader, model, loss_fn=nn.SoftmaxLoss(), opt=None, progress=False
        ),
        simple_ml.train_cifar10(
            model,
            loader,
            n_epochs=1,
            optimizer=ndl.optim.Adam,
            lr=0.001,
            weight_decay=0.001,
            loss_fn=nn.SoftmaxLoss,
            progress=False,
        ),
        simple_ml.evaluate_cifar10(model, loader, loss_fn=nn.SoftmaxLoss, progress=False),
    ]
    for r in results:
        assert is_float_pair(r) and 0.0 <= r[0] <= 1.0 and r[1] > 0


@pytest.mark.data
@pytest.mark.parametrize("device", DEVICES)
def test_ptb_dataset(tmp_path, device):
    (tmp_path / "train.txt").write_text("the cat sat\non the mat\nthe end\n")
    (tmp_path / "test.txt").write_text("the cat\n")
    corpus = ndl.data.Corpus(str(tmp_path), max_lines=2)
    assert len(corpus.train) == 8 and len(corpus.dictionary) == 6
    data = ndl.data.batchify(corpus.train, batch_size=2, device=device, dtype="float32")
    assert isinstance(data, np.ndarray) and data.shape == (4, 2)
    X, y = ndl.data.get_batch(data, 0, 2, device=device, dtype="float32")
    assert X.shape == (2, 2) and y.shape == (4,) and X.device == device
    np.testing.assert_array_equal(y.numpy(), data[1:3].reshape(-1))


@pytest.mark.apps
@pytest.mark.parametrize("device", DEVICES)
def test_fused_language_model_logits_are_one_node_with_the_linear_values(device):
    # needle.fast: the output layer runs as one MatMulAddBias (the graph keeps the logits, not
    # the product beside them): the same bits as model.linear, the same gradients.
    import needle.fast

    np.random.seed(4)
    model = models.LanguageModel(8, 12, 10, seq_model="lstm", seq_len=4, device=device)
    X = ndl.Tensor(np.random.randint(0, 12, (4, 2)).astype(np.float32), device=device)
    out, _ = model(X)
    assert type(out.op) is not needle.fast.ops.MatMulAddBias  # the course's Linear
    out, _ = needle.fast.fuse(model)(X)
    assert type(out.op) is needle.fast.ops.MatMulAddBias
    features = out.inputs[0]
    course = model.linear(features.detach())
    np.testing.assert_array_equal(out.numpy(), course.numpy())
    out.sum().backward()
    grads = [p.grad.numpy() for p in model.linear.parameters()]
    for p in model.linear.parameters():
        p.grad = None
    model.linear(features.detach()).sum().backward()
    for got, want in zip(grads, (p.grad.numpy() for p in model.linear.parameters())):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.apps
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seq_model", ["rnn", "lstm", "transformer"])
def test_language_model_and_ptb_loops(device, seq_model):
    data = np.random.randint(0, 12, size=(9, 2)).astype(np.float32)
    model = models.LanguageModel(
        8, 12, 10, num_layers=2, seq_model=seq_model, seq_len=4, device=device
    )
    X, _ = ndl.data.get_batch(data, 0, 4, device=device, dtype="float32")
    out, h = model(X)
    assert out.shape == (4 * 2, 12)
    if seq_model == "rnn":
        assert h.shape == (2, 2, 10)
    elif seq_model == "lstm":
        assert h[0].shape == (2, 2, 10) and h[1].shape == (2, 2, 10)
    results = [
        simple_ml.epoch_general_ptb(
            data,
            model,
            seq_len=4,
            loss_fn=nn.SoftmaxLoss(),
            opt=None,
            clip=None,
            device=device,
            dtype="float32",
            progress=False,
        ),
        simple_ml.train_ptb(
            model,
            data,
            seq_len=4,
            n_epochs=1,
            optimizer=ndl.optim.SGD,
            lr=0.1,
            weight_decay=0.0,
            loss_fn=nn.SoftmaxLoss,
            clip=0.25,
            device=device,
            dtype="float32",
            progress=False,
        ),
        simple_ml.evaluate_ptb(
            model,
            data,
            seq_len=4,
            loss_fn=nn.SoftmaxLoss,
            device=device,
            dtype="float32",
            progress=False,
        ),
    ]
    for r in results:
        assert is_float_pair(r) and 0.0 <= r[0] <= 1.0 and r[1] > 0


@pytest.mark.apps
def test_apps_signatures_follow_the_course():
    """Defaults of the hw2/hw4 app functions, as the course's skeleton declares them."""
    assert {k: v for k, v in defaults(mlp_resnet.train_mnist).items() if k != "progress"} == {
        "batch_size": 100,
        "epochs": 10,
        "optimizer": ndl.optim.Adam,
        "lr": 0.001,
        "weight_decay": 0.001,
        "hidden_dim": 100,
        "data_dir": "data",
    }
    assert defaults(mlp_resnet.MLPResNet)["norm"] is nn.BatchNorm1d
    assert defaults(mlp_resnet.ResidualBlock)["drop_prob"] == 0.1
    t = defaults(simple_ml.train_cifar10)
    assert (t["n_epochs"], t["optimizer"], t["lr"], t["weight_decay"], t["loss_fn"]) == (
        1,
        ndl.optim.Adam,
        0.001,
        0.001,
        nn.SoftmaxLoss,
    )
    p = defaults(simple_ml.train_ptb)
    assert (
        p["seq_len"],
        p["n_epochs"],
        p["optimizer"],
        p["lr"],
        p["weight_decay"],
        p["loss_fn"],
        p["clip"],
        p["device"],
        p["dtype"],
    ) == (40, 1, ndl.optim.SGD, 4.0, 0.0, nn.SoftmaxLoss, None, None, "float32")
    lm = defaults(models.LanguageModel.__init__)
    assert (lm["num_layers"], lm["seq_model"], lm["seq_len"], lm["device"], lm["dtype"]) == (
        1,
        "rnn",
        40,
        None,
        "float32",
    )
    assert (
        defaults(simple_ml.nn_epoch)["lr"] == 0.1 and defaults(simple_ml.nn_epoch)["batch"] == 100
    )
    assert defaults(simple_ml.train_nn)["hidden_dim"] == 500
