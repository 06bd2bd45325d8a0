"""Every notebooks/NN_*.py (the source) must match its executed .ipynb cell for cell.

nbval only reads the .ipynb, so an edit to the .py that was never regenerated
(`make notebooks`) would otherwise pass unnoticed. The check compares each cell's type,
source and tags, independent of file times.
"""

from pathlib import Path

import jupytext
import nbformat
import pytest

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
SOURCES = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.py"))


def _cells(nb) -> list[tuple[str, str, tuple[str, ...]]]:
    return [
        (cell.cell_type, cell.source.strip(), tuple(sorted(cell.metadata.get("tags", []))))
        for cell in nb.cells
    ]


def pairing_problems(py: Path, ipynb: Path) -> list[str]:
    """Human-readable differences between a percent-format source and its notebook."""
    if not ipynb.exists():
        return [f"{ipynb.name} is missing: run `make notebooks`"]
    src = _cells(jupytext.read(py))
    out = nbformat.read(ipynb, as_version=4)
    problems = []
    nb = _cells(out)
    if len(src) != len(nb):
        problems.append(f"{py.name} has {len(src)} cells but {ipynb.name} has {len(nb)}")
    for i, (a, b) in enumerate(zip(src, nb)):
        if a != b:
            what = "type" if a[0] != b[0] else "source" if a[1] != b[1] else "tags"
            problems.append(f"cell {i} differs in {what}: {a[1][:60]!r} vs {b[1][:60]!r}")
    unexecuted = [
        i
        for i, cell in enumerate(out.cells)
        if cell.cell_type == "code"
        and cell.source.strip()
        and cell.execution_count is None
        and "skip-execution" not in cell.metadata.get("tags", [])
    ]
    if unexecuted:
        problems.append(
            f"{ipynb.name} has unexecuted code cells {unexecuted[:5]}: run `make notebooks`"
        )
    return problems


def test_there_are_notebooks():
    assert SOURCES, "no notebooks/NN_*.py sources found"


@pytest.mark.parametrize("py", SOURCES, ids=[p.stem for p in SOURCES])
def test_notebook_is_paired_and_executed(py):
    problems = pairing_problems(py, py.with_suffix(".ipynb"))
    assert not problems, f"{py.name} and its .ipynb are out of step:\n" + "\n".join(problems)


def test_every_ipynb_has_a_source():
    orphans = [
        nb.name for nb in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb") if not nb.with_suffix(".py").exists()
    ]
    assert not orphans, f"notebooks without a .py source: {orphans}"


def test_check_rejects_an_edited_source(tmp_path):
    """The gate itself: editing a cell, or its tags, in the .py without regenerating fails."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# Title"), nbformat.v4.new_code_cell("x = 1\nx")]
    nb.cells[1].execution_count = 1
    py, ipynb = tmp_path / "01_demo.py", tmp_path / "01_demo.ipynb"
    nbformat.write(nb, ipynb)
    jupytext.write(nb, py, fmt="py:percent")
    assert pairing_problems(py, ipynb) == []

    py.write_text(py.read_text().replace("x = 1", "x = 2"))
    assert any("source" in p for p in pairing_problems(py, ipynb))

    jupytext.write(nb, py, fmt="py:percent")
    text = py.read_text().replace("# %%\nx = 1", '# %% tags=["nbval-ignore-output"]\nx = 1')
    py.write_text(text)
    assert any("tags" in p for p in pairing_problems(py, ipynb))


def test_check_rejects_an_unexecuted_notebook(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("1 + 1")]
    py, ipynb = tmp_path / "02_demo.py", tmp_path / "02_demo.ipynb"
    nbformat.write(nb, ipynb)
    jupytext.write(nb, py, fmt="py:percent")
    assert any("unexecuted" in p for p in pairing_problems(py, ipynb))
