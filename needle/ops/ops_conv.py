"""Convolution and its helpers: flip, dilate, undilate (hw4).

``conv`` takes NHWC input and a (K, K, C_in, C_out) weight. The forward pass is im2col on a
strided view: the zero-padded input is viewed (without copying) as
(N, H_out, W_out, K, K, C_in) with ``as_strided``, compacted once and multiplied by the
weight reshaped to (K·K·C_in, C_out) in a single matmul. The backward pass is made of
convolutions of flipped, dilated tensors, so it is differentiable itself.
"""
from __future__ import annotations

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
    return tuple(slice(None, None, dilation + 1) if i in axes else slice(None)
                 for i in range(len(shape)))


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

    def compute(self, A: NDArray, B: NDArray):
        if A.ndim != 4 or B.ndim != 4:
            raise ValueError(f"conv needs A (N, H, W, C_in) and B (K, K, C_in, C_out), got shapes "
                             f"{tuple(A.shape)} and {tuple(B.shape)}")
        N, H, W, C = A.shape
        KH, KW, C_in, C_out = B.shape
        if C != C_in:
            raise ValueError(f"conv: input has {C} channels but the weight {tuple(B.shape)} "
                             f"expects {C_in}")
        p, s = self.padding, self.stride
        if H + 2 * p < KH or W + 2 * p < KW:
            raise ValueError(f"conv: kernel {KH}x{KW} is larger than the padded input "
                             f"{H + 2 * p}x{W + 2 * p}")
        pads = ((0, 0), (p, p), (p, p), (0, 0))
        if p:
            A = A.pad(pads)
        A = A.compact()
        Hp, Wp = H + 2 * p, W + 2 * p
        Ho, Wo = (Hp - KH) // s + 1, (Wp - KW) // s + 1
        sn, sh, sw, sc = Hp * Wp * C, Wp * C, C, 1
        cols = A.as_strided((N, Ho, Wo, KH, KW, C), (sn, sh * s, sw * s, sh, sw, sc))
        cols = cols.compact().reshape((N * Ho * Wo, KH * KW * C))
        out = cols @ B.compact().reshape((KH * KW * C, C_out))
        return out.compact().reshape((N, Ho, Wo, C_out))

    def gradient(self, out_grad: Tensor, node: Tensor):
        X, Wt = node.inputs
        N, H, W, C_in = X.shape
        KH, KW, _, C_out = Wt.shape
        s, p = self.stride, self.padding
        # Spread the adjoint back onto the stride-1 grid: (N, Ho·s, Wo·s, C_out), the last
        # s - 1 rows/columns being zeros.
        G = dilate(out_grad, (1, 2), s - 1) if s > 1 else out_grad

        # Inputs that need no adjoint get None, which reverse mode skips: for a network's input
        # images the full convolution would be the most expensive product of a ResNet-9 step.
        grad_X = self._input_gradient(G, Wt, (N, H, W, C_in)) if X.requires_grad else None

        # dW: correlate the padded input with G, batch and channels exchanged:
        # (C_in, Hp, Wp, N) * (Ho', Wo', N, C_out) -> (C_in, >=KH, >=KW, C_out).
        Gc = G
        if s > 1:  # drop G's trailing zeros so the result is not shorter than K
            Gc = _PadCrop(((0, 0), (0, 1 - s), (0, 1 - s), (0, 0)))(G)
        Xt = transpose(X, (0, 3))                            # (C_in, H, W, N)
        Gt = transpose(transpose(Gc, (0, 1)), (1, 2))        # (Ho', Wo', N, C_out)
        gW = conv(Xt, Gt, stride=1, padding=p)
        gW = _crop(gW, (0, 0, 0, 0), (C_in, KH, KW, C_out))
        grad_W = transpose(transpose(gW, (0, 1)), (1, 2))    # (KH, KW, C_in, C_out)
        return grad_X, grad_W


    def _input_gradient(self, G: Tensor, Wt: Tensor, in_shape) -> Tensor:
        """dX: full convolution of G with the flipped kernel (channels swapped), then the
        padding p (and any trailing rows the strided forward pass never reached) cropped."""
        KH, KW = Wt.shape[0], Wt.shape[1]
        p = self.padding
        W_flip = transpose(flip(Wt, (0, 1)), (2, 3))  # (KH, KW, C_out, C_in)
        if KH == KW:
            full = conv(G, W_flip, stride=1, padding=KH - 1)
        else:  # non-square kernels only arise when differentiating a weight gradient
            full = conv(_PadCrop(((0, 0), (KH - 1, KH - 1), (KW - 1, KW - 1), (0, 0)))(G),
                        W_flip, stride=1, padding=0)
        return _crop(full, (0, p, p, 0), in_shape)


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
