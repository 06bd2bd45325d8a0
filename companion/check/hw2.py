"""hw2 checks: initialisers, modules, optimizers, data, MLP-ResNet.

Random initialisers are checked against numpy's global RNG replayed with the same seed (the
course draws every tensor with one ``np.random.rand``/``randn`` call); modules against numpy
re-computations from their own parameters; gradients against finite differences.
"""

import numpy as np

from .common import OpCase, check_backward, check_forward, randn
from .diagnose import check_close, compare, require, to_numpy
from .hw0 import write_mnist


def _init(name, *args, **kw):
    import needle as ndl

    np.random.seed(42)
    return getattr(ndl.init, name)(*args, **kw)


def _uniform(shape, bound):
    np.random.seed(42)
    return np.random.rand(*shape) * 2 * bound - bound


def _normal(shape, std):
    np.random.seed(42)
    return np.random.randn(*shape) * std


def hw2_xavier_uniform(ctx):
    got = _init("xavier_uniform", 5, 8, gain=1.5)
    check_close(
        "init.xavier_uniform(5, 8, gain=1.5) with np.random.seed(42)",
        got,
        lambda: _uniform((5, 8), 1.5 * np.sqrt(6 / 13)),
        rtol=1e-5,
        atol=1e-6,
        hint="a = gain * sqrt(6 / (fan_in + fan_out)); draw with init.rand(fan_in, "
        "fan_out, low=-a, high=a)",
    )


def hw2_xavier_normal(ctx):
    got = _init("xavier_normal", 5, 8, gain=1.5)
    check_close(
        "init.xavier_normal(5, 8, gain=1.5) with np.random.seed(42)",
        got,
        lambda: _normal((5, 8), 1.5 * np.sqrt(2 / 13)),
        rtol=1e-5,
        atol=1e-6,
        hint="std = gain * sqrt(2 / (fan_in + fan_out)); draw with init.randn",
    )


def hw2_kaiming_uniform(ctx):
    got = _init("kaiming_uniform", 5, 8)
    check_close(
        "init.kaiming_uniform(5, 8) with np.random.seed(42)",
        got,
        lambda: _uniform((5, 8), np.sqrt(2) * np.sqrt(3 / 5)),
        rtol=1e-5,
        atol=1e-6,
        hint="bound = gain * sqrt(3 / fan_in) with gain = sqrt(2) for relu",
    )


def hw2_kaiming_normal(ctx):
    got = _init("kaiming_normal", 5, 8)
    check_close(
        "init.kaiming_normal(5, 8) with np.random.seed(42)",
        got,
        lambda: _normal((5, 8), np.sqrt(2) / np.sqrt(5)),
        rtol=1e-5,
        atol=1e-6,
        hint="std = gain / sqrt(fan_in) with gain = sqrt(2) for relu",
    )


def _t(a, requires_grad=False):
    import needle as ndl

    return ndl.Tensor(np.asarray(a, dtype=np.float32), requires_grad=requires_grad)


def _np(module_param):
    return to_numpy(module_param).astype(np.float64)


def hw2_linear(ctx):
    import needle as ndl

    np.random.seed(3)
    layer = ndl.nn.Linear(4, 3)

    def course_init():
        np.random.seed(3)
        w = np.random.rand(4, 3) * 2 * np.sqrt(6 / 4) - np.sqrt(6 / 4)
        return w, (np.random.rand(3, 1) * 2 * np.sqrt(6 / 3) - np.sqrt(6 / 3)).reshape(1, 3)

    check_close(
        "Linear(4, 3).weight with np.random.seed(3)",
        layer.weight,
        lambda: course_init()[0],
        rtol=1e-5,
        atol=1e-6,
        hint="weight = Parameter(init.kaiming_uniform(in_features, "
        "out_features)), created before the bias",
    )
    bias = to_numpy(layer.bias)
    check_close(
        "Linear(4, 3).bias with np.random.seed(3)",
        bias.reshape(1, 3) if bias.size == 3 else bias,
        lambda: course_init()[1],
        rtol=1e-5,
        atol=1e-6,
        hint="bias = kaiming_uniform(out_features, 1) reshaped to (1, out_features)",
    )
    x = randn(5, 4, seed=40)
    check_close(
        "Linear(4, 3)(x)",
        layer(_t(x)),
        lambda: x @ _np(layer.weight) + bias.reshape(1, -1),
        inputs={"x": x},
        rtol=1e-5,
        atol=1e-5,
    )


