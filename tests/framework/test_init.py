"""needle.init: factories and initialisers against numpy draws from the same seed.

Oracle: the course's formulas evaluated with numpy on the same global-RNG draws (one
``np.random.rand``/``randn`` call per tensor), plus sample statistics on large tensors.
"""

import math

import numpy as np
import pytest
from conftest import DEVICES

import needle as ndl
from needle import init, nn

pytestmark = [pytest.mark.nn, pytest.mark.both_backends]

F32 = np.float32


def _rand(*shape):
    return np.random.rand(*shape).astype(F32)


def _randn(*shape):
    return np.random.randn(*shape).astype(F32)


@pytest.mark.parametrize("device", DEVICES)
def test_rand_reproduces_seeded_numpy_and_bounds(device):
    np.random.seed(3)
    t = init.rand(4, 6, low=-2.0, high=3.0, device=device)
    np.random.seed(3)
    expected = _rand(4, 6) * F32(5.0) + F32(-2.0)
    assert t.shape == (4, 6) and t.dtype == "float32" and t.device == device
    assert not t.requires_grad
    np.testing.assert_allclose(t.numpy(), expected, rtol=1e-6, atol=1e-6)
    big = init.rand(20000, low=-2.0, high=3.0, device=device).numpy()
    assert big.min() >= -2.0 and big.max() < 3.0
    assert abs(big.mean() - 0.5) < 0.05  # mean of U(-2, 3)


