"""hw1 checks: each op forward and backward, topological sort, reverse mode, the course's apps.

Forward results are compared with numpy; gradients with central differences of the numpy
reference (float64), so a backward question does not depend on the forward question.
"""

import numpy as np

from .common import OpCase, away_from_zero, check_backward, check_forward, positive, randn, tensors
from .diagnose import (
    CheckFailure,
    check_adjoints,
    check_close,
    compare,
    numerical_vjp,
    present,
    require,
)
from .hw0 import nn_epoch_reference
from .mistakes import matmul_variants
from .questions import HW1_OPS


def op(name):
    """The student's op helper ``name`` (``ndl.ops.name``, else ``ndl.name``)."""
    import needle as ndl

    fn = getattr(getattr(ndl, "ops", None), name, None) or getattr(ndl, name, None)
    if fn is None:
        raise CheckFailure(f"needle.ops has no function {name!r}")
    return fn


def _bcast_ref(shape):
    return lambda a: np.broadcast_to(a, shape)


def cases(name):
    """The calls that check op ``name``."""
    a, b = randn(3, 4, seed=1), randn(3, 4, seed=2)
    t = {
        "add": [OpCase("add(a, b)", lambda x, y: op("add")(x, y), np.add, {"a": a, "b": b})],
        "add_scalar": [
            OpCase(
                "add_scalar(a, 1.7)",
                lambda x: op("add_scalar")(x, 1.7),
                lambda x: x + 1.7,
                {"a": a},
            )
        ],
        "multiply": [
            OpCase(
                "multiply(a, b)", lambda x, y: op("multiply")(x, y), np.multiply, {"a": a, "b": b}
            )
        ],
        "mul_scalar": [
            OpCase(
                "mul_scalar(a, -1.3)",
                lambda x: op("mul_scalar")(x, -1.3),
                lambda x: x * -1.3,
                {"a": a},
            )
        ],
        "power": [
            OpCase(
                "power(a, b)",
                lambda x, y: op("power")(x, y),
                np.power,
                {"a": positive(3, 4, seed=3), "b": randn(3, 4, seed=4)},
            )
        ],
        "power_scalar": [
            OpCase(
                "power_scalar(a, 3)", lambda x: op("power_scalar")(x, 3), lambda x: x**3, {"a": a}
            ),
            OpCase(
                "power_scalar(a, 0.5)",
                lambda x: op("power_scalar")(x, 0.5),
                lambda x: x**0.5,
                {"a": positive(3, 4, seed=5)},
            ),
        ],
        "divide": [
            OpCase(
                "divide(a, b)",
                lambda x, y: op("divide")(x, y),
                np.divide,
                {"a": a, "b": away_from_zero(3, 4, seed=6, low=0.5)},
            )
        ],
        "divide_scalar": [
            OpCase(
                "divide_scalar(a, 2.5)",
                lambda x: op("divide_scalar")(x, 2.5),
                lambda x: x / 2.5,
                {"a": a},
            )
        ],
        "matmul": [
            OpCase(
                label,
                lambda x, y: op("matmul")(x, y),
                np.matmul,
                {"a": randn(*sa, seed=seed), "b": randn(*sb, seed=seed + 1)},
                variants=matmul_variants,
            )
            for label, sa, sb, seed in [
                ("matmul(a, b)", (3, 4), (4, 2), 7),
                ("matmul(a, b) of square matrices", (3, 3), (3, 3), 24),
                ("matmul(a, b) batched", (2, 3, 4), (2, 4, 2), 9),
                ("matmul(a, b) broadcasting b over a's batch", (2, 3, 4), (4, 2), 11),
                ("matmul(a, b) broadcasting a over b's batch", (3, 4), (2, 4, 2), 26),
            ]
        ],
        "summation": [
            OpCase(
                "summation(a, axes=(1,)) of a square a",
                lambda x: op("summation")(x, axes=(1,)),
                lambda x: x.sum(axis=1),
                {"a": randn(4, 4, seed=28)},
            ),
            OpCase(
                "summation(a, axes=(1,))",
                lambda x: op("summation")(x, axes=(1,)),
                lambda x: x.sum(axis=1),
                {"a": randn(3, 4, 2, seed=13)},
            ),
            OpCase(
                "summation(a)",
                lambda x: op("summation")(x),
                lambda x: x.sum(),
                {"a": randn(3, 4, seed=14)},
            ),
            OpCase(
                "summation(a, axes=None) of a (5, 4, 1)",
                lambda x: op("summation")(x, axes=None),
                lambda x: x.sum(),
                {"a": randn(5, 4, 1, seed=29)},
            ),
            OpCase(
                "summation(a, axes=(0, 2))",
                lambda x: op("summation")(x, axes=(0, 2)),
                lambda x: x.sum(axis=(0, 2)),
                {"a": randn(3, 4, 2, seed=15)},
            ),
        ],
        "broadcast_to": [
            OpCase(
                "broadcast_to(a, (3, 4))",
                lambda x: op("broadcast_to")(x, (3, 4)),
                _bcast_ref((3, 4)),
                {"a": randn(3, 1, seed=16)},
            ),
            OpCase(
                "broadcast_to(a, (2, 3, 4))",
                lambda x: op("broadcast_to")(x, (2, 3, 4)),
                _bcast_ref((2, 3, 4)),
                {"a": randn(4, seed=17)},
            ),
            OpCase(
                "broadcast_to(a, (3, 4))",
                lambda x: op("broadcast_to")(x, (3, 4)),
                _bcast_ref((3, 4)),
                {"a": randn(1, 4, seed=18)},
            ),
            OpCase(
                "broadcast_to(a, (4, 4))",
                lambda x: op("broadcast_to")(x, (4, 4)),
                _bcast_ref((4, 4)),
                {"a": randn(4, 1, seed=27)},
            ),
            OpCase(
                "broadcast_to(a, (5, 4, 3))",
                lambda x: op("broadcast_to")(x, (5, 4, 3)),
                _bcast_ref((5, 4, 3)),
                {"a": randn(5, 4, 1, seed=25)},
            ),
            OpCase(
                "broadcast_to(a, (3, 3, 3)) of a 0-d a",
                lambda x: op("broadcast_to")(x, (3, 3, 3)),
                _bcast_ref((3, 3, 3)),
                {"a": randn(seed=35)},
            ),
        ],
        "reshape": [
            OpCase(
                "reshape(a, (2, 6))",
                lambda x: op("reshape")(x, (2, 6)),
                lambda x: x.reshape(2, 6),
                {"a": a},
            ),
            OpCase(
                "reshape(a, (6, 4))",
                lambda x: op("reshape")(x, (6, 4)),
                lambda x: x.reshape(6, 4),
                {"a": randn(2, 3, 4, seed=19)},
            ),
            OpCase(
                "reshape(a, (20,))",
                lambda x: op("reshape")(x, (20,)),
                lambda x: x.reshape(20),
                {"a": randn(5, 4, seed=34)},
            ),
        ],
        "negate": [OpCase("negate(a)", lambda x: op("negate")(x), np.negative, {"a": a})],
        "transpose": [
            OpCase(
                "transpose(a)",
                lambda x: op("transpose")(x),
                lambda x: np.swapaxes(x, -1, -2),
                {"a": randn(2, 3, 4, seed=20)},
            ),
            OpCase(
                "transpose(a, axes=(0, 1))",
                lambda x: op("transpose")(x, axes=(0, 1)),
                lambda x: np.swapaxes(x, 0, 1),
                {"a": randn(2, 3, 4, seed=21)},
            ),
            OpCase(
                "transpose(a, axes=(1, 2))",
                lambda x: op("transpose")(x, axes=(1, 2)),
                lambda x: np.swapaxes(x, 1, 2),
                {"a": randn(3, 5, 4, seed=33)},
            ),
        ],
        "log": [OpCase("log(a)", lambda x: op("log")(x), np.log, {"a": positive(3, 4, seed=22)})],
        "exp": [OpCase("exp(a)", lambda x: op("exp")(x), np.exp, {"a": a})],
        "relu": [
            OpCase(
                "relu(a)",
                lambda x: op("relu")(x),
                lambda x: np.maximum(x, 0),
                {"a": away_from_zero(3, 4, seed=23, low=0.1)},
            )
        ],
    }
    return t[name]


