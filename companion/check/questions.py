"""The one registry of homework questions: the checker runs them, pytest selects by them.

Every question has an id such as ``hw1_matmul_backward``; the id is also the pytest marker that
this project's tests carry when they check that question (``pytest -m hw1_matmul_backward``), and
the name of the check function in ``companion/check/<homework>.py``. Only the course's API is
checked; this project's extensions have no question here.

This module imports nothing from needle, so the checker's worker can load it beside a
student's package.
"""

from __future__ import annotations

from dataclasses import dataclass

HOMEWORKS = ("hw0", "hw1", "hw2", "hw3", "hw4", "hw4_extra")

# hw1's ops, each checked forward and backward (the course's ops_mathematic.py).
HW1_OPS = (
    "add",
    "add_scalar",
    "multiply",
    "mul_scalar",
    "power",
    "power_scalar",
    "divide",
    "divide_scalar",
    "matmul",
    "summation",
    "broadcast_to",
    "reshape",
    "negate",
    "transpose",
    "log",
    "exp",
    "relu",
)


@dataclass(frozen=True)
class Question:
    """One homework question: ``id`` (also the pytest marker), its homework, a title, and
    ``help``: what the check does where it differs from the course's own test."""

    id: str
    hw: str
    title: str
    help: str = ""

    @property
    def marker(self) -> str:
        """The pytest marker of the tests that check this question."""
        return self.id


def _build() -> tuple[Question, ...]:
    table: list[tuple[str, str, str]] = [
        ("hw0", "add", "add(x, y)"),
        ("hw0", "parse_mnist", "parse_mnist: IDX files into normalised X and uint8 y"),
        ("hw0", "softmax_loss", "softmax_loss(Z, y) in numpy"),
        ("hw0", "softmax_regression_epoch", "softmax_regression_epoch (numpy SGD epoch)"),
        ("hw0", "nn_epoch", "nn_epoch: two-layer net SGD epoch in numpy"),
        ("hw0", "softmax_regression_epoch_cpp", "softmax_regression_epoch_cpp (C++)"),
    ]
    for op in HW1_OPS:
        table.append(("hw1", f"{op}_forward", f"{op} forward (compute)"))
        table.append(("hw1", f"{op}_backward", f"{op} backward (gradient)"))
    table += [
        ("hw1", "topo_sort", "find_topo_sort: post-order depth-first search"),
        ("hw1", "compute_gradient", "compute_gradient_of_variables (reverse mode)"),
        ("hw1", "softmax_loss", "softmax_loss(Z, y_one_hot) with needle ops"),
        ("hw1", "nn_epoch", "nn_epoch with needle Tensors"),
        ("hw2", "xavier_uniform", "init.xavier_uniform"),
        ("hw2", "xavier_normal", "init.xavier_normal"),
        ("hw2", "kaiming_uniform", "init.kaiming_uniform"),
        ("hw2", "kaiming_normal", "init.kaiming_normal"),
        ("hw2", "linear", "nn.Linear (initialisation and forward)"),
        ("hw2", "relu", "nn.ReLU"),
        ("hw2", "sequential", "nn.Sequential"),
        ("hw2", "logsumexp", "ops.logsumexp forward and backward"),
        ("hw2", "softmax_loss", "nn.SoftmaxLoss forward and backward"),
        ("hw2", "layernorm", "nn.LayerNorm1d forward and backward"),
        ("hw2", "flatten", "nn.Flatten"),
        ("hw2", "batchnorm", "nn.BatchNorm1d (training, running statistics, eval)"),
        ("hw2", "dropout", "nn.Dropout"),
        ("hw2", "residual", "nn.Residual"),
        ("hw2", "sgd", "optim.SGD (momentum, weight decay)"),
        ("hw2", "adam", "optim.Adam (bias correction, weight decay)"),
        ("hw2", "flip_horizontal", "data.RandomFlipHorizontal"),
        ("hw2", "random_crop", "data.RandomCrop"),
        ("hw2", "mnist_dataset", "data.MNISTDataset"),
        ("hw2", "dataloader", "data.DataLoader (order, batches, shuffling)"),
        ("hw2", "mlp_resnet", "ResidualBlock and MLPResNet"),
        ("hw2", "mlp_resnet_epoch", "mlp_resnet.epoch (error and loss)"),
        ("hw3", "reshape", "NDArray.reshape (a view)"),
        ("hw3", "permute", "NDArray.permute (a view)"),
        ("hw3", "broadcast_to", "NDArray.broadcast_to (a view)"),
        ("hw3", "getitem", "NDArray.__getitem__ (a view)"),
        ("hw3", "compact", "compact of strided views (C++)"),
        ("hw3", "setitem", "NDArray.__setitem__: ewise_setitem and scalar_setitem"),
        ("hw3", "ewise_ops", "element-wise ops: add mul div maximum eq ge log exp tanh"),
        ("hw3", "scalar_ops", "scalar ops: add mul div power maximum eq ge"),
        ("hw3", "reductions", "reduce_sum and reduce_max over an axis"),
        ("hw3", "matmul", "matmul (naive and tiled)"),
        ("hw4", "ndarray_flip", "NDArray.flip"),
        ("hw4", "ndarray_pad", "NDArray.pad"),
        ("hw4", "tanh", "ops.tanh forward and backward"),
        ("hw4", "stack", "ops.stack forward and backward"),
        ("hw4", "split", "ops.split forward and backward"),
        ("hw4", "flip", "ops.flip forward and backward"),
        ("hw4", "dilate", "ops.dilate and ops.undilate"),
        ("hw4", "conv_forward", "ops.conv forward"),
        ("hw4", "conv_backward", "ops.conv backward"),
        ("hw4", "nn_conv", "nn.Conv (NCHW, same padding)"),
        ("hw4", "cifar10_dataset", "data.CIFAR10Dataset"),
        ("hw4", "resnet9", "models.ResNet9"),
        ("hw4", "epoch_cifar10", "simple_ml.epoch_general_cifar10 (evaluation)"),
        ("hw4", "rnn_cell", "nn.RNNCell"),
        ("hw4", "rnn", "nn.RNN"),
        ("hw4", "lstm_cell", "nn.LSTMCell"),
        ("hw4", "lstm", "nn.LSTM"),
        ("hw4", "embedding", "nn.Embedding"),
        ("hw4", "ptb_corpus", "data.Dictionary and data.Corpus"),
        ("hw4", "batchify", "batchify and get_batch"),
        ("hw4", "language_model", "models.LanguageModel (rnn and lstm)"),
        ("hw4_extra", "attention", "nn.MultiHeadAttention"),
        ("hw4_extra", "attention_layer", "nn.AttentionLayer"),
        ("hw4_extra", "transformer_layer", "nn.TransformerLayer"),
        ("hw4_extra", "transformer", "nn.Transformer"),
    ]
    return tuple(
        Question(f"{hw}_{name}", hw, title, HELP.get(f"{hw}_{name}", ""))
        for hw, name, title in table
    )


