"""Helpers shared by the course's training loops (mlp_resnet, cifar_training, ptb_training)."""

from __future__ import annotations

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
