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
# measure the optimizer state and what ZeRO shards, and the memory inference reuses; run
# data-parallel training over MPI and check it against single-process training; estimate the
# communication of data, tensor and pipeline parallelism and of a parameter server, with stated
# assumptions about the links
#
# **Run time:** about 35 to 60 s on a busy 2-core x86-64 machine
# **Student mode:** this notebook is mostly about this project's extensions: with
# `NEEDLE_IMPL=path/to/hwN/python` (your own needle), sections 1-3 and exercises 12.1-12.2 are
# skipped (cells marked companion-only: they use the CPU module's `memory_stats()`,
# `needle.checkpoint` and `needle.distributed`); section 4's measurements and arithmetic and
# exercises 12.3-12.4 run on your needle.
#
# A model is "large" when one step no longer fits the memory or the time of one device. Memory
# goes to the parameters, their gradients, the optimizer state, and the **activations** that the
# forward pass keeps for backward. All four grow with the depth (and the width); only the
# activations also grow with the batch and the sequence length. Section 1 measures them with the
# CPU allocator's byte counter (and shows that inference, which keeps nothing for backward,
# reuses its memory), section 2 trades activations for recomputation, section 3 splits the batch
# over two MPI processes, and section 4 does the arithmetic for many devices: sharding the
# optimizer state, tensor and pipeline parallelism, and the all-reduce's cost.

# %% tags=["remove-cell"] cellView="form" jupyter={"source_hidden": true}
#@title Colab set-up: in Colab this installs needle (2-3 minutes); elsewhere it does nothing
import os, shlex, subprocess, sys, tempfile; repo = os.environ.get("NEEDLE_COLAB_REPO", "https://github.com/needle-companion/needle-companion")
if "google.colab" in sys.modules or os.environ.get("NEEDLE_COLAB_SIMULATE") == "1":  # companion/colab_setup.py
    py, src, q = sys.executable, os.path.join(tempfile.gettempdir(), "needle-companion"), shlex.quote
    done = subprocess.run(f"{q(py)} -m companion.colab_setup --status --lectures 2>/dev/null || {{ {{ test -d {q(src)} || git clone -q --depth=1 {q(repo)} {q(src)}; }} && cd {q(src)} && {q(py)} -m companion.colab_setup --install {q(repo)} --cwd {q(os.getcwd())} --lectures; }}", shell=True, capture_output=True, text=True); print(done.stdout + done.stderr[-3000:], end=""); assert done.returncode == 0, f"the set-up could not install this project from {repo} (what failed is above)"

# %%
import gc
import os
import subprocess
import sys
import tempfile
import time

import matplotlib.pyplot as plt
import numpy as np

import needle as ndl
import needle.nn as nn
from companion import lecture
from companion.machine import machine_line
from companion.viz import save_figure

np.set_printoptions(precision=3, suppress=True)
np.random.seed(0)
lecture.setup()  # with NEEDLE_IMPL: cells marked "# companion-only" print a skip line
device = ndl.cpu()  # sections 1-2 count bytes with the CPU module's allocator: cpu()
mpiexec = lecture.mpiexec()  # None where mpi4py or mpich has no wheel: the MPI cells say so

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
# For this network the activations (24 MiB) are six times the parameters (4 MiB). Both grow
# with the number of blocks; only the activations grow with the batch (or, in a Transformer,
# the sequence length), so with a larger batch the ratio grows without bound.

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

# %% [markdown]
# **Gradients and optimizer state.** One Adam step on the same model, with the allocator
# counting what stays alive: after `backward()` the gradients (one array per parameter), after
# the first `opt.step()` Adam's two moments $m$ and $v$ (created at the first step, one array of
# each per parameter). The loss's graph is dropped before each count.

# %%
# companion-only: the CPU module's memory_stats()
model = nn.Sequential(*blocks())
opt = ndl.optim.Adam(model.parameters(), lr=1e-3)
x = ndl.Tensor(X, device=device, requires_grad=False)
y = ndl.Tensor(Y, device=device, requires_grad=False)
state = {"parameters": param_bytes}
gc.collect()  # no garbage of earlier cells may be freed while the bytes are counted
start = live()
nn.SoftmaxLoss()(model(x), y).backward(create_graph=False)
state["gradients"] = live() - start
start = live()
opt.step()
state["Adam's m and v"] = live() - start
for name, nbytes in state.items():
    print(f"{name:15s} {nbytes / 2**20:6.2f} MiB = {nbytes / param_bytes:.2f} x the parameters")