def _make(name, direction):
    def check(ctx):
        for case in cases(name):
            (check_forward if direction == "forward" else check_backward)(case)

    check.__name__ = f"hw1_{name}_{direction}"
    check.__doc__ = f"{name}: {direction} matches numpy / finite differences."
    return check


for _name in HW1_OPS:
    for _direction in ("forward", "backward"):
        globals()[f"hw1_{_name}_{_direction}"] = _make(_name, _direction)


def _graph():
    """A small graph with a shared node: c = a*b, d = c + a, e = d*c + 1.5."""
    a, b = tensors([randn(2, 3, seed=30), randn(2, 3, seed=31)])
    c = a * b
    d = c + a
    e = d * c
    f = e + 1.5
    return (a, b, c, d, e, f)


def hw1_topo_sort(ctx):
    import needle as ndl

    a, b, c, d, e, f = _graph()
    names = {id(v): n for v, n in zip((a, b, c, d, e, f), "abcdef")}
    got = ndl.autograd.find_topo_sort([f])
    present(got, "find_topo_sort returned None")
    got_names = [names.get(id(n), "?") for n in got]
    code = "abcdef?"  # the order as numbers (a = 0, ..., f = 5, a node not in the graph 6)
    problem = compare(
        "find_topo_sort([f]) order (as numbers: a = 0, b = 1, ..., f = 5, 6 for a node "
        "not in the graph)",
        np.array([code.index(n) for n in got_names], dtype=np.float64),
        lambda: np.array([code.index(n) for n in _post_order(f, names)], dtype=np.float64),
        rtol=0.0,
        atol=0.0,
        hint="the graph is c = a*b, d = c + a, e = d*c, f = e + 1.5; post-order depth-first "
        "search, visiting node.inputs in order and each node once",
    )
    if problem is not None:
        raise CheckFailure(problem)


