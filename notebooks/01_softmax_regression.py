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
# # 01 · Softmax regression, by hand (hw0)
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/needle-companion/needle-companion/blob/main/notebooks/01_softmax_regression.ipynb)
#
# **Lecture:** 2, "ML Refresher / Softmax Regression", and 3, "'Manual' Neural Networks"
#
# **Homework:** hw0 Q2 (`parse_mnist`), Q3 (`softmax_loss`), Q4 (`softmax_regression_epoch`),
# Q5 (`nn_epoch`, the two-layer network), Q6 (softmax regression in C++)
#
# **Prerequisites:** numpy; matrix calculus at the level of $\nabla_\theta (\theta^\top x)$
#
# **You will be able to:** write the softmax loss stably; derive and finite-difference check
# the gradients of softmax regression and of a two-layer ReLU network; train both with
# mini-batch SGD; move the inner loop to C++ and compare it with numpy
#
# **Run time:** about 12 s of CPU time on a 2-core x86-64 machine (38 s of wall time under
# heavy load)
#
# Before any framework, homework 0 trains two classifiers of handwritten digits with nothing
# but numpy — and then rewrites the inner loop in C++. Everything later in the course
# (automatic differentiation, modules, optimizers) exists to make *this* notebook's manual work
# unnecessary, so it is worth doing once by hand.
#
# The ingredients, for inputs $x \in \mathbb{R}^n$ and $k$ classes:
#
# * a **hypothesis** $h_\theta(x) = \theta^\top x \in \mathbb{R}^k$, one score (logit) per class;
# * the **softmax loss** (cross-entropy)
#   $\ell(h, y) = \log \sum_{j=1}^k e^{h_j} - h_y$, the negative log-probability that the
#   softmax $p_j = e^{h_j} / \sum_i e^{h_i}$ assigns to the true class $y$;
# * **stochastic gradient descent** over mini-batches $X_b \in \mathbb{R}^{b \times n}$:
#   $\theta \leftarrow \theta - \frac{\alpha}{b} X_b^\top (Z - I_y)$, where $Z$ holds the rows'
#   softmax probabilities and $I_y$ their one-hot labels.
#
# The functions live in `companion.apps.simple_ml` (the course's `apps/simple_ml.py`).

# %% tags=["remove-cell"] cellView="form" jupyter={"source_hidden": true}
#@title Colab set-up: in Colab this installs needle (2-3 minutes); elsewhere it does nothing
import os, shlex, subprocess, sys, tempfile; repo = os.environ.get("NEEDLE_COLAB_REPO", "https://github.com/needle-companion/needle-companion")
if "google.colab" in sys.modules or os.environ.get("NEEDLE_COLAB_SIMULATE") == "1":  # companion/colab_setup.py
    py, src, q = sys.executable, os.path.join(tempfile.gettempdir(), "needle-companion"), shlex.quote
    done = subprocess.run(f"{q(py)} -m companion.colab_setup --status 2>/dev/null || {{ {{ test -d {q(src)} || git clone -q --depth=1 {q(repo)} {q(src)}; }} && cd {q(src)} && {q(py)} -m companion.colab_setup --install {q(repo)} --cwd {q(os.getcwd())}; }}", shell=True, capture_output=True, text=True); print(done.stdout + done.stderr[-3000:], end=""); assert done.returncode == 0, f"the set-up could not install this project from {repo} (what failed is above)"

# %%
import gzip
import struct
import tempfile
import time

import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator
import numpy as np
from scipy.stats import binomtest

import needle as ndl
import companion.data
from companion import lecture
from companion.machine import machine_line
from companion.apps import simple_ml as sm
from companion.viz import save_figure

np.random.seed(0)

