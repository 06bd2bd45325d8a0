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
# The lecture "NN Library Implementation" (hw2), with the real `needle` package. Automatic
# differentiation (notebook 02) gives us gradients of any expression; a *library* adds the
# structure around it:
#
# 1. **modules** hold **parameters** and compose into models, and the library must *find* every
#    parameter to hand it to an optimizer (`Module.parameters()`);
# 2. the **optimizer** updates parameters *outside* the computational graph (`.data`);
# 3. numerically careful building blocks: a **stable softmax** and cross-entropy;
# 4. **initialisation** that keeps activations at a sane scale through many layers (Kaiming);
# 5. ops with **multiple outputs** (`TensorTuple`).
#
# Every number stated in the text is asserted in the code cell that follows it.

# %%
import gc

import matplotlib.pyplot as plt
import numpy as np

import needle as ndl
from needle import init, nn, optim
from needle.viz import save_figure

np.random.seed(0)
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

# %%
class ScaleAdd(nn.Module):
    """f(x; s, b) = x * s + b with scalar parameters s and b (shape (1,))."""

    def __init__(self, init_s: float = 1.0, init_b: float = 0.0):
        super().__init__()
        self.s = nn.Parameter([init_s], dtype="float32")
        self.b = nn.Parameter([init_b], dtype="float32")

    def forward(self, x):
        # needle ops do not broadcast implicitly: stretch the scalars to x's shape
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
# Real models keep their layers in containers — `Sequential` stores a tuple, a Transformer a
# list of blocks, some models a dict of heads. The discovery policy therefore also searches
# **lists, tuples and dicts** (in index / insertion order, nested to any depth); names use the
# index or the dict key.

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

# %%
class L2Loss(nn.Module):
    """Unnormalised squared error: sum((h - t)^2), a scalar."""

    def forward(self, h, t):
        d = h - t
        return (d * d).sum()


x = ndl.Tensor([2.0], dtype="float32")
t = ndl.Tensor([2.0], dtype="float32", requires_grad=False)
model = MultiPathScaleAdd()
h = model(x)
loss = L2Loss()(h, t)
loss.backward()
print(f"h = {h.numpy()[0]:.2f}, L = {loss.numpy().item():.2f}, dL/dh = {h.grad.numpy()[0]:.2f}")
for name, p in model.named_parameters():
    print(f"dL/d{name} = {p.grad.numpy()[0]:.2f}")
print(f"dL/dx = {x.grad.numpy()[0]:.2f}")
assert h.numpy()[0] == 4 and loss.numpy().item() == 4 and h.grad.numpy()[0] == 4
assert [p.grad.numpy()[0] for p in model.parameters()] == [8, 4, 8, 4]
assert x.grad.numpy()[0] == 8


# %% [markdown]
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
#   $s_j = 0.96$, $b_j = -0.02$, $h = 3.80$, and $L$ goes from $2$ to $\tfrac12 1.8^2 = 1.62$;
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
assert abs(0.5 * 1.8 ** 2 - 1.62) < 1e-12

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
# A naive walk (the course's first version of `parameters()`) lists `s` twice. An optimizer
# looping over that list would apply the already-summed gradient **twice**:
# $s = 1 - 2\cdot 0.16 = 0.68$. needle's optimizers refuse such a list.

# %%
def naive_parameters(value):
    """Every Parameter reachable from value, without removing duplicates."""
    if isinstance(value, nn.Parameter):
        return [value]
    if isinstance(value, nn.Module):
        return naive_parameters(value.__dict__)
    if isinstance(value, dict):
        return [p for v in value.values() for p in naive_parameters(v)]
    if isinstance(value, (list, tuple)):
        return [p for v in value for p in naive_parameters(v)]
    return []


tied = MultiPathScaleAdd()
tied.path1.s = tied.path0.s
L2Loss()(tied(x), t).backward()
naive = naive_parameters(tied)
print(f"naive list: {len(naive)} entries, {len({id(p) for p in naive})} distinct tensors")
for w in naive:  # a plain SGD loop over the naive list
    w.data = w.data - 0.01 * w.grad.data
print(f"s after 'one' step = {tied.path0.s.numpy()[0]:.4f}")
assert len(naive) == 4 and abs(tied.path0.s.numpy()[0] - 0.68) < 1e-6

try:
    optim.SGD(naive, lr=0.01)
    raise AssertionError("a duplicated parameter list was accepted")
except ValueError as err:
    print("ValueError:", err)

