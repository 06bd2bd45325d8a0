"""Student code that attacks the checker gets an honest verdict, within the worker's limits.

Each test plants hostile code in a copy of this project's needle (the course's layout, as in
test_checker.py): forged results (also ones carrying self-consistent values), numpy's internals
and the checker's functions patched (also by patches that undo themselves before the worker's
guard looks: only the judge, outside the worker, catches those), files written outside the
homework folder, a fork bomb, a memory hog, a CPU burner, a process that escapes with setsid,
and a signal to the process that watches the worker. None of them earns a pass it did not
compute, none leaves a process or a file behind, and each report names the limit it hit.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from test_checker import plant, skeleton, statuses

from companion.check import check
from companion.check.boxed import GIB, Limits
from companion.check.sandbox import landlock_abi

needs_landlock = pytest.mark.skipif(landlock_abi() == 0, reason="this kernel has no Landlock")


def _workers_of(root: Path) -> list[int]:
    """Processes still alive whose environment names this homework (the worker and anything
    it started carry NEEDLE_IMPL=<root>/python)."""
    marker = f"NEEDLE_IMPL={root / 'python'}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            env = Path(f"/proc/{name}/environ").read_bytes()
            state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in env.split(b"\0") and state != "Z":
            found.append(int(name))
    return found


# A forger's last step: its lines into every descriptor the worker may hold, then leave.
WRITE_TO_EVERY_DESCRIPTOR = """
for _fd in range(3, 64):
    try:
        _os.write(_fd, _lines.encode())
    except OSError:
        pass
_os._exit(0)
"""

FORGED_RESULTS = (
    """
import json as _json, os as _os, sys as _sys

# G13's reproducer: append a pass for every question to the results file named in the config,
# then leave; and, since there is no such file now, the same lines to every open descriptor.
_cfg = _json.load(open(_sys.argv[1]))
_lines = _json.dumps({"imported": __file__}) + "\\n"
for _q in _cfg["questions"]:
    _lines += _json.dumps({"start": _q}) + "\\n" + _json.dumps(
        {"id": _q, "status": "pass", "detail": "", "needle": __file__, "comparisons": []}) + "\\n"
if "results" in _cfg:
    open(_cfg["results"], "a").write(_lines)
"""
    + WRITE_TO_EVERY_DESCRIPTOR
)


def test_forged_result_lines_do_not_pass(tmp_path):
    root = skeleton(tmp_path, "hw1")
    plant(root, "__init__.py", FORGED_RESULTS)
    report = check(root, only=["add_forward", "multiply_forward", "exp_backward"])
    assert "pass" not in statuses(report).values(), report.format()
    assert "without a single comparison" in report.results[0].detail, report.format()


FORGED_VALUES = (
    """
import base64 as _b64, json as _json, os as _os, sys as _sys

# A forger that knows the protocol: for every question a pass carrying a comparison whose
# value and expected value agree (zeros), written into every open descriptor, then leave.
_zero = {"shape": [1], "data": _b64.b64encode(bytes(8)).decode()}
_cfg = _json.load(open(_sys.argv[1]))
_lines = ""
for _q in _cfg["questions"]:
    _claim = {"what": "add(a, b) (forward)", "got": _zero, "expected": _zero, "rtol": 0.0,
              "atol": 0.0}
    _lines += _json.dumps({"start": _q}) + "\\n" + _json.dumps(
        {"id": _q, "status": "pass", "detail": "", "needle": __file__,
         "comparisons": [_claim]}) + "\\n"
"""
    + WRITE_TO_EVERY_DESCRIPTOR
)


def test_forged_records_that_carry_values_do_not_pass(tmp_path):
    """Forged passes with self-consistent values: the judge has its own expected values."""
    root = skeleton(tmp_path, "hw1")
    plant(root, "__init__.py", FORGED_VALUES)
    report = check(root, only=["add_forward", "multiply_forward", "exp_backward"])
    assert set(statuses(report).values()) == {"fail"}, report.format()
    by_id = {r.question.id: r.detail for r in report.results}
    assert by_id["hw1_add_forward"].startswith(
        "your process sent an expected value for 'add(a, b) (forward)'"
    )
    assert "which this question does not compare" in by_id["hw1_multiply_forward"]


SELF_RESTORING_PATCH = """
def _wrong_multiply(self, a, b):
    # A wrong product, and the checker's comparison and numpy's allclose/isclose and
    # numpy.testing made to agree with it: check_close is told the expected value is the
    # answer itself; every patch puts itself back before the checker's guard looks.
    import numpy as _np
    import numpy.testing as _npt
    import companion.check.common as _common

    saved = (_common.check_close, _np.allclose, _np.isclose, _npt.assert_allclose)

    def _agree(what, got, expected, *args, **kwargs):
        _common.check_close, _np.allclose, _np.isclose, _npt.assert_allclose = saved
        return saved[0](what, got, got.numpy(), *args, **kwargs)

    _common.check_close = _agree
    _np.allclose = lambda *args, **kwargs: True
    _np.isclose = lambda a, b, **kwargs: _np.ones(_np.broadcast(a, b).shape, bool)
    _npt.assert_allclose = lambda *args, **kwargs: None
    return a + b


