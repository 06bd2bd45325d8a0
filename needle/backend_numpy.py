"""The ``NEEDLE_BACKEND=np`` array API: numpy arrays that speak NDArray's method names.

Autograd and the ops call one array API, the one of :mod:`needle.backend_ndarray`. Under this
backend a tensor's ``cached_data`` is an :class:`NDArray` here: a ``numpy.ndarray`` subclass
(so it is still a numpy array for course code and users) that adds NDArray's methods
(``compact``, ``permute``, ``broadcast_to``, ``flip``, ``pad``, ``as_strided``, ``device``,
``numpy``, and a method for every op of ``protocol.OP_METHODS``: ``maximum``/``minimum``,
``log``/``exp``/``tanh``/``sqrt``/``abs``/``sigmoid``/``relu``/``neg``, computed by the numpy
kernels of ``needle.backend_ndarray.numpy_kernels``) and returns arrays, never numpy scalars,
from ``sum``/``max``. This module also exposes the module functions of
``needle.backend_ndarray`` (``array``, ``empty``, ``full``, ``maximum``, ``log``, ``exp``,
``tanh``, ``sum``, ``flip``, ``broadcast_to``, ``reshape``, ...), the fused kernels
(``softmax_xent``, ``layernorm_fwd``, ..., checked against ``fused_spec.py``) and the devices:
only ``cpu()`` computes; ``cpu_numpy()`` is the same device, and ``cuda()`` exists so code that
names it imports, but it is never enabled and refuses to allocate.

It imports the numpy kernels and the fused specification, never the NDArray layer or the
compiled device modules (``needle.backend_ndarray`` loads those lazily).

Unlike the NDArray backend, arrays keep numpy's dtype (``dtype=None`` keeps the input's, as in
the course), and comparisons return numpy booleans.
"""

from __future__ import annotations

import builtins
import math
from typing import Optional, Sequence, cast

import numpy

from .backend_ndarray import fused_spec as spec
from .backend_ndarray import numpy_kernels as kernels
from .backend_ndarray.protocol import OP_METHODS, module_functions


class Device:
    """Base class of the numpy backend's devices."""

    name = "device"

    def __repr__(self) -> str:
        return f"{self.name}()"

    def __hash__(self) -> int:
        return hash(repr(self))

    def __eq__(self, other) -> bool:
        return isinstance(other, Device) and other.name == self.name

    def enabled(self) -> bool:
        return False


