"""Convolution and its helpers: flip, dilate, undilate (hw4).

``conv`` takes NHWC input and a (K, K, C_in, C_out) weight. Its forward pass, input gradient
and weight gradient are each one call into the device module (``conv_fwd``,
``conv_input_grad``, ``conv_weight_grad`` in ``protocol.py``): im2col (the zero-padded input's
windows as an (N·H_out·W_out, K·K·C_in) matrix) times the weight reshaped to
(K·K·C_in, C_out), and col2im for the input gradient, done inside the module. The gradients
are ops themselves, linear in each input, so the backward pass is differentiable again.
"""

from __future__ import annotations

from typing import Tuple

from ..autograd import NDArray, Tensor, TensorOp
from ..backend_selection import array_api
from .ops_mathematic import _norm_axes, compacted


# question: hw4_flip
class Flip(TensorOp):
    """Reverse the order of elements along ``axes``; its own gradient."""

    def __init__(self, axes: tuple):
        self.axes = axes

    def compute(self, a: NDArray):
        return a.flip(_norm_axes(self.axes, a.ndim, "flip"))

    def gradient(self, out_grad: Tensor, node: Tensor):
        return flip(out_grad, self.axes)


def flip(a: Tensor, axes: tuple) -> Tensor:
    """``a`` reversed along ``axes``."""
    return Flip(axes)(a)


def _dilated_slices(shape, axes, dilation: int):
    return tuple(
        slice(None, None, dilation + 1) if i in axes else slice(None) for i in range(len(shape))
    )


class _DilationOp(TensorOp):
    """Shared constructor of Dilate and UnDilate: ``axes`` and a non-negative ``dilation``."""

    def __init__(self, axes: tuple, dilation: int):
        if int(dilation) != dilation or dilation < 0:
            raise ValueError(f"dilation must be a non-negative integer, got {dilation!r}")
        self.axes = axes
        self.dilation = int(dilation)


# question: hw4_dilate
class Dilate(_DilationOp):
    """Insert ``dilation`` zeros after each element along ``axes`` (after the last one too).

    A size-n axis becomes n·(dilation + 1); e.g. [1, 2] with dilation 1 -> [1, 0, 2, 0].
    """

    def compute(self, a: NDArray):
        axes = _norm_axes(self.axes, a.ndim, "dilate")
        if self.dilation == 0:
            return a
        shape = tuple(d * (self.dilation + 1) if i in axes else d for i, d in enumerate(a.shape))
        out = array_api.full(shape, 0.0, dtype=a.dtype, device=a.device)
        out[_dilated_slices(shape, axes, self.dilation)] = a
        return out

    def gradient(self, out_grad: Tensor, node: Tensor):
        return undilate(out_grad, self.axes, self.dilation)


def dilate(a: Tensor, axes: tuple, dilation: int) -> Tensor:
    """``a`` with ``dilation`` zeros inserted after each element along ``axes``."""
    return Dilate(axes, dilation)(a)


# question: hw4_dilate
class UnDilate(_DilationOp):
    """Keep every (dilation + 1)-th element along ``axes``: the inverse of :class:`Dilate`."""

    def compute(self, a: NDArray):
        axes = _norm_axes(self.axes, a.ndim, "undilate")
        if self.dilation == 0:
            return a
        return a[_dilated_slices(a.shape, axes, self.dilation)].compact()

    def gradient(self, out_grad: Tensor, node: Tensor):
        # Dilate pads to n·(d+1); the input may have been shorter than that, so crop back.
        grad = dilate(out_grad, self.axes, self.dilation)
        in_shape = node.inputs[0].shape
        if tuple(grad.shape) != tuple(in_shape):
            grad = _PadCrop(tuple((0, n - g) for n, g in zip(in_shape, grad.shape)))(grad)
        return grad


def undilate(a: Tensor, axes: tuple, dilation: int) -> Tensor:
    """Every (dilation + 1)-th element of ``a`` along ``axes``."""
    return UnDilate(axes, dilation)(a)


class _PadCrop(TensorOp):
    """Zero-pad (positive widths) or crop (negative widths) each axis at both ends.

    ``widths`` holds one (before, after) pair per dimension. Linear, and its adjoint is the
    same op with the widths negated. Internal: used by the undilate gradient.
    """

    def __init__(self, widths):
        self.widths = tuple((int(b), int(e)) for b, e in widths)

    def compute(self, a: NDArray):
        if len(self.widths) != a.ndim:
            raise ValueError(f"pad/crop widths {self.widths} do not match shape {tuple(a.shape)}")
        crop = tuple(slice(-min(b, 0), n + min(e, 0)) for n, (b, e) in zip(a.shape, self.widths))
        a = a[crop].compact()
        pads = tuple((max(b, 0), max(e, 0)) for b, e in self.widths)
        return a.pad(pads) if any(p != (0, 0) for p in pads) else a

    def gradient(self, out_grad: Tensor, node: Tensor):
        return _PadCrop(tuple((-b, -e) for b, e in self.widths))(out_grad)


