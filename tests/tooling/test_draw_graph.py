"""companion.viz.draw_graph: the drawn graph is the needle graph, node for node and edge for edge.

The oracle walks ``inputs`` (and, for the backward extension, each ``.grad``) by itself and
counts; the drawing is checked by counting the figure's node boxes and arrows.
"""

import numpy as np
import pytest

import needle as ndl
from companion.viz import draw_graph, figure_png
from needle import autograd


def reachable(roots):
    """Every node reachable from ``roots`` through ``inputs`` (by identity), and the number of
    input slots of those nodes (an op using one input twice has two edges)."""
    nodes, stack = {}, list(roots)
    while stack:
        v = stack.pop()
        if id(v) not in nodes:
            nodes[id(v)] = v
            stack.extend(v.inputs)
    return nodes, sum(len(v.inputs) for v in nodes.values())


def counted_in_figure(layout):
    fig = layout.figure()
    gids = [p.get_gid() for p in fig.axes[0].patches]
    return gids.count("node"), gids.count("edge")


def tensor(values, requires_grad=True):
    return ndl.Tensor(np.asarray(values, dtype=np.float32), requires_grad=requires_grad)


def lecture_graph():
    """The lecture's example y = ln(x1) + x1 x2 - exp(x2) (sin replaced by exp)."""
    x1, x2 = tensor([2.0]), tensor([5.0])
    return x1, x2, ndl.ops.log(x1) + x1 * x2 - ndl.ops.exp(x2)


def test_forward_graph_counts():
    x1, x2, y = lecture_graph()
    layout = draw_graph(y, grads=False)
    nodes, edges = reachable([y])
    assert len(layout.nodes) == len(nodes) == 8  # x1, x2, log, mul, add, exp, negate, add
    assert len(layout.edges) == edges == 9
    assert counted_in_figure(layout) == (8, 9)
    assert [n.kind for n in layout.nodes].count("parameter") == 2
    assert all(n.kind in ("parameter", "forward") for n in layout.nodes)
    assert layout.grad_links == ()


def test_a_shared_node_is_drawn_once_with_an_edge_per_use():
    x = tensor([[1.0, 2.0], [3.0, 4.0]])
    h = ndl.ops.exp(x)  # used three times: twice by one op, once by another
    y = (h * h + h).sum()
    layout = draw_graph(y, names={"x": x, "h": h, "y": y}, grads=False)
    nodes, edges = reachable([y])
    # x, h, h*h, h*h + h, sum; edges x-h, h-mul twice, mul-add, h-add, add-sum
    assert len(layout.nodes) == len(nodes) == 5 and len(layout.edges) == edges == 6
    by_name = {n.name: n for n in layout.nodes}
    uses = [e for e in layout.edges if e[0] == by_name["h"].index]
    assert len(uses) == 3 and len(set(uses)) == 2  # h -> mul twice, h -> add once
    assert by_name["h"].shape == "(2, 2)" and by_name["y"].shape == "()"
    assert by_name["y"].op == "Summation"
    assert counted_in_figure(layout) == (5, 6)


def test_the_backward_extension_reaches_back_into_the_forward_graph():
    x1, x2, y = lecture_graph()
    forward_ids = set(reachable([y])[0])
    y.backward()  # the default: gradients are graph nodes
    layout = draw_graph(y, names={"x1": x1, "x2": x2})
    nodes, edges = reachable([y, x1.grad, x2.grad])
    assert len(layout.nodes) == len(nodes) and len(layout.edges) == edges
    assert counted_in_figure(layout) == (len(nodes), edges)
    backward = [n for n in layout.nodes if n.kind == "backward"]
    assert (
        len(backward) == sum(v.op is not None for k, v in nodes.items() if k not in forward_ids) > 0
    )
    # the gradient graph uses forward values (x2 in d(x1 x2)/dx1, exp(x2) in d exp/dx2)
    kinds = [n.kind for n in layout.nodes]
    assert any(
        kinds[a] in ("forward", "parameter") and kinds[b] == "backward" for a, b in layout.edges
    )
    kept = {owner: n for n in layout.nodes for owner in n.grad_of}
    assert sorted(kept) == ["x1", "x2"]
    assert sorted(
        (layout.nodes[a].name, layout.nodes[b].name) for a, b in layout.grad_links
    ) == sorted((g, kept[g].name) for g in kept)
    # gradients passed explicitly: only x1's is drawn
    layout = draw_graph(y, names={"x1": x1}, grads={x1: x1.grad})
    nodes, edges = reachable([y, x1.grad])
    assert (len(layout.nodes), len(layout.edges)) == (len(nodes), edges)
    assert [n.grad_of for n in layout.nodes if n.grad_of] == [("x1",)]
    # with the fast path the gradients are constants: two leaves, no backward ops
    x1, x2, y = lecture_graph()
    y.backward(create_graph=False)
    layout = draw_graph(x1.grad, x2.grad)
    assert sorted(n.kind for n in layout.nodes) == ["constant", "constant"]
    assert not layout.edges
    # and it frees the forward graph as it goes (as PyTorch does): y keeps its value only
    assert y.inputs == [] and y.numpy().shape == (1,)
    assert len(draw_graph(y).nodes) == 1


