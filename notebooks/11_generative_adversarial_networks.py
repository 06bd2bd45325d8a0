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
# # 11 · Generative adversarial networks
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/needle-companion/needle-companion/blob/main/notebooks/11_generative_adversarial_networks.ipynb)
#
# **Lecture:** 16, "Generative Adversarial Networks", and 17, "Generative Adversarial Networks
# Implementation" (lecture 21 in the current schedule; its official notebook is written in
# needle)
#
# **Homework:** none (the course has no homework for GANs)
#
# **Prerequisites:** notebook 04 (modules, `SoftmaxLoss`, Adam, the training loop)
#
# **You will be able to:** write a generator and a discriminator as needle modules; train them
# with alternating updates on the minimax objective; read the discriminator's decision surface and
# the loss curves of a GAN; package the adversarial loss as a module; say why a transposed
# convolution upsamples; say what a GAN's training does and does not guarantee
#
# **Run time:** about 22 s of CPU time on a 2-core x86-64 machine (60 s of wall time under
# heavy load)
#
# A GAN learns to *sample*: a generator $G$ maps noise $z \sim \mathcal N(0, I)$ to samples
# $G(z)$, and a discriminator $D$ is trained to tell real samples from generated ones. The two
# play the minimax game
#
# $$\min_G \max_D \; \mathbb E_{x \sim \text{data}}[\log D(x)] + \mathbb E_{z}[\log(1 - D(G(z)))],$$
#
# solved by alternating gradient steps. As in the course's `train_gan`, each step first updates
# $D$ on a batch of real samples against a batch of generated ones (detached, so that $D$'s step
# does not reach into $G$), then updates $G$ against the discriminator that step produced, on
# the same noise. $D$ outputs two logits (class 1 = "real", class 0 = "generated") and both
# players use `nn.SoftmaxLoss`. The generator's step uses
# the *non-saturating* form: it minimizes $-\log D(G(z))$ (the loss of calling its samples
# "real") rather than maximizing $-\log(1 - D(G(z)))$, whose gradient vanishes when $D$ is
# confident early in training.
#
# Part 1 repeats the course's lecture: a linear generator learns a 2-D Gaussian. Part 2 trains a
# small MLP GAN on scikit-learn's 8 × 8 handwritten digits (offline).
#
# A GAN's trajectory depends on every rounding of the run, so the cells that print its numbers
# are not compared digit for digit by the test suite; their asserts, with margins, are the check.

# %% tags=["remove-cell"] cellView="form" jupyter={"source_hidden": true}
#@title Colab set-up: in Colab this installs needle (2-3 minutes); elsewhere it does nothing
import os, shlex, subprocess, sys, tempfile; repo = os.environ.get("NEEDLE_COLAB_REPO", "https://github.com/needle-companion/needle-companion")
if "google.colab" in sys.modules or os.environ.get("NEEDLE_COLAB_SIMULATE") == "1":  # companion/colab_setup.py
    py, src, q = sys.executable, os.path.join(tempfile.gettempdir(), "needle-companion"), shlex.quote
    done = subprocess.run(f"{q(py)} -m companion.colab_setup --status 2>/dev/null || {{ {{ test -d {q(src)} || git clone -q --depth=1 {q(repo)} {q(src)}; }} && cd {q(src)} && {q(py)} -m companion.colab_setup --install {q(repo)} --cwd {q(os.getcwd())}; }}", shell=True, capture_output=True, text=True); print(done.stdout + done.stderr[-3000:], end=""); assert done.returncode == 0, f"the set-up could not install this project from {repo} (what failed is above)"

# %%
import matplotlib.pyplot as plt
import numpy as np
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression

import needle as ndl
import needle.nn as nn
from companion.viz import LiveCurves, save_figure

np.set_printoptions(precision=3, suppress=True)
np.random.seed(0)
device = ndl.cpu()


def tensor(array, requires_grad=False):
    """A float32 needle Tensor on ``device``."""
    return ndl.Tensor(np.asarray(array, dtype=np.float32), device=device,
                      requires_grad=requires_grad)


def discriminator_step(D, opt_D, real, fake, reset_grad=True):
    """One step of D on real (label 1) against generated (label 0) samples, both (B, d) Tensors.

    ``fake`` must already be detached, so that D's step does not reach into G. The loss is the
    average of D's two cross-entropies; returns it as a float. ``reset_grad=False`` leaves the
    stale gradients G's step put on D's parameters until D's backward replaces them.
    """
    B = real.shape[0]
    loss_fn = nn.SoftmaxLoss()
    if reset_grad:
        opt_D.reset_grad()
    loss_D = (loss_fn(D(real), tensor(np.ones(B))) + loss_fn(D(fake), tensor(np.zeros(B)))) * 0.5
    loss_D.backward()
    opt_D.step()
    return float(loss_D.numpy())


def generator_loss(D, fake):
    """G's non-saturating loss -log D(fake): the cross-entropy of calling its samples "real"."""
    return nn.SoftmaxLoss()(D(fake), tensor(np.ones(fake.shape[0])))