class NDArray(numpy.ndarray):
    """A numpy array with NDArray's methods (see the module docstring). Views stay NDArrays."""

    @property
    def device(self) -> "CPUDevice":  # type: ignore[override]  # numpy's is the string "cpu"
        """Always ``cpu()``: numpy arrays live on the host."""
        return _CPU

    def numpy(self) -> numpy.ndarray:
        """A plain ``numpy.ndarray`` copy."""
        return numpy.array(self)

    def compact(self) -> "NDArray":
        """Self when C-contiguous, else a C-contiguous copy."""
        return self if self.flags.c_contiguous else self.copy(order="C")

    def permute(self, new_axes: Sequence[int]) -> "NDArray":
        """A view with the axes reordered (``numpy.transpose``)."""
        return self.transpose(tuple(new_axes))

    def broadcast_to(self, new_shape: Sequence[int]) -> "NDArray":
        """A read-only stride-0 view of ``new_shape`` (numpy's broadcasting rules)."""
        return cast(NDArray, numpy.broadcast_to(self, tuple(new_shape), subok=True))

    def as_strided(self, shape: Sequence[int], strides: Sequence[int]) -> "NDArray":
        """A read-only view with ``shape`` and ``strides`` counted in elements.

        ValueError when an element would fall outside this (compact) array's buffer.
        """
        shape, strides = tuple(shape), tuple(strides)
        if len(shape) != len(strides) or any(s < 0 for s in strides):
            raise ValueError(f"as_strided: bad shape {shape} / strides {strides}")
        base = self.compact()
        if (
            math.prod(shape) > 0
            and builtins.sum((n - 1) * s for n, s in zip(shape, strides)) >= base.size
        ):
            raise ValueError(
                f"as_strided: shape {shape} with strides {strides} leaves the buffer "
                f"of {base.size} elements"
            )
        # subok=True keeps the subclass (numpy's stubs say ndarray; so in the casts around here)
        return cast(
            NDArray,
            numpy.lib.stride_tricks.as_strided(
                base, shape, tuple(s * base.itemsize for s in strides), subok=True, writeable=False
            ),
        )

    def flip(self, axes) -> "NDArray":
        """A compact copy reversed along ``axes`` (an int or a tuple; None: every axis)."""
        return cast(NDArray, numpy.flip(self, axes).copy())

    def pad(self, axes) -> "NDArray":
        """Zero padding: ``axes`` holds one (before, after) pair per dimension."""
        axes = tuple(tuple(int(v) for v in a) for a in axes)
        if len(axes) != self.ndim or any(len(a) != 2 or min(a) < 0 for a in axes):
            raise ValueError(
                f"pad needs one non-negative (before, after) pair per dimension of "
                f"shape {self.shape}, got {axes}"
            )
        return numpy.pad(self, axes).view(NDArray)

    # sum and max have NDArray's signature, not numpy's (an override mypy flags): always an array
    def sum(  # type: ignore[override]
        self, axis=None, keepdims: bool = False, **kwargs
    ) -> "NDArray":
        """Sum over ``axis`` (None, an int or a tuple); always an array (0-d for a full sum)."""
        out = numpy.ndarray.sum(self, axis=axis, keepdims=keepdims, **kwargs)
        return out if isinstance(out, NDArray) else numpy.asarray(out).view(NDArray)

    def max(  # type: ignore[override]
        self, axis=None, keepdims: bool = False, **kwargs
    ) -> "NDArray":
        """Maximum over ``axis`` (ValueError over an empty axis); always an array."""
        out = numpy.ndarray.max(self, axis=axis, keepdims=keepdims, **kwargs)
        return out if isinstance(out, NDArray) else numpy.asarray(out).view(NDArray)


def _kernel_method(name: str, kernel):
    def method(self: NDArray, *args) -> NDArray:
        return kernel(self, *args)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"``{name}``, element-wise (``numpy_kernels``), with numpy's broadcasting."
    return method


# The op methods numpy.ndarray lacks (maximum, neg, abs, exp, relu, ...), from the kernel tables;
# the operators (+, <, -a, ...) and the reductions are numpy's own (sum/max are wrapped above).
for _op, _methods in OP_METHODS.items():
    _kernel = kernels.BINARY.get(_op) or kernels.UNARY.get(_op)
    for _name in _methods:
        if not hasattr(NDArray, _name):
            setattr(NDArray, _name, _kernel_method(_name, _kernel))


def _as_ndarray(a) -> NDArray:
    return a if type(a) is NDArray else numpy.asarray(a).view(NDArray)


class CPUDevice(Device):
    """numpy on the host: every array is an :class:`NDArray` (a ``numpy.ndarray``)."""

    name = "cpu"

    def enabled(self) -> bool:
        return True

    def zeros(self, *shape, dtype: str = "float32") -> NDArray:
        return numpy.zeros(shape, dtype=dtype).view(NDArray)

    def ones(self, *shape, dtype: str = "float32") -> NDArray:
        return numpy.ones(shape, dtype=dtype).view(NDArray)

    def randn(self, *shape, dtype: str = "float32") -> NDArray:
        return numpy.random.randn(*shape).astype(dtype).view(NDArray)

    def rand(self, *shape, dtype: str = "float32") -> NDArray:
        return numpy.random.rand(*shape).astype(dtype).view(NDArray)

    def one_hot(self, n: int, i, dtype: str = "float32") -> NDArray:
        return numpy.eye(n, dtype=dtype)[numpy.asarray(i, dtype=numpy.int64)].view(NDArray)

    def empty(self, shape, dtype: str = "float32") -> NDArray:
        return numpy.empty(shape, dtype=dtype).view(NDArray)

    def full(self, shape, fill_value, dtype: str = "float32") -> NDArray:
        return numpy.full(shape, fill_value, dtype=dtype).view(NDArray)


