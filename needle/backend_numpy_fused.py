"""Fused kernels for ``NEEDLE_BACKEND=np`` (plain numpy arrays): the same names, arguments and
results as ``needle.backend_ndarray.fused``, computed by the numpy reference module's kernels
(``ndarray_backend_numpy_fused``), in the arrays' own float dtype."""
from __future__ import annotations

from typing import Tuple

import numpy as np

from .backend_ndarray import ndarray_backend_numpy_fused as kernels

__all__ = ["softmax_xent", "softmax_xent_bwd", "layernorm_fwd", "layernorm_bwd",
           "batchnorm_fwd", "batchnorm_bwd", "lstm_cell_fwd", "lstm_cell_bwd", "sgd_update_",
           "adam_update_"]


def _check(fn: str, **arrays) -> None:
    for name, a in arrays.items():
        if not isinstance(a, np.ndarray):
            raise TypeError(f"{fn}: {name} must be a numpy array, got {type(a).__name__}")


def _like(x: np.ndarray, outs):
    """``outs`` (an array or a tuple) viewed as ``x``'s array class (the backend's NDArray)."""
    if isinstance(outs, tuple):
        return tuple(np.asarray(o).view(type(x)) for o in outs)
    return np.asarray(outs).view(type(x))


def _matrix(fn: str, name: str, a: np.ndarray) -> Tuple[int, int]:
    if a.ndim != 2:
        raise ValueError(f"{fn}: {name} must be 2-D (rows, cols), got shape {a.shape}")
    return a.shape


def _shape(fn: str, name: str, a: np.ndarray, shape: tuple) -> None:
    if a.shape != tuple(shape):
        raise ValueError(f"{fn}: {name} must have shape {tuple(shape)}, got {a.shape}")


def _vector(fn: str, name: str, a: np.ndarray, n: int) -> np.ndarray:
    if a.size != n:
        raise ValueError(f"{fn}: {name} must have {n} elements, got shape {a.shape}")
    return a.reshape(n)


