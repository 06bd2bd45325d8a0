"""needle.optim against a numpy re-implementation of the course's update rules.

The objective is L(θ) = Σ ½·a·θ² + c·θ (element-wise a, c), whose gradient a·θ + c the
numpy reference evaluates by hand; needle gets the same gradient from autograd. Several steps are
compared, so momentum, weight decay and Adam's bias correction all enter.
"""

import gc

import numpy as np
import pytest
from conftest import DEVICES

import needle as ndl
from needle import nn, optim

pytestmark = [pytest.mark.nn, pytest.mark.both_backends]

F32 = np.float32


class Quadratic(nn.Module):
    """L(θ) = Σ ½·a·θ² + c·θ over two parameters of different shapes."""

    def __init__(self, device):
        super().__init__()
        rng = np.random.default_rng(0)
        self.a = [rng.uniform(0.5, 2.0, s).astype(F32) for s in ((3, 2), (1, 4))]
        self.c = [rng.normal(size=s).astype(F32) for s in ((3, 2), (1, 4))]
        self.theta = [
            nn.Parameter(rng.normal(size=s).astype(F32), device=device) for s in ((3, 2), (1, 4))
        ]
        self.device = device

    def loss(self):
        total = None
        for th, a, c in zip(self.theta, self.a, self.c):
            A = ndl.Tensor(a, device=self.device, requires_grad=False)
            C = ndl.Tensor(c, device=self.device, requires_grad=False)
            term = (A * th * th * 0.5 + C * th).sum()
            total = term if total is None else total + term
        return total


def np_grad(thetas, model):
    return [a * th + c for th, a, c in zip(thetas, model.a, model.c)]


def run(opt_cls, kwargs, device, steps=5):
    model = Quadratic(device)
    opt = opt_cls(model.parameters(), **kwargs)
    start = [p.numpy().copy() for p in model.parameters()]
    for _ in range(steps):
        opt.reset_grad()
        model.loss().backward()
        opt.step()
    return model, start


def sgd_reference(thetas, model, lr, momentum, wd, steps):
    thetas = [t.astype(np.float64) for t in thetas]
    u = [np.zeros_like(t) for t in thetas]
    for _ in range(steps):
        grads = np_grad(thetas, model)
        for i, g in enumerate(grads):
            g = g + wd * thetas[i]
            u[i] = momentum * u[i] + (1 - momentum) * g
            thetas[i] = thetas[i] - lr * u[i]
    return thetas


