"""RNNCell, RNN, LSTMCell, LSTM and Embedding against float64 numpy references.

Oracles: the recurrences written out in numpy (h' = tanh(x W_ih + b_ih + h W_hh + b_hh); the
LSTM's i, f, g, o gates, c' = f c + i g, h' = o tanh(c')), evaluated with the module's own
parameter values; gradients are central finite differences of those references for a random
weighting of every output; initial values are recomputed from the same seeded numpy draws.
"""

import math

import numpy as np
import pytest
from conftest import DEVICES
from helpers import central_difference, float32_tensor

import needle as ndl
from needle import nn

pytestmark = [pytest.mark.sequence, pytest.mark.both_backends]

F32 = np.float32


T = float32_tensor
fd_grad = central_difference


def sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


# ---- numpy references --------------------------------------------------------------------------
def rnn_cell_ref(x, h, p, nonlinearity="tanh"):
    z = x @ p["W_ih"] + h @ p["W_hh"]
    if "bias_ih" in p:
        z = z + p["bias_ih"] + p["bias_hh"]
    return np.tanh(z) if nonlinearity == "tanh" else np.maximum(z, 0)


def rnn_ref(X, h0, layers, nonlinearity="tanh"):
    """X (T, B, I), h0 (L, B, H), layers: list of parameter dicts → (out (T,B,H), h_n (L,B,H))."""
    inputs, h_n = list(X), []
    for k, p in enumerate(layers):
        h, outs = h0[k], []
        for x in inputs:
            h = rnn_cell_ref(x, h, p, nonlinearity)
            outs.append(h)
        h_n.append(h)
        inputs = outs
    return np.stack(inputs), np.stack(h_n)


def lstm_cell_ref(x, h, c, p):
    z = x @ p["W_ih"] + h @ p["W_hh"]
    if "bias_ih" in p:
        z = z + p["bias_ih"] + p["bias_hh"]
    H = h.shape[1]
    i, f = sigmoid(z[:, :H]), sigmoid(z[:, H : 2 * H])
    g, o = np.tanh(z[:, 2 * H : 3 * H]), sigmoid(z[:, 3 * H :])
    c = f * c + i * g
    return o * np.tanh(c), c


def lstm_ref(X, h0, c0, layers):
    inputs, h_n, c_n = list(X), [], []
    for k, p in enumerate(layers):
        h, c, outs = h0[k], c0[k], []
        for x in inputs:
            h, c = lstm_cell_ref(x, h, c, p)
            outs.append(h)
        h_n.append(h)
        c_n.append(c)
        inputs = outs
    return np.stack(inputs), np.stack(h_n), np.stack(c_n)


NAMES = ("W_ih", "W_hh", "bias_ih", "bias_hh")


def cell_params(cell):
    """The cell's parameters as float64 numpy arrays, keyed by name (biases only if present)."""
    return {
        n: getattr(cell, n).numpy().astype(np.float64)
        for n in NAMES
        if getattr(cell, n) is not None
    }


def check_fd(loss_ref, arrays, grads, rtol=2e-3, atol=2e-4):
    """For each (name, array) compare needle's grad with finite differences of loss_ref."""
    for name, value in arrays.items():

        def f(v, name=name):
            return loss_ref({**arrays, name: v})

        np.testing.assert_allclose(
            grads[name], fd_grad(f, value), rtol=rtol, atol=atol, err_msg=f"gradient of {name}"
        )


# ---- initialisation ----------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cls,gates", [(nn.RNNCell, 1), (nn.LSTMCell, 4)])
@pytest.mark.hw4_rnn_cell
@pytest.mark.hw4_lstm_cell
def test_cell_init_order_bounds_and_shapes(device, cls, gates):
    I, H = 3, 5
    np.random.seed(7)
    cell = cls(I, H, device=device)
    np.random.seed(7)
    k = math.sqrt(1 / H)
    expected = [
        np.random.rand(I, gates * H),
        np.random.rand(H, gates * H),
        np.random.rand(gates * H),
        np.random.rand(gates * H),
    ]
    for name, e in zip(NAMES, expected):
        p = getattr(cell, name)
        assert isinstance(p, nn.Parameter), name
        assert p.shape == e.shape and p.device == device and p.dtype == "float32"
        np.testing.assert_allclose(p.numpy(), e * 2 * k - k, rtol=1e-5, atol=1e-6, err_msg=name)
    assert [id(p) for p in cell.parameters()] == [id(getattr(cell, n)) for n in NAMES]
    nobias = cls(I, H, bias=False, device=device)
    assert nobias.bias_ih is None and nobias.bias_hh is None and len(nobias.parameters()) == 2


