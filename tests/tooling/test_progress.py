"""Progress over runs of ``make check``: the history in the homework folder, ``--progress``.

Runs are recorded from Report objects built here (statuses chosen by the test), so the oracle is
the test's own table; one test goes end to end through ``python -m companion.check`` and
``make progress`` on a course-layout copy (see test_checker.py's ``skeleton``).
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_checker import skeleton

from companion.check import progress, questions_for
from companion.check.questions import HOMEWORKS, QUESTIONS
from companion.check.runner import Report, Result
from companion.check.sections import (
    NOTEBOOKS,
    SECTIONS,
    lecture_section,
    matching_headers,
    section_entry,
)

ROOT = Path(__file__).resolve().parents[2]
T0 = datetime.datetime(2026, 11, 30, 12, 0, tzinfo=datetime.timezone.utc)


def report(root: Path, hw: str, statuses: dict[str, str], default: str = "pass") -> Report:
    """A Report for ``hw`` in which every question has ``default`` unless ``statuses`` says."""
    rep = Report(hw, root)
    rep.results = [Result(q, statuses.get(q.id, default)) for q in questions_for(hw)]
    return rep


def record(root, hw, statuses, minutes, default="pass", only=None):
    assert (
        progress.record(
            report(root, hw, statuses, default), only, now=T0 + datetime.timedelta(minutes=minutes)
        )
        is None
    )


def test_a_run_is_recorded_in_the_homework_folder(tmp_path):
    root = tmp_path / "hw1"
    root.mkdir()
    record(root, "hw1", {"hw1_add_backward": "fail", "hw1_log_forward": "crashed"}, 0)
    doc = json.loads((root / ".needle-check" / "history.json").read_text())
    assert doc["homework"] == "hw1" and len(doc["runs"]) == 1
    run = doc["runs"][0]
    assert run["time"] == "2026-11-30T12:00:00+00:00" and run["only"] is None
    assert list(run["results"]) == [q.id for q in questions_for("hw1")]
    assert {q: s for q, s in run["results"].items() if s != "pass"} == {
        "hw1_add_backward": "fail",
        "hw1_log_forward": "crashed",
    }
    # the student's own git ignores the folder
    assert (root / ".needle-check" / ".gitignore").read_text().splitlines()[-1] == "*"
    record(root, "hw1", {}, 5)
    assert len(progress.load_history(root)) == 2


def test_nothing_is_written_inside_this_checkout():
    rep = report(ROOT / "notebooks", "hw1", {})
    note = progress.record(rep)
    assert note is not None and "inside this project's checkout" in note
    assert not (ROOT / "notebooks" / ".needle-check").exists()


def test_changes_next_question_and_partial_runs(tmp_path):
    root = tmp_path / "hw2"
    root.mkdir()
    order = [q.id for q in questions_for("hw2")]
    record(root, "hw2", {order[0]: "fail", order[3]: "not implemented", order[5]: "fail"}, 0)
    # a -k run of two questions: order[0] now passes, order[1] now fails
    record(root, "hw2", {order[1]: "fail"}, 1, only=["x"])
    history = progress.load_history(root)
    history[-1]["results"] = {order[0]: "pass", order[1]: "fail"}
    (root / ".needle-check" / "history.json").write_text(
        json.dumps({"version": 1, "homework": "hw2", "runs": history})
    )
    item = progress.Progress("hw2", root, progress.load_history(root))
    assert progress.changes(item.runs) == ([order[0]], [order[1]])
    # questions the partial run left out keep their earlier status
    assert item.passed == len(order) - 3
    assert item.next_question == order[1]
    text = "\n".join(item.format())
    assert f"newly passing: {order[0]}" in text and f"newly failing: {order[1]}" in text
    assert f"next: {order[1]} (fail); see {lecture_section(order[1])}" in text
    assert f"{len(order) - 3:>3}/{len(order):<3} passed" in text


def test_every_question_passing_and_no_change(tmp_path):
    root = tmp_path / "hw4_extra"
    root.mkdir()
    record(root, "hw4_extra", {}, 0)
    record(root, "hw4_extra", {}, 1)
    lines = progress.Progress("hw4_extra", root, progress.load_history(root)).format()
    assert lines[-2:] == [
        " " * 11 + "no change since the run before",
        " " * 11 + "every question passes",
    ]


def test_homework_folders_are_found_beside_and_inside(tmp_path):
    course = tmp_path / "dlsys"
    for name in ("hw0", "hw1", "hw3-main", "hw4_extra", "notes"):
        (course / name).mkdir(parents=True)
    (course / "hw2.zip").write_text("not a folder")
    want = [
        ("hw0", course / "hw0"),
        ("hw1", course / "hw1"),
        ("hw3", course / "hw3-main"),
        ("hw4_extra", course / "hw4_extra"),
    ]
    assert progress.find_homeworks([course]) == want
    assert progress.find_homeworks([course / "hw1"]) == want
    with pytest.raises(ValueError, match="no homework folder"):
        progress.find_homeworks([course / "notes"])
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        progress.find_homeworks([course / "hw9"])


def test_the_report_covers_checked_and_unchecked_homeworks(tmp_path):
    course = tmp_path / "dlsys"
    for hw in ("hw0", "hw1"):
        (course / hw).mkdir(parents=True)
    first = questions_for("hw1")[0].id
    record(course / "hw1", "hw1", {first: "fail"}, 0)
    text = progress.format_progress(progress.progress([course]))
    n0, n1 = len(questions_for("hw0")), len(questions_for("hw1"))
    assert f"hw0          -/{n0:<3} not checked yet" in text
    assert f"make check HW={course / 'hw0'}" in text
    assert f"hw1        {n1 - 1:>3}/{n1:<3} passed" in text
    assert f"total: {n1 - 1}/{n1} questions pass in 1 checked homework folder(s)" in text


# ---- the lecture-section table -------------------------------------------------------------------
def test_every_question_has_exactly_one_lecture_section_in_its_notebook():
    assert NOTEBOOKS.is_dir()
    for q in QUESTIONS:
        stem, start = section_entry(q.id)
        found = matching_headers(stem, start)
        assert len(found) == 1, (q.id, stem, start, found)
        assert lecture_section(q.id) == f"notebooks/{stem}, § {found[0]}"


def test_every_table_row_is_used():
    used = {section_entry(q.id) for q in QUESTIONS}
    assert {(nb, start) for _, _, nb, start in SECTIONS} == used
    assert {hw for hw, *_ in SECTIONS} == set(HOMEWORKS)


def test_sections_come_from_the_notebook_headers(tmp_path):
    (tmp_path / "05_ndarray.py").write_text("# ## 1. Shape, strides and offset, renamed\n")
    assert lecture_section("hw3_reshape", tmp_path) == (
        "notebooks/05_ndarray, § 1. Shape, strides and offset, renamed"
    )
    # without the notebook (a wheel install) the table's own words
    assert lecture_section("hw3_reshape", tmp_path / "none") == (
        "notebooks/05_ndarray, § Shape, strides and offset"
    )


# ---- end to end ----------------------------------------------------------------------------------
def test_make_check_records_and_make_progress_reports(tmp_path):
    root = skeleton(tmp_path, "hw1")
    ops = root / "python" / "needle" / "ops" / "ops_mathematic.py"
    correct = ops.read_text()
    ops.write_text(correct + "\nEWiseAdd.compute = lambda self, a, b: a + b + 1\n")
    env = {k: v for k, v in os.environ.items() if k not in ("NEEDLE_IMPL", "PYTHONPATH")}
    cmd = [sys.executable, "-m", "companion.check", str(root), "--no-build", "-k", "hw1_add_"]
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 1, first.stdout + first.stderr
    assert "FAIL" in first.stdout and "next: hw1_add_forward (fail)" in first.stdout
    ops.write_text(correct)
    second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "newly passing: hw1_add_forward" in second.stdout
    runs = progress.load_history(root)
    assert [r["only"] for r in runs] == [["hw1_add_"], ["hw1_add_"]]
    assert set(runs[1]["results"]) == {
        "hw1_add_forward",
        "hw1_add_backward",
        "hw1_add_scalar_forward",
        "hw1_add_scalar_backward",
    }
    done = subprocess.run(
        [
            "make",
            "-s",
            "--no-print-directory",
            "progress",
            f"HW={tmp_path}",
            f"PY={sys.executable}",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    n = len(questions_for("hw1"))
    assert f"hw1          4/{n:<3} passed  ({root})" in done.stdout
    assert "newly passing: hw1_add_forward" in done.stdout
    # the first question in hw1's order that no run included
    assert f"next: {questions_for('hw1')[4].id} (not run yet)" in done.stdout


@pytest.mark.parametrize(
    "doc",
    [
        {"version": 1, "homework": "hw2", "runs": [{"results": {"hw2_linear": "pass"}}]},
        {"version": 1, "runs": [{"time": 5, "only": "sgd", "results": {"hw2_linear": 3}}]},
        {"version": 9, "homework": ["hw2"], "runs": [None, [], {"results": []}]},
        [1, 2, 3],
    ],
    ids=["no-time", "wrong-types", "junk-runs", "not-an-object"],
)
def test_a_malformed_history_does_not_crash_progress(tmp_path, doc, capsys):
    """A history from another version (runs without ``time``, G16) or edited by hand: the
    entries that cannot be read are left out, and ``--progress`` and ``check`` still report."""
    from companion.check.__main__ import main

    root = tmp_path / "hw2"
    root.mkdir()
    progress.history_path(root).parent.mkdir()
    progress.history_path(root).write_text(json.dumps(doc))
    assert main(["--progress", str(root)]) == 0
    out = capsys.readouterr().out
    assert "hw2" in out and "Traceback" not in out
    if doc == [1, 2, 3] or "junk-runs" in json.dumps(doc) or doc.get("version") == 9:
        assert "not checked yet" in out
    mine = progress.Progress("hw2", root, progress.load_history(root))
    assert mine.format()  # the lines `make check` prints after its report
    record(root, "hw2", {}, 1)  # and the next run is recorded over it
    assert progress.load_history(root)[-1]["time"] == (
        T0 + datetime.timedelta(minutes=1)
    ).isoformat(timespec="seconds")