_NO_COUNTER = (
    "The course's test also counts live tensors (TENSOR_COUNTER) after training, "
    "an artefact of its implementation; this check does not."
)

# Where the course's tests pin implementation artefacts (exact numbers from a seeded random
# stream or the MNIST/CIFAR files, live-tensor counts), these checks test the behaviour instead.
HELP: dict[str, str] = {
    "hw0_softmax_regression_epoch": "Checked on a small random problem whose last batch is "
    "partial, against a numpy re-computation; the course's tests use batches that divide the "
    "data and compare a weight norm after an epoch on MNIST.",
    "hw1_compute_gradient": "Besides one graph, differentiates composite expressions as the "
    "course's gradient_check(..., backward=True) does, and a gradient a second time.",
    "hw1_nn_epoch": "The course's test compares losses and weight norms after an epoch on "
    "MNIST; this check compares the weights after one epoch on a small random problem with a "
    "numpy re-computation, so it needs no data files.",
    "hw2_sgd": "Two parameters of different shapes, three steps, at momentum 0 and 0.9, with "
    "and without weight decay (the course's settings), against a numpy re-computation; the "
    "course's test trains a seeded model and compares its loss. A parameter whose grad is "
    "None (skipped by PyTorch, never tested by the course) is checked too: a problem there "
    "is a warning beside the pass. " + _NO_COUNTER,
    "hw2_adam": "Two parameters of different shapes, three steps, with and without weight "
    "decay, against a numpy re-computation; the course's test trains a seeded model and "
    "compares its loss. A parameter whose grad is None (skipped by PyTorch, never tested by "
    "the course) is checked too: a problem there is a warning beside the pass. " + _NO_COUNTER,
    "hw2_dropout": "Like the course's test, replays np.random with the same seed: the mask "
    "must come from one init.randb(*x.shape, p=1 - p) call.",
    "hw2_mlp_resnet_epoch": "The course's tests compare exact error and loss after seeded "
    "training on MNIST (they depend on the order of every random draw); this check runs an "
    "evaluation epoch and compares with a numpy forward pass from the model's own parameters. "
    + _NO_COUNTER,
    "hw4_resnet9": "The course's test compares the output of a seeded ResNet9 (it depends on "
    "the order of every random draw); this check compares the parameter count, the output "
    "shape and that the logits are finite.",
    "hw4_epoch_cifar10": "The course's test trains on CIFAR-10 and compares exact numbers; "
    "this check runs an evaluation epoch on a small random set against a numpy re-computation.",
    "hw4_language_model": "The course's test trains on Penn Treebank and compares exact "
    "losses; this check compares the model's output with its own Embedding, sequence model "
    "and Linear applied in turn.",
}


QUESTIONS: tuple[Question, ...] = _build()
BY_ID: dict[str, Question] = {q.id: q for q in QUESTIONS}


def questions_for(hw: str) -> list[Question]:
    """The questions of homework ``hw`` (one of ``HOMEWORKS``), in the order they are reported."""
    if hw not in HOMEWORKS:
        raise ValueError(f"unknown homework {hw!r}; expected one of {', '.join(HOMEWORKS)}")
    return [q for q in QUESTIONS if q.hw == hw]