def _post_order(root, names: dict) -> list[str]:
    """The names of the nodes above ``root`` in post-order DFS over node.inputs, in order."""
    order, seen = [], set()

    def visit(node):
        if id(node) in seen:
            return
        seen.add(id(node))
        for i in node.inputs:
            visit(i)
        order.append(names[id(node)])

    visit(root)
    return order


def hw1_compute_gradient(ctx):
    import needle as ndl

    a, b, c, d, e, f = _graph()
    w = randn(2, 3, seed=32).astype(np.float64)
    f.backward(ndl.Tensor(w.astype(np.float32), requires_grad=False))

    def ref(x, y):
        cc = x * y
        return (cc + x) * cc + 1.5

    arrays = [randn(2, 3, seed=30).astype(np.float64), randn(2, 3, seed=31).astype(np.float64)]
    for name, x in (("a", a), ("b", b)):
        present(x.grad, f"after f.backward(out_grad), {name}.grad is None")
    check_adjoints(
        "compute_gradient_of_variables for f = (a*b + a)*(a*b) + 1.5 (a is used "
        "three times: partial adjoints must be summed)",
        [a.grad.numpy(), b.grad.numpy()],
        lambda: numerical_vjp(ref, arrays, w),
        ["a", "b"],
        inputs={"a": arrays[0], "b": arrays[1]},
        out_grad=w,
        rtol=1e-4,
        atol=1e-4,
    )
    _check_composites(ndl)
    _check_gradient_of_gradient(ndl)


def _composites(ndl):
    """Expressions as the course's gradient checks build them (label, needle function, numpy
    reference, inputs): each op's output feeds others, and an input is used again after an op
    has read it, so an op that writes into its input changes the result."""
    o = ndl.ops
    return [
        (
            "summation((A @ B + C) * (A @ B), axes=None)",
            lambda A, B, C: o.summation((o.matmul(A, B) + C) * o.matmul(A, B), axes=None),
            lambda A, B, C: ((A @ B + C) * (A @ B)).sum(),
            {"A": randn(4, 3, seed=40), "B": randn(3, 2, seed=41), "C": randn(4, 2, seed=42)},
        ),
        (
            "summation(broadcast_to(A, (4, 3)) * B, axes=None)",
            lambda A, B: o.summation(o.broadcast_to(A, (4, 3)) * B, axes=None),
            lambda A, B: (np.broadcast_to(A, (4, 3)) * B).sum(),
            {"A": randn(4, 1, seed=43), "B": randn(4, 3, seed=44)},
        ),
        (
            "summation(reshape(A, (3, 4)) @ B / 5 + C, axes=None)",
            lambda A, B, C: o.summation(
                o.divide_scalar(o.matmul(o.reshape(A, (3, 4)), B), 5) + C, axes=None
            ),
            lambda A, B, C: (A.reshape(3, 4) @ B / 5 + C).sum(),
            {"A": randn(12, seed=45), "B": randn(4, 2, seed=46), "C": randn(3, 2, seed=47)},
        ),
        (
            "summation(add_scalar(x, 1) * x + relu(x) * x, axes=None)",
            lambda x: o.summation(o.add_scalar(x, 1) * x + o.relu(x) * x, axes=None),
            lambda x: ((x + 1) * x + np.maximum(x, 0) * x).sum(),
            {"x": away_from_zero(3, 4, seed=48, low=0.1)},
        ),
    ]


