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
# # 03 · NN Library Implementation
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/needle-companion/needle-companion/blob/main/notebooks/03_nn_library.ipynb)
#
# **Lecture:** 8, "NN Library Implementation" (numbered 9 in the current schedule), with the
# initialisation part of lecture 6, "Fully Connected Networks, Optimization, Initialization",
# and the module and optimizer abstractions of lecture 7, "Neural Network Library Abstractions"
#
# **Homework:** hw2 Q1 (weight initialisation), Q2 (`nn.Module`, `Linear`, `SoftmaxLoss`),
# Q3 (`SGD`); the `TensorTuple` machinery used by hw4's multi-output ops
#
# **Prerequisites:** notebook 02 (computational graphs, `backward()`); the softmax loss of
# notebook 01
#
# **You will be able to:** write a `Module` whose parameters an optimizer can find (and know
# when a walker misses or repeats one); run the training-loop contract (clear, forward,
# backward, update) and predict what `.grad` holds at each point; update parameters outside
# the graph without aliasing surprises; compute softmax and cross-entropy stably and say what
# they return for NaN and infinite logits; pick an initialisation scale from the fan-in; build
# an op with several outputs
#
# **Run time:** about 20 s on a 2-core x86-64 machine
#
# **Student mode:** with `NEEDLE_IMPL=path/to/hwN/python` (your own needle), the cells marked
# companion-only are skipped: they use `retain_grad()`, which the course's `Tensor` does not
# have (its `backward()` keeps every node's gradient instead), this project's `.data` setter
# checks (the course's checks only the dtype), or the node-by-node structure of this project's
# gradients.
#
# Automatic differentiation (notebook 02) gives us gradients of any expression; a *library*
# adds the structure around it:
#
# 1. **modules** hold **parameters** and compose into models, and the library must *find* every
#    parameter to hand it to an optimizer (`Module.parameters()`);
# 2. the **training loop** and what `.grad` holds at each of its steps;
# 3. the **optimizer** updates parameters *outside* the computational graph (`.data`);
# 4. numerically careful building blocks: a **stable softmax** and cross-entropy;
# 5. **initialisation** that keeps activations at a sane scale through many layers (Kaiming);
# 6. ops with **multiple outputs** (`TensorTuple`).
#
# Every number stated in the text is asserted in the code cell that follows it.

# %% tags=["remove-cell"] cellView="form" jupyter={"source_hidden": true}
#@title Colab set-up: in Colab this installs needle (2-3 minutes); elsewhere it does nothing
import os, shlex, subprocess, sys, tempfile; repo = os.environ.get("NEEDLE_COLAB_REPO", "https://github.com/needle-companion/needle-companion")
if "google.colab" in sys.modules or os.environ.get("NEEDLE_COLAB_SIMULATE") == "1":  # companion/colab_setup.py
    py, src, q = sys.executable, os.path.join(tempfile.gettempdir(), "needle-companion"), shlex.quote
    done = subprocess.run(f"{q(py)} -m companion.colab_setup --status 2>/dev/null || {{ {{ test -d {q(src)} || git clone -q --depth=1 {q(repo)} {q(src)}; }} && cd {q(src)} && {q(py)} -m companion.colab_setup --install {q(repo)} --cwd {q(os.getcwd())}; }}", shell=True, capture_output=True, text=True); print(done.stdout + done.stderr[-3000:], end=""); assert done.returncode == 0, f"the set-up could not install this project from {repo} (what failed is above)"

# %%
import gc

import matplotlib.pyplot as plt
import numpy as np

import needle as ndl
from needle import init, nn, optim
from companion import lecture
from companion.viz import save_figure

np.random.seed(0)
lecture.setup()  # with NEEDLE_IMPL: cells marked "# companion-only" print a skip line
# the compiled CPU backend when it is built, else needle's numpy device
device = ndl.cpu() if ndl.cpu().enabled() else ndl.cpu_numpy()
print("backend:", ndl.BACKEND, "| device:", device)

# %% [markdown]
# ## 1. Modules and parameters: `ScaleAdd`
#
# A module is a function with state. The smallest interesting one is
#
# $$f(x; s, b) = x\cdot s + b$$
#
# with two trainable scalars. Trainable tensors are `nn.Parameter`s (a `Tensor` subclass), so the
# library can tell them apart from other tensors a module keeps (a running mean, say).
#
# Stretching a `(1,)` parameter to `x`'s shape is itself an op, `broadcast_to`, whose gradient
# **sums** over the copies. In this project element-wise ops also broadcast by numpy's rules and
# sum each gradient back to its input's shape, so `x * self.s` would work here. In the course's
# needle it does not: the NDArray backend refuses two arrays of unequal shapes, and on the numpy
# backend `EWiseMul`'s gradient comes back with `x`'s shape instead of `s`'s (the classic hw2
# bias-gradient bug). That is why the lecture and hw2 always write the `broadcast_to`, and so do
# we.
#
# A module is called like a function: `Module.__call__` passes its arguments to `forward`, so
# `model(x)` is `model.forward(x)`.

# %%
class ScaleAdd(nn.Module):
    """f(x; s, b) = x * s + b with scalar parameters s and b (shape (1,)); x of any shape."""

    def __init__(self, init_s: float = 1.0, init_b: float = 0.0):
        super().__init__()
        self.s = nn.Parameter([init_s], dtype="float32")
        self.b = nn.Parameter([init_b], dtype="float32")

    def forward(self, x):
        return x * self.s.broadcast_to(x.shape) + self.b.broadcast_to(x.shape)


class MultiPathScaleAdd(nn.Module):
    """h(x) = (x * s0 + b0) + (x * s1 + b1): two independent branches, added."""

    def __init__(self):
        super().__init__()
        self.path0 = ScaleAdd()
        self.path1 = ScaleAdd()

    def forward(self, x):
        return self.path0(x) + self.path1(x)


# %% [markdown]
# The gradient of a broadcast is a sum: for $x = (1, 2, 3)$ and $L = \sum_i f(x)_i$,
# $\partial L/\partial s = \sum_i x_i = 6$ and $\partial L/\partial b = 3$, each of shape `(1,)`
# like the parameter itself.

# %%
sa = ScaleAdd()
sa(ndl.Tensor([1.0, 2.0, 3.0], dtype="float32")).sum().backward()
print(f"dL/ds = {sa.s.grad.numpy()}, dL/db = {sa.b.grad.numpy()}")
assert sa.s.grad.shape == (1,) and sa.s.grad.numpy()[0] == 6 and sa.b.grad.numpy()[0] == 3

# %% [markdown]
# `parameters()` walks the module's attributes **in definition order**, collects every
# `Parameter` and descends into sub-modules. For the two-branch model it finds exactly four
# scalars; `named_parameters()` says where each one lives.

# %%
model = MultiPathScaleAdd()
for name, p in model.named_parameters():
    print(f"{name:8s} shape={p.shape} value={p.numpy()[0]:.2f}")
assert [n for n, _ in model.named_parameters()] == ["path0.s", "path0.b", "path1.s", "path1.b"]
assert len(model.parameters()) == 4


# %% [markdown]
# ### The lecture's walker, and what it misses
#
# The lecture finds parameters with a short recursive walker that knows three kinds of value: a
# `Parameter`, a `dict` (a module's attribute dictionary) and a `Module`. Real models keep layers
# in containers — `Sequential` a tuple, a Transformer a list of blocks — and the walker passes
# over those **silently**. Nothing fails: the model still trains, but the optimizer never sees
# the parameters inside the list, so they never change.

# %%
def lecture_parameters(value):
    """The lecture's walker: Parameters reachable through Modules and dicts (not lists)."""
    if isinstance(value, nn.Parameter):
        return [value]
    if isinstance(value, dict):
        return [p for v in value.values() for p in lecture_parameters(v)]
    if isinstance(value, nn.Module):
        return lecture_parameters(value.__dict__)
    return []


class HeadAndList(nn.Module):
    """g(x) = head(x) + sum of the branches held in a list."""

    def __init__(self):
        super().__init__()
        self.head = ScaleAdd()
        self.paths = [ScaleAdd(), ScaleAdd()]

    def forward(self, x):
        out = self.head(x)
        for p in self.paths:
            out = out + p(x)
        return out


def train_with(param_fn, steps=20):
    """SGD on L = sum((g(x) - t)^2) for x = (1, 2), t = (0, 1); returns (model, losses)."""
    m = HeadAndList()
    opt = optim.SGD(param_fn(m), lr=0.01)
    xb = ndl.Tensor([1.0, 2.0], dtype="float32")
    tb = ndl.Tensor([0.0, 1.0], dtype="float32", requires_grad=False)
    losses = []
    for _ in range(steps):
        opt.reset_grad()
        loss = ((m(xb) - tb) ** 2).sum()
        loss.backward()
        opt.step()
        losses.append(loss.numpy().item())
    return m, losses


m_lec, losses_lec = train_with(lecture_parameters)
m_all, losses_all = train_with(lambda m: m.parameters())
frozen = [float(p.numpy()[0]) for b in m_lec.paths for p in (b.s, b.b)]
print(f"lecture walker: {len(lecture_parameters(m_lec))} parameters, loss "
      f"{losses_lec[0]:.3f} -> {losses_lec[-1]:.3f}, list-held s, b still {frozen}")