EWiseMul.compute = _wrong_multiply
"""


def _wrong_multiply_judged(tmp_path, attack: str) -> str:
    """The multiply failure's detail after planting ``attack`` (a wrong multiply that also
    attacks the checker), with add checked beside it to show an honest answer still passes."""
    root = skeleton(tmp_path, "hw1")
    plant(root, "ops/ops_mathematic.py", attack)
    report = check(root, only=["multiply_forward", "add_forward"])
    assert statuses(report) == {
        "hw1_add_forward": "pass",
        "hw1_multiply_forward": "fail",
    }, report.format()
    return next(r.detail for r in report.results if r.question.id == "hw1_multiply_forward")


def test_patches_of_numpy_and_the_checker_that_undo_themselves_do_not_pass(tmp_path):
    """The worker's own comparison says pass and its guard sees nothing; the judge's does not."""
    detail = _wrong_multiply_judged(tmp_path, SELF_RESTORING_PATCH)
    assert detail.startswith("multiply(a, b) (forward) is wrong.\n  input:"), detail
    assert "12 of 12 elements differ" in detail


PATCHED_INTERNALS = """
_course_multiply = EWiseMul.compute


def _wrong_multiply(self, a, b):
    # G13: a wrong product, numpy's comparison rewritten below numpy's namespace, and the
    # checker's record of comparisons switched off
    import numpy._core.numeric as _numeric
    import companion.check.diagnose as _diagnose
    _numeric.less_equal = lambda *args, **kwargs: True
    _diagnose._RECORD = None
    return a + b


EWiseMul.compute = _wrong_multiply
"""


def test_patching_numpy_internals_and_the_record_does_not_pass(tmp_path):
    detail = _wrong_multiply_judged(tmp_path, PATCHED_INTERNALS)
    assert "numpy._core.numeric.less_equal" in detail or "record of comparisons" in detail


@needs_landlock
def test_writes_outside_the_homework_folder_are_refused(tmp_path):
    root = skeleton(tmp_path, "hw2")
    checker = Path(__file__).resolve().parents[2] / "companion" / "check"
    targets = [tmp_path / "outside.txt", checker / "_student_was_here.txt"]
    plant(
        root,
        "__init__.py",
        f"""
import os as _os
_refused = []
for _path in {[str(t) for t in targets]!r}:
    try:
        open(_path, "w").write("x")
    except PermissionError:
        _refused.append(_path)
open(_os.path.join(_os.environ["TMPDIR"], "scratch.txt"), "w").write("fine")
open({str(root / "refused.txt")!r}, "w").write("\\n".join(_refused))
""",
    )
    report = check(root, only=["flatten"])
    assert statuses(report) == {"hw2_flatten": "pass"}, report.format()
    assert not any(t.exists() for t in targets)
    assert (root / "refused.txt").read_text().splitlines() == [str(t) for t in targets]
    assert "files may be changed only under the homework and scratch folders" in report.format()


FORK_BOMB = """
import os as _os


def _bomb(self, x):
    while True:
        try:
            _os.fork()
        except OSError:
            pass


Flatten.forward = _bomb
"""


def test_a_fork_bomb_is_stopped_and_named(tmp_path):
    root = skeleton(tmp_path, "hw2")
    plant(root, "nn/nn_basic.py", FORK_BOMB)
    started = time.monotonic()
    report = check(root, only=["flatten", "relu"], timeout=30, limits=Limits(processes=32))
    assert time.monotonic() - started < 60
    result = {r.question.id: r for r in report.results}
    assert result["hw2_flatten"].status in ("crashed", "fail"), report.format()
    assert "more than 32 processes" in result["hw2_flatten"].detail or (
        "RLIMIT_NPROC" in result["hw2_flatten"].detail
    ), report.format()
    assert result["hw2_relu"].status == "pass", report.format()
    assert _workers_of(root) == []


MEMORY_HOG = """
def _hog(self, x):
    kept = []
    while True:
        kept.append(bytearray(64 << 20))  # zero-filled: really used, not just reserved


