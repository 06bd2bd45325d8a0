# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 07 · Convolutions
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/needle-companion/needle-companion/blob/main/notebooks/07_convolutions.ipynb)
#
# **Lecture:** 10, "Convolutional Networks", and 14, "Implementing Convolutions"
#
# **Homework:** hw4 Q3 (`pad`, `flip`, `dilate`/`undilate`, `conv` forward and backward,
# `nn.Conv`), Q2 (the CIFAR-10 dataset) and the ResNet-9 training of Q3
#
# **Prerequisites:** notebook 05 (strides, views, `compact`); notebook 02 (vector-Jacobian
# products)
#
# **You will be able to:** say what weight sharing saves against a dense layer and how the
# receptive field grows with depth; compute a convolution as matrix products and as one im2col
# product, and time the formulations against each other; tell NHWC from NCHW storage and what
# `nn.Conv` does about it; predict output sizes for any stride, padding and dilation; estimate im2col's memory cost;
# derive a convolution's input gradient (flip, dilate, crop), say how needle computes both
# gradients (col2im and im2col products) and check them numerically; compute max and average
# pooling and their gradients; train ResNet-9 and look at its first layer's feature maps
#
# **Run time:** about 30 s on a 2-core x86-64 machine
#
# With the real `needle` package, we will
#
# 1. write a convolution as a loop, then as **matrix multiplications**, and count what weight
#    sharing saves against a dense layer;
# 2. get the output size for any stride, padding and dilation, and check it against `ndl.conv`;
# 3. build the **im2col** matrix as a strided *view* (no copy) and count what compacting it
#    costs; compare NHWC with NCHW storage (what `nn.Conv` does about it); time the loop, the
#    $K^2$ products, im2col and `ndl.conv`;
# 4. derive the gradient of a convolution: another convolution, with a **flipped** kernel, a
#    **dilated** output gradient and a final crop — checked against finite differences — and
#    see how needle computes it instead (col2im for the input, one im2col product for the weight);
# 5. compute **max and average pooling** and their gradients;
# 6. train **ResNet-9** on an offline image set and look at what its first layer learned.

# %% tags=["remove-cell"] cellView="form" jupyter={"source_hidden": true}
#@title Colab set-up: in Colab this installs needle (2-3 minutes); elsewhere it does nothing
import os, shlex, subprocess, sys, tempfile; repo = os.environ.get("NEEDLE_COLAB_REPO", "https://github.com/needle-companion/needle-companion")
if "google.colab" in sys.modules or os.environ.get("NEEDLE_COLAB_SIMULATE") == "1":  # companion/colab_setup.py
    py, src, q = sys.executable, os.path.join(tempfile.gettempdir(), "needle-companion"), shlex.quote
    done = subprocess.run(f"{q(py)} -m companion.colab_setup --status 2>/dev/null || {{ {{ test -d {q(src)} || git clone -q --depth=1 {q(repo)} {q(src)}; }} && cd {q(src)} && {q(py)} -m companion.colab_setup --install {q(repo)} --cwd {q(os.getcwd())}; }}", shell=True, capture_output=True, text=True); print(done.stdout + done.stderr[-3000:], end=""); assert done.returncode == 0, f"the set-up could not install this project from {repo} (what failed is above)"

# %%
import numpy as np
import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator

import needle as ndl
import needle.nn as nn
from needle import backend_ndarray as nd
import companion.data
from companion.apps.models import ResNet9
from companion.apps.cifar_training import epoch_general_cifar10, evaluate_cifar10
from companion import lecture
from companion.viz import LiveCurves, save_figure

np.random.seed(0)
# cuda() where a GPU is visible (Colab's GPU runtime), else the compiled CPU backend when it is
# built, else needle's numpy device
from companion.lecture import best_device  # noqa: E402
device = best_device()

# %% [markdown]
# ## 1. A convolution is many small matrix multiplications
#
# needle's `conv` takes images in **NHWC** layout, $x \in \mathbb{R}^{N\times H\times W\times
# C_{in}}$, and a kernel $W \in \mathbb{R}^{K\times K\times C_{in}\times C_{out}}$. Like every deep
# learning library it computes a cross-correlation (no kernel flip):
#
# $$z[n, i, j, :] = \sum_{a=0}^{K-1}\sum_{b=0}^{K-1} x[n, i+a, j+b, :]\; W[a, b, :, :].$$
#
# For each kernel offset $(a, b)$ the inner term is a matrix product of a $(\cdot, C_{in})$ slice
# of the image with the $(C_{in}, C_{out})$ matrix $W[a, b]$. So the simplest fast convolution
# loops over the $K^2$ offsets only — never over pixels or channels.

# %%
def conv_offsets(x, W):
    """Valid (unpadded, stride-1) NHWC convolution as K*K batched matmuls."""
    N, H, Wd, C = x.shape
    K, _, _, C_out = W.shape
    out = np.zeros((N, H - K + 1, Wd - K + 1, C_out))
    for a in range(K):
        for b in range(K):
            out += x[:, a:a + H - K + 1, b:b + Wd - K + 1, :] @ W[a, b]
    return out


x = np.random.randn(2, 6, 6, 3).astype(np.float32)
W = np.random.randn(3, 3, 3, 4).astype(np.float32)
z = ndl.conv(ndl.Tensor(x, device=device), ndl.Tensor(W, device=device), padding=0).numpy()
err = np.abs(z - conv_offsets(x, W)).max()
print(f"output shape {z.shape}; needle and the loop agree to 1e-4: {err < 1e-4}")
assert z.shape == (2, 4, 4, 4) and err < 1e-4

# %% [markdown]
# A $1\times1$ convolution is the extreme case: a single matrix product applied to every pixel,
# i.e. a `Linear` layer over the channel dimension.

# %%
W1 = np.random.randn(1, 1, 3, 5).astype(np.float32)
z1 = ndl.conv(ndl.Tensor(x, device=device), ndl.Tensor(W1, device=device), padding=0).numpy()
assert np.allclose(z1, x @ W1[0, 0], atol=1e-5)
print("1x1 conv == x @ W[0, 0]:", z1.shape)

# %% [markdown]
# ### Why convolutions (lecture 10): few weights, shared across positions
#
# A dense layer that maps a $32\times32\times3$ image to $32\times32\times16$ features needs a
# weight for every (input pixel-channel, output pixel-channel) pair. A $3\times3$ convolution
# with the same input and output needs $3 \cdot 3 \cdot 3 \cdot 16$: the same small kernel is
# used at every position (**weight sharing**), and each output looks only at a $3\times3$
# neighbourhood. Sharing also makes the layer **translation equivariant**: shift the image and
# the (stride-1) output shifts with it, so a detector for an edge works wherever the edge is.
# Variants cut the count further: a *grouped* convolution splits the channels into $g$ groups
# that do not mix ($1/g$ of the weights), and a *depthwise* one gives every channel its own
# $K\times K$ filter ($K^2 C$ weights, usually followed by a $1\times1$ convolution to mix
# channels). needle's `conv` has neither; both are one convolution per group.

# %%
dense_weights = (32 * 32 * 3) * (32 * 32 * 16)
conv_weights = 3 * 3 * 3 * 16
print(f"dense 32x32x3 -> 32x32x16: {dense_weights:,} weights; 3x3 conv: {conv_weights} weights "
      f"({dense_weights // conv_weights:,}x fewer)")
