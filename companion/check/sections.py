"""Where the lectures teach each homework question: one table, resolved against the notebooks.

``SECTIONS`` maps a question (its homework and the part of its id after ``hwN_``; an entry
ending in ``*`` covers every question that starts with it) to a lecture notebook and the start
of one of its ``## `` section headers. :func:`lecture_section` reads the header itself from the
notebook's Jupytext source (``notebooks/NN_topic.py``), so a renamed section shows up under its
current title (and ``tests/tooling/test_progress.py`` fails when an entry matches no header, or
more than one). Without the notebooks (an installed wheel) the notebook and the title given
here are shown.

This module imports nothing from needle.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from .questions import BY_ID

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"

# (homework, question name or prefix*, notebook stem, start of the section header)
SECTIONS: tuple[tuple[str, str, str, str], ...] = (
    ("hw0", "add", "01_softmax_regression", "The data"),
    ("hw0", "parse_mnist", "01_softmax_regression", "The data"),
    ("hw0", "softmax_loss", "01_softmax_regression", "The softmax loss"),
    ("hw0", "softmax_regression_epoch", "01_softmax_regression", "Training softmax regression"),
    ("hw0", "nn_epoch", "01_softmax_regression", "A two-layer neural network"),
    ("hw0", "softmax_regression_epoch_cpp", "01_softmax_regression", "The same epoch in C++"),
    ("hw1", "*_forward", "02_automatic_differentiation", "A computational graph"),
    ("hw1", "*_backward", "02_automatic_differentiation", "Reverse mode by hand"),
    ("hw1", "topo_sort", "02_automatic_differentiation", "Topological order"),
    ("hw1", "compute_gradient", "02_automatic_differentiation", "Differentiating a gradient"),
    ("hw1", "softmax_loss", "01_softmax_regression", "The softmax loss"),
    ("hw1", "nn_epoch", "03_nn_library", "One training step by hand"),
    ("hw2", "xavier_*", "03_nn_library", "Kaiming initialisation"),
    ("hw2", "kaiming_*", "03_nn_library", "Kaiming initialisation"),
    ("hw2", "linear", "03_nn_library", "Modules and parameters"),
    ("hw2", "relu", "03_nn_library", "Modules and parameters"),
    ("hw2", "sequential", "03_nn_library", "Modules and parameters"),
    ("hw2", "logsumexp", "03_nn_library", "A numerically stable softmax"),
    ("hw2", "softmax_loss", "03_nn_library", "A numerically stable softmax"),
    ("hw2", "layernorm", "04_training", "Normalization and dropout"),
    ("hw2", "flatten", "03_nn_library", "Modules and parameters"),
    ("hw2", "batchnorm", "04_training", "Normalization and dropout"),
    ("hw2", "dropout", "04_training", "Normalization and dropout"),
    ("hw2", "residual", "04_training", "An MLP-ResNet"),
    ("hw2", "sgd", "04_training", "Optimizers"),
    ("hw2", "adam", "04_training", "Optimizers"),
    ("hw2", "flip_horizontal", "04_training", "Transforms"),
    ("hw2", "random_crop", "04_training", "Transforms"),
    ("hw2", "mnist_dataset", "04_training", "Datasets"),
    ("hw2", "dataloader", "04_training", "The DataLoader"),
    ("hw2", "mlp_resnet*", "04_training", "An MLP-ResNet"),
    ("hw3", "reshape", "05_ndarray", "Shape, strides and offset"),
    ("hw3", "permute", "05_ndarray", "Views share memory"),
    ("hw3", "broadcast_to", "05_ndarray", "Broadcasting is a stride of 0"),
    ("hw3", "getitem", "05_ndarray", "Slicing is an offset"),
    ("hw3", "compact", "05_ndarray", "Why `compact` exists"),
    ("hw3", "setitem", "05_ndarray", "Slicing is an offset"),
    ("hw3", "ewise_ops", "06_hardware_acceleration", "Element-wise kernels"),
    ("hw3", "scalar_ops", "06_hardware_acceleration", "Element-wise kernels"),
    ("hw3", "reductions", "05_ndarray", "From a Python call to a C++ loop"),
    ("hw3", "matmul", "05_ndarray", "Three matmul kernels"),
    ("hw4", "ndarray_flip", "05_ndarray", "Flip"),
    ("hw4", "ndarray_pad", "07_convolutions", "Output sizes"),
    ("hw4", "tanh", "08_sequence_models", "The RNN recurrence"),
    ("hw4", "stack", "03_nn_library", "Ops with several outputs"),
    ("hw4", "split", "03_nn_library", "Ops with several outputs"),
    ("hw4", "flip", "05_ndarray", "Flip"),
    ("hw4", "dilate", "07_convolutions", "The gradient of a convolution"),
    ("hw4", "conv_forward", "07_convolutions", "A convolution is many small"),
    ("hw4", "conv_backward", "07_convolutions", "The gradient of a convolution"),
    ("hw4", "nn_conv", "07_convolutions", "im2col"),
    ("hw4", "cifar10_dataset", "07_convolutions", "ResNet-9 on images"),
    ("hw4", "resnet9", "07_convolutions", "ResNet-9 on images"),
    ("hw4", "epoch_cifar10", "07_convolutions", "ResNet-9 on images"),
    ("hw4", "rnn*", "08_sequence_models", "The RNN recurrence"),
    ("hw4", "lstm*", "08_sequence_models", "The LSTM"),
    ("hw4", "embedding", "08_sequence_models", "Training an LSTM language model"),
    ("hw4", "ptb_corpus", "08_sequence_models", "A corpus with a known best perplexity"),
    ("hw4", "batchify", "08_sequence_models", "Truncated back-propagation"),
    ("hw4", "language_model", "08_sequence_models", "Training an LSTM language model"),
    ("hw4_extra", "attention", "09_transformers", "Scaled dot-product attention"),
    ("hw4_extra", "attention_layer", "09_transformers", "Multi-head attention in a layer"),
    ("hw4_extra", "transformer*", "09_transformers", "A Transformer language model"),
)


def _matches(pattern: str, name: str) -> bool:
    if pattern.startswith("*"):
        return name.endswith(pattern[1:])
    if pattern.endswith("*"):
        return name.startswith(pattern[:-1])
    return name == pattern


def section_entry(qid: str) -> tuple[str, str]:
    """(notebook stem, header start) of question ``qid``: the exact entry wins over patterns."""
    q = BY_ID.get(qid)
    if q is None:
        raise ValueError(f"unknown question {qid!r}")
    name = qid[len(q.hw) + 1 :]
    rows = [r for r in SECTIONS if r[0] == q.hw and _matches(r[1], name)]
    exact = [r for r in rows if r[1] == name]
    if not (exact or rows):
        raise LookupError(f"question {qid} has no lecture section in companion/check/sections.py")
    _, _, notebook, start = (exact or rows)[0]
    return notebook, start


@functools.cache
def notebook_headers(stem: str, folder: Path = NOTEBOOKS) -> tuple[str, ...]:
    """The ``## `` section headers of ``folder/stem.py`` (empty when the file is not there)."""
    source = folder / f"{stem}.py"
    if not source.is_file():
        return ()
    return tuple(
        m.group(1).strip() for m in re.finditer(r"^# ## (.+)$", source.read_text(), flags=re.M)
    )


def _strip_number(header: str) -> str:
    return re.sub(r"^\d+\.\s*", "", header)


def matching_headers(stem: str, start: str, folder: Path = NOTEBOOKS) -> list[str]:
    """The headers of notebook ``stem`` whose title (without its ``N.``) begins with ``start``."""
    return [h for h in notebook_headers(stem, folder) if _strip_number(h).startswith(start)]


def section_ref(stem: str, start: str, folder: Path = NOTEBOOKS) -> str:
    """``notebooks/NN_topic, § N. Title`` for the section of notebook ``stem`` whose title begins
    with ``start`` (the title read from the notebook when it is there, else ``start``)."""
    found = matching_headers(stem, start, folder)
    return f"notebooks/{stem}, § {found[0] if found else start}"


def lecture_section(qid: str, folder: Path = NOTEBOOKS) -> str:
    """Where the lectures teach ``qid`` (see :func:`section_ref`)."""
    return section_ref(*section_entry(qid), folder)
