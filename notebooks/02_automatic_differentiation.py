# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 02 · Automatic differentiation
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/needle-companion/needle-companion/blob/main/notebooks/02_automatic_differentiation.ipynb)
#
# **Lecture:** 4, "Automatic Differentiation", and 5, "Automatic Differentiation Implementation"
#
# **Homework:** hw1 Q1–Q2 (forward and backward of the ops), Q3 (topological sort), Q4 (reverse
# mode differentiation)
#
# **Prerequisites:** the chain rule; notebook 01 (the hand-derived gradients this replaces)
#
# **You will be able to:** read a needle computational graph (`op`, `inputs`, `cached_data`);
# compute a topological order and reverse-mode adjoints by hand (and forward-mode tangents) and
# check them against
# `backward()` and finite differences; say which nodes keep `.grad`; differentiate a gradient
# (reverse mode extends the graph); use lazy evaluation
#
# **Run time:** about 10 s on a 2-core x86-64 machine
#
# **Student mode:** with `NEEDLE_IMPL=path/to/hwN/python` (your own needle), the cells marked
# companion-only are skipped: they use `retain_grad()` and `backward(create_graph=False)`, which the
# course's `Tensor` does not have, or the node-by-node structure of this project's gradients.
#
# Training a network needs the gradient of a scalar loss with respect to every parameter.
# Writing those derivatives by hand does not scale; numerical differences are slow (central
# differences take two evaluations of the loss per parameter) and inexact. **Automatic differentiation** gets exact gradients by
# recording the program as a **computational graph** and applying the chain rule to it.
#
# needle's autodiff (`needle/autograd.py`, homework 1) has three ingredients:
#
# * a `Tensor` remembers the `op` that produced it, the `inputs` it was produced from, and its
#   value, `cached_data`;
# * every op knows its forward computation (`compute`) and its **vector-Jacobian product**
#   (`gradient`): given the adjoint $\bar v = \partial y / \partial v$ of its output, it returns
#   the adjoint contribution of each input;
# * `backward()` visits the graph in **reverse topological order** and sums, for every node,
#   the contributions of all the paths from the node to the output.

# %% tags=["remove-cell"] cellView="form" jupyter={"source_hidden": true}
#@title Colab set-up: in Colab this installs needle (2-3 minutes); elsewhere it does nothing
import os, shlex, subprocess, sys, tempfile; repo = os.environ.get("NEEDLE_COLAB_REPO", "https://github.com/needle-companion/needle-companion")
if "google.colab" in sys.modules or os.environ.get("NEEDLE_COLAB_SIMULATE") == "1":  # companion/colab_setup.py
    py, src, q = sys.executable, os.path.join(tempfile.gettempdir(), "needle-companion"), shlex.quote
    done = subprocess.run(f"{q(py)} -m companion.colab_setup --status 2>/dev/null || {{ {{ test -d {q(src)} || git clone -q --depth=1 {q(repo)} {q(src)}; }} && cd {q(src)} && {q(py)} -m companion.colab_setup --install {q(repo)} --cwd {q(os.getcwd())}; }}", shell=True, capture_output=True, text=True); print(done.stdout + done.stderr[-3000:], end=""); assert done.returncode == 0, f"the set-up could not install this project from {repo} (what failed is above)"

# %%
import time

import matplotlib.pyplot as plt
import numpy as np

import needle as ndl
from needle import autograd
from companion import lecture
from companion.machine import machine_line
from companion.viz import save_figure

np.random.seed(0)
lecture.setup()  # with NEEDLE_IMPL: cells marked "# companion-only" print a skip line
print(ndl.BACKEND, ndl.default_tensor_device())  # where ndl.Tensor(...) puts its data

# %% [markdown]
# ## A computational graph
#
# The lecture's example with two paths from one node to the output:
#
# $$v_1 = x,\quad v_2 = \exp(v_1),\quad v_3 = v_2 + 1,\quad v_4 = v_2 \times v_3,\quad y = v_4 .$$
#
# At $x = \ln 2$: $v_2 = 2$, $v_3 = 3$, $y = v_4 = 6$. Each line below creates a node.

# %%
v1 = ndl.Tensor([np.log(2.0)], dtype="float32")
v2 = ndl.exp(v1)
v3 = v2 + 1
v4 = v2 * v3
for name, v in [("v1", v1), ("v2", v2), ("v3", v3), ("v4", v4)]:
    print(f"{name} = {v.numpy()[0]:.4f}")
