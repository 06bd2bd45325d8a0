# %% [markdown]
# # 06 · Hardware acceleration: the CPU and CUDA kernels
#
# Lecture "Hardware Acceleration" (hw3). Notebook 05 built the NDArray: a flat buffer plus
# (shape, strides, offset), views without copies, and `compact()`. It ended with a measurement:
# the same product $C = AB$ runs far faster once the loop nest is blocked. This notebook opens
# the kernels underneath and does the arithmetic that explains it.
#
# 1. **The device-module protocol**: the fixed list of functions every device implements.
# 2. **Element-wise kernels** are flat loops over compact buffers, which is why every op calls
#    `compact()` first.
# 3. **Matmul arithmetic**: $2mnp$ flops against the bytes each loop nest moves; register
#    tiling and cache blocking, with the block sizes read from the C++ source.
# 4. **The tiled layout** `NDArray.__matmul__` builds with `as_strided`.
# 5. **The CUDA matmul kernel**: blocks, threads and shared memory, with the numbers for a
#    $1024^3$ product. Nothing here runs on a GPU: it is arithmetic on the kernel's source.
#
# The constants (block sizes, thread counts, padding) are parsed from `src/*.cc`, `src/*.h` and
# `src/*.cu`, so if someone retunes a kernel the asserts below will notice.

# %%
import inspect
import math
import re
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

import needle as ndl
import needle.backend_ndarray.ndarray as ndarray_module
from needle import backend_ndarray as nd
from needle.viz import save_figure

np.random.seed(0)
device = ndl.cpu()  # the compiled C++ backend
assert device.enabled(), "build the C++ backend first: make build"
mod = device.mod
SRC = Path(ndl.__file__).resolve().parents[1] / "src"
assert SRC.is_dir(), f"this notebook reads the kernel sources in {SRC}: run it from a checkout"


def source(name: str) -> str:
    """The text of src/NAME."""
    return (SRC / name).read_text()


def constant(text: str, pattern: str) -> int:
    """The one integer captured by the regex `pattern` in `text`."""
    found = re.findall(pattern, text)
    assert len(found) == 1, f"{pattern!r} matched {len(found)} times, expected once"
    return int(found[0])


print(device, "| source directory:", SRC.name)

# %% [markdown]
# ## 1. The device-module protocol
#
# `NDArray` never computes anything itself. It checks arguments, manages (shape, strides,
# offset), and calls a **device module** for every loop over memory. A device module is any
# Python module with these names (API.md §8): a buffer type `Array(size)`, copies in and out
# (`to_numpy`, `from_numpy`, `fill`), strided copies (`compact`, `ewise_setitem`,
# `scalar_setitem`), element-wise and scalar arithmetic, `matmul`, and the two reductions.
# Three modules implement it: numpy (`cpu_numpy()`), C++ (`cpu()`) and CUDA (`cuda()`).

# %%
PROTOCOL = [
    "Array", "to_numpy", "from_numpy", "fill", "compact", "ewise_setitem", "scalar_setitem",
    "ewise_add", "scalar_add", "ewise_mul", "scalar_mul", "ewise_div", "scalar_div",
    "scalar_power", "ewise_maximum", "scalar_maximum", "ewise_eq", "scalar_eq",
    "ewise_ge", "scalar_ge", "ewise_log", "ewise_exp", "ewise_tanh",
    "matmul", "reduce_max", "reduce_sum",
]
CPU_ONLY = ["matmul_tiled"]  # the compiled CPU device also has the tiled product


def functions(module) -> list[str]:
    """Public callables (functions and the Array class) of a device module, sorted."""
    return sorted(n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n)))


numpy_mod = ndl.cpu_numpy().mod
print(f"{'ndl.cpu().mod function':<24}{'role':<14}on cpu_numpy()")
for name in functions(mod):
    role = "protocol" if name in PROTOCOL else "cpu only" if name in CPU_ONLY else "extension"
    print(f"{name:<24}{role:<14}{hasattr(numpy_mod, name)}")

# %% [markdown]
# Every protocol name is on both CPU devices; `matmul_tiled` only on the compiled one; and the
# compiled module adds two extensions of its own (`matmul_naive`, the textbook loop used for
# comparison, and `num_threads`).