print(f"parameters():   {len(m_all.parameters())} parameters, loss "
      f"{losses_all[0]:.3f} -> {losses_all[-1]:.3f}")
assert len(lecture_parameters(m_lec)) == 2 and len(m_all.parameters()) == 6
assert losses_lec[-1] < 0.5 * losses_lec[0]          # it trains ...
assert frozen == [1.0, 0.0, 1.0, 0.0]                 # ... but the list's parameters never move
assert losses_all[-1] < losses_lec[-1]                # training all six fits better

# %% [markdown]
# The course's hw2 `Module` (its `_unpack_params`) already searches **lists, tuples and
# dicts** as well as attributes and sub-modules; only the lecture's short walker skips them. So
# does this project's `parameters()` (in index / insertion order, nested to any depth), and it
# adds what the homework does not need: `named_parameters()` (names use the index or the dict
# key), each shared parameter listed once, sets refused, and optimizers that refuse a list with
# a duplicate.

# %%
class Branches(nn.Module):
    """Sum of the branches held in a list, tuple or dict."""

    def __init__(self, container):
        super().__init__()
        self.paths = container

    def forward(self, x):
        paths = self.paths.values() if isinstance(self.paths, dict) else self.paths
        out = None
        for p in paths:
            out = p(x) if out is None else out + p(x)
        return out


for container in ([ScaleAdd(), ScaleAdd()], (ScaleAdd(), ScaleAdd()),
                  {"left": ScaleAdd(), "right": ScaleAdd()}):
    names = [n for n, _ in Branches(container).named_parameters()]
    print(f"{type(container).__name__:5s}: {len(names)} parameters {names}")
    assert len(names) == 4

# %% [markdown]
# A **set** has no stable iteration order (it depends on object addresses), so the parameter
# list — and with it the pairing of optimizer state and tensors — could change from run to run.
# needle refuses it and says why.

# %%
try:
    Branches({ScaleAdd(), ScaleAdd()}).parameters()
    raise AssertionError("a set of modules was accepted")
except TypeError as err:
    print("TypeError:", err)
    assert "stable order" in str(err)

# %% [markdown]
# ### The shape contract of `Linear`, and which dimension is fan-in
#
# The lecture writes a linear layer as $Y = XW^\top + b$ with $W$ of shape
# (out_features, in_features), as PyTorch stores it. needle's `nn.Linear` (like the homework's)
# stores the transpose, **(in_features, out_features)** = (fan_in, fan_out), and computes
# $Y = XW + b$ with no transpose. Same function, other layout: the fan-in, the number of inputs
# each output sums over, is `weight.shape[0]` in needle and `weight.shape[1]` in PyTorch.
# Kaiming's scale comes from the fan-in: `Linear(400, 100)` draws its weights with variance
# $2/400$, not $2/100$.

# %%
lin = nn.Linear(400, 100, device=device)
Xl = np.random.randn(8, 400).astype(np.float32)
Yl = lin(ndl.Tensor(Xl, device=device)).numpy()
W_np, b_np = lin.weight.numpy(), lin.bias.numpy()
print(f"weight {lin.weight.shape}, bias {lin.bias.shape}, output {Yl.shape}; "
      f"Var(W) = {W_np.var():.5f} (2/fan_in = {2 / 400:.5f}, 2/fan_out = {2 / 100:.5f})")
assert lin.weight.shape == (400, 100) and lin.bias.shape == (1, 100)
assert np.allclose(Yl, Xl @ W_np + b_np, atol=1e-4)          # Y = X W + b
assert abs(W_np.var() / (2 / 400) - 1) < 0.05
# The layout, read off the layer's responses: input i alone (a one-hot row) produces row i of
# the weight (plus the bias), so rows are inputs and columns outputs: (in, out).
responses = lin(ndl.Tensor(np.eye(400, dtype=np.float32), device=device)).numpy() - b_np
assert np.allclose(responses, W_np, atol=1e-6)
print("the response to input i alone (minus the bias) is row i of weight, for all 400 inputs")


# %% [markdown]
# ## 2. One training step by hand
#
# Take $x = 2$, target $t = 2$, $s_0 = s_1 = 1$, $b_0 = b_1 = 0$ and the *unnormalised* loss
# $L = (h - t)^2$. Then
#
# $$h = 2\cdot 1 + 0 + 2\cdot 1 + 0 = 4,\qquad L = (4-2)^2 = 4,\qquad
#   \frac{\partial L}{\partial h} = 2(h - t) = 4,$$
#
# $$\frac{\partial L}{\partial s_j} = \frac{\partial L}{\partial h}\,x = 8,\qquad
#   \frac{\partial L}{\partial b_j} = \frac{\partial L}{\partial h} = 4,\qquad
#   \frac{\partial L}{\partial x} = \frac{\partial L}{\partial h}(s_0 + s_1) = 8.$$
#
# `backward()` stores gradients on **leaves** (parameters, inputs). The course's needle stores
# one on every node, interior ones such as $h$ included; this project keeps an interior adjoint
# only when asked with `h.retain_grad()` before `backward()` (PyTorch's rule, an extension).
# The others are not freed by that: under the default `backward()` they live on as inputs of
# the leaves' gradient graphs (section 6's figure shows $\bar u$ as an input of $x$'s `.grad`);
# only `backward(create_graph=False)` frees each one once it has been used (notebook 02).
# $\partial L/\partial h$ needs neither: it is the
# gradient of the loss with respect to its input, so evaluate the loss on a leaf holding $h$'s
# value.

# %%
class L2Loss(nn.Module):
    """Unnormalised squared error: sum((h - t)^2), a scalar."""

    def forward(self, h, t):
        d = h - t
        return (d * d).sum()


x = ndl.Tensor([2.0], dtype="float32")
t = ndl.Tensor([2.0], dtype="float32", requires_grad=False)

# %%
model = MultiPathScaleAdd()
h = model(x)
loss = L2Loss()(h, t)
loss.backward()
h_leaf = ndl.Tensor(h.numpy(), dtype="float32")   # the loss's input as a leaf
L2Loss()(h_leaf, t).backward()
print(f"h = {h.numpy()[0]:.2f}, L = {loss.numpy().item():.2f}, dL/dh = {h_leaf.grad.numpy()[0]:.2f}")
for name, p in model.named_parameters():
    print(f"dL/d{name} = {p.grad.numpy()[0]:.2f}")
print(f"dL/dx = {x.grad.numpy()[0]:.2f}")
assert h.numpy()[0] == 4 and loss.numpy().item() == 4 and h_leaf.grad.numpy()[0] == 4
assert [p.grad.numpy()[0] for p in model.parameters()] == [8, 4, 8, 4]
assert x.grad.numpy()[0] == 8

# %% [markdown]
# With `retain_grad()` $h$ keeps its own adjoint, the same 4; the difference $h - t$, which
# nobody asked for, keeps none (on the course's needle it would).

# %%
# companion-only: retain_grad() and this project's rule that only leaves and retained nodes keep .grad
h = MultiPathScaleAdd()(x)
h.retain_grad()
loss_r = L2Loss()(h, t)
loss_r.backward()
print(f"dL/dh = {h.grad.numpy()[0]:.2f}; the difference h - t kept no gradient: "
      f"{loss_r.inputs[0].inputs[0].grad}")
assert h.grad.numpy()[0] == 4 and loss_r.inputs[0].inputs[0].grad is None

# %% [markdown]
# ### The all-ones seed
#
# `backward()` on a non-scalar starts from an all-ones adjoint, so it differentiates the **sum**
# of the entries. An element-wise L2 loss $(h_i - t_i)^2$ without the `.sum()` therefore gives
# the same gradients as the summed loss: the sum is implied. A different seed $v$ differentiates
# $\sum_i v_i L_i$: with $v = (1, 0, 0)$ only the first example counts.

# %%
xs3 = ndl.Tensor([1.0, 2.0, 3.0], dtype="float32")
ts3 = ndl.Tensor([0.0, 0.0, 0.0], dtype="float32", requires_grad=False)


def grads_after(backward_call):
    """Gradients of (s0, b0, s1, b1) of a fresh model after backward_call(per-example loss)."""
    m = MultiPathScaleAdd()
    d = m(xs3) - ts3
    backward_call(d * d)
    return [float(p.grad.numpy()[0]) for p in m.parameters()]


g_elementwise = grads_after(lambda L: L.backward())
g_summed = grads_after(lambda L: L.sum().backward())
g_first = grads_after(lambda L: L.backward(ndl.Tensor([1.0, 0.0, 0.0], dtype="float32")))
print("element-wise loss, backward():      ", g_elementwise)
print("loss.sum().backward():              ", g_summed)
print("backward(out_grad=(1, 0, 0)):       ", g_first)
# by hand: h_i = 2 x_i, dL_i/ds_j = 2 h_i x_i = 4 x_i^2, dL_i/db_j = 4 x_i
assert g_elementwise == g_summed == [4 * 14.0, 4 * 6.0] * 2
assert g_first == [4.0, 4.0] * 2

# %% [markdown]
# ### One SGD step
#
# The optimizer only needs the parameter list. Plain SGD, $\theta \leftarrow \theta -
# \eta\,\partial L/\partial\theta$ with $\eta = 0.01$, written as the lecture does:
# $s_j = 1 - 0.01\cdot 8 = 0.92$ and $b_j = 0 - 0.01\cdot 4 = -0.04$. The next forward pass gives
# $h = 2(2\cdot 0.92 - 0.04) = 3.60$ and $L = 1.6^2 = 2.56$: the loss went down.