# %% [markdown]
# ## 3. The update boundary
#
# The update $\theta \leftarrow \theta - \eta\nabla_\theta L$ is *not* part of the model.
# Written with ordinary tensor ops, `w = w - lr * w.grad` makes the new `w` an op output whose
# inputs are the old `w` and its gradient — which carries the backward graph — so every step
# hangs its whole history off the next one. Count the nodes reachable from `w` and the live
# tensors (`autograd.TENSOR_COUNTER`, incremented when a Value is created and decremented when
# it is freed):

# %%
def live_tensors():
    gc.collect()
    return ndl.autograd.TENSOR_COUNTER


def graph_size(v):
    return len(ndl.autograd.find_topo_sort([v]))


w = ndl.Tensor([1.0, -2.0, 3.0], dtype="float32")
start = live_tensors()
tracked_sizes = []
for step in range(1, 6):
    loss = (w * w).sum()
    loss.backward()
    w = w - w.grad * 0.1  # graph-tracked update
    tracked_sizes.append(graph_size(w))
    print(f"step {step}: graph behind w has {graph_size(w):3d} nodes, "
          f"{live_tensors() - start:3d} more live tensors than at the start")
w_tracked = w.numpy()
assert all(b > a for a, b in zip(tracked_sizes, tracked_sizes[1:]))

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
# The `.data` setter is a boundary, so it checks what crosses it: the new array must have this
# tensor's dtype, shape (up to size-1 dimensions, so a `(n,)` vector may fill a `(1, n)` bias)
# and device. (On the NDArray backend every array is float32, so a float64 tensor cannot even
# be built; on the numpy backend the setter itself rejects it.)

# %%
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
assert np.log(np.finfo(np.float32).max) < 100

# %% [markdown]
# Softmax does not change when a constant is subtracted from every logit, since the factor
# $e^{-c}$ cancels. With $c = \max_j z_j$ the largest exponent is $e^0 = 1$ and nothing
# overflows: $[e^{-1}, e^{-1}, 1]/(1 + 2e^{-1}) = [0.21194, 0.21194, 0.57612]$. needle's
# `logsoftmax` (and `logsumexp`) do this shift internally.

# %%
shifted = np.exp(z - z.max())
stable = shifted / shifted.sum()
print("stable softmax =", np.array2string(stable, precision=5))
assert np.allclose(stable, [0.21194, 0.21194, 0.57612], atol=5e-6)

Z = ndl.Tensor(z.reshape(1, 3), device=device)
from_needle = ndl.exp(ndl.logsoftmax(Z)).numpy()[0]
print("exp(ndl.logsoftmax(z)) =", np.array2string(from_needle, precision=5))
assert np.allclose(from_needle, stable, atol=1e-6)

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
# Cross-entropy $\ell(z, y) = \mathrm{logsumexp}(z) - z_y$ is built from the stable pieces, and
# its gradient is the famous $\partial\ell/\partial z = \mathrm{softmax}(z) - e_y$ (one-hot
# $e_y$). `nn.SoftmaxLoss` averages over the batch, so for one example its gradient is exactly
# that; we check it against the formula and against central finite differences of a float64
# numpy loss.

# %%
zc = np.random.randn(1, 5).astype(np.float32) * 3
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
print(f"max |needle - finite differences| < 1e-5: {np.abs(zt.grad.numpy() - fd).max() < 1e-5}")
assert np.abs(zt.grad.numpy() - formula).max() < 1e-6
assert np.abs(zt.grad.numpy() - fd).max() < 1e-5

# %% [markdown]
# The figure shows both computations on $z = [100, 100, 101]$: the exponentials (left, log
# scale; the naive ones lie above the float32 limit and become `inf`) and the resulting
# probabilities (right; every naive one is NaN).

# %%
fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(9, 3.4))
idx = np.arange(3)
ax0.bar(idx - 0.2, np.exp(z.astype(np.float64)), 0.4, label="naive $e^{z_i}$ (exact value)",
        color="tab:red")
ax0.bar(idx + 0.2, shifted, 0.4, label=r"stable $e^{z_i - \max z}$", color="tab:blue")
ax0.axhline(np.finfo(np.float32).max, color="k", ls="--", lw=1, label="float32 max")
ax0.set_yscale("log")
ax0.set_ylim(1e-2, 1e70)
ax0.set_xticks(idx, [f"$z_{i}={v:.0f}$" for i, v in enumerate(z)])
ax0.set_ylabel("value")
ax0.set_title("naive exponentials overflow float32")
ax0.legend(fontsize=8, loc="upper left")
ax1.bar(idx + 0.2, stable, 0.4, color="tab:blue", label="stable (shift by max)")
for i, v in enumerate(stable):
    ax1.text(i + 0.2, v + 0.01, f"{v:.5f}", ha="center", fontsize=8)
    ax1.text(i - 0.2, 0.02, "NaN", ha="center", color="tab:red", fontsize=10)
