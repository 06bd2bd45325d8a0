"""The numpy reference module's fused kernels (the last section of ``protocol.py``).

Two layers:

* pure numpy functions on arrays (``*_arrays``), written for any float dtype and shape
  (rows, cols); ``needle.backend_numpy_fused`` (the ``NEEDLE_BACKEND=np`` versions) calls them
  too, so both backends compute each kernel with the same code;
* thin wrappers with the device protocol's names and signatures over this module's flat
  ``Array`` buffers, which check that every buffer has exactly the size the kernel needs
  (ValueError naming the kernel, the buffer and both sizes) and write the results in place.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np

__all__ = ["softmax_xent", "layernorm_fwd", "layernorm_bwd", "batchnorm_fwd", "batchnorm_bwd",
           "lstm_cell_fwd", "lstm_cell_bwd", "sgd_update", "adam_update"]


# ---- pure numpy kernels ----------------------------------------------------------------------
def check_labels(fn: str, labels: np.ndarray, cols: int) -> np.ndarray:
    """``labels`` as int64 after checking that each is a whole number in [0, cols) (ValueError)."""
    labels = np.asarray(labels)
    if labels.size:
        if labels.dtype.kind == "f" and not np.all(labels == np.round(labels)):
            bad = labels[labels != np.round(labels)][:5]
            raise ValueError(f"{fn}: labels must be whole numbers, got {bad}")
        lo, hi = labels.min(), labels.max()
        if lo < 0 or hi >= cols:
            raise ValueError(f"{fn}: labels must lie in [0, {cols}), got min {lo} and max {hi}")
    return labels.astype(np.int64)


def softmax_xent_arrays(logits: np.ndarray, labels: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Per row of ``logits`` (N, C) and int ``labels`` (N,): (loss (N,), probs (N, C)).

    loss[r] = logsumexp(logits[r]) - logits[r, labels[r]], computed as log Σ exp(z - m) minus
    (z[label] - m) with m the row max, so a non-target logit of -inf contributes exp(-inf) = 0
    and never meets a 0·inf.
    """
    rows = np.arange(logits.shape[0])
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        m = logits.max(axis=1, keepdims=True) if logits.shape[1] else \
            np.zeros((logits.shape[0], 1), logits.dtype)
        m = np.where(np.isfinite(m), m, 0).astype(logits.dtype)  # an all -inf row stays NaN below
        shifted = logits - m
        e = np.exp(shifted)
        s = e.sum(axis=1, keepdims=True)
        loss = np.log(s[:, 0]) - shifted[rows, labels]
        probs = e / s
    return loss.astype(logits.dtype, copy=False), probs.astype(logits.dtype, copy=False)


def _normalize(x: np.ndarray, axis: int, eps: float):
    mean = x.mean(axis=axis, keepdims=True)
    centred = x - mean
    var = (centred * centred).mean(axis=axis, keepdims=True)
    rstd = (1 / np.sqrt(var + eps)).astype(x.dtype)
    return centred * rstd, rstd, mean, var


def _normalize_bwd(dy, xhat, rstd, w, axis: int):
    """dx, dw, db of xhat = (x - mean)·rstd over ``axis``, y = xhat·w + b (w: one per column)."""
    dxhat = dy * w
    dx = rstd * (dxhat - dxhat.mean(axis=axis, keepdims=True)
                 - xhat * (dxhat * xhat).mean(axis=axis, keepdims=True))
    return dx, (dy * xhat).sum(axis=0), dy.sum(axis=0)


def layernorm_fwd_arrays(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float):
    """Row-wise layer norm of x (R, C) with w, b (C,): (y (R, C), xhat (R, C), rstd (R,))."""
    xhat, rstd, _, _ = _normalize(x, 1, eps)
    return xhat * w + b, xhat, rstd[:, 0]


def layernorm_bwd_arrays(dy, xhat, rstd, w):
    """The exact gradients (dx (R, C), dw (C,), db (C,)) of :func:`layernorm_fwd_arrays`."""
    return _normalize_bwd(dy, xhat, rstd[:, None], w, 1)


def batchnorm_fwd_arrays(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float):
    """Column-wise (over the batch) norm of x (N, C) with w, b (C,):
    (y (N, C), xhat (N, C), rstd (C,), mean (C,), biased var (C,)); N ≥ 1."""
    xhat, rstd, mean, var = _normalize(x, 0, eps)
    return xhat * w + b, xhat, rstd[0], mean[0], var[0]


def batchnorm_bwd_arrays(dy, xhat, rstd, w):
    """The exact gradients (dx (N, C), dw (C,), db (C,)) of :func:`batchnorm_fwd_arrays`."""
    return _normalize_bwd(dy, xhat, rstd[None, :], w, 0)


