"""needle: the deep-learning framework of CMU 10-414/714, finished.

``import needle as ndl`` gives the course's namespace: tensors and autodiff (``ndl.Tensor``),
every op (``ndl.relu``, ``ndl.ops.relu``), devices (``ndl.cpu()``, ``ndl.cuda()``), and the
submodules ``init``, ``nn``, ``optim``, ``data`` and ``backend_ndarray``, and ``ndl.compile`` (a
training step captured once and replayed as a kernel list, ``needle/fast/compile.py``, imported
on first use).
"""

from . import autograd, backend_ndarray, data, init, nn, ops, optim
from .autograd import (
    Op,
    Tensor,
    TensorOp,
    TensorTuple,
    TensorTupleOp,
    Value,
    enable_grad,
    is_grad_enabled,
    no_grad,
    set_grad_enabled,
)
from .backend_selection import *
from .init import ones, ones_like, zeros, zeros_like
from .ops import *


def __getattr__(name: str) -> object:
    """``ndl.compile`` loads the speed wing (``needle.fast``) on first use."""
    if name == "compile":
        from .fast import compile

        return compile
    raise AttributeError(f"module 'needle' has no attribute {name!r}")
