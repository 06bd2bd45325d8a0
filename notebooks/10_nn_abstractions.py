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
# # 10 · Three designs of a deep-learning library: layers, static graphs, define-by-run
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/needle-companion/needle-companion/blob/main/notebooks/10_nn_abstractions.ipynb)
#
# **Lecture:** 7, "Neural Network Library Abstractions" (the historical part: Caffe, TensorFlow
# 1.x, PyTorch)
#
# **Homework:** none (the course has no homework for this part; needle itself is the
# define-by-run design built in hw1-hw2)
#
# **Prerequisites:** notebook 02 (the computational graph and reverse mode), notebook 03 (modules
# and the training-loop contract)
#
# **You will be able to:** write a network as Caffe-style layers with a hand-written backward per
# layer; build a graph first and run it later with needle's lazy mode; say what each design makes
# easy and hard; explain why a re-runnable static graph needs every gradient to be a graph op
#
# **Run time:** about 8 s on a 2-core x86-64 machine
# **Student mode:** with `NEEDLE_IMPL=path/to/hwN/python` (your own needle), the cells marked
# companion-only are skipped: the re-runnable static graph of section 3 and exercises 10.3-10.4
# use `backward(create_graph=True)`, which the course's `Tensor` does not have.
#
# The same two-layer network, $\ell(\mathrm{softmax}(\mathrm{ReLU}(XW_1 + b_1)W_2 + b_2), y)$, is
# written three times:
#
# 1. **Layers with forward and backward** (Caffe, 2014): each layer stores what its backward
#    needs and turns the gradient of its output into the gradient of its input and parameters.
#    No automatic differentiation; the network is a list of layers.
# 2. **Define, then run** (TensorFlow 1.x, 2015): the program first *declares* a graph with
#    placeholders for data; a separate call *runs* it on fed values. Needle has this mode:
#    with `needle.autograd.LAZY_MODE = True` ops record nodes without computing them, and
#    `realize_cached_data()` computes.
# 3. **Define by run** (PyTorch, needle's default): the graph is recorded while ordinary Python
#    computes the values; `backward()` walks it.
#
# All three must give the same gradients; the notebook asserts it against the Caffe-style version,
# which is plain numpy in float64 and shares no code with needle.

# %% tags=["remove-cell"] cellView="form" jupyter={"source_hidden": true}
#@title Colab set-up: in Colab this installs needle (2-3 minutes); elsewhere it does nothing
import os, shlex, subprocess, sys, tempfile; repo = os.environ.get("NEEDLE_COLAB_REPO", "https://github.com/needle-companion/needle-companion")
if "google.colab" in sys.modules or os.environ.get("NEEDLE_COLAB_SIMULATE") == "1":  # companion/colab_setup.py
    py, src, q = sys.executable, os.path.join(tempfile.gettempdir(), "needle-companion"), shlex.quote
    done = subprocess.run(f"{q(py)} -m companion.colab_setup --status 2>/dev/null || {{ {{ test -d {q(src)} || git clone -q --depth=1 {q(repo)} {q(src)}; }} && cd {q(src)} && {q(py)} -m companion.colab_setup --install {q(repo)} --cwd {q(os.getcwd())}; }}", shell=True, capture_output=True, text=True); print(done.stdout + done.stderr[-3000:], end=""); assert done.returncode == 0, f"the set-up could not install this project from {repo} (what failed is above)"

# %%
import numpy as np
from sklearn.datasets import load_digits

import needle as ndl
import needle.nn as nn
from needle import autograd
from companion import lecture
from companion.viz import draw_graph
from needle.autograd import Tensor, TensorOp

np.set_printoptions(precision=4, suppress=True)
np.random.seed(0)
lecture.setup()  # with NEEDLE_IMPL: cells marked "# companion-only" print a skip line
device = ndl.cpu()

# %% [markdown]
# The data are 32 of scikit-learn's 8 × 8 handwritten digits (64 features, 10 classes, scaled to
# $[0, 1]$), and a second batch of 32 used later to re-run a graph. The parameters come from a
# needle model, so all three versions start from the same numbers.