def gan_step(G, D, opt_G, opt_D, real, z):
    """One alternating update in the course's order: D on real vs fake, then G against the
    updated D, both on the same noise.

    real: (B, d) data, z: (B, k) noise. Returns (generator loss, discriminator loss).
    """
    fake = G(tensor(z))
    loss_D = discriminator_step(D, opt_D, tensor(real), fake.detach())
    opt_G.reset_grad()
    loss_G = generator_loss(D, fake)  # G wants D to say "real" (label 1)
    loss_G.backward()
    opt_G.step()
    return float(loss_G.numpy()), loss_D


def p_real(D, x):
    """D's probability that each row of x (n, d) is real: softmax of its two logits."""
    logits = D(tensor(x)).numpy().astype(np.float64)
    return 1.0 / (1.0 + np.exp(logits[:, 0] - logits[:, 1]))


# %% [markdown]
# ## 1. A 2-D Gaussian (the course's example)
#
# The data are $x = zA + \mu$ with $z \sim \mathcal N(0, I_2)$, so $x \sim \mathcal N(\mu,
# A^\top A)$. The generator is one `Linear(2, 2)`: $G(z) = zW + b$, which can represent exactly
# this family. The discriminator is an MLP with layers of 20 and 10 units.

# %%
A = np.array([[1.0, 2.0], [-0.2, 0.5]])
mu = np.array([2.0, 1.0])
data = np.random.normal(0, 1, (3200, 2)) @ A + mu
target_cov = A.T @ A
print("target mean", mu, " target covariance\n", target_cov)

G = nn.Sequential(nn.Linear(2, 2, device=device))
D = nn.Sequential(nn.Linear(2, 20, device=device), nn.ReLU(),
                  nn.Linear(20, 10, device=device), nn.ReLU(), nn.Linear(10, 2, device=device))
opt_G = ndl.optim.Adam(G.parameters(), lr=0.003)
opt_D = ndl.optim.Adam(D.parameters(), lr=0.003)


def moment_errors(G):
    """|mean - mu| and the relative Frobenius error of the covariance of G's distribution.

    G(z) = zW + b with z ~ N(0, I) is N(b, WᵀW) exactly, so both come from the parameters.
    """
    W, b = (p.numpy().astype(np.float64) for p in G.parameters())
    return (float(np.linalg.norm(b.ravel() - mu)),
            float(np.linalg.norm(W.T @ W - target_cov) / np.linalg.norm(target_cov)))


STEPS, B = 4000, 32
SNAPSHOTS = (0, 200, 1000, STEPS)
z_eval = np.random.normal(0, 1, (3000, 2))
samples = {0: G(tensor(z_eval)).numpy()}
surfaces = {}
lo, hi = data.min(axis=0) - 1, data.max(axis=0) + 1
gx, gy = np.meshgrid(np.linspace(lo[0], hi[0], 120), np.linspace(lo[1], hi[1], 120))
grid = np.stack([gx.ravel(), gy.ravel()], axis=1)
history, moments = [], [moment_errors(G)]
live = LiveCurves({"loss, mean of 50 steps": ["generator", "discriminator"],
                   "error of G's distribution": ["|mean - μ|", "relative covariance error"]},
                  xlabel="step", title="part 1 while it trains")
with live:  # redrawn in place as the loop runs (in Jupyter); the figures below are static
    for step in range(1, STEPS + 1):
        real = data[np.random.randint(0, len(data), B)]
        history.append(gan_step(G, D, opt_G, opt_D, real, np.random.normal(0, 1, (B, 2))))
        if step % 50 == 0:
            moments.append(moment_errors(G))
            loss_G50, loss_D50 = np.mean(history[-50:], axis=0)
            live.add(step, {"generator": loss_G50, "discriminator": loss_D50,
                            "|mean - μ|": moments[-1][0],
                            "relative covariance error": moments[-1][1]})
        if step in SNAPSHOTS:
            samples[step] = G(tensor(z_eval)).numpy()
            surfaces[step] = p_real(D, grid).reshape(gx.shape)
history, moments = np.array(history), np.array(moments)

# %% [markdown]
# Generated samples (orange) over the data (grey) across training, and the discriminator's
# probability of "real" over the plane at the same steps:

# %%
fig, axes = plt.subplots(1, len(SNAPSHOTS), figsize=(15, 3.6), sharex=True, sharey=True)
for ax, step in zip(axes, SNAPSHOTS):
    if step in surfaces:
        cs = ax.contourf(gx, gy, surfaces[step], levels=np.linspace(0, 1, 11), cmap="RdBu_r",
                         alpha=0.6)
    ax.scatter(data[:600, 0], data[:600, 1], s=3, c="0.3", label="real")
    ax.scatter(samples[step][:600, 0], samples[step][:600, 1], s=3, c="tab:orange",
               label="generated")
    ax.set_title(f"step {step}")
    ax.set_xlabel("$x_1$")
axes[0].set_ylabel("$x_2$")
axes[0].legend(loc="upper left", markerscale=4)
fig.colorbar(cs, ax=axes, label="D's P(real)", shrink=0.9)
save_figure(fig, "gan_2d_samples")