@pytest.mark.parametrize("device", DEVICES)
def test_stacked_modules_hold_one_cell_per_layer(device):
    rnn = nn.RNN(3, 4, num_layers=3, device=device)
    lstm = nn.LSTM(3, 4, num_layers=2, bias=False, device=device)
    assert len(rnn.rnn_cells) == 3 and len(lstm.lstm_cells) == 2
    assert rnn.rnn_cells[0].W_ih.shape == (3, 4) and rnn.rnn_cells[1].W_ih.shape == (4, 4)
    assert lstm.lstm_cells[1].W_ih.shape == (4, 16)
    assert len(rnn.parameters()) == 12 and len(lstm.parameters()) == 4


# ---- RNN ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("nonlinearity", ["tanh", "relu"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("given_h", [True, False])
@pytest.mark.hw4_rnn_cell
def test_rnn_cell_forward_backward(device, nonlinearity, bias, given_h):
    B, I, H = 3, 4, 5
    cell = nn.RNNCell(I, H, bias=bias, nonlinearity=nonlinearity, device=device)
    X = np.random.randn(B, I)
    h = np.random.randn(B, H) if given_h else np.zeros((B, H))
    x_t = T(X, device)
    h_t = T(h, device) if given_h else None
    out = cell(x_t, h_t)
    p = cell_params(cell)
    np.testing.assert_allclose(
        out.numpy(), rnn_cell_ref(X, h, p, nonlinearity), rtol=1e-5, atol=1e-5
    )
    assert out.shape == (B, H) and out.device == device
    w = np.random.randn(B, H)
    (out * T(w, device, False)).sum().backward()
    arrays = {"X": X, **p}
    grads = {"X": x_t.grad.numpy(), **{n: getattr(cell, n).grad.numpy() for n in p}}
    if given_h:
        arrays["h"], grads["h"] = h, h_t.grad.numpy()

    def loss(a):
        return np.sum(w * rnn_cell_ref(a["X"], a.get("h", h), a, nonlinearity))

    check_fd(loss, arrays, grads)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("nonlinearity", ["tanh", "relu"])
