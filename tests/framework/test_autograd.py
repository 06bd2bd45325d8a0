"""Reverse-mode autodiff (hw1): graph structure, topological order, gradient accumulation,
second derivatives, the ``.data`` boundary, memory growth, lazy mode and TensorTuple routing.

Expected values are derived by hand (stated next to each test) or by finite differences.
"""

from __future__ import annotations

import gc
import sys

import numpy as np
import pytest
from conftest import DEVICES
from helpers import backend_dtype, check_gradients, rand, tensor

import needle as ndl
from needle import autograd

pytestmark = [pytest.mark.autograd, pytest.mark.both_backends]


# ---- graph structure ------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_graph_records_op_inputs_and_cached_data(device):
    a = tensor([[1.0, 2.0]], device)
    b = tensor([[3.0, 4.0]], device)
    c = a * b
    assert isinstance(c.op, ndl.ops.EWiseMul)
    assert c.inputs[0] is a and c.inputs[1] is b
    assert c.requires_grad and not c.is_leaf() and a.is_leaf()
    np.testing.assert_allclose(c.numpy(), [[3.0, 8.0]])
    assert repr(c).startswith("needle.Tensor(")
    assert c.shape == (1, 2) and c.device == device and c.dtype == backend_dtype()


@pytest.mark.parametrize("device", DEVICES)
def test_result_without_grad_is_detached(device):
    """make_from_op returns a detached constant when no input requires grad."""
    a = tensor([1.0, 2.0], device, requires_grad=False)
    c = ndl.exp(a) + 1.0
    assert c.is_leaf() and c.inputs == [] and not c.requires_grad
    np.testing.assert_allclose(c.numpy(), np.exp([1.0, 2.0]) + 1.0, rtol=1e-6)


@pytest.mark.hw1_topo_sort
def test_topological_order_is_post_order_dfs():
    """The course's hw1 case: c = 3·a·a + 4·b·a - a, visited inputs left to right.

    Post-order: a, 3a, 3a·a, b, 4b, 4b·a, (3a·a + 4b·a), -a, c.
    """
    a = ndl.Tensor(np.asarray([[0.88282157]]))
    b = ndl.Tensor(np.asarray([[0.90170084]]))
    c = 3 * a * a + 4 * b * a - a
    order = autograd.find_topo_sort([c])
    expected = [
        0.88282157,
        2.64846471,
        2.33812177,
        0.90170084,
        3.60680336,
        3.1841638,
        5.52228558,
        -0.88282157,
        4.63946401,
    ]
    np.testing.assert_allclose([float(x.numpy().item()) for x in order], expected, rtol=1e-6)
    assert order[0] is a and order[3] is b and order[-1] is c
    assert len(set(map(id, order))) == len(order)


@pytest.mark.hw1_topo_sort
def test_topological_order_with_several_roots_and_shared_nodes():
    x = ndl.Tensor([1.0])
    y = ndl.Tensor([2.0])
    s = x + y
    p = s * x
    q = ndl.exp(s)
    order = autograd.find_topo_sort([p, q])
    assert [id(n) for n in order] == [id(x), id(y), id(s), id(p), id(q)]
    # every node appears after all of its inputs
    position = {id(n): i for i, n in enumerate(order)}
    assert all(position[id(i)] < position[id(n)] for n in order for i in n.inputs)


def test_deep_graph_does_not_hit_the_recursion_limit():
    x = ndl.Tensor(np.array([0.5]))
    y = x
    depth = sys.getrecursionlimit() + 500
    for _ in range(depth):
        y = y * 1.0
    assert len(autograd.find_topo_sort([y])) == depth + 1
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), [1.0])


