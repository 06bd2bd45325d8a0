"""A blank hw4 apps/simple_ml.py in the course's style (written for this project's tests)."""

import sys

sys.path.append("python/")
import needle as ndl  # noqa: E402


def epoch_general_cifar10(dataloader, model, loss_fn=ndl.nn.SoftmaxLoss, opt=None):
    ### BEGIN YOUR SOLUTION
    raise NotImplementedError()
    ### END YOUR SOLUTION


def epoch_general_ptb(
    data,
    model,
    seq_len=40,
    loss_fn=ndl.nn.SoftmaxLoss,
    opt=None,
    clip=None,
    device=None,
    dtype="float32",
):
    ### BEGIN YOUR SOLUTION
    raise NotImplementedError()
    ### END YOUR SOLUTION
