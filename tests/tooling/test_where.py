"""The map from homework questions to code (``companion.where``, ``make where Q=...``).

Each function a homework question asks for carries a ``# question: <id>`` marker (``//`` in
C++) on the line above its definition. These tests hold the markers and the checker's question
registry to each other both ways, and check each location against the source parsed by ``ast``.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from companion import where
from companion.check.questions import BY_ID, QUESTIONS

ROOT = Path(where.__file__).resolve().parent.parent


def _python_definitions(path: Path) -> dict:
    """line -> qualified name (Class.method) of each def/class in a Python file, from ast."""
    found = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                found[child.lineno] = name
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text(encoding="utf-8")), "")
    return found


def _all_locations() -> list:
    return [(qid, loc) for qid, locs in where.markers().items() for loc in locs]


def test_every_question_has_a_marker():
    missing = [q.id for q in QUESTIONS if not where.locate(q.id)]
    assert not missing, f"questions with no `# question:` marker in the code: {missing}"


def test_every_marker_names_a_known_question():
    unknown = [f"{loc.path}:{loc.line} {qid}" for qid, loc in _all_locations() if qid not in BY_ID]
    assert not unknown, f"markers naming no question the checker knows: {unknown}"


def test_each_location_is_a_marker_above_the_named_definition():
    assert len(_all_locations()) >= len(QUESTIONS)
    for qid, loc in _all_locations():
        path = ROOT / loc.path
        lines = path.read_text(encoding="utf-8").splitlines()
        marker = lines[loc.line - 1].strip()
        assert marker.split(": ", 1)[0] in ("# question", "// question"), (loc, marker)
        assert qid in marker.split(": ", 1)[1].split(), (loc, marker)
        assert not where.MARKER.match(lines[loc.line - 2]), f"{loc}: two markers on one definition"
        if path.suffix == ".py":
            assert _python_definitions(path).get(loc.line + 1) == loc.function, (loc, qid)
        else:
            short = loc.function.rsplit(".", 1)[-1]
            assert re.match(rf"^\S.*\b{re.escape(short)}\s*\(", lines[loc.line]), (loc, qid)


def test_no_malformed_marker_is_silently_ignored():
    """A comment that looks like a marker but does not parse would drop out of the map."""
    loose = re.compile(r"^\s*(#|//)\s*question\s*:")
    bad = []
    for top in where.SCANNED:
        for path in (ROOT / top).rglob("*"):
            if path.suffix not in where.SUFFIXES or not path.is_file():
                continue
            for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if loose.match(line) and not where.MARKER.match(line):
                    bad.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not bad, bad


def test_locate_known_answers():
    """A few locations checked by hand: a method, a C++ kernel, a function serving two ids."""
    assert [(loc.path, loc.function) for loc in where.locate("hw2_sgd")] == [
        ("needle/optim.py", "SGD.step")
    ]
    assert ("src/cpu/ndarray_backend_cpu.cc", "compact") in [
        (loc.path, loc.function) for loc in where.locate("hw3_compact")
    ]
    both = {(loc.path, loc.function) for loc in where.locate("hw0_softmax_loss")}
    assert both == {(loc.path, loc.function) for loc in where.locate("hw1_softmax_loss")}
    assert both == {("companion/apps/simple_ml.py", "softmax_loss")}


def test_locate_unknown_question_names_close_matches():
    with pytest.raises(KeyError, match="hw2_sgd"):
        where.locate("hw2_sdg")
    with pytest.raises(KeyError, match="unknown question 'nonsense'"):
        where.locate("nonsense")


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "companion.where", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_prints_locations_and_errors():
    done = _cli("hw3_matmul")
    assert done.returncode == 0, done.stderr
    expected = [f"{loc.path}:{loc.line}  {loc.function}" for loc in where.locate("hw3_matmul")]
    assert done.stdout.splitlines() == expected

    done = _cli("hw2_sdg")
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1 and "hw2_sgd" in done.stderr

    done = _cli()
    assert done.returncode == 0, done.stderr
    listed = {line.split()[0] for line in done.stdout.splitlines()}
    assert listed == set(BY_ID)


def test_make_where_runs_the_cli():
    done = subprocess.run(
        ["make", "-n", "-s", "--no-print-directory", "where", "Q=hw2_sgd"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert any(line.endswith("-m companion.where hw2_sgd") for line in done.stdout.splitlines()), (
        done.stdout
    )
