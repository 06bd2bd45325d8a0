"""Reference answers to the exercises of notebooks/04_training (try them first)."""
import numpy as np


def sgd_momentum(theta0, grads, lr, momentum):
    """theta after one momentum-SGD step per gradient in grads (numpy)."""
    theta = theta0.astype(np.float64)
    u = np.zeros_like(theta)
    for g in grads:
        u = momentum * u + (1 - momentum) * g
        theta = theta - lr * u
    return theta


def adam_first_step(g, lr):
    """theta_1 - theta_0 for one Adam step: m̂ = g and v̂ = g², so the step is -lr·g/(|g|+eps)."""
    return -lr * g / (np.abs(g) + 1e-8)


def kaiming_normal_std(fan_in):
    """The standard deviation of init.kaiming_normal(fan_in, fan_out): gain / sqrt(fan_in)."""
    return np.sqrt(2) / np.sqrt(fan_in)
