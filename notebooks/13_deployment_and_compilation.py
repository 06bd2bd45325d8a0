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
# # 13 · Deployment and machine-learning compilation: ONNX, onnxruntime, Apache TVM
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/needle-companion/needle-companion/blob/main/notebooks/13_deployment_and_compilation.ipynb)
#
# **Lecture:** 23, "Model Deployment", and 24, "Machine Learning Compilation and Deployment
# Implementation" (the course's TVM lecture: tensor programs, schedule transformations, build
# and run)
#
# **Homework:** none (the course has no homework for these lectures)
#
# **Prerequisites:** notebook 04 (training an MLP-ResNet), notebook 06 (tiling, vectorization,
# parallel loops), notebook 07 (convolutions)
#
# **You will be able to:** export a trained needle model to ONNX and check it; run it in
# onnxruntime and compare latency with needle at batch 1 and 64; quantize its weights to 8 bits
# and measure what that changes; read TVM's loop-level IR;
# transform a schedule with split, reorder, vectorize and parallel and measure each step;
# compile an ONNX model with TVM, read its graph before and after operator fusion, fuse loops
# with `reverse_compute_at`, and check and time it against onnxruntime; capture a needle
# training step with `ndl.compile`, read its kernel list and memory plan, and see when it
# re-traces
#
# **Run time:** about 100 s on a busy 2-core x86-64 machine (21 TVM compilations included)
# **Student mode:** with `NEEDLE_IMPL=path/to/hwN/python` (your own needle), the cells marked
# companion-only are skipped: the ONNX export of section 2 and everything that runs the exported
# models (onnxruntime latency, TVM in section 5) use `needle.export`, which the course's needle
# does not have. Training, TVM's schedules and the exercises run on your needle.
#
# Training needs a framework; *running* a trained model does not. Deployment turns the model into
# a description that other engines can execute: a graph of standard operators (ONNX) that a
# runtime (onnxruntime) executes with its own kernels, or that a compiler (TVM) turns into machine
# code specialised for the model's shapes and the target CPU.

# %% tags=["remove-cell"] cellView="form" jupyter={"source_hidden": true}
#@title Colab set-up: in Colab this installs needle (2-3 minutes); elsewhere it does nothing
import os, shlex, subprocess, sys, tempfile; repo = os.environ.get("NEEDLE_COLAB_REPO", "https://github.com/needle-companion/needle-companion")
if "google.colab" in sys.modules or os.environ.get("NEEDLE_COLAB_SIMULATE") == "1":  # companion/colab_setup.py
    py, src, q = sys.executable, os.path.join(tempfile.gettempdir(), "needle-companion"), shlex.quote
    done = subprocess.run(f"{q(py)} -m companion.colab_setup --status --lectures 2>/dev/null || {{ {{ test -d {q(src)} || git clone -q --depth=1 {q(repo)} {q(src)}; }} && cd {q(src)} && {q(py)} -m companion.colab_setup --install {q(repo)} --cwd {q(os.getcwd())} --lectures; }}", shell=True, capture_output=True, text=True); print(done.stdout + done.stderr[-3000:], end=""); assert done.returncode == 0, f"the set-up could not install this project from {repo} (what failed is above)"

# %%
from companion import lecture

# The lecture is ONNX and TVM throughout: where the lectures extra has no wheel, say so here.
lecture.require_modules("onnx", "onnxruntime", "tvm", what="This lecture")

import re
import tempfile

import matplotlib.pyplot as plt
import numpy as np
import onnx
import onnxruntime as ort
import tvm
from sklearn.datasets import load_digits
from tvm import relax, te
from tvm.relax.backend.cpu_generic.pipeline import dataflow_lower_passes, finalize_passes
from tvm.relax.frontend.onnx import from_onnx
from tvm.target import codegen

import needle as ndl
import needle.nn as nn
from companion.apps.mlp_resnet import MLPResNet
from companion.machine import machine_line
from companion.timing import measure
from companion.viz import save_figure

np.set_printoptions(precision=4, suppress=True)
np.random.seed(0)
lecture.setup()  # with NEEDLE_IMPL: cells marked "# companion-only" print a skip line
device = ndl.cpu()
print(f"onnx {onnx.__version__}, onnxruntime {ort.__version__}, tvm {tvm.__version__}")

# %% [markdown]
# ## 1. Two trained needle models
#
# An MLP-ResNet (hw2's model) on the 64 pixels of scikit-learn's 8 × 8 digits, and a small
# convolutional net on the same digits as 1 × 8 × 8 images. A few epochs of Adam each.

# %% tags=["nbval-ignore-output"]
digits = load_digits()
X = (digits.data / 16.0).astype(np.float32)
y = digits.target
perm = np.random.permutation(len(X))
train, test = perm[:1400], perm[1400:]


def fit(model, inputs, epochs, lr=0.01, batch=64):
    """Train ``model`` on inputs[train] with Adam and SoftmaxLoss; returns it in eval mode."""
    opt = ndl.optim.Adam(model.parameters(), lr=lr)
    loss_fn = nn.SoftmaxLoss()
    model.train()
    for _ in range(epochs):
        order = np.random.permutation(train)
        for s in range(0, len(order) - batch + 1, batch):
            idx = order[s:s + batch]
            opt.reset_grad()
            loss = loss_fn(model(ndl.Tensor(inputs[idx], device=device, requires_grad=False)),
                           ndl.Tensor(y[idx].astype(np.float32), device=device,
                                      requires_grad=False))
            loss.backward()
            opt.step()
    model.eval()  # the course's eval() returns None: return the model itself
    return model


def accuracy(logits):
    return float((logits.argmax(axis=1) == y[test]).mean())


images = X.reshape(-1, 1, 8, 8)
mlp = fit(MLPResNet(64, hidden_dim=64, num_blocks=2, num_classes=10), X, 5)
cnn = fit(nn.Sequential(nn.Conv(1, 8, 3, device=device), nn.BatchNorm2d(8, device=device),
                        nn.ReLU(), nn.Conv(8, 16, 3, stride=2, device=device), nn.ReLU(),
                        nn.Flatten(), nn.Linear(16 * 4 * 4, 10, device=device)), images, 4)
models = {"MLP-ResNet": (mlp, X), "conv net": (cnn, images)}
needle_out = {name: m(ndl.Tensor(inp[test], device=device)).numpy()
              for name, (m, inp) in models.items()}
for name, out in needle_out.items():
    print(f"{name}: test accuracy {accuracy(out):.3f}")
assert all(accuracy(out) > 0.85 for out in needle_out.values())

# %% [markdown]
# ## 2. Export to ONNX and run in onnxruntime
#
# `needle.export.to_onnx` runs the model once on an example batch, walks the recorded graph and
# writes one ONNX operator per needle op (`MatMul`, `Add`, `Relu`, `Expand` for a broadcast,
# `Conv` between two `Transpose`s because needle's convolution is NHWC and ONNX's is NCHW, ...).
# Parameters become initializers, and so does every sub-graph that does not depend on the input:
# needle has already computed it, so the exporter writes its value. That is **constant
# folding**, here of BatchNorm's $-$mean and $\sqrt{\text{running var} + \epsilon}$. But needle
# computed those sub-graphs when the model ran, *after* broadcasting the running statistics to
# the batch's shape (`BatchNorm1d` broadcasts them with `broadcast_to(x.shape)` before it
# subtracts and divides), so the exporter stores them batch-sized, not as one vector per
# feature: the cell prints their shapes, and how the initializers grow from batch 1 to batch
# 64. An exporter that folded before the broadcast would store the vectors and an `Expand`. The
# normalisation itself, $(x - \text{mean}) / \sqrt{\cdot} \cdot \gamma + \beta$, still runs as
# nodes on every input (an `Add` of the folded $-$mean, `Div`, `Mul`, `Add`, with `Expand`s
# broadcasting $\gamma$ and $\beta$). **Folding BatchNorm into the layer before it**
# (exercise 13.1: scale the convolution's or Linear's weights and shift its bias, so the nodes
# disappear) is a different, algebraic rewrite that this exporter does not do. The result passes
# the ONNX checker.
#
# **Shapes are static here because of needle's exporter, not ONNX.** ONNX allows symbolic
# dimensions (a `dim_param` such as `"batch"` instead of a number; `torch.onnx.export` writes
# them with `dynamic_axes`). `to_onnx` records the shapes of the one example batch it traced,
# including the target shapes of `Reshape` and `Expand`, so it writes one file per batch size.
# The cell prints where the batch size is baked in.

# %%
# companion-only: needle.export.to_onnx (ONNX export)
from needle.export import to_onnx

exported = {(name, b): to_onnx(m, inp[test][:b]) for name, (m, inp) in models.items()
            for b in (1, 64)}
