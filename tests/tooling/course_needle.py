"""A course-style needle for student-mode tests: this project's ``needle/`` copied into a course
layout (``hwN/python/needle``) and patched to behave as the course's reference does wherever
this project differs.

What :func:`make_course_needle` changes in the copy (the course's code, from its homework
skeletons and their tests; the signatures are the course API's):

* the extensions are gone: ``needle.fast`` (``ndl.compile``), ``needle.checkpoint``,
  ``needle.export``, ``needle.distributed``, and ``ndl.no_grad`` / ``enable_grad`` /
  ``set_grad_enabled`` / ``is_grad_enabled``;
* ``Tensor.data = value`` is the course's setter: ``self.cached_data =
  value.realize_cached_data()`` after a dtype assert, no shape or device check;
* ``Tensor.backward(out_grad=None)`` (no keywords) calls the course's
  ``compute_gradient_of_variables(output_tensor, out_grad)``: reverse topological order, the
  sum of the partial adjoints, ``node.grad = ...`` on every node (interior ones included), the
  gradient graph recorded; there is no ``retain_grad``;
* ``BroadcastTo`` and ``Summation`` gradients build new nodes (sum then reshape; reshape then
  broadcast), never returning their input (no identity shortcut);
* element-wise ops of two tensors need equal shapes (hw3's ``NDArray.ewise_or_scalar``
  asserts "operation needs two equal-sized arrays"; hw2's numpy backend would broadcast the
  forward pass but return gradients of the broadcast shape);
* ``SGD.step`` and ``Adam.step`` are written with tensors as the course's are and update with
  ``p.data = ...`` (a new array each step); ``clip_grad_norm`` returns nothing;
* ``DataLoader(dataset, batch_size=1, shuffle=False)`` takes no other keyword.

:func:`import_through_homework_root` makes a copy import the way a real student's hw2 did
(``from python.needle.init.init_basic import randb`` in ``nn_basic.py``), which works only with
the homework root on ``sys.path``, as in the course.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import needle

PACKAGE = Path(needle.__file__).resolve().parent
#: This project's modules that the course's package does not have.
EXTENSIONS = ("fast", "checkpoint", "export", "distributed")

COURSE_INIT = '''"""needle as the course exports it (no grad-mode switches, no ndl.compile)."""

from . import autograd, backend_ndarray, data, init, nn, ops, optim
from .autograd import Op, Tensor, TensorOp, TensorTuple, TensorTupleOp, Value
from .backend_selection import *
from .init import ones, ones_like, zeros, zeros_like
from .ops import *
'''

COURSE_AUTOGRAD = '''

# ---- the course's Tensor and reverse mode (course_needle.py) ----
del Value.retain_grad
del no_grad, enable_grad, set_grad_enabled, is_grad_enabled


def _course_data_setter(self, value):
    assert isinstance(value, Tensor)
    assert value.dtype == self.dtype, "%s %s" % (value.dtype, self.dtype)
    self.cached_data = value.realize_cached_data()


Tensor.data = Tensor.data.setter(_course_data_setter)


def _course_backward(self, out_grad=None):
    out_grad = (
        out_grad
        if out_grad is not None
        else Tensor.make_const(_full(self.shape, 1.0, self.dtype, self.device))
    )
    compute_gradient_of_variables(self, out_grad)


_course_backward.__qualname__ = "Tensor.backward"
Tensor.backward = _course_backward


def compute_gradient_of_variables(output_tensor, out_grad):
    """The course's reverse mode: every node gets node.grad, the sum of its partial adjoints.
    (An adjoint None, which this project's ops give an input that needs none, is skipped.)"""
    node_to_output_grads_list = {output_tensor: [out_grad]}
    for node in reversed(find_topo_sort([output_tensor])):
        grads = [g for g in node_to_output_grads_list.get(node, []) if g is not None]
        if not grads:
            continue
        node.grad = sum_node_list(grads)
        if node.is_leaf():
            continue
        for inp, grad in zip(node.inputs, node.op.gradient_as_tuple(node.grad, node)):
            node_to_output_grads_list.setdefault(inp, []).append(grad)
'''

COURSE_OPS = """

# ---- the course's gradients and shape rules (course_needle.py) ----
def _course_broadcast_gradient(self, out_grad, node):
    in_shape = node.inputs[0].shape
    lead = len(self.shape) - len(in_shape)
    axes = tuple(range(lead)) + tuple(
        i + lead for i, d in enumerate(in_shape) if d == 1 and self.shape[i + lead] != 1
    )
    summed = summation(out_grad, axes) if axes else out_grad
    return reshape(summed, in_shape)


def _course_summation_gradient(self, out_grad, node):
    in_shape = node.inputs[0].shape
    axes = range(len(in_shape)) if self.axes is None else self.axes
    axes = (axes,) if isinstance(axes, int) else axes
    kept = list(in_shape)
    for axis in axes:
        kept[axis] = 1
    return broadcast_to(reshape(out_grad, tuple(kept)), in_shape)


BroadcastTo.gradient = _course_broadcast_gradient
Summation.gradient = _course_summation_gradient


def _course_equal_shapes(cls):
    compute = cls.compute

    def checked(self, a, b):
        assert a.shape == b.shape, "operation needs two equal-sized arrays"
        return compute(self, a, b)

    cls.compute = checked


for _cls in (EWiseAdd, EWiseMul, EWiseDiv, EWisePow):
    _course_equal_shapes(_cls)
"""

COURSE_OPTIM = """

# ---- the course's optimizers: tensors, and p.data = ... (course_needle.py) ----
def _course_sgd_step(self):
    for i, p in enumerate(self.params):
        if p.grad is None:
            continue
        grad = p.grad.data + self.weight_decay * p.data
        self.u[i] = (self.momentum * self.u.get(i, 0.0) + (1 - self.momentum) * grad).data
        p.data = p.data - self.lr * self.u[i]


def _course_adam_step(self):
    self.t += 1
    for i, p in enumerate(self.params):
        if p.grad is None:
            continue
        grad = p.grad.data + self.weight_decay * p.data
        self.m[i] = (self.beta1 * self.m.get(i, 0.0) + (1 - self.beta1) * grad).data
        self.v[i] = (self.beta2 * self.v.get(i, 0.0) + (1 - self.beta2) * grad**2).data
        m_hat = self.m[i] / (1 - self.beta1**self.t)
        v_hat = self.v[i] / (1 - self.beta2**self.t)
        p.data = p.data - self.lr * m_hat / (v_hat**0.5 + self.eps)


_companion_clip = Optimizer.clip_grad_norm


def _course_clip_grad_norm(self, max_norm=0.25):
    _companion_clip(self, max_norm)


SGD.step = _course_sgd_step
Adam.step = _course_adam_step
Optimizer.clip_grad_norm = _course_clip_grad_norm
"""

COURSE_DATA = """

# ---- the course's DataLoader signature (course_needle.py) ----
_companion_loader_init = DataLoader.__init__


def _course_loader_init(self, dataset, batch_size=1, shuffle=False):
    _companion_loader_init(self, dataset, batch_size, shuffle)


_course_loader_init.__qualname__ = "DataLoader.__init__"
DataLoader.__init__ = _course_loader_init
"""

PATCHES = {
    "autograd.py": COURSE_AUTOGRAD,
    "ops/ops_mathematic.py": COURSE_OPS,
    "optim.py": COURSE_OPTIM,
    "data/data_basic.py": COURSE_DATA,
}


def make_course_needle(python: Path) -> Path:
    """Write the course-style needle into ``python/needle`` (``python`` is a homework's
    ``hwN/python``, created if absent); returns ``python``."""
    package = python / "needle"
    shutil.copytree(PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    for name in EXTENSIONS:
        path = package / name
        shutil.rmtree(path) if path.is_dir() else (package / f"{name}.py").unlink()
    (package / "__init__.py").write_text(COURSE_INIT)
    for relpath, patch in PATCHES.items():
        path = package / relpath
        path.write_text(path.read_text() + patch)
    return python


#: The line a real student's hw2 ``nn_basic.py`` had, and the code that used it.
HOMEWORK_ROOT_IMPORT = "from python.needle.init.init_basic import randb\n"


def import_through_homework_root(python: Path) -> Path:
    """Make ``python/needle/nn/nn_basic.py`` import ``randb`` as a real student's hw2 did, through
    the homework root (``python``'s parent), and use it in ``Dropout``; returns the file."""
    path = python / "needle" / "nn" / "nn_basic.py"
    text = path.read_text()
    anchor = "import needle.init as init\n"
    assert anchor in text and "init.randb(" in text, "nn_basic.py changed: update this fixture"
    text = text.replace(anchor, anchor + HOMEWORK_ROOT_IMPORT, 1)
    path.write_text(text.replace("init.randb(", "randb("))
    return path