def _sigmoid(x):
    # tanh form: the same function as 1/(1+exp(-x)) without exp overflowing for x << 0
    return (np.tanh(x * 0.5) + 1) * 0.5


def lstm_cell_fwd_arrays(gates: np.ndarray, c_prev: np.ndarray):
    """One LSTM step from gates (B, 4H) in the order i, f, g, o and c_prev (B, H):
    (h (B, H), c (B, H), act (B, 4H) = (σi, σf, tanh g, σo), tanh_c (B, H))."""
    H = c_prev.shape[1]
    act = np.empty_like(gates)
    act[:, :2 * H] = _sigmoid(gates[:, :2 * H])
    act[:, 2 * H:3 * H] = np.tanh(gates[:, 2 * H:3 * H])
    act[:, 3 * H:] = _sigmoid(gates[:, 3 * H:])
    i, f, g, o = (act[:, k * H:(k + 1) * H] for k in range(4))
    c = f * c_prev + i * g
    tanh_c = np.tanh(c)
    return o * tanh_c, c, act, tanh_c


def lstm_cell_bwd_arrays(dh, dc, act, c_prev, tanh_c):
    """The exact gradients (dgates (B, 4H), dc_prev (B, H)) of :func:`lstm_cell_fwd_arrays`
    given the adjoints dh, dc (B, H) of its outputs h and c."""
    H = c_prev.shape[1]
    i, f, g, o = (act[:, k * H:(k + 1) * H] for k in range(4))
    dc_total = dc + dh * o * (1 - tanh_c * tanh_c)
    dgates = np.empty_like(act)
    dgates[:, :H] = dc_total * g * i * (1 - i)
    dgates[:, H:2 * H] = dc_total * c_prev * f * (1 - f)
    dgates[:, 2 * H:3 * H] = dc_total * i * (1 - g * g)
    dgates[:, 3 * H:] = dh * tanh_c * o * (1 - o)
    return dgates, dc_total * f


def sgd_update_arrays(param: np.ndarray, grad, buf: np.ndarray, lr: float, momentum: float,
                      weight_decay: float) -> None:
    """In place: g = grad + wd·param; buf = momentum·buf + (1-momentum)·g; param -= lr·buf."""
    g = grad + weight_decay * param if weight_decay else grad
    buf *= momentum
    buf += (1 - momentum) * g
    param -= lr * buf


def adam_update_arrays(param: np.ndarray, grad, m: np.ndarray, v: np.ndarray, lr: float,
                       beta1: float, beta2: float, eps: float, weight_decay: float,
                       step: int) -> None:
    """In place: Adam with L2 decay and the bias corrections of step ``step`` (≥ 1):
    param -= lr·m̂/(sqrt(v̂) + eps) with m̂ = m/(1-β1^step), v̂ = v/(1-β2^step)."""
    g = grad + weight_decay * param if weight_decay else grad
    tmp = np.multiply(g, 1 - beta1)  # one scratch array, reused: no temporary per operation
    m *= beta1
    m += tmp
    np.multiply(g, g, out=tmp)
    tmp *= 1 - beta2
    v *= beta2
    v += tmp
    np.divide(v, 1 - beta2 ** step, out=tmp)
    np.sqrt(tmp, out=tmp)
    tmp += eps
    np.divide(m, tmp, out=tmp)
    tmp *= lr / (1 - beta1 ** step)
    param -= tmp


# ---- the device protocol over Array buffers ---------------------------------------------------
def _arrays(fn: str, **expected) -> None:
    """Check each ``name=(buffer, size)``: the buffer must hold exactly ``size`` elements."""
    for name, (buf, size) in expected.items():
        if size < 0:
            raise ValueError(f"{fn}: negative size {size} for {name}")
        if buf.size != size:
            raise ValueError(f"{fn}: {name} has {buf.size} elements, expected {size}")


def _mat(buf, rows: int, cols: int) -> np.ndarray:
    return buf.array.reshape(rows, cols)


def softmax_xent(logits, labels, rows: int, cols: int, loss, probs) -> None:
    """See ``protocol.DeviceModule.softmax_xent``."""
    _arrays("softmax_xent", logits=(logits, rows * cols), labels=(labels, rows),
            loss=(loss, rows), probs=(probs, rows * cols))
    lab = check_labels("softmax_xent", labels.array, cols)
    loss.array[:], p = softmax_xent_arrays(_mat(logits, rows, cols), lab)
    probs.array[:] = p.ravel()


def layernorm_fwd(x, w, b, rows: int, cols: int, eps: float, y, xhat, rstd) -> None:
    """See ``protocol.DeviceModule.layernorm_fwd``."""
    n = rows * cols
    _arrays("layernorm_fwd", x=(x, n), w=(w, cols), b=(b, cols), y=(y, n), xhat=(xhat, n),
            rstd=(rstd, rows))
    out = layernorm_fwd_arrays(_mat(x, rows, cols), w.array, b.array, eps)
    for buf, value in zip((y, xhat, rstd), out):
        buf.array[:] = value.ravel()


