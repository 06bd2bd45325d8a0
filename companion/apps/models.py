"""The course's model zoo (hw4): ResNet9 for CIFAR-10 images, and the language models."""

from __future__ import annotations

import math

import needle as ndl
import needle.nn as nn
from needle import ops
from needle.nn.nn_basic import NCHW_TO_NHWC, NHWC_TO_NCHW
from needle.ops import ops_fused

from .language_model import LanguageModel

__all__ = ["ConvBN", "ResNet9", "LanguageModel"]


class ConvBN(ndl.nn.Module):
    """Conv(a, b, k, stride=s) -> BatchNorm2d(b) -> ReLU; (N, a, H, W) -> (N, b, H', W').

    With ``channels_last=True`` it maps (N, H, W, a) -> (N, H', W', b) instead (the same
    parameters and values, no layout changes inside).
    """

    def __init__(
        self,
        a: int,
        b: int,
        k: int,
        s: int,
        device=None,
        dtype: str = "float32",
        channels_last: bool = False,
    ):
        super().__init__()
        self.conv = nn.Conv(a, b, k, stride=s, device=device, dtype=dtype)
        self.bn = nn.BatchNorm2d(b, device=device, dtype=dtype)
        self.relu = nn.ReLU()
        self.channels_last = channels_last

    def forward(self, x: ndl.Tensor) -> ndl.Tensor:
        if self.channels_last:
            return self._conv_bn_relu(x)
        # NCHW in and out, as the course's block, but the convolution's channels-last result
        # goes through the norm and the ReLU as it is: one layout change each way for the block
        # instead of one around each layer (the same values)
        self.conv.check_nchw(x)
        source = _nhwc_source(x)
        h = self._conv_bn_relu(source) if source is not None else self._conv_bn_relu(x, True)
        return ops.permute(h, NHWC_TO_NCHW)

    def _conv_bn_relu(self, x: ndl.Tensor, channels_first: bool = False) -> ndl.Tensor:
        """The block on channels-last ``x`` (on NCHW ``x`` when ``channels_first``), returning
        channels-last output: in training the conv, its bias, the norm and the ReLU are one node
        (``ops_fused.ConvBatchNormTrain``: the same values, and neither the conv's output nor a
        channels-last copy of an NCHW input is kept until backward); otherwise the conv and one
        node for the rest (``BatchNorm2d.forward_nhwc(pre_bias=..., relu=True)``); the layers
        in turn if ``self.relu`` was replaced by another module."""
        conv, bn = self.conv, self.bn
        fused = type(self.relu) is nn.ReLU and bn.training and conv.bias is not None
        if fused and math.prod(x.shape) > 0:
            if not channels_first:
                conv.check_nhwc(x)
            op = ops_fused.ConvBatchNormTrain(
                conv.stride, conv.padding, bn.eps, relu=True, channels_first=channels_first
            )
            return bn.fold_statistics(op, op(x, conv.weight, conv.bias, bn.weight, bn.bias))
        if channels_first:
            x = ops.permute(x, NCHW_TO_NHWC, compact=True)
        if type(self.relu) is not nn.ReLU:
            return self.relu(bn.forward_nhwc(conv.forward_nhwc(x)))
        h = conv.forward_nhwc(x, add_bias=False)
        return bn.forward_nhwc(h, pre_bias=conv.bias, relu=True)


def _nhwc_source(x: ndl.Tensor) -> ndl.Tensor | None:
    """When ``x`` (N, C, H, W) is the NCHW view that a block before made of its own compact
    NHWC output, that output (no node: the two layout changes cancel, and reverse mode skips
    them); otherwise None (the block then changes the layout itself)."""
    op = x.op
    if isinstance(op, ops.Permute) and op.axes == NHWC_TO_NCHW and not op.compact:
        source = x.inputs[0]
        # numpy arrays (NEEDLE_BACKEND=np) have no is_compact: they take the permute
        is_compact = getattr(source.realize_cached_data(), "is_compact", None)
        if is_compact is not None and is_compact():
            return source
    return None


class ResNet9(ndl.nn.Module):
    """hw4's ResNet-9: (N, 3, 32, 32) images -> (N, 10) logits; 431,946 parameters.

    ConvBN(3,16,7,4), ConvBN(16,32,3,2), Residual(ConvBN(32,32,3,1), ConvBN(32,32,3,1)),
    ConvBN(32,64,3,2), ConvBN(64,128,3,2), Residual(ConvBN(128,128,3,1) x 2), Flatten,
    Linear(128,128), ReLU, Linear(128,10). The strides take 32x32 down to 1x1 before Flatten.
    ``self.model`` takes (N, 3, 32, 32) images as in the course, so its blocks can be called on
    their own; ``ConvBN(..., channels_last=True)`` is the faster layout for a model of one's own.
    """

    def __init__(self, device=None, dtype: str = "float32"):
        super().__init__()
        self.device = device
        self.dtype = dtype
        kw = dict(device=device, dtype=dtype)
        self.model = nn.Sequential(
            ConvBN(3, 16, 7, 4, **kw),
            ConvBN(16, 32, 3, 2, **kw),
            nn.Residual(nn.Sequential(ConvBN(32, 32, 3, 1, **kw), ConvBN(32, 32, 3, 1, **kw))),
            ConvBN(32, 64, 3, 2, **kw),
            ConvBN(64, 128, 3, 2, **kw),
            nn.Residual(nn.Sequential(ConvBN(128, 128, 3, 1, **kw), ConvBN(128, 128, 3, 1, **kw))),
            nn.Flatten(),
            nn.Linear(128, 128, **kw),
            nn.ReLU(),
            nn.Linear(128, 10, **kw),
        )

    def forward(self, x: ndl.Tensor) -> ndl.Tensor:
        """Logits (N, 10) for images ``x`` of shape (N, 3, 32, 32)."""
        if len(x.shape) != 4 or tuple(x.shape[1:]) != (3, 32, 32):
            raise ValueError(
                f"ResNet9 expects images of shape (N, 3, 32, 32), got {tuple(x.shape)}"
            )
        return self.model(x)
