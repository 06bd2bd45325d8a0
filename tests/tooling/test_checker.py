"""Student mode (``python -m companion.check``) on the course's skeleton layout.

Each test builds a homework folder in tmp_path with this project's needle copied, as it is, into
``hwN/python/needle`` and thin ``apps/`` modules (for hw0 a thin ``src/simple_ml.py``), then
checks it: the
finished package passes every question; a wrong adjoint, a ``NotImplementedError`` and a
segfaulting C++ function each cost exactly their own question. Wrong homework never passes (ops
that write into their inputs, optimizer state kept wrongly, student code that changes numpy's
comparisons), and nothing hangs or misleads (an import that never returns, exits, a syntax
error, a worker's children, a slow build, a file named build, bad time limits). The named
mistakes are in test_checker_mistakes.py.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np
import pytest

import needle
from companion.check import QUESTIONS, check, questions_for
from companion.check.__main__ import main
from companion.check.questions import BY_ID, HOMEWORKS

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(needle.__file__).resolve().parent
APPS = {"simple_ml", "mlp_resnet", "models"}


def skeleton(tmp_path: Path, hw: str) -> Path:
    """A course-layout folder ``tmp_path/hw`` holding a copy of this project's needle."""
    root = tmp_path / hw
    if hw == "hw0":
        (root / "src").mkdir(parents=True)
        (root / "src" / "simple_ml.py").write_text(
            "from companion.apps.simple_ml import (add, parse_mnist, softmax_loss,\n"
            "                                   softmax_regression_epoch, nn_epoch)\n"
        )
        return root
    shutil.copytree(
        PACKAGE, root / "python" / "needle", ignore=shutil.ignore_patterns("__pycache__")
    )
    (root / "apps").mkdir()
    for app in APPS:
        (root / "apps" / f"{app}.py").write_text(f"from companion.apps.{app} import *\n")
    return root


def statuses(report) -> dict[str, str]:
    return {r.question.id: r.status for r in report.results}


def failures(report) -> dict[str, str]:
    return {q: s for q, s in statuses(report).items() if s != "pass"}


@pytest.mark.parametrize("hw", ["hw1", "hw2", "hw3", "hw4", "hw4_extra"])
def test_finished_package_passes_every_question(tmp_path, hw):
    report = check(skeleton(tmp_path, hw))
    assert report.hw == hw
    assert failures(report) == {}, report.format()
    assert [r.question.id for r in report.results] == [q.id for q in questions_for(hw)]
    # the worker imported the copy, not the installed package
    assert Path(report.needle).resolve().is_relative_to(tmp_path.resolve()), report.needle


def test_hw0_with_the_compiled_extension_passes(tmp_path):
    # Several Pythons may share one checkout (CI's venvs): take the module built for this one.
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    built = sorted((ROOT / "companion" / "apps").glob(f"simple_ml_ext{suffix}"))
    if not built:
        pytest.skip(f"companion/apps/simple_ml_ext{suffix} is not compiled here")
    root = skeleton(tmp_path, "hw0")
    shutil.copy(ROOT / "src" / "simple_ml_ext.cc", root / "src" / "simple_ml_ext.cpp")
    shutil.copy(built[0], root / "src" / "simple_ml_ext.so")
    os.utime(root / "src" / "simple_ml_ext.so")  # newer than the source: no rebuild
    report = check(root)
    assert report.build == ["src/simple_ml_ext.so is up to date"]
    assert failures(report) == {}, report.format()


def test_hw0_extension_built_for_another_python_is_named(tmp_path):
    """A module that fails to load with an undefined symbol (what a .so compiled for another
    Python does) is reported as built for another Python, not as a wrong answer."""
    compiler = shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        pytest.skip("no C++ compiler here")
    root = skeleton(tmp_path, "hw0")
    source = root / "src" / "simple_ml_ext.cpp"
    source.write_text(
        'extern "C" void a_symbol_no_python_defines();\n'
        'extern "C" void* PyInit_simple_ml_ext() { a_symbol_no_python_defines(); return 0; }\n'
    )
    subprocess.run(
        [compiler, "-shared", "-fPIC", str(source), "-o", str(root / "src" / "simple_ml_ext.so")],
        check=True,
    )
    os.utime(root / "src" / "simple_ml_ext.so")
    report = check(root, only=["hw0_softmax_regression_epoch_cpp"])
    text = report.format()
    assert statuses(report)["hw0_softmax_regression_epoch_cpp"] == "fail", text
    assert "built for another Python" in text and "delete it" in text, text