# %%
cpu_funcs, np_funcs = set(functions(mod)), set(functions(numpy_mod))
assert set(PROTOCOL) <= cpu_funcs and set(PROTOCOL) <= np_funcs
assert "matmul_tiled" in cpu_funcs and "matmul_tiled" not in np_funcs
assert cpu_funcs - set(PROTOCOL) - set(CPU_ONLY) == {"matmul_naive", "num_threads"}
print("__device_name__:", mod.__device_name__, "/", numpy_mod.__device_name__)
print("__tile_size__:  ", mod.__tile_size__, "/", getattr(numpy_mod, "__tile_size__", None))
assert (mod.__device_name__, numpy_mod.__device_name__) == ("cpu", "cpu_numpy")
assert not hasattr(numpy_mod, "__tile_size__")

# %% [markdown]
# The protocol is exactly what `NDArray` needs. Reading `ndarray.py` and collecting every
# `device.NAME` it uses (leaving out `BackendDevice`'s own methods such as `enabled`) gives back
# the protocol, nothing more and nothing less:

# %%
used = set(re.findall(r"device\.(\w+)", inspect.getsource(ndarray_module)))
used = {n for n in used if n != "mod" and not hasattr(nd.BackendDevice, n)}
print(len(used), "device functions used by NDArray")
assert used == set(PROTOCOL) | set(CPU_ONLY)

# %% [markdown]
# `cuda()` always exists: `enabled()` says whether its module was compiled (nvcc present at
# build time) **and** a GPU is visible. This cell's output depends on the machine, so the tests
# do not compare it; what they do check is that the answer is consistent: a built module
# carries the protocol (without `matmul_tiled`, so `NDArray` never tiles for CUDA), and a
# disabled device refuses to allocate with a `RuntimeError` rather than crashing.

# %% tags=["nbval-ignore-output"]
cuda = ndl.cuda()
built = cuda.mod is not None
print(f"cuda module built: {built} | cuda().enabled(): {cuda.enabled()}")
if built:
    assert set(PROTOCOL) <= set(functions(cuda.mod)) and not hasattr(cuda.mod, "matmul_tiled")
    assert cuda.enabled() == cuda.mod.is_available() == (cuda.mod.device_count() > 0)
else:
    assert not cuda.enabled()
if cuda.enabled():
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
# ## 2. Element-wise kernels: flat loops over compact buffers
#
# Every element-wise kernel has the same shape, whatever the array's shape:
#
# ```c++
# for (i = 0; i < size; ++i) out[i] = f(a[i], b[i]);   // C++: vectorised, OpenMP when large
# ```
#
# It receives only buffers: no shape, no strides. That is what makes it fast (contiguous loads,
# SIMD, no index arithmetic) and also why it must be given **compact** buffers. Hand the raw
# buffer of a transposed view to `ewise_add` and it adds elements in *memory* order, not in the
# view's logical order:

# %%
a = nd.array(np.arange(6).reshape(2, 3), device=device)
t = a.permute((1, 0))  # (3, 2) view of a's buffer, not compact
y = nd.array(np.full((3, 2), 10.0), device=device)
raw = nd.NDArray.make((3, 2), device=device)
mod.ewise_add(t._handle, y._handle, raw._handle)  # the kernel sees two flat buffers
print("kernel on t's raw buffer:\n", raw.numpy().astype(int))
print("t + y (NDArray compacts t first):\n", (t + y).numpy().astype(int))
expected = np.arange(6).reshape(2, 3).T + 10
assert np.array_equal((t + y).numpy(), expected)
assert np.array_equal(raw.numpy(), np.arange(6).reshape(3, 2) + 10)  # memory order: wrong
assert not np.array_equal(raw.numpy(), expected)

# %% [markdown]
# The alternative would be to pass shape and strides to every kernel and do index arithmetic
# per element in every op. needle (like the course) does that work in exactly one kernel,
# `compact`, and keeps all the others trivial. The price is one extra read-and-write pass over
# a non-compact operand. The C++ module only goes multi-threaded above a size where the thread
# start-up pays for itself:

# %%
cpu_cc = source("ndarray_backend_cpu.cc")
PARALLEL_EWISE = 1 << constant(cpu_cc, r"kParallelEwise = idx_t\(1\) << (\d+);")
print(f"element-wise loops use OpenMP threads from {PARALLEL_EWISE:,} elements "
      f"({PARALLEL_EWISE * 4 // 2**20} MiB of float32) up")
assert PARALLEL_EWISE == 262_144