# %%
class PlainSGD(optim.Optimizer):
    """theta <- theta - lr * grad, updating through .data (see section 3)."""

    def __init__(self, params, lr: float):
        super().__init__(params)
        self.lr = lr

    def step(self):
        for w in self.params:
            w.data = w.data + (-self.lr) * w.grad.data


PlainSGD(model.parameters(), lr=0.01).step()
h2 = model(x)
loss2 = L2Loss()(h2, t)
for name, p in model.named_parameters():
    print(f"{name} = {p.numpy()[0]:.4f}")
print(f"h = {h2.numpy()[0]:.4f}, L = {loss2.numpy().item():.4f}")
assert all(abs(model.parameters()[i].numpy()[0] - 0.92) < 1e-6 for i in (0, 2))
assert all(abs(model.parameters()[i].numpy()[0] + 0.04) < 1e-6 for i in (1, 3))
assert abs(h2.numpy()[0] - 3.60) < 1e-6 and abs(loss2.numpy().item() - 2.56) < 1e-5


# %% [markdown]
# `needle.optim.SGD` with its default `momentum=0` is exactly this rule. The numbers depend on
# how the loss is *normalised*, because the gradient scales with the loss:
#
# * $L = \tfrac12(h-t)^2$ halves every gradient ($\partial L/\partial s_j = 4$): one step gives
#   $s_j = 0.96$, $b_j = -0.02$ and $h = 3.80$;
# * a **batch** of four copies of $x = 2$ with the *summed* loss ($L = 16$) has four times the
#   gradient ($\partial L/\partial s_j = 32$, so $s_j = 0.68$ after one step), while the batch
#   **mean** ($L = 4$) gives back the single-example numbers — which is why losses are averaged:
#   the step size then does not depend on the batch size.

# %%
def one_step(loss_fn, xs):
    """One optim.SGD step (lr 0.01) on a fresh model; returns the numbers of interest."""
    m = MultiPathScaleAdd()
    xb = ndl.Tensor(xs, dtype="float32")
    tb = ndl.Tensor([2.0] * len(xs), dtype="float32", requires_grad=False)
    L = loss_fn(m(xb), tb)
    L.backward()
    ds = m.path0.s.grad.numpy()[0]
    optim.SGD(m.parameters(), lr=0.01).step()
    h_new = m(ndl.Tensor([2.0], dtype="float32")).numpy()[0]
    return L.numpy().item(), ds, m.path0.s.numpy()[0], m.path0.b.numpy()[0], h_new


variants = {
    "(h-t)^2, one x": (lambda h, t: ((h - t) ** 2).sum(), [2.0]),
    "1/2 (h-t)^2, one x": (lambda h, t: ((h - t) ** 2).sum() / 2, [2.0]),
    "sum over batch of 4": (lambda h, t: ((h - t) ** 2).sum(), [2.0] * 4),
    "mean over batch of 4": (lambda h, t: ((h - t) ** 2).sum() / 4, [2.0] * 4),
}
results = {}
print(f"{'loss':22s} {'L':>6s} {'dL/ds':>6s} {'s_new':>6s} {'b_new':>6s} {'h_new':>6s}")
for label, (fn, xs) in variants.items():
    results[label] = one_step(fn, xs)
    print(f"{label:22s} " + " ".join(f"{v:6.2f}" for v in results[label]))

expected = {"(h-t)^2, one x": (4, 8, 0.92, -0.04, 3.60),
            "1/2 (h-t)^2, one x": (2, 4, 0.96, -0.02, 3.80),
            "sum over batch of 4": (16, 32, 0.68, -0.16, 2.40),
            "mean over batch of 4": (4, 8, 0.92, -0.04, 3.60)}
for label, values in expected.items():
    assert np.allclose(results[label], values, atol=1e-5), label

# %% [markdown]
# ### The training-loop contract: clear, forward, backward, update
#
# Every training step does four things in this order:
#
# ```python
# opt.reset_grad()        # clear: every parameter's .grad = None
# loss = loss_fn(model(X), y)   # forward: builds this step's graph
# loss.backward()         # backward: stores d loss / d parameter in each .grad
# opt.step()              # update: reads .grad, writes the parameters
# ```
#
# Why the clearing matters depends on what `backward()` does to an existing `.grad`. needle
# **overwrites** it (PyTorch adds to it): calling `backward()` twice leaves the gradient of one
# backward, not twice that.

# %%
m = MultiPathScaleAdd()
L2Loss()(m(x), t).backward()
first = m.path0.s.grad.numpy()[0]
L2Loss()(m(x), t).backward()
print(f"dL/ds0 after one backward {first:.1f}, after a second one {m.path0.s.grad.numpy()[0]:.1f}")
assert first == 8 and m.path0.s.grad.numpy()[0] == 8  # overwritten, not 16

# %% [markdown]
# Overwriting does not make clearing unnecessary. A parameter that the current step does **not
# use** gets no new gradient, so it keeps the **stale** one from the last step that used it,
# and an optimizer that finds a `.grad` applies it again. Below, step 1 uses both branches and
# step 2 only `path0` (a model that routes examples, or a layer frozen by a flag, does this).
# Without `reset_grad()`, `path1.s` moves in step 2 although the loss does not depend on it.

# %%
def two_steps(clear: bool):
    """Step 1 trains both branches, step 2 only path0; returns path1.s after each step."""
    m = MultiPathScaleAdd()
    opt = optim.SGD(m.parameters(), lr=0.01)
    s1 = []
    for use_both in (True, False):
        if clear:
            opt.reset_grad()
        h = m(x) if use_both else m.path0(x)
        L2Loss()(h, t).backward()
        opt.step()
        s1.append(m.path1.s.numpy()[0])
    return s1


stale, cleared = two_steps(clear=False), two_steps(clear=True)
print(f"path1.s after steps 1, 2 without clearing: {stale[0]:.4f}, {stale[1]:.4f}")
print(f"path1.s after steps 1, 2 with reset_grad():  {cleared[0]:.4f}, {cleared[1]:.4f}")
assert abs(stale[0] - 0.92) < 1e-6 and abs(stale[1] - 0.84) < 1e-6  # the stale 8 applied twice
assert cleared[1] == cleared[0]                                      # unused: unchanged

# %% [markdown]
# ### Clearing is not detaching
#
# Two different operations are easy to confuse:
#
# * **clearing** (`opt.reset_grad()`, `p.grad = None`) forgets a stored gradient; the graph and
#   the parameter are untouched;
# * **detaching** (`v.detach()`, or `v.data`) makes a new leaf with the same values and no
#   history: gradients stop there. It is how a value crosses from one step to the next without
#   dragging the old graph along (notebook 08 detaches the RNN state between chunks).
#
# With $y = (s\,x)\cdot x$, differentiating through $u = s\,x$ gives $\partial y/\partial s =
# x^2 = 4$; with $u$ detached, $y$ no longer depends on $s$ at all.

# %%
s = nn.Parameter([1.0], dtype="float32")
u = s * x
(u * x).sum().backward()
through = s.grad.numpy()[0]
s.grad = None                                 # clearing: the graph u -> s is still there
assert u.inputs[0] is s
u_detached = u.detach()                       # detaching: a new leaf, no inputs
(u_detached * x).sum().backward()
print(f"dy/ds through u = {through:.1f}; through u.detach(): s.grad = {s.grad}, "
      f"u_detached is a leaf: {u_detached.is_leaf()}, requires_grad={u_detached.requires_grad}")
assert through == 4 and s.grad is None and u_detached.is_leaf() and not u_detached.requires_grad

# %% [markdown]
# ### Two deliberate exceptions to the contract
#
# **Gradient accumulation.** When a batch does not fit in memory, split it into micro-batches,
# add their gradients, and step once. Because needle overwrites `.grad`, the sum is kept
# explicitly. With a mean loss, the average of the two half-batch gradients equals the
# full-batch gradient.

# %%
xb4 = np.array([0.5, 1.0, 1.5, 2.0], dtype=np.float32)
tb4 = np.array([1.0, 0.0, 2.0, 3.0], dtype=np.float32)


def mean_l2(m, xv, tv):
    d = m(ndl.Tensor(xv, dtype="float32")) - ndl.Tensor(tv, dtype="float32", requires_grad=False)
    return (d * d).sum() / len(xv)


m_full, m_acc = MultiPathScaleAdd(), MultiPathScaleAdd()
mean_l2(m_full, xb4, tb4).backward()

total = [np.zeros(1, dtype=np.float32) for _ in m_acc.parameters()]
for part in (slice(0, 2), slice(2, 4)):          # two micro-batches of 2
    mean_l2(m_acc, xb4[part], tb4[part]).backward()
    total = [acc + p.grad.numpy() for acc, p in zip(total, m_acc.parameters())]
for p, acc in zip(m_acc.parameters(), total):    # hand the optimizer the average
    p.grad = ndl.Tensor(acc / 2, dtype="float32", requires_grad=False)

