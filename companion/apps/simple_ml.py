"""The course's first applications: softmax regression and a two-layer net (hw0, hw1).

hw0 writes them in numpy (``softmax_loss(Z, y)`` with integer labels, ``nn_epoch`` updating numpy
weights in place) and in C++ (``softmax_regression_epoch_cpp``); hw1 rewrites ``softmax_loss``
and ``nn_epoch`` with needle Tensors (``softmax_loss(Z, y_one_hot)``, ``nn_epoch`` returning new
weight Tensors). The course keeps the two under the same names in two homework copies of this
file; here one function serves both and dispatches on the argument type: needle Tensors get the
hw1 behaviour, numpy arrays the hw0 behaviour.

The hw4 training loops (CIFAR-10, Penn Treebank) live in their own modules and are re-exported at
the bottom, so ``companion.apps.simple_ml`` holds every name the course's copies do.
"""

from __future__ import annotations

from typing import List, Tuple

import numpy as np

import needle as ndl
from needle.data.datasets.mnist_dataset import parse_mnist

try:
    from .simple_ml_ext import softmax_regression_epoch_cpp
except ImportError as _exc:  # not compiled yet: fail loudly when called, not at import
    _EXT_ERROR = _exc

    def softmax_regression_epoch_cpp(X, y, theta, lr, batch):
        """Unavailable: the compiled module ``companion.apps.simple_ml_ext`` is missing."""
        raise ImportError(
            "companion.apps.simple_ml_ext is not compiled; run `make build` "
            f"(import failed: {_EXT_ERROR})"
        )


__all__ = [
    "add",
    "parse_mnist",
    "softmax_loss",
    "softmax_regression_epoch",
    "softmax_regression_epoch_cpp",
    "nn_epoch",
    "loss_err",
    "train_softmax",
    "train_nn",
    "epoch_general_cifar10",
    "train_cifar10",
    "evaluate_cifar10",
    "epoch_general_ptb",
    "train_ptb",
    "evaluate_ptb",
]


# question: hw0_add
def add(x, y):
    """hw0's warm-up: ``x + y`` for Python numbers and numpy arrays alike (arrays broadcast)."""
    return x + y


def _softmax(Z: np.ndarray) -> np.ndarray:
    """Row-wise softmax of a 2-D array (the row max is subtracted first, for stability)."""
    E = np.exp(Z - Z.max(axis=1, keepdims=True))
    return E / E.sum(axis=1, keepdims=True)


def _check_xy(X: np.ndarray, y: np.ndarray) -> None:
    if not isinstance(X, np.ndarray) or X.ndim != 2:
        raise ValueError(
            f"X must be a 2-D numpy array (m, n), got {type(X).__name__} "
            f"with shape {getattr(X, 'shape', None)}"
        )
    if not isinstance(y, np.ndarray) or y.shape != (X.shape[0],):
        raise ValueError(
            f"y must be a numpy array of shape ({X.shape[0]},) to match X, "
            f"got shape {getattr(y, 'shape', None)}"
        )
    if y.dtype.kind not in "iu":
        raise TypeError(f"y must hold integer labels, got dtype {y.dtype}")


# question: hw0_softmax_loss hw1_softmax_loss
def softmax_loss(Z, y):
    """Mean softmax (cross-entropy) loss of logits ``Z`` (batch, classes).

    numpy (hw0): ``y`` is an integer label array (batch,); returns a float,
    mean(log sum_j exp Z_ij - Z_{i, y_i}). needle (hw1): ``Z`` and ``y`` (then ``y_one_hot``,
    (batch, classes)) are Tensors; returns a scalar Tensor built from needle ops, so it can be
    differentiated.
    """
    if isinstance(Z, ndl.Tensor):
        if not isinstance(y, ndl.Tensor) or y.shape != Z.shape:
            raise ValueError(
                f"with a Tensor Z {Z.shape}, y must be a one-hot Tensor of the same "
                f"shape, got {type(y).__name__} {getattr(y, 'shape', None)}"
            )
        return (ndl.log(ndl.exp(Z).sum((1,))).sum() - (y * Z).sum()) / Z.shape[0]
    Z = np.asarray(Z)
    y = np.asarray(y)
    if Z.ndim != 2 or y.shape != (Z.shape[0],):
        raise ValueError(
            f"softmax_loss needs Z (batch, classes) and integer y (batch,), got "
            f"shapes {Z.shape} and {y.shape}"
        )
    zmax = Z.max(axis=1)
    lse = zmax + np.log(np.exp(Z - zmax[:, None]).sum(axis=1))
    return float(np.mean(lse - Z[np.arange(Z.shape[0]), y]))