# %% [markdown]
# What compacting first costs, measured here (timings vary, so the output is not compared):
# adding two $2048 \times 2048$ arrays, once compact and once with one operand transposed.

# %% tags=["nbval-ignore-output"]
big = nd.array(np.random.randn(2048, 2048).astype(np.float32), device=device)
big_t = big.permute((1, 0))


def best_ms(fn, repeats: int = 5) -> float:
    """Shortest of `repeats` runs of fn(), in milliseconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * min(times)


print(f"compact + compact:     {best_ms(lambda: big + big):6.2f} ms")
print(f"compact + transposed:  {best_ms(lambda: big + big_t):6.2f} ms  (includes compact)")
print(f"compact of transposed: {best_ms(lambda: big_t.compact()):6.2f} ms")

# %% [markdown]
# On the GPU the same kernels run one **thread per element**. The launcher uses blocks of
# `BLOCK` threads and at most `MAX_BLOCKS` blocks; a *grid-stride loop* (`i += gridDim.x *
# blockDim.x`) lets a capped grid still cover any size:

# %%
cu = source("ndarray_backend_cuda.cu")
BLOCK = constant(cu, r"constexpr int BLOCK = (\d+);")
MAX_BLOCKS = constant(cu, r"constexpr size_t MAX_BLOCKS = (\d+);")


def grid_for(n: int) -> int:
    """Blocks launched for n elements (ndarray_backend_cuda.cu: grid_for)."""
    return min(math.ceil(n / BLOCK), MAX_BLOCKS)


print(f"BLOCK = {BLOCK}, MAX_BLOCKS = {MAX_BLOCKS}")
print(f"{'elements':>12} {'blocks':>8} {'threads':>12} {'elements per thread (max)':>26}")
for n in [1000, 2**20, 2**26]:
    blocks = grid_for(n)
    print(f"{n:>12,} {blocks:>8,} {blocks * BLOCK:>12,} {math.ceil(n / (blocks * BLOCK)):>26}")
assert (BLOCK, MAX_BLOCKS) == (256, 65535)
assert [grid_for(n) for n in [1000, 2**20, 2**26]] == [4, 4096, 65535]
assert math.ceil(2**26 / (65535 * 256)) == 5  # 2^26 is a hair more than 4 grid-fulls

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
# paid for with $v_1 v_2$ accumulator registers. In `src/ndarray_backend_cpu_gemm.h` the tile
# is $MR \times NR$ and depends on the instruction set the compiler targets. With AVX-512 (32
# vector registers of 16 floats) it is $12 \times 32$: 24 accumulator registers, two for the
# row of $B$, one for the broadcast element of $A$, 27 of 32. With AVX2 (16 registers of 8
# floats) it is $6 \times 16$: 15 of 16. A portable $4 \times 16$ loop is left to the compiler's
# vectoriser everywhere else.

# %%
gemm_h = source("ndarray_backend_cpu_gemm.h")
CPU_CONFIGS = {
    name: dict(MR=int(mr), NR=int(nr), KC=int(kc), MC=int(mc))
    for mr, nr, kc, mc, name in re.findall(
        r"constexpr int MR = (\d+), NR = (\d+);\s*constexpr idx_t kDefaultKC = (\d+), kDefaultMC = (\d+);"
        r"\s*constexpr const char\* kKernelName = \"([\w-]+)\";", gemm_h)
}
ISA = {"avx512": (32, 16), "avx2-fma": (16, 8)}  # (vector registers, floats per register)


def register_intensity(cfg) -> float:
    """Flops per float loaded into registers by an MR x NR micro-kernel."""
    return 2 * cfg["MR"] * cfg["NR"] / (cfg["MR"] + cfg["NR"])


def registers_needed(cfg, lanes: int) -> int:
    """Vector registers: MR x NR accumulators, one row of B, one broadcast element of A."""
    return cfg["MR"] * cfg["NR"] // lanes + cfg["NR"] // lanes + 1


print(f"{'kernel':<10}{'MR x NR':>9}{'registers used':>16}{'flop/float':>12}{'flop/byte':>11}")
for name, cfg in CPU_CONFIGS.items():
    regs = f"{registers_needed(cfg, ISA[name][1])} of {ISA[name][0]}" if name in ISA else "-"
    ai = register_intensity(cfg)
    print(f"{name:<10}{cfg['MR']:>4} x {cfg['NR']:<4}{regs:>16}{ai:>12.2f}{ai / 4:>11.2f}")

assert CPU_CONFIGS == {"avx512": dict(MR=12, NR=32, KC=256, MC=96),
                       "avx2-fma": dict(MR=6, NR=16, KC=256, MC=72),
                       "portable": dict(MR=4, NR=16, KC=256, MC=64)}
assert abs(register_intensity(CPU_CONFIGS["avx512"]) - 17.45) < 0.01
assert abs(register_intensity(CPU_CONFIGS["avx2-fma"]) - 8.73) < 0.01
assert register_intensity(CPU_CONFIGS["portable"]) == 6.4
assert registers_needed(CPU_CONFIGS["avx512"], lanes=16) == 27
assert registers_needed(CPU_CONFIGS["avx2-fma"], lanes=8) == 15

# %% [markdown]
# Which one this build uses is a property of the machine it was compiled on (so this output is
# not compared); the compiled module says so in `__matmul_kernel__`:

# %% tags=["nbval-ignore-output"]
print("this build's micro-kernel:", mod.__matmul_kernel__, CPU_CONFIGS[mod.__matmul_kernel__])

# %% [markdown]
# ## 5. Cache blocking: packing panels
#
# Registers hold one $MR \times NR$ block of $C$; the operands it streams through must come
# from cache, not from memory. The blocked driver (`gemm_work`, Goto/BLIS style) runs, on one
# thread:
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
# The footprints explain the sizes: a B sliver must fit in L1 and the A block in L2.

# %%
print(f"{'kernel':<10}{'B sliver KC x NR (L1)':>24}{'A block MC x KC (L2)':>24}")
for name, cfg in CPU_CONFIGS.items():
    sliver, block = cfg["KC"] * cfg["NR"] * 4, cfg["MC"] * cfg["KC"] * 4
    print(f"{name:<10}{sliver // 1024:>20} KiB{block // 1024:>20} KiB")
    assert cfg["MC"] % cfg["MR"] == 0  # an A block is whole MR slivers
assert CPU_CONFIGS["avx512"]["KC"] * CPU_CONFIGS["avx512"]["NR"] * 4 == 32 * 1024
assert CPU_CONFIGS["avx512"]["MC"] * CPU_CONFIGS["avx512"]["KC"] * 4 == 96 * 1024

# %% [markdown]
# Here is that loop nest in numpy, with counters for the floats each level supplies. It is a
# model of the C++ (one thread, no threading split), and we check it two ways: it computes
# $AB$ (on sizes that exercise partial blocks and edge slivers), and its counts match the
# closed-form formulas above.

# %%
def blocked_matmul(A: np.ndarray, B: np.ndarray, cfg: dict, compute: bool = True):
    """C = A @ B by gemm_work's loop nest (one thread), and the floats moved per level.

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