class UnavailableDevice(Device):
    """A device the numpy backend cannot use (``cuda()``); ``enabled()`` is False."""

    def __init__(self, name: str):
        self.name = name

    def __getattr__(self, attr):
        raise RuntimeError(f"{self.name}() is not available with NEEDLE_BACKEND=np; use cpu()")


_CPU = CPUDevice()


def cpu() -> CPUDevice:
    """The host device (numpy arrays)."""
    return _CPU


def cpu_numpy() -> CPUDevice:
    """Same as :func:`cpu` under the numpy backend."""
    return _CPU


def cuda() -> UnavailableDevice:
    """A placeholder: the numpy backend has no GPU device."""
    return UnavailableDevice("cuda")


def default_device() -> CPUDevice:
    """The default device: ``cpu()``."""
    return _CPU


def default_tensor_device() -> CPUDevice:
    """The device ``Tensor`` and ``init`` use when none is given: ``cpu()``."""
    return _CPU


def all_devices() -> list:
    """Every device this backend knows: only ``cpu()``."""
    return [_CPU]


def _device(device) -> CPUDevice:
    if device is None or device == _CPU:
        return _CPU
    raise ValueError(f"device {device} is not available with NEEDLE_BACKEND=np: use cpu()")


# ---- module functions: the array API of needle.backend_ndarray ------------------------------
def array(a, dtype=None, device=None) -> NDArray:
    """A copy of ``a`` (array, nested list, number) as an :class:`NDArray` on ``cpu()``.

    ``dtype=None`` keeps numpy's dtype (the course's numpy backend does the same); data that
    is not numeric (strings, objects, complex numbers) is a TypeError.
    """
    _device(device)
    out = numpy.array(a, dtype=dtype)
    if out.dtype.kind not in "biuf":
        raise TypeError(f"cannot make a numeric array from {type(a).__name__} (dtype {out.dtype})")
    return out.view(NDArray)


def empty(shape, dtype="float32", device=None) -> NDArray:
    """An uninitialised array of ``shape``."""
    return _device(device).empty(tuple(shape), dtype)


def full(shape, fill_value, dtype="float32", device=None) -> NDArray:
    """An array of ``shape`` filled with ``fill_value``."""
    return _device(device).full(tuple(shape), fill_value, dtype)


def broadcast_to(a: NDArray, new_shape) -> NDArray:
    """``a`` broadcast to ``new_shape`` (a read-only view)."""
    return _as_ndarray(a).broadcast_to(new_shape)


def reshape(a: NDArray, new_shape) -> NDArray:
    """``a`` with ``new_shape`` (same number of elements)."""
    return _as_ndarray(a).reshape(new_shape)


def permute(a: NDArray, new_axes) -> NDArray:
    """``a`` with its axes reordered (a view)."""
    return _as_ndarray(a).permute(new_axes)


# maximum, minimum, neg, abs, sqrt, exp, log, tanh, sigmoid, relu, sum, max: f(a, ...) = a.f(...)
globals().update(module_functions(NDArray, _as_ndarray))


def matmul(a: NDArray, b: NDArray) -> NDArray:
    """Batched, broadcasting matrix product (numpy's ``@``)."""
    return cast(NDArray, _as_ndarray(a) @ b)


def flip(a: NDArray, axes) -> NDArray:
    """A copy of ``a`` reversed along ``axes``."""
    return _as_ndarray(a).flip(axes)


def pad(a: NDArray, axes) -> NDArray:
    """``a`` zero-padded by one (before, after) pair per dimension."""
    return _as_ndarray(a).pad(axes)


def prod(x) -> int:
    """Product of the integers in ``x`` (1 for an empty sequence)."""
    return math.prod(x)


# ---- fused kernels: checked against fused_spec, computed by numpy_kernels ------------------------
def _check(kernel: spec.FusedKernel, arrays: tuple, given: tuple = (), **scalars) -> tuple:
    """The kernel's sizes, after checking that each of ``arrays`` (its inputs, in order) is a
    numpy array (TypeError) and that their shapes and the ``given`` sizes fit ``kernel``
    (ValueError)."""
    for op, a in zip(kernel.inputs, arrays):
        if not isinstance(a, numpy.ndarray):
            raise TypeError(
                f"{kernel.api_name}: {op.name} must be a numpy array, got {type(a).__name__}"
            )
    return kernel.check([a.shape for a in arrays], scalars, given)