# %% [markdown]
# Early on the discriminator's surface separates the two clouds (red where it says "real"); the
# generator follows the gradient of that surface and moves its cloud onto the data. At the end
# the surface is nearly flat at 1/2 where the data lie: the discriminator can no longer tell.
#
# The generator's distribution is $\mathcal N(b, W^\top W)$, so its mean and covariance can be
# read off its parameters (recorded every 50 steps) and compared with the target. The errors
# are not monotone: the generator moves whenever the discriminator finds a difference, so the
# asserts use the average over the last 1000 steps. (The course's notebook uses step size
# 0.01; this one uses 0.003.) Note that $W$ itself need
# not equal $A$: any $W = QA$ with $Q$ orthogonal gives the same distribution, and the GAN only
# sees samples.

# %% tags=["nbval-ignore-output"]
W, b = (p.numpy().astype(np.float64) for p in G.parameters())
print("generator mean      ", b.ravel(), "  target", mu)
print("generator covariance\n", W.T @ W)
print("W =\n", W, "\nA =\n", A)
late_mean_err, late_cov_err = moments[-20:].mean(axis=0)
print(f"at step 0: mean error {moments[0, 0]:.2f}, covariance error {moments[0, 1]:.2f}")
print(f"average over the last 1000 steps: mean error {late_mean_err:.2f}, "
      f"covariance error {late_cov_err:.2f}")
print(f"largest |W - A| entry {np.abs(W - A).max():.2f}: "
      + ("a different W, the same distribution" if np.abs(W - A).max() > 0.1 else "W is A"))
assert moments[0, 0] > 1.0 and late_mean_err < 0.25
assert late_cov_err < 0.15 and late_cov_err < moments[0, 1] / 2
assert np.abs(W - A).max() > 0.1  # section 5 says the generator found W != A

# %% [markdown]
# The discriminator's accuracy on fresh real and generated samples, and the loss curves:

# %% tags=["nbval-ignore-output"]
fresh_real = np.random.normal(0, 1, (4000, 2)) @ A + mu
fresh_fake = G(tensor(np.random.normal(0, 1, (4000, 2)))).numpy()
d_acc = 0.5 * ((p_real(D, fresh_real) > 0.5).mean() + (p_real(D, fresh_fake) < 0.5).mean())
window = 300
late_G, late_D = history[-window:].mean(axis=0)
print(f"discriminator accuracy at the end: {d_acc:.3f}")
print(f"mean losses over the last {window} steps: G {late_G:.3f}, D {late_D:.3f} "
      f"(ln 2 = {np.log(2):.3f})")
print(f"D loss over the first 20 steps {history[:20, 1].mean():.3f}")
assert abs(d_acc - 0.5) < 0.1
assert history[:20, 1].mean() > 1.0  # the curves start far from ln 2 ...
assert abs(late_D - np.log(2)) < 0.02 and abs(late_G - np.log(2)) < 0.1  # ... and settle there

# %% [markdown]
# At the game's equilibrium the generator's distribution is the data's, so the optimal
# discriminator $D^*(x) = p_\text{data}(x) / (p_\text{data}(x) + p_G(x))$ is $1/2$ wherever the
# data lie (off the data's support nothing constrains it, and nothing is sampled there). Each of
# D's two cross-entropies is then $\ln 2$, and so is the generator's loss: both curves settle
# at $\ln 2 \approx 0.693$. The plotted discriminator loss is the average of its two
# cross-entropies, which is minus half the game's value $V$ of the minimax objective; at
# equilibrium $V = -\log 4 = -2 \ln 2$ (exercise 11.4). The course's notebook sums the two
# cross-entropies instead, so its discriminator loss settles at $2 \ln 2$.
#
# The curves are moving averages over 50 steps, each drawn at the step that ends its window.

# %%
def smooth(values, width=50):
    """(steps, moving averages): the mean of each ``width`` consecutive values, at the step
    that ends its window (steps are numbered from 1)."""
    return np.arange(width, len(values) + 1), np.convolve(values, np.ones(width) / width, "valid")


fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 3.2))
curves = {"generator": smooth(history[:, 0]), "discriminator": smooth(history[:, 1])}
for name, (steps, values) in curves.items():
    ax.plot(steps, values, label=name)
ax.axhline(np.log(2), color="k", lw=0.8, ls="--", label="ln 2")
ax.set_xlabel("step")
ax.set_ylabel("loss (moving average of 50)")
ax.set_ylim(0, 1.05 * max(values.max() for _, values in curves.values()))  # no peak clipped
ax.legend()
ax2.plot(np.arange(len(moments)) * 50, moments[:, 0], label="|mean - μ|")
ax2.plot(np.arange(len(moments)) * 50, moments[:, 1], label="relative covariance error")
ax2.set_xlabel("step")
ax2.set_ylabel("error of G's distribution")
ax2.set_ylim(bottom=0)
ax2.legend()
save_figure(fig, "gan_2d_losses")

# %% [markdown]
# ## 2. A small image GAN on the 8 × 8 digits
#
# The same two players, now MLPs on 64-pixel images: $G$ maps 16 noise values through 128 ReLU
# units to 64 pixels in $(0, 1)$ (a sigmoid), and $D$ maps 64 pixels through 128 ReLU units to two
# logits. Adam with $\beta_1 = 0.5$, the usual GAN setting, and batches of 64.
#
# A GAN has no likelihood to report, so the samples are judged from outside: a logistic-regression
# digit classifier trained on the real digits (scikit-learn, independent of needle) says how
# confidently each generated image looks like some digit, and which digit.