assert abs(state["gradients"] / param_bytes - 1) < 0.01
assert abs(state["Adam's m and v"] / param_bytes - 2) < 0.01

# %% [markdown]
# So a float32 model trained with Adam holds four copies of its parameters (weights, gradients,
# $m$, $v$), 16 bytes per parameter, before a single activation is counted. **Mixed precision**
# does the arithmetic in 16 bits: 16-bit weights and gradients (2 + 2 bytes per parameter) and
# half-size activations, but the optimizer keeps float32 master weights, $m$ and $v$
# (4 + 4 + 4): still 16 bytes per parameter, of which 12 are optimizer state. Under data
# parallelism every device holds all four. **ZeRO** (the
# "zero redundancy optimizer" of DeepSpeed) removes the copies that need not be replicated:
# stage 1 shards the optimizer state, each of $K$ devices keeping $m$ and $v$ for $1/K$ of the
# parameters and updating only that slice (the gradient all-reduce becomes a reduce-scatter,
# then an all-gather of the updated slices: the same bytes on the wire); stage 2 also shards
# the gradients, stage 3 the parameters themselves (gathered layer by layer when needed). On
# paper, per device, with the bytes just measured:

# %%
# companion-only: the measured bytes of the cell above
P_B, G_B, O_B = state["parameters"], state["gradients"], state["Adam's m and v"]
print(f"{'K':>4s} {'replicated':>11s} {'ZeRO-1':>8s} {'ZeRO-2':>8s} {'ZeRO-3':>8s}   "
      f"(MiB per device, activations not included)")
zero = {}
for K in (1, 2, 8, 64):
    zero[K] = [P_B + G_B + O_B, P_B + G_B + O_B / K, P_B + (G_B + O_B) / K,
               (P_B + G_B + O_B) / K]
    print(f"{K:4d} " + " ".join(f"{v / 2**20:{w}.2f}" for v, w in zip(zero[K], (11, 8, 8, 8))))
print(f"ZeRO-1 on 64 devices keeps {zero[64][1] / zero[64][0]:.0%} of the replicated bytes")

# %% [markdown]
# **Inference reuses its memory.** Without backward nothing has to be kept: under
# `ndl.no_grad()` no graph is recorded, so each layer's input is freed as soon as the next
# layer has consumed it, and the allocator hands the freed buffer to the next array. The peak
# is then what one layer needs at a time (its input and the arrays it creates), whatever the
# depth. Measured for 4, 8 and 16 blocks, beside the training forward pass of section 1:

# %%
# companion-only: the CPU module's memory_stats()/reset_peak()
def forward_peak(n_blocks, inference):
    """Peak bytes above the start during a forward pass of n_blocks blocks."""
    model = nn.Sequential(*blocks()[:n_blocks])
    x = ndl.Tensor(X, device=device, requires_grad=False)
    gc.collect()
    base = live()
    cpu_module.reset_peak()
    if inference:
        with ndl.no_grad():
            out = model(x)
    else:
        out = model(x)
    peak = cpu_module.memory_stats()["peak_bytes"] - base
    del out
    return peak


for n_blocks in (4, 8, 16):
    infer, train_fw = forward_peak(n_blocks, True), forward_peak(n_blocks, False)
    print(f"{n_blocks:2d} blocks: peak {infer / ACT:.1f} activations in inference, "
          f"{train_fw / ACT:.1f} in the training forward pass")
    assert infer == 3 * ACT and train_fw == 3 * n_blocks * ACT