full = [p.grad.numpy()[0] for p in m_full.parameters()]
accumulated = [p.grad.numpy()[0] for p in m_acc.parameters()]
print("full batch:  ", np.round(full, 5))
print("accumulated: ", np.round(accumulated, 5))
assert np.allclose(full, accumulated, atol=1e-5)

# %% [markdown]
# **Differentiating through an update.** `backward()` records the gradient's own graph (the
# course's design: reverse mode extends the graph), so `w.grad` is a function of `w`. An update
# written with ordinary ops, `w1 = w - eta * w.grad`, therefore lets a later `backward()`
# differentiate *through* the update, which some methods (meta-learning, hyper-parameter
# gradients) want. Going through `.data` (`w.grad.data`, same values, no history) holds the
# gradient constant instead, which is what a training step means. For $L(w) = \tfrac12 w^2$ and
# one step $w_1 = w - \eta\,L'(w) = (1-\eta)w$:
#
# $$\frac{d}{dw} L(w_1) = (1-\eta)^2 w \quad\text{(through the update)},\qquad
#   \frac{\partial}{\partial w} L(w - \eta\,g)\Big|_{g\ \text{constant}} = (1-\eta)w .$$
#
# At $w = 2$, $\eta = 0.5$: $0.5$ through the update, $1$ with the gradient held constant.

# %%
def grad_after_update(hold_gradient_constant: bool, w0=2.0, eta=0.5):
    w = ndl.Tensor([w0], dtype="float32")
    (w * w / 2).sum().backward()
    g = w.grad.data if hold_gradient_constant else w.grad
    w1 = w - g * eta                 # the update, written with graph-tracked ops on purpose
    (w1 * w1 / 2).sum().backward()
    return w.grad.numpy()[0]


meta, plain = grad_after_update(False), grad_after_update(True)
print(f"d L(w1) / dw: through the update {meta:.3f}, gradient held constant {plain:.3f}")
assert abs(meta - (1 - 0.5) ** 2 * 2.0) < 1e-6 and abs(plain - (1 - 0.5) * 2.0) < 1e-6

# %% [markdown]
# ### A shared parameter is found once
#
# Tie the two scales together: `path1.s` *is* `path0.s`. Now $h = x\cdot s + b_0 + x\cdot s +
# b_1$ has three parameters. Autograd already sums the contributions of both uses, so
# $\partial L/\partial s = 8 + 8 = 16$ and one SGD step gives $s = 1 - 0.16 = 0.84$.
# `parameters()` compares parameters by identity and lists `s` once.

# %%
tied = MultiPathScaleAdd()
tied.path1.s = tied.path0.s
print([n for n, _ in tied.named_parameters()])
assert [n for n, _ in tied.named_parameters()] == ["path0.s", "path0.b", "path1.b"]

L2Loss()(tied(x), t).backward()
print(f"dL/ds = {tied.path0.s.grad.numpy()[0]:.2f}")
optim.SGD(tied.parameters(), lr=0.01).step()
print(f"s after one step = {tied.path0.s.numpy()[0]:.4f}")
assert tied.path0.s.grad.numpy()[0] == 16
assert abs(tied.path0.s.numpy()[0] - 0.84) < 1e-6


# %% [markdown]
# The lecture's walker has a second blind spot: it lists `s` once per attribute that holds it,
# here twice. An optimizer looping over that list applies the already-summed gradient
# **twice**: $s = 1 - 2\cdot 0.16 = 0.68$. needle's optimizers refuse such a list.

# %%
tied = MultiPathScaleAdd()
tied.path1.s = tied.path0.s
L2Loss()(tied(x), t).backward()
walked = lecture_parameters(tied)
print(f"lecture walker: {len(walked)} entries, {len({id(p) for p in walked})} distinct tensors")
for w in walked:  # a plain SGD loop over that list
    w.data = w.data - 0.01 * w.grad.data
print(f"s after 'one' step = {tied.path0.s.numpy()[0]:.4f}")
assert len(walked) == 4 and abs(tied.path0.s.numpy()[0] - 0.68) < 1e-6

try:
    optim.SGD(walked, lr=0.01)
    raise AssertionError("a duplicated parameter list was accepted")
except ValueError as err:
    print("ValueError:", err)

# %% [markdown]
# ### Backprop follows the ops, not the modules
#
# Modules are a way to *organise* parameters; the graph that `backward()` walks contains only
# tensors and ops. The same function written as one flat module with four parameters builds the
# same sequence of ops and gets the same gradients as the nested two-branch model.

# %%
class FlatScaleAdd(nn.Module):
    """h(x) = (x * s0 + b0) + (x * s1 + b1) with all four parameters in one module."""

    def __init__(self):
        super().__init__()
        self.s0 = nn.Parameter([1.0], dtype="float32")
        self.b0 = nn.Parameter([0.0], dtype="float32")
        self.s1 = nn.Parameter([1.0], dtype="float32")
        self.b1 = nn.Parameter([0.0], dtype="float32")

    def forward(self, x):
        s0, b0, s1, b1 = (p.broadcast_to(x.shape) for p in (self.s0, self.b0, self.s1, self.b1))
        return (x * s0 + b0) + (x * s1 + b1)


def op_sequence(loss):
    return [type(n.op).__name__ if n.op is not None else "leaf"
            for n in ndl.autograd.find_topo_sort([loss])]


nested, flat = MultiPathScaleAdd(), FlatScaleAdd()
L_nested, L_flat = L2Loss()(nested(x), t), L2Loss()(flat(x), t)
L_nested.backward()
L_flat.backward()
print(" -> ".join(op_sequence(L_nested)))
assert op_sequence(L_nested) == op_sequence(L_flat)
assert [p.grad.numpy()[0] for p in nested.parameters()] == \
       [p.grad.numpy()[0] for p in flat.parameters()]

# %% [markdown]
# Drawn, the graph of $h = (x s_0 + b_0) + (x s_1 + b_1)$ shows the two branches as two chains
# of ops that meet only at the last addition; no box says "module". `draw_graph` (from
# `companion.viz`) puts the inputs on the left, one box per node with its op and shape. Given
# the gradients of $x$, $b_0$ and $b_1$ after `backward()`, it also draws the nodes that the
# backward pass added for them (red) and outlines each `.grad` ($s_0$'s and $s_1$'s, two more
# products, are left out so that the branches stay readable): $x$ is used by both branches,
# so its gradient is the sum (`EWiseAdd`) of two products, one per branch. In this project
# $b_0$ and $b_1$ pass the all-ones seed through unchanged (a `broadcast_to` that changes no
# shape returns its adjoint as it is), so both keep that one constant node as their `.grad`. The course's `BroadcastTo.gradient` sums and reshapes
# even then, so on a course needle each bias gets nodes of its own; the values are the same.

# %%
from companion.viz import draw_graph

x_draw = ndl.Tensor([2.0], dtype="float32")
branches = MultiPathScaleAdd()
h_draw = branches(x_draw)
h_draw.backward()
p0, p1 = branches.path0, branches.path1
assert x_draw.grad.numpy()[0] == 2 and p0.s.grad.numpy()[0] == 2 and p1.b.grad.numpy()[0] == 1
draw_graph(h_draw, names={"x": x_draw, "s0": p0.s, "b0": p0.b, "s1": p1.s, "b1": p1.b,
                          "h": h_draw},
           grads={x_draw: x_draw.grad, p0.b: p0.b.grad, p1.b: p1.b.grad},
           title="ScaleAdd's two branches, and what backward() added for x, b0 and b1")

# %%
# companion-only: the node structure of this project's gradients (an identity broadcast_to passes its adjoint on)
assert type(x_draw.grad.op).__name__ == "EWiseAdd"
assert [type(i.op).__name__ for i in x_draw.grad.inputs] == ["EWiseMul", "EWiseMul"]
assert p0.b.grad is p1.b.grad and p0.b.grad.op is None  # one constant node: the seed
print("x.grad = EWiseAdd(EWiseMul, EWiseMul); b0.grad is b1.grad, one constant node (the seed)")

# %% [markdown]
# ## 3. The update boundary
#
# The update $\theta \leftarrow \theta - \eta\nabla_\theta L$ is *not* part of the model.
# Written with ordinary tensor ops, `w = w - lr * w.grad` makes the new `w` an op output whose
# input is the old `w`, itself the output of the previous update: every step hangs the whole
# chain of earlier updates off the next one. (After the first such update `w` is not even a leaf
# any more: a first hint that this is not how updates are meant to be written. This project then
# keeps its gradient only when asked with `retain_grad()`; the course's needle keeps every
# node's, so `keep_grad` below does nothing there.) Count the nodes reachable from `w` and the
# live tensors (`autograd.TENSOR_COUNTER`, incremented when a Value is created and decremented
# when it is freed):

# %%
def keep_grad(v):
    """Keep v's adjoint after backward(): retain_grad() here, nothing to do on the course's
    needle (which keeps every node's)."""
    if hasattr(v, "retain_grad"):
        v.retain_grad()


def live_tensors():
    gc.collect()
    return ndl.autograd.TENSOR_COUNTER


def graph_size(v):
    return len(ndl.autograd.find_topo_sort([v]))


