"""Shared fixtures: the devices every suite is parametrised over, and the data folder."""

import os
import tempfile
from pathlib import Path

# Tests never write into the tree: hypothesis keeps its caches in the temp directory.
os.environ.setdefault(
    "HYPOTHESIS_STORAGE_DIRECTORY", str(Path(tempfile.gettempdir()) / "needle-hypothesis")
)

import numpy as np
import pytest
from hypothesis import settings

import needle as ndl

# The tests that run make (the Makefile's recipes, its set-up lock) drive their own make: what
# the make running this suite was told (`make VENV=.venv-3.10 PYTHON=... test` in .ci/run: make
# puts command-line variables in its recipes' environment, and MAKEFLAGS passes them on) must not
# choose their venv or interpreter.
for _name in ("VENV", "PYTHON", "UNLOCKED", "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES"):
    os.environ.pop(_name, None)

# Tests never write into the tree: no hypothesis example database.
settings.register_profile("needle", database=None, deadline=None)
settings.load_profile("needle")

_ALL = {"cpu": ndl.cpu(), "cuda": ndl.cuda(), "cpu_numpy": ndl.cpu_numpy()}


def device_params(names=("cpu", "cuda", "cpu_numpy")):
    """pytest params for each named device, skipped (with the reason) when it is not enabled.

    Under NEEDLE_BACKEND=np only cpu() exists: the others are dropped, not skipped.
    """
    params = []
    for name in names:
        if ndl.BACKEND == "np" and name != "cpu":
            continue
        dev = _ALL[name] if ndl.BACKEND == "nd" else ndl.cpu()
        marks = [] if dev.enabled() else [pytest.mark.skip(reason=f"{name}() is not enabled here")]
        params.append(pytest.param(dev, id=name, marks=marks))
    return params


DEVICES = device_params()

# Real data beside the checkout (../shared/data): used where present, skipped where absent.
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(autouse=True)
def _seed():
    np.random.seed(0)


def pytest_collection_modifyitems(config, items):
    """Tests marked ``slow`` run only with NEEDLE_SLOW=1 (they stay out of `make test`'s budget)."""
    if os.environ.get("NEEDLE_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow: set NEEDLE_SLOW=1 to run")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def pytest_configure(config):
    """One marker per homework question (companion/check/questions.py): `pytest -m hw2_linear`."""
    from companion.check.questions import QUESTIONS

    for q in QUESTIONS:
        config.addinivalue_line("markers", f"{q.marker}: {q.hw} question: {q.title}")