# %%
digits = load_digits()
X_all = (digits.data / 16.0).astype(np.float32)
y_all = digits.target.astype(np.int64)
X1, y1 = X_all[:32], y_all[:32]
X2, y2 = X_all[32:64], y_all[32:64]
N, D, H, K = 32, 64, 16, 10

model = nn.Sequential(nn.Linear(D, H, device=device), nn.ReLU(), nn.Linear(H, K, device=device))
W1, b1, W2, b2 = model.parameters()
params0 = [p.numpy().astype(np.float64) for p in (W1, b1, W2, b2)]
print([p.shape for p in params0])

# %% [markdown]
# ## 1. Layers with forward and backward (Caffe style)
#
# A Caffe layer has `forward(bottom) -> top` and `backward(top_grad) -> bottom_grad`, and keeps its
# parameter gradients. The network is a list; training is "forward through the list, backward
# through it reversed". Each backward is written by hand, once per layer type.
#
# The layers below are a toy version. Real Caffe keeps no *activations* on a layer: the `Net`
# owns every activation blob (an array with its data and its gradient, "diff"), and passes a
# layer its bottom and top blobs in `Forward(bottom, top)` and again in
# `Backward(top, propagate_down, bottom)`. A Caffe layer does own its parameter blobs
# (`Layer::blobs_`) and, in many layers, buffers that its backward reads (Dropout's mask
# `rand_vec_`, max pooling's argmax `max_idx_`, SoftmaxWithLoss's `prob_`). Here each layer
# also stores its input on itself (`self.bottom`), which is shorter and adds to that limit
# (section 4).

# %%
class LinearLayer:
    """top = bottom @ W + b; backward gives d bottom and stores dW, db."""

    def __init__(self, W, b):
        self.W, self.b = W.copy(), b.copy()

    def forward(self, bottom):
        self.bottom = bottom  # kept for backward
        return bottom @ self.W + self.b

    def backward(self, top_grad):
        self.dW = self.bottom.T @ top_grad
        self.db = top_grad.sum(axis=0, keepdims=True)
        return top_grad @ self.W.T


class ReLULayer:
    def forward(self, bottom):
        self.mask = bottom > 0
        return bottom * self.mask

    def backward(self, top_grad):
        return top_grad * self.mask


class SoftmaxLossLayer:
    """Mean cross-entropy of logits against integer labels; backward starts from d loss = 1."""

    def forward(self, logits, labels):
        z = logits - logits.max(axis=1, keepdims=True)
        self.probs = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
        self.labels = labels
        return -np.log(self.probs[np.arange(len(labels)), labels]).mean()

    def backward(self):
        g = self.probs.copy()
        g[np.arange(len(self.labels)), self.labels] -= 1
        return g / len(self.labels)


layers = [LinearLayer(*params0[:2]), ReLULayer(), LinearLayer(*params0[2:])]
loss_layer = SoftmaxLossLayer()


def caffe_step(X, y):
    """Loss and the gradients (dW1, db1, dW2, db2) of the layer list on one batch."""
    out = X.astype(np.float64)
    for layer in layers:
        out = layer.forward(out)
    loss = loss_layer.forward(out, y)
    grad = loss_layer.backward()
    for layer in reversed(layers):
        grad = layer.backward(grad)
    return loss, [layers[0].dW, layers[0].db, layers[2].dW, layers[2].db]


loss_caffe, grads_caffe = caffe_step(X1, y1)
print(f"loss {loss_caffe:.4f}")

# %% [markdown]
# The hand-written backward is checked once against central finite differences on a few entries
# of $W_1$ (in float64 the difference quotient is accurate to about $10^{-8}$).

# %%
def caffe_loss(X, y):
    out = X.astype(np.float64)
    for layer in layers:
        out = layer.forward(out)
    return loss_layer.forward(out, y)


