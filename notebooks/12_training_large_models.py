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
# # 12 · Training large models: memory, checkpointing, data/model/pipeline parallelism
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/needle-companion/needle-companion/blob/main/notebooks/12_training_large_models.ipynb)
#
# **Lecture:** 15, "Training Large Models" (memory saving, activation checkpointing, data,
# model and pipeline parallelism)
#
# **Homework:** none (the course has no homework for this lecture)
#
# **Prerequisites:** notebook 04 (a training step), notebook 05 (the NDArray and its buffers)
#
# **You will be able to:** measure the memory a training step keeps for backward, layer by
# layer; trade memory for recomputation with activation checkpointing and pick the segment length;
# run data-parallel training over MPI and check it against single-process training; estimate the
# communication of data, model and pipeline parallelism from a machine's measured speeds
#
# **Run time:** about 30 s on an idle 2-core x86-64 machine
# **Student mode:** this notebook is mostly about this project's extensions: with
# `NEEDLE_IMPL=path/to/hwN/python` (your own needle), sections 1-3 and exercises 12.1-12.2 are
# skipped (cells marked companion-only: they use the CPU module's `memory_stats()`,
# `needle.checkpoint` and `needle.distributed`); section 4's measurements and arithmetic and
# exercises 12.3-12.4 run on your needle.
#
# A model is "large" when one step no longer fits the memory or the time of one device. Memory
# goes to the parameters, their gradients, the optimizer state, and the **activations** that the
# forward pass keeps for backward; only the last grows with the batch and the depth. Section 1
# measures them with the CPU allocator's byte counter, section 2 trades them for recomputation,
# section 3 splits the batch over two MPI processes, and section 4 does the arithmetic for many
# devices with this machine's numbers.

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
    if not cap and shutil.which("nvidia-smi"):  # compute capability: T4 7.5, A100 8.0, L4 8.9
        cap = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True).stdout.strip().split("\n")[0]
    cap = cap if cap.replace(".", "").isdigit() else ""
    if cap:  # the CUDA module for this GPU's architecture only
        env["CUDAARCHS"] = cap.replace(".", "") + "-real"
    else:  # no GPU: no CUDA module (Runtime > Change runtime type > GPU, then run this again)
        env["CMAKE_ARGS"] = (env.get("CMAKE_ARGS", "") + " -DNEEDLE_CUDA=OFF").strip()
    print(f"installing needle from {repo} (GPU: {cap or 'none'}); this takes 2-3 minutes")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                           f"needle[lectures] @ git+{repo}"],
                          env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError("pip install failed:\n" + done.stdout[-3000:] + done.stderr[-3000:])
    importlib.invalidate_caches()
    import needle
    print("needle installed:", "cuda() is available" if needle.cuda().enabled() else "cpu() only")

# %%
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

import needle as ndl
import needle.nn as nn
from companion import lecture
from companion.viz import save_figure

np.set_printoptions(precision=3, suppress=True)
np.random.seed(0)
lecture.setup()  # with NEEDLE_IMPL: cells marked "# companion-only" print a skip line
device = ndl.cpu()
ROOT = Path(ndl.__file__).resolve().parents[1]
mpiexec = str(Path(sys.executable).parent / "mpiexec")

# %%
# companion-only: needle.checkpoint and the CPU module's memory_stats() (allocator byte counts)
from needle.backend_ndarray import ndarray_backend_cpu as cpu_module
from needle.checkpoint import checkpoint_sequential, graph_bytes, sqrt_rule

print(cpu_module.memory_stats.__doc__.strip().splitlines()[-1])

# %% [markdown]
# ## 1. Where a training step's memory goes
#
# `memory_stats()` of the compiled CPU module reports the bytes held by live arrays now and at
# most since `reset_peak()`. The model is a deep MLP: 16 blocks of `Linear(256, 256)` and ReLU,
# on a batch of 512. One activation (512 × 256 float32) is 512 KiB.

