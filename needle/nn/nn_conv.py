"""Convolutional modules (hw4): ``Conv``, a 2-D convolution on NCHW images."""

from __future__ import annotations

import math
import numbers
from typing import Optional

from needle import init, ops
from needle.autograd import Tensor

from .nn_basic import NCHW_TO_NHWC, NHWC_TO_NCHW, Module, Parameter

__all__ = ["Conv"]


def _positive_int(value, name: str) -> int:
    """``value`` as an int (a square (k, k) tuple is accepted too); ValueError otherwise."""
    if isinstance(value, (tuple, list)):
        if len(value) != 2 or value[0] != value[1]:
            raise ValueError(f"Conv supports only square {name}s, got {value!r}")
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"Conv: {name} must be a positive int, got {value!r}")
    return int(value)


# question: hw4_nn_conv
class Conv(Module):
    """2-D convolution with "same" zero padding ``kernel_size // 2``, square kernels and strides.

    Input (N, C_in, H, W) -> output (N, C_out, H_out, W_out), H_out = (H + 2p - k) // stride + 1
    (= ceil(H / stride) for odd k). Internally the input is permuted to NHWC for ``ops.conv``
    and the result permuted back. Parameters, created in this order so a seeded RNG gives the
    course's values: ``weight`` (k, k, C_in, C_out) = kaiming_uniform(C_in·k², C_out·k²) and
    ``bias`` (C_out,) ~ U(-1/sqrt(C_in·k²), 1/sqrt(C_in·k²)) (None when ``bias=False``).
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: int = 1,
        bias: bool = True,
        device=None,
        dtype: str = "float32",
    ):
        super().__init__()
        self.in_channels = _positive_int(in_channels, "in_channels")
        self.out_channels = _positive_int(out_channels, "out_channels")
        self.kernel_size = _positive_int(kernel_size, "kernel_size")
        self.stride = _positive_int(stride, "stride")
        self.padding = self.kernel_size // 2
        k, cin, cout = self.kernel_size, self.in_channels, self.out_channels
        self.weight = Parameter(
            init.kaiming_uniform(
                cin * k * k,
                cout * k * k,
                shape=(k, k, cin, cout),
                device=device,
                dtype=dtype,
                requires_grad=True,
            )
        )
        self.bias: Optional[Parameter]
        if bias:
            bound = 1.0 / math.sqrt(cin * k * k)
            self.bias = Parameter(
                init.rand(
                    cout, low=-bound, high=bound, device=device, dtype=dtype, requires_grad=True
                )
            )
        else:
            self.bias = None

    def forward(self, x: Tensor) -> Tensor:
        """Convolve ``x`` (N, C_in, H, W); returns (N, C_out, H_out, W_out)."""
        self.check_nchw(x)
        # compact: the forward and the weight gradient's kernels share this one NHWC copy
        # (none is made when x lies NHWC in memory already, as the layers' outputs here do)
        out = self.forward_nhwc(ops.permute(x, NCHW_TO_NHWC, compact=True))
        return ops.permute(out, NHWC_TO_NCHW)

    def check_nchw(self, x: Tensor) -> None:
        """Raise ValueError unless ``x`` is (N, C_in, H, W), the input :meth:`forward` takes."""
        if len(x.shape) != 4 or x.shape[1] != self.in_channels:
            raise ValueError(
                f"Conv({self.in_channels}, {self.out_channels}) expects input of "
                f"shape (N, {self.in_channels}, H, W), got {tuple(x.shape)}"
            )

    def check_nhwc(self, x: Tensor) -> None:
        """Raise ValueError unless ``x`` is (N, H, W, C_in), the input :meth:`forward_nhwc`
        takes."""
        if len(x.shape) != 4 or x.shape[3] != self.in_channels:
            raise ValueError(
                f"Conv({self.in_channels}, {self.out_channels}).forward_nhwc "
                f"expects input of shape (N, H, W, {self.in_channels}), "
                f"got {tuple(x.shape)}"
            )

    def forward_nhwc(self, x: Tensor, add_bias: bool = True) -> Tensor:
        """Convolve channels-last ``x`` (N, H, W, C_in); returns (N, H_out, W_out, C_out).

        The same map as :meth:`forward` without its two layout changes, for networks that
        keep their activations channels-last throughout. ``add_bias=False`` leaves the bias out,
        for a caller that adds it itself (``BatchNorm2d.forward_nhwc(pre_bias=...)``)."""
        self.check_nhwc(x)
        out = ops.conv(x, self.weight, stride=self.stride, padding=self.padding)
        if self.bias is not None and add_bias:
            # = out + bias.reshape((1, 1, 1, C_out)).broadcast_to(out.shape), one node
            out = ops.bias_add(out, self.bias)
        return out
