"""Reference answers to the exercises of notebooks/08_sequence_models (try them first)."""
import numpy as np


def rnn_step(x, h, W_ih, W_hh, bias_ih, bias_hh):
    """The next hidden state (batch, hidden) of a tanh RNN cell."""
    return np.tanh(x @ W_ih + bias_ih + h @ W_hh + bias_hh)


def lstm_parameter_count(input_size, hidden_size):
    """The number of learned numbers in an LSTM cell: 4 gates x (n·h + h·h + 2h)."""
    return 4 * hidden_size * (input_size + hidden_size + 2)


def batchify_np(data, batch_size):
    """(len(data) // batch_size, batch_size) array whose columns are contiguous runs."""
    nbatch = len(data) // batch_size
    return np.array(data[:nbatch * batch_size]).reshape(batch_size, nbatch).T