def hw2_relu(ctx):
    import needle as ndl

    x = randn(3, 4, seed=41)
    check_close("nn.ReLU()(x)", ndl.nn.ReLU()(_t(x)), lambda: np.maximum(x, 0), inputs={"x": x})


def hw2_sequential(ctx):
    import needle as ndl

    np.random.seed(5)
    l1, l2 = ndl.nn.Linear(4, 6), ndl.nn.Linear(6, 2)
    model = ndl.nn.Sequential(l1, ndl.nn.ReLU(), l2)
    x = randn(3, 4, seed=42)

    def expected():
        h = np.maximum(x @ _np(l1.weight) + _np(l1.bias), 0)
        return h @ _np(l2.weight) + _np(l2.bias)

    check_close(
        "Sequential(Linear(4, 6), ReLU(), Linear(6, 2))(x)",
        model(_t(x)),
        expected,
        inputs={"x": x},
        rtol=1e-5,
        atol=1e-5,
    )


def _lse(x, axes):
    m = x.max(axis=axes, keepdims=True)
    return (np.log(np.exp(x - m).sum(axis=axes, keepdims=True)) + m).squeeze(
        axis=axes if axes is not None else tuple(range(x.ndim))
    )


def hw2_logsumexp(ctx):
    import needle as ndl

    lse = ndl.ops.logsumexp
    cases = [
        OpCase(
            "logsumexp(a, axes=(1,))",
            lambda x: lse(x, axes=(1,)),
            lambda x: _lse(x, (1,)),
            {"a": randn(3, 4, seed=43)},
        ),
        OpCase(
            "logsumexp(a)", lambda x: lse(x), lambda x: _lse(x, None), {"a": randn(3, 4, seed=44)}
        ),
        OpCase(
            "logsumexp(a, axes=(0, 2))",
            lambda x: lse(x, axes=(0, 2)),
            lambda x: _lse(x, (0, 2)),
            {"a": randn(2, 3, 2, seed=45)},
        ),
    ]
    for case in cases:
        check_forward(case)
        check_backward(case)
    big = randn(2, 3, seed=46) + 1000.0
    check_forward(
        OpCase(
            "logsumexp(a, axes=(1,)) with entries near 1000 (stability)",
            lambda x: lse(x, axes=(1,)),
            lambda x: _lse(x, (1,)),
            {"a": big},
        )
    )


def _softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def hw2_softmax_loss(ctx):
    import needle as ndl

    z = randn(5, 4, seed=47, scale=2.0)
    y = np.random.default_rng(48).integers(0, 4, 5)
    zt = _t(z, requires_grad=True)
    # integer labels, as the course's tests pass them
    loss = ndl.nn.SoftmaxLoss()(zt, ndl.Tensor(y, requires_grad=False))
    z64 = z.astype(np.float64)
    check_close(
        "nn.SoftmaxLoss()(logits, y)",
        loss,
        lambda: np.mean(_lse(z64, (1,)) - z64[np.arange(5), y]),
        inputs={"logits": z, "y": y},
        rtol=1e-5,
        atol=1e-5,
    )
    loss.backward()
    check_close(
        "logits.grad after SoftmaxLoss()(logits, y).backward()",
        zt.grad,
        lambda: (_softmax(z64) - np.eye(4)[y]) / 5,
        inputs={"logits": z, "y": y},
        rtol=1e-4,
        atol=1e-5,
    )


def _norm_ref(x, eps=1e-5, axis=1):
    mean = x.mean(axis=axis, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axis, keepdims=True)
    return (x - mean) / np.sqrt(var + eps)


