"""NEEDLE_IMPL: the lecture notebooks and this project's tools run against a student's own needle.

Each test copies this project's ``needle/`` as it is (the framework and nothing else) into a
course-layout ``hw4/python/needle`` in tmp_path, or writes the course-style needle of
``course_needle.py`` there, then imports ``needle`` in a subprocess with ``NEEDLE_IMPL`` pointing
at it; ``companion.*`` comes from this project and builds on whichever needle is imported.
(The lecture notebooks on the course-style needle: ``test_course_needle.py``.)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from course_needle import EXTENSIONS, import_through_homework_root, make_course_needle
from test_make_paths import run_recipe

import companion
import needle
from companion import lecture

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(needle.__file__).resolve().parent
COMPANION = Path(companion.__file__).resolve().parent


@pytest.fixture
def student(tmp_path) -> Path:
    """``tmp_path/hw4/python``: a student's folder holding a copy of this project's needle."""
    python = tmp_path / "hw4" / "python"
    shutil.copytree(PACKAGE, python / "needle", ignore=shutil.ignore_patterns("__pycache__"))
    return python


@pytest.fixture
def course_student(tmp_path) -> Path:
    """``tmp_path/hw4/python``: the course-style needle (course_needle.py)."""
    return make_course_needle(tmp_path / "hw4" / "python")


def run(code: str, impl, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``python -c code`` with NEEDLE_IMPL=impl (unset when None)."""
    env = {k: v for k, v in os.environ.items() if k not in ("NEEDLE_IMPL", "PYTHONPATH")}
    if impl is not None:
        env["NEEDLE_IMPL"] = str(impl)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


WHERE = """
import importlib, json, needle
import needle as ndl
mods = {m: importlib.import_module(m).__file__ for m in MODULES}
print(json.dumps(mods))
"""


# The course's own modules: they always come from the student's folder.
COURSE_MODULES = (
    "autograd",
    "backend_ndarray",
    "backend_numpy",
    "backend_selection",
    "data",
    "init",
    "nn",
    "ops",
    "optim",
)


def test_the_students_package_and_its_submodules_are_imported(student):
    course = (
        ["needle"]
        + [f"needle.{m}" for m in COURSE_MODULES]
        + [
            "needle.ops.ops_mathematic",
            "needle.nn.nn_basic",
            "needle.backend_ndarray.ndarray",
            "needle.data.data_basic",
            "needle.init.init_basic",
        ]
    )
    tools = [
        "companion.viz",
        "companion.timing",
        "companion.lecture",
        "companion.data",
        "companion.check.exercises",
        "companion.apps.simple_ml",
        "companion.apps.mlp_resnet",
    ]
    done = run(f"MODULES = {course + tools!r}" + WHERE, student, cwd=student.parents[1])
    assert done.returncode == 0, done.stderr
    where = {m: Path(f).resolve() for m, f in json.loads(done.stdout).items()}
    for m in course:
        assert where[m].is_relative_to(student), (m, where[m])
    for m in tools:
        assert where[m].is_relative_to(COMPANION), (m, where[m])
    assert done.stderr.splitlines().count(f"needle from {student} (NEEDLE_IMPL)") == 1