assert abs(v2.numpy()[0] - 2.0) < 1e-6
assert abs(v3.numpy()[0] - 3.0) < 1e-6
assert abs(v4.numpy()[0] - 6.0) < 1e-5

# %% [markdown]
# Every node carries its history. `v4` was made by an `EWiseMul` whose inputs are the very
# objects `v2` and `v3`; `v3` by an `AddScalar` holding the scalar 1; `v1` is a leaf (no op).
# `cached_data` is the raw array (an `NDArray` on the default backend).

# %%
names = {id(v1): "v1", id(v2): "v2", id(v3): "v3", id(v4): "v4"}
for v in (v4, v3, v1):
    op = type(v.op).__name__ if v.op is not None else None
    print(f"{names[id(v)]}: op={op}, inputs={[names[id(i)] for i in v.inputs]}, "
          f"cached_data={v.cached_data}")
assert isinstance(v4.op, ndl.ops.EWiseMul) and v4.inputs[0] is v2 and v4.inputs[1] is v3
assert isinstance(v3.op, ndl.ops.AddScalar) and v3.op.scalar == 1
assert v1.is_leaf() and v1.inputs == []

# %% [markdown]
# ## Topological order
#
# Reverse mode must handle a node only after **every** consumer has sent it its adjoint.
# `find_topo_sort` returns the nodes in a topological order — every node after all of its
# inputs — computed by a post-order depth-first search that visits `inputs` left to right.
# From `v4`: visit `v2` (which first visits `v1`), then `v3` (its input `v2` is already done),
# then emit `v4`.

# %%
order = autograd.find_topo_sort([v4])
print(" -> ".join(names[id(n)] for n in order))
assert [names[id(n)] for n in order] == ["v1", "v2", "v3", "v4"]

# %% [markdown]
# ## Reverse mode by hand
#
# Start from $\bar v_4 = 1$ and walk the order backwards:
#
# * $\bar v_3 = \bar v_4 \cdot \partial v_4/\partial v_3 = v_2 = 2$;
# * $v_2$ feeds **two** consumers, so its adjoint is a sum over both paths:
#   $\bar v_2 = \bar v_4 \cdot v_3 + \bar v_3 \cdot 1 = 3 + 2 = 5$;
# * $\bar v_1 = \bar v_2 \cdot \exp(v_1) = 5 \cdot 2 = 10$.
#
# Check: $y = e^{2x} + e^x$, so $dy/dx = 2e^{2x} + e^x = 2\cdot 4 + 2 = 10$ at $x = \ln 2$.
# `backward()` stores the adjoint of every **leaf** (here $v_1$) in `.grad`. The course's needle
# stores it on every node; this project sets `.grad` on an interior node only when asked with
# `retain_grad()` before `backward()` (PyTorch's rule, an extension), so interior nodes hold no
# reference to their adjoint. That alone does not free the adjoints: with the default
# `backward()` they stay alive as part of the leaves' gradient graphs (section "Differentiating a
# gradient" below draws them), and only `backward(create_graph=False)` frees each one once it
# has been used. We ask for all three here.

# %%
# companion-only: retain_grad() and this project's rule that only leaves and retained nodes keep .grad
for v in (v2, v3, v4):
    v.retain_grad()
v4.backward()
hand = {"v4": 1.0, "v3": 2.0, "v2": 5.0, "v1": 10.0}
for v in (v4, v3, v2, v1):
    name = names[id(v)]
    print(f"adjoint of {name}: {v.grad.numpy()[0]:.4f} (by hand {hand[name]:.1f})")
    assert abs(v.grad.numpy()[0] - hand[name]) < 1e-5

# %% [markdown]
# Without `retain_grad()` only the leaf keeps its gradient here (the course's needle keeps every
# node's):

# %%
# companion-only: this project's rule that only leaves and retained nodes keep .grad
w1 = ndl.Tensor([np.log(2.0)], dtype="float32")
w2 = ndl.exp(w1)
(w2 * (w2 + 1)).backward()
print(f"leaf: {w1.grad.numpy()[0]:.4f}; interior exp node: {w2.grad}")
assert abs(w1.grad.numpy()[0] - 10.0) < 1e-5 and w2.grad is None

# %% [markdown]
# Central finite differences, $(f(t+h) - f(t-h)) / 2h$, computed in float64 numpy, agree. An
# adjoint $\bar v_i$ is the derivative of $y$ as a function of $v_i$ with everything upstream
# held fixed: $y = v_4$, $y = v_2 \cdot v_3$ (with $v_2 = 2$), $y = v_2(v_2 + 1)$ and
# $y = e^{v_1}(e^{v_1} + 1)$.