# %%
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
avx512 = levels["avx512"]
assert abs(avx512["registers"] - 17.32) < 0.01 and abs(avx512["caches"] - 47.35) < 0.01
assert abs(avx512["memory"] - 227.56) < 0.01  # = 2n / (1 + 2n/KC): C is re-read per K panel
assert 2 / (1 / 32 + 1 / 96) == 48.0

# %% [markdown]
# Each level multiplies the reuse of the one below it: the naive loop's 1 flop per float
# becomes about 17 at the registers, 47 at L1 and 228 at main memory. That, plus SIMD and
# threads, is the gap between `matmul_naive` and `matmul` in notebook 05's figure.
#
# ## 6. The tiled layout of `NDArray.__matmul__`
#
# The course's hw3 asks for a second kind of blocking, in the *data layout*: when $m, n, p$
# are multiples of `__tile_size__` $= T$, `NDArray.__matmul__` rewrites each operand as a
# compact array of $T \times T$ tiles and calls `matmul_tiled`. The rewrite is one
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
# With the real tile size the whole path of `a @ b` is: tile both operands, `matmul_tiled`
# writes a tiled $(m/T, p/T, T, T)$ output, and `permute((0, 2, 1, 3))` plus `compact` turns
# it back into rows. Redoing it by hand gives exactly what `a @ b` returns, and numpy's
# product:

# %%
T = mod.__tile_size__
assert T == constant(gemm_h, r"constexpr idx_t kFastTile = (\d+);") == 8


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
assert np.array_equal(by_hand, (a_nd @ b_nd).numpy())
assert np.allclose(by_hand, xa.astype(np.float64) @ xb, rtol=1e-5, atol=1e-5)