def _run(kernel: spec.FusedKernel, compute, arrays: tuple, *scalars, given: tuple = ()):
    """``compute`` (a numpy kernel) on ``arrays`` reshaped to the shapes ``kernel`` gives them
    (a (1, C) bias becomes (C,)) and the ``given`` sizes, its results viewed as the first
    array's class."""
    dims = _check(kernel, arrays, given, **dict(zip(kernel.scalars, scalars)))
    inputs = [
        a if op.match in ("source", "shape or ()") else a.reshape(op.shape(*dims))
        for op, a in zip(kernel.inputs, arrays)
    ]
    out = compute(*inputs, *dims[len(dims) - len(given) :], *scalars)
    cls = type(arrays[0])
    if isinstance(out, tuple):
        return tuple(numpy.asarray(o).view(cls) for o in out)
    return numpy.asarray(out).view(cls)


def softmax_xent(logits: numpy.ndarray, labels: numpy.ndarray) -> tuple:
    """Cross-entropy per row of ``logits`` (N, C) against integer-valued ``labels`` (N,):
    ``(loss (N,), probs (N, C))``; ValueError for a label that is not a whole number in [0, C)."""
    return _run(spec.SOFTMAX_XENT, kernels.softmax_xent, (logits, labels))


def softmax_xent_bwd(
    probs: numpy.ndarray,
    labels: numpy.ndarray,
    dloss: numpy.ndarray,
    scale: float = 1.0,
    out: Optional[numpy.ndarray] = None,
) -> numpy.ndarray:
    """``(probs - one_hot(labels)) * dloss[:, None] * scale``: the logits' gradient, shape
    (N, C); ``dloss`` (N,) or () is the adjoint of the per-row losses. With ``out`` (an (N, C)
    float32 array, which may be ``probs`` itself) the gradient is written into it and returned
    (see ``needle.backend_ndarray.fused.softmax_xent_bwd``)."""
    grad = _run(spec.SOFTMAX_XENT_BWD, kernels.softmax_xent_bwd, (probs, labels, dloss), scale)
    if out is None:
        return grad
    if not isinstance(out, numpy.ndarray):
        raise TypeError(f"softmax_xent_bwd: out must be a numpy array, got {type(out).__name__}")
    if out.shape != grad.shape or out.dtype != grad.dtype:
        raise ValueError(
            f"softmax_xent_bwd: out must be a {grad.dtype} array of shape {grad.shape}, "
            f"got {out.dtype} {out.shape}"
        )
    out[...] = grad
    return out


def softmax_fwd(x: numpy.ndarray, scale: float = 1.0, queries: int = 0) -> numpy.ndarray:
    """Softmax of each row of ``scale * x`` (R, C), causal over blocks of ``queries`` rows when
    it is > 0 (see ``needle.backend_ndarray.fused.softmax_fwd``)."""
    return _run(spec.SOFTMAX_FWD, kernels.softmax_fwd, (x,), scale, queries)


def softmax_bwd(y: numpy.ndarray, dy: numpy.ndarray, scale: float = 1.0) -> numpy.ndarray:
    """``scale * y * (dy - Σ_row dy * y)``: the gradient of :func:`softmax_fwd`, (R, C)."""
    return _run(spec.SOFTMAX_BWD, kernels.softmax_bwd, (y, dy), scale)


def attention_fwd(
    q: numpy.ndarray, k: numpy.ndarray, v: numpy.ndarray, scale: float = 1.0, causal: bool = False
) -> tuple:
    """Attention per head: ``(out (H, Tq, D), probs (H, Tq, Tk))`` for q (H, Tq, D), k and v
    (H, Tk, D) (see ``needle.backend_ndarray.fused.attention_fwd``)."""
    given = (spec.attention_keys("attention_fwd", k),)
    return _run(
        spec.ATTENTION_FWD, kernels.attention_fwd, (q, k, v), scale, int(causal), given=given
    )


