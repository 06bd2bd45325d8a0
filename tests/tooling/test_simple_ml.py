"""companion.apps.simple_ml: hw0's numpy and C++ softmax regression and two-layer net, hw1's needle
versions.

Oracles: central finite differences of an independently written float64 loss, the numpy epoch
for the C++ one, and the numpy versions for the needle ones.
"""

import numpy as np
import pytest

import companion.data
import needle as ndl
from companion.apps import simple_ml as sm
from companion.apps import simple_ml_ext

pytestmark = pytest.mark.apps


def _loss64(Z, y):
    """Mean cross-entropy written out directly: -mean(log(exp(z_y) / sum exp(z)))."""
    Z = np.asarray(Z, dtype=np.float64)
    P = np.exp(Z) / np.exp(Z).sum(axis=1, keepdims=True)
    return -np.mean(np.log(P[np.arange(len(y)), y]))


def _fd_grad(f, W, eps=1e-6):
    g = np.zeros_like(W)
    for idx in np.ndindex(W.shape):
        old = W[idx]
        W[idx] = old + eps
        up = f()
        W[idx] = old - eps
        down = f()
        W[idx] = old
        g[idx] = (up - down) / (2 * eps)
    return g


def _problem(m=40, n=6, k=4, seed=1, dtype=np.float64):
    rng = np.random.RandomState(seed)
    return rng.randn(m, n).astype(dtype), rng.randint(k, size=m).astype(np.uint8)


@pytest.mark.hw0_softmax_loss
def test_softmax_loss_numpy():
    Z = np.random.randn(9, 5)
    y = np.random.randint(5, size=9)
    assert abs(sm.softmax_loss(Z, y) - _loss64(Z, y)) < 1e-12
    assert abs(sm.softmax_loss(np.zeros((3, 7)), np.array([0, 3, 6])) - np.log(7)) < 1e-12
    big = np.array([[1000.0, 0.0], [0.0, 1000.0]])  # stable: no overflow
    assert abs(sm.softmax_loss(big, np.array([1, 1])) - 500.0) < 1e-9
    with pytest.raises(ValueError, match="shapes"):
        sm.softmax_loss(Z, y[:4])


@pytest.mark.parametrize("batch", [40, 15])
@pytest.mark.hw0_softmax_regression_epoch
def test_softmax_regression_epoch_is_sgd_on_the_loss(batch):
    X, y = _problem()
    theta = np.random.randn(6, 4) * 0.1
    expected = theta.copy()
    lr = 0.7
    for s in range(0, 40, batch):  # the course's schedule, each step's gradient by differences
        Xb, yb = X[s : s + batch], y[s : s + batch]
        expected -= lr * _fd_grad(lambda: _loss64(Xb @ expected, yb), expected)
    sm.softmax_regression_epoch(X, y, theta, lr=lr, batch=batch)
    np.testing.assert_allclose(theta, expected, atol=1e-7)


@pytest.mark.parametrize("batch", [40, 16])
@pytest.mark.hw0_nn_epoch
def test_nn_epoch_numpy_is_sgd_on_the_loss(batch):
    X, y = _problem(n=5, k=3)
    W1, W2 = np.random.randn(5, 8) * 0.5, np.random.randn(8, 3) * 0.5
    E1, E2 = W1.copy(), W2.copy()
    lr = 0.4
    for s in range(0, 40, batch):
        Xb, yb = X[s : s + batch], y[s : s + batch]

        def loss():
            return _loss64(np.maximum(Xb @ E1, 0) @ E2, yb)

        g1, g2 = _fd_grad(loss, E1), _fd_grad(loss, E2)
        E1 -= lr * g1
        E2 -= lr * g2
    assert sm.nn_epoch(X, y, W1, W2, lr=lr, batch=batch) is None  # updated in place
    np.testing.assert_allclose(W1, E1, atol=1e-7)
    np.testing.assert_allclose(W2, E2, atol=1e-7)


