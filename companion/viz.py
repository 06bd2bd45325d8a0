"""Figure helpers shared by the lecture notebooks (an extension; not part of the course API).

- ``save_figure``: show a figure in the notebook as a PNG output tagged ``figures/NAME.png``;
  ``make figures`` (``python -m companion.viz``) copies the tagged outputs of the committed
  notebooks into ``figures/``, so that folder holds exactly the images the notebooks show.
- ``LiveCurves``: training curves that a loop extends point by point, redrawn in place in a
  Jupyter notebook and left there as one static figure.
- ``draw_graph``: a needle computational graph (forward, and the nodes ``backward()`` added),
  laid out in layers by depth and drawn with matplotlib (no Graphviz needed).
"""

from __future__ import annotations

import io
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

FIGURES_DIR = Path(__file__).resolve().parents[1] / "figures"


#: The output-metadata key under which ``save_figure`` records a figure's name.
FIGURE_KEY = "companion_figure"


def save_figure(fig, name: str) -> None:
    """Show ``fig`` as one PNG output of the running notebook cell, tagged with ``name``, and
    close it.

    ``make figures`` writes each tagged output of the committed notebooks to
    ``figures/NAME.png`` byte for byte (``write_figures``). The PNG carries no software/date
    metadata. Outside a Jupyter kernel nothing is shown. It returns None: a cell ending with
    ``save_figure(...)`` would otherwise also show the returned bytes as its text result, which
    nbval compares and which differ between matplotlib versions.
    """
    import matplotlib.pyplot as plt

    if not name or not all(c.isalnum() or c in "_-" for c in name):
        raise ValueError(f"save_figure: name must be letters, digits, _ or -, got {name!r}")
    png = figure_png(fig, dpi=110, tight=True)
    notebook_display(png, metadata={FIGURE_KEY: name})
    plt.close(fig)


def notebook_figures(path: str | Path) -> dict[str, bytes]:
    """The figures ``save_figure`` left in the executed notebook ``path``: name -> PNG bytes."""
    import base64
    import json

    found: dict[str, bytes] = {}
    cells = json.loads(Path(path).read_text(encoding="utf-8"))["cells"]
    for cell in cells:
        for output in cell.get("outputs", []):
            name = output.get("metadata", {}).get(FIGURE_KEY)
            if name is None:
                continue
            if name in found:
                raise ValueError(f"{path}: two outputs are tagged as figure {name!r}")
            found[name] = base64.b64decode(output["data"]["image/png"])
    return found


def all_notebook_figures(notebooks: Sequence[str | Path]) -> dict[str, bytes]:
    """``notebook_figures`` of every notebook; ValueError when two notebooks use one name."""
    found: dict[str, bytes] = {}
    owner: dict[str, Path] = {}
    for path in notebooks:
        for name, png in notebook_figures(path).items():
            if name in found:
                raise ValueError(f"figure {name!r} is drawn by both {owner[name]} and {path}")
            found[name], owner[name] = png, Path(path)
    return found


def figure_mismatches(notebooks: Sequence[str | Path], figures_dir: str | Path) -> list[str]:
    """What differs between ``figures_dir/*.png`` and the notebooks' tagged figures (a line
    each: missing, not drawn by any notebook, or other bytes); empty when they agree."""
    shown = all_notebook_figures(notebooks)
    files = {p.stem: p for p in Path(figures_dir).glob("*.png")}
    problems = [f"figures/{n}.png is missing" for n in sorted(set(shown) - set(files))]
    problems += [
        f"figures/{n}.png is drawn by no notebook" for n in sorted(set(files) - set(shown))
    ]
    problems += [
        f"figures/{n}.png differs from the image its notebook shows"
        for n in sorted(set(files) & set(shown))
        if files[n].read_bytes() != shown[n]
    ]
    return problems


