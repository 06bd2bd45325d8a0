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
# # 06 · Hardware acceleration: the CPU and CUDA kernels
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/needle-companion/needle-companion/blob/main/notebooks/06_hardware_acceleration.ipynb)
#
# **Lecture:** 11, "Hardware Acceleration", 12, "GPU Acceleration", and 13, "Hardware
# Acceleration Implementation"
#
# **Homework:** hw3 Parts 2–5 (the CPU backend: compact and setitem, element-wise and scalar
# ops, reductions, matrix multiplication, tiled included) and Parts 6–9 (the same on CUDA)
#
# **Prerequisites:** notebook 05 (shape, strides, offset; views and `compact`)
#
# **You will be able to:** list what a device module must provide; explain why a kernel that
# takes strides avoids a copy, and measure whether avoiding it pays; explain how a reduction
# runs on a CPU and on a GPU; count the flops and the floats moved by a matmul loop nest and
# derive the reuse that register tiles and cache blocks buy; map CUDA threads and blocks onto
# a tiled matmul and check its accesses for coalescing and bank conflicts; and split a
# training step into time inside kernels and framework overhead.
#
# **Run time:** about 25 s on a 2-core x86-64 machine (a minute when other jobs load it)
#
# **Student mode:** with `NEEDLE_IMPL=path/to/hwN/python` (your own needle), the cells marked
# companion-only are skipped: they use this project's device protocol, its GEMM blocking and ISA
# dispatch (`__gemm__`), its thread pool and scratch plan, and `companion.step_profile` with
# `needle.fast`.
#
# Notebook 05 built the NDArray: a flat buffer plus (shape, strides, offset), views without
# copies, and `compact()`. It ended with a measurement: the same product $C = AB$ runs far
# faster once the loop nest is blocked. This notebook opens the kernels underneath and does the
# arithmetic that explains it.
#
# 1. **The device-module protocol**: the fixed list of functions every device implements.
# 2. **Element-wise kernels and reductions**: flat loops over compact buffers (the course's
#    form), or loops that take strides and read views directly; how a loop is split among
#    threads; shared memory in a GPU window sum; reductions over an axis.
# 3. **Matmul arithmetic**: $2mnp$ flops against the bytes each loop nest moves; register
#    tiling and cache blocking, with the block sizes the compiled module reports.
# 4. **The tiled layout** of the homework's `matmul_tiled`, built with `as_strided`.
# 5. **The CUDA matmul kernel**: blocks, threads and shared memory, with the numbers for a
#    $1024^3$ product. Nothing here runs on a GPU: it is arithmetic on the kernel's source,
#    and the "checks" of the kernel test a numpy emulation of it, not the CUDA code.
# 6. **Where a training step's time goes**: kernels against framework overhead, for the
#    course's modules and for needle's fused fast path, measured in one run.
#
# The CPU block sizes come from the compiled module (`__gemm__`), so the arithmetic always
# describes the kernels this machine runs. The CUDA launch constants are read by name from
# `src/cuda/ndarray_backend_cuda.cu` (the notebook runs on machines without a GPU).

# %% tags=["remove-cell"] cellView="form" jupyter={"source_hidden": true}
#@title Colab set-up: in Colab this installs needle (2-3 minutes); elsewhere it does nothing
import os, shlex, subprocess, sys, tempfile; repo = os.environ.get("NEEDLE_COLAB_REPO", "https://github.com/needle-companion/needle-companion")
if "google.colab" in sys.modules or os.environ.get("NEEDLE_COLAB_SIMULATE") == "1":  # companion/colab_setup.py
    py, src, q = sys.executable, os.path.join(tempfile.gettempdir(), "needle-companion"), shlex.quote
    done = subprocess.run(f"{q(py)} -m companion.colab_setup --status 2>/dev/null || {{ {{ test -d {q(src)} || git clone -q --depth=1 {q(repo)} {q(src)}; }} && cd {q(src)} && {q(py)} -m companion.colab_setup --install {q(repo)} --cwd {q(os.getcwd())}; }}", shell=True, capture_output=True, text=True); print(done.stdout + done.stderr[-3000:], end=""); assert done.returncode == 0, f"the set-up could not install this project from {repo} (what failed is above)"

# %%
import inspect
import json
import math
import os
import re
import shutil
import subprocess
import sys

import matplotlib.pyplot as plt
import numpy as np

import needle as ndl
import needle.backend_ndarray.ndarray as ndarray_module
from needle import backend_ndarray as nd
from companion.machine import machine_line
from companion.timing import measure
from companion import lecture
from companion.viz import save_figure

np.random.seed(0)
lecture.setup()  # with NEEDLE_IMPL: cells marked "# companion-only" print a skip line
device = ndl.cpu()  # the kernels taken apart here are the C++ module's: cpu() (a GPU: § 8's end)
assert device.enabled(), "build the C++ backend first: make build"
mod = device.mod
SRC = lecture.kernel_source_dir()  # this project's kernels: the checkout's src/ or the wheel's copy
assert SRC.is_dir(), f"no kernel sources in {SRC}: reinstall needle"


def source(name: str) -> str:
    """The text of src/NAME."""
    return lecture.kernel_source(name)


def constant(text: str, pattern: str) -> int:
    """The one integer captured by the regex `pattern` in `text`."""
    found = re.findall(pattern, text)
    assert len(found) == 1, f"{pattern!r} matched {len(found)} times, expected once"
    return int(found[0])


def named_constant(text: str, name: str) -> int:
    """The integer value of `constexpr <type> NAME = <int>;` in `text` (any integer type)."""
    return constant(text, rf"constexpr [\w:]+ {name} = (\d+);")


print(device, "| source directory:", SRC.name)

# %% [markdown]
# ## 1. The device-module protocol
#
# `NDArray` never computes anything itself. It checks arguments, manages (shape, strides,
# offset), and calls a **device module** for every loop over memory. What a device module must
# provide is written down once, in `needle/backend_ndarray/protocol.py`: a buffer type
# `Array(size)`, copies in and out (`to_numpy`, `from_numpy`, `fill`), strided copies
# (`compact`, `ewise_setitem`, `scalar_setitem`), element-wise ops, reductions and matrix
# products, with one error policy. The course's hw3 functions (`ewise_add(a, b, out)`,
# `reduce_sum(a, out, size)`, `matmul(a, b, out, m, n, p)`, ...) work on compact buffers; the
# protocol adds strided forms (`ewise_binary`, `reduce`, `matmul_strided`) that read views
# directly, and fused kernels for the composites a training step repeats. Three modules
# implement it: numpy (`cpu_numpy()`), C++ (`cpu()`) and CUDA (`cuda()`).

# %%
# companion-only: the device protocol (protocol.py) and the op tables
from needle.backend_ndarray import protocol

PROTOCOL = sorted(n for n, v in vars(protocol.DeviceModule).items()
                  if not n.startswith("_") and callable(v))
COURSE = list(protocol.COURSE_PARAMS) + ["matmul"]  # hw3's names, as protocol.py lists them


def functions(module) -> list[str]:
    """Public callables (functions and the Array class) of a device module, sorted."""
    return sorted(n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n)))


numpy_mod = ndl.cpu_numpy().mod
print(f"{len(PROTOCOL)} protocol functions:", ", ".join(PROTOCOL))
print("op tables:", {k: len(getattr(mod, k)) for k in ("__binary_ops__", "__unary_ops__",
                                                       "__reduce_ops__")})
extras = sorted(set(functions(mod)) - set(PROTOCOL) - set(COURSE))
print("cpu() extras beyond the protocol and the course's names:", ", ".join(extras))

# %% [markdown]
# Every protocol function and every course function is on both CPU devices, and both modules
# carry the same op tables (an op code is a position in them), so `NDArray` can call either
# module the same way. The compiled module adds lecture exhibits of its own: `matmul_tiled`
# (the homework's tile-by-tile product) and `matmul_naive` (the textbook loop).

# %%
# companion-only: the device protocol (protocol.py)
for m_ in (mod, numpy_mod):
    assert set(PROTOCOL) <= set(functions(m_)), set(PROTOCOL) - set(functions(m_))
    assert set(COURSE) <= set(functions(m_)), set(COURSE) - set(functions(m_))
    assert (m_.__binary_ops__, m_.__unary_ops__, m_.__reduce_ops__) == (
        protocol.BINARY_OPS, protocol.UNARY_OPS, protocol.REDUCE_OPS)
assert {"matmul_tiled", "matmul_naive"} <= set(functions(mod))
print("__device_name__:", mod.__device_name__, "/", numpy_mod.__device_name__)
assert (mod.__device_name__, numpy_mod.__device_name__) == ("cpu", "cpu_numpy")

# %% [markdown]
# The protocol is what `NDArray` needs. Reading `ndarray.py` and `elementwise.py` (its
# operator methods) and collecting every `device.NAME` they call (leaving out
# `BackendDevice`'s own methods such as `enabled`) finds only protocol functions, course
# functions and the tiled exhibit, nothing else. The element-wise methods call the course's
# compact functions by name (`getattr(dev, "ewise_add")`) when both operands are compact: they
# compute the same values as the strided forms (a test checks every one bit for bit) and take
# no strides, which makes a call on a small array a third as dear.

# %%
# companion-only: the device protocol (protocol.py)
import needle.backend_ndarray.elementwise as elementwise_module

sources = inspect.getsource(ndarray_module) + inspect.getsource(elementwise_module)
used = set(re.findall(r"(?:device|dev)\.(\w+)\(", sources))
used = {n for n in used if not hasattr(nd.BackendDevice, n)}
print(len(used), "device functions called by name:", ", ".join(sorted(used)))
print("and by getattr, for compact operands:", ", ".join(f"ewise_{op}" for op in
                                                        protocol.COURSE_BINARY), "...")
assert used and used <= set(PROTOCOL) | set(COURSE) | {"matmul_tiled"}, used - set(PROTOCOL)
assert set(protocol.COURSE_PARAMS) <= set(COURSE)

# %% [markdown]
# `cuda()` always exists: `enabled()` says whether its module was compiled (nvcc present at
# build time) **and** a GPU is visible. This cell's output depends on the machine, so the tests
# do not compare it; what they do check is that the answer is consistent: an enabled module
# carries the whole protocol (a module built from older sources says what it lacks), and a
# disabled device refuses to allocate with a `RuntimeError` rather than crashing.

# %% tags=["nbval-ignore-output"]
# companion-only: the device protocol (protocol.py)
cuda = ndl.cuda()
built = cuda.mod is not None
print(f"cuda module built: {built} | cuda().enabled(): {cuda.enabled()}")
if built:
    missing = set(PROTOCOL) - set(functions(cuda.mod))
    print("protocol functions missing from the cuda module:", sorted(missing) or "none")
    assert cuda.enabled() == cuda.mod.is_available() == (cuda.mod.device_count() > 0)
else:
    assert not cuda.enabled()
if cuda.enabled():
    assert not missing, f"the enabled cuda() module lacks {sorted(missing)}"
    xa = np.random.randn(5, 3).astype(np.float32)
    got = (nd.array(xa, device=cuda) @ nd.array(xa.T, device=cuda)).numpy()
    assert np.allclose(got, xa @ xa.T, atol=1e-5)
    print("a small product on the GPU agrees with numpy")
