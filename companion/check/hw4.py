"""hw4 checks: NDArray flip/pad, the new ops (tanh, stack, split, flip, dilate, conv), nn.Conv,
the CIFAR-10 and Penn Treebank data, RNN/LSTM, Embedding, ResNet9 and the language model.

Sequence models are compared with numpy loops computed from the module's own parameters.
"""

import os
import pickle

import numpy as np

from .common import OpCase, check_backward, check_forward, randn
from .conv_refs import (  # noqa: F401  (conv_ref, _conv_adjoints: used by tests)
    _conv_adjoints,
    _conv_backward_variants,
    _conv_forward_variants,
    _dilate_ref,
    _dilate_variants,
    _undilate_variants,
    conv_ref,
)
from .diagnose import (
    CheckFailure,
    check_adjoints,
    check_close,
    compare,
    numerical_vjp,
    present,
    require,
    to_numpy,
)
from .hw3 import arr, devices


def _ops():
    import needle as ndl

    return ndl.ops


def device():
    """The device the course's hw4 tests build every module and input on: the student's
    ``ndl.cpu()`` (the numpy device when that is not there), or None to pass none."""
    import needle as ndl

    for name in ("cpu", "cpu_numpy"):
        try:
            dev = getattr(ndl, name)()
            if getattr(dev, "enabled", lambda: True)():
                return dev
        except Exception:  # not there, or not built: try the next
            continue
    return None


def on_device() -> dict:
    """``device=`` for a module or Tensor, as the course's tests pass it (both, always)."""
    dev = device()
    return {} if dev is None else {"device": dev}


def _t(a, requires_grad=False):
    import needle as ndl

    return ndl.Tensor(np.asarray(a, dtype=np.float32), requires_grad=requires_grad, **on_device())


def hw4_ndarray_flip(ctx):
    a = randn(2, 3, 4, seed=90)
    for dev in devices():
        for axes in [(0,), (1, 2), (0, 1, 2)]:
            check_close(
                f"on {dev}: A.flip({axes})",
                arr(a, dev).flip(axes).numpy(),
                lambda axes=axes: np.flip(a, axes),
                hint="negative strides, offset at the last element",
            )


def hw4_ndarray_pad(ctx):
    a = randn(2, 3, 4, seed=91)
    for dev in devices():
        pads = ((0, 0), (1, 2), (2, 1))
        check_close(
            f"on {dev}: A.pad({pads})", arr(a, dev).pad(pads).numpy(), lambda: np.pad(a, pads)
        )


def _op_question(cases):
    for case in cases:
        check_forward(case, rtol=1e-4, atol=1e-5)
        check_backward(case, via_backward=True)


def hw4_tanh(ctx):
    _op_question(
        [OpCase("tanh(a)", lambda x: _ops().tanh(x), np.tanh, {"a": randn(3, 4, seed=92)})]
    )


def hw4_stack(ctx):
    _op_question(
        [
            OpCase(
                "stack([a, b, c], axis=1)",
                lambda x, y, z: _ops().stack([x, y, z], axis=1),
                lambda x, y, z: np.stack([x, y, z], axis=1),
                {"a": randn(2, 3, seed=93), "b": randn(2, 3, seed=94), "c": randn(2, 3, seed=95)},
            )
        ]
    )


def hw4_split(ctx):
    _op_question(
        [
            OpCase(
                "split(a, axis=1)",
                lambda x: _ops().split(x, axis=1),
                lambda x: tuple(x[:, i] for i in range(x.shape[1])),
                {"a": randn(2, 3, 2, seed=96)},
                outputs=3,
            )
        ]
    )


def hw4_flip(ctx):
    _op_question(
        [
            OpCase(
                "flip(a, axes=(0, 2))",
                lambda x: _ops().flip(x, (0, 2)),
                lambda x: np.flip(x, (0, 2)),
                {"a": randn(2, 3, 4, seed=97)},
            )
        ]
    )


