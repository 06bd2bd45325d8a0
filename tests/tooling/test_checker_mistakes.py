"""Student mode names the bug: each known mistake, planted in a copy of this project's needle in
the course's layout, is reported with its one-line diagnosis before the numbers.

Several mistakes go into one copy when they fall in different questions, and ``only=`` keeps
each run to the questions that hold them. The generators themselves (``mistakes.py``) are also
checked directly against hand-made wrong answers.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_checker import failures, skeleton

from companion.check import check, mistakes
from companion.check.diagnose import CheckFailure, check_adjoints, name_mistake


def plant(root, relative: str, code: str) -> None:
    """Append ``code`` to the copy's ``python/needle/<relative>`` (it runs at import)."""
    path = root / "python" / "needle" / relative
    path.write_text(path.read_text() + "\n\n" + code)


def details(report) -> dict[str, str]:
    return {r.question.id: r.detail for r in report.results if r.status != "pass"}


def first_line_after_header(detail: str) -> str:
    """The line right after '... is wrong...': where the named mistake goes."""
    return detail.splitlines()[1].strip()


HW1_GRADIENT_MISTAKES = """
_div_gradient = EWiseDiv.gradient


def _negated_divisor(self, out_grad, node):
    ga, gb = _div_gradient(self, out_grad, node)
    return ga, -gb


def _swapped(self, out_grad, node):
    a, b = node.inputs
    return out_grad * a, out_grad * b


def _sum_not_reshaped(self, out_grad, node):
    shape = node.inputs[0].shape
    lead = len(out_grad.shape) - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape)
                                      if n == 1 and out_grad.shape[lead + i] != 1)
    return summation(out_grad, axes=axes)


def _broadcast_without_restoring(self, out_grad, node):
    return broadcast_to(out_grad, node.inputs[0].shape)


def _batch_not_summed(self, out_grad, node):
    a, b = node.inputs
    return matmul(out_grad, transpose(b)), matmul(transpose(a), out_grad)


EWiseDiv.gradient = _negated_divisor
EWiseMul.gradient = _swapped
BroadcastTo.gradient = _sum_not_reshaped
Summation.gradient = _broadcast_without_restoring
MatMul.gradient = _batch_not_summed
"""


def test_hw1_gradient_mistakes_are_named(tmp_path):
    root = skeleton(tmp_path, "hw1")
    plant(root, "ops/ops_mathematic.py", HW1_GRADIENT_MISTAKES)
    report = check(
        root,
        only=[
            "divide_backward",
            "multiply_backward",
            "broadcast_to_backward",
            "summation_backward",
            "matmul_backward",
        ],
    )
    assert failures(report) == {
        q: "fail"
        for q in (
            "hw1_multiply_backward",
            "hw1_divide_backward",
            "hw1_matmul_backward",
            "hw1_summation_backward",
            "hw1_broadcast_to_backward",
        )
    }, report.format()
    d = details(report)
    assert first_line_after_header(d["hw1_divide_backward"]) == (
        "your adjoint of b equals the correct one times -1: check the sign of ∂(divide(a, b))/∂b"
    )
    assert first_line_after_header(d["hw1_multiply_backward"]).startswith(
        "your adjoint of a equals the correct adjoint of b: the adjoints are swapped"
    )
    assert first_line_after_header(d["hw1_broadcast_to_backward"]).startswith(
        "your adjoint of a has the right values in the wrong shape: it must have a's shape (3, 1)"
    )
    assert first_line_after_header(d["hw1_summation_backward"]).startswith(
        "your adjoint of a broadcasts out_grad (4,) to (4, 4) without first putting the summed "
        "axes back as size 1"
    )
    assert "broadcasting b over a's batch" in d["hw1_matmul_backward"]
    assert first_line_after_header(d["hw1_matmul_backward"]).startswith(
        "your adjoint of b keeps the batch axes (shape (2, 4, 2)): sum it over the axes b was "
        "broadcast along"
    )
    # the numbers still follow the named mistake
    assert "finite difference:" in d["hw1_divide_backward"]