else:
    try:
        nd.array(np.zeros(3), device=cuda)
    except RuntimeError as err:
        print("RuntimeError:", err)
        assert "cuda" in str(err).lower()
    else:
        raise AssertionError("a disabled cuda() device allocated an array")

# %% [markdown]
# ## 2. Element-wise kernels: flat loops, or loops that take strides
#
# The course's element-wise kernels have the same shape, whatever the array's shape:
#
# ```c++
# for (i = 0; i < size; ++i) out[i] = f(a[i], b[i]);   // vectorised, threaded when large
# ```
#
# They receive only buffers: no shape, no strides. That makes them trivial and fast
# (contiguous loads, SIMD, no index arithmetic), but they must be given **compact** buffers.
# Hand the raw buffer of a transposed view to `ewise_add` and it adds elements in *memory*
# order, not in the view's logical order:

# %%
a = nd.array(np.arange(6).reshape(2, 3), device=device)
t = a.permute((1, 0))  # (3, 2) view of a's buffer, not compact
y = nd.array(np.full((3, 2), 10.0), device=device)
raw = nd.NDArray.make((3, 2), device=device)
mod.ewise_add(t._handle, y._handle, raw._handle)  # the kernel sees two flat buffers
print("ewise_add on t's raw buffer:\n", raw.numpy().astype(int))
expected = np.arange(6).reshape(2, 3).T + 10
assert np.array_equal(raw.numpy(), np.arange(6).reshape(3, 2) + 10)  # memory order: wrong
assert not np.array_equal(raw.numpy(), expected)

# %% [markdown]
# The course's `NDArray` therefore compacts every operand first: one extra read-and-write pass
# over each non-compact operand, on every op. The protocol's `ewise_binary` takes each
# operand's strides and offset instead and does the index arithmetic itself, so a transposed
# or broadcast (stride-0) operand needs no `compact()` call (for large transposed matrices the
# kernel still makes a copy of its own, as the timings below show). Given the view's strides
# $(1, 3)$, the same buffer gives the right answer; this is what `t + y` calls:

# %%
# companion-only: the device protocol (protocol.py, ewise_binary)
ADD = protocol.BINARY_OPS.index("add")
strided = nd.NDArray.make((3, 2), device=device)
mod.ewise_binary(ADD, t._handle, t.strides, t._offset, y._handle, y.strides, y._offset,
                 strided._handle, (3, 2))
print("ewise_binary with t's strides:\n", strided.numpy().astype(int))
assert np.array_equal(strided.numpy(), expected)
assert np.array_equal((t + y).numpy(), expected)

# %% [markdown]
# Saving the copy is not the same as saving time. A transposed operand read through its
# strides jumps a whole row between consecutive elements: each element needs its own cache
# line, of which it uses 4 of 64 bytes, and once a column's lines no longer fit in L1 the rest
# of each line has to be fetched again for the next columns. The `compact` copy walks the
# transpose in cache-sized blocks instead, and the add that follows reads two contiguous
# buffers. `cpu()`'s element-wise kernels therefore do not always read in place: when an
# operand of at least `kScratchMin` elements is a transposed **matrix** (a view that
# simplifies to two dimensions), the kernel first copies it into a scratch buffer with the
# blocked walk of `compact`, and adds afterwards. The next cell reads that threshold from
# `src/cpu/ndarray_backend_cpu_ewise.h` and measures three cases, each as "operand read
# through its strides by the kernel" against "explicit `compact()`, then a compact add":
#
# * a transposed $500 \times 500$ matrix, below the threshold: the kernel really reads it in
#   place;
# * a $128^3$ cube with its axes reversed, `permute((2, 1, 0))`, 2 M elements: three
#   dimensions, so the scratch plan does not apply and the kernel reads it in place, one cache
#   line per element;
# * a transposed $2048 \times 2048$ matrix, above the threshold: here both routes copy, the
#   kernel into its scratch buffer and `compact()` into a new array, so this row compares the
#   kernel's blocked copy with the explicit one.
#
# Timings vary, so the output is not compared; each verdict line is computed from the numbers
# above it. (A broadcast, stride-0 operand is the opposite case: it re-reads one element or one
# row, which stays in cache, and copying it would write a whole array for nothing.)

# %% tags=["nbval-ignore-output"]
# companion-only: the device protocol's strided kernels (ewise_binary) and their scratch plan
print(machine_line())
SCRATCH_MIN = constant(source("cpu/ndarray_backend_cpu_ewise.h"),
                       r"constexpr idx_t kScratchMin = idx_t\(1\) << (\d+);")
print(f"kScratchMin = 2^{SCRATCH_MIN} = {2**SCRATCH_MIN:,} elements")


def median_ms(fn) -> float:
    """Median milliseconds per call of fn() (companion.timing.measure: warmup, repeated samples)."""
    return 1e3 * measure(fn)


def strided_vs_copy(name: str, base: nd.NDArray, view: nd.NDArray) -> tuple:
    """(ms: compact + compact, compact + view, compact() of view) for base + view."""
    assert np.array_equal((base + view).numpy(), base.numpy() + view.numpy())
    ms = (median_ms(lambda: base + base), median_ms(lambda: base + view),
          median_ms(lambda: view.compact()))
    print(f"{name:<37} compact+compact {ms[0]:7.2f} ms | compact+view {ms[1]:7.2f} ms | "
          f"view.compact() {ms[2]:7.2f} ms")
    return ms


rng_t = np.random.default_rng(0)
small = nd.array(rng_t.standard_normal((500, 500)).astype(np.float32), device=device)
cube = nd.array(rng_t.standard_normal((128, 128, 128)).astype(np.float32), device=device)
big = nd.array(rng_t.standard_normal((2048, 2048)).astype(np.float32), device=device)
assert 500 * 500 < 2**SCRATCH_MIN <= 128**3 and 2048 * 2048 >= 2**SCRATCH_MIN
cases = {"500x500 transposed (in place)": strided_vs_copy(
             "500x500 transposed (in place)", small, small.permute((1, 0))),
         "128^3 axes reversed (in place)": strided_vs_copy(
             "128^3 axes reversed (in place)", cube, cube.permute((2, 1, 0))),
         "2048x2048 transposed (kernel copies)": strided_vs_copy(
             "2048x2048 transposed (kernel copies)", big, big.permute((1, 0)))}
for name, (plain, through, copy) in cases.items():
    first = plain + copy  # the course's route: compact the operand, then a compact add
    how = "the kernel's blocked copy, then its add," if "copies" in name else "reading in place"
    ratio = through / first
    word = "about the same" if 0.95 <= ratio <= 1.05 else "faster" if ratio < 1 else "slower"
    print(f"verdict, {name}: {how} took {ratio:.2f}x the time of compact() then a compact add "
          f"({word}), {through / plain:.1f}x a compact + compact add")

# %% [markdown]
# ### Threads: a parallel for (lecture 11)
#
# Lecture 11 parallelises a loop with OpenMP's `#pragma omp parallel for`, which splits the
# iterations among threads. The CPU module does the same with a thread pool of its own
# (`src/cpu/ndarray_backend_cpu_threads.h`), through `parallel_ranges(n, threshold, grain, f)`
# (`src/cpu/ndarray_backend_cpu_strided.h`). Below `threshold` elements, or with one thread,
# it calls `f(0, n)` on the calling thread: waking threads costs more than a short loop
# saves. Otherwise it cuts $[0, n)$ into chunks of `grain` elements, and the calling thread
# and the pool's idle workers each claim the next unclaimed chunk from one shared atomic
# counter (`fetch_add`) until none is left. A thread that the operating system pauses simply
# claims fewer chunks, which is OpenMP's `schedule(dynamic, grain)`. The chunks an element-wise
# add is cut into, with the constants read from the source and two threads:

# %%
# companion-only: this project's compiled module's thread pool (parallel_ranges)
ewise_h = source("cpu/ndarray_backend_cpu_ewise.h")
strided_h = source("cpu/ndarray_backend_cpu_strided.h")
PARALLEL_EWISE = 2 ** constant(ewise_h, r"constexpr idx_t kParallelEwise = idx_t\(1\) << (\d+);")
GRAIN = 2 ** constant(ewise_h, r"constexpr idx_t kEwiseGrain = idx_t\(1\) << (\d+);")
assert "if (n < threshold || n <= grain || max_threads() <= 1) {" in strided_h


