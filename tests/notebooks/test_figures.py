"""figures/ holds exactly the images the committed notebooks show.

``save_figure`` shows a figure as a PNG output tagged with its name, and ``make figures`` copies
those outputs into figures/. These tests compare the committed PNGs with the committed
notebooks' outputs byte for byte, check that the comparison catches a planted difference, and
run ``save_figure`` in a real kernel.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from companion.viz import FIGURE_KEY, figure_mismatches, notebook_figures, write_figures

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


def tiny_notebook(path: Path, figures: dict[str, bytes]) -> Path:
    """An executed-notebook JSON whose outputs carry ``figures`` as save_figure tags them."""
    outputs = [
        {
            "output_type": "display_data",
            "data": {"image/png": base64.b64encode(png).decode()},
            "metadata": {FIGURE_KEY: name},
        }
        for name, png in figures.items()
    ]
    cell = {"cell_type": "code", "source": "", "metadata": {}, "outputs": outputs}
    path.write_text(json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4}))
    return path


def test_committed_figures_are_the_notebooks_images():
    assert figure_mismatches(NOTEBOOKS, ROOT / "figures") == []


def test_a_planted_difference_is_named(tmp_path):
    notebook = tiny_notebook(tmp_path / "01_x.ipynb", {"curve": PNG, "map": PNG})
    figures = tmp_path / "figures"
    assert write_figures([notebook], figures) == ["curve", "map"]
    assert figure_mismatches([notebook], figures) == []
    (figures / "curve.png").write_bytes(PNG + b"\0")
    (figures / "map.png").unlink()
    (figures / "orphan.png").write_bytes(PNG)
    assert figure_mismatches([notebook], figures) == [
        "figures/map.png is missing",
        "figures/orphan.png is drawn by no notebook",
        "figures/curve.png differs from the image its notebook shows",
    ]


def test_one_name_in_two_notebooks_is_refused(tmp_path):
    a = tiny_notebook(tmp_path / "01_a.ipynb", {"curve": PNG})
    b = tiny_notebook(tmp_path / "02_b.ipynb", {"curve": PNG})
    with pytest.raises(ValueError, match="'curve' is drawn by both"):
        figure_mismatches([a, b], tmp_path)


def test_save_figure_tags_its_output_in_a_kernel(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            "import matplotlib\nmatplotlib.use('agg')\nimport matplotlib.pyplot as plt\n"
            "from companion.viz import save_figure\n"
            "fig, ax = plt.subplots(figsize=(2, 1.5))\nax.plot([0, 1], [1, 0])\n"
            "png = save_figure(fig, 'line')\nplt.get_fignums()"
        ),
        # a notebook's figure cell ends with the call: it must leave no text result beside the
        # image (the bytes' repr would be compared by nbval and differ between matplotlibs)
        nbformat.v4.new_code_cell(
            "fig, ax = plt.subplots(figsize=(2, 1.5))\nax.plot([0, 1], [0, 1])\n"
            "save_figure(fig, 'rise')"
        ),
    ]
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    path = tmp_path / "01_k.ipynb"
    nbformat.write(nb, path)
    shown = notebook_figures(path)
    assert list(shown) == ["line", "rise"] and shown["line"].startswith(b"\x89PNG")
    result = [o for o in nb.cells[0].outputs if o["output_type"] == "execute_result"]
    assert result[0]["data"]["text/plain"] == "[]"  # closed: not drawn a second time
    assert [o["output_type"] for o in nb.cells[1].outputs] == ["display_data"]