eps = 1e-6
largest = np.argsort(-np.abs(grads_caffe[0]), axis=None)[:3]  # the three largest |dW1| entries
for (i, j) in zip(*np.unravel_index(largest, grads_caffe[0].shape)):
    W = layers[0].W
    W[i, j] += eps
    up = caffe_loss(X1, y1)
    W[i, j] -= 2 * eps
    down = caffe_loss(X1, y1)
    W[i, j] += eps
    fd = (up - down) / (2 * eps)
    diff = abs(fd - grads_caffe[0][i, j])
    print(f"dW1[{i},{j}]: backward {grads_caffe[0][i, j]:+.6f}, |backward - finite difference| "
          + ("below 1e-7" if diff < 1e-7 else f"= {diff:.1e}"))
    assert diff < 1e-7

# %% [markdown]
# ## 2. Define by run (PyTorch, needle)
#
# The forward pass is ordinary Python; each op computes its value at once and records a node.
# `backward()` walks the recorded graph in reverse topological order. Drawn below, every node of
# the forward graph already has its value (its shape is printed in the box); nothing had to be
# "run". The inputs are on the left; yellow leaves are the parameters (leaves with
# `requires_grad`), grey leaves constants. The labels enter as a constant too: `nn.SoftmaxLoss`
# turns them into a one-hot matrix (`init.one_hot`) when it is called, a fresh leaf holding this
# batch's values. That is fine for one step, and it is one more reason why a graph meant to be
# re-fed with new batches cannot use `nn.SoftmaxLoss` as it is.

# %%
x1 = Tensor(X1, device=device, requires_grad=False)
t1 = Tensor(y1.astype(np.float32), device=device, requires_grad=False)
loss = nn.SoftmaxLoss()(model(x1), t1)
loss.backward()
grads_eager = [p.grad.numpy() for p in (W1, b1, W2, b2)]
print(f"loss {float(loss.numpy()):.4f}")


def max_rel_err(a_list, b_list):
    """Largest |a - b| / max|b| over the four gradients."""
    return max(float(np.abs(a - b).max() / np.abs(b).max()) for a, b in zip(a_list, b_list))


def show(err):
    """An error for printing: float32 rounding noise is shown as a bound, not as digits."""
    return "below 1e-5 (float32 rounding)" if err < 1e-5 else f"{err:.1e}"


err_eager = max_rel_err(grads_eager, grads_caffe)
print(f"define-by-run vs layers: max relative gradient difference {show(err_eager)}")
assert abs(float(loss.numpy()) - loss_caffe) < 1e-5
assert err_eager < 1e-5
names = {"X": x1, "W1": W1, "b1": b1, "W2": W2, "b2": b2, "loss": loss}
draw_graph(loss, names=names, grads=False, title="define by run: the graph of one step, computed")

# %% [markdown]
# ## 3. Define, then run (TensorFlow 1.x style, needle's lazy mode)
#
# With `LAZY_MODE` on, ops build nodes whose `cached_data` is `None`: the program is now a
# *description* of the computation. That description can be inspected (and, in a real
# static-graph system, optimized: fused, placed on devices, memory-planned) before any number is
# computed.
#
# One catch shows at once: `nn.Linear.forward` reads `out.shape` to match its bias to it, and in
# needle a node's shape is the shape of its computed array, so reading it computes the node. A
# static-graph library needs *shape inference* separate from computation (TensorFlow infers
# every node's shape when the node is declared). `nn.SoftmaxLoss` has the same catch: it checks
# `logits.shape` against the labels when it is called, which computes the whole forward graph.
# Here the forward pass is written with the shapes spelled out, and the loss with graph ops only
# (log-sum-exp of the logits minus the logit of the target, the target given as a one-hot
# placeholder), so nothing is computed while the graph is defined.

# %%
def forward(x, relu=ndl.ops.relu):
    """The logits (N, K) of the two-layer model, with every shape given explicitly."""
    return relu(x @ W1 + b1.broadcast_to((N, H))) @ W2 + b2.broadcast_to((N, K))