# %% [markdown]
# ## 1. The data
#
# The course uses MNIST (60,000 training and 10,000 test images, 28 × 28). This notebook runs
# offline on **scikit-learn's handwritten digits**: 1,797 real 8 × 8 scans that ship with the
# library, resized into MNIST's layout (a 20 × 20 digit centred in 28 × 28) by
# `companion.data.load_digits_mnist_like`, split 1,500 / 297. After `make data` you can switch the
# cell below to `"mnist"` and rerun everything on the real thing (the digits-specific numbers
# quoted in the text are only checked for the digits).

# %%
DATASET = "digits"  # or "mnist" after `make data`

# %%
DATA_DIR = lecture.data_dir()  # the checkout's data/ (make data), else ./data
if DATASET == "digits":
    X_tr, y_tr = companion.data.load_digits_mnist_like(28, train=True)
    X_te, y_te = companion.data.load_digits_mnist_like(28, train=False)
elif DATASET == "mnist":
    X_tr, y_tr = sm.parse_mnist(DATA_DIR / "train-images-idx3-ubyte.gz", DATA_DIR / "train-labels-idx1-ubyte.gz")
    X_te, y_te = sm.parse_mnist(DATA_DIR / "t10k-images-idx3-ubyte.gz", DATA_DIR / "t10k-labels-idx1-ubyte.gz")
else:
    raise ValueError(f"DATASET must be 'digits' or 'mnist', got {DATASET!r}")
k = int(y_tr.max()) + 1
print(f"train {X_tr.shape} {X_tr.dtype}, test {X_te.shape}, classes {k}")
print(f"pixel range [{X_tr.min():.1f}, {X_tr.max():.1f}], labels {y_tr.dtype}")
assert X_tr.shape[1] == 784 and k == 10

# %% [markdown]
# Each row is one image flattened to 784 numbers in $[0, 1]$. Reshaped back to 28 × 28 they are
# recognisable digits:

# %%
fig, axes = plt.subplots(1, 8, figsize=(8, 1.4))
for ax, img, label in zip(axes, X_tr[:8], y_tr[:8]):
    ax.imshow(img.reshape(28, 28), cmap="gray_r")
    ax.set_title(str(label))
    ax.axis("off")
fig.suptitle("Training images and their labels", y=1.12)
plt.show()

# %% [markdown]
# ### The IDX format (hw0 Q2, `parse_mnist`)
#
# MNIST ships as four gzipped **IDX** files, and hw0 Q2 asks for a reader. An IDX file is a
# header of big-endian unsigned 32-bit integers followed by the raw data, row-major:
#
# * a **magic number** whose third byte is the element type (`0x08` = uint8) and fourth the
#   number of dimensions: 2051 = `0x00000803` for the images (3-D), 2049 = `0x00000801` for
#   the labels (1-D);
# * one size per dimension: $N$, 28, 28 for the images, $N$ for the labels;
# * then $N \cdot 28 \cdot 28$ pixel bytes (0 = white, 255 = black), or $N$ label bytes.
#
# `parse_mnist` returns the images as float32 rows of 784 values scaled into $[0, 1]$ (divide
# by 255) and the labels as uint8. `companion.data.write_digits_idx` writes the offline digits
# in exactly MNIST's files, so the reader can be written and checked here: the cell reads the
# test pair with `gzip` and `struct.unpack(">IIII", ...)` (`>` is big-endian, `I` a uint32),
# and compares the result with the course's `parse_mnist` and with the arrays of section 1
# (stored as `round(255 x)`, so they agree to half a grey level, $1/510$).

# %%
idx_dir = tempfile.TemporaryDirectory()  # removed at the end of the cell
img_path, lbl_path = companion.data.write_digits_idx(idx_dir.name)["test"]
with gzip.open(img_path, "rb") as f:
    magic, n_img, rows, cols = struct.unpack(">IIII", f.read(16))
    pixels = np.frombuffer(f.read(), dtype=np.uint8)
with gzip.open(lbl_path, "rb") as f:
    magic_lbl, n_lbl = struct.unpack(">II", f.read(8))
    labels = np.frombuffer(f.read(), dtype=np.uint8)
