"""ResNet-9 (hw4) and the CIFAR-10 training loops, on the offline ShapesDataset."""

import gc

import numpy as np
import pytest
from conftest import DEVICES

import companion.data
import needle as ndl
import needle.fast as fast
from companion.apps.cifar_training import epoch_general_cifar10, evaluate_cifar10, train_cifar10
from companion.apps.models import ConvBN, ResNet9
from needle.fast import ops as ops_fused

pytestmark = [pytest.mark.conv, pytest.mark.apps]


def n_params(model):
    return sum(int(np.prod(p.shape)) for p in model.parameters())


@pytest.mark.hw4_resnet9
def test_resnet9_has_431946_parameters():
    # counted by hand: conv k*k*a*b + bias b + BatchNorm 2b per ConvBN, then the two Linears
    convbn = lambda a, b, k: k * k * a * b + b + 2 * b  # noqa: E731
    expected = (
        convbn(3, 16, 7)
        + convbn(16, 32, 3)
        + 2 * convbn(32, 32, 3)
        + convbn(32, 64, 3)
        + convbn(64, 128, 3)
        + 2 * convbn(128, 128, 3)
        + 128 * 128
        + 128
        + 128 * 10
        + 10
    )
    assert expected == 431946
    assert n_params(ResNet9()) == 431946
    assert n_params(ConvBN(3, 16, 7, 4)) == convbn(3, 16, 7)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.hw4_resnet9
def test_resnet9_forward_backward_shapes(device):
    np.random.seed(0)
    model = ResNet9(device=device)
    x = ndl.Tensor(np.random.randn(3, 3, 32, 32).astype(np.float32), device=device)
    out = model(x)
    assert out.shape == (3, 10) and out.device == device
    (out * ndl.Tensor(np.random.randn(3, 10).astype(np.float32), device=device)).sum().backward()
    for p in model.parameters():
        assert p.grad is not None and p.grad.shape == p.shape
        assert np.all(np.isfinite(p.grad.numpy()))
    assert np.abs(model.parameters()[0].grad.numpy()).max() > 0