def softmax_loss(z, y_hot):
    """Mean cross-entropy of logits z (N, K) against one-hot labels y_hot, in graph ops only."""
    return (ndl.ops.logsumexp(z, axes=(1,)).sum() - (z * y_hot).sum()) / N


def one_hot(y):
    return np.eye(K, dtype=np.float32)[y]


for p in (W1, b1, W2, b2):
    p.grad = None
autograd.LAZY_MODE = True
try:  # define: placeholders for the data, then the loss
    x_ph = Tensor(X1, device=device, requires_grad=False)
    y_ph = Tensor(one_hot(y1), device=device, requires_grad=False)
    loss_lazy = softmax_loss(forward(x_ph), y_ph)
finally:
    autograd.LAZY_MODE = False
nodes = autograd.find_topo_sort([loss_lazy])
pending = [n for n in nodes if n.cached_data is None]
print(f"{len(nodes)} nodes, {len(pending)} not computed yet:")
print(" -> ".join(type(n.op).__name__ for n in pending))
assert len(pending) == sum(n.op is not None for n in nodes) > 0  # every op node waits
names = {"X": x_ph, "y one-hot": y_ph, "W1": W1, "b1": b1, "W2": W2, "b2": b2, "loss": loss_lazy}
draw_graph(loss_lazy, names=names, grads=False, title="define, then run: defined, not yet run")

# %% [markdown]
# The drawing shows the program before it runs: the leaves hold data, every op says "not
# computed". Running it means asking for a value: `realize_cached_data()` computes the loss and,
# recursively, every node it needs. The backward pass then extends the graph. Unlike the
# forward pass, it cannot be *defined* without computing in needle: `backward()` makes its seed
# with the loss's shape, and several gradients read their inputs' shapes (`BroadcastTo`,
# `Summation`, `MatMul`) or values (`ReLU`), and in needle reading a node's shape computes it.
# The re-runnable graph below counts how much of the two graphs is computed while they are
# built.
#
# For contrast, calling `nn.SoftmaxLoss` on a lazy graph computes it on the spot:

# %%
autograd.LAZY_MODE = True
try:
    logits_probe = forward(x_ph)
    computed_before = sum(n.cached_data is not None for n in autograd.find_topo_sort([logits_probe]))
    nn.SoftmaxLoss()(logits_probe, t1)  # checks logits.shape: computes the logits
    computed_after = sum(n.cached_data is not None for n in autograd.find_topo_sort([logits_probe]))
finally:
    autograd.LAZY_MODE = False
total = len(autograd.find_topo_sort([logits_probe]))
print(f"nodes of the logits' graph with a value: {computed_before} of {total} before calling "
      f"nn.SoftmaxLoss, {computed_after} of {total} after")
assert computed_after == total > computed_before

# %%
autograd.LAZY_MODE = True
try:  # run: realize the loss, then differentiate
    loss_lazy.realize_cached_data()
    loss_lazy.backward()
finally:
    autograd.LAZY_MODE = False
grads_lazy = [p.grad.numpy() for p in (W1, b1, W2, b2)]
err_lazy = max_rel_err(grads_lazy, grads_caffe)
print(f"define-then-run vs layers: max relative gradient difference {show(err_lazy)}")
assert err_lazy < 1e-5

# %% [markdown]
# ### Re-running one graph on new data
#
# The point of a static graph is to build it *once*, with the backward pass as more graph, and
# then run it for every batch by feeding new values into the placeholders. Below, `run` does
# that: it clears every computed node, puts the fed arrays into the placeholder leaves, and
# realizes the requested outputs.
#
# The loss is the graph-op `softmax_loss` above, with the labels as a one-hot placeholder, so
# labels are data too. The gradient graph is built once by `backward(create_graph=True)`: each
# `.grad` is a graph node rather than a number (needle's default, as in the course; the keyword
# only says so). It is built in lazy mode too: in eager mode needle folds every node that needs
# no gradient into a constant (for example $X^\top$ in $\partial\ell/\partial W_1 = X^\top G$),
# which is right for one step and wrong for a graph meant to be re-fed. Lazy mode does not mean
# nothing is computed, though: needle has no shape inference, so building the gradient graph
# computes the forward pass and most of the backward pass once (the first printed line below
# counts them). What makes the graph static is that `run` clears every computed node and
# recomputes it from the fed placeholders, so those first values are thrown away.