# ---- reverse mode ---------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.hw1_compute_gradient
def test_gradients_accumulate_over_every_path(device):
    """y = x·x + x + exp(x): dy/dx = 2x + 1 + exp(x); x feeds four consumers' inputs."""
    xv = np.array([0.3, -1.2, 2.0])
    x = tensor(xv, device)
    y = x * x + x + ndl.exp(x)
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * xv + 1 + np.exp(xv), rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.hw1_compute_gradient
def test_intermediate_nodes_get_their_adjoints(device):
    """z = (a·b)·a with u = a·b: dz/du = a, dz/da = 2ab, dz/db = a² (hand-derived).

    Interior nodes keep their adjoint only when asked (``retain_grad``, as in PyTorch)."""
    av, bv = np.array([2.0, -3.0]), np.array([0.5, 4.0])
    a, b = tensor(av, device), tensor(bv, device)
    u = a * b
    z = u * a
    u.retain_grad()
    z.retain_grad()
    w = a * 2.0  # an interior node that did not ask
    (z + w).backward()
    assert w.grad is None
    np.testing.assert_allclose(u.grad.numpy(), av, rtol=1e-6)
    np.testing.assert_allclose(a.grad.numpy(), 2 * av * bv + 2.0, rtol=1e-6)
    np.testing.assert_allclose(b.grad.numpy(), av**2, rtol=1e-6)
    np.testing.assert_allclose(z.grad.numpy(), np.ones(2))


@pytest.mark.parametrize("device", DEVICES)
def test_backward_seed_defaults_to_ones_and_accepts_out_grad(device):
    x = tensor([[1.0, 2.0], [3.0, 4.0]], device)
    (x * 3.0).backward()
    np.testing.assert_allclose(x.grad.numpy(), np.full((2, 2), 3.0))
    seed = tensor([[1.0, 0.0], [2.0, -1.0]], device, requires_grad=False)
    (x * 3.0).backward(seed)
    np.testing.assert_allclose(x.grad.numpy(), 3.0 * seed.numpy())
    with pytest.raises(ValueError, match=r"shape \(2,\).*\(2, 2\)"):
        (x * 3.0).backward(tensor([1.0, 1.0], device))


@pytest.mark.parametrize("device", DEVICES)
def test_constants_receive_no_gradient(device):
    x = tensor([1.0, 2.0], device)
    c = tensor([5.0, 6.0], device, requires_grad=False)
    (x * c).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [5.0, 6.0])
    assert c.grad is None


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.hw1_compute_gradient
def test_compute_gradient_of_variables_directly(device):
    x = tensor([1.0, -2.0, 0.5], device)
    y = ndl.summation(x * x * x)
    autograd.compute_gradient_of_variables(y, tensor(np.array(2.0), device, requires_grad=False))
    np.testing.assert_allclose(x.grad.numpy(), 2 * 3 * np.array([1.0, -2.0, 0.5]) ** 2, rtol=1e-6)


