"""Convolution and its helpers: flip, dilate, undilate (hw4).

``conv`` takes NHWC input and a (K, K, C_in, C_out) weight. The forward pass is im2col on a
strided view: the zero-padded input is viewed (without copying) as
(N, H_out, W_out, K, K, C_in) with ``as_strided``, compacted once and multiplied by the
weight reshaped to (K·K·C_in, C_out) in a single matmul. The backward pass is made of
convolutions of flipped, dilated tensors, so it is differentiable itself.
"""

from __future__ import annotations

from typing import Optional, Tuple

from ..autograd import NDArray, Tensor, TensorOp
from ..backend_selection import array_api
from .ops_mathematic import _norm_axes, transpose


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
    same op with the widths negated. Internal: used by the conv and undilate gradients.
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


class Conv(TensorOp):
    """2-D convolution (cross-correlation, as in the course) with zero padding.

    A: (N, H, W, C_in) NHWC, B: (K, K, C_in, C_out) -> (N, H_out, W_out, C_out) with
    H_out = (H + 2·padding - K) // stride + 1 (likewise W_out). Non-square kernels
    (K_h, K_w, C_in, C_out) work too (an extension, used by the gradient).
    """

    def __init__(self, stride: int = 1, padding: int = 0):
        if int(stride) != stride or stride < 1:
            raise ValueError(f"conv stride must be a positive integer, got {stride!r}")
        if int(padding) != padding or padding < 0:
            raise ValueError(f"conv padding must be a non-negative integer, got {padding!r}")
        self.stride = int(stride)
        self.padding = int(padding)
        # (im2col matrix, (H_out, W_out)) until the weight gradient takes it
        self._cols: Optional[Tuple[NDArray, Tuple[int, int]]] = None

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
        cols, (Ho, Wo) = _im2col(A, KH, KW, s, p)
        # Kept for ConvWeightGrad, which needs the same matrix (as PyTorch's im2col convolution
        # keeps its columns); the op, and with it this matrix, is dropped at once when no
        # input requires a gradient.
        self._cols = (cols, (Ho, Wo))
        out = cols @ B.compact().reshape((KH * KW * C, C_out))
        return out.reshape((N, Ho, Wo, C_out))

    def gradient(self, out_grad: Tensor, node: Tensor):
        X, Wt = node.inputs
        N, H, W, C_in = X.shape
        KH, KW, _, C_out = Wt.shape
        s, p = self.stride, self.padding
        # Inputs that need no adjoint get None, which reverse mode skips: for a network's input
        # images the full convolution would be the most expensive product of a ResNet-9 step.
        grad_X = self._input_gradient(out_grad, Wt, (N, H, W, C_in)) if X.requires_grad else None

        # dW[kh, kw, ci, co] = sum over (n, i, j) of Xpad[n, i·s+kh, j·s+kw, ci]·G[n, i, j, co]:
        # one product of the forward pass's im2col matrix (transposed) with out_grad, at any
        # stride (correlating with the dilated adjoint would multiply mostly zeros).
        grad_W = ConvWeightGrad((KH, KW), s, p, forward=self)(X, out_grad)
        return grad_X, grad_W

    def _input_gradient(self, G: Tensor, Wt: Tensor, in_shape) -> Tensor:
        """dX for the output adjoint G. Stride 1: full convolution of G with the flipped kernel
        (channels swapped), the padding p cropped. Larger strides: :class:`ConvInputGrad`
        (convolving the dilated G would multiply mostly zeros)."""
        KH, KW = Wt.shape[0], Wt.shape[1]
        p = self.padding
        if self.stride > 1:
            return ConvInputGrad((in_shape[1], in_shape[2]), self.stride, p)(G, Wt)
        W_flip = flip(transpose(Wt, (2, 3)), (0, 1))  # (KH, KW, C_out, C_in), one copy
        if KH == KW:
            full = conv(G, W_flip, stride=1, padding=KH - 1)
        else:  # non-square kernels only arise when differentiating a weight gradient
            full = conv(
                _PadCrop(((0, 0), (KH - 1, KH - 1), (KW - 1, KW - 1), (0, 0)))(G),
                W_flip,
                stride=1,
                padding=0,
            )
        return _crop(full, (0, p, p, 0), in_shape)


def _im2col(A: NDArray, KH: int, KW: int, stride: int, padding: int):
    """The patches of NHWC ``A`` (N, H, W, C) zero-padded by ``padding``: a compact
    (N·H_out·W_out, KH·KW·C) array whose row (n, i, j) is the window at (i·stride, j·stride),
    and (H_out, W_out). The padded input is viewed as (N, H_out, W_out, KH, KW, C) with
    ``as_strided`` (no copy) and compacted once."""
    N, H, W, C = A.shape
    p, s = padding, stride
    if p:
        A = A.pad(((0, 0), (p, p), (p, p), (0, 0)))
    A = A.compact()
    Hp, Wp = H + 2 * p, W + 2 * p
    Ho, Wo = (Hp - KH) // s + 1, (Wp - KW) // s + 1
    sn, sh, sw = Hp * Wp * C, Wp * C, C
    cols = A.as_strided((N, Ho, Wo, KH, KW, C), (sn, sh * s, sw * s, sh, sw, 1))
    return cols.compact().reshape((N * Ho * Wo, KH * KW * C)), (Ho, Wo)


