"""Prose never quotes a number that only a varying output shows.

A cell tagged ``nbval-ignore-output`` prints something else at every run (timings, loads), and
nbval does not compare it; a markdown cell that copies a number from it stays as written and
drifts from the next run's output. The rule, per committed notebook:

* A **quoted number** is a number in a markdown cell written with a unit of time, rate, size,
  a ratio or a share: ``31 ms``, ``2.3 GB/s``, ``4 MiB``, ``1.19x``, ``4.4×``, ``62%``, ``17 flops``
  (both ends of ``1.42-1.48x`` or ``62 to 73%``).
* It **comes from a varying output** when a number in the text output of a code cell above it
  tagged ``nbval-ignore-output`` rounds to it at the precision it is written with (``1.2x`` is
  found in ``1.19x``, ``31 ms`` in ``31.4 ms``).
* It is a defect unless the same holds for the code of the notebook (a constant such as
  ``n = 512``) or the text output of a code cell nbval compares (a stable number, which the
  tests re-check): those numbers are the notebook's own, not a run's.

Numbers without such a unit (counts, sizes in words, ``ln 2 ~ 0.693``) are not checked; nor are
numbers in figures or in code comments.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from notebook_json import IGNORE_OUTPUT, NOTEBOOKS, load_cells, output_text, tags, write_notebook

NUMBER = r"\d+(?:\.\d+)?"
UNIT = (
    r"(?:ns|µs|us|ms|s|sec|seconds?|min|minutes?|h|hours?|[kMGT]?FLOP/s|[GT]FLOPS|flops?|"
    r"[kMGT]?B/s|B|bytes|[kKMGT]i?B|%|percent|x|×|times|floats?|nats?|it/s|steps/s)"
)
QUOTE = re.compile(rf"(?<![\w.]){NUMBER}(?:\s*(?:[-–]|to)\s*{NUMBER})?\s*{UNIT}(?![\w/])")
ANY_NUMBER = re.compile(rf"(?<![\w.]){NUMBER}(?!\d)")
STREAMS = ("stdout", "stderr")


def numbers(text: str) -> list[tuple[float, int]]:
    """Each number written in ``text`` as (value, decimals written)."""
    return [(float(m.group()), len(m.group().partition(".")[2])) for m in ANY_NUMBER.finditer(text)]


def rounds_to(written: str, found: list[tuple[float, int]]) -> bool:
    """Whether a number of ``found``, written with at least as many decimals, rounds to
    ``written`` (half a unit of its last place either way)."""
    decimals = len(written.partition(".")[2])
    value, half = float(written), 0.5 * 10.0**-decimals
    return any(d >= decimals and abs(x - value) <= half * (1 + 1e-9) for x, d in found)


def quoted_numbers(markdown: str) -> list[tuple[str, str]]:
    """(number, the quote it is in) for each quoted number of a markdown cell."""
    return [(n, m.group()) for m in QUOTE.finditer(markdown) for n in re.findall(NUMBER, m.group())]


def drifting_quotes(path: Path) -> list[str]:
    """``NN.ipynb cell K: 'quote' ...`` for each quoted number found only in a varying output
    above it (cells by index in the notebook, markdown included, 0-based)."""
    cells = load_cells(path)
    code_cells = [c for c in cells if c["cell_type"] == "code"]
    own = numbers("\n".join(c["source"] for c in code_cells))
    own += numbers(
        "\n".join(output_text(c, STREAMS) for c in code_cells if IGNORE_OUTPUT not in tags(c))
    )
    varying: list[tuple[int, list[tuple[float, int]]]] = []
    problems = []
    for index, cell in enumerate(cells):
        if cell["cell_type"] == "code" and IGNORE_OUTPUT in tags(cell):
            varying.append((index, numbers(output_text(cell, STREAMS))))
        if cell["cell_type"] != "markdown":
            continue
        for number, quote in quoted_numbers(cell["source"]):
            sources = [i for i, found in varying if rounds_to(number, found)]
            if sources and not rounds_to(number, own):
                problems.append(
                    f"{path.name} cell {index}: {quote!r} quotes {number} from the varying "
                    f"output of cell {sources[-1]} (nbval-ignore-output), found in no code or "
                    "compared output"
                )
    return problems


def test_quotes_and_rounding_are_read():
    assert quoted_numbers("a step of 31 ms, 1.42-1.48x, 62 to 73% and 5 epochs") == [
        ("31", "31 ms"),
        ("1.42", "1.42-1.48x"),
        ("1.48", "1.42-1.48x"),
        ("62", "62 to 73%"),
        ("73", "62 to 73%"),
    ]
    assert rounds_to("1.2", numbers("ratio 1.19x")) and rounds_to("31", numbers("31.4 ms"))
    assert rounds_to("0.25", numbers("0.245")) and rounds_to("0.24", numbers("0.245"))
    assert not rounds_to("1.19", numbers("1.2x")) and not rounds_to("3", numbers("31.4 ms"))


TIMED = {"code": "print(step())", "tags": [IGNORE_OUTPUT], "stdout": "step 31.4 ms, 1.19x\n"}


@pytest.mark.parametrize(
    "markdown, found",
    [
        ("A step takes 31.4 ms here.", ["'31.4 ms' quotes 31.4 from the varying output of cell 1"]),
        ("Rounded: 31 ms, and 1.2x the other.", ["'31 ms' quotes 31", "'1.2x' quotes 1.2"]),
        ("A step takes about 40 ms, 2x the other.", []),
        ("The step's 31.4 ms go into 5 phases.", ["'31.4 ms'"]),
    ],
)
def test_a_number_copied_from_a_varying_output_is_named(tmp_path, markdown, found):
    notebook = write_notebook(
        tmp_path / "99_x.ipynb", [{"markdown": "# 99"}, TIMED, {"markdown": markdown}]
    )
    problems = drifting_quotes(notebook)
    assert len(problems) == len(found), problems
    for problem, text in zip(problems, found):
        assert problem.startswith("99_x.ipynb cell 2: ") and text in problem, problem


def test_numbers_the_notebook_owns_are_not_named(tmp_path):
    quote = {"markdown": "A step takes 31.4 ms, 1.19x the other."}
    cases = {
        "above the output": [quote, TIMED],
        "a constant in the code": [{"code": "budget_ms = 31.4\nratio = 1.19"}, TIMED, quote],
        "a compared output": [{"code": "print(x)", "stdout": "31.4 ms 1.19\n"}, TIMED, quote],
        "an untagged output": [{**TIMED, "tags": []}, quote],
    }
    for name, cells in cases.items():
        assert drifting_quotes(write_notebook(tmp_path / "98_y.ipynb", cells)) == [], name


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_prose_quotes_no_number_of_a_varying_output(path):
    problems = drifting_quotes(path)
    assert not problems, "\n".join(problems)
