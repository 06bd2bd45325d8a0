"""Student mode (``python -m companion.check``) on the course's skeleton layout.

Each test builds a homework folder in tmp_path with this project's needle copied, as it is, into
``hwN/python/needle`` and thin ``apps/`` modules (for hw0 a thin ``src/simple_ml.py``), then
checks it: the
finished package passes every question; a wrong adjoint, a ``NotImplementedError`` and a
segfaulting C++ function each cost exactly their own question.
"""
from __future__ import annotations

import ast
import os
import shutil
import sys
from pathlib import Path

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
            "                                   softmax_regression_epoch, nn_epoch)\n")
        return root
    shutil.copytree(PACKAGE, root / "python" / "needle",
                    ignore=shutil.ignore_patterns("__pycache__"))
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
    built = sorted((ROOT / "companion" / "apps").glob("simple_ml_ext*.so"))
    if not built:
        pytest.skip("companion/apps/simple_ml_ext is not compiled here")
    root = skeleton(tmp_path, "hw0")
    shutil.copy(ROOT / "src" / "simple_ml_ext.cc", root / "src" / "simple_ml_ext.cpp")
    shutil.copy(built[0], root / "src" / "simple_ml_ext.so")
    os.utime(root / "src" / "simple_ml_ext.so")  # newer than the source: no rebuild
    report = check(root)
    assert report.build == ["src/simple_ml_ext.so is up to date"]
    assert failures(report) == {}, report.format()


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
    nn_basic.write_text(nn_basic.read_text() + NOT_IMPLEMENTED.replace(
        "raise NotImplementedError()", "while True:\n        pass"))
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
        checks = {name for name in dir(module) if name.startswith(f"{hw}_")
                  and callable(getattr(module, name))}
        if hw == "hw4":  # hw4_extra's ids also start with "hw4_"
            checks = {c for c in checks if not c.startswith("hw4_extra")}
        assert checks == {q.id for q in questions_for(hw)}, hw


def _markers_in(path: Path) -> set[str]:
    """Names X of every ``pytest.mark.X`` written in a test file."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
                and node.value.attr == "mark"):
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
