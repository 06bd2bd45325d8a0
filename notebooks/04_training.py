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
# # 04 · Training a network: data, optimizers, normalization (hw2)
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/needle-companion/needle-companion/blob/main/notebooks/04_training.ipynb)
#
# **Lecture:** 6, "Fully Connected Networks, Optimization, Initialization" (the optimizers),
# 9, "Normalization and Regularization", and the data and training-loop parts of 7, "Neural
# Network Library Abstractions"
#
# **Homework:** hw2 Q2 (`BatchNorm1d`, `LayerNorm1d`, `Dropout`, `Residual`), Q3 (`SGD` with
# momentum, `Adam`), Q4 (transforms, `Dataset`, `DataLoader`), Q5 (`MLPResNet`)
#
# **Prerequisites:** notebook 03 (modules, parameters, the training-loop contract)
#
# **You will be able to:** load and augment data in mini-batches; predict the step sizes of SGD,
# the course's momentum and Adam, and convert the course's momentum to PyTorch's; tell coupled
# L2 from decoupled weight decay; tell a diverged run from a slow one; use BatchNorm, LayerNorm
# and Dropout correctly in training and evaluation mode; train an MLP-ResNet, read its
# overfitting and the uncertainty of its test error
#
# **Run time:** about 30 s on a 2-core x86-64 machine
#
# Homework 2 turns needle from an autodiff engine into a training library. This notebook walks
# through the pieces in the order a training loop uses them:
#
# 1. **data** — a `Dataset` that indexes samples, `transforms` that augment them, and a
#    `DataLoader` that cuts an epoch into shuffled mini-batches of Tensors;
# 2. **optimizers** — SGD, SGD with momentum, and Adam, compared on the same model;
# 3. **normalization and regularization** — BatchNorm, LayerNorm and Dropout, whose behaviour
#    differs between training and evaluation;
# 4. an **MLP-ResNet**, hw2's final model, trained to high accuracy;
# 5. **regularization** (weight decay, dropout) and why normalization helps, read off that
#    run's own overfitting.
#
# Everything runs offline on scikit-learn's handwritten digits in MNIST's 28 × 28 layout
# (`companion.data.DigitsDataset`); the parameter cell switches to MNIST after `make data`.

# %% tags=["remove-cell"] cellView="form" jupyter={"source_hidden": true}
#@title Colab set-up: in Colab this installs needle (2-3 minutes); elsewhere it does nothing
import os, shlex, subprocess, sys, tempfile; repo = os.environ.get("NEEDLE_COLAB_REPO", "https://github.com/needle-companion/needle-companion")
if "google.colab" in sys.modules or os.environ.get("NEEDLE_COLAB_SIMULATE") == "1":  # companion/colab_setup.py
    py, src, q = sys.executable, os.path.join(tempfile.gettempdir(), "needle-companion"), shlex.quote
    done = subprocess.run(f"{q(py)} -m companion.colab_setup --status 2>/dev/null || {{ {{ test -d {q(src)} || git clone -q --depth=1 {q(repo)} {q(src)}; }} && cd {q(src)} && {q(py)} -m companion.colab_setup --install {q(repo)} --cwd {q(os.getcwd())}; }}", shell=True, capture_output=True, text=True); print(done.stdout + done.stderr[-3000:], end=""); assert done.returncode == 0, f"the set-up could not install this project from {repo} (what failed is above)"

# %%
import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator
import numpy as np

import needle as ndl
import needle.nn as nn
import companion.data
from companion import lecture
from companion.apps import mlp_resnet
from companion.apps import simple_ml as sm
from companion.viz import LiveCurves, save_figure

np.random.seed(0)
device = ndl.cpu()  # where needle's layers put their parameters by default

# %%
DATASET = "digits"  # or "mnist" after `make data`

# %%
DATA_DIR = lecture.data_dir()  # the checkout's data/ (make data), else ./data
if DATASET == "digits":
    train_set = companion.data.DigitsDataset(train=True, image_size=28)
    test_set = companion.data.DigitsDataset(train=False, image_size=28)
elif DATASET == "mnist":
    train_set = ndl.data.MNISTDataset(str(DATA_DIR / "train-images-idx3-ubyte.gz"),
                                      str(DATA_DIR / "train-labels-idx1-ubyte.gz"))
    test_set = ndl.data.MNISTDataset(str(DATA_DIR / "t10k-images-idx3-ubyte.gz"),
                                     str(DATA_DIR / "t10k-labels-idx1-ubyte.gz"))
else:
    raise ValueError(f"DATASET must be 'digits' or 'mnist', got {DATASET!r}")
print(f"{len(train_set)} training and {len(test_set)} test samples")

# %% [markdown]
# ## 1. Datasets
#
# A `Dataset` needs only `__len__` and `__getitem__`. Item `i` of the digits is a pair
# (image flattened to 784 floats in $[0, 1]$, label); an integer *array* of indices returns a
# whole batch at once, which is what the `DataLoader` asks for.

# %%
x0, y0 = train_set[0]
xb, yb = train_set[np.array([0, 1, 2])]
print(f"one item: x {x0.shape} {x0.dtype}, y = {y0}")
print(f"three items: X {xb.shape}, y {yb}")
assert x0.shape == (784,) and xb.shape == (3, 784)

# %% [markdown]
# ## 2. Transforms: data augmentation
#
# Transforms act on one image as an $H \times W \times C$ array, and each draws its randomness
# from numpy's global generator exactly as the course does:
#
# * `RandomFlipHorizontal(p)` mirrors left–right when `np.random.rand() < p`;
# * `RandomCrop(padding)` pads with `padding` zeros on every side and cuts out the original size
#   at a random offset `np.random.randint(-padding, padding + 1, size=2)` — i.e. it shifts the
#   image by up to `padding` pixels, filling with zeros.
#
# (Mirroring a digit changes what it means. The course's hw2 tests check the flip on MNIST
# images; its hw4 CIFAR-10 training passes no transforms at all.
# Flips are the usual augmentation for natural photographs such as CIFAR-10's, where a mirrored
# cat is still a cat.)

# %%
img = x0.reshape(28, 28, 1)
flipped = ndl.data.RandomFlipHorizontal(p=1.0)(img)
assert np.array_equal(flipped[:, :, 0], img[:, ::-1, 0])

np.random.seed(1)
shift = np.random.randint(-3, 4, size=2)
np.random.seed(1)
cropped = ndl.data.RandomCrop(padding=3)(img)
dx, dy = shift
expected = np.zeros_like(img)
expected[max(0, -dx):28 - max(0, dx), max(0, -dy):28 - max(0, dy)] = \
    img[max(0, dx):28 + min(0, dx), max(0, dy):28 + min(0, dy)]