# %% tags=["nbval-ignore-output"]
digits = load_digits()
X_digits = digits.data / 16.0
classifier = LogisticRegression(max_iter=3000).fit(X_digits, digits.target)
noise_images = np.random.uniform(0, 1, (1000, 64)) * X_digits.mean() * 2
conf_real = classifier.predict_proba(X_digits).max(axis=1).mean()
conf_noise = classifier.predict_proba(noise_images).max(axis=1).mean()
print(f"classifier confidence: real digits {conf_real:.3f}, uniform noise {conf_noise:.3f}")

ZD = 16
G2 = nn.Sequential(nn.Linear(ZD, 128, device=device), nn.ReLU(),
                   nn.Linear(128, 64, device=device), nn.Sigmoid())
D2 = nn.Sequential(nn.Linear(64, 128, device=device), nn.ReLU(), nn.Linear(128, 2, device=device))
opt_G2 = ndl.optim.Adam(G2.parameters(), lr=0.002, beta1=0.5)
opt_D2 = ndl.optim.Adam(D2.parameters(), lr=0.002, beta1=0.5)

STEPS2, B2 = 3000, 64
SNAPSHOTS2 = (0, 200, 1000, STEPS2)
z_show = np.random.normal(0, 1, (24, ZD))
z_many = np.random.normal(0, 1, (1000, ZD))
shown, confidence, classes = {}, {}, {}


def evaluate(step):
    """Record the shown samples, the classifier's mean confidence and predicted classes."""
    shown[step] = G2(tensor(z_show)).numpy()
    proba = classifier.predict_proba(G2(tensor(z_many)).numpy())
    confidence[step] = proba.max(axis=1).mean()
    classes[step] = np.bincount(proba.argmax(axis=1), minlength=10)


evaluate(0)
history2 = []
with LiveCurves({"loss, mean of 50 steps": ["generator", "discriminator"]}, xlabel="step",
                title="part 2 while it trains") as live:
    for step in range(1, STEPS2 + 1):
        real = X_digits[np.random.randint(0, len(X_digits), B2)]
        history2.append(gan_step(G2, D2, opt_G2, opt_D2, real, np.random.normal(0, 1, (B2, ZD))))
        if step % 50 == 0:
            loss_G50, loss_D50 = np.mean(history2[-50:], axis=0)
            live.add(step, generator=loss_G50, discriminator=loss_D50)
        if step in SNAPSHOTS2:
            evaluate(step)
history2 = np.array(history2)
for step in SNAPSHOTS2:
    print(f"step {step:4d}: classifier confidence {confidence[step]:.3f}, "
          f"samples per class {classes[step].tolist()}")

# %%
fig, axes = plt.subplots(len(SNAPSHOTS2) + 1, 12, figsize=(9, 4.4))
rows = [(f"step {s}", shown[s]) for s in SNAPSHOTS2] + [("real", X_digits[:12])]
for r, (name, images) in enumerate(rows):
    for c in range(12):
        axes[r, c].imshow(images[c].reshape(8, 8), cmap="gray_r", vmin=0, vmax=1)
        axes[r, c].set_xticks([])
        axes[r, c].set_yticks([])
    axes[r, 0].set_ylabel(name, rotation=0, ha="right", va="center")
fig.suptitle("generated digits across training (same noise in every row), and real digits")
save_figure(fig, "gan_digits")

# %% [markdown]
# What can be asserted robustly: the generated images become markedly more digit-like to the
# independent classifier, every digit class is produced (no collapse onto a few modes in this
# run), and the generated pixel mean matches the data's.

# %% tags=["nbval-ignore-output"]
fresh = G2(tensor(np.random.normal(0, 1, (2000, ZD)))).numpy()
class_share = classes[STEPS2] / classes[STEPS2].sum()
d2_acc = 0.5 * ((p_real(D2, X_digits) > 0.5).mean() + (p_real(D2, fresh) < 0.5).mean())
print(f"confidence {confidence[0]:.3f} at step 0 -> {confidence[STEPS2]:.3f} at the end "
      f"(real digits {conf_real:.3f})")
print(f"smallest class share {class_share.min():.3f}; pixel mean generated {fresh.mean():.3f}, "
      f"real {X_digits.mean():.3f}")
print(f"discriminator accuracy at the end {d2_acc:.3f}: it still tells real from generated "
      f"about {round(d2_acc * 4)} times in 4")
print(f"uniform noise scores {conf_noise:.3f}, "
      + ("above" if conf_noise > confidence[0] else "below")
      + f" the generator at step 0 ({confidence[0]:.3f}): a score shows digit-likeness only "
      f"between noise's {conf_noise:.2f} and real digits' {conf_real:.2f}")
assert confidence[STEPS2] > confidence[0] + 0.1
assert class_share.min() > 0.03
assert abs(fresh.mean() - X_digits.mean()) < 0.03
assert 0.6 < d2_acc < 0.9  # the text below describes this run: D still wins
assert conf_noise > 0.2  # the score's floor the text describes