# %%
# companion-only: the CPU module's memory_stats() and needle.checkpoint.graph_bytes
N_BLOCKS, WIDTH, BATCH = 16, 256, 512
ACT = BATCH * WIDTH * 4  # bytes of one activation


def blocks():
    """The N_BLOCKS blocks Linear-ReLU, always with the same parameters."""
    np.random.seed(0)
    return [nn.Sequential(nn.Linear(WIDTH, WIDTH, device=device), nn.ReLU())
            for _ in range(N_BLOCKS)]


X = np.random.standard_normal((BATCH, WIDTH)).astype(np.float32)
Y = np.random.randint(0, WIDTH, BATCH).astype(np.float32)


def live():
    return cpu_module.memory_stats()["live_bytes"]


model = nn.Sequential(*blocks())
param_bytes = sum(int(np.prod(p.shape)) * 4 for p in model.parameters())
x = ndl.Tensor(X, device=device, requires_grad=False)
start = live()
growth, out = [], x
for block in model.modules:
    for layer in block.modules:  # Linear, then ReLU
        before = live()
        out = layer(out)
        growth.append((type(layer).__name__, live() - before))
kept_live = live() - start
kept_graph = graph_bytes(out) - param_bytes - X.nbytes
del out
print(f"parameters: {param_bytes / ACT:.2f} activations' worth ({param_bytes / 2**20:.2f} MiB)")
print("bytes kept per layer, in activations:",
      sorted({(name, b / ACT) for name, b in growth}))
print(f"after the forward pass: {kept_live / ACT:.1f} activations live (allocator), "
      f"{kept_graph / ACT:.1f} held by the graph (summed over its nodes)")
assert all(b == (2 if name == "Linear" else 1) * ACT for name, b in growth)
assert kept_live == kept_graph == 3 * N_BLOCKS * ACT

# %% [markdown]
# Each `Linear` keeps two arrays (the product $XW$ and the sum with the broadcast bias; the
# broadcast itself is a view and costs nothing) and each ReLU one: three activations per block,
# 48 for the network, measured identically by the allocator and by summing the graph's arrays.
# For this network the activations (24 MiB) are six times the parameters (4 MiB); with a larger
# batch or a longer sequence the ratio grows without bound.

# %%
# companion-only: the per-layer byte counts of the companion-only cell above
fig, ax = plt.subplots(figsize=(9, 3))
cumulative = np.cumsum([b for _, b in growth]) / 2**20
colors = ["tab:blue" if name == "Linear" else "tab:orange" for name, _ in growth]
ax.bar(np.arange(len(growth)), [b / 2**20 for _, b in growth], color=colors)
ax2 = ax.twinx()
ax2.plot(np.arange(len(growth)), cumulative, color="k", lw=1)
ax.set_xlabel("layer (blue Linear, orange ReLU)")
ax.set_ylabel("MiB kept by the layer")
ax2.set_ylabel("MiB kept so far (line)")
ax.set_title("activation memory of a 16-block MLP's forward pass (batch 512, width 256)")
save_figure(fig, "activation_memory_per_layer")
plt.show()

# %% [markdown]
# ## 2. Activation checkpointing
#
# `needle.checkpoint.checkpoint_sequential(blocks, every=k)` groups the blocks into segments of
# `k` and keeps only each segment's input; in backward each segment is run again (now recording
# its graph) and differentiated. Peak memory during the step is then about
#
# $$\underbrace{\lceil N/k \rceil}_{\text{segment inputs}} + \underbrace{c\,k}_{\text{one segment
# recomputed}} \quad\text{activations,}$$
#
# with $c = 3$ activations per block here, plus what every step needs (gradients, parameters).
# It is smallest at $k = \sqrt{N/c}$; the usual "$\sqrt N$ rule" is the case $c = 1$. Every block
# is recomputed exactly once, whatever $k$: the price is one extra forward pass.

# %%
# companion-only: needle.checkpoint and the CPU module's memory_stats()/reset_peak()
calls = {"n": 0}