w = ndl.Tensor([1.0, -2.0, 3.0], dtype="float32")
start = live_tensors()
tracked_sizes, tracked_live = [], []
for step in range(1, 6):
    keep_grad(w)
    loss = (w * w).sum()
    loss.backward()
    w = w - w.grad * 0.1  # graph-tracked update
    tracked_sizes.append(graph_size(w))
    tracked_live.append(live_tensors() - start)
    print(f"step {step}: graph behind w has {tracked_sizes[-1]:3d} nodes, "
          f"{tracked_live[-1]:3d} more live tensors than at the start")
w_tracked = w.numpy()
assert all(b > a for a, b in zip(tracked_sizes, tracked_sizes[1:]))
assert all(b > a for a, b in zip(tracked_live, tracked_live[1:]))

# %% [markdown]
# Updating through `.data` swaps the array inside the same leaf tensor, recording nothing:
# `w` stays a one-node graph and the number of live tensors stays flat. The values are the same.

# %%
w = ndl.Tensor([1.0, -2.0, 3.0], dtype="float32")
loss = None
start = live_tensors()
counts = []
for step in range(1, 6):
    loss = (w * w).sum()
    loss.backward()
    w.data = w.data - w.grad.data * 0.1  # outside the graph
    counts.append(live_tensors() - start)
    print(f"step {step}: graph behind w has {graph_size(w):3d} nodes, "
          f"{counts[-1]:3d} more live tensors than at the start")
assert graph_size(w) == 1 and w.is_leaf() and len(set(counts)) == 1
assert np.allclose(w.numpy(), w_tracked)
print("values:", np.array2string(w.numpy(), precision=5))
assert np.allclose(w.numpy(), np.array([1.0, -2.0, 3.0]) * 0.8 ** 5)

# %% [markdown]
# ### `.data` shares the array, and the optimizer replaces it
#
# `w.data` is a new tensor *without history* but with the **same array** as `w`. The optimizer's
# update, as the course writes it, is `w.data = new value`: the setter gives `w` a *new* array
# and leaves the old one alone. So a tensor taken before a step (`w.data`, `w.detach()`, or
# `ndl.Tensor(w)`, which also shares the array) keeps the old values after it: it works as a
# snapshot, because nothing writes a parameter's array in place. An update written in place
# would move every such alias with it, and a "best weights" copy kept this way would silently
# follow training; that is why needle's optimizers, fused kernels and all, assign a new array.

# %%
p = nn.Parameter(np.array([1.0, -2.0, 3.0], dtype=np.float32), device=device)
alias = p.data                             # shares p's array (for now)
opt = optim.SGD([p], lr=0.1)
opt.reset_grad()
(p * p).sum().backward()                   # gradient 2p
opt.step()                                 # p.data = p - 0.1 * 2p = 0.8 p: a new array
print("p after the step:", p.numpy())
print("alias:           ", alias.numpy())
assert np.allclose(p.numpy(), 0.8 * np.array([1.0, -2.0, 3.0]))
assert np.array_equal(alias.numpy(), [1.0, -2.0, 3.0])   # the old array, untouched
assert alias.is_leaf() and not alias.requires_grad


# %% [markdown]
# The `.data` setter is a boundary. The course's setter checks only the dtype (the homework's
# code says a complete update interface should also enforce a compatible shape and device), so
# on a course needle `w.data = short_tensor` quietly changes `w`'s shape. This project's setter
# checks all three: the new array must have this tensor's dtype, shape (up to size-1
# dimensions, so a `(n,)` vector may fill a `(1, n)` bias) and device. (On the NDArray backend
# every array is float32, so a float64 tensor cannot even be built; on the numpy backend the
# setter itself rejects it.)

# %%
# companion-only: this project's .data setter checks shape and device (the course's checks only the dtype)
def show_error(fn):
    """Run fn, print the exception it raises, and return it (fail if it raises none)."""
    try:
        fn()
    except (TypeError, ValueError) as err:
        print(f"{type(err).__name__}: {err}")
        return err
    raise AssertionError("no exception was raised")


w = ndl.Tensor([1.0, 2.0, 3.0], dtype="float32")
short = ndl.Tensor([1.0, 2.0], dtype="float32")
assert "shape" in str(show_error(lambda: setattr(w, "data", short)))
if ndl.BACKEND == "nd":
    assert "float32" in str(show_error(lambda: ndl.Tensor([1.0, 2.0, 3.0], dtype="float64")))
    other = ndl.cpu() if w.device != ndl.cpu() else ndl.cpu_numpy()
    elsewhere = ndl.Tensor([1.0, 2.0, 3.0], dtype="float32", device=other)
    err = show_error(lambda: setattr(w, "data", elsewhere))
    assert "device" in str(err)
else:
    err = show_error(lambda: setattr(w, "data", ndl.Tensor(np.zeros(3, dtype=np.float64))))
    assert "dtype" in str(err)
w.data = ndl.Tensor([[4.0, 5.0, 6.0]], dtype="float32")  # (1, 3) into (3,): accepted
print(w.shape, w.numpy())
assert w.shape == (3,)

# %% [markdown]
# ## 4. A numerically stable softmax
#
# $\mathrm{softmax}(z)_i = e^{z_i} / \sum_j e^{z_j}$. In float32, $e^{z}$ overflows to `inf` once
# $z > \ln(3.4\cdot10^{38}) \approx 88.7$. For the logits $z = [100, 100, 101]$ the naive formula
# computes $\infty/\infty = $ NaN.

# %%
z = np.array([100.0, 100.0, 101.0], dtype=np.float32)
with np.errstate(over="ignore", invalid="ignore"):
    e = np.exp(z)
    naive = e / e.sum()
print("exp(z)        =", e)
print("naive softmax =", naive)
assert np.isinf(e).all() and np.isnan(naive).all()

# %% [markdown]
# Softmax does not change when a constant is subtracted from every logit, since the factor
# $e^{-c}$ cancels. With $c = \max_j z_j$ the largest exponent is $e^0 = 1$ and nothing
# overflows: the exponentials are $[e^{-1}, e^{-1}, e^0] = [0.36788, 0.36788, 1]$, and the
# softmax is $[0.36788, 0.36788, 1]/(1 + 2e^{-1}) = [0.21194, 0.21194, 0.57612]$. needle's
# `logsoftmax` (and `logsumexp`) do this shift internally.

# %%
shifted = np.exp(z - z.max())
stable = shifted / shifted.sum()
print("exp(z - max z) =", np.array2string(shifted, precision=5))
print("stable softmax =", np.array2string(stable, precision=5))
assert np.allclose(shifted, [0.36788, 0.36788, 1.0], atol=5e-6)
assert np.allclose(stable, [0.21194, 0.21194, 0.57612], atol=5e-6)

Z = ndl.Tensor(z.reshape(1, 3), device=device)
from_needle = ndl.exp(ndl.logsoftmax(Z)).numpy()[0]
print("exp(ndl.logsoftmax(z)) =", np.array2string(from_needle, precision=5))
assert np.allclose(from_needle, stable, atol=1e-6)
assert abs(ndl.logsumexp(Z, axes=(1,)).numpy()[0] - (101 + np.log1p(2 * np.exp(-1)))) < 1e-4

# %% [markdown]
# With a **batch**, the shift must be the maximum of each **row**. One global maximum is not
# enough: the second row below ($[-50, -50, -49]$, whose softmax is again
# $[0.21194, 0.21194, 0.57612]$) is shifted by $101$, every $e^{z-101}$ underflows to $0$, and
# the row becomes $0/0$.

# %%
Zb = np.array([[100.0, 100.0, 101.0], [-50.0, -50.0, -49.0]], dtype=np.float32)
with np.errstate(invalid="ignore"):
    g = np.exp(Zb - Zb.max())
    global_max = g / g.sum(axis=1, keepdims=True)
r = np.exp(Zb - Zb.max(axis=1, keepdims=True))
row_max = r / r.sum(axis=1, keepdims=True)
print("global max:\n", np.array2string(global_max, precision=5))
print("row max:\n", np.array2string(row_max, precision=5))
assert np.isnan(global_max[1]).all() and np.allclose(global_max[0], stable)
assert np.allclose(row_max, [stable, stable], atol=1e-6)
assert np.allclose(ndl.exp(ndl.logsoftmax(ndl.Tensor(Zb, device=device))).numpy(), row_max,
                   atol=1e-6)

# %% [markdown]
# The **log**-softmax needs the same care. For $z = [0, -1000]$, $\log\mathrm{softmax}(z) =
# z - \mathrm{logsumexp}(z) = [0, -1000]$ (up to $e^{-1000}$). Computing the softmax first
# rounds $e^{-1000}$ to $0$, and $\log 0 = -\infty$.

# %%
z2 = ndl.Tensor([[0.0, -1000.0]], device=device)
log_sm = ndl.logsoftmax(z2).numpy()[0]
sm = ndl.exp(ndl.logsoftmax(z2))
with np.errstate(divide="ignore"):
    naive_log = ndl.log(sm).numpy()[0]
print(f"logsoftmax:   [{log_sm[0]:.4f}, {log_sm[1]:.4f}]")
print(f"log(softmax): [{naive_log[0]:.4f}, {naive_log[1]:.4f}]")
assert abs(log_sm[0]) < 1e-6 and abs(log_sm[1] + 1000) < 1e-3
assert naive_log[1] == -np.inf