@pytest.mark.parametrize("device", DEVICES)
def test_randn_reproduces_seeded_numpy(device):
    np.random.seed(5)
    t = init.randn(3, 7, mean=1.5, std=0.25, device=device)
    np.random.seed(5)
    np.testing.assert_allclose(t.numpy(), _randn(3, 7) * F32(0.25) + F32(1.5), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_constant_ones_zeros(device):
    c = init.constant(2, 3, c=-4.5, device=device)
    np.testing.assert_array_equal(c.numpy(), np.full((2, 3), -4.5, dtype=F32))
    np.testing.assert_array_equal(init.ones(3, device=device).numpy(), np.ones(3, F32))
    np.testing.assert_array_equal(init.zeros(2, 2, 2, device=device).numpy(), np.zeros((2, 2, 2)))
    assert init.ones(2, device=device, requires_grad=True).requires_grad


def test_factories_default_to_the_tensor_default_device():
    # one default device: what ndl.Tensor(x) uses, so that init, nn modules and tensors made
    # without device= meet (the compiled cpu() when it is built)
    here = ndl.Tensor([1.0]).device
    if ndl.BACKEND == "nd" and ndl.cpu().enabled():
        assert here == ndl.cpu()
    for t in (
        init.rand(2),
        init.randn(2),
        init.zeros(2),
        init.ones(2),
        init.randb(2),
        init.constant(2, c=3.0),
        init.xavier_uniform(2, 3),
        init.kaiming_normal(2, 3),
        init.one_hot(3, ndl.Tensor([1.0])),
    ):
        assert t.device == here


def test_modules_without_device_take_plain_tensors():
    # nn.Linear(2, 3)(ndl.Tensor(x)) works as a newcomer expects
    np.random.seed(0)
    x = np.random.randn(4, 2).astype(F32)
    lin = nn.Linear(2, 3)
    y = lin(ndl.Tensor(x))
    np.testing.assert_allclose(
        y.numpy(), x @ lin.weight.numpy() + lin.bias.numpy(), rtol=1e-5, atol=1e-6
    )
    for module, shape in (
        (nn.BatchNorm1d(3), (4, 3)),
        (nn.LayerNorm1d(3), (4, 3)),
        (nn.LSTMCell(3, 2), (4, 3)),
    ):
        module(ndl.Tensor(np.random.randn(*shape).astype(F32)))


@pytest.mark.parametrize("device", DEVICES)
def test_zeros_like_ones_like(device):
    x = ndl.Tensor(np.arange(6, dtype=F32).reshape(2, 3), device=device)
    z, o = init.zeros_like(x), init.ones_like(x)
    for t, v in ((z, 0.0), (o, 1.0)):
        assert t.shape == (2, 3) and t.dtype == x.dtype and t.device == device
        assert not t.requires_grad
        np.testing.assert_array_equal(t.numpy(), np.full((2, 3), v, F32))


@pytest.mark.parametrize("device", DEVICES)
def test_randb_exact_mask_and_rate(device):
    np.random.seed(11)
    m = init.randb(5, 8, p=0.3, device=device)
    np.random.seed(11)
    expected = _rand(5, 8) <= F32(0.3)
    np.testing.assert_array_equal(m.numpy().astype(bool), expected)
    big = init.randb(40000, p=0.3, device=device).numpy().astype(F32)
    # binomial std of the rate is sqrt(.3*.7/40000) = 0.0023; 5 sigma
    assert abs(big.mean() - 0.3) < 0.012


def test_randb_dtype_per_backend():
    m = init.randb(4, p=0.5)
    # NDArray holds only float32, so "bool" becomes 0/1 float32 there
    assert m.dtype == ("float32" if ndl.BACKEND == "nd" else "bool")
    f = init.randb(4, p=0.5, dtype="float32")
    assert f.dtype == "float32"
    assert set(np.unique(f.numpy())) <= {0.0, 1.0}


@pytest.mark.parametrize("device", DEVICES)
def test_one_hot(device):
    labels = ndl.Tensor([2.0, 0.0, 3.0, 2.0], device=device)
    t = init.one_hot(4, labels, device=device)
    np.testing.assert_array_equal(t.numpy(), np.eye(4, dtype=F32)[[2, 0, 3, 2]])
    assert t.shape == (4, 4) and t.device == device


@pytest.mark.parametrize("labels", [[0.0, 4.0], [-1.0, 1.0], [0.5, 1.0]])
def test_one_hot_rejects_bad_labels(labels):
    with pytest.raises(ValueError, match="labels"):
        init.one_hot(4, ndl.Tensor(labels, device=ndl.cpu()))


@pytest.mark.parametrize("bad, exc", [((2, -1), ValueError), ((2, 1.5), TypeError)])
def test_bad_shapes_raise(bad, exc):
    with pytest.raises(exc, match="shape"):
        init.zeros(*bad)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.hw2_xavier_uniform
def test_xavier_uniform_formula(device):
    np.random.seed(0)
    t = init.xavier_uniform(3, 5, gain=1.5, device=device)
    a = 1.5 * math.sqrt(6 / 8)
    np.random.seed(0)
    np.testing.assert_allclose(t.numpy(), _rand(3, 5) * F32(2 * a) + F32(-a), rtol=1e-6, atol=1e-6)
    big = init.xavier_uniform(200, 300, device=device).numpy()
    a = math.sqrt(6 / 500)
    assert np.abs(big).max() <= a
    assert abs(big.std() - a / math.sqrt(3)) < 0.02 * a


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.hw2_xavier_normal
def test_xavier_normal_formula(device):
    np.random.seed(0)
    t = init.xavier_normal(4, 6, gain=2.0, device=device)
    std = 2.0 * math.sqrt(2 / 10)
    np.random.seed(0)
    np.testing.assert_allclose(t.numpy(), _randn(4, 6) * F32(std), rtol=1e-6, atol=1e-6)
    big = init.xavier_normal(200, 300, device=device).numpy()
    assert abs(big.std() - math.sqrt(2 / 500)) < 0.02 * math.sqrt(2 / 500)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.hw2_kaiming_uniform
def test_kaiming_uniform_seeded_numbers(device):
    np.random.seed(0)
    t = init.kaiming_uniform(3, 5, device=device)
    bound = math.sqrt(2) * math.sqrt(3 / 3)  # = sqrt(2)
    np.random.seed(0)
    hand = (2 * np.random.rand(3, 5) - 1) * bound  # float64 hand computation
    assert t.shape == (3, 5)
    np.testing.assert_allclose(t.numpy(), hand, rtol=1e-5, atol=1e-6)
    assert np.abs(t.numpy()).max() <= bound


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.hw2_kaiming_uniform
def test_kaiming_uniform_shape_overrides_shape_not_bound(device):
    np.random.seed(2)
    t = init.kaiming_uniform(4 * 9, 8 * 9, shape=(3, 3, 4, 8), device=device)
    bound = math.sqrt(2) * math.sqrt(3 / 36)
    np.random.seed(2)
    assert t.shape == (3, 3, 4, 8)
    np.testing.assert_allclose(
        t.numpy(), _rand(3, 3, 4, 8) * F32(2 * bound) + F32(-bound), rtol=1e-6, atol=1e-6
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.hw2_kaiming_normal
def test_kaiming_normal_formula(device):
    np.random.seed(4)
    t = init.kaiming_normal(6, 2, device=device)
    np.random.seed(4)
    np.testing.assert_allclose(
        t.numpy(), _randn(6, 2) * F32(math.sqrt(2) / math.sqrt(6)), rtol=1e-6, atol=1e-6
    )
    big = init.kaiming_normal(50, 2000, device=device).numpy()
    assert abs(big.std() - math.sqrt(2 / 50)) < 0.02 * math.sqrt(2 / 50)


def test_one_rng_call_per_tensor():
    # After an initialiser, numpy's RNG must sit exactly where one rand/randn call leaves it.
    for fn, draw in (
        (lambda: init.kaiming_uniform(3, 5), lambda: np.random.rand(3, 5)),
        (lambda: init.xavier_normal(3, 5), lambda: np.random.randn(3, 5)),
        (lambda: init.randb(7, p=0.2), lambda: np.random.rand(7)),
    ):
        np.random.seed(9)
        fn()
        after = np.random.rand()
        np.random.seed(9)
        draw()
        assert np.random.rand() == after


def test_initializer_argument_errors():
    with pytest.raises(ValueError, match="nonlinearity"):
        init.kaiming_uniform(3, 5, nonlinearity="tanh")
    with pytest.raises(ValueError, match="nonlinearity"):
        init.kaiming_normal(3, 5, nonlinearity="sigmoid")
    with pytest.raises(ValueError, match="fan_in"):
        init.xavier_uniform(0, 5)
    with pytest.raises(ValueError, match="p must"):
        init.randb(3, p=1.5)


def test_namespace():
    assert ndl.ones is init.ones and ndl.zeros is init.zeros
    assert ndl.zeros_like is init.zeros_like and ndl.ones_like is init.ones_like
