# %% [markdown]
# # 05 · The NDArray: shape, strides, offset
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

# %%
import time

import matplotlib.pyplot as plt
import numpy as np

import needle as ndl
from needle import backend_ndarray as nd
from needle.viz import save_figure

np.random.seed(0)
device = ndl.cpu()  # the compiled C++ backend
assert device.enabled(), "build the C++ backend first: make build"
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
# A kernel such as `ewise_add` runs one flat loop, `out[i] = a[i] + b[i]`, over contiguous
# memory: that is what makes it fast (and vectorisable). The permuted view `t` is **not**
# contiguous in its own logical order — its buffer still reads `0 1 2 3 …`, while its rows read
# `0 4 8`. So before calling a kernel, every NDArray op calls `compact()`, which copies a
# non-compact view into a fresh row-major buffer (and returns the array itself when it is
# already compact).

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
    assert "non-compact" in str(err)
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
# New leading dimensions get stride 0 too, so one row can pose as a whole batch:

# %%
row = nd.array([1.0, 2.0, 3.0], device=device)
batch = row.broadcast_to((2, 4, 3))
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
# Views compose: a slice of a transpose of a broadcast is still one (shape, strides, offset)
# triple, and always agrees with numpy.

# %%
v = a.permute((1, 0))[1:, ::2].broadcast_to((2, 3, 2))
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
# ## 7. From a Python call to a C++ loop
#
# What happens on `a + a`?
#
# 1. `NDArray.__add__` calls `ewise_or_scalar`, which checks shapes and devices and compacts
#    both operands;
# 2. it asks the device for its kernel: `self.device.ewise_add` — a `BackendDevice` forwards
#    attribute access to its **device module**;
# 3. for `cpu()` that module is `ndarray_backend_cpu`, a compiled extension built with
#    **pybind11** from `src/ndarray_backend_cpu.cc`; pybind11 converts the Python arguments
#    (the `Array` handles) to C++ references;
# 4. the C++ function runs a plain loop over the two buffers and writes the output buffer.

# %%
mod = device.mod
print("module:   ", mod.__name__)
print("device:   ", mod.__device_name__)
print("tile size:", mod.__tile_size__)
print("handle:   ", type(a._handle).__name__, "of", a._handle.size, "floats")
assert device.ewise_add is mod.ewise_add
assert mod.__name__ == "needle.backend_ndarray.ndarray_backend_cpu"

# %% [markdown]
# pybind11 writes each function's signature (with the C++ argument types it converts to)
# into its docstring, followed by the description given in the binding:

# %%
print(mod.matmul.__doc__.strip())
assert mod.matmul.__doc__.startswith("matmul(a: needle.backend_ndarray.ndarray_backend_cpu.Array")

# %% [markdown]
# Calling the module directly, on compact handles, does exactly what `a + a` does:

# %%
out = nd.NDArray.make(a.shape, device=device)
mod.ewise_add(a._handle, a._handle, out._handle)
print(out.numpy().astype(int))
assert np.array_equal(out.numpy(), (a + a).numpy())

# %% [markdown]
# The Python layer is where every check happens; the kernels receive only buffers and sizes.
# The compiled module still refuses sizes that do not match its buffers, with a Python
# exception instead of a crash:

# %%
small = nd.NDArray.make((2,), device=device)
try:
    mod.ewise_add(a._handle, small._handle, out._handle)
except (ValueError, IndexError, RuntimeError) as err:
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
# * `matmul_tiled` — the homework's interface: both operands arrive laid out as
#   $T \times T$ tiles (`__tile_size__` $= T$), each tile contiguous, and the output is written
#   in tiles too. The homework multiplies tile by tile, so each small product works on data
#   already in cache; this backend feeds the tiles to the same blocked engine as `matmul`;
# * `matmul` — a blocked (Goto/BLIS-style) kernel: panels of $A$ and $B$ packed to fit the
#   caches, a register-blocked micro-kernel using SIMD, OpenMP threads for large products.
#
# `NDArray.__matmul__` uses `matmul_tiled` when $m, n, p$ are all multiples of $T$. The tiled
# layout is itself a view: `as_strided` with shape $(m/T, n/T, T, T)$ and strides
# $(nT, T, n, 1)$, then `compact`.

