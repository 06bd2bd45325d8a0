"""Fused kernels at the NDArray level: softmax cross-entropy, layer/batch norm, the LSTM cell
and the in-place SGD/Adam updates (the fused section of ``protocol.py``).

Each function checks its NDArrays (kind, device, shapes), compacts the inputs, allocates the
outputs and calls the device module's kernel once, so a composite that costs many ops per
training step costs one kernel call. ``needle.backend_numpy_fused`` has the same functions, with
the same results, for plain numpy arrays; the array API re-exports both (``array_api.NAME``).
"""
from __future__ import annotations

from typing import Tuple

import numpy as np

from .ndarray import NDArray

__all__ = ["softmax_xent", "softmax_xent_bwd", "layernorm_fwd", "layernorm_bwd",
           "batchnorm_fwd", "batchnorm_bwd", "lstm_cell_fwd", "lstm_cell_bwd", "sgd_update_",
           "adam_update_"]


def _check(fn: str, **arrays: NDArray):
    """The common device of ``arrays`` after checking each is an NDArray (TypeError) and that
    all share one device (ValueError)."""
    device = None
    for name, a in arrays.items():
        if not isinstance(a, NDArray):
            raise TypeError(f"{fn}: {name} must be an NDArray, got {type(a).__name__}")
        if device is None:
            device, first = a.device, name
        elif a.device != device:
            raise ValueError(f"{fn}: {name} is on {a.device} but {first} is on {device}")
    return device


def _shape(fn: str, name: str, a: NDArray, shape: tuple) -> None:
    if tuple(a.shape) != tuple(shape):
        raise ValueError(f"{fn}: {name} must have shape {tuple(shape)}, got {tuple(a.shape)}")


def _matrix(fn: str, name: str, a: NDArray) -> Tuple[int, int]:
    if a.ndim != 2:
        raise ValueError(f"{fn}: {name} must be 2-D (rows, cols), got shape {tuple(a.shape)}")
    return a.shape


def _vector(fn: str, name: str, a: NDArray, n: int) -> NDArray:
    """``a`` compact, after checking it holds exactly ``n`` elements (shape (n,) or any shape of
    that size, e.g. a (1, n) bias)."""
    if a.size != n:
        raise ValueError(f"{fn}: {name} must have {n} elements, got shape {tuple(a.shape)}")
    return a.compact()


def _new(device, *shapes):
    return tuple(NDArray.make(s, device=device) for s in shapes)


def _h(*arrays: NDArray):
    return tuple(a._handle for a in arrays)


def softmax_xent(logits: NDArray, labels: NDArray) -> Tuple[NDArray, NDArray]:
    """Cross-entropy per row of ``logits`` (N, C) against integer-valued ``labels`` (N,):
    ``(loss (N,), probs (N, C))`` with loss = logsumexp(row) - row[label], probs = softmax(row).

    A non-target logit of -inf has probability 0 and leaves the loss finite. A label that is not
    a whole number in [0, C) is a ValueError (raised by the device kernel).
    """
    fn = "softmax_xent"
    device = _check(fn, logits=logits, labels=labels)
    rows, cols = _matrix(fn, "logits", logits)
    _shape(fn, "labels", labels, (rows,))
    loss, probs = _new(device, (rows,), (rows, cols))
    if rows:
        device.softmax_xent(*_h(logits.compact(), labels.compact()), rows, cols,
                            *_h(loss, probs))
    return loss, probs


_IOTA: dict = {}  # (cols, device) -> NDArray [0, 1, ..., cols-1] of shape (1, cols)


def softmax_xent_bwd(probs: NDArray, labels: NDArray, dloss: NDArray, scale: float = 1.0
                     ) -> NDArray:
    """The gradient of :func:`softmax_xent`'s loss with respect to the logits:
    ``(probs - one_hot(labels)) * dloss[:, None] * scale``, shape (N, C); ``dloss`` is the
    adjoint of the per-row losses, shape (N,) (or () for one value shared by every row)."""
    fn = "softmax_xent_bwd"
    device = _check(fn, probs=probs, labels=labels, dloss=dloss)
    rows, cols = _matrix(fn, "probs", probs)
    _shape(fn, "labels", labels, (rows,))
    if dloss.shape not in ((), (rows,)):
        raise ValueError(f"{fn}: dloss must have shape ({rows},) or (), got {dloss.shape}")
    key = (cols, device)
    if key not in _IOTA:
        _IOTA[key] = NDArray(np.arange(cols, dtype=np.float32).reshape(1, cols), device=device)
    # element-wise ops broadcast: (1, C) == (N, 1) is the (N, C) one-hot matrix
    one_hot = _IOTA[key] == labels.compact().reshape((rows, 1))
    column = (dloss * float(scale)).compact().reshape((1, 1) if dloss.ndim == 0 else (rows, 1))
    return (probs - one_hot) * column