assert np.array_equal(cropped, expected)
print(f"RandomCrop(3) drew the shift (dx, dy) = ({dx}, {dy})")

# %%
np.random.seed(2)
crops = [ndl.data.RandomCrop(padding=4)(img) for _ in range(4)]
fig, axes = plt.subplots(1, 6, figsize=(9, 1.9))
panels = [(img, "original"), (flipped, "flipped")] + [(c, f"crop {i + 1}") for i, c in enumerate(crops)]
for ax, (im, title) in zip(axes, panels):
    ax.imshow(im[:, :, 0], cmap="gray_r", vmin=0, vmax=1)
    ax.set_title(title, fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])  # keep the frame: it shows the crops' shifts
fig.suptitle("One training digit under RandomFlipHorizontal and RandomCrop(padding=4)", y=1.06)
save_figure(fig, "transforms")

# %% [markdown]
# ## 3. The DataLoader
#
# `DataLoader(dataset, batch_size, shuffle)` splits the index order into consecutive chunks of
# `batch_size` (`np.array_split`, so the last batch may be smaller) and yields each batch as a
# tuple of Tensors. With `shuffle=True` it draws a fresh `np.random.permutation` at the start of
# every epoch. 1,500 samples in batches of 100 give 15 batches; every sample appears exactly
# once per epoch.

# %%
loader = ndl.data.DataLoader(train_set, batch_size=100, shuffle=True)
seen = []
for X, y in loader:
    seen.append(y.numpy())
print(f"{len(seen)} batches; first batch X {X.shape}, y {y.shape}; X is a {type(X).__name__}")
if DATASET == "digits":
    assert len(loader) == 15
    assert sorted(np.concatenate(seen).astype(int).tolist()) == sorted(train_set.labels.astype(int).tolist())

# %% [markdown]
# This project's loader also takes `device=` (an extension: it puts the batches on the model's
# device). This notebook keeps everything on the default device and calls the loader as the
# course does, so every cell also runs on a student's hw2 needle (`NEEDLE_IMPL`); the digits
# come from `companion.data.DigitsDataset`, which builds on whichever needle's `Dataset` is
# imported.
#
# ## 4. Optimizers
#
# An optimizer holds the parameters and updates them from their `.grad` after each
# `backward()`. With gradient $g$ (to which `weight_decay` $= \lambda$ adds $\lambda\theta$,
# L2 regularization, defined at the end of this section):
#
# * **SGD**: $\theta \leftarrow \theta - \alpha g$;
# * **momentum** (the course's form, an exponential *average* of the gradients):
#   $u \leftarrow \beta u + (1 - \beta) g$ with $u_0 = 0$, $\theta \leftarrow \theta - \alpha u$;
# * **Adam**: running averages $m$ of $g$ and $v$ of $g^2$, bias-corrected by
#   $1 - \beta^t$, and $\theta \leftarrow \theta - \alpha\, \hat m / (\sqrt{\hat v} + \epsilon)$.
#
# A check of each rule on $L(w) = \tfrac12 \lVert w \rVert^2$, whose gradient is $w$ itself.
# The first Adam step has $\hat m = g$ and $\hat v = g^2$, so every coordinate moves by
# almost exactly $\alpha$ whatever the gradient's size.

# %%
def steps(opt_cls, n_steps, **kw):
    w = nn.Parameter(np.array([4.0, -0.5, 0.02], dtype=np.float32))
    opt = opt_cls([w], **kw)
    for _ in range(n_steps):
        opt.reset_grad()
        ((w * w).sum() / 2).backward()
        opt.step()
    return w.numpy()


w0 = np.array([4.0, -0.5, 0.02])
sgd = steps(ndl.optim.SGD, 1, lr=0.1)
assert np.allclose(sgd, w0 - 0.1 * w0)
mom = steps(ndl.optim.SGD, 2, lr=0.1, momentum=0.9)
u1 = 0.1 * w0                       # u = 0.9*0 + 0.1*g
w1 = w0 - 0.1 * u1
u2 = 0.9 * u1 + 0.1 * w1
assert np.allclose(mom, w1 - 0.1 * u2)
adam = steps(ndl.optim.Adam, 1, lr=0.1)
print("SGD step      ", np.round(sgd, 4))
print("momentum, 2   ", np.round(mom, 4))
print("Adam, 1 step: moved by", np.round(w0 - adam, 4))
assert np.allclose(w0 - adam, 0.1 * np.sign(w0), atol=1e-5)


# %% [markdown]
# The course's momentum and PyTorch's differ by **one constant**. PyTorch *sums* the gradients,
# $v \leftarrow \beta v + g$ (from $v_0 = 0$); the course *averages* them,
# $u \leftarrow \beta u + (1 - \beta) g$. Unrolled, $u_t = (1-\beta)\sum_{s \le t}
# \beta^{t-s} g_s = (1 - \beta)\, v_t$ at every step, so the course's `SGD(lr=α, momentum=β)`
# takes exactly the steps of PyTorch's `SGD(lr=α(1−β), momentum=β)`.
#
# Neither has a bias correction (Adam's $1/(1-\beta^t)$), and both warm up the same way: both
# buffers start at 0, so after $t$ steps of a constant gradient $g$,
# $u_t = (1 - \beta^t)\, g$ and $v_t = \frac{1 - \beta^t}{1 - \beta}\, g$. The first step is
# $1 - \beta = 0.1$ of the size the steps approach over a few tens of steps. What differs at the
# same $\alpha$ is that size: SGD's own $\alpha g$ for the course, $1/(1-\beta) = 10$ times
# more for PyTorch. (PyTorch's `dampening=β` does not give the course's form: PyTorch starts its
# buffer at $v_1 = g$, undamped.)
#
# We measure both on the linear loss $L(w) = g^\top w$, whose gradient is the constant $g$; the
# PyTorch column runs PyTorch's documented update in numpy, and the last check runs the two rules
# on the quadratic loss above at learning rates $\alpha$ and $\alpha(1-\beta)$:

# %%
def step_sizes(n_steps, **kw):
    g = np.array([1.0, -2.0, 0.5], dtype=np.float32)
    w = nn.Parameter(np.zeros(3, dtype=np.float32))
    opt = ndl.optim.SGD([w], **kw)
    sizes, before = [], w.numpy().copy()
    for _ in range(n_steps):
        opt.reset_grad()
        (w * ndl.Tensor(g, requires_grad=False)).sum().backward()
        opt.step()
        sizes.append(np.linalg.norm(w.numpy() - before) / np.linalg.norm(0.1 * g))
        before = w.numpy().copy()
    return np.array(sizes)


