"""needle's strided NDArray and its device modules (numpy, compiled C++ CPU, compiled CUDA).

The device-module contract is ``protocol.py``; docs/array_layer.md describes the layer.

The package loads lazily: importing it (or its pure-Python modules ``numpy_kernels``,
``fused_spec`` and ``protocol``, which the ``NEEDLE_BACKEND=np`` backend uses) does not import
the NDArray layer or the compiled device modules; the first attribute asked of the package
(``NDArray``, ``cpu``, ``array``, ``layernorm_fwd``, ...) does.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what _load() puts into the namespace, for the type checker
    from . import ndarray_backend_numpy as ndarray_backend_numpy
    from .fused import *  # noqa: F403
    from .ndarray import *  # noqa: F403

# The modules that import only numpy and the standard library.
_PURE_MODULES = ("protocol", "fused_spec", "numpy_kernels")
_loading = False


def _load() -> dict[str, Any]:
    """Import the NDArray layer and put its public names into this package's namespace."""
    global _loading
    _loading = True  # meanwhile a missing name is a submodule that `from . import` will load
    try:
        ndarray = importlib.import_module(".ndarray", __name__)
        device = importlib.import_module(".device", __name__)
        fused = importlib.import_module(".fused", __name__)
    finally:
        _loading = False
    names = {n: getattr(ndarray, n) for n in ndarray.__all__}
    names.update({n: getattr(fused, n) for n in fused.__all__})
    for module in ("ndarray_backend_cpu", "ndarray_backend_cuda", "ndarray_backend_numpy"):
        names[module] = getattr(device, module)
    globals().update(names)
    return names


def __getattr__(name: str) -> Any:
    if name.startswith("__") or _loading:
        raise AttributeError(name)
    if name in _PURE_MODULES:
        return importlib.import_module(f".{name}", __name__)
    names = _load()
    if name in names:
        return names[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_load()))