def _centre_tap(h: int, w: int, kh: int, kw: int, padding: int) -> int:
    """The centre tap's index when a 1x1 input meets an odd square kernel with "same" padding
    (every other tap reads only padding, so the convolution is one matrix product with the
    centre tap's C_in x C_out weights, and its output is 1x1 at any stride), else -1."""
    if h == 1 and w == 1 and kh == kw and kh % 2 == 1 and padding == kh // 2:
        return padding
    return -1


def _tap_matrix(weight: NDArray, c: int) -> NDArray:
    """The (C_in, C_out) weights of tap (c, c) of ``weight`` (KH, KW, C_in, C_out)."""
    _, _, c_in, c_out = weight.shape
    return weight[c : c + 1, c : c + 1].compact().reshape((c_in, c_out))


class Conv(TensorOp):
    """2-D convolution (cross-correlation, as in the course) with zero padding.

    A: (N, H, W, C_in) NHWC, B: (K, K, C_in, C_out) -> (N, H_out, W_out, C_out) with
    H_out = (H + 2·padding - K) // stride + 1 (likewise W_out). Non-square kernels
    (K_h, K_w, C_in, C_out) work too (an extension, used by the gradient). Forward, input
    gradient and weight gradient are each one device kernel (``conv_fwd``, ``conv_input_grad``,
    ``conv_weight_grad``: im2col or col2im and one matrix product inside the device module).
    """

    def __init__(self, stride: int = 1, padding: int = 0):
        if int(stride) != stride or stride < 1:
            raise ValueError(f"conv stride must be a positive integer, got {stride!r}")
        if int(padding) != padding or padding < 0:
            raise ValueError(f"conv padding must be a non-negative integer, got {padding!r}")
        self.stride = int(stride)
        self.padding = int(padding)

    # question: hw4_conv_forward
    def compute(self, A: NDArray, B: NDArray):
        if A.ndim != 4 or B.ndim != 4:
            raise ValueError(
                f"conv needs A (N, H, W, C_in) and B (K, K, C_in, C_out), got shapes "
                f"{tuple(A.shape)} and {tuple(B.shape)}"
            )
        N, H, W, C = A.shape
        KH, KW, C_in, C_out = B.shape
        if C != C_in:
            raise ValueError(
                f"conv: input has {C} channels but the weight {tuple(B.shape)} expects {C_in}"
            )
        p, s = self.padding, self.stride
        if H + 2 * p < KH or W + 2 * p < KW:
            raise ValueError(
                f"conv: kernel {KH}x{KW} is larger than the padded input {H + 2 * p}x{W + 2 * p}"
            )
        c = _centre_tap(H, W, KH, KW, p)
        if c >= 0:  # ResNet-9's last blocks: im2col would multiply 8 of 9 taps by padding
            out = A.compact().reshape((N, C)) @ _tap_matrix(B, c)
            return out.reshape((N, 1, 1, C_out))
        return array_api.conv_fwd(A, B, s, p)

    # question: hw4_conv_backward
    def gradient(self, out_grad: Tensor, node: Tensor):
        X, Wt = node.inputs
        return conv_adjoints(X, Wt, out_grad, self.stride, self.padding, X.requires_grad)


def conv_adjoints(
    X: Tensor, Wt: Tensor, out_grad: Tensor, stride: int, padding: int, input_grad: bool
):
    """(adjoint of X, or None unless ``input_grad``; adjoint of Wt) of ``conv(X, Wt, stride,
    padding)`` for the output adjoint ``out_grad``: the input and the weight gradient, each one
    op. ``input_grad`` is the caller's to say: X may be a tensor made during a backward pass
    that records no graph, whose requires_grad is then False."""
    out_grad = compacted(out_grad)  # read by both kernels below: copied once if strided
    # Inputs that need no adjoint get None, which reverse mode skips: for a network's input
    # images the input gradient would be the most expensive product of a ResNet-9 step.
    grad_X = None
    if input_grad:
        grad_X = ConvInputGrad((X.shape[1], X.shape[2]), stride, padding)(out_grad, Wt)
    grad_W = ConvWeightGrad((Wt.shape[0], Wt.shape[1]), stride, padding)(X, out_grad)
    return grad_X, grad_W