def pytorch_momentum(w, grad_fn, n_steps, lr, beta):
    """PyTorch's SGD(lr, momentum=beta): v = beta*v + g (v starts at g), w -= lr*v (numpy)."""
    w, v = np.array(w, dtype=np.float64), None
    for _ in range(n_steps):
        g = grad_fn(w)
        v = g.copy() if v is None else beta * v + g
        w = w - lr * v
    return w


t_steps = np.arange(1, 31)
mom_sizes = step_sizes(30, lr=0.1, momentum=0.9)
sgd_sizes = step_sizes(30, lr=0.1)
g_lin = np.array([1.0, -2.0, 0.5])
torch_w = [pytorch_momentum(np.zeros(3), lambda w: g_lin, t, 0.1, 0.9) for t in range(31)]
torch_sizes = np.array([np.linalg.norm(torch_w[t] - torch_w[t - 1]) / np.linalg.norm(0.1 * g_lin)
                        for t in t_steps])
print("          step / SGD's step at the same lr")
print("step t    course   1-0.9^t   PyTorch  (1-0.9^t)/0.1")
for t in (1, 2, 5, 10, 30):
    print(f"{t:6d}  {mom_sizes[t - 1]:8.3f}  {1 - 0.9 ** t:8.3f}  {torch_sizes[t - 1]:8.3f}"
          f"  {(1 - 0.9 ** t) / 0.1:8.3f}")
assert np.allclose(sgd_sizes, 1, atol=1e-5)
assert np.allclose(mom_sizes, 1 - 0.9 ** t_steps, atol=1e-4)
assert np.allclose(torch_sizes, (1 - 0.9 ** t_steps) / 0.1, rtol=1e-9)
# course SGD(lr=0.1) == PyTorch SGD(lr=0.1 * (1 - 0.9)), step by step, on L = |w|^2 / 2
for n in (1, 2, 7):
    assert np.allclose(steps(ndl.optim.SGD, n, lr=0.1, momentum=0.9),
                       pytorch_momentum(w0, lambda w: w, n, 0.1 * (1 - 0.9), 0.9), rtol=1e-5)
print("course SGD(lr=0.1, momentum=0.9) == PyTorch SGD(lr=0.01, momentum=0.9) on 1, 2 and 7 steps")

# %% [markdown]
# **Weight decay.** `SGD` and `Adam` both take `weight_decay` $= \lambda$ and add $\lambda\theta$
# to the gradient before anything else: $g \leftarrow \nabla L + \lambda\theta$, the gradient of
# $L + \frac{\lambda}{2}\lVert\theta\rVert^2$. That is **L2 regularization**. For plain SGD it
# is the same as shrinking ("decaying") the weights by a factor $1 - \alpha\lambda$ every step,
# $\theta \leftarrow (1 - \alpha\lambda)\theta - \alpha\nabla L$, hence the name.
#
# For Adam the two are not the same. The added $\lambda\theta$ is *coupled* to the gradient: it
# goes into the moment averages and is divided by $\sqrt{\hat v}$ with the rest, so a weight
# whose loss gradient is large is hardly decayed at all, and a weight whose loss gradient is
# near 0 is pulled to 0 at almost $\alpha$ per step, whatever $\lambda$ is. **AdamW** (Loshchilov
# and Hutter; PyTorch's `AdamW`) *decouples* the decay from the gradient:
# $\theta \leftarrow \theta - \alpha\big(\hat m / (\sqrt{\hat v} + \epsilon) + \lambda\theta\big)$,
# the same shrink factor $1 - \alpha\lambda$ for every weight. needle's `Adam`, like the
# course's and PyTorch's `Adam`, is the coupled kind.
#
# Both rules below, in numpy, on two weights that start at 1: the first gets a loss gradient
# of $\pm 10$ (alternating sign), the second none; $\lambda = 0.1$, $\alpha = 0.01$, 200 steps.
# The coupled rule is checked against `ndl.optim.Adam(weight_decay=0.1)` on the same gradients.

