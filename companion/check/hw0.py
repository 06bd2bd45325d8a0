"""hw0 checks: ``src/simple_ml.py`` (numpy) and ``src/simple_ml_ext.cpp`` (C++).

Each function is named after its question id and receives the worker's context. Oracles are
plain numpy written here; inputs are small random problems so failures print readably.
"""

import gzip
import os
import struct
import sys

import numpy as np

from .diagnose import NotImplementedYet, check_close, require


def _given(what: str, value):
    """``value`` as float64, or "not implemented" when the function returned None."""
    if value is None:
        raise NotImplementedYet(
            f"{what} returned None where a value is due: its body is still empty (`pass`)"
        )
    return np.asarray(value, dtype=np.float64)


def _changed(what: str, before: list, *after: np.ndarray) -> None:
    """An in-place update that left every array exactly as it was has not been written yet."""
    if all(np.array_equal(b, a) for b, a in zip(before, after)):
        raise NotImplementedYet(
            f"{what} left its arrays unchanged (they must be updated in place): its body is "
            "still empty, or it returns new arrays instead of writing into the given ones"
        )


def _softmax(z):
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def softmax_epoch_reference(X, y, theta, lr, batch):
    """Mini-batch SGD on the softmax loss, batches of consecutive rows (returns a new theta)."""
    theta = theta.copy()
    for s in range(0, X.shape[0], batch):
        Xb, yb = X[s : s + batch], y[s : s + batch]
        G = _softmax(Xb @ theta)
        G[np.arange(len(yb)), yb] -= 1
        theta -= lr * Xb.T @ G / len(yb)
    return theta


def nn_epoch_reference(X, y, W1, W2, lr, batch):
    """One SGD epoch of logits = ReLU(X W1) W2 on the softmax loss (returns new W1, W2)."""
    W1, W2 = W1.copy(), W2.copy()
    for s in range(0, X.shape[0], batch):
        Xb, yb = X[s : s + batch], y[s : s + batch]
        Z1 = np.maximum(Xb @ W1, 0)
        G2 = _softmax(Z1 @ W2)
        G2[np.arange(len(yb)), yb] -= 1
        G1 = (Z1 > 0) * (G2 @ W2.T)
        W1 -= lr * Xb.T @ G1 / len(yb)
        W2 -= lr * Z1.T @ G2 / len(yb)
    return W1, W2


def write_mnist(folder, images: np.ndarray, labels: np.ndarray):
    """Gzipped IDX files (the MNIST format) holding uint8 ``images`` (n, 28, 28) and ``labels``."""
    img = os.path.join(folder, "images-idx3-ubyte.gz")
    lab = os.path.join(folder, "labels-idx1-ubyte.gz")
    with gzip.open(img, "wb") as f:
        f.write(struct.pack(">IIII", 2051, len(images), 28, 28) + images.tobytes())
    with gzip.open(lab, "wb") as f:
        f.write(struct.pack(">II", 2049, len(labels)) + labels.tobytes())
    return img, lab


def _problem(m=50, n=5, k=3):
    rng = np.random.default_rng(1)
    X = rng.standard_normal((m, n)).astype(np.float32)
    y = rng.integers(0, k, m).astype(np.uint8)
    return X, y


def hw0_add(ctx):
    from simple_ml import add

    # numbers compared as float64 arrays (recorded, judged outside the worker), never with ==
    check_close("add(5, 6)", _given("add(5, 6)", add(5, 6)), lambda: 11.0, rtol=0, atol=0)
    check_close(
        "add(3.2, 1.0)", _given("add(3.2, 1.0)", add(3.2, 1.0)), lambda: 4.2, rtol=1e-12, atol=0
    )
    a, b = np.array([1.0, 2.0]), np.array([3.0, -1.0])
    check_close("add(a, b) on arrays", add(a, b), lambda: a + b, inputs={"a": a, "b": b})


def hw0_parse_mnist(ctx):
    from simple_ml import parse_mnist

    rng = np.random.default_rng(2)
    images = rng.integers(0, 256, (7, 28, 28)).astype(np.uint8)
    images[0, 0, 0], images[1, 0, 0] = 0, 255
    labels = rng.integers(0, 10, 7).astype(np.uint8)
    img, lab = write_mnist(ctx.scratch, images, labels)
    parsed = parse_mnist(img, lab)
    _given("parse_mnist(image_file, label_file)", parsed if parsed is None else 0)
    X, y = parsed
    X, y = np.asarray(X), np.asarray(y)
    require(X.dtype == np.float32, f"X must be float32, got {X.dtype}")
    require(y.dtype == np.uint8, f"y must be uint8, got {y.dtype}")
    check_close(
        "X from parse_mnist (7 images: shape (7, 784), pixel/255)",
        X,
        lambda: images.reshape(7, 784).astype(np.float32) / 255,
        hint="flatten each 28x28 image into a row and divide by 255",
    )
    check_close("y from parse_mnist", y, lambda: labels)