print(f"depthwise 3x3 on 64 channels: {3 * 3 * 64} weights; full 3x3 64 -> 64: "
      f"{3 * 3 * 64 * 64:,}; grouped (4 groups): {3 * 3 * 64 * 64 // 4:,}")
assert dense_weights == 50_331_648 and conv_weights == 432

xs = np.random.randn(1, 10, 10, 2).astype(np.float32)
Ws = np.random.randn(3, 3, 2, 4).astype(np.float32)
shifted = np.roll(xs, (1, 2), axis=(1, 2))  # the image moved 1 row down, 2 columns right
z_x = ndl.conv(ndl.Tensor(xs, device=device), ndl.Tensor(Ws, device=device), padding=0).numpy()
z_s = ndl.conv(ndl.Tensor(shifted, device=device), ndl.Tensor(Ws, device=device),
               padding=0).numpy()
same = np.allclose(z_s[:, 1:, 2:], z_x[:, :-1, :-2], atol=1e-5)  # away from the wrapped edge
print(f"shifted input -> output shifted by the same (1, 2) pixels: {same}")
assert same

# %% [markdown]
# The price of small kernels is a small view. Each layer sees $K$ of its input's positions
# along each axis, and its input's positions are $j$ pixels apart, where $j$ is the product of
# the strides so far; so the **receptive field** (the image pixels one output can depend on)
# grows by $(K - 1)\,j$ per layer. Through ResNet-9's convolutions (section 6) it outgrows the
# $32\times32$ image after four of them, which is what lets its last feature, a single pixel,
# describe the whole image:

# %%
RESNET9_CONVS = [("ConvBN(3, 16, 7, 4)", 7, 4), ("ConvBN(16, 32, 3, 2)", 3, 2),
                 ("residual ConvBN(32, 32, 3, 1)", 3, 1), ("residual ConvBN(32, 32, 3, 1)", 3, 1),
                 ("ConvBN(32, 64, 3, 2)", 3, 2), ("ConvBN(64, 128, 3, 2)", 3, 2),
                 ("residual ConvBN(128, 128, 3, 1)", 3, 1),
                 ("residual ConvBN(128, 128, 3, 1)", 3, 1)]
field, jump = 1, 1
for name, K_, S_ in RESNET9_CONVS:
    field, jump = field + (K_ - 1) * jump, jump * S_
    print(f"{name:<32} receptive field {field:>3} x {field:<3} pixels (outputs {jump} apart)")
assert field == 223 and jump == 32

# %% [markdown]
# ## 2. Output sizes: stride, padding, dilation
#
# With zero padding $P$, stride $S$ and a kernel of size $K$ dilated by $D$ (taps $D$ pixels
# apart, so it spans $D(K-1)+1$ pixels), the output has
#
# $$H_{out} = \left\lfloor \frac{H + 2P - D(K-1) - 1}{S} \right\rfloor + 1$$
#
# rows (and likewise columns). needle's `conv` has no dilation argument; a dilated kernel is an
# ordinary kernel with $D-1$ zeros between its taps, which `ndl.dilate` inserts (it also appends
# zeros after the last tap, which we cut off). The table checks the formula against the shapes
# `ndl.conv` actually returns.

# %%
def out_size(H, K, S=1, P=0, D=1):
    return (H + 2 * P - D * (K - 1) - 1) // S + 1


def dilated_kernel(W, D):
    """(K, K, Ci, Co) -> (D(K-1)+1, D(K-1)+1, Ci, Co) with D-1 zeros between taps."""
    K = W.shape[0]
    Wd = ndl.dilate(ndl.Tensor(W, device=device), (0, 1), D - 1).numpy()
    return Wd[:D * (K - 1) + 1, :D * (K - 1) + 1]


print(" H  K  S  P  D | formula  ndl.conv")
for H, K, S, P, D in [(32, 3, 1, 1, 1), (32, 3, 2, 1, 1), (32, 7, 4, 3, 1), (8, 3, 2, 1, 1),
                      (11, 5, 3, 0, 1), (16, 3, 1, 2, 2), (16, 3, 2, 0, 3), (9, 4, 1, 0, 1)]:
    xin = ndl.Tensor(np.random.randn(1, H, H, 2).astype(np.float32), device=device)
    Wk = dilated_kernel(np.random.randn(K, K, 2, 3).astype(np.float32), D)
    got = ndl.conv(xin, ndl.Tensor(Wk, device=device), stride=S, padding=P).shape[1]
    print(f"{H:2d} {K:2d} {S:2d} {P:2d} {D:2d} | {out_size(H, K, S, P, D):7d} {got:9d}")
    assert got == out_size(H, K, S, P, D)

# %% [markdown]
# Two sizes to remember: "same" padding $P = \lfloor K/2 \rfloor$ keeps $H$ at stride 1 for odd
# $K$ (that is what `nn.Conv` uses), and stride $S$ then gives $\lceil H/S \rceil$. ResNet-9's
# strides 4, 2, 2, 2 take a $32\times32$ image down to $8, 4, 2, 1$ pixels.