# %%
# companion-only: backward(create_graph=True) (gradients as graph nodes)
def run(fetches, feeds):
    """Clear every computed node reachable from ``fetches``, set the placeholder leaves in
    ``feeds`` (a dict leaf -> numpy array), and return the realized fetches as numpy arrays."""
    for node in autograd.find_topo_sort(fetches):
        if node.op is not None:
            node.cached_data = None
    for leaf, value in feeds.items():
        leaf.cached_data = Tensor(value, device=device).realize_cached_data()
    return [f.realize_cached_data().numpy() for f in fetches]


def build_graph(relu):
    """Placeholders, the loss graph and its gradient graph for the model with ``relu``."""
    for p in (W1, b1, W2, b2):
        p.grad = None
    autograd.LAZY_MODE = True
    try:
        x = Tensor(X1, device=device, requires_grad=False)
        y_hot = Tensor(one_hot(y1), device=device, requires_grad=False)
        loss = softmax_loss(forward(x, relu), y_hot)
        loss.backward(create_graph=True)  # the gradients are graph nodes
    finally:
        autograd.LAZY_MODE = False
    grads = [p.grad for p in (W1, b1, W2, b2)]
    for p in (W1, b1, W2, b2):
        p.grad = None
    return x, y_hot, loss, grads


def computed_ops(nodes):
    """(op nodes among ``nodes`` that hold a value, op nodes among them)."""
    ops_nodes = [n for n in nodes if n.op is not None]
    return sum(n.cached_data is not None for n in ops_nodes), len(ops_nodes)


x_ph, y_ph, loss_node, grad_nodes = build_graph(ndl.ops.relu)
forward_nodes = autograd.find_topo_sort([loss_node])
in_forward = {id(n) for n in forward_nodes}
gradient_nodes = [n for n in autograd.find_topo_sort(grad_nodes) if id(n) not in in_forward]
(fwd_done, fwd_total), (grad_done, grad_total) = (computed_ops(forward_nodes),
                                                  computed_ops(gradient_nodes))
print(f"after build_graph, before any run: forward ops computed {fwd_done} of {fwd_total}, "
      f"gradient-graph ops computed {grad_done} of {grad_total}")
assert fwd_done == fwd_total and grad_done > grad_total // 2
_, grads_caffe2 = caffe_step(X2, y2)
first = run(grad_nodes, {x_ph: X1, y_ph: one_hot(y1)})
second = run(grad_nodes, {x_ph: X2, y_ph: one_hot(y2)})
print(f"batch 1 through the graph vs layers: {show(max_rel_err(first, grads_caffe))}")
print(f"batch 2 through the same graph vs layers: {show(max_rel_err(second, grads_caffe2))}")
assert max_rel_err(first, grads_caffe) < 1e-5
assert max_rel_err(second, grads_caffe2) > 1e-2


def relu_gradient_graph(relu, title):
    """The graph of sum(relu(X W)) and of dW, built in lazy mode: small enough to read."""
    autograd.LAZY_MODE = True
    try:
        x = Tensor(X1[:4, :3], device=device, requires_grad=False)
        w = Tensor(params0[0][:3, :2].astype(np.float32), device=device)
        out = relu(x @ w).sum()
        out.backward(create_graph=True)
    finally:
        autograd.LAZY_MODE = False
    return draw_graph(out, names={"X": x, "W": w, "out": out}, title=title)


relu_gradient_graph(ndl.ops.relu, "sum(relu(X W)) and its gradient, with needle's ReLU")