class Counted(nn.Module):
    """Counts calls of the wrapped block's forward (to measure recomputation)."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, x):
        calls["n"] += 1
        return self.module(x)


def step_memory(model):
    """(peak bytes above the start, block forwards) of one forward+backward from cleared grads."""
    for p in model.parameters():
        p.grad = None
    x = ndl.Tensor(X, device=device, requires_grad=False)
    y = ndl.Tensor(Y, device=device, requires_grad=False)
    calls["n"] = 0
    base = live()
    cpu_module.reset_peak()
    nn.SoftmaxLoss()(model(x), y).backward()
    return cpu_module.memory_stats()["peak_bytes"] - base, calls["n"]


plain_peak, plain_calls = step_memory(nn.Sequential(*[Counted(b) for b in blocks()]))
KS = [1, 2, 3, 4, 6, 8, 16]
peaks, recompute = {}, {}
for k in KS:
    peaks[k], n_calls = step_memory(checkpoint_sequential([Counted(b) for b in blocks()], k))
    recompute[k] = n_calls - N_BLOCKS
print(f"no checkpointing: peak {plain_peak / ACT:.1f} activations, {plain_calls} block forwards")
for k in KS:
    print(f"every {k:2d}: peak {peaks[k] / ACT:5.1f} activations, "
          f"{recompute[k]} blocks recomputed")
best = min(KS, key=peaks.get)
print(f"smallest peak at k = {best}; sqrt(N/3) = {np.sqrt(N_BLOCKS / 3):.2f}, "
      f"sqrt(N) = {sqrt_rule(N_BLOCKS)}")
assert plain_calls == N_BLOCKS and all(r == N_BLOCKS for r in recompute.values())
assert best in (2, 3) and peaks[sqrt_rule(N_BLOCKS)] < 0.5 * plain_peak
assert peaks[1] > peaks[best] and peaks[16] > peaks[best]

# %% [markdown]
# The model of the curve, with the step's fixed cost fitted as one constant (the parameter
# gradients alone are 8 activations' worth; the rest is the loss, the last output and the
# adjoints in flight), next to the measurements:

# %%
# companion-only: the checkpointing peaks of the companion-only cell above
ks = np.array(KS)
shape = np.ceil(N_BLOCKS / ks) + 3 * ks
fixed = float(np.median([peaks[k] / ACT for k in KS] - shape))
print(f"fixed cost {fixed:.1f} activations; model minus measured:",
      np.round(shape + fixed - np.array([peaks[k] / ACT for k in KS]), 1))
assert np.all(np.abs(shape + fixed - np.array([peaks[k] / ACT for k in KS])) <= 2.5)

# %% [markdown]
# With $k = N$ the whole network is one segment: nothing is saved in forward, but backward holds
# all of it again, so the peak is slightly *above* no checkpointing.
#
# Time: the step with checkpointing does one more forward pass. Measured below (median of three
# steps; the numbers vary from run to run and are not compared):

# %% tags=["nbval-ignore-output"]
# companion-only: needle.checkpoint.checkpoint_sequential
def step_seconds(model, repeats=3):
    x = ndl.Tensor(X, device=device, requires_grad=False)
    y = ndl.Tensor(Y, device=device, requires_grad=False)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        nn.SoftmaxLoss()(model(x), y).backward()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


plain_s = step_seconds(nn.Sequential(*blocks()))
ckpt_s = {k: step_seconds(checkpoint_sequential(blocks(), k)) for k in KS}
print(f"plain step {plain_s * 1e3:.0f} ms; with checkpointing: "
      + ", ".join(f"k={k} {t / plain_s:.2f}x" for k, t in ckpt_s.items()))

# %%
# companion-only: the checkpointing measurements of the companion-only cells above
fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 3.6))
ax.plot(KS, [peaks[k] / 2**20 for k in KS], "o-", label="measured peak")
ax.plot(KS, (shape + fixed) * ACT / 2**20, "--", label=r"$\lceil N/k\rceil + 3k$ + fixed")
ax.axhline(plain_peak / 2**20, color="k", lw=0.8, label="no checkpointing")
ax.axvline(np.sqrt(N_BLOCKS / 3), color="tab:green", lw=0.8, label=r"$\sqrt{N/3}$")
ax.axvline(np.sqrt(N_BLOCKS), color="tab:red", lw=0.8, ls=":", label=r"$\sqrt{N}$")
ax.set_xlabel("checkpoint every k blocks")
ax.set_ylabel("peak MiB during the step")
ax.set_xscale("log", base=2)
ax.set_xticks(KS, [str(k) for k in KS])
ax.legend(fontsize=8)
ax2.scatter([plain_s / plain_s], [plain_peak / 2**20], color="k", label="no checkpointing")
for k in KS:
    ax2.scatter(ckpt_s[k] / plain_s, peaks[k] / 2**20, color="tab:blue")
    ax2.annotate(f"k={k}", (ckpt_s[k] / plain_s, peaks[k] / 2**20), fontsize=8)
ax2.set_xlabel("step time / step time without checkpointing (measured)")
ax2.set_ylabel("peak MiB")
ax2.legend(fontsize=8)
save_figure(fig, "checkpoint_memory_vs_k")
plt.show()

# %% [markdown]
# ## 3. Data parallelism over MPI
#
# `companion/apps/distributed_train.py` trains a 64-64-10 MLP on the digits with SGD. Under
# `mpiexec -n 2` each of the two processes computes the loss and gradients on half of every
# global batch of 64, and `needle.distributed.allreduce_gradients` averages the gradients with
# one MPI `Allreduce` before each step. With equal halves the average is exactly the full-batch
# gradient, so both processes take the step a single process would take on the whole batch. The
# same script without `mpiexec` is that single process.

# %%
# companion-only: needle.distributed and companion.apps.distributed_train (data parallelism over MPI)
args = [sys.executable, "-m", "companion.apps.distributed_train", "--steps", "30", "--batch", "64"]
with tempfile.TemporaryDirectory() as tmp:
    subprocess.run(args + ["--out", f"{tmp}/one.npz"], cwd=ROOT, check=True)
    subprocess.run([mpiexec, "-n", "2"] + args + ["--out", f"{tmp}/two.npz"], cwd=ROOT,
                   check=True)
    one, two = dict(np.load(f"{tmp}/one.npz")), dict(np.load(f"{tmp}/two.npz"))
n_params = sum(one[f"param_{i}"].size for i in range(4))
param_diff = max(float(np.abs(one[f"param_{i}"] - two[f"param_{i}"]).max()) for i in range(4))
print(f"loss, 1 process:   {one['losses'][0]:.4f} -> {one['losses'][-1]:.4f}")
print(f"loss, 2 processes: {two['losses'][0]:.4f} -> {two['losses'][-1]:.4f}")
print(f"largest parameter difference after 30 steps below 1e-5: {param_diff < 1e-5}")
print(f"each rank sent {int(two['comm_bytes']) // int(two['comm_calls'])} bytes per step "
      f"= 4 bytes x {n_params} parameters, in {int(two['comm_calls'])} Allreduce calls")
assert int(two["world"]) == 2
assert param_diff < 1e-5
assert int(two["comm_bytes"]) == 30 * 4 * n_params

# %% [markdown]
# The two runs agree to float32 rounding (the shards' sums are added in a different order).
# On this machine the two "devices" are two processes on the same two cores, so the run shows the
# mechanism, not a speed-up. Its communication was measured:

# %% tags=["nbval-ignore-output"]
# companion-only: the MPI run of the companion-only cell above
comm_ms = 1e3 * float(two["comm_seconds"]) / int(two["comm_calls"])
compute_ms = 1e3 * float(two["compute_seconds"]) / 30
print(f"per step: compute {compute_ms:.2f} ms, Allreduce of {4 * n_params / 1e3:.0f} kB "
      f"{comm_ms:.2f} ms")

# %% [markdown]
# ## 4. Model and pipeline parallelism, on paper, with this machine's numbers
#
# Two measured speeds drive the arithmetic: how fast one device multiplies matrices, and how fast
# two processes exchange bytes.

# %% tags=["nbval-ignore-output"]
n = 1024
a = ndl.Tensor(np.random.standard_normal((n, n)), device=device, requires_grad=False)
b = ndl.Tensor(np.random.standard_normal((n, n)), device=device, requires_grad=False)
(a @ b).numpy()
start = time.perf_counter()
for _ in range(3):
    (a @ b).realize_cached_data()
flops = 3 * 2 * n**3 / (time.perf_counter() - start)
probe = [sys.executable, "-c", (
    "import numpy as np, time; from mpi4py import MPI; c = MPI.COMM_WORLD\n"
    "x = np.ones(2**22, np.float32); y = np.empty_like(x); c.Allreduce(x, y)\n"
    "t = time.perf_counter()\nfor _ in range(5): c.Allreduce(x, y)\n"
    "t = (time.perf_counter() - t) / 5\n"
    "c.Get_rank() or print(x.nbytes / t)")]
bandwidth = float(subprocess.run([mpiexec, "-n", "2"] + probe, capture_output=True, text=True,
                                 check=True).stdout)
print(f"needle matmul: {flops / 1e9:.1f} GFLOP/s; Allreduce of 16 MiB between two processes: "
      f"{bandwidth / 1e9:.2f} GB/s")

# %% [markdown]
# **Data parallelism** copies the model to $K$ devices and splits the batch. Each step, a ring
# all-reduce sends and receives $2\frac{K-1}{K}\cdot 4P$ bytes per device for $P$ float32
# parameters — independent of $K$, so it scales to thousands of devices as long as each device's
# compute per step ($\approx 6P$ flops per token: forward $2P$, backward $4P$) outlasts its
# communication. Frameworks hide the all-reduce behind the backward pass: the gradients of the
# last layers are complete first, so their bucket is sent while earlier layers are still being
# differentiated (the bucketing in `allreduce_gradients` is the first half of that idea).
#
# **Model (tensor) parallelism** splits each weight matrix over devices: a `Linear(d, d)` on
# $K$ devices holds $d \times d/K$ each, and each layer's output must be gathered (an all-reduce
# of the activations, $B \cdot d$ numbers per layer in forward and again in backward). It cuts the
# parameter and activation memory per device by $K$ but communicates *every layer*, so it is used
# within a node with fast links.
#
# **Pipeline parallelism** places consecutive layers on different devices and passes activations
# from one stage to the next ($B \cdot d$ per boundary). To keep the stages busy the batch is cut
# into $M$ micro-batches; the first and last stages idle for $K - 1$ micro-batch slots, a "bubble"
# fraction of $(K-1)/(M+K-1)$.
#
# The same formulas with the two measured speeds, for a 1.5-billion-parameter model trained on
# 512 tokens per device per step (the cell prints estimates, not measurements):

# %% tags=["nbval-ignore-output"]
P, tokens = 1.5e9, 512
compute_s = 6 * P * tokens / flops
for K in (2, 64, 4096):
    ring_bytes = 2 * (K - 1) / K * 4 * P
    print(f"K = {K:4d}: data parallel, per device per step: compute {compute_s:7.1f} s, "
          f"all-reduce {ring_bytes / 1e9:5.1f} GB = {ring_bytes / bandwidth:6.1f} s at this "
          f"machine's bandwidth")
for M in (1, 4, 32):
    print(f"pipeline of 8 stages, {M:2d} micro-batches: bubble {(8 - 1) / (M + 8 - 1):.0%}")

# %% [markdown]
# At this machine's matmul speed one device would need a minute or more for one step of such a
# model, and the all-reduce, whose volume stops growing with $K$, would add a sizable fraction of
# that again. Large models train on accelerators with hundreds of TFLOP/s *and* links of hundreds of
# GB/s, and overlap the communication with the backward pass so that it costs no time when it is
# shorter than the computation. The bubble formula is exact arithmetic:

# %%
bubble = {M: (8 - 1) / (M + 8 - 1) for M in (1, 4, 32)}
print({M: round(v, 3) for M, v in bubble.items()})
assert bubble[1] == 7 / 8 and bubble[32] < 0.2

# %% [markdown]
# ## Exercises
#
# Each exercise has a cell to fill in (it starts as `raise NotImplementedError`) and a check
# cell that says whether your answer is right: "not answered yet", "correct", or "not yet"
# with what differs. The first cell below gathers everything the exercises use, so this
# section also runs on its own after a kernel restart. Reference answers are in
# `notebooks/solutions/12_training_large_models.py`; try first.

# %% tags=["exercise-setup"]
import gc

import numpy as np

import needle as ndl
import needle.nn as nn
from needle.backend_ndarray import ndarray_backend_cpu as cpu_module
from companion.check.exercises import check_exercise

rng = np.random.default_rng(0)


def ffn_block(width, bias):
    """A Transformer's feed-forward block: Linear(w, 4w), ReLU, Linear(4w, w)."""
    return nn.Sequential(nn.Linear(width, 4 * width, bias=bias), nn.ReLU(),
                         nn.Linear(4 * width, width, bias=bias))


