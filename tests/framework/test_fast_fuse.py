"""``needle.fast.fuse(model)`` computes what the course's model computes.

Each course model is built twice from one seed; one copy is fused. Outputs, every parameter's
gradient and the running statistics must agree (to float32 rounding: the fused kernels sum in
another order than the course's compositions) in training and evaluation, with the recording
backward, the graph-free backward and ``fast.backward``. Interior tensors behave as in the
course model: ``retain_grad`` on a block's output, ``.data`` replaced by a module in between,
and a ``forward`` replaced on a class or an instance (that module is then left alone).
"""

from __future__ import annotations

import numpy as np
import pytest

import needle as ndl
import needle.fast as fast
import needle.nn as nn
from companion.apps.language_model import FastLanguageModel, LanguageModel
from companion.apps.mlp_resnet import MLPResNet
from companion.apps.models import ConvBN, FastConvBN, ResNet9

pytestmark = pytest.mark.nn

RTOL, ATOL = 1e-3, 1e-4


def _seeded(build, seed=0):
    np.random.seed(seed)
    return build()


def _images(n=4, seed=1):
    return np.random.default_rng(seed).standard_normal((n, 3, 32, 32)).astype(np.float32)


def _mlp_batch(seed=1):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((8, 20)).astype(np.float32), rng.integers(0, 5, 8)


def _ids(seq_len=6, bs=3, vocab=11, seed=1):
    return np.random.default_rng(seed).integers(0, vocab, (seq_len, bs)).astype(np.float32)


MODELS = {
    "mlp_resnet": (
        lambda: MLPResNet(20, hidden_dim=16, num_blocks=2, num_classes=5),
        lambda m: m(ndl.Tensor(_mlp_batch()[0])),
        lambda: ndl.Tensor(_mlp_batch()[1].astype(np.float32)),
    ),
    "resnet9": (
        lambda: ResNet9(),
        lambda m: m(ndl.Tensor(_images())),
        lambda: ndl.Tensor(np.arange(4, dtype=np.float32) % 10),
    ),
    "lstm_lm": (
        lambda: LanguageModel(8, 11, hidden_size=10, num_layers=2, seq_model="lstm"),
        lambda m: m(ndl.Tensor(_ids()))[0],
        lambda: ndl.Tensor(_ids(seed=2).reshape(-1)),
    ),
    "transformer_lm": (
        lambda: LanguageModel(
            8, 11, hidden_size=12, num_layers=2, seq_model="transformer", seq_len=6
        ),
        lambda m: m(ndl.Tensor(_ids()))[0],
        lambda: ndl.Tensor(_ids(seed=2).reshape(-1)),
    ),
    "gan_discriminator": (
        lambda: nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2)),
        lambda m: m(ndl.Tensor(np.random.default_rng(3).standard_normal((8, 6)).astype("f4"))),
        lambda: ndl.Tensor(np.arange(8, dtype=np.float32) % 2),
    ),
}


def _step(name, model, backward, fused=False, seed=0):
    """Logits and loss of one forward, then the chosen backward; returns the numbers. The
    global generator is seeded first: both models draw the same dropout masks."""
    _, forward, labels = MODELS[name]
    np.random.seed(100 + seed)
    loss_fn = fast.fuse(nn.SoftmaxLoss()) if fused else nn.SoftmaxLoss()
    logits = forward(model)
    loss = loss_fn(logits, labels())
    backward(loss)
    grads = [p.grad.numpy() for p in model.parameters()]
    stats = [
        (m.running_mean.numpy(), m.running_var.numpy())
        for m in [model, *model.submodules()]
        if isinstance(m, nn.BatchNorm1d)
    ]
    return logits.numpy(), float(loss.numpy()), grads, stats


BACKWARDS = {
    "recording": lambda loss: loss.backward(),
    "graph_free": lambda loss: loss.backward(create_graph=False),
    "fast_backward": fast.backward,
}


def _close(a, b):
    np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("backward", sorted(BACKWARDS))
@pytest.mark.parametrize("name", sorted(MODELS))
def test_fused_model_trains_as_the_course_model(name, backward):
    build = MODELS[name][0]
    course, fused = _seeded(build), fast.fuse(_seeded(build))
    swapped = [m for m in [fused, *fused.submodules()] if hasattr(type(m), "_course_class")]
    assert swapped, "fuse swapped nothing"
    for step in range(2):  # the second step sees the first one's running statistics
        want = _step(name, course, BACKWARDS["recording"], seed=step)
        got = _step(name, fused, BACKWARDS[backward], fused=True, seed=step)
        _close(got[0], want[0])
        _close(got[1], want[1])
        for g, w in zip(got[2], want[2]):
            _close(g, w)
        for (gm, gv), (wm, wv) in zip(got[3], want[3]):
            _close(gm, wm)
            _close(gv, wv)
    course.eval(), fused.eval()
    _close(MODELS[name][1](fused).numpy(), MODELS[name][1](course).numpy())


