"""Every notebook cell that times something prints the machine line first.

A timing cell (the rule is in timing_cells.py: its source's syntax tree, after IPython magics
are removed, references ``time.perf_counter``, ``time.time``, ``timeit``, ``%timeit``,
``companion.timing.measure`` or another helper of ``companion`` that times, ...) must show, as
the first line it prints on stdout in the committed notebook, the line
``companion.machine.machine_line()`` makes: ``machine: <cpu>, N logical CPUs, ISA ..., load
X.XX``. That line varies from run to run, so such a cell carries ``nbval-ignore-output``.
One exception: a timing cell whose output nbval compares (say, a run whose losses are compared
while its timings are kept for later) cannot print that line, so the next code cell must: it is
the one that shows the timings, tagged, with the machine line first. Cells are named by their
index in the notebook's cell list (0-based, markdown included).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from notebook_json import IGNORE_OUTPUT, NOTEBOOKS, load_cells, stdout_lines, tags, write_notebook
from timing_cells import companion_modules, strip_magics, timing_cells, timing_helpers

from companion.machine import machine_line

MACHINE_LINE = re.compile(r"^machine: .+, \d+ logical CPUs, ISA \S.*, load (\d+\.\d\d|unknown)$")
HELPERS = timing_helpers(companion_modules())


def starts_with_machine_line(cell: dict) -> bool:
    """Whether the cell's first stdout line is a machine line."""
    lines = stdout_lines(cell)
    return bool(lines) and MACHINE_LINE.match(lines[0]) is not None


def machine_line_problems(path: Path, helpers: set[str] = HELPERS) -> list[str]:
    """``cell K: ...`` for each timing cell of the notebook at ``path`` whose stdout does not
    start with a machine line (nor, for a compared cell, the next code cell's), or that prints
    it under comparison."""
    cells = load_cells(path)
    code = [i for i, cell in enumerate(cells) if cell["cell_type"] == "code"]
    problems = []
    for k in timing_cells([cells[i]["source"] for i in code], helpers):
        cell, index = cells[code[k]], code[k]
        first = next((line for line in cell["source"].splitlines() if line.strip()), "")
        where = f"{path.name} cell {index} ({first.strip()[:60]!r})"
        compared = IGNORE_OUTPUT not in tags(cell)
        if starts_with_machine_line(cell):
            if compared:
                problems.append(
                    f"{where} prints the machine line but is not tagged {IGNORE_OUTPUT}"
                )
            continue
        after = cells[code[k + 1]] if k + 1 < len(code) else {}
        if compared and IGNORE_OUTPUT in tags(after) and starts_with_machine_line(after):
            continue
        lines = stdout_lines(cell)
        shown = repr(lines[0][:70]) if lines else "nothing"
        problems.append(
            f"{where} times something but prints {shown} first, not the machine line"
            + (" (nor does the next code cell, tagged)" if compared else "")
        )
    return problems


def test_the_pattern_reads_machine_line():
    assert MACHINE_LINE.match(machine_line()), machine_line()
    assert MACHINE_LINE.match("machine: AMD EPYC 7B13, 2 logical CPUs, ISA AVX2, load 0.41")
    # machine_info()'s line has no load on it
    assert not MACHINE_LINE.match("machine: vm x86_64, AMD EPYC, 2 logical CPUs, ISA AVX2")


def test_the_companion_helpers_that_time_are_found():
    assert {
        "companion.timing.measure",
        "companion.roofline.measured_cpu",
        "companion.step_profile.profile_case",
        "companion.step_profile.KernelTimer",
        "-m companion.apps.distributed_train",
    } <= HELPERS
    assert not {"companion.machine.machine_line", "companion.viz.LiveCurves"} & HELPERS
    assert "companion.step_profile.render" not in HELPERS