# %% [markdown]
# The discriminator here is *not* at one half (the assert keeps its accuracy between 0.6 and
# 0.9; the cell prints this run's): the two-player game has not reached its equilibrium, and the
# generated digits, though recognizable, are blurrier than real ones. The classifier's score has
# a floor as well as a ceiling: images of uniform noise with the digits' mean brightness already
# get a confidence well above 1/10, so the score is informative only between that floor and the
# real digits' score (the last line of the cell places this run's starting generator against
# that floor).
#
# ## 3. The adversarial loss as a module
#
# The course's notebook closes by asking what the generator's training loop *sees*. From $G$'s
# side, the discriminator is just a loss function that happens to learn: it takes $G$'s samples
# and returns a number to minimize. So wrap it as one. `GANLoss` owns $D$ and $D$'s optimizer;
# calling `gan_loss(fake, real)` first takes $D$'s step (on the detached samples), then returns
# $G$'s loss against the updated $D$ as a Tensor. The generator is then trained like any other
# model: `loss = gan_loss(G(z), real); loss.backward(); opt_G.step()`.
#
# Like the course's, it is a plain class, not an `nn.Module`: a Module collects the parameters
# of every Module it holds, so a `GANLoss(nn.Module)` would list $D$'s parameters in
# `gan_loss.parameters()`, and once registered inside a larger model (as the CycleGAN below would
# do) the generator's optimizer would update $D$ too. The cell checks that against needle's
# `Module`.
#
# The check below trains part 1's players twice from the same seed on the same 200 batches,
# once with `gan_step` and once with `GANLoss`, and compares every parameter. Both loops call
# the same `discriminator_step` and `generator_loss`, so this is a refactoring check: it fails
# only if the module takes the steps in another order or detaches the wrong tensor. A third run
# drops `opt_D.reset_grad()` from $D$'s step (next paragraph).

# %%
class GANLoss:
    """The adversarial loss as a callable that owns the discriminator D and D's optimizer.

    Calling it with fake (B, d) samples of G (attached to G's graph) and real (B, d) data first
    takes one step of D on real vs the detached fakes, then returns G's non-saturating loss
    -log D(fake) against the updated D, a scalar Tensor. ``last_D_loss`` keeps D's loss.
    """

    def __init__(self, D, opt_D, reset_grad=True):
        self.D, self.opt_D, self.reset_grad = D, opt_D, reset_grad
        self.last_D_loss = None

    def __call__(self, fake, real):
        self.last_D_loss = discriminator_step(self.D, self.opt_D, real, fake.detach(),
                                              reset_grad=self.reset_grad)
        return generator_loss(self.D, fake)


def part1_players(seed):
    """Part 1's G, D and their Adam optimizers, drawn from ``np.random.seed(seed)``."""
    np.random.seed(seed)
    G = nn.Sequential(nn.Linear(2, 2, device=device))
    D = nn.Sequential(nn.Linear(2, 20, device=device), nn.ReLU(),
                      nn.Linear(20, 10, device=device), nn.ReLU(),
                      nn.Linear(10, 2, device=device))
    return G, D, ndl.optim.Adam(G.parameters(), lr=0.003), ndl.optim.Adam(D.parameters(), lr=0.003)


batches_rng = np.random.RandomState(1)
batches = [(data[batches_rng.randint(0, len(data), B)], batches_rng.normal(0, 1, (B, 2)))
           for _ in range(200)]
G_a, D_a, opt_G_a, opt_D_a = part1_players(1)
for real, z in batches:
    gan_step(G_a, D_a, opt_G_a, opt_D_a, real, z)


def train_with_gan_loss(reset_grad):
    """Part 1's players trained on ``batches`` through GANLoss; returns all their parameters."""
    G, D, opt_G, opt_D = part1_players(1)
    gan_loss = GANLoss(D, opt_D, reset_grad=reset_grad)
    for real, z in batches:
        loss = gan_loss(G(tensor(z)), tensor(real))  # D steps inside the loss
        opt_G.reset_grad()
        loss.backward()
        opt_G.step()
    return G.parameters() + D.parameters()


def largest_gap(params_a, params_b):
    return max(float(np.abs(p.numpy() - q.numpy()).max()) for p, q in zip(params_a, params_b))


class ModuleGANLoss(nn.Module):
    """The pitfall: the same loss as an nn.Module, holding D as an attribute."""

    def __init__(self, D):
        super().__init__()
        self.D = D


reference = G_a.parameters() + D_a.parameters()
gap = largest_gap(reference, train_with_gan_loss(reset_grad=True))
gap_no_reset = largest_gap(reference, train_with_gan_loss(reset_grad=False))
print(f"after {len(batches)} steps, largest difference to gan_step's parameters: GANLoss "
      f"{gap:.1e}; GANLoss without D's reset_grad {gap_no_reset:.1e}")
leaked = len(ModuleGANLoss(D_a).parameters())
print(f"a GANLoss written as an nn.Module would list {leaked} parameters (all of D's "
      f"{len(D_a.parameters())}) in .parameters()")
assert gap == 0.0 and gap_no_reset == 0.0 and leaked == len(D_a.parameters())