# %% [markdown]
# ### Non-finite logits
#
# The shift handles large finite logits; what about logits that are not finite? needle follows
# numpy and PyTorch:
#
# * a row with a **NaN** is NaN throughout (softmax and log-softmax): one unknown logit makes
#   every probability unknown;
# * a **−∞** logit is a class with probability exactly 0 (log-probability −∞), and the other
#   classes share the mass as if it were absent: $[-\infty, 0, 1]$ gives
#   $[0, 0.26894, 0.73106]$;
# * a row that is **all −∞** has `logsumexp` $= -\infty$ (the log of an empty sum), and its
#   softmax is $0/0$ = NaN: no class has any mass to share.

# %%
rows = np.array([[0.0, 1.0, np.nan], [-np.inf, 0.0, 1.0], [-np.inf, -np.inf, -np.inf]],
                dtype=np.float32)
Zr = ndl.Tensor(rows, device=device)
with np.errstate(invalid="ignore"):
    lsm = ndl.logsoftmax(Zr).numpy()
    smx = np.exp(lsm)
lse = ndl.logsumexp(Zr, axes=(1,)).numpy()
for name, row_l, row_p, v in zip(["NaN row", "one -inf", "all -inf"], lsm, smx, lse):
    print(f"{name:9s} logsumexp {v:8.4f}  logsoftmax {np.array2string(row_l, precision=5)}"
          f"  softmax {np.array2string(row_p, precision=5)}")
assert np.isnan(lsm[0]).all() and np.isnan(smx[0]).all() and np.isnan(lse[0])
assert lsm[1, 0] == -np.inf and smx[1, 0] == 0
assert np.allclose(smx[1, 1:], np.exp([0.0, 1.0]) / np.exp([0.0, 1.0]).sum(), atol=1e-6)
assert lse[2] == -np.inf and np.isnan(smx[2]).all()

# %% [markdown]
# ### Cross-entropy and its gradient
#
# Cross-entropy $\ell(z, y) = \mathrm{logsumexp}(z) - z_y$ is built from the stable pieces, and
# its gradient is the famous $\partial\ell/\partial z = \mathrm{softmax}(z) - e_y$ (one-hot
# $e_y$). `nn.SoftmaxLoss` averages over the batch, so for one example its gradient is exactly
# that; we check it against the formula and against central finite differences of a float64
# numpy loss.

# %%
zc = np.random.randn(1, 5).astype(np.float32)
yc = np.array([3])
zt = ndl.Tensor(zc, device=device)
nn.SoftmaxLoss()(zt, ndl.Tensor(yc, device=device, requires_grad=False)).backward()


def ce64(v):
    return np.log(np.exp(v - v.max()).sum()) + v.max() - v[0, yc[0]]


eps = 1e-6
fd = np.zeros((1, 5))
for j in range(5):
    d = np.zeros((1, 5))
    d[0, j] = eps
    fd[0, j] = (ce64(zc.astype(np.float64) + d) - ce64(zc.astype(np.float64) - d)) / (2 * eps)
p = np.exp(zc - zc.max()) / np.exp(zc - zc.max()).sum()
formula = p - np.eye(5)[yc]
print("needle grad      :", np.array2string(zt.grad.numpy()[0], precision=4))
print("softmax - one-hot:", np.array2string(formula[0], precision=4))
assert np.abs(zt.grad.numpy() - formula).max() < 1e-6
assert np.abs(zt.grad.numpy() - fd).max() < 1e-5
print("max |needle - finite differences| < 1e-5; the gradient's entries sum to "
      f"{abs(zt.grad.numpy().sum()):.4f} (softmax sums to 1, the one-hot to 1)")

# %% [markdown]
# The same rule, with an axis, is hw2's `LogSumExp` gradient. For $s = \mathrm{logsumexp}(Z)$
# over axis 1 of a matrix, $\partial s_i / \partial Z_{ij} = \mathrm{softmax}(Z_i)_j$, so the
# adjoint of $Z$ is the softmax of each row times that row's $\bar s_i$: the `out_grad` of shape
# (rows,) must be reshaped to (rows, 1) and broadcast back along the reduced axis before the
# product. Getting that reshape wrong (broadcasting a (rows,) vector along the wrong axis) is
# the usual hw2 bug; a non-square $Z$ shows it.

# %%
rng_lse = np.random.default_rng(3)  # its own generator: later cells' draws stay as they were
Zs = rng_lse.standard_normal((3, 4)).astype(np.float32)
gs = rng_lse.standard_normal(3).astype(np.float32)
Zst = ndl.Tensor(Zs, device=device)
ndl.logsumexp(Zst, axes=(1,)).backward(ndl.Tensor(gs, device=device))
soft = np.exp(Zs - Zs.max(1, keepdims=True))
soft /= soft.sum(1, keepdims=True)
assert np.abs(Zst.grad.numpy() - soft * gs[:, None]).max() < 1e-5
print(f"logsumexp over axis 1: Z {Zs.shape}, out_grad {gs.shape}; "
      "Z's adjoint = softmax(Z) * out_grad[:, None] to 1e-5")

# %% [markdown]
# The figure shows both computations on $z = [100, 100, 101]$: the exponentials (left, log
# scale; the naive ones lie above the float32 limit and become `inf`, the shifted ones are
# $e^{-1}$ and $1$) and the resulting probabilities (right; every naive one is NaN).

# %%
fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(9.5, 3.6))
idx = np.arange(3)
ax0.bar(idx - 0.2, np.exp(z.astype(np.float64)), 0.4, label="naive $e^{z_i}$ (exact value)",
        color="tab:red")
ax0.bar(idx + 0.2, shifted, 0.4, label=r"stable $e^{z_i - \max z}$", color="tab:blue")
for i, v in enumerate(shifted):
    ax0.text(i + 0.2, v * 3, f"{v:.3f}", ha="center", fontsize=8)
ax0.axhline(np.finfo(np.float32).max, color="k", ls="--", lw=1, label="float32 max")
ax0.set_yscale("log")
ax0.set_ylim(1e-6, 1e60)
ax0.set_xlim(-0.6, 2.6)
ax0.set_xticks(idx, [f"$z_{i}={v:.0f}$" for i, v in enumerate(z)])
ax0.set_ylabel("value (log scale)")
ax0.set_title("naive exponentials overflow float32")
ax0.legend(fontsize=8, loc="upper left", ncol=2)
ax1.bar(idx + 0.2, stable, 0.4, color="tab:blue", label="stable (shift by max)")
for i, v in enumerate(stable):
    ax1.text(i + 0.2, v + 0.01, f"{v:.5f}", ha="center", fontsize=8)
    ax1.text(i - 0.2, 0.04, "NaN", ha="center", color="tab:red", fontsize=10)
ax1.plot([], [], ls="none", marker="$N$", color="tab:red", label="naive: inf/inf = NaN")
ax1.set_xlim(-0.6, 2.6)
ax1.set_ylim(0, 0.75)
ax1.set_xticks(idx, [f"$z_{i}$" for i in range(3)])
ax1.set_ylabel("probability")
ax1.set_title("softmax([100, 100, 101])")
ax1.legend(fontsize=8, loc="upper left")
fig.tight_layout()
save_figure(fig, "softmax_overflow")

# %% [markdown]
# ## 5. Kaiming initialisation
#
# A linear unit $Y = \sum_{i=1}^{n_{in}} W_i X_i$ with independent zero-mean weights of variance
# $\sigma_w^2$, independent of inputs with second moment $q = \mathbb{E}[X^2]$, has
#
# $$\mathbb{E}[Y^2] = \mathrm{Var}(Y) = n_{in}\, q\, \sigma_w^2 .$$
#
# The next layer's pre-activation $A$ is such a sum, and it is **symmetric about zero** whatever
# the inputs are: the weights are zero-mean, symmetrically distributed and independent of the
# inputs, so flipping the sign of every weight negates $A$ without changing its distribution. A
# ReLU keeps the positive half of a symmetric distribution, so
# $\mathbb{E}[\mathrm{ReLU}(A)^2] = \tfrac12\mathbb{E}[A^2]$. Layer to layer the **second
# moment** of the activations is multiplied by $\tfrac12 n_{in}\sigma_w^2$, which is $1$ exactly
# when
#
# $$\sigma_w^2 = \frac{2}{n_{in}}\qquad\text{(Kaiming / He).}$$
#
# (The second moment, not the variance, is what the argument tracks: after a ReLU the
# activations are not zero-mean, and which fraction of the second moment their variance is
# depends on the shape of the distribution, $1 - 1/\pi$ for a Gaussian pre-activation; only
# the second moment follows a rule that holds for every shape.) The argument is about the
# average over random weights at initialisation, not a guarantee for one draw of the weights
# or for the network once training has moved them (He et al., 2015, §2.2, make the same
# assumptions). First the two facts, by sampling:

# %%
n_in, q, sigma2 = 64, 3.0, 0.05
X = np.random.randn(20000, n_in) * np.sqrt(q)
W = np.random.randn(n_in, 400) * np.sqrt(sigma2)
Y = X @ W
print(f"E[Y^2] = {np.mean(Y ** 2):.2f}   n_in*q*sigma_w^2 = {n_in * q * sigma2:.2f}")
assert abs(np.mean(Y ** 2) / (n_in * q * sigma2) - 1) < 0.03