# %%
# companion-only: the gradients retained by the companion-only cell above
downstream = {
    "v4": (lambda t: t, 6.0),
    "v3": (lambda t: 2.0 * t, 3.0),
    "v2": (lambda t: t * (t + 1), 2.0),
    "v1": (lambda t: np.exp(t) * (np.exp(t) + 1), np.log(2.0)),
}
h = 1e-6
for v in (v4, v3, v2, v1):
    name = names[id(v)]
    f, at = downstream[name]
    fd = (f(at + h) - f(at - h)) / (2 * h)
    print(f"{name}: finite difference {fd:.4f}, autodiff {v.grad.numpy()[0]:.4f}")
    assert abs(fd - hand[name]) < 1e-6 and abs(v.grad.numpy()[0] - fd) < 1e-4


# %% [markdown]
# ## Drawing the graph
#
# A node's column is its depth (the longest path from a leaf); arrows run from inputs to
# the op that consumes them. Each box shows the value and, after `backward()`, the adjoint.
# The two arrows leaving `v2` are the two paths whose contributions were summed.

# %%
def draw_graph(root, names, ax):
    """Draw the graph below ``root``: columns by depth, arrows input -> consumer."""
    order = autograd.find_topo_sort([root])
    depth = {}
    for n in order:
        depth[id(n)] = 1 + max((depth[id(i)] for i in n.inputs), default=-1)
    rows = {}
    pos = {}
    for n in order:
        d = depth[id(n)]
        pos[id(n)] = (d, -rows.get(d, 0))
        rows[d] = rows.get(d, 0) + 1
    for n in order:
        (xn, yn) = pos[id(n)]
        for i in n.inputs:
            (xi, yi) = pos[id(i)]
            if depth[id(n)] - depth[id(i)] > 1:  # a skip edge: leave and enter under the boxes
                start, end, rad = (xi, yi - 0.2), (xn, yn - 0.2), 0.3
            else:  # box edge to box edge
                start, end, rad = (xi + 0.32, yi), (xn - 0.32, yn), 0.0
            ax.annotate("", xy=end, xytext=start,
                        arrowprops=dict(arrowstyle="-|>", color="0.35", shrinkA=0, shrinkB=0,
                                        connectionstyle=f"arc3,rad={rad}"))
    for n in order:
        op = type(n.op).__name__ if n.op is not None else "leaf"
        label = f"{names[id(n)]} = {op}\nvalue {n.numpy().item():.3f}"
        if n.grad is not None:
            label += f"\nadjoint {n.grad.numpy().item():.3f}"
        ax.text(*pos[id(n)], label, ha="center", va="center", fontsize=9,
                bbox=dict(boxstyle="round,pad=0.4", fc="#dbe9f6" if n.op else "#f6e7c1"))
    ax.set_xlim(-0.6, max(depth.values()) + 0.6)
    ax.set_ylim(-max(rows.values()) + 0.2, 0.5)
    ax.axis("off")


fig, ax = plt.subplots(figsize=(9, 2.6))
draw_graph(v4, names, ax)
ax.set_title("y = exp(x)·(exp(x) + 1) at x = ln 2: values and adjoints (two paths leave v2)")
save_figure(fig, "autodiff_graph")

# %% [markdown]
# ## A graph with two inputs
#
# The homework's example $c = 3a^2 + 4ba - a$. By hand, $\partial c/\partial a = 6a + 4b - 1$
# and $\partial c/\partial b = 4a$. Its topological order (post-order, inputs left to right) is
# $a,\ 3a,\ 3a\cdot a,\ b,\ 4b,\ 4b\cdot a,\ (3a\cdot a + 4b\cdot a),\ -a,\ c$.

# %%
a = ndl.Tensor([0.5], dtype="float32")
b = ndl.Tensor([-2.0], dtype="float32")
c = 3 * a * a + 4 * b * a - a
order = autograd.find_topo_sort([c])
print([f"{n.numpy().item():.2f}" for n in order])
expected = [0.5, 1.5, 0.75, -2.0, -8.0, -4.0, -3.25, -0.5, -3.75]
assert np.allclose([n.numpy().item() for n in order], expected)
c.backward()
print(f"dc/da = {a.grad.numpy()[0]:.4f}, dc/db = {b.grad.numpy()[0]:.4f}")
assert abs(a.grad.numpy()[0] - (6 * 0.5 + 4 * -2.0 - 1)) < 1e-6   # -6
assert abs(b.grad.numpy()[0] - 4 * 0.5) < 1e-6                     # 2