# %% [markdown]
# Three activations at the peak in inference (a Linear's input, its product $XW$ and the sum
# with the bias, before the input is released), at every depth; the training forward pass keeps
# $3N$. Inference engines plan this reuse ahead of time (onnxruntime's and TVM's memory
# planners, notebook 13) instead of relying on reference counting.

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
# with $c = 3$ activations per block here, plus a fixed cost of the step (the parameter
# gradients as backward creates them, the loss's arrays; the parameters themselves were
# allocated before the count starts and are not in it). It is smallest at $k = \sqrt{N/c}$; the
# usual "$\sqrt N$ rule" is the case $c = 1$. Every block is recomputed exactly once, whatever
# $k$: the price is one extra forward pass.
#
# *Which* activations to drop matters as much as how many. Recomputing an element-wise op (a
# ReLU, a normalisation, a dropout mask from its seed) costs almost nothing beside a matrix
# product, so a common refinement keeps the outputs of the expensive ops and drops only the
# cheap ones, recomputing them in backward (Chen et al.'s sublinear-memory paper drops the
# results of cheap operations such as batch norm and ReLU; Megatron-LM's *selective*
# recomputation drops only the parts of attention that take much memory and little arithmetic).
# Here each block keeps three activations: the product $XW$, its sum with the bias and the
# ReLU's output. Keeping only the product and recomputing the two element-wise ones would save
# two thirds of the activation memory for a small fraction of the time.
#
# The steps below call `backward(create_graph=False)`: the gradients are computed as plain
# arrays, each adjoint is freed once it has been passed on, and so is each node of the forward
# graph (its activation and what its op saved), as in PyTorch's backward. The course's
# `backward()` (the default) builds the gradients as a graph that could be differentiated
# again, which keeps every adjoint alive until the gradients are reset; the first line of the
# output shows what that costs on this step.

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


def step_memory(model, create_graph=False):
    """(peak bytes above the start, block forwards) of one forward+backward from cleared grads."""
    for p in model.parameters():
        p.grad = None
    x = ndl.Tensor(X, device=device, requires_grad=False)
    y = ndl.Tensor(Y, device=device, requires_grad=False)
    calls["n"] = 0
    gc.collect()  # garbage of earlier steps is freed now, and no collection runs mid-step:
    gc.disable()  # when one would run depends on the Python version, and it moves the peak
    try:
        base = live()
        cpu_module.reset_peak()
        nn.SoftmaxLoss()(model(x), y).backward(create_graph=create_graph)
        return cpu_module.memory_stats()["peak_bytes"] - base, calls["n"]
    finally:
        gc.enable()


plain_peak, plain_calls = step_memory(nn.Sequential(*[Counted(b) for b in blocks()]))
graph_peak, _ = step_memory(nn.Sequential(*blocks()), create_graph=True)
KS = [1, 2, 3, 4, 6, 8, 16]
peaks, recompute = {}, {}
for k in KS:
    peaks[k], n_calls = step_memory(checkpoint_sequential([Counted(b) for b in blocks()], k))
    recompute[k] = n_calls - N_BLOCKS
print(f"no checkpointing: peak {plain_peak / ACT:.1f} activations, {plain_calls} block forwards "
      f"({graph_peak / ACT:.1f} with backward(create_graph=True), which records the gradients' "
      f"graph)")
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
# The model of the curve, with the step's fixed cost fitted as one constant, next to the
# measurements. The constant comes out below the parameter gradients alone (8 activations'
# worth): the model counts every segment input as alive at the peak, but the backward pass has
# freed the inputs of the segments it has finished by then, so the measured peaks sit a few
# activations below the count.

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
# Time: the step with checkpointing does one more forward pass. Measured below (the fastest of
# seven steps each, taken in turns; the numbers vary from run to run and are not compared), and
# the last line compares them with the prediction from the measured forward pass:

# %% tags=["nbval-ignore-output"]
# companion-only: needle.checkpoint.checkpoint_sequential
print(machine_line())
x = ndl.Tensor(X, device=device, requires_grad=False)
y = ndl.Tensor(Y, device=device, requires_grad=False)


def step(model):
    return lambda: nn.SoftmaxLoss()(model(x), y).backward(create_graph=False)


def forward(model):
    def run():
        with ndl.no_grad():
            model(x)
    return run


runs = {"plain": step(nn.Sequential(*blocks())), "forward": forward(nn.Sequential(*blocks())),
        **{k: step(checkpoint_sequential(blocks(), k)) for k in KS}}
samples = {name: [] for name in runs}
for _ in range(7):  # round robin, so that a burst of load on the machine hits every variant
    for name, run in runs.items():
        start = time.perf_counter()
        run()
        samples[name].append(time.perf_counter() - start)