ax1.plot([], [], ls="none", marker="$N$", color="tab:red", label="naive: inf/inf = NaN")
ax1.set_ylim(0, 0.7)
ax1.set_xticks(idx, [f"$z_{i}$" for i in range(3)])
ax1.set_ylabel("probability")
ax1.set_title("softmax([100, 100, 101])")
ax1.legend(fontsize=8, loc="upper left")
fig.tight_layout()
save_figure(fig, "softmax_overflow")
plt.show()

# %% [markdown]
# ## 5. Kaiming initialisation
#
# A linear unit $Y = \sum_{i=1}^{n_{in}} W_i X_i$ with independent zero-mean weights of variance
# $\sigma_w^2$, independent of inputs with second moment $q = \mathbb{E}[X^2]$, has
#
# $$\mathrm{Var}(Y) = n_{in}\, q\, \sigma_w^2 .$$
#
# A ReLU after it keeps the positive half of a distribution symmetric about zero, so
# $\mathbb{E}[\mathrm{ReLU}(A)^2] = \tfrac12\mathbb{E}[A^2]$. Layer to layer the second moment
# of the activations is multiplied by $\tfrac12 n_{in}\sigma_w^2$, which is $1$ exactly when
#
# $$\sigma_w^2 = \frac{2}{n_{in}}\qquad\text{(Kaiming / He).}$$
#
# First the two facts, by sampling:

# %%
n_in, q, sigma2 = 64, 3.0, 0.05
X = np.random.randn(20000, n_in) * np.sqrt(q)
W = np.random.randn(n_in, 400) * np.sqrt(sigma2)
Y = X @ W
print(f"Var(Y) = {Y.var():.2f}   n_in*q*sigma_w^2 = {n_in * q * sigma2:.2f}")
assert abs(Y.var() / (n_in * q * sigma2) - 1) < 0.03

A = np.random.randn(1_000_000) * 1.7
ratio = np.mean(np.maximum(A, 0) ** 2) / np.mean(A ** 2)
print(f"E[ReLU(A)^2] / E[A^2] = {ratio:.3f}")
assert abs(ratio - 0.5) < 0.005

# %% [markdown]
# Now push one batch through a 50-layer ReLU MLP of width 100, drawing every weight with
# `needle.init` and running the layers with needle ops, for $\sigma_w^2 = 1/n_{in}$,
# $2/n_{in}$ (`init.kaiming_normal`) and $3/n_{in}$. The theory multiplies the second moment
# $\mathbb{E}[X^2]$ by $\tfrac12 n_{in}\sigma_w^2 = \tfrac12,\ 1,\ \tfrac32$ per layer: after 50
# layers by $(1/2)^{50} \approx 9\cdot10^{-16}$, $1$ and $(3/2)^{50} \approx 6\cdot10^{8}$. A
# finite width adds random fluctuations, so the measured factors wander from these by up to
# about ten — nothing next to the fifteen and eight orders of magnitude the wrong scales lose
# or gain (a deeper net, or a larger factor, reaches float32's limits).

# %%
def activation_stats(weight_fn, depth=50, width=100, batch=256):
    """Variance and mean square of the activations after each layer of a deep ReLU MLP."""
    h = ndl.Tensor(np.random.randn(batch, width).astype(np.float32), device=device,
                   requires_grad=False)
    var, msq = [h.numpy().var()], [np.mean(h.numpy() ** 2)]
    for _ in range(depth):
        h = ndl.relu(h @ weight_fn(width))
        var.append(h.numpy().var())
        msq.append(np.mean(h.numpy() ** 2))
    return np.array(var), np.array(msq)