# %% [markdown]
# The same check on a matrix expression built from hw1's ops (`matmul`, `relu`, `exp`,
# `summation`, `log`), $L = \sum_i \log \sum_j \exp\bigl(\mathrm{ReLU}(XW)\bigr)_{ij}$,
# against central differences computed from a numpy re-implementation (float64) for every
# entry of $W$:

# %%
X = np.random.randn(4, 3)
W = np.random.randn(3, 5)


def loss_np(W, X=X):
    z = np.maximum(X @ W, 0)
    return np.log(np.exp(z).sum(1)).sum()


Wt = ndl.Tensor(W, dtype="float32")
Xt = ndl.Tensor(X, dtype="float32", requires_grad=False)
loss = ndl.summation(ndl.log(ndl.summation(ndl.exp(ndl.relu(Xt @ Wt)), axes=(1,))))
loss.backward()
fd = np.zeros_like(W)
for idx in np.ndindex(*W.shape):
    e = np.zeros_like(W)
    e[idx] = 1e-6
    fd[idx] = (loss_np(W + e) - loss_np(W - e)) / 2e-6
err = np.abs(Wt.grad.numpy() - fd).max()
assert abs(loss.numpy().item() - loss_np(W)) < 1e-4 and err < 1e-5
print(f"loss = {loss.numpy().item():.4f}; max |autodiff - finite differences| < 1e-5 "
      f"(|gradient| up to {np.abs(fd).max():.2f})")

# %% [markdown]
# ## The adjoints hw1 Q2 grades
#
# Most of hw1's `gradient` methods are one line, but a few are where students lose points.
# Each rule follows from one fact: an input entry's adjoint is the sum of the adjoints of every
# output entry it went into.
#
# * `broadcast_to`: each input entry is copied into several outputs, so its adjoint **sums**
#   `out_grad` over the broadcast axes: the new leading axes (summed away) and the axes
#   stretched from size 1 (summed, then kept as size 1), then reshaped to the input's shape.
#   hw1 tests $(3, 1) \to (3, 3)$ and $() \to (3, 3, 3)$; the third case below has both kinds of
#   axis at once. Forgetting the new leading axes is the classic bug.
# * `reshape`: the same entries in another shape, so the adjoint is `out_grad` reshaped back.
# * `transpose(axes=(i, j))` swaps two axes (the last two without `axes`), so the adjoint
#   swaps the same two back.
# * batched `matmul`, $C = AB$ with $A$ of shape $(b, m, n)$ and $B$ of shape $(n, p)$: per batch
#   entry $\bar A = \bar C B^\top$, and because the one $B$ serves all $b$ products,
#   $\bar B = \sum_{\text{batch}} A^\top \bar C$ (the broadcast rule again).
#
# The cell writes each rule in numpy, then checks it against needle's `backward()` with the same
# `out_grad` and against central differences of $\langle \bar y, f(x) \rangle$ (float64).

# %%
def fd_adjoint(f, x, out_grad, h=1e-6):
    """Central differences of sum(out_grad * f(x)) for each entry of x: x's adjoint."""
    x = np.asarray(x, dtype=np.float64)
    adj = np.zeros_like(x)
    for idx in np.ndindex(*x.shape):
        e = np.zeros_like(x)
        e[idx] = h
        adj[idx] = ((out_grad * f(x + e)).sum() - (out_grad * f(x - e)).sum()) / (2 * h)
    return adj


