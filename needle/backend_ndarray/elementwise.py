"""The NDArray's element-wise operator methods (``a + b``, ``a * 2``, ``a.exp()``, ...).

Each is made from the op tables of ``protocol.py``: one closure per method holding its op
code, installed on the class by :func:`install` when ``ndarray.py`` is imported. A method
builds the compact result and makes one device call: the course's compact entry point of the
op (``ewise_add(a, b, out)``) for compact operands of one shape, else the strided kernel
(``ewise_binary``, ``ewise_scalar``, ``ewise_unary``), which reads broadcast, sliced and
permuted views where they lie.
"""

from __future__ import annotations

from typing import Any, Callable, Union

from .ndarray import NDArray, Scalar, _new, _scalar
from .protocol import (
    BINARY_OPS,
    COURSE_BINARY,
    COURSE_SCALAR,
    COURSE_UNARY,
    OP_METHODS,
    UNARY_OPS,
)
from .shapes import _broadcast_shapes, _broadcast_strides


def _binary_method(name: str, code: int, reverse: bool) -> Callable[[NDArray, Any], NDArray]:
    """The method BINARY_OPS[code](self, other) for an NDArray ``other`` (broadcast with
    numpy's rules) or a scalar; (other, self) when ``reverse``.

    Compact operands of one shape go to the course's compact entry point of the op when there
    is one (``ewise_add(a, b, out)``, ``scalar_mul(a, val, out)``): the same element-wise
    function without strides to pass, a third of a small op's kernel-call cost. Anything else
    goes to the strided ``ewise_binary``/``ewise_scalar``."""
    op = BINARY_OPS[code]
    course = f"ewise_{op}" if op in COURSE_BINARY else None
    course_scalar = f"scalar_{op}" if op in COURSE_SCALAR and not reverse else None

    def method(self: NDArray, other: Union[NDArray, Scalar]) -> NDArray:
        dev = self._device
        if isinstance(other, NDArray):
            if other._device is not dev:
                self._check_device(other)
            shape = self._shape
            if other._shape == shape:
                if course is not None and self._compact and other._compact:
                    out = _new(shape, dev)
                    getattr(dev, course)(self._handle, other._handle, out._handle)
                    return out
                a_strides, b_strides = self._strides, other._strides
            else:
                shape = _broadcast_shapes(self._shape, other._shape, "operands")
                a_strides = _broadcast_strides(self, shape)
                b_strides = _broadcast_strides(other, shape)
            out = _new(shape, dev)
            if 0 not in shape:
                dev.ewise_binary(
                    code,
                    self._handle,
                    a_strides,
                    self._offset,
                    other._handle,
                    b_strides,
                    other._offset,
                    out._handle,
                    shape,
                )
            return out
        value = _scalar(other)
        shape = self._shape
        out = _new(shape, dev)
        if course_scalar is not None and self._compact:
            getattr(dev, course_scalar)(self._handle, value, out._handle)
        elif 0 not in shape:
            dev.ewise_scalar(
                code, self._handle, self._strides, self._offset, value, out._handle, shape, reverse
            )
        return out

    method.__name__ = method.__qualname__ = name
    method.__doc__ = (
        f"Element-wise ``{op}`` with an NDArray (broadcast with "
        f"numpy's rules) or a scalar{', reflected' if reverse else ''}."
    )
    return method


def _unary_method(name: str, code: int) -> Callable[[NDArray], NDArray]:
    """The method UNARY_OPS[code](self) (the course's ``ewise_<op>(a, out)`` for a compact
    array when the op has one, as :func:`_binary_method`)."""
    op = UNARY_OPS[code]
    course = f"ewise_{op}" if op in COURSE_UNARY else None

    def method(self: NDArray) -> NDArray:
        shape = self._shape
        out = _new(shape, self._device)
        if course is not None and self._compact:
            getattr(self._device, course)(self._handle, out._handle)
        elif 0 not in shape:
            self._device.ewise_unary(
                code, self._handle, self._strides, self._offset, out._handle, shape
            )
        return out

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"Element-wise ``{op}``."
    return method


def install(array_type: type) -> None:
    """Set each element-wise method of OP_METHODS on ``array_type`` (the NDArray class)."""
    for op, methods in OP_METHODS.items():
        if op in BINARY_OPS:
            for i, name in enumerate(methods):
                setattr(array_type, name, _binary_method(name, BINARY_OPS.index(op), i == 1))
        elif op in UNARY_OPS:
            for name in methods:
                setattr(array_type, name, _unary_method(name, UNARY_OPS.index(op)))
        # the reductions (sum, max) are written in the class: they take axes