np.random.seed(0)
schemes = {  # sigma_w^2: (weight initialiser, predicted factor per layer)
    "1/n_in": (lambda n: init.randn(n, n, std=np.sqrt(1 / n), device=device), 0.5),
    "2/n_in (Kaiming)": (lambda n: init.kaiming_normal(n, n, device=device), 1.0),
    "3/n_in": (lambda n: init.randn(n, n, std=np.sqrt(3 / n), device=device), 1.5),
}
curves = {}
for label, (fn, factor) in schemes.items():
    var, msq = activation_stats(fn)
    curves[label] = var
    predicted = factor ** 50
    measured = msq[-1] / msq[0]
    print(f"sigma_w^2 = {label:16s} E[X^2] factor over 50 layers: predicted {predicted:.2g}, "
          f"measured {measured:.2g}; variance at layer 50 = {var[-1]:.3g}")
    assert abs(np.log10(measured / predicted)) < 1.0  # within a factor of ten
small, kaiming, large = curves.values()
assert small[-1] < 1e-12 and large[-1] > 1e6 and 0.1 < kaiming[-1] / kaiming[1] < 10
assert abs(0.5 ** 50 / 9e-16 - 1) < 0.05 and abs(1.5 ** 50 / 6e8 - 1) < 0.1

# %%
fig, ax = plt.subplots(figsize=(6.5, 3.8))
for (label, v), color in zip(curves.items(), ["tab:blue", "tab:green", "tab:red"]):
    math_label = r"$\sigma_w^2$ = " + label.replace("n_in", "$n_{in}$")
    ax.semilogy(np.arange(len(v)), v, label=math_label, color=color)
ax.set_xlabel("layer")
ax.set_ylabel("activation variance")
ax.set_title("Only $\\sigma_w^2 = 2/n_{in}$ keeps a 50-layer ReLU net's activations at scale")
ax.legend(fontsize=9)
fig.tight_layout()
save_figure(fig, "kaiming_depth")
plt.show()

# %% [markdown]
# ## 6. Ops with several outputs: `TensorTuple`
#
# Some ops return several tensors (`split`, an LSTM cell's `(h, c)`). needle gives them a
# `TensorTupleOp` whose output is one `TensorTuple` node; `tuple_get_item` (what `out[i]` calls)
# picks a component. The example op is
#
# $$F(x) = (u, v) = (x + 1,\; x + 2).$$
#
# For $L = 3u + 4v$ at $x = 1$: $u = 2$, $v = 3$, $L = 6 + 12 = 18$. The adjoint of the tuple
# node is the pair $(\bar u, \bar v) = (3, 4)$, and the op's gradient sums it:
# $\partial L/\partial x = 3 + 4 = 7$.

# %%
x = ndl.Tensor([1.0], dtype="float32")
out = ndl.fused_add_scalars(x, 1.0, 2.0)
u, v = out[0], out[1]
L = (u * 3 + v * 4).sum()
L.backward()
print(type(out).__name__, f"u = {u.numpy()[0]:.1f}, v = {v.numpy()[0]:.1f}")
adjoint = (out.grad[0].numpy()[0], out.grad[1].numpy()[0])
print(f"L = {L.numpy().item():.1f}, adjoint of (u, v) = ({adjoint[0]:.1f}, {adjoint[1]:.1f}), "
      f"dL/dx = {x.grad.numpy()[0]:.1f}")
assert isinstance(out, ndl.TensorTuple) and len(out) == 2
assert L.numpy().item() == 18 and x.grad.numpy()[0] == 7
assert adjoint == (3, 4)

# %% [markdown]
# Using only the first output, $L = 3u$: `tuple_get_item`'s gradient routes $(\bar u, 0)$ — the
# adjoint for the selected slot and zeros for the other — and $\partial L/\partial x = 3$.

# %%
x = ndl.Tensor([1.0], dtype="float32")
out = ndl.fused_add_scalars(x, 1.0, 2.0)
(out[0] * 3).sum().backward()
routed = (out.grad[0].numpy()[0], out.grad[1].numpy()[0])
print(f"adjoint of (u, v) = ({routed[0]:.1f}, {routed[1]:.1f}), dL/dx = {x.grad.numpy()[0]:.1f}")
assert routed == (3, 0) and x.grad.numpy()[0] == 3

# %% [markdown]
# ## Summary
#
# * `Module.parameters()` finds every `Parameter` through attributes, sub-modules, lists, tuples
#   and dicts, once each; sets are refused. Optimizers refuse duplicated lists.
# * The optimizer updates through `.data`: outside the graph, so memory stays flat.
# * Softmax, log-softmax and cross-entropy subtract the row maximum; the cross-entropy gradient
#   is softmax minus one-hot.
# * $\sigma_w^2 = 2/n_{in}$ keeps ReLU activations at a constant scale with depth.
# * Multi-output ops return a `TensorTuple`; unused outputs receive zero adjoints.