def hw4_dilate(ctx):
    _op_question(
        [
            OpCase(
                "dilate(a, axes=(0, 1), dilation=1)",
                lambda x: _ops().dilate(x, (0, 1), 1),
                lambda x: _dilate_ref(x, (0, 1), 1),
                {"a": randn(2, 3, seed=98)},
                forward_variants=_dilate_variants((0, 1), 1),
            ),
            OpCase(
                "dilate(a, axes=(1,), dilation=2)",
                lambda x: _ops().dilate(x, (1,), 2),
                lambda x: _dilate_ref(x, (1,), 2),
                {"a": randn(2, 3, seed=99)},
                forward_variants=_dilate_variants((1,), 2),
            ),
            OpCase(
                "undilate(a, axes=(0, 1), dilation=1)",
                lambda x: _ops().undilate(x, (0, 1), 1),
                lambda x: x[::2, ::2],
                {"a": randn(4, 6, seed=100)},
                forward_variants=_undilate_variants((0, 1), 1),
            ),
        ]
    )


def _conv_cases():
    return [
        OpCase(
            f"conv(x, w, stride={s}, padding={p})",
            lambda x, w, s=s, p=p: _ops().conv(x, w, stride=s, padding=p),
            lambda x, w, s=s, p=p: conv_ref(x, w, s, p),
            {"x": randn(2, size, size, 2, seed=101 + s), "w": randn(3, 3, 2, 3, seed=103 + p)},
            variants=_conv_backward_variants(s, p),
            forward_variants=_conv_forward_variants(s, p),
        )
        for s, p, size in [(1, 0, 5), (1, 1, 5), (2, 1, 6), (2, 0, 8)]
    ]


def hw4_conv_forward(ctx):
    for case in _conv_cases():
        check_forward(case, rtol=1e-4, atol=1e-5)


def hw4_conv_backward(ctx):
    for case in _conv_cases():
        check_backward(case)


def hw4_nn_conv(ctx):
    import needle as ndl

    np.random.seed(7)
    layer = ndl.nn.Conv(2, 3, 3, stride=1, **on_device())

    def course_init():
        np.random.seed(7)
        bound = np.sqrt(2) * np.sqrt(3 / (2 * 9))
        return np.random.rand(3, 3, 2, 3) * 2 * bound - bound

    check_close(
        "nn.Conv(2, 3, 3).weight with np.random.seed(7)",
        layer.weight,
        course_init,
        rtol=1e-5,
        atol=1e-6,
        hint="kaiming_uniform(in*k*k, out*k*k, shape=(k, k, in, out))",
    )
    b = to_numpy(layer.bias)
    require(
        b.size == 3 and np.all(np.abs(b) <= 1 / np.sqrt(18) + 1e-6),
        f"nn.Conv(2, 3, 3).bias must be 3 values in ±1/sqrt(in*k*k), got {b}",
    )
    x = randn(2, 2, 5, 5, seed=104)
    w0 = to_numpy(layer.weight).astype(np.float64)

    def ref(xx, ww, bb):
        return (conv_ref(xx.transpose(0, 2, 3, 1), ww, 1, 1) + bb.reshape(-1)).transpose(0, 3, 1, 2)

    check_close(
        "nn.Conv(2, 3, 3)(x) on NCHW x (same padding k // 2)",
        layer(_t(x)),
        lambda: ref(x, w0, b),
        inputs={"x": x},
        rtol=1e-4,
        atol=1e-4,
    )
    # backward: x, weight and bias adjoints against finite differences of the reference
    g = np.random.default_rng(119).standard_normal((2, 3, 5, 5))
    xt = _t(x, requires_grad=True)
    (layer(xt) * _t(g)).sum().backward()
    grads = [xt.grad, layer.weight.grad, layer.bias.grad]
    for name, grad in zip(("x", "weight", "bias"), grads):
        present(grad, f"after nn.Conv(2, 3, 3)(x).backward(), {name}.grad is None")
    shapes = [x.shape, w0.shape, b.shape]
    check_adjoints(
        "nn.Conv(2, 3, 3)(x) backward",
        [
            to_numpy(v).reshape(n) if to_numpy(v).size == int(np.prod(n)) else v
            for v, n in zip(grads, shapes)
        ],
        lambda: numerical_vjp(ref, [x.astype(np.float64), w0, b.astype(np.float64)], g),
        ["x", "weight", "bias"],
        inputs={"x": x},
        out_grad=g,
    )


