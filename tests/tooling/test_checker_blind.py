"""The worker beside the student's code is blind: it never computes an expected value.

So student code that looks for one -- in every frame on the stack while the checker calls it,
in the checker's record of comparisons, by patching the functions that record (and putting
them back), or by switching the worker into the reference run's mode -- finds nothing, and an
honest FAIL follows. And since a blind worker cannot notice a wrong value, it goes on after
one: when the question then fails for another reason, the judge still names the wrong value
as the cause. Each attack plants code in a copy of this project's needle (test_checker.py).
"""

from __future__ import annotations

import pytest
from test_checker import plant, skeleton, statuses

from companion.check import check, diagnose


def _wrong_multiply(attack: str) -> str:
    """``attack`` (code defining ``_steal(a, b)``: the stolen answer or None), then a
    multiply whose compute returns what ``_steal`` found, else the wrong a + b."""
    return attack + (
        "\n\ndef _wrong_multiply(self, a, b):\n"
        "    stolen = _steal(a, b)\n"
        "    return a + b if stolen is None else stolen\n\n\n"
        "EWiseMul.compute = _wrong_multiply\n"
    )


# Planted code's search of every frame on the stack, shared by the two thefts below.
FRAME_SEARCH = """
import inspect as _inspect

import numpy as _np


def _arrays_named(names):
    # the value of the first local with one of these names in any frame on the stack
    for info in _inspect.stack():
        for name in names:
            value = info.frame.f_locals.get(name)
            if value is not None and not callable(value):
                return value
    return None
"""

STEAL_FROM_EVERY_FRAME = (
    FRAME_SEARCH
    + """

def _steal(a, b):
    found = _arrays_named(("expected", "exp", "e", "expected_out"))
    return None if found is None else type(a)(_np.asarray(found, dtype=_np.float32))
"""
)

STEAL_THE_FINITE_DIFFERENCES = (
    FRAME_SEARCH
    + """

def _stolen_gradient(self, out_grad, node):
    # the gradient runs after the checker set up the comparison: take its finite differences
    found = _arrays_named(("numeric", "fds"))
    if not isinstance(found, list):
        return out_grad, out_grad  # wrong
    return tuple(Tensor(_np.asarray(v, dtype=_np.float32)) for v in found)


EWiseMul.gradient = _stolen_gradient
"""
)


def test_reading_every_frame_while_the_checker_calls_does_not_pass(tmp_path):
    """The forward's compute and (later in the question, after the forward) the gradient look
    through every frame on the stack for the expected value and the finite differences."""
    root = skeleton(tmp_path, "hw1")
    plant(root, "ops/ops_mathematic.py", _wrong_multiply(STEAL_FROM_EVERY_FRAME))
    report = check(root, only=["multiply_forward"])
    assert statuses(report) == {"hw1_multiply_forward": "fail"}, report.format()
    assert report.results[0].detail.startswith("multiply(a, b) (forward) is wrong.\n")
    # a right forward, and a gradient that hands back the finite differences it finds (a
    # worker that computed them before calling the gradient held them in a frame)
    root = skeleton(tmp_path / "backward", "hw1")
    plant(root, "ops/ops_mathematic.py", STEAL_THE_FINITE_DIFFERENCES)
    report = check(root, only=["multiply_backward"])
    assert statuses(report) == {"hw1_multiply_backward": "fail"}, report.format()
    assert report.results[0].detail.startswith(
        "multiply(a, b) backward is wrong: the adjoint of 'a', 'b' does not match"
    ), report.results[0].detail


PATCHED_ENCODE = """
import sys as _sys

import numpy as _np

import companion.check.diagnose as _diagnose

_original_encode = _diagnose._encode


def _encode_the_expected(x):
    # put itself back first (the worker's guard then sees nothing), then encode, instead of
    # the student's value, an expected value found in a frame or in the checker's record
    _diagnose._encode = _original_encode
    frame = _sys._getframe(1)
    while frame is not None:
        for name in ("expected", "exp"):
            value = frame.f_locals.get(name)
            if isinstance(value, _np.ndarray):
                return _original_encode(value)
        frame = frame.f_back
    for entry in _diagnose._RECORD or []:
        if "expected" in entry:
            return entry["expected"]
    return _original_encode(x)


def _steal(a, b):
    _diagnose._encode = _encode_the_expected
    return None
"""