def chunks(n: int, threshold: int, grain: int, threads: int) -> list[tuple[int, int]]:
    """The (begin, end) ranges parallel_ranges passes to f, in the order they are claimed."""
    if n < threshold or n <= grain or threads <= 1:
        return [(0, n)]
    return [(c * grain, min(n, (c + 1) * grain)) for c in range(-(-n // grain))]


print(f"threshold {PARALLEL_EWISE:,} elements, grain {GRAIN:,}")
for n in (100_000, 10**6, 2048 * 2048):
    parts = chunks(n, PARALLEL_EWISE, GRAIN, threads=2)
    last = parts[-1][1] - parts[-1][0]
    print(f"{n:>10,} elements: {len(parts):>3} call(s) of f, the last one {last:,} elements")
    assert parts[0][0] == 0 and parts[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))  # every element exactly once

# %% [markdown]
# On the GPU the same kernels run one **thread per element**. The launcher uses blocks of
# `BLOCK` threads and at most `MAX_BLOCKS` blocks; a *grid-stride loop* (`i += gridDim.x *
# blockDim.x`) lets a capped grid still cover any size:

# %%
cu = source("cuda/ndarray_backend_cuda.cu")
BLOCK = named_constant(cu, "BLOCK")
MAX_BLOCKS = named_constant(cu, "MAX_BLOCKS")


GRID_FOR = re.search(r"unsigned grid_for\(int64_t n, int64_t per_block = BLOCK\) \{\s*"
                     r"return static_cast<unsigned>\(std::max<int64_t>\(1, std::min\("
                     r"\(n \+ per_block - 1\) / per_block,\s*MAX_BLOCKS\)\)\);", cu)
assert GRID_FOR, "grid_for in ndarray_backend_cuda.cu changed: update the Python copy below"


def grid_for(n: int) -> int:
    """Blocks launched for n elements: the body of grid_for matched above, in Python."""
    return max(1, min(math.ceil(n / BLOCK), MAX_BLOCKS))


print(f"BLOCK = {BLOCK}, MAX_BLOCKS = {MAX_BLOCKS}; grid_for = max(1, min(ceil(n / BLOCK), "
      "MAX_BLOCKS)) (read from the .cu)")
print(f"{'elements':>12} {'blocks':>8} {'threads':>12} {'elements per thread (max)':>26}")
for n in [1000, 2**20, 2**26]:
    blocks = grid_for(n)
    print(f"{n:>12,} {blocks:>8,} {blocks * BLOCK:>12,} {math.ceil(n / (blocks * BLOCK)):>26}")
for n in [1, 1000, 2**20, 2**26, 2**34]:
    blocks = grid_for(n)
    # arithmetic on the rule above, not a test of the CUDA code: enough threads for one element
    # each, unless the grid is capped; then the grid-stride loop gives each thread
    # ceil(n / threads) elements, and no block is left idle
    assert blocks == MAX_BLOCKS or blocks * BLOCK >= n > (blocks - 1) * BLOCK

# %% [markdown]
# The GPU `compact` kernel is where the index arithmetic lives. Thread $i$ turns its output
# index into a buffer position by repeated division, innermost dimension first:
# $i_{d} = i \bmod n_d,\ i \leftarrow \lfloor i / n_d \rfloor$, position $\mathrel{+}= i_d \cdot
# \text{stride}_d$. Divisions are slow on a GPU, so the launcher first **simplifies** the view:
# it drops size-1 dimensions and fuses a dimension into its outer neighbour when the outer
# stride steps exactly over it. A compact view becomes one dimension (a plain copy), a full
# transpose keeps all three, and a slice that keeps whole rows fuses them. Here is that logic
# in Python, checked against `NDArray.compact`:

# %%
def simplify(shape, strides) -> list[tuple[int, int]]:
    """(size, stride) pairs after dropping size-1 dims and fusing contiguous neighbours."""
    dims: list[tuple[int, int]] = []
    for n, s in zip(shape, strides):
        if n == 1:
            continue
        if dims and dims[-1][1] == s * n:
            dims[-1] = (dims[-1][0] * n, s)
        else:
            dims.append((n, s))
    return dims


def gather(buf: np.ndarray, view: nd.NDArray) -> np.ndarray:
    """What the CUDA compact kernel writes: out[i] = buf[position of element i of the view]."""
    dims = simplify(view.shape, view.strides)
    out = np.empty(view.size, dtype=np.float32)
    for i in range(view.size):
        pos, rest = view._offset, i
        for n, s in reversed(dims):
            rest, idx = divmod(rest, n)
            pos += idx * s
        out[i] = buf[pos]
    return out.reshape(view.shape)


base = nd.array(np.arange(60).reshape(3, 4, 5), device=device)
buf = base.numpy().ravel()
views = {"compact (3, 4, 5)": base, "permute (2, 1, 0)": base.permute((2, 1, 0)),
         "slice [1:, :, 1:4]": base[1:, :, 1:4], "slice [:, 1:3, :]": base[:, 1:3, :]}
for name, v in views.items():
    dims = simplify(v.shape, v.strides)
    print(f"{name:<20} strides={str(v.strides):<12} -> {len(dims)} dim(s) {dims}")
    assert np.array_equal(gather(buf, v), v.compact().numpy())
assert [len(simplify(v.shape, v.strides)) for v in views.values()] == [1, 3, 2, 2]

# %% [markdown]
# ### Shared memory in miniature: lecture 12's window sum
#
# Lecture 12 introduces shared memory with a 1-D window sum, $out[i] = \sum_{k=-R}^{R}
# in[i+k]$ (zero outside the array). With one thread per output, each thread reads $2R+1$
# inputs from global memory, and neighbouring threads read almost the same ones. With shared
# memory, each block of $T$ threads first copies the $T + 2R$ inputs its outputs need into
# shared memory (one each, and $2R$ threads a second one), waits at `__syncthreads()`, and then
# reads its $2R+1$ inputs from shared memory: global reads per output fall from $2R+1$ to about
# $(T + 2R)/T$. The same emulated block by block in numpy (no GPU involved), checked against
# `np.convolve`, with the reads counted:

# %%
def window_sum_blocks(x: np.ndarray, R: int, T: int) -> tuple[np.ndarray, int]:
    """(out, global reads): the window sum computed block by block as the shared-memory
    kernel does it, each block staging x[start - R : start + T + R] first."""
    n, out, reads = len(x), np.zeros(len(x)), 0
    for start in range(0, n, T):
        lo, hi = start - R, start + T + R
        tile = np.zeros(T + 2 * R)  # the block's shared memory; zero outside the array
        tile[max(lo, 0) - lo:min(hi, n) - lo] = x[max(lo, 0):min(hi, n)]
        reads += min(hi, n) - max(lo, 0)
        for t in range(min(T, n - start)):  # thread t's window, read from shared memory
            out[start + t] = tile[t:t + 2 * R + 1].sum()
    return out, reads


R_WIN, T_WIN, n_win = 3, 256, 4096
x_win = np.random.randn(n_win)
summed, staged = window_sum_blocks(x_win, R_WIN, T_WIN)
assert np.allclose(summed, np.convolve(x_win, np.ones(2 * R_WIN + 1), mode="same"))
print(f"n = {n_win}, R = {R_WIN}, blocks of {T_WIN}: global reads {(2 * R_WIN + 1) * n_win:,} "
      f"with one thread per output, {staged:,} staged through shared memory "
      f"({staged / n_win:.3f} per output)")

# %% [markdown]
# ### Reductions
#
# hw3's reductions are `reduce_sum(a, out, reduce_size)` and `reduce_max`: the kernel sees a
# compact buffer and writes `out[j]` = the sum (or max) of the contiguous run
# `a[j * reduce_size : (j + 1) * reduce_size]`. So the course's `NDArray.sum(axis)` first
# **moves the reduced axis last** with `permute` (a view), **compacts** it (a copy, unless the
# axis was already last), and then reduces runs of length $n_{axis}$. Summing a $(2, 3, 4)$
# array over axis 1 that way:

# %%
x3 = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
a3 = nd.array(x3, device=device)
moved = a3.permute((0, 2, 1))              # reduced axis last: shape (2, 4, 3), a view
runs = moved.compact()                     # 8 runs of 3 contiguous floats
out3 = nd.NDArray.make((2, 4), device=device)
mod.reduce_sum(runs._handle, out3._handle, 3)
print("runs:", runs.numpy().reshape(-1, 3).astype(int).tolist()[:3], "...")
print("sum over axis 1:\n", out3.numpy().astype(int))
assert np.array_equal(out3.numpy(), x3.sum(axis=1))
assert np.array_equal(a3.sum(axis=1).numpy(), x3.sum(axis=1))

# %% [markdown]
# The protocol's `reduce` skips the copy, as `ewise_binary` does: `NDArray` passes the permuted
# view (kept axes first, reduced axes last, any number of them) with its strides, and the
# compiled kernel picks a loop order from the layout. When the reduced run is contiguous it
# sums each run with SIMD; when the *kept* innermost axis is contiguous instead (the sum over
# axis 0 of a row-major matrix, a column sum, with rows of at least 8 floats) it adds whole
# rows into the output element-wise, so every load is still sequential; anything else walks
# the view. Sums accumulate in double precision. The call for the column sum of a $(3, 4)$
# matrix: shape $(4, 3)$, strides $(1, 4)$, one kept axis:

# %%
# companion-only: the device protocol (protocol.py, reduce)
x2 = np.arange(12, dtype=np.float32).reshape(3, 4)
a2 = nd.array(x2, device=device)
col_sum = nd.NDArray.make((4,), device=device)
mod.reduce(protocol.REDUCE_OPS.index("sum"), a2._handle, (4, 3), (1, 4), 0, 1, col_sum._handle)
print("column sums via reduce:", col_sum.numpy().astype(int))
assert np.array_equal(col_sum.numpy(), x2.sum(axis=0))

# %% [markdown]
# On a GPU a reduction is harder than an element-wise op: many threads must combine their
# values into one. The CUDA module (`reduce_impl` in `src/cuda/ndarray_backend_cuda.cu`) has three
# kernels and picks one from the shape:
#
# * **one thread per output** when the extents are short ($\le 8$) or for a column sum, where
#   neighbouring outputs are neighbours in memory, so the 32 threads of a warp read 32
#   consecutive floats (coalesced) at every step of their loops;
# * **one warp per output** for extents up to 1024: lane $\ell$ adds elements
#   $\ell, \ell + 32, \dots$, then the 32 partial sums are combined in $\log_2 32 = 5$
#   *shuffle* steps (`__shfl_down_sync`: lane $\ell$ adds lane $\ell + 16$'s value, then
#   $\ell + 8$'s, $4, 2, 1$), a tree, with no shared memory;
# * **one block per output** for longer extents: each warp reduces as above, the warp totals go
#   through shared memory to the first warp, which reduces them the same way. When there are
#   too few outputs to keep every multiprocessor busy, each extent is cut into chunks, one
#   block per chunk writes a partial, and a second launch reduces the partials.
#
# Here is the warp's tree in numpy (an emulation of the shuffle, not the CUDA code), and the
# order it adds in: after the five steps lane 0 holds the total, having added 32 values in 5
# dependent steps rather than 31. The different order also means a GPU sum differs from a
# sequential one in the last bits.

# %%
def warp_tree_sum(lanes: np.ndarray) -> float:
    """Lane 0's value after warp_reduce's five __shfl_down_sync steps (32 lanes)."""
    v = lanes.astype(np.float32).copy()
    for off in (16, 8, 4, 2, 1):
        shifted = np.concatenate([v[off:], v[-off:]])  # lanes past 31 read their own value
        v = v + shifted
    return float(v[0])


lanes = np.random.randn(32).astype(np.float32)
print(f"tree: {warp_tree_sum(lanes):.5f}   "  # float32 sums: 5 decimals are what agree
      f"sequential: {float(np.sum(lanes.astype(np.float64))):.5f}")
assert abs(warp_tree_sum(lanes) - lanes.astype(np.float64).sum()) < 1e-5
assert warp_tree_sum(np.arange(32)) == 496.0

# %% [markdown]
# ## 3. Matmul: flops against bytes moved
#
# $C = AB$ with $A \in \mathbb{R}^{m \times n}$, $B \in \mathbb{R}^{n \times p}$ costs $mnp$
# multiply-adds, i.e. $2mnp$ flops. What limits the speed is how many operands must be brought
# from a slower memory level for each of them. The **arithmetic intensity** of a loop nest is
# flops per float (or per byte) it loads from the level below.
#
# * The naive loop `for i, j, k: c[i][j] += a[i][k] * b[k][j]` loads two floats for every
#   multiply-add: $2mnp$ loads, **1 flop per float**, 0.25 flop per byte.
# * At the other extreme, if all three matrices fit in fast memory, each is moved once:
#   $mn + np + mp$ floats, $2n/3$ flops per float for square matrices.
#
# For $n = 1024$ that is a factor of 683 between the two:

# %%
N = 1024
flops = 2 * N**3
naive_loads = 2 * N**3
minimum_loads = 3 * N**2
print(f"flops for {N}^3:          {flops:,}")
print(f"naive loads:             {naive_loads:,} floats = {naive_loads * 4 / 2**30:.0f} GiB")
print(f"minimum (each once):     {minimum_loads:,} floats = {minimum_loads * 4 / 2**20:.0f} MiB")
print(f"intensity naive:         {flops / naive_loads:.2f} flop/float = "
      f"{flops / naive_loads / 4:.2f} flop/byte")
print(f"intensity upper bound:   {flops / minimum_loads:.2f} flop/float")
# arithmetic checks of the numbers in the text, not measurements
assert flops == 2_147_483_648 and naive_loads * 4 == 8 * 2**30 and minimum_loads * 4 == 12 * 2**20
assert abs(flops / minimum_loads - 682.67) < 0.01

# %% [markdown]
# Blocking is how a kernel moves from the first number towards the second, one memory level
# at a time: registers, then the caches, then main memory.
#
# ## 4. Register tiling: the micro-kernel
#
# The lecture's register tile keeps a $v_1 \times v_2$ block of $C$ in registers. Each step of
# the $k$ loop loads $v_1$ floats of $A$ and $v_2$ floats of $B$ and does $v_1 v_2$
# multiply-adds, so the intensity is
#
# $$\frac{2 v_1 v_2}{v_1 + v_2} \ \text{flops per float} \qquad
#   \text{(square tiles: } v \text{)},$$
#
# paid for with $v_1 v_2$ accumulator registers. The CPU module holds one copy of its kernels
# written with vector extensions over a vector of $VW$ floats and compiles it once per
# instruction set, each with its own $MR \times NR$ register block; at import it picks the
# widest set the CPU supports (or the one named by `NEEDLE_CPU_ISA`) and reports the choice
# and its constants in `__gemm__`. With AVX-512 (32 vector registers of 16 floats) the block
# is $12 \times 32$: 24 accumulator registers, two for the row of $B$, one for the broadcast
# element of $A$, 27 of 32. With AVX2 (16 registers of 8 floats) it is $6 \times 16$: 15 of
# 16. To show every variant this CPU can run, the next cell asks the module in a subprocess
# per instruction set (what it prints depends on the CPU, so it is not compared).

# %% tags=["nbval-ignore-output"]
# companion-only: this project's compiled module's __gemm__ (GEMM blocking, ISA dispatch)
GEMM = mod.__gemm__
REGISTERS = {"avx512": 32, "avx2": 16, "portable": 16}  # x86-64 vector registers per set


def gemm_config(isa: str) -> dict:
    """The compiled module's __gemm__ when NEEDLE_CPU_ISA=isa (read in a fresh process)."""
    code = ("import json; from needle.backend_ndarray import ndarray_backend_cpu as m; "
            "print(json.dumps(m.__gemm__))")
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "NEEDLE_CPU_ISA": isa},
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


CPU_CONFIGS = {isa: (GEMM if isa == GEMM["isa"] else gemm_config(isa))
               for isa in GEMM["available"]}


def register_intensity(cfg) -> float:
    """Flops per float loaded into registers by an MR x NR micro-kernel."""
    return 2 * cfg["MR"] * cfg["NR"] / (cfg["MR"] + cfg["NR"])


def registers_needed(cfg) -> int:
    """Vector registers: MR x NR accumulators, one row of B, one broadcast element of A."""
    return cfg["MR"] * cfg["NR"] // cfg["VW"] + cfg["NR"] // cfg["VW"] + 1


print("this build runs:", GEMM["isa"], "| this CPU can run:", ", ".join(GEMM["available"]))
print(f"{'kernel':<10}{'VW':>4}{'MR x NR':>10}{'registers used':>16}{'flop/float':>12}"
      f"{'flop/byte':>11}")
for name, cfg in CPU_CONFIGS.items():
    ai = register_intensity(cfg)
    print(f"{name:<10}{cfg['VW']:>4}{cfg['MR']:>5} x {cfg['NR']:<4}"
          f"{f'{registers_needed(cfg)} of {REGISTERS[name]}':>16}{ai:>12.2f}{ai / 4:>11.2f}")

# %% [markdown]
# Whatever the machine, each variant's block must fit its register file and be made of whole
# vectors, and the chosen variant is one the CPU can run:

# %%
# companion-only: this project's compiled module's __gemm__ (GEMM blocking, ISA dispatch)
assert GEMM["isa"] in GEMM["available"] and GEMM["isa"] == mod.__matmul_kernel__
for name, cfg in CPU_CONFIGS.items():
    assert cfg["isa"] == name and cfg["NR"] % cfg["VW"] == 0
    assert registers_needed(cfg) <= REGISTERS[name]
    assert register_intensity(cfg) > 1  # more reuse than the naive loop's 1 flop per float

# %% [markdown]
# ## 5. Cache blocking: packing panels
#
# Registers hold one $MR \times NR$ block of $C$; the operands it streams through must come
# from cache, not from memory. The blocked driver (Goto/BLIS style; `gemm_blocked` in
# `src/cpu/ndarray_backend_cpu_kernels.cc`) runs, on one thread:
#
# ```
# pack all of B into NR-wide slivers                       (once)
# for ic in 0..m step MC:                  rows of C
#   for pc in 0..n step KC:                a K panel
#     pack A[ic:ic+MC, pc:pc+KC] into MR-tall slivers      (the A block, ~L2)
#     for jr over the NR-wide slivers of B:                (one KC x NR sliver, ~L1)
#       for ir over the MR-tall slivers of the A block:
#         micro-kernel: C[MR x NR] += A sliver @ B sliver   (registers)
# ```
#
# Packing copies each block into the exact order the micro-kernel reads it (contiguous,
# aligned, zero-padded at the edges), so every load in the inner loop is sequential. Each
# level has its own intensity, set by one pair of block sizes:
#
# * **L1 → registers**: $2/(1/MR + 1/NR)$, as above;
# * **caches → L1**: the A block is re-read once per B sliver ($mnp/NR$ floats) and each B
#   sliver is fetched once per row block ($mnp/MC$): $2/(1/NR + 1/MC)$;
# * **memory**: $A$ and $B$ are read once, and each K panel reads and writes $C$ again:
#   $mn + np + mp(2\lceil n/KC \rceil - 1)$ floats, whose intensity tends to $KC$ for large $n$.
#
# The footprints explain the sizes, with one caveat. The A block ($MC \times KC$) is sized for
# L2 (at least 256 KiB on x86-64 cores). The B sliver ($KC \times NR$) is what the
# micro-kernel streams through for every A sliver, and the BLIS rule of thumb keeps it to
# about **half** of L1 (32 KiB of data cache on most x86-64 cores; some recent ones have
# 48 KiB), leaving the rest for the A sliver and the block of $C$. The table below shows where
# each variant stands. With AVX-512, $KC = 256$ and $NR = 32$ make the sliver 32 KiB, all of
# such an L1, so part of it is evicted and re-read from L2 on each pass. The same table says
# why that costs little: per step of its $k$ loop the micro-kernel reads $4\,NR$ bytes of $B$
# and issues $MR \cdot NR / VW$ vector FMAs, so at two FMAs per clock it needs only
# $8\,VW/MR$ bytes of $B$ per clock, which L2 delivers several times over. Whether a smaller
# $KC$ would be faster is not measured here.
#
# The memory count makes one more assumption: **packed B stays in cache**. Every row block of
# A streams over all of packed B, $4np$ bytes (4 MiB for $n = p = 1024$; in the C++, over its
# column group's share, up to 1024 columns wide), so the count holds only while that fits in
# the last-level cache beside everything else. When it does not (at $n = 4096$ the model's
# packed B is 64 MiB, the C++'s column-group share 16 MiB: more than many CPUs' L3, or than
# a core's share of it), packed B comes from memory again for each of the
# $\lceil m/MC \rceil$ row blocks: $mn + np\lceil m/MC \rceil + mp(2\lceil n/KC \rceil - 1)$
# floats, and the memory intensity falls from about $KC$ towards $2/(1/MC + 2/KC)$ (the cell
# after the counts below prints both).

# %% tags=["nbval-ignore-output"]
# companion-only: the GEMM configurations of the companion-only cells above
L1D = "/sys/devices/system/cpu/cpu0/cache/index0/size"  # Linux: this machine's L1 data cache
print("this machine's L1 data cache:", open(L1D).read().strip() if os.path.exists(L1D) else "?")
print(f"{'kernel':<10}{'B sliver KC x NR':>18}{'of 32 KiB L1':>14}{'A block MC x KC (L2)':>22}"
      f"{'B bytes/clock':>15}")
for name, cfg in CPU_CONFIGS.items():
    sliver, block = cfg["KC"] * cfg["NR"] * 4, cfg["MC"] * cfg["KC"] * 4
    b_per_clock = 4 * cfg["NR"] / (cfg["MR"] * cfg["NR"] / cfg["VW"] / 2)  # 2 FMAs per clock
    print(f"{name:<10}{sliver // 1024:>14} KiB{100 * sliver / 32768:>13.0f}%"
          f"{block // 1024:>18} KiB{b_per_clock:>15.1f}")
    assert cfg["MC"] % cfg["MR"] == 0  # an A block is whole MR slivers
    assert block <= 256 * 1024 and abs(b_per_clock - 8 * cfg["VW"] / cfg["MR"]) < 1e-9

# %% [markdown]
# Here is that loop nest in numpy, with counters for the floats each level supplies. It is a
# model of the C++ (one thread, no threading split), and we check it two ways: it computes
# $AB$ (on sizes that exercise partial blocks and edge slivers), and its counts match the
# closed-form formulas above.

# %%
# companion-only: the GEMM configurations of the companion-only cells above
def blocked_matmul(A: np.ndarray, B: np.ndarray, cfg: dict, compute: bool = True):
    """C = A @ B by gemm_blocked's loop nest (one thread), and the floats moved per level.

    A (m, n), B (n, p). Returns (C (m, p) or None when compute=False, counts) with counts
    'registers' (L1 -> registers), 'caches' (into L1) and 'memory' (from main memory).
    """
    MR, NR, KC, MC = cfg["MR"], cfg["NR"], cfg["KC"], cfg["MC"]
    (m, n), p = A.shape, B.shape[1]
    nsl = math.ceil(p / NR)
    counts = {"registers": 0, "caches": 0, "memory": n * p}  # B read once, when packed
    if compute:
        Bp = np.zeros((n, nsl * NR))
        Bp[:, :p] = B  # the packed slivers, zero-padded to whole NR
        Cp = np.zeros((m + MR, nsl * NR))
    for ic in range(0, m, MC):
        mc = min(MC, m - ic)
        nsla = math.ceil(mc / MR)
        for pc in range(0, n, KC):
            kc = min(KC, n - pc)
            counts["memory"] += mc * kc + mc * p * (1 if pc == 0 else 2)  # A block; C rows
            if compute:
                Ap = np.zeros((nsla * MR, kc))
                Ap[:mc] = A[ic:ic + mc, pc:pc + kc]
            for jr in range(nsl):
                counts["caches"] += kc * NR  # this B sliver, once per row block
                for ir in range(nsla):
                    counts["caches"] += kc * MR  # the A sliver streams past it
                    counts["registers"] += kc * (MR + NR)
                    if compute:
                        rows = slice(ic + ir * MR, ic + (ir + 1) * MR)
                        cols = slice(jr * NR, (jr + 1) * NR)
                        Cp[rows, cols] += Ap[ir * MR:(ir + 1) * MR] @ Bp[pc:pc + kc, cols]
    return (Cp[:m, :p] if compute else None), counts


def closed_form(m: int, n: int, p: int, cfg: dict) -> dict:
    """The same counts from the formulas in the text (MC a multiple of MR)."""
    MR, NR, KC, MC = cfg["MR"], cfg["NR"], cfg["KC"], cfg["MC"]
    rows, nsl = math.ceil(m / MR), math.ceil(p / NR)
    return {"registers": n * rows * nsl * (MR + NR),
            "caches": n * nsl * (rows * MR + math.ceil(m / MC) * NR),
            "memory": m * n + n * p + m * p * (2 * math.ceil(n / KC) - 1)}


rng = np.random.default_rng(0)
A_odd, B_odd = rng.standard_normal((100, 300)), rng.standard_normal((300, 70))
for name, cfg in CPU_CONFIGS.items():
    C_model, counts = blocked_matmul(A_odd, B_odd, cfg)
    assert np.allclose(C_model, A_odd @ B_odd, rtol=1e-12, atol=1e-10)
    assert counts == closed_form(100, 300, 70, cfg)
got = (nd.array(A_odd, device=device) @ nd.array(B_odd, device=device)).numpy()  # the C++ kernel
err = np.abs(got - A_odd @ B_odd).max() / np.abs(A_odd @ B_odd).max()
print(f"model == numpy for all three configurations; C++ matmul rel. error < 1e-5: {err < 1e-5}")
assert err < 1e-5

# %% [markdown]
# Now the counts for a $1024^3$ product. Padding rows up to whole $MR$ slivers (1024 is not a
# multiple of 12) costs a little against the formulas' ideal values:

# %% tags=["nbval-ignore-output"]
# companion-only: the GEMM configurations of the companion-only cells above
def intensities(cfg: dict, n: int = N) -> dict:
    """Flops per float at each level for an n^3 product, from the loop-nest model."""
    _, counts = blocked_matmul(np.empty((n, n)), np.empty((n, n)), cfg, compute=False)
    assert counts == closed_form(n, n, n, cfg)
    return {level: 2 * n**3 / c for level, c in counts.items()}


levels = {name: intensities(cfg) for name, cfg in CPU_CONFIGS.items()}
print(f"flops per float moved, {N}^3 product (ideal, for n -> infinity, in brackets)")
print(f"{'kernel':<10}{'L1->registers':>20}{'caches->L1':>20}{'memory':>20}")
for name, cfg in CPU_CONFIGS.items():
    ideal = [register_intensity(cfg), 2 / (1 / cfg["NR"] + 1 / cfg["MC"]), cfg["KC"]]
    cells = [f"{v:7.2f} [{i:6.2f}]" for v, i in zip(levels[name].values(), ideal)]
    print(f"{name:<10}" + "".join(f"{c:>20}" for c in cells))
    got = list(levels[name].values())
    assert 1 < got[0] < got[1] < got[2]  # each level reuses more than the one below it
    # padding to whole slivers costs a little; C is re-read once per K panel: 2n / (1 + 2n/KC)
    assert all(0.9 * i < v <= i for v, i in zip(got[:2], ideal))
    assert abs(got[2] - 2 * N / (1 + 2 * N / cfg["KC"])) < 1e-9 * got[2]

# %% [markdown]
# The same model with packed B re-read from memory by every row block (the case above where it
# does not fit in the last-level cache), against the count that assumes it stays:

# %% tags=["nbval-ignore-output"]
# companion-only: the GEMM configurations of the companion-only cells above
def memory_floats(n: int, cfg: dict, b_cached: bool) -> int:
    """Floats from main memory for an n^3 product: packed B kept in cache, or re-read per row
    block of A."""
    MC, KC = cfg["MC"], cfg["KC"]
    b_reads = n * n * (1 if b_cached else math.ceil(n / MC))
    return n * n + b_reads + n * n * (2 * math.ceil(n / KC) - 1)


print(f"{'n':>6}{'packed B':>12}{'B stays cached':>18}{'B re-read':>14}"
      f"   (flop per float, {GEMM['isa']})")
for n_ in (1024, 4096):
    kept, spilled = (2 * n_**3 / memory_floats(n_, GEMM, c) for c in (True, False))
    print(f"{n_:>6}{4 * n_ * n_ / 2**20:>9.0f} MiB{kept:>18.1f}{spilled:>14.1f}")
    assert spilled < kept
    assert memory_floats(n_, GEMM, True) == closed_form(n_, n_, n_, GEMM)["memory"]
limit = 2 / (1 / GEMM["MC"] + 2 / GEMM["KC"])
print(f"large-n limit when B is re-read: 2 / (1/MC + 2/KC) = {limit:.1f}")

# %% [markdown]
# Each level multiplies the reuse of the one below it: in the table of counts above, for every
# instruction set this CPU runs, the naive loop's 1 flop per float grows from column to column,
# registers, then L1, then main memory (the assert in that cell checks the order). That, plus
# SIMD and threads, is the gap between `matmul_naive` and `matmul` in notebook 05's figure.
#
# ## 6. The tiled layout of the homework's `matmul_tiled`
#
# The course's hw3 asks for a second kind of blocking, in the *data layout*: with $m, n, p$
# multiples of `__tile_size__` $= T$, each operand is rewritten as a compact array of
# $T \times T$ tiles and `matmul_tiled` multiplies tile by tile (`NDArray.matmul_tiled` runs
# that route; `@` takes the blocked engine above, which packs its own panels). The rewrite is one
# `as_strided` view: for an $(r, c)$ row-major matrix, tile $(i, j)$ element $(u, v)$ is
# element $(iT + u,\ jT + v)$, at buffer position $(iT+u)c + jT + v$, so
#
# $$\text{shape } (r/T,\ c/T,\ T,\ T), \qquad \text{strides } (cT,\ T,\ c,\ 1).$$
#
# On a $4 \times 6$ matrix with $T = 2$ (to keep it printable), the strides are $(12, 2, 6, 1)$:

# %%
T2 = 2
A_np = np.arange(24).reshape(4, 6)
A_nd = nd.array(A_np, device=device)
tile_view = A_nd.as_strided((4 // T2, 6 // T2, T2, T2), (6 * T2, T2, 6, 1))
print("shape", tile_view.shape, "strides", tile_view.strides)
print("tile (1, 2):\n", tile_view.numpy()[1, 2].astype(int))
for i in range(4 // T2):
    for j in range(6 // T2):
        block = A_np[i * T2:(i + 1) * T2, j * T2:(j + 1) * T2]
        assert np.array_equal(tile_view.numpy()[i, j], block)
assert tile_view.strides == (12, 2, 6, 1) and tile_view._handle.ptr() == A_nd._handle.ptr()

# %% [markdown]
# The view shares `A`'s buffer; `compact()` then copies it so that **each tile is contiguous**
# — tile $(0, 0)$ is the first four floats, tile $(0, 1)$ the next four:

# %%
tiled_buf = tile_view.compact().numpy().ravel().astype(int)
print("compact tiled buffer:", tiled_buf.reshape(-1, T2 * T2).tolist())
assert tiled_buf[:8].tolist() == [0, 1, 6, 7, 2, 3, 8, 9]

# %% [markdown]
# With the real tile size the whole tiled route is: tile both operands, `matmul_tiled`
# writes a tiled $(m/T, p/T, T, T)$ output, and `permute((0, 2, 1, 3))` plus `compact` turns
# it back into rows. Redoing it by hand gives exactly what `NDArray.matmul_tiled` returns (the
# same kernel), and, to rounding, what `@` and numpy return (other summation orders):

# %%
# companion-only: this project's compiled module's __gemm__ and NDArray.matmul_tiled
T = GEMM["tile"]
assert T == mod.__tile_size__


def to_tiles(x: nd.NDArray) -> nd.NDArray:
    """x (r, c), compact, as a compact (r/T, c/T, T, T) array of T x T tiles."""
    r, c = x.shape
    return x.as_strided((r // T, c // T, T, T), (c * T, T, c, 1)).compact()


m, n, p = 2 * T, 3 * T, 4 * T
xa = np.random.randn(m, n).astype(np.float32)
xb = np.random.randn(n, p).astype(np.float32)
a_nd, b_nd = nd.array(xa, device=device), nd.array(xb, device=device)
out = nd.NDArray.make((m // T, p // T, T, T), device=device)
mod.matmul_tiled(to_tiles(a_nd)._handle, to_tiles(b_nd)._handle, out._handle, m, n, p)
by_hand = out.permute((0, 2, 1, 3)).compact().reshape((m, p)).numpy()
print(f"({m}, {n}) @ ({n}, {p}) with {T}x{T} tiles; output tiles: {out.shape}")
assert np.array_equal(by_hand, a_nd.matmul_tiled(b_nd).numpy())
assert np.allclose(by_hand, (a_nd @ b_nd).numpy(), rtol=1e-5, atol=1e-5)
assert np.allclose(by_hand, xa.astype(np.float64) @ xb, rtol=1e-5, atol=1e-5)

# %% [markdown]
# Why bother: a $T \times T$ tile of a row-major matrix is $T$ short pieces of $T$ floats, one
# per row, scattered through memory; in the tiled layout it is one run of $T^2$ floats. For
# $T = 8$ that is 256 bytes, exactly four 64-byte cache lines, where a $1024$-wide row-major
# matrix spreads the same tile over 8 lines, each only half used.

# %%
# companion-only: the tile size T of the companion-only cell above
tile_bytes, line = T * T * 4, 64
print(f"tile: {tile_bytes} bytes = {tile_bytes // line} cache lines (tiled) "
      f"vs {T} lines of which {T * 4} bytes used (row-major)")
assert tile_bytes % line == 0  # a tile is whole cache lines

# %% [markdown]
# ## 7. The CUDA matmul kernel
#
# `matmul_kernel` in `src/cuda/ndarray_backend_cuda.cu` is a template over the tile sizes
# `<BM, BN, BK, TM, TN>`:
#
# * The **grid** has one block per $BM \times BN$ tile of $C$ ($\lceil m/BM \rceil \cdot \lceil
#   p/BN \rceil$ blocks, numbered row-major through the tiles).
# * A **block** has $(BM/TM)\cdot(BN/TN)$ threads arranged as a $TY \times TX$ grid; thread
#   $(ty, tx)$ owns a $TM \times TN$ set of outputs, rows $ty + i\,TY$ and columns $tx + j\,TX$
#   (strided by the thread grid, so neighbouring threads own neighbouring columns).
# * For each step $k_0$ of $BK$ along the inner dimension, the block's threads cooperatively
#   copy a $BM \times BK$ tile of $A$ (stored **transposed**, with `BM + 4` columns of padding)
#   and a $BK \times BN$ tile of $B$ into **shared memory**, `__syncthreads()`, and each thread
#   accumulates its $TM \times TN$ outer products in registers.
#
# The launcher picks one of two instantiations: $128 \times 128$ tiles with $8 \times 8$ per
# thread when that still gives at least two blocks per multiprocessor (SM), else
# $64 \times 64$ tiles with $4 \times 4$ per thread, so that more blocks keep every SM busy.

# %%
CUDA_CONFIGS = [tuple(int(v) for v in g) for g in
                re.findall(r"launch_matmul<(\d+), (\d+), (\d+), (\d+), (\d+)>\(", cu)]
PAD = constant(cu, r"__shared__ float As\[BK\]\[BM \+ (\d+)\];")
PAD_B = ([int(v) for v in re.findall(r"__shared__ float Bs\[BK\]\[BN \+ (\d+)\];", cu)]
         or [0])[0]  # Bs is stored untransposed; a kernel may pad it too
BLOCKS_PER_SM = constant(cu, r"big_tiles >= (\d+) \* static_cast<\w+>\(sm_count\(\)\)")
BIG, SMALL = CUDA_CONFIGS
print("BM, BN, BK, TM, TN:", "big", BIG, "| small", SMALL, "| As padding:", PAD,
      "| Bs padding:", PAD_B, "| blocks per SM:", BLOCKS_PER_SM)
for BM_, BN_, BK_, TM_, TN_ in CUDA_CONFIGS:  # what the kernel's static_assert demands
    threads_ = (BM_ // TM_) * (BN_ // TN_)
    assert BM_ % TM_ == BN_ % TN_ == 0 and (BM_ * BK_) % threads_ == (BK_ * BN_) % threads_ == 0
assert BIG[0] * BIG[1] > SMALL[0] * SMALL[1]


def cuda_config(m: int, p: int, sms: int) -> tuple:
    """The tile configuration the launcher picks for an (m, p) output on a GPU with `sms` SMs."""
    big_tiles = math.ceil(m / BIG[0]) * math.ceil(p / BIG[1])
    return BIG if big_tiles >= BLOCKS_PER_SM * sms else SMALL


def cuda_launch(m: int, n: int, p: int, cfg: tuple) -> dict:
    """Grid, block and memory-traffic numbers of matmul_kernel<cfg> for (m, n) @ (n, p)."""
    BM, BN, BK, TM, TN = cfg
    tiles_m, tiles_p = math.ceil(m / BM), math.ceil(p / BN)
    return {
        "blocks": tiles_m * tiles_p,
        "threads per block": (BM // TM) * (BN // TN),
        "shared bytes per block": 4 * (BK * (BM + PAD) + BK * (BN + PAD_B)),
        # every in-range element of A is loaded once per column of tiles, B once per row
        "global reads (floats)": n * (m * tiles_p + p * tiles_m),
        # each thread, each k: TM + TN shared loads for TM * TN multiply-adds
        "shared reads (floats)": m * n * p * (TM + TN) // (TM * TN),
    }

# %% [markdown]
# For a $1024^3$ product on an H200 (132 SMs): $8 \times 8 = 64$ big tiles are fewer than
# $2 \cdot 132$, so the launcher takes the $64 \times 64$ kernel: **256 blocks of 256
# threads**, each with $4\,(BK\,(BM + \text{pad}_A) + BK\,(BN + \text{pad}_B))$ bytes of
# shared memory (about 4 KiB). A GPU with at most 32 SMs would get the $128 \times 128$
# kernel: 64 blocks, about 8 KiB each.
#
# The tiling pays off in global-memory traffic. Without it, one thread per output reading its
# row of $A$ and column of $B$ loads $2n^3 = 2^{31}$ floats (8 GiB). With $BM \times BN$
# tiles, each element of $A$ is loaded once per column of tiles and each element of $B$ once
# per row of tiles: $2^{25}$ floats (128 MiB) for $64 \times 64$, 64 times less; $2^{24}$
# (64 MiB) for $128 \times 128$.

# %%
assert cuda_config(N, N, sms=132) == SMALL == cuda_config(N, N, sms=33)
assert cuda_config(N, N, sms=32) == BIG
untiled = 2 * N**3
print(f"{'':<26}{'64x64 tiles':>16}{'128x128 tiles':>16}")
plans = {cfg: cuda_launch(N, N, N, cfg) for cfg in (SMALL, BIG)}
for key in plans[SMALL]:
    print(f"{key:<26}{plans[SMALL][key]:>16,}{plans[BIG][key]:>16,}")
print(f"{'untiled global reads':<26}{untiled:>16,}{untiled:>16,}")
print(f"{'reduction':<26}{untiled // plans[SMALL]['global reads (floats)']:>15}x"
      f"{untiled // plans[BIG]['global reads (floats)']:>15}x")
for cfg in (SMALL, BIG):
    assert 4 * cfg[2] * (cfg[0] + cfg[1]) <= plans[cfg]["shared bytes per block"] <= 48 * 1024
assert {k: v for k, v in plans[SMALL].items() if k != "shared bytes per block"} == {
    "blocks": 256, "threads per block": 256, "global reads (floats)": 2**25,
    "shared reads (floats)": 2**29}
assert {k: v for k, v in plans[BIG].items() if k != "shared bytes per block"} == {
    "blocks": 64, "threads per block": 256, "global reads (floats)": 2**24,
    "shared reads (floats)": 2**28}
assert untiled == 2**31 and untiled * 4 == 8 * 2**30
assert [untiled // plans[c]["global reads (floats)"] for c in (SMALL, BIG)] == [64, 128]
assert [untiled // plans[c]["shared reads (floats)"] for c in (SMALL, BIG)] == [4, 8]

# %% [markdown]
# The reduction is the tile size: $2/(1/BM + 1/BN)$, the same formula as the CPU's register
# tile one level up. Inside the block, the per-thread register tile does it again: each
# thread loads $TM + TN$ floats from shared memory per $TM \cdot TN$ multiply-adds, a factor
# $4$ ($4 \times 4$) or $8$ ($8 \times 8$) fewer shared-memory reads than one per operand.
#
# To check the mapping, here is the kernel **emulated in numpy**: its thread index arithmetic,
# copied from the source by hand (vectorised over the threads of a block), on sizes that are
# not multiples of the tiles. Every output must be written by exactly one thread, the product
# must match, and the global loads must match the formula. Say it plainly: this runs no CUDA
# code. It checks the tiling scheme and this emulation of it; a bug in the `.cu` file itself
# (an index typo, a missing `__syncthreads()`, a wrong launch) would pass here. The CUDA
# kernel itself is tested against numpy by `tests/framework/test_cuda_backend.py` on a machine
# with a GPU (those tests skip elsewhere). The coalescing and bank-conflict audit below is the
# same kind of emulation.

# %%
# companion-only: the random stream rng of a companion-only cell above
def emulate_matmul_kernel(A: np.ndarray, B: np.ndarray, cfg: tuple):
    """matmul_kernel<cfg> in numpy: returns (C, writes per output, global loads)."""
    BM, BN, BK, TM, TN = cfg
    TX, TY = BN // TN, BM // TM
    threads = TX * TY
    (M, K), P = A.shape, B.shape[1]
    tiles_p = math.ceil(P / BN)
    tid = np.arange(threads)
    tx, ty = tid % TX, tid // TX
    C, writes, loads = np.zeros((M, P)), np.zeros((M, P), dtype=int), 0
    for block in range(math.ceil(M / BM) * tiles_p):
        row0, col0 = (block // tiles_p) * BM, (block % tiles_p) * BN
        acc = np.zeros((threads, TM, TN))
        for k0 in range(0, K, BK):
            As, Bs = np.zeros((BK, BM + PAD)), np.zeros((BK, BN))
            for l in range(BM * BK // threads):  # cooperative loads: thread tid takes idx
                idx = tid + l * threads
                r, c = idx // BK, idx % BK  # A tile element (r, c) -> As[c][r]
                ok = (row0 + r < M) & (k0 + c < K)
                As[c[ok], r[ok]] = A[row0 + r[ok], k0 + c[ok]]
                loads += ok.sum()
            for l in range(BK * BN // threads):
                idx = tid + l * threads
                r, c = idx // BN, idx % BN
                ok = (k0 + r < K) & (col0 + c < P)
                Bs[r[ok], c[ok]] = B[k0 + r[ok], col0 + c[ok]]
                loads += ok.sum()
            for k in range(BK):  # after __syncthreads(): registers ra, rb, outer product
                ra = As[k][ty[:, None] + np.arange(TM) * TY]  # (threads, TM)
                rb = Bs[k][tx[:, None] + np.arange(TN) * TX]  # (threads, TN)
                acc += ra[:, :, None] * rb[:, None, :]
        rows = np.broadcast_to((row0 + ty[:, None] + np.arange(TM) * TY)[:, :, None], acc.shape)
        cols = np.broadcast_to((col0 + tx[:, None] + np.arange(TN) * TX)[:, None, :], acc.shape)
        ok = (rows < M) & (cols < P)
        C[rows[ok], cols[ok]] = acc[ok]
        np.add.at(writes, (rows[ok], cols[ok]), 1)
    return C, writes, loads


for cfg, (M, K, P) in [(SMALL, (70, 20, 130)), (BIG, (150, 9, 140))]:
    A_t, B_t = rng.standard_normal((M, K)), rng.standard_normal((K, P))
    C_t, writes, loads = emulate_matmul_kernel(A_t, B_t, cfg)
    assert np.allclose(C_t, A_t @ B_t) and (writes == 1).all()
    assert loads == cuda_launch(M, K, P, cfg)["global reads (floats)"]
    print(f"{cfg}: ({M}, {K}) @ ({K}, {P}) correct, each output written once, "
          f"{loads:,} global loads")

# %% [markdown]
# ### Memory access patterns: coalescing and bank conflicts
#
# The *order* of the accesses matters as much as their number. A warp (32 threads) reading
# global memory is served in 32-byte **sectors**: 32 consecutive floats need the minimum of 4.
# Shared memory has 32 **banks** (word $w$ lives in bank $w \bmod 32$); threads of a warp that
# hit different words of one bank are serialised (a $d$-way conflict), while threads reading
# the same word get it broadcast.
#
# The padding is for the transposed store into `As`. In the cooperative load, thread `tid`
# takes element `idx = tid + l * threads` of the $BM \times BK$ tile of $A$, at row
# `r = idx // BK` and column `c = idx % BK`: consecutive threads take **consecutive columns of
# one row** (consecutive $k$, so the global read of $A$'s row is contiguous), and after $BK$
# threads the next row starts. Each thread stores its element transposed, at word
# $c\,(BM + \text{pad}) + r$ of `As`, so consecutive threads write words $BM + \text{pad}$
# apart. A warp covers 4 rows of 8 columns. With no padding, $BM = 64$ is a multiple of 32:
# the bank is $r \bmod 32$ whatever the column, so the warp's 32 stores land in 4 banks, 8
# distinct words each, an 8-way conflict. With 4 words of padding, column $c$ shifts by $4c$
# banks and all 32 threads hit distinct banks. The audit below replays the first warp's index
# arithmetic from the kernel:

# %%
def bank_conflict(words) -> int:
    """The worst number of distinct words a warp's access needs from one shared-memory bank."""
    per_bank: dict[int, set] = {}
    for w in np.asarray(words).ravel():
        per_bank.setdefault(int(w) % 32, set()).add(int(w))
    return max(len(s) for s in per_bank.values())


def sectors(addresses) -> int:
    """32-byte sectors touched by a warp's float32 global access (addresses in floats)."""
    return len({int(a) * 4 // 32 for a in np.asarray(addresses).ravel()})


def audit(cfg: tuple, pad: int, n: int = N) -> dict:
    """Worst case over the first warp's accesses in matmul_kernel<cfg> (square n, k0 = 0)."""
    BM, BN, BK, TM, TN = cfg
    TX, TY = BN // TN, BM // TM
    tid = np.arange(32)  # warp 0
    tx, ty = tid % TX, tid // TX
    idx_a = tid[None, :] + np.arange(BM * BK // (TX * TY))[:, None] * TX * TY
    idx_b = tid[None, :] + np.arange(BK * BN // (TX * TY))[:, None] * TX * TY
    ra, ca = idx_a // BK, idx_a % BK
    rb, cb = idx_b // BN, idx_b % BN
    return {
        "A load (sectors)": max(sectors(r * n + c) for r, c in zip(ra, ca)),
        "B load (sectors)": max(sectors(r * n + c) for r, c in zip(rb, cb)),
        "C store (sectors)": max(sectors((ty + i * TY) * n + tx + j * TX)
                                 for i in range(TM) for j in range(TN)),
        "As store (conflict)": max(bank_conflict(c * (BM + pad) + r) for r, c in zip(ra, ca)),
        "Bs store (conflict)": max(bank_conflict(r * (BN + PAD_B) + c) for r, c in zip(rb, cb)),
        "As read (conflict)": max(bank_conflict(k * (BM + pad) + ty + i * TY)
                                  for k in range(BK) for i in range(TM)),
        "Bs read (conflict)": max(bank_conflict(k * (BN + PAD_B) + tx + j * TX)
                                  for k in range(BK) for j in range(TN)),
    }


report = {(cfg, pad): audit(cfg, pad) for cfg in (SMALL, BIG) for pad in (PAD, 0)}
print(f"{'':<22}" + "".join(f"{f'{c[0]}x{c[1]} pad={p}':>15}" for c, p in report))
for key in report[(SMALL, PAD)]:
    print(f"{key:<22}" + "".join(f"{r[key]:>15}" for r in report.values()))
for cfg in (SMALL, BIG):
    assert set(report[(cfg, PAD)].values()) <= {1, 4}  # 4 sectors = 128 bytes: ideal
    assert report[(cfg, 0)]["As store (conflict)"] == 8  # what the padding removes

# %% [markdown]
# With the padding, every global access of a warp touches the minimum 4 sectors and every
# shared-memory access is conflict-free (the `As` reads hit only two words per warp, which
# are broadcast).
#
# ## 8. Where the kernels sit on a roofline
#
# A **roofline** bounds a kernel's speed by $\min(\text{peak flops},\ \text{intensity} \times
# \text{bandwidth})$, with one bandwidth term for every memory the kernel reads. With NVIDIA's
# datasheet figures for an H200 SXM (67 TFLOP/s FP32 without tensor cores, 4.8 TB/s HBM), the
# ridge of global memory, where its limit meets the peak, is at 13.96 flop/byte. Counting every
# global load as memory traffic (the 50 MB L2 cache catches many of them in practice, so this
# is the pessimistic view), the untiled product at 0.25 flop/byte could reach at most
# 1.2 TFLOP/s, under 2% of peak; $64 \times 64$ tiles (16 flop/byte) sit past that ridge, and
# $128 \times 128$ tiles (32 flop/byte) clear it by more than a factor of two.
#
# Global memory is not the only roof. Section 7 counted the **shared-memory** reads too: each
# thread loads $TM + TN$ floats from shared memory per $TM \cdot TN$ multiply-adds, i.e.
# $2\,TM\,TN / (4(TM + TN))$ flop per shared byte: 1 for the $4 \times 4$ register tiles of the
# $64 \times 64$ kernel, 2 for the $8 \times 8$ ones. An SM's shared memory delivers 32 banks
# × 4 bytes = 128 bytes per clock, while its 128 FP32 lanes do 256 flops per clock, so its
# ridge is at 2 flop/byte; over 132 SMs at the 1.98 GHz boost clock (the clock that gives the
# datasheet's 67 TFLOP/s) that is 33.5 TB/s. The $64 \times 64$ configuration, the one the
# launcher picks for $1024^3$ on an H200, is therefore capped near **half** of FP32 peak by
# shared memory, whatever its global intensity; the $128 \times 128$ one sits exactly at the
# shared-memory ridge, so even its bound leaves no slack. (Both are bounds: latency, occupancy
# and instruction overhead take real kernels further below them.) The left panel puts all the
# traffic counts of this notebook side by side; the right one draws the global-memory roof
# (hollow markers on it) and marks the shared-memory cap below it with filled markers.

# %%
PEAK, BANDWIDTH = 67e12, 4.8e12  # H200 SXM datasheet: FP32 flop/s, HBM bytes/s
SMS, CLOCK = 132, 1.98e9  # H200 SXM: SMs, boost clock (132 * 128 lanes * 2 * CLOCK = PEAK)
SHARED_BW = SMS * 32 * 4 * CLOCK  # shared memory: 32 banks x 4 bytes per clock per SM
ridge, shared_ridge = PEAK / BANDWIDTH, PEAK / SHARED_BW
gpu_points = {"untiled": flops / (untiled * 4),
              "64x64 tiles": flops / (plans[SMALL]["global reads (floats)"] * 4),
              "128x128 tiles": flops / (plans[BIG]["global reads (floats)"] * 4)}
shared_points = {"untiled": math.inf,  # reads no shared memory
                 "64x64 tiles": flops / (plans[SMALL]["shared reads (floats)"] * 4),
                 "128x128 tiles": flops / (plans[BIG]["shared reads (floats)"] * 4)}
memory_bound = {k: min(PEAK, ai * BANDWIDTH) for k, ai in gpu_points.items()}
bound = {k: min(memory_bound[k], shared_points[k] * SHARED_BW) for k in gpu_points}
print(f"{'':<14}{'global':>9}{'shared':>9}   at most TFLOP/s (% of FP32 peak)")
print(f"{'':<14}{'flop/B':>9}{'flop/B':>9}   {'global roof only':>18}{'both roofs':>18}")
for k, ai in gpu_points.items():
    print(f"{k:<14}{ai:9.2f}{shared_points[k]:9.2f}   {memory_bound[k] / 1e12:8.2f} "
          f"({100 * memory_bound[k] / PEAK:5.1f}%){bound[k] / 1e12:9.2f} "
          f"({100 * bound[k] / PEAK:5.1f}%)")
print(f"ridges: global memory {ridge:.2f} flop/byte, shared memory {shared_ridge:.2f} flop/byte "
      f"({SHARED_BW / 1e12:.1f} TB/s)")
# arithmetic on the datasheet constants above (they check the text's numbers, not a GPU)
assert abs(ridge - 13.96) < 0.01 and abs(bound["untiled"] / 1e12 - 1.2) < 1e-9
assert bound["untiled"] / PEAK < 0.02
assert gpu_points["64x64 tiles"] == 16 > ridge and gpu_points["128x128 tiles"] == 32 > 2 * ridge
assert abs(SMS * 128 * 2 * CLOCK - PEAK) < 0.01 * PEAK  # the clock matches the datasheet peak
assert shared_points["64x64 tiles"] == 1 and shared_points["128x128 tiles"] == 2
assert 0.45 < bound["64x64 tiles"] / PEAK < 0.55 and bound["128x128 tiles"] / PEAK > 0.95

# %%
# companion-only: this project's compiled module's __gemm__ (GEMM blocking)
cpu_cfg = GEMM  # this build's blocking
cpu_counts = closed_form(N, N, N, cpu_cfg)
traffic = {
    "naive loop (2n³)": naive_loads,
    f"CPU: L1 → registers ({cpu_cfg['MR']}×{cpu_cfg['NR']})": cpu_counts["registers"],
    "CPU: caches → L1 (NR, MC)": cpu_counts["caches"],
    "CPU: memory (KC)": cpu_counts["memory"],
    "GPU: global, 64×64 tiles": plans[SMALL]["global reads (floats)"],
    "GPU: global, 128×128 tiles": plans[BIG]["global reads (floats)"],
    "lower bound (3n²)": minimum_loads,
}
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.4))
names = list(traffic)[::-1]
colors = ["0.5" if "naive" in k or "bound" in k else "C0" if "CPU" in k else "C2" for k in names]
ax1.barh(names, [traffic[k] * 4 / 2**20 for k in names], color=colors)
ax1.set_xscale("log")
ax1.set_xlim(1, 2e4)
ax1.set_xlabel("MiB moved for one 1024³ float32 product (log scale)")
ax1.set_title("Each level of blocking cuts the traffic")
ax1.grid(True, axis="x", which="both", alpha=0.3)

ai = np.logspace(-1.5, 2.5, 200)
ax2.loglog(ai, np.minimum(PEAK, ai * BANDWIDTH) / 1e12, "k-",
           label="global-memory roof (H200 datasheet)")
ax2.axvline(ridge, color="0.6", ls=":", label=f"ridge {ridge:.1f} flop/byte")
for (k, x), marker in zip(gpu_points.items(), ["o", "s", "^"]):
    ax2.plot(x, memory_bound[k] / 1e12, marker, ms=9, mfc="none",
             label=f"{k}: {x:g} flop/byte, global roof")
    if bound[k] < memory_bound[k]:
        ax2.plot(x, bound[k] / 1e12, marker, ms=9, color=ax2.lines[-1].get_color(),
                 label=f"{k}: shared-memory cap {100 * bound[k] / PEAK:.0f}% of peak")
ax2.set_xlabel("arithmetic intensity (flop per byte of global memory)")
ax2.set_ylabel("attainable TFLOP/s (FP32)")
ax2.set_title("GPU matmul: tiling crosses the global ridge; shared memory caps 64x64")
ax2.legend(loc="lower right", fontsize=8)
ax2.grid(True, which="both", alpha=0.3)
fig.tight_layout()
save_figure(fig, "matmul_roofline")

# %% [markdown]
# Where a GPU is present (Colab's GPU runtime), the next cell runs the CUDA kernel itself on a
# $1024^3$ product, checks it against numpy and prints its measured rate (median of 5, each
# product waited for with `synchronize()`). The bounds above are an H200's; on another GPU
# compare with that GPU's datasheet (a T4: 8.1 TFLOP/s FP32, 320 GB/s). Without a GPU the cell
# says so in one line.

# %% tags=["nbval-ignore-output"]
# companion-only: this project's cuda() module (synchronize) and the sizes N, flops above
print(machine_line())
gpu = lecture.best_device()  # cuda() where a GPU is visible, else cpu()
if gpu.name != "cuda":
    print(f"no GPU here (best_device() is {gpu}): the CUDA matmul kernel is not timed")
else:
    xa_gpu = np.random.randn(N, N).astype(np.float32)
    xb_gpu = np.random.randn(N, N).astype(np.float32)
    a_gpu, b_gpu = nd.array(xa_gpu, device=gpu), nd.array(xb_gpu, device=gpu)
    got = (a_gpu @ b_gpu).numpy()
    assert np.allclose(got, xa_gpu.astype(np.float64) @ xb_gpu, rtol=1e-3, atol=1e-2)
    seconds = measure(lambda: (a_gpu @ b_gpu, gpu.synchronize()), repeats=5, warmup=2)
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                         capture_output=True, text=True) if shutil.which("nvidia-smi") else None
    name = smi.stdout.strip().splitlines()[0] if smi and smi.stdout.strip() else "this GPU"
    print(f"{N}³ float32 matmul on cuda() ({name}): {flops / seconds / 1e12:.2f} TFLOP/s, "
          f"{1e3 * seconds:.2f} ms per product (correct to 1e-3)")

# %% [markdown]
# ## 9. Where a training step's time goes
#
# Fast kernels are half the story. A training step also runs Python: building `Tensor`
# nodes, the ops' `compute` and `gradient`, autograd's topological sort, `NDArray`
# bookkeeping, the optimizer's loop over parameters, and allocating buffers. On small and
# medium tensors that **framework overhead** can cost more than the arithmetic.
#
# `companion/step_profile.py` measures the split: `KernelTimer` wraps every function of the
# device module with a clock for the duration of a `with` block, so the time inside kernel
# calls is *kernel* time and the rest of the step's wall time is *overhead* (the timers' own
# cost is measured and taken out). It does this for one step (forward, backward, optimizer
# update) of four models: hw2's MLP-ResNet (batch 100, Adam), ResNet-9 (batch 32), and 2-layer
# LSTM and Transformer language models (sequence 32, batch 16, width 128, vocabulary 1000).
#
# Two ways of running the same four steps are compared, **in one run, on this machine**: the
# course's modules (needle's default: every layer built from the course's ops, as in your
# homework) and needle's opt-in fast path (`needle.fast.fuse` on the model and the loss,
# `needle.fast.backward`), which runs fused kernels for the composites a step repeats. The
# repository also keeps a profile of the code before its array layer was reworked
# (`companion/step_profile_before.json`, `make profile` compares with it); it was measured on
# another machine, under other load, so this notebook does not put it beside a live run.
# Timings depend on the machine and its load, so these cells' output is not compared; the
# machine line says where and under what load they ran, and the verdict lines are computed
# from the tables.

# %% tags=["nbval-ignore-output"]
# companion-only: companion.step_profile and needle.fast on this project's needle
from companion import step_profile  # noqa: E402


def overhead_share(r: dict) -> float:
    """Overhead / (kernel + overhead), the table's overhead column."""
    return r["overhead_ms"] / (r["kernel_ms"] + r["overhead_ms"])


print(machine_line())
# on cpu(): the timers clock each call, and cuda() returns before its kernels finish
profiles = {}
for label, fast in (("course's modules", False), ("fast path", True)):
    profiles[label] = {case: step_profile.profile_case(case, device, repeats=5, fast=fast,
                                                       with_torch=fast)
                       for case in step_profile.CASES}
    print(f"\n{label}: medians of 5 steps" + ("" if fast else " (PyTorch timed with the fast "
                                                              "path only)"))
    print(step_profile.render(profiles[label]))
    for r in profiles[label].values():  # timings move with the load: check what does not
        assert r["kernel_ms"] > 0 and r["kernel_calls"] > 0
        assert tuple(r["phases"]) == step_profile.PHASES
print(machine_line())  # the load at the end of the run
course_run, fast_run = profiles["course's modules"], profiles["fast path"]
for label, run in profiles.items():
    share = {case: overhead_share(r) for case, r in run.items()}
    larger = [c for c in share if share[c] > 0.5]
    shares = ", ".join(f"{c} {100 * v:.0f}%" for c, v in share.items())
    print(f"verdict, {label}: overhead share {shares}; overhead is the larger part for "
          f"{', '.join(larger) or 'none of the four'}")
print("verdict, fast path against the course's modules: "
      + ", ".join(f"{c} {course_run[c]['step_ms'] / fast_run[c]['step_ms']:.1f}x faster "
                  f"({course_run[c]['kernel_calls']} -> {fast_run[c]['kernel_calls']} calls)"
                  for c in step_profile.CASES))

# %% tags=["nbval-ignore-output"]
# companion-only: the step profiles of the companion-only cells above
fig, axes = plt.subplots(1, len(step_profile.CASES), figsize=(12, 3.6))
for ax, case in zip(axes, step_profile.CASES):
    rows = [("course", course_run[case]), ("fast path", fast_run[case])]
    kernel = [r["kernel_ms"] for _, r in rows]
    overhead = [max(r["overhead_ms"], 0.0) for _, r in rows]
    ax.bar([name for name, _ in rows], kernel, color="C0", label="inside kernels")
    ax.bar([name for name, _ in rows], overhead, bottom=kernel, color="C1",
           label="framework overhead")
    torch_ms = fast_run[case].get("torch_min_ms")  # the least disturbed step
    if torch_ms:
        ax.axhline(torch_ms, color="k", ls="--", lw=1)
    ax.set_title(case.replace("_", " "), fontsize=10)
    ax.set_ylabel("ms per training step" if ax is axes[0] else "")
    ax.grid(True, axis="y", alpha=0.3)
fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=2, fontsize=9)
with_torch = any(fast_run[case].get("torch_min_ms") for case in step_profile.CASES)
fig.suptitle("One training step on cpu(), one run: the course's modules vs the fast path"
             + (" (dashed: PyTorch's fastest step in the same run)" if with_torch else ""),
             fontsize=10)
fig.tight_layout(rect=(0, 0.08, 1, 1))
save_figure(fig, "step_profile")

# %% [markdown]
# Read the bars as two separate budgets. The kernel part shrinks with better kernels (strided
# operands instead of copies, fused kernels, a direct path for small products); the overhead
# part shrinks only with less Python per op and fewer ops per step (fused composites, in-place
# optimizer updates), which is what the fast path's fewer calls buy. The verdict lines above
# say, for this run, which models spend most of a step on overhead under each path and how
# much the fast path saves; where PyTorch is installed, its dashed line shows how much of
# either part is left to win.

# %% [markdown]
# ## Summary
#
# * A device is a module implementing one protocol (buffers, strided copies, element-wise and
#   scalar ops, `matmul`, reductions); `NDArray` calls exactly those functions.
# * The course's element-wise kernels are flat loops over compact buffers, so its ops compact
#   their operands first; kernels that take strides (`ewise_binary`) skip that call. They read
#   broadcast, small and many-dimensional views in place, and copy a large transposed matrix
#   into a scratch buffer themselves, with the blocked walk of `compact`; whether reading in
#   place beats copying first depends on the view and the machine (section 2's verdict lines).
# * A reduction reduces runs of the (permuted) view: the course compacts the reduced axis to
#   the end first; on a GPU, threads combine partial results in a tree (warp shuffles, then
#   shared memory across warps).
# * Matmul is $2mnp$ flops over at least $mn + np + mp$ floats. The naive loop loads 2 floats
#   per multiply-add; a $v_1 \times v_2$ tile of reuse cuts that to $2/(1/v_1 + 1/v_2)$
#   flops per float, at each level: registers ($MR \times NR$), caches ($NR$, $MC$), memory
#   ($KC$) on the CPU; shared memory ($BM \times BN$) and registers ($TM \times TN$) on the GPU.
# * The homework's tiled layout is an `as_strided` view with strides $(cT, T, c, 1)$,
#   compacted so each $T \times T$ tile is one contiguous run.
# * The CUDA kernel computes a $64 \times 64$ (or $128 \times 128$) tile of $C$ per block of 256
#   threads, staging operand tiles through 4–8 KiB of padded shared memory: 64–128 times less
#   global traffic than one thread per output, with coalesced loads and no bank conflicts (as
#   emulated in numpy here; the CUDA code itself is tested only on a GPU). Shared-memory
#   bandwidth caps the $64 \times 64$ configuration near half of FP32 peak.
# * A training step is kernel time plus framework overhead; `companion/step_profile.py`
#   measures both, and section 9 compares the course's modules with the fused fast path in
#   one run (its verdict lines say which models spend most of a step on overhead).

# %% [markdown]
# ## Exercises
#
# Each exercise has a cell to fill in (it starts as `raise NotImplementedError`) and a check
# cell that says whether your answer is right: "not answered yet", "correct", or "not yet"
# with what differs. The first cell below gathers everything the exercises use, so this
# section also runs on its own after a kernel restart. Reference answers are in
# `notebooks/solutions/06_hardware_acceleration.py`; try first.

# %% tags=["exercise-setup"]
import numpy as np

from needle import backend_ndarray as nd
from companion.check.exercises import check_exercise

rng = np.random.default_rng(0)
A_ex = rng.standard_normal((8, 12)).astype(np.float32)
B_ex = rng.standard_normal((12, 4)).astype(np.float32)
T_EX = 4


def positions_read_by_compact(shape, strides, offset, size):
    """Buffer positions compact() reads, in order: compact a view of a buffer 0, 1, 2, ..."""
    buf = nd.array(np.arange(size, dtype=np.float32), device=nd.cpu())
    view = nd.NDArray.make(shape, strides=strides, device=buf.device, handle=buf._handle,
                           offset=offset)
    return view.compact().numpy().astype(int).ravel().tolist()


# %% [markdown]
# **Exercise 6.1 (a kernel that takes strides).** A strided element-wise kernel visits the
# view's elements in row-major order and reads buffer position
# offset + Σ index·stride for each (section 2). List those positions for the given view; the
# check compacts the same view of a buffer holding 0, 1, 2, … .

# %% tags=["exercise-stub"]
def strided_positions(shape, strides, offset):
    """Buffer positions of the view's elements, in row-major order of the view."""
    raise NotImplementedError


# %% tags=["exercise-check"]
VIEWS = [((2, 3), (1, 2), 0), ((3, 2, 2), (8, 1, 3), 5), ((4,), (0,), 7)]
check_exercise("6.1 strided_positions", lambda: [list(strided_positions(*v)) for v in VIEWS],
               [positions_read_by_compact(*v, size=40) for v in VIEWS])

# %% [markdown]
# **Exercise 6.2 (the tiled layout).** The homework's `matmul_tiled` stores an (m, n) matrix
# as an (m/T, n/T, T, T) array whose entry [i, j] is the T×T tile in block row i, block
# column j (section 6). Write the conversion in numpy (a reshape and a transpose).

# %% tags=["exercise-stub"]
def to_tiles(a, T):
    """(m, n) -> (m/T, n/T, T, T), tile [i, j] = a[iT:(i+1)T, jT:(j+1)T]."""
    raise NotImplementedError


# %% tags=["exercise-check"]
def _tiles_ok(tiles):
    tiles = np.asarray(tiles)
    m, n = A_ex.shape
    if tiles.shape != (m // T_EX, n // T_EX, T_EX, T_EX):
        return f"expected shape {(m // T_EX, n // T_EX, T_EX, T_EX)}, got {tiles.shape}"
    for i in range(m // T_EX):
        for j in range(n // T_EX):
            if not np.array_equal(tiles[i, j], A_ex[i * T_EX:(i + 1) * T_EX,
                                                    j * T_EX:(j + 1) * T_EX]):
                return f"tile [{i}, {j}] is not the block a[{i}T:{i + 1}T, {j}T:{j + 1}T]"
    return None


check_exercise("6.2 to_tiles", lambda: to_tiles(A_ex, T_EX), predicate=_tiles_ok)

# %% [markdown]
# **Exercise 6.3 (a matmul over tiles).** Multiply two matrices given in the tiled layout and
# return the product in the tiled layout: tile C[i, j] = Σ_k A[i, k] @ B[k, j]. The check
# compares with the compiled `NDArray` product.

# %% tags=["exercise-stub"]
def tiled_matmul(a_tiles, b_tiles):
    """(m/T, n/T, T, T) x (n/T, p/T, T, T) -> (m/T, p/T, T, T)."""
    raise NotImplementedError


# %% tags=["exercise-check"]
def _product_tiles():
    c = (nd.array(A_ex, device=nd.cpu()) @ nd.array(B_ex, device=nd.cpu())).numpy()
    m, p = c.shape
    return c.reshape(m // T_EX, T_EX, p // T_EX, T_EX).transpose(0, 2, 1, 3)


def _tiles(a):
    m, n = a.shape
    return a.reshape(m // T_EX, T_EX, n // T_EX, T_EX).transpose(0, 2, 1, 3)


check_exercise("6.3 tiled_matmul", lambda: tiled_matmul(_tiles(A_ex), _tiles(B_ex)),
               _product_tiles(), rtol=1e-4, atol=1e-5)