def attention_bwd(d_out, d_probs, probs, q, k, v, scale: float = 1.0) -> tuple:
    """``(dq, dk, dv)``, the gradients of :func:`attention_fwd` given the adjoints of out and
    probs and its saved probs."""
    given = (spec.attention_keys("attention_bwd", k),)
    arrays = (d_out, d_probs, probs, q, k, v)
    return _run(spec.ATTENTION_BWD, kernels.attention_bwd, arrays, scale, given=given)


def layernorm_fwd(x: numpy.ndarray, w: numpy.ndarray, b: numpy.ndarray, eps: float) -> tuple:
    """Layer norm of each row of ``x`` (R, C): ``(y, xhat, rstd (R,))`` (see fused.py)."""
    return _run(spec.LAYERNORM_FWD, kernels.layernorm_fwd, (x, w, b), eps)


def layernorm_bwd(
    dy: numpy.ndarray, xhat: numpy.ndarray, rstd: numpy.ndarray, w: numpy.ndarray
) -> tuple:
    """The exact gradients ``(dx (R, C), dw (C,), db (C,))`` of :func:`layernorm_fwd`."""
    return _run(spec.LAYERNORM_BWD, kernels.layernorm_bwd, (dy, xhat, rstd, w))


def batchnorm_fwd(x: numpy.ndarray, w: numpy.ndarray, b: numpy.ndarray, eps: float) -> tuple:
    """Batch norm of each column of ``x`` (N ≥ 1, C): ``(y, xhat, rstd, mean, var)``."""
    return _run(spec.BATCHNORM_FWD, kernels.batchnorm_fwd, (x, w, b), eps)


def batchnorm_bwd(
    dy: numpy.ndarray, xhat: numpy.ndarray, rstd: numpy.ndarray, w: numpy.ndarray
) -> tuple:
    """The exact gradients ``(dx (N, C), dw (C,), db (C,))`` of :func:`batchnorm_fwd`."""
    return _run(spec.BATCHNORM_BWD, kernels.batchnorm_bwd, (dy, xhat, rstd, w))


def lstm_cell_fwd(gates: numpy.ndarray, c_prev: numpy.ndarray) -> tuple:
    """One LSTM step: ``(h, c, act, tanh_c)`` from gates (B, 4H) and c_prev (B, H)."""
    return _run(spec.LSTM_CELL_FWD, kernels.lstm_cell_fwd, (gates, c_prev))


def lstm_cell_bwd(
    dh: numpy.ndarray,
    dc: numpy.ndarray,
    act: numpy.ndarray,
    c_prev: numpy.ndarray,
    tanh_c: numpy.ndarray,
) -> tuple:
    """The exact gradients ``(dgates (B, 4H), dc_prev (B, H))`` of :func:`lstm_cell_fwd`."""
    return _run(spec.LSTM_CELL_BWD, kernels.lstm_cell_bwd, (dh, dc, act, c_prev, tanh_c))


def lstm_layer_fwd(
    xw: numpy.ndarray, h0: numpy.ndarray, c0: numpy.ndarray, w_hh: numpy.ndarray, steps: int
) -> tuple:
    """An LSTM layer over ``steps`` steps: ``(out, h, c, act)`` (see fused.py)."""
    return _run(spec.LSTM_LAYER_FWD, kernels.lstm_layer_fwd, (xw, h0, c0, w_hh), given=(steps,))


def lstm_layer_bwd(
    d_out: numpy.ndarray,
    dh: numpy.ndarray,
    dc: numpy.ndarray,
    act: numpy.ndarray,
    out: numpy.ndarray,
    h0: numpy.ndarray,
    c0: numpy.ndarray,
    w_hh: numpy.ndarray,
    steps: int,
) -> tuple:
    """The exact gradients ``(dxw, dh0, dc0, dw_hh)`` of :func:`lstm_layer_fwd`."""
    arrays = (d_out, dh, dc, act, out, h0, c0, w_hh)
    return _run(spec.LSTM_LAYER_BWD, kernels.lstm_layer_bwd, arrays, given=(steps,))


def _writable(fn: str, param: numpy.ndarray) -> None:
    if not param.flags.writeable:
        raise ValueError(
            f"{fn}: param is a read-only array (a broadcast view?) and cannot be updated in place"
        )