@pytest.mark.parametrize("given_h", [True, False])
@pytest.mark.hw4_rnn
def test_rnn_forward_backward(device, num_layers, nonlinearity, given_h):
    S, B, I, H, L = 4, 2, 3, 5, num_layers
    rnn = nn.RNN(I, H, num_layers=L, nonlinearity=nonlinearity, device=device)
    X = np.random.randn(S, B, I)
    h0 = np.random.randn(L, B, H) if given_h else np.zeros((L, B, H))
    x_t = T(X, device)
    h_t = T(h0, device) if given_h else None
    out, h_n = rnn(x_t, h_t)
    layers = [cell_params(c) for c in rnn.rnn_cells]
    ref_out, ref_hn = rnn_ref(X, h0, layers, nonlinearity)
    assert out.shape == (S, B, H) and h_n.shape == (L, B, H)
    np.testing.assert_allclose(out.numpy(), ref_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(h_n.numpy(), ref_hn, rtol=1e-5, atol=1e-5)

    w1, w2 = np.random.randn(S, B, H), np.random.randn(L, B, H)
    ((out * T(w1, device, False)).sum() + (h_n * T(w2, device, False)).sum()).backward()
    arrays = {"X": X}
    grads = {"X": x_t.grad.numpy()}
    if given_h:
        arrays["h0"], grads["h0"] = h0, h_t.grad.numpy()
    for k, (c, p) in enumerate(zip(rnn.rnn_cells, layers)):
        for n in p:
            arrays[f"{k}.{n}"], grads[f"{k}.{n}"] = p[n], getattr(c, n).grad.numpy()

    def loss(a):
        ls = [{n: a[f"{k}.{n}"] for n in NAMES} for k in range(L)]
        o, hn = rnn_ref(a["X"], a.get("h0", h0), ls, nonlinearity)
        return np.sum(w1 * o) + np.sum(w2 * hn)

    check_fd(loss, arrays, grads)


# ---- LSTM --------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("given_h", [True, False])
@pytest.mark.hw4_lstm_cell
def test_lstm_cell_forward_backward(device, bias, given_h):
    B, I, H = 3, 4, 2
    cell = nn.LSTMCell(I, H, bias=bias, device=device)
    X = np.random.randn(B, I)
    h = np.random.randn(B, H) if given_h else np.zeros((B, H))
    c = np.random.randn(B, H) if given_h else np.zeros((B, H))
    x_t = T(X, device)
    state = (T(h, device), T(c, device)) if given_h else None
    h1, c1 = cell(x_t, state)
    p = cell_params(cell)
    rh, rc = lstm_cell_ref(X, h, c, p)
    np.testing.assert_allclose(h1.numpy(), rh, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(c1.numpy(), rc, rtol=1e-5, atol=1e-5)
    w1, w2 = np.random.randn(B, H), np.random.randn(B, H)
    ((h1 * T(w1, device, False)).sum() + (c1 * T(w2, device, False)).sum()).backward()
    arrays = {"X": X, **p}
    grads = {"X": x_t.grad.numpy(), **{n: getattr(cell, n).grad.numpy() for n in p}}
    if given_h:
        arrays.update(h=h, c=c)
        grads.update(h=state[0].grad.numpy(), c=state[1].grad.numpy())

    def loss(a):
        hh, cc = lstm_cell_ref(a["X"], a.get("h", h), a.get("c", c), a)
        return np.sum(w1 * hh) + np.sum(w2 * cc)

    check_fd(loss, arrays, grads)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.hw4_lstm_cell
def test_lstm_gate_order_is_i_f_g_o(device):
    """Hand-derived: with zero weights and a bias that opens exactly one gate slice at a time,
    c' and h' follow from the gate order i, f, g, o."""
    H = 2
    cell = nn.LSTMCell(1, H, device=device)
    for name in NAMES:
        p = getattr(cell, name)
        p.data = T(np.zeros(p.shape), device, False)
    big = 30.0  # sigmoid(30) = 1 and tanh(30) = 1 to float32 precision; sigmoid(0) = 0.5
    bias = np.zeros(4 * H)
    bias[0:H] = big  # i = 1
    bias[H : 2 * H] = -big  # f = 0
    bias[2 * H : 3 * H] = 0.5  # g = tanh(0.5)
    bias[3 * H :] = 0.0  # o = 0.5
    cell.bias_ih.data = T(bias, device, False)
    c0 = np.full((1, H), 3.0)
    h1, c1 = cell(T(np.zeros((1, 1)), device), (T(np.zeros((1, H)), device), T(c0, device)))
    np.testing.assert_allclose(c1.numpy(), np.full((1, H), np.tanh(0.5)), rtol=1e-6)
    np.testing.assert_allclose(h1.numpy(), 0.5 * np.tanh(np.tanh(0.5)) * np.ones((1, H)), rtol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("given_h", [True, False])
@pytest.mark.hw4_lstm
def test_lstm_forward_backward(device, num_layers, given_h):
    S, B, I, H, L = 3, 2, 3, 2, num_layers
    lstm = nn.LSTM(I, H, num_layers=L, device=device)
    X = np.random.randn(S, B, I)
    h0 = np.random.randn(L, B, H) if given_h else np.zeros((L, B, H))
    c0 = np.random.randn(L, B, H) if given_h else np.zeros((L, B, H))
    x_t = T(X, device)
    state = (T(h0, device), T(c0, device)) if given_h else None
    out, (h_n, c_n) = lstm(x_t, state)
    layers = [cell_params(c) for c in lstm.lstm_cells]
    r_out, r_h, r_c = lstm_ref(X, h0, c0, layers)
    assert out.shape == (S, B, H) and h_n.shape == (L, B, H) and c_n.shape == (L, B, H)
    np.testing.assert_allclose(out.numpy(), r_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(h_n.numpy(), r_h, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(c_n.numpy(), r_c, rtol=1e-5, atol=1e-5)

    ws = [np.random.randn(*s) for s in ((S, B, H), (L, B, H), (L, B, H))]
    a, b, c = ((t * T(w, device, False)).sum() for t, w in zip((out, h_n, c_n), ws))
    (a + b + c).backward()
    arrays, grads = {"X": X}, {"X": x_t.grad.numpy()}
    if given_h:
        arrays.update(h0=h0, c0=c0)
        grads.update(h0=state[0].grad.numpy(), c0=state[1].grad.numpy())
    for k, (c, p) in enumerate(zip(lstm.lstm_cells, layers)):
        for n in p:
            arrays[f"{k}.{n}"], grads[f"{k}.{n}"] = p[n], getattr(c, n).grad.numpy()

    def loss(a):
        ls = [{n: a[f"{k}.{n}"] for n in NAMES} for k in range(L)]
        res = lstm_ref(a["X"], a.get("h0", h0), a.get("c0", c0), ls)
        return sum(np.sum(w * r) for w, r in zip(ws, res))

    check_fd(loss, arrays, grads)


# ---- Embedding ---------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.hw4_embedding
def test_embedding_lookup_and_gradient(device):
    N, D, S, B = 7, 3, 4, 2
    np.random.seed(3)
    emb = nn.Embedding(N, D, device=device)
    np.random.seed(3)
    np.testing.assert_allclose(emb.weight.numpy(), np.random.randn(N, D), rtol=1e-5, atol=1e-6)
    assert isinstance(emb.weight, nn.Parameter) and emb.weight.shape == (N, D)
    ids = np.array([[0, 6, 2, 2], [1, 2, 6, 5]]).T  # (S, B), with repeats
    out = emb(T(ids, device, False))
    assert out.shape == (S, B, D) and out.device == device
    W = emb.weight.numpy()
    np.testing.assert_allclose(out.numpy(), W[ids], rtol=1e-6)
    g = np.random.randn(S, B, D)
    (out * T(g, device, False)).sum().backward()
    expected = np.zeros((N, D))
    np.add.at(expected, ids.reshape(-1), g.reshape(-1, D))  # rows used twice get both grads
    np.testing.assert_allclose(emb.weight.grad.numpy(), expected, rtol=1e-5, atol=1e-6)


# ---- bad input ---------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_bad_input_raises_clear_errors(device):
    with pytest.raises(ValueError, match="nonlinearity"):
        nn.RNNCell(3, 4, nonlinearity="sigmoid")
    with pytest.raises(ValueError, match="hidden_size"):
        nn.LSTM(3, 0)
    with pytest.raises(ValueError, match="num_layers"):
        nn.RNN(3, 4, num_layers=0)
    rnn = nn.RNN(3, 4, num_layers=2, device=device)
    with pytest.raises(ValueError, match=r"\(seq_len, bs, 3\)"):
        rnn(T(np.zeros((5, 2, 4)), device))
    with pytest.raises(ValueError, match="h0"):
        rnn(T(np.zeros((5, 2, 3)), device), T(np.zeros((1, 2, 4)), device))
    with pytest.raises(ValueError, match="RNN got an input of sequence length 0"):
        rnn(T(np.zeros((0, 2, 3)), device))
    lstm = nn.LSTM(3, 4, device=device)
    with pytest.raises(ValueError, match="LSTM got an input of sequence length 0"):
        lstm(T(np.zeros((0, 2, 3)), device))
    with pytest.raises(TypeError, match=r"\(h0, c0\)"):
        lstm(T(np.zeros((5, 2, 3)), device), T(np.zeros((1, 2, 4)), device))
    with pytest.raises(ValueError, match="c0"):
        lstm(
            T(np.zeros((5, 2, 3)), device),
            (T(np.zeros((1, 2, 4)), device), T(np.zeros((1, 3, 4)), device)),
        )
    other = ndl.cpu_numpy() if device != ndl.cpu_numpy() else ndl.cpu()
    if other.enabled() and ndl.BACKEND == "nd":
        with pytest.raises(ValueError, match="parameters are on"):
            lstm(T(np.zeros((5, 2, 3)), other))
    emb = nn.Embedding(5, 2, device=device)
    # the course's lookup is one_hot(ids) @ weight: one_hot names a bad id
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        emb(T(np.array([[1, 5]]), device, False))
    with pytest.raises(ValueError, match="whole numbers"):
        emb(T(np.array([[1.5, 2]]), device, False))
    with pytest.raises(ValueError, match="seq_len, bs"):
        emb(T(np.array([1, 2]), device, False))