def hw4_cifar10_dataset(ctx):
    import needle as ndl

    rng = np.random.default_rng(105)
    folder = os.path.join(ctx.scratch, "cifar")
    os.makedirs(folder)
    data = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        d = {
            b"data": rng.integers(0, 256, (3, 3072)).astype(np.uint8),
            b"labels": [int(v) for v in rng.integers(0, 10, 3)],
        }
        data[name] = d
        with open(os.path.join(folder, name), "wb") as f:
            pickle.dump(d, f)
    train = ndl.data.CIFAR10Dataset(folder, train=True)
    require(
        len(train) == 15,
        f"CIFAR10Dataset(train=True) has {len(train)} items, expected 15 "
        "(five data_batch files of 3 images)",
    )
    x, y = train[4]
    check_close(
        "CIFAR10Dataset(train=True)[4] image (3, 32, 32), pixels / 255",
        np.asarray(x).reshape(3, 32, 32),
        lambda: data["data_batch_2"][b"data"][1].reshape(3, 32, 32) / 255.0,
        rtol=1e-6,
        atol=1e-6,
    )
    check_close(
        "CIFAR10Dataset(train=True)[4] label",
        np.asarray(y).reshape(-1)[:1],
        lambda: np.asarray(data["data_batch_2"][b"labels"][1:2]),
    )
    test = ndl.data.CIFAR10Dataset(folder, train=False)
    require(len(test) == 3, f"CIFAR10Dataset(train=False) has {len(test)} items, expected 3")


def hw4_resnet9(ctx):
    from models import ResNet9

    np.random.seed(8)
    model = ResNet9(**on_device())
    total = sum(int(np.prod(p.shape)) for p in model.parameters())
    convs = [
        (3, 16, 7),
        (16, 32, 3),
        (32, 32, 3),
        (32, 32, 3),
        (32, 64, 3),
        (64, 128, 3),
        (128, 128, 3),
        (128, 128, 3),
    ]
    expected = sum(k * k * a * b + 3 * b for a, b, k in convs) + 128 * 128 + 128 + 128 * 10 + 10
    compare(
        "ResNet9's parameter count",
        np.float64(total),
        lambda: np.float64(expected),
        rtol=0.0,
        atol=0.0,
    )
    require(
        total == expected,
        f"ResNet9 has {total} parameter elements, expected {expected} "
        "(ConvBN = Conv with bias + BatchNorm2d + ReLU, as in the course's figure)",
    )
    model.eval()
    out = model(_t(randn(2, 3, 32, 32, seed=106)))
    require(
        tuple(out.shape) == (2, 10),
        f"ResNet9 on (2, 3, 32, 32) gives shape {tuple(out.shape)}, expected (2, 10)",
    )
    finite = np.isfinite(to_numpy(out)).astype(np.float64)
    compare("ResNet9's logits are finite", finite, lambda: np.ones((2, 10)), rtol=0.0, atol=0.0)
    require(finite.all(), "ResNet9 produced non-finite logits")


def hw4_epoch_cifar10(ctx):
    from simple_ml import epoch_general_cifar10

    import needle as ndl

    np.random.seed(18)
    model = ndl.nn.Sequential(ndl.nn.Flatten(), ndl.nn.Linear(3 * 4 * 4, 10, **on_device()))
    X = randn(12, 3, 4, 4, seed=117)
    y = np.random.default_rng(118).integers(0, 10, 12).astype(np.uint8)
    w, b = to_numpy(model.modules[1].weight), to_numpy(model.modules[1].bias)

    def logits():
        return X.reshape(12, -1).astype(np.float64) @ w + b

    def loss():
        z = logits() - logits().max(axis=1, keepdims=True)
        return np.mean(np.log(np.exp(z).sum(axis=1)) - z[np.arange(12), y])

    loader = ndl.data.DataLoader(ndl.data.NDArrayDataset(X, y), batch_size=4)
    out = epoch_general_cifar10(loader, model, loss_fn=ndl.nn.SoftmaxLoss(), opt=None)
    require(
        isinstance(out, tuple) and len(out) == 2,
        f"epoch_general_cifar10 must return (average accuracy, average loss), got {out!r}",
    )
    check_close(
        "accuracy from epoch_general_cifar10(loader, model, opt=None) (12 samples, batches of 4)",
        np.float64(out[0]),
        lambda: np.mean(logits().argmax(1) == y),
        rtol=1e-6,
        atol=1e-6,
        hint="accuracy, not error: the fraction of correct predictions",
    )
    check_close(
        "average loss from epoch_general_cifar10(loader, model, opt=None)",
        np.float64(out[1]),
        loss,
        rtol=1e-4,
        atol=1e-5,
        hint="evaluation mode (model.eval()) when opt is None",
    )