rng = np.random.default_rng(1)
A_, B_ = rng.standard_normal((2, 3, 4)), rng.standard_normal((4, 5))
cases = [  # name, needle op, numpy op, inputs, out_grad shape, the adjoints by hand
    ("broadcast_to (3,1)->(3,3)", lambda x: ndl.broadcast_to(x, (3, 3)),
     lambda x: np.broadcast_to(x, (3, 3)), [rng.standard_normal((3, 1))], (3, 3),
     lambda g: [g.sum(axis=1, keepdims=True)]),
    ("broadcast_to ()->(3,3,3)", lambda x: ndl.broadcast_to(x, (3, 3, 3)),
     lambda x: np.broadcast_to(x, (3, 3, 3)), [np.array(rng.standard_normal())], (3, 3, 3),
     lambda g: [g.sum()]),
    ("broadcast_to (4,1)->(2,4,3)", lambda x: ndl.broadcast_to(x, (2, 4, 3)),
     lambda x: np.broadcast_to(x, (2, 4, 3)), [rng.standard_normal((4, 1))], (2, 4, 3),
     lambda g: [g.sum(axis=0).sum(axis=1, keepdims=True)]),
    ("reshape (2,6)->(3,4)", lambda x: ndl.reshape(x, (3, 4)), lambda x: x.reshape(3, 4),
     [rng.standard_normal((2, 6))], (3, 4), lambda g: [g.reshape(2, 6)]),
    ("transpose axes=(0,2)", lambda x: ndl.transpose(x, axes=(0, 2)),
     lambda x: x.swapaxes(0, 2), [rng.standard_normal((2, 3, 4))], (4, 3, 2),
     lambda g: [g.swapaxes(0, 2)]),
    ("batched matmul (2,3,4)@(4,5)", ndl.matmul, np.matmul, [A_, B_], (2, 3, 5),
     lambda g: [g @ B_.T, (A_.transpose(0, 2, 1) @ g).sum(axis=0)]),
]
for name, op, op_np, inputs, out_shape, by_hand in cases:
    g = rng.standard_normal(out_shape)
    xs = [ndl.Tensor(x, dtype="float32") for x in inputs]
    op(*xs).backward(ndl.Tensor(g, dtype="float32"))
    for i, (x, hand) in enumerate(zip(xs, by_hand(g))):
        others = lambda xi: op_np(*[xi if j == i else inputs[j] for j in range(len(inputs))])
        assert x.grad.shape == inputs[i].shape, (name, x.grad.shape)
        assert np.abs(x.grad.numpy() - hand).max() < 1e-4, name
        assert np.abs(fd_adjoint(others, inputs[i], g) - hand).max() < 1e-6, name
    shapes = ", ".join(str(x.shape) for x in inputs)
    print(f"{name:<29} adjoint shapes {shapes:<17} by hand = needle = finite differences")

# %% [markdown]
# Exercise 2.4 below does the same for `summation` over an axis.

# %% [markdown]
# ## Forward mode, and why reverse mode
#
# Forward mode is the other way to apply the chain rule: carry, next to each value $v_i$, its
# tangent $\dot v_i = \partial v_i / \partial x$ for one chosen input direction, and update both
# in the order of the program. For the lecture's example: $\dot v_1 = 1$,
# $\dot v_2 = e^{v_1}\dot v_1 = 2$, $\dot v_3 = \dot v_2 = 2$,
# $\dot v_4 = \dot v_2 v_3 + v_2 \dot v_3 = 6 + 4 = 10$: the same 10 as reverse mode.
#
# One forward-mode pass gives the derivative of every output along **one** input direction (a
# Jacobian-vector product). A loss $L:\mathbb R^n \to \mathbb R$ has one output and $n$
# parameters, so forward mode needs $n$ passes for the gradient, while reverse mode gets all $n$
# entries from **one** backward pass (a vector-Jacobian product). Below, forward mode in numpy
# (each line is the tangent rule of the line of `loss_np` it follows) recovers the gradient of
# the matrix loss above, one entry of $W$ per pass; `loss_grad` is reverse mode written out in
# numpy (the same lines' adjoints, in reverse order).

# %%
def loss_tangent(W, W_dot, X=X):
    """dL/dW · W_dot for loss_np: the forward-mode tangent, computed alongside the values."""
    u = X @ W
    u_dot = X @ W_dot
    z, z_dot = np.maximum(u, 0), (u > 0) * u_dot          # ReLU' · u̇
    s = np.exp(z).sum(1)
    s_dot = (np.exp(z) * z_dot).sum(1)                   # Σ_j exp(z_j) ż_j
    return (s_dot / s).sum()                             # L = Σ log s, so L̇ = Σ ṡ / s


def loss_grad(W, X=X):
    """dL/dW for loss_np by reverse mode: one forward pass, then the adjoints back."""
    u = X @ W
    z = np.maximum(u, 0)
    e = np.exp(z)
    z_bar = e / e.sum(1, keepdims=True)                  # L̄ = 1, s̄ = 1/s, z̄ = s̄ · exp(z)
    u_bar = z_bar * (u > 0)                              # ReLU's adjoint
    return X.T @ u_bar                                   # matmul's adjoint for W


basis = np.eye(W.size).reshape(W.size, *W.shape)
forward_grad = np.array([loss_tangent(W, e) for e in basis]).reshape(W.shape)
assert np.abs(forward_grad - Wt.grad.numpy()).max() < 1e-5
assert np.abs(loss_grad(W) - Wt.grad.numpy()).max() < 1e-5
print(f"forward mode: {len(basis)} passes (one per entry of W); reverse mode: 1 backward pass; "
      "both equal needle's W.grad to 1e-5")