def hw2_layernorm(ctx):
    import needle as ndl

    layer = ndl.nn.LayerNorm1d(4)
    case = OpCase(
        "LayerNorm1d(4)(x)",
        lambda x: layer(x),
        lambda x: _norm_ref(x, axis=1),
        {"x": randn(3, 4, seed=49, scale=2.0)},
    )
    check_forward(case, rtol=1e-4, atol=1e-4)
    check_backward(case, via_backward=True)


def hw2_batchnorm(ctx):
    import needle as ndl

    x = randn(6, 3, seed=50, scale=2.0) + 1.0
    layer = ndl.nn.BatchNorm1d(3)
    case = OpCase(
        "BatchNorm1d(3)(x) in training mode",
        lambda t: layer(t),
        lambda a: _norm_ref(a, axis=0),
        {"x": x},
    )
    check_forward(case, rtol=1e-4, atol=1e-4)
    layer = ndl.nn.BatchNorm1d(3, momentum=0.1)
    layer(_t(x))
    check_close(
        "BatchNorm1d(3, momentum=0.1).running_mean after one training batch",
        layer.running_mean,
        lambda: 0.1 * x.mean(0),
        rtol=1e-4,
        atol=1e-5,
        inputs={"x": x},
        hint="running = (1 - momentum) * running + momentum * observed",
    )
    check_close(
        "BatchNorm1d(3, momentum=0.1).running_var after one training batch",
        layer.running_var,
        lambda: 0.9 + 0.1 * x.var(0),
        rtol=1e-4,
        atol=1e-5,
        inputs={"x": x},
        hint="the observed variance is the biased batch variance",
    )
    layer.eval()
    x2 = randn(4, 3, seed=51)
    check_close(
        "BatchNorm1d in eval mode (uses the running statistics)",
        layer(_t(x2)),
        lambda: (x2 - 0.1 * x.mean(0)) / np.sqrt(0.9 + 0.1 * x.var(0) + 1e-5),
        rtol=1e-4,
        atol=1e-5,
        inputs={"x": x2},
    )
    check_backward(
        OpCase(
            "BatchNorm1d(3)(x) in training mode",
            lambda t: ndl.nn.BatchNorm1d(3)(t),
            lambda a: _norm_ref(a, axis=0),
            {"x": x},
        ),
        via_backward=True,
    )


def hw2_flatten(ctx):
    import needle as ndl

    x = randn(2, 3, 4, seed=52)
    check_close("nn.Flatten()(x)", ndl.nn.Flatten()(_t(x)), lambda: x.reshape(2, 12))


def hw2_dropout(ctx):
    import needle as ndl

    x = randn(4, 5, seed=53)
    layer = ndl.nn.Dropout(p=0.4)
    np.random.seed(9)
    got = layer(_t(x))

    def mask():
        np.random.seed(9)
        return np.random.rand(4, 5) <= 0.6

    check_close(
        "nn.Dropout(p=0.4)(x) in training mode with np.random.seed(9)",
        got,
        lambda: x * mask() / 0.6,
        inputs={"x": x},
        rtol=1e-5,
        atol=1e-6,
        hint="mask = init.randb(*x.shape, p=1 - p); out = x * mask / (1 - p)",
    )
    np.random.seed(9)
    xt = _t(x, requires_grad=True)
    layer(xt).sum().backward()
    check_close(
        "x.grad after nn.Dropout(p=0.4)(x).sum().backward() with np.random.seed(9)",
        xt.grad,
        lambda: mask() / 0.6,
        inputs={"x": x},
        rtol=1e-5,
        atol=1e-6,
        hint="build the output from needle ops (x * mask / (1 - p)) so the gradient "
        "is the mask scaled by 1 / (1 - p)",
    )
    layer.eval()
    check_close("nn.Dropout(p=0.4)(x) in eval mode", layer(_t(x)), lambda: x, inputs={"x": x})