def _check_composites(ndl) -> None:
    """backward() through composite expressions matches finite differences of the numpy
    reference (the course's gradient_check(..., backward=True))."""
    for label, fn, ref, inputs in _composites(ndl):
        arrays = [np.asarray(v, dtype=np.float32) for v in inputs.values()]
        xs = tensors(arrays)
        out = fn(*xs)
        check_close(
            f"{label} (forward)",
            out,
            lambda ref=ref, arrays=arrays: ref(*[a.astype(np.float64) for a in arrays]),
            inputs=inputs,
            rtol=1e-4,
            atol=1e-4,
            hint="a wrong value here with every "
            "op question passing means an op changes its input in place, or "
            "depends on state left by an earlier call",
        )
        out.backward()
        for name, x in zip(inputs, xs):
            present(x.grad, f"after ({label}).backward(), {name}.grad is None")
        check_adjoints(
            f"backward() through {label}",
            [x.grad.numpy() for x in xs],
            lambda ref=ref, arrays=arrays: numerical_vjp(
                ref, [a.astype(np.float64) for a in arrays], np.array(1.0)
            ),
            list(inputs),
            inputs=inputs,
            out_grad=np.array(1.0),
            rtol=1e-3,
            atol=1e-3,
        )


DETACHED_HINT = (
    "the course's compute_gradient_of_variables builds every adjoint with needle "
    "ops (sum_node_list, op.gradient_as_tuple) and stores those graph nodes in "
    ".grad, so a gradient can be differentiated again; do not detach them, turn "
    "recording off, or wrap them in new Tensors"
)


def _require_graph_node(what: str, grad) -> None:
    """A gradient that depends on a variable must be a node of the graph (the course's hw1
    test differentiates x.grad); a constant means the adjoints were detached."""
    present(grad, f"{what} is None after backward()")
    require(
        getattr(grad, "op", None) is not None and getattr(grad, "requires_grad", False),
        f"{what} is a constant (op None or requires_grad False): your reverse mode "
        f"detaches the gradients, so they cannot be differentiated again.\n  hint: "
        + DETACHED_HINT,
    )