# %% [markdown]
# Why bother: a $T \times T$ tile of a row-major matrix is $T$ short pieces of $T$ floats, one
# per row, scattered through memory; in the tiled layout it is one run of $T^2$ floats. For
# $T = 8$ that is 256 bytes, exactly four 64-byte cache lines, where a $1024$-wide row-major
# matrix spreads the same tile over 8 lines, each only half used.

# %%
tile_bytes, line = T * T * 4, 64
print(f"tile: {tile_bytes} bytes = {tile_bytes // line} cache lines (tiled) "
      f"vs {T} lines of which {T * 4} bytes used (row-major)")
assert tile_bytes == 256 and tile_bytes // line == 4 and T * 4 == line // 2

# %% [markdown]
# ## 7. The CUDA matmul kernel
#
# `matmul_kernel` in `src/ndarray_backend_cuda.cu` is a template over the tile sizes
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
BLOCKS_PER_SM = constant(cu, r"big_tiles >= (\d+) \* static_cast<size_t>\(sm_count\(\)\)")
BIG, SMALL = CUDA_CONFIGS
print("BM, BN, BK, TM, TN:", "big", BIG, "| small", SMALL, "| As padding:", PAD)
assert BIG == (128, 128, 8, 8, 8) and SMALL == (64, 64, 8, 4, 4) and PAD == 4
assert BLOCKS_PER_SM == 2


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
        "shared bytes per block": 4 * (BK * (BM + PAD) + BK * BN),
        # every in-range element of A is loaded once per column of tiles, B once per row
        "global reads (floats)": n * (m * tiles_p + p * tiles_m),
        # each thread, each k: TM + TN shared loads for TM * TN multiply-adds
        "shared reads (floats)": m * n * p * (TM + TN) // (TM * TN),
    }

# %% [markdown]
# For a $1024^3$ product on an H200 (132 SMs): $8 \times 8 = 64$ big tiles are fewer than
# $2 \cdot 132$, so the launcher takes the $64 \times 64$ kernel: **256 blocks of 256
# threads**, each with **4224 bytes** of shared memory ($8 \cdot 68 + 8 \cdot 64$ floats).
# A GPU with at most 32 SMs would get the $128 \times 128$ kernel: 64 blocks, 8320 bytes.
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
assert plans[SMALL] == {"blocks": 256, "threads per block": 256, "shared bytes per block": 4224,
                        "global reads (floats)": 2**25, "shared reads (floats)": 2**29}
assert plans[BIG] == {"blocks": 64, "threads per block": 256, "shared bytes per block": 8320,
                      "global reads (floats)": 2**24, "shared reads (floats)": 2**28}