# %%
def adam_numpy(theta0, loss_grads, lr, wd, decoupled, b1=0.9, b2=0.999, eps=1e-8):
    """theta after one Adam step per loss gradient; weight decay wd coupled (L2, added to the
    gradient: Adam) or decoupled (AdamW)."""
    theta = np.array(theta0, dtype=np.float64)
    m, v = np.zeros_like(theta), np.zeros_like(theta)
    for t, g in enumerate(loss_grads, start=1):
        if not decoupled:
            g = g + wd * theta
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        update = (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
        theta = theta - lr * (update + (wd * theta if decoupled else 0.0))
    return theta


loss_grads = [np.array([10.0 * (-1) ** t, 0.0]) for t in range(200)]
coupled = adam_numpy([1.0, 1.0], loss_grads, 0.01, 0.1, decoupled=False)
decoupled = adam_numpy([1.0, 1.0], loss_grads, 0.01, 0.1, decoupled=True)
p_wd = nn.Parameter(np.ones(2, dtype=np.float32))
opt_wd = ndl.optim.Adam([p_wd], lr=0.01, weight_decay=0.1)
for g in loss_grads:
    p_wd.grad = ndl.Tensor(g.astype(np.float32))
    opt_wd.step()
print(f"after 200 steps     weight with gradient ±10   weight with no gradient")
print(f"Adam, coupled L2    {coupled[0]:24.3f}   {coupled[1]:22.3f}")
print(f"ndl.optim.Adam      {p_wd.numpy()[0]:24.3f}   {p_wd.numpy()[1]:22.3f}")
print(f"AdamW, decoupled    {decoupled[0]:24.3f}   {decoupled[1]:22.3f}")
print(f"(1 - lr*wd)^200 = {(1 - 0.01 * 0.1) ** 200:.3f}")
assert np.allclose(p_wd.numpy(), coupled, atol=1e-3)
assert coupled[0] > 0.95 and abs(coupled[1]) < 0.05  # barely decayed / driven to 0
assert np.allclose(decoupled, (1 - 0.01 * 0.1) ** 200, atol=0.02)  # the same factor for both


# %% [markdown]
# Now on a real problem: the same two-layer network (same initial weights, re-seeded for each
# run) trained for 5 epochs on the digits. Momentum's gain is stability, so we give it a step
# that is too large for plain SGD:
#
# * SGD with $\alpha = 0.1$, and SGD with $\alpha = 0.5$;
# * momentum $\beta = 0.9$ with $\alpha = 0.5$;
# * Adam with $\alpha = 0.01$.

# %%
def small_net():
    np.random.seed(0)
    return nn.Sequential(nn.Linear(784, 64), nn.ReLU(), nn.Linear(64, 10))


def train_curve(opt_cls, epochs=5, **kw):
    model = small_net()
    opt = opt_cls(model.parameters(), **kw)
    loss_fn = nn.SoftmaxLoss()
    np.random.seed(1)
    curve = []
    for _ in range(epochs):
        for X, y in ndl.data.DataLoader(train_set, 100, shuffle=True):
            loss = loss_fn(model(X), y)
            opt.reset_grad()
            loss.backward()
            opt.step()
            curve.append(float(loss.numpy()))
    return np.array(curve)


runs = {
    "SGD, lr 0.1": train_curve(ndl.optim.SGD, lr=0.1),
    "SGD, lr 0.5": train_curve(ndl.optim.SGD, lr=0.5),
    "momentum 0.9, lr 0.5": train_curve(ndl.optim.SGD, lr=0.5, momentum=0.9),
    "Adam, lr 0.01": train_curve(ndl.optim.Adam, lr=0.01),
}
per_epoch = len(loader)
last = {name: curve[-per_epoch:].mean() for name, curve in runs.items()}
for name, curve in runs.items():
    print(f"{name:<21} loss: first batch {curve[0]:.3f}, mean over the last epoch {last[name]:.3f}")

# %%
fig, ax = plt.subplots(figsize=(6.5, 4))
for name, curve in runs.items():
    ax.plot(np.arange(1, len(curve) + 1) / per_epoch, curve, label=name)
ax.axhline(np.log(10), color="gray", ls=":", lw=1, label="chance level, log 10")
ax.xaxis.set_major_locator(MaxNLocator(integer=True))
ax.set_xlabel(f"epoch ({per_epoch} batches of 100 each)")
ax.set_ylabel("training loss (batch mean)")
ax.set_yscale("log")
ax.set_title("Too large a step leaves SGD at chance; momentum and Adam train fast")
ax.legend()
save_figure(fig, "optimizers")

# %% [markdown]
# All four start from the same loss, close to $\log 10 = 2.30$ (small random logits). SGD with
# $\alpha = 0.5$ overshoots and never recovers: its last epoch averages 2.23, which is **chance
# level** — the loss of predicting every class with probability $1/10$. It has learned nothing.
# At the same $\alpha$, momentum's averaged (and warmed-up) steps train well and end below the
# careful SGD run, and so does Adam.

# %%
assert all(abs(c[0] - np.log(10)) < 0.1 for c in runs.values())
assert abs(last["SGD, lr 0.5"] - np.log(10)) < 0.15
assert last["momentum 0.9, lr 0.5"] < last["SGD, lr 0.1"]
assert last["Adam, lr 0.01"] < last["SGD, lr 0.1"]


# %% [markdown]
# ## 5. Normalization and dropout: train versus eval
#
# **BatchNorm1d** normalises each *feature* over the batch,
# $y = w \cdot \frac{x - \mu_B}{\sqrt{\sigma_B^2 + \epsilon}} + b$ with the batch mean and the
# biased batch variance, and keeps running averages
# $\hat\mu \leftarrow (1 - m)\hat\mu + m\,\mu_B$ (momentum $m = 0.1$) for evaluation, where it
# uses $\hat\mu, \hat\sigma^2$ instead of the batch's. With $w = 1, b = 0$ the training output has
# mean 0 and variance $\sigma_B^2 / (\sigma_B^2 + \epsilon) \approx 1$ per feature.
#
# A hw2 trap: the homework's docstring calls `running_var` "the running (unbiased) variance",
# but its tests expect the update with the **biased** batch variance (divided by the batch size
# $B$, the same one the normalisation uses), as below. PyTorch updates with the unbiased one
# (divided by $B - 1$); the cell prints both.

# %%
x = (np.random.randn(64, 5) * 2.0 + 3.0).astype(np.float32)
bn = nn.BatchNorm1d(5, device=device)
out = bn(ndl.Tensor(x, device=device)).numpy()
print("train-mode mean per feature:", np.round(out.mean(axis=0), 4) + 0.0)
print("train-mode var  per feature:", np.round(out.var(axis=0), 4))
assert np.abs(out.mean(axis=0)).max() < 1e-5
assert np.allclose(out.var(axis=0), x.var(axis=0) / (x.var(axis=0) + 1e-5), atol=1e-4)
assert np.allclose(bn.running_mean.numpy(), 0.1 * x.mean(axis=0), atol=1e-5)
assert np.allclose(bn.running_var.numpy(), 0.9 + 0.1 * x.var(axis=0), atol=1e-4)
print("running_var after one batch:", np.round(bn.running_var.numpy(), 4),
      "(biased batch variance, as hw2's tests expect)")
print("with the unbiased variance:  ", np.round(0.9 + 0.1 * x.var(axis=0, ddof=1), 4),
      "(PyTorch's running_var)")

bn.eval()
out_eval = bn(ndl.Tensor(x, device=device)).numpy()
manual = (x - bn.running_mean.numpy()) / np.sqrt(bn.running_var.numpy() + 1e-5)
assert np.allclose(out_eval, manual, atol=1e-5)
print(f"eval-mode mean of feature 0: {out_eval[:, 0].mean():.3f} (running stats have seen one batch)")

# %% [markdown]
# **LayerNorm1d** normalises each *sample* over its features instead, so it behaves the same in
# training and evaluation and does not depend on the rest of the batch: every row comes out with
# mean 0 and variance $\approx 1$.

# %%
ln = nn.LayerNorm1d(5, device=device)
out_ln = ln(ndl.Tensor(x, device=device)).numpy()
assert np.abs(out_ln.mean(axis=1)).max() < 1e-5
assert np.allclose(out_ln.var(axis=1), x.var(axis=1) / (x.var(axis=1) + 1e-5), atol=1e-4)
print("LayerNorm: every row mean within 1e-5 of 0:", bool(np.abs(out_ln.mean(axis=1)).max() < 1e-5))

# %% [markdown]
# **Dropout(p)** zeroes each activation with probability $p$ during training and scales the
# survivors by $1/(1 - p)$, so the expected activation is unchanged; in evaluation it is the
# identity. With $p = 0.5$ on 100,000 ones: about half the values become 0, the rest 2, and the
# mean stays near 1.

# %%
drop = nn.Dropout(p=0.5)
ones = ndl.Tensor(np.ones((1000, 100), dtype=np.float32), device=device)
d = drop(ones).numpy()
zero_frac = (d == 0).mean()
print(f"values: {sorted(set(np.unique(d).tolist()))}, zero fraction {zero_frac:.3f}, mean {d.mean():.3f}")
assert set(np.unique(d).tolist()) <= {0.0, 2.0}
assert abs(zero_frac - 0.5) < 0.01 and abs(d.mean() - 1.0) < 0.02
drop.eval()
assert np.array_equal(drop(ones).numpy(), ones.numpy())

# %% [markdown]
# ## 6. An MLP-ResNet
#
# hw2's final model stacks residual blocks. Each block computes
# $\mathrm{ReLU}\big(x + \mathrm{Norm}(W_2\, \mathrm{Dropout}(\mathrm{ReLU}(\mathrm{Norm}(W_1 x))))\big)$
# with the inner width halved; the network is
# `Linear(784, 100) → ReLU → 3 residual blocks → Linear(100, 10)`. `mlp_resnet.epoch` runs one
# pass — training mode and optimizer steps when given an optimizer, evaluation mode otherwise —
# and returns (error rate, mean batch loss). We train with the course's defaults, Adam with
# $\alpha = 0.001$ and weight decay $0.001$ (coupled L2, section 4), and dropout
# $p = 0.1$ in every block, for 10 epochs. In Jupyter the curves are redrawn in place as the
# epochs finish (`companion.viz.LiveCurves`); the figure after the loop is the static copy.

# %%
model = mlp_resnet.MLPResNet(784, hidden_dim=100, num_blocks=3, num_classes=10)
n_params = sum(int(np.prod(p.shape)) for p in model.parameters())
print(f"{n_params} parameters")
assert n_params == (784 * 100 + 100) + 3 * (100 * 50 + 50 + 2 * 50 + 50 * 100 + 100 + 2 * 100) + (100 * 10 + 10)

# %%
np.random.seed(4)
train_loader = ndl.data.DataLoader(train_set, 100, shuffle=True)
test_loader = ndl.data.DataLoader(test_set, 100)
opt = ndl.optim.Adam(model.parameters(), lr=0.001, weight_decay=0.001)
history = []
with LiveCurves({"error rate": ["train error", "test error"], "loss": ["train loss", "test loss"]},
                logy=["error rate", "loss"], title="MLP-ResNet on the digits (live)") as live:
    for ep in range(10):
        tr_err, tr_loss = mlp_resnet.epoch(train_loader, model, opt, progress=False)
        te_err, te_loss = mlp_resnet.epoch(test_loader, model, progress=False)
        history.append((tr_err, tr_loss, te_err, te_loss))
        print(f"epoch {ep + 1:>2}: train err {tr_err:.3f} loss {tr_loss:.3f} | "
              f"test err {te_err:.3f} loss {te_loss:.3f}")
        live.add(ep + 1, {"train error": tr_err, "test error": te_err,
                          "train loss": tr_loss, "test loss": te_loss})

# %% [markdown]
# On the digits the MLP-ResNet reaches about **98% test accuracy**. How sure is that figure? The
# test set has only 297 images, so each one is a third of a percentage point, and the error
# rate is a count of mistakes: with $k$ of $n$ wrong, the 95% (Wilson) interval for the true
# error rate is printed below. A model that differs from this one by a few test images, such
# as notebook 01's softmax regression and two-layer network on the same 297 images, lies inside
# that interval: these runs cannot rank the models (that would take a larger test set, several
# seeds, or a paired comparison on the same images).

# %%
def wilson_interval(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval (95% for z = 1.96) for an error rate of k mistakes in n."""
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


test_acc = 1 - history[-1][2]
n_test = len(test_set)
wrong = int(round(history[-1][2] * n_test))
lo, hi = wilson_interval(wrong, n_test)
print(f"final test accuracy {test_acc:.3f}: {wrong} of {n_test} test images wrong")
print(f"95% interval for the error rate: [{lo:.3f}, {hi:.3f}], "
      f"i.e. {lo * n_test:.1f} to {hi * n_test:.1f} images")
assert test_acc > 0.9
if DATASET == "digits":
    assert abs(test_acc - 0.98) < 0.01
    # notebook 01's two models, trained again here as notebook 01 trains them
    state = np.random.get_state()
    X01_tr, y01_tr = companion.data.load_digits_mnist_like(28, train=True)
    X01_te, y01_te = companion.data.load_digits_mnist_like(28, train=False)
    settings = dict(epochs=20, lr=0.2, batch=100, verbose=False)
    wrong01 = {
        "softmax regression": sm.train_softmax(X01_tr, y01_tr, X01_te, y01_te, **settings),
        "two-layer net": sm.train_nn(X01_tr, y01_tr, X01_te, y01_te, hidden_dim=100, **settings),
    }
    np.random.set_state(state)
    for name, hist01 in wrong01.items():
        k01 = int(round(hist01[-1]["test_err"] * n_test))
        inside = lo * n_test <= k01 <= hi * n_test
        print(f"notebook 01's {name}: {k01} wrong, {'inside' if inside else 'outside'} the interval")
        assert inside

# %%
fig, ax = plt.subplots(figsize=(6, 3.6))
h = np.array(history)
ep = np.arange(1, len(h) + 1)
ax.plot(ep, h[:, 0], "o--", label="train error (train mode: dropout on)")
ax.plot(ep, h[:, 2], "o-", label="test error (eval mode)")
ax.set_yscale("log")
ax.xaxis.set_major_locator(MaxNLocator(integer=True))
ax.set_xlabel("epoch")
ax.set_ylabel("error rate (log scale)")
ax.set_title("MLP-ResNet on the digits")
ax.legend()
plt.show()

# %% [markdown]
# ## 7. Regularization, and why normalization helps
#
# The run above **overfits**: the training error keeps falling to almost nothing while the test
# error stops improving, so the later epochs fit the training set's particulars, not the task.
# The numbers, from the history printed above:

# %%
h = np.array(history)  # columns: train err, train loss, test err, test loss
plateau = next(e for e in range(len(h)) if np.all(np.abs(h[e:, 2] - h[-1, 2]) <= 3 / n_test))
print(f"train error: {h[plateau, 0]:.3f} at epoch {plateau + 1}, {h[-1, 0]:.3f} at epoch {len(h)}")
print(f"test error from epoch {plateau + 1} on: between {h[plateau:, 2].min():.3f} and "
      f"{h[plateau:, 2].max():.3f} (within 3 images of the final {h[-1, 2]:.3f})")
print(f"final loss: train {h[-1, 1]:.3f}, test {h[-1, 3]:.3f} "
      f"({h[-1, 3] / h[-1, 1]:.1f}x the training loss)")
if DATASET == "digits":
    assert h[-1, 0] < h[plateau, 0] / 4 and h[-1, 3] > 2 * h[-1, 1]

# %% [markdown]
# **Regularization** is anything that keeps a model from fitting its training set as closely as
# its parameters allow, in the hope of a smaller gap. Lecture 9 pairs it with normalization;
# of its regularizers this run already uses two.
#
# * **L2 regularization / weight decay** adds $\frac{\lambda}{2}\lVert\theta\rVert^2$ to the
#   loss: large weights cost something, so the model prefers small ones. Its gradient
#   $\lambda\theta$ is exactly what `weight_decay` adds (section 4). The check: one SGD step
#   with `weight_decay=λ` equals one step on the penalised loss, differentiated by autograd.

# %%
lam = 0.01
model_a, model_b = small_net(), small_net()  # same weights
X_reg, y_reg = next(iter(ndl.data.DataLoader(train_set, 100)))
opt_a = ndl.optim.SGD(model_a.parameters(), lr=0.1, weight_decay=lam)
opt_b = ndl.optim.SGD(model_b.parameters(), lr=0.1)
nn.SoftmaxLoss()(model_a(X_reg), y_reg).backward()
penalty = sum((p * p).sum() for p in model_b.parameters()) * (lam / 2)
(nn.SoftmaxLoss()(model_b(X_reg), y_reg) + penalty).backward()
opt_a.step()
opt_b.step()
gap = max(np.abs(a.numpy() - b.numpy()).max()
          for a, b in zip(model_a.parameters(), model_b.parameters()))
print(f"SGD(weight_decay={lam}) and SGD on loss + {lam}/2 |θ|² agree to 1e-6: {gap < 1e-6}")
assert gap < 1e-6

# %% [markdown]
# * **Dropout** zeroes random activations in training (section 5). Each step trains a
#   different random sub-network, so no unit can rely on particular others being present; the
#   network becomes a kind of average of many thinned networks, and the $1/(1-p)$ scaling makes
#   evaluation mode (no dropout) that average's expected output. (How many different masks
#   this run actually drew is measured below.)
#
# Dropout and BatchNorm also mean that the training error above, measured in training mode,
# is the error of a *different function* from the test error: in training mode dropout is on
# and BatchNorm normalises with each batch's own statistics; in evaluation mode dropout is off
# and BatchNorm uses its running averages. The like-for-like gap evaluates the trained model on
# the training set in evaluation mode:

# %%
train_eval_err, train_eval_loss = mlp_resnet.epoch(ndl.data.DataLoader(train_set, 100), model,
                                                   progress=False)
print(f"training set, last epoch, train mode: error {h[-1, 0]:.4f}")
print(f"training set, trained model, eval mode: error {train_eval_err:.4f}, "
      f"loss {train_eval_loss:.3f}")
print(f"test set, eval mode:                    error {h[-1, 2]:.4f}, loss {h[-1, 3]:.3f}")
direction = "higher" if train_eval_err > h[-1, 0] else "lower"
where = "below" if train_eval_err < lo else "inside"
print(f"eval mode puts the training error {direction} than train mode did; in the same mode it "
      f"lies {where} the test error's 95% interval [{lo:.3f}, {hi:.3f}], and the test loss is "
      f"{h[-1, 3] / train_eval_loss:.1f}x the training loss")
assert train_eval_err < h[-1, 2] and train_eval_loss < h[-1, 3]  # still a gap in eval mode

# %% [markdown]
# Why does evaluation mode get *more* training images wrong than training mode did, when
# training mode has dropout on? Three suspects, each measured below on the trained model and
# the 1,500 training images:
#
# * **the running statistics**: BatchNorm's running averages (momentum 0.1: mostly the last ten
#   or so of an epoch's fifteen batches) lag behind weights that kept changing; re-estimating
#   them with a cumulative average over one pass of the training set (dropout off, nothing
#   trained) removes the lag;
# * **the weights changing during the epoch**: the train-mode figure was accumulated batch by
#   batch while the weights moved; evaluating the final weights in train mode removes that;
# * **the dropout masks**: `mlp_resnet.epoch`, like the course's, starts every epoch with
#   `np.random.seed(4)`, so every epoch shuffles the same way and draws the **same** dropout
#   masks; train mode with the epochs' own seed replays those masks, and another seed draws
#   new ones.
#
# A forward pass in training mode also updates the running statistics, so each measurement
# puts the trained model's running statistics back afterwards.

# %%
norms = [m for m in model._children() if isinstance(m, nn.BatchNorm1d)]
saved = [(bn.running_mean, bn.running_var) for bn in norms]


def restore_running_stats() -> None:
    """Give every BatchNorm1d the running statistics it had after training."""
    for bn, (mean, var) in zip(norms, saved):
        bn.running_mean, bn.running_var = mean, var


def wrong_on_train(batch_stats: bool, dropout: bool, seed: int, shuffle: bool) -> int:
    """Training images the trained model gets wrong with BatchNorm's batch statistics or
    running averages, dropout on or off, numpy seeded with `seed` (no training)."""
    np.random.seed(seed)
    for m in model._children():
        if isinstance(m, nn.BatchNorm1d):
            m.training = batch_stats
        elif isinstance(m, nn.Dropout):
            m.training = dropout
    loader = ndl.data.DataLoader(train_set, 100, shuffle=shuffle)
    wrong = sum(int((model(X).numpy().argmax(axis=1) != y.numpy()).sum()) for X, y in loader)
    if batch_stats:
        restore_running_stats()
    return wrong


def reestimate_running_stats() -> None:
    """Replace each BatchNorm1d's running statistics with their average over one pass."""
    for m in model._children():
        m.training = isinstance(m, nn.BatchNorm1d)  # batch statistics on, dropout off
    for i, (X, _) in enumerate(ndl.data.DataLoader(train_set, 100), start=1):
        for bn in norms:
            bn.momentum = 1 / i  # running = the mean of the first i batches' statistics
        model(X)
    for bn in norms:
        bn.momentum = 0.1


n_train = len(train_set)
rows = {
    "train mode, the epochs' own masks (seed 4)": wrong_on_train(True, True, 4, shuffle=True),
    "train mode, new masks (seed 5)": wrong_on_train(True, True, 5, shuffle=True),
    "batch statistics, dropout off": wrong_on_train(True, False, 5, shuffle=True),
    "eval mode, running statistics as trained": wrong_on_train(False, False, 5, shuffle=False),
}
reestimate_running_stats()
rows["eval mode, running statistics re-estimated"] = wrong_on_train(False, False, 5, shuffle=False)
restore_running_stats()
model.eval()
print(f"last epoch, as training measured it: {round(h[-1, 0] * n_train)} of {n_train} wrong")
for name, wrong in rows.items():
    print(f"{name:<44} {wrong:>3} of {n_train} wrong")
own, new = rows["train mode, the epochs' own masks (seed 4)"], rows["train mode, new masks (seed 5)"]
as_trained = rows["eval mode, running statistics as trained"]
redone = rows["eval mode, running statistics re-estimated"]
print(f"verdict: new dropout masks change the train-mode count by {new - own:+d} images, "
      f"re-estimating the running statistics changes the eval-mode count by {redone - as_trained:+d}")
assert as_trained == round(train_eval_err * n_train)
if DATASET == "digits":
    assert new - own > 10 * abs(redone - as_trained)  # the masks, not the running statistics

# %% [markdown]
# The epochs' own masks reproduce the count training reported (1 image), and new masks raise it
# to 45: the network has fitted the training set *under the fifteen mask patterns it saw in
# every epoch*, so train mode's near-zero error was a replay of those masks, not a measurement
# of the model. Re-estimating the running statistics moves the eval-mode count by one image,
# so they were not lagging; with dropout off and batch statistics the count (14) is of the
# same order as eval mode's. The honest training error is eval mode's 10 images.
#
# The seeding also weakens dropout as a regularizer here: the description above ("each step
# trains a different random sub-network") holds within an epoch, but every epoch repeats the
# same fifteen sub-networks. The course seeds each epoch so that its tests are reproducible; a
# training loop of your own should seed once, before the first epoch.

# %% [markdown]
# The gap in this run is what remains *with* dropout $p = 0.1$ and $\lambda = 10^{-3}$: both
# are mild, and on 1,500 training images a network of 110,860 parameters can still memorise.
# Stronger settings, more data or augmentation (section 2) are the usual next steps; whether
# one of them helps here would have to show up as a difference larger than the interval of
# section 6.
#
# **Normalization**, the lecture's other half, is mainly an **optimization aid**, with a mild
# regularizing side effect (BatchNorm's batch statistics add noise). Without it, the
#   scale of the activations drifts from layer to layer by a factor that depends on the
#   weights' scale, so one learning rate cannot suit every layer, and with depth a slightly
#   wrong initialisation makes the activations (and the gradients flowing back through them)
#   vanish or explode. BatchNorm and LayerNorm reset every
#   layer's output to mean 0 and variance 1, whatever the weights. The cell sends a batch
#   through 20 ReLU layers of width 100 with weights $\mathcal N(0, \sigma^2 / 100)$: Kaiming's
#   $\sigma^2 = 2$ keeps the scale on average (the finite width makes it wander a little),
#   $\sigma^2 = 1$ halves the second moment at every layer and $\sigma^2 = 3$ multiplies it by
#   1.5, so after 20 layers the RMS is predicted near $(\sigma^2/2)^{10}$ times the input's:
#   $2^{-10} \approx 0.001$ and $1.5^{10} \approx 58$. The cell prints each prediction next to
#   the measurement (the finite width makes them differ by a factor printed beside them); after
#   a `LayerNorm1d` in every layer all three stay at RMS 1.

# %%
def activation_scales(sigma2: float, norm: bool, depth: int = 20, width: int = 100):
    """RMS of the activations after each of `depth` ReLU layers (weights N(0, sigma2/width))."""
    np.random.seed(0)
    x = ndl.Tensor(np.random.randn(100, width).astype(np.float32), device=device)
    layer_norm = nn.LayerNorm1d(width, device=device)
    scales = []
    for _ in range(depth):
        W = ndl.Tensor((np.random.randn(width, width) * np.sqrt(sigma2 / width))
                       .astype(np.float32), device=device)
        x = ndl.relu(x @ W)
        if norm:
            x = layer_norm(x)
        scales.append(float(np.sqrt((x.numpy() ** 2).mean())))
    return np.array(scales)


sigmas = (1.0, 2.0, 3.0)
plain = {s2: activation_scales(s2, norm=False) for s2 in sigmas}
normed = {s2: activation_scales(s2, norm=True) for s2 in sigmas}
for s2 in sigmas:
    predicted = (s2 / 2) ** 10
    print(f"sigma^2 = {s2:.0f}: RMS after layer 20: {plain[s2][-1]:9.3g} without normalization "
          f"(predicted {predicted:.3g}, measured/predicted {plain[s2][-1] / predicted:.2f}), "
          f"{normed[s2][-1]:.3f} with LayerNorm1d")
    assert 0.5 < plain[s2][-1] / predicted < 2  # within a factor of two
assert all(abs(normed[s2][-1] - 1) < 0.01 for s2 in sigmas)
ratios = [plain[s2][-1] / (s2 / 2) ** 10 for s2 in sigmas]
assert max(ratios) / min(ratios) < 1.001  # one random draw, scaled: the same factor

fig, ax = plt.subplots(figsize=(6, 3.6))
for s2, c in zip(sigmas, ["C0", "C1", "C2"]):
    ax.plot(np.arange(1, 21), plain[s2], "o-", color=c, ms=3, label=f"σ² = {s2:.0f}, plain")
    ax.plot(np.arange(1, 21), normed[s2], "--", color=c, label=f"σ² = {s2:.0f}, LayerNorm1d")
ax.set_yscale("log")
ax.xaxis.set_major_locator(MaxNLocator(integer=True))
ax.set_xlabel("layer")
ax.set_ylabel("RMS activation (log scale)")
ax.set_title("Normalization keeps every layer at one scale, whatever the weights' scale")
ax.legend(fontsize=7, ncol=2)
plt.show()

# %% [markdown]
# The measured factor is the same for all three scales: the three nets draw the same random
# numbers (the same seed), only scaled, and a ReLU network is positively homogeneous
# ($\mathrm{ReLU}(cz) = c\,\mathrm{ReLU}(z)$ for $c > 0$), so the scale multiplies the output by
# exactly $(\sigma^2/2)^{10}$. What separates the measurement from the prediction is that one
# random draw of a finite-width network, not the scale.
#
# That the activations stay at scale is true by construction (it is what LayerNorm computes).
# What matters is whether the network then **trains** better. The cell trains the same 20-layer
# ReLU MLP (width 100, the hidden layers' weights drawn with the mis-scaled $\sigma^2 = 1$ and
# $\sigma^2 = 3$) with and without a `LayerNorm1d` after every hidden layer, for 5 epochs with
# Adam ($\alpha = 10^{-3}$), and prints the first batch's loss and the mean loss of the last
# epoch for each, with a verdict per $\sigma^2$ computed from them.

# %%
def deep_mlp(sigma2: float, norm: bool, depth: int = 20, width: int = 100) -> nn.Module:
    """784 -> width -> ... -> 10 ReLU MLP; hidden weights N(0, sigma2/width), LayerNorm1d
    after every hidden Linear when `norm`."""
    np.random.seed(0)
    layers = [nn.Linear(784, width), nn.ReLU()]
    for _ in range(depth - 1):
        linear = nn.Linear(width, width)
        linear.weight.data = ndl.Tensor(
            (np.random.randn(width, width) * np.sqrt(sigma2 / width)).astype(np.float32))
        layers += [linear] + ([nn.LayerNorm1d(width)] if norm else []) + [nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 10))


def train_losses(net: nn.Module, epochs: int = 5) -> np.ndarray:
    """Every batch's training loss over `epochs` epochs of Adam(lr=1e-3)."""
    opt = ndl.optim.Adam(net.parameters(), lr=1e-3)
    np.random.seed(1)
    losses = []
    for _ in range(epochs):
        for X, y in ndl.data.DataLoader(train_set, 100, shuffle=True):
            loss = nn.SoftmaxLoss()(net(X), y)
            opt.reset_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.numpy()))
    return np.array(losses)