def test_automatic_names_skip_the_given_ones():
    x1, x2, y = lecture_graph()
    layout = draw_graph(y, names={"v1": x1, "v3": x2})
    names = [n.name for n in layout.nodes]
    assert len(set(names)) == len(names) == 8
    assert sorted(names) == ["v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8"]


def test_one_gradient_node_kept_by_two_leaves_names_both():
    a, b = tensor([1.0]), tensor([2.0])
    (a + b).backward()  # both gradients are the all-ones seed itself
    assert a.grad is b.grad
    layout = draw_graph(a + b, names={"a": a, "b": b})
    assert [n.grad_of for n in layout.nodes if n.grad_of] == [("a", "b")]


def test_a_tuple_and_its_components():
    a, b = tensor([1.0, 2.0]), tensor([3.0, 4.0])
    t = ndl.ops.split(ndl.ops.stack([a, b * 2], axis=0), axis=0)
    y = (t[0] * t[1]).sum()
    layout = draw_graph(y, grads=False)
    nodes, edges = reachable([y])
    assert len(layout.nodes) == len(nodes) and len(layout.edges) == edges
    labels = [n.op for n in layout.nodes if n.op]
    assert "Split(0)" in labels and {"TupleGetItem(0)", "TupleGetItem(1)"} <= set(labels)
    assert any(n.shape == "tuple: (2,), (2,)" for n in layout.nodes)


def test_a_lazy_graph_is_drawn_without_computing_it():
    autograd.LAZY_MODE = True
    try:
        x = tensor([1.0, -2.0])
        y = ndl.ops.relu(x * 3).sum()
        layout = draw_graph(y)
    finally:
        autograd.LAZY_MODE = False
    assert [n.shape for n in layout.nodes if n.op] == ["not computed"] * 3
    assert y.cached_data is None
    assert float(y.numpy()) == 3.0


def test_layers_run_left_to_right_and_nodes_do_not_overlap():
    x1, x2, y = lecture_graph()
    y.backward()
    layout = draw_graph(y)
    for a, b in layout.edges:
        assert layout.nodes[a].depth < layout.nodes[b].depth
    # an edge across columns passes through slots of its own: no two boxes or bends share one
    places = [(n.depth, n.row) for n in layout.nodes] + [b for bends in layout.bends for b in bends]
    assert len(set(places)) == len(places)
    for (a, b), bends in zip(layout.edges, layout.bends):
        assert [d for d, _ in bends] == list(
            range(layout.nodes[a].depth + 1, layout.nodes[b].depth)
        )
    assert any(layout.bends)
    assert list(layout.heights) == [
        sum(d == column for d, _ in places) for column in range(len(layout.heights))
    ]


def test_the_drawing_is_deterministic():
    def build():
        x1, x2, y = lecture_graph()
        y.backward()
        return draw_graph(y, names={"x1": x1, "x2": x2, "y": y}, title="example")

    first, second = build(), build()
    assert first == second  # same nodes, labels, places and edges for a graph built again
    assert figure_png(first.figure()) == figure_png(second.figure())
    kinds = [n.kind for n in first.nodes]
    assert repr(first) == (
        f"GraphLayout({len(kinds)} nodes: {kinds.count('constant')} constant, "
        f"{kinds.count('parameter')} parameter, {kinds.count('forward')} forward, "
        f"{kinds.count('backward')} backward; {len(first.edges)} edges; 2 kept gradients)"
    )


def test_bad_arguments_are_named():
    x1, x2, y = lecture_graph()
    with pytest.raises(TypeError, match="got ndarray"):
        draw_graph(np.zeros(2))
    with pytest.raises(ValueError, match="at least one output"):
        draw_graph()
    with pytest.raises(ValueError, match=r"names\['z'\] is not a node of this graph"):
        draw_graph(y, names={"z": tensor([1.0])})
    with pytest.raises(TypeError, match=r"names\['z'\] is a float"):
        draw_graph(y, names={"z": 1.0})
    with pytest.raises(ValueError, match="a key of grads is not a node of the forward graph"):
        draw_graph(y, grads={tensor([1.0]): x1})
    with pytest.raises(TypeError, match="grads maps needle nodes"):
        draw_graph(y, grads={x1: 0.5})
