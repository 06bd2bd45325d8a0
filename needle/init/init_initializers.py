"""Weight initialisers (hw2): Xavier (Glorot) and Kaiming (He), uniform and normal.

Each draws one tensor through :func:`rand` or :func:`randn`, so a seeded numpy RNG gives the
course's numbers. Extra keyword arguments (``device``, ``dtype``, ``requires_grad``) pass through.
"""

from __future__ import annotations

import math
import numbers

from .init_basic import rand, randn

__all__ = ["xavier_uniform", "xavier_normal", "kaiming_uniform", "kaiming_normal"]


def _check_fans(fan_in, fan_out, fn: str) -> None:
    for name, v in (("fan_in", fan_in), ("fan_out", fan_out)):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v <= 0:
            raise ValueError(f"init.{fn}: {name} must be a positive int, got {v!r}")


def _relu_gain(nonlinearity: str, fn: str) -> float:
    if nonlinearity != "relu":
        raise ValueError(f"init.{fn}: only nonlinearity='relu' is supported, got {nonlinearity!r}")
    return math.sqrt(2)


# question: hw2_xavier_uniform
def xavier_uniform(fan_in: int, fan_out: int, gain: float = 1.0, **kwargs):
    """U(-a, a) with a = gain·sqrt(6/(fan_in+fan_out)); shape (fan_in, fan_out)."""
    _check_fans(fan_in, fan_out, "xavier_uniform")
    a = gain * math.sqrt(6 / (fan_in + fan_out))
    return rand(fan_in, fan_out, low=-a, high=a, **kwargs)


# question: hw2_xavier_normal
def xavier_normal(fan_in: int, fan_out: int, gain: float = 1.0, **kwargs):
    """N(0, std²) with std = gain·sqrt(2/(fan_in+fan_out)); shape (fan_in, fan_out)."""
    _check_fans(fan_in, fan_out, "xavier_normal")
    std = gain * math.sqrt(2 / (fan_in + fan_out))
    return randn(fan_in, fan_out, mean=0.0, std=std, **kwargs)


# question: hw2_kaiming_uniform
def kaiming_uniform(fan_in: int, fan_out: int, shape=None, nonlinearity: str = "relu", **kwargs):
    """U(-b, b) with b = sqrt(2)·sqrt(3/fan_in); shape (fan_in, fan_out), or ``shape`` if given.

    ``shape`` changes only the array's shape (a conv kernel (k, k, c_in, c_out) passes
    fan_in = c_in·k²); the bound still comes from ``fan_in``.
    """
    _check_fans(fan_in, fan_out, "kaiming_uniform")
    bound = _relu_gain(nonlinearity, "kaiming_uniform") * math.sqrt(3 / fan_in)
    if shape is None:
        shape = (fan_in, fan_out)
    return rand(*shape, low=-bound, high=bound, **kwargs)


# question: hw2_kaiming_normal
def kaiming_normal(fan_in: int, fan_out: int, nonlinearity: str = "relu", **kwargs):
    """N(0, std²) with std = sqrt(2)/sqrt(fan_in); shape (fan_in, fan_out)."""
    _check_fans(fan_in, fan_out, "kaiming_normal")
    std = _relu_gain(nonlinearity, "kaiming_normal") / math.sqrt(fan_in)
    return randn(fan_in, fan_out, mean=0.0, std=std, **kwargs)