X_idx = pixels.reshape(n_img, rows * cols).astype(np.float32) / 255
print(f"{img_path.name}: magic {magic} (0x{magic:08x}), {n_img} images of {rows} x {cols}, "
      f"{pixels.size:,} pixel bytes")
print(f"{lbl_path.name}: magic {magic_lbl} (0x{magic_lbl:08x}), {n_lbl} labels")
assert (magic, magic_lbl, rows, cols) == (2051, 2049, 28, 28) and n_img == n_lbl == pixels.size // 784

X_parsed, y_parsed = sm.parse_mnist(img_path, lbl_path)
X_digits, y_digits = companion.data.load_digits_mnist_like(28, train=False)
assert X_parsed.dtype == np.float32 and np.array_equal(X_parsed, X_idx) and np.array_equal(y_parsed, labels)
assert np.abs(X_parsed - X_digits).max() <= 1 / 510 + 1e-6 and np.array_equal(y_parsed, y_digits)
print("parse_mnist = the reader above; both within 1/510 of section 1's test images, same labels")
idx_dir.cleanup()

# %% [markdown]
# ## 2. The softmax loss
#
# A two-line function, but one number is worth checking by hand. For logits $h = (2, 1, 0)$ and
# true class $y = 0$: $\ell = \log(e^2 + e^1 + e^0) - 2 = \log 11.107 - 2 \approx 0.4076$.
# The cell also prints the loss of all-zero logits over 10 classes, the loss of an untrained
# model that knows nothing (Exercise 1.2 asks for its formula in $k$).

# %%
l_hand = sm.softmax_loss(np.array([[2.0, 1.0, 0.0]]), np.array([0]))
l_zero = sm.softmax_loss(np.zeros((5, 10)), np.arange(5))
print(f"loss((2,1,0), y=0) = {l_hand:.4f}   loss(zeros, k=10) = {l_zero:.4f}")
assert abs(l_hand - 0.4076) < 1e-4
assert abs(l_zero - 2.302585) < 1e-6

# %% [markdown]
# The implementation subtracts each row's maximum before exponentiating
# ($\log\sum_j e^{h_j} = m + \log\sum_j e^{h_j - m}$), so logits in the thousands do not
# overflow: the loss of $h = (1000, 0)$ with $y = 1$ is exactly $1000$.

# %%
l_big = sm.softmax_loss(np.array([[1000.0, 0.0]]), np.array([1]))
print(f"loss((1000, 0), y=1) = {l_big:.4f}")
assert abs(l_big - 1000.0) < 1e-9

# %% [markdown]
# **Why not minimise the error rate itself?** The quantity we care about is the 0-1 loss,
# $\mathbb{1}\{\arg\max_j h_j \ne y\}$. It is piecewise constant in $\theta$: a small
# change of $\theta$ changes no argmax, so its gradient is zero almost everywhere (and
# undefined where an argmax flips), and gradient descent gets no signal from it. The
# cross-entropy is a smooth **surrogate**: every logit moves it, and lowering it pushes the
# true class's probability up, which is what lowers the error. The cell nudges 20 random
# entries of a random $\theta$ (rows of pixels that are not blank in every image) by
# $\pm 10^{-4}$ and counts how many nudges change each loss on the training set.

# %%
rng01 = np.random.default_rng(1)
theta_r = rng01.standard_normal((784, k)) * 0.01
err_01 = lambda th: np.mean((X_tr @ th).argmax(axis=1) != y_tr)
moved = {"0-1 loss": 0, "softmax loss": 0}
for i, j in zip(rng01.choice(np.flatnonzero(X_tr.any(axis=0)), 20), rng01.integers(0, k, 20)):
    d = np.zeros_like(theta_r)
    d[i, j] = 1e-4
    moved["0-1 loss"] += err_01(theta_r + d) != err_01(theta_r - d)
    moved["softmax loss"] += sm.softmax_loss(X_tr @ (theta_r + d), y_tr) != sm.softmax_loss(X_tr @ (theta_r - d), y_tr)