best = {name: min(ts) for name, ts in samples.items()}  # the least disturbed of 7
plain_s, forward_s = best["plain"], best["forward"]
ckpt_s = {k: best[k] for k in KS}
predicted = (plain_s + forward_s) / plain_s
print(f"plain step {plain_s * 1e3:.0f} ms, of which a forward pass alone takes "
      f"{forward_s * 1e3:.0f} ms: one extra forward pass predicts {predicted:.2f}x")
print("with checkpointing: " + ", ".join(f"k={k} {t / plain_s:.2f}x" for k, t in ckpt_s.items()))
median_ratio = float(np.median([t / plain_s for t in ckpt_s.values()]))
print(f"median {median_ratio:.2f}x: "
      + ("close to the prediction" if abs(median_ratio - predicted) <= 0.15 * predicted
         else "above the prediction (each segment's recomputation also records a graph, and the "
              "timings are noisy on a busy machine)" if median_ratio > predicted
         else "below the prediction (noisy timings)"))

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
if mpiexec is None:
    print(lecture.NO_MPI.format(what="the data-parallel run"))
else:
    args = [sys.executable, "-m", "companion.apps.distributed_train", "--steps", "30",
            "--batch", "64"]
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(args + ["--out", f"{tmp}/one.npz"], check=True)
        subprocess.run([mpiexec, "-n", "2"] + args + ["--out", f"{tmp}/two.npz"], check=True)
        one, two = dict(np.load(f"{tmp}/one.npz")), dict(np.load(f"{tmp}/two.npz"))
    n_params = sum(one[f"param_{i}"].size for i in range(4))
    param_diff = max(float(np.abs(one[f"param_{i}"] - two[f"param_{i}"]).max())
                     for i in range(4))
    print(f"loss, 1 process:   {one['losses'][0]:.4f} -> {one['losses'][-1]:.4f}")
    print(f"loss, 2 processes: {two['losses'][0]:.4f} -> {two['losses'][-1]:.4f}")
    print(f"largest parameter difference after 30 steps below 1e-5: {param_diff < 1e-5}")
    # what one step must send, from the architecture alone: Linear(64, 64) and Linear(64, 10)
    # with biases, float32 gradients, all in one bucket
    grad_bytes = 4 * ((64 + 1) * 64 + (64 + 1) * 10)
    print(f"each rank contributed {int(two['comm_bytes']) // int(two['comm_calls'])} bytes per "
          f"step to {int(two['comm_calls'])} Allreduce calls; the model's gradients are "
          f"{grad_bytes} bytes")
    assert int(two["world"]) == 2 and n_params * 4 == grad_bytes
    assert param_diff < 1e-5
    assert int(two["comm_calls"]) == 30 and int(two["comm_bytes"]) == 30 * grad_bytes

# %% [markdown]
# The two runs agree to float32 rounding (the shards' sums are added in a different order).
# "Contributed" counts the bytes each rank hands to `Allreduce` (its gradient buffer); what
# travels on the wire depends on the algorithm MPI picks (for two ranks a ring sends the same
# amount). The two "devices" are two processes sharing one machine's cores, so the run shows the
# mechanism, not a speed-up. Its communication was measured (inside the script, so the cell
# prints the machine it ran on first):

# %% tags=["nbval-ignore-output"]
# companion-only: the MPI run of the companion-only cell above
if mpiexec is None:
    print(lecture.NO_MPI.format(what="the data-parallel run's communication"))
else:
    print(machine_line())
    comm_ms = 1e3 * float(two["comm_seconds"]) / int(two["comm_calls"])
    compute_ms = 1e3 * float(two["compute_seconds"]) / 30
    print(f"per step: compute {compute_ms:.2f} ms, Allreduce of {4 * n_params / 1e3:.0f} kB "
          f"{comm_ms:.2f} ms")

# %% [markdown]
# ## 4. Many devices, on paper: all-reduce, parameter servers, tensor and pipeline parallelism
#
# Two measured speeds of this machine: how fast one device multiplies matrices, and how fast two
# processes exchange bytes through MPI: a large `Allreduce` (16 MiB, bandwidth) and a tiny one
# (8 bytes, latency). The two processes share one machine's memory, so these are not the speeds
# of a network link.

# %% tags=["nbval-ignore-output"]
print(machine_line())
n = 1024
fastest = lecture.best_device()  # one device's matmul speed: the GPU where there is one (Colab)
a = ndl.Tensor(np.random.standard_normal((n, n)), device=fastest, requires_grad=False)
b = ndl.Tensor(np.random.standard_normal((n, n)), device=fastest, requires_grad=False)
(a @ b).numpy()
start = time.perf_counter()
for _ in range(3):
    (a @ b).realize_cached_data()