SOURCES = {
    "measure": "from companion.timing import measure\nt = measure(lambda: 1)",
    "aliased": "from time import perf_counter as clock\nt0 = clock()",
    "module": "import time\nt0 = time.time()",
    "timeit": "import timeit\ntimeit.timeit('1', number=3)",
    "line magic": "x = 1\n%timeit x + 1",
    "cell magic": "%%timeit -n 3\nx = 1",
    "assigned magic": "r = %timeit -o 1 + 1",
    "profile": "from companion import step_profile\nstep_profile.profile_case('mlp', None)",
    "subprocess": "import sys\nargs = [sys.executable, '-m', 'companion.apps.distributed_train']",
    "program": "p = 'import time\\nt = time.perf_counter()\\nprint(t)'",
    "tvm": "ev = fn.mod.time_evaluator('main', dev, number=3)",
    "in a loop": "import time\nfor i in range(3):\n    with open(f) as f:\n        s = time.time()",
}
NOT_TIMING = {
    "a variable named time": "time = 3\nprint(time.time)",
    "a definition only": "import time\ndef timed(f):\n    t = time.perf_counter()\n    f()",
    "monotonic": "import time\nt = time.monotonic()",
    "a shell line": "!time ls\nx = 1",
    "a string": "print('time.perf_counter() measures')",
    "the machine line": "from companion.machine import machine_line\nprint(machine_line())",
    "not-timing step_profile": "from companion import step_profile\nstep_profile.render({})",
}


@pytest.mark.parametrize("name", SOURCES)
def test_a_timing_cell_is_recognised(name):
    assert timing_cells([SOURCES[name]], HELPERS) == [0]


@pytest.mark.parametrize("name", NOT_TIMING)
def test_a_cell_that_times_nothing_is_not(name):
    assert timing_cells([NOT_TIMING[name]], HELPERS) == []


def test_a_helper_a_notebook_defines_times_where_it_is_called():
    sources = [
        "import time",
        "def best(fn):\n    t = time.perf_counter()\n    fn()\n    return time.perf_counter() - t",
        "def twice(fn):\n    return best(fn) + best(fn)",
        "x = 1",
        "print(twice(lambda: None))",
    ]
    assert timing_cells(sources, HELPERS) == [4]


def test_magics_are_stripped_and_a_cell_that_does_not_parse_is_named():
    assert strip_magics("%matplotlib inline\nx = 1") == ("pass\nx = 1", False)
    assert strip_magics("%%bash\ntime ls") == ("", False)
    assert strip_magics("  %time f()")[1]
    assert strip_magics("a, b = !ls\nprint('x =%d' % 3)") == (
        "a, b = None\nprint('x =%d' % 3)",
        False,
    )
    with pytest.raises(ValueError, match="code cell 1 does not parse"):
        timing_cells(["x = 1", "def f(:"], HELPERS)


def test_planted_defects_are_named(tmp_path):
    timed = "from companion.timing import measure\nprint(measure(lambda: 1))"
    ok = {"code": timed, "tags": [IGNORE_OUTPUT], "stdout": machine_line() + "\n0.1\n"}
    notebook = write_notebook(
        tmp_path / "99_x.ipynb",
        [
            {"markdown": "# 99"},
            ok,
            {"code": timed, "tags": [IGNORE_OUTPUT], "stdout": "0.1\n"},
            {"code": timed, "tags": [IGNORE_OUTPUT], "stdout": "0.1\n" + machine_line() + "\n"},
            {"code": timed, "stdout": machine_line() + "\n"},
            {"code": timed, "stdout": "loss 0.5\n"},
            {"code": "x = 1", "stdout": "1\n"},
        ],
    )
    problems = machine_line_problems(notebook)
    assert [p.split(" (")[0] for p in problems] == [
        "99_x.ipynb cell 2",
        "99_x.ipynb cell 3",
        "99_x.ipynb cell 4",
        "99_x.ipynb cell 5",
    ]
    assert "prints '0.1' first, not the machine line" in problems[0]
    assert "not tagged nbval-ignore-output" in problems[2]
    assert problems[3].endswith("(nor does the next code cell, tagged)")
    assert machine_line_problems(write_notebook(tmp_path / "98_y.ipynb", [ok])) == []


def test_a_compared_timing_cell_passes_with_the_next_cell_showing_the_line(tmp_path):
    run = {"code": "import time\nt0 = time.time()\nprint('loss 0.5')", "stdout": "loss 0.5\n"}
    report = {"code": "print(t0)", "tags": [IGNORE_OUTPUT], "stdout": machine_line() + "\n1.0\n"}
    assert machine_line_problems(write_notebook(tmp_path / "97_z.ipynb", [run, report])) == []
    untagged = {**report, "tags": []}
    assert len(machine_line_problems(write_notebook(tmp_path / "96_w.ipynb", [run, untagged]))) == 1


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_timing_cell_prints_the_machine_line_first(path):
    problems = machine_line_problems(path)
    assert not problems, "\n".join(problems)