print(f"nudges (of 20) that change the 0-1 loss: {moved['0-1 loss']}; "
      f"that change the softmax loss: {moved['softmax loss']}")
assert moved["0-1 loss"] < moved["softmax loss"]

# %% [markdown]
# ## 3. The gradient, checked numerically
#
# For a batch, $\nabla_\theta \frac{1}{b}\sum_i \ell(\theta^\top x_i, y_i)
# = \frac{1}{b} X^\top (Z - I_y)$. One SGD step with $\alpha = 1$ on a single batch therefore
# moves $\theta$ by exactly minus this gradient; we compare it with central finite differences
# of the loss on a small random problem.

# %%
Xs = np.random.randn(20, 4)
ys = np.random.randint(3, size=20)
theta0 = np.random.randn(4, 3) * 0.1
theta1 = theta0.copy()
sm.softmax_regression_epoch(Xs, ys, theta1, lr=1.0, batch=20)
analytic = theta0 - theta1

numeric = np.zeros_like(theta0)
eps = 1e-6
for i, j in np.ndindex(theta0.shape):
    d = np.zeros_like(theta0)
    d[i, j] = eps
    numeric[i, j] = (sm.softmax_loss(Xs @ (theta0 + d), ys) - sm.softmax_loss(Xs @ (theta0 - d), ys)) / (2 * eps)
gap = np.abs(analytic - numeric).max()
# The gap itself (about 1e-10) is rounding noise that changes with numpy's BLAS; print its bound.
assert gap < 1e-8
print(f"max |analytic - finite difference| < 1e-8 (|gradient| up to {np.abs(analytic).max():.2f})")

# %% [markdown]
# ## 4. Training softmax regression
#
# `train_softmax` starts from $\theta = 0$ and runs epochs of mini-batch SGD (here 20 epochs,
# $\alpha = 0.2$, batches of 100), reporting the average loss and the error rate on both sets
# after each epoch. A linear model on raw pixels is a strong baseline for digits: on the offline
# set it ends near **4% test error**, give or take 1% (section 8) — chance is 90%.

# %%
EPOCHS, LR, BATCH = 20, 0.2, 100
hist_softmax = sm.train_softmax(X_tr, y_tr, X_te, y_te, epochs=EPOCHS, lr=LR, batch=BATCH, verbose=False)


def show(history, every=4):
    print("| epoch | train loss | train err | test loss | test err |")
    for r in history:
        if r["epoch"] % every == every - 1:
            print(f"| {r['epoch'] + 1:>5} | {r['train_loss']:>10.3f} | {r['train_err']:>9.3f} "
                  f"| {r['test_loss']:>9.3f} | {r['test_err']:>8.3f} |")


show(hist_softmax)
final = hist_softmax[-1]
assert final["test_err"] < 0.9 / 4, "softmax regression must beat chance (0.9) by a wide margin"
if DATASET == "digits":
    assert abs(final["test_err"] - 0.04) < 0.015

# %% [markdown]
# ## 5. The same epoch in C++
#
# The course then rewrites `softmax_regression_epoch` in C++ (`src/simple_ml_ext.cc`, compiled
# into `companion.apps.simple_ml_ext` with pybind11). It receives raw pointers to the numpy
# buffers, loops over the batches exactly as the numpy version does, and **updates `theta` in
# place**. It must agree with numpy to float32 rounding: we run one epoch of each from the same
# start and compare.

# %%
theta_np = np.zeros((784, k), dtype=np.float32)
theta_cpp = np.zeros((784, k), dtype=np.float32)
sm.softmax_regression_epoch(X_tr, y_tr, theta_np, lr=LR, batch=BATCH)
sm.softmax_regression_epoch_cpp(X_tr, y_tr, theta_cpp, lr=LR, batch=BATCH)
cpp_gap = np.abs(theta_np - theta_cpp).max()
# The gap itself (1e-8 to 3e-8 here) follows numpy's summation order, which differs between numpy
# releases, so the cell states the bound it checks.
assert cpp_gap < 1e-6
print(f"max |theta_numpy - theta_cpp| < 1e-6: float32 rounding (|theta| up to {np.abs(theta_np).max():.3f})")