if fastest.name == "cuda":
    fastest.synchronize()  # cuda() queues its kernels: wait for them before reading the clock
flops = 3 * 2 * n**3 / (time.perf_counter() - start)
probe = [sys.executable, "-c", (
    "import numpy as np, time; from mpi4py import MPI; c = MPI.COMM_WORLD\n"
    "def per_call(n, reps):\n"
    "    x = np.ones(n, np.float32); y = np.empty_like(x); c.Allreduce(x, y); c.Barrier()\n"
    "    t = time.perf_counter()\n"
    "    for _ in range(reps): c.Allreduce(x, y)\n"
    "    return (time.perf_counter() - t) / reps\n"
    "big, small = per_call(2**22, 5), per_call(2, 2000)\n"
    "c.Get_rank() or print(4 * 2**22 / big, small)")]
if mpiexec is None:
    bandwidth = latency = None
    print(f"needle matmul: {flops / 1e9:.1f} GFLOP/s; "
          + lecture.NO_MPI.format(what="the Allreduce probe"))
else:
    bandwidth, latency = map(float, subprocess.run([mpiexec, "-n", "2"] + probe, text=True,
                                                    capture_output=True, check=True).stdout.split())
    print(f"needle matmul: {flops / 1e9:.1f} GFLOP/s; between two processes on this machine: "
          f"Allreduce of 16 MiB {bandwidth / 1e9:.2f} GB/s, of 8 bytes {latency * 1e6:.1f} µs")

# %% [markdown]
# **Data parallelism** copies the model to $K$ devices and splits the batch; each step the
# gradients ($n = 4P$ bytes for $P$ float32 parameters) are all-reduced. A **ring all-reduce**
# (exercise 12.3) takes $2(K-1)$ steps, in each of which every device sends one chunk of
# $n/K$ bytes to its neighbour. With a per-message latency $\alpha$ and a link bandwidth
# $\beta$ its time is
#
# $$T_\text{ring} = \underbrace{2(K-1)\,\alpha}_{\text{latency}} +
#   \underbrace{2\frac{K-1}{K}\cdot\frac{n}{\beta}}_{\text{bandwidth}} .$$
#
# The bandwidth term is *bounded*, not constant: it grows from $n/\beta$ at $K = 2$ towards
# $2n/\beta$, never beyond, which is what makes the ring bandwidth-optimal. The latency term
# grows linearly with $K$: with thousands of devices, $2(K-1)$ sequential message latencies
# matter. A **tree** (reduce up a binary tree, broadcast back down) needs only $2\log_2 K$
# latencies, but as a plain tree it moves the whole $n$ bytes at each of its $2\log_2 K$ levels:
# its bandwidth term is $2\log_2 K \cdot n/\beta$, which grows with $K$ and is far worse than
# the ring's (the table below has both columns). Production libraries get both: NCCL's double
# binary tree cuts the data into chunks and pipelines them through two trees, for log-depth
# latency at nearly the ring's bandwidth, and hierarchies run a ring over the fast links inside
# each node, then one across nodes.
#
# Frameworks hide the all-reduce behind the backward pass. `allreduce_gradients` sends all the
# gradients in one *bucket*, which pays the per-message latency once instead of once per
# parameter (bucketing amortises latency), but it waits for the whole backward pass. Overlap
# needs several buckets: the gradients of the last layers are complete first, so their bucket
# is sent while earlier layers are still being differentiated. That hides the communication
# only while it is shorter than the backward computation.
#
# **The parameter-server alternative.** Instead of all-reducing among themselves, the workers
# push their gradients to a server, which sums them, updates the parameters and lets the workers
# pull them back. Each worker sends and receives $n$ bytes, but the server receives $K n$ and
# sends $K n$: one server's link is the bottleneck and its time grows linearly with $K$.
# Sharding the parameters over $S$ servers divides that by $S$ (with $S = K$, every worker also
# serving one shard, the traffic is that of a reduce-scatter plus an all-gather, i.e. an
# all-reduce). Parameter servers also allow *asynchronous* updates (workers do not wait for each
# other, at the price of stale gradients); the synchronous all-reduce gives exactly the
# single-device step, as section 3 checked.
#
# The formulas with numbers, for a 1.5-billion-parameter model (GPT-2 XL's size) trained on 8
# sequences of 1024 tokens per device per step ($6P$ flops per token: forward $2P$, backward
# $4P$). The link figures and the accelerator's speed are **assumptions**, stated in the cell,
# not measurements; only the first line uses this machine's measured speeds.

