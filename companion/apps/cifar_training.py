"""hw4's CIFAR-10 training loops (re-exported by ``companion.apps.simple_ml``).

Each public function seeds ``np.random.seed(4)`` first, as the course does, so a shuffled
DataLoader visits the same order on every call. Batches are moved to the model's device (the
device of its first parameter) before the forward pass.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np
from tqdm import tqdm

import needle as ndl
import needle.nn as nn

from .training_utils import backward_for_training, loss_module, model_device, on_device

__all__ = ["epoch_general_cifar10", "train_cifar10", "evaluate_cifar10"]


# question: hw4_epoch_cifar10
def epoch_general_cifar10(
    dataloader,
    model: nn.Module,
    loss_fn=nn.SoftmaxLoss(),
    opt: Optional[ndl.optim.Optimizer] = None,
    *,
    progress: bool = True,
    callback: Optional[Callable[[int, float, float], None]] = None,
):
    """One pass over ``dataloader``; trains with ``opt`` if given, else evaluates.

    With an optimizer the model is put in train mode and updated after every batch; without one
    it is put in eval mode. Batches are (X (B, 3, 32, 32), y (B,)). Returns
    (avg_acc, avg_loss): the fraction of correct argmax predictions and the mean loss, both
    averaged over samples (so a short last batch counts for its size).

    Extensions (keyword-only, not in the course): ``progress=False`` hides the tqdm bar;
    ``callback(batch_index, batch_acc, batch_loss)`` is called after every batch (for learning
    curves).
    """
    np.random.seed(4)
    loss_fn = loss_module(loss_fn)
    if opt is None:
        model.eval()
    else:
        model.train()
    device = model_device(model)
    correct, total_loss, n_seen = 0, 0.0, 0
    bar = tqdm(
        dataloader, disable=not progress, leave=False, desc="train" if opt is not None else "eval"
    )
    for i, (X, y) in enumerate(bar):
        X, y = on_device(X, device), on_device(y, device)
        if opt is not None:
            opt.reset_grad()
        out = model(X)
        loss = loss_fn(out, y)
        if opt is not None:
            backward_for_training(loss)
            opt.step()
        labels = y.numpy().astype(np.int64).reshape(-1)
        batch_correct = int(np.sum(np.argmax(out.numpy(), axis=1) == labels))
        batch_loss = float(np.asarray(loss.numpy()).reshape(-1)[0])
        b = labels.shape[0]
        correct += batch_correct
        total_loss += batch_loss * b
        n_seen += b
        if callback is not None:
            callback(i, batch_correct / b, batch_loss)
        bar.set_postfix(loss=f"{total_loss / n_seen:.4f}", acc=f"{correct / n_seen:.3f}")
    if n_seen == 0:
        raise ValueError("epoch_general_cifar10: the dataloader yielded no batches")
    return correct / n_seen, total_loss / n_seen


def train_cifar10(
    model: nn.Module,
    dataloader,
    n_epochs: int = 1,
    optimizer=ndl.optim.Adam,
    lr: float = 0.001,
    weight_decay: float = 0.001,
    loss_fn=nn.SoftmaxLoss,
    *,
    progress: bool = True,
    callback: Optional[Callable[[int, float, float], None]] = None,
):
    """Train ``model`` for ``n_epochs`` with ``optimizer(model.parameters(), lr, weight_decay)``.

    Returns (avg_acc, avg_loss) of the last epoch (averaged over its samples, measured while
    training). ``progress`` and ``callback`` are passed to :func:`epoch_general_cifar10`
    (extensions).
    """
    np.random.seed(4)
    if isinstance(n_epochs, bool) or not isinstance(n_epochs, (int, np.integer)) or n_epochs < 1:
        raise ValueError(f"train_cifar10: n_epochs must be a positive int, got {n_epochs!r}")
    opt = optimizer(model.parameters(), lr=lr, weight_decay=weight_decay)
    loss = loss_module(loss_fn)
    for _ in range(n_epochs):
        avg_acc, avg_loss = epoch_general_cifar10(
            dataloader, model, loss_fn=loss, opt=opt, progress=progress, callback=callback
        )
    return avg_acc, avg_loss


def evaluate_cifar10(
    model: nn.Module, dataloader, loss_fn=nn.SoftmaxLoss, *, progress: bool = True
):
    """Evaluate ``model`` (eval mode, no updates) over ``dataloader``: (avg_acc, avg_loss)."""
    np.random.seed(4)
    return epoch_general_cifar10(
        dataloader, model, loss_fn=loss_module(loss_fn), opt=None, progress=progress
    )