A = np.random.randn(1_000_000) * 1.7
ratio = np.mean(np.maximum(A, 0) ** 2) / np.mean(A ** 2)
print(f"E[ReLU(A)^2] / E[A^2] = {ratio:.3f}")
assert abs(ratio - 0.5) < 0.005

# %% [markdown]
# Now push one batch through a 50-layer ReLU MLP of width 100, drawing every weight with
# `needle.init` and running the layers with needle ops, for $\sigma_w^2 = 1/n_{in}$,
# $2/n_{in}$ (`init.kaiming_normal`) and $3/n_{in}$. The theory multiplies the second moment
# $\mathbb{E}[X^2]$ by $\tfrac12 n_{in}\sigma_w^2 = \tfrac12,\ 1,\ \tfrac32$ per layer: after
# $l$ layers by $(1/2)^l$, $1$ and $(3/2)^l$ — after 50 layers $(1/2)^{50} \approx
# 9\cdot10^{-16}$ and $(3/2)^{50} \approx 6\cdot10^{8}$. A finite width adds random
# fluctuations, so the measured factors wander from these by up to about ten — nothing next to
# the fifteen and eight orders of magnitude the wrong scales lose or gain (a deeper net, or a
# larger factor, reaches float32's limits).

# %%
def second_moments(weight_fn, depth=50, width=100, batch=256):
    """E[h^2] of the input and of the activations after each layer of a deep ReLU MLP."""
    h = ndl.Tensor(np.random.randn(batch, width).astype(np.float32), device=device,
                   requires_grad=False)
    msq = [np.mean(h.numpy().astype(np.float64) ** 2)]
    for _ in range(depth):
        h = ndl.relu(h @ weight_fn(width))
        msq.append(np.mean(h.numpy().astype(np.float64) ** 2))
    return np.array(msq)


np.random.seed(0)
schemes = {  # sigma_w^2: (weight initialiser, predicted factor per layer)
    "1/n_in": (lambda n: init.randn(n, n, std=np.sqrt(1 / n), device=device), 0.5),
    "2/n_in (Kaiming)": (lambda n: init.kaiming_normal(n, n, device=device), 1.0),
    "3/n_in": (lambda n: init.randn(n, n, std=np.sqrt(3 / n), device=device), 1.5),
}
curves = {}
for label, (fn, factor) in schemes.items():
    msq = second_moments(fn)
    curves[label] = (msq, factor)
    predicted = factor ** 50
    measured = msq[-1] / msq[0]
    print(f"sigma_w^2 = {label:16s} E[X^2] factor over 50 layers: predicted {predicted:.2g}, "
          f"measured {measured:.2g}")
    assert abs(np.log10(measured / predicted)) < 1.0  # within a factor of ten
small, kaiming, large = (m for m, _ in curves.values())
assert small[-1] < 1e-12 and large[-1] > 1e6 and 0.1 < kaiming[-1] / kaiming[0] < 10

# %%
fig, ax = plt.subplots(figsize=(6.5, 3.8))
layers = np.arange(51)
for (label, (msq, factor)), color in zip(curves.items(), ["tab:blue", "tab:green", "tab:red"]):
    math_label = r"$\sigma_w^2$ = " + label.replace("n_in", "$n_{in}$")
    ax.semilogy(layers, msq, label=math_label, color=color)
    ax.semilogy(layers, msq[0] * factor ** layers, ls="--", lw=1, color=color)
ax.plot([], [], "k--", lw=1, label=r"predicted $E[X^2]\,(\frac{1}{2}n_{in}\sigma_w^2)^l$")
ax.set_xlabel("layer $l$")
ax.set_ylabel("second moment $E[h^2]$ (log scale)")
ax.set_title("Only $\\sigma_w^2 = 2/n_{in}$ keeps a 50-layer ReLU net's activations at scale")
ax.legend(fontsize=8)
fig.tight_layout()
save_figure(fig, "kaiming_depth")

# %% [markdown]
# hw2 Q1 asks for four initialisers. The **Xavier** (Glorot) pair aims at a variance of
# $\mathrm{gain}^2 \cdot 2/(n_{in} + n_{out})$, a compromise between keeping the forward
# signal ($1/n_{in}$) and the backward gradient ($1/n_{out}$) at scale in linear or tanh
# layers; the **Kaiming** pair aims at $\mathrm{gain}^2/n_{in}$ with $\mathrm{gain} = \sqrt 2$
# for ReLU, the $2/n_{in}$ above. A uniform distribution on $[-a, a]$ has variance $a^2/3$, so
# the uniform versions use $a = \mathrm{gain}\sqrt{6/(n_{in} + n_{out})}$ and
# $a = \mathrm{gain}\sqrt{3/n_{in}}$, and the normal ones the standard deviations
# $\mathrm{gain}\sqrt{2/(n_{in} + n_{out})}$ and $\mathrm{gain}/\sqrt{n_{in}}$. The `gain`
# argument only scales the result.

# %%
np.random.seed(1)
fan_in, fan_out = 300, 100
print("| initialiser            | bound or std | max abs W | Var(W) | target variance |")
for name, draw, spread, target in [
    ("xavier_uniform gain=2", lambda: init.xavier_uniform(fan_in, fan_out, gain=2.0),
     2 * np.sqrt(6 / (fan_in + fan_out)), 4 * 2 / (fan_in + fan_out)),
    ("xavier_normal gain=2", lambda: init.xavier_normal(fan_in, fan_out, gain=2.0),
     2 * np.sqrt(2 / (fan_in + fan_out)), 4 * 2 / (fan_in + fan_out)),
    ("kaiming_uniform (ReLU)", lambda: init.kaiming_uniform(fan_in, fan_out),
     np.sqrt(2) * np.sqrt(3 / fan_in), 2 / fan_in),
    ("kaiming_normal (ReLU)", lambda: init.kaiming_normal(fan_in, fan_out),
     np.sqrt(2) / np.sqrt(fan_in), 2 / fan_in),
]:
    Wi = draw().numpy().astype(np.float64)
    assert Wi.shape == (fan_in, fan_out) and abs(Wi.var() / target - 1) < 0.05, name
    if "uniform" in name:
        assert np.abs(Wi).max() <= spread * (1 + 1e-6) and np.abs(Wi).max() > 0.99 * spread, name
    print(f"| {name:<22} | {spread:>12.4f} | {np.abs(Wi).max():>9.4f} | {Wi.var():.4f} | "
          f"{target:>15.4f} |")

# %% [markdown]
# ## 6. Ops with several outputs: `TensorTuple`
#
# Some ops return several tensors (`split`; in this project also the fused LSTM cell step's
# `(h, c)`, where hw4's `LSTMCell` returns a plain Python tuple of two tensors). needle gives them a
# `TensorTupleOp` whose output is **one** `TensorTuple` node; `tuple_get_item` (what `out[i]`
# calls) picks a component. The lecture's example is the "fused" op
#
# $$F(x) = (u, v) = (x + 1,\; x + 2).$$
#
# "Fused" here names the **operator abstraction**: one graph node computes several results, so
# the graph has a single op where two `AddScalar`s would otherwise be. It is not a fused
# *kernel* — `compute` still runs two separate additions. (needle also has fused kernels in
# that second sense: `nn.SoftmaxLoss` computes softmax and cross-entropy in one kernel, which
# per row still makes several passes (a maximum, a shifted exponential, a sum, a scale), with
# the same values as the composition of its parts.)
#
# For $L = 3u + 4v$ at $x = 1$: $u = 2$, $v = 3$, $L = 6 + 12 = 18$. The adjoint of the tuple
# node is the pair $(\bar u, \bar v) = (3, 4)$, and the op's gradient sums it:
# $\partial L/\partial x = 3 + 4 = 7$. The tuple node is interior, so we ask it to keep its
# adjoint with `retain_grad()`.

# %%
# companion-only: retain_grad() on a TensorTuple
x = ndl.Tensor([1.0], dtype="float32")
out = ndl.fused_add_scalars(x, 1.0, 2.0)
out.retain_grad()
u, v = out[0], out[1]
L = (u * 3 + v * 4).sum()
L.backward()
print(type(out).__name__, f"u = {u.numpy()[0]:.1f}, v = {v.numpy()[0]:.1f}")
adjoint = (out.grad[0].numpy()[0], out.grad[1].numpy()[0])
print(f"L = {L.numpy().item():.1f}, adjoint of (u, v) = ({adjoint[0]:.1f}, {adjoint[1]:.1f}), "
      f"dL/dx = {x.grad.numpy()[0]:.1f}")
print("graph:", " -> ".join(type(n.op).__name__ if n.op else "leaf"
                            for n in ndl.autograd.find_topo_sort([L])))
assert isinstance(out, ndl.TensorTuple) and len(out) == 2
assert L.numpy().item() == 18 and x.grad.numpy()[0] == 7
assert adjoint == (3, 4)
ops = [type(n.op).__name__ for n in ndl.autograd.find_topo_sort([L]) if n.op is not None]
assert ops.count("FusedAddScalars") == 1 and "AddScalar" not in ops  # one node, two outputs

# %% [markdown]
# Using only the first output, $L = 3u$: `tuple_get_item`'s gradient routes $(\bar u, 0)$ — the
# adjoint for the selected slot and zeros for the other — and $\partial L/\partial x = 3$.

