"""LanguageModel and the PTB training loops (epoch_general_ptb, train_ptb, evaluate_ptb).

Oracles: the model re-computed in numpy (embedding rows, the RNN/LSTM recurrences, the linear
layer); cross-entropy and accuracy re-computed in numpy over the whole stream; the invariance
of a stateful evaluation to the BPTT chunk length; step/clip counts derived from the number of
chunks; and learning a deterministic sequence that an untrained model cannot predict.
"""

import numpy as np
import pytest
from conftest import DEVICES

import needle as ndl
from companion.apps.language_model import LanguageModel
from companion.apps.ptb_training import detach_state, epoch_general_ptb, evaluate_ptb, train_ptb
from needle.data import batchify

pytestmark = [pytest.mark.apps, pytest.mark.sequence]


def sigmoid(z):
    return 1 / (1 + np.exp(-z))


def np_params(cell):
    return [
        getattr(cell, n).numpy().astype(np.float64) for n in ("W_ih", "W_hh", "bias_ih", "bias_hh")
    ]


def model_ref(model, ids, h=None):
    """Numpy forward of an RNN/LSTM LanguageModel: logits (T·B, V) and the final state."""
    x = model.embedding.weight.numpy().astype(np.float64)[ids.astype(int)]
    S, B = ids.shape
    lstm = model.seq_model_name == "lstm"
    cells = model.seq_model.lstm_cells if lstm else model.seq_model.rnn_cells
    L, H = len(cells), model.hidden_size
    h0 = np.zeros((L, B, H)) if h is None else (h[0] if lstm else h)
    c0 = np.zeros((L, B, H)) if h is None or not lstm else h[1]
    hs, cs = [], []
    for k, cell in enumerate(cells):
        W_ih, W_hh, b_ih, b_hh = np_params(cell)
        hk, ck, outs = h0[k], c0[k], []
        for t in range(S):
            z = x[t] @ W_ih + b_ih + hk @ W_hh + b_hh
            if lstm:
                i, f, g, o = (z[:, j * H : (j + 1) * H] for j in range(4))
                ck = sigmoid(f) * ck + sigmoid(i) * np.tanh(g)
                hk = sigmoid(o) * np.tanh(ck)
            else:
                hk = np.tanh(z)
            outs.append(hk)
        x = np.stack(outs)
        hs.append(hk)
        cs.append(ck)
    logits = x.reshape(S * B, H) @ model.linear.weight.numpy() + model.linear.bias.numpy()
    return logits, ((np.stack(hs), np.stack(cs)) if lstm else np.stack(hs))


def log_softmax(z):
    z = z - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


# ---- LanguageModel -----------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seq_model", ["rnn", "lstm"])
@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.hw4_language_model
def test_recurrent_language_model_matches_numpy(device, seq_model, num_layers):
    V, E, H, S, B = 11, 4, 5, 3, 2
    model = LanguageModel(E, V, H, num_layers=num_layers, seq_model=seq_model, device=device)
    ids = np.random.randint(0, V, (S, B)).astype(np.float32)
    x = ndl.Tensor(ids, device=device, requires_grad=False)
    out, h = model(x)
    ref, ref_h = model_ref(model, ids)
    assert out.shape == (S * B, V)
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-4, atol=1e-5)
    # feeding the state back continues the sequence
    out2, h2 = model(x, h)
    ref2, _ = model_ref(model, ids, ref_h)
    np.testing.assert_allclose(out2.numpy(), ref2, rtol=1e-4, atol=1e-5)
    if seq_model == "lstm":
        assert h[0].shape == h[1].shape == (num_layers, B, H)
    else:
        assert h.shape == (num_layers, B, H)
    n_params = sum(int(np.prod(p.shape)) for p in model.parameters())
    k = 4 if seq_model == "lstm" else 1
    expected = (
        V * E
        + sum((E if l == 0 else H) * k * H + H * k * H + 2 * k * H for l in range(num_layers))
        + H * V
        + V
    )
    assert n_params == expected


@pytest.mark.parametrize("device", DEVICES)
def test_transformer_language_model_shapes_and_causality(device):
    V, E, HID, S, B = 13, 8, 16, 6, 3
    model = LanguageModel(
        E,
        V,
        HID,
        num_layers=2,
        seq_model="transformer",
        seq_len=S,
        device=device,
        num_head=2,
        dim_head=4,
    )
    assert model.linear.weight.shape == (E, V)
    assert model.seq_model.positional_embedding.weight.shape == (S, E)
    ids = np.random.randint(0, V, (S, B)).astype(np.float32)
    out, h = model(ndl.Tensor(ids, device=device, requires_grad=False))
    assert out.shape == (S * B, V)
    ids2 = ids.copy()
    ids2[4:] = (ids2[4:] + 1) % V  # change the last two time steps
    out2, _ = model(ndl.Tensor(ids2, device=device, requires_grad=False))
    d = np.abs(out2.numpy() - out.numpy()).reshape(S, B, V).max(axis=(1, 2))
    assert np.all(d[:4] < 1e-5) and np.all(d[4:] > 1e-4)