def forward_bytes(batch, width, n_blocks, bias, every=None):
    """Bytes that stay allocated after the forward pass of n_blocks FFN blocks (allocator count),
    without checkpointing, or with checkpoint_sequential(blocks, every)."""
    from needle.checkpoint import checkpoint_sequential  # this project's extension

    blocks = [ffn_block(width, bias) for _ in range(n_blocks)]
    model = nn.Sequential(*blocks) if every is None else checkpoint_sequential(blocks, every)
    x = ndl.Tensor(rng.standard_normal((batch, width)).astype(np.float32), requires_grad=False)
    gc.collect()  # no garbage of earlier cells may be freed while the bytes are counted
    gc.disable()
    try:
        start = cpu_module.memory_stats()["live_bytes"]
        out = model(x)
        kept = cpu_module.memory_stats()["live_bytes"] - start
    finally:
        gc.enable()
    del out
    return kept


class Ring:
    """K workers in a ring. ``send(src, array)`` delivers a copy of ``array`` from worker src to
    worker (src + 1) % K and counts the numbers each worker has sent."""

    def __init__(self, K):
        self.K = K
        self.sent = [0] * K

    def send(self, src, array):
        self.sent[src] += int(np.size(array))
        return np.array(array, copy=True)


X_shards = rng.standard_normal((10, 5)).astype(np.float32)
y_shards = rng.integers(0, 3, 10).astype(np.float32)