def sgd_update_(
    param: numpy.ndarray,
    grad: numpy.ndarray,
    buf: numpy.ndarray,
    lr: float,
    momentum: float,
    weight_decay: float,
) -> None:
    """In place: g = grad + weight_decay·param; buf = momentum·buf + (1 - momentum)·g;
    param -= lr·buf. ``buf`` has param's shape (zeros before the first step; not read with
    momentum 0)."""
    _check(spec.SGD_UPDATE, (param, grad, buf))
    _writable("sgd_update_", param)
    kernels.sgd_update(param, grad, buf, float(lr), float(momentum), float(weight_decay))


def adam_update_(
    param: numpy.ndarray,
    grad: numpy.ndarray,
    m: numpy.ndarray,
    v: numpy.ndarray,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    step: int,
) -> None:
    """In place: one Adam step with bias corrections for ``step`` ≥ 1 (see fused.py)."""
    _check(spec.ADAM_UPDATE, (param, grad, m, v), step=step)
    _writable("adam_update_", param)
    kernels.adam_update(
        param,
        grad,
        m,
        v,
        float(lr),
        float(beta1),
        float(beta2),
        float(eps),
        float(weight_decay),
        int(step),
    )


def embedding_gather(weight: numpy.ndarray, ids: numpy.ndarray) -> numpy.ndarray:
    """The rows of ``weight`` (V, D) picked by the whole numbers ``ids`` (N,): (N, D);
    IndexError for an id outside [0, V)."""
    return _run(spec.EMBEDDING_GATHER, kernels.embedding_gather, (weight, ids))


def embedding_scatter_add(grad: numpy.ndarray, ids: numpy.ndarray, vocab: int) -> numpy.ndarray:
    """Zeros (vocab, D) with each row of ``grad`` (N, D) added to row ``ids[r]`` (repeats
    accumulate): the adjoint of :func:`embedding_gather`."""
    return _run(
        spec.EMBEDDING_SCATTER_ADD, kernels.embedding_scatter_add, (grad, ids), given=(vocab,)
    )


def _shape(kernel: spec.FusedKernel, name: str, a: object) -> tuple:
    """The shape of ``a``, the input ``name`` of ``kernel``: TypeError unless a numpy array."""
    if not isinstance(a, numpy.ndarray):
        raise TypeError(f"{kernel.api_name}: {name} must be a numpy array, got {type(a).__name__}")
    return a.shape


def conv_fwd(x: numpy.ndarray, weight: numpy.ndarray, stride: int, padding: int) -> numpy.ndarray:
    """The convolution of NHWC ``x`` (N, H, W, C_in) with ``weight`` (KH, KW, C_in, C_out) at
    ``stride``, zero-padded by ``padding``: (N, H_out, W_out, C_out) (see fused.py)."""
    given = spec.conv_fwd_given(_shape(spec.CONV_FWD, "weight", weight), stride, padding)
    return _run(spec.CONV_FWD, kernels.conv_fwd, (x, weight), given=given)


def conv_input_grad(
    grad: numpy.ndarray, weight: numpy.ndarray, in_hw: tuple, stride: int, padding: int
) -> numpy.ndarray:
    """The input adjoint (N, H, W, C_in), ``in_hw`` = (H, W), of :func:`conv_fwd`."""
    given = spec.conv_input_grad_given(
        _shape(spec.CONV_INPUT_GRAD, "grad", grad), in_hw, stride, padding
    )
    return _run(spec.CONV_INPUT_GRAD, kernels.conv_input_grad, (grad, weight), given=given)


def conv_weight_grad(
    x: numpy.ndarray, grad: numpy.ndarray, kernel: tuple, stride: int, padding: int
) -> numpy.ndarray:
    """The weight adjoint (KH, KW, C_in, C_out), ``kernel`` = (KH, KW), of :func:`conv_fwd`."""
    given = spec.conv_weight_grad_given(
        _shape(spec.CONV_WEIGHT_GRAD, "grad", grad), kernel, stride, padding
    )
    return _run(spec.CONV_WEIGHT_GRAD, kernels.conv_weight_grad, (x, grad), given=given)