def test_language_model_rejects_unknown_sequence_model():
    with pytest.raises(ValueError, match="seq_model"):
        LanguageModel(4, 10, 5, seq_model="gru")


# ---- training loops ----------------------------------------------------------------------------
def cyclic_data(V=6, n=240, bs=4):
    """The stream 0 1 2 … V-1 0 1 2 … batchified: each next token is fully determined."""
    return batchify([i % V for i in range(n)], bs, device=None, dtype="float32")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seq_model", ["rnn", "lstm"])
def test_evaluation_is_exact_and_independent_of_chunk_length(device, seq_model):
    V = 7
    data = batchify(list(np.random.randint(0, V, 90)), 3, device=device, dtype="float32")
    model = LanguageModel(4, V, 5, seq_model=seq_model, device=device)
    # numpy over the whole stream at once (no chunks)
    logits, _ = model_ref(model, data[:-1])
    target = data[1:].reshape(-1).astype(int)
    ref_loss = -log_softmax(logits)[np.arange(len(target)), target].mean()
    ref_acc = (logits.argmax(axis=1) == target).mean()
    for seq_len in (4, 7, 100):
        acc, loss = evaluate_ptb(model, data, seq_len=seq_len, device=device, progress=False)
        assert loss == pytest.approx(ref_loss, rel=1e-5), seq_len
        assert acc == pytest.approx(ref_acc), seq_len


@pytest.mark.parametrize("device", DEVICES)
def test_epoch_seeds_numpy_and_counts_steps_and_clips(device):
    data = cyclic_data(V=6, n=120, bs=4)  # (30, 4): chunks of 8 start at rows 0, 8, 16, 24
    model = LanguageModel(4, 6, 5, seq_model="lstm", device=device)

    class Recording(ndl.optim.SGD):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.calls = []

        def reset_grad(self):
            self.calls.append("reset")
            super().reset_grad()

        def clip_grad_norm(self, max_norm=0.25):
            self.calls.append(("clip", max_norm))
            return super().clip_grad_norm(max_norm)

        def step(self):
            self.calls.append("step")
            super().step()

    opt = Recording(model.parameters(), lr=0.1)
    epoch_general_ptb(data, model, seq_len=8, opt=opt, clip=0.5, device=device, progress=False)
    assert opt.calls == ["reset", ("clip", 0.5), "step"] * 4
    assert model.training
    np.random.seed(123)
    evaluate_ptb(model, data, seq_len=8, device=device, progress=False)
    assert not model.training
    draws = np.random.rand(3)  # evaluation draws nothing after seeding 4
    np.random.seed(4)
    np.testing.assert_array_equal(draws, np.random.rand(3))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "seq_model,optimizer,lr,epochs",
    [
        ("lstm", ndl.optim.SGD, 4.0, 8),
        ("rnn", ndl.optim.Adam, 0.05, 6),
        ("transformer", ndl.optim.Adam, 0.05, 6),
    ],
)
def test_training_learns_a_deterministic_sequence(device, seq_model, optimizer, lr, epochs):
    V = 6
    data = cyclic_data(V=V)
    kw = {"num_head": 2, "dim_head": 4} if seq_model == "transformer" else {}
    np.random.seed(0)
    model = LanguageModel(8, V, 12, seq_model=seq_model, seq_len=10, device=device, **kw)
    acc0, loss0 = evaluate_ptb(model, data, seq_len=10, device=device, progress=False)
    acc, loss = train_ptb(
        model,
        data,
        seq_len=10,
        n_epochs=epochs,
        optimizer=optimizer,
        lr=lr,
        clip=1.0,
        device=device,
        progress=False,
    )
    acc1, loss1 = evaluate_ptb(model, data, seq_len=10, device=device, progress=False)
    assert loss0 > 1.2 and acc0 < 0.6  # untrained: near log 6 = 1.79
    assert loss1 < 0.2 * loss0 and acc1 > 0.95, (loss0, loss1, acc1)
    assert np.isfinite(loss) and 0 <= acc <= 1


def test_detach_state_keeps_values_and_structure():
    a = ndl.Tensor(np.ones((2, 3), dtype=np.float32))
    h = a * 2
    c = a + 1
    d = detach_state((h, c))
    assert isinstance(d, tuple) and len(d) == 2
    for orig, new in zip((h, c), d):
        assert new.is_leaf() and not new.requires_grad
        np.testing.assert_array_equal(new.numpy(), orig.numpy())
    assert detach_state(None) is None
    assert detach_state(h).is_leaf()
    with pytest.raises(TypeError, match="hidden state"):
        detach_state(3.0)


def test_training_loops_reject_bad_data():
    model = LanguageModel(4, 6, 5)
    with pytest.raises(ValueError, match="nbatch"):
        evaluate_ptb(model, np.zeros(10), progress=False)