Flatten.forward = _hog
"""


def test_a_memory_hog_meets_the_memory_limit(tmp_path):
    root = skeleton(tmp_path, "hw2")
    plant(root, "nn/nn_basic.py", MEMORY_HOG)
    report = check(root, only=["flatten", "relu"], timeout=60, limits=Limits(memory=GIB))
    result = {r.question.id: r for r in report.results}
    assert result["hw2_flatten"].status == "fail", report.format()
    assert "reached the checker's memory limit of 1 GiB (RLIMIT_DATA)" in (
        result["hw2_flatten"].detail
    ), report.format()
    assert result["hw2_relu"].status == "pass", report.format()


CPU_BURNER = """
import threading as _threading


def _spin():
    while True:
        pass


def _burn(self, x):
    for _ in range(2):
        _threading.Thread(target=_spin, daemon=True).start()
    _spin()


Flatten.forward = _burn
"""


def test_a_cpu_burner_meets_the_cpu_limit(tmp_path):
    root = skeleton(tmp_path, "hw2")
    plant(root, "nn/nn_basic.py", CPU_BURNER)
    started = time.monotonic()
    report = check(root, only=["flatten"], timeout=120, limits=Limits(cpu=4))
    assert time.monotonic() - started < 100
    (result,) = report.results
    assert result.status == "crashed", report.format()
    assert "CPU-time limit of 4 s (RLIMIT_CPU)" in result.detail, report.format()


ESCAPE = """
import os as _os


def _escape(self, x):
    # G13: a double fork with setsid leaves the worker's process group and session
    if _os.fork() == 0:
        _os.setsid()
        if _os.fork() == 0:
            open(PID_FILE, "w").write(str(_os.getpid()))
            _os.execvp("sleep", ["sleep", "300"])
        _os._exit(0)
    _os.wait()
    return _course_flatten(self, x)


_course_flatten = Flatten.forward
Flatten.forward = _escape
"""


def test_a_process_that_escapes_with_setsid_is_ended(tmp_path):
    root = skeleton(tmp_path, "hw2")
    pid_file = root / "escapee.pid"
    plant(root, "nn/nn_basic.py", f"PID_FILE = {str(pid_file)!r}\n" + ESCAPE)
    report = check(root, only=["flatten"])
    assert statuses(report) == {"hw2_flatten": "pass"}, report.format()
    pid = int(pid_file.read_text())
    alive = (
        Path(f"/proc/{pid}").exists()
        and "Z" not in (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[:1])
    )
    if alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive, "the setsid escapee outlived the checker"
    assert _workers_of(root) == []


@pytest.mark.skipif(landlock_abi() < 6, reason="Landlock's signal scope needs ABI 6")
def test_the_worker_cannot_signal_the_process_that_watches_it(tmp_path):
    root = skeleton(tmp_path, "hw2")
    plant(
        root,
        "__init__.py",
        f"""
import os as _os, signal as _signal
try:
    _os.kill(_os.getppid(), _signal.SIGKILL)
    _outcome = "sent"
except PermissionError:
    _outcome = "refused"
open({str(root / "kill.txt")!r}, "w").write(_outcome)
""",
    )
    report = check(root, only=["flatten"])
    assert (root / "kill.txt").read_text() == "refused"
    assert statuses(report) == {"hw2_flatten": "pass"}, report.format()


READS_THE_CHECKERS_FRAMES = """
import sys as _sys

_course_numpy = Tensor.numpy


def _numpy_from_the_callers_expected(self):
    # Tensor.numpy() runs inside the checker's comparison: hand back the expected value from
    # a caller's frame (a worker that computed one for its diagnosis held it there; a blind
    # worker, test_checker_blind.py, computes none).
    frame = _sys._getframe(1)
    while frame is not None:
        if "companion" in frame.f_code.co_filename and "expected" in frame.f_locals:
            return frame.f_locals["expected"]
        frame = frame.f_back
    return _course_numpy(self)


Tensor.numpy = _numpy_from_the_callers_expected
"""


def test_reading_the_expected_value_out_of_the_checkers_frames_does_not_pass(tmp_path):
    root = skeleton(tmp_path, "hw1")
    plant(root, "autograd.py", READS_THE_CHECKERS_FRAMES)
    plant(root, "ops/ops_mathematic.py", "EWiseMul.compute = lambda self, a, b: a + b\n")
    report = check(root, only=["multiply_forward"])
    assert statuses(report) == {"hw1_multiply_forward": "fail"}, report.format()
    assert report.results[0].detail.startswith("multiply(a, b) (forward) is wrong")