class ConvWeightGrad(TensorOp):
    """The weight adjoint of ``conv(X, W, stride, padding)`` for an output adjoint G.

    X: (N, H, W, C_in) NHWC, G: (N, H_out, W_out, C_out) -> (KH, KW, C_in, C_out), computed as
    im2col(X)ᵀ @ G in one product. Linear in each input: its own adjoints are the input
    gradient of the convolution (for X) and the convolution itself (for G), so it is
    differentiable again. Internal: the gradient of :class:`Conv`.
    """

    def __init__(
        self, kernel: Tuple[int, int], stride: int, padding: int, forward: Optional["Conv"] = None
    ):
        self.kernel = (int(kernel[0]), int(kernel[1]))
        self.stride = int(stride)
        self.padding = int(padding)
        self.forward = forward  # the Conv whose im2col matrix of X this may take over

    def compute(self, X: NDArray, G: NDArray):
        KH, KW = self.kernel
        C_in, C_out = X.shape[3], G.shape[3]
        forward = self.forward
        saved = forward._cols if forward is not None else None
        if forward is not None and saved is not None:
            forward._cols = None  # taken: freed once this product is done
            cols, (Ho, Wo) = saved
        else:
            cols, (Ho, Wo) = _im2col(X, KH, KW, self.stride, self.padding)
        if (G.shape[1], G.shape[2]) != (Ho, Wo):
            raise ValueError(
                f"conv weight gradient: adjoint {tuple(G.shape)} does not match "
                f"the output size {(Ho, Wo)}"
            )
        g = G.compact().reshape((cols.shape[0], C_out))
        return (cols.permute((1, 0)) @ g).reshape((KH, KW, C_in, C_out))

    def gradient(self, out_grad: Tensor, node: Tensor):
        X, G = node.inputs
        conv_op = Conv(self.stride, self.padding)
        grad_X = None
        if X.requires_grad:  # <V, im2col(X)ᵀ G> = <conv(X, V), G>: conv's input adjoint
            grad_X = conv_op._input_gradient(G, out_grad, tuple(X.shape))
        return grad_X, conv_op(X, out_grad)


class ConvInputGrad(TensorOp):
    """The input adjoint of ``conv(X, W, stride, padding)`` for an output adjoint G.

    G: (N, H_out, W_out, C_out), W: (KH, KW, C_in, C_out) -> (N, H, W, C_in) for the input
    size ``in_hw`` = (H, W): the patches' adjoints G @ Wᵀ (one product) are added back
    into the zero-padded input at each of the KH·KW kernel offsets (col2im), then the padding
    is cropped. Linear in each input: its adjoints are the convolution (for G) and
    :class:`ConvWeightGrad` (for W), so it is differentiable again. Internal: the gradient
    of :class:`Conv` at strides above 1.
    """

    def __init__(self, in_hw: tuple, stride: int, padding: int):
        self.in_hw = (int(in_hw[0]), int(in_hw[1]))
        self.stride = int(stride)
        self.padding = int(padding)

    def compute(self, G: NDArray, W: NDArray):
        N, Ho, Wo, C_out = G.shape
        KH, KW, C_in, _ = W.shape
        (H, Wd), s, p = self.in_hw, self.stride, self.padding
        Hp, Wp = H + 2 * p, Wd + 2 * p
        if ((Hp - KH) // s + 1, (Wp - KW) // s + 1) != (Ho, Wo):
            raise ValueError(
                f"conv input gradient: adjoint {tuple(G.shape)} does not match "
                f"input size {(H, Wd)} with kernel {(KH, KW)}"
            )
        cols = G.compact().reshape((N * Ho * Wo, C_out)) @ W.compact().reshape(
            (KH * KW * C_in, C_out)
        ).permute((1, 0))
        # (N, Ho, Wo, KH·KW·C_in): offset (kh, kw) is a C_in-wide slice of the last axis, so
        # each update is a same-shape 4-D strided add on every backend.
        cols = cols.reshape((N, Ho, Wo, KH * KW * C_in))
        out = array_api.full((N, Hp, Wp, C_in), 0.0, dtype=G.dtype, device=G.device)
        for kh in range(KH):
            for kw in range(KW):
                window = (
                    slice(None),
                    slice(kh, kh + s * (Ho - 1) + 1, s),
                    slice(kw, kw + s * (Wo - 1) + 1, s),
                )
                c0 = (kh * KW + kw) * C_in
                out[window] = out[window] + cols[:, :, :, c0 : c0 + C_in]
        return out[:, p : p + H, p : p + Wd, :].compact() if p else out

    def gradient(self, out_grad: Tensor, node: Tensor):
        G, W = node.inputs
        # <V, dX(G, W)> = <conv(V, W), G>
        grad_G = conv(out_grad, W, stride=self.stride, padding=self.padding)
        grad_W = ConvWeightGrad((W.shape[0], W.shape[1]), self.stride, self.padding)(out_grad, G)
        return grad_G, grad_W


def _crop(x: Tensor, starts, lengths) -> Tensor:
    """The window of ``x`` starting at ``starts`` with sizes ``lengths`` (x itself if equal)."""
    widths = tuple((-st, st + ln - n) for n, st, ln in zip(x.shape, starts, lengths))
    if all(w == (0, 0) for w in widths):
        return x
    return _PadCrop(widths)(x)


def conv(a: Tensor, b: Tensor, stride: int = 1, padding: int = 1) -> Tensor:
    """2-D convolution of NHWC ``a`` with (K, K, C_in, C_out) ``b`` (course default padding=1)."""
    return Conv(stride, padding)(a, b)


__all__ = ["Flip", "flip", "Dilate", "dilate", "UnDilate", "undilate", "Conv", "conv"]