# %% [markdown]
# The C++ function checks its arguments at the Python border: a float64 `theta` would be
# silently copied by a naive binding — and the in-place update lost — so it is refused instead.

# %%
try:
    sm.softmax_regression_epoch_cpp(X_tr, y_tr, theta_np.astype(np.float64), LR, BATCH)
    raise AssertionError("a float64 theta must be refused")
except TypeError as err:
    print("TypeError:", err)

# %% [markdown]
# How fast is it? Both versions do the same two matrix products per batch. numpy hands them to
# an optimised BLAS (SIMD instructions, cache blocking, possibly several threads). The C++
# version is loops on one core: the compiler (`-O3 -march=native`) vectorises them only across
# the 10 classes, and there is no cache blocking, no threading and no BLAS; its one trick is
# skipping blank pixels. The cell times both (best of 9 epochs each) and prints a verdict
# computed from the two times, which says which one won in this run. Writing a loop in C++
# does not by itself beat a tuned library; notebooks 05 and 06 show what does. The timings
# depend on the machine and its load, printed first (this cell's output is not compared by the
# tests).

# %% tags=["nbval-ignore-output"]
def best_time(fn, repeat=9):
    times = []
    for _ in range(repeat):
        theta = np.zeros((784, k), dtype=np.float32)
        start = time.perf_counter()
        fn(X_tr, y_tr, theta, lr=LR, batch=BATCH)
        times.append(time.perf_counter() - start)
    return min(times)


print(machine_line())
t_np, t_cpp = best_time(sm.softmax_regression_epoch), best_time(sm.softmax_regression_epoch_cpp)
print(f"one epoch: numpy {t_np * 1e3:.1f} ms, C++ {t_cpp * 1e3:.1f} ms")
print(f"verdict: the C++ epoch takes {t_cpp / t_np:.1f}x numpy's time: "
      + ("numpy's BLAS is faster" if t_cpp > t_np else "the C++ loops are faster"))

# %% [markdown]
# ## 6. A two-layer neural network
#
# Replace the linear hypothesis by $h(x) = W_2^\top \mathrm{ReLU}(W_1^\top x)$ with a hidden
# layer of $d$ units. Backpropagation, written out by hand for one batch:
#
# $$Z_1 = \mathrm{ReLU}(X W_1), \quad G_2 = \mathrm{softmax}(Z_1 W_2) - I_y, \quad
#   G_1 = \mathbb{1}\{Z_1 > 0\} \circ (G_2 W_2^\top),$$
# $$\nabla_{W_1} = \tfrac{1}{b} X^\top G_1, \qquad \nabla_{W_2} = \tfrac{1}{b} Z_1^\top G_2 .$$
#
# Lecture 3 writes the same thing for any depth. For $L$ layers $Z_{i+1} = \sigma_i(Z_i W_i)$,
# $i = 1, \dots, L$, with $Z_1 = X$ and a linear last layer ($\sigma_L$ the identity), define
# $G_i = \partial \ell / \partial Z_i$. The forward pass stores every $Z_i$; the backward pass
# starts from $G_{L+1} = \mathrm{softmax}(Z_{L+1}) - I_y$ and runs the layers in reverse:
#
# $$G_i = \bigl(G_{i+1} \circ \sigma_i'(Z_i W_i)\bigr) W_i^\top, \qquad
#   \nabla_{W_i} = \tfrac{1}{b} Z_i^\top \bigl(G_{i+1} \circ \sigma_i'(Z_i W_i)\bigr).$$
#
# With $L = 2$, $\sigma_1 = \mathrm{ReLU}$ this is the pair above. Each layer needs only its
# own stored input and the $G$ handed back by the layer after it: that reverse sweep over
# stored intermediates is **backpropagation**, and notebook 02 turns it into an algorithm over
# any graph of operations.
#
# Getting these right by hand is exactly the chore that automatic differentiation (notebook 02)
# removes — and easy to get wrong, so we check them as in section 3: one `nn_epoch` with
# $\alpha = 1$ over a single batch moves $(W_1, W_2)$ by exactly minus these gradients, which
# must match central finite differences of the loss $\ell(\mathrm{ReLU}(XW_1)W_2, y)$ in every
# entry of both matrices.

