"""The numpy kernels: every computation of needle's two numpy paths, written once.

Pure numpy on numpy arrays (this module imports nothing else), used by

* ``ndarray_backend_numpy``, the ``cpu_numpy()`` device module, which runs them on views of its
  flat ``Array`` buffers (writing float32 results into the caller's outputs), and
* ``needle.backend_numpy``, the ``NEEDLE_BACKEND=np`` array API, which runs them on its numpy
  arrays (keeping their dtype).

It holds the element-wise op tables (one numpy function per op, in the op-code order of
``protocol.BINARY_OPS`` / ``UNARY_OPS`` / ``REDUCE_OPS``) and the fused kernels (the last
section of ``protocol.py``), which take and return whole arrays: (rows, cols) matrices for the
row and column kernels, any shape for the in-place updates. Argument checks are not here: the
shapes are checked by ``fused_spec.py`` before a kernel runs; only what depends on the values
(``check_labels``) is checked by the kernel itself, as in the compiled modules.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np


# ---- element-wise ops -------------------------------------------------------------------------
def sigmoid(a: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """1 / (1 + exp(-a)), element-wise (exp(-a) overflowing to inf gives 0)."""
    with np.errstate(over="ignore"):
        t: np.ndarray = np.exp(np.negative(a), out=out)
    np.add(t, 1.0, out=t)
    np.divide(1.0, t, out=t)
    return t


def relu(a: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """max(a, 0), element-wise: NaN stays NaN, -0.0 becomes 0.0 (as the compiled kernels)."""
    t: np.ndarray = np.maximum(a, 0, out=out)
    np.add(t, 0, out=t)  # -0.0 + 0 = +0.0; an integer array stays integer
    return t


# The op tables: name -> f(a[, b], out=None), in op-code order. Semantics are numpy's (IEEE):
# comparisons with NaN are false except `ne`, maximum/minimum/max propagate NaN. Comparisons
# give booleans (written as 1.0 / 0.0 into a float32 out). Adding an op is one line here.
# (numpy's ufuncs are typed as returning Any)
BINARY: Dict[str, Callable[..., Any]] = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "power": np.power,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "eq": np.equal,
    "ne": np.not_equal,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
}
UNARY: Dict[str, Callable[..., Any]] = {
    "neg": np.negative,
    "abs": np.abs,
    "sqrt": np.sqrt,
    "exp": np.exp,
    "log": np.log,
    "tanh": np.tanh,
    "sigmoid": sigmoid,
    "relu": relu,
}
# name -> (f(a, axis=...), the value over an empty extent, or None when that is an error)
REDUCE: Dict[str, Tuple[Callable[..., Any], Optional[float]]] = {
    "sum": (np.sum, 0.0),
    "max": (np.max, None),
}


# ---- fused kernels ----------------------------------------------------------------------------
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


def check_ids(fn: str, ids: np.ndarray, vocab: int) -> np.ndarray:
    """``ids`` as int64 after checking that each is a whole number in [0, vocab): IndexError
    naming the first that is not and its position."""
    ids = np.asarray(ids).reshape(-1)
    if ids.dtype.kind == "f":
        with np.errstate(invalid="ignore"):
            bad = ~((ids >= 0) & (ids < vocab) & (ids == np.floor(ids)))
    else:
        bad = (ids < 0) | (ids >= vocab)
    if bad.any():
        k = int(np.argmax(bad))
        raise IndexError(
            f"{fn}: ids must be whole numbers (integers) in [0, {vocab}), got "
            f"{float(ids[k]):g} at position {k}"
        )
    return ids.astype(np.int64)


def embedding_gather(weight: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The rows of ``weight`` (V, D) picked by ``ids`` (N,), whole numbers in [0, V): (N, D).
    IndexError (before anything is computed) for an id outside that range."""
    rows = check_ids("embedding_gather", ids, weight.shape[0])
    out: np.ndarray = weight[rows]
    return out


def embedding_scatter_add(grad: np.ndarray, ids: np.ndarray, vocab: int) -> np.ndarray:
    """(vocab, D) zeros with each row ``grad[r]`` of ``grad`` (N, D) added to row ``ids[r]``,
    in the order r = 0, 1, ... (a repeated id accumulates): the adjoint of
    :func:`embedding_gather`. IndexError for an id that is not a whole number in [0, vocab)."""
    rows = check_ids("embedding_scatter_add", ids, vocab)
    out = np.zeros((vocab, grad.shape[1]), grad.dtype)
    np.add.at(out, rows, grad)
    return out