def needle_gradients(model, X, y):
    """The gradients of the mean SoftmaxLoss of ``model`` on (X, y), as numpy arrays."""
    for p in model.parameters():
        p.grad = None
    loss = nn.SoftmaxLoss()(model(ndl.Tensor(X, requires_grad=False)),
                            ndl.Tensor(y, requires_grad=False))
    loss.backward()
    return [p.grad.numpy().astype(np.float64) for p in model.parameters()]


# %% [markdown]
# **Exercise 12.1 (count the activations).** A Transformer's feed-forward block is
# `Linear(w, 4w)`, `ReLU`, `Linear(4w, w)`. Using section 1's accounting (what each `Linear`
# and `ReLU` keeps, and that a broadcast is a view), write how many bytes a forward pass of
# `n_blocks` such blocks keeps alive for backward, for a float32 batch of `batch` rows, with
# and without biases. The check counts with the allocator (its sizes keep every array a
# multiple of the allocator's 64-byte alignment).

# %% tags=["exercise-stub"]
def ffn_forward_bytes(batch, width, n_blocks, bias):
    """Bytes kept by the forward pass of n_blocks FFN blocks (the input not counted)."""
    raise NotImplementedError


# %% tags=["exercise-check"]
# companion-only: the CPU module's memory_stats() (the check counts bytes with the allocator)
CONFIGS = [(8, 16, 3, True), (8, 16, 3, False), (4, 8, 2, True)]
check_exercise("12.1 ffn_forward_bytes", lambda: [ffn_forward_bytes(*c) for c in CONFIGS],
               [forward_bytes(*c) for c in CONFIGS], rtol=0, atol=0)

