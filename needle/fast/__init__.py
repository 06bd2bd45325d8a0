"""needle's opt-in speed wing: ``import needle.fast``.

Nothing in the course's files (``autograd``, ``ops``, ``nn``, ``optim``, ``init``, ``data``)
imports this package.

* :func:`compile`: a training step captured once and replayed as a kernel list
  (``needle/fast/compile.py``); also reachable as ``ndl.compile``.
"""

from .compile import CaptureWarning, CompiledStep, compile

__all__ = ["compile", "CompiledStep", "CaptureWarning"]
