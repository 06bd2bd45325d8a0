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
# # 05 · The NDArray: shape, strides, offset
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/needle-companion/needle-companion/blob/main/notebooks/05_ndarray.ipynb)
#
# **Lecture:** 11, "Hardware Acceleration" (memory layout, strides, tiling), and 13, "Hardware
# Acceleration Implementation" (the NDArray class)
#
# **Homework:** hw3 Part 1 (Python array operations: `reshape`, `permute`, `broadcast_to`,
# `__getitem__`), Part 2 (`compact` and `setitem`) and Part 5 (matrix multiplication, the
# tiled version included)
#
# **Prerequisites:** numpy arrays and their `strides`; notebook 01's matrix products
#
# **You will be able to:** compute where any element of a strided view lives; tell which
# operations are views and which copy; write reshape, transpose, broadcast, slice and flip as
# changes of (shape, strides, offset); follow a Python call down to a C++ kernel; and measure
# matmul kernels robustly and explain the naive → tiled → packed/SIMD → BLAS ladder.
#
# **Run time:** about 25 s on a 2-core x86-64 machine (a minute when other jobs load it)
#
# **Student mode:** with `NEEDLE_IMPL=path/to/hwN/python` (your own needle), the cells marked
# companion-only are skipped: they use this project's compiled module (strided kernels, size
# checks, `matmul_naive`, `__gemm__`), `NDArray.matmul_tiled` and negative indices. Section 8
# still times your own module's `matmul` and `matmul_tiled`.
#
# In homework 3 needle stops borrowing numpy and gets its own array, `NDArray`
# (`needle/backend_ndarray/ndarray.py`). It is deliberately small: a **flat buffer of float32**
# that lives on a device, plus three pieces of Python bookkeeping,
#
# * `shape` — the size of each dimension,
# * `strides` — how many *elements* to step in the buffer to move by one along each dimension,
# * `offset` — where in the buffer element `(0, …, 0)` lives.
#
# Element $(i_0, \dots, i_{k-1})$ sits at buffer position
#
# $$\text{offset} + \sum_d i_d \cdot \text{strides}_d .$$
#
# Everything else follows from that one formula: reshaping, transposing, broadcasting and slicing
# become *views* — new (shape, strides, offset) over the **same** buffer, with no copy — and a
# copy (`compact`) is made only when a kernel needs the elements laid out contiguously.
# The buffer itself, and every loop over it, lives in a device module: numpy for `cpu_numpy()`,
# compiled C++ for `cpu()`, CUDA for `cuda()`.

# %% tags=["remove-cell"] cellView="form" jupyter={"source_hidden": true}
#@title Colab set-up: in Colab this installs needle (2-3 minutes); elsewhere it does nothing
import os, shlex, subprocess, sys, tempfile; repo = os.environ.get("NEEDLE_COLAB_REPO", "https://github.com/needle-companion/needle-companion")
if "google.colab" in sys.modules or os.environ.get("NEEDLE_COLAB_SIMULATE") == "1":  # companion/colab_setup.py
    py, src, q = sys.executable, os.path.join(tempfile.gettempdir(), "needle-companion"), shlex.quote
    done = subprocess.run(f"{q(py)} -m companion.colab_setup --status 2>/dev/null || {{ {{ test -d {q(src)} || git clone -q --depth=1 {q(repo)} {q(src)}; }} && cd {q(src)} && {q(py)} -m companion.colab_setup --install {q(repo)} --cwd {q(os.getcwd())}; }}", shell=True, capture_output=True, text=True); print(done.stdout + done.stderr[-3000:], end=""); assert done.returncode == 0, f"the set-up could not install this project from {repo} (what failed is above)"

# %%
import time

import matplotlib.pyplot as plt
import numpy as np

import needle as ndl
from needle import backend_ndarray as nd
from companion import lecture
from companion.viz import save_figure

np.random.seed(0)
lecture.setup()  # with NEEDLE_IMPL: cells marked "# companion-only" print a skip line
device = lecture.best_device()  # sections 1-6 (arrays and views): cuda() on a GPU, else cpu()
cpu = ndl.cpu()  # sections 7-8 are the C++ module's own functions and kernels: always cpu()
assert cpu.enabled(), "build the C++ backend first: make build"
print(device)


# %% [markdown]
# Two helpers used throughout: one reads the **whole buffer** behind an array in memory order
# (ignoring shape and strides), the other says whether two arrays share a buffer. We print
# `same buffer: True` rather than raw addresses, which change on every run.

# %%
def buffer(x: nd.NDArray) -> np.ndarray:
    """Every element of x's buffer, in memory order, as integers (our examples hold integers)."""
    size = x._handle.size
    return x.device.to_numpy(x._handle, (size,), (1,), 0).astype(int)


def same_buffer(x: nd.NDArray, y: nd.NDArray) -> bool:
    return x._handle.ptr() == y._handle.ptr()


def describe(name: str, x: nd.NDArray) -> None:
    print(f"{name:<12} shape={str(x.shape):<10} strides={str(x.strides):<10} offset={x._offset}")


# %% [markdown]
# ## 1. Shape, strides and offset
#
# A freshly built array is **compact** (row-major): the last index moves fastest, so the
# stride of dimension $d$ is the product of the sizes to its right. For a $3 \times 4$ array
# the strides are $(4, 1)$: one row down is 4 elements, one column right is 1.

# %%
a = nd.array(np.arange(12).reshape(3, 4), device=device)
describe("a", a)
print("buffer:", buffer(a))
assert a.shape == (3, 4) and a.strides == (4, 1) and a._offset == 0