def layernorm_fwd(x: NDArray, w: NDArray, b: NDArray, eps: float
                  ) -> Tuple[NDArray, NDArray, NDArray]:
    """Layer norm of each row of ``x`` (R, C): ``(y, xhat, rstd)`` with xhat = (x - mean)·rstd,
    rstd = 1/sqrt(var + eps) (biased variance, shape (R,)), y = xhat·w + b (w, b: C elements)."""
    fn = "layernorm_fwd"
    device = _check(fn, x=x, w=w, b=b)
    rows, cols = _matrix(fn, "x", x)
    w, b = _vector(fn, "w", w, cols), _vector(fn, "b", b, cols)
    y, xhat, rstd = _new(device, (rows, cols), (rows, cols), (rows,))
    if rows and cols:
        device.layernorm_fwd(*_h(x.compact(), w, b), rows, cols, float(eps), *_h(y, xhat, rstd))
    elif rows:  # no features: nothing to normalise, var = 0 by convention
        rstd.fill(1 / np.sqrt(np.float32(eps)))
    return y, xhat, rstd


def _norm_bwd(kind: str, dy: NDArray, xhat: NDArray, rstd: NDArray, w: NDArray,
              stat_axis: int) -> Tuple[NDArray, NDArray, NDArray]:
    """dx, dw, db of ``{kind}_fwd``; rstd has one entry per index of ``stat_axis`` of dy."""
    fn = kind + "_bwd"
    device = _check(fn, dy=dy, xhat=xhat, rstd=rstd, w=w)
    rows, cols = _matrix(fn, "dy", dy)
    _shape(fn, "xhat", xhat, (rows, cols))
    rstd, w = _vector(fn, "rstd", rstd, dy.shape[stat_axis]), _vector(fn, "w", w, cols)
    dx, dw, db = _new(device, (rows, cols), (cols,), (cols,))
    if rows and cols:
        getattr(device, fn)(*_h(dy.compact(), xhat.compact(), rstd, w), rows, cols,
                            *_h(dx, dw, db))
    else:
        dw.fill(0.0)
        db.fill(0.0)
    return dx, dw, db


def layernorm_bwd(dy: NDArray, xhat: NDArray, rstd: NDArray, w: NDArray
                  ) -> Tuple[NDArray, NDArray, NDArray]:
    """The exact gradients ``(dx (R, C), dw (C,), db (C,))`` of :func:`layernorm_fwd` given the
    adjoint ``dy`` (R, C) of y and the saved ``xhat`` (R, C) and ``rstd`` (R,)."""
    return _norm_bwd("layernorm", dy, xhat, rstd, w, 0)


def batchnorm_fwd(x: NDArray, w: NDArray, b: NDArray, eps: float
                  ) -> Tuple[NDArray, NDArray, NDArray, NDArray, NDArray]:
    """Batch norm of each column of ``x`` (N, C) over the N ≥ 1 rows:
    ``(y, xhat, rstd, mean, var)``, the last three of shape (C,) (biased batch variance)."""
    fn = "batchnorm_fwd"
    device = _check(fn, x=x, w=w, b=b)
    rows, cols = _matrix(fn, "x", x)
    if rows < 1:
        raise ValueError(f"{fn}: an empty batch (shape {tuple(x.shape)}) has no statistics")
    w, b = _vector(fn, "w", w, cols), _vector(fn, "b", b, cols)
    out = _new(device, (rows, cols), (rows, cols), (cols,), (cols,), (cols,))
    if cols:
        device.batchnorm_fwd(*_h(x.compact(), w, b), rows, cols, float(eps), *_h(*out))
    return out


def batchnorm_bwd(dy: NDArray, xhat: NDArray, rstd: NDArray, w: NDArray
                  ) -> Tuple[NDArray, NDArray, NDArray]:
    """The exact gradients ``(dx (N, C), dw (C,), db (C,))`` of :func:`batchnorm_fwd` given the
    adjoint ``dy`` (N, C) and the saved ``xhat`` (N, C) and ``rstd`` (C,)."""
    return _norm_bwd("batchnorm", dy, xhat, rstd, w, 1)