BROKEN_DIVIDE = """

_correct_divide_gradient = EWiseDiv.gradient


def _broken_divide_gradient(self, out_grad, node):
    # the adjoint of the divisor has the wrong sign
    ga, gb = _correct_divide_gradient(self, out_grad, node)
    return ga, -gb


EWiseDiv.gradient = _broken_divide_gradient
"""


def test_a_wrong_adjoint_fails_only_its_question_and_is_named(tmp_path):
    root = skeleton(tmp_path, "hw1")
    ops = root / "python" / "needle" / "ops" / "ops_mathematic.py"
    ops.write_text(ops.read_text() + BROKEN_DIVIDE)
    report = check(root)
    assert failures(report) == {"hw1_divide_backward": "fail"}, report.format()
    detail = next(r.detail for r in report.results if r.question.id == "hw1_divide_backward")
    assert "the adjoint of 'b' does not match a finite-difference check" in detail
    assert "adjoint of 'a'" not in detail
    assert "off by up to" in detail and "finite difference:" in detail


DETACHING_BACKWARD = """

_course_backward = Tensor.backward


def _detaching_backward(self, out_grad=None, **kwargs):
    # a reverse mode that stores constants: the gradients can no longer be differentiated
    _course_backward(self, out_grad, create_graph=False)


Tensor.backward = _detaching_backward
"""


def test_a_needle_that_detaches_gradients_fails_compute_gradient(tmp_path):
    """The course's hw1 test differentiates x.grad; a reverse mode that stores constants passes
    every first-derivative check but must fail hw1_compute_gradient, saying why."""
    root = skeleton(tmp_path, "hw1")
    autograd = root / "python" / "needle" / "autograd.py"
    autograd.write_text(autograd.read_text() + DETACHING_BACKWARD)
    report = check(root, only=["compute_gradient"])
    assert failures(report) == {"hw1_compute_gradient": "fail"}, report.format()
    detail = next(r.detail for r in report.results if r.question.id == "hw1_compute_gradient")
    assert "x2.grad for y = x2*x2 + x2*x3 is a constant" in detail
    assert "detaches the gradients" in detail


NOT_IMPLEMENTED = """


def _layernorm_forward(self, x):
    ### BEGIN YOUR SOLUTION
    raise NotImplementedError()
    ### END YOUR SOLUTION


LayerNorm1d.forward = _layernorm_forward
"""


def test_a_not_implemented_question_is_reported_as_such(tmp_path, capsys):
    root = skeleton(tmp_path, "hw2")
    nn_basic = root / "python" / "needle" / "nn" / "nn_basic.py"
    nn_basic.write_text(nn_basic.read_text() + NOT_IMPLEMENTED)
    report = check(root)
    assert failures(report) == {"hw2_layernorm": "not implemented"}, report.format()
    detail = next(r.detail for r in report.results if r.question.id == "hw2_layernorm")
    assert "nn_basic.py" in detail and "(LayerNorm1d)" in detail
    # the command line prints the same report and exits 1
    assert main([str(root), "-k", "layernorm", "-k", "linear"]) == 1
    out = capsys.readouterr().out
    assert "not implemented  hw2_layernorm" in out and "pass             hw2_linear" in out
    assert "1 pass, 1 not implemented" in out


def test_a_question_that_never_returns_times_out_and_the_rest_still_run(tmp_path):
    root = skeleton(tmp_path, "hw2")
    nn_basic = root / "python" / "needle" / "nn" / "nn_basic.py"
    nn_basic.write_text(
        nn_basic.read_text()
        + NOT_IMPLEMENTED.replace("raise NotImplementedError()", "while True:\n        pass")
    )
    report = check(root, only=["layernorm", "flatten"], timeout=2)
    assert statuses(report) == {"hw2_layernorm": "timeout", "hw2_flatten": "pass"}