deep_runs = {(s2, norm): train_losses(deep_mlp(s2, norm)) for s2 in (1.0, 3.0) for norm in (False, True)}
batches = len(deep_runs[1.0, False]) // 5
for (s2, norm), losses in deep_runs.items():
    print(f"sigma^2 = {s2:.0f}, {'LayerNorm1d' if norm else 'plain      '}: first batch loss "
          f"{losses[0]:7.2f}, last epoch mean {losses[-batches:].mean():.3f}")
for s2 in (1.0, 3.0):
    plain_last = deep_runs[s2, False][-batches:].mean()
    norm_last = deep_runs[s2, True][-batches:].mean()
    start = deep_runs[s2, False][0]
    print(f"verdict, sigma^2 = {s2:.0f}: the plain net starts at loss {start:.1f} "
          f"({start / np.log(10):.1f}x chance's log 10) and ends "
          + (f"{plain_last / norm_last:.1f}x higher than" if plain_last > norm_last
             else f"{norm_last / plain_last:.1f}x lower than")
          + " the normalized one")

fig, ax = plt.subplots(figsize=(6, 3.6))
for (s2, norm), losses in deep_runs.items():
    ax.plot(np.arange(1, len(losses) + 1) / batches, losses, "-" if norm else "--",
            color="C0" if s2 == 1.0 else "C2",
            label=f"σ² = {s2:.0f}, {'LayerNorm1d' if norm else 'plain'}")
