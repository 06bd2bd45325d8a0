"""Helpers shared by the course's training loops (mlp_resnet, cifar_training, ptb_training)."""

from __future__ import annotations

import functools
import inspect

import needle as ndl
import needle.nn as nn


def model_device(model: nn.Module):
    """The device of the model's first parameter (None for a model without parameters)."""
    params = model.parameters()
    return params[0].device if params else None


def on_device(t: ndl.Tensor, device) -> ndl.Tensor:
    """``t`` on ``device`` as a tensor that needs no gradient (``t`` itself when already there)."""
    if device is None or t.device == device:
        return t
    return ndl.Tensor(t, device=device, requires_grad=False)


def loss_module(loss_fn) -> nn.Module:
    """An instance of ``loss_fn``: the course passes a class to train/evaluate and an instance
    to the epoch functions; both are accepted everywhere."""
    return loss_fn() if isinstance(loss_fn, type) else loss_fn


@functools.cache
def _takes_create_graph(tensor_type: type) -> bool:
    try:
        return "create_graph" in inspect.signature(tensor_type.backward).parameters
    except (TypeError, ValueError):
        return False


def backward_for_training(loss: ndl.Tensor) -> None:
    """``loss.backward()`` for a training step: without recording the gradients' own graph
    (``create_graph=False``, what PyTorch's ``backward()`` does) when the Tensor class in use
    takes that keyword, as this project's does; a course-layout needle (``NEEDLE_IMPL``) whose
    ``backward`` takes no keywords gets the plain call. The gradients are the same numbers
    either way; the training loops never differentiate them again."""
    if _takes_create_graph(type(loss)):
        loss.backward(create_graph=False)
    else:
        loss.backward()