def write_figures(
    notebooks: Sequence[str | Path], figures_dir: str | Path = FIGURES_DIR
) -> list[str]:
    """Write each tagged figure of ``notebooks`` to ``figures_dir/NAME.png`` (PNGs that no
    notebook draws are left for ``figure_mismatches`` to name); the names written."""
    shown = all_notebook_figures(notebooks)
    out = Path(figures_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, png in shown.items():
        path = out / f"{name}.png"
        if not path.exists() or path.read_bytes() != png:
            path.write_bytes(png)
    return sorted(shown)


def figure_png(fig, dpi: int = 100, tight: bool = False) -> bytes:
    """``fig`` rendered as PNG bytes with no software/date metadata (the same bytes each time);
    ``tight`` crops it to what is drawn."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    if fig.canvas is None or not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)
    buffer = io.BytesIO()
    extra = {"bbox_inches": "tight"} if tight else {}
    fig.savefig(buffer, format="png", dpi=dpi, metadata={"Software": None}, **extra)
    return buffer.getvalue()


def notebook_display(png: bytes, metadata: dict | None = None):
    """Show ``png`` as a new output of the running Jupyter cell (with ``metadata`` on the
    output) and return its display handle (``handle.update(IPython.display.Image(...))``
    replaces it); None outside a Jupyter kernel (plain Python, a terminal IPython), where
    nothing is shown."""
    try:
        from IPython import get_ipython
        from IPython.display import Image, display
    except ImportError:
        return None
    shell = get_ipython()
    if shell is None or getattr(shell, "kernel", None) is None:
        return None
    return display(Image(data=png, format="png"), display_id=True, metadata=metadata)


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

    def __init__(
        self,
        panels: Mapping[str, Sequence[str]] | None = None,
        *,
        xlabel: str = "epoch",
        title: str | None = None,
        logy: Sequence[str] = (),
        min_interval: float = 1.0,
        panel_size: tuple[float, float] = (4.2, 3.0),
    ) -> None:
        if min_interval < 0 or not math.isfinite(min_interval):
            raise ValueError(
                f"LiveCurves: min_interval must be a finite number >= 0, got {min_interval!r}"
            )
        self.panels: dict[str, list[str]] = {}
        self._panel_of: dict[str, str] = {}
        self._own_panels: set[str] = set()
        for panel, names in (panels or {}).items():
            if isinstance(names, str):
                raise TypeError(
                    f"LiveCurves: panel {panel!r} must list curve names, got the string {names!r}"
                )
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

    def add(self, x: float, values: Mapping[str, float] | None = None, /, **named: float) -> None:
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
                raise TypeError(
                    f"LiveCurves.add: the value of curve {name!r} must be a number, "
                    f"got {type(value).__name__}"
                ) from None
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


# ---- computational graphs --------------------------------------------------------------------
NODE_KINDS = {  # kind -> (fill colour, what the legend says)
    "constant": ("#e6e6e6", "constant leaf"),
    "parameter": ("#ffd866", "leaf with requires_grad"),
    "forward": ("#bcdcff", "forward op"),
    "backward": ("#ffc7c7", "op added by backward()"),
}
KEPT_GRAD_COLOUR = "#c00000"


@dataclass(frozen=True)
class DrawnNode:
    """One node of a drawn graph: its label parts, its kind and its place in the layout."""

    index: int  # position in GraphLayout.nodes
    name: str  # the name given to draw_graph, else v1, v2, ... in drawing order
    op: str | None  # the op and its parameters, e.g. "MulScalar(2)"; None for a leaf
    shape: str  # "(3, 4)"; "not computed" for a lazy node without a value yet
    kind: str  # a key of NODE_KINDS
    grad_of: tuple[str, ...]  # the names of the nodes whose .grad this node is (kept gradients)
    depth: int  # column: leaves one left of their first consumer, ops 1 + inputs
    row: int  # position inside its column, from the top


@dataclass(frozen=True)
class GraphLayout:
    """A laid-out needle graph: ``nodes``, ``edges`` (one ``(input, consumer)`` pair of node
    indices per entry of a node's ``inputs``, so ``x * x`` gives two) and ``grad_links`` (``(node,
    its .grad)`` pairs: not edges of the graph; the gradient's box is outlined in red and
    labelled ``x.grad``). Shown inline in Jupyter as a PNG."""

    nodes: tuple[DrawnNode, ...]
    edges: tuple[tuple[int, int], ...]
    grad_links: tuple[tuple[int, int], ...]
    bends: tuple[tuple[tuple[int, int], ...], ...]  # per edge: the (depth, row) slots it passes
    heights: tuple[int, ...]  # per column: its slots (nodes and edges passing through)
    title: str | None = None

    def __repr__(self) -> str:
        kinds = ", ".join(f"{sum(n.kind == k for n in self.nodes)} {k}" for k in NODE_KINDS)
        return (
            f"GraphLayout({len(self.nodes)} nodes: {kinds}; {len(self.edges)} edges; "
            f"{len(self.grad_links)} kept gradients)"
        )

    def _repr_png_(self) -> bytes:
        return figure_png(self.figure(), dpi=110)

    def figure(self):
        """The graph as a matplotlib Figure: inputs on the left, arrows from input to consumer."""
        from matplotlib.figure import Figure

        dx, dy, width, height, inch = 2.3, 1.05, 1.8, 0.78, 0.8
        columns, rows = len(self.heights), max(self.heights)

        def place(depth: int, row: int) -> tuple[float, float]:
            return depth * dx, ((self.heights[depth] - 1) / 2 - row) * dy

        at = [place(n.depth, n.row) for n in self.nodes]
        x_lim = (-width / 2 - 0.15, (columns - 1) * dx + width / 2 + 0.15)
        y_lim = (
            -(rows - 1) / 2 * dy - height / 2 - 0.9,
            (rows - 1) / 2 * dy + height / 2 + (0.6 if self.title else 0.15),
        )
        fig = Figure(figsize=((x_lim[1] - x_lim[0]) * inch, (y_lim[1] - y_lim[0]) * inch))
        ax = fig.add_axes((0, 0, 1, 1))
        ax.set_xlim(*x_lim)
        ax.set_ylim(*y_lim)
        ax.axis("off")
        self._draw_nodes(ax, at, width, height)
        self._draw_edges(ax, at, place, width)
        self._draw_legend(ax, x_lim, y_lim)
        return fig

    def _draw_nodes(self, ax, at, width: float, height: float) -> None:
        """One rounded box a node (its kind's colour, a thick edge for a kept gradient)."""
        from matplotlib.patches import FancyBboxPatch

        for node, (x, y) in zip(self.nodes, at):
            kept = bool(node.grad_of)
            box = FancyBboxPatch(
                (x - width / 2, y - height / 2),
                width,
                height,
                boxstyle="round,pad=0,rounding_size=0.12",
                facecolor=NODE_KINDS[node.kind][0],
                linewidth=2.2 if kept else 0.8,
                edgecolor=KEPT_GRAD_COLOUR if kept else "#444444",
                gid="node",
            )
            ax.add_patch(box)
            name = " = ".join([node.name] + [f"{owner}.grad" for owner in node.grad_of])
            what = (
                node.op
                if node.op is not None
                else ("requires_grad" if node.kind == "parameter" else "constant")
            )
            text = f"{name}\n{what}\n{node.shape}"
            longest = max(len(line) for line in text.splitlines())
            ax.text(
                x,
                y,
                text,
                ha="center",
                va="center",
                linespacing=1.25,
                fontsize=min(7.0, 7.0 * 24 / longest),
                family="DejaVu Sans",
            )

    def _draw_edges(self, ax, at, place, width: float) -> None:
        """One arrow an edge: straight between adjacent columns, else an S-curve through
        the free slots of the columns it crosses."""
        from matplotlib.patches import FancyArrowPatch
        from matplotlib.path import Path as CurvePath

        seen: dict = {}
        style = dict(
            arrowstyle="-|>",
            mutation_scale=9,
            linewidth=0.9,
            color="#333333",
            shrinkA=0,
            shrinkB=0,
            gid="edge",
        )
        for (source, target), bends in zip(self.edges, self.bends):
            (x0, y0), (x1, y1) = at[source], at[target]
            if not bends:  # adjacent columns; a repeated edge (x * x) bends away from the first
                k = seen[source, target] = seen.get((source, target), -1) + 1
                ax.add_patch(
                    FancyArrowPatch(
                        (x0 + width / 2, y0),
                        (x1 - width / 2, y1),
                        connectionstyle=f"arc3,rad={0.25 * k}",
                        **style,
                    )
                )
                continue
            # through the free slots of the columns it crosses, as smooth S-curves between them
            points = [(x0 + width / 2, y0)]
            for x, y in (place(*slot) for slot in bends):
                points += [(x - width / 2, y), (x + width / 2, y)]
            points.append((x1 - width / 2, y1))
            vertices, codes = [points[0]], [CurvePath.MOVETO]
            for i in range(0, len(points) - 1, 2):
                (xa, ya), (xb, yb) = points[i], points[i + 1]
                middle = (xa + xb) / 2
                vertices += [(middle, ya), (middle, yb), (xb, yb)]
                codes += [CurvePath.CURVE4] * 3
                if i + 2 < len(points):
                    vertices.append(points[i + 2])
                    codes.append(CurvePath.LINETO)
            ax.add_patch(FancyArrowPatch(path=CurvePath(vertices, codes), **style))

    def _draw_legend(self, ax, x_lim, y_lim) -> None:
        """The legend of the node kinds drawn (and kept gradients), and the title."""
        from matplotlib.patches import Patch

        handles = [
            Patch(facecolor=colour, edgecolor="#444444", label=label)
            for kind, (colour, label) in NODE_KINDS.items()
            if any(n.kind == kind for n in self.nodes)
        ]
        if self.grad_links:
            handles.append(
                Patch(
                    facecolor="white",
                    edgecolor=KEPT_GRAD_COLOUR,
                    linewidth=2.2,
                    label="kept gradient (.grad)",
                )
            )
        ax.legend(
            handles=handles,
            loc="lower center",
            ncol=len(handles),
            fontsize=7,
            frameon=False,
            bbox_to_anchor=(0.5, 0.0),
        )
        if self.title:
            ax.text(
                sum(x_lim) / 2, y_lim[1] - 0.25, self.title, ha="center", va="center", fontsize=9
            )


def _op_label(op) -> str:
    """The op's class name and its scalar parameters, e.g. ``MulScalar(2)``, ``Summation((1,))``."""
    params = []
    for key, value in vars(op).items():
        if key.startswith("_") or isinstance(value, bool):
            continue
        if isinstance(value, (int, float)):
            params.append(f"{value:g}")
        elif isinstance(value, (str, tuple)) and len(str(value)) <= 16:
            params.append(str(value))
    label = type(op).__name__ + (f"({', '.join(params)})" if params else "")
    return label if len(label) <= 30 else label[:29] + "…"


def _shape_label(value) -> str:
    """The node's shape from its computed array only (drawing never computes a lazy node)."""
    data = value.cached_data
    if data is None:
        return "not computed"
    if isinstance(data, tuple):
        return "tuple: " + ", ".join(str(tuple(a.shape)) for a in data)
    return str(tuple(data.shape))


def draw_graph(
    *outputs,
    names: Mapping[str, object] | None = None,
    grads: bool | Mapping[object, object] = True,
    title: str | None = None,
) -> GraphLayout:
    """Lay out the graph that produced ``outputs`` (needle Tensors or TensorTuples).

    The forward graph is every node reachable through ``inputs``. With ``grads`` (default), each
    of its nodes whose ``.grad`` is set adds that gradient and everything it reaches: after a
    default ``backward()`` this is the backward pass's extension of the graph, whose inputs lead
    back into the forward nodes. ``grads`` may instead map forward nodes to gradient nodes kept
    elsewhere (``{W1: dW1}``); ``grads=False`` draws the forward graph alone. ``names`` maps a
    label to a node (``{"x1": x1}``, matplotlib's ``$...$`` math allowed); the other nodes are
    called v1, v2, ... in order. Nothing is computed: a lazy node shows "not computed".
    Returns a GraphLayout (drawn inline in Jupyter; ``.figure()`` gives the matplotlib Figure).
    """
    from needle.autograd import Value

    if not outputs:
        raise ValueError("draw_graph needs at least one output node")
    for out in outputs:
        if not isinstance(out, Value):
            raise TypeError(
                f"draw_graph draws needle Tensors/TensorTuples, got {type(out).__name__}"
            )
    order, in_forward, kept = _graph_nodes(outputs, grads)
    index = {id(v): i for i, v in enumerate(order)}
    given = _given_names(names, index)
    edges = tuple((index[id(x)], index[id(v)]) for v in order for x in v.inputs)
    depth = _depths(order, index, edges)
    owners: dict[int, list[int]] = {}  # gradient node -> the nodes it is the .grad of
    for n, g in kept:
        owners.setdefault(index[id(g)], []).append(index[id(n)])
    taken = set(given.values())
    auto = (f"v{k}" for k in range(1, len(order) + len(taken) + 1) if f"v{k}" not in taken)
    labels = [given.get(id(v)) or next(auto) for v in order]
    rows, bends, heights = _slots(depth, edges)
    nodes = []
    for i, v in enumerate(order):
        if v.op is None:
            kind = "parameter" if v.requires_grad else "constant"
        else:
            kind = "forward" if id(v) in in_forward else "backward"
        nodes.append(
            DrawnNode(
                i,
                labels[i],
                None if v.op is None else _op_label(v.op),
                _shape_label(v),
                kind,
                tuple(labels[o] for o in owners.get(i, ())),
                depth[i],
                rows[i],
            )
        )
    links = tuple((index[id(n)], index[id(g)]) for n, g in kept)
    return GraphLayout(tuple(nodes), edges, links, bends, heights, title)


def _graph_nodes(outputs, grads) -> tuple[list, set, list]:
    """The nodes drawn, forward graph first (topological order), then each kept gradient's
    graph; the ids of the forward nodes; the (node, gradient) pairs kept."""
    from needle.autograd import Value, find_topo_sort

    forward = find_topo_sort(list(outputs))
    in_forward = {id(v) for v in forward}
    order, seen = list(forward), set(in_forward)
    kept = []  # (node, its gradient)
    if isinstance(grads, Mapping):
        for node, grad in grads.items():
            if not isinstance(node, Value) or not isinstance(grad, Value):
                raise TypeError(
                    "draw_graph: grads maps needle nodes to needle nodes, got "
                    f"{type(node).__name__} -> {type(grad).__name__}"
                )
            if id(node) not in in_forward:
                raise ValueError("draw_graph: a key of grads is not a node of the forward graph")
            kept.append((node, grad))
    elif grads:
        kept = [(node, node.grad) for node in forward if isinstance(node.grad, Value)]
    for _, grad in kept:
        for v in find_topo_sort([grad]):
            if id(v) not in seen:
                seen.add(id(v))
                order.append(v)
    return order, in_forward, kept


def _given_names(names: Mapping[str, object] | None, index: dict) -> dict:
    """id of a node -> the label ``names`` gives it, after checking each is a drawn node."""
    from needle.autograd import Value

    given = {}
    for label, value in (names or {}).items():
        if not isinstance(value, Value):
            raise TypeError(
                f"draw_graph: names[{label!r}] is a {type(value).__name__}, not a needle node"
            )
        if id(value) not in index:
            raise ValueError(f"draw_graph: names[{label!r}] is not a node of this graph")
        given[id(value)] = label
    return given


def _depths(order: list, index: dict, edges) -> list[int]:
    """Column of each node: ops one right of their deepest input; leaves one left of their
    first consumer."""
    depth = [0] * len(order)
    for i, v in enumerate(order):  # order is topological: inputs come first
        if v.inputs:
            depth[i] = 1 + max(depth[index[id(x)]] for x in v.inputs)
    consumers: dict[int, list[int]] = {}
    for source, target in edges:
        consumers.setdefault(source, []).append(target)
    for i, v in enumerate(order):
        if not v.inputs and i in consumers:
            depth[i] = max(0, min(depth[t] for t in consumers[i]) - 1)
    return depth


def _slots(depth: list[int], edges) -> tuple:
    """Rows of the nodes, each edge's bends and each column's height. An edge across several
    columns passes through a slot of each column between (a virtual node), so that the row
    ordering keeps it clear of the boxes."""
    slot_depth, chains, segments = list(depth), [], []
    for source, target in edges:
        chain = [source]
        for d in range(depth[source] + 1, depth[target]):
            slot_depth.append(d)
            chain.append(len(slot_depth) - 1)
        chains.append(chain + [target])
        segments += list(zip(chains[-1], chains[-1][1:]))
    rows = _rows(slot_depth, segments)
    bends = tuple(tuple((slot_depth[v], rows[v]) for v in chain[1:-1]) for chain in chains)
    heights = tuple(slot_depth.count(d) for d in range(max(slot_depth) + 1))
    return rows, bends, heights


def _rows(depth: list[int], edges) -> list[int]:
    """Row of each node inside its column: first in drawing order, then sweeps left to right and
    back that sort each column by the mean row of its neighbours (fewer crossings; ties keep the
    order)."""
    columns: dict[int, list[int]] = {}
    for i, d in enumerate(depth):
        columns.setdefault(d, []).append(i)
    row = {i: r for members in columns.values() for r, i in enumerate(members)}
    neighbours: dict[int, list[int]] = {i: [] for i in range(len(depth))}
    for source, target in edges:
        neighbours[source].append(target)
        neighbours[target].append(source)
    size = {d: len(members) for d, members in columns.items()}

    def offset(i: int) -> float:  # the row measured from the column's centre
        return row[i] - (size[depth[i]] - 1) / 2

    for sweep in range(4):
        for d in sorted(columns, reverse=sweep % 2 == 1):

            def centre(i: int) -> float:
                around = [offset(j) for j in neighbours[i] if depth[j] != d]
                return sum(around) / len(around) if around else offset(i)

            columns[d].sort(key=lambda i: (centre(i), row[i]))
            row.update({i: r for r, i in enumerate(columns[d])})
    return [row[i] for i in range(len(depth))]


if __name__ == "__main__":  # make figures: figures/ from the committed notebooks' outputs
    import sys

    root = Path(sys.argv[1]) if len(sys.argv) > 1 else FIGURES_DIR.parent  # the checkout
    notebooks = sorted((root / "notebooks").glob("[0-9]*.ipynb"))
    names = write_figures(notebooks, root / "figures")
    print(f"figures/: {len(names)} PNGs written from the notebooks' outputs")
    for problem in figure_mismatches(notebooks, root / "figures"):
        print(f"figures/: {problem}", file=sys.stderr)