# %% [markdown]
# The first batch is right and the second is **wrong**. Needle's `ReLU.gradient` is written for
# define-by-run: it reads the value of its node *while the backward graph is being built* and
# stores the mask $[x > 0]$ as a constant leaf. The drawing shows the pattern on a graph small
# enough to read, $\sum \mathrm{ReLU}(XW)$ and its gradient (every box shows a shape: building
# the gradient graph computed its nodes, as counted above): the mask is the grey (4, 2)
# constant that feeds the backward pass's multiplication, and no edge leads to it from the
# forward graph. Re-running the graph recomputes every node but
# not that constant, so batch 2 is differentiated with batch 1's mask. In define-by-run this is
# correct and cheap, since the graph is rebuilt for every batch.
#
# A static-graph library must write every gradient as an op of the graph, as TensorFlow's
# `ReluGrad(gradients, features)` is. The same fix in needle is two small ops:

# %%
# companion-only: build_graph and run of the companion-only cell above (backward(create_graph=True))
class ReLUGrad(TensorOp):
    """out_grad · [a > 0], with ``a`` an input of the graph (not a snapshot of its value)."""

    def compute(self, out_grad, a):
        return out_grad * (a > 0)

    def gradient(self, out_grad, node):
        raise NotImplementedError("no second derivative is needed here")


class GraphReLU(TensorOp):
    """max(a, 0) whose gradient is the graph op ReLUGrad(out_grad, a)."""

    def compute(self, a):
        return a.maximum(0)

    def gradient(self, out_grad, node):
        return ReLUGrad()(out_grad, node.inputs[0])


x_ph, y_ph, loss_node, grad_nodes = build_graph(lambda a: GraphReLU()(a))
first = run(grad_nodes, {x_ph: X1, y_ph: one_hot(y1)})
second = run(grad_nodes, {x_ph: X2, y_ph: one_hot(y2)})
third = run([loss_node] + grad_nodes, {x_ph: X1, y_ph: one_hot(y1)})
err_static = max(max_rel_err(first, grads_caffe), max_rel_err(second, grads_caffe2),
                 max_rel_err(third[1:], grads_caffe))
print(f"static graph, three runs on two batches vs layers: {show(err_static)}")
print(f"loss of batch 1 from the static graph {float(third[0]):.4f} (layers {loss_caffe:.4f})")
assert err_static < 1e-5
assert abs(float(third[0]) - loss_caffe) < 1e-5
relu_gradient_graph(lambda a: GraphReLU()(a), "the same graph with GraphReLU")

# %% [markdown]
# In the drawing the mask constant is gone: `ReLUGrad` takes the ReLU's input through an edge
# of the graph, so every run recomputes it. All three designs now give the same gradients on both
# batches, within float32 rounding of the float64 layer version.
#
# ## 4. What each design makes easy and hard
#
# | | layers + hand backward (Caffe) | define, then run (TF 1.x) | define by run (PyTorch, needle) |
# | --- | --- | --- | --- |
# | new layer | write forward **and** backward | write the forward as graph ops (backward derived) | write the forward in Python (backward derived) |
# | gradient of a gradient | not available | yes, if gradients are graph ops | yes (`backward()` records the gradients' graph) |
# | control flow depending on data | fixed network | special graph ops (`tf.cond`, `tf.while_loop`) | plain Python `if` / `for` |
# | debugging | inspect a layer's arrays | values exist only inside `run` | print any tensor at any line |
# | whole-program optimization | none across layers | yes: the graph is known before it runs (fusion, memory planning, placement) | only what is traced or compiled (notebook 13) |
# | per-step overhead | low | low (graph built once) | Python builds the graph every step |
#
# The section above shows one hard part of define-then-run that the table hides: every gradient
# must be a pure function of graph values. Caffe's layers avoid the question: each backward is
# written by hand against the blobs of its own forward run, and there is no gradient graph to
# re-run. (This notebook's toy layers keep their input on the layer object, so one object can be
# used only once per forward pass: a second use would overwrite `self.bottom`. Real Caffe passes
# Net-owned activation blobs to `Forward` and `Backward`, but its layers keep buffers of their
# own forward run (Dropout's mask, max pooling's argmax), so a Caffe layer cannot be run twice
# per pass either: a layer appears once in a Caffe net, and reusing weights means two layers
# that share a parameter blob by name.) Define-by-run avoids the question by rebuilding the
# graph every step, at the cost of Python overhead per op (measured in notebook 06's step
# profile). Modern systems mix the two by *capturing* a graph from a Python program and
# compiling it: PyTorch 2's `torch.compile` reads the Python bytecode (TorchDynamo) and falls
# back to ordinary Python at the "graph breaks" it cannot capture; JAX's `jit` traces a pure
# function with abstract values (JAX differentiates functions, `grad(f)`, rather than recording
# a tape as needle does).
#
# **The rest of lecture 7.** Its second half draws the components a library is built from,
# around the autograd engine: modules, loss functions, optimizers, initialisation, and the data
# loader with its transforms. Notebook 03 builds the first four for needle (`nn.Module` and how
# it finds parameters, `SoftmaxLoss` as a module, `SGD` updating outside the graph, Kaiming
# initialisation), and notebook 04 the rest (`Dataset`, transforms and `DataLoader`, `Adam`, and
# weight decay as an optimizer option next to the same penalty written as a loss term).