class ConvWeightGrad(TensorOp):
    """The weight adjoint of ``conv(X, W, stride, padding)`` for an output adjoint G.

    X: (N, H, W, C_in) NHWC, G: (N, H_out, W_out, C_out) -> (KH, KW, C_in, C_out), i.e.
    im2col(X)ᵀ @ G (one device kernel, ``conv_weight_grad``). Linear in each input: its own
    adjoints are the input gradient of the convolution (for X) and the convolution itself (for
    G), so it is differentiable again. Internal: the gradient of :class:`Conv`.
    """

    def __init__(self, kernel: Tuple[int, int], stride: int, padding: int):
        self.kernel = (int(kernel[0]), int(kernel[1]))
        self.stride = int(stride)
        self.padding = int(padding)

    def compute(self, X: NDArray, G: NDArray):
        (kh, kw), p = self.kernel, self.padding
        c = _centre_tap(X.shape[1], X.shape[2], kh, kw, p) if len(X.shape) == 4 else -1
        if c >= 0 and len(G.shape) == 4 and tuple(G.shape[1:3]) == (1, 1):
            n, _, _, c_in = X.shape
            c_out = G.shape[3]
            tap = X.compact().reshape((n, c_in)).permute((1, 0)) @ G.compact().reshape((n, c_out))
            out = array_api.full((kh, kw, c_in, c_out), 0.0, dtype=X.dtype, device=X.device)
            out[c : c + 1, c : c + 1] = tap.reshape((1, 1, c_in, c_out))
            return out
        return array_api.conv_weight_grad(X, G, self.kernel, self.stride, self.padding)

    def gradient(self, out_grad: Tensor, node: Tensor):
        X, G = node.inputs
        s, p = self.stride, self.padding
        grad_X = None
        if X.requires_grad:  # <V, im2col(X)ᵀ G> = <conv(X, V), G>: conv's input adjoint
            grad_X = ConvInputGrad((X.shape[1], X.shape[2]), s, p)(G, out_grad)
        return grad_X, Conv(s, p)(X, out_grad)


class ConvInputGrad(TensorOp):
    """The input adjoint of ``conv(X, W, stride, padding)`` for an output adjoint G.

    G: (N, H_out, W_out, C_out), W: (KH, KW, C_in, C_out) -> (N, H, W, C_in) for the input
    size ``in_hw`` = (H, W): the patches' adjoints G @ Wᵀ added back into the zero-padded input
    at each kernel offset (col2im), the padding cropped (one device kernel,
    ``conv_input_grad``). Linear in each input: its adjoints are the convolution (for G) and
    :class:`ConvWeightGrad` (for W), so it is differentiable again. Internal: the gradient of
    :class:`Conv`.
    """

    def __init__(self, in_hw: tuple, stride: int, padding: int):
        self.in_hw = (int(in_hw[0]), int(in_hw[1]))
        self.stride = int(stride)
        self.padding = int(padding)

    def compute(self, G: NDArray, W: NDArray):
        h, w = self.in_hw
        c = _centre_tap(h, w, W.shape[0], W.shape[1], self.padding) if len(W.shape) == 4 else -1
        if c >= 0 and len(G.shape) == 4 and tuple(G.shape[1:3]) == (1, 1):
            n, _, _, c_out = G.shape
            c_in = W.shape[2]
            dx = G.compact().reshape((n, c_out)) @ _tap_matrix(W, c).permute((1, 0))
            return dx.reshape((n, 1, 1, c_in))
        return array_api.conv_input_grad(G, W, self.in_hw, self.stride, self.padding)

    def gradient(self, out_grad: Tensor, node: Tensor):
        G, W = node.inputs
        # <V, dX(G, W)> = <conv(V, W), G>
        grad_G = conv(out_grad, W, stride=self.stride, padding=self.padding)
        grad_W = ConvWeightGrad((W.shape[0], W.shape[1]), self.stride, self.padding)(out_grad, G)
        return grad_G, grad_W


def conv(a: Tensor, b: Tensor, stride: int = 1, padding: int = 1) -> Tensor:
    """2-D convolution of NHWC ``a`` with (K, K, C_in, C_out) ``b`` (course default padding=1)."""
    return Conv(stride, padding)(a, b)


__all__ = [
    "Flip",
    "flip",
    "Dilate",
    "dilate",
    "UnDilate",
    "undilate",
    "Conv",
    "conv",
    "conv_adjoints",
]