def hw2_residual(ctx):
    import needle as ndl

    np.random.seed(6)
    lin = ndl.nn.Linear(4, 4)
    x = randn(3, 4, seed=54)
    check_close(
        "Residual(Linear(4, 4))(x)",
        ndl.nn.Residual(lin)(_t(x)),
        lambda: x @ _np(lin.weight) + _np(lin.bias) + x,
        inputs={"x": x},
        rtol=1e-5,
        atol=1e-5,
    )


# Two parameters of different shapes, three steps. The settings are the course's grid (its
# tests run SGD at momentum 0 and 0.9, with and without weight decay, Adam with and without
# weight decay); every parameter has a gradient in every step, as in the course's tests.
# Separately, a robustness check the course never runs: in step 2 the second parameter has no
# gradient (it was not used); PyTorch skips it and leaves its state alone. Not doing so is
# reported as a warning beside the pass, not as a failure.
_OPT_SHAPES = ((3, 2), (4,))
_OPT_STEPS = 3
_NO_GRAD = (1, 1)  # (step, parameter) whose grad is None in the robustness check
SGD_GRID = ((0.0, 0.0), (0.0, 0.01), (0.9, 0.0), (0.9, 0.01))  # (momentum, weight_decay)
ADAM_GRID = (0.0, 0.01)  # weight_decay


def _grads(skip: bool = False):
    return [
        [
            None if skip and (s, k) == _NO_GRAD else randn(*shape, seed=60 + 10 * s + k)
            for k, shape in enumerate(_OPT_SHAPES)
        ]
        for s in range(_OPT_STEPS)
    ]


def _start():
    return [randn(*shape, seed=55 + k).astype(np.float64) for k, shape in enumerate(_OPT_SHAPES)]


def _run_optimizer(make, grads):
    """The student's parameters after one ``step()`` per entry of ``grads``."""
    import needle as ndl

    ps = [ndl.nn.Parameter(_t(w)) for w in _start()]
    opt = make(ps)
    for step in grads:
        for p, g in zip(ps, step):
            p.grad = None if g is None else _t(g)
        opt.step()
    return ps


def sgd_reference(lr, momentum, wd, grads):
    """The course's SGD in float64: g = grad + wd*p; u = momentum*u + (1 - momentum)*g;
    p -= lr*u, one u per parameter; a parameter whose grad is None is skipped."""
    ws = _start()
    us = [np.zeros_like(w) for w in ws]
    for step in grads:
        for k, g in enumerate(step):
            if g is None:
                continue
            us[k] = momentum * us[k] + (1 - momentum) * (g + wd * ws[k])
            ws[k] = ws[k] - lr * us[k]
    return ws


def adam_reference(lr, wd, grads, beta1=0.9, beta2=0.999, eps=1e-8):
    """The course's Adam in float64 (bias-corrected moments, t counting step() calls)."""
    ws = _start()
    ms = [np.zeros_like(w) for w in ws]
    vs = [np.zeros_like(w) for w in ws]
    for t, step in enumerate(grads, 1):
        for k, g in enumerate(step):
            if g is None:
                continue
            g = g + wd * ws[k]
            ms[k] = beta1 * ms[k] + (1 - beta1) * g
            vs[k] = beta2 * vs[k] + (1 - beta2) * g * g
            m_hat, v_hat = ms[k] / (1 - beta1**t), vs[k] / (1 - beta2**t)
            ws[k] = ws[k] - lr * m_hat / (np.sqrt(v_hat) + eps)
    return ws


def _check_optimizer(name, ps, expected, hint):
    """Each parameter after the steps against ``expected()`` (the reference's parameters)."""
    for k, p in enumerate(ps):
        check_close(
            f"parameter {k} (shape {_OPT_SHAPES[k]}) after {_OPT_STEPS} steps of {name} "
            "on two parameters",
            p,
            lambda k=k: expected()[k],
            rtol=1e-5,
            atol=1e-5,
            hint=hint,
        )


