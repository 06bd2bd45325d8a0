"""needle.fast: opt-in speed, proven equal to the course's code (``import needle.fast``).

The course's files (``autograd``, ``ops``, ``nn``, ``optim``, ``init``, ``data``) are written
the course's way and never import this package. Here:

* :func:`fuse` swaps a model's course modules for fused twins (:mod:`needle.fast.nn`) built on
  fused ops (:mod:`needle.fast.ops`): the same values and gradients with fewer graph nodes
  and arrays; :func:`unfuse` swaps them back;
* :func:`backward` is ``loss.backward(create_graph=False)`` that also frees arrays as soon as
  the pass no longer needs them;
* :func:`compile`: a training step captured once and replayed as a kernel list
  (``needle/fast/compile.py``); also reachable as ``ndl.compile``.
"""

from . import ops
from .backward import backward
from .compile import CaptureWarning, CompiledStep, compile
from .fuse import fuse, register, registered, unfuse
from .nn import course_forward

__all__ = [
    "ops",
    "fuse",
    "unfuse",
    "register",
    "registered",
    "backward",
    "course_forward",
    "compile",
    "CompiledStep",
    "CaptureWarning",
]