# %%
Xn = np.random.randn(20, 5)
yn = np.random.randint(3, size=20)
W1_0, W2_0 = np.random.randn(5, 4) * 0.5, np.random.randn(4, 3) * 0.5
W1_1, W2_1 = W1_0.copy(), W2_0.copy()
sm.nn_epoch(Xn, yn, W1_1, W2_1, lr=1.0, batch=20)
analytic = [W1_0 - W1_1, W2_0 - W2_1]


def nn_loss(W1, W2):
    return sm.softmax_loss(np.maximum(Xn @ W1, 0) @ W2, yn)


numeric = [np.zeros_like(W1_0), np.zeros_like(W2_0)]
for which, W in enumerate((W1_0, W2_0)):
    for idx in np.ndindex(W.shape):
        d = np.zeros_like(W)
        d[idx] = eps
        plus = [W1_0 + d, W2_0] if which == 0 else [W1_0, W2_0 + d]
        minus = [W1_0 - d, W2_0] if which == 0 else [W1_0, W2_0 - d]
        numeric[which][idx] = (nn_loss(*plus) - nn_loss(*minus)) / (2 * eps)
gaps = [np.abs(a - n).max() for a, n in zip(analytic, numeric)]
assert max(gaps) < 1e-8 and np.abs(analytic[0]).max() > 1e-3   # W1's gradient is not all zero
print(f"max |backprop - finite difference| < 1e-8 for W1 and W2 "
      f"(|gradient| up to {np.abs(analytic[0]).max():.2f} and {np.abs(analytic[1]).max():.2f})")

# %% [markdown]
# `train_nn` seeds numpy, draws $W_1, W_2$ from scaled Gaussians and runs `nn_epoch`.
# With 100 hidden units it ends near **3% test error** on the digits: lower than softmax
# regression's, but section 8 shows that this test set cannot tell the two apart.

# %%
hist_nn = sm.train_nn(X_tr, y_tr, X_te, y_te, hidden_dim=100, epochs=EPOCHS, lr=LR, batch=BATCH, verbose=False)
show(hist_nn)
final_nn = hist_nn[-1]
assert final_nn["test_err"] < 0.9 / 4
if DATASET == "digits":
    assert abs(final_nn["test_err"] - 0.03) < 0.015

# %% [markdown]
# ## 7. Learning curves
#
# Error rate after every epoch, for both models. The two-layer network starts worse (random
# weights instead of zeros, and a harder optimisation problem) but fits the training set more
# closely; the gap between its train and test curves is the generalisation gap. (How much of
# the difference between the two test curves is real is the subject of section 8.)

# %%
fig, ax = plt.subplots(figsize=(6.5, 4))
ep = np.arange(1, EPOCHS + 1)
for hist, name, colour in ((hist_softmax, "softmax regression", "C0"), (hist_nn, "two-layer net", "C1")):
    ax.plot(ep, [r["train_err"] for r in hist], "--", color=colour, label=f"{name} (train)")
    ax.plot(ep, [r["test_err"] for r in hist], "-", color=colour, label=f"{name} (test)")