# %%
sizes, h = [32], ndl.Tensor(np.zeros((1, 32, 32, 1), dtype=np.float32), device=device)
for K, S in [(7, 4), (3, 2), (3, 2), (3, 2)]:  # ResNet-9's strided layers, "same" padding
    h = ndl.conv(h, ndl.Tensor(np.zeros((K, K, 1, 1), dtype=np.float32), device=device),
                 stride=S, padding=K // 2)
    sizes.append(h.shape[1])
    assert h.shape[1] == out_size(sizes[-2], K, S, P=K // 2) == -(-sizes[-2] // S)  # ceil(H/S)
print(sizes)
assert sizes == [32, 8, 4, 2, 1]

# %% [markdown]
# ## 3. im2col as a strided view, and its memory cost
#
# Rather than $K^2$ separate products, im2col gathers every $K\times K\times C_{in}$ patch into one
# row of a matrix and does **one** big matmul:
#
# $$\underbrace{\hat x}_{(N H_{out} W_{out}) \times (K K C_{in})} \cdot
# \underbrace{W}_{(K K C_{in}) \times C_{out}}.$$
#
# The patches need no copying to *describe*: a compact NHWC array has strides
# $(H W C,\; W C,\; C,\; 1)$, and the 6-D array of patches
# $\hat x[n, i, j, a, b, c] = x[n, i+a, j+b, c]$ is the same buffer with strides
# $(HWC,\; WC,\; C,\; WC,\; C,\; 1)$ — moving one output row or one kernel row is the same step.

# %%
A = nd.array(np.arange(1 * 5 * 5 * 2, dtype=np.float32).reshape(1, 5, 5, 2), device=device)
N_, H_, W_, C_ = A.shape
K = 3
Ho = H_ - K + 1
view = A.as_strided((N_, Ho, Ho, K, K, C_), (H_ * W_ * C_, W_ * C_, C_, W_ * C_, C_, 1))
print("patch view shape", view.shape, "strides", view.strides)
print("same buffer as A:", view._handle.ptr() == A._handle.ptr())
assert view._handle.ptr() == A._handle.ptr()
patch = view.numpy()[0, 1, 2]            # the 3x3x2 patch under output pixel (1, 2)
assert np.array_equal(patch, A.numpy()[0, 1:4, 2:5])

# %% [markdown]
# The matmul, however, needs the view **compacted** into a real
# $(N H_{out} W_{out}) \times (K^2 C_{in})$ matrix: each input pixel is copied once for every
# kernel position that covers it, about $K^2$ times at stride 1. The result is the convolution:

# %%
cols = view.compact().reshape((N_ * Ho * Ho, K * K * C_))
Wk = np.random.randn(K, K, C_, 4).astype(np.float32)
z_im2col = (cols @ nd.array(Wk.reshape(-1, 4), device=device)).numpy().reshape(1, Ho, Ho, 4)
z_ref = ndl.conv(ndl.Tensor(A.numpy(), device=device), ndl.Tensor(Wk, device=device),
                 padding=0).numpy()
assert np.allclose(z_im2col, z_ref, atol=1e-4)
print(f"input {A.size} floats -> im2col matrix {cols.size} floats "
      f"({cols.size / A.size:.2f}x)")
assert (A.size, cols.size) == (50, 162)

# %% [markdown]
# How much is that for real layers? For a batch of 32 images of $32\times32$ with 64 channels
# and a $3\times3$ kernel (stride 1, padding 1), the input holds 8 MiB of float32 and its im2col
# matrix **72 MiB**: nine times more. Strided layers are cheaper: ResNet-9's first layer
# ($7\times7$, stride 4) makes a matrix only 2.17 times its padded input.

# %%
def im2col_cost(N, H, C, K, S, P):
    """(padded input floats, im2col floats) of a square NHWC conv."""
    Ho = out_size(H, K, S, P)
    return N * (H + 2 * P) ** 2 * C, N * Ho * Ho * K * K * C


MiB = 4 / 2 ** 20  # bytes per float32, in MiB
x_floats = 32 * 32 * 32 * 64                           # the layer's input, N*H*W*C
_, col_floats = im2col_cost(32, 32, 64, 3, 1, 1)       # padding 1: 32x32 outputs
print(f"3x3 conv, 32x32x64, batch 32: input {x_floats * MiB:.1f} MiB, "
      f"im2col {col_floats * MiB:.1f} MiB")
first = im2col_cost(32, 32, 3, 7, 4, 3)
print(f"ResNet-9 layer 1: padded input {first[0]} floats, im2col {first[1]} floats "
      f"({first[1] / first[0]:.2f}x)")

# %% [markdown]
# The count is checked against needle itself: build the strided patch view of a padded batch for
# ResNet-9's first layer (stride 4 enters the strides of the output axes), compact it, and
# count the floats the real matrix holds — and check that its product with the kernel is
# `ndl.conv`.

# %%
def im2col(x: np.ndarray, K: int, S: int, P: int):
    """NHWC x -> compact (N*Ho*Wo, K*K*C) patch matrix of a square KxK, stride-S, padding-P conv."""
    xp = nd.array(np.pad(x, ((0, 0), (P, P), (P, P), (0, 0))), device=device)
    N, Hp, Wp, C = xp.shape
    Ho = (Hp - K) // S + 1
    view = xp.as_strided((N, Ho, Ho, K, K, C),
                         (Hp * Wp * C, S * Wp * C, S * C, Wp * C, C, 1))
    return xp, view.compact().reshape((N * Ho * Ho, K * K * C))


x_first = np.random.rand(32, 32, 32, 3).astype(np.float32)
xp_first, cols_first = im2col(x_first, 7, 4, 3)
print(f"needle: padded input {xp_first.size} floats, compacted im2col {cols_first.size} floats")
assert (xp_first.size, cols_first.size) == first
W_first = np.random.randn(7, 7, 3, 16).astype(np.float32)
z_cols = (cols_first @ nd.array(W_first.reshape(-1, 16), device=device)).numpy()
z_conv = ndl.conv(ndl.Tensor(x_first, device=device), ndl.Tensor(W_first, device=device),
                  stride=4, padding=3).numpy()
assert np.allclose(z_cols.reshape(z_conv.shape), z_conv, atol=1e-3)

# %% [markdown]
# ### Storage order: NHWC and NCHW
#
# `ndl.conv` takes **NHWC**: the $C$ channels of one pixel are adjacent in memory, so one row
# of the im2col matrix (a $K\times K\times C$ patch) is $K$ runs of $KC$ contiguous floats,
# one per kernel row. In **NCHW** (PyTorch's order, and the order hw4's CIFAR-10 images and
# `nn.Conv` use) each channel is a plane of its own, and the same patch is $CK$ runs of $K$
# floats: more, shorter reads. The count for a $3\times3\times16$ patch:

# %%
def runs(positions: np.ndarray) -> int:
    """Contiguous runs in a sequence of buffer positions."""
    return 1 + int(np.count_nonzero(np.diff(positions.ravel()) != 1))


Kp, Cp = 3, 16
nhwc = np.arange(1 * 8 * 8 * Cp).reshape(1, 8, 8, Cp)          # buffer positions, NHWC
nchw = np.arange(1 * Cp * 8 * 8).reshape(1, Cp, 8, 8)          # buffer positions, NCHW
patch_nhwc = nhwc[0, 2:2 + Kp, 3:3 + Kp, :]                    # patch order (a, b, c)
patch_nchw = nchw[0, :, 2:2 + Kp, 3:3 + Kp]                    # patch order (c, a, b)
print(f"one {Kp}x{Kp}x{Cp} patch: NHWC {runs(patch_nhwc)} runs of {Kp * Cp} floats, "
      f"NCHW {runs(patch_nchw)} runs of {Kp} floats")
assert (runs(patch_nhwc), runs(patch_nchw)) == (Kp, Cp * Kp)

# %% [markdown]
# hw4's `nn.Conv` keeps the course's interface in NCHW, $(N, C_{in}, H, W) \to
# (N, C_{out}, H_{out}, W_{out})$ with "same" padding $\lfloor K/2 \rfloor$, and converts
# around the NHWC `conv`: two transposes in, `conv`, the bias added over the last axis, two
# transposes out. The layer gives exactly that composition. Its weight, $(K, K, C_{in},
# C_{out})$, is Kaiming-uniform with the convolution's **fan-in**, $K^2 C_{in}$ (each output
# sums that many products), which hw4 asks you to fix in `init`: its variance is
# $2/(K^2 C_{in})$, not $2/C_{in}$.

# %%
conv_layer = nn.Conv(16, 32, 3, stride=2, device=device)
x_nchw = np.random.randn(2, 16, 8, 8).astype(np.float32)
y_layer = conv_layer(ndl.Tensor(x_nchw, device=device)).numpy()
x_nhwc = x_nchw.transpose(0, 2, 3, 1)  # (N, C, H, W) -> (N, H, W, C): the course's two transposes
y_nhwc = ndl.conv(ndl.Tensor(x_nhwc, device=device), conv_layer.weight, stride=2,
                  padding=1).numpy() + conv_layer.bias.numpy()
composed = np.allclose(y_layer, y_nhwc.transpose(0, 3, 1, 2), atol=1e-5)
print(f"nn.Conv(16, 32, 3, stride=2): {x_nchw.shape} -> {y_layer.shape}; equals transpose, "
      f"conv, bias, transpose back: {composed}")
assert composed

wide = nn.Conv(64, 64, 3, device=device).weight.numpy()
ratio = float(wide.var()) / (2 / (3 * 3 * 64))
print(f"nn.Conv(64, 64, 3): weight variance / (2 / (K^2 C_in)) = {ratio:.2f} "
      f"(a fan-in of C_in alone would make it {3 * 3})")
assert abs(ratio - 1) < 0.05

# %% [markdown]
# ### How fast is each formulation?
#
# Lecture 14 times the same convolution written four ways. The next cell does that: the
# seven-loop definition in Python against the $K^2$ products (`conv_offsets`) on a small
# case, then the $K^2$ products, the im2col matrix of section 3 (needle's `NDArray`: strided
# view, compact, one product) and `ndl.conv` at the size of ResNet-9's first layer (batch 50,
# $32\times32\times3 \to 8\times8\times16$, $7\times7$, stride 4). Timings depend on the
# machine and its load, so the output is not compared; the verdict lines are computed from
# the timings above them.

# %% tags=["nbval-ignore-output"]
from companion.machine import machine_line  # noqa: E402
from companion.timing import measure  # noqa: E402

print(machine_line())


def conv_loops(x, W):
    """Valid, stride-1 NHWC convolution as the seven nested loops of its definition."""
    N, H, Wd, C = x.shape
    K, _, _, C_out = W.shape
    out = np.zeros((N, H - K + 1, Wd - K + 1, C_out))
    for n in range(N):
        for i in range(H - K + 1):
            for j in range(Wd - K + 1):
                for co in range(C_out):
                    for a in range(K):
                        for b in range(K):
                            for c in range(C):
                                out[n, i, j, co] += x[n, i + a, j + b, c] * W[a, b, c, co]
    return out


def conv_offsets_strided(x, W, S, P):
    """conv_offsets with stride S and zero padding P: K*K products of strided slices."""
    xp = np.pad(x, ((0, 0), (P, P), (P, P), (0, 0)))
    N, Hp, Wp, _ = xp.shape
    K = W.shape[0]
    Ho, Wo = (Hp - K) // S + 1, (Wp - K) // S + 1
    out = np.zeros((N, Ho, Wo, W.shape[3]), dtype=np.float32)
    for a in range(K):
        for b in range(K):
            out += xp[:, a:a + S * (Ho - 1) + 1:S, b:b + S * (Wo - 1) + 1:S, :] @ W[a, b]
    return out


x_small = np.random.randn(1, 8, 8, 4).astype(np.float32)
W_small = np.random.randn(3, 3, 4, 4).astype(np.float32)
assert np.allclose(conv_loops(x_small, W_small), conv_offsets(x_small, W_small), atol=1e-4)
ms_loops = 1e3 * measure(lambda: conv_loops(x_small, W_small), repeats=3, warmup=1)
ms_offsets_small = 1e3 * measure(lambda: conv_offsets(x_small, W_small), repeats=5)
print(f"small case {x_small.shape} * {W_small.shape}: seven loops {ms_loops:.2f} ms, "
      f"K^2 products {ms_offsets_small:.3f} ms")
print(f"verdict: the seven Python loops take {ms_loops / ms_offsets_small:.0f}x as long as "
      f"the K^2 products")

x_l1 = np.random.randn(50, 32, 32, 3).astype(np.float32)
W_l1 = np.random.randn(7, 7, 3, 16).astype(np.float32)
x_l1_t, W_l1_t = ndl.Tensor(x_l1, device=device), ndl.Tensor(W_l1, device=device)
W_l1_nd = nd.array(W_l1.reshape(-1, 16), device=device)
ways = {"K^2 products (numpy)": lambda: conv_offsets_strided(x_l1, W_l1, 4, 3),
        "im2col, one product (NDArray)": lambda: (im2col(x_l1, 7, 4, 3)[1] @ W_l1_nd).numpy(),
        "ndl.conv": lambda: ndl.conv(x_l1_t, W_l1_t, stride=4, padding=3).numpy()}
reference = ways["ndl.conv"]()
ms_ways = {}
for name, fn in ways.items():
    assert np.allclose(fn().reshape(reference.shape), reference, atol=1e-3), name
    ms_ways[name] = 1e3 * measure(fn, repeats=5)
    print(f"ResNet-9 layer 1, batch 50: {name:<30} {ms_ways[name]:8.2f} ms")
fastest = min(ms_ways, key=ms_ways.get)
print(f"verdict: fastest is {fastest}; "
      + ", ".join(f"{name} {t / ms_ways[fastest]:.1f}x" for name, t in ms_ways.items()
                  if name != fastest))

# %% [markdown]
# ## 4. The gradient of a convolution is a convolution
#
# Let $z = \mathrm{conv}(x, W)$ with stride 1 and padding $P$, and $\bar z = \partial L/\partial z$.
# Each input pixel $x[i', j']$ meets weight $W[a, b]$ in output $z[i'+P-a,\; j'+P-b]$, so
#
# $$\bar x[i', j', :] = \sum_{a, b} \bar z[i'+P-a,\; j'+P-b,\; :]\; W[a, b]^T,$$
#
# a convolution of $\bar z$ with the kernel **flipped** in both spatial axes, its channel axes
# swapped, and padding $K-1-P$:
# $\;\bar x = \mathrm{conv}(\bar z,\; \mathrm{flip}(W)^{T_{c}},\; P' = K-1-P)$.
#
# With stride $S$ the outputs skip pixels: first put $\bar z$ back on the stride-1 grid by
# inserting $S-1$ zeros after each of its entries — `dilate`, which gives $H_{out}S$ rows —
# then apply the stride-1 formula. That formula returns
#
# $$H_{out}S + K - 1 - 2P \;=\; H + (S - 1 - r)\ \text{rows},\qquad
#   r = (H + 2P - K) \bmod S,$$
#
# so it has exactly $H$ rows only when $r = S - 1$. Otherwise the last $S - 1 - r$ rows lie
# beyond the input (in the padding the strided windows never reach) and the real gradient
# **crops** them: $\bar x$ is the first $H$ rows and columns. For $H = 6, K = 3, P = 1, S = 2$,
# $r = 1 = S - 1$ and the uncropped formula happens to fit; for $H = 7$, $r = 0$ and it gives an
# $8\times8$ "gradient" for a $7\times7$ input. We check the cropped version against central
# finite differences on both shapes.

# %%
def conv_grad_x(zbar, W, S, P, H):
    """Input gradient (N, H, H, C_in) of conv(x, W, stride=S, padding=P): flip, dilate, crop."""
    K = W.shape[0]
    if S > 1:
        zbar = ndl.dilate(zbar, (1, 2), S - 1)
    W_flip = ndl.transpose(ndl.flip(W, (0, 1)), (2, 3))
    full = ndl.conv(zbar, W_flip, stride=1, padding=K - 1 - P).numpy()
    assert full.shape[1] == H + (S - 1 - (H + 2 * P - K) % S)
    return full[:, :H, :H]


def loss_np(xv, Wv, R, S, P):
    out = ndl.conv(ndl.Tensor(xv, device=device), ndl.Tensor(Wv, device=device),
                   stride=S, padding=P).numpy().astype(np.float64)
    return float(np.sum(out * R))


for H, S in ((6, 1), (7, 1), (6, 2), (7, 2)):
    xg = np.random.randn(1, H, H, 2).astype(np.float32)
    Wg = np.random.randn(3, 3, 2, 3).astype(np.float32)
    Ho = out_size(H, 3, S, P=1)
    R = np.random.randn(1, Ho, Ho, 3)
    gx = conv_grad_x(ndl.Tensor(R.astype(np.float32), device=device),
                     ndl.Tensor(Wg, device=device), S, 1, H)
    uncropped = H + (S - 1 - (H + 2 - 3) % S)
    eps, fd = 0.1, np.zeros_like(xg, dtype=np.float64)
    for idx in np.ndindex(*xg.shape):  # the loss is linear in x: differences are exact
        xp, xm = xg.astype(np.float64), xg.astype(np.float64)
        xp[idx] += eps
        xm[idx] -= eps
        fd[idx] = (loss_np(xp.astype(np.float32), Wg, R, S, 1)
                   - loss_np(xm.astype(np.float32), Wg, R, S, 1)) / (2 * eps)
    err = np.abs(gx - fd).max() / np.abs(fd).max()
    print(f"H = {H}, stride {S}: uncropped formula {uncropped}x{uncropped}, cropped grad "
          f"{gx.shape[1]}x{gx.shape[2]}, agrees with finite differences to 1e-3: {err < 1e-3}")
    assert gx.shape == xg.shape and err < 1e-3

# %% [markdown]
# ### What needle's `Conv.gradient` actually computes
#
# The formula above is the textbook derivation; needle does not use it. Its dilated $\bar z$ is
# mostly zeros at stride $S > 1$ (a fraction $1 - 1/S^2$ of it: three quarters at stride 2),
# and convolving it would spend most of its multiply-adds on them. needle's `ConvInputGrad`
# does the adjoint of im2col instead, **col2im**, at every stride:
#
# 1. one matrix product $\bar z\, W^\top$, $(N H_{out} W_{out}) \times C_{out}$ by
#    $C_{out} \times (K K C_{in})$, gives the adjoint of every patch (every row of the im2col
#    matrix);
# 2. each patch's adjoint is added back where the patch came from; overlapping patches add up
#    (each input pixel sums the entries of the windows and kernel offsets that read it);
# 3. the padding is never materialised: entries that fall in it are skipped.
#
# Only non-zero products are computed, at any stride. The **weight gradient** is not a
# convolution in the code either: $\bar W[a, b, c, c'] = \sum_{n,i,j} x_p[n, iS+a, jS+b, c]\,
# \bar z[n, i, j, c']$ is exactly $\hat x^\top \bar z$, the im2col matrix transposed, times
# $\bar z$ reshaped to $(N H_{out} W_{out}) \times C_{out}$: one product,
# $(K K C_{in}) \times C_{out}$. (Written as a convolution, the same sum correlates the input
# with $\bar z$ dilated by $S$, batch and channel axes exchanged: again mostly zeros at $S > 1$.)
#
# The forward pass, the input gradient and the weight gradient are each **one call** into the
# device module (`conv_fwd`, `conv_input_grad`, `conv_weight_grad`): im2col, col2im and the
# product all run inside it, in C++ on `cpu()` (the numpy reference module `cpu_numpy()` does
# them in numpy, much as the cell below does).
#
# Both, written out in numpy and checked against needle's autograd, on the last case above
# ($H = 7$, stride 2, where the crop matters), and the weight gradient against central finite
# differences too:

# %%
def col2im_grad_x(zbar, W, S, P, H):
    """Input gradient of conv(x, W, stride=S, padding=P), as ConvInputGrad computes it (numpy)."""
    N, Ho, Wo, C_out = zbar.shape
    K, _, C_in, _ = W.shape
    patch_adj = (zbar.reshape(-1, C_out) @ W.reshape(-1, C_out).T).reshape(N, Ho, Wo, K, K, C_in)
    out = np.zeros((N, H + 2 * P, H + 2 * P, C_in))
    for a in range(K):
        for b in range(K):
            out[:, a:a + S * (Ho - 1) + 1:S, b:b + S * (Wo - 1) + 1:S] += patch_adj[:, :, :, a, b]
    return out[:, P:P + H, P:P + H]


def im2col_grad_w(x, zbar, K, S, P):
    """Weight gradient of conv(x, W, stride=S, padding=P): im2col(x)^T @ zbar (numpy)."""
    xp = np.pad(x, ((0, 0), (P, P), (P, P), (0, 0)))
    N, Ho, Wo, C_out = zbar.shape
    C_in = x.shape[3]
    cols = np.stack([xp[:, a:a + S * (Ho - 1) + 1:S, b:b + S * (Wo - 1) + 1:S]
                     for a in range(K) for b in range(K)], axis=3)  # (N, Ho, Wo, K*K, C_in)
    return (cols.reshape(-1, K * K * C_in).T @ zbar.reshape(-1, C_out)).reshape(K, K, C_in, C_out)


xt = ndl.Tensor(xg, device=device, requires_grad=True)
Wt = ndl.Tensor(Wg, device=device, requires_grad=True)
Rt = ndl.Tensor(R.astype(np.float32), device=device)
(ndl.conv(xt, Wt, stride=2, padding=1) * Rt).sum().backward()
print(f"stride 2: x.grad comes from {type(xt.grad.op).__name__}, "
      f"W.grad from {type(Wt.grad.op).__name__}")
assert np.allclose(xt.grad.numpy(), col2im_grad_x(R, Wg, 2, 1, 7), atol=1e-4)
assert np.allclose(xt.grad.numpy(), gx, atol=1e-4)  # and the flip/dilate/crop formula
gw = im2col_grad_w(xg.astype(np.float64), R, 3, 2, 1)
assert np.allclose(Wt.grad.numpy(), gw, rtol=1e-4, atol=1e-4)

eps, fd_w = 0.1, np.zeros(Wg.shape)
for idx in np.ndindex(*Wg.shape):  # linear in W as well: central differences are exact
    Wp, Wm = Wg.astype(np.float64), Wg.astype(np.float64)
    Wp[idx] += eps
    Wm[idx] -= eps
    fd_w[idx] = (loss_np(xg, Wp.astype(np.float32), R, 2, 1)
                 - loss_np(xg, Wm.astype(np.float32), R, 2, 1)) / (2 * eps)
err_w = np.abs(Wt.grad.numpy() - fd_w).max() / np.abs(fd_w).max()
print(f"autograd dL/dx == col2im == flip/dilate/crop; autograd dL/dW == im2col(x)^T @ zbar; "
      f"dL/dW agrees with finite differences to 1e-3: {err_w < 1e-3}")
assert err_w < 1e-3

# %% [markdown]
# ## 5. Pooling
#
# A **pooling** layer shrinks the feature maps without weights: each output pixel summarises a
# $k \times k$ window of one channel, with stride $s$ (usually $s = k$, non-overlapping
# windows), so the output size is the convolution formula of section 2. **Max pooling** keeps
# each window's largest value; **average pooling** its mean. Both act on every channel
# separately. (The course's ResNet-9 has no pooling layer: it downsamples with strided
# convolutions, as section 2 showed. Many other CNNs pool; the ResNets of the original paper,
# for one, end with a *global* average pool over the whole map.)
#
# With $s = k$ dividing $H$ and $W$, the windows are a reshape: $(N, H, W, C) \to
# (N, H/k, k, W/k, k, C)$, reduced over axes 2 and 4. Average pooling is then `summation`
# divided by $k^2$, a linear map whose gradient sends $\bar y / k^2$ to every pixel of the
# window. It is also a convolution: a kernel $W[a, b] = I_C / k^2$ (identity over channels)
# at stride $k$. Max pooling is, for a given input, multiplication by a 0/1 **mask** that
# marks each window's maximum, then the same sum, so its gradient routes $\bar y$ to the
# maximum's position and gives 0 to the rest of the window (with ties, to one of them). needle
# has no max-pooling op; below the mask is computed in numpy, the rest is needle ops, and
# autograd gives the gradient, checked against the rule just stated and against finite
# differences.

# %%
def pool_windows(x: ndl.Tensor, k: int) -> ndl.Tensor:
    """(N, H, W, C) -> (N, H/k, k, W/k, k, C): the non-overlapping k x k windows."""
    N, H, W, C = x.shape
    return ndl.reshape(x, (N, H // k, k, W // k, k, C))


def avg_pool(x: ndl.Tensor, k: int) -> ndl.Tensor:
    return ndl.summation(pool_windows(x, k), axes=(2, 4)) / (k * k)


def max_pool(x: ndl.Tensor, k: int) -> ndl.Tensor:
    """Max over each window: the sum of the window times a one-hot mask of its maximum."""
    win = pool_windows(x, k).numpy()
    N, Hk, _, Wk, _, C = win.shape
    flat = win.transpose(0, 1, 3, 5, 2, 4).reshape(N, Hk, Wk, C, k * k)
    mask = np.zeros_like(flat)
    np.put_along_axis(mask, flat.argmax(axis=-1)[..., None], 1.0, axis=-1)
    mask = mask.reshape(N, Hk, Wk, C, k, k).transpose(0, 1, 4, 2, 5, 3)
    return ndl.summation(pool_windows(x, k) * ndl.Tensor(mask, device=x.device), axes=(2, 4))


xpool = np.random.randn(2, 6, 6, 3).astype(np.float32)
win_np = xpool.reshape(2, 3, 2, 3, 2, 3)
xt_pool = ndl.Tensor(xpool, device=device, requires_grad=True)
y_max, y_avg = max_pool(xt_pool, 2), avg_pool(xt_pool, 2)
assert np.allclose(y_max.numpy(), win_np.max(axis=(2, 4)))
assert np.allclose(y_avg.numpy(), win_np.mean(axis=(2, 4)), atol=1e-6)
eye_kernel = np.broadcast_to(np.eye(3, dtype=np.float32) / 4, (2, 2, 3, 3)).copy()
y_conv = ndl.conv(ndl.Tensor(xpool, device=device), ndl.Tensor(eye_kernel, device=device),
                  stride=2, padding=0)
assert np.allclose(y_conv.numpy(), y_avg.numpy(), atol=1e-6)
print(f"input {xpool.shape} -> pooled {y_max.shape}; average pooling == conv with I/k^2 at "
      f"stride k: True")

Rp = np.random.randn(*y_max.shape)
(y_max * ndl.Tensor(Rp.astype(np.float32), device=device)).sum().backward()
g_max = xt_pool.grad.numpy()
is_max = (win_np == win_np.max(axis=(2, 4), keepdims=True)).reshape(xpool.shape)
routed = np.repeat(np.repeat(Rp, 2, axis=1), 2, axis=2)  # each output's adjoint over its window
assert np.allclose(g_max, np.where(is_max, routed, 0.0), atol=1e-6)
print(f"max pool: nonzero gradient entries {int((g_max != 0).sum())} of {g_max.size} "
      f"(one per window: {y_max.numpy().size})")
assert (g_max != 0).sum() == y_max.numpy().size

xt_pool.grad = None
(avg_pool(xt_pool, 2) * ndl.Tensor(Rp.astype(np.float32), device=device)).sum().backward()
assert np.allclose(xt_pool.grad.numpy(), routed / 4, atol=1e-6)

eps = 1e-3  # max is piecewise linear; random inputs have no ties within 2 * eps
fd = np.zeros(xpool.shape)
for idx in np.ndindex(*xpool.shape):
    xp_, xm_ = xpool.astype(np.float64), xpool.astype(np.float64)
    xp_[idx] += eps
    xm_[idx] -= eps
    fd[idx] = ((xp_.reshape(win_np.shape).max(axis=(2, 4)) * Rp).sum()
               - (xm_.reshape(win_np.shape).max(axis=(2, 4)) * Rp).sum()) / (2 * eps)
print(f"max-pool gradient agrees with finite differences to 1e-4: "
      f"{np.abs(g_max - fd).max() < 1e-4}")
assert np.abs(g_max - fd).max() < 1e-4

# %% [markdown]
# ## 6. ResNet-9 on images
#
# `companion.apps.models.ResNet9` is the homework's network: four strided `ConvBN` blocks
# (convolution, `BatchNorm2d`, ReLU), two residual blocks, and a two-layer head — 431,946
# parameters mapping $(N, 3, 32, 32)$ images to 10 logits.
#
# **Data.** CIFAR-10 needs a download, so the committed run uses needle's offline stand-in
# `companion.data.ShapesDataset`: ten classes of coloured shapes and textures (discs, squares,
# triangles, rings, crosses, four kinds of stripes/checks, dot grids) drawn from a seed, with
# random colours, positions and sizes and pixel noise — same format as CIFAR-10. To train on the
# real thing, run `make data` (outside a checkout, e.g. in Colab: `python -m
# companion.data.download --all --root data`) and set `DATASET = "cifar10"` below.

# %%
DATASET = "shapes"        # "shapes" (offline, the committed outputs) or "cifar10" (`make data`)
N_TRAIN, N_TEST = 1000, 500
EPOCHS, BATCH_SIZE, LR, WEIGHT_DECAY = 4, 50, 2e-3, 1e-3

# %%
def load(train: bool):
    n = N_TRAIN if train else N_TEST
    if DATASET == "cifar10":
        ds = ndl.data.CIFAR10Dataset(str(lecture.data_dir() / "cifar-10-batches-py"), train)
        ds.X, ds.y = ds.X[:n], ds.y[:n]
        ds.classes = companion.data.CIFAR10_CLASSES
        return ds
    return companion.data.ShapesDataset(train=train, n=n, seed=0)


train_set, test_set = load(True), load(False)
print(f"{len(train_set)} training and {len(test_set)} test images of shape {train_set[0][0].shape}")
assert train_set.X.shape == (N_TRAIN, 3, 32, 32) and test_set.X.shape == (N_TEST, 3, 32, 32)

# %%
fig, axes = plt.subplots(2, 10, figsize=(10, 2.3))
for c in range(10):
    for r in range(2):
        img = train_set.X[np.flatnonzero(train_set.y == c)[r]]
        axes[r, c].imshow(img.transpose(1, 2, 0))
        axes[r, c].axis("off")
    axes[0, c].set_title(train_set.classes[c], fontsize=8)
fig.suptitle("Two training images per class", y=1.05)
plt.show()

# %% [markdown]
# Before training, the network is at chance level (10 % for ten balanced classes):

# %%
np.random.seed(0)
probe = ResNet9(device=device)  # the model's initial weights (same seed), to look inside
images = ndl.Tensor(test_set.X[:BATCH_SIZE], device=device)
probe.eval()
eval_logits = probe(images).numpy()
probe.train()  # BatchNorm normalises with this batch's own statistics
train_logits = probe(images).numpy()
print(f"untrained logits, spread (std) over one batch: evaluation mode {eval_logits.std():.2f}, "
      f"training mode {train_logits.std():.2f}")
np.random.seed(0)
model = ResNet9(device=device)
n_params = sum(int(np.prod(p.shape)) for p in model.parameters())
assert n_params == 431946
train_loader = ndl.data.DataLoader(train_set, batch_size=BATCH_SIZE, shuffle=True)
test_loader = ndl.data.DataLoader(test_set, batch_size=BATCH_SIZE)
base_acc, base_loss = evaluate_cifar10(model, test_loader, progress=False)
print(f"{n_params} parameters; untrained test accuracy {base_acc:.2f}, loss {base_loss:.2f}")
assert base_acc < 0.25
W0_first = model.model.modules[0].conv.weight.numpy().copy()  # the first layer's filters, now

# %% [markdown]
# Training uses the homework's loop `epoch_general_cifar10` with Adam; a callback records the
# loss of every mini-batch for the learning curve, and after each epoch we measure the test
# accuracy. In Jupyter both are redrawn in place while the loop runs
# (`companion.viz.LiveCurves`); the figure further down is the static copy. The loop calls
# `np.random.seed(4)` at the start of every epoch, as the course's does (so that its tests get
# fixed numbers); the consequence is that every epoch draws the **same** shuffle, the same
# mini-batches in the same order. The training accuracy it reports is the running mean over
# the epoch's mini-batches, in training mode, while the weights still change; after training
# we evaluate the training set again in evaluation mode, as notebook 04 does.

# %% [markdown]
# The training runs on needle's fast path: `lecture.fast_path(model)` calls
# `needle.fast.fuse(model)`, which swaps each `ConvBN` block for its fused twin (convolution,
# bias, batch norm and ReLU as one graph node in training). It computes what the course's
# modules compute, to float32 rounding (the project's tests compare the two), with fewer nodes
# and arrays per step, which matters over several epochs; everything above ran the course's
# modules. On your own needle (`NEEDLE_IMPL`) the call does nothing.

# %% tags=["nbval-ignore-output"]
lecture.fast_path(model)
opt = ndl.optim.Adam(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
batch_losses, history = [], []


def record(i, acc, loss):
    """The training loop's callback: keep the mini-batch loss and draw it live."""
    batch_losses.append(loss)
    live.add(len(batch_losses) / len(train_loader), {"mini-batch loss": loss})


with LiveCurves({"softmax loss": ["mini-batch loss"], "accuracy": ["train", "test"]},
                title=f"ResNet-9 on {DATASET} (live)") as live:
    for epoch in range(EPOCHS):
        tr_acc, tr_loss = epoch_general_cifar10(train_loader, model, opt=opt, progress=False,
                                                callback=record)
        te_acc, te_loss = evaluate_cifar10(model, test_loader, progress=False)
        history.append((tr_acc, tr_loss, te_acc, te_loss))
        live.add(epoch + 1, {"train": tr_acc, "test": te_acc})
        print(f"epoch {epoch + 1}: train loss {tr_loss:.3f} acc {tr_acc:.3f} | "
              f"test loss {te_loss:.3f} acc {te_acc:.3f}")

# %% [markdown]
# The training loss falls epoch after epoch, and the final test accuracy beats the untrained
# network's by more than 40 percentage points. The same cell evaluates the 1,000 training
# images in evaluation mode, so that training and test accuracy are measured alike, and
# compares the first mini-batch's loss with the untrained network's evaluation loss:

# %%
final_acc = history[-1][2]
train_losses = [h[1] for h in history]
assert all(b < a for a, b in zip(train_losses, train_losses[1:])), train_losses
assert final_acc > base_acc + 0.40, (base_acc, final_acc)
print(f"test accuracy: untrained {base_acc:.2f} -> trained {final_acc:.2f}")
fit_acc, fit_loss = evaluate_cifar10(model, train_loader, progress=False)
test_losses = [h[3] for h in history]
gap = fit_acc - final_acc
print(f"after training, evaluation mode: training set acc {fit_acc:.2f} loss {fit_loss:.2f} | "
      f"test set acc {final_acc:.2f} loss {test_losses[-1]:.2f}")
print(f"test loss by epoch: {' -> '.join(f'{v:.2f}' for v in test_losses)}")
print(f"verdict: training accuracy is {100 * gap:.0f} points above test accuracy: "
      + ("the network fits its training images much better than unseen ones (overfitting)"
         if gap > 0.10 else "no large gap between seen and unseen images"))
print(f"first mini-batch loss (training mode, before any update) {batch_losses[0]:.2f}; "
      f"untrained evaluation loss {base_loss:.2f}; log 10 = {np.log(10):.2f}")

# %%
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.5))
steps_per_epoch = len(batch_losses) // EPOCHS
ax1.plot(np.arange(1, len(batch_losses) + 1) / steps_per_epoch, batch_losses, lw=0.8,
         label="mini-batch")
ax1.plot(np.arange(1, EPOCHS + 1), train_losses, "o-", label="epoch mean")
ax1.xaxis.set_major_locator(MaxNLocator(integer=True))
ax1.set_xlabel("epoch")
ax1.set_ylabel("softmax loss")
ax1.set_title("Training loss falls")
ax1.legend()
ax2.plot(np.arange(1, EPOCHS + 1), [h[0] for h in history], "s--",
         label="train (running mean, training mode)")
ax2.plot(np.arange(0, EPOCHS + 1), [base_acc] + [h[2] for h in history], "o-", label="test")
ax2.plot([EPOCHS], [fit_acc], "C0*", ms=12, label="train, evaluation mode")
ax2.axhline(0.1, color="gray", ls=":", label="chance")
ax2.xaxis.set_major_locator(MaxNLocator(integer=True))
ax2.set_xlabel("epoch")
ax2.set_ylabel("accuracy")
ax2.set_ylim(0, 1)
ax2.set_title("Accuracy: far above chance, train above test")
ax2.legend(loc="lower right", fontsize=8)
fig.suptitle(f"ResNet-9 on {DATASET}: {N_TRAIN} images, batch {BATCH_SIZE}, Adam lr {LR}")
fig.tight_layout()
save_figure(fig, "resnet9_learning_curve")

# %% [markdown]
# Two things in these curves need the printed lines to read them.
#
# **Train against test.** The dashed training curve is the running mean over each epoch,
# measured in training mode while the weights change; the star is the training set evaluated
# after training in evaluation mode, like the test points. The verdict line compares the two
# ends: with 1,000 training images, 431,946 parameters and the same mini-batches every epoch,
# the network fits the images it trains on far better than images it has not seen, and the
# test loss levels off while the training loss keeps falling (the "test loss by epoch" line
# against the training losses of the figure). That is **overfitting**, the pattern notebook 04 examines; more data (CIFAR-10's
# 50,000 images), data augmentation or stronger weight decay are the usual remedies.
#
# **The first mini-batches.** The first losses of the curve lie above $\log 10$, the loss of a
# uniform guess, and above the untrained network's evaluation loss. The difference is the
# mode, not the data: in training mode every `BatchNorm2d` normalises each channel with the
# current batch's own statistics, while in evaluation mode it uses its running statistics,
# which start at mean 0 and variance 1. The line printed before training measures the effect
# on the untrained network's logits: their spread in the two modes. Wider logits from random
# weights mean confident wrong answers, and a loss above $\log 10$.

# %% [markdown]
# ## 7. What the first layer sees
#
# The first `ConvBN` turns a $32\times32$ image into 16 feature maps of $8\times8$ (stride 4,
# then BatchNorm and ReLU). Its $7\times7\times3$ kernels (the *filters*) are hard to read after
# four epochs (the cell prints how far they moved from their random initialisation,
# $\lVert W - W_0 \rVert / \lVert W_0 \rVert$), but their responses, the
# **feature maps**, are not: below, for one test image of each of four classes, the channels
# light up on edges, on the inside of shapes, or on stripes of one orientation. All panels share
# one colour scale, so a dark panel is a channel that does not respond to that image.

# %%
first_block = model.model.modules[0]                          # ConvBN(3, 16, 7, 4)
assert first_block.conv.weight.shape == (7, 7, 3, 16)
W_now = first_block.conv.weight.numpy()
moved = float(np.linalg.norm(W_now - W0_first) / np.linalg.norm(W0_first))
print(f"first-layer filters: ||W - W0|| / ||W0|| = {moved:.2f}: "
      + ("still close to their random initialisation" if moved < 0.5
         else "far from their random initialisation"))
show = [0, 4, 5, 8]            # class numbers: disc, cross, hstripes, checker offline
idx = [int(np.flatnonzero(test_set.y == c)[0]) for c in show]
model.eval()
fmaps = first_block(ndl.Tensor(test_set.X[idx], device=device)).numpy()   # (4, 16, 8, 8)
assert fmaps.shape == (4, 16, 8, 8) and fmaps.min() >= 0      # after ReLU

fig, axes = plt.subplots(4, 17, figsize=(12.5, 3.3))
vmax = float(fmaps.max())  # one colour scale for every panel, so channels compare
for r, i in enumerate(idx):
    axes[r, 0].imshow(test_set.X[i].transpose(1, 2, 0))
    axes[r, 0].set_ylabel(train_set.classes[show[r]], fontsize=8)
    for k in range(16):
        im = axes[r, k + 1].imshow(fmaps[r, k], cmap="viridis", vmin=0, vmax=vmax)
        if r == 0:
            axes[r, k + 1].set_title(f"ch {k}", fontsize=7)
for ax in axes.flat:
    ax.set_xticks([])
    ax.set_yticks([])
fig.colorbar(im, ax=axes[:, 1:].ravel().tolist(), fraction=0.02, pad=0.01,
             label="activation (after ReLU)")
fig.suptitle("ResNet-9 layer 1: the 16 feature maps (8x8) of four test images, one colour scale")
save_figure(fig, "resnet9_feature_maps")

# %% [markdown]
# ## Summary
#
# * A convolution is $K^2$ matrix products, or one product of the **im2col** matrix with the
#   reshaped kernel; the im2col *view* is free, its compact copy costs about $K^2/S^2$ times the
#   input.
# * $H_{out} = \lfloor (H + 2P - D(K-1) - 1)/S \rfloor + 1$.
# * The backward pass is itself a convolution: flip the kernel, swap its channel axes,
#   dilate the output gradient by the stride, and crop the rows and columns that fall beyond
#   the input (needed unless $(H + 2P - K) \bmod S = S - 1$). needle computes the same input
#   gradient by col2im (one product, then the patches' adjoints added back), and the weight
#   gradient as one product, $\hat x^\top \bar z$; forward and both gradients are one device
#   kernel call each.
# * Max and average pooling summarise each window of a channel; average pooling is a
#   convolution with a fixed kernel, and max pooling's gradient goes to each window's maximum.
# * A convolution shares one small kernel across positions: far fewer weights than a dense
#   layer, translation equivariance, and a receptive field that grows with depth and stride.
# * `ndl.conv` works in NHWC, where a patch is $K$ contiguous runs; hw4's `nn.Conv` takes NCHW
#   and transposes around it, and initialises with the convolution's fan-in $K^2 C_{in}$.
# * ResNet-9, built from these pieces, learns the offline image set in a few epochs on a CPU,
#   and on 1,000 images it overfits: compare training and test accuracy in the same mode.

# %% [markdown]
# ## Exercises
#
# Each exercise has a cell to fill in (it starts as `raise NotImplementedError`) and a check
# cell that says whether your answer is right: "not answered yet", "correct", or "not yet"
# with what differs. The first cell below gathers everything the exercises use, so this
# section also runs on its own after a kernel restart. Reference answers are in
# `notebooks/solutions/07_convolutions.py`; try first.

# %% tags=["exercise-setup"]
import numpy as np

import needle as ndl
from companion.check.exercises import check_exercise

rng = np.random.default_rng(0)
x_ex = rng.standard_normal((2, 6, 5, 3)).astype(np.float32)   # NHWC
w_ex = rng.standard_normal((3, 3, 3, 4)).astype(np.float32)   # (k, k, C_in, C_out)
d_ex = rng.standard_normal((3, 4)).astype(np.float32)
CONFIGS = [(7, 3, 1, 0), (7, 3, 2, 1), (8, 5, 3, 2), (32, 7, 4, 3)]  # (n, k, stride, padding)


def needle_conv_size(n, k, stride, padding):
    """The spatial output size needle's conv gives an n x n input and a k x k kernel."""
    x = ndl.Tensor(np.zeros((1, n, n, 1), dtype=np.float32))
    w = ndl.Tensor(np.zeros((k, k, 1, 1), dtype=np.float32))
    return ndl.conv(x, w, stride=stride, padding=padding).shape[1]


# %% [markdown]
# **Exercise 7.1 (output sizes).** Give the output height of a convolution of an $n \times n$
# input with a $k \times k$ kernel, stride $s$ and zero padding $p$ on each side (section 2).
# The check runs `ndl.conv` on the configurations in `CONFIGS`.

# %% tags=["exercise-stub"]
def conv_output_size(n, k, stride, padding):
    """Output height (= width) of the convolution."""
    raise NotImplementedError


# %% tags=["exercise-check"]
check_exercise("7.1 conv_output_size", lambda: [conv_output_size(*c) for c in CONFIGS],
               [needle_conv_size(*c) for c in CONFIGS])

# %% [markdown]
# **Exercise 7.2 (a convolution as small matrix products).** Write a stride-1, unpadded
# convolution of NHWC `x` with a `(k, k, C_in, C_out)` kernel `w` in numpy, as $k^2$ matrix
# products of shifted views of `x` with `w[i, j]` (section 1). The check compares with
# `ndl.conv`.

# %% tags=["exercise-stub"]
def conv2d(x, w):
    """Stride-1, unpadded convolution: (N, H, W, C_in) * (k, k, C_in, C_out) -> NHWC."""
    raise NotImplementedError


# %% tags=["exercise-check"]
check_exercise("7.2 conv2d", lambda: conv2d(x_ex, w_ex),
               ndl.conv(ndl.Tensor(x_ex), ndl.Tensor(w_ex), stride=1, padding=0).numpy(),
               rtol=1e-4, atol=1e-5)

# %% [markdown]
# **Exercise 7.3 (dilation, for the strided gradient).** The gradient of a strided convolution
# dilates the output adjoint: `dilation` zeros after every element along each axis. Write it
# for a 2-D array and both axes; the check compares with `ndl.dilate`.

# %% tags=["exercise-stub"]
def dilate2d(a, dilation):
    """a with `dilation` zeros inserted after each element along both axes."""
    raise NotImplementedError


# %% tags=["exercise-check"]
check_exercise("7.3 dilate2d", lambda: [dilate2d(d_ex, 1), dilate2d(d_ex, 2)],
               [ndl.dilate(ndl.Tensor(d_ex), (0, 1), d).numpy() for d in (1, 2)])