def _norm_bwd(kind: str, dy, xhat, rstd, w, rows: int, cols: int, dx, dw, db,
              stats: int) -> None:
    fn = kind + "_bwd"
    n = rows * cols
    _arrays(fn, dy=(dy, n), xhat=(xhat, n), rstd=(rstd, stats), w=(w, cols), dx=(dx, n),
            dw=(dw, cols), db=(db, cols))
    out = globals()[fn + "_arrays"](_mat(dy, rows, cols), _mat(xhat, rows, cols), rstd.array,
                                    w.array)
    for buf, value in zip((dx, dw, db), out):
        buf.array[:] = value.ravel()


def layernorm_bwd(dy, xhat, rstd, w, rows: int, cols: int, dx, dw, db) -> None:
    """See ``protocol.DeviceModule.layernorm_bwd``."""
    _norm_bwd("layernorm", dy, xhat, rstd, w, rows, cols, dx, dw, db, rows)


def batchnorm_fwd(x, w, b, rows: int, cols: int, eps: float, y, xhat, rstd, mean, var) -> None:
    """See ``protocol.DeviceModule.batchnorm_fwd``."""
    if rows < 1:
        raise ValueError(f"batchnorm_fwd: needs at least one row (the batch), got rows={rows}")
    n = rows * cols
    _arrays("batchnorm_fwd", x=(x, n), w=(w, cols), b=(b, cols), y=(y, n), xhat=(xhat, n),
            rstd=(rstd, cols), mean=(mean, cols), var=(var, cols))
    out = batchnorm_fwd_arrays(_mat(x, rows, cols), w.array, b.array, eps)
    for buf, value in zip((y, xhat, rstd, mean, var), out):
        buf.array[:] = value.ravel()


def batchnorm_bwd(dy, xhat, rstd, w, rows: int, cols: int, dx, dw, db) -> None:
    """See ``protocol.DeviceModule.batchnorm_bwd``."""
    _norm_bwd("batchnorm", dy, xhat, rstd, w, rows, cols, dx, dw, db, cols)


def lstm_cell_fwd(gates, c_prev, batch: int, hidden: int, h, c, act, tanh_c) -> None:
    """See ``protocol.DeviceModule.lstm_cell_fwd``."""
    n = batch * hidden
    _arrays("lstm_cell_fwd", gates=(gates, 4 * n), c_prev=(c_prev, n), h=(h, n), c=(c, n),
            act=(act, 4 * n), tanh_c=(tanh_c, n))
    out = lstm_cell_fwd_arrays(_mat(gates, batch, 4 * hidden), _mat(c_prev, batch, hidden))
    for buf, value in zip((h, c, act, tanh_c), out):
        buf.array[:] = value.ravel()


def lstm_cell_bwd(dh, dc, act, c_prev, tanh_c, batch: int, hidden: int, dgates, dc_prev) -> None:
    """See ``protocol.DeviceModule.lstm_cell_bwd``."""
    n = batch * hidden
    _arrays("lstm_cell_bwd", dh=(dh, n), dc=(dc, n), act=(act, 4 * n), c_prev=(c_prev, n),
            tanh_c=(tanh_c, n), dgates=(dgates, 4 * n), dc_prev=(dc_prev, n))
    out = lstm_cell_bwd_arrays(*(_mat(a, batch, hidden) for a in (dh, dc)),
                               _mat(act, batch, 4 * hidden),
                               *(_mat(a, batch, hidden) for a in (c_prev, tanh_c)))
    for buf, value in zip((dgates, dc_prev), out):
        buf.array[:] = value.ravel()


def sgd_update(param, grad, buf, lr: float, momentum: float, weight_decay: float) -> None:
    """See ``protocol.DeviceModule.sgd_update``."""
    n = param.size
    _arrays("sgd_update", grad=(grad, n), buf=(buf, n))
    sgd_update_arrays(param.array, grad.array, buf.array, lr, momentum, weight_decay)


def adam_update(param, grad, m, v, lr: float, beta1: float, beta2: float, eps: float,
                weight_decay: float, step: int) -> None:
    """See ``protocol.DeviceModule.adam_update``."""
    if step < 1:
        raise ValueError(f"adam_update: step must be >= 1, got {step}")
    n = param.size
    _arrays("adam_update", grad=(grad, n), m=(m, n), v=(v, n))
    adam_update_arrays(param.array, grad.array, m.array, v.array, lr, beta1, beta2, eps,
                       weight_decay, step)