TRANSPOSED_MATMUL = """
_matmul_gradient = MatMul.gradient


def _transposed(self, out_grad, node):
    ga, gb = _matmul_gradient(self, out_grad, node)
    return transpose(ga), gb


MatMul.gradient = _transposed


def _only_leading_axes(self, out_grad, node):
    # sums the axes broadcasting added in front, not the size-1 axes it stretched
    lead = len(out_grad.shape) - len(node.inputs[0].shape)
    return summation(out_grad, axes=tuple(range(lead))) if lead else out_grad


BroadcastTo.gradient = _only_leading_axes
"""


def test_a_transposed_matmul_adjoint_and_a_missing_sum_are_named(tmp_path):
    root = skeleton(tmp_path, "hw1")
    plant(root, "ops/ops_mathematic.py", TRANSPOSED_MATMUL)
    report = check(root, only=["matmul_backward", "broadcast_to_backward"])
    assert failures(report) == {
        "hw1_matmul_backward": "fail",
        "hw1_broadcast_to_backward": "fail",
    }, report.format()
    d = details(report)
    assert first_line_after_header(d["hw1_matmul_backward"]).startswith(
        "your adjoint of a is the transpose of the correct one: ∂(a @ b)/∂a = out_grad @ bᵀ"
    )
    assert first_line_after_header(d["hw1_broadcast_to_backward"]) == (
        "your adjoint of a has the output's shape (3, 4): sum it over the broadcast axes down "
        "to a's shape (3, 1)"
    )


HW3_MISTAKES = """
import math as _math

_sum = NDArray.sum
_matmul = NDArray.__matmul__


def _compact_from_zero(self):
    # reads the view from the start of the buffer: the offset is ignored
    return self if self.is_compact() else _view(self, self.shape, self.strides, 0)._copy()


def _sum_of_runs(self, axis=None, keepdims=False):
    # reduces consecutive elements without moving the axis last first
    if isinstance(axis, int) and axis != len(self.shape) - 1:
        n = self.shape[axis]
        rest = self.shape[:axis] + self.shape[axis + 1:]
        return _sum(self.compact().reshape((_math.prod(self.shape) // n, n)), axis=1).reshape(
            rest)
    return _sum(self, axis, keepdims)


def _tiles_in_tile_order(self, other):
    # the tiled result (m/T, p/T, T, T) reshaped to (m, p) without the permute
    tile = self._device.mod.__tile_size__
    m, p = self.shape[0], other.shape[-1]
    if self.ndim != 2 or m % tile or self.shape[1] % tile or p % tile:
        return _matmul(self, other)
    good = _matmul(self, other)
    return good.reshape((m // tile, tile, p // tile, tile)).permute((0, 2, 1, 3)).compact(
        ).reshape((m, p))


NDArray.compact = _compact_from_zero
NDArray.sum = _sum_of_runs
NDArray.__matmul__ = _tiles_in_tile_order
"""


def test_ndarray_mistakes_are_named(tmp_path):
    root = skeleton(tmp_path, "hw3")
    plant(root, "backend_ndarray/ndarray.py", HW3_MISTAKES)
    report = check(root, only=["compact", "reductions", "matmul"])
    assert failures(report) == {
        "hw3_compact": "fail",
        "hw3_reductions": "fail",
        "hw3_matmul": "fail",
    }, report.format()
    d = details(report)
    assert "A[1:4:2, 1:5, ::3].compact()" in d["hw3_compact"].splitlines()[0]
    assert first_line_after_header(d["hw3_compact"]).startswith(
        "your compact ignores the view's offset (36)"
    )
    assert first_line_after_header(d["hw3_reductions"]).startswith(
        "your sum over axis 0 reduces runs of 3 consecutive elements in memory"
    )
    assert first_line_after_header(d["hw3_matmul"]).startswith(
        "your tiled matmul's result is in tile order (m/T, p/T, T, T) read as (m, p) (T = 8)"
    )


