"""hw2's MLP-ResNet for MNIST: residual blocks of Linear/norm/ReLU/Dropout, an epoch loop, training.

Progress bars (tqdm) are on by default; turn them off per call with ``progress=False`` or for the
whole module with ``mlp_resnet.PROGRESS = False`` (an extension; the course has none).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Tuple

import numpy as np
from tqdm import tqdm  # plain bars: tqdm.auto warns in kernels without ipywidgets

import needle as ndl
import needle.nn as nn
from companion.data.digits import MNIST_FILES

from .training_utils import backward_for_training, model_device, on_device

__all__ = ["ResidualBlock", "MLPResNet", "epoch", "train_mnist", "PROGRESS"]

PROGRESS = True  # default for the ``progress`` keyword of epoch() and train_mnist()


# question: hw2_mlp_resnet
def ResidualBlock(
    dim: int, hidden_dim: int, norm=nn.BatchNorm1d, drop_prob: float = 0.1
) -> nn.Module:
    """x -> ReLU(x + norm(Linear(Dropout(ReLU(norm(Linear(x)))))))): (B, dim) -> (B, dim).

    The inner Linear maps dim -> hidden_dim and back; ``norm`` is called as ``norm(features)``.
    """
    return nn.Sequential(
        nn.Residual(
            nn.Sequential(
                nn.Linear(dim, hidden_dim),
                norm(hidden_dim),
                nn.ReLU(),
                nn.Dropout(drop_prob),
                nn.Linear(hidden_dim, dim),
                norm(dim),
            )
        ),
        nn.ReLU(),
    )


# question: hw2_mlp_resnet
def MLPResNet(
    dim: int,
    hidden_dim: int = 100,
    num_blocks: int = 3,
    num_classes: int = 10,
    norm=nn.BatchNorm1d,
    drop_prob: float = 0.1,
) -> nn.Module:
    """Linear(dim, hidden) -> ReLU -> num_blocks x ResidualBlock(hidden, hidden//2) ->
    Linear(hidden, classes).

    Maps (B, dim) inputs to (B, num_classes) logits.
    """
    return nn.Sequential(
        nn.Linear(dim, hidden_dim),
        nn.ReLU(),
        *[ResidualBlock(hidden_dim, hidden_dim // 2, norm, drop_prob) for _ in range(num_blocks)],
        nn.Linear(hidden_dim, num_classes),
    )


# question: hw2_mlp_resnet_epoch
def epoch(
    dataloader,
    model: nn.Module,
    opt: Optional[ndl.optim.Optimizer] = None,
    *,
    progress: Optional[bool] = None,
) -> Tuple[float, float]:
    """One pass over ``dataloader``: returns (error rate over all samples, mean of batch losses).

    With an optimizer the model is in train mode and each batch takes a step; without one it is
    in eval mode and nothing is updated. Seeds ``np.random.seed(4)`` first, as the course does.
    Batches are moved to the model's device when they differ. ``progress`` (an extension) shows
    a tqdm bar; None means the module's ``PROGRESS``.
    """
    np.random.seed(4)
    if opt is None:
        model.eval()
    else:
        model.train()
    device = model_device(model)
    loss_fn = nn.SoftmaxLoss()
    losses, errors, seen = [], 0, 0
    show = PROGRESS if progress is None else progress
    bar = tqdm(
        dataloader,
        total=len(dataloader) if hasattr(dataloader, "__len__") else None,
        disable=not show,
        leave=False,
        desc="train" if opt is not None else "eval",
    )
    for X, y in bar:
        X, y = on_device(X, device), on_device(y, device)
        logits = model(X)
        loss = loss_fn(logits, y)
        if opt is not None:
            opt.reset_grad()
            backward_for_training(loss)
            opt.step()
        labels = y.numpy().astype(np.int64)
        errors += int(np.sum(logits.numpy().argmax(axis=1) != labels))
        seen += labels.shape[0]
        losses.append(float(loss.numpy()))
        bar.set_postfix(loss=f"{losses[-1]:.4f}")
    if seen == 0:
        raise ValueError("epoch() got an empty dataloader")
    return errors / seen, float(np.mean(losses))


def train_mnist(
    batch_size: int = 100,
    epochs: int = 10,
    optimizer=ndl.optim.Adam,
    lr: float = 0.001,
    weight_decay: float = 0.001,
    hidden_dim: int = 100,
    data_dir: str = "data",
    *,
    progress: Optional[bool] = None,
) -> Tuple[float, float, float, float]:
    """Train an MLPResNet on the MNIST files in ``data_dir``; return (train_err, train_loss,
    test_err, test_loss).

    Reads ``train-*``/``t10k-*`` IDX ``.gz`` files (``make data``, or
    ``companion.data.write_digits_idx(dir)`` for the offline digits); the input width is the
    files' rows*cols (784 for MNIST). The train figures are those of the last epoch.
    """
    if epochs < 1:
        raise ValueError(f"epochs must be at least 1, got {epochs}")
    np.random.seed(4)
    files = {}
    for split, (img, lbl) in MNIST_FILES.items():
        files[split] = (Path(data_dir) / img, Path(data_dir) / lbl)
        for path in files[split]:
            if not path.is_file():
                raise FileNotFoundError(
                    f"{path} not found: run `make data` for MNIST, or "
                    f"companion.data.write_digits_idx({str(data_dir)!r}) for the offline digits"
                )
    train_data = ndl.data.MNISTDataset(*map(str, files["train"]))
    test_data = ndl.data.MNISTDataset(*map(str, files["test"]))
    model = MLPResNet(train_data.images.shape[1], hidden_dim)
    # Batches are made on the model's device, not copied there one by one.
    device = model_device(model)
    train_loader = ndl.data.DataLoader(train_data, batch_size, shuffle=True, device=device)
    test_loader = ndl.data.DataLoader(test_data, batch_size, device=device)
    opt = optimizer(model.parameters(), lr=lr, weight_decay=weight_decay)
    show = PROGRESS if progress is None else progress
    for _ in tqdm(range(epochs), disable=not show, desc="epochs"):
        train_err, train_loss = epoch(train_loader, model, opt, progress=progress)
    test_err, test_loss = epoch(test_loader, model, progress=progress)
    return train_err, train_loss, test_err, test_loss