# %% [markdown]
# The table below applies the formula to every index: it is exactly the buffer position of the
# element, and (because this array holds $0, 1, \dots, 11$) also its value.

# %%
print("      " + "".join(f"j={j:<4}" for j in range(4)))
for i in range(3):
    row = [a._offset + i * a.strides[0] + j * a.strides[1] for j in range(4)]
    print(f"i={i}   " + "".join(f"{p:<6}" for p in row))
    assert row == a.numpy()[i].astype(int).tolist()

# %% [markdown]
# numpy keeps the same bookkeeping, in bytes: dividing its strides by `itemsize` (4 for float32)
# gives ours.

# %%
x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
print("numpy strides (bytes):", x.strides, " in elements:", tuple(s // 4 for s in x.strides))
assert nd.array(x, device=device).strides == tuple(s // 4 for s in x.strides) == (12, 4, 1)

# %% [markdown]
# ## 2. Views share memory
#
# `reshape` of a compact array and `permute` (a general transpose) only rewrite the
# bookkeeping. `permute((1, 0))` swaps the two strides: walking along a row of the result
# means stepping 4 elements in the buffer.

# %%
r = a.reshape((2, 6))
t = a.permute((1, 0))
describe("a", a)
describe("reshape", r)
describe("permute", t)
print("same buffer:", same_buffer(a, r), same_buffer(a, t))
assert same_buffer(a, r) and same_buffer(a, t)
assert r.strides == (6, 1) and t.strides == (1, 4)
print(t.numpy().astype(int))

# %% [markdown]
# Since a view *is* the original memory, writing through it changes the original. Element
# `(0, 1)` of the transpose is element `(1, 0)` of `a`, buffer position $0\cdot1 + 1\cdot4 = 4$.

# %%
b = nd.array(np.arange(12).reshape(3, 4), device=device)
bt = b.permute((1, 0))
bt[0, 1] = 100.0
print(b.numpy().astype(int))
assert b.numpy()[1, 0] == 100 and buffer(b)[4] == 100

# %% [markdown]
# ## 3. Why `compact` exists
#
# The course's kernels, such as `ewise_add`, run one flat loop, `out[i] = a[i] + b[i]`, over
# contiguous memory: that is what makes them simple and fast (and vectorisable). The permuted
# view `t` is **not** contiguous in its own logical order — its buffer still reads
# `0 1 2 3 …`, while its rows read `0 4 8`. So the course's NDArray calls `compact()` before
# every such kernel: it copies a non-compact view into a fresh row-major buffer (and returns
# the array itself when it is already compact). needle's element-wise kernels also accept
# strides and read views in place (notebook 06 shows how, measures whether reading a
# transposed view in place is slower than copying it first, and shows that for large
# transposed operands the kernel makes that copy itself); `compact()` remains the copy for
# everything that needs row-major memory, such as `reshape` below.

# %%
print("t.is_compact():", t.is_compact())
print("buffer of t:   ", buffer(t))
c = t.compact()
describe("t.compact()", c)
print("buffer of copy:", buffer(c))
print("same buffer:", same_buffer(c, t))
assert not t.is_compact() and c.is_compact() and not same_buffer(c, t)
assert buffer(c).tolist() == [0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11]
assert a.compact() is a  # already compact: no copy

# %% [markdown]
# `reshape` needs a compact array: it assumes consecutive logical elements are consecutive in
# memory. Reshaping the transpose directly would silently scramble it, so NDArray refuses and
# tells you what to do.

# %%
try:
    t.reshape((12,))
except ValueError as err:
    print("ValueError:", err)
    assert "compact" in str(err)  # the message says what to do
else:
    raise AssertionError("reshape of a non-compact view was accepted")
print(t.compact().reshape((12,)).numpy().astype(int))

# %% [markdown]
# ## 4. Broadcasting is a stride of 0
#
# To repeat a size-1 dimension $n$ times, set its stride to 0: every index along it lands on
# the same element. A $(3, 1)$ column broadcast to $(3, 4)$ still owns a buffer of 3 elements.

# %%
col = nd.array([[10.0], [20.0], [30.0]], device=device)
wide = col.broadcast_to((3, 4))
describe("col", col)
describe("broadcast", wide)
print("buffer size:", wide._handle.size, "| same buffer:", same_buffer(col, wide))
print(wide.numpy().astype(int))
assert wide.strides == (1, 0) and wide._handle.size == 3 and same_buffer(col, wide)

# %% [markdown]
# Viewed as $(1, 1, 3)$ (a reshape of a compact array is a view too), one row can pose as a
# whole batch: both size-1 dimensions get stride 0. (The course's `broadcast_to` keeps the number
# of dimensions; needle's also adds leading ones, as numpy does.)

# %%
row = nd.array([1.0, 2.0, 3.0], device=device)
batch = row.reshape((1, 1, 3)).broadcast_to((2, 4, 3))
describe("batch", batch)
assert batch.strides == (0, 0, 1)
assert np.array_equal(batch.numpy(), np.broadcast_to([1.0, 2.0, 3.0], (2, 4, 3)))

# %% [markdown]
# ## 5. Slicing is an offset plus scaled strides
#
# A slice `start:stop:step` along dimension $d$ moves the first element by
# $\text{start}_d \cdot \text{strides}_d$ and multiplies the stride by $\text{step}_d$; the size
# becomes $\lceil (\text{stop} - \text{start}) / \text{step} \rceil$. An integer index is the
# slice `i:i+1` (needle keeps the dimension, with size 1). For `a[1:3, ::2]`:
# offset $1 \cdot 4 + 0 \cdot 1 = 4$, strides $(4 \cdot 1, 1 \cdot 2) = (4, 2)$.

# %%
s = a[1:3, ::2]
describe("a[1:3, ::2]", s)
print(s.numpy().astype(int), "| same buffer:", same_buffer(a, s))
assert s.shape == (2, 2) and s.strides == (4, 2) and s._offset == 4 and same_buffer(a, s)
assert s.numpy().astype(int).tolist() == [[4, 6], [8, 10]]

# %%
# companion-only: a negative index (the course's __getitem__ does not count it from the end)
e = a[-1, 1:]
describe("a[-1, 1:]", e)
assert e.shape == (1, 3) and e._offset == 2 * 4 + 1
assert e.numpy().astype(int).tolist() == [[9, 10, 11]]

# %% [markdown]
# `__setitem__` is the same idea in reverse: it builds the view, then a kernel
# (`ewise_setitem` or `scalar_setitem`) writes through its strides.

# %%
z = nd.array(np.zeros((3, 4)), device=device)
z[:, 1::2] = 7.0
z[0, :] = nd.array([[1.0, 2.0, 3.0, 4.0]], device=device)
print(z.numpy().astype(int))
assert z.numpy().astype(int).tolist() == [[1, 2, 3, 4], [0, 7, 0, 7], [0, 7, 0, 7]]

# %% [markdown]
# Views compose: a broadcast of a slice of a transpose of a reshape is still one (shape,
# strides, offset) triple, and always agrees with numpy.

# %%
v = a.reshape((1, 3, 4)).permute((0, 2, 1))[:, 1:, ::2].broadcast_to((2, 3, 2))
xv = np.broadcast_to(np.arange(12).reshape(3, 4).T[1:, ::2], (2, 3, 2))
describe("composed", v)
assert np.array_equal(v.numpy(), xv) and same_buffer(v, a)
assert v.strides == (0, 1, 8) and v._offset == 1

# %% [markdown]
# ## 6. Flip: a negative stride, then compact
#
# Reversing dimension $d$ is also a change of bookkeeping: start at the *last* element
# (offset $+ (n_d - 1)\,\text{strides}_d$) and walk backwards (stride $-\text{strides}_d$).
# numpy returns exactly that view:

# %%
xf = np.flip(np.arange(12, dtype=np.float32).reshape(3, 4), axis=1)
print("numpy flip strides (elements):", tuple(s // 4 for s in xf.strides))
assert tuple(s // 4 for s in xf.strides) == (4, -1)

# %% [markdown]
# needle's NDArray keeps strides non-negative in its public views (`as_strided` rejects
# negative ones), so `flip` builds the negative-stride view internally and hands it straight to
# the `compact` kernel, returning a fresh compact array. Here `flip(1)` starts at offset
# $3 \cdot 1 = 3$ with strides $(4, -1)$:

# %%
f = a.flip(1)
print(f.numpy().astype(int))
print("compact:", f.is_compact(), "| same buffer:", same_buffer(f, a))
assert f.is_compact() and not same_buffer(f, a)
assert np.array_equal(f.numpy(), xf)
assert np.array_equal(a.flip((0, 1)).numpy(), np.flip(a.numpy()))

# %% [markdown]
# The same result by hand: the device's `compact` kernel, given shape $(3, 4)$, strides
# $(4, -1)$ and offset 3 over `a`'s buffer, writes the flipped elements in row-major order.

# %%
by_hand = nd.NDArray.make((3, 4), device=device)
device.compact(a._handle, by_hand._handle, (3, 4), (4, -1), 3)
print(by_hand.numpy().astype(int))
assert np.array_equal(by_hand.numpy(), f.numpy())

# %% [markdown]
# ### Writing `compact` for any number of dimensions (hw3 Part 2)
#
# The kernel cannot nest one loop per dimension: the number of dimensions is only known at run
# time. hw3's `compact` keeps an **index counter** instead, one digit per dimension. For each
# output element it reads buffer position $\text{offset} + \sum_d i_d\,\text{strides}_d$,
# then adds one to the last digit and **carries** leftwards when a digit reaches its size,
# like an odometer. `ewise_setitem` and `scalar_setitem` walk the same counter and write
# instead of read (`buf[pos] = value`). In Python, checked against `compact` on every view of
# this notebook (in C++ the same loop runs over raw buffers; notebook 06's Exercise 6.1 asks
# for these positions):

# %%
def view_positions(shape, strides, offset):
    """Buffer positions of a view's elements in row-major order: an index counter with carry."""
    index, count = [0] * len(shape), int(np.prod(shape))
    for _ in range(count):
        yield offset + sum(i * s for i, s in zip(index, strides))
        for d in reversed(range(len(shape))):  # add one to the last digit, carry leftwards
            index[d] += 1
            if index[d] < shape[d]:
                break
            index[d] = 0


def compact_by_counter(x: nd.NDArray) -> np.ndarray:
    """What hw3's compact kernel writes for the view x, computed from x's buffer."""
    flat = buffer(x)
    return np.array([flat[p] for p in view_positions(x.shape, x.strides, x._offset)])


for name_, view_ in {"transpose": t, "slice": s, "broadcast": wide, "composed": v}.items():
    got_ = compact_by_counter(view_)
    assert np.array_equal(got_, view_.compact().numpy().ravel()), name_
    print(f"{name_:<10} {str(view_.shape):<10} counter == compact(): True   first: {got_[:6]}")
flat_ = buffer(a)  # setitem: the same walk, writing; a[:, 1::2] = -1 in a numpy copy
for p in view_positions((3, 2), (4, 2), 1):
    flat_[p] = -1
expected_ = a.numpy().astype(int)
expected_[:, 1::2] = -1
assert np.array_equal(flat_.reshape(3, 4), expected_)

# %% [markdown]
# ## 7. From a Python call to a C++ loop
#
# What happens on `a + a`?
#
# 1. `NDArray.__add__` checks the operand (device, shapes, broadcasting) and allocates a
#    compact output;
# 2. it calls one kernel of the device — a `BackendDevice` forwards attribute access to its
#    **device module**. Here both operands are compact and of one shape, so it calls the
#    course's compact kernel `ewise_add(a, b, out)`; for any other view (broadcast, transposed,
#    sliced) it calls the strided kernel `ewise_binary` with the op code of `"add"` (its
#    position in the shared op table), each operand's buffer, strides and offset, the output
#    and the shape. Both compute the same numbers (a test checks every op bit for bit); the
#    compact one is cheaper to call, having no strides or shape to convert;
# 3. for `cpu()` that module is `ndarray_backend_cpu`, a compiled extension built with
#    **pybind11** from `src/cpu/ndarray_backend_cpu*.cc`; pybind11 converts the Python arguments
#    (the `Array` handles, tuples of ints) to C++ values;
# 4. the C++ function runs a loop over the buffers and writes the output buffer.
#
# The module has both kinds: the course's compact-only kernels (`ewise_add(a, b, out)` and
# friends) and the strided ones.

# %%
# companion-only: this project's compiled module: its strided kernel ewise_binary
a = a.to(cpu)  # the C++ module's functions take cpu() buffers (a stays a itself on cpu())
mod = cpu.mod
print("module:   ", mod.__name__)
print("device:   ", mod.__device_name__)
print("tile size:", mod.__tile_size__)
print("handle:   ", type(a._handle).__name__, "of", a._handle.size, "floats")
assert cpu.ewise_binary is mod.ewise_binary
assert mod.__name__ == "needle.backend_ndarray.ndarray_backend_cpu"

# %% [markdown]
# pybind11 writes each function's signature (with the C++ argument types it converts to)
# into its docstring, followed by the description given in the binding:

# %%
# companion-only: this project's compiled module's pybind11 signatures
print(mod.matmul.__doc__.strip())
assert mod.matmul.__doc__.startswith("matmul(a: needle.backend_ndarray.ndarray_backend_cpu.Array")

# %% [markdown]
# Calling the module directly does what `a + a` does, through the strided kernel and through
# the course's compact one (the one `a + a` calls, `a` being compact):

# %%
# companion-only: the device protocol (protocol.py, ewise_binary)
from needle.backend_ndarray.protocol import BINARY_OPS  # noqa: E402

out = nd.NDArray.make(a.shape, device=cpu)
mod.ewise_binary(BINARY_OPS.index("add"), a._handle, a.strides, a._offset,
                 a._handle, a.strides, a._offset, out._handle, a.shape)
print(out.numpy().astype(int))
assert np.array_equal(out.numpy(), (a + a).numpy())
course = nd.NDArray.make(a.shape, device=cpu)
mod.ewise_add(a._handle, a._handle, course._handle)
assert np.array_equal(course.numpy(), out.numpy())

# %% [markdown]
# The Python layer is where every check happens; the kernels receive only buffers and sizes.
# The compiled module still refuses sizes that do not match its buffers, with a Python
# exception instead of a crash:

# %%
# companion-only: this project's compiled module's size checks
small = nd.NDArray.make((2,), device=cpu)
try:
    mod.ewise_add(a._handle, small._handle, out._handle)
except ValueError as err:  # the error policy: a wrong value (sizes) is a ValueError
    print(type(err).__name__ + ":", err)
else:
    raise AssertionError("the kernel accepted mismatched buffers")

# %% [markdown]
# ## 8. Three matmul kernels
#
# The CPU module has three ways to compute $C = AB$ for $A$ of shape $(m, n)$ and $B$ of shape
# $(n, p)$, all taking compact handles and the sizes:
#
# * `matmul_naive` — the textbook triple loop over $i, j, k$;
# * `matmul_tiled` — the homework's algorithm: both operands arrive laid out as $T \times T$
#   tiles (`__tile_size__` $= T$), each tile contiguous, and the output is written in tiles
#   too. For each output tile it loops over the tiles of a row of $A$ and a column of $B$ and
#   multiplies them tile by tile, so each small product works on $3T^2$ floats already in
#   cache;
# * `matmul` — the engine behind `@`. It picks one of three paths by the number of
#   multiply-adds $mnp$ (thresholds in `__gemm__`, printed below): tiny products run a plain
#   loop nest; mid-sized ones run a register-blocked SIMD micro-kernel that reads $A$ and $B$
#   **in place** (no packing), shared between the threads in chunks from $2^{17}$ (about
#   $51^3$) on, below which a chunk is too short to share;
#   from about $293^3$ on, the blocked (Goto/BLIS-style) engine **packs** panels of $A$ and $B$
#   into the exact order the micro-kernel reads them, sized to fit the caches, and shares one
#   product among all threads. Notebook 06 does the packed engine's arithmetic.
#
# `NDArray.matmul_tiled` runs the tiled route (tile both operands, multiply, untile); `@` takes
# the engine. The tiled layout is itself a view: `as_strided` with shape $(m/T, n/T, T, T)$ and
# strides $(nT, T, n, 1)$, then `compact`.

# %%
mod = cpu.mod  # the C++ module: the course's functions below are hw3's (yours in student mode)
T = mod.__tile_size__


def tiles(x: nd.NDArray) -> nd.NDArray:
    """x (r, c), compact, as a compact (r/T, c/T, T, T) array of tiles."""
    r, c = x.shape
    return x.as_strided((r // T, c // T, T, T), (c * T, T, c, 1)).compact()


def kernel_call(name: str, x: nd.NDArray, y: nd.NDArray):
    """(run, result): run() calls module function `name` on compact handles for C = x @ y;
    result() reads C back as a numpy (m, p) array."""
    (m, n), p = x.shape, y.shape[1]
    if name == "matmul_tiled":
        tx, ty = tiles(x), tiles(y)
        out = nd.NDArray.make((m // T, p // T, T, T), device=cpu)

        def run():
            mod.matmul_tiled(tx._handle, ty._handle, out._handle, m, n, p)

        def result():  # tile (i, j) holds rows iT.., columns jT..: back to row-major
            return out.permute((0, 2, 1, 3)).compact().reshape((m, p)).numpy()

        return run, result
    out = nd.NDArray.make((m, p), device=cpu)
    kernel = getattr(mod, name)

    def run():
        kernel(x._handle, y._handle, out._handle, m, n, p)

    return run, out.numpy


# %% [markdown]
# The course's module has two of these kernels, `matmul` and `matmul_tiled` (yours, in student
# mode). A first timing of just those two, at two sizes, so that student mode times your own
# kernels; the next cells add the naive loop and numpy and go up to $n = 512$. The output
# depends on the machine and its load, so it is not compared; the verdict line is computed.

# %% tags=["nbval-ignore-output"]
from companion.machine import machine_line  # noqa: E402
from companion.timing import measure  # noqa: E402

print(machine_line())
course_rates = {}
for n in (128, 256):
    xa = np.random.randn(n, n).astype(np.float32)
    na, nb_ = nd.array(xa, device=cpu), nd.array(xa.T.copy(), device=cpu)
    for k in ("matmul", "matmul_tiled"):
        run, result = kernel_call(k, na, nb_)
        run()
        assert np.allclose(result(), xa @ xa.T, rtol=1e-3, atol=1e-2), k
        seconds = measure(run, repeats=5, warmup=1, min_sample_s=0.02)
        course_rates[k, n] = 2.0 * n**3 / seconds / 1e9
    print(f"n={n:<4} " + "  ".join(f"{k}={course_rates[k, n]:7.2f} GFLOP/s"
                                   for k in ("matmul", "matmul_tiled")))
tiled_share = {n: course_rates["matmul_tiled", n] / course_rates["matmul", n] for n in (128, 256)}
print("verdict: " + "; ".join(f"at n={n} matmul_tiled runs at {r:.2f}x matmul's rate"
                              for n, r in tiled_share.items()))

# %%
# companion-only: this project's compiled module's matmul_naive and __gemm__
KERNELS = ["matmul_naive", "matmul_tiled", "matmul"]
GEMM = mod.__gemm__


def engine_path(m: int, n: int, p: int) -> str:
    """The path `matmul` takes for a product of compact operands (gemm_one in
    src/cpu/ndarray_backend_cpu_kernels.cc), from the thresholds in __gemm__."""
    madds, threads = m * n * p, mod.num_threads()
    if madds <= GEMM["direct_flops"]:
        return "direct loop, 1 thread"
    if madds < GEMM["parallel_flops"] or threads == 1:
        if threads > 1 and madds >= GEMM["split_flops"]:
            return f"unpacked, split over {threads} threads"
        return "unpacked, 1 thread"
    return f"packed engine, {threads} threads"


print(f"thresholds (multiply-adds m*n*p): direct <= {GEMM['direct_flops']:.0f} "
      f"(= 20^3), split >= {GEMM['split_flops']:.0f} (= 2^17), packed >= "
      f"{GEMM['parallel_flops']:.0f} (~ {GEMM['parallel_flops'] ** (1 / 3):.0f}^3)")
assert GEMM["split_flops"] == 2**17 and 289 < GEMM["parallel_flops"] ** (1 / 3) < 294
tile_demo = tiles(nd.array(np.arange(4 * T * T).reshape(2 * T, 2 * T), device=cpu))
print("tiled layout of a", (2 * T, 2 * T), "matrix:", tile_demo.shape)
assert tile_demo.numpy()[0, 1, 0, 0] == T  # tile (0, 1) starts at column T of row 0
assert np.array_equal(tile_demo.numpy()[1, 0], np.arange(4 * T * T).reshape(2 * T, 2 * T)[T:, :T])

# %% [markdown]
# All three kernels agree with numpy to $10^{-4}$ relative error at every size we time, and
# the tiled route by hand is exactly `NDArray.matmul_tiled`:

# %%
# companion-only: this project's compiled module's matmul_naive and NDArray.matmul_tiled
SIZES = [64, 128, 256, 384, 512]
rng = np.random.default_rng(0)
inputs = {}
for n in SIZES:
    xa = rng.standard_normal((n, n)).astype(np.float32)
    xb = rng.standard_normal((n, n)).astype(np.float32)
    inputs[n] = (xa, xb, nd.array(xa, device=cpu), nd.array(xb, device=cpu))
    reference = xa.astype(np.float64) @ xb
    errors = []
    for k in KERNELS:
        run, result = kernel_call(k, inputs[n][2], inputs[n][3])
        run()
        errors.append(np.abs(result() - reference).max() / np.abs(reference).max())
        if k == "matmul_tiled":
            assert np.array_equal(result(), inputs[n][2].matmul_tiled(inputs[n][3]).numpy())
    # the exact errors depend on the summation order (the SIMD width of the machine), so the
    # comparison is printed, not the values
    print(f"n={n:<4} relative error < 1e-4: "
          + "  ".join(f"{k}={e < 1e-4}" for k, e in zip(KERNELS, errors)))
    assert max(errors) < 1e-4

# %% [markdown]
# Now the speed, in GFLOP/s ($2n^3$ floating-point operations per product). Each figure is the
# **median** of several timed samples, each sample long enough to read the clock reliably, and
# each kernel is timed in its own block of calls after a pause (threads left spinning by the
# previous kernel would otherwise slow the next one). The first line says where it ran. On a
# machine with a GPU (Colab's GPU runtime) a last column times `@` on `cuda()`, the same
# operands copied to the GPU, waiting for each product to finish (`synchronize()`).
# Timings depend on the machine and its load, so this cell's output is not compared by the
# tests; and when numpy's BLAS, the reference, runs far below what any modern core does (a
# sign that other processes took the CPU), the cell times that size again, up to three times
# in all, and if it stays that low prints a warning instead of a conclusion.

# %% tags=["nbval-ignore-output"]
# companion-only: this project's compiled module's __gemm__ and matmul_naive
from companion.machine import blas_override_note, machine_info, numpy_blas_summary  # noqa: E402

print(machine_line())
print("\n".join(machine_info()[2:]))  # python, numpy and its BLAS; load average; BLAS overrides
print(f"needle cpu() kernels: {mod.__gemm__['isa']}, {mod.num_threads()} threads\n")
GPU = "cuda() @"  # on a GPU (Colab) the table and figure add `@` on cuda(), synchronized
FLOOR = 5.0  # GFLOP/s: any x86-64 core with SIMD runs BLAS well above this from n = 128


def rates(n: int) -> dict:
    """GFLOP/s of every kernel, numpy (and the GPU) for one n x n product, timed in turn."""
    xa, xb, na, nb = inputs[n]
    flops, row = 2.0 * n**3, {}
    for k in KERNELS:
        run, _ = kernel_call(k, na, nb)
        row[k] = flops / measure(run, repeats=5, warmup=1, min_sample_s=0.02, settle_s=0.1) / 1e9
    row["numpy"] = flops / measure(lambda: xa @ xb, repeats=5, warmup=1, min_sample_s=0.02,
                                   settle_s=0.1) / 1e9
    if device.name == "cuda":
        ga, gb = na.to(device), nb.to(device)
        row[GPU] = flops / measure(lambda: (ga @ gb, device.synchronize()), repeats=5,
                                   warmup=1, min_sample_s=0.02) / 1e9
    return row


gflops = {k: [] for k in KERNELS + ["numpy"] + ([GPU] if device.name == "cuda" else [])}
for n in SIZES:
    row = rates(n)
    for attempt in (2, 3):  # numpy below the floor: another process took a core; time again
        if n == SIZES[0] or row["numpy"] >= FLOOR:
            break
        print(f"n={n:<4} numpy's BLAS at {row['numpy']:.2f} GFLOP/s, below the floor: "
              f"the whole row timed again (attempt {attempt})")
        row = rates(n)
    for k, g in row.items():
        gflops[k].append(g)
    print(f"n={n:<4} " + "  ".join(f"{k}={g[-1]:7.2f}" for k, g in gflops.items())
          + f"   matmul path: {engine_path(n, n, n)}")

busy = min(gflops["numpy"][1:]) < FLOOR
if busy:
    print(f"\nWARNING: numpy's BLAS fell to {min(gflops['numpy'][1:]):.2f} GFLOP/s (floor "
          f"{FLOOR}): the machine was busy, so these timings support no conclusion. Rerun.")
else:
    engine = [m / b for m, b in zip(gflops["matmul"], gflops["numpy"])]
    tiled = [t / v for t, v in zip(gflops["matmul_tiled"], gflops["matmul_naive"])]
    print("\nengine (matmul) / numpy: "
          + "  ".join(f"n={n}: {r:.2f}x" for n, r in zip(SIZES, engine)))
    print("tiled / naive:           "
          + "  ".join(f"n={n}: {r:.1f}x" for n, r in zip(SIZES, tiled)))
    near = [n for n, r in zip(SIZES, engine) if 0.8 <= r <= 1.25]
    faster = [n for n, r in zip(SIZES, engine) if r > 1.25]
    slower = [n for n, r in zip(SIZES, engine) if r < 0.8]
    print(f"verdict: the engine is within 0.8-1.25x of numpy's BLAS at n = {near or 'no size'}, "
          f"faster at {faster or 'no size'}, slower at {slower or 'no size'}; the tiled kernel "
          f"gains {min(tiled):.1f}x to {max(tiled):.1f}x over the naive loop")
    print(f"numpy's BLAS: {numpy_blas_summary()}; needle: {mod.__gemm__['isa']} micro-kernels"
          + (f"; {blas_override_note()}, so numpy ran handicapped and the ratios flatter the "
             "engine" if blas_override_note() else ""))

# %% [markdown]
# The ladder reads bottom to top. The naive loop is limited by memory traffic: its inner loop
# walks down a column of $B$, one float from every row, so each multiply-add waits for a new
# cache line. The tiled kernel keeps three $T \times T$ tiles in cache while it works on them,
# so it re-reads $B$ about $T$ times less often; but its tiles are small and its loops are
# plain C++ left to the compiler, so it stays far below the engine (its gain over the naive
# loop, size by size, is the second ratio line). `matmul` adds register blocking (a
# $12 \times 32$ block of $C$ held in registers with AVX-512), SIMD and both cores, and, on
# the packed path, packing. numpy's BLAS (OpenBLAS) does the same things; how close the engine
# comes to it changes with the size, so the verdict line gives it size by size rather than
# one headline ratio. Two things to check before reading that line: the last line says which
# kernels each library ran (OpenBLAS picks its own by CPU, and the environment variables
# `OPENBLAS_CORETYPE` or `OPENBLAS_L2_SIZE`, when set, pin it to another configuration, which
# the line then names), and a single size can be an outlier on a shared machine.
#
# Where the figure bends, these are the known reasons (the printed rates say which show on
# this machine in this run):
#
# * **the naive loop after $n = 64$**: at $n = 64$ the three matrices (48 KiB) sit in the
#   caches, so the column walk down $B$ still hits cache, and the naive loop can even beat the
#   tiled one, whose tiling then buys nothing; from $n = 128$ on, each step of that walk is
#   likely a cache miss;
# * **`matmul` at $n = 64$ to $256$** takes the unpacked path, shared between the two threads
#   in chunks that each thread claims when it is free (each chunk's micro-kernel reads rows of
#   $A$ and a sliver of $B$ in place): no packing cost, which counts most at $n = 64$, where a
#   product takes microseconds (a second thread that is not already running leaves the whole
#   product to the first, and one preempted in the middle of a chunk pauses the sharing for a
#   while); but reading $B$
#   in place with a row stride of $4n$ bytes, a power of two, is also what can cause
#   cache-set conflicts (next paragraph), and a single sample on a shared machine can dip for
#   no reason of its own;
# * **the path change** between $n = 256$ ($2^{24}$ multiply-adds) and $n = 384$ (past
#   $293^3$) from the unpacked split to the packed engine: the rate can step either way there;
# * **$n = 512$ for the engine too**: packing $B$ into slivers walks down its rows, $4n$
#   bytes apart, so the packing copy meets the same power-of-two stride as the naive loop;
#   this notebook does not measure whether that (or anything else) is what moves the
#   engine's rate at 512, so read a dip there as unexplained;
# * **anything, anywhere, on a shared machine**: the engine and BLAS use both cores, so a
#   process that takes one core for a moment halves a threaded kernel's rate for that sample.
#   The medians above absorb short interruptions, not long ones; hence the sanity floor.
#
# **Power-of-two strides.** A cache of 64-byte lines with $S$ sets puts the line at address
# $x$ in set $(x / 64) \bmod S$; a typical 32 or 48 KiB L1 has 64 sets, so addresses 4 KiB apart
# share a set. The naive loop's walk down a column of $B$ steps by one row, $4n$ bytes: 2 KiB
# at $n = 512$, so the column's 512 lines fall into just 2 of the 64 sets, where only 16 to 24
# of them fit (8 or 12 ways each), and they evict one another before the next column, 4 bytes
# further on, could reuse them. At $n = 500$ or $520$ the step is not a multiple of the line,
# so the same walk spreads over all the sets. Whether this *conflict-miss* penalty shows
# depends on the CPU (its associativity, its L2, its prefetchers): the next cell measures the
# naive loop at 500, 512 and 520 and says what it found. (Comparing $n = 512$ with $384$ in
# the table above would not test this: $4 \cdot 384$ bytes is 24 lines, so $n = 384$ also uses
# only 8 sets.)

# %% tags=["nbval-ignore-output"]
# companion-only: this project's compiled module's matmul_naive
print(machine_line())
calls = {}
for n in (500, 512, 520):
    xa = rng.standard_normal((n, n)).astype(np.float32)
    calls[n] = kernel_call("matmul_naive", nd.array(xa, device=cpu),
                           nd.array(xa.T.copy(), device=cpu))[0]
rounds = {n: [] for n in calls}
for _ in range(3):  # interleaved rounds, so a burst of load hits all three sizes alike
    for n, run in calls.items():
        rounds[n].append(2.0 * n**3 / measure(run, repeats=3, warmup=1, min_sample_s=0.02) / 1e9)
near = {n: float(np.median(r)) for n, r in rounds.items()}
print("naive loop, GFLOP/s (median of 3 interleaved rounds): "
      + "  ".join(f"n={n}: {g:.2f}" for n, g in near.items()))
neighbours = (near[500] + near[520]) / 2
if near[512] < 0.85 * neighbours:
    print(f"n = 512 ran at {near[512] / neighbours:.2f}x its neighbours' mean rate: the "
          f"power-of-two slowdown shows on this machine")
else:
    print(f"n = 512 ran at {near[512] / neighbours:.2f}x its neighbours' mean rate: no clear "
          f"power-of-two slowdown on this machine in this run (within 15%)")
if busy:
    print("(the machine was busy during the table above: read this comparison with care too)")

# %% [markdown]
# The figure (log scale) is redrawn from the timings above.

# %% tags=["nbval-ignore-output"]
# companion-only: the timings of the companion-only cells above
fig, ax = plt.subplots(figsize=(6.4, 4.0))
styles = {"matmul_naive": "o-", "matmul_tiled": "s-", "matmul": "^-", "numpy": "k--",
          GPU: "D:"}
labels = {"matmul_naive": "naive (matmul_naive)",
          "matmul_tiled": f"tiled, T={T} (matmul_tiled)",
          "matmul": "engine: matmul, what @ runs", "numpy": "numpy (BLAS)",
          GPU: "the GPU: @ on cuda()"}
for k, g in gflops.items():
    ax.plot(SIZES, g, styles[k], label=labels[k])
ax.set_yscale("log")
ax.set_xticks(SIZES)
ax.set_xlabel("matrix size n (n×n @ n×n, float32)")
ax.set_ylabel("GFLOP/s (log scale, median of 5)")
ax.set_title("CPU matmul: naive → tiled → packed/SIMD → BLAS")
ax.legend(loc="center right", fontsize=8)
ax.grid(True, which="both", alpha=0.3)
save_figure(fig, "matmul_gflops")

# %% [markdown]
# ## Summary
#
# * An NDArray is a buffer plus (shape, strides, offset); element $i$ is at
#   $\text{offset} + \sum_d i_d\,\text{strides}_d$.
# * `reshape`, `permute`, `broadcast_to` (stride 0) and slicing (offset + scaled strides) are
#   views: same buffer, no copy.
# * The course's kernels want contiguous memory, so its ops call `compact()` first (needle's
#   strided kernels read views in place); `flip` is a negative-stride view that is compacted
#   immediately.
# * A Python op reaches C++ through the device module: `NDArray` method → `device.kernel`
#   (forwarded to the module) → pybind11 → a C++ loop over raw buffers.
# * The loop structure matters more than the language: the same C++ computes the same product
#   far faster once it is tiled, then register-blocked, vectorised and threaded (see the
#   figure); timing it honestly takes medians, blocks of calls, ratios at every size rather
#   than one, and a look at how the reference itself was configured.

# %% [markdown]
# ## Exercises
#
# Each exercise has a cell to fill in (it starts as `raise NotImplementedError`) and a check
# cell that says whether your answer is right: "not answered yet", "correct", or "not yet"
# with what differs. The first cell below gathers everything the exercises use, so this
# section also runs on its own after a kernel restart. Reference answers are in
# `notebooks/solutions/05_ndarray.py`; try first.

# %% tags=["exercise-setup"]
import numpy as np

from needle import backend_ndarray as nd
from companion.check.exercises import check_exercise

base_ex = np.arange(60, dtype=np.float32).reshape(3, 4, 5)


def view_of(array, make):
    """(shape, strides, offset) of the NDArray view ``make(array)``."""
    v = make(nd.array(array, device=nd.cpu()))
    return (tuple(v.shape), tuple(v.strides), v._offset)


# %% [markdown]
# **Exercise 5.1 (compact strides).** Write the row-major strides (in elements) of a compact
# array of the given shape (section 1). The check reads the strides of fresh NDArrays.

# %% tags=["exercise-stub"]
def compact_strides(shape):
    """Row-major strides, in elements, of a compact array of this shape."""
    raise NotImplementedError


# %% tags=["exercise-check"]
SHAPES = [(3, 4, 5), (7,), (2, 1, 6, 3)]
check_exercise("5.1 compact_strides", lambda: [tuple(compact_strides(s)) for s in SHAPES],
               [nd.array(np.zeros(s, dtype=np.float32), device=nd.cpu()).strides
                for s in SHAPES])

# %% [markdown]
# **Exercise 5.2 (permute is a view).** Write the shape and strides of `permute(axes)` of an
# array with the given shape and strides: no data moves (section 2).

# %% tags=["exercise-stub"]
def permuted(shape, strides, axes):
    """(new shape, new strides) of the permuted view."""
    raise NotImplementedError


# %% tags=["exercise-check"]
check_exercise("5.2 permuted", lambda: [permuted((3, 4, 5), (20, 5, 1), a)
                                        for a in ((2, 0, 1), (1, 0, 2))],
               predicate=lambda got: None if [tuple(map(tuple, g)) for g in got] == [
                   view_of(base_ex, lambda v: v.permute(a))[:2] for a in ((2, 0, 1), (1, 0, 2))]
               else f"got {got}")

# %% [markdown]
# **Exercise 5.3 (slicing is arithmetic).** For a compact array of shape (3, 4, 5), give the
# view's shape, strides and offset for `A[1:3, ::2, 1:5:3]` (section 5): the offset is the
# position of the view's first element in the buffer.

# %% tags=["exercise-stub"]
def sliced_view():
    """(shape, strides, offset) of A[1:3, ::2, 1:5:3] for a compact A of shape (3, 4, 5)."""
    raise NotImplementedError


# %% tags=["exercise-check"]
check_exercise("5.3 sliced_view", lambda: sliced_view(), predicate=lambda got: None
               if tuple(map(lambda x: tuple(x) if isinstance(x, (list, tuple)) else x, got))
               == view_of(base_ex, lambda v: v[1:3, ::2, 1:5:3]) else f"got {got}")

# %% [markdown]
# **Exercise 5.4 (broadcasting is a stride of 0).** Write the strides of
# `broadcast_to(new_shape)` for a view with the given shape and strides, where each
# broadcast axis has size 1 in `shape` (section 4).

# %% tags=["exercise-stub"]
def broadcast_strides(shape, strides, new_shape):
    """Strides of the broadcast view (0 along every broadcast axis)."""
    raise NotImplementedError


# %% tags=["exercise-check"]
check_exercise("5.4 broadcast_strides", lambda: tuple(broadcast_strides((3, 1, 5), (5, 5, 1),
                                                                       (3, 4, 5))),
               view_of(base_ex[:, :1, :].copy(), lambda v: v.broadcast_to((3, 4, 5)))[1])