HW4_FORWARD_MISTAKES = """
_dilate, _conv = dilate, conv


def dilate(a, axes, dilation):
    return _dilate(a, axes, dilation + 1)


def conv(a, b, stride=1, padding=1):
    return _conv(a, b, stride=stride, padding=padding + 1)
"""

HW4_CONV_BACKWARD_MISTAKE = """
from .ops_mathematic import transpose

_conv_gradient = Conv.gradient


def _dilated_by_stride(self, out_grad, node):
    # the course's formula for x's adjoint, with out_grad dilated by the stride, not stride - 1
    x, w = node.inputs
    k = w.shape[0]
    g = dilate(out_grad, (1, 2), self.stride)
    gx = conv(g, transpose(flip(w, (0, 1)), (2, 3)), stride=1, padding=k - 1 - self.padding)
    return gx, _conv_gradient(self, out_grad, node)[1]


Conv.gradient = _dilated_by_stride
"""


def test_conv_and_dilation_off_by_one_are_named(tmp_path):
    forward = skeleton(tmp_path / "a", "hw4")
    plant(forward, "ops/ops_conv.py", HW4_FORWARD_MISTAKES)
    report = check(forward, only=["dilate", "conv_forward"])
    assert failures(report) == {"hw4_dilate": "fail", "hw4_conv_forward": "fail"}, report.format()
    d = details(report)
    assert first_line_after_header(d["hw4_dilate"]).startswith(
        "your dilate inserts 2 zero(s) between elements instead of 1"
    )
    assert first_line_after_header(d["hw4_conv_forward"]) == (
        "your conv pads by 1 instead of the padding 0: one too many"
    )

    backward = skeleton(tmp_path / "b", "hw4")
    plant(backward, "ops/ops_conv.py", HW4_CONV_BACKWARD_MISTAKE)
    report = check(backward, only=["conv_backward"])
    assert failures(report) == {"hw4_conv_backward": "fail"}, report.format()
    assert first_line_after_header(details(report)["hw4_conv_backward"]).startswith(
        "your adjoint of x matches the course's formula with dilation 1 of out_grad (the "
        "stride is 1: dilate by stride - 1 = 0)"
    )


HW3_MORE_MISTAKES = """
_sum = NDArray.sum


def _compact_last_stride_one(self):
    # steps through the last axis one element at a time, whatever its stride
    if self.is_compact():
        return self
    return _view(self, self.shape, self.strides[:-1] + (1,), self._offset)._copy()


def _sum_next_axis(self, axis=None, keepdims=False):
    if isinstance(axis, int):
        axis = (axis + 1) % len(self.shape)
    return _sum(self, axis, keepdims)


NDArray.compact = _compact_last_stride_one
NDArray.sum = _sum_next_axis
"""


def test_an_ignored_stride_and_a_reduction_over_the_wrong_axis_are_named(tmp_path):
    root = skeleton(tmp_path, "hw3")
    plant(root, "backend_ndarray/ndarray.py", HW3_MORE_MISTAKES)
    report = check(root, only=["compact", "reductions"])
    assert failures(report) == {"hw3_compact": "fail", "hw3_reductions": "fail"}, report.format()
    d = details(report)
    assert first_line_after_header(d["hw3_compact"]) == (
        "your compact ignores the stride of axis 2 (6, used as 1)"
    )
    assert first_line_after_header(d["hw3_reductions"]) == (
        "your sum reduced axis 1 instead of axis 0"
    )


# ---- the generators on their own -------------------------------------------------------------
def test_a_sum_over_the_wrong_axes_is_named():
    g = np.arange(16.0).reshape(4, 4)
    correct = g.sum(axis=1, keepdims=True)  # broadcast_to((4, 1) -> (4, 4))
    found = mistakes.adjoint_variants(["a"], [np.zeros((4, 1))], g, [correct], op="(bcast)")
    wrong = g.sum(axis=0).reshape(4, 1)
    assert name_mistake(wrong, found[0], rtol=1e-6, atol=1e-6).startswith(
        "your adjoint of a sums out_grad over axes (0,), which are not the axes that were broadcast"
    )
    assert name_mistake(correct, found[0], rtol=1e-6, atol=1e-6) is None