# %%
# companion-only: retain_grad() on a TensorTuple
x = ndl.Tensor([1.0], dtype="float32")
out = ndl.fused_add_scalars(x, 1.0, 2.0)
out.retain_grad()
(out[0] * 3).sum().backward()
routed = (out.grad[0].numpy()[0], out.grad[1].numpy()[0])
print(f"adjoint of (u, v) = ({routed[0]:.1f}, {routed[1]:.1f}), dL/dx = {x.grad.numpy()[0]:.1f}")
assert routed == (3, 0) and x.grad.numpy()[0] == 3

# %% [markdown]
# Why a `TensorTuple` and not a plain Python tuple of tensors? The routing above needs a
# **node**: something with an `op`, `inputs` and an adjoint of its own (the pair), from which
# `tuple_get_item` selects and into which its gradient writes. A Python tuple has none of these
# — autograd could not record it, give it an adjoint, or pass that adjoint to the op's
# `gradient` — so needle refuses one where a tuple node is expected.

# %%
out = ndl.fused_add_scalars(ndl.Tensor([1.0], dtype="float32"), 1.0, 2.0)
plain = (out[0], out[1])
print(f"TensorTuple: a Value {isinstance(out, ndl.autograd.Value)}, op "
      f"{type(out.op).__name__}, {len(out.inputs)} input")
try:
    ndl.tuple_get_item(plain, 0)
    raise AssertionError("a plain tuple was accepted as a tuple node")
except TypeError as err:
    print("TypeError:", err)
assert isinstance(out.op, ndl.ops.FusedAddScalars) and len(out.inputs) == 1
assert not isinstance(plain, ndl.autograd.Value)

# %% [markdown]
# The routing in a picture. With $L = \sum u^2$ for $u$ the first output, the backward pass
# adds nodes for $\bar u = 2u$ (reading the forward node $u$); the routing pairs that adjoint
# with a zero for $v$ (`make_tuple`), and `FusedAddScalars`' gradient adds the pair's two
# components. So $x$'s `.grad` is an `EWiseAdd` whose inputs are $\bar u$ and a constant zero,
# the adjoint routed to the output nobody used. The pair itself does not appear: indexing a
# `make_tuple` node returns the component itself (constant folding), so nothing in the
# gradient's graph refers to it.

# %%
x_tuple = ndl.Tensor([1.0], dtype="float32")
pair = ndl.fused_add_scalars(x_tuple, 1.0, 2.0)
u_first = pair[0]
L_tuple = (u_first * u_first).sum()
L_tuple.backward()
u_bar, zero = x_tuple.grad.inputs
print(f"dL/dx = {x_tuple.grad.numpy()[0]:.1f} = {u_bar.numpy()[0]:.1f} (from u) "
      f"+ {zero.numpy()[0]:.1f} (the zero routed to v)")
assert x_tuple.grad.numpy()[0] == 4 and u_bar.numpy()[0] == 4 and zero.numpy()[0] == 0
assert type(u_bar.op).__name__ == "EWiseAdd" and zero.op is None
draw_graph(L_tuple, names={"x": x_tuple, "(u, v)": pair, "u": u_first, "L": L_tuple,
                           r"$\bar u$": u_bar, "zero for v": zero},
           title="a TensorTuple: the adjoint of u, and a zero for v")

# %% [markdown]
# ## Summary
#
# * `Module.parameters()` finds every `Parameter` through attributes, sub-modules, lists, tuples
#   and dicts, once each; sets are refused and optimizers refuse duplicated lists. The lecture's
#   short walker misses list-held parameters silently and repeats shared ones.
# * `nn.Linear` stores $W$ as (fan_in, fan_out) and computes $XW + b$; the lecture's $XW^\top$
#   is the same map with PyTorch's layout.
# * `backward()` seeds with ones (it differentiates the sum), keeps gradients on leaves (and on
#   nodes that `retain_grad()`; the course's needle keeps every node's), overwrites `.grad`, and
#   records each gradient's graph, so a later `backward()` can differentiate through an update
#   written with ops. The loop is clear, forward, backward, update; skipping the clear lets a
#   stale gradient move an unused parameter.
# * The optimizer updates through `.data`, outside the graph, so memory stays flat; the setter
#   gives the parameter a new array, so what shared the old one keeps the old values.
# * Softmax, log-softmax and cross-entropy subtract the row maximum; NaN rows stay NaN, −∞
#   logits get probability 0; the cross-entropy gradient is softmax minus one-hot.
# * $\sigma_w^2 = 2/n_{in}$ keeps the second moment of ReLU activations constant with depth.
# * Multi-output ops return a `TensorTuple` node; unused outputs receive zero adjoints.

# %% [markdown]
# ## Exercises
#
# Each exercise has a cell to fill in (it starts as `raise NotImplementedError`) and a check
# cell that says whether your answer is right: "not answered yet", "correct", or "not yet"
# with what differs. The first cell below gathers everything the exercises use, so this
# section also runs on its own after a kernel restart. Reference answers are in
# `notebooks/solutions/03_nn_library.py`; try first.

# %% tags=["exercise-setup"]
import numpy as np

import needle as ndl
from needle import nn
from companion.check.exercises import check_exercise

rng = np.random.default_rng(0)
x_ex = (rng.standard_normal((4, 6)) * 3 + 1).astype(np.float32)
batches_ex = [(rng.standard_normal((5, 3)) + i).astype(np.float32) for i in range(3)]


def linear_weight_range(in_features, out_features):
    """max |w| over a freshly initialised nn.Linear's weight (seeded)."""
    np.random.seed(0)
    return float(np.abs(nn.Linear(in_features, out_features).weight.numpy()).max())


# %% [markdown]
# **Exercise 3.1 (predict an initialisation).** `nn.Linear(in_features, out_features)` draws
# its weight uniformly from $[-b, b]$ with Kaiming's rule for ReLU. Write $b$ as a formula; the
# check compares it with the largest weight actually drawn (which sits just below $b$).

# %% tags=["exercise-stub"]
def linear_weight_bound(in_features, out_features):
    """The bound b of nn.Linear's uniform weight initialisation."""
    raise NotImplementedError


# %% tags=["exercise-check"]
def _bound_ok(bounds):
    for (fan_in, fan_out), b in zip([(100, 300), (784, 128)], bounds):
        seen = linear_weight_range(fan_in, fan_out)
        if not seen <= b <= seen * 1.001:
            return (f"for Linear({fan_in}, {fan_out}) the weights reach {seen:.5f}; "
                    f"your bound is {b:.5f}")
    return None


check_exercise("3.1 linear_weight_bound",
               lambda: [linear_weight_bound(100, 300), linear_weight_bound(784, 128)],
               predicate=_bound_ok)

# %% [markdown]
# Exercises 3.2 to 3.4 are about `LayerNorm1d`, `Dropout` and `BatchNorm1d`, which notebook 04
# teaches; do them after it (or now, as a preview).
#
# **Exercise 3.2 (a module in numpy).** Write layer normalisation of each row of `x`
# (mean 0 and variance 1 over the features, with $\epsilon$ inside the square root, weight 1,
# bias 0). The check compares with `nn.LayerNorm1d`.

# %% tags=["exercise-stub"]
def layernorm(x, eps=1e-5):
    """Each row of x (batch, features) normalised to mean 0, variance 1."""
    raise NotImplementedError


# %% tags=["exercise-check"]
check_exercise("3.2 layernorm", lambda: layernorm(x_ex),
               nn.LayerNorm1d(6)(ndl.Tensor(x_ex)).numpy(), rtol=1e-4, atol=1e-5)

# %% [markdown]
# **Exercise 3.3 (why dropout rescales).** In training mode `nn.Dropout(p)` zeroes each entry
# with probability $p$ and multiplies the survivors by a constant so that the expected output
# equals the input. Which constant?

# %% tags=["exercise-stub"]
def dropout_scale(p):
    """The factor nn.Dropout(p) multiplies surviving entries by."""
    raise NotImplementedError


# %% tags=["exercise-check"]
def _survivor_values(p):
    np.random.seed(1)
    out = nn.Dropout(p)(ndl.Tensor(np.ones((50, 50), dtype=np.float32))).numpy()
    return float(out[out != 0].mean())


check_exercise("3.3 dropout_scale", lambda: [dropout_scale(p) for p in (0.25, 0.5, 0.9)],
               [_survivor_values(p) for p in (0.25, 0.5, 0.9)], rtol=1e-5)

# %% [markdown]
# **Exercise 3.4 (running statistics).** `nn.BatchNorm1d(dim, momentum=m)` starts its running
# mean at 0 and, for each training batch, sets running = (1 - m)·running + m·(batch mean).
# Compute the running mean after `batches` in numpy; the check feeds the same batches to the
# module.

# %% tags=["exercise-stub"]
def running_mean_after(batches, momentum):
    """BatchNorm1d's running_mean (shape (dim,)) after these training batches."""
    raise NotImplementedError


# %% tags=["exercise-check"]
def _module_running_mean(momentum):
    bn = nn.BatchNorm1d(3, momentum=momentum)
    for batch in batches_ex:
        bn(ndl.Tensor(batch))
    return bn.running_mean.numpy()


check_exercise("3.4 running_mean_after", lambda: running_mean_after(batches_ex, 0.1),
               _module_running_mean(0.1), rtol=1e-5, atol=1e-6)