# The crashing extension uses Python's C API directly rather than pybind11: it compiles in well
# under a second, and the checker builds it with the course's command all the same.
SEGFAULT_CPP = r"""
#include <Python.h>

static PyObject *softmax_regression_epoch_cpp(PyObject *self, PyObject *args) {
  volatile float *p = nullptr;
  float x = *p;  // a null dereference, as in a student's off-by-everything pointer bug
  return PyFloat_FromDouble(x);
}

static PyMethodDef methods[] = {
    {"softmax_regression_epoch_cpp", softmax_regression_epoch_cpp, METH_VARARGS, nullptr},
    {nullptr, nullptr, 0, nullptr}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "simple_ml_ext", nullptr, -1,
                                    methods};

PyMODINIT_FUNC PyInit_simple_ml_ext(void) { return PyModule_Create(&module); }
"""


def test_a_segfault_in_student_cpp_costs_only_that_question(tmp_path):
    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler to build the crashing extension")
    root = skeleton(tmp_path, "hw0")
    (root / "src" / "simple_ml_ext.cpp").write_text(SEGFAULT_CPP)
    report = check(root)
    assert report.build == ["built src/simple_ml_ext.so"], report.build
    assert failures(report) == {"hw0_softmax_regression_epoch_cpp": "crashed"}, report.format()
    detail = report.results[-1].detail
    assert "SIGSEGV" in detail and "Segmentation fault" in detail
    assert "during the call softmax_regression_epoch_cpp(X, y, theta, lr=0.2, batch=15)" in detail


def test_layout_errors_name_the_problem(tmp_path):
    (tmp_path / "hw2").mkdir()
    with pytest.raises(FileNotFoundError, match="python/needle/__init__.py is missing"):
        check(tmp_path / "hw2")
    (tmp_path / "mywork").mkdir()
    with pytest.raises(ValueError, match="pass --hw"):
        check(tmp_path / "mywork")
    assert main([str(tmp_path / "mywork")]) == 2


def test_every_question_has_a_check_function_and_nothing_else_does():
    import importlib

    for hw in HOMEWORKS:
        module = importlib.import_module(f"companion.check.{hw}")
        checks = {
            name
            for name in dir(module)
            if name.startswith(f"{hw}_") and callable(getattr(module, name))
        }
        if hw == "hw4":  # hw4_extra's ids also start with "hw4_"
            checks = {c for c in checks if not c.startswith("hw4_extra")}
        assert checks == {q.id for q in questions_for(hw)}, hw


def _markers_in(path: Path) -> set[str]:
    """Names X of every ``pytest.mark.X`` written in a test file."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "mark"
        ):
            names.add(node.attr)
    return names


def test_every_question_has_a_marked_test_and_every_marker_is_a_question():
    used: dict[str, set[str]] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        for name in _markers_in(path):
            used.setdefault(name, set()).add(path.name)
    homework_markers = {m for m in used if m.startswith(HOMEWORKS)}
    unknown = homework_markers - set(BY_ID)
    assert not unknown, f"markers that name no question: {sorted(unknown)}"
    untested = [q.id for q in QUESTIONS if q.id not in used]
    assert not untested, f"questions with no test carrying their marker: {untested}"


def test_question_ids_are_unique_and_valid_marker_names():
    ids = [q.id for q in QUESTIONS]
    assert len(ids) == len(set(ids))
    assert all(q.id.isidentifier() and q.id.startswith(q.hw + "_") for q in QUESTIONS)


# ---- never pass wrong homework -----------------------------------------------------------------
def plant(root: Path, relative: str, code: str) -> None:
    """Append ``code`` to the copy's ``python/needle/<relative>`` (it runs at import)."""
    path = root / "python" / "needle" / relative
    path.write_text(path.read_text() + "\n\n" + code)


IN_PLACE_OPS = """
def _full(a):
    return tuple(slice(None) for _ in a.shape)


def _add_scalar_in_place(self, a):
    a[_full(a)] = a + self.scalar  # a += self.scalar on the input
    return a


def _relu_in_place(self, a):
    a[_full(a)] = a.maximum(0)  # a[a < 0] = 0 on the input
    return a


def _negate_gradient_in_place(self, out_grad, node):
    g = out_grad.realize_cached_data()
    g[_full(g)] = -g  # the right value, written into the caller's out_grad
    return out_grad


AddScalar.compute = _add_scalar_in_place
ReLU.compute = _relu_in_place
Negate.gradient = _negate_gradient_in_place
"""