def _warn_unless_skipped(ctx, name, make, expected):
    """The robustness check: a parameter with grad None in step 2 is skipped, state untouched.
    A problem is a warning (the course's tests never leave a gradient None)."""
    what = (
        f"{name} when parameter {_NO_GRAD[1]} has grad None in step {_NO_GRAD[0] + 1} (a "
        "parameter the loss did not use; the course's tests never do this)"
    )
    try:
        ps = _run_optimizer(make, _grads(skip=True))
    except Exception as exc:
        ctx.warn(
            f"{what}: step() raised {type(exc).__name__}: {exc}. PyTorch skips such a "
            "parameter and leaves its state alone (`if p.grad is None: continue`); "
            "reset_grad() leaves grads None, so later homework may need this."
        )
        return
    for k, p in enumerate(ps):  # judged outside the worker: a mismatch is a warning there
        compare(
            f"{name}, grad None in step {_NO_GRAD[0] + 1}: parameter {k}",
            p,
            lambda k=k: expected()[k],
            rtol=1e-5,
            atol=1e-5,
            warning=f"{what}: parameter {k} differs from skipping it and leaving its state "
            "alone (PyTorch's behaviour)",
        )


def hw2_sgd(ctx):
    import needle as ndl

    for momentum, wd in SGD_GRID:
        name = f"SGD(lr=0.1, momentum={momentum:g}, weight_decay={wd:g})"

        def make(ps, momentum=momentum, wd=wd):
            return ndl.optim.SGD(ps, lr=0.1, momentum=momentum, weight_decay=wd)

        _check_optimizer(
            name,
            _run_optimizer(make, _grads()),
            lambda momentum=momentum, wd=wd: sgd_reference(0.1, momentum, wd, _grads()),
            "g = grad + wd*p; u = momentum*u + (1 - momentum)*g; p = p - lr*u (the "
            "course's averaged momentum), with one u per parameter; at momentum 0 this is "
            "p = p - lr*(grad + wd*p): weight decay applies at every momentum",
        )
    make = lambda ps: ndl.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01)  # noqa: E731
    _warn_unless_skipped(
        ctx,
        "SGD(lr=0.1, momentum=0.9, weight_decay=0.01)",
        make,
        lambda: sgd_reference(0.1, 0.9, 0.01, _grads(skip=True)),
    )


def hw2_adam(ctx):
    import needle as ndl

    for wd in ADAM_GRID:

        def make(ps, wd=wd):
            return ndl.optim.Adam(ps, lr=0.1, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=wd)

        _check_optimizer(
            f"Adam(lr=0.1, weight_decay={wd:g})",
            _run_optimizer(make, _grads()),
            lambda wd=wd: adam_reference(0.1, wd, _grads()),
            "bias-corrected moments m/(1-beta1^t), v/(1-beta2^t), one m and v per "
            "parameter, g = grad + wd*p, and t counting step() calls (once per step, not "
            "per parameter)",
        )
    make = lambda ps: ndl.optim.Adam(ps, lr=0.1, weight_decay=0.01)  # noqa: E731
    _warn_unless_skipped(
        ctx,
        "Adam(lr=0.1, weight_decay=0.01)",
        make,
        lambda: adam_reference(0.1, 0.01, _grads(skip=True)),
    )


def hw2_flip_horizontal(ctx):
    import needle as ndl

    img = randn(4, 5, 2, seed=56)
    for seed in range(6):
        np.random.seed(seed)
        got = ndl.data.RandomFlipHorizontal(p=0.5)(img)

        def flipped(seed=seed):
            np.random.seed(seed)
            return img[:, ::-1, :] if np.random.rand() < 0.5 else img

        check_close(
            f"RandomFlipHorizontal(p=0.5)(img) with np.random.seed({seed})",
            got,
            flipped,
            hint="img is H x W x C; flip when np.random.rand() < p, along W",
        )


