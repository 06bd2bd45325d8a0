"""needle: the deep-learning framework of CMU 10-414/714, finished.

``import needle as ndl`` gives the course's namespace: tensors and autodiff (``ndl.Tensor``),
every op (``ndl.relu``, ``ndl.ops.relu``), devices (``ndl.cpu()``, ``ndl.cuda()``), and the
submodules ``init``, ``nn``, ``optim``, ``data`` and ``backend_ndarray``.
"""
from . import ops
from .ops import *
from .autograd import Op, Tensor, TensorOp, TensorTuple, TensorTupleOp, Value
from .autograd import enable_grad, is_grad_enabled, no_grad, set_grad_enabled
from . import autograd
from . import init
from .init import ones, zeros, zeros_like, ones_like
from . import data
from . import nn
from . import optim
from . import backend_ndarray
from .backend_selection import *
