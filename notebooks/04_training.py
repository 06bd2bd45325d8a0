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
# the course's momentum and Adam; tell a diverged run from a slow one; use BatchNorm, LayerNorm
# and Dropout correctly in training and evaluation mode; train an MLP-ResNet
#
# **Run time:** about 55 s on a 2-core x86-64 machine
#
# Homework 2 turns needle from an autodiff engine into a training library. This notebook walks
# through the pieces in the order a training loop uses them:
#
# 1. **data** — a `Dataset` that indexes samples, `transforms` that augment them, and a
#    `DataLoader` that cuts an epoch into shuffled mini-batches of Tensors;
# 2. **optimizers** — SGD, SGD with momentum, and Adam, compared on the same model;
# 3. **normalization and regularization** — BatchNorm, LayerNorm and Dropout, whose behaviour
#    differs between training and evaluation;
# 4. an **MLP-ResNet**, hw2's final model, trained to high accuracy.
#
# Everything runs offline on scikit-learn's handwritten digits in MNIST's 28 × 28 layout
# (`companion.data.DigitsDataset`); the parameter cell switches to MNIST after `make data`.

# %% tags=["remove-cell"]
# Colab set-up (written by `python -m companion.colab --write`): in Colab this installs needle
# and compiles its CPU module, and its CUDA module for the GPU runtime's GPU (about 2-3 minutes);
# anywhere else it does nothing.
import importlib.util, os, sys
in_colab = "google.colab" in sys.modules or os.environ.get("NEEDLE_COLAB_SIMULATE") == "1"
if in_colab and importlib.util.find_spec("needle"):
    print("needle is installed (by this cell, earlier in this Colab session)")
elif in_colab:
    import importlib, shutil, subprocess
    repo = os.environ.get("NEEDLE_COLAB_REPO", "https://github.com/needle-companion/needle-companion")
    repo = "file://localhost" + os.path.abspath(repo) if os.path.isdir(repo) else repo
    env = dict(os.environ)
    if not shutil.which("nvcc") and os.path.exists("/usr/local/cuda/bin/nvcc"):
        env["CUDACXX"] = "/usr/local/cuda/bin/nvcc"
    cap = os.environ.get("NEEDLE_COLAB_GPU_CAP", "")
    if not cap and shutil.which("nvidia-smi"):  # the GPU's compute capability: T4 7.5, A100 8.0, L4 8.9
        cap = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True).stdout.strip().split("\n")[0]
    cap = cap if cap.replace(".", "").isdigit() else ""
    if cap:  # the CUDA module for this GPU's architecture only
        env["CUDAARCHS"] = cap.replace(".", "") + "-real"
    else:  # no GPU: no CUDA module (Runtime > Change runtime type > GPU, then run this again)
        env["CMAKE_ARGS"] = (env.get("CMAKE_ARGS", "") + " -DNEEDLE_CUDA=OFF").strip()
    print(f"installing needle from {repo} (GPU: {cap or 'none'}); this takes 2-3 minutes")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                           f"needle @ git+{repo}"],
                          env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError("pip install failed:\n" + done.stdout[-3000:] + done.stderr[-3000:])
    importlib.invalidate_caches()
    import needle
    print("needle installed:", "cuda() is available" if needle.cuda().enabled() else "cpu() only")

# %%
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator
import numpy as np

import needle as ndl
import needle.nn as nn
import companion.data
from companion.apps import mlp_resnet
from companion.viz import save_figure

np.random.seed(0)
device = ndl.cpu()  # where needle's layers put their parameters by default

# %%
DATASET = "digits"  # or "mnist" after `make data`

# %%
DATA_DIR = Path(ndl.__file__).resolve().parents[1] / "data"
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
# (Mirroring a digit changes what it means; the course tests flips on MNIST anyway, and uses
# them for real on CIFAR-10 in hw4.)

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
plt.show()

# %% [markdown]
# ## 3. The DataLoader
#
# `DataLoader(dataset, batch_size, shuffle)` splits the index order into consecutive chunks of
# `batch_size` (`np.array_split`, so the last batch may be smaller) and yields each batch as a
# tuple of Tensors. With `shuffle=True` it draws a fresh `np.random.permutation` at the start of
# every epoch. 1,500 samples in batches of 100 give 15 batches; every sample appears exactly
# once per epoch.

