"""Chooses the array library behind needle's tensors.

``NEEDLE_BACKEND=nd`` (the default) uses needle's own strided :class:`NDArray` with the compiled
CPU and CUDA device modules; ``NEEDLE_BACKEND=np`` uses numpy arrays
(``needle.backend_numpy.NDArray``, a ``numpy.ndarray`` subclass with NDArray's methods). Any
other value raises ``RuntimeError`` at import.
"""

import os
from typing import TYPE_CHECKING

BACKEND = os.environ.get("NEEDLE_BACKEND", "nd")

if TYPE_CHECKING:
    # The type checker sees the NDArray backend: the numpy backend's array and devices mirror
    # its methods (backend_numpy.py), and tests/framework checks the two agree at run time.
    from . import backend_ndarray as array_api
    from .backend_ndarray.device import BackendDevice as Device
elif BACKEND == "nd":
    from . import backend_ndarray as array_api

    Device = array_api.BackendDevice
elif BACKEND == "np":
    from . import backend_numpy as array_api

    Device = array_api.Device
else:
    raise RuntimeError(
        f"Unknown needle array backend {BACKEND!r}: set NEEDLE_BACKEND to 'nd' or 'np'"
    )

# Both array modules expose the same device functions.
NDArray = array_api.NDArray
all_devices = array_api.all_devices
cpu = array_api.cpu
cpu_numpy = array_api.cpu_numpy
cuda = array_api.cuda
default_device = array_api.default_device
default_tensor_device = array_api.default_tensor_device

__all__ = [
    "BACKEND",
    "array_api",
    "NDArray",
    "Device",
    "all_devices",
    "cpu",
    "cpu_numpy",
    "cuda",
    "default_device",
    "default_tensor_device",
]
