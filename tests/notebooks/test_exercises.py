"""The exercises at the end of the lecture notebooks work, with the stubs and with the answers.

An exercise section is a cell tagged ``exercise-setup`` (self-contained imports and data), then
per exercise a ``exercise-stub`` cell (functions whose body is ``raise NotImplementedError``)
and an ``exercise-check`` cell. The reference answers live in notebooks/solutions/<notebook>.py,
kept out of the notebooks. Each notebook's section is run twice, on the cells alone: with the
stubs every check says "not answered yet"; with the reference answers in place of the stubs
every check passes in strict mode (anything but "correct" raises).
"""

from __future__ import annotations

import ast
import contextlib
import io
from pathlib import Path

import jupytext
import pytest

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
SOLUTIONS = NOTEBOOKS / "solutions"
# Notebooks that carry exercises: every lecture notebook.
WITH_EXERCISES = [
    "01_softmax_regression",
    "02_automatic_differentiation",
    "03_nn_library",
    "04_training",
    "05_ndarray",
    "06_hardware_acceleration",
    "07_convolutions",
    "08_sequence_models",
    "09_transformers",
    "10_nn_abstractions",
    "11_generative_adversarial_networks",
    "12_training_large_models",
    "13_deployment_and_compilation",
]


def exercise_cells(notebook: Path) -> dict[str, list[str]]:
    """The sources of the exercise cells of a percent-format notebook, by tag."""
    cells: dict[str, list[str]] = {"exercise-setup": [], "exercise-stub": [], "exercise-check": []}
    for cell in jupytext.read(notebook).cells:
        for tag in cell.metadata.get("tags", []):
            if tag in cells:
                cells[tag].append(cell.source)
    return cells


def defined_functions(source: str) -> set[str]:
    return {n.name for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)}


def run_section(cells: dict[str, list[str]], answers: str | None) -> str:
    """Run setup, then the stubs (or ``answers``), then the checks; returns what they print."""
    namespace: dict = {"__name__": "exercises"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for source in cells["exercise-setup"]:
            exec(compile(source, "exercise-setup", "exec"), namespace)
        for source in [answers] if answers is not None else cells["exercise-stub"]:
            exec(compile(source, "answers", "exec"), namespace)
        for source in cells["exercise-check"]:
            exec(compile(source, "exercise-check", "exec"), namespace)
    return out.getvalue()


@pytest.mark.parametrize("name", WITH_EXERCISES)
def test_stubs_are_reported_as_not_answered(name, monkeypatch):
    monkeypatch.delenv("NEEDLE_EXERCISES", raising=False)
    cells = exercise_cells(NOTEBOOKS / f"{name}.py")
    assert len(cells["exercise-setup"]) == 1
    assert 3 <= len(cells["exercise-check"]) <= 5, "three to five exercises per notebook"
    assert len(cells["exercise-stub"]) == len(cells["exercise-check"])
    lines = run_section(cells, None).splitlines()
    assert len(lines) == len(cells["exercise-check"])
    assert all("not answered yet" in line for line in lines), lines


@pytest.mark.parametrize("name", WITH_EXERCISES)
def test_reference_answers_pass_every_check(name, monkeypatch):
    monkeypatch.setenv("NEEDLE_EXERCISES", "strict")
    cells = exercise_cells(NOTEBOOKS / f"{name}.py")
    answers = (SOLUTIONS / f"{name}.py").read_text()
    stubbed = set().union(*(defined_functions(s) for s in cells["exercise-stub"]))
    assert defined_functions(answers) == stubbed, "one reference answer per stub function"
    lines = run_section(cells, answers).splitlines()
    assert len(lines) == len(cells["exercise-check"])
    assert all(line.endswith(": correct") for line in lines), lines


def test_a_wrong_answer_is_reported_with_the_difference(monkeypatch):
    monkeypatch.delenv("NEEDLE_EXERCISES", raising=False)
    cells = exercise_cells(NOTEBOOKS / "01_softmax_regression.py")
    answers = (SOLUTIONS / "01_softmax_regression.py").read_text()
    wrong = answers.replace("return np.log(k)", "return np.log(k) + 0.5")
    out = run_section(cells, wrong)
    assert "1.2 loss_at_zero: not yet. result 0: expected 0.693147, got 1.19315" in out
    assert out.count(": correct") == len(cells["exercise-check"]) - 1
