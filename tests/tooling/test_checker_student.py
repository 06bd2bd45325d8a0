"""Student code written the course's way gets the verdict the course's own tests would give.

Fixtures (a copy of this project's needle in the course's layout, with a change planted): an
app that imports the course's test file (which imports ``mugrade``, the course's grader client);
a module whose parameters default to another device than Tensor does (the course's tests always
pass ``device=`` to both); a package imported as ``python.needle`` from the homework folder.
"""

from __future__ import annotations

from test_checker import failures, plant, skeleton

from companion.check import check

COURSE_TEST_FILE = """
import sys
sys.path.append("./python")
sys.path.append("./apps")
import numpy as np
import needle as ndl
import mugrade


def num_params(model):
    return int(np.sum([np.prod(x.shape) for x in model.parameters()]))


def submit_mlp_resnet():
    mugrade.submit(0)
"""

APP_IMPORTING_THE_COURSE_TESTS = """
import sys
sys.path.append("../python")
from tests.hw2.test_nn_and_optim import num_params  # the course's test file, as some students do
from companion.apps.mlp_resnet import *
"""


def test_an_app_that_imports_the_course_tests_and_mugrade_runs(tmp_path):
    root = skeleton(tmp_path, "hw2")
    (root / "tests" / "hw2").mkdir(parents=True)
    (root / "tests" / "hw2" / "test_nn_and_optim.py").write_text(COURSE_TEST_FILE)
    (root / "apps" / "mlp_resnet.py").write_text(APP_IMPORTING_THE_COURSE_TESTS)
    report = check(root, only=["mlp_resnet"])
    assert failures(report) == {}, report.format()
    assert "Traceback" not in report.format()


PARAMETERS_ON_THE_NUMPY_DEVICE = """
_conv_init = Conv.__init__


def _numpy_by_default(self, *args, device=None, **kwargs):
    # a student's Conv whose parameters default to the numpy device, while Tensor defaults to
    # cpu(): the course's tests never see it, since they pass device= to module and input
    from needle.backend_ndarray import cpu_numpy
    _conv_init(self, *args, device=device if device is not None else cpu_numpy(), **kwargs)


Conv.__init__ = _numpy_by_default
"""


def test_modules_and_inputs_are_built_on_one_device_as_the_course_does(tmp_path):
    root = skeleton(tmp_path, "hw4")
    plant(root, "nn/nn_conv.py", PARAMETERS_ON_THE_NUMPY_DEVICE)
    report = check(root, only=["nn_conv"])
    assert failures(report) == {}, report.format()


def test_a_package_imported_as_python_needle_is_found(tmp_path):
    root = skeleton(tmp_path, "hw2")
    (root / "apps" / "mlp_resnet.py").write_text(
        "from python.needle import nn as _nn  # the folder layout, imported from the root\n"
        "assert _nn.Linear is not None\n"
        "from companion.apps.mlp_resnet import *\n"
    )
    report = check(root, only=["mlp_resnet"])
    assert failures(report) == {}, report.format()