def test_the_students_package_wins_inside_this_checkout(student):
    """From the checkout (``''`` on sys.path, the editable finder) it is still the student's."""
    done = run(
        "import needle, needle.ops; print(needle.__file__); print(needle.ops.__file__)",
        student,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert [Path(p) for p in done.stdout.split()] == [
        student / "needle" / "__init__.py",
        student / "needle" / "ops" / "__init__.py",
    ]


IMPORTED_TOOLS = (
    "import needle, sys; print(sorted(m for m in sys.modules if m.startswith('companion')))"
)


def test_import_needle_imports_no_tooling(student):
    done = run(IMPORTED_TOOLS, None)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    # under NEEDLE_IMPL only the loader itself, which the start-up .pth imported
    done = run(IMPORTED_TOOLS, student)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['companion', 'companion.impl']"


def test_a_relative_path_is_made_absolute_for_subprocesses(student):
    done = run(
        """
        import os, needle
        print(os.environ["NEEDLE_IMPL"])
        print(needle.__file__)
        """,
        "hw4/python",
        cwd=student.parents[1],
    )
    assert done.returncode == 0, done.stderr
    env, file = done.stdout.split()
    assert Path(env) == student and Path(file) == student / "needle" / "__init__.py"


def test_extensions_are_not_taken_from_this_project(course_student):
    done = run(
        """
        import needle as ndl
        for name in EXTENSIONS:
            try:
                __import__("needle." + name)
            except ModuleNotFoundError as exc:
                print(exc)
        """.replace("EXTENSIONS", repr(EXTENSIONS)),
        course_student,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"No module named 'needle.{m}'" for m in EXTENSIONS]


def test_the_offline_data_sets_are_built_on_the_students_dataset(student):
    done = run(
        """
        import needle as ndl
        import companion.data
        from companion.data.grammar import default_grammar
        ds = companion.data.DigitsDataset(train=False, image_size=8)
        base = ndl.data.Dataset
        print(isinstance(ds, base), base.__module__, len(ds), ds[0][0].shape)
        print(issubclass(companion.data.ShapesDataset, base), len(default_grammar().vocab))
        import sys; print(sys.modules[base.__module__].__file__)
        """,
        student,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:2] == ["True needle.data.data_basic 297 (64,)", "True 69"]
    assert Path(lines[2]) == student / "needle" / "data" / "data_basic.py"


BROKEN_ADD = """

_correct_add = EWiseAdd.compute


def _broken_add(self, a, b):
    return _correct_add(self, a, b) + 1  # off by one, as a student's bug might be
EWiseAdd.compute = _broken_add
"""


def test_a_broken_student_op_shows_up(student):
    code = """
        import numpy as np
        import needle as ndl
        x = ndl.Tensor(np.array([1.0, 2.0], dtype="float32"))
        print((x + x).numpy().tolist())
        """
    assert run(code, student).stdout.strip() == "[2.0, 4.0]"
    ops = student / "needle" / "ops" / "ops_mathematic.py"
    ops.write_text(ops.read_text() + BROKEN_ADD)
    done = run(code, student)
    assert done.stdout.strip() == "[3.0, 5.0]", done.stderr


def test_a_bug_in_the_students_init_propagates(student):
    init = student / "needle" / "__init__.py"
    init.write_text(init.read_text() + "\nraise NotImplementedError('half-written')\n")
    done = run("import needle", student)
    assert done.returncode != 0
    assert "NotImplementedError: half-written" in done.stderr
    assert str(init) in done.stderr


@pytest.mark.parametrize(
    "case, missing",
    [
        ("absent", "is not a folder"),
        ("empty", "has no needle/ "),
        ("no_init", "has no needle/__init__.py"),
    ],
)
def test_a_bad_path_raises_an_import_error_naming_it(tmp_path, case, missing):
    folder = tmp_path / case
    if case != "absent":
        folder.mkdir()
    if case == "no_init":
        (folder / "needle").mkdir()
    done = run("import needle", folder)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: NEEDLE_IMPL=") and str(folder) in last, last
    assert missing in last and "hw2/python" in last, last


# ---- companion-only cells ------------------------------------------------------------------------
MARKED = ["# companion-only: fused kernels (ndl.ops.layernorm_rows)\n", "y = f(x)\n"]


def test_the_transformer_turns_a_marked_cell_into_one_skip_line(capsys):
    out = lecture.skip_companion_only(["\n"] + MARKED, "/hw/python")
    assert len(out) == 1
    exec(compile("".join(out), "<cell>", "exec"), {})
    assert capsys.readouterr().out == (
        "companion-only cell skipped: it uses fused kernels (ndl.ops.layernorm_rows), which the "
        "course's needle (from /hw/python, NEEDLE_IMPL) does not have\n"
    )


@pytest.mark.parametrize(
    "cell",
    [
        ["x = 1\n"],
        ["x = 1  # companion-only: not the first line\n"],
        ["x = 1\n", "# companion-only: a later line\n"],
        ["# companion-only:\n", "x = 1\n"],  # no reason given: not a marker
        [],
    ],
)
def test_the_transformer_leaves_other_cells_alone(cell):
    assert lecture.skip_companion_only(cell, "/hw/python") == cell


IPYTHON = """
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
shell.run_cell("import needle; from companion import lecture; print(lecture.setup())")
shell.run_cell("# companion-only: create_graph=True\\nprint('marked cell ran')")
shell.run_cell("print('plain cell ran')")
"""


def test_setup_registers_the_transformer_only_in_student_mode(student):
    done = run(IPYTHON, student)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "True",
        f"companion-only cell skipped: it uses create_graph=True, which the course's needle "
        f"(from {student}, NEEDLE_IMPL) does not have",
        "plain cell ran",
    ]
    done = run(IPYTHON, None)  # this project's needle: the marked cell runs as written
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["False", "marked cell ran", "plain cell ran"]


