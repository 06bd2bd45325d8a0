"""The reference device module (``cpu_numpy()``): the device protocol written with numpy.

Every function takes flat ``Array`` buffers plus shape/strides/offset, exactly like the compiled
CPU and CUDA modules (see ``protocol.py`` for the contract), so NDArray's logic is exercised
identically on all three. It is slow and meant as an oracle and a readable specification of the
protocol, including its checks: a wrong kind of argument is a TypeError; buffers whose sizes do
not fit, views reaching outside their buffer, negative sizes and unknown op codes are
ValueErrors naming the function and the numbers.

The computations themselves are ``numpy_kernels``' (shared with ``NEEDLE_BACKEND=np``); the
fused kernels' buffer sizes are checked against ``fused_spec``. This module adds the buffers,
the views and the checks.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Sequence, Tuple, Union

import numpy as np

from . import fused_spec
from . import numpy_kernels as kernels
from .protocol import MAX_ELEMENTS

__device_name__ = "cpu_numpy"
_datatype = np.float32
_datetype_size = np.dtype(_datatype).itemsize
# Shapes, strides (in elements) as the protocol passes them: tuples or lists of ints, checked.
Shape = Sequence[int]


# The op tables come from the numpy kernels, in op-code order (protocol.BINARY_OPS ...); each
# is called as f(a, b, out=...) / f(a, out=...) with a float32 out (comparisons write 1.0 / 0.0).
_BINARY, _UNARY, _REDUCE = kernels.BINARY, kernels.UNARY, kernels.REDUCE
__binary_ops__ = tuple(_BINARY)
__unary_ops__ = tuple(_UNARY)
__reduce_ops__ = tuple(_REDUCE)
_BINARY_FUNCS = tuple(_BINARY.values())
_UNARY_FUNCS = tuple(_UNARY.values())
_REDUCE_FUNCS = tuple(_REDUCE.values())
_POWER = __binary_ops__.index("power")


# Bytes held by live Arrays and their peak since reset_peak() (memory_stats()).
_memory: dict[str, int] = {"live_bytes": 0, "peak_bytes": 0}


class Array:
    """A flat float32 buffer of ``size`` elements."""

    def __init__(self, size: int):
        size = _int("Array", "size", size)
        if size < 0:
            raise ValueError(f"Array size must be non-negative, got {size}")
        if size > MAX_ELEMENTS:
            raise ValueError(f"Array: size {size} is too large (at most {MAX_ELEMENTS} elements)")
        self.array = np.empty(size, dtype=np.float32)
        live = _memory["live_bytes"] + self.array.nbytes
        _memory["live_bytes"] = live
        if live > _memory["peak_bytes"]:
            _memory["peak_bytes"] = live

    def __del__(self) -> None:
        array = self.__dict__.get("array")  # absent when __init__ raised
        if array is not None:
            _memory["live_bytes"] -= array.nbytes

    @property
    def size(self) -> int:
        return self.array.size

    def ptr(self) -> int:
        """Address of the first element (views of one buffer share it)."""
        address: int = self.array.ctypes.data
        return address


def memory_stats() -> dict[str, int]:
    """Bytes held by live Arrays (``live_bytes``) and their peak since :func:`reset_peak`."""
    return dict(_memory)


def reset_peak() -> None:
    """Restart the peak of :func:`memory_stats` from the bytes live now."""
    _memory["peak_bytes"] = _memory["live_bytes"]


# ---- argument checks (the numpy twin of src/common/ndarray_checks.h) -----------------------------
# The checks take any value (that is what they check); Any where numpy or operator then use it.
def _int(fn: str, what: str, v: Any) -> int:
    if isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{fn}: {what} must be an int, got bool")
    try:
        return operator.index(v)
    except TypeError:
        raise TypeError(f"{fn}: {what} must be an int, got {type(v).__name__}") from None


def _ints(fn: str, what: str, seq: object) -> Tuple[int, ...]:
    if type(seq) is tuple and all(type(v) is int for v in seq):
        return seq  # the common case, checked cheaply
    if not isinstance(seq, (tuple, list)):
        raise TypeError(f"{fn}: {what} must be a tuple or list of ints, got {type(seq).__name__}")
    return tuple(_int(fn, what, v) for v in seq)


def _float(fn: str, what: str, v: Any) -> float:
    if isinstance(v, (str, bytes, complex, np.complexfloating)) or not hasattr(v, "__float__"):
        raise TypeError(f"{fn}: {what} must be a float, got {type(v).__name__}")
    return float(v)


def _buf(fn: str, what: str, a: object) -> "Array":
    if not isinstance(a, Array):
        raise TypeError(f"{fn}: {what} must be an Array of this module, got {type(a).__name__}")
    return a


def _op(fn: str, op: object, table: Sequence[object]) -> int:
    op = _int(fn, "op", op)
    if not 0 <= op < len(table):
        raise ValueError(f"{fn}: unknown op code {op} (valid: 0..{len(table) - 1})")
    return op


def _shape_size(fn: str, shape: Tuple[int, ...]) -> int:
    size = 1
    for n in shape:
        if n < 0:
            raise ValueError(f"{fn}: negative dimension in shape {shape}")
        size *= n
    if size > MAX_ELEMENTS:
        raise ValueError(f"{fn}: shape {shape} has too many elements")
    return size


def _check_view(fn: str, buf: Array, shape: Shape, strides: Shape, offset: int) -> int:
    """The number of elements of the view; ValueError if it reaches outside ``buf``."""
    shape, strides = _ints(fn, "shape", shape), _ints(fn, "strides", strides)
    if type(offset) is not int:
        offset = _int(fn, "offset", offset)
    if len(shape) != len(strides):
        raise ValueError(f"{fn}: shape {shape} and strides {strides} differ in length")
    size = _shape_size(fn, shape)
    if size:
        lo = hi = offset
        for n, s in zip(shape, strides):
            if s < 0:
                lo += (n - 1) * s
            else:
                hi += (n - 1) * s
        if lo < 0 or hi >= buf.size:
            raise ValueError(
                f"{fn}: view with shape {shape}, strides {strides} and offset "
                f"{offset} reaches elements [{lo}, {hi}], outside the buffer of "
                f"{buf.size} elements"
            )
    return size


def _check_out(fn: str, out: Array, size: int) -> None:
    if out.size != size:
        raise ValueError(f"{fn}: out has {out.size} elements, expected {size}")


def _check_sizes(fn: str, out: Array, *inputs: Array) -> None:
    for a in (out,) + inputs:
        _buf(fn, "buffer", a)
    if any(a.size != out.size for a in inputs):
        sizes = " and ".join(str(a.size) for a in inputs)
        raise ValueError(
            f"{fn}: input{'s' if len(inputs) > 1 else ''} of {sizes} elements but "
            f"out has {out.size}"
        )


def _view(a: Array, shape: Shape, strides: Shape, offset: int) -> np.ndarray:
    """The numpy view of a non-empty, checked view (negative strides reach below ``offset``)."""
    view: np.ndarray = np.ndarray(
        tuple(shape),
        np.float32,
        a.array,
        offset * _datetype_size,
        tuple(s * _datetype_size for s in strides),
    )
    return view


# ---- memory (course) --------------------------------------------------------------------------
def to_numpy(a: Array, shape: Shape, strides: Shape, offset: int) -> np.ndarray:
    """A copy of the strided view (shape, strides in elements, offset) of ``a``."""
    _buf("to_numpy", "a", a)
    if not _check_view("to_numpy", a, shape, strides, offset):
        return np.zeros(tuple(shape), dtype=np.float32)
    copy: np.ndarray = _view(a, shape, strides, offset).copy()
    return copy


def from_numpy(a: np.ndarray, out: Array) -> None:
    """Copy the numpy array ``a`` (any shape, row-major order) into ``out``."""
    _buf("from_numpy", "out", out)
    if not isinstance(a, np.ndarray):
        raise TypeError(f"from_numpy: a must be a numpy array, got {type(a).__name__}")
    if a.size != out.size:
        raise ValueError(f"from_numpy: numpy array has {a.size} elements but out has {out.size}")
    out.array[:] = a.ravel()


def fill(out: Array, val: float) -> None:
    """Set every element of ``out`` to ``val``."""
    _buf("fill", "out", out).array.fill(_float("fill", "val", val))


def compact(a: Array, out: Array, shape: Shape, strides: Shape, offset: int) -> None:
    """Write the strided view of ``a`` into ``out`` in row-major order."""
    _buf("compact", "a", a), _buf("compact", "out", out)
    size = _check_view("compact", a, shape, strides, offset)
    _check_out("compact", out, size)
    if size:
        out.array[:] = _view(a, shape, strides, offset).ravel()


def ewise_setitem(a: Array, out: Array, shape: Shape, strides: Shape, offset: int) -> None:
    """Write compact ``a`` into the strided view of ``out``."""
    _buf("ewise_setitem", "a", a), _buf("ewise_setitem", "out", out)
    size = _check_view("ewise_setitem", out, shape, strides, offset)
    if size != a.size:
        raise ValueError(
            f"ewise_setitem: shape {tuple(shape)} has {size} elements but the source has {a.size}"
        )
    if size:
        _view(out, shape, strides, offset)[...] = a.array.reshape(tuple(shape))


def scalar_setitem(
    size: int, val: float, out: Array, shape: Shape, strides: Shape, offset: int
) -> None:
    """Set every element of the strided view of ``out`` (``size`` elements) to ``val``."""
    size = _int("scalar_setitem", "size", size)
    val = _float("scalar_setitem", "val", val)
    _buf("scalar_setitem", "out", out)
    view_size = _check_view("scalar_setitem", out, shape, strides, offset)
    if view_size != size:
        raise ValueError(
            f"scalar_setitem: size {size} does not match shape {tuple(shape)} "
            f"({view_size} elements)"
        )
    if size:
        _view(out, shape, strides, offset)[...] = val


# ---- element-wise on strided operands ---------------------------------------------------------
def ewise_binary(
    op: int,
    a: Array,
    a_strides: Shape,
    a_offset: int,
    b: Array,
    b_strides: Shape,
    b_offset: int,
    out: Array,
    shape: Shape,
) -> None:
    """``out`` (compact, prod(shape)) = BINARY_OPS[op](view of a, view of b)."""
    fn = "ewise_binary"
    op = _op(fn, op, _BINARY_FUNCS)
    _buf(fn, "a", a), _buf(fn, "b", b), _buf(fn, "out", out)
    size = _check_view(fn, a, shape, a_strides, a_offset)
    _check_view(fn, b, shape, b_strides, b_offset)
    _check_out(fn, out, size)
    if size:
        with np.errstate(all="ignore"):
            _BINARY_FUNCS[op](
                _view(a, shape, a_strides, a_offset),
                _view(b, shape, b_strides, b_offset),
                out=out.array.reshape(tuple(shape)),
            )


def ewise_scalar(
    op: int,
    a: Array,
    a_strides: Shape,
    a_offset: int,
    val: float,
    out: Array,
    shape: Shape,
    reverse: bool,
) -> None:
    """``out`` = BINARY_OPS[op](view of a, val), or (val, view of a) when ``reverse``."""
    fn = "ewise_scalar"
    op = _op(fn, op, _BINARY_FUNCS)
    value = np.float32(_float(fn, "val", val))
    _buf(fn, "a", a), _buf(fn, "out", out)
    size = _check_view(fn, a, shape, a_strides, a_offset)
    _check_out(fn, out, size)
    if size:
        x = _view(a, shape, a_strides, a_offset)
        o = out.array.reshape(tuple(shape))
        with np.errstate(all="ignore"):
            if reverse:
                _BINARY_FUNCS[op](value, x, out=o)
            elif op == _POWER:
                # numpy's `**` (not the ufunc): a square for 2, a sqrt for 0.5 ..., as
                # scalar_power and the compiled modules do; on a strided view, np.power in
                # numpy 2.2 (what Python 3.10 gets) calls powf instead, one ulp away.
                o[...] = x**value
            else:
                _BINARY_FUNCS[op](x, value, out=o)


def ewise_unary(
    op: int, a: Array, a_strides: Shape, a_offset: int, out: Array, shape: Shape
) -> None:
    """``out`` = UNARY_OPS[op](view of a)."""
    fn = "ewise_unary"
    op = _op(fn, op, _UNARY_FUNCS)
    _buf(fn, "a", a), _buf(fn, "out", out)
    size = _check_view(fn, a, shape, a_strides, a_offset)
    _check_out(fn, out, size)
    if size:
        with np.errstate(all="ignore"):
            _UNARY_FUNCS[op](
                _view(a, shape, a_strides, a_offset), out=out.array.reshape(tuple(shape))
            )


# ---- reductions -------------------------------------------------------------------------------
def reduce(
    op: int, a: Array, shape: Shape, strides: Shape, offset: int, keep: int, out: Array
) -> None:
    """``out`` (prod(shape[:keep])) = REDUCE_OPS[op] over the axes ``shape[keep:]`` of the view."""
    fn = "reduce"
    op = _op(fn, op, _REDUCE_FUNCS)
    _buf(fn, "a", a), _buf(fn, "out", out)
    _check_view(fn, a, shape, strides, offset)
    shape = tuple(shape)
    keep = _int(fn, "keep", keep)
    if not 0 <= keep <= len(shape):
        raise ValueError(f"{fn}: keep {keep} is outside [0, {len(shape)}] for shape {shape}")
    kept = _shape_size(fn, shape[:keep])
    _check_out(fn, out, kept)
    if not kept:
        return
    func, identity = _REDUCE_FUNCS[op]
    if _shape_size(fn, shape[keep:]) == 0:
        if identity is None:
            raise ValueError(
                f"{fn}: {__reduce_ops__[op]} over an empty extent {shape[keep:]} has no identity"
            )
        out.array.fill(identity)
        return
    with np.errstate(all="ignore"):
        out.array[:] = func(
            _view(a, shape, strides, offset), axis=tuple(range(keep, len(shape)))
        ).ravel()


# ---- matrix products --------------------------------------------------------------------------
def matmul_strided(
    a: Array,
    a_strides: Shape,
    a_offset: int,
    b: Array,
    b_strides: Shape,
    b_offset: int,
    out: Array,
    batch: Union[int, Shape],
    m: int,
    n: int,
    p: int,
) -> None:
    """``out`` (compact, batch + (m, p)) = A[k] @ B[k] over strided batch + (m, n) and
    batch + (n, p) views; ``batch`` is an int or a tuple of batch dimensions, and each operand
    has one stride per batch dimension, then row and column."""
    fn = "matmul_strided"
    dims = (batch,) if isinstance(batch, (int, np.integer)) else _ints(fn, "batch", batch)
    dims = tuple(_int(fn, "batch", d) for d in dims)
    m, n, p = (_int(fn, w, v) for w, v in zip("mnp", (m, n, p)))
    if min(dims + (m, n, p)) < 0:
        raise ValueError(f"{fn}: negative size in batch={dims}, m={m}, n={n}, p={p}")
    _buf(fn, "a", a), _buf(fn, "b", b), _buf(fn, "out", out)
    for what, strides in (("a_strides", a_strides), ("b_strides", b_strides)):
        if len(_ints(fn, what, strides)) != len(dims) + 2:
            raise ValueError(
                f"{fn}: {what} must hold {len(dims) + 2} strides (one per batch dimension, then "
                f"row and column), got {tuple(strides)}"
            )
    _check_view(fn, a, dims + (m, n), a_strides, a_offset)
    _check_view(fn, b, dims + (n, p), b_strides, b_offset)
    size = _shape_size(fn, dims + (m, p))
    _check_out(fn, out, size)
    if size:
        if n == 0:
            out.array.fill(0.0)
            return
        out.array.reshape(dims + (m, p))[...] = np.matmul(
            _view(a, dims + (m, n), a_strides, a_offset),
            _view(b, dims + (n, p), b_strides, b_offset),
        )


# ---- element-wise on compact operands (course) ------------------------------------------------
def ewise_add(a: Array, b: Array, out: Array) -> None:
    _check_sizes("ewise_add", out, a, b)
    out.array[:] = a.array + b.array


def scalar_add(a: Array, val: float, out: Array) -> None:
    _check_sizes("scalar_add", out, a)
    out.array[:] = a.array + np.float32(_float("scalar_add", "val", val))


def ewise_mul(a: Array, b: Array, out: Array) -> None:
    _check_sizes("ewise_mul", out, a, b)
    out.array[:] = a.array * b.array


def scalar_mul(a: Array, val: float, out: Array) -> None:
    _check_sizes("scalar_mul", out, a)
    out.array[:] = a.array * np.float32(_float("scalar_mul", "val", val))


def ewise_div(a: Array, b: Array, out: Array) -> None:
    _check_sizes("ewise_div", out, a, b)
    with np.errstate(all="ignore"):
        out.array[:] = a.array / b.array


def scalar_div(a: Array, val: float, out: Array) -> None:
    _check_sizes("scalar_div", out, a)
    with np.errstate(all="ignore"):
        out.array[:] = a.array / np.float32(_float("scalar_div", "val", val))


def scalar_power(a: Array, val: float, out: Array) -> None:
    _check_sizes("scalar_power", out, a)
    with np.errstate(all="ignore"):
        out.array[:] = a.array ** np.float32(_float("scalar_power", "val", val))


def ewise_maximum(a: Array, b: Array, out: Array) -> None:
    _check_sizes("ewise_maximum", out, a, b)
    out.array[:] = np.maximum(a.array, b.array)


def scalar_maximum(a: Array, val: float, out: Array) -> None:
    _check_sizes("scalar_maximum", out, a)
    out.array[:] = np.maximum(a.array, np.float32(_float("scalar_maximum", "val", val)))


def ewise_eq(a: Array, b: Array, out: Array) -> None:
    _check_sizes("ewise_eq", out, a, b)
    out.array[:] = a.array == b.array


def scalar_eq(a: Array, val: float, out: Array) -> None:
    _check_sizes("scalar_eq", out, a)
    out.array[:] = a.array == np.float32(_float("scalar_eq", "val", val))


def ewise_ge(a: Array, b: Array, out: Array) -> None:
    _check_sizes("ewise_ge", out, a, b)
    out.array[:] = a.array >= b.array


def scalar_ge(a: Array, val: float, out: Array) -> None:
    _check_sizes("scalar_ge", out, a)
    out.array[:] = a.array >= np.float32(_float("scalar_ge", "val", val))


def ewise_log(a: Array, out: Array) -> None:
    _check_sizes("ewise_log", out, a)
    with np.errstate(all="ignore"):
        out.array[:] = np.log(a.array)


def ewise_exp(a: Array, out: Array) -> None:
    _check_sizes("ewise_exp", out, a)
    with np.errstate(all="ignore"):
        out.array[:] = np.exp(a.array)


def ewise_tanh(a: Array, out: Array) -> None:
    _check_sizes("ewise_tanh", out, a)
    out.array[:] = np.tanh(a.array)


def matmul(a: Array, b: Array, out: Array, m: int, n: int, p: int) -> None:
    """out (m, p) = a (m, n) @ b (n, p), all compact."""
    m, n, p = (_int("matmul", w, v) for w, v in zip("mnp", (m, n, p)))
    if min(m, n, p) < 0:
        raise ValueError(f"matmul: negative size in m={m}, n={n}, p={p}")
    for what, buf, count in (("a", a, m * n), ("b", b, n * p), ("out", out, m * p)):
        _buf("matmul", what, buf)
        if count > buf.size:
            raise ValueError(
                f"matmul: {what} needs {count} elements for m={m}, n={n}, p={p} but has {buf.size}"
            )
    product = a.array[: m * n].reshape(m, n) @ b.array[: n * p].reshape(n, p)
    out.array[: m * p] = product.reshape(-1)


def _check_reduce(fn: str, a: Array, out: Array, reduce_size: int) -> int:
    _buf(fn, "a", a), _buf(fn, "out", out)
    reduce_size = _int(fn, "reduce_size", reduce_size)
    if reduce_size <= 0:
        raise ValueError(f"{fn}: reduce_size must be positive, got {reduce_size}")
    if out.size * reduce_size > a.size:
        raise ValueError(
            f"{fn}: out has {out.size} elements, reducing {reduce_size} each needs "
            f"{out.size * reduce_size} but a has {a.size}"
        )
    return reduce_size


def reduce_max(a: Array, out: Array, reduce_size: int) -> None:
    """Max over consecutive blocks of ``reduce_size`` elements of compact ``a``."""
    reduce_size = _check_reduce("reduce_max", a, out, reduce_size)
    out.array[:] = a.array[: out.array.size * reduce_size].reshape(-1, reduce_size).max(axis=1)


def reduce_sum(a: Array, out: Array, reduce_size: int) -> None:
    """Sum over consecutive blocks of ``reduce_size`` elements of compact ``a``."""
    reduce_size = _check_reduce("reduce_sum", a, out, reduce_size)
    out.array[:] = a.array[: out.array.size * reduce_size].reshape(-1, reduce_size).sum(axis=1)


# ---- fused kernels (protocol.py's last section) -----------------------------------------------
def _fused(spec: fused_spec.FusedKernel, kernel: Callable[..., Any]) -> Callable[..., None]:
    """The device function of the fused kernel ``spec``: arguments (inputs..., sizes...,
    scalars..., outputs...) as in ``protocol.py``; checks kinds, then every buffer's size
    against ``spec`` (``fused_spec.FusedKernel.check_buffers``), runs the numpy ``kernel`` on
    views of the inputs and writes its results into the outputs (an in-place update, with no
    outputs, updates its input buffers)."""
    fn = spec.name or spec.api_name  # every kernel given here has a device function
    n_in, n_dims, n_scalars = len(spec.inputs), len(spec.dims), len(spec.scalars)
    names = [op.name for op in spec.inputs + spec.outputs]

    def device_function(*args: Any) -> None:
        if len(args) != n_in + n_dims + n_scalars + len(spec.outputs):
            raise TypeError(
                f"{fn}: expected {n_in + n_dims + n_scalars + len(spec.outputs)} "
                f"arguments, got {len(args)}"
            )
        buffers = args[:n_in] + args[n_in + n_dims + n_scalars :]
        for name, buf in zip(names, buffers):
            _buf(fn, name, buf)
        dims = tuple(_int(fn, d, v) for d, v in zip(spec.dims, args[n_in : n_in + n_dims]))
        scalars = [
            _float(fn, s, v)
            for s, v in zip(spec.scalars, args[n_in + n_dims : n_in + n_dims + n_scalars])
        ]
        dims = spec.check_buffers(dict(zip(names, buffers)), dims, dict(zip(spec.scalars, scalars)))
        inputs = [
            buf.array.reshape(() if op.shared(buf.size) else op.shape(*dims))
            for op, buf in zip(spec.inputs, buffers)
        ]
        results = kernel(*inputs, *dims[len(dims) - len(spec.given) :], *scalars)
        if spec.outputs:
            results = results if isinstance(results, tuple) else (results,)
            for buf, value in zip(buffers[n_in:], results):
                buf.array[:] = np.ravel(value)

    device_function.__name__ = device_function.__qualname__ = fn
    device_function.__doc__ = f"See ``protocol.DeviceModule.{fn}``."
    return device_function


softmax_xent = _fused(fused_spec.SOFTMAX_XENT, kernels.softmax_xent)
softmax_xent_bwd = _fused(fused_spec.SOFTMAX_XENT_BWD, kernels.softmax_xent_bwd)
softmax_fwd = _fused(fused_spec.SOFTMAX_FWD, kernels.softmax_fwd)
softmax_bwd = _fused(fused_spec.SOFTMAX_BWD, kernels.softmax_bwd)
attention_fwd = _fused(fused_spec.ATTENTION_FWD, kernels.attention_fwd)
attention_bwd = _fused(fused_spec.ATTENTION_BWD, kernels.attention_bwd)
layernorm_fwd = _fused(fused_spec.LAYERNORM_FWD, kernels.layernorm_fwd)
layernorm_bwd = _fused(fused_spec.LAYERNORM_BWD, kernels.layernorm_bwd)
batchnorm_fwd = _fused(fused_spec.BATCHNORM_FWD, kernels.batchnorm_fwd)
batchnorm_bwd = _fused(fused_spec.BATCHNORM_BWD, kernels.batchnorm_bwd)
lstm_cell_fwd = _fused(fused_spec.LSTM_CELL_FWD, kernels.lstm_cell_fwd)
lstm_cell_bwd = _fused(fused_spec.LSTM_CELL_BWD, kernels.lstm_cell_bwd)
lstm_layer_fwd = _fused(fused_spec.LSTM_LAYER_FWD, kernels.lstm_layer_fwd)
lstm_layer_bwd = _fused(fused_spec.LSTM_LAYER_BWD, kernels.lstm_layer_bwd)
sgd_update = _fused(fused_spec.SGD_UPDATE, kernels.sgd_update)
adam_update = _fused(fused_spec.ADAM_UPDATE, kernels.adam_update)
embedding_gather = _fused(fused_spec.EMBEDDING_GATHER, kernels.embedding_gather)
embedding_scatter_add = _fused(fused_spec.EMBEDDING_SCATTER_ADD, kernels.embedding_scatter_add)
conv_fwd = _fused(fused_spec.CONV_FWD, kernels.conv_fwd)
conv_input_grad = _fused(fused_spec.CONV_INPUT_GRAD, kernels.conv_input_grad)
conv_weight_grad = _fused(fused_spec.CONV_WEIGHT_GRAD, kernels.conv_weight_grad)