DROPPED_RECORD = """
import companion.check.diagnose as _diagnose

_original_record = _diagnose._record_got


def _record_nothing(what, got):
    # record everything but the forward's value, then put the checker's function back
    if what.endswith("(forward)"):
        _diagnose._record_got = _original_record
        return
    _original_record(what, got)


def _steal(a, b):
    _diagnose._record_got = _record_nothing
    return None
"""

EDITED_RECORD = """
import companion.check.diagnose as _diagnose


def _steal(a, b):
    # the Recorder's list itself: copy any expected value over the student's, then drop every
    # comparison recorded so far in this question
    log = _diagnose._RECORD if _diagnose._RECORD is not None else []
    for entry in log:
        if "expected" in entry:
            entry["got"] = entry["expected"]
    del log[:]
    return None
"""

SWITCHED_MODE = """
import companion.check.diagnose as _diagnose


def _steal(a, b):
    # the reference run's mode: the checks would compute their expected values here
    _diagnose._MODE = _diagnose.REFERENCE
    return None
"""


@pytest.mark.parametrize(
    "attack, says",
    [
        (PATCHED_ENCODE, "multiply(a, b) (forward) is wrong.\n"),
        (DROPPED_RECORD, "your process sent no value for 'multiply(a, b) (forward)'"),
        (EDITED_RECORD, "multiply(a, b) (forward) is wrong.\n"),
        (SWITCHED_MODE, "your code switched the checker's mode"),
    ],
    ids=["patched-encode", "dropped-record", "edited-record-list", "switched-mode"],
)
def test_tampering_with_the_checkers_record_does_not_pass(tmp_path, attack, says):
    root = skeleton(tmp_path, "hw1")
    plant(root, "ops/ops_mathematic.py", _wrong_multiply(attack))
    report = check(root, only=["multiply_forward", "add_forward"])
    assert statuses(report) == {
        "hw1_add_forward": "pass",
        "hw1_multiply_forward": "fail",
    }, report.format()
    detail = next(r.detail for r in report.results if r.question.id == "hw1_multiply_forward")
    assert detail.startswith(says), detail


WRONG_THEN_RAISES = """
def _wrong_then_raises(self, a):
    # broadcast_to's first case gets a wrong value (every element + 1); the second raises
    if a.shape == (4,):
        raise RuntimeError("a crash after a wrong value")
    return _course_broadcast(self, a) + 1


_course_broadcast = BroadcastTo.compute
BroadcastTo.compute = _wrong_then_raises
"""


def test_a_failure_after_a_wrong_value_is_reported_as_the_wrong_value(tmp_path):
    """A blind worker cannot notice the first case's wrong value and goes on; the second case
    raises. The judge names the wrong value (the cause), not the later traceback."""
    root = skeleton(tmp_path, "hw1")
    plant(root, "ops/ops_mathematic.py", WRONG_THEN_RAISES)
    report = check(root, only=["broadcast_to_forward"])
    (result,) = report.results
    assert result.status == "fail", report.format()
    assert result.detail.startswith("broadcast_to(a, (3, 4)) (forward) is wrong.\n"), result.detail
    assert "RuntimeError" not in result.detail


def test_a_failure_without_a_wrong_value_before_it_keeps_its_own_diagnosis(tmp_path):
    root = skeleton(tmp_path, "hw1")
    plant(
        root,
        "ops/ops_mathematic.py",
        "def _raises(self, a):\n    raise RuntimeError('no broadcasting today')\n\n\n"
        "BroadcastTo.compute = _raises\n",
    )
    report = check(root, only=["broadcast_to_forward"])
    (result,) = report.results
    assert result.status == "fail", report.format()
    assert "RuntimeError: no broadcasting today" in result.detail


def test_in_blind_mode_no_expected_value_is_computed(monkeypatch):
    """The comparisons in blind mode record the student's value and call nothing else."""
    called = []

    def expected():
        called.append("expected")
        return 1.0

    monkeypatch.setattr(diagnose, "_MODE", diagnose.BLIND)
    with diagnose.Recorder() as log:
        diagnose.check_close("x", 2.0, expected, variants=lambda: called.append("variants"))
        diagnose.check_adjoints(
            "op backward",
            [3.0],
            lambda: called.append("numeric"),
            ["a"],
            inputs={"a": 1.0},
            out_grad=1.0,
        )
    assert called == []
    assert [set(entry) for entry in log] == [{"what", "got"}, {"what", "got"}]
    assert log[1]["what"] == "op backward: the adjoint of 'a'"