def hw2_random_crop(ctx):
    import needle as ndl

    img = randn(6, 5, 2, seed=57)
    for seed in range(6):
        np.random.seed(seed)
        got = ndl.data.RandomCrop(padding=2)(img)

        def cropped(seed=seed):
            np.random.seed(seed)
            sx, sy = np.random.randint(-2, 3, size=2)
            pad = np.pad(img, ((2, 2), (2, 2), (0, 0)))
            return pad[2 + sx : 2 + sx + 6, 2 + sy : 2 + sy + 5, :]

        check_close(
            f"RandomCrop(padding=2)(img) with np.random.seed({seed})",
            got,
            cropped,
            hint="shift_x, shift_y = np.random.randint(-padding, padding + 1, size=2);"
            " zero-pad, then take the H x W window shifted by (shift_x, shift_y)",
        )


def hw2_mnist_dataset(ctx):
    import needle as ndl

    rng = np.random.default_rng(58)
    images = rng.integers(0, 256, (5, 28, 28)).astype(np.uint8)
    labels = rng.integers(0, 10, 5).astype(np.uint8)
    img, lab = write_mnist(ctx.scratch, images, labels)
    ds = ndl.data.MNISTDataset(img, lab)
    require(len(ds) == 5, f"len(MNISTDataset) is {len(ds)}, expected 5")
    x, y = ds[3]
    check_close(
        "MNISTDataset(...)[3] image (pixels / 255)",
        np.asarray(x).reshape(-1),
        lambda: images[3].reshape(-1) / 255.0,
        rtol=1e-6,
        atol=1e-6,
    )
    check_close("MNISTDataset(...)[3] label", np.asarray(y).reshape(-1)[:1], lambda: labels[3:4])
    ds = ndl.data.MNISTDataset(img, lab, transforms=[ndl.data.RandomFlipHorizontal(p=1.0)])
    x, _ = ds[2]
    check_close(
        "MNISTDataset(..., transforms=[RandomFlipHorizontal(p=1.0)])[2] image",
        np.asarray(x).reshape(-1),
        lambda: images[2][:, ::-1].reshape(-1) / 255.0,
        rtol=1e-6,
        atol=1e-6,
        hint="apply the transforms to the 28 x 28 x 1 image",
    )


def hw2_dataloader(ctx):
    import needle as ndl

    X = np.arange(20, dtype=np.float32).reshape(10, 2)
    y = np.arange(10, dtype=np.float32)
    ds = ndl.data.NDArrayDataset(X, y)
    for shuffle in (False, True):
        loader = ndl.data.DataLoader(ds, batch_size=4, shuffle=shuffle)
        np.random.seed(11)
        batches = list(loader)
        require(
            len(batches) == 3,
            f"DataLoader(10 items, batch_size=4, shuffle="
            f"{shuffle}) gave {len(batches)} batches, expected 3",
        )

        def rows(i, shuffle=shuffle):
            np.random.seed(11)
            order = np.random.permutation(10) if shuffle else np.arange(10)
            return np.array_split(order, range(4, 10, 4))[i]

        for i, batch in enumerate(batches):
            require(
                isinstance(batch, (tuple, list)) and len(batch) == 2,
                f"each batch must be a tuple (X, y), got {type(batch).__name__}",
            )
            require(
                all(isinstance(b, ndl.Tensor) for b in batch), "each batch must hold needle Tensors"
            )
            check_close(
                f"X of batch {i} from DataLoader(batch_size=4, shuffle={shuffle}) "
                "with np.random.seed(11) before iter()",
                batch[0],
                lambda i=i: X[rows(i)],
                hint="order = np.random.permutation(len(dataset)) when shuffling, "
                "batches = np.array_split(order, range(batch_size, n, batch_size))",
            )
            check_close(f"y of batch {i}", batch[1], lambda i=i: y[rows(i)])


def _mlp_params(model):
    return [_np(p) for p in model.parameters()]


