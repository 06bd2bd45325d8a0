"""Sequence modules (hw4): RNNCell, RNN, LSTMCell, LSTM and Embedding.

Conventions follow the course: inputs are time-major, ``X`` of shape (seq_len, bs, features);
weights are stored input-major, ``W_ih`` of shape (input_size, k·hidden_size), i.e. the
transposes of PyTorch's ``weight_ih``; LSTM gates are packed in the order i, f, g, o.
``nn.Sigmoid`` lives in :mod:`needle.nn.nn_basic`.
"""

from __future__ import annotations

import math
from typing import Optional, Protocol, Tuple

import numpy as np

import needle.init as init
from needle import ops
from needle.autograd import Tensor

from .nn_basic import Module, Parameter, Sigmoid

__all__ = ["RNNCell", "RNN", "LSTMCell", "LSTM", "Embedding"]


def _check_size(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _uniform(shape: tuple, bound: float, device, dtype) -> Parameter:
    return Parameter(
        init.rand(*shape, low=-bound, high=bound, device=device, dtype=dtype, requires_grad=True)
    )


class _Cell(Protocol):
    """What the helpers below read of an RNNCell or LSTMCell."""

    input_size: int
    W_ih: Parameter
    bias_ih: Optional[Parameter]
    bias_hh: Optional[Parameter]


def _check_input(X: Tensor, ndim: int, cell: _Cell, what: str) -> None:
    if not isinstance(X, Tensor):
        raise TypeError(f"{what} expects a needle Tensor, got {type(X).__name__}")
    if len(X.shape) != ndim or X.shape[-1] != cell.input_size:
        want = "(bs, {f})" if ndim == 2 else "(seq_len, bs, {f})"
        raise ValueError(
            f"{what} expects input of shape {want.format(f=cell.input_size)}, got {tuple(X.shape)}"
        )
    if ndim == 3 and X.shape[0] == 0:
        raise ValueError(
            f"{what} got an input of sequence length 0 (shape {tuple(X.shape)}): "
            f"there is no step to run and no final state to return"
        )
    if X.device != cell.W_ih.device:
        raise ValueError(
            f"{what}: input is on {X.device} but the parameters are on {cell.W_ih.device}"
        )


def _check_state(h: Tensor, shape: tuple, what: str) -> None:
    if not isinstance(h, Tensor):
        raise TypeError(f"{what} must be a needle Tensor, got {type(h).__name__}")
    if tuple(h.shape) != tuple(shape):
        raise ValueError(f"{what} must have shape {tuple(shape)}, got {tuple(h.shape)}")


def _unpack(tt) -> list:
    """The Tensors of a TensorTuple, by index (no reliance on the iteration protocol)."""
    return [tt[k] for k in range(len(tt))]


def input_projection(cell: _Cell, X: Tensor) -> Tensor:
    """X W_ih + b_ih + b_hh for X (N, input_size): the part of a step that does not depend on h.

    The RNN and LSTM layers compute it for all seq_len·bs rows in one matmul instead of one
    per time step; only h W_hh stays inside the recurrence.
    """
    z = X @ cell.W_ih
    if cell.bias_ih is not None:
        bias = (cell.bias_ih + cell.bias_hh).reshape((1, z.shape[1]))
        z = z + bias.broadcast_to(z.shape)
    return z


def _zeros(bs: int, hidden_size: int, like: Tensor) -> Tensor:
    return init.zeros(bs, hidden_size, device=like.device, dtype=like.dtype)


# question: hw4_rnn_cell
class RNNCell(Module):
    """One Elman RNN step: h' = σ(X W_ih + b_ih + h W_hh + b_hh), σ = tanh or relu.

    Parameters ``W_ih`` (input_size, hidden_size), ``W_hh`` (hidden_size, hidden_size),
    ``bias_ih`` and ``bias_hh`` (hidden_size,), created in that order, all drawn from
    U(-sqrt(k), sqrt(k)) with k = 1/hidden_size. With ``bias=False`` the biases are None.
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        bias: bool = True,
        nonlinearity: str = "tanh",
        device=None,
        dtype: str = "float32",
    ):
        super().__init__()
        self.input_size = _check_size("input_size", input_size)
        self.hidden_size = _check_size("hidden_size", hidden_size)
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
        self.nonlinearity = nonlinearity
        self.device, self.dtype = device, dtype
        bound = math.sqrt(1.0 / hidden_size)
        self.W_ih = _uniform((input_size, hidden_size), bound, device, dtype)
        self.W_hh = _uniform((hidden_size, hidden_size), bound, device, dtype)
        self.bias_ih: Optional[Parameter]
        self.bias_hh: Optional[Parameter]
        if bias:
            self.bias_ih = _uniform((hidden_size,), bound, device, dtype)
            self.bias_hh = _uniform((hidden_size,), bound, device, dtype)
        else:
            self.bias_ih = self.bias_hh = None

    def forward(self, X: Tensor, h: Optional[Tensor] = None) -> Tensor:
        """X (bs, input_size), h (bs, hidden_size) or None for zeros → h' (bs, hidden_size)."""
        _check_input(X, 2, self, "RNNCell")
        if h is None:
            h = _zeros(X.shape[0], self.hidden_size, X)
        _check_state(h, (X.shape[0], self.hidden_size), "RNNCell hidden state h")
        return self._step(input_projection(self, X), h)

    def _step(self, xw: Tensor, h: Tensor) -> Tensor:
        """The recurrence given the input projection xw = X W_ih + biases (bs, hidden_size)."""
        z = xw + h @ self.W_hh
        return ops.tanh(z) if self.nonlinearity == "tanh" else ops.relu(z)


# question: hw4_rnn
class RNN(Module):
    """A stack of ``num_layers`` RNNCells run over a sequence (``rnn_cells[k]``).

    Layer 0 reads the input (input_size features); layer k > 0 reads layer k-1's hidden states.
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        nonlinearity: str = "tanh",
        device=None,
        dtype: str = "float32",
    ):
        super().__init__()
        self.input_size = _check_size("input_size", input_size)
        self.hidden_size = _check_size("hidden_size", hidden_size)
        self.num_layers = _check_size("num_layers", num_layers)
        self.device, self.dtype = device, dtype
        self.rnn_cells = [
            RNNCell(
                input_size if k == 0 else hidden_size,
                hidden_size,
                bias=bias,
                nonlinearity=nonlinearity,
                device=device,
                dtype=dtype,
            )
            for k in range(num_layers)
        ]

    def forward(self, X: Tensor, h0: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        """X (seq_len, bs, input_size), h0 (num_layers, bs, hidden_size) or None for zeros.

        Returns ``output`` (seq_len, bs, hidden_size), the last layer's h_t for every t, and
        ``h_n`` (num_layers, bs, hidden_size), every layer's final hidden state.
        """
        _check_input(X, 3, self.rnn_cells[0], "RNN")
        seq_len, bs, _ = X.shape
        H = self.hidden_size
        if h0 is None:
            hs = [_zeros(bs, H, X) for _ in range(self.num_layers)]
        else:
            _check_state(h0, (self.num_layers, bs, H), "RNN initial state h0")
            hs = _unpack(ops.split(h0, 0))
        layer_input = X.reshape((seq_len * bs, self.input_size))
        h_n = []
        for cell, h in zip(self.rnn_cells, hs):
            xw = input_projection(cell, layer_input).reshape((seq_len, bs, H))
            outputs = []
            for xw_t in _unpack(ops.split(xw, 0)):
                h = cell._step(xw_t, h)
                outputs.append(h)
            h_n.append(h)
            output = ops.stack(outputs, 0)
            layer_input = output.reshape((seq_len * bs, H))
        return output, ops.stack(h_n, 0)


# question: hw4_lstm_cell
class LSTMCell(Module):
    """One LSTM step with gates i, f, g, o packed (in that order) along the last axis.

    i, f, o = sigmoid(·), g = tanh(·) of the slices of X W_ih + b_ih + h W_hh + b_hh;
    c' = f ⊙ c + i ⊙ g; h' = o ⊙ tanh(c'). ``W_ih``
    (input_size, 4·hidden_size), ``W_hh`` (hidden_size, 4·hidden_size), ``bias_ih``/``bias_hh``
    (4·hidden_size,), created in that order, all U(-sqrt(k), sqrt(k)) with k = 1/hidden_size.
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        bias: bool = True,
        device=None,
        dtype: str = "float32",
    ):
        super().__init__()
        self.input_size = _check_size("input_size", input_size)
        self.hidden_size = _check_size("hidden_size", hidden_size)
        self.device, self.dtype = device, dtype
        bound = math.sqrt(1.0 / hidden_size)
        four = 4 * hidden_size
        self.W_ih = _uniform((input_size, four), bound, device, dtype)
        self.W_hh = _uniform((hidden_size, four), bound, device, dtype)
        self.bias_ih: Optional[Parameter]
        self.bias_hh: Optional[Parameter]
        if bias:
            self.bias_ih = _uniform((four,), bound, device, dtype)
            self.bias_hh = _uniform((four,), bound, device, dtype)
        else:
            self.bias_ih = self.bias_hh = None

    def forward(
        self, X: Tensor, h: Optional[Tuple[Tensor, Tensor]] = None
    ) -> Tuple[Tensor, Tensor]:
        """X (bs, input_size), h = (h0, c0) each (bs, hidden_size) or None for zeros.

        Returns (h', c'), each (bs, hidden_size).
        """
        X, (h0, c0) = self.checked_state(X, h)
        return self._step(input_projection(self, X), (h0, c0))

    def checked_state(
        self, X: Tensor, h: Optional[Tuple[Tensor, Tensor]]
    ) -> Tuple[Tensor, Tuple[Tensor, Tensor]]:
        """(X, (h0, c0)) after checking their shapes; zeros for a missing state."""
        _check_input(X, 2, self, "LSTMCell")
        bs, H = X.shape[0], self.hidden_size
        if h is None:
            h = (_zeros(bs, H, X), _zeros(bs, H, X))
        if not isinstance(h, (tuple, list)) or len(h) != 2:
            raise TypeError(f"LSTMCell state must be a tuple (h0, c0), got {type(h).__name__}")
        _check_state(h[0], (bs, H), "LSTMCell hidden state h0")
        _check_state(h[1], (bs, H), "LSTMCell cell state c0")
        return X, (h[0], h[1])

    def _step(self, xw: Tensor, state: Tuple[Tensor, Tensor]) -> Tuple[Tensor, Tensor]:
        """The recurrence given the input projection xw = X W_ih + biases (bs, 4·hidden)."""
        h, c = state
        bs, H = h.shape
        gates = (xw + h @ self.W_hh).reshape((bs, 4, H))
        i, f, g, o = _unpack(ops.split(gates, 1))
        sigmoid = Sigmoid()
        i, f, g, o = sigmoid(i), sigmoid(f), ops.tanh(g), sigmoid(o)
        c_out = f * c + i * g
        return o * ops.tanh(c_out), c_out


# question: hw4_lstm
class LSTM(Module):
    """A stack of ``num_layers`` LSTMCells run over a sequence (``lstm_cells[k]``)."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        device=None,
        dtype: str = "float32",
    ):
        super().__init__()
        self.input_size = _check_size("input_size", input_size)
        self.hidden_size = _check_size("hidden_size", hidden_size)
        self.num_layers = _check_size("num_layers", num_layers)
        self.device, self.dtype = device, dtype
        self.lstm_cells = [
            LSTMCell(
                input_size if k == 0 else hidden_size,
                hidden_size,
                bias=bias,
                device=device,
                dtype=dtype,
            )
            for k in range(num_layers)
        ]

    def forward(
        self, X: Tensor, h: Optional[Tuple[Tensor, Tensor]] = None
    ) -> Tuple[Tensor, Tuple[Tensor, Tensor]]:
        """X (seq_len, bs, input_size), h = (h0, c0) each (num_layers, bs, hidden_size) or None.

        Returns ``output`` (seq_len, bs, hidden_size) — the last layer's h_t for every t — and
        ``(h_n, c_n)``, each (num_layers, bs, hidden_size).
        """
        states = self.initial_states(X, h)
        seq_len, bs, _ = X.shape
        layer_input = X.reshape((seq_len * bs, X.shape[2]))
        h_n, c_n = [], []
        for cell, state in zip(self.lstm_cells, states):
            xw = input_projection(cell, layer_input).reshape((seq_len, bs, 4 * self.hidden_size))
            outputs = []
            for xw_t in _unpack(ops.split(xw, 0)):
                state = cell._step(xw_t, state)
                outputs.append(state[0])
            h_n.append(state[0])
            c_n.append(state[1])
            output = ops.stack(outputs, 0)
            layer_input = output.reshape((seq_len * bs, self.hidden_size))
        return output, (ops.stack(h_n, 0), ops.stack(c_n, 0))

    def initial_states(self, X: Tensor, h: Optional[Tuple[Tensor, Tensor]]) -> list:
        """Each layer's (h0, c0), each (bs, hidden_size), after checking X and h's shapes."""
        _check_input(X, 3, self.lstm_cells[0], "LSTM")
        bs, H = X.shape[1], self.hidden_size
        if h is None:
            return [(_zeros(bs, H, X), _zeros(bs, H, X)) for _ in range(self.num_layers)]
        if not isinstance(h, (tuple, list)) or len(h) != 2:
            raise TypeError(f"LSTM state must be a tuple (h0, c0), got {type(h).__name__}")
        shape = (self.num_layers, bs, H)
        _check_state(h[0], shape, "LSTM initial state h0")
        _check_state(h[1], shape, "LSTM initial state c0")
        return list(zip(_unpack(ops.split(h[0], 0)), _unpack(ops.split(h[1], 0))))


# question: hw4_embedding
class Embedding(Module):
    """A lookup table: integer ids (seq_len, bs) → vectors (seq_len, bs, embedding_dim).

    ``weight`` (num_embeddings, embedding_dim) is drawn from N(0, 1). The lookup is the
    course's one_hot(ids) @ weight, so the gradient reaches exactly the rows that were used (a
    row used twice gets both contributions).
    """

    def __init__(
        self, num_embeddings: int, embedding_dim: int, device=None, dtype: str = "float32"
    ):
        super().__init__()
        self.num_embeddings = _check_size("num_embeddings", num_embeddings)
        self.embedding_dim = _check_size("embedding_dim", embedding_dim)
        self.device, self.dtype = device, dtype
        self.weight = Parameter(
            init.randn(
                num_embeddings,
                embedding_dim,
                mean=0.0,
                std=1.0,
                device=device,
                dtype=dtype,
                requires_grad=True,
            )
        )

    def forward(self, x: Tensor) -> Tensor:
        """x (seq_len, bs) of integer ids in [0, num_embeddings) → (seq_len, bs, dim); an id
        that is not a whole number in that range is a ValueError naming it (from init.one_hot)."""
        check_ids(x)
        seq_len, bs = x.shape
        n = self.num_embeddings
        one_hot = init.one_hot(n, x, device=self.weight.device, dtype=self.weight.dtype)
        out = one_hot.reshape((seq_len * bs, n)) @ self.weight
        return out.reshape((seq_len, bs, self.embedding_dim))


def check_ids(x: Tensor) -> None:
    """Raise unless ``x`` is a needle Tensor of shape (seq_len, bs)."""
    if not isinstance(x, Tensor):
        raise TypeError(f"Embedding expects a needle Tensor of ids, got {type(x).__name__}")
    if len(x.shape) != 2:
        raise ValueError(f"Embedding expects ids of shape (seq_len, bs), got {tuple(x.shape)}")