# %% tags=["nbval-ignore-output"]
P, tokens = 1.5e9, 8 * 1024
grad_bytes_big = 4 * P
ASSUMED = {"link bandwidth (a 200 Gb/s InfiniBand port), bytes/s": 25e9,
           "latency per message between nodes, s": 5e-6,
           "accelerator speed, sustained, flop/s": 300e12}
beta, alpha, accel = ASSUMED.values()
for what, value in ASSUMED.items():
    print(f"assumed: {what} = {value:g}")
cpu_step = 6 * P * tokens / flops
accel_step = 6 * P * tokens / accel
print(f"one step's compute on one device: {cpu_step:.1f} s ({cpu_step / 60:.1f} min) at this "
      f"machine's measured {flops / 1e9:.0f} GFLOP/s; {accel_step:.3f} s on the assumed "
      f"accelerator")
print(f"{'K':>5s} {'ring: latency':>14s} {'bandwidth':>10s} {'tree: latency':>14s} "
      f"{'bandwidth':>10s} {'1 param server':>15s}   (s per step, assumed link)")
comm = {}
for K in (2, 64, 4096):
    comm[K] = {"ring latency": 2 * (K - 1) * alpha,
               "ring bandwidth": 2 * (K - 1) / K * grad_bytes_big / beta,
               "tree latency": 2 * np.log2(K) * alpha,
               "tree bandwidth": 2 * np.log2(K) * grad_bytes_big / beta,
               "parameter server": K * grad_bytes_big / beta}
    c = comm[K]
    print(f"{K:5d} {c['ring latency']:14.5f} {c['ring bandwidth']:10.3f} "
          f"{c['tree latency']:14.5f} {c['tree bandwidth']:10.2f} {c['parameter server']:15.1f}")
ring_4096 = comm[4096]["ring latency"] + comm[4096]["ring bandwidth"]
print(f"K = 4096: the ring all-reduce takes {ring_4096:.2f} s per step, "
      f"{ring_4096 / accel_step:.1f}x the assumed accelerator's compute: "
      + ("it can be hidden behind backward" if ring_4096 < accel_step
         else "it cannot be hidden; fewer bytes (16-bit gradients), more tokens per device or "
              "faster links are needed"))
if bandwidth is not None:
    print(f"for comparison, {grad_bytes_big / 1e9:.0f} GB all-reduced at the rate measured "
          f"between two processes on this machine: {grad_bytes_big / bandwidth:.1f} s")

# %% [markdown]
# **Tensor (model) parallelism** splits each weight matrix over $K$ devices. A
# *column-parallel* `Linear` $Y = XW$ gives device $k$ the columns $W_{:,k}$: it computes the
# slice $XW_{:,k}$ ($B \times d_\text{out}/K$), a shard of the output, and assembling the full
# output on every device would be an **all-gather**. A *row-parallel* `Linear` gives device $k$
# the rows $W_{k,:}$ and the matching slice $X_{:,k}$ of the input: it computes a *partial sum*
# $X_{:,k}W_{k,:}$ of the full $B \times d_\text{out}$ output, and the partial sums must be
# added by an **all-reduce**. Megatron-LM pairs the two in a Transformer's MLP: the first
# `Linear` column-parallel (its sharded output goes through the element-wise ReLU shard by
# shard), the second row-parallel (it takes exactly that shard as its input slice), so the pair
# needs one all-reduce of $B \times d$ in forward and one in backward (for the gradient of the
# pair's input), and nothing between the two layers. Activation memory: the wide hidden
# activation ($B \times 4d$) is sharded, cut by $K$; the pair's input and output
# ($B \times d$) are replicated on every device, not cut. The cell runs the pair on $K = 4$
# simulated devices in numpy, checks it against the unsharded MLP, and counts what each device
# sends and keeps, beside a variant that all-gathers after each column-parallel layer.