# ---- second-order gradients -----------------------------------------------------------------
SECOND_ORDER = [
    # (f, f', f'') hand-derived, applied element-wise then summed
    ("cube", lambda x: x * x * x, lambda x: 3 * x**2, lambda x: 6 * x),
    ("exp", ndl.exp, np.exp, np.exp),
    (
        "tanh",
        ndl.tanh,
        lambda x: 1 - np.tanh(x) ** 2,
        lambda x: -2 * np.tanh(x) * (1 - np.tanh(x) ** 2),
    ),
    ("log", ndl.log, lambda x: 1 / x, lambda x: -1 / x**2),
    ("power_scalar", lambda x: x**2.5, lambda x: 2.5 * x**1.5, lambda x: 3.75 * x**0.5),
    ("reciprocal", lambda x: 1.0 / x, lambda x: -1 / x**2, lambda x: 2 / x**3),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name,f,df,d2f", SECOND_ORDER, ids=[c[0] for c in SECOND_ORDER])
def test_second_derivative_of_elementwise_functions(device, name, f, df, d2f):
    """Differentiate Σ f'(x)·v (needle's own gradient graph) and compare with f''(x)·v."""
    xv = np.array([0.4, 1.3, 2.1])
    v = np.array([1.0, -2.0, 0.5])
    x = tensor(xv, device)
    f(x).sum().backward(create_graph=True)
    g = x.grad
    np.testing.assert_allclose(g.numpy(), df(xv), rtol=1e-5)
    assert g.requires_grad, "the gradient must stay connected to x"
    x.grad = None
    (g * tensor(v, device, requires_grad=False)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), d2f(xv) * v, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_hessian_vector_product_of_a_two_input_function(device):
    """f = Σ (x@w)²: ∇_w f = 2 xᵀ(x w); d/dw Σ ∇_w f · V = 2 xᵀ x V (hand-derived)."""
    rng = np.random.default_rng(1)
    xv, wv, V = rand((4, 3), rng), rand((3, 2), rng), rand((3, 2), rng)
    x, w = tensor(xv, device, requires_grad=False), tensor(wv, device)
    y = x @ w
    (y * y).sum().backward(create_graph=True)
    np.testing.assert_allclose(w.grad.numpy(), 2 * xv.T @ (xv @ wv), rtol=1e-5, atol=1e-6)
    gw = w.grad
    w.grad = None
    (gw * tensor(V, device, requires_grad=False)).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), 2 * xv.T @ xv @ V, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_gradient_of_logsumexp_gradient(device):
    """∇ logsumexp = softmax p; d/dz Σ p·v = p·v - p (p·v summed) (softmax Jacobian)."""
    zv = np.array([[0.2, -1.0, 0.7], [1.5, 0.1, -0.3]])
    v = np.array([[1.0, 2.0, -1.0], [0.5, 0.0, 3.0]])
    z = tensor(zv, device)
    ndl.logsumexp(z, (1,)).sum().backward(create_graph=True)
    p = np.exp(zv) / np.exp(zv).sum(1, keepdims=True)
    np.testing.assert_allclose(z.grad.numpy(), p, rtol=1e-5)
    g = z.grad
    z.grad = None
    (g * tensor(v, device, requires_grad=False)).sum().backward()
    expected = p * v - p * (p * v).sum(1, keepdims=True)
    np.testing.assert_allclose(z.grad.numpy(), expected, rtol=1e-4, atol=1e-6)


# ---- the .data boundary and detach ----------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_data_getter_is_detached_and_shares_the_array(device):
    w = tensor([[1.0, 2.0]], device)
    y = w * 2.0
    d = y.data
    assert d.is_leaf() and not d.requires_grad and d.inputs == []
    assert d.cached_data is y.cached_data


@pytest.mark.parametrize("device", DEVICES)
def test_data_setter_replaces_the_array_of_the_same_object(device):
    w = tensor([[1.0, 2.0], [3.0, 4.0]], device)
    before = id(w)
    new = tensor([[5.0, 6.0], [7.0, 8.0]], device, requires_grad=False)
    w.data = new
    assert id(w) == before and w.is_leaf() and w.requires_grad
    assert w.cached_data is new.cached_data
    np.testing.assert_allclose(w.numpy(), [[5.0, 6.0], [7.0, 8.0]])


@pytest.mark.parametrize("device", DEVICES)
def test_data_setter_reshapes_size1_differences(device):
    """A (4,) value fits a (1, 4) bias (same elements, only size-1 dimensions differ)."""
    bias = tensor(np.zeros((1, 4)), device)
    bias.data = tensor([1.0, 2.0, 3.0, 4.0], device)
    assert bias.shape == (1, 4)
    np.testing.assert_allclose(bias.numpy(), [[1.0, 2.0, 3.0, 4.0]])
    col = tensor(np.zeros((3, 1, 1)), device)
    col.data = tensor(np.ones((1, 3)), device)
    assert col.shape == (3, 1, 1)


@pytest.mark.parametrize("device", DEVICES)
def test_data_setter_rejects_incompatible_values(device):
    w = tensor(np.zeros((2, 3)), device)
    with pytest.raises(ValueError, match=r"shape \(3, 2\).*shape \(2, 3\)"):
        w.data = tensor(np.zeros((3, 2)), device)
    with pytest.raises(ValueError, match=r"shape \(6,\).*shape \(2, 3\)"):
        w.data = tensor(np.zeros(6), device)
    with pytest.raises(TypeError, match="Tensor"):
        w.data = np.zeros((2, 3))
    np.testing.assert_allclose(w.numpy(), np.zeros((2, 3)))  # unchanged after the failures


