"""Blank skeletons: every question of a homework whose student parts are not written yet is
"not implemented" -- never FAIL, never a traceback of the checker's own.

hw0 is the course's layout written out here (``course_layout/hw0``: ``pass`` bodies, an empty
C++ body); hw1 on are copies of this project's needle in the course's layout with every function
the homework asks for blanked as the course leaves it (``blank.py``), apps included. The same
questions with this project's needle are test_checker.py's ``test_finished_package_passes_every_
question``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from blank import PASS, RAISE, blank_all
from test_checker import skeleton

from companion.check import check, questions_for

HERE = Path(__file__).resolve().parent
COURSE = HERE / "course_layout"

HW1_OP_CLASSES = {
    "add": "EWiseAdd", "add_scalar": "AddScalar", "multiply": "EWiseMul",
    "mul_scalar": "MulScalar", "power": "EWisePow", "power_scalar": "PowerScalar",
    "divide": "EWiseDiv", "divide_scalar": "DivScalar", "matmul": "MatMul",
    "summation": "Summation", "broadcast_to": "BroadcastTo", "reshape": "Reshape",
    "negate": "Negate", "transpose": "Transpose", "log": "Log", "exp": "Exp", "relu": "ReLU",
}  # fmt: skip

BLANKS: dict[str, dict[str, list[str]]] = {
    "hw1": {
        "python/needle/ops/ops_mathematic.py": [
            f"{c}.{m}" for c in HW1_OP_CLASSES.values() for m in ("compute", "gradient")
        ],
        "python/needle/autograd.py": [
            "find_topo_sort", "topo_sort_dfs", "compute_gradient_of_variables",
        ],
    },
    "hw2": {
        "python/needle/init/init_initializers.py": [
            "xavier_uniform", "xavier_normal", "kaiming_uniform", "kaiming_normal",
        ],
        "python/needle/nn/nn_basic.py": [
            "Linear.__init__", "Linear.forward", "Flatten.forward", "ReLU.forward",
            "Sequential.forward", "SoftmaxLoss.forward", "BatchNorm1d.__init__",
            "BatchNorm1d.forward", "LayerNorm1d.__init__", "LayerNorm1d.forward",
            "Dropout.forward", "Residual.forward",
        ],
        "python/needle/ops/ops_logarithmic.py": ["LogSumExp.compute", "LogSumExp.gradient"],
        "python/needle/optim.py": ["SGD.step", "Adam.step"],
        "python/needle/data/data_transforms.py": [
            "RandomFlipHorizontal.__call__", "RandomCrop.__call__",
        ],
        "python/needle/data/datasets/mnist_dataset.py": [
            "MNISTDataset.__init__", "MNISTDataset.__getitem__",
        ],
        "python/needle/data/data_basic.py": ["DataLoader.__iter__", "DataLoader.__next__"],
    },
}  # fmt: skip


def blank_skeleton(tmp_path: Path, hw: str, style: str = RAISE) -> Path:
    """A course-layout folder for ``hw`` with every student part blank."""
    if hw == "hw0":
        root = tmp_path / "hw0"
        shutil.copytree(COURSE / "hw0", root)
        return root
    root = skeleton(tmp_path, hw)
    blank_all(root, BLANKS[hw], style)
    if (COURSE / hw / "apps").is_dir():
        for app in (COURSE / hw / "apps").iterdir():
            shutil.copy(app, root / "apps" / app.name)
    return root


def assert_all_not_implemented(report, hw: str) -> None:
    text = report.format()
    assert [r.question.id for r in report.results] == [q.id for q in questions_for(hw)]
    wrong = {r.question.id: r.status for r in report.results if r.status != "not implemented"}
    assert wrong == {}, text
    assert "Traceback" not in text and "companion/check/" not in text, text
    for r in report.results:
        assert r.detail, r.question.id  # says what is missing


def test_the_blank_hw0_skeleton_is_not_implemented_everywhere(tmp_path):
    root = blank_skeleton(tmp_path, "hw0")
    report = check(root)
    if report.build != ["built src/simple_ml_ext.so"]:
        pytest.skip(f"the C++ extension did not build here: {report.build}")
    assert_all_not_implemented(report, "hw0")
    details = {r.question.id: r.detail for r in report.results}
    assert details["hw0_add"].startswith("add (src/simple_ml.py:15): its body is still empty")
    assert details["hw0_parse_mnist"].startswith("parse_mnist (src/simple_ml.py:22)")
    assert "left its arrays unchanged" in details["hw0_softmax_regression_epoch_cpp"]


@pytest.mark.parametrize("hw", ["hw1", "hw2"])
@pytest.mark.parametrize("style", [RAISE, PASS], ids=["raise", "pass"])
def test_a_blank_skeleton_is_not_implemented_everywhere(tmp_path, hw, style):
    root = blank_skeleton(tmp_path, hw, style)
    assert_all_not_implemented(check(root), hw)