for (name, b), proto in exported.items():
    onnx.checker.check_model(proto, full_check=True)
    ops_used = sorted({node.op_type for node in proto.graph.node})
    print(f"{name}, batch {b}: {len(proto.graph.node)} nodes, "
          f"{len(proto.graph.initializer)} initializers; operators {ops_used}")
proto = exported[("conv net", 64)]
input_dims = [d.dim_value or d.dim_param for d in proto.graph.input[0].type.tensor_type.shape.dim]
inits = {t.name: onnx.numpy_helper.to_array(t) for t in proto.graph.initializer}
baked = [(node.op_type, inits[node.input[1]].tolist()) for node in proto.graph.node
         if node.op_type in ("Reshape", "Expand") and inits[node.input[1]][0] == 64]
print(f"conv net, batch 64: input dims {input_dims}; shape constants holding the batch: "
      f"{baked[:3]} ...")
print("conv net's operators in order:", " ".join(n.op_type for n in proto.graph.node))
assert input_dims[0] == 64 and baked


def initializer_bytes(proto):
    return sum(onnx.numpy_helper.to_array(t).nbytes for t in proto.graph.initializer)


def batchnorm_constants(proto):
    """Shapes of the initializers BatchNorm reads: the Add of -mean and the Div's divisor."""
    inits = {t.name: tuple(t.dims) for t in proto.graph.initializer}
    producer = {out: node for node in proto.graph.node for out in node.output}
    return [(inits[producer[div.input[0]].input[1]], inits[div.input[1]])
            for div in proto.graph.node if div.op_type == "Div"]


for b in (1, 64):
    print(f"MLP-ResNet, batch {b}: BatchNorm's folded (-mean, sqrt(var + eps)) have shapes "
          f"{batchnorm_constants(exported[('MLP-ResNet', b)])}; initializers "
          f"{initializer_bytes(exported[('MLP-ResNet', b)]):,} bytes")
assert all(shape[0] == 64 for pair in batchnorm_constants(exported[("MLP-ResNet", 64)])
           for shape in pair)

sessions = {key: ort.InferenceSession(proto.SerializeToString(),
                                      providers=["CPUExecutionProvider"])
            for key, proto in exported.items()}
for name, (m, inp) in models.items():
    session = sessions[(name, 64)]
    ort_out = np.concatenate([session.run(None, {"input": inp[test][s:s + 64]})[0]
                              for s in range(0, 384, 64)])
    want = needle_out[name][:384]
    rel = float(np.abs(ort_out - want).max() / np.abs(want).max())
    single = sessions[(name, 1)].run(None, {"input": inp[test][:1]})[0]
    rel1 = float(np.abs(single - want[:1]).max() / np.abs(want[:1]).max())
    print(f"{name}: onnxruntime vs needle, largest relative difference below 1e-5: "
          f"{max(rel, rel1) <= 1e-5}; "
          f"same predictions: {bool((ort_out.argmax(1) == want.argmax(1)).all())}")
    assert rel <= 1e-5 and rel1 <= 1e-5

# %% [markdown]
# Latency: one forward pass, median of repeated runs, at batch 1 (a request served alone) and
# batch 64 (batched serving). The numbers depend on the machine and its load.

# %% tags=["nbval-ignore-output"]
# companion-only: the onnxruntime sessions of the exported models (needle.export)
print(machine_line())
print(f"{'model':12s} {'batch':>5s} {'needle ms':>10s} {'onnxruntime ms':>15s} "
      f"{'needle/onnxruntime':>19s}")
latency = {}
for name, (m, inp) in models.items():
    for b in (1, 64):
        x = inp[test][:b]
        t_needle = measure(lambda: m(ndl.Tensor(x, device=device)).numpy(), repeats=30)
        t_ort = measure(lambda: sessions[(name, b)].run(None, {"input": x}), repeats=30)
        latency[(name, b)] = {"needle": t_needle, "onnxruntime": t_ort}
        print(f"{name:12s} {b:5d} {t_needle * 1e3:10.3f} {t_ort * 1e3:15.3f} "
              f"{t_needle / t_ort:18.1f}x")
for name in models:
    r1, r64 = (latency[(name, b)]["onnxruntime"] / latency[(name, b)]["needle"] for b in (1, 64))
    trend = ("narrows" if r64 > 1.25 * r1 else "widens" if r64 < 0.8 * r1
             else "stays about the same (within 25 %)")
    print(f"{name}: onnxruntime takes {r1:.2f}x needle's time at batch 1 and {r64:.2f}x at "
          f"batch 64: the gap {trend} as the arithmetic grows"
          + ("; at batch 64 needle is the faster one" if r64 > 1 else ""))

# %% [markdown]
# At batch 1 the work is small: 12,928 multiply-adds for the MLP-ResNet (a 64 × 64 `Linear`,
# two blocks of 64 × 32 and 32 × 64, a 64 × 10 head) and 25,600 for the conv net (4,608 in the
# first convolution, 18,432 in the second, 2,560 in the head), so the time is per-operator
# overhead:
# needle creates a Python `Tensor` and a graph node per op, while onnxruntime runs a
# pre-planned graph from C++. At batch 64 each operator does 64 times the arithmetic, so the
# fixed overhead weighs less (the last lines above say what this run measured). Deployment
# engines win first by removing the framework, then by fusing operators and planning memory
# ahead.
#
# **Quantization.** Deployment also fits the model to its hardware target in size. *Dynamic
# quantization* stores each weight matrix as 8-bit integers with one float scale and zero
# point (a quarter of float32's bytes); at run time it quantizes each layer's input to 8 bits
# as well (`DynamicQuantizeLinear`), multiplies in integers (`MatMulInteger`, `ConvInteger`)
# and scales the result back to float. onnxruntime's `quantize_dynamic` rewrites an ONNX file
# this way; the course's deployment notebook ends with the same idea at scale, a Llama model
# served in 4 bits by MLC-LLM. The cell quantizes both exported models (batch 64) and measures
# what changed: the initializers' bytes, the test accuracy, how many predictions agree with the
# float model's, and the latency of the two files in the same runtime, both timed in this
# cell. What does not shrink is telling: BatchNorm's batch-sized constants stay float32.

# %% tags=["nbval-ignore-output"]
# companion-only: the exported ONNX models (needle.export) and onnxruntime's quantizer
import logging

from onnxruntime.quantization import QuantType, quantize_dynamic

print(machine_line())
logging.getLogger().setLevel(logging.ERROR)  # the quantizer's advice to pre-process the model
quantized = {}
with tempfile.TemporaryDirectory() as tmp:
    for i, name in enumerate(models):
        onnx.save(exported[(name, 64)], f"{tmp}/{i}.onnx")
        quantize_dynamic(f"{tmp}/{i}.onnx", f"{tmp}/{i}.int8.onnx", weight_type=QuantType.QInt8)
        quantized[name] = onnx.load(f"{tmp}/{i}.int8.onnx")
for name, (m, inp) in models.items():
    q_session = ort.InferenceSession(quantized[name].SerializeToString(),
                                     providers=["CPUExecutionProvider"])
    q_out = np.concatenate([q_session.run(None, {"input": inp[test][s:s + 64]})[0]
                            for s in range(0, 384, 64)])
    f_out = needle_out[name][:384]
    acc_q, acc_f = ((out.argmax(1) == y[test][:384]).mean() for out in (q_out, f_out))
    agree = (q_out.argmax(1) == f_out.argmax(1)).mean()
    x = inp[test][:64]
    t_f, t_q = (measure(lambda: sess.run(None, {"input": x}), repeats=30)
                for sess in (sessions[(name, 64)], q_session))
    bytes_f, bytes_q = initializer_bytes(exported[(name, 64)]), initializer_bytes(quantized[name])
    ops = sorted({n.op_type for n in quantized[name].graph.node} - {n.op_type for n in
                                                                    exported[(name, 64)].graph.node})
    print(f"{name}, int8 weights: new operators {ops}; initializers {bytes_f:,} -> {bytes_q:,} "
          f"bytes ({bytes_q / bytes_f:.2f}x); test accuracy {acc_f:.3f} -> {acc_q:.3f}, "
          f"{agree:.1%} of predictions unchanged; latency at batch 64 {t_f * 1e3:.3f} -> "
          f"{t_q * 1e3:.3f} ms ({t_q / t_f:.2f}x, "
          + ("faster" if t_q < 0.9 * t_f else "slower" if t_q > 1.1 * t_f else "about the same")
          + ")")

