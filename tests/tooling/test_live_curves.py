"""companion.viz.LiveCurves: curves a training loop extends, redrawn in place in Jupyter.

The notebook path is checked twice: with a fake display (a fake clock decides when redraws are
due) and once in a real Jupyter kernel (nbclient), whose saved cell must hold one PNG output.
"""

import base64

import numpy as np
import pytest

from companion import viz
from companion.viz import LiveCurves, figure_png


class FakeHandle:
    def __init__(self, log):
        self.log = log


@pytest.fixture
def fake_notebook(monkeypatch):
    """A display that records ('show' | 'update', png) and a clock the test moves."""
    log, clock = [], [0.0]

    def show(png):
        log.append(("show", png))
        return FakeHandle(log)

    def update(handle, png):
        handle.log.append(("update", png))

    monkeypatch.setattr(viz, "notebook_display", show)
    monkeypatch.setattr(viz, "_update_display", update)
    monkeypatch.setattr(viz.time, "monotonic", lambda: clock[0])
    return log, clock


def test_outside_a_notebook_nothing_is_shown_and_the_points_are_kept(capsys):
    curves = LiveCurves({"loss": ["train", "test"]}, min_interval=0)
    for epoch in range(3):
        curves.add(epoch, train=1.0 / (epoch + 1), test=2.0 / (epoch + 1))
    fig = curves.close()
    assert capsys.readouterr() == ("", "")
    assert curves.redraws == 0
    assert curves.data["train"] == ([0.0, 1.0, 2.0], [1.0, 0.5, 1.0 / 3])
    (ax,) = fig.axes
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert sorted(lines) == ["test", "train"]
    np.testing.assert_allclose(lines["test"].get_ydata(), [2.0, 1.0, 2.0 / 3])
    assert ax.get_ylabel() == "loss"


def test_redraws_are_throttled_and_close_leaves_the_final_figure(fake_notebook):
    log, clock = fake_notebook
    curves = LiveCurves(min_interval=1.0)
    for t, (x, value) in zip([0.0, 0.3, 0.6, 1.2, 1.5], enumerate([5, 4, 3, 2, 1])):
        clock[0] = t
        curves.add(x, loss=value)
    # drawn at t = 0 (the output is made) and t = 1.2 (a second has passed); not at 0.3, 0.6, 1.5
    assert [kind for kind, _ in log] == ["show", "update"]
    final = curves.close()
    assert [kind for kind, _ in log] == ["show", "update", "update"]
    assert curves.redraws == 3
    # the last image is the whole curve, the same bytes as drawing the final figure again
    assert log[-1][1] == figure_png(final) == figure_png(curves.figure())
    assert log[-1][1] != log[1][1]
    np.testing.assert_array_equal(final.axes[0].get_lines()[0].get_ydata(), [5, 4, 3, 2, 1])


def test_panels_are_side_by_side_and_unlisted_curves_get_their_own(fake_notebook):
    curves = LiveCurves({"loss": ["train loss", "test loss"]}, logy=["loss"], min_interval=0)
    curves.add(1, {"train loss": 0.5, "test loss": 0.7}, lr=0.1)
    fig = curves.close()
    assert [ax.get_ylabel() for ax in fig.axes] == ["loss", ""]
    assert fig.axes[0].get_yscale() == "log"
    assert [line.get_label() for line in fig.axes[1].get_lines()] == ["lr"]


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="min_interval"):
        LiveCurves(min_interval=-1)
    with pytest.raises(ValueError, match="'a' is in two panels"):
        LiveCurves({"p": ["a"], "q": ["a"]})
    with pytest.raises(TypeError, match="must list curve names"):
        LiveCurves({"p": "abc"})
    with pytest.raises(ValueError, match="unknown panels"):
        LiveCurves({"p": ["a"]}, logy=["q"])
    curves = LiveCurves()
    with pytest.raises(TypeError, match="curve 'loss' must be a number"):
        curves.add(0, loss="high")
    with pytest.raises(ValueError, match="at least one curve"):
        curves.add(0)
    curves.close()
    with pytest.raises(RuntimeError, match="after close"):
        curves.add(1, loss=1.0)


def test_in_a_real_kernel_the_cell_keeps_one_png_output():
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    code = (
        "from companion.viz import LiveCurves\n"
        "with LiveCurves(min_interval=0) as curves:\n"
        "    for i in range(4):\n"
        "        curves.add(i, loss=1 / (i + 1))\n"
        "print('done', curves.redraws)"
    )
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    outputs = nb.cells[0].outputs
    images = [o for o in outputs if o.output_type == "display_data"]
    assert len(images) == 1 and "image/png" in images[0].data
    # the image left in the cell is the final figure (the updates replaced the first one)
    offline = LiveCurves(min_interval=0)
    for i in range(4):
        offline.add(i, loss=1 / (i + 1))
    assert base64.b64decode(images[0].data["image/png"]) == figure_png(offline.close())
    texts = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert texts == "done 5\n"  # 4 points at min_interval=0 and the final draw
