"""needle's strided NDArray and its device modules (numpy, compiled C++ CPU, compiled CUDA)."""
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
    empty,
    exp,
    flip,
    full,
    log,
    maximum,
    prod,
    reshape,
    sum,
    tanh,
)
from .device import ndarray_backend_cpu, ndarray_backend_cuda, ndarray_backend_numpy
from .fused import *  # noqa: F401,F403  (softmax_xent, layernorm_fwd, ...: see fused.__all__)