# %% [markdown]
# ## Exercises
#
# Each exercise has a cell to fill in (it starts as `raise NotImplementedError`) and a check
# cell that says whether your answer is right: "not answered yet", "correct", or "not yet"
# with what differs. The first cell below gathers everything the exercises use, so this
# section also runs on its own after a kernel restart. Reference answers are in
# `notebooks/solutions/10_nn_abstractions.py`; try first.

# %% tags=["exercise-setup"]
import numpy as np

import needle as ndl
from needle import autograd
from needle.autograd import Tensor
from companion.check.exercises import central_difference, check_exercise

rng = np.random.default_rng(0)
bottom_ex = rng.standard_normal((4, 5))        # a layer's input (float64, as in section 1)
top_grad_ex = rng.standard_normal((4, 5))      # the gradient arriving at its output
X_ex = rng.standard_normal((6, 5))
W_ex = rng.standard_normal((5, 5)) / 2
G_ex = rng.standard_normal((6, 5))
Xa_ex, Xb_ex = rng.standard_normal((6, 5)), rng.standard_normal((6, 5))  # two batches
W1_ex, b1_ex = rng.standard_normal((5, 4)), rng.standard_normal((1, 4))
W2_ex, G2_ex = rng.standard_normal((4, 3)), rng.standard_normal((6, 3))


def tensor(a, requires_grad=False):
    return Tensor(np.asarray(a, dtype=np.float32), requires_grad=requires_grad)


def static_relu_graph_dW1(batches):
    """dW1 of sum((relu(X W1 + b1) W2) * G2) from ONE graph built in lazy mode (with needle's
    ReLU) on batches[0], then re-run on each batch by feeding the placeholder X."""
    W1, b1, W2 = (tensor(p, requires_grad=True) for p in (W1_ex, b1_ex, W2_ex))
    autograd.LAZY_MODE = True
    try:
        x = tensor(batches[0])
        z = ndl.ops.relu(x @ W1 + b1.broadcast_to((6, 4))) @ W2
        (z * tensor(G2_ex)).sum().backward(create_graph=True)
    finally:
        autograd.LAZY_MODE = False
    results = []
    for batch in batches:
        for node in autograd.find_topo_sort([W1.grad]):
            if node.op is not None:
                node.cached_data = None
        x.cached_data = tensor(batch).realize_cached_data()
        results.append(W1.grad.realize_cached_data().numpy().astype(np.float64))
    return results


# %% [markdown]
# **Exercise 10.1 (a hand-written backward).** A Caffe-style `TanhLayer` has
# `forward(bottom) = tanh(bottom)`. Write its `backward`: the gradient with respect to `bottom`
# given `top_grad`, the gradient of the loss with respect to its output. The check compares it
# with central finite differences of $\sum \tanh(\text{bottom}) \cdot \text{top\_grad}$ in
# float64.

# %% tags=["exercise-stub"]
def tanh_backward(bottom, top_grad):
    """d loss / d bottom for top = tanh(bottom), given top_grad = d loss / d top."""
    raise NotImplementedError