def test_data_setter_rejects_another_dtype():
    """float32 vs float16 (numpy backend) or float32 vs float64-less nd: both dtypes are named."""
    if ndl.BACKEND == "np":
        w = ndl.Tensor(np.zeros(3, dtype="float32"))
        with pytest.raises(TypeError, match="float64.*float32"):
            w.data = ndl.Tensor(np.zeros(3, dtype="float64"))
    else:  # the NDArray backend holds float32 only: it refuses other dtypes at construction
        with pytest.raises(TypeError, match="float64"):
            ndl.Tensor(np.zeros(3), dtype="float64", device=ndl.cpu_numpy())


@pytest.mark.skipif(
    ndl.BACKEND != "nd" or not ndl.cpu().enabled(),
    reason="needs two devices: the compiled cpu() and cpu_numpy() (nd backend)",
)
def test_data_setter_rejects_another_device():
    w = ndl.Tensor(np.zeros(3), device=ndl.cpu())
    with pytest.raises(ValueError, match=r"cpu_numpy\(\).*cpu\(\)"):
        w.data = ndl.Tensor(np.ones(3), device=ndl.cpu_numpy())


@pytest.mark.skipif(
    ndl.BACKEND != "nd" or not ndl.cpu().enabled(),
    reason="needs two devices: the compiled cpu() and cpu_numpy() (nd backend)",
)
def test_backward_rejects_out_grad_on_another_device():
    """The gradient must not silently land on the out_grad's device."""
    x = ndl.Tensor(np.ones(3), device=ndl.cpu())
    with pytest.raises(ValueError, match=r"cpu_numpy\(\).*cpu\(\)"):
        (x * 2.0).backward(ndl.Tensor(np.ones(3), device=ndl.cpu_numpy()))
    assert x.grad is None


@pytest.mark.parametrize("device", DEVICES)
def test_backward_stores_differentiable_gradients_on_leaves_only(device):
    """Default backward (the course's semantics): leaf grads are graph nodes that can be
    differentiated again; interior nodes keep none."""
    x = tensor([0.5, 2.0], device)
    y = ndl.exp(x)
    z = (y * x).sum()
    z.backward()
    g = x.grad
    assert g.requires_grad and not g.is_leaf()
    assert y.grad is None and z.grad is None
    np.testing.assert_allclose(
        g.numpy(), np.exp([0.5, 2.0]) * (1 + np.array([0.5, 2.0])), rtol=1e-5
    )
    # d/dx Σ x.grad = e^x (2 + x), with no keyword
    g.sum().backward()
    np.testing.assert_allclose(
        x.grad.numpy(), np.exp([0.5, 2.0]) * (2 + np.array([0.5, 2.0])), rtol=1e-5
    )


@pytest.mark.parametrize("device", DEVICES)
def test_course_hw1_gradient_of_gradient(device):
    """The course's own hw1 case: y = x2·x2 + x2·x3, then differentiate x2.grad = 2·x2 + x3."""
    x2 = ndl.Tensor([6], device=device)
    x3 = ndl.Tensor([0], device=device)
    y = x2 * x2 + x2 * x3
    y.backward()
    grad_x2, grad_x3 = x2.grad, x3.grad
    assert grad_x2.numpy()[0] == 12 and grad_x3.numpy()[0] == 6
    grad_x2.backward()
    assert x2.grad.numpy()[0] == 2
    assert x3.grad.numpy()[0] == 1


@pytest.mark.parametrize("device", DEVICES)
def test_fast_backward_opt_ins_record_no_graph(device):
    """create_graph=False and no_grad() (extensions): gradients are constants, no graph."""
    for fast in ("create_graph", "no_grad"):
        x = tensor([0.5, 2.0], device)
        z = (ndl.exp(x) * x).sum()
        if fast == "create_graph":
            z.backward(create_graph=False)
        else:
            with ndl.no_grad():
                z.backward()
        assert x.grad.is_leaf() and not x.grad.requires_grad, fast
        np.testing.assert_allclose(
            x.grad.numpy(), np.exp([0.5, 2.0]) * (1 + np.array([0.5, 2.0])), rtol=1e-5
        )