# question: hw0_softmax_regression_epoch
def softmax_regression_epoch(
    X: np.ndarray, y: np.ndarray, theta: np.ndarray, lr: float = 0.1, batch: int = 100
) -> None:
    """One epoch of mini-batch SGD for softmax regression, updating ``theta`` in place (hw0).

    X (m, n) float, y (m,) integer labels, theta (n, k). Batches are consecutive rows; the last
    may be smaller; each step is theta -= lr * X_b^T (softmax(X_b theta) - I_y) / b.
    """
    _check_xy(X, y)
    if not isinstance(theta, np.ndarray) or theta.ndim != 2 or theta.shape[0] != X.shape[1]:
        raise ValueError(
            f"theta must be a numpy array of shape ({X.shape[1]}, k), got shape "
            f"{getattr(theta, 'shape', None)}"
        )
    if batch < 1:
        raise ValueError(f"batch must be positive, got {batch}")
    for start in range(0, X.shape[0], batch):
        Xb, yb = X[start : start + batch], y[start : start + batch]
        G = _softmax(Xb @ theta)
        G[np.arange(len(yb)), yb] -= 1
        theta -= (lr / len(yb)) * (Xb.T @ G).astype(theta.dtype)


# question: hw0_nn_epoch
def _nn_epoch_numpy(X, y, W1, W2, lr, batch) -> None:
    _check_xy(X, y)
    if W1.ndim != 2 or W2.ndim != 2 or W1.shape[0] != X.shape[1] or W2.shape[0] != W1.shape[1]:
        raise ValueError(
            f"W1 must be ({X.shape[1]}, d) and W2 (d, k); got shapes {W1.shape} and {W2.shape}"
        )
    if batch < 1:
        raise ValueError(f"batch must be positive, got {batch}")
    for start in range(0, X.shape[0], batch):
        Xb, yb = X[start : start + batch], y[start : start + batch]
        Z1 = np.maximum(Xb @ W1, 0)
        G2 = _softmax(Z1 @ W2)
        G2[np.arange(len(yb)), yb] -= 1
        G1 = (Z1 > 0) * (G2 @ W2.T)
        scale = lr / len(yb)
        W1 -= (scale * (Xb.T @ G1)).astype(W1.dtype)
        W2 -= (scale * (Z1.T @ G2)).astype(W2.dtype)


# question: hw1_nn_epoch
def _nn_epoch_needle(X, y, W1, W2, lr, batch):
    _check_xy(X, y)
    if batch < 1:
        raise ValueError(f"batch must be positive, got {batch}")
    k = W2.shape[1]
    for start in range(0, X.shape[0], batch):
        Xb, yb = X[start : start + batch], y[start : start + batch]
        one_hot = np.zeros((len(yb), k), dtype=np.float32)
        one_hot[np.arange(len(yb)), yb] = 1
        Xt = ndl.Tensor(Xb, device=W1.device, requires_grad=False)
        logits = ndl.relu(Xt @ W1) @ W2
        loss = softmax_loss(logits, ndl.Tensor(one_hot, device=W1.device, requires_grad=False))
        loss.backward()
        # New leaf tensors from raw arrays: the update must not extend the graph.
        W1 = ndl.Tensor(
            W1.realize_cached_data() - lr * W1.grad.realize_cached_data(), device=W1.device
        )
        W2 = ndl.Tensor(
            W2.realize_cached_data() - lr * W2.grad.realize_cached_data(), device=W2.device
        )
    return W1, W2


# question: hw0_nn_epoch hw1_nn_epoch
def nn_epoch(X: np.ndarray, y: np.ndarray, W1, W2, lr: float = 0.1, batch: int = 100):
    """One epoch of SGD for the two-layer net logits = ReLU(X W1) W2, on the softmax loss.

    X (m, n), y (m,) integer labels, W1 (n, d), W2 (d, k), batches of consecutive rows.
    numpy weights (hw0): updated in place, returns None. Tensor weights (hw1): gradients come
    from ``loss.backward()`` and the function returns the new ``(W1, W2)`` Tensors.
    """
    if isinstance(W1, ndl.Tensor) and isinstance(W2, ndl.Tensor):
        return _nn_epoch_needle(X, y, W1, W2, lr, batch)
    if isinstance(W1, np.ndarray) and isinstance(W2, np.ndarray):
        return _nn_epoch_numpy(X, y, W1, W2, lr, batch)
    raise TypeError(
        f"W1 and W2 must both be numpy arrays or both needle Tensors, got "
        f"{type(W1).__name__} and {type(W2).__name__}"
    )


