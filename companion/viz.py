"""Figure helpers shared by the lecture notebooks (an extension; not part of the course API).

- ``save_figure``: write ``figures/NAME.png`` when ``make figures`` runs.
- ``LiveCurves``: training curves that a loop extends point by point, redrawn in place in a
  Jupyter notebook and left there as one static figure.
"""
from __future__ import annotations

import io
import math
import os
import time
from pathlib import Path
from typing import Mapping, Sequence

FIGURES_DIR = Path(__file__).resolve().parents[1] / "figures"


def writing_figures() -> bool:
    """True when ``NEEDLE_WRITE_FIGURES=1`` (set by ``make figures``)."""
    return os.environ.get("NEEDLE_WRITE_FIGURES") == "1"


def save_figure(fig, name: str) -> Path | None:
    """Save ``fig`` as ``figures/NAME.png`` when ``make figures`` runs; otherwise do nothing.

    The PNG carries no software/date metadata, so re-running gives byte-identical files on one
    machine. Returns the path written, or None.
    """
    if not writing_figures():
        return None
    FIGURES_DIR.mkdir(exist_ok=True)
    path = FIGURES_DIR / f"{name}.png"
    fig.savefig(path, dpi=110, bbox_inches="tight", metadata={"Software": None})
    return path


def figure_png(fig, dpi: int = 100) -> bytes:
    """``fig`` rendered as PNG bytes with no software/date metadata (the same bytes each time)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    if fig.canvas is None or not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, metadata={"Software": None})
    return buffer.getvalue()


def notebook_display(png: bytes):
    """Show ``png`` as a new output of the running Jupyter cell and return its display handle
    (``handle.update(IPython.display.Image(...))`` replaces it); None outside a Jupyter kernel
    (plain Python, a terminal IPython), where nothing is shown."""
    try:
        from IPython import get_ipython
        from IPython.display import Image, display
    except ImportError:
        return None
    shell = get_ipython()
    if shell is None or getattr(shell, "kernel", None) is None:
        return None
    return display(Image(data=png, format="png"), display_id=True)


def _update_display(handle, png: bytes) -> None:
    from IPython.display import Image
    handle.update(Image(data=png, format="png"))


class LiveCurves:
    """Training curves redrawn in place while a loop runs, in a Jupyter notebook.

    A loop calls ``curves.add(x, train_loss=..., test_error=...)`` (or ``curves.add(x, {"train
    loss": ...})``) once per epoch or step: each keyword is a curve, ``x`` its next abscissa.
    In a Jupyter kernel the figure appears as one output of the cell and is redrawn in place at
    most every ``min_interval`` seconds; ``close()`` (or leaving a ``with`` block) draws the
    final state, so the cell keeps one static PNG (nbval does not compare PNG bytes). Outside a
    notebook nothing is drawn or printed; the points are still recorded (``curves.data``) and
    ``curves.figure()`` draws them on demand (e.g. for ``save_figure``).

    ``panels`` groups curves into side-by-side axes: ``{"loss": ["train", "test"], "error rate":
    ["train error", "test error"]}`` (a curve in no panel gets its own). ``logy`` names the
    panels drawn on a log scale.
    """

    def __init__(self, panels: Mapping[str, Sequence[str]] | None = None, *,
                 xlabel: str = "epoch", title: str | None = None,
                 logy: Sequence[str] = (), min_interval: float = 1.0,
                 panel_size: tuple[float, float] = (4.2, 3.0)) -> None:
        if min_interval < 0 or not math.isfinite(min_interval):
            raise ValueError(f"LiveCurves: min_interval must be a finite number >= 0, got "
                             f"{min_interval!r}")
        self.panels: dict[str, list[str]] = {}
        self._panel_of: dict[str, str] = {}
        self._own_panels: set[str] = set()
        for panel, names in (panels or {}).items():
            if isinstance(names, str):
                raise TypeError(f"LiveCurves: panel {panel!r} must list curve names, got the "
                                f"string {names!r}")
            for name in names:
                if name in self._panel_of:
                    raise ValueError(f"LiveCurves: curve {name!r} is in two panels")
                self._panel_of[name] = panel
            self.panels[panel] = list(names)
        unknown = set(logy) - set(self.panels)
        if unknown:
            raise ValueError(f"LiveCurves: logy names unknown panels {sorted(unknown)}")
        self.xlabel, self.title, self.logy = xlabel, title, tuple(logy)
        self.min_interval, self.panel_size = min_interval, panel_size
        self.data: dict[str, tuple[list[float], list[float]]] = {}
        self._handle = None
        self._last_draw = -math.inf
        self._closed = False
        self.redraws = 0  # how many times the figure was drawn into the notebook

    def add(self, x: float, values: Mapping[str, float] | None = None, /,
            **named: float) -> None:
        """Append the point (x, value) to each named curve, then redraw if enough time passed."""
        if self._closed:
            raise RuntimeError("LiveCurves.add after close(): make a new LiveCurves")
        points = {**(values or {}), **named}
        if not points:
            raise ValueError("LiveCurves.add needs at least one curve value")
        for name, value in points.items():
            try:
                value = float(value)
            except (TypeError, ValueError):
                raise TypeError(f"LiveCurves.add: the value of curve {name!r} must be a number, "
                                f"got {type(value).__name__}") from None
            if name not in self._panel_of:  # a curve of its own, labelled by its legend
                self._panel_of[name] = name
                self.panels[name] = [name]
                self._own_panels.add(name)
            xs, ys = self.data.setdefault(name, ([], []))
            xs.append(float(x))
            ys.append(value)
        if time.monotonic() - self._last_draw >= self.min_interval:
            self._redraw()

    def figure(self):
        """A matplotlib Figure of the curves so far (one axes per panel that has points)."""
        from matplotlib.figure import Figure
        panels = [(p, [n for n in names if n in self.data]) for p, names in self.panels.items()]
        panels = [(p, names) for p, names in panels if names] or [("", [])]
        width, height = self.panel_size
        fig = Figure(figsize=(width * len(panels), height), layout="constrained")
        for ax, (panel, names) in zip(fig.subplots(1, len(panels), squeeze=False)[0], panels):
            for name in names:
                xs, ys = self.data[name]
                ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, label=name)
            ax.set_xlabel(self.xlabel)
            if panel not in self._own_panels:
                ax.set_ylabel(panel)
            if panel in self.logy:
                ax.set_yscale("log")
            if names:
                ax.legend(fontsize="small")
            ax.grid(alpha=0.3)
        if self.title:
            fig.suptitle(self.title)
        return fig

    def _redraw(self) -> None:
        """Draw the current figure into the notebook output (first time: create the output)."""
        self._last_draw = time.monotonic()
        if self._handle is None:
            png = figure_png(self.figure())
            self._handle = notebook_display(png)
            if self._handle is None:
                self._last_draw = math.inf  # not in a notebook: never try again
                return
        else:
            _update_display(self._handle, figure_png(self.figure()))
        self.redraws += 1

    def close(self):
        """Draw the final curves into the notebook (if any output was made) and return the
        final Figure. Further ``add`` calls are refused."""
        fig = self.figure()
        if not self._closed and self._handle is not None:
            _update_display(self._handle, figure_png(fig))
            self.redraws += 1
        self._closed = True
        return fig

    def __enter__(self) -> "LiveCurves":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