# %% [markdown]
# The loops agree bit for bit. The module is the point of the lesson: a loss that *learns*
# slots into a training loop written for a fixed one, and the same idea covers any learned loss
# (a perceptual loss, a critic in reinforcement learning).
#
# **Stale gradients on $D$.** $G$'s `backward()` also leaves gradients on $D$'s parameters
# ($G$'s loss passes through $D$). In PyTorch, where `.grad` *accumulates*, $D$'s step must zero
# them first. needle's `backward()` (the course's, and this one) *overwrites* each parameter's
# `.grad`, and $D$'s loss reaches every parameter of $D$, so $D$'s own backward replaces the
# stale gradients anyway: the run without `reset_grad` above ends with the same parameters.
# The `opt_D.reset_grad()` in `discriminator_step` only frees them early, together with the
# graph that the course's `backward()` records for each gradient.
#
# **The lecture's example: CycleGAN.** An adversarial loss is often one term of a larger
# objective. CycleGAN translates between two image domains $X$ and $Y$ (photos and paintings,
# say) without paired examples: a generator $G: X \to Y$ with a discriminator $D_Y$, a
# generator $F: Y \to X$ with a discriminator $D_X$, and a *cycle-consistency* loss that asks a
# round trip to return the input:
#
# $$\mathcal L(G, F) = \mathcal L_\text{GAN}(G, D_Y) + \mathcal L_\text{GAN}(F, D_X)
#   + \lambda \left(\mathbb E_x \lVert F(G(x)) - x \rVert_1
#   + \mathbb E_y \lVert G(F(y)) - y \rVert_1\right).$$
#
# With `GANLoss` each adversarial term is one call, and the generators' step is an ordinary
# one: `loss = gan_Y(G(x), y) + gan_X(F(y), x) + lam * (l1(F(G(x)), x) + l1(G(F(y)), y))`, then
# `loss.backward()` and a step of the optimizer that holds $G$'s and $F$'s parameters, while
# each `GANLoss` steps its own discriminator inside the call.
#
# ## 4. Toward images: DCGAN and the transposed convolution
#
# The digit GAN above is an MLP on 64 pixels. DCGAN, the usual image GAN, makes both players
# convolutional: $D$ is a stack of stride-2 convolutions (notebook 07) that halve the image at
# each layer, and $G$ runs the same shapes backwards, from a small feature map to the image,
# with **transposed convolutions** that double it.
#
# A transposed convolution is the *adjoint* of a convolution. For fixed weights $W$ a
# convolution is a linear map $x \mapsto Cx$ from images to feature maps; its transpose $C^\top$
# maps feature maps back to images, with $\langle Cx, y\rangle = \langle x, C^\top y\rangle$ for
# every $x, y$. Notebook 07 met $C^\top$ already: it is exactly what the convolution's backward
# pass applies to the output gradient to get the input gradient (section 4 there). So needle
# needs no new operator: $C^\top y$ is the input gradient of $\langle \operatorname{conv}(x, W),
# y\rangle$. Below, a stride-2 convolution maps 8 × 8 to 4 × 4 and its transpose maps 4 × 4 back
# to 8 × 8; the transpose is checked against the adjoint identity and against an independent
# numpy version that scatters each input pixel's $W y$ into its output window.

# %% tags=["nbval-ignore-output"]
def conv_transpose(y, W, stride, padding, in_hw):
    """C^T y for needle's conv: y (N, h, w, C_out), W (k, k, C_in, C_out) -> (N, H, W, C_in).

    Computed as the input gradient of <conv(x, W), y> at any x of spatial size in_hw.
    """
    x = ndl.Tensor(np.zeros((y.shape[0], *in_hw, W.shape[2]), np.float32), device=device)
    (ndl.ops.conv(x, ndl.Tensor(W, device=device), stride=stride, padding=padding)
     * ndl.Tensor(y, device=device)).sum().backward()
    return x.grad.numpy()


def conv_transpose_numpy(y, W, stride, padding, in_hw):
    """C^T y by scattering: output pixel (i, j) adds W[a, b] @ y[i, j] at (s·i + a, s·j + b)."""
    k = W.shape[0]
    out = np.zeros((y.shape[0], in_hw[0] + 2 * padding, in_hw[1] + 2 * padding, W.shape[2]))
    for i, j in np.ndindex(y.shape[1:3]):
        for a, b in np.ndindex(k, k):
            out[:, stride * i + a, stride * j + b] += y[:, i, j] @ W[a, b].T
    return out[:, padding:padding + in_hw[0], padding:padding + in_hw[1]]


rng_t = np.random.default_rng(0)
x_t = rng_t.standard_normal((2, 8, 8, 3)).astype(np.float32)
W_t = rng_t.standard_normal((3, 3, 3, 5)).astype(np.float32)
Cx = ndl.ops.conv(ndl.Tensor(x_t, device=device), ndl.Tensor(W_t, device=device), stride=2,
                  padding=1).numpy()