# %% [markdown]
# What does a pass cost? Reverse mode's backward pass costs a small constant multiple of the
# forward pass (each op's adjoint is a few times the work of the op; the "cheap gradient
# principle"), whatever $n$ is. Each of forward mode's passes also costs a few forward passes,
# and it needs $n$ of them, so its gradient's cost grows in proportion to $n$. The cell times, in numpy on one batch of 64 rows, one evaluation
# of the loss, the reverse-mode gradient and the $n$ forward-mode passes, for $W$ of $d \times d$
# entries, and prints both gradients' cost in loss evaluations with a verdict computed from them
# (timings vary with the machine and its load, printed first; the output is not compared).
#
# Reverse mode pays in **memory** instead: the backward pass needs the forward pass's
# intermediates ($u$, $z$ and $e$ in `loss_grad`), so all of them stay alive until it has run,
# for every layer of a network at once. Forward mode keeps only the current value and tangent.
# Trading that memory back for recomputation is the subject of notebook 12.

# %% tags=["nbval-ignore-output"]
def best_time(fn, repeat=5):
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


print(machine_line())
rng_t = np.random.default_rng(2)
print("gradient cost in loss evaluations, for n entries of W:")
print("|    n | reverse mode | forward mode |")
cost = {}
for d in (4, 8, 16, 32):
    Xb, Wb = rng_t.standard_normal((64, d)), rng_t.standard_normal((d, d))
    basis_b = np.eye(d * d).reshape(d * d, d, d)
    t_loss = best_time(lambda: loss_np(Wb, Xb))
    t_rev = best_time(lambda: loss_grad(Wb, Xb)) / t_loss
    t_fwd = best_time(lambda: [loss_tangent(Wb, e, Xb) for e in basis_b], repeat=3) / t_loss
    cost[d * d] = (t_rev, t_fwd)
    print(f"| {d * d:>4} | {t_rev:>12.1f} | {t_fwd:>12.0f} |")
(n0, (r0, f0)), (n1, (r1, f1)) = list(cost.items())[0], list(cost.items())[-1]
print(f"verdict: from n = {n0} to {n1} ({n1 // n0}x the parameters) reverse mode's cost went from "
      f"{r0:.1f} to {r1:.1f} loss evaluations ({r1 / r0:.1f}x), forward mode's from {f0:.0f} to "
      f"{f1:.0f} ({f1 / f0:.0f}x)")

# %% [markdown]
# ## Differentiating a gradient
#
# Each `gradient` is written with needle ops, so `backward()` does not just compute numbers: it
# **extends the graph** with the adjoint computation (the lecture's "reverse mode AD by
# extending the computational graph"). That is the course's design and needle's default: every
# `.grad` is itself a node whose inputs reach back into the forward graph, so it can be
# differentiated again with no keyword.
#
# For $y = x^3$: $y' = 3x^2$ and $y'' = 6x$. We evaluate at $x = 3$, where $y' = 27$ and
# $y'' = 18$ differ (at $x = 2$ both are 12, and a check there could not tell a correct second
# derivative from a `.grad` that was simply left over from the first pass).

# %%
x = ndl.Tensor([3.0], dtype="float32")
(x ** 3).backward()
g = x.grad
print(f"y'(3) = {g.numpy()[0]:.4f}, made by {type(g.op).__name__}, "
      f"requires_grad={g.requires_grad}")
assert abs(g.numpy()[0] - 27.0) < 1e-4 and g.requires_grad and g.op is not None
g.backward()
print(f"y''(3) = {x.grad.numpy()[0]:.4f}")
assert abs(x.grad.numpy()[0] - 18.0) < 1e-4

# %% [markdown]
# Keeping that graph has a price: a parameter's gradient holds the whole forward graph (and
# every interior adjoint) alive until the gradient is reset, and the gradient graph refers back
# to the parameter, a reference cycle that `opt.reset_grad()` or the next `backward()` breaks.
# A training step needs only the gradient's value, so this project adds an opt-in fast path,
# `backward(create_graph=False)` (PyTorch's default; `with ndl.no_grad():` does the same): the
# gradients are constants and each interior adjoint is freed as soon as it has been used.

# %%
# companion-only: backward(create_graph=False) (the fast path, an extension)
x = ndl.Tensor([3.0], dtype="float32")
(x ** 3).backward(create_graph=False)
print(f"create_graph=False: y'(3) = {x.grad.numpy()[0]:.4f}, a constant: op={x.grad.op}, "
      f"requires_grad={x.grad.requires_grad}")