def test_an_op_that_writes_into_its_input_fails(tmp_path):
    root = skeleton(tmp_path, "hw1")
    plant(root, "ops/ops_mathematic.py", IN_PLACE_OPS)
    report = check(root, only=["add_scalar", "relu", "negate", "exp"])
    assert failures(report) == {
        q: "fail"
        for q in (
            "hw1_add_scalar_forward",
            "hw1_add_scalar_backward",
            "hw1_relu_forward",
            "hw1_relu_backward",
            "hw1_negate_backward",
        )
    }, report.format()
    d = {r.question.id: r.detail for r in report.results}
    assert d["hw1_add_scalar_forward"].startswith(
        "add_scalar(a, 1.7) (forward) changed its input 'a' in place"
    )
    assert d["hw1_negate_backward"].startswith("negate(a): the gradient changed out_grad in place")
    # the composite expressions of compute_gradient catch it too
    report = check(root, only=["compute_gradient"])
    assert "add_scalar(x, 1) * x + relu(x) * x" in report.results[0].detail


OPTIMIZER_STATE_MISTAKES = """
import numpy as _np


def _sgd_one_momentum_buffer(self):
    # one momentum buffer shared by every parameter
    for p in self.params:
        if p.grad is None:
            continue
        g = p.grad.numpy() + self.weight_decay * p.numpy()
        self._shared = self.momentum * getattr(self, "_shared", 0.0) + (1 - self.momentum) * g
        p.data = Tensor((p.numpy() - self.lr * self._shared).astype("float32"))


def _adam_t_per_update(self):
    # one t, but counted once per parameter update, not once per step()
    if not hasattr(self, "_ts"):
        self._ts, self._m, self._v = {}, {}, {}
    for i, p in enumerate(self.params):
        if p.grad is None:
            continue
        t = self._ts["t"] = self._ts.get("t", 0) + 1
        g = p.grad.numpy() + self.weight_decay * p.numpy()
        m = self._m[i] = self.beta1 * self._m.get(i, 0.0) + (1 - self.beta1) * g
        v = self._v[i] = self.beta2 * self._v.get(i, 0.0) + (1 - self.beta2) * g * g
        w = p.numpy() - self.lr * (m / (1 - self.beta1 ** t)) / (
            _np.sqrt(v / (1 - self.beta2 ** t)) + self.eps)
        p.data = Tensor(w.astype("float32"))


SGD.step = _sgd_one_momentum_buffer
Adam.step = _adam_t_per_update
"""


def test_optimizer_state_kept_wrongly_fails(tmp_path):
    """One momentum buffer for all parameters, Adam's t counted per parameter update: both pass
    with a single parameter; two parameters of different shapes catch them."""
    root = skeleton(tmp_path, "hw2")
    plant(root, "optim.py", OPTIMIZER_STATE_MISTAKES)
    report = check(root, only=["sgd", "adam"])
    assert failures(report) == {"hw2_sgd": "fail", "hw2_adam": "fail"}, report.format()
    adam = next(r.detail for r in report.results if r.question.id == "hw2_adam")
    assert adam.startswith("parameter 0 (shape (3, 2)) after 3 steps of Adam(lr=0.1, "), adam


TAMPERED_NUMPY = """
import numpy as _np

_np.isclose = lambda a, b, *args, **kwargs: _np.ones(_np.broadcast(a, b).shape, dtype=bool)
"""

WRONG_MULTIPLY = """
_np_multiply_ok = EWiseMul.compute


def _wrong_multiply(self, a, b):
    import numpy
    numpy.isclose = lambda x, y, *args, **kwargs: numpy.ones(numpy.broadcast(x, y).shape, bool)
    return a + b


EWiseMul.compute = _wrong_multiply
"""


def test_student_code_cannot_change_the_verdict(tmp_path):
    """Replacing numpy.isclose (at import, or while a question runs) does not make a wrong
    multiply pass: the checker notices the replacement, and recomputes each verdict in its
    own process."""
    at_import = skeleton(tmp_path / "a", "hw1")
    plant(at_import, "__init__.py", TAMPERED_NUMPY)
    report = check(at_import, only=["multiply_forward", "add_forward"])
    assert set(statuses(report).values()) == {"error"}, report.format()
    assert "your code replaced numpy.isclose" in report.results[0].detail
    during = skeleton(tmp_path / "b", "hw1")
    plant(during, "ops/ops_mathematic.py", WRONG_MULTIPLY)
    report = check(during, only=["multiply_forward", "add_forward"])
    assert failures(report) == {"hw1_multiply_forward": "fail"}, report.format()