y_t = rng_t.standard_normal(Cx.shape).astype(np.float32)
CTy = conv_transpose(y_t, W_t, 2, 1, (8, 8))
lhs, rhs = float((Cx.astype(np.float64) * y_t).sum()), float((x_t.astype(np.float64) * CTy).sum())
scatter_gap = np.abs(CTy - conv_transpose_numpy(y_t, W_t, 2, 1, (8, 8))).max()
print(f"conv: {x_t.shape} -> {Cx.shape}; its transpose: {y_t.shape} -> {CTy.shape}")
print(f"<Cx, y> = {lhs:.4f}, <x, C^T y> = {rhs:.4f}; "
      f"max |needle - numpy scatter| = {scatter_gap:.1e}")
assert Cx.shape == (2, 4, 4, 5) and CTy.shape == x_t.shape
assert abs(lhs - rhs) < 1e-4 * abs(lhs) and scatter_gap < 1e-4
overlap = conv_transpose(np.ones((1, 4, 4, 1), np.float32), np.ones((3, 3, 1, 1), np.float32),
                         2, 1, (8, 8))[0, :, :, 0]
print("contributions to each pixel of an 8 x 8 output from a 4 x 4 map of ones, 3 x 3 kernel of "
      "ones, stride 2:\n", overlap.astype(int))
assert set(np.unique(overlap[:7, :7]).tolist()) == {1, 2, 4}

# %% [markdown]
# The scatter form shows why a transposed convolution *upsamples*: each pixel of the small map
# paints a $k \times k$ patch of the large one, $s$ pixels apart, and where patches overlap
# they add. With $k = 3$, $s = 2$ the overlap is uneven, as the printed counts show: in the
# interior, pixels receive one, two or four contributions in a regular pattern, a source of
# the checkerboard artefacts DCGAN images are known for (kernel sizes divisible by the stride
# avoid it).
#
# ## 5. What a GAN does not guarantee
#
# * **Convergence.** Alternating gradient steps on a minimax game are not gradient descent on any
#   loss; they can circle or oscillate around the equilibrium (the moment errors above go up as
#   well as down). The 2-D run settles near the target; the digit run is still a contest after
#   3000 steps. Neither loss falls to zero, and a low generator loss is
#   no evidence of good samples (it may only mean the discriminator is weak).
# * **Coverage of the data.** The generator is rewarded only for samples D accepts, not for
#   producing every kind of sample; it can *collapse* onto a few modes. This run covers all ten
#   classes, measured by the classifier, which is a check outside the GAN, not a property of it.
# * **A likelihood.** A GAN gives samples, not $p(x)$: there is no held-out log-likelihood to
#   compare models with, and sample quality is judged by external scores, as above.
# * **Identifiability.** Even when it succeeds it matches a distribution, not a mechanism: in part 1
#   the generator found $W \ne A$ with $W^\top W \approx A^\top A$.
# * **A discriminator at one half means nothing alone.** A discriminator that cannot learn
#   anything also scores one half. The 2-D result is convincing because the moments match too.
#
# Within these limits the asserted numbers above (mean and covariance errors, the final
# discriminator accuracy, the loss levels, classifier confidence and class coverage) hold for
# this seed; a different seed gives a different, usually similar, run.

# %% [markdown]
# ## Exercises
#
# Each exercise has a cell to fill in (it starts as `raise NotImplementedError`) and a check
# cell that says whether your answer is right: "not answered yet", "correct", or "not yet"
# with what differs. The first cell below gathers everything the exercises use, so this
# section also runs on its own after a kernel restart. Reference answers are in
# `notebooks/solutions/11_generative_adversarial_networks.py`; try first.

# %% tags=["exercise-setup"]
import numpy as np
from scipy.spatial.distance import jensenshannon
from scipy.stats import multivariate_normal

import needle as ndl
import needle.nn as nn
from companion.check.exercises import check_exercise

rng = np.random.default_rng(0)
A_ex = np.array([[1.0, 2.0], [-0.2, 0.5]])      # the data of part 1: N(mu_ex, A_exᵀ A_ex)
mu_ex = np.array([2.0, 1.0])
Wg_ex = np.array([[0.8, 1.5], [0.3, 0.9]])      # a generator part-way there: N(bg_ex, Wgᵀ Wg)
bg_ex = np.array([1.5, 0.5])
x_ex = np.concatenate([rng.standard_normal((4, 2)) @ A_ex + mu_ex,
                       rng.standard_normal((4, 2)) @ Wg_ex + bg_ex])
s_ex = np.array([-8.0, -3.0, -1.0, 0.0, 1.0, 3.0])  # D's logit of "real" minus of "generated"
p_ex, q_ex = rng.dirichlet(np.ones(6)), rng.dirichlet(np.ones(6))  # two distributions on 6 points


def needle_logit_gradients(s):
    """Per sample, d/ds of log(1 - D) and of -log D, D = softmax of logits (0, s) for "real",
    from needle's SoftmaxLoss and backward()."""
    grads = []
    for label, sign in ((0, -1.0), (1, 1.0)):  # -SoftmaxLoss(., 0) = log(1 - D); (., 1) = -log D
        logits = ndl.Tensor(np.stack([np.zeros_like(s), s], axis=1).astype(np.float32))
        labels = ndl.Tensor(np.full(len(s), label, dtype=np.float32), requires_grad=False)
        (nn.SoftmaxLoss()(logits, labels) * (sign * len(s))).backward()
        grads.append(logits.grad.numpy()[:, 1].astype(np.float64))
    return grads