def test_compact_variants_name_an_ignored_stride():
    a = np.arange(120.0).reshape(4, 5, 6)
    view = a[::2, 1:4, ::3]
    shape, strides, offset = (2, 3, 2), (60, 6, 3), 6
    found = mistakes.compact_variants(a.ravel(), shape, strides, offset)
    assert mistakes.read_strided(a.ravel(), shape, strides, offset).tolist() == view.tolist()
    ignored = mistakes.read_strided(a.ravel(), shape, (60, 6, 1), offset)
    assert name_mistake(ignored, found, rtol=0, atol=0) == (
        "your compact ignores the stride of axis 2 (3, used as 1)"
    )


def test_unknown_wrong_answers_are_not_given_a_name():
    """A wrong adjoint that matches no variant keeps the plain finite-difference report."""
    x = np.array([[1.0, 2.0], [3.0, 4.0]])
    with pytest.raises(CheckFailure) as info:
        check_adjoints(
            "negate(a) backward",
            [x * 0 + 0.5],
            [-np.ones((2, 2))],
            ["a"],
            inputs={"a": x},
            out_grad=np.ones((2, 2)),
            op="(negate(a))",
        )
    text = str(info.value)
    assert "your adjoint" not in text and "finite difference:" in text


def test_a_wrong_parameter_adjoint_is_reported_and_named():
    """Adjoints of parameters (not among the shown inputs) are compared and named as well."""
    x = np.ones((2, 2))
    with pytest.raises(CheckFailure) as info:
        check_adjoints(
            "layer(x) backward",
            [np.ones((2, 2)), -np.full((3,), 2.0)],
            [np.ones((2, 2)), np.full((3,), 2.0)],
            ["x", "weight"],
            inputs={"x": x},
            out_grad=np.ones((2, 2)),
        )
    assert (
        str(info.value)
        .splitlines()[1]
        .strip()
        .startswith("your adjoint of weight equals the correct one times -1")
    )


def test_conv_backward_padding_off_by_one_is_named():
    from companion.check.hw4 import _conv_adjoints, _conv_backward_variants, conv_ref

    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((2, 6, 6, 2)), rng.standard_normal((3, 3, 2, 3))
    g = rng.standard_normal(conv_ref(x, w, 2, 1).shape)
    correct = _conv_adjoints(x, w, g, 2, 1, 1, 1, 1)
    wrong_gx, _ = _conv_adjoints(x, w, g, 2, 1, 1, 2, 2)  # padding K - 1 - p + 1
    found = _conv_backward_variants(2, 1)([x, w], g, list(correct))
    assert name_mistake(wrong_gx, found[0], rtol=1e-6, atol=1e-6).startswith(
        "your adjoint of x matches the course's formula with padding off by +1 (x̄ needs "
        "padding K - 1 - p = 1"
    )


def test_view_mistakes_are_named():
    a = np.arange(120.0).reshape(4, 5, 6)
    found = mistakes.permute_variants(a, (1, 0, 2))
    unpermuted_strides = a.reshape(5, 4, 6)  # the shape permuted, not the strides
    assert name_mistake(unpermuted_strides, found, rtol=0, atol=0).startswith(
        "your permute reorders the shape but not the strides"
    )
    found = mistakes.permute_variants(a, (2, 0, 1))
    assert (
        name_mistake(np.transpose(a, (1, 2, 0)).copy().reshape(6, 4, 5), found, rtol=0, atol=0)
        is None
    )  # some other wrong answer: no name
    # a slice of a permuted view: A.permute((2, 1, 0))[1:5, 2:4, ::2]
    at = np.transpose(a, (2, 1, 0))
    view = at[1:5, 2:4, ::2]
    base = ((6, 5, 4), (1, 6, 30), 0)
    found = mistakes.getitem_variants(a, view, [1, 2, 0], [1, 1, 2], base)
    no_steps = mistakes.read_strided(a.ravel(), view.shape, (1, 6, 30), 1 + 12)
    assert name_mistake(no_steps, found, rtol=0, atol=0).startswith(
        "your getitem ignores the slice steps"
    )
    no_starts = at[0:4, 0:2, ::2]
    assert name_mistake(no_starts, found, rtol=0, atol=0).startswith(
        "your getitem ignores the slice starts"
    )
    assert name_mistake(view, found, rtol=0, atol=0) is None