def test_unfuse_restores_the_course_classes():
    model = _seeded(MODELS["resnet9"][0])
    before = [type(m) for m in [model, *model.submodules()]]
    fast.unfuse(fast.fuse(model))
    assert [type(m) for m in [model, *model.submodules()]] == before


def test_fuse_keeps_parameters_and_their_identity():
    model = _seeded(MODELS["lstm_lm"][0])
    params = model.parameters()
    fast.fuse(model)
    assert type(model) is FastLanguageModel
    assert all(a is b for a, b in zip(model.parameters(), params))


def test_retained_block_output_gets_the_course_gradient():
    """retain_grad() on a ConvBN block's output inside a fused ResNet-9 gets its adjoint."""
    grads = []
    for fuse in (False, True):
        model = _seeded(MODELS["resnet9"][0])
        if fuse:
            fast.fuse(model)
        blocks = model.model.modules
        h = blocks[1](blocks[0](ndl.Tensor(_images())))
        h.retain_grad()
        out = h
        for m in blocks[2:]:
            out = m(out)
        out.sum().backward()
        assert h.grad is not None
        grads.append(h.grad.numpy())
    _close(grads[1], grads[0])


class _ZeroFirstChannel(nn.Module):
    """Replaces its input's ``.data``: the next block must read the new values."""

    def forward(self, x):
        a = x.numpy()
        a[:, 0] = 0.0
        x.data = ndl.Tensor(a, device=x.device)
        return x


def test_data_replaced_between_fused_blocks_is_read():
    outs = []
    for fuse in (False, True):
        np.random.seed(0)
        model = nn.Sequential(ConvBN(3, 8, 3, 1), _ZeroFirstChannel(), ConvBN(8, 4, 3, 2))
        if fuse:
            fast.fuse(model)
            assert type(model.modules[0]) is FastConvBN
        outs.append(model(ndl.Tensor(_images(2))).numpy())
    _close(outs[1], outs[0])


def test_fuse_leaves_a_module_whose_forward_the_instance_replaced():
    np.random.seed(0)
    norm = nn.BatchNorm1d(4)
    norm.forward = lambda x: x * 2.0
    model = fast.fuse(nn.Sequential(nn.Linear(3, 4), norm, nn.ReLU()))
    assert type(norm) is nn.BatchNorm1d
    x = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    lin = model.modules[0]
    want = np.maximum(2.0 * (x @ lin.weight.numpy() + lin.bias.numpy()), 0)
    _close(model(ndl.Tensor(x)).numpy(), want)


def test_fused_sequential_calls_a_relu_whose_class_forward_was_patched(monkeypatch):
    """A class-level patch of nn.ReLU.forward runs in training as in evaluation."""
    np.random.seed(0)
    model = fast.fuse(nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU()))
    monkeypatch.setattr(nn.ReLU, "forward", lambda self, x: x * 0.0 - 1.0)
    x = ndl.Tensor(np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32))
    np.testing.assert_array_equal(model(x).numpy(), -np.ones((5, 4), np.float32))
    model.eval()
    np.testing.assert_array_equal(model(x).numpy(), -np.ones((5, 4), np.float32))


def test_fuse_leaves_a_subclass_alone():
    class MyNorm(nn.BatchNorm1d):
        pass

    model = fast.fuse(nn.Sequential(nn.Linear(3, 4), MyNorm(4)))
    assert type(model.modules[1]) is MyNorm


def test_register_checks_the_twin():
    class NotATwin(nn.Module):
        pass

    with pytest.raises(TypeError, match="subclass"):
        fast.register(nn.ReLU, NotATwin)
    with pytest.raises(TypeError, match="needle.nn.Module"):
        fast.fuse(object())


def test_a_fused_convbn_block_is_one_node_in_training():
    """The twin takes its fused branch (a twin that fell back to the layers would pass the
    equality tests too): in training the block's output is a permute of one ConvBatchNormTrain."""
    np.random.seed(0)
    block = fast.fuse(ConvBN(3, 8, 3, 1))
    out = block(ndl.Tensor(_images(2)))
    assert isinstance(out.inputs[0].op, fast.ops.ConvBatchNormTrain)
    block.eval()
    assert not isinstance(block(ndl.Tensor(_images(2))).inputs[0].op, fast.ops.ConvBatchNormTrain)