# %% [markdown]
# **Exercise 11.1 (the optimal discriminator).** For a fixed generator the discriminator that
# maximizes $\mathbb E_{\text{data}}[\log D(x)] + \mathbb E_{G}[\log(1 - D(x))]$ is
# $D^*(x) = p_{\text{data}}(x) / (p_{\text{data}}(x) + p_G(x))$. Write it for two Gaussians
# in the plane, data $\mathcal N(\mu_d, \Sigma_d)$ and generator $\mathcal N(\mu_g, \Sigma_g)$,
# with the Gaussian density written out in numpy. The check uses scipy's densities.

# %% tags=["exercise-stub"]
def optimal_discriminator(x, mu_d, cov_d, mu_g, cov_g):
    """D*(x) for each row of x (n, 2): p_data / (p_data + p_G)."""
    raise NotImplementedError


# %% tags=["exercise-check"]
_pd = multivariate_normal(mu_ex, A_ex.T @ A_ex).pdf(x_ex)
_pg = multivariate_normal(bg_ex, Wg_ex.T @ Wg_ex).pdf(x_ex)
check_exercise("11.1 optimal_discriminator",
               lambda: optimal_discriminator(x_ex, mu_ex, A_ex.T @ A_ex, bg_ex, Wg_ex.T @ Wg_ex),
               _pd / (_pd + _pg), rtol=1e-6, atol=1e-9)

# %% [markdown]
# **Exercise 11.2 (why the non-saturating loss).** Let $s$ be the discriminator's logit of
# "real" minus its logit of "generated" for a generated sample, so $D = \sigma(s)$. Derive the
# derivatives with respect to $s$ of the generator's minimax loss $\log(1 - D)$ and of its
# non-saturating loss $-\log D$. Then look at them at $s = -8$, a sample the discriminator
# confidently rejects, as early in training: which one still gives the generator a gradient?
# The check differentiates needle's `SoftmaxLoss` on the logits $(0, s)$.

# %% tags=["exercise-stub"]
def generator_loss_derivatives(s):
    """(d/ds log(1 - sigmoid(s)), d/ds -log sigmoid(s)), element-wise."""
    raise NotImplementedError


# %% tags=["exercise-check"]
check_exercise("11.2 generator_loss_derivatives", lambda: generator_loss_derivatives(s_ex),
               needle_logit_gradients(s_ex), rtol=1e-4, atol=1e-6)

# %% [markdown]
# **Exercise 11.3 (a GAN sees only samples).** Part 1's generator $G(z) = zW + b$ produces
# $\mathcal N(b, W^\top W)$. Give a weight $W$ different from $A$ (by more than rounding) whose
# generator has exactly the distribution of the data, $W^\top W = A^\top A$. The check
# compares the covariances.

# %% tags=["exercise-stub"]
def another_generator_weight(A):
    """A (2, 2) W != A with Wᵀ W = Aᵀ A."""
    raise NotImplementedError


# %% tags=["exercise-check"]
def _same_distribution(W):
    W = np.asarray(W, dtype=np.float64)
    if W.shape != A_ex.shape:
        return f"expected shape {A_ex.shape}, got {W.shape}"
    if not np.allclose(W.T @ W, A_ex.T @ A_ex, rtol=1e-6, atol=1e-9):
        return f"Wᵀ W = {(W.T @ W).round(4).tolist()}, but Aᵀ A = {(A_ex.T @ A_ex).tolist()}"
    if np.abs(W - A_ex).max() < 0.1:
        return "that is A itself (or nearly): find a different W"
    return None


check_exercise("11.3 another_generator_weight", lambda: another_generator_weight(A_ex),
               predicate=_same_distribution)

# %% [markdown]
# **Exercise 11.4 (what the game minimizes).** For distributions $p$ (data) and $q$
# (generator) on a finite set, compute the value of the game at the optimal discriminator,
# $\sum_x p(x) \log D^*(x) + q(x) \log(1 - D^*(x))$. Compare your numbers with
# $-\log 4 + 2\,\mathrm{JSD}(p \,\|\, q)$: the generator's best response minimizes the
# Jensen-Shannon divergence, and at $q = p$ the value is $V = -\log 4 = -2 \ln 2$. The loss
# curves above show the same number seen from the discriminator's side: its plotted loss is the
# *average* of its two cross-entropies, $-V/2$, which settles at $\ln 2$ (the course *sums*
# them, so its curve settles at $-V = 2 \ln 2$). The check uses scipy's Jensen-Shannon
# distance.

# %% tags=["exercise-stub"]
def value_at_optimal_discriminator(p, q):
    """max over D of sum p log D + q log(1 - D), for probability vectors p and q."""
    raise NotImplementedError


# %% tags=["exercise-check"]
check_exercise("11.4 value_at_optimal_discriminator",
               lambda: [value_at_optimal_discriminator(p_ex, q) for q in (q_ex, p_ex)],
               [-np.log(4) + 2 * jensenshannon(p_ex, q) ** 2 for q in (q_ex, p_ex)],
               rtol=1e-6, atol=1e-9)