assert abs(x.grad.numpy()[0] - 27.0) < 1e-4 and x.grad.op is None and not x.grad.requires_grad

# %% [markdown]
# ### The adjoint graph, drawn
#
# `companion.viz.draw_graph` draws a needle graph: one box per node with its op and shape,
# inputs on the left, and after `backward()` the nodes the backward pass added (red), each
# leaf's `.grad` outlined. For the lecture's example the red boxes are the lecture's adjoint
# graph: from the constant seed $\bar v_4 = 1$, `EWiseMul`'s gradient makes $\bar v_4 v_3$ (the
# path from $v_2$ straight to $v_4$) and $\bar v_3 = \bar v_4 v_2$; `AddScalar` passes
# $\bar v_3$ on unchanged, so it adds no node; the two paths meet in
# $\bar v_2 = \bar v_4 v_3 + \bar v_3$; and `exp`'s gradient multiplies by its own output,
# $\bar v_1 = \bar v_2 v_2$. The red nodes take forward nodes ($v_2$, $v_3$) as inputs, which
# is what made differentiating a gradient possible above.

# %%
# companion-only: this project's gradient formulas, node by node (exp's gradient reuses its output)
from companion import viz

w1 = ndl.Tensor([np.log(2.0)], dtype="float32")
w2 = ndl.exp(w1)
w3 = w2 + 1
w4 = w2 * w3
w4.backward()
adj1 = w1.grad                    # v̄1 = v̄2 · v2
adj2, also_v2 = adj1.inputs       # v̄2 = v̄4 v3 + v̄3
via_v4, adj3 = adj2.inputs        # v̄3 = v̄4 · v2
adj4 = adj3.inputs[0]             # the seed
assert also_v2 is w2 and via_v4.inputs[1] is w3 and adj3.inputs[1] is w2
assert adj4 is via_v4.inputs[0] and adj4.op is None
values = ", ".join(f"{n.numpy()[0]:g}" for n in (adj4, adj3, via_v4, adj2, adj1))
print(f"adjoints v̄4, v̄3, v̄4·v3, v̄2, v̄1: {values}")
viz.draw_graph(w4, names={"$v_1$": w1, "$v_2$": w2, "$v_3$": w3, "$v_4$": w4,
                          r"$\bar v_4$": adj4, r"$\bar v_3$": adj3, r"$\bar v_4 v_3$": via_v4,
                          r"$\bar v_2$": adj2, r"$\bar v_1$": adj1},
               title="the lecture's example after backward(): forward graph and adjoint graph")

# %% [markdown]
# ## Lazy mode
#
# By default each op computes its value as soon as it is created (eager mode). With
# `autograd.LAZY_MODE = True` ops only record the graph; nothing runs until a value is
# requested with `realize_cached_data()` (or `.numpy()`), which computes the missing inputs
# first. Lazy evaluation is what lets a framework see a whole graph before running it (and,
# for instance, fuse ops).

# %%
autograd.LAZY_MODE = True
try:
    p = ndl.Tensor([1.0, 2.0], dtype="float32")
    q = ndl.exp(p) * p
    print("before:", q.cached_data, q.inputs[0].cached_data)
    assert q.cached_data is None and q.inputs[0].cached_data is None
    value = q.numpy()
    print("after: ", np.round(value, 4))
    assert q.cached_data is not None and np.allclose(value, np.exp([1.0, 2.0]) * [1.0, 2.0])
finally:
    autograd.LAZY_MODE = False

# %% [markdown]
# ## Summary
#
# * A `Tensor` is a node: `op`, `inputs`, `cached_data`.
# * `find_topo_sort` orders the graph (post-order DFS); `backward()` walks it in reverse,
#   summing each node's adjoint over all its consumers — exactly the "multiple pathway" rule.
# * Leaves keep their gradient in `.grad`; interior nodes only after `retain_grad()` (the
#   course's needle keeps every node's).
# * Gradients are needle expressions and `backward()` records them, so higher derivatives come
#   for free; `backward(create_graph=False)` is the fast path when only the values are needed.
# * The next notebook builds modules and optimizers on top of this, and shows why parameter
#   updates go through `.data` (so the graph does not grow step after step).

# %% [markdown]
# ## Exercises
#
# Each exercise has a cell to fill in (it starts as `raise NotImplementedError`) and a check
# cell that says whether your answer is right: "not answered yet", "correct", or "not yet"
# with what differs. The first cell below gathers everything the exercises use, so this
# section also runs on its own after a kernel restart. Reference answers are in
# `notebooks/solutions/02_automatic_differentiation.py`; try first.