def adam_reference(thetas, model, lr, b1, b2, eps, wd, steps):
    thetas = [t.astype(np.float64) for t in thetas]
    m = [np.zeros_like(t) for t in thetas]
    v = [np.zeros_like(t) for t in thetas]
    for t in range(1, steps + 1):
        grads = np_grad(thetas, model)
        for i, g in enumerate(grads):
            g = g + wd * thetas[i]
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g**2
            m_hat = m[i] / (1 - b1**t)
            v_hat = v[i] / (1 - b2**t)
            thetas[i] = thetas[i] - lr * m_hat / (np.sqrt(v_hat) + eps)
    return thetas


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "kwargs",
    [
        dict(lr=0.1),
        dict(lr=0.1, momentum=0.9),
        dict(lr=0.05, weight_decay=0.2),
        dict(lr=0.1, momentum=0.5, weight_decay=0.01),
    ],
    ids=["plain", "momentum", "wd", "momentum-wd"],
)
@pytest.mark.hw2_sgd
def test_sgd_matches_reference(device, kwargs):
    model, start = run(optim.SGD, kwargs, device, steps=6)
    ref = sgd_reference(
        start, model, kwargs["lr"], kwargs.get("momentum", 0.0), kwargs.get("weight_decay", 0.0), 6
    )
    for p, r in zip(model.parameters(), ref):
        assert p.dtype == "float32" and p.numpy().dtype == np.float32
        np.testing.assert_allclose(p.numpy(), r, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_sgd_without_momentum_keeps_no_state(device):
    # θ -= lr·(g + wd·θ) needs no u: none is kept (the memory of a parameter copy), and a
    # momentum raised later starts u from 0 as at construction.
    model = Quadratic(device)
    params = model.parameters()
    opt = optim.SGD(params, lr=0.1, weight_decay=0.1)
    start = [p.numpy().copy() for p in params]
    for _ in range(3):
        opt.reset_grad()
        model.loss().backward()
        opt.step()
    assert opt.u == {}
    for p, r in zip(params, sgd_reference(start, model, 0.1, 0.0, 0.1, 3)):
        np.testing.assert_allclose(p.numpy(), r, rtol=1e-5, atol=1e-5)
    opt.momentum = 0.5
    before = [p.numpy().astype(np.float64) for p in params]
    opt.reset_grad()
    model.loss().backward()
    opt.step()
    assert sorted(opt.u) == [0, 1]
    for p, r in zip(params, sgd_reference(before, model, 0.1, 0.5, 0.1, 1)):
        np.testing.assert_allclose(p.numpy(), r, rtol=1e-5, atol=1e-5)
    opt.momentum = 0.0
    opt.step()
    assert opt.u == {}  # back at 0: the state is dropped


@pytest.mark.hw2_sgd
def test_sgd_momentum_is_an_average_not_pytorch_form():
    # one step from u = 0: the course moves by lr·(1-β)·g, PyTorch's form would move by lr·g
    p = nn.Parameter(np.array([1.0], F32))
    (p * 4.0).sum().backward()
    optim.SGD([p], lr=0.1, momentum=0.75).step()
    np.testing.assert_allclose(p.numpy(), [1.0 - 0.1 * 0.25 * 4.0], rtol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "kwargs",
    [dict(lr=0.01), dict(lr=0.05, beta1=0.8, beta2=0.99), dict(lr=0.02, weight_decay=0.1)],
    ids=["default", "betas", "wd"],
)
@pytest.mark.hw2_adam
def test_adam_matches_reference(device, kwargs):
    model, start = run(optim.Adam, kwargs, device, steps=6)
    ref = adam_reference(
        start,
        model,
        kwargs["lr"],
        kwargs.get("beta1", 0.9),
        kwargs.get("beta2", 0.999),
        1e-8,
        kwargs.get("weight_decay", 0.0),
        6,
    )
    for p, r in zip(model.parameters(), ref):
        assert p.dtype == "float32"
        np.testing.assert_allclose(p.numpy(), r, rtol=1e-5, atol=1e-5)


@pytest.mark.hw2_adam
def test_adam_first_step_moves_by_lr():
    # with bias correction, the first step is lr·g/(|g| + eps): lr in magnitude, whatever |g| is
    p = nn.Parameter(np.array([1.0, 1.0, 1.0], F32))
    (p * ndl.Tensor(np.array([1e-3, 5.0, -300.0], F32), requires_grad=False)).sum().backward()
    opt = optim.Adam([p], lr=0.1)
    opt.step()
    assert opt.t == 1
    np.testing.assert_allclose(p.numpy(), [0.9, 0.9, 1.1], rtol=1e-5)


def test_parameter_without_grad_is_skipped_and_adam_t_counts_steps():
    used = nn.Parameter(np.array([2.0], F32))
    unused = nn.Parameter(np.array([5.0], F32))
    opt = optim.Adam([used, unused], lr=0.1)
    for _ in range(3):
        opt.reset_grad()
        (used * 1.0).sum().backward()
        opt.step()
    assert opt.t == 3
    np.testing.assert_array_equal(unused.numpy(), [5.0])
    np.testing.assert_allclose(used.numpy(), [2.0 - 0.3], rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("opt_cls", [optim.SGD, optim.Adam])
def test_step_does_not_modify_grad(opt_cls, device):
    model = Quadratic(device)
    model.loss().backward()
    grads = [p.grad for p in model.parameters()]
    before = [g.numpy().copy() for g in grads]
    opt_cls(model.parameters(), lr=0.1, weight_decay=0.5).step()
    for p, g, b in zip(model.parameters(), grads, before):
        assert p.grad is g
        np.testing.assert_array_equal(g.numpy(), b)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("opt_cls, kwargs", [(optim.SGD, dict(momentum=0.9)), (optim.Adam, dict())])
def test_tensor_counter_stays_flat(opt_cls, kwargs, device):
    np.random.seed(0)
    model = nn.Sequential(nn.Linear(4, 8, device=device), nn.ReLU(), nn.Linear(8, 3, device=device))
    opt = opt_cls(model.parameters(), lr=0.01, **kwargs)
    X = ndl.Tensor(np.random.randn(5, 4).astype(F32), device=device, requires_grad=False)
    y = ndl.Tensor(np.array([0, 1, 2, 1, 0]), device=device, requires_grad=False)
    loss_fn = nn.SoftmaxLoss()

    def train_step():
        opt.reset_grad()
        loss_fn(model(X), y).backward()
        opt.step()

    train_step()  # creates the optimizer state
    gc.collect()
    start = ndl.autograd.TENSOR_COUNTER
    for _ in range(100):
        train_step()
    gc.collect()
    assert ndl.autograd.TENSOR_COUNTER == start


def test_graph_tracked_update_grows_the_counter():
    # the counter does detect the mistake the optimizers avoid (θ = θ - lr·g without .data)
    theta = nn.Parameter(np.array([1.0, 2.0], F32))
    gc.collect()
    start = ndl.autograd.TENSOR_COUNTER
    for _ in range(10):
        theta.grad = None
        theta.retain_grad()  # after the first step theta is an interior node
        (theta * theta).sum().backward()
        theta = theta - theta.grad * 0.1
    gc.collect()
    assert ndl.autograd.TENSOR_COUNTER > start + 10


def test_reset_grad():
    model = Quadratic(ndl.default_device())
    model.loss().backward()
    opt = optim.SGD(model.parameters())
    assert all(p.grad is not None for p in model.parameters())
    opt.reset_grad()
    assert all(p.grad is None for p in model.parameters())


def test_clip_grad_norm():
    p1 = nn.Parameter(np.zeros((2, 2), F32))
    p2 = nn.Parameter(np.zeros(3, F32))
    g1, g2 = np.array([[3.0, 0.0], [0.0, 4.0]], F32), np.array([0.0, 12.0, 0.0], F32)
    p1.grad = ndl.Tensor(g1, requires_grad=False)
    p2.grad = ndl.Tensor(g2, requires_grad=False)
    old = p1.grad
    opt = optim.SGD([p1, p2], lr=1.0)
    norm = opt.clip_grad_norm(max_norm=2.6)
    assert abs(norm - 13.0) < 1e-5  # sqrt(9 + 16 + 144)
    coef = 2.6 / (13.0 + 1e-6)
    np.testing.assert_allclose(p1.grad.numpy(), g1 * coef, rtol=1e-6)
    np.testing.assert_allclose(p2.grad.numpy(), g2 * coef, rtol=1e-6)
    np.testing.assert_array_equal(old.numpy(), g1)  # replaced, not modified in place
    # below the threshold nothing changes
    assert abs(opt.clip_grad_norm(max_norm=100.0) - 2.6) < 1e-4
    np.testing.assert_allclose(p1.grad.numpy(), g1 * coef, rtol=1e-6)
    with pytest.raises(ValueError, match="max_norm"):
        opt.clip_grad_norm(0.0)


def test_optimizer_rejects_bad_parameter_lists():
    a = nn.Parameter(np.zeros(2, F32))
    b = nn.Parameter(np.zeros(2, F32))
    with pytest.raises(ValueError, match="same tensor twice"):
        optim.SGD([a, b, a])
    with pytest.raises(ValueError, match="same tensor twice"):
        optim.Adam([b, b])
    with pytest.raises(ValueError, match="empty"):
        optim.SGD([])
    with pytest.raises(TypeError, match="not a needle Tensor"):
        optim.SGD([a, np.zeros(2)])
    with pytest.raises(ValueError, match="momentum"):
        optim.SGD([a], momentum=1.5)
    # a generator (model.parameters() style) is accepted and materialised
    assert [id(p) for p in optim.SGD(p for p in [a, b]).params] == [id(a), id(b)]


@pytest.mark.parametrize(
    "opt_cls, name, bad",
    [
        (optim.SGD, "lr", float("nan")),
        (optim.SGD, "lr", float("inf")),
        (optim.SGD, "lr", -0.1),
        (optim.SGD, "momentum", 1.0),
        (optim.SGD, "momentum", -0.5),
        (optim.SGD, "momentum", float("nan")),
        (optim.SGD, "weight_decay", -1e-4),
        (optim.SGD, "weight_decay", float("inf")),
        (optim.Adam, "lr", float("nan")),
        (optim.Adam, "lr", -1.0),
        (optim.Adam, "beta1", 1.0),
        (optim.Adam, "beta1", -0.1),
        (optim.Adam, "beta2", 1.5),
        (optim.Adam, "eps", 0.0),
        (optim.Adam, "eps", -1e-8),
        (optim.Adam, "eps", float("nan")),
        (optim.Adam, "weight_decay", -0.1),
    ],
)
def test_optimizers_reject_out_of_range_hyperparameters(opt_cls, name, bad):
    p = nn.Parameter(np.ones(2, F32))
    with pytest.raises(ValueError, match=name):
        opt_cls([p], **{name: bad})
    # a schedule that sets a bad value later is caught at the next step, before any update
    opt = opt_cls([p])
    (p * 2.0).sum().backward()
    setattr(opt, name, bad)
    with pytest.raises(ValueError, match=name):
        opt.step()
    np.testing.assert_array_equal(p.numpy(), [1.0, 1.0])
    with pytest.raises(TypeError, match=name):
        opt_cls([p], **{name: "0.1"})


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("opt_cls", [optim.SGD, optim.Adam])
def test_step_gives_the_parameter_a_new_array(opt_cls, device):
    # the course's p.data = ...: a tensor that shared the old array keeps the old values
    p = nn.Parameter(np.array([[1.0, -2.0, 3.0]], F32), device=device)
    shared = p.data
    (p * p).sum().backward()
    opt = opt_cls([p], lr=0.1)
    opt.step()
    assert p.realize_cached_data() is not shared.realize_cached_data()
    np.testing.assert_array_equal(shared.numpy(), [[1.0, -2.0, 3.0]])
    assert not np.allclose(p.numpy(), [[1.0, -2.0, 3.0]])


@pytest.mark.parametrize("device", DEVICES)
def test_step_on_a_strided_parameter(device):
    # a parameter whose array is a transposed view is updated correctly (and made compact)
    base = ndl.Tensor(np.arange(6, dtype=F32).reshape(2, 3), device=device)
    p = nn.Parameter(base.transpose(), device=device)
    (p * 1.0).sum().backward()
    optim.SGD([p], lr=0.5).step()
    np.testing.assert_allclose(p.numpy(), np.arange(6, dtype=F32).reshape(2, 3).T - 0.5)


@pytest.mark.parametrize("make", [lambda ps: optim.SGD(ps, lr=0.5), lambda ps: optim.Adam(ps)])
def test_a_parameter_appended_twice_after_construction_is_refused_at_step(make):
    """The constructor refuses duplicates, but one appended to opt.params later was updated
    twice per step, silently. step() now refuses it (and changes nothing)."""
    a = nn.Parameter(np.ones(2, F32))
    b = nn.Parameter(np.ones(3, F32))
    opt = make([a])
    opt.params.append(b)
    opt.params.append(b)
    for p in (a, b):
        p.grad = ndl.Tensor(np.ones(p.shape, F32))
    with pytest.raises(ValueError, match=r"same tensor twice \(positions 1 and 2, shape \(3,\)\)"):
        opt.step()
    np.testing.assert_array_equal(b.numpy(), np.ones(3, F32))
    np.testing.assert_array_equal(a.numpy(), np.ones(2, F32))
    opt.params.pop()
    opt.step()  # one copy: updated once
    assert np.all(b.numpy() < 1.0)


@pytest.mark.parametrize(
    "make_opt",
    [
        lambda ps: ndl.optim.SGD(ps, lr=0.1),
        lambda ps: ndl.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01),
        lambda ps: ndl.optim.Adam(ps, lr=0.1),
    ],
)
def test_a_snapshot_of_a_parameter_keeps_its_values(make_opt):
    """As the course's p.data = ..., a step gives the parameter a new array: ndl.Tensor(p),
    which shares p's array, keeps the values it had (a "best weights" copy)."""
    p = ndl.nn.Parameter(np.arange(6, dtype=np.float32).reshape(2, 3))
    opt = make_opt([p])
    snapshot, detached = ndl.Tensor(p), p.detach()
    before = p.numpy().copy()
    (p * p).sum().backward()
    opt.step()
    assert not np.array_equal(p.numpy(), before)
    np.testing.assert_array_equal(snapshot.numpy(), before)
    np.testing.assert_array_equal(detached.numpy(), before)


def test_two_parameters_made_from_one_array_are_updated_apart():
    """nn.Parameter(a.weight) starts from a's values; a step moves each by its own gradient."""
    a = ndl.nn.Parameter(np.ones((2, 2), dtype=np.float32))
    b = ndl.nn.Parameter(a)
    opt = ndl.optim.SGD([a, b], lr=0.5)
    (a * 2.0 + b * 4.0).sum().backward()
    opt.step()
    np.testing.assert_array_equal(a.numpy(), np.full((2, 2), 0.0, np.float32))
    np.testing.assert_array_equal(b.numpy(), np.full((2, 2), -1.0, np.float32))