def lstm_cell_fwd(gates: NDArray, c_prev: NDArray
                  ) -> Tuple[NDArray, NDArray, NDArray, NDArray]:
    """One LSTM step from the gate pre-activations ``gates`` (B, 4H), order i, f, g, o, and the
    cell state ``c_prev`` (B, H): ``(h, c, act, tanh_c)`` with act = (σi, σf, tanh g, σo)
    (B, 4H), c = σf·c_prev + σi·tanh g, tanh_c = tanh(c), h = σo·tanh_c (each (B, H))."""
    fn = "lstm_cell_fwd"
    device = _check(fn, gates=gates, c_prev=c_prev)
    batch, hidden = _matrix(fn, "c_prev", c_prev)
    _shape(fn, "gates", gates, (batch, 4 * hidden))
    out = _new(device, (batch, hidden), (batch, hidden), (batch, 4 * hidden), (batch, hidden))
    if batch and hidden:
        device.lstm_cell_fwd(*_h(gates.compact(), c_prev.compact()), batch, hidden, *_h(*out))
    return out


def lstm_cell_bwd(dh: NDArray, dc: NDArray, act: NDArray, c_prev: NDArray, tanh_c: NDArray
                  ) -> Tuple[NDArray, NDArray]:
    """The exact gradients ``(dgates (B, 4H), dc_prev (B, H))`` of :func:`lstm_cell_fwd` given
    the adjoints ``dh``, ``dc`` (B, H) of h and c and its saved ``act``, ``c_prev``, ``tanh_c``."""
    fn = "lstm_cell_bwd"
    device = _check(fn, dh=dh, dc=dc, act=act, c_prev=c_prev, tanh_c=tanh_c)
    batch, hidden = _matrix(fn, "c_prev", c_prev)
    for name, a in (("dh", dh), ("dc", dc), ("tanh_c", tanh_c)):
        _shape(fn, name, a, (batch, hidden))
    _shape(fn, "act", act, (batch, 4 * hidden))
    dgates, dc_prev = _new(device, (batch, 4 * hidden), (batch, hidden))
    if batch and hidden:
        device.lstm_cell_bwd(*_h(dh.compact(), dc.compact(), act.compact(), c_prev.compact(),
                                 tanh_c.compact()), batch, hidden, *_h(dgates, dc_prev))
    return dgates, dc_prev


def _update_in_place(fn: str, param: NDArray, kernel) -> None:
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
        raise ValueError(f"{fn}: param is a broadcast view (shape {param.shape}, strides "
                         f"{param.strides}); its elements share memory and cannot be updated")
    work = param.compact()
    kernel(work._handle)
    param[(slice(None),) * param.ndim] = work


def _state(fn: str, param: NDArray, **arrays: NDArray) -> tuple:
    """The compact handles of ``arrays`` (each of param's shape); state buffers (updated in
    place) must already be compact."""
    handles = []
    for name, a in arrays.items():
        _shape(fn, name, a, param.shape)
        if name != "grad" and not a.is_compact():
            raise ValueError(f"{fn}: the state buffer {name} must be compact")
        handles.append(a.compact()._handle)
    return tuple(handles)


def sgd_update_(param: NDArray, grad: NDArray, buf: NDArray, lr: float, momentum: float,
                weight_decay: float) -> None:
    """In place, element-wise over ``param``'s shape: g = grad + weight_decay·param;
    buf = momentum·buf + (1 - momentum)·g; param -= lr·buf (the course's averaged momentum).
    ``buf`` must be a compact array of param's shape (zeros before the first step)."""
    fn = "sgd_update_"
    device = _check(fn, param=param, grad=grad, buf=buf)
    g, u = _state(fn, param, grad=grad, buf=buf)
    _update_in_place(fn, param, lambda p: device.sgd_update(
        p, g, u, float(lr), float(momentum), float(weight_decay)))


def adam_update_(param: NDArray, grad: NDArray, m: NDArray, v: NDArray, lr: float,
                 beta1: float, beta2: float, eps: float, weight_decay: float, step: int) -> None:
    """In place: one Adam step (L2 decay added to the gradient, bias corrections for ``step`` ≥
    1) on ``param`` with the compact moment buffers ``m``, ``v`` of param's shape."""
    fn = "adam_update_"
    if int(step) < 1:
        raise ValueError(f"{fn}: step must be >= 1, got {step}")
    device = _check(fn, param=param, grad=grad, m=m, v=v)
    g, mh, vh = _state(fn, param, grad=grad, m=m, v=v)
    _update_in_place(fn, param, lambda p: device.adam_update(
        p, g, mh, vh, float(lr), float(beta1), float(beta2), float(eps), float(weight_decay),
        int(step)))