def _sig(x):
    return 1 / (1 + np.exp(-x))


def _cell_params(cell):
    g = lambda name: to_numpy(getattr(cell, name)).astype(np.float64)  # noqa: E731
    w_ih, w_hh = g("W_ih"), g("W_hh")
    b = 0
    if getattr(cell, "bias_ih", None) is not None:
        b = g("bias_ih").reshape(-1) + g("bias_hh").reshape(-1)
    return w_ih, w_hh, b


def _rnn_step(cell, x, h, relu=False):
    w_ih, w_hh, b = _cell_params(cell)
    z = x @ w_ih + h @ w_hh + b
    return np.maximum(z, 0) if relu else np.tanh(z)


def _lstm_step(cell, x, h, c):
    w_ih, w_hh, b = _cell_params(cell)
    z = x @ w_ih + h @ w_hh + b
    i, f, g, o = np.split(z, 4, axis=1)
    c = _sig(f) * c + _sig(i) * np.tanh(g)
    return _sig(o) * np.tanh(c), c


def hw4_rnn_cell(ctx):
    import needle as ndl

    for nl in ("tanh", "relu"):
        np.random.seed(9)
        cell = ndl.nn.RNNCell(3, 4, bias=True, nonlinearity=nl, **on_device())
        w_ih, w_hh, _ = _cell_params(cell)
        require(
            w_ih.shape == (3, 4) and w_hh.shape == (4, 4),
            f"RNNCell(3, 4): W_ih must be (3, 4) and W_hh (4, 4), got {w_ih.shape}, {w_hh.shape}",
        )
        x, h = randn(2, 3, seed=107), randn(2, 4, seed=108)
        check_close(
            f"RNNCell(3, 4, nonlinearity={nl!r})(x, h)",
            cell(_t(x), _t(h)),
            lambda cell=cell, nl=nl: _rnn_step(cell, x, h, nl == "relu"),
            inputs={"x": x, "h": h},
            rtol=1e-4,
            atol=1e-5,
            hint="h' = act(x W_ih + bias_ih + h W_hh + bias_hh)",
        )
    check_close(
        "RNNCell(3, 4, nonlinearity='relu')(x) with h=None (zeros)",
        cell(_t(x)),
        lambda: _rnn_step(cell, x, np.zeros((2, 4)), relu=True),
        rtol=1e-4,
        atol=1e-5,
    )
    np.random.seed(9)
    cell = ndl.nn.RNNCell(3, 4, bias=True, nonlinearity="tanh", **on_device())
    b = _cell_params(cell)[2]
    _check_cell_gradients(
        "RNNCell(3, 4)(x, h)",
        cell,
        lambda xt, ht: cell(xt, ht),
        lambda xx, hh, wi, wh: np.tanh(xx @ wi + hh @ wh + b),
        x,
        h,
    )


def hw4_rnn(ctx):
    import needle as ndl

    np.random.seed(10)
    rnn = ndl.nn.RNN(3, 4, num_layers=2, **on_device())
    x, h0 = randn(5, 2, 3, seed=109), randn(2, 2, 4, seed=110)
    out, hn = rnn(_t(x), _t(h0))

    def run():
        seq, hs = x.astype(np.float64), []
        for layer, cell in enumerate(rnn.rnn_cells):
            h, outs = h0[layer], []
            for t in range(len(seq)):
                h = _rnn_step(cell, seq[t], h)
                outs.append(h)
            seq, hs = np.stack(outs), hs + [h]
        return seq, np.stack(hs)

    check_close(
        "RNN(3, 4, num_layers=2)(X, h0) output (T, B, hidden)",
        out,
        lambda: run()[0],
        inputs={"X": x, "h0": h0},
        rtol=1e-4,
        atol=1e-5,
    )
    check_close(
        "RNN(3, 4, num_layers=2)(X, h0) h_n (layers, B, hidden)",
        hn,
        lambda: run()[1],
        rtol=1e-4,
        atol=1e-5,
    )


