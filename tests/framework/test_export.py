"""needle.export: every translated op, and whole models, run in onnxruntime and compared
with needle's own forward pass (relative error at most 1e-5 of the output's largest entry);
models whose export would ignore their input are refused.

onnxruntime is the oracle: an independent implementation of each ONNX operator. Needs the
lectures extra (onnx, onnxruntime).
"""

from __future__ import annotations

import numpy as np

# The lectures extra (installed by `make test`) provides onnx and onnxruntime.
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import pytest

import needle as ndl  # noqa: E402
import needle.nn as nn  # noqa: E402
from companion.apps.language_model import LanguageModel  # noqa: E402
from companion.apps.mlp_resnet import MLPResNet  # noqa: E402
from needle import export, fast, ops  # noqa: E402
from needle.autograd import TensorOp  # noqa: E402
from needle.export import to_onnx  # noqa: E402

pytestmark = pytest.mark.apps

RNG = np.random.default_rng(0)


def const(*shape, positive=False):
    """A needle constant (a parameter-like leaf) of random values."""
    a = RNG.standard_normal(shape).astype(np.float32)
    return ndl.Tensor(np.abs(a) + 0.5 if positive else a, requires_grad=True)


def run_both(f, x):
    """(onnxruntime's output, needle's output) for f traced at x."""
    model = to_onnx(f, x)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"input": x})[0], f(ndl.Tensor(x)).numpy()


def assert_close(got, want):
    assert got.shape == want.shape
    scale = max(float(np.abs(want).max()), 1e-30)
    assert float(np.abs(got - want).max()) <= 1e-5 * scale, (got, want)