ax.axhline(0.9, color="gray", lw=0.8, ls=":", label="chance")
ax.set_yscale("log")
ax.xaxis.set_major_locator(MaxNLocator(integer=True))
ax.set_xlabel("epoch")
ax.set_ylabel("error rate (log scale)")
ax.set_title(f"Both models leave chance far behind ({DATASET})")
ax.legend(fontsize=8)
save_figure(fig, "softmax_learning_curve")

# %% [markdown]
# ## 8. Summary and a look ahead
#
# The last epoch of each model:

# %%
for name, hist in (("softmax regression", hist_softmax), ("two-layer net", hist_nn)):
    r = hist[-1]
    print(f"{name:<20} train loss {r['train_loss']:.3f}  train err {r['train_err']:.3f}  test err {r['test_err']:.3f}")

# %% [markdown]
# **Is one model better?** The offline test set has only 297 images, so one image is 0.34% of
# error.
# An error rate $p$ measured on $n$ independent images has binomial standard error
# $\sqrt{p(1-p)/n}$, about 1% here: a difference of one or two images is well inside it. The
# sharper test pairs the two models on the same images: only the images that exactly one of
# them gets wrong say anything about which is better. If the models were equally good, each
# such image would be equally likely to go either way, so the count won by one model is
# Binomial$(b + c, 1/2)$ (McNemar's exact test). To count them we need each model's
# predictions, so the cell below trains both again exactly as `train_softmax` and `train_nn`
# do (and checks that it reproduces their final test errors).

# %%
theta = np.zeros((X_tr.shape[1], k), dtype=np.float32)
for _ in range(EPOCHS):
    sm.softmax_regression_epoch(X_tr, y_tr, theta, lr=LR, batch=BATCH)
np.random.seed(0)  # train_nn's initialisation
W1 = np.random.randn(X_tr.shape[1], 100).astype(np.float32) / np.float32(np.sqrt(100))
W2 = np.random.randn(100, k).astype(np.float32) / np.float32(np.sqrt(k))
for _ in range(EPOCHS):
    sm.nn_epoch(X_tr, y_tr, W1, W2, lr=LR, batch=BATCH)
wrong_softmax = (X_te @ theta).argmax(axis=1) != y_te
wrong_nn = (np.maximum(X_te @ W1, 0) @ W2).argmax(axis=1) != y_te
assert wrong_softmax.mean() == hist_softmax[-1]["test_err"]
assert wrong_nn.mean() == hist_nn[-1]["test_err"]

n_test = len(y_te)
for name, wrong in (("softmax regression", wrong_softmax), ("two-layer net", wrong_nn)):
    p = wrong.mean()
    print(f"{name:<20} test error {p:.3f} = {wrong.sum()} of {n_test} images, "
          f"standard error {np.sqrt(p * (1 - p) / n_test):.3f}")
b, c = int((wrong_softmax & ~wrong_nn).sum()), int((~wrong_softmax & wrong_nn).sum())
p_value = binomtest(b, b + c, 0.5).pvalue
print(f"images only softmax regression gets wrong: {b}; only the two-layer net: {c}; "
      f"McNemar exact p = {p_value:.2f}")
print("verdict: " + ("the test set cannot tell the two models apart" if p_value > 0.05
                     else "the difference is unlikely to be chance (p < 0.05)"))
if DATASET == "digits":
    assert p_value > 0.05  # section 6's text says the digits cannot separate the two

# %% [markdown]
# The verdict line is computed from the counts above. Ranking models by a difference of a
# few test images is ranking noise; with these numbers the honest statement is the printed
# one. A larger test set (the real MNIST's 10,000 images, after `make data`) shrinks the
# standard error about six-fold; so does averaging over several random initialisations, which
# measures the other source of variation, the training run itself.

# %% [markdown]
# In homework 1 the same loss is rebuilt from needle operations, so that `backward()` finds
# the gradient of section 3 by itself. `simple_ml.softmax_loss` accepts Tensors too (then with
# one-hot labels) and agrees with the numpy version:

