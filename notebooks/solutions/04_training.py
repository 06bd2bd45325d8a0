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


def adam_two_steps(g1, g2, lr, b1=0.9, b2=0.999, eps=1e-8):
    """theta_2 - theta_0 for two Adam steps: the averages m, v divided by 1 - beta^t at t = 1, 2."""
    m, v, change = 0.0, 0.0, 0.0
    for t, g in enumerate((g1, g2), start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        change = change - lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
    return change


def kaiming_normal_std(fan_in):
    """The standard deviation of init.kaiming_normal(fan_in, fan_out): gain / sqrt(fan_in)."""
    return np.sqrt(2) / np.sqrt(fan_in)