# %%
loader = ndl.data.DataLoader(train_set, batch_size=100, shuffle=True, device=device)
seen = []
for X, y in loader:
    seen.append(y.numpy())
print(f"{len(seen)} batches; first batch X {X.shape}, y {y.shape}; X is a {type(X).__name__}")
if DATASET == "digits":
    assert len(loader) == 15
    assert sorted(np.concatenate(seen).astype(int).tolist()) == sorted(train_set.labels.astype(int).tolist())

# %% [markdown]
# (`device=` is an extension of needle's loader: it puts the batches on the same device as the
# model's parameters. `mlp_resnet.epoch` moves batches itself, so the course's calls work
# unchanged.)
#
# ## 4. Optimizers
#
# An optimizer holds the parameters and updates them from their `.grad` after each
# `backward()`. With gradient $g$ (plus weight decay $\lambda\theta$):
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
# The course's momentum differs from PyTorch's in two ways that change the step size.
# PyTorch *sums* the gradients, $u \leftarrow \beta u + g$, so at a steady gradient its steps
# grow to $1/(1-\beta) = 10$ times SGD's; the course *averages* them, so its steps approach
# SGD's size, only smoother. And unlike Adam, the course's momentum has **no bias correction**:
# $u$ starts at 0, so after $t$ steps of a constant gradient $g$ it is $(1 - \beta^t)\,g$. The
# first step is $1 - 0.9 = 0.1$ of SGD's, ten times smaller, and the steps only reach SGD's size
# after a few tens of steps — a built-in warm-up. We measure it on the linear loss
# $L(w) = g^\top w$, whose gradient is the constant $g$:

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


t_steps = np.arange(1, 31)
mom_sizes = step_sizes(30, lr=0.1, momentum=0.9)
sgd_sizes = step_sizes(30, lr=0.1)
for t in (1, 2, 5, 10, 30):
    print(f"step {t:2d}: momentum step / SGD step = {mom_sizes[t - 1]:.3f} "
          f"(1 - 0.9^{t} = {1 - 0.9 ** t:.3f})")
assert np.allclose(sgd_sizes, 1, atol=1e-5)
assert np.allclose(mom_sizes, 1 - 0.9 ** t_steps, atol=1e-4)

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
        for X, y in ndl.data.DataLoader(train_set, 100, shuffle=True, device=device):
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
plt.show()

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
# $\alpha = 0.001$ and weight decay $0.001$, for 10 epochs.

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
for ep in range(10):
    tr_err, tr_loss = mlp_resnet.epoch(train_loader, model, opt, progress=False)
    te_err, te_loss = mlp_resnet.epoch(test_loader, model, progress=False)
    history.append((tr_err, tr_loss, te_err, te_loss))
    print(f"epoch {ep + 1:>2}: train err {tr_err:.3f} loss {tr_loss:.3f} | test err {te_err:.3f} loss {te_loss:.3f}")

# %% [markdown]
# On the digits the MLP-ResNet reaches about **98% test accuracy**, better than the softmax
# regression and the two-layer network of notebook 01.

# %%
test_acc = 1 - history[-1][2]
print(f"final test accuracy {test_acc:.3f}")
assert test_acc > 0.9
if DATASET == "digits":
    assert abs(test_acc - 0.98) < 0.01

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
# **Exercise 4.2 (predict Adam's first step).** With bias correction, Adam's very first step
# does not depend on the gradient's size, only on its sign (up to $\epsilon$). Write the
# change $\theta_1 - \theta_0$ after one step of `optim.Adam(lr=lr)` (default betas and
# $\epsilon = 10^{-8}$) for gradient `g`.

# %% tags=["exercise-stub"]
def adam_first_step(g, lr):
    """theta_1 - theta_0 for one Adam step with gradient g."""
    raise NotImplementedError


# %% tags=["exercise-check"]
check_exercise("4.2 adam_first_step", lambda: adam_first_step(grads_ex[0], 0.01),
               run_optimizer(lambda ps: optim.Adam(ps, lr=0.01), theta_ex, grads_ex[:1])
               - theta_ex, rtol=1e-3, atol=1e-6)

# %% [markdown]
# **Exercise 4.3 (an initialisation's spread).** `init.kaiming_normal(fan_in, fan_out)` draws
# from $\mathcal N(0, \sigma^2)$ so that ReLU layers keep their activations' second moment.
# Write $\sigma$ as a formula; the check measures the spread of 200 000 draws.

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
