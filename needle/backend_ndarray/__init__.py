"""needle's strided NDArray and its device modules (numpy, compiled C++ CPU, compiled CUDA).

The device-module contract is ``protocol.py``; docs/array_layer.md describes the layer.
"""
from .ndarray import (
    BackendDevice,
    NDArray,
    all_devices,
    array,
    broadcast_to,
    cpu,
    cpu_numpy,
    cuda,
    default_device,
    default_tensor_device,
    empty,
    exp,
    flip,
    full,
    log,
    matmul,
    matmul_tiled,
    max,
    maximum,
    minimum,
    pad,
    permute,
    prod,
    relu,
    reshape,
    sigmoid,
    sqrt,
    sum,
    tanh,
)
from .device import ndarray_backend_cpu, ndarray_backend_cuda, ndarray_backend_numpy
from .fused import *  # noqa: F401,F403  (softmax_xent, layernorm_fwd, ...: see fused.__all__)