# %% tags=["exercise-setup"]
import numpy as np

import needle as ndl
from companion.check.exercises import check_exercise

rng = np.random.default_rng(0)
a_ex = rng.standard_normal((2, 3)).astype(np.float32)
b_ex = (rng.uniform(0.5, 2.0, (2, 3)) * rng.choice([-1, 1], (2, 3))).astype(np.float32)
g_ex = rng.standard_normal((2, 3)).astype(np.float32)      # an out_grad
m_ex = rng.standard_normal((3, 4, 2)).astype(np.float32)
GRAPH = {"e": ["d", "c"], "d": ["c", "a"], "c": ["a", "b"], "a": [], "b": []}  # exercise 2.2


def needle_adjoints(f, arrays, out_grad):
    """The adjoints needle's reverse mode gives each input of f for the seed out_grad."""
    xs = [ndl.Tensor(a) for a in arrays]
    f(*xs).backward(ndl.Tensor(out_grad))
    return [x.grad.numpy() for x in xs]


# %% [markdown]
# **Exercise 2.1 (an adjoint by hand).** For $c = a / b$ (element-wise) and an incoming adjoint
# $\bar c$ (`out_grad`), write the adjoints $\bar a$ and $\bar b$. The check compares them with
# what needle's `EWiseDiv.gradient` gives.

# %% tags=["exercise-stub"]
def divide_adjoints(a, b, out_grad):
    """(adjoint of a, adjoint of b) for c = a / b, given the adjoint out_grad of c."""
    raise NotImplementedError


# %% tags=["exercise-check"]
check_exercise("2.1 divide_adjoints", lambda: divide_adjoints(a_ex, b_ex, g_ex),
               needle_adjoints(lambda a, b: a / b, [a_ex, b_ex], g_ex), rtol=1e-5, atol=1e-6)

# %% [markdown]
# **Exercise 2.2 (topological order).** The graph $c = a \cdot b$, $d = c + a$, $e = d \cdot c$
# is `GRAPH`, a dict from each node to its inputs, in order. Write the post-order
# depth-first search that `find_topo_sort` uses and return the node names in its order.

# %% tags=["exercise-stub"]
def post_order(graph, root):
    """Names of the nodes reachable from root, each after all of its inputs (DFS order)."""
    raise NotImplementedError


# %% tags=["exercise-check"]
def _needle_order():
    a, b = ndl.Tensor(a_ex), ndl.Tensor(b_ex)
    c = a * b
    d = c + a
    e = d * c
    names = {id(a): "a", id(b): "b", id(c): "c", id(d): "d", id(e): "e"}
    return [names[id(n)] for n in ndl.autograd.find_topo_sort([e])]


check_exercise("2.2 post_order", lambda: post_order(GRAPH, "e"), predicate=lambda got: None
               if list(got) == _needle_order() else f"got {list(got)}; think again about when a "
               "node is appended: after all of its inputs, visiting them in order")

# %% [markdown]
# **Exercise 2.3 (use reverse mode).** With needle (a `Tensor`, `ndl.exp` and `backward()`),
# compute the derivative of $f(x) = x e^x$ at $x_0$ and return it as a float. The check
# compares with the derivative you can write by hand.

# %% tags=["exercise-stub"]
def derivative_x_exp_x(x0):
    """df/dx of f(x) = x·exp(x) at x0, computed by needle's backward()."""
    raise NotImplementedError


# %% tags=["exercise-check"]
check_exercise("2.3 derivative_x_exp_x", lambda: [derivative_x_exp_x(x) for x in (-1.0, 0.5)],
               [(1 + x) * np.exp(x) for x in (-1.0, 0.5)], rtol=1e-5, atol=1e-6)

# %% [markdown]
# **Exercise 2.4 (the adjoint of a reduction).** For $s = \sum_{\text{axis}} m$, the adjoint
# of $m$ copies $\bar s$ back along the summed axis. Write it in numpy for a 3-D `m` summed
# over one `axis` (no keepdims), given `out_grad` of $s$'s shape.

# %% tags=["exercise-stub"]
def summation_adjoint(out_grad, shape, axis):
    """The adjoint of m (shape ``shape``) for s = m.sum(axis), given the adjoint of s."""
    raise NotImplementedError


# %% tags=["exercise-check"]
g_sum = rng.standard_normal((3, 2)).astype(np.float32)
check_exercise("2.4 summation_adjoint", lambda: summation_adjoint(g_sum, m_ex.shape, 1),
               needle_adjoints(lambda m: ndl.summation(m, axes=(1,)), [m_ex], g_sum)[0])