# %% [markdown]
# **Exercise 12.2 (checkpointed forward).** Now the same blocks go through
# `checkpoint_sequential(blocks, every)`. How many bytes does the forward pass keep alive now
# (before backward)? The check counts with the allocator again; compare with exercise 12.1.

# %% tags=["exercise-stub"]
def checkpointed_forward_bytes(batch, width, n_blocks, bias, every):
    """Bytes kept by the checkpointed forward pass (the input not counted)."""
    raise NotImplementedError


# %% tags=["exercise-check"]
# companion-only: needle.checkpoint and the CPU module's memory_stats()
CONFIGS_CK = [(8, 16, 5, True, 2), (8, 16, 6, True, 3), (8, 16, 5, False, 1), (8, 16, 4, True, 4)]
check_exercise("12.2 checkpointed_forward_bytes",
               lambda: [checkpointed_forward_bytes(*c) for c in CONFIGS_CK],
               [forward_bytes(*c[:4], every=c[4]) for c in CONFIGS_CK], rtol=0, atol=0)

# %% [markdown]
# **Exercise 12.3 (a ring all-reduce).** Write the ring all-reduce of section 4 with `ring`
# as the only way to communicate: worker $i$ may send only to worker $i + 1 \bmod K$. Cut each
# worker's vector into $K$ chunks; in $K - 1$ reduce-scatter steps each worker sends one chunk
# and adds the chunk it receives, so that worker $i$ ends with the full sum of one chunk; in
# $K - 1$ all-gather steps the summed chunks travel once more round the ring. Return every
# worker's result. The check compares with the sum and counts what each worker sent against
# $2\frac{K-1}{K} n$.

