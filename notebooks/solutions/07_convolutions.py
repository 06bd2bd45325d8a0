"""Reference answers to the exercises of notebooks/07_convolutions (try them first)."""
import numpy as np


def conv_output_size(n, k, stride, padding):
    """Output height (= width) of the convolution."""
    return (n + 2 * padding - k) // stride + 1


def conv2d(x, w):
    """Stride-1, unpadded convolution: (N, H, W, C_in) * (k, k, C_in, C_out) -> NHWC."""
    k = w.shape[0]
    n, h, wd, _ = x.shape
    out = np.zeros((n, h - k + 1, wd - k + 1, w.shape[3]), dtype=np.float32)
    for i in range(k):
        for j in range(k):
            out += x[:, i:i + h - k + 1, j:j + wd - k + 1, :] @ w[i, j]
    return out


def dilate2d(a, dilation):
    """a with `dilation` zeros inserted after each element along both axes."""
    out = np.zeros((a.shape[0] * (dilation + 1), a.shape[1] * (dilation + 1)), dtype=a.dtype)
    out[::dilation + 1, ::dilation + 1] = a
    return out