assert untiled == 2**31 and untiled * 4 == 8 * 2**30
assert [untiled // plans[c]["global reads (floats)"] for c in (SMALL, BIG)] == [64, 128]
assert [untiled // plans[c]["shared reads (floats)"] for c in (SMALL, BIG)] == [4, 8]

# %% [markdown]
# The reduction is the tile size: $2/(1/BM + 1/BN)$, the same formula as the CPU's register
# tile one level up. Inside the block, the per-thread register tile does it again: each
# thread loads $TM + TN$ floats from shared memory per $TM \cdot TN$ multiply-adds, a factor
# $4$ ($4 \times 4$) or $8$ ($8 \times 8$) fewer shared-memory reads than one per operand.
#
# To check that the mapping is right, here is the kernel emulated in numpy, thread index
# arithmetic and all (vectorised over the threads of a block), on sizes that are not multiples
# of the tiles. Every output must be written by exactly one thread, the product must match,
# and the global loads must match the formula:

# %%
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
# The padding is for the transposed store into `As`: consecutive threads write consecutive
# rows $r$ of one column $c$ of the $A$ tile, word $c\,(BM + \text{pad}) + r$. With no padding,
# $BM = 64$ is a multiple of 32, every $c$ lands in the same four banks, and the store is an
# 8-way conflict; with 4 words of padding each $c$ shifts by 4 banks and all 32 threads hit
# distinct banks. The audit below replays the first warp's index arithmetic from the kernel:

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
        "Bs store (conflict)": max(bank_conflict(r * BN + c) for r, c in zip(rb, cb)),
        "As read (conflict)": max(bank_conflict(k * (BM + pad) + ty + i * TY)
                                  for k in range(BK) for i in range(TM)),
        "Bs read (conflict)": max(bank_conflict(k * BN + tx + j * TX)
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
# \text{bandwidth})$. With NVIDIA's datasheet figures for an H200 SXM (67 TFLOP/s FP32 without
# tensor cores, 4.8 TB/s HBM), the ridge, where the two limits meet, is at 13.96 flop/byte.
# Counting every global load as memory traffic (the 50 MB L2 cache catches many of them in
# practice, so this is the pessimistic view), the untiled product at 0.25 flop/byte could reach
# at most 1.2 TFLOP/s, under 2% of peak; $64 \times 64$ tiles (16 flop/byte) already sit past
# the ridge, and $128 \times 128$ tiles (32 flop/byte) clear it by more than a factor of two.
# The left panel puts all the traffic counts of this notebook side by side.

# %%
PEAK, BANDWIDTH = 67e12, 4.8e12  # H200 SXM datasheet: FP32 flop/s, HBM bytes/s
ridge = PEAK / BANDWIDTH
gpu_points = {"untiled": flops / (untiled * 4),
              "64x64 tiles": flops / (plans[SMALL]["global reads (floats)"] * 4),
              "128x128 tiles": flops / (plans[BIG]["global reads (floats)"] * 4)}
bound = {k: min(PEAK, ai * BANDWIDTH) for k, ai in gpu_points.items()}
for k, ai in gpu_points.items():
    print(f"{k:<14} {ai:6.2f} flop/byte -> at most {bound[k] / 1e12:5.2f} TFLOP/s "
          f"({100 * bound[k] / PEAK:5.1f}% of peak)")
print(f"ridge: {ridge:.2f} flop/byte")
assert abs(ridge - 13.96) < 0.01 and abs(bound["untiled"] / 1e12 - 1.2) < 1e-9
assert bound["untiled"] / PEAK < 0.02
assert gpu_points["64x64 tiles"] == 16 > ridge and gpu_points["128x128 tiles"] == 32 > 2 * ridge

# %%
cpu_cfg = CPU_CONFIGS["avx512"]
cpu_counts = closed_form(N, N, N, cpu_cfg)
traffic = {
    "naive loop (2n³)": naive_loads,
    "CPU: L1 → registers (12×32)": cpu_counts["registers"],
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
ax2.loglog(ai, np.minimum(PEAK, ai * BANDWIDTH) / 1e12, "k-", label="roofline (H200 datasheet)")
ax2.axvline(ridge, color="0.6", ls=":", label=f"ridge {ridge:.1f} flop/byte")
for (k, x), marker in zip(gpu_points.items(), ["o", "s", "^"]):
    ax2.plot(x, bound[k] / 1e12, marker, ms=9, label=f"{k}: {x:g} flop/byte")
ax2.set_xlabel("arithmetic intensity (flop per byte of global memory)")
ax2.set_ylabel("attainable TFLOP/s (FP32)")
ax2.set_title("GPU matmul: tiling crosses the ridge")
ax2.legend(loc="lower right", fontsize=8)
ax2.grid(True, which="both", alpha=0.3)
fig.tight_layout()
save_figure(fig, "matmul_roofline")
plt.show()

# %% [markdown]
# ## Summary
#
# * A device is a module implementing one protocol (buffers, strided copies, element-wise and
#   scalar ops, `matmul`, reductions); `NDArray` calls exactly those functions.
# * Element-wise kernels are flat loops over compact buffers; all stride arithmetic lives in
#   `compact`, which is why ops compact their operands first.
# * Matmul is $2mnp$ flops over at least $mn + np + mp$ floats. The naive loop loads 2 floats
#   per multiply-add; a $v_1 \times v_2$ tile of reuse cuts that to $2/(1/v_1 + 1/v_2)$
#   flops per float, at each level: registers ($MR \times NR$), caches ($NR$, $MC$), memory
#   ($KC$) on the CPU; shared memory ($BM \times BN$) and registers ($TM \times TN$) on the GPU.
# * `NDArray.__matmul__`'s tiled layout is an `as_strided` view with strides $(cT, T, c, 1)$,
#   compacted so each $T \times T$ tile is one contiguous run.
# * The CUDA kernel computes a $64 \times 64$ (or $128 \times 128$) tile of $C$ per block of 256
#   threads, staging operand tiles through 4–8 KiB of padded shared memory: 64–128 times less
#   global traffic than one thread per output, with coalesced loads and no bank conflicts.
