"""Is a device kernel still the course's C++ stub? Call it once on an output filled with a
sentinel and see whether it wrote anything.

The course's hw3 skeleton leaves each kernel as ``assert(false && "Not Implemented")``. Compiled
without NDEBUG, calling it aborts the process (the runner reports that as "not implemented");
compiled with NDEBUG, the assert vanishes and the kernel returns leaving its output as it was,
which a value comparison would call wrong. :func:`require_written` turns that case into
"not implemented" too, and a kernel the module does not define (the course's skeleton leaves the
element-wise ones for the student to add and register) likewise. It uses only the course's
device-module API (``Array``, ``fill``, ``from_numpy``, ``to_numpy`` and the kernels).
"""

from __future__ import annotations

import numpy as np

from .diagnose import NotImplementedYet

SENTINEL = -12345.0  # exact in float32; no kernel here can produce it from the inputs below

_A = (np.arange(1, 13, dtype=np.float32) / 4.0).reshape(3, 4)  # positive, away from 0
_B = (np.arange(12, 0, -1, dtype=np.float32) / 3.0).reshape(3, 4)

BINARY = ("ewise_mul", "ewise_div", "ewise_maximum", "ewise_eq", "ewise_ge")
UNARY = ("ewise_log", "ewise_exp", "ewise_tanh")
SCALAR = ("scalar_mul", "scalar_div", "scalar_power", "scalar_maximum", "scalar_eq", "scalar_ge")


def _kernel(dev, name: str):
    try:
        return getattr(dev, name)
    except AttributeError:
        raise NotImplementedYet(
            f"your {dev} module has no {name}: write it in C++ and register it in "
            "PYBIND11_MODULE (the course's skeleton leaves it for you to add)"
        ) from None


def _buffer(dev, values: np.ndarray):
    buf = dev.Array(values.size)
    dev.from_numpy(np.ascontiguousarray(values, dtype=np.float32).ravel(), buf)
    return buf


def _run(dev, name: str, size: int, call) -> None:
    kernel = _kernel(dev, name)
    out = dev.Array(size)
    dev.fill(out, SENTINEL)
    call(kernel, out)
    got = np.asarray(dev.to_numpy(out, (size,), (1,), 0))
    if got.size and np.all(got == np.float32(SENTINEL)):
        raise NotImplementedYet(
            f"on {dev}: {name} returned without writing its output: the C++ body is still "
            'the course\'s stub (assert(false && "Not Implemented") does nothing when compiled '
            "with NDEBUG)"
        )


def require_written(dev, names: tuple[str, ...]) -> None:
    """Raise ``NotImplementedYet`` for the first kernel in ``names`` that is missing or leaves
    its output untouched on ``dev``."""
    a, b = _buffer(dev, _A), _buffer(dev, _B)
    for name in names:
        if name in BINARY or name == "ewise_add":
            _run(dev, name, 12, lambda k, out: k(a, b, out))
        elif name in UNARY:
            _run(dev, name, 12, lambda k, out: k(a, out))
        elif name in SCALAR or name == "scalar_add":
            _run(dev, name, 12, lambda k, out: k(a, 1.5, out))
        elif name == "compact":
            _run(dev, name, 6, lambda k, out: k(a, out, (2, 3), (4, 1), 1))
        elif name == "ewise_setitem":
            src = _buffer(dev, _B[:2, :3])
            _run(dev, name, 12, lambda k, out: k(src, out, (2, 3), (4, 1), 1))
        elif name == "scalar_setitem":
            _run(dev, name, 12, lambda k, out: k(6, 2.5, out, (2, 3), (4, 1), 1))
        elif name in ("reduce_sum", "reduce_max"):
            _run(dev, name, 3, lambda k, out: k(a, out, 4))
        elif name == "matmul":
            _run(dev, name, 9, lambda k, out: k(a, _buffer(dev, _B.reshape(4, 3)), out, 3, 4, 3))
        elif name == "matmul_tiled":
            tile = int(getattr(dev, "__tile_size__", 8))
            m = _buffer(dev, np.ones((tile, tile), dtype=np.float32))
            _run(dev, name, tile * tile, lambda k, out: k(m, m, out, tile, tile, tile))
        else:
            raise ValueError(f"no probe for {name}")