def test_the_guard_names_and_undoes_a_rewritten_checker_function():
    """Replacing a function's code keeps its identity; the guard notices that too."""
    from companion.check import diagnose

    guard = diagnose.NumpyGuard()
    original = diagnose.mismatch.__code__
    try:
        diagnose.mismatch.__code__ = (lambda got, expected, *, rtol=0, atol=0: None).__code__
        assert diagnose.mismatch(1.0, 2.0) is None
        assert "companion.check.diagnose.mismatch" in guard.tampered()
        assert diagnose.mismatch(1.0, 2.0) is not None  # put back
        assert guard.tampered() is None
    finally:
        diagnose.mismatch.__code__ = original


def _logged(mode: str, comparisons: list[tuple]) -> list:
    """What a worker in ``mode`` records for ``comparisons`` (what, got, expected, atol)."""
    from companion.check import diagnose

    diagnose.set_mode(mode)
    try:
        with diagnose.Recorder() as log:
            for what, got, expected, atol in comparisons:
                diagnose.compare(what, got, lambda e=expected: e, rtol=0.0, atol=atol)
    finally:
        diagnose.set_mode(diagnose.PLAIN)
    return log


def test_the_judge_decides_a_claimed_pass_from_its_own_expected_values():
    """A worker that claims a pass is judged against the reference run's expected values (a
    blind worker sends none); anything that is not well-formed values is named as such."""
    from companion.check.diagnose import BLIND, REFERENCE
    from companion.check.judge import Malformed, judge
    from companion.check.runner import _result

    what = "multiply(a, b) (forward)"
    reference = _logged(REFERENCE, [(what, np.array([1.0, 3.0]), np.array([1.0, 3.0]), 1e-6)])
    claims = _logged(BLIND, [(what, np.array([1.0, 2.0]), None, 0.0)])
    assert set(claims[0]) == {"what", "got"}  # no expected value beside the student's code
    event = {"id": "hw1_multiply_forward", "status": "pass", "detail": "", "comparisons": claims}
    result = _result(BY_ID["hw1_multiply_forward"], event, "hw1", [], [])
    assert result.status == "pass" and result.claims == claims  # not decided by the worker
    problem, _ = judge(claims, reference)
    assert problem.startswith(f"{what} is wrong.\n  expected: shape (2,) float64 = [1., 3.]")
    assert "at (1,): expected 3, got 2" in problem
    right = _logged(BLIND, [(what, np.array([1.0, 3.0]), None, 0.0)])
    assert judge(right, reference) == (None, [])
    assert (
        "sent no value for 'other'"
        in judge(right, reference + [dict(reference[0], what="other")])[0]
    )
    assert "does not compare" in judge(right + [dict(right[0], what="other")], reference)[0]
    forged = [dict(right[0], expected=right[0]["got"])]
    assert "sent an expected value" in judge(forged, reference)[0]
    for bad in (
        {"shape": [2], "data": "not base64!"},
        {"shape": [3], "data": right[0]["got"]["data"]},
        {"shape": ["2"], "data": right[0]["got"]["data"]},
        {"shape": [2], "data": right[0]["got"]["data"], "pickle": "cos\nsystem"},
    ):
        with pytest.raises(Malformed):
            judge([dict(right[0], got=bad)], reference)
    with pytest.raises(Malformed):
        judge("pass", reference)


def test_the_judge_finds_the_first_wrong_value_of_a_question_that_stopped():
    """A blind worker goes on after a wrong value; when the question then fails, the values it
    sent so far are judged (``complete=False``): the first wrong one is the cause, and a
    missing value is not one."""
    from companion.check.diagnose import BLIND, REFERENCE
    from companion.check.judge import judge

    one, two = np.array([1.0]), np.array([2.0])
    reference = _logged(REFERENCE, [("first", one, one, 0.0), ("second", two, two, 0.0)])
    wrong_first = _logged(BLIND, [("first", two, None, 0.0)])
    assert judge(wrong_first, reference, complete=False)[0].startswith("first is wrong.")
    right_first = _logged(BLIND, [("first", one, None, 0.0)])
    assert judge(right_first, reference, complete=False) == (None, [])
    assert "sent no value for 'second'" in judge(right_first, reference)[0]