# ---- a failed import keeps failing: never this project's needle ----------------------------------
RETRY = """
import sys
init = sys.argv[1]
correct = open(init).read()
open(init, "w").write(correct + "\\nraise NotImplementedError('half-written')\\n")
for attempt in (1, 2):
    try:
        import needle
        print(attempt, "imported", needle.__file__)
    except NotImplementedError as exc:
        print(attempt, "raised", exc)
open(init, "w").write(correct)  # the student fixes the typo and re-runs the cell
import needle, needle.ops
print(3, "imported", needle.__file__, needle.ops.__file__)
"""


def test_a_failed_import_fails_again_then_imports_the_fixed_package(student):
    init = student / "needle" / "__init__.py"
    env = {k: v for k, v in os.environ.items() if k not in ("NEEDLE_IMPL", "PYTHONPATH")}
    env["NEEDLE_IMPL"] = str(student)
    done = subprocess.run(
        [sys.executable, "-c", RETRY, str(init)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "1 raised half-written",
        "2 raised half-written",
        f"3 imported {init} {student / 'needle' / 'ops' / '__init__.py'}",
    ]


GONE = """
import shutil, sys
try:
    import needle
except NotImplementedError as exc:
    print("raised", exc)
shutil.rmtree(sys.argv[1])  # the student's package is gone (renamed, a branch switch)
try:
    import needle
    print("imported", needle.__file__)
except ImportError as exc:
    print("ImportError", exc)
"""


def test_a_package_that_disappears_after_a_failed_import_is_not_replaced(student):
    init = student / "needle" / "__init__.py"
    init.write_text(init.read_text() + "\nraise NotImplementedError('half-written')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("NEEDLE_IMPL", "PYTHONPATH")}
    env["NEEDLE_IMPL"] = str(student)
    done = subprocess.run(
        [sys.executable, "-c", GONE, str(student / "needle")],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "raised half-written"
    assert lines[1].startswith(f"ImportError NEEDLE_IMPL={student}: ")
    assert "has no needle/" in lines[1]


@pytest.mark.parametrize("value", ["", "   ", "ROOT"])
def test_a_blank_or_own_value_is_ignored_in_one_line(value):
    done = run("import needle; print(needle.__file__)", str(ROOT) if value == "ROOT" else value)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()) == PACKAGE / "__init__.py"
    lines = [line for line in done.stderr.splitlines() if "NEEDLE_IMPL" in line]
    assert len(lines) == 1 and lines[0].endswith(
        "ignored" if value == "ROOT" else "ignored, this project's needle is imported"
    )
    assert lines[0].startswith(f"NEEDLE_IMPL={str(ROOT) if value == 'ROOT' else repr(value)} is ")


# ---- a student's kernels measured (benchmarks/student.py) ----------------------------------------
# A deliberately slow matmul: the homework's naive triple loop, in Python.
NAIVE_MATMUL = """


def _naive_matmul(self, other):
    m, n = self.shape
    p = other.shape[1]
    a, b = self.numpy(), other.numpy()
    out = np.zeros((m, p), dtype=np.float32)
    for i in range(m):
        for j in range(p):
            total = 0.0
            for k in range(n):
                total += a[i, k] * b[k, j]
            out[i, j] = total
    return NDArray(out, device=self.device)


NDArray.__matmul__ = _naive_matmul
"""


def test_make_bench_names_a_naive_matmul(student):
    ndarray = student / "needle" / "backend_ndarray" / "ndarray.py"
    ndarray.write_text(ndarray.read_text() + NAIVE_MATMUL)
    # the command `make bench NEEDLE_IMPL=...` runs (see test_make_paths), quick: tiny sizes
    done = run_recipe(
        "bench",
        ("companion bench",),
        {"NEEDLE_IMPL": str(student), "NEEDLE_BENCH_QUICK": "1", "PY": sys.executable},
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert f"your needle: {student / 'needle'}" in out and f"this project's: {PACKAGE}" in out
    advice = out.split("\nadvice:\n", 1)[1].splitlines()
    matmul = [line for line in advice if line.strip().startswith("matmul:")]
    assert len(matmul) == 1, out
    assert "your matmul is the naive triple loop (no device matmul kernel" in matmul[0]
    assert "notebooks/05_ndarray, § 8. Three matmul kernels" in matmul[0]
    # every table row was measured
    for case in ("matmul 24x24x24", "add", "compact of a transpose", "sum (axis=1)"):
        row = next(line for line in out.splitlines() if line.startswith(case))
        assert row.count("GFLOP/s" if case.startswith("matmul") else "GB/s") == 3, row
    assert "training step (yours; MLP 16-16-4, batch 8, SGD)" in out
    assert "training step (this project's; MLP 16-16-4, batch 8, SGD)" in out


# ---- the lecture report card ---------------------------------------------------------------------
PLANTED_ADD = """


def _planted_add(self, a, b):
    raise RuntimeError("planted add bug")


EWiseAdd.compute = _planted_add
"""


def test_the_lecture_report_names_the_failing_notebook_and_cell(course_student, tmp_path):
    ops = course_student / "needle" / "ops" / "ops_mathematic.py"
    ops.write_text(ops.read_text() + PLANTED_ADD)
    name = "02_automatic_differentiation"
    cards = tmp_path / "cards.json"
    done = run_recipe(
        "lecture-report",
        ("companion lecture-report",),
        {"NEEDLE_IMPL": str(course_student), "NB": f"notebooks/{name}.py", "PY": sys.executable},
        timeout=600,
        replace=('"NB=${NB-}"', f'"NB=${{NB-}}" --json {cards}'),
    )
    assert done.returncode == 1, done.stdout + done.stderr  # a cell failed
    (card,) = json.loads(cards.read_text())
    import nbformat

    nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    marked = len(
        re.findall(
            r"^# %%.*\n# companion-only: ",
            (ROOT / "notebooks" / f"{name}.py").read_text(),
            flags=re.M,
        )
    )
    assert card["notebook"] == name and card["skipped"] == marked and card["not_run"] == 0
    assert card["passed"] + card["failed"] + card["skipped"] == sum(1 for s in code if s.strip())
    first = card["first_failure"]
    assert first["error"] == "RuntimeError: planted add bug"
    assert first["first_line"] == next(
        line.strip() for line in code[first["cell"] - 1].splitlines() if line.strip()
    )
    # the line that raised: the student's file and line, not the cell's first line
    planted = ops.read_text().splitlines().index('    raise RuntimeError("planted add bug")') + 1
    where = f'python/needle/ops/ops_mathematic.py:{planted} `raise RuntimeError("planted add bug")`'
    assert first["where"] == where
    # the cells before it ran on the student's needle and passed
    assert card["passed"] >= first["cell"] - 1 - marked
    row = next(line for line in done.stdout.splitlines() if line.startswith(name))
    assert row.split()[1:4] == [str(card["passed"]), str(card["failed"]), str(card["skipped"])]
    assert f"cell {first['cell']}: {where}: RuntimeError: planted add bug" in row
    assert f"needle from {course_student} (NEEDLE_IMPL)" in done.stdout


# IPYTHON's three cells (setup, a marked one, a plain one), then a failing one and the card
TALLY = (
    IPYTHON
    + """
shell.run_cell("1 / 0")
shell.run_cell("lecture.report_card()")
"""
)


def test_a_notebook_kernel_prints_its_own_report_card(student):
    done = run(TALLY, student)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[-2:] == [
        "report card: 2 cells passed, 1 failed, 1 skipped (companion-only)",
        "  failed: `1 / 0`: ZeroDivisionError: division by zero",
    ]


# ---- the course's environment: the homework root on sys.path ---------------------------------
DROPOUT = """
import sys
import numpy as np
import needle as ndl
np.random.seed(0)
y = ndl.nn.Dropout(0.5)(ndl.Tensor(np.ones((2, 4), dtype="float32")))
print(y.numpy().ravel().tolist())
print(sys.modules["python.needle.init.init_basic"].__file__)
print(sys.path[-1])
"""


def test_the_homework_root_is_on_the_path_as_in_the_course(course_student, tmp_path):
    """A real student's hw2 imported ``randb`` through the homework root (``from
    python.needle.init.init_basic import randb``): it works under NEEDLE_IMPL as in the course,
    from any folder, because the folder above NEEDLE_IMPL is on sys.path too."""
    import_through_homework_root(course_student)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = run(DROPOUT, course_student, cwd=elsewhere)
    assert done.returncode == 0, done.stderr
    values, init_file, last = done.stdout.splitlines()
    import numpy as np

    np.random.seed(0)  # the mask is one np.random.rand call, kept where rand <= 1 - p
    expected = np.where(np.random.rand(2, 4) <= 0.5, 2.0, 0.0).ravel().tolist()
    assert json.loads(values) == expected
    assert Path(init_file) == course_student / "needle" / "init" / "init_basic.py"
    assert Path(last) == course_student.parent


IMPORT_CELLS = [
    "import time\nimport needle as ndl",
    "y = 1\nassert y == 2, 'y is not 2'",
    "def f():\n    raise KeyError('k')\n\n\nf()",  # raised in a function the notebook defines
]


def test_the_lecture_report_names_the_students_failing_line(course_student, tmp_path, monkeypatch):
    """The report names the line that raised (the student's file:line, or the cell's line) and
    the error, not the cell's first line."""
    import nbformat

    from companion import report_card

    nn_basic = import_through_homework_root(course_student)
    text = nn_basic.read_text().replace("init_basic import randb\n", "init_basic import randbb\n")
    nn_basic.write_text(text)
    number = text.splitlines().index("from python.needle.init.init_basic import randbb") + 1
    notebook = tmp_path / "tiny.ipynb"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in IMPORT_CELLS])
    nbformat.write(nb, notebook)
    monkeypatch.setenv("NEEDLE_IMPL", str(course_student))
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
    card = report_card.run_notebook(notebook, timeout=120)
    assert (card.passed, card.failed, card.not_run) == (0, 3, 0), card
    first, second, third = card.failures
    assert first["where"] == (
        f"python/needle/nn/nn_basic.py:{number} `from python.needle.init.init_basic import randbb`"
    )
    assert first["error"].startswith("ImportError: cannot import name 'randbb' from ")
    assert second["where"] == "line 2 `assert y == 2, 'y is not 2'`"
    assert second["error"] == "AssertionError: y is not 2"
    assert third["where"] == "line 5 `f()` (raised at line 2 `raise KeyError('k')`)"
    row = report_card.format_cards([card], "x").splitlines()[3]
    assert f"cell 1: {first['where']}: ImportError: cannot import name 'randbb'" in row


KERNEL_TALLY = (
    IPYTHON
    + """
shell.run_cell("import numpy as np; x = needle.Tensor(np.ones(2, dtype='float32'))")
shell.run_cell("x + x")
shell.run_cell("lecture.report_card()")
"""
)


def test_a_notebook_kernel_names_the_students_failing_line(student):
    ops = student / "needle" / "ops" / "ops_mathematic.py"
    ops.write_text(ops.read_text() + PLANTED_ADD)
    planted = ops.read_text().splitlines().index('    raise RuntimeError("planted add bug")') + 1
    done = run(KERNEL_TALLY, student)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == (
        f"  failed: python/needle/ops/ops_mathematic.py:{planted} "
        '`raise RuntimeError("planted add bug")`: RuntimeError: planted add bug'
    )


APPS = """
import numpy as np
import needle as ndl
from companion import lecture
from companion.apps.models import LanguageModel, ResNet9

model = ResNet9(device=ndl.cpu())
lm = LanguageModel(8, 11, 16, seq_model="lstm", seq_len=4, device=ndl.cpu())
out, _ = lm(ndl.Tensor(np.zeros((4, 2), dtype="float32"), device=ndl.cpu()))
print(lecture.fast_path(model, lm), type(model.model.modules[0]).__name__, out.shape)
"""


def test_the_apps_import_on_a_needle_without_the_fast_wing(course_student):
    """The course's model zoo runs on a student's needle, which has no needle.fast (the fused
    twins are this project's): no twin is registered and fast_path() leaves the model as is."""
    done = run(APPS, course_student)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "ConvBN", "(8,", "11)"]