SGD_WITHOUT_DECAY_AT_MOMENTUM_0 = """
_sgd_step = SGD.step


def _decay_only_with_momentum(self):
    # weight decay applied only on the momentum branch: at momentum 0 it is dropped
    if self.momentum == 0:
        wd, self.weight_decay = self.weight_decay, 0.0
        try:
            _sgd_step(self)
        finally:
            self.weight_decay = wd
    else:
        _sgd_step(self)


SGD.step = _decay_only_with_momentum
"""

ADAM_WITHOUT_DECAY = """
_adam_step = Adam.step


def _adam_ignoring_decay(self):
    wd, self.weight_decay = self.weight_decay, 0.0
    try:
        _adam_step(self)
    finally:
        self.weight_decay = wd


Adam.step = _adam_ignoring_decay
"""


def test_sgd_dropping_weight_decay_at_momentum_0_fails(tmp_path):
    """The course's tests run SGD at momentum 0 with weight decay: an SGD that decays only on
    its momentum branch fails hw2_sgd (the mlp_resnet questions never reach momentum 0)."""
    root = skeleton(tmp_path, "hw2")
    plant(root, "optim.py", SGD_WITHOUT_DECAY_AT_MOMENTUM_0 + ADAM_WITHOUT_DECAY)
    report = check(root, only=["sgd", "adam"])
    assert failures(report) == {"hw2_sgd": "fail", "hw2_adam": "fail"}, report.format()
    d = details(report)
    assert "SGD(lr=0.1, momentum=0, weight_decay=0.01)" in d["hw2_sgd"].splitlines()[0]
    assert "weight decay applies at every momentum" in d["hw2_sgd"]
    assert "Adam(lr=0.1, weight_decay=0.01)" in d["hw2_adam"].splitlines()[0]


ADAM_T_PER_PARAMETER = """
import numpy as _np


def _adam_t_per_parameter(self):
    # t counted per parameter, and only when it has a gradient: right whenever every parameter
    # has a gradient (all the course tests), different from PyTorch when one has none
    if not hasattr(self, "_ts"):
        self._ts, self._m, self._v = {}, {}, {}
    for i, p in enumerate(self.params):
        if p.grad is None:
            continue
        t = self._ts[i] = self._ts.get(i, 0) + 1
        g = p.grad.numpy() + self.weight_decay * p.numpy()
        m = self._m[i] = self.beta1 * self._m.get(i, 0.0) + (1 - self.beta1) * g
        v = self._v[i] = self.beta2 * self._v.get(i, 0.0) + (1 - self.beta2) * g * g
        w = p.numpy() - self.lr * (m / (1 - self.beta1 ** t)) / (
            _np.sqrt(v / (1 - self.beta2 ** t)) + self.eps)
        p.data = Tensor(w.astype("float32"))


Adam.step = _adam_t_per_parameter
"""


def test_a_difference_only_when_a_gradient_is_none_is_a_warning(tmp_path):
    root = skeleton(tmp_path, "hw2")
    plant(root, "optim.py", ADAM_T_PER_PARAMETER)
    report = check(root, only=["adam"])
    assert failures(report) == {}, report.format()
    (warning,) = report.results[0].warnings
    assert warning.startswith("Adam(lr=0.1, weight_decay=0.01) when parameter 1 has grad None")
    assert "parameter 1 differs from skipping it" in warning