W34, W45, B4 = const(3, 4), const(2, 4, 5), const(1, 4)
CONV_W, CONV_W2 = const(3, 3, 2, 4), const(1, 1, 2, 3)
CASES = {
    "add_broadcast": (lambda x: x + B4.broadcast_to((5, 4)), (5, 4)),
    "ewise_add_mul_div": (lambda x: (x + x) * x / (x * x + 1.0), (3, 4)),
    "ewise_pow": (lambda x: (x * x + 1.0) ** (x * 0.5), (3, 4)),
    "add_scalar": (lambda x: x + 2.5, (2, 3)),
    "mul_scalar": (lambda x: x * -1.5, (2, 3)),
    "div_scalar": (lambda x: x / 4.0, (2, 3)),
    "power_scalar": (lambda x: (x * x + 0.1) ** 3, (2, 3)),
    "negate": (lambda x: -x, (2, 3)),
    "exp": (lambda x: ops.exp(x), (2, 3)),
    "log": (lambda x: ops.log(x * x + 0.5), (2, 3)),
    "relu": (lambda x: ops.relu(x), (4, 5)),
    "tanh": (lambda x: ops.tanh(x), (4, 5)),
    "reshape": (lambda x: x.reshape((6, 2)) * 1.0, (3, 4)),
    "broadcast_to": (lambda x: x.broadcast_to((3, 2, 4)), (2, 1)),
    "transpose_default": (lambda x: x.transpose(), (2, 3, 4)),
    "transpose_axes": (lambda x: x.transpose((0, 2)), (2, 3, 4)),
    "sum_all": (lambda x: x.sum(), (3, 4)),
    "sum_axis": (lambda x: x.sum(1), (3, 4, 2)),
    "sum_axes": (lambda x: x.sum((0, 2)), (3, 4, 2)),
    "logsumexp": (lambda x: ops.logsumexp(x, axes=(1,)), (3, 5)),
    "matmul": (lambda x: x @ W34, (5, 3)),
    "matmul_batched": (lambda x: x @ W45, (2, 3, 4)),
    "conv_same": (lambda x: ops.conv(x, CONV_W, stride=1, padding=1), (2, 5, 5, 2)),
    "conv_strided": (lambda x: ops.conv(x, CONV_W, stride=2, padding=0), (1, 7, 6, 2)),
    "conv_1x1": (lambda x: ops.conv(x, CONV_W2, stride=1, padding=0), (2, 3, 3, 2)),
    "sum_no_axes": (lambda x: ops.summation(x, axes=()) * 2.0, (3, 4)),  # the identity
    "logsumexp_no_axes": (lambda x: ops.logsumexp(x, axes=()) * 2.0, (3, 4)),
    "stack": (lambda x: ops.stack([x, x * 2.0, -x], 1), (3, 4)),
    "stack_last": (lambda x: ops.stack([x, ops.exp(x)], -1), (3, 4)),
    "split": (lambda x: ops.split(x, 1)[2] * ops.split(x, 1)[0], (3, 4, 2)),
    "split_negative_axis": (lambda x: ops.split(x, -1)[1] + 1.0, (3, 4, 2)),
    "split_then_stack": (lambda x: ops.stack(list(ops.split(x, 0))[::-1], 1), (3, 4)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_op_matches_onnxruntime(name):
    f, shape = CASES[name]
    x = RNG.standard_normal(shape).astype(np.float32)
    got, want = run_both(f, x)
    assert_close(got, want)


def _train_then_eval(model, batch):
    """A few forward passes in training mode (BatchNorm's running statistics move), then eval."""
    model.train()
    for _ in range(3):
        model(ndl.Tensor(RNG.standard_normal(batch).astype(np.float32)))
    return model.eval()


def test_mlp_resnet_matches_onnxruntime(tmp_path):
    np.random.seed(1)
    model = _train_then_eval(MLPResNet(64, hidden_dim=32, num_blocks=2, num_classes=10), (16, 64))
    for batch in (1, 16):
        x = RNG.standard_normal((batch, 64)).astype(np.float32)
        path = tmp_path / f"mlp_resnet_{batch}.onnx"
        to_onnx(model, x, path=str(path))
        onnx.checker.check_model(onnx.load(str(path)), full_check=True)
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        assert_close(session.run(None, {"input": x})[0], model(ndl.Tensor(x)).numpy())


def test_conv_net_matches_onnxruntime():
    np.random.seed(2)
    model = nn.Sequential(
        nn.Conv(3, 8, 3),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv(8, 16, 3, stride=2),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(16 * 4 * 4, 10),
    )
    _train_then_eval(model, (4, 3, 8, 8))
    x = RNG.standard_normal((2, 3, 8, 8)).astype(np.float32)
    got, want = run_both(model, x)
    assert_close(got, want)


class _Unknown(TensorOp):
    def compute(self, a):
        return a

    def gradient(self, out_grad, node):
        return out_grad


def test_errors():
    x = np.ones((2, 3), np.float32)
    with pytest.raises(NotImplementedError, match="_Unknown"):
        to_onnx(lambda t: _Unknown()(t), x)
    with pytest.raises(TypeError, match="numpy array or a Tensor"):
        to_onnx(lambda t: t * 2, [[1.0, 2.0]])
    with pytest.raises(TypeError, match="must return a Tensor"):
        to_onnx(lambda t: [t * 2.0], x)
    with pytest.raises(ValueError, match="returned its input"):
        to_onnx(lambda t: t, x)
    # the fused twins (needle.fast) have no translation; the course's modules (compositions of
    # needle's ops) export. A fused op keeps input-dependent caches: "not supported" comes
    # before the trace comparison.
    np.random.seed(5)
    lstm = nn.LSTM(3, 4).eval()
    seq = RNG.standard_normal((5, 2, 3)).astype(np.float32)
    assert_close(*run_both(lambda t: lstm(t)[0], seq))
    with pytest.raises(NotImplementedError, match="not supported: LSTMLayer"):
        to_onnx(lambda t: fast.fuse(lstm)(t)[0], seq)
    rows = RNG.standard_normal((3, 4)).astype(np.float32)
    assert_close(*run_both(nn.LayerNorm1d(4).eval(), rows))
    with pytest.raises(NotImplementedError, match="not supported: LayerNormRows"):
        to_onnx(fast.fuse(nn.LayerNorm1d(4).eval()), rows)


def _fresh_ids(shape, vocab, seed):
    return np.random.default_rng(seed).integers(0, vocab, shape).astype(np.float32)


@pytest.mark.parametrize("seq_model", ["embedding", "rnn"])
def test_embedding_model_follows_its_input(seq_model):
    """nn.Embedding's one-hot matrix is built from the ids in Python; the export must still
    look the ids up (a Gather), so a second batch of ids gives needle's output for it."""
    np.random.seed(3)
    if seq_model == "embedding":
        model = nn.Embedding(20, 6).eval()
    else:
        lm = LanguageModel(8, 20, 6, num_layers=2, seq_model="rnn").eval()
        model = lambda t: lm(t)[0]  # noqa: E731 (the logits, not the hidden state)
    forward = nn.Embedding.forward
    proto = to_onnx(model, _fresh_ids((5, 3), 20, 0))
    assert nn.Embedding.forward is forward  # the trace's hook is removed again
    assert "Gather" in {node.op_type for node in proto.graph.node}
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    for seed in (1, 2):
        ids = _fresh_ids((5, 3), 20, seed)
        assert_close(session.run(None, {"input": ids})[0], model(ndl.Tensor(ids)).numpy())


W53 = const(5, 3)
READ = "reads the values of a tensor that depends on its input \\(numpy\\(\\) of a tensor of shape"
FOLDED = {  # models whose trace holds a value read from the input outside needle's ops
    "detach": (lambda t: t.detach() @ W53 + t @ W53, "constant of shape \\(4, 5\\)"),
    "numpy_read": (lambda t: ndl.Tensor(t.numpy() * 2.0) @ W53 + t @ W53, READ + " \\(4, 5\\)"),
    "scalar_from_numpy": (lambda t: t * float(t.numpy().max()), READ),
    "output_is_constant": (
        lambda t: t.detach() @ W53,
        "output does not depend on its input",
    ),
    "control_flow": (lambda t: t * 2.0 if float(t.numpy()[0, 0]) > 0 else ops.exp(t), READ),
    "read_of_an_interior_value": (lambda t: (t @ W53) * float((t @ W53).numpy().sum()), READ),
}


@pytest.mark.parametrize("name", list(FOLDED))
def test_refuses_values_read_from_the_input(name):
    f, message = FOLDED[name]
    x = np.abs(RNG.standard_normal((4, 5))).astype(np.float32) + 0.1
    with pytest.raises(ValueError, match=message):
        to_onnx(f, x, check_input=-x)  # -x: the control-flow case takes the other branch


def test_refuses_a_branch_on_a_read_value_that_the_check_input_does_not_flip():
    """A branch on x.numpy() that the example and the default check input both take the same
    way traced identically twice and was exported without a word, wrong on every input that
    takes the other branch. Every read of an input-dependent value is now refused, and the
    hook on Tensor.numpy is removed again afterwards; reading a parameter's value is fine."""
    w1, w2 = const(5, 3), const(5, 3) * 10.0
    numpy = ndl.Tensor.numpy
    x = np.abs(RNG.standard_normal((4, 5))).astype(np.float32)
    with pytest.raises(ValueError, match=READ + " \\(4, 5\\)"):
        to_onnx(lambda t: t @ (w1 if float(t.numpy().max()) < 50 else w2), x)
    assert ndl.Tensor.numpy is numpy
    scale = float(w2.numpy().max())  # oracle for the allowed read below
    got, want = run_both(lambda t: t @ w1 * float(w2.numpy().max()), x)
    assert_close(got, want)
    assert_close(want, (x @ w1.numpy()) * scale)
    assert ndl.Tensor.numpy is numpy


def test_refuses_training_mode():
    np.random.seed(4)
    model = nn.Sequential(nn.Linear(5, 4), nn.Dropout(0.5))
    x = RNG.standard_normal((3, 5)).astype(np.float32)
    with pytest.raises(
        ValueError, match="training mode \\(Dropout, Linear, Sequential\\).*model.eval\\(\\)"
    ):
        to_onnx(model, x)
    # behind a lambda the mode is invisible, but the mask differs between the two traces
    with pytest.raises(ValueError, match="constant of shape \\(3, 4\\).*changes with the input"):
        to_onnx(lambda t: model(t), x)
    model.eval()
    got, want = run_both(model, x)
    assert_close(got, want)


def test_check_catches_a_wrong_translation(monkeypatch):
    """The second-input check runs onnxruntime: a mistranslated op is caught before returning."""
    monkeypatch.setitem(export._UNARY, ops.Tanh, "Sigmoid")
    with pytest.raises(
        ValueError, match="disagrees with needle on a second input: 12 of 12 entries differ"
    ):
        to_onnx(lambda t: ops.tanh(t), RNG.standard_normal((3, 4)).astype(np.float32))
    proto = to_onnx(lambda t: ops.tanh(t), np.ones((3, 4), np.float32), check=False)
    assert [node.op_type for node in proto.graph.node] == ["Sigmoid", "Identity"]


def test_check_input_errors():
    emb = nn.Embedding(10, 4).eval()
    zeros = np.zeros((2, 3), np.float32)  # constant ids: the default perturbation is not ids
    with pytest.raises(ValueError, match="failed on the second \\(check\\) input.*whole numbers"):
        to_onnx(emb, zeros)
    to_onnx(emb, zeros, check_input=zeros + 3.0)
    with pytest.raises(
        ValueError, match="check_input must be a numpy array of the example's shape \\(2, 3\\)"
    ):
        to_onnx(emb, zeros, check_input=np.ones((3, 2), np.float32))