def hw0_softmax_loss(ctx):
    from simple_ml import softmax_loss

    rng = np.random.default_rng(3)
    Z = rng.standard_normal((6, 4)).astype(np.float32) * 3
    y = rng.integers(0, 4, 6).astype(np.uint8)

    def expected():
        zmax = Z.max(axis=1)
        return np.mean(zmax + np.log(np.exp(Z - zmax[:, None]).sum(1)) - Z[np.arange(6), y])

    check_close(
        "softmax_loss(Z, y)",
        _given("softmax_loss(Z, y)", softmax_loss(Z, y)),
        expected,
        inputs={"Z": Z, "y": y},
        rtol=1e-5,
        atol=1e-6,
        hint="mean over the batch of log(sum_j exp Z_ij) - Z_{i, y_i}",
    )


def hw0_softmax_regression_epoch(ctx):
    from simple_ml import softmax_regression_epoch

    X, y = _problem()
    theta = np.zeros((5, 3), dtype=np.float32)
    softmax_regression_epoch(X, y, theta, lr=0.2, batch=15)
    _changed("softmax_regression_epoch(X, y, theta, lr=0.2, batch=15)", [np.zeros((5, 3))], theta)
    check_close(
        "theta after softmax_regression_epoch(X, y, theta, lr=0.2, batch=15) "
        "(50 rows: the last batch has 5)",
        theta,
        lambda: softmax_epoch_reference(*_problem(), np.zeros((5, 3), np.float32), 0.2, 15),
        rtol=1e-4,
        atol=1e-5,
        inputs={"X": X, "y": y},
        hint="update theta in place, one step per batch of "
        "consecutive rows, gradient X_b^T (softmax(X_b theta) - I_y) / batch_size",
    )


def hw0_nn_epoch(ctx):
    from simple_ml import nn_epoch

    X, y = _problem()
    rng = np.random.default_rng(4)
    W1 = (rng.standard_normal((5, 8)) / np.sqrt(8)).astype(np.float32)
    W2 = (rng.standard_normal((8, 3)) / np.sqrt(3)).astype(np.float32)
    start = [W1.copy(), W2.copy()]
    nn_epoch(X, y, W1, W2, lr=0.2, batch=15)
    _changed("nn_epoch(X, y, W1, W2, lr=0.2, batch=15)", start, W1, W2)
    check_close(
        "W1 after nn_epoch(X, y, W1, W2, lr=0.2, batch=15)",
        W1,
        lambda: nn_epoch_reference(*_problem(), *start, 0.2, 15)[0],
        rtol=1e-4,
        atol=1e-5,
        hint="update W1 and W2 in place",
    )
    check_close(
        "W2 after nn_epoch(X, y, W1, W2, lr=0.2, batch=15)",
        W2,
        lambda: nn_epoch_reference(*_problem(), *start, 0.2, 15)[1],
        rtol=1e-4,
        atol=1e-5,
    )


def hw0_softmax_regression_epoch_cpp(ctx):
    try:
        from simple_ml_ext import softmax_regression_epoch_cpp
    except ImportError as exc:
        if "undefined symbol" in str(exc):  # compiled against another Python's headers
            raise AssertionError(
                f"cannot import simple_ml_ext ({exc}): src/simple_ml_ext.so was built for "
                f"another Python than this one ({sys.version.split()[0]}); delete it so the "
                "checker rebuilds it"
            ) from None
        raise AssertionError(
            f"cannot import simple_ml_ext ({exc}); was src/simple_ml_ext.cpp built?"
        ) from None
    X, y = _problem()
    theta = np.zeros((5, 3), dtype=np.float32)
    ctx.note(
        "softmax_regression_epoch_cpp(X, y, theta, lr=0.2, batch=15) with X (50, 5) "
        "float32, y (50,) uint8 in [0, 3), theta (5, 3) float32"
    )
    softmax_regression_epoch_cpp(X, y, theta, 0.2, 15)
    _changed("softmax_regression_epoch_cpp(X, y, theta, 0.2, 15)", [np.zeros((5, 3))], theta)
    check_close(
        "theta after softmax_regression_epoch_cpp(X, y, theta, lr=0.2, batch=15)",
        theta,
        lambda: softmax_epoch_reference(*_problem(), np.zeros((5, 3), np.float32), 0.2, 15),
        rtol=1e-4,
        atol=1e-5,
        inputs={"X": X, "y": y},
    )
