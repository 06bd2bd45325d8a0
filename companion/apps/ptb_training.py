"""The course's Penn Treebank training loops (hw4): truncated back-propagation through time.

Re-exported from :mod:`companion.apps.simple_ml`. Each public function seeds ``np.random.seed(4)``
first, as the course does. ``progress=False`` turns the tqdm bars off (an extension).
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
from tqdm import tqdm  # plain bars: tqdm.auto warns in kernels without ipywidgets

import needle as ndl
import needle.nn as nn
from needle.data.datasets.ptb_dataset import get_batch

from .training_utils import backward_for_training, loss_module

__all__ = ["epoch_general_ptb", "train_ptb", "evaluate_ptb", "detach_state"]


def detach_state(h):
    """Cuts a hidden state out of the graph: a Tensor, a tuple/list of them, or None.

    Truncated BPTT carries the values of the last hidden state into the next chunk but not its
    history; without this every chunk's graph would hang on to all earlier chunks.
    """
    if h is None:
        return None
    if isinstance(h, (tuple, list)):
        return tuple(detach_state(x) for x in h)
    if hasattr(h, "detach"):
        return h.detach()
    raise TypeError(f"cannot detach a hidden state of type {type(h).__name__}")


def _check_data(data) -> np.ndarray:
    data = np.asarray(data)
    if data.ndim != 2 or data.shape[0] < 2:
        raise ValueError(
            f"data must be batchify's (nbatch, bs) array with nbatch >= 2, got shape {data.shape}"
        )
    return data


def epoch_general_ptb(
    data: np.ndarray,
    model: nn.Module,
    seq_len: int = 40,
    loss_fn: nn.Module = nn.SoftmaxLoss(),
    opt=None,
    clip: Optional[float] = None,
    device=None,
    dtype: str = "float32",
    progress: bool = True,
) -> Tuple[float, float]:
    """One pass over ``data`` (nbatch, bs) in chunks of ``seq_len`` rows.

    With ``opt`` the model is put in train mode and each chunk takes one optimizer step
    (gradient norm clipped to ``clip`` first, if given); without, eval mode, no gradients.
    The hidden state flows from chunk to chunk, detached. Returns (avg_acc, avg_loss): the
    fraction of next tokens predicted by the arg-max logit, and the mean cross-entropy per
    token (nats), both averaged over every token of the epoch.
    """
    np.random.seed(4)
    data = _check_data(data)
    if opt is None:
        model.eval()
    else:
        model.train()
    h = None
    total_loss, total_correct, total = 0.0, 0, 0
    starts = range(0, data.shape[0] - 1, seq_len)
    bar = tqdm(starts, disable=not progress, leave=False, desc="train" if opt else "eval")
    for i in bar:
        X, y = get_batch(data, i, seq_len, device=device, dtype=dtype)
        if opt is not None:
            opt.reset_grad()
        out, h = model(X, h)
        loss = loss_fn(out, y)
        if opt is not None:
            backward_for_training(loss)
            if clip is not None:
                opt.clip_grad_norm(clip)
            opt.step()
        h = detach_state(h)
        n = y.shape[0]
        loss_value = float(loss.numpy())
        total_loss += loss_value * n
        total_correct += int((out.numpy().argmax(axis=1) == y.numpy()).sum())
        total += n
        bar.set_postfix(loss=f"{loss_value:.3f}")
    return total_correct / total, total_loss / total


def train_ptb(
    model: nn.Module,
    data: np.ndarray,
    seq_len: int = 40,
    n_epochs: int = 1,
    optimizer=ndl.optim.SGD,
    lr: float = 4.0,
    weight_decay: float = 0.0,
    loss_fn=nn.SoftmaxLoss,
    clip: Optional[float] = None,
    device=None,
    dtype: str = "float32",
    progress: bool = True,
) -> Tuple[float, float]:
    """Trains for ``n_epochs`` with ``optimizer(model.parameters(), lr=lr,
    weight_decay=weight_decay)`` and a fresh ``loss_fn()``.

    Returns (avg_acc, avg_loss) of the last epoch.
    """
    np.random.seed(4)
    if isinstance(n_epochs, bool) or not isinstance(n_epochs, (int, np.integer)) or n_epochs < 1:
        raise ValueError(f"n_epochs must be a positive integer, got {n_epochs!r}")
    opt = optimizer(model.parameters(), lr=lr, weight_decay=weight_decay)
    loss = loss_module(loss_fn)
    acc = avg_loss = None
    for _ in tqdm(range(n_epochs), disable=not progress, leave=False, desc="epochs"):
        acc, avg_loss = epoch_general_ptb(
            data,
            model,
            seq_len=seq_len,
            loss_fn=loss,
            opt=opt,
            clip=clip,
            device=device,
            dtype=dtype,
            progress=progress,
        )
    return acc, avg_loss


def evaluate_ptb(
    model: nn.Module,
    data: np.ndarray,
    seq_len: int = 40,
    loss_fn=nn.SoftmaxLoss,
    device=None,
    dtype: str = "float32",
    progress: bool = True,
) -> Tuple[float, float]:
    """One evaluation pass (eval mode, no optimizer) with a fresh ``loss_fn()``.

    Returns (avg_acc, avg_loss); exp(avg_loss) is the perplexity.
    """
    np.random.seed(4)
    return epoch_general_ptb(
        data,
        model,
        seq_len=seq_len,
        loss_fn=loss_module(loss_fn),
        opt=None,
        device=device,
        dtype=dtype,
        progress=progress,
    )