def loss_err(h, y) -> Tuple[float, float]:
    """(mean softmax loss, error rate) of logits ``h`` (m, k) against integer labels ``y`` (m,).

    ``h`` may be a numpy array (hw0) or a needle Tensor (hw1); ``y`` is a numpy array.
    """
    y = np.asarray(y)
    if isinstance(h, ndl.Tensor):
        one_hot = np.zeros(h.shape, dtype=np.float32)
        one_hot[np.arange(y.size), y] = 1
        loss = float(softmax_loss(h, ndl.Tensor(one_hot, device=h.device)).numpy())
        return loss, float(np.mean(h.numpy().argmax(axis=1) != y))
    return softmax_loss(h, y), float(np.mean(np.asarray(h).argmax(axis=1) != y))


def _row(epoch: int, tr: Tuple[float, float], te: Tuple[float, float], verbose: bool) -> dict:
    if verbose:
        print("|  {:>4} |    {:.5f} |   {:.5f} |   {:.5f} |  {:.5f} |".format(epoch, *tr, *te))
    return {
        "epoch": epoch,
        "train_loss": tr[0],
        "train_err": tr[1],
        "test_loss": te[0],
        "test_err": te[1],
    }


_HEADER = "| Epoch | Train Loss | Train Err | Test Loss | Test Err |"


def train_softmax(
    X_tr,
    y_tr,
    X_te,
    y_te,
    epochs: int = 10,
    lr: float = 0.5,
    batch: int = 100,
    cpp: bool = False,
    *,
    verbose: bool = True,
) -> List[dict]:
    """Train softmax regression from theta = 0 and print the course's per-epoch table (hw0).

    X (m, n) float32, y (m,) integer labels. Extension: returns the table as a list of dicts
    (epoch, train_loss, train_err, test_loss, test_err); ``verbose=False`` stops the printing.
    """
    theta = np.zeros((X_tr.shape[1], int(y_tr.max()) + 1), dtype=np.float32)
    epoch_fn = softmax_regression_epoch_cpp if cpp else softmax_regression_epoch
    if verbose:
        print(_HEADER)
    history = []
    for epoch in range(epochs):
        epoch_fn(X_tr, y_tr, theta, lr=lr, batch=batch)
        history.append(
            _row(epoch, loss_err(X_tr @ theta, y_tr), loss_err(X_te @ theta, y_te), verbose)
        )
    return history


def train_nn(
    X_tr,
    y_tr,
    X_te,
    y_te,
    hidden_dim: int = 500,
    epochs: int = 10,
    lr: float = 0.5,
    batch: int = 100,
    *,
    use_needle: bool = False,
    verbose: bool = True,
) -> List[dict]:
    """Train the two-layer ReLU net and print the course's per-epoch table (hw0; hw1 with Tensors).

    Seeds ``np.random.seed(0)``, then W1 = randn(n, hidden_dim)/sqrt(hidden_dim) and
    W2 = randn(hidden_dim, k)/sqrt(k), as the course does. Extensions: ``use_needle=True`` runs
    hw1's needle ``nn_epoch``; returns the table as a list of dicts; ``verbose=False`` is quiet.
    """
    n, k = X_tr.shape[1], int(y_tr.max()) + 1
    np.random.seed(0)
    # np.float32 divisors keep float32 under numpy 2's promotion rules (as numpy 1 did).
    W1 = np.random.randn(n, hidden_dim).astype(np.float32) / np.float32(np.sqrt(hidden_dim))
    W2 = np.random.randn(hidden_dim, k).astype(np.float32) / np.float32(np.sqrt(k))
    if use_needle:
        W1, W2 = ndl.Tensor(W1), ndl.Tensor(W2)
    if verbose:
        print(_HEADER)
    history = []
    for epoch in range(epochs):
        if use_needle:
            W1, W2 = nn_epoch(X_tr, y_tr, W1, W2, lr=lr, batch=batch)
            w1, w2 = W1.numpy(), W2.numpy()
        else:
            nn_epoch(X_tr, y_tr, W1, W2, lr=lr, batch=batch)
            w1, w2 = W1, W2
        tr = loss_err(np.maximum(X_tr @ w1, 0) @ w2, y_tr)
        te = loss_err(np.maximum(X_te @ w1, 0) @ w2, y_te)
        history.append(_row(epoch, tr, te, verbose))
    return history


# hw4's training loops, written in their own modules (course: the same simple_ml.py).
from .cifar_training import epoch_general_cifar10, evaluate_cifar10, train_cifar10  # noqa: E402
from .ptb_training import epoch_general_ptb, evaluate_ptb, train_ptb  # noqa: E402
