"""A blank hw1 apps/simple_ml.py in the course's style (written for this project's tests)."""

import sys

sys.path.append("python/")
import needle as ndl  # noqa: E402, F401


def parse_mnist(image_filesname, label_filename):
    ### BEGIN YOUR SOLUTION
    raise NotImplementedError()
    ### END YOUR SOLUTION


def softmax_loss(Z, y_one_hot):
    ### BEGIN YOUR SOLUTION
    raise NotImplementedError()
    ### END YOUR SOLUTION


def nn_epoch(X, y, W1, W2, lr=0.1, batch=100):
    ### BEGIN YOUR SOLUTION
    raise NotImplementedError()
    ### END YOUR SOLUTION