# %% tags=["exercise-stub"]
def ring_allreduce(vectors, ring):
    """The sum of the K vectors (length n, divisible by K), as each of the K workers has it."""
    raise NotImplementedError


# %% tags=["exercise-check"]
def _allreduce_ok(K, n):
    vectors = [rng.standard_normal(n) for _ in range(K)]
    ring = Ring(K)
    got = ring_allreduce([v.copy() for v in vectors], ring)
    total = np.sum(vectors, axis=0)
    if len(got) != K or not all(np.allclose(g, total, rtol=1e-12, atol=1e-12) for g in got):
        return f"K={K}: not every worker holds the sum of the {K} vectors"
    if ring.sent != [2 * (K - 1) * n // K] * K:
        return f"K={K}, n={n}: workers sent {ring.sent}, expected {2 * (K - 1) * n // K} each"
    return None


check_exercise("12.3 ring_allreduce", lambda: [_allreduce_ok(K, n) for K, n in ((2, 6), (4, 12),
                                                                               (5, 20))],
               predicate=lambda problems: next((p for p in problems if p), None))

# %% [markdown]
# **Exercise 12.4 (unequal shards).** Section 3's `allreduce_gradients` averages the workers'
# gradients, which is the full-batch gradient only when every worker has the same number of
# samples. With shards of different sizes (the last batch of an epoch, say), how must the
# gradients of the mean loss on each shard be combined to give the gradient of the mean loss
# on the whole batch? The check differentiates needle's model on the shards and on the batch.

# %% tags=["exercise-stub"]
def combine_shard_gradients(shard_grads, shard_sizes):
    """shard_grads[i] is the list of parameter gradients on shard i (of shard_sizes[i]
    samples); returns the list of full-batch gradients."""
    raise NotImplementedError


# %% tags=["exercise-check"]
np.random.seed(0)
model_ex = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3))
_cuts = [(0, 7), (7, 10)]
check_exercise("12.4 combine_shard_gradients",
               lambda: combine_shard_gradients(
                   [needle_gradients(model_ex, X_shards[a:b], y_shards[a:b]) for a, b in _cuts],
                   [b - a for a, b in _cuts]),
               needle_gradients(model_ex, X_shards, y_shards), rtol=1e-4, atol=1e-6)