def test_two_training_threads_lose_no_gradient():
    """Two MLPs trained at once in two threads (each with a fast backward pass, which turns
    recording off in its own thread only) get a gradient for every parameter at every step,
    and end with the same losses as when trained one after the other."""
    import threading

    def setup(seed):
        rng = np.random.default_rng(seed)
        x = ndl.Tensor(rng.standard_normal((32, 8)).astype(np.float32), requires_grad=False)
        y = ndl.Tensor(rng.integers(0, 3, 32).astype(np.float32), requires_grad=False)
        np.random.seed(seed)  # the initializers draw from numpy's global state: build here
        model = ndl.nn.Sequential(ndl.nn.Linear(8, 16), ndl.nn.ReLU(), ndl.nn.Linear(16, 3))
        return x, y, model

    def train(x, y, model, out, missing):
        opt = ndl.optim.SGD(model.parameters(), lr=0.1)
        loss_fn = ndl.nn.SoftmaxLoss()
        for _ in range(60):
            opt.reset_grad()
            loss = loss_fn(model(x), y)
            loss.backward(create_graph=False)
            missing[0] += sum(p.grad is None for p in model.parameters())
            opt.step()
        out.append(float(loss.numpy()))

    serial = []
    for seed in (0, 1):
        train(*setup(seed), serial, [0])
    results = {0: [], 1: []}
    missing = {0: [0], 1: [0]}
    threads = [
        threading.Thread(target=train, args=(*setup(s), results[s], missing[s])) for s in (0, 1)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert missing == {0: [0], 1: [0]}
    assert [results[0][0], results[1][0]] == pytest.approx(serial, rel=1e-5)


def test_failed_construction_does_not_change_the_counter():
    """TENSOR_COUNTER counts initialised Values only: a failing Tensor(...) leaves it alone."""
    gc.collect()  # earlier tests' gradient cycles go first, so they do not move the count below
    start = autograd.TENSOR_COUNTER
    for bad in ("text", [[1.0], [2.0, 3.0]], {"a": 1}):
        with pytest.raises((TypeError, ValueError)):
            ndl.Tensor(bad)
    with pytest.raises(TypeError):
        ndl.Tensor([1.0], require_grad=False)
    gc.collect()
    assert autograd.TENSOR_COUNTER == start


def test_nodes_take_weakrefs_and_other_attributes():
    """A node's own fields are slots, yet a Tensor still takes weak references and any other
    attribute (as a plain Python object would), and every kind of node starts with no grad."""
    import weakref

    x = ndl.Tensor([1.0, 2.0])
    y = x * 2.0
    ref = weakref.ref(y)
    y.note = "kept"
    assert ref() is y and y.note == "kept" and x.grad is None and y.grad is None
    gc.collect()
    start = autograd.TENSOR_COUNTER
    z, c = x + x, ndl.Tensor.make_const(x.realize_cached_data())
    assert c.grad is None and c.is_leaf() and not c.requires_grad
    assert autograd.TENSOR_COUNTER == start + 2  # an op's node and a constant: one each
    del y, z, c
    gc.collect()
    assert ref() is None and autograd.TENSOR_COUNTER == start - 1


@pytest.mark.parametrize("device", DEVICES)
def test_detach_cuts_history(device):
    """z = detach(2x)·x: the detached factor is a constant, so dz/dx = 2x (not 4x)."""
    xv = np.array([1.0, -3.0])
    x = tensor(xv, device)
    y = (x * 2.0).detach()
    assert y.is_leaf() and not y.requires_grad
    (y * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * xv)


def _train_counter(update_through_data: bool, steps: int, device) -> list[int]:
    """Run SGD steps on Σ (x w)² and record TENSOR_COUNTER after each one."""
    rng = np.random.default_rng(0)
    x = tensor(rand((4, 3), rng), device, requires_grad=False)
    w = tensor(rand((3, 2), rng), device)
    counts = []
    gc.collect()
    gc.freeze()  # later collections only scan objects made in this loop (fast)
    try:
        for _ in range(steps):
            y = x @ w
            (y * y).sum().backward()
            if update_through_data:
                w.data = w.data - w.grad.data * 0.01
            else:
                w = w - w.grad * 0.01  # graph-tracked: the new w's history holds every old step
                w.retain_grad()  # an interior node now: keep its adjoint for the next step
            del y
            gc.collect()
            counts.append(autograd.TENSOR_COUNTER)
    finally:
        gc.unfreeze()
    return counts


@pytest.mark.parametrize("device", DEVICES)
def test_update_through_data_keeps_memory_flat(device):
    tracked = _train_counter(False, 6, device)
    flat = _train_counter(True, 6, device)
    assert all(b > a for a, b in zip(tracked, tracked[1:])), tracked
    assert len(set(flat[1:])) == 1, flat


def test_tensor_counter_counts_live_values():
    start = autograd.TENSOR_COUNTER
    a = ndl.Tensor([1.0])
    b = a + 1.0
    assert autograd.TENSOR_COUNTER == start + 2
    del a, b  # no cycles here: reference counting frees both at once
    assert autograd.TENSOR_COUNTER == start


# ---- lazy mode ------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_lazy_mode_defers_computation(device, monkeypatch):
    monkeypatch.setattr(autograd, "LAZY_MODE", True)
    a = tensor([1.0, 2.0], device)
    b = ndl.exp(a) * a
    assert b.cached_data is None and b.inputs[0].cached_data is None
    np.testing.assert_allclose(
        b.realize_cached_data().numpy() if ndl.BACKEND == "nd" else b.realize_cached_data(),
        np.exp([1.0, 2.0]) * [1.0, 2.0],
        rtol=1e-6,
    )
    assert b.inputs[0].cached_data is not None
    b.backward()
    np.testing.assert_allclose(
        a.grad.numpy(), np.exp([1.0, 2.0]) * (1 + np.array([1.0, 2.0])), rtol=1e-5
    )


# ---- tensors and tuples ---------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_tuple_get_item_routes_zero_to_the_other_component(device):
    x = tensor([1.0, 2.0], device)
    y = tensor([[3.0], [4.0]], device)
    t = ndl.make_tuple(x, y)
    assert isinstance(t, ndl.TensorTuple) and len(t) == 2
    assert repr(t).startswith("needle.TensorTuple(")
    first = ndl.ops.TupleGetItem(0)(t, fold_const=False)  # a real TupleGetItem node
    (first * 3.0).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [3.0, 3.0])
    np.testing.assert_allclose(y.grad.numpy(), np.zeros((2, 1)))
    assert y.grad.shape == (2, 1)