def softmax_xent(logits: np.ndarray, labels: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Cross-entropy per row of ``logits`` (N, C) against integer-valued ``labels`` (N,):
    ``(loss (N,), probs (N, C))``; ValueError for a label that is not a whole number in [0, C)."""
    fn = "softmax_xent"
    _check(fn, logits=logits, labels=labels)
    rows, cols = _matrix(fn, "logits", logits)
    _shape(fn, "labels", labels, (rows,))
    labels = kernels.check_labels(fn, labels, cols)
    return _like(logits, kernels.softmax_xent_arrays(logits, labels))


def softmax_xent_bwd(probs: np.ndarray, labels: np.ndarray, dloss: np.ndarray,
                     scale: float = 1.0) -> np.ndarray:
    """``(probs - one_hot(labels)) * dloss[:, None] * scale``: the logits' gradient, shape
    (N, C); ``dloss`` (N,) or () is the adjoint of the per-row losses."""
    fn = "softmax_xent_bwd"
    _check(fn, probs=probs, labels=labels, dloss=dloss)
    rows, cols = _matrix(fn, "probs", probs)
    _shape(fn, "labels", labels, (rows,))
    if dloss.shape not in ((), (rows,)):
        raise ValueError(f"{fn}: dloss must have shape ({rows},) or (), got {dloss.shape}")
    d = probs.copy()
    d[np.arange(rows), np.asarray(labels).astype(np.int64)] -= 1
    column = np.reshape(dloss, (-1, 1)) * float(scale)
    return _like(probs, d * column.astype(probs.dtype, copy=False))


def layernorm_fwd(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float):
    """Layer norm of each row of ``x`` (R, C): ``(y, xhat, rstd (R,))`` (see fused.py)."""
    fn = "layernorm_fwd"
    _check(fn, x=x, w=w, b=b)
    _, cols = _matrix(fn, "x", x)
    return _like(x, kernels.layernorm_fwd_arrays(x, _vector(fn, "w", w, cols),
                                                 _vector(fn, "b", b, cols), eps))


def _norm_bwd(kind: str, dy, xhat, rstd, w, stat_axis: int):
    fn = kind + "_bwd"
    _check(fn, dy=dy, xhat=xhat, rstd=rstd, w=w)
    rows, cols = _matrix(fn, "dy", dy)
    _shape(fn, "xhat", xhat, (rows, cols))
    kernel = getattr(kernels, fn + "_arrays")
    return _like(dy, kernel(dy, xhat, _vector(fn, "rstd", rstd, dy.shape[stat_axis]),
                            _vector(fn, "w", w, cols)))


def layernorm_bwd(dy: np.ndarray, xhat: np.ndarray, rstd: np.ndarray, w: np.ndarray):
    """The exact gradients ``(dx (R, C), dw (C,), db (C,))`` of :func:`layernorm_fwd`."""
    return _norm_bwd("layernorm", dy, xhat, rstd, w, 0)


def batchnorm_fwd(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float):
    """Batch norm of each column of ``x`` (N ≥ 1, C): ``(y, xhat, rstd, mean, var)``."""
    fn = "batchnorm_fwd"
    _check(fn, x=x, w=w, b=b)
    rows, cols = _matrix(fn, "x", x)
    if rows < 1:
        raise ValueError(f"{fn}: an empty batch (shape {x.shape}) has no statistics")
    return _like(x, kernels.batchnorm_fwd_arrays(x, _vector(fn, "w", w, cols),
                                                 _vector(fn, "b", b, cols), eps))


def batchnorm_bwd(dy: np.ndarray, xhat: np.ndarray, rstd: np.ndarray, w: np.ndarray):
    """The exact gradients ``(dx (N, C), dw (C,), db (C,))`` of :func:`batchnorm_fwd`."""
    return _norm_bwd("batchnorm", dy, xhat, rstd, w, 1)


def lstm_cell_fwd(gates: np.ndarray, c_prev: np.ndarray):
    """One LSTM step: ``(h, c, act, tanh_c)`` from gates (B, 4H) and c_prev (B, H)."""
    fn = "lstm_cell_fwd"
    _check(fn, gates=gates, c_prev=c_prev)
    batch, hidden = _matrix(fn, "c_prev", c_prev)
    _shape(fn, "gates", gates, (batch, 4 * hidden))
    return _like(gates, kernels.lstm_cell_fwd_arrays(gates, c_prev))


def lstm_cell_bwd(dh: np.ndarray, dc: np.ndarray, act: np.ndarray, c_prev: np.ndarray,
                  tanh_c: np.ndarray):
    """The exact gradients ``(dgates (B, 4H), dc_prev (B, H))`` of :func:`lstm_cell_fwd`."""
    fn = "lstm_cell_bwd"
    _check(fn, dh=dh, dc=dc, act=act, c_prev=c_prev, tanh_c=tanh_c)
    batch, hidden = _matrix(fn, "c_prev", c_prev)
    for name, a in (("dh", dh), ("dc", dc), ("tanh_c", tanh_c)):
        _shape(fn, name, a, (batch, hidden))
    _shape(fn, "act", act, (batch, 4 * hidden))
    return _like(dh, kernels.lstm_cell_bwd_arrays(dh, dc, act, c_prev, tanh_c))


def _in_place(fn: str, param: np.ndarray, grad: np.ndarray, **state: np.ndarray) -> None:
    _check(fn, param=param, grad=grad, **state)
    if not param.flags.writeable:
        raise ValueError(f"{fn}: param is a read-only array (a broadcast view?) and cannot be "
                         "updated in place")
    for name, a in dict(grad=grad, **state).items():
        _shape(fn, name, a, param.shape)


def sgd_update_(param: np.ndarray, grad: np.ndarray, buf: np.ndarray, lr: float,
                momentum: float, weight_decay: float) -> None:
    """In place: g = grad + weight_decay·param; buf = momentum·buf + (1 - momentum)·g;
    param -= lr·buf. ``buf`` has param's shape (zeros before the first step)."""
    _in_place("sgd_update_", param, grad, buf=buf)
    kernels.sgd_update_arrays(param, grad, buf, float(lr), float(momentum), float(weight_decay))


def adam_update_(param: np.ndarray, grad: np.ndarray, m: np.ndarray, v: np.ndarray, lr: float,
                 beta1: float, beta2: float, eps: float, weight_decay: float, step: int) -> None:
    """In place: one Adam step with bias corrections for ``step`` ≥ 1 (see fused.py)."""
    if int(step) < 1:
        raise ValueError(f"adam_update_: step must be >= 1, got {step}")
    _in_place("adam_update_", param, grad, m=m, v=v)
    kernels.adam_update_arrays(param, grad, m, v, float(lr), float(beta1), float(beta2),
                               float(eps), float(weight_decay), int(step))
