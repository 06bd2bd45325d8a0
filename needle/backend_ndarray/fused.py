"""Fused kernels at the NDArray level: softmax cross-entropy, the (masked) softmax of attention,
layer/batch norm, the LSTM cell and a whole LSTM layer, the in-place SGD/Adam updates and the
embedding gather / scatter-add (the fused section of ``protocol.py``).

Each function checks its NDArrays (kind and device here; shapes against ``fused_spec.py``, the
one specification shared with the numpy backend), compacts the inputs, allocates the outputs
and calls the device module's kernel once, so a composite that costs many ops per training step
costs one kernel call. ``needle.backend_numpy`` has the same functions, with the same results,
for numpy arrays.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

import numpy as np

from . import fused_spec as spec
from .device import BackendDevice
from .ndarray import NDArray
from .ndarray import _new as _alloc
from .protocol import BINARY_OPS, Array

__all__ = list(spec.KERNELS)  # softmax_xent, ..., adam_update_: one function per kernel


def _check(
    kernel: spec.FusedKernel,
    arrays: Tuple[NDArray, ...],
    given: Tuple[int, ...] = (),
    **scalars: float,
) -> Tuple[BackendDevice, spec.Dims]:
    """(device, sizes) after checking that each of ``arrays`` (the kernel's inputs, in order)
    is an NDArray (TypeError), that all share one device (ValueError) and that their shapes
    and the ``given`` sizes fit ``kernel`` (ValueError, see ``fused_spec.FusedKernel.check``)."""
    fn = kernel.api_name
    device: Optional[BackendDevice] = None
    for op, a in zip(kernel.inputs, arrays):
        if not isinstance(a, NDArray):
            raise TypeError(f"{fn}: {op.name} must be an NDArray, got {type(a).__name__}")
        if device is None:
            device, first = a._device, op.name
        elif a._device is not device and a._device != device:
            raise ValueError(f"{fn}: {op.name} is on {a.device} but {first} is on {device}")
    assert device is not None, f"{fn} has inputs"
    return device, kernel.check([a._shape for a in arrays], scalars, given)


def _new(device: BackendDevice, kernel: spec.FusedKernel, dims: spec.Dims) -> Tuple[NDArray, ...]:
    """The kernel's outputs, fresh compact arrays on ``device``."""
    device._check()
    return tuple(_alloc(shape, device) for shape in kernel.output_shapes(dims))


def _h(*arrays: NDArray) -> Tuple[Array, ...]:
    """The buffers of ``arrays``, compacted first where they are views."""
    return tuple(a.compact()._handle for a in arrays)


def _out(*arrays: NDArray) -> Tuple[Array, ...]:
    """The buffers of freshly allocated (compact) outputs."""
    return tuple(a._handle for a in arrays)


def softmax_xent(logits: NDArray, labels: NDArray) -> Tuple[NDArray, NDArray]:
    """Cross-entropy per row of ``logits`` (N, C) against integer-valued ``labels`` (N,):
    ``(loss (N,), probs (N, C))`` with loss = logsumexp(row) - row[label], probs = softmax(row).

    A non-target logit of -inf has probability 0 and leaves the loss finite. A label that is not
    a whole number in [0, C) is a ValueError (raised by the device kernel).
    """
    device, (rows, cols) = _check(spec.SOFTMAX_XENT, (logits, labels))
    loss, probs = _new(device, spec.SOFTMAX_XENT, (rows, cols))
    if rows:
        device.softmax_xent(*_h(logits, labels), rows, cols, *_out(loss, probs))
    return loss, probs


def softmax_xent_bwd(
    probs: NDArray,
    labels: NDArray,
    dloss: NDArray,
    scale: float = 1.0,
    out: Optional[NDArray] = None,
) -> NDArray:
    """The gradient of :func:`softmax_xent`'s loss with respect to the logits:
    ``(probs - one_hot(labels)) * dloss[:, None] * scale``, shape (N, C); ``dloss`` is the
    adjoint of the per-row losses, shape (N,) (or () for one value shared by every row).

    With ``out`` (a compact (N, C) array on the same device, which may be ``probs`` itself) the
    gradient is written into it and returned: a language model's backward overwrites the
    probabilities it reads for the last time instead of allocating a vocabulary-sized array.
    A label that is not a whole number in [0, C) is a ValueError, raised before ``out`` is
    written."""
    device, (rows, cols) = _check(spec.SOFTMAX_XENT_BWD, (probs, labels, dloss), scale=scale)
    if out is None:
        (out,) = _new(device, spec.SOFTMAX_XENT_BWD, (rows, cols))
    else:
        _into("softmax_xent_bwd", out, device, (rows, cols))
    if out.size:
        device.softmax_xent_bwd(*_h(probs, labels, dloss), rows, cols, float(scale), out._handle)
    return out


def _into(fn: str, out: NDArray, device: BackendDevice, shape: Tuple[int, ...]) -> None:
    """Checks that ``out`` can receive a result of ``shape`` on ``device`` in place: an NDArray
    (TypeError) of that shape, on that device, compact and whole (ValueError)."""
    if not isinstance(out, NDArray):
        raise TypeError(f"{fn}: out must be an NDArray, got {type(out).__name__}")
    if out._device != device:
        raise ValueError(f"{fn}: out is on {out.device}, the inputs on {device}")
    if tuple(out._shape) != tuple(shape):
        raise ValueError(f"{fn}: out must have shape {tuple(shape)}, got {tuple(out._shape)}")
    if not out.is_compact():
        raise ValueError(f"{fn}: out must be a compact array (it is written in place)")


def binary_into(op: str, a: NDArray, b: NDArray, out: NDArray) -> None:
    """``out = a <op> b`` element-wise (``op`` a name of ``BINARY_OPS``) written into the
    compact ``out``, which may be ``a`` or ``b`` themselves (every output element reads only
    the same element of each operand); ``a`` and ``b`` are broadcast to ``out``'s shape."""
    if op not in BINARY_OPS:
        raise ValueError(f"binary_into: unknown op {op!r} (one of {', '.join(BINARY_OPS)})")
    if not out.is_compact():
        raise ValueError("binary_into: out must be a compact array (it is written in place)")
    if a.device != out.device or b.device != out.device:
        raise ValueError(f"binary_into: operands on {a.device} and {b.device}, out on {out.device}")
    if out.size == 0:
        return
    a, b = a.broadcast_to(out.shape), b.broadcast_to(out.shape)
    out.device.ewise_binary(
        BINARY_OPS.index(op),
        *(a._handle, a._strides, a._offset),
        *(b._handle, b._strides, b._offset),
        out._handle,
        out.shape,
    )


def softmax_fwd(x: NDArray, scale: float = 1.0, queries: int = 0) -> NDArray:
    """Softmax of each row of ``scale * x`` (R, C), shape (R, C). ``queries`` > 0 masks
    causally: the rows are blocks of that many queries and row r sees keys
    j <= r % queries + C - queries only (the rest get 0; a row that sees none is uniform)."""
    device, (rows, cols) = _check(spec.SOFTMAX_FWD, (x,), scale=scale, queries=queries)
    (y,) = _new(device, spec.SOFTMAX_FWD, (rows, cols))
    if rows and cols:
        device.softmax_fwd(*_h(x), rows, cols, float(scale), int(queries), *_out(y))
    return y


def softmax_bwd(y: NDArray, dy: NDArray, scale: float = 1.0) -> NDArray:
    """The gradient of :func:`softmax_fwd` given its result ``y`` and the adjoint ``dy`` (both
    (R, C)): ``scale * y * (dy - Σ_row dy * y)``."""
    device, (rows, cols) = _check(spec.SOFTMAX_BWD, (y, dy), scale=scale)
    (dx,) = _new(device, spec.SOFTMAX_BWD, (rows, cols))
    if rows and cols:
        device.softmax_bwd(*_h(y, dy), rows, cols, float(scale), *_out(dx))
    return dx


def attention_fwd(
    q: NDArray, k: NDArray, v: NDArray, scale: float = 1.0, causal: bool = False
) -> Tuple[NDArray, NDArray]:
    """Attention per head for q (H, Tq, D), k and v (H, Tk, D): ``(out (H, Tq, D), probs
    (H, Tq, Tk))`` with probs = :func:`softmax_fwd` of ``scale · q kᵀ`` (``causal``: query i
    sees keys j <= i + Tk - Tq) and out = probs v, in one kernel call."""
    given = (spec.attention_keys("attention_fwd", k),)
    device, dims = _check(spec.ATTENTION_FWD, (q, k, v), given, scale=scale, causal=int(causal))
    out, probs = _new(device, spec.ATTENTION_FWD, dims)
    if out.size or probs.size:
        device.attention_fwd(*_h(q, k, v), *dims, float(scale), int(causal), *_out(out, probs))
    return out, probs


def attention_bwd(
    d_out: NDArray,
    d_probs: NDArray,
    probs: NDArray,
    q: NDArray,
    k: NDArray,
    v: NDArray,
    scale: float = 1.0,
) -> Tuple[NDArray, NDArray, NDArray]:
    """``(dq, dk, dv)``: the gradients of :func:`attention_fwd` given the adjoints ``d_out``
    (H, Tq, D) of out and ``d_probs`` (H, Tq, Tk) of probs, and its saved ``probs``."""
    given = (spec.attention_keys("attention_bwd", k),)
    arrays = (d_out, d_probs, probs, q, k, v)
    device, dims = _check(spec.ATTENTION_BWD, arrays, given, scale=scale)
    dq, dk, dv = _new(device, spec.ATTENTION_BWD, dims)
    if dq.size or dk.size:
        device.attention_bwd(*_h(*arrays), *dims, float(scale), *_out(dq, dk, dv))
    return dq, dk, dv


def layernorm_fwd(
    x: NDArray, w: NDArray, b: NDArray, eps: float
) -> Tuple[NDArray, NDArray, NDArray]:
    """Layer norm of each row of ``x`` (R, C): ``(y, xhat, rstd)`` with xhat = (x - mean)·rstd,
    rstd = 1/sqrt(var + eps) (biased variance, shape (R,)), y = xhat·w + b (w, b: C elements)."""
    device, (rows, cols) = _check(spec.LAYERNORM_FWD, (x, w, b), eps=eps)
    y, xhat, rstd = _new(device, spec.LAYERNORM_FWD, (rows, cols))
    if rows and cols:
        device.layernorm_fwd(*_h(x, w, b), rows, cols, float(eps), *_out(y, xhat, rstd))
    elif rows:  # no features: nothing to normalise, var = 0 by convention
        rstd.fill(1 / np.sqrt(np.float32(eps)))
    return y, xhat, rstd


def _norm_bwd(
    kernel: spec.FusedKernel,
    device_kernel: Callable[..., None],
    device: BackendDevice,
    dims: spec.Dims,
    dy: NDArray,
    xhat: NDArray,
    rstd: NDArray,
    w: NDArray,
) -> Tuple[NDArray, NDArray, NDArray]:
    """dx, dw, db of layer or batch norm (``kernel``, already checked: ``device``, ``dims``)."""
    rows, cols = dims
    dx, dw, db = _new(device, kernel, dims)
    if rows and cols:
        device_kernel(*_h(dy, xhat, rstd, w), rows, cols, *_out(dx, dw, db))
    else:
        dw.fill(0.0)
        db.fill(0.0)
    return dx, dw, db


def layernorm_bwd(
    dy: NDArray, xhat: NDArray, rstd: NDArray, w: NDArray
) -> Tuple[NDArray, NDArray, NDArray]:
    """The exact gradients ``(dx (R, C), dw (C,), db (C,))`` of :func:`layernorm_fwd` given the
    adjoint ``dy`` (R, C) of y and the saved ``xhat`` (R, C) and ``rstd`` (R,)."""
    device, dims = _check(spec.LAYERNORM_BWD, (dy, xhat, rstd, w))
    return _norm_bwd(spec.LAYERNORM_BWD, device.layernorm_bwd, device, dims, dy, xhat, rstd, w)


def batchnorm_fwd(
    x: NDArray, w: NDArray, b: NDArray, eps: float
) -> Tuple[NDArray, NDArray, NDArray, NDArray, NDArray]:
    """Batch norm of each column of ``x`` (N, C) over the N ≥ 1 rows:
    ``(y, xhat, rstd, mean, var)``, the last three of shape (C,) (biased batch variance)."""
    device, (rows, cols) = _check(spec.BATCHNORM_FWD, (x, w, b), eps=eps)
    y, xhat, rstd, mean, var = _new(device, spec.BATCHNORM_FWD, (rows, cols))
    if cols:
        device.batchnorm_fwd(*_h(x, w, b), rows, cols, float(eps), *_out(y, xhat, rstd, mean, var))
    return y, xhat, rstd, mean, var


def batchnorm_bwd(
    dy: NDArray, xhat: NDArray, rstd: NDArray, w: NDArray
) -> Tuple[NDArray, NDArray, NDArray]:
    """The exact gradients ``(dx (N, C), dw (C,), db (C,))`` of :func:`batchnorm_fwd` given the
    adjoint ``dy`` (N, C) and the saved ``xhat`` (N, C) and ``rstd`` (C,)."""
    device, dims = _check(spec.BATCHNORM_BWD, (dy, xhat, rstd, w))
    return _norm_bwd(spec.BATCHNORM_BWD, device.batchnorm_bwd, device, dims, dy, xhat, rstd, w)


def lstm_cell_fwd(gates: NDArray, c_prev: NDArray) -> Tuple[NDArray, NDArray, NDArray, NDArray]:
    """One LSTM step from the gate pre-activations ``gates`` (B, 4H), order i, f, g, o, and the
    cell state ``c_prev`` (B, H): ``(h, c, act, tanh_c)`` with act = (σi, σf, tanh g, σo)
    (B, 4H), c = σf·c_prev + σi·tanh g, tanh_c = tanh(c), h = σo·tanh_c (each (B, H))."""
    device, (batch, hidden) = _check(spec.LSTM_CELL_FWD, (gates, c_prev))
    h, c, act, tanh_c = _new(device, spec.LSTM_CELL_FWD, (batch, hidden))
    if batch and hidden:
        device.lstm_cell_fwd(*_h(gates, c_prev), batch, hidden, *_out(h, c, act, tanh_c))
    return h, c, act, tanh_c


def lstm_cell_bwd(
    dh: NDArray, dc: NDArray, act: NDArray, c_prev: NDArray, tanh_c: NDArray
) -> Tuple[NDArray, NDArray]:
    """The exact gradients ``(dgates (B, 4H), dc_prev (B, H))`` of :func:`lstm_cell_fwd` given
    the adjoints ``dh``, ``dc`` (B, H) of h and c and its saved ``act``, ``c_prev``, ``tanh_c``."""
    device, (batch, hidden) = _check(spec.LSTM_CELL_BWD, (dh, dc, act, c_prev, tanh_c))
    dgates, dc_prev = _new(device, spec.LSTM_CELL_BWD, (batch, hidden))
    if batch and hidden:
        device.lstm_cell_bwd(
            *_h(dh, dc, act, c_prev, tanh_c), batch, hidden, *_out(dgates, dc_prev)
        )
    return dgates, dc_prev


def lstm_layer_fwd(
    xw: NDArray, h0: NDArray, c0: NDArray, w_hh: NDArray, steps: int
) -> Tuple[NDArray, NDArray, NDArray, NDArray]:
    """An LSTM layer over ``steps`` steps in one device call: at step t the gates are
    xw[t] + h_{t-1} @ w_hh (``xw`` (T, B, 4H), ``w_hh`` (H, 4H); h_{-1}, c_{-1} = ``h0``, ``c0``
    (B, H)) and the step is :func:`lstm_cell_fwd`'s. Returns ``(out, h, c, act)``: every h_t
    (T, B, H), the last state h_T, c_T (B, H), and for the backward pass every step's
    activations (T, B, 4H)."""
    device, dims = _check(spec.LSTM_LAYER_FWD, (xw, h0, c0, w_hh), (steps,))
    out, h, c, act = _new(device, spec.LSTM_LAYER_FWD, dims)
    device.lstm_layer_fwd(*_h(xw, h0, c0, w_hh), *dims, *_out(out, h, c, act))
    return out, h, c, act


def lstm_layer_bwd(
    d_out: NDArray,
    dh: NDArray,
    dc: NDArray,
    act: NDArray,
    out: NDArray,
    h0: NDArray,
    c0: NDArray,
    w_hh: NDArray,
    steps: int,
) -> Tuple[NDArray, NDArray, NDArray, NDArray]:
    """The exact gradients ``(dxw (T, B, 4H), dh0, dc0 (B, H), dw_hh (H, 4H))`` of
    :func:`lstm_layer_fwd` in one device call, given the adjoints ``d_out``, ``dh``, ``dc`` of
    its out, h and c and its saved ``act`` and ``out`` (the kernel recomputes the cell states
    from ``act``)."""
    arrays = (d_out, dh, dc, act, out, h0, c0, w_hh)
    device, dims = _check(spec.LSTM_LAYER_BWD, arrays, (steps,))
    dxw, dh0, dc0, dw_hh = _new(device, spec.LSTM_LAYER_BWD, dims)
    device.lstm_layer_bwd(*_h(*arrays), *dims, *_out(dxw, dh0, dc0, dw_hh))
    return dxw, dh0, dc0, dw_hh


def _update_in_place(fn: str, param: NDArray, kernel: Callable[[Array], None]) -> None:
    """Run ``kernel(param_handle)`` so that it updates ``param``'s own elements.

    A compact param is updated in its buffer; a strided view (a slice of a bigger buffer) is
    updated through a compact copy written back into the view. A broadcast view (stride 0 over
    several elements) has no well-defined in-place update: ValueError.
    """
    if param.size == 0:
        return
    if param.is_compact():
        kernel(param._handle)
        return
    if any(s == 0 and n > 1 for s, n in zip(param.strides, param.shape)):
        raise ValueError(
            f"{fn}: param is a broadcast view (shape {param.shape}, strides "
            f"{param.strides}); its elements share memory and cannot be updated"
        )
    work = param.compact()
    kernel(work._handle)
    param[(slice(None),) * param.ndim] = work


def _state(fn: str, **state: NDArray) -> None:
    """State buffers are updated in place: they must be compact (ValueError)."""
    for name, a in state.items():
        if not a.is_compact():
            raise ValueError(f"{fn}: the state buffer {name} must be compact")


def _plain(first: object, *others: object) -> bool:
    """True when every argument is a compact NDArray with the first's shape and device: the
    optimizers' every-step case, which then skips the specification's general checks (their
    outcome is known) and goes straight to the kernel."""
    if type(first) is not NDArray or not first.is_compact():
        return False
    device, shape = first._device, first._shape
    for a in others:
        if type(a) is not NDArray or a._device is not device or a._shape != shape:
            return False
        if not a.is_compact():
            return False
    return True


def sgd_update_(
    param: NDArray, grad: NDArray, buf: NDArray, lr: float, momentum: float, weight_decay: float
) -> None:
    """In place, element-wise over ``param``'s shape: g = grad + weight_decay·param;
    buf = momentum·buf + (1 - momentum)·g; param -= lr·buf (the course's averaged momentum).
    ``buf`` must be a compact array of param's shape (zeros before the first step); with
    momentum 0 its contents are not read (buf = g), so a scratch array will do."""
    if _plain(param, grad, buf) and param.size:
        param._device.sgd_update(
            param._handle,
            grad._handle,
            buf._handle,
            float(lr),
            float(momentum),
            float(weight_decay),
        )
        return
    device, _ = _check(spec.SGD_UPDATE, (param, grad, buf))
    _state("sgd_update_", buf=buf)
    g, u = _h(grad, buf)
    _update_in_place(
        "sgd_update_",
        param,
        lambda p: device.sgd_update(p, g, u, float(lr), float(momentum), float(weight_decay)),
    )


def adam_update_(
    param: NDArray,
    grad: NDArray,
    m: NDArray,
    v: NDArray,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    step: int,
) -> None:
    """In place: one Adam step (L2 decay added to the gradient, bias corrections for ``step`` ≥
    1) on ``param`` with the compact moment buffers ``m``, ``v`` of param's shape."""
    if _plain(param, grad, m, v) and param.size and isinstance(step, int) and step >= 1:
        param._device.adam_update(
            param._handle,
            grad._handle,
            m._handle,
            v._handle,
            float(lr),
            float(beta1),
            float(beta2),
            float(eps),
            float(weight_decay),
            step,
        )
        return
    device, _ = _check(spec.ADAM_UPDATE, (param, grad, m, v), step=step)
    _state("adam_update_", m=m, v=v)
    g, mh, vh = _h(grad, m, v)
    _update_in_place(
        "adam_update_",
        param,
        lambda p: device.adam_update(
            p,
            g,
            mh,
            vh,
            float(lr),
            float(beta1),
            float(beta2),
            float(eps),
            float(weight_decay),
            int(step),
        ),
    )


def embedding_gather(weight: NDArray, ids: NDArray) -> NDArray:
    """The rows of ``weight`` (V, D) picked by ``ids`` (N,), float32 holding whole numbers in
    [0, V): shape (N, D). An id outside that range is an IndexError naming it (raised by the
    device kernel)."""
    device, dims = _check(spec.EMBEDDING_GATHER, (weight, ids))
    (out,) = _new(device, spec.EMBEDDING_GATHER, dims)
    device.embedding_gather(*_h(weight, ids), *dims, *_out(out))
    return out


def embedding_scatter_add(grad: NDArray, ids: NDArray, vocab: int) -> NDArray:
    """The adjoint of :func:`embedding_gather`: zeros (vocab, D) with each row of ``grad``
    (N, D) added to the row its id in ``ids`` (N,) names (a repeated id accumulates)."""
    device, dims = _check(spec.EMBEDDING_SCATTER_ADD, (grad, ids), (vocab,))
    (out,) = _new(device, spec.EMBEDDING_SCATTER_ADD, dims)
    device.embedding_scatter_add(*_h(grad, ids), *dims, *_out(out))
    return out


def _one_output(
    kernel: spec.FusedKernel, arrays: Tuple[NDArray, ...], given: Tuple[Any, ...]
) -> NDArray:
    """The single output of ``kernel`` on ``arrays`` (its inputs) and the ``given`` sizes, after
    the checks of :func:`_check`: one device call."""
    device, dims = _check(kernel, arrays, given)
    (out,) = _new(device, kernel, dims)
    getattr(device, str(kernel.name))(*_h(*arrays), *dims, *_out(out))
    return out


def _shape(kernel: spec.FusedKernel, name: str, a: object) -> Tuple[int, ...]:
    """The shape of ``a``, the input ``name`` of ``kernel``: TypeError unless an NDArray."""
    if not isinstance(a, NDArray):
        raise TypeError(f"{kernel.api_name}: {name} must be an NDArray, got {type(a).__name__}")
    return a.shape


def conv_fwd(x: NDArray, weight: NDArray, stride: int, padding: int) -> NDArray:
    """The convolution (cross-correlation) of NHWC ``x`` (N, H, W, C_in), zero-padded by
    ``padding``, with ``weight`` (KH, KW, C_in, C_out) at ``stride``: (N, H_out, W_out, C_out)
    with H_out = (H + 2·padding - KH) // stride + 1 (likewise W_out). One device call."""
    given = spec.conv_fwd_given(_shape(spec.CONV_FWD, "weight", weight), stride, padding)
    return _one_output(spec.CONV_FWD, (x, weight), given)


def conv_input_grad(
    grad: NDArray, weight: NDArray, in_hw: Tuple[int, int], stride: int, padding: int
) -> NDArray:
    """The adjoint of :func:`conv_fwd` for its input, of size ``in_hw`` = (H, W), given the
    output adjoint ``grad`` (N, H_out, W_out, C_out): (N, H, W, C_in). One device call."""
    given = spec.conv_input_grad_given(
        _shape(spec.CONV_INPUT_GRAD, "grad", grad), in_hw, stride, padding
    )
    return _one_output(spec.CONV_INPUT_GRAD, (grad, weight), given)


def conv_weight_grad(
    x: NDArray, grad: NDArray, kernel: Tuple[int, int], stride: int, padding: int
) -> NDArray:
    """The adjoint of :func:`conv_fwd` for its (``kernel`` = (KH, KW)) weight, given the input
    ``x`` (N, H, W, C_in) and the output adjoint ``grad`` (N, H_out, W_out, C_out):
    (KH, KW, C_in, C_out). One device call."""
    given = spec.conv_weight_grad_given(
        _shape(spec.CONV_WEIGHT_GRAD, "grad", grad), kernel, stride, padding
    )
    return _one_output(spec.CONV_WEIGHT_GRAD, (x, grad), given)