def test_the_judge_takes_each_device_the_student_has_against_the_same_expected_values():
    """Checks repeat on every device the student enabled ("on cpu(): ...", "on cuda(): ..."):
    each device's values are judged against the reference's, and each must be complete."""
    from companion.check.diagnose import BLIND, REFERENCE
    from companion.check.judge import judge

    a, b = np.array([1.0, 2.0]), np.array([3.0])
    reference = _logged(  # the reference run had one device
        REFERENCE, [("on cpu(): A.sum()", a, a, 0.0), ("on cpu(): A.max()", b, b, 0.0)]
    )
    two_devices = _logged(
        BLIND,
        [
            (f"on {dev}: {what}", value, None, 0.0)
            for dev in ("cpu_numpy()", "cuda()")
            for what, value in (("A.sum()", a), ("A.max()", b))
        ],
    )
    assert judge(two_devices, reference) == (None, [])
    assert judge(two_devices[:3], reference)[0] == (
        "your process sent no value for 'A.max()', which this question compares"
    )
    wrong = [dict(c) for c in two_devices]
    wrong[3] = _logged(BLIND, [("on cuda(): A.max()", np.array([4.0]), None, 0.0)])[0]
    assert judge(wrong, reference)[0].startswith("on cuda(): A.max() is wrong.\n")


# ---- never hang or mislead ---------------------------------------------------------------------
def test_an_import_that_never_returns_is_one_diagnosis(tmp_path):
    root = skeleton(tmp_path, "hw1")
    plant(root, "__init__.py", "while True:\n    pass\n")
    started = time.monotonic()
    report = check(root, only=["add", "negate", "exp"], timeout=3)
    assert time.monotonic() - started < 20
    assert set(statuses(report).values()) == {"timeout"}, report.format()
    text = report.format()
    assert text.count("importing your package did not finish within 3 s") == 1, text


def test_a_syntax_error_is_printed_once(tmp_path):
    root = skeleton(tmp_path, "hw2")
    plant(root, "nn/nn_basic.py", "def broken(:\n    pass\n")
    report = check(root, only=["linear", "relu", "flatten", "residual"])
    assert set(statuses(report).values()) == {"error"}, report.format()
    text = report.format()
    assert text.count("def broken(:") == 1, text  # the offending line, shown once
    assert "importing your needle raised SyntaxError" in text
    assert "at python/needle/nn/nn_basic.py:" in text
    assert text.count("the same problem as hw2_linear, above") == 3


EXITS = """
import os as _os
import sys as _sys


def _exit_3(self, x):
    _sys.exit(3)


def _os_exit_4(self, x):
    _os._exit(4)


def _interrupt(self, x):
    raise KeyboardInterrupt


Flatten.forward = _exit_3
ReLU.forward = _os_exit_4
Residual.forward = _interrupt
"""


def test_exits_and_interrupts_in_student_code_are_named(tmp_path):
    root = skeleton(tmp_path, "hw2")
    plant(root, "nn/nn_basic.py", EXITS)
    report = check(root, only=["relu", "flatten", "residual", "dropout"])
    assert statuses(report) == {
        "hw2_relu": "crashed",
        "hw2_flatten": "fail",
        "hw2_dropout": "pass",
        "hw2_residual": "fail",
    }, report.format()
    d = {r.question.id: r.detail for r in report.results}
    assert d["hw2_flatten"].startswith("your code called sys.exit(3) (SystemExit) at ")
    assert "nn_basic.py" in d["hw2_flatten"]
    assert d["hw2_relu"].startswith(
        "the process exited with status 4 during hw2_relu without raising an exception: os._exit()"
    )
    assert "compiled code: look for" not in d["hw2_relu"]
    assert d["hw2_residual"].startswith("KeyboardInterrupt raised at ")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def test_a_timed_out_worker_is_stopped_with_its_children(tmp_path):
    root = skeleton(tmp_path, "hw2")
    pid_file = root / "child.pid"  # inside the homework folder: the worker may write only there
    plant(
        root,
        "nn/nn_basic.py",
        f"""
import subprocess as _subprocess


def _spawn_and_hang(self, x):
    child = _subprocess.Popen(["sleep", "300"])
    open({str(pid_file)!r}, "w").write(str(child.pid))
    while True:
        pass


Flatten.forward = _spawn_and_hang
""",
    )
    report = check(root, only=["flatten"], timeout=3)
    assert statuses(report) == {"hw2_flatten": "timeout"}, report.format()
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = _alive(pid)
    if alive:
        os.kill(pid, 9)
    assert not alive, "the worker's child survived the timeout"