def _mlp_forward(params, x, blocks, eps=1e-5):
    bn = 1.0 / np.sqrt(1.0 + eps)
    relu = lambda v: np.maximum(v, 0)  # noqa: E731
    h = relu(x @ params[0] + params[1])
    k = 2
    for _ in range(blocks):
        w1, b1, g1, c1, w2, b2, g2, c2 = params[k : k + 8]
        k += 8
        z = relu((h @ w1 + b1) * bn * g1 + c1)
        z = (z @ w2 + b2) * bn * g2 + c2
        h = relu(z + h)
    return h @ params[k] + params[k + 1]


def _mlp_model(blocks=2):
    from mlp_resnet import MLPResNet

    np.random.seed(12)
    return MLPResNet(6, hidden_dim=8, num_blocks=blocks, num_classes=3, drop_prob=0.3)


def hw2_mlp_resnet(ctx):
    from mlp_resnet import ResidualBlock

    np.random.seed(12)
    block = ResidualBlock(6, 4)
    shapes = [tuple(p.shape) for p in block.parameters()]
    require(
        len(shapes) == 8,
        f"ResidualBlock(6, 4) has {len(shapes)} parameters, expected 8 "
        "(Linear(6, 4), norm(4), Linear(4, 6), norm(6): weight and bias each)",
    )
    model = _mlp_model()
    params = _mlp_params(model)
    sizes = [p.size for p in params]
    expected = 6 * 8 + 8 + 2 * (8 * 4 + 4 + 2 * 4 + 4 * 8 + 8 + 2 * 8) + 8 * 3 + 3
    require(
        sum(sizes) == expected,
        f"MLPResNet(6, hidden_dim=8, num_blocks=2, num_classes=3) has {sum(sizes)} "
        f"parameter elements, expected {expected}; parameter shapes: "
        f"{[tuple(p.shape) for p in params]}",
    )
    shapes = [p.shape if p.ndim == 2 and p.shape[0] != 1 else (p.size,) for p in params]
    block_shapes = [(8, 4), (4,), (4,), (4,), (4, 8), (8,), (8,), (8,)]
    require(
        shapes == [(6, 8), (8,)] + 2 * block_shapes + [(8, 3), (3,)],
        f"MLPResNet's parameters are not in the course's order {[tuple(p.shape) for p in params]}",
    )
    model.eval()
    x = randn(5, 6, seed=59)
    check_close(
        "MLPResNet(6, 8, num_blocks=2, num_classes=3) in eval mode on x",
        model(_t(x)),
        lambda: _mlp_forward(
            [p.reshape(p.shape if p.ndim == 2 else (1, -1)) for p in params], x, 2
        ),
        inputs={"x": x},
        rtol=1e-4,
        atol=1e-4,
        hint="Linear, ReLU, ResidualBlocks(hidden, hidden // 2), Linear; each block is "
        "Residual(Linear, norm, ReLU, Dropout, Linear, norm) then ReLU",
    )


def hw2_mlp_resnet_epoch(ctx):
    from mlp_resnet import epoch

    import needle as ndl

    model = _mlp_model()
    X = randn(20, 6, seed=60)
    y = np.random.default_rng(61).integers(0, 3, 20).astype(np.uint8)
    params = [p.reshape(p.shape if p.ndim == 2 else (1, -1)) for p in _mlp_params(model)]

    def logits():
        return _mlp_forward(params, X, 2)

    loader = ndl.data.DataLoader(ndl.data.NDArrayDataset(X, y), batch_size=5)
    out = epoch(loader, model, opt=None)
    require(
        isinstance(out, tuple) and len(out) == 2,
        f"epoch(...) must return (error_rate, average_loss), got {out!r}",
    )
    check_close(
        "error rate from epoch(loader, model, opt=None) (20 samples, batches of 5)",
        np.float64(out[0]),
        lambda: np.mean(logits().argmax(1) != y),
        rtol=1e-6,
        atol=1e-6,
    )
    check_close(
        "average loss from epoch(loader, model, opt=None)",
        np.float64(out[1]),
        lambda: np.mean(_lse(logits(), (1,)) - logits()[np.arange(20), y]),
        rtol=1e-4,
        atol=1e-5,
        hint="evaluation mode: model.eval() when opt is None",
    )
