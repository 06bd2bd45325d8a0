"""The course's model zoo (hw4): ResNet9 for CIFAR-10 images, and the language models."""

from __future__ import annotations

import math

import needle as ndl
import needle.nn as nn
from needle import ops
from needle.nn.nn_basic import NCHW_TO_NHWC, NHWC_TO_NCHW

from ._fast import fast_wing
from .language_model import LanguageModel

# None on a student's needle (NEEDLE_IMPL), which has no fast wing: no twin then
fast = fast_wing()

__all__ = ["ConvBN", "FastConvBN", "ResNet9", "LanguageModel"]


# question: hw4_resnet9
class ConvBN(ndl.nn.Module):
    """Conv(a, b, k, stride=s) -> BatchNorm2d(b) -> ReLU; (N, a, H, W) -> (N, b, H', W')."""

    def __init__(self, a: int, b: int, k: int, s: int, device=None, dtype: str = "float32"):
        super().__init__()
        self.conv = nn.Conv(a, b, k, stride=s, device=device, dtype=dtype)
        self.bn = nn.BatchNorm2d(b, device=device, dtype=dtype)
        self.relu = nn.ReLU()

    def forward(self, x: ndl.Tensor) -> ndl.Tensor:
        return self.relu(self.bn(self.conv(x)))


class FastConvBN(ConvBN):
    """:class:`ConvBN`'s fused twin (``needle.fast.fuse`` swaps it in): in training the
    convolution, its bias, the norm and the ReLU are one node
    (``fast.ops.ConvBatchNormTrain``: neither the convolution's output nor a channels-last copy
    of the input is kept until backward); in evaluation the convolution runs channels-last and
    one node does the rest. The same values and gradients as :class:`ConvBN` (tested); a block
    whose conv, norm or ReLU runs other code than the course's runs its layers in turn."""

    _course_class = ConvBN

    def forward(self, x: ndl.Tensor) -> ndl.Tensor:
        conv, bn, relu = self.conv, self.bn, self.relu
        if not (
            fast.course_forward(conv, nn.Conv)
            and fast.course_forward(bn, nn.BatchNorm2d)
            and fast.course_forward(relu, nn.ReLU)
        ):
            return super().forward(x)
        conv.check_nchw(x)
        if bn.training and conv.bias is not None and math.prod(x.shape) > 0:
            op = fast.ops.ConvBatchNormTrain(
                conv.stride, conv.padding, bn.eps, relu=True, channels_first=True
            )
            h = fast.nn.fold_statistics(bn, op, op(x, conv.weight, conv.bias, bn.weight, bn.bias))
        else:
            nhwc = ops.permute(x, NCHW_TO_NHWC, compact=True)
            h = conv.forward_nhwc(nhwc, add_bias=False)
            h = fast.nn.normalise(bn, h, pre_bias=conv.bias, relu=True)
        return ops.permute(h, NHWC_TO_NCHW)


if fast is not None:
    fast.register(ConvBN, FastConvBN)


# question: hw4_resnet9
class ResNet9(ndl.nn.Module):
    """hw4's ResNet-9: (N, 3, 32, 32) images -> (N, 10) logits; 431,946 parameters.

    ConvBN(3,16,7,4), ConvBN(16,32,3,2), Residual(ConvBN(32,32,3,1), ConvBN(32,32,3,1)),
    ConvBN(32,64,3,2), ConvBN(64,128,3,2), Residual(ConvBN(128,128,3,1) x 2), Flatten,
    Linear(128,128), ReLU, Linear(128,10). The strides take 32x32 down to 1x1 before Flatten.
    ``self.model`` takes (N, 3, 32, 32) images as in the course, so its blocks can be called on
    their own; ``needle.fast.fuse(model)`` runs each block as one fused node.
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