@pytest.mark.parametrize("m,batch", [(103, 10), (50, 50), (7, 100)])
@pytest.mark.hw0_softmax_regression_epoch_cpp
def test_cpp_epoch_matches_numpy(m, batch):
    X, y = _problem(m=m, n=7, k=4, dtype=np.float32)
    theta = (np.random.randn(7, 4) * 0.1).astype(np.float32)
    ref, start = theta.copy(), theta.copy()
    sm.softmax_regression_epoch(X, y, ref, lr=0.3, batch=batch)
    ret = simple_ml_ext.softmax_regression_epoch_cpp(X, y, theta, 0.3, batch)
    assert ret is None
    np.testing.assert_allclose(theta, ref, atol=1e-5)
    assert np.abs(theta - start).max() > 1e-3  # it did update theta in place


@pytest.mark.hw0_softmax_regression_epoch_cpp
def test_cpp_epoch_on_digits_matches_numpy():
    X, y = companion.data.load_digits_mnist_like(train=True)
    a = np.zeros((64, 10), dtype=np.float32)
    b = a.copy()
    sm.softmax_regression_epoch(X, y, a, lr=0.2, batch=100)
    sm.softmax_regression_epoch_cpp(X, y, b, lr=0.2, batch=100)
    np.testing.assert_allclose(b, a, atol=1e-5)
    assert np.abs(a).max() > 0.01


def test_cpp_epoch_validates_its_arguments():
    X, y = _problem(m=6, n=3, k=2, dtype=np.float32)
    theta = np.zeros((3, 2), dtype=np.float32)
    f = simple_ml_ext.softmax_regression_epoch_cpp
    with pytest.raises(TypeError, match="theta must be a float32"):
        f(X, y, theta.astype(np.float64), 0.1, 2)
    with pytest.raises(TypeError, match="X must be a float32"):
        f(X.astype(np.float64), y, theta, 0.1, 2)
    with pytest.raises(ValueError, match="6 rows but y has 5"):
        f(X, y[:5], theta, 0.1, 2)
    with pytest.raises(ValueError, match="theta must have X.shape\\[1\\] = 3 rows"):
        f(X, y, np.zeros((4, 2), dtype=np.float32), 0.1, 2)
    with pytest.raises(ValueError, match="outside \\[0, 2\\)"):
        f(X, np.full(6, 2, dtype=np.uint8), theta, 0.1, 2)
    with pytest.raises(ValueError, match="batch must be positive"):
        f(X, y, theta, 0.1, 0)
    with pytest.raises(ValueError, match="C-contiguous"):
        f(X, y, np.zeros((2, 3), dtype=np.float32).T, 0.1, 2)
    frozen = theta.copy()
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        f(X, y, frozen, 0.1, 2)
    with pytest.raises(TypeError, match="integer labels"):
        f(X, y.astype(np.float32), theta, 0.1, 2)
    with pytest.raises(ValueError, match="y must be 1-D"):
        f(X, y.reshape(6, 1), theta, 0.1, 2)
    # other integer label dtypes work and give the uint8 result
    t1, t2 = theta.copy(), theta.copy()
    f(X, y, t1, 0.5, 4)
    f(X, y.astype(np.int64), t2, 0.5, 4)
    np.testing.assert_array_equal(t1, t2)


def test_numpy_epochs_validate_their_arguments():
    X, y = _problem(m=6, n=3, k=2)
    with pytest.raises(ValueError, match="theta"):
        sm.softmax_regression_epoch(X, y, np.zeros((4, 2)))
    with pytest.raises(ValueError, match="y must be"):
        sm.softmax_regression_epoch(X, y[:2], np.zeros((3, 2)))
    with pytest.raises(TypeError, match="integer labels"):
        sm.nn_epoch(X, y.astype(float), np.zeros((3, 4)), np.zeros((4, 2)))
    with pytest.raises(TypeError, match="both be numpy arrays or both needle Tensors"):
        sm.nn_epoch(X, y, np.zeros((3, 4)), ndl.Tensor(np.zeros((4, 2))))


# ---- hw1: the needle versions -------------------------------------------------------------------


