"""``fuse(model)``: swap a model's course modules for their fused twins, in place.

A module is swapped when it is an instance of exactly a registered course class (not a
subclass) whose ``forward`` neither the class nor the instance has replaced; the swap changes
only its class, so parameters, buffers, optimizer references and ``state_dict`` stay as they
are, in training and in evaluation. ``unfuse(model)`` swaps every twin back. The twins compute
the course modules' values and gradients (tests compare each pair).
"""

from __future__ import annotations

from typing import Dict, List

from needle.nn import nn_basic, nn_sequence, nn_transformer
from needle.nn.nn_basic import Module

from . import nn as fnn

__all__ = ["fuse", "unfuse", "register", "registered"]

_TWINS: Dict[type, type] = {
    nn_basic.Sequential: fnn.FastSequential,
    nn_basic.BatchNorm1d: fnn.FastBatchNorm1d,
    nn_basic.BatchNorm2d: fnn.FastBatchNorm2d,
    nn_basic.LayerNorm1d: fnn.FastLayerNorm1d,
    nn_basic.SoftmaxLoss: fnn.FastSoftmaxLoss,
    nn_sequence.LSTMCell: fnn.FastLSTMCell,
    nn_sequence.LSTM: fnn.FastLSTM,
    nn_sequence.Embedding: fnn.FastEmbedding,
    nn_transformer.MultiHeadAttention: fnn.FastMultiHeadAttention,
    nn_transformer.AttentionLayer: fnn.FastAttentionLayer,
    nn_transformer.TransformerLayer: fnn.FastTransformerLayer,
}


def register(course_class: type, fast_class: type) -> None:
    """Make :func:`fuse` swap ``course_class`` for ``fast_class`` (a subclass of it that only
    overrides ``forward`` and its helpers, with ``_course_class = course_class``)."""
    if not (isinstance(fast_class, type) and issubclass(fast_class, course_class)):
        raise TypeError(f"{fast_class!r} must be a subclass of {course_class!r}")
    if getattr(fast_class, "_course_class", None) is not course_class:
        raise TypeError(f"{fast_class.__name__}._course_class must be {course_class.__name__}")
    fnn.remember_course_forward(course_class)
    _TWINS[course_class] = fast_class


def registered() -> Dict[type, type]:
    """A copy of the course class -> fused twin table."""
    return dict(_TWINS)


def fuse(model: Module) -> Module:
    """Swap, in place, every module of ``model`` (itself included) that runs a registered course
    class's forward unchanged for that class's fused twin; returns ``model``."""
    for m in _tree(model):
        twin = _TWINS.get(type(m))
        if twin is not None and fnn.course_forward(m, type(m)):
            m.__class__ = twin
    return model


def unfuse(model: Module) -> Module:
    """Undo :func:`fuse`: every fused twin in ``model`` becomes its course class again."""
    for m in _tree(model):
        course = getattr(type(m), "_course_class", None)
        if course is not None:
            m.__class__ = course
    return model


def _tree(model: Module) -> List[Module]:
    if not isinstance(model, Module):
        raise TypeError(f"fuse expects a needle.nn.Module, got {type(model).__name__}")
    return [model, *model.submodules()]