# %% tags=["exercise-check"]
check_exercise("10.1 tanh_backward", lambda: tanh_backward(bottom_ex, top_grad_ex),
               central_difference(lambda b: np.sum(np.tanh(b) * top_grad_ex), bottom_ex),
               rtol=1e-6, atol=1e-8)

# %% [markdown]
# **Exercise 10.2 (a layer used twice).** With tied weights, $Y = (X W) W$: the same
# parameter is used by two layers. This notebook's toy `LinearLayer` object could not be used
# twice (its second forward overwrites `self.bottom`); real Caffe stores no input on a layer, but
# its net also lists each layer once, so tied weights are two layers sharing the parameter blob
# $W$ by name, and the gradient of $W$ is the sum of theirs. Write $\partial \ell / \partial W$ for
# $\ell = \sum Y \odot G$. The check runs needle's define-by-run `backward()`, which adds the
# two contributions by itself.

# %% tags=["exercise-stub"]
def tied_weight_gradient(X, W, G):
    """d/dW of sum(((X @ W) @ W) * G)."""
    raise NotImplementedError


# %% tags=["exercise-check"]
def _needle_tied_gradient():
    W = tensor(W_ex, requires_grad=True)
    ((tensor(X_ex) @ W @ W) * tensor(G_ex)).sum().backward()
    return W.grad.numpy()


check_exercise("10.2 tied_weight_gradient", lambda: tied_weight_gradient(X_ex, W_ex, G_ex),
               _needle_tied_gradient(), rtol=1e-4, atol=1e-5)

# %% [markdown]
# **Exercise 10.3 (predict the stale mask).** Section 3 built one static graph with needle's
# `ReLU` and found its gradient wrong on the second batch. Predict *exactly* what it gives:
# for $\ell = \sum (\mathrm{ReLU}(X W_1 + b_1) W_2) \odot G_2$, a graph built on batch
# `X_old` and re-run on batch `X_new` returns some $\partial \ell / \partial W_1$. Write that
# (wrong) result in numpy. The check builds such a graph in lazy mode and runs it on both
# batches: with `X_new = X_old` your function must give the right gradient too.

# %% tags=["exercise-stub"]
def stale_relu_dW1(X_new, X_old, W1, b1, W2, G2):
    """The dW1 that a graph built on X_old (needle's ReLU) gives when re-run on X_new."""
    raise NotImplementedError


# %% tags=["exercise-check"]
# companion-only: backward(create_graph=True) (the check re-runs a static gradient graph)
check_exercise("10.3 stale_relu_dW1",
               lambda: [stale_relu_dW1(X, Xa_ex, W1_ex, b1_ex, W2_ex, G2_ex)
                        for X in (Xa_ex, Xb_ex)],
               static_relu_graph_dW1([Xa_ex, Xb_ex]), rtol=1e-4, atol=1e-5)

# %% [markdown]
# **Exercise 10.4 (a gradient of a gradient).** Because needle's gradients of `mul` and `exp`
# are graph ops, `backward(create_graph=True)` makes `x.grad` a node that can itself be
# differentiated. Use it: with needle, compute $f''(x_0)$ for $f(x) = x^2 e^{-x}$ (set
# `x.grad = None` before the second `backward()`). The check compares with the second central
# difference of $f$ in float64.

# %% tags=["exercise-stub"]
def second_derivative(x0):
    """f''(x0) for f(x) = x² exp(-x), by two backward passes in needle."""
    raise NotImplementedError


# %% tags=["exercise-check"]
# companion-only: backward(create_graph=True) (the answer differentiates a gradient)
def _f(x):
    return x * x * np.exp(-x)


_h = 1e-4
check_exercise("10.4 second_derivative", lambda: [float(second_derivative(x)) for x in (0.7, 3.0)],
               [(_f(x + _h) - 2 * _f(x) + _f(x - _h)) / _h**2 for x in (0.7, 3.0)],
               rtol=1e-4, atol=1e-6)