@pytest.mark.parametrize("device", DEVICES)
def test_split_component_gradient_is_zero_elsewhere(device):
    a = tensor(np.arange(6.0).reshape(3, 2), device)
    parts = ndl.split(a, 0)
    assert len(parts) == 3 and parts[1].shape == (2,)
    (parts[1] * parts[1]).sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), [[0, 0], [4.0, 6.0], [0, 0]])


@pytest.mark.parametrize("device", DEVICES)
def test_split_components_picked_twice_skipped_and_the_whole_tuple_used(device):
    # Component adjoints are routed straight to the tuple: a component picked twice sums both
    # contributions, one never picked gets zeros, and a consumer of the whole tuple (stack)
    # adds its own adjoint on top. Checked against finite differences.
    w = np.random.default_rng(1).standard_normal((4, 3, 2))

    def f(a):
        parts = ndl.split(a, 1)
        whole = ndl.ops.Stack(0)(parts) * tensor(w, device, requires_grad=False)
        return parts[0] * parts[0] + parts[0] * parts[2] + whole.sum(axes=(0,))

    check_gradients(f, np.random.default_rng(0).standard_normal((3, 4, 2)), device=device)


@pytest.mark.parametrize("device", DEVICES)
def test_split_component_second_derivative(device):
    # create_graph keeps the routed component adjoints differentiable:
    # L = Σ (a_0)³ over split(a, 0) → dL/da_0 = 3 a_0², and d/da Σ dL/da = 6 a_0 in row 0
    a = tensor(np.array([[1.0, -2.0], [3.0, 4.0]]), device)
    first = ndl.split(a, 0)[0]
    (first * first * first).sum().backward(create_graph=True)
    np.testing.assert_allclose(a.grad.numpy(), [[3.0, 12.0], [0.0, 0.0]], rtol=1e-6)
    grad = a.grad
    a.grad = None
    grad.sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), [[6.0, -12.0], [0.0, 0.0]], rtol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_tensor_tuple_add_detach_and_fused_add_scalars(device):
    x = tensor([1.0, 2.0], device)
    t = ndl.fused_add_scalars(x, 1.0, 10.0)
    np.testing.assert_allclose(t[0].numpy(), [2.0, 3.0])
    np.testing.assert_allclose(t[1].numpy(), [11.0, 12.0])
    s = t + t
    np.testing.assert_allclose(s[1].numpy(), [22.0, 24.0])
    assert [p.shape for p in t.tuple()] == [(2,), (2,)]
    d = t.detach()
    assert d.is_leaf() and not d.requires_grad
    with pytest.raises(IndexError, match="out of range"):
        t[2]


