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
    "hw3": {
        "python/needle/backend_ndarray/ndarray.py": [
            "NDArray.reshape", "NDArray.permute", "NDArray.broadcast_to", "NDArray.__getitem__",
        ],
    },
    "hw4": {
        "python/needle/backend_ndarray/ndarray.py": ["NDArray.flip", "NDArray.pad"],
        "python/needle/ops/ops_mathematic.py": ["Tanh.compute", "Tanh.gradient"],
        "python/needle/ops/ops_tuple.py": [
            "Stack.compute", "Stack.gradient", "Split.compute", "Split.gradient",
        ],
        "python/needle/ops/ops_conv.py": [
            f"{c}.{m}" for c in ("Flip", "Dilate", "UnDilate", "Conv")
            for m in ("compute", "gradient")
        ],
        "python/needle/nn/nn_conv.py": ["Conv.__init__", "Conv.forward"],
        "python/needle/nn/nn_sequence.py": [
            f"{c}.{m}" for c in ("RNNCell", "RNN", "LSTMCell", "LSTM", "Embedding")
            for m in ("__init__", "forward")
        ],
        "python/needle/data/datasets/cifar10_dataset.py": [
            "CIFAR10Dataset.__init__", "CIFAR10Dataset.__getitem__",
        ],
        "python/needle/data/datasets/ptb_dataset.py": [
            "Dictionary.add_word", "Corpus.__init__", "Corpus.tokenize", "batchify", "get_batch",
        ],
    },
    "hw4_extra": {
        "python/needle/nn/nn_transformer.py": [
            f"{c}.{m}" for c in ("MultiHeadAttention", "AttentionLayer", "TransformerLayer",
                                 "Transformer")
            for m in ("__init__", "forward")
        ],
    },
}  # fmt: skip

# The course's hw3 kernels (and the names this project's ndarray.py calls them by), each left as
# the course's C++ stub: `assert(false && "Not Implemented")`. Compiled with NDEBUG the stub
# returns leaving its output as it was; without, it prints the assertion and aborts. Planted
# over the copy's compiled module so the test needs no C++ build (test_checker_build.py builds).
KERNELS = (
    "compact", "ewise_setitem", "scalar_setitem", "ewise_binary", "ewise_scalar", "ewise_unary",
    "reduce", "matmul", "matmul_strided", "matmul_naive", "matmul_tiled", "reduce_sum",
    "reduce_max", "ewise_mul", "ewise_div", "ewise_maximum", "ewise_eq", "ewise_ge", "ewise_log",
    "ewise_exp", "ewise_tanh", "scalar_mul", "scalar_div", "scalar_power", "scalar_maximum",
    "scalar_eq", "scalar_ge",
)  # fmt: skip

CPP_STUBS = """
import os as _os
import sys as _sys


class _CourseStubs:
    def __init__(self, mod, abort):
        self._mod, self._abort = mod, abort

    def __getattr__(self, name):
        value = getattr(self._mod, name)
        if name not in {kernels!r}:
            return value
        if self._abort:
            def stub(*args, **kwargs):
                print('ndarray_backend_cpu.cc:97: void needle::cpu::' + name + '(...): '
                      'Assertion `false && "Not Implemented"\\' failed.', file=_sys.stderr,
                      flush=True)
                _os.abort()
            return stub
        return lambda *args, **kwargs: None


_CPU.mod = _CourseStubs(_CPU.mod, abort={abort})
"""


def plant_cpp_stubs(root: Path, abort: bool) -> None:
    device = root / "python" / "needle" / "backend_ndarray" / "device.py"
    device.write_text(device.read_text() + CPP_STUBS.format(kernels=KERNELS, abort=abort))


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
    source = (root / "src" / "simple_ml.py").read_text().splitlines()
    line = {
        name: source.index(f"def {name}(" + rest) + 1
        for name, rest in [("add", "x, y):"), ("parse_mnist", "image_filename, label_filename):")]
    }
    assert details["hw0_add"].startswith(
        f"add (src/simple_ml.py:{line['add']}): its body is still empty (`pass`)"
    )
    assert details["hw0_parse_mnist"].startswith(
        f"parse_mnist (src/simple_ml.py:{line['parse_mnist']})"
    )
    assert "left its arrays unchanged" in details["hw0_softmax_regression_epoch_cpp"]


@pytest.mark.parametrize("hw", ["hw1", "hw2", "hw4", "hw4_extra"])
@pytest.mark.parametrize("style", [RAISE, PASS], ids=["raise", "pass"])
def test_a_blank_skeleton_is_not_implemented_everywhere(tmp_path, hw, style):
    root = blank_skeleton(tmp_path, hw, style)
    assert_all_not_implemented(check(root), hw)


@pytest.mark.parametrize("abort", [False, True], ids=["NDEBUG", "assert"])
def test_the_blank_hw3_skeleton_with_cpp_stubs_is_not_implemented_everywhere(tmp_path, abort):
    root = blank_skeleton(tmp_path, "hw3")
    plant_cpp_stubs(root, abort)
    report = check(root)
    assert_all_not_implemented(report, "hw3")
    matmul = next(r.detail for r in report.results if r.question.id == "hw3_matmul")
    if abort:
        assert 'assert(false && "Not Implemented")` failed' in matmul
    else:
        assert "matmul returned without writing its output" in matmul