def _check_cell_gradients(what, cell, run, ref, x, h):
    """backward() of Σ run(x, h)·g: the adjoints of x, h, W_ih and W_hh against finite
    differences of ``ref(x, h, W_ih, W_hh)`` (the biases held at the cell's values)."""

    w_ih, w_hh, _ = _cell_params(cell)
    g = np.random.default_rng(120).standard_normal((x.shape[0], w_hh.shape[0]))
    xt, ht = (_t(v, requires_grad=True) for v in (x, h))
    (run(xt, ht) * _t(g)).sum().backward()
    grads = [xt.grad, ht.grad, cell.W_ih.grad, cell.W_hh.grad]
    names = ["x", "h", "W_ih", "W_hh"]
    for name, grad in zip(names, grads):
        present(grad, f"after {what}.backward(), {name}.grad is None")
    check_adjoints(
        f"{what} backward",
        [to_numpy(v) for v in grads],
        lambda: numerical_vjp(ref, [x.astype(np.float64), h.astype(np.float64), w_ih, w_hh], g),
        names,
        inputs={"x": x, "h": h},
        out_grad=g,
    )


def hw4_lstm_cell(ctx):
    import needle as ndl

    np.random.seed(11)
    cell = ndl.nn.LSTMCell(3, 4, **on_device())
    x, h, c = randn(2, 3, seed=111), randn(2, 4, seed=112), randn(2, 4, seed=113)
    got = cell(_t(x), (_t(h), _t(c)))
    check_close(
        "LSTMCell(3, 4)(x, (h, c)) h'",
        got[0],
        lambda: _lstm_step(cell, x, h, c)[0],
        inputs={"x": x, "h": h, "c": c},
        rtol=1e-4,
        atol=1e-5,
        hint="gates i, f, g, o are the four column blocks of "
        "x W_ih + h W_hh + biases; c' = f c + i g; h' = o tanh(c')",
    )
    check_close(
        "LSTMCell(3, 4)(x, (h, c)) c'",
        got[1],
        lambda: _lstm_step(cell, x, h, c)[1],
        rtol=1e-4,
        atol=1e-5,
    )
    b = _cell_params(cell)[2]

    def h_next(xx, hh, wi, wh):
        i, f, gg, o = np.split(xx @ wi + hh @ wh + b, 4, axis=1)
        return _sig(o) * np.tanh(_sig(f) * c + _sig(i) * np.tanh(gg))

    _check_cell_gradients(
        "LSTMCell(3, 4)(x, (h, c))[0]", cell, lambda xt, ht: cell(xt, (ht, _t(c)))[0], h_next, x, h
    )


def hw4_lstm(ctx):
    import needle as ndl

    np.random.seed(12)
    lstm = ndl.nn.LSTM(3, 4, num_layers=2, **on_device())
    x = randn(5, 2, 3, seed=114)
    h0, c0 = randn(2, 2, 4, seed=115), randn(2, 2, 4, seed=116)
    out, (hn, cn) = lstm(_t(x), (_t(h0), _t(c0)))

    def run():
        seq, hs, cs = x.astype(np.float64), [], []
        for layer, cell in enumerate(lstm.lstm_cells):
            h, c, outs = h0[layer], c0[layer], []
            for t in range(len(seq)):
                h, c = _lstm_step(cell, seq[t], h, c)
                outs.append(h)
            seq, hs, cs = np.stack(outs), hs + [h], cs + [c]
        return seq, np.stack(hs), np.stack(cs)

    for i, what in enumerate(("(X, (h0, c0)) output", "h_n", "c_n")):
        check_close(
            f"LSTM(3, 4, num_layers=2){' ' * (i > 0)}{what}",
            (out, hn, cn)[i],
            lambda i=i: run()[i],
            rtol=1e-4,
            atol=1e-5,
        )


def hw4_embedding(ctx):
    import needle as ndl

    np.random.seed(13)
    emb = ndl.nn.Embedding(7, 3, **on_device())
    w = to_numpy(emb.weight)
    require(w.shape == (7, 3), f"Embedding(7, 3).weight has shape {w.shape}, expected (7, 3)")
    ids = np.array([[0, 6], [3, 3], [1, 5]], dtype=np.float32)
    check_close(
        "Embedding(7, 3)(x) for ids x of shape (3, 2)",
        emb(_t(ids)),
        lambda: w[ids.astype(int)],
        hint="one-hot the ids and multiply by the weight",
    )


_TEXT = ["the cat sat", "on the mat", "the end", "a cat"]


def _ptb_reference() -> tuple[dict, list]:
    """The course's dictionary (word -> id, in order of first appearance) and ids of _TEXT."""
    vocab: dict[str, int] = {}
    ids = []
    for line in _TEXT:
        for word in line.split() + ["<eos>"]:
            vocab.setdefault(word, len(vocab))
            ids.append(vocab[word])
    return vocab, ids