# %% [markdown]
# On models this small the weights are not what fills the file (the first line's bytes include
# the batch-sized BatchNorm constants) and the integer kernels do not necessarily pay: quantizing
# each input on the fly and rescaling each output costs time that only large matrix products
# earn back, and the last number on each line says how it came out here. The accuracy and the
# agreement show the other side of the trade, the rounding the model absorbs. Production
# pipelines also quantize activations statically (with scales calibrated on sample data) and
# fold BatchNorm first (exercise 13.1), so that nothing batch-sized is stored.
#
# ## 3. Machine-learning compilation with TVM: a vector add
#
# TVM describes a computation as a *tensor program*: loops over buffers. `te.compute` declares
# what each output element is; `te.create_prim_func` makes the loop nest (TensorIR). The printed
# IR is one loop with one block that computes `C[i] = A[i] + B[i]`.

# %% tags=["nbval-ignore-output"]
TARGET = tvm.target.Target({"kind": "llvm", "mcpu": codegen.llvm_get_system_cpu()})
dev = tvm.cpu()
n = 1 << 20
A = te.placeholder((n,), name="A")
B = te.placeholder((n,), name="B")
C = te.compute((n,), lambda i: A[i] + B[i], name="C")
vadd = tvm.IRModule({"main": te.create_prim_func([A, B, C])})
print(f"target: {TARGET}")
print(vadd.script())

# %% [markdown]
# A **schedule** rewrites the loops without changing what is computed: `split` cuts the loop into
# an outer and an inner loop, `vectorize` turns the inner loop into SIMD instructions, `parallel`
# spreads the outer loop over threads. The IR after the three transformations:

# %% tags=["nbval-ignore-output"]
sch = tvm.s_tir.Schedule(vadd)
(i,) = sch.get_loops(sch.get_sblock("C"))
i_outer, i_inner = sch.split(i, factors=[None, 64])
sch.parallel(i_outer)
sch.vectorize(i_inner)
print(sch.mod.script())

# %%
a_np, b_np = np.random.rand(n).astype(np.float32), np.random.rand(n).astype(np.float32)
a, b = tvm.runtime.tensor(a_np, dev), tvm.runtime.tensor(b_np, dev)
c = tvm.runtime.empty((n,), "float32", dev)
vadd_fns = {"plain loop": tvm.compile(vadd, target=TARGET),
            "split + parallel + vectorize": tvm.compile(sch.mod, target=TARGET)}
for name, fn in vadd_fns.items():
    fn(a, b, c)
    assert np.array_equal(c.numpy(), a_np + b_np), name
print("both vector adds equal numpy's a + b exactly")

# %% [markdown]
# On a GPU the same `split` maps the loop onto the hardware's two levels of parallelism:
# `bind` makes the outer loop the grid of thread blocks and the inner one the threads of a
# block, so the loop nest becomes one kernel launch of $2^{20} / 256 = 4096$ blocks of 256
# threads. The IR below is that schedule; compiling it needs a CUDA target
# (`tvm.compile(gpu.mod, target="cuda")`), which this notebook does not assume.

# %% tags=["nbval-ignore-output"]
gpu = tvm.s_tir.Schedule(vadd)
(i,) = gpu.get_loops(gpu.get_sblock("C"))
i_block, i_thread = gpu.split(i, factors=[None, 256])
gpu.bind(i_block, "blockIdx.x")
gpu.bind(i_thread, "threadIdx.x")
print(gpu.mod.script())

# %% tags=["nbval-ignore-output"]
print(machine_line())
vadd_gbs = {name: 3 * 4 * n / measure(lambda: fn(a, b, c), repeats=50) / 1e9
            for name, fn in vadd_fns.items()}
vadd_gbs["numpy"] = 3 * 4 * n / measure(lambda: np.add(a_np, b_np), repeats=50) / 1e9
for name, gbs in vadd_gbs.items():
    print(f"{name:30s} {gbs:6.1f} GB/s")
ratio = vadd_gbs["split + parallel + vectorize"] / vadd_gbs["plain loop"]
print(f"split + parallel + vectorize: {ratio:.2f}x the plain loop's bytes per second "
      + ("(the second thread helped)" if ratio > 1.25 else "(no clear gain)"))

# %% [markdown]
# A vector add does one addition per 12 bytes moved: its speed is the speed at which the memory
# system delivers bytes, not arithmetic. Vectorizing cannot change that (LLVM auto-vectorizes
# the plain loop on its own where the CPU has SIMD, and the loop waits for data either way); a
# second thread can, when the second core is idle, because each core brings its own path to the
# caches (the three arrays, 12 MiB together, may sit in a large L3). The last line says what
# this run measured. Matrix multiplication is where schedules change the arithmetic itself.
#
# ## 4. A 1024³ matmul, scheduled step by step
#
# $C_{ij} = \sum_k A_{ik} B_{kj}$ with a reduction axis `k`. The ladder:
#
# 1. **naive** loop order $i, j, k$: the inner loop walks down a column of $B$, a new cache line
#    every step;
# 2. **reorder** to $i, k, j$: the inner loop walks along rows of $B$ and $C$ (unit stride);
# 3. **tile**: split $i, j, k$ into 32 × 64 × 64 blocks so that a block of $B$ stays in cache
#    while it is reused (notebook 06's blocking);
# 4. **vectorize** the inner $j$ loop of 64 (SIMD registers), with the zero-initialisation moved
#    out of the reduction (`decompose_reduction`);
# 5. **parallel** over the outer $i$ blocks (two cores);
# 6. **register tile**, a second path from the reordered loops: tiling for the *registers*
#    instead of the caches. Each 8 × 32 tile of $C$ is summed in a local buffer
#    (`cache_write`, then `reverse_compute_at` to write it back once per tile) over the whole
#    $k$ loop; its 32 columns are vectorized (two 16-float AVX-512 registers per row) and its 8
#    rows unrolled, so its 16 vectors of accumulators can live in registers (AVX-512 has 32),
#    and each row segment of $B$ loaded for one $k$ serves 8 rows of $A$;
# 7. **parallel** again, over the register tiles' rows.
#
# The naive version is slow enough that it is timed on the first 64 rows of $C$ only (the same
# loops, 1/16 of the work; GFLOP/s is per-flop speed, so it compares; the timing cell prints
# what the whole product would take).

# %%
N_MM = 1024