@pytest.mark.parametrize("device", DEVICES)
def test_resnet9_directional_derivative(device):
    """<grad, d> against a central difference of sum(logits * R) along a random direction d
    (eval mode, so BatchNorm is a fixed affine map)."""
    np.random.seed(1)
    model = ResNet9(device=device)
    model.eval()
    x = ndl.Tensor(np.random.rand(2, 3, 32, 32).astype(np.float32), device=device)
    R = ndl.Tensor(np.random.randn(2, 10).astype(np.float32), device=device)
    params = model.parameters()
    base = [p.numpy().astype(np.float64) for p in params]
    dirs = [np.random.randn(*p.shape) for p in params]

    def loss_at(t):
        for p, b, d in zip(params, base, dirs):
            p.data = ndl.Tensor((b + t * d).astype(np.float32), device=device)
        return float(np.asarray((model(x) * R).sum().numpy()).reshape(-1)[0])

    loss_at(0.0)
    (model(x) * R).sum().backward()
    analytic = sum(float(np.sum(p.grad.numpy() * d)) for p, d in zip(params, dirs))
    eps = 1e-3
    numeric = (loss_at(eps) - loss_at(-eps)) / (2 * eps)
    assert numeric == pytest.approx(analytic, rel=2e-2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("create_graph", [True, False])
def test_convbn_equals_its_layers_called_in_turn(device, create_graph):
    """needle.fast's ConvBN keeps the convolution's channels-last result through the norm and
    the ReLU (one layout change each way for the block): the same output, gradients and
    running statistics, bit for bit, as calling its (fused) Conv, BatchNorm2d and ReLU one
    after another."""
    np.random.seed(3)
    block = fast.fuse(ConvBN(3, 4, 3, 2, device=device))
    x = ndl.Tensor(np.random.randn(2, 3, 6, 6).astype(np.float32), device=device)
    R = ndl.Tensor(np.random.randn(2, 4, 3, 3).astype(np.float32), device=device)
    params = block.parameters()

    def run(call):
        for p in params:
            p.grad = None
        out = call(x)
        (out * R).sum().backward(create_graph=create_graph)
        stats = [block.bn.running_mean.numpy(), block.bn.running_var.numpy()]
        return [out.numpy(), x.grad.numpy(), *(p.grad.numpy() for p in params), *stats]

    x.grad = None
    fused = run(block)
    block.bn.running_mean, block.bn.running_var = (
        ndl.init.zeros(4, device=device),
        ndl.init.ones(4, device=device),
    )
    x.grad = None
    layered = run(lambda t: block.relu(block.bn(block.conv(t))))
    for got, want in zip(fused, layered):
        np.testing.assert_array_equal(got, want)
    out = block(x)  # the layout change in is inside the node (ConvBatchNormTrain), one out
    assert _permutes(out) == 1 and isinstance(out.inputs[0].op, ops_fused.ConvBatchNormTrain)
    assert _permutes(block.relu(block.bn(block.conv(x)))) == 4
    with pytest.raises(ValueError, match=r"expects input of shape \(N, 3, H, W\)"):
        block(ndl.init.rand(2, 6, 6, 3, device=device))


@pytest.mark.parametrize("create_graph", [True, False])
def test_chained_fused_convbns_equal_their_layers(create_graph):
    """Two chained fused ConvBNs: the same output and gradients, bit for bit, as their layers
    called in turn; each block's layout change in is inside its node, one out each."""
    np.random.seed(8)
    first, second = fast.fuse(ConvBN(3, 4, 3, 1)), fast.fuse(ConvBN(4, 2, 3, 2))
    x = ndl.Tensor(np.random.randn(2, 3, 6, 6).astype(np.float32))
    params = first.parameters() + second.parameters()

    def run(call):
        for p in params:
            p.grad = None
        out = call()
        permutes = _permutes(out)  # before a backward without graph frees it
        out.sum().backward(create_graph=create_graph)
        return permutes, [out.numpy()] + [p.grad.numpy() for p in params]

    permutes, got = run(lambda: second(first(x)))
    for block in (first, second):
        dim = block.bn.dim
        block.bn.running_mean, block.bn.running_var = ndl.init.zeros(dim), ndl.init.ones(dim)
    _, want = run(lambda: second.relu(second.bn(second.conv(first.relu(first.bn(first.conv(x)))))))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert permutes == 2


def test_convbn_in_training_keeps_its_output_and_xhat_alone():
    """In training a fused ConvBN is one ConvBatchNormTrain node: until backward it holds the
    block's output and batch norm's x̂, not the convolution's output nor a channels-last copy
    of the NCHW input (both are made again where backward needs them)."""
    device = ndl.cpu()
    if ndl.backend_selection.BACKEND != "nd" or not device.enabled():
        pytest.skip("counts the compiled CPU module's bytes")
    np.random.seed(5)
    block = fast.fuse(ConvBN(8, 16, 3, 2, device=device))
    x = ndl.Tensor(np.random.randn(8, 8, 16, 16).astype(np.float32), device=device)
    out_bytes = 8 * 16 * 8 * 8 * 4
    mod = device.mod
    gc.collect()
    gc.disable()
    try:
        before = mod.memory_stats()["live_bytes"]
        out = block(x)
        kept = mod.memory_stats()["live_bytes"] - before
    finally:
        gc.enable()
    assert 2 * out_bytes <= kept <= 2 * out_bytes + 4096, kept  # output and x̂ (+ statistics)
    out.sum().backward()
    assert x.grad.shape == x.shape and block.conv.weight.grad is not None


def test_convbn_calls_a_replaced_activation_module():
    """The fused block's one-node norm + ReLU applies to nn.ReLU only: another activation module
    put in ``block.relu`` is called on the norm's output."""

    class Doubled(ndl.nn.Module):
        def forward(self, x):
            return ndl.ops.relu(x) * 2

    np.random.seed(4)
    block = fast.fuse(ConvBN(3, 4, 3, 1))
    x = ndl.Tensor(np.random.randn(2, 3, 5, 5).astype(np.float32))
    want = block(x).numpy() * 2
    block.bn.running_mean, block.bn.running_var = ndl.init.zeros(4), ndl.init.ones(4)
    block.relu = Doubled()
    np.testing.assert_array_equal(block(x).numpy(), want)


def _permutes(out: ndl.Tensor) -> int:
    """The Permute nodes of the graph that computed ``out``."""
    seen, stack, count = set(), [out], 0
    while stack:
        node = stack.pop()
        if id(node) not in seen:
            seen.add(id(node))
            count += isinstance(node.op, ndl.ops.Permute)
            stack.extend(node.inputs)
    return count


def _modules(module):
    """``module`` and every module inside it, depth first."""
    yield module
    for value in vars(module).values():
        items = value if isinstance(value, (list, tuple)) else [value]
        for item in items:
            if isinstance(item, ndl.nn.Module):
                yield from _modules(item)


def test_resnet9_rejects_wrong_image_shape():
    with pytest.raises(ValueError, match=r"\(N, 3, 32, 32\).*\(2, 3, 28, 28\)"):
        ResNet9()(ndl.init.rand(2, 3, 28, 28))


def _loader(n, batch, seed=0, shuffle=False):
    ds = companion.data.ShapesDataset(train=True, n=n, seed=seed)
    return ds, ndl.data.DataLoader(ds, batch_size=batch, shuffle=shuffle)


def _softmax_loss_np(logits, y):
    z = logits - logits.max(axis=1, keepdims=True)
    return np.log(np.exp(z).sum(axis=1)) - z[np.arange(len(y)), y]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.hw4_epoch_cifar10
def test_evaluate_cifar10_matches_numpy(device):
    np.random.seed(2)
    model = ResNet9(device=device)
    ds, loader = _loader(10, 4)  # batches of 4, 4, 2: averages weight by batch size
    before = [p.numpy().copy() for p in model.parameters()]
    acc, loss = evaluate_cifar10(model, loader, progress=False)
    assert not model.training
    for p, b in zip(model.parameters(), before):
        np.testing.assert_array_equal(p.numpy(), b)
    logits = model(ndl.Tensor(ds.X, device=device)).numpy().astype(np.float64)
    assert acc == pytest.approx(np.mean(np.argmax(logits, axis=1) == ds.y))
    assert loss == pytest.approx(_softmax_loss_np(logits, ds.y).mean(), rel=1e-4)
    # the course passes a loss class to evaluate_cifar10 and an instance to the epoch function
    acc2, loss2 = epoch_general_cifar10(loader, model, loss_fn=ndl.nn.SoftmaxLoss(), progress=False)
    assert (acc2, loss2) == pytest.approx((acc, loss))


@pytest.mark.parametrize("device", DEVICES)
def test_train_cifar10_fits_a_small_set_reproducibly(device):
    def run():
        np.random.seed(3)
        model = ResNet9(device=device)
        _, loader = _loader(32, 16, shuffle=True)
        log = []
        result = train_cifar10(
            model,
            loader,
            n_epochs=4,
            lr=0.01,
            progress=False,
            callback=lambda i, a, l: log.append((i, a, l)),
        )
        return model, result, log

    model, (acc, loss), log = run()
    assert model.training
    assert [i for i, _, _ in log] == [0, 1] * 4
    # the result is the last epoch's sample average (two batches of 16)
    assert acc == pytest.approx((log[-2][1] + log[-1][1]) / 2)
    assert loss == pytest.approx((log[-2][2] + log[-1][2]) / 2)
    first, last = (log[0][2] + log[1][2]) / 2, loss
    assert last < 0.5 * first, f"training loss went from {first:.3f} to {last:.3f}"
    # np.random.seed(4) at the start of each call makes a rerun identical
    _, again, _ = run()
    assert again == pytest.approx((acc, loss), rel=1e-6)


def test_train_cifar10_rejects_bad_epochs():
    _, loader = _loader(4, 4)
    with pytest.raises(ValueError, match="n_epochs"):
        train_cifar10(ResNet9(), loader, n_epochs=0, progress=False)


def test_resnet9_backward_without_graph_reaches_every_parameter():
    """A backward that records no graph (create_graph=False, the benchmarks' and PyTorch's
    kind) gives every parameter the gradient the recording backward gives: a fused block's
    input gradient must not depend on tensors made inside that backward asking for one."""
    np.random.seed(2)
    model = ResNet9()
    x = ndl.Tensor(np.random.randn(4, 3, 32, 32).astype(np.float32), requires_grad=False)
    y = ndl.Tensor(np.random.randint(0, 10, 4).astype(np.float32), requires_grad=False)
    grads = {}
    for create_graph in (True, False):
        for p in model.parameters():
            p.grad = None
        ndl.nn.SoftmaxLoss()(model(x), y).backward(create_graph=create_graph)
        assert all(p.grad is not None for p in model.parameters()), create_graph
        grads[create_graph] = [p.grad.numpy() for p in model.parameters()]
    for with_graph, without in zip(grads[True], grads[False]):
        np.testing.assert_allclose(without, with_graph, rtol=1e-5, atol=1e-6)