def hw4_ptb_corpus(ctx):
    import needle as ndl

    folder = os.path.join(ctx.scratch, "ptb")
    os.makedirs(folder)
    for name in ("train.txt", "test.txt"):
        with open(os.path.join(folder, name), "w") as f:
            f.write("\n".join(_TEXT) + "\n")
    corpus = ndl.data.Corpus(folder)
    check_close(
        "Corpus.train (ids in order of first appearance, '<eos>' after every line)",
        np.asarray([int(i) for i in corpus.train], dtype=np.float64),
        lambda: np.asarray(_ptb_reference()[1]),
    )
    words = sorted({w for line in _TEXT for w in line.split()} | {"<eos>"})
    word2idx = {str(k): int(v) for k, v in corpus.dictionary.word2idx.items()}
    idx2word = [str(w) for w in corpus.dictionary.idx2word]
    require(
        sorted(word2idx) == words and sorted(idx2word) == words,
        f"Corpus.dictionary must hold each of the words {words} once (word2idx has "
        f"{sorted(word2idx)}, idx2word {idx2word})",
    )
    check_close(
        f"Corpus.dictionary.word2idx[w] for w in {words}",
        np.array([word2idx[w] for w in words], dtype=np.float64),
        lambda: np.array([_ptb_reference()[0][w] for w in words], dtype=np.float64),
        hint="ids in order of first appearance",
    )
    check_close(
        f"Corpus.dictionary.idx2word as positions in {words}",
        np.array([words.index(w) for w in idx2word], dtype=np.float64),
        lambda: np.array([words.index(w) for w in _ptb_reference()[0]], dtype=np.float64),
        hint="idx2word must list the words in id order",
    )
    short = ndl.data.Corpus(folder, max_lines=2)
    require(
        len(short.train) == 8,
        f"Corpus(max_lines=2).train has {len(short.train)} ids, "
        "expected 8 (the first two lines, each with its <eos>)",
    )


def hw4_batchify(ctx):
    import needle as ndl

    data = list(range(23))
    got = ndl.data.batchify(data, 4, device=None, dtype="float32")
    check_close(
        "batchify(range(23), batch_size=4)",
        np.asarray(got),
        lambda: np.array(data[:20]).reshape(4, 5).T,
        hint="(nbatch, batch_size) with each column a contiguous run of the data",
    )
    # get_batch's input is not batchify's answer (that is never computed beside your code)
    batches = (np.arange(20, dtype=np.float32) * 3 + 1).reshape(5, 4)
    x, y = ndl.data.get_batch(batches, 1, 3)
    check_close("get_batch(batches, i=1, bptt=3) data", x, lambda: batches[1:4])
    check_close("get_batch(batches, i=1, bptt=3) target", y, lambda: batches[2:5].reshape(-1))
    x, y = ndl.data.get_batch(batches, 3, 3)
    check_close(
        "get_batch(batches, i=3, bptt=3) data (clipped at the end)", x, lambda: batches[3:4]
    )


def hw4_language_model(ctx):
    from models import LanguageModel

    import needle as ndl

    for kind, cls in (("rnn", ndl.nn.RNN), ("lstm", ndl.nn.LSTM)):
        np.random.seed(14)
        model = LanguageModel(3, 7, 4, num_layers=2, seq_model=kind, **on_device())
        parts = {type(v): v for v in vars(model).values()}
        found = [parts.get(ndl.nn.Embedding), parts.get(cls), parts.get(ndl.nn.Linear)]
        if any(p is None for p in found):
            raise CheckFailure(
                f"LanguageModel(seq_model={kind!r}) needs an Embedding, an "
                f"{cls.__name__} and a Linear as attributes"
            )
        emb, seq, lin = found
        ids = np.array([[0, 6], [3, 3], [1, 5]], dtype=np.float32)
        out, h = model(_t(ids))
        check_close(
            f"LanguageModel(seq_model={kind!r})(x) logits (T*B, output_size)",
            out,
            lambda emb=emb, seq=seq, lin=lin, ids=ids: to_numpy(
                lin(seq(emb(_t(ids)))[0].reshape((6, 4)))
            ),
            rtol=1e-4,
            atol=1e-5,
            hint="embedding, then the sequence model, then Linear on (T*B, hidden)",
        )