# %%
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
        out = nd.NDArray.make((m // T, p // T, T, T), device=device)

        def run():
            mod.matmul_tiled(tx._handle, ty._handle, out._handle, m, n, p)

        def result():  # tile (i, j) holds rows iT.., columns jT..: back to row-major
            return out.permute((0, 2, 1, 3)).compact().reshape((m, p)).numpy()

        return run, result
    out = nd.NDArray.make((m, p), device=device)
    kernel = getattr(mod, name)

    def run():
        kernel(x._handle, y._handle, out._handle, m, n, p)

    return run, out.numpy


KERNELS = ["matmul_naive", "matmul_tiled", "matmul"]
tile_demo = tiles(nd.array(np.arange(4 * T * T).reshape(2 * T, 2 * T), device=device))
print("tiled layout of a", (2 * T, 2 * T), "matrix:", tile_demo.shape)
assert tile_demo.numpy()[0, 1, 0, 0] == T  # tile (0, 1) starts at column T of row 0

# %% [markdown]
# All three kernels agree with numpy to $10^{-4}$ relative error at every size we time:

# %%
SIZES = [64, 128, 256, 384, 512]
rng = np.random.default_rng(0)
inputs = {}
for n in SIZES:
    xa = rng.standard_normal((n, n)).astype(np.float32)
    xb = rng.standard_normal((n, n)).astype(np.float32)
    inputs[n] = (xa, xb, nd.array(xa, device=device), nd.array(xb, device=device))
    reference = xa.astype(np.float64) @ xb
    errors = []
    for k in KERNELS:
        run, result = kernel_call(k, inputs[n][2], inputs[n][3])
        run()
        errors.append(np.abs(result() - reference).max() / np.abs(reference).max())
    # the exact errors depend on the summation order (the SIMD width of the machine), so the
    # comparison is printed, not the values
    print(f"n={n:<4} relative error < 1e-4: "
          + "  ".join(f"{k}={e < 1e-4}" for k, e in zip(KERNELS, errors)))
    assert max(errors) < 1e-4

# %% [markdown]
# Now the speed, in GFLOP/s ($2n^3$ floating-point operations per product, best of a few runs).
# Timings depend on the machine and its load, so this cell's printed output is not compared by
# the tests.

# %% tags=["nbval-ignore-output"]
def best_time(fn, budget: float = 0.4, max_repeats: int = 5) -> float:
    """Shortest of up to max_repeats runs of fn(), stopping once `budget` seconds are spent."""
    times = []
    while len(times) < max_repeats and sum(times) < budget:
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


gflops = {k: [] for k in KERNELS + ["numpy"]}
for n in SIZES:
    xa, xb, na, nb = inputs[n]
    flops = 2.0 * n**3
    for k in KERNELS:
        run, _ = kernel_call(k, na, nb)
        gflops[k].append(flops / best_time(run) / 1e9)
    gflops["numpy"].append(flops / best_time(lambda: xa @ xb) / 1e9)
    print(f"n={n:<4} " + "  ".join(f"{k}={g[-1]:7.2f}" for k, g in gflops.items()))

# %% [markdown]
# On an idle machine the naive loop is limited by memory traffic (its inner loop strides
# through $B$ a column at a time) and stays far below the others, while packing, register
# blocking, SIMD and threads bring the blocked kernels close to numpy's BLAS. Timings on a
# busy machine scatter widely, which is why no number here is asserted; the figure below
# (log scale) is redrawn from this run's measurements.

# %%
fig, ax = plt.subplots(figsize=(6.4, 4.0))
styles = {"matmul_naive": "o-", "matmul_tiled": "s-", "matmul": "^-", "numpy": "k--"}
labels = {"matmul_naive": "naive (matmul_naive)", "matmul_tiled": f"tiled, T={T} (matmul_tiled)",
          "matmul": "blocked (matmul)", "numpy": "numpy (BLAS)"}
for k, g in gflops.items():
    ax.plot(SIZES, g, styles[k], label=labels[k])
ax.set_yscale("log")
ax.set_xticks(SIZES)
ax.set_xlabel("matrix size n (n×n @ n×n, float32)")
ax.set_ylabel("GFLOP/s (log scale)")
ax.set_title("CPU matmul kernels: blocking and packing close the gap to BLAS")
ax.legend()
ax.grid(True, which="both", alpha=0.3)
save_figure(fig, "matmul_gflops")
plt.show()

# %% [markdown]
# ## Summary
#
# * An NDArray is a buffer plus (shape, strides, offset); element $i$ is at
#   $\text{offset} + \sum_d i_d\,\text{strides}_d$.
# * `reshape`, `permute`, `broadcast_to` (stride 0) and slicing (offset + scaled strides) are
#   views: same buffer, no copy.
# * Kernels want contiguous memory, so ops call `compact()` first; `flip` is a negative-stride
#   view that is compacted immediately.
# * A Python op reaches C++ through the device module: `NDArray` method → `device.kernel`
#   (forwarded to the module) → pybind11 → a C++ loop over raw buffers.
# * The loop structure matters more than the language: the same C++ computes the same product
#   far faster once it is blocked, packed and vectorised (see the figure).