# %%
K_tp, B_tp, d_tp = 4, 8, 16
rng_tp = np.random.default_rng(0)
x_tp = rng_tp.standard_normal((B_tp, d_tp))
W1_tp, W2_tp = rng_tp.standard_normal((d_tp, 4 * d_tp)), rng_tp.standard_normal((4 * d_tp, d_tp))
full = np.maximum(x_tp @ W1_tp, 0) @ W2_tp
cols = np.split(np.arange(4 * d_tp), K_tp)  # device k's slice of the hidden features
hidden_shards = [np.maximum(x_tp @ W1_tp[:, c], 0) for c in cols]  # column-parallel, no comm
partial_sums = [h @ W2_tp[c, :] for h, c in zip(hidden_shards, cols)]  # row-parallel
megatron = sum(partial_sums)  # the all-reduce
print(f"column- then row-parallel on {K_tp} devices equals the unsharded MLP: "
      f"{np.allclose(megatron, full)}")
assert np.allclose(megatron, full) and not np.allclose(partial_sums[0], full)
# numbers each device sends in forward: a ring all-reduce of B x d; an all-gather of B x m
sent = {"Megatron pair (one all-reduce of B x d)": 2 * (K_tp - 1) / K_tp * B_tp * d_tp,
        "column-parallel twice (all-gather B x 4d, then B x d)":
            (K_tp - 1) / K_tp * B_tp * (4 * d_tp + d_tp)}
kept = {"unsharded": B_tp * d_tp + B_tp * 4 * d_tp + B_tp * d_tp,
        "Megatron pair, per device": B_tp * d_tp + B_tp * 4 * d_tp // K_tp + B_tp * d_tp}
for what, count in {**sent, **kept}.items():
    print(f"{what:55s} {count:6.0f} numbers {'sent' if what in sent else 'kept'}")

# %% [markdown]
# Tensor parallelism communicates in every layer, in the critical path of both passes, so it
# is used across the fast links inside a node (typically 8 devices).
#
# **Pipeline parallelism** places consecutive layers on different devices (stages) and passes
# activations from one stage to the next ($B \cdot d$ per boundary). To keep the stages busy the
# batch is cut into $M$ micro-batches; with GPipe's schedule (all forwards, then all backwards)
# each stage idles while the first micro-batch travels to it and the last one travels back, a
# "bubble" fraction of $(K-1)/(M+K-1)$ of the step. The cell below simulates that schedule
# stage by stage (one time unit per forward or backward of a micro-batch on a stage) and
# compares the idle fraction with the formula.

# %%
def gpipe_idle_fraction(K, M):
    """Fraction of stage-time idle in a simulated GPipe step: K stages, M micro-batches."""
    free = [0] * K  # when each stage finishes its previous task
    done = {}
    for m in range(M):  # forward of micro-batch m: stage s after stage s - 1
        for s in range(K):
            done["F", s, m] = free[s] = max(free[s], done.get(("F", s - 1, m), 0)) + 1
    for m in range(M):  # backward: the last stage after its forward, stage s after s + 1
        for s in reversed(range(K)):
            ready = done["F", s, m] if s == K - 1 else done["B", s + 1, m]
            done["B", s, m] = free[s] = max(free[s], ready) + 1
    makespan = max(free)
    return 1 - 2 * M / makespan  # each stage is busy 2M units of the makespan


for K, M in ((8, 1), (8, 4), (8, 32), (4, 16)):
    sim, formula = gpipe_idle_fraction(K, M), (K - 1) / (M + K - 1)
    print(f"{K} stages, {M:2d} micro-batches: idle {sim:.1%} simulated, {formula:.1%} by the "
          f"formula")
    assert abs(sim - formula) < 1e-12

# %% [markdown]
# More micro-batches shrink the bubble, at the price of smaller matrix products per stage.
# The **1F1B** schedule (one forward, one backward: each stage starts a micro-batch's backward
# as soon as it can) keeps GPipe's bubble but holds at most $K$ micro-batches' activations at
# once instead of $M$; its **interleaved** variant gives each device $v$ non-consecutive
# chunks of layers (virtual stages) and so also divides the bubble by $v$, at the price of $v$
# times as many activation transfers between devices. In practice the three are combined
# ("3D parallelism"): tensor parallelism inside a node, pipeline stages across a few nodes, data
# parallelism (with ZeRO) over the rest.

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
