"""What the committed notebooks show under their cells."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_no_check_cell_shows_a_bare_boolean(path):
    """An exercise check cell prints its verdict; a bare True/False under it (the value of
    the cell's last expression) reads like a second, contradicting verdict."""
    cells = json.loads(path.read_text())["cells"]
    stray = []
    for index, cell in enumerate(cells):
        if cell["cell_type"] != "code" or "check_exercise(" not in "".join(cell["source"]):
            continue
        for output in cell.get("outputs", []):
            text = "".join(output.get("data", {}).get("text/plain", ""))
            if output["output_type"] == "execute_result" and text in ("True", "False"):
                stray.append(index)
    assert not stray, f"check cells {stray} of {path.name} show a bare {text}"