ax.axhline(np.log(10), color="gray", ls=":", lw=1, label="chance, log 10")
ax.set_yscale("log")
ax.xaxis.set_major_locator(MaxNLocator(integer=True))
ax.set_xlabel("epoch")
ax.set_ylabel("training loss (batch mean, log scale)")
ax.set_title("A 20-layer MLP with mis-scaled weights, with and without LayerNorm1d")
ax.legend(fontsize=7)
plt.show()
if DATASET == "digits":
    assert deep_runs[1.0, False][-batches:].mean() > 2 * deep_runs[1.0, True][-batches:].mean()
    assert deep_runs[3.0, False][0] > 10 * deep_runs[3.0, True][0]

# %% [markdown]
# With weights too small ($\sigma^2 = 1$) the plain network's signal and gradients shrink
# layer after layer and it trains slowly: its last epoch's loss is several times the
# normalized network's (the verdict line gives the factor). With weights too large
# ($\sigma^2 = 3$) its first loss is some twenty times chance's, from logits blown up by the
# layers; LayerNorm starts it at chance. Adam divides each step by the gradient's own scale,
# so the plain $\sigma^2 = 3$ network recovers from that start and, here, ends lower than the
# normalized one. Normalization is an optimization aid: it makes training insensitive to the
# weights' scale, which does not promise a lower final loss in every run.