@pytest.mark.parametrize("device", DEVICES)
def test_tensor_construction_from_tensor_shares_data(device):
    a = tensor([1.0, 2.0], device)
    b = ndl.Tensor(a)
    assert b.cached_data is a.cached_data and b.device == device


@pytest.mark.skipif(
    ndl.BACKEND != "nd" or not ndl.cpu().enabled(),
    reason="needs the compiled cpu() and cpu_numpy() (nd backend)",
)
def test_tensor_construction_moves_between_devices():
    a = ndl.Tensor([1.0, 2.0], device=ndl.cpu_numpy())
    b = ndl.Tensor(a, device=ndl.cpu())
    assert b.device == ndl.cpu() and b.cached_data is not a.cached_data
    np.testing.assert_allclose(b.numpy(), [1.0, 2.0])
    # an NDArray keeps its device when none is given
    c = ndl.Tensor(ndl.NDArray(np.ones(2), device=ndl.cpu()))
    assert c.device == ndl.cpu()


@pytest.mark.skipif(ndl.cuda().enabled(), reason="cuda() is available here")
def test_unavailable_device_is_refused():
    """No silent fallback: a tensor on a device that is not enabled raises, naming it."""
    with pytest.raises((RuntimeError, ValueError), match="cuda"):
        ndl.Tensor([1.0], device=ndl.cuda())


@pytest.mark.parametrize("device", DEVICES)
def test_check_gradients_through_an_expression_with_reuse(device):
    """Finite differences on an expression that reuses inputs across many ops."""
    rng = np.random.default_rng(4)

    def f(a, b):
        h = ndl.tanh(a @ b)
        return ndl.logsoftmax(h * h + h) * ndl.broadcast_to(
            ndl.summation(a, (1,)).reshape((3, 1)), (3, 2)
        )

    check_gradients(f, rand((3, 4), rng), rand((4, 2), rng), device=device)


@pytest.mark.parametrize("device", DEVICES)
def test_matmul_gives_no_adjoint_to_an_input_that_needs_none(device):
    # a constant operand (a one-hot matrix, a data batch) gets None instead of a full product
    rng = np.random.default_rng(5)
    x_np, w_np, g_np = (rng.standard_normal(s) for s in ((4, 3), (3, 2), (4, 2)))
    x = tensor(x_np, device, requires_grad=False)
    w = tensor(w_np, device)
    out = x @ w
    ga, gb = out.op.gradient_as_tuple(tensor(g_np, device, requires_grad=False), out)
    assert ga is None
    np.testing.assert_allclose(gb.numpy(), x_np.T @ g_np, rtol=1e-5, atol=1e-6)
    out.backward(tensor(g_np, device, requires_grad=False))
    assert x.grad is None
    np.testing.assert_allclose(w.grad.numpy(), x_np.T @ g_np, rtol=1e-5, atol=1e-6)
