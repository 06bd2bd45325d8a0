"""Every lecture notebook opens with the same header, so a reader knows what it is for.

The first markdown cell of each notebooks/NN_*.py (the Jupytext percent-format source) must
hold a title line (``# NN · Title``) and then these bold fields, each at the start of its own
line and followed by text: Lecture, Homework, Prerequisites, You will be able to, Run time.
"""

from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
SOURCES = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.py"))
FIELDS = ("Lecture", "Homework", "Prerequisites", "You will be able to", "Run time")


def first_markdown_cell(text: str) -> list[str]:
    """Lines of the first ``# %% [markdown]`` cell of a percent-format script, ``# `` removed."""
    lines = text.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.startswith("# %% [markdown]"))
    except StopIteration:
        return []
    cell = []
    for line in lines[start + 1 :]:
        if line.startswith("# %%"):
            break
        cell.append(line[2:] if line.startswith("# ") else line.lstrip("#"))
    while cell and not cell[-1].strip():
        cell.pop()
    return cell


def header_problems(text: str) -> list[str]:
    """What the first markdown cell lacks: the title line, or a field (missing or empty)."""
    cell = first_markdown_cell(text)
    if not cell:
        return ["no markdown cell"]
    problems = []
    body = [line.strip() for line in cell if line.strip()]
    if not body[0].startswith("# ") or len(body[0]) < 3:
        problems.append(f"the first line is not a '# title' line: {body[0]!r}")
    for field in FIELDS:
        tag = f"**{field}:**"
        lines = [line for line in body if line.startswith(tag)]
        if not lines:
            problems.append(f"no line starting with {tag}")
        elif not lines[0][len(tag) :].strip():
            problems.append(f"{tag} is empty")
    return problems


GOOD = """# %% [markdown]
# # 99 · Example
#
# **Lecture:** 1, Introduction
# **Homework:** none
# **Prerequisites:** none
# **You will be able to:** read a header
# **Run time:** about 1 s on a 2-core x86-64 machine
#
# Text.

# %%
print(1)
"""


def test_the_checker_accepts_a_full_header():
    assert header_problems(GOOD) == []


@pytest.mark.parametrize("field", FIELDS)
def test_the_checker_names_a_missing_or_empty_field(field):
    dropped = "\n".join(line for line in GOOD.splitlines() if f"**{field}:**" not in line)
    assert header_problems(dropped) == [f"no line starting with **{field}:**"]
    emptied = GOOD.replace(
        next(line for line in GOOD.splitlines() if f"**{field}:**" in line), f"# **{field}:**"
    )
    assert header_problems(emptied) == [f"**{field}:** is empty"]


def test_the_checker_reads_only_the_first_markdown_cell():
    fields = "\n".join(line for line in GOOD.splitlines() if "**" in line)
    late = "# %% [markdown]\n# # 99 · Example\n\n# %%\nx = 1\n\n# %% [markdown]\n" + fields
    assert len(header_problems(late)) == len(FIELDS)


def test_the_checker_wants_a_title_first():
    assert header_problems(GOOD.replace("# # 99 · Example", "# 99 · Example"))[0].startswith(
        "the first line is not"
    )


def test_there_are_notebooks():
    assert SOURCES, "no notebooks/NN_*.py sources found"


@pytest.mark.parametrize("py", SOURCES, ids=[p.stem for p in SOURCES])
def test_notebook_has_the_header_fields(py):
    problems = header_problems(py.read_text(encoding="utf-8"))
    assert not problems, f"{py.name}: first markdown cell: " + "; ".join(problems)


# ---- student mode (NEEDLE_IMPL): companion-only cells ---
STUDENT_MODE = "**Student mode:**"


def code_cells(text: str) -> list[list[str]]:
    """The source lines of each code cell (``# %%`` without ``[markdown]``) of a percent script."""
    cells, current = [], None
    for line in text.splitlines():
        if line.startswith("# %%"):
            current = None if "[markdown]" in line else []
            if current is not None:
                cells.append(current)
        elif current is not None:
            current.append(line)
    return cells


def student_mode_problems(text: str) -> list[str]:
    """A notebook with ``# companion-only:`` cells must say so in its header (a Student mode line)
    and call ``lecture.setup()`` in its first code cell (after the Colab set-up cell); one
    without must do neither."""
    from companion.colab import SETUP_MARK
    from companion.lecture import companion_only_reason

    cells = [c for c in code_cells(text) if not (c and c[0].startswith(SETUP_MARK))]
    marked = sum(companion_only_reason(c) is not None for c in cells)
    header = [line.strip() for line in first_markdown_cell(text)]
    claims = any(line.startswith(STUDENT_MODE) for line in header)
    calls = bool(cells) and "lecture.setup()" in "\n".join(cells[0])
    if marked and not claims:
        return [f"{marked} companion-only cells but no line starting with {STUDENT_MODE}"]
    if marked and not calls:
        return [
            f"{marked} companion-only cells but the first code cell does not call lecture.setup()"
        ]
    if not marked and (claims or calls):
        return [
            f"no companion-only cells, yet the notebook has a {STUDENT_MODE} line or calls "
            "lecture.setup()"
        ]
    return []


MARKED = GOOD.replace(
    "# Text.", "# Text.\n\n# %%\nfrom companion import lecture\nlecture.setup()"
).replace("print(1)", "# companion-only: create_graph=True\nprint(1)")
CLAIM = "# **Student mode:** with NEEDLE_IMPL, cells marked companion-only are skipped\n"


def test_marked_cells_need_the_student_mode_line_and_setup():
    with_line = MARKED.replace("#\n# Text.", CLAIM + "#\n# Text.")
    assert student_mode_problems(with_line) == []
    assert student_mode_problems(MARKED) == [
        f"1 companion-only cells but no line starting with {STUDENT_MODE}"
    ]
    no_setup = with_line.replace("lecture.setup()", "pass")
    assert "does not call lecture.setup()" in student_mode_problems(no_setup)[0]


def test_a_notebook_without_marked_cells_must_not_claim_student_mode():
    assert student_mode_problems(GOOD) == []
    claimed = GOOD.replace("#\n# Text.", CLAIM + "#\n# Text.")
    assert "no companion-only cells" in student_mode_problems(claimed)[0]


@pytest.mark.parametrize("py", SOURCES, ids=[p.stem for p in SOURCES])
def test_notebook_says_which_cells_student_mode_skips(py):
    problems = student_mode_problems(py.read_text(encoding="utf-8"))
    assert not problems, f"{py.name}: " + "; ".join(problems)
