"""Reading the committed, executed notebooks (``notebooks/NN_*.ipynb``): cells, tags, outputs.

Shared by the notebook gates that compare a cell's source, its committed output and the prose
around it (test_timing_cells.py, test_prose_numbers.py, test_lecture_prose.py).
"""

from __future__ import annotations

import json
from pathlib import Path

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("[0-9][0-9]_*.ipynb"))
IGNORE_OUTPUT = "nbval-ignore-output"


def load_cells(path: Path) -> list[dict]:
    """The cells of an executed notebook, each with its ``source`` joined into one string."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    for cell in cells:
        source = cell.get("source", "")
        cell["source"] = "".join(source) if isinstance(source, list) else source
    return cells


def tags(cell: dict) -> list[str]:
    """The cell's metadata tags."""
    return list(cell.get("metadata", {}).get("tags", []))


def output_text(cell: dict, streams: tuple[str, ...] = ("stdout",)) -> str:
    """What a code cell printed on ``streams`` followed by the text/plain of its results."""
    parts = []
    for output in cell.get("outputs", []):
        kind = output.get("output_type")
        if kind == "stream" and output.get("name") in streams:
            text = output.get("text", "")
        elif kind in ("execute_result", "display_data"):
            text = output.get("data", {}).get("text/plain", "")
        else:
            continue
        parts.append("".join(text) if isinstance(text, list) else text)
    return "".join(parts)


def stdout_lines(cell: dict) -> list[str]:
    """The lines the cell printed on stdout, in order (results and stderr left out)."""
    parts = []
    for output in cell.get("outputs", []):
        if output.get("output_type") == "stream" and output.get("name") == "stdout":
            text = output.get("text", "")
            parts.append("".join(text) if isinstance(text, list) else text)
    return "".join(parts).splitlines()


def write_notebook(path: Path, cells: list[dict]) -> Path:
    """Write a tiny executed-notebook JSON; each cell is ``{"markdown": text}`` or
    ``{"code": source, "stdout": text, "tags": [...]}``."""
    out = []
    for cell in cells:
        if "markdown" in cell:
            out.append({"cell_type": "markdown", "metadata": {}, "source": cell["markdown"]})
            continue
        outputs = []
        if cell.get("stdout"):
            outputs.append({"output_type": "stream", "name": "stdout", "text": cell["stdout"]})
        metadata = {"tags": cell["tags"]} if cell.get("tags") else {}
        out.append(
            {
                "cell_type": "code",
                "metadata": metadata,
                "source": cell["code"],
                "outputs": outputs,
                "execution_count": None,
            }
        )
    path.write_text(json.dumps({"cells": out, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path