def softmax_xent(logits: np.ndarray, labels: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Per row of ``logits`` (N, C) and integer-valued ``labels`` (N,): (loss (N,), probs (N, C));
    ValueError (before anything is computed) for a label that is not a whole number in [0, C).

    loss[r] = logsumexp(logits[r]) - logits[r, labels[r]], computed as log Σ exp(z - m) minus
    (z[label] - m) with m the row max, so a non-target logit of -inf contributes exp(-inf) = 0
    and never meets a 0·inf.
    """
    labels = check_labels("softmax_xent", labels, logits.shape[1])
    rows = np.arange(logits.shape[0])
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        m = (
            logits.max(axis=1, keepdims=True)
            if logits.shape[1]
            else np.zeros((logits.shape[0], 1), logits.dtype)
        )
        m = np.where(np.isfinite(m), m, 0).astype(logits.dtype)  # an all -inf row stays NaN below
        shifted = logits - m
        e = np.exp(shifted)
        s = e.sum(axis=1, keepdims=True)
        loss = np.log(s[:, 0]) - shifted[rows, labels]
        probs = e / s
    return loss.astype(logits.dtype, copy=False), probs.astype(logits.dtype, copy=False)


def softmax_fwd(x: np.ndarray, scale: float, queries: float) -> np.ndarray:
    """Softmax of each row of ``scale * x`` (R, C). ``queries`` = 0: no mask; q > 0: rows come
    in blocks of q queries and row r sees keys j <= r % q + C - q only (the causal mask of
    attention with q queries and C keys): the others get probability 0, and a row that sees no
    key is uniform (as the course's finite -max mask makes it)."""
    rows, cols = x.shape
    z = x * np.float32(scale)
    q = int(queries)
    visible = np.full(rows, cols) if not q else np.arange(rows) % q + (cols - q) + 1
    masked = np.arange(cols)[None, :] >= visible[:, None]
    z = np.where(masked, -np.inf, z)
    z[visible <= 0] = 0  # no key visible: uniform
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        m = z.max(axis=1, keepdims=True) if cols else np.zeros((rows, 1), x.dtype)
        m = np.where(np.isfinite(m), m, 0).astype(x.dtype)  # an all -inf row stays NaN below
        e = np.exp(z - m)
        y: np.ndarray = (e / e.sum(axis=1, keepdims=True)).astype(x.dtype, copy=False)
    return y


def softmax_bwd(y: np.ndarray, dy: np.ndarray, scale: float) -> np.ndarray:
    """``scale * y * (dy - Σ_row dy * y)`` (R, C): the gradient of :func:`softmax_fwd` given the
    adjoint ``dy`` of its result ``y`` (masked entries have y = 0, so they get 0)."""
    dot = (dy.astype(np.float64) * y).sum(axis=1, keepdims=True).astype(y.dtype)
    dx: np.ndarray = (np.float32(scale) * (y * (dy - dot))).astype(y.dtype, copy=False)
    return dx


def attention_fwd(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, keys: int, scale: float, causal: float
) -> Tuple[np.ndarray, np.ndarray]:
    """Attention per head for q (H, Tq, D), k and v (H, Tk, D): ``(out, probs)`` with probs
    (H, Tq, Tk) = :func:`softmax_fwd` of ``scale · q kᵀ`` (causal: query i sees keys
    j <= i + Tk - Tq) and out (H, Tq, D) = probs v."""
    heads, queries, _ = q.shape
    logits = np.matmul(q, np.swapaxes(k, 1, 2)).reshape(heads * queries, int(keys))
    probs = softmax_fwd(logits, scale, queries if causal else 0).reshape(heads, queries, int(keys))
    return np.matmul(probs, v).astype(q.dtype, copy=False), probs


def attention_bwd(
    d_out: np.ndarray,
    d_probs: np.ndarray,
    probs: np.ndarray,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    keys: int,
    scale: float,
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(dq, dk, dv)``, the gradients of :func:`attention_fwd` given the adjoints ``d_out`` of
    out and ``d_probs`` of probs: dp = d_out vᵀ + d_probs, ds = :func:`softmax_bwd`,
    dq = ds k, dk = dsᵀ q, dv = probsᵀ d_out."""
    heads, queries, _ = q.shape
    dp = np.matmul(d_out, np.swapaxes(v, 1, 2)) + d_probs
    rows = heads * queries
    ds = softmax_bwd(probs.reshape(rows, int(keys)), dp.reshape(rows, int(keys)), scale)
    ds = ds.reshape(heads, queries, int(keys))
    dq = np.matmul(ds, k)
    dk = np.matmul(np.swapaxes(ds, 1, 2), q)
    dv = np.matmul(np.swapaxes(probs, 1, 2), d_out)
    return (
        dq.astype(q.dtype, copy=False),
        dk.astype(q.dtype, copy=False),
        dv.astype(q.dtype, copy=False),
    )


def softmax_xent_bwd(
    probs: np.ndarray, labels: np.ndarray, dloss: np.ndarray, scale: float = 1.0
) -> np.ndarray:
    """``(probs - one_hot(labels)) * dloss[:, None] * scale`` (N, C): the logits' gradient of
    :func:`softmax_xent` given the adjoint ``dloss`` (N,) or () of its losses; ValueError for
    a label that is not a whole number in [0, C)."""
    rows = check_labels("softmax_xent_bwd", labels, probs.shape[1])
    d = probs.copy()
    d[np.arange(probs.shape[0]), rows] -= 1
    column = np.reshape(dloss, (-1, 1)) * float(scale)
    grad: np.ndarray = d * column.astype(probs.dtype, copy=False)
    return grad


def _normalize(x: np.ndarray, axis: int, eps: float) -> Tuple[np.ndarray, ...]:
    # Statistics in float64: the variance of float32 data of magnitude above about 2e19 does
    # not fit float32 (it would become inf and the output 0), while its rstd does.
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=axis, keepdims=True)
    centred = x64 - mean
    var = (centred * centred).mean(axis=axis, keepdims=True)
    rstd = 1 / np.sqrt(var + eps)
    with np.errstate(over="ignore"):  # a variance beyond float32 is reported as inf
        return (
            (centred * rstd).astype(x.dtype),
            rstd.astype(x.dtype),
            mean.astype(x.dtype),
            var.astype(x.dtype),
        )


def _normalize_bwd(
    dy: np.ndarray, xhat: np.ndarray, rstd: np.ndarray, w: np.ndarray, axis: int
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """dx, dw, db of xhat = (x - mean)·rstd over ``axis``, y = xhat·w + b (w: one per column)."""
    dxhat = dy * w
    dx = rstd * (
        dxhat
        - dxhat.mean(axis=axis, keepdims=True)
        - xhat * (dxhat * xhat).mean(axis=axis, keepdims=True)
    )
    return dx, (dy * xhat).sum(axis=0), dy.sum(axis=0)


def layernorm_fwd(
    x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row-wise layer norm of x (R, C) with w, b (C,): (y (R, C), xhat (R, C), rstd (R,))."""
    xhat, rstd, _, _ = _normalize(x, 1, eps)
    return xhat * w + b, xhat, rstd[:, 0]


def layernorm_bwd(
    dy: np.ndarray, xhat: np.ndarray, rstd: np.ndarray, w: np.ndarray
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The exact gradients (dx (R, C), dw (C,), db (C,)) of :func:`layernorm_fwd`."""
    return _normalize_bwd(dy, xhat, rstd[:, None], w, 1)


def batchnorm_fwd(
    x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float
) -> Tuple[np.ndarray, ...]:
    """Column-wise (over the batch) norm of x (N, C) with w, b (C,):
    (y (N, C), xhat (N, C), rstd (C,), mean (C,), biased var (C,)); N ≥ 1."""
    xhat, rstd, mean, var = _normalize(x, 0, eps)
    return xhat * w + b, xhat, rstd[0], mean[0], var[0]


def batchnorm_bwd(
    dy: np.ndarray, xhat: np.ndarray, rstd: np.ndarray, w: np.ndarray
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The exact gradients (dx (N, C), dw (C,), db (C,)) of :func:`batchnorm_fwd`."""
    return _normalize_bwd(dy, xhat, rstd[None, :], w, 0)


def _sigmoid_tanh(x: np.ndarray) -> np.ndarray:
    # tanh form: the same function as 1/(1+exp(-x)) without exp overflowing for x << 0
    out: np.ndarray = (np.tanh(x * 0.5) + 1) * 0.5
    return out


def lstm_cell_fwd(gates: np.ndarray, c_prev: np.ndarray) -> Tuple[np.ndarray, ...]:
    """One LSTM step from gates (B, 4H) in the order i, f, g, o and c_prev (B, H):
    (h (B, H), c (B, H), act (B, 4H) = (σi, σf, tanh g, σo), tanh_c (B, H))."""
    H = c_prev.shape[1]
    act = np.empty_like(gates)
    act[:, : 2 * H] = _sigmoid_tanh(gates[:, : 2 * H])
    act[:, 2 * H : 3 * H] = np.tanh(gates[:, 2 * H : 3 * H])
    act[:, 3 * H :] = _sigmoid_tanh(gates[:, 3 * H :])
    i, f, g, o = (act[:, k * H : (k + 1) * H] for k in range(4))
    c = f * c_prev + i * g
    tanh_c = np.tanh(c)
    return o * tanh_c, c, act, tanh_c


def lstm_cell_bwd(
    dh: np.ndarray, dc: np.ndarray, act: np.ndarray, c_prev: np.ndarray, tanh_c: np.ndarray
) -> Tuple[np.ndarray, np.ndarray]:
    """The exact gradients (dgates (B, 4H), dc_prev (B, H)) of :func:`lstm_cell_fwd`
    given the adjoints dh, dc (B, H) of its outputs h and c."""
    H = c_prev.shape[1]
    i, f, g, o = (act[:, k * H : (k + 1) * H] for k in range(4))
    dc_total = dc + dh * o * (1 - tanh_c * tanh_c)
    dgates = np.empty_like(act)
    dgates[:, :H] = dc_total * g * i * (1 - i)
    dgates[:, H : 2 * H] = dc_total * c_prev * f * (1 - f)
    dgates[:, 2 * H : 3 * H] = dc_total * i * (1 - g * g)
    dgates[:, 3 * H :] = dh * tanh_c * o * (1 - o)
    return dgates, dc_total * f


def lstm_layer_fwd(
    xw: np.ndarray, h0: np.ndarray, c0: np.ndarray, w_hh: np.ndarray, steps: int
) -> Tuple[np.ndarray, ...]:
    """An LSTM layer over ``steps`` steps: at step t, :func:`lstm_cell_fwd` of the gates
    xw[t] + h_{t-1} @ w_hh (xw (T, B, 4H), w_hh (H, 4H), h_{-1} = h0, c_{-1} = c0 (B, H)).
    Returns (out (T, B, H): every h_t, h_T, c_T (B, H), act (T, B, 4H): every step's
    activations)."""
    out, act = np.empty(xw.shape[:2] + h0.shape[1:], xw.dtype), np.empty_like(xw)
    h, c = h0, c0
    for t in range(steps):
        h, c, act[t], _ = lstm_cell_fwd(xw[t] + h @ w_hh, c)
        out[t] = h
    return out, np.array(h), np.array(c), act


def _cell_states(act: np.ndarray, c0: np.ndarray) -> np.ndarray:
    """c_t = σf_t·c_{t-1} + σi_t·tanh g_t for every step (T, B, H) from the activations act
    (T, B, 4H) and c_{-1} = c0: the states :func:`lstm_cell_fwd` computed, recomputed."""
    H = c0.shape[1]
    c_all, c = np.empty(act.shape[:2] + (H,), act.dtype), c0
    for t in range(act.shape[0]):
        i, f, g = (act[t, :, k * H : (k + 1) * H] for k in range(3))
        c = c_all[t] = f * c + i * g
    return c_all


def lstm_layer_bwd(
    d_out: np.ndarray,
    dh: np.ndarray,
    dc: np.ndarray,
    act: np.ndarray,
    out: np.ndarray,
    h0: np.ndarray,
    c0: np.ndarray,
    w_hh: np.ndarray,
    steps: int,
) -> Tuple[np.ndarray, ...]:
    """The exact gradients (dxw (T, B, 4H), dh0, dc0 (B, H), dw_hh (H, 4H)) of
    :func:`lstm_layer_fwd` given the adjoints d_out, dh, dc of its out, h_T, c_T and its saved
    act and out (the cell states are recomputed from act): the steps in reverse, then
    dw_hh = Σ_t h_{t-1}ᵀ dgates_t as one product."""
    rows, hidden = steps * h0.shape[0], h0.shape[1]
    c_all, dxw = _cell_states(act, c0), np.empty_like(act)
    w_t = np.ascontiguousarray(w_hh.T)
    for t in reversed(range(steps)):
        c_prev = c_all[t - 1] if t else c0
        dxw[t], dc = lstm_cell_bwd(dh + d_out[t], dc, act[t], c_prev, np.tanh(c_all[t]))
        dh = dxw[t] @ w_t
    h_prev = np.concatenate([h0[None], out])[:steps].reshape(rows, hidden)  # h_{t-1} for each t
    dw_hh = h_prev.T @ dxw.reshape(rows, 4 * hidden)
    return dxw, np.array(dh), np.array(dc), dw_hh


def sgd_update(
    param: np.ndarray,
    grad: np.ndarray,
    buf: np.ndarray,
    lr: float,
    momentum: float,
    weight_decay: float,
) -> None:
    """In place: g = grad + wd·param; buf = momentum·buf + (1-momentum)·g; param -= lr·buf.
    With momentum 0, buf = g: its previous contents are not read."""
    g = grad + weight_decay * param if weight_decay else grad
    if momentum:
        buf *= momentum
        buf += (1 - momentum) * g
    else:
        buf[...] = g
    param -= lr * buf


def adam_update(
    param: np.ndarray,
    grad: np.ndarray,
    m: np.ndarray,
    v: np.ndarray,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    step: int,
) -> None:
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
    np.divide(v, 1 - beta2**step, out=tmp)
    np.sqrt(tmp, out=tmp)
    tmp += eps
    np.divide(m, tmp, out=tmp)
    tmp *= lr / (1 - beta1**step)
    param -= tmp


# ---- convolution ------------------------------------------------------------------------------
# NHWC input x (N, H, W, C_in), weight (KH, KW, C_in, C_out), output (N, H_out, W_out, C_out)
# with H_out = (H + 2·padding - KH) // stride + 1; the sizes are checked by fused_spec.py.
def _conv_windows(x: np.ndarray, kh: int, kw: int, stride: int, padding: int) -> np.ndarray:
    """The (N, H_out, W_out, KH, KW, C_in) windows of ``x`` zero-padded by ``padding``: a view
    of the padded copy (no im2col matrix is built here)."""
    p = padding
    xp = np.pad(x, ((0, 0), (p, p), (p, p), (0, 0))) if p else x
    windows = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(1, 2))
    strided: np.ndarray = windows[:, ::stride, ::stride].transpose(0, 1, 2, 4, 5, 3)
    return strided


def conv_fwd(
    x: np.ndarray, weight: np.ndarray, kh: int, kw: int, c_out: int, stride: int, padding: int
) -> np.ndarray:
    """out[n, i, j, o] = Σ_{a, b, c} xpad[n, i·stride + a, j·stride + b, c] · weight[a, b, c, o]."""
    out: np.ndarray = np.tensordot(
        _conv_windows(x, kh, kw, stride, padding), weight, axes=([3, 4, 5], [0, 1, 2])
    )
    return out.astype(x.dtype, copy=False)


def conv_weight_grad(
    x: np.ndarray, grad: np.ndarray, kh: int, kw: int, c_out: int, stride: int, padding: int
) -> np.ndarray:
    """The weight adjoint of :func:`conv_fwd` for the output adjoint ``grad``:
    dw[a, b, c, o] = Σ_{n, i, j} xpad[n, i·stride + a, j·stride + b, c] · grad[n, i, j, o]."""
    out: np.ndarray = np.tensordot(
        _conv_windows(x, kh, kw, stride, padding), grad, axes=([0, 1, 2], [0, 1, 2])
    )
    return out.astype(x.dtype, copy=False)


def conv_input_grad(
    grad: np.ndarray, weight: np.ndarray, n: int, h: int, w: int, stride: int, padding: int
) -> np.ndarray:
    """The input adjoint of :func:`conv_fwd` for the output adjoint ``grad``: (N, H, W, C_in),
    each padded input element summing grad[n, i, j, :] · weight[a, b, c, :] over the windows
    (i, j) and offsets (a, b) that read it (col2im, one strided add per kernel offset)."""
    kh, kw, c_in, _ = weight.shape
    _, ho, wo, _ = grad.shape
    s, p = stride, padding
    patches = np.tensordot(grad, weight, axes=([3], [3]))  # (N, H_out, W_out, KH, KW, C_in)
    out = np.zeros((n, h + 2 * p, w + 2 * p, c_in), grad.dtype)
    for a in range(kh):
        for b in range(kw):
            out[:, a : a + s * (ho - 1) + 1 : s, b : b + s * (wo - 1) + 1 : s] += patches[
                :, :, :, a, b
            ]
    return out[:, p : p + h, p : p + w]