# %%
Z = X_te[:50] @ theta_np
one_hot = np.eye(k, dtype=np.float32)[y_te[:50]]
l_ndl = sm.softmax_loss(ndl.Tensor(Z), ndl.Tensor(one_hot))
l_np = sm.softmax_loss(Z, y_te[:50])
print(f"needle {float(l_ndl.numpy()):.4f}   numpy {l_np:.4f}")
assert abs(float(l_ndl.numpy()) - l_np) < 1e-5

# %% [markdown]
# ## Exercises
#
# Each exercise has a cell to fill in (it starts as `raise NotImplementedError`) and a check
# cell that says whether your answer is right: "not answered yet", "correct", or "not yet"
# with what differs. The first cell below gathers everything the exercises use, so this
# section also runs on its own after a kernel restart. Reference answers are in
# `notebooks/solutions/01_softmax_regression.py`; try first.

# %% tags=["exercise-setup"]
import numpy as np

from companion.apps import simple_ml as sm
from companion.check.exercises import central_difference, check_exercise

rng = np.random.default_rng(0)
z_ex = rng.standard_normal(5)            # the logits of one example, 5 classes
y_ex = 2                                 # its label
X_ex = rng.standard_normal((8, 4))       # a batch for the two-layer net
y8_ex = rng.integers(0, 3, 8)
W1_ex = rng.standard_normal((4, 6)) / 2
W2_ex = rng.standard_normal((6, 3)) / 2

# %% [markdown]
# **Exercise 1.1 (derive a gradient).** Write the gradient of the softmax loss of one example,
# $\ell(z, y) = \log \sum_j e^{z_j} - z_y$, with respect to its logits $z$. The check compares
# it with central differences of `simple_ml.softmax_loss`.

# %% tags=["exercise-stub"]
def softmax_loss_grad(z, y):
    """Gradient of log(sum_j exp(z_j)) - z[y] with respect to the logits z (shape (k,))."""
    raise NotImplementedError


# %% tags=["exercise-check"]
check_exercise("1.1 softmax_loss_grad", lambda: softmax_loss_grad(z_ex, y_ex),
               central_difference(lambda z: sm.softmax_loss(z[None, :], np.array([y_ex])), z_ex),
               rtol=1e-5, atol=1e-7)

# %% [markdown]
# **Exercise 1.2 (predict before you run).** A softmax regression initialised with
# $\theta = 0$ gives every class the same logit. What is its average loss with $k$ classes,
# whatever the labels? Write it as a formula in `k`; the check evaluates `softmax_loss` on
# all-zero logits for $k = 2, 10, 100$. (Compare with the `loss(zeros, k=10)` that section 2's
# cell prints.)

# %% tags=["exercise-stub"]
def loss_at_zero(k):
    """The average softmax loss of all-zero logits over k classes."""
    raise NotImplementedError


# %% tags=["exercise-check"]
check_exercise("1.2 loss_at_zero", lambda: [loss_at_zero(k) for k in (2, 10, 100)],
               [sm.softmax_loss(np.zeros((3, k)), np.array([0, 1, 1])) for k in (2, 10, 100)])

# %% [markdown]
# **Exercise 1.3 (backpropagation by hand).** For the two-layer network of section 6, with
# the loss $\text{softmax\_loss}(\text{ReLU}(X W_1) W_2, y)$ averaged over the batch, write its
# gradient with respect to $W_2$. The check uses central differences.

# %% tags=["exercise-stub"]
def nn_grad_W2(X, y, W1, W2):
    """d(mean softmax loss of ReLU(X W1) W2) / d W2, shape W2.shape."""
    raise NotImplementedError


# %% tags=["exercise-check"]
check_exercise("1.3 nn_grad_W2", lambda: nn_grad_W2(X_ex, y8_ex, W1_ex, W2_ex),
               central_difference(
                   lambda W: sm.softmax_loss(np.maximum(X_ex @ W1_ex, 0) @ W, y8_ex), W2_ex),
               rtol=1e-5, atol=1e-7)