# %% [markdown]
# ## Exercises
#
# Each exercise has a cell to fill in (it starts as `raise NotImplementedError`) and a check
# cell that says whether your answer is right: "not answered yet", "correct", or "not yet"
# with what differs. The first cell below gathers everything the exercises use, so this
# section also runs on its own after a kernel restart. Reference answers are in
# `notebooks/solutions/04_training.py`; try first.

# %% tags=["exercise-setup"]
import numpy as np

import needle as ndl
from needle import init, nn, optim
from companion.check.exercises import check_exercise

rng = np.random.default_rng(0)
theta_ex = rng.standard_normal((3, 2)).astype(np.float32)
grads_ex = [rng.standard_normal((3, 2)).astype(np.float32) for _ in range(4)]


def run_optimizer(make, theta0, grads):
    """The parameter after one step() per gradient in grads, with the optimizer make([p])."""
    p = nn.Parameter(ndl.Tensor(theta0))
    opt = make([p])
    for g in grads:
        p.grad = ndl.Tensor(g)
        opt.step()
    return p.numpy()


# %% [markdown]
# **Exercise 4.1 (the course's momentum).** Write the SGD update with momentum in the course's
# form — $u \leftarrow \beta u + (1 - \beta) g$, $\theta \leftarrow \theta - \eta u$ with $u$
# starting at 0 — applied once per gradient in `grads`. The check runs `optim.SGD`.

