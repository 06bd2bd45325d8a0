"""Reference answers to the exercises of notebooks/03_nn_library (try them first)."""
import numpy as np


def linear_weight_bound(in_features, out_features):
    """The bound b of nn.Linear's uniform weight initialisation: gain·sqrt(3 / fan_in)."""
    return np.sqrt(2) * np.sqrt(3 / in_features)


def layernorm(x, eps=1e-5):
    """Each row of x (batch, features) normalised to mean 0, variance 1."""
    mean = x.mean(axis=1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps)


def dropout_scale(p):
    """The factor nn.Dropout(p) multiplies surviving entries by: E[out] = (1-p)·scale·x = x."""
    return 1 / (1 - p)


def running_mean_after(batches, momentum):
    """BatchNorm1d's running_mean (shape (dim,)) after these training batches."""
    running = np.zeros(batches[0].shape[1])
    for batch in batches:
        running = (1 - momentum) * running + momentum * batch.mean(axis=0)
    return running
