"""Fused kernels at the NDArray level (softmax cross-entropy, Layer/BatchNorm, LSTM cell,
in-place SGD/Adam updates): validate NDArrays, allocate outputs, call the device module."""

__all__: list = []  # the public fused functions, re-exported by the array API
