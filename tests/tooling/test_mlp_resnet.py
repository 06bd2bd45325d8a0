"""companion.apps.mlp_resnet (hw2): the architecture, a forward pass against numpy, epoch(),
train_mnist()."""

import numpy as np
import pytest

import companion.data
import needle as ndl
import needle.nn as nn
from companion.apps import mlp_resnet as mr

pytestmark = [pytest.mark.apps, pytest.mark.both_backends]
CPU = ndl.cpu()  # where nn.Linear puts its parameters by default (init's default device)


def _types(seq):
    return [type(m) for m in seq.modules]


@pytest.mark.hw2_mlp_resnet
def test_residual_block_structure():
    block = mr.ResidualBlock(6, 4, norm=nn.LayerNorm1d, drop_prob=0.3)
    assert _types(block) == [nn.Residual, nn.ReLU]
    inner = block.modules[0].fn
    assert _types(inner) == [
        nn.Linear,
        nn.LayerNorm1d,
        nn.ReLU,
        nn.Dropout,
        nn.Linear,
        nn.LayerNorm1d,
    ]
    assert inner.modules[0].weight.shape == (6, 4) and inner.modules[4].weight.shape == (4, 6)
    assert inner.modules[3].p == 0.3


@pytest.mark.hw2_mlp_resnet
def test_mlp_resnet_structure_and_parameter_count():
    dim, hidden, blocks, classes = 12, 10, 2, 7
    model = mr.MLPResNet(dim, hidden, blocks, classes)
    assert _types(model) == [nn.Linear, nn.ReLU] + [nn.Sequential] * blocks + [nn.Linear]
    half = hidden // 2
    per_block = (hidden * half + half) + 2 * half + (half * hidden + hidden) + 2 * hidden
    expected = (dim * hidden + hidden) + blocks * per_block + (hidden * classes + classes)
    assert sum(int(np.prod(p.shape)) for p in model.parameters()) == expected
    assert model(ndl.Tensor(np.random.randn(3, dim).astype(np.float32), device=CPU)).shape == (
        3,
        classes,
    )


def _linear(lin, x):
    return x @ lin.weight.numpy() + lin.bias.numpy().reshape(1, -1)


def _norm_eval(mod, h):
    w, b = mod.weight.numpy().reshape(1, -1), mod.bias.numpy().reshape(1, -1)
    if isinstance(mod, nn.BatchNorm1d):  # eval: the running statistics
        mean, var = mod.running_mean.numpy(), mod.running_var.numpy()
    else:
        mean, var = h.mean(axis=1, keepdims=True), h.var(axis=1, keepdims=True)
    return w * (h - mean) / np.sqrt(var + mod.eps) + b


@pytest.mark.parametrize("norm", [nn.BatchNorm1d, nn.LayerNorm1d])
@pytest.mark.hw2_mlp_resnet
def test_residual_block_eval_forward_matches_numpy(norm):
    block = mr.ResidualBlock(5, 3, norm=norm, drop_prob=0.5)
    block.eval()
    x = np.random.randn(4, 5).astype(np.float32)
    l1, n1, _, _, l2, n2 = block.modules[0].fn.modules
    h = np.maximum(_norm_eval(n1, _linear(l1, x)), 0)  # Dropout is the identity in eval mode
    expected = np.maximum(x + _norm_eval(n2, _linear(l2, h)), 0)
    np.testing.assert_allclose(
        block(ndl.Tensor(x, device=CPU)).numpy(), expected, rtol=1e-4, atol=1e-5
    )


@pytest.fixture(scope="module")
def digit_loaders():
    train = companion.data.DigitsDataset(train=True)
    test = companion.data.DigitsDataset(train=False)
    return ndl.data.DataLoader(train, 100, shuffle=True), ndl.data.DataLoader(test, 64)


def _loss64(Z, y):
    Z = Z.astype(np.float64)
    lse = np.log(np.exp(Z - Z.max(1, keepdims=True)).sum(1)) + Z.max(1)
    return np.mean(lse - Z[np.arange(len(y)), y])


@pytest.mark.hw2_mlp_resnet_epoch
def test_eval_epoch_matches_a_manual_pass(digit_loaders):
    _, test_loader = digit_loaders
    model = mr.MLPResNet(64, 16, num_blocks=1)
    before = [p.numpy().copy() for p in model.parameters()]
    err, loss = mr.epoch(test_loader, model, progress=False)
    assert not model.training
    wrong, losses = 0, []
    for X, y in test_loader:
        logits = model(ndl.Tensor(X.numpy(), device=CPU)).numpy()  # parameters live on cpu()
        labels = y.numpy().astype(int)
        wrong += np.sum(logits.argmax(1) != labels)
        losses.append(_loss64(logits, labels))
    assert err == wrong / 297
    assert abs(loss - np.mean(losses)) < 1e-5
    for b, p in zip(before, model.parameters()):
        np.testing.assert_array_equal(b, p.numpy())


def test_train_epochs_learn(digit_loaders):
    train_loader, test_loader = digit_loaders
    model = mr.MLPResNet(64, 32, num_blocks=2)
    opt = ndl.optim.Adam(model.parameters(), lr=0.01)
    first = mr.epoch(train_loader, model, opt, progress=False)
    assert model.training
    for _ in range(3):
        last = mr.epoch(train_loader, model, opt, progress=False)
    assert last[1] < first[1] and last[0] < first[0]
    test_err, _ = mr.epoch(test_loader, model, progress=False)
    assert test_err < 0.2  # chance is 0.9


def test_train_mnist_on_digit_idx_files(tmp_path):
    companion.data.write_digits_idx(tmp_path, image_size=8)
    kw = dict(
        batch_size=100,
        epochs=3,
        optimizer=ndl.optim.Adam,
        lr=0.01,
        weight_decay=0.001,
        hidden_dim=32,
        data_dir=str(tmp_path),
        progress=False,
    )
    result = mr.train_mnist(**kw)
    assert len(result) == 4 and all(isinstance(v, float) for v in result)
    train_err, train_loss, test_err, test_loss = result
    assert test_err < 0.2 and train_loss < 1.0
    assert mr.train_mnist(**kw) == result  # seeded: np.random.seed(4)


def test_train_mnist_without_files_says_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="make data"):
        mr.train_mnist(data_dir=str(tmp_path), progress=False)


def test_progress_switch(digit_loaders, capsys, monkeypatch):
    _, test_loader = digit_loaders
    model = mr.MLPResNet(64, 8, num_blocks=1)
    mr.epoch(test_loader, model, progress=False)
    assert capsys.readouterr().err == ""
    mr.epoch(test_loader, model, progress=True)
    assert "eval" in capsys.readouterr().err
    monkeypatch.setattr(mr, "PROGRESS", False)
    mr.epoch(test_loader, model)
    assert capsys.readouterr().err == ""