def test_the_build_has_a_time_limit(tmp_path):
    if (
        shutil.which("cmake", path=str(Path(sys.executable).parent)) is None
        and shutil.which("cmake") is None
    ):
        pytest.skip("no cmake")
    root = skeleton(tmp_path, "hw2")
    (root / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.5)\n"
        "project(slow NONE)\n"
        "execute_process(COMMAND sleep 120)\n"
    )
    started = time.monotonic()
    report = check(root, only=["flatten"], build_timeout=3)
    assert time.monotonic() - started < 30
    assert report.build[0].startswith("FAILED to build with CMake"), report.build
    assert "did not finish within 3 s" in report.build[0]


def test_a_file_named_build_is_reported_not_a_traceback(tmp_path):
    root = skeleton(tmp_path, "hw2")
    (root / "CMakeLists.txt").write_text("cmake_minimum_required(VERSION 3.5)\n")
    (root / "build").write_text("notes\n")
    report = check(root, only=["flatten"])
    assert report.build[0].startswith("FAILED: ") and "is a file" in report.build[0]
    assert statuses(report) == {"hw2_flatten": "pass"}


def test_time_limits_must_be_positive(tmp_path, capsys):
    root = skeleton(tmp_path, "hw2")
    for bad in ("-1", "0", "nan", "soon"):
        with pytest.raises(SystemExit) as info:
            main([str(root), "--timeout", bad])
        assert info.value.code == 2
        assert "positive number of seconds" in capsys.readouterr().err or bad == "soon"
    with pytest.raises(ValueError, match="positive"):
        check(root, timeout=-1)


def test_the_homework_hint_can_be_followed_through_make(tmp_path):
    (tmp_path / "mywork").mkdir()
    with pytest.raises(ValueError) as info:
        check(tmp_path / "mywork")
    hint = str(info.value)
    assert "make check HW=" in hint and "HWNUM=hw2" in hint
    make = shutil.which("make")
    if make is None:
        pytest.skip("no make")
    import subprocess

    done = subprocess.run(
        [make, "-s", "check", f"HW={tmp_path / 'mywork'}", "HWNUM=hw2", "ARGS=--list --timeout 5"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "hw2_linear" in done.stdout and "hw1_add_forward" not in done.stdout


NO_GRAD_SKIP = """
_sgd_step = SGD.step


def _sgd_without_skipping(self):
    for p in self.params:
        p.grad.numpy()  # AttributeError on a parameter without a gradient
    _sgd_step(self)


SGD.step = _sgd_without_skipping
"""


def test_an_optimizer_that_trips_on_a_missing_gradient_passes_with_a_warning(tmp_path):
    """The course's tests never leave a gradient None, so a step() that does not skip such a
    parameter passes (the course agrees), with a warning that says why it matters."""
    root = skeleton(tmp_path, "hw2")
    plant(root, "optim.py", NO_GRAD_SKIP)
    report = check(root, only=["sgd"])
    assert failures(report) == {}, report.format()
    (warning,) = report.results[0].warnings
    assert "when parameter 1 has grad None in step 2" in warning
    assert "step() raised AttributeError: " in warning
    text = report.format()
    assert "pass, WARNING" in text and "warning: SGD(lr=0.1, momentum=0.9" in text


LINGERING = """
import atexit as _atexit
import threading as _threading
import time as _time

_atexit.register(_time.sleep, 600)
_threading.Thread(target=_time.sleep, args=(600,)).start()
"""


def test_a_thread_or_exit_handler_left_running_does_not_hold_the_checker(tmp_path):
    root = skeleton(tmp_path, "hw2")
    plant(root, "__init__.py", LINGERING)
    started = time.monotonic()
    report = check(root, only=["flatten"], timeout=60)
    assert time.monotonic() - started < 30
    assert statuses(report) == {"hw2_flatten": "pass"}, report.format()


def test_an_answer_that_equals_everything_does_not_pass(tmp_path):
    """Verdicts compare numbers, never with the student's own ``==``."""
    root = skeleton(tmp_path, "hw0")
    simple_ml = root / "src" / "simple_ml.py"
    simple_ml.write_text(
        simple_ml.read_text()
        + (
            "\n\nclass _Anything:\n    def __eq__(self, other):\n        return True\n\n\n"
            "def add(x, y):\n    return _Anything()\n"
        )
    )
    report = check(root, only=["add"])
    assert statuses(report) == {"hw0_add": "fail"}, report.format()