def _check_gradient_of_gradient(ndl) -> None:
    """Differentiate a gradient, as the course's hw1 tests do: the scalar case
    y = x2·x2 + x2·x3 (x2.grad = 2·x2 + x3, whose gradient is 2 and 1), then
    L = Σ (A @ B + c)² through matmul, summation and broadcast_to, whose A.grad is
    differentiated again against finite differences of the analytic first derivative."""
    x2, x3 = ndl.Tensor([6.0]), ndl.Tensor([0.0])
    y = x2 * x2 + x2 * x3
    y.backward()
    g = x2.grad
    _require_graph_node("x2.grad for y = x2*x2 + x2*x3", g)
    check_close(
        "x2.grad for y = x2*x2 + x2*x3 at x2 = 6, x3 = 0",
        g,
        lambda: np.array([12.0]),
        rtol=1e-6,
        atol=1e-6,
    )
    g.backward()
    check_close(
        "x2.grad after x2.grad.backward() (d(2*x2 + x3)/dx2)",
        x2.grad,
        lambda: np.array([2.0]),
        rtol=1e-6,
        atol=1e-6,
        hint=DETACHED_HINT,
    )
    check_close(
        "x3.grad after x2.grad.backward() (d(2*x2 + x3)/dx3)",
        x3.grad,
        lambda: np.array([1.0]),
        rtol=1e-6,
        atol=1e-6,
        hint=DETACHED_HINT,
    )

    A0, B0, c0 = randn(3, 4, seed=36), randn(4, 2, seed=37), randn(2, seed=38)
    W = randn(3, 4, seed=39).astype(np.float64)
    A, B, c = tensors([A0, B0, c0])
    Y = ndl.ops.matmul(A, B) + ndl.ops.broadcast_to(ndl.ops.reshape(c, (1, 2)), (3, 2))
    ndl.ops.summation(Y * Y).backward()
    gA = A.grad
    _require_graph_node("A.grad for L = summation((A @ B + broadcast_to(c))**2)", gA)
    ndl.ops.summation(gA * ndl.Tensor(W.astype(np.float32), requires_grad=False)).backward()

    def first_derivative(a, b, cc):  # dL/dA = 2 (A B + c) Bᵀ, weighted by W and summed
        return (2 * (a @ b + cc) @ b.T * W).sum()

    arrays = [x.astype(np.float64) for x in (A0, B0, c0)]
    check_adjoints(
        "the gradient of summation(A.grad * W), where A.grad comes from "
        "L = summation((A @ B + broadcast_to(c))**2)",
        [A.grad.numpy(), B.grad.numpy(), c.grad.numpy()],
        lambda: numerical_vjp(first_derivative, arrays, np.array(1.0)),
        ["A", "B", "c"],
        inputs={"A": A0, "B": B0, "c": c0, "W": W},
        out_grad=np.array(1.0),
        rtol=1e-3,
        atol=1e-3,
    )


def hw1_softmax_loss(ctx):
    from simple_ml import softmax_loss

    import needle as ndl

    Z = randn(5, 4, seed=33, scale=2.0)
    y = np.random.default_rng(34).integers(0, 4, 5)
    onehot = np.eye(4, dtype=np.float32)[y]
    Zt = ndl.Tensor(Z)
    loss = softmax_loss(Zt, ndl.Tensor(onehot, requires_grad=False))
    z64 = Z.astype(np.float64)
    check_close(
        "softmax_loss(Z, y_one_hot)",
        loss,
        lambda: np.mean(np.log(np.exp(z64).sum(1)) - z64[np.arange(5), y]),
        inputs={"Z": Z, "y_one_hot": onehot},
        rtol=1e-5,
        atol=1e-5,
    )
    loss.backward()
    check_close(
        "Z.grad after softmax_loss(Z, y_one_hot).backward()",
        Zt.grad,
        lambda: (np.exp(z64) / np.exp(z64).sum(1, keepdims=True) - onehot) / 5,
        inputs={"Z": Z, "y_one_hot": onehot},
        rtol=1e-4,
        atol=1e-5,
        hint="build the loss from needle ops only (log, exp, summation, ...)",
    )


def hw1_nn_epoch(ctx):
    from simple_ml import nn_epoch

    import needle as ndl

    rng = np.random.default_rng(35)
    X = rng.standard_normal((40, 5)).astype(np.float32)
    y = rng.integers(0, 3, 40).astype(np.uint8)
    W1 = (rng.standard_normal((5, 8)) / np.sqrt(8)).astype(np.float32)
    W2 = (rng.standard_normal((8, 3)) / np.sqrt(3)).astype(np.float32)
    start = [X.copy(), y.copy(), W1.copy(), W2.copy()]
    out = nn_epoch(X, y, ndl.Tensor(W1), ndl.Tensor(W2), lr=0.2, batch=15)
    require(
        isinstance(out, tuple) and len(out) == 2,
        f"nn_epoch must return the pair (W1, W2) of Tensors, got {type(out).__name__}",
    )
    check_close(
        "W1 returned by nn_epoch(X, y, W1, W2, lr=0.2, batch=15)",
        out[0],
        lambda: nn_epoch_reference(*start, 0.2, 15)[0],
        rtol=1e-4,
        atol=1e-5,
    )
    check_close(
        "W2 returned by nn_epoch(X, y, W1, W2, lr=0.2, batch=15)",
        out[1],
        lambda: nn_epoch_reference(*start, 0.2, 15)[1],
        rtol=1e-4,
        atol=1e-5,
    )
