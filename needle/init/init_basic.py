"""Tensor factories (hw2): random, constant and one-hot tensors.

Randomness comes only from numpy's global RNG (through ``device.rand``/``device.randn``, which
call ``np.random.rand``/``np.random.randn`` once per tensor), so ``np.random.seed(s)`` reproduces
the course's numbers. Every factory defaults to ``requires_grad=False`` and to needle's default
device, the one ``ndl.Tensor(x)`` uses (the compiled ``cpu()`` when it is built), so factories,
modules and tensors made without ``device=`` always meet on one device (the course defaults
init to ``cpu()`` and Tensor to ``default_device()``, which can differ). Passing ``device=``
works as in the course.
"""

from __future__ import annotations

import numpy as np

import needle as ndl
from needle.backend_selection import default_tensor_device

__all__ = [
    "rand",
    "randn",
    "constant",
    "ones",
    "zeros",
    "randb",
    "one_hot",
    "zeros_like",
    "ones_like",
]


def _shape(shape: tuple, fn: str) -> tuple[int, ...]:
    """Validate a ``*shape`` argument; a single tuple/list is accepted too (an extension)."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    out = []
    for s in shape:
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)):
            raise TypeError(f"init.{fn}: shape entries must be ints, got {s!r} in {shape}")
        if s < 0:
            raise ValueError(f"init.{fn}: negative dimension {s} in shape {shape}")
        out.append(int(s))
    return tuple(out)


def _device(device):
    """``device``, or the default device of ``ndl.Tensor`` when None."""
    return default_tensor_device() if device is None else device


def rand(
    *shape,
    low: float = 0.0,
    high: float = 1.0,
    device=None,
    dtype: str = "float32",
    requires_grad: bool = False,
) -> "ndl.Tensor":
    """U[low, high) samples of shape ``shape``: ``device.rand(*shape) * (high - low) + low``."""
    shape = _shape(shape, "rand")
    device = _device(device)
    array = device.rand(*shape) * (high - low) + low
    return ndl.Tensor(array, device=device, dtype=dtype, requires_grad=requires_grad)


def randn(
    *shape,
    mean: float = 0.0,
    std: float = 1.0,
    device=None,
    dtype: str = "float32",
    requires_grad: bool = False,
) -> "ndl.Tensor":
    """Normal samples ``device.randn(*shape) * std + mean``, shape ``shape``."""
    shape = _shape(shape, "randn")
    device = _device(device)
    array = device.randn(*shape) * std + mean
    return ndl.Tensor(array, device=device, dtype=dtype, requires_grad=requires_grad)


def constant(
    *shape, c: float = 1.0, device=None, dtype: str = "float32", requires_grad: bool = False
) -> "ndl.Tensor":
    """A tensor of shape ``shape`` filled with ``c``."""
    shape = _shape(shape, "constant")
    device = _device(device)
    array = device.full(shape, c, dtype=dtype)
    return ndl.Tensor(array, device=device, dtype=dtype, requires_grad=requires_grad)


def ones(*shape, device=None, dtype: str = "float32", requires_grad: bool = False) -> "ndl.Tensor":
    """All ones, shape ``shape``."""
    return constant(*shape, c=1.0, device=device, dtype=dtype, requires_grad=requires_grad)


def zeros(*shape, device=None, dtype: str = "float32", requires_grad: bool = False) -> "ndl.Tensor":
    """All zeros, shape ``shape``."""
    return constant(*shape, c=0.0, device=device, dtype=dtype, requires_grad=requires_grad)


def randb(
    *shape, p: float = 0.5, device=None, dtype: str = "bool", requires_grad: bool = False
) -> "ndl.Tensor":
    """Bernoulli(p) samples, ``device.rand(*shape) <= p``, shape ``shape``.

    Under ``NEEDLE_BACKEND=nd`` NDArray holds only float32, so ``dtype="bool"`` gives a float32
    tensor of 0/1 (the course's NDArray cannot build a bool tensor at all); under
    ``NEEDLE_BACKEND=np`` it is a real bool array.
    """
    shape = _shape(shape, "randb")
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"init.randb: probability p must lie in [0, 1], got {p}")
    device = _device(device)
    array = device.rand(*shape) <= p
    if ndl.BACKEND == "nd" and dtype == "bool":
        dtype = "float32"
    return ndl.Tensor(array, device=device, dtype=dtype, requires_grad=requires_grad)


def one_hot(
    n: int, i, device=None, dtype: str = "float32", requires_grad: bool = False
) -> "ndl.Tensor":
    """Rows of the n×n identity picked by the integer labels ``i``: shape ``i.shape + (n,)``.

    ``i`` is a Tensor (the course's form) or, as an extension, any integer array-like.
    """
    device = _device(device)
    labels = np.asarray(i.numpy() if hasattr(i, "numpy") else i)
    if labels.size and not np.all(labels == np.round(labels)):
        raise ValueError(f"init.one_hot: labels must be whole numbers, got {labels}")
    labels = labels.astype("int32")
    if labels.size and (labels.min() < 0 or labels.max() >= n):
        raise ValueError(
            f"init.one_hot: labels must lie in [0, {n}), got min {labels.min()} "
            f"and max {labels.max()}"
        )
    return ndl.Tensor(
        device.one_hot(n, labels, dtype=dtype),
        device=device,
        dtype=dtype,
        requires_grad=requires_grad,
    )


def zeros_like(array, *, device=None, requires_grad: bool = False) -> "ndl.Tensor":
    """Zeros with ``array``'s shape and dtype, on ``device`` (default: ``array``'s device)."""
    device = device if device else array.device
    return zeros(*array.shape, dtype=array.dtype, device=device, requires_grad=requires_grad)


def ones_like(array, *, device=None, requires_grad: bool = False) -> "ndl.Tensor":
    """Ones with ``array``'s shape and dtype, on ``device`` (default: ``array``'s device)."""
    device = device if device else array.device
    return ones(*array.shape, dtype=array.dtype, device=device, requires_grad=requires_grad)