def matmul_module(rows):
    """TensorIR of C (rows, N_MM) = A (rows, N_MM) @ B (N_MM, N_MM), loops i, j, k."""
    A = te.placeholder((rows, N_MM), name="A")
    B = te.placeholder((N_MM, N_MM), name="B")
    k = te.reduce_axis((0, N_MM), name="k")
    C = te.compute((rows, N_MM), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    return tvm.IRModule({"main": te.create_prim_func([A, B, C])})


def schedule(step, rows=N_MM):
    """The matmul after the first ``step`` transformations of the ladder (0 = naive)."""
    sch = tvm.s_tir.Schedule(matmul_module(rows))
    block = sch.get_sblock("C")
    i, j, k = sch.get_loops(block)
    if step >= 1:
        sch.reorder(i, k, j)
    if step >= 2:
        i0, i1 = sch.split(i, [None, 32])
        j0, j1 = sch.split(j, [None, 64])
        k0, k1 = sch.split(k, [None, 64])
        sch.reorder(i0, j0, k0, i1, k1, j1)
    if step >= 3:
        sch.vectorize(j1)
    if step >= 4:
        sch.parallel(i0)
    if step >= 3:
        sch.decompose_reduction(block, k0)
    return sch.mod


def register_tiled(rows, parallel):
    """The matmul with each 8 x 32 tile of C summed in a local buffer over the whole k loop
    (cache_write: LLVM keeps it in vector registers), its 32 columns vectorized, its 8 rows
    unrolled; then written back to C once. ``parallel``: row tiles over the cores."""
    sch = tvm.s_tir.Schedule(matmul_module(rows))
    block = sch.get_sblock("C")
    i, j, k = sch.get_loops(block)
    i0, i1 = sch.split(i, [None, 8])
    j0, j1 = sch.split(j, [None, 32])
    sch.reorder(i0, j0, k, i1, j1)
    sch.reverse_compute_at(sch.cache_write(block, 0, "local"), j0)
    sch.unroll(i1)
    sch.vectorize(j1)
    if parallel:
        sch.parallel(i0)
    sch.decompose_reduction(block, k)
    return sch.mod


STEPS = ["naive (i, j, k)", "reorder (i, k, j)", "tile 32x64x64", "+ vectorize", "+ parallel",
         "register tile 8x32", "register + parallel"]
BASE = {after: before for before, after in zip(STEPS, STEPS[1:])}  # what each rung changes
BASE["register tile 8x32"] = "reorder (i, k, j)"  # the second path starts from reorder
A_np = np.random.standard_normal((N_MM, N_MM)).astype(np.float32)
B_np = np.random.standard_normal((N_MM, N_MM)).astype(np.float32)
C_ref = A_np.astype(np.float64) @ B_np.astype(np.float64)
B_tvm = tvm.runtime.tensor(B_np, dev)
compiled = {}
for step, name in enumerate(STEPS):
    rows = 64 if step == 0 else N_MM
    mod = schedule(step, rows) if step < 5 else register_tiled(rows, parallel=step == 6)
    fn = tvm.compile(mod, target=TARGET)
    A_tvm = tvm.runtime.tensor(A_np[:rows], dev)
    C_tvm = tvm.runtime.empty((rows, N_MM), "float32", dev)
    fn(A_tvm, B_tvm, C_tvm)
    err = float(np.abs(C_tvm.numpy() - C_ref[:rows]).max() / np.abs(C_ref).max())
    print(f"{name:20s} rows {rows:4d}: relative error vs float64 below 1e-5: {err < 1e-5}")
    assert err < 1e-5
    compiled[name] = (fn, A_tvm, C_tvm, rows)

# %% [markdown]
# All five are the same product to float32 rounding. What machine code did LLVM make of each?
# Counting the fused multiply-add instructions in the generated assembly tells whether a loop
# became SIMD code (`ps`, packed: 4, 8 or 16 floats per instruction in `xmm`, `ymm`, `zmm`
# registers) or stayed scalar (`ss`); the count is of instructions in the code, not of their
# executions. (The counts depend on the CPU that compiles: `zmm` registers exist only on CPUs
# with AVX-512, so this output is not compared by the tests.)

# %% tags=["nbval-ignore-output"]
def fma_instructions(fn):
    """{'packed (zmm)': n, ...}: fused multiply-add instructions in fn's assembly, by kind."""
    asm = fn.mod.inspect_source("asm")
    found = re.findall(r"\bvfmadd\d*(ps|ss)\s[^\n]*%(xmm|ymm|zmm)", asm)
    return {f"{'packed' if kind == 'ps' else 'scalar'} ({reg})": found.count((kind, reg))
            for kind, reg in sorted(set(found))}


simd = {name: fma_instructions(fn) for name, (fn, *_) in compiled.items()}
for name, counts in simd.items():
    print(f"{name:20s} {counts}")
scalar_naive = all(k.startswith("scalar") for k in simd[STEPS[0]])
packed_reorder = any(k.startswith("packed") for k in simd[STEPS[1]])
print(f"naive loop scalar only: {scalar_naive}; reordered loop already packed SIMD: "
      f"{packed_reorder}")

# %% [markdown]
# Their speed (median of three runs), with needle's own engine and numpy (OpenBLAS) on the same
# 1024³ product, and the figure drawn from the same numbers. The lines after the table say, for
# each rung, whether it helped in this run: timings move with the machine's load, so the words
# are computed from the figures, not written in advance.

# %% tags=["nbval-ignore-output"]
print(machine_line())


def gflops(fn, rows, repeats=3):
    best = measure(fn, repeats=repeats, warmup=1, min_sample_s=0.0)
    return 2 * rows * N_MM * N_MM / best / 1e9


ladder = {name: gflops(lambda: fn(A_t, B_tvm, C_t), rows)
          for name, (fn, A_t, C_t, rows) in compiled.items()}
A_nd = ndl.Tensor(A_np, device=device, requires_grad=False)
B_nd = ndl.Tensor(B_np, device=device, requires_grad=False)
ladder["needle engine"] = gflops(lambda: (A_nd @ B_nd).realize_cached_data(), N_MM)
ladder["numpy"] = gflops(lambda: A_np @ B_np, N_MM)
for name, g in ladder.items():
    print(f"{name:20s} {g:7.1f} GFLOP/s")
print(f"the naive loops would take {2 * N_MM**3 / ladder[STEPS[0]] / 1e9:.1f} s for the whole "
      f"product")
for after, before in BASE.items():
    ratio = ladder[after] / ladder[before]
    verdict = ("faster than" if ratio > 1.1 else "slower than" if ratio < 1 / 1.1
               else "about the same (within 10 %) as")
    print(f"{after:20s} {verdict} {before}: {ladder[after]:.1f} vs {ladder[before]:.1f} "
          f"GFLOP/s ({ratio:.2f}x)")
best_rung = max(STEPS, key=ladder.get)
print(f"fastest rung: {best_rung}, {ladder[best_rung] / ladder[STEPS[0]]:.0f}x the naive loops; "
      f"needle's engine {ladder['needle engine'] / ladder[best_rung]:.1f}x and numpy "
      f"{ladder['numpy'] / ladder[best_rung]:.1f}x the fastest rung")

fig, ax = plt.subplots(figsize=(8, 3.4))
names = list(ladder)
colors = ["tab:blue"] * len(STEPS) + ["tab:orange", "tab:green"]
bars = ax.barh(names[::-1], [ladder[k] for k in names[::-1]], color=colors[::-1])
ax.bar_label(bars, fmt="%.1f", fontsize=8, padding=2)
ax.set_xscale("log")
ax.set_xlabel("GFLOP/s (log scale), 1024³ float32 matmul, measured")
ax.set_title("TVM schedule ladder beside needle's engine and numpy (one run)")
save_figure(fig, "tvm_matmul_ladder")

# %% [markdown]
# How to read the rungs (the lines above say which of these happened in this run):
#
# * **reorder** is the big step: the naive inner loop strides down a column of $B$ (a new
#   cache line per multiply-add, scalar instructions), the reordered one walks a row of $B$
#   and of $C$ with unit stride, which LLVM's auto-vectorizer turns into packed FMAs on its own
#   (the assembly counts above). Several rungs are therefore already "vectorized" before the
#   explicit `vectorize`.
# * **tile** can come out *slower* than reorder. Its inner loop has 64 iterations instead of
#   1024, so LLVM unrolls and pipelines it less and the loop overhead grows, while the reordered
#   loop's working set (one 4 KiB row of $C$, rows of $B$ streamed from L2 and L3) already suits
#   this CPU's caches. Tile sizes are a tuning knob: a 32 × 64 × 64 block of $A$, $B$ and $C$ is
#   32 KiB, which fits a typical 32-48 KiB L1 data cache, but tiles pay their overhead for
#   nothing when the data did not miss in the first place.
# * **vectorize** changes little when LLVM had vectorized the loop already; it matters where
#   the auto-vectorizer gives up (non-unit strides, unknown extents).
# * **parallel** needs idle cores: on a shared 2-core machine the two threads wait for each
#   other and the rung can come out no faster, or slower, than the single-thread one.
# * **register tile** is the tiling that modern CPUs reward (compare it with reorder, its
#   base, in the lines above). The reordered loop loads and stores a vector of $C$ for every
#   multiply-add; the register tile can keep its 16 vectors of $C$ in registers for all 1024
#   values of $k$, so each multiply-add costs one load of $B$ shared by 8 rows. Cache tiling
#   (rungs 3-5) reduces misses; register tiling reduces the loads and stores themselves, which
#   is what a loop that already streams from cache is limited by.
#
# What separates the best rung from needle's engine (the last line of the timing cell) is the
# rest of notebook 06's ladder, which its C++ kernel does by hand: packing blocks of $A$ and
# $B$ into contiguous panels, a register tile sized for this CPU inside cache tiles, and
# threads. needle's engine and numpy's OpenBLAS both run on every core, like the two
# "parallel" rungs, so on a busy machine those lose the most, while the other rungs run on one
# core. Searching over tile
# sizes and loop orders automatically is what TVM's MetaSchedule does; it is not run here
# because it takes minutes per kernel.
#
# ## 5. The exported model compiled by TVM
#
# TVM's Relax front end reads the ONNX file into a graph of high-level operators (`R.matmul`,
# `R.add`, `R.nn.relu`, ...). `LegalizeOps` lowers each to a TensorIR loop nest like the ones above,
# one `call_tir` per operator. Then the compiler's graph-level work: `AnnotateTIROpPattern` labels
# each loop nest (element-wise, broadcast, injective, reduction, "output element-wise fusable" for a
# matmul, ...), `FoldConstant` evaluates what depends only on constants, `FuseOps` groups a
# reduction with the element-wise operators that consume it, and `FuseTIR` merges each group into
# one TensorIR function: one call instead of several, and the intermediate arrays become buffers
# local to that function instead of tensors the graph allocates. These are the passes
# `tvm.compile`'s default CPU pipeline runs; here they are applied one by one to print the graph
# before and after fusion, and one fused kernel. The compiled models must agree with onnxruntime.

# %%
# companion-only: the exported ONNX models and onnxruntime sessions (needle.export)
FUSION = tvm.transform.Sequential([relax.transform.AnnotateTIROpPattern(),
                                   relax.transform.FoldConstant(), relax.transform.FuseOps(),
                                   relax.transform.FuseTIR()])


def relax_module(proto, fuse):
    """The Relax IRModule of ``proto`` after LegalizeOps, and operator fusion if ``fuse``."""
    mod = from_onnx(proto, keep_params_in_input=False)
    mod = relax.transform.DecomposeOpsForInference()(mod)
    mod = relax.transform.LegalizeOps()(mod)
    return FUSION(mod) if fuse else mod


def kernel_calls(mod):
    """main's kernel calls as (result, kernel, arguments, output shape), in order."""
    calls = re.findall(r"(\w+) = R\.call_tir\((?:cls\.)?(\w+), \((.*?),?\), "
                       r"out_ty=R\.Tensor\(\((.*?)\)", mod["main"].script())
    return [(out, kernel, re.sub(r'metadata\["[^"]*"\]\[(\d+)\]', r"const\1", args), shape)
            for out, kernel, args, shape in calls]


def show(calls):
    for out, kernel, args, shape in calls:
        print(f"  {out} = {kernel}({args}) -> ({shape})")


before, after = (kernel_calls(relax_module(exported[("MLP-ResNet", 64)], fuse))
                 for fuse in (False, True))
print(f"MLP-ResNet, batch 64, before fusion: {len(before)} kernel calls")
show(before)
print(f"after FuseOps + FuseTIR: {len(after)} kernel calls")
show(after)
fused = [kernel for _, kernel, _, _ in after]
print("fused kernels:", {k: fused.count(k) for k in dict.fromkeys(fused)})
assert len(after) < len(before) and all(k.startswith("fused_matmul") for k in fused)
fused_mod = relax_module(exported[("MLP-ResNet", 64)], True)
print(f"\nthe kernel {fused[0]}:")
print(fused_mod[fused[0]].script())

# %% [markdown]
# Each fused kernel is a matmul with its element-wise epilogue in one function: the bias `add`,
# BatchNorm's `add`/`divide`/`multiply`/`add` with their folded constants, the residual `add`
# and the `relu`. Inside it, as the printed kernel shows, the loop nests are still separate and
# each writes a whole intermediate buffer (`matmul_intermediate`, `T_add_intermediate`): fusing
# the *loops*, so that each element is consumed as soon as it is produced, is a schedule
# transformation (`compute_inline`, `reverse_compute_at`), which a schedule search
# (MetaSchedule) applies and which exercise 13.3 does by hand. The `broadcast_to` kernels that
# only expanded constants are gone: `FoldConstant` evaluated them at compile time. BatchNorm is
# still computed at run time, inside the kernel; only folding it into the weights (exercise
# 13.1) would remove it.

# %% [markdown]
# Section 4's two ideas, applied to the fused kernels by hand: `schedule_kernels` reorders each
# fused matmul's loops to $i, k, j$ (the "reorder" rung), inlines the element-wise blocks into
# one (`compute_inline`) and computes that one inside the matmul's row loop
# (`reverse_compute_at`), so each kernel keeps one row of the product instead of the whole
# intermediate. It touches only the `fused_matmul` kernels; the conv net's convolutions keep
# their default loops.

# %%
# companion-only: the exported ONNX models (needle.export)
def schedule_kernels(mod):
    """mod with every fused_matmul kernel reordered (i, k, j) and its epilogue fused per row."""
    sch = tvm.s_tir.Schedule(mod)
    for gv in mod.get_global_vars():
        if not gv.name_hint.startswith("fused_matmul"):
            continue
        sch.work_on(gv.name_hint)
        matmul, *epilogue = sch.get_child_blocks(sch.get_sblock("root"))
        i, j, k = sch.get_loops(matmul)
        sch.reorder(i, k, j)
        for block in epilogue[:-1]:
            sch.compute_inline(block)  # each element-wise step into the next one
        sch.reverse_compute_at(epilogue[-1], i)  # the rest of the row, right after its sums
        sch.decompose_reduction(matmul, k)
    return sch.mod


scheduled = schedule_kernels(fused_mod)
print(f"the kernel {fused[2]} after schedule_kernels:")
print(scheduled[fused[2]].script())

# %% [markdown]
# One loop over rows `i0`; inside it the row of the product is summed with unit stride, then
# the whole epilogue (bias, BatchNorm, residual, ReLU) is one expression applied to it. The
# script still declares `matmul_intermediate` as 64 × 64; `tvm.compile`'s buffer planning
# shrinks it to the one row that an iteration of `i0` uses (exercise 13.3's check counts such
# elements). The kernel's arguments show where its constants come from. The `Linear`'s bias
# `param_1` is still a vector of 64, broadcast inside the loop. BatchNorm's $-$mean and
# $\sqrt{\text{var} + \epsilon}$, `param_2` and `param_3`, are 64 × 64 because the exporter
# wrote them batch-sized (section 2). $\gamma$ and $\beta$, `param_4` and `param_5`, are 64 × 64
# because `FoldConstant` evaluated the two `broadcast_to` kernels that expanded them. Each is
# read at every call: folding trades run-time work for constant memory. The compiled models in the
# three forms (unfused, fused, fused and scheduled), checked against onnxruntime at both batch
# sizes:

# %%
# companion-only: the exported ONNX models and onnxruntime sessions (needle.export)
FORMS = ("unfused", "fused", "fused + scheduled")


def compile_onnx(proto, form):
    """A Relax virtual machine running ``proto`` compiled for this CPU in one of FORMS."""
    mod = relax_module(proto, fuse=form != "unfused")
    if form == "fused + scheduled":
        mod = schedule_kernels(mod)
    pipeline = "default" if form != "unfused" else tvm.transform.Sequential(
        dataflow_lower_passes(TARGET) + finalize_passes(TARGET))
    return relax.VirtualMachine(tvm.compile(mod, target=TARGET, relax_pipeline=pipeline), dev)


vms = {(name, b, form): compile_onnx(exported[(name, b)], form)
       for name in models for b in (1, 64) for form in FORMS}
for (name, b, form), vm in vms.items():
    x = models[name][1][test][:b]
    tvm_out = vm["main"](tvm.runtime.tensor(x, dev)).numpy()
    ort_out = sessions[(name, b)].run(None, {"input": x})[0]
    rel = float(np.abs(tvm_out - ort_out).max() / np.abs(ort_out).max())
    print(f"{name}, batch {b:2d}, {form}: TVM vs onnxruntime, largest relative difference "
          f"below 1e-5: {rel <= 1e-5}")
    assert rel <= 1e-5

# %% [markdown]
# Their latency beside section 2's engines (median of repeated runs; it moves with the machine's
# load, so the sentences under the table are computed from it):

# %% tags=["nbval-ignore-output"]
# companion-only: the compiled exported models (needle.export)
print(machine_line())
print(f"{'model':12s} {'batch':>5s} {'needle':>8s} {'onnxruntime':>12s} {'TVM unfused':>12s} "
      f"{'TVM fused':>10s} {'+ scheduled':>12s}   (ms)")
for name, (m, inp) in models.items():
    for b in (1, 64):
        x_tvm = tvm.runtime.tensor(inp[test][:b], dev)
        for form in FORMS:
            fn = vms[(name, b, form)]["main"]
            latency[(name, b)]["TVM " + form] = measure(lambda: fn(x_tvm), repeats=30)
        t = latency[(name, b)]
        print(f"{name:12s} {b:5d} {t['needle'] * 1e3:8.3f} {t['onnxruntime'] * 1e3:12.3f} "
              f"{t['TVM unfused'] * 1e3:12.3f} {t['TVM fused'] * 1e3:10.3f} "
              f"{t['TVM fused + scheduled'] * 1e3:12.3f}")


def compare(t, a, b):
    """'a takes r x b's time (faster / slower / about the same)' for two entries of t."""
    r = t[a] / t[b]
    verdict = "faster" if r < 0.9 else "slower" if r > 1.1 else "about the same"
    return f"{a} takes {r:.2f}x {b}'s time ({verdict})"


for (name, b), t in latency.items():
    print(f"{name}, batch {b}: fastest {min(t, key=t.get)}; "
          f"{compare(t, 'TVM fused', 'TVM unfused')}; "
          f"{compare(t, 'TVM fused + scheduled', 'onnxruntime')}")

# %% [markdown]
# Reading the table: "TVM unfused" and "TVM fused" run the default loop nests that
# `LegalizeOps` writes (for a matmul the naive $i, j, k$ order of section 4, at best
# auto-vectorized by LLVM) against onnxruntime's hand-tuned kernels; fusion alone saves calls
# and allocations, not loop speed. "+ scheduled" adds two schedule transformations per kernel,
# a few lines of code; the last lines of the cell say, for this run, how far that took TVM
# against onnxruntime. A compiler beats a library when its kernels are scheduled for the exact
# shapes: by hand as here, or by a schedule search (MetaSchedule, minutes per kernel, the
# results kept in a database) — and the more arithmetic a kernel does, the more its schedule
# matters.
#
# **TVM 0.27 and the course's notebook.** The course's MLC notebook was written for an older
# TVM (TensorIR's first releases). The names this notebook uses, and the names in the course's
# notebook, are:
#
# | course's notebook (older TVM)   | TVM 0.27 (this notebook)            |
# |---------------------------------|-------------------------------------|
# | `tvm.tir.Schedule(mod)`         | `tvm.s_tir.Schedule(mod)`           |
# | `sch.get_block("C")`            | `sch.get_sblock("C")`               |
# | `T.block("C")` in TVMScript     | `T.sblock("C")`                     |
# | `tvm.build(mod, target="llvm")` | `tvm.compile(mod, target=TARGET)`   |
# | `tvm.nd.array(a)`               | `tvm.runtime.tensor(a, dev)`        |
# | `tvm.nd.empty(shape, dtype)`    | `tvm.runtime.empty(shape, dtype, dev)` |
# | `tvm.tir.max`, `tvm.tir.const`  | `tvm.tirx.max`, `tvm.tirx.const`    |
# | `rt_mod.time_evaluator("main", dev)` | `tvm.compile(...).mod.time_evaluator("main", dev)` |
#
# The next cell checks the right-hand column against the installed TVM and times section 4's
# reordered matmul with `time_evaluator` (its number moves with the load, so it is not
# compared).

# %% tags=["nbval-ignore-output"]
print(machine_line())
for name in ("s_tir.Schedule", "compile", "runtime.tensor", "runtime.empty", "tirx.max",
             "tirx.const"):
    obj = tvm
    for part in name.split("."):
        obj = getattr(obj, part)
assert all(hasattr(tvm.s_tir.Schedule, a) for a in ("get_sblock", "get_loops", "split"))
fn, A_t, C_t, _ = compiled[STEPS[1]]
evaluator = fn.mod.time_evaluator("main", dev, number=3, repeat=1)
print(f"every TVM 0.27 name of the table exists; time_evaluator on '{STEPS[1]}': "
      f"{evaluator(A_t, B_tvm, C_t).mean * 1e3:.1f} ms per 1024³ product")

# %% [markdown]
# ## 6. A captured training step: `ndl.compile`
#
# Lecture 7 set two ways to run a computational graph against each other (notebook 10): *define
# by run* (needle, PyTorch's default: Python builds the graph anew at every step) and *define,
# then run* (often called define-and-run: the graph is fixed once and executed many times, as
# in TensorFlow 1 and Caffe). A training step of a fixed model on batches
# of a fixed shape calls the same kernels, on buffers of the same sizes, every time; only the
# numbers in the buffers change. `ndl.compile(step)` exploits this: it runs the first calls
# eagerly while recording every call into the device module (the kernels of notebook 06's
# protocol), checks that two consecutive calls issued the same kernels, and from then on replays
# that flat list on the new inputs, with no Tensor, graph or op code run in Python. It is the
# compilation of lecture 24 done at the level of needle's own kernels: no new code is generated,
# but the Python layer above the kernels is gone, and the temporaries get a memory plan.
#
# The step below is hw2's: clear the gradients, forward, loss, backward, optimizer update. The
# compiled step returns the loss as a detached Tensor. `ndl.compile` belongs to needle's fast
# path (`needle.fast`), and the model and loss are fused first (`fast.fuse`): a replay can only
# follow values that stay in device buffers, and the course's `SoftmaxLoss` reads the labels
# into Python to build its one-hot matrix (a step that does so is refused, with a warning naming
# the read, and runs eagerly).

# %%
# companion-only: ndl.compile (needle/fast/compile.py)
import needle.fast as fast


def training(seed):
    """A fresh MLP-ResNet with SGD (seeded) and its training-step function."""
    np.random.seed(seed)
    model = fast.fuse(MLPResNet(64, hidden_dim=64, num_blocks=2, num_classes=10, drop_prob=0.1))
    opt = ndl.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = fast.fuse(nn.SoftmaxLoss())

    def step(x, labels):
        opt.reset_grad()
        loss = loss_fn(model(x), labels)
        fast.backward(loss)
        opt.step()
        return loss

    return model, opt, step


def batch(i, size=64):
    """Batch i of the digits (fixed order), as Tensors on the device."""
    idx = np.random.RandomState(i).choice(len(X), size, replace=False)
    return (ndl.Tensor(X[idx], device=device),
            ndl.Tensor(y[idx].astype(np.float32), device=device))


model_e, _, step_e = training(1)  # the eager twin: the oracle
model_c, opt_c, step_c = training(1)
compiled_step = ndl.compile(step_c)
losses = []
for i in range(30):
    np.random.seed(100 + i)  # both twins draw the same dropout masks
    loss_e = step_e(*batch(i)).numpy()
    np.random.seed(100 + i)
    loss_c = compiled_step(*batch(i)).numpy()
    losses.append((float(loss_e), float(loss_c)))
diff = max(abs(a - b) for a, b in losses)
pdiff = max(float(np.abs(p.numpy() - q.numpy()).max())
            for p, q in zip(model_e.parameters(), model_c.parameters()))
stats = compiled_step.stats
print(f"30 steps: {stats['traces']} traced, {stats['replays']} replayed")
print(f"loss of step 1 -> 30: {losses[0][1]:.4f} -> {losses[-1][1]:.4f}")
print(f"largest difference to the eager twin: loss {diff}, parameters {pdiff}")
assert diff == 0 and pdiff == 0 and stats["replays"] == 27

# %% [markdown]
# The replay is bit-identical to the eager step: it runs the same kernels on the same numbers in
# the same order. The dropout masks are fresh at every replay: a random draw is recorded as a
# draw (numpy's generator is called again, in the same order as the eager step would call it),
# not as the numbers it gave. What was captured:

# %%
# companion-only: ndl.compile (needle/fast/compile.py)
kernels = compiled_step.kernels()
print(f"{len(kernels)} device calls per step; the first 8:")
for line in kernels[:8]:
    print("  " + line)
names = [line.split("(")[0].split(".")[1] for line in kernels]
# most used first, ties by name (a set's order changes with Python's string hashing)
print("most used:", ", ".join(f"{n} x{names.count(n)}"
                                for n in sorted(set(names), key=lambda n: (-names.count(n), n))[:5]))

# %% [markdown]
# Each line is one call into the compiled CPU module, with the buffers named by their role:
# `in0` and `in1` are the step's inputs (rebound at every call), `ext` buffers existed before
# the step (the weights and the optimizer's momentum, updated in place by `sgd_update`), `carry`
# is state the step rebinds in Python (batch norm's running averages: the replay computes the
# new value and copies it into the Tensor the module holds), `kept` buffers are temporaries that
# Python still holds after the step (each parameter's `.grad`), and `bufN` are the pooled
# temporaries. The scalars (strides, offsets, the learning rate) are constants of the program.
# The `to_numpy` lines are not kernels: they are the values the step reads in Python (batch
# norm's backward asks whether its statistics' adjoints are zero); the replay reads them again
# and compares them with what the trace read.
#
# **The speed-up.** The same steps timed in alternating blocks, eager twin against replay (the
# numbers move with the machine's load, so this cell's output is not compared; the sentence is
# computed from the measurement):

# %% tags=["nbval-ignore-output"]
# companion-only: ndl.compile (needle/fast/compile.py)
import statistics
import time

print(machine_line())
x_b, y_b = batch(0)
blocks = {"eager": [], "replay": []}
for _ in range(7):
    for name, fn in (("eager", step_e), ("replay", compiled_step)):
        t0 = time.perf_counter()
        for _ in range(5):
            fn(x_b, y_b)
        blocks[name].append((time.perf_counter() - t0) / 5)
eager_ms, replay_ms = (statistics.median(blocks[k]) * 1e3 for k in ("eager", "replay"))
print(f"eager step {eager_ms:.2f} ms, replayed step {replay_ms:.2f} ms (medians of 7 blocks)")
print(f"the replay takes {replay_ms / eager_ms:.2f}x the eager step's time: "
      f"{1 - replay_ms / eager_ms:.0%} of the eager step was what the replay skips: the Python "
      f"layer (graph building, op dispatch, argument checks) and the temporaries' allocations")

# %% [markdown]
# What is left in the replay is the kernels themselves and one Python loop over the list; the
# last line above says how much of this small model's eager step that removed in this run (the
# smaller the model, the larger the share of Python). (`make bench` measures the four course
# models: `benchmarks/bench_compiled_step.py`.)
#
# **When it must re-trace.** A replay is only valid for the situation it was recorded in, so
# every call first checks a cheap guard: the shapes, strides and devices of the inputs (a new
# shape selects or traces another program), the Python values the step can read (the optimizer's
# `lr`, a module's `training` flag, a closure variable that picks a Python branch, the identity of
# every parameter), and every device value the step read in Python (read again during the replay
# and compared). Adam's step counter `t`, which grows by one per call, is recognised as a counter
# and advanced by the replay. A changed shape and a changed learning rate:

# %%
# companion-only: ndl.compile (needle/fast/compile.py)
last = {}


def show(what):
    """The compiled step's counters so far, and what changed since the previous line."""
    s = compiled_step.stats
    change = ", ".join(f"{s[k] - last.get(k, s[k]):+d} {k}" for k in ("traces", "replays"))
    print(f"{what:<38} traced {s['traces']:2d}, replayed {s['replays']:2d}, "
          f"re-traced {s['retraces']}" + (f" ({change})" if last else ""))
    last.update(s)


show("after the 30 steps and the 35 timed ones")
for i in range(4):
    compiled_step(*batch(i, size=32))  # a batch of 32: a new input signature
show("4 steps with batch 32")
opt_c.lr = 0.01  # a schedule lowers the learning rate
for i in range(4):
    compiled_step(*batch(i))
show("4 steps after lr = 0.01")
assert compiled_step.stats["retraces"] >= 1

# %% [markdown]
# The batch of 32 was traced twice (the second trace confirmed the first) and replayed on the
# next two calls; back on batch 64 with a new `lr`, the guard saw the change, dropped the
# program and traced again (twice, as for a new shape), then replayed. (The two programs share batch norm's running averages: each replay reads them from the
# Tensors the modules hold at that moment, so switching shapes alone does not re-trace.)
# The limits, stated in `needle/fast/compile.py`: Python state the step reaches only indirectly is not
# guarded (pass it in `watch=`); a step whose Python reads device values that change every call
# (a loss printed inside the step) re-traces every call and ends up eager; only the `nd` backend
# is captured.
#
# **The memory plan.** Lecture 15 (notebook 12, section 1) showed inference reusing the memory
# of an activation once nothing reads it any more. The program knows each temporary's lifetime (from the call that first writes it to the
# last that reads it), so temporaries whose lifetimes do not overlap share one preallocated
# buffer of their size. The allocator counter (`memory_stats`, the bytes of live buffers) shows
# what one step allocates above what was live before it:

# %%
# companion-only: ndl.compile (needle/fast/compile.py)
def step_peak(fn):
    """Bytes allocated above the live bytes at the peak of one call of fn (allocator counter)."""
    inputs = batch(0)
    device.mod.reset_peak()
    live = device.mod.memory_stats()["live_bytes"]
    fn(*inputs)
    return device.mod.memory_stats()["peak_bytes"] - live


plan = compiled_step.memory_plan()
eager_peak, replay_peak = step_peak(step_e), step_peak(compiled_step)
print(f"temporaries per step: {plan['temporaries']} pooled "
      f"({plan['temporary_bytes'] / 1024:.0f} KB if each had its own buffer) share "
      f"{plan['pool_buffers']} buffers "
      f"({plan['pool_bytes'] / 1024:.0f} KB, allocated once); {plan['kept']} kept "
      f"({plan['kept_bytes'] / 1024:.0f} KB: what Python holds after the step, the .grad of "
      f"the {len(model_c.parameters())} parameters among them)")
param_bytes = sum(4 * int(np.prod(p.shape)) for p in model_c.parameters())
print(f"allocated during one step: eager {eager_peak / 1024:.0f} KB, replay "
      f"{replay_peak / 1024:.0f} KB (new parameter arrays, each freeing the old one; the "
      f"parameters hold {param_bytes / 1024:.0f} KB; and the returned loss)")
assert plan["pool_buffers"] < plan["temporaries"]
assert replay_peak <= param_bytes + 4096 and replay_peak < eager_peak / 4

# %% [markdown]
# The eager step allocates every temporary afresh (the CPU module's buffer cache makes that
# cheap, but the bytes are live at the peak); the replay allocates only what outlives the step:
# its output, and each parameter's new array (the optimizer's update is the course's
# `p.data = ...`, so a snapshot taken before a step keeps its values, replayed or not). Its pool
# and the kept buffers were allocated once, when the program was first replayed.

# %% [markdown]
# ## Summary
#
# * ONNX is a framework-neutral graph of standard operators; exporting is a graph walk, and the
#   exported models here reproduce needle's outputs to 1e-5 in onnxruntime and in TVM.
# * Runtimes win on small inputs by removing per-op framework overhead. A compiler fuses
#   operators (printed above: fewer kernels, no graph-level intermediate tensors) and generates loops
#   for the exact shapes and CPU; whether its kernels beat a tuned library depends on their
#   schedules, which is what section 4's ladder and a schedule search are about.
# * A schedule separates *what* is computed from *how* the loops run; split, reorder, vectorize
#   and parallel change only the how, and each step of the matmul ladder is checked to give the
#   same product.
# * `ndl.compile` is define-then-run for a whole training step: traced once, replayed as a flat
#   list of kernel calls over preallocated, reused buffers, bit-identical to the eager step and
#   guarded so that anything a replay would get wrong (a new shape, a changed `lr`, another
#   Python branch) re-traces instead.

# %% [markdown]
# ## Exercises
#
# Each exercise has a cell to fill in (it starts as `raise NotImplementedError`) and a check
# cell that says whether your answer is right: "not answered yet", "correct", or "not yet"
# with what differs. The first cell below gathers everything the exercises use, so this
# section also runs on its own after a kernel restart. Reference answers are in
# `notebooks/solutions/13_deployment_and_compilation.py`; try first.

# %% tags=["exercise-setup"]
import re

import numpy as np
import onnx
import onnxruntime as ort
import tvm
from onnx import TensorProto, helper, numpy_helper
import tvm.s_tir.transform as s_tir_passes
from tvm import te
from tvm.target import codegen

import needle as ndl
import needle.nn as nn
from companion.check.exercises import check_exercise

TARGET = tvm.target.Target({"kind": "llvm", "mcpu": codegen.llvm_get_system_cpu()})
dev = tvm.cpu()
rng = np.random.default_rng(0)
np.random.seed(0)  # needle's initialisers draw from numpy's global generator
X_ex = rng.standard_normal((5, 6)).astype(np.float32)

# a Linear followed by a BatchNorm1d whose running statistics come from a few training batches
lin_ex, bn_ex = nn.Linear(6, 4), nn.BatchNorm1d(4)
bn_ex.weight = nn.Parameter(ndl.Tensor(rng.uniform(0.5, 2, 4).astype(np.float32)))
bn_ex.bias = nn.Parameter(ndl.Tensor(rng.standard_normal(4).astype(np.float32)))
for _ in range(5):
    bn_ex(lin_ex(ndl.Tensor(rng.standard_normal((16, 6)).astype(np.float32) * 2 + 1)))
lin_bn_ex = nn.Sequential(lin_ex, bn_ex)
lin_bn_ex.eval()
BN_ARGS = [t.numpy().astype(np.float64) for t in (lin_ex.weight, lin_ex.bias, bn_ex.weight,
                                                   bn_ex.bias, bn_ex.running_mean,
                                                   bn_ex.running_var)] + [bn_ex.eps]

mlp_ex = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
MLP_PARAMS = [p.numpy() for p in mlp_ex.parameters()]  # W1 (6, 8), b1 (1, 8), W2, b2


def tvm_run(outputs_of, inputs, out_shape, schedule=lambda sch: sch):
    """Compile the tensor program ``outputs_of(*placeholders)``, after ``schedule`` (a function
    of a tvm.s_tir.Schedule returning it), for this CPU and run it on ``inputs``. Returns the
    output and the number of elements the program allocates for intermediate arrays."""
    holders = [te.placeholder(a.shape, name=f"in{i}") for i, a in enumerate(inputs)]
    out = outputs_of(*holders)
    sch = schedule(tvm.s_tir.Schedule(tvm.IRModule({"main": te.create_prim_func(holders + [out])})))
    # where each intermediate buffer lives and how much of it is needed, as tvm.compile plans it
    planned = tvm.transform.Sequential([
        s_tir_passes.LowerInitBlock(), s_tir_passes.PlanAndUpdateBufferAllocationLocation(),
        s_tir_passes.ConvertBlocksToOpaque(), s_tir_passes.CompactBufferAllocation()])(sch.mod)
    shapes = re.findall(r"alloc_buffer\(\(([^)]*)\)", planned.script())
    elements = sum(int(np.prod([int(d) for d in shape.split(",") if d.strip()]))
                   for shape in shapes)
    fn = tvm.compile(sch.mod, target=TARGET)
    result = tvm.runtime.empty(out_shape, "float32", dev)
    fn(*[tvm.runtime.tensor(a, dev) for a in inputs], result)
    return result.numpy(), elements


N_EX = 128
A_mm, B_mm = (rng.standard_normal((N_EX, N_EX)).astype(np.float32) for _ in range(2))


def matmul_schedule():
    """A fresh schedule of C (N_EX, N_EX) = A @ B, loops i, j, k (section 4's matmul_module)."""
    A = te.placeholder((N_EX, N_EX), name="A")
    B = te.placeholder((N_EX, N_EX), name="B")
    k = te.reduce_axis((0, N_EX), name="k")
    C = te.compute((N_EX, N_EX), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    return tvm.s_tir.Schedule(tvm.IRModule({"main": te.create_prim_func([A, B, C])}))


# %% [markdown]
# **Exercise 13.1 (fold BatchNorm into the layer before it).** In evaluation mode a
# `BatchNorm1d` is a fixed affine map per feature, so a `Linear` followed by it is one
# `Linear`: deployment tools fold it away. Given the Linear's $W$ (in, out) and $b$ (1, out) and
# the BatchNorm's weight $\gamma$, bias $\beta$, running mean and variance and $\epsilon$,
# return $W'$ and $b'$ with $xW' + b' = \mathrm{BN}(xW + b)$. The check runs needle's two
# layers in `eval()` mode.

# %% tags=["exercise-stub"]
def fold_batchnorm(W, b, gamma, beta, mean, var, eps):
    """(W', b') of the single Linear equal to Linear(W, b) then BatchNorm1d in eval mode."""
    raise NotImplementedError


# %% tags=["exercise-check"]
def _folded_output():
    W_f, b_f = fold_batchnorm(*BN_ARGS)
    return X_ex.astype(np.float64) @ np.asarray(W_f) + np.asarray(b_f)


check_exercise("13.1 fold_batchnorm", _folded_output, lin_bn_ex(ndl.Tensor(X_ex)).numpy(),
               rtol=1e-4, atol=1e-5)

# %% [markdown]
# **Exercise 13.2 (an ONNX graph by hand).** Write what `to_onnx` writes, by hand, with
# `onnx.helper`: a model with input `"input"` (batch, 6) and output `"output"` (batch, 3),
# float32, computing $\mathrm{ReLU}(x W_1 + b_1) W_2 + b_2$ (`MatMul`, `Add`, `Relu`; the
# weights as initializers, made with `numpy_helper.from_array`). Use opset 18 and set
# `ir_version = 8`, as `to_onnx` does. The check runs the ONNX checker, then your model in
# onnxruntime against needle's MLP.

# %% tags=["exercise-stub"]
def mlp_to_onnx(W1, b1, W2, b2, batch):
    """An onnx.ModelProto of the two-layer MLP for inputs of shape (batch, 6)."""
    raise NotImplementedError


# %% tags=["exercise-check"]
def _onnx_ok(proto):
    onnx.checker.check_model(proto, full_check=True)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(["output"], {"input": X_ex})[0]
    want = mlp_ex(ndl.Tensor(X_ex)).numpy()
    if got.shape != want.shape or not np.allclose(got, want, rtol=1e-5, atol=1e-5):
        return f"onnxruntime gives\n{got}\nneedle gives\n{want}"
    return None


check_exercise("13.2 mlp_to_onnx", lambda: mlp_to_onnx(*MLP_PARAMS, batch=len(X_ex)),
               predicate=_onnx_ok)

# %% [markdown]
# **Exercise 13.3 (a fused operator as a tensor program).** Declare with `te.compute` a `Linear`
# followed by a ReLU, $Y_{ij} = \max(\sum_k X_{ik} W_{kj} + b_j, 0)$, for placeholders `X` (n, k),
# `W` (k, m) and `b` (m,): a stage `S` (the matmul: `te.sum` over a `te.reduce_axis`, as in section
# 4) and a stage `Y` reading it (`tvm.tirx.max(a, b)` is an element-wise maximum,
# `tvm.tirx.const(0.0, "float32")` a zero); name them with `name="S"` and `name="Y"`. Declared like
# this, the program still writes the whole n × m array `S` to memory and reads it back: two loop
# nests, as needle's separate ops would. **Fuse them** in `fuse_linear_relu(sch)`: move the
# computation of `Y` inside the loops of `S` (`sch.reverse_compute_at(sch.get_sblock("Y"), loop)`
# with `loop` one of `sch.get_loops(sch.get_sblock("S"))`, or the mirror image `sch.compute_at`), so
# that each element of `S` is consumed right after it is summed and TVM needs only a small piece of
# `S` at a time. The check compiles your program, compares it with numpy, and counts the elements
# TVM allocates for `S` after planning where it lives: fewer than n × m means fused.
# (`sch.reverse_compute_inline` would put `Y` into `S`'s block itself, which TVM refuses for a
# reduction; `fuse_reduction_epilogue` does it by applying the ReLU at every step of the sum, which
# changes the result.)

# %% tags=["exercise-stub"]
def linear_relu_compute(X, W, b):
    """The te.Tensor Y = max(X @ W + b, 0) for te placeholders X, W, b (stages "S", "Y")."""
    raise NotImplementedError


def fuse_linear_relu(sch):
    """The schedule ``sch`` of linear_relu_compute's program with Y computed inside S's loops."""
    raise NotImplementedError


# %% tags=["exercise-check"]
_lr_inputs = [X_ex, MLP_PARAMS[0], MLP_PARAMS[1].ravel()]
_lr_want = np.maximum(X_ex.astype(np.float64) @ MLP_PARAMS[0] + MLP_PARAMS[1], 0)


def _fused_ok(result):
    got, elements = result
    if not np.allclose(got, _lr_want, rtol=1e-5, atol=1e-5):
        return f"the program gives\n{got}\nnumpy gives\n{_lr_want}"
    if elements >= _lr_want.size:
        return (f"TVM still allocates {elements} elements for the intermediate (all "
                f"{_lr_want.shape[0]} x {_lr_want.shape[1]} of S): compute Y inside S's loops")
    return None


check_exercise("13.3 linear_relu_compute, fuse_linear_relu",
               lambda: tvm_run(linear_relu_compute, _lr_inputs, _lr_want.shape,
                               schedule=fuse_linear_relu),
               predicate=_fused_ok)

# %% [markdown]
# **Exercise 13.4 (a schedule of your own).** Transform the schedule of a 128³ matmul from
# `matmul_schedule()` into section 4's tiled and vectorized form with tiles of `ti × tj × tk`:
# the loops around the update in the order $i_0, j_0, k_0, i_1, k_1, j_1$ (outer loops of
# extent 128/ti, 128/tj, 128/tk, inner ones ti, tk, tj), the innermost $j_1$ vectorized, and
# the zero-initialisation moved out of the reduction. Return the schedule. The check compiles
# it, compares the product with numpy, and reads the loops of the update block.

# %% tags=["exercise-stub"]
def tile_and_vectorize(sch, ti, tj, tk):
    """The schedule ``sch`` of the matmul, tiled ti x tj x tk with j1 vectorized."""
    raise NotImplementedError


# %% tags=["exercise-check"]
def _schedule_ok(sch, tiles):
    ti, tj, tk = tiles
    fn = tvm.compile(sch.mod, target=TARGET)
    C = tvm.runtime.empty((N_EX, N_EX), "float32", dev)
    fn(tvm.runtime.tensor(A_mm, dev), tvm.runtime.tensor(B_mm, dev), C)
    want = A_mm.astype(np.float64) @ B_mm
    if not np.allclose(C.numpy(), want, rtol=1e-4, atol=1e-3):
        return f"tiles {tiles}: the product is wrong"
    names = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
    if "C_update" not in names:
        return f"tiles {tiles}: no C_update block (blocks {names}): decompose the reduction"
    loops = [sch.get(loop) for loop in sch.get_loops(sch.get_sblock("C_update"))]
    extents = [int(loop.extent) for loop in loops]
    want_extents = [N_EX // ti, N_EX // tj, N_EX // tk, ti, tk, tj]
    if extents != want_extents:
        return f"tiles {tiles}: loop extents {extents}, expected {want_extents}"
    if loops[-1].kind != tvm.tirx.ForKind.VECTORIZED:
        return f"tiles {tiles}: the innermost loop is not vectorized"
    return None


TILES = [(16, 32, 32), (8, 64, 16)]
check_exercise("13.4 tile_and_vectorize",
               lambda: [tile_and_vectorize(matmul_schedule(), *t) for t in TILES],
               predicate=lambda schedules: next((p for p in map(_schedule_ok, schedules, TILES)
                                                 if p), None))