# %% tags=["exercise-stub"]
def sgd_momentum(theta0, grads, lr, momentum):
    """theta after one momentum-SGD step per gradient in grads (numpy)."""
    raise NotImplementedError


# %% tags=["exercise-check"]
check_exercise("4.1 sgd_momentum", lambda: sgd_momentum(theta_ex, grads_ex, 0.1, 0.9),
               run_optimizer(lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9), theta_ex, grads_ex),
               rtol=1e-5, atol=1e-6)

# %% [markdown]
# **Exercise 4.2 (Adam's bias correction).** Section 4 showed Adam's first step. Write the
# change $\theta_2 - \theta_0$ after **two** steps of `optim.Adam(lr=lr)` (default betas 0.9
# and 0.999, $\epsilon = 10^{-8}$, no weight decay) with gradients `g1` and then `g2`: the
# second step divides the averages by $1 - \beta^2$, and no longer moves every coordinate by
# the same amount.

# %% tags=["exercise-stub"]
def adam_two_steps(g1, g2, lr):
    """theta_2 - theta_0 for two Adam steps with gradients g1, then g2."""
    raise NotImplementedError


# %% tags=["exercise-check"]
check_exercise("4.2 adam_two_steps", lambda: adam_two_steps(grads_ex[0], grads_ex[1], 0.01),
               run_optimizer(lambda ps: optim.Adam(ps, lr=0.01), theta_ex, grads_ex[:2])
               - theta_ex, rtol=1e-3, atol=1e-6)

# %% [markdown]
# **Exercise 4.3 (an initialisation's spread).** `init.kaiming_normal(fan_in, fan_out)` draws
# from $\mathcal N(0, \sigma^2)$ so that ReLU layers keep their activations' second moment.
# Write $\sigma$ as a formula; the check measures the spread of 200 000 draws. (Notebook 03
# derives it: rebuild the formula from that argument rather than looking it up.)

# %% tags=["exercise-stub"]
def kaiming_normal_std(fan_in):
    """The standard deviation of init.kaiming_normal(fan_in, fan_out)."""
    raise NotImplementedError


# %% tags=["exercise-check"]
def _measured_std(fan_in):
    np.random.seed(0)
    return float(init.kaiming_normal(fan_in, 200_000 // fan_in).numpy().std())


check_exercise("4.3 kaiming_normal_std", lambda: [kaiming_normal_std(f) for f in (10, 500)],
               [_measured_std(f) for f in (10, 500)], rtol=0.01)