@pytest.mark.hw1_softmax_loss
def test_softmax_loss_needle_value_and_gradient():
    Z = np.random.randn(6, 4).astype(np.float32)
    y = np.random.randint(4, size=6)
    one_hot = np.eye(4, dtype=np.float32)[y]
    Zt = ndl.Tensor(Z)
    loss = sm.softmax_loss(Zt, ndl.Tensor(one_hot))
    assert isinstance(loss, ndl.Tensor)
    assert abs(float(loss.numpy()) - _loss64(Z, y)) < 1e-5
    loss.backward()
    Z64 = Z.astype(np.float64)
    fd = _fd_grad(lambda: _loss64(Z64, y), Z64)
    np.testing.assert_allclose(Zt.grad.numpy(), fd, atol=1e-5)
    with pytest.raises(ValueError, match="one-hot Tensor"):
        sm.softmax_loss(Zt, ndl.Tensor(one_hot[:3]))


@pytest.mark.parametrize("batch", [50, 20])
@pytest.mark.hw1_nn_epoch
def test_nn_epoch_needle_matches_numpy(batch):
    X, y = _problem(m=50, n=5, k=3, dtype=np.float32)
    W1 = (np.random.randn(5, 10) / np.sqrt(10)).astype(np.float32)
    W2 = (np.random.randn(10, 3) / np.sqrt(3)).astype(np.float32)
    T1, T2 = sm.nn_epoch(X, y, ndl.Tensor(W1), ndl.Tensor(W2), lr=0.5, batch=batch)
    assert isinstance(T1, ndl.Tensor) and isinstance(T2, ndl.Tensor)
    assert T1.op is None and T2.op is None  # fresh leaves: no graph kept across steps
    sm.nn_epoch(X, y, W1, W2, lr=0.5, batch=batch)
    np.testing.assert_allclose(T1.numpy(), W1, atol=1e-5)
    np.testing.assert_allclose(T2.numpy(), W2, atol=1e-5)


def test_loss_err_accepts_tensors_and_arrays():
    h = np.random.randn(20, 5).astype(np.float32)
    y = np.random.randint(5, size=20)
    loss, err = sm.loss_err(h, y)
    assert abs(loss - _loss64(h, y)) < 1e-5
    assert err == np.mean(h.argmax(axis=1) != y)
    lt, et = sm.loss_err(ndl.Tensor(h), y)
    assert abs(lt - loss) < 1e-5 and et == err


# ---- whole training runs on the offline digits ------------------------------------------------


@pytest.fixture(scope="module")
def digits():
    return (
        *companion.data.load_digits_mnist_like(train=True),
        *companion.data.load_digits_mnist_like(train=False),
    )


def test_train_softmax_numpy_and_cpp_agree_and_learn(digits, capsys):
    hist = sm.train_softmax(*digits, epochs=5, lr=0.2, batch=100)
    out = capsys.readouterr().out
    assert out.startswith("| Epoch | Train Loss | Train Err | Test Loss | Test Err |")
    assert len(out.strip().splitlines()) == 6
    hist_cpp = sm.train_softmax(*digits, epochs=5, lr=0.2, batch=100, cpp=True, verbose=False)
    assert capsys.readouterr().out == ""
    for a, b in zip(hist, hist_cpp):
        assert abs(a["train_loss"] - b["train_loss"]) < 1e-4
        assert abs(a["test_err"] - b["test_err"]) < 2 / 297
    assert hist[-1]["test_err"] < 0.15  # chance is 0.9
    assert hist[-1]["train_loss"] < hist[0]["train_loss"]


def test_train_nn_numpy_and_needle_agree(digits):
    h_np = sm.train_nn(*digits, hidden_dim=32, epochs=3, lr=0.2, batch=100, verbose=False)
    h_nd = sm.train_nn(
        *digits, hidden_dim=32, epochs=3, lr=0.2, batch=100, use_needle=True, verbose=False
    )
    for a, b in zip(h_np, h_nd):
        assert abs(a["train_loss"] - b["train_loss"]) < 1e-4
    assert h_np[-1]["test_err"] < 0.2
