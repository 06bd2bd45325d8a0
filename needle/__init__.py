"""needle: the deep-learning framework of CMU 10-414/714, finished.

``import needle as ndl`` gives the course's namespace: tensors and autodiff (``ndl.Tensor``),
every op (``ndl.relu``, ``ndl.ops.relu``), devices (``ndl.cpu()``, ``ndl.cuda()``), and the
submodules ``init``, ``nn``, ``optim``, ``data`` and ``backend_ndarray``, and ``ndl.compile`` (a
training step captured once and replayed as a kernel list, ``needle/fast/compile.py``).
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
from .fast.compile import compile
from .init import ones, ones_like, zeros, zeros_like
from .ops import *
