"""A blank hw0 skeleton in the course's style (written for this project's tests): every
function a student writes has the body ``pass``; the helpers below them are given code."""

import numpy as np

try:
    from simple_ml_ext import *  # noqa: F403
except ImportError:
    pass


def add(x, y):
    """A trivial 'add' function: returns the sum of x and y."""
    ### BEGIN YOUR CODE
    pass
    ### END YOUR CODE


def parse_mnist(image_filename, label_filename):
    """Read MNIST images (float32, rows of 784 pixels / 255) and labels (uint8)."""
    ### BEGIN YOUR CODE
    pass
    ### END YOUR CODE


def softmax_loss(Z, y):
    """The average softmax (cross-entropy) loss of logits Z for labels y."""
    ### BEGIN YOUR CODE
    pass
    ### END YOUR CODE


def softmax_regression_epoch(X, y, theta, lr=0.1, batch=100):
    """One epoch of mini-batch SGD for softmax regression, updating theta in place."""
    ### BEGIN YOUR CODE
    pass
    ### END YOUR CODE


def nn_epoch(X, y, W1, W2, lr=0.1, batch=100):
    """One epoch of SGD for logits = ReLU(X W1) W2, updating W1 and W2 in place."""
    ### BEGIN YOUR CODE
    pass
    ### END YOUR CODE


def loss_err(h, y):
    """Given: the softmax loss and the error rate of logits h."""
    return softmax_loss(h, y), np.mean(h.argmax(axis=1) != y)
